//! Volume hotplug subresources (issue 44) against a real etcd, a real kube-apiserver (the
//! claims and pods virt-apiserver checks an add against) and the real virt-apiserver binary:
//! refused without a hotplug feature gate; on a running VMI an add is a 202 and the VMI's
//! spec has the volume and its disk, a duplicate name is a 409, a missing claim a 422 naming
//! it, a ReadWriteOnce claim a running pod on another node uses a 409 naming the pod and its
//! node, removing a volume that was not hotplugged a 409, a dry run writes nothing; on a VM
//! under HotplugVolumes an add is queued in its status.volumeRequests.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{VMS, admin, json_of};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, ServiceAccount};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const VMIS: &str = "/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances";
const SUB: &str = "/apis/subresources.kubevirt.io/v1/namespaces/default";

fn vmi(name: &str) -> Value {
    json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": name},
        "spec": {"domain": {"devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]},
                            "resources": {"requests": {"memory": "64Mi"}}},
                 "volumes": [{"name": "root", "containerDisk": {"image": "localhost/kubevirt-rs/test-guest:latest"}}]}})
}

fn add(name: &str, claim: &str) -> Value {
    json!({"name": name, "disk": {"disk": {"bus": "scsi"}, "serial": name},
        "volumeSource": {"persistentVolumeClaim": {"claimName": claim}}})
}

async fn put(c: &reqwest::Client, url: &str, body: Option<&Value>) -> (u16, Value) {
    let mut r = c.put(url);
    if let Some(b) = body {
        r = r.json(b);
    }
    json_of(r.send().await.unwrap()).await
}

