//! `cargo xtask bench abuse`: how a normal client fares while another client abuses the
//! release virt-apiserver (issue 20): a JSON Patch copy bomb, 10,000 connections that
//! send nothing, 5,000 watches of one user, 64 MiB bodies, deeply nested JSON. The answers
//! themselves (413, 429, 400 naming the limit; connections closed) are asserted by
//! `apiserver/server/tests/abuse.rs`; this measures the normal client's latency meanwhile,
//! goal p99 < 1 s, on a connection it keeps and on a new connection per request.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::{Value, json};
use virt_devenv::{DevEnv, Options};

use super::apiserver::{rerun_release, vm};
use super::report::{p50_p99_max, percentile};
use super::section::{self, Provenance, Section};

const VMS: &str = "/apis/kubevirt.io/v1/namespaces/default/virtualmachines";
/// Goal: the normal client's p99 during each abuse.
const GOAL_P99: Duration = Duration::from_secs(1);

/// Arguments of `cargo xtask bench abuse`.
#[derive(clap::Args, Debug, Clone)]
pub struct AbuseArgs {
    /// Seconds each abuse lasts (the silent connections need more than the server's 10 s
    /// TLS handshake timeout to be closed).
    #[arg(long, default_value_t = 15)]
    pub seconds: u64,
    /// Connections that send nothing.
    #[arg(long, default_value_t = 10_000)]
    pub connections: usize,
    /// Watches the abusing user opens (the server's per-user default limit is 5000).
    #[arg(long, default_value_t = 5000)]
    pub watches: usize,
    /// Only print the figures; leave docs/benchmarks.md alone.
    #[arg(long)]
    pub no_docs: bool,
    /// Run the client from this (possibly unoptimised) build instead of a release build.
    #[arg(long)]
    pub this_build: bool,
}

impl AbuseArgs {
    fn command(&self) -> String {
        format!(
            "cargo xtask bench abuse --seconds {} --connections {} --watches {}{}",
            self.seconds,
            self.connections,
            self.watches,
            if self.this_build { " --this-build" } else { "" }
        )
    }
}

/// The abuses, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    None,
    CopyBomb,
    SilentConnections,
    Watches,
    HugeBody,
    DeepJson,
}

impl Case {
    const ALL: [Case; 6] = [
        Case::None,
        Case::CopyBomb,
        Case::SilentConnections,
        Case::Watches,
        Case::HugeBody,
        Case::DeepJson,
    ];

    fn describe(self, args: &AbuseArgs) -> String {
        match self {
            Case::None => "none (baseline)".into(),
            Case::CopyBomb => {
                "JSON Patch copy bomb (40 copies of /spec into itself), 4 in a loop".into()
            }
            Case::SilentConnections => {
                format!("{} TCP connections that send nothing", args.connections)
            }
            Case::Watches => format!(
                "{} watches of one user, then more in a loop; every write of the normal client goes to all of them",
                args.watches
            ),
            Case::HugeBody => "64 MiB request bodies, 2 in a loop".into(),
            Case::DeepJson => "JSON nested 100,000 deep, 4 in a loop".into(),
        }
    }
}

/// What one case measured.
#[derive(Debug, Default)]
struct Outcome {
    /// The normal client on a connection it keeps.
    kept: Vec<Duration>,
    /// The normal client on a new connection per request.
    fresh: Vec<Duration>,
    normal_failures: Vec<String>,
    /// Answers to the abuser, `(what, count)`.
    answers: std::collections::BTreeMap<String, usize>,
}

impl Outcome {
    fn p99(&self) -> Option<Duration> {
        let mut all: Vec<Duration> = self.kept.iter().chain(&self.fresh).copied().collect();
        all.sort_unstable();
        percentile(&all, 99.0)
    }

    fn met(&self) -> bool {
        self.normal_failures.is_empty()
            && !self.kept.is_empty()
            && !self.fresh.is_empty()
            && self.p99().is_some_and(|p| p < GOAL_P99)
    }
}

