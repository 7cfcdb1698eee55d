//! The VM controller with instance types and preferences, against a real kube-apiserver and
//! etcd (our kinds from CRDs, [`support`]): the VMI carries the instance type's size and the
//! preference's defaults, the copies are captured once in ControllerRevisions named in the
//! VM's status and shared by the VMs that copied the same generation (each an owner), a changed or deleted instance type does not change the VM's
//! next VMI, a conflicting template creates no VMI, and `referencePolicy: expand` rewrites
//! the VM. (The garbage collector, which deletes the revisions with the VM, runs only in a
//! cluster: e2e `instancetype.rs`.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::ControllerRevision;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Api, Client, ResourceExt};
use kubevirt_api::instancetype::vm::ReferencePolicy;
use kubevirt_api::{VirtualMachine, VirtualMachineInstance};
use serde_json::{Value, json};
use support::{KubeApi, NS, VM, VMI, eventually};
use tokio_util::sync::CancellationToken;
use virt_controllers::events::Recorder;
use virt_controllers::vmi::render::LauncherConfig;
use virt_controllers::{Config, Context};

const TOKEN: &str = "instancetype-test-token";

struct Env {
    api: KubeApi,
    client: Client,
}

impl Env {
    async fn start() -> Self {
        let api = KubeApi::start(TOKEN, &[VMI, VM]).await;
        api.install_instancetype_kinds().await;
        let client = api.client.clone();
        Self { api, client }
    }

    /// The VM controller (and the VMI controller beside it, as virt-controller runs them).
    fn start_controllers(&self, policy: ReferencePolicy) -> (Arc<Context>, CancellationToken) {
        let config = Config {
            namespace: Some(NS.to_string()),
            error_backoff_base: Duration::from_millis(100),
            error_backoff_max: Duration::from_secs(1),
            launcher: LauncherConfig {
                allow_emulation: true,
                ..LauncherConfig::default()
            },
            reference_policy: policy,
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

    fn cluster(&self, kind: &str, plural: &str) -> Api<DynamicObject> {
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("instancetype.kubevirt.io", "v1beta1", kind),
            plural,
        );
        Api::all_with(self.client.clone(), &ar)
    }

    fn instancetypes(&self) -> Api<DynamicObject> {
        self.cluster(
            "VirtualMachineClusterInstancetype",
            "virtualmachineclusterinstancetypes",
        )
    }

    fn preferences(&self) -> Api<DynamicObject> {
        self.cluster(
            "VirtualMachineClusterPreference",
            "virtualmachineclusterpreferences",
        )
    }

    async fn create(&self, api: &Api<DynamicObject>, kind: &str, name: &str, spec: Value) {
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "instancetype.kubevirt.io/v1beta1", "kind": kind,
            "metadata": {"name": name}, "spec": spec}))
        .unwrap();
        api.create(&PostParams::default(), &obj).await.unwrap();
    }

    async fn create_vm(&self, name: &str, template_spec: Value) -> VirtualMachine {
        let vm: VirtualMachine = serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "runStrategy": "Always",
                // No kind: the cluster-wide kinds (KubeVirt's default; virt-apiserver would
                // write it, a CRD does not).
                "instancetype": {"name": "tiny"},
                "preference": {"name": "pref"},
                "template": {"spec": template_spec}}
        }))
        .unwrap();
        self.api
            .vms()
            .create(&PostParams::default(), &vm)
            .await
            .unwrap()
    }

    fn revisions(&self) -> Api<ControllerRevision> {
        Api::namespaced(self.client.clone(), NS)
    }

    /// The instance-type and preference copies: the namespace's ControllerRevisions but the
    /// VMs' start revisions (`revision-start-vm-…`, what RestartRequired compares with).
    async fn copies(&self) -> Vec<ControllerRevision> {
        self.revisions()
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|r| {
                !r.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("revision-start-vm-"))
            })
            .collect()
    }

    async fn vmi_after(&self, name: &str, not_uid: Option<String>) -> VirtualMachineInstance {
        self.api
            .vmi_where(name, "a new VMI", |v| {
                v.metadata.deletion_timestamp.is_none() && v.uid() != not_uid
            })
            .await
    }
}

fn template() -> Value {
    json!({
        "domain": {"devices": {}},
        "volumes": [{"name": "root", "containerDisk": {
            "image": "localhost/kubevirt-rs/test-guest:latest"}}]
    })
}

