//! The migration controller in-process, with the VMI controller, against a real
//! kube-apiserver and etcd (the harness of `vmi_controller.rs`).
//!
//! VMIs and VirtualMachineInstanceMigrations are served from CRDs with a /status
//! subresource. No scheduler, kubelet or virt-handler runs: the test binds pods, writes
//! pod status and writes the VMI's `status.migrationState` as virt-handler does
//! (docs/cluster-flow.md §6), and checks what the controllers make of it.
//!
//! kube-apiserver: `$KUBE_APISERVER_BIN`, else `target/k8s/*/bin/kube-apiserver`,
//! which `cargo xtask cluster up` builds. etcd: Debian's `etcd-server`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use kubevirt_api::vmi::VirtualMachineInstancePhase as Phase;
use kubevirt_api::{
    PrintableStatus, VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceMigration,
    VirtualMachineInstanceMigrationPhase as MPhase,
};
use serde_json::{Value, json};
use support::{KubeApi, NS, VM, VMI, VMIM, eventually};
use tokio_util::sync::CancellationToken;
use virt_controllers::events::Recorder;
use virt_controllers::migration::MigrationConfig;
use virt_controllers::vmi::render::LauncherConfig;
use virt_controllers::{Config, Context};

const TOKEN: &str = "migration-controller-test-token";

struct Env {
    _api: KubeApi,
    client: Client,
}

impl std::ops::Deref for Env {
    type Target = KubeApi;
    fn deref(&self) -> &KubeApi {
        &self._api
    }
}

impl Env {
    async fn start() -> Self {
        let api = KubeApi::start(TOKEN, &[VMI, VM, VMIM]).await;
        let client = api.client.clone();
        Self { _api: api, client }
    }

    fn vmims(&self) -> Api<VirtualMachineInstanceMigration> {
        Api::namespaced(self.client.clone(), NS)
    }

    fn start_controllers(&self) -> (Arc<Context>, CancellationToken) {
        let config = Config {
            namespace: Some(NS.to_string()),
            error_backoff_base: Duration::from_millis(100),
            launcher: LauncherConfig {
                allow_emulation: true,
                ..LauncherConfig::default()
            },
            ..Config::default()
        };
        let recorder = Recorder::new(self.client.clone(), "virt-controller", "test");
        let ctx = Arc::new(Context::new(self.client.clone(), Some(recorder), config));
        let stop = CancellationToken::new();
        let migrations = MigrationConfig {
            // Pending migrations look for capacity often, so the test need not wait.
            poll: Duration::from_millis(300),
            ..MigrationConfig::default()
        };
        // The VMI controller runs too: it must leave target pods to the migration
        // controller and follow the VMI to its new pod.
        let vmis = virt_controllers::vmi::shared(&ctx, stop.clone());
        tokio::spawn(virt_controllers::vmi::run(
            ctx.clone(),
            vmis.clone(),
            stop.clone(),
        ));
        let dvs = virt_controllers::datavolume::shared(&ctx, stop.clone());
        tokio::spawn(virt_controllers::vm::run(
            ctx.clone(),
            vmis,
            dvs,
            stop.clone(),
        ));
        tokio::spawn(virt_controllers::migration::run(
            ctx.clone(),
            migrations,
            stop.clone(),
        ));
        (ctx, stop)
    }

    async fn create_vmi(&self, name: &str, volumes: Value) -> VirtualMachineInstance {
        let vmi: VirtualMachineInstance = serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name},
            "spec": {
                "domain": {"devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]},
                           "resources": {"requests": {"memory": "64Mi"}}},
                "terminationGracePeriodSeconds": 5,
                "volumes": volumes}
        }))
        .unwrap();
        self.vmis()
            .create(&PostParams::default(), &vmi)
            .await
            .unwrap()
    }
}

fn compute(state: Value) -> Value {
    json!([{"name": "compute", "image": "localhost/kubevirt-rs/virt-launcher:latest",
            "imageID": "", "ready": true, "restartCount": 0, "state": state}])
}

fn container_disk() -> Value {
    json!([{"name": "root", "containerDisk": {
        "image": "localhost/kubevirt-rs/test-guest:latest", "imagePullPolicy": "Never"}}])
}

fn state(v: &VirtualMachineInstance) -> kubevirt_api::VirtualMachineInstanceMigrationState {
    v.status
        .as_ref()
        .and_then(|s| s.migration_state.clone())
        .unwrap_or_default()
}

