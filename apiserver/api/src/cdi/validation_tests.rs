#![allow(clippy::unwrap_used)]

use serde_json::{Value, json};

use crate::kinds::datavolume::STRATEGY;
use crate::validation::{ErrorType, FieldError};

/// A DataVolume with this spec, through the kind's decode, defaulting and validation: the
/// errors, with the unknown fields decoding reported.
fn check(spec: Value) -> (Vec<FieldError>, Vec<String>) {
    let dv = json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "dv1", "namespace": "ns1"}, "spec": spec});
    let (mut pruned, unknown) = match (STRATEGY.decode)(&dv) {
        Ok(ok) => ok,
        Err(errs) => return (errs, Vec::new()),
    };
    (STRATEGY.default)(&mut pruned);
    ((STRATEGY.validate)(&pruned), unknown)
}

fn errors(spec: Value) -> Vec<FieldError> {
    check(spec).0
}

/// The one error of `spec`, which must name `field`.
fn refused(spec: Value, field: &str) -> FieldError {
    let errs = errors(spec);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].field, field, "{errs:?}");
    errs[0].clone()
}

fn storage(size: &str) -> Value {
    json!({"resources": {"requests": {"storage": size}}})
}

#[test]
fn documented_examples_are_accepted_as_written() {
    let examples = [
        // KubeVirt's user guide: an HTTP import with storage:.
        json!({"source": {"http": {"url": "https://download.cirros-cloud.net/0.6.2/cirros-0.6.2-x86_64-disk.img"}},
               "storage": storage("1Gi")}),
        // CDI's blank and upload examples with pvc:.
        json!({"source": {"blank": {}}, "pvc": {"accessModes": ["ReadWriteOnce"],
               "resources": {"requests": {"storage": "500Mi"}}}}),
        json!({"source": {"upload": {}}, "contentType": "kubevirt",
               "storage": {"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem",
                           "storageClassName": "local-path", "resources": {"requests": {"storage": "2Gi"}}}}),
        // A containerDisk image from a registry.
        json!({"source": {"registry": {"url": "docker://quay.io/containerdisks/fedora:41", "pullMethod": "node",
               "secretRef": "creds", "certConfigMap": "ca", "platform": {"architecture": "amd64"}}},
               "storage": storage("5Gi")}),
        // A clone takes its size from the source claim.
        json!({"source": {"pvc": {"namespace": "golden", "name": "fedora"}}, "storage": {}}),
        json!({"sourceRef": {"kind": "DataSource", "name": "fedora", "namespace": "golden"}, "storage": {}}),
        // Everything an HTTP source may carry.
        json!({"source": {"http": {"url": "http://10.213.0.1:8080/disk.qcow2", "secretRef": "basic",
               "certConfigMap": "ca", "extraHeaders": ["X-Token: abc"], "secretExtraHeaders": ["hdr"],
               "checksum": format!("sha256:{}", "0".repeat(64))}},
               "storage": storage("1Gi"), "priorityClassName": "low", "preallocation": false,
               "checkpoints": [{"previous": "", "current": "s1"}], "finalCheckpoint": true}),
    ];
    for spec in examples {
        let (errs, unknown) = check(spec.clone());
        assert!(errs.is_empty(), "{spec}: {errs:?}");
        assert!(unknown.is_empty(), "{spec}: {unknown:?}");
    }
}

#[test]
fn defaulting_sets_the_content_type_and_round_trips() {
    let dv = json!({"metadata": {"name": "a"}, "spec": {"source": {"blank": {}}, "storage": storage("1Gi")},
        "status": {"phase": "ImportInProgress", "progress": "45.30%", "restartCount": 2, "claimName": "a",
            "conditions": [{"type": "Running", "status": "True", "reason": "Pod is running",
                "lastTransitionTime": "2026-01-01T00:00:00Z", "lastHeartbeatTime": null}]}});
    let (mut v, unknown) = (STRATEGY.decode)(&dv).unwrap();
    assert!(unknown.is_empty(), "{unknown:?}");
    (STRATEGY.default)(&mut v);
    assert_eq!(v.pointer("/spec/contentType"), Some(&json!("kubevirt")));
    assert_eq!(v.pointer("/spec/source/blank"), Some(&json!({})));
    assert_eq!(v.pointer("/status/restartCount"), Some(&json!(2)));
    assert_eq!(
        v.pointer("/status/conditions/0/lastTransitionTime"),
        Some(&json!("2026-01-01T00:00:00Z"))
    );
    // Table cells: Phase, Progress, Restarts, Age.
    let cells = (STRATEGY.cells)(&v);
    assert_eq!(
        cells[..3],
        [json!("ImportInProgress"), json!("45.30%"), json!(2)]
    );
}

