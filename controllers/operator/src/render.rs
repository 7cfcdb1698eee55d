//! Every object kubevirt-rs deploys, as typed k8s-openapi objects rendered to YAML: the one
//! place the operator's reconciler and `gen-manifests` (manifests/reference/) take them from.
//!
//! Two parts:
//! - cluster-independent objects (namespace, RBAC, Deployments, DaemonSet, Service):
//!   [`static_manifest`];
//! - per-cluster objects ([`cluster_manifest`], [`components::handler_secrets`]): the serving
//!   certificate Secret, the ConfigMap with the cluster's client and front-proxy CAs, the
//!   APIServices whose caBundle is our serving CA, the virt-handler mTLS Secrets.
//!
//! virt-controller and virt-handler (Deployment, DaemonSet, RBAC, mTLS material) are in
//! [`components`].

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, RuleWithOperations, ServiceReference as WebhookServiceReference,
    ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
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
use kubevirt_api::catalogue;

pub mod components;
pub mod etcd;
pub mod monitoring;

pub const NAMESPACE: &str = "kubevirt";
/// virt-apiserver's Deployment, Service, ServiceAccount and RBAC objects.
pub const NAME: &str = "kubevirt-apiserver";
pub const TLS_SECRET: &str = "kubevirt-apiserver-tls";
pub const AUTH_CONFIGMAP: &str = "kubevirt-apiserver-auth";
pub use kubevirt_api::{GROUP, SUBRESOURCES_GROUP};
const SERVING_PORT: i32 = 8443;
/// CDI's upload proxy, served by virt-apiserver (`--upload-proxy-bind`).
const UPLOAD_PROXY_PORT: i32 = 8444;
/// The upload proxy's Service (CDI's name, so CDI's docs and habits apply).
pub const UPLOAD_PROXY_SERVICE: &str = "cdi-uploadproxy";
/// The Secret holding the key upload tokens are signed with: made once by virt-operator
/// (reconcile.rs), the same in every virt-apiserver replica.
pub const UPLOAD_TOKEN_SECRET: &str = "kubevirt-rs-upload-token";
/// Its key in the Secret.
pub const UPLOAD_TOKEN_KEY: &str = "key";
const UPLOAD_TOKEN_DIR: &str = "/etc/virt-apiserver/upload-token";
/// virt-apiserver's plain-HTTP `/metrics` (`--metrics-addr`), behind kubevirt-prometheus-metrics.
const APISERVER_METRICS_PORT: i32 = 8188;
const ETCD_METRICS_PORT: i32 = 2381;
pub const DEFAULT_APISERVER_IMAGE: &str = "localhost/kubevirt-rs/virt-apiserver:latest";
pub const DEFAULT_ETCD_IMAGE: &str = "localhost/kubevirt-rs/etcd:latest";
pub const DEFAULT_CONTROLLER_IMAGE: &str = "localhost/kubevirt-rs/virt-controller:latest";
pub const DEFAULT_HANDLER_IMAGE: &str = "localhost/kubevirt-rs/virt-handler:latest";
pub const DEFAULT_LAUNCHER_IMAGE: &str = "localhost/kubevirt-rs/virt-launcher:latest";
/// Non-root identity of both containers (the images have no /etc/passwd: numeric only).
const RUN_AS: i64 = 65532;

/// Why rendering failed.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("rendering YAML: {0}")]
    Yaml(String),
    #[error("issuing certificates: {0}")]
    Certs(#[from] virt_certs::CertError),
}

pub type Result<T, E = RenderError> = std::result::Result<T, E>;

/// The cluster's CAs, copied from kube-system/extension-apiserver-authentication (kube-apiserver
/// keeps that ConfigMap current on every kind of cluster, kind and kubeadm included).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ClusterAuth {
    pub client_ca: String,
    pub requestheader_ca: String,
    /// Comma-separated, as virt-apiserver's environment variable takes it.
    pub allowed_names: String,
}

/// Serving certificate and its CA (PEM).
#[derive(Debug, Clone)]
pub struct Tls {
    pub ca: String,
    pub cert: String,
    pub key: String,
}

