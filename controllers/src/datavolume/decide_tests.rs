#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::jiff::Timestamp;
use kubevirt_api::cdi::DataVolume;
use kubevirt_api::cdi::phase;
use kubevirt_api::common::ConditionStatus;
use serde_json::{Value, json};

use super::*;

fn dv(source: Value, status: Option<Value>) -> DataVolume {
    let mut v = json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "d", "namespace": "ns", "uid": "dv-uid"},
        "spec": {"source": source, "storage": {"resources": {"requests": {"storage": "1Gi"}}}},
    });
    if let Some(s) = status {
        v["status"] = s;
    }
    serde_json::from_value(v).unwrap()
}

fn http() -> Value {
    json!({"http": {"url": "http://h/i"}})
}

fn claim(phase: &str, owner: &str, annotations: Value) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "metadata": {"name": "d", "namespace": "ns", "annotations": annotations,
            "ownerReferences": [{"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
                "name": "d", "uid": owner, "controller": true}]},
        "spec": {"resources": {"requests": {"storage": "1084Mi"}}},
        "status": {"phase": phase}
    }))
    .unwrap()
}

fn pod(phase: &str, state: Value, last: Value, restarts: i32) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "importer-d", "namespace": "ns", "uid": "pod-uid"},
        "status": {"phase": phase, "containerStatuses": [{
            "name": "importer", "image": "i", "imageID": "", "ready": false,
            "restartCount": restarts, "state": state, "lastState": last}]}
    }))
    .unwrap()
}

fn observed<'a>(c: Option<&'a PersistentVolumeClaim>, p: Option<&'a Pod>) -> Observed<'a> {
    Observed {
        claim: c,
        pod: p,
        wait_for_first_consumer: false,
        claim_error: None,
        clone_source: None,
    }
}

fn cond<'a>(s: &'a DataVolumeStatus, t: &str) -> (ConditionStatus, &'a str, &'a str) {
    let c = s.condition(t).unwrap();
    (
        c.status,
        c.reason.as_deref().unwrap_or_default(),
        c.message.as_deref().unwrap_or_default(),
    )
}

const NOW: Timestamp = Timestamp::UNIX_EPOCH;

#[test]
fn http_import_runs_through_cdis_phases() {
    let d = dv(http(), None);
    let bound = claim("Bound", "dv-uid", json!({}));
    let pending = claim("Pending", "dv-uid", json!({}));
    let scheduled = pod(
        "Pending",
        json!({"waiting": {"reason": "ContainerCreating"}}),
        json!({}),
        0,
    );
    let running = pod("Running", json!({"running": {}}), json!({}), 0);
    let exited = pod(
        "Succeeded",
        json!({"terminated": {"exitCode": 0, "reason": "Completed",
                              "message": "{\"reason\":\"Completed\",\"message\":\"ok\"}"}}),
        json!({}),
        1,
    );
    let succeeded_claim = claim(
        "Bound",
        "dv-uid",
        json!({"cdi.kubevirt.io/storage.pod.phase": "Succeeded"}),
    );
    // (claim, pod, phase, plan, Bound, Running, Ready)
    type Row<'a> = (
        Option<&'a PersistentVolumeClaim>,
        Option<&'a Pod>,
        &'static str,
        Plan,
        ConditionStatus,
        (ConditionStatus, &'static str),
        ConditionStatus,
    );
    let f = ConditionStatus::False;
    let t = ConditionStatus::True;
    let rows: Vec<Row<'_>> = vec![
        (
            None,
            None,
            phase::PENDING,
            Plan {
                create_claim: true,
                ..Plan::default()
            },
            ConditionStatus::Unknown,
            (f, ""),
            f,
        ),
        (
            Some(&pending),
            None,
            phase::PENDING,
            Plan {
                create_pod: true,
                ..Plan::default()
            },
            f,
            (f, ""),
            f,
        ),
        (
            Some(&bound),
            None,
            phase::PVC_BOUND,
            Plan {
                create_pod: true,
                ..Plan::default()
            },
            t,
            (f, ""),
            f,
        ),
        (
            Some(&pending),
            Some(&scheduled),
            phase::IMPORT_SCHEDULED,
            Plan::default(),
            f,
            (f, ""),
            f,
        ),
        (
            Some(&bound),
            Some(&running),
            phase::IMPORT_IN_PROGRESS,
            Plan::default(),
            t,
            (t, REASON_POD_RUNNING),
            f,
        ),
        (
            Some(&bound),
            Some(&exited),
            phase::SUCCEEDED,
            Plan {
                mark_succeeded: true,
                delete_pod: Some(("importer-d".into(), "pod-uid".into())),
                ..Plan::default()
            },
            t,
            (f, phase::REASON_COMPLETED),
            t,
        ),
        // The pod is gone; the claim's annotation is the record.
        (
            Some(&succeeded_claim),
            None,
            phase::SUCCEEDED,
            Plan::default(),
            t,
            (f, phase::REASON_COMPLETED),
            t,
        ),
    ];
    for (i, (c, p, want_phase, want_plan, b, r, ready)) in rows.into_iter().enumerate() {
        let o = observed(c, p);
        assert_eq!(plan(&d, &o), want_plan, "row {i}");
        let s = derive_status(&d, &o, NOW);
        assert_eq!(s.phase.as_deref(), Some(want_phase), "row {i}");
        assert_eq!(cond(&s, "Bound").0, b, "row {i}");
        let (rs, rr, _) = cond(&s, "Running");
        assert_eq!((rs, rr), r, "row {i}");
        assert_eq!(cond(&s, "Ready").0, ready, "row {i}");
        assert_eq!(s.claim_name.as_deref(), c.map(|_| "d"), "row {i}");
        let progress = if want_phase == phase::SUCCEEDED {
            "100.0%"
        } else {
            "N/A"
        };
        assert_eq!(s.progress.as_deref(), Some(progress), "row {i}");
    }
}

