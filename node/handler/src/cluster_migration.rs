//! Cluster mode's part in live migrations (cluster-flow.md §6.3, §6.6).
//!
//! - **Target**: a VMI labelled `kubevirt.io/migrationTargetNodeName=<this node>` whose
//!   `migrationState` names this node as target gets its target launcher (in
//!   `sockets/<uid>-<8>/`) prepared, a [`TargetProxy`] on this handler's address, the
//!   launcher's facts in the migration directory ([`TARGET_FILE`]), and then
//!   `targetNodeAddress` (the source's signal); once the guest runs here,
//!   `targetNodeDomainDetected`.
//! - **Source**: a VMI of this node whose `migrationState` has `targetNodeAddress` and has
//!   not started gets the migration: the target's facts through the tunnel, a
//!   [`SourceProxy`](crate::migration_proxy::SourceProxy), `migrate`, and every progress
//!   report written ([`source_patch`]); `abortRequested` becomes `cancelMigration`.
//!
//! The decisions are pure functions of the VMI ([`source_step`], [`incoming_migration`],
//! [`launcher_dir_name`]); the tasks only carry them out.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use kube::Api;
use kube::api::{Patch, PatchParams};
use kubevirt_api::vmi::CpuTopology;
use kubevirt_api::{VirtualMachineInstance, VirtualMachineInstanceMigrationState as State};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use virt_domain::protocol::{
    DomainState, MigrateRequest, MigrationOptions, MigrationStatus, Request, Response,
};

use crate::client::LauncherClient;
use crate::launcher_fs::LauncherDir;
use crate::migration::{
    prepare_target, source_patch, target_detected_patch, target_ready_patch, target_socket_dir,
};
use crate::migration_proxy::{SourceProxy, TARGET_FILE, client_tls, fetch_target, server_tls};
use crate::tls::TlsFiles;

/// Label virt-controller puts on a VMI at the hand-off: the node receiving it.
pub const TARGET_NODE_LABEL: &str =
    kubevirt_api::migration::names::MIGRATION_TARGET_NODE_NAME_LABEL;
/// VMI annotation (kubevirt-rs extension): bandwidth limit of its migrations in MiB/s,
/// KubeVirt's `bandwidthPerMigration` for one VM (tests slow a migration down with it).
pub const BANDWIDTH_ANNOTATION: &str = "kubevirt-rs.io/migration-bandwidth-mib";
/// How long a prepared target waits for its launcher's socket.
const TARGET_SOCKET_WAIT: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_millis(500);

/// What this handler needs to take part in migrations.
#[derive(Clone, Debug)]
pub struct MigrationConfig {
    /// This handler's address as other handlers reach it (its pod IP); target proxies
    /// listen there on a port of their own.
    pub address: IpAddr,
    /// The handler's certificate (it needs clientAuth as well as serverAuth: the source
    /// end is a TLS client), key and the handlers' CA.
    pub tls: TlsFiles,
}

/// The PEM files of a [`MigrationConfig`], read at the start of each migration (a
/// rotated Secret takes effect without a restart).
struct Pems {
    cert: Vec<u8>,
    key: Vec<u8>,
    ca: Vec<u8>,
}

impl MigrationConfig {
    fn pems(&self) -> Result<Pems, String> {
        let read = |p: &PathBuf| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
        Ok(Pems {
            cert: read(&self.tls.cert)?,
            key: read(&self.tls.key)?,
            ca: read(&self.tls.client_ca)?,
        })
    }
}

fn state(vmi: &VirtualMachineInstance) -> Option<&State> {
    vmi.status.as_ref()?.migration_state.as_ref()
}

/// The directory under `sockets/` holding the launcher of `vmi` (uid `uid`) on `node`:
/// the target's (`<uid>-<8>`) when the VMI's last migration completed towards `node`,
/// else `<uid>` (cluster-flow.md §6.2).
pub fn launcher_dir_name(uid: &str, vmi: &VirtualMachineInstance, node: &str) -> String {
    match state(vmi) {
        Some(ms)
            if ms.target_node.as_deref() == Some(node)
                && ms.completed == Some(true)
                && ms.failed != Some(true) =>
        {
            match &ms.migration_uid {
                Some(m) => target_socket_dir(uid, m),
                None => uid.to_string(),
            }
        }
        _ => uid.to_string(),
    }
}

