//! `cargo xtask bench pool`: `kubectl scale` of a VirtualMachinePool on KWOK's fake nodes
//! (issue 48). The processes are `bench scale`'s (a private kube-apiserver, virt-apiserver
//! behind its aggregator, kube-scheduler, KWOK, virt-controller; no cluster) and so is its
//! stand-in for virt-handler. Each run creates a pool of the start benchmark's test VM at 0
//! replicas, runs the real kubectl's `scale vmpool --replicas=N` and times, from the moment
//! kubectl starts, every VM created, every VMI Scheduled and Running (seen on watches); then
//! `--replicas=0` and the time until every VM is gone.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use kubevirt_api::VirtualMachine;
use kubevirt_api::pool::VirtualMachinePool;

use super::crd::harness::Binaries;
use super::scale::{self, NS, Run, procs, standin};
use super::section::{self, Provenance, Runs, Section};

/// The pool's name; its VMs are `bench-<ordinal>`.
const POOL: &str = "bench";

/// Arguments of `cargo xtask bench pool`.
#[derive(clap::Args, Debug, Clone)]
pub struct PoolArgs {
    /// Fake nodes KWOK manages.
    #[arg(long, default_value_t = 20)]
    pub nodes: usize,
    /// Replicas `kubectl scale` asks for (from 0, then back to 0).
    #[arg(long, default_value_t = 20)]
    pub replicas: usize,
    /// Fresh runs (every process started anew); figures are their median with min–max.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Give up waiting for either scale after this many seconds.
    #[arg(long, default_value_t = 300)]
    pub max_seconds: u64,
    /// Only print the figures; leave docs/benchmarks.md alone.
    #[arg(long)]
    pub no_docs: bool,
    /// Run the client (watches, stand-in) from this (possibly unoptimised) build instead of
    /// a release build; the servers and virt-controller are release builds either way.
    #[arg(long)]
    pub this_build: bool,
}

impl PoolArgs {
    /// The command that reproduces this run, every option spelt out.
    pub fn command(&self) -> String {
        format!(
            "cargo xtask bench pool --nodes {} --replicas {} --runs {}{}",
            self.nodes,
            self.replicas,
            self.runs,
            if self.this_build { " --this-build" } else { "" },
        )
    }

    fn check(&self) -> anyhow::Result<()> {
        for (name, v) in [
            ("--nodes", self.nodes),
            ("--replicas", self.replicas),
            ("--runs", self.runs),
        ] {
            anyhow::ensure!(v > 0, "{name} must be positive");
        }
        Ok(())
    }
}

/// What one fresh run measured, each duration from the start of its `kubectl scale`.
#[derive(Debug, Default, Clone, PartialEq)]
struct RunResult {
    /// `kubectl scale … --replicas=N` until it exited.
    up_kubectl: Duration,
    /// … until the last of the N VMs was seen created.
    up_vms: Option<Duration>,
    /// … until the first VMI was seen Running.
    up_first_running: Option<Duration>,
    /// … until the last VMI was seen Scheduled (launcher pod Running on its fake node).
    up_scheduled: Option<Duration>,
    /// … until the last VMI was seen Running: the headline.
    up_running: Option<Duration>,
    /// `kubectl scale … --replicas=0` until it exited.
    down_kubectl: Duration,
    /// … until the last VM's deletion was seen.
    down_gone: Option<Duration>,
    /// VMIs seen Running by the end of the scale-up.
    running: usize,
    /// What went wrong (stand-in status writes, final phases, dead processes).
    problems: Vec<String>,
}

/// When each pool VM was first seen and seen deleted, from a watch of the VMs.
#[derive(Debug, Default)]
struct Vms {
    seen: HashMap<String, Instant>,
    gone: HashMap<String, Instant>,
}

type SharedVms = Arc<Mutex<Vms>>;

