//! `cargo xtask bench storage`: persistent disks on the local cluster (issue 18), each
//! against its floor on this machine in the same run.
//!
//! 1. Throughput inside the guest: the test guest's `disk-bench` (O_DIRECT, guest/
//!    disk_bench.rs) on a claim of the default class (local-path: a raw `disk.img` in a host
//!    directory) against the same guest under bare QEMU with a raw file on the same file
//!    system: sequential 1 MiB and random 4 KiB, read and write. Both sides TCG, same
//!    kernel, initramfs, memory and disk size; they alternate run by run. A third side
//!    splits the gap: the same bare QEMU started inside the VM's launcher pod with a file
//!    beside disk.img on the claim, so the pod's environment (cgroups, seccomp profile,
//!    mounts, user) is measured apart from libvirt's QEMU configuration.
//! 2. Live migration of a VM whose 1 GiB disk is a ReadWriteOnce claim (copied to a new
//!    claim on the other node while the guest runs) against `qemu-img convert` of the same
//!    disk.img on this machine, and its downtime against a memory-only migration of the
//!    same guest without the disk, alternating.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use super::migrate::steps::{Watches, collect};
use super::migrate::{migrate_and_wait, wait_for};
use super::section::{self, Provenance, Runs};
use super::start::steps::{Timeline, single_table};
use crate::deploy::Kubectl as Kube;

/// The guest's disk modes: (mode, block bytes).
const MODES: [(&str, usize); 4] = [
    ("seqwrite", 1 << 20),
    ("seqread", 1 << 20),
    ("randwrite", 4096),
    ("randread", 4096),
];
/// The part of the disk the throughput runs use (MiB).
const SPAN_MIB: u64 = 256;
/// The throughput VM's claim: a 483 MiB disk.img.
const THROUGHPUT_CLAIM: &str = "512Mi";
/// The migration VM's claim: a 1 GiB disk.img (1084 MiB less 5.5 %).
const MIGRATION_CLAIM: &str = "1084Mi";
/// The migration VM's disk is filled with this much data before its first move (MiB).
const FILL_MIB: u64 = 1000;

/// Arguments of `cargo xtask bench storage`.
#[derive(clap::Args, Debug, Clone)]
pub struct StorageArgs {
    /// Runs per variant (they alternate).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Seconds per throughput measurement.
    #[arg(long, default_value_t = 5)]
    pub seconds: u64,
    /// Kubeconfig of the cluster (default: $KUBECONFIG, then the local cluster's).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Only print the figures; leave docs/benchmarks.md alone.
    #[arg(long)]
    pub no_docs: bool,
}

/// A serial console driven through a child's stdin and stdout: `kubectl-virt console`
/// for a cluster VM, QEMU's `-serial stdio` for the bare one.
struct Console {
    child: Child,
    stdin: ChildStdin,
    out: Arc<Mutex<String>>,
}

