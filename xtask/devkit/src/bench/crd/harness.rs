//! Both servers of `cargo xtask bench crd` behind one private kube-apiserver, wired as a
//! cluster wires them: kube-apiserver (kube-testenv) on etcd A with the local cluster's
//! aggregation flags; virt-apiserver (DevEnv) on etcd B, trusting the CAs kube-apiserver
//! publishes, registered by the APIServices virt-operator renders, found through a Service
//! and an EndpointSlice as the aggregator finds a pod; the CRD beside it. Every process is
//! one this harness spawned, so its pid is known rather than looked up by name.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};
use virt_certs::Ca;
use virt_devenv::{DevEnv, Options};

use super::super::apiserver::{Pids, Target};
use super::schema;

/// The admin's static token for virt-apiserver's own calls to kube-apiserver (namespace
/// lifecycle, SubjectAccessReview), as a service account token would be.
const TOKEN: &str = "bench-crd-token";
/// The user the benchmark client is (x509, group `system:masters`).
const ADMIN: &str = "bench-admin";
const MASTERS: &str = "system:masters";
/// The collection of each side, relative to a server.
pub const OURS_COLLECTION: &str = "/apis/kubevirt.io/v1/namespaces/default/virtualmachines";

/// The binaries, chosen before the first run.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub kube_apiserver: PathBuf,
    pub virt_apiserver: PathBuf,
    /// What both etcds run (kube-testenv's and DevEnv's default).
    pub etcd: PathBuf,
}

/// The process ids and etcd URLs that memory is read from.
#[derive(Debug, Clone)]
pub struct Procs {
    pub kube_apiserver: u32,
    /// kube-apiserver's etcd.
    pub etcd_a: u32,
    pub virt_apiserver: u32,
    /// virt-apiserver's etcd.
    pub etcd_b: u32,
    pub etcd_a_url: String,
    pub etcd_b_url: String,
    pub kube_apiserver_url: String,
    /// On this host's address, not loopback (see [`host_address`]).
    pub virt_apiserver_url: String,
}

/// Certificates of one harness: kube-apiserver's serving and client CAs, the front-proxy CA
/// and the identities they issue.
struct Pki {
    kube_serving_ca: Vec<u8>,
    /// Client certificate and key (PEM) of [`ADMIN`].
    admin: Vec<u8>,
    /// The front-proxy client certificate and key (PEM), as the aggregator presents them.
    front_proxy: Vec<u8>,
    /// kube-apiserver's flags for all of the above.
    kube_args: Vec<String>,
}

impl Pki {
    fn generate(dir: &Path) -> anyhow::Result<Self> {
        let validity = time::Duration::days(1);
        let serving_ca = Ca::generate("bench-crd-kube-serving-ca", validity)?;
        let client_ca = Ca::generate("bench-crd-client-ca", validity)?;
        let proxy_ca = Ca::generate("bench-crd-front-proxy-ca", validity)?;
        let (client_ca_file, _) = client_ca.write_pair(dir, "client-ca")?;
        let (proxy_ca_file, _) = proxy_ca.write_pair(dir, "front-proxy-ca")?;
        let serving = serving_ca.issue_server("kube-apiserver", &["127.0.0.1"], validity)?;
        let (serving_cert, serving_key) = serving.write_pair(dir, "kube-apiserver")?;
        let admin = client_ca.issue_client(ADMIN, &[MASTERS], validity)?;
        let proxy = proxy_ca.issue_client("front-proxy-client", &[] as &[&str], validity)?;
        let (proxy_cert, proxy_key) = proxy.write_pair(dir, "front-proxy-client")?;
        let mut kube_args = vec![
            format!("--tls-cert-file={}", serving_cert.display()),
            format!("--tls-private-key-file={}", serving_key.display()),
            format!("--client-ca-file={}", client_ca_file.display()),
        ];
        kube_args.extend(crate::cluster::aggregation_flags(
            &proxy_ca_file,
            &proxy_cert,
            &proxy_key,
        ));
        Ok(Self {
            kube_serving_ca: serving_ca.cert_pem().as_bytes().to_vec(),
            admin: format!("{}{}", admin.cert_pem, admin.key_pem).into_bytes(),
            front_proxy: format!("{}{}", proxy.cert_pem, proxy.key_pem).into_bytes(),
            kube_args,
        })
    }
}

