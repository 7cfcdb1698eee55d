//! `cargo xtask fuzz`: schemathesis (a third-party, property-based API fuzzer) against a real
//! virt-apiserver on a real etcd, driven by the OpenAPI v3 documents the server publishes.
//! Every operation of `kubevirt.io/v1` and `subresources.kubevirt.io/v1` gets generated
//! requests, valid and invalid; the run fails on any 5xx, any response that breaks the
//! published schema or content type, any schema-violating request that is accepted, any
//! wrong answer to an undeclared method, and on a server that is no longer alive at the end.
//!
//! Two checks are left out, on purpose: `status_code_conformance` (Kubernetes' OpenAPI, ours
//! included, documents the success codes only; every error is a `metav1.Status`) and
//! `positive_data_acceptance` (a schema cannot express Kubernetes' validation — an update
//! needs the stored resourceVersion, names are DNS labels — so schema-valid requests are
//! rightly refused; kube-apiserver fails it the same way).
//!
//! Not part of CI (like the benchmarks): it installs a pinned schemathesis from PyPI into
//! target/fuzz/venv and runs for minutes. The figures go to docs/reliability.md.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, bail};
use serde_json::Value;
use virt_devenv::{DevEnv, Options};

use crate::bench::report::{Machine, commit, now_utc, replace_section};

/// The schemathesis release this project is fuzzed with.
const SCHEMATHESIS: &str = "4.32.5";

/// The OpenAPI v3 groups fuzzed.
const GROUPS: &[&str] = &["kubevirt.io/v1", "subresources.kubevirt.io/v1"];

/// Every phase schemathesis has: explicit examples, boundary coverage, random fuzzing, and
/// stateful sequences along the links [`with_links`] adds.
const PHASES: &str = "examples,coverage,fuzzing,stateful";

/// Checks left out (see the module documentation for why).
const EXCLUDED_CHECKS: &str = "status_code_conformance,positive_data_acceptance";

const HEADING: &str = "## API fuzzing with schemathesis";

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

/// Arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Generated examples per operation and phase.
    #[arg(long, default_value_t = 50)]
    max_examples: u32,
    /// Seed for a reproducible run.
    #[arg(long)]
    seed: Option<u64>,
    /// Do not write docs/reliability.md.
    #[arg(long)]
    no_docs: bool,
}

/// One group's result, from schemathesis' JSON report.
#[derive(Debug, Default, PartialEq)]
struct Outcome {
    group: String,
    operations: u64,
    generated: u64,
    /// `(code title, count, operations)` per failed check.
    failures: Vec<(String, u64, Vec<String>)>,
    /// `(title, count)` of requests that got no answer (network errors, timeouts).
    errors: Vec<(String, u64)>,
}

impl Outcome {
    fn clean(&self) -> bool {
        self.failures.is_empty() && self.errors.is_empty()
    }
}

/// Reads schemathesis' JSON report (`--report json`).
fn outcome(group: &str, report: &Value) -> Outcome {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    Outcome {
        group: group.to_string(),
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
    }
}

