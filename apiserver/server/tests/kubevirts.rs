//! `kubevirts` at kubevirt.io/v1 through virt-apiserver, stored by a real kube-apiserver as
//! the v1alpha3 CRD (crate::kubevirts): KubeVirt's own kubevirt-cr.yaml applied with kubectl
//! at v1, read back at v1 (here) and v1alpha3 (kube-apiserver), updated, patched (merge,
//! JSON, server-side apply), watched, its status written, listed as a Table, explained,
//! deleted; a user without RBAC gets 403; kube-apiserver gone → 503 naming it.
//!
//! kube-apiserver (RBAC) and etcd: `kube_testenv`; virt-apiserver and its own etcd: DevEnv
//! with `kube_kubeconfig`, its kube-apiserver credentials being the admin token.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};
use virt_devenv::{DevEnv, Options};

/// KubeVirt's released kubevirt-cr.yaml, unchanged.
const KUBEVIRT_CR: &str = "apiVersion: kubevirt.io/v1
kind: KubeVirt
metadata: {name: kubevirt, namespace: kubevirt}
spec:
  certificateRotateStrategy: {}
  configuration:
    developerConfiguration:
      featureGates: []
  customizeComponents: {}
  imagePullPolicy: IfNotPresent
  workloadUpdateStrategy: {}
";

const KV: &str = "/apis/kubevirt.io/v1/namespaces/kubevirt/kubevirts";

