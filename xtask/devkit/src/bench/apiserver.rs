//! `cargo xtask bench apiserver`: the release virt-apiserver on a real etcd (both on
//! loopback, started by DevEnv) under create, LIST and watch fan-out load.
//!
//! Every phase is bounded in count; the whole run is bounded by `--max-seconds`.
//! The client shares the machine's CPUs with etcd and the server, so figures are
//! for comparing runs on the same machine, not absolute capacity.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};
use virt_devenv::{DevEnv, Options};

use super::memory;
use super::report::{self, bytes, p50_p99_max, p50_p99_max_ns, percentile};
use super::section::{self, Provenance, Section};

const VMS: &str = "/apis/kubevirt.io/v1/namespaces/default/virtualmachines";
/// Written by each update: the update's sequence number and when it was sent, in
/// nanoseconds since the benchmark's start instant. One process owns the clock, so a
/// watcher can subtract it from its receipt time directly.
const SEQ: &str = "bench.kubevirt.io/seq";
const SENT: &str = "bench.kubevirt.io/sent-ns";
/// A watcher that sees nothing for this long has lost events; stop waiting for it.
const WATCH_IDLE: Duration = Duration::from_secs(30);

/// Goal: virt-apiserver's RSS growth per stored VM (issue 20).
const GOAL_RSS_PER_VM: f64 = 2048.0;
/// Goal: p99 of watch delivery from the update's send (issue 20).
const GOAL_WATCH_P99: Duration = Duration::from_secs(1);

/// Arguments of `cargo xtask bench apiserver`.
#[derive(clap::Args, Debug, Clone)]
pub struct ApiserverArgs {
    /// VirtualMachines to create.
    #[arg(long, default_value_t = 100_000)]
    pub count: usize,
    /// Requests in flight during the create and update phases.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Full LISTs (and paged LIST traversals) to time.
    #[arg(long, default_value_t = 10)]
    pub lists: usize,
    /// Page size of the paged LIST.
    #[arg(long, default_value_t = 500)]
    pub page_size: usize,
    /// Concurrent watchers on the collection.
    #[arg(long, default_value_t = 1000)]
    pub watchers: usize,
    /// Updates (merge patches) made while the watchers run.
    #[arg(long, default_value_t = 500)]
    pub updates: usize,
    /// Label selector of the watches (every VM has `app=bench`): a watch with a selector
    /// has its events encoded for it alone, one without shares them with the others.
    #[arg(long)]
    pub watch_selector: Option<String>,
    /// Updates sent per second at most (0: as fast as `--concurrency` allows).
    #[arg(long, default_value_t = 0)]
    pub update_rate: u32,
    /// Seconds of rest before memory is sampled until it settles, before and after the
    /// creates.
    #[arg(long, default_value_t = 10)]
    pub settle_seconds: u64,
    /// Abort the run after this many seconds.
    #[arg(long, default_value_t = 1800)]
    pub max_seconds: u64,
    /// Only print the summary; leave docs/benchmarks.md alone.
    #[arg(long)]
    pub no_docs: bool,
    /// Run the client from this (possibly unoptimised) build instead of a release build.
    #[arg(long)]
    pub this_build: bool,
}

/// Runs the benchmark.
pub fn run(args: ApiserverArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.count > 0, "--count must be positive");
    anyhow::ensure!(args.concurrency > 0, "--concurrency must be positive");
    anyhow::ensure!(args.page_size > 0, "--page-size must be positive");
    if cfg!(debug_assertions) && !args.this_build {
        return rerun_release();
    }
    let bin = crate::dev_apiserver::build_apiserver(true)?;
    let etcd_bin = Options::default().etcd_bin;
    let etcd_version = etcd_version(&etcd_bin);
    // Taken before the run: the figures belong to the code and machine at its start.
    let provenance = Provenance::probe(args.command());
    eprintln!("starting etcd and the release virt-apiserver");
    let mut env = DevEnv::start(Options {
        apiserver_bin: bin,
        etcd_bin,
        ..Default::default()
    })
    .context("starting etcd and virt-apiserver")?;
    let rt = runtime()?;
    let results = bench_devenv(&rt, &mut env, &args);
    env.stop();
    drop(rt);
    let results = results?;

    let rows = results.rows(&args);
    println!("\n{}", table(&rows));
    for n in &results.notes {
        println!("note: {n}");
    }
    if !results.log_warnings.is_empty() {
        println!(
            "server log: {} WARN/ERROR lines, the first ones:\n{}",
            results.log_warnings.len(),
            results
                .log_warnings
                .iter()
                .take(10)
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    let body = body(&etcd_version, &args, &rows, &results);
    super::record(
        &Section::new(section::APISERVER, provenance, body),
        args.no_docs,
    )
}

impl ApiserverArgs {
    /// The command that reproduces this run, every option that shapes the figures spelt out.
    pub fn command(&self) -> String {
        format!(
            "cargo xtask bench apiserver --count {} --concurrency {} --lists {} --page-size {} \
             --watchers {} --updates {} --update-rate {} --settle-seconds {}{}{}",
            self.count,
            self.concurrency,
            self.lists,
            self.page_size,
            self.watchers,
            self.updates,
            self.update_rate,
            self.settle_seconds,
            self.watch_selector
                .as_ref()
                .map_or(String::new(), |s| format!(" --watch-selector {s}")),
            if self.this_build { " --this-build" } else { "" },
        )
    }
}

/// The client's runtime: two workers, like the machine's CPUs.
pub(super) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("building the tokio runtime")
}

