//! The libvirt thread. Every libvirt call blocks, so one OS thread owns the daemon, the
//! connection and the domain; async code talks to it through [`DomainHandle`], which
//! sends commands with a oneshot reply. The thread also polls the domain state and
//! publishes it on a `watch` channel (a poll every 100 ms is cheap and does not need
//! libvirt's event loop thread). The domain's statistics are only located here
//! ([`StatsSource`]); they are read on a thread and connection of their own
//! ([`crate::stats`]), so a QEMU that does not answer cannot stall this thread.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};
use virt_domain::schema::HotpluggedDisk;

use tokio::sync::{oneshot, watch};
use virt::connect::Connect;
use virt::domain::{
    Domain, DomainCrashedReason as Crashed, DomainPausedReason as Paused,
    DomainShutoffReason as Shutoff, DomainState as VirState, DomainStateReason as Reason,
    DomainStateReasonEnum,
};
use virt::enumutil::Enum;
use virt_domain::protocol::{
    DomainState, MigrationMode, MigrationProgress, MigrationStatus, VmiAction,
};
use virt_domain::stats::{DomainStats, MigrationJobStats};

use crate::agent::{GuestShared, LibvirtAgent};
use crate::daemon::{DaemonError, PrivateDaemon};
use crate::stats::StatsReader;

/// Errors from the libvirt thread.
#[derive(Debug, thiserror::Error)]
pub enum LibvirtError {
    /// The private daemon did not start.
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    /// A libvirt call failed.
    #[error("libvirt {op}: {message}")]
    Call {
        /// The operation.
        op: &'static str,
        /// libvirt's message.
        message: String,
    },
    /// No domain is defined yet.
    #[error("no domain defined")]
    NoDomain,
    /// The action needs the QEMU guest agent, which the guest does not run (or the domain
    /// has no channel to). KubeVirt's words; libvirt's detail goes to the log.
    #[error("VMI does not have guest agent connected")]
    NoGuestAgent,
    /// The libvirt thread is gone.
    #[error("the libvirt thread has stopped")]
    Gone,
}

pub(crate) fn call<T>(
    op: &'static str,
    r: Result<T, virt::error::Error>,
) -> Result<T, LibvirtError> {
    r.map_err(|e| LibvirtError::Call {
        op,
        message: e.message().to_string(),
    })
}

/// Which libvirt to use.
#[derive(Clone, Debug)]
pub enum Target {
    /// Start a private daemon with its files in `dir`.
    Private {
        /// Work directory of the daemon.
        dir: PathBuf,
        /// Shared QEMU capabilities cache.
        cache: PathBuf,
        /// Hide /dev/kvm from the daemon (TCG).
        hide_kvm: bool,
        /// Host directory bound on `MIGRATION_NS_DIR` inside the daemon's namespace.
        migration_dir: PathBuf,
    },
    /// Connect to an existing daemon.
    Uri(String),
}

/// Domain state plus, for crashes, why.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// State.
    pub state: DomainState,
    /// Details (crash reason).
    pub reason: Option<String>,
    /// A guest agent has its channel open (polled every [`AGENT_POLL`]).
    pub agent_connected: bool,
}

/// How often the guest agent's channel state is read while the guest runs. KubeVirt's
/// agent poller is as slow; the condition it feeds is not time-critical.
const AGENT_POLL: Duration = Duration::from_secs(2);

/// Versions and process facts.
#[derive(Clone, Debug, Default)]
pub struct Versions {
    /// libvirt library version.
    pub libvirt: String,
    /// QEMU version.
    pub qemu: String,
    /// PID of the private daemon's namespace holder.
    pub daemon_pid: Option<u32>,
}

type Reply<T> = oneshot::Sender<Result<T, LibvirtError>>;

/// One outgoing migration, as the libvirt thread runs it.
#[derive(Clone, Debug, Default)]
pub struct MigrateJob {
    /// libvirt URI of the destination daemon (peer-to-peer: the source daemon dials it).
    pub dest_uri: String,
    /// QEMU migration stream URI (`unix://…`).
    pub uri: String,
    /// NBD URI for the disk copy (`unix://…`).
    pub disks_uri: String,
    /// (source, target) path prefixes replaced in the domain XML sent to the target.
    pub rewrite: Vec<(String, String)>,
    /// The disks to copy (none: memory only) and those on shared storage
    /// (`Running::migration_disks`).
    pub disks: crate::launcher::MigrationDisks,
    /// MiB/s; unlimited when unset.
    pub bandwidth_mib: Option<u64>,
    /// Longest pause at the switchover, ms.
    pub max_downtime_ms: Option<u64>,
}

/// The result a running migration's thread sends back.
pub type MigrationResult = Result<MigrationProgress, String>;

/// One reading of the running migration job: our progress figures (the migration's
/// status) and libvirt's as the metrics export them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobReport {
    /// For [`MigrationStatus::Running`].
    pub progress: MigrationProgress,
    /// For [`DomainStats::migration`].
    pub job: MigrationJobStats,
}

enum Cmd {
    Define(String, Reply<()>),
    AwaitIncoming(String, Reply<()>),
    Migrate(Box<MigrateJob>, Reply<()>, mpsc::Sender<Cmd>),
    CancelMigration(Reply<()>),
    Start(Reply<()>),
    Shutdown(Reply<()>),
    Destroy(Reply<()>),
    Action(VmiAction, Reply<()>),
    SetVcpus(u32, Reply<()>),
    Hotplug(HotplugOp, Reply<Vec<HotpluggedDisk>>),
    Stats(Reply<StatsSource>),
    Close(Reply<()>),
    /// Only wakes the loop (see [`MigrationWaker`]).
    Wake,
}

/// Wakes the libvirt thread's loop when an outgoing migration's result is ready: the loop
/// would otherwise see it on its next round, up to 100 ms later, and that result is on the
/// path to the migration's `Succeeded`.
#[derive(Debug)]
pub struct MigrationWaker(mpsc::Sender<Cmd>);

impl MigrationWaker {
    /// Wakes the loop (nothing if it has ended).
    pub fn wake(self) {
        let _ = self.0.send(Cmd::Wake);
    }
}

/// Async handle to the libvirt thread. Dropping every handle makes the thread clean up
/// (destroy, undefine, stop the daemon) and exit.
#[derive(Clone, Debug)]
pub struct DomainHandle {
    tx: mpsc::Sender<Cmd>,
    state: watch::Receiver<Observed>,
    migration: watch::Receiver<MigrationStatus>,
    versions: Versions,
    guest: Arc<GuestShared>,
    hotplugged: Arc<std::sync::Mutex<Vec<HotpluggedDisk>>>,
    /// Reads the statistics off the libvirt thread ([`crate::stats`]).
    stats: StatsReader,
}

/// A change of the guest's hotplugged disks (see [`DomainHandle::hotplug`]).
#[derive(Clone, Debug)]
pub enum HotplugOp {
    /// Plug the volume (its image at `kubevirt_api::hotplug::launcher_image_path`) in as
    /// the disk, unless the guest has it.
    Attach {
        /// The VMI's disk.
        disk: Box<kubevirt_api::vmi::Disk>,
        /// The VMI's volume.
        volume: Box<kubevirt_api::vmi::Volume>,
    },
    /// Unplug the volume of this name, if the guest has it.
    Detach(String),
}

