//! virt-handler: one per node. Drives virt-launchers over the typed launcher protocol
//! (`virt_domain::protocol`, JSON lines on a unix socket), turns what they report into
//! VMI status, and re-adopts running launchers after a restart.
//!
//! Two modes:
//! - cluster mode ([`cluster`], [`server`]): launchers run in pods; the handler watches
//!   the VMIs of its node, finds each launcher by VMI uid, writes status to the API
//!   server and serves console/VNC/pause over mTLS.
//! - standalone mode ([`Handler`]): the handler starts launchers itself and keeps their
//!   state on disk under `state_dir/<namespace>_<name>/` (VMI, launcher pid and sockets,
//!   last status), which is what makes re-adoption possible there.

pub mod capabilities;
pub mod client;
pub mod cluster;
pub mod cluster_migration;
pub mod domainstats;
pub mod early;
pub mod hotplug;
pub mod identity;
pub mod launcher_fs;
pub mod metrics;
pub mod migration;
pub mod migration_proxy;
pub mod network;
pub mod probe;
pub mod server;
pub mod status;
pub mod tls;
pub mod vmis;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kubevirt_api::{VirtualMachineInstance, VirtualMachineInstanceStatus};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use virt_domain::domain_name;
use virt_domain::protocol::{DomainEvent, Request, Response, VmiAction};

pub use client::{ClientError, LauncherClient};
pub use status::{Observation, vmi_status};

/// Handler configuration.
#[derive(Clone, Debug)]
pub struct HandlerConfig {
    /// Per-VMI state directories live here.
    pub state_dir: PathBuf,
    /// The virt-launcher binary.
    pub launcher_bin: PathBuf,
    /// Extra launcher arguments (e.g. `--image-dir IMAGE=DIR`).
    pub launcher_args: Vec<String>,
}

