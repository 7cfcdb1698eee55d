//! `virt-importer import` against an HTTP(S) server on 127.0.0.1 serving images the host's
//! real qemu-img made from one raw disk with a known pattern: every format lands in
//! `disk.img` as that pattern padded to the target's size, and every failure is typed.
//! Needs qemu-img (Debian's qemu-utils).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use base64::Engine as _;
use bytes::Bytes;
use sha2::{Digest, Sha256};
use virt_importer::progress::{Phase, Progress};
use virt_importer::{Config, ImportError, Outcome};

/// The raw disk's size, and the target's: the disk is padded with zeroes to it.
const IMAGE: usize = 8 << 20;
const TARGET: u64 = 16 << 20;

/// The test disk: 4 KiB blocks of a per-block pattern, every 7th block zero (holes).
fn pattern() -> Vec<u8> {
    let mut v = vec![0u8; IMAGE];
    for (i, block) in v.chunks_mut(4096).enumerate() {
        if i % 7 == 3 {
            continue;
        }
        let seed = (i as u32).wrapping_mul(2_654_435_761) >> 24;
        for (j, b) in block.iter_mut().enumerate() {
            *b = (seed as u8) ^ (j as u8) | 1;
        }
    }
    v
}

fn sha256(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

/// sha256 of the pattern padded with zeroes to the target size: what `disk.img` must hold.
fn expected_disk() -> &'static str {
    static E: OnceLock<String> = OnceLock::new();
    E.get_or_init(|| {
        let mut d = pattern();
        d.resize(TARGET as usize, 0);
        sha256(&d)
    })
}

fn qemu_img(args: &[&str]) {
    let out = Command::new("qemu-img").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "qemu-img {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The served files, made once per test process.
struct Images {
    _dir: tempfile::TempDir,
    files: HashMap<&'static str, Bytes>,
}

fn images() -> &'static Images {
    static I: OnceLock<Images> = OnceLock::new();
    I.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let p = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
        let raw = pattern();
        std::fs::write(p("disk.raw"), &raw).unwrap();
        for (name, fmt, opts) in [
            ("disk.qcow2", "qcow2", ""),
            ("disk.vmdk", "vmdk", ""),
            ("disk.vhdx", "vhdx", ""),
            ("disk.vdi", "vdi", ""),
            ("disk.vhd", "vpc", "force_size=on"),
        ] {
            let mut args = vec!["convert", "-f", "raw", "-O", fmt];
            if !opts.is_empty() {
                args.extend(["-o", opts]);
            }
            let (src, dst) = (p("disk.raw"), p(name));
            args.extend([src.as_str(), dst.as_str()]);
            qemu_img(&args);
        }
        qemu_img(&["create", "-q", "-f", "qcow2", &p("big.qcow2"), "1G"]);
        qemu_img(&[
            "create",
            "-q",
            "-f",
            "qcow2",
            "-b",
            &p("disk.raw"),
            "-F",
            "raw",
            &p("backed.qcow2"),
        ]);
        let mut files: HashMap<&'static str, Bytes> = HashMap::new();
        for name in [
            "disk.raw",
            "disk.qcow2",
            "disk.vmdk",
            "disk.vhdx",
            "disk.vdi",
            "disk.vhd",
            "big.qcow2",
            "backed.qcow2",
        ] {
            files.insert(name, std::fs::read(p(name)).unwrap().into());
        }
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&raw).unwrap();
        files.insert("disk.raw.gz", gz.finish().unwrap().into());
        let mut xz = xz2::write::XzEncoder::new(Vec::new(), 1);
        xz.write_all(&raw).unwrap();
        files.insert("disk.raw.xz", xz.finish().unwrap().into());
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&files["disk.qcow2"]).unwrap();
        files.insert("disk.qcow2.gz", gz.finish().unwrap().into());
        // A raw image larger than the target.
        files.insert("large.raw", vec![1u8; TARGET as usize + 4096].into());
        Images { _dir: dir, files }
    })
}

#[derive(Clone)]
struct Served {
    files: &'static HashMap<&'static str, Bytes>,
    /// Requests to /flaky/ so far: the first one breaks off.
    flaky: Arc<AtomicUsize>,
}

