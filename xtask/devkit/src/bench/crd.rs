//! `cargo xtask bench crd`: virt-apiserver against a CRD of the same kind, like for like.
//! Both behind one private kube-apiserver (its aggregator in front of ours, the CRD inside
//! it), each on a fresh etcd of its own started the same way, reached at the same URL
//! prefix by the same client; phases measured one at a time, the sides alternating which
//! goes first, `--runs` fresh harnesses. No local cluster is needed or touched.

pub(super) mod harness;
mod schema;

use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;

use super::apiserver::{self, ApiserverArgs, Phase, Pids, Target, Watch};
use super::memory;
use super::report::percentile;
use super::section::{self, Provenance, Runs, Section};
use harness::{Binaries, Harness, OURS_COLLECTION, Procs};

/// The processes whose memory is read, in the order of [`Procs::watched`].
const NAMES: [&str; 4] = [
    "kube-apiserver",
    "etcd A (kube-apiserver's)",
    "virt-apiserver",
    "etcd B (virt-apiserver's)",
];

/// Memory growth per object of the four processes and the two etcds' databases (A, B).
type PerObject = memory::PerObject<4, 2>;

impl Procs {
    /// The four processes in [`NAMES`]' order, and etcd A and B.
    fn watched(&self) -> memory::Watched<4, 2> {
        memory::Watched {
            pids: [
                self.kube_apiserver,
                self.etcd_a,
                self.virt_apiserver,
                self.etcd_b,
            ],
            etcd_urls: [self.etcd_a_url.clone(), self.etcd_b_url.clone()],
        }
    }
}

/// Arguments of `cargo xtask bench crd`.
#[derive(clap::Args, Debug, Clone)]
pub struct CrdArgs {
    /// VirtualMachines each side stores.
    #[arg(long, default_value_t = 10_000)]
    pub count: usize,
    /// Requests in flight during creates and updates.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Repeats of the unpaged LIST and of the paged walk, per side and run.
    #[arg(long, default_value_t = 5)]
    pub lists: usize,
    /// Page size of the paged walk.
    #[arg(long, default_value_t = 500)]
    pub page_size: usize,
    /// Concurrent watches on the collection during the updates.
    #[arg(long, default_value_t = 100)]
    pub watchers: usize,
    /// Updates (merge patches) made while the watches run.
    #[arg(long, default_value_t = 500)]
    pub updates: usize,
    /// GETs of one VM per path (direct, through kube-apiserver) for the aggregator's overhead.
    #[arg(long, default_value_t = 200)]
    pub gets: usize,
    /// Seconds to wait after the creates before memory is sampled until it settles.
    #[arg(long, default_value_t = 10)]
    pub settle_seconds: u64,
    /// Fresh harnesses; the side that goes first alternates between them.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Abort a run after this many seconds.
    #[arg(long, default_value_t = 3600)]
    pub max_seconds: u64,
    /// Only print the figures; leave docs/benchmarks.md alone.
    #[arg(long)]
    pub no_docs: bool,
    /// Run the client from this (possibly unoptimised) build instead of a release build.
    #[arg(long)]
    pub this_build: bool,
}

impl CrdArgs {
    /// The command that reproduces this run, every option that shapes the figures spelt out.
    pub fn command(&self) -> String {
        format!(
            "cargo xtask bench crd --count {} --concurrency {} --lists {} --page-size {} \
             --watchers {} --updates {} --gets {} --settle-seconds {} --runs {}{}",
            self.count,
            self.concurrency,
            self.lists,
            self.page_size,
            self.watchers,
            self.updates,
            self.gets,
            self.settle_seconds,
            self.runs,
            if self.this_build { " --this-build" } else { "" },
        )
    }

    /// The phases' shape in the form the shared phase code (bench apiserver's) takes.
    fn load(&self) -> ApiserverArgs {
        ApiserverArgs {
            count: self.count,
            concurrency: self.concurrency,
            lists: self.lists,
            page_size: self.page_size,
            watchers: self.watchers,
            updates: self.updates,
            watch_selector: None,
            update_rate: 0,
            settle_seconds: 0,
            max_seconds: self.max_seconds,
            no_docs: true,
            this_build: self.this_build,
        }
    }

