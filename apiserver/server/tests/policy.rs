//! The input policy (kubevirt_api::policy and the name/hostDisk rules of validation)
//! against a real etcd and the real virt-apiserver: each rejection is a 422 naming the
//! field, nothing is stored, and our components (and system:masters) can still write
//! what they need.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{VMS, admin, client, vm};
use serde_json::{Value, json};
use virt_devenv::{ClientFiles, DevEnv, Options};

const VMIS: &str = "/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances";
const VMIMS: &str = "/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstancemigrations";
const MERGE: &str = "application/merge-patch+json";
const JSON_PATCH: &str = "application/json-patch+json";
const APPLY: &str = "application/apply-patch+yaml";

fn start(extra_args: &[&str]) -> DevEnv {
    common::start_with(extra_args)
}

/// A client-CA identity named `user` (authorized by the test's kube-apiserver, which
/// allows everything, so the policy is the only thing that tells users apart).
fn identity(env: &DevEnv, user: &str, group: &str) -> ClientFiles {
    let certs = env.dir().join("certs");
    let read = |f: &str| std::fs::read_to_string(certs.join(f)).unwrap();
    let ca = virt_certs::Ca::from_pem(&read("client-ca.crt"), &read("client-ca.key")).unwrap();
    let issued = ca
        .issue_client(user, &[group], time::Duration::days(1))
        .unwrap();
    let name = user.replace(':', "-");
    let (cert, key) = issued.write_pair(&certs, &name).unwrap();
    ClientFiles { cert, key }
}

/// virt-controller's service account, as it authenticates in a cluster.
fn controller(env: &DevEnv) -> reqwest::Client {
    client(
        env,
        Some(&identity(
            env,
            "system:serviceaccount:kubevirt:virt-controller",
            "system:serviceaccounts",
        )),
    )
}

/// A cluster admin through the front proxy (kube-apiserver's aggregator).
fn masters(env: &DevEnv) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("X-Remote-User", "admin".parse().unwrap());
    headers.insert("X-Remote-Group", "system:masters".parse().unwrap());
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&env.server_ca).unwrap()).unwrap();
    let mut pem = std::fs::read(&env.front_proxy.cert).unwrap();
    pem.extend(std::fs::read(&env.front_proxy.key).unwrap());
    reqwest::Client::builder()
        .add_root_certificate(ca)
        .use_rustls_tls()
        .identity(reqwest::Identity::from_pem(&pem).unwrap())
        .default_headers(headers)
        .build()
        .unwrap()
}

async fn json_of(r: reqwest::RequestBuilder) -> (u16, Value) {
    let r = r.send().await.unwrap();
    let code = r.status().as_u16();
    (code, r.json().await.unwrap_or(Value::Null))
}

/// A PATCH of `ct` (for server-side apply the JSON body is its YAML).
async fn patch(c: &reqwest::Client, url: &str, ct: &str, body: &Value) -> (u16, Value) {
    let body = body.to_string();
    let mut url = url.to_string();
    if ct == APPLY {
        url.push_str("?fieldManager=test&force=true");
    }
    json_of(c.patch(url).header("Content-Type", ct).body(body)).await
}

