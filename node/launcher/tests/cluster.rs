//! virt-handler in cluster mode, all parts real: etcd + virt-apiserver (DevEnv), a real
//! virt-launcher started the way its pod starts it (sockets in `<root>/sockets/<uid>/`),
//! real libvirt + QEMU (TCG) with the test guest, and the handler as a separate process
//! (`test-helpers/handler_child.rs`), so that it can be killed with SIGKILL.
//!
//! The virt-apiserver binary: `$VIRT_APISERVER_BIN`, else `target/<profile>/virt-apiserver`
//! (`cargo build -p virt-apiserver`; `cargo test --workspace` builds it).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kubevirt_api::{VirtualMachineInstance, VirtualMachineInstancePhase as Phase};
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use virt_devenv::{DevEnv, Options};

const NS: &str = "default";
const NODE: &str = "node-a";

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn guest_dir() -> PathBuf {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests start a private libvirtd in mount and PID namespaces and need root"
    );
    let dir = virt_testguest::default_dir();
    virt_testguest::ensure(&dir)
        .unwrap_or_else(|e| panic!("cannot build the test guest (cargo xtask guest): {e}"))
        .dir
}

/// Certificates of the handler's mTLS server and of its client (virt-apiserver).
struct Certs {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    /// A client certificate of another CA.
    rogue_cert: PathBuf,
    rogue_key: PathBuf,
}

impl Certs {
    fn generate(dir: &Path) -> Self {
        let validity = time::Duration::days(1);
        let ca = virt_certs::Ca::generate("kubevirt-rs-ca", validity).unwrap();
        let (ca_file, _) = ca.write_pair(dir, "ca").unwrap();
        let (server_cert, server_key) = ca
            .issue_server("virt-handler", &["virt-handler"], validity)
            .unwrap()
            .write_pair(dir, "virt-handler")
            .unwrap();
        let (client_cert, client_key) = ca
            .issue_client("virt-apiserver", &[] as &[&str], validity)
            .unwrap()
            .write_pair(dir, "client")
            .unwrap();
        let other = virt_certs::Ca::generate("someone-else", validity).unwrap();
        let (rogue_cert, rogue_key) = other
            .issue_client("virt-apiserver", &[] as &[&str], validity)
            .unwrap()
            .write_pair(dir, "rogue")
            .unwrap();
        Self {
            ca: ca_file,
            server_cert,
            server_key,
            client_cert,
            client_key,
            rogue_cert,
            rogue_key,
        }
    }
}

struct Env {
    // Children first: they are killed before the API server stops.
    handler: Option<Child>,
    launcher: Option<Child>,
    _api: DevEnv,
    client: Client,
    kubeconfig: PathBuf,
    certs: Certs,
    root: tempfile::TempDir,
    tmp: tempfile::TempDir,
    addr: SocketAddr,
    metrics_addr: SocketAddr,
    ping_secs: u64,
}