/// One figure of a run, for the table.
type Figure = dyn Fn(&RunResult) -> Option<Duration>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs the benchmark.
pub fn run(args: PoolArgs) -> anyhow::Result<()> {
    args.check()?;
    if cfg!(debug_assertions) && !args.this_build {
        return super::apiserver::rerun_release();
    }
    let provenance = Provenance::probe(args.command());
    let (bins, extra) = scale::binaries()?;
    let kubectl = crate::cluster::kubernetes_bin_dir()?.join("kubectl");
    anyhow::ensure!(kubectl.is_file(), "no kubectl at {}", kubectl.display());
    let rt = super::apiserver::runtime()?;
    let mut runs = Vec::new();
    for r in 0..args.runs {
        eprintln!("run {} of {}", r + 1, args.runs);
        let limit = Duration::from_secs(2 * args.max_seconds + 300);
        let result = rt
            .block_on(async {
                tokio::time::timeout(limit, one_run(&bins, &extra, &kubectl, &args)).await
            })
            .map_err(|_| anyhow::anyhow!("run {} took longer than {limit:?}", r + 1))??;
        eprintln!("{}", one_line(&args, &result));
        runs.push(result);
    }
    drop(rt);
    let body = format!("{}\n\n{}", describe(&args, runs.len()), table(&args, &runs));
    println!("\n{body}");
    super::record(&Section::new(section::POOL, provenance, body), args.no_docs)
}

/// The pool: the start benchmark's test VM as its template, `replicas` VMs.
fn pool_manifest(replicas: usize) -> anyhow::Result<VirtualMachinePool> {
    let vm: serde_json::Value = serde_json::from_str(&super::test_guest_vm(POOL, NS))?;
    let mut template = vm["spec"].clone();
    template["template"]["metadata"] = serde_json::json!({"labels": {"app": POOL}});
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "pool.kubevirt.io/v1beta1", "kind": "VirtualMachinePool",
        "metadata": {"name": POOL, "namespace": NS},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": POOL}},
            "virtualMachineTemplate": {
                "metadata": {"labels": {"app": POOL}},
                "spec": template,
            },
        },
    }))?)
}

/// Records when each VM of `ns` is first seen and seen deleted, until `stop`.
async fn watch_vms(
    client: kube::Client,
    vms: SharedVms,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let api: Api<VirtualMachine> = Api::namespaced(client, NS);
    let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
    loop {
        let ev = tokio::select! {
            ev = events.next() => ev,
            _ = stop.changed() => break,
        };
        let now = Instant::now();
        match ev {
            None => break,
            Some(Ok(watcher::Event::Apply(vm) | watcher::Event::InitApply(vm))) => {
                let mut v = lock(&vms);
                v.seen.entry(vm.name_any()).or_insert(now);
            }
            Some(Ok(watcher::Event::Delete(vm))) => {
                lock(&vms).gone.entry(vm.name_any()).or_insert(now);
            }
            Some(Ok(_)) => {}
            Some(Err(e)) => eprintln!("VM watch: {e}"),
        }
    }
}

/// The pinned release's kubectl, with the run's kubeconfig and a discovery cache of its own.
struct Kubectl {
    bin: PathBuf,
    kubeconfig: PathBuf,
    cache: PathBuf,
}

