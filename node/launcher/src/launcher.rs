//! The launcher's lifecycle: load → prepare → probe → convert → define/start → watch →
//! shut down → clean up. Host facts are gathered first, then the pure conversion runs,
//! then the side effects happen on the libvirt thread.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kubevirt_api::defaults::{DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS, default_vmi};
use kubevirt_api::validation::validate_vmi;
use kubevirt_api::vmi::StartStrategy;
use kubevirt_api::{VirtualMachineInstance, cloudinit};
use tokio_util::sync::CancellationToken;
use virt_domain::protocol::{
    DomainState, LauncherStatus, MIGRATION_DIR, MIGRATION_NS_DIR, MigrationStream, MigrationTarget,
};
use virt_domain::{Accel, ConvertError, HostFacts, NetworkMode, XmlError, domain_for, domain_name};

use crate::actor::{DomainHandle, LibvirtError, MigrateJob, Target};
use crate::daemon::Mode;
use crate::probe::{self, AccelChoice};
use crate::volumes::{self, ImageDirs, VolumeError};

/// Validated launcher configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// VMI JSON file.
    pub vmi: PathBuf,
    /// Unix socket QEMU binds for the serial console.
    pub console_socket: PathBuf,
    /// File QEMU also writes the serial console to (`guest-console-log`, see
    /// [`crate::console_log`]).
    pub console_log: Option<PathBuf>,
    /// Unix socket QEMU binds for VNC.
    pub vnc_socket: Option<PathBuf>,
    /// Image reference → directory.
    pub images: ImageDirs,
    /// The pod's image copiers fill [`Config::images`] while the launcher starts: wait
    /// for their results before opening them ([`crate::lifeline`]).
    pub await_image_copies: bool,
    /// Where the pod mounts the VMI's claims (`--claim`).
    pub claims: crate::claims::Claims,
    /// Existing libvirt to use instead of a private daemon.
    pub libvirt_uri: Option<String>,
    /// QEMU capabilities cache shared by private daemons.
    pub libvirt_cache: PathBuf,
    /// KVM, TCG or probe.
    pub accel: AccelChoice,
    /// Fall back to TCG when KVM does not work (KubeVirt's useEmulation).
    pub allow_emulation: bool,
    /// How interfaces are realised.
    pub network: NetworkMode,
    /// With [`NetworkMode::Pod`], how long to wait for virt-handler's set-up.
    pub network_wait: Duration,
    /// handler↔launcher command socket.
    pub cmd_socket: Option<PathBuf>,
    /// Where the per-VMI work directory is created.
    pub work_parent: PathBuf,
    /// How long a KVM boot may take before KVM counts as broken.
    pub kvm_probe_timeout: Duration,
    /// Per-boot cache of the KVM probe.
    pub kvm_probe_cache: Option<PathBuf>,
    /// Wait for the guest to arrive by live migration instead of booting it.
    pub migration_target: bool,
    /// Where the pod mounts cloud-init data from Secrets.
    pub cloud_init_dir: Option<PathBuf>,
    /// Where the pod mounts the Secrets of the VMI's access credentials
    /// (`<secret>-access-cred` below it, KubeVirt's layout).
    pub access_credentials_dir: Option<PathBuf>,
}

impl Config {
    /// Defaults for everything but the VMI and console socket.
    pub fn new(vmi: PathBuf, console_socket: PathBuf) -> Self {
        Self {
            vmi,
            console_socket,
            console_log: None,
            vnc_socket: None,
            images: ImageDirs::default(),
            await_image_copies: false,
            claims: crate::claims::Claims::default(),
            libvirt_uri: None,
            libvirt_cache: PathBuf::from("/var/cache/kubevirt-rs/libvirt"),
            accel: AccelChoice::Auto,
            allow_emulation: true,
            network: NetworkMode::User,
            network_wait: crate::network::WAIT,
            cmd_socket: None,
            work_parent: std::env::temp_dir(),
            kvm_probe_timeout: Duration::from_secs(3),
            kvm_probe_cache: Some(PathBuf::from(probe::CACHE_FILE)),
            migration_target: false,
            cloud_init_dir: None,
            access_credentials_dir: None,
        }
    }
}

