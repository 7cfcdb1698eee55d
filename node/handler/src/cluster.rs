//! Cluster mode: the VMIs of this node come from the API server (watch with
//! `fieldSelector=status.nodeName=<node>`), their launchers are found by the pod uid the
//! VMI's `status.activePods` names for this node (cluster-flow.md §1, [`Paths`]), and what
//! the launchers report is written back as JSON merge patches to `/status` (§3).
//!
//! Nothing is kept in memory that a restart could lose: the VMI comes from the API
//! server, the guest's state from its launcher. A new handler simply reconnects.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use kubevirt_api::{
    VirtualMachineInstance, VirtualMachineInstancePhase as Phase, VirtualMachineInstanceStatus,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use virt_domain::protocol::{
    DomainEvent, DomainState, LauncherOutcome, OUTCOME_FILE, Request, Response,
};

use crate::client::{ClientError, LauncherClient};
use crate::launcher_fs::LauncherDir;
use crate::metrics::Metrics;
use crate::status::{
    Observation, stamp_phase, status_patch, vmi_status, with_guest_agent, with_pod_interface,
};
use crate::vmis::{Paths, Registry};

/// How long a launcher that was running may fail to answer before it counts as gone.
/// Short: a live launcher answers within milliseconds, and a `kill -9` leaves a socket
/// file that refuses connections at once.
const GONE_AFTER: Duration = Duration::from_secs(2);
/// Poll interval while waiting for a launcher's socket to come up.
const POLL: Duration = Duration::from_millis(200);
/// The most of a launcher's outcome file that is read.
const OUTCOME_LIMIT: u64 = 64 * 1024;

/// Cluster-mode configuration.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// This node (`spec.nodeName` of the handler pod).
    pub node_name: String,
    /// How launchers are reached.
    pub paths: Paths,
    /// This node's probed QEMU capabilities, copied into each launcher's own cache
    /// ([`crate::capabilities`]); `None`: launchers probe QEMU themselves.
    pub capabilities: Option<PathBuf>,
    /// Live migration: this handler's address and certificates; without it the node
    /// neither sends nor receives migrations.
    pub migration: Option<crate::cluster_migration::MigrationConfig>,
}

/// Why cluster mode stopped.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The socket root cannot be created.
    #[error("{path}: {source}")]
    Io {
        /// Path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
}

struct Monitor {
    vmi: watch::Sender<VirtualMachineInstance>,
    task: JoinHandle<()>,
    ns: String,
    name: String,
    /// The launcher ([`Paths::launcher_key`]: its pod's uid).
    key: String,
    /// Its sockets directory.
    dir: LauncherDir,
}