impl std::fmt::Debug for Cmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cmd")
    }
}

impl DomainHandle {
    /// Starts the thread, the daemon (for [`Target::Private`]) and connects.
    pub async fn spawn(target: Target) -> Result<Self, LibvirtError> {
        Self::spawn_with(move |guest| {
            LibvirtBackend::connect(target, guest).map(|b| Box::new(b) as Box<dyn Backend>)
        })
        .await
    }

    /// Starts the thread with the backend `make` builds on it (tests pass a fake), given
    /// the guest agent's shared state.
    pub async fn spawn_with(
        make: impl FnOnce(Arc<GuestShared>) -> Result<Box<dyn Backend>, LibvirtError> + Send + 'static,
    ) -> Result<Self, LibvirtError> {
        let stats = StatsReader::spawn()?;
        let (tx, rx) = mpsc::channel();
        let (state_tx, state) = watch::channel(Observed::default());
        let (mig_tx, migration) = watch::channel(MigrationStatus::Idle);
        let (ready_tx, ready_rx) = oneshot::channel();
        let guest = Arc::new(GuestShared::default());
        let (g, g2) = (guest.clone(), guest.clone());
        std::thread::Builder::new()
            .name("libvirt".into())
            .spawn(move || thread_main(move || make(g2), g, rx, state_tx, mig_tx, ready_tx))
            .map_err(|e| LibvirtError::Call {
                op: "spawn thread",
                message: e.to_string(),
            })?;
        let versions = ready_rx.await.map_err(|_| LibvirtError::Gone)??;
        Ok(Self {
            tx,
            state,
            migration,
            versions,
            guest,
            hotplugged: Arc::default(),
            stats,
        })
    }

    /// Plugs a hotplugged volume into the running guest or unplugs it; answers the
    /// hotplugged disks the guest has afterwards (also kept for [`Self::hotplugged`]).
    pub async fn hotplug(&self, op: HotplugOp) -> Result<Vec<HotpluggedDisk>, LibvirtError> {
        let disks = self.ask(|r| Cmd::Hotplug(op, r)).await?;
        if let Ok(mut h) = self.hotplugged.lock() {
            h.clone_from(&disks);
        }
        Ok(disks)
    }

    /// The hotplugged disks the guest had after the last [`Self::hotplug`].
    pub fn hotplugged(&self) -> Vec<HotpluggedDisk> {
        self.hotplugged
            .lock()
            .map(|h| h.clone())
            .unwrap_or_default()
    }

    /// The guest agent's shared state (its poller, its answers, the freeze).
    pub fn guest(&self) -> &Arc<GuestShared> {
        &self.guest
    }

    async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Cmd) -> Result<T, LibvirtError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(make(tx)).map_err(|_| LibvirtError::Gone)?;
        rx.await.map_err(|_| LibvirtError::Gone)?
    }

    /// Defines (persistently) the domain from XML.
    pub async fn define(&self, xml: String) -> Result<(), LibvirtError> {
        self.ask(|r| Cmd::Define(xml, r)).await
    }
    /// Migration target: waits for a domain of this name to arrive by live migration
    /// instead of defining one; the state turns `Running` once it runs here.
    pub async fn await_incoming(&self, name: String) -> Result<(), LibvirtError> {
        self.ask(|r| Cmd::AwaitIncoming(name, r)).await
    }
    /// Starts migrating the running domain away; follow [`Self::migration`].
    pub async fn migrate(&self, job: MigrateJob) -> Result<(), LibvirtError> {
        let wake = self.tx.clone();
        self.ask(|r| Cmd::Migrate(Box::new(job), r, wake)).await
    }
    /// Aborts the running migration.
    pub async fn cancel_migration(&self) -> Result<(), LibvirtError> {
        self.ask(Cmd::CancelMigration).await
    }
    /// Watches the outgoing migration.
    pub fn migration(&self) -> watch::Receiver<MigrationStatus> {
        self.migration.clone()
    }
    /// Starts the defined domain.
    pub async fn start(&self) -> Result<(), LibvirtError> {
        self.ask(Cmd::Start).await
    }
    /// Presses the ACPI power button.
    pub async fn shutdown(&self) -> Result<(), LibvirtError> {
        self.ask(Cmd::Shutdown).await
    }
    /// Stops the domain now.
    pub async fn destroy(&self) -> Result<(), LibvirtError> {
        self.ask(Cmd::Destroy).await
    }
    /// Carries out a VMI action (see [`act`]).
    pub async fn act(&self, a: VmiAction) -> Result<(), LibvirtError> {
        self.ask(|r| Cmd::Action(a, r)).await
    }
    /// Hotplugs vCPUs into the running guest until it has `vcpus` (see
    /// [`Backend::set_vcpus`]).
    pub async fn set_vcpus(&self, vcpus: u32) -> Result<(), LibvirtError> {
        self.ask(|r| Cmd::SetVcpus(vcpus, r)).await
    }
    /// Pauses the vCPUs.
    pub async fn pause(&self) -> Result<(), LibvirtError> {
        self.act(VmiAction::Pause).await
    }
    /// The running domain's statistics (libvirt's `virDomainListGetStats`, read on the
    /// statistics thread: [`crate::stats`]), or an error when no domain runs here; given up
    /// after `timeout`, so a hung QEMU or daemon cannot hold a scrape.
    pub async fn stats(&self, timeout: Duration) -> Result<DomainStats, LibvirtError> {
        let read = async {
            let src = self.stats_source().await?;
            self.stats.read(&src).await
        };
        tokio::time::timeout(timeout, read)
            .await
            .map_err(|_| LibvirtError::Call {
                op: "domain stats",
                message: format!("no answer within {timeout:?}"),
            })?
    }
    /// Where [`Self::stats`] reads from.
    pub(crate) async fn stats_source(&self) -> Result<StatsSource, LibvirtError> {
        self.ask(Cmd::Stats).await
    }
    /// Destroys and undefines the domain, stops the daemon and ends the thread.
    pub async fn close(&self) -> Result<(), LibvirtError> {
        self.ask(Cmd::Close).await
    }
    /// Watches the domain state.
    pub fn state(&self) -> watch::Receiver<Observed> {
        self.state.clone()
    }
    /// Versions gathered at connect time.
    pub fn versions(&self) -> &Versions {
        &self.versions
    }
}

/// What each VMI action of the API catalogue does to the domain: the one place that names
/// them on the node (virt-apiserver and virt-handler pass any catalogued action through).
/// `migrating`: an outgoing migration runs.
fn act(b: &mut dyn Backend, a: &VmiAction, migrating: bool) -> Result<(), LibvirtError> {
    match a {
        VmiAction::Pause => b.suspend(),
        VmiAction::Unpause => b.resume(),
        VmiAction::SoftReboot => b.reboot(),
        VmiAction::Reset => b.reset(),
        // A frozen guest would stall the migration's end on the target (KubeVirt refuses
        // it too, in these words).
        VmiAction::Freeze { .. } if migrating => Err(LibvirtError::Call {
            op: "freeze",
            message: "failed to freeze VMI, VMI is currently during migration".into(),
        }),
        VmiAction::Freeze {
            unfreeze_timeout_seconds,
        } => b.fs_freeze(Duration::from_secs(*unfreeze_timeout_seconds)),
        VmiAction::Unfreeze => b.fs_thaw(),
    }
}