fn mphase(m: &VirtualMachineInstanceMigration) -> MPhase {
    m.status.as_ref().map(|s| s.phase).unwrap_or_default()
}

fn failure_reason(m: &VirtualMachineInstanceMigration) -> String {
    m.status
        .as_ref()
        .and_then(|s| s.migration_state.as_ref())
        .and_then(|s| s.failure_reason.clone())
        .unwrap_or_default()
}

impl Env {
    /// A VMI running on `node`: the launcher pod bound and started, the handler's
    /// Running written.
    async fn running_vmi(&self, name: &str, node: &str, volumes: Value) -> VirtualMachineInstance {
        self.create_vmi(name, volumes).await;
        let v = self.phase(name, Phase::Scheduling).await;
        let pod = self.only_pod(&v).await.name_any();
        self.bind(&pod, node).await;
        self.pod_status(
            &pod,
            json!({"phase": "Running", "containerStatuses": compute(json!({"running": {}}))}),
        )
        .await;
        self.phase(name, Phase::Scheduled).await;
        self.handler(name, json!({"phase": "Running"})).await;
        self.phase(name, Phase::Running).await
    }

    /// virt-handler's part: a merge patch of the VMI status.
    async fn handler(&self, vmi: &str, status: Value) {
        self.vmis()
            .patch_status(
                vmi,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "status": status })),
            )
            .await
            .unwrap();
    }

    async fn create_vmim(
        &self,
        name: &str,
        vmi: &str,
        annotations: Value,
    ) -> VirtualMachineInstanceMigration {
        let m: VirtualMachineInstanceMigration = serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"vmiName": vmi}
        }))
        .unwrap();
        self.vmims()
            .create(&PostParams::default(), &m)
            .await
            .unwrap()
    }

    async fn vmim_phase(&self, name: &str, phase: MPhase) -> VirtualMachineInstanceMigration {
        eventually(&format!("migration {name} in {phase:?}"), || async {
            self.vmims()
                .get_opt(name)
                .await
                .unwrap()
                .filter(|m| mphase(m) == phase)
        })
        .await
    }

    async fn target_pods(&self, m: &VirtualMachineInstanceMigration) -> Vec<Pod> {
        let sel = format!("kubevirt.io/migrationJobUID={}", m.uid().unwrap());
        self.pods()
            .list(&ListParams::default().labels(&sel))
            .await
            .unwrap()
            .items
    }

    async fn target_pod(&self, m: &VirtualMachineInstanceMigration) -> Pod {
        eventually("the target pod", || async {
            let mut pods = self.target_pods(m).await;
            assert!(pods.len() <= 1, "one target pod: {pods:?}");
            pods.pop()
        })
        .await
    }

    /// The target pod is gone, or being deleted (a bound pod waits for its kubelet).
    async fn target_removed(&self, m: &VirtualMachineInstanceMigration) {
        eventually("the target pod removed", || async {
            let pods = self.target_pods(m).await;
            pods.iter()
                .all(|p| p.metadata.deletion_timestamp.is_some())
                .then_some(())
        })
        .await;
    }

    /// The scheduler and kubelet: bind the target and start its compute container.
    async fn run_target(&self, pod: &str, node: &str) {
        self.bind(pod, node).await;
        self.pod_status(
            pod,
            json!({"phase": "Running", "containerStatuses": compute(json!({"running": {}}))}),
        )
        .await;
    }

    async fn pod_gone_or_deleting(&self, name: &str) -> bool {
        self.pods()
            .get_opt(name)
            .await
            .unwrap()
            .is_none_or(|p| p.metadata.deletion_timestamp.is_some())
    }
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_controller_against_kube_apiserver() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let env = Env::start().await;
    let (_ctx, stop) = env.start_controllers();

    success_moves_the_vmi_and_deletes_the_source_pod(&env).await;
    unschedulable_target_fails_and_leaves_the_vmi_untouched(&env).await;
    deleting_the_migration_aborts_it(&env).await;
    non_migratable_vmi_fails_with_the_live_migratable_reason(&env).await;
    vm_shows_migrating_while_the_guest_moves(&env).await;
    third_outbound_migration_waits_pending(&env).await;

    stop.cancel();
}

