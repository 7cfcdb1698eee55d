//! instancetype.kubevirt.io/v1beta1 against a real etcd and the real virt-apiserver: the four
//! kinds in discovery with KubeVirt's short names, namespaced and cluster-scoped paths, the
//! instance type webhook's rules (422 naming the field, nothing stored), and KubeVirt's
//! common-instancetypes bundle stored unchanged (no unknown field).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{admin, json_of};
use serde_json::{Value, json};

const GV: &str = "/apis/instancetype.kubevirt.io/v1beta1";

fn instancetype(kind: &str, name: &str, spec: Value) -> Value {
    json!({"apiVersion": "instancetype.kubevirt.io/v1beta1", "kind": kind,
        "metadata": {"name": name}, "spec": spec})
}

/// Every document of one of KubeVirt's bundles (crate `common-instancetypes`: taken from
/// KubeVirt's Go module at build time, the same copy virt-operator deploys).
fn bundle(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .unwrap()
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn instancetypes_and_preferences_are_served() {
    let env = common::start(true);
    let base = env.server_url.clone();
    let c = admin(&env);

    // Discovery: the group, its kinds and KubeVirt's short names and scopes.
    let (code, list) = json_of(c.get(format!("{base}{GV}")).send().await.unwrap()).await;
    assert_eq!(code, 200);
    let resources = list["resources"].as_array().unwrap();
    let find = |name: &str| {
        resources
            .iter()
            .find(|r| r["name"] == name)
            .cloned()
            .unwrap()
    };
    assert_eq!(
        find("virtualmachineinstancetypes")["shortNames"],
        json!(["vminstancetype", "vminstancetypes", "vmf", "vmfs"])
    );
    assert_eq!(
        find("virtualmachineclusterinstancetypes")["namespaced"],
        false
    );
    assert_eq!(
        find("virtualmachinepreferences")["shortNames"],
        json!(["vmpref", "vmprefs", "vmp", "vmps"])
    );
    assert!(
        resources
            .iter()
            .all(|r| !r["name"].as_str().unwrap().ends_with("/status"))
    );
    let (_, groups) = json_of(c.get(format!("{base}/apis")).send().await.unwrap()).await;
    assert!(
        groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["name"] == "instancetype.kubevirt.io"
                && g["preferredVersion"]["version"] == "v1beta1")
    );

    // A namespaced instance type.
    let nsd = format!("{base}{GV}/namespaces/default/virtualmachineinstancetypes");
    let small = instancetype(
        "VirtualMachineInstancetype",
        "small",
        json!({"cpu": {"guest": 2}, "memory": {"guest": "256Mi"}}),
    );
    let (code, created) = json_of(c.post(&nsd).json(&small).send().await.unwrap()).await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(created["metadata"]["namespace"], "default");
    assert_eq!(created["apiVersion"], "instancetype.kubevirt.io/v1beta1");

    // A cluster-scoped one: no namespace, not reachable under one, listed at the root.
    let cluster = format!("{base}{GV}/virtualmachineclusterinstancetypes");
    let big = instancetype(
        "VirtualMachineClusterInstancetype",
        "big",
        json!({"cpu": {"guest": 4}, "memory": {"guest": "1Gi"}}),
    );
    let mut sent = big.clone();
    sent["metadata"]["namespace"] = json!("default");
    let (code, created) = json_of(c.post(&cluster).json(&sent).send().await.unwrap()).await;
    assert_eq!(code, 201, "{created}");
    assert!(created["metadata"].get("namespace").is_none());
    let (code, _) = json_of(c.get(format!("{cluster}/big")).send().await.unwrap()).await;
    assert_eq!(code, 200);
    let (code, _) = json_of(
        c.get(format!(
            "{base}{GV}/namespaces/default/virtualmachineclusterinstancetypes/big"
        ))
        .send()
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(code, 404);
    let (_, listed) = json_of(c.get(&cluster).send().await.unwrap()).await;
    assert_eq!(listed["kind"], "VirtualMachineClusterInstancetypeList");
    assert_eq!(listed["items"].as_array().unwrap().len(), 1);

    // The instance type webhook's rules: 422 naming the field, nothing stored.
    let bad = instancetype(
        "VirtualMachineInstancetype",
        "bad",
        json!({"cpu": {"guest": 1}, "memory": {"guest": "1Gi", "overcommitPercent": 150}}),
    );
    let (code, status) = json_of(c.post(&nsd).json(&bad).send().await.unwrap()).await;
    assert_eq!(code, 422, "{status}");
    assert_eq!(
        status["details"]["causes"][0]["field"],
        "spec.memory.overcommitPercent"
    );
    assert_eq!(status["details"]["group"], "instancetype.kubevirt.io");
    let (code, _) = json_of(c.get(format!("{nsd}/bad")).send().await.unwrap()).await;
    assert_eq!(code, 404);
    let unknown_topology = instancetype(
        "VirtualMachinePreference",
        "p",
        json!({"cpu": {"preferredCPUTopology": "diagonal"}}),
    );
    let (code, status) = json_of(
        c.post(format!(
            "{base}{GV}/namespaces/default/virtualmachinepreferences"
        ))
        .json(&unknown_topology)
        .send()
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(code, 422, "{status}");
    assert_eq!(
        status["details"]["causes"][0]["field"],
        "spec.cpu.preferredCPUTopology"
    );

    // KubeVirt's own bundle, every document as it is: created, no unknown field.
    for (file, text) in [
        (
            "cluster instance types",
            common_instancetypes::CLUSTER_INSTANCETYPES,
        ),
        (
            "cluster preferences",
            common_instancetypes::CLUSTER_PREFERENCES,
        ),
    ] {
        let docs = bundle(text);
        assert!(docs.len() > 50, "{file}");
        for d in docs {
            let plural = format!("{}s", d["kind"].as_str().unwrap().to_lowercase());
            let r = c
                .post(format!("{base}{GV}/{plural}?fieldValidation=Strict"))
                .json(&d)
                .send()
                .await
                .unwrap();
            let (code, body) = json_of(r).await;
            assert_eq!(code, 201, "{} {}: {body}", d["kind"], d["metadata"]["name"]);
            assert_eq!(
                body["spec"], d["spec"],
                "{} stored unchanged",
                d["metadata"]["name"]
            );
        }
    }
    let (_, listed) = json_of(c.get(&cluster).send().await.unwrap()).await;
    assert!(
        listed["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["metadata"]["name"] == "u1.medium")
    );
}

fn vm_with(name: &str, spec: Value) -> Value {
    let mut vm = common::vm(name);
    let template = &mut vm["spec"]["template"]["spec"];
    template["domain"]["resources"] = json!({});
    for (k, v) in spec.as_object().unwrap() {
        vm["spec"][k] = v.clone();
    }
    vm
}

/// KubeVirt's VM semantics at the API: the reference's kind defaulted, the instance type's
/// fields refused in the template (every one, KubeVirt's message), a missing instance type or
/// unmet preference requirements refused — 422 naming the field, nothing stored.
#[tokio::test(flavor = "multi_thread")]
async fn vms_are_admitted_against_their_instancetype_and_preference() {
    let env = common::start(true);
    let base = env.server_url.clone();
    let c = admin(&env);
    let vms = format!("{base}{}", common::VMS);
    let post = |url: String, body: Value| {
        let c = c.clone();
        async move { json_of(c.post(url).json(&body).send().await.unwrap()).await }
    };
    let (code, _) = post(
        format!("{base}{GV}/virtualmachineclusterinstancetypes"),
        instancetype(
            "VirtualMachineClusterInstancetype",
            "u1.small",
            json!({"cpu": {"guest": 2}, "memory": {"guest": "256Mi"}}),
        ),
    )
    .await;
    assert_eq!(code, 201);
    let (code, _) = post(
        format!("{base}{GV}/virtualmachineclusterpreferences"),
        instancetype(
            "VirtualMachineClusterPreference",
            "big-only",
            json!({"requirements": {"cpu": {"guest": 4}}}),
        ),
    )
    .await;
    assert_eq!(code, 201);

    // The instance type gives the memory; the kind defaults to the cluster-wide one.
    let ok = vm_with("ok", json!({"instancetype": {"name": "u1.small"}}));
    let (code, vm) = post(vms.clone(), ok).await;
    assert_eq!(code, 201, "{vm}");
    assert_eq!(
        vm["spec"]["instancetype"]["kind"],
        "VirtualMachineClusterInstancetype"
    );

    // Hugepages and limits the instance type leaves alone are the VM's (kubevirt#14685, #12720).
    let mut own = vm_with("own", json!({"instancetype": {"name": "u1.small"}}));
    own["spec"]["template"]["spec"]["domain"]["memory"] = json!({"hugepages": {"pageSize": "2Mi"}});
    own["spec"]["template"]["spec"]["domain"]["resources"] =
        json!({"limits": {"memory": "1Gi", "cpu": "2"}});
    let (code, body) = post(vms.clone(), own).await;
    assert_eq!(code, 201, "{body}");

    let refused = [
        (
            {
                let mut v = vm_with("conflict", json!({"instancetype": {"name": "u1.small"}}));
                v["spec"]["template"]["spec"]["domain"]["cpu"] = json!({"sockets": 2});
                v["spec"]["template"]["spec"]["domain"]["resources"] =
                    json!({"requests": {"memory": "1Gi"}});
                v
            },
            vec![
                "spec.template.spec.domain.cpu.sockets",
                "spec.template.spec.domain.resources.requests.memory",
            ],
        ),
        (
            vm_with("missing", json!({"instancetype": {"name": "nope"}})),
            vec!["spec.instancetype.name"],
        ),
        (
            vm_with(
                "unmet",
                json!({"instancetype": {"name": "u1.small"},
                "preference": {"name": "big-only"}}),
            ),
            vec!["spec.instancetype"],
        ),
        (
            vm_with(
                "both",
                json!({"instancetype": {"name": "u1.small", "inferFromVolume": "root"}}),
            ),
            vec!["spec.instancetype.name"],
        ),
    ];
    // Updates are checked too, as KubeVirt's VM admission checks them: a template field the
    // instance type owns, or a switch to one that does not exist, is refused with the field
    // named and nothing stored; an edit elsewhere in the spec goes through.
    let patch = |body: Value| {
        let c = c.clone();
        let url = format!("{vms}/ok");
        async move {
            json_of(
                c.patch(url)
                    .header("content-type", "application/merge-patch+json")
                    .json(&body)
                    .send()
                    .await
                    .unwrap(),
            )
            .await
        }
    };
    for (body, field) in [
        (
            json!({"spec": {"template": {"spec": {"domain": {"cpu": {"sockets": 2}}}}}}),
            "spec.template.spec.domain.cpu.sockets",
        ),
        (
            json!({"spec": {"instancetype": {"name": "nope"}}}),
            "spec.instancetype.name",
        ),
    ] {
        let (code, status) = patch(body.clone()).await;
        assert_eq!(code, 422, "{body}: {status}");
        assert_eq!(
            status["details"]["causes"][0]["field"], field,
            "{body}: {status}"
        );
    }
    let (code, vm) = patch(json!({"spec": {"runStrategy": "Always"}})).await;
    assert_eq!(code, 200, "{vm}");
    assert!(
        vm["spec"]["template"]["spec"]["domain"]["cpu"].is_null(),
        "{vm}"
    );
    assert_eq!(vm["spec"]["instancetype"]["name"], "u1.small", "{vm}");

    for (vm, fields) in refused {
        let name = vm["metadata"]["name"].as_str().unwrap().to_string();
        let (code, status) = post(vms.clone(), vm).await;
        assert_eq!(code, 422, "{name}: {status}");
        let causes: Vec<&str> = status["details"]["causes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["field"].as_str().unwrap())
            .collect();
        assert_eq!(causes, fields, "{name}: {status}");
        let (code, _) = json_of(c.get(format!("{vms}/{name}")).send().await.unwrap()).await;
        assert_eq!(code, 404, "{name} stored");
        if name == "conflict" {
            assert!(status["message"].as_str().unwrap().contains(
                "VM field(s) spec.template.spec.domain.cpu.sockets conflicts with selected instance type"
            ));
        }
        if name == "unmet" {
            assert!(status["message"].as_str().unwrap().contains(
                "insufficient CPU resources of 2 vCPU provided by instance type, preference requires 4 vCPU"
            ));
        }
    }
}

/// The `expand-spec` endpoints upstream `virtctl expand` calls: the stored VM (`--vm`) and a
/// VM in the body (`--file`) come back with the instance type and preference written into
/// the template and no references; what is in the way is a 422 naming the field, and
/// nothing is stored by either.
#[tokio::test(flavor = "multi_thread")]
async fn the_expand_endpoints_answer_the_vm_expanded() {
    let env = common::start(true);
    let base = env.server_url.clone();
    let c = admin(&env);
    let vms = format!("{base}{}", common::VMS);
    let sub = format!("{base}/apis/subresources.kubevirt.io/v1/namespaces/default");
    for (plural, kind, name, spec) in [
        (
            "virtualmachineclusterinstancetypes",
            "VirtualMachineClusterInstancetype",
            "u1.small",
            json!({"cpu": {"guest": 2}, "memory": {"guest": "256Mi"}}),
        ),
        (
            "virtualmachineclusterpreferences",
            "VirtualMachineClusterPreference",
            "sata",
            json!({"devices": {"preferredDiskBus": "sata"}, "cpu": {"preferredCPUTopology": "cores"}}),
        ),
    ] {
        let (code, body) = json_of(
            c.post(format!("{base}{GV}/{plural}"))
                .json(&instancetype(kind, name, spec))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(code, 201, "{body}");
    }
    let refs = json!({"instancetype": {"name": "u1.small"}, "preference": {"name": "sata"}});
    // A disk without a bus: the preference's bus fills it.
    let vm_of = |name: &str| {
        let mut vm = vm_with(name, refs.clone());
        vm["spec"]["template"]["spec"]["domain"]["devices"]["disks"] = json!([{"name": "root"}]);
        vm
    };
    let vm = vm_of("x");
    let (code, body) = json_of(c.post(&vms).json(&vm).send().await.unwrap()).await;
    assert_eq!(code, 201, "{body}");

    let check = |v: &Value| {
        assert_eq!(v["kind"], "VirtualMachine", "{v}");
        assert!(v["spec"].get("instancetype").is_none(), "{v}");
        assert!(v["spec"].get("preference").is_none(), "{v}");
        let domain = &v["spec"]["template"]["spec"]["domain"];
        assert_eq!(domain["cpu"]["cores"], 2, "{v}");
        assert_eq!(domain["cpu"]["sockets"], 1, "{v}");
        assert_eq!(domain["memory"]["guest"], "256Mi", "{v}");
        let disks = domain["devices"]["disks"].as_array().unwrap();
        assert!(disks.iter().all(|d| d["disk"]["bus"] == "sata"), "{v}");
    };
    // --vm: the stored VM.
    let (code, expanded) = json_of(
        c.get(format!("{sub}/virtualmachines/x/expand-spec"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 200, "{expanded}");
    check(&expanded);
    let (_, stored) = json_of(c.get(format!("{vms}/x")).send().await.unwrap()).await;
    assert_eq!(
        stored["spec"]["instancetype"]["name"], "u1.small",
        "unchanged"
    );
    let (code, _) = json_of(
        c.get(format!("{sub}/virtualmachines/nope/expand-spec"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 404);

    // --file: the VM in the body, in no namespace or in the request's.
    let mut file = vm_of("f");
    file["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("namespace");
    let put = |body: Value| {
        let c = c.clone();
        let url = format!("{sub}/expand-vm-spec");
        async move { json_of(c.put(url).json(&body).send().await.unwrap()).await }
    };
    let (code, expanded) = put(file.clone()).await;
    assert_eq!(code, 200, "{expanded}");
    check(&expanded);
    assert_eq!(expanded["metadata"]["namespace"], "default");
    let (code, _) = json_of(c.get(format!("{vms}/f")).send().await.unwrap()).await;
    assert_eq!(code, 404, "nothing stored");
    let mut elsewhere = file.clone();
    elsewhere["metadata"]["namespace"] = json!("other");
    let (code, status) = put(elsewhere).await;
    assert_eq!(code, 400, "{status}");

    // Exactly what upstream `virtctl create vm --instancetype u1.small --preference sata
    // --volume-containerdisk=src:…` prints (Go's empty fields included), as `virtctl expand
    // --file` sends it.
    let (code, expanded) = put(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"creationTimestamp": null, "name": "made"},
        "spec": {"instancetype": {"name": "u1.small"}, "preference": {"name": "sata"},
            "runStrategy": "Always",
            "template": {"metadata": {"creationTimestamp": null}, "spec": {
                "domain": {"devices": {}, "resources": {}},
                "terminationGracePeriodSeconds": 180,
                "volumes": [{"containerDisk": {"image": "localhost/kubevirt-rs/test-guest:latest"},
                    "name": "root"}]}}},
        "status": {}
    }))
    .await;
    assert_eq!(code, 200, "{expanded}");
    check(&expanded);

    // The same from KubeVirt's bundle: u1.medium and fedora, created (dry run) and expanded.
    for (plural, text, name) in [
        (
            "virtualmachineclusterinstancetypes",
            common_instancetypes::CLUSTER_INSTANCETYPES,
            "u1.medium",
        ),
        (
            "virtualmachineclusterpreferences",
            common_instancetypes::CLUSTER_PREFERENCES,
            "fedora",
        ),
    ] {
        let doc = bundle(text)
            .into_iter()
            .find(|d| d["metadata"]["name"] == name)
            .unwrap();
        let (code, body) = json_of(
            c.post(format!("{base}{GV}/{plural}"))
                .json(&doc)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(code, 201, "{body}");
    }
    let made = json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"creationTimestamp": null, "name": "made"},
        "spec": {"instancetype": {"name": "u1.medium"}, "preference": {"name": "fedora"},
            "runStrategy": "Always",
            "template": {"metadata": {"creationTimestamp": null}, "spec": {
                "domain": {"devices": {}, "resources": {}},
                "terminationGracePeriodSeconds": 180,
                "volumes": [{"containerDisk": {"image": "localhost/kubevirt-rs/test-guest:latest"},
                    "name": "root"}]}}},
        "status": {}
    });
    let (code, body) = json_of(
        c.post(format!("{vms}?dryRun=All"))
            .json(&made)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let (code, expanded) = put(made).await;
    assert_eq!(code, 200, "{expanded}");
    let domain = &expanded["spec"]["template"]["spec"]["domain"];
    assert_eq!(domain["memory"]["guest"], "4Gi", "{expanded}");

    // What is in the way: a 422 naming each field.
    let mut conflict = file.clone();
    conflict["spec"]["template"]["spec"]["domain"]["cpu"] = json!({"sockets": 2});
    let mut missing = file.clone();
    missing["spec"]["instancetype"]["name"] = json!("u9.none");
    for (vm, field) in [
        (conflict, "spec.template.spec.domain.cpu.sockets"),
        (missing, "spec.instancetype.name"),
    ] {
        let (code, status) = put(vm).await;
        assert_eq!(code, 422, "{status}");
        assert_eq!(status["details"]["causes"][0]["field"], field, "{status}");
    }
}
