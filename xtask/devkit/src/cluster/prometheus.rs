//! A real Prometheus for the local cluster (`cargo xtask up --prometheus`, or `cargo xtask
//! cluster up --prometheus` on a cluster kubevirt-rs is deployed on), scraping kubevirt-rs the
//! way a cluster's Prometheus does, so that dashboards, recording rules and alerts written for
//! KubeVirt are checked against real scrapes (e2e/tests/metrics.rs).
//!
//! - Prometheus is built from its Go module at the version `e2e/prometheus/go.mod` pins and
//!   runs as a host process beside the control plane (like local-path-provisioner), listening
//!   on [`LISTEN`] only.
//! - The prometheus-operator's `ServiceMonitor` and `PrometheusRule` CRDs (from its module at
//!   [`OPERATOR_VERSION`]) are installed, and the ServiceAccount KubeVirt looks for by default
//!   (`monitoring/prometheus-k8s`) is created: that is what makes virt-operator create its
//!   ServiceMonitor, PrometheusRule and the Role that lets Prometheus read the endpoints.
//! - The prometheus-operator itself is not run: this module does its one job here, turning the
//!   ServiceMonitors into scrape configurations and the PrometheusRules into rule files
//!   ([`scrape_config`], [`rule_file`]), the way the operator generates them. Prometheus then
//!   discovers the targets through kube-apiserver as that ServiceAccount, with a token from the
//!   TokenRequest API: a Role virt-operator got wrong shows as no targets.
//!
//! Re-running `up` re-reads the objects and reloads Prometheus (SIGHUP).

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde_json::{Value, json};

use super::daemon::{self, Daemon};
use super::{Layout, Progress, kube_build};

/// Where Prometheus answers (its web UI and HTTP API): loopback only.
pub const LISTEN: &str = "127.0.0.1:9090";
/// KubeVirt's second default monitor namespace (kube-prometheus'), and its default account.
pub const NAMESPACE: &str = "monitoring";
pub const ACCOUNT: &str = "prometheus-k8s";
/// The prometheus-operator release whose CRDs are installed.
pub const OPERATOR_MODULE: &str = "github.com/prometheus-operator/prometheus-operator";
pub const OPERATOR_VERSION: &str = "v0.85.0";
const CRDS: [&str; 2] = [
    "monitoring.coreos.com_servicemonitors.yaml",
    "monitoring.coreos.com_prometheusrules.yaml",
];
const DAEMON: &str = "prometheus";
/// Short, so that e2e sees a counter move within seconds (a cluster's is 30 s).
const SCRAPE_INTERVAL: &str = "5s";
/// The daemon's name, for `down`'s stop order.
pub const DAEMON_NAME: &str = DAEMON;

/// Prometheus, built from the module `e2e/prometheus/go.mod` pins, with only Kubernetes
/// discovery: the cloud discoveries are most of Prometheus' build.
const TOOL: kube_build::GoTool = kube_build::GoTool {
    dir: "e2e/prometheus",
    module: "github.com/prometheus/prometheus",
    package: "github.com/prometheus/prometheus/cmd/prometheus",
    tags: &["remove_all_sd", "enable_kubernetes_sd"],
    name: "prometheus",
    cache: "prometheus",
};

/// The CRD files of the pinned prometheus-operator module (downloaded once by `go`).
fn operator_crds() -> anyhow::Result<Vec<PathBuf>> {
    let go = kube_build::go_binary().context("Go is not installed (needed for the CRDs)")?;
    let out = std::process::Command::new(go)
        .args(["mod", "download", "-json"])
        .arg(format!("{OPERATOR_MODULE}@{OPERATOR_VERSION}"))
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=mod")
        .current_dir(std::env::temp_dir())
        .output()
        .context("running go mod download")?;
    let info: Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "go mod download {OPERATOR_MODULE}@{OPERATOR_VERSION}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )
    })?;
    let dir = info["Dir"].as_str().with_context(|| {
        format!(
            "go mod download {OPERATOR_MODULE}@{OPERATOR_VERSION}: {}",
            info["Error"].as_str().unwrap_or("no directory")
        )
    })?;
    Ok(CRDS
        .iter()
        .map(|f| {
            Path::new(dir)
                .join("example/prometheus-operator-crd")
                .join(f)
        })
        .collect())
}