async fn create_running_vmi(c: &reqwest::Client, base: &str, name: &str) {
    let r = c
        .post(format!("{base}{VMIS}"))
        .json(&vmi(name))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let r = c
        .patch(format!("{base}{VMIS}/{name}/status"))
        .header("Content-Type", "application/merge-patch+json")
        .json(&json!({"status": {"phase": "Running", "nodeName": "node-a"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn volume_subresources_need_a_hotplug_gate() {
    let env = common::start_with(&[]);
    let (base, c) = (env.server_url.clone(), admin(&env));
    create_running_vmi(&c, &base, "a").await;
    for (kind, sub) in [
        ("virtualmachineinstances", "addvolume"),
        ("virtualmachineinstances", "removevolume"),
        ("virtualmachines", "addvolume"),
    ] {
        // KubeVirt's answer comes before the body is looked at.
        let (code, s) = put(&c, &format!("{base}{SUB}/{kind}/a/{sub}"), None).await;
        assert_eq!(code, 400, "{kind}/{sub}: {s}");
        assert_eq!(
            s["message"],
            "Enable DeclarativeHotplugVolumes or HotplugVolumes feature gate to use this API."
        );
    }
    // Discovery lists them either way (they are the catalogue's).
    let (_, d) = json_of(
        c.get(format!("{base}/apis/subresources.kubevirt.io/v1"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let names: Vec<&str> = d["resources"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    for n in [
        "virtualmachines/addvolume",
        "virtualmachines/removevolume",
        "virtualmachineinstances/addvolume",
        "virtualmachineinstances/removevolume",
    ] {
        assert!(names.contains(&n), "{n} not in {names:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hotplug_requests_on_vmis_and_vms() {
    let kube = kube_testenv::KubeApi::start("hotplug").await;
    let kc = kube.client.clone();
    let env = virt_devenv::DevEnv::start(virt_devenv::Options {
        apiserver_bin: env!("CARGO_BIN_EXE_virt-apiserver").into(),
        allow_client_ca_users: false,
        kube_kubeconfig: Some(kube.dir.path().join("kubeconfig")),
        extra_args: vec!["--feature-gates=HotplugVolumes".into()],
        ..Default::default()
    })
    .expect("start etcd and virt-apiserver");
    let (base, c) = (env.server_url.clone(), admin(&env));

    // Claims: data, data2 and shared (ReadWriteOnce, used by a running pod on node-b).
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(kc.clone(), "default");
    for name in ["data", "data2", "shared"] {
        let claim = serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "64Mi"}}}}))
        .unwrap();
        pvcs.create(&PostParams::default(), &claim).await.unwrap();
    }
    Api::<ServiceAccount>::namespaced(kc.clone(), "default")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap(),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(kc.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "user"},
        "spec": {"automountServiceAccountToken": false, "nodeName": "node-b",
                 "containers": [{"name": "c", "image": "x"}],
                 "volumes": [{"name": "s", "persistentVolumeClaim": {"claimName": "shared"}}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    pods.patch_status(
        "user",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running"}})),
    )
    .await
    .unwrap();

    // A VMI that does not run yet: 409.
    let r = c
        .post(format!("{base}{VMIS}"))
        .json(&vmi("a"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let url = |sub: &str| format!("{base}{SUB}/virtualmachineinstances/a/{sub}");
    let (code, s) = put(&c, &url("addvolume"), Some(&add("data", "data"))).await;
    assert_eq!(code, 409, "{s}");
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .contains("VMI is not running")
    );
    let r = c
        .patch(format!("{base}{VMIS}/a/status"))
        .header("Content-Type", "application/merge-patch+json")
        .json(&json!({"status": {"phase": "Running", "nodeName": "node-a"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // Bad bodies: 400 with KubeVirt's words.
    let (code, s) = put(&c, &url("addvolume"), None).await;
    assert_eq!(code, 400, "{s}");
    assert_eq!(
        s["message"],
        "Request with no body, a new name is expected as the request body"
    );
    let (code, s) = put(&c, &url("addvolume"), Some(&json!({"name": "x"}))).await;
    assert_eq!(
        (code, s["message"].as_str()),
        (400, Some("AddVolumeOptions requires disk to not be nil"))
    );

    // An add: 202, the volume (hotpluggable) and its disk in the VMI's spec.
    let (code, s) = put(&c, &url("addvolume"), Some(&add("data", "data"))).await;
    assert_eq!(code, 202, "{s}");
    let (_, got) = json_of(c.get(format!("{base}{VMIS}/a")).send().await.unwrap()).await;
    let volumes = got["spec"]["volumes"].as_array().unwrap();
    assert_eq!(volumes.len(), 2, "{got}");
    assert_eq!(volumes[1]["name"], "data");
    assert_eq!(volumes[1]["persistentVolumeClaim"]["hotpluggable"], true);
    let disks = got["spec"]["domain"]["devices"]["disks"]
        .as_array()
        .unwrap();
    assert_eq!(disks[1]["name"], "data");
    assert_eq!(disks[1]["serial"], "data");

    // The same name again, or the same claim under another name: 409 naming it.
    let (code, s) = put(&c, &url("addvolume"), Some(&add("data", "data2"))).await;
    assert_eq!(code, 409, "{s}");
    assert!(s["message"].as_str().unwrap().contains("[data]"), "{s}");
    let (code, s) = put(&c, &url("addvolume"), Some(&add("other", "data"))).await;
    assert_eq!(code, 409, "{s}");

    // A claim that does not exist: 422 naming the field and the claim.
    let (code, s) = put(&c, &url("addvolume"), Some(&add("nope", "nope-pvc"))).await;
    assert_eq!(code, 422, "{s}");
    assert_eq!(
        s["details"]["causes"][0]["field"],
        "volumeSource.persistentVolumeClaim.claimName"
    );
    assert!(s["message"].as_str().unwrap().contains("nope-pvc"), "{s}");

    // A ReadWriteOnce claim a running pod on another node uses: 409 naming both.
    let (code, s) = put(&c, &url("addvolume"), Some(&add("shared", "shared"))).await;
    assert_eq!(code, 409, "{s}");
    let m = s["message"].as_str().unwrap();
    assert!(
        m.contains("shared") && m.contains("user") && m.contains("node-b"),
        "{m}"
    );

    // Removing a volume the VMI started with: 409.
    let (code, s) = put(&c, &url("removevolume"), Some(&json!({"name": "root"}))).await;
    assert_eq!(code, 409, "{s}");
    assert!(s["message"].as_str().unwrap().contains("not hotpluggable"));

    // A dry run: 202, nothing written.
    let rv = got["metadata"]["resourceVersion"].clone();
    let mut dry = add("data2", "data2");
    dry["dryRun"] = json!(["All"]);
    let (code, s) = put(&c, &url("addvolume"), Some(&dry)).await;
    assert_eq!(code, 202, "{s}");
    let (_, now) = json_of(c.get(format!("{base}{VMIS}/a")).send().await.unwrap()).await;
    assert_eq!(now["metadata"]["resourceVersion"], rv);

    // A remove: the volume and its disk go.
    let (code, s) = put(&c, &url("removevolume"), Some(&json!({"name": "data"}))).await;
    assert_eq!(code, 202, "{s}");
    let (_, now) = json_of(c.get(format!("{base}{VMIS}/a")).send().await.unwrap()).await;
    assert_eq!(now["spec"]["volumes"].as_array().unwrap().len(), 1);
    assert_eq!(
        now["spec"]["domain"]["devices"]["disks"]
            .as_array()
            .unwrap()
            .len(),
        1
    );

    // A VM under HotplugVolumes: the add is queued in its status, once.
    let r = c
        .post(format!("{base}{VMS}"))
        .json(&common::vm("vm1"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let vm_url = |sub: &str| format!("{base}{SUB}/virtualmachines/vm1/{sub}");
    let (code, s) = put(&c, &vm_url("addvolume"), Some(&add("data", "data"))).await;
    assert_eq!(code, 202, "{s}");
    let (_, vm) = json_of(c.get(format!("{base}{VMS}/vm1")).send().await.unwrap()).await;
    let requests = vm["status"]["volumeRequests"].as_array().unwrap();
    assert_eq!(requests.len(), 1, "{vm}");
    assert_eq!(requests[0]["addVolumeOptions"]["name"], "data");
    assert_eq!(
        requests[0]["addVolumeOptions"]["volumeSource"]["persistentVolumeClaim"]["hotpluggable"],
        true
    );
    assert!(
        vm["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v["name"] != "data"),
        "the template waits for virt-controller"
    );
    let (code, s) = put(&c, &vm_url("addvolume"), Some(&add("data", "data"))).await;
    assert_eq!(code, 409, "{s}");
    assert!(s["message"].as_str().unwrap().contains("already exists"));
    let (code, s) = put(&c, &vm_url("addvolume"), Some(&add("gone", "gone"))).await;
    assert_eq!(code, 422, "{s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declarative_hotplug_writes_a_vms_template() {
    // Standalone (no kube-apiserver): no claims to check.
    let env = common::start_with(&["--feature-gates=DeclarativeHotplugVolumes"]);
    let (base, c) = (env.server_url.clone(), admin(&env));
    let r = c
        .post(format!("{base}{VMS}"))
        .json(&common::vm("vm1"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let url = |sub: &str| format!("{base}{SUB}/virtualmachines/vm1/{sub}");
    let (code, s) = put(&c, &url("addvolume"), Some(&add("data", "data"))).await;
    assert_eq!(code, 202, "{s}");
    let (_, vm) = json_of(c.get(format!("{base}{VMS}/vm1")).send().await.unwrap()).await;
    assert!(vm["status"]["volumeRequests"].is_null(), "{vm}");
    let t = &vm["spec"]["template"]["spec"];
    assert_eq!(t["volumes"][1]["name"], "data", "{vm}");
    assert_eq!(
        t["volumes"][1]["persistentVolumeClaim"]["hotpluggable"],
        true
    );
    assert_eq!(t["domain"]["devices"]["disks"][1]["name"], "data");
    let (code, s) = put(&c, &url("removevolume"), Some(&json!({"name": "data"}))).await;
    assert_eq!(code, 202, "{s}");
    let (_, vm) = json_of(c.get(format!("{base}{VMS}/vm1")).send().await.unwrap()).await;
    assert_eq!(
        vm["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}
