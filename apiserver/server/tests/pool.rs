//! VirtualMachineInstanceReplicaSet (`kubevirt.io/v1`) and VirtualMachinePool
//! (`pool.kubevirt.io/v1beta1`) against a real etcd and the real virt-apiserver: discovery
//! with KubeVirt's short names and a `scale` subresource, create/get/list, KubeVirt's
//! printer columns, `/status`, `/scale` read, replaced (as an HPA does, with the version it
//! read) and merge-patched (as `kubectl scale` does), the `/scale` paths in OpenAPI v2 and
//! v3, and the 422s naming the field.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{admin, json_of};
use serde_json::{Value, json};

const POOLS: &str = "/apis/pool.kubevirt.io/v1beta1/namespaces/default/virtualmachinepools";
const RSS: &str = "/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstancereplicasets";
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";

fn vmi_spec() -> Value {
    json!({"domain": {"devices": {}, "resources": {"requests": {"memory": "64Mi"}}}})
}

fn pool(name: &str, replicas: i64, selector_app: &str) -> Value {
    json!({"apiVersion": "pool.kubevirt.io/v1beta1", "kind": "VirtualMachinePool",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": selector_app}},
            "virtualMachineTemplate": {"metadata": {"labels": {"app": name}},
                "spec": {"runStrategy": "Halted", "template": {"spec": vmi_spec()}}}}})
}

fn replicaset(name: &str, replicas: i64, selector_app: &str) -> Value {
    json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceReplicaSet",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": selector_app}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": vmi_spec()}}})
}

