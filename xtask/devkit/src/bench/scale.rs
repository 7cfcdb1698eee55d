//! `cargo xtask bench scale`: the control plane at scale without real guests. A private
//! kube-apiserver and etcd with virt-apiserver on its own etcd behind the aggregator (the
//! harness of `bench crd`), kube-scheduler, KWOK keeping `--nodes` fake Nodes and running
//! the pods bound to them, and virt-controller (release builds, processes of this run);
//! `--vms` VMs (runStrategy Always, the start benchmark's test VM) created at `--rate` per
//! second, virt-handler's status part played by a stand-in inside the benchmark
//! ([`standin`]). Measured: create → VMI Scheduled and → Running per VM, the time until
//! all run, RSS growth per VMI of virt-controller and virt-apiserver, API requests per VMI
//! by verb and resource from both servers' `apiserver_request_total`, both etcds' size,
//! and every failed request. No local cluster is needed or touched.

pub(super) mod procs;
mod requests;
pub(super) mod standin;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};

use super::apiserver::{self, status_kib};
use super::crd::harness::{Binaries, Harness};
use super::report::percentile;
use super::section::{self, Provenance, Runs, Section};
use requests::{Counts, Outcome};

/// The namespace the VMs live in.
pub(super) const NS: &str = "default";

/// Arguments of `cargo xtask bench scale`.
#[derive(clap::Args, Debug, Clone)]
pub struct ScaleArgs {
    /// Fake nodes KWOK manages.
    #[arg(long, default_value_t = 100)]
    pub nodes: usize,
    /// VirtualMachines created (runStrategy Always).
    #[arg(long, default_value_t = 10_000)]
    pub vms: usize,
    /// VMs created per second.
    #[arg(long, default_value_t = 50.0)]
    pub rate: f64,
    /// Fresh runs (every process started anew); figures are their median with min–max.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Seconds to wait before each memory reading, which is then the median of 5 samples.
    #[arg(long, default_value_t = 10)]
    pub settle_seconds: u64,
    /// Give up waiting for every VMI to run after this many seconds from the first create.
    #[arg(long, default_value_t = 1200)]
    pub max_seconds: u64,
    /// Run this virt-controller binary instead of a release build of the tree (to compare
    /// two builds; the section names it).
    #[arg(long)]
    pub virt_controller: Option<std::path::PathBuf>,
    /// Only print the figures; leave docs/benchmarks.md alone.
    #[arg(long)]
    pub no_docs: bool,
    /// Run the client (creates, watch, stand-in) from this (possibly unoptimised) build
    /// instead of a release build; the servers and virt-controller are release builds
    /// either way.
    #[arg(long)]
    pub this_build: bool,
}

impl ScaleArgs {
    /// The command that reproduces this run, every option spelt out.
    pub fn command(&self) -> String {
        format!(
            "cargo xtask bench scale --nodes {} --vms {} --rate {} --runs {} --settle-seconds {}{}",
            self.nodes,
            self.vms,
            self.rate,
            self.runs,
            self.settle_seconds,
            if self.this_build { " --this-build" } else { "" },
        ) + &self.virt_controller.as_ref().map_or(String::new(), |p| {
            format!(" --virt-controller {}", p.display())
        })
    }

    fn check(&self) -> anyhow::Result<()> {
        for (name, v) in [
            ("--nodes", self.nodes),
            ("--vms", self.vms),
            ("--runs", self.runs),
        ] {
            anyhow::ensure!(v > 0, "{name} must be positive");
        }
        anyhow::ensure!(
            self.rate > 0.0 && self.rate.is_finite(),
            "--rate must be positive"
        );
        Ok(())
    }
}

/// Goals (issue 21) and KubeVirt's anchor.
const GOAL_ALL_RUNNING: Duration = Duration::from_secs(300);
const GOAL_CONTROLLER_PER_VMI: f64 = 20.0 * 1024.0;

