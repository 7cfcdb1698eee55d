//! The DataVolume controller (with the VM and VMI controllers) in-process against a real
//! kube-apiserver and etcd: claims and importer pods need the real core API (PVC and pod
//! validation, the binding subresource), DataVolumes, VMs and VMIs are served from CRDs
//! with a /status subresource (virt-apiserver serves them in a cluster). No scheduler,
//! kubelet or provisioner runs: the test binds claims and writes the importer's status.
//! A clone (`source.pvc`) waits while its source is used by another pod, then gets its
//! claim (sized from the source) and one worker pod mounting both.
//!
//! kube-apiserver: `$KUBE_APISERVER_BIN`, else `target/k8s/*/bin/kube-apiserver`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use kubevirt_api::cdi::DataVolume;
use kubevirt_api::{PrintableStatus, VirtualMachine};
use serde_json::{Value, json};
use support::{KubeApi, NS, VM, VMI, eventually};
use tokio_util::sync::CancellationToken;
use virt_controllers::events::Recorder;
use virt_controllers::vmi::render::LauncherConfig;
use virt_controllers::{Config, Context};

const TOKEN: &str = "datavolume-controller-test-token";

struct Env {
    api: KubeApi,
    client: Client,
}

impl std::ops::Deref for Env {
    type Target = KubeApi;
    fn deref(&self) -> &KubeApi {
        &self.api
    }
}

impl Env {
    async fn start() -> Self {
        let api = KubeApi::start(TOKEN, &[VMI, VM]).await;
        api.install_datavolumes().await;
        let client = api.client.clone();
        let env = Self { api, client };
        // The cluster's classes: a plain one and the default (Immediate binding).
        env.class("plain", false, "Immediate").await;
        env.class("standard", true, "Immediate").await;
        env
    }

    async fn class(&self, name: &str, default: bool, mode: &str) {
        let mut annotations = serde_json::Map::new();
        if default {
            annotations.insert(
                "storageclass.kubernetes.io/is-default-class".into(),
                json!("true"),
            );
        }
        let sc: StorageClass = serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": annotations},
            "provisioner": "test.kubevirt-rs.io/none", "volumeBindingMode": mode
        }))
        .unwrap();
        Api::<StorageClass>::all(self.client.clone())
            .create(&PostParams::default(), &sc)
            .await
            .unwrap();
    }

    /// virt-controller's controllers, as it runs them.
    fn start_controllers(&self) -> CancellationToken {
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
        let vmis = virt_controllers::vmi::shared(&ctx, stop.clone());
        let dvs = virt_controllers::datavolume::shared(&ctx, stop.clone());
        tokio::spawn(virt_controllers::vmi::run(
            ctx.clone(),
            vmis.clone(),
            stop.clone(),
        ));
        tokio::spawn(virt_controllers::vm::run(
            ctx.clone(),
            vmis,
            dvs.clone(),
            stop.clone(),
        ));
        tokio::spawn(virt_controllers::datavolume::run(ctx, dvs, stop.clone()));
        stop
    }

    fn dvs(&self) -> Api<DataVolume> {
        Api::namespaced(self.client.clone(), NS)
    }

    fn claims(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), NS)
    }

    async fn dv_where(
        &self,
        name: &str,
        what: &str,
        f: impl Fn(&DataVolume) -> bool,
    ) -> DataVolume {
        eventually(what, || async {
            self.dvs().get_opt(name).await.unwrap().filter(|d| f(d))
        })
        .await
    }

    async fn dv_phase(&self, name: &str, phase: &str) -> DataVolume {
        self.dv_where(name, &format!("DataVolume {name} {phase}"), |d| {
            d.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phase)
        })
        .await
    }

    /// The provisioner's part: bind the claim.
    async fn bind_claim(&self, name: &str) {
        let size = self
            .claims()
            .get(name)
            .await
            .unwrap()
            .spec
            .unwrap()
            .resources
            .unwrap()
            .requests
            .unwrap()["storage"]
            .0
            .clone();
        self.claims()
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": {"phase": "Bound",
                    "accessModes": ["ReadWriteOnce"], "capacity": {"storage": size}}})),
            )
            .await
            .unwrap();
    }

    async fn importer(&self, name: &str) -> Pod {
        eventually(&format!("importer pod {name}"), || async {
            self.pods().get_opt(name).await.unwrap()
        })
        .await
    }
}