/// What the source handler does about a VMI's migration state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceStep {
    /// Nothing to do.
    Nothing,
    /// Start migrating to `address` on `target_node` (migration `uid`).
    Start {
        /// Migration uid.
        uid: String,
        /// `targetNodeAddress`.
        address: String,
        /// `targetNode`: the name its handler's certificate must carry.
        target_node: String,
    },
    /// Cancel the running migration `uid`.
    Cancel {
        /// Migration uid.
        uid: String,
    },
    /// Migration `uid` started from this node, but not by this handler (it restarted since):
    /// ask the launcher how it stands and report that, instead of leaving the VMI's state
    /// unfinished until the controller's timeouts end it.
    Follow {
        /// Migration uid.
        uid: String,
    },
}

/// The source handler's next step for state `ms` on `node`; `running` is the uid of the
/// migration this handler runs for the VMI, if any.
pub fn source_step(ms: &State, node: &str, running: Option<&str>) -> SourceStep {
    let Some(uid) = ms.migration_uid.clone() else {
        return SourceStep::Nothing;
    };
    if ms.source_node.as_deref() != Some(node) {
        return SourceStep::Nothing;
    }
    if running == Some(uid.as_str()) {
        if ms.abort_requested == Some(true) && !ms.is_finished() {
            return SourceStep::Cancel { uid };
        }
        return SourceStep::Nothing;
    }
    if ms.is_finished() {
        return SourceStep::Nothing;
    }
    match (&ms.target_node_address, &ms.target_node) {
        _ if ms.start_timestamp.is_some() => SourceStep::Follow { uid },
        (Some(address), Some(target)) if ms.abort_requested != Some(true) => SourceStep::Start {
            uid,
            address: address.clone(),
            target_node: target.clone(),
        },
        _ => SourceStep::Nothing,
    }
}

/// The uid of the migration this node should receive, if `ms` names it as an unfinished
/// migration's target.
pub fn incoming_migration<'a>(ms: &'a State, node: &str) -> Option<&'a str> {
    (ms.target_node.as_deref() == Some(node) && !ms.is_finished())
        .then_some(ms.migration_uid.as_deref())
        .flatten()
}

/// The migration options for `vmi` (its bandwidth annotation).
pub fn options(vmi: &VirtualMachineInstance) -> MigrationOptions {
    MigrationOptions {
        bandwidth_mib: vmi
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(BANDWIDTH_ANNOTATION))
            .and_then(|v| v.trim().parse().ok())
            .filter(|b| *b > 0),
        max_downtime_ms: None,
        copy_claims: vmi
            .status
            .as_ref()
            .and_then(|s| s.migrated_volumes.as_deref())
            .unwrap_or_default()
            .iter()
            .map(|m| m.volume_name.clone())
            .collect(),
    }
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Writes one migration's fields into a VMI's `status.migrationState`, never once the
/// VMI's state belongs to another migration.
struct StateWriter {
    api: Api<VirtualMachineInstance>,
    name: String,
    migration: String,
    vmi: watch::Receiver<VirtualMachineInstance>,
}

impl StateWriter {
    fn current(&self) -> Option<State> {
        state(&self.vmi.borrow())
            .filter(|ms| ms.is_for(&self.migration))
            .cloned()
    }