fn version_string(v: u32) -> String {
    format!("{}.{}.{}", v / 1_000_000, (v / 1000) % 1000, v % 1000)
}

/// What the libvirt thread drives. Every method blocks and runs only on that thread.
pub trait Backend: Send {
    /// Versions and process facts.
    fn versions(&self) -> Versions;
    /// Defines the domain.
    fn define(&mut self, xml: &str) -> Result<(), LibvirtError>;
    /// Starts it.
    fn start(&mut self) -> Result<(), LibvirtError>;
    /// ACPI power button.
    fn shutdown(&mut self) -> Result<(), LibvirtError>;
    /// Reboots through the guest agent when it is connected, else by ACPI.
    fn reboot(&mut self) -> Result<(), LibvirtError>;
    /// Resets it at once, as the reset button.
    fn reset(&mut self) -> Result<(), LibvirtError>;
    /// Stops it now (no-op when not running).
    fn destroy(&mut self) -> Result<(), LibvirtError>;
    /// Pauses the vCPUs.
    fn suspend(&mut self) -> Result<(), LibvirtError>;
    /// Resumes the vCPUs.
    fn resume(&mut self) -> Result<(), LibvirtError>;
    /// Current state, once started; `None` when there is nothing to report.
    fn observe(&mut self) -> Option<Observed>;
    /// Hotplugs vCPUs into the running guest until it has `vcpus` of the domain's
    /// maximum (`<vcpu current=…>`): the guest sees new CPUs, no reboot.
    fn set_vcpus(&mut self, _vcpus: u32) -> Result<(), LibvirtError> {
        Err(LibvirtError::Call {
            op: "set vcpus",
            message: "not supported by this backend".into(),
        })
    }
    /// The running domain's live XML.
    fn live_xml(&mut self) -> Result<String, LibvirtError> {
        Err(LibvirtError::Call {
            op: "domain XML",
            message: "not supported by this backend".into(),
        })
    }
    /// Plugs the device `xml` describes into the running domain (live only: the next
    /// start renders the VMI anew).
    fn attach_device(&mut self, _xml: &str) -> Result<(), LibvirtError> {
        Err(LibvirtError::Call {
            op: "attach device",
            message: "not supported by this backend".into(),
        })
    }
    /// Unplugs the device `xml` describes from the running domain.
    fn detach_device(&mut self, _xml: &str) -> Result<(), LibvirtError> {
        Err(LibvirtError::Call {
            op: "detach device",
            message: "not supported by this backend".into(),
        })
    }
    /// Migration target: takes the domain `name` once it runs here (true), after an
    /// incoming migration completed.
    fn adopt_incoming(&mut self, _name: &str) -> bool {
        false
    }
    /// Starts an outgoing migration on a thread of its own (the libvirt call blocks
    /// until the end); the result arrives on the returned channel, then `wake` is called.
    fn start_migration(
        &mut self,
        _job: &MigrateJob,
        _wake: MigrationWaker,
    ) -> Result<mpsc::Receiver<MigrationResult>, LibvirtError> {
        Err(LibvirtError::Call {
            op: "migrate",
            message: "not supported by this backend".into(),
        })
    }
    /// The latest statistics of the running migration job, if new ones were read.
    fn migration_progress(&mut self) -> Option<JobReport> {
        None
    }
    /// Aborts the running migration job.
    fn cancel_migration(&mut self) -> Result<(), LibvirtError> {
        Err(LibvirtError::Call {
            op: "cancel migration",
            message: "not supported by this backend".into(),
        })
    }
    /// Freezes the guest's file systems (guest agent); they are thawed after
    /// `unfreeze_after` unless [`Self::fs_thaw`] came first (zero: no timeout). A frozen
    /// guest stays frozen, its timeout restarted.
    fn fs_freeze(&mut self, _unfreeze_after: Duration) -> Result<(), LibvirtError> {
        Err(LibvirtError::NoGuestAgent)
    }
    /// Thaws the guest's file systems; a thawed guest stays so.
    fn fs_thaw(&mut self) -> Result<(), LibvirtError> {
        Err(LibvirtError::NoGuestAgent)
    }
    /// Whether a guest agent has its channel open.
    fn guest_agent_connected(&mut self) -> bool {
        false
    }
    /// Where the running domain's statistics are read from (the reading itself happens
    /// on the statistics thread, [`crate::stats`]).
    fn stats_source(&mut self) -> Result<StatsSource, LibvirtError> {
        Err(LibvirtError::Call {
            op: "domain stats",
            message: "not supported by this backend".into(),
        })
    }
    /// Destroys and undefines the domain and releases the daemon.
    fn cleanup(&mut self);
}

/// Carries out `op` on the running domain (on the libvirt thread: it opens the image to
/// learn whether it takes `O_DIRECT`) and reads back the guest's hotplugged disks.
fn hotplug(b: &mut dyn Backend, op: &HotplugOp) -> Result<Vec<HotpluggedDisk>, LibvirtError> {
    use kubevirt_api::hotplug::{LAUNCHER_HOTPLUG_DIR, launcher_image_path};
    let read = |b: &mut dyn Backend| -> Result<(Vec<HotpluggedDisk>, Vec<String>), LibvirtError> {
        let xml = b.live_xml()?;
        virt_domain::schema::live_disks(&xml, LAUNCHER_HOTPLUG_DIR).map_err(|e| {
            LibvirtError::Call {
                op: "domain XML",
                message: e.to_string(),
            }
        })
    };
    let (hot, taken) = read(b)?;
    let invalid = |e: &dyn std::fmt::Display| LibvirtError::Call {
        op: "hotplug",
        message: e.to_string(),
    };
    match op {
        HotplugOp::Attach { disk, volume } => {
            if hot.iter().any(|h| h.name == volume.name) {
                return Ok(hot);
            }
            let path = std::path::PathBuf::from(launcher_image_path(&volume.name));
            if !path.is_file() {
                return Err(invalid(&format!(
                    "{} is not mounted in the launcher pod",
                    path.display()
                )));
            }
            let prepared = virt_domain::PreparedVolume {
                direct_io: crate::volumes::opens_direct(&path),
                path,
                format: virt_domain::schema::DiskFormat::Raw,
                kind: virt_domain::schema::DiskType::File,
            };
            let element = virt_domain::hotplug_disk(disk, volume, &prepared, &taken)
                .map_err(|e| invalid(&e))?;
            let xml = element.to_xml().map_err(|e| invalid(&e))?;
            tracing::info!(volume = %volume.name, target = %element.target.dev, "plugging in a hotplugged volume");
            b.attach_device(&xml)?;
        }
        HotplugOp::Detach(name) => {
            let Some(h) = hot.iter().find(|h| &h.name == name) else {
                return Ok(hot);
            };
            // libvirt finds the disk by its target; the bus follows from the name.
            use virt_domain::schema as x;
            let element = x::Disk {
                type_: x::DiskType::File,
                device: x::DiskDevice::Disk,
                driver: x::DiskDriver {
                    name: "qemu".into(),
                    format: x::DiskFormat::Raw,
                    cache: None,
                    io: None,
                    error_policy: None,
                },
                source: x::DiskSource {
                    file: Some(launcher_image_path(name)),
                    dev: None,
                },
                target: x::DiskTarget {
                    dev: h.target.clone(),
                    bus: if h.target.starts_with("vd") {
                        x::Bus::Virtio
                    } else {
                        x::Bus::Scsi
                    },
                },
                boot: None,
                readonly: None,
                shareable: None,
                serial: None,
                alias: None,
            };
            let xml = element.to_xml().map_err(|e| invalid(&e))?;
            tracing::info!(volume = %name, target = %h.target, "unplugging a hotplugged volume");
            b.detach_device(&xml)?;
        }
    }
    Ok(read(b)?.0)
}

