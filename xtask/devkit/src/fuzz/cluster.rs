//! `cargo xtask fuzz --cluster`: the same fuzzing through kube-apiserver's aggregator on the
//! local cluster (`cargo xtask up`), so the requests take a user's path (kube-apiserver's
//! authentication and the front-proxy headers, virt-apiserver's SubjectAccessReviews) and the
//! VM and VMI actions the stateful phase reaches act on real objects: a `start` makes a VMI
//! that virt-controller schedules, a `pause` goes to virt-handler and the launcher.
//!
//! Every namespaced request goes to one namespace made for the run ([`NAMESPACE`]; the
//! document's `namespace` parameter is pinned to it) and deleted at the end, which must
//! finish (finalizers released, VMs stopped) within [`CLEANUP`]. The `kubevirts` paths are
//! left out here: a KubeVirt resource drives virt-operator, which installs the whole stack,
//! so fuzzing it on a live cluster would fuzz the installation, not the API (the standalone
//! run covers that API). The run fails when a kubevirt-rs pod restarted or was replaced,
//! or is not ready afterwards.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use base64::Engine;
use serde_json::Value;

/// The namespace the run creates and deletes.
pub const NAMESPACE: &str = "kubevirt-rs-fuzz";

/// Where kubevirt-rs runs on the local cluster.
const INSTALL_NAMESPACE: &str = "kubevirt";

/// How long the namespace may take to go, with everything the run made in it.
const CLEANUP: Duration = Duration::from_secs(600);

/// The local cluster as the fuzzer's target.
pub struct Cluster {
    pub url: String,
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    kubeconfig: PathBuf,
    kubectl: PathBuf,
    /// kubevirt-rs's pods before the run: name → (uid, restarts).
    pods_before: BTreeMap<String, (String, i64)>,
}

/// What the run left behind.
pub struct Health {
    /// One line per problem; empty when none.
    pub problems: Vec<String>,
    /// How long deleting the namespace took; `None` when it did not finish.
    pub cleanup: Option<Duration>,
}

