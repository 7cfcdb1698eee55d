//! Watches and reads at the edges of etcd's history and of the watch cache's, against a
//! real etcd and the real virt-apiserver binary: compacted and future resourceVersions end
//! with 410 Gone in the form clients re-list on, a large backlog of events is delivered
//! whole, an idle watcher's bookmarks follow the store's revision, and many watchers share
//! one etcd watch.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::{VMS, admin, vm};
use futures::StreamExt;
use serde_json::{Value, json};

async fn json_of(r: reqwest::Response) -> (u16, Value) {
    let code = r.status().as_u16();
    (code, r.json().await.unwrap())
}

/// Reads a watch until it ends (server timeout) and returns its events.
async fn events_of(c: &reqwest::Client, url: &str) -> (u16, Vec<Value>) {
    let r = c.get(url).send().await.unwrap();
    let code = r.status().as_u16();
    let text = r.text().await.unwrap();
    let events = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (code, events)
}

fn rv_of(v: &Value) -> i64 {
    v["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

async fn storage(env: &virt_devenv::DevEnv) -> virt_apiserver::storage::Storage {
    virt_apiserver::storage::Storage::connect(std::slice::from_ref(&env.etcd_url))
        .await
        .unwrap()
}

/// An ERROR event with 410 Gone / Expired, on an established (200) stream: the form
/// kube-apiserver uses and kube-runtime's watcher re-lists on.
fn assert_gone(code: u16, events: &[Value], what: &str) {
    assert_eq!(code, 200, "{what}: the stream is established first");
    assert_eq!(events.len(), 1, "{what}: one ERROR event: {events:?}");
    assert_eq!(events[0]["type"], "ERROR", "{what}: {events:?}");
    assert_eq!(events[0]["object"]["kind"], "Status", "{what}");
    assert_eq!(events[0]["object"]["code"], 410, "{what}: {events:?}");
    assert_eq!(
        events[0]["object"]["reason"], "Expired",
        "{what}: {events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compacted_and_future_versions_are_gone_not_internal_errors() {
    // A watch cache of 2 events: the versions below are older than it, so etcd answers
    // them, as it does every version once the cache has moved past.
    let env = common::start_with(&["--watch-cache-history=2"]);
    let c = admin(&env);
    let url = format!("{}{VMS}", env.server_url);
    for i in 0..5 {
        let r = c
            .post(&url)
            .json(&vm(&format!("a{i}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
    }
    let (_, page) = json_of(c.get(format!("{url}?limit=2")).send().await.unwrap()).await;
    let old = rv_of(&page);
    let token = page["metadata"]["continue"].as_str().unwrap().to_string();
    for i in 0..5 {
        c.post(&url)
            .json(&vm(&format!("b{i}")))
            .send()
            .await
            .unwrap();
    }
    // A consistent LIST returns once the watch cache has every write: `old` is then behind
    // the cache's 2 events, whatever its reflector's timing.
    let (code, _) = json_of(c.get(&url).send().await.unwrap()).await;
    assert_eq!(code, 200);
    let s = storage(&env).await;
    let now = s.current_revision().await.unwrap();
    s.compact(now).await.unwrap();

    // (a) A watch starting at a compacted revision, namespaced and across namespaces
    // (virt-handler watches all namespaces with a field selector).
    let all = format!("{}/apis/kubevirt.io/v1/virtualmachines", env.server_url);
    for base in [&url, &all] {
        let (code, events) = events_of(
            &c,
            &format!("{base}?watch=1&resourceVersion={old}&timeoutSeconds=5"),
        )
        .await;
        assert_gone(code, &events, "watch from a compacted revision");
        let msg = events[0]["object"]["message"].as_str().unwrap();
        assert!(
            msg.starts_with("too old resource version"),
            "kube-apiserver's wording: {msg}"
        );
    }
    // (b) Resuming with bookmarks and a selector: same answer.
    let (code, events) = events_of(
        &c,
        &format!(
            "{all}?watch=1&resourceVersion={old}&allowWatchBookmarks=true&fieldSelector=metadata.name%3Da1&timeoutSeconds=5"
        ),
    )
    .await;
    assert_gone(code, &events, "resumed filtered watch");

    // (c) Reads at a compacted revision: an old continue token and an exact read.
    let (code, st) = json_of(
        c.get(format!("{url}?limit=2&continue={token}"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (code, st["reason"].as_str()),
        (410, Some("Expired")),
        "{st}"
    );
    let (code, st) = json_of(
        c.get(format!(
            "{url}?resourceVersion={old}&resourceVersionMatch=Exact"
        ))
        .send()
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(
        (code, st["reason"].as_str()),
        (410, Some("Expired")),
        "{st}"
    );

    // A resourceVersion this store never reached (a client from before an etcd reset):
    // 410 after kube-apiserver's grace, also on the stream.
    let (code, events) = events_of(
        &c,
        &format!(
            "{url}?watch=1&resourceVersion={}&timeoutSeconds=10",
            now + 1000
        ),
    )
    .await;
    assert_gone(code, &events, "watch from a future revision");

    // The current revision still works: later changes arrive.
    let mut stream = c
        .get(format!(
            "{url}?watch=1&resourceVersion={now}&timeoutSeconds=3"
        ))
        .send()
        .await
        .unwrap()
        .bytes_stream();
    c.post(&url).json(&vm("late")).send().await.unwrap();
    let mut text = String::new();
    while let Some(Ok(chunk)) = stream.next().await {
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let first: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(
        (
            first["type"].as_str(),
            first["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("late")),
        "{text}"
    );
}

/// etcd hands a resuming watcher up to 1000 revisions in one gRPC message, each event
/// with its previous value; past gRPC's 4 MiB default that used to end every retry of
/// the watch with "storage unavailable".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backlog_larger_than_grpc_default_is_delivered_whole() {
    let env = common::start(true);
    let c = admin(&env);
    let url = format!("{}{VMS}", env.server_url);
    let mut big = vm("big");
    big["metadata"]["annotations"] = json!({"example.com/blob": "x".repeat(200_000)});
    let (code, created) = json_of(c.post(&url).json(&big).send().await.unwrap()).await;
    assert_eq!(code, 201, "{created}");
    let from = rv_of(&created);
    const UPDATES: usize = 30;
    for i in 0..UPDATES {
        let r = c
            .patch(format!("{url}/big"))
            .header("Content-Type", "application/merge-patch+json")
            .body(json!({"metadata": {"labels": {"n": i.to_string()}}}).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    // 30 events × (new + previous value) × 200 kB ≈ 12 MB in one etcd response.
    let (code, events) = events_of(
        &c,
        &format!("{url}?watch=1&resourceVersion={from}&timeoutSeconds=4"),
    )
    .await;
    assert_eq!(code, 200);
    let modified: Vec<&Value> = events.iter().filter(|e| e["type"] == "MODIFIED").collect();
    assert_eq!(
        modified.len(),
        UPDATES,
        "every update, no ERROR: {:?}",
        events
            .iter()
            .filter(|e| e["type"] != "MODIFIED")
            .collect::<Vec<_>>()
    );
    assert_eq!(
        modified[UPDATES - 1]["object"]["metadata"]["labels"]["n"],
        (UPDATES - 1).to_string()
    );
    // And a LIST of it all at once (over 4 MiB too once there are enough of them).
    for i in 0..25 {
        let mut b = vm(&format!("big{i}"));
        b["metadata"]["annotations"] = json!({"example.com/blob": "y".repeat(200_000)});
        assert_eq!(c.post(&url).json(&b).send().await.unwrap().status(), 201);
    }
    let (code, list) = json_of(c.get(&url).send().await.unwrap()).await;
    assert_eq!(code, 200, "{}", list["message"]);
    assert_eq!(list["items"].as_array().unwrap().len(), 26);
}

/// A watcher whose selector matches nothing still learns the store's revision from
/// bookmarks, so when it reconnects it resumes inside etcd's history.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_watchers_get_bookmarks_at_the_current_revision() {
    let env = common::start(true);
    let c = admin(&env);
    let url = format!("{}{VMS}", env.server_url);
    let (_, list) = json_of(c.get(&url).send().await.unwrap()).await;
    let from = rv_of(&list);
    // Changes in another namespace: outside the watched key range entirely.
    let other = format!(
        "{}/apis/kubevirt.io/v1/namespaces/other/virtualmachines",
        env.server_url
    );
    let mut last = from;
    for i in 0..5 {
        let (code, o) = json_of(
            c.post(&other)
                .json(&vm(&format!("o{i}")))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(code, 201, "{o}");
        last = rv_of(&o);
    }
    let started = Instant::now();
    let (code, events) = events_of(
        &c,
        &format!(
            "{url}?watch=1&resourceVersion={from}&allowWatchBookmarks=true&labelSelector=none%3Dnone&timeoutSeconds=5"
        ),
    )
    .await;
    assert_eq!(code, 200);
    assert!(started.elapsed() >= Duration::from_secs(4));
    let marks: Vec<i64> = events
        .iter()
        .filter(|e| e["type"] == "BOOKMARK")
        .map(|e| rv_of(&e["object"]))
        .collect();
    assert!(
        events.iter().all(|e| e["type"] == "BOOKMARK"),
        "nothing else: {events:?}"
    );
    assert!(
        marks.iter().any(|rv| *rv >= last),
        "a bookmark at or after the store's revision {last} (watch began at {from}): {marks:?}"
    );
}

/// etcd's watcher count, from its metrics.
async fn etcd_watchers(env: &virt_devenv::DevEnv) -> u64 {
    let text = reqwest::get(format!("{}/metrics", env.etcd_url))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("etcd_debugging_mvcc_watcher_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|v| v as u64)
        .expect("etcd_debugging_mvcc_watcher_total in etcd's metrics")
}

/// The watch cache: fifty client watches (every namespace, one namespace, a selector) add
/// no etcd watcher; each gets the same change; a version etcd has compacted is still
/// served while the cache holds its events, as kube-apiserver's watch cache does.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_watchers_share_one_etcd_watch_per_resource() {
    let env = common::start(true);
    let c = admin(&env);
    let url = format!("{}{VMS}", env.server_url);
    let all = format!("{}/apis/kubevirt.io/v1/virtualmachines", env.server_url);
    let (code, first) = json_of(c.post(&url).json(&vm("w0")).send().await.unwrap()).await;
    assert_eq!(code, 201, "{first}");
    let from = rv_of(&first);
    // The cache's reflectors: one etcd watch per stored resource (VMs, VMIs, migrations,
    // instance types and preferences), started in the background once the server serves,
    // before any client.
    let stored = kubevirt_api::kinds::KindStrategy::stored().count() as u64;
    let mut baseline = etcd_watchers(&env).await;
    for _ in 0..100 {
        if baseline >= stored {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        baseline = etcd_watchers(&env).await;
    }
    assert_eq!(baseline, stored, "the watch cache's etcd watches");
    let mut streams = Vec::new();
    for i in 0..50 {
        let base = if i % 2 == 0 { &url } else { &all };
        let selector = if i % 5 == 0 {
            "&labelSelector=app%3Ddemo"
        } else {
            ""
        };
        let r = c
            .get(format!(
                "{base}?watch=1&resourceVersion={from}&timeoutSeconds=6{selector}"
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        streams.push(r);
    }
    assert_eq!(
        etcd_watchers(&env).await,
        baseline,
        "client watches are fed by the cache's etcd watch"
    );
    let (code, o) = json_of(c.post(&url).json(&vm("w1")).send().await.unwrap()).await;
    assert_eq!(code, 201, "{o}");
    let want = rv_of(&o);
    for r in streams {
        let text = r.text().await.unwrap();
        let events: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0]["type"], "ADDED");
        assert_eq!(events[0]["object"]["metadata"]["name"], "w1");
        assert_eq!(rv_of(&events[0]["object"]), want);
    }
    let s = storage(&env).await;
    s.compact(s.current_revision().await.unwrap())
        .await
        .unwrap();
    let (code, events) = events_of(
        &c,
        &format!("{url}?watch=1&resourceVersion={from}&timeoutSeconds=2"),
    )
    .await;
    assert_eq!(code, 200);
    let names: Vec<&str> = events
        .iter()
        .map(|e| e["object"]["metadata"]["name"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(
        names,
        ["w1"],
        "served from the cache after compaction: {events:?}"
    );
    // A consistent LIST sees the latest write, from the cache: the VMs had etcd's last
    // write, so even without trusted progress notifications (Debian 12's etcd 3.4.23 may
    // send them ahead of its events) the cache knows it is at etcd's revision.
    let (_, list) = json_of(c.get(&all).send().await.unwrap()).await;
    assert_eq!(list["items"].as_array().unwrap().len(), 2);
    assert!(rv_of(&list) >= want);
    let consistent_list_from = "cache";
    let metrics = c
        .get(format!("{}/metrics", env.server_url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for (op, by) in [("list", consistent_list_from), ("watch", "cache")] {
        let line =
            format!("apiserver_watch_cache_reads_total{{operation=\"{op}\",served_by=\"{by}\"}}");
        assert!(metrics.contains(&line), "{line} in {metrics}");
    }
}
