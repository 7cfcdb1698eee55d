//! Helpers shared by the cluster e2e tests of VMs (vm_lifecycle.rs, plugin.rs): a namespace
//! per test, the test guest's VM manifest, `kubectl virt` on PATH, a console in tmux.

// The helpers below serve only the tests: a failure is a test failure. Each test binary
// uses a different subset.
#![allow(clippy::expect_used, clippy::unwrap_used, dead_code)]

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use e2e::Cluster;

/// How long a VM may take to boot: image copy, a cold QEMU capabilities probe (~10 s once per
/// node), TCG boot of the tiny guest, on a machine shared with builds.
pub const BOOT: Duration = Duration::from_secs(240);
/// Deletions: the launcher's ACPI shutdown waits out the VMI's grace period (5 s below).
pub const GONE: Duration = Duration::from_secs(120);
pub const TEST_GUEST: &str = "localhost/kubevirt-rs/test-guest:latest";

/// The cluster with two nodes (live migration, cross-node traffic): brings the local one
/// up with two nodes unless KUBECONFIG names another, deploys kubevirt-rs, and fails when
/// fewer than two nodes are there.
pub fn two_node_cluster() -> &'static Cluster {
    static TWO: OnceLock<()> = OnceLock::new();
    TWO.get_or_init(|| {
        if std::env::var_os("KUBECONFIG").is_none() {
            e2e::xtask(&["cluster", "up", "--nodes", "2"]).expect("cluster up --nodes 2");
        }
    });
    let c = Cluster::with_kubevirt().expect("cluster with kubevirt-rs deployed");
    let nodes = c.kubectl(&["get", "nodes", "-o", "name"]).expect("nodes");
    assert!(
        nodes.lines().count() >= 2,
        "needs two nodes (cargo xtask cluster up --nodes 2); have:\n{nodes}"
    );
    c
}

pub fn cluster() -> &'static Cluster {
    Cluster::with_kubevirt().expect("cluster with kubevirt-rs deployed")
}

/// A namespace of its own per test, deleted at the end (without waiting).
pub struct Ns<'a> {
    pub c: &'a Cluster,
    pub name: String,
}

impl<'a> Ns<'a> {
    pub fn new(c: &'a Cluster, prefix: &str) -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let name = format!("e2e-{prefix}-{}-{nanos:x}", std::process::id());
        c.kubectl(&["create", "namespace", &name])
            .expect("namespace");
        Ns { c, name }
    }

    pub fn k(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut a = vec!["-n", self.name.as_str()];
        a.extend_from_slice(args);
        self.c.kubectl(&a)
    }