    fn check(&self) -> anyhow::Result<()> {
        for (name, v) in [
            ("--count", self.count),
            ("--concurrency", self.concurrency),
            ("--lists", self.lists),
            ("--page-size", self.page_size),
            ("--gets", self.gets),
            ("--runs", self.runs),
        ] {
            anyhow::ensure!(v > 0, "{name} must be positive");
        }
        Ok(())
    }
}

/// Also the index of a side's figures in [`RunResult::sides`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Ours = 0,
    Crd = 1,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Ours => "virt-apiserver",
            Side::Crd => "CRD",
        }
    }

    /// Run `r` (from 0) puts ours first when even: each side goes first as often as the
    /// other, give or take one.
    fn order(run: usize) -> [Side; 2] {
        if run.is_multiple_of(2) {
            [Side::Ours, Side::Crd]
        } else {
            [Side::Crd, Side::Ours]
        }
    }
}

/// What one side measured in one run.
#[derive(Debug, Default)]
struct SideRun {
    create: Phase,
    memory: PerObject,
    settled: bool,
    list: Vec<Duration>,
    list_bytes: usize,
    list_items: usize,
    paged: Vec<Duration>,
    update: Phase,
    watch: Watch,
}

/// The aggregator's overhead: the same requests to virt-apiserver's own port and through
/// kube-apiserver, alternating.
#[derive(Debug, Default)]
struct Overhead {
    get_direct: Vec<Duration>,
    get_through: Vec<Duration>,
    list_direct: Vec<Duration>,
    list_through: Vec<Duration>,
}

impl Overhead {
    /// (direct, through) for the GETs, then for the LISTs.
    fn pairs(&self) -> [(&[Duration], &[Duration]); 2] {
        [
            (&self.get_direct, &self.get_through),
            (&self.list_direct, &self.list_through),
        ]
    }
}

/// One fresh harness's figures.
#[derive(Debug)]
struct RunResult {
    order: [Side; 2],
    /// The 1-minute load average when the run started.
    load: f64,
    procs: Procs,
    /// Indexed by [`Side`].
    sides: [SideRun; 2],
    overhead: Overhead,
    alive: bool,
}

impl RunResult {
    fn side(&self, s: Side) -> &SideRun {
        &self.sides[s as usize]
    }
}

/// Runs the benchmark.
pub fn run(args: CrdArgs) -> anyhow::Result<()> {
    args.check()?;
    if cfg!(debug_assertions) && !args.this_build {
        return apiserver::rerun_release();
    }
    // Taken before the run: the figures belong to the code and machine at its start.
    let provenance = Provenance::probe(args.command());
    let bins = binaries()?;
    let versions = Versions::probe(&bins);
    let rt = apiserver::runtime()?;
    let mut runs = Vec::new();
    for r in 0..args.runs {
        let order = Side::order(r);
        eprintln!("run {} of {}: {} first", r + 1, args.runs, order[0].name());
        let limit = Duration::from_secs(args.max_seconds);
        let result = rt
            .block_on(async { tokio::time::timeout(limit, one_run(&bins, &args, order)).await })
            .map_err(|_| anyhow::anyhow!("run {} took longer than {limit:?}", r + 1))??;
        runs.push(result);
    }
    drop(rt);
    let table = table(&args, &runs);
    println!("\n{table}");
    let body = format!(
        "{}\n\n{table}",
        describe(&args, &versions, &runs).trim_end()
    );
    super::record(&Section::new(section::CRD, provenance, body), args.no_docs)
}

/// kube-apiserver: `$KUBE_APISERVER_BIN` as for the integration tests, else the pinned
/// release (built once if missing); virt-apiserver: a release build of this tree.
fn binaries() -> anyhow::Result<Binaries> {
    let kube_apiserver = match std::env::var_os("KUBE_APISERVER_BIN") {
        Some(p) => p.into(),
        None => crate::cluster::ensure_kubernetes_binaries()
            .context("Kubernetes binaries")?
            .join("kube-apiserver"),
    };
    Ok(Binaries {
        kube_apiserver,
        virt_apiserver: crate::dev_apiserver::build_apiserver(true)?,
        etcd: virt_devenv::Options::default().etcd_bin,
    })
}

/// Versions named in the description.
struct Versions {
    etcd: String,
    kube: String,
}