/// Runs the phases against the DevEnv's virt-apiserver; collects its log's warnings.
pub(super) fn bench_devenv(
    rt: &tokio::runtime::Runtime,
    env: &mut DevEnv,
    args: &ApiserverArgs,
) -> anyhow::Result<Results> {
    let pids = Pids {
        apiserver: env
            .apiserver_pid()
            .context("virt-apiserver has no process")?,
        etcd: env.etcd_pid(),
    };
    let watched = memory::Watched {
        pids: [pids.apiserver, pids.etcd],
        etcd_urls: [env.etcd_url.clone()],
    };
    let ca = std::fs::read(&env.server_ca).context("reading the serving CA")?;
    let mut identity = std::fs::read(&env.admin.cert).context("reading the client certificate")?;
    identity.extend(std::fs::read(&env.admin.key).context("reading the client key")?);
    let target = Target {
        collection: format!("{}{VMS}", env.server_url),
        api_version: "kubevirt.io/v1".into(),
        ca,
        identity,
        pids,
    };
    let outcome = rt.block_on(async {
        tokio::time::timeout(
            Duration::from_secs(args.max_seconds),
            bench(&target, &watched, args),
        )
        .await
    });
    let alive = env.alive();
    let log = std::fs::read_to_string(&env.apiserver_log).unwrap_or_default();
    let mut results = match outcome {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            eprintln!("server log tail:\n{}", tail(&log, 30));
            return Err(e);
        }
        Err(_) => {
            eprintln!("server log tail:\n{}", tail(&log, 30));
            anyhow::bail!("the benchmark did not finish within {}s", args.max_seconds);
        }
    };
    results.log_warnings = log
        .lines()
        .filter(|l| l.contains("WARN") || l.contains("ERROR"))
        .map(str::to_string)
        .collect();
    if !alive {
        results
            .notes
            .push("etcd or virt-apiserver exited during the run".into());
    }
    Ok(results)
}

/// The server under test: its VirtualMachine collection and how to reach it.
pub(super) struct Target {
    /// Full URL of the namespaced collection.
    pub collection: String,
    /// apiVersion of the created objects.
    pub api_version: String,
    /// PEM of the CA that signed the serving certificate.
    pub ca: Vec<u8>,
    /// PEM client certificate followed by its key.
    pub identity: Vec<u8>,
    pub pids: Pids,
}

/// Runs the same command line from a release build of xtask. An unoptimised client
/// spends more CPU on TLS and JSON per watch event than the server does, and on a small
/// machine it takes that CPU from the server it is measuring.
pub(super) fn rerun_release() -> anyhow::Result<()> {
    eprintln!("building a release xtask for the benchmark client");
    let status =
        std::process::Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["build", "--quiet", "--release", "-p", "xtask-devkit"])
            .status()
            .context("running cargo build")?;
    anyhow::ensure!(status.success(), "building the release xtask failed");
    let exe = crate::target_dir().join("release").join("xtask-devkit");
    let status = std::process::Command::new(&exe)
        .args(std::env::args_os().skip(1))
        .status()
        .with_context(|| format!("running {}", exe.display()))?;
    anyhow::ensure!(status.success(), "the release benchmark failed");
    Ok(())
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Pids {
    pub apiserver: u32,
    pub etcd: u32,
}

#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Rss {
    /// VmRSS before the load, KiB.
    pub idle: u64,
    /// VmHWM at the end, KiB.
    pub peak: u64,
    /// VmRSS at the end, KiB.
    pub after: u64,
}

/// Requests of one phase.
#[derive(Debug, Default)]
pub(super) struct Phase {
    pub ok: usize,
    pub latencies: Vec<Duration>,
    pub elapsed: Duration,
    pub errors: Vec<String>,
}