    /// `kubectl virt ARGS` in this namespace (the plugin on PATH).
    pub fn virt(&self, args: &[&str]) -> String {
        // kubectl takes no flags before a plugin's name: KUBECONFIG, and -n after it.
        let out = Command::new(self.c.kubectl_path())
            .env("PATH", plugin_path())
            .env("KUBECONFIG", &self.c.kubeconfig)
            .arg("virt")
            .args(args)
            .args(["-n", &self.name])
            .output()
            .expect("running kubectl virt");
        assert!(
            out.status.success(),
            "kubectl virt {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl virt ARGS` in this namespace: exit code, stdout, stderr.
    pub fn virt_result(&self, args: &[&str]) -> (Option<i32>, String, String) {
        let mut a = args.to_vec();
        a.extend(["-n", self.name.as_str()]);
        kubectl_virt(self.c, &a)
    }

    pub fn apply_vm(&self, name: &str, run_strategy: &str) {
        self.apply_guest(name, run_strategy, &Guest::default());
    }

    pub fn apply_guest(&self, name: &str, run_strategy: &str, guest: &Guest) {
        self.c
            .kubectl_stdin(
                &["apply", "-f", "-"],
                Some(&vm_manifest(name, &self.name, run_strategy, guest)),
            )
            .expect("apply VM");
    }

    /// A jsonpath of an object: "" when kubectl succeeded and the object does not exist,
    /// an error (kubectl's stderr) when kubectl failed, e.g. a 503 of the aggregated API.
    pub fn try_get(&self, kind: &str, name: &str, jsonpath: &str) -> anyhow::Result<String> {
        self.k(&[
            "get",
            kind,
            name,
            "--ignore-not-found",
            "-o",
            &format!("jsonpath={jsonpath}"),
        ])
    }

    /// [`Self::try_get`] for tests: a failed kubectl call fails the test with its stderr,
    /// so that an API that errors never reads as "the object is gone".
    pub fn get(&self, kind: &str, name: &str, jsonpath: &str) -> String {
        self.try_get(kind, name, jsonpath)
            .unwrap_or_else(|e| panic!("{e:#}"))
    }

    pub fn vmi_phase(&self, name: &str) -> String {
        self.get("vmi", name, "{.status.phase}")
    }

    pub fn vmi_uid(&self, name: &str) -> String {
        self.get("vmi", name, "{.metadata.uid}")
    }

    pub fn vm_status(&self, name: &str) -> String {
        self.get("vm", name, "{.status.printableStatus}")
    }

    /// The VM's launcher pods; a failed kubectl call fails the test (never "no pods").
    pub fn launcher_pods(&self, vm: &str) -> Vec<String> {
        self.k(&[
            "get",
            "pods",
            "-l",
            &format!("kubevirt.io=virt-launcher,vm.kubevirt.io/name={vm}"),
            "-o",
            "name",
        ])
        .unwrap_or_else(|e| panic!("{e:#}"))
        .lines()
        .map(str::to_string)
        .collect()
    }

    /// What the cluster says about a VM that did not get where it should: for the failure message.
    pub fn diagnose(&self, vm: &str) -> String {
        let mut out = String::new();
        for args in [
            vec!["get", "vm,vmi,pods", "-o", "wide"],
            vec!["get", "vmi", vm, "-o", "yaml"],
            vec!["get", "virtualmachineinstancemigrations", "-o", "yaml"],
            vec!["describe", "pods"],
            vec![
                "logs",
                "-l",
                "kubevirt.io=virt-launcher",
                "--all-containers",
                "--tail=40",
            ],
            vec!["get", "events", "--sort-by=.lastTimestamp"],
        ] {
            match self.k(&args) {
                Ok(s) => out.push_str(&s),
                Err(e) => out.push_str(&format!("{e:#}\n")),
            }
        }
        // The replica that acts is the Lease holder (`deployment/...` picks any pod, often
        // the standby), and what it said about this VM matters more than its last lines.
        let leader = self
            .c
            .kubectl(&[
                "-n",
                "kubevirt",
                "get",
                "lease",
                "virt-controller",
                "-o",
                "jsonpath={.spec.holderIdentity}",
            ])
            .unwrap_or_default();
        let controller = match leader.trim() {
            "" => "deployment/virt-controller".to_string(),
            pod => format!("pod/{pod}"),
        };
        out.push_str(&format!(
            "--- {controller} (the Lease holder), lines about {vm}:\n"
        ));
        match self
            .c
            .kubectl(&["-n", "kubevirt", "logs", &controller, "--tail=2000"])
        {
            Ok(s) => {
                let about: Vec<&str> = s.lines().filter(|l| l.contains(vm)).collect();
                out.push_str(&about[about.len().saturating_sub(40)..].join("\n"));
                out.push_str(&format!("\n--- {controller}, last lines:\n"));
                let all: Vec<&str> = s.lines().collect();
                out.push_str(&all[all.len().saturating_sub(30)..].join("\n"));
                out.push('\n');
            }
            Err(e) => out.push_str(&format!("{e:#}\n")),
        }
        match self.c.kubectl(&[
            "-n",
            "kubevirt",
            "logs",
            "-l",
            "app.kubernetes.io/name=virt-handler",
            "--prefix",
            "--tail=30",
        ]) {
            Ok(s) => out.push_str(&s),
            Err(e) => out.push_str(&format!("{e:#}\n")),
        }
        out
    }

    pub fn wait(&self, vm: &str, what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
        if let Err(e) = self.c.eventually(what, timeout, || Ok(f())) {
            panic!("{e:#}\n{}", self.diagnose(vm));
        }
    }

    pub fn wait_running(&self, vm: &str) {
        self.wait(vm, &format!("VMI {vm} Running"), BOOT, || {
            self.vmi_phase(vm) == "Running"
        });
    }

    /// VMI and launcher pod gone, VM status Stopped.
    pub fn wait_stopped(&self, vm: &str) {
        self.wait(vm, &format!("VM {vm} stopped"), GONE, || {
            self.vmi_uid(vm).is_empty()
                && self.launcher_pods(vm).is_empty()
                && self.vm_status(vm) == "Stopped"
        });
    }
}

impl Drop for Ns<'_> {
    fn drop(&mut self) {
        let _ = self
            .c
            .kubectl(&["delete", "namespace", &self.name, "--wait=false"]);
    }
}

/// How the test guest behaves, through its kernel command line (node/testguest's init).
#[derive(Default)]
pub struct Guest {
    /// `kubevirt-rs.poweroff-after=N`: powers itself off cleanly N s after the banner.
    pub poweroff_after: Option<u32>,
    /// `kubevirt-rs.panic-after=N`: its kernel panics N s after the banner.
    pub panic_after: Option<u32>,
    /// An ISA panic device, so that the panic reaches libvirt (`on_crash`) as a crash.
    pub panic_device: bool,
}

impl Guest {
    pub fn kernel_args(&self) -> String {
        let mut args = virt_testguest::KERNEL_ARGS.to_string();
        if let Some(n) = self.poweroff_after {
            args.push_str(&format!(" kubevirt-rs.poweroff-after={n}"));
        }
        if let Some(n) = self.panic_after {
            args.push_str(&format!(" kubevirt-rs.panic-after={n}"));
        }
        args
    }

