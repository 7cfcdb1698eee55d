//! KubeVirt's common-instancetypes bundle (the u, o, cx, m, n, rt series of
//! VirtualMachineClusterInstancetypes and the OS VirtualMachineClusterPreferences), exactly
//! as the KubeVirt release pinned in `e2e/virtctl/go.mod` ships it for its virt-operator.
//! The files are copied from that Go module at build time (`build.rs`), so updating KubeVirt's
//! pin updates the bundle, and nothing of it is retyped or committed here.

/// The `kubevirt.io/kubevirt` module version the bundle comes from.
pub const KUBEVIRT_VERSION: &str = env!("KUBEVIRT_MODULE_VERSION");

/// The VirtualMachineClusterInstancetypes, a multi-document YAML stream.
pub const CLUSTER_INSTANCETYPES: &str = include_str!(concat!(
    env!("OUT_DIR"),
    "/common-clusterinstancetypes-bundle.yaml"
));

/// The VirtualMachineClusterPreferences, a multi-document YAML stream.
pub const CLUSTER_PREFERENCES: &str = include_str!(concat!(
    env!("OUT_DIR"),
    "/common-clusterpreferences-bundle.yaml"
));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_bundles_are_kubevirts_yaml_streams() {
        assert!(KUBEVIRT_VERSION.starts_with('v'));
        for (bundle, kind) in [
            (
                CLUSTER_INSTANCETYPES,
                "kind: VirtualMachineClusterInstancetype",
            ),
            (CLUSTER_PREFERENCES, "kind: VirtualMachineClusterPreference"),
        ] {
            assert!(bundle.matches(kind).count() > 20, "{kind}");
        }
        assert!(CLUSTER_INSTANCETYPES.contains("name: u1.nano"));
    }
}