/// A running harness; [`Harness::stop`] (or dropping it) ends every process.
pub struct Harness {
    // Field order = drop order: virt-apiserver, a client of kube-apiserver, goes first.
    ours: DevEnv,
    kube: kube_testenv::KubeApi,
    pki: Pki,
    _dir: tempfile::TempDir,
}

impl Harness {
    /// Starts everything and returns once both collections answer through kube-apiserver.
    pub async fn start(bins: &Binaries) -> anyhow::Result<Self> {
        let h = Self::start_apis(bins, "kubevirt-rs-bench-crd-").await?;
        schema::install(&h.admin()?, &h.kube.url).await?;
        Ok(h)
    }

    /// Both API servers, virt-apiserver registered behind the aggregator, without the CRD;
    /// the temp dir's name starts with `prefix`.
    pub async fn start_apis(bins: &Binaries, prefix: &str) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .context("creating a temp dir")?;
        let pki = Pki::generate(dir.path()).context("generating certificates")?;
        let kube = start_kube(bins, &pki).await?;
        let c = admin_client(&pki)?;
        wait_published_auth(&c, &kube.url).await?;
        let host = host_address()?;
        let ours = start_ours(bins, &kube, host).await?;
        let port = url_port(&ours.server_url)?;
        register(&c, &kube.url, &ours, host, port).await?;
        Ok(Self {
            ours,
            kube,
            pki,
            _dir: dir,
        })
    }

    /// A client of kube-apiserver as the admin user (client certificate, `system:masters`).
    pub fn admin(&self) -> anyhow::Result<reqwest::Client> {
        admin_client(&self.pki)
    }

    /// A kubeconfig for kube-apiserver with the admin's static token (`system:masters`), for
    /// the processes a benchmark adds (scheduler, controllers).
    pub fn kubeconfig(&self) -> PathBuf {
        self.kube.dir.path().join("kubeconfig")
    }

    /// An admin kube client of kube-apiserver.
    pub fn kube_client(&self) -> kube::Client {
        self.kube.client.clone()
    }

    /// The harness's own directory (certificates), for logs of the processes a benchmark adds.
    pub fn dir(&self) -> &Path {
        self._dir.path()
    }

    pub fn procs(&self) -> anyhow::Result<Procs> {
        Ok(Procs {
            kube_apiserver: self.kube.apiserver_pid(),
            etcd_a: self.kube.etcd_pid(),
            virt_apiserver: self
                .ours
                .apiserver_pid()
                .context("virt-apiserver has no process")?,
            etcd_b: self.ours.etcd_pid(),
            etcd_a_url: self.kube.etcd_url().to_string(),
            etcd_b_url: self.ours.etcd_url.clone(),
            kube_apiserver_url: self.kube.url.clone(),
            virt_apiserver_url: self.ours.server_url.clone(),
        })
    }

    /// One side's collection through kube-apiserver, with the admin's client certificate:
    /// the same URL prefix, client and credentials for both sides.
    pub fn target(&self, path: &str, api_version: &str, pids: Pids) -> Target {
        Target {
            collection: format!("{}{path}", self.kube.url),
            api_version: api_version.into(),
            ca: self.pki.kube_serving_ca.clone(),
            identity: self.pki.admin.clone(),
            pids,
        }
    }

    /// A client of virt-apiserver's own port that authenticates as the aggregator does: the
    /// front-proxy certificate with the admin's name and group in X-Remote-* headers.
    pub fn direct_client(&self) -> anyhow::Result<reqwest::Client> {
        let ca = std::fs::read(&self.ours.server_ca).context("reading the serving CA")?;
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert("x-remote-user", ADMIN.parse()?);
        headers.insert("x-remote-group", MASTERS.parse()?);
        Ok(reqwest::Client::builder()
            .use_rustls_tls()
            .add_root_certificate(reqwest::Certificate::from_pem(&ca)?)
            .identity(reqwest::Identity::from_pem(&self.pki.front_proxy)?)
            .default_headers(headers)
            .tcp_nodelay(true)
            .timeout(Duration::from_secs(60))
            .build()?)
    }

    /// virt-apiserver's own URL for `path`.
    pub fn direct_url(&self, path: &str) -> String {
        format!("{}{path}", self.ours.server_url)
    }

    /// Whether every process still runs.
    pub fn alive(&mut self) -> bool {
        self.ours.alive() && self.kube.alive()
    }

    /// Stops virt-apiserver and its etcd, then kube-apiserver and its etcd.
    pub fn stop(self) {
        let Self { ours, kube, .. } = self;
        ours.stop();
        drop(kube);
    }
}