/// A migration this handler takes part in, as source or target.
struct Migration {
    uid: String,
    vmi: watch::Sender<VirtualMachineInstance>,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl Drop for Migration {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the watch loop keeps: launcher monitors and migrations by VMI uid.
#[derive(Default)]
struct Node {
    monitors: HashMap<String, Monitor>,
    outgoing: HashMap<String, Migration>,
    incoming: HashMap<String, Migration>,
}

/// Watches this node's VMIs until `shutdown`, one monitor task per VMI. Launchers are
/// never touched on the way out: they keep running and the next handler re-adopts them.
pub async fn run(
    client: Client,
    cfg: ClusterConfig,
    registry: Registry,
    vmis: crate::network::KnownVmis,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> Result<(), ClusterError> {
    if let Paths::Host { run_root } = &cfg.paths {
        let sockets = run_root.join("sockets");
        tokio::fs::create_dir_all(&sockets)
            .await
            .map_err(|source| ClusterError::Io {
                path: sockets.clone(),
                source,
            })?;
    }
    let all: Api<VirtualMachineInstance> = Api::all(client.clone());
    let selector = format!("status.nodeName={}", cfg.node_name);
    let stream = virt_watch::watch(
        all.clone(),
        watcher::Config::default().fields(&selector),
        "vmis",
        metrics.watches.clone(),
    );
    tokio::pin!(stream);
    // VMIs migrating to this node (their nodeName is still the source's).
    let label = format!(
        "{}={}",
        crate::cluster_migration::TARGET_NODE_LABEL,
        cfg.node_name
    );
    let incoming = virt_watch::watch(
        all,
        watcher::Config::default().labels(&label),
        "incoming-migrations",
        metrics.watches.clone(),
    );
    tokio::pin!(incoming);
    tokio::spawn(crate::network::run(
        cfg.paths.clone(),
        cfg.node_name.clone(),
        cfg.capabilities.clone(),
        vmis.clone(),
        shutdown.child_token(),
    ));
    tokio::spawn(crate::hotplug::run(
        client.clone(),
        cfg.node_name.clone(),
        cfg.paths.clone(),
        vmis.clone(),
        shutdown.child_token(),
    ));
    if matches!(cfg.paths, Paths::Pods { .. }) {
        tokio::spawn(crate::early::run(
            client.clone(),
            cfg.node_name.clone(),
            vmis.clone(),
            metrics.watches.clone(),
            shutdown.child_token(),
        ));
    }
    let mut node = Node::default();
    let mut listed: HashSet<String> = HashSet::new();
    let mut listed_in: HashSet<String> = HashSet::new();
    tracing::info!(node = %cfg.node_name, paths = ?cfg.paths, "watching VMIs of this node");
    loop {
        let ev = tokio::select! {
            _ = shutdown.cancelled() => break,
            ev = incoming.next() => {
                match ev {
                    Some(Ok(Event::Init)) => listed_in.clear(),
                    Some(Ok(Event::InitApply(vmi))) => {
                        if let Some(uid) = vmi.uid() {
                            listed_in.insert(uid);
                        }
                        vmis.insert(&vmi);
                        apply_incoming(&client, &cfg, &mut node, vmi);
                    }
                    Some(Ok(Event::Apply(vmi))) => {
                        vmis.insert(&vmi);
                        apply_incoming(&client, &cfg, &mut node, vmi);
                    }
                    Some(Ok(Event::Delete(vmi))) => {
                        if let Some(uid) = vmi.uid() {
                            node.incoming.remove(&uid);
                        }
                    }
                    Some(Ok(Event::InitDone)) => node.incoming.retain(|u, _| listed_in.contains(u)),
                    Some(Err(e)) => tracing::warn!(error = %e, "incoming migration watch failed; retrying"),
                    None => break,
                }
                continue;
            }
            ev = stream.next() => ev,
        };
        let Some(ev) = ev else { break };
        let m = &metrics;
        match ev {
            Ok(Event::Init) => listed.clear(),
            Ok(Event::InitApply(vmi)) => {
                if let Some(uid) = vmi.uid() {
                    listed.insert(uid);
                }
                vmis.insert(&vmi);
                apply(&client, &cfg, &registry, m, &mut node, vmi);
            }
            Ok(Event::Apply(vmi)) => {
                vmis.insert(&vmi);
                apply(&client, &cfg, &registry, m, &mut node, vmi);
            }
            Ok(Event::Delete(vmi)) => {
                if let Some(uid) = vmi.uid() {
                    vmis.remove(&uid);
                    gone(&registry, &metrics, &mut node, &uid);
                }
            }
            Ok(Event::InitDone) => {
                // VMIs deleted while the watch was down never get a Delete event.
                let stale: Vec<String> = node
                    .monitors
                    .keys()
                    .filter(|u| !listed.contains(*u))
                    .cloned()
                    .collect();
                for uid in stale {
                    gone(&registry, &metrics, &mut node, &uid);
                }
            }
            Err(e) => tracing::warn!(error = %e, "VMI watch failed; retrying"),
        }
        metrics.vmis.set(node.monitors.len() as i64);
    }
    for (_, m) in node.monitors {
        m.task.abort();
    }
    // Migrations in flight end with the handler (their proxies close): each fails and
    // the guest stays on its source.
    Ok(())
}

fn apply(
    client: &Client,
    cfg: &ClusterConfig,
    registry: &Registry,
    metrics: &Arc<Metrics>,
    node: &mut Node,
    vmi: VirtualMachineInstance,
) {
    let (Some(uid), Some(ns)) = (vmi.uid(), vmi.namespace()) else {
        return;
    };
    let name = vmi.name_any();
    if let Some(mcfg) = &cfg.migration {
        source_migration(client, cfg, mcfg, node, &uid, &ns, &vmi);
    }
    if let Some(m) = node.monitors.get(&uid)
        && !m.task.is_finished()
    {
        metrics.set_target(&uid, vmi_target(cfg, &vmi, &ns, &name, &m.dir));
        registry.insert(ns.clone(), name.clone(), m.key.clone());
        m.vmi.send_replace(vmi);
        return;
    }
    // A finished monitor keeps its launcher (a source whose guest left stays there until
    // the VMI moves); a new one finds it from the VMI, once the VMI names it.
    let (key, dir) = match node.monitors.get(&uid) {
        Some(m) => (m.key.clone(), m.dir.clone()),
        None => match cfg.paths.launcher_key(&uid, &vmi, &cfg.node_name) {
            Some(key) => {
                let dir = cfg.paths.launcher(&key);
                (key, dir)
            }
            None => {
                tracing::debug!(%ns, %name, "the VMI names no launcher pod on this node yet");
                return;
            }
        },
    };
    registry.insert(ns.clone(), name.clone(), key.clone());
    metrics.set_target(&uid, vmi_target(cfg, &vmi, &ns, &name, &dir));
    let (tx, rx) = watch::channel(vmi);
    let w = StatusWriter {
        api: Api::namespaced(client.clone(), &ns),
        name: name.clone(),
        vmi: rx,
        metrics: metrics.clone(),
        probe_ready: None,
    };
    let launcher = LauncherClient::new(dir.clone());
    let span = tracing::info_span!("vmi", %ns, %name, %uid, launcher = %key);
    let task = tokio::spawn(tracing::Instrument::instrument(monitor(w, launcher), span));
    node.monitors.insert(
        uid,
        Monitor {
            vmi: tx,
            task,
            ns,
            name,
            key,
            dir,
        },
    );
}

/// What `/metrics` reads a VMI's statistics from and labels them with.
fn vmi_target(
    cfg: &ClusterConfig,
    vmi: &VirtualMachineInstance,
    ns: &str,
    name: &str,
    dir: &LauncherDir,
) -> crate::metrics::VmiTarget {
    crate::metrics::VmiTarget {
        id: crate::domainstats::VmiIdentity {
            node: cfg.node_name.clone(),
            namespace: ns.to_string(),
            name: name.to_string(),
            labels: vmi.metadata.labels.clone().unwrap_or_default(),
        },
        dir: dir.clone(),
    }
}

/// Starts or cancels this node's outgoing migration of `vmi` (cluster-flow.md §6.3).
fn source_migration(
    client: &Client,
    cfg: &ClusterConfig,
    mcfg: &crate::cluster_migration::MigrationConfig,
    node: &mut Node,
    uid: &str,
    ns: &str,
    vmi: &VirtualMachineInstance,
) {
    use crate::cluster_migration::{SourceStep, source_step};
    let Some(ms) = vmi.status.as_ref().and_then(|s| s.migration_state.as_ref()) else {
        return;
    };
    let running = node
        .outgoing
        .get(uid)
        .filter(|m| !m.task.is_finished())
        .map(|m| m.uid.clone());
    if let Some(m) = node.outgoing.get(uid) {
        m.vmi.send_replace(vmi.clone());
    }
    let step = source_step(ms, &cfg.node_name, running.as_deref());
    match step.clone() {
        SourceStep::Nothing => {}
        SourceStep::Cancel { uid: muid } => {
            if let Some(m) = node.outgoing.get(uid)
                && !m.cancel.is_cancelled()
            {
                tracing::info!(%ns, name = %vmi.name_any(), migration = %muid, "abort requested");
                m.cancel.cancel();
            }
        }
        SourceStep::Start { uid: muid, .. } | SourceStep::Follow { uid: muid } => {
            // A migration this handler already ran or followed (the VMI may lag behind our
            // writes): following is only for what a previous handler started.
            if node.outgoing.get(uid).is_some_and(|m| m.uid == muid) {
                return;
            }
            let dir = match node.monitors.get(uid) {
                Some(m) => m.dir.clone(),
                None => match cfg.paths.launcher_key(uid, vmi, &cfg.node_name) {
                    Some(key) => cfg.paths.launcher(&key),
                    None => return,
                },
            };
            let (tx, rx) = watch::channel(vmi.clone());
            let cancel = CancellationToken::new();
            let api = Api::namespaced(client.clone(), ns);
            let span = tracing::info_span!("migration", %ns, name = %vmi.name_any(), migration = %muid, role = "source");
            let work: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> = match step {
                SourceStep::Start {
                    address,
                    target_node,
                    ..
                } => Box::pin(crate::cluster_migration::outgoing(
                    api,
                    vmi.name_any(),
                    muid.clone(),
                    (address, target_node),
                    dir,
                    mcfg.clone(),
                    rx,
                    cancel.clone(),
                )),
                _ => Box::pin(crate::cluster_migration::follow(
                    api,
                    vmi.name_any(),
                    muid.clone(),
                    dir,
                    rx,
                    cancel.clone(),
                )),
            };
            let task = tokio::spawn(tracing::Instrument::instrument(work, span));
            node.outgoing.insert(
                uid.to_string(),
                Migration {
                    uid: muid,
                    vmi: tx,
                    cancel,
                    task,
                },
            );
        }
    }
}

/// Prepares this node as the target of `vmi`'s migration (cluster-flow.md §6.3).
fn apply_incoming(
    client: &Client,
    cfg: &ClusterConfig,
    node: &mut Node,
    vmi: VirtualMachineInstance,
) {
    let (Some(uid), Some(ns)) = (vmi.uid(), vmi.namespace()) else {
        return;
    };
    let Some(mcfg) = &cfg.migration else {
        return;
    };
    if let Some(m) = node.incoming.get(&uid) {
        m.vmi.send_replace(vmi.clone());
    }
    let Some(muid) = vmi
        .status
        .as_ref()
        .and_then(|s| s.migration_state.as_ref())
        .and_then(|ms| crate::cluster_migration::incoming_migration(ms, &cfg.node_name))
        .map(str::to_string)
    else {
        return;
    };
    if node.incoming.get(&uid).is_some_and(|m| m.uid == muid) {
        return;
    }
    // The target pod is named once it launched (virt-controller records its node then);
    // until that, the next update of the VMI tries again.
    let Some(key) = cfg.paths.target_key(&uid, &vmi, &muid, &cfg.node_name) else {
        return;
    };
    let dir = cfg.paths.launcher(&key);
    let (tx, rx) = watch::channel(vmi.clone());
    let span = tracing::info_span!("migration", %ns, name = %vmi.name_any(), migration = %muid, role = "target");
    let task = tokio::spawn(tracing::Instrument::instrument(
        crate::cluster_migration::incoming(
            Api::namespaced(client.clone(), &ns),
            vmi.name_any(),
            muid.clone(),
            dir,
            mcfg.clone(),
            rx,
        ),
        span,
    ));
    node.incoming.insert(
        uid,
        Migration {
            uid: muid,
            vmi: tx,
            cancel: CancellationToken::new(),
            task,
        },
    );
}

fn gone(registry: &Registry, metrics: &Metrics, node: &mut Node, uid: &str) {
    metrics.remove_target(uid);
    if let Some(m) = node.monitors.remove(uid) {
        m.task.abort();
        registry.remove(&m.ns, &m.name, &m.key);
        tracing::info!(ns = %m.ns, name = %m.name, %uid, "VMI left this node");
    }
    node.outgoing.remove(uid);
}

/// Writes status observations of one VMI.
struct StatusWriter {
    api: Api<VirtualMachineInstance>,
    name: String,
    vmi: watch::Receiver<VirtualMachineInstance>,
    metrics: Arc<Metrics>,
    /// The readiness probe's verdict (`None`: no probe the handler runs, or not yet run).
    probe_ready: Option<bool>,
}

impl StatusWriter {
    fn status(&self) -> VirtualMachineInstanceStatus {
        self.vmi.borrow().status.clone().unwrap_or_default()
    }

    /// Computes the status for `obs` from the latest VMI and patches what changed. Retries
    /// for a while: a status the API server never got would otherwise be lost until the
    /// launcher's next event.
    async fn observe(&mut self, obs: &Observation) {
        let prev = self.status();
        let mut next = vmi_status(&prev, obs);
        if let Observation::Launcher(l) = obs {
            let vmi = self.vmi.borrow().clone();
            next = with_pod_interface(next, &vmi, l.pod_ip.as_deref());
            next = with_guest_agent(next, &vmi, l);
            // A VMI with a readiness probe is not Ready until the probe passes.
            let probed = vmi
                .spec
                .readiness_probe
                .as_ref()
                .and_then(crate::probe::request)
                .is_some();
            next = crate::status::with_readiness(
                next,
                probed.then_some(self.probe_ready == Some(true)),
            );
            next = with_live_migratable(next, &vmi);
        }
        let next = stamp_phase(&prev, next, k8s_openapi::jiff::Timestamp::now());
        let Some(patch) = status_patch(&prev, &next) else {
            return;
        };
        let mut delay = Duration::from_millis(200);
        for attempt in 1..=10 {
            let started = Instant::now();
            match self
                .api
                .patch_status(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.metrics.status_write(true);
                    tracing::info!(
                        phase = next.phase.as_str(),
                        reason = next.reason.as_deref().unwrap_or(""),
                        took_ms = started.elapsed().as_millis() as u64,
                        "VMI status written"
                    );
                    return;
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    tracing::info!("VMI is gone; status not written");
                    return;
                }
                Err(e) => {
                    self.metrics.status_write(false);
                    tracing::warn!(error = %e, attempt, "writing VMI status failed");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}

/// The `LiveMigratable` condition of a running VMI (cluster-flow.md §6.5): virt-apiserver
/// refuses `migrate` with its reason when False.
fn with_live_migratable(
    mut s: VirtualMachineInstanceStatus,
    vmi: &VirtualMachineInstance,
) -> VirtualMachineInstanceStatus {
    use kubevirt_api::common::{Condition, ConditionStatus, set_condition};
    let cond = match kubevirt_api::live_migratable(vmi) {
        Ok(_) => Condition::new(
            kubevirt_api::vmi::condition_types::LIVE_MIGRATABLE,
            ConditionStatus::True,
            "",
            "",
        ),
        Err(e) => Condition::new(
            kubevirt_api::vmi::condition_types::LIVE_MIGRATABLE,
            ConditionStatus::False,
            e.reason,
            &e.message,
        ),
    };
    let mut conds = s.conditions.take().unwrap_or_default();
    set_condition(&mut conds, cond);
    s.conditions = Some(conds);
    s
}

/// Follows the launcher of one VMI until the VMI is final: waits for its socket, reports
/// its state, follows its events, and reports it gone when its socket stops answering.
async fn monitor(mut w: StatusWriter, launcher: LauncherClient) {
    // Whether the launcher answered during this handler's life; together with the phase
    // (a previous handler saw it run) it tells "not started yet" from "gone".
    let mut answered = false;
    let mut failing_since: Option<Instant> = None;
    loop {
        if w.status().phase.is_final() {
            tracing::debug!("VMI is final; nothing to follow");
            return;
        }
        match launcher.call(&Request::GetStatus).await {
            // The guest left for a migration target, whose handler reports it.
            Ok(Response::Status(s)) if s.state == DomainState::Migrated => return,
            Ok(Response::Status(s)) if s.state != DomainState::Pending => {
                if !answered {
                    tracing::info!(state = ?s.state, accel = ?s.accel, "launcher answered");
                }
                answered = true;
                failing_since = None;
                w.observe(&Observation::Launcher(s)).await;
                let following = Instant::now();
                if follow(&mut w, &launcher).await {
                    return;
                }
                // The event stream broke: look again right away, unless it broke at once —
                // a launcher that ends every stream must not make the handler spin (it did,
                // hammering the launcher with a connection pair per iteration).
                if following.elapsed() < POLL {
                    tokio::time::sleep(POLL).await;
                }
                continue;
            }
            Ok(_) => failing_since = None,
            Err(e) => {
                // A launcher that ended says how; this also covers a handler restarted
                // after the guest's end, which never saw the final event.
                match read_outcome(launcher.dir()).await {
                    Some(Some(obs)) => {
                        tracing::info!(?obs, "launcher has ended");
                        w.observe(&obs).await;
                        return;
                    }
                    Some(None) => {
                        tracing::info!("launcher ended after migrating the guest away");
                        return;
                    }
                    None => {}
                }
                if answered || w.status().phase == Phase::Running {
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= GONE_AFTER {
                        let reason = gone_reason(&e);
                        tracing::warn!(%reason, "launcher is gone");
                        w.metrics.launchers_gone.inc();
                        w.observe(&Observation::LauncherDied(reason)).await;
                        return;
                    }
                }
            }
        }
        // Wake early when the VMI changes (e.g. it became final elsewhere).
        if let Ok(Err(_)) = tokio::time::timeout(POLL, w.vmi.changed()).await {
            // The watch side is gone (this task is being aborted); do not spin.
            tokio::time::sleep(POLL).await;
        }
    }
}

/// One probe the handler runs: its request, counter and when it is due.
struct Running {
    request: Request,
    counter: crate::probe::Counter,
    timing: crate::probe::Timing,
    due: Instant,
    readiness: bool,
}

fn probes_of(vmi: &VirtualMachineInstance) -> Vec<Running> {
    let now = Instant::now();
    [
        (vmi.spec.readiness_probe.as_ref(), true),
        (vmi.spec.liveness_probe.as_ref(), false),
    ]
    .into_iter()
    .filter_map(|(p, readiness)| {
        let p = p?;
        let timing = crate::probe::timing(p);
        Some(Running {
            request: crate::probe::request(p)?,
            counter: crate::probe::Counter::new(p, readiness),
            timing,
            due: now + timing.initial_delay,
            readiness,
        })
    })
    .collect()
}

/// Runs the probes that are due; true when the liveness probe failed and the guest was
/// stopped (the VMI is final now).
async fn run_probes(
    w: &mut StatusWriter,
    launcher: &LauncherClient,
    probes: &mut [Running],
) -> bool {
    for p in probes.iter_mut().filter(|p| p.due <= Instant::now()) {
        p.due = Instant::now() + p.timing.period;
        // The launcher bounds the command by the probe's timeout; the call gets a margin.
        let answer = tokio::time::timeout(
            p.timing.timeout + Duration::from_secs(5),
            launcher.call(&p.request),
        )
        .await;
        let ok = matches!(&answer, Ok(Ok(r)) if crate::probe::succeeded(r));
        if !p.counter.record(ok) {
            continue;
        }
        let what = if p.readiness { "readiness" } else { "liveness" };
        tracing::info!(probe = what, passing = p.counter.passing, answer = ?answer, "probe changed");
        if p.readiness {
            w.probe_ready = Some(p.counter.passing);
            if let Ok(Response::Status(s)) = launcher.call(&Request::GetStatus).await {
                w.observe(&Observation::Launcher(s)).await;
            }
        } else if !p.counter.passing {
            // KubeVirt's kubelet restarts the failing compute container, which ends the VMI;
            // here the guest is stopped and the VMI fails with the reason.
            w.observe(&Observation::LivenessFailed(format!(
                "the liveness probe failed {} times in a row",
                p.timing.failure_threshold
            )))
            .await;
            if let Err(e) = launcher.call(&Request::Kill).await {
                tracing::warn!(error = %e, "stopping the guest after its liveness probe failed");
            }
            return true;
        }
    }
    false
}

/// Follows the event stream and runs the VMI's probes; true when the domain ended (the VMI
/// is final now).
async fn follow(w: &mut StatusWriter, launcher: &LauncherClient) -> bool {
    let mut events = match launcher.watch().await {
        Ok(ev) => ev,
        Err(e) => {
            tracing::debug!(error = %e, "subscribing to launcher events failed");
            return false;
        }
    };
    let mut probes = probes_of(&w.vmi.borrow());
    loop {
        let due = probes.iter().map(|p| p.due).min();
        let event = tokio::select! {
            ev = events.next() => ev,
            () = async {
                match due {
                    Some(t) => tokio::time::sleep_until(t.into()).await,
                    None => std::future::pending().await,
                }
            } => {
                if run_probes(w, launcher, &mut probes).await {
                    return true;
                }
                continue;
            }
        };
        match event {
            Ok(Some(DomainEvent::ShutDown)) => {
                w.observe(&Observation::ShutDown).await;
                return true;
            }
            Ok(Some(DomainEvent::Crashed { reason })) => {
                w.observe(&Observation::Crashed(reason)).await;
                return true;
            }
            // The guest runs on the migration target now: its handler owns the VMI.
            Ok(Some(DomainEvent::Migrated)) => return true,
            Ok(Some(ev)) => {
                tracing::debug!(?ev, "launcher event");
                // Events say what changed; the status says everything (versions, accel).
                if let Ok(Response::Status(s)) = launcher.call(&Request::GetStatus).await {
                    w.observe(&Observation::Launcher(s)).await;
                }
            }
            Ok(None) | Err(_) => return false,
        }
    }
}

/// What the launcher's outcome file (if any) says about how it ended: `Some(None)` for
/// a guest that migrated away (the VMI is the target's to report, not ended).
async fn read_outcome(dir: &LauncherDir) -> Option<Option<Observation>> {
    let bytes = dir.read(OUTCOME_FILE, OUTCOME_LIMIT).await.ok()?;
    Some(outcome_observation(serde_json::from_slice(&bytes).ok()?))
}

fn outcome_observation(o: LauncherOutcome) -> Option<Observation> {
    Some(match o {
        LauncherOutcome::ShutDown => Observation::ShutDown,
        LauncherOutcome::Crashed { reason } => Observation::Crashed(reason),
        LauncherOutcome::Migrated => return None,
        LauncherOutcome::Failed { message } => {
            Observation::LauncherDied(format!("launcher failed: {message}"))
        }
    })
}

fn gone_reason(e: &ClientError) -> String {
    match e {
        ClientError::Io { path, source } => match source.kind() {
            std::io::ErrorKind::NotFound => {
                format!("launcher socket {} disappeared", path.display())
            }
            std::io::ErrorKind::ConnectionRefused => format!(
                "launcher stopped answering on {} (connection refused; killed?)",
                path.display()
            ),
            _ => format!("launcher socket {}: {source}", path.display()),
        },
        other => format!("launcher stopped answering: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recreated_vmi_keeps_its_registry_entry() {
        let r = Registry::default();
        r.insert("ns".into(), "a".into(), "uid-1".into());
        r.insert("ns".into(), "a".into(), "uid-2".into());
        r.remove("ns", "a", "uid-1");
        assert_eq!(r.uid("ns", "a").as_deref(), Some("uid-2"));
        r.remove("ns", "a", "uid-2");
        assert_eq!(r.uid("ns", "a"), None);
    }
}
