//! virt-operator: installs, upgrades and uninstalls kubevirt-rs from one `KubeVirt` resource.
//!
//! [`render`] holds every object kubevirt-rs deploys (typed k8s-openapi objects → YAML); the
//! operator, `gen-manifests` and `cargo xtask deploy` all render from it.

pub mod cdi;
pub mod cdi_step;
pub mod certs_step;
pub mod ctx;
pub mod etcd_evacuation;
pub mod etcd_members;
pub mod etcd_membership;
pub mod install;
pub mod instancetypes;
pub mod kubevirt;
pub mod metrics;
pub mod monitoring;
pub mod params;
pub mod policy;
pub mod reconcile;
pub mod render;
pub mod rotation;
pub mod signer;
pub mod status;
pub mod steps;

/// The workspace root (this crate lives two levels below it); for tests and `gen-manifests`
/// run from a checkout.
pub fn workspace_root() -> std::path::PathBuf {
    let manifest = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .nth(2)
        .map(std::path::Path::to_path_buf)
        .unwrap_or(manifest)
}
