//! Volume hotplug through a VM (issue 44), against a real kube-apiserver and etcd (our kinds
//! from CRDs, [`support`]) with the VM controller: a request queued in the VM's
//! `status.volumeRequests` (as virt-apiserver's `addvolume` queues it under HotplugVolumes)
//! ends in the VM's template and in its running VMI's spec, is dropped from the status, and
//! sets no `RestartRequired` (under `Stage`, where every other template change does); a
//! remove takes the volume out of both; a restart starts a VMI with the persisted volume.
//! The VMI controller does not run: the test reports the VMI Running itself.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use kubevirt_api::{VirtualMachine, VirtualMachineInstance};
use serde_json::{Value, json};
use support::{KubeApi, NS, VM, VMI, eventually};
use tokio_util::sync::CancellationToken;
use virt_controllers::{Config, Context};

const TOKEN: &str = "hotplug-test-token";

fn template() -> Value {
    json!({
        "domain": {
            "resources": {"requests": {"memory": "64Mi"}},
            "devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]}
        },
        "volumes": [{"name": "root", "containerDisk": {
            "image": "localhost/kubevirt-rs/test-guest:latest"}}]
    })
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

fn has_volume(spec: Option<&kubevirt_api::VirtualMachineInstanceSpec>, name: &str) -> bool {
    spec.is_some_and(|s| {
        s.volumes.iter().flatten().any(|v| v.name == name)
            && s.domain
                .devices
                .disks
                .iter()
                .flatten()
                .any(|d| d.name == name)
    })
}

/// VMIs being deleted lose the VMI controller's finalizer (it does not run here).
async fn release_finalizers(client: Client, stop: CancellationToken) {
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client, NS);
    while !stop.is_cancelled() {
        if let Ok(list) = vmis.list(&Default::default()).await {
            for v in list.items {
                if v.metadata.deletion_timestamp.is_some() && !v.finalizers().is_empty() {
                    let patch = json!({"metadata": {"finalizers": null}});
                    let _ = vmis
                        .patch(
                            &v.name_any(),
                            &PatchParams::default(),
                            &Patch::Merge(&patch),
                        )
                        .await;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn queue(api: &KubeApi, request: Value) {
    api.vms()
        .patch_status(
            "vm",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"volumeRequests": [request]}})),
        )
        .await
        .unwrap();
}

async fn set_running(api: &KubeApi) {
    api.vmis()
        .patch_status(
            "vm",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"phase": "Running", "nodeName": "node-a"}})),
        )
        .await
        .unwrap();
}

/// The VM once the controller has seen its latest generation, with no request left.
async fn settled(api: &KubeApi, what: &str) -> VirtualMachine {
    eventually(what, || async {
        let vm = api.vms().get("vm").await.unwrap();
        let status = vm.status.as_ref()?;
        (status.volume_requests.is_none() && status.observed_generation == vm.metadata.generation)
            .then_some(vm)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vms_volume_requests_reach_its_template_and_running_vmi_without_a_restart() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let api = KubeApi::start(TOKEN, &[VMI, VM]).await;
    let client = api.client.clone();
    let config = Config {
        namespace: Some(NS.to_string()),
        error_backoff_base: Duration::from_millis(100),
        error_backoff_max: Duration::from_secs(1),
        ..Config::default()
    };
    let ctx = Arc::new(Context::new(client.clone(), None, config));
    let stop = CancellationToken::new();
    let vmis = virt_controllers::vmi::shared(&ctx, stop.clone());
    let dvs = virt_controllers::datavolume::shared(&ctx, stop.clone());
    tokio::spawn(virt_controllers::vm::run(
        ctx.clone(),
        vmis,
        dvs,
        stop.clone(),
    ));
    tokio::spawn(release_finalizers(client.clone(), stop.clone()));

    let vm: VirtualMachine = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": "vm", "namespace": NS},
        "spec": {"runStrategy": "Always", "template": {"spec": template()}}
    }))
    .unwrap();
    api.vms().create(&PostParams::default(), &vm).await.unwrap();
    let first = api.vmi_where("vm", "the VMI", |v| v.uid().is_some()).await;
    set_running(&api).await;

    // An add, as virt-apiserver queues it.
    queue(
        &api,
        json!({"addVolumeOptions": {"name": "data",
            "disk": {"name": "data", "disk": {"bus": "scsi"}, "serial": "data"},
            "volumeSource": {"persistentVolumeClaim": {"claimName": "data", "hotpluggable": true}}}}),
    )
    .await;
    let vm = settled(&api, "the request applied and dropped").await;
    assert!(has_volume(vm.spec.template.spec.as_ref(), "data"), "{vm:?}");
    let vmi = api
        .vmi_where("vm", "the volume in the running VMI", |v| {
            has_volume(Some(&v.spec), "data")
        })
        .await;
    assert_eq!(vmi.uid(), first.uid(), "hotplugged, not restarted");
    let hot = vmi
        .spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "data")
        .unwrap();
    assert!(kubevirt_api::hotplug::is_hotpluggable(hot));
    // Under Stage every other template change needs a restart; a hotplugged volume not.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let vm = api.vms().get("vm").await.unwrap();
    assert_eq!(restart_required(&vm), None, "{:?}", vm.status);

    // A remove: out of the template and the VMI, still no restart.
    queue(&api, json!({"removeVolumeOptions": {"name": "data"}})).await;
    let vm = settled(&api, "the remove applied and dropped").await;
    assert!(!has_volume(vm.spec.template.spec.as_ref(), "data"));
    let vmi = api
        .vmi_where("vm", "the volume out of the VMI", |v| {
            !has_volume(Some(&v.spec), "data")
        })
        .await;
    assert_eq!(vmi.spec.volumes.as_ref().map(Vec::len), Some(1));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(restart_required(&api.vms().get("vm").await.unwrap()), None);

    // Persisted again, then a restart: the new VMI starts with the volume.
    queue(
        &api,
        json!({"addVolumeOptions": {"name": "data",
            "disk": {"name": "data", "disk": {"bus": "scsi"}},
            "volumeSource": {"persistentVolumeClaim": {"claimName": "data", "hotpluggable": true}}}}),
    )
    .await;
    settled(&api, "the second add applied").await;
    api.vms()
        .patch(
            "vm",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"runStrategy": "Halted"}})),
        )
        .await
        .unwrap();
    eventually("the VMI gone", || async {
        api.vmis()
            .get_opt("vm")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    api.vms()
        .patch(
            "vm",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"runStrategy": "Always"}})),
        )
        .await
        .unwrap();
    let second = api
        .vmi_where("vm", "a new VMI", |v| v.uid() != first.uid())
        .await;
    assert!(has_volume(Some(&second.spec), "data"), "{:?}", second.spec);
    stop.cancel();
}