impl Phase {
    pub fn rate(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

#[derive(Debug, Default)]
pub(super) struct Watch {
    watchers: usize,
    connected: usize,
    /// Successful updates: every watcher should see each once.
    expected: usize,
    /// Expected events received, per watcher.
    received: Vec<usize>,
    duplicates: usize,
    unexpected: usize,
    out_of_order: usize,
    /// Streams the server ended early and the watchers opened again.
    pub rewatches: usize,
    /// Receipt minus the annotated send time.
    pub from_sent: Vec<Duration>,
    /// Receipt minus when the updater got its response (negative: the event won).
    from_response_ns: Vec<i64>,
    /// Watch streams that ended early or failed.
    pub failures: Vec<String>,
}

impl Watch {
    /// Events some watcher should have received and did not.
    pub fn missing(&self) -> usize {
        (self.expected * self.watchers).saturating_sub(self.received.iter().sum())
    }
}

#[derive(Debug, Default)]
pub(super) struct Results {
    pub create: Phase,
    pub list: Vec<Duration>,
    list_bytes: u64,
    pub list_items: usize,
    paged: Vec<Duration>,
    pages: Vec<Duration>,
    pages_per_list: usize,
    update: Phase,
    pub watch: Watch,
    pub api: Rss,
    pub etcd: Rss,
    /// Growth per stored VM of virt-apiserver and etcd (RSS), and etcd's database in use,
    /// between settled readings around the creates.
    stored: memory::PerObject<2, 1>,
    /// Both readings settled.
    settled: bool,
    /// Items of each paged walk.
    paged_items: Vec<usize>,
    cpu_total: Cpu,
    cpu_watch: Cpu,
    notes: Vec<String>,
    log_warnings: Vec<String>,
}

pub(super) fn client(t: &Target, timeout: Option<Duration>) -> anyhow::Result<reqwest::Client> {
    let mut b = reqwest::Client::builder()
        .use_rustls_tls()
        .add_root_certificate(reqwest::Certificate::from_pem(&t.ca)?)
        .identity(reqwest::Identity::from_pem(&t.identity)?)
        .tcp_nodelay(true);
    if let Some(t) = timeout {
        b = b.timeout(t);
    }
    Ok(b.build()?)
}

pub(super) fn vm(api_version: &str, name: &str) -> Value {
    json!({
        "apiVersion": api_version, "kind": "VirtualMachine",
        "metadata": {"name": name, "labels": {"app": "bench"}},
        "spec": {"runStrategy": "Halted", "template": {"spec": {
            "domain": {"devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]},
                       "resources": {"requests": {"memory": "64Mi"}}},
            "volumes": [{"name": "root", "containerDisk": {"image": "localhost/kubevirt-rs/test-guest:latest"}}]}}}
    })
}

pub(super) fn vm_name(i: usize) -> String {
    format!("bench-{i:05}")
}

pub(super) async fn bench(
    t: &Target,
    watched: &memory::Watched<2, 1>,
    args: &ApiserverArgs,
) -> anyhow::Result<Results> {
    let pids = t.pids;
    let url = t.collection.clone();
    let t0 = Instant::now();
    let mut r = Results::default();
    let cpu_start = Cpu::now(pids, t0);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    let settle = Duration::from_secs(args.settle_seconds);
    eprintln!("settling before the creates");
    let before = memory::settle(watched, &http, settle).await?;
    r.api.idle = before.sample.rss_kib[0];
    r.etcd.idle = before.sample.rss_kib[1];

    eprintln!(
        "creating {} VirtualMachines, {} in flight",
        args.count, args.concurrency
    );
    let c = client(t, Some(Duration::from_secs(60)))?;
    r.create = create(&c, &url, &t.api_version, args).await;
    if r.create.ok == 0 {
        anyhow::bail!("every create failed: {:?}", r.create.errors.first());
    }
    // Idle keep-alive connections hold buffers in the server: close them before reading.
    drop(c);
    eprintln!("settling after the creates");
    let after = memory::settle(watched, &http, settle).await?;
    r.stored = memory::PerObject::between(&before.sample, &after.sample, r.create.ok);
    r.settled = before.stable && after.stable;
    let c = client(t, Some(Duration::from_secs(120)))?;

    eprintln!("listing {} times", args.lists);
    for i in 0..args.lists {
        let start = Instant::now();
        let resp = c.get(&url).send().await?;
        anyhow::ensure!(resp.status() == 200, "LIST: {}", resp.status());
        let body = resp.bytes().await?;
        r.list.push(start.elapsed());
        r.list_bytes = body.len() as u64;
        if i == 0 {
            let v: Value = serde_json::from_slice(&body).context("decoding the LIST")?;
            r.list_items = v["items"].as_array().map_or(0, Vec::len);
            if r.list_items != r.create.ok {
                r.notes.push(format!(
                    "LIST returned {} items after {} successful creates",
                    r.list_items, r.create.ok
                ));
            }
        }
    }
    for _ in 0..args.lists {
        let (pages, items) = paged_list(&c, &url, args.page_size).await?;
        r.paged.push(pages.iter().sum());
        r.pages_per_list = pages.len();
        r.pages.extend(pages);
        r.paged_items.push(items);
        if items != r.list_items {
            r.notes.push(format!(
                "paged LIST returned {items} items, the full LIST {}",
                r.list_items
            ));
        }
    }

    if args.watchers > 0 && args.updates > 0 {
        eprintln!(
            "{} watchers, {} updates, {} in flight",
            args.watchers, args.updates, args.concurrency
        );
        let (update, watch, cpu) = watch_fanout(t, &c, &url, args, t0, r.create.ok).await?;
        r.update = update;
        r.watch = watch;
        r.cpu_watch = cpu;
    }

    r.cpu_total = Cpu::now(pids, t0).since(cpu_start);
    r.api.peak = status_kib(pids.apiserver, "VmHWM").unwrap_or(0);
    r.etcd.peak = status_kib(pids.etcd, "VmHWM").unwrap_or(0);
    // Let the server drop the closed watches' buffers before calling it "after".
    tokio::time::sleep(Duration::from_secs(2)).await;
    r.api.after = status_kib(pids.apiserver, "VmRSS").unwrap_or(0);
    r.etcd.after = status_kib(pids.etcd, "VmRSS").unwrap_or(0);
    Ok(r)
}

/// Short description of a failed response, for the error list.
async fn failure(what: &str, resp: Result<reqwest::Response, reqwest::Error>) -> String {
    match resp {
        Ok(resp) => {
            let status = resp.status();
            let body = resp.text().await.unwrap_or_default();
            format!(
                "{what}: {status}: {}",
                body.chars().take(200).collect::<String>()
            )
        }
        Err(e) => format!("{what}: {e}"),
    }
}

pub(super) async fn create(
    c: &reqwest::Client,
    url: &str,
    api_version: &str,
    args: &ApiserverArgs,
) -> Phase {
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..args.concurrency {
        let (c, url, next, count) = (c.clone(), url.to_string(), next.clone(), args.count);
        let api_version = api_version.to_string();
        tasks.push(tokio::spawn(async move {
            let mut p = Phase::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    return p;
                }
                let name = vm_name(i);
                let t = Instant::now();
                let resp = c.post(&url).json(&vm(&api_version, &name)).send().await;
                match resp {
                    Ok(ok) if ok.status() == 201 => {
                        // Read the body: the request is only done when the client has it.
                        let _ = ok.bytes().await;
                        p.latencies.push(t.elapsed());
                        p.ok += 1;
                    }
                    other => p
                        .errors
                        .push(failure(&format!("create {name}"), other).await),
                }
            }
        }));
    }
    let mut phase = Phase::default();
    for t in tasks {
        match t.await {
            Ok(p) => {
                phase.ok += p.ok;
                phase.latencies.extend(p.latencies);
                phase.errors.extend(p.errors);
            }
            Err(e) => phase.errors.push(format!("create task: {e}")),
        }
    }
    phase.elapsed = start.elapsed();
    phase
}

