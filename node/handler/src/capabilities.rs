//! QEMU capabilities for launcher pods, probed once per node.
//!
//! A launcher's private libvirt daemon probes QEMU's capabilities before it can define a
//! domain: seconds under TCG, paid by every VM start without a cache. A cache shared by
//! the launchers of a node (a hostPath they all write) would let one launcher poison
//! what every other one reads. Instead virt-handler's init container probes once, with
//! the launcher image and as the launcher user, into a directory of the handler's pod;
//! virt-handler copies it into each launcher pod's own cache (an emptyDir) while it sets
//! up the pod's network, before the launcher starts its daemon. libvirt still checks
//! each entry (QEMU binary, libvirt version, kernel) and probes again when one does not
//! match, so a stale copy costs time, never correctness.

use std::path::Path;

use kubevirt_api::LAUNCHER_UID;

use crate::launcher_fs::{LauncherFsError, Peer, SocketsDir};

/// The launcher's cache directory inside its container (an emptyDir).
pub const LAUNCHER_CACHE_DIR: &str = "var/cache/kubevirt-rs/libvirt";
/// The most one cached file may hold (a capabilities file is some hundred KiB).
const FILE_LIMIT: u64 = 16 * 1024 * 1024;

/// Copies the tree `from` (this handler's, trusted) into the cache of the launcher
/// process `peer` (checked to be of its pod), owned by the launcher user; what is there
/// already is kept. Returns the number of files copied. Blocking.
pub fn seed(from: &Path, peer: &Peer) -> Result<usize, LauncherFsError> {
    let to = peer.dir(LAUNCHER_CACHE_DIR)?;
    copy_tree(from, &to, 0)
}

/// The directory levels copied (`tcg/qemu/capabilities/x.xml` is four).
const MAX_DEPTH: usize = 8;

fn copy_tree(from: &Path, to: &SocketsDir, depth: usize) -> Result<usize, LauncherFsError> {
    let io = |source: std::io::Error| LauncherFsError::Io {
        path: from.display().to_string(),
        source,
    };
    if depth > MAX_DEPTH {
        return Ok(0);
    }
    let mut copied = 0;
    for e in std::fs::read_dir(from).map_err(io)? {
        let e = e.map_err(io)?;
        let Ok(name) = e.file_name().into_string() else {
            continue;
        };
        let ty = e.file_type().map_err(io)?;
        if ty.is_dir() {
            let sub = to.make_subdir_owned(&name, LAUNCHER_UID)?;
            copied += copy_tree(&e.path(), &sub, depth + 1)?;
        } else if ty.is_file() {
            let len = e.metadata().map_err(io)?.len();
            if len > FILE_LIMIT {
                continue;
            }
            let data = std::fs::read(e.path()).map_err(io)?;
            if to.create_owned(&name, &data, LAUNCHER_UID)? {
                copied += 1;
            }
        }
    }
    Ok(copied)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn the_tree_is_copied_and_what_is_there_is_kept() {
        let from = tempfile::tempdir().unwrap();
        let to = tempfile::tempdir().unwrap();
        let caps = from.path().join("tcg/qemu/capabilities");
        std::fs::create_dir_all(&caps).unwrap();
        std::fs::write(caps.join("a.xml"), "<a/>").unwrap();
        std::fs::write(caps.join("b.xml"), "<b/>").unwrap();
        std::fs::create_dir_all(to.path().join("tcg/qemu/capabilities")).unwrap();
        std::fs::write(to.path().join("tcg/qemu/capabilities/b.xml"), "mine").unwrap();
        let dir = SocketsDir::at(to.path()).unwrap();
        assert_eq!(copy_tree(from.path(), &dir, 0).unwrap(), 1);
        let got = |n: &str| {
            std::fs::read_to_string(to.path().join("tcg/qemu/capabilities").join(n)).unwrap()
        };
        assert_eq!(got("a.xml"), "<a/>");
        assert_eq!(got("b.xml"), "mine");
    }

    #[test]
    fn a_launcher_symlink_is_not_followed_out_of_its_cache() {
        let from = tempfile::tempdir().unwrap();
        let to = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(from.path().join("tcg")).unwrap();
        std::fs::write(from.path().join("tcg/x.xml"), "<x/>").unwrap();
        std::os::unix::fs::symlink(outside.path(), to.path().join("tcg")).unwrap();
        let dir = SocketsDir::at(to.path()).unwrap();
        assert!(copy_tree(from.path(), &dir, 0).is_err());
        assert!(!outside.path().join("x.xml").exists());
    }
}
