//! `GET …/backup` and `PUT …/restore` against a real etcd and the real virt-apiserver: a
//! restore brings back deleted objects with their uid, deletes newer ones, sets changed
//! ones back while keeping their current status, leaves the rest unwritten, and a bad
//! document is a 422 naming the field with nothing written.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{VMS, admin, vm};
use serde_json::{Value, json};

const BACKUP: &str = "/apis/subresources.kubevirt.io/v1/backup";
const RESTORE: &str = "/apis/subresources.kubevirt.io/v1/restore";
const MERGE: &str = "application/merge-patch+json";
/// A cluster-scoped kind: its items carry no namespace.
const CLUSTER_TYPES: &str =
    "/apis/instancetype.kubevirt.io/v1beta1/virtualmachineclusterinstancetypes";

async fn get(c: &reqwest::Client, url: String) -> (u16, Value) {
    let r = c.get(url).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

async fn patch(c: &reqwest::Client, url: String, body: Value) {
    let r = c
        .patch(url)
        .header("content-type", MERGE)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
}

async fn restore(c: &reqwest::Client, base: &str, body: &Value) -> (u16, Value) {
    let r = c
        .put(format!("{base}{RESTORE}"))
        .json(body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

fn uid(v: &Value) -> &str {
    v["metadata"]["uid"].as_str().unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn restore_sets_the_store_back_to_the_backup() {
    let env = common::start(true);
    let c = admin(&env);
    let base = &env.server_url;
    for name in ["a", "b", "c"] {
        let r = c
            .post(format!("{base}{VMS}"))
            .json(&vm(name))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
    }
    let r = c
        .post(format!("{base}{CLUSTER_TYPES}"))
        .json(&json!({"apiVersion": "instancetype.kubevirt.io/v1beta1",
            "kind": "VirtualMachineClusterInstancetype", "metadata": {"name": "small"},
            "spec": {"cpu": {"guest": 1}, "memory": {"guest": "128Mi"}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let (_, small_before) = get(&c, format!("{base}{CLUSTER_TYPES}/small")).await;
    let (code, backup) = get(&c, format!("{base}{BACKUP}")).await;
    assert_eq!(code, 200, "{backup}");
    assert_eq!(backup["kind"], "Backup");
    assert_eq!(backup["items"].as_array().unwrap().len(), 4, "{backup}");
    let before = |n: &str| {
        backup["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["name"] == n)
            .unwrap()["object"]
            .clone()
    };
    let (_, c_before) = get(&c, format!("{base}{VMS}/c")).await;

    // After the backup: b deleted, d created, a's labels changed and its status observed.
    assert_eq!(
        c.delete(format!("{base}{VMS}/b"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let r = c
        .post(format!("{base}{VMS}"))
        .json(&vm("d"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    patch(
        &c,
        format!("{base}{VMS}/a"),
        json!({"metadata":{"labels":{"app":"changed"}}}),
    )
    .await;
    patch(
        &c,
        format!("{base}{VMS}/a/status"),
        json!({"status":{"printableStatus":"Stopped","ready":false}}),
    )
    .await;

    // The cluster instancetype deleted: it comes back, with no namespace.
    assert_eq!(
        c.delete(format!("{base}{CLUSTER_TYPES}/small"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );

    // c made again under its name: another uid.
    assert_eq!(
        c.delete(format!("{base}{VMS}/c"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let r = c
        .post(format!("{base}{VMS}"))
        .json(&vm("c"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let (_, c_newer) = get(&c, format!("{base}{VMS}/c")).await;

    // A document naming something we do not store: 422 naming it, nothing written.
    let mut bad = backup.clone();
    bad["items"][0]["resource"] = json!("pods");
    let (_, list_before) = get(&c, format!("{base}{VMS}")).await;
    let (code, status) = restore(&c, base, &bad).await;
    assert_eq!(code, 422);
    assert_eq!(
        status["details"]["causes"][0]["field"], "items[0].resource",
        "{status}"
    );
    let (_, list_after) = get(&c, format!("{base}{VMS}")).await;
    assert_eq!(
        list_before["metadata"]["resourceVersion"],
        list_after["metadata"]["resourceVersion"]
    );
    // Not JSON at all: 400.
    let r = c
        .put(format!("{base}{RESTORE}"))
        .body("{")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    // The wrong method names the right one.
    let r = c
        .post(format!("{base}{BACKUP}"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["allow"], "GET");

    let (code, result) = restore(&c, base, &backup).await;
    assert_eq!(code, 200);
    // b and small created; a set back; d deleted; c's newer object deleted and the
    // backup's created.
    assert_eq!(
        (
            &result["created"],
            &result["updated"],
            &result["deleted"],
            &result["unchanged"]
        ),
        (&json!(3), &json!(1), &json!(2), &json!(0)),
        "{result}"
    );
    // Watchers see c's newer object end and the backup's begin, not one turn into the other.
    let rv = list_after["metadata"]["resourceVersion"].as_str().unwrap();
    let events = c
        .get(format!(
            "{base}{VMS}?watch=1&resourceVersion={rv}&fieldSelector=metadata.name=c&timeoutSeconds=1"
        ))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let seen: Vec<(String, String)> = events
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|e| {
            (
                e["type"].as_str().unwrap().to_string(),
                uid(&e["object"]).to_string(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("DELETED".to_string(), uid(&c_newer).to_string()),
            ("ADDED".to_string(), uid(&c_before).to_string()),
        ],
        "{events}"
    );

    let (code, b) = get(&c, format!("{base}{VMS}/b")).await;
    assert_eq!(code, 200);
    assert_eq!(uid(&b), uid(&before("b")), "b comes back with its uid");
    assert_eq!(get(&c, format!("{base}{VMS}/d")).await.0, 404);
    let (code, small) = get(&c, format!("{base}{CLUSTER_TYPES}/small")).await;
    assert_eq!(code, 200, "{small}");
    assert_eq!(
        uid(&small),
        uid(&small_before),
        "small comes back with its uid"
    );
    let (_, a) = get(&c, format!("{base}{VMS}/a")).await;
    assert_eq!(a["metadata"]["labels"]["app"], "demo");
    assert_eq!(
        a["status"]["printableStatus"], "Stopped",
        "a keeps its current status"
    );
    let (_, c_after) = get(&c, format!("{base}{VMS}/c")).await;
    assert_eq!(
        uid(&c_after),
        uid(&c_before),
        "c is the backup's object again"
    );

    // Both endpoints are described in OpenAPI v3, with their documents' schemas.
    let (code, doc) = get(
        &c,
        format!("{base}/openapi/v3/apis/subresources.kubevirt.io/v1"),
    )
    .await;
    assert_eq!(code, 200);
    let put = &doc["paths"][RESTORE]["put"];
    let body_ref = put["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        .as_str()
        .unwrap_or_default();
    assert!(body_ref.ends_with(".Backup"), "{put}");
    let name = body_ref.rsplit('/').next().unwrap();
    assert!(
        doc["components"]["schemas"][name]["properties"]["items"].is_object(),
        "{}",
        doc["components"]["schemas"][name]
    );
    assert!(doc["paths"][BACKUP]["get"].is_object());

    // Restoring again changes nothing.
    let (_, again) = restore(&c, base, &backup).await;
    assert_eq!(again["unchanged"], 4, "{again}");
}

/// N6 of the security review at bd37f96: a restore obeys the rules of every write. A
/// document with a hostDisk (the gate is off) or taking another object's uid is refused
/// whole with the field named and nothing written; an object created again never takes its
/// status from the document (a VMI's node and pods decide where consoles go).
#[tokio::test(flavor = "multi_thread")]
async fn restore_obeys_the_rules_of_every_write() {
    let env = common::start(true);
    let c = admin(&env);
    let base = &env.server_url;
    let r = c
        .post(format!("{base}{VMS}"))
        .json(&vm("a"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    let (_, backup) = get(&c, format!("{base}{BACKUP}")).await;
    let a_uid = backup["items"][0]["object"]["metadata"]["uid"].clone();
    let vmi = |name: &str, uid: &str, volumes: Value| {
        json!({"resource": "virtualmachineinstances", "namespace": "default", "name": name,
            "object": {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                "metadata": {"name": name, "namespace": "default", "uid": uid},
                "spec": {"domain": {"devices": {}, "resources": {"requests": {"memory": "64Mi"}}},
                         "volumes": volumes},
                "status": {"phase": "Running", "nodeName": "node-a",
                           "activePods": {"uid-of-another-tenants-pod": "node-a"}}}})
    };
    let (_, list_before) = get(&c, format!("{base}{VMS}")).await;
    let rv_before = list_before["metadata"]["resourceVersion"].clone();

    let mut bad = backup.clone();
    bad["items"].as_array_mut().unwrap().push(vmi(
        "host",
        "11111111-1111-1111-1111-111111111111",
        json!([{"name": "h", "hostDisk": {"path": "/dev/sda", "type": "Disk"}}]),
    ));
    let mut same_uid = vm("copy");
    same_uid["metadata"]["uid"] = a_uid.clone();
    same_uid["metadata"]["namespace"] = json!("default");
    bad["items"].as_array_mut().unwrap().push(json!({
        "resource": "virtualmachines", "namespace": "default", "name": "copy",
        "object": same_uid}));
    let (code, status) = restore(&c, base, &bad).await;
    assert_eq!(code, 422, "{status}");
    let fields: Vec<&str> = status["details"]["causes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["field"].as_str().unwrap())
        .collect();
    assert!(
        fields.contains(&"items[1].object.spec.volumes[0].hostDisk"),
        "{status}"
    );
    assert!(fields.contains(&"items[2].object.metadata.uid"), "{status}");
    let (_, list_after) = get(&c, format!("{base}{VMS}")).await;
    assert_eq!(
        list_after["metadata"]["resourceVersion"], rv_before,
        "nothing written"
    );
    assert_eq!(
        get(
            &c,
            format!("{base}/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances/host")
        )
        .await
        .0,
        404
    );

    // A VMI created again comes without the document's status.
    let mut forged = backup.clone();
    forged["items"].as_array_mut().unwrap().push(vmi(
        "forged",
        "22222222-2222-2222-2222-222222222222",
        json!([]),
    ));
    let (code, result) = restore(&c, base, &forged).await;
    assert_eq!(code, 200, "{result}");
    let (_, got) = get(
        &c,
        format!("{base}/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances/forged"),
    )
    .await;
    assert_eq!(
        got["metadata"]["uid"],
        "22222222-2222-2222-2222-222222222222"
    );
    assert!(
        got["status"].get("activePods").is_none() && got["status"].get("nodeName").is_none(),
        "status taken from the document: {got}"
    );
}