impl Versions {
    fn probe(bins: &Binaries) -> Self {
        let kube = std::process::Command::new(&bins.kube_apiserver)
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default();
        Self {
            etcd: apiserver::etcd_version(&bins.etcd),
            kube: if kube.is_empty() {
                "unknown".into()
            } else {
                kube
            },
        }
    }
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// One fresh harness: store, then LIST, then watch + update, each phase for one side and
/// then the other, then the aggregator's overhead.
async fn one_run(bins: &Binaries, args: &CrdArgs, order: [Side; 2]) -> anyhow::Result<RunResult> {
    let load = load_average();
    let mut h = Harness::start(bins).await?;
    let procs = h.procs()?;
    let targets = Targets::new(&h, &procs);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    let mut sides: [SideRun; 2] = Default::default();
    let wait = Duration::from_secs(args.settle_seconds);
    eprintln!("settling before the first creates");
    let mut before = memory::settle(&procs.watched(), &http, wait).await?;
    for side in order {
        let r = &mut sides[side as usize];
        before = store(targets.of(side), args, &procs, &http, before, r).await?;
    }
    for side in order {
        lists(targets.of(side), args, &mut sides[side as usize]).await?;
    }
    for side in order {
        watch_and_update(targets.of(side), args, &mut sides[side as usize]).await?;
    }
    let overhead = overhead(&h, &targets.ours, args).await?;
    let alive = h.alive();
    h.stop();
    Ok(RunResult {
        order,
        load,
        procs,
        sides,
        overhead,
        alive,
    })
}

/// Each side's collection through kube-apiserver.
struct Targets {
    ours: Target,
    crd: Target,
}

impl Targets {
    fn new(h: &Harness, p: &Procs) -> Self {
        Self {
            ours: h.target(
                OURS_COLLECTION,
                "kubevirt.io/v1",
                Pids {
                    apiserver: p.virt_apiserver,
                    etcd: p.etcd_b,
                },
            ),
            crd: h.target(
                schema::COLLECTION,
                &format!("{}/v1", schema::GROUP),
                Pids {
                    apiserver: p.kube_apiserver,
                    etcd: p.etcd_a,
                },
            ),
        }
    }

