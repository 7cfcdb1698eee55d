//! Drives the real `kubectl-virt` binary against an in-process fake of the
//! kube-apiserver + KubeVirt subresource API, over plain HTTP.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BIG: usize = 10 * 1024 * 1024;

#[derive(Clone, Default)]
struct Fake {
    calls: Arc<Mutex<Vec<(String, Value)>>>,
    console_attempts: Arc<Mutex<u32>>,
    deleted: Arc<Mutex<Vec<String>>>,
}

fn status(code: u16, reason: &str, message: &str, name: Option<&str>) -> Response {
    let mut body = json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": message, "reason": reason, "code": code,
    });
    if let Some(n) = name {
        body["details"] = json!({"name": n, "group": "kubevirt.io", "kind": "virtualmachines"});
    }
    (
        StatusCode::from_u16(code).unwrap(),
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn vm_action(
    State(f): State<Fake>,
    Path((ns, name, action)): Path<(String, String, String)>,
    body: Bytes,
) -> Response {
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    f.calls.lock().unwrap().push((
        format!(
            "PUT /apis/subresources.kubevirt.io/v1/namespaces/{ns}/virtualmachines/{name}/{action}"
        ),
        v,
    ));
    match name.as_str() {
        "missing" => status(
            404,
            "NotFound",
            &format!("virtualmachines.kubevirt.io \"{name}\" not found"),
            Some(&name),
        ),
        "locked" => status(
            403,
            "Forbidden",
            &format!(
                "virtualmachines.subresources.kubevirt.io \"{name}\" is forbidden: User \"bob\" cannot update resource \"virtualmachines/{action}\" in API group \"subresources.kubevirt.io\" in the namespace \"{ns}\""
            ),
            Some(&name),
        ),
        "running" => status(409, "Conflict", "VM is already running", Some(&name)),
        _ => StatusCode::ACCEPTED.into_response(),
    }
}

async fn vmi_action(
    State(f): State<Fake>,
    Path((ns, name, action)): Path<(String, String, String)>,
    body: Bytes,
) -> Response {
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    f.calls.lock().unwrap().push((
        format!("PUT /apis/subresources.kubevirt.io/v1/namespaces/{ns}/virtualmachineinstances/{name}/{action}"),
        v,
    ));
    if name == "stopped" {
        return status(
            404,
            "NotFound",
            &format!("virtualmachineinstances.kubevirt.io \"{name}\" not found"),
            Some(&name),
        );
    }
    StatusCode::ACCEPTED.into_response()
}

async fn get_vm(Path((ns, name)): Path<(String, String)>) -> Response {
    if name == "missing" {
        return status(
            404,
            "NotFound",
            &format!("virtualmachines.kubevirt.io \"{name}\" not found"),
            Some(&name),
        );
    }
    let strategy = if name == "stopped" {
        "Halted"
    } else {
        "Always"
    };
    axum::Json(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"runStrategy": strategy, "template": {"spec": {"domain": {"devices": {}}}}}
    }))
    .into_response()
}

async fn console(
    State(f): State<Fake>,
    Path((_ns, name)): Path<(String, String)>,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    assert_eq!(
        headers.get("sec-websocket-protocol").unwrap(),
        "plain.kubevirt.io"
    );
    match name.as_str() {
        "stopped" => {
            return status(
                404,
                "NotFound",
                &format!("virtualmachineinstances.kubevirt.io \"{name}\" not found"),
                Some(&name),
            );
        }
        "booting" => {
            let mut n = f.console_attempts.lock().unwrap();
            *n += 1;
            if *n < 3 {
                return status(400, "BadRequest", "VMI is not running", None);
            }
        }
        _ => {}
    }
    let big = name == "big";
    ws.protocols(["plain.kubevirt.io"])
        .on_upgrade(move |socket| serve_console(socket, big))
}

fn pattern(len: usize) -> Vec<u8> {
    // Every byte value, including the escape byte and NULs, so that any
    // interpretation on the way shows up as a mismatch.
    let mut x: u32 = 0x1234_5678;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        })
        .collect()
}

async fn serve_console(mut socket: WebSocket, big: bool) {
    if big {
        let data = pattern(BIG);
        for chunk in data.chunks(7919) {
            if socket
                .send(Message::Binary(Bytes::copy_from_slice(chunk)))
                .await
                .is_err()
            {
                return;
            }
        }
        let _ = socket.send(Message::Close(None)).await;
        return;
    }
    let _ = socket
        .send(Message::Binary(Bytes::from_static(b"login: ")))
        .await;
    // Text frames are not part of the protocol and must be ignored.
    let _ = socket.send(Message::Text("IGNORED".into())).await;
    while let Some(Ok(msg)) = socket.recv().await {
        if let Message::Binary(b) = msg {
            let mut echo = b"echo:".to_vec();
            echo.extend_from_slice(&b);
            if socket.send(Message::Binary(echo.into())).await.is_err() {
                return;
            }
        }
    }
}