/// Walks the collection with `limit`; returns each page's latency and the item count.
pub(super) async fn paged_list(
    c: &reqwest::Client,
    url: &str,
    limit: usize,
) -> anyhow::Result<(Vec<Duration>, usize)> {
    let mut pages = Vec::new();
    let mut items = 0;
    let mut token: Option<String> = None;
    loop {
        let mut req = c.get(url).query(&[("limit", limit.to_string())]);
        if let Some(t) = &token {
            req = req.query(&[("continue", t)]);
        }
        let start = Instant::now();
        let resp = req.send().await?;
        anyhow::ensure!(resp.status() == 200, "paged LIST: {}", resp.status());
        let body = resp.bytes().await?;
        pages.push(start.elapsed());
        let v: Value = serde_json::from_slice(&body).context("decoding a LIST page")?;
        items += v["items"].as_array().map_or(0, Vec::len);
        token = v["metadata"]["continue"]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(str::to_string);
        if token.is_none() {
            return Ok((pages, items));
        }
        anyhow::ensure!(pages.len() < 100_000, "paged LIST does not end");
    }
}

/// What one watcher saw: receipt time (ns since t0) per update sequence number.
#[derive(Debug, Default)]
struct Seen {
    recv_ns: Vec<Option<u64>>,
    sent_ns: Vec<u64>,
    duplicates: usize,
    unexpected: usize,
    out_of_order: usize,
    /// Streams the server ended early that this watcher opened again.
    rewatches: usize,
    failure: Option<String>,
}

pub(super) async fn watch_fanout(
    t: &Target,
    c: &reqwest::Client,
    url: &str,
    args: &ApiserverArgs,
    t0: Instant,
    vms: usize,
) -> anyhow::Result<(Phase, Watch, Cpu)> {
    let pids = t.pids;
    let resp = c.get(url).query(&[("limit", "1")]).send().await?;
    anyhow::ensure!(
        resp.status() == 200,
        "LIST for the resourceVersion: {}",
        resp.status()
    );
    let v: Value = resp.json().await?;
    let rv = v["metadata"]["resourceVersion"]
        .as_str()
        .context("LIST without a resourceVersion")?
        .to_string();

    // Watch connections never time out client-side; their own idle timer bounds them.
    let wc = client(t, None)?;
    let (conn_tx, mut conn_rx) = tokio::sync::mpsc::channel::<()>(args.watchers);
    let updates = args.updates;
    let mut watchers = Vec::new();
    let spec = Arc::new(WatchSpec {
        client: wc,
        url: url.to_string(),
        timeout_seconds: args.max_seconds.to_string(),
        selector: args.watch_selector.clone(),
    });
    for _ in 0..args.watchers {
        let conn_tx = conn_tx.clone();
        watchers.push(tokio::spawn(watcher(
            spec.clone(),
            rv.clone(),
            conn_tx,
            updates,
            t0,
        )));
    }
    drop(conn_tx);
    let mut connected = 0;
    let connect_deadline = Instant::now() + Duration::from_secs(60);
    while connected < args.watchers {
        match tokio::time::timeout_at(connect_deadline.into(), conn_rx.recv()).await {
            Ok(Some(())) => connected += 1,
            _ => break,
        }
    }
    // Headers can precede the server's etcd watch; events are not lost (the watch
    // starts at rv) but the first ones would look slow.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let cpu_start = Cpu::now(pids, t0);
    let mut tasks = Vec::new();
    let rate = args.update_rate;
    for _ in 0..args.concurrency {
        let (c, url, next) = (c.clone(), url.to_string(), next.clone());
        tasks.push(tokio::spawn(async move {
            // (seq, response time ns since t0) of successful updates.
            let mut done: Vec<(usize, u64)> = Vec::new();
            let mut p = Phase::default();
            loop {
                let seq = next.fetch_add(1, Ordering::Relaxed);
                if seq >= updates {
                    return (p, done);
                }
                if rate > 0 {
                    let at = start + Duration::from_secs_f64(seq as f64 / f64::from(rate));
                    tokio::time::sleep_until(at.into()).await;
                }
                let name = vm_name(seq % vms.max(1));
                let sent = t0.elapsed();
                let patch = json!({"metadata": {"annotations": {
                    SEQ: seq.to_string(),
                    SENT: (sent.as_nanos() as u64).to_string(),
                }}});
                let resp = c
                    .patch(format!("{url}/{name}"))
                    .header("content-type", "application/merge-patch+json")
                    .body(patch.to_string())
                    .send()
                    .await;
                match resp {
                    Ok(ok) if ok.status() == 200 => {
                        let _ = ok.bytes().await;
                        let now = t0.elapsed();
                        p.latencies.push(now.saturating_sub(sent));
                        p.ok += 1;
                        done.push((seq, now.as_nanos() as u64));
                    }
                    other => p
                        .errors
                        .push(failure(&format!("update {name}"), other).await),
                }
            }
        }));
    }
    let mut update = Phase::default();
    let mut response_ns: Vec<Option<u64>> = vec![None; updates];
    for t in tasks {
        match t.await {
            Ok((p, done)) => {
                update.ok += p.ok;
                update.latencies.extend(p.latencies);
                update.errors.extend(p.errors);
                for (seq, ns) in done {
                    response_ns[seq] = Some(ns);
                }
            }
            Err(e) => update.errors.push(format!("update task: {e}")),
        }
    }
    update.elapsed = start.elapsed();

    let mut seen_all = Vec::new();
    for t in watchers {
        seen_all.push(t.await);
    }
    let cpu = Cpu::now(pids, t0).since(cpu_start);
    let mut w = Watch {
        watchers: args.watchers,
        connected,
        expected: update.ok,
        ..Default::default()
    };
    for t in seen_all {
        let seen = match t {
            Ok(s) => s,
            Err(e) => {
                w.failures.push(format!("watch task: {e}"));
                continue;
            }
        };
        let mut got = 0;
        for (seq, recv) in seen.recv_ns.iter().enumerate() {
            let Some(recv) = *recv else { continue };
            let Some(resp) = response_ns[seq] else {
                // An event for an update whose response failed: it did happen.
                w.unexpected += 1;
                continue;
            };
            got += 1;
            w.from_sent
                .push(Duration::from_nanos(recv.saturating_sub(seen.sent_ns[seq])));
            w.from_response_ns.push(recv as i64 - resp as i64);
        }
        w.received.push(got);
        w.duplicates += seen.duplicates;
        w.unexpected += seen.unexpected;
        w.out_of_order += seen.out_of_order;
        w.rewatches += seen.rewatches;
        if let Some(f) = seen.failure {
            w.failures.push(f);
        }
    }
    Ok((update, w, cpu))
}

