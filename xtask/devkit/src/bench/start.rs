//! `cargo xtask bench start`: KubeVirt's density workload on the local cluster. VMs of the
//! test guest are created `--interval-ms` apart (KubeVirt: 100 VMs, 100 ms, after one primer
//! VM); measured per VM from the client's create request: VMI `Running` (seen on a watch)
//! and the guest answering on `kubectl virt console` (its banner, or its prompt when the
//! console attached after the banner went by). API writes per VMI start come from
//! virt-apiserver's `apiserver_request_total` (and kube-apiserver's for pods), controller
//! memory from /proc (the local cluster's containers run on this machine).
//!
//! The count is capped by what fits: launcher pod requests (read from the primer's pod)
//! against the nodes' allocatable minus what other pods request, and against this
//! machine's available memory, since every node of the local cluster shares it.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use super::report::{self, percentile};
use super::section::{self, Provenance, Section};

pub(super) mod debian;
pub(super) mod steps;
use steps::{Step, Timeline};

const TEST_GUEST: &str = "localhost/kubevirt-rs/test-guest:latest";
/// Memory this machine keeps for everything else (builds of the other users, the cluster).
const HOST_RESERVE: u64 = 3 << 30;

/// Arguments of `cargo xtask bench start`.
#[derive(clap::Args, Debug, Clone)]
pub struct StartArgs {
    /// Single VMs started one at a time, each against bare QEMU booting the same guest,
    /// alternating (the start-latency breakdown); 0 skips them.
    #[arg(long, default_value_t = 5)]
    pub single_runs: usize,
    /// Which guest: `busybox` (the default: single runs, burst, density; the section "VM
    /// start") or `debian`, the Debian 12 test guest (docs/real-guests.md): create → SSH and
    /// → `AgentConnected` against bare QEMU, an address → the status, and what following
    /// the guest agent costs (its own section).
    #[arg(long, value_enum, default_value_t = Guest::Busybox)]
    pub guest: Guest,
    /// With `--guest debian`: runs of each side (cluster, bare QEMU), alternating.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// With `--guest debian`: the last Debian VM then idles this long with its guest agent,
    /// and as long again with the agent stopped in the guest (the CPU following the agent
    /// costs); 0 skips it.
    #[arg(long, default_value_t = 300)]
    pub agent_idle_seconds: u64,
    /// VMs of the burst after the single runs, created `--burst-interval-ms` apart; 0
    /// skips it.
    #[arg(long, default_value_t = 10)]
    pub burst: usize,
    /// Pause between two creations of the burst.
    #[arg(long, default_value_t = 100)]
    pub burst_interval_ms: u64,
    /// VMs of the density run after the burst (fewer when they do not fit; the reason is
    /// printed and recorded); 0 skips it.
    #[arg(long, default_value_t = 100)]
    pub vms: usize,
    /// Pause between two creations.
    #[arg(long, default_value_t = 100)]
    pub interval_ms: u64,
    /// Guest memory of each VM (KubeVirt's density VMs: 90Mi).
    #[arg(long, default_value = "90Mi")]
    pub guest_memory: String,
    /// CPU request of each VM (KubeVirt's: 100m; 100 of those need 10 CPUs).
    #[arg(long, default_value = "10m")]
    pub cpu_request: String,
    /// Give up waiting after this many seconds.
    #[arg(long, default_value_t = 1200)]
    pub timeout_seconds: u64,
    /// Kubeconfig of the cluster (default: $KUBECONFIG, then the local cluster's).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Leave the VMs running afterwards (namespace bench-start).
    #[arg(long)]
    pub keep: bool,
    /// Only print the figures; leave docs/benchmarks.md alone.
    #[arg(long)]
    pub no_docs: bool,
}

/// The guest `bench start` boots.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guest {
    /// The busybox test guest (kernel + initramfs): the start pipeline itself.
    Busybox,
    /// The Debian 12 test guest: systemd, cloud-init, qemu-guest-agent, OpenSSH.
    Debian,
}

/// Requests of one launcher pod, and what the cluster and the machine have left.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fit {
    /// Memory request of one launcher pod, bytes.
    pub pod_memory: u64,
    /// CPU request of one launcher pod, cores.
    pub pod_cpu: f64,
    /// Allocatable memory of the schedulable nodes minus what pods request, bytes.
    pub free_memory: u64,
    /// Allocatable CPU minus requests, cores.
    pub free_cpu: f64,
    /// This machine's MemAvailable minus [`HOST_RESERVE`], bytes.
    pub host_memory: u64,
}

/// How many more launcher pods fit, and what limits them.
pub fn fitting(f: &Fit) -> (usize, &'static str) {
    let by = |free: f64, each: f64| {
        if each <= 0.0 {
            usize::MAX
        } else {
            (free / each).floor().max(0.0) as usize
        }
    };
    let limits = [
        (
            by(f.free_memory as f64, f.pod_memory as f64),
            "node allocatable memory",
        ),
        (by(f.free_cpu, f.pod_cpu), "node allocatable CPU"),
        (
            by(f.host_memory as f64, f.pod_memory as f64),
            "this machine's available memory (all nodes share it)",
        ),
    ];
    limits
        .into_iter()
        .min_by_key(|(n, _)| *n)
        .unwrap_or((0, "nothing"))
}

