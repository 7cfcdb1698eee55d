//! `cargo xtask soak --minutes N`: light VM churn on the local cluster across several etcd
//! compactions, failing as soon as an operation stalls (issue 22: a virt-handler whose watch
//! fell behind a compaction stayed blind and migrations to its node hung).
//!
//! etcd compacts periodically (`--auto-compaction-mode=periodic`, retention 1 h in the
//! deployed etcd); a soak of hours is no test anyone runs, so the soak compacts etcd itself
//! through etcd's own compaction API with the same rule as the periodic compactor —
//! every `--compaction-period`, keep one period of history — and SIGKILLs virt-apiserver
//! after each compaction (local cluster only) so that every watch of every component
//! reconnects from a resourceVersion etcd may have forgotten.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::deploy::{self, Kubectl};

const NS: &str = "kubevirt-rs-soak";
const GUEST: &str = "localhost/kubevirt-rs/test-guest:latest";

/// Arguments of `cargo xtask soak`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// How long to churn (the run also lasts until at least two compactions happened).
    #[arg(long, default_value_t = 10)]
    pub minutes: u64,
    /// VMs kept in the churn.
    #[arg(long, default_value_t = 3)]
    pub vms: usize,
    /// etcd history kept, and time between compactions (seconds).
    #[arg(long, default_value_t = 120)]
    pub compaction_period: u64,
    /// Longest an operation (start, stop, migration, restart) may take before the soak
    /// calls it stalled (seconds).
    #[arg(long, default_value_t = 300)]
    pub stall_seconds: u64,
    /// Compactions preceded by a SIGKILL of virt-apiserver (0 for a cluster whose
    /// processes are not on this host).
    #[arg(long, default_value_t = 2)]
    pub kills: u32,
    /// Kubeconfig [default: $KUBECONFIG, else target/cluster/kubeconfig].
    #[arg(long)]
    pub kubeconfig: Option<std::path::PathBuf>,
}

/// A churn operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Migrate,
    StopStart,
    Restart,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Migrate => "migrate",
            Op::StopStart => "stop+start",
            Op::Restart => "restart",
        }
    }
}

/// The operation of round `round` on VM `vm`: every VM goes through every kind.
fn op_for(round: usize, vm: usize) -> Op {
    match (round + vm) % 3 {
        0 => Op::Migrate,
        1 => Op::StopStart,
        _ => Op::Restart,
    }
}

/// The revision to compact at, keeping one period of history: the revision seen one tick
/// ago (etcd's periodic compactor does the same with its retention), unless etcd is
/// already compacted that far.
fn compaction_target(history: &mut Vec<i64>, now: i64, compacted: i64) -> Option<i64> {
    history.push(now);
    (history.len() >= 2)
        .then(|| history[history.len() - 2])
        .filter(|at| *at > compacted)
}

/// The churn loops' VM (soak and chaos): the 128 MiB test guest booted from its kernel,
/// runStrategy Always, labelled `app: <app>` in `ns`.
pub(crate) fn vm_manifest(name: &str, ns: &str, app: &str) -> String {
    json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
        "spec": {"runStrategy": "Always", "template": {"spec": {
            "terminationGracePeriodSeconds": 5,
            "domain": {"memory": {"guest": "128Mi"}, "firmware": {"kernelBoot": {
                "kernelArgs": virt_testguest::KERNEL_ARGS,
                "container": {"image": GUEST, "imagePullPolicy": "IfNotPresent",
                              "kernelPath": "/vmlinuz", "initrdPath": "/initramfs.gz"}}}}}}}
    })
    .to_string()
}

struct Soak {
    k: Kubectl,
    stall: Duration,
}

impl Soak {
    fn vmi(&self, name: &str) -> anyhow::Result<Option<Value>> {
        self.k.json(&["-n", NS, "get", "vmi", name])
    }