fn topology(vmi: &VirtualMachineInstance) -> (Option<u32>, Option<u32>, Option<u32>) {
    let cpu = vmi.spec.domain.cpu.clone().unwrap();
    (cpu.sockets, cpu.cores, cpu.threads)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vms_run_from_the_copies_they_captured() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let env = Env::start().await;
    env.create(
        &env.instancetypes(),
        "VirtualMachineClusterInstancetype",
        "tiny",
        json!({"cpu": {"guest": 2}, "memory": {"guest": "96Mi"}}),
    )
    .await;
    env.create(
        &env.preferences(),
        "VirtualMachineClusterPreference",
        "pref",
        json!({"cpu": {"preferredCPUTopology": "cores"},
            "devices": {"preferredDiskBus": "sata", "preferredInterfaceModel": "e1000e"},
            "preferredTerminationGracePeriodSeconds": 5}),
    )
    .await;
    let (_ctx, stop) = env.start_controllers(ReferencePolicy::Reference);
    let vm = env.create_vm("a", template()).await;

    // The VMI: the instance type's vCPUs (as cores, the preference's layout) and memory, the
    // preference's disk bus on the volume's default disk, model on the default interface,
    // grace period; KubeVirt's annotations naming both.
    let vmi = env.vmi_after("a", None).await;
    assert_eq!(topology(&vmi), (Some(1), Some(2), Some(1)));
    assert_eq!(
        vmi.spec.domain.memory.clone().unwrap().guest.unwrap().0,
        "96Mi"
    );
    let disks = vmi.spec.domain.devices.disks.clone().unwrap();
    assert_eq!(disks[0].name, "root");
    assert_eq!(
        disks[0].disk.as_ref().unwrap().bus,
        Some(kubevirt_api::vmi::DiskBus::Sata)
    );
    assert_eq!(
        vmi.spec.domain.devices.interfaces.clone().unwrap()[0]
            .model
            .as_deref(),
        Some("e1000e")
    );
    assert_eq!(vmi.spec.termination_grace_period_seconds, Some(5));
    let ann = vmi.annotations();
    assert_eq!(ann["kubevirt.io/cluster-instancetype-name"], "tiny");
    assert_eq!(ann["kubevirt.io/cluster-preference-name"], "pref");

    // The copies: one revision per reference and copied generation, owned by the VM, named
    // in its status.
    let vm_uid = vm.uid().unwrap();
    let status = eventually("the VM's status naming both copies", || async {
        let vm = env.api.vms().get("a").await.unwrap();
        let s = vm.status.clone()?;
        (s.instancetype_ref
            .as_ref()?
            .controller_revision_ref
            .is_some()
            && s.preference_ref.as_ref()?.controller_revision_ref.is_some())
        .then_some(s)
    })
    .await;
    let it_ref = status.instancetype_ref.unwrap();
    let it_rev = it_ref.controller_revision_ref.unwrap().name.unwrap();
    assert!(
        it_rev.starts_with("tiny-v1beta1-") && it_rev.ends_with("-1"),
        "{it_rev}"
    );
    assert_eq!(it_ref.name.as_deref(), Some("tiny"));
    let revisions = env.copies().await;
    assert_eq!(revisions.len(), 2, "one per reference");
    for r in &revisions {
        let owner = &r.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("VirtualMachine", vm_uid.as_str(), Some(false))
        );
    }

    // A second VM of the same generations shares both copies (kubevirt/kubevirt#8591): no
    // revision added, the VM added to the owners of each.
    let shared = env.create_vm("a2", template()).await;
    let shared_uid = shared.uid().unwrap();
    let shared_status = eventually("a2's status naming both copies", || async {
        let vm = env.api.vms().get("a2").await.unwrap();
        let s = vm.status.clone()?;
        (s.instancetype_ref
            .as_ref()?
            .controller_revision_ref
            .is_some()
            && s.preference_ref.as_ref()?.controller_revision_ref.is_some())
        .then_some(s)
    })
    .await;
    assert_eq!(
        shared_status
            .instancetype_ref
            .unwrap()
            .controller_revision_ref
            .unwrap()
            .name
            .unwrap(),
        it_rev
    );
    let revisions = env.copies().await;
    assert_eq!(revisions.len(), 2, "shared, not copied again");
    for r in &revisions {
        let mut owners: Vec<&str> = r
            .metadata
            .owner_references
            .as_ref()
            .unwrap()
            .iter()
            .map(|o| o.uid.as_str())
            .collect();
        owners.sort_unstable();
        let mut want = vec![vm_uid.as_str(), shared_uid.as_str()];
        want.sort_unstable();
        assert_eq!(owners, want, "{}", r.name_any());
    }
    // The garbage collector drops a deleted VM's reference with a strategic merge patch,
    // which re-encodes `data`: kube-apiserver must see the same bytes (else "data: field is
    // immutable" and the reference stays).
    let dropped = env
        .revisions()
        .patch(
            &it_rev,
            &PatchParams::default(),
            &Patch::Strategic(kubevirt_api::instancetype::revision::remove_owner_patch(
                &shared_uid,
            )),
        )
        .await
        .expect("a strategic merge patch of the owners, as the garbage collector's");
    assert_eq!(dropped.metadata.owner_references.unwrap().len(), 1);
    // A revision gone (deleted by hand) while its instance type is unchanged is made again
    // when the VM next needs it.
    let a2_first = env.vmi_after("a2", None).await;
    env.revisions()
        .delete(&it_rev, &DeleteParams::default())
        .await
        .unwrap();
    env.api
        .vmis()
        .delete("a2", &DeleteParams::default())
        .await
        .unwrap();
    let a2_vmi = env.vmi_after("a2", a2_first.uid()).await;
    assert_eq!(topology(&a2_vmi), (Some(1), Some(2), Some(1)));
    assert!(env.revisions().get_opt(&it_rev).await.unwrap().is_some());

    // A changed instance type does not change the VM's next VMI.
    env.instancetypes()
        .patch(
            "tiny",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"cpu": {"guest": 4}}})),
        )
        .await
        .unwrap();
    env.api
        .vmis()
        .delete("a", &DeleteParams::default())
        .await
        .unwrap();
    let again = env.vmi_after("a", vmi.uid()).await;
    assert_eq!(
        topology(&again),
        (Some(1), Some(2), Some(1)),
        "the copy's 2 vCPUs"
    );
    // …nor does its deletion: the copy remains.
    env.instancetypes()
        .delete("tiny", &DeleteParams::default())
        .await
        .unwrap();
    env.api
        .vmis()
        .delete("a", &DeleteParams::default())
        .await
        .unwrap();
    let third = env.vmi_after("a", again.uid()).await;
    assert_eq!(topology(&third), (Some(1), Some(2), Some(1)));
    assert_eq!(env.copies().await.len(), 2, "no revision added by restarts");

    // A template setting what the instance type owns gets no VMI: a Warning and the
    // VM's Failure condition name the field.
    env.create(
        &env.instancetypes(),
        "VirtualMachineClusterInstancetype",
        "tiny",
        json!({"cpu": {"guest": 1}, "memory": {"guest": "64Mi"}}),
    )
    .await;
    let mut conflicting = template();
    conflicting["domain"]["cpu"] = json!({"sockets": 2});
    env.create_vm("b", conflicting).await;
    let failure = eventually("b's Failure condition", || async {
        let vm = env.api.vms().get("b").await.unwrap();
        vm.status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Failure")
            .and_then(|c| c.message)
    })
    .await;
    assert!(failure.contains("spec.domain.cpu.sockets"), "{failure}");
    assert!(env.api.vmis().get_opt("b").await.unwrap().is_none());
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_expand_policy_writes_the_instance_type_into_the_vm() {
    let env = Env::start().await;
    env.create(
        &env.instancetypes(),
        "VirtualMachineClusterInstancetype",
        "tiny",
        json!({"cpu": {"guest": 1}, "memory": {"guest": "64Mi"}}),
    )
    .await;
    env.create(
        &env.preferences(),
        "VirtualMachineClusterPreference",
        "pref",
        json!({"machine": {"preferredMachineType": "q35"}}),
    )
    .await;
    let (_ctx, stop) = env.start_controllers(ReferencePolicy::Expand);
    env.create_vm("e", template()).await;
    let vm = eventually("the VM expanded", || async {
        let vm = env.api.vms().get("e").await.unwrap();
        vm.spec.instancetype.is_none().then_some(vm)
    })
    .await;
    assert!(vm.spec.preference.is_none());
    let spec = vm.spec.template.spec.unwrap();
    assert_eq!(spec.domain.memory.unwrap().guest.unwrap().0, "64Mi");
    assert_eq!(spec.domain.cpu.unwrap().sockets, Some(1));
    assert!(env.copies().await.is_empty(), "no copy kept");
    // …and it runs as a plain VM.
    let vmi = env.vmi_after("e", None).await;
    assert_eq!(vmi.spec.domain.memory.unwrap().guest.unwrap().0, "64Mi");
    stop.cancel();
}