/// Where every watcher connects, and what each (re)connection asks for.
struct WatchSpec {
    client: reqwest::Client,
    url: String,
    timeout_seconds: String,
    selector: Option<String>,
}

impl WatchSpec {
    fn request(&self, rv: &str) -> reqwest::RequestBuilder {
        let r = self.client.get(&self.url).query(&[
            ("watch", "1"),
            ("resourceVersion", rv),
            ("timeoutSeconds", &self.timeout_seconds),
        ]);
        match &self.selector {
            Some(s) => r.query(&[("labelSelector", s)]),
            None => r,
        }
    }
}

/// How often one watcher opens its stream again after the server ended it.
const MAX_REWATCHES: usize = 10;

/// One watcher: records when each update's event arrived, until it has all of them or its
/// stream goes quiet for [`WATCH_IDLE`]. A stream the server ends early is opened again
/// from the last resourceVersion seen, as an informer does (kube-apiserver ends a watch
/// that does not keep up; so does virt-apiserver, later); the events in between then
/// arrive late, and count so.
async fn watcher(
    spec: Arc<WatchSpec>,
    rv: String,
    connected: tokio::sync::mpsc::Sender<()>,
    updates: usize,
    t0: Instant,
) -> Seen {
    let mut seen = Seen {
        recv_ns: vec![None; updates],
        sent_ns: vec![0; updates],
        ..Default::default()
    };
    let mut connected = Some(connected);
    let mut stream = Stream {
        last_rv: rv.parse().unwrap_or(0),
        got: 0,
    };
    let mut from = rv;
    loop {
        let resp = match spec.request(&from).send().await {
            Ok(r) if r.status() == 200 => r,
            other => {
                seen.failure = Some(failure("watch", other).await);
                return seen;
            }
        };
        if let Some(c) = connected.take() {
            let _ = c.send(()).await;
        }
        match stream.read(resp, &mut seen, updates, t0).await {
            None => return seen,
            Some(End::Closed(_)) if seen.rewatches < MAX_REWATCHES => {
                seen.rewatches += 1;
                from = stream.last_rv.to_string();
            }
            Some(End::Closed(why) | End::Idle(why)) => {
                seen.failure = Some(why);
                return seen;
            }
        }
    }
}

/// Why a stream stopped before every event arrived.
enum End {
    /// The server ended it (or the connection failed): worth opening again.
    Closed(String),
    /// Nothing arrived for [`WATCH_IDLE`]: the events are not coming.
    Idle(String),
}

/// A watcher's progress across its streams.
struct Stream {
    last_rv: i64,
    got: usize,
}

impl Stream {
    /// Reads `resp` until every event arrived (`None`) or it stops.
    async fn read(
        &mut self,
        mut resp: reqwest::Response,
        seen: &mut Seen,
        updates: usize,
        t0: Instant,
    ) -> Option<End> {
        let mut buf: Vec<u8> = Vec::new();
        while self.got < updates {
            let got = self.got;
            let chunk = match tokio::time::timeout(WATCH_IDLE, resp.chunk()).await {
                Ok(Ok(Some(c))) => c,
                Ok(Ok(None)) => {
                    return Some(End::Closed(format!(
                        "watch ended after {got} of {updates} events"
                    )));
                }
                Ok(Err(e)) => {
                    return Some(End::Closed(format!("watch failed after {got} events: {e}")));
                }
                Err(_) => {
                    return Some(End::Idle(format!(
                        "watch idle for {WATCH_IDLE:?} after {got} of {updates} events"
                    )));
                }
            };
            // One receipt time per chunk: lines in the same chunk arrived together.
            let now = t0.elapsed().as_nanos() as u64;
            buf.extend_from_slice(&chunk);
            while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=pos).collect();
                if !line.iter().all(u8::is_ascii_whitespace) {
                    self.record(&line, now, seen, updates);
                }
            }
        }
        None
    }

    fn record(&mut self, line: &[u8], now: u64, seen: &mut Seen, updates: usize) {
        match parse_event(line) {
            Some(ev) if ev.seq < updates => {
                if ev.rv < self.last_rv {
                    seen.out_of_order += 1;
                }
                self.last_rv = ev.rv;
                if seen.recv_ns[ev.seq].is_some() {
                    seen.duplicates += 1;
                } else {
                    seen.recv_ns[ev.seq] = Some(now);
                    seen.sent_ns[ev.seq] = ev.sent_ns;
                    self.got += 1;
                }
            }
            _ => seen.unexpected += 1,
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
struct BenchEvent {
    seq: usize,
    sent_ns: u64,
    rv: i64,
}

/// The parts of a watch line the benchmark reads, borrowed from it: decoding into a
/// `Value` cost the client more CPU per event than the server spends sending it, and with
/// 1000 watchers the client, not the server, set the delivery latency.
#[derive(serde::Deserialize)]
struct Line<'a> {
    #[serde(rename = "type", borrow)]
    type_: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    object: LineObject<'a>,
}

#[derive(serde::Deserialize)]
struct LineObject<'a> {
    #[serde(borrow)]
    metadata: LineMeta<'a>,
}

