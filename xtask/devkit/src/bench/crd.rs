//! `cargo xtask bench apiserver --vs-crd`: the same phases, in one run, against
//! (a) the release virt-apiserver on its own etcd (DevEnv, on loopback, talked to
//! directly — not through kube-apiserver's aggregator) and (b) a CRD of the same schema
//! under a separate group, served by the local cluster's kube-apiserver on its etcd
//! (`cargo xtask cluster`), also talked to directly with the admin client certificate.
//!
//! The CRD is created by the benchmark and deleted at its end. A cluster the benchmark
//! brought up is taken down again.

use std::time::{Duration, Instant};

use anyhow::Context;
use base64::Engine;
use serde_json::{Value, json};
use virt_devenv::{DevEnv, Options};

use super::apiserver::{
    self, ApiserverArgs, Pids, Results, Target, bench, bench_devenv, client, parse_stat,
};
use super::report::{bytes, ms, percentile};
use super::section::{self, Provenance, Section};

const GROUP: &str = "bench.kubevirt-rs.io";
const CRD_NAME: &str = "virtualmachines.bench.kubevirt-rs.io";
/// The cluster's etcd client port (xtask/src/cluster).
const CLUSTER_ETCD_PORT: &str = "12379";

/// Runs both sides and records the ratios. The cluster counts as up when its
/// kube-apiserver (127.0.0.1:6443) accepts connections.
pub fn run(args: ApiserverArgs) -> anyhow::Result<()> {
    let was_up = std::net::TcpStream::connect_timeout(
        &std::net::SocketAddr::from(([127, 0, 0, 1], 6443)),
        Duration::from_secs(1),
    )
    .is_ok();
    eprintln!(
        "{} the local cluster",
        if was_up { "reusing" } else { "bringing up" }
    );
    let kubeconfig = crate::cluster::ensure_up(None).context("bringing the cluster up")?;
    let result = run_sides(&args, &kubeconfig);
    if !was_up {
        eprintln!("taking the cluster down (this run brought it up)");
        let exe = std::env::current_exe().context("finding this xtask")?;
        let status = std::process::Command::new(&exe)
            .args(["cluster", "down"])
            .status()
            .context("running cluster down")?;
        if !status.success() {
            eprintln!("warning: `cargo xtask cluster down` failed");
        }
    }
    result
}

