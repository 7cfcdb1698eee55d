//! A running VM's changed template, against a real kube-apiserver and etcd (our kinds from
//! CRDs, [`support`]): the VM controller keeps the spec each VMI started from in KubeVirt's
//! start ControllerRevision, sets `RestartRequired` naming what changed (every change
//! under `Stage`), clears it when the VM stops and starts again, and under `LiveUpdate`
//! carries node selector, tolerations and raised CPU sockets to the running VMI (a lowered
//! socket count needs a restart).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::ControllerRevision;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use kubevirt_api::kubevirt::VmRolloutStrategy;
use kubevirt_api::{VirtualMachine, VirtualMachineInstance};
use serde_json::{Value, json};
use support::{KubeApi, NS, VM, VMI, eventually};
use tokio_util::sync::CancellationToken;
use virt_controllers::events::Recorder;
use virt_controllers::vm::live::LiveUpdateConfig;
use virt_controllers::vmi::render::LauncherConfig;
use virt_controllers::{Config, Context};

const TOKEN: &str = "live-update-test-token";

struct Env {
    api: KubeApi,
    client: Client,
}

impl Env {
    async fn start() -> Self {
        let api = KubeApi::start(TOKEN, &[VMI, VM]).await;
        let client = api.client.clone();
        Self { api, client }
    }

    /// The VM controller and the VMI controller beside it, as virt-controller runs them.
    fn start_controllers(&self, strategy: VmRolloutStrategy) -> (Arc<Context>, CancellationToken) {
        let config = Config {
            namespace: Some(NS.to_string()),
            error_backoff_base: Duration::from_millis(100),
            error_backoff_max: Duration::from_secs(1),
            launcher: LauncherConfig {
                allow_emulation: true,
                ..LauncherConfig::default()
            },
            live_update: LiveUpdateConfig {
                strategy,
                ..LiveUpdateConfig::default()
            },
            ..Config::default()
        };
        let recorder = Recorder::new(self.client.clone(), "virt-controller", "test");
        let ctx = Arc::new(Context::new(self.client.clone(), Some(recorder), config));
        let stop = CancellationToken::new();
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
        (ctx, stop)
    }

    async fn create_vm(&self, name: &str, template_spec: Value) -> VirtualMachine {
        let vm: VirtualMachine = serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"runStrategy": "Always", "template": {"spec": template_spec}}
        }))
        .unwrap();
        self.api
            .vms()
            .create(&PostParams::default(), &vm)
            .await
            .unwrap()
    }

    async fn patch_vm(&self, name: &str, patch: Value) {
        self.api
            .vms()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }

    async fn patch_template(&self, name: &str, spec: Value) {
        self.patch_vm(name, json!({"spec": {"template": {"spec": spec}}}))
            .await;
    }

    fn revisions(&self) -> Api<ControllerRevision> {
        Api::namespaced(self.client.clone(), NS)
    }

    async fn revision_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .revisions()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(ResourceExt::name_any)
            .collect();
        names.sort();
        names
    }

    /// The VM's RestartRequired message once `f` holds for it (None: no condition).
    async fn restart_required_where(
        &self,
        name: &str,
        what: &str,
        f: impl Fn(Option<&str>) -> bool,
    ) -> Option<String> {
        eventually(what, || async {
            let vm = self.api.vms().get(name).await.unwrap();
            let message = restart_required(&vm);
            f(message.as_deref()).then_some(message)
        })
        .await
    }

    async fn vmi_where(
        &self,
        name: &str,
        what: &str,
        f: impl Fn(&VirtualMachineInstance) -> bool,
    ) -> VirtualMachineInstance {
        self.api.vmi_where(name, what, f).await
    }
}

fn restart_required(vm: &VirtualMachine) -> Option<String> {
    vm.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "RestartRequired" && c.status == kubevirt_api::ConditionStatus::True)
        .map(|c| c.message.clone().unwrap_or_default())
}

fn template() -> Value {
    json!({
        "nodeSelector": {"zone": "a"},
        "domain": {
            "cpu": {"sockets": 1, "cores": 1, "threads": 1},
            "resources": {"requests": {"memory": "64Mi"}},
            "devices": {}
        },
        "volumes": [{"name": "root", "containerDisk": {
            "image": "localhost/kubevirt-rs/test-guest:latest"}}]
    })
}