    pub fn devices(&self) -> serde_json::Value {
        if self.panic_device {
            serde_json::json!({"panicDevices": [{"model": "isa"}]})
        } else {
            serde_json::json!({})
        }
    }
}

pub fn vm_manifest(name: &str, ns: &str, run_strategy: &str, guest: &Guest) -> String {
    serde_json::json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": "e2e"}},
        "spec": {
            "runStrategy": run_strategy,
            "template": {"spec": {
                // The busybox guest ignores the ACPI button: a short grace keeps stops quick.
                "terminationGracePeriodSeconds": 5,
                "domain": {
                    "memory": {"guest": "128Mi"},
                    "devices": guest.devices(),
                    "firmware": {"kernelBoot": {
                        "kernelArgs": guest.kernel_args(),
                        "container": {
                            "image": TEST_GUEST,
                            "imagePullPolicy": "IfNotPresent",
                            "kernelPath": "/vmlinuz",
                            "initrdPath": "/initramfs.gz"
                        }
                    }}
                }
            }}
        }
    })
    .to_string()
}

/// A VMI of the test guest with extra `disks` and `volumes` (kernel boot from the guest
/// image, 128 MiB, no grace period).
pub fn guest_vmi(
    ns: &str,
    name: &str,
    disks: serde_json::Value,
    volumes: serde_json::Value,
) -> String {
    serde_json::json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "domain": {
                "memory": {"guest": "128Mi"},
                "devices": {"disks": disks},
                "firmware": {"kernelBoot": {
                    "kernelArgs": virt_testguest::KERNEL_ARGS,
                    "container": {
                        "image": TEST_GUEST,
                        "imagePullPolicy": "IfNotPresent",
                        "kernelPath": "/vmlinuz",
                        "initrdPath": "/initramfs.gz"
                    }
                }}
            },
            "volumes": volumes
        }
    })
    .to_string()
}