fn thread_main(
    make: impl FnOnce() -> Result<Box<dyn Backend>, LibvirtError>,
    guest: Arc<GuestShared>,
    rx: mpsc::Receiver<Cmd>,
    state: watch::Sender<Observed>,
    migration: watch::Sender<MigrationStatus>,
    ready: oneshot::Sender<Result<Versions, LibvirtError>>,
) {
    let mut b = match make() {
        Ok(b) => {
            let _ = ready.send(Ok(b.versions()));
            b
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let publish = |o: Observed| {
        state.send_if_modified(|cur| {
            if cur.state == o.state && cur.agent_connected == o.agent_connected {
                return false;
            }
            *cur = o;
            true
        });
    };
    let mut started = false;
    // Migration target: the name of the domain we wait for.
    let mut incoming: Option<String> = None;
    // Outgoing migration: its result channel, whether a cancel was asked for, when
    // progress was last read.
    let mut outgoing: Option<(mpsc::Receiver<MigrationResult>, bool, Instant)> = None;
    // The running migration job's latest figures, for the statistics: kept only while
    // `outgoing` runs, so a scrape after its end shows no migration.
    let mut job: Option<MigrationJobStats> = None;
    // After a completed migration the domain here is shut off with reason "migrated";
    // that is not the guest's end, so it is no longer observed.
    let mut migrated = false;
    // The agent's last known state and when it was read (never: at once).
    let mut agent = false;
    let mut agent_read: Option<Instant> = None;
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(Cmd::Close(reply)) => {
                guest.stop();
                b.cleanup();
                if started && !migrated {
                    publish(Observed {
                        state: DomainState::Shutoff,
                        ..Observed::default()
                    });
                }
                let _ = reply.send(Ok(()));
                return;
            }
            Ok(Cmd::Define(xml, r)) => {
                let _ = r.send(b.define(&xml));
            }
            Ok(Cmd::AwaitIncoming(name, r)) => {
                incoming = Some(name);
                let _ = r.send(Ok(()));
            }
            Ok(Cmd::Wake) => {}
            Ok(Cmd::Migrate(job, r, wake)) => {
                let res = if !started || migrated {
                    Err(LibvirtError::NoDomain)
                } else if outgoing.is_some() {
                    Err(LibvirtError::Call {
                        op: "migrate",
                        message: "a migration is already running".into(),
                    })
                } else {
                    b.start_migration(&job, MigrationWaker(wake)).map(|done| {
                        migration.send_replace(MigrationStatus::Running {
                            progress: MigrationProgress::default(),
                        });
                        outgoing = Some((done, false, Instant::now()));
                    })
                };
                let _ = r.send(res);
            }
            Ok(Cmd::CancelMigration(r)) => {
                let res = match outgoing.as_mut() {
                    Some((_, cancelled, _)) => {
                        *cancelled = true;
                        b.cancel_migration()
                    }
                    None => Err(LibvirtError::Call {
                        op: "cancel migration",
                        message: "no migration is running".into(),
                    }),
                };
                let _ = r.send(res);
            }
            Ok(Cmd::Start(r)) => {
                let res = b.start();
                started |= res.is_ok();
                let _ = r.send(res);
            }
            Ok(Cmd::Shutdown(r)) => {
                let _ = r.send(b.shutdown());
            }
            Ok(Cmd::Destroy(r)) => {
                let _ = r.send(b.destroy());
            }
            Ok(Cmd::SetVcpus(n, r)) => {
                let _ = r.send(b.set_vcpus(n));
            }
            Ok(Cmd::Hotplug(op, r)) => {
                let res = if outgoing.is_some() {
                    Err(LibvirtError::Call {
                        op: "hotplug",
                        message: "the guest is migrating; try again after the migration".into(),
                    })
                } else {
                    hotplug(b.as_mut(), &op)
                };
                let _ = r.send(res);
            }
            Ok(Cmd::Action(a, r)) => {
                let res = act(b.as_mut(), &a, outgoing.is_some());
                if res.is_ok() {
                    match a {
                        VmiAction::Freeze { .. } => guest.set_frozen(true),
                        VmiAction::Unfreeze => guest.set_frozen(false),
                        _ => {}
                    }
                }
                let _ = r.send(res);
            }
            Ok(Cmd::Stats(r)) => {
                let res = if started && !migrated {
                    b.stats_source().map(|mut src| {
                        src.migration = job.clone();
                        src
                    })
                } else {
                    Err(LibvirtError::NoDomain)
                };
                let _ = r.send(res);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                tracing::warn!("launcher dropped the libvirt handle; cleaning up");
                guest.stop();
                b.cleanup();
                return;
            }
        }
        if let Some(name) = &incoming
            && b.adopt_incoming(name)
        {
            incoming = None;
            started = true;
        }
        if let Some((done, cancelled, polled)) = outgoing.as_mut() {
            let result = done.try_recv();
            if !matches!(result, Err(mpsc::TryRecvError::Empty)) {
                job = None;
            }
            match result {
                Ok(Ok(progress)) => {
                    migrated = true;
                    migration.send_replace(MigrationStatus::Completed { progress });
                    publish(Observed {
                        state: DomainState::Migrated,
                        ..Observed::default()
                    });
                    outgoing = None;
                }
                Ok(Err(reason)) => {
                    migration.send_replace(if *cancelled {
                        MigrationStatus::Cancelled
                    } else {
                        MigrationStatus::Failed { reason }
                    });
                    outgoing = None;
                }
                Err(mpsc::TryRecvError::Disconnected) => {
                    migration.send_replace(MigrationStatus::Failed {
                        reason: "the migration thread ended without a result".into(),
                    });
                    outgoing = None;
                }
                Err(mpsc::TryRecvError::Empty) => {
                    // What the statistics thread read, passed on twice a second.
                    if polled.elapsed() >= Duration::from_millis(500) {
                        *polled = Instant::now();
                        if let Some(report) = b.migration_progress() {
                            job = Some(report.job);
                            migration.send_replace(MigrationStatus::Running {
                                progress: report.progress,
                            });
                        }
                    }
                }
            }
        }
        if started
            && !migrated
            && let Some(mut o) = b.observe()
        {
            if matches!(o.state, DomainState::Running | DomainState::Paused) {
                if agent_read.is_none_or(|t| t.elapsed() >= AGENT_POLL) {
                    agent_read = Some(Instant::now());
                    agent = b.guest_agent_connected();
                }
            } else {
                agent = false;
            }
            o.agent_connected = agent;
            publish(o);
        }
    }
}