/// The DNS names kube-apiserver and in-cluster clients use for the Service, and those of
/// the upload proxy's Service (the same certificate serves both ports).
pub fn service_names() -> Vec<String> {
    [NAME, UPLOAD_PROXY_SERVICE]
        .into_iter()
        .flat_map(|n| {
            [
                format!("{n}.{NAMESPACE}.svc"),
                format!("{n}.{NAMESPACE}.svc.cluster.local"),
                format!("{n}.{NAMESPACE}"),
                n.to_string(),
            ]
        })
        .collect()
}

/// The upload proxy's URL inside the cluster (what CDIConfig's status would name).
pub fn upload_proxy_url() -> String {
    format!("https://{UPLOAD_PROXY_SERVICE}.{NAMESPACE}.svc")
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
    /// Where virt-apiserver's etcd runs.
    pub etcd: EtcdMode,
    /// Pull policy of every component image.
    pub image_pull_policy: String,
    /// virt-controller lets VMs fall back to QEMU's TCG (developerConfiguration.useEmulation).
    pub allow_emulation: bool,
    /// Placement of etcd, virt-apiserver and virt-controller.
    pub infra: Placement,
    /// Placement of virt-handler.
    pub workloads: Placement,
    /// KubeVirt feature gates virt-apiserver enforces (`--feature-gates`, see
    /// [`apiserver_feature_gates`]); none (every gate off) in `cargo xtask deploy`.
    pub feature_gates: Vec<String>,
    /// The cluster's default evictionStrategy (`configuration.evictionStrategy`): virt-apiserver
    /// answers evictions with it, virt-controller evacuates by it.
    pub eviction_strategy: kubevirt_api::eviction::EvictionStrategy,
    /// workloadUpdateStrategy (virt-controller's workload updater); none by default.
    pub workload_update: WorkloadUpdate,
    /// virt-controller's flags from `configuration.migrations` and
    /// `configuration.instancetype` (validated).
    pub migration_flags: Vec<String>,
    /// Launcher pods log the serial console unless a VMI says otherwise
    /// (`configuration.virtualMachineOptions.disableSerialConsoleLog` absent).
    pub serial_console_log: bool,
    /// virt-apiserver's per-user limits from `spec.kubevirtRs.apiserver` (only those set,
    /// so an installation that sets none keeps its pod template).
    pub apiserver_limit_flags: Vec<String>,
    /// virt-controller runs its DataVolume controller; `false` where a real CDI fills
    /// DataVolumes (crate::cdi).
    pub datavolumes: bool,
}

/// `spec.workloadUpdateStrategy`, validated.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorkloadUpdate {
    /// `LiveMigrate` and/or `Evict`.
    pub methods: Vec<String>,
    pub batch_size: Option<i64>,
    pub batch_interval_seconds: Option<u64>,
}

/// virt-controller's workload-update flags: only those set, so an installation that never
/// sets the strategy keeps its pod template.
pub fn workload_update_flags(p: &Params) -> Vec<String> {
    let w = &p.workload_update;
    let mut out = Vec::new();
    if !w.methods.is_empty() {
        out.push(format!("--workload-update-methods={}", w.methods.join(",")));
    }
    if let Some(n) = w.batch_size {
        out.push(format!("--workload-update-batch-size={n}"));
    }
    if let Some(s) = w.batch_interval_seconds {
        out.push(format!("--workload-update-batch-interval-seconds={s}"));
    }
    out
}

/// `--eviction-strategy` of virt-apiserver and virt-controller: only when not KubeVirt's
/// default, so an installation that never sets it keeps its pod templates.
pub fn eviction_strategy_flag(p: &Params) -> Option<String> {
    (p.eviction_strategy != kubevirt_api::eviction::EvictionStrategy::None)
        .then(|| format!("--eviction-strategy={}", p.eviction_strategy))
}

/// virt-controller's `--serial-console-log`: only when off, so an installation that never
/// sets `disableSerialConsoleLog` keeps its pod template.
pub fn serial_console_log_flag(p: &Params) -> Option<String> {
    (!p.serial_console_log).then(|| "--serial-console-log=false".to_string())
}

/// virt-controller's `--datavolumes`: only when off (CDI installed), so an installation
/// without CDI keeps its pod template.
pub fn datavolumes_flag(p: &Params) -> Option<String> {
    (!p.datavolumes).then(|| "--datavolumes=false".to_string())
}

/// The KubeVirt feature gates virt-apiserver enforces: `HostDisk` (hostDisk volumes),
/// `HotplugVolumes` and `DeclarativeHotplugVolumes` (the addvolume/removevolume subresources).
pub const APISERVER_GATES: &[&str] = &kubevirt_api::policy::FeatureGates::ENFORCED;