impl Drop for Env {
    fn drop(&mut self) {
        for c in [self.handler.as_mut(), self.launcher.as_mut()]
            .into_iter()
            .flatten()
        {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Env {
    async fn start(ping_secs: u64) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let api = tokio::task::spawn_blocking(|| {
            DevEnv::start(Options {
                apiserver_bin: virt_devenv::apiserver_bin_beside_test()
                    .expect("virt-apiserver binary"),
                ..Options::default()
            })
            .expect("start etcd and virt-apiserver (is Debian's etcd-server installed?)")
        })
        .await
        .unwrap();
        let kc = kube::config::Kubeconfig::read_from(&api.kubeconfig).unwrap();
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let certs = Certs::generate(tmp.path());
        // Short: unix socket paths must stay below 108 bytes.
        let root = tempfile::Builder::new().prefix("vh").tempdir().unwrap();
        let port = virt_devenv::free_port().unwrap();
        Self {
            handler: None,
            launcher: None,
            client: Client::try_from(cfg).unwrap(),
            kubeconfig: api.kubeconfig.clone(),
            _api: api,
            certs,
            root,
            tmp,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            metrics_addr: SocketAddr::from(([127, 0, 0, 1], virt_devenv::free_port().unwrap())),
            ping_secs,
        }
    }

    fn vmis(&self) -> Api<VirtualMachineInstance> {
        Api::namespaced(self.client.clone(), NS)
    }

    fn start_handler(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.tmp.path().join("handler.log"))
            .unwrap();
        // A cluster-mode virt-handler in its own process, so that it can be SIGKILLed.
        let child = Command::new(env!("CARGO_BIN_EXE_test-handler-child"))
            .arg("node")
            .env("HANDLER_NODE_NAME", NODE)
            .env("HANDLER_NODE_ROOT", self.root.path())
            .env("HANDLER_KUBECONFIG", &self.kubeconfig)
            .env("HANDLER_TLS_CERT", &self.certs.server_cert)
            .env("HANDLER_TLS_KEY", &self.certs.server_key)
            .env("HANDLER_CLIENT_CA", &self.certs.ca)
            .env("HANDLER_LISTEN", self.addr.to_string())
            .env("HANDLER_PING", self.ping_secs.to_string())
            .env("HANDLER_METRICS", self.metrics_addr.to_string())
            .env("RUST_LOG", "info,virt_handler=debug")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.handler = Some(child);
    }

    fn kill_handler(&mut self) {
        if let Some(mut c) = self.handler.take() {
            c.kill().unwrap(); // SIGKILL
            c.wait().unwrap();
        }
    }

    /// The handler's `/metrics`.
    async fn scrape(&self) -> String {
        reqwest::get(format!("http://{}/metrics", self.metrics_addr))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    fn handler_log(&self) -> String {
        std::fs::read_to_string(self.tmp.path().join("handler.log")).unwrap_or_default()
    }

    /// Creates a VMI and makes it scheduled on our node, as virt-controller would.
    async fn create_vmi(&self, name: &str) -> VirtualMachineInstance {
        let vmi: VirtualMachineInstance = serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "terminationGracePeriodSeconds": 20,
                "domain": {
                    "resources": {"requests": {"memory": "256Mi"}},
                    "firmware": {"kernelBoot": {
                        "kernelArgs": virt_testguest::KERNEL_ARGS,
                        "container": {"image": "guest:latest", "kernelPath": "/vmlinuz", "initrdPath": "/initramfs.gz"}
                    }},
                    // A disk, for the storage metrics (the guest reads its partition table).
                    "devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]}
                },
                "volumes": [{"name": "root", "containerDisk": {"image": "guest:latest"}}]
            }
        }))
        .unwrap();
        let vmi = self
            .vmis()
            .create(&PostParams::default(), &vmi)
            .await
            .unwrap();
        self.vmis()
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Scheduled", "nodeName": NODE}})),
            )
            .await
            .unwrap();
        vmi
    }

    fn uid(vmi: &VirtualMachineInstance) -> String {
        vmi.metadata.uid.clone().unwrap()
    }

    fn socket_dir(&self, uid: &str) -> PathBuf {
        self.root.path().join("sockets").join(uid)
    }

    /// Starts virt-launcher with the arguments its pod gets (cluster-flow.md §2).
    fn start_launcher(&mut self, vmi: &VirtualMachineInstance) {
        let uid = Self::uid(vmi);
        let dir = self.socket_dir(&uid);
        std::fs::create_dir_all(&dir).unwrap();
        let file = self.tmp.path().join(format!("{uid}.json"));
        std::fs::write(&file, serde_json::to_vec(vmi).unwrap()).unwrap();
        let work = self.tmp.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        let log = std::fs::File::create(self.tmp.path().join("launcher.log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_virt-launcher"))
            .arg("--vmi")
            .arg(&file)
            .arg("--cmd-socket")
            .arg(dir.join("cmd.sock"))
            .arg("--console-socket")
            .arg(dir.join("console.sock"))
            .arg("--vnc-socket")
            .arg(dir.join("vnc.sock"))
            .arg("--work-dir")
            .arg(&work)
            .arg("--image-dir")
            .arg(format!("guest:latest={}", guest_dir().display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.launcher = Some(child);
    }

    async fn wait_vmi(
        &self,
        name: &str,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&VirtualMachineInstance) -> bool,
    ) -> VirtualMachineInstance {
        let deadline = Instant::now() + timeout;
        loop {
            let vmi = self.vmis().get(name).await.unwrap();
            if pred(&vmi) {
                return vmi;
            }
            assert!(
                Instant::now() < deadline,
                "VMI never reached {what}; status {:?}\nhandler log:\n{}\nlauncher log:\n{}",
                vmi.status,
                self.handler_log(),
                std::fs::read_to_string(self.tmp.path().join("launcher.log")).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn url(&self, name: &str, tail: &str) -> String {
        format!(
            "https://virt-handler:{}/v1/namespaces/{NS}/virtualmachineinstances/{name}/{tail}",
            self.addr.port()
        )
    }

    fn http(&self, with_cert: Option<(&Path, &Path)>) -> reqwest::Client {
        let ca = reqwest::Certificate::from_pem(&std::fs::read(&self.certs.ca).unwrap()).unwrap();
        let mut b = reqwest::Client::builder()
            .use_rustls_tls()
            .add_root_certificate(ca)
            .resolve("virt-handler", self.addr)
            .timeout(Duration::from_secs(30));
        if let Some((c, k)) = with_cert {
            let mut pem = std::fs::read(c).unwrap();
            pem.extend(std::fs::read(k).unwrap());
            b = b.identity(reqwest::Identity::from_pem(&pem).unwrap());
        }
        b.build().unwrap()
    }

    fn client_http(&self) -> reqwest::Client {
        self.http(Some((&self.certs.client_cert, &self.certs.client_key)))
    }

    async fn put(&self, name: &str, action: &str) -> (u16, serde_json::Value) {
        let r = self
            .client_http()
            .put(self.url(name, action))
            .send()
            .await
            .unwrap();
        let code = r.status().as_u16();
        (code, r.json().await.unwrap_or_default())
    }

    /// Opens a console (or VNC) websocket over mTLS.
    async fn ws(&self, name: &str, tail: &str) -> Ws {
        let mut roots = rustls::RootCertStore::empty();
        use rustls_pki_types::pem::PemObject;
        for c in rustls_pki_types::CertificateDer::pem_file_iter(&self.certs.ca).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let certs = rustls_pki_types::CertificateDer::pem_file_iter(&self.certs.client_cert)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = rustls_pki_types::PrivateKeyDer::from_pem_file(&self.certs.client_key).unwrap();
        let cfg = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_client_auth_cert(certs, key)
            .unwrap();
        let tcp = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
            .connect("virt-handler".try_into().unwrap(), tcp)
            .await
            .unwrap();
        let mut req = self
            .url(name, tail)
            .replace("https://", "wss://")
            .into_client_request()
            .unwrap();
        req.headers_mut().insert(
            "Sec-WebSocket-Protocol",
            "plain.kubevirt.io".parse().unwrap(),
        );
        let (ws, resp) = tokio_tungstenite::client_async(req, tls).await.unwrap();
        assert_eq!(
            resp.headers()
                .get("Sec-WebSocket-Protocol")
                .and_then(|v| v.to_str().ok()),
            Some("plain.kubevirt.io"),
            "subprotocol echoed"
        );
        // A reader task keeps reading, which is also what answers the server's pings.
        let (mut sink, mut stream) = ws.split();
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let (in_tx, mut in_rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    m = stream.next() => match m {
                        Some(Ok(m)) => { if tx.send(m).is_err() { return } }
                        _ => return,
                    },
                    b = in_rx.recv() => match b {
                        Some(b) => { if sink.send(Message::Binary(b.into())).await.is_err() { return } }
                        None => { let _ = sink.close().await; return }
                    },
                }
            }
        });
        Ws {
            rx,
            tx: in_tx,
            seen: String::new(),
            pings: 0,
            close: None,
        }
    }
}