#[test]
fn a_failed_attempt_keeps_importing_with_the_importers_reason() {
    let d = dv(http(), None);
    let c = claim("Bound", "dv-uid", json!({}));
    let msg =
        json!({"reason": "HTTPNotFound", "message": "GET http://h/i: 404 Not Found"}).to_string();
    let terminated = json!({"terminated": {"exitCode": 1, "reason": "Error", "message": msg}});
    for p in [
        pod(
            "Running",
            json!({"waiting": {"reason": "CrashLoopBackOff"}}),
            terminated.clone(),
            2,
        ),
        pod("Running", json!({"running": {}}), terminated.clone(), 2),
        pod("Running", terminated.clone(), json!({}), 2),
    ] {
        let o = observed(Some(&c), Some(&p));
        assert_eq!(plan(&d, &o), Plan::default());
        let s = derive_status(&d, &o, NOW);
        assert_eq!(s.phase.as_deref(), Some(phase::IMPORT_IN_PROGRESS));
        assert_eq!(s.restart_count, Some(2));
        assert_eq!(
            cond(&s, "Running"),
            (
                ConditionStatus::False,
                "HTTPNotFound",
                "GET http://h/i: 404 Not Found"
            )
        );
        let ev = events(&d, &s);
        assert!(
            ev.iter().any(|(w, r, n)| *w
                && *r == phase::REASON_ERR_IMPORT_FAILED
                && n.contains("HTTPNotFound")),
            "{ev:?}"
        );
    }
    // Not JSON: kubelet's reason and the text.
    let p = pod(
        "Running",
        json!({"terminated": {"exitCode": 137, "reason": "OOMKilled"}}),
        json!({}),
        0,
    );
    let s = derive_status(&d, &observed(Some(&c), Some(&p)), NOW);
    assert_eq!(
        cond(&s, "Running"),
        (
            ConditionStatus::False,
            "OOMKilled",
            "importer exited with code 137"
        )
    );
    // A pod that failed as a pod is replaced.
    let p = pod("Failed", json!({}), json!({}), 0);
    let o = observed(Some(&c), Some(&p));
    assert_eq!(
        plan(&d, &o).delete_pod,
        Some(("importer-d".into(), "pod-uid".into()))
    );
}

