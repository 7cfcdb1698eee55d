//! The VMI controller in-process against a real kube-apiserver and etcd.
//!
//! Pods need the real kube-apiserver (its pod validation, graceful deletion of bound
//! pods, the binding subresource, events.k8s.io). The test starts its own etcd and
//! kube-apiserver (static token, AlwaysAllow) and serves VirtualMachineInstances from a
//! CRD with a /status subresource: the same CRD semantics virt-apiserver implements,
//! without the aggregation setup. No scheduler or kubelet runs; the test plays them by
//! binding pods and writing pod status, exactly what the controller watches.
//!
//! kube-apiserver: `$KUBE_APISERVER_BIN`, else `target/k8s/*/bin/kube-apiserver`,
//! which `cargo xtask cluster up` builds. etcd: Debian's `etcd-server`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use kube::api::{DeleteParams, EvictParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use kubevirt_api::vmi::VirtualMachineInstancePhase as Phase;
use kubevirt_api::{PrintableStatus, VirtualMachine, VirtualMachineInstance};
use serde_json::{Value, json};
use support::{KubeApi, NS, VM, VMI, eventually};
use tokio_util::sync::CancellationToken;
use virt_controllers::events::Recorder;
use virt_controllers::vmi::decide::FINALIZER;
use virt_controllers::vmi::render::LauncherConfig;
use virt_controllers::{Config, Context};