#[derive(serde::Deserialize)]
struct LineMeta<'a> {
    #[serde(rename = "resourceVersion", borrow)]
    resource_version: std::borrow::Cow<'a, str>,
    #[serde(default, borrow)]
    annotations: std::collections::HashMap<std::borrow::Cow<'a, str>, std::borrow::Cow<'a, str>>,
}

/// A MODIFIED event carrying the benchmark's annotations; anything else is `None`.
fn parse_event(line: &[u8]) -> Option<BenchEvent> {
    let l: Line = serde_json::from_slice(line).ok()?;
    if l.type_ != "MODIFIED" {
        return None;
    }
    let meta = &l.object.metadata;
    Some(BenchEvent {
        seq: meta.annotations.get(SEQ)?.parse().ok()?,
        sent_ns: meta.annotations.get(SENT)?.parse().ok()?,
        rv: meta.resource_version.parse().ok()?,
    })
}

impl Results {
    fn rows(&self, args: &ApiserverArgs) -> Vec<(String, String)> {
        let mut rows = Vec::new();
        let mut row = |k: String, v: String| rows.push((k, v));
        let c = &self.create;
        row(
            format!("create {} VMs, {} in flight", args.count, args.concurrency),
            format!(
                "{:.0} objects/s ({} ok, {} failed, {:.1} s)",
                c.rate(),
                c.ok,
                c.errors.len(),
                c.elapsed.as_secs_f64()
            ),
        );
        row(
            "create latency p50 / p99 / max".into(),
            p50_p99_max(&c.latencies),
        );
        row(
            format!(
                "LIST all ({} items) ×{}, p50 / p99 / max",
                self.list_items,
                self.list.len()
            ),
            p50_p99_max(&self.list),
        );
        row("LIST response size".into(), bytes(self.list_bytes));
        row(
            format!(
                "paged LIST limit={} ({} pages) full walk, p50 / p99 / max",
                args.page_size, self.pages_per_list
            ),
            p50_p99_max(&self.paged),
        );
        row(
            "paged LIST per page, p50 / p99 / max".into(),
            p50_p99_max(&self.pages),
        );
        if self.watch.watchers > 0 {
            let u = &self.update;
            let w = &self.watch;
            row(
                format!(
                    "update (merge patch) ×{}, {} in flight, during {} watches",
                    args.updates, args.concurrency, w.watchers
                ),
                format!(
                    "{:.0} updates/s ({} ok, {} failed)",
                    u.rate(),
                    u.ok,
                    u.errors.len()
                ),
            );
            row(
                "update latency p50 / p99 / max".into(),
                p50_p99_max(&u.latencies),
            );
            row(
                "watch delivery from update sent, p50 / p99 / max".into(),
                p50_p99_max(&w.from_sent),
            );
            row(
                "watch delivery after update response, p50 / p99 / max".into(),
                p50_p99_max_ns(&w.from_response_ns),
            );
            let complete = w.received.iter().filter(|n| **n == w.expected).count();
            let total: usize = w.received.iter().sum();
            row(
                "watch events received".into(),
                format!(
                    "{total} of {} ({complete} of {} watchers got all {}; {} connected; {} re-watches after the server ended a stream; {} duplicates, {} unexpected, {} out of order)",
                    w.expected * w.watchers,
                    w.watchers,
                    w.expected,
                    w.connected,
                    w.rewatches,
                    w.duplicates,
                    w.unexpected,
                    w.out_of_order
                ),
            );
        }
        let rss = |r: &Rss| {
            format!(
                "{} idle, {} peak (VmHWM), {} after",
                bytes(r.idle * 1024),
                bytes(r.peak * 1024),
                bytes(r.after * 1024)
            )
        };
        if self.watch.watchers > 0 {
            row(
                "CPU apiserver / etcd / client, updates until last event".into(),
                self.cpu_watch.to_string(),
            );
        }
        row(
            "CPU apiserver / etcd / client, whole run".into(),
            self.cpu_total.to_string(),
        );
        row("virt-apiserver RSS".into(), rss(&self.api));
        row("etcd RSS".into(), rss(&self.etcd));
        let settled = if self.settled {
            ""
        } else {
            " (memory did not settle within 60 s)"
        };
        row(
            format!("RSS growth per stored VM: virt-apiserver{settled}"),
            bytes_f(self.stored.rss[0]),
        );
        row(
            format!("RSS growth per stored VM: etcd{settled}"),
            bytes_f(self.stored.rss[1]),
        );
        row(
            "etcd database in use per stored VM".into(),
            bytes_f(self.stored.db_in_use[0]),
        );
        rows
    }