async fn file(State(s): State<Served>, UrlPath(name): UrlPath<String>) -> Response {
    match s.files.get(name.as_str()) {
        Some(b) => b.clone().into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// Sends the Content-Length of the whole file, half of it, then drops the connection.
async fn flaky(State(s): State<Served>, UrlPath(name): UrlPath<String>) -> Response {
    let Some(b) = s.files.get(name.as_str()).cloned() else {
        return StatusCode::NOT_FOUND.into_response();
    };
    if s.flaky.fetch_add(1, Ordering::SeqCst) > 0 {
        return b.into_response();
    }
    let half = b.slice(..b.len() / 2);
    let stream = futures::stream::iter(vec![
        Ok(half),
        Err(std::io::Error::other("the server went away")),
    ]);
    Response::builder()
        .header(header::CONTENT_LENGTH, b.len())
        .body(Body::from_stream(stream))
        .unwrap()
}

/// Needs basic auth importer:s3cr3t and `X-Token: t0k`.
async fn authed(state: State<Served>, headers: HeaderMap, name: UrlPath<String>) -> Response {
    let want = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("importer:s3cr3t")
    );
    if headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        != Some(want.as_str())
    {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    if headers.get("x-token").and_then(|v| v.to_str().ok()) != Some("t0k") {
        return StatusCode::FORBIDDEN.into_response();
    }
    file(state, name).await
}

fn router() -> Router {
    let state = Served {
        files: &images().files,
        flaky: Arc::new(AtomicUsize::new(0)),
    };
    Router::new()
        .route("/img/{name}", get(file))
        .route("/flaky/{name}", get(flaky))
        .route("/auth/{name}", get(authed))
        .route(
            "/html",
            get(|| async {
                Html("<!DOCTYPE html>\n<html><head><title>Sign in</title></head><body>Please sign in</body></html>")
            }),
        )
        .route(
            "/redirect",
            get(|| async {
                Response::builder()
                    .status(StatusCode::FOUND)
                    .header(header::LOCATION, "/img/disk.qcow2")
                    .body(Body::empty())
                    .unwrap()
            }),
        )
        .with_state(state)
}

/// Serves `router()` on 127.0.0.1, over TLS when `tls` is given.
async fn serve(tls: Option<tokio_rustls::TlsAcceptor>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = router();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let app = app.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let svc = hyper_util::service::TowerToHyperService::new(app);
                let builder = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                );
                match tls {
                    Some(acceptor) => {
                        let Ok(stream) = acceptor.accept(tcp).await else {
                            return;
                        };
                        let _ = builder
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                            .await;
                    }
                    None => {
                        let _ = builder
                            .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                            .await;
                    }
                }
            });
        }
    });
    addr
}

fn config(url: String, dir: &Path) -> Config {
    Config {
        url,
        target: dir.to_path_buf(),
        size: Some(TARGET),
        qemu_img: PathBuf::from("qemu-img"),
        progress_file: Some(dir.join(".progress.json")),
        ..Config::default()
    }
}

async fn import(cfg: &Config) -> Result<Outcome, ImportError> {
    let mut progress = Progress::new(cfg.progress_file.clone());
    let r = virt_importer::import(cfg, &mut progress).await;
    if r.is_ok() {
        assert_eq!(progress.report.phase, Phase::Completed);
        assert_eq!(progress.report.progress, Some(100.0));
    }
    r
}

fn disk_sha(dir: &Path) -> String {
    let img = dir.join("disk.img");
    assert_eq!(std::fs::metadata(&img).unwrap().len(), TARGET);
    sha256(&std::fs::read(img).unwrap())
}