/// What the statistics of the running domain are read from: its daemon, its name, and
/// the VMI's names of its devices (from the live XML).
#[derive(Clone, Debug, Default)]
pub struct StatsSource {
    /// libvirt URI of the daemon.
    pub uri: String,
    /// Domain name.
    pub domain: String,
    /// Device name in the statistics → the VMI's name ([`virt_domain::schema::device_aliases`]).
    pub aliases: BTreeMap<String, String>,
    /// The outgoing migration job's latest figures, while one runs.
    pub migration: Option<MigrationJobStats>,
}

/// Our progress figures from libvirt's job statistics.
fn progress_of(s: &virt::domain::JobStats) -> MigrationProgress {
    MigrationProgress {
        data_total: s.data_total.unwrap_or(0),
        data_processed: s.data_processed.unwrap_or(0),
        data_remaining: s.data_remaining.unwrap_or(0),
        memory_iteration: s.mem_iteration.unwrap_or(0),
        memory_bps: s.mem_bps.unwrap_or(0),
        elapsed_ms: s.time_elapsed.unwrap_or(0),
        downtime_ms: s.downtime,
        mode: MigrationMode::PreCopy,
    }
}

/// libvirt's job statistics as the metrics export them (KubeVirt's conversion: a figure
/// libvirt left out stays out).
fn job_of(s: &virt::domain::JobStats) -> MigrationJobStats {
    MigrationJobStats {
        data_total_bytes: s.data_total,
        data_processed_bytes: s.data_processed,
        data_remaining_bytes: s.data_remaining,
        memory_dirty_rate_bps: MigrationJobStats::dirty_rate_bytes(
            s.mem_dirty_rate,
            s.mem_page_size,
        ),
        memory_bps: s.mem_bps,
    }
}

/// The source's domain XML with its paths replaced by the target's.
pub fn rewrite_paths(xml: &str, pairs: &[(String, String)]) -> String {
    pairs
        .iter()
        .filter(|(from, to)| !from.is_empty() && from != to)
        .fold(xml.to_string(), |x, (from, to)| {
            x.replace(from.as_str(), to)
        })
}

/// The real backend: a `virt` connection to a private or given libvirt daemon.
pub struct LibvirtBackend {
    uri: String,
    stats: Option<mpsc::Receiver<JobReport>>,
    daemon: Option<PrivateDaemon>,
    conn: Option<Connect>,
    domain: Option<Domain>,
    versions: Versions,
    /// The pending thaw of a freeze's timeout: sending or dropping cancels it.
    thaw_timer: Option<mpsc::Sender<()>>,
    /// The guest agent's shared state: given the domain's agent, told of a timed thaw.
    guest: Arc<GuestShared>,
}

impl std::fmt::Debug for LibvirtBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LibvirtBackend")
            .field("versions", &self.versions)
            .finish_non_exhaustive()
    }
}

impl LibvirtBackend {
    /// Starts the daemon if asked to and connects.
    pub fn connect(target: Target, guest: Arc<GuestShared>) -> Result<Self, LibvirtError> {
        let mut b = Self {
            uri: String::new(),
            stats: None,
            daemon: None,
            conn: None,
            domain: None,
            versions: Versions::default(),
            thaw_timer: None,
            guest,
        };
        let uri = match target {
            Target::Uri(u) => u,
            Target::Private {
                dir,
                cache,
                hide_kvm,
                migration_dir,
            } => {
                let d = PrivateDaemon::start(
                    &dir,
                    &cache,
                    hide_kvm,
                    &migration_dir,
                    Duration::from_secs(30),
                )?;
                let uri = d.uri.clone();
                b.daemon = Some(d);
                uri
            }
        };
        // libvirt prints every error to stderr by default; ours are returned and logged
        // (the migration target's lookups fail by design until the guest arrives).
        virt::error::clear_error_callback();
        // On error `b` drops here and its daemon with it.
        let conn = call("connect", Connect::open(Some(&uri)))?;
        b.uri = uri;
        b.versions = Versions {
            libvirt: conn.lib_version().map(version_string).unwrap_or_default(),
            qemu: conn.hyp_version().map(version_string).unwrap_or_default(),
            daemon_pid: b.daemon.as_ref().map(PrivateDaemon::pid),
        };
        b.conn = Some(conn);
        Ok(b)
    }

    fn dom(&self) -> Result<&Domain, LibvirtError> {
        self.domain.as_ref().ok_or(LibvirtError::NoDomain)
    }
}

impl Backend for LibvirtBackend {
    fn versions(&self) -> Versions {
        self.versions.clone()
    }

    fn define(&mut self, xml: &str) -> Result<(), LibvirtError> {
        let conn = self.conn.as_ref().ok_or(LibvirtError::Gone)?;
        let d = call("define", conn.define_domain_xml(xml))?;
        self.guest.set_agent(Arc::new(LibvirtAgent(d.clone())));
        self.domain = Some(d);
        Ok(())
    }

    fn start(&mut self) -> Result<(), LibvirtError> {
        call("start", self.dom()?.create())
    }

    fn shutdown(&mut self) -> Result<(), LibvirtError> {
        call(
            "shutdown",
            self.dom()?
                .shutdown_flags(virt::sys::VIR_DOMAIN_SHUTDOWN_ACPI_POWER_BTN),
        )
    }