fn run_sides(args: &ApiserverArgs, kubeconfig: &std::path::Path) -> anyhow::Result<()> {
    // Taken before the run: the figures belong to the code and machine at its start.
    let provenance = Provenance::probe(args.command());
    let rt = apiserver::runtime()?;

    // (a) ours.
    let bin = crate::dev_apiserver::build_apiserver(true)?;
    let etcd_bin = Options::default().etcd_bin;
    let etcd_version = apiserver::etcd_version(&etcd_bin);
    eprintln!("(a) starting etcd and the release virt-apiserver");
    let mut env = DevEnv::start(Options {
        apiserver_bin: bin,
        etcd_bin,
        ..Default::default()
    })
    .context("starting etcd and virt-apiserver")?;
    let ours = bench_devenv(&rt, &mut env, args);
    env.stop();
    let ours = ours?;

    // (b) the CRD on kube-apiserver.
    let kc = Kubeconfig::read(kubeconfig)?;
    let pids = Pids {
        apiserver: find_process("kube-apiserver", None)?,
        etcd: find_process("etcd", Some(CLUSTER_ETCD_PORT))?,
    };
    let target = Target {
        collection: format!(
            "{}/apis/{GROUP}/v1/namespaces/default/virtualmachines",
            kc.server
        ),
        api_version: format!("{GROUP}/v1"),
        ca: kc.ca,
        identity: kc.identity,
        pids,
    };
    let crd = rt.block_on(async {
        let c = client(&target, Some(Duration::from_secs(60)))?;
        let base = kc.server.clone();
        let _ = delete_crd(&c, &base).await;
        create_crd(&c, &base, &target.collection).await?;
        eprintln!("(b) CRD {CRD_NAME} established");
        let r =
            tokio::time::timeout(Duration::from_secs(args.max_seconds), bench(&target, args)).await;
        if let Err(e) = delete_crd(&c, &base).await {
            eprintln!("warning: deleting the CRD: {e:#}");
        }
        match r {
            Ok(r) => r,
            Err(_) => anyhow::bail!("the CRD side did not finish within {}s", args.max_seconds),
        }
    });
    drop(rt);
    let crd = crd?;

    let text = comparison(args, &ours, &crd);
    println!("\n{text}");
    let body = format!(
        "- One run of each side, (a) then (b), not alternated or repeated yet (issue 21).\n\
         - (a) ours: the release virt-apiserver with its own etcd {etcd_version} (DevEnv, \
         127.0.0.1, `--standalone`: no namespace-lifecycle admission, no SubjectAccessReview), \
         talked to directly with a client certificate — not through kube-apiserver's \
         aggregator.\n\
         - (b) CRD: `{CRD_NAME}` (kind VirtualMachine, our OpenAPI v3 schema with `metadata` as \
         a plain object, status subresource), created by the benchmark on the local cluster's \
         kube-apiserver (`cargo xtask cluster`, v1.34) with the cluster's own etcd (shared with \
         the rest of the cluster), talked to directly with the admin client certificate; \
         deleted at the end.\n\
         - The same phases for both, one after the other, with the same client: create {n} \
         VirtualMachines ({c} in flight), LIST all of them {l} times, {w} watches while {u} \
         merge-patch updates are made ({c} in flight). \"RSS added per 10k objects\" is (VmRSS \
         after − VmRSS before the whole run) × 10000 / {n}, API server plus its etcd: it \
         includes the LISTs, the watches and the updates (and Go's retained heap), so it is not \
         a per-object cost. The client and both servers share the machine's CPUs; the cluster's \
         other components keep running during (a).\n\n{text}",
        n = args.count,
        c = args.concurrency,
        l = args.lists,
        w = args.watchers,
        u = args.updates,
    );
    super::record(&Section::new(section::CRD, provenance, body), args.no_docs)
}

/// Server, CA and client identity of the admin kubeconfig (written by cluster/pki.rs
/// with inline `*-data` fields).
struct Kubeconfig {
    server: String,
    ca: Vec<u8>,
    identity: Vec<u8>,
}

impl Kubeconfig {
    fn read(path: &std::path::Path) -> anyhow::Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("parsing {}", path.display()))
    }

    fn parse(text: &str) -> anyhow::Result<Self> {
        let field = |key: &str| -> anyhow::Result<&str> {
            text.lines()
                .find_map(|l| l.trim().strip_prefix(key))
                .map(str::trim)
                .with_context(|| format!("no {key}"))
        };
        let b64 = |key: &str| -> anyhow::Result<Vec<u8>> {
            base64::engine::general_purpose::STANDARD
                .decode(field(key)?)
                .with_context(|| format!("decoding {key}"))
        };
        let mut identity = b64("client-certificate-data:")?;
        identity.push(b'\n');
        identity.extend(b64("client-key-data:")?);
        Ok(Self {
            server: field("server:")?.trim_end_matches('/').to_string(),
            ca: b64("certificate-authority-data:")?,
            identity,
        })
    }
}

/// The pid of the process named `comm` (whose command line mentions `arg`, if given).
fn find_process(comm: &str, arg: Option<&str>) -> anyhow::Result<u32> {
    for entry in std::fs::read_dir("/proc").context("reading /proc")? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        if parse_stat(&stat).is_none_or(|st| st.comm != comm) {
            continue;
        }
        if let Some(arg) = arg {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if !String::from_utf8_lossy(&cmdline).contains(arg) {
                continue;
            }
        }
        return Ok(pid);
    }
    anyhow::bail!(
        "no process {comm}{} (is the cluster up?)",
        arg.map(|a| format!(" with {a}")).unwrap_or_default()
    )
}