/// Sum of the counter samples of `metric` whose labels contain every `key="value"` of
/// `labels` and, when `verbs` is not empty, a `verb` among them.
pub fn counter_sum(text: &str, metric: &str, labels: &[(&str, &str)], verbs: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix(metric)?;
            let (lbls, value) = match rest.strip_prefix('{') {
                Some(r) => r.split_once('}')?,
                None => ("", rest),
            };
            let has = |k: &str, v: &str| lbls.split(',').any(|p| p == format!("{k}=\"{v}\""));
            if !labels.iter().all(|(k, v)| has(k, v)) {
                return None;
            }
            if !verbs.is_empty() && !verbs.iter().any(|v| has("verb", v)) {
                return None;
            }
            value.split_whitespace().next()?.parse::<f64>().ok()
        })
        .sum()
}

/// P50/P95/P99/max of a sample, in seconds.
pub fn quantiles(samples: &[Duration]) -> String {
    let mut s = samples.to_vec();
    s.sort_unstable();
    let f = |d: Option<Duration>| d.map_or("n/a".into(), |d| format!("{:.1} s", d.as_secs_f64()));
    format!(
        "{} | {} | {} | {}",
        f(percentile(&s, 50.0)),
        f(percentile(&s, 95.0)),
        f(percentile(&s, 99.0)),
        f(s.last().copied())
    )
}

struct Kube {
    kubectl: PathBuf,
    kubeconfig: PathBuf,
}

impl Kube {
    fn cmd(&self) -> Command {
        let mut c = Command::new(&self.kubectl);
        c.env("KUBECONFIG", &self.kubeconfig);
        c
    }

