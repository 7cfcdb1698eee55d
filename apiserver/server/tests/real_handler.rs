//! virt-apiserver → the real virt-handler binary (node/handler, cluster mode) over mTLS,
//! with real etcd + virt-apiserver. The handler learns the VMI by watching
//! virt-apiserver; the launcher side is a stand-in on the unix sockets of
//! docs/cluster-flow.md §1 (command protocol, console and VNC echo), so no QEMU is
//! needed: node/launcher/tests/cluster.rs covers the handler with a real guest.
//!
//! The virt-handler binary: `$VIRT_HANDLER_BIN`, else `target/<profile>/virt-handler`
//! (`cargo build -p virt-handler`; `cargo test --workspace` builds it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;
use tokio_tungstenite::tungstenite::Message;
use virt_apiserver::wsclient::WsConnectError;
use virt_devenv::{DevEnv, HandlerCerts, Options, free_port};
use virt_domain::protocol::{DomainState, LauncherStatus, Request, Response, VmiAction};

const NODE: &str = "node-a";
/// virt-handler's close reason for a session another writer took over.
const TAKEN_OVER: &str = "took over";

fn handler_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("VIRT_HANDLER_BIN") {
        return p.into();
    }
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .and_then(|d| d.parent())
        .unwrap()
        .join("virt-handler");
    assert!(
        bin.exists(),
        "{} missing: run `cargo build -p virt-handler` first",
        bin.display()
    );
    bin
}

/// Kills the handler process when the test ends, however it ends.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
const SUB: &str = "/apis/subresources.kubevirt.io/v1/namespaces/default";

/// The launcher's command socket: answers like a launcher whose domain runs, records
/// requests; `watch` subscriptions stay open without events.
fn fake_launcher(path: &Path, seen: Arc<Mutex<Vec<String>>>) {
    let listener = UnixListener::bind(path).unwrap();
    let state = Arc::new(Mutex::new(DomainState::Running));
    tokio::spawn(async move {
        while let Ok((sock, _)) = listener.accept().await {
            let (seen, state) = (seen.clone(), state.clone());
            tokio::spawn(async move {
                let (r, mut w) = sock.into_split();
                let mut lines = BufReader::new(r).lines();
                let Ok(Some(line)) = lines.next_line().await else {
                    return;
                };
                let req: Request = serde_json::from_str(&line).unwrap();
                let reply = {
                    let mut st = state.lock().unwrap();
                    match req {
                        Request::GetStatus => Response::Status(LauncherStatus {
                            domain: "default_vm1".into(),
                            state: *st,
                            launcher_version: "test".into(),
                            ..Default::default()
                        }),
                        Request::Watch => {
                            drop(st);
                            // Hold the subscription open until the handler drops it.
                            let _ = lines.next_line().await;
                            return;
                        }
                        Request::Action(VmiAction::Pause) => {
                            *st = DomainState::Paused;
                            Response::Ok
                        }
                        Request::Action(VmiAction::Unpause) => {
                            *st = DomainState::Running;
                            Response::Ok
                        }
                        Request::Ping => Response::Pong { version: 1 },
                        Request::Guest(q) => guest_answer(q),
                        _ => Response::Ok,
                    }
                };
                match &req {
                    Request::GetStatus => {}
                    // The action by its name alone, as when each was a request of its own.
                    Request::Action(a) => seen.lock().unwrap().push(format!("{a:?}")),
                    other => seen.lock().unwrap().push(format!("{other:?}")),
                }
                let mut out = serde_json::to_vec(&reply).unwrap();
                out.push(b'\n');
                let _ = w.write_all(&out).await;
            });
        }
    });
}

/// What a launcher with a guest agent answers to the guest-agent reads.
fn guest_answer(q: virt_domain::protocol::GuestQuery) -> Response {
    use kubevirt_api::guestagent::{
        FileSystem, FileSystemList, GuestAgentInfo, GuestOsInfo, GuestOsUser, GuestOsUserList,
    };
    use virt_domain::protocol::GuestQuery;
    let user = GuestOsUser {
        user_name: "tester".into(),
        login_time: 1.5,
        ..Default::default()
    };
    match q {
        GuestQuery::GuestOsInfo => Response::GuestOsInfo {
            info: Box::new(GuestAgentInfo {
                kind: "VirtualMachineInstanceGuestAgentInfo".into(),
                api_version: "kubevirt.io/v1".into(),
                guest_agent_version: "7.2.0".into(),
                hostname: "vm1".into(),
                os: GuestOsInfo {
                    id: "debian".into(),
                    version_id: "12".into(),
                    ..Default::default()
                },
                user_list: vec![user],
                ..Default::default()
            }),
        },
        GuestQuery::UserList => Response::UserList {
            list: GuestOsUserList::of(vec![user]),
        },
        GuestQuery::FilesystemList => Response::FilesystemList {
            list: FileSystemList::of(vec![FileSystem {
                disk_name: "vda1".into(),
                mount_point: "/".into(),
                file_system_type: "ext4".into(),
                used_bytes: 1,
                total_bytes: 2,
                disk: vec![],
            }]),
        },
    }
}