/// The CRD: our VirtualMachine schema, made structural.
fn crd_object() -> anyhow::Result<Value> {
    let mut schema = virt_apimachinery::openapi::kind_schema("VirtualMachine")
        .context("no VirtualMachine schema")?;
    structural(&mut schema);
    if let Some(props) = schema["properties"].as_object_mut() {
        props.insert("metadata".into(), json!({"type": "object"}));
        props.remove("apiVersion");
        props.remove("kind");
        props.insert("apiVersion".into(), json!({"type": "string"}));
        props.insert("kind".into(), json!({"type": "string"}));
    }
    Ok(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": "virtualmachines", "singular": "virtualmachine",
                      "kind": "VirtualMachine", "listKind": "VirtualMachineList"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": schema},
                "subresources": {"status": {}},
            }],
        },
    }))
}

/// Rewrites an OpenAPI v3 schema into what a CRD accepts: no `$ref` (those become
/// objects that keep unknown fields), no vendor keys CRDs reject, no composition.
fn structural(v: &mut Value) {
    let Some(obj) = v.as_object_mut() else {
        if let Some(arr) = v.as_array_mut() {
            arr.iter_mut().for_each(structural);
        }
        return;
    };
    let is_ref = obj.contains_key("$ref")
        || obj.get("allOf").is_some_and(|a| {
            a.as_array()
                .is_some_and(|a| a.iter().any(|x| x.get("$ref").is_some()))
        });
    if is_ref {
        let desc = obj.get("description").cloned();
        obj.clear();
        obj.insert("type".into(), json!("object"));
        obj.insert("x-kubernetes-preserve-unknown-fields".into(), json!(true));
        if let Some(d) = desc {
            obj.insert("description".into(), d);
        }
        return;
    }
    obj.retain(|k, _| {
        !matches!(
            k.as_str(),
            "x-kubernetes-group-version-kind" | "allOf" | "oneOf" | "anyOf" | "default" | "format"
        )
    });
    // CRDs want list-map keys required (or defaulted) in the items.
    let keys = obj
        .get("x-kubernetes-list-map-keys")
        .and_then(Value::as_array)
        .cloned();
    if let (Some(keys), Some(items)) = (keys, obj.get_mut("items").and_then(Value::as_object_mut)) {
        let required = items.entry("required").or_insert_with(|| json!([]));
        if let Some(req) = required.as_array_mut() {
            for k in keys {
                if !req.contains(&k) {
                    req.push(k);
                }
            }
        }
    }
    if obj.get("x-kubernetes-int-or-string") == Some(&json!(true)) {
        obj.remove("type");
    }
    if obj.get("type") == Some(&json!("object"))
        && !obj.contains_key("properties")
        && !obj.contains_key("additionalProperties")
    {
        obj.insert("x-kubernetes-preserve-unknown-fields".into(), json!(true));
    }
    for (_, child) in obj.iter_mut() {
        structural(child);
    }
}

