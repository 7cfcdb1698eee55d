//! A disposable development environment: a real etcd (Debian's etcd binary) and a
//! virt-apiserver process on free loopback ports, with generated certificates and a
//! kubeconfig for kubectl. Used by `cargo xtask dev-apiserver` and the integration tests.
//! This is tooling, not daemon code: it blocks and spawns processes.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use virt_certs::Ca;

pub mod cluster_etcd;
mod etcd;
pub mod procs;

pub use etcd::Etcd;
use etcd::wait_tcp;

/// Errors starting the environment.
#[derive(Debug, thiserror::Error)]
pub enum DevEnvError {
    /// A file or process operation failed.
    #[error("{what}")]
    Io {
        /// What was attempted.
        what: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Certificate generation failed.
    #[error("generating certificates")]
    Certs(#[from] virt_certs::CertError),
    /// A process did not become ready.
    #[error("{0}")]
    NotReady(String),
    /// Options that contradict each other.
    #[error("{0}")]
    Options(&'static str),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> DevEnvError {
    let what = what.into();
    move |source| DevEnvError::Io { what, source }
}

/// A free TCP port on 127.0.0.1.
pub fn free_port() -> Result<u16, DevEnvError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(io("binding a free port"))?;
    Ok(l.local_addr().map_err(io("reading the free port"))?.port())
}

/// The virt-apiserver binary for another crate's integration test: `VIRT_APISERVER_BIN`,
/// else the one cargo built beside the running test (`target/<profile>/deps/<test>` →
/// `target/<profile>/virt-apiserver`; `cargo test --workspace` builds it).
pub fn apiserver_bin_beside_test() -> Result<PathBuf, DevEnvError> {
    if let Some(p) = std::env::var_os("VIRT_APISERVER_BIN") {
        return Ok(p.into());
    }
    let exe = std::env::current_exe().map_err(io("locating the test binary"))?;
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("virt-apiserver"))
        .filter(|b| b.exists())
        .ok_or_else(|| {
            DevEnvError::NotReady(format!(
                "no virt-apiserver beside {}: run `cargo build -p virt-apiserver` (or \
                 `cargo test --workspace`), or set VIRT_APISERVER_BIN",
                exe.display()
            ))
        })?;
    Ok(bin)
}

/// kubectl for integration tests: `$KUBECTL` (`cargo xtask test` exports the cluster's), else
/// the newest one `cargo xtask cluster up` built under `target/k8s/<version>/bin/`. Never a
/// guess on PATH: a fresh machine has none, and another version would test something else.
pub fn kubectl_for_tests() -> Result<PathBuf, DevEnvError> {
    if let Some(k) = std::env::var_os("KUBECTL").filter(|k| !k.is_empty()) {
        return Ok(k.into());
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), |t| root.join(t));
    let mut found: Vec<PathBuf> = std::fs::read_dir(target.join("k8s"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin/kubectl"))
        .filter(|p| p.is_file())
        .collect();
    found.sort();
    found.pop().ok_or_else(|| {
        DevEnvError::NotReady(format!(
            "no kubectl: set KUBECTL to one, or build the cluster's with `cargo xtask cluster up` \
             (it lands in {}/k8s/<version>/bin/)",
            target.display()
        ))
    })
}

/// Options of the environment.
#[derive(Debug, Clone)]
pub struct Options {
    /// The virt-apiserver binary.
    pub apiserver_bin: PathBuf,
    /// The etcd binary.
    pub etcd_bin: PathBuf,
    /// Where to write the kubeconfig (inside the temp dir when None).
    pub kubeconfig: Option<PathBuf>,
    /// Port for the API server (0 = any free port).
    pub port: u16,
    /// Extra virt-apiserver arguments.
    pub extra_args: Vec<String>,
    /// Grant full access to client-CA users (no kube-apiserver to ask).
    pub allow_client_ca_users: bool,
    /// Talk to this kube-apiserver (SubjectAccessReview, TokenReview, namespaces)
    /// instead of running standalone.
    pub kube_kubeconfig: Option<PathBuf>,
    /// etcd members: 1 (plain HTTP unless [`Options::etcd_tls`]) or more, a cluster whose
    /// members reach each other over peer TLS when [`Options::etcd_tls`] is set, with the
    /// flags virt-operator gives a cluster's members.
    pub etcd_members: usize,
    /// mTLS between virt-apiserver and etcd (a CA of its own, as virt-operator deploys it).
    pub etcd_tls: bool,
    /// Trust the client and front-proxy CAs that kube-apiserver publishes in
    /// `kube-system/extension-apiserver-authentication`, as a deployed virt-apiserver does,
    /// instead of the generated ones: the server then sits behind that kube-apiserver's
    /// aggregator, and the generated identities ([`DevEnv::admin`], [`DevEnv::front_proxy`],
    /// the kubeconfig) are not trusted. Needs `kube_kubeconfig`.
    pub published_auth: bool,
    /// Address to serve on; besides loopback, it is also a name in the serving certificate
    /// (an EndpointSlice, which the aggregator routes by, cannot hold a loopback address).
    pub bind_host: std::net::IpAddr,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            apiserver_bin: PathBuf::from("virt-apiserver"),
            etcd_bin: PathBuf::from("/usr/bin/etcd"),
            kubeconfig: None,
            port: 0,
            extra_args: Vec::new(),
            allow_client_ca_users: true,
            kube_kubeconfig: None,
            etcd_members: 1,
            etcd_tls: false,
            published_auth: false,
            bind_host: std::net::Ipv4Addr::LOCALHOST.into(),
        }
    }
}