pub fn workspace_target() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(t) => e2e::workspace_root().join(t),
        None => e2e::workspace_root().join("target"),
    }
}

/// `kubectl virt ARGS` as given (no namespace added): exit code, stdout, stderr.
pub fn kubectl_virt(c: &Cluster, args: &[&str]) -> (Option<i32>, String, String) {
    // kubectl takes no flags before a plugin's name: KUBECONFIG, and -n after it.
    let out = Command::new(c.kubectl_path())
        .env("PATH", plugin_path())
        .env("KUBECONFIG", &c.kubeconfig)
        .arg("virt")
        .args(args)
        .output()
        .expect("running kubectl virt");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// PATH with the freshly built `kubectl-virt` first (built once per test binary).
pub fn plugin_path() -> String {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        // The same cargo invocation as the dev-profile image build (xtask/binaries.txt):
        // with another package list cargo resolves features differently and each build
        // recompiles what the other just built.
        let mut cmd = e2e::cargo();
        cmd.arg("build");
        for (package, bin) in include_str!("../../../xtask/binaries.txt")
            .lines()
            .filter_map(|l| l.trim().split_once(' '))
        {
            cmd.args(["-p", package, "--bin", bin]);
        }
        let status = cmd
            .current_dir(e2e::workspace_root())
            .status()
            .expect("cargo build -p kubectl-virt");
        assert!(status.success(), "cargo build -p kubectl-virt failed");
    });
    format!(
        "{}:{}",
        workspace_target().join("debug").display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// tmux on a server of this test process's own (`-L`): test binaries run side by side, and
/// on one shared server a binary's last session ending lets the server exit just as another
/// binary asks it for a new session ("server exited unexpectedly").
fn tmux() -> Command {
    let mut c = Command::new("tmux");
    c.args(["-L", &format!("e2e-{}", std::process::id())]);
    c
}

/// `kubectl virt console` in a detached tmux session: keys in, screen out.
pub struct Console {
    pub session: String,
}

impl Console {
    pub fn open(ns: &Ns<'_>, vmi: &str) -> Console {
        // Unique per console: a test may open a second one on the same VMI (after a migration).
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let session = format!("e2e-console-{}-{vmi}-{n}", std::process::id());
        let _ = tmux().args(["kill-session", "-t", &session]).output();
        let cmd = format!(
            "exec env PATH='{}' KUBECONFIG='{}' '{}' virt console '{vmi}' -n '{}'",
            plugin_path(),
            ns.c.kubeconfig.display(),
            ns.c.kubectl_path().display(),
            ns.name,
        );
        // This process's server may still be exiting after its last session ended: asked
        // again, a new one starts.
        let mut tries = 0;
        let out = loop {
            let out = tmux()
                .args(["new-session", "-d", "-x", "160", "-y", "50", "-s", &session])
                .arg(&cmd)
                .output()
                .expect("tmux (apt-get install tmux)");
            tries += 1;
            if out.status.success()
                || tries == 5
                || !String::from_utf8_lossy(&out.stderr).contains("server exited")
            {
                break out;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        assert!(
            out.status.success(),
            "tmux: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Keep the pane after the plugin exits, to see that it did.
        let _ = tmux()
            .args(["set-option", "-t", &session, "remain-on-exit", "on"])
            .output();
        Console { session }
    }

    pub fn screen(&self) -> String {
        let out = tmux()
            .args([
                "capture-pane",
                "-p",
                "-J",
                "-S",
                "-200",
                "-t",
                &self.session,
            ])
            .output()
            .expect("tmux capture-pane");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Types text (literally) and Enter.
    pub fn line(&self, text: &str) {
        let ok = tmux()
            .args(["send-keys", "-t", &self.session, "-l", text])
            .status()
            .expect("tmux send-keys")
            .success()
            && tmux()
                .args(["send-keys", "-t", &self.session, "Enter"])
                .status()
                .expect("tmux send-keys")
                .success();
        assert!(ok, "tmux send-keys failed");
    }

    /// Empties the pane and its history: what [`Console::expect`] sees next is new.
    pub fn clear(&self) {
        let ok = tmux()
            .args(["send-keys", "-R", "-t", &self.session])
            .status()
            .is_ok_and(|s| s.success())
            && tmux()
                .args(["clear-history", "-t", &self.session])
                .status()
                .is_ok_and(|s| s.success());
        assert!(ok, "tmux could not clear the console pane");
    }

    pub fn key(&self, key: &str) {
        assert!(
            tmux()
                .args(["send-keys", "-t", &self.session, key])
                .status()
                .expect("tmux send-keys")
                .success()
        );
    }

    pub fn exited(&self) -> bool {
        tmux()
            .args(["list-panes", "-t", &self.session, "-F", "#{pane_dead}"])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "1")
    }

    /// Waits until the screen shows `text`.
    pub fn expect(&self, ns: &Ns<'_>, vm: &str, text: &str, timeout: Duration) {
        if let Err(e) =
            ns.c.eventually(&format!("console showing {text:?}"), timeout, || {
                Ok(self.screen().contains(text))
            })
        {
            panic!("{e:#}\nscreen:\n{}\n{}", self.screen(), ns.diagnose(vm));
        }
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        let _ = tmux().args(["kill-session", "-t", &self.session]).output();
    }
}

/// Presses Enter until the guest's shell shows its prompt: a VMI is Running before its
/// guest has booted, and keys typed before the shell starts are lost.
pub fn wait_for_shell(console: &Console, ns: &Ns<'_>, vm: &str) {
    let prompt = virt_testguest::PROMPT.trim();
    let mut last_enter: Option<std::time::Instant> = None;
    if let Err(e) = ns.c.eventually("the guest's shell prompt", BOOT, || {
        if console.screen().contains(prompt) {
            return Ok(true);
        }
        if last_enter.is_none_or(|t| t.elapsed() >= Duration::from_secs(3)) {
            console.line("");
            last_enter = Some(std::time::Instant::now());
        }
        Ok(false)
    }) {
        panic!("{e:#}\nscreen:\n{}\n{}", console.screen(), ns.diagnose(vm));
    }
}

/// Runs `echo $((a*b))` in the guest (once its shell is up) and waits for the product on
/// its own line.
pub fn compute(console: &Console, ns: &Ns<'_>, vm: &str, a: u32, b: u32) {
    wait_for_shell(console, ns, vm);
    console.line(&format!("echo $(({a}*{b}))"));
    let want = format!("\n{}", a * b);
    if let Err(e) =
        ns.c.eventually("the guest's answer", Duration::from_secs(60), || {
            Ok(console.screen().contains(&want))
        })
    {
        panic!("{e:#}\nscreen:\n{}\n{}", console.screen(), ns.diagnose(vm));
    }
}

/// Every VMI state a namespace goes through, from `kubectl get vmi -w -o json`: states that
/// last less than a poll interval (a failed VMI that the controller deletes at once) are seen.
pub struct VmiWatch {
    pub child: std::process::Child,
    pub out: PathBuf,
}

/// One observed state: uid, phase, reason.
#[derive(Debug)]
pub struct Seen {
    pub uid: String,
    pub phase: String,
    pub reason: String,
}

impl VmiWatch {
    pub fn start(ns: &Ns<'_>) -> VmiWatch {
        let out = std::env::temp_dir().join(format!("{}-vmi-watch.json", ns.name));
        let file = std::fs::File::create(&out).expect("watch output file");
        let child = Command::new(ns.c.kubectl_path())
            .env("KUBECONFIG", &ns.c.kubeconfig)
            .args(["-n", &ns.name, "get", "vmi", "-w", "-o", "json"])
            .stdout(file)
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("kubectl get vmi -w");
        VmiWatch { child, out }
    }

    pub fn seen(&self) -> Vec<Seen> {
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        serde_json::Deserializer::from_str(&text)
            .into_iter::<serde_json::Value>()
            .map_while(Result::ok)
            .map(|v| {
                let s = |p: &str| {
                    v.pointer(p)
                        .and_then(|x| x.as_str())
                        .unwrap_or("")
                        .to_string()
                };
                Seen {
                    uid: s("/metadata/uid"),
                    phase: s("/status/phase"),
                    reason: s("/status/reason"),
                }
            })
            .collect()
    }
}

impl Drop for VmiWatch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.out);
    }
}

/// Long enough for a wrong restart decision to show (the controller reacts within a second).
pub const SETTLE: Duration = Duration::from_secs(20);

/// `kubectl virt ARGS -n NS` as a command to run.
pub fn plugin(ns: &Ns<'_>, args: &[&str]) -> Command {
    let mut cmd = Command::new(ns.c.kubectl_path());
    cmd.env("PATH", plugin_path())
        .env("KUBECONFIG", &ns.c.kubeconfig)
        .arg("virt")
        .args(args)
        .args(["-n", &ns.name]);
    cmd
}

/// Waits until the guest's web server answers through a fresh `--stdio` forward (the VMI
/// is Running before the guest has booted and started it).
pub fn page_via_stdio(ns: &Ns<'_>, vm: &str) -> String {
    let start = Instant::now();
    loop {
        let mut child = plugin(ns, &["port-forward", "--stdio", &format!("vm/{vm}"), "80"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl virt port-forward --stdio");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"GET / HTTP/1.0\r\n\r\n")
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let page = String::from_utf8_lossy(&out.stdout).into_owned();
        if page.contains("kubevirt-rs guest") {
            return page;
        }
        assert!(
            start.elapsed() < BOOT,
            "no page through port-forward --stdio: {page}\nstderr: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            ns.diagnose(vm)
        );
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// What [`ApiProbe`] saw.
#[derive(Debug, Default)]
pub struct ProbeReport {
    /// Rounds (one write and one read of the VM API) that succeeded.
    pub ok: u64,
    /// Rounds that failed (each request tried once, with a 10 s timeout).
    pub failed: u64,
    /// The longest time from a failed round to the next one that succeeded.
    pub longest_outage: Duration,
    /// The first few failures.
    pub errors: Vec<String>,
}

/// Writes (a merge patch of a label) and reads a VM through kube-apiserver every 200 ms
/// until stopped, with the cluster's admin credentials, one request per operation and no
/// retry: how long the VM API was unavailable is measured, not hidden.
pub struct ApiProbe {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<ProbeReport>>,
}

impl ApiProbe {
    pub fn start(ns: &Ns<'_>, vm: &str) -> ApiProbe {
        let raw =
            ns.c.kubectl(&["config", "view", "--raw", "--minify", "-o", "json"])
                .expect("kubeconfig");
        let cfg: serde_json::Value = serde_json::from_str(&raw).unwrap();
        let b64 = |v: &serde_json::Value| {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD
                .decode(v.as_str().expect("inline kubeconfig data"))
                .unwrap()
        };
        let server = cfg["clusters"][0]["cluster"]["server"]
            .as_str()
            .unwrap()
            .to_string();
        let ca = b64(&cfg["clusters"][0]["cluster"]["certificate-authority-data"]);
        let mut identity = b64(&cfg["users"][0]["user"]["client-certificate-data"]);
        identity.extend(b64(&cfg["users"][0]["user"]["client-key-data"]));
        let url = format!(
            "{server}/apis/kubevirt.io/v1/namespaces/{}/virtualmachines/{vm}",
            ns.name
        );
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let client = reqwest::Client::builder()
                    .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
                    .identity(reqwest::Identity::from_pem(&identity).unwrap())
                    .use_rustls_tls()
                    .timeout(Duration::from_secs(10))
                    .build()
                    .unwrap();
                let mut report = ProbeReport::default();
                let mut down_since: Option<Instant> = None;
                let mut i = 0u64;
                while !stopped.load(std::sync::atomic::Ordering::Relaxed) {
                    i += 1;
                    let patch =
                        serde_json::json!({"metadata": {"labels": {"probe": i.to_string()}}});
                    let write = client
                        .patch(&url)
                        .header("content-type", "application/merge-patch+json")
                        .body(patch.to_string())
                        .send()
                        .await;
                    let read = client.get(&url).send().await;
                    let failure = match (write, read) {
                        (Ok(w), Ok(r)) if w.status().is_success() && r.status().is_success() => {
                            None
                        }
                        (Ok(w), _) if !w.status().is_success() => Some(format!(
                            "patch: {} {}",
                            w.status(),
                            w.text().await.unwrap_or_default()
                        )),
                        (Err(e), _) => Some(format!("patch: {e}")),
                        (_, Ok(r)) => Some(format!(
                            "get: {} {}",
                            r.status(),
                            r.text().await.unwrap_or_default()
                        )),
                        (_, Err(e)) => Some(format!("get: {e}")),
                    };
                    match failure {
                        None => {
                            report.ok += 1;
                            if let Some(t) = down_since.take() {
                                report.longest_outage = report.longest_outage.max(t.elapsed());
                            }
                        }
                        Some(e) => {
                            report.failed += 1;
                            down_since.get_or_insert_with(Instant::now);
                            if report.errors.len() < 10 {
                                report.errors.push(e);
                            }
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                if let Some(t) = down_since {
                    report.longest_outage = report.longest_outage.max(t.elapsed());
                    report
                        .errors
                        .push("still failing when the probe stopped".into());
                }
                report
            })
        });
        ApiProbe {
            stop,
            thread: Some(thread),
        }
    }

    pub fn stop(mut self) -> ProbeReport {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for ApiProbe {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// The path, through kube-apiserver's pod proxy, of the `/metrics` of `node`'s virt-handler
/// (what a cluster's Prometheus scrapes, reached with the admin's credentials).
pub fn handler_metrics_path(c: &e2e::Cluster, node: &str) -> String {
    let pod = c
        .component_pods(
            "virt-handler",
            true,
            &format!("{{.items[?(@.spec.nodeName==\"{node}\")].metadata.name}}"),
        )
        .expect("virt-handler pods");
    let pod = pod.trim();
    assert!(!pod.is_empty(), "no virt-handler on {node}");
    pod_metrics_path(c, pod)
}

/// The kube-apiserver proxy path of the `/metrics` of kubevirt-rs pod `pod` (its container's
/// port named `metrics`).
pub fn pod_metrics_path(c: &e2e::Cluster, pod: &str) -> String {
    let port = c
        .kubectl(&[
            "-n",
            "kubevirt",
            "get",
            "pod",
            pod,
            "-o",
            "jsonpath={.spec.containers[0].ports[?(@.name==\"metrics\")].containerPort}",
        ])
        .expect("metrics port");
    format!(
        "/api/v1/namespaces/kubevirt/pods/{pod}:{}/proxy/metrics",
        port.trim()
    )
}

/// The value of the first series of `family` in the text `metrics` whose labels include
/// every `key="value"` of `want`.
pub fn series_value(metrics: &str, family: &str, want: &[String]) -> Option<f64> {
    metrics.lines().find_map(|l| {
        let rest = l.strip_prefix(family)?.strip_prefix('{')?;
        let (set, v) = rest.rsplit_once("} ")?;
        let have: Vec<&str> = set.split(',').collect();
        want.iter()
            .all(|w| have.contains(&w.as_str()))
            .then(|| v.trim().parse::<f64>().ok())
            .flatten()
    })
}