async fn vnc(ws: WebSocketUpgrade) -> Response {
    ws.protocols(["plain.kubevirt.io"])
        .on_upgrade(|mut socket| async move {
            let _ = socket
                .send(Message::Binary(Bytes::from_static(b"RFB 003.008\n")))
                .await;
            while let Some(Ok(msg)) = socket.recv().await {
                if let Message::Binary(b) = msg {
                    let _ = socket.send(Message::Binary(b)).await;
                }
            }
        })
}

async fn list_migrations(Path(ns): Path<String>) -> Response {
    axum::Json(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigrationList",
        "metadata": {"resourceVersion": "1"},
        "items": [
            {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
             "metadata": {"name": "done", "namespace": ns, "creationTimestamp": "2026-01-01T00:00:00Z"},
             "spec": {"vmiName": "vm1"}, "status": {"phase": "Succeeded"}},
            {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
             "metadata": {"name": "kubevirt-migrate-vm-abcde", "namespace": ns, "creationTimestamp": "2026-01-02T00:00:00Z"},
             "spec": {"vmiName": "vm1"}, "status": {"phase": "Running"}}
        ]
    }))
    .into_response()
}

async fn list_vms(Path(ns): Path<String>, headers: HeaderMap) -> Response {
    // Completion asks for metadata only, as kubectl does.
    let accept = headers
        .get("accept")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    assert!(accept.contains("as=PartialObjectMetadataList"), "{accept}");
    let item = |n: &str| {
        json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
               "metadata": {"name": n, "namespace": ns}})
    };
    axum::Json(json!({
        "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
        "metadata": {"resourceVersion": "7"},
        "items": [item("fedora"), item("fedora-2"), item("ubuntu")]
    }))
    .into_response()
}

async fn delete_migration(
    State(f): State<Fake>,
    Path((_ns, name)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    f.deleted.lock().unwrap().push(format!("{name} {v}"));
    axum::Json(json!({"kind": "Status", "apiVersion": "v1", "status": "Success"})).into_response()
}

async fn start_fake(with_subresources: bool) -> (SocketAddr, Fake) {
    let fake = Fake::default();
    let mut app = Router::new()
        .route(
            "/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachines/{name}",
            get(get_vm),
        )
        .route(
            "/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachineinstancemigrations",
            get(list_migrations),
        )
        .route(
            "/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachines",
            get(list_vms),
        )
        .route(
            "/apis/kubevirt.io/v1/namespaces/{ns}/virtualmachineinstancemigrations/{name}",
            axum::routing::delete(delete_migration),
        );
    if with_subresources {
        app = app
            .route(
                "/apis/subresources.kubevirt.io/v1/namespaces/{ns}/virtualmachines/{name}/{action}",
                put(vm_action),
            )
            .route(
                "/apis/subresources.kubevirt.io/v1/namespaces/{ns}/virtualmachineinstances/{name}/{action}",
                put(vmi_action),
            )
            .route(
                "/apis/subresources.kubevirt.io/v1/namespaces/{ns}/virtualmachineinstances/{name}/console",
                get(console),
            )
            .route(
                "/apis/subresources.kubevirt.io/v1/namespaces/{ns}/virtualmachineinstances/{name}/vnc",
                get(vnc),
            )
            .route(
                "/apis/subresources.kubevirt.io/v1/version",
                get(|| async { axum::Json(json!({"gitVersion": "v0.1.0-fake"})) }),
            );
    }
    // What kube-apiserver answers for a group no APIService serves.
    let app = app
        .fallback(|| async {
            status(
                404,
                "NotFound",
                "the server could not find the requested resource",
                None,
            )
        })
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, fake)
}

fn kubeconfig(dir: &tempfile::TempDir, server: &str) -> std::path::PathBuf {
    let path = dir.path().join("config");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: fake\ncontexts:\n- name: fake\n  context: {{cluster: fake, user: me, namespace: team}}\nclusters:\n- name: fake\n  cluster: {{server: \"{server}\"}}\nusers:\n- name: me\n  user: {{token: t0ken}}\n"
        ),
    )
    .unwrap();
    path
}

struct Out {
    code: i32,
    stdout: Vec<u8>,
    stderr: String,
}