struct Ws {
    rx: tokio::sync::mpsc::UnboundedReceiver<Message>,
    tx: tokio::sync::mpsc::UnboundedSender<Vec<u8>>,
    seen: String,
    pings: u32,
    close: Option<String>,
}

impl Ws {
    fn send(&self, s: &str) {
        self.tx.send(s.as_bytes().to_vec()).unwrap();
    }

    /// Reads until `needle` appears in the output (after what was seen so far is cleared).
    async fn expect(&mut self, needle: &str, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        while !self.seen.contains(needle) {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(m)) => self.take(m),
                Ok(None) => panic!("websocket closed; seen {:?}", self.seen),
                Err(_) => panic!(
                    "{needle:?} not seen within {timeout:?}; seen {:?}",
                    self.seen
                ),
            }
        }
        self.seen.clear();
    }

    fn take(&mut self, m: Message) {
        match m {
            Message::Binary(b) => self.seen.push_str(&String::from_utf8_lossy(&b)),
            Message::Ping(_) => self.pings += 1,
            Message::Close(f) => {
                self.close = Some(f.map(|f| f.reason.to_string()).unwrap_or_default())
            }
            _ => {}
        }
    }

    /// Reads for `d`, collecting output, pings and a close frame.
    async fn drain(&mut self, d: Duration) {
        let deadline = tokio::time::Instant::now() + d;
        while let Ok(Some(m)) = tokio::time::timeout_at(deadline, self.rx.recv()).await {
            self.take(m);
        }
    }

    /// Waits for the session to end; the close reason.
    async fn closed(&mut self, timeout: Duration) -> String {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.rx.recv()).await {
                Ok(Some(m)) => self.take(m),
                Ok(None) => return self.close.clone().unwrap_or_default(),
                Err(_) => panic!("session not closed within {timeout:?}"),
            }
        }
    }

    /// Runs `echo $((6*7))` in the guest shell and expects 42.
    async fn answers_42(&mut self) {
        self.send("\n");
        self.expect(virt_testguest::PROMPT, Duration::from_secs(60))
            .await;
        self.send("echo $((6*7))\n");
        self.expect("\n42", Duration::from_secs(20)).await;
    }
}

