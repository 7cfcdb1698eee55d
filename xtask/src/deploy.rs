//! `cargo xtask deploy`: kubevirt-rs into the cluster of the current KUBECONFIG (see
//! docs/deploy.md).
//!
//! The manifests are typed k8s-openapi objects rendered to YAML here, in two parts:
//! - cluster-independent objects (namespace, RBAC, Deployment, Service), committed as
//!   `manifests/kubevirt-rs.yaml` (`cargo xtask deploy --render`; a test keeps it current);
//! - per-cluster objects, rendered at deploy time into `target/deploy/` (it holds a private key):
//!   the serving certificate Secret, the ConfigMap with the cluster's client and front-proxy CAs,
//!   and the APIServices whose caBundle is our serving CA.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use base64::Engine;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMap, ConfigMapKeySelector, ConfigMapVolumeSource, Container, ContainerPort,
    EmptyDirVolumeSource, EnvVar, EnvVarSource, HTTPGetAction, Namespace, PodSecurityContext,
    PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile, Secret,
    SecretVolumeSource, SecurityContext, Service, ServiceAccount, ServicePort, ServiceSpec, Volume,
    VolumeMount,
};
use k8s_openapi::api::rbac::v1::{
    AggregationRule, ClusterRole, ClusterRoleBinding, PolicyRule, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::{
    APIService, APIServiceSpec, ServiceReference,
};
use sha2::{Digest, Sha256};
use virt_apiserver::kinds::ResourceDef;

use crate::images;

mod components;

pub const NAMESPACE: &str = "kubevirt";
pub const NAME: &str = "kubevirt-apiserver";
const TLS_SECRET: &str = "kubevirt-apiserver-tls";
const AUTH_CONFIGMAP: &str = "kubevirt-apiserver-auth";
const GROUP: &str = "kubevirt.io";
const SUBRESOURCES_GROUP: &str = "subresources.kubevirt.io";
const SERVING_PORT: i32 = 8443;
const ETCD_METRICS_PORT: i32 = 2381;
const FIELD_MANAGER: &str = "kubevirt-rs-deploy";
/// Committed manifests, relative to the workspace root.
pub const MANIFEST: &str = "manifests/kubevirt-rs.yaml";
const DEFAULT_APISERVER_IMAGE: &str = "localhost/kubevirt-rs/virt-apiserver:latest";
const DEFAULT_ETCD_IMAGE: &str = "localhost/kubevirt-rs/etcd:latest";
const DEFAULT_CONTROLLER_IMAGE: &str = "localhost/kubevirt-rs/virt-controller:latest";
const DEFAULT_HANDLER_IMAGE: &str = "localhost/kubevirt-rs/virt-handler:latest";
/// Non-root identity of both containers (the images have no /etc/passwd: numeric only).
const RUN_AS: i64 = 65532;

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
}

