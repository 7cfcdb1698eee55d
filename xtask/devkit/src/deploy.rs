//! `cargo xtask deploy`: kubevirt-rs into the cluster of the current KUBECONFIG the way a user
//! installs it — virt-operator's manifest, then a KubeVirt resource — with the images built from
//! this tree (see docs/deploy.md).
//!
//! What it adds to the user's two `kubectl apply`: the images are built and imported into the
//! local cluster under one tag (a hash of all of them: unchanged code deploys nothing new, any
//! change rolls the components through the operator, as an upgrade by `imageTag` would), the
//! operator manifest is rendered for that tag, and it waits until the KubeVirt resource reports
//! that tag Deployed and Available. A direct install of an older `cargo xtask deploy` (no
//! operator, etcd in an emptyDir) is removed first: its objects carry fields the operator
//! would never take back.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use sha2::{Digest, Sha256};
use virt_operator::install::{self, OperatorImage};
use virt_operator::render::{GROUP, NAMESPACE, SUBRESOURCES_GROUP, components};

use crate::images;

const FIELD_MANAGER: &str = "kubevirt-rs-deploy";
const PART_OF: &str = "app.kubernetes.io/part-of=kubevirt-rs";
/// Arguments of `cargo xtask deploy`.
#[derive(clap::Args, Debug, Default)]
pub struct Args {
    /// Kubeconfig of the cluster [default: $KUBECONFIG, else target/cluster/kubeconfig].
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Use the images of the last `cargo xtask images` (target/images/images.json) instead of
    /// building.
    #[arg(long)]
    pub no_build: bool,
    /// How long to wait for the install (and for an upgrade to roll out).
    #[arg(long, default_value_t = 180)]
    pub timeout_seconds: u64,
    /// KubeVirt feature gates to enable, as in the KubeVirt resource's
    /// `configuration.developerConfiguration.featureGates` (e.g. `HostDisk`,
    /// `HotplugVolumes`: virt-operator passes those virt-apiserver enforces on to it); none by
    /// default.
    #[arg(long, value_delimiter = ',')]
    pub feature_gates: Vec<String>,
}

/// What a deploy measured.
#[derive(Debug)]
pub struct Report {
    pub kubectl: PathBuf,
}