const TOKEN: &str = "vmi-controller-test-token";

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
        let api = KubeApi::start(TOKEN, &[VMI, VM]).await;
        let client = api.client.clone();
        Self { _api: api, client }
    }

    fn start_controller(&self) -> (Arc<Context>, CancellationToken) {
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
        // Both controllers, as virt-controller runs them.
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

    async fn create_vmi(&self, name: &str) -> VirtualMachineInstance {
        let vmi: VirtualMachineInstance = serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name},
            "spec": {
                "domain": {"devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]},
                           "resources": {"requests": {"memory": "64Mi"}}},
                "terminationGracePeriodSeconds": 5,
                "volumes": [{"name": "root", "containerDisk": {
                    "image": "localhost/kubevirt-rs/test-guest:latest", "imagePullPolicy": "Never"}}]}
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

fn cond<'a>(
    v: &'a VirtualMachineInstance,
    type_: &str,
) -> Option<&'a kubevirt_api::common::Condition> {
    v.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vmi_controller_against_kube_apiserver() {
    let env = Env::start().await;
    let (ctx, stop) = env.start_controller();

    // 1. Create → finalizer + one pod → Scheduling → (bound, compute runs) Scheduled
    //    with node name and label → the pod disappears → Failed (never Running without
    //    a pod), no second pod → delete → gone.
    let t0 = std::time::Instant::now();
    env.create_vmi("a").await;
    let a = env.phase("a", Phase::Scheduling).await;
    eprintln!("VMI create → Scheduling (pod created): {:?}", t0.elapsed());
    assert!(a.finalizers().iter().any(|f| f == FINALIZER));
    let pod = env.only_pod(&a).await;
    let pod_name = pod.name_any();
    assert!(pod_name.starts_with("virt-launcher-a-"), "{pod_name}");
    assert_eq!(
        a.status
            .as_ref()
            .unwrap()
            .active_pods
            .as_ref()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        vec![pod.uid().as_ref().unwrap()]
    );
    let spec = pod.spec.as_ref().unwrap();
    let inits: Vec<&str> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    // Only the busybox copy runs before the launcher; the image copiers run beside it.
    assert_eq!(inits, ["virt-bin"]);
    let containers: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(containers, ["compute", "image-0", "guest-console-log"]);
    assert_eq!(spec.termination_grace_period_seconds, Some(5 + 15));
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));

    env.bind(&pod_name, "node-1").await;
    env.pod_status(
        &pod_name,
        json!({"phase": "Running", "containerStatuses": compute(json!({"running": {}}))}),
    )
    .await;
    let t1 = std::time::Instant::now();
    let a = env.phase("a", Phase::Scheduled).await;
    eprintln!("pod running → Scheduled: {:?}", t1.elapsed());
    assert_eq!(
        a.status.as_ref().unwrap().node_name.as_deref(),
        Some("node-1")
    );
    env.vmi_where("a", "the node label", |v| {
        v.labels().get("kubevirt.io/nodeName").map(String::as_str) == Some("node-1")
    })
    .await;

    // virt-handler's part.
    env.vmis()
        .patch_status(
            "a",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"phase": "Running"}})),
        )
        .await
        .unwrap();
    env.pods()
        .delete(
            &pod_name,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            },
        )
        .await
        .unwrap();
    let t2 = std::time::Instant::now();
    let a = env.phase("a", Phase::Failed).await;
    eprintln!("pod deleted → Failed: {:?}", t2.elapsed());
    assert_eq!(
        a.status.as_ref().unwrap().reason.as_deref(),
        Some("PodNotExists")
    );
    assert_eq!(
        cond(&a, "Ready").unwrap().reason.as_deref(),
        Some("PodNotExists")
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        env.launcher_pods(&a).await.is_empty(),
        "a failed VMI never gets a new pod"
    );
    env.vmis()
        .delete("a", &DeleteParams::default())
        .await
        .unwrap();
    eventually("a to be gone", || async {
        env.vmis()
            .get_opt("a")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let reasons = env.events_of("a").await;
    assert!(
        reasons.iter().any(|r| r == "SuccessfulCreate"),
        "{reasons:?}"
    );
    assert!(reasons.iter().any(|r| r == "PodNotExists"), "{reasons:?}");

    // 2. Unschedulable → PodScheduled=False; image pull back-off → Synchronized=False
    //    with the kubelet's message; the image copy fails → Failed; the terminated pod
    //    stays for its logs until the VMI is deleted.
    let t0 = std::time::Instant::now();
    env.create_vmi("b").await;
    let b = env.phase("b", Phase::Scheduling).await;
    eprintln!(
        "VMI create → Scheduling, controller warm: {:?}",
        t0.elapsed()
    );
    let pod_name = env.only_pod(&b).await.name_any();
    env.pod_status(
        &pod_name,
        json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
            "reason": "Unschedulable", "message": "0/1 nodes are available: 1 Insufficient memory."}]}),
    )
    .await;
    let b = env
        .vmi_where("b", "PodScheduled=False", |v| {
            cond(v, "PodScheduled").is_some_and(|c| c.reason.as_deref() == Some("Unschedulable"))
        })
        .await;
    assert_eq!(
        cond(&b, "PodScheduled").unwrap().message.as_deref(),
        Some("0/1 nodes are available: 1 Insufficient memory.")
    );
    env.bind(&pod_name, "node-1").await;
    let waiting = json!([{"name": "image-0", "image": "localhost/kubevirt-rs/test-guest:latest",
        "imageID": "", "ready": false, "restartCount": 0,
        "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}]);
    env.pod_status(
        &pod_name,
        json!({"phase": "Pending",
               "conditions": [{"type": "PodScheduled", "status": "True"}],
               "containerStatuses": waiting}),
    )
    .await;
    let b = env
        .vmi_where("b", "Synchronized=False", |v| {
            cond(v, "Synchronized").is_some_and(|c| c.reason.as_deref() == Some("ImagePullBackOff"))
        })
        .await;
    assert_eq!(
        cond(&b, "Synchronized").unwrap().message.as_deref(),
        Some("Back-off pulling image")
    );
    assert!(cond(&b, "PodScheduled").is_none());
    let failed = json!([{"name": "virt-bin", "image": "localhost/kubevirt-rs/virt-launcher:latest",
        "imageID": "", "ready": false, "restartCount": 0,
        "state": {"terminated": {"exitCode": 1, "message": "cp: can't create '/virt-bin/busybox'"}}}]);
    env.pod_status(
        &pod_name,
        json!({"phase": "Failed", "initContainerStatuses": failed}),
    )
    .await;
    let b = env.phase("b", Phase::Failed).await;
    assert_eq!(
        b.status.as_ref().unwrap().reason.as_deref(),
        Some("PodFailed")
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(env.launcher_pods(&b).await.len(), 1, "kept for its logs");
    env.vmis()
        .delete("b", &DeleteParams::default())
        .await
        .unwrap();
    eventually("b to be gone", || async {
        env.vmis()
            .get_opt("b")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    assert!(env.launcher_pods(&b).await.is_empty());

    // 3. Deleting a running VMI deletes its pod with the VMI's grace + 15 s and keeps
    //    the VMI until the kubelet is done with the pod.
    env.create_vmi("c").await;
    let c = env.phase("c", Phase::Scheduling).await;
    let pod_name = env.only_pod(&c).await.name_any();
    env.bind(&pod_name, "node-1").await;
    env.pod_status(
        &pod_name,
        json!({"phase": "Running", "containerStatuses": compute(json!({"running": {}}))}),
    )
    .await;
    env.phase("c", Phase::Scheduled).await;
    env.vmis()
        .delete("c", &DeleteParams::default())
        .await
        .unwrap();
    let pod = eventually("the pod to be terminating", || async {
        env.pods()
            .get_opt(&pod_name)
            .await
            .unwrap()
            .filter(|p| p.metadata.deletion_timestamp.is_some())
    })
    .await;
    assert_eq!(pod.metadata.deletion_grace_period_seconds, Some(5 + 15));
    let c = env.vmis().get("c").await.unwrap();
    assert!(c.metadata.deletion_timestamp.is_some());
    assert!(
        c.finalizers().iter().any(|f| f == FINALIZER),
        "held by the pod"
    );
    env.pod_status(
        &pod_name,
        json!({"phase": "Succeeded", "containerStatuses": compute(json!({"terminated": {"exitCode": 0}}))}),
    )
    .await;
    env.phase("c", Phase::Succeeded).await;
    env.pods()
        .delete(
            &pod_name,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            },
        )
        .await
        .unwrap();
    eventually("c to be gone", || async {
        env.vmis()
            .get_opt("c")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    let reasons = env.events_of("c").await;
    assert!(
        reasons.iter().any(|r| r == "SuccessfulDelete"),
        "{reasons:?}"
    );

    // 4. Through a VM: the VM's printableStatus shows where its instance is stuck
    //    (ErrorUnschedulable, ImagePullBackOff), then Running; stopping it deletes the
    //    VMI, whose pod goes first.
    let vm: VirtualMachine = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": "d"},
        "spec": {"runStrategy": "Always", "template": {"spec": {
            "domain": {"devices": {}, "resources": {"requests": {"memory": "64Mi"}}},
            "terminationGracePeriodSeconds": 5}}}
    }))
    .unwrap();
    env.vms().create(&PostParams::default(), &vm).await.unwrap();
    let d = env.phase("d", Phase::Scheduling).await;
    let pod_name = env.only_pod(&d).await.name_any();
    let printable = |want: PrintableStatus| {
        let env = &env;
        async move {
            eventually(&format!("VM printableStatus {want:?}"), || async {
                let vm = env.vms().get("d").await.unwrap();
                (vm.status.and_then(|s| s.printable_status) == Some(want)).then_some(())
            })
            .await
        }
    };
    printable(PrintableStatus::Starting).await;
    env.pod_status(
        &pod_name,
        json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
            "reason": "Unschedulable", "message": "0/1 nodes are available"}]}),
    )
    .await;
    printable(PrintableStatus::ErrorUnschedulable).await;
    env.bind(&pod_name, "node-1").await;
    let waiting = json!([{"name": "compute", "image": "localhost/kubevirt-rs/virt-launcher:latest",
        "imageID": "", "ready": false, "restartCount": 0,
        "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}]);
    env.pod_status(
        &pod_name,
        json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}],
               "containerStatuses": waiting}),
    )
    .await;
    printable(PrintableStatus::ImagePullBackOff).await;
    env.pod_status(
        &pod_name,
        json!({"phase": "Running", "containerStatuses": compute(json!({"running": {}}))}),
    )
    .await;
    env.phase("d", Phase::Scheduled).await;
    env.vmis()
        .patch_status(
            "d",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"phase": "Running"}})),
        )
        .await
        .unwrap();
    printable(PrintableStatus::Running).await;
    env.vms()
        .patch(
            "d",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"runStrategy": "Halted"}})),
        )
        .await
        .unwrap();
    printable(PrintableStatus::Stopping).await;
    eventually("d's pod to be terminating", || async {
        env.pods()
            .get_opt(&pod_name)
            .await
            .unwrap()
            .and_then(|p| p.metadata.deletion_timestamp)
    })
    .await;
    env.pods()
        .delete(
            &pod_name,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            },
        )
        .await
        .unwrap();
    printable(PrintableStatus::Stopped).await;
    assert!(env.vmis().get_opt("d").await.unwrap().is_none());

    // 5. A drain (eviction API): the VMI fails as soon as kube-apiserver marks the pod
    //    as a DisruptionTarget, while the pod still terminates.
    env.create_vmi("e").await;
    let e = env.phase("e", Phase::Scheduling).await;
    let pod_name = env.only_pod(&e).await.name_any();
    env.bind(&pod_name, "node-1").await;
    env.pod_status(
        &pod_name,
        json!({"phase": "Running", "containerStatuses": compute(json!({"running": {}}))}),
    )
    .await;
    env.phase("e", Phase::Scheduled).await;
    env.pods()
        .evict(&pod_name, &EvictParams::default())
        .await
        .unwrap();
    let e = env.phase("e", Phase::Failed).await;
    assert_eq!(
        e.status.as_ref().unwrap().reason.as_deref(),
        Some("Evicted")
    );
    let ready = cond(&e, "Ready").unwrap().message.clone().unwrap();
    assert!(ready.starts_with("EvictionByEvictionAPI"), "{ready}");
    let pod = env.pods().get(&pod_name).await.unwrap();
    assert!(
        pod.metadata.deletion_timestamp.is_some(),
        "still terminating"
    );
    env.vmis()
        .delete("e", &DeleteParams::default())
        .await
        .unwrap();
    env.pods()
        .delete(
            &pod_name,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            },
        )
        .await
        .unwrap();
    eventually("e to be gone", || async {
        env.vmis()
            .get_opt("e")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;

    let metrics = ctx.metrics.encode();
    for phase in ["Scheduling", "Scheduled", "Failed"] {
        assert!(
            metrics.contains(&format!(
                "kubevirt_vmi_phase_transition_time_from_creation_seconds_count{{phase=\"{phase}\"}}"
            )),
            "{phase}: {metrics}"
        );
    }
    stop.cancel();
}

/// The launcher-pod cache's guard, reconcile by reconcile: the VMI controller reads pods
/// from a watch cache, so right after it created a pod the cache (and the cached VMI)
/// may not show it yet. Here the cache is fed by hand and never shows the pod until the
/// test says so: reconciles of the stale VMI in that window must create no second pod
/// and write nothing; once the cache shows the pod, a write from the stale VMI gets 409
/// instead of overwriting, and the retry reads the VMI fresh; an externally deleted pod
/// still fails the VMI, with no new pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unseen_pod_creations_hold_the_vmi_instead_of_creating_a_second_launcher() {
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;
    use virt_controllers::expectations::Expectations;
    use virt_controllers::vmi::pods::LauncherPods;
    use virt_controllers::vmi::{Vmis, reconcile};

    let env = Env::start().await;
    let config = Config {
        namespace: Some(NS.to_string()),
        launcher: LauncherConfig {
            allow_emulation: true,
            ..LauncherConfig::default()
        },
        ..Config::default()
    };
    let ctx = Arc::new(Context::new(env.client.clone(), None, config));
    let (reader, mut writer) = reflector::store();
    let state = Arc::new(Vmis {
        ctx,
        pods: LauncherPods::new(reader, Expectations::default()),
        stale: Default::default(),
        attachments: reflector::store().0,
    });
    // The first list: no pods.
    for ev in [Event::Init, Event::InitDone] {
        writer.apply_watcher_event(&ev);
        state.pods.observe(&ev);
    }

    env.create_vmi("d").await;
    // The VMI as the controller's cache has it: Pending, never updated below.
    let stale = Arc::new(env.vmis().get("d").await.unwrap());
    reconcile::reconcile(stale.clone(), state.clone())
        .await
        .unwrap();
    let d = env.phase("d", Phase::Scheduling).await;
    let pod = env.only_pod(&d).await;

    // The watch has shown neither the pod nor the new VMI: every reconcile waits.
    for _ in 0..3 {
        reconcile::reconcile(stale.clone(), state.clone())
            .await
            .unwrap();
    }
    assert_eq!(env.launcher_pods(&d).await.len(), 1, "no second launcher");
    let still = env.vmis().get("d").await.unwrap();
    assert_eq!(
        still.metadata.resource_version, d.metadata.resource_version,
        "nothing written while the cache lags"
    );

    // The pod arrives; the cached VMI is still the Pending one: its status write is
    // refused (resourceVersion), never applied over the newer status.
    let ev = Event::Apply(cached(&pod));
    writer.apply_watcher_event(&ev);
    state.pods.observe(&ev);
    let err = reconcile::reconcile(stale.clone(), state.clone())
        .await
        .unwrap_err();
    assert_eq!(err.reason(), "FailedStatusUpdate", "{err}");
    assert_eq!(env.launcher_pods(&d).await.len(), 1);
    env.phase("d", Phase::Scheduling).await;

    // The conflict marks the cached VMI stale: the retry reads it fresh, so even a watch
    // that never brings the newer VMI cannot wedge it.
    reconcile::error_policy(stale.clone(), &err, state.clone());
    reconcile::reconcile(stale.clone(), state.clone())
        .await
        .unwrap();
    assert_eq!(env.launcher_pods(&d).await.len(), 1);

    // With the current VMI all is in order.
    let current = Arc::new(env.vmis().get("d").await.unwrap());
    reconcile::reconcile(current, state.clone()).await.unwrap();
    assert_eq!(env.launcher_pods(&d).await.len(), 1);

    // Someone deletes the pod: the VMI fails as before, and gets no new pod.
    env.pods()
        .delete(
            &pod.name_any(),
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..DeleteParams::default()
            },
        )
        .await
        .unwrap();
    let ev = Event::Delete(cached(&pod));
    writer.apply_watcher_event(&ev);
    state.pods.observe(&ev);
    let current = Arc::new(env.vmis().get("d").await.unwrap());
    reconcile::reconcile(current, state.clone()).await.unwrap();
    let d = env.phase("d", Phase::Failed).await;
    assert_eq!(
        d.status.as_ref().unwrap().reason.as_deref(),
        Some("PodNotExists")
    );
    for _ in 0..2 {
        let current = Arc::new(env.vmis().get("d").await.unwrap());
        reconcile::reconcile(current, state.clone()).await.unwrap();
    }
    assert!(env.launcher_pods(&d).await.is_empty(), "never a second pod");
}