    fn of(&self, s: Side) -> &Target {
        match s {
            Side::Ours => &self.ours,
            Side::Crd => &self.crd,
        }
    }
}

/// Creates the side's objects, lets memory settle, and charges the growth of every
/// process to them; returns the settled reading the next side starts from.
async fn store(
    t: &Target,
    args: &CrdArgs,
    procs: &Procs,
    http: &reqwest::Client,
    before: memory::Settled<4, 2>,
    r: &mut SideRun,
) -> anyhow::Result<memory::Settled<4, 2>> {
    eprintln!("{}: creating {} VirtualMachines", t.api_version, args.count);
    let c = apiserver::client(t, Some(Duration::from_secs(60)))?;
    r.create = apiserver::create(&c, &t.collection, &t.api_version, &args.load()).await;
    anyhow::ensure!(
        r.create.ok > 0,
        "every create failed: {:?}",
        r.create.errors.first()
    );
    // Idle keep-alive connections hold buffers in the servers: close them before reading.
    drop(c);
    eprintln!("{}: settling", t.api_version);
    let after = memory::settle(
        &procs.watched(),
        http,
        Duration::from_secs(args.settle_seconds),
    )
    .await?;
    r.memory = PerObject::between(&before.sample, &after.sample, r.create.ok);
    r.settled = before.stable && after.stable;
    Ok(after)
}

/// Unpaged LISTs, then paged walks.
async fn lists(t: &Target, args: &CrdArgs, r: &mut SideRun) -> anyhow::Result<()> {
    eprintln!("{}: listing", t.api_version);
    let c = apiserver::client(t, Some(Duration::from_secs(120)))?;
    for i in 0..args.lists {
        let start = Instant::now();
        let resp = c.get(&t.collection).send().await?;
        anyhow::ensure!(resp.status() == 200, "LIST: {}", resp.status());
        let body = resp.bytes().await?;
        r.list.push(start.elapsed());
        if i == 0 {
            r.list_bytes = body.len();
            let v: Value = serde_json::from_slice(&body).context("decoding the LIST")?;
            r.list_items = v["items"].as_array().map_or(0, Vec::len);
        }
    }
    for _ in 0..args.lists {
        let (pages, _) = apiserver::paged_list(&c, &t.collection, args.page_size).await?;
        r.paged.push(pages.iter().sum());
    }
    Ok(())
}

async fn watch_and_update(t: &Target, args: &CrdArgs, r: &mut SideRun) -> anyhow::Result<()> {
    if args.watchers == 0 || args.updates == 0 {
        return Ok(());
    }
    eprintln!(
        "{}: {} watches, {} updates",
        t.api_version, args.watchers, args.updates
    );
    let c = apiserver::client(t, Some(Duration::from_secs(60)))?;
    let (update, watch, _) = apiserver::watch_fanout(
        t,
        &c,
        &t.collection,
        &args.load(),
        Instant::now(),
        r.create.ok,
    )
    .await?;
    r.update = update;
    r.watch = watch;
    Ok(())
}

/// GET one VM and LIST all of them on virt-apiserver's own port and through
/// kube-apiserver, alternating which goes first.
async fn overhead(h: &Harness, through: &Target, args: &CrdArgs) -> anyhow::Result<Overhead> {
    eprintln!(
        "aggregator overhead: {} GETs and {} LISTs per path",
        args.gets, args.lists
    );
    let direct = h.direct_client()?;
    let via = apiserver::client(through, Some(Duration::from_secs(60)))?;
    let direct_list = h.direct_url(OURS_COLLECTION);
    let name = apiserver::vm_name(0);
    let mut o = Overhead::default();
    for i in 0..args.gets {
        let d = (&direct, format!("{direct_list}/{name}"));
        let v = (&via, format!("{}/{name}", through.collection));
        let (a, b) = timed_pair(i, d, v).await?;
        o.get_direct.push(a);
        o.get_through.push(b);
    }
    for i in 0..args.lists {
        let d = (&direct, direct_list.clone());
        let v = (&via, through.collection.clone());
        let (a, b) = timed_pair(i, d, v).await?;
        o.list_direct.push(a);
        o.list_through.push(b);
    }
    Ok(o)
}

/// Times the two GETs, the first one first on even `i`; returns (first's, second's).
async fn timed_pair(
    i: usize,
    a: (&reqwest::Client, String),
    b: (&reqwest::Client, String),
) -> anyhow::Result<(Duration, Duration)> {
    if i.is_multiple_of(2) {
        let ta = timed_get(a.0, &a.1).await?;
        Ok((ta, timed_get(b.0, &b.1).await?))
    } else {
        let tb = timed_get(b.0, &b.1).await?;
        Ok((timed_get(a.0, &a.1).await?, tb))
    }
}

/// A GET to the last byte of its body.
async fn timed_get(c: &reqwest::Client, url: &str) -> anyhow::Result<Duration> {
    let start = Instant::now();
    let resp = c.get(url).send().await?;
    anyhow::ensure!(resp.status() == 200, "GET {url}: {}", resp.status());
    resp.bytes().await?;
    Ok(start.elapsed())
}

/// Nearest-rank percentile of one run's samples.
fn pct(samples: &[Duration], q: f64) -> Option<f64> {
    let mut s = samples.to_vec();
    s.sort_unstable();
    percentile(&s, q).map(|d| d.as_secs_f64() * 1000.0)
}

/// One figure per run for each side.
fn per_run(runs: &[RunResult], side: Side, f: impl Fn(&SideRun) -> Option<f64>) -> Runs {
    Runs::new(runs.iter().filter_map(|r| f(r.side(side))))
}

/// A comparison goal on ours / CRD (medians).
#[derive(Clone, Copy)]
enum Goal {
    AtLeast(f64),
    AtMost(f64),
}

impl Goal {
    fn verdict(self, ratio: Option<f64>) -> String {
        let (ok, text) = match self {
            Goal::AtLeast(g) => (ratio.map(|r| r >= g), format!("≥ {g}×")),
            Goal::AtMost(g) => (ratio.map(|r| r <= g), format!("≤ {g}×")),
        };
        match ok {
            Some(true) => format!("{text}: met"),
            Some(false) => format!("{text}: **not met**"),
            None => format!("{text}: not measured"),
        }
    }
}

/// One comparison row.
struct Row {
    what: String,
    ours: Runs,
    crd: Runs,
    decimals: usize,
    unit: &'static str,
    goal: Option<Goal>,
    /// Off where one side's figure is only an idle process's drift.
    ratio: bool,
}

impl Row {
    fn new(
        what: impl Into<String>,
        ours: Runs,
        crd: Runs,
        decimals: usize,
        unit: &'static str,
    ) -> Self {
        Self {
            what: what.into(),
            ours,
            crd,
            decimals,
            unit,
            goal: None,
            ratio: true,
        }
    }