#[test]
fn blank_is_ready_when_bound_or_waits_for_its_first_consumer() {
    let d = dv(json!({"blank": {}}), None);
    let pending = claim("Pending", "dv-uid", json!({}));
    let bound = claim("Bound", "dv-uid", json!({}));
    let mut o = observed(Some(&pending), None);
    assert_eq!(
        derive_status(&d, &o, NOW).phase.as_deref(),
        Some(phase::PENDING)
    );
    o.wait_for_first_consumer = true;
    let s = derive_status(&d, &o, NOW);
    assert_eq!(s.phase.as_deref(), Some(phase::WAIT_FOR_FIRST_CONSUMER));
    assert!(cond(&s, "Bound").2.contains("first consumer"));
    assert_eq!(plan(&d, &o), Plan::default());
    let o = observed(Some(&bound), None);
    assert_eq!(
        derive_status(&d, &o, NOW).phase.as_deref(),
        Some(phase::SUCCEEDED)
    );
    assert_eq!(
        plan(&d, &o),
        Plan {
            mark_succeeded: true,
            ..Plan::default()
        }
    );
    // bind.immediate.requested: no WaitForFirstConsumer.
    let mut d2 = d.clone();
    d2.metadata.annotations =
        Some([(ann::BIND_IMMEDIATE_REQUESTED.to_string(), String::new())].into());
    let mut o = observed(Some(&pending), None);
    o.wait_for_first_consumer = true;
    assert_eq!(
        derive_status(&d2, &o, NOW).phase.as_deref(),
        Some(phase::PENDING)
    );
}

#[test]
fn other_sources_stay_pending_naming_the_source() {
    for (src, what) in [
        (
            json!({"registry": {"url": "docker://x"}}),
            "source registry",
        ),
        (
            json!({"pvc": {"name": "a", "namespace": "other"}}),
            "a clone from another namespace (other)",
        ),
    ] {
        let d = dv(src, None);
        let o = observed(None, None);
        assert_eq!(plan(&d, &o), Plan::default());
        let s = derive_status(&d, &o, NOW);
        assert_eq!(s.phase.as_deref(), Some(phase::PENDING));
        let (st, r, m) = cond(&s, "Running");
        assert_eq!((st, r), (ConditionStatus::False, REASON_NOT_SUPPORTED));
        assert!(m.contains(what), "{m}");
        assert!(
            events(&d, &s)
                .iter()
                .any(|(w, r, _)| *w && *r == REASON_NOT_SUPPORTED)
        );
    }
}

#[test]
fn a_claim_of_another_owner_is_left_alone_and_reported() {
    let d = dv(http(), None);
    let c = claim("Bound", "someone-else", json!({}));
    let o = observed(Some(&c), None);
    assert_eq!(plan(&d, &o), Plan::default());
    let s = derive_status(&d, &o, NOW);
    assert_eq!(cond(&s, "Running").1, REASON_RESOURCE_EXISTS);
    assert_eq!(s.claim_name, None);
}

#[test]
fn an_invalid_claim_is_reported_not_created() {
    let d = dv(http(), None);
    let mut o = observed(None, None);
    o.claim_error = Some("no size");
    assert_eq!(plan(&d, &o), Plan::default());
    let s = derive_status(&d, &o, NOW);
    assert_eq!(cond(&s, "Running").1, phase::REASON_ERR_CLAIM_NOT_VALID);
}

#[test]
fn an_unchanged_status_keeps_its_stamps_and_succeeded_sticks() {
    let d = dv(http(), None);
    let c = claim("Bound", "dv-uid", json!({}));
    let p = pod("Running", json!({"running": {}}), json!({}), 0);
    let s1 = derive_status(&d, &observed(Some(&c), Some(&p)), NOW);
    let mut d2 = d.clone();
    d2.status = Some(s1.clone());
    let later = NOW + std::time::Duration::from_secs(60);
    let s2 = derive_status(&d2, &observed(Some(&c), Some(&p)), later);
    assert_eq!(s1, s2, "nothing changed, nothing to write");
    assert!(events(&d2, &s2).is_empty());
    // Succeeded in the status: the importer is not started again, even if the claim's
    // annotation is not (yet) seen.
    let mut done = d.clone();
    done.status = Some(DataVolumeStatus {
        phase: Some(phase::SUCCEEDED.into()),
        ..DataVolumeStatus::default()
    });
    let o = observed(Some(&c), None);
    assert_eq!(
        plan(&done, &o),
        Plan {
            mark_succeeded: true,
            ..Plan::default()
        }
    );
    assert_eq!(
        derive_status(&done, &o, NOW).phase.as_deref(),
        Some(phase::SUCCEEDED)
    );
}

