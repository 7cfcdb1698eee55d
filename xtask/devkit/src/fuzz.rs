//! `cargo xtask fuzz`: schemathesis (a third-party, property-based API fuzzer) against a real
//! virt-apiserver on a real etcd, driven by the OpenAPI v3 documents the server publishes.
//! Every operation of `kubevirt.io/v1` and `subresources.kubevirt.io/v1` gets generated
//! requests, valid and invalid; the run fails on any 5xx, any response that breaks the
//! published schema or content type, any schema-violating request that is accepted, any
//! wrong answer to an undeclared method, on a server that is no longer alive at the end,
//! and on a stateful phase that followed no link. The stateful phase chains requests along
//! links this command adds (create → every operation on the created object); it gets past
//! the create because the server publishes a minimal valid `example` for each create body,
//! which schemathesis mixes into its generated bodies (a schema alone generates no valid
//! VM: names must be DNS subdomains, a guest needs memory).
//!
//! These checks are left out, on purpose: `status_code_conformance` (Kubernetes' OpenAPI, ours
//! included, documents the success codes only; every error is a `metav1.Status`) and
//! `positive_data_acceptance` (a schema cannot express Kubernetes' validation — an update
//! needs the stored resourceVersion, names are DNS labels — so schema-valid requests are
//! rightly refused; kube-apiserver fails it the same way), and `use_after_free` (a
//! Kubernetes DELETE answers 200 for an object that stays while finalizers run: foreground
//! deletion's `foregroundDeletion`, a VM's or VMI's own; it is gone once they are done,
//! which schemathesis, reading it at once, takes for a deleted resource still served).
//! The response-time check is held to the request timeout: how long answers take is the
//! benchmarks' business (`cargo xtask bench apiserver`), not a pass/fail line on a machine
//! whose load varies (a create through the aggregator took 28 s on a loaded cluster).
//!
//! Not part of CI (like the benchmarks): it installs a pinned schemathesis from PyPI into
//! target/fuzz/venv and runs for minutes. The figures go to docs/reliability.md.

use std::collections::BTreeSet;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};
use serde_json::Value;
use virt_devenv::{DevEnv, Options};

use crate::bench::report::{Machine, commit, now_utc, replace_section};

mod cluster;

/// The schemathesis release this project is fuzzed with.
const SCHEMATHESIS: &str = "4.32.5";

/// One schemathesis run over the document.
struct Pass {
    /// Its row in the docs table.
    label: &'static str,
    /// `--phases`.
    phases: &'static str,
    /// Whether its event stream is recorded to count the links followed.
    stateful: bool,
}

/// Every phase schemathesis has, in two runs: explicit examples, boundary coverage and
/// random fuzzing, then stateful sequences along the links [`with_links`] adds. Two runs,
/// because the links followed are only in schemathesis' event stream (`--report ndjson`:
/// every request and response), which for the first three phases would be hundreds of
/// megabytes; the stateful run's is small. The stateful pass is itself one run per kind.
const PASSES: &[Pass] = &[
    Pass {
        label: "examples, coverage, fuzzing",
        phases: "examples,coverage,fuzzing",
        stateful: false,
    },
    Pass {
        label: "stateful",
        phases: "stateful",
        stateful: true,
    },
];

/// Checks left out (see the module documentation for why).
const EXCLUDED_CHECKS: &str = "status_code_conformance,positive_data_acceptance,use_after_free";

/// Seconds a request may take: schemathesis' own limit for an answer is the same as for a
/// request that gets none (`--max-response-time` would otherwise default lower).
const REQUEST_TIMEOUT: &str = "30";

const HEADING: &str = "## API fuzzing with schemathesis";

/// The section of a run through the aggregator on the local cluster (`--cluster`).
const CLUSTER_HEADING: &str =
    "## API fuzzing through kube-apiserver's aggregator on the local cluster";

/// Query parameters removed from the schema before fuzzing: `watch` turns a list into a
/// stream of events, which an OpenAPI response cannot describe (schemathesis would read it
/// as a malformed list, and an unbounded watch as a request that never answers). Watches are
/// tested by virt-apiserver's own tests (`tests/api.rs`, `tests/watch_history.rs`).
const STREAM_PARAMETERS: &[&str] = &["watch"];

/// HTTP methods of an OpenAPI path item.
const METHODS: &[&str] = &["get", "put", "post", "patch", "delete"];

