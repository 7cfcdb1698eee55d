//! `persistentVolumeClaim` volumes as virt-controller mounts them into the pod: a
//! Filesystem-mode claim is a directory holding a raw `disk.img` (created sparse here when
//! absent, KubeVirt's convention), a Block-mode claim is the device itself.
//!
//! Blocking file I/O; called from [`crate::volumes::prepare`].

use std::collections::BTreeMap;
use std::fs::{self, OpenOptions};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use virt_domain::PreparedVolume;
use virt_domain::schema::{DiskFormat, DiskType};

use crate::volumes::{VolumeError, opens_direct};

/// The image file at the root of a Filesystem-mode claim.
pub const DISK_IMG: &str = "disk.img";

/// Where one claim is in the pod, and the size of a `disk.img` to create in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimPath {
    /// The claim's mount point (Filesystem) or device node (Block).
    pub path: PathBuf,
    /// Bytes of a new `disk.img`; without it a missing `disk.img` is an error.
    pub disk_size: Option<u64>,
}

/// `--claim VOLUME=PATH` and `--claim-disk-size VOLUME=BYTES`, by volume name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Claims(pub BTreeMap<String, ClaimPath>);

impl Claims {
    /// Builds the map from the two repeatable flags; every size must name a claim.
    pub fn from_args(paths: &[String], sizes: &[String]) -> Result<Self, String> {
        let mut out = BTreeMap::new();
        for p in paths {
            let (volume, path) = p
                .split_once('=')
                .ok_or_else(|| format!("--claim {p:?}: expected VOLUME=PATH"))?;
            out.insert(
                volume.to_string(),
                ClaimPath {
                    path: PathBuf::from(path),
                    disk_size: None,
                },
            );
        }
        for s in sizes {
            let (volume, bytes) = s
                .split_once('=')
                .ok_or_else(|| format!("--claim-disk-size {s:?}: expected VOLUME=BYTES"))?;
            let bytes: u64 = bytes
                .parse()
                .map_err(|_| format!("--claim-disk-size {s:?}: {bytes:?} is not a byte count"))?;
            out.get_mut(volume)
                .ok_or_else(|| format!("--claim-disk-size {s:?}: no --claim {volume}=PATH"))?
                .disk_size = Some(bytes);
        }
        Ok(Claims(out))
    }
}