impl Console {
    fn spawn(mut cmd: Command) -> anyhow::Result<Self> {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {cmd:?}"))?;
        let stdout = child.stdout.take().context("console stdout")?;
        let stderr = child.stderr.take().context("console stderr")?;
        let stdin = child.stdin.take().context("console stdin")?;
        let out = Arc::new(Mutex::new(String::new()));
        // Both into one text: an error of QEMU or kubectl shows where the console's end did.
        fn copy(mut from: impl Read + Send + 'static, sink: Arc<Mutex<String>>) {
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = from.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    if let Ok(mut o) = sink.lock() {
                        o.push_str(&String::from_utf8_lossy(&buf[..n]));
                    }
                }
            });
        }
        copy(stdout, out.clone());
        copy(stderr, out.clone());
        Ok(Console { child, stdin, out })
    }

    fn text(&self) -> String {
        self.out.lock().map(|o| o.clone()).unwrap_or_default()
    }

    fn send(&mut self, line: &str) -> anyhow::Result<()> {
        let sent = (|| {
            self.stdin.write_all(line.as_bytes())?;
            self.stdin.write_all(b"\r")?;
            self.stdin.flush()
        })();
        sent.with_context(|| {
            let text = self.text();
            let tail: Vec<_> = text.lines().rev().take(10).collect();
            format!(
                "the console ended; its last lines:\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            )
        })
    }

    /// Presses Enter until the guest's prompt shows.
    fn wait_for_shell(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            self.send("")?;
            std::thread::sleep(Duration::from_secs(1));
            if self.text().contains(virt_testguest::PROMPT.trim()) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("no shell prompt on the console within {timeout:?}");
            }
        }
    }

    /// Sends `line` and returns the first output line containing `answer` after it (the
    /// typed command must not contain `answer` itself).
    fn run(&mut self, line: &str, answer: &str, timeout: Duration) -> anyhow::Result<String> {
        let from = self.text().len();
        self.send(line)?;
        let deadline = Instant::now() + timeout;
        loop {
            let text = self.text();
            if let Some(l) = text
                .get(from..)
                .unwrap_or_default()
                .lines()
                .find(|l| l.contains(answer))
            {
                return Ok(l.trim().to_string());
            }
            if Instant::now() > deadline {
                bail!(
                    "no {answer:?} within {timeout:?} after {line:?}; console:\n{}",
                    text.get(from..).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Console {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One `disk-bench` answer: MiB/s and operations per second.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Throughput {
    mib_s: f64,
    iops: f64,
}

fn parse_answer(line: &str) -> Option<Throughput> {
    let field = |k: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .and_then(|v| v.parse::<f64>().ok())
    };
    Some(Throughput {
        mib_s: field("MiBps=")?,
        iops: field("iops=")?,
    })
}

/// Every mode once on `console`'s guest, whose disk is /dev/vda.
fn measure(console: &mut Console, seconds: u64) -> anyhow::Result<Vec<Throughput>> {
    let mut out = Vec::new();
    for (mode, bs) in MODES {
        let line = console.run(
            &format!("disk-bench /dev/vda {mode} {bs} {seconds} {SPAN_MIB}"),
            "MiBps=",
            Duration::from_secs(seconds + 120),
        )?;
        out.push(parse_answer(&line).with_context(|| format!("disk-bench answered {line:?}"))?);
    }
    Ok(out)
}

/// Writes the span once, so that the reads read data, not holes.
fn prefill(console: &mut Console) -> anyhow::Result<()> {
    console.run(
        &format!("dd if=/dev/zero of=/dev/vda bs=1M count={SPAN_MIB} oflag=direct 2>/dev/null; echo pre$((40+2))fill"),
        "pre42fill",
        Duration::from_secs(600),
    )?;
    Ok(())
}

/// The bare side: QEMU (TCG, q35, 256 MiB) with the test guest and `disk` as a raw virtio
/// disk with cache mode `none` (O_DIRECT, no host page cache), as the launcher gives a
/// claim's disk.img without a cache mode where the file system allows it.
fn bare_console(g: &virt_testguest::Guest, disk: &Path) -> anyhow::Result<Console> {
    let mut c = Command::new("qemu-system-x86_64");
    c.args(bare_args(
        &g.kernel.to_string_lossy(),
        &g.initrd.to_string_lossy(),
        disk,
    ));
    Console::spawn(c)
}

/// The bare side's QEMU command line after the program's name.
fn bare_args(kernel: &str, initrd: &str, disk: &Path) -> Vec<String> {
    [
        "-accel",
        "tcg",
        "-M",
        "q35",
        "-m",
        "256",
        "-display",
        "none",
        "-nodefaults",
        "-no-user-config",
        "-monitor",
        "none",
        "-serial",
        "stdio",
        "-kernel",
        kernel,
        "-initrd",
        initrd,
        "-append",
        virt_testguest::KERNEL_ARGS,
        "-drive",
        &format!(
            "file={},format=raw,if=none,id=data,cache=none",
            disk.display()
        ),
        "-device",
        "virtio-blk-pci,drive=data",
    ]
    .into_iter()
    .map(str::to_string)
    .collect()
}

/// Bare QEMU as `bare_console` starts it, but inside the compute container of VM `vm`'s
/// launcher pod (`kubectl exec`), with the pod's own copy of the guest's kernel and a raw
/// file beside the claim's disk.img: the paths are read from the launcher's QEMU command
/// line. Dropping it ends that QEMU and removes the file.
struct InPod {
    console: Console,
    pod_uid: Option<String>,
    host_disk: PathBuf,
}

impl InPod {
    fn start(kube: &Kube, ns: &str, vm: &str, img: &Path) -> anyhow::Result<Self> {
        use std::os::unix::fs::MetadataExt;
        let domain = format!("{ns}_{vm}");
        let qemu = virt_devenv::procs::in_containers()
            .into_iter()
            .find(|p| p.comm.starts_with("qemu-system") && p.qemu_domain() == Some(&domain))
            .with_context(|| format!("no QEMU process runs domain {domain}"))?;
        let (kernel, initrd, disk) = in_pod_paths(&qemu.cmdline)
            .with_context(|| format!("kernel, initrd or disk.img in {:?}", qemu.cmdline))?;
        let pod_disk = Path::new(&disk).with_file_name("bench-bare.img");
        let host_disk = img.with_file_name("bench-bare.img");
        // Same size and owner as disk.img: the launcher's user writes it.
        let meta = std::fs::metadata(img)?;
        std::fs::File::create(&host_disk)?.set_len(meta.len())?;
        std::os::unix::fs::chown(&host_disk, Some(meta.uid()), Some(meta.gid()))?;
        let pod = kube.run(
            &[
                "-n",
                ns,
                "get",
                "pod",
                "-l",
                &format!("vm.kubevirt.io/name={vm}"),
                "-o",
                "jsonpath={.items[0].metadata.name}",
            ],
            None,
        )?;
        let mut exec = Command::new(&kube.bin);
        exec.env("KUBECONFIG", &kube.kubeconfig)
            .args(["exec", "-i", "-n", ns, &pod, "-c", "compute", "--"])
            .arg(
                qemu.cmdline
                    .first()
                    .context("QEMU's command line is empty")?,
            )
            .args(bare_args(&kernel, &initrd, &pod_disk));
        Ok(InPod {
            console: Console::spawn(exec)?,
            pod_uid: qemu.pod_uid,
            host_disk,
        })
    }
}

impl Drop for InPod {
    fn drop(&mut self) {
        // The container's QEMU outlives `kubectl exec` (end of input is no reason to quit).
        for p in virt_devenv::procs::in_containers() {
            if p.comm.starts_with("qemu-system")
                && p.pod_uid == self.pod_uid
                && p.qemu_domain().is_none()
            {
                virt_devenv::procs::kill9(p.pid);
            }
        }
        let _ = std::fs::remove_file(&self.host_disk);
    }
}

/// `-kernel`, `-initrd` and the first file `-blockdev` of a libvirt QEMU command line.
fn in_pod_paths(cmdline: &[String]) -> Option<(String, String, String)> {
    let after = |flag: &str| {
        cmdline
            .iter()
            .position(|a| a == flag)
            .and_then(|i| cmdline.get(i + 1))
            .cloned()
    };
    let disk = cmdline
        .iter()
        .filter_map(|a| serde_json::from_str::<Value>(a).ok())
        .find(|v| v["driver"] == "file")
        .and_then(|v| v["filename"].as_str().map(str::to_string))?;
    Some((after("-kernel")?, after("-initrd")?, disk))
}

/// A VM of the test guest with disk `data` on claim `claim`.
fn vm_with_claim(name: &str, ns: &str, claim: &str) -> anyhow::Result<String> {
    let mut vm: Value = serde_json::from_str(&super::test_guest_vm(name, ns))?;
    let spec = &mut vm["spec"]["template"]["spec"];
    spec["domain"]["devices"]["disks"] = json!([{"name": "data", "disk": {"bus": "virtio"}}]);
    spec["volumes"] = json!([{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]);
    Ok(vm.to_string())
}

fn claim(name: &str, ns: &str, size: &str) -> String {
    json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}
    })
    .to_string()
}

fn wait_running(kube: &Kube, ns: &str, vm: &str) -> anyhow::Result<()> {
    wait_for(&format!("VM {vm} to run"), Duration::from_secs(300), || {
        kube.run(
            &["-n", ns, "get", "vmi", vm, "-o", "jsonpath={.status.phase}"],
            None,
        )
        .is_ok_and(|p| p == "Running")
    })
}

fn cluster_console(
    plugin: &Path,
    kubeconfig: &Path,
    ns: &str,
    vm: &str,
) -> anyhow::Result<Console> {
    let mut c = Command::new(plugin);
    c.env("KUBECONFIG", kubeconfig)
        .args(["console", vm, "-n", ns, "--timeout", "60"]);
    let mut console = Console::spawn(c)?;
    console.wait_for_shell(Duration::from_secs(180))?;
    Ok(console)
}

/// The host path of the disk.img of volume `data` of `vm` (local-path: a hostPath PV).
fn disk_img(kube: &Kube, ns: &str, vm: &str) -> anyhow::Result<PathBuf> {
    let claim = kube.run(
        &[
            "-n",
            ns,
            "get",
            "vmi",
            vm,
            "-o",
            "jsonpath={.spec.volumes[0].persistentVolumeClaim.claimName}",
        ],
        None,
    )?;
    let pv = kube.run(
        &[
            "-n",
            ns,
            "get",
            "pvc",
            &claim,
            "-o",
            "jsonpath={.spec.volumeName}",
        ],
        None,
    )?;
    let dir = kube.run(
        &["get", "pv", &pv, "-o", "jsonpath={.spec.hostPath.path}"],
        None,
    )?;
    if dir.is_empty() {
        bail!("claim {claim}'s volume {pv} has no hostPath: bench storage needs the local cluster");
    }
    Ok(Path::new(&dir).join("disk.img"))
}

/// `qemu-img convert` of `src`: raw to raw, no sparse detection (`-S 0`, the migration
/// copies every allocated byte too), no host cache on either side, while its VM runs
/// (`-U`: QEMU holds the image's lock; the idle guest does not write).
fn convert_once(src: &Path, dir: &Path) -> anyhow::Result<Duration> {
    let dst = dir.join("convert.img");
    let _ = std::fs::remove_file(&dst);
    let t0 = Instant::now();
    let st = Command::new("qemu-img")
        .args([
            "convert", "-U", "-f", "raw", "-O", "raw", "-S", "0", "-T", "none", "-t", "none",
        ])
        .arg(src)
        .arg(&dst)
        .status()
        .context("qemu-img (apt-get install qemu-utils)")?;
    let took = t0.elapsed();
    let _ = std::fs::remove_file(&dst);
    if !st.success() {
        bail!("qemu-img convert {} failed: {st}", src.display());
    }
    Ok(took)
}

#[derive(Clone, Debug, Default)]
struct MigrationSample {
    total: Duration,
    downtime_ms: Option<u64>,
    bytes: Option<u64>,
    /// Step by step, when watched.
    timeline: Option<Timeline<super::migrate::steps::Step>>,
}

fn migrate_once(
    kube: &Kube,
    ns: &str,
    vm: &str,
    name: &str,
    watches: Option<&Watches>,
) -> anyhow::Result<MigrationSample> {
    let created = std::time::SystemTime::now();
    let (total, _) = migrate_and_wait(kube, ns, vm, name)?;
    let timeline = match watches {
        Some(w) => Some(collect(kube, ns, w, name, created)?),
        None => None,
    };
    let vmi = kube
        .json(&["-n", ns, "get", "vmi", vm])?
        .context("the VMI is gone")?;
    let ms = &vmi["status"]["migrationState"];
    Ok(MigrationSample {
        total,
        downtime_ms: ms["downtimeMs"].as_u64(),
        bytes: ms["dataProcessedBytes"].as_u64(),
        timeline,
    })
}

/// Everything measured.
#[derive(Debug, Default)]
struct Figures {
    /// Per mode: cluster and bare answers over the runs.
    cluster: Vec<Vec<Throughput>>,
    /// Bare QEMU inside the claim VM's launcher pod.
    in_pod: Vec<Vec<Throughput>>,
    bare: Vec<Vec<Throughput>>,
    copy: Vec<MigrationSample>,
    memory_only: Vec<MigrationSample>,
    convert: Vec<Duration>,
}

fn ratio(a: &Runs, b: &Runs) -> String {
    match (a.median(), b.median()) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.0} %", a / b * 100.0),
        _ => "n/a".into(),
    }
}