/// One document of every group's paths and components, so the stateful phase can chain an
/// operation of one group (create a VM) to one of the other (start it). Component names
/// are Kubernetes' fully qualified type names; a name both define must be the same schema.
fn merged(docs: &[Value]) -> anyhow::Result<Value> {
    let mut out = docs
        .first()
        .cloned()
        .unwrap_or_else(|| serde_json::json!({}));
    for doc in docs.iter().skip(1) {
        for (path, item) in doc["paths"].as_object().into_iter().flatten() {
            anyhow::ensure!(
                out["paths"].get(path).is_none(),
                "two groups publish path {path}"
            );
            out["paths"][path] = item.clone();
        }
        for (kind, entries) in doc["components"].as_object().into_iter().flatten() {
            for (name, v) in entries.as_object().into_iter().flatten() {
                match out["components"][kind].get(name) {
                    Some(have) if have != v => {
                        bail!("components.{kind}.{name} differs between the groups")
                    }
                    _ => out["components"][kind][name] = v.clone(),
                }
            }
        }
    }
    Ok(out)
}

/// The path without its group and version: `/namespaces/{namespace}/virtualmachines`.
fn resource_path(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/apis/")?;
    let mut parts = rest.splitn(3, '/');
    let (_group, _version, tail) = (parts.next()?, parts.next()?, parts.next()?);
    Some(&path[path.len() - tail.len() - 1..])
}

/// Adds OpenAPI links from every create (a collection's POST answering 201) to every
/// operation on the object it created, in any group: its path, status and subresources,
/// with `name` (and `namespace`) taken from the created object, and for a PUT the created
/// object itself as the body, so the update carries a valid resourceVersion. Kubernetes'
/// OpenAPI has no links; without them schemathesis' stateful phase finds nothing to chain
/// (a generated name is never one that exists).
fn with_links(mut schema: Value) -> Value {
    let paths: Vec<(String, Value)> = schema["paths"]
        .as_object()
        .map(|p| p.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default();
    for (collection, item) in &paths {
        if item["post"]["responses"].get("201").is_none() {
            continue;
        }
        let Some(base) = resource_path(collection) else {
            continue;
        };
        let object = format!("{base}/{{name}}");
        let mut links = serde_json::Map::new();
        for (target, titem) in &paths {
            let Some(tail) = resource_path(target) else {
                continue;
            };
            if tail != object && !tail.starts_with(&format!("{object}/")) {
                continue;
            }
            for method in METHODS {
                let Some(op_id) = titem[*method]["operationId"].as_str() else {
                    continue;
                };
                let mut parameters = serde_json::Map::new();
                parameters.insert("name".into(), "$response.body#/metadata/name".into());
                if target.contains("{namespace}") {
                    parameters.insert(
                        "namespace".into(),
                        "$response.body#/metadata/namespace".into(),
                    );
                }
                let mut link = serde_json::json!({
                    "operationId": op_id,
                    "parameters": parameters,
                });
                if *method == "put" && (tail == object || tail == format!("{object}/status")) {
                    link["requestBody"] = "$response.body".into();
                }
                links.insert(op_id.to_string(), link);
            }
        }
        if !links.is_empty() {
            schema["paths"][collection]["post"]["responses"]["201"]["links"] = Value::Object(links);
        }
    }
    schema
}

/// `schema` without [`STREAM_PARAMETERS`] on any operation or path.
fn without_streams(mut schema: Value) -> Value {
    if let Some(paths) = schema["paths"].as_object_mut() {
        for item in paths.values_mut() {
            let Some(item) = item.as_object_mut() else {
                continue;
            };
            for (_, op) in item.iter_mut() {
                let params = if op.is_array() {
                    op.as_array_mut()
                } else {
                    op.get_mut("parameters").and_then(Value::as_array_mut)
                };
                if let Some(params) = params {
                    params.retain(|p| {
                        !p["name"]
                            .as_str()
                            .is_some_and(|n| STREAM_PARAMETERS.contains(&n))
                    });
                }
            }
        }
    }
    schema
}

const DEFAULT_MAX_EXAMPLES: u32 = 50;

/// Arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Generated examples per operation and phase.
    #[arg(long, default_value_t = DEFAULT_MAX_EXAMPLES)]
    max_examples: u32,
    /// Seed for a reproducible run.
    #[arg(long)]
    seed: Option<u64>,
    /// Do not write docs/reliability.md.
    #[arg(long)]
    no_docs: bool,
    /// Only the stateful phase (minutes instead of the coverage phase's quarter hour).
    #[arg(long)]
    stateful_only: bool,
    /// Fuzz kubevirt-rs as deployed on the local cluster (`cargo xtask up`), through
    /// kube-apiserver's aggregator, instead of a standalone virt-apiserver: the VM and VMI
    /// actions then act on real VMs (xtask/devkit/src/fuzz/cluster.rs).
    #[arg(long)]
    cluster: bool,
    /// With `--cluster`: the kubeconfig (default: $KUBECONFIG, else the local cluster's).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
}

