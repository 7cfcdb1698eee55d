//! Volume preparation: turns the VMI's volumes into files QEMU can open. Runs before
//! the domain exists; everything it creates lives in the launcher's work directory.
//!
//! Blocking (file I/O and `qemu-img`/`xorriso`); call it from `spawn_blocking`.

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine;
use kubevirt_api::VirtualMachineInstance;
use kubevirt_api::quantity;
use kubevirt_api::vmi::{CloudInitSource, Volume};
use virt_domain::schema::{DiskFormat, DiskType};
use virt_domain::{KernelBootFiles, PreparedVolume};

use crate::claims::Claims;

/// Why a volume could not be prepared. Every variant names the volume.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// The image reference has no `--image-dir` mapping.
    #[error(
        "volume {volume:?}: image {image:?} is not available (map it with --image-dir {image}=DIR)"
    )]
    UnknownImage {
        /// Volume.
        volume: String,
        /// Image reference.
        image: String,
    },
    /// A file in an image is missing or unreadable.
    #[error("volume {volume:?}: cannot read {path}: {source}")]
    Unreadable {
        /// Volume.
        volume: String,
        /// The file.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// No unique disk file in the image.
    #[error(
        "volume {volume:?}: image directory {dir} must hold exactly one disk image under disk/ or at its top level, found {found}"
    )]
    NoDiskFile {
        /// Volume.
        volume: String,
        /// Image directory.
        dir: PathBuf,
        /// How many were found.
        found: usize,
    },
    /// A helper tool failed.
    #[error("volume {volume:?}: {tool} failed: {stderr}")]
    Tool {
        /// Volume.
        volume: String,
        /// Tool.
        tool: &'static str,
        /// Its error output.
        stderr: String,
    },
    /// The volume source is not supported by this launcher.
    #[error("volume {volume:?}: {kind} volumes are not supported by the standalone launcher")]
    Unsupported {
        /// Volume.
        volume: String,
        /// Source kind.
        kind: String,
    },
    /// Bad inline data.
    #[error("volume {volume:?}: {detail}")]
    Invalid {
        /// Volume.
        volume: String,
        /// What is wrong.
        detail: String,
    },
    /// Writing into the work directory failed.
    #[error("volume {volume:?}: {path}: {source}")]
    Io {
        /// Volume.
        volume: String,
        /// File.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
}

/// `--image-dir IMAGE=DIR` mappings: container image references → local directories.
#[derive(Clone, Debug, Default)]
pub struct ImageDirs(pub BTreeMap<String, PathBuf>);

impl ImageDirs {
    fn dir(&self, volume: &str, image: &str) -> Result<&Path, VolumeError> {
        let tagged = format!("{image}:latest");
        self.0
            .get(image)
            .or_else(|| {
                (!image.contains(':'))
                    .then(|| self.0.get(&tagged))
                    .flatten()
            })
            .map(PathBuf::as_path)
            .ok_or_else(|| VolumeError::UnknownImage {
                volume: volume.into(),
                image: image.into(),
            })
    }

    /// A file inside an image, checked to be readable.
    pub fn file(
        &self,
        volume: &str,
        image: &str,
        path_in_image: &str,
    ) -> Result<PathBuf, VolumeError> {
        let dir = self.dir(volume, image)?;
        let path = dir.join(path_in_image.trim_start_matches('/'));
        check_readable(volume, &path)?;
        Ok(absolute(&path))
    }