fn pvc_source() -> Value {
    json!({"pvc": {"name": "golden"}})
}

/// The claim a clone copies: `phase`, with `annotations`, owned by a DataVolume or not,
/// `mode` (Filesystem when None), requesting 1084Mi.
fn source_claim(
    phase: &str,
    annotations: Value,
    dv_owned: bool,
    mode: Option<&str>,
) -> PersistentVolumeClaim {
    let owners = if dv_owned {
        json!([{"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "name": "golden", "uid": "golden-uid", "controller": true}])
    } else {
        json!([])
    };
    serde_json::from_value(json!({
        "metadata": {"name": "golden", "namespace": "ns", "annotations": annotations,
            "ownerReferences": owners},
        "spec": {"resources": {"requests": {"storage": "1084Mi"}}, "volumeMode": mode},
        "status": {"phase": phase}
    }))
    .unwrap()
}

fn clone_pod(phase: &str, state: Value, last: Value, restarts: i32) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "cdi-clone-d", "namespace": "ns", "uid": "pod-uid"},
        "status": {"phase": phase, "containerStatuses": [{
            "name": "clone", "image": "i", "imageID": "", "ready": false,
            "restartCount": restarts, "state": state, "lastState": last}]}
    }))
    .unwrap()
}

#[test]
fn a_clone_waits_for_its_source_then_makes_its_claim() {
    let populated = json!({"cdi.kubevirt.io/storage.pod.phase": "Succeeded"});
    let ready = source_claim("Bound", populated.clone(), true, None);
    let user_made = source_claim("Bound", json!({}), false, None);
    let pending = source_claim("Pending", json!({}), false, None);
    let importing = source_claim(
        "Bound",
        json!({"cdi.kubevirt.io/storage.pod.phase": "Running"}),
        true,
        None,
    );
    let archive = source_claim(
        "Bound",
        json!({"cdi.kubevirt.io/storage.contentType": "archive"}),
        false,
        None,
    );
    let block = source_claim("Bound", json!({}), false, Some("Block"));
    let launcher = vec!["ns/virt-launcher-vm-x".to_string()];
    let none: Vec<String> = Vec::new();
    let d = dv(pvc_source(), None);
    let mut small = dv(pvc_source(), None);
    small.spec.storage =
        serde_json::from_value(json!({"resources": {"requests": {"storage": "512Mi"}}})).unwrap();
    let sized = |c| {
        Some(CloneSource {
            claim: c,
            users: &none,
        })
    };
    // (DataVolume, source as observed, phase, Running reason, message part, creates claim)
    type Row<'a> = (
        &'a DataVolume,
        Option<CloneSource<'a>>,
        &'static str,
        &'static str,
        &'static str,
        bool,
    );
    let rows: Vec<Row<'_>> = vec![
        (
            &d,
            None,
            phase::CLONE_SCHEDULED,
            phase::REASON_CLONE_SOURCE_NOT_READY,
            "looking at",
            false,
        ),
        (
            &d,
            sized(None),
            phase::CLONE_SCHEDULED,
            phase::REASON_CLONE_WITHOUT_SOURCE,
            "The source pvc golden doesn't exist",
            false,
        ),
        (
            &d,
            sized(Some(&pending)),
            phase::CLONE_SCHEDULED,
            phase::REASON_CLONE_SOURCE_NOT_READY,
            "ns/golden is Pending",
            false,
        ),
        (
            &d,
            sized(Some(&importing)),
            phase::CLONE_SCHEDULED,
            phase::REASON_CLONE_SOURCE_NOT_READY,
            "not populated yet (its worker: Running)",
            false,
        ),
        (
            &d,
            Some(CloneSource {
                claim: Some(&ready),
                users: &launcher,
            }),
            phase::CLONE_SCHEDULED,
            phase::REASON_CLONE_SOURCE_IN_USE,
            "pod ns/virt-launcher-vm-x using PersistentVolumeClaim golden",
            false,
        ),
        (
            &d,
            sized(Some(&archive)),
            phase::PENDING,
            phase::REASON_CLONE_VALIDATION_FAILED,
            "contentType (archive)",
            false,
        ),
        (
            &d,
            sized(Some(&block)),
            phase::PENDING,
            phase::REASON_CLONE_VALIDATION_FAILED,
            "Block-mode",
            false,
        ),
        (
            &small,
            sized(Some(&ready)),
            phase::PENDING,
            phase::REASON_CLONE_VALIDATION_FAILED,
            "smaller than the source",
            false,
        ),
        // Ready: a DataVolume's claim that succeeded, or a claim no DataVolume fills.
        (&d, sized(Some(&ready)), phase::PENDING, "", "", true),
        (&d, sized(Some(&user_made)), phase::PENDING, "", "", true),
    ];
    for (i, (d, src, want_phase, reason, message, create)) in rows.into_iter().enumerate() {
        let o = Observed {
            clone_source: src,
            ..observed(None, None)
        };
        assert_eq!(
            plan(d, &o),
            Plan {
                create_claim: create,
                ..Plan::default()
            },
            "row {i}"
        );
        let s = derive_status(d, &o, NOW);
        assert_eq!(s.phase.as_deref(), Some(want_phase), "row {i}");
        let (st, r, m) = cond(&s, "Running");
        assert_eq!((st, r), (ConditionStatus::False, reason), "row {i}");
        assert!(m.contains(message), "row {i}: {m}");
        // Nothing is transferring while it waits.
        assert_eq!(cond(&s, "Ready").1, "", "row {i}");
        if !reason.is_empty() {
            assert!(
                events(d, &s).iter().any(|(w, r, _)| *w && *r == reason),
                "row {i}: {:?}",
                events(d, &s)
            );
        }
    }
}