async fn get(c: &reqwest::Client, env: &DevEnv, sub: &str) -> (u16, Value) {
    let r = c
        .get(format!(
            "{}{SUB}/virtualmachineinstances/vm1/{sub}",
            env.server_url
        ))
        .send()
        .await
        .unwrap();
    let code = r.status().as_u16();
    (code, r.json().await.unwrap_or(Value::Null))
}

/// QEMU's console or VNC socket: echoes what it reads.
fn echo_socket(path: &Path) {
    let listener = UnixListener::bind(path).unwrap();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 16384];
                loop {
                    match sock.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if sock.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
}

type Ws = virt_apiserver::wsclient::WsClient;

async fn open(env: &DevEnv, name: &str, sub: &str) -> Result<Ws, (u16, Value)> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(&env.server_ca).unwrap())
        .unwrap();
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&env.admin.cert)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(&env.admin.key).unwrap();
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_client_auth_cert(chain, key)
    .unwrap();
    let port: u16 = env.server_url.rsplit(':').next().unwrap().parse().unwrap();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .unwrap();
    let mut headers = http::HeaderMap::new();
    headers.insert(
        "sec-websocket-protocol",
        "plain.kubevirt.io".parse().unwrap(),
    );
    let path = format!("{SUB}/virtualmachineinstances/{name}/{sub}");
    match virt_apiserver::wsclient::connect(tls, &format!("127.0.0.1:{port}"), &path, headers).await
    {
        Ok((ws, _)) => Ok(ws),
        Err(WsConnectError::Refused { status, body, .. }) => Err((
            status.as_u16(),
            serde_json::from_slice(&body).unwrap_or(Value::Null),
        )),
        Err(e) => panic!("websocket: {e}"),
    }
}

/// Sends `data` in 10 KiB messages while collecting the echo.
async fn round_trip(ws: Ws, data: &[u8]) -> (Ws, Vec<u8>) {
    let (mut tx, mut rx) = ws.split();
    let chunks: Vec<Vec<u8>> = data.chunks(10240).map(<[u8]>::to_vec).collect();
    let want = data.len();
    let writer = async move {
        for c in chunks {
            tx.send(Message::Binary(c.into())).await.unwrap();
        }
        tx
    };
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
    .expect("echo within 60 s");
    (tx.reunite(rx).unwrap(), got)
}