/// The disk QEMU opens for claim volume `volume`.
pub fn prepare(volume: &str, claim: &ClaimPath) -> Result<PreparedVolume, VolumeError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| VolumeError::Io {
            volume: volume.into(),
            path,
            source,
        }
    };
    let meta = fs::metadata(&claim.path).map_err(io(&claim.path))?;
    if meta.file_type().is_block_device() {
        return Ok(PreparedVolume {
            path: claim.path.clone(),
            format: DiskFormat::Raw,
            kind: DiskType::Block,
            direct_io: opens_direct(&claim.path),
        });
    }
    if !meta.is_dir() {
        return Err(VolumeError::Invalid {
            volume: volume.into(),
            detail: format!(
                "the claim at {} is neither a directory (volumeMode Filesystem) nor a block device (volumeMode Block)",
                claim.path.display()
            ),
        });
    }
    let img = claim.path.join(DISK_IMG);
    match fs::symlink_metadata(&img) {
        // A link could point anywhere the launcher user may read: only a regular file is
        // the claim's disk.
        Ok(m) if m.is_file() => {
            // A sparse image larger than the claim's file system fails only once the guest
            // fills the claim, with I/O errors in the guest: refuse it at the start.
            let fs_bytes = nix::sys::statvfs::statvfs(&claim.path)
                .map(|s| s.blocks().saturating_mul(s.fragment_size()))
                .map_err(|e| io(&claim.path)(e.into()))?;
            if m.len() > fs_bytes {
                return Err(VolumeError::Invalid {
                    volume: volume.into(),
                    detail: format!(
                        "{DISK_IMG} is {} bytes, more than the claim's {fs_bytes} bytes: the claim is too small for its disk",
                        m.len()
                    ),
                });
            }
        }
        Ok(_) => {
            return Err(VolumeError::Invalid {
                volume: volume.into(),
                detail: format!("{DISK_IMG} in the claim is not a regular file"),
            });
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let size = claim.disk_size.ok_or_else(|| VolumeError::Invalid {
                volume: volume.into(),
                detail: format!(
                    "the claim has no {DISK_IMG} and its size is unknown (the claim is too small for one)"
                ),
            })?;
            // create_new: two launchers of one claim (a migration's source and target
            // on shared storage) never both create it; the loser uses the winner's.
            match OpenOptions::new().write(true).create_new(true).open(&img) {
                Ok(f) => {
                    if let Err(e) = f.set_len(size) {
                        // Nothing half-made: a disk.img of the wrong size would be used
                        // as it is by the next start.
                        let _ = fs::remove_file(&img);
                        return Err(io(&img)(e));
                    }
                    tracing::info!(volume, path = %img.display(), size, "created sparse disk.img");
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(io(&img)(e)),
            }
        }
        Err(e) => return Err(io(&img)(e)),
    }
    Ok(PreparedVolume {
        direct_io: opens_direct(&img),
        path: img,
        format: DiskFormat::Raw,
        kind: DiskType::File,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn flags_pair_paths_with_sizes() {
        let c = Claims::from_args(
            &["data=/pvc/data".into(), "raw=/dev/raw".into()],
            &["data=1048576".into()],
        )
        .unwrap();
        assert_eq!(c.0["data"].disk_size, Some(1 << 20));
        assert_eq!(c.0["raw"].disk_size, None);
        assert!(
            Claims::from_args(&[], &["x=1".into()])
                .unwrap_err()
                .contains("no --claim x=PATH")
        );
        assert!(
            Claims::from_args(&["x".into()], &[])
                .unwrap_err()
                .contains("VOLUME=PATH")
        );
        assert!(
            Claims::from_args(&["x=/a".into()], &["x=big".into()])
                .unwrap_err()
                .contains("not a byte count")
        );
    }

    #[test]
    fn a_new_claim_gets_a_sparse_disk_img_that_the_next_start_reuses() {
        let dir = tempfile::tempdir().unwrap();
        let claim = ClaimPath {
            path: dir.path().to_path_buf(),
            disk_size: Some(64 << 20),
        };
        let v = prepare("data", &claim).unwrap();
        assert_eq!(v.path, dir.path().join(DISK_IMG));
        assert_eq!(v.format, DiskFormat::Raw);
        let meta = fs::metadata(&v.path).unwrap();
        assert_eq!(meta.len(), 64 << 20);
        // Sparse: a 64 MiB disk does not take 64 MiB.
        assert!(std::os::unix::fs::MetadataExt::blocks(&meta) * 512 < meta.len());
        // Written data survives a second preparation (a restart of the VM).
        fs::write(&v.path, b"marker").unwrap();
        prepare("data", &claim).unwrap();
        assert_eq!(&fs::read(&v.path).unwrap()[..6], b"marker");
    }

    #[test]
    fn a_claim_without_size_or_with_a_linked_disk_img_fails_naming_the_volume() {
        let dir = tempfile::tempdir().unwrap();
        let claim = ClaimPath {
            path: dir.path().to_path_buf(),
            disk_size: None,
        };
        let e = prepare("data", &claim).unwrap_err().to_string();
        assert!(
            e.contains("\"data\"") && e.contains("size is unknown"),
            "{e}"
        );
        assert!(!dir.path().join(DISK_IMG).exists());
        std::os::unix::fs::symlink("/etc/hostname", dir.path().join(DISK_IMG)).unwrap();
        let e = prepare("data", &claim).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let file = dir.path().join("file");
        fs::write(&file, b"").unwrap();
        let e = prepare(
            "data",
            &ClaimPath {
                path: file,
                disk_size: None,
            },
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("neither a directory"), "{e}");
    }

    #[test]
    fn a_disk_img_larger_than_its_claim_is_refused_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let s = nix::sys::statvfs::statvfs(dir.path()).unwrap();
        let fs_bytes = s.blocks() * s.fragment_size();
        let img = dir.path().join(DISK_IMG);
        fs::File::create(&img)
            .unwrap()
            .set_len(fs_bytes + 1)
            .unwrap();
        let claim = ClaimPath {
            path: dir.path().to_path_buf(),
            disk_size: Some(64 << 20),
        };
        let e = prepare("data", &claim).unwrap_err().to_string();
        assert!(e.contains("\"data\"") && e.contains("too small"), "{e}");
        assert_eq!(fs::metadata(&img).unwrap().len(), fs_bytes + 1);
    }
}