async fn json_of(r: reqwest::Response) -> (u16, Value) {
    let code = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        code,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubevirt_cr_at_v1_is_served_over_the_v1alpha3_crd() {
    let kube = kube_testenv::KubeApi::start_rbac("kubevirts-test-token").await;
    let c = kube.client.clone();
    let crds: Api<CustomResourceDefinition> = Api::all(c.clone());
    crds.create(
        &PostParams::default(),
        &kubevirt_api::kubevirt::crd_v1alpha3(),
    )
    .await
    .unwrap();
    Api::<Namespace>::all(c.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "kubevirt"}})).unwrap(),
        )
        .await
        .unwrap();
    // The dev user may do anything (as an admin would); alice nothing.
    Api::<ClusterRoleBinding>::all(c.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "dev-admin"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "kubevirt-dev"}]}))
            .unwrap(),
        )
        .await
        .unwrap();
    let stored = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubevirt.io", "v1alpha3", "KubeVirt"),
        "kubevirts",
    );
    let stored: Api<DynamicObject> = Api::namespaced_with(c.clone(), "kubevirt", &stored);
    kube_testenv::eventually("CRD established", Duration::from_secs(30), || async {
        stored.list(&Default::default()).await.ok()
    })
    .await;

    // Before virt-apiserver serves kubevirt.io/v1 (here: talking to kube-apiserver alone, as
    // kubectl does through the aggregator while the APIService is missing), KubeVirt's file
    // fails with the message docs/deploy.md quotes; v1alpha3 already works.
    let dir = tempfile::tempdir().unwrap();
    let cr = dir.path().join("kubevirt-cr.yaml");
    std::fs::write(&cr, KUBEVIRT_CR).unwrap();
    let kube_kubeconfig = kube.dir.path().join("kubeconfig");
    let direct = common::Kubectl {
        kubeconfig: &kube_kubeconfig,
    };
    let early = direct.run(&["apply", "-f", cr.to_str().unwrap()]);
    assert!(!early.ok);
    assert!(
        early
            .stderr
            .contains(r#"no matches for kind "KubeVirt" in version "kubevirt.io/v1""#),
        "{}",
        early.stderr
    );
    let out = direct.ok(&["get", "kubevirts.v1alpha3.kubevirt.io", "-A"]);
    assert!(out.is_empty() || out.contains("No resources"), "{out}");

    let env = DevEnv::start(Options {
        apiserver_bin: env!("CARGO_BIN_EXE_virt-apiserver").into(),
        allow_client_ca_users: false,
        kube_kubeconfig: Some(kube_kubeconfig.clone()),
        ..Default::default()
    })
    .expect("start etcd and virt-apiserver");
    let kubectl = common::Kubectl {
        kubeconfig: &env.kubeconfig,
    };
    let admin = common::admin(&env);
    let url = |p: &str| format!("{}{p}", env.server_url);

    // The user's own file, unchanged, with kubectl (client-side apply: GET, then POST).
    let out = kubectl.ok(&["apply", "-f", cr.to_str().unwrap()]);
    assert!(
        out.contains("kubevirt.kubevirt.io/kubevirt created"),
        "{out}"
    );
    let yaml = kubectl.ok(&["get", "kubevirt", "-n", "kubevirt", "-o", "yaml"]);
    // A List (no name given) whose item is at v1.
    assert!(
        yaml.contains("\n- apiVersion: kubevirt.io/v1\n  kind: KubeVirt\n"),
        "{yaml}"
    );
    for field in [
        "certificateRotateStrategy: {}",
        "customizeComponents: {}",
        "imagePullPolicy: IfNotPresent",
        "workloadUpdateStrategy: {}",
        "featureGates: []",
    ] {
        assert!(yaml.contains(field), "{field} missing:\n{yaml}");
    }
    // Short name and the Table kube-apiserver renders for the CRD.
    let table = kubectl.ok(&["get", "kv", "-n", "kubevirt"]);
    assert!(
        table.contains("NAME") && table.contains("PHASE") && table.contains("kubevirt"),
        "{table}"
    );
    // kubectl explain at v1, from our OpenAPI.
    let explain = kubectl.ok(&["explain", "kubevirt.spec"]);
    assert!(
        explain.contains("workloadUpdateStrategy") && explain.contains("customizeComponents"),
        "{explain}"
    );

    // Stored at v1alpha3, every field kept.
    let at_v1alpha3 = stored.get("kubevirt").await.unwrap();
    assert_eq!(
        at_v1alpha3.types.as_ref().unwrap().api_version,
        "kubevirt.io/v1alpha3"
    );
    assert_eq!(
        at_v1alpha3.data["spec"]["workloadUpdateStrategy"],
        json!({})
    );

    // GET at v1; update (PUT) with what was read.
    let (code, mut obj) = json_of(
        admin
            .get(url(&format!("{KV}/kubevirt")))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 200, "{obj}");
    assert_eq!(obj["apiVersion"], "kubevirt.io/v1");
    assert!(
        obj["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["apiVersion"] == "kubevirt.io/v1"),
        "{obj}"
    );
    let rv = obj["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_string();
    obj["spec"]["imageTag"] = json!("v1-update");
    let (code, updated) = json_of(
        admin
            .put(url(&format!("{KV}/kubevirt")))
            .json(&obj)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 200, "{updated}");
    assert_eq!(updated["apiVersion"], "kubevirt.io/v1");
    assert_eq!(updated["spec"]["imageTag"], "v1-update");
    // A stale resourceVersion: kube-apiserver's 409, passed through.
    obj["metadata"]["resourceVersion"] = json!(rv);
    let (code, conflict) = json_of(
        admin
            .put(url(&format!("{KV}/kubevirt")))
            .json(&obj)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 409, "{conflict}");
    assert_eq!(conflict["reason"], "Conflict");

    // A watch from the current version: the next change arrives at v1.
    let watch_rv = updated["metadata"]["resourceVersion"].as_str().unwrap();
    let watch = admin
        .get(url(&format!(
            "{KV}?watch=true&resourceVersion={watch_rv}&allowWatchBookmarks=true"
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(watch.status(), 200);
    let mut events = watch.bytes_stream();

    // Merge patch, then JSON patch.
    let (code, merged) = json_of(
        admin
            .patch(url(&format!("{KV}/kubevirt")))
            .header("Content-Type", "application/merge-patch+json")
            .body(r#"{"spec":{"imageTag":"v1-merge"}}"#)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 200, "{merged}");
    assert_eq!(merged["apiVersion"], "kubevirt.io/v1");
    assert_eq!(merged["spec"]["imageTag"], "v1-merge");

    let mut buf = Vec::new();
    let event = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let chunk = events.next().await.expect("watch ended").unwrap();
            buf.extend_from_slice(&chunk);
            while let Some(i) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=i).collect();
                let ev: Value = serde_json::from_slice(&line).unwrap();
                if ev["type"] == "MODIFIED" {
                    return ev;
                }
            }
        }
    })
    .await
    .expect("a MODIFIED event within 20 s");
    assert_eq!(event["object"]["apiVersion"], "kubevirt.io/v1", "{event}");
    assert_eq!(event["object"]["spec"]["imageTag"], "v1-merge");

    let (code, jp) = json_of(
        admin
            .patch(url(&format!("{KV}/kubevirt")))
            .header("Content-Type", "application/json-patch+json")
            .body(r#"[{"op":"test","path":"/apiVersion","value":"kubevirt.io/v1"},{"op":"replace","path":"/spec/imageTag","value":"v1-json"}]"#)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 200, "{jp}");
    assert_eq!(jp["spec"]["imageTag"], "v1-json");

    // Server-side apply at v1 (kubectl), the field manager's entry at v1.
    let applied = KUBEVIRT_CR.replace("imagePullPolicy: IfNotPresent", "imagePullPolicy: Always");
    std::fs::write(&cr, &applied).unwrap();
    let out = kubectl.ok(&[
        "apply",
        "--server-side",
        "--force-conflicts",
        "--field-manager=ssa-test",
        "-f",
        cr.to_str().unwrap(),
    ]);
    assert!(out.contains("serverside-applied"), "{out}");
    let (_, after) = json_of(
        admin
            .get(url(&format!("{KV}/kubevirt")))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(after["spec"]["imagePullPolicy"], "Always");
    let ssa = after["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["manager"] == "ssa-test")
        .unwrap();
    assert_eq!(ssa["apiVersion"], "kubevirt.io/v1");
    assert_eq!(ssa["operation"], "Apply");

    // The status subresource.
    let (code, st) = json_of(
        admin
            .patch(url(&format!("{KV}/kubevirt/status")))
            .header("Content-Type", "application/merge-patch+json")
            .body(r#"{"status":{"phase":"Deploying"}}"#)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 200, "{st}");
    assert_eq!(st["status"]["phase"], "Deploying");
    assert_eq!(st["apiVersion"], "kubevirt.io/v1");

    // Lists carry v1 items; Tables come from kube-apiserver with objects at v1.
    let (code, list) = json_of(admin.get(url(KV)).send().await.unwrap()).await;
    assert_eq!(code, 200, "{list}");
    assert_eq!(list["kind"], "KubeVirtList");
    assert_eq!(list["apiVersion"], "kubevirt.io/v1");
    assert_eq!(list["items"][0]["apiVersion"], "kubevirt.io/v1");
    let (code, table) = json_of(
        admin
            .get(url(&format!("{KV}?includeObject=Object")))
            .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 200, "{table}");
    assert_eq!(table["kind"], "Table");
    assert_eq!(table["rows"][0]["object"]["apiVersion"], "kubevirt.io/v1");

    // A user without RBAC: our SubjectAccessReview says no.
    let alice = common::client(&env, Some(&env.plain_user));
    let (code, denied) = json_of(
        alice
            .get(url(&format!("{KV}/kubevirt")))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 403, "{denied}");
    assert_eq!(denied["reason"], "Forbidden");
    let (code, _) = json_of(
        alice
            .patch(url(&format!("{KV}/kubevirt")))
            .header("Content-Type", "application/merge-patch+json")
            .body(r#"{"spec":{"imageTag":"evil"}}"#)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 403);

    // Delete; then kube-apiserver's 404, passed through.
    let (code, _) = json_of(
        admin
            .delete(url(&format!("{KV}/kubevirt")))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 200);
    let (code, gone) = json_of(
        admin
            .get(url(&format!("{KV}/kubevirt")))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 404, "{gone}");
    assert_eq!(gone["reason"], "NotFound");

    // kube-apiserver gone: 503 naming it. Asked as the aggregator would for system:masters
    // (front-proxy certificate and headers), which needs no SubjectAccessReview: the
    // answer is the forwarding's, whatever the authorizer's cache holds.
    drop(kube);
    let proxy = common::client(&env, Some(&env.front_proxy));
    let (code, down) = json_of(
        proxy
            .get(url(&format!("{KV}/kubevirt")))
            .header("X-Remote-User", "admin")
            .header("X-Remote-Group", "system:masters")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 503, "{down}");
    assert!(
        down["message"].as_str().unwrap().contains("kube-apiserver"),
        "{down}"
    );
}