async fn put(c: &reqwest::Client, env: &DevEnv, action: &str) -> (u16, Value) {
    let r = c
        .put(format!(
            "{}{SUB}/virtualmachineinstances/vm1/{action}",
            env.server_url
        ))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    let code = r.status().as_u16();
    (code, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn apiserver_drives_the_real_virt_handler() {
    let dir = tempfile::tempdir().unwrap();
    let certs = HandlerCerts::generate(dir.path(), NODE).unwrap();
    let port = free_port().unwrap();
    let env = tokio::task::spawn_blocking(move || {
        DevEnv::start(Options {
            apiserver_bin: env!("CARGO_BIN_EXE_virt-apiserver").into(),
            extra_args: certs
                .apiserver_args(&[(NODE, format!("127.0.0.1:{port}"))])
                .into_iter()
                .chain(["--max-streams-per-user=4".to_string()])
                .collect(),
            ..Default::default()
        })
        .map(|e| (e, certs))
    })
    .await
    .unwrap()
    .expect("start etcd and virt-apiserver");
    let (env, certs) = env;

    // virt-handler of node-a, watching VMIs on virt-apiserver.
    // Short root: unix socket paths must stay below 108 bytes.
    let root = tempfile::Builder::new().prefix("vh").tempdir().unwrap();
    let log = std::fs::File::create(dir.path().join("handler.log")).unwrap();
    let mut handler = Child(
        std::process::Command::new(handler_bin())
            .args(["--node-name", NODE, "--kubeconfig"])
            .arg(&env.kubeconfig)
            .arg("--run-root")
            .arg(root.path())
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--tls-cert")
            .arg(&certs.server.cert)
            .arg("--tls-key")
            .arg(&certs.server.key)
            .arg("--client-ca")
            .arg(&certs.ca)
            // The handler closes a session whose ping goes unanswered until the next:
            // pinging every second shows virt-apiserver answers on the client's behalf.
            .args(["--ws-ping-seconds", "1"])
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let handler_log =
        || std::fs::read_to_string(dir.path().join("handler.log")).unwrap_or_default();

    // A VMI scheduled to node-a and running (as virt-controller and the handler would
    // have it), with its launcher's sockets.
    let c = common::admin(&env);
    let url = format!(
        "{}/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances",
        env.server_url
    );
    let vmi = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "vm1"},
        "spec": {"domain": {"resources": {"requests": {"memory": "64Mi"}}}}});
    let created: Value = c
        .post(&url)
        .json(&vmi)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let uid = created["metadata"]["uid"].as_str().unwrap().to_string();
    let sockets: PathBuf = root.path().join("sockets").join(&uid);
    std::fs::create_dir_all(&sockets).unwrap();
    let launcher_seen = Arc::new(Mutex::new(Vec::new()));
    fake_launcher(&sockets.join("cmd.sock"), launcher_seen.clone());
    echo_socket(&sockets.join("console.sock"));
    echo_socket(&sockets.join("vnc.sock"));
    let r = c
        .patch(format!("{url}/vm1/status"))
        .header("Content-Type", "application/merge-patch+json")
        .json(&json!({"status": {"phase": "Running", "nodeName": NODE}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // The handler knows the VMI once its watch delivered it: until then it answers 404.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (code, s) = put(&c, &env, "softreboot").await;
        if code == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline && (code == 404 || code == 503),
            "{code} {s}; handler log:\n{}",
            handler_log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // pause goes through virt-apiserver and the handler to the launcher; a second pause
    // is refused with 409: by the handler when the VMI status does not show the pause
    // yet (its Status reaches the client unchanged), or by virt-apiserver's own
    // pre-check when the handler has already written the Paused condition. Which one
    // answers is a race; both name the reason.
    assert_eq!(put(&c, &env, "pause").await.0, 200);
    let (code, s) = put(&c, &env, "pause").await;
    let message = s["message"].as_str().unwrap_or_default();
    assert_eq!(code, 409, "{s}");
    assert!(message.ends_with("VMI is already paused"), "{s}");
    assert_eq!(
        launcher_seen.lock().unwrap().as_slice(),
        ["SoftReboot", "Pause"]
    );
    // freeze, a catalogued action nothing here names: its options are checked by
    // virt-apiserver, passed on, and decoded again by the handler for the launcher.
    let (code, s) = put(&c, &env, "freeze").await;
    assert_eq!(code, 400, "{s}");
    assert_eq!(
        s["message"],
        "Unfreeze timeout in freeze request is not set"
    );
    let r = c
        .put(format!(
            "{}{SUB}/virtualmachineinstances/vm1/freeze",
            env.server_url
        ))
        .json(&json!({"unfreezeTimeout": "5m0s"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(put(&c, &env, "unfreeze").await.0, 200);
    assert_eq!(
        launcher_seen.lock().unwrap()[2..],
        [
            "Freeze { unfreeze_timeout_seconds: 300 }".to_string(),
            "Unfreeze".to_string()
        ]
    );

    // The guest-agent reads: without an agent, KubeVirt's 409 from virt-apiserver (the
    // handler is not asked); with the AgentConnected condition virt-handler writes when the
    // launcher reports an agent, the launcher's answer in KubeVirt's shape, through both.
    for sub in ["guestosinfo", "userlist", "filesystemlist"] {
        let (code, s) = get(&c, &env, sub).await;
        assert_eq!(code, 409, "{sub}: {s}");
        assert_eq!(s["reason"], "Conflict");
        assert!(
            s["message"]
                .as_str()
                .unwrap_or_default()
                .ends_with("VMI does not have guest agent connected"),
            "{s}"
        );
    }
    // The condition is written here as virt-handler would; the real handler in this test
    // also syncs the VMI's status (its launcher reports no agent) and may write over it
    // between the patch and the read, so both are retried for a while.
    let mut agent_read = Vec::new();
    for sub in ["guestosinfo", "userlist", "filesystemlist"] {
        let deadline = Instant::now() + Duration::from_secs(30);
        let answer = loop {
            let current: Value = c
                .get(format!("{url}/vm1"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let mut conditions = current["status"]["conditions"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            conditions.retain(|c| c["type"] != "AgentConnected");
            conditions.push(json!({"type": "AgentConnected", "status": "True"}));
            let r = c
                .patch(format!("{url}/vm1/status"))
                .header("Content-Type", "application/merge-patch+json")
                .json(&json!({"status": {"conditions": conditions}}))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let (code, answer) = get(&c, &env, sub).await;
            if code == 200 {
                break answer;
            }
            assert!(
                code == 409 && Instant::now() < deadline,
                "{sub}: {code}: {answer}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        agent_read.push(answer);
    }
    let [info, users, fs]: [Value; 3] = agent_read.try_into().unwrap();
    assert_eq!(info["kind"], "VirtualMachineInstanceGuestAgentInfo");
    assert_eq!(info["guestAgentVersion"], "7.2.0");
    assert_eq!(info["os"]["versionId"], "12");
    assert_eq!(info["userList"][0]["userName"], "tester");
    assert_eq!(users["kind"], "VirtualMachineInstanceGuestOSUserList");
    assert_eq!(users["items"][0]["loginTime"], 1.5);
    assert_eq!(fs["items"][0]["mountPoint"], "/");
    assert_eq!(fs["items"][0]["fileSystemType"], "ext4");
    // A read is a GET: PUT is not allowed.
    assert_eq!(put(&c, &env, "guestosinfo").await.0, 405);

    // Console: 1 MiB byte-exact through virt-apiserver, the handler and the socket.
    let ws = open(&env, "vm1", "console").await.unwrap();
    let data: Vec<u8> = (0..1usize << 20)
        .map(|i| (i * 13 + i / 509) as u8)
        .collect();
    let started = Instant::now();
    let (first, got) = round_trip(ws, &data).await;
    eprintln!(
        "1 MiB console echo through virt-apiserver and virt-handler: {:?}",
        started.elapsed()
    );
    assert!(got == data, "console bytes differ");
    // Idle through several of the handler's ping periods: the session stays up.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (mut first, got) = round_trip(first, b"after idle\r\n").await;
    assert_eq!(got, b"after idle\r\n");

    // A second console session takes over; the first is closed with the handler's reason.
    let second = open(&env, "vm1", "console").await.unwrap();
    let close = loop {
        match tokio::time::timeout(Duration::from_secs(10), first.next())
            .await
            .expect("first session closed within 10 s")
        {
            Some(Ok(Message::Close(f))) => break f,
            Some(Ok(_)) => {}
            other => panic!("expected a close, got {other:?}"),
        }
    };
    let close = close.expect("a close frame with a reason");
    assert!(close.reason.as_str().contains(TAKEN_OVER), "{close:?}");
    let (mut second, got) = round_trip(second, b"still mine\r\n").await;
    assert_eq!(got, b"still mine\r\n");

    // VNC bytes too.
    let vnc = open(&env, "vm1", "vnc").await.unwrap();
    let (_vnc, got) = round_trip(vnc, b"RFB 003.008\n").await;
    assert_eq!(got, b"RFB 003.008\n");

    // Streams per user are bounded (N5 of the security review at bd37f96): with the
    // console and VNC sessions open, read-only consoles are admitted up to the limit (4),
    // then refused with 429 naming it; one closed makes room for another.
    let mut observers = Vec::new();
    let refused = loop {
        match open(&env, "vm1", "console?readOnly=true").await {
            Ok(ws) => observers.push(ws),
            Err(e) => break e,
        }
        assert!(observers.len() <= 3, "more streams than the limit admitted");
    };
    assert_eq!(refused.0, 429, "{refused:?}");
    assert!(
        refused.1["message"]
            .as_str()
            .is_some_and(|m| m.contains("Too many streams")),
        "{refused:?}"
    );
    assert!(!observers.is_empty(), "no read-only console was admitted");
    drop(observers.pop());
    let deadline = Instant::now() + Duration::from_secs(10);
    let again = loop {
        match open(&env, "vm1", "console?readOnly=true").await {
            Ok(ws) => break ws,
            Err((429, _)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("a stream after one closed: {e:?}"),
        }
    };
    drop(again);
    drop(observers);

    // A VMI the handler does not have: its 404 passes through.
    let r = c
        .post(&url)
        .json(
            &json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "elsewhere"},
            "spec": {"domain": {"resources": {"requests": {"memory": "64Mi"}}}}}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    // Running on node-a as far as virt-apiserver knows, before the handler saw it.
    let _ = c
        .patch(format!("{url}/elsewhere/status"))
        .header("Content-Type", "application/merge-patch+json")
        .json(&json!({"status": {"phase": "Running", "nodeName": NODE}}))
        .send()
        .await
        .unwrap();
    let (code, s) = open(&env, "elsewhere", "console").await.err().unwrap();
    assert!(
        code == 404 || code == 409,
        "handler's own answer expected: {code} {s}"
    );
    assert!(s["message"].as_str().is_some(), "{s}");

    // The handler dies (SIGKILL): the open console is closed with 1011 and a reason
    // naming virt-handler, not left hanging.
    handler.0.kill().unwrap();
    handler.0.wait().unwrap();
    let close = loop {
        match tokio::time::timeout(Duration::from_secs(10), second.next())
            .await
            .expect("console closed within 10 s of the handler's death")
        {
            Some(Ok(Message::Close(f))) => break f,
            Some(Ok(_)) => {}
            other => panic!("expected a close, got {other:?}"),
        }
    };
    let close = close.expect("a close frame with a reason");
    assert_eq!(u16::from(close.code), 1011);
    assert!(close.reason.as_str().contains("virt-handler"), "{close:?}");
}