fn cond(vmi: &VirtualMachineInstance, t: &str) -> Option<String> {
    vmi.status
        .as_ref()
        .and_then(|s| s.condition(t))
        .map(|c| format!("{:?}", c.status))
}

fn phase(vmi: &VirtualMachineInstance) -> Phase {
    vmi.status.as_ref().map(|s| s.phase).unwrap_or_default()
}

/// Live processes whose command line contains all of `needles`.
fn processes(needles: &[&str]) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if needles.iter().all(|n| cmd.contains(n)) && virt_handler::pid_alive(pid) {
            out.push(pid);
        }
    }
    out
}

fn qemu_of(domain: &str) -> Vec<u32> {
    processes(&["qemu-system", &format!("guest={domain},")])
}

/// No QEMU of `domain` and no libvirtd of the launcher's work directory are left.
async fn assert_nothing_left(domain: &str, work: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let work = work.display().to_string();
    loop {
        let (q, l) = (qemu_of(domain), processes(&["libvirtd", &work]));
        if q.is_empty() && l.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "left behind: QEMU {q:?}, libvirtd {l:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_mode_end_to_end() {
    let _g = SERIAL.lock().await;
    let mut env = Env::start(15).await;
    // Per-process, so that the "nothing left" check never sees another run's QEMU.
    let name = &format!("cl-{}", std::process::id());
    let domain = format!("{NS}_{name}");
    let vmi = env.create_vmi(name).await;
    env.start_handler();

    // Launcher start → VMI Running, written by the handler.
    let t0 = Instant::now();
    env.start_launcher(&vmi);
    let running = env
        .wait_vmi(name, "Running", Duration::from_secs(120), |v| {
            phase(v) == Phase::Running
        })
        .await;
    eprintln!("launcher start → VMI Running: {:?}", t0.elapsed());
    assert_eq!(cond(&running, "Ready").as_deref(), Some("True"));
    assert_eq!(cond(&running, "SoftwareEmulation").as_deref(), Some("True"));
    let st = running.status.clone().unwrap();
    let versions = st.runtime_versions.clone().unwrap_or_default();
    assert!(versions.launcher.is_some());
    assert!(versions.qemu.is_some());
    assert_eq!(
        st.node_name.as_deref(),
        Some(NODE),
        "controller fields kept"
    );
    let qemu = qemu_of(&domain);
    assert_eq!(qemu.len(), 1, "one QEMU");

    // The console over mTLS: the guest's shell answers.
    let mut console = env.ws(name, "console").await;
    console.answers_42().await;

    // KubeVirt's per-VMI metrics, read from the launcher's libvirt at the scrape. The
    // guest's own memory figures come once its balloon driver reported (every 10 s).
    let vmi_labels = format!("node=\"{NODE}\",namespace=\"{NS}\",name=\"{name}\"");
    let t0 = Instant::now();
    let text = loop {
        let text = env.scrape().await;
        if text.contains("kubevirt_vmi_memory_available_bytes{")
            || t0.elapsed() > Duration::from_secs(40)
        {
            break text;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    for family in [
        "kubevirt_vmi_cpu_usage_seconds_total",
        "kubevirt_vmi_cpu_user_usage_seconds_total",
        "kubevirt_vmi_cpu_system_usage_seconds_total",
        "kubevirt_vmi_memory_resident_bytes",
        "kubevirt_vmi_memory_domain_bytes",
        "kubevirt_vmi_memory_actual_balloon_bytes",
        "kubevirt_vmi_memory_available_bytes",
        "kubevirt_vmi_memory_usable_bytes",
        "kubevirt_vmi_memory_unused_bytes",
    ] {
        let series = format!("{family}{{{vmi_labels}");
        let value = text
            .lines()
            .find(|l| l.starts_with(&series))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{text}"));
        assert!(value > 0.0, "{series}: {value}");
    }
    // The domain has the VMI's 256Mi.
    assert!(
        text.contains(&format!(
            "kubevirt_vmi_memory_domain_bytes{{{vmi_labels}}} 268435456"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "kubevirt_vmi_vcpu_seconds_total{{{vmi_labels},id=\"0\",state=\"running\"}}"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "kubevirt_vmi_vcpu_wait_seconds_total{{{vmi_labels},id=\"0\"}}"
        )),
        "{text}"
    );
    // The disk is labelled with the VMI's name for it, not libvirt's `vda`.
    for family in [
        "kubevirt_vmi_storage_iops_read_total",
        "kubevirt_vmi_storage_read_traffic_bytes_total",
        "kubevirt_vmi_storage_read_times_seconds_total",
    ] {
        let series = format!("{family}{{{vmi_labels},drive=\"root\"}} ");
        let value = text
            .lines()
            .find_map(|l| l.strip_prefix(&series)?.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{text}"));
        assert!(value > 0.0, "{series}: {value}");
    }
    for family in [
        "kubevirt_vmi_storage_iops_write_total",
        "kubevirt_vmi_storage_write_traffic_bytes_total",
        "kubevirt_vmi_storage_write_times_seconds_total",
        "kubevirt_vmi_storage_flush_requests_total",
        "kubevirt_vmi_storage_flush_times_seconds_total",
    ] {
        let series = format!("{family}{{{vmi_labels},drive=\"root\"}} ");
        assert!(text.contains(&series), "no {series} in\n{text}");
    }
    eprintln!(
        "{} kubevirt_vmi_* series of one VMI",
        text.lines()
            .filter(|l| l.starts_with("kubevirt_vmi_"))
            .count()
    );

    // A read-only observer sees output without taking over; a second writer takes over.
    let mut observer = env.ws(name, "console?readOnly=true").await;
    console.send("echo obs$((1+1))\n");
    console.expect("obs2", Duration::from_secs(20)).await;
    observer.expect("obs2", Duration::from_secs(20)).await;
    let mut second = env.ws(name, "console").await;
    let reason = console.closed(Duration::from_secs(10)).await;
    assert_eq!(reason, virt_handler::server::TAKEN_OVER);
    second.answers_42().await;
    observer.expect("\n42", Duration::from_secs(20)).await;
    // Input of an observer goes nowhere.
    observer.send("echo nope$((2+2))\n");
    second.drain(Duration::from_secs(2)).await;
    assert!(
        !second.seen.contains("nope4"),
        "observer input reached the guest"
    );
    drop(observer);

    // VNC: RFB greeting through the websocket; a second session takes over.
    let mut vnc = env.ws(name, "vnc").await;
    vnc.expect("RFB 003.008", Duration::from_secs(10)).await;
    // preserveSession=true does not take over: 503 (KubeVirt's "Active VNC connection").
    let r = env
        .client_http()
        .get(env.url(name, "vnc?preserveSession=true"))
        .header("Connection", "Upgrade")
        .header("Upgrade", "websocket")
        .header("Sec-WebSocket-Version", "13")
        .header("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 503);
    let mut vnc2 = env.ws(name, "vnc").await;
    vnc2.expect("RFB 003.008", Duration::from_secs(10)).await;
    assert_eq!(
        vnc.closed(Duration::from_secs(10)).await,
        virt_handler::server::TAKEN_OVER
    );
    drop(vnc2);

    // softreboot: the guest boots again (banner on the console).
    assert_eq!(env.put(name, "softreboot").await, (200, json!({})));
    second
        .expect(virt_testguest::BANNER, Duration::from_secs(60))
        .await;
    // reset: the reset button, the guest boots again without shutting down.
    assert_eq!(env.put(name, "reset").await, (200, json!({})));
    second
        .expect(virt_testguest::BANNER, Duration::from_secs(60))
        .await;

    // pause / unpause through the handler → conditions in the API.
    assert_eq!(env.put(name, "pause").await, (200, json!({})));
    let paused = env
        .wait_vmi(name, "Paused", Duration::from_secs(20), |v| {
            cond(v, "Paused").as_deref() == Some("True")
        })
        .await;
    assert_eq!(cond(&paused, "Ready").as_deref(), Some("False"));
    let (code, body) = env.put(name, "pause").await;
    assert_eq!(code, 409, "{body}");
    assert_eq!(body["kind"], "Status");
    assert_eq!(body["code"], 409);
    assert_eq!(env.put(name, "unpause").await, (200, json!({})));
    env.wait_vmi(name, "unpaused", Duration::from_secs(20), |v| {
        cond(v, "Paused").is_none() && cond(v, "Ready").as_deref() == Some("True")
    })
    .await;
    let (code, body) = env.put("nope", "pause").await;
    assert_eq!(code, 404, "{body}");
    assert_eq!(body["reason"], "NotFound");

    // Clients without a certificate, or with one of another CA, are refused.
    for (what, c) in [
        ("no certificate", env.http(None)),
        (
            "certificate of another CA",
            env.http(Some((&env.certs.rogue_cert, &env.certs.rogue_key))),
        ),
    ] {
        let r = c.put(env.url(name, "pause")).send().await;
        assert!(r.is_err(), "client with {what} was served: {r:?}");
    }

    // kill -9 of the handler and a new one: the guest keeps running, nothing changes,
    // and the console works again.
    drop(second);
    env.kill_handler();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(qemu_of(&domain), qemu, "the guest must survive its handler");
    let t1 = Instant::now();
    env.start_handler();
    let mut again = loop {
        // The new handler needs a moment to list the VMIs.
        if env
            .client_http()
            .put(env.url(name, "unpause"))
            .send()
            .await
            .is_ok_and(|r| r.status() == 409)
        {
            break env.ws(name, "console").await;
        }
        assert!(
            t1.elapsed() < Duration::from_secs(30),
            "restarted handler never served"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!("handler restart → serving: {:?}", t1.elapsed());
    again.answers_42().await;
    let v = env.vmis().get(name).await.unwrap();
    assert_eq!(phase(&v), Phase::Running);
    assert_eq!(qemu_of(&domain), qemu, "not restarted");
    // The re-adopted launcher is followed: pause shows up.
    assert_eq!(env.put(name, "pause").await, (200, json!({})));
    env.wait_vmi(name, "Paused after restart", Duration::from_secs(20), |v| {
        cond(v, "Paused").as_deref() == Some("True")
    })
    .await;
    assert_eq!(env.put(name, "unpause").await, (200, json!({})));
    drop(again);

    // kill -9 of the launcher → Failed with the reason; its QEMU and libvirtd die with it.
    let mut launcher = env.launcher.take().unwrap();
    launcher.kill().unwrap();
    launcher.wait().unwrap();
    let t2 = Instant::now();
    let failed = env
        .wait_vmi(name, "Failed", Duration::from_secs(30), |v| {
            phase(v) == Phase::Failed
        })
        .await;
    eprintln!("launcher kill -9 → VMI Failed: {:?}", t2.elapsed());
    let st = failed.status.unwrap();
    let reason = st.reason.clone().unwrap_or_default();
    assert!(reason.contains("LauncherDied"), "reason: {reason}");
    let phases: Vec<Phase> = st
        .phase_transition_timestamps
        .unwrap_or_default()
        .iter()
        .map(|t| t.phase)
        .collect();
    assert!(
        phases.ends_with(&[Phase::Running, Phase::Failed]),
        "phase stamps {phases:?}"
    );
    // Metrics of the second handler (plain HTTP, no client certificate).
    let text = reqwest::get(format!("http://{}/metrics", env.metrics_addr))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for needle in [
        "kubevirt_handler_launchers_gone_total 1",
        "kubevirt_handler_requests_total{action=\"pause\",code=\"200\"} 1",
        "kubevirt_handler_status_writes_total{result=\"success\"}",
    ] {
        assert!(text.contains(needle), "{needle} missing in\n{text}");
    }
    assert_nothing_left(&domain, &env.tmp.path().join("work")).await;

    // The VMI goes away: the handler forgets it (its socket directory is the launcher
    // pod's emptyDir in a cluster, removed by kubelet with the pod, not by the handler).
    env.vmis()
        .delete(name, &DeleteParams::default())
        .await
        .unwrap();
}

/// A console left idle for longer than two ping intervals stays open (pings answered)
/// and still works; the guest shuts down cleanly → Succeeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_console_survives_on_pings() {
    let _g = SERIAL.lock().await;
    // 15 s pings as in production: ≥ 40 s idle means at least two pings answered.
    let mut env = Env::start(15).await;
    // Per-process, so that the "nothing left" check never sees another run's QEMU.
    let name = &format!("idle-{}", std::process::id());
    let domain = format!("{NS}_{name}");
    let vmi = env.create_vmi(name).await;
    env.start_handler();
    env.start_launcher(&vmi);
    env.wait_vmi(name, "Running", Duration::from_secs(120), |v| {
        phase(v) == Phase::Running
    })
    .await;
    let mut console = env.ws(name, "console").await;
    console.answers_42().await;
    console.drain(Duration::from_secs(42)).await;
    assert!(console.pings >= 2, "pings seen: {}", console.pings);
    assert!(console.close.is_none(), "closed: {:?}", console.close);
    console.answers_42().await;

    // A clean end: the launcher's SIGTERM (pod deletion) → ACPI → Succeeded.
    let pid = env.launcher.as_ref().unwrap().id();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    env.wait_vmi(name, "Succeeded", Duration::from_secs(60), |v| {
        phase(v) == Phase::Succeeded
    })
    .await;
    let reason = console.closed(Duration::from_secs(30)).await;
    assert_eq!(reason, "console connection closed");
    let mut l = env.launcher.take().unwrap();
    let st = l.wait().unwrap();
    assert!(st.success(), "launcher exit: {st}");
    // The launcher left its outcome for a handler that might have missed the event.
    let outcome = std::fs::read_to_string(
        env.socket_dir(&Env::uid(&vmi))
            .join(virt_domain::protocol::OUTCOME_FILE),
    )
    .unwrap();
    assert_eq!(outcome, r#"{"outcome":"shutDown"}"#);
    assert_nothing_left(&domain, &env.tmp.path().join("work")).await;
}
