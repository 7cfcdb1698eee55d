//! virt-apiserver → virt-handler (docs/cluster-flow.md §5) against real etcd and the
//! real virt-apiserver binary, with a test peer standing in for virt-handler's mTLS
//! server: actions are forwarded (not on dry runs), handler failures are 503s naming
//! the node, the handler's own errors pass through, and console/vnc websockets are
//! relayed byte-exact with keep-alive and close propagation.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod handler_peer;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use virt_apiserver::wsclient::WsConnectError;
use virt_devenv::{DevEnv, HandlerCerts, Options, free_port};

const SUB: &str = "/apis/subresources.kubevirt.io/v1/namespaces/default";

fn start_env(extra_args: Vec<String>) -> DevEnv {
    DevEnv::start(Options {
        apiserver_bin: env!("CARGO_BIN_EXE_virt-apiserver").into(),
        extra_args,
        ..Default::default()
    })
    .expect("start etcd and virt-apiserver")
}

/// A VMI that runs on `node` (status written as virt-handler would).
async fn running_vmi(c: &reqwest::Client, env: &DevEnv, name: &str, node: &str, paused: bool) {
    let url = format!(
        "{}/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances",
        env.server_url
    );
    let vmi = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": name},
        "spec": {"domain": {"resources": {"requests": {"memory": "64Mi"}}}}});
    let r = c.post(&url).json(&vmi).send().await.unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let mut status = json!({"phase": "Running", "nodeName": node});
    if paused {
        status["conditions"] = json!([{"type": "Paused", "status": "True"}]);
    }
    let r = c
        .patch(format!("{url}/{name}/status"))
        .header("Content-Type", "application/merge-patch+json")
        .json(&json!({ "status": status }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
}

async fn put(
    c: &reqwest::Client,
    env: &DevEnv,
    name: &str,
    action: &str,
    body: Value,
) -> (u16, Value) {
    let r = c
        .put(format!(
            "{}{SUB}/virtualmachineinstances/{name}/{action}",
            env.server_url
        ))
        .json(&body)
        .send()
        .await
        .unwrap();
    let code = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        code,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

type Ws = virt_apiserver::wsclient::WsClient;

/// Opens a VMI stream through the apiserver as kubectl-virt would (optionally without
/// a subprotocol); returns the socket and the chosen subprotocol, or the HTTP error.
async fn open(
    env: &DevEnv,
    name: &str,
    sub: &str,
    subprotocol: bool,
) -> Result<(Ws, Option<String>), (u16, Value)> {
    let port: u16 = env.server_url.rsplit(':').next().unwrap().parse().unwrap();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let tls = common::tls_client(env)
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap();
    let mut headers = http::HeaderMap::new();
    if subprotocol {
        headers.insert(
            "sec-websocket-protocol",
            "plain.kubevirt.io".parse().unwrap(),
        );
    }
    let path = format!("{SUB}/virtualmachineinstances/{name}/{sub}");
    match virt_apiserver::wsclient::connect(tls, &format!("127.0.0.1:{port}"), &path, headers).await
    {
        Ok((ws, res)) => {
            let p = res
                .headers()
                .get("sec-websocket-protocol")
                .map(|v| v.to_str().unwrap().to_string());
            Ok((ws, p))
        }
        Err(WsConnectError::Refused { status, body, .. }) => Err((
            status.as_u16(),
            serde_json::from_slice(&body).unwrap_or(Value::Null),
        )),
        Err(e) => panic!("websocket to the apiserver: {e}"),
    }
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
}

/// Sends `data` in KubeVirt-sized chunks while reading the echo; returns the echo and
/// the pings seen meanwhile.
async fn round_trip(ws: Ws, data: &[u8]) -> (Ws, Vec<u8>) {
    let (mut tx, mut rx) = ws.split();
    let chunks: Vec<Vec<u8>> = data.chunks(10240).map(<[u8]>::to_vec).collect();
    let writer = async move {
        for c in chunks {
            tx.send(Message::Binary(c.into())).await.unwrap();
        }
        tx
    };
    let want = data.len();
    let reader = async move {
        let mut got = Vec::with_capacity(want);
        while got.len() < want {
            match rx.next().await.unwrap().unwrap() {
                Message::Binary(b) => got.extend_from_slice(&b),
                Message::Ping(_) | Message::Pong(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        (rx, got)
    };
    let (tx, (rx, got)) = tokio::time::timeout(Duration::from_secs(60), async {
        tokio::join!(writer, reader)
    })
    .await
    .expect("round trip within 60 s");
    (tx.reunite(rx).unwrap(), got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn actions_are_forwarded_and_failures_name_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let certs = HandlerCerts::generate(dir.path(), "node1").unwrap();
    let good = handler_peer::start(&certs.server.cert, &certs.server.key, &certs.ca).await;
    // A handler whose certificate is from another CA: must not be trusted.
    let other = HandlerCerts::generate(&dir.path().join("other"), "node-wrong-ca").unwrap();
    let wrong_ca = handler_peer::start(&other.server.cert, &other.server.key, &certs.ca).await;
    // A handler that does not accept our client certificate.
    let strict_cert = certs.handler("node-strict").unwrap();
    let strict = handler_peer::start(&strict_cert.cert, &strict_cert.key, &other.ca).await;
    let down = format!("127.0.0.1:{}", free_port().unwrap());
    // node1's handler answering for another node: its certificate names node1.
    let env = start_env(certs.apiserver_args(&[
        ("node1", good.addr.to_string()),
        ("node-down", down),
        ("node-wrong-ca", wrong_ca.addr.to_string()),
        ("node-strict", strict.addr.to_string()),
        ("node-impostor", good.addr.to_string()),
    ]));
    let c = common::admin(&env);
    running_vmi(&c, &env, "vm1", "node1", false).await;
    running_vmi(&c, &env, "held", "node1", true).await;
    running_vmi(&c, &env, "gone", "node1", false).await;
    running_vmi(&c, &env, "far", "node-down", false).await;
    running_vmi(&c, &env, "spoofed", "node-wrong-ca", false).await;
    running_vmi(&c, &env, "refused", "node-strict", false).await;
    running_vmi(&c, &env, "lost", "node-unknown", false).await;
    running_vmi(&c, &env, "elsewhere", "node-impostor", false).await;
    let calls = || good.seen.calls.lock().unwrap().clone();

    // Forwarded, 200 as KubeVirt.
    assert_eq!(put(&c, &env, "vm1", "pause", json!({})).await.0, 200);
    assert_eq!(calls(), ["default/vm1/pause"]);
    assert_eq!(put(&c, &env, "held", "unpause", json!({})).await.0, 200);
    assert_eq!(put(&c, &env, "vm1", "softreboot", json!({})).await.0, 200);
    assert_eq!(
        calls(),
        [
            "default/vm1/pause",
            "default/held/unpause",
            "default/vm1/softreboot"
        ]
    );

    // dryRun: checked, answered, not forwarded; pre-check failures never reach it.
    assert_eq!(
        put(&c, &env, "vm1", "pause", json!({"dryRun": ["All"]}))
            .await
            .0,
        200
    );
    let (code, s) = put(&c, &env, "vm1", "unpause", json!({})).await;
    assert_eq!((code, s["reason"].as_str()), (409, Some("Conflict")));
    let (code, _) = put(&c, &env, "held", "pause", json!({"dryRun": ["All"]})).await;
    assert_eq!(code, 409);
    assert_eq!(calls().len(), 3, "{:?}", calls());

    // The handler's own Status passes through unchanged.
    let (code, s) = put(&c, &env, "gone", "pause", json!({})).await;
    assert_eq!(code, 404);
    assert_eq!(
        s["message"],
        "virtualmachineinstances.kubevirt.io \"gone\" not found on this node"
    );

    // Unreachable, untrusted, refusing or unknown handlers: 503 naming the node.
    for (vmi, node, why) in [
        ("far", "node-down", "not reachable"),
        ("spoofed", "node-wrong-ca", "TLS"),
        ("elsewhere", "node-impostor", "TLS"),
        ("refused", "node-strict", "not reachable"),
        ("lost", "node-unknown", "no address for virt-handler"),
    ] {
        let (code, s) = put(&c, &env, vmi, "pause", json!({})).await;
        let msg = s["message"].as_str().unwrap_or_default();
        assert_eq!(
            (code, s["reason"].as_str()),
            (503, Some("ServiceUnavailable")),
            "{s}"
        );
        assert!(
            msg.contains(&format!("\"{node}\"")) && msg.contains(why),
            "{vmi}: {msg}"
        );
    }
    assert!(strict.seen.tls_failures.load(Ordering::Relaxed) >= 1);
    assert!(strict.seen.calls.lock().unwrap().is_empty());
    assert!(wrong_ca.seen.calls.lock().unwrap().is_empty());

    // Like the real handler, the peer serves nobody without a client certificate.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(&certs.ca).unwrap())
        .unwrap();
    let anon = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let before = good.seen.tls_failures.load(Ordering::Relaxed);
    let tcp = tokio::net::TcpStream::connect(good.addr).await.unwrap();
    let served = match tokio_rustls::TlsConnector::from(Arc::new(anon))
        .connect(ServerName::try_from("node1").unwrap(), tcp)
        .await
    {
        // TLS 1.3: the server's verdict arrives with the first read.
        Ok(mut tls) => {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let _ = tls
                .write_all(b"PUT /v1/namespaces/default/virtualmachineinstances/vm1/pause HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n")
                .await;
            let mut buf = [0u8; 64];
            matches!(tls.read(&mut buf).await, Ok(n) if n > 0)
        }
        Err(_) => false,
    };
    assert!(!served, "a client without a certificate must not be served");
    assert_eq!(good.seen.tls_failures.load(Ordering::Relaxed), before + 1);
    assert_eq!(
        calls().len(),
        4,
        "only the apiserver's calls: {:?}",
        calls()
    );

    // An apiserver without the handler flags explains what is missing.
    let bare = start_env(Vec::new());
    let bc = common::admin(&bare);
    running_vmi(&bc, &bare, "vm1", "node1", false).await;
    let (code, s) = put(&bc, &bare, "vm1", "pause", json!({})).await;
    assert_eq!(code, 503);
    assert!(
        s["message"].as_str().unwrap().contains("--handler-ca"),
        "{s}"
    );
}

/// The value of the series of the server's `/metrics` whose line starts with `prefix`
/// (empty when there is none).
async fn metric(c: &reqwest::Client, env: &DevEnv, prefix: &str) -> String {
    let m = c
        .get(format!("{}/metrics", env.server_url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    m.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_default()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn console_and_vnc_are_relayed_byte_exact_and_closes_propagate() {
    let dir = tempfile::tempdir().unwrap();
    let certs = HandlerCerts::generate(dir.path(), "node1").unwrap();
    let peer = handler_peer::start(&certs.server.cert, &certs.server.key, &certs.ca).await;
    let down = format!("127.0.0.1:{}", free_port().unwrap());
    let env =
        start_env(certs.apiserver_args(&[("node1", peer.addr.to_string()), ("node-down", down)]));
    let c = common::admin(&env);
    running_vmi(&c, &env, "vm1", "node1", false).await;
    running_vmi(&c, &env, "busy", "node1", false).await;
    running_vmi(&c, &env, "far", "node-down", false).await;

    // 1 MiB each way, byte-exact, subprotocol echoed end to end.
    let (ws, proto) = open(&env, "vm1", "console", true).await.unwrap();
    assert_eq!(proto.as_deref(), Some("plain.kubevirt.io"));
    let data = pattern(1 << 20);
    let started = std::time::Instant::now();
    let (mut ws, got) = round_trip(ws, &data).await;
    eprintln!(
        "1 MiB console round trip through virt-apiserver: {:?}",
        started.elapsed()
    );
    assert!(got == data, "console bytes differ");
    assert_eq!(peer.seen.echoed.load(Ordering::Relaxed), 1 << 20);
    assert_eq!(
        peer.seen.offered.lock().unwrap().as_slice(),
        [Some("plain.kubevirt.io".to_string())]
    );

    // An open console counts as a long-running request, and in KubeVirt's console gauge
    // of its VMI.
    let gauge = || metric(&c, &env, "apiserver_longrunning_requests ");
    let consoles = || {
        metric(
            &c,
            &env,
            "kubevirt_console_active_connections{namespace=\"default\",vmi=\"vm1\"} ",
        )
    };
    assert_eq!(gauge().await, "1");
    assert_eq!(consoles().await, "1");

    // The handler closes (another session took over): the client gets the reason.
    ws.send(Message::Text("takeover".into())).await.unwrap();
    let close = loop {
        match tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .unwrap()
        {
            Some(Ok(Message::Close(f))) => break f,
            Some(Ok(_)) => {}
            other => panic!("expected a close frame, got {other:?}"),
        }
    };
    let close = close.expect("close frame with a reason");
    assert_eq!(u16::from(close.code), 1000);
    assert_eq!(close.reason.as_str(), "another console session took over");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while gauge().await != "0" {
        assert!(std::time::Instant::now() < deadline, "relay not ended");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(consoles().await, "0");

    // VNC without a subprotocol (older clients) works too; the client closing ends
    // the handler's session.
    let (ws, proto) = open(&env, "vm1", "vnc", false).await.unwrap();
    assert_eq!(proto, None);
    let (mut ws, got) = round_trip(ws, b"RFB 003.008\n").await;
    assert_eq!(got, b"RFB 003.008\n");
    ws.close(None).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !peer
        .seen
        .ends
        .lock()
        .unwrap()
        .iter()
        .any(|e| e == "client close 1005" || e.starts_with("client close"))
    {
        assert!(std::time::Instant::now() < deadline, "{:?}", peer.seen.ends);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A client message over 256 KiB ends the session with 1009 (too big) instead of
    // being buffered: the library's default would take 64 MiB per message.
    let (mut ws, _) = open(&env, "vm1", "console", true).await.unwrap();
    let echoed = peer.seen.echoed.load(Ordering::Relaxed);
    let _ = ws.send(Message::Binary(vec![0u8; 1 << 20].into())).await;
    let code = loop {
        match tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("the server ends the session")
        {
            Some(Ok(Message::Close(f))) => break f.map(|f| u16::from(f.code)),
            Some(Ok(_)) => {}
            // Closed without a frame (the server may drop the connection at once).
            Some(Err(_)) | None => break None,
        }
    };
    assert!(matches!(code, Some(1009) | None), "close code {code:?}");
    assert!(
        peer.seen.echoed.load(Ordering::Relaxed) == echoed,
        "the oversized message reached virt-handler"
    );

    // Errors before the upgrade are HTTP statuses: handler down → 503 naming the
    // node; the handler's refusal passes through; a plain GET is a 400.
    let (code, s) = open(&env, "far", "console", true).await.err().unwrap();
    assert_eq!(code, 503);
    assert!(
        s["message"].as_str().unwrap().contains("\"node-down\""),
        "{s}"
    );
    let (code, s) = open(&env, "busy", "vnc", true).await.err().unwrap();
    assert_eq!(
        (code, s["message"].as_str()),
        (409, Some("Active VNC connection"))
    );
    let r = c
        .get(format!(
            "{}{SUB}/virtualmachineinstances/vm1/console",
            env.server_url
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idle_console_is_kept_alive_by_pings() {
    let dir = tempfile::tempdir().unwrap();
    let certs = HandlerCerts::generate(dir.path(), "node1").unwrap();
    let peer = handler_peer::start(&certs.server.cert, &certs.server.key, &certs.ca).await;
    let env = start_env(certs.apiserver_args(&[("node1", peer.addr.to_string())]));
    let c = common::admin(&env);
    running_vmi(&c, &env, "vm1", "node1", false).await;
    let (mut ws, _) = open(&env, "vm1", "console", true).await.unwrap();

    // Idle for 45 s; reading answers the apiserver's pings.
    let mut pings = 0;
    let idle = tokio::time::sleep(Duration::from_secs(45));
    tokio::pin!(idle);
    loop {
        tokio::select! {
            () = &mut idle => break,
            m = ws.next() => match m {
                Some(Ok(Message::Ping(_))) => pings += 1,
                other => panic!("idle console got {other:?}"),
            },
        }
    }
    let (_ws, got) = round_trip(ws, b"still here\r\n").await;
    assert_eq!(got, b"still here\r\n");
    assert!(pings >= 2, "client saw {pings} pings in 45 s");
    let handler_pings = peer.seen.pings.load(Ordering::Relaxed);
    assert!(
        handler_pings >= 2,
        "handler saw {handler_pings} pings in 45 s"
    );
    assert!(peer.seen.ends.lock().unwrap().is_empty());
}

/// A kube-apiserver stand-in for the handler lookup: namespaces exist, and virt-handler
/// pods are listed per node from `pods` (node → pod IP, None: a pending pod).
mod fake_kube {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex};

    use axum::Router;
    use axum::extract::{Path, Query, State};
    use axum::routing::get;
    use serde_json::{Value, json};

    #[derive(Debug, Default)]
    pub struct Kube {
        pub pods: Mutex<HashMap<String, Option<String>>>,
        /// `namespace labelSelector fieldSelector` of each pod list.
        pub lists: Mutex<Vec<String>>,
    }

    async fn namespace(Path(ns): Path<String>) -> axum::Json<Value> {
        axum::Json(json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ns}, "status": {"phase": "Active"}}))
    }

    async fn pods(
        State(k): State<Arc<Kube>>,
        Path(ns): Path<String>,
        Query(q): Query<HashMap<String, String>>,
    ) -> axum::Json<Value> {
        let label = q.get("labelSelector").cloned().unwrap_or_default();
        let field = q.get("fieldSelector").cloned().unwrap_or_default();
        k.lists
            .lock()
            .unwrap()
            .push(format!("{ns} {label} {field}"));
        let node = field.strip_prefix("spec.nodeName=").unwrap_or_default();
        let items: Vec<Value> = match k.pods.lock().unwrap().get(node) {
            None => vec![],
            Some(ip) => vec![json!({
                "metadata": {"name": format!("virt-handler-{node}"), "namespace": ns,
                    "labels": {"kubevirt.io": "virt-handler"}, "creationTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"nodeName": node, "containers": [{"name": "virt-handler"}]},
                "status": match ip {
                    Some(ip) => json!({"phase": "Running", "podIP": ip,
                        "conditions": [{"type": "Ready", "status": "True"}]}),
                    None => json!({"phase": "Pending"}),
                }
            })],
        };
        axum::Json(json!({"apiVersion": "v1", "kind": "PodList",
            "metadata": {"resourceVersion": "1"}, "items": items}))
    }

    /// Serves on a free port; returns the kubeconfig path (plain HTTP) and the state.
    pub async fn start(dir: &std::path::Path) -> (std::path::PathBuf, Arc<Kube>) {
        let k = Arc::new(Kube::default());
        let app = Router::new()
            .route("/api/v1/namespaces/{ns}", get(namespace))
            .route("/api/v1/namespaces/{ns}/pods", get(pods))
            .with_state(k.clone());
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(l, app).await });
        let kc = dir.join("fake-kube.kubeconfig");
        std::fs::write(
            &kc,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://127.0.0.1:{port}\nusers:\n- name: u\n  user: {{}}\ncontexts:\n- name: c\n  context:\n    cluster: fake\n    user: u\ncurrent-context: c\n"
            ),
        )
        .unwrap();
        (kc, k)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn handler_pod_is_found_by_node_and_cached() {
    let dir = tempfile::tempdir().unwrap();
    let certs = HandlerCerts::generate(dir.path(), "node1").unwrap();
    let peer = handler_peer::start(&certs.server.cert, &certs.server.key, &certs.ca).await;
    let (kubeconfig, kube) = fake_kube::start(dir.path()).await;
    {
        let mut pods = kube.pods.lock().unwrap();
        // First an address where nothing listens, as if the pod was just replaced.
        pods.insert("node1".into(), Some("127.0.0.2".into()));
        pods.insert("node-pending".into(), None);
    }
    let mut args = certs.apiserver_args(&[]);
    args.extend([
        "--handler-namespace".to_string(),
        "kv-test".to_string(),
        "--handler-port".to_string(),
        peer.addr.port().to_string(),
    ]);
    let env = DevEnv::start(Options {
        apiserver_bin: env!("CARGO_BIN_EXE_virt-apiserver").into(),
        extra_args: args,
        kube_kubeconfig: Some(kubeconfig),
        ..Default::default()
    })
    .expect("start etcd and virt-apiserver");
    let c = common::admin(&env);
    running_vmi(&c, &env, "vm1", "node1", false).await;
    running_vmi(&c, &env, "idle", "node-empty", false).await;
    running_vmi(&c, &env, "early", "node-pending", false).await;
    let lists = || kube.lists.lock().unwrap().clone();

    // The pod of node1, in our namespace, by label and field selector.
    let (code, s) = put(&c, &env, "vm1", "pause", json!({})).await;
    assert_eq!(code, 503, "{s}");
    assert!(s["message"].as_str().unwrap().contains("127.0.0.2"), "{s}");
    assert_eq!(
        lists(),
        ["kv-test kubevirt.io=virt-handler spec.nodeName=node1"]
    );
    // A failed dial drops the cached address: the replacement pod is found at once.
    kube.pods
        .lock()
        .unwrap()
        .insert("node1".into(), Some("127.0.0.1".into()));
    assert_eq!(put(&c, &env, "vm1", "pause", json!({})).await.0, 200);
    assert_eq!(lists().len(), 2);
    // Then the address is reused for a while.
    assert_eq!(put(&c, &env, "vm1", "softreboot", json!({})).await.0, 200);
    let (ws, _) = open(&env, "vm1", "console", true).await.unwrap();
    let (_ws, got) = round_trip(ws, b"hello").await;
    assert_eq!(got, b"hello");
    assert_eq!(lists().len(), 2, "{:?}", lists());
    assert_eq!(
        peer.seen.calls.lock().unwrap().as_slice(),
        ["default/vm1/pause", "default/vm1/softreboot"]
    );

    // No pod, or no running pod, on the node: 503 naming the node.
    for (vmi, node) in [("idle", "node-empty"), ("early", "node-pending")] {
        let (code, s) = put(&c, &env, vmi, "pause", json!({})).await;
        assert_eq!(code, 503, "{s}");
        assert_eq!(
            s["message"],
            format!("no running virt-handler pod on node \"{node}\""),
            "{s}"
        );
    }
}