/// What is fuzzed: a standalone virt-apiserver on its own etcd, or the local cluster.
enum Target {
    Dev(Box<DevEnv>),
    Cluster(cluster::Cluster),
}

impl Target {
    fn url(&self) -> &str {
        match self {
            Target::Dev(e) => &e.server_url,
            Target::Cluster(c) => &c.url,
        }
    }

    /// CA, client certificate and key.
    fn files(&self) -> [&Path; 3] {
        match self {
            Target::Dev(e) => [&e.server_ca, &e.admin.cert, &e.admin.key],
            Target::Cluster(c) => [&c.ca, &c.cert, &c.key],
        }
    }

    fn fetch(&self, path: &str) -> anyhow::Result<String> {
        match self {
            Target::Dev(e) => fetch(e, path),
            Target::Cluster(c) => c.fetch(path),
        }
    }

    /// Every group version kubevirt-rs serves: the new kinds are fuzzed as they come.
    fn group_versions(&self) -> anyhow::Result<Vec<String>> {
        match self {
            Target::Dev(_) => {
                let list: Value = serde_json::from_str(&self.fetch("/apis")?)?;
                Ok(preferred_versions(&list))
            }
            Target::Cluster(c) => c.group_versions(),
        }
    }
}

/// The preferred `group/version` of every group of an APIGroupList, sorted.
fn preferred_versions(list: &Value) -> Vec<String> {
    let mut out: Vec<String> = list["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|g| g["preferredVersion"]["groupVersion"].as_str())
        .map(str::to_string)
        .collect();
    out.sort();
    out
}

/// One pass's result, from schemathesis' JSON report.
#[derive(Debug, Default, PartialEq)]
struct Outcome {
    /// The pass (its phases).
    pass: String,
    operations: u64,
    generated: u64,
    /// `(code title, count, operations)` per failed check.
    failures: Vec<(String, u64, Vec<String>)>,
    /// `(title, count)` of requests that got no answer (network errors, timeouts).
    errors: Vec<(String, u64)>,
    /// The stateful pass: links followed.
    links: Option<Links>,
}

/// Which links the stateful phase followed, from its event stream.
#[derive(Debug, Default, PartialEq)]
struct Links {
    /// Links the state machine has (declared and inferred), as schemathesis counts them.
    total: u64,
    /// Links at least one step followed: a request built from a previous response.
    followed: BTreeSet<String>,
}

/// Reads schemathesis' NDJSON event stream (`--report ndjson`): the link count from the
/// stateful phase's `PhaseStarted`, and every step a link produced and that used what it
/// extracted (`is_transition_applied`: a step may also ignore it, to explore).
fn links(ndjson: impl BufRead) -> anyhow::Result<Links> {
    let mut out = Links::default();
    for line in ndjson.lines() {
        let line = line?;
        // Only these two events matter; skip parsing the rest (most of the stream).
        if !(line.starts_with("{\"PhaseStarted\"") || line.starts_with("{\"ScenarioFinished\"")) {
            continue;
        }
        let event: Value = serde_json::from_str(&line).context("an NDJSON event")?;
        if let Some(total) = event
            .pointer("/PhaseStarted/payload/transitions_total")
            .and_then(Value::as_u64)
        {
            out.total = out.total.max(total);
        }
        let cases = event.pointer("/ScenarioFinished/recorder/cases");
        for case in cases
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .map(|(_, c)| c)
        {
            if case["is_transition_applied"] == true
                && let Some(id) = case.pointer("/transition/id").and_then(Value::as_str)
            {
                out.followed.insert(id.to_string());
            }
        }
    }
    Ok(out)
}

/// Reads schemathesis' JSON report (`--report json`).
fn outcome(pass: &str, report: &Value) -> Outcome {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    Outcome {
        pass: pass.to_string(),
        operations: n(&report["operations"]["tested"]),
        generated: n(&report["test_cases"]["generated"]),
        failures: report["failures"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|f| {
                (
                    format!(
                        "{} {}",
                        f["code"].as_str().unwrap_or("?"),
                        f["title"].as_str().unwrap_or("?")
                    ),
                    n(&f["count"]),
                    f["operations"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|o| o.as_str().map(str::to_string))
                        .collect(),
                )
            })
            .collect(),
        errors: report["errors"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                (
                    e["title"].as_str().unwrap_or("?").to_string(),
                    n(&e["count"]),
                )
            })
            .collect(),
        links: None,
    }
}