async fn success_moves_the_vmi_and_deletes_the_source_pod(env: &Env) {
    let a = env.running_vmi("a", "node-1", container_disk()).await;
    let source = env.only_pod(&a).await;
    // Creation timestamps have whole seconds, and the VMI controller follows the newest
    // live pod: the target must be younger than the source, as it always is in a cluster.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let t0 = std::time::Instant::now();
    env.create_vmim("mig-a", "a", json!({})).await;
    let m = env.vmim_phase("mig-a", MPhase::Scheduling).await;
    eprintln!(
        "VMIM create → Scheduling (target pod created): {:?}",
        t0.elapsed()
    );
    let ms = m.status.as_ref().unwrap().migration_state.clone().unwrap();
    assert_eq!(ms.source_node.as_deref(), Some("node-1"));
    assert_eq!(ms.source_pod, source.metadata.name);
    assert!(
        m.finalizers()
            .iter()
            .any(|f| f == "kubevirt.io/migrationJobFinalize")
    );

    // The target pod: anti-affinity against every pod of the VMI, per hostname.
    let target = env.target_pod(&m).await;
    let spec = target.spec.clone().unwrap();
    let anti = serde_json::to_value(&spec.affinity).unwrap();
    assert_eq!(
        anti["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"],
        json!([{"topologyKey": "kubernetes.io/hostname",
                "labelSelector": {"matchLabels": {"kubevirt.io/created-by": a.uid().unwrap()}}}])
    );
    assert!(
        spec.containers[0]
            .args
            .as_ref()
            .unwrap()
            .contains(&"--migration-target".to_string())
    );
    assert_eq!(
        target.owner_references()[0].kind,
        "VirtualMachineInstanceMigration"
    );
    let target_name = target.name_any();

    // While it is pending, the VMI does not follow it: its node stays, and the target is
    // an active pod (KubeVirt's `activePods`) without a node until it launched.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let v = env.vmis().get("a").await.unwrap();
    assert_eq!(
        v.status.as_ref().unwrap().node_name.as_deref(),
        Some("node-1")
    );
    let active = v
        .status
        .as_ref()
        .unwrap()
        .active_pods
        .clone()
        .unwrap_or_default();
    assert_eq!(active.len(), 2, "{active:?}");
    assert_eq!(
        active.get(&target.uid().unwrap()).map(String::as_str),
        Some(""),
        "{active:?}"
    );

    env.run_target(&target_name, "node-2").await;
    env.vmim_phase("mig-a", MPhase::PreparingTarget).await;
    let v = env
        .vmi_where("a", "the hand-off", |v| state(v).target_node.is_some())
        .await;
    let s = state(&v);
    assert_eq!(s.migration_uid, m.uid());
    assert_eq!(
        (
            s.source_node.as_deref(),
            s.target_node.as_deref(),
            s.target_pod.as_deref()
        ),
        (Some("node-1"), Some("node-2"), Some(target_name.as_str()))
    );
    assert_eq!(
        v.labels()
            .get("kubevirt.io/migrationTargetNodeName")
            .map(String::as_str),
        Some("node-2")
    );
    assert_eq!(
        v.status.as_ref().unwrap().node_name.as_deref(),
        Some("node-1")
    );

    // virt-handler: the target listens, the source transfers, then reports the end.
    env.handler(
        "a",
        json!({"migrationState": {"targetNodeAddress": "10.0.0.2:40000"}}),
    )
    .await;
    env.vmim_phase("mig-a", MPhase::TargetReady).await;
    env.handler(
        "a",
        json!({"migrationState": {"startTimestamp": now(), "mode": "PreCopy",
            "dataTotalBytes": 67108864, "dataProcessedBytes": 1048576, "dataRemainingBytes": 66060288}}),
    )
    .await;
    let running = env.vmim_phase("mig-a", MPhase::Running).await;
    assert_eq!(
        running
            .status
            .unwrap()
            .migration_state
            .unwrap()
            .data_processed_bytes,
        Some(1048576),
        "progress is mirrored on the migration"
    );
    let t1 = std::time::Instant::now();
    env.handler(
        "a",
        json!({"migrationState": {"endTimestamp": now(), "completed": true,
            "targetNodeDomainDetected": true, "targetNodeDomainReadyTimestamp": now()}}),
    )
    .await;
    env.vmim_phase("mig-a", MPhase::Succeeded).await;
    eprintln!("completed → Succeeded: {:?}", t1.elapsed());

    let v = env
        .vmi_where("a", "the VMI on node-2", |v| {
            v.status.as_ref().unwrap().node_name.as_deref() == Some("node-2")
                && v.labels().get("kubevirt.io/nodeName").map(String::as_str) == Some("node-2")
                && !v
                    .labels()
                    .contains_key("kubevirt.io/migrationTargetNodeName")
        })
        .await;
    assert_eq!(v.status.as_ref().unwrap().phase, Phase::Running);
    eventually("the source pod deleted", || async {
        env.pod_gone_or_deleting(&source.name_any())
            .await
            .then_some(())
    })
    .await;
    let adopted = env.pods().get(&target_name).await.unwrap();
    assert_eq!(adopted.owner_references()[0].uid, a.uid().unwrap());
    assert_eq!(adopted.owner_references()[0].controller, Some(true));

    // The kubelet finishes the source pod: the VMI keeps running on its new pod.
    env.pods()
        .delete(
            &source.name_any(),
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            },
        )
        .await
        .unwrap();
    let target_uid = adopted.uid().unwrap();
    env.vmi_where("a", "activePods = the target pod", |v| {
        v.status
            .as_ref()
            .and_then(|s| s.active_pods.as_ref())
            .is_some_and(|p| {
                p.len() == 1 && p.get(&target_uid).map(String::as_str) == Some("node-2")
            })
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let v = env.vmis().get("a").await.unwrap();
    assert_eq!(v.status.as_ref().unwrap().phase, Phase::Running);
    assert!(
        env.events_of("mig-a")
            .await
            .contains(&"SuccessfulMigration".to_string())
    );
}

async fn unschedulable_target_fails_and_leaves_the_vmi_untouched(env: &Env) {
    let b = env.running_vmi("b", "node-1", container_disk()).await;
    let m = env
        .create_vmim(
            "mig-b",
            "b",
            json!({"kubevirt.io/migrationUnschedulablePodTimeoutSeconds": "1"}),
        )
        .await;
    let target = env.target_pod(&m).await.name_any();
    // The scheduler's verdict: no node but the source fits.
    env.pod_status(
        &target,
        json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
            "reason": "Unschedulable", "lastTransitionTime": now(),
            "message": "0/1 nodes are available: 1 node(s) didn't match pod anti-affinity rules."}]}),
    )
    .await;
    let failed = env.vmim_phase("mig-b", MPhase::Failed).await;
    assert!(
        failure_reason(&failed).contains("unschedulable"),
        "{}",
        failure_reason(&failed)
    );
    assert!(failure_reason(&failed).contains("anti-affinity"));
    env.target_removed(&m).await;
    let v = env.vmis().get("b").await.unwrap();
    assert_eq!(v.status, b.status, "the VMI is untouched");
    assert!(
        !v.labels()
            .contains_key("kubevirt.io/migrationTargetNodeName")
    );
    assert!(
        env.events_of("mig-b")
            .await
            .contains(&"FailedMigration".to_string())
    );
}