fn sockets(vmi: &VirtualMachineInstance) -> Option<u32> {
    vmi.spec.domain.cpu.as_ref().and_then(|c| c.sockets)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_stage_a_changed_template_needs_a_restart_which_clears_it() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let env = Env::start().await;
    let (_ctx, stop) = env.start_controllers(VmRolloutStrategy::Stage);
    let vm = env.create_vm("stage", template()).await;
    let uid = vm.uid().unwrap();
    let first = env
        .vmi_where("stage", "the VMI", |v| v.uid().is_some())
        .await;
    // KubeVirt's start revision, owned by the VM, holding its spec.
    let gen0 = vm.metadata.generation.unwrap();
    let name0 = format!("revision-start-vm-{uid}-{gen0}");
    let rev = eventually("the start revision", || async {
        env.revisions().get_opt(&name0).await.unwrap()
    })
    .await;
    assert_eq!(rev.owner_references()[0].uid, uid);
    assert_eq!(
        rev.data.unwrap().0["spec"]["template"]["spec"]["nodeSelector"],
        json!({"zone": "a"})
    );
    // No VMI spec is changed under Stage, and the change waits for a restart.
    assert_eq!(sockets(&first), Some(1));
    assert_eq!(
        first.spec.domain.cpu.as_ref().unwrap().max_sockets,
        None,
        "maxSockets is LiveUpdate's"
    );
    env.patch_template(
        "stage",
        json!({"domain": {"cpu": {"sockets": 2}}, "nodeSelector": null}),
    )
    .await;
    let message = env
        .restart_required_where("stage", "RestartRequired", |m| m.is_some())
        .await
        .unwrap();
    assert_eq!(
        message,
        "a non-live-updatable field was changed in the template spec: \
         spec.template.spec.domain.cpu.sockets, spec.template.spec.nodeSelector"
    );
    let vmi = env.api.vmis().get("stage").await.unwrap();
    assert_eq!(sockets(&vmi), Some(1));
    assert_eq!(vmi.spec.node_selector, first.spec.node_selector);

    // Stopped: cleared, the revision gone; started again from the new spec: none.
    env.patch_vm("stage", json!({"spec": {"runStrategy": "Halted"}}))
        .await;
    env.restart_required_where("stage", "RestartRequired cleared by the stop", |m| {
        m.is_none()
    })
    .await;
    eventually("the VMI gone", || async {
        env.api
            .vmis()
            .get_opt("stage")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    eventually("no start revision while stopped", || async {
        env.revision_names().await.is_empty().then_some(())
    })
    .await;
    env.patch_vm("stage", json!({"spec": {"runStrategy": "Always"}}))
        .await;
    let second = env
        .vmi_where("stage", "a new VMI", |v| v.uid() != first.uid())
        .await;
    assert_eq!(sockets(&second), Some(2));
    let vm = env.api.vms().get("stage").await.unwrap();
    assert_eq!(restart_required(&vm), None);
    let gen1 = second.annotations()["kubevirt.io/vm-generation"].clone();
    assert_eq!(
        env.revision_names().await,
        [format!("revision-start-vm-{uid}-{gen1}")]
    );
    // A change of the template's metadata or run strategy needs no restart.
    env.patch_vm(
        "stage",
        json!({"spec": {"template": {"metadata": {"labels": {"x": "y"}}}}}),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let vm = env.api.vms().get("stage").await.unwrap();
    assert_eq!(restart_required(&vm), None);
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_live_update_placement_and_sockets_reach_the_running_vmi() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let env = Env::start().await;
    let (_ctx, stop) = env.start_controllers(VmRolloutStrategy::LiveUpdate);
    env.create_vm("live", template()).await;
    let first = env
        .vmi_where("live", "the VMI with its boot topology", |v| {
            v.status
                .as_ref()
                .is_some_and(|s| s.current_cpu_topology.is_some())
        })
        .await;
    // Room for 4 × the sockets (maxHotplugRatio), the topology the guest boots with.
    assert_eq!(first.spec.domain.cpu.as_ref().unwrap().max_sockets, Some(4));
    let topo = first.status.as_ref().unwrap().current_cpu_topology.clone();
    assert_eq!(topo.unwrap().sockets, Some(1));

    env.patch_template(
        "live",
        json!({
            "nodeSelector": null,
            "tolerations": [{"key": "maintenance", "operator": "Exists", "effect": "NoSchedule"}],
            "domain": {"cpu": {"sockets": 2}}
        }),
    )
    .await;
    let vmi = env
        .vmi_where("live", "the live update on the VMI", |v| {
            sockets(v) == Some(2) && v.spec.node_selector.is_none() && v.spec.tolerations.is_some()
        })
        .await;
    assert_eq!(vmi.uid(), first.uid(), "the same instance");
    assert_eq!(
        vmi.spec.tolerations.unwrap()[0].key.as_deref(),
        Some("maintenance")
    );
    let vm = env.api.vms().get("live").await.unwrap();
    assert_eq!(restart_required(&vm), None);

    // Fewer sockets: a restart, with KubeVirt's words; the VMI keeps its two.
    env.patch_template("live", json!({"domain": {"cpu": {"sockets": 1}}}))
        .await;
    let message = env
        .restart_required_where("live", "RestartRequired", |m| m.is_some())
        .await;
    assert_eq!(
        message.as_deref(),
        Some("Reduction of CPU socket count requires a restart")
    );
    assert_eq!(sockets(&env.api.vmis().get("live").await.unwrap()), Some(2));

    // A change that is never live: the first message stays until the restart.
    env.patch_template(
        "live",
        json!({"domain": {"resources": {"requests": {"memory": "96Mi"}}}}),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let vm = env.api.vms().get("live").await.unwrap();
    assert_eq!(
        restart_required(&vm).as_deref(),
        Some("Reduction of CPU socket count requires a restart")
    );
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_live_update_a_non_live_change_needs_a_restart() {
    let env = Env::start().await;
    let (_ctx, stop) = env.start_controllers(VmRolloutStrategy::LiveUpdate);
    env.create_vm("mem", template()).await;
    env.vmi_where("mem", "the VMI", |v| v.uid().is_some()).await;
    env.patch_template(
        "mem",
        json!({"domain": {"resources": {"requests": {"memory": "96Mi"}}}}),
    )
    .await;
    let message = env
        .restart_required_where("mem", "RestartRequired", |m| m.is_some())
        .await;
    assert_eq!(
        message.as_deref(),
        Some(
            "a non-live-updatable field was changed in the template spec: \
             spec.template.spec.domain.resources.requests.memory"
        )
    );
    stop.cancel();
}