/// The processes whose memory is read, in [`Memory::rss_kib`]'s order.
const MEASURED: [&str; 3] = ["virt-controller", "virt-apiserver", "kube-apiserver"];

/// One reading of memory: RSS and both etcds' database.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Memory {
    rss_kib: [u64; 3],
    /// etcd A (kube-apiserver's), etcd B (virt-apiserver's): `etcd_mvcc_db_total_size_in_bytes`.
    db: [u64; 2],
    /// The same, `…_in_use_in_bytes`.
    db_in_use: [u64; 2],
}

/// What one fresh run measured.
#[derive(Debug, Default)]
struct RunResult {
    load_start: f64,
    load_end: f64,
    created: usize,
    /// VMIs virt-controller created (seen on the watch): what "per VMI" divides by.
    vmis: usize,
    create_errors: Vec<String>,
    report_errors: Vec<String>,
    final_phase: Vec<String>,
    scheduled: Vec<Duration>,
    running: Vec<Duration>,
    /// First create → last Running, when every VMI ran.
    all_running: Option<Duration>,
    before: Memory,
    after: Memory,
    kube: Counts,
    ours: Counts,
    /// The processes that exited before the end.
    dead: Vec<&'static str>,
}

impl RunResult {
    /// Create → Running (or → Scheduled) of every VM that got there.
    fn latencies(&self, running: bool) -> &[Duration] {
        if running {
            &self.running
        } else {
            &self.scheduled
        }
    }

    fn running_count(&self) -> usize {
        self.running.len()
    }

    /// RSS growth per VMI (that exists) of process `i` of [`MEASURED`], in bytes.
    fn per_vmi(&self, i: usize) -> Option<f64> {
        let n = self.vmis;
        (n > 0).then(|| {
            (self.after.rss_kib[i] as f64 - self.before.rss_kib[i] as f64) * 1024.0 / n as f64
        })
    }

    fn failed(&self) -> f64 {
        requests::total(&self.kube, Outcome::Failed) + requests::total(&self.ours, Outcome::Failed)
    }

    fn conflicts(&self) -> f64 {
        requests::total(&self.kube, Outcome::Conflict)
            + requests::total(&self.ours, Outcome::Conflict)
    }
}

/// Runs the benchmark.
pub fn run(args: ScaleArgs) -> anyhow::Result<()> {
    args.check()?;
    if cfg!(debug_assertions) && !args.this_build {
        return apiserver::rerun_release();
    }
    let provenance = Provenance::probe(args.command());
    let (bins, mut extra) = binaries()?;
    if let Some(p) = &args.virt_controller {
        extra.virt_controller = p.clone();
    }
    let rt = apiserver::runtime()?;
    let mut runs = Vec::new();
    for r in 0..args.runs {
        eprintln!("run {} of {}", r + 1, args.runs);
        let limit = Duration::from_secs(args.max_seconds + 600);
        let result = rt
            .block_on(async { tokio::time::timeout(limit, one_run(&bins, &extra, &args)).await })
            .map_err(|_| anyhow::anyhow!("run {} took longer than {limit:?}", r + 1))??;
        eprintln!("{}", one_line(&result));
        runs.push(result);
    }
    drop(rt);
    let body = format!("{}\n\n{}", describe(&args, &runs), table(&args, &runs));
    println!("\n{body}");
    super::record(
        &Section::new(section::SCALE, provenance, body),
        args.no_docs,
    )
}

