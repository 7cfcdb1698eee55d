//! Abuse cases (issue 20): each is answered with the right 4xx/429 — a Status naming the
//! limit — while a normal client, another user on connections of its own, keeps working:
//! every request it issues during the abuse succeeds. How fast it stays is a figure, not an
//! assertion: `cargo xtask bench abuse` measures its p99 under each case (docs/benchmarks.md).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
use common::json_of;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::{VMS, admin, client, vm};
use http_body_util::{BodyExt, Empty};
use serde_json::{Value, json};
use virt_devenv::DevEnv;

/// A normal client: another user (through the front proxy, as the aggregator sends it)
/// reading the collection, reading and patching its own VM, in a loop until stopped.
struct Normal {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(usize, Vec<String>)>,
}

impl Normal {
    /// Creates its VM, then loops.
    async fn start(env: &DevEnv, name: &str) -> Self {
        let c = client(env, Some(&env.front_proxy));
        let url = format!("{}{VMS}", env.server_url);
        let as_user = |r: reqwest::RequestBuilder| {
            r.header("X-Remote-User", "normal-client")
                .header("X-Remote-Group", "system:masters")
                .timeout(Duration::from_secs(30))
        };
        let r = as_user(c.post(&url)).json(&vm(name)).send().await.unwrap();
        assert_eq!(r.status(), 201, "{:?}", r.text().await);
        let stop = Arc::new(AtomicBool::new(false));
        let name = name.to_string();
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                let mut ok = 0;
                let mut failures = Vec::new();
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let requests = [
                        as_user(c.get(&url)).query(&[("limit", "10")]),
                        as_user(c.get(format!("{url}/{name}"))),
                        as_user(c.patch(format!("{url}/{name}")))
                            .header("Content-Type", "application/merge-patch+json")
                            .body(
                                json!({"metadata": {"labels": {"i": i.to_string()}}}).to_string(),
                            ),
                    ];
                    for r in requests {
                        match r.send().await {
                            Ok(r) if r.status() == 200 => {
                                let _ = r.bytes().await;
                                ok += 1;
                            }
                            Ok(r) => failures.push(format!(
                                "{}: {}",
                                r.status(),
                                r.text().await.unwrap_or_default()
                            )),
                            Err(e) => failures.push(e.to_string()),
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                (ok, failures)
            }
        });
        Normal { stop, task }
    }

    /// Stops the loop; asserts that it made requests and every one succeeded.
    async fn check(self, case: &str) {
        self.stop.store(true, Ordering::Relaxed);
        let (ok, failures) = self.task.await.unwrap();
        assert!(
            failures.is_empty(),
            "{case}: {} of the normal client's requests failed: {:?}",
            failures.len(),
            &failures[..failures.len().min(5)]
        );
        assert!(ok >= 3, "{case}: the normal client made only {ok} requests");
    }
}

/// The soft limit of open files of this process (`/proc/self/limits`).
fn open_files_limit() -> usize {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Max open files"))
                .and_then(|l| l.split_whitespace().nth(3)?.parse().ok())
        })
        .unwrap_or(1024)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_json_patch_copy_bomb_is_refused_and_others_go_on() {
    let env = common::start(true);
    let c = admin(&env);
    let url = format!("{}{VMS}", env.server_url);
    assert_eq!(
        c.post(&url)
            .json(&vm("bomb"))
            .send()
            .await
            .unwrap()
            .status(),
        201
    );
    let normal = Normal::start(&env, "normal").await;
    // Each copy of /spec into itself doubles the object: 40 copies would be 2^40 times it.
    let bomb: Vec<Value> = (0..40)
        .map(|i| json!({"op": "copy", "from": "/spec", "path": format!("/spec/c{i}")}))
        .collect();
    for _ in 0..5 {
        let r = c
            .patch(format!("{url}/bomb"))
            .header("Content-Type", "application/json-patch+json")
            .body(serde_json::to_vec(&bomb).unwrap())
            .send()
            .await
            .unwrap();
        let (code, s) = json_of(r).await;
        assert_eq!(
            (code, s["reason"].as_str()),
            (413, Some("RequestEntityTooLarge")),
            "{s}"
        );
        assert!(
            s["message"]
                .as_str()
                .unwrap_or("")
                .contains("copies more than"),
            "the Status names the limit: {s}"
        );
    }
    // Nothing of it was stored.
    let (_, stored) = json_of(c.get(format!("{url}/bomb")).send().await.unwrap()).await;
    assert!(stored["spec"].get("c0").is_none(), "{stored}");
    normal.check("copy bomb").await;
}

