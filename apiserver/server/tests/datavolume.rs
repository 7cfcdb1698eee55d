//! cdi.kubevirt.io/v1beta1 DataVolumes against a real etcd and the real virt-apiserver: the
//! group in discovery with CDI's short names, create/get/list (as a Table with CDI's
//! columns), status through /status only, CDI's rules as 422s naming the field, the spec
//! fixed after creation, and VMs carrying dataVolumeTemplates (KubeVirt's admission).
//! Clones (`source.pvc`) with a real kube-apiserver's RBAC behind the SubjectAccessReviews:
//! a user who may neither create `datavolumes/source` nor pods in the source's namespace
//! gets a 403 naming both, a clone from another namespace a 422.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{admin, json_of};
use serde_json::{Value, json};

const GV: &str = "/apis/cdi.kubevirt.io/v1beta1";

fn dv(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": name}, "spec": spec})
}

fn http_spec() -> Value {
    json!({"source": {"http": {"url": "https://download.cirros-cloud.net/0.6.2/cirros-0.6.2-x86_64-disk.img"}},
        "storage": {"resources": {"requests": {"storage": "1Gi"}}}})
}

#[tokio::test(flavor = "multi_thread")]
async fn datavolumes_are_served() {
    let env = common::start(true);
    let base = env.server_url.clone();
    let c = admin(&env);
    let dvs = format!("{base}{GV}/namespaces/default/datavolumes");

    // Discovery: the group, CDI's names and the status subresource.
    let (code, list) = json_of(c.get(format!("{base}{GV}")).send().await.unwrap()).await;
    assert_eq!(code, 200, "{list}");
    let resources = list["resources"].as_array().unwrap();
    let main = resources
        .iter()
        .find(|r| r["name"] == "datavolumes")
        .unwrap();
    assert_eq!(main["shortNames"], json!(["dv", "dvs"]));
    assert_eq!(main["categories"], json!(["all"]));
    assert_eq!(main["namespaced"], true);
    assert_eq!(main["kind"], "DataVolume");
    assert!(resources.iter().any(|r| r["name"] == "datavolumes/status"));
    let (_, groups) = json_of(c.get(format!("{base}/apis")).send().await.unwrap()).await;
    assert!(
        groups["groups"].as_array().unwrap().iter().any(
            |g| g["name"] == "cdi.kubevirt.io" && g["preferredVersion"]["version"] == "v1beta1"
        )
    );

    // Create (strict: every field known), defaulted, got back.
    let (code, created) = json_of(
        c.post(format!("{dvs}?fieldValidation=Strict"))
            .json(&dv("cirros", http_spec()))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(created["apiVersion"], "cdi.kubevirt.io/v1beta1");
    assert_eq!(created["kind"], "DataVolume");
    assert_eq!(created["spec"]["contentType"], "kubevirt");
    assert_eq!(created["metadata"]["namespace"], "default");
    let (code, got) = json_of(c.get(format!("{dvs}/cirros")).send().await.unwrap()).await;
    assert_eq!(code, 200);
    assert_eq!(got["spec"]["source"], http_spec()["source"]);

    // Status only through /status (CDI's controller writes it), as kubectl reads it.
    let mut st = got.clone();
    st["status"] = json!({"phase": "ImportInProgress", "progress": "45.30%", "restartCount": 1,
        "claimName": "cirros",
        "conditions": [{"type": "Running", "status": "True", "reason": "Pod is running",
            "lastTransitionTime": "2026-01-01T00:00:00Z", "lastHeartbeatTime": "2026-01-01T00:00:00Z"}]});
    let (code, main_put) = json_of(
        c.put(format!("{dvs}/cirros"))
            .json(&st)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 200, "{main_put}");
    assert!(
        main_put.get("status").is_none(),
        "status ignored on the main resource: {main_put}"
    );
    let (code, after) = json_of(
        c.put(format!("{dvs}/cirros/status"))
            .json(&st)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 200, "{after}");
    assert_eq!(after["status"]["phase"], "ImportInProgress");
    assert_eq!(after["status"]["conditions"][0]["type"], "Running");

    // The spec is fixed at creation (CDI's webhook rule).
    let mut changed = after.clone();
    changed["spec"]["source"]["http"]["url"] = json!("https://example.org/other.img");
    let (code, status) = json_of(
        c.put(format!("{dvs}/cirros"))
            .json(&changed)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 422, "{status}");
    assert_eq!(status["details"]["causes"][0]["field"], "spec.source");
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .contains("Cannot update DataVolume Spec"),
        "{status}"
    );

    // `kubectl get dv`: CDI's columns, the status in the cells.
    let (code, table) = json_of(
        c.get(&dvs)
            .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 200, "{table}");
    assert_eq!(table["kind"], "Table");
    let names: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["Name", "Phase", "Progress", "Restarts", "Age"]);
    assert_eq!(table["columnDefinitions"][3]["type"], "integer");
    let cells = table["rows"][0]["cells"].as_array().unwrap();
    assert_eq!(
        cells[..4],
        [
            json!("cirros"),
            json!("ImportInProgress"),
            json!("45.30%"),
            json!(1)
        ]
    );

    // CDI's rules: 422 naming the field, nothing stored.
    for (name, spec, field) in [
        (
            "s3",
            json!({"source": {"s3": {"url": "https://bucket/disk.img"}},
                "storage": {"resources": {"requests": {"storage": "1Gi"}}}}),
            "spec.source.s3",
        ),
        (
            "nosize",
            json!({"source": {"blank": {}}, "storage": {}}),
            "spec.storage.resources.requests.storage",
        ),
        (
            "badurl",
            json!({"source": {"http": {"url": "ftp://host/disk.img"}},
                "storage": {"resources": {"requests": {"storage": "1Gi"}}}}),
            "spec.source.http.url",
        ),
    ] {
        let (code, status) =
            json_of(c.post(&dvs).json(&dv(name, spec)).send().await.unwrap()).await;
        assert_eq!(code, 422, "{name}: {status}");
        assert_eq!(status["details"]["causes"][0]["field"], field, "{status}");
        assert_eq!(status["details"]["group"], "cdi.kubevirt.io");
        let (code, _) = json_of(c.get(format!("{dvs}/{name}")).send().await.unwrap()).await;
        assert_eq!(code, 404);
    }
}