/// What a deploy measured.
#[derive(Debug)]
pub struct Report {
    pub kubectl: PathBuf,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.render {
        let path = crate::workspace_root().join(MANIFEST);
        fs::write(&path, committed_manifest()?)?;
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

    fn json(&self, args: &[&str]) -> anyhow::Result<Option<serde_json::Value>> {
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
    let tls = serving_cert(&k)?;
    let handler_tls = components::handler_tls(&k)?;

    let mut annotations = BTreeMap::new();
    // Neither virt-apiserver nor etcd reload files: a changed certificate or CA must restart the
    // pod, which a changed pod template does.
    annotations.insert(
        "kubevirt-rs.io/serving-cert-sha256".to_string(),
        sha256_hex(tls.cert.as_bytes()),
    );
    annotations.insert(
        "kubevirt-rs.io/auth-sha256".to_string(),
        sha256_hex(serde_json::to_string(&auth)?.as_bytes()),
    );
    annotations.insert(
        "kubevirt-rs.io/handler-client-sha256".to_string(),
        sha256_hex(handler_tls.client_cert.as_bytes()),
    );
    // A new virt-apiserver pod is a new, empty etcd whose resourceVersions start again at 1:
    // watches resumed from the old store's versions would wait for revisions that never come.
    // So whatever replaces that pod (image, certificates, CAs) restarts the watchers too.
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
    let handler_annotations = BTreeMap::from([
        (
            "kubevirt-rs.io/handler-cert-sha256".to_string(),
            sha256_hex(handler_tls.server_cert.as_bytes()),
        ),
        store.clone(),
    ]);
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
    };
    let mut yaml = static_manifest(&params)?;
    yaml.push_str(&cluster_manifest(&tls, &auth)?);
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

/// A CRD of our group makes kube-apiserver own `v1.kubevirt.io` itself (reference §1 R1.8):
/// better to stop than to fight its autoregister controller.
fn check_no_crd(k: &Kubectl) -> anyhow::Result<()> {
    let crds = k.run(&["get", "crd", "-o", "name"], None)?;
    let ours: Vec<&str> = crds
        .lines()
        .filter(|l| l.ends_with(&format!(".{GROUP}")))
        .collect();
    if !ours.is_empty() {
        bail!(
            "CRDs of {GROUP} exist ({}): kube-apiserver would serve the group itself; delete them \
             (and their objects) first",
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
#[derive(Debug, Clone, serde::Serialize)]
pub struct ClusterAuth {
    pub client_ca: String,
    pub requestheader_ca: String,
    /// Comma-separated, as virt-apiserver's environment variable takes it.
    pub allowed_names: String,
}

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

/// Serving certificate and its CA (PEM).
#[derive(Debug, Clone)]
pub struct Tls {
    pub ca: String,
    pub cert: String,
    pub key: String,
}

/// The DNS names kube-apiserver and in-cluster clients use for the Service.
fn service_names() -> Vec<String> {
    vec![
        format!("{NAME}.{NAMESPACE}.svc"),
        format!("{NAME}.{NAMESPACE}.svc.cluster.local"),
        format!("{NAME}.{NAMESPACE}"),
        NAME.to_string(),
    ]
}

/// Reuses the certificate in the cluster while it is valid (a new one would restart the pod on
/// every deploy), else issues a new CA and certificate.
fn serving_cert(k: &Kubectl) -> anyhow::Result<Tls> {
    let b64 = base64::engine::general_purpose::STANDARD;
    if let Some(secret) = k.json(&["-n", NAMESPACE, "get", "secret", TLS_SECRET])? {
        let field = |key: &str| -> Option<String> {
            let v = secret["data"][key].as_str()?;
            String::from_utf8(b64.decode(v).ok()?).ok()
        };
        if let (Some(ca), Some(cert), Some(key)) =
            (field("ca.crt"), field("tls.crt"), field("tls.key"))
        {
            let now = time::OffsetDateTime::now_utc();
            let fresh = |pem: &str| {
                virt_certs::validity_of(pem)
                    .is_ok_and(|(nb, na)| !virt_certs::needs_rotation(nb, na, now, 0.8))
            };
            if fresh(&cert) && fresh(&ca) {
                return Ok(Tls { ca, cert, key });
            }
            println!("serving certificate due for rotation: issuing a new one");
        }
    }
    let ca = virt_certs::Ca::generate("kubevirt-apiserver-ca", virt_certs::DEFAULT_CA_VALIDITY)?;
    let leaf = ca.issue_server(NAME, &service_names(), time::Duration::days(90))?;
    Ok(Tls {
        ca: ca.cert_pem().to_string(),
        cert: leaf.cert_pem,
        key: leaf.key_pem,
    })
}

/// What differs between the committed manifest and a deploy.
#[derive(Debug, Clone)]
pub struct Params {
    pub apiserver_image: String,
    pub etcd_image: String,
    pub controller_image: String,
    pub handler_image: String,
    /// The launcher image virt-controller puts into launcher pods.
    pub launcher_image: String,
    /// Of virt-apiserver's pod template.
    pub pod_annotations: BTreeMap<String, String>,
    /// Of virt-handler's pod template.
    pub handler_annotations: BTreeMap<String, String>,
    /// Of virt-controller's pod template.
    pub controller_annotations: BTreeMap<String, String>,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            apiserver_image: DEFAULT_APISERVER_IMAGE.into(),
            etcd_image: DEFAULT_ETCD_IMAGE.into(),
            controller_image: DEFAULT_CONTROLLER_IMAGE.into(),
            handler_image: DEFAULT_HANDLER_IMAGE.into(),
            launcher_image: images::LAUNCHER_LATEST.into(),
            pod_annotations: BTreeMap::new(),
            handler_annotations: BTreeMap::new(),
            controller_annotations: BTreeMap::new(),
        }
    }
}

fn push_doc<T: serde::Serialize>(out: &mut String, obj: &T) -> anyhow::Result<()> {
    out.push_str("---\n");
    out.push_str(&serde_saphyr::to_string(obj).context("rendering YAML")?);
    if !out.ends_with('\n') {
        out.push('\n');
    }
    Ok(())
}

fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), NAME.into()),
        ("app.kubernetes.io/part-of".into(), "kubevirt-rs".into()),
    ])
}

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: namespace.map(str::to_string),
        labels: Some(labels()),
        ..ObjectMeta::default()
    }
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn rule(group: &str, resources: Vec<String>, verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.into()]),
        resources: Some(resources),
        verbs: strings(verbs),
        ..PolicyRule::default()
    }
}