#[test]
fn source_and_source_ref_exactly_one() {
    let e = refused(json!({"storage": storage("1Gi")}), "spec.source");
    assert_eq!(e.kind, ErrorType::Required);
    assert!(
        e.message.contains("Missing Data volume source"),
        "{}",
        e.message
    );
    refused(
        json!({"source": {"blank": {}}, "sourceRef": {"kind": "DataSource", "name": "x"}, "storage": storage("1Gi")}),
        "spec.sourceRef",
    );
    let e = refused(
        json!({"sourceRef": {"kind": "PersistentVolumeClaim", "name": "x"}, "storage": {}}),
        "spec.sourceRef.kind",
    );
    assert!(e.message.contains("\"DataSource\""), "{}", e.message);
    refused(
        json!({"sourceRef": {"kind": "DataSource"}, "storage": {}}),
        "spec.sourceRef.name",
    );
    // External population: no populators here.
    let e = refused(
        json!({"storage": {"resources": {"requests": {"storage": "1Gi"}},
            "dataSourceRef": {"kind": "VolumeSnapshot", "name": "s", "apiGroup": "snapshot.storage.k8s.io"}}}),
        "spec.storage.dataSourceRef",
    );
    assert!(
        e.message.contains("not supported by kubevirt-rs"),
        "{}",
        e.message
    );
}

#[test]
fn pvc_and_storage_exactly_one() {
    refused(json!({"source": {"blank": {}}}), "spec.storage");
    let e = refused(
        json!({"source": {"blank": {}}, "storage": storage("1Gi"),
            "pvc": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}),
        "spec.pvc",
    );
    assert!(
        e.message.contains("Duplicate storage definition"),
        "{}",
        e.message
    );
    refused(
        json!({"source": {"blank": {}}, "pvc": {"resources": {"requests": {"storage": "1Gi"}}}}),
        "spec.pvc.accessModes",
    );
    refused(
        json!({"source": {"blank": {}}, "storage": {"accessModes": ["ReadWriteSometimes"],
            "resources": {"requests": {"storage": "1Gi"}}}}),
        "spec.storage.accessModes[0]",
    );
    refused(
        json!({"source": {"blank": {}}, "storage": {"volumeMode": "Tape", "resources": {"requests": {"storage": "1Gi"}}}}),
        "spec.storage.volumeMode",
    );
}

#[test]
fn exactly_one_source_type() {
    let e = refused(
        json!({"source": {}, "storage": storage("1Gi")}),
        "spec.source",
    );
    assert!(
        e.message.contains("http, registry, pvc, upload, blank"),
        "{}",
        e.message
    );
    let e = refused(
        json!({"source": {"blank": {}, "upload": {}}, "storage": storage("1Gi")}),
        "spec.source",
    );
    assert!(
        e.message.contains("Multiple Data volume sources"),
        "{}",
        e.message
    );
}

#[test]
fn unsupported_sources_decode_and_are_refused_by_name() {
    for (t, body) in [
        (
            "s3",
            json!({"url": "https://bucket.s3.amazonaws.com/disk.img", "secretRef": "s"}),
        ),
        ("gcs", json!({"url": "gs://bucket/disk.img"})),
        (
            "imageio",
            json!({"url": "https://engine/ovirt-engine/api", "diskId": "d", "secretRef": "s", "certConfigMap": "c"}),
        ),
        (
            "vddk",
            json!({"url": "https://vcenter", "uuid": "u", "backingFile": "[ds] vm.vmdk", "thumbprint": "t", "secretRef": "s"}),
        ),
        ("snapshot", json!({"namespace": "ns1", "name": "snap"})),
    ] {
        let (errs, unknown) = check(json!({"source": {t: body}, "storage": storage("1Gi")}));
        assert!(unknown.is_empty(), "{t}: {unknown:?}");
        assert_eq!(errs.len(), 1, "{t}: {errs:?}");
        assert_eq!(errs[0].field, format!("spec.source.{t}"));
        assert!(
            errs[0].message.contains("not supported by kubevirt-rs"),
            "{}",
            errs[0].message
        );
    }
}

#[test]
fn http_url_checksum_and_headers() {
    let http = |h: Value| json!({"source": {"http": h}, "storage": storage("1Gi")});
    let e = refused(http(json!({})), "spec.source.http.url");
    assert_eq!(e.kind, ErrorType::Required);
    for bad in [
        "ftp://host/disk.img",
        "host/disk.img",
        "https://",
        "https:///path",
        "http://a b/c",
    ] {
        let e = refused(http(json!({"url": bad})), "spec.source.http.url");
        assert!(e.message.contains("source URL"), "{bad}: {}", e.message);
    }
    for good in [
        "HTTP://host",
        "https://user:pw@host:8443/a?b=c#d",
        "http://[::1]:80/x",
    ] {
        assert!(errors(http(json!({"url": good}))).is_empty(), "{good}");
    }
    for bad in [
        "sha256:abc",
        "crc32:00",
        format!("sha1:{}", "g".repeat(40)).as_str(),
        "deadbeef",
    ] {
        refused(
            http(json!({"url": "http://h/", "checksum": bad})),
            "spec.source.http.checksum",
        );
    }
    assert!(
        errors(http(
            json!({"url": "http://h/", "checksum": format!("md5:{}", "aB".repeat(16))})
        ))
        .is_empty()
    );
    refused(
        http(json!({"url": "http://h/", "extraHeaders": ["ok: 1", "no colon"]})),
        "spec.source.http.extraHeaders[1]",
    );
}