/// kube-apiserver and kube-scheduler of the pinned release, KWOK of the pinned version
/// (each built once if missing), virt-apiserver and virt-controller of this tree.
pub(super) fn binaries() -> anyhow::Result<(Binaries, procs::Extra)> {
    let k8s = crate::cluster::ensure_kubernetes_binaries().context("Kubernetes binaries")?;
    let kwok = crate::cluster::ensure_kwok().context("KWOK")?;
    let mut cmd = xtask::cargo();
    cmd.args([
        "build",
        "--quiet",
        "--release",
        "-p",
        "virt-controllers",
        "--bin",
        "virt-controller",
    ]);
    anyhow::ensure!(
        cmd.status().context("running cargo build")?.success(),
        "building virt-controller failed"
    );
    Ok((
        Binaries {
            kube_apiserver: k8s.join("kube-apiserver"),
            virt_apiserver: crate::dev_apiserver::build_apiserver(true)?,
            etcd: virt_devenv::Options::default().etcd_bin,
        },
        procs::Extra {
            kube_scheduler: k8s.join("kube-scheduler"),
            kwok,
            virt_controller: crate::target_dir().join("release").join("virt-controller"),
        },
    ))
}

pub(super) fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// The processes of one run, dropped (killed) in reverse order of start.
pub(super) struct Run {
    controller: Option<procs::Proc>,
    kwok: procs::Proc,
    scheduler: procs::Proc,
    pub(super) harness: Harness,
}

impl Run {
    pub(super) async fn start(
        bins: &Binaries,
        extra: &procs::Extra,
        nodes: usize,
    ) -> anyhow::Result<Self> {
        let harness = Harness::start_apis(bins, "kubevirt-rs-bench-scale-").await?;
        let (kc, dir) = (harness.kubeconfig(), harness.dir().to_path_buf());
        let client = harness.kube_client();
        eprintln!("logs in {}", dir.display());
        let sa: ServiceAccount =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "default"}}))?;
        Api::<ServiceAccount>::namespaced(client.clone(), NS)
            .create(&PostParams::default(), &sa)
            .await
            .context("creating the default ServiceAccount")?;
        let scheduler = procs::scheduler(&extra.kube_scheduler, &kc, &dir)?;
        let kwok = procs::kwok(&extra.kwok, &kc, &dir)?;
        let api = Api::<Node>::all(client.clone());
        for i in 0..nodes {
            api.create(
                &PostParams::default(),
                &serde_json::from_value(procs::node(i))?,
            )
            .await
            .with_context(|| format!("creating node {i}"))?;
        }
        wait_for("every fake node Ready", Duration::from_secs(120), || {
            let api = api.clone();
            async move { (ready_nodes(&api).await? >= nodes).then_some(()) }
        })
        .await?;
        // kube-controller-manager's node lifecycle controller would lift the not-ready taint
        // that admission puts on every new Node once it is Ready; there is none here.
        for i in 0..nodes {
            let untaint = serde_json::json!({"spec": {"taints": null}});
            api.patch(
                &procs::node_name(i),
                &PatchParams::default(),
                &Patch::Merge(&untaint),
            )
            .await
            .with_context(|| format!("untainting node {i}"))?;
        }
        let mut run = Self {
            controller: None,
            kwok,
            scheduler,
            harness,
        };
        let controller = procs::virt_controller(&extra.virt_controller, &kc, &dir)?;
        run.controller = Some(controller);
        let leases = Api::<Lease>::namespaced(client, "kubevirt");
        wait_for("virt-controller to lead", Duration::from_secs(60), || {
            let leases = leases.clone();
            async move {
                let l = leases.get_opt("virt-controller").await.ok()??;
                l.spec?
                    .holder_identity
                    .filter(|h| h == "virt-controller-bench")
            }
        })
        .await?;
        Ok(run)
    }

    fn controller_pid(&self) -> u32 {
        self.controller.as_ref().map_or(0, procs::Proc::pid)
    }

    /// The processes of the run that have exited.
    pub(super) fn dead(&mut self) -> Vec<&'static str> {
        let mut out: Vec<&'static str> = [
            self.controller.as_mut(),
            Some(&mut self.kwok),
            Some(&mut self.scheduler),
        ]
        .into_iter()
        .flatten()
        .filter_map(|p| (!p.alive()).then_some(p.name))
        .collect();
        if !self.harness.alive() {
            out.push("an API server or etcd");
        }
        out
    }

    pub(super) fn stop(mut self) {
        self.controller.take();
        let Self {
            kwok,
            scheduler,
            harness,
            ..
        } = self;
        drop(kwok);
        drop(scheduler);
        harness.stop();
    }
}

