//! `cargo xtask bench migrate`: live migration of an idle 256 MiB guest (the test guest,
//! TCG) between the two nodes of the local cluster (`cargo xtask cluster up --nodes 2`,
//! kubevirt-rs deployed), against the floor measured in the same run: bare QEMU to QEMU
//! on this machine (QMP `migrate` over a unix socket, same kernel, initramfs and memory).
//!
//! Per cluster run: the VMIM's creation → `Succeeded` (seen by the client's watch), each step in
//! between (`steps.rs`: target pod, target launcher ready, the transfer as the source
//! handler logs it, hand-over through the API), the guest's downtime (`downtimeMs`,
//! libvirt's measured figure) and the bytes moved. Per bare run: QEMU's own `total-time`
//! and `downtime` from `query-migrate`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use super::section::{self, Provenance, Runs};

pub(super) mod steps;

use super::start::steps::{Children, Timeline, single_table};

const VM: &str = "mover";

/// Arguments of `cargo xtask bench migrate`.
#[derive(clap::Args, Debug, Clone)]
pub struct MigrateArgs {
    /// Migrations per variant (the cluster VM goes back and forth).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Kubeconfig of the cluster (default: $KUBECONFIG, then the local cluster's).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Only print the figures; leave docs/benchmarks.md alone.
    #[arg(long)]
    pub no_docs: bool,
}

/// One migration's figures.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    /// Request → done, as the client saw it.
    pub total: Duration,
    /// The guest's pause at the switchover.
    pub downtime_ms: Option<u64>,
    /// Bytes sent.
    pub bytes: Option<u64>,
    /// The transfer with its switch-over (QEMU's `total-time`; for the cluster, the
    /// source handler's "starting outgoing migration" → "outgoing migration ended").
    pub transfer: Option<Duration>,
    /// The cluster's steps (none for bare QEMU).
    pub timeline: Option<Timeline<steps::Step>>,
    /// The longest time a ClusterIP Service selecting the VM went unanswered from a client pod
    /// during the migration and until the next one (none for bare QEMU, which has no Service).
    pub service_outage: Option<f64>,
}

/// The figures as a markdown table: per column the median of the runs with their range
/// (each column's median may come from a different run).
pub fn table(cluster: &[Sample], bare: &[Sample]) -> String {
    let med =
        |s: &[Sample], f: fn(&Sample) -> Option<f64>| Runs::new(s.iter().filter_map(f)).median();
    let transfer = |x: &Sample| x.transfer.map(|d| d.as_secs_f64());
    let down = |x: &Sample| x.downtime_ms.map(|d| d as f64);
    let total = |x: &Sample| Some(x.total.as_secs_f64());
    let met = |ok: bool| if ok { "met" } else { "not met" };
    let goals = match (
        med(cluster, transfer),
        med(bare, transfer),
        med(cluster, down),
        med(bare, down),
        med(cluster, total),
        med(bare, total),
    ) {
        (Some(ct), Some(bt), Some(cd), Some(bd), Some(c), Some(b)) if bt > 0.0 && bd > 0.0 => {
            format!(
                "\n\nGoals (medians): transfer ≤ 1.5× bare: {:.2}×, {}; downtime ≤ 2× bare: \
                 {:.2}×, {}; total ≤ bare + 2 s: {c:.2} s vs {:.2} s, {}.",
                ct / bt,
                met(ct / bt <= 1.5),
                cd / bd,
                met(cd / bd <= 2.0),
                b + 2.0,
                met(c <= b + 2.0),
            )
        }
        _ => "\n\nGoals: not evaluated (a figure is missing).".to_string(),
    };
    let row = |name: &str, s: &[Sample]| {
        let total = Runs::secs(&s.iter().map(|x| x.total).collect::<Vec<_>>());
        let transfer = Runs::secs(&s.iter().filter_map(|x| x.transfer).collect::<Vec<_>>());
        let down = Runs::new(s.iter().filter_map(|x| x.downtime_ms).map(|d| d as f64));
        let moved = Runs::new(
            s.iter()
                .filter_map(|x| x.bytes)
                .map(|b| b as f64 / 1048576.0),
        );
        let outage = Runs::new(s.iter().filter_map(|x| x.service_outage));
        format!(
            "| {name} | {} | {} | {} | {} | {} |\n",
            total.summary(2, "s"),
            transfer.summary(2, "s"),
            down.summary(0, "ms"),
            moved.summary(1, "MiB"),
            if outage.median().is_some() {
                outage.summary(1, "s")
            } else {
                "—".to_string()
            },
        )
    };
    let timelines: Vec<Timeline<steps::Step>> =
        cluster.iter().filter_map(|x| x.timeline.clone()).collect();
    let breakdown = if timelines.is_empty() {
        String::new()
    } else {
        format!(
            "\n\nWhere the cluster's total goes, step by step ({} runs; a step seen by a watch \
             can come after a later step's log line: its own duration then counts as zero):\n\n{}",
            timelines.len(),
            single_table(&timelines)
        )
    };
    format!(
        "| variant | total | transfer (with switch-over) | downtime | moved | Service outage |\n\
         |---|---|---|---|---|---|\n{}{}{goals}{breakdown}",
        row("kubevirt-rs: VMIM created → Succeeded", cluster),
        row("bare QEMU → QEMU (QMP migrate, unix socket)", bare),
    )
}