    fn reboot(&mut self) -> Result<(), LibvirtError> {
        let d = self.dom()?;
        // As KubeVirt: through the guest agent when one runs (it reboots guests that
        // ignore the power button, and cleanly), else the ACPI button. Read now, not
        // the last poll: the agent may have come or gone since.
        let connected = agent_connected(d).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "reading the guest agent's state; rebooting by ACPI");
            false
        });
        if connected {
            match d.reboot(virt::sys::VIR_DOMAIN_REBOOT_GUEST_AGENT) {
                Ok(_) => return Ok(()),
                // An agent that is connected but does not answer (hung, or not yet
                // ready) must not make soft reboot fail where the power button works.
                Err(e) => {
                    tracing::warn!(error = %e, "rebooting through the guest agent; pressing the ACPI button")
                }
            }
        }
        call(
            "reboot",
            d.reboot(virt::sys::VIR_DOMAIN_REBOOT_ACPI_POWER_BTN),
        )
    }

    fn reset(&mut self) -> Result<(), LibvirtError> {
        call("reset", self.dom()?.reset())
    }

    fn destroy(&mut self) -> Result<(), LibvirtError> {
        let d = self.dom()?;
        match d.is_active() {
            Ok(false) => Ok(()),
            _ => call("destroy", d.destroy()),
        }
    }

    fn suspend(&mut self) -> Result<(), LibvirtError> {
        call("suspend", self.dom()?.suspend())
    }

    fn resume(&mut self) -> Result<(), LibvirtError> {
        call("resume", self.dom()?.resume())
    }

    fn set_vcpus(&mut self, vcpus: u32) -> Result<(), LibvirtError> {
        // Live only: the persistent definition stays as it was defined (the next start
        // renders the VMI anew).
        call(
            "set vcpus",
            self.dom()?
                .set_vcpus_flags(vcpus, virt::sys::VIR_DOMAIN_AFFECT_LIVE),
        )
    }

    fn live_xml(&mut self) -> Result<String, LibvirtError> {
        call("domain XML", self.dom()?.xml_desc(0))
    }

    fn attach_device(&mut self, xml: &str) -> Result<(), LibvirtError> {
        call(
            "attach device",
            self.dom()?
                .attach_device_flags(xml, virt::sys::VIR_DOMAIN_AFFECT_LIVE),
        )
    }

    fn detach_device(&mut self, xml: &str) -> Result<(), LibvirtError> {
        call(
            "detach device",
            self.dom()?
                .detach_device_flags(xml, virt::sys::VIR_DOMAIN_AFFECT_LIVE),
        )
    }

    fn adopt_incoming(&mut self, name: &str) -> bool {
        let Some(conn) = self.conn.as_ref() else {
            return false;
        };
        // The incoming domain exists (paused) from the start of the migration; it is
        // ours only once it runs. A failed migration makes it vanish again.
        let Ok(d) = conn.lookup_domain_by_name(name) else {
            return false;
        };
        if matches!(d.state(), Ok((Enum::Known(VirState::Running), _))) {
            self.guest.set_agent(Arc::new(LibvirtAgent(d.clone())));
            self.domain = Some(d);
            return true;
        }
        false
    }

    fn start_migration(
        &mut self,
        job: &MigrateJob,
        wake: MigrationWaker,
    ) -> Result<mpsc::Receiver<MigrationResult>, LibvirtError> {
        let d = self.dom()?.clone();
        let xml = call(
            "domain XML",
            d.xml_desc(virt::sys::VIR_DOMAIN_XML_MIGRATABLE),
        )?;
        let xml = rewrite_paths(&xml, &job.rewrite);
        if let Some(ms) = job.max_downtime_ms {
            call("set max downtime", d.migrate_set_max_downtime(ms, 0))?;
        }
        let params = virt::domain::MigrateParameters {
            uri: Some(job.uri.clone()),
            // libvirt refuses a disks URI without a disk copy.
            disks_uri: (!job.disks.copy.is_empty()).then(|| job.disks_uri.clone()),
            dest_xml: Some(xml.clone()),
            persist_xml: Some(xml),
            bandwidth: job.bandwidth_mib,
            migrate_disks: job.disks.copy.clone(),
            ..Default::default()
        };
        // Peer-to-peer: our daemon talks to the target's over `dest_uri`; live; the
        // target keeps the definition; writable local disks (containerDisk overlays,
        // emptyDisks) are copied over NBD, only their top layer (the backing images are
        // on both sides).
        // Only the disks named in `migrate_disks` (never a shared claim); with none, no
        // disk copy at all (an empty list would mean "all" to libvirt).
        let mut flags = virt::sys::VIR_MIGRATE_LIVE
            | virt::sys::VIR_MIGRATE_PEER2PEER
            | virt::sys::VIR_MIGRATE_PERSIST_DEST;
        if !job.disks.copy.is_empty() {
            flags |= virt::sys::VIR_MIGRATE_NON_SHARED_INC;
        }
        // libvirt calls a disk it neither copies nor finds on a file system it knows to be
        // shared (NFS, Ceph, …) unsafe to migrate. A claim's storage is shared by the
        // claim's contract (ReadWriteMany, checked before a migration is allowed) whatever
        // it is built on (here a host directory both nodes mount), as KubeVirt trusts it.
        if !job.disks.shared.is_empty() {
            flags |= virt::sys::VIR_MIGRATE_UNSAFE;
        }
        let dest = job.dest_uri.clone();
        let (tx, rx) = mpsc::channel();
        // Job statistics on a thread of their own too: virDomainGetJobStats can wait
        // behind the migration job for its whole length (measured: a throttled
        // migration's second stats call returned only at the end), and on this thread
        // that would also hold up the state polling and a cancel.
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (stats_tx, stats_rx) = mpsc::channel();
        self.stats = Some(stats_rx);
        {
            let (d, done) = (d.clone(), done.clone());
            std::thread::Builder::new()
                .name("libvirt-jobstats".into())
                .spawn(move || {
                    while !done.load(std::sync::atomic::Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(500));
                        // With no job (cancelled, failed or just ended), libvirt answers
                        // job_stats with no parameters and a null array, which the `virt`
                        // crate turns into a Vec from a null pointer: an abort in builds
                        // with UB checks (seen after a cancel). GetJobInfo has no array.
                        if d.job_info()
                            .is_ok_and(|i| i.r#type == virt::sys::VIR_DOMAIN_JOB_NONE as i32)
                        {
                            continue;
                        }
                        match d.job_stats(0) {
                            Ok(s) => {
                                let report = JobReport {
                                    progress: progress_of(&s),
                                    job: job_of(&s),
                                };
                                if stats_tx.send(report).is_err() {
                                    return;
                                }
                            }
                            Err(e) => {
                                // No report this round; a migration without reports looks
                                // stalled to virt-controller, hence a warning.
                                tracing::warn!(error = %e.message(), "migration job statistics");
                            }
                        }
                    }
                })
                .map_err(|e| LibvirtError::Call {
                    op: "spawn job statistics thread",
                    message: e.to_string(),
                })?;
        }
        // virDomainMigrateToURI3 blocks for the whole migration. It runs on a thread of
        // its own so this thread keeps polling state and job statistics and can abort;
        // libvirt connections are thread-safe.
        std::thread::Builder::new()
            .name("libvirt-migrate".into())
            .spawn(move || {
                let r = d
                    .migrate_to_uri3(Some(&dest), params, flags)
                    .map_err(|e| e.message().to_string())
                    .map(|()| {
                        d.job_stats(virt::sys::VIR_DOMAIN_JOB_STATS_COMPLETED)
                            .map(|s| progress_of(&s))
                            .unwrap_or_default()
                    });
                done.store(true, std::sync::atomic::Ordering::SeqCst);
                let _ = tx.send(r);
                wake.wake();
            })
            .map_err(|e| LibvirtError::Call {
                op: "spawn migration thread",
                message: e.to_string(),
            })?;
        Ok(rx)
    }

    fn migration_progress(&mut self) -> Option<JobReport> {
        // The latest of what the statistics thread read since the last call.
        self.stats.as_ref()?.try_iter().last()
    }

    fn cancel_migration(&mut self) -> Result<(), LibvirtError> {
        // virDomainAbortJob, through virsh (libvirt-clients, a dependency of
        // libvirt-daemon-system): the `virt` crate has no binding for it and this
        // workspace forbids unsafe code. QEMU's own `migrate_cancel` through
        // virDomainQemuMonitorCommand is no substitute: libvirt queues it behind the
        // migration job (measured: it waited until the migration had completed).
        let name = call("domain name", self.dom()?.name())?;
        let out = std::process::Command::new("virsh")
            .args(["-q", "-c", &self.uri, "domjobabort", &name])
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| LibvirtError::Call {
                op: "cancel migration (virsh)",
                message: e.to_string(),
            })?;
        if out.status.success() {
            Ok(())
        } else {
            Err(LibvirtError::Call {
                op: "cancel migration",
                message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            })
        }
    }

    fn fs_freeze(&mut self, unfreeze_after: Duration) -> Result<(), LibvirtError> {
        let d = self.dom()?;
        let name = call("domain name", d.name())?;
        // Idempotent, as KubeVirt's: the guest agent refuses to freeze twice.
        if fs_freeze_status(d)? != "frozen" {
            virsh(&self.uri, "freeze", &["domfsfreeze", &name])?;
        }
        // Replacing the sender cancels an earlier freeze's timer.
        self.thaw_timer = if unfreeze_after.is_zero() {
            None
        } else {
            Some(thaw_after(
                self.uri.clone(),
                name,
                unfreeze_after,
                self.guest.clone(),
            )?)
        };
        Ok(())
    }

    fn fs_thaw(&mut self) -> Result<(), LibvirtError> {
        self.thaw_timer = None;
        let d = self.dom()?;
        let name = call("domain name", d.name())?;
        // A guest agent that thaws twice would run its thaw hooks twice.
        if fs_freeze_status(d)? == "thawed" {
            return Ok(());
        }
        virsh(&self.uri, "unfreeze", &["domfsthaw", &name]).map(drop)
    }

    fn guest_agent_connected(&mut self) -> bool {
        let Some(d) = self.domain.as_ref() else {
            return false;
        };
        // Unknown counts as not connected; polled, so not worth a warning each time.
        agent_connected(d).unwrap_or_else(|e| {
            tracing::debug!(error = %e, "reading the guest agent's state");
            false
        })
    }

    fn stats_source(&mut self) -> Result<StatsSource, LibvirtError> {
        let d = self.dom()?;
        let domain = call("domain name", d.name())?;
        let xml = call("domain XML", d.xml_desc(0))?;
        // Without the names the metrics fall back to libvirt's (`vda`, `tap0`), as
        // KubeVirt's do; not worth failing the statistics for.
        let aliases = virt_domain::schema::device_aliases(&xml).unwrap_or_else(|e| {
            tracing::debug!(error = %e, "reading device aliases");
            BTreeMap::new()
        });
        Ok(StatsSource {
            uri: self.uri.clone(),
            domain,
            aliases,
            migration: None,
        })
    }

    fn observe(&mut self) -> Option<Observed> {
        let d = self.domain.as_ref()?;
        match d.state() {
            Ok((Enum::Known(s), reason)) => classify(s, reason),
            Ok((Enum::Unknown(_), _)) => None,
            // The daemon or QEMU went away under us.
            Err(e) => Some(Observed {
                state: DomainState::Crashed,
                reason: Some(e.message().to_string()),
                agent_connected: false,
            }),
        }
    }

    fn cleanup(&mut self) {
        if let Some(d) = self.domain.take() {
            if d.is_active().unwrap_or(false)
                && let Err(e) = d.destroy()
            {
                tracing::warn!(error = %e.message(), "destroying domain");
            }
            let flags =
                virt::sys::VIR_DOMAIN_UNDEFINE_NVRAM | virt::sys::VIR_DOMAIN_UNDEFINE_MANAGED_SAVE;
            if let Err(e) = d.undefine_flags(flags) {
                tracing::warn!(error = %e.message(), "undefining domain");
            }
        }
        drop(self.conn.take());
        if let Some(mut d) = self.daemon.take() {
            d.stop();
        }
    }
}

