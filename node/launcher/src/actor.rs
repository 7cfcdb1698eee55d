//! The libvirt thread. Every libvirt call blocks, so one OS thread owns the daemon, the
//! connection and the domain; async code talks to it through [`DomainHandle`], which
//! sends commands with a oneshot reply. The thread also polls the domain state and
//! publishes it on a `watch` channel (a poll every 100 ms is cheap and does not need
//! libvirt's event loop thread).

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use virt::connect::Connect;
use virt::domain::{Domain, DomainState as VirState};
use virt::enumutil::Enum;
use virt_domain::protocol::DomainState;

use crate::daemon::{DaemonError, PrivateDaemon};

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
    /// The libvirt thread is gone.
    #[error("the libvirt thread has stopped")]
    Gone,
}

fn call<T>(op: &'static str, r: Result<T, virt::error::Error>) -> Result<T, LibvirtError> {
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
}

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

enum Cmd {
    Define(String, Reply<()>),
    Start(Reply<()>),
    Shutdown(Reply<()>),
    Reboot(Reply<()>),
    Destroy(Reply<()>),
    Pause(Reply<()>),
    Resume(Reply<()>),
    Close(Reply<()>),
}

/// Async handle to the libvirt thread. Dropping every handle makes the thread clean up
/// (destroy, undefine, stop the daemon) and exit.
#[derive(Clone, Debug)]
pub struct DomainHandle {
    tx: mpsc::Sender<Cmd>,
    state: watch::Receiver<Observed>,
    versions: Versions,
}

impl std::fmt::Debug for Cmd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cmd")
    }
}

impl DomainHandle {
    /// Starts the thread, the daemon (for [`Target::Private`]) and connects.
    pub async fn spawn(target: Target) -> Result<Self, LibvirtError> {
        Self::spawn_with(move || {
            LibvirtBackend::connect(target).map(|b| Box::new(b) as Box<dyn Backend>)
        })
        .await
    }

    /// Starts the thread with the backend `make` builds on it (tests pass a fake).
    pub async fn spawn_with(
        make: impl FnOnce() -> Result<Box<dyn Backend>, LibvirtError> + Send + 'static,
    ) -> Result<Self, LibvirtError> {
        let (tx, rx) = mpsc::channel();
        let (state_tx, state) = watch::channel(Observed::default());
        let (ready_tx, ready_rx) = oneshot::channel();
        std::thread::Builder::new()
            .name("libvirt".into())
            .spawn(move || thread_main(make, rx, state_tx, ready_tx))
            .map_err(|e| LibvirtError::Call {
                op: "spawn thread",
                message: e.to_string(),
            })?;
        let versions = ready_rx.await.map_err(|_| LibvirtError::Gone)??;
        Ok(Self {
            tx,
            state,
            versions,
        })
    }

    async fn ask(&self, make: impl FnOnce(Reply<()>) -> Cmd) -> Result<(), LibvirtError> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(make(tx)).map_err(|_| LibvirtError::Gone)?;
        rx.await.map_err(|_| LibvirtError::Gone)?
    }

    /// Defines (persistently) the domain from XML.
    pub async fn define(&self, xml: String) -> Result<(), LibvirtError> {
        self.ask(|r| Cmd::Define(xml, r)).await
    }
    /// Starts the defined domain.
    pub async fn start(&self) -> Result<(), LibvirtError> {
        self.ask(Cmd::Start).await
    }
    /// Presses the ACPI power button.
    pub async fn shutdown(&self) -> Result<(), LibvirtError> {
        self.ask(Cmd::Shutdown).await
    }
    /// ACPI reboot.
    pub async fn reboot(&self) -> Result<(), LibvirtError> {
        self.ask(Cmd::Reboot).await
    }
    /// Stops the domain now.
    pub async fn destroy(&self) -> Result<(), LibvirtError> {
        self.ask(Cmd::Destroy).await
    }
    /// Pauses the vCPUs.
    pub async fn pause(&self) -> Result<(), LibvirtError> {
        self.ask(Cmd::Pause).await
    }
    /// Resumes the vCPUs.
    pub async fn resume(&self) -> Result<(), LibvirtError> {
        self.ask(Cmd::Resume).await
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
    /// ACPI reboot.
    fn reboot(&mut self) -> Result<(), LibvirtError>;
    /// Stops it now (no-op when not running).
    fn destroy(&mut self) -> Result<(), LibvirtError>;
    /// Pauses the vCPUs.
    fn suspend(&mut self) -> Result<(), LibvirtError>;
    /// Resumes the vCPUs.
    fn resume(&mut self) -> Result<(), LibvirtError>;
    /// Current state, once started; `None` when there is nothing to report.
    fn observe(&mut self) -> Option<Observed>;
    /// Destroys and undefines the domain and releases the daemon.
    fn cleanup(&mut self);
}