// ---- bare QEMU ----

struct Qmp {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Qmp {
    fn connect(path: &Path) -> anyhow::Result<Self> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let s = loop {
            match UnixStream::connect(path) {
                Ok(s) => break s,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => return Err(e).with_context(|| format!("QMP {}", path.display())),
            }
        };
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut q = Qmp {
            reader: BufReader::new(s.try_clone()?),
            writer: s,
        };
        q.read()?; // greeting
        q.call("qmp_capabilities", json!({}))?;
        Ok(q)
    }

    fn read(&mut self) -> anyhow::Result<Value> {
        let mut line = String::new();
        if self.reader.read_line(&mut line)? == 0 {
            bail!("QMP closed");
        }
        Ok(serde_json::from_str(&line)?)
    }

    fn call(&mut self, cmd: &str, args: Value) -> anyhow::Result<Value> {
        let mut req = serde_json::to_vec(&json!({"execute": cmd, "arguments": args}))?;
        req.push(b'\n');
        self.writer.write_all(&req)?;
        loop {
            let v = self.read()?;
            if v.get("event").is_some() {
                continue;
            }
            if let Some(e) = v.get("error") {
                bail!("QMP {cmd}: {e}");
            }
            return Ok(v["return"].clone());
        }
    }
}

struct Qemu(Child);

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn qemu(
    g: &virt_testguest::Guest,
    dir: &Path,
    name: &str,
    incoming: Option<&Path>,
) -> anyhow::Result<Qemu> {
    let mut c = Command::new("qemu-system-x86_64");
    c.args([
        "-accel", "tcg", "-M", "q35", "-m", "256", "-display", "none",
    ])
    .args(["-nodefaults", "-no-user-config", "-monitor", "none"])
    .arg("-serial")
    .arg(format!(
        "file:{}",
        dir.join(format!("{name}.log")).display()
    ))
    .arg("-qmp")
    .arg(format!(
        "unix:{},server=on,wait=off",
        dir.join(format!("{name}.qmp")).display()
    ))
    .arg("-kernel")
    .arg(&g.kernel)
    .arg("-initrd")
    .arg(&g.initrd)
    .args(["-append", virt_testguest::KERNEL_ARGS]);
    if let Some(sock) = incoming {
        c.arg("-incoming").arg(format!("unix:{}", sock.display()));
    }
    let child = c
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .context("qemu-system-x86_64 (apt-get install qemu-system-x86)")?;
    Ok(Qemu(child))
}