async fn plugin(config: &std::path::Path, args: &[&str], stdin: &[u8]) -> Out {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kubectl-virt"))
        .arg("--kubeconfig")
        .arg(config)
        .args(args)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut si = child.stdin.take().unwrap();
    si.write_all(stdin).await.unwrap();
    // Keep stdin open a moment so interactive commands see their input
    // before EOF ends them.
    let keep = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        drop(si);
    });
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("plugin timed out")
        .unwrap();
    keep.abort();
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

#[tokio::test]
async fn lifecycle_requests_match_kubevirt_contract() {
    let (addr, fake) = start_fake(true).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = kubeconfig(&dir, &format!("http://{addr}"));

    let o = plugin(&cfg, &["start", "vm1", "--paused"], b"").await;
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "VM vm1 was scheduled to start\n"
    );
    let o = plugin(
        &cfg,
        &["stop", "vm1", "--force", "--grace-period=0", "-n", "other"],
        b"",
    )
    .await;
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = plugin(&cfg, &["restart", "vm1", "--dry-run"], b"").await;
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = plugin(
        &cfg,
        &["migrate", "vm1", "--added-node-selector", "zone=b"],
        b"",
    )
    .await;
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = plugin(&cfg, &["pause", "vm", "vm1"], b"").await;
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = plugin(&cfg, &["unpause", "vmi", "vm1", "--dry-run"], b"").await;
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = plugin(&cfg, &["soft-reboot", "vm1"], b"").await;
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = plugin(&cfg, &["reset", "vm1"], b"").await;
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "VMI vm1 was scheduled to reset\n"
    );

    let calls = fake.calls.lock().unwrap().clone();
    let base = "PUT /apis/subresources.kubevirt.io/v1/namespaces";
    assert_eq!(
        calls,
        vec![
            (
                format!("{base}/team/virtualmachines/vm1/start"),
                json!({"paused": true})
            ),
            (
                format!("{base}/other/virtualmachines/vm1/stop"),
                json!({"gracePeriod": 0})
            ),
            (
                format!("{base}/team/virtualmachines/vm1/restart"),
                json!({"dryRun": ["All"]})
            ),
            (
                format!("{base}/team/virtualmachines/vm1/migrate"),
                json!({"addedNodeSelector": {"zone": "b"}})
            ),
            (
                format!("{base}/team/virtualmachineinstances/vm1/pause"),
                json!({})
            ),
            (
                format!("{base}/team/virtualmachineinstances/vm1/unpause"),
                json!({"dryRun": ["All"]})
            ),
            (
                format!("{base}/team/virtualmachineinstances/vm1/softreboot"),
                json!({})
            ),
            (
                format!("{base}/team/virtualmachineinstances/vm1/reset"),
                json!({})
            ),
        ]
    );
}

#[tokio::test]
async fn errors_are_actionable_and_exit_1() {
    let (addr, _fake) = start_fake(true).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = kubeconfig(&dir, &format!("http://{addr}"));

    let o = plugin(&cfg, &["start", "missing"], b"").await;
    assert_eq!(o.code, 1);
    assert_eq!(
        o.stderr,
        "error: VM \"missing\" not found in namespace \"team\"\n"
    );

    let o = plugin(&cfg, &["stop", "locked"], b"").await;
    assert_eq!(o.code, 1);
    assert!(
        o.stderr.starts_with("error: permission denied: you may not update \"virtualmachines/stop\" in API group \"subresources.kubevirt.io\" in namespace \"team\""),
        "{}",
        o.stderr
    );

    let o = plugin(&cfg, &["start", "running"], b"").await;
    assert_eq!(o.code, 1);
    assert_eq!(
        o.stderr,
        "error: cannot start VM \"running\" in namespace \"team\": VM is already running\n"
    );

    let o = plugin(&cfg, &["pause", "vm", "stopped"], b"").await;
    assert_eq!(o.code, 1);
    assert!(
        o.stderr
            .contains("VM \"stopped\" in namespace \"team\" is not running"),
        "{}",
        o.stderr
    );

    let o = plugin(&cfg, &["console", "stopped"], b"").await;
    assert_eq!(o.code, 1);
    assert!(
        o.stderr.contains("kubectl virt start stopped -n team"),
        "{}",
        o.stderr
    );

    let o = plugin(&cfg, &["pause", "pod", "vm1"], b"").await;
    assert_eq!(o.code, 1, "usage errors exit 1 like kubectl");
    let o = plugin(&cfg, &["help"], b"").await;
    assert_eq!(o.code, 0);

    let o = plugin(&cfg, &["stop", "vm1", "--force"], b"").await;
    assert_eq!(o.code, 1);
    assert!(
        o.stderr.contains("--force needs --grace-period"),
        "{}",
        o.stderr
    );

    // Nothing listens on port 1.
    let bad_dir = tempfile::tempdir().unwrap();
    let bad = kubeconfig(&bad_dir, "http://127.0.0.1:1");
    let o = plugin(&bad, &["start", "vm1"], b"").await;
    assert_eq!(o.code, 1);
    assert!(
        o.stderr
            .starts_with("error: cannot reach the API server at http://127.0.0.1:1/"),
        "{}",
        o.stderr
    );
}