/// Runs the benchmark.
pub fn run(args: AbuseArgs) -> anyhow::Result<()> {
    if cfg!(debug_assertions) && !args.this_build {
        return rerun_release();
    }
    let bin = crate::dev_apiserver::build_apiserver(true)?;
    let provenance = Provenance::probe(args.command());
    eprintln!("starting etcd and the release virt-apiserver");
    let mut env = DevEnv::start(Options {
        apiserver_bin: bin,
        ..Default::default()
    })
    .context("starting etcd and virt-apiserver")?;
    let rt = super::apiserver::runtime()?;
    let outcomes = rt.block_on(async {
        let mut out = Vec::new();
        for case in Case::ALL {
            eprintln!("abuse: {}", case.describe(&args));
            out.push((case, one(&env, &args, case).await?));
            // Let what the case left behind (closing connections, ending watches) go.
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
        anyhow::Ok(out)
    });
    let alive = env.alive();
    env.stop();
    drop(rt);
    let outcomes = outcomes?;
    let body = body(&args, &outcomes, alive);
    println!("\n{body}");
    super::record(
        &Section::new(section::ABUSE, provenance, body),
        args.no_docs,
    )?;
    anyhow::ensure!(alive, "virt-apiserver or etcd exited during the run");
    Ok(())
}

/// A client with `id`'s certificate; `fresh` opens a new connection for every request.
fn client(
    env: &DevEnv,
    id: &virt_devenv::ClientFiles,
    fresh: bool,
) -> anyhow::Result<reqwest::Client> {
    let ca = std::fs::read(&env.server_ca)?;
    let mut pem = std::fs::read(&id.cert)?;
    pem.extend(std::fs::read(&id.key)?);
    let mut b = reqwest::Client::builder()
        .use_rustls_tls()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca)?)
        .identity(reqwest::Identity::from_pem(&pem)?)
        .tcp_nodelay(true)
        .timeout(Duration::from_secs(60));
    if fresh {
        b = b.pool_max_idle_per_host(0);
    }
    Ok(b.build()?)
}