/// The docs section for `outcomes`.
fn section(outcomes: &[Outcome], args: &Args, alive: bool, took: f64) -> String {
    let mut s = format!(
        "{HEADING}\n\nCommand: `cargo xtask fuzz --max-examples {}`; commit {}; {}; machine: {}. \
         schemathesis {SCHEMATHESIS} (PyPI) against virt-apiserver (debug build) on its own etcd \
         (`virt-devenv`), authenticated with a client certificate, both OpenAPI v3 groups the \
         server publishes merged into one document (without the `watch` parameter: a stream is no \
         OpenAPI response; watches have their own tests), with links from every create to \
         every operation on the created object (get, replace with the created object, patch, \
         delete, status, subresources) for the stateful phase; phases `{PHASES}`; every check \
         but `{EXCLUDED_CHECKS}` (why: `xtask/devkit/src/fuzz.rs`). Run time {took:.0} s.\n\n\
         | Group | Operations | Requests generated | Failed checks | Requests without an answer |\n\
         |---|---|---|---|---|\n",
        args.max_examples,
        commit(),
        now_utc(),
        Machine::probe()
    );
    for o in outcomes {
        let failures = if o.failures.is_empty() {
            "0".to_string()
        } else {
            o.failures
                .iter()
                .map(|(what, n, _)| format!("{what}: {n}"))
                .collect::<Vec<_>>()
                .join("; ")
        };
        let errors = if o.errors.is_empty() {
            "0".to_string()
        } else {
            o.errors
                .iter()
                .map(|(what, n)| format!("{what}: {n}"))
                .collect::<Vec<_>>()
                .join("; ")
        };
        s.push_str(&format!(
            "| `{}` | {} | {} | {failures} | {errors} |\n",
            o.group, o.operations, o.generated
        ));
    }
    s.push_str(&format!(
        "\nvirt-apiserver alive after the run: {}.\n",
        if alive { "yes" } else { "NO" }
    ));
    s
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

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let dir = crate::target_dir().join("fuzz");
    std::fs::create_dir_all(&dir)?;
    let st = venv(&dir.join("venv"))?;
    let bin = crate::dev_apiserver::build_apiserver(false)?;
    let mut env = DevEnv::start(Options {
        apiserver_bin: bin,
        ..Default::default()
    })
    .context("starting etcd and virt-apiserver")?;
    let mut outcomes = Vec::new();
    let mut published = Vec::new();
    for group in GROUPS {
        published.push(serde_json::from_str::<Value>(&fetch(
            &env,
            &format!("/openapi/v3/apis/{group}"),
        )?)?);
    }
    // One document, so that the stateful phase chains across the groups.
    let merged = with_links(without_streams(merged(&published)?));
    let label = GROUPS.join(" + ");
    {
        let schema = dir.join("openapi.json");
        std::fs::write(&schema, serde_json::to_vec(&merged)?)?;
        let report = dir.join("report.json");
        let _ = std::fs::remove_file(&report);
        println!("fuzzing {label}…");
        let mut cmd = Command::new(&st);
        // schemathesis keeps a cache of what it found in `.schemathesis/` of its working
        // directory: target/fuzz, not the workspace.
        cmd.current_dir(&dir)
            .arg("run")
            .arg(&schema)
            .args(["--url", &env.server_url])
            .arg("--tls-verify")
            .arg(&env.server_ca)
            .arg("--request-cert")
            .arg(&env.admin.cert)
            .arg("--request-cert-key")
            .arg(&env.admin.key)
            .args(["--checks", "all", "--exclude-checks", EXCLUDED_CHECKS])
            .args(["--phases", PHASES])
            .args(["--max-examples", &args.max_examples.to_string()])
            .args(["--request-timeout", "30", "--no-color", "--report", "json"])
            .arg("--report-json-path")
            .arg(&report);
        if let Some(seed) = args.seed {
            cmd.args(["--seed", &seed.to_string()]);
        }
        // schemathesis exits 1 on any finding: the report says which.
        cmd.status().context("running schemathesis")?;
        let text = std::fs::read_to_string(&report)
            .with_context(|| format!("schemathesis wrote no report to {}", report.display()))?;
        outcomes.push(outcome(&label, &serde_json::from_str(&text)?));
    }
    let alive = env.alive();
    let took = t0.elapsed().as_secs_f64();
    let text = section(&outcomes, &args, alive, took);
    println!("\n{text}");
    if !args.no_docs {
        let path = crate::workspace_root().join("docs/reliability.md");
        let doc = std::fs::read_to_string(&path).unwrap_or_else(|_| {
            "# Reliability\n\nGenerated sections: each names the command, commit and machine \
             that produced it.\n"
                .to_string()
        });
        std::fs::write(&path, replace_section(&doc, HEADING, &text))?;
        println!("wrote {}", path.display());
    }
    env.stop();
    if !alive {
        bail!("virt-apiserver died during the fuzzing run (log in its temp dir)");
    }
    let findings: Vec<String> = outcomes
        .iter()
        .filter(|o| !o.clean())
        .flat_map(|o| {
            o.failures
                .iter()
                .map(move |(what, n, ops)| format!("{}: {what} ×{n}: {}", o.group, ops.join(", ")))
                .chain(
                    o.errors
                        .iter()
                        .map(move |(what, n)| format!("{}: {what} ×{n}", o.group)),
                )
        })
        .collect();
    if !findings.is_empty() {
        bail!("schemathesis findings:\n{}", findings.join("\n"));
    }
    Ok(())
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
        assert!(!o.clean());
        let clean = outcome("g", &serde_json::json!({"failures": [], "errors": []}));
        assert!(clean.clean());
    }
}