    fn without_ratio(mut self) -> Self {
        self.ratio = false;
        self
    }

    fn goal(mut self, g: Goal) -> Self {
        self.goal = Some(g);
        self
    }

    fn render(&self) -> String {
        let ratio = match (self.ours.median(), self.crd.median()) {
            (Some(a), Some(b)) if b != 0.0 => Some(a / b),
            _ => None,
        };
        let shown = match (self.ratio, ratio) {
            (false, _) => "—".into(),
            (true, Some(r)) => format!("{r:.2}×"),
            (true, None) => "n/a".into(),
        };
        format!(
            "| {} | {} | {} | {} | {} |\n",
            self.what,
            self.ours.summary(self.decimals, self.unit),
            self.crd.summary(self.decimals, self.unit),
            shown,
            self.goal.map_or("—".into(), |g| g.verdict(ratio)),
        )
    }
}

fn rows(args: &CrdArgs, runs: &[RunResult]) -> Vec<Row> {
    let both = |f: &dyn Fn(&SideRun) -> Option<f64>| {
        (per_run(runs, Side::Ours, f), per_run(runs, Side::Crd, f))
    };
    let mut out = Vec::new();
    let (a, b) = both(&|s| Some(s.create.rate()));
    out.push(
        Row::new(
            format!(
                "create {} VMs, {} in flight: throughput",
                args.count, args.concurrency
            ),
            a,
            b,
            0,
            "/s",
        )
        .goal(Goal::AtLeast(2.0)),
    );
    for q in [50.0, 99.0] {
        let (a, b) = both(&|s| pct(&s.create.latencies, q));
        out.push(Row::new(format!("create latency p{q}"), a, b, 1, "ms"));
    }
    let kib = |v: f64| v / 1024.0;
    for (i, name) in NAMES.iter().enumerate() {
        let (a, b) = both(&|s| Some(kib(s.memory.rss[i])));
        // The process in one side's path only drifts while the other side is written.
        out.push(
            Row::new(format!("RSS per stored object: {name}"), a, b, 2, "KiB").without_ratio(),
        );
    }
    let (a, b) = both(&|s| Some(kib(s.memory.rss_total())));
    out.push(
        Row::new("RSS per stored object: all four processes", a, b, 2, "KiB")
            .goal(Goal::AtMost(0.3)),
    );
    // Each side's objects live in its own etcd: B for ours, A for the CRD.
    let a = per_run(runs, Side::Ours, |s| Some(s.memory.db_in_use[1]));
    let b = per_run(runs, Side::Crd, |s| Some(s.memory.db_in_use[0]));
    out.push(Row::new(
        "etcd database in use per stored object (the side's etcd)",
        a,
        b,
        0,
        "B",
    ));
    let (a, b) = both(&|s| Some(s.list_bytes as f64 / s.list_items.max(1) as f64));
    out.push(Row::new("LIST response per object", a, b, 0, "B"));
    let (a, b) = both(&|s| pct(&s.list, 50.0));
    out.push(Row::new(
        format!("LIST all, unpaged, p50 of {}", args.lists),
        a,
        b,
        1,
        "ms",
    ));
    let (a, b) = both(&|s| pct(&s.paged, 50.0));
    out.push(Row::new(
        format!(
            "LIST all, pages of {}, whole walk, p50 of {}",
            args.page_size, args.lists
        ),
        a,
        b,
        1,
        "ms",
    ));
    if args.watchers > 0 && args.updates > 0 {
        let (a, b) = both(&|s| Some(s.update.rate()));
        out.push(Row::new(
            format!(
                "updates during {} watches, {} in flight: throughput",
                args.watchers, args.concurrency
            ),
            a,
            b,
            0,
            "/s",
        ));
        for (q, goal) in [(50.0, None), (99.0, Some(Goal::AtMost(0.5)))] {
            let (a, b) = both(&|s| pct(&s.watch.from_sent, q));
            let row = Row::new(
                format!(
                    "watch delivery from update sent, p{q} of {} updates × {} watches",
                    args.updates, args.watchers
                ),
                a,
                b,
                1,
                "ms",
            );
            out.push(match goal {
                Some(g) => row.goal(g),
                None => row,
            });
        }
        let (a, b) = both(&|s| Some(s.watch.rewatches as f64));
        out.push(
            Row::new("watch streams the server ended, opened again", a, b, 0, "").without_ratio(),
        );
    }
    out
}

fn overhead_table(args: &CrdArgs, runs: &[RunResult]) -> String {
    let mut s = String::from(
        "| virt-apiserver, request | direct to its port | through kube-apiserver | added by the aggregator |\n|---|---|---|---|\n",
    );
    let labels = [
        format!("GET one VM, p50 of {}", args.gets),
        format!("LIST all {}, unpaged, p50 of {}", args.count, args.lists),
    ];
    for (i, what) in labels.iter().enumerate() {
        let p50s = |r: &RunResult| {
            let (d, t) = r.overhead.pairs()[i];
            pct(d, 50.0).zip(pct(t, 50.0))
        };
        let direct = Runs::new(runs.iter().filter_map(|r| p50s(r).map(|p| p.0)));
        let through = Runs::new(runs.iter().filter_map(|r| p50s(r).map(|p| p.1)));
        let added = Runs::new(runs.iter().filter_map(|r| p50s(r).map(|(d, t)| t - d)));
        s.push_str(&format!(
            "| {what} | {} | {} | {} |\n",
            direct.summary(2, "ms"),
            through.summary(2, "ms"),
            added.summary(2, "ms"),
        ));
    }
    s
}

/// Both tables, and what went wrong, if anything.
fn table(args: &CrdArgs, runs: &[RunResult]) -> String {
    let runs_text = match runs.len() {
        1 => "one run".to_string(),
        n => format!("median of {n} runs (min–max)"),
    };
    let mut s = format!(
        "| measurement, {runs_text} | virt-apiserver through the aggregator | CRD in kube-apiserver | ours / CRD (medians) | goal |\n|---|---|---|---|---|\n"
    );
    for r in rows(args, runs) {
        s.push_str(&r.render());
    }
    s.push_str("\nThe aggregator's own overhead, on the same harness after the phases above:\n\n");
    s.push_str(&overhead_table(args, runs));
    let problems = problems(args, runs);
    if !problems.is_empty() {
        s.push_str("\nObserved during these runs:\n\n");
        for p in problems {
            s.push_str(&format!("- {}\n", p.replace('\n', " ")));
        }
    }
    s
}

fn problems(args: &CrdArgs, runs: &[RunResult]) -> Vec<String> {
    let mut out = Vec::new();
    for (i, r) in runs.iter().enumerate() {
        let run = i + 1;
        if !r.alive {
            out.push(format!("run {run}: a process exited during the run"));
        }
        for side in [Side::Ours, Side::Crd] {
            let s = r.side(side);
            let name = side.name();
            if !s.settled {
                out.push(format!(
                    "run {run}, {name}: memory did not settle within 60 s; the figure is the last five samples' median"
                ));
            }
            let errors = s.create.errors.iter().chain(&s.update.errors);
            for e in errors.take(3) {
                out.push(format!("run {run}, {name}: {e}"));
            }
            if s.list_items != s.create.ok {
                out.push(format!(
                    "run {run}, {name}: LIST returned {} items after {} creates",
                    s.list_items, s.create.ok
                ));
            }
            if args.watchers > 0 && args.updates > 0 && s.watch.missing() > 0 {
                out.push(format!(
                    "run {run}, {name}: {} watch events missing; {}",
                    s.watch.missing(),
                    s.watch.failures.first().map_or("", String::as_str)
                ));
            }
        }
    }
    out
}

/// The generated description: method, versions, and each run's processes.
fn describe(args: &CrdArgs, v: &Versions, runs: &[RunResult]) -> String {
    let mut s = format!(
        "- One harness per run, started fresh and needing no cluster: kube-apiserver ({kube}, \
         RBAC, the local cluster's aggregation flags: front-proxy CA and client certificate, \
         `--enable-aggregator-routing`) on etcd A; the release virt-apiserver on etcd B, not \
         standalone (it reads the CAs kube-apiserver publishes and checks namespaces with it), \
         registered by the two APIServices virt-operator renders and reached through a Service \
         and an EndpointSlice holding this host's address, as the aggregator reaches a pod; and \
         the CRD `{crd}` (kind VirtualMachine, our OpenAPI v3 schema made structural, status \
         subresource). Both etcds are {etcd} started by the same code with the same flags \
         (`virt_devenv::Etcd`), data in a temp dir.\n\
         - One client (this release build, HTTP/1.1 over TLS, the admin's client certificate, \
         group system:masters) sends both sides' requests to the same kube-apiserver URL: \
         `/apis/kubevirt.io/v1/…` goes through the aggregator to virt-apiserver, \
         `/apis/{group}/v1/…` is served by kube-apiserver itself. Client and servers share the \
         machine's CPUs.\n\
         - Phases, each run for one side and then the other before the next phase (run 1 ours \
         first, run 2 the CRD first, and so on): create {n} VirtualMachines (the bench's test VM \
         manifest, {c} in flight); memory; LIST all {l} times unpaged and walk them {l} times \
         in pages of {p}; {w} watches from the current resourceVersion while {u} merge-patch \
         updates ({c} in flight) write their send time into an annotation; then, on ours only, \
         {g} GETs of one VM and {l} unpaged LISTs on virt-apiserver's own port (the \
         front-proxy certificate with the admin's X-Remote-User/Group, as the aggregator \
         sends) and through kube-apiserver, alternating.\n\
         - Memory per stored object: every process's VmRSS (/proc/<pid>/status of the pids \
         the harness spawned) and each etcd's `etcd_mvcc_db_total_size_in_use_in_bytes` are \
         read before and after a side's creates, nothing else running between: {settle} s of \
         rest, then a sample a second until five in a row agree within 0.5 % or 512 KiB (at \
         most 60 s), their median counting; the growth is divided by the objects created. All \
         four processes are read at the same moments for both sides, because kube-apiserver \
         is in the path of both: for ours it proxies the creates (and any memory that costs \
         it is charged to ours), for the CRD it stores them; the side not being written shows \
         what an idle process drifts by. The second side's \"before\" is the first side's \
         \"after\". A negative figure is memory given back.\n\
         - Latencies are to the last byte of the body, percentiles nearest-rank within a run; \
         each cell is the median of the runs' figures with their min–max, the ratio that of \
         the medians. Watch delivery includes the update's own write; a watch stream the \
         server ends early (kube-apiserver ends those that do not keep up) is opened again \
         from the last resourceVersion seen, as an informer does, and the events missed \
         meanwhile count when they arrive. Goals, on the medians: \
         ours ≥ 2× the CRD's create throughput, ≤ 0.5× its watch delivery p99, ≤ 0.3× its \
         memory per stored object.\n",
        kube = v.kube,
        crd = schema::CRD_NAME,
        etcd = v.etcd,
        group = schema::GROUP,
        n = args.count,
        c = args.concurrency,
        l = args.lists,
        p = args.page_size,
        w = args.watchers,
        u = args.updates,
        g = args.gets,
        settle = args.settle_seconds,
    );
    for (i, r) in runs.iter().enumerate() {
        let p = &r.procs;
        s.push_str(&format!(
            "- Run {}: {} first; load average {:.2} at its start; kube-apiserver pid {} ({}), \
             etcd A pid {} ({}), virt-apiserver pid {} ({}), etcd B pid {} ({}).\n",
            i + 1,
            r.order[0].name(),
            r.load,
            p.kube_apiserver,
            p.kube_apiserver_url,
            p.etcd_a,
            p.etcd_a_url,
            p.virt_apiserver,
            p.virt_apiserver_url,
            p.etcd_b,
            p.etcd_b_url,
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> CrdArgs {
        CrdArgs {
            count: 4,
            concurrency: 2,
            lists: 2,
            page_size: 2,
            watchers: 0,
            updates: 0,
            gets: 2,
            settle_seconds: 1,
            runs: 2,
            max_seconds: 60,
            no_docs: true,
            this_build: false,
        }
    }

    fn side(rate_secs: u64, ms: u64) -> SideRun {
        SideRun {
            create: Phase {
                ok: 4,
                latencies: vec![Duration::from_millis(ms); 4],
                elapsed: Duration::from_secs(rate_secs),
                errors: Vec::new(),
            },
            memory: PerObject {
                rss: [1024.0, 0.0, 0.0, 0.0],
                db_in_use: [100.0, 200.0],
            },
            settled: true,
            list: vec![Duration::from_millis(ms)],
            list_bytes: 400,
            list_items: 4,
            paged: vec![Duration::from_millis(ms)],
            ..SideRun::default()
        }
    }

    fn run(order: [Side; 2]) -> RunResult {
        RunResult {
            order,
            load: 0.5,
            procs: Procs {
                kube_apiserver: 1,
                etcd_a: 2,
                virt_apiserver: 3,
                etcd_b: 4,
                etcd_a_url: String::new(),
                etcd_b_url: String::new(),
                kube_apiserver_url: String::new(),
                virt_apiserver_url: String::new(),
            },
            sides: [side(1, 10), side(4, 40)],
            overhead: Overhead {
                get_direct: vec![Duration::from_millis(1)],
                get_through: vec![Duration::from_millis(3)],
                list_direct: vec![Duration::from_millis(10)],
                list_through: vec![Duration::from_millis(15)],
            },
            alive: true,
        }
    }

    #[test]
    fn sides_alternate_which_goes_first() {
        assert_eq!(Side::order(0), [Side::Ours, Side::Crd]);
        assert_eq!(Side::order(1), [Side::Crd, Side::Ours]);
        assert_eq!(Side::order(2), Side::order(0));
    }

    #[test]
    fn command_spells_out_every_option() {
        assert_eq!(
            args().command(),
            "cargo xtask bench crd --count 4 --concurrency 2 --lists 2 --page-size 2 \
             --watchers 0 --updates 0 --gets 2 --settle-seconds 1 --runs 2"
        );
        let mut zero = args();
        zero.count = 0;
        assert!(zero.check().is_err());
        assert!(args().check().is_ok());
    }

    #[test]
    fn table_has_ratios_goals_and_the_aggregator_line() {
        let runs = [run(Side::order(0)), run(Side::order(1))];
        let t = table(&args(), &runs);
        assert!(
            t.contains("| create 4 VMs, 2 in flight: throughput | 4 /s (4–4) | 1 /s (1–1) | 4.00× | ≥ 2×: met |"),
            "{t}"
        );
        assert!(
            t.contains("| RSS per stored object: all four processes | 1.00 KiB (1.00–1.00) | 1.00 KiB (1.00–1.00) | 1.00× | ≤ 0.3×: **not met** |"),
            "{t}"
        );
        assert!(t.contains("| etcd database in use per stored object (the side's etcd) | 200 B (200–200) | 100 B (100–100) | 2.00× | — |"), "{t}");
        assert!(t.contains("| GET one VM, p50 of 2 | 1.00 ms (1.00–1.00) | 3.00 ms (3.00–3.00) | 2.00 ms (2.00–2.00) |"), "{t}");
        // No watch rows without watches, and nothing went wrong.
        assert!(
            !t.contains("watch delivery") && !t.contains("Observed"),
            "{t}"
        );
        let d = describe(
            &args(),
            &Versions {
                etcd: "3.4".into(),
                kube: "Kubernetes v1".into(),
            },
            &runs,
        );
        assert!(d.contains("- Run 2: CRD first; load average 0.50"), "{d}");
        // A section body carries no heading of its own.
        assert!(
            !format!("{d}{t}")
                .lines()
                .any(|l| l.starts_with("# ") || l.starts_with("## "))
        );
    }

    #[test]
    fn problems_are_reported() {
        let mut r = run(Side::order(0));
        r.sides[Side::Crd as usize].settled = false;
        r.sides[Side::Ours as usize].list_items = 3;
        r.alive = false;
        let p = problems(&args(), &[r]);
        assert_eq!(p.len(), 3, "{p:?}");
    }
}
