//! `cargo xtask deploy`: kubevirt-rs into the cluster of the current KUBECONFIG (see
//! docs/deploy.md).
//!
//! The objects are rendered by the operator's library (`controllers/operator/src/render.rs`,
//! crate `virt-operator`), in two parts:
//! - cluster-independent objects (namespace, RBAC, Deployment, Service), committed as
//!   `manifests/kubevirt-rs.yaml` (`cargo xtask deploy --render`; a test keeps it current);
//! - per-cluster objects, rendered at deploy time into `target/deploy/` (it holds a private key):
//!   the serving certificate Secret, the ConfigMap with the cluster's client and front-proxy CAs,
//!   and the APIServices whose caBundle is our serving CA.
//!
//! Here: reading what the cluster already has (certificates and their CAs, the cluster's
//! CAs), rotating certificates as virt-operator does, applying, waiting.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use base64::Engine;
use sha2::{Digest, Sha256};
use virt_operator::render::{
    self, ClusterAuth, GROUP, MANIFEST, NAME, NAMESPACE, Params, SUBRESOURCES_GROUP, Tls,
    components, components::HandlerTls,
};

use crate::images;

const FIELD_MANAGER: &str = "kubevirt-rs-deploy";

/// Arguments of `cargo xtask deploy`.
#[derive(clap::Args, Debug, Default)]
pub struct Args {
    /// Kubeconfig of the cluster [default: $KUBECONFIG, else target/cluster/kubeconfig].
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Only (re)write manifests/kubevirt-rs.yaml and exit.
    #[arg(long)]
    pub render: bool,
    /// Use the images of the last `cargo xtask images` (target/images/images.json) instead of
    /// building.
    #[arg(long)]
    pub no_build: bool,
    /// Command that loads an image archive into a cluster that is not our local one (archive
    /// appended), e.g. `kind load image-archive --name kubevirt-rs`.
    #[arg(long)]
    pub load_cmd: Option<String>,
    /// How long to wait for the APIServices to become Available.
    #[arg(long, default_value_t = 180)]
    pub timeout_seconds: u64,
    /// KubeVirt feature gates to enable, as in the KubeVirt resource's
    /// `configuration.developerConfiguration.featureGates` (e.g. `HostDisk`); none by default.
    #[arg(long, value_delimiter = ',')]
    pub feature_gates: Vec<String>,
}

/// What a deploy measured.
#[derive(Debug)]
pub struct Report {
    pub kubectl: PathBuf,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.render {
        let path = crate::workspace_root().join(MANIFEST);
        fs::write(&path, render::committed_manifest()?)?;
        println!("wrote {}", path.display());
        return Ok(());
    }
    deploy(&args).map(|_| ())
}

/// The kubeconfig to use: the flag, `$KUBECONFIG`, or the local cluster's.
pub fn kubeconfig(flag: Option<PathBuf>) -> PathBuf {
    flag.or_else(|| {
        std::env::var_os("KUBECONFIG")
            .filter(|k| !k.is_empty())
            .map(PathBuf::from)
    })
    .unwrap_or_else(|| crate::target_dir().join("cluster/kubeconfig"))
}

/// kubectl matching the local cluster if it was built, else the one in PATH.
pub fn kubectl_binary() -> PathBuf {
    fs::read_dir(crate::target_dir().join("k8s"))
        .ok()
        .and_then(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path().join("bin/kubectl"))
                .find(|p| p.exists())
        })
        .unwrap_or_else(|| PathBuf::from("kubectl"))
}

/// kubectl against one cluster.
#[derive(Debug, Clone)]
pub struct Kubectl {
    pub bin: PathBuf,
    pub kubeconfig: PathBuf,
}

impl Kubectl {
    pub fn new(kubeconfig: PathBuf) -> Self {
        Self {
            bin: kubectl_binary(),
            kubeconfig,
        }
    }

