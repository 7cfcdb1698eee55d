//! `target/bin`: the one directory a user puts on PATH to get `kubectl` (the one built for the
//! local cluster, so client and server versions match) and `kubectl-virt` (our plugin). A fresh
//! Debian machine has neither; the tests find kubectl the same way (`cargo xtask test` puts
//! this directory first in PATH and sets `KUBECTL`).

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// `target/bin`.
pub fn dir() -> PathBuf {
    crate::target_dir().join("bin")
}

/// The plugin as `cargo build -p kubectl-virt` leaves it.
fn plugin() -> PathBuf {
    crate::target_dir().join("debug/kubectl-virt")
}

/// The line that puts [`dir`] on PATH, for the user to copy.
pub fn path_line() -> String {
    format!("export PATH={}:$PATH", dir().display())
}

/// Builds the kubectl plugin (`kubectl virt …`); cheap when it is current.
pub fn build_plugin() -> anyhow::Result<()> {
    let status = xtask::cargo()
        .args(["build", "-p", "kubectl-virt", "--bin", "kubectl-virt"])
        .current_dir(crate::workspace_root())
        .status()
        .context("running cargo build -p kubectl-virt")?;
    if !status.success() {
        bail!("cargo build -p kubectl-virt failed");
    }
    Ok(())
}

/// Builds the plugin only if it was never built (`cluster up` should not pay for a build that
/// `up` and `cargo build` do anyway).
pub fn build_plugin_if_missing() -> anyhow::Result<()> {
    if plugin().exists() {
        return Ok(());
    }
    build_plugin()
}

/// Creates `target/bin` with `kubectl` → `KUBE_BIN/kubectl` and `kubectl-virt` → the built
/// plugin. Symlinks, so a rebuilt plugin or Kubernetes release needs no new link.
pub fn link(kube_bin: &Path) -> anyhow::Result<PathBuf> {
    let dir = dir();
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    replace_symlink(&kube_bin.join("kubectl"), &dir.join("kubectl"))?;
    replace_symlink(&plugin(), &dir.join("kubectl-virt"))?;
    Ok(dir)
}

/// Points `link` at `target`, atomically (a concurrent test run never sees it missing).
fn replace_symlink(target: &Path, link: &Path) -> anyhow::Result<()> {
    let tmp = link.with_extension("new");
    let _ = fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)
        .with_context(|| format!("linking {} to {}", tmp.display(), target.display()))?;
    fs::rename(&tmp, link).with_context(|| format!("renaming to {}", link.display()))?;
    Ok(())
}

/// `PATH` with [`dir`] first, for the test processes.
pub fn path_env() -> std::ffi::OsString {
    let mut paths = vec![dir()];
    if let Some(p) = std::env::var_os("PATH") {
        paths.extend(std::env::split_paths(&p));
    }
    std::env::join_paths(paths).unwrap_or_else(|_| dir().into_os_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn links_replace_each_other() {
        let tmp = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let link = tmp.path().join("kubectl");
        for target in ["/a/kubectl", "/b/kubectl"] {
            super::replace_symlink(std::path::Path::new(target), &link)
                .unwrap_or_else(|e| panic!("{e:#}"));
        }
        assert_eq!(
            std::fs::read_link(&link).ok(),
            Some(std::path::PathBuf::from("/b/kubectl"))
        );
    }
}