async fn deleting_the_migration_aborts_it(env: &Env) {
    env.running_vmi("c", "node-1", container_disk()).await;
    let m = env.create_vmim("mig-c", "c", json!({})).await;
    let target = env.target_pod(&m).await.name_any();
    env.run_target(&target, "node-2").await;
    env.vmim_phase("mig-c", MPhase::PreparingTarget).await;
    env.handler(
        "c",
        json!({"migrationState": {"targetNodeAddress": "10.0.0.2:40001", "startTimestamp": now()}}),
    )
    .await;
    env.vmim_phase("mig-c", MPhase::Running).await;

    let t0 = std::time::Instant::now();
    env.vmims()
        .delete("mig-c", &DeleteParams::default())
        .await
        .unwrap();
    env.vmi_where("c", "abortRequested", |v| {
        state(v).abort_requested == Some(true)
    })
    .await;
    eprintln!("VMIM delete → abortRequested: {:?}", t0.elapsed());
    // The finalizer holds the migration until the handler reports the abort.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(env.vmims().get_opt("mig-c").await.unwrap().is_some());
    assert!(
        !env.pod_gone_or_deleting(&target).await,
        "the target stays until the abort ends"
    );

    env.handler(
        "c",
        json!({"migrationState": {"abortStatus": "Succeeded", "failed": true,
            "failureReason": "Live migration aborted", "endTimestamp": now()}}),
    )
    .await;
    eventually("the migration gone", || async {
        env.vmims()
            .get_opt("mig-c")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    env.target_removed(&m).await;
    let v = env.vmis().get("c").await.unwrap();
    assert_eq!(
        v.status.as_ref().unwrap().node_name.as_deref(),
        Some("node-1")
    );
    assert_eq!(v.status.as_ref().unwrap().phase, Phase::Running);
    assert!(
        !v.labels()
            .contains_key("kubevirt.io/migrationTargetNodeName")
    );
}

async fn non_migratable_vmi_fails_with_the_live_migratable_reason(env: &Env) {
    env.running_vmi(
        "e",
        "node-1",
        json!([{"name": "root", "hostDisk": {"path": "/var/lib/e.img", "type": "Disk"}}]),
    )
    .await;
    let m = env.create_vmim("mig-e", "e", json!({})).await;
    let failed = env.vmim_phase("mig-e", MPhase::Failed).await;
    assert_eq!(
        failure_reason(&failed),
        "DisksNotLiveMigratable: cannot migrate VMI with non-shared HostDisk"
    );
    assert!(env.target_pods(&m).await.is_empty(), "no target pod");
}

async fn third_outbound_migration_waits_pending(env: &Env) {
    for n in ["d1", "d2", "d3"] {
        env.running_vmi(n, "node-3", container_disk()).await;
    }
    env.create_vmim("mig-d1", "d1", json!({})).await;
    env.vmim_phase("mig-d1", MPhase::Scheduling).await;
    env.create_vmim("mig-d2", "d2", json!({})).await;
    env.vmim_phase("mig-d2", MPhase::Scheduling).await;
    let d3 = env.create_vmim("mig-d3", "d3", json!({})).await;
    env.vmim_phase("mig-d3", MPhase::Pending).await;
    // Several polls later it still waits, with no target pod.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        mphase(&env.vmims().get("mig-d3").await.unwrap()),
        MPhase::Pending
    );
    assert!(env.target_pods(&d3).await.is_empty());
    assert!(
        env.events_of("mig-d3")
            .await
            .contains(&"MigrationPending".to_string())
    );

    // A slot frees: the waiting one starts.
    env.vmims()
        .delete("mig-d1", &DeleteParams::default())
        .await
        .unwrap();
    env.vmim_phase("mig-d3", MPhase::Scheduling).await;
    env.target_pod(&d3).await;
}

async fn vm_printable(env: &Env, name: &str, want: PrintableStatus) {
    eventually(&format!("VM {name} {want:?}"), || async {
        env.vms()
            .get_opt(name)
            .await
            .unwrap()
            .filter(|vm| vm.status.as_ref().and_then(|s| s.printable_status) == Some(want))
    })
    .await;
}

async fn vm_shows_migrating_while_the_guest_moves(env: &Env) {
    let vm: VirtualMachine = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": "f"},
        "spec": {"runStrategy": "Always", "template": {"spec": {
            "domain": {"devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]},
                       "resources": {"requests": {"memory": "64Mi"}}},
            "volumes": container_disk()}}}
    }))
    .unwrap();
    env.vms().create(&PostParams::default(), &vm).await.unwrap();
    let f = env.phase("f", Phase::Scheduling).await;
    let pod = env.only_pod(&f).await.name_any();
    env.run_target(&pod, "node-1").await;
    env.phase("f", Phase::Scheduled).await;
    env.handler("f", json!({"phase": "Running"})).await;
    vm_printable(env, "f", PrintableStatus::Running).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;

    let m = env.create_vmim("mig-f", "f", json!({})).await;
    let target = env.target_pod(&m).await.name_any();
    env.run_target(&target, "node-2").await;
    env.vmim_phase("mig-f", MPhase::PreparingTarget).await;
    env.handler(
        "f",
        json!({"migrationState": {"targetNodeAddress": "10.0.0.2:40002", "startTimestamp": now()}}),
    )
    .await;
    vm_printable(env, "f", PrintableStatus::Migrating).await;
    env.handler(
        "f",
        json!({"migrationState": {"completed": true, "endTimestamp": now()}}),
    )
    .await;
    env.vmim_phase("mig-f", MPhase::Succeeded).await;
    vm_printable(env, "f", PrintableStatus::Running).await;
    let v = env.vmis().get("f").await.unwrap();
    assert_eq!(
        v.status.as_ref().unwrap().node_name.as_deref(),
        Some("node-2")
    );
}