/// etcd's client-side TLS files, when [`Options::etcd_tls`] is set.
#[derive(Debug, Clone)]
pub struct EtcdClientFiles {
    /// etcd's CA.
    pub ca: PathBuf,
    /// A client certificate etcd accepts (CN `virt-apiserver`).
    pub client: ClientFiles,
}

/// One etcd member process.
#[derive(Debug)]
struct EtcdMember {
    child: Child,
    client_port: u16,
    metrics_port: u16,
}

/// Files of a client identity.
#[derive(Debug, Clone)]
pub struct ClientFiles {
    /// Certificate PEM path.
    pub cert: PathBuf,
    /// Key PEM path.
    pub key: PathBuf,
}

/// A running environment; dropping it stops both processes and removes the data.
#[derive(Debug)]
pub struct DevEnv {
    etcd: Vec<EtcdMember>,
    apiserver: Option<Child>,
    dir: tempfile::TempDir,
    /// etcd client URL (of the first member).
    pub etcd_url: String,
    /// Every member's client URL, in member order.
    pub etcd_urls: Vec<String>,
    /// etcd's CA and a client certificate, with [`Options::etcd_tls`].
    pub etcd_tls: Option<EtcdClientFiles>,
    /// API server URL.
    pub server_url: String,
    /// Kubeconfig for the dev user (full access).
    pub kubeconfig: PathBuf,
    /// CA that signed the serving certificate.
    pub server_ca: PathBuf,
    /// The dev user's client certificate (client CA).
    pub admin: ClientFiles,
    /// A valid front-proxy client certificate (CN front-proxy-client).
    pub front_proxy: ClientFiles,
    /// A client certificate from a CA the server does not trust.
    pub untrusted: ClientFiles,
    /// A client-CA user without special rights (CN alice, O team-a).
    pub plain_user: ClientFiles,
    /// Log of the API server.
    pub apiserver_log: PathBuf,
    opts: Options,
}