#[test]
fn a_clone_runs_through_cdis_phases_once_its_source_is_ready() {
    let d = dv(pvc_source(), None);
    let populated = json!({"cdi.kubevirt.io/storage.pod.phase": "Succeeded"});
    let src = source_claim("Bound", populated, true, None);
    let none: Vec<String> = Vec::new();
    let launcher = vec!["ns/virt-launcher-vm-x".to_string()];
    let ready = Some(CloneSource {
        claim: Some(&src),
        users: &none,
    });
    let in_use = Some(CloneSource {
        claim: Some(&src),
        users: &launcher,
    });
    let pending = claim("Pending", "dv-uid", json!({}));
    let bound = claim("Bound", "dv-uid", json!({}));
    let scheduled = clone_pod(
        "Pending",
        json!({"waiting": {"reason": "ContainerCreating"}}),
        json!({}),
        0,
    );
    let running = clone_pod("Running", json!({"running": {}}), json!({}), 0);
    let too_large = json!({"terminated": {"exitCode": 1, "reason": "Error",
        "message": "{\"reason\":\"ImageTooLarge\",\"message\":\"the image's virtual size is 2 bytes\"}"}});
    let failed_once = clone_pod("Running", json!({"running": {}}), too_large, 1);
    let exited = clone_pod(
        "Succeeded",
        json!({"terminated": {"exitCode": 0, "reason": "Completed"}}),
        json!({}),
        0,
    );
    let f = ConditionStatus::False;
    let t = ConditionStatus::True;
    // (claim, pod, source as observed, phase, plan, Running, Ready reason)
    type Row<'a> = (
        &'a PersistentVolumeClaim,
        Option<&'a Pod>,
        Option<CloneSource<'a>>,
        &'static str,
        Plan,
        (ConditionStatus, &'static str),
        &'static str,
    );
    let rows: Vec<Row<'_>> = vec![
        (
            &pending,
            None,
            ready,
            phase::PENDING,
            Plan {
                create_pod: true,
                ..Plan::default()
            },
            (f, ""),
            "",
        ),
        // Someone started a VM on the source meanwhile: the worker waits.
        (
            &bound,
            None,
            in_use,
            phase::CLONE_SCHEDULED,
            Plan::default(),
            (f, phase::REASON_CLONE_SOURCE_IN_USE),
            "",
        ),
        (
            &pending,
            Some(&scheduled),
            None,
            phase::CLONE_SCHEDULED,
            Plan::default(),
            (f, ""),
            phase::REASON_TRANSFER_RUNNING,
        ),
        (
            &bound,
            Some(&running),
            None,
            phase::CLONE_IN_PROGRESS,
            Plan::default(),
            (t, REASON_POD_RUNNING),
            phase::REASON_TRANSFER_RUNNING,
        ),
        (
            &bound,
            Some(&failed_once),
            None,
            phase::CLONE_IN_PROGRESS,
            Plan::default(),
            (f, "ImageTooLarge"),
            phase::REASON_TRANSFER_RUNNING,
        ),
        (
            &bound,
            Some(&exited),
            None,
            phase::SUCCEEDED,
            Plan {
                mark_succeeded: true,
                delete_pod: Some(("cdi-clone-d".into(), "pod-uid".into())),
                ..Plan::default()
            },
            (f, phase::REASON_COMPLETED),
            "",
        ),
    ];
    for (i, (c, p, src, want_phase, want_plan, r, ready_reason)) in rows.into_iter().enumerate() {
        let o = Observed {
            clone_source: src,
            ..observed(Some(c), p)
        };
        assert_eq!(plan(&d, &o), want_plan, "row {i}");
        let s = derive_status(&d, &o, NOW);
        assert_eq!(s.phase.as_deref(), Some(want_phase), "row {i}");
        let (rs, rr, _) = cond(&s, "Running");
        assert_eq!((rs, rr), r, "row {i}");
        assert_eq!(cond(&s, "Ready").1, ready_reason, "row {i}");
    }
    // Done: CDI's words, and CloneSucceeded naming both claims.
    let o = observed(Some(&bound), Some(&exited));
    let s = derive_status(&d, &o, NOW);
    assert_eq!(cond(&s, "Running").2, MESSAGE_CLONE_COMPLETE);
    assert!(
        events(&d, &s).iter().any(|(w, r, n)| !*w
            && *r == phase::REASON_CLONE_SUCCEEDED
            && n.contains("from ns/golden into ns/d")),
        "{:?}",
        events(&d, &s)
    );
    // A failed attempt: ErrCloneFailed with the worker's reason.
    let o = observed(Some(&bound), Some(&failed_once));
    let s = derive_status(&d, &o, NOW);
    assert!(
        events(&d, &s).iter().any(|(w, r, n)| *w
            && *r == phase::REASON_ERR_CLONE_FAILED
            && n.contains("ImageTooLarge")),
        "{:?}",
        events(&d, &s)
    );
    // Scheduled: CDI's event.
    let o = observed(Some(&pending), Some(&scheduled));
    let s = derive_status(&d, &o, NOW);
    assert!(
        events(&d, &s)
            .iter()
            .any(|(_, r, n)| *r == phase::CLONE_SCHEDULED
                && n == "Cloning from ns/golden into ns/d scheduled"),
        "{:?}",
        events(&d, &s)
    );
}