    fn run(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = self
            .cmd()
            .args(args)
            .output()
            .with_context(|| format!("running {}", self.kubectl.display()))?;
        if !out.status.success() {
            bail!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn json(&self, args: &[&str]) -> anyhow::Result<Value> {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        let text = self.run(&a)?;
        serde_json::from_str(&text).context("kubectl output is not JSON")
    }

    fn create(&self, manifest: &str) -> anyhow::Result<()> {
        let mut child = self
            .cmd()
            .args(["create", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("kubectl create")?;
        child
            .stdin
            .take()
            .context("kubectl stdin")?
            .write_all(manifest.as_bytes())?;
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!("kubectl create: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }
}

fn kubectl_binary() -> PathBuf {
    std::fs::read_dir(crate::target_dir().join("k8s"))
        .ok()
        .and_then(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.path().join("bin/kubectl"))
                .find(|p| p.exists())
        })
        .unwrap_or_else(|| PathBuf::from("kubectl"))
}

fn vm_manifest(name: &str, ns: &str, args: &StartArgs) -> String {
    manifest(name, ns, &args.guest_memory, &args.cpu_request)
}

fn s2(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// Bare QEMU's memory ([`virt_testguest::BareVm`]): the latency runs' guests get the same.
const LATENCY_GUEST_MEMORY: &str = "256Mi";

fn manifest(name: &str, ns: &str, memory: &str, cpu: &str) -> String {
    json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": ns, "labels": {"bench": "start"}},
        "spec": {
            "runStrategy": "Always",
            "template": {"spec": {
                "terminationGracePeriodSeconds": 5,
                "domain": {
                    "memory": {"guest": memory},
                    "resources": {"requests": {"cpu": cpu}},
                    "devices": {},
                    "firmware": {"kernelBoot": {
                        "kernelArgs": virt_testguest::KERNEL_ARGS,
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

/// When each VMI was first seen Running, from `kubectl get vmi -w`.
struct RunningWatch {
    child: Child,
    seen: Arc<Mutex<BTreeMap<String, Instant>>>,
}

impl RunningWatch {
    fn start(kube: &Kube, ns: &str) -> anyhow::Result<Self> {
        let mut child = kube
            .cmd()
            .args(["-n", ns, "get", "vmi", "-w", "-o", "json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("kubectl get vmi -w")?;
        let stdout = child.stdout.take().context("watch stdout")?;
        let seen = Arc::new(Mutex::new(BTreeMap::new()));
        let sink = seen.clone();
        std::thread::spawn(move || {
            for v in serde_json::Deserializer::from_reader(stdout).into_iter::<Value>() {
                let Ok(v) = v else { break };
                let now = Instant::now();
                let name = v.pointer("/metadata/name").and_then(Value::as_str);
                let phase = v.pointer("/status/phase").and_then(Value::as_str);
                if let (Some(name), Some("Running")) = (name, phase)
                    && let Ok(mut m) = sink.lock()
                {
                    m.entry(name.to_string()).or_insert(now);
                }
            }
        });
        Ok(Self { child, seen })
    }

    fn get(&self, name: &str) -> Option<Instant> {
        self.seen.lock().ok()?.get(name).copied()
    }
}

impl Drop for RunningWatch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `kubectl-virt console NAME`: when the guest first answered (banner or prompt).
struct ConsoleProbe {
    child: Child,
    answered: Arc<Mutex<Option<(Instant, bool)>>>,
}

impl ConsoleProbe {
    fn start(plugin: &Path, kubeconfig: &Path, ns: &str, name: &str) -> anyhow::Result<Self> {
        let mut child = Command::new(plugin)
            .env("KUBECONFIG", kubeconfig)
            .args(["console", name, "-n", ns, "--timeout", "30"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("kubectl-virt console")?;
        let mut stdout = child.stdout.take().context("console stdout")?;
        let mut stdin = child.stdin.take().context("console stdin")?;
        let answered = Arc::new(Mutex::new(None));
        let sink = answered.clone();
        std::thread::spawn(move || {
            let mut text = Vec::new();
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let now = Instant::now();
                text.extend_from_slice(&buf[..n]);
                let has = |s: &str| text.windows(s.len()).any(|w| w == s.as_bytes());
                let banner = has(virt_testguest::BANNER);
                if banner || has(virt_testguest::PROMPT.trim()) {
                    if let Ok(mut a) = sink.lock() {
                        a.get_or_insert((now, banner));
                    }
                    break;
                }
            }
        });
        // Enter every 2 s brings a prompt once the console attached after the banner.
        let done = answered.clone();
        std::thread::spawn(move || {
            while done.lock().map(|a| a.is_none()).unwrap_or(false) {
                if stdin.write_all(b"\r").and_then(|()| stdin.flush()).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_secs(2));
            }
        });
        Ok(Self { child, answered })
    }

    fn get(&self) -> Option<(Instant, bool)> {
        *self.answered.lock().ok()?
    }

    /// The plugin ended without the guest answering (a dropped connection or its own
    /// `--timeout` on a loaded machine): the probe must be started again.
    fn gave_up(&mut self) -> bool {
        self.get().is_none() && matches!(self.child.try_wait(), Ok(Some(_)))
    }
}

impl Drop for ConsoleProbe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// RSS (bytes) of every process named `comm`, by PID.
/// (pid, RSS in bytes) of every process a launcher pod runs: QEMU, libvirt's daemon and
/// its reaper, the launcher, the console-log tail, and each image copier (busybox `sh`
/// and the `cat` it waits in, which reads the launcher's lifeline). comm names stop at 15
/// characters.
fn launcher_pod_processes() -> Vec<(u32, u64)> {
    let mut all: Vec<(u32, u64)> = [
        "qemu-system-x86",
        "libvirtd",
        "virtlogd",
        "virt-launcher",
        "virt-reaper",
        "virt-tail",
        "busybox",
    ]
    .iter()
    .flat_map(|c| rss_of(c))
    .collect();
    all.extend(rss_of("cat").into_iter().filter(|(pid, _)| {
        std::fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains("/var/run/kubevirt-rs/life/"))
    }));
    all
}

fn rss_of(comm: &str) -> Vec<(u32, u64)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let c = std::fs::read_to_string(e.path().join("comm")).ok()?;
            if c.trim() != comm {
                return None;
            }
            let status = std::fs::read_to_string(e.path().join("status")).ok()?;
            Some((pid, report::proc_kib(&status, "VmRSS")? * 1024))
        })
        .collect()
}

fn quantity_bytes(v: Option<&Value>) -> u64 {
    v.and_then(Value::as_str)
        .and_then(|s| kubevirt_api::quantity::parse_bytes(s).ok())
        .unwrap_or(0)
}

fn quantity_cores(v: Option<&Value>) -> f64 {
    v.and_then(Value::as_str)
        .and_then(|s| kubevirt_api::quantity::parse(s).ok())
        .unwrap_or(0.0)
}

/// Memory and CPU requests of a pod (its containers; init containers run before them).
fn pod_requests(pod: &Value) -> (u64, f64) {
    let containers = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    containers.iter().fold((0, 0.0), |(m, c), ct| {
        let r = ct.pointer("/resources/requests");
        (
            m + quantity_bytes(r.and_then(|r| r.get("memory"))),
            c + quantity_cores(r.and_then(|r| r.get("cpu"))),
        )
    })
}

fn measure_fit(kube: &Kube, launcher: &Value) -> anyhow::Result<Fit> {
    let (pod_memory, pod_cpu) = pod_requests(launcher);
    let nodes = kube.json(&["get", "nodes"])?;
    let mut free_memory: i128 = 0;
    let mut free_cpu = 0.0;
    for n in nodes["items"].as_array().into_iter().flatten() {
        if n.pointer("/spec/unschedulable").and_then(Value::as_bool) == Some(true) {
            continue;
        }
        let a = n.pointer("/status/allocatable");
        free_memory += i128::from(quantity_bytes(a.and_then(|a| a.get("memory"))));
        free_cpu += quantity_cores(a.and_then(|a| a.get("cpu")));
    }
    let pods = kube.json(&["get", "pods", "-A"])?;
    for p in pods["items"].as_array().into_iter().flatten() {
        let phase = p.pointer("/status/phase").and_then(Value::as_str);
        if matches!(phase, Some("Succeeded" | "Failed")) {
            continue;
        }
        let (m, c) = pod_requests(p);
        free_memory -= i128::from(m);
        free_cpu -= c;
    }
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let available = report::proc_kib(&meminfo, "MemAvailable").unwrap_or(0) * 1024;
    Ok(Fit {
        pod_memory,
        pod_cpu,
        free_memory: u64::try_from(free_memory.max(0)).unwrap_or(0),
        free_cpu: free_cpu.max(0.0),
        host_memory: available.saturating_sub(HOST_RESERVE),
    })
}

/// virt-apiserver's metrics, straight from its pod with the local cluster's admin client
/// certificate (kube-apiserver's pod proxy carries no user, which virt-apiserver refuses).
fn apiserver_metrics(kube: &Kube) -> anyhow::Result<String> {
    let ip = kube.run(&[
        "-n",
        "kubevirt",
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=kubevirt-apiserver",
        "--field-selector",
        "status.phase=Running",
        "-o",
        "jsonpath={.items[0].status.podIP}",
    ])?;
    let ip = ip.trim();
    if ip.is_empty() {
        bail!("no running virt-apiserver pod");
    }
    let pki = crate::target_dir().join("cluster/state/pki");
    // The server certificate is for the Service name, not the pod IP: -k, on our own bridge.
    let out = Command::new("curl")
        .args(["-sSfk", "--max-time", "10", "--cert"])
        .arg(pki.join("admin.crt"))
        .arg("--key")
        .arg(pki.join("admin.key"))
        .arg(format!("https://{ip}:8443/metrics"))
        .output()
        .context("curl (apt-get install curl)")?;
    if !out.status.success() {
        bail!(
            "GET https://{ip}:8443/metrics: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Writes counted per VMI start.
#[derive(Clone, Copy, Debug, Default)]
struct Writes {
    vmis: f64,
    /// UPDATE + PATCH only: the basis of KubeVirt's published figure.
    vmi_updates: f64,
    vms: f64,
    pods: f64,
}

const WRITE_VERBS: &[&str] = &["create", "update", "patch", "delete"];
const KUBE_WRITE_VERBS: &[&str] = &["POST", "PUT", "PATCH", "APPLY", "DELETE"];

fn writes(ours: &str, kube: &str) -> Writes {
    Writes {
        vmis: counter_sum(
            ours,
            "apiserver_request_total",
            &[("resource", "virtualmachineinstances")],
            WRITE_VERBS,
        ),
        vmi_updates: counter_sum(
            ours,
            "apiserver_request_total",
            &[("resource", "virtualmachineinstances")],
            &["update", "patch"],
        ),
        vms: counter_sum(
            ours,
            "apiserver_request_total",
            &[("resource", "virtualmachines")],
            WRITE_VERBS,
        ),
        pods: counter_sum(
            kube,
            "apiserver_request_total",
            &[("resource", "pods")],
            KUBE_WRITE_VERBS,
        ),
    }
}

fn snapshot(kube: &Kube) -> anyhow::Result<Writes> {
    let ours = apiserver_metrics(kube).context("virt-apiserver metrics")?;
    let theirs = kube.run(&["get", "--raw", "/metrics"])?;
    Ok(writes(&ours, &theirs))
}

/// The plugin as users install it (a release build), built if needed.
pub(super) fn plugin_binary() -> anyhow::Result<PathBuf> {
    let status = xtask::cargo()
        .args([
            "build",
            "--release",
            "-p",
            "kubectl-virt",
            "--bin",
            "kubectl-virt",
        ])
        .current_dir(crate::workspace_root())
        .status()
        .context("cargo build -p kubectl-virt")?;
    if !status.success() {
        bail!("building kubectl-virt failed");
    }
    Ok(crate::target_dir().join("release/kubectl-virt"))
}

/// Waits until `f` holds, polling every second.
fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while !f() {
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    Ok(())
}

fn launcher_pods(kube: &Kube, ns: &str) -> anyhow::Result<Vec<Value>> {
    let v = kube.json(&["-n", ns, "get", "pods", "-l", "kubevirt.io=virt-launcher"])?;
    Ok(v["items"].as_array().cloned().unwrap_or_default())
}

/// Deletes VMs and waits until their launcher pods are gone: the next measurement starts on
/// an idle cluster.
fn delete_vms(kube: &Kube, ns: &str, names: &[String], timeout: Duration) -> anyhow::Result<()> {
    let mut args = vec!["-n", ns, "delete", "vm", "--wait=false"];
    args.extend(names.iter().map(String::as_str));
    kube.run(&args)?;
    wait_for("the launcher pods gone", timeout, || {
        launcher_pods(kube, ns).is_ok_and(|pods| {
            !pods.iter().any(|p| {
                p.pointer("/metadata/labels/vm.kubevirt.io~1name")
                    .and_then(Value::as_str)
                    .is_some_and(|n| names.iter().any(|m| m == n))
            })
        })
    })
}

/// Single VMs against bare QEMU, alternating, then a burst: the body's latency part, and
/// whether the goals were met.
fn latency(kube: &Kube, ns: &str, args: &StartArgs, timeout: Duration) -> anyhow::Result<String> {
    if args.single_runs == 0 && args.burst == 0 {
        return Ok(String::new());
    }
    let guest = virt_testguest::ensure(&virt_testguest::default_dir())
        .context("the test guest for bare QEMU (cargo xtask guest)")?;
    let watches = steps::Watches::start(kube, ns)?;
    let mut singles: Vec<Timeline> = Vec::new();
    let (mut bare_first, mut bare_banner) = (Vec::new(), Vec::new());
    for i in 0..args.single_runs {
        for side in if i % 2 == 0 { [0, 1] } else { [1, 0] } {
            if side == 0 {
                let name = format!("single-{i}");
                let created = std::time::SystemTime::now();
                kube.create(&manifest(
                    &name,
                    ns,
                    LATENCY_GUEST_MEMORY,
                    &args.cpu_request,
                ))?;
                let tl = steps::collect(kube, ns, &watches, &name, created, timeout)?;
                eprintln!(
                    "single {i}: first console byte {:.2} s after the create, banner {:.2} s",
                    tl.since_create(Step::FirstOutput)
                        .unwrap_or_default()
                        .as_secs_f64(),
                    tl.since_create(Step::Banner)
                        .unwrap_or_default()
                        .as_secs_f64()
                );
                singles.push(tl);
                delete_vms(kube, ns, &[name], timeout)?;
            } else {
                let vm = virt_testguest::BareVm::start(&guest, &[], &[], "")?;
                let first = vm.wait_first_output(Duration::from_secs(60))?;
                let banner = vm.wait_for(virt_testguest::BANNER, Duration::from_secs(60))?;
                eprintln!(
                    "bare {i}: first console byte {:.2} s after the spawn, banner {:.2} s",
                    first.as_secs_f64(),
                    banner.as_secs_f64()
                );
                bare_first.push(first);
                bare_banner.push(banner);
            }
        }
    }
    let mut burst: Vec<Timeline> = Vec::new();
    if args.burst > 0 {
        let names: Vec<String> = (0..args.burst).map(|i| format!("burst-{i:02}")).collect();
        let t0 = Instant::now();
        let mut created = Vec::new();
        let mut creators = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let k = Kube {
                kubectl: kube.kubectl.clone(),
                kubeconfig: kube.kubeconfig.clone(),
            };
            let m = manifest(name, ns, LATENCY_GUEST_MEMORY, &args.cpu_request);
            created.push(std::time::SystemTime::now());
            creators.push(std::thread::spawn(move || k.create(&m)));
            let next = t0 + Duration::from_millis(args.burst_interval_ms * (i as u64 + 1));
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
        for c in creators {
            c.join()
                .map_err(|_| anyhow::anyhow!("a creating thread panicked"))??;
        }
        for (name, at) in names.iter().zip(&created) {
            burst.push(steps::collect(kube, ns, &watches, name, *at, timeout)?);
        }
        delete_vms(kube, ns, &names, timeout)?;
    }
    drop(watches);

    let med = |v: &[Duration]| {
        let mut v = v.to_vec();
        v.sort();
        percentile(&v, 50.0).unwrap_or_default()
    };
    let bb = med(&bare_banner);
    // The guest is `quiet`: its first console output is its banner. Bare QEMU has no VGA,
    // so SeaBIOS prints to its serial port first; the launcher's domain has a display, so
    // SeaBIOS does not. Firmware chatter is no start, so the goals compare the banner.
    let since = |tls: &[Timeline], step: Step| -> Vec<Duration> {
        tls.iter().filter_map(|t| t.since_create(step)).collect()
    };
    let met = |ok: bool| if ok { "met" } else { "not met" };
    let mut s = String::new();
    if args.single_runs > 0 {
        let sb = med(&since(&singles, Step::Banner));
        s.push_str(&format!(
            "### One VM at a time ({} runs, each against bare QEMU, alternating)\n\n{}\n\
             | bare QEMU (same kernel, initramfs and memory, TCG, no libvirt, no VGA) | from the spawn, median (min–max) |\n\
             |---|---|\n\
             | first console byte (SeaBIOS) | {} |\n\
             | guest ready: its banner | {} |\n\n\
             Goal: create → guest ready ≤ bare QEMU's spawn → guest ready + 1.0 s: {} vs {} + 1.0 s, {} (gap {:+.2} s).\n\n",
            args.single_runs,
            steps::single_table(&singles),
            steps::median_range(&bare_first),
            steps::median_range(&bare_banner),
            s2(sb),
            s2(bb),
            met(sb <= bb + Duration::from_secs(1)),
            sb.as_secs_f64() - bb.as_secs_f64(),
        ));
    }
    if args.burst > 0 {
        let mut b = since(&burst, Step::Banner);
        b.sort();
        let p95 = percentile(&b, 95.0).unwrap_or_default();
        s.push_str(&format!(
            "### A burst: {} VMs created {} ms apart\n\n{}\n\
             Goal: P95 of create → guest ready ≤ bare QEMU's median + 2.0 s: {} vs {} + 2.0 s, {}.\n\n",
            args.burst,
            args.burst_interval_ms,
            steps::burst_table(&burst),
            s2(p95),
            s2(bb),
            met(p95 <= bb + Duration::from_secs(2)),
        ));
    }
    Ok(s)
}

/// Deletes the benchmark's namespace when dropped (without waiting), unless `--keep`.
struct NamespaceGuard<'a> {
    kube: Kube,
    ns: &'a str,
    keep: bool,
}

impl Drop for NamespaceGuard<'_> {
    fn drop(&mut self) {
        if !self.keep {
            let _ = self
                .kube
                .run(&["delete", "namespace", self.ns, "--wait=false"]);
        }
    }
}

pub fn run(args: StartArgs) -> anyhow::Result<()> {
    let kubeconfig = args
        .kubeconfig
        .clone()
        .or_else(|| std::env::var_os("KUBECONFIG").map(PathBuf::from))
        .unwrap_or_else(|| crate::target_dir().join("cluster/kubeconfig"));
    let kube = Kube {
        kubectl: kubectl_binary(),
        kubeconfig: kubeconfig.clone(),
    };
    if args.guest == Guest::Debian {
        return run_debian(&kube, &args);
    }
    let plugin = plugin_binary()?;
    let ns = "bench-start";
    // Taken before the run: the figures belong to the code and machine at its start.
    let provenance = Provenance::probe(args.command());
    let timeout = Duration::from_secs(args.timeout_seconds);
    if kube
        .run(&["get", "namespace", ns, "--ignore-not-found", "-o", "name"])?
        .trim()
        != ""
    {
        eprintln!("deleting the namespace {ns} of an earlier run…");
        kube.run(&["delete", "namespace", ns, "--wait=false"])?;
        // Creating in a namespace that is still terminating is refused: wait until it is gone.
        wait_for("the old namespace gone", timeout, || {
            kube.run(&["get", "namespace", ns, "--ignore-not-found", "-o", "name"])
                .is_ok_and(|o| o.trim().is_empty())
        })?;
    }
    kube.run(&["create", "namespace", ns])?;
    // On any early return too: no VMs left running for the next user of the cluster.
    let _cleanup = NamespaceGuard {
        kube: Kube {
            kubectl: kube.kubectl.clone(),
            kubeconfig: kubeconfig.clone(),
        },
        ns,
        keep: args.keep,
    };

    // The primer (as in KubeVirt's job): warms the image and QEMU caches, and its pod says
    // what each VM requests.
    eprintln!("primer VM…");
    kube.create(&vm_manifest("primer", ns, &args))?;
    wait_for("the primer VMI Running", timeout, || {
        kube.run(&[
            "-n",
            ns,
            "get",
            "vmi",
            "primer",
            "-o",
            "jsonpath={.status.phase}",
        ])
        .is_ok_and(|p| p == "Running")
    })?;
    let latency_body = latency(&kube, ns, &args, timeout)?;
    let latency_note = "Latency runs: one VM at a time (the primer running), each alternating with \
         bare QEMU booting the same kernel and initramfs with the same memory on this machine; \
         then a burst. Times on one clock: the client's watches for API objects (when the \
         client saw them), the kubelet's log timestamps for the launcher's steps and the guest's \
         console (the `guest-console-log` container copies what QEMU writes to the serial \
         port). A step seen by a watch can come after a later step's log line: its own \
         duration then counts as zero.";
    if args.vms == 0 {
        print!("{latency_body}");
        let section = Section::new(
            section::START,
            provenance,
            format!("{latency_note}\n\n{latency_body}"),
        );
        return super::record(&section, args.no_docs);
    }
    let primer_pod = launcher_pods(&kube, ns)?
        .into_iter()
        .next()
        .context("the primer's launcher pod")?;
    let fit = measure_fit(&kube, &primer_pod)?;
    let (fits, limit) = fitting(&fit);
    let count = args.vms.min(fits);
    let fit_note = format!(
        "each launcher pod requests {} memory and {:.0}m CPU; free: {} memory and {:.2} CPUs \
         allocatable, {} on this machine beyond a {} reserve → {fits} fit (limit: {limit})",
        report::bytes(fit.pod_memory),
        fit.pod_cpu * 1000.0,
        report::bytes(fit.free_memory),
        fit.free_cpu,
        report::bytes(fit.host_memory),
        report::bytes(HOST_RESERVE),
    );
    eprintln!("{fit_note}; creating {count} VMs");
    if count == 0 {
        bail!("no VM fits: {fit_note}");
    }

    let before = snapshot(&kube)?;
    let watch = RunningWatch::start(&kube, ns)?;
    let mut created: Vec<(String, Instant)> = Vec::with_capacity(count);
    // A console per VM once its VMI runs: earlier, 100 plugins polling for their VMI would
    // load the API servers the benchmark measures.
    let mut probes: Vec<Option<ConsoleProbe>> = (0..count).map(|_| None).collect();
    let mut creators = Vec::with_capacity(count);
    let mut rss_peak: BTreeMap<&str, u64> = BTreeMap::new();
    let sample_rss = |peak: &mut BTreeMap<&str, u64>| {
        for comm in ["virt-controller", "virt-apiserver", "virt-handler"] {
            let max = rss_of(comm).into_iter().map(|(_, r)| r).max().unwrap_or(0);
            let e = peak.entry(comm).or_insert(0);
            *e = (*e).max(max);
        }
    };
    let start_probes = |created: &[(String, Instant)],
                        probes: &mut [Option<ConsoleProbe>]|
     -> anyhow::Result<()> {
        for ((name, _), probe) in created.iter().zip(probes.iter_mut()) {
            // A retried probe sees the prompt, not the banner: its time is an upper bound.
            if probe.as_mut().is_some_and(ConsoleProbe::gave_up) {
                *probe = None;
            }
            if probe.is_none() && watch.get(name).is_some() {
                *probe = Some(ConsoleProbe::start(&plugin, &kubeconfig, ns, name)?);
            }
        }
        Ok(())
    };
    let t0 = Instant::now();
    for i in 0..count {
        let name = format!("vm-{i:03}");
        let manifest = vm_manifest(&name, ns, &args);
        let at = Instant::now();
        created.push((name.clone(), at));
        let k = Kube {
            kubectl: kube.kubectl.clone(),
            kubeconfig: kubeconfig.clone(),
        };
        creators.push(std::thread::spawn(move || k.create(&manifest)));
        let next = t0 + Duration::from_millis(args.interval_ms * (i as u64 + 1));
        start_probes(&created, &mut probes)?;
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    for c in creators {
        c.join()
            .map_err(|_| anyhow::anyhow!("a creating thread panicked"))??;
    }
    eprintln!("{count} VMs created in {:.1} s", t0.elapsed().as_secs_f64());

    let deadline = Instant::now() + timeout;
    let mut last_report = Instant::now();
    let mut last_sample = Instant::now();
    loop {
        if last_sample.elapsed() >= Duration::from_secs(1) {
            sample_rss(&mut rss_peak);
            last_sample = Instant::now();
        }
        start_probes(&created, &mut probes)?;
        let running = created
            .iter()
            .filter(|(n, _)| watch.get(n).is_some())
            .count();
        let answered = probes
            .iter()
            .filter(|p| p.as_ref().is_some_and(|p| p.get().is_some()))
            .count();
        if running == count && answered == count {
            break;
        }
        if Instant::now() > deadline {
            eprintln!("timed out: {running}/{count} Running, {answered}/{count} answered");
            break;
        }
        if last_report.elapsed() > Duration::from_secs(15) {
            eprintln!(
                "{:.0} s: {running}/{count} Running, {answered}/{count} guests answered",
                t0.elapsed().as_secs_f64()
            );
            last_report = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // Let the last status writes land before counting.
    std::thread::sleep(Duration::from_secs(5));
    let after = snapshot(&kube)?;
    sample_rss(&mut rss_peak);
    // What a running VM really takes here, against what its pod requests: every process
    // of a launcher pod. The primer runs too.
    let vm_rss: u64 = launcher_pod_processes()
        .into_iter()
        .map(|(_, r)| r)
        .sum::<u64>()
        / (count as u64 + 1);

    let to_running: Vec<Duration> = created
        .iter()
        .filter_map(|(n, at)| watch.get(n).map(|r| r.saturating_duration_since(*at)))
        .collect();
    let answers: Vec<(Duration, bool)> = created
        .iter()
        .zip(&probes)
        .filter_map(|((_, at), p)| {
            p.as_ref()?
                .get()
                .map(|(t, b)| (t.saturating_duration_since(*at), b))
        })
        .collect();
    let to_guest: Vec<Duration> = answers.iter().map(|(d, _)| *d).collect();
    let banners = answers.iter().filter(|(_, b)| *b).count();
    let n = count as f64;
    let per = |a: f64, b: f64| (a - b) / n;
    let vmi_writes = per(after.vmis, before.vmis);
    let vmi_updates = per(after.vmi_updates, before.vmi_updates);
    let vm_writes = per(after.vms, before.vms);
    let pod_writes = per(after.pods, before.pods);
    drop(probes);
    drop(watch);

    let rss = |c: &str| report::bytes(rss_peak.get(c).copied().unwrap_or(0));
    let table = format!(
        "| from the VM create request to | samples | P50 | P95 | P99 | max |\n\
         |---|---|---|---|---|---|\n\
         | VMI `Running` (watch) | {} | {} |\n\
         | guest answers on `kubectl virt console` | {} | {} |\n\n\
         | per VMI start | kubevirt-rs | KubeVirt (density job, 100 VMIs) |\n\
         |---|---|---|\n\
         | writes to virtualmachineinstances: create, update and patch, status included (no delete falls in the window) | {vmi_writes:.1} | not published |\n\
         | of which update + patch (KubeVirt's basis) | {vmi_updates:.1} | ≈ 6.1–6.8 (UPDATE ≈ 5.5–6, PATCH ≈ 0.6–0.8) |\n\
         | writes to virtualmachines (incl. status) | {vm_writes:.1} | not published |\n\
         | pod writes on kube-apiserver (all clients: controller, scheduler, kubelet) | {pod_writes:.1} | PATCH pods ≈ 2 |\n\n\
         | peak RSS during the run | kubevirt-rs | KubeVirt (avg during the job) |\n\
         |---|---|---|\n\
         | virt-controller (largest replica) | {} | ≈ 63–66 MB |\n\
         | virt-apiserver (virt-api) | {} | ≈ 140–145 MB |\n\
         | virt-handler | {} | ≈ 15–25 MB |\n\n\
         Memory of one running VM (RSS of every process of its launcher pod: QEMU, libvirtd and its reaper, virt-launcher, the console-log tail, the image copier; averaged): {}; \
         its pod requests {}.\n",
        to_running.len(),
        quantiles(&to_running),
        to_guest.len(),
        quantiles(&to_guest),
        rss("virt-controller"),
        rss("virt-apiserver"),
        rss("virt-handler"),
        report::bytes(vm_rss),
        report::bytes(fit.pod_memory),
    );
    print!("{table}");
    let description = format!(
        "{latency_note}\n\n{latency_body}### Density\n\nOne run. After one primer VM, {count} VMs (runStrategy Always, the busybox test guest \
         by kernelBoot, TCG) created {} ms apart in one namespace; exact nearest-rank \
         percentiles over the VMs (KubeVirt's are interpolated over 10 s histogram buckets). \
         Fit: {fit_note}. The guest answered with its banner in {banners} of {} cases, \
         otherwise with its prompt (the console attached after the banner). All guests share \
         this machine's CPUs under TCG, so the tail is CPU contention of booting guests, not \
         the control plane. Writes per start: `apiserver_request_total` of the first \
         virt-apiserver pod (one with `cargo xtask deploy`) and kube-apiserver, before the \
         first create and after every VMI ran and its guest answered, so no deletion is in the \
         window; \
         KubeVirt's figures count UPDATE + PATCH only. KubeVirt anchor \
         (../shared/reference/kubevirt.md §4.1): VMI creation → Running P50 ≈ 17–19 s, \
         P95 ≈ 27–28 s (weekly averages, 100 CirrOS VMIs, KVM).\n\n{table}",
        args.interval_ms,
        to_guest.len(),
    );
    let section = Section::new(section::START, provenance, description);

    if !args.keep {
        eprintln!("deleting the benchmark namespace…");
        kube.run(&["delete", "namespace", ns, "--wait=false"])?;
        // The next user of the cluster should not find 100 launchers still shutting down.
        let _ = wait_for("the launcher pods gone", timeout, || {
            launcher_pods(&kube, ns).is_ok_and(|p| p.is_empty())
        });
    }
    if to_running.len() < count {
        bail!(
            "only {} of {count} VMIs reached Running; figures not recorded",
            to_running.len()
        );
    }
    super::record(&section, args.no_docs)
}

/// `bench start --guest debian`: the Debian guest's runs, in a namespace of their own, into
/// their own section of docs/benchmarks.md.
fn run_debian(kube: &Kube, args: &StartArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.runs > 0, "--runs must be at least 1");
    let ns = "bench-start-debian";
    let provenance = Provenance::probe(args.command());
    let timeout = Duration::from_secs(args.timeout_seconds);
    if !kube
        .run(&["get", "namespace", ns, "--ignore-not-found", "-o", "name"])?
        .trim()
        .is_empty()
    {
        eprintln!("deleting the namespace {ns} of an earlier run…");
        kube.run(&["delete", "namespace", ns, "--wait=false"])?;
        wait_for("the old namespace gone", timeout, || {
            kube.run(&["get", "namespace", ns, "--ignore-not-found", "-o", "name"])
                .is_ok_and(|o| o.trim().is_empty())
        })?;
    }
    kube.run(&["create", "namespace", ns])?;
    let _cleanup = NamespaceGuard {
        kube: Kube {
            kubectl: kube.kubectl.clone(),
            kubeconfig: kube.kubeconfig.clone(),
        },
        ns,
        keep: args.keep,
    };
    let idle = Duration::from_secs(args.agent_idle_seconds);
    let body = debian::run(kube, ns, args.runs, idle, &args.cpu_request, |name| {
        delete_vms(kube, ns, &[name.to_string()], timeout)
    })?;
    print!("{body}");
    let section = Section::new(section::START_DEBIAN, provenance, body);
    super::record(&section, args.no_docs)
}

impl StartArgs {
    /// The command that reproduces this run, every option that shapes the figures spelt out.
    pub fn command(&self) -> String {
        if self.guest == Guest::Debian {
            return format!(
                "cargo xtask bench start --guest debian --runs {} --agent-idle-seconds {} --cpu-request {}",
                self.runs, self.agent_idle_seconds, self.cpu_request
            );
        }
        format!(
            "cargo xtask bench start --single-runs {} --burst {} --burst-interval-ms {} --vms {} --interval-ms {} --guest-memory {} --cpu-request {}",
            self.single_runs,
            self.burst,
            self.burst_interval_ms,
            self.vms,
            self.interval_ms,
            self.guest_memory,
            self.cpu_request
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn the_tightest_resource_limits_the_count() {
        let f = Fit {
            pod_memory: 259 * MIB,
            pod_cpu: 0.01,
            free_memory: 20 * 1024 * MIB,
            free_cpu: 1.5,
            host_memory: 30 * 1024 * MIB,
        };
        assert_eq!(fitting(&f), (79, "node allocatable memory"));
        let f = Fit { pod_cpu: 0.1, ..f };
        assert_eq!(fitting(&f), (15, "node allocatable CPU"));
        let f = Fit {
            pod_cpu: 0.0,
            host_memory: 10 * 1024 * MIB,
            ..f
        };
        assert_eq!(
            fitting(&f),
            (39, "this machine's available memory (all nodes share it)")
        );
    }

    #[test]
    fn counters_are_summed_by_labels_and_verbs() {
        let text = "# HELP apiserver_request Requests\n\
            apiserver_request_total{verb=\"create\",resource=\"virtualmachineinstances\",subresource=\"\",code=\"201\"} 3\n\
            apiserver_request_total{verb=\"patch\",resource=\"virtualmachineinstances\",subresource=\"status\",code=\"200\"} 5\n\
            apiserver_request_total{verb=\"get\",resource=\"virtualmachineinstances\",subresource=\"\",code=\"200\"} 100\n\
            apiserver_request_total{verb=\"patch\",resource=\"virtualmachines\",subresource=\"status\",code=\"200\"} 7\n";
        let vmi = counter_sum(
            text,
            "apiserver_request_total",
            &[("resource", "virtualmachineinstances")],
            WRITE_VERBS,
        );
        assert!((vmi - 8.0).abs() < f64::EPSILON);
        let all = counter_sum(text, "apiserver_request_total", &[], &[]);
        assert!((all - 115.0).abs() < f64::EPSILON);
        assert!(counter_sum(text, "nope", &[], &[]).abs() < f64::EPSILON);
    }

    #[test]
    fn quantiles_are_nearest_rank() {
        let s: Vec<Duration> = (1..=100).map(Duration::from_secs).collect();
        assert_eq!(quantiles(&s), "50.0 s | 95.0 s | 99.0 s | 100.0 s");
        assert_eq!(quantiles(&[]), "n/a | n/a | n/a | n/a");
    }

    #[test]
    fn pod_requests_sum_the_containers() {
        let pod = json!({"spec": {"containers": [
            {"resources": {"requests": {"memory": "259Mi", "cpu": "10m"}}},
            {"resources": {}}
        ]}});
        let (m, c) = pod_requests(&pod);
        assert_eq!(m, 259 * MIB);
        assert!((c - 0.01).abs() < 1e-9);
    }
}