    /// Runs kubectl; stdout on success.
    pub fn run(&self, args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
        use std::io::Write;
        let mut child = Command::new(&self.bin)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("running {}", self.bin.display()))?;
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(input.as_bytes())?;
        }
        let out = child.wait_with_output()?;
        if !out.status.success() {
            bail!(
                "kubectl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// An object as JSON, `None` when it does not exist.
    pub fn json(&self, args: &[&str]) -> anyhow::Result<Option<serde_json::Value>> {
        let mut a = args.to_vec();
        a.extend(["-o", "json", "--ignore-not-found"]);
        let out = self.run(&a, None)?;
        if out.trim().is_empty() {
            return Ok(None);
        }
        Ok(Some(serde_json::from_str(&out)?))
    }

    /// Server-side apply of a YAML stream.
    pub fn apply(&self, yaml_file: &Path, manager: &str) -> anyhow::Result<String> {
        let file = yaml_file.to_string_lossy();
        self.run(
            &[
                "apply",
                "--server-side",
                "--force-conflicts",
                &format!("--field-manager={manager}"),
                "-f",
                &file,
            ],
            None,
        )
    }
}

/// Deploys and waits until the APIServices are Available.
pub fn deploy(args: &Args) -> anyhow::Result<Report> {
    let start = Instant::now();
    let kubeconfig = kubeconfig(args.kubeconfig.clone());
    let k = Kubectl::new(kubeconfig.clone());
    let local = kubeconfig.canonicalize().ok()
        == crate::target_dir()
            .join("cluster/kubeconfig")
            .canonicalize()
            .ok();
    k.run(&["version"], None)
        .with_context(|| format!("cluster of {} not reachable", kubeconfig.display()))?;

    let load = match (&args.load_cmd, local, args.no_build) {
        (Some(c), _, _) => images::Load::Command(c.clone()),
        (None, true, _) => images::Load::Local,
        (None, false, true) => images::Load::None,
        (None, false, false) => bail!(
            "{} is not the local cluster: give --load-cmd (e.g. \"kind load image-archive \
             --name kubevirt-rs\") or load target/images/*.oci.tar yourself and use --no-build",
            kubeconfig.display()
        ),
    };
    let built = if args.no_build {
        let text = fs::read_to_string(images::record_path())
            .context("no images built yet: run `cargo xtask images` first")?;
        let built: images::Built = serde_json::from_str(&text)?;
        images::load_built(&built, &load)?;
        built
    } else {
        images::ensure(load)?
    };
    let t_images = start.elapsed();

    check_no_crd(&k)?;
    let auth = cluster_auth(&k)?;
    let (tls, handler_tls, ca_secrets) = certificates(&k)?;

    let mut annotations = BTreeMap::new();
    // virt-apiserver and virt-handler follow rotated certificate files (virt_certs::reload),
    // so certificates restart nothing; the cluster's client and front-proxy CAs are read once
    // at start: a change must restart the pod, which a changed pod template does.
    annotations.insert(
        "kubevirt-rs.io/auth-sha256".to_string(),
        sha256_hex(serde_json::to_string(&auth)?.as_bytes()),
    );
    // A new virt-apiserver pod is a new, empty etcd whose resourceVersions start again at 1:
    // watches resumed from the old store's versions would wait for revisions that never come.
    // So whatever replaces that pod (image, the cluster's CAs) restarts the watchers too.
    let store = (
        "kubevirt-rs.io/apiserver-sha256".to_string(),
        sha256_hex(
            format!(
                "{} {} {}",
                built.apiserver,
                built.etcd,
                serde_json::to_string(&annotations)?
            )
            .as_bytes(),
        ),
    );
    let handler_annotations = BTreeMap::from([store.clone()]);
    let controller_annotations = BTreeMap::from([store]);
    let params = Params {
        apiserver_image: built.apiserver.clone(),
        etcd_image: built.etcd.clone(),
        controller_image: built.controller.clone(),
        handler_image: built.handler.clone(),
        launcher_image: built.launcher.clone(),
        pod_annotations: annotations,
        handler_annotations,
        controller_annotations,
        feature_gates: render::apiserver_feature_gates(&args.feature_gates),
        ..Params::default()
    };
    let mut yaml = render::static_manifest(&params)?;
    // The CAs (with their keys) before the leaves they signed and the bundles naming them.
    yaml.push_str(&ca_secrets);
    yaml.push_str(&render::cluster_manifest(&tls, &auth)?);
    components::handler_secrets(&mut yaml, &handler_tls)?;
    let dir = crate::target_dir().join("deploy");
    fs::create_dir_all(&dir)?;
    let file = dir.join("kubevirt-rs.yaml");
    write_private(&file, &yaml)?;

    let t_apply = Instant::now();
    let applied = k.apply(&file, FIELD_MANAGER)?;
    println!(
        "applied {} ({} objects)",
        file.display(),
        applied.lines().count()
    );
    k.run(
        &[
            "-n",
            NAMESPACE,
            "rollout",
            "status",
            &format!("deployment/{NAME}"),
            &format!("--timeout={}s", args.timeout_seconds),
        ],
        None,
    )
    .map_err(|e| anyhow::anyhow!("{e:#}\n{}", diagnose(&k)))?;
    let t_rollout = t_apply.elapsed();
    for api in [format!("v1.{GROUP}"), format!("v1.{SUBRESOURCES_GROUP}")] {
        wait_available(&k, &api, Duration::from_secs(args.timeout_seconds))
            .map_err(|e| anyhow::anyhow!("{e:#}\n{}", diagnose(&k)))?;
    }
    for what in [
        format!("deployment/{}", components::CONTROLLER),
        format!("daemonset/{}", components::HANDLER),
    ] {
        k.run(
            &[
                "-n",
                NAMESPACE,
                "rollout",
                "status",
                &what,
                &format!("--timeout={}s", args.timeout_seconds),
            ],
            None,
        )
        .map_err(|e| anyhow::anyhow!("{e:#}\n{}", diagnose(&k)))?;
    }
    println!(
        "kubevirt-rs deployed: images {:.1} s, apply → rollout done {:.1} s, → APIServices \
         Available {:.1} s; total {:.1} s",
        t_images.as_secs_f64(),
        t_rollout.as_secs_f64(),
        t_apply.elapsed().as_secs_f64(),
        start.elapsed().as_secs_f64()
    );
    Ok(Report { kubectl: k.bin })
}

fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = fs::remove_file(path);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(text.as_bytes())?;
    Ok(())
}