#[test]
fn registry_url_scheme_and_image_stream() {
    let reg = |r: Value| json!({"source": {"registry": r}, "storage": storage("1Gi")});
    for bad in [
        "quay.io/containerdisks/fedora",
        "https://quay.io/x",
        "docker://",
    ] {
        let e = refused(reg(json!({"url": bad})), "spec.source.registry.url");
        assert!(e.message.contains("docker://"), "{}", e.message);
    }
    assert!(errors(reg(json!({"url": "oci-archive:///data/image.tar"}))).is_empty());
    refused(reg(json!({})), "spec.source.registry.url");
    refused(
        reg(json!({"url": "docker://a/b", "imageStream": "s"})),
        "spec.source.registry.imageStream",
    );
    refused(
        reg(json!({"imageStream": "s"})),
        "spec.source.registry.pullMethod",
    );
    assert!(errors(reg(json!({"imageStream": "s", "pullMethod": "node"}))).is_empty());
    // pullMethod is an enum: decoding names the field and the values.
    let e = refused(
        reg(json!({"url": "docker://a/b", "pullMethod": "daemon"})),
        "spec.source.registry.pullMethod",
    );
    assert!(e.message.contains("\"pod\", \"node\""), "{}", e.message);
}

#[test]
fn a_size_is_required_for_imports_uploads_and_blanks_and_positive() {
    for t in [
        json!({"blank": {}}),
        json!({"upload": {}}),
        json!({"http": {"url": "http://h/d.img"}}),
        json!({"registry": {"url": "docker://a/b"}}),
    ] {
        let e = refused(
            json!({"source": t, "storage": {}}),
            "spec.storage.resources.requests.storage",
        );
        assert_eq!(e.kind, ErrorType::Required);
        refused(
            json!({"source": t, "pvc": {"accessModes": ["ReadWriteOnce"]}}),
            "spec.pvc.resources.requests.storage",
        );
    }
    for bad in ["0", "-1Gi", "0Mi"] {
        let e = refused(
            json!({"source": {"blank": {}}, "storage": storage(bad)}),
            "spec.storage.resources.requests.storage",
        );
        assert!(
            e.message.contains("can't be equal or less than zero"),
            "{}",
            e.message
        );
    }
    refused(
        json!({"source": {"blank": {}}, "storage": storage("lots")}),
        "spec.storage.resources.requests.storage",
    );
    // A clone may set one (a larger target), and it is checked.
    refused(
        json!({"source": {"pvc": {"name": "a"}}, "storage": storage("0")}),
        "spec.storage.resources.requests.storage",
    );
    refused(
        json!({"source": {"pvc": {"namespace": "a"}}, "storage": {}}),
        "spec.source.pvc.name",
    );
}

#[test]
fn content_type_archive_is_refused_for_now_and_unknown_ones_by_decoding() {
    let e = refused(
        json!({"source": {"http": {"url": "http://h/a.tar"}}, "contentType": "archive", "storage": storage("1Gi")}),
        "spec.contentType",
    );
    assert!(
        e.message.contains("not supported by kubevirt-rs"),
        "{}",
        e.message
    );
    let e = refused(
        json!({"source": {"blank": {}}, "contentType": "zip", "storage": storage("1Gi")}),
        "spec.contentType",
    );
    assert_eq!(e.kind, ErrorType::NotSupported);
}

#[test]
fn a_clone_from_another_namespace_is_refused_at_admission() {
    let admitted = |old: Option<&Value>, source: Value| {
        let dv = json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": "dv1", "namespace": "ns1"},
            "spec": {"source": source, "storage": {}}});
        (STRATEGY.admit)(&crate::kinds::Admission {
            old,
            new: &dv,
            actor: &crate::policy::Actor::User,
            gates: &crate::policy::FeatureGates::default(),
            found: None,
        })
    };
    let errs = admitted(
        None,
        json!({"pvc": {"namespace": "golden", "name": "fedora"}}),
    );
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert_eq!(errs[0].field, "spec.source.pvc.namespace");
    assert_eq!(errs[0].kind, ErrorType::Invalid);
    assert!(
        errs[0]
            .message
            .contains("cross-namespace clones are not supported")
            && errs[0].message.contains("ns1"),
        "{}",
        errs[0].message
    );
    // Within the namespace, written or defaulted: accepted (and valid).
    for source in [
        json!({"pvc": {"name": "fedora"}}),
        json!({"pvc": {"namespace": "ns1", "name": "fedora"}}),
    ] {
        assert_eq!(admitted(None, source.clone()), vec![]);
        assert_eq!(errors(json!({"source": source, "storage": {}})), vec![]);
    }
}