fn sa_subject() -> Subject {
    Subject {
        kind: "ServiceAccount".into(),
        name: NAME.into(),
        namespace: Some(NAMESPACE.into()),
        ..Subject::default()
    }
}

fn role_ref(kind: &str, name: &str) -> RoleRef {
    RoleRef {
        api_group: "rbac.authorization.k8s.io".into(),
        kind: kind.into(),
        name: name.into(),
    }
}

/// User roles. Both kube-apiserver and virt-apiserver (by SubjectAccessReview) check them, so
/// they name our resources and the subresources of subresources.kubevirt.io exactly as
/// virt-apiserver serves them; they come from its resource table so they cannot drift.
fn user_roles() -> Vec<ClusterRole> {
    let plurals: Vec<String> = ResourceDef::all()
        .iter()
        .map(|r| r.plural.to_string())
        .collect();
    let status: Vec<String> = ResourceDef::all()
        .iter()
        .filter(|r| r.has_status)
        .map(|r| format!("{}/status", r.plural))
        .collect();
    let actions: Vec<String> = ResourceDef::all()
        .iter()
        .flat_map(|r| r.actions.iter().map(move |a| format!("{}/{a}", r.plural)))
        .collect();
    let streams: Vec<String> = ResourceDef::all()
        .iter()
        .flat_map(|r| r.streams.iter().map(move |s| format!("{}/{s}", r.plural)))
        .collect();
    let read = ["get", "list", "watch"];
    let write = [
        "get",
        "list",
        "watch",
        "create",
        "update",
        "patch",
        "delete",
        "deletecollection",
    ];
    let mut view_rules = vec![rule(GROUP, plurals.clone(), &read)];
    if !status.is_empty() {
        view_rules.push(rule(GROUP, status, &["get"]));
    }
    let mut edit_rules = vec![rule(GROUP, plurals, &write)];
    if !actions.is_empty() {
        edit_rules.push(rule(SUBRESOURCES_GROUP, actions, &["update"]));
    }
    if !streams.is_empty() {
        // Consoles, VNC and port-forwarding reach into the guest: edit, as in KubeVirt.
        edit_rules.push(rule(SUBRESOURCES_GROUP, streams, &["get"]));
    }
    let role = |name: &str, aggregate_to: &str, rules: Vec<PolicyRule>| {
        let mut m = meta(name, None);
        m.labels.get_or_insert_with(BTreeMap::new).insert(
            format!("rbac.authorization.k8s.io/aggregate-to-{aggregate_to}"),
            "true".into(),
        );
        ClusterRole {
            metadata: m,
            rules: Some(rules),
            aggregation_rule: None::<AggregationRule>,
        }
    };
    vec![
        role("kubevirt.io:view", "view", view_rules),
        role("kubevirt.io:edit", "edit", edit_rules.clone()),
        role("kubevirt.io:admin", "admin", edit_rules),
    ]
}

fn http_probe(path: &str, port: &str, scheme: &str, period: i32, failures: i32) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String(port.into()),
            scheme: Some(scheme.into()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        timeout_seconds: Some(2),
        ..Probe::default()
    }
}

fn restricted() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(strings(&["ALL"])),
            ..Capabilities::default()
        }),
        ..SecurityContext::default()
    }
}

fn requests(cpu: &str, memory: &str) -> ResourceRequirements {
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".into(), Quantity(cpu.into())),
            ("memory".into(), Quantity(memory.into())),
        ])),
        ..ResourceRequirements::default()
    }
}