/// The command line that reproduces a run with `args`.
fn command_line(args: &Args) -> String {
    let mut c = "cargo xtask fuzz".to_string();
    if args.max_examples != DEFAULT_MAX_EXAMPLES {
        c.push_str(&format!(" --max-examples {}", args.max_examples));
    }
    if let Some(seed) = args.seed {
        c.push_str(&format!(" --seed {seed}"));
    }
    if args.stateful_only {
        c.push_str(" --stateful-only");
    }
    if args.cluster {
        c.push_str(" --cluster");
    }
    c
}

/// The links [`with_links`] declared, per create operation (`POST /apis/…`): its label as
/// schemathesis names operations, and the number of links.
fn declared_links(schema: &Value) -> Vec<(String, usize)> {
    schema["paths"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(path, item)| {
            let n = item["post"]["responses"]["201"]["links"].as_object()?.len();
            Some((format!("POST {path}"), n))
        })
        .collect()
}

/// `a, b and c`.
fn listing(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} and {last}", rest.join(", ")),
    }
}

/// The docs section for `outcomes`.
fn section(
    outcomes: &[Outcome],
    declared: &[(String, usize)],
    args: &Args,
    groups: &[String],
    after: &str,
    took: f64,
) -> String {
    let (heading, target) = if args.cluster {
        (
            CLUSTER_HEADING,
            format!(
                "kubevirt-rs as deployed on the local cluster, through kube-apiserver's aggregator \
                 (`{}`), authenticated as the kubeconfig's admin; every namespaced request in the \
                 namespace `{}` made for the run and deleted after it, the `kubevirts` paths left \
                 out (they drive virt-operator: xtask/devkit/src/fuzz/cluster.rs)",
                "cargo xtask up",
                cluster::NAMESPACE
            ),
        )
    } else {
        (
            HEADING,
            "virt-apiserver (debug build) on its own etcd (`virt-devenv`), authenticated with a \
             client certificate"
                .to_string(),
        )
    };
    let groups = listing(&groups.iter().map(|g| format!("`{g}`")).collect::<Vec<_>>());
    let mut s = format!(
        "{heading}\n\nCommand: `{}` (`--max-examples {}`: generated examples per operation and \
         phase); commit {}; {}; machine: {}. schemathesis {SCHEMATHESIS} (PyPI) against \
         {target}. The document fuzzed: the OpenAPI v3 documents of every group kubevirt-rs \
         serves ({groups}) merged into one, without the \
         `watch` parameter (a stream is no OpenAPI response; watches have their own tests), \
         with links from every create to every operation on the created object (get, replace \
         with the created object, patch, delete, status, subresources) for the stateful phase; \
         the creates' request bodies carry the published minimal `example` objects, which \
         schemathesis mixes into what it generates. Every check but `{EXCLUDED_CHECKS}` (why: \
         `xtask/devkit/src/fuzz.rs`). The first row is one schemathesis run; the stateful row sums one run per created kind, each over that kind's paths in every group (with all kinds in one run its scenarios spread too thin to reach the VM actions). Run time {took:.0} s.\n\n\
         | Phases | Operations | Requests generated | Failed checks | Requests without an answer |\n\
         |---|---|---|---|---|\n",
        command_line(args),
        args.max_examples,
        commit(),
        now_utc(),
        Machine::probe()
    );
    let joined = |v: &[(String, u64)]| {
        if v.is_empty() {
            "0".to_string()
        } else {
            v.iter()
                .map(|(what, n)| format!("{what}: {n}"))
                .collect::<Vec<_>>()
                .join("; ")
        }
    };
    for o in outcomes {
        let failures: Vec<(String, u64)> = o
            .failures
            .iter()
            .map(|(what, n, ops)| (format!("{what} ({})", ops.join(", ")), *n))
            .collect();
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            o.pass,
            o.operations,
            o.generated,
            joined(&failures),
            joined(&o.errors)
        ));
    }
    if let Some(links) = outcomes.iter().find_map(|o| o.links.as_ref()) {
        let per_create: Vec<String> = declared
            .iter()
            .map(|(create, n)| {
                let followed = links
                    .followed
                    .iter()
                    .filter(|id| id.starts_with(&format!("{create} -> ")))
                    .count();
                let plural = create.rsplit('/').next().unwrap_or(create);
                format!("{plural} {followed} of {n}")
            })
            .collect();
        s.push_str(&format!(
            "\nLinks the stateful phase followed: {} of {} (from the creates of {}).\n",
            links.followed.len(),
            links.total,
            listing(&per_create)
        ));
    }
    s.push_str(&format!("\n{after}\n"));
    s
}