/// Whether the guest agent has its channel open, from the live XML (libvirt follows the
/// port's state through QEMU's events, so this costs no guest round trip).
fn agent_connected(d: &Domain) -> Result<bool, String> {
    let xml = d.xml_desc(0).map_err(|e| e.message().to_string())?;
    virt_domain::schema::guest_agent_connected(&xml).map_err(|e| e.to_string())
}

/// Runs virsh on the launcher's libvirt (the `virt` crate binds neither virDomainFSFreeze
/// nor the guest-agent call, and this workspace forbids unsafe code); its output.
fn virsh(uri: &str, op: &'static str, args: &[&str]) -> Result<String, LibvirtError> {
    let out = std::process::Command::new("virsh")
        .args(["-q", "-c", uri])
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| LibvirtError::Call {
            op,
            message: format!("running virsh: {e}"),
        })?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).trim().to_string());
    }
    Err(virsh_failure(op, &String::from_utf8_lossy(&out.stderr)))
}

/// A failed virsh call as our error: a guest agent that is missing, not configured or not
/// answering is [`LibvirtError::NoGuestAgent`] (what the user can act on), anything else
/// libvirt's message.
fn virsh_failure(op: &'static str, stderr: &str) -> LibvirtError {
    let message = stderr
        .lines()
        .map(|l| l.trim().trim_start_matches("error: ").trim())
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(": ");
    if message.to_ascii_lowercase().contains("guest agent") {
        tracing::info!(%op, libvirt = %message, "the guest agent is not available");
        return LibvirtError::NoGuestAgent;
    }
    LibvirtError::Call { op, message }
}

/// The guest agent's `frozen` or `thawed`.
fn fs_freeze_status(d: &Domain) -> Result<String, LibvirtError> {
    use crate::agent::{Agent, AgentError};
    match LibvirtAgent(d.clone()).command("guest-fsfreeze-status", None) {
        Ok(v) => fs_freeze_status_of(&v).ok_or_else(|| LibvirtError::Call {
            op: "freeze status",
            message: format!("unexpected guest agent answer {v}"),
        }),
        Err(AgentError::NotConnected) => Err(LibvirtError::NoGuestAgent),
        Err(e) => Err(LibvirtError::Call {
            op: "freeze status",
            message: e.to_string(),
        }),
    }
}

/// `"frozen"` → `frozen`.
fn fs_freeze_status_of(answer: &serde_json::Value) -> Option<String> {
    answer.as_str().map(str::to_string)
}

/// Thaws `name` after `after` on a thread of its own, unless the returned sender sends or
/// drops first (an unfreeze, a new freeze, the launcher's end).
fn thaw_after(
    uri: String,
    name: String,
    after: Duration,
    guest: Arc<GuestShared>,
) -> Result<mpsc::Sender<()>, LibvirtError> {
    let (tx, rx) = mpsc::channel::<()>();
    std::thread::Builder::new()
        .name("libvirt-thaw".into())
        .spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(after) {
                tracing::warn!(
                    domain = %name,
                    seconds = after.as_secs(),
                    "unfreeze did not come within the freeze's timeout: thawing"
                );
                match virsh(&uri, "unfreeze", &["domfsthaw", &name]) {
                    Ok(_) => guest.set_frozen(false),
                    Err(e) => tracing::warn!(error = %e, "thawing after the freeze's timeout"),
                }
            }
        })
        .map_err(|e| LibvirtError::Call {
            op: "spawn thaw timer",
            message: e.to_string(),
        })?;
    Ok(tx)
}