async fn create_crd(c: &reqwest::Client, base: &str, collection: &str) -> anyhow::Result<()> {
    let url = format!("{base}/apis/apiextensions.k8s.io/v1/customresourcedefinitions");
    let resp = c.post(&url).json(&crd_object()?).send().await?;
    let status = resp.status();
    anyhow::ensure!(
        status == 201,
        "creating the CRD: {status}: {}",
        resp.text().await.unwrap_or_default()
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v: Value = c
            .get(format!("{url}/{CRD_NAME}"))
            .send()
            .await?
            .json()
            .await?;
        let established = v["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Established" && c["status"] == "True")
        });
        if established && c.get(collection).send().await?.status() == 200 {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "the CRD is not established: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Deletes the CRD (and so every object of it) and waits until it is gone.
async fn delete_crd(c: &reqwest::Client, base: &str) -> anyhow::Result<()> {
    let url = format!("{base}/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{CRD_NAME}");
    let resp = c.delete(&url).send().await?;
    if resp.status() == 404 {
        return Ok(());
    }
    anyhow::ensure!(
        resp.status().is_success(),
        "deleting the CRD: {}",
        resp.status()
    );
    let deadline = Instant::now() + Duration::from_secs(300);
    while c.get(&url).send().await?.status() != 404 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the CRD is still there after 300 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

/// KiB added to the API server and its etcd, per 10k objects.
fn per_10k(r: &Results, n: usize) -> (f64, f64) {
    let grow = |idle: u64, after: u64| {
        after.saturating_sub(idle) as f64 * 1024.0 * 10_000.0 / n.max(1) as f64
    };
    (
        grow(r.api.idle, r.api.after),
        grow(r.etcd.idle, r.etcd.after),
    )
}

/// Nearest-rank percentile, `q` in 0..=100.
fn p(samples: &[Duration], q: f64) -> Option<Duration> {
    let mut s = samples.to_vec();
    s.sort();
    percentile(&s, q)
}

fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0 && a.is_finite()).then(|| a / b)
}

