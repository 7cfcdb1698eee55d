//! Command line.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Parser, ValueEnum};
use virt_domain::NetworkMode;
use virt_launcher::Config;
use virt_launcher::probe::AccelChoice;
use virt_launcher::volumes::ImageDirs;

#[derive(Copy, Clone, Debug, ValueEnum)]
pub enum Accel {
    Auto,
    Kvm,
    Tcg,
}

#[derive(Copy, Clone, Debug, ValueEnum)]
pub enum Network {
    /// QEMU user-mode networking for every interface.
    User,
    /// No NICs.
    None,
    /// The pod network: virt-handler builds a tap in this pod, the guest gets its address
    /// by DHCP (masquerade or bridge binding).
    Pod,
}

/// Runs one VirtualMachineInstance under a private libvirt daemon.
#[derive(Parser, Debug)]
#[command(name = "virt-launcher", version)]
pub struct Args {
    /// VMI JSON file.
    #[arg(long, env = "VIRT_LAUNCHER_VMI")]
    vmi: PathBuf,
    /// Unix socket for the guest's serial console (bound by QEMU).
    #[arg(long, env = "VIRT_LAUNCHER_CONSOLE_SOCKET")]
    console_socket: PathBuf,
    /// File QEMU also writes the serial console to, for the pod's `guest-console-log`
    /// container (`virt-tail`).
    #[arg(long, env = "VIRT_LAUNCHER_CONSOLE_LOG")]
    console_log: Option<PathBuf>,
    /// Unix socket for VNC; no graphics device when unset.
    #[arg(long, env = "VIRT_LAUNCHER_VNC_SOCKET")]
    vnc_socket: Option<PathBuf>,
    /// Map a container image reference to a local directory: IMAGE=DIR (repeatable).
    #[arg(long = "image-dir", value_name = "IMAGE=DIR")]
    image_dirs: Vec<String>,
    /// The pod copies the images into their `--image-dir` directories while the launcher
    /// starts: wait for each copier's DIR.done (or DIR.failed) first.
    #[arg(long)]
    await_image_copies: bool,
    /// Where a persistentVolumeClaim volume is mounted: VOLUME=PATH, a directory
    /// (Filesystem mode, disk.img inside) or a block device (repeatable).
    #[arg(long = "claim", value_name = "VOLUME=PATH")]
    claims: Vec<String>,
    /// Size of the disk.img to create in a Filesystem-mode claim that has none:
    /// VOLUME=BYTES (repeatable).
    #[arg(long = "claim-disk-size", value_name = "VOLUME=BYTES")]
    claim_disk_sizes: Vec<String>,
    /// Use this libvirt instead of starting a private daemon.
    #[arg(long, env = "VIRT_LAUNCHER_LIBVIRT_URI")]
    libvirt_uri: Option<String>,
    /// QEMU capabilities cache shared by the private daemons.
    #[arg(
        long,
        env = "VIRT_LAUNCHER_LIBVIRT_CACHE",
        default_value = "/var/cache/kubevirt-rs/libvirt"
    )]
    libvirt_cache: PathBuf,
    /// Accelerator.
    #[arg(long, value_enum, default_value = "auto", env = "VIRT_LAUNCHER_ACCEL")]
    accel: Accel,
    /// Refuse to fall back to TCG when KVM does not work.
    #[arg(long)]
    no_emulation: bool,
    /// How VMI interfaces are realised.
    #[arg(
        long,
        value_enum,
        default_value = "user",
        env = "VIRT_LAUNCHER_NETWORK"
    )]
    network: Network,
    /// Serve the handler command protocol on this unix socket.
    #[arg(long, env = "VIRT_LAUNCHER_CMD_SOCKET")]
    cmd_socket: Option<PathBuf>,
    /// Parent of the per-VMI work directory.
    #[arg(long, env = "VIRT_LAUNCHER_WORK_DIR")]
    work_dir: Option<PathBuf>,
    /// Seconds a KVM test boot may take before KVM counts as broken.
    #[arg(long, default_value_t = 3)]
    kvm_probe_timeout: u64,
    /// Live-migration target: start the private libvirtd and wait for the guest to
    /// arrive instead of booting it (the migration controller's target pod).
    #[arg(long)]
    migration_target: bool,
    /// Directory of cloud-init data from Secrets (virt-controller mounts them there).
    #[arg(long, env = "VIRT_LAUNCHER_CLOUD_INIT_DIR")]
    cloud_init_dir: Option<PathBuf>,
    /// Directory of the access credentials' Secrets, each in `<secret>-access-cred`
    /// (virt-controller mounts them there; kubelet updates them when a Secret changes).
    #[arg(long, env = "VIRT_LAUNCHER_ACCESS_CREDENTIALS_DIR")]
    access_credentials_dir: Option<PathBuf>,
}

impl Args {
    pub fn into_config(self) -> anyhow::Result<Config> {
        let mut cfg = Config::new(self.vmi, self.console_socket);
        let mut images = BTreeMap::new();
        for m in &self.image_dirs {
            let Some((image, dir)) = m.split_once('=') else {
                bail!("--image-dir {m:?}: expected IMAGE=DIR");
            };
            let dir = PathBuf::from(dir);
            // Still being copied: looked at once the copier is done.
            let dir = if self.await_image_copies {
                std::path::absolute(&dir).with_context(|| dir.display().to_string())?
            } else if !dir.is_dir() {
                bail!("--image-dir {m:?}: {} is not a directory", dir.display());
            } else {
                dir.canonicalize()
                    .with_context(|| dir.display().to_string())?
            };
            images.insert(image.to_string(), dir);
        }
        cfg.images = ImageDirs(images);
        cfg.await_image_copies = self.await_image_copies;
        cfg.claims = virt_launcher::claims::Claims::from_args(&self.claims, &self.claim_disk_sizes)
            .map_err(anyhow::Error::msg)?;
        cfg.vnc_socket = self.vnc_socket;
        cfg.console_log = self.console_log;
        cfg.libvirt_uri = self.libvirt_uri;
        cfg.libvirt_cache = self.libvirt_cache;
        cfg.accel = match self.accel {
            Accel::Auto => AccelChoice::Auto,
            Accel::Kvm => AccelChoice::Kvm,
            Accel::Tcg => AccelChoice::Tcg,
        };
        cfg.allow_emulation = !self.no_emulation;
        cfg.network = match self.network {
            Network::User => NetworkMode::User,
            Network::None => NetworkMode::None,
            Network::Pod => NetworkMode::Pod,
        };
        cfg.cmd_socket = self.cmd_socket;
        if let Some(w) = self.work_dir {
            cfg.work_parent = w;
        }
        cfg.kvm_probe_timeout = Duration::from_secs(self.kvm_probe_timeout);
        cfg.migration_target = self.migration_target;
        cfg.cloud_init_dir = self.cloud_init_dir;
        cfg.access_credentials_dir = self.access_credentials_dir;
        Ok(cfg)
    }
}