impl Cluster {
    /// Reads the kubeconfig's current context into files schemathesis takes, and makes the
    /// run's namespace afresh.
    pub fn prepare(dir: &Path, kubeconfig: PathBuf) -> anyhow::Result<Self> {
        let kubectl = crate::deploy::kubectl_binary();
        // kubectl resolves the current context (and any KUBECONFIG merging) as users see it.
        let out = Command::new(&kubectl)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["config", "view", "--raw", "--minify", "-o", "json"])
            .output()
            .with_context(|| format!("running {}", kubectl.display()))?;
        if !out.status.success() {
            bail!(
                "kubectl config view: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let config: Value = serde_json::from_slice(&out.stdout)?;
        let decode = |what: &str, data: &Value| -> anyhow::Result<Vec<u8>> {
            let data = data.as_str().with_context(|| {
                format!(
                    "{}: no {what}-data in its current context (a client certificate is needed)",
                    kubeconfig.display()
                )
            })?;
            base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .with_context(|| format!("{what}-data is not base64"))
        };
        let cluster = &config["clusters"][0]["cluster"];
        let user = &config["users"][0]["user"];
        let files = dir.join("cluster");
        std::fs::create_dir_all(&files)?;
        let write = |name: &str, bytes: Vec<u8>| -> anyhow::Result<PathBuf> {
            let p = files.join(name);
            std::fs::write(&p, bytes)?;
            Ok(p)
        };
        let ca = write(
            "ca.crt",
            decode(
                "certificate-authority",
                &cluster["certificate-authority-data"],
            )?,
        )?;
        let cert = write(
            "admin.crt",
            decode("client-certificate", &user["client-certificate-data"])?,
        )?;
        let key = write("admin.key", decode("client-key", &user["client-key-data"])?)?;
        let url = cluster["server"]
            .as_str()
            .context("the kubeconfig's cluster has no server")?
            .trim_end_matches('/')
            .to_string();
        let mut c = Self {
            url,
            ca,
            cert,
            key,
            kubeconfig,
            kubectl,
            pods_before: BTreeMap::new(),
        };
        c.delete_namespace()?;
        c.kubectl(&["create", "namespace", NAMESPACE])?;
        c.pods_before = c.pods()?;
        if c.pods_before.is_empty() {
            bail!(
                "no kubevirt-rs pods in namespace {INSTALL_NAMESPACE}: deploy it first (cargo xtask up)"
            );
        }
        Ok(c)
    }

    fn kubectl(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(&self.kubectl)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .with_context(|| format!("running {}", self.kubectl.display()))?;
        if !out.status.success() {
            bail!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// GET `path` through kube-apiserver.
    pub fn fetch(&self, path: &str) -> anyhow::Result<String> {
        self.kubectl(&["get", "--raw", path])
    }

    /// The group versions kubevirt-rs serves through the aggregator: its APIServices.
    pub fn group_versions(&self) -> anyhow::Result<Vec<String>> {
        let list: Value = serde_json::from_str(&self.kubectl(&[
            "get",
            "apiservices",
            "-l",
            "app.kubernetes.io/part-of=kubevirt-rs",
            "-o",
            "json",
        ])?)?;
        Ok(served_group_versions(&list))
    }

    /// kubevirt-rs's pods: name → (uid, restarts of all containers).
    fn pods(&self) -> anyhow::Result<BTreeMap<String, (String, i64)>> {
        let list: Value = serde_json::from_str(&self.kubectl(&[
            "-n",
            INSTALL_NAMESPACE,
            "get",
            "pods",
            "-o",
            "json",
        ])?)?;
        Ok(pod_restarts(&list))
    }

    fn delete_namespace(&self) -> anyhow::Result<Duration> {
        let t = Instant::now();
        self.kubectl(&[
            "delete",
            "namespace",
            NAMESPACE,
            "--ignore-not-found",
            "--wait=true",
            &format!("--timeout={}s", CLEANUP.as_secs()),
        ])
        .with_context(|| {
            format!(
                "namespace {NAMESPACE} not gone within {CLEANUP:?}: something the run made is stuck (kubectl -n {NAMESPACE} get vm,vmi,pods)"
            )
        })?;
        Ok(t.elapsed())
    }

    /// Deletes the run's namespace and says what is wrong with kubevirt-rs afterwards.
    pub fn finish(&self) -> Health {
        let mut problems = Vec::new();
        let cleanup = match self.delete_namespace() {
            Ok(d) => Some(d),
            Err(e) => {
                problems.push(format!("{e:#}"));
                None
            }
        };
        match self.pods() {
            Ok(after) => {
                for p in pod_changes(&self.pods_before, &after) {
                    problems.push(match self.last_words(&p.pod) {
                        Some(words) if p.restarted => {
                            format!("{} (its last words: {words})", p.what)
                        }
                        _ => p.what,
                    });
                }
            }
            Err(e) => problems.push(format!("listing kubevirt-rs's pods: {e:#}")),
        }
        match self.kubectl(&[
            "-n",
            INSTALL_NAMESPACE,
            "get",
            "pods",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
        ]) {
            Ok(text) => problems.extend(
                text.lines()
                    .filter(|l| !l.trim().is_empty() && !l.ends_with(" True"))
                    .map(|l| format!("not ready after the run: {l}")),
            ),
            Err(e) => problems.push(format!("{e:#}")),
        }
        if let Err(e) = self.fetch("/apis/kubevirt.io/v1") {
            problems.push(format!("the API does not answer after the run: {e:#}"));
        }
        Health { problems, cleanup }
    }
}

impl Cluster {
    /// The last line a restarted pod's previous container wrote: why it went.
    fn last_words(&self, pod: &str) -> Option<String> {
        let text = self
            .kubectl(&[
                "-n",
                INSTALL_NAMESPACE,
                "logs",
                pod,
                "--previous",
                "--tail=1",
            ])
            .ok()?;
        let line = text.lines().last()?.trim().to_string();
        (!line.is_empty()).then(|| line.chars().take(300).collect())
    }
}

/// A change to one of kubevirt-rs's pods during the run.
#[derive(Debug, PartialEq)]
pub struct PodChange {
    pub pod: String,
    pub restarted: bool,
    pub what: String,
}

/// `group/version` of every APIService in `list` backed by a Service (not kube-apiserver's
/// own), sorted.
pub fn served_group_versions(list: &Value) -> Vec<String> {
    let mut out: Vec<String> = list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|a| a["spec"]["service"].is_object())
        .filter_map(|a| {
            Some(format!(
                "{}/{}",
                a["spec"]["group"].as_str()?,
                a["spec"]["version"].as_str()?
            ))
        })
        .collect();
    out.sort();
    out
}

/// name → (uid, restarts summed over containers) of a pod list.
pub fn pod_restarts(list: &Value) -> BTreeMap<String, (String, i64)> {
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| {
            let name = p["metadata"]["name"].as_str()?.to_string();
            let uid = p["metadata"]["uid"].as_str().unwrap_or("").to_string();
            let restarts = p["status"]["containerStatuses"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["restartCount"].as_i64())
                .sum();
            Some((name, (uid, restarts)))
        })
        .collect()
}

/// Pods that restarted, were replaced or are gone between `before` and `after`.
pub fn pod_changes(
    before: &BTreeMap<String, (String, i64)>,
    after: &BTreeMap<String, (String, i64)>,
) -> Vec<PodChange> {
    let change = |pod: &str, restarted: bool, what: String| PodChange {
        pod: pod.to_string(),
        restarted,
        what,
    };
    let mut out = Vec::new();
    for (name, (uid, restarts)) in before {
        match after.get(name) {
            None => out.push(change(
                name,
                false,
                format!("pod {name} is gone (replaced?)"),
            )),
            Some((u, _)) if u != uid => {
                out.push(change(name, false, format!("pod {name} was replaced")))
            }
            Some((_, r)) if r > restarts => out.push(change(
                name,
                true,
                format!("pod {name} restarted {} time(s)", r - restarts),
            )),
            Some(_) => {}
        }
    }
    for name in after.keys().filter(|n| !before.contains_key(*n)) {
        out.push(change(
            name,
            false,
            format!("pod {name} appeared during the run"),
        ));
    }
    out
}

/// `schema` with every `namespace` path parameter pinned to `ns` and without the paths of
/// `kubevirts` (see the module documentation).
pub fn for_cluster(mut schema: Value, ns: &str) -> Value {
    if let Some(paths) = schema["paths"].as_object_mut() {
        paths.retain(|path, _| !path.split('/').any(|s| s == "kubevirts"));
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
                for p in params.into_iter().flatten() {
                    if p["name"] == "namespace" && p["in"] == "path" {
                        p["schema"] = serde_json::json!({"type": "string", "enum": [ns]});
                    }
                }
            }
        }
    }
    schema
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn only_apiservices_backed_by_a_service_are_fuzzed() {
        let list = json!({"items": [
            {"spec": {"group": "pool.kubevirt.io", "version": "v1beta1", "service": {"name": "x"}}},
            {"spec": {"group": "kubevirt.io", "version": "v1", "service": {"name": "x"}}},
            {"spec": {"group": "apps", "version": "v1"}}
        ]});
        assert_eq!(
            served_group_versions(&list),
            ["kubevirt.io/v1", "pool.kubevirt.io/v1beta1"]
        );
    }

    #[test]
    fn restarts_replacements_and_new_pods_are_problems() {
        let before = BTreeMap::from([
            ("a".to_string(), ("u1".to_string(), 0)),
            ("b".to_string(), ("u2".to_string(), 1)),
            ("c".to_string(), ("u3".to_string(), 0)),
            ("d".to_string(), ("u4".to_string(), 0)),
        ]);
        let after = BTreeMap::from([
            ("a".to_string(), ("u1".to_string(), 0)),
            ("b".to_string(), ("u2".to_string(), 2)),
            ("c".to_string(), ("u9".to_string(), 0)),
            ("e".to_string(), ("u5".to_string(), 0)),
        ]);
        let what: Vec<String> = pod_changes(&before, &after)
            .into_iter()
            .map(|c| c.what)
            .collect();
        assert_eq!(
            what,
            [
                "pod b restarted 1 time(s)",
                "pod c was replaced",
                "pod d is gone (replaced?)",
                "pod e appeared during the run"
            ]
        );
        let list = json!({"items": [{"metadata": {"name": "p", "uid": "u"},
            "status": {"containerStatuses": [{"restartCount": 2}, {"restartCount": 1}]}}]});
        assert_eq!(pod_restarts(&list)["p"], ("u".to_string(), 3));
    }

    #[test]
    fn the_namespace_is_pinned_and_kubevirts_left_out() {
        let schema = json!({"paths": {
            "/apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachines/{name}": {
                "parameters": [
                    {"name": "namespace", "in": "path", "schema": {"type": "string"}},
                    {"name": "name", "in": "path", "schema": {"type": "string"}}
                ],
                "get": {"parameters": [{"name": "namespace", "in": "path", "schema": {"type": "string"}}]}
            },
            "/apis/kubevirt.io/v1/namespaces/{namespace}/kubevirts": {"get": {}}
        }});
        let out = for_cluster(schema, "fz");
        let item =
            &out["paths"]["/apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachines/{name}"];
        assert_eq!(item["parameters"][0]["schema"]["enum"], json!(["fz"]));
        assert_eq!(item["parameters"][1]["schema"], json!({"type": "string"}));
        assert_eq!(
            item["get"]["parameters"][0]["schema"]["enum"],
            json!(["fz"])
        );
        assert!(out["paths"].as_object().unwrap().len() == 1);
    }
}