/// How many times `b` `a` is (medians): times and pauses compare as factors.
fn factor(a: &Runs, b: &Runs) -> String {
    match (a.median(), b.median()) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}×", a / b),
        _ => "n/a".into(),
    }
}

fn table(f: &Figures) -> String {
    let mut t = String::from(
        "| in the guest (O_DIRECT, 256 MiB span) | claim on the cluster | bare QEMU in the VM's launcher pod, file on the claim | bare QEMU, host file | cluster / bare | pod's bare / bare |\n|---|---|---|---|---|---|\n",
    );
    for (i, (mode, bs)) in MODES.iter().enumerate() {
        let pick = |side: &[Vec<Throughput>]| {
            Runs::new(
                side.iter()
                    .filter_map(|r| r.get(i))
                    .map(|t| if *bs >= 1 << 20 { t.mib_s } else { t.iops }),
            )
        };
        let (c, p, b) = (pick(&f.cluster), pick(&f.in_pod), pick(&f.bare));
        let unit = if *bs >= 1 << 20 { "MiB/s" } else { "IOPS" };
        t.push_str(&format!(
            "| {mode} {} | {} | {} | {} | {} | {} |\n",
            if *bs >= 1 << 20 { "1 MiB" } else { "4 KiB" },
            c.summary(1, unit),
            p.summary(1, unit),
            b.summary(1, unit),
            ratio(&c, &b),
            ratio(&p, &b)
        ));
    }
    let secs = |v: &[MigrationSample]| Runs::secs(&v.iter().map(|s| s.total).collect::<Vec<_>>());
    let down =
        |v: &[MigrationSample]| Runs::new(v.iter().filter_map(|s| s.downtime_ms).map(|d| d as f64));
    let mib = |v: &[MigrationSample]| {
        Runs::new(
            v.iter()
                .filter_map(|s| s.bytes)
                .map(|b| b as f64 / (1u64 << 20) as f64),
        )
    };
    let (copy_t, conv_t) = (secs(&f.copy), Runs::secs(&f.convert));
    let (copy_d, mem_d) = (down(&f.copy), down(&f.memory_only));
    t.push_str(&format!(
        "\n| live migration | total | guest downtime | moved |\n|---|---|---|---|\n\
         | 1 GiB ReadWriteOnce claim, copied to the other node | {} | {} | {} |\n\
         | same guest, memory only (no disk) | {} | {} | {} |\n\
         | `qemu-img convert -S 0 -T none -t none` of the same disk.img | {} | | |\n\
         | copy migration / convert (goal ≤ 2×) | {} | | |\n\
         | copy / memory-only downtime (goal ≤ 1.2×) | | {} | |\n",
        copy_t.summary(1, "s"),
        copy_d.summary(0, "ms"),
        mib(&f.copy).summary(0, "MiB"),
        secs(&f.memory_only).summary(1, "s"),
        mem_d.summary(0, "ms"),
        mib(&f.memory_only).summary(0, "MiB"),
        conv_t.summary(1, "s"),
        factor(&copy_t, &conv_t),
        factor(&copy_d, &mem_d),
    ));
    let timelines: Vec<_> = f.copy.iter().filter_map(|s| s.timeline.clone()).collect();
    if !timelines.is_empty() {
        t.push_str(&format!(
            "\nWhere the copy migration's total goes, step by step ({} runs; the target pod is \
             scheduled only once the provisioner has made the new claim's volume on the target \
             node; the transfer is the disk's copy, then the memory and the switch-over):\n\n{}",
            timelines.len(),
            single_table(&timelines)
        ));
    }
    t
}