    async fn patch(&self, patch: &Value) -> bool {
        if self.current().is_none() {
            tracing::info!("the VMI's migration state is another migration's now; not written");
            return false;
        }
        let mut delay = Duration::from_millis(200);
        for attempt in 1..=8 {
            match self
                .api
                .patch_status(&self.name, &PatchParams::default(), &Patch::Merge(patch))
                .await
            {
                Ok(_) => return true,
                Err(kube::Error::Api(e)) if e.code == 404 => return false,
                Err(e) => {
                    tracing::warn!(error = %e, attempt, "writing migration state failed");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
            }
        }
        false
    }

    async fn fail(&self, reason: &str) {
        tracing::warn!(%reason, "migration failed");
        let patch = json!({"status": {"migrationState": {
            "failed": true, "failureReason": reason, "endTimestamp": now(),
        }}});
        self.patch(&patch).await;
    }
}

/// Merges what was written into `known` (the state as this writer knows it).
fn merge(known: &mut State, patch: &Value) {
    let mut v = serde_json::to_value(&*known).unwrap_or(Value::Null);
    if let (Some(obj), Some(add)) = (
        v.as_object_mut(),
        patch["status"]["migrationState"].as_object(),
    ) {
        for (k, val) in add {
            obj.insert(k.clone(), val.clone());
        }
    }
    if let Ok(s) = serde_json::from_value(v) {
        *known = s;
    }
}

/// Source side of migration `migration` of VMI `name`, whose launcher is in `dir`.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn outgoing(
    api: Api<VirtualMachineInstance>,
    name: String,
    migration: String,
    (address, target_node): (String, String),
    dir: LauncherDir,
    cfg: MigrationConfig,
    vmi: watch::Receiver<VirtualMachineInstance>,
    cancel: CancellationToken,
) {
    let options = options(&vmi.borrow());
    let w = StateWriter {
        api,
        name,
        migration,
        vmi,
    };
    let started = std::time::Instant::now();
    match transfer(&w, (&address, &target_node), dir, &cfg, options, cancel).await {
        Ok(last) => {
            tracing::info!(outcome = ?last, took_ms = started.elapsed().as_millis() as u64, "outgoing migration ended")
        }
        Err(reason) => w.fail(&reason).await,
    }
}

async fn transfer(
    w: &StateWriter,
    (address, target_node): (&str, &str),
    dir: LauncherDir,
    cfg: &MigrationConfig,
    options: MigrationOptions,
    cancel: CancellationToken,
) -> Result<MigrationStatus, String> {
    let addr: SocketAddr = address
        .parse()
        .map_err(|e| format!("targetNodeAddress {address:?}: {e}"))?;
    let p = cfg.pems()?;
    let tls = client_tls(&p.cert, &p.key, &p.ca).map_err(|e| e.to_string())?;
    // The target's certificate must name its node: any handler's chains to the same CA.
    let server_name = rustls_pki_types::ServerName::try_from(target_node.to_string())
        .map_err(|e| format!("targetNode {target_node:?}: {e}"))?;
    let target = fetch_target(addr, tls.clone(), server_name.clone())
        .await
        .map_err(|e| e.to_string())?;
    tracing::info!(%addr, ?target, ?options, "starting outgoing migration");
    let launcher = LauncherClient::new(dir);
    // Our own proxy (not `run_source`'s): closing it is the cancel of last resort.
    let mig_dir = crate::migration::migration_dir(&launcher)
        .await
        .map_err(|e| e.to_string())?;
    let proxy = SourceProxy::start(mig_dir, addr, tls, server_name).map_err(|e| e.to_string())?;
    match launcher
        .call(&Request::Migrate(MigrateRequest { target, options }))
        .await
        .map_err(|e| e.to_string())?
    {
        Response::Ok => {}
        Response::Error { message } => return Err(format!("launcher: {message}")),
        other => return Err(format!("launcher: unexpected reply {other:?}")),
    }
    let events = launcher
        .watch_migration()
        .await
        .map_err(|e| e.to_string())?;
    let last = report(w, &launcher, events, cancel, Some(&proxy), |st| st).await;
    proxy.close();
    Ok(last)
}

/// Source side of migration `migration` of VMI `name` that this handler did not start (it
/// restarted since): the launcher in `dir` says how it stands, and that is written. Its
/// tunnel went with the previous handler, so a transfer still running ends soon; an idle
/// launcher never began.
pub(crate) async fn follow(
    api: Api<VirtualMachineInstance>,
    name: String,
    migration: String,
    dir: LauncherDir,
    vmi: watch::Receiver<VirtualMachineInstance>,
    cancel: CancellationToken,
) {
    let w = StateWriter {
        api,
        name,
        migration,
        vmi,
    };
    let launcher = LauncherClient::new(dir);
    let events = match launcher.watch_migration().await {
        Ok(ev) => ev,
        Err(e) => {
            // Gone launchers are the pod's business (the VMI fails or moves with it).
            tracing::warn!(error = %e, "cannot ask the launcher about the migration it ran");
            return;
        }
    };
    tracing::info!("following a migration started before this handler's restart");
    let last = report(&w, &launcher, events, cancel, None, |st| match st {
        MigrationStatus::Idle => MigrationStatus::Failed {
            reason: RESTARTED_BEFORE_START.into(),
        },
        MigrationStatus::Failed { reason } => MigrationStatus::Failed {
            reason: format!("{RESTARTED_DURING}: {reason}"),
        },
        st => st,
    })
    .await;
    tracing::info!(outcome = ?last, "followed migration ended");
}

