//! `virt-importer upload-server`: the real binary on 127.0.0.1 takes images as request
//! bodies the way the upload proxy relays `virtctl image-upload`'s: raw, qcow2 (converted by
//! the host's real qemu-img) and gz/xz land in `disk.img` as the same pattern padded to the
//! target's size; a body that is not a disk, or too large, or breaks off, is answered with
//! its reason and leaves no disk behind, and the server takes the next attempt; the first
//! complete upload ends the server with `Completed` in its termination message.
//! Needs qemu-img (Debian's qemu-utils).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use sha2::{Digest, Sha256};

const IMAGE: usize = 4 << 20;
const TARGET: u64 = 8 << 20;

fn pattern() -> Vec<u8> {
    let mut v = vec![0u8; IMAGE];
    for (i, block) in v.chunks_mut(4096).enumerate() {
        if i % 5 == 2 {
            continue;
        }
        for (j, b) in block.iter_mut().enumerate() {
            *b = (i as u8) ^ (j as u8) | 1;
        }
    }
    v
}

fn expected_disk() -> String {
    let mut d = pattern();
    d.resize(TARGET as usize, 0);
    hex::encode(Sha256::digest(&d))
}

fn disk_sha(dir: &Path) -> String {
    let img = dir.join("disk.img");
    assert_eq!(std::fs::metadata(&img).unwrap().len(), TARGET);
    hex::encode(Sha256::digest(std::fs::read(img).unwrap()))
}

/// Only what the test put there (the logs): no disk.img, no .importing, no spool.
fn assert_clean(dir: &Path) {
    let left: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with(".log"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

fn qcow2() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let raw = dir.path().join("d.raw");
    let q = dir.path().join("d.qcow2");
    std::fs::write(&raw, pattern()).unwrap();
    let out = Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "qcow2"])
        .arg(&raw)
        .arg(&q)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read(q).unwrap()
}

struct Server {
    child: tokio::process::Child,
    addr: SocketAddr,
    log: std::path::PathBuf,
}

async fn start(dir: &Path) -> Server {
    // A free port: bound, then released for the server.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let log = dir.join(".log-termination");
    let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_virt-importer"))
        .arg("upload-server")
        .args(["--listen", &addr.to_string()])
        .args(["--target".as_ref(), dir.as_os_str()])
        .args(["--size", "8Mi"])
        .args(["--termination-log".as_ref(), log.as_os_str()])
        .args([
            "--progress-file".as_ref(),
            dir.join(".log-progress").as_os_str(),
        ])
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let client = reqwest::Client::new();
    for _ in 0..200 {
        if let Ok(r) = client.get(format!("http://{addr}/healthz")).send().await
            && r.status() == 200
        {
            return Server { child, addr, log };
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("upload server did not become ready");
}

async fn post(addr: SocketAddr, path: &str, body: Vec<u8>) -> (u16, String) {
    let r = reqwest::Client::new()
        .post(format!("http://{addr}{path}"))
        .header("Content-Type", "application/octet-stream")
        .body(body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn finished(mut s: Server) -> serde_json::Value {
    let status = tokio::time::timeout(Duration::from_secs(30), s.child.wait())
        .await
        .expect("the server ends after a complete upload")
        .unwrap();
    assert!(status.success());
    serde_json::from_slice(&std::fs::read(&s.log).unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_gz_xz_and_qcow2_uploads_land_as_the_pattern() {
    let raw = pattern();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&raw).unwrap();
    let mut xz = xz2::write::XzEncoder::new(Vec::new(), 1);
    xz.write_all(&raw).unwrap();
    for (name, path, body) in [
        ("raw", "/v1beta1/upload", raw.clone()),
        ("gz", "/v1beta1/upload-async", gz.finish().unwrap()),
        ("xz", "/v1beta1/upload", xz.finish().unwrap()),
        ("qcow2", "/v1beta1/upload-async", qcow2()),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let s = start(dir.path()).await;
        let (code, text) = post(s.addr, path, body).await;
        assert_eq!(code, 200, "{name}: {text}");
        let msg = finished(s).await;
        assert_eq!(msg["reason"], "Completed", "{name}: {msg}");
        assert_eq!(disk_sha(dir.path()), expected_disk(), "{name}");
        assert!(!dir.path().join("disk.img.importing").exists());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_uploads_are_refused_with_their_reason_and_the_next_attempt_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let s = start(dir.path()).await;

    let (code, text) = post(s.addr, "/v1beta1/upload", b"<html>login</html>".repeat(100)).await;
    assert_eq!(code, 400, "{text}");
    assert!(text.starts_with("NotADiskImage:"), "{text}");
    assert_clean(dir.path());

    let (code, text) = post(s.addr, "/v1beta1/upload", vec![1u8; TARGET as usize + 4096]).await;
    assert_eq!(code, 400, "{text}");
    assert!(text.starts_with("ImageTooLarge:"), "{text}");
    assert_clean(dir.path());

    // A body that breaks off half-way: nothing is kept.
    let mut conn = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    use tokio::io::AsyncWriteExt;
    conn.write_all(
        format!("POST /v1beta1/upload HTTP/1.1\r\nHost: x\r\nContent-Length: {IMAGE}\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    conn.write_all(&pattern()[..IMAGE / 2]).await.unwrap();
    drop(conn);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_clean(dir.path());

    let (code, text) = post(s.addr, "/v1beta1/upload-form", pattern()).await;
    assert_eq!(code, 415, "{text}");

    let (code, text) = post(s.addr, "/v1beta1/upload", pattern()).await;
    assert_eq!(code, 200, "{text}");
    let msg = finished(s).await;
    assert_eq!(msg["reason"], "Completed", "{msg}");
    assert_eq!(disk_sha(dir.path()), expected_disk());
}