/// Why the launcher could not run its VMI.
#[derive(Debug, thiserror::Error)]
pub enum LauncherError {
    /// The VMI file cannot be read.
    #[error("reading VMI {path}: {source}")]
    ReadVmi {
        /// File.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The VMI file is not a VMI.
    #[error("parsing VMI {path}: {message}")]
    ParseVmi {
        /// File.
        path: PathBuf,
        /// Details.
        message: String,
    },
    /// The VMI fails validation.
    #[error("invalid VMI: {0}")]
    InvalidVmi(String),
    /// A volume cannot be prepared.
    #[error(transparent)]
    Volume(#[from] VolumeError),
    /// An image copy failed (or the wait for it was stopped).
    #[error(transparent)]
    ImageCopy(#[from] crate::lifeline::LifelineError),
    /// The VMI cannot be converted.
    #[error("converting VMI to a libvirt domain: {0}")]
    Convert(#[from] ConvertError),
    /// Domain XML failed.
    #[error(transparent)]
    Xml(#[from] XmlError),
    /// No usable accelerator.
    #[error("{0}")]
    Accel(String),
    /// The pod network is not there.
    #[error(transparent)]
    Network(#[from] crate::network::NetworkError),
    /// libvirt failed.
    #[error(transparent)]
    Libvirt(#[from] LibvirtError),
    /// Work directory trouble.
    #[error("{path}: {source}")]
    Io {
        /// Path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// A blocking task panicked or was cancelled.
    #[error("internal task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
}

/// How the VM ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The guest powered off (by itself or after the ACPI button).
    ShutDown,
    /// The grace period ran out and the domain was destroyed.
    ForcedStop,
    /// The guest moved to a migration target.
    Migrated,
    /// The guest or QEMU crashed.
    Crashed(String),
}

/// Loads, defaults and validates a VMI file; with `cloud_init`, first puts back the
/// cloud-init data that reached the pod through Secrets (`kubevirt_api::cloudinit`).
pub fn load_vmi(
    path: &Path,
    cloud_init: Option<&Path>,
) -> Result<VirtualMachineInstance, LauncherError> {
    let text = std::fs::read_to_string(path).map_err(|source| LauncherError::ReadVmi {
        path: path.into(),
        source,
    })?;
    let mut vmi: VirtualMachineInstance =
        serde_json::from_str(&text).map_err(|e| LauncherError::ParseVmi {
            path: path.into(),
            message: e.to_string(),
        })?;
    if let Some(dir) = cloud_init {
        let inline = dir.join(cloudinit::INLINE_DIR);
        cloudinit::restore_inline(&mut vmi.spec, |key| {
            std::fs::read_to_string(inline.join(key)).ok()
        });
        cloudinit::restore_refs(&mut vmi.spec, |sub, key| {
            std::fs::read_to_string(dir.join(sub).join(key)).ok()
        })
        .map_err(LauncherError::InvalidVmi)?;
    }
    default_vmi(&mut vmi);
    let errs = validate_vmi(&vmi);
    if !errs.is_empty() {
        let msg: Vec<String> = errs
            .iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect();
        return Err(LauncherError::InvalidVmi(msg.join("; ")));
    }
    Ok(vmi)
}

/// Everything the launcher knows about its running VM, for status reports.
#[derive(Clone, Debug)]
pub struct Running {
    /// Libvirt handle.
    pub handle: DomainHandle,
    /// Static part of the status.
    pub status: LauncherStatus,
    /// This launcher's own paths, which a migration source puts into the XML it sends.
    pub paths: MigrationTarget,
    /// Started with `--migration-target`: waits for the guest instead of booting it.
    pub migration_target: bool,
    /// What a migration copies and what it leaves to shared storage ([`migration_disks`]).
    pub migration_disks: MigrationDisks,
    /// The migration directory as libvirt and QEMU see it, and the daemon's mode (the
    /// target runs the same image, so the same mode).
    pub migration_ns: (String, Mode),
}

impl Running {
    /// Status with the current state.
    pub fn status(&self) -> LauncherStatus {
        let mut s = self.status.clone();
        let o = self.handle.state().borrow().clone();
        s.state = o.state;
        s.guest_agent_connected = o.agent_connected;
        let guest = self.handle.guest().state();
        s.guest_agent = guest.status.filter(|_| o.agent_connected).map(Box::new);
        s.access_credentials = guest.credentials;
        s.hotplugged = self.handle.hotplugged();
        s
    }

    /// The libvirt job of a migration to `target` (source side). Every URI names the
    /// migration directory as the daemon sees it (the same path in every launcher): there,
    /// our host directory holds the handler's proxy sockets, which lead to the target's.
    pub fn migrate_job(
        &self,
        target: &MigrationTarget,
        options: &virt_domain::protocol::MigrationOptions,
    ) -> MigrateJob {
        let (ns_dir, mode) = &self.migration_ns;
        let sock = |m: MigrationStream| format!("{ns_dir}/{}", m.socket_name());
        let mut rewrite = vec![
            (self.paths.work_dir.clone(), target.work_dir.clone()),
            (
                self.paths.console_socket.clone(),
                target.console_socket.clone(),
            ),
        ];
        if let (Some(a), Some(b)) = (&self.paths.vnc_socket, &target.vnc_socket) {
            rewrite.push((a.clone(), b.clone()));
        }
        MigrateJob {
            dest_uri: format!(
                "qemu+unix:///{}?socket={}",
                mode.uri_path(),
                sock(MigrationStream::Libvirt)
            ),
            uri: format!("unix://{}", sock(MigrationStream::Memory)),
            disks_uri: format!("unix://{}", sock(MigrationStream::Disks)),
            rewrite,
            disks: self.migration_disks.copying(&options.copy_claims),
            bandwidth_mib: options.bandwidth_mib,
            max_downtime_ms: options.max_downtime_ms,
        }
    }
}

/// How a live migration treats the writable disks (their target names).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MigrationDisks {
    /// Copied to the target over NBD: every writable disk but the claims.
    pub copy: Vec<String>,
    /// Claims: shared storage the target mounts too, never copied, unless the migration
    /// names the claim's volume ([`MigrationDisks::copying`]). A shared claim is
    /// ReadWriteMany (`kubevirt_api::live_migratable`): copying it onto itself would
    /// corrupt it.
    pub shared: Vec<String>,
    /// The claim volume of each disk in `shared`, by target name.
    pub claim_volumes: std::collections::BTreeMap<String, String>,
}

impl MigrationDisks {
    /// The plan of a migration that copies the claims of `volumes` to the target's own
    /// claims (not shared: virt-controller made a new claim on the target node, which the
    /// target pod mounts where this pod mounts the old one).
    pub fn copying(&self, volumes: &[String]) -> MigrationDisks {
        let mut out = self.clone();
        let (copied, shared): (Vec<String>, Vec<String>) =
            self.shared.iter().cloned().partition(|dev| {
                self.claim_volumes
                    .get(dev)
                    .is_some_and(|v| volumes.contains(v))
            });
        out.copy.extend(copied);
        out.shared = shared;
        out
    }
}

/// Sorts the domain's writable disks for a migration. Read-only and shareable disks are
/// neither (libvirt never copies them).
pub fn migration_disks(
    domain: &virt_domain::schema::Domain,
    claims: &crate::claims::Claims,
) -> MigrationDisks {
    let mut out = MigrationDisks::default();
    for d in domain
        .devices
        .disk
        .iter()
        .filter(|d| d.readonly.is_none() && d.shareable.is_none())
    {
        let source = d.source.file.as_deref().or(d.source.dev.as_deref());
        let claim = source.and_then(|s| {
            claims
                .0
                .iter()
                .find(|(_, c)| Path::new(s).starts_with(&c.path))
                .map(|(volume, _)| volume.clone())
        });
        if let Some(volume) = claim {
            out.shared.push(d.target.dev.clone());
            out.claim_volumes.insert(d.target.dev.clone(), volume);
        } else {
            out.copy.push(d.target.dev.clone());
        }
    }
    out
}

/// An `efi` VM's UEFI variable store, in the work directory.
const NVRAM_FILE: &str = "efi-vars.fd";

/// The host directory of the migration sockets: next to the command socket (the
/// directory virt-handler shares with the pod), else in the work directory.
pub fn migration_dir(cfg: &Config, work_dir: &Path) -> PathBuf {
    cfg.cmd_socket
        .as_deref()
        .and_then(Path::parent)
        .map(|p| {
            if p.as_os_str().is_empty() {
                Path::new(".")
            } else {
                p
            }
        })
        .unwrap_or(work_dir)
        .join(MIGRATION_DIR)
}

/// How long the launcher waits for its socket directory to become its own.
const SOCKET_DIR_WAIT: Duration = Duration::from_secs(60);

/// Waits until this process may create files in `dir`. In a pod the directory is created
/// by kubelet, owned by root, and virt-handler hands it to the launcher user within a
/// moment (the launcher has no capability to take it).
async fn wait_writable(
    dir: &Path,
    timeout: Duration,
    shutdown: &CancellationToken,
) -> Result<(), LauncherError> {
    use nix::unistd::{AccessFlags, access};
    let start = Instant::now();
    loop {
        match access(dir, AccessFlags::W_OK | AccessFlags::X_OK) {
            Ok(()) => return Ok(()),
            // Not there yet: the launcher creates it (no handler involved).
            Err(nix::errno::Errno::ENOENT) => return Ok(()),
            Err(e) if start.elapsed() >= timeout || shutdown.is_cancelled() => {
                return Err(LauncherError::Io {
                    path: dir.into(),
                    source: std::io::Error::other(format!(
                        "not writable by uid {} after {timeout:?} ({e}): virt-handler gives \
                         each launcher its socket directory; is it running on this node?",
                        nix::unistd::geteuid()
                    )),
                });
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// The shared QEMU capabilities cache if this process can write to it, else one in the
/// work directory (libvirt then probes QEMU again, which costs seconds but works).
fn usable_cache(shared: &Path, work_dir: &Path) -> PathBuf {
    use nix::unistd::{AccessFlags, access};
    if std::fs::create_dir_all(shared).is_ok()
        && access(shared, AccessFlags::W_OK | AccessFlags::X_OK).is_ok()
    {
        return shared.to_path_buf();
    }
    tracing::warn!(
        cache = %shared.display(),
        "the shared QEMU capabilities cache is not writable; probing QEMU for this VM alone"
    );
    work_dir.join("qemu-cache")
}

/// Argument of `virt-launcher probe-capabilities DIR`: virt-handler's init container
/// fills its node's QEMU capabilities cache with it (docs/node.md, "QEMU capabilities").
pub const PROBE_CAPABILITIES_ARG: &str = "probe-capabilities";

/// Fills `cache/tcg` with the QEMU capabilities a launcher's private daemon probes (about
/// ten seconds under TCG): one unprivileged daemon, started and stopped. virt-handler
/// copies the result into each launcher pod's own cache before the launcher starts its
/// daemon, so no launcher probes, and no launcher's cache is another's.
pub async fn probe_capabilities(cache: &Path) -> Result<(), LauncherError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| LauncherError::Io { path, source }
    };
    let tcg = cache.join("tcg");
    std::fs::create_dir_all(&tcg).map_err(io(&tcg))?;
    let work = tempfile::Builder::new()
        .prefix("probe-")
        .tempdir()
        .map_err(io(Path::new("/tmp")))?;
    let t0 = Instant::now();
    // Connecting asks the daemon for the hypervisor version, which loads (probing and
    // caching) the default emulator's capabilities.
    let handle = DomainHandle::spawn(Target::Private {
        dir: work.path().join("libvirt"),
        cache: tcg.clone(),
        hide_kvm: true,
        migration_dir: work.path().join("migration"),
    })
    .await?;
    let versions = handle.versions().clone();
    handle.close().await?;
    tracing::info!(
        cache = %tcg.display(),
        libvirt = %versions.libvirt,
        qemu = %versions.qemu,
        took_ms = t0.elapsed().as_millis() as u64,
        "QEMU capabilities probed"
    );
    Ok(())
}

/// This pod's IP: `POD_IP` (downward API `status.podIP`) when set, else the first IPv4
/// address of an interface that is up and not loopback (a pod's `eth0`; pod networks need
/// not have a default route, so asking the routing table is not enough), else a global
/// IPv6 address. `None` in a network namespace with only loopback.
fn pod_ip() -> Option<String> {
    if let Ok(ip) = std::env::var("POD_IP")
        && ip.parse::<std::net::IpAddr>().is_ok()
    {
        return Some(ip);
    }
    use nix::net::if_::InterfaceFlags;
    let addrs: Vec<std::net::IpAddr> = nix::ifaddrs::getifaddrs()
        .ok()?
        .filter(|a| {
            a.flags.contains(InterfaceFlags::IFF_UP)
                && !a.flags.contains(InterfaceFlags::IFF_LOOPBACK)
        })
        .filter_map(|a| {
            let sa = a.address?;
            if let Some(v4) = sa.as_sockaddr_in() {
                Some(std::net::IpAddr::V4(v4.ip()))
            } else {
                sa.as_sockaddr_in6().map(|v6| std::net::IpAddr::V6(v6.ip()))
            }
        })
        .collect();
    let v4 = addrs.iter().find(|ip| ip.is_ipv4());
    // Link-local IPv6 (fe80::/10) is not an address anyone else can reach.
    let v6 = addrs
        .iter()
        .find(|ip| matches!(ip, std::net::IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) != 0xfe80));
    v4.or(v6).map(ToString::to_string)
}

/// Runs the VMI until it stops or `shutdown` fires, then cleans up. `on_running` is
/// called once the domain is started (used for the command socket and tests).
pub async fn run(
    cfg: Config,
    shutdown: CancellationToken,
    on_running: impl FnOnce(Running),
) -> Result<Outcome, LauncherError> {
    let t0 = Instant::now();
    let vmi = load_vmi(&cfg.vmi, cfg.cloud_init_dir.as_deref())?;
    let name = domain_name(&vmi);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| LauncherError::Io { path, source }
    };
    if let Some(dir) = cfg.cmd_socket.as_deref().and_then(Path::parent) {
        wait_writable(dir, SOCKET_DIR_WAIT, &shutdown).await?;
    }
    std::fs::create_dir_all(&cfg.work_parent).map_err(io(&cfg.work_parent))?;
    let work = tempfile::Builder::new()
        .prefix("virt-launcher-")
        .tempdir_in(&cfg.work_parent)
        .map_err(io(&cfg.work_parent))?;
    let work_dir = work.path().to_path_buf();

    // virt-handler builds the network while the volumes are prepared and the accelerator
    // probed.
    let network = (cfg.network == NetworkMode::Pod
        && virt_netsetup::plan::pod_interface(&vmi.spec).is_some())
    .then(|| {
        let (sock, wait, stop) = (cfg.cmd_socket.clone(), cfg.network_wait, shutdown.clone());
        tokio::spawn(async move { crate::network::receive(sock.as_deref(), wait, &stop).await })
    });

    if cfg.await_image_copies {
        crate::lifeline::await_copies(&cfg.images, &shutdown).await?;
    }
    let prepared = {
        let (vmi, images, claims, dir, creds) = (
            vmi.clone(),
            cfg.images.clone(),
            cfg.claims.clone(),
            work_dir.clone(),
            cfg.access_credentials_dir.clone(),
        );
        tokio::task::spawn_blocking(move || {
            let keys = volumes::BootKeys::read(&vmi, creds.as_deref());
            volumes::prepare(&vmi, &images, &claims, &dir, &keys)
        })
        .await??
    };
    tracing::info!(
        elapsed_ms = t0.elapsed().as_millis() as u64,
        "volumes prepared"
    );

    let (accel, why) = {
        let kernel = prepared.kernel_boot.as_ref().and_then(|k| k.kernel.clone());
        let (choice, allow, timeout, cache) = (
            cfg.accel,
            cfg.allow_emulation,
            cfg.kvm_probe_timeout,
            cfg.kvm_probe_cache.clone(),
        );
        tokio::task::spawn_blocking(move || {
            probe::choose(choice, allow, || {
                probe::probe_kvm(kernel.as_deref(), timeout, cache.as_deref())
            })
        })
        .await?
        .map_err(LauncherError::Accel)?
    };
    tracing::info!(?accel, reason = %why, "accelerator chosen");

    let pod_tap = match network {
        Some(task) => Some(
            task.await
                .map_err(|e| crate::network::NetworkError::Task(e.to_string()))??
                .1,
        ),
        None => None,
    };
    let host = HostFacts {
        volumes: prepared.volumes,
        kernel_boot: prepared.kernel_boot,
        console_socket: Some(
            std::path::absolute(&cfg.console_socket).map_err(io(&cfg.console_socket))?,
        ),
        console_log: cfg
            .console_log
            .as_deref()
            .map(std::path::absolute)
            .transpose()
            .map_err(io(&work_dir))?,
        vnc_socket: cfg
            .vnc_socket
            .as_deref()
            .map(std::path::absolute)
            .transpose()
            .map_err(io(&work_dir))?,
        network: cfg.network,
        pod_tap,
        // In the work directory rather than libvirt's (session mode: a random directory
        // of this launcher's): the migration's path rewrite then names the target's.
        nvram: Some(std::path::absolute(work_dir.join(NVRAM_FILE)).map_err(io(&work_dir))?),
        ..HostFacts::x86_64(accel)
    };
    let domain = domain_for(&vmi, &host)?;
    let migration_disks = migration_disks(&domain, &cfg.claims);
    let xml = domain.to_xml()?;
    std::fs::write(work_dir.join("domain.xml"), &xml).map_err(io(&work_dir))?;
    for s in [Some(&cfg.console_socket), cfg.vnc_socket.as_ref()]
        .into_iter()
        .flatten()
    {
        remove_stale_socket(s);
    }

    let mig_dir = std::path::absolute(migration_dir(&cfg, &work_dir)).map_err(io(&work_dir))?;
    let cache = usable_cache(&cfg.libvirt_cache, &work_dir).join(match accel {
        Accel::Kvm => "kvm",
        Accel::Tcg => "tcg",
    });
    let target = match &cfg.libvirt_uri {
        Some(_) if cfg.migration_target => {
            return Err(LauncherError::Accel(
                "--migration-target needs the private libvirtd (no --libvirt-uri)".into(),
            ));
        }
        Some(uri) => Target::Uri(uri.clone()),
        None => Target::Private {
            dir: work_dir.join("libvirt"),
            cache,
            hide_kvm: accel == Accel::Tcg,
            migration_dir: mig_dir.clone(),
        },
    };
    let handle = DomainHandle::spawn(target).await?;
    tracing::info!(
        elapsed_ms = t0.elapsed().as_millis() as u64,
        "libvirt daemon ready"
    );
    // The guest agent's poller idles until the domain runs and its agent connects.
    crate::agent::spawn_poller(
        handle.guest().clone(),
        handle.state(),
        crate::agent::CredentialSource {
            credentials: vmi.spec.access_credentials.clone().unwrap_or_default(),
            dir: cfg.access_credentials_dir.clone(),
        },
    )
    .map_err(io(&work_dir))?;
    let paths = MigrationTarget {
        work_dir: std::path::absolute(&work_dir)
            .map_err(io(&work_dir))?
            .display()
            .to_string(),
        console_socket: host
            .console_socket
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        vnc_socket: host.vnc_socket.as_ref().map(|p| p.display().to_string()),
    };
    // Target: the source's daemon reaches ours through `libvirt.sock` in the migration
    // directory (via the handlers' proxy); QEMU's streams listen there by themselves.
    let relay_stop = CancellationToken::new();
    if cfg.migration_target {
        let from = mig_dir.join(MigrationStream::Libvirt.socket_name());
        let to = work_dir.join("libvirt/sock/libvirt-sock");
        let listener = crate::relay::bind(&from).map_err(io(&from))?;
        tokio::spawn(crate::relay::serve(listener, from, to, relay_stop.clone()));
    }
    let grace = Duration::from_secs(
        vmi.spec
            .termination_grace_period_seconds
            .unwrap_or(DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS)
            .max(0) as u64,
    );
    let status = LauncherStatus {
        domain: name.clone(),
        state: DomainState::Pending,
        accel,
        launcher_version: env!("CARGO_PKG_VERSION").into(),
        libvirt_version: Some(handle.versions().libvirt.clone()),
        qemu_version: Some(handle.versions().qemu.clone()),
        qemu_pid: None,
        pod_ip: pod_ip(),
        guest_agent_connected: false,
        guest_agent: None,
        access_credentials: None,
        hotplugged: Vec::new(),
    };
    let running = Running {
        handle: handle.clone(),
        status,
        paths,
        migration_target: cfg.migration_target,
        migration_disks,
        migration_ns: match Mode::for_current_user() {
            Mode::Root => (MIGRATION_NS_DIR.to_string(), Mode::Root),
            Mode::Session => (mig_dir.display().to_string(), Mode::Session),
        },
    };
    let result = if cfg.migration_target {
        incoming(&handle, name.clone(), grace, &shutdown, || {
            tracing::info!(domain = %name, elapsed_ms = t0.elapsed().as_millis() as u64, "waiting for the incoming migration");
            on_running(running);
        })
        .await
    } else {
        let start_paused = vmi.spec.start_strategy == Some(StartStrategy::Paused);
        drive(&handle, xml, start_paused, grace, &shutdown, || {
            tracing::info!(domain = %name, elapsed_ms = t0.elapsed().as_millis() as u64, "domain started");
            on_running(running);
        })
        .await
    };
    relay_stop.cancel();
    if let Err(e) = handle.close().await {
        tracing::warn!(error = %e, "closing libvirt");
    }
    if matches!(result, Ok(Outcome::Migrated)) {
        // cluster-flow.md §6.5: a source pod that ended before virt-controller hands the
        // VMI to the target would end the VMI. The daemon is gone already; the command
        // socket keeps answering (state `migrated`) until the pod is deleted.
        tracing::info!("guest migrated away; waiting for the pod's deletion");
        shutdown.cancelled().await;
    }
    for s in [Some(&cfg.console_socket), cfg.vnc_socket.as_ref()]
        .into_iter()
        .flatten()
    {
        let _ = std::fs::remove_file(s);
    }
    // The handler's proxy sockets in it are gone with the migration.
    let _ = std::fs::remove_dir_all(&mig_dir);
    drop(work);
    result
}

fn remove_stale_socket(path: &Path) {
    use std::os::unix::fs::FileTypeExt;
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = std::fs::remove_file(path);
    }
}

async fn drive(
    handle: &DomainHandle,
    xml: String,
    start_paused: bool,
    grace: Duration,
    shutdown: &CancellationToken,
    started: impl FnOnce(),
) -> Result<Outcome, LauncherError> {
    handle.define(xml).await?;
    tracing::info!("domain defined");
    let state = handle.state();
    handle.start().await?;
    // spec.startStrategy: Paused — the guest waits for an unpause (start --paused).
    if start_paused {
        handle.pause().await?;
    }
    started();
    watch_until_end(handle, state, grace, shutdown).await
}

async fn watch_until_end(
    handle: &DomainHandle,
    mut state: tokio::sync::watch::Receiver<crate::actor::Observed>,
    grace: Duration,
    shutdown: &CancellationToken,
) -> Result<Outcome, LauncherError> {
    if let Some(end) = ended(&state.borrow_and_update()) {
        return Ok(end);
    }
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            changed = state.changed() => {
                if changed.is_err() {
                    return Ok(Outcome::Crashed("libvirt thread ended".into()));
                }
                if let Some(end) = ended(&state.borrow()) {
                    return Ok(end);
                }
            }
        }
    }
    tracing::info!(
        grace_s = grace.as_secs(),
        "shutting down: ACPI power button"
    );
    if let Err(e) = handle.shutdown().await {
        tracing::warn!(error = %e, "ACPI shutdown failed");
    }
    let waited = tokio::time::timeout(grace, async {
        loop {
            if let Some(end) = ended(&state.borrow_and_update()) {
                return end;
            }
            if state.changed().await.is_err() {
                return Outcome::Crashed("libvirt thread ended".into());
            }
        }
    })
    .await;
    match waited {
        Ok(end) => Ok(end),
        Err(_) => {
            tracing::warn!("grace period over; destroying the domain");
            handle.destroy().await?;
            Ok(Outcome::ForcedStop)
        }
    }
}

/// Migration target: the cmd socket serves at once (`prepareMigrationTarget`), the
/// guest arrives by migration, then it is driven like a booted one. A shutdown before it
/// arrives just ends the launcher.
async fn incoming(
    handle: &DomainHandle,
    name: String,
    grace: Duration,
    shutdown: &CancellationToken,
    serving: impl FnOnce(),
) -> Result<Outcome, LauncherError> {
    let mut state = handle.state();
    handle.await_incoming(name).await?;
    serving();
    loop {
        if state.borrow_and_update().state != DomainState::Pending {
            break;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(Outcome::ShutDown),
            changed = state.changed() => {
                if changed.is_err() {
                    return Ok(Outcome::Crashed("libvirt thread ended".into()));
                }
            }
        }
    }
    tracing::info!("the migrated guest runs here");
    watch_until_end(handle, state, grace, shutdown).await
}

fn ended(o: &crate::actor::Observed) -> Option<Outcome> {
    match o.state {
        DomainState::Migrated => Some(Outcome::Migrated),
        DomainState::Shutoff => Some(Outcome::ShutDown),
        DomainState::Crashed => Some(Outcome::Crashed(
            o.reason.clone().unwrap_or_else(|| "crashed".into()),
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::FakeBackend;

    #[test]
    fn a_migration_copies_local_disks_but_never_a_claim() {
        let xml = r#"<domain type="qemu"><name>d</name><memory unit="KiB">1024</memory><vcpu>1</vcpu><os><type arch="x86_64" machine="q35">hvm</type></os>
          <devices>
            <disk type="file" device="disk"><driver name="qemu" type="qcow2"/>
              <source file="/work/root.qcow2"/><target dev="vda" bus="virtio"/></disk>
            <disk type="file" device="disk"><driver name="qemu" type="raw"/>
              <source file="/var/run/kubevirt-private/vmi-disks/data/disk.img"/>
              <target dev="vdb" bus="virtio"/></disk>
            <disk type="block" device="disk"><driver name="qemu" type="raw"/>
              <source dev="/dev/vmi-disks/raw"/><target dev="vdc" bus="virtio"/></disk>
            <disk type="file" device="cdrom"><driver name="qemu" type="raw"/>
              <source file="/work/ci.iso"/><target dev="sda" bus="sata"/><readonly/></disk>
          </devices></domain>"#;
        let domain = virt_domain::schema::Domain::from_xml(xml).expect("domain XML");
        let claims = crate::claims::Claims::from_args(
            &[
                "data=/var/run/kubevirt-private/vmi-disks/data".into(),
                "raw=/dev/vmi-disks/raw".into(),
            ],
            &[],
        )
        .expect("claims");
        let plan = migration_disks(&domain, &claims);
        assert_eq!(plan.copy, ["vda"]);
        assert_eq!(plan.shared, ["vdb", "vdc"]);
        // A migration that copies claim `data` (ReadWriteOnce) to the target's claim.
        let copying = plan.copying(&["data".into()]);
        assert_eq!(copying.copy, ["vda", "vdb"]);
        assert_eq!(copying.shared, ["vdc"]);
        assert_eq!(plan.copying(&[]), plan);
        let plan = migration_disks(&domain, &crate::claims::Claims::default());
        assert_eq!(plan.copy, ["vda", "vdb", "vdc"]);
        assert!(plan.shared.is_empty());
    }

    async fn fake(f: &FakeBackend) -> DomainHandle {
        let b = f.clone();
        DomainHandle::spawn_with(move |_| Ok(Box::new(b) as Box<dyn crate::actor::Backend>))
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn shutdown_presses_the_power_button_and_waits() {
        let f = FakeBackend::default();
        let h = fake(&f).await;
        let token = CancellationToken::new();
        token.cancel();
        let out = drive(
            &h,
            "<domain/>".into(),
            false,
            Duration::from_secs(5),
            &token,
            || {},
        )
        .await
        .unwrap();
        assert_eq!(out, Outcome::ShutDown);
        assert_eq!(f.calls(), ["define", "start", "shutdown"]);
        h.close().await.unwrap();
        assert_eq!(f.calls().last(), Some(&"cleanup"));
    }

    #[tokio::test]
    async fn a_guest_ignoring_acpi_is_destroyed_after_the_grace_period() {
        let f = FakeBackend::default();
        f.0.lock().unwrap().ignore_acpi = true;
        let h = fake(&f).await;
        let token = CancellationToken::new();
        token.cancel();
        let t = Instant::now();
        let out = drive(
            &h,
            "<domain/>".into(),
            false,
            Duration::from_millis(300),
            &token,
            || {},
        )
        .await
        .unwrap();
        assert_eq!(out, Outcome::ForcedStop);
        assert!(t.elapsed() >= Duration::from_millis(300));
        assert_eq!(f.calls(), ["define", "start", "shutdown", "destroy"]);
    }

    #[tokio::test]
    async fn a_paused_start_pauses_before_the_guest_counts_as_started() {
        let f = FakeBackend::default();
        let h = fake(&f).await;
        let token = CancellationToken::new();
        token.cancel();
        let seen = f.clone();
        let out = drive(
            &h,
            "<domain/>".into(),
            true,
            Duration::from_secs(5),
            &token,
            move || assert_eq!(seen.calls(), ["define", "start", "suspend"]),
        )
        .await
        .unwrap();
        assert_eq!(out, Outcome::ShutDown);
    }

    #[tokio::test]
    async fn a_crash_ends_the_run_with_its_reason() {
        let f = FakeBackend::default();
        let h = fake(&f).await;
        let token = CancellationToken::new();
        let crash = f.clone();
        let out = drive(
            &h,
            "<domain/>".into(),
            false,
            Duration::from_secs(5),
            &token,
            move || {
                crash.0.lock().unwrap().crash = Some("qemu died".into());
            },
        )
        .await
        .unwrap();
        assert_eq!(out, Outcome::Crashed("qemu died".into()));
    }

    #[tokio::test]
    async fn dropping_every_handle_cleans_up() {
        let f = FakeBackend::default();
        drop(fake(&f).await);
        let t = Instant::now();
        while f.calls().last() != Some(&"cleanup") {
            assert!(
                t.elapsed() < Duration::from_secs(2),
                "no cleanup: {:?}",
                f.calls()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[test]
    fn invalid_vmis_are_rejected_before_anything_happens() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("vmi.json");
        std::fs::write(&p, r#"{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstance","metadata":{"name":"x"},"spec":{"domain":{"resources":{"requests":{"memory":"lots"}}}}}"#).unwrap();
        let e = load_vmi(&p, None).unwrap_err().to_string();
        assert!(e.contains("spec.domain.resources.requests.memory"), "{e}");
    }
}