/// Connections waiting to be accepted by the listening socket on 127.0.0.1:`port`
/// (`/proc/net/tcp` shows them as a listener's rx queue).
fn listen_queue(port: u16) -> Option<usize> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let local = format!("0100007F:{port:04X}");
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        // State 0A: LISTEN.
        if f.get(1) != Some(&local.as_str()) || f.get(3) != Some(&"0A") {
            return None;
        }
        let (_, queued) = f.get(4)?.split_once(':')?;
        usize::from_str_radix(queued, 16).ok()
    })
}

/// Waits until the server's listen queue has room for `room` more connections; a server
/// that stops accepting fails the test.
async fn wait_for_listen_queue_room(port: u16, room: usize) {
    // The server asks for the kernel's largest queue.
    let max: usize = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(4096);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let Some(queued) = listen_queue(port) else {
            panic!("no listening socket on 127.0.0.1:{port} in /proc/net/tcp");
        };
        if queued + room <= max {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the server left {queued} of {max} connections unaccepted for 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_thousand_silent_connections_are_closed_and_others_go_on() {
    use tokio::io::AsyncReadExt;
    let env = common::start_with(&["--header-read-timeout-seconds=5"]);
    let port: u16 = env.server_url.rsplit(':').next().unwrap().parse().unwrap();
    let normal = Normal::start(&env, "normal").await;
    // Both this process and the server hold one descriptor per connection.
    let n = 10_000.min(open_files_limit().saturating_sub(1000));
    assert!(n >= 1000, "open files limit too low for this test: {n}");
    // In batches of 100, each once the server's listen queue has room for it: a
    // connection the kernel completed for this client but then dropped from a full queue
    // is never closed nor reset (the client would wait on it forever), and it is the
    // kernel's, not the server's.
    const BATCH: usize = 100;
    let mut silent = Vec::new();
    for start in (0..n).step_by(BATCH) {
        wait_for_listen_queue_room(port, 2 * BATCH).await;
        let mut opening = tokio::task::JoinSet::new();
        for _ in start..(start + BATCH).min(n) {
            opening.spawn(tokio::time::timeout(
                Duration::from_secs(30),
                tokio::net::TcpStream::connect(("127.0.0.1", port)),
            ));
        }
        while let Some(r) = opening.join_next().await {
            if let Ok(Ok(Ok(tcp))) = r {
                silent.push(tcp);
            }
        }
    }
    assert!(
        silent.len() >= n * 9 / 10,
        "only {} of {n} connections opened",
        silent.len()
    );
    // A new client on a connection of its own is served, once its turn comes.
    let r = admin(&env)
        .get(format!("{}{VMS}", env.server_url))
        .timeout(Duration::from_secs(60))
        .send()
        .await
        .expect("a new client beside 10k silent connections");
    assert_eq!(r.status(), 200);
    // Every silent connection is closed by the server (after the TLS handshake timeout),
    // without a response: they never sent a request.
    let mut closed = tokio::task::JoinSet::new();
    for mut tcp in silent {
        closed.spawn(async move {
            let mut buf = [0u8; 64];
            tokio::time::timeout(Duration::from_secs(60), tcp.read(&mut buf)).await
        });
    }
    while let Some(r) = closed.join_next().await {
        match r.unwrap() {
            Ok(Ok(0)) | Ok(Err(_)) => {}
            Ok(Ok(n)) => panic!("a silent connection got {n} bytes"),
            Err(_) => panic!("a silent connection was not closed within 60 s"),
        }
    }
    normal.check("silent connections").await;
}

/// An HTTP/2 connection with the admin's certificate: many watches on few connections.
async fn h2(env: &DevEnv) -> hyper::client::conn::http2::SendRequest<Empty<Bytes>> {
    let port: u16 = env.server_url.rsplit(':').next().unwrap().parse().unwrap();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let tls = common::tls_client_alpn(env, b"h2")
        .connect(
            rustls::pki_types::ServerName::try_from("localhost").unwrap(),
            tcp,
        )
        .await
        .unwrap();
    let (send, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    send
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_thousand_watches_of_one_user_then_429_and_others_go_on() {
    // The default per-user limit: 5000.
    let env = common::start(true);
    let normal = Normal::start(&env, "normal").await;
    let watch = |send: &mut hyper::client::conn::http2::SendRequest<Empty<Bytes>>| {
        let req = hyper::Request::get(format!("{VMS}?watch=true"))
            .header("host", "localhost")
            .body(Empty::new())
            .unwrap();
        send.send_request(req)
    };
    // The server takes 1000 streams per HTTP/2 connection.
    let mut conns = Vec::new();
    for _ in 0..5 {
        conns.push(h2(&env).await);
    }
    let mut held = Vec::new();
    for send in &mut conns {
        send.ready().await.unwrap();
        let pending: Vec<_> = (0..1000).map(|_| watch(send)).collect();
        for r in futures::future::join_all(pending).await {
            let r = r.unwrap();
            assert_eq!(r.status(), 200);
            // Read every event, as a client that keeps up does (one that does not is
            // ended once 1024 events behind, which would free its slot).
            let mut body = r.into_body();
            held.push(tokio::spawn(async move {
                while let Some(Ok(_)) = body.frame().await {}
            }));
        }
    }
    assert_eq!(held.len(), 5000);
    // The 5001st of the same user: 429 naming the limit.
    let r = admin(&env)
        .get(format!("{}{VMS}?watch=true", env.server_url))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.headers().get("retry-after").and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let (code, s) = json_of(r).await;
    assert_eq!((code, s["reason"].as_str()), (429, Some("TooManyRequests")));
    assert!(
        s["message"]
            .as_str()
            .unwrap_or("")
            .contains("Too many watches"),
        "{s}"
    );
    // Another user still watches, and sees its own change.
    let other = client(&env, Some(&env.front_proxy));
    let mut w = other
        .get(format!("{}{VMS}/normal?watch=true", env.server_url))
        .header("X-Remote-User", "another-user")
        .header("X-Remote-Group", "system:masters")
        .send()
        .await
        .unwrap();
    assert_eq!(w.status(), 200);
    let first = tokio::time::timeout(Duration::from_secs(10), w.chunk())
        .await
        .expect("an event for the other user's watch")
        .unwrap();
    assert!(first.is_some());
    normal.check("5000 watches").await;
    // The held watches are still open streams.
    assert!(held.iter().all(|h| !h.is_finished()), "a held watch ended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_64_mib_body_gets_413_and_others_go_on() {
    let env = common::start(true);
    let c = admin(&env);
    let url = format!("{}{VMS}", env.server_url);
    let normal = Normal::start(&env, "normal").await;
    // A valid VM padded with a 64 MiB annotation.
    let mut big = vm("big");
    big["metadata"]["annotations"] = json!({"pad": "x".repeat(64 << 20)});
    let body = serde_json::to_vec(&big).unwrap();
    assert!(body.len() > 64 << 20);
    // The server answers 413 once it has read 8 times the limit and then closes the
    // connection (as a Go server stops reading an unread body): a client still sending
    // may see the connection reset before it reads the answer. Either is a refusal; at
    // least one of the attempts must carry the Status naming the limit.
    let mut statuses = 0;
    for _ in 0..5 {
        let r = match c
            .post(&url)
            .header("Content-Type", "application/json")
            .body(body.clone())
            .send()
            .await
        {
            Ok(r) => r,
            Err(e) => {
                assert!(e.is_request(), "{e:?}");
                continue;
            }
        };
        let (code, s) = json_of(r).await;
        assert_eq!(
            (code, s["reason"].as_str()),
            (413, Some("RequestEntityTooLarge")),
            "{s}"
        );
        assert!(
            s["message"]
                .as_str()
                .unwrap_or("")
                .contains("limit is 3145728 bytes"),
            "the Status names the limit: {s}"
        );
        statuses += 1;
    }
    assert!(
        statuses >= 1,
        "every 64 MiB request ended in a reset connection"
    );
    assert_eq!(
        c.get(format!("{url}/big")).send().await.unwrap().status(),
        404
    );
    normal.check("64 MiB body").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deeply_nested_json_is_refused_on_every_write_and_others_go_on() {
    let env = common::start(true);
    let c = admin(&env);
    let url = format!("{}{VMS}", env.server_url);
    assert_eq!(
        c.post(&url)
            .json(&vm("target"))
            .send()
            .await
            .unwrap()
            .status(),
        201
    );
    let normal = Normal::start(&env, "normal").await;
    // 100k levels, placed where each write path decodes free-form JSON.
    let deep = format!("{}1{}", "[".repeat(100_000), "]".repeat(100_000));
    let object = format!(
        r#"{{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{{"name":"deep"}},"spec":{deep}}}"#
    );
    let merge = format!(r#"{{"metadata":{{"annotations":{{"a":{deep}}}}}}}"#);
    let json_patch = format!(r#"[{{"op":"add","path":"/metadata/annotations/a","value":{deep}}}]"#);
    let writes = [
        (c.post(&url), "application/json", object.clone(), false),
        (
            c.put(format!("{url}/target")),
            "application/json",
            object.clone(),
            false,
        ),
        (
            c.patch(format!("{url}/target")),
            "application/merge-patch+json",
            merge,
            true,
        ),
        (
            c.patch(format!("{url}/target")),
            "application/json-patch+json",
            json_patch,
            true,
        ),
        (
            c.patch(format!("{url}/target?fieldManager=t")),
            "application/apply-patch+yaml",
            object,
            false,
        ),
    ];
    for (req, ct, body, names_limit) in writes {
        let r = req
            .header("Content-Type", ct)
            .body(body)
            .send()
            .await
            .expect("an answer, not a dead server");
        let (code, s) = json_of(r).await;
        assert!(
            matches!(
                (code, s["reason"].as_str()),
                (400, Some("BadRequest")) | (422, Some("Invalid"))
            ),
            "{ct}: {code} {s}"
        );
        if names_limit {
            assert!(
                s["message"]
                    .as_str()
                    .unwrap_or("")
                    .contains("recursion limit"),
                "{ct}: the Status names the limit: {s}"
            );
        }
    }
    // Nothing was stored or changed.
    assert_eq!(
        c.get(format!("{url}/deep")).send().await.unwrap().status(),
        404
    );
    let (_, target) = json_of(c.get(format!("{url}/target")).send().await.unwrap()).await;
    assert!(
        target["metadata"]["annotations"].get("a").is_none(),
        "{target}"
    );
    normal.check("deeply nested JSON").await;
}

/// A TLS connector with no client certificate: anyone who can reach the port.
fn anonymous_tls(env: &DevEnv, alpn: &[u8]) -> tokio_rustls::TlsConnector {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&env.server_ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![alpn.to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
}

/// A TLS connection from the loopback address `source`, without a client certificate.
async fn anonymous_conn(
    env: &DevEnv,
    source: &str,
    alpn: &[u8],
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let port: u16 = env.server_url.rsplit(':').next().unwrap().parse().unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
    let tcp = socket
        .connect(format!("127.0.0.1:{port}").parse().unwrap())
        .await
        .unwrap();
    anonymous_tls(env, alpn)
        .connect(
            rustls::pki_types::ServerName::try_from("localhost").unwrap(),
            tcp,
        )
        .await
        .unwrap()
}

/// N2 of the security review at bd37f96: connections that complete TLS and say nothing, and
/// HTTP/2 connections that made one request and then hold on, are closed by the server
/// (within the first-request and idle timeouts) instead of keeping their slots for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connections_silent_after_tls_or_idle_after_a_request_are_closed() {
    use tokio::io::AsyncReadExt;
    let env = common::start_with(&[
        "--header-read-timeout-seconds=3",
        "--idle-timeout-seconds=4",
    ]);
    let normal = Normal::start(&env, "normal").await;
    let mut silent = Vec::new();
    for _ in 0..400 {
        silent.push(anonymous_conn(&env, "127.0.0.1", b"h2").await);
    }
    let mut idle = Vec::new();
    for _ in 0..50 {
        let tls = anonymous_conn(&env, "127.0.0.1", b"h2").await;
        let (mut send, conn) =
            hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .handshake::<_, Empty<Bytes>>(hyper_util::rt::TokioIo::new(tls))
                .await
                .unwrap();
        let conn = tokio::spawn(conn);
        let r = send
            .send_request(
                hyper::Request::get("/healthz")
                    .header("host", "localhost")
                    .body(Empty::new())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        idle.push((send, conn));
    }
    let mut closed = tokio::task::JoinSet::new();
    for mut tls in silent {
        closed.spawn(async move {
            let mut buf = [0u8; 64];
            // The server may first send its HTTP/2 settings: read until the end.
            tokio::time::timeout(Duration::from_secs(30), async {
                loop {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                }
            })
            .await
        });
    }
    while let Some(r) = closed.join_next().await {
        assert!(
            r.unwrap().is_ok(),
            "a connection silent after TLS was still open after 30 s"
        );
    }
    for (_send, conn) in idle {
        tokio::time::timeout(Duration::from_secs(30), conn)
            .await
            .expect("an idle HTTP/2 connection was still open after 30 s")
            .unwrap()
            .ok();
    }
    normal.check("silent and idle connections").await;
}

/// N2 of the security review at bd37f96: callers without credentials trickling bodies to
/// the eviction webhook hold neither the API's write slots (a write by a user goes on) nor
/// the webhook slots of another address (kube-apiserver's calls, i.e. drains, go on), and
/// each such body is cut off after a few seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slow_webhook_bodies_stop_neither_writes_nor_other_callers() {
    use futures::SinkExt;
    type Chunks =
        futures::channel::mpsc::Receiver<Result<hyper::body::Frame<Bytes>, std::io::Error>>;
    let env = common::start_with(&["--max-mutating-requests-inflight=20"]);
    let normal = Normal::start(&env, "normal").await;
    let path = kubevirt_api::eviction::WEBHOOK_PATH;
    // 300 calls from one address, each sending one byte of 64 KiB and then nothing.
    let mut senders = Vec::new();
    let mut pending = tokio::task::JoinSet::new();
    for _ in 0..3 {
        let tls = anonymous_conn(&env, "127.0.0.1", b"h2").await;
        let (send, conn) =
            hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .handshake::<_, http_body_util::StreamBody<Chunks>>(hyper_util::rt::TokioIo::new(
                    tls,
                ))
                .await
                .unwrap();
        tokio::spawn(conn);
        for _ in 0..100 {
            let (mut tx, rx) = futures::channel::mpsc::channel(1);
            tx.send(Ok(hyper::body::Frame::data(Bytes::from_static(b"{"))))
                .await
                .unwrap();
            senders.push(tx);
            let mut send = send.clone();
            pending.spawn(async move {
                send.ready().await.unwrap();
                let req = hyper::Request::post(path)
                    .header("host", "localhost")
                    .header("content-type", "application/json")
                    .header("content-length", "65536")
                    .body(http_body_util::StreamBody::new(rx))
                    .unwrap();
                let t0 = std::time::Instant::now();
                let r = send.send_request(req).await.unwrap();
                (r.status().as_u16(), t0.elapsed())
            });
        }
    }
    // Those beyond the address's share are refused at once.
    tokio::time::sleep(Duration::from_secs(1)).await;
    // kube-apiserver's call from another address is answered meanwhile.
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "eviction",
            "requestKind": {"group": "policy", "version": "v1", "kind": "Eviction"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "requestSubResource": "eviction",
            "name": "virt-launcher-x-abcde", "namespace": "default", "operation": "CREATE",
            "userInfo": {"username": "admin"},
            "object": {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": "virt-launcher-x-abcde", "namespace": "default"}},
            "dryRun": false}
    });
    let tls = anonymous_conn(&env, "127.0.0.2", b"h2").await;
    let (mut send, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .handshake::<_, http_body_util::Full<Bytes>>(hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        send.send_request(
            hyper::Request::post(path)
                .header("host", "localhost")
                .header("content-type", "application/json")
                .body(http_body_util::Full::new(Bytes::from(review.to_string())))
                .unwrap(),
        ),
    )
    .await
    .expect("the webhook answered another address within 10 s")
    .unwrap();
    assert_eq!(r.status(), 200);
    let body: Value =
        serde_json::from_slice(&r.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(
        body["response"]["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002",
        "{body}"
    );
    // Every slow call ends: refused at once (429) or cut off (408) within seconds.
    let (mut refused, mut cut) = (0, 0);
    while let Some(r) = pending.join_next().await {
        let (code, took) = r.unwrap();
        match code {
            429 => refused += 1,
            408 => {
                cut += 1;
                assert!(took < Duration::from_secs(20), "a slow body held {took:?}");
            }
            other => panic!("a slow webhook call got {other}"),
        }
    }
    assert_eq!(refused + cut, 300);
    assert!(
        cut <= virt_apiserver::inflight::DEFAULT_WEBHOOK_PER_SOURCE,
        "{cut} slow calls of one address were admitted at once"
    );
    drop(senders);
    normal.check("slow webhook bodies").await;
}