/// The gates of a KubeVirt resource's `developerConfiguration.featureGates` that go to
/// virt-apiserver: only those it enforces, so that any other gate does not roll its pods.
pub fn apiserver_feature_gates(gates: &[String]) -> Vec<String> {
    let mut out: Vec<String> = gates
        .iter()
        .filter(|g| APISERVER_GATES.contains(&g.as_str()))
        .cloned()
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Where virt-apiserver's etcd runs.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum EtcdMode {
    /// A native sidecar in virt-apiserver's pod on its loopback, data in an emptyDir: one
    /// replica, replaced (not rolled), a new pod starts with an empty store (`cargo xtask
    /// deploy`).
    #[default]
    Sidecar,
    /// A StatefulSet of its own behind mTLS (virt-operator): virt-apiserver rolls with two
    /// replicas and a replaced pod keeps every object.
    StatefulSet(etcd::EtcdParams),
}

/// Node placement of a group of pods (KubeVirt's nodePlacement).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Placement {
    pub node_selector: Option<BTreeMap<String, String>>,
    pub tolerations: Option<Vec<k8s_openapi::api::core::v1::Toleration>>,
    pub affinity: Option<k8s_openapi::api::core::v1::Affinity>,
}

impl Placement {
    /// Adds the placement to a pod spec (tolerations are appended to the component's own).
    pub fn apply(&self, spec: &mut PodSpec) {
        if let Some(sel) = &self.node_selector {
            spec.node_selector
                .get_or_insert_with(BTreeMap::new)
                .extend(sel.clone());
        }
        if let Some(t) = &self.tolerations {
            spec.tolerations
                .get_or_insert_with(Vec::new)
                .extend(t.clone());
        }
        if self.affinity.is_some() {
            spec.affinity = self.affinity.clone();
        }
    }
}

impl Default for Params {
    fn default() -> Self {
        Self {
            apiserver_image: DEFAULT_APISERVER_IMAGE.into(),
            etcd_image: DEFAULT_ETCD_IMAGE.into(),
            controller_image: DEFAULT_CONTROLLER_IMAGE.into(),
            handler_image: DEFAULT_HANDLER_IMAGE.into(),
            launcher_image: DEFAULT_LAUNCHER_IMAGE.into(),
            pod_annotations: BTreeMap::new(),
            handler_annotations: BTreeMap::new(),
            controller_annotations: BTreeMap::new(),
            etcd: EtcdMode::Sidecar,
            image_pull_policy: "IfNotPresent".into(),
            allow_emulation: true,
            infra: Placement::default(),
            workloads: Placement::default(),
            feature_gates: Vec::new(),
            eviction_strategy: kubevirt_api::eviction::EvictionStrategy::None,
            workload_update: WorkloadUpdate::default(),
            migration_flags: Vec::new(),
            serial_console_log: true,
            apiserver_limit_flags: Vec::new(),
            datavolumes: true,
        }
    }
}

pub fn push_doc<T: serde::Serialize>(out: &mut String, obj: &T) -> Result<()> {
    out.push_str("---\n");
    out.push_str(&serde_saphyr::to_string(obj).map_err(|e| RenderError::Yaml(e.to_string()))?);
    if !out.ends_with('\n') {
        out.push('\n');
    }
    Ok(())
}

/// `app.kubernetes.io/name: name`, `app.kubernetes.io/part-of: kubevirt-rs`.
pub fn part_of_labels(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), name.into()),
        ("app.kubernetes.io/part-of".into(), "kubevirt-rs".into()),
    ])
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

/// The RBAC resource names of these catalogue kinds, each followed by `suffix` (`""`,
/// `"/status"`, `"/finalizers"`): roles name kinds from the catalogue, never by hand, so a
/// renamed or added kind cannot leave a component without its grant.
pub(crate) fn resources<'a>(
    kinds: impl IntoIterator<Item = &'a catalogue::Kind>,
    suffix: &str,
) -> Vec<String> {
    kinds
        .into_iter()
        .map(|k| format!("{}{suffix}", k.plural))
        .collect()
}

