//! The real plugin binary's console through the real virt-apiserver (real etcd) to a
//! virt-handler stand-in over mTLS (docs/cluster-flow.md §5): bytes typed into
//! `kubectl virt console` come back byte-exact, and a session the handler ends
//! (another console took over) ends the plugin cleanly with the reason shown.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::kubectl;

#[path = "../../apiserver/server/tests/handler_peer/mod.rs"]
mod handler_peer;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use virt_devenv::{DevEnv, HandlerCerts, Options};

/// virt-apiserver is a workspace binary: `cargo test --workspace` builds it next to us.
fn apiserver_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("VIRT_APISERVER_BIN") {
        return p.into();
    }
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let bin = dir.join("virt-apiserver");
    assert!(
        bin.exists(),
        "{} missing: run `cargo build -p virt-apiserver` first",
        bin.display()
    );
    bin
}

/// Guest-like bytes without the escape byte (0x1d), which would end the session.
fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| match (i * 7 + i / 251) as u8 {
            0x1d => 0x1e,
            b => b,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn console_bytes_go_through_the_apiserver_to_the_handler() {
    let dir = tempfile::tempdir().unwrap();
    let certs = HandlerCerts::generate(dir.path(), "node1").unwrap();
    let peer = handler_peer::start(&certs.server.cert, &certs.server.key, &certs.ca).await;
    let env = DevEnv::start(Options {
        apiserver_bin: apiserver_bin(),
        extra_args: certs.apiserver_args(&[("node1", peer.addr.to_string())]),
        ..Default::default()
    })
    .unwrap();
    kubectl(
        &env,
        &["create", "-f", "-"],
        Some(
            r#"{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "metadata": {"name": "vm1"},
                "spec": {"domain": {"resources": {"requests": {"memory": "64Mi"}}}}}"#,
        ),
    );
    kubectl(
        &env,
        &[
            "patch",
            "vmi",
            "vm1",
            "--subresource=status",
            "--type=merge",
            "-p",
            r#"{"status": {"phase": "Running", "nodeName": "node1"}}"#,
        ],
        None,
    );

    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kubectl-virt"))
        .env("KUBECONFIG", &env.kubeconfig)
        .args(["console", "vm1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();

    // 1 MiB typed in, echoed by the handler, byte-exact on stdout.
    const BIG: usize = 1 << 20;
    let data = pattern(BIG);
    let started = std::time::Instant::now();
    let writer = async {
        stdin.write_all(&data).await.unwrap();
        stdin.flush().await.unwrap();
    };
    let reader = async {
        let mut got = vec![0u8; BIG];
        stdout.read_exact(&mut got).await.unwrap();
        got
    };
    let ((), got) = tokio::time::timeout(Duration::from_secs(60), async {
        tokio::join!(writer, reader)
    })
    .await
    .expect("1 MiB echoed within 60 s");
    eprintln!(
        "1 MiB through kubectl-virt → virt-apiserver → handler and back: {:?}",
        started.elapsed()
    );
    assert!(got == data, "console bytes differ");

    // The handler ends the session (another console took over): the plugin exits 0
    // and says why.
    tokio::time::sleep(Duration::from_millis(200)).await;
    stdin.write_all(b"~takeover~").await.unwrap();
    stdin.flush().await.unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("plugin ends when the handler closes")
        .unwrap();
    let mut err = String::new();
    stderr.read_to_string(&mut err).await.unwrap();
    assert!(status.success(), "{err}");
    assert!(
        err.contains("Successfully connected to vm1 console"),
        "{err}"
    );
    assert!(err.contains("another console session took over"), "{err}");
    assert_eq!(
        peer.seen.offered.lock().unwrap().as_slice(),
        [Some("plain.kubevirt.io".to_string())]
    );
}