impl Kubectl {
    /// `kubectl args…`; fails on a non-zero exit.
    async fn run(&self, args: &[&str]) -> anyhow::Result<()> {
        let out = tokio::process::Command::new(&self.bin)
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .arg(format!("--cache-dir={}", self.cache.display()))
            .args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .with_context(|| format!("running {}", self.bin.display()))?;
        anyhow::ensure!(
            out.status.success(),
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(())
    }
}

/// Waits (checking the watches' records every 50 ms; the figures are the watch events'
/// own times, not these checks') until `done`, a process dies, or `limit` passes.
async fn until(run: &mut Run, limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        if !run.dead().is_empty() {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    done()
}

/// The time from `t0` to the last of `times`, when there are `n` of them.
fn last_after(t0: Instant, times: &HashMap<String, Instant>, n: usize) -> Option<Duration> {
    let mut after: Vec<Instant> = times.values().copied().filter(|t| *t >= t0).collect();
    after.sort_unstable();
    (after.len() >= n).then(|| after[n - 1].saturating_duration_since(t0))
}

/// One fresh run: start everything, make the pool at 0, scale it up and wait for every
/// VMI to run, scale it down and wait for every VM to go, stop everything.
async fn one_run(
    bins: &Binaries,
    extra: &procs::Extra,
    kubectl_bin: &Path,
    args: &PoolArgs,
) -> anyhow::Result<RunResult> {
    let mut run = Run::start(bins, extra, args.nodes).await?;
    let client = run.harness.kube_client();
    let kubectl = Kubectl {
        bin: kubectl_bin.to_path_buf(),
        kubeconfig: run.harness.kubeconfig(),
        cache: run.harness.dir().join("kubectl-cache"),
    };

    let t: standin::Shared = Arc::default();
    let vms: SharedVms = Arc::default();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let observer = tokio::spawn(standin::observe(
        client.clone(),
        NS.into(),
        t.clone(),
        stop_rx.clone(),
    ));
    let vm_watch = tokio::spawn(watch_vms(client.clone(), vms.clone(), stop_rx));

    let pools: Api<VirtualMachinePool> = Api::namespaced(client, NS);
    pools
        .create(&PostParams::default(), &pool_manifest(0)?)
        .await
        .context("creating the pool")?;
    // virt-controller has reconciled it once it publishes the selector /scale reports.
    scale::wait_for("the pool reconciled", Duration::from_secs(60), || async {
        let p = pools.get_opt(POOL).await.ok()??;
        p.status?.label_selector.map(|_| ())
    })
    .await?;
    // A user's kubectl has discovery cached: this fills the cache (and checks the short
    // name) before the timed command.
    kubectl.run(&["get", "vmpool", POOL]).await?;

    let replicas = args.replicas;
    let limit = Duration::from_secs(args.max_seconds);
    let t_up = Instant::now();
    kubectl
        .run(&["scale", "vmpool", POOL, &format!("--replicas={replicas}")])
        .await?;
    let up_kubectl = t_up.elapsed();
    let up_done = until(&mut run, limit, || lock(&t).running.len() >= replicas).await;
    let (up_vms, up_first_running, up_scheduled, up_running, running) = {
        let tl = lock(&t);
        (
            last_after(t_up, &lock(&vms).seen, replicas),
            last_after(t_up, &tl.running, 1),
            last_after(t_up, &tl.scheduled, replicas),
            last_after(t_up, &tl.running, replicas),
            tl.running.len(),
        )
    };

    let mut result = RunResult {
        up_kubectl,
        up_vms,
        up_first_running,
        up_scheduled,
        up_running,
        running,
        ..RunResult::default()
    };
    if up_done {
        let t_down = Instant::now();
        kubectl
            .run(&["scale", "vmpool", POOL, "--replicas=0"])
            .await?;
        result.down_kubectl = t_down.elapsed();
        until(&mut run, limit, || lock(&vms).gone.len() >= replicas).await;
        result.down_gone = last_after(t_down, &lock(&vms).gone, replicas);
    } else {
        result.problems.push(format!(
            "{running} of {replicas} VMIs Running within {limit:?}; scale-down not measured"
        ));
    }

    let _ = stop_tx.send(true);
    let _ = observer.await;
    let _ = vm_watch.await;
    let dead = run.dead();
    run.stop();
    if !dead.is_empty() {
        result
            .problems
            .push(format!("exited during the run: {}", dead.join(", ")));
    }
    let tl = lock(&t);
    for (what, list) in [
        ("stand-in status writes failed", &tl.report_errors),
        ("VMIs reached a final phase", &tl.final_phase),
    ] {
        if !list.is_empty() {
            let first: Vec<&str> = list.iter().take(3).map(String::as_str).collect();
            result
                .problems
                .push(format!("{} {what}: {}", list.len(), first.join("; ")));
        }
    }
    Ok(result)
}

fn secs(d: Option<Duration>) -> String {
    d.map_or("n/a".into(), |d| format!("{:.1} s", d.as_secs_f64()))
}

/// A run's headline on one line, for the terminal.
fn one_line(args: &PoolArgs, r: &RunResult) -> String {
    format!(
        "0 → {n}: all {running} Running after {}; {n} → 0: all VMs gone after {}",
        secs(r.up_running),
        secs(r.down_gone),
        n = args.replicas,
        running = r.running,
    )
}

/// How the run is made, for the section.
fn describe(args: &PoolArgs, runs: usize) -> String {
    format!(
        "{runs} fresh run{s}, each on `cargo xtask bench scale`'s processes: a private \
         kube-apiserver, virt-apiserver (release) behind its aggregator, kube-scheduler, KWOK \
         {kwok} managing {nodes} fake Nodes, virt-controller (release); no kubelet, container or \
         guest, and the benchmark plays virt-handler's status part (a Scheduled VMI is \
         reported Running as virt-handler reports a TCG guest). A VirtualMachinePool of the \
         start benchmark's VM (runStrategy Always) is created with 0 replicas; once \
         virt-controller has reconciled it and kubectl's discovery cache is warm, the \
         pinned release's kubectl runs `kubectl scale vmpool {POOL} --replicas={n}` (through \
         the `/scale` subresource), then, once every VMI runs, `--replicas=0`. Times are from \
         the start of each kubectl to the events seen on watches of the VMs and VMIs through \
         kube-apiserver. Scale-in deletes the VMs (background propagation); their VMIs are \
         the garbage collector's, which this harness does not run (no \
         kube-controller-manager), so the last row stops at the VMs.",
        s = if runs == 1 { "" } else { "s" },
        kwok = crate::cluster::kwok_version().unwrap_or_else(|_| "unknown".into()),
        nodes = args.nodes,
        n = args.replicas,
    )
}

/// The figures table: one row per figure, median (min–max) over the runs.
fn table(args: &PoolArgs, runs: &[RunResult]) -> String {
    let n = args.replicas;
    let count = runs.len();
    let mut s = format!(
        "| figure | median of {count} run{} (min–max) |\n|---|---|\n",
        if count == 1 { "" } else { "s" }
    );
    let per = |f: &Figure| Runs::new(runs.iter().filter_map(|r| f(r).map(|d| d.as_secs_f64())));
    let rows: [(String, &Figure); 7] = [
        (format!("`kubectl scale --replicas={n}` returned"), &|r| {
            Some(r.up_kubectl)
        }),
        (format!("scale → all {n} VMs created"), &|r| r.up_vms),
        ("scale → first VMI Running".into(), &|r| {
            r.up_first_running
        }),
        (format!("scale → all {n} VMIs Scheduled"), &|r| {
            r.up_scheduled
        }),
        (format!("**scale → all {n} VMIs Running**"), &|r| {
            r.up_running
        }),
        ("`kubectl scale --replicas=0` returned".into(), &|r| {
            r.down_gone.map(|_| r.down_kubectl)
        }),
        (format!("**scale to 0 → all {n} VMs gone**"), &|r| {
            r.down_gone
        }),
    ];
    for (name, f) in rows {
        let runs = per(f);
        let missing = runs.len() < count;
        s.push_str(&format!(
            "| {name} | {}{} |\n",
            runs.summary(1, "s"),
            if missing {
                format!(" ({} of {count} runs)", runs.len())
            } else {
                String::new()
            }
        ));
    }
    s.push_str(&format!(
        "| VMIs Running after the scale-up | {} |\n",
        Runs::new(runs.iter().map(|r| r.running as f64)).summary(0, "")
    ));
    let problems: Vec<String> = runs
        .iter()
        .enumerate()
        .flat_map(|(i, r)| {
            r.problems
                .iter()
                .map(move |p| format!("- run {}: {p}", i + 1))
        })
        .collect();
    if !problems.is_empty() {
        s.push_str(&format!("\nProblems:\n\n{}\n", problems.join("\n")));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> PoolArgs {
        PoolArgs {
            nodes: 20,
            replicas: 20,
            runs: 3,
            max_seconds: 300,
            no_docs: true,
            this_build: false,
        }
    }

    #[test]
    fn command_spells_out_every_option() {
        assert_eq!(
            args().command(),
            "cargo xtask bench pool --nodes 20 --replicas 20 --runs 3"
        );
    }

    #[test]
    fn the_pool_is_the_test_vm_at_zero_replicas_selecting_its_template() {
        let p = serde_json::to_value(pool_manifest(0).unwrap()).unwrap();
        assert_eq!(p["spec"]["replicas"], 0);
        assert_eq!(p["spec"]["selector"]["matchLabels"]["app"], POOL);
        let vm = &p["spec"]["virtualMachineTemplate"];
        assert_eq!(vm["metadata"]["labels"]["app"], POOL);
        assert_eq!(vm["spec"]["runStrategy"], "Always");
        assert_eq!(vm["spec"]["template"]["metadata"]["labels"]["app"], POOL);
        assert_eq!(
            vm["spec"]["template"]["spec"]["domain"]["memory"]["guest"],
            "256Mi"
        );
    }

    #[test]
    fn the_last_of_n_after_the_command() {
        let t0 = Instant::now();
        let before = t0.checked_sub(Duration::from_secs(1)).unwrap();
        let times: HashMap<String, Instant> = [
            ("old", before),
            ("a", t0 + Duration::from_secs(2)),
            ("b", t0 + Duration::from_secs(5)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(last_after(t0, &times, 2), Some(Duration::from_secs(5)));
        assert_eq!(last_after(t0, &times, 1), Some(Duration::from_secs(2)));
        // The VM seen before the command does not count towards the N.
        assert_eq!(last_after(t0, &times, 3), None);
    }

    #[test]
    fn table_has_every_figure_and_the_runs_that_missed() {
        let s = |v: u64| Some(Duration::from_secs(v));
        let full = RunResult {
            up_kubectl: Duration::from_millis(300),
            up_vms: s(1),
            up_first_running: s(2),
            up_scheduled: s(3),
            up_running: s(4),
            down_kubectl: Duration::from_millis(200),
            down_gone: s(1),
            running: 20,
            problems: vec![],
        };
        let short = RunResult {
            up_running: None,
            down_gone: None,
            running: 19,
            problems: vec!["19 of 20 VMIs Running within 300s; scale-down not measured".into()],
            ..full.clone()
        };
        let t = table(&args(), &[full.clone(), full.clone(), short]);
        assert!(
            t.contains("| **scale → all 20 VMIs Running** | 4.0 s (4.0–4.0) (2 of 3 runs) |"),
            "{t}"
        );
        assert!(
            t.contains("| `kubectl scale --replicas=20` returned | 0.3 s (0.3–0.3) |"),
            "{t}"
        );
        assert!(
            t.contains("| **scale to 0 → all 20 VMs gone** | 1.0 s (1.0–1.0) (2 of 3 runs) |"),
            "{t}"
        );
        assert!(
            t.contains("| VMIs Running after the scale-up | 20 (19–20) |"),
            "{t}"
        );
        assert!(t.contains("- run 3: 19 of 20 VMIs Running"), "{t}");
        let ok = table(&args(), &[full]);
        assert!(!ok.contains("Problems"), "{ok}");
        assert!(ok.contains("| median of 1 run (min–max) |"), "{ok}");
    }
}
