//! `cargo xtask chaos`: while a loop creates, starts, stops, restarts, migrates and deletes
//! VMs on the local cluster, SIGKILL in turn virt-apiserver, the virt-controller leader, a
//! virt-handler, one virt-launcher and etcd (its pod deleted too; the data stays on its
//! volume). After each fault the loop pauses and the cluster must converge to exactly what
//! the loop asked for: no VM lost or made twice, no VMI stuck, no QEMU process without its
//! VMI and no Running VMI without its QEMU (counted from this host's /proc: the nodes are
//! network namespaces of this machine). Last, a backup taken before the loop is restored and
//! must bring back exactly the VMs of that moment, and the cluster converges to them.
//!
//! The time from each fault to convergence is printed and written to docs/reliability.md.
//! Issue 20 point 5; docs/reliability.md says how to read it.

mod model;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use crate::bench::report::{Machine, commit, now_utc, replace_section};
use crate::deploy::{self, Kubectl};
use model::{Op, QemuSeen, Seen, Want};

const NS: &str = "kubevirt-rs-chaos";
const KUBEVIRT_NS: &str = "kubevirt";
const HEADING: &str = "## Chaos suite (cargo xtask chaos)";

/// Arguments of `cargo xtask chaos`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// VMs the loop works on (half of them are left alone in each round).
    #[arg(long, default_value_t = 10)]
    pub vms: usize,
    /// Longest the cluster may take to converge after a fault (seconds).
    #[arg(long, default_value_t = 300)]
    pub converge_seconds: u64,
    /// Longest one operation of the loop may take (seconds).
    #[arg(long, default_value_t = 300)]
    pub stall_seconds: u64,
    /// Faults to inject, in order [default: every one].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub faults: Vec<Fault>,
    /// Skip the backup-and-restore step.
    #[arg(long)]
    pub no_restore: bool,
    /// Do not write docs/reliability.md.
    #[arg(long)]
    pub no_docs: bool,
    /// Kubeconfig [default: $KUBECONFIG, else target/cluster/kubeconfig].
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
}

/// A process the suite kills.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Every virt-apiserver replica.
    Apiserver,
    /// The virt-controller holding the leader lease.
    Controller,
    /// The virt-handler of the node with the most guests.
    Handler,
    /// The virt-launcher of one running guest the loop leaves alone.
    Launcher,
    /// etcd's process, then its pod (the StatefulSet makes a new one on the same volume).
    Etcd,
}

impl Fault {
    const ALL: [Fault; 5] = [
        Fault::Apiserver,
        Fault::Controller,
        Fault::Handler,
        Fault::Launcher,
        Fault::Etcd,
    ];

    /// As `--faults` takes it.
    fn arg(self) -> &'static str {
        match self {
            Fault::Apiserver => "apiserver",
            Fault::Controller => "controller",
            Fault::Handler => "handler",
            Fault::Launcher => "launcher",
            Fault::Etcd => "etcd",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Fault::Apiserver => "virt-apiserver (every replica)",
            Fault::Controller => "virt-controller (leader)",
            Fault::Handler => "virt-handler (busiest node)",
            Fault::Launcher => "virt-launcher (one guest)",
            Fault::Etcd => "etcd (process, then pod)",
        }
    }
}

/// The loop's intent and progress, shared with the fault injector.
#[derive(Debug, Default)]
struct Shared {
    want: Mutex<BTreeMap<String, Want>>,
    /// VM name → the uid it had when the loop created it.
    uids: Mutex<BTreeMap<String, String>>,
    /// Rounds whose operations were all issued.
    issued: AtomicUsize,
    pause: AtomicBool,
    idle: AtomicBool,
    stop: AtomicBool,
    done: Mutex<Vec<Done>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One finished operation of the loop.
#[derive(Debug, Clone)]
struct Done {
    op: Op,
    vm: String,
    took: Duration,
    /// None when it did what it should; otherwise what happened.
    problem: Option<String>,
    /// A migration that ended Failed with its guest still running on the source: allowed
    /// under a fault (KubeVirt behaves the same), counted separately.
    migration_failed: bool,
}

/// The cluster as the suite drives it.
#[derive(Clone, Debug)]
struct Cluster {
    k: Kubectl,
    stall: Duration,
}

impl Cluster {
    fn ns(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut a = vec!["-n", NS];
        a.extend_from_slice(args);
        self.k.run(&a, None)
    }

    fn vmi(&self, name: &str) -> anyhow::Result<Option<Value>> {
        self.k.json(&["-n", NS, "get", "vmi", name])
    }

    fn vm(&self, name: &str) -> anyhow::Result<Option<Value>> {
        self.k.json(&["-n", NS, "get", "vm", name])
    }