fn deployment(p: &Params) -> Deployment {
    const TLS_DIR: &str = "/etc/kubevirt-apiserver/tls";
    const AUTH_DIR: &str = "/etc/kubevirt-apiserver/auth";
    // etcd listens on the pod's loopback only: nothing but virt-apiserver (same network
    // namespace) can reach it, so it needs no TLS or authentication of its own.
    let etcd = Container {
        name: "etcd".into(),
        image: Some(p.etcd_image.clone()),
        image_pull_policy: Some("IfNotPresent".into()),
        // Native sidecar: started (startup probe passed) before virt-apiserver, which connects
        // to etcd at start-up.
        restart_policy: Some("Always".into()),
        args: Some(strings(&[
            "--name=kubevirt-apiserver-etcd",
            "--data-dir=/var/lib/etcd/data",
            "--listen-client-urls=http://127.0.0.1:2379",
            "--advertise-client-urls=http://127.0.0.1:2379",
            "--listen-peer-urls=http://127.0.0.1:2380",
            "--initial-advertise-peer-urls=http://127.0.0.1:2380",
            "--initial-cluster=kubevirt-apiserver-etcd=http://127.0.0.1:2380",
            // /health for kubelet's probes (and /metrics); kubelet probes the pod IP.
            "--listen-metrics-urls=http://0.0.0.0:2381",
            "--auto-compaction-mode=periodic",
            "--auto-compaction-retention=1h",
        ])),
        ports: Some(vec![ContainerPort {
            name: Some("etcd-metrics".into()),
            container_port: ETCD_METRICS_PORT,
            ..ContainerPort::default()
        }]),
        startup_probe: Some(http_probe("/health", "etcd-metrics", "HTTP", 1, 60)),
        liveness_probe: Some(http_probe("/health", "etcd-metrics", "HTTP", 10, 3)),
        volume_mounts: Some(vec![VolumeMount {
            name: "etcd-data".into(),
            mount_path: "/var/lib/etcd".into(),
            ..VolumeMount::default()
        }]),
        resources: Some(requests("50m", "64Mi")),
        security_context: Some(restricted()),
        ..Container::default()
    };
    let apiserver = Container {
        name: "virt-apiserver".into(),
        image: Some(p.apiserver_image.clone()),
        image_pull_policy: Some("IfNotPresent".into()),
        args: Some(
            [
                format!("--bind=0.0.0.0:{SERVING_PORT}"),
                "--etcd-servers=http://127.0.0.1:2379".into(),
                format!("--tls-cert-file={TLS_DIR}/tls.crt"),
                format!("--tls-private-key-file={TLS_DIR}/tls.key"),
                format!("--client-ca-file={AUTH_DIR}/client-ca-file"),
                format!("--requestheader-client-ca-file={AUTH_DIR}/requestheader-client-ca-file"),
                // Endpoint removal reaches the aggregator before the listener closes.
                "--shutdown-delay-seconds=3".into(),
            ]
            .into_iter()
            .chain(components::apiserver_handler_flags())
            .collect(),
        ),
        env: Some(vec![EnvVar {
            name: "VIRT_APISERVER_REQUESTHEADER_ALLOWED_NAMES".into(),
            value_from: Some(EnvVarSource {
                config_map_key_ref: Some(ConfigMapKeySelector {
                    name: AUTH_CONFIGMAP.into(),
                    key: "requestheader-allowed-names".into(),
                    optional: None,
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        }]),
        ports: Some(vec![ContainerPort {
            name: Some("https".into()),
            container_port: SERVING_PORT,
            ..ContainerPort::default()
        }]),
        readiness_probe: Some(http_probe("/readyz", "https", "HTTPS", 2, 3)),
        liveness_probe: Some(http_probe("/livez", "https", "HTTPS", 10, 3)),
        volume_mounts: Some(vec![
            VolumeMount {
                name: "tls".into(),
                mount_path: TLS_DIR.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            },
            VolumeMount {
                name: "auth".into(),
                mount_path: AUTH_DIR.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            },
            components::apiserver_handler_volume().1,
        ]),
        resources: Some(requests("50m", "64Mi")),
        security_context: Some(restricted()),
        ..Container::default()
    };
    let selector = BTreeMap::from([("app.kubernetes.io/name".to_string(), NAME.to_string())]);
    Deployment {
        metadata: meta(NAME, Some(NAMESPACE)),
        spec: Some(DeploymentSpec {
            // One replica, replaced not rolled: each pod has its own etcd (emptyDir), two pods
            // would serve two different data sets.
            replicas: Some(1),
            strategy: Some(DeploymentStrategy {
                type_: Some("Recreate".into()),
                ..DeploymentStrategy::default()
            }),
            selector: LabelSelector {
                match_labels: Some(selector),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels()),
                    annotations: (!p.pod_annotations.is_empty()).then(|| p.pod_annotations.clone()),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(NAME.into()),
                    enable_service_links: Some(false),
                    termination_grace_period_seconds: Some(30),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        run_as_user: Some(RUN_AS),
                        run_as_group: Some(RUN_AS),
                        fs_group: Some(RUN_AS),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".into(),
                            ..SeccompProfile::default()
                        }),
                        ..PodSecurityContext::default()
                    }),
                    init_containers: Some(vec![etcd]),
                    containers: vec![apiserver],
                    volumes: Some(vec![
                        Volume {
                            name: "etcd-data".into(),
                            empty_dir: Some(EmptyDirVolumeSource::default()),
                            ..Volume::default()
                        },
                        Volume {
                            name: "tls".into(),
                            secret: Some(SecretVolumeSource {
                                secret_name: Some(TLS_SECRET.into()),
                                default_mode: Some(0o440),
                                ..SecretVolumeSource::default()
                            }),
                            ..Volume::default()
                        },
                        Volume {
                            name: "auth".into(),
                            config_map: Some(ConfigMapVolumeSource {
                                name: AUTH_CONFIGMAP.into(),
                                ..ConfigMapVolumeSource::default()
                            }),
                            ..Volume::default()
                        },
                        components::apiserver_handler_volume().0,
                    ]),
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    }
}

/// The cluster-independent objects, in apply order.
pub fn static_manifest(p: &Params) -> anyhow::Result<String> {
    let mut out = String::new();
    push_doc(
        &mut out,
        &Namespace {
            metadata: meta(NAMESPACE, None),
            ..Namespace::default()
        },
    )?;
    push_doc(
        &mut out,
        &ServiceAccount {
            metadata: meta(NAME, Some(NAMESPACE)),
            ..ServiceAccount::default()
        },
    )?;
    // TokenReview and SubjectAccessReview: virt-apiserver authorises every request by asking
    // kube-apiserver.
    push_doc(
        &mut out,
        &ClusterRoleBinding {
            metadata: meta(&format!("{NAME}:system:auth-delegator"), None),
            role_ref: role_ref("ClusterRole", "system:auth-delegator"),
            subjects: Some(vec![sa_subject()]),
        },
    )?;
    // Read kube-system/extension-apiserver-authentication (the standard grant for aggregated API
    // servers; the deploy copies the CAs today, a watching server will need it).
    push_doc(
        &mut out,
        &RoleBinding {
            metadata: meta(&format!("{NAME}:auth-reader"), Some("kube-system")),
            role_ref: role_ref("Role", "extension-apiserver-authentication-reader"),
            subjects: Some(vec![sa_subject()]),
        },
    )?;
    push_doc(
        &mut out,
        &ClusterRole {
            metadata: meta(NAME, None),
            rules: Some(vec![rule(
                "",
                strings(&["namespaces"]),
                &["get", "list", "watch"],
            )]),
            ..ClusterRole::default()
        },
    )?;
    push_doc(
        &mut out,
        &ClusterRoleBinding {
            metadata: meta(NAME, None),
            role_ref: role_ref("ClusterRole", NAME),
            subjects: Some(vec![sa_subject()]),
        },
    )?;
    for r in user_roles() {
        push_doc(&mut out, &r)?;
    }
    components::apiserver_pod_reader(&mut out)?;
    push_doc(&mut out, &deployment(p))?;
    push_doc(
        &mut out,
        &Service {
            metadata: meta(NAME, Some(NAMESPACE)),
            spec: Some(ServiceSpec {
                selector: Some(BTreeMap::from([(
                    "app.kubernetes.io/name".to_string(),
                    NAME.to_string(),
                )])),
                // The aggregator matches EndpointSlice ports by this name: keep it stable.
                ports: Some(vec![ServicePort {
                    name: Some("https".into()),
                    port: 443,
                    target_port: Some(IntOrString::String("https".into())),
                    ..ServicePort::default()
                }]),
                ..ServiceSpec::default()
            }),
            ..Service::default()
        },
    )?;
    components::controller(&mut out, p)?;
    components::handler(&mut out, p)?;
    Ok(out)
}

/// Objects that hold this cluster's data: our serving certificate, the cluster's CAs, and the
/// APIServices (their caBundle is our CA).
pub fn cluster_manifest(tls: &Tls, auth: &ClusterAuth) -> anyhow::Result<String> {
    let mut out = String::new();
    push_doc(
        &mut out,
        &Secret {
            metadata: meta(TLS_SECRET, Some(NAMESPACE)),
            type_: Some("kubernetes.io/tls".into()),
            data: Some(BTreeMap::from([
                ("ca.crt".into(), ByteString(tls.ca.clone().into_bytes())),
                ("tls.crt".into(), ByteString(tls.cert.clone().into_bytes())),
                ("tls.key".into(), ByteString(tls.key.clone().into_bytes())),
            ])),
            ..Secret::default()
        },
    )?;
    push_doc(
        &mut out,
        &ConfigMap {
            metadata: meta(AUTH_CONFIGMAP, Some(NAMESPACE)),
            data: Some(BTreeMap::from([
                ("client-ca-file".into(), auth.client_ca.clone()),
                (
                    "requestheader-client-ca-file".into(),
                    auth.requestheader_ca.clone(),
                ),
                (
                    "requestheader-allowed-names".into(),
                    auth.allowed_names.clone(),
                ),
            ])),
            ..ConfigMap::default()
        },
    )?;
    for group in [GROUP, SUBRESOURCES_GROUP] {
        push_doc(
            &mut out,
            &APIService {
                metadata: meta(&format!("v1.{group}"), None),
                spec: Some(APIServiceSpec {
                    group: Some(group.into()),
                    version: Some("v1".into()),
                    group_priority_minimum: 1000,
                    version_priority: 100,
                    ca_bundle: Some(ByteString(tls.ca.clone().into_bytes())),
                    service: Some(ServiceReference {
                        namespace: Some(NAMESPACE.into()),
                        name: Some(NAME.into()),
                        port: Some(443),
                    }),
                    insecure_skip_tls_verify: None,
                }),
                ..APIService::default()
            },
        )?;
    }
    Ok(out)
}

/// `manifests/kubevirt-rs.yaml`: the cluster-independent part with default image names.
pub fn committed_manifest() -> anyhow::Result<String> {
    Ok(format!(
        "# Generated by `cargo xtask deploy --render` (xtask/src/deploy.rs); do not edit.\n\
         # Cluster-independent part of the kubevirt-rs deployment. `cargo xtask deploy` applies it\n\
         # together with the per-cluster objects (serving certificate Secret {TLS_SECRET},\n\
         # ConfigMap {AUTH_CONFIGMAP} with the cluster's CAs, APIServices with caBundle, the\n\
         # virt-handler mTLS Secrets {} and {}) and\n\
         # content-addressed image tags instead of :latest. See docs/deploy.md.\n{}",
        components::HANDLER_CERTS,
        components::HANDLER_CLIENT,
        static_manifest(&Params::default())?
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn committed_manifest_is_current() {
        let path = crate::workspace_root().join(MANIFEST);
        let committed = fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == committed_manifest().unwrap(),
            "{MANIFEST} is stale: run `cargo xtask deploy --render`"
        );
    }

    #[test]
    fn manifests_parse_back_as_kubernetes_objects() {
        let text = static_manifest(&Params::default()).unwrap();
        let docs: Vec<serde_json::Value> = text
            .split("---\n")
            .filter(|d| !d.trim().is_empty())
            .map(|d| serde_saphyr::from_str(d).unwrap())
            .collect();
        let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
        assert_eq!(kinds[0], "Namespace");
        assert!(kinds.contains(&"Deployment") && kinds.contains(&"Service"));
        let edit = docs
            .iter()
            .find(|d| d["metadata"]["name"] == "kubevirt.io:edit")
            .unwrap();
        assert_eq!(
            edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"],
            "true"
        );
        let subs = edit["rules"].to_string();
        assert!(
            subs.contains("virtualmachines/start")
                && subs.contains("virtualmachineinstances/console")
        );
    }
}