/// Failure reason of a migration whose source handler restarted before the launcher began.
pub const RESTARTED_BEFORE_START: &str =
    "virt-handler restarted before the migration began; the guest stays on the source";
/// Prefix of the failure reason of a migration cut by its source handler's restart.
pub const RESTARTED_DURING: &str = "virt-handler restarted during the migration";

/// Writes the launcher's migration reports (`events`, each passed through `map`) into the
/// VMI until one is final, and returns it. A stream that ends first (after an idle report,
/// the launcher ends it) is a failure.
/// A cancel asks the launcher to abort; if it refuses, closing `proxy` cuts the transfer.
async fn report(
    w: &StateWriter,
    launcher: &LauncherClient,
    mut events: crate::client::MigrationEvents,
    cancel: CancellationToken,
    proxy: Option<&SourceProxy>,
    map: impl Fn(MigrationStatus) -> MigrationStatus,
) -> MigrationStatus {
    let mut known = w.current().unwrap_or_default();
    let mut asked = false;
    loop {
        let st = tokio::select! {
            st = events.next() => st,
            _ = cancel.cancelled(), if !asked => {
                asked = true;
                match launcher.call(&Request::CancelMigration).await {
                    Ok(Response::Ok) => tracing::info!("migration cancel sent"),
                    other => {
                        // Cutting the tunnel always ends the transfer; the guest stays.
                        tracing::warn!(reply = ?other, "migration cancel refused; closing the tunnel");
                        if let Some(p) = proxy {
                            p.close();
                        }
                    }
                }
                continue;
            }
        };
        let st = match st {
            Ok(Some(st)) => map(st),
            Ok(None) | Err(_) => MigrationStatus::Failed {
                reason: "the launcher closed the migration stream".into(),
            },
        };
        // An aborted transfer is a cancel, whatever libvirt called its end.
        let st = match st {
            MigrationStatus::Failed { .. } if asked => MigrationStatus::Cancelled,
            st => st,
        };
        if let Some(cur) = w.current() {
            known.abort_requested = cur.abort_requested;
        }
        if let Some(patch) = source_patch(&known, &st, &now())
            && w.patch(&patch).await
        {
            merge(&mut known, &patch);
        }
        if st.is_final() {
            return st;
        }
    }
}