fn thread_main(
    make: impl FnOnce() -> Result<Box<dyn Backend>, LibvirtError>,
    rx: mpsc::Receiver<Cmd>,
    state: watch::Sender<Observed>,
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
            if cur.state == o.state {
                return false;
            }
            *cur = o;
            true
        });
    };
    let mut started = false;
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(Cmd::Close(reply)) => {
                b.cleanup();
                if started {
                    publish(Observed {
                        state: DomainState::Shutoff,
                        reason: None,
                    });
                }
                let _ = reply.send(Ok(()));
                return;
            }
            Ok(Cmd::Define(xml, r)) => {
                let _ = r.send(b.define(&xml));
            }
            Ok(Cmd::Start(r)) => {
                let res = b.start();
                started |= res.is_ok();
                let _ = r.send(res);
            }
            Ok(Cmd::Shutdown(r)) => {
                let _ = r.send(b.shutdown());
            }
            Ok(Cmd::Reboot(r)) => {
                let _ = r.send(b.reboot());
            }
            Ok(Cmd::Destroy(r)) => {
                let _ = r.send(b.destroy());
            }
            Ok(Cmd::Pause(r)) => {
                let _ = r.send(b.suspend());
            }
            Ok(Cmd::Resume(r)) => {
                let _ = r.send(b.resume());
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                tracing::warn!("launcher dropped the libvirt handle; cleaning up");
                b.cleanup();
                return;
            }
        }
        if started && let Some(o) = b.observe() {
            publish(o);
        }
    }
}

/// The real backend: a `virt` connection to a private or given libvirt daemon.
pub struct LibvirtBackend {
    daemon: Option<PrivateDaemon>,
    conn: Option<Connect>,
    domain: Option<Domain>,
    versions: Versions,
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
    pub fn connect(target: Target) -> Result<Self, LibvirtError> {
        let mut b = Self {
            daemon: None,
            conn: None,
            domain: None,
            versions: Versions::default(),
        };
        let uri = match target {
            Target::Uri(u) => u,
            Target::Private {
                dir,
                cache,
                hide_kvm,
            } => {
                let d = PrivateDaemon::start(&dir, &cache, hide_kvm, Duration::from_secs(30))?;
                let uri = d.uri.clone();
                b.daemon = Some(d);
                uri
            }
        };
        // On error `b` drops here and its daemon with it.
        let conn = call("connect", Connect::open(Some(&uri)))?;
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
        self.domain = Some(call("define", conn.define_domain_xml(xml))?);
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
        call(
            "reboot",
            self.dom()?
                .reboot(virt::sys::VIR_DOMAIN_REBOOT_ACPI_POWER_BTN),
        )
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

    fn observe(&mut self) -> Option<Observed> {
        let d = self.domain.as_ref()?;
        let crashed = |reason: String| {
            Some(Observed {
                state: DomainState::Crashed,
                reason: Some(reason),
            })
        };
        match d.state() {
            Ok((Enum::Known(s), reason)) => {
                let state = match s {
                    VirState::Running | VirState::Blocked => DomainState::Running,
                    VirState::Paused | VirState::PMSuspended => DomainState::Paused,
                    VirState::Shutdown => DomainState::ShuttingDown,
                    VirState::Shutoff => {
                        let r = format!("{reason:?}");
                        if r.contains("Crashed") || r.contains("Failed") {
                            return crashed(r);
                        }
                        DomainState::Shutoff
                    }
                    VirState::Crashed => return crashed(format!("{reason:?}")),
                    VirState::NoState => DomainState::Pending,
                };
                Some(Observed {
                    state,
                    reason: None,
                })
            }
            Ok((Enum::Unknown(_), _)) => None,
            // The daemon or QEMU went away under us.
            Err(e) => crashed(e.message().to_string()),
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