/// kube-apiserver on etcd A. kube-testenv's helper panics when it cannot start (it is a
/// test helper); here that becomes an error.
async fn start_kube(bins: &Binaries, pki: &Pki) -> anyhow::Result<kube_testenv::KubeApi> {
    eprintln!("starting etcd A and kube-apiserver");
    let opts = kube_testenv::Options {
        rbac: true,
        kube_apiserver_bin: Some(bins.kube_apiserver.clone()),
        extra_args: pki.kube_args.clone(),
    };
    tokio::spawn(kube_testenv::KubeApi::start_with(TOKEN, opts))
        .await
        .map_err(|e| anyhow::anyhow!("starting kube-apiserver: {e}"))
}

/// virt-apiserver on etcd B, not standalone: it asks kube-apiserver what a deployed
/// server asks (namespaces, the published CAs).
async fn start_ours(
    bins: &Binaries,
    kube: &kube_testenv::KubeApi,
    host: IpAddr,
) -> anyhow::Result<DevEnv> {
    eprintln!("starting etcd B and virt-apiserver on {host}");
    let opts = Options {
        apiserver_bin: bins.virt_apiserver.clone(),
        etcd_bin: bins.etcd.clone(),
        allow_client_ca_users: false,
        kube_kubeconfig: Some(kube.dir.path().join("kubeconfig")),
        published_auth: true,
        bind_host: host,
        ..Options::default()
    };
    tokio::task::spawn_blocking(move || DevEnv::start(opts))
        .await?
        .context("starting etcd and virt-apiserver")
}

fn admin_client(pki: &Pki) -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .use_rustls_tls()
        .add_root_certificate(reqwest::Certificate::from_pem(&pki.kube_serving_ca)?)
        .identity(reqwest::Identity::from_pem(&pki.admin)?)
        .timeout(Duration::from_secs(60))
        .build()?)
}

/// virt-apiserver reads the front-proxy CA once at start-up, from a ConfigMap that
/// kube-apiserver writes shortly after it is ready.
async fn wait_published_auth(c: &reqwest::Client, base: &str) -> anyhow::Result<()> {
    let url = format!(
        "{base}/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication"
    );
    poll(
        "kube-apiserver's extension-apiserver-authentication",
        || async {
            let resp = c.get(&url).send().await.ok()?;
            let v: Value = resp.json().await.ok()?;
            v["data"]["requestheader-client-ca-file"]
                .as_str()
                .map(|_| ())
        },
    )
    .await
}