pub fn run(args: Args) -> anyhow::Result<()> {
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

/// The one tag of a build's component images: a hash of their content-hash names.
pub fn release_tag(built: &images::Built) -> String {
    let mut h = Sha256::new();
    for name in built.components() {
        h.update(name.as_bytes());
        h.update(b"\n");
    }
    format!("dev-{}", &hex::encode(h.finalize())[..12])
}

/// Installs (or upgrades) through virt-operator and waits until the KubeVirt resource reports
/// the built images Deployed and Available.
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
    if !local {
        // The operator deploys `<registry>/<component>:<tag>`: the images must be in the
        // cluster under that name, which only the local cluster's import gives today.
        bail!(
            "{} is not the local cluster (target/cluster/kubeconfig): push the images of \
             target/images/ to a registry the cluster pulls from, then apply \
             manifests/virt-operator.yaml and a KubeVirt resource naming that registry and tag \
             (spec.imageRegistry, spec.imageTag; docs/deploy.md)",
            kubeconfig.display()
        );
    }
    let built = if args.no_build {
        let text = fs::read_to_string(images::record_path())
            .context("no images built yet: run `cargo xtask images` first")?;
        let built: images::Built = serde_json::from_str(&text)?;
        images::load_built(&built, &images::Load::Local)?;
        built
    } else {
        images::ensure(images::Load::Local)?
    };
    let tag = release_tag(&built);
    images::tag_components(&built, &tag, &images::Load::Local)?;
    let t_images = start.elapsed();

    check_no_crd(&k)?;
    remove_direct_install(&k)?;

    let dir = crate::target_dir().join("deploy");
    fs::create_dir_all(&dir)?;
    let operator_image = install::image(install::DEFAULT_REGISTRY, "virt-operator", &tag);
    let manifest = install::install_manifest_for(&OperatorImage {
        image: &operator_image,
        tag: &tag,
        version: Some(&tag),
    })?;
    let operator_file = dir.join("virt-operator.yaml");
    fs::write(&operator_file, manifest)?;
    let t_apply = Instant::now();
    k.apply(&operator_file, FIELD_MANAGER)?;
    k.run(
        &[
            "wait",
            "--for=condition=Established",
            "crd/kubevirts.kubevirt.io",
            "--timeout=60s",
        ],
        None,
    )?;
    let cr_file = dir.join("kubevirt-cr.json");
    fs::write(
        &cr_file,
        kubevirt_resource(&args.feature_gates)?.to_string(),
    )?;
    k.apply(&cr_file, FIELD_MANAGER)?;
    println!(
        "applied {} and {}",
        operator_file.display(),
        cr_file.display()
    );
    let timeout = Duration::from_secs(args.timeout_seconds);
    wait_deployed(&k, &tag, timeout).map_err(|e| anyhow::anyhow!("{e:#}\n{}", diagnose(&k)))?;
    for api in [format!("v1.{GROUP}"), format!("v1.{SUBRESOURCES_GROUP}")] {
        wait_available(&k, &api, timeout)
            .map_err(|e| anyhow::anyhow!("{e:#}\n{}", diagnose(&k)))?;
    }
    println!(
        "kubevirt-rs {tag} deployed through virt-operator: images {:.1} s, apply → KubeVirt \
         Deployed and Available {:.1} s; total {:.1} s",
        t_images.as_secs_f64(),
        t_apply.elapsed().as_secs_f64(),
        start.elapsed().as_secs_f64()
    );
    Ok(Report { kubectl: k.bin })
}

/// manifests/kubevirt-cr.yaml with the given feature gates.
fn kubevirt_resource(feature_gates: &[String]) -> anyhow::Result<serde_json::Value> {
    let mut cr: serde_json::Value = serde_saphyr::from_str(&install::example_cr()?)
        .context("manifests/kubevirt-cr.yaml does not parse")?;
    cr["spec"]["configuration"]["developerConfiguration"]["featureGates"] =
        serde_json::json!(feature_gates);
    Ok(cr)
}