fn sha256_hex(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

/// A CRD serving v1 of our group makes kube-apiserver own `v1.kubevirt.io` itself (reference
/// §1 R1.8): better to stop than to fight its autoregister controller. virt-operator's KubeVirt
/// CRD serves v1alpha3 only and is fine.
fn check_no_crd(k: &Kubectl) -> anyhow::Result<()> {
    let crds = k.run(
        &[
            "get",
            "crd",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.spec.versions[*].name}{\"\\n\"}{end}",
        ],
        None,
    )?;
    let ours: Vec<&str> = crds
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let name = words.next()?;
            (name.ends_with(&format!(".{GROUP}")) && words.any(|v| v == "v1")).then_some(name)
        })
        .collect();
    if !ours.is_empty() {
        bail!(
            "CRDs of {GROUP}/v1 exist ({}): kube-apiserver would serve the group itself; delete \
             them (and their objects) first",
            ours.join(", ")
        );
    }
    Ok(())
}

fn diagnose(k: &Kubectl) -> String {
    let mut out = String::new();
    for args in [
        vec!["-n", NAMESPACE, "get", "pods", "-o", "wide"],
        vec![
            "-n",
            NAMESPACE,
            "logs",
            &format!("deployment/{NAME}"),
            "--all-containers",
            "--tail=20",
        ],
        vec!["get", "apiservice", "v1.kubevirt.io", "-o", "yaml"],
        vec![
            "-n",
            NAMESPACE,
            "logs",
            "deployment/virt-controller",
            "--tail=20",
        ],
        vec![
            "-n",
            NAMESPACE,
            "logs",
            "daemonset/virt-handler",
            "--tail=20",
        ],
    ]
    .iter()
    {
        let a: Vec<&str> = args.iter().map(|s| &**s).collect();
        match k.run(&a, None) {
            Ok(s) => out.push_str(&s),
            Err(e) => out.push_str(&format!("{e:#}\n")),
        }
    }
    out
}

