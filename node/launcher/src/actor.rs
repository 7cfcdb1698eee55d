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
        let (tx, rx) = mpsc::channel();
        let (state_tx, state) = watch::channel(Observed::default());
        let (ready_tx, ready_rx) = oneshot::channel();
        std::thread::Builder::new()
            .name("libvirt".into())
            .spawn(move || thread_main(target, rx, state_tx, ready_tx))
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

struct Thread {
    daemon: Option<PrivateDaemon>,
    conn: Option<Connect>,
    domain: Option<Domain>,
    started: bool,
    state: watch::Sender<Observed>,
}

fn thread_main(
    target: Target,
    rx: mpsc::Receiver<Cmd>,
    state: watch::Sender<Observed>,
    ready: oneshot::Sender<Result<Versions, LibvirtError>>,
) {
    let mut t = Thread {
        daemon: None,
        conn: None,
        domain: None,
        started: false,
        state,
    };
    match t.connect(target) {
        Ok(v) => {
            let _ = ready.send(Ok(v));
        }
        Err(e) => {
            t.cleanup();
            let _ = ready.send(Err(e));
            return;
        }
    }
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(Cmd::Close(reply)) => {
                t.cleanup();
                let _ = reply.send(Ok(()));
                return;
            }
            Ok(cmd) => t.handle(cmd),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                tracing::warn!("launcher dropped the libvirt handle; cleaning up");
                t.cleanup();
                return;
            }
        }
        t.poll();
    }
}

impl Thread {
    fn connect(&mut self, target: Target) -> Result<Versions, LibvirtError> {
        let uri = match target {
            Target::Uri(u) => u,
            Target::Private {
                dir,
                cache,
                hide_kvm,
            } => {
                let d = PrivateDaemon::start(&dir, &cache, hide_kvm, Duration::from_secs(30))?;
                let uri = d.uri.clone();
                self.daemon = Some(d);
                uri
            }
        };
        let conn = call("connect", Connect::open(Some(&uri)))?;
        let versions = Versions {
            libvirt: conn.lib_version().map(version_string).unwrap_or_default(),
            qemu: conn.hyp_version().map(version_string).unwrap_or_default(),
            daemon_pid: self.daemon.as_ref().map(PrivateDaemon::pid),
        };
        self.conn = Some(conn);
        Ok(versions)
    }

    fn dom(&self) -> Result<&Domain, LibvirtError> {
        self.domain.as_ref().ok_or(LibvirtError::NoDomain)
    }

    fn handle(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Define(xml, r) => {
                let res = match &self.conn {
                    Some(c) => call("define", c.define_domain_xml(&xml)).map(|d| {
                        self.domain = Some(d);
                    }),
                    None => Err(LibvirtError::Gone),
                };
                let _ = r.send(res);
            }
            Cmd::Start(r) => {
                let res = self.dom().and_then(|d| call("start", d.create()));
                if res.is_ok() {
                    self.started = true;
                }
                let _ = r.send(res);
            }
            Cmd::Shutdown(r) => {
                let res = self.dom().and_then(|d| {
                    call(
                        "shutdown",
                        d.shutdown_flags(virt::sys::VIR_DOMAIN_SHUTDOWN_ACPI_POWER_BTN),
                    )
                });
                let _ = r.send(res);
            }
            Cmd::Reboot(r) => {
                let res = self.dom().and_then(|d| {
                    call(
                        "reboot",
                        d.reboot(virt::sys::VIR_DOMAIN_REBOOT_ACPI_POWER_BTN),
                    )
                });
                let _ = r.send(res);
            }
            Cmd::Destroy(r) => {
                let res = self.dom().and_then(|d| match d.is_active() {
                    Ok(false) => Ok(()),
                    _ => call("destroy", d.destroy()),
                });
                let _ = r.send(res);
            }
            Cmd::Pause(r) => {
                let _ = r.send(self.dom().and_then(|d| call("suspend", d.suspend())));
            }
            Cmd::Resume(r) => {
                let _ = r.send(self.dom().and_then(|d| call("resume", d.resume())));
            }
            Cmd::Close(r) => {
                self.cleanup();
                let _ = r.send(Ok(()));
            }
        }
    }

    fn poll(&mut self) {
        if !self.started {
            return;
        }
        let Some(d) = &self.domain else { return };
        let observed = match d.state() {
            Ok((Enum::Known(s), reason)) => {
                let state = match s {
                    VirState::Running | VirState::Blocked => DomainState::Running,
                    VirState::Paused | VirState::PMSuspended => DomainState::Paused,
                    VirState::Shutdown => DomainState::ShuttingDown,
                    VirState::Shutoff => {
                        let r = format!("{reason:?}");
                        if r.contains("Crashed") || r.contains("Failed") {
                            return self.publish(DomainState::Crashed, Some(r));
                        }
                        DomainState::Shutoff
                    }
                    VirState::Crashed => {
                        return self.publish(DomainState::Crashed, Some(format!("{reason:?}")));
                    }
                    VirState::NoState => DomainState::Pending,
                };
                Observed {
                    state,
                    reason: None,
                }
            }
            Ok((Enum::Unknown(_), _)) => return,
            // The daemon or QEMU went away under us.
            Err(e) => Observed {
                state: DomainState::Crashed,
                reason: Some(e.message().to_string()),
            },
        };
        self.publish(observed.state, observed.reason);
    }

    fn publish(&self, state: DomainState, reason: Option<String>) {
        self.state.send_if_modified(|o| {
            if o.state == state {
                return false;
            }
            *o = Observed { state, reason };
            true
        });
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
            if self.started {
                self.publish(DomainState::Shutoff, None);
            }
        }
        drop(self.conn.take());
        if let Some(mut d) = self.daemon.take() {
            d.stop();
        }
    }
}