    fn virt(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(crate::user_bin::dir().join("kubectl-virt"))
            .arg("--kubeconfig")
            .arg(&self.k.kubeconfig)
            .args(["-n", NS])
            .args(args)
            .output()
            .context("running kubectl-virt (cargo xtask up builds it)")?;
        if !out.status.success() {
            bail!(
                "kubectl virt {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// kubevirt-rs's pods that are not Ready, by name.
    fn components_unready(&self) -> anyhow::Result<Vec<String>> {
        let pods: Value = serde_json::from_str(
            &self
                .k
                .run(&["-n", KUBEVIRT_NS, "get", "pods", "-o", "json"], None)?,
        )?;
        Ok(pods["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| {
                !p["status"]["conditions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            })
            .map(|p| {
                format!(
                    "{} not Ready",
                    p["metadata"]["name"].as_str().unwrap_or("?")
                )
            })
            .collect())
    }

    /// `seen` with each running launcher's boot count: the test guest's banners in the pod's
    /// `guest-console-log` (a pod whose log cannot be read is left out). A kubectl call per
    /// pod, so read only before a fault and after convergence, not while converging.
    fn with_boots(&self, mut seen: Seen) -> Seen {
        for p in seen.pods.iter().filter(|p| p.live()) {
            if let Ok(log) = self.ns(&["logs", &p.name, "-c", "guest-console-log"]) {
                seen.boots
                    .insert(p.uid.clone(), log.matches(virt_testguest::BANNER).count());
            }
        }
        seen
    }

    /// Everything the checks compare, read now.
    fn seen(&self) -> anyhow::Result<Seen> {
        let objects: Value = serde_json::from_str(&self.ns(&[
            "get",
            "virtualmachines,virtualmachineinstances,virtualmachineinstancemigrations",
            "-o",
            "json",
        ])?)?;
        let pods: Value = serde_json::from_str(&self.ns(&[
            "get",
            "pods",
            "-l",
            "kubevirt.io=virt-launcher",
            "-o",
            "json",
        ])?)?;
        let prefix = format!("{NS}_");
        let qemus = virt_devenv::procs::in_containers()
            .into_iter()
            .filter(|p| p.comm.starts_with("qemu-system"))
            .filter_map(|p| {
                let vm = p.qemu_domain()?.strip_prefix(&prefix)?.to_string();
                Some(QemuSeen {
                    pid: p.pid,
                    vm,
                    pod_uid: p.pod_uid,
                })
            })
            .collect();
        Ok(Seen::from_lists(&objects, &pods, qemus))
    }
}

/// Retries `f` while the API is away (a killed component restarting), up to two minutes.
fn retry<T>(what: &str, mut f: impl FnMut() -> anyhow::Result<T>) -> anyhow::Result<T> {
    let start = Instant::now();
    loop {
        match f() {
            Ok(v) => return Ok(v),
            Err(e) if start.elapsed() < Duration::from_secs(120) => {
                tracing_line(&format!("{what}: {e:#}; retrying"));
                std::thread::sleep(Duration::from_secs(2));
            }
            Err(e) => return Err(e.context(format!("{what}: no success for 120 s"))),
        }
    }
}

fn tracing_line(msg: &str) {
    eprintln!("[chaos] {msg}");
}

/// An issued operation the loop waits on.
#[derive(Debug)]
struct Pending {
    op: Op,
    vm: String,
    started: Instant,
    /// The VMI's uid before (start/restart/create must end with another one).
    old_vmi: Option<String>,
    /// The node before a migration, and the migration's name.
    migration: Option<(String, String)>,
}

impl Cluster {
    /// Issues `op` on `vm`; every request is idempotent, so one retried after an answer that
    /// was lost (the apiserver killed mid-request) does no harm.
    fn issue(&self, op: Op, vm: &str, seq: usize, shared: &Shared) -> anyhow::Result<Pending> {
        let vmi = retry("reading the VMI", || self.vmi(vm))?;
        let old_vmi = vmi
            .as_ref()
            .and_then(|v| v["metadata"]["uid"].as_str().map(str::to_string));
        let mut migration = None;
        match op {
            Op::Create => {
                retry("creating the VM", || {
                    self.k.run(
                        &["apply", "-f", "-"],
                        Some(&crate::soak::vm_manifest(vm, NS, "chaos")),
                    )
                })?;
                let uid = retry("reading the new VM", || {
                    self.vm(vm)?
                        .and_then(|v| v["metadata"]["uid"].as_str().map(str::to_string))
                        .context("the VM is not there yet")
                })?;
                lock(&shared.uids).insert(vm.to_string(), uid);
            }
            Op::Start | Op::Stop => {
                let strategy = if op == Op::Start { "Always" } else { "Halted" };
                retry("setting runStrategy", || {
                    self.ns(&[
                        "patch",
                        "vm",
                        vm,
                        "--type=merge",
                        "-p",
                        &format!(r#"{{"spec":{{"runStrategy":"{strategy}"}}}}"#),
                    ])
                })?;
            }
            Op::Restart => {
                // Through the subresource; a retry first checks whether the first one did it.
                retry("restarting", || {
                    let now = self.vmi(vm)?;
                    let uid = now.as_ref().and_then(|v| v["metadata"]["uid"].as_str());
                    if uid.is_some() && uid != old_vmi.as_deref() {
                        return Ok(String::new());
                    }
                    self.virt(&["restart", vm])
                })?;
            }
            Op::Migrate => {
                let node = vmi
                    .as_ref()
                    .and_then(|v| v["status"]["nodeName"].as_str())
                    .unwrap_or_default()
                    .to_string();
                let name = format!("{vm}-m{seq}");
                let mig = json!({"apiVersion": "kubevirt.io/v1",
                    "kind": "VirtualMachineInstanceMigration",
                    "metadata": {"name": name, "namespace": NS},
                    "spec": {"vmiName": vm}});
                retry("creating the migration", || {
                    self.k.run(&["apply", "-f", "-"], Some(&mig.to_string()))
                })?;
                migration = Some((node, name));
            }
            Op::Delete => {
                retry("deleting the VM", || {
                    self.ns(&["delete", "vm", vm, "--wait=false", "--ignore-not-found"])
                })?;
            }
        }
        lock(&shared.want).insert(vm.to_string(), op.leaves());
        Ok(Pending {
            op,
            vm: vm.to_string(),
            started: Instant::now(),
            old_vmi,
            migration,
        })
    }

    /// Whether `p` is done: Some(problem or None) when it ended, None while it goes on.
    fn finished(&self, p: &Pending) -> anyhow::Result<Option<(Option<String>, bool)>> {
        let running_new = |vmi: &Option<Value>, old: Option<&str>| {
            vmi.as_ref().is_some_and(|v| {
                v["status"]["phase"] == "Running" && v["metadata"]["uid"].as_str() != old
            })
        };
        Ok(match p.op {
            Op::Create | Op::Start => running_new(&self.vmi(&p.vm)?, None).then_some((None, false)),
            Op::Restart => {
                running_new(&self.vmi(&p.vm)?, p.old_vmi.as_deref()).then_some((None, false))
            }
            Op::Stop => self.vmi(&p.vm)?.is_none().then_some((None, false)),
            Op::Delete => {
                (self.vm(&p.vm)?.is_none() && self.vmi(&p.vm)?.is_none()).then_some((None, false))
            }
            Op::Migrate => {
                let Some((node, name)) = &p.migration else {
                    return Ok(Some((Some("no migration issued".into()), false)));
                };
                let m = self
                    .k
                    .json(&["-n", NS, "get", "virtualmachineinstancemigration", name])?;
                let phase = m
                    .as_ref()
                    .and_then(|m| m["status"]["phase"].as_str())
                    .unwrap_or_default()
                    .to_string();
                match phase.as_str() {
                    "Succeeded" => {
                        let now = self.vmi(&p.vm)?;
                        let on = now
                            .as_ref()
                            .and_then(|v| v["status"]["nodeName"].as_str())
                            .unwrap_or_default();
                        if on == node {
                            Some((
                                Some(format!("{name} Succeeded but the guest is still on {node}")),
                                false,
                            ))
                        } else {
                            Some((None, false))
                        }
                    }
                    "Failed" => Some((None, true)),
                    _ => None,
                }
            }
        })
    }
}

/// The loop: rounds of operations on half the VMs each, every operation awaited, until
/// `stop`; between rounds it waits while `pause` is set.
fn churn(c: Cluster, names: Vec<String>, shared: Arc<Shared>) -> anyhow::Result<()> {
    // Staggered, so that each round mixes operations instead of, say, stopping every VM.
    // (A round takes every other VM, so VM i is the (i/2)-th of its round.)
    let mut turns: Vec<usize> = (0..names.len()).map(|i| i / 2).collect();
    let mut round = 0;
    let mut seq = 0;
    loop {
        while shared.pause.load(Ordering::SeqCst) && !shared.stop.load(Ordering::SeqCst) {
            shared.idle.store(true, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(200));
        }
        shared.idle.store(false, Ordering::SeqCst);
        if shared.stop.load(Ordering::SeqCst) {
            shared.idle.store(true, Ordering::SeqCst);
            return Ok(());
        }
        let mut pending = Vec::new();
        for (i, vm) in names.iter().enumerate() {
            if !model::in_round(i, round) {
                continue;
            }
            let want = lock(&shared.want).get(vm).copied().unwrap_or(Want::ABSENT);
            let op = model::next_op(want, turns[i]);
            if want.running {
                turns[i] += 1;
            }
            seq += 1;
            pending.push(c.issue(op, vm, seq, &shared)?);
        }
        shared.issued.store(round + 1, Ordering::SeqCst);
        while !pending.is_empty() {
            std::thread::sleep(Duration::from_secs(1));
            let mut left = Vec::new();
            for p in pending {
                // An error is the API away: ask again next time.
                let end = c.finished(&p).unwrap_or_default();
                match end {
                    Some((problem, migration_failed)) => {
                        let d = Done {
                            op: p.op,
                            vm: p.vm.clone(),
                            took: p.started.elapsed(),
                            problem,
                            migration_failed,
                        };
                        tracing_line(&format!(
                            "{} {}: {:.1?}{}{}",
                            d.op.name(),
                            d.vm,
                            d.took,
                            if migration_failed {
                                " (migration Failed)"
                            } else {
                                ""
                            },
                            d.problem
                                .as_deref()
                                .map(|p| format!(" PROBLEM: {p}"))
                                .unwrap_or_default()
                        ));
                        lock(&shared.done).push(d);
                    }
                    None if p.started.elapsed() > c.stall => {
                        let d = Done {
                            op: p.op,
                            vm: p.vm.clone(),
                            took: p.started.elapsed(),
                            problem: Some(format!("not done after {:?} (stalled)", c.stall)),
                            migration_failed: false,
                        };
                        tracing_line(&format!("{} {}: STALLED", d.op.name(), d.vm));
                        lock(&shared.done).push(d);
                    }
                    None => left.push(p),
                }
            }
            pending = left;
        }
        round += 1;
    }
}

/// The outcome of one fault.
#[derive(Debug)]
struct Outcome {
    fault: String,
    victim: String,
    /// Seconds from the kill until everything matched the loop's intent, or None.
    converged: Option<f64>,
    ops: Vec<Done>,
    left: Vec<String>,
    note: String,
    /// For an API outage: when the API and every component's watches were back.
    resumed: Option<Resumed>,
}

impl Outcome {
    fn ok(&self) -> bool {
        self.converged.is_some() && self.ops.iter().all(|d| d.problem.is_none())
    }
}

/// The process in the pod with `pod_uid` named `comm` whose command line contains `arg`.
fn find_in_pod(pod_uid: &str, comm: &str, arg: Option<&str>) -> Option<i32> {
    virt_devenv::procs::in_containers()
        .into_iter()
        .find(|p| {
            p.comm == comm
                && p.pod_uid.as_deref() == Some(pod_uid)
                && arg.is_none_or(|a| p.cmdline.iter().any(|c| c == a))
        })
        .map(|p| p.pid)
}

fn pod_uid(k: &Kubectl, ns: &str, pod: &str) -> anyhow::Result<String> {
    let uid = k.run(
        &[
            "-n",
            ns,
            "get",
            "pod",
            pod,
            "-o",
            "jsonpath={.metadata.uid}",
        ],
        None,
    )?;
    if uid.trim().is_empty() {
        bail!("pod {ns}/{pod} has no uid");
    }
    Ok(uid.trim().to_string())
}

/// Kills what `fault` names and says who the victim was, and (for a launcher) the VM.
fn inject(
    c: &Cluster,
    fault: Fault,
    names: &[String],
    round: usize,
    shared: &Shared,
) -> anyhow::Result<(String, Option<String>)> {
    let k = &c.k;
    let kill_one = |ns: &str, pod: &str, comm: &str, arg: Option<&str>| -> anyhow::Result<String> {
        let uid = pod_uid(k, ns, pod)?;
        let pid = find_in_pod(&uid, comm, arg)
            .with_context(|| format!("no {comm} process of pod {ns}/{pod} on this host"))?;
        if !virt_devenv::procs::kill9(pid) {
            bail!("could not kill {comm} pid {pid}");
        }
        Ok(format!("{comm} pid {pid} of {pod}"))
    };
    match fault {
        Fault::Apiserver => {
            let n = virt_devenv::procs::kill_in_containers("virt-apiserver");
            if n == 0 {
                bail!("no virt-apiserver process in the cluster's containers on this host");
            }
            Ok((format!("{n} virt-apiserver processes"), None))
        }
        Fault::Controller => {
            let leader = k.run(
                &[
                    "-n",
                    KUBEVIRT_NS,
                    "get",
                    "lease",
                    "virt-controller",
                    "-o",
                    "jsonpath={.spec.holderIdentity}",
                ],
                None,
            )?;
            Ok((
                kill_one(KUBEVIRT_NS, leader.trim(), "virt-controller", None)?,
                None,
            ))
        }
        Fault::Handler => {
            let seen = c.seen()?;
            let mut per_node: BTreeMap<String, usize> = BTreeMap::new();
            for vmi in seen.vmis.values().filter(|v| !v.node.is_empty()) {
                *per_node.entry(vmi.node.clone()).or_default() += 1;
            }
            let node = per_node
                .iter()
                .max_by_key(|(_, n)| **n)
                .map(|(n, _)| n.clone())
                .context("no VMI on any node")?;
            let pod = k.run(
                &[
                    "-n",
                    KUBEVIRT_NS,
                    "get",
                    "pods",
                    "-l",
                    "kubevirt.io=virt-handler",
                    "--field-selector",
                    &format!("spec.nodeName={node}"),
                    "-o",
                    "jsonpath={.items[0].metadata.name}",
                ],
                None,
            )?;
            Ok((
                format!(
                    "{} on {node}",
                    kill_one(KUBEVIRT_NS, pod.trim(), "virt-handler", None)?
                ),
                None,
            ))
        }
        Fault::Launcher => {
            // A guest the current round leaves alone, running.
            let want = lock(&shared.want).clone();
            let seen = c.seen()?;
            let running = |vm: &String| {
                want.get(vm) == Some(&Want::RUNNING)
                    && seen.vmis.get(vm).is_some_and(|v| v.phase == "Running")
            };
            // Preferably one the round leaves alone; else one it works on.
            let vm = names
                .iter()
                .enumerate()
                .filter(|(i, vm)| !model::in_round(*i, round) && running(vm))
                .chain(names.iter().enumerate().filter(|(_, vm)| running(vm)))
                .map(|(_, vm)| vm.clone())
                .next()
                .context("no running guest")?;
            let vmi_uid = &seen.vmis[&vm].uid;
            let pod = seen
                .pods
                .iter()
                .find(|p| &p.vmi_uid == vmi_uid && p.phase == "Running" && !p.deleting)
                .with_context(|| format!("no running launcher pod of {vm}"))?;
            let what = kill_one(NS, &pod.name, "virt-launcher", Some("--vmi"))?;
            Ok((what, Some(vm)))
        }
        Fault::Etcd => {
            let pod = "kubevirt-etcd-0";
            let what = kill_one(KUBEVIRT_NS, pod, "etcd", None)?;
            k.run(
                &["-n", KUBEVIRT_NS, "delete", "pod", pod, "--wait=false"],
                None,
            )?;
            Ok((format!("{what}, then the pod deleted"), None))
        }
    }
}

/// How long after an API outage every component saw its objects again (issue 51 point 5).
#[derive(Debug, Clone)]
struct Resumed {
    /// Seconds from the kill until the VM API answered again.
    api: f64,
    /// Seconds from then until every component's `/readyz` said no watch was blind.
    watches: f64,
}

/// Longest a component may stay blind after the API answers again.
const RESUME_BOUND: f64 = 5.0;

/// The metrics ports of virt-controller, virt-handler and virt-operator pods (their
/// `/readyz` names blind watches), running and not being deleted: (pod, port).
fn watch_endpoints(k: &Kubectl) -> anyhow::Result<Vec<(String, i64)>> {
    let pods: Value = serde_json::from_str(&k.run(
        &[
            "-n",
            KUBEVIRT_NS,
            "get",
            "pods",
            "-l",
            "kubevirt.io in (virt-controller,virt-handler,virt-operator)",
            "-o",
            "json",
        ],
        None,
    )?)?;
    Ok(pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| {
            p["status"]["phase"] == "Running" && p["metadata"]["deletionTimestamp"].is_null()
        })
        .filter_map(|p| {
            let port = p["spec"]["containers"][0]["ports"]
                .as_array()?
                .iter()
                .find(|port| port["name"] == "metrics")?["containerPort"]
                .as_i64()?;
            Some((p["metadata"]["name"].as_str()?.to_string(), port))
        })
        .collect())
}

/// Measures, from `t0` (the kill), when the VM API answers again and when, after that, no
/// component's watch is blind any more (each asked through the kube-apiserver's pod proxy).
/// `Err` with the blind watches left at `limit`.
fn measure_resume(k: &Kubectl, t0: Instant, limit: Duration) -> Result<Resumed, String> {
    let probe = format!("/apis/kubevirt.io/v1/namespaces/{NS}/virtualmachines?limit=1");
    let mut api = None;
    let mut last = "the VM API never answered".to_string();
    while t0.elapsed() < limit {
        let Some(api_at) = api else {
            if k.run(&["get", "--raw", &probe], None).is_ok() {
                api = Some(t0.elapsed());
                last = "no component answered /readyz".into();
                continue;
            }
            std::thread::sleep(Duration::from_millis(200));
            continue;
        };
        let blind: Vec<String> = match watch_endpoints(k) {
            Ok(eps) if !eps.is_empty() => eps
                .iter()
                .filter_map(|(pod, port)| {
                    let path =
                        format!("/api/v1/namespaces/{KUBEVIRT_NS}/pods/{pod}:{port}/proxy/readyz");
                    match k.run(&["get", "--raw", &path], None) {
                        Ok(_) => None,
                        Err(e) => Some(format!("{pod}: {}", format!("{e:#}").trim())),
                    }
                })
                .collect(),
            Ok(_) => vec!["no running component pod".into()],
            Err(e) => vec![format!("listing the components: {e:#}")],
        };
        if blind.is_empty() {
            return Ok(Resumed {
                api: api_at.as_secs_f64(),
                watches: (t0.elapsed() - api_at).as_secs_f64(),
            });
        }
        last = blind.join("; ");
        std::thread::sleep(Duration::from_millis(250));
    }
    Err(last)
}

/// Polls until the cluster matches the loop's intent; the seconds since `t0`, or the last
/// differences after `limit`.
fn converge(
    c: &Cluster,
    shared: &Shared,
    t0: Instant,
    limit: Duration,
    mut watch: impl FnMut(&Seen),
) -> Result<f64, Vec<String>> {
    let mut last = vec!["nothing read yet".to_string()];
    while t0.elapsed() < limit {
        match c.seen() {
            Ok(seen) => {
                watch(&seen);
                let want = lock(&shared.want).clone();
                let uids = lock(&shared.uids).clone();
                last = model::violations(&want, &uids, &seen);
                // Converged includes the killed component back: every pod of kubevirt-rs
                // Ready again.
                match c.components_unready() {
                    Ok(unready) => last.extend(unready),
                    Err(e) => last.push(format!("reading kubevirt-rs's pods: {e:#}")),
                }
                if last.is_empty() {
                    return Ok(t0.elapsed().as_secs_f64());
                }
            }
            Err(e) => last = vec![format!("reading the cluster: {e:#}")],
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    Err(last)
}

/// Waits until the loop has paused between rounds.
fn pause(shared: &Shared, limit: Duration) -> anyhow::Result<()> {
    shared.pause.store(true, Ordering::SeqCst);
    let t = Instant::now();
    while !shared.idle.load(Ordering::SeqCst) {
        if t.elapsed() > limit {
            bail!("the loop did not finish its round within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

fn resume(shared: &Shared) {
    shared.idle.store(false, Ordering::SeqCst);
    shared.pause.store(false, Ordering::SeqCst);
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let k = Kubectl::new(deploy::kubeconfig(args.kubeconfig.clone()));
    let nodes = k.run(&["get", "nodes", "-o", "name"], None)?;
    if nodes.lines().count() < 2 {
        bail!("the chaos loop migrates VMs: it needs two nodes (cargo xtask cluster up --nodes 2)");
    }
    k.run(&["get", "apiservice", "v1.kubevirt.io"], None)
        .context("kubevirt-rs is not deployed (cargo xtask up)")?;
    if virt_devenv::procs::in_containers()
        .iter()
        .all(|p| p.comm != "virt-apiserver")
    {
        bail!(
            "no virt-apiserver process of the cluster on this host: the chaos suite needs the local cluster"
        );
    }
    let faults = if args.faults.is_empty() {
        Fault::ALL.to_vec()
    } else {
        args.faults.clone()
    };
    let c = Cluster {
        k: k.clone(),
        stall: Duration::from_secs(args.stall_seconds),
    };
    let limit = Duration::from_secs(args.converge_seconds);
    let started = Instant::now();
    let _ = k.run(&["delete", "namespace", NS, "--wait=true"], None);
    k.run(&["create", "namespace", NS], None)?;
    let names: Vec<String> = (0..args.vms).map(|i| format!("chaos-{i}")).collect();
    let shared = Arc::new(Shared::default());
    for n in &names {
        c.issue(Op::Create, n, 0, &shared)?;
    }
    let boot = converge(&c, &shared, Instant::now(), limit, |_| {}).map_err(|v| {
        anyhow::anyhow!(
            "the {} VMs did not all start:\n{}",
            names.len(),
            v.join("\n")
        )
    })?;
    tracing_line(&format!("{} VMs running after {boot:.1} s", names.len()));

    // The moment a restore must bring back.
    let backup_file = crate::target_dir().join("chaos/backup.json");
    std::fs::create_dir_all(backup_file.parent().context("backup path")?)?;
    let backup_vms = if args.no_restore {
        BTreeMap::new()
    } else {
        c.virt(&["adm", "backup", "--to", &backup_file.to_string_lossy()])?;
        backup_vms(&backup_file)?
    };

    let worker = {
        let (c, names, shared) = (c.clone(), names.clone(), shared.clone());
        std::thread::spawn(move || churn(c, names, shared))
    };
    let mut outcomes = Vec::new();
    for fault in &faults {
        let fault = *fault;
        resume(&shared);
        // Into a round whose operations are under way.
        let round = shared.issued.load(Ordering::SeqCst);
        while shared.issued.load(Ordering::SeqCst) == round {
            if worker.is_finished() {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        if worker.is_finished() {
            break;
        }
        // Asked now, not after the kill: the loop checks before each round, and a round that
        // ends while the fault is being injected (a handler restart takes seconds) must not be
        // followed by one on the other half, the guests this round leaves alone and that the
        // check below expects untouched.
        shared.pause.store(true, Ordering::SeqCst);
        // The round's pods, migrations and stops are under way.
        std::thread::sleep(Duration::from_secs(1));
        let before = lock(&shared.done).len();
        // The guests this round leaves alone, as they run now: the fault must not restart
        // them (the launcher victim aside), which convergence alone would not show.
        let alone: Vec<&String> = names
            .iter()
            .enumerate()
            .filter(|(i, _)| !model::in_round(*i, round))
            .map(|(_, vm)| vm)
            .collect();
        let mut untouched = model::instances(&c.with_boots(c.seen()?), alone);
        let t0 = Instant::now();
        let (victim, launcher_vm) = inject(&c, fault, &names, round, &shared)
            .with_context(|| format!("injecting {}", fault.name()))?;
        if let Some(vm) = &launcher_vm {
            untouched.remove(vm);
        }
        tracing_line(&format!("FAULT {}: killed {victim}", fault.name()));
        // An outage of the API itself: every component must see its objects again within
        // seconds of the API answering (issue 51 point 5).
        let resume = matches!(fault, Fault::Apiserver | Fault::Etcd).then(|| {
            let k = c.k.clone();
            let limit = limit + c.stall;
            std::thread::spawn(move || measure_resume(&k, t0, limit))
        });
        let old_vmi = launcher_vm
            .as_ref()
            .and_then(|vm| c.vmi(vm).ok().flatten())
            .and_then(|v| v["metadata"]["uid"].as_str().map(str::to_string));
        let mut victim_end = String::new();
        let paused = pause(&shared, c.stall + Duration::from_secs(60));
        let mut last_seen = Seen::default();
        let result = converge(&c, &shared, t0, limit + c.stall, |seen| {
            last_seen = seen.clone();
            // What became of the killed launcher's VMI: Failed, then replaced per runStrategy.
            if let (Some(vm), Some(old)) = (&launcher_vm, &old_vmi) {
                match seen.vmis.get(vm) {
                    Some(v) if &v.uid == old && !v.phase.is_empty() => {
                        victim_end = format!("its VMI went {}", v.phase);
                    }
                    Some(v)
                        if &v.uid != old
                            && v.phase == "Running"
                            && !victim_end.contains("new VMI") =>
                    {
                        victim_end = format!(
                            "{}{}a new VMI Running after {:.1} s (runStrategy Always)",
                            victim_end,
                            if victim_end.is_empty() { "" } else { ", then " },
                            t0.elapsed().as_secs_f64()
                        );
                    }
                    _ => {}
                }
            }
        });
        let ops: Vec<Done> = lock(&shared.done)[before..].to_vec();
        let mut left = match &result {
            Ok(_) => Vec::new(),
            Err(v) => v.clone(),
        };
        if let Err(e) = paused {
            left.push(format!("{e:#}"));
        }
        let resumed = resume.map(|h| {
            h.join()
                .unwrap_or_else(|_| Err("the resume probe panicked".into()))
        });
        match &resumed {
            Some(Ok(r)) if r.watches > RESUME_BOUND => left.push(format!(
                "components blind for {:.1} s after the API answered again (bound {RESUME_BOUND} s)",
                r.watches
            )),
            Some(Err(e)) => left.push(format!("watches not resumed: {e}")),
            _ => {}
        }
        let disturbed = model::disturbed(&untouched, &c.with_boots(last_seen.clone()));
        tracing_line(&format!(
            "{}: {} guest(s) left alone by the round, {} restarted",
            fault.name(),
            untouched.len(),
            disturbed.len()
        ));
        left.extend(disturbed);
        if launcher_vm.is_some() && !victim_end.contains("new VMI") {
            left.push(format!(
                "the killed launcher's VM was not started again ({victim_end})"
            ));
        }
        let o = Outcome {
            fault: fault.name().to_string(),
            victim: match &launcher_vm {
                Some(vm) => format!("{victim} ({vm})"),
                None => victim,
            },
            converged: result.ok().filter(|_| left.is_empty()),
            ops,
            left,
            note: victim_end,
            resumed: resumed.and_then(Result::ok),
        };
        tracing_line(&format!(
            "{}: {}",
            o.fault,
            match o.converged {
                Some(s) => format!("converged {s:.1} s after the kill"),
                None => format!("NOT converged: {}", o.left.join("; ")),
            }
        ));
        outcomes.push(o);
    }
    shared.stop.store(true, Ordering::SeqCst);
    resume(&shared);
    let worker = worker
        .join()
        .map_err(|_| anyhow::anyhow!("the chaos loop panicked"))?;

    let restore = if args.no_restore || worker.is_err() {
        None
    } else {
        Some(restore_and_converge(
            &c,
            &shared,
            &backup_file,
            &backup_vms,
            limit,
        ))
    };
    let text = section(
        &args,
        &faults,
        &outcomes,
        restore.as_ref(),
        boot,
        started.elapsed(),
    );
    println!("\n{text}");
    if !args.no_docs {
        let path = crate::workspace_root().join("docs/reliability.md");
        let doc = std::fs::read_to_string(&path)?;
        std::fs::write(&path, replace_section(&doc, HEADING, &text))?;
        println!("wrote {}", path.display());
    }
    worker.context("the chaos loop failed")?;
    let mut failed: Vec<String> = outcomes
        .iter()
        .filter(|o| !o.ok())
        .map(|o| o.fault.clone())
        .collect();
    if let Some(r) = &restore
        && !r.ok()
    {
        failed.push("restore".into());
    }
    if outcomes.len() < faults.len() {
        failed.push(format!(
            "only {} of {} faults injected",
            outcomes.len(),
            faults.len()
        ));
    }
    if !failed.is_empty() {
        bail!(
            "chaos: not converged or lost work after: {}",
            failed.join(", ")
        );
    }
    let _ = k.run(&["delete", "namespace", NS, "--wait=false"], None);
    println!("chaos passed: every fault converged with nothing lost");
    Ok(())
}

/// VM name → (uid, runStrategy) of the chaos namespace in a backup file.
fn backup_vms(file: &std::path::Path) -> anyhow::Result<BTreeMap<String, (String, String)>> {
    let doc: Value = serde_json::from_slice(&std::fs::read(file)?)?;
    Ok(doc["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["resource"] == "virtualmachines" && i["namespace"] == NS)
        .map(|i| {
            let o = &i["object"];
            (
                o["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                (
                    o["metadata"]["uid"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    o["spec"]["runStrategy"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                ),
            )
        })
        .collect())
}

#[derive(Debug)]
struct Restored {
    summary: String,
    /// Differences between the backup's VMs and the VMs right after the restore.
    diff: Vec<String>,
    converged: Result<f64, Vec<String>>,
}

impl Restored {
    fn ok(&self) -> bool {
        self.diff.is_empty() && self.converged.is_ok()
    }
}

fn restore_and_converge(
    c: &Cluster,
    shared: &Shared,
    file: &std::path::Path,
    backup: &BTreeMap<String, (String, String)>,
    limit: Duration,
) -> Restored {
    let t0 = Instant::now();
    let summary = match retry("restoring", || {
        c.virt(&["adm", "restore", "--from", &file.to_string_lossy()])
    }) {
        Ok(s) => s.lines().next().unwrap_or_default().to_string(),
        Err(e) => {
            return Restored {
                summary: format!("restore failed: {e:#}"),
                diff: vec!["not restored".into()],
                converged: Err(Vec::new()),
            };
        }
    };
    let now: BTreeMap<String, (String, String)> = (|| -> anyhow::Result<_> {
        let file = crate::target_dir().join("chaos/after-restore.json");
        c.virt(&["adm", "backup", "--to", &file.to_string_lossy()])?;
        backup_vms(&file)
    })()
    .unwrap_or_default();
    let mut diff = Vec::new();
    for (name, want) in backup {
        match now.get(name) {
            None => diff.push(format!("VM {name} not restored")),
            Some(have) if have != want => {
                diff.push(format!("VM {name}: {have:?}, backup {want:?}"))
            }
            Some(_) => {}
        }
    }
    for name in now.keys().filter(|n| !backup.contains_key(*n)) {
        diff.push(format!("VM {name} from after the backup still there"));
    }
    {
        let mut want = lock(&shared.want);
        let mut uids = lock(&shared.uids);
        want.clear();
        uids.clear();
        for (name, (uid, strategy)) in backup {
            let w = if strategy == "Halted" {
                Want::STOPPED
            } else {
                Want::RUNNING
            };
            want.insert(name.clone(), w);
            uids.insert(name.clone(), uid.clone());
        }
    }
    let converged = converge(c, shared, t0, limit, |_| {});
    Restored {
        summary: format!("{summary} — {} VMs in the backup", backup.len()),
        diff,
        converged,
    }
}

fn section(
    args: &Args,
    faults: &[Fault],
    outcomes: &[Outcome],
    restore: Option<&Restored>,
    boot: f64,
    took: Duration,
) -> String {
    use std::fmt::Write;
    let mut cmd = "cargo xtask chaos".to_string();
    if args.vms != 10 {
        let _ = write!(cmd, " --vms {}", args.vms);
    }
    if !args.faults.is_empty() {
        let names: Vec<&str> = faults.iter().map(|f| f.arg()).collect();
        let _ = write!(cmd, " --faults {}", names.join(","));
    }
    let mut s = format!(
        "{HEADING}\n\nCommand: `{cmd}`; commit {}; {}; machine: {}. Run time {:.1} min. \
         {} VMs (128 MiB TCG guests, runStrategy Always) on the two-node local cluster; their \
         first start took {boot:.1} s. A loop works on half of them per round (create, start, \
         stop, restart through the subresource, migrate, delete, each awaited); during a round \
         the fault is injected with SIGKILL; the loop then finishes its round and pauses, and \
         the cluster must match what the loop asked: every VM there with its uid (none lost or \
         made twice), every running VM with one Running VMI, one live launcher pod and one QEMU \
         process in that pod (from this host's /proc), no VMI, pod or QEMU of a stopped or \
         deleted VM, no migration unfinished, every kubevirt-rs pod Ready again, and every \
         guest the round left alone (the launcher fault's victim aside) still the same VMI, \
         launcher pod and QEMU process as before the kill, its guest not booted again (the \
         banners in its `guest-console-log`) (a guest wrongly restarted under runStrategy \
         Always would converge too; this is what sees it). Converged = \
         seconds from the kill until all of that held (it includes the round the loop \
         finished meanwhile). Watches back = for an outage of the API (virt-apiserver, etcd), \
         seconds from the kill until the VM API answered again, then until no watch of \
         virt-controller, virt-handler or virt-operator was blind (their `/readyz`; bound \
         {RESUME_BOUND} s). Details: docs/local-cluster.md.\n\n\
         | fault | killed | operations during it | converged after | watches back | left over |\n\
         |---|---|---|---|---|---|\n",
        commit(),
        now_utc(),
        Machine::probe(),
        took.as_secs_f64() / 60.0,
        args.vms,
    );
    for o in outcomes {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for d in &o.ops {
            *counts.entry(d.op.name()).or_default() += 1;
        }
        let mut ops: Vec<String> = counts.iter().map(|(k, v)| format!("{v} {k}")).collect();
        let failed_migrations = o.ops.iter().filter(|d| d.migration_failed).count();
        if failed_migrations > 0 {
            ops.push(format!(
                "{failed_migrations} migration Failed (guest kept on its node)"
            ));
        }
        let problems: Vec<String> = o
            .ops
            .iter()
            .filter_map(|d| {
                d.problem
                    .as_ref()
                    .map(|p| format!("{} {}: {p}", d.op.name(), d.vm))
            })
            .collect();
        let mut left = o.left.clone();
        left.extend(problems);
        let victim = if o.note.is_empty() {
            o.victim.clone()
        } else {
            format!("{}; {}", o.victim, o.note)
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} |",
            o.fault,
            victim,
            ops.join(", "),
            o.converged
                .map_or("**no**".to_string(), |t| format!("{t:.1} s")),
            o.resumed.as_ref().map_or("–".to_string(), |r| format!(
                "API after {:.1} s, watches {:.1} s later",
                r.api, r.watches
            )),
            if left.is_empty() {
                "nothing".to_string()
            } else {
                format!("**{}**", left.join("; "))
            },
        );
    }
    if let Some(r) = restore {
        let _ = writeln!(
            s,
            "\nRestore of the backup taken before the loop (`kubectl virt adm restore`): {}. \
             VMs right after it against the backup (name, uid, runStrategy): {}. Converged to the \
             backup's VMs: {}.",
            r.summary,
            if r.diff.is_empty() {
                "identical".to_string()
            } else {
                format!("**{}**", r.diff.join("; "))
            },
            match &r.converged {
                Ok(t) => format!("after {t:.1} s"),
                Err(v) => format!("**no**: {}", v.join("; ")),
            }
        );
    }
    s
}