fn vm_with_templates(name: &str, templates: Value, volume_dv: &str) -> Value {
    let mut vm = common::vm(name);
    vm["spec"]["dataVolumeTemplates"] = templates;
    vm["spec"]["template"]["spec"]["volumes"] =
        json!([{"name": "root", "dataVolume": {"name": volume_dv}}]);
    vm
}

#[tokio::test(flavor = "multi_thread")]
async fn vms_carry_data_volume_templates() {
    let env = common::start(true);
    let base = env.server_url.clone();
    let c = admin(&env);
    let vms = format!("{base}{}", common::VMS);
    let template = json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
        "metadata": {"name": "vm1-root", "labels": {"app": "demo"}}, "spec": http_spec()});

    let (code, vm) = json_of(
        c.post(format!("{vms}?fieldValidation=Strict"))
            .json(&vm_with_templates("vm1", json!([template]), "vm1-root"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 201, "{vm}");
    assert_eq!(
        vm["spec"]["dataVolumeTemplates"][0]["spec"]["source"],
        http_spec()["source"],
        "kept, not pruned"
    );
    assert_eq!(
        vm["spec"]["dataVolumeTemplates"][0]["metadata"]["name"],
        "vm1-root"
    );

    // A template no volume uses: KubeVirt's words, the field named, nothing stored.
    let (code, status) = json_of(
        c.post(&vms)
            .json(&vm_with_templates("vm2", json!([template]), "elsewhere"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 422, "{status}");
    assert_eq!(
        status["details"]["causes"][0]["field"],
        "spec.dataVolumeTemplates[0]"
    );
    assert!(
        status["details"]["causes"][0]["message"]
            .as_str()
            .unwrap()
            .contains("must be referenced in the VMI template's 'volumes' list"),
        "{status}"
    );
    let (code, _) = json_of(c.get(format!("{vms}/vm2")).send().await.unwrap()).await;
    assert_eq!(code, 404);

    // The DataVolume rules apply under the template's path.
    let mut bad = template.clone();
    bad["spec"]["source"] = json!({"gcs": {"url": "gs://b/x"}});
    let (code, status) = json_of(
        c.post(&vms)
            .json(&vm_with_templates("vm3", json!([bad]), "vm1-root"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 422, "{status}");
    assert_eq!(
        status["details"]["causes"][0]["field"],
        "spec.dataVolumeTemplates[0].spec.source.gcs"
    );
}

fn clone_spec(claim: &str) -> Value {
    json!({"source": {"pvc": {"name": claim}}, "storage": {}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn clones_need_the_right_to_read_the_source_claim() {
    use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, Role, RoleBinding};
    use kube::Api;
    use kube::api::PostParams;

    let kube = kube_testenv::KubeApi::start_rbac("dv-clone-review-token").await;
    let kc = kube.client.clone();
    fn create<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).unwrap()
    }
    // The dev user may do anything; alice (CN alice, O team-a) what the roles below grant.
    Api::<ClusterRoleBinding>::all(kc.clone())
        .create(
            &PostParams::default(),
            &create(json!({"metadata": {"name": "dev-admin"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "kubevirt-dev"}]})),
        )
        .await
        .unwrap();
    let roles: Api<Role> = Api::namespaced(kc.clone(), "default");
    let bindings: Api<RoleBinding> = Api::namespaced(kc.clone(), "default");
    let grant = |name: &'static str, rules: Value| {
        let (roles, bindings) = (roles.clone(), bindings.clone());
        async move {
            roles
                .create(
                    &PostParams::default(),
                    &create(json!({"metadata": {"name": name}, "rules": rules})),
                )
                .await
                .unwrap();
            bindings
                .create(
                    &PostParams::default(),
                    &create(json!({"metadata": {"name": name},
                        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
                        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}]})),
                )
                .await
                .unwrap();
        }
    };
    // Alice may create DataVolumes and VMs, nothing about claims or pods.
    grant(
        "writer",
        json!([{"apiGroups": ["cdi.kubevirt.io"], "resources": ["datavolumes"], "verbs": ["create", "get"]},
               {"apiGroups": ["kubevirt.io"], "resources": ["virtualmachines"], "verbs": ["create", "get"]}]),
    )
    .await;

    let env = virt_devenv::DevEnv::start(virt_devenv::Options {
        apiserver_bin: env!("CARGO_BIN_EXE_virt-apiserver").into(),
        allow_client_ca_users: false,
        kube_kubeconfig: Some(kube.dir.path().join("kubeconfig")),
        ..Default::default()
    })
    .expect("start etcd and virt-apiserver");
    let base = env.server_url.clone();
    let dvs = format!("{base}{GV}/namespaces/default/datavolumes");
    let vms = format!("{base}{}", common::VMS);
    let alice = common::client(&env, Some(&env.plain_user));
    let admin = admin(&env);
    let post = |c: &reqwest::Client, url: &str, body: Value| {
        let req = c.post(url).json(&body);
        async move { json_of(req.send().await.unwrap()).await }
    };
    let template =
        |name: &str, claim: &str| json!([{"metadata": {"name": name}, "spec": clone_spec(claim)}]);

    // Without either right: 403 naming the namespace and what is missing; nothing stored.
    let (code, status) = post(&alice, &dvs, dv("copy1", clone_spec("golden"))).await;
    assert_eq!(code, 403, "{status}");
    assert_eq!(status["reason"], "Forbidden");
    let message = status["message"].as_str().unwrap();
    for part in [
        "datavolumes.cdi.kubevirt.io \"copy1\" is forbidden",
        "User \"alice\" has insufficient permissions in clone source namespace \"default\"",
        "\"datavolumes/source\"",
        "\"pods\"",
    ] {
        assert!(message.contains(part), "{part}: {message}");
    }
    let (code, _) = json_of(admin.get(format!("{dvs}/copy1")).send().await.unwrap()).await;
    assert_eq!(code, 404, "nothing stored");
    // A VM whose template clones is reviewed for its author the same way.
    let (code, status) = post(
        &alice,
        &vms,
        vm_with_templates("vm1", template("vm1-root", "golden"), "vm1-root"),
    )
    .await;
    assert_eq!(code, 403, "{status}");
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .contains("virtualmachines.kubevirt.io \"vm1\" is forbidden"),
        "{status}"
    );
    // Other sources need no review.
    let (code, status) = post(
        &alice,
        &dvs,
        dv(
            "blank",
            json!({"source": {"blank": {}}, "storage": {"resources": {"requests": {"storage": "1Gi"}}}}),
        ),
    )
    .await;
    assert_eq!(code, 201, "{status}");

    // `create datavolumes/source` on that claim (CDI's edit role grants it on all).
    grant(
        "clone-silver",
        json!([{"apiGroups": ["cdi.kubevirt.io"], "resources": ["datavolumes/source"],
                "resourceNames": ["silver"], "verbs": ["create"]}]),
    )
    .await;
    let (code, status) = post(&alice, &dvs, dv("copy2", clone_spec("silver"))).await;
    assert_eq!(code, 201, "{status}");
    let (code, status) = post(&alice, &dvs, dv("copy3", clone_spec("iron"))).await;
    assert_eq!(code, 403, "only the claim the role names: {status}");
    // …or `create pods` there: whoever may run a pod may mount the claim anyway.
    grant(
        "pods",
        json!([{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}]),
    )
    .await;
    let (code, status) = post(&alice, &dvs, dv("copy4", clone_spec("bronze"))).await;
    assert_eq!(code, 201, "{status}");
    let (code, status) = post(
        &alice,
        &vms,
        vm_with_templates("vm2", template("vm2-root", "bronze"), "vm2-root"),
    )
    .await;
    assert_eq!(code, 201, "{status}");

    // From another namespace: not carried out yet, a 422 on the field, before any review.
    let mut other = clone_spec("golden");
    other["source"]["pvc"]["namespace"] = json!("images");
    let (code, status) = post(&admin, &dvs, dv("copy5", other)).await;
    assert_eq!(code, 422, "{status}");
    assert_eq!(
        status["details"]["causes"][0]["field"],
        "spec.source.pvc.namespace"
    );
    assert!(
        status["message"]
            .as_str()
            .unwrap()
            .contains("cross-namespace clones are not supported"),
        "{status}"
    );
}