/// Errors of handler operations.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// Filesystem trouble in the state directory.
    #[error("{path}: {source}")]
    Io {
        /// Path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The VMI is not known to this handler.
    #[error("VMI {0} is not managed by this handler")]
    Unknown(String),
    /// Talking to the launcher failed.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The launcher refused.
    #[error("launcher: {0}")]
    Launcher(String),
    /// Serialisation failed.
    #[error("serialising: {0}")]
    Json(#[from] serde_json::Error),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> HandlerError + '_ {
    move |source| HandlerError::Io {
        path: path.to_path_buf(),
        source,
    }
}

struct Entry {
    status: watch::Receiver<VirtualMachineInstanceStatus>,
    task: JoinHandle<()>,
    dir: PathBuf,
}

/// The node agent.
#[derive(Clone)]
pub struct Handler {
    cfg: HandlerConfig,
    vmis: Arc<Mutex<BTreeMap<String, Entry>>>,
}

impl std::fmt::Debug for Handler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handler")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl Handler {
    /// A handler with nothing running yet (see [`Handler::adopt`]).
    pub fn new(cfg: HandlerConfig) -> Self {
        Self {
            cfg,
            vmis: Arc::default(),
        }
    }

    fn dir_of(&self, key: &str) -> PathBuf {
        self.cfg.state_dir.join(key)
    }

    fn client(&self, key: &str) -> LauncherClient {
        LauncherClient::at(
            launcher_fs::LauncherDir::new(launcher_fs::Location::Host(self.dir_of(key))),
            "launcher.sock",
        )
    }

    /// Starts a launcher for `vmi`; returns its key (`namespace_name`).
    pub async fn start(&self, vmi: &VirtualMachineInstance) -> Result<String, HandlerError> {
        let key = domain_name(vmi);
        let dir = self.dir_of(&key);
        let work = dir.join("work");
        tokio::fs::create_dir_all(&work)
            .await
            .map_err(io_err(&work))?;
        let vmi_file = dir.join("vmi.json");
        tokio::fs::write(&vmi_file, serde_json::to_vec_pretty(vmi)?)
            .await
            .map_err(io_err(&vmi_file))?;
        let log_path = dir.join("launcher.log");
        let log = std::fs::File::create(&log_path).map_err(io_err(&log_path))?;
        let log2 = log.try_clone().map_err(io_err(&log_path))?;
        let child = tokio::process::Command::new(&self.cfg.launcher_bin)
            .arg("--vmi")
            .arg(&vmi_file)
            .arg("--console-socket")
            .arg(dir.join("console.sock"))
            .arg("--cmd-socket")
            .arg(dir.join("launcher.sock"))
            .arg("--work-dir")
            .arg(&work)
            .args(&self.cfg.launcher_args)
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(log2)
            // Launchers outlive a handler restart; that is what re-adoption relies on.
            .kill_on_drop(false)
            .spawn()
            .map_err(io_err(&self.cfg.launcher_bin))?;
        let pid = child.id().unwrap_or(0);
        let pid_file = dir.join("launcher.pid");
        tokio::fs::write(&pid_file, pid.to_string())
            .await
            .map_err(io_err(&pid_file))?;
        tracing::info!(vmi = %key, pid, "launcher started");
        self.monitor(
            key.clone(),
            dir,
            pid,
            Some(child),
            VirtualMachineInstanceStatus::default(),
        );
        Ok(key)
    }

    /// Re-attaches to the launchers recorded in the state directory. Launchers that are
    /// gone while their VMI had not ended are reported Failed.
    pub async fn adopt(&self) -> Result<Vec<String>, HandlerError> {
        let mut adopted = Vec::new();
        let mut rd = match tokio::fs::read_dir(&self.cfg.state_dir).await {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(adopted),
            Err(e) => {
                return Err(HandlerError::Io {
                    path: self.cfg.state_dir.clone(),
                    source: e,
                });
            }
        };
        while let Some(e) = rd.next_entry().await.map_err(io_err(&self.cfg.state_dir))? {
            let dir = e.path();
            let Some(key) = e.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if self
                .vmis
                .lock()
                .map(|m| m.contains_key(&key))
                .unwrap_or(true)
            {
                continue;
            }
            let Ok(pid) = tokio::fs::read_to_string(dir.join("launcher.pid")).await else {
                continue;
            };
            let Ok(pid) = pid.trim().parse::<u32>() else {
                continue;
            };
            let prev: VirtualMachineInstanceStatus = tokio::fs::read(dir.join("status.json"))
                .await
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or_default();
            if prev.phase.is_final() {
                continue;
            }
            tracing::info!(vmi = %key, pid, alive = pid_alive(pid), "adopting launcher");
            self.monitor(key.clone(), dir, pid, None, prev);
            adopted.push(key);
        }
        Ok(adopted)
    }

    fn monitor(
        &self,
        key: String,
        dir: PathBuf,
        pid: u32,
        child: Option<tokio::process::Child>,
        prev: VirtualMachineInstanceStatus,
    ) {
        let (tx, rx) = watch::channel(prev);
        let client = self.client(&key);
        let task = tokio::spawn(monitor(client, dir.clone(), pid, child, tx));
        if let Ok(mut m) = self.vmis.lock()
            && let Some(old) = m.insert(
                key,
                Entry {
                    status: rx,
                    task,
                    dir,
                },
            )
        {
            old.task.abort();
        }
    }

    /// Status updates of a VMI.
    pub fn subscribe(
        &self,
        key: &str,
    ) -> Result<watch::Receiver<VirtualMachineInstanceStatus>, HandlerError> {
        let m = self
            .vmis
            .lock()
            .map_err(|_| HandlerError::Unknown(key.into()))?;
        m.get(key)
            .map(|e| e.status.clone())
            .ok_or_else(|| HandlerError::Unknown(key.into()))
    }

    /// Current status of a VMI.
    pub fn status(&self, key: &str) -> Result<VirtualMachineInstanceStatus, HandlerError> {
        Ok(self.subscribe(key)?.borrow().clone())
    }

    async fn simple(&self, key: &str, req: Request) -> Result<(), HandlerError> {
        if !self
            .vmis
            .lock()
            .map(|m| m.contains_key(key))
            .unwrap_or(false)
        {
            return Err(HandlerError::Unknown(key.into()));
        }
        match self.client(key).call(&req).await? {
            Response::Ok => Ok(()),
            Response::Error { message } => Err(HandlerError::Launcher(message)),
            other => Err(HandlerError::Launcher(format!(
                "unexpected reply {other:?}"
            ))),
        }
    }

    /// Pauses the guest.
    pub async fn pause(&self, key: &str) -> Result<(), HandlerError> {
        self.simple(key, Request::Action(VmiAction::Pause)).await
    }
    /// Resumes the guest.
    pub async fn unpause(&self, key: &str) -> Result<(), HandlerError> {
        self.simple(key, Request::Action(VmiAction::Unpause)).await
    }
    /// ACPI reboot.
    pub async fn soft_reboot(&self, key: &str) -> Result<(), HandlerError> {
        self.simple(key, Request::Action(VmiAction::SoftReboot))
            .await
    }
    /// Graceful shutdown (ACPI, then destroy after the grace period).
    pub async fn shutdown(&self, key: &str) -> Result<(), HandlerError> {
        self.simple(key, Request::Shutdown).await
    }
    /// Immediate stop.
    pub async fn kill(&self, key: &str) -> Result<(), HandlerError> {
        self.simple(key, Request::Kill).await
    }

    /// Stops watching (the launchers keep running), as a handler restart would.
    pub fn detach(&self) {
        if let Ok(mut m) = self.vmis.lock() {
            for (_, e) in std::mem::take(&mut *m) {
                e.task.abort();
            }
        }
    }

    /// State directory of a VMI.
    pub fn dir(&self, key: &str) -> Option<PathBuf> {
        self.vmis
            .lock()
            .ok()
            .and_then(|m| m.get(key).map(|e| e.dir.clone()))
    }
}