/// The line on what a run on the cluster left behind.
fn cluster_after(h: &cluster::Health) -> String {
    let verdict = if h.problems.is_empty() {
        "every kubevirt-rs pod ran through without a restart and is ready".to_string()
    } else {
        format!("**problems**: {}", h.problems.join("; "))
    };
    let cleanup = match h.cleanup {
        Some(d) => format!("deleted in {:.1} s", d.as_secs_f64()),
        None => "not deleted in time".to_string(),
    };
    format!(
        "After the run: its namespace, with every VM, VMI, migration and pod the run made, \
         {cleanup}; {verdict}."
    )
}

/// Installs the pinned schemathesis into `dir` unless it is there; the `st` binary.
fn venv(dir: &Path) -> anyhow::Result<PathBuf> {
    let st = dir.join("bin/st");
    let have = Command::new(&st)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(SCHEMATHESIS))
        .unwrap_or(false);
    if have {
        return Ok(st);
    }
    let ok = Command::new("python3")
        .args(["-m", "venv"])
        .arg(dir)
        .status()
        .context("running python3 -m venv")?
        .success();
    if !ok {
        bail!("python3 -m venv failed: apt-get install python3-venv");
    }
    let ok = Command::new(dir.join("bin/pip"))
        .args([
            "install",
            "--quiet",
            &format!("schemathesis=={SCHEMATHESIS}"),
        ])
        .status()
        .context("running pip")?
        .success();
    if !ok {
        bail!("pip install schemathesis=={SCHEMATHESIS} failed (PyPI reachable?)");
    }
    Ok(st)
}

/// GET `path` from the server with the admin's client certificate.
fn fetch(env: &DevEnv, path: &str) -> anyhow::Result<String> {
    let ca = std::fs::read(&env.server_ca)?;
    let mut identity = std::fs::read(&env.admin.cert)?;
    identity.extend(std::fs::read(&env.admin.key)?);
    let url = format!("{}{path}", env.server_url);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(async {
            let client = reqwest::Client::builder()
                .use_rustls_tls()
                .add_root_certificate(reqwest::Certificate::from_pem(&ca)?)
                .identity(reqwest::Identity::from_pem(&identity)?)
                .build()?;
            let r = client.get(&url).send().await?.error_for_status()?;
            Ok(r.text().await?)
        })
}

/// How schemathesis is run against the target.
struct Schemathesis<'a> {
    st: &'a Path,
    dir: &'a Path,
    schema: &'a Path,
    url: &'a str,
    /// CA, client certificate and key.
    files: [&'a Path; 3],
    args: &'a Args,
}

impl Schemathesis<'_> {
    /// One run of `pass`'s phases; with `kind` (a plural), only the operations on that kind's
    /// paths, in any group (its creates, its objects, their subresources).
    fn pass(&self, pass: &Pass, kind: Option<&str>) -> anyhow::Result<Outcome> {
        let mut name = pass.phases.replace(',', "-");
        if let Some(k) = kind {
            name.push('-');
            name.push_str(k);
        }
        let report = self.dir.join(format!("report-{name}.json"));
        let events = self.dir.join(format!("events-{name}.ndjson"));
        let _ = std::fs::remove_file(&report);
        let _ = std::fs::remove_file(&events);
        println!(
            "fuzzing, phases {}{}…",
            pass.phases,
            kind.map(|k| format!(", {k}")).unwrap_or_default()
        );
        let [ca, cert, key] = self.files;
        let mut cmd = Command::new(self.st);
        // schemathesis keeps a cache of what it found in `.schemathesis/` of its working
        // directory: target/fuzz, not the workspace.
        cmd.current_dir(self.dir)
            .arg("run")
            .arg(self.schema)
            .args(["--url", self.url])
            .arg("--tls-verify")
            .arg(ca)
            .arg("--request-cert")
            .arg(cert)
            .arg("--request-cert-key")
            .arg(key)
            .args(["--checks", "all", "--exclude-checks", EXCLUDED_CHECKS])
            .args(["--phases", pass.phases])
            .args(["--max-examples", &self.args.max_examples.to_string()])
            .args(["--request-timeout", REQUEST_TIMEOUT])
            .args(["--max-response-time", REQUEST_TIMEOUT, "--no-color"])
            .args([
                "--report",
                if pass.stateful { "json,ndjson" } else { "json" },
            ])
            .arg("--report-json-path")
            .arg(&report);
        if let Some(k) = kind {
            cmd.args(["--include-path-regex", &kind_paths(k)]);
        }
        if pass.stateful {
            cmd.arg("--report-ndjson-path").arg(&events);
        }
        if let Some(seed) = self.args.seed {
            cmd.args(["--seed", &seed.to_string()]);
        }
        // schemathesis exits 1 on any finding: the report says which.
        cmd.status().context("running schemathesis")?;
        let text = std::fs::read_to_string(&report)
            .with_context(|| format!("schemathesis wrote no report to {}", report.display()))?;
        let mut o = outcome(pass.label, &serde_json::from_str(&text)?);
        if pass.stateful {
            let file = std::fs::File::open(&events)
                .with_context(|| format!("schemathesis wrote no events to {}", events.display()))?;
            o.links = Some(links(std::io::BufReader::new(file))?);
        }
        Ok(o)
    }
}