/// Nothing but what the test put there: no disk.img, no .importing, no spool.
fn assert_clean(dir: &Path) {
    let left: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != ".progress.json")
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_format_lands_as_the_raw_pattern() {
    let addr = serve(None).await;
    for name in [
        "disk.raw",
        "disk.qcow2",
        "disk.vmdk",
        "disk.vhdx",
        "disk.vdi",
        "disk.vhd",
        "disk.raw.gz",
        "disk.raw.xz",
        "disk.qcow2.gz",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = import(&config(format!("http://{addr}/img/{name}"), dir.path()))
            .await
            .unwrap_or_else(|e| panic!("{name}: {} {e}", e.reason()));
        assert_eq!(disk_sha(dir.path()), expected_disk(), "{name}");
        assert_eq!(out.image_size, IMAGE as u64, "{name}");
        assert_eq!(out.received, images().files[name].len() as u64);
        // Only disk.img (and the progress file) stay.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != ".progress.json")
            .collect();
        assert_eq!(names, ["disk.img"], "{name}");
        let p: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join(".progress.json")).unwrap())
                .unwrap();
        assert_eq!(p["phase"], "Completed");
        assert_eq!(p["progress"], 100.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_is_written_sparse_and_redirects_are_followed() {
    use std::os::unix::fs::MetadataExt;
    let addr = serve(None).await;
    let dir = tempfile::tempdir().unwrap();
    import(&config(format!("http://{addr}/img/disk.raw"), dir.path()))
        .await
        .unwrap();
    // 6/7 of 8 MiB has data; the zero blocks and the padding are holes.
    let used = std::fs::metadata(dir.path().join("disk.img"))
        .unwrap()
        .blocks()
        * 512;
    assert!(used < 8 << 20, "{used} bytes allocated");
    let dir = tempfile::tempdir().unwrap();
    let out = import(&config(format!("http://{addr}/redirect"), dir.path()))
        .await
        .unwrap();
    assert_eq!(out.format.name(), "qcow2");
    assert_eq!(disk_sha(dir.path()), expected_disk());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checksums() {
    let addr = serve(None).await;
    let dir = tempfile::tempdir().unwrap();
    let gz = &images().files["disk.raw.gz"];
    let mut cfg = config(format!("http://{addr}/img/disk.raw.gz"), dir.path());
    // Over the bytes as received (compressed).
    cfg.checksum = Some(format!("sha256:{}", sha256(gz)).parse().unwrap());
    let out = import(&cfg).await.unwrap();
    assert!(out.message().contains("verified"), "{}", out.message());
    assert_eq!(disk_sha(dir.path()), expected_disk());

    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(format!("http://{addr}/img/disk.qcow2"), dir.path());
    let wrong = "0".repeat(64);
    cfg.checksum = Some(format!("sha256:{wrong}").parse().unwrap());
    let e = import(&cfg).await.unwrap_err();
    assert_eq!(e.reason(), "ChecksumError");
    let m = e.to_string();
    let actual = sha256(&images().files["disk.qcow2"]);
    assert!(m.contains(&wrong) && m.contains(&actual), "{m}");
    assert_clean(dir.path());

    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(format!("http://{addr}/img/disk.raw"), dir.path());
    let md5 = hex::encode(md5::Md5::digest(&images().files["disk.raw"]));
    cfg.checksum = Some(format!("md5:{md5}").parse().unwrap());
    import(&cfg).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_are_typed() {
    let addr = serve(None).await;
    let case = |path: &str| format!("http://{addr}{path}");
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let cases: Vec<(String, &str, &[&str])> = vec![
        (
            case("/img/nothing.qcow2"),
            "HTTPNotFound",
            &["/img/nothing.qcow2", "404"],
        ),
        (case("/auth/disk.raw"), "HTTPError", &["401"]),
        (
            format!("http://{closed}/disk.img"),
            "ConnectionFailed",
            &["Connection refused"],
        ),
        (
            case("/img/big.qcow2"),
            "ImageTooLarge",
            &["1073741824", "16777216", "1Gi"],
        ),
        (
            case("/img/large.raw"),
            "ImageTooLarge",
            &["16781312", "16777216", "17Mi"],
        ),
        (case("/html"), "NotADiskImage", &["HTML", "Sign in"]),
        (case("/img/backed.qcow2"), "BackingFile", &["disk.raw"]),
    ];
    for (url, reason, words) in cases {
        let dir = tempfile::tempdir().unwrap();
        let e = import(&config(url.clone(), dir.path())).await.unwrap_err();
        let m = e.to_string();
        assert_eq!(e.reason(), reason, "{url}: {m}");
        for w in words {
            assert!(m.contains(w), "{url}: {m:?} lacks {w:?}");
        }
        assert_clean(dir.path());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_transfer_leaves_no_disk_and_the_retry_succeeds() {
    let addr = serve(None).await;
    for name in ["disk.raw", "disk.qcow2"] {
        let dir = tempfile::tempdir().unwrap();
        // Each name's own server state: a new server per name.
        let addr = if name == "disk.raw" {
            addr
        } else {
            serve(None).await
        };
        let cfg = config(format!("http://{addr}/flaky/{name}"), dir.path());
        let e = import(&cfg).await.unwrap_err();
        assert_eq!(e.reason(), "ConnectionFailed", "{e}");
        assert!(e.to_string().contains("broke after"), "{e}");
        assert_clean(dir.path());
        // What a SIGKILLed attempt leaves: a partial .importing and a spool.
        std::fs::write(dir.path().join("disk.img.importing"), b"partial").unwrap();
        std::fs::write(dir.path().join(".virt-importer-spool-x"), b"partial").unwrap();
        import(&cfg).await.unwrap();
        assert_eq!(disk_sha(dir.path()), expected_disk(), "{name}");
        assert!(!dir.path().join("disk.img.importing").exists());
        assert!(!dir.path().join(".virt-importer-spool-x").exists());
    }
}

fn tls_setup() -> (tokio_rustls::TlsAcceptor, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "importer test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let leaf =
        rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .unwrap()
            .signed_by(&key, &ca, &ca_key)
            .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    (tokio_rustls::TlsAcceptor::from(Arc::new(cfg)), ca.pem())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_with_a_private_ca_basic_auth_and_extra_headers() {
    let (acceptor, ca_pem) = tls_setup();
    let addr = serve(Some(acceptor)).await;
    let secrets = tempfile::tempdir().unwrap();
    let certs = secrets.path().join("certs");
    let creds = secrets.path().join("creds");
    std::fs::create_dir(&certs).unwrap();
    std::fs::create_dir(&creds).unwrap();
    std::fs::write(certs.join("ca.pem"), &ca_pem).unwrap();
    std::fs::write(creds.join("accessKeyId"), "importer\n").unwrap();
    std::fs::write(creds.join("secretKey"), "s3cr3t").unwrap();
    let url = format!("https://localhost:{}/auth/disk.qcow2", addr.port());

    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(url.clone(), dir.path());
    cfg.cert_dir = Some(certs.clone());
    cfg.secret_dir = Some(creds.clone());
    cfg.extra_headers = vec!["X-Token: t0k".into()];
    cfg.checksum = Some(
        format!("sha256:{}", sha256(&images().files["disk.qcow2"]))
            .parse()
            .unwrap(),
    );
    import(&cfg).await.unwrap();
    assert_eq!(disk_sha(dir.path()), expected_disk());

    // The header the server checks, missing: 403.
    let dir = tempfile::tempdir().unwrap();
    let mut no_header = cfg.clone();
    no_header.target = dir.path().to_path_buf();
    no_header.extra_headers.clear();
    let e = import(&no_header).await.unwrap_err();
    assert_eq!(e.to_string(), format!("{url} answered HTTP 403"));

    // Without the CA the server's certificate is refused.
    let dir = tempfile::tempdir().unwrap();
    let mut no_ca = cfg.clone();
    no_ca.target = dir.path().to_path_buf();
    no_ca.cert_dir = None;
    let e = import(&no_ca).await.unwrap_err();
    assert_eq!(e.reason(), "ConnectionFailed");
    assert!(e.to_string().to_lowercase().contains("certificate"), "{e}");
    assert_clean(dir.path());
}

/// The binary as a pod runs it: flags and environment, the termination message, the exit code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_reports_in_its_termination_message() {
    let addr = serve(None).await;
    let bin = env!("CARGO_BIN_EXE_virt-importer");
    let run = |url: String, dir: &Path| {
        let log = dir.join(".termination-log");
        let progress = dir.join(".progress.json");
        let mut cmd = tokio::process::Command::new(bin);
        cmd.arg("import")
            .env("VIRT_IMPORTER_URL", url)
            .env("VIRT_IMPORTER_SIZE", "16Mi")
            .env("VIRT_IMPORTER_EXTRA_HEADERS", "X-A: 1\nX-B: 2")
            .args(["--target".as_ref(), dir.as_os_str()])
            .args(["--termination-log".as_ref(), log.as_os_str()])
            .args(["--progress-file".as_ref(), progress.as_os_str()]);
        async move {
            let out = cmd.output().await.unwrap();
            let msg: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&log).unwrap()).unwrap();
            (out, msg)
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let (out, msg) = run(format!("http://{addr}/img/disk.vmdk"), dir.path()).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(msg["reason"], "Completed", "{msg}");
    assert!(msg["message"].as_str().unwrap().contains("vmdk"), "{msg}");
    assert_eq!(disk_sha(dir.path()), expected_disk());

    let dir = tempfile::tempdir().unwrap();
    let (out, msg) = run(format!("http://{addr}/img/gone.raw"), dir.path()).await;
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(msg["reason"], "HTTPNotFound", "{msg}");
    assert_eq!(
        msg["message"],
        format!("http://{addr}/img/gone.raw answered 404 Not Found")
    );
    assert!(!dir.path().join("disk.img").exists());
    let p: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join(".progress.json")).unwrap()).unwrap();
    assert_eq!(p["phase"], "Failed");
}