/// One case: the normal clients run for `args.seconds` while the abuser does its thing.
async fn one(env: &DevEnv, args: &AbuseArgs, case: Case) -> anyhow::Result<Outcome> {
    let url = format!("{}{VMS}", env.server_url);
    let admin = client(env, &env.admin, false)?;
    let name = format!("normal-{}", format!("{case:?}").to_lowercase());
    let r = admin
        .post(&url)
        .json(&vm("kubevirt.io/v1", &name))
        .send()
        .await?;
    anyhow::ensure!(r.status() == 201, "creating {name}: {}", r.status());
    let target = format!("abused-{}", format!("{case:?}").to_lowercase());
    let r = admin
        .post(&url)
        .json(&vm("kubevirt.io/v1", &target))
        .send()
        .await?;
    anyhow::ensure!(r.status() == 201, "creating {target}: {}", r.status());

    let stop = Arc::new(AtomicBool::new(false));
    // The abuser's setup first (watches, connections), so the normal client measures the
    // server while it holds them.
    let held = prepare(env, args, case).await?;
    let abuser = tokio::spawn(abuse(
        env_urls(env),
        client(env, &env.admin, false)?,
        case,
        stop.clone(),
        target,
    ));
    let kept = tokio::spawn(normal(
        client(env, &env.front_proxy, false)?,
        url.clone(),
        name.clone(),
        stop.clone(),
    ));
    let fresh = tokio::spawn(normal(
        client(env, &env.front_proxy, true)?,
        url.clone(),
        name,
        stop.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(args.seconds)).await;
    stop.store(true, Ordering::Relaxed);
    let mut o = Outcome::default();
    let (kept_lat, kept_fail) = kept.await?;
    let (fresh_lat, fresh_fail) = fresh.await?;
    o.kept = kept_lat;
    o.fresh = fresh_lat;
    o.normal_failures = kept_fail.into_iter().chain(fresh_fail).collect();
    o.answers = abuser.await?;
    o.answers.extend(finish(held).await);
    Ok(o)
}

/// The server's base URL (what the abuser needs besides its client).
fn env_urls(env: &DevEnv) -> String {
    env.server_url.clone()
}

/// What the abuser holds open across the case.
enum Held {
    Nothing,
    Connections(Vec<tokio::net::TcpStream>, usize),
    Watches(Vec<tokio::task::JoinHandle<()>>, usize),
}

async fn prepare(env: &DevEnv, args: &AbuseArgs, case: Case) -> anyhow::Result<Held> {
    match case {
        Case::SilentConnections => {
            let port: u16 = env
                .server_url
                .rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .context("the server URL has no port")?;
            // At most 100 connecting at once: a burst beyond the listen backlog would leave
            // connections the kernel completed for the client but dropped for the server.
            let connecting = Arc::new(tokio::sync::Semaphore::new(100));
            let mut opening = tokio::task::JoinSet::new();
            for _ in 0..args.connections {
                let connecting = connecting.clone();
                opening.spawn(async move {
                    let _turn = connecting.acquire_owned().await;
                    tokio::time::timeout(
                        Duration::from_secs(5),
                        tokio::net::TcpStream::connect(("127.0.0.1", port)),
                    )
                    .await
                });
            }
            let mut conns = Vec::new();
            let mut failed = 0;
            while let Some(r) = opening.join_next().await {
                match r {
                    Ok(Ok(Ok(c))) => conns.push(c),
                    _ => failed += 1,
                }
            }
            Ok(Held::Connections(conns, failed))
        }
        Case::Watches => {
            let c = client(env, &env.admin, false)?;
            let url = format!("{}{VMS}?watch=true", env.server_url);
            let mut tasks = Vec::new();
            let mut refused = 0;
            let mut opening = tokio::task::JoinSet::new();
            for _ in 0..args.watches {
                let (c, url) = (c.clone(), url.clone());
                opening.spawn(async move {
                    c.get(&url).timeout(Duration::from_secs(3600)).send().await
                });
            }
            while let Some(r) = opening.join_next().await {
                match r {
                    Ok(Ok(mut resp)) if resp.status() == 200 => {
                        // Read every event, as a client that keeps up does.
                        tasks.push(tokio::spawn(async move {
                            while let Ok(Some(_)) = resp.chunk().await {}
                        }));
                    }
                    _ => refused += 1,
                }
            }
            Ok(Held::Watches(tasks, refused))
        }
        _ => Ok(Held::Nothing),
    }
}

/// Ends what [`prepare`] opened; what became of it.
async fn finish(held: Held) -> Vec<(String, usize)> {
    match held {
        Held::Nothing => Vec::new(),
        Held::Connections(conns, failed) => {
            use tokio::io::AsyncReadExt;
            let n = conns.len();
            let mut closed = 0;
            let mut reading = tokio::task::JoinSet::new();
            for mut c in conns {
                reading.spawn(async move {
                    let mut buf = [0u8; 64];
                    // Closed by the server already, or within a second: counted as closed.
                    matches!(
                        tokio::time::timeout(Duration::from_secs(1), c.read(&mut buf)).await,
                        Ok(Ok(0)) | Ok(Err(_))
                    )
                });
            }
            while let Some(r) = reading.join_next().await {
                if matches!(r, Ok(true)) {
                    closed += 1;
                }
            }
            vec![
                ("silent connections opened".into(), n),
                ("silent connections not opened within 5 s".into(), failed),
                (
                    "silent connections closed by the server by the end".into(),
                    closed,
                ),
            ]
        }
        Held::Watches(tasks, refused) => {
            let n = tasks.len();
            for t in tasks {
                t.abort();
            }
            vec![
                ("watches held".into(), n),
                ("watches refused while opening".into(), refused),
            ]
        }
    }
}

/// Builds one abusive request.
type MakeRequest = Box<dyn Fn() -> reqwest::RequestBuilder + Send + Sync>;

/// The abuser's loop for `case` until `stop`; its answers by status.
async fn abuse(
    base: String,
    c: reqwest::Client,
    case: Case,
    stop: Arc<AtomicBool>,
    target: String,
) -> std::collections::BTreeMap<String, usize> {
    let url = format!("{base}{VMS}");
    let (parallel, request): (usize, MakeRequest) = match case {
        Case::None | Case::SilentConnections => {
            let (c, u) = (c.clone(), url.clone());
            (0, Box::new(move || c.get(&u)))
        }
        Case::CopyBomb => {
            let bomb: Vec<Value> = (0..40)
                .map(|i| json!({"op": "copy", "from": "/spec", "path": format!("/spec/c{i}")}))
                .collect();
            let body = serde_json::to_vec(&bomb).unwrap_or_default();
            let (c, u) = (c.clone(), format!("{url}/{target}"));
            (
                4,
                Box::new(move || {
                    c.patch(&u)
                        .header("Content-Type", "application/json-patch+json")
                        .body(body.clone())
                }),
            )
        }
        Case::Watches => {
            let (c, u) = (c.clone(), format!("{url}?watch=true"));
            (1, Box::new(move || c.get(&u)))
        }
        Case::HugeBody => {
            let mut big = vm("kubevirt.io/v1", "huge");
            big["metadata"]["annotations"] = json!({"pad": "x".repeat(64 << 20)});
            let body = serde_json::to_vec(&big).unwrap_or_default();
            let (c, u) = (c.clone(), url.clone());
            (
                2,
                Box::new(move || {
                    c.post(&u)
                        .header("Content-Type", "application/json")
                        .body(body.clone())
                }),
            )
        }
        Case::DeepJson => {
            let deep = format!(
                r#"{{"metadata":{{"labels":{}1{}}}}}"#,
                "[".repeat(100_000),
                "]".repeat(100_000)
            );
            let (c, u) = (c.clone(), url.clone());
            (
                4,
                Box::new(move || {
                    c.post(&u)
                        .header("Content-Type", "application/json")
                        .body(deep.clone())
                }),
            )
        }
    };
    let request = Arc::new(request);
    let mut tasks = Vec::new();
    for _ in 0..parallel {
        let (request, stop) = (request.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut answers = std::collections::BTreeMap::<String, usize>::new();
            while !stop.load(Ordering::Relaxed) {
                let key = match request().send().await {
                    Ok(r) => {
                        let code = r.status().as_u16();
                        let reason = r
                            .json::<Value>()
                            .await
                            .ok()
                            .and_then(|s| s["reason"].as_str().map(str::to_string))
                            .unwrap_or_default();
                        format!("{code} {reason}")
                    }
                    Err(e) if e.is_timeout() => "timeout".into(),
                    Err(_) => "connection error".into(),
                };
                *answers
                    .entry(format!("abusive requests answered {key}"))
                    .or_default() += 1;
            }
            answers
        }));
    }
    let mut all = std::collections::BTreeMap::new();
    for t in tasks {
        if let Ok(a) = t.await {
            for (k, n) in a {
                *all.entry(k).or_default() += n;
            }
        }
    }
    all
}