/// virt-controller's recorder against the real events.k8s.io API: a repeat is counted
/// into the first Event's series, a different reason is an Event of its own.
#[tokio::test]
async fn repeated_events_are_counted_into_one_series() {
    use k8s_openapi::api::core::v1::ObjectReference;
    use k8s_openapi::api::events::v1::Event;
    use kube::runtime::events::EventType;

    let env = Env::start().await;
    let recorder = Recorder::new(env.client.clone(), "virt-controller", "test");
    let regarding = ObjectReference {
        api_version: Some("kubevirt.io/v1".into()),
        kind: Some("VirtualMachineInstance".into()),
        namespace: Some(NS.into()),
        name: Some("ev".into()),
        uid: Some("ev-uid".into()),
        ..ObjectReference::default()
    };
    for _ in 0..3 {
        recorder
            .publish(
                &regarding,
                EventType::Warning,
                "FailedCreate",
                "Create",
                "no room",
            )
            .await
            .unwrap();
    }
    recorder
        .publish(
            &regarding,
            EventType::Normal,
            "SuccessfulCreate",
            "Create",
            "made",
        )
        .await
        .unwrap();
    let events = kube::Api::<Event>::namespaced(env.client.clone(), NS)
        .list(&Default::default())
        .await
        .unwrap();
    let mut got: Vec<_> = events
        .items
        .iter()
        .map(|e| {
            (
                e.reason.clone().unwrap(),
                e.series.as_ref().map(|s| s.count),
                e.reporting_controller.clone().unwrap(),
            )
        })
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            (
                "FailedCreate".to_string(),
                Some(3),
                "virt-controller".to_string()
            ),
            (
                "SuccessfulCreate".to_string(),
                None,
                "virt-controller".to_string()
            ),
        ]
    );
}

/// A pod as the VMI controller's cache holds it (deserialized from the API's JSON).
fn cached(pod: &k8s_openapi::api::core::v1::Pod) -> virt_controllers::vmi::pods::CachedPod {
    serde_json::from_value(serde_json::to_value(pod).unwrap()).unwrap()
}
