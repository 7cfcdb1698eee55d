//! The real `virt-handler` binary in cluster mode, with the flags the DaemonSet uses,
//! against etcd + virt-apiserver (DevEnv) and a scripted launcher socket (the protocol
//! only; `node/launcher/tests/cluster.rs` runs a real launcher and QEMU).
//!
//! virt-apiserver binary: `$VIRT_APISERVER_BIN`, else `target/<profile>/virt-apiserver`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kubevirt_api::{VirtualMachineInstance, VirtualMachineInstancePhase as Phase};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixListener;
use virt_devenv::{DevEnv, Options, free_port};
use virt_domain::protocol::{DomainEvent, DomainState, LauncherStatus, Request, Response};

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Answers the launcher protocol like a launcher whose domain runs under TCG.
async fn fake_launcher(sock: PathBuf) -> tokio::task::JoinHandle<()> {
    let _ = std::fs::remove_file(&sock);
    let listener = UnixListener::bind(&sock).unwrap();
    tokio::spawn(async move {
        // Connections live in this set: aborting the task drops them all, like a kill -9.
        let mut conns = tokio::task::JoinSet::new();
        loop {
            let Ok((s, _)) = listener.accept().await else {
                return;
            };
            // Finished connections are reaped: a JoinSet keeps them until joined.
            while conns.try_join_next().is_some() {}
            conns.spawn(async move {
                let (r, mut w) = s.into_split();
                let mut lines = BufReader::new(r).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    let reply = match serde_json::from_str::<Request>(&line).unwrap() {
                        Request::GetStatus => Response::Status(LauncherStatus {
                            domain: "default_bin".into(),
                            state: DomainState::Running,
                            accel: virt_domain::Accel::Tcg,
                            launcher_version: "fake".into(),
                            pod_ip: Some("10.0.0.9".into()),
                            ..LauncherStatus::default()
                        }),
                        Request::Watch => Response::Event(DomainEvent::Started),
                        _ => Response::Ok,
                    };
                    let mut b = serde_json::to_vec(&reply).unwrap();
                    b.push(b'\n');
                    if w.write_all(&b).await.is_err() {
                        return;
                    }
                }
            });
        }
    })
}

/// Writes a CA (`ca.crt`), the handler's pair (`tls.crt`, `tls.key`) and a client pair
/// (`<client>.crt`, `.key`) into `dir`.
/// A console socket that greets and echoes, standing in for QEMU's.
fn fake_console(sock: PathBuf) -> tokio::task::JoinHandle<()> {
    let _ = std::fs::remove_file(&sock);
    let listener = UnixListener::bind(&sock).unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let _ = s.write_all(b"hello\r\n").await;
            let (mut r, mut w) = s.split();
            let _ = tokio::io::copy(&mut r, &mut w).await;
        }
    })
}

/// A console websocket over mTLS with client pair `<client>` from `dir`.
async fn console_ws(
    port: u16,
    dir: &Path,
    client: &str,
) -> tokio_tungstenite::WebSocketStream<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    use rustls_pki_types::pem::PemObject;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_file_iter(dir.join("ca.crt")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let certs = rustls_pki_types::CertificateDer::pem_file_iter(dir.join(format!("{client}.crt")))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key =
        rustls_pki_types::PrivateKeyDer::from_pem_file(dir.join(format!("{client}.key"))).unwrap();
    let cfg = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)
        .unwrap();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg))
        .connect("virt-handler".try_into().unwrap(), tcp)
        .await
        .unwrap();
    let req = format!(
        "wss://virt-handler:{port}/v1/namespaces/default/virtualmachineinstances/bin/console"
    )
    .into_client_request()
    .unwrap();
    let (ws, resp) = tokio_tungstenite::client_async(req, tls).await.unwrap();
    // No subprotocol offered: none echoed, the upgrade still succeeds (KubeVirt's back-compat).
    assert!(resp.headers().get("Sec-WebSocket-Protocol").is_none());
    ws
}

fn write_certs(dir: &Path, client: &str) -> (PathBuf, PathBuf, PathBuf) {
    let validity = time::Duration::days(1);
    let ca = virt_certs::Ca::generate("ca", validity).unwrap();
    let (ca_file, _) = ca.write_pair(dir, "ca").unwrap();
    let (cert, key) = ca
        .issue_server("virt-handler", &["virt-handler"], validity)
        .unwrap()
        .write_pair(dir, "tls")
        .unwrap();
    ca.issue_client("virt-apiserver", &[] as &[&str], validity)
        .unwrap()
        .write_pair(dir, client)
        .unwrap();
    (cert, key, ca_file)
}