#[test]
fn a_clone_into_block_is_not_supported_yet() {
    let mut d = dv(pvc_source(), None);
    d.spec.storage = serde_json::from_value(json!({"volumeMode": "Block"})).unwrap();
    let s = derive_status(&d, &observed(None, None), NOW);
    let (_, r, m) = cond(&s, "Running");
    assert_eq!(r, REASON_NOT_SUPPORTED);
    assert!(m.contains("Block-mode"), "{m}");
}

#[test]
fn the_users_of_a_claim_are_the_unfinished_pods_that_may_write_it() {
    let pod = |name: &str, phase: &str, claim: &str, read_only: bool| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"containers": [], "volumes": [
                {"name": "v", "persistentVolumeClaim": {"claimName": claim, "readOnly": read_only}}]},
            "status": {"phase": phase}
        }))
        .unwrap()
    };
    let pods = [
        pod("writer", "Running", "golden", false),
        pod("starting", "Pending", "golden", false),
        pod("reader", "Running", "golden", true),
        pod("done", "Succeeded", "golden", false),
        pod("gone", "Failed", "golden", false),
        pod("other", "Running", "silver", false),
    ];
    assert_eq!(claim_users(&pods, "golden"), ["ns/writer", "ns/starting"]);
    assert!(claim_users(&pods, "bronze").is_empty());
}