    /// The goals: `(goal, measured, met)`.
    fn goals(&self, args: &ApiserverArgs) -> Vec<(String, String, bool)> {
        let stored_ok = self.create.errors.is_empty() && self.create.ok == args.count;
        let listed_ok = self.list_items == args.count
            && !self.paged_items.is_empty()
            && self.paged_items.iter().all(|n| *n == args.count);
        let mut g = vec![
            (
                format!(
                    "{} VMs stored and LISTed (unpaged and paged) with no error",
                    args.count
                ),
                format!(
                    "{} created, {} failed; unpaged LIST {} items; paged walks {:?} items",
                    self.create.ok,
                    self.create.errors.len(),
                    self.list_items,
                    self.paged_items
                        .iter()
                        .collect::<std::collections::BTreeSet<_>>()
                ),
                stored_ok && listed_ok,
            ),
            (
                format!(
                    "virt-apiserver ≤ {} RSS per stored VM",
                    bytes(GOAL_RSS_PER_VM as u64)
                ),
                bytes_f(self.stored.rss[0]),
                self.settled && self.stored.rss[0] <= GOAL_RSS_PER_VM,
            ),
        ];
        if self.watch.watchers > 0 {
            let mut sorted = self.watch.from_sent.clone();
            sorted.sort_unstable();
            let p99 = percentile(&sorted, 99.0);
            let w = &self.watch;
            let complete = w.missing() == 0 && w.failures.is_empty();
            g.push((
                format!(
                    "{} watchers: delivery p99 ≤ {} s, every event delivered",
                    w.watchers,
                    GOAL_WATCH_P99.as_secs()
                ),
                format!(
                    "p99 {}; {} events missing",
                    p99.map_or("n/a".into(), |d| format!("{:.1} ms", d.as_secs_f64() * 1e3)),
                    w.missing()
                ),
                complete && w.connected == w.watchers && p99.is_some_and(|d| d <= GOAL_WATCH_P99),
            ));
        }
        g
    }

    /// Everything that looks wrong, for the record.
    fn problems(&self) -> Vec<String> {
        let mut p = self.notes.clone();
        for e in self.create.errors.iter().take(5) {
            p.push(e.clone());
        }
        for e in self.update.errors.iter().take(5) {
            p.push(e.clone());
        }
        for e in self.watch.failures.iter().take(5) {
            p.push(e.clone());
        }
        if self.watch.failures.len() > 5 {
            p.push(format!(
                "… {} watch failures in all",
                self.watch.failures.len()
            ));
        }
        if !self.log_warnings.is_empty() {
            p.push(format!(
                "{} WARN/ERROR lines in the server log, e.g. `{}`",
                self.log_warnings.len(),
                self.log_warnings[0].chars().take(200).collect::<String>()
            ));
        }
        p
    }
}

fn table(rows: &[(String, String)]) -> String {
    let mut s = String::from("| measurement | result |\n|---|---|\n");
    for (k, v) in rows {
        s.push_str(&format!("| {k} | {v} |\n"));
    }
    s
}

fn body(
    etcd_version: &str,
    args: &ApiserverArgs,
    rows: &[(String, String)],
    results: &Results,
) -> String {
    let mut s = format!(
        "- One run (no repetitions yet: issue 21); etcd {etcd_version} (Debian, default \
         settings, data in a temp dir).\n"
    );
    let client = if cfg!(debug_assertions) {
        "an unoptimised build"
    } else {
        "a release build too"
    };
    s.push_str(&format!(
        "- Release virt-apiserver and etcd on 127.0.0.1, TLS with client certificates. \
         The benchmark client ({client}) runs on the same CPUs, so it competes with the \
         server.\n"
    ));
    s.push_str(&format!(
        "- Phases: memory settles; create {n} VirtualMachines with {c} requests in flight; \
         memory settles; LIST all {l} times and walk them {l} times with limit={p}; start {w} \
         watches{sel} at the current resourceVersion, then make {u} merge-patch updates ({c} in \
         flight, {rate}), each writing its send time in an annotation, and time each event's \
         arrival at each watcher.\n",
        n = args.count,
        c = args.concurrency,
        l = args.lists,
        p = args.page_size,
        w = args.watchers,
        u = args.updates,
        sel = args
            .watch_selector
            .as_ref()
            .map_or(String::new(), |s| format!(" with labelSelector={s}")),
        rate = if args.update_rate > 0 {
            format!("at most {} per second", args.update_rate)
        } else {
            "unpaced".to_string()
        },
    ));
    s.push_str(&format!(
        "- Memory per stored VM: virt-apiserver's and etcd's VmRSS and etcd's \
         `etcd_mvcc_db_total_size_in_use_in_bytes`, read before and after the creates with \
         nothing else running: {} s of rest, then a sample a second until five in a row agree \
         within 0.5 % or 512 KiB (at most 60 s), their median counting; the growth divided by \
         the VMs created.\n",
        args.settle_seconds
    ));
    s.push_str(
        "- Latencies are to the full response body; percentiles are nearest-rank. \
         \"Watch delivery from update sent\" includes the update's own write; \"after update \
         response\" is negative when the event beat the response; a watch stream the server \
         ends early is opened again from the last resourceVersion seen (at most 10 times), \
         and its missed events count when they arrive. RSS from \
         /proc/<pid>/status (VmRSS, VmHWM); CPU is utime+stime from /proc/<pid>/stat, \
         \"client\" being this benchmark process.\n\n",
    );
    s.push_str(&table(rows));
    s.push_str("\n| goal | measured | met |\n|---|---|---|\n");
    for (goal, measured, met) in results.goals(args) {
        let met = if met { "met" } else { "**not met**" };
        s.push_str(&format!("| {goal} | {measured} | {met} |\n"));
    }
    let problems = results.problems();
    if !problems.is_empty() {
        s.push_str("\nObserved during this run:\n\n");
        for p in problems {
            s.push_str(&format!("- {}\n", p.replace('\n', " ")));
        }
    }
    s
}

