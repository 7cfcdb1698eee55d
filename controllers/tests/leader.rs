//! Leader election against an in-memory coordination.k8s.io Lease endpoint that keeps
//! Kubernetes' optimistic concurrency (PUT with a stale resourceVersion → 409), so two
//! electors can race for real without a kube-apiserver.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use kube::Client;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use virt_controllers::leader::{Elector, LeaderError, LeaseConfig};

#[derive(Default)]
struct Store {
    lease: Option<Value>,
    rv: u64,
}

type Shared = Arc<Mutex<Store>>;

fn reply(code: StatusCode, body: Value) -> Response<Full<Bytes>> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
           "message": reason, "reason": reason, "code": code})
}

async fn handle(store: Shared, req: Request<kube::client::Body>) -> Response<Full<Bytes>> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let mut st = store.lock().unwrap();
    let named = path.ends_with("/leases/leader");
    match (method, named) {
        (Method::GET, true) => match &st.lease {
            Some(l) => reply(StatusCode::OK, l.clone()),
            None => reply(StatusCode::NOT_FOUND, status(404, "NotFound")),
        },
        (Method::POST, false) => {
            if st.lease.is_some() {
                return reply(StatusCode::CONFLICT, status(409, "AlreadyExists"));
            }
            let mut l: Value = serde_json::from_slice(&body).unwrap();
            st.rv += 1;
            l["metadata"]["resourceVersion"] = json!(st.rv.to_string());
            st.lease = Some(l.clone());
            reply(StatusCode::CREATED, l)
        }
        (Method::PUT, true) => {
            let mut l: Value = serde_json::from_slice(&body).unwrap();
            let current = st
                .lease
                .as_ref()
                .map(|c| c["metadata"]["resourceVersion"].clone());
            if current != Some(l["metadata"]["resourceVersion"].clone()) {
                return reply(StatusCode::CONFLICT, status(409, "Conflict"));
            }
            st.rv += 1;
            l["metadata"]["resourceVersion"] = json!(st.rv.to_string());
            st.lease = Some(l.clone());
            reply(StatusCode::OK, l)
        }
        (Method::PATCH, true) => {
            let patch: Value = serde_json::from_slice(&body).unwrap();
            st.rv += 1;
            let rv = st.rv.to_string();
            let Some(l) = st.lease.as_mut() else {
                return reply(StatusCode::NOT_FOUND, status(404, "NotFound"));
            };
            json_patch::merge(l, &patch);
            l["metadata"]["resourceVersion"] = json!(rv);
            let l = l.clone();
            reply(StatusCode::OK, l)
        }
        _ => reply(StatusCode::NOT_FOUND, status(404, "NotFound")),
    }
}

fn client(store: &Shared) -> Client {
    let store = store.clone();
    let svc = tower::service_fn(move |req| {
        let store = store.clone();
        async move { Ok::<_, Infallible>(handle(store, req).await) }
    });
    Client::new(svc, "kubevirt")
}

fn cfg(identity: &str) -> LeaseConfig {
    LeaseConfig {
        lease_duration: Duration::from_secs(1),
        renew_deadline: Duration::from_millis(600),
        retry_period: Duration::from_millis(100),
        ..LeaseConfig::new("kubevirt", "leader", identity)
    }
}

fn holder(store: &Shared) -> Option<String> {
    store.lock().unwrap().lease.as_ref().and_then(|l| {
        l["spec"]["holderIdentity"]
            .as_str()
            .map(ToString::to_string)
    })
}

#[tokio::test]
async fn one_leader_at_a_time_and_takeover_after_expiry() {
    let store = Shared::default();
    let mut a = Elector::new(client(&store), cfg("a"));
    let mut b = Elector::new(client(&store), cfg("b"));
    assert!(
        a.try_acquire_or_renew().await.unwrap(),
        "a creates the lease"
    );
    assert!(
        !b.try_acquire_or_renew().await.unwrap(),
        "b sees a fresh lease"
    );
    // a keeps renewing: b never gets it.
    for _ in 0..12 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(a.try_acquire_or_renew().await.unwrap());
        assert!(!b.try_acquire_or_renew().await.unwrap());
    }
    assert_eq!(holder(&store).as_deref(), Some("a"));
    // a stops renewing: b takes over once it has seen the same record for a lease duration.
    let start = std::time::Instant::now();
    while !b.try_acquire_or_renew().await.unwrap() {
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "b never took over"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(start.elapsed() >= Duration::from_millis(900));
    assert_eq!(holder(&store).as_deref(), Some("b"));
    let transitions =
        store.lock().unwrap().lease.as_ref().unwrap()["spec"]["leaseTransitions"].clone();
    assert_eq!(transitions, json!(1));
    // a's next attempt sees b's fresh lease.
    assert!(!a.try_acquire_or_renew().await.unwrap());
}

#[tokio::test]
async fn a_leader_that_loses_the_lease_stops_acting() {
    let store = Shared::default();
    let elector = Elector::new(client(&store), cfg("a"));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let stopped = Arc::new(Mutex::new(false));
    let stopped2 = stopped.clone();
    let run = tokio::spawn(
        elector.run(CancellationToken::new(), move |leading| async move {
            let _ = started_tx.send(());
            leading.cancelled().await;
            *stopped2.lock().unwrap() = true;
        }),
    );
    started_rx.await.unwrap();
    assert_eq!(holder(&store).as_deref(), Some("a"));
    // Someone else holds it now (e.g. after a network partition healed).
    {
        let mut st = store.lock().unwrap();
        let l = st.lease.as_mut().unwrap();
        l["spec"]["holderIdentity"] = json!("b");
        l["spec"]["renewTime"] = json!("2999-01-01T00:00:00.000000Z");
        st.rv += 1;
        let rv = st.rv.to_string();
        st.lease.as_mut().unwrap()["metadata"]["resourceVersion"] = json!(rv);
    }
    let result = tokio::time::timeout(Duration::from_secs(3), run)
        .await
        .expect("run returns after losing the lease")
        .unwrap();
    assert!(matches!(result, Err(LeaderError::Lost(_))), "{result:?}");
    assert!(*stopped.lock().unwrap(), "the work was told to stop");
    assert_eq!(
        holder(&store).as_deref(),
        Some("b"),
        "a lost lease is not released"
    );
}

#[tokio::test]
async fn shutdown_releases_the_lease() {
    let store = Shared::default();
    let elector = Elector::new(client(&store), cfg("a"));
    let shutdown = CancellationToken::new();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let run = tokio::spawn(elector.run(shutdown.clone(), move |leading| async move {
        let _ = started_tx.send(());
        leading.cancelled().await;
    }));
    started_rx.await.unwrap();
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(3), run)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(holder(&store), None);
    // The next candidate gets it at once.
    let mut b = Elector::new(client(&store), cfg("b"));
    assert!(b.try_acquire_or_renew().await.unwrap());
}
