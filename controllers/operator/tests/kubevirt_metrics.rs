//! virt-operator's KubeVirt metrics ([`virt_operator::metrics::KUBEVIRT_METRICS`]) are
//! KubeVirt's: each name, help text and type is the one in KubeVirt's own metric list
//! (`docs/observability/metrics.md` of the `kubevirt.io/kubevirt` Go module at the version
//! `e2e/virtctl` pins), read as data, as `controllers/tests/kubevirt_metrics.rs` checks
//! virt-controller's and virt-apiserver's.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::Path;

#[test]
fn operator_metrics_are_kubevirts() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let (version, dir) = kubevirt_upstream::pinned_module_dir(&root, kubevirt_upstream::METRICS_MD)
        .unwrap_or_else(|e| panic!("KubeVirt's metric list (docs/local-cluster.md: Go): {e}"));
    let doc = dir.join(kubevirt_upstream::METRICS_MD);
    let upstream =
        kubevirt_upstream::parse_metrics_md(&std::fs::read_to_string(&doc).unwrap()).unwrap();
    let text = virt_operator::metrics::Metrics::default().encode();
    for (name, help, kind) in virt_operator::metrics::KUBEVIRT_METRICS {
        let m = upstream
            .get(name)
            .unwrap_or_else(|| panic!("{name} is not a KubeVirt {version} metric"));
        assert_eq!(m.help, help, "help of {name}");
        assert_eq!(m.kind, kind, "type of {name}");
        assert!(
            text.contains(&format!("# TYPE {name} {}", kind.to_lowercase())),
            "{name} not exported as a {kind}:\n{text}"
        );
    }
}