fn upload_pod(phase: &str, state: Value, ready: bool) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "cdi-upload-d", "namespace": "ns", "uid": "pod-uid"},
        "status": {"phase": phase,
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
            "containerStatuses": [{
            "name": "cdi-upload-server", "image": "i", "imageID": "", "ready": ready,
            "restartCount": 0, "state": state, "lastState": {}}]}
    }))
    .unwrap()
}

#[test]
fn upload_runs_through_cdis_phases_and_marks_the_claim_ready_as_virtctl_polls() {
    let d = dv(json!({"upload": {}}), None);
    assert_eq!(source(&d), Source::Upload);
    let bound = claim("Bound", "dv-uid", json!({}));
    // No server yet: one is made.
    let p = plan(&d, &observed(Some(&bound), None));
    assert!(p.create_pod);
    assert_eq!(p.mark_ready, Some(false));
    let s = derive_status(&d, &observed(Some(&bound), None), NOW);
    assert_eq!(s.phase.as_deref(), Some(phase::PVC_BOUND));

    // Created, not ready: UploadScheduled.
    let starting = upload_pod(
        "Pending",
        json!({"waiting": {"reason": "ContainerCreating"}}),
        false,
    );
    let s = derive_status(&d, &observed(Some(&bound), Some(&starting)), NOW);
    assert_eq!(s.phase.as_deref(), Some(phase::UPLOAD_SCHEDULED));
    let running = upload_pod("Running", json!({"running": {}}), false);
    let s = derive_status(&d, &observed(Some(&bound), Some(&running)), NOW);
    assert_eq!(s.phase.as_deref(), Some(phase::UPLOAD_SCHEDULED));

    // Ready: UploadReady, and the claim says so.
    let ready = upload_pod("Running", json!({"running": {}}), true);
    let s = derive_status(&d, &observed(Some(&bound), Some(&ready)), NOW);
    assert_eq!(s.phase.as_deref(), Some(phase::UPLOAD_READY));
    assert_eq!(cond(&s, phase::CONDITION_RUNNING).0, ConditionStatus::True);
    let p = plan(&d, &observed(Some(&bound), Some(&ready)));
    assert_eq!(p.mark_ready, Some(true));
    assert!(!p.create_pod);
    let marked = claim("Bound", "dv-uid", json!({ann::POD_READY: "true"}));
    assert_eq!(
        plan(&d, &observed(Some(&marked), Some(&ready))).mark_ready,
        None
    );

    // The server exits 0 once an upload completed: Succeeded, claim marked, pod deleted.
    let finished = upload_pod(
        "Succeeded",
        json!({"terminated": {"exitCode": 0, "reason": "Completed"}}),
        false,
    );
    let p = plan(&d, &observed(Some(&marked), Some(&finished)));
    assert!(p.mark_succeeded);
    assert_eq!(p.mark_ready, Some(false));
    assert_eq!(
        p.delete_pod,
        Some(("cdi-upload-d".into(), "pod-uid".into()))
    );
    let s = derive_status(&d, &observed(Some(&marked), Some(&finished)), NOW);
    assert_eq!(s.phase.as_deref(), Some(phase::SUCCEEDED));
    assert_eq!(
        cond(&s, phase::CONDITION_RUNNING).2,
        MESSAGE_UPLOAD_COMPLETE
    );
    let notes = events(&d, &s);
    assert!(
        notes.iter().any(|n| n.1 == phase::REASON_UPLOAD_SUCCEEDED),
        "{notes:?}"
    );

    // Populated: never a second server.
    let populated = claim(
        "Bound",
        "dv-uid",
        json!({ann::POD_PHASE: "Succeeded", ann::POD_READY: "false"}),
    );
    let p = plan(&d, &observed(Some(&populated), None));
    assert!(!p.create_pod);
    assert_eq!(p.mark_ready, None);
}

#[test]
fn an_upload_into_a_block_claim_is_not_carried_out() {
    let mut d = dv(json!({"upload": {}}), None);
    d.spec.storage.as_mut().unwrap().volume_mode = Some("Block".into());
    assert!(matches!(source(&d), Source::Unsupported(_)));
}