    /// The disk image of a containerDisk: `path` when given, else the only file under
    /// `disk/` (KubeVirt's layout), else the only disk-looking file at the top level.
    pub fn disk_file(
        &self,
        volume: &str,
        image: &str,
        path: Option<&str>,
    ) -> Result<PathBuf, VolumeError> {
        if let Some(p) = path {
            return self.file(volume, image, p);
        }
        let dir = self.dir(volume, image)?;
        let list = |d: &Path, filter: &dyn Fn(&Path) -> bool| -> Vec<PathBuf> {
            fs::read_dir(d)
                .map(|it| {
                    it.filter_map(|e| e.ok())
                        .map(|e| e.path())
                        .filter(|p| p.is_file() && filter(p))
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut found = list(&dir.join("disk"), &|_| true);
        if found.is_empty() {
            found = list(dir, &|p| {
                matches!(
                    p.extension().and_then(|e| e.to_str()),
                    Some("qcow2" | "img" | "raw" | "iso")
                )
            });
        }
        match found.as_slice() {
            [one] => {
                check_readable(volume, one)?;
                Ok(absolute(one))
            }
            _ => Err(VolumeError::NoDiskFile {
                volume: volume.into(),
                dir: dir.to_path_buf(),
                found: found.len(),
            }),
        }
    }
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

fn check_readable(volume: &str, path: &Path) -> Result<(), VolumeError> {
    let unreadable = |source| VolumeError::Unreadable {
        volume: volume.into(),
        path: path.to_path_buf(),
        source,
    };
    let mut f = fs::File::open(path).map_err(unreadable)?;
    let mut b = [0u8; 1];
    f.read(&mut b).map_err(unreadable)?;
    Ok(())
}

/// What preparation produced: the inputs of [`virt_domain::HostFacts`].
#[derive(Clone, Debug, Default)]
pub struct Prepared {
    /// Prepared volumes by name.
    pub volumes: BTreeMap<String, PreparedVolume>,
    /// Resolved kernel boot files.
    pub kernel_boot: Option<KernelBootFiles>,
}

/// SSH keys of the `noCloud` and `configDrive` access credentials: cloud-init's metadata
/// carries them (`public-keys`), so they are in the guest from its first boot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BootKeys {
    /// Keys for the NoCloud seed.
    pub no_cloud: Vec<String>,
    /// Keys for the ConfigDrive.
    pub config_drive: Vec<String>,
}

impl BootKeys {
    /// The keys of `vmi`'s boot-time credentials, from the Secrets mounted under `dir`
    /// (`<secret>-access-cred`, KubeVirt's layout). A Secret that is missing adds no key
    /// (the VMI's `AccessCredentialsSynchronized` names it when the agent's keys need it).
    pub fn read(vmi: &VirtualMachineInstance, dir: Option<&Path>) -> Self {
        let mut out = Self::default();
        let Some(dir) = dir else { return out };
        for c in vmi.spec.access_credentials.iter().flatten() {
            let (Some(k), Some(name)) = (&c.ssh_public_key, c.secret_name()) else {
                continue;
            };
            let target = match (
                &k.propagation_method.no_cloud,
                &k.propagation_method.config_drive,
            ) {
                (Some(_), _) => &mut out.no_cloud,
                (None, Some(_)) => &mut out.config_drive,
                (None, None) => continue,
            };
            let secret = crate::agent::read_secret(
                &dir.join(kubevirt_api::cloudinit::access_credential_dir(name)),
            );
            if let Some(data) = secret {
                target.extend(crate::agent::key_lines(data.values()));
            } else {
                tracing::warn!(
                    secret = name,
                    "access credential Secret is missing or empty"
                );
            }
        }
        out
    }
}

/// Prepares every volume of `vmi` in `work` (which must exist and is owned by the caller),
/// with container images from `images`, claims where `claims` says they are mounted, and
/// the SSH keys cloud-init's metadata carries.
pub fn prepare(
    vmi: &VirtualMachineInstance,
    images: &ImageDirs,
    claims: &Claims,
    work: &Path,
    keys: &BootKeys,
) -> Result<Prepared, VolumeError> {
    let mut out = Prepared::default();
    if let Some(kb) = vmi
        .spec
        .domain
        .firmware
        .as_ref()
        .and_then(|f| f.kernel_boot.as_ref())
        && let Some(c) = &kb.container
    {
        let kernel = c
            .kernel_path
            .as_deref()
            .map(|p| images.file("kernelBoot", &c.image, p))
            .transpose()?;
        let initrd = c
            .initrd_path
            .as_deref()
            .map(|p| images.file("kernelBoot", &c.image, p))
            .transpose()?;
        out.kernel_boot = Some(KernelBootFiles { kernel, initrd });
    }
    // Hotplugged volumes are not the pod's: virt-handler mounts them later.
    for v in vmi
        .spec
        .volumes
        .iter()
        .flatten()
        .filter(|v| !kubevirt_api::hotplug::is_hotpluggable(v))
    {
        let prepared = prepare_volume(vmi, v, images, claims, work, keys)?;
        out.volumes.insert(v.name.clone(), prepared);
    }
    Ok(out)
}

fn file_volume(path: PathBuf, format: DiskFormat) -> PreparedVolume {
    PreparedVolume {
        direct_io: opens_direct(&path),
        path,
        format,
        kind: DiskType::File,
    }
}

/// Whether `path` opens with `O_DIRECT`, which QEMU needs for cache mode `none`: some
/// file systems refuse the flag (tmpfs before Linux 6.6, some FUSE ones). Checked by
/// opening, as QEMU will, rather than by the file system's name (KubeVirt does the same).
pub(crate) fn opens_direct(path: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_DIRECT)
        .open(path)
        .is_ok()
}

fn prepare_volume(
    vmi: &VirtualMachineInstance,
    v: &Volume,
    images: &ImageDirs,
    claims: &Claims,
    work: &Path,
    keys: &BootKeys,
) -> Result<PreparedVolume, VolumeError> {
    let name = v.name.as_str();
    if v.persistent_volume_claim.is_some() {
        let claim = claims.0.get(name).ok_or_else(|| VolumeError::Invalid {
            volume: name.into(),
            detail: "the claim is not mounted (no --claim VOLUME=PATH)".into(),
        })?;
        return crate::claims::prepare(name, claim);
    }
    if let Some(cd) = &v.container_disk {
        let base = images.disk_file(name, &cd.image, cd.path.as_deref())?;
        let format = detect_format(name, &base)?;
        // A qcow2 overlay takes all writes, so the image is only ever read.
        let overlay = work.join(format!("{name}.qcow2"));
        let fmt = match format {
            DiskFormat::Qcow2 => "qcow2",
            DiskFormat::Raw => "raw",
        };
        run(
            name,
            "qemu-img create",
            Command::new("qemu-img")
                .args(["create", "-q", "-f", "qcow2", "-F", fmt, "-b"])
                .arg(&base)
                .arg(&overlay),
        )?;
        // QEMU opens the image under the overlay with the overlay's cache mode.
        let mut prepared = file_volume(overlay, DiskFormat::Qcow2);
        prepared.direct_io &= opens_direct(&base);
        return Ok(prepared);
    }
    if let Some(ed) = &v.empty_disk {
        let bytes = quantity::parse_bytes(&ed.capacity.0).map_err(|e| VolumeError::Invalid {
            volume: name.into(),
            detail: format!("emptyDisk.capacity {:?}: {e}", ed.capacity.0),
        })?;
        let path = work.join(format!("{name}.qcow2"));
        run(
            name,
            "qemu-img create",
            Command::new("qemu-img")
                .args(["create", "-q", "-f", "qcow2"])
                .arg(&path)
                .arg(bytes.to_string()),
        )?;
        return Ok(file_volume(path, DiskFormat::Qcow2));
    }
    if let Some(ci) = &v.cloud_init_no_cloud {
        return cloud_init_iso(vmi, name, ci, work, Seed::NoCloud, &keys.no_cloud)
            .map(|p| file_volume(p, DiskFormat::Raw));
    }
    if let Some(ci) = &v.cloud_init_config_drive {
        return cloud_init_iso(vmi, name, ci, work, Seed::ConfigDrive, &keys.config_drive)
            .map(|p| file_volume(p, DiskFormat::Raw));
    }
    if let Some(hd) = &v.host_disk {
        let path = PathBuf::from(&hd.path);
        if !path.exists() && hd.type_ == "DiskOrCreate" {
            let cap = hd.capacity.as_ref().map(|q| q.0.as_str()).unwrap_or("0");
            let bytes = quantity::parse_bytes(cap).map_err(|e| VolumeError::Invalid {
                volume: name.into(),
                detail: format!("hostDisk.capacity {cap:?}: {e}"),
            })?;
            let f = fs::File::create(&path).map_err(|source| VolumeError::Io {
                volume: name.into(),
                path: path.clone(),
                source,
            })?;
            f.set_len(bytes).map_err(|source| VolumeError::Io {
                volume: name.into(),
                path: path.clone(),
                source,
            })?;
        }
        check_readable(name, &path)?;
        let kind = if fs::metadata(&path).map(|m| m.is_file()).unwrap_or(true) {
            DiskType::File
        } else {
            DiskType::Block
        };
        return Ok(PreparedVolume {
            direct_io: opens_direct(&path),
            path,
            format: DiskFormat::Raw,
            kind,
        });
    }
    Err(VolumeError::Unsupported {
        volume: name.into(),
        kind: v.source_names().join(","),
    })
}

fn detect_format(volume: &str, path: &Path) -> Result<DiskFormat, VolumeError> {
    let mut magic = [0u8; 4];
    let mut f = fs::File::open(path).map_err(|source| VolumeError::Unreadable {
        volume: volume.into(),
        path: path.to_path_buf(),
        source,
    })?;
    let n = f
        .read(&mut magic)
        .map_err(|source| VolumeError::Unreadable {
            volume: volume.into(),
            path: path.to_path_buf(),
            source,
        })?;
    Ok(if n == 4 && magic == *b"QFI\xfb" {
        DiskFormat::Qcow2
    } else {
        DiskFormat::Raw
    })
}

fn decode(
    volume: &str,
    inline: Option<&String>,
    b64: Option<&String>,
    what: &str,
) -> Result<Option<Vec<u8>>, VolumeError> {
    if let Some(s) = inline {
        return Ok(Some(s.clone().into_bytes()));
    }
    if let Some(s) = b64 {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(s.trim())
            .map_err(|e| VolumeError::Invalid {
                volume: volume.into(),
                detail: format!("{what}Base64 is not valid base64: {e}"),
            })?;
        return Ok(Some(bytes));
    }
    Ok(None)
}

/// The two cloud-init data sources KubeVirt offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seed {
    /// NoCloud: label `cidata`, `meta-data`, `user-data`, `network-config` at the top.
    NoCloud,
    /// OpenStack's ConfigDrive: label `config-2`, `openstack/latest/{meta_data.json,
    /// user_data, network_data.json}`.
    ConfigDrive,
}

/// Writes the cloud-init seed ISO of `volume` with xorriso: the user's data as given, the
/// metadata as KubeVirt writes it (`kubevirt_api::cloudinit`: an instance id stable for
/// the VM, the host name, the keys).
fn cloud_init_iso(
    vmi: &VirtualMachineInstance,
    volume: &str,
    ci: &CloudInitSource,
    work: &Path,
    seed: Seed,
    keys: &[String],
) -> Result<PathBuf, VolumeError> {
    // virt-controller mounts the Secrets and the launcher put their data in the spec
    // (`cloudinit::restore_refs`); one still named here had no mount.
    if ci.secret_ref.is_some() || ci.network_data_secret_ref.is_some() {
        return Err(VolumeError::Unsupported {
            volume: volume.into(),
            kind: "cloud-init secretRef without --cloud-init-dir".into(),
        });
    }
    let dir = work.join(format!("{volume}-cidata"));
    let io = |path: &Path, r: std::io::Result<()>| {
        r.map_err(|source| VolumeError::Io {
            volume: volume.into(),
            path: path.to_path_buf(),
            source,
        })
    };
    io(&dir, fs::create_dir_all(&dir))?;
    let user = decode(
        volume,
        ci.user_data.as_ref(),
        ci.user_data_base64.as_ref(),
        "userData",
    )?;
    let net = decode(
        volume,
        ci.network_data.as_ref(),
        ci.network_data_base64.as_ref(),
        "networkData",
    )?;
    let (files, label) = match seed {
        Seed::NoCloud => (
            [
                (
                    "meta-data",
                    Some(
                        kubevirt_api::cloudinit::nocloud_meta_data(vmi, keys)
                            .to_string()
                            .into_bytes(),
                    ),
                ),
                ("user-data", Some(user.unwrap_or_default())),
                ("network-config", net),
            ],
            "cidata",
        ),
        Seed::ConfigDrive => {
            io(&dir, fs::create_dir_all(dir.join("openstack/latest")))?;
            (
                [
                    (
                        "openstack/latest/meta_data.json",
                        Some(
                            kubevirt_api::cloudinit::config_drive_meta_data(vmi, keys)
                                .to_string()
                                .into_bytes(),
                        ),
                    ),
                    ("openstack/latest/user_data", Some(user.unwrap_or_default())),
                    ("openstack/latest/network_data.json", net),
                ],
                "config-2",
            )
        }
    };
    for (file, data) in files {
        if let Some(data) = data {
            let p = dir.join(file);
            io(&p, fs::write(&p, data))?;
        }
    }
    let iso = work.join(format!("{volume}.iso"));
    run(
        volume,
        "xorriso",
        Command::new("xorriso")
            .args([
                "-as", "mkisofs", "-quiet", "-volid", label, "-joliet", "-rock", "-output",
            ])
            .arg(&iso)
            .arg(&dir),
    )?;
    Ok(iso)
}

fn run(volume: &str, tool: &'static str, cmd: &mut Command) -> Result<(), VolumeError> {
    let out = cmd.output().map_err(|e| VolumeError::Tool {
        volume: volume.into(),
        tool,
        stderr: e.to_string(),
    })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(VolumeError::Tool {
            volume: volume.into(),
            tool,
            stderr: String::from_utf8_lossy(&out.stderr).trim().into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_io_is_probed_by_opening() {
        // procfs refuses O_DIRECT (EINVAL) although the file opens without it.
        assert!(fs::File::open("/proc/self/status").is_ok());
        assert!(!opens_direct(Path::new("/proc/self/status")));
        assert!(!opens_direct(Path::new("/nonexistent/disk.img")));
    }
}