/// The normal client (another user, through the front proxy as the aggregator sends it):
/// LIST a page, GET its VM, merge-patch its VM, 10 times a second, until `stop`.
async fn normal(
    c: reqwest::Client,
    url: String,
    name: String,
    stop: Arc<AtomicBool>,
) -> (Vec<Duration>, Vec<String>) {
    let as_user = |r: reqwest::RequestBuilder| {
        r.header("X-Remote-User", "normal-client")
            .header("X-Remote-Group", "system:masters")
    };
    let mut latencies = Vec::new();
    let mut failures = Vec::new();
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let next = Instant::now() + Duration::from_millis(100);
        let req = match i % 3 {
            0 => as_user(c.get(&url)).query(&[("limit", "10")]),
            1 => as_user(c.get(format!("{url}/{name}"))),
            _ => as_user(c.patch(format!("{url}/{name}")))
                .header("Content-Type", "application/merge-patch+json")
                .body(json!({"metadata": {"labels": {"i": i.to_string()}}}).to_string()),
        };
        let t = Instant::now();
        match req.send().await {
            Ok(r) if r.status() == 200 => {
                let _ = r.bytes().await;
                latencies.push(t.elapsed());
            }
            Ok(r) => failures.push(r.status().to_string()),
            Err(e) => failures.push(e.to_string()),
        }
        tokio::time::sleep_until(next.into()).await;
    }
    (latencies, failures)
}