/// How Prometheus reaches kube-apiserver for discovery.
#[derive(Debug, Clone)]
pub struct ApiAccess {
    pub server: String,
    pub ca_file: PathBuf,
    pub token_file: PathBuf,
}

/// Prometheus' label name for a Kubernetes label: what is not `[a-zA-Z0-9_]` becomes `_`.
fn sanitize(label: &str) -> String {
    label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

/// The scrape configurations the prometheus-operator generates for one ServiceMonitor (role
/// `endpoints`, one job per endpoint, its target labels `namespace`, `service`, `pod`,
/// `container`, `endpoint`, `job`), for what ServiceMonitors use here: `selector.matchLabels`,
/// `namespaceSelector.matchNames`, and per endpoint `port`, `scheme`, `path`, `interval`,
/// `honorLabels` and `tlsConfig.insecureSkipVerify`.
pub fn scrape_config(service_monitor: &Value, api: &ApiAccess) -> Vec<Value> {
    let meta = &service_monitor["metadata"];
    let ns = meta["namespace"].as_str().unwrap_or_default();
    let name = meta["name"].as_str().unwrap_or_default();
    let spec = &service_monitor["spec"];
    let namespaces: Vec<Value> = match spec["namespaceSelector"]["matchNames"].as_array() {
        Some(names) if !names.is_empty() => names.clone(),
        _ => vec![json!(ns)],
    };
    let mut selector: Vec<Value> = Vec::new();
    if let Some(labels) = spec["selector"]["matchLabels"].as_object() {
        for (k, v) in labels {
            let k = sanitize(k);
            selector.push(json!({
                "action": "keep",
                "source_labels": [
                    format!("__meta_kubernetes_service_label_{k}"),
                    format!("__meta_kubernetes_service_labelpresent_{k}"),
                ],
                "regex": format!("({});true", v.as_str().unwrap_or_default()),
            }));
        }
    }
    let endpoints = spec["endpoints"].as_array().cloned().unwrap_or_default();
    endpoints
        .iter()
        .enumerate()
        .map(|(i, ep)| {
            let port = ep["port"].as_str().unwrap_or_default();
            let mut relabel = vec![json!({
                "source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"
            })];
            relabel.extend(selector.iter().cloned());
            relabel.push(json!({
                "action": "keep",
                "source_labels": ["__meta_kubernetes_endpoint_port_name"],
                "regex": port,
            }));
            for (kind, label) in [("Node", "node"), ("Pod", "pod")] {
                relabel.push(json!({
                    "source_labels": [
                        "__meta_kubernetes_endpoint_address_target_kind",
                        "__meta_kubernetes_endpoint_address_target_name",
                    ],
                    "separator": ";",
                    "regex": format!("{kind};(.*)"),
                    "replacement": "${1}",
                    "target_label": label,
                }));
            }
            for (source, target) in [
                ("__meta_kubernetes_namespace", "namespace"),
                ("__meta_kubernetes_service_name", "service"),
                ("__meta_kubernetes_pod_name", "pod"),
                ("__meta_kubernetes_pod_container_name", "container"),
                ("__meta_kubernetes_service_name", "job"),
            ] {
                relabel.push(json!({"source_labels": [source], "target_label": target}));
            }
            relabel.push(json!({"target_label": "endpoint", "replacement": port}));
            let mut job = json!({
                "job_name": format!("serviceMonitor/{ns}/{name}/{i}"),
                "honor_labels": ep["honorLabels"].as_bool().unwrap_or(false),
                "scheme": ep["scheme"].as_str().unwrap_or("http"),
                "metrics_path": ep["path"].as_str().unwrap_or("/metrics"),
                "kubernetes_sd_configs": [{
                    "role": "endpoints",
                    "namespaces": {"names": namespaces},
                    "api_server": api.server,
                    "authorization": {"credentials_file": api.token_file},
                    "tls_config": {"ca_file": api.ca_file},
                }],
                "relabel_configs": relabel,
            });
            if let Some(interval) = ep["interval"].as_str() {
                job["scrape_interval"] = json!(interval);
            }
            if ep["tlsConfig"]["insecureSkipVerify"].as_bool() == Some(true) {
                job["tls_config"] = json!({"insecure_skip_verify": true});
            }
            job
        })
        .collect()
}

/// A PrometheusRule's rule file: its `spec` is Prometheus' rule-file format (`groups`).
pub fn rule_file(prometheus_rule: &Value) -> Value {
    json!({"groups": prometheus_rule["spec"]["groups"].clone()})
}

/// Prometheus' configuration: JSON is YAML, so it is written as JSON.
pub fn config(scrape_configs: Vec<Value>, rule_glob: &Path) -> Value {
    json!({
        "global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
        "rule_files": [rule_glob],
        "scrape_configs": scrape_configs,
    })
}

fn items(list: &str) -> anyhow::Result<Vec<Value>> {
    let v: Value = serde_json::from_str(list).context("decoding a kubectl list")?;
    Ok(v["items"].as_array().cloned().unwrap_or_default())
}

/// Builds (once), configures from the cluster's ServiceMonitors and PrometheusRules and
/// (re)starts Prometheus; idempotent.
pub fn up(layout: &Layout, progress: &Progress, bin: &Path) -> anyhow::Result<()> {
    let prometheus = TOOL.ensure(layout, progress, " (first time: a few minutes)")?;
    let kubectl = |args: &[&str]| super::kubectl(layout, bin, args);
    for crd in operator_crds()? {
        kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &crd.to_string_lossy(),
        ])?;
    }
    let account = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": ACCOUNT, "namespace": NAMESPACE}},
    ]});
    let dir = layout.state.join("prometheus");
    let rules = dir.join("rules");
    fs::create_dir_all(&rules)?;
    let account_file = dir.join("account.json");
    fs::write(&account_file, serde_json::to_string(&account)?)?;
    kubectl(&[
        "apply",
        "--server-side",
        "-f",
        &account_file.to_string_lossy(),
    ])?;
    // A day: `up` renews it, and Prometheus reads the file on every request.
    let token = kubectl(&[
        "create",
        "token",
        ACCOUNT,
        "-n",
        NAMESPACE,
        "--duration=24h",
    ])?;
    let api = ApiAccess {
        server: format!("https://127.0.0.1:{}", super::APISERVER_PORT),
        ca_file: layout.state.join("pki/ca.crt"),
        token_file: dir.join("token"),
    };
    fs::write(&api.token_file, token.trim())?;

    // With kubevirt-rs deployed, virt-operator makes its ServiceMonitor and PrometheusRule
    // once it finds the account above: at its next reconcile, within a minute.
    let deployed = kubectl(&[
        "get",
        "service",
        "-n",
        "kubevirt",
        "--ignore-not-found",
        "-o",
        "name",
        "kubevirt-prometheus-metrics",
    ])?;
    let list = |kind: &str| -> anyhow::Result<Vec<Value>> {
        items(&kubectl(&["get", kind, "-A", "-o", "json"])?)
    };
    if !deployed.trim().is_empty() {
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while list("servicemonitors")?.is_empty() || list("prometheusrules")?.is_empty() {
            if std::time::Instant::now() > deadline {
                anyhow::bail!(
                    "kubevirt-rs is deployed, but virt-operator made no ServiceMonitor and \
                     PrometheusRule within 120 s of {NAMESPACE}/{ACCOUNT} existing; see \
                     `kubectl -n kubevirt logs deployment/virt-operator`"
                );
            }
            std::thread::sleep(Duration::from_secs(2));
        }
    }
    let monitors = list("servicemonitors")?;
    let scrape: Vec<Value> = monitors
        .iter()
        .flat_map(|m| scrape_config(m, &api))
        .collect();
    let jobs = scrape.len();
    for old in fs::read_dir(&rules)? {
        fs::remove_file(old?.path())?;
    }
    let prometheus_rules = list("prometheusrules")?;
    for r in &prometheus_rules {
        let name = format!(
            "{}-{}.yaml",
            r["metadata"]["namespace"].as_str().unwrap_or_default(),
            r["metadata"]["name"].as_str().unwrap_or_default()
        );
        fs::write(rules.join(name), serde_json::to_string(&rule_file(r))?)?;
    }
    let config_file = dir.join("prometheus.yaml");
    fs::write(
        &config_file,
        serde_json::to_string_pretty(&config(scrape, &rules.join("*.yaml")))?,
    )?;

    let d = Daemon::new(DAEMON, prometheus)
        .arg(format!("--config.file={}", config_file.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg("--storage.tsdb.retention.time=1d")
        .arg(format!("--web.listen-address={LISTEN}"));
    let (pid, reused) = d.ensure(layout)?;
    if reused {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGHUP,
        )
        .context("asking Prometheus to reload")?;
    }
    let addr = LISTEN.parse()?;
    daemon::wait_for(layout, DAEMON, "ready", Duration::from_secs(60), || {
        Ok(daemon::http_status(addr, "/-/ready")? == 200)
    })?;
    progress.step(&format!(
        "Prometheus {} (pid {pid}) on http://{LISTEN}: {} scrape jobs from {} ServiceMonitor(s), \
         rules from {} PrometheusRule(s)",
        if reused { "reloaded" } else { "started" },
        jobs,
        monitors.len(),
        prometheus_rules.len(),
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn api() -> ApiAccess {
        ApiAccess {
            server: "https://127.0.0.1:6443".into(),
            ca_file: "/ca.crt".into(),
            token_file: "/token".into(),
        }
    }

    #[test]
    fn the_pinned_version_comes_from_go_mod() {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        assert!(TOOL.version(&root).unwrap().starts_with("v0."));
    }

    #[test]
    fn a_service_monitor_becomes_the_operators_endpoints_job() {
        let sm = json!({
            "metadata": {"name": "prometheus-kubevirt-rules", "namespace": "monitoring"},
            "spec": {
                "selector": {"matchLabels": {"prometheus.kubevirt.io": "true"}},
                "namespaceSelector": {"matchNames": ["kubevirt"]},
                "endpoints": [{"port": "metrics", "scheme": "http", "honorLabels": true}],
            },
        });
        let jobs = scrape_config(&sm, &api());
        assert_eq!(jobs.len(), 1);
        let job = &jobs[0];
        assert_eq!(
            job["job_name"],
            "serviceMonitor/monitoring/prometheus-kubevirt-rules/0"
        );
        assert_eq!(job["honor_labels"], true);
        assert_eq!(job["scheme"], "http");
        let sd = &job["kubernetes_sd_configs"][0];
        assert_eq!(sd["role"], "endpoints");
        assert_eq!(sd["namespaces"]["names"], json!(["kubevirt"]));
        assert_eq!(sd["authorization"]["credentials_file"], "/token");
        let relabel = job["relabel_configs"].as_array().unwrap();
        assert!(relabel.contains(&json!({
            "action": "keep",
            "source_labels": [
                "__meta_kubernetes_service_label_prometheus_kubevirt_io",
                "__meta_kubernetes_service_labelpresent_prometheus_kubevirt_io",
            ],
            "regex": "(true);true",
        })));
        assert!(relabel.contains(&json!({
            "action": "keep",
            "source_labels": ["__meta_kubernetes_endpoint_port_name"],
            "regex": "metrics",
        })));
        for target in [
            "namespace",
            "service",
            "pod",
            "container",
            "job",
            "endpoint",
        ] {
            assert!(
                relabel.iter().any(|r| r["target_label"] == target),
                "{target}"
            );
        }
    }

    #[test]
    fn without_match_names_the_monitors_own_namespace_is_scraped() {
        let sm = json!({
            "metadata": {"name": "m", "namespace": "apps"},
            "spec": {"endpoints": [{"port": "web", "interval": "10s",
                                    "tlsConfig": {"insecureSkipVerify": true}}]},
        });
        let job = &scrape_config(&sm, &api())[0];
        assert_eq!(
            job["kubernetes_sd_configs"][0]["namespaces"]["names"],
            json!(["apps"])
        );
        assert_eq!(job["scrape_interval"], "10s");
        assert_eq!(job["tls_config"]["insecure_skip_verify"], true);
        assert_eq!(job["honor_labels"], false);
    }

    #[test]
    fn a_prometheus_rule_is_its_groups() {
        let r =
            json!({"spec": {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "1"}]}]}});
        assert_eq!(rule_file(&r)["groups"][0]["rules"][0]["alert"], "A");
    }
}
