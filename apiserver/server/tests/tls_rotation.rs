//! The serving certificate is rotated on disk (as kubelet does when the operator renews the
//! Secret) while a watch is open: the next connection gets the new certificate, the open
//! watch keeps delivering events, and virt-apiserver never restarts.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use virt_devenv::DevEnv;

/// The certificate virt-apiserver presents to a new TLS connection.
async fn presented(env: &DevEnv) -> CertificateDer<'static> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&env.server_ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let addr = env.server_url.trim_start_matches("https://").to_string();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].clone()
}

fn der_of(path: &Path) -> CertificateDer<'static> {
    CertificateDer::from_pem_file(path).unwrap()
}

/// Writes `contents` to `path` by renaming a new file over it, as a Secret update does.
fn replace(path: &Path, contents: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test]
async fn a_rotated_serving_certificate_is_used_for_new_connections_while_a_watch_stays_open() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let env = common::start(true);
    let pid = env.apiserver_pid();
    let certs = env.dir().join("certs");
    let (cert_path, key_path) = (certs.join("serving.crt"), certs.join("serving.key"));
    assert_eq!(presented(&env).await, der_of(&cert_path));

    let http = common::admin(&env);
    let url = format!("{}{}", env.server_url, common::VMS);
    let watch = http
        .get(format!("{url}?watch=1&resourceVersion=0"))
        .send()
        .await
        .unwrap();
    assert!(watch.status().is_success());
    let mut events = watch.bytes_stream();

    // A new leaf from the same CA: what the operator issues on leaf rotation.
    let ca = virt_certs::Ca::from_pem(
        &std::fs::read_to_string(certs.join("serving-ca.crt")).unwrap(),
        &std::fs::read_to_string(certs.join("serving-ca.key")).unwrap(),
    )
    .unwrap();
    let renewed = ca
        .issue_server(
            "virt-apiserver",
            &["127.0.0.1", "localhost"],
            time::Duration::days(1),
        )
        .unwrap();
    // Key first: in between, cert and key do not match, and the server keeps the old pair.
    replace(&key_path, &renewed.key_pem);
    assert_eq!(
        presented(&env).await,
        der_of(&cert_path),
        "half-written pair: old certificate kept"
    );
    replace(&cert_path, &renewed.cert_pem);
    let new_der = CertificateDer::from_pem_slice(renewed.cert_pem.as_bytes()).unwrap();
    assert_eq!(presented(&env).await, new_der);

    // The watch opened before the rotation still delivers.
    let created = http
        .post(&url)
        .json(&common::vm("after-rotation"))
        .send()
        .await
        .unwrap();
    assert!(created.status().is_success(), "{}", created.status());
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = String::new();
    while !seen.contains("after-rotation") {
        let left = deadline.saturating_duration_since(Instant::now());
        let chunk = tokio::time::timeout(left, events.next())
            .await
            .expect("watch event within 10 s")
            .expect("watch still open")
            .unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(seen.contains("\"ADDED\""), "{seen}");
    assert_eq!(env.apiserver_pid(), pid, "virt-apiserver was not restarted");
}

/// L3 of the security review at 5efe883: the front-proxy CA is read again while the server
/// runs: once it is rotated on disk, a front-proxy certificate of the new CA is accepted and
/// one of the old CA is no longer, without a restart.
#[tokio::test]
async fn a_rotated_front_proxy_ca_is_used_without_a_restart() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let env = common::start_with(&["--ca-reload-seconds=1"]);
    let pid = env.apiserver_pid();
    let certs = env.dir().join("certs");
    let list_as = |cert: &Path, key: &Path| {
        let ca = reqwest::Certificate::from_pem(&std::fs::read(&env.server_ca).unwrap()).unwrap();
        let mut pem = std::fs::read(cert).unwrap();
        pem.extend(std::fs::read(key).unwrap());
        let client = reqwest::Client::builder()
            .add_root_certificate(ca)
            .identity(reqwest::Identity::from_pem(&pem).unwrap())
            .use_rustls_tls()
            .build()
            .unwrap();
        let url = format!("{}{}", env.server_url, common::VMS);
        async move {
            client
                .get(url)
                .header("X-Remote-User", "rotated")
                .header("X-Remote-Group", "system:masters")
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    let (old_cert, old_key) = (env.front_proxy.cert.clone(), env.front_proxy.key.clone());
    assert_eq!(list_as(&old_cert, &old_key).await, 200);

    let validity = time::Duration::days(1);
    let new_ca = virt_certs::Ca::generate("rotated-front-proxy-ca", validity).unwrap();
    let client = new_ca
        .issue_client("front-proxy-client", &[] as &[&str], validity)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (new_cert, new_key) = client.write_pair(dir.path(), "new-proxy").unwrap();
    assert_eq!(
        list_as(&new_cert, &new_key).await,
        401,
        "the new CA's certificate before the rotation"
    );
    replace(&certs.join("front-proxy-ca.crt"), new_ca.cert_pem());
    let deadline = Instant::now() + Duration::from_secs(20);
    while list_as(&new_cert, &new_key).await != 200 {
        assert!(
            Instant::now() < deadline,
            "the rotated front-proxy CA was not taken within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        list_as(&old_cert, &old_key).await,
        401,
        "the old CA's certificate after the rotation"
    );
    assert_eq!(env.apiserver_pid(), pid, "virt-apiserver restarted");
}