    /// Waits until `f` holds, failing with `what` after the stall limit.
    fn wait(
        &self,
        what: &str,
        mut f: impl FnMut() -> anyhow::Result<bool>,
    ) -> anyhow::Result<Duration> {
        let start = Instant::now();
        let mut last = String::new();
        while start.elapsed() < self.stall {
            match f() {
                Ok(true) => return Ok(start.elapsed()),
                Ok(false) => {}
                Err(e) => last = format!("{e:#}"),
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        bail!("STALLED: {what} not done after {:?} {last}", self.stall)
    }

    fn running(&self, name: &str, not_uid: Option<&str>) -> anyhow::Result<Duration> {
        self.wait(&format!("{name} Running"), || {
            Ok(self.vmi(name)?.is_some_and(|v| {
                v["status"]["phase"] == "Running"
                    && not_uid.is_none_or(|u| v["metadata"]["uid"] != u)
            }))
        })
    }

    fn run_op(&self, op: Op, name: &str, seq: usize) -> anyhow::Result<Duration> {
        let vmi = retry("reading the VMI", || self.vmi(name))?
            .context("VMI gone before the operation")?;
        let uid = vmi["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let node = vmi["status"]["nodeName"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let start = Instant::now();
        match op {
            Op::Migrate => {
                // A fixed name: a create retried after an unanswered success stays one.
                let created = format!("virtualmachineinstancemigration/{name}-{seq}");
                let mig = json!({"apiVersion": "kubevirt.io/v1",
                    "kind": "VirtualMachineInstanceMigration",
                    "metadata": {"name": format!("{name}-{seq}"), "namespace": NS},
                    "spec": {"vmiName": name}});
                retry("creating the migration", || {
                    self.k.run(&["apply", "-f", "-"], Some(&mig.to_string()))
                })?;
                let mut phase = String::new();
                self.wait(&format!("{created} of {name} to end"), || {
                    let m = self.k.json(&["-n", NS, "get", &created])?;
                    phase = m
                        .and_then(|m| m["status"]["phase"].as_str().map(str::to_string))
                        .unwrap_or_default();
                    Ok(phase == "Succeeded" || phase == "Failed")
                })?;
                if phase != "Succeeded" {
                    bail!("{created} of {name}: {phase}");
                }
                let after = retry("reading the VMI", || self.vmi(name))?
                    .context("VMI gone after migrating")?;
                if after["status"]["nodeName"] == node.as_str() {
                    bail!("{name} still on {node} after a successful migration");
                }
            }
            Op::StopStart => {
                let patch = |s: &str| {
                    retry("patching runStrategy", || {
                        self.k.run(
                            &[
                                "-n",
                                NS,
                                "patch",
                                "vm",
                                name,
                                "--type=merge",
                                "-p",
                                &format!(r#"{{"spec":{{"runStrategy":"{s}"}}}}"#),
                            ],
                            None,
                        )
                    })
                };
                patch("Halted")?;
                self.wait(&format!("{name} stopped"), || Ok(self.vmi(name)?.is_none()))?;
                patch("Always")?;
                self.running(name, Some(&uid))?;
            }
            Op::Restart => {
                retry("deleting the VMI", || {
                    self.k.run(
                        &[
                            "-n",
                            NS,
                            "delete",
                            "vmi",
                            name,
                            "--wait=false",
                            "--ignore-not-found",
                        ],
                        None,
                    )
                })?;
                self.running(name, Some(&uid))?;
            }
        }
        Ok(start.elapsed())
    }
}

/// The cluster's etcd through a port-forward (`virt_devenv::cluster_etcd`).
struct EtcdForward(virt_devenv::cluster_etcd::ClusterEtcd);

impl EtcdForward {
    fn open(k: &Kubectl) -> anyhow::Result<Self> {
        Ok(Self(virt_devenv::cluster_etcd::ClusterEtcd::open(
            &k.bin,
            &k.kubeconfig,
        )?))
    }

    /// The store's revision, and a compaction at `at` when given.
    async fn tick(&self, at: Option<i64>) -> anyhow::Result<i64> {
        let tls = virt_apiserver::storage::EtcdTls {
            ca_pem: self.0.ca_pem.clone(),
            cert_pem: self.0.cert_pem.clone(),
            key_pem: self.0.key_pem.clone(),
        };
        let storage = virt_apiserver::storage::Storage::connect_tls(
            std::slice::from_ref(&self.0.url),
            Some(&tls),
        )
        .await
        .context("connecting to etcd")?;
        let now = storage.current_revision().await?;
        if let Some(at) = at {
            storage.compact(at).await?;
        }
        Ok(now)
    }
}

/// Compacts etcd every `period` until `stop`. The first `kills` times, virt-apiserver is
/// SIGKILLed first and etcd then compacted at its current revision, so that every watch
/// reconnects from a resourceVersion etcd no longer has; later compactions keep one
/// period of history, as etcd's periodic compactor does. (Kills are few: kubelet doubles
/// its restart delay for a container killed again within ten minutes.)
fn compactor(
    k: Kubectl,
    period: Duration,
    mut kills: u32,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU32>,
) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut history = Vec::new();
    let mut compacted = 0;
    let mut next = Instant::now() + period;
    while !stop.load(Ordering::Relaxed) {
        if Instant::now() < next {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        next += period;
        // A new forward each time: the pod may have been replaced meanwhile.
        let fwd = EtcdForward::open(&k)?;
        let now = rt.block_on(fwd.tick(None))?;
        let at = if kills > 0 {
            kills -= 1;
            if virt_devenv::procs::kill_in_containers("virt-apiserver") == 0 {
                bail!("no virt-apiserver container process on this host to kill (use --kills 0)");
            }
            eprintln!(
                "[soak] virt-apiserver killed: every watch will resume from its last resourceVersion"
            );
            let now = rt.block_on(fwd.tick(None))?;
            history.push(now);
            now
        } else {
            match compaction_target(&mut history, now, compacted) {
                Some(at) => at,
                None => continue,
            }
        };
        rt.block_on(fwd.tick(Some(at)))?;
        compacted = at;
        let n = done.fetch_add(1, Ordering::Relaxed) + 1;
        eprintln!("[soak] etcd compaction {n} at revision {at} (store at {now})");
    }
    Ok(())
}

/// Retries `f` while the API is briefly away (virt-apiserver restarting after a kill).
fn retry<T>(what: &str, mut f: impl FnMut() -> anyhow::Result<T>) -> anyhow::Result<T> {
    let start = Instant::now();
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(e) if start.elapsed() < Duration::from_secs(120) => {
                eprintln!("[soak] {what}: {e:#}; retrying");
                std::thread::sleep(Duration::from_secs(2));
            }
            Err(e) => return Err(e.context(format!("{what}: API unavailable for 120 s"))),
        }
    }
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let k = Kubectl::new(deploy::kubeconfig(args.kubeconfig.clone()));
    let nodes = k.run(&["get", "nodes", "-o", "name"], None)?;
    if nodes.lines().count() < 2 {
        bail!("the soak migrates VMs: it needs two nodes (cargo xtask cluster up --nodes 2)");
    }
    k.run(&["get", "apiservice", "v1.kubevirt.io"], None)
        .context("kubevirt-rs is not deployed (cargo xtask deploy)")?;
    let soak = Soak {
        k: k.clone(),
        stall: Duration::from_secs(args.stall_seconds),
    };
    let _ = k.run(&["delete", "namespace", NS, "--wait=true"], None);
    k.run(&["create", "namespace", NS], None)?;
    let names: Vec<String> = (0..args.vms).map(|i| format!("soak-{i}")).collect();
    for n in &names {
        k.run(&["apply", "-f", "-"], Some(&vm_manifest(n, NS, "soak")))?;
    }
    for n in &names {
        let took = soak.running(n, None)?;
        eprintln!("[soak] {n} Running after {took:?}");
    }

    let stop = Arc::new(AtomicBool::new(false));
    let compactions = Arc::new(AtomicU32::new(0));
    let period = Duration::from_secs(args.compaction_period);
    let compactor = {
        let (k, stop, done) = (k.clone(), stop.clone(), compactions.clone());
        let kills = args.kills;
        std::thread::spawn(move || compactor(k, period, kills, stop, done))
    };

    let started = Instant::now();
    let deadline = Duration::from_secs(args.minutes * 60);
    let mut times: Vec<(Op, Duration)> = Vec::new();
    let mut result = Ok(());
    let mut round = 0;
    'churn: while started.elapsed() < deadline || compactions.load(Ordering::Relaxed) < 2 {
        if compactor.is_finished() {
            break;
        }
        for (i, n) in names.iter().enumerate() {
            let op = op_for(round, i);
            match soak.run_op(op, n, round) {
                Ok(took) => {
                    eprintln!(
                        "[soak {:>4}s] {} {n}: {took:.1?}",
                        started.elapsed().as_secs(),
                        op.name()
                    );
                    times.push((op, took));
                }
                Err(e) => {
                    result = Err(e.context(format!("{} {n}", op.name())));
                    break 'churn;
                }
            }
        }
        round += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let compactor = compactor
        .join()
        .map_err(|_| anyhow::anyhow!("the compactor panicked"))?;

    println!("\n== soak: {:?}, {} VMs ==", started.elapsed(), args.vms);
    for op in [Op::Migrate, Op::StopStart, Op::Restart] {
        let mut t: Vec<Duration> = times
            .iter()
            .filter(|(o, _)| *o == op)
            .map(|x| x.1)
            .collect();
        let max = t.iter().max().copied().unwrap_or_default();
        println!(
            "{:<11} {:>3} done, median {:.1?}, max {max:.1?}",
            op.name(),
            t.len(),
            median(&mut t)
        );
    }
    let n = compactions.load(Ordering::Relaxed);
    println!("etcd compactions: {n} (every {period:?})");
    result?;
    compactor.context("the compactor failed")?;
    if n < 2 {
        bail!("only {n} compactions happened: the soak must span at least two");
    }
    let _ = k.run(&["delete", "namespace", NS, "--wait=false"], None);
    println!("soak passed: no operation stalled across {n} compactions");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_vm_goes_through_every_operation() {
        for vm in 0..3 {
            let ops: Vec<Op> = (0..3).map(|r| op_for(r, vm)).collect();
            for op in [Op::Migrate, Op::StopStart, Op::Restart] {
                assert!(ops.contains(&op), "vm {vm}: {ops:?}");
            }
        }
    }

    #[test]
    fn compaction_keeps_one_period_of_history() {
        let mut h = Vec::new();
        assert_eq!(compaction_target(&mut h, 10, 0), None);
        assert_eq!(compaction_target(&mut h, 25, 0), Some(10));
        assert_eq!(compaction_target(&mut h, 40, 10), Some(25));
        // Compacted further already (after a kill, at the then current revision).
        assert_eq!(compaction_target(&mut h, 50, 45), None);
    }
}