fn importer_status(phase: &str, state: Value, last: Value, restarts: i32) -> Value {
    json!({"phase": phase, "containerStatuses": [{"name": "importer",
        "image": "localhost/kubevirt-rs/virt-launcher:latest", "imageID": "", "ready": false,
        "restartCount": restarts, "state": state, "lastState": last}]})
}

fn running(d: &DataVolume) -> (String, String, String) {
    let c = d.status.as_ref().unwrap().condition("Running").unwrap();
    (
        format!("{:?}", c.status),
        c.reason.clone().unwrap_or_default(),
        c.message.clone().unwrap_or_default(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_data_volume_gets_its_claim_and_importer_and_succeeds() {
    let env = Env::start().await;
    let stop = env.start_controllers();

    let dv: DataVolume = serde_json::from_value(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "img"},
        "spec": {"source": {"http": {"url": "http://10.213.0.1:8000/disk.qcow2",
                                     "checksum": "sha256:00ff", "extraHeaders": ["X-Token: t"]}},
                 "storage": {"resources": {"requests": {"storage": "1Gi"}}}}
    }))
    .unwrap();
    let dv = env.dvs().create(&PostParams::default(), &dv).await.unwrap();

    // The claim: the default class, ReadWriteOnce, Filesystem, 1 GiB grown by the
    // overhead, owned by the DataVolume, CDI's label and annotations.
    let claim = eventually("the claim", || async {
        env.claims().get_opt("img").await.unwrap()
    })
    .await;
    let spec = claim.spec.clone().unwrap();
    assert_eq!(spec.storage_class_name.as_deref(), Some("standard"));
    assert_eq!(spec.access_modes, Some(vec!["ReadWriteOnce".to_string()]));
    assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
    assert_eq!(
        spec.resources.unwrap().requests.unwrap()["storage"].0,
        "1084Mi"
    );
    let owner = &claim.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("DataVolume", Some(true))
    );
    assert_eq!(Some(&owner.uid), dv.metadata.uid.as_ref());
    assert_eq!(claim.labels()["app"], "containerized-data-importer");
    assert_eq!(
        claim.annotations()["cdi.kubevirt.io/storage.import.source"],
        "http"
    );
    assert_eq!(
        claim.annotations()["cdi.kubevirt.io/storage.import.endpoint"],
        "http://10.213.0.1:8000/disk.qcow2"
    );

    // The importer pod: unprivileged, no API token, the claim at /data, the usable size.
    let pod = env.importer("importer-img").await;
    let ps = pod.spec.clone().unwrap();
    assert_eq!(ps.restart_policy.as_deref(), Some("OnFailure"));
    assert_eq!(ps.automount_service_account_token, Some(false));
    let psc = ps.security_context.clone().unwrap();
    assert_eq!(
        (psc.run_as_user, psc.fs_group, psc.run_as_non_root),
        (Some(107), Some(107), Some(true))
    );
    let c = &ps.containers[0];
    assert_eq!(
        c.image.as_deref(),
        Some("localhost/kubevirt-rs/virt-launcher:latest")
    );
    let args = c.args.clone().unwrap().join(" ");
    assert_eq!(
        args,
        "import --url http://10.213.0.1:8000/disk.qcow2 --target /data --size 1073741824 \
         --termination-log /dev/termination-log --checksum sha256:00ff --extra-header X-Token: t"
    );
    let sc = c.security_context.clone().unwrap();
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.capabilities.unwrap().drop, Some(vec!["ALL".to_string()]));
    assert!(ps.volumes.unwrap().iter().any(|v| {
        v.persistent_volume_claim
            .as_ref()
            .is_some_and(|c| c.claim_name == "img")
    }));
    assert_eq!(pod.owner_references()[0].kind, "DataVolume");
    env.dv_phase("img", "ImportScheduled").await;

    // kubelet's part: the claim binds, the importer runs, fails once, then succeeds.
    env.bind_claim("img").await;
    env.bind("importer-img", "node-1").await;
    env.pod_status(
        "importer-img",
        importer_status("Running", json!({"running": {}}), json!({}), 0),
    )
    .await;
    let d = env.dv_phase("img", "ImportInProgress").await;
    assert_eq!(
        d.status.as_ref().unwrap().claim_name.as_deref(),
        Some("img")
    );

    let failure = json!({"terminated": {"exitCode": 1, "reason": "Error",
        "message": "{\"reason\":\"HTTPNotFound\",\"message\":\"GET http://10.213.0.1:8000/disk.qcow2: 404 Not Found\"}"}});
    env.pod_status(
        "importer-img",
        importer_status(
            "Running",
            json!({"waiting": {"reason": "CrashLoopBackOff"}}),
            failure,
            1,
        ),
    )
    .await;
    let d = env
        .dv_where("img", "Running=False HTTPNotFound", |d| {
            d.status
                .as_ref()
                .and_then(|s| s.condition("Running"))
                .and_then(|c| c.reason.as_deref())
                == Some("HTTPNotFound")
        })
        .await;
    let st = d.status.clone().unwrap();
    assert_eq!(st.phase.as_deref(), Some("ImportInProgress"));
    assert_eq!(st.restart_count, Some(1));
    assert_eq!(running(&d).0, "False");
    assert!(running(&d).2.contains("404 Not Found"), "{:?}", running(&d));

    env.pod_status(
        "importer-img",
        importer_status(
            "Succeeded",
            json!({"terminated": {"exitCode": 0, "reason": "Completed",
                "message": "{\"reason\":\"Completed\",\"message\":\"imported\"}"}}),
            json!({}),
            1,
        ),
    )
    .await;
    let d = env.dv_phase("img", "Succeeded").await;
    let st = d.status.clone().unwrap();
    assert_eq!(st.progress.as_deref(), Some("100.0%"));
    assert_eq!(
        format!("{:?}", st.condition("Ready").unwrap().status),
        "True"
    );
    assert_eq!(
        st.condition("Running").unwrap().reason.as_deref(),
        Some("Completed")
    );
    // The pod goes (a bound pod: deleted gracefully, nothing here finishes it), the claim
    // records the success.
    eventually("the importer deleted", || async {
        match env.pods().get_opt("importer-img").await.unwrap() {
            None => Some(()),
            Some(p) => p.metadata.deletion_timestamp.map(|_| ()),
        }
    })
    .await;
    let claim = env.claims().get("img").await.unwrap();
    assert_eq!(
        claim.annotations()["cdi.kubevirt.io/storage.pod.phase"],
        "Succeeded"
    );
    let events = eventually("the DataVolume's events", || async {
        let e = env.events_of("img").await;
        (e.iter().any(|r| r == "ImportSucceeded") && e.iter().any(|r| r == "ErrImportFailed"))
            .then_some(e)
    })
    .await;
    assert!(events.iter().any(|r| r == "ImportScheduled"), "{events:?}");

    // A registry source is not carried out yet: Pending, naming it, no claim.
    let reg: DataVolume = serde_json::from_value(json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "reg"},
        "spec": {"source": {"registry": {"url": "docker://x/y"}},
                 "storage": {"resources": {"requests": {"storage": "1Gi"}}}}
    }))
    .unwrap();
    env.dvs()
        .create(&PostParams::default(), &reg)
        .await
        .unwrap();
    let d = env
        .dv_where("reg", "NotSupported", |d| {
            d.status
                .as_ref()
                .and_then(|s| s.condition("Running"))
                .and_then(|c| c.reason.as_deref())
                == Some("NotSupported")
        })
        .await;
    assert_eq!(d.status.unwrap().phase.as_deref(), Some("Pending"));
    assert!(env.claims().get_opt("reg").await.unwrap().is_none());
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vm_with_data_volume_templates_starts_once_its_data_volume_succeeded() {
    let env = Env::start().await;
    let stop = env.start_controllers();

    let vm: VirtualMachine = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": "vm"},
        "spec": {
            "runStrategy": "Always",
            "dataVolumeTemplates": [{
                "metadata": {"name": "vm-root", "labels": {"disk": "root"}},
                "spec": {"source": {"http": {"url": "http://10.213.0.1:8000/guest.qcow2"}},
                         "storage": {"resources": {"requests": {"storage": "64Mi"}}}}}],
            "template": {"spec": {
                "domain": {"devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]},
                           "resources": {"requests": {"memory": "64Mi"}}},
                "terminationGracePeriodSeconds": 5,
                "volumes": [{"name": "root", "dataVolume": {"name": "vm-root"}}]}}}
    }))
    .unwrap();
    let vm = env.vms().create(&PostParams::default(), &vm).await.unwrap();

    // Its DataVolume: the template, labelled with and controlled by the VM.
    let dv = eventually("the VM's DataVolume", || async {
        env.dvs().get_opt("vm-root").await.unwrap()
    })
    .await;
    assert_eq!(dv.labels()["kubevirt.io/created-by"], vm.uid().unwrap());
    assert_eq!(dv.labels()["disk"], "root");
    assert_eq!(
        dv.annotations()["cdi.kubevirt.io/allowClaimAdoption"],
        "true"
    );
    let owner = &dv.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("VirtualMachine", Some(true))
    );
    assert_eq!(Some(&owner.uid), vm.metadata.uid.as_ref());

    // Provisioning, and no VMI, while the import runs.
    eventually("VM Provisioning", || async {
        let v = env.vms().get("vm").await.unwrap();
        (v.status.and_then(|s| s.printable_status) == Some(PrintableStatus::Provisioning))
            .then_some(())
    })
    .await;
    env.importer("importer-vm-root").await;
    env.bind_claim("vm-root").await;
    env.bind("importer-vm-root", "node-1").await;
    env.pod_status(
        "importer-vm-root",
        importer_status("Running", json!({"running": {}}), json!({}), 0),
    )
    .await;
    env.dv_phase("vm-root", "ImportInProgress").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        env.vmis().get_opt("vm").await.unwrap().is_none(),
        "no VMI before the import is done"
    );
    let v = env.vms().get("vm").await.unwrap();
    assert_eq!(
        v.status.unwrap().printable_status,
        Some(PrintableStatus::Provisioning)
    );

    env.pod_status(
        "importer-vm-root",
        importer_status(
            "Succeeded",
            json!({"terminated": {"exitCode": 0, "reason": "Completed"}}),
            json!({}),
            0,
        ),
    )
    .await;
    env.dv_phase("vm-root", "Succeeded").await;
    // Now the VMI, and its launcher pod mounting the DataVolume's claim.
    let vmi = eventually("the VMI", || async {
        env.vmis().get_opt("vm").await.unwrap()
    })
    .await;
    let launcher = eventually("the launcher pod", || async {
        let sel = format!("kubevirt.io/created-by={}", vmi.uid().unwrap());
        env.pods()
            .list(&ListParams::default().labels(&sel))
            .await
            .unwrap()
            .items
            .into_iter()
            .next()
    })
    .await;
    let vols = launcher.spec.unwrap().volumes.unwrap();
    assert!(
        vols.iter().any(|v| v
            .persistent_volume_claim
            .as_ref()
            .is_some_and(|c| c.claim_name == "vm-root")),
        "{vols:?}"
    );
    let vmi = env
        .vmi_where("vm", "DataVolumesReady", |v| {
            v.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| {
                    cs.iter().any(|c| {
                        c.type_ == "DataVolumesReady" && c.reason.as_deref() == Some("AllDVsReady")
                    })
                })
        })
        .await;
    let info = vmi.status.unwrap().volume_status.unwrap();
    assert_eq!(
        info[0]
            .persistent_volume_claim_info
            .as_ref()
            .unwrap()
            .claim_name
            .as_deref(),
        Some("vm-root")
    );
    assert!(
        env.events_of("vm")
            .await
            .iter()
            .any(|r| r == "SuccessfulDataVolumeCreate")
    );
    stop.cancel();
}