/// The paths of one kind, by its plural, in every group: its collection, its objects and
/// their subresources (`/virtualmachines` but not `/virtualmachineinstances`).
fn kind_paths(plural: &str) -> String {
    format!("/{plural}(/|$)")
}

impl Outcome {
    /// Adds another run's counts to this one's.
    fn absorb(&mut self, o: Outcome) {
        self.operations += o.operations;
        self.generated += o.generated;
        for (what, n, ops) in o.failures {
            match self.failures.iter_mut().find(|f| f.0 == what) {
                Some(f) => {
                    f.1 += n;
                    f.2.extend(ops);
                }
                None => self.failures.push((what, n, ops)),
            }
        }
        for (what, n) in o.errors {
            match self.errors.iter_mut().find(|e| e.0 == what) {
                Some(e) => e.1 += n,
                None => self.errors.push((what, n)),
            }
        }
        if let Some(l) = o.links {
            let mine = self.links.get_or_insert_with(Links::default);
            mine.total += l.total;
            mine.followed.extend(l.followed);
        }
    }
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let dir = crate::target_dir().join("fuzz");
    std::fs::create_dir_all(&dir)?;
    let st = venv(&dir.join("venv"))?;
    let target = if args.cluster {
        let kubeconfig = crate::deploy::kubeconfig(args.kubeconfig.clone());
        Target::Cluster(cluster::Cluster::prepare(&dir, kubeconfig)?)
    } else {
        let bin = crate::dev_apiserver::build_apiserver(false)?;
        Target::Dev(Box::new(
            DevEnv::start(Options {
                apiserver_bin: bin,
                ..Default::default()
            })
            .context("starting etcd and virt-apiserver")?,
        ))
    };
    let mut outcomes = Vec::new();
    let mut published = Vec::new();
    let groups = target.group_versions()?;
    if groups.is_empty() {
        bail!("the target serves no API group of kubevirt-rs");
    }
    for group in &groups {
        published.push(serde_json::from_str::<Value>(
            &target.fetch(&format!("/openapi/v3/apis/{group}"))?,
        )?);
    }
    // One document, so that the stateful phase chains across the groups.
    let mut merged = with_links(without_streams(merged(&published)?));
    if let Target::Cluster(_) = target {
        merged = cluster::for_cluster(merged, cluster::NAMESPACE);
    }
    let declared = declared_links(&merged);
    let schema = dir.join("openapi.json");
    std::fs::write(&schema, serde_json::to_vec(&merged)?)?;
    let run = Schemathesis {
        st: &st,
        dir: &dir,
        schema: &schema,
        url: target.url(),
        files: target.files(),
        args: &args,
    };
    for pass in PASSES.iter().filter(|p| p.stateful || !args.stateful_only) {
        if !pass.stateful {
            outcomes.push(run.pass(pass, None)?);
            continue;
        }
        // One stateful run per kind: with every kind's operations in one run, its scenarios
        // spread over them all and the VM actions are rarely reached.
        let mut all = Outcome {
            pass: pass.label.to_string(),
            links: Some(Links::default()),
            ..Default::default()
        };
        for (create, _) in &declared {
            let Some(plural) = create.rsplit('/').next() else {
                continue;
            };
            all.absorb(run.pass(pass, Some(plural))?);
        }
        // schemathesis counts, in each run, every link of the document (its filter leaves
        // them in the state machine); the links there are to follow are the declared ones.
        if let Some(l) = all.links.as_mut() {
            l.total = declared.iter().map(|(_, n)| *n as u64).sum();
        }
        outcomes.push(all);
    }
    let (after, problems) = match target {
        Target::Dev(mut env) => {
            let alive = env.alive();
            env.stop();
            (
                format!(
                    "virt-apiserver alive after the run: {}.",
                    if alive { "yes" } else { "NO" }
                ),
                if alive {
                    Vec::new()
                } else {
                    vec!["virt-apiserver died during the fuzzing run (log in its temp dir)".into()]
                },
            )
        }
        Target::Cluster(c) => {
            let h = c.finish();
            (cluster_after(&h), h.problems)
        }
    };
    let took = t0.elapsed().as_secs_f64();
    let text = section(&outcomes, &declared, &args, &groups, &after, took);
    println!("\n{text}");
    if !args.no_docs {
        let path = crate::workspace_root().join("docs/reliability.md");
        let doc = std::fs::read_to_string(&path).unwrap_or_else(|_| {
            "# Reliability\n\nGenerated sections: each names the command, commit and machine \
             that produced it.\n"
                .to_string()
        });
        let heading = if args.cluster {
            CLUSTER_HEADING
        } else {
            HEADING
        };
        std::fs::write(&path, replace_section(&doc, heading, &text))?;
        println!("wrote {}", path.display());
    }
    if !problems.is_empty() {
        bail!("after the fuzzing run:\n{}", problems.join("\n"));
    }
    let findings = findings(&outcomes);
    if !findings.is_empty() {
        bail!("schemathesis findings:\n{}", findings.join("\n"));
    }
    Ok(())
}