async fn ready_nodes(api: &Api<Node>) -> Option<usize> {
    let list = api.list(&ListParams::default()).await.ok()?;
    Some(
        list.items
            .iter()
            .filter(|n| {
                n.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .count(),
    )
}

/// Polls `f` every 500 ms until it gives a value, for at most `limit`.
pub(super) async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        anyhow::ensure!(Instant::now() < deadline, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// One fresh run: start everything, settle, read; create the VMs and wait for every VMI to
/// run; settle, read again; stop everything.
async fn one_run(
    bins: &Binaries,
    extra: &procs::Extra,
    args: &ScaleArgs,
) -> anyhow::Result<RunResult> {
    let load_start = load_average();
    let mut run = Run::start(bins, extra, args.nodes).await?;
    let client = run.harness.kube_client();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;
    let direct = run.harness.direct_client()?;
    let pids = [
        run.controller_pid(),
        run.harness.procs()?.virt_apiserver,
        run.harness.procs()?.kube_apiserver,
    ];
    let procs = run.harness.procs()?;
    let etcds = [procs.etcd_a_url.clone(), procs.etcd_b_url.clone()];
    let settle = Duration::from_secs(args.settle_seconds);
    let before = memory(pids, &etcds, &http, settle).await?;
    let scrape = |client: kube::Client, direct: reqwest::Client, url: String| async move {
        anyhow::Ok((
            requests::parse(&client.request_text(get("/metrics")?).await?),
            requests::parse(
                &direct
                    .get(url)
                    .send()
                    .await?
                    .error_for_status()?
                    .text()
                    .await?,
            ),
        ))
    };
    let ours_metrics = run.harness.direct_url("/metrics");
    let (kube0, ours0) = scrape(client.clone(), direct.clone(), ours_metrics.clone()).await?;

    let t: standin::Shared = Arc::new(Mutex::new(standin::Timeline::default()));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let observer = tokio::spawn(standin::observe(
        client.clone(),
        NS.into(),
        t.clone(),
        stop_rx,
    ));
    eprintln!("creating {} VMs at {}/s", args.vms, args.rate);
    let creator = tokio::spawn(standin::create(
        client.clone(),
        NS,
        args.vms,
        args.rate,
        t.clone(),
    ));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(args.max_seconds);
    let mut last_note = Instant::now();
    loop {
        let (created, scheduled, running) = {
            let tl = t.lock().unwrap_or_else(|e| e.into_inner());
            (tl.created.len(), tl.scheduled.len(), tl.running.len())
        };
        if running >= args.vms || Instant::now() > deadline || !run.dead().is_empty() {
            break;
        }
        if last_note.elapsed() > Duration::from_secs(10) {
            eprintln!(
                "{:>4.0} s: {created} created, {scheduled} Scheduled, {running} Running (load {:.1})",
                started.elapsed().as_secs_f64(),
                load_average()
            );
            last_note = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let _ = creator.await;
    let after = memory(pids, &etcds, &http, settle).await?;
    let (kube1, ours1) = scrape(client.clone(), direct, ours_metrics).await?;
    let _ = stop_tx.send(true);
    let _ = observer.await;
    let dead = run.dead();
    let load_end = load_average();
    run.stop();
    let tl = std::mem::take(&mut *t.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(RunResult {
        load_start,
        load_end,
        created: tl.created.len() - tl.create_errors.len(),
        vmis: tl.vmis.len(),
        scheduled: tl.latencies(&tl.scheduled),
        running: tl.latencies(&tl.running),
        all_running: (tl.running.len() >= args.vms)
            .then(|| tl.all_running())
            .flatten(),
        create_errors: tl.create_errors,
        report_errors: tl.report_errors,
        final_phase: tl.final_phase,
        before,
        after,
        kube: requests::diff(&kube0, &kube1),
        ours: requests::diff(&ours0, &ours1),
        dead,
    })
}

fn get(path: &str) -> anyhow::Result<http::Request<Vec<u8>>> {
    Ok(http::Request::get(path).body(Vec::new())?)
}

/// Waits `settle`, then reads RSS five times a second apart and takes each median; the
/// etcds' sizes once at the end.
async fn memory(
    pids: [u32; 3],
    etcds: &[String; 2],
    http: &reqwest::Client,
    settle: Duration,
) -> anyhow::Result<Memory> {
    tokio::time::sleep(settle).await;
    let mut samples: [Vec<u64>; 3] = Default::default();
    for _ in 0..5 {
        for (i, pid) in pids.iter().enumerate() {
            samples[i].push(
                status_kib(*pid, "VmRSS")
                    .with_context(|| format!("no VmRSS for {}", MEASURED[i]))?,
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let mut m = Memory::default();
    for (i, s) in samples.iter_mut().enumerate() {
        s.sort_unstable();
        m.rss_kib[i] = percentile(s, 50.0).unwrap_or(0);
    }
    for (i, url) in etcds.iter().enumerate() {
        let text = http
            .get(format!("{url}/metrics"))
            .send()
            .await?
            .text()
            .await?;
        let g = |name: &str| super::memory::gauge(&text, name).unwrap_or(0.0) as u64;
        m.db[i] = g("etcd_mvcc_db_total_size_in_bytes");
        m.db_in_use[i] = g("etcd_mvcc_db_total_size_in_use_in_bytes");
    }
    Ok(m)
}

/// A run's headline on one line, for the terminal.
fn one_line(r: &RunResult) -> String {
    format!(
        "{} Running of {} created; all Running after {}; virt-controller {}/VMI; failed requests {}",
        r.running_count(),
        r.created,
        r.all_running
            .map_or("n/a".into(), |d| format!("{:.0} s", d.as_secs_f64())),
        r.per_vmi(0).map_or("n/a".into(), kb),
        r.failed()
    )
}

fn kb(bytes: f64) -> String {
    format!("{:.1} KB", bytes / 1024.0)
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// `p`-th percentile in seconds of one run's latencies.
fn pct(samples: &[Duration], p: f64) -> Option<f64> {
    let mut s = samples.to_vec();
    s.sort_unstable();
    percentile(&s, p).map(|d| d.as_secs_f64())
}

fn per_run(runs: &[RunResult], f: impl Fn(&RunResult) -> Option<f64>) -> Runs {
    Runs::new(runs.iter().filter_map(f))
}

fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "**not met**",
        None => "n/a",
    }
}

/// The figures table: one row per figure, median (min–max) over the runs, goal and verdict.
fn table(args: &ScaleArgs, runs: &[RunResult]) -> String {
    let n = runs.len();
    let mut s = format!(
        "| figure | median of {n} run{} (min–max) | goal | |\n|---|---|---|---|\n",
        if n == 1 { "" } else { "s" }
    );
    let mut row = |name: &str, value: String, goal: &str, met: Option<bool>| {
        let v = if goal.is_empty() { "" } else { verdict(met) };
        s.push_str(&format!("| {name} | {value} | {goal} | {v} |\n"));
    };
    let worst = |f: &dyn Fn(&RunResult) -> Option<f64>| -> Option<f64> {
        runs.iter()
            .map(f)
            .try_fold(f64::MIN, |a, x| Some(a.max(x?)))
    };
    row(
        "VMIs Running / VMIs created / VMs created",
        format!(
            "{} / {} / {}",
            per_run(runs, |r| Some(r.running_count() as f64)).summary(0, ""),
            per_run(runs, |r| Some(r.vmis as f64)).summary(0, ""),
            per_run(runs, |r| Some(r.created as f64)).summary(0, "")
        ),
        &format!("{} / {} / {}", args.vms, args.vms, args.vms),
        Some(
            runs.iter()
                .all(|r| r.running_count() >= args.vms && r.created >= args.vms),
        ),
    );
    for (what, running) in [
        ("create → VMI Scheduled", false),
        ("create → VMI Running", true),
    ] {
        for p in [50.0, 95.0, 99.0] {
            row(
                &format!("{what} P{p:.0}"),
                per_run(runs, |r| pct(r.latencies(running), p)).summary(1, "s"),
                "",
                None,
            );
        }
    }
    let all = |r: &RunResult| r.all_running.map(|d| d.as_secs_f64());
    row(
        &format!("first create → all {} Running", args.vms),
        per_run(runs, all).summary(0, "s"),
        "≤ 300 s",
        worst(&all).map(|w| w <= GOAL_ALL_RUNNING.as_secs_f64()),
    );
    for (i, name) in MEASURED.iter().enumerate() {
        let grow = move |r: &RunResult| r.per_vmi(i);
        let (goal, met) = if i == 0 {
            (
                "≤ 20 KB",
                worst(&grow).map(|w| w <= GOAL_CONTROLLER_PER_VMI),
            )
        } else {
            ("", None)
        };
        row(
            &format!("{name} RSS growth per VMI"),
            format!(
                "{} KB",
                per_run(runs, |r| grow(r).map(|b| b / 1024.0)).summary(1, "")
            ),
            goal,
            met,
        );
        row(
            &format!("{name} RSS before → after"),
            format!(
                "{} → {} MiB",
                per_run(runs, |r| Some(mib(r.before.rss_kib[i]))).summary(0, ""),
                per_run(runs, |r| Some(mib(r.after.rss_kib[i]))).summary(0, "")
            ),
            "",
            None,
        );
    }
    for (i, name) in ["etcd A (kube-apiserver's)", "etcd B (virt-apiserver's)"]
        .iter()
        .enumerate()
    {
        row(
            &format!("{name} db size / in use after"),
            format!(
                "{} / {} MiB",
                per_run(runs, |r| Some(r.after.db[i] as f64 / 1048576.0)).summary(1, ""),
                per_run(runs, |r| Some(r.after.db_in_use[i] as f64 / 1048576.0)).summary(1, "")
            ),
            "",
            None,
        );
    }
    let failed =
        |r: &RunResult| Some(r.failed() + (r.create_errors.len() + r.report_errors.len()) as f64);
    row(
        "failed requests (non-2xx but 409 and 404 lookups, both servers; failed creates and status writes)",
        per_run(runs, failed).summary(0, ""),
        "0",
        worst(&failed).map(|w| w == 0.0),
    );
    row(
        "409 Conflict responses (expected: lost compare-and-swaps)",
        per_run(runs, |r| Some(r.conflicts())).summary(0, ""),
        "",
        None,
    );
    row(
        "machine load (1 min) at start / end",
        format!(
            "{} / {}",
            per_run(runs, |r| Some(r.load_start)).summary(1, ""),
            per_run(runs, |r| Some(r.load_end)).summary(1, "")
        ),
        "",
        None,
    );
    s.push_str(&format!(
        "\nAPI requests per VMI, by server, verb and resource (median of the runs; rows of at \
         least 0.01 per VMI; kube-apiserver's rows for kubevirt.io, which it only proxies, \
         left out):\n\n{}",
        requests_table(runs)
    ));
    let problems = problems(runs);
    if !problems.is_empty() {
        s.push_str("\nProblems:\n\n");
        for p in problems {
            s.push_str(&format!("- {p}\n"));
        }
    }
    s
}

/// Requests per running VMI by server, verb and resource.
fn requests_table(runs: &[RunResult]) -> String {
    use std::collections::BTreeMap;
    let mut per: BTreeMap<(&str, String, String), Vec<f64>> = BTreeMap::new();
    for r in runs {
        let n = r.vmis.max(1) as f64;
        for (server, counts, skip) in [
            ("virt-apiserver", &r.ours, None),
            ("kube-apiserver", &r.kube, Some("kubevirt.io")),
        ] {
            for (verb, res, v) in requests::by_verb(counts, skip) {
                per.entry((server, verb, res)).or_default().push(v / n);
            }
        }
    }
    let mut rows: Vec<_> = per
        .into_iter()
        .map(|(k, v)| (k, Runs::new(v)))
        .filter(|(_, r)| r.median().is_some_and(|m| m >= 0.01))
        .collect();
    rows.sort_by(|a, b| {
        (a.0.0, b.1.median())
            .partial_cmp(&(b.0.0, a.1.median()))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    let mut s = String::from("| server | verb | resource | per VMI |\n|---|---|---|---|\n");
    for ((server, verb, res), r) in rows {
        s.push_str(&format!(
            "| {server} | {verb} | {res} | {} |\n",
            r.summary(2, "")
        ));
    }
    s
}

/// What went wrong in any run, each failure named.
fn problems(runs: &[RunResult]) -> Vec<String> {
    let mut out = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        let run = i + 1;
        if !r.dead.is_empty() {
            out.push(format!(
                "run {run}: exited during the run: {}",
                r.dead.join(", ")
            ));
        }
        for (server, c) in [("virt-apiserver", &r.ours), ("kube-apiserver", &r.kube)] {
            for l in requests::listed(c, Outcome::Failed) {
                out.push(format!("run {run}: {server} answered {l}"));
            }
            for l in requests::listed(c, Outcome::Conflict) {
                out.push(format!(
                    "run {run}: {server} 409 (expected, not counted as failed) {l}"
                ));
            }
            for l in requests::listed(c, Outcome::NotFound) {
                out.push(format!(
                    "run {run}: {server} 404 of a lookup (expected, not counted as failed) {l}"
                ));
            }
        }
        let first = |v: &[String]| v.iter().take(3).cloned().collect::<Vec<_>>().join("; ");
        if !r.create_errors.is_empty() {
            out.push(format!(
                "run {run}: {} creates failed: {}",
                r.create_errors.len(),
                first(&r.create_errors)
            ));
        }
        if !r.report_errors.is_empty() {
            out.push(format!(
                "run {run}: {} stand-in status writes failed: {}",
                r.report_errors.len(),
                first(&r.report_errors)
            ));
        }
        if !r.final_phase.is_empty() {
            out.push(format!(
                "run {run}: {} VMIs reached a final phase: {}",
                r.final_phase.len(),
                first(&r.final_phase)
            ));
        }
    }
    out
}

/// How the run is made, for the section.
fn describe(args: &ScaleArgs, runs: &[RunResult]) -> String {
    format!(
        "{n} fresh run{s}, each: a private kube-apiserver on its own etcd, virt-apiserver (release) \
         on another behind its aggregator, kube-scheduler (client rate limit lifted), KWOK {kwok} \
         managing {nodes} fake Nodes (its default stages make bound pods Running), virt-controller \
         (release, a process with leader election and Events); no kubelet, container or guest. \
         {vms} VMs (runStrategy Always, the start benchmark's 256 MiB kernel-boot VM) are created \
         at {rate}/s in one namespace; a stand-in inside the benchmark plays virt-handler's status \
         part: when virt-controller has marked a VMI Scheduled on its node (launcher pod Running), \
         it writes what virt-handler writes for a running TCG guest (its own pure status functions, \
         one merge patch of /status, as the admin user). Latencies are per VM from its create \
         request to its VMI seen Scheduled / Running on a watch through kube-apiserver. Memory: \
         RSS medians of 5 samples after {settle} s of quiet, before the first create and after the \
         last VMI runs (or the run's cap), divided by the VMIs virt-controller created. Requests: `apiserver_request_total` of both \
         servers over the same window (they include the benchmark's creates and watch, the \
         stand-in's writes, the scheduler's and KWOK's requests), divided by the same. \
         KubeVirt's anchor (its large-scale job, ../shared/reference/kubevirt.md): 8,000 VMIs \
         Running within 15 minutes, virt-controller growing 65 → 1,400 MB, about 173 KB per VMI.",
        n = runs.len(),
        s = if runs.len() == 1 { "" } else { "s" },
        kwok = crate::cluster::kwok_version().unwrap_or_else(|_| "unknown".into()),
        nodes = args.nodes,
        vms = args.vms,
        rate = args.rate,
        settle = args.settle_seconds,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> ScaleArgs {
        ScaleArgs {
            nodes: 10,
            vms: 2,
            rate: 50.0,
            runs: 1,
            settle_seconds: 10,
            max_seconds: 60,
            virt_controller: None,
            no_docs: true,
            this_build: false,
        }
    }

    fn result(controller_after_kib: u64, failed: bool) -> RunResult {
        let secs = |v: &[u64]| v.iter().map(|s| Duration::from_secs(*s)).collect();
        let code = if failed { "500" } else { "200" };
        RunResult {
            created: 2,
            vmis: 2,
            scheduled: secs(&[1, 2]),
            running: secs(&[2, 3]),
            all_running: Some(Duration::from_secs(4)),
            before: Memory {
                rss_kib: [10_000, 20_000, 30_000],
                ..Memory::default()
            },
            after: Memory {
                rss_kib: [controller_after_kib, 20_100, 30_000],
                db: [1 << 20, 2 << 20],
                db_in_use: [1 << 20, 1 << 20],
            },
            ours: requests::parse(&format!(
                "apiserver_request_total{{verb=\"patch\",resource=\"virtualmachineinstances\",subresource=\"status\",code=\"{code}\"}} 4\n"
            )),
            ..RunResult::default()
        }
    }

    #[test]
    fn command_spells_out_every_option() {
        assert_eq!(
            args().command(),
            "cargo xtask bench scale --nodes 10 --vms 2 --rate 50 --runs 1 --settle-seconds 10"
        );
    }

    #[test]
    fn table_has_percentiles_goals_and_requests_per_vmi() {
        // 20 KiB over 2 VMIs: 10 KB each, met; 100 KiB: 50 KB, not met.
        let t = table(&args(), &[result(10_020, false)]);
        assert!(
            t.contains("| create → VMI Running P50 | 2.0 s (2.0–2.0) |"),
            "{t}"
        );
        assert!(
            t.contains(
                "| virt-controller RSS growth per VMI | 10.0 (10.0–10.0) KB | ≤ 20 KB | met |"
            ),
            "{t}"
        );
        assert!(
            t.contains("| first create → all 2 Running | 4 s (4–4) | ≤ 300 s | met |"),
            "{t}"
        );
        assert!(
            t.contains(
                "| virt-apiserver | patch | virtualmachineinstances/status | 2.00 (2.00–2.00) |"
            ),
            "{t}"
        );
        assert!(t.contains("| failed requests (non-2xx but 409 and 404 lookups, both servers; failed creates and status writes) | 0 (0–0) | 0 | met |"), "{t}");
        let bad = table(&args(), &[result(10_100, true), result(10_020, false)]);
        assert!(bad.contains("| virt-controller RSS growth per VMI | 10.0 (10.0–50.0) KB | ≤ 20 KB | **not met** |"), "{bad}");
        assert!(
            bad.contains(
                "run 1: virt-apiserver answered patch virtualmachineinstances/status 500: 4"
            ),
            "{bad}"
        );
        assert!(bad.contains("| 0 (0–4) | 0 | **not met** |"), "{bad}");
    }
}