/// GET /healthz over mTLS with the client pair `<client>` from `dir`, trusting `ca`.
async fn healthz(port: u16, ca: &Path, dir: &Path, client: &str) -> Result<u16, reqwest::Error> {
    let mut pem = std::fs::read(dir.join(format!("{client}.crt"))).unwrap();
    pem.extend(std::fs::read(dir.join(format!("{client}.key"))).unwrap());
    let c = reqwest::Client::builder()
        .use_rustls_tls()
        .add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(ca).unwrap()).unwrap())
        .identity(reqwest::Identity::from_pem(&pem).unwrap())
        .resolve("virt-handler", ([127, 0, 0, 1], port).into())
        .build()
        .unwrap();
    let r = c
        .get(format!("https://virt-handler:{port}/healthz"))
        .send()
        .await?;
    Ok(r.status().as_u16())
}

async fn wait_phase(api: &Api<VirtualMachineInstance>, name: &str, want: Phase, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let v = api.get(name).await.unwrap();
        let st = v.status.unwrap_or_default();
        if st.phase == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "VMI never {want:?}: {st:?}\nhandler log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn cluster_mode_needs_its_certificates() {
    let run = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_virt-handler"))
            .args(["--node-name", "n1", "--kubeconfig", "/nonexistent"])
            .args(extra)
            .env_remove("VIRT_HANDLER_TLS_CERT")
            .env_remove("VIRT_HANDLER_CLIENT_CA")
            .env_remove("VIRT_HANDLER_CERTIFICATE_DIR")
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = run(&[]);
    assert!(err.contains("cluster mode needs --client-ca"), "{err}");
    let err = run(&["--client-ca", "/nonexistent/ca.crt"]);
    assert!(
        err.contains("cluster mode needs --tls-cert or --certificate-dir"),
        "{err}"
    );
    let err = run(&["--certificate-dir", "/tmp/x", "--tls-cert", "/tmp/y"]);
    assert!(err.contains("cannot be used with"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_follows_a_launcher_socket_and_serves_metrics() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let api_env = tokio::task::spawn_blocking(|| {
        DevEnv::start(Options {
            apiserver_bin: virt_devenv::apiserver_bin_beside_test().expect("virt-apiserver binary"),
            ..Options::default()
        })
        .expect("start etcd and virt-apiserver")
    })
    .await
    .unwrap();
    let kc = kube::config::Kubeconfig::read_from(&api_env.kubeconfig).unwrap();
    let client = Client::try_from(
        kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap(),
    )
    .unwrap();
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client, "default");
    let vmi: VirtualMachineInstance = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "bin"},
        "spec": {"domain": {"resources": {"requests": {"memory": "64Mi"}}}}
    }))
    .unwrap();
    let vmi = vmis.create(&PostParams::default(), &vmi).await.unwrap();
    vmis.patch_status(
        "bin",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Scheduled", "nodeName": "n1"}})),
    )
    .await
    .unwrap();

    // A VMI whose launcher ended cleanly while no handler ran: only its outcome file is
    // left; the handler reports Succeeded, not "socket gone".
    let ended: VirtualMachineInstance = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "ended"},
        "spec": {"domain": {"resources": {"requests": {"memory": "64Mi"}}}}
    }))
    .unwrap();
    let ended = vmis.create(&PostParams::default(), &ended).await.unwrap();
    vmis.patch_status(
        "ended",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running", "nodeName": "n1"}})),
    )
    .await
    .unwrap();

    let tmp = tempfile::tempdir().unwrap();
    let root = tempfile::Builder::new().prefix("vhb").tempdir().unwrap();
    let sockdir = root
        .path()
        .join("sockets")
        .join(vmi.metadata.uid.as_deref().unwrap());
    std::fs::create_dir_all(&sockdir).unwrap();
    let ended_dir = root
        .path()
        .join("sockets")
        .join(ended.metadata.uid.as_deref().unwrap());
    std::fs::create_dir_all(&ended_dir).unwrap();
    std::fs::write(
        ended_dir.join(virt_domain::protocol::OUTCOME_FILE),
        br#"{"outcome":"shutDown"}"#,
    )
    .unwrap();
    let launcher = fake_launcher(sockdir.join("cmd.sock")).await;
    let _console = fake_console(sockdir.join("console.sock"));
    let (cert, key, ca) = write_certs(tmp.path(), "client1");
    let (port, mport) = (free_port().unwrap(), free_port().unwrap());
    let log = tmp.path().join("handler.log");
    let _handler = Kill(
        Command::new(env!("CARGO_BIN_EXE_virt-handler"))
            .env("NODE_NAME", "n1")
            .env("KUBECONFIG", &api_env.kubeconfig)
            .args(["--run-root"])
            .arg(root.path())
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--metrics-addr", &format!("127.0.0.1:{mport}")])
            .args(["--ws-ping-seconds", "1"])
            .arg("--tls-cert")
            .arg(&cert)
            .arg("--tls-key")
            .arg(&key)
            .arg("--client-ca")
            .arg(&ca)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );

    wait_phase(&vmis, "bin", Phase::Running, &log).await;
    wait_phase(&vmis, "ended", Phase::Succeeded, &log).await;
    // Socket directories are the launchers' (a pod's emptyDir in a cluster, removed by
    // kubelet with the pod): the handler leaves them alone.
    assert!(sockdir.exists());
    let st = vmis.get("bin").await.unwrap().status.unwrap();
    assert_eq!(
        st.condition("SoftwareEmulation").map(|c| c.status),
        Some(kubevirt_api::ConditionStatus::True)
    );
    assert_eq!(
        st.interfaces.unwrap()[0].ip_address.as_deref(),
        Some("10.0.0.9")
    );
    // The launcher's own version; the image it runs from is virt-controller's to write.
    assert_eq!(
        st.runtime_versions.and_then(|v| v.launcher).as_deref(),
        Some("fake")
    );
    assert_eq!(st.launcher_container_image_version, None);

    // mTLS with the first CA; then the Secret rotates to a new CA: no restart needed,
    // the old client is refused, the new one served.
    assert_eq!(
        healthz(port, &ca, tmp.path(), "client1").await.unwrap(),
        200
    );
    write_certs(tmp.path(), "client2");
    // Trusting the new server certificate, presenting the old client certificate.
    assert!(healthz(port, &ca, tmp.path(), "client1").await.is_err());
    assert_eq!(
        healthz(port, &ca, tmp.path(), "client2").await.unwrap(),
        200
    );
    // Another node's handler certificate, from the same CA: the TLS handshake passes, yet
    // only virt-apiserver's name is answered.
    {
        let read = |f: &str| std::fs::read_to_string(tmp.path().join(f)).unwrap();
        let same_ca = virt_certs::Ca::from_pem(&read("ca.crt"), &read("ca.key")).unwrap();
        same_ca
            .issue_handler("n2", time::Duration::days(1))
            .unwrap()
            .write_pair(tmp.path(), "handler-n2")
            .unwrap();
        assert_eq!(
            healthz(port, &ca, tmp.path(), "handler-n2").await.unwrap(),
            403
        );
    }

    // Console keepalive with 1 s pings: a client that keeps reading answers them and
    // stays; one that stops reading (no pongs) is closed with "no pong".
    {
        use futures::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::Message;
        let mut ws = console_ws(port, tmp.path(), "client2").await;
        let mut seen = Vec::new();
        let mut pings = 0;
        let deadline = tokio::time::Instant::now() + Duration::from_millis(3500);
        while let Ok(Some(m)) = tokio::time::timeout_at(deadline, ws.next()).await {
            match m.unwrap() {
                Message::Binary(b) => seen.extend_from_slice(&b),
                Message::Ping(_) => pings += 1,
                other => panic!("unexpected {other:?}"),
            }
        }
        assert!(pings >= 3, "pings: {pings}");
        assert_eq!(seen, b"hello\r\n");
        ws.send(Message::Binary(b"echo".to_vec().into()))
            .await
            .unwrap();
        let m = tokio::time::timeout(Duration::from_secs(5), ws.next())
            .await
            .unwrap();
        assert_eq!(
            m.unwrap().unwrap(),
            Message::Binary(b"echo".to_vec().into())
        );
        // Stop reading: tungstenite answers pings only while polled.
        tokio::time::sleep(Duration::from_millis(3500)).await;
        let mut reason = None;
        while let Ok(Some(Ok(m))) = tokio::time::timeout(Duration::from_secs(5), ws.next()).await {
            if let Message::Close(f) = m {
                reason = f.map(|f| f.reason.to_string());
                break;
            }
        }
        assert_eq!(reason.as_deref(), Some("no pong"));
    }

    // The launcher goes away (socket file left behind, nobody listening) → Failed.
    launcher.abort();
    let _ = launcher.await;
    wait_phase(&vmis, "bin", Phase::Failed, &log).await;
    let reason = vmis.get("bin").await.unwrap().status.unwrap().reason;
    assert!(
        reason
            .as_deref()
            .is_some_and(|r| r.contains("LauncherDied")),
        "{reason:?}"
    );

    let text = reqwest::get(format!("http://127.0.0.1:{mport}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("kubevirt_handler_vmis 2"), "metrics:\n{text}");
    assert!(text.contains("kubevirt_handler_launchers_gone_total 1"));
}