/// The comparison table with ratios and goals.
fn comparison(args: &ApiserverArgs, ours: &Results, crd: &Results) -> String {
    let mut s = String::from(
        "| measurement | (a) virt-apiserver | (b) CRD on kube-apiserver | ours / CRD | goal |\n|---|---|---|---|---|\n",
    );
    let fmt_ratio = |r: Option<f64>| r.map_or("n/a".to_string(), |r| format!("{r:.2}×"));
    let verdict = |r: Option<f64>, ok: &dyn Fn(f64) -> bool, goal: &str| match r {
        Some(r) if ok(r) => format!("{goal}: met"),
        Some(_) => format!("{goal}: **not met**"),
        None => format!("{goal}: not measured"),
    };
    // Create throughput.
    let (ra, rb) = (ours.create.rate(), crd.create.rate());
    let r = ratio(ra, rb);
    s.push_str(&format!(
        "| create throughput, {} objects, {} in flight | {ra:.0}/s ({} ok) | {rb:.0}/s ({} ok) | {} | {} |\n",
        args.count,
        args.concurrency,
        ours.create.ok,
        crd.create.ok,
        fmt_ratio(r),
        verdict(r, &|r| r >= 2.0, "≥ 2×")
    ));
    // LIST.
    for (q, name) in [(50.0, "p50"), (99.0, "p99")] {
        let (a, b) = (p(&ours.list, q), p(&crd.list, q));
        let r = a
            .zip(b)
            .and_then(|(a, b)| ratio(a.as_secs_f64(), b.as_secs_f64()));
        s.push_str(&format!(
            "| LIST of {} / {} objects ×{}, {name} | {} | {} | {} | — |\n",
            ours.list_items,
            crd.list_items,
            ours.list.len(),
            a.map_or("n/a".into(), ms),
            b.map_or("n/a".into(), ms),
            fmt_ratio(r)
        ));
    }
    // Watch delivery.
    for (q, name, goal) in [(50.0, "p50", None), (99.0, "p99", Some(0.5))] {
        let (a, b) = (p(&ours.watch.from_sent, q), p(&crd.watch.from_sent, q));
        let r = a
            .zip(b)
            .and_then(|(a, b)| ratio(a.as_secs_f64(), b.as_secs_f64()));
        let g = match goal {
            Some(g) => verdict(r, &|r| r <= g, "≤ 0.5×"),
            None => "—".into(),
        };
        s.push_str(&format!(
            "| watch delivery from update sent, {} watchers, {} updates, {name} | {} ({} events) | {} ({} events) | {} | {g} |\n",
            args.watchers,
            args.updates,
            a.map_or("n/a".into(), ms),
            ours.watch.from_sent.len(),
            b.map_or("n/a".into(), ms),
            crd.watch.from_sent.len(),
            fmt_ratio(r)
        ));
    }
    // Memory.
    let (oa, oe) = per_10k(ours, ours.create.ok);
    let (ca, ce) = per_10k(crd, crd.create.ok);
    let b = |v: f64| bytes(v as u64);
    s.push_str(&format!(
        "| RSS added per 10k objects: API server | {} | {} | {} | — |\n",
        b(oa),
        b(ca),
        fmt_ratio(ratio(oa, ca))
    ));
    s.push_str(&format!(
        "| RSS added per 10k objects: its etcd | {} | {} | {} | — |\n",
        b(oe),
        b(ce),
        fmt_ratio(ratio(oe, ce))
    ));
    let r = ratio(oa + oe, ca + ce);
    s.push_str(&format!(
        "| RSS added per 10k objects: API server + etcd | {} | {} | {} | {} |\n",
        b(oa + oe),
        b(ca + ce),
        fmt_ratio(r),
        verdict(r, &|r| r <= 0.3, "≤ 0.3×")
    ));
    let rss =
        |r: &super::apiserver::Rss| format!("{} → {}", bytes(r.idle * 1024), bytes(r.after * 1024));
    s.push_str(&format!(
        "| RSS before → after: API server | {} | {} | — | — |\n| RSS before → after: etcd | {} | {} | — | — |\n",
        rss(&ours.api),
        rss(&crd.api),
        rss(&ours.etcd),
        rss(&crd.etcd)
    ));
    // After-load RSS alone would flatter a server that peaks high and then returns the
    // memory, so the peak is reported too. VmHWM is since the process started: for (b)
    // that includes the cluster's life before this run, so it is an upper bound there.
    let peak = |r: &super::apiserver::Rss| bytes(r.peak * 1024);
    s.push_str(&format!(
        "| RSS peak (VmHWM): API server | {} | {} (since it started) | — | — |\n| RSS peak (VmHWM): etcd | {} | {} (since it started) | — | — |\n",
        peak(&ours.api),
        peak(&crd.api),
        peak(&ours.etcd),
        peak(&crd.etcd)
    ));
    let problems = |r: &Results| -> usize { r.create.errors.len() + r.watch.failures.len() };
    if problems(ours) + problems(crd) > 0 {
        s.push_str(&format!(
            "\nErrors: (a) {} create errors, {} watch failures; (b) {} create errors, {} watch failures{}.\n",
            ours.create.errors.len(),
            ours.watch.failures.len(),
            crd.create.errors.len(),
            crd.watch.failures.len(),
            crd.create
                .errors
                .first()
                .or(ours.create.errors.first())
                .map(|e| format!("; e.g. `{}`", e.chars().take(200).collect::<String>()))
                .unwrap_or_default()
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_in_percent() {
        let s: Vec<Duration> = (1..=100).rev().map(Duration::from_millis).collect();
        assert_eq!(p(&s, 50.0), Some(Duration::from_millis(50)));
        assert_eq!(p(&s, 99.0), Some(Duration::from_millis(99)));
        assert_eq!(p(&[], 50.0), None);
    }

    #[test]
    fn kubeconfig_fields() {
        let e = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let text = format!(
            "clusters:\n- cluster:\n    server: https://127.0.0.1:6443\n    certificate-authority-data: {}\nusers:\n- user:\n    client-certificate-data: {}\n    client-key-data: {}\n",
            e("CA"),
            e("CERT"),
            e("KEY")
        );
        let k = Kubeconfig::parse(&text).unwrap();
        assert_eq!(k.server, "https://127.0.0.1:6443");
        assert_eq!(k.ca, b"CA");
        assert_eq!(k.identity, b"CERT\nKEY");
    }

    #[test]
    fn crd_schema_is_structural() {
        let crd = crd_object().unwrap();
        let text = crd.to_string();
        assert!(!text.contains("$ref"));
        let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        assert_eq!(schema["properties"]["metadata"], json!({"type": "object"}));
        assert!(schema["properties"]["spec"].is_object());
    }
}