#[tokio::test]
async fn unregistered_api_is_reported() {
    let (addr, _fake) = start_fake(false).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = kubeconfig(&dir, &format!("http://{addr}"));
    let o = plugin(&cfg, &["start", "vm1"], b"").await;
    assert_eq!(o.code, 1);
    assert!(
        o.stderr.starts_with("error: the kubevirt.io API is not registered or not available: check `kubectl get apiservice v1.kubevirt.io"),
        "{}",
        o.stderr
    );
    // version tolerates the missing server version.
    let o = plugin(&cfg, &["version"], b"").await;
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("Client Version: "));
    assert!(
        o.stderr.contains("Server Version: unavailable"),
        "{}",
        o.stderr
    );
}

#[tokio::test]
async fn version_and_migrate_cancel() {
    let (addr, fake) = start_fake(true).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = kubeconfig(&dir, &format!("http://{addr}"));
    let o = plugin(&cfg, &["version"], b"").await;
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        String::from_utf8_lossy(&o.stdout)
            .contains("Server Version: {\"gitVersion\":\"v0.1.0-fake\"}")
    );

    let o = plugin(&cfg, &["migrate-cancel", "vm1"], b"").await;
    assert_eq!(o.code, 0, "{}", o.stderr);
    let deleted = fake.deleted.lock().unwrap().clone();
    assert_eq!(deleted.len(), 1);
    assert!(
        deleted[0].starts_with("kubevirt-migrate-vm-abcde"),
        "{deleted:?}"
    );

    let o = plugin(&cfg, &["migrate-cancel", "vm9"], b"").await;
    assert_eq!(o.code, 1);
    assert!(
        o.stderr
            .contains("no active migration for VMI \"vm9\" in namespace \"team\""),
        "{}",
        o.stderr
    );
}

/// Reads from `r` into `buf` until `needle` shows up.
async fn read_until(r: &mut (impl AsyncReadExt + Unpin), buf: &mut Vec<u8>, needle: &[u8]) {
    let mut b = [0u8; 256];
    tokio::time::timeout(Duration::from_secs(30), async {
        while !buf.windows(needle.len()).any(|w| w == needle) {
            let n = r.read(&mut b).await.unwrap();
            assert!(
                n > 0,
                "EOF before {:?}: {:?}",
                String::from_utf8_lossy(needle),
                String::from_utf8_lossy(buf)
            );
            buf.extend_from_slice(&b[..n]);
        }
    })
    .await
    .expect("timed out waiting for output");
}