/// Runs the benchmark.
pub fn run(args: StorageArgs) -> anyhow::Result<()> {
    let runs = args.runs.max(1);
    let provenance = Provenance::probe(format!(
        "cargo xtask bench storage --runs {runs} --seconds {}",
        args.seconds
    ));
    let guest = virt_testguest::ensure(&virt_testguest::default_dir())?;
    let kubeconfig = args
        .kubeconfig
        .clone()
        .or_else(|| std::env::var_os("KUBECONFIG").map(PathBuf::from))
        .unwrap_or_else(|| crate::target_dir().join("cluster/kubeconfig"));
    let kube = Kube::new(kubeconfig.clone());
    if kube
        .run(&["get", "nodes", "-o", "name"], None)?
        .lines()
        .count()
        < 2
    {
        bail!(
            "the copy migration needs two nodes: cargo xtask cluster up --nodes 2 && cargo xtask deploy"
        );
    }
    let plugin = super::start::plugin_binary()?;
    let ns = format!("bench-storage-{}", std::process::id());
    // The bare disk on the file system of the cluster's storage (target/cluster).
    let dir = crate::target_dir()
        .join("cluster")
        .join(format!("bench-storage-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    kube.run(&["create", "namespace", &ns], None)?;
    let result = (|| -> anyhow::Result<Figures> {
        let mut f = Figures::default();
        for (name, size) in [("tput", THROUGHPUT_CLAIM), ("copy", MIGRATION_CLAIM)] {
            kube.run(&["apply", "-f", "-"], Some(&claim(name, &ns, size)))?;
            kube.run(
                &["apply", "-f", "-"],
                Some(&vm_with_claim(name, &ns, name)?),
            )?;
        }
        kube.run(
            &["apply", "-f", "-"],
            Some(&super::test_guest_vm("memonly", &ns)),
        )?;
        for vm in ["tput", "copy", "memonly"] {
            wait_running(&kube, &ns, vm)?;
        }

        // 1. Throughput, the two sides alternating.
        let img = disk_img(&kube, &ns, "tput")?;
        let size = std::fs::metadata(&img)
            .with_context(|| format!("{}", img.display()))?
            .len();
        let bare_disk = dir.join("disk.img");
        std::fs::File::create(&bare_disk)?.set_len(size)?;
        let mut cluster = cluster_console(&plugin, &kubeconfig, &ns, "tput")?;
        let mut bare = bare_console(&guest, &bare_disk)?;
        let mut in_pod = InPod::start(&kube, &ns, "tput", &img)?;
        bare.wait_for_shell(Duration::from_secs(120))?;
        in_pod.console.wait_for_shell(Duration::from_secs(120))?;
        prefill(&mut cluster)?;
        prefill(&mut in_pod.console)?;
        prefill(&mut bare)?;
        for n in 0..runs {
            let c = measure(&mut cluster, args.seconds)?;
            eprintln!("throughput run {n}, cluster: {c:?}");
            f.cluster.push(c);
            let p = measure(&mut in_pod.console, args.seconds)?;
            eprintln!("throughput run {n}, bare QEMU in the launcher pod: {p:?}");
            f.in_pod.push(p);
            let b = measure(&mut bare, args.seconds)?;
            eprintln!("throughput run {n}, bare: {b:?}");
            f.bare.push(b);
        }
        drop((cluster, bare, in_pod));
        kube.run(&["-n", &ns, "delete", "vm", "tput", "--wait=false"], None)?;

        // 2. The copy migration: fill the disk, then move it back and forth.
        let mut console = cluster_console(&plugin, &kubeconfig, &ns, "copy")?;
        console.run(
            &format!("dd if=/dev/zero of=/dev/vda bs=1M count={FILL_MIB} oflag=direct 2>/dev/null; echo fil$((40+2))led"),
            "fil42led",
            Duration::from_secs(1200),
        )?;
        drop(console);
        let watches = Watches::start(&kube, &ns)?;
        for n in 0..runs {
            let s = migrate_once(&kube, &ns, "copy", &format!("copy-{n}"), Some(&watches))?;
            eprintln!("copy migration {n}: {s:?}");
            f.copy.push(s);
            let src = disk_img(&kube, &ns, "copy")?;
            let c = convert_once(&src, &dir)?;
            eprintln!("qemu-img convert {n}: {c:?}");
            f.convert.push(c);
            let s = migrate_once(&kube, &ns, "memonly", &format!("memonly-{n}"), None)?;
            eprintln!("memory-only migration {n}: {s:?}");
            f.memory_only.push(s);
        }
        Ok(f)
    })();
    let _ = kube.run(&["delete", "namespace", &ns, "--wait=false"], None);
    let _ = std::fs::remove_dir_all(&dir);
    let f = result?;
    let table = table(&f);
    print!("{table}");
    let description = format!(
        "Two parts, each against its floor on this machine in the same run, {runs} runs per \
         side, alternating. Throughput: the test guest (busybox, 256 MiB, TCG) runs \
         `disk-bench` (O_DIRECT, {} s per figure, over the first {SPAN_MIB} MiB, written \
         once before) on a {THROUGHPUT_CLAIM} claim of the default class (local-path: a raw \
         disk.img in a host directory; no cache mode asked, so `none` as KubeVirt defaults it: \
         O_DIRECT, no host page cache) against bare QEMU with a raw file of the same size on \
         the same file system, also `cache=none`; both TCG, so the guest's CPU \
         bounds both. The middle column is that bare QEMU started inside the VM's launcher \
         pod (`kubectl exec` into its compute container) on a file beside disk.img on the \
         claim: the pod's environment (cgroups, seccomp profile, mounts, user) without \
         libvirt's QEMU configuration. Migration: a guest whose {MIGRATION_CLAIM} ReadWriteOnce claim (a \
         1 GiB disk.img, {FILL_MIB} MiB of it written) is copied to a new claim on the \
         other node, unthrottled, VMIM created → `Succeeded` as a client sees it; against \
         `qemu-img convert` of the same disk.img between two files on this machine, and its \
         downtime against the same guest without the disk migrated memory-only. Median and \
         min–max over the runs.",
        args.seconds
    );
    super::record_table(
        section::STORAGE,
        provenance,
        &description,
        &table,
        args.no_docs,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pods_bare_qemu_takes_the_launchers_kernel_and_claim() {
        let cmdline: Vec<String> = [
            "/usr/bin/qemu-system-x86_64", "-name", "guest=ns_vm", "-kernel",
            "/var/run/kubevirt-rs/images/0/vmlinuz", "-initrd", "/var/run/kubevirt-rs/images/0/initramfs.gz",
            "-blockdev",
            r#"{"driver":"file","filename":"/var/run/kubevirt-private/vmi-disks/data/disk.img","node-name":"libvirt-1-storage"}"#,
            "-blockdev", r#"{"node-name":"libvirt-1-format","driver":"raw","file":"libvirt-1-storage"}"#,
        ]
        .map(str::to_string)
        .to_vec();
        assert_eq!(
            in_pod_paths(&cmdline),
            Some((
                "/var/run/kubevirt-rs/images/0/vmlinuz".into(),
                "/var/run/kubevirt-rs/images/0/initramfs.gz".into(),
                "/var/run/kubevirt-private/vmi-disks/data/disk.img".into()
            ))
        );
        assert_eq!(in_pod_paths(&cmdline[..3]), None);
        let args = bare_args("/k", "/i", Path::new("/d/bench-bare.img"));
        assert_eq!(args.first().map(String::as_str), Some("-accel"));
        assert!(
            args.contains(
                &"file=/d/bench-bare.img,format=raw,if=none,id=data,cache=none".to_string()
            )
        );
    }

    #[test]
    fn answers_parse_and_the_table_compares_like_with_like() {
        let t = parse_answer("disk-bench randread bs=4096 ops=100 MiBps=0.39 iops=100.0")
            .expect("an answer");
        assert_eq!(
            t,
            Throughput {
                mib_s: 0.39,
                iops: 100.0
            }
        );
        assert_eq!(
            parse_answer("disk-bench /dev/vda randread 4096 5 256"),
            None
        );
        let tp = |m: f64, i: f64| Throughput { mib_s: m, iops: i };
        let side = |k: f64| {
            vec![
                tp(10.0 * k, 10.0),
                tp(20.0 * k, 20.0),
                tp(1.0, 100.0 * k),
                tp(1.0, 200.0 * k),
            ]
        };
        let s = |t: u64, d: u64| MigrationSample {
            total: Duration::from_secs(t),
            downtime_ms: Some(d),
            bytes: Some(1 << 30),
            timeline: None,
        };
        let f = Figures {
            cluster: vec![side(0.9), side(0.9)],
            in_pod: vec![side(0.95), side(0.95)],
            bare: vec![side(1.0), side(1.0)],
            copy: vec![s(20, 60)],
            memory_only: vec![s(5, 50)],
            convert: vec![Duration::from_secs(10)],
        };
        let t = table(&f);
        assert!(
            t.contains("| seqwrite 1 MiB | 9.0 MiB/s (9.0–9.0) | 9.5 MiB/s (9.5–9.5) | 10.0 MiB/s (10.0–10.0) | 90 % | 95 % |"),
            "{t}"
        );
        assert!(
            t.contains(
                "| randread 4 KiB | 180.0 IOPS (180.0–180.0) | 190.0 IOPS (190.0–190.0) | 200.0 IOPS (200.0–200.0) | 90 % | 95 % |"
            ),
            "{t}"
        );
        assert!(
            t.contains("| copy migration / convert (goal ≤ 2×) | 2.00× |"),
            "{t}"
        );
        assert!(
            t.contains("| copy / memory-only downtime (goal ≤ 1.2×) | | 1.20× |"),
            "{t}"
        );
        assert!(!t.contains("step by step"), "{t}");

        // A watched copy migration gets its breakdown.
        use super::super::migrate::steps::Step;
        let t0 = std::time::SystemTime::UNIX_EPOCH;
        let mut watched = s(20, 60);
        watched.timeline = Some(Timeline {
            created: Some(t0),
            at: [
                (Step::VmimCreated, t0),
                (Step::TargetPodScheduled, t0 + Duration::from_secs(3)),
                (Step::Succeeded, t0 + Duration::from_secs(20)),
            ]
            .into_iter()
            .collect(),
        });
        let t = table(&Figures {
            copy: vec![watched],
            ..f
        });
        assert!(
            t.contains("Where the copy migration's total goes, step by step (1 runs"),
            "{t}"
        );
        assert!(t.contains("target pod scheduled"), "{t}");
    }
}
