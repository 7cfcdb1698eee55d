//! KWOK (Kubernetes WithOut Kubelet), built from its Go module at the version
//! `e2e/kwok/go.mod` pins, like Kubernetes and local-path-provisioner, and cached under
//! `target/kwok/`: its `kwok` controller keeps fake Nodes Ready and plays the kubelet's part
//! for the pods bound to them (Running, with a pod IP), so `cargo xtask bench scale` can
//! start thousands of launcher pods without a container.

use std::path::{Path, PathBuf};

use super::{Layout, Progress, kube_build};

/// KWOK's controller, built from the module `e2e/kwok/go.mod` pins.
const TOOL: kube_build::GoTool = kube_build::GoTool {
    dir: "e2e/kwok",
    module: "sigs.k8s.io/kwok",
    package: "sigs.k8s.io/kwok/cmd/kwok",
    tags: &[],
    name: "kwok",
    cache: "kwok",
};

/// The pinned version, from `e2e/kwok/go.mod`.
pub fn pinned_version(root: &Path) -> anyhow::Result<String> {
    TOOL.version(root)
}

/// Builds the `kwok` controller unless it is cached; returns the binary.
pub fn ensure(layout: &Layout, progress: &Progress) -> anyhow::Result<PathBuf> {
    TOOL.ensure(layout, progress, " (first time: a few minutes)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pinned_version_comes_from_go_mod() {
        let v = pinned_version(&crate::workspace_root()).unwrap();
        assert!(v.starts_with("v0."), "{v}");
        let in_go_mod = |m| kube_build::required_version(m, "sigs.k8s.io/kwok");
        assert_eq!(
            in_go_mod("module m\n\nrequire sigs.k8s.io/kwok v0.7.0\n").as_deref(),
            Some("v0.7.0")
        );
        assert_eq!(in_go_mod("require (\n\tfoo v1\n)\n"), None);
    }
}