/// The causes' fields of a 422.
fn fields(status: &Value) -> Vec<String> {
    status["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn pools_and_replica_sets_are_served_with_scale() {
    let env = common::start(true);
    let base = env.server_url.clone();
    let c = admin(&env);

    // Discovery: both kinds, KubeVirt's short names, status and scale subresources.
    for (gv, plural, short) in [
        (
            "/apis/pool.kubevirt.io/v1beta1",
            "virtualmachinepools",
            "vmpool",
        ),
        (
            "/apis/kubevirt.io/v1",
            "virtualmachineinstancereplicasets",
            "vmirs",
        ),
    ] {
        let (code, list) = json_of(c.get(format!("{base}{gv}")).send().await.unwrap()).await;
        assert_eq!(code, 200);
        let resources = list["resources"].as_array().unwrap();
        let find = |name: String| resources.iter().find(|r| r["name"] == name).cloned();
        let kind = find(plural.to_string()).unwrap();
        assert_eq!(kind["shortNames"][0], short);
        assert!(find(format!("{plural}/status")).is_some());
        let scale = find(format!("{plural}/scale")).unwrap();
        assert_eq!(scale["kind"], "Scale");
        assert_eq!(scale["group"], "autoscaling");
        assert_eq!(scale["verbs"], json!(["get", "patch", "update"]));
    }

    for (coll, obj) in [
        (format!("{base}{POOLS}"), pool("web", 2, "web")),
        (format!("{base}{RSS}"), replicaset("web", 2, "web")),
    ] {
        let (code, created) = json_of(c.post(&coll).json(&obj).send().await.unwrap()).await;
        assert_eq!(code, 201, "{created}");
        let (code, got) = json_of(c.get(format!("{coll}/web")).send().await.unwrap()).await;
        assert_eq!(code, 200);
        assert_eq!(got["spec"]["replicas"], 2);
        let (_, listed) = json_of(c.get(&coll).send().await.unwrap()).await;
        assert_eq!(listed["items"].as_array().unwrap().len(), 1);

        // The status a controller writes shows in the columns and the Scale.
        let mut with_status = got.clone();
        with_status["status"] =
            json!({"replicas": 2, "readyReplicas": 1, "labelSelector": "app=web"});
        let (code, written) = json_of(
            c.put(format!("{coll}/web/status"))
                .json(&with_status)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(code, 200, "{written}");
        let (code, table) =
            json_of(c.get(&coll).header("Accept", TABLE).send().await.unwrap()).await;
        assert_eq!(code, 200, "{table}");
        let columns: Vec<&str> = table["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(columns, ["Name", "Desired", "Current", "Ready", "Age"]);
        assert_eq!(
            table["rows"][0]["cells"].as_array().unwrap()[1..4],
            [json!(2), json!(2), json!(1)]
        );

        // GET /scale.
        let (code, scale) = json_of(c.get(format!("{coll}/web/scale")).send().await.unwrap()).await;
        assert_eq!(code, 200, "{scale}");
        assert_eq!(scale["kind"], "Scale");
        assert_eq!(scale["apiVersion"], "autoscaling/v1");
        assert_eq!(scale["spec"]["replicas"], 2);
        assert_eq!(
            scale["status"],
            json!({"replicas": 2, "selector": "app=web"})
        );

        // PUT /scale with the version read (an HPA): the object's spec.replicas follows.
        let mut up = scale.clone();
        up["spec"]["replicas"] = json!(3);
        let (code, put) = json_of(
            c.put(format!("{coll}/web/scale"))
                .json(&up)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(code, 200, "{put}");
        assert_eq!(put["spec"]["replicas"], 3);
        // The same version again is stale: 409.
        let (code, _) = json_of(
            c.put(format!("{coll}/web/scale"))
                .json(&up)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(code, 409);
        // Not a Scale (found by `cargo xtask fuzz`): 400; a Scale without a name: 422.
        for (body, want) in [
            (
                json!({"apiVersion": "apps/v1", "kind": null, "spec": null}),
                400,
            ),
            (
                json!({"apiVersion": "autoscaling/v1", "kind": "Deployment"}),
                400,
            ),
            (json!({"spec": {"replicas": 1}}), 422),
        ] {
            let (code, status) = json_of(
                c.put(format!("{coll}/web/scale?dryRun=All"))
                    .json(&body)
                    .send()
                    .await
                    .unwrap(),
            )
            .await;
            assert_eq!(code, want, "{body}: {status}");
        }

        // A merge patch of /scale, as `kubectl scale --replicas=1` sends it.
        let (code, patched) = json_of(
            c.patch(format!("{coll}/web/scale"))
                .header("Content-Type", "application/merge-patch+json")
                .body(r#"{"spec":{"replicas":1}}"#)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(code, 200, "{patched}");
        assert_eq!(patched["spec"]["replicas"], 1);
        let (_, got) = json_of(c.get(format!("{coll}/web")).send().await.unwrap()).await;
        assert_eq!(got["spec"]["replicas"], 1);
        assert_eq!(got["status"]["readyReplicas"], 1, "status kept");

        // A negative count through /scale: 422 on the Scale naming spec.replicas.
        let (code, status) = json_of(
            c.patch(format!("{coll}/web/scale"))
                .header("Content-Type", "application/merge-patch+json")
                .body(r#"{"spec":{"replicas":-1}}"#)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(code, 422, "{status}");
        assert_eq!(fields(&status), ["spec.replicas"]);
        assert_eq!(status["details"]["kind"], "Scale");
        // A JSON patch works too.
        let (code, patched) = json_of(
            c.patch(format!("{coll}/web/scale"))
                .header("Content-Type", "application/json-patch+json")
                .body(r#"[{"op":"replace","path":"/spec/replicas","value":0}]"#)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(code, 200, "{patched}");
        assert_eq!(patched["spec"]["replicas"], 0);
        // `force` on /scale as on any PATCH: not a boolean → 400; on a non-apply patch → 422.
        for (force, want) in [("5e-324", 400), ("true", 422), ("", 422)] {
            let (code, status) = json_of(
                c.patch(format!("{coll}/web/scale?force={force}"))
                    .header("Content-Type", "application/merge-patch+json")
                    .body(r#"{"spec":{"replicas":0}}"#)
                    .send()
                    .await
                    .unwrap(),
            )
            .await;
            assert_eq!(code, want, "force={force}: {status}");
        }
        // No scale of a missing object.
        let (code, _) = json_of(c.get(format!("{coll}/nope/scale")).send().await.unwrap()).await;
        assert_eq!(code, 404);
    }

    // A VM's kinds have no scale.
    let (code, _) = json_of(
        c.get(format!(
            "{base}/apis/kubevirt.io/v1/namespaces/default/virtualmachines/x/scale"
        ))
        .send()
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(code, 404);
}

/// The `/scale` paths of both kinds are in the OpenAPI v2 and v3 documents, each operation
/// reading or writing an `autoscaling/v1` Scale whose definition the document carries; a
/// VM (no scale) has none.
#[tokio::test(flavor = "multi_thread")]
async fn scale_subresources_are_published_in_openapi() {
    let env = common::start(true);
    let base = env.server_url.clone();
    let c = admin(&env);
    const SCALE: &str = "io.k8s.api.autoscaling.v1.Scale";
    let get = |path: &str| {
        let req = c.get(format!("{base}{path}"));
        async move { json_of(req.send().await.unwrap()).await }
    };
    let (code, v2) = get("/openapi/v2").await;
    assert_eq!(code, 200);
    for (doc_path, coll) in [
        ("/openapi/v3/apis/pool.kubevirt.io/v1beta1", POOLS),
        ("/openapi/v3/apis/kubevirt.io/v1", RSS),
    ] {
        let (code, v3) = get(doc_path).await;
        assert_eq!(code, 200);
        let path = format!(
            "{}/{{name}}/scale",
            coll.replace("/default/", "/{namespace}/")
        );
        for (doc, flavor) in [(&v2, "v2"), (&v3, "v3")] {
            let item = &doc["paths"][&path];
            assert!(item.is_object(), "{flavor}: no {path}");
            let (ok_ref, body_ref, def) = if flavor == "v2" {
                (
                    &item["get"]["responses"]["200"]["schema"]["$ref"],
                    &item["put"]["parameters"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .find(|p| p["in"] == "body")
                        .unwrap()["schema"]["$ref"],
                    &doc["definitions"][SCALE],
                )
            } else {
                (
                    &item["get"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
                    &item["put"]["requestBody"]["content"]["application/json"]["schema"]["$ref"],
                    &doc["components"]["schemas"][SCALE],
                )
            };
            let prefix = if flavor == "v2" {
                "#/definitions/"
            } else {
                "#/components/schemas/"
            };
            assert_eq!(
                ok_ref,
                &json!(format!("{prefix}{SCALE}")),
                "{flavor} {path}"
            );
            assert_eq!(
                body_ref,
                &json!(format!("{prefix}{SCALE}")),
                "{flavor} {path}"
            );
            assert!(item["patch"].is_object(), "{flavor} {path}");
            assert_eq!(
                item["get"]["x-kubernetes-group-version-kind"],
                json!({"group": "autoscaling", "kind": "Scale", "version": "v1"})
            );
            assert!(
                def["properties"]["spec"].is_object(),
                "{flavor}: no {SCALE} definition"
            );
        }
    }
    assert!(
        v2["paths"]
            .as_object()
            .unwrap()
            .keys()
            .filter(|p| p.ends_with("/scale"))
            .all(|p| p.contains("virtualmachinepools")
                || p.contains("virtualmachineinstancereplicasets")),
        "only the two replicated kinds have /scale"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_pools_and_replica_sets_are_422s_naming_the_field() {
    let env = common::start(true);
    let base = env.server_url.clone();
    let c = admin(&env);
    for (coll, good, bad) in [
        (
            format!("{base}{POOLS}"),
            pool("p", 1, "p"),
            pool("p", -1, "other"),
        ),
        (
            format!("{base}{RSS}"),
            replicaset("p", 1, "p"),
            replicaset("p", -1, "other"),
        ),
    ] {
        let (code, status) = json_of(c.post(&coll).json(&bad).send().await.unwrap()).await;
        assert_eq!(code, 422, "{status}");
        assert_eq!(fields(&status), ["spec.replicas", "spec.selector"]);
        assert!(
            status["message"]
                .as_str()
                .unwrap()
                .contains("selector does not match labels."),
            "{status}"
        );
        let (code, _) = json_of(c.get(format!("{coll}/p")).send().await.unwrap()).await;
        assert_eq!(code, 404, "nothing stored");
        let (code, created) = json_of(c.post(&coll).json(&good).send().await.unwrap()).await;
        assert_eq!(code, 201, "{created}");
        // A merge patch to a negative count is refused as well.
        let (code, status) = json_of(
            c.patch(format!("{coll}/p"))
                .header("Content-Type", "application/merge-patch+json")
                .body(r#"{"spec":{"replicas":-3}}"#)
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(code, 422, "{status}");
        assert_eq!(fields(&status), ["spec.replicas"]);
    }
    // A pool's selector is fixed once created.
    let (code, status) = json_of(
        c.patch(format!("{base}{POOLS}/p"))
            .header("Content-Type", "application/merge-patch+json")
            .body(r#"{"spec":{"selector":{"matchLabels":{"app":"p","x":"y"}},"virtualMachineTemplate":{"metadata":{"labels":{"app":"p","x":"y"}}}}}"#)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 422, "{status}");
    assert_eq!(fields(&status), ["spec.selector"]);
    // A pool without a template names it.
    let mut none = pool("q", 1, "q");
    none["spec"]
        .as_object_mut()
        .unwrap()
        .remove("virtualMachineTemplate");
    let (code, status) = json_of(
        c.post(format!("{base}{POOLS}"))
            .json(&none)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(code, 422, "{status}");
    assert_eq!(fields(&status)[0], "spec.virtualMachineTemplate");
}

/// The real kubectl: `kubectl get vmpool|vmirs` with KubeVirt's columns, and `kubectl scale`
/// through the scale subresource (what kubectl sends, not what this test thinks it sends).
#[test]
fn kubectl_gets_and_scales_pools_and_replica_sets() {
    let env = common::start(true);
    let k = common::Kubectl {
        kubeconfig: &env.kubeconfig,
    };
    for (short, obj) in [
        ("vmpool", pool("web", 2, "web")),
        ("vmirs", replicaset("web", 2, "web")),
    ] {
        let created = k.run_stdin(&["create", "-f", "-"], Some(&obj.to_string()));
        assert!(created.ok, "{}", created.stderr);
        let table = k.ok(&["get", short]);
        let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
        assert_eq!(
            header,
            ["NAME", "DESIRED", "CURRENT", "READY", "AGE"],
            "{table}"
        );
        let scaled = k.ok(&["scale", short, "web", "--replicas=4"]);
        assert!(scaled.contains("scaled"), "{scaled}");
        let replicas = k.ok(&["get", short, "web", "-o", "jsonpath={.spec.replicas}"]);
        assert_eq!(replicas, "4");
        // --current-replicas is a precondition kubectl checks against the Scale it reads.
        let refused = k.run(&[
            "scale",
            short,
            "web",
            "--current-replicas=2",
            "--replicas=1",
        ]);
        assert!(!refused.ok, "{}", refused.stdout);
        let negative = k.run(&["scale", short, "web", "--replicas=-1"]);
        assert!(!negative.ok);
    }
}