/// Whether a process exists and is not a zombie.
pub fn pid_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| !r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

fn publish(tx: &watch::Sender<VirtualMachineInstanceStatus>, dir: &Path, obs: &Observation) {
    let next = vmi_status(&tx.borrow(), obs);
    if let Ok(bytes) = serde_json::to_vec_pretty(&next) {
        let _ = std::fs::write(dir.join("status.json"), bytes);
    }
    tracing::info!(dir = %dir.display(), phase = next.phase.as_str(), "VMI status");
    tx.send_replace(next);
}

/// Follows one launcher until its VMI reaches a final phase.
async fn monitor(
    client: LauncherClient,
    dir: PathBuf,
    pid: u32,
    mut child: Option<tokio::process::Child>,
    tx: watch::Sender<VirtualMachineInstanceStatus>,
) {
    let died = |child: &mut Option<tokio::process::Child>| -> Option<String> {
        match child {
            Some(c) => match c.try_wait() {
                Ok(Some(st)) => Some(describe_exit(st)),
                Ok(None) => None,
                Err(e) => Some(e.to_string()),
            },
            None => (!pid_alive(pid)).then(|| format!("launcher process {pid} is gone")),
        }
    };
    if tx.borrow().phase == kubevirt_api::VirtualMachineInstancePhase::Unset {
        publish(&tx, &dir, &Observation::Starting);
    }
    loop {
        // Wait for the launcher to answer (it may still be preparing volumes).
        loop {
            if let Ok(Response::Status(s)) = client.call(&Request::GetStatus).await
                && s.state != virt_domain::protocol::DomainState::Pending
            {
                publish(&tx, &dir, &Observation::Launcher(s));
                break;
            }
            if let Some(reason) = died(&mut child) {
                return launcher_gone(&tx, &dir, &mut child, reason).await;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut events = match client.watch().await {
            Ok(ev) => ev,
            Err(_) => continue,
        };
        loop {
            match events.next().await {
                Ok(Some(DomainEvent::ShutDown)) => {
                    publish(&tx, &dir, &Observation::ShutDown);
                    return reap(&mut child).await;
                }
                Ok(Some(DomainEvent::Crashed { reason })) => {
                    publish(&tx, &dir, &Observation::Crashed(reason));
                    return reap(&mut child).await;
                }
                Ok(Some(_)) => {
                    if let Ok(Response::Status(s)) = client.call(&Request::GetStatus).await {
                        publish(&tx, &dir, &Observation::Launcher(s));
                    }
                }
                Ok(None) | Err(_) => break,
            }
        }
        // The event stream broke: either the launcher died or it is exiting.
        for _ in 0..40 {
            if let Some(reason) = died(&mut child) {
                return launcher_gone(&tx, &dir, &mut child, reason).await;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn reap(child: &mut Option<tokio::process::Child>) {
    if let Some(c) = child {
        let _ = tokio::time::timeout(Duration::from_secs(60), c.wait()).await;
    }
}

async fn launcher_gone(
    tx: &watch::Sender<VirtualMachineInstanceStatus>,
    dir: &Path,
    child: &mut Option<tokio::process::Child>,
    reason: String,
) {
    reap(child).await;
    // A killed launcher cannot clean up after itself; its daemon and QEMU died with it
    // (PID namespace), its files are ours to remove.
    let _ = tokio::fs::remove_dir_all(dir.join("work")).await;
    for s in ["console.sock", "launcher.sock"] {
        let _ = tokio::fs::remove_file(dir.join(s)).await;
    }
    publish(tx, dir, &Observation::LauncherDied(reason));
}

fn describe_exit(st: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (_, Some(sig)) => format!("launcher killed by signal {sig}"),
        (Some(c), _) => format!("launcher exited with code {c}"),
        _ => "launcher exited".into(),
    }
}

/// Everything cluster mode needs.
pub struct NodeOptions {
    /// API server client.
    pub client: kube::Client,
    /// Node, socket layout.
    pub cluster: cluster::ClusterConfig,
    /// Where the HTTPS server listens.
    pub listener: tokio::net::TcpListener,
    /// Its TLS configuration.
    pub tls: tls::TlsSource,
    /// Websocket ping interval.
    pub ping_every: Duration,
    /// Where `/metrics` is served (plain HTTP); not served when `None`.
    pub metrics_listener: Option<tokio::net::TcpListener>,
}

impl std::fmt::Debug for NodeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeOptions")
            .field("cluster", &self.cluster)
            .field("listener", &self.listener)
            .field("ping_every", &self.ping_every)
            .finish_non_exhaustive()
    }
}

/// Runs cluster mode (VMI watch + HTTPS server) until `shutdown` or until either part
/// fails. Launchers keep running afterwards.
pub async fn run_node(
    opts: NodeOptions,
    shutdown: tokio_util::sync::CancellationToken,
) -> Result<(), NodeError> {
    let registry = vmis::Registry::default();
    let known = network::KnownVmis::default();
    let metrics = std::sync::Arc::new(metrics::Metrics::default());
    let state = server::AppState::new(
        registry.clone(),
        known.clone(),
        opts.cluster.paths.clone(),
        opts.ping_every,
        metrics.clone(),
    );
    if let Some(l) = opts.metrics_listener {
        tracing::info!(addr = ?l.local_addr().ok(), "metrics server listening");
        let (m, stop) = (metrics.clone(), shutdown.clone());
        tokio::spawn(async move {
            if let Err(e) = metrics::serve(l, m, stop).await {
                tracing::error!(error = %e, "metrics server failed");
            }
        });
    }
    let addr = opts.listener.local_addr().ok();
    tracing::info!(?addr, "HTTPS server listening");
    let srv = server::serve(
        opts.listener,
        opts.tls,
        server::router(state),
        shutdown.clone(),
    );
    let watch = cluster::run(
        opts.client,
        opts.cluster,
        registry,
        known,
        metrics,
        shutdown.clone(),
    );
    let r = tokio::select! {
        r = srv => r.map_err(NodeError::Serve),
        r = watch => r.map_err(NodeError::Cluster),
    };
    shutdown.cancel();
    r
}

/// Why cluster mode stopped.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The HTTPS server failed.
    #[error("HTTPS server")]
    Serve(#[source] std::io::Error),
    /// The VMI watch failed.
    #[error(transparent)]
    Cluster(#[from] cluster::ClusterError),
}