/// Every `resource verb` a set of rules grants in `group`, sorted: what tests compare.
#[cfg(test)]
pub(crate) fn grants(rules: &[PolicyRule], group: &str) -> Vec<String> {
    let mut out: Vec<String> = rules
        .iter()
        .filter(|r| r.api_groups.iter().flatten().any(|g| g == group))
        .flat_map(|r| {
            r.resources
                .iter()
                .flatten()
                .flat_map(move |res| r.verbs.iter().map(move |v| format!("{res} {v}")))
        })
        .collect();
    out.sort();
    out
}

/// The groups and versions virt-apiserver serves, each registered by an APIService named
/// `<version>.<group>`: every group of the catalogue's kinds, then the subresources'.
pub fn api_services() -> Vec<(&'static str, &'static str)> {
    let mut out = catalogue::kind_groups();
    out.push((SUBRESOURCES_GROUP, kubevirt_api::VERSION));
    out
}

/// The name of the APIService of `group` at `version`.
pub fn api_service_name(group: &str, version: &str) -> String {
    format!("{version}.{group}")
}

/// One rule per API group of these stored kinds (each resource followed by `suffix`):
/// roles name kinds from the catalogue, never by hand.
pub(crate) fn rules_by_group<'a>(
    kinds: impl IntoIterator<Item = &'a catalogue::Kind>,
    suffix: &str,
    verbs: &[&str],
) -> Vec<PolicyRule> {
    let mut by_group: Vec<(&str, Vec<String>)> = Vec::new();
    for k in kinds {
        let resource = format!("{}{suffix}", k.plural);
        match by_group.iter_mut().find(|(g, _)| *g == k.group) {
            Some((_, rs)) => rs.push(resource),
            None => by_group.push((k.group, vec![resource])),
        }
    }
    by_group
        .into_iter()
        .map(|(g, rs)| rule(g, rs, verbs))
        .collect()
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
/// virt-apiserver serves them; they come from the API catalogue so they cannot drift.
fn user_roles() -> Vec<ClusterRole> {
    let stored = catalogue::stored();
    // Subresources by the verb that calls them: actions `update`; consoles, VNC and
    // port-forwarding `get` — they reach into the guest, so edit grants them, as in KubeVirt.
    let mut by_verb: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for sub in catalogue::SUBRESOURCES {
        by_verb
            .entry(sub.rbac_verb())
            .or_default()
            .push(sub.resource());
    }
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
    let mut view_rules = rules_by_group(stored.clone(), "", &read);
    view_rules.extend(rules_by_group(
        stored.clone().filter(|k| k.has_status),
        "/status",
        &["get"],
    ));
    view_rules.extend(rules_by_group(
        stored.clone().filter(|k| k.has_scale),
        "/scale",
        &["get"],
    ));
    // What the guest agent reports is for viewers too, as KubeVirt's view role has it.
    let reads: Vec<String> = catalogue::SUBRESOURCES
        .into_iter()
        .filter(|s| s.is_read())
        .map(|s| s.resource())
        .collect();
    if !reads.is_empty() {
        view_rules.push(rule(SUBRESOURCES_GROUP, reads, &["get"]));
    }
    // `namespaces/{ns}/expand-vm-spec` expands a VM sent in the body (virtctl expand
    // --file): it stores nothing, and KubeVirt's view, edit and admin roles all grant it.
    let expand = || {
        rule(
            SUBRESOURCES_GROUP,
            strings(&[catalogue::EXPAND_VM_SPEC]),
            &["update"],
        )
    };
    view_rules.push(expand());
    // A namespace's editor writes its namespaced kinds; the cluster-wide ones (cluster
    // instance types and preferences) are the cluster administrator's, read by everyone.
    let mut edit_rules = rules_by_group(stored.clone().filter(|k| k.namespaced), "", &write);
    // `kubectl scale` of a pool or replica set, as a CRD's scale subresource allows editors.
    edit_rules.extend(rules_by_group(
        stored.clone().filter(|k| k.namespaced && k.has_scale),
        "/scale",
        &["get", "update", "patch"],
    ));
    edit_rules.extend(rules_by_group(
        stored.clone().filter(|k| !k.namespaced),
        "",
        &read,
    ));
    // `update` first, as the roles have always listed them.
    for (verb, resources) in by_verb.into_iter().rev() {
        edit_rules.push(rule(SUBRESOURCES_GROUP, resources, &[verb]));
    }
    edit_rules.push(expand());
    // CDI's edit and admin roles: cloning a claim (a DataVolume's `source.pvc`) is allowed
    // to whoever may `create datavolumes/source` in the claim's namespace (or create pods
    // there), which virt-apiserver asks kube-apiserver at admission.
    edit_rules.push(rule(
        kubevirt_api::cdi::GROUP,
        vec![clone_source_resource()],
        &["create"],
    ));
    // Create-only kinds (CDI's UploadTokenRequest: a token to upload into a claim of the
    // namespace) are for editors, as CDI's edit role has it.
    edit_rules.extend(rules_by_group(
        catalogue::all_kinds().filter(|k| k.create_only),
        "",
        &["create"],
    ));
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

/// The subresource whose `create` allows cloning a claim (`datavolumes/source`).
fn clone_source_resource() -> String {
    format!(
        "datavolumes/{}",
        kubevirt_api::cdi::clone::SOURCE_SUBRESOURCE
    )
}

/// An HTTP probe answered within 2 s, asked every `period` s, failed after `failures`
/// misses: for readiness and start-up, where a miss only holds traffic or the start back.
pub(crate) fn http_probe(
    path: &str,
    port: &str,
    scheme: &str,
    period: i32,
    failures: i32,
) -> Probe {
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

/// Liveness: the kubelet restarts a container that misses it three times, which is for a
/// hung process, not a busy one. With a 2 s answer the kubelet restarted virt-handler
/// while 72 TCG guests booted on 2 CPUs (its 20m request then buys little CPU), dropping
/// every stream and watch it served to re-adopt the same launchers; 10 s to answer, every
/// 15 s, still restarts a daemon that stopped answering within about a minute.
pub(crate) fn liveness_probe(path: &str, port: &str, scheme: &str) -> Probe {
    Probe {
        timeout_seconds: Some(10),
        ..http_probe(path, port, scheme, 15, 3)
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
        liveness_probe: Some(liveness_probe("/health", "etcd-metrics", "HTTP")),
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
        image_pull_policy: Some(p.image_pull_policy.clone()),
        args: Some(
            [
                format!("--bind=0.0.0.0:{SERVING_PORT}"),
                format!("--metrics-addr=0.0.0.0:{APISERVER_METRICS_PORT}"),
                "--etcd-servers=http://127.0.0.1:2379".into(),
                format!("--tls-cert-file={TLS_DIR}/tls.crt"),
                format!("--tls-private-key-file={TLS_DIR}/tls.key"),
                format!("--client-ca-file={AUTH_DIR}/client-ca-file"),
                format!("--requestheader-client-ca-file={AUTH_DIR}/requestheader-client-ca-file"),
                // Endpoint removal reaches the aggregator before the listener closes.
                "--shutdown-delay-seconds=3".into(),
                format!("--upload-proxy-bind=0.0.0.0:{UPLOAD_PROXY_PORT}"),
                format!("--upload-token-key-file={UPLOAD_TOKEN_DIR}/{UPLOAD_TOKEN_KEY}"),
            ]
            .into_iter()
            .chain(components::apiserver_handler_flags())
            .chain(
                (!p.feature_gates.is_empty())
                    .then(|| format!("--feature-gates={}", p.feature_gates.join(","))),
            )
            .chain(eviction_strategy_flag(p))
            .chain(p.apiserver_limit_flags.iter().cloned())
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
        ports: Some(vec![
            ContainerPort {
                name: Some("https".into()),
                container_port: SERVING_PORT,
                ..ContainerPort::default()
            },
            ContainerPort {
                name: Some("metrics".into()),
                container_port: APISERVER_METRICS_PORT,
                ..ContainerPort::default()
            },
            ContainerPort {
                name: Some("upload-proxy".into()),
                container_port: UPLOAD_PROXY_PORT,
                ..ContainerPort::default()
            },
        ]),
        readiness_probe: Some(http_probe("/readyz", "https", "HTTPS", 2, 3)),
        liveness_probe: Some(liveness_probe("/livez", "https", "HTTPS")),
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
            VolumeMount {
                name: "upload-token".into(),
                mount_path: UPLOAD_TOKEN_DIR.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            },
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
                    // Behind kubevirt-prometheus-metrics: KubeVirt's rules count its replicas.
                    labels: Some({
                        let mut l = labels();
                        l.extend([monitoring::pod_label()]);
                        l
                    }),
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
                        Volume {
                            name: "upload-token".into(),
                            secret: Some(SecretVolumeSource {
                                secret_name: Some(UPLOAD_TOKEN_SECRET.into()),
                                default_mode: Some(0o440),
                                ..SecretVolumeSource::default()
                            }),
                            ..Volume::default()
                        },
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
pub fn static_manifest(p: &Params) -> Result<String> {
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
            rules: Some(vec![
                rule("", strings(&["namespaces"]), &["get", "list", "watch"]),
                // Answering a launcher pod's eviction (webhook.rs) reads that pod: which VMI,
                // which node, whether it is a migration target; a VMI's addvolume lists the
                // pods of its namespace for one that holds a ReadWriteOnce claim elsewhere
                // (volumes.rs).
                rule("", strings(&["pods"]), &["get", "list"]),
                // A VM that infers its instance type and preference from a volume reads the
                // claim's labels (KubeVirt's mutating webhook does the same); addvolume
                // checks that the added claim exists.
                rule("", strings(&["persistentvolumeclaims"]), &["get"]),
                // The expand-spec endpoints read the copies a VM captured.
                rule("apps", strings(&["controllerrevisions"]), &["get"]),
                // kubevirt.io/v1 kubevirts are served by forwarding to the v1alpha3 CRD with
                // these credentials, after authorizing the user (docs/deploy.md): the same
                // verbs as the resource itself.
                rule(
                    GROUP,
                    resources([&catalogue::KUBEVIRT], ""),
                    &[
                        "get",
                        "list",
                        "watch",
                        "create",
                        "update",
                        "patch",
                        "delete",
                        "deletecollection",
                    ],
                ),
                rule(
                    GROUP,
                    resources([&catalogue::KUBEVIRT], "/status"),
                    &["get", "update", "patch"],
                ),
            ]),
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
    // Everyone may read CDIConfig `config` (virtctl image-upload reads the upload proxy's
    // URL there), as CDI's config-reader role has it: a namespace's editor holds no
    // cluster-scoped grant otherwise.
    let reader = "kubevirt-rs:cdi-config-reader";
    push_doc(
        &mut out,
        &ClusterRole {
            metadata: meta(reader, None),
            rules: Some(vec![rule(
                kubevirt_api::cdi::GROUP,
                resources([&kubevirt_api::kinds::cdi_config::KIND], ""),
                &["get", "list", "watch"],
            )]),
            ..ClusterRole::default()
        },
    )?;
    push_doc(
        &mut out,
        &ClusterRoleBinding {
            metadata: meta(reader, None),
            role_ref: role_ref("ClusterRole", reader),
            subjects: Some(vec![Subject {
                kind: "Group".into(),
                name: "system:authenticated".into(),
                api_group: Some("rbac.authorization.k8s.io".into()),
                namespace: None,
            }]),
        },
    )?;
    components::apiserver_pod_reader(&mut out)?;
    let mut apiserver = deployment(p);
    if let Some(spec) = apiserver
        .spec
        .as_mut()
        .and_then(|s| s.template.spec.as_mut())
    {
        p.infra.apply(spec);
    }
    if let EtcdMode::StatefulSet(e) = &p.etcd {
        etcd::objects(&mut out, p, e)?;
        etcd::externalise(&mut apiserver, e);
        push_doc(&mut out, &etcd::apiserver_pdb())?;
    }
    push_doc(&mut out, &apiserver)?;
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
    // CDI's upload proxy (virt-apiserver's second port), under CDI's Service name.
    push_doc(
        &mut out,
        &Service {
            metadata: meta(UPLOAD_PROXY_SERVICE, Some(NAMESPACE)),
            spec: Some(ServiceSpec {
                selector: Some(BTreeMap::from([(
                    "app.kubernetes.io/name".to_string(),
                    NAME.to_string(),
                )])),
                ports: Some(vec![ServicePort {
                    name: Some("https".into()),
                    port: 443,
                    target_port: Some(IntOrString::String("upload-proxy".into())),
                    ..ServicePort::default()
                }]),
                ..ServiceSpec::default()
            }),
            ..Service::default()
        },
    )?;
    components::controller(&mut out, p)?;
    components::handler(&mut out, p)?;
    // With or without a prometheus-operator: any Prometheus can discover the metrics pods
    // through it (the ServiceMonitor and PrometheusRule depend on the cluster: reconcile.rs).
    push_doc(&mut out, &monitoring::prometheus_service())?;
    Ok(out)
}

/// Objects that hold this cluster's data: our serving certificate, the cluster's CAs, and the
/// APIServices (their caBundle is our CA).
pub fn cluster_manifest(tls: &Tls, auth: &ClusterAuth) -> Result<String> {
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
    for (group, version) in api_services() {
        push_doc(
            &mut out,
            &APIService {
                metadata: meta(&api_service_name(group, version), None),
                spec: Some(APIServiceSpec {
                    group: Some(group.into()),
                    version: Some(version.into()),
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
    push_doc(&mut out, &eviction_webhook(tls.ca.as_bytes()))?;
    Ok(out)
}

/// Name of the ValidatingWebhookConfiguration that sends launcher pods' evictions to
/// virt-apiserver.
pub const EVICTION_WEBHOOK: &str = "kubevirt-rs-launcher-eviction";

/// Evictions of launcher pods (`kubectl drain`, the descheduler) go to virt-apiserver, which
/// refuses them while it migrates the VM away (docs/cluster-flow.md §7), and so do evictions
/// of etcd's pods, refused until virt-operator has moved the member. Only evictions of
/// pods named `virt-launcher-…` are sent (a CEL match condition, as KubeVirt: an Eviction has
/// the pod's name but not its labels), and for those it fails closed: with virt-apiserver
/// down a drain waits instead of killing VMs; every other pod's eviction never waits on us.
pub fn eviction_webhook(ca_bundle: &[u8]) -> ValidatingWebhookConfiguration {
    ValidatingWebhookConfiguration {
        metadata: meta(EVICTION_WEBHOOK, None),
        webhooks: Some(vec![ValidatingWebhook {
            name: "launcher-eviction.kubevirt.io".into(),
            admission_review_versions: strings(&["v1"]),
            client_config: WebhookClientConfig {
                ca_bundle: Some(ByteString(ca_bundle.to_vec())),
                service: Some(WebhookServiceReference {
                    namespace: NAMESPACE.into(),
                    name: NAME.into(),
                    path: Some(kubevirt_api::eviction::WEBHOOK_PATH.into()),
                    port: Some(443),
                }),
                url: None,
            },
            failure_policy: Some("Fail".into()),
            match_policy: Some("Equivalent".into()),
            // The object is the Eviction: it carries the pod's name but none of its labels.
            object_selector: None,
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(strings(&[""])),
                api_versions: Some(strings(&["v1"])),
                operations: Some(strings(&["CREATE"])),
                resources: Some(strings(&["pods/eviction"])),
                scope: Some("Namespaced".into()),
            }]),
            // Marking a VMI may retry an etcd conflict; drain retries a timeout anyway.
            timeout_seconds: Some(10),
            // Marking the VMI is the side effect; a dry-run eviction marks nothing.
            side_effects: "NoneOnDryRun".into(),
            namespace_selector: None,
            // And the pods of kubevirt-rs's own etcd, which must never be evicted before
            // virt-operator has moved their member (issue 51).
            match_conditions: Some(vec![MatchCondition {
                name: "launcher-and-etcd-pods".into(),
                expression: format!(
                    "object.metadata.name.startsWith(\"{}\") || \
                     (object.metadata.namespace == \"{NAMESPACE}\" && \
                     object.metadata.name.startsWith(\"{}\"))",
                    kubevirt_api::eviction::LAUNCHER_POD_PREFIX,
                    kubevirt_api::eviction::ETCD_POD_PREFIX
                ),
            }]),
        }]),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// Every subresource of the catalogue is granted by edit and admin with the verb that
    /// calls it, nothing else of subresources.kubevirt.io is, and view grants only the
    /// guest-agent reads (as KubeVirt's view role).
    #[test]
    fn user_roles_grant_exactly_the_catalogued_subresources() {
        let roles = user_roles();
        let granted = |role: &ClusterRole| -> Vec<(String, String)> {
            let mut out = Vec::new();
            for r in role.rules.iter().flatten() {
                if r.api_groups.as_deref() != Some(&[SUBRESOURCES_GROUP.to_string()][..]) {
                    continue;
                }
                for res in r.resources.iter().flatten() {
                    for v in &r.verbs {
                        out.push((res.clone(), v.clone()));
                    }
                }
            }
            out.sort();
            out
        };
        let mut want: Vec<(String, String)> = catalogue::SUBRESOURCES
            .iter()
            .map(|s| (s.resource(), s.rbac_verb().to_string()))
            .collect();
        // …and expand-vm-spec (an endpoint on no object), to every role as in KubeVirt.
        let expand = (catalogue::EXPAND_VM_SPEC.to_string(), "update".to_string());
        want.push(expand.clone());
        want.sort();
        let mut reads: Vec<(String, String)> = catalogue::SUBRESOURCES
            .iter()
            .filter(|s| s.is_read())
            .map(|s| (s.resource(), "get".to_string()))
            .collect();
        assert_eq!(reads.len(), 4);
        reads.push(expand);
        reads.sort();
        assert_eq!(granted(&roles[0]), reads, "view");
        assert_eq!(granted(&roles[1]), want, "edit");
        assert_eq!(granted(&roles[2]), want, "admin");
    }

    /// On kubevirt.io, view reads every stored kind and its status, edit and admin write every
    /// stored kind (status stays the controllers'); `kubevirts` is the cluster admin's only.
    #[test]
    fn user_roles_hold_every_stored_kind() {
        let roles = user_roles();
        // Per group: the stored kinds' lines, namespaced ones with `verbs`, cluster-scoped
        // ones with `cluster_verbs`.
        let lines = |group: &str,
                     verbs: &[&str],
                     cluster_verbs: &[&str],
                     status: &[&str],
                     scale: &[&str]| {
            let mut out: Vec<String> = catalogue::stored()
                .filter(|k| k.group == group)
                .flat_map(|k| {
                    let status = status
                        .iter()
                        .filter(|_| k.has_status)
                        .map(|v| format!("{}/status {v}", k.plural))
                        .chain(
                            scale
                                .iter()
                                .filter(|_| k.has_scale)
                                .map(|v| format!("{}/scale {v}", k.plural)),
                        );
                    let verbs = if k.namespaced { verbs } else { cluster_verbs };
                    verbs
                        .iter()
                        .map(|v| format!("{} {v}", k.plural))
                        .chain(status)
                        .collect::<Vec<_>>()
                })
                .collect();
            out.sort();
            out
        };
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
        for (group, _) in catalogue::kind_groups() {
            assert_eq!(
                grants(roles[0].rules.as_deref().unwrap_or_default(), group),
                lines(group, &read, &read, &["get"], &["get"]),
                "view {group}"
            );
            // …and editors may clone claims in their namespaces, as CDI's edit role has it.
            let mut want = lines(group, &write, &read, &[], &["get", "update", "patch"]);
            if group == kubevirt_api::cdi::GROUP {
                want.push("datavolumes/source create".to_string());
                want.sort();
            }
            // …and ask for upload tokens for their claims (create only: nothing is stored).
            if group == kubevirt_api::cdi::upload::GROUP {
                want.push("uploadtokenrequests create".to_string());
            }
            for role in &roles[1..] {
                assert_eq!(
                    grants(role.rules.as_deref().unwrap_or_default(), group),
                    want,
                    "{:?} {group}",
                    role.metadata.name
                );
            }
        }
    }

    #[test]
    fn feature_gates_reach_virt_apiserver_only_when_it_enforces_them() {
        assert!(
            !static_manifest(&Params::default())
                .unwrap()
                .contains("--feature-gates")
        );
        let gates: Vec<String> = ["Snapshot", "HostDisk", "LiveMigration", "HostDisk"]
            .map(String::from)
            .into();
        let p = Params {
            feature_gates: apiserver_feature_gates(&gates),
            ..Params::default()
        };
        assert!(
            static_manifest(&p)
                .unwrap()
                .contains("- --feature-gates=HostDisk\n")
        );
    }

    #[test]
    fn datavolumes_off_is_a_controller_flag_only_with_cdi() {
        assert!(
            !static_manifest(&Params::default())
                .unwrap()
                .contains("--datavolumes")
        );
        let p = Params {
            datavolumes: false,
            ..Params::default()
        };
        assert_eq!(datavolumes_flag(&p).as_deref(), Some("--datavolumes=false"));
        assert!(
            static_manifest(&p)
                .unwrap()
                .contains("- --datavolumes=false\n")
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