/// Waits until the KubeVirt resource has seen its latest spec and reports `tag` Deployed
/// and Available, printing each change of its phase on the way.
fn wait_deployed(k: &Kubectl, tag: &str, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    let mut last = String::new();
    while Instant::now() < deadline {
        let kv = k.json(&["-n", NAMESPACE, "get", KUBEVIRT_RESOURCE, "kubevirt"])?;
        let now = kv.as_ref().map(|kv| deploy_state(kv, tag));
        match now {
            Some(Ok(())) => return Ok(()),
            Some(Err(why)) if why != last => {
                println!("  KubeVirt: {why}");
                last = why;
            }
            _ => {}
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    bail!("KubeVirt resource not Deployed at {tag} within {timeout:?}: {last}")
}

/// `Ok` when the KubeVirt resource reports `tag` deployed; else what it reports.
fn deploy_state(kv: &serde_json::Value, tag: &str) -> Result<(), String> {
    let st = &kv["status"];
    let phase = st["phase"].as_str().unwrap_or("");
    let observed = st["observedKubeVirtVersion"].as_str().unwrap_or("");
    let current = st["observedGeneration"] == kv["metadata"]["generation"];
    let cond = |t: &str| {
        st["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == t))
            .map(|c| {
                (
                    c["status"].as_str().unwrap_or("").to_string(),
                    c["message"].as_str().unwrap_or("").to_string(),
                )
            })
            .unwrap_or_default()
    };
    let (available, _) = cond("Available");
    if current && phase == "Deployed" && observed == tag && available == "True" {
        return Ok(());
    }
    let (progressing, message) = cond("Progressing");
    Err(format!(
        "phase {phase:?}, version {observed:?}, Available {available:?}, Progressing \
         {progressing:?} {message}"
    ))
}

/// A direct install of an older `cargo xtask deploy` (virt-apiserver without virt-operator):
/// removed, namespace and all (its etcd was an emptyDir in virt-apiserver's pod, so nothing
/// that would survive a restart is lost), before the operator installs.
fn remove_direct_install(k: &Kubectl) -> anyhow::Result<()> {
    let operator = k.json(&["-n", NAMESPACE, "get", "deployment", "virt-operator"])?;
    let apiserver = k.json(&[
        "-n",
        NAMESPACE,
        "get",
        "deployment",
        virt_operator::render::NAME,
    ])?;
    if operator.is_some() || apiserver.is_none() {
        return Ok(());
    }
    println!("removing the direct install of an earlier `cargo xtask deploy` (no virt-operator)");
    // APIServices before the namespace: one pointing at a deleted Service fails discovery,
    // and the namespace controller does not finish a deletion while discovery fails.
    k.run(
        &[
            "delete",
            "apiservice",
            &format!("v1.{GROUP}"),
            &format!("v1.{SUBRESOURCES_GROUP}"),
            "--ignore-not-found",
        ],
        None,
    )?;
    k.run(
        &[
            "delete",
            "namespace",
            NAMESPACE,
            "--ignore-not-found",
            "--timeout=180s",
        ],
        None,
    )?;
    k.run(
        &[
            "delete",
            "clusterrolebinding,clusterrole",
            "-l",
            PART_OF,
            "--ignore-not-found",
        ],
        None,
    )?;
    k.run(
        &[
            "-n",
            "kube-system",
            "delete",
            "rolebinding,role",
            "-l",
            PART_OF,
            "--ignore-not-found",
        ],
        None,
    )?;
    Ok(())
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

/// The KubeVirt resource by its CRD's own version: `kubevirt` alone resolves through
/// discovery to `kubevirt.io/v1` (virt-apiserver's proxy), which is absent until the
/// APIService serves, and which a kubectl discovery cache from an earlier cluster on the same
/// address may claim is there.
const KUBEVIRT_RESOURCE: &str = "kubevirts.v1alpha3.kubevirt.io";

/// What a deploy that timed out shows: each query on its own (one failing hides nothing
/// else), the operator's log from every replica (the leader is the one that acts), and the
/// namespace's events.
fn diagnose(k: &Kubectl) -> String {
    let mut out = String::new();
    let apiserver = format!("deployment/{}", virt_operator::render::NAME);
    let controller = format!("deployment/{}", components::CONTROLLER);
    let handler = format!("daemonset/{}", components::HANDLER);
    let status = format!("{KUBEVIRT_RESOURCE}/kubevirt");
    for args in [
        vec!["-n", NAMESPACE, "get", &status, "-o", "jsonpath={.status}"],
        vec![
            "-n",
            NAMESPACE,
            "get",
            "pods,deployments,daemonsets,sts,pvc",
            "-o",
            "wide",
        ],
        vec!["get", "apiservices"],
        vec![
            "get",
            "apiservice",
            "v1.kubevirt.io",
            "v1.subresources.kubevirt.io",
            "-o",
            "yaml",
        ],
        vec!["-n", NAMESPACE, "get", "events", "--sort-by=.lastTimestamp"],
        vec![
            "-n",
            NAMESPACE,
            "logs",
            "-l",
            "app.kubernetes.io/name=virt-operator",
            "--prefix",
            "--tail=60",
        ],
        vec![
            "-n",
            NAMESPACE,
            "logs",
            &apiserver,
            "--all-containers",
            "--tail=30",
        ],
        vec!["-n", NAMESPACE, "logs", &controller, "--tail=20"],
        vec!["-n", NAMESPACE, "logs", &handler, "--tail=20"],
    ] {
        out.push_str(&format!("--- kubectl {}\n", args.join(" ")));
        match k.run(&args, None) {
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
