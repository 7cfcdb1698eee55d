//! Certificates and kubeconfigs for the local cluster.
//!
//! Generated once per cluster with `rcgen` and reused by later `up`s, so that a running cluster
//! keeps trusting the kubeconfigs it handed out. Every kubeconfig is rewritten on each `up`
//! (cheap) so that none can go stale against the CA.

use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use base64::Engine;
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};
use time::{Duration, OffsetDateTime};

use super::Layout;

/// A CA kept in memory while the leaves are signed.
struct Ca {
    cert: Certificate,
    key: KeyPair,
}

/// Where each file lives; the names follow kubeadm's so that people can find their way.
#[derive(Debug, Clone)]
pub struct Pki {
    pub dir: PathBuf,
}

impl Pki {
    pub fn new(layout: &Layout) -> Self {
        Self {
            dir: layout.state.join("pki"),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Marks a complete set: written last, so an interrupted generation is redone.
    fn complete_marker(&self) -> PathBuf {
        self.dir.join(".complete")
    }

    pub fn exists(&self) -> bool {
        self.complete_marker().exists()
    }

    /// Creates every certificate, key and kubeconfig the cluster needs.
    pub fn generate(
        &self,
        node: &str,
        bridge_ip: IpAddr,
        first_service_ip: IpAddr,
    ) -> anyhow::Result<()> {
        fs::create_dir_all(&self.dir)?;
        let loopback: IpAddr = [127, 0, 0, 1].into();

        let ca = new_ca("kubernetes")?;
        write_pair(&self.dir, "ca", &ca.cert, &ca.key)?;
        let front_proxy_ca = new_ca("front-proxy-ca")?;
        write_pair(
            &self.dir,
            "front-proxy-ca",
            &front_proxy_ca.cert,
            &front_proxy_ca.key,
        )?;

        let mut sans: Vec<String> = [
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            node,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        sans.extend(
            [loopback, first_service_ip, bridge_ip]
                .iter()
                .map(IpAddr::to_string),
        );
        self.leaf(
            &ca,
            "apiserver",
            "kube-apiserver",
            None,
            &sans,
            Usage::Server,
        )?;
        self.leaf(
            &ca,
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            Some("system:masters"),
            &[],
            Usage::Client,
        )?;
        self.leaf(
            &front_proxy_ca,
            "front-proxy-client",
            "front-proxy-client",
            None,
            &[],
            Usage::Client,
        )?;
        let kubelet_sans = vec![
            node.to_string(),
            "localhost".to_string(),
            loopback.to_string(),
            bridge_ip.to_string(),
        ];
        self.leaf(&ca, "kubelet", node, None, &kubelet_sans, Usage::Server)?;

        // Service-account tokens are signed with this key; ECDSA P-256 (ES256) is accepted by
        // kube-apiserver and kube-controller-manager.
        let sa = KeyPair::generate()?;
        write_file(&self.path("sa.key"), &sa.serialize_pem(), true)?;
        write_file(&self.path("sa.pub"), &sa.public_key_pem(), false)?;

        // Client identities, kept as separate files so kubeconfigs can be rebuilt at any time.
        for (name, cn, org) in [
            (
                "admin",
                "kubernetes-admin".to_string(),
                Some("system:masters"),
            ),
            (
                "controller-manager",
                "system:kube-controller-manager".to_string(),
                None,
            ),
            ("scheduler", "system:kube-scheduler".to_string(), None),
            ("kube-proxy", "system:kube-proxy".to_string(), None),
            (
                "kubelet-client",
                format!("system:node:{node}"),
                Some("system:nodes"),
            ),
        ] {
            self.leaf(&ca, name, &cn, org, &[], Usage::Client)?;
        }
        write_file(&self.complete_marker(), "", false)?;
        Ok(())
    }

    /// The client identity `name` of another node's kubelet (`system:node:<node>`, group
    /// `system:nodes`, as the Node authorizer and NodeRestriction want), signed by the
    /// cluster CA on disk; kept once written, like every certificate here.
    pub fn ensure_node_client(&self, name: &str, node: &str) -> anyhow::Result<()> {
        if self.has(name) {
            return Ok(());
        }
        let ca = self.load_ca()?;
        self.leaf(
            &ca,
            name,
            &format!("system:node:{node}"),
            Some("system:nodes"),
            &[],
            Usage::Client,
        )
    }

    /// Another node's kubelet serving certificate `name` (SANs: its name and node IP).
    pub fn ensure_node_serving(&self, name: &str, node: &str, ip: &str) -> anyhow::Result<()> {
        if self.has(name) {
            return Ok(());
        }
        let ca = self.load_ca()?;
        let sans = vec![node.to_string(), ip.to_string()];
        self.leaf(&ca, name, node, None, &sans, Usage::Server)
    }

    fn has(&self, name: &str) -> bool {
        self.path(&format!("{name}.crt")).exists() && self.path(&format!("{name}.key")).exists()
    }

    /// The cluster CA from disk (for certificates added after the first `up`).
    fn load_ca(&self) -> anyhow::Result<Ca> {
        let read =
            |f: &str| fs::read_to_string(self.path(f)).with_context(|| format!("reading {f}"));
        let key = KeyPair::from_pem(&read("ca.key")?)?;
        // The same subject and key make the same issuer: leaves verify against ca.crt.
        let cert = CertificateParams::from_ca_cert_pem(&read("ca.crt")?)?.self_signed(&key)?;
        Ok(Ca { cert, key })
    }

    fn leaf(
        &self,
        ca: &Ca,
        name: &str,
        cn: &str,
        org: Option<&str>,
        sans: &[String],
        usage: Usage,
    ) -> anyhow::Result<()> {
        let mut params =
            CertificateParams::new(sans.to_vec()).with_context(|| format!("SANs for {name}"))?;
        params.distinguished_name = dn(cn, org);
        params.not_before = OffsetDateTime::now_utc() - Duration::hours(1);
        params.not_after = OffsetDateTime::now_utc() + Duration::days(365);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![match usage {
            Usage::Server => ExtendedKeyUsagePurpose::ServerAuth,
            Usage::Client => ExtendedKeyUsagePurpose::ClientAuth,
        }];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &ca.cert, &ca.key)?;
        write_pair(&self.dir, name, &cert, &key)
    }

    /// Writes a kubeconfig for the client identity `name` (one of the names in [`Pki::generate`]).
    pub fn write_kubeconfig(&self, name: &str, server: &str, path: &Path) -> anyhow::Result<()> {
        let b64 = |file: &str| -> anyhow::Result<String> {
            let bytes = fs::read(self.path(file)).with_context(|| format!("reading {file}"))?;
            Ok(base64::engine::general_purpose::STANDARD.encode(bytes))
        };
        let text = format!(
            "apiVersion: v1
kind: Config
clusters:
- name: kubevirt-rs
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: {name}
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: kubevirt-rs
  context:
    cluster: kubevirt-rs
    user: {name}
current-context: kubevirt-rs
",
            ca = b64("ca.crt")?,
            cert = b64(&format!("{name}.crt"))?,
            key = b64(&format!("{name}.key"))?,
        );
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        write_file(path, &text, true)
    }
}

#[derive(Clone, Copy)]
enum Usage {
    Server,
    Client,
}

fn dn(cn: &str, org: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    if let Some(org) = org {
        dn.push(DnType::OrganizationName, org);
    }
    dn.push(DnType::CommonName, cn);
    dn
}

fn new_ca(cn: &str) -> anyhow::Result<Ca> {
    let mut params = CertificateParams::default();
    params.distinguished_name = dn(cn, None);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.not_before = OffsetDateTime::now_utc() - Duration::hours(1);
    params.not_after = OffsetDateTime::now_utc() + Duration::days(3650);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    Ok(Ca { cert, key })
}

fn write_pair(dir: &Path, name: &str, cert: &Certificate, key: &KeyPair) -> anyhow::Result<()> {
    write_file(&dir.join(format!("{name}.crt")), &cert.pem(), false)?;
    write_file(&dir.join(format!("{name}.key")), &key.serialize_pem(), true)
}

fn write_file(path: &Path, text: &str, secret: bool) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    let mode = if secret { 0o600 } else { 0o644 };
    fs::set_permissions(path, fs::Permissions::from_mode(mode))?;
    Ok(())
}
