//! KWOK (Kubernetes WithOut Kubelet), built from its Go module at the version
//! `e2e/kwok/go.mod` pins, like Kubernetes and local-path-provisioner, and cached under
//! `target/kwok/`: its `kwok` controller keeps fake Nodes Ready and plays the kubelet's part
//! for the pods bound to them (Running, with a pod IP), so `cargo xtask bench scale` can
//! start thousands of launcher pods without a container.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::{Layout, Progress, kube_build};

/// The Go module that pins KWOK.
const MODULE: &str = "e2e/kwok";

/// The pinned version, from `e2e/kwok/go.mod`.
pub fn pinned_version(module: &Path) -> anyhow::Result<String> {
    let go_mod = fs::read_to_string(module.join("go.mod"))
        .with_context(|| format!("reading {}/go.mod", module.display()))?;
    version_in(&go_mod).context("e2e/kwok/go.mod does not require sigs.k8s.io/kwok")
}

fn version_in(go_mod: &str) -> Option<String> {
    go_mod.lines().find_map(|l| {
        let l = l.trim().strip_prefix("require ").unwrap_or(l.trim());
        l.strip_prefix("sigs.k8s.io/kwok ")
            .map(|v| v.split_whitespace().next().unwrap_or_default().to_string())
    })
}

/// Builds the `kwok` controller unless it is cached; returns the binary.
pub fn ensure(layout: &Layout, progress: &Progress) -> anyhow::Result<PathBuf> {
    let module = layout.root.join(MODULE);
    let version = pinned_version(&module)?;
    let out = layout.target.join("kwok").join(format!("kwok-{version}"));
    if out.is_file() {
        return Ok(out);
    }
    progress.step(&format!(
        "building KWOK {version} (first time: a few minutes)…"
    ));
    kube_build::go_build(
        &module,
        "sigs.k8s.io/kwok/cmd/kwok",
        &out,
        &format!("KWOK {version}"),
    )?;
    progress.step(&format!("built KWOK {version}"));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pinned_version_comes_from_go_mod() {
        let v = pinned_version(&crate::workspace_root().join(MODULE)).unwrap();
        assert!(v.starts_with("v0."), "{v}");
        assert_eq!(
            version_in("module m\n\nrequire sigs.k8s.io/kwok v0.7.0\n").as_deref(),
            Some("v0.7.0")
        );
        assert_eq!(version_in("require (\n\tfoo v1\n)\n"), None);
    }
}