/// What makes the run fail: every failed check (a 5xx, a response outside the schema, a
/// schema-violating request accepted, …), every request without an answer, and a stateful
/// phase that followed no link (it then tested nothing a fresh request does not).
fn findings(outcomes: &[Outcome]) -> Vec<String> {
    outcomes
        .iter()
        .flat_map(|o| {
            o.failures
                .iter()
                .map(move |(what, n, ops)| format!("{}: {what} ×{n}: {}", o.pass, ops.join(", ")))
                .chain(
                    o.errors
                        .iter()
                        .map(move |(what, n)| format!("{}: {what} ×{n}", o.pass)),
                )
                .chain(
                    o.links
                        .as_ref()
                        .filter(|l| l.followed.is_empty())
                        .map(|l| format!("{}: none of the {} links followed", o.pass, l.total)),
                )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn watch_parameters_leave_the_schema() {
        let schema = serde_json::json!({"paths": {"/a": {
            "parameters": [{"name": "pretty"}, {"name": "watch"}],
            "get": {"parameters": [{"name": "limit"}, {"name": "watch"}]},
        }}});
        let s = without_streams(schema);
        assert_eq!(
            s["paths"]["/a"]["parameters"],
            serde_json::json!([{"name": "pretty"}])
        );
        assert_eq!(
            s["paths"]["/a"]["get"]["parameters"],
            serde_json::json!([{"name": "limit"}])
        );
    }

    #[test]
    fn creates_link_to_every_operation_on_the_created_object_in_any_group() {
        let ops = |id: &str| serde_json::json!({"operationId": id, "responses": {"200": {}}});
        let core = serde_json::json!({
            "paths": {
                "/apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachines": {
                    "get": ops("listVM"),
                    "post": {"operationId": "createVM", "responses": {"201": {"description": "Created"}}},
                },
                "/apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachines/{name}": {
                    "get": ops("readVM"), "put": ops("replaceVM"), "delete": ops("deleteVM"),
                },
                "/apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachines/{name}/status": {
                    "put": ops("replaceVMStatus"),
                },
                "/apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachineinstances/{name}": {
                    "get": ops("readVMI"),
                },
            },
            "components": {"schemas": {"Status": {"type": "object"}}},
        });
        let sub = serde_json::json!({
            "paths": {
                "/apis/subresources.kubevirt.io/v1/namespaces/{namespace}/virtualmachines/{name}/start": {
                    "put": ops("startVM"),
                },
            },
            "components": {"schemas": {"Status": {"type": "object"}, "StartOptions": {}}},
        });
        let doc = with_links(merged(&[core.clone(), sub]).unwrap());
        let links = &doc["paths"]["/apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachines"]["post"]
            ["responses"]["201"]["links"];
        let mut ids: Vec<&str> = links
            .as_object()
            .unwrap()
            .values()
            .map(|l| l["operationId"].as_str().unwrap())
            .collect();
        ids.sort_unstable();
        assert_eq!(
            ids,
            [
                "deleteVM",
                "readVM",
                "replaceVM",
                "replaceVMStatus",
                "startVM"
            ]
        );
        assert_eq!(
            links["readVM"]["parameters"],
            serde_json::json!({"name": "$response.body#/metadata/name",
                               "namespace": "$response.body#/metadata/namespace"})
        );
        // A replace sends the created object back, with its resourceVersion.
        assert_eq!(links["replaceVM"]["requestBody"], "$response.body");
        assert!(links["startVM"].get("requestBody").is_none());
        assert!(doc["components"]["schemas"].get("StartOptions").is_some());
        // Two groups may not define one schema differently.
        let clash = serde_json::json!({"paths": {},
            "components": {"schemas": {"Status": {"type": "string"}}}});
        assert!(merged(&[core, clash]).is_err());
    }

    #[test]
    fn the_report_gives_counts_failures_and_errors() {
        let report = serde_json::json!({
            "operations": {"tested": 44},
            "test_cases": {"generated": 1234},
            "failures": [{"code": "ST204", "title": "Wrong response to undeclared method",
                          "count": 2, "operations": ["TRACE /a", "TRACE /b"]}],
            "errors": [{"title": "Network Error", "count": 3}],
        });
        let o = outcome("kubevirt.io/v1", &report);
        assert_eq!(o.operations, 44);
        assert_eq!(o.generated, 1234);
        assert_eq!(
            o.failures,
            [(
                "ST204 Wrong response to undeclared method".to_string(),
                2,
                vec!["TRACE /a".to_string(), "TRACE /b".to_string()]
            )]
        );
        assert_eq!(o.errors, [("Network Error".to_string(), 3)]);
        assert_eq!(findings(std::slice::from_ref(&o)).len(), 2);
        let clean = outcome("g", &serde_json::json!({"failures": [], "errors": []}));
        assert!(findings(&[clean]).is_empty());
    }

    #[test]
    fn links_followed_come_from_the_event_stream() {
        let vms = "POST /apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachines";
        let read = format!("{vms} -> [201] readVM -> GET /vm");
        let start = format!("{vms} -> [201] startVM -> PUT /start");
        let stream = [
            serde_json::json!({"Initialize": {"seed": 1}}),
            serde_json::json!({"PhaseStarted": {"payload": null}}),
            serde_json::json!({"PhaseStarted": {"payload": {"transitions_total": 44,
                                                              "transitions_selected": 44}}}),
            serde_json::json!({"ScenarioFinished": {"recorder": {"cases": {
                "a": {"value": {}},
                "b": {"transition": {"id": read}, "is_transition_applied": true},
                // Followed the link but used none of its values: not counted.
                "c": {"transition": {"id": start}, "is_transition_applied": false},
            }}}}),
            serde_json::json!({"ScenarioFinished": {"recorder": {"cases": {
                "d": {"transition": {"id": read}, "is_transition_applied": true},
            }}}}),
        ]
        .iter()
        .map(Value::to_string)
        .collect::<Vec<_>>()
        .join("\n");
        let l = links(stream.as_bytes()).unwrap();
        assert_eq!(l.total, 44);
        assert_eq!(l.followed, BTreeSet::from([read.clone()]));

        let declared = vec![(vms.to_string(), 2)];
        let o = Outcome {
            pass: "stateful".into(),
            links: Some(l),
            ..Default::default()
        };
        let args = Args {
            max_examples: DEFAULT_MAX_EXAMPLES,
            seed: None,
            no_docs: true,
            stateful_only: false,
            cluster: false,
            kubeconfig: None,
        };
        let groups = [
            "kubevirt.io/v1".to_string(),
            "pool.kubevirt.io/v1beta1".to_string(),
        ];
        let text = section(
            std::slice::from_ref(&o),
            &declared,
            &args,
            &groups,
            "virt-apiserver alive after the run: yes.",
            1.0,
        );
        assert!(
            text.contains("(`kubevirt.io/v1` and `pool.kubevirt.io/v1beta1`) merged"),
            "{text}"
        );
        assert!(
            text.contains("Command: `cargo xtask fuzz` (`--max-examples 50`"),
            "{text}"
        );
        assert!(
            text.contains("followed: 1 of 44 (from the creates of virtualmachines 1 of 2)"),
            "{text}"
        );
        assert!(findings(&[o]).is_empty());
    }

    #[test]
    fn a_stateful_phase_that_follows_no_link_fails_the_run() {
        let o = Outcome {
            pass: "stateful".into(),
            links: Some(Links {
                total: 44,
                followed: BTreeSet::new(),
            }),
            ..Default::default()
        };
        assert_eq!(findings(&[o]), ["stateful: none of the 44 links followed"]);
        let args = Args {
            max_examples: 5,
            seed: Some(7),
            no_docs: true,
            stateful_only: false,
            cluster: false,
            kubeconfig: None,
        };
        assert_eq!(
            command_line(&args),
            "cargo xtask fuzz --max-examples 5 --seed 7"
        );
    }

    #[test]
    fn every_group_the_server_lists_is_fuzzed_at_its_preferred_version() {
        let list = serde_json::json!({"groups": [
            {"name": "pool.kubevirt.io", "preferredVersion": {"groupVersion": "pool.kubevirt.io/v1beta1"}},
            {"name": "kubevirt.io", "preferredVersion": {"groupVersion": "kubevirt.io/v1"}}
        ]});
        assert_eq!(
            preferred_versions(&list),
            ["kubevirt.io/v1", "pool.kubevirt.io/v1beta1"]
        );
    }
}
