#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::json;

use super::*;
use crate::memstore::MemStore;

fn vmis() -> &'static ResourceDef {
    ResourceDef::by_plural("virtualmachineinstances").unwrap()
}

fn vmi(name: &str) -> Value {
    json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "labels": {"app": "db"}},
        "spec": {"domain": {"resources": {"requests": {"memory": "64Mi"}}}}})
}

fn registry() -> Registry {
    Registry::new(MemStore::default(), "/registry")
}

fn opts() -> WriteOptions {
    WriteOptions::default()
}

fn rv(obj: &Value) -> i64 {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn create_sets_server_fields_and_refuses_a_second_object_of_the_name() {
    let r = registry();
    let w = r.create(vmis(), "ns", vmi("a"), &opts()).await.unwrap();
    assert!(w.created);
    let m = &w.object["metadata"];
    assert_eq!(m["namespace"], "ns");
    assert!(m["uid"].as_str().is_some_and(|u| u.len() == 36), "{m}");
    assert!(m["creationTimestamp"].is_string(), "{m}");
    assert_eq!(rv(&w.object), 1);
    assert_eq!(r.get(vmis(), "ns", "a").await.unwrap(), w.object);

    let e = r.create(vmis(), "ns", vmi("a"), &opts()).await.unwrap_err();
    assert_eq!((e.code, e.reason), (409, "AlreadyExists"));
    // The namespace in the body must be the request's.
    let mut other = vmi("b");
    other["metadata"]["namespace"] = json!("elsewhere");
    assert_eq!(
        r.create(vmis(), "ns", other, &opts())
            .await
            .unwrap_err()
            .code,
        400
    );
    // generateName: a name of the prefix and five characters.
    let mut generated = vmi("");
    generated["metadata"] = json!({"generateName": "web-"});
    let w = r.create(vmis(), "ns", generated, &opts()).await.unwrap();
    let name = w.object["metadata"]["name"].as_str().unwrap();
    assert!(name.starts_with("web-") && name.len() == 9, "{name}");
}

#[tokio::test]
async fn a_dry_run_writes_nothing() {
    let r = registry();
    let store = r.storage();
    let dry = WriteOptions {
        dry_run: true,
        ..opts()
    };
    let w = r.create(vmis(), "ns", vmi("a"), &dry).await.unwrap();
    assert_eq!(w.object["metadata"]["name"], "a");
    assert_eq!(store.current_revision().await.unwrap(), 0);
    assert_eq!(r.get(vmis(), "ns", "a").await.unwrap_err().code, 404);
}

#[tokio::test]
async fn updates_need_the_current_resource_version_and_status_writes_keep_the_spec() {
    let r = registry();
    let created = r
        .create(vmis(), "ns", vmi("a"), &opts())
        .await
        .unwrap()
        .object;
    let mut stale = created.clone();
    stale["metadata"]["labels"]["app"] = json!("web");
    let updated = r
        .update(vmis(), "ns", "a", stale.clone(), false, &opts())
        .await
        .unwrap()
        .object;
    assert!(rv(&updated) > rv(&created));
    assert_eq!(updated["metadata"]["labels"]["app"], "web");
    // The same write again carries the old resourceVersion: someone else won.
    let e = r
        .update(vmis(), "ns", "a", stale, false, &opts())
        .await
        .unwrap_err();
    assert_eq!((e.code, e.reason), (409, "Conflict"));
    // Without a resourceVersion: 422 naming it.
    let mut none = updated.clone();
    none["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("resourceVersion");
    let e = r
        .update(vmis(), "ns", "a", none, false, &opts())
        .await
        .unwrap_err();
    assert_eq!(e.code, 422, "{}", e.message);

    // Through /status only the status changes.
    let mut status = updated.clone();
    status["status"] = json!({"phase": "Scheduled"});
    status["metadata"]["labels"]["app"] = json!("ignored");
    let after = r
        .update(vmis(), "ns", "a", status, true, &opts())
        .await
        .unwrap()
        .object;
    assert_eq!(after["status"]["phase"], "Scheduled");
    assert_eq!(after["metadata"]["labels"]["app"], "web");
}

#[tokio::test]
async fn finalizers_hold_a_deletion_until_they_are_removed() {
    let r = registry();
    let mut body = vmi("a");
    body["metadata"]["finalizers"] = json!(["example.com/keep"]);
    let created = r.create(vmis(), "ns", body, &opts()).await.unwrap().object;
    // A precondition on another uid: nothing happens.
    let wrong = DeleteOptions {
        preconditions: Some(Preconditions {
            uid: Some("00000000-0000-0000-0000-000000000000".into()),
            resource_version: None,
        }),
        ..DeleteOptions::default()
    };
    assert_eq!(
        r.delete(vmis(), "ns", "a", &wrong).await.unwrap_err().code,
        409
    );
    let pending = match r
        .delete(vmis(), "ns", "a", &DeleteOptions::default())
        .await
        .unwrap()
    {
        DeleteOutcome::Pending(obj) => obj,
        DeleteOutcome::Deleted(s) => panic!("deleted despite a finalizer: {s:?}"),
    };
    assert!(pending["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(
        pending["metadata"]["uid"], created["metadata"]["uid"],
        "the same object"
    );
    // The finalizer's owner lets go: the object is gone.
    let mut done = pending.clone();
    done["metadata"]["finalizers"] = json!([]);
    r.update(vmis(), "ns", "a", done, false, &opts())
        .await
        .unwrap();
    assert_eq!(r.get(vmis(), "ns", "a").await.unwrap_err().code, 404);
}

#[tokio::test]
async fn lists_page_through_one_snapshot_and_a_compacted_one_expires() {
    let r = registry();
    let store = r.storage();
    for n in ["a", "b", "c", "d", "e"] {
        r.create(vmis(), "ns", vmi(n), &opts()).await.unwrap();
    }
    r.create(vmis(), "other", vmi("z"), &opts()).await.unwrap();
    let page = |token: Option<String>| ListOptions {
        limit: 2,
        continue_token: token,
        ..ListOptions::default()
    };
    let first = r.list(vmis(), Some("ns"), &page(None)).await.unwrap();
    let names = |l: &Listed| -> Vec<String> {
        l.items
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names(&first), ["a", "b"]);
    assert_eq!(first.remaining, Some(3));
    // A change after the first page is not in the later ones: one snapshot.
    r.create(vmis(), "ns", vmi("bb"), &opts()).await.unwrap();
    let second = r
        .list(vmis(), Some("ns"), &page(first.continue_token.clone()))
        .await
        .unwrap();
    assert_eq!(names(&second), ["c", "d"]);
    assert_eq!(second.revision, first.revision);
    // All namespaces, everything.
    let all = r.list(vmis(), None, &ListOptions::default()).await.unwrap();
    assert_eq!(all.items.len(), 7);

    // Once that snapshot is compacted, its continue token has expired (410, with a token
    // to go on from the same place at the latest revision).
    store
        .compact(store.current_revision().await.unwrap())
        .await
        .unwrap();
    let e = r
        .list(vmis(), Some("ns"), &page(second.continue_token.clone()))
        .await
        .unwrap_err();
    assert_eq!((e.code, e.reason), (410, "Expired"));
    assert!(e.continue_token.is_some());
    let rest = r
        .list(vmis(), Some("ns"), &page(e.continue_token))
        .await
        .unwrap();
    assert_eq!(names(&rest), ["e"]);
}

#[tokio::test]
async fn label_selectors_filter_and_a_future_resource_version_is_refused() {
    let r = registry();
    r.create(vmis(), "ns", vmi("a"), &opts()).await.unwrap();
    let mut web = vmi("b");
    web["metadata"]["labels"]["app"] = json!("web");
    r.create(vmis(), "ns", web, &opts()).await.unwrap();
    let sel = ListOptions {
        label_selector: Some(crate::selector::LabelSelector::parse("app=web").unwrap()),
        ..ListOptions::default()
    };
    let l = r.list(vmis(), Some("ns"), &sel).await.unwrap();
    assert_eq!(l.items.len(), 1);
    assert_eq!(l.items[0]["metadata"]["name"], "b");
    let future = ListOptions {
        resource_version: Some("1000".into()),
        resource_version_match: Some("Exact".into()),
        ..ListOptions::default()
    };
    let e = r.list(vmis(), Some("ns"), &future).await.unwrap_err();
    assert_eq!(e.code, 504, "{}", e.message);
}