/// Waits until the etcd member with metrics on `port` reports itself healthy (it has a
/// leader), asking its `/health` over plain HTTP.
fn wait_healthy(port: u16, timeout: Duration) -> Result<(), DevEnvError> {
    use std::io::Read;
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            let _ = s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
            let mut body = String::new();
            let _ = s.read_to_string(&mut body);
            if body.contains("\"health\":\"true\"") {
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(DevEnvError::NotReady(format!(
        "etcd (metrics on 127.0.0.1:{port}) was not healthy within {timeout:?}"
    )))
}

fn etcd_client_url(port: u16, tls: bool) -> String {
    format!("{}://127.0.0.1:{port}", if tls { "https" } else { "http" })
}

/// The common name etcd members accept from a peer (virt-operator's choice, see
/// virt-operator's render/etcd.rs): a client certificate of the same CA is no peer.
pub const ETCD_PEER_COMMON_NAME: &str = "kubevirt-etcd-peer";

/// etcd's CA, serving, peer and client certificates in `dir`; the client side's files.
fn etcd_certs(dir: &Path, validity: time::Duration) -> Result<EtcdClientFiles, DevEnvError> {
    let ca = Ca::generate("kubevirt-rs-dev-etcd-ca", validity)?;
    let (ca_cert, _) = ca.write_pair(dir, "etcd-ca")?;
    ca.issue_server("kubevirt-etcd", &["127.0.0.1"], validity)?
        .write_pair(dir, "etcd-server")?;
    ca.issue_peer(ETCD_PEER_COMMON_NAME, &["127.0.0.1"], validity)?
        .write_pair(dir, "etcd-peer")?;
    let (cert, key) = ca
        .issue_client("virt-apiserver", &[] as &[&str], validity)?
        .write_pair(dir, "etcd-client")?;
    Ok(EtcdClientFiles {
        ca: ca_cert,
        client: ClientFiles { cert, key },
    })
}

/// Starts `opts.etcd_members` etcd processes on free loopback ports (data under `dir`), with
/// TLS from `certs` when given.
fn start_etcd(
    opts: &Options,
    dir: &Path,
    certs: Option<&Path>,
) -> Result<Vec<EtcdMember>, DevEnvError> {
    let n = opts.etcd_members.max(1);
    let tls = certs.is_some();
    let mut ports = Vec::new();
    for _ in 0..n {
        ports.push((free_port()?, free_port()?, free_port()?));
    }
    // Between members over TLS only when there is TLS at all (one member: loopback HTTP, as
    // virt-operator's single member).
    let peer_scheme = if tls && n > 1 { "https" } else { "http" };
    let name = |i: usize| {
        if n == 1 {
            "dev".to_string()
        } else {
            format!("dev-{i}")
        }
    };
    let cluster: Vec<String> = ports
        .iter()
        .enumerate()
        .map(|(i, (_, peer, _))| format!("{}={peer_scheme}://127.0.0.1:{peer}", name(i)))
        .collect();
    let mut members = Vec::new();
    for (i, (client, peer, metrics)) in ports.into_iter().enumerate() {
        let url = etcd_client_url(client, tls);
        let peer_url = format!("{peer_scheme}://127.0.0.1:{peer}");
        let log = std::fs::File::create(dir.join(format!("etcd-{i}.log")))
            .map_err(io("creating an etcd log"))?;
        let mut cmd = Command::new(&opts.etcd_bin);
        cmd.arg(format!("--name={}", name(i)))
            .arg("--data-dir")
            .arg(dir.join(format!("etcd-{i}")))
            .arg(format!("--listen-client-urls={url}"))
            .arg(format!("--advertise-client-urls={url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster={}", cluster.join(",")))
            .arg("--initial-cluster-state=new")
            .arg(format!("--listen-metrics-urls=http://127.0.0.1:{metrics}"));
        if let Some(c) = certs {
            let f = |name: &str| c.join(name).display().to_string();
            cmd.arg(format!("--cert-file={}", f("etcd-server.crt")))
                .arg(format!("--key-file={}", f("etcd-server.key")))
                .arg(format!("--trusted-ca-file={}", f("etcd-ca.crt")))
                .arg("--client-cert-auth=true");
            if n > 1 {
                cmd.arg(format!("--peer-cert-file={}", f("etcd-peer.crt")))
                    .arg(format!("--peer-key-file={}", f("etcd-peer.key")))
                    .arg(format!("--peer-trusted-ca-file={}", f("etcd-ca.crt")))
                    .arg("--peer-client-cert-auth=true")
                    .arg(format!("--peer-cert-allowed-cn={ETCD_PEER_COMMON_NAME}"))
                    .arg("--experimental-peer-skip-client-san-verification=true");
            }
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(io(format!(
                "starting {} (install Debian's etcd-server package)",
                opts.etcd_bin.display()
            )))?;
        members.push(EtcdMember {
            child,
            client_port: client,
            metrics_port: metrics,
        });
    }
    Ok(members)
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

impl DevEnv {
    /// Starts etcd and virt-apiserver and waits until both serve.
    pub fn start(opts: Options) -> Result<Self, DevEnvError> {
        if opts.published_auth && opts.kube_kubeconfig.is_none() {
            return Err(DevEnvError::Options(
                "published_auth needs kube_kubeconfig: the CAs come from that kube-apiserver",
            ));
        }
        let dir = tempfile::Builder::new()
            .prefix("kubevirt-rs-dev-")
            .tempdir()
            .map_err(io("creating a temp dir"))?;
        let d = dir.path();
        let certs = d.join("certs");
        std::fs::create_dir_all(&certs).map_err(io("creating the certs dir"))?;

        let validity = time::Duration::days(7);
        let server_ca = Ca::generate("kubevirt-rs-dev-serving-ca", validity)?;
        let client_ca = Ca::generate("kubevirt-rs-dev-client-ca", validity)?;
        let proxy_ca = Ca::generate("kubevirt-rs-dev-front-proxy-ca", validity)?;
        let other_ca = Ca::generate("some-other-ca", validity)?;
        server_ca.write_pair(&certs, "serving-ca")?;
        client_ca.write_pair(&certs, "client-ca")?;
        proxy_ca.write_pair(&certs, "front-proxy-ca")?;
        let bind_host = opts.bind_host.to_string();
        let mut names = vec!["127.0.0.1", "localhost", "kubevirt-apiserver.kubevirt.svc"];
        if !names.contains(&bind_host.as_str()) {
            names.push(&bind_host);
        }
        let serving = server_ca.issue_server("virt-apiserver", &names, validity)?;
        let (cert, key) = serving.write_pair(&certs, "serving")?;
        let admin = client_ca.issue_client("kubevirt-dev", &["kubevirt-dev"], validity)?;
        let (admin_cert, admin_key) = admin.write_pair(&certs, "admin")?;
        let plain = client_ca.issue_client("alice", &["team-a"], validity)?;
        let (plain_cert, plain_key) = plain.write_pair(&certs, "alice")?;
        let proxy = proxy_ca.issue_client("front-proxy-client", &[] as &[&str], validity)?;
        let (proxy_cert, proxy_key) = proxy.write_pair(&certs, "front-proxy-client")?;
        let other = other_ca.issue_client("kubevirt-dev", &["system:masters"], validity)?;
        let (other_cert, other_key) = other.write_pair(&certs, "untrusted")?;

        let etcd_tls = if opts.etcd_tls {
            Some(etcd_certs(&certs, validity)?)
        } else {
            None
        };
        let etcd = start_etcd(&opts, d, etcd_tls.is_some().then_some(certs.as_path()))?;
        let etcd_urls: Vec<String> = etcd
            .iter()
            .map(|m| etcd_client_url(m.client_port, etcd_tls.is_some()))
            .collect();
        let etcd_url = etcd_urls.first().cloned().unwrap_or_default();
        let mut env = Self {
            etcd,
            apiserver: None,
            etcd_url,
            etcd_urls,
            etcd_tls,
            server_url: String::new(),
            kubeconfig: opts
                .kubeconfig
                .clone()
                .unwrap_or_else(|| d.join("kubeconfig")),
            server_ca: certs.join("serving-ca.crt"),
            admin: ClientFiles {
                cert: admin_cert,
                key: admin_key,
            },
            front_proxy: ClientFiles {
                cert: proxy_cert,
                key: proxy_key,
            },
            untrusted: ClientFiles {
                cert: other_cert,
                key: other_key,
            },
            plain_user: ClientFiles {
                cert: plain_cert,
                key: plain_key,
            },
            apiserver_log: d.join("apiserver.log"),
            dir,
            opts,
        };
        // 60 s: with eight test binaries at once on two CPUs and a busy disk, an etcd took
        // more than 20 s to listen in a full run (backup, at 2a7f795); a healthy one listens
        // in well under a second, so this only delays reporting a broken one.
        for m in &env.etcd {
            wait_tcp(m.client_port, Duration::from_secs(60), "etcd")?;
        }
        if env.etcd.len() > 1 {
            // A cluster serves once it has elected a leader.
            for m in &env.etcd {
                wait_healthy(m.metrics_port, Duration::from_secs(30))?;
            }
        }
        // A port picked by free_port() can be taken by a parallel test before the
        // server binds it; the server then exits at once. Try again on another port.
        let mut attempts = 0;
        loop {
            match env.start_apiserver(&cert, &key) {
                Err(_) if env.opts.port == 0 && attempts < 3 && env.apiserver_exited() => {
                    attempts += 1;
                }
                other => break other?,
            }
        }
        env.write_kubeconfig(&server_ca, &admin)?;
        Ok(env)
    }

    /// Whether the apiserver process has exited (waiting up to 2 s: its stderr closes
    /// just before it is reapable).
    fn apiserver_exited(&mut self) -> bool {
        let Some(child) = self.apiserver.as_mut() else {
            return false;
        };
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn start_apiserver(&mut self, cert: &Path, key: &Path) -> Result<(), DevEnvError> {
        let port = if self.opts.port == 0 {
            free_port()?
        } else {
            self.opts.port
        };
        let certs = self.dir.path().join("certs");
        let log =
            std::fs::File::create(&self.apiserver_log).map_err(io("creating apiserver.log"))?;
        let mut cmd = Command::new(&self.opts.apiserver_bin);
        let addr = std::net::SocketAddr::new(self.opts.bind_host, port);
        cmd.arg("--bind")
            .arg(addr.to_string())
            .arg("--etcd-servers")
            .arg(self.etcd_urls.join(","));
        if let Some(t) = &self.etcd_tls {
            cmd.arg("--etcd-cafile")
                .arg(&t.ca)
                .arg("--etcd-certfile")
                .arg(&t.client.cert)
                .arg("--etcd-keyfile")
                .arg(&t.client.key);
        }
        cmd.arg("--tls-cert-file")
            .arg(cert)
            .arg("--tls-private-key-file")
            .arg(key)
            .args(["--bookmark-interval-seconds", "1"])
            .args(self.auth_args(&certs))
            .args(&self.opts.extra_args)
            .args(match &self.opts.kube_kubeconfig {
                Some(k) => vec![
                    std::ffi::OsString::from("--kubeconfig"),
                    k.clone().into_os_string(),
                ],
                None => vec![std::ffi::OsString::from("--standalone")],
            })
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(io(format!(
            "starting {}",
            self.opts.apiserver_bin.display()
        )))?;
        // Copy stderr to the log file and notice the "Serving" line.
        let stderr = child.stderr.take();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut log = log;
            if let Some(stderr) = stderr {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    let _ = writeln!(log, "{line}");
                    if line.contains("Serving") {
                        let _ = tx.send(());
                    }
                }
            }
        });
        self.apiserver = Some(child);
        self.server_url = format!("https://{addr}");
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(()) => Ok(()),
            Err(_) => Err(DevEnvError::NotReady(format!(
                "virt-apiserver did not start; see {}",
                self.apiserver_log.display()
            ))),
        }
    }

    /// Whom the server trusts: the generated CAs, or kube-apiserver's published ones.
    fn auth_args(&self, certs: &Path) -> Vec<std::ffi::OsString> {
        if self.opts.published_auth {
            return Vec::new();
        }
        let mut args: Vec<std::ffi::OsString> = vec![
            "--client-ca-file".into(),
            certs.join("client-ca.crt").into(),
            "--requestheader-client-ca-file".into(),
            certs.join("front-proxy-ca.crt").into(),
        ];
        if self.opts.allow_client_ca_users {
            args.push("--allow-client-ca-users".into());
        }
        args
    }

    fn write_kubeconfig(&self, ca: &Ca, admin: &virt_certs::IssuedCert) -> Result<(), DevEnvError> {
        let kc = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: kubevirt-rs-dev\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: kubevirt-dev\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\ncontexts:\n- name: kubevirt-rs-dev\n  context:\n    cluster: kubevirt-rs-dev\n    user: kubevirt-dev\n    namespace: default\ncurrent-context: kubevirt-rs-dev\n",
            self.server_url,
            b64(ca.cert_pem()),
            b64(&admin.cert_pem),
            b64(&admin.key_pem)
        );
        if let Some(parent) = self.kubeconfig.parent() {
            std::fs::create_dir_all(parent).map_err(io("creating the kubeconfig dir"))?;
        }
        std::fs::write(&self.kubeconfig, kc)
            .map_err(io(format!("writing {}", self.kubeconfig.display())))
    }

    /// The temp dir holding data, certs and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// PID of the API server process.
    pub fn apiserver_pid(&self) -> Option<u32> {
        self.apiserver.as_ref().map(Child::id)
    }

    /// PID of the (first) etcd member.
    pub fn etcd_pid(&self) -> u32 {
        self.etcd.first().map_or(0, |m| m.child.id())
    }

    /// Stops etcd (SIGKILL, every member), to test behaviour while storage is unreachable.
    pub fn kill_etcd(&mut self) {
        for i in 0..self.etcd.len() {
            self.kill_etcd_member(i);
        }
    }

    /// Stops one etcd member (SIGKILL: no goodbye to its peers or clients).
    pub fn kill_etcd_member(&mut self, i: usize) {
        if let Some(m) = self.etcd.get_mut(i) {
            let _ = m.child.kill();
            let _ = m.child.wait();
        }
    }

    /// Whether both processes still run (every etcd member).
    pub fn alive(&mut self) -> bool {
        let etcd = self
            .etcd
            .iter_mut()
            .all(|m| matches!(m.child.try_wait(), Ok(None)));
        let api = self
            .apiserver
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)));
        etcd && api
    }

    /// Stops both processes (SIGTERM, then SIGKILL) and removes the data.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if let Some(mut c) = self.apiserver.take() {
            terminate(&mut c);
        }
        for m in &mut self.etcd {
            terminate(&mut m.child);
        }
        if self.opts.kubeconfig.is_some() {
            let _ = std::fs::remove_file(&self.kubeconfig);
        }
    }
}