/// The fields named by the causes of a 422.
fn fields(status: &Value) -> Vec<String> {
    status["details"]["causes"]
        .as_array()
        .map(|c| {
            c.iter()
                .map(|c| c["field"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

fn assert_422(code: u16, status: &Value, field: &str) {
    assert_eq!(code, 422, "{status}");
    assert_eq!(status["reason"], "Invalid", "{status}");
    assert!(
        fields(status).iter().any(|f| f == field),
        "no cause for {field}: {status}"
    );
}

async fn absent(c: &reqwest::Client, url: &str) {
    assert_eq!(c.get(url).send().await.unwrap().status(), 404, "{url}");
}

fn vmi(name: &str, labels: Value) -> Value {
    json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "labels": labels},
        "spec": {"domain": {"devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]},
                            "resources": {"requests": {"memory": "64Mi"}}},
                 "volumes": [{"name": "root", "containerDisk": {"image": "localhost/kubevirt-rs/test-guest:latest"}}]}})
}

fn with_host_disk(mut vm: Value, host_disk: Value) -> Value {
    let spec = &mut vm["spec"]["template"]["spec"];
    spec["domain"]["devices"]["disks"] = json!([{"name": "local", "disk": {"bus": "virtio"}}]);
    spec["volumes"] = json!([{"name": "local", "hostDisk": host_disk}]);
    vm
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn host_disk_needs_the_gate_and_names_are_dns_labels() {
    let env = start(&[]);
    let base = &env.server_url;
    let sda = json!({"path": "/dev/sda", "type": "Disk"});

    // Gate off (the default): refused for everyone (the dev user and system:masters are
    // components), nothing stored.
    for c in [admin(&env), masters(&env)] {
        let (code, s) = json_of(
            c.post(format!("{base}{VMS}"))
                .json(&with_host_disk(vm("hd"), sda.clone())),
        )
        .await;
        assert_422(code, &s, "spec.template.spec.volumes[0].hostDisk");
        let msg = s["message"].as_str().unwrap();
        assert!(msg.contains("HostDisk feature gate"), "{msg}");
        absent(&c, &format!("{base}{VMS}/hd")).await;
    }
    let c = admin(&env);
    let mut direct = vmi("hd", json!({}));
    direct["spec"]["domain"]["devices"]["disks"] = json!([{"name": "local", "disk": {}}]);
    direct["spec"]["volumes"] = json!([{"name": "local", "hostDisk": sda}]);
    let (code, s) = json_of(c.post(format!("{base}{VMIS}")).json(&direct)).await;
    assert_422(code, &s, "spec.volumes[0].hostDisk");
    absent(&c, &format!("{base}{VMIS}/hd")).await;

    // Nor can an existing VM gain one (merge patch, server-side apply).
    let (code, _) = json_of(c.post(format!("{base}{VMS}")).json(&vm("plain"))).await;
    assert_eq!(code, 201);
    let added = with_host_disk(vm("plain"), json!({"path": "/dev/sda", "type": "Disk"}));
    for ct in [MERGE, APPLY] {
        let (code, s) = patch(&c, &format!("{base}{VMS}/plain"), ct, &added).await;
        assert_422(code, &s, "spec.template.spec.volumes[0].hostDisk");
    }
    let (_, stored) = json_of(c.get(format!("{base}{VMS}/plain"))).await;
    assert_eq!(
        stored["spec"]["template"]["spec"]["volumes"][0]["name"],
        "root"
    );

    // A volume name that is a path: 422 naming the volume and the disk, nothing stored.
    let mut escape = vm("escape");
    escape["spec"]["template"]["spec"]["volumes"][0]["name"] = json!("../x");
    escape["spec"]["template"]["spec"]["domain"]["devices"]["disks"][0]["name"] = json!("../x");
    let (code, s) = json_of(c.post(format!("{base}{VMS}")).json(&escape)).await;
    assert_422(code, &s, "spec.template.spec.volumes[0].name");
    assert_422(code, &s, "spec.template.spec.domain.devices.disks[0].name");
    absent(&c, &format!("{base}{VMS}/escape")).await;
    let mut iface = vmi("iface", json!({}));
    iface["spec"]["networks"] = json!([{"name": "Pod_Net", "pod": {}}]);
    iface["spec"]["domain"]["devices"]["interfaces"] =
        json!([{"name": "Pod_Net", "masquerade": {}}]);
    let (code, s) = json_of(c.post(format!("{base}{VMIS}")).json(&iface)).await;
    assert_422(code, &s, "spec.networks[0].name");
    assert_422(code, &s, "spec.domain.devices.interfaces[0].name");
    absent(&c, &format!("{base}{VMIS}/iface")).await;
    drop(env);

    // Gate on: allowed, but only with KubeVirt's type and path rules.
    let env = start(&["--feature-gates=LiveMigration,HostDisk"]);
    let base = &env.server_url;
    let c = admin(&env);
    let ok = with_host_disk(
        vm("hd"),
        json!({"path": "/var/lib/vms/hd.img", "type": "DiskOrCreate", "capacity": "1Mi"}),
    );
    let (code, s) = json_of(c.post(format!("{base}{VMS}")).json(&ok)).await;
    assert_eq!(code, 201, "{s}");
    for (hd, field) in [
        (json!({"path": "hd.img", "type": "Disk"}), "path"),
        (json!({"path": "/var/../dev/sda", "type": "Disk"}), "path"),
        (
            json!({"path": "/a.img", "type": "DiskOrCreate"}),
            "capacity",
        ),
        (json!({"path": "/a.img", "type": "Block"}), "type"),
    ] {
        let (code, s) = json_of(
            c.post(format!("{base}{VMS}"))
                .json(&with_host_disk(vm("bad"), hd)),
        )
        .await;
        assert_422(
            code,
            &s,
            &format!("spec.template.spec.volumes[0].hostDisk.{field}"),
        );
        assert_eq!(fields(&s).len(), 1, "{s}");
        absent(&c, &format!("{base}{VMS}/bad")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn vmi_and_vmim_specs_are_immutable() {
    let env = start(&[]);
    let base = &env.server_url;
    let c = admin(&env);
    let url = format!("{base}{VMIS}/i");
    let (code, created) = json_of(
        c.post(format!("{base}{VMIS}"))
            .json(&vmi("i", json!({"app": "a"}))),
    )
    .await;
    assert_eq!(code, 201, "{created}");
    let rv = created["metadata"]["resourceVersion"].clone();

    // Adding a volume to the VMI, by every kind of write and every kind of writer (the
    // dev user, system:masters, virt-controller's service account: components all).
    let extra = json!([
        {"name": "root", "containerDisk": {"image": "localhost/kubevirt-rs/test-guest:latest"}},
        {"name": "extra", "emptyDisk": {"capacity": "1Mi"}}
    ]);
    let mut put = created.clone();
    put["spec"]["volumes"] = extra.clone();
    for writer in [admin(&env), masters(&env), controller(&env)] {
        let (code, s) = json_of(writer.put(&url).json(&put)).await;
        assert_422(code, &s, "spec.volumes");
        assert!(
            s["message"]
                .as_str()
                .unwrap()
                .contains("spec.volumes: Forbidden: field is immutable"),
            "{s}"
        );
    }
    let (code, s) = patch(&c, &url, MERGE, &json!({"spec": {"volumes": extra}})).await;
    assert_422(code, &s, "spec.volumes");
    let op = json!([{"op": "replace", "path": "/spec/domain/resources/requests/memory", "value": "1Gi"}]);
    let (code, s) = patch(&c, &url, JSON_PATCH, &op).await;
    assert_422(code, &s, "spec.domain");
    let mut applied = vmi("i", json!({"app": "a"}));
    applied["spec"]["volumes"] = extra;
    let (code, s) = patch(&c, &url, APPLY, &applied).await;
    assert_422(code, &s, "spec.volumes");
    let (_, stored) = json_of(c.get(&url)).await;
    assert_eq!(stored["metadata"]["resourceVersion"], rv, "nothing stored");

    // Metadata and status stay writable.
    let (code, s) = patch(
        &c,
        &url,
        MERGE,
        &json!({"metadata": {"labels": {"app": "b"}}}),
    )
    .await;
    assert_eq!(code, 200, "{s}");
    let (code, s) = patch(
        &c,
        &format!("{url}/status"),
        MERGE,
        &json!({"status": {"phase": "Scheduling"}}),
    )
    .await;
    assert_eq!(
        (code, &s["status"]["phase"]),
        (200, &json!("Scheduling")),
        "{s}"
    );

    // A migration's spec is fixed once created; its metadata is not.
    let (code, m) = json_of(c.post(format!("{base}{VMIMS}")).json(&json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
        "metadata": {"name": "m"}, "spec": {"vmiName": "i"}})))
    .await;
    assert_eq!(code, 201, "{m}");
    for writer in [admin(&env), masters(&env), controller(&env)] {
        let (code, s) = patch(
            &writer,
            &format!("{base}{VMIMS}/m"),
            MERGE,
            &json!({"spec": {"vmiName": "other"}}),
        )
        .await;
        assert_422(code, &s, "spec.vmiName");
    }
    let (code, s) = patch(
        &c,
        &format!("{base}{VMIMS}/m"),
        MERGE,
        &json!({"metadata": {"labels": {"team": "a"}}}),
    )
    .await;
    assert_eq!((code, &s["spec"]["vmiName"]), (200, &json!("i")), "{s}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reserved_labels_and_annotations_are_for_components() {
    // Users are told apart from components only with a real authorizer: without one, only
    // system:masters and --allow-client-ca-users users (full access) get in. kube-apiserver
    // allows everything here, so the dev user is an ordinary user.
    let kube = kube_testenv::KubeApi::start("policy-test-token").await;
    let kube_kubeconfig = kube.dir.path().join("kubeconfig");
    let env = tokio::task::spawn_blocking(move || {
        DevEnv::start(Options {
            apiserver_bin: env!("CARGO_BIN_EXE_virt-apiserver").into(),
            allow_client_ca_users: false,
            kube_kubeconfig: Some(kube_kubeconfig),
            ..Default::default()
        })
        .expect("start etcd and virt-apiserver")
    })
    .await
    .unwrap();
    let base = &env.server_url;
    let user = admin(&env);

    // A user cannot create a VM or VMI carrying reserved keys, in its template either.
    let mut vm_node = vm("n");
    vm_node["metadata"]["labels"]["kubevirt.io/nodeName"] = json!("node-1");
    let (code, s) = json_of(user.post(format!("{base}{VMS}")).json(&vm_node)).await;
    assert_422(code, &s, "metadata.labels[kubevirt.io/nodeName]");
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .contains("kubevirt.io/nodeName is reserved"),
        "{s}"
    );
    absent(&user, &format!("{base}{VMS}/n")).await;
    let mut templated = vm("t");
    templated["spec"]["template"]["metadata"] =
        json!({"labels": {"kubevirt.io/migrationTargetNodeName": "node-2"}});
    let (code, s) = json_of(user.post(format!("{base}{VMS}")).json(&templated)).await;
    assert_422(
        code,
        &s,
        "spec.template.metadata.labels[kubevirt.io/migrationTargetNodeName]",
    );
    absent(&user, &format!("{base}{VMS}/t")).await;
    let (code, s) = json_of(
        user.post(format!("{base}{VMIS}"))
            .json(&vmi("u", json!({"kubevirt.io/created-by": "x"}))),
    )
    .await;
    assert_422(code, &s, "metadata.labels[kubevirt.io/created-by]");
    absent(&user, &format!("{base}{VMIS}/u")).await;

    // The keys KubeVirt documents for users (and our own knobs) are fine.
    let mut knobs = vm("k");
    knobs["metadata"]["labels"]["kubevirt.io/domain"] = json!("k");
    knobs["spec"]["template"]["metadata"] = json!({
        "labels": {"kubevirt.io/size": "small"},
        "annotations": {"kubevirt-rs.io/migration-bandwidth-mib": "64",
                        "kubevirt.io/allow-pod-bridge-network-live-migration": ""}});
    let (code, s) = json_of(user.post(format!("{base}{VMS}")).json(&knobs)).await;
    assert_eq!(code, 201, "{s}");

    // virt-controller writes what it needs: a VMI with its labels, the node label,
    // a finalizer, status.
    let ctl = controller(&env);
    let url = format!("{base}{VMIS}/v");
    let (code, s) = json_of(ctl.post(format!("{base}{VMIS}")).json(&vmi(
        "v",
        json!({"kubevirt.io/created-by": "vm-uid", "app": "a"}),
    )))
    .await;
    assert_eq!(code, 201, "{s}");
    let (code, s) = patch(
        &ctl,
        &url,
        MERGE,
        &json!({"metadata": {"labels": {"kubevirt.io/nodeName": "node-1"},
                             "finalizers": ["kubevirt.io/virtualMachineControllerFinalize"]}}),
    )
    .await;
    assert_eq!(code, 200, "{s}");
    let (code, s) = patch(
        &ctl,
        &format!("{url}/status"),
        MERGE,
        &json!({"status": {"phase": "Scheduled", "nodeName": "node-1"}}),
    )
    .await;
    assert_eq!(code, 200, "{s}");

    // The user cannot move, drop or add reserved labels, but can edit around them.
    let (_, before) = json_of(user.get(&url)).await;
    for labels in [
        json!({"kubevirt.io/nodeName": "node-2"}),
        json!({"kubevirt.io/nodeName": null}),
        json!({"kubevirt.io/migrationTargetNodeName": "node-2"}),
    ] {
        let (code, s) = patch(&user, &url, MERGE, &json!({"metadata": {"labels": labels}})).await;
        assert_eq!(code, 422, "{labels}: {s}");
        assert!(
            fields(&s)[0].starts_with("metadata.labels[kubevirt.io/"),
            "{s}"
        );
    }
    let (_, after) = json_of(user.get(&url)).await;
    assert_eq!(
        after["metadata"]["resourceVersion"],
        before["metadata"]["resourceVersion"]
    );
    let mut edited = after.clone();
    edited["metadata"]["labels"]["app"] = json!("b");
    edited["metadata"]["annotations"] = json!({"note": "mine"});
    let (code, s) = json_of(user.put(&url).json(&edited)).await;
    assert_eq!(code, 200, "{s}");
    assert_eq!(s["metadata"]["labels"]["kubevirt.io/nodeName"], "node-1");

    // Another namespace's "virt-controller" is not ours; system:masters is trusted.
    let impostor = client(
        &env,
        Some(&identity(
            &env,
            "system:serviceaccount:default:virt-controller",
            "system:serviceaccounts",
        )),
    );
    let (code, s) = patch(
        &impostor,
        &url,
        MERGE,
        &json!({"metadata": {"labels": {"kubevirt.io/nodeName": "node-2"}}}),
    )
    .await;
    assert_422(code, &s, "metadata.labels[kubevirt.io/nodeName]");
    let (code, s) = patch(
        &masters(&env),
        &url,
        MERGE,
        &json!({"metadata": {"labels": {"kubevirt.io/nodeName": "node-2"}}}),
    )
    .await;
    assert_eq!(code, 200, "{s}");
    // The component can also remove the finalizer again (deletion completes).
    let (code, s) = patch(
        &ctl,
        &url,
        MERGE,
        &json!({"metadata": {"finalizers": null}}),
    )
    .await;
    assert_eq!(code, 200, "{s}");
}