/// What a libvirt domain state and its reason mean for the VMI; `None` while a migration's
/// switchover owns the state (its result is reported from the migration, with statistics).
fn classify(state: VirState, reason: DomainStateReasonEnum) -> Option<Observed> {
    let reason = match reason {
        Enum::Known(r) => Some(r),
        Enum::Unknown(_) => None,
    };
    let crashed = |why: &str| {
        Some(Observed {
            state: DomainState::Crashed,
            reason: Some(why.to_string()),
            agent_connected: false,
        })
    };
    let state = match state {
        VirState::Running | VirState::Blocked => DomainState::Running,
        // Paused by the migration's switchover: not the user's pause.
        VirState::Paused
            if matches!(reason, Some(Reason::Paused(Enum::Known(Paused::Migration)))) =>
        {
            return None;
        }
        VirState::Paused | VirState::PMSuspended => DomainState::Paused,
        VirState::Shutdown => DomainState::ShuttingDown,
        VirState::Shutoff => match reason {
            // It runs on the target now.
            Some(Reason::Shutoff(Enum::Known(Shutoff::Migrated))) => return None,
            Some(Reason::Shutoff(Enum::Known(Shutoff::Crashed))) => {
                return crashed("the guest crashed (its panic device reported a kernel panic)");
            }
            Some(Reason::Shutoff(Enum::Known(Shutoff::Failed))) => {
                return crashed("QEMU failed to run the guest");
            }
            _ => DomainState::Shutoff,
        },
        VirState::Crashed => {
            return crashed(match reason {
                Some(Reason::Crashed(Enum::Known(Crashed::Panicked))) => {
                    "the guest kernel panicked"
                }
                _ => "the guest crashed",
            });
        }
        VirState::NoState => DomainState::Pending,
    };
    Some(Observed {
        state,
        reason: None,
        agent_connected: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known(r: Reason) -> DomainStateReasonEnum {
        Enum::Known(r)
    }

    #[test]
    fn a_missing_guest_agent_is_named_not_a_libvirt_blob() {
        for stderr in [
            "error: argument unsupported: QEMU guest agent is not configured\n",
            "error: Guest agent is not responding: QEMU guest agent is not connected\n",
        ] {
            let e = virsh_failure("freeze", stderr);
            assert!(matches!(e, LibvirtError::NoGuestAgent), "{stderr}: {e:?}");
            assert_eq!(e.to_string(), "VMI does not have guest agent connected");
        }
        let e = virsh_failure(
            "freeze",
            "error: failed to get domain 'x'\nerror: no domain\n",
        );
        assert_eq!(
            e.to_string(),
            "libvirt freeze: failed to get domain 'x': no domain"
        );
        assert_eq!(
            fs_freeze_status_of(&serde_json::json!("frozen")).as_deref(),
            Some("frozen")
        );
        assert_eq!(fs_freeze_status_of(&serde_json::json!({})), None);
    }

    /// A CPU hotplug reaches the backend on the libvirt thread.
    #[tokio::test]
    async fn vcpus_are_set_on_the_running_domain() {
        let f = crate::fake::FakeBackend::default();
        let b = f.clone();
        let h = DomainHandle::spawn_with(move |_| Ok(Box::new(b) as Box<dyn Backend>))
            .await
            .expect("fake backend");
        h.define("<domain/>".into()).await.expect("define");
        h.start().await.expect("start");
        h.set_vcpus(2).await.expect("set vcpus");
        assert!(f.calls().contains(&"set_vcpus"));
        assert_eq!(f.0.lock().unwrap_or_else(|e| e.into_inner()).vcpus, Some(2));
    }

    /// The statistics carry the migration job's figures from its first report until the
    /// migration ends, never before nor after.
    #[tokio::test]
    async fn the_statistics_show_the_migration_job_only_while_it_runs() {
        let f = crate::fake::FakeBackend::default();
        let b = f.clone();
        let h = DomainHandle::spawn_with(move |_| Ok(Box::new(b) as Box<dyn Backend>))
            .await
            .expect("fake backend");
        h.define("<domain/>".into()).await.expect("define");
        h.start().await.expect("start");
        let migration = || async { h.stats_source().await.expect("stats source").migration };
        assert_eq!(migration().await, None);
        h.migrate(MigrateJob::default()).await.expect("migrate");
        assert_eq!(migration().await, None, "before libvirt's first report");
        let job = MigrationJobStats {
            data_total_bytes: Some(300),
            data_processed_bytes: Some(100),
            ..MigrationJobStats::default()
        };
        f.0.lock()
            .unwrap_or_else(|e| e.into_inner())
            .job_reports
            .push(JobReport {
                progress: MigrationProgress::default(),
                job: job.clone(),
            });
        let deadline = Instant::now() + Duration::from_secs(5);
        while migration().await.as_ref() != Some(&job) {
            assert!(Instant::now() < deadline, "the job's figures never showed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let result =
            f.0.lock()
                .unwrap_or_else(|e| e.into_inner())
                .migration_result
                .take()
                .expect("the migration's result channel");
        result
            .send(Err("the target went away".into()))
            .expect("send");
        let mut status = h.migration();
        tokio::time::timeout(
            Duration::from_secs(5),
            status.wait_for(MigrationStatus::is_final),
        )
        .await
        .expect("the migration ends")
        .expect("status channel");
        assert_eq!(migration().await, None, "after the migration");
        h.close().await.expect("close");
    }

    #[test]
    fn freeze_waits_for_a_migration_and_needs_a_guest_agent() {
        let mut fake = crate::fake::FakeBackend::default();
        let freeze = VmiAction::Freeze {
            unfreeze_timeout_seconds: 1,
        };
        let e = act(&mut fake, &freeze, true).expect_err("refused while migrating");
        assert!(e.to_string().contains("during migration"), "{e}");
        // The fake, like a guest without an agent, cannot freeze.
        let e = act(&mut fake, &freeze, false).expect_err("no guest agent");
        assert_eq!(e.to_string(), "VMI does not have guest agent connected");
        assert!(act(&mut fake, &VmiAction::Reset, true).is_ok());
    }

    #[test]
    fn a_panic_reads_as_a_sentence_not_a_libvirt_value() {
        let o = classify(
            VirState::Shutoff,
            known(Reason::Shutoff(Enum::Known(Shutoff::Crashed))),
        )
        .expect("observed");
        assert_eq!(o.state, DomainState::Crashed);
        let why = o.reason.expect("a reason");
        assert!(
            why.contains("kernel panic") && !why.contains("Known("),
            "{why}"
        );
        let o = classify(
            VirState::Crashed,
            known(Reason::Crashed(Enum::Known(Crashed::Panicked))),
        )
        .expect("observed");
        assert_eq!(o.reason.as_deref(), Some("the guest kernel panicked"));
    }

    #[test]
    fn a_clean_poweroff_is_shutoff_and_a_migration_is_left_to_its_result() {
        let o = classify(
            VirState::Shutoff,
            known(Reason::Shutoff(Enum::Known(Shutoff::Shutdown))),
        )
        .expect("observed");
        assert_eq!((o.state, o.reason), (DomainState::Shutoff, None));
        assert!(
            classify(
                VirState::Shutoff,
                known(Reason::Shutoff(Enum::Known(Shutoff::Migrated)))
            )
            .is_none()
        );
        assert!(
            classify(
                VirState::Paused,
                known(Reason::Paused(Enum::Known(Paused::Migration)))
            )
            .is_none()
        );
        let user = classify(
            VirState::Paused,
            known(Reason::Paused(Enum::Known(Paused::User))),
        )
        .expect("observed");
        assert_eq!(user.state, DomainState::Paused);
    }
}