fn bare_once(g: &virt_testguest::Guest, dir: &Path) -> anyhow::Result<Sample> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let sock = dir.join("migrate.sock");
    let _src = qemu(g, dir, "src", None)?;
    let _dst = qemu(g, dir, "dst", Some(&sock))?;
    let log = dir.join("src.log");
    let deadline = Instant::now() + Duration::from_secs(90);
    while !std::fs::read_to_string(&log).is_ok_and(|s| s.contains(virt_testguest::BANNER)) {
        if Instant::now() > deadline {
            bail!("bare QEMU: no banner within 90 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // Idle, as the cluster's guest is.
    std::thread::sleep(Duration::from_secs(2));
    let mut src = Qmp::connect(&dir.join("src.qmp"))?;
    // QEMU alone throttles a migration to 128 MiB/s; libvirt, when the VMI asks for no
    // bandwidth limit, lifts that to its maximum (INT64_MAX bytes/s): the same here, or
    // the floor would be slowed by a default the cluster does not have.
    src.call("migrate-set-parameters", json!({"max-bandwidth": i64::MAX}))?;
    let t0 = Instant::now();
    src.call(
        "migrate",
        json!({"uri": format!("unix:{}", sock.display())}),
    )?;
    loop {
        let st = src.call("query-migrate", json!({}))?;
        match st["status"].as_str() {
            Some("completed") => {
                return Ok(Sample {
                    total: t0.elapsed(),
                    downtime_ms: st["downtime"].as_u64(),
                    bytes: st["ram"]["transferred"].as_u64(),
                    transfer: st["total-time"].as_u64().map(Duration::from_millis),
                    timeline: None,
                    service_outage: None,
                });
            }
            Some("failed") | Some("cancelled") => bail!("bare QEMU migration: {st}"),
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
        if t0.elapsed() > Duration::from_secs(120) {
            bail!("bare QEMU migration did not complete within 120 s");
        }
    }
}

// ---- the cluster ----

use crate::deploy::Kubectl as Kube;

pub(super) fn wait_for(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while !f() {
        if Instant::now() > deadline {
            bail!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Creates migration `name` of `vm` and waits for it to end: the time from the request to
/// `Succeeded` as a client's watch sees it, and the migration's last state; a failed
/// migration is an error naming its reason. One `kubectl get -w` per migration, not a
/// `kubectl get` every 100 ms: on two CPUs those processes took about a third of a CPU
/// from the migration being measured (perf, 2026-12-06).
pub(super) fn migrate_and_wait(
    kube: &Kube,
    ns: &str,
    vm: &str,
    name: &str,
) -> anyhow::Result<(Duration, Value)> {
    let vmim = json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstanceMigration",
        "metadata": {"name": name, "namespace": ns, "labels": {"kubevirt.io/vmi-name": vm}},
        "spec": {"vmiName": vm}
    })
    .to_string();
    let t0 = Instant::now();
    kube.run(&["create", "-f", "-"], Some(&vmim))?;
    // Started after the create: its first event is the object as it is then, so an end
    // reached before the watch began is still seen.
    let mut child = Command::new(&kube.bin)
        .arg("--kubeconfig")
        .arg(&kube.kubeconfig)
        .args(["-n", ns, "get", "virtualmachineinstancemigrations", name])
        .args(["-w", "-o", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("kubectl get -w")?;
    let stdout = child.stdout.take();
    // Killed and reaped on every return.
    let _watch = Children(vec![child]);
    let stdout = stdout.context("kubectl's output")?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for v in serde_json::Deserializer::from_reader(stdout).into_iter::<Value>() {
            match v {
                Ok(v) => {
                    if tx.send((Instant::now(), v)).is_err() {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
    });
    let deadline = t0 + Duration::from_secs(300);
    let (end, last) = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let (t, v) = match rx.recv_timeout(left) {
            Ok(e) => e,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                bail!("timed out waiting for migration {name} of {vm} to end")
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                bail!("the watch of migration {name} ended before it did")
            }
        };
        if matches!(v["status"]["phase"].as_str(), Some("Succeeded" | "Failed")) {
            break (t, v);
        }
    };
    if last["status"]["phase"] != "Succeeded" {
        bail!(
            "migration {name} of {vm} failed: {}",
            last["status"]["migrationState"]["failureReason"]
        );
    }
    Ok((end - t0, last))
}

fn cluster_once(kube: &Kube, ns: &str, w: &steps::Watches, n: usize) -> anyhow::Result<Sample> {
    let name = format!("bench-{n}");
    let created = std::time::SystemTime::now();
    migrate_and_wait(kube, ns, VM, &name)?;
    let vmi = kube
        .json(&["-n", ns, "get", "vmi", VM])?
        .context("the VMI is gone")?;
    let ms = &vmi["status"]["migrationState"];
    let timeline = steps::collect(kube, ns, w, &name, created)?;
    // When the client's watch saw `Succeeded`, as `bench start` times its steps: the poll
    // that waited for it (a kubectl process every 100 ms) lags by up to ~0.2 s, where the
    // bare side asks an open QMP socket every 20 ms.
    let total = timeline
        .at
        .get(&steps::Step::Succeeded)
        .and_then(|t| t.duration_since(created).ok())
        .with_context(|| format!("the watch never saw migration {name} succeed"))?;
    let transfer = match (
        timeline.at.get(&steps::Step::TransferStarted),
        timeline.at.get(&steps::Step::TransferDone),
    ) {
        (Some(a), Some(b)) => b.duration_since(*a).ok(),
        _ => None,
    };
    Ok(Sample {
        total,
        downtime_ms: ms["downtimeMs"].as_u64(),
        bytes: ms["dataProcessedBytes"].as_u64(),
        transfer,
        timeline: Some(timeline),
        service_outage: None,
    })
}

// ---- the Service probe ----

const SERVICE: &str = "mover";
const PROBER: &str = "prober";
/// The label the VM's pod carries for its Service.
const APP_LABEL: &str = "kubevirt-rs.io/bench";

/// The VM with a label on its pod, and a ClusterIP Service on the guest's port 80 (the test
/// guest serves its page there).
fn vm_and_service(ns: &str) -> anyhow::Result<String> {
    let mut vm: Value = serde_json::from_str(&super::test_guest_vm(VM, ns))?;
    vm["spec"]["template"]["metadata"] = json!({"labels": {APP_LABEL: VM}});
    let svc = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": SERVICE, "namespace": ns},
        "spec": {"selector": {APP_LABEL: VM}, "ports": [{"port": 80, "targetPort": 80}]}
    });
    Ok(format!("{vm}\n---\n{svc}\n"))
}

/// A client pod asking the Service at `ip` every 0.2 s, each answer logged with the host's
/// uptime (`/proc/uptime` is not namespaced, so this process places its own instants on the
/// same clock). By address: the local cluster runs no DNS.
fn prober(ns: &str, ip: &str) -> String {
    let probe = format!(
        "while :; do t=$(busybox cut -d' ' -f1 /proc/uptime); \
         if printf 'GET / HTTP/1.0\\r\\n\\r\\n' | busybox nc -w 1 {ip} 80 2>/dev/null \
            | busybox grep -q 'kubevirt-rs guest'; \
         then echo \"$t ok\"; else echo \"$t fail\"; fi; busybox sleep 0.2; done"
    );
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": PROBER, "namespace": ns},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "enableServiceLinks": false,
            "containers": [{
                "name": "probe", "image": crate::cluster::HELPER_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", probe]
            }]
        }
    })
    .to_string()
}

/// The host's uptime in seconds: the probe's clock.
fn uptime() -> anyhow::Result<f64> {
    let s = std::fs::read_to_string("/proc/uptime")?;
    s.split_whitespace()
        .next()
        .and_then(|t| t.parse().ok())
        .context("/proc/uptime")
}

/// The longest stretch without an answer among the probe's lines (`UPTIME ok|fail`) between
/// `from` and `to`: from the last answer before a failure (or `from`) to the next answer (or
/// the last line, if the window ends down). None when no line falls in the window.
fn longest_outage(log: &str, from: f64, to: f64) -> Option<f64> {
    let lines = log.lines().filter_map(|l| {
        let (t, r) = l.split_once(' ')?;
        Some((t.parse::<f64>().ok()?, r.trim() == "ok"))
    });
    let mut last_ok = from;
    let mut down = false;
    let mut worst = 0.0f64;
    let mut seen = false;
    let mut last_t = from;
    for (t, ok) in lines {
        if t < from {
            continue;
        }
        if t > to {
            break;
        }
        seen = true;
        last_t = t;
        if ok {
            if down {
                worst = worst.max(t - last_ok);
                down = false;
            }
            last_ok = t;
        } else {
            down = true;
        }
    }
    if down {
        worst = worst.max(last_t - last_ok);
    }
    seen.then_some(worst)
}

/// Runs the benchmark.
pub fn run(args: MigrateArgs) -> anyhow::Result<()> {
    let runs = args.runs.max(1);
    // Taken before the run: the figures belong to the code and machine at its start.
    let provenance = Provenance::probe(format!("cargo xtask bench migrate --runs {runs}"));
    let guest = virt_testguest::ensure(&virt_testguest::default_dir())?;
    let kubeconfig = args
        .kubeconfig
        .clone()
        .or_else(|| std::env::var_os("KUBECONFIG").map(PathBuf::from))
        .unwrap_or_else(|| crate::target_dir().join("cluster/kubeconfig"));
    let kube = Kube::new(kubeconfig);
    let nodes = kube.run(&["get", "nodes", "-o", "name"], None)?;
    if nodes.lines().count() < 2 {
        bail!(
            "live migration needs two nodes: cargo xtask cluster up --nodes 2 && cargo xtask deploy"
        );
    }
    let ns = format!("bench-migrate-{}", std::process::id());
    kube.run(&["create", "namespace", &ns], None)?;
    let dir =
        std::env::temp_dir().join(format!("kubevirt-rs-bench-migrate-{}", std::process::id()));
    let result = (|| -> anyhow::Result<(Vec<Sample>, Vec<Sample>)> {
        kube.run(&["apply", "-f", "-"], Some(&vm_and_service(&ns)?))?;
        let ip = kube.run(
            &[
                "-n",
                &ns,
                "get",
                "service",
                SERVICE,
                "-o",
                "jsonpath={.spec.clusterIP}",
            ],
            None,
        )?;
        kube.run(&["apply", "-f", "-"], Some(&prober(&ns, ip.trim())))?;
        wait_for("the VM to run", Duration::from_secs(300), || {
            kube.run(
                &[
                    "-n",
                    &ns,
                    "get",
                    "vmi",
                    VM,
                    "-o",
                    "jsonpath={.status.phase}",
                ],
                None,
            )
            .is_ok_and(|p| p == "Running")
        })?;
        // Booted and idle (the banner comes ~2 s after Running under TCG), and its Service
        // answering the client.
        wait_for(
            "the VM's Service to answer the probe",
            Duration::from_secs(120),
            || {
                kube.run(&["-n", &ns, "logs", PROBER, "--tail=1"], None)
                    .is_ok_and(|l| l.trim_end().ends_with(" ok"))
            },
        )?;
        std::thread::sleep(Duration::from_secs(5));
        // The two sides alternate so that a slow patch of this shared machine hits both.
        let mut out = (Vec::new(), Vec::new());
        let watches = steps::Watches::start(&kube, &ns)?;
        for n in 0..runs {
            let from = uptime()?;
            let mut s = cluster_once(&kube, &ns, &watches, n)?;
            // The source pod goes with its grace period; let the node settle.
            std::thread::sleep(Duration::from_secs(5));
            let b = bare_once(&guest, &dir)?;
            // The window ends here, well after the source pod has gone: an outage that
            // outlasted the switch-over is counted in full.
            let log = kube.run(&["-n", &ns, "logs", PROBER], None)?;
            s.service_outage = longest_outage(&log, from, uptime()?);
            eprintln!("cluster run {n}: {s:?}");
            eprintln!("bare run {n}: {b:?}");
            out.0.push(s);
            out.1.push(b);
        }
        Ok(out)
    })();
    let _ = kube.run(&["delete", "namespace", &ns, "--wait=false"], None);
    let _ = std::fs::remove_dir_all(&dir);
    let (cluster, bare) = result?;
    let table = table(&cluster, &bare);
    print!("{table}");
    let description = format!(
        "An idle test guest (busybox initramfs, 256 MiB, TCG) migrated {runs} times between the \
         two nodes of the local cluster (both kubelets on this machine; the stream goes \
         launcher → virt-handler's mTLS proxy → the other handler → the target launcher over the \
         bridge), against bare QEMU → QEMU (QMP `migrate` over a unix socket, no TLS, no \
         libvirt; QEMU's own 128 MiB/s bandwidth default lifted, as libvirt lifts it), the \
         two alternating in one run. Total = request → done as a client sees it \
         (the VMIM's create request → `Succeeded` seen by the client's watch of the VMIMs; QMP \
         `migrate` → `completed`, polled every 20 ms); the cluster's total includes the target pod (scheduling, image copy, its \
         libvirtd) and the hand-offs through the API. Transfer: QEMU's `total-time`; for the \
         cluster the source virt-handler's log lines from starting libvirt's migration to its \
         end (the kubelet's timestamps); both include the switch-over. Downtime: \
         libvirt's/QEMU's measured pause. Service outage: the longest time a ClusterIP \
         Service selecting the VM went unanswered (from the last answer to the next) for a \
         client pod asking it every 0.2 s (`nc -w 1`, so ~1 s resolution while it is down), \
         from the VMIM's create until the next run; what a user of the guest's service loses \
         (the endpoint moves from the source pod to the target pod). Median and min–max over \
         the runs."
    );
    super::record_table(
        section::MIGRATE,
        provenance,
        &description,
        &table,
        args.no_docs,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The floor half of `bench migrate` works: two QEMUs (TCG, the test guest) migrate
    /// over loopback and the source reports bytes sent (~20 s), so a broken floor shows in
    /// the workspace tests, not first in a benchmark run.
    #[test]
    fn bare_qemu_migrates() {
        let guest = virt_testguest::ensure(&virt_testguest::default_dir()).expect("guest");
        let dir = std::env::temp_dir().join(format!("xtask-bare-mig-{}", std::process::id()));
        let s = bare_once(&guest, &dir).expect("bare migration");
        let _ = std::fs::remove_dir_all(&dir);
        eprintln!("{s:?}");
        assert!(s.bytes.unwrap_or(0) > 0);
    }

    #[test]
    fn the_service_outage_runs_from_the_last_answer_to_the_next() {
        let log = "1.0 ok\n2.0 ok\n2.2 fail\n3.4 fail\n3.6 ok\n4.0 fail\n4.2 ok\n9.0 fail\n";
        // 2.0 → 3.6 is the longest inside [1.5, 5.0]; 9.0 lies outside.
        assert!((longest_outage(log, 1.5, 5.0).unwrap() - 1.6).abs() < 1e-9);
        // A window that ends down counts to its last line, from the last answer.
        assert!(
            (longest_outage("1.0 ok\n1.2 fail\n1.4 fail\n", 0.0, 2.0).unwrap() - 0.4).abs() < 1e-9
        );
        // Down from the start of the window: measured from the window's start.
        assert!((longest_outage("5.0 fail\n6.0 ok\n", 4.5, 7.0).unwrap() - 1.5).abs() < 1e-9);
        assert_eq!(longest_outage("1.0 ok\n2.0 ok\n", 1.0, 3.0), Some(0.0));
        assert_eq!(longest_outage("1.0 ok\n", 5.0, 6.0), None);
    }

    #[test]
    fn table_has_medians_and_ranges() {
        let s = |t: u64, d: u64| Sample {
            total: Duration::from_millis(t),
            downtime_ms: Some(d),
            bytes: Some(100 << 20),
            transfer: Some(Duration::from_millis(t / 2)),
            timeline: None,
            service_outage: None,
        };
        let t = table(&[s(9000, 50), s(7000, 40), s(8000, 60)], &[s(1000, 10)]);
        assert!(
            t.contains(
                "| 8.00 s (7.00–9.00) | 4.00 s (3.50–4.50) | 50 ms (40–60) | 100.0 MiB (100.0–100.0) |"
            ),
            "{t}"
        );
        // 4.0 s vs 0.5 s of transfer, 50 vs 10 ms of downtime, 8.0 s vs 1.0 + 2 s in all.
        assert!(
            t.contains("transfer ≤ 1.5× bare: 8.00×, not met; downtime ≤ 2× bare: 5.00×, not met; total ≤ bare + 2 s: 8.00 s vs 3.00 s, not met."),
            "{t}"
        );
        // Without timelines there is no breakdown table.
        assert!(!t.contains("step by step"), "{t}");
    }
}
