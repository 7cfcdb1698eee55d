//! Test harness: a real etcd and the real virt-apiserver binary per test.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::Value;
use virt_devenv::{ClientFiles, DevEnv, Options};

pub fn start(allow_client_ca_users: bool) -> DevEnv {
    DevEnv::start(Options {
        apiserver_bin: env!("CARGO_BIN_EXE_virt-apiserver").into(),
        allow_client_ca_users,
        ..Default::default()
    })
    .expect("start etcd and virt-apiserver (is Debian's etcd-server installed?)")
}

/// Like [`start`] with client-CA users allowed and extra virt-apiserver flags.
pub fn start_with(extra_args: &[&str]) -> DevEnv {
    DevEnv::start(Options {
        apiserver_bin: env!("CARGO_BIN_EXE_virt-apiserver").into(),
        allow_client_ca_users: true,
        extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    })
    .expect("start etcd and virt-apiserver (is Debian's etcd-server installed?)")
}

pub fn client(env: &DevEnv, id: Option<&ClientFiles>) -> reqwest::Client {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&env.server_ca).unwrap()).unwrap();
    let mut b = reqwest::Client::builder()
        .add_root_certificate(ca)
        .use_rustls_tls();
    if let Some(id) = id {
        let mut pem = std::fs::read(&id.cert).unwrap();
        pem.extend(std::fs::read(&id.key).unwrap());
        b = b.identity(reqwest::Identity::from_pem(&pem).unwrap());
    }
    b.build().unwrap()
}

/// A raw TLS client with the admin identity, for tests below HTTP.
pub fn tls_client(env: &DevEnv) -> tokio_rustls::TlsConnector {
    tls_client_alpn(env, b"http/1.1")
}

/// [`tls_client`] offering `alpn` (`h2` for HTTP/2).
pub fn tls_client_alpn(env: &DevEnv, alpn: &[u8]) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(&env.server_ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&env.admin.cert)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(&env.admin.key).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap();
    cfg.alpn_protocols = vec![alpn.to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(cfg))
}

pub fn admin(env: &DevEnv) -> reqwest::Client {
    client(env, Some(&env.admin))
}

pub const VMS: &str = "/apis/kubevirt.io/v1/namespaces/default/virtualmachines";

pub fn vm(name: &str) -> Value {
    serde_json::json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": name, "labels": {"app": "demo"}},
        "spec": {"runStrategy": "Halted", "template": {"spec": {
            "domain": {"devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]},
                       "resources": {"requests": {"memory": "64Mi"}}},
            "volumes": [{"name": "root", "containerDisk": {"image": "localhost/kubevirt-rs/test-guest:latest"}}]}}}
    })
}

/// kubectl for these tests: `$KUBECTL` (`cargo xtask test` exports the cluster's), else the
/// one `cargo xtask cluster up` builds under `target/k8s/<version>/bin/`. Never a guess on
/// PATH: a fresh machine has none, and another version would test something else.
pub fn kubectl_binary() -> PathBuf {
    virt_devenv::kubectl_for_tests().unwrap_or_else(|e| panic!("{e}"))
}

pub struct Kubectl<'a> {
    pub kubeconfig: &'a Path,
}

pub struct Out {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Kubectl<'_> {
    pub fn run(&self, args: &[&str]) -> Out {
        self.run_stdin(args, None)
    }

    pub fn run_stdin(&self, args: &[&str], stdin: Option<&str>) -> Out {
        use std::io::Write;
        let kubectl = kubectl_binary();
        let mut child = Command::new(&kubectl)
            .env("KUBECONFIG", self.kubeconfig)
            .env("HOME", std::env::temp_dir())
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("running {}: {e}", kubectl.display()));
        if let Some(s) = stdin {
            child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
        }
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        Out {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let o = self.run(args);
        assert!(o.ok, "kubectl {args:?} failed: {}", o.stderr);
        o.stdout
    }
}

/// A response's status code and JSON body (`null` when it has none).
pub async fn json_of(r: reqwest::Response) -> (u16, Value) {
    let code = r.status().as_u16();
    let v = r.json().await.unwrap_or(Value::Null);
    (code, v)
}