fn wait_available(k: &Kubectl, name: &str, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    let jsonpath = r#"jsonpath={.status.conditions[?(@.type=="Available")].status} {.status.conditions[?(@.type=="Available")].message}"#;
    let mut last = String::new();
    while Instant::now() < deadline {
        match k.run(&["get", "apiservice", name, "-o", jsonpath], None) {
            Ok(s) if s.starts_with("True") => return Ok(()),
            Ok(s) => last = s,
            Err(e) => last = format!("{e:#}"),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    bail!("APIService {name} not Available within {timeout:?}: {last}")
}

/// The cluster's CAs, copied from kube-system/extension-apiserver-authentication (kube-apiserver
/// keeps that ConfigMap current on every kind of cluster, kind and kubeadm included).
fn cluster_auth(k: &Kubectl) -> anyhow::Result<ClusterAuth> {
    let cm = k
        .json(&[
            "-n",
            "kube-system",
            "get",
            "configmap",
            "extension-apiserver-authentication",
        ])?
        .context("kube-system/extension-apiserver-authentication missing: is this a Kubernetes cluster with kube-apiserver?")?;
    let data = &cm["data"];
    let get = |key: &str| data[key].as_str().map(str::to_string);
    let requestheader_ca = get("requestheader-client-ca-file").context(
        "kube-apiserver runs without --requestheader-client-ca-file: aggregated API servers \
         cannot authenticate its requests (enable the front proxy: --requestheader-* and \
         --proxy-client-* flags)",
    )?;
    let client_ca = get("client-ca-file")
        .context("extension-apiserver-authentication has no client-ca-file")?;
    let names: Vec<String> = get("requestheader-allowed-names")
        .map(|s| serde_json::from_str(&s))
        .transpose()
        .context("requestheader-allowed-names is not a JSON list")?
        .unwrap_or_default();
    Ok(ClusterAuth {
        client_ca,
        requestheader_ca,
        allowed_names: names.join(","),
    })
}

/// The certificates of the two trust domains a dev deploy has (virt-apiserver serving,
/// virt-handler mTLS; its etcd runs in virt-apiserver's pod without TLS), decided and issued
/// exactly as virt-operator does (`virt_operator::rotation`: one kept CA per domain, leaves
/// renewed from it when due, a new CA published before it signs), from the Secrets and the
/// APIService caBundle in the cluster. Returns the material to render and the CA Secrets,
/// which the same apply writes first.
fn certificates(k: &Kubectl) -> anyhow::Result<(Tls, HandlerTls, String)> {
    use virt_operator::rotation::{self, Domain};
    let secret = |name: &str| -> anyhow::Result<Option<k8s_openapi::api::core::v1::Secret>> {
        k.json(&["-n", NAMESPACE, "get", "secret", name])?
            .map(serde_json::from_value)
            .transpose()
            .with_context(|| format!("reading Secret {NAMESPACE}/{name}"))
    };
    let published_bundle = k
        .json(&["get", "apiservice", &format!("v1.{GROUP}")])?
        .and_then(|a| a["spec"]["caBundle"].as_str().map(str::to_string))
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .and_then(|b| String::from_utf8(b).ok());
    let policy = virt_operator::policy::CertPolicy::default();
    let now = time::OffsetDateTime::now_utc();
    let mut ca_secrets = String::new();
    let mut states = BTreeMap::new();
    for domain in [Domain::Apiserver, Domain::Handler] {
        // No etcd domain here: the host only matters to etcd's certificates.
        let specs = rotation::leaf_specs(domain, "");
        let ca = secret(domain.ca_secret())?;
        let leaves = specs
            .iter()
            .map(|s| secret(s.secret))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let extra = match domain {
            Domain::Apiserver => published_bundle.iter().cloned().collect(),
            _ => Vec::new(),
        };
        let r = rotation::rotate(
            domain,
            &specs,
            ca.as_ref(),
            &leaves,
            extra,
            &policy,
            now,
            false,
        )?;
        if r.decision.changes() {
            println!("{} certificates: {:?}", domain.describe(), r.decision.step);
        }
        render::push_doc(&mut ca_secrets, &rotation::ca_secret(domain, &r.state.ca))?;
        states.insert(domain, r.state);
    }
    let serving = states
        .get(&Domain::Apiserver)
        .and_then(rotation::serving_tls)
        .context("no virt-apiserver serving certificate was issued")?;
    let handler = states
        .get(&Domain::Handler)
        .and_then(rotation::handler_tls)
        .context("no virt-handler certificates were issued")?;
    Ok((serving, handler, ca_secrets))
}