#[tokio::test]
async fn console_waits_for_running_echoes_and_escapes() {
    let (addr, fake) = start_fake(true).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = kubeconfig(&dir, &format!("http://{addr}"));
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kubectl-virt"))
        .arg("--kubeconfig")
        .arg(&cfg)
        .args(["console", "booting", "--timeout", "1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut out = Vec::new();
    read_until(&mut stdout, &mut out, b"login: ").await;
    stdin.write_all(b"hi").await.unwrap();
    read_until(&mut stdout, &mut out, b"echo:hi").await;
    // Everything after the escape byte stays local.
    stdin.write_all(b"\x1dnot-sent").await.unwrap();
    let o = tokio::time::timeout(Duration::from_secs(10), child.wait_with_output())
        .await
        .expect("console did not exit on ^]")
        .unwrap();
    assert!(o.status.success());
    out.extend_from_slice(&o.stdout);
    let out = String::from_utf8_lossy(&out);
    assert_eq!(
        out, "login: echo:hi",
        "text frames ignored, nothing after ^] sent"
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(*fake.console_attempts.lock().unwrap() >= 3);
    assert!(stderr.contains("not running yet"), "{stderr}");
    assert!(
        stderr.contains("Successfully connected to booting console. The escape sequence is ^]"),
        "{stderr}"
    );
}

#[tokio::test]
async fn console_output_is_byte_exact() {
    let (addr, _fake) = start_fake(true).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = kubeconfig(&dir, &format!("http://{addr}"));
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kubectl-virt"))
        .arg("--kubeconfig")
        .arg(&cfg)
        .args(["console", "big"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Hold stdin open: EOF would end the session before all output arrived.
    let _stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut got = Vec::with_capacity(BIG);
    tokio::time::timeout(Duration::from_secs(60), stdout.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    let status = child.wait().await.unwrap();
    assert!(status.success());
    assert_eq!(got.len(), BIG);
    assert!(got == pattern(BIG), "console output differs");
}

#[tokio::test]
async fn vnc_proxy_only_bridges_rfb() {
    let (addr, _fake) = start_fake(true).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = kubeconfig(&dir, &format!("http://{addr}"));
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kubectl-virt"))
        .arg("--kubeconfig")
        .arg(&cfg)
        .args(["vnc", "vm1", "--proxy-only"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while !line.ends_with(b"\n") {
        stdout.read_exact(&mut b).await.unwrap();
        line.push(b[0]);
    }
    let v: Value = serde_json::from_slice(&line).unwrap();
    let port = u16::try_from(v["port"].as_u64().unwrap()).unwrap();
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let mut hello = [0u8; 12];
    tcp.read_exact(&mut hello).await.unwrap();
    assert_eq!(&hello, b"RFB 003.008\n");
    tcp.write_all(b"RFB 003.008\n").await.unwrap();
    let mut echo = [0u8; 12];
    tcp.read_exact(&mut echo).await.unwrap();
    assert_eq!(&echo, b"RFB 003.008\n");
    child.kill().await.unwrap();
}

/// Manual-testing aid: `cargo test -p kubectl-virt --test fake_server serve_fake -- --ignored --nocapture`
/// serves the fake for two minutes and prints a kubeconfig path.
#[tokio::test]
#[ignore = "manual: keeps a fake API server running"]
async fn serve_fake() {
    let (addr, _fake) = start_fake(true).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = kubeconfig(&dir, &format!("http://{addr}"));
    println!("KUBECONFIG={}", cfg.display());
    tokio::time::sleep(Duration::from_secs(120)).await;
}

#[tokio::test]
async fn kubeconfig_env_is_honoured() {
    let (addr, fake) = start_fake(true).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = kubeconfig(&dir, &format!("http://{addr}"));
    // A list like kubectl's: the missing first entry is skipped.
    let list = format!("{}:{}", dir.path().join("absent").display(), cfg.display());
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kubectl-virt"))
        .args(["start", "vm1"])
        .env("KUBECONFIG", list)
        .env("HOME", dir.path())
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let calls = fake.calls.lock().unwrap().clone();
    assert_eq!(
        calls[0].0,
        "PUT /apis/subresources.kubevirt.io/v1/namespaces/team/virtualmachines/vm1/start"
    );
}

#[tokio::test]
async fn client_version_needs_no_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kubectl-virt"))
        .args(["version", "--client"])
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("HOME", dir.path())
        .output()
        .await
        .unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with("Client Version: {\"gitVersion\":\"v0.1.0\""),
        "{stdout}"
    );
}

#[tokio::test]
async fn plugin_completion_protocol() {
    let (addr, _fake) = start_fake(true).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = kubeconfig(&dir, &format!("http://{addr}"));
    let run = |args: Vec<String>| async move {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_kubectl-virt"))
            .arg("__complete")
            .args(args)
            .output()
            .await
            .unwrap()
    };
    let cfg_s = cfg.display().to_string();
    let o = run(vec![
        "--kubeconfig".into(),
        cfg_s.clone(),
        "start".into(),
        "fed".into(),
    ])
    .await;
    assert!(o.status.success());
    assert_eq!(String::from_utf8_lossy(&o.stdout), "fedora\nfedora-2\n:4\n");
    let o = run(vec!["sto".into()]).await;
    assert_eq!(String::from_utf8_lossy(&o.stdout), "stop\n:4\n");

    // As kubectl runs it: a symlink named kubectl_complete-virt, no marker.
    let link = dir.path().join("kubectl_complete-virt");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_kubectl-virt"), &link).unwrap();
    let o = tokio::process::Command::new(&link)
        .args(["--kubeconfig", &cfg_s, "migrate", ""])
        .output()
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "fedora\nfedora-2\nubuntu\n:4\n"
    );
    // No cluster: still a well-formed answer, no error text.
    let o = run(vec![
        "--kubeconfig".into(),
        "/nonexistent".into(),
        "start".into(),
        "".into(),
    ])
    .await;
    assert!(o.status.success());
    assert_eq!(String::from_utf8_lossy(&o.stdout), ":4\n");
    assert!(o.stderr.is_empty());
}