/// Bytes (possibly negative or fractional) as B or KiB.
fn bytes_f(b: f64) -> String {
    if b.abs() < 1024.0 {
        format!("{b:.0} B")
    } else {
        format!("{:.2} KiB", b / 1024.0)
    }
}

fn tail(log: &str, n: usize) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

pub(super) fn etcd_version(bin: &Path) -> String {
    std::process::Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout).lines().find_map(|l| {
                l.strip_prefix("etcd Version:")
                    .map(|v| v.trim().to_string())
            })
        })
        .unwrap_or_else(|| "unknown".into())
}

/// A KiB field of /proc/<pid>/status.
pub(super) fn status_kib(pid: u32, key: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    report::proc_kib(&s, key)
}

/// utime + stime of all threads from /proc/<pid>/stat, in clock ticks. The command name
/// before them is in parentheses and may itself contain spaces and parentheses, hence the
/// last ')'.
fn cpu_ticks(stat: &str) -> Option<u64> {
    let close = stat.rfind(')')?;
    // Fields after the name start at field 3 (state); utime and stime are 14 and 15.
    let rest: Vec<&str> = stat.get(close + 1..)?.split_whitespace().collect();
    let utime: u64 = rest.get(11)?.parse().ok()?;
    let stime: u64 = rest.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// CPU time used so far by a process. The kernel reports it in USER_HZ ticks, which
/// is 100 on every Linux ABI this runs on.
fn cpu_time(pid: u32) -> Duration {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| cpu_ticks(&s).map(|t| Duration::from_millis(t * 10)))
        .unwrap_or_default()
}

/// CPU time of the server, etcd and this benchmark client.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Cpu {
    api: Duration,
    etcd: Duration,
    client: Duration,
    wall: Duration,
}

impl Cpu {
    fn now(pids: Pids, t0: Instant) -> Self {
        Self {
            api: cpu_time(pids.apiserver),
            etcd: cpu_time(pids.etcd),
            client: cpu_time(std::process::id()),
            wall: t0.elapsed(),
        }
    }

    fn since(self, before: Self) -> Self {
        Self {
            api: self.api.saturating_sub(before.api),
            etcd: self.etcd.saturating_sub(before.etcd),
            client: self.client.saturating_sub(before.client),
            wall: self.wall.saturating_sub(before.wall),
        }
    }
}

impl std::fmt::Display for Cpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.1} s / {:.1} s / {:.1} s in {:.1} s wall",
            self.api.as_secs_f64(),
            self.etcd.as_secs_f64(),
            self.client.as_secs_f64(),
            self.wall.as_secs_f64()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_parsing_handles_odd_names() {
        assert_eq!(
            cpu_ticks("1234 (etcd) S 99 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20"),
            Some(300)
        );
        assert_eq!(
            cpu_ticks("7 (a (b) c) R 1 7 7 0 -1 0 0 0 0 0 1 2 3"),
            Some(3)
        );
        assert_eq!(cpu_ticks("7 (short) R 1 7"), None);
        assert_eq!(cpu_ticks("garbage"), None);
    }

    #[test]
    fn events_are_recognised() {
        let ev = json!({"type": "MODIFIED", "object": {"metadata": {
            "resourceVersion": "42",
            "annotations": {SEQ: "3", SENT: "1000"}}}});
        assert_eq!(
            parse_event(ev.to_string().as_bytes()),
            Some(BenchEvent {
                seq: 3,
                sent_ns: 1000,
                rv: 42
            })
        );
        let added = json!({"type": "ADDED", "object": {"metadata": {
            "resourceVersion": "42", "annotations": {SEQ: "3", SENT: "1000"}}}});
        assert_eq!(parse_event(added.to_string().as_bytes()), None);
        let plain = json!({"type": "MODIFIED", "object": {"metadata": {"resourceVersion": "1"}}});
        assert_eq!(parse_event(plain.to_string().as_bytes()), None);
        assert_eq!(parse_event(b"{not json"), None);
    }

    #[test]
    fn table_and_section_shape() {
        let rows = vec![("a".to_string(), "1".to_string())];
        assert_eq!(
            table(&rows),
            "| measurement | result |\n|---|---|\n| a | 1 |\n"
        );
        let args = ApiserverArgs {
            count: 1,
            concurrency: 1,
            lists: 1,
            page_size: 1,
            watchers: 0,
            updates: 0,
            watch_selector: None,
            update_rate: 0,
            settle_seconds: 0,
            max_seconds: 1,
            no_docs: true,
            this_build: true,
        };
        let s = body("3.4", &args, &rows, &Results::default());
        // The body must not carry a heading of its own: the section supplies it.
        assert!(
            !s.lines()
                .any(|l| l.starts_with("# ") || l.starts_with("## "))
        );
        assert_eq!(
            args.command(),
            "cargo xtask bench apiserver --count 1 --concurrency 1 --lists 1 --page-size 1 \
             --watchers 0 --updates 0 --update-rate 0 --settle-seconds 0 --this-build"
        );
    }
}