/// Target side of migration `migration` of VMI `name`; its target launcher is in `dir`.
pub(crate) async fn incoming(
    api: Api<VirtualMachineInstance>,
    name: String,
    migration: String,
    dir: LauncherDir,
    cfg: MigrationConfig,
    vmi: watch::Receiver<VirtualMachineInstance>,
) {
    let mut w = StateWriter {
        api,
        name,
        migration,
        vmi,
    };
    let launcher = LauncherClient::new(dir);
    let waited = std::time::Instant::now();
    loop {
        if matches!(
            launcher.call(&Request::GetStatus).await,
            Ok(Response::Status(_))
        ) {
            break;
        }
        if waited.elapsed() > TARGET_SOCKET_WAIT {
            w.fail(&format!(
                "target launcher ({}) did not answer within {}s",
                launcher.dir().location(),
                TARGET_SOCKET_WAIT.as_secs()
            ))
            .await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let source = state(&w.vmi.borrow())
        .and_then(|ms| ms.source_node.clone())
        .unwrap_or_default();
    let prepared = async {
        let p = cfg.pems()?;
        let tls = server_tls(&p.cert, &p.key, &p.ca).map_err(|e| e.to_string())?;
        let (proxy, target) =
            prepare_target(&launcher, SocketAddr::new(cfg.address, 0), tls, &source)
                .await
                .map_err(|e| e.to_string())?;
        let facts = serde_json::to_vec(&target).map_err(|e| e.to_string())?;
        let mig_dir = crate::migration::migration_dir(&launcher)
            .await
            .map_err(|e| e.to_string())?;
        tokio::task::spawn_blocking(move || mig_dir.write(TARGET_FILE, &facts))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(proxy)
    };
    let proxy = match prepared.await {
        Ok(p) => p,
        Err(reason) => {
            w.fail(&format!("preparing the migration target: {reason}"))
                .await;
            return;
        }
    };
    let address = proxy.addr().to_string();
    tracing::info!(%address, "migration target ready");
    if !w.patch(&target_ready_patch(&address)).await {
        return;
    }
    let mut detected = false;
    while let Some(ms) = w.current() {
        if ms.is_finished() && (detected || ms.failed == Some(true)) {
            break;
        }
        if !detected {
            match launcher.call(&Request::GetStatus).await {
                Ok(Response::Status(s))
                    if matches!(s.state, DomainState::Running | DomainState::Paused) =>
                {
                    tracing::info!("migrated domain runs here");
                    detected = w.patch(&target_detected_patch(&now())).await;
                }
                Ok(_) => {}
                Err(e) => {
                    // Killed or deleted: the controller sees the pod end and fails the
                    // migration; closing the proxy breaks the transfer on the source.
                    tracing::warn!(error = %e, "target launcher stopped answering");
                    break;
                }
            }
        }
        let _ = tokio::time::timeout(POLL, w.vmi.changed()).await;
    }
    proxy.close();
    let succeeded = detected
        && w.current()
            .is_some_and(|ms| ms.is_finished() && ms.failed != Some(true));
    if succeeded {
        hotplug_cpus(&w, &launcher).await;
    }
}

/// The vCPUs a VMI's guest gets after a migration, and the topology to report, when its
/// spec has more than the guest booted with (a CPU hotplug virt-controller carried to the
/// VMI, KubeVirt's `HotVCPUChange`): the reason of that migration was a launcher pod sized
/// for them.
pub fn cpus_to_hotplug(vmi: &VirtualMachineInstance) -> Option<(u32, CpuTopology)> {
    let cpu = vmi.spec.domain.cpu.as_ref()?;
    cpu.max_sockets.filter(|m| *m > 0)?;
    let current = vmi.status.as_ref()?.current_cpu_topology.as_ref()?;
    let per = |c: Option<u32>| c.unwrap_or(1).max(1);
    let want = per(cpu.sockets) * per(cpu.cores) * per(cpu.threads);
    let have = per(current.sockets) * per(current.cores) * per(current.threads);
    (want > have).then(|| {
        (
            want,
            CpuTopology {
                sockets: Some(per(cpu.sockets)),
                cores: Some(per(cpu.cores)),
                threads: Some(per(cpu.threads)),
            },
        )
    })
}

/// Target side, once the guest runs here: hotplugs the vCPUs the VMI's spec has beyond
/// what the guest booted with and reports them in `status.currentCPUTopology` (KubeVirt's
/// `hotplugCPU` of its migration target). A failure is logged and the guest keeps its
/// vCPUs; the VMI keeps saying `HotVCPUChange`.
async fn hotplug_cpus(w: &StateWriter, launcher: &LauncherClient) {
    let Some((vcpus, topology)) = cpus_to_hotplug(&w.vmi.borrow()) else {
        return;
    };
    match launcher.call(&Request::SetVcpus { vcpus }).await {
        Ok(Response::Ok) => {}
        other => {
            tracing::warn!(vcpus, reply = ?other, "hotplugging vCPUs after the migration failed");
            return;
        }
    }
    tracing::info!(vcpus, "hotplugged vCPUs after the migration");
    let patch = json!({"status": {"currentCPUTopology": topology}});
    if let Err(e) = w
        .api
        .patch_status(&w.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        tracing::warn!(error = %e, "reporting the hotplugged vCPUs");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ms(v: Value) -> State {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn the_source_starts_once_the_target_is_ready_and_cancels_on_request() {
        let handed_off = ms(json!({"migrationUid": "m1", "sourceNode": "a", "targetNode": "b"}));
        assert_eq!(source_step(&handed_off, "a", None), SourceStep::Nothing);
        let ready = ms(
            json!({"migrationUid": "m1", "sourceNode": "a", "targetNode": "b",
            "targetNodeAddress": "10.0.0.2:4000"}),
        );
        assert_eq!(
            source_step(&ready, "a", None),
            SourceStep::Start {
                uid: "m1".into(),
                address: "10.0.0.2:4000".into(),
                target_node: "b".into(),
            }
        );
        assert_eq!(source_step(&ready, "b", None), SourceStep::Nothing);
        assert_eq!(source_step(&ready, "a", Some("m1")), SourceStep::Nothing);
        let abort = ms(json!({"migrationUid": "m1", "sourceNode": "a",
            "targetNodeAddress": "x:1", "startTimestamp": "2026-11-30T09:00:00Z",
            "abortRequested": true}));
        assert_eq!(
            source_step(&abort, "a", Some("m1")),
            SourceStep::Cancel { uid: "m1".into() }
        );
        // Started here by a handler that restarted since: the new one follows it (and
        // cancels it on the next event).
        assert_eq!(
            source_step(&abort, "a", None),
            SourceStep::Follow { uid: "m1".into() }
        );
        // Asked to abort before it started: the controller ends it alone.
        let early_abort = ms(json!({"migrationUid": "m1", "sourceNode": "a",
            "targetNodeAddress": "x:1", "abortRequested": true}));
        assert_eq!(source_step(&early_abort, "a", None), SourceStep::Nothing);
        let done = ms(json!({"migrationUid": "m1", "sourceNode": "a",
            "targetNodeAddress": "x:1", "completed": true}));
        assert_eq!(source_step(&done, "a", None), SourceStep::Nothing);
    }

    #[test]
    fn the_target_receives_unfinished_migrations_to_its_node() {
        let s = ms(json!({"migrationUid": "m1", "sourceNode": "a", "targetNode": "b"}));
        assert_eq!(incoming_migration(&s, "b"), Some("m1"));
        assert_eq!(incoming_migration(&s, "a"), None);
        let failed = ms(json!({"migrationUid": "m1", "targetNode": "b", "failed": true}));
        assert_eq!(incoming_migration(&failed, "b"), None);
    }

    #[test]
    fn the_launcher_directory_follows_a_completed_migration() {
        let mut vmi: VirtualMachineInstance = serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "v", "annotations": {BANDWIDTH_ANNOTATION: "4"}},
            "spec": {}
        }))
        .unwrap();
        assert_eq!(launcher_dir_name("u", &vmi, "a"), "u");
        assert_eq!(options(&vmi).bandwidth_mib, Some(4));
        assert!(options(&vmi).copy_claims.is_empty());
        vmi.status = Some(
            serde_json::from_value(json!({"migratedVolumes": [{"volumeName": "d",
                "sourcePVCInfo": {"claimName": "data"},
                "destinationPVCInfo": {"claimName": "data-mig-12345"}}]}))
            .unwrap(),
        );
        assert_eq!(options(&vmi).copy_claims, ["d"]);
        vmi.status = Some(
            serde_json::from_value(json!({"migrationState": {
                "migrationUid": "1234abcd-0000", "sourceNode": "a", "targetNode": "b",
                "completed": true}}))
            .unwrap(),
        );
        assert_eq!(launcher_dir_name("u", &vmi, "b"), "u-1234abcd");
        // The source keeps its directory until the VMI leaves it.
        assert_eq!(launcher_dir_name("u", &vmi, "a"), "u");
    }

    #[test]
    fn vcpus_beyond_the_booted_topology_are_hotplugged_on_the_target() {
        let vmi = |spec_cpu: Value, current: Value| -> VirtualMachineInstance {
            serde_json::from_value(json!({
                "metadata": {"name": "v"},
                "spec": {"domain": {"cpu": spec_cpu, "devices": {}}},
                "status": {"currentCPUTopology": current},
            }))
            .unwrap()
        };
        let one = json!({"sockets": 1, "cores": 2, "threads": 1});
        let (vcpus, topo) = cpus_to_hotplug(&vmi(
            json!({"sockets": 2, "cores": 2, "threads": 1, "maxSockets": 4}),
            one.clone(),
        ))
        .unwrap();
        assert_eq!(vcpus, 4);
        assert_eq!(topo.sockets, Some(2));
        // Nothing beyond the booted topology, or no room for hotplug.
        assert!(
            cpus_to_hotplug(&vmi(
                json!({"sockets": 1, "cores": 2, "maxSockets": 4}),
                one.clone()
            ))
            .is_none()
        );
        assert!(cpus_to_hotplug(&vmi(json!({"sockets": 2, "cores": 2}), one)).is_none());
    }

    #[test]
    fn merged_writes_update_the_known_state() {
        let mut known = ms(json!({"migrationUid": "m1"}));
        merge(
            &mut known,
            &json!({"status": {"migrationState": {"dataTotalBytes": 10}}}),
        );
        assert_eq!(known.data_total_bytes, Some(10));
        assert_eq!(known.migration_uid.as_deref(), Some("m1"));
    }
}