/// SIGTERM, then SIGKILL after 10 s.
fn terminate(c: &mut Child) {
    if let Ok(Some(_)) = c.try_wait() {
        return;
    }
    let _ = Command::new("kill")
        .arg("-TERM")
        .arg(c.id().to_string())
        .status();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = c.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = c.kill();
    let _ = c.wait();
}

impl Drop for DevEnv {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Certificates for virt-apiserver ⇄ virt-handler mutual TLS (docs/cluster-flow.md §4, §5):
/// one CA, a serving certificate named `virt-handler`, and a client certificate
/// `virt-apiserver`. Tests use them for a handler peer and the apiserver's flags.
#[derive(Debug, Clone)]
pub struct HandlerCerts {
    /// The CA certificate both sides trust.
    pub ca: PathBuf,
    /// The handler certificate of the node given to [`HandlerCerts::generate`] (CN
    /// `virt-handler:<node>`, SAN the node name), as virt-operator signs it.
    pub server: ClientFiles,
    /// virt-apiserver's client certificate (CN `virt-apiserver`).
    pub client: ClientFiles,
    dir: PathBuf,
}

impl HandlerCerts {
    /// Generates the certificates into `dir`, the handler's for `node`.
    pub fn generate(dir: &Path, node: &str) -> Result<Self, DevEnvError> {
        std::fs::create_dir_all(dir).map_err(io("creating the handler certs dir"))?;
        let validity = time::Duration::days(7);
        let ca = Ca::generate("kubevirt-rs-handler-ca", validity)?;
        let (ca_cert, _) = ca.write_pair(dir, "handler-ca")?;
        let (ccert, ckey) = ca
            .issue_client(
                virt_certs::node_identity::APISERVER_CLIENT_NAME,
                &[] as &[&str],
                validity,
            )?
            .write_pair(dir, "virt-apiserver-handler-client")?;
        let mut certs = Self {
            ca: ca_cert,
            server: ClientFiles {
                cert: PathBuf::new(),
                key: PathBuf::new(),
            },
            client: ClientFiles {
                cert: ccert,
                key: ckey,
            },
            dir: dir.to_path_buf(),
        };
        certs.server = certs.handler(node)?;
        Ok(certs)
    }

    /// The handler certificate of `node` from the same CA, written into the directory.
    pub fn handler(&self, node: &str) -> Result<ClientFiles, DevEnvError> {
        let read = |name: &str| {
            std::fs::read_to_string(self.dir.join(name)).map_err(io("reading the handler CA"))
        };
        let ca = Ca::from_pem(&read("handler-ca.crt")?, &read("handler-ca.key")?)?;
        let (cert, key) = ca
            .issue_handler(node, time::Duration::days(7))?
            .write_pair(&self.dir, &format!("virt-handler-{node}"))?;
        Ok(ClientFiles { cert, key })
    }

    /// virt-apiserver flags using these certificates, with `NODE=HOST:PORT` addresses.
    pub fn apiserver_args(&self, addresses: &[(&str, String)]) -> Vec<String> {
        let mut args = vec![
            "--handler-ca".to_string(),
            self.ca.display().to_string(),
            "--handler-client-cert".to_string(),
            self.client.cert.display().to_string(),
            "--handler-client-key".to_string(),
            self.client.key.display().to_string(),
        ];
        for (node, addr) in addresses {
            args.push("--handler-address".to_string());
            args.push(format!("{node}={addr}"));
        }
        args
    }
}