fn ms(d: Option<Duration>) -> String {
    d.map_or("n/a".into(), |d| format!("{:.1} ms", d.as_secs_f64() * 1e3))
}

fn body(args: &AbuseArgs, outcomes: &[(Case, Outcome)], alive: bool) -> String {
    let mut s = format!(
        "- Release virt-apiserver with its default limits on etcd (`virt-devenv`, 127.0.0.1); \
         client (a release build) on the same CPUs. Each case lasts {} s after its setup \
         (connections or watches opened); cases run one after the other on one server.\n\
         - The normal client is another user (front-proxy certificate with X-Remote-User, as \
         the aggregator sends): a LIST of 10, a GET and a merge patch of its own VM, 10 \
         requests a second, once on a connection it keeps and once on a new connection per \
         request (TLS handshake included), both at the same time. Latency to the full body; \
         nearest-rank percentiles; p99 over both. Goal: every request succeeds, p99 < 1 s.\n\n\
         | abuse | abuser's answers | normal client, kept connection: p50 / p99 / max | new connection per request: p50 / p99 / max | normal requests failed | p99 | goal |\n\
         |---|---|---|---|---|---|---|\n",
        args.seconds
    );
    for (case, o) in outcomes {
        let answers = if o.answers.is_empty() {
            "—".to_string()
        } else {
            o.answers
                .iter()
                .map(|(k, n)| format!("{k}: {n}"))
                .collect::<Vec<_>>()
                .join("; ")
        };
        s.push_str(&format!(
            "| {} | {} | {} ({}) | {} ({}) | {} | {} | {} |\n",
            case.describe(args),
            answers,
            p50_p99_max(&o.kept),
            o.kept.len(),
            p50_p99_max(&o.fresh),
            o.fresh.len(),
            o.normal_failures.len(),
            ms(o.p99()),
            if o.met() { "met" } else { "**not met**" }
        ));
    }
    s.push_str(&format!(
        "\nvirt-apiserver alive after the run: {}.\n",
        if alive { "yes" } else { "NO" }
    ));
    let failures: Vec<&String> = outcomes
        .iter()
        .flat_map(|(_, o)| o.normal_failures.iter())
        .take(5)
        .collect();
    if !failures.is_empty() {
        s.push_str("\nNormal requests that failed, the first ones:\n\n");
        for f in failures {
            s.push_str(&format!("- {}\n", f.replace('\n', " ")));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn section_body_has_a_row_per_case_and_no_heading() {
        let args = AbuseArgs {
            seconds: 1,
            connections: 10,
            watches: 5,
            no_docs: true,
            this_build: true,
        };
        let ok = Outcome {
            kept: vec![Duration::from_millis(5); 10],
            fresh: vec![Duration::from_millis(9); 10],
            ..Outcome::default()
        };
        let slow = Outcome {
            kept: vec![Duration::from_millis(5); 10],
            fresh: vec![Duration::from_secs(2); 10],
            ..Outcome::default()
        };
        assert!(ok.met());
        assert!(!slow.met());
        let s = body(
            &args,
            &[(Case::None, ok), (Case::SilentConnections, slow)],
            true,
        );
        assert!(
            !s.lines()
                .any(|l| l.starts_with("# ") || l.starts_with("## "))
        );
        assert_eq!(s.lines().filter(|l| l.starts_with("| ")).count(), 3);
        assert!(s.contains("| 10 TCP connections that send nothing |"));
        assert!(s.contains("**not met**"));
        assert_eq!(
            args.command(),
            "cargo xtask bench abuse --seconds 1 --connections 10 --watches 5 --this-build"
        );
    }
}
