//! virt-operator's etcd in a running cluster (StatefulSet `kubevirt-etcd`), reached from the
//! test machine through `kubectl port-forward` with virt-apiserver's client certificate
//! (Secret `kubevirt-etcd-client`; etcd's serving certificate names 127.0.0.1): what the
//! e2e tests and `cargo xtask soak` use to read revisions and compact.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use base64::Engine;

use crate::{DevEnvError, free_port, io};

/// An open port-forward to the cluster's etcd; closed when dropped.
pub struct ClusterEtcd {
    child: Child,
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    /// etcd's CA bundle (PEM).
    pub ca_pem: String,
    /// virt-apiserver's etcd client certificate (PEM).
    pub cert_pem: String,
    /// Its key (PEM).
    pub key_pem: String,
}

impl std::fmt::Debug for ClusterEtcd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterEtcd")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl ClusterEtcd {
    /// Reads the client Secret and opens the port-forward with `kubectl` on `kubeconfig`.
    pub fn open(kubectl: &Path, kubeconfig: &Path) -> Result<Self, DevEnvError> {
        let secret = |key: &str| -> Result<String, DevEnvError> {
            let out = Command::new(kubectl)
                .arg("--kubeconfig")
                .arg(kubeconfig)
                .args([
                    "-n",
                    "kubevirt",
                    "get",
                    "secret",
                    "kubevirt-etcd-client",
                    "-o",
                ])
                .arg(format!("jsonpath={{.data.{}}}", key.replace('.', "\\.")))
                .output()
                .map_err(io("kubectl get secret kubevirt-etcd-client"))?;
            let bad = |why: String| {
                DevEnvError::NotReady(format!("Secret kubevirt/kubevirt-etcd-client {key}: {why}"))
            };
            if !out.status.success() {
                return Err(bad(String::from_utf8_lossy(&out.stderr).into_owned()));
            }
            let pem = base64::engine::general_purpose::STANDARD
                .decode(String::from_utf8_lossy(&out.stdout).trim())
                .map_err(|e| bad(e.to_string()))?;
            String::from_utf8(pem).map_err(|e| bad(e.to_string()))
        };
        let (ca_pem, cert_pem, key_pem) =
            (secret("ca.crt")?, secret("tls.crt")?, secret("tls.key")?);
        let port = free_port()?;
        let mut child = Command::new(kubectl)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["-n", "kubevirt", "port-forward", "pod/kubevirt-etcd-0"])
            .arg(format!("{port}:2379"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(io("kubectl port-forward to etcd"))?;
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            let mut out = BufReader::new(out);
            out.read_line(&mut line)
                .map_err(io("reading kubectl port-forward"))?;
            // kubectl writes a line per connection: a closed pipe would end it at the first.
            std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        }
        if !line.contains("Forwarding from") {
            let _ = child.kill();
            let _ = child.wait();
            return Err(DevEnvError::NotReady(format!(
                "port-forward to etcd: {line}"
            )));
        }
        Ok(Self {
            child,
            url: format!("https://127.0.0.1:{port}"),
            ca_pem,
            cert_pem,
            key_pem,
        })
    }
}

impl Drop for ClusterEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