/// The address the aggregator can reach virt-apiserver on: the one this host would send
/// from. An EndpointSlice may not hold a loopback address, and the aggregator routes by
/// EndpointSlice, so virt-apiserver serves there instead of on 127.0.0.1. (Connecting a
/// UDP socket sends nothing; it only picks the route.)
fn host_address() -> anyhow::Result<IpAddr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").context("binding a UDP socket")?;
    s.connect("198.51.100.1:9")
        .context("this host has no default route, so no address the aggregator can reach")?;
    let ip = s.local_addr()?.ip();
    anyhow::ensure!(!ip.is_loopback(), "the default route leaves from {ip}");
    Ok(ip)
}

fn url_port(url: &str) -> anyhow::Result<u16> {
    url.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .with_context(|| format!("no port in {url}"))
}

/// Namespace, Service, EndpointSlice and the APIServices: how the aggregator finds a
/// deployed virt-apiserver, with this process standing in for its pod.
async fn register(
    c: &reqwest::Client,
    base: &str,
    ours: &DevEnv,
    host: IpAddr,
    port: u16,
) -> anyhow::Result<()> {
    use virt_operator::render::{NAME, NAMESPACE};
    post(
        c,
        &format!("{base}/api/v1/namespaces"),
        &json!({"metadata": {"name": NAMESPACE}}),
    )
    .await?;
    // The port name is what the aggregator matches between Service and EndpointSlice.
    let service = json!({
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]},
    });
    post(
        c,
        &format!("{base}/api/v1/namespaces/{NAMESPACE}/services"),
        &service,
    )
    .await?;
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{NAME}-bench"), "namespace": NAMESPACE, "labels": {
            "kubernetes.io/service-name": NAME,
            "endpointslice.kubernetes.io/managed-by": "xtask-bench-crd",
        }},
        "addressType": if host.is_ipv4() { "IPv4" } else { "IPv6" },
        "endpoints": [{"addresses": [host.to_string()], "conditions": {"ready": true}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    });
    post(
        c,
        &format!("{base}/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"),
        &slice,
    )
    .await?;
    let ca = std::fs::read_to_string(&ours.server_ca).context("reading the serving CA")?;
    for apiservice in apiservices(&ca)? {
        post(
            c,
            &format!("{base}/apis/apiregistration.k8s.io/v1/apiservices"),
            &apiservice,
        )
        .await?;
    }
    let url = format!("{base}{OURS_COLLECTION}");
    poll("kubevirt.io/v1 through the aggregator", || async {
        let ok = c.get(&url).send().await.ok()?.status() == 200;
        ok.then_some(())
    })
    .await
}

/// The APIServices exactly as virt-operator renders them for a cluster whose serving CA
/// is `ca`.
fn apiservices(ca: &str) -> anyhow::Result<Vec<Value>> {
    let tls = virt_operator::render::Tls {
        ca: ca.into(),
        cert: String::new(),
        key: String::new(),
    };
    let auth = virt_operator::render::ClusterAuth {
        client_ca: String::new(),
        requestheader_ca: String::new(),
        allowed_names: String::new(),
    };
    let yaml = virt_operator::render::cluster_manifest(&tls, &auth)?;
    let mut out = Vec::new();
    for doc in yaml.split("---\n").filter(|d| !d.trim().is_empty()) {
        let v: Value = serde_saphyr::from_str(doc).context("parsing the rendered manifest")?;
        if v["kind"] == "APIService" {
            out.push(v);
        }
    }
    anyhow::ensure!(!out.is_empty(), "virt-operator rendered no APIService");
    Ok(out)
}

pub(super) async fn post(c: &reqwest::Client, url: &str, body: &Value) -> anyhow::Result<()> {
    let resp = c.post(url).json(body).send().await?;
    let status = resp.status();
    anyhow::ensure!(
        status.is_success(),
        "POST {url}: {status}: {}",
        resp.text().await.unwrap_or_default()
    );
    Ok(())
}

/// Polls `f` every 200 ms for up to a minute.
pub(super) async fn poll<F, Fut>(what: &str, mut f: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<()>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    while f().await.is_none() {
        anyhow::ensure!(Instant::now() < deadline, "{what}: not there after 60 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}