fn running_reason(d: &DataVolume) -> Option<(String, String)> {
    let c = d.status.as_ref()?.condition("Running")?;
    Some((
        c.reason.clone().unwrap_or_default(),
        c.message.clone().unwrap_or_default(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_waits_for_its_source_then_copies_it_with_one_worker() {
    let env = Env::start().await;
    let stop = env.start_controllers();
    let clone_dv = |name: &str, source: &str| -> DataVolume {
        serde_json::from_value(json!({
            "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": name},
            "spec": {"source": {"pvc": {"name": source}}, "storage": {}}
        }))
        .unwrap()
    };
    let reason_is = |want: &'static str| {
        move |d: &DataVolume| running_reason(d).is_some_and(|(r, _)| r == want)
    };

    // No source at all: CloneScheduled, CDI's CloneWithoutSource, no claim.
    env.dvs()
        .create(&PostParams::default(), &clone_dv("orphan", "nowhere"))
        .await
        .unwrap();
    let d = env
        .dv_where(
            "orphan",
            "CloneWithoutSource",
            reason_is("CloneWithoutSource"),
        )
        .await;
    assert_eq!(
        d.status.as_ref().unwrap().phase.as_deref(),
        Some("CloneScheduled")
    );
    assert!(env.claims().get_opt("orphan").await.unwrap().is_none());

    // A user's claim (no CDI label: not in the controller's caches), bound, written by a
    // running pod: the clone waits for it.
    let golden: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "golden"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "plain",
                 "resources": {"requests": {"storage": "68Mi"}}}
    }))
    .unwrap();
    env.claims()
        .create(&PostParams::default(), &golden)
        .await
        .unwrap();
    env.bind_claim("golden").await;
    let user: Pod = serde_json::from_value(json!({
        "metadata": {"name": "writer"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}],
                 "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "golden"}}]}
    }))
    .unwrap();
    env.pods()
        .create(&PostParams::default(), &user)
        .await
        .unwrap();
    env.bind("writer", "node-1").await;
    env.pod_status("writer", json!({"phase": "Running"})).await;
    let dv = env
        .dvs()
        .create(&PostParams::default(), &clone_dv("copy", "golden"))
        .await
        .unwrap();
    let d = env
        .dv_where("copy", "CloneSourceInUse", reason_is("CloneSourceInUse"))
        .await;
    assert_eq!(
        d.status.as_ref().unwrap().phase.as_deref(),
        Some("CloneScheduled")
    );
    assert_eq!(
        running_reason(&d).unwrap().1,
        "pod default/writer using PersistentVolumeClaim golden"
    );
    assert!(env.claims().get_opt("copy").await.unwrap().is_none());
    assert!(
        env.pods()
            .get_opt("cdi-clone-copy")
            .await
            .unwrap()
            .is_none()
    );

    // The writer finishes: the claim, sized as the source, and the worker.
    env.pod_status("writer", json!({"phase": "Succeeded"}))
        .await;
    let claim = eventually("the clone's claim", || async {
        env.claims().get_opt("copy").await.unwrap()
    })
    .await;
    let spec = claim.spec.clone().unwrap();
    assert_eq!(
        spec.resources.unwrap().requests.unwrap()["storage"].0,
        "68Mi",
        "the source's size, not grown again"
    );
    assert_eq!(spec.storage_class_name.as_deref(), Some("standard"));
    assert_eq!(claim.annotations()["k8s.io/CloneRequest"], "default/golden");
    assert_eq!(claim.owner_references()[0].uid, dv.uid().unwrap());
    let pod = env.importer("cdi-clone-copy").await;
    let ps = pod.spec.clone().unwrap();
    assert_eq!(ps.restart_policy.as_deref(), Some("OnFailure"));
    assert_eq!(ps.automount_service_account_token, Some(false));
    let psc = ps.security_context.clone().unwrap();
    assert_eq!(
        (psc.run_as_user, psc.fs_group, psc.run_as_non_root),
        (Some(107), Some(107), Some(true))
    );
    let vols = ps.volumes.clone().unwrap();
    let pvc_of = |n: &str| {
        vols.iter()
            .find(|v| v.name == n)
            .and_then(|v| v.persistent_volume_claim.clone())
            .unwrap()
    };
    assert_eq!(
        (
            pvc_of("source").claim_name.as_str(),
            pvc_of("source").read_only
        ),
        ("golden", Some(true))
    );
    assert_eq!(pvc_of("data").claim_name, "copy");
    let c = &ps.containers[0];
    assert_eq!(c.command, Some(vec!["/usr/bin/virt-importer".to_string()]));
    // 68 MiB × 0.945 → 64 MiB usable.
    assert_eq!(
        c.args.clone().unwrap().join(" "),
        "clone --source /source --target /data --size 67108864 \
         --termination-log /dev/termination-log"
    );
    assert!(
        c.volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .any(|m| m.name == "source" && m.mount_path == "/source" && m.read_only == Some(true))
    );
    let sc = c.security_context.clone().unwrap();
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.capabilities.unwrap().drop, Some(vec!["ALL".to_string()]));
    assert_eq!(pod.labels()["app"], "containerized-data-importer");
    assert_eq!(pod.owner_references()[0].kind, "DataVolume");
    env.dv_phase("copy", "CloneScheduled").await;

    // kubelet's part: the claim binds, the worker runs, then copies it.
    env.bind_claim("copy").await;
    env.bind("cdi-clone-copy", "node-1").await;
    env.pod_status(
        "cdi-clone-copy",
        json!({"phase": "Running", "containerStatuses": [{"name": "clone",
            "image": "localhost/kubevirt-rs/virt-launcher:latest", "imageID": "", "ready": true,
            "restartCount": 0, "state": {"running": {}}}]}),
    )
    .await;
    env.dv_phase("copy", "CloneInProgress").await;
    env.pod_status(
        "cdi-clone-copy",
        json!({"phase": "Succeeded", "containerStatuses": [{"name": "clone",
            "image": "localhost/kubevirt-rs/virt-launcher:latest", "imageID": "", "ready": false,
            "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                "message": "{\"reason\":\"Completed\",\"message\":\"cloned\"}"}}}]}),
    )
    .await;
    let d = env.dv_phase("copy", "Succeeded").await;
    let st = d.status.clone().unwrap();
    assert_eq!(st.progress.as_deref(), Some("100.0%"));
    assert_eq!(st.claim_name.as_deref(), Some("copy"));
    assert_eq!(
        running_reason(&d),
        Some(("Completed".to_string(), "Clone Complete".to_string()))
    );
    let claim = env.claims().get("copy").await.unwrap();
    assert_eq!(
        claim.annotations()["cdi.kubevirt.io/storage.pod.phase"],
        "Succeeded"
    );
    eventually("the clone worker deleted", || async {
        match env.pods().get_opt("cdi-clone-copy").await.unwrap() {
            None => Some(()),
            Some(p) => p.metadata.deletion_timestamp.map(|_| ()),
        }
    })
    .await;
    let events = eventually("the clone's events", || async {
        let e = env.events_of("copy").await;
        e.iter().any(|r| r == "CloneSucceeded").then_some(e)
    })
    .await;
    assert!(events.iter().any(|r| r == "CloneSourceInUse"), "{events:?}");
    assert!(events.iter().any(|r| r == "CloneScheduled"), "{events:?}");
    stop.cancel();
}
