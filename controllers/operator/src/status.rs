//! Pure decisions of the reconciler: which images and version a KubeVirt resource asks for,
//! and the phase and conditions that follow from what the cluster shows.

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kubevirt_api::kubevirt::KubeVirtStatus;
use kubevirt_api::{Condition, ConditionStatus};

use crate::kubevirt::KubeVirtSpec;

/// What the operator deploys unless the KubeVirt resource says otherwise.
#[derive(Debug, Clone)]
pub struct Defaults {
    /// e.g. `localhost/kubevirt-rs`.
    pub registry: String,
    /// e.g. `latest`.
    pub tag: String,
    /// The version reported for the default tag (the operator's own).
    pub version: String,
}

/// Images and version one KubeVirt resource asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub version: String,
    pub registry: String,
    pub apiserver: String,
    pub etcd: String,
    pub controller: String,
    pub handler: String,
    pub launcher: String,
}

/// `spec.imageRegistry`/`spec.imageTag` over the operator's defaults; the version is the tag
/// when the resource names one (KubeVirt's observedKubeVirtVersion), else the operator's.
pub fn target(spec: &KubeVirtSpec, d: &Defaults) -> Target {
    let registry = spec
        .image_registry
        .clone()
        .filter(|r| !r.is_empty())
        .unwrap_or_else(|| d.registry.clone());
    let registry = registry.trim_end_matches('/').to_string();
    let (tag, version) = match spec.image_tag.as_deref().filter(|t| !t.is_empty()) {
        Some(t) => (t.to_string(), t.to_string()),
        None => (d.tag.clone(), d.version.clone()),
    };
    let img = |c: &str| crate::install::image(&registry, c, &tag);
    Target {
        version,
        apiserver: img("virt-apiserver"),
        // etcd is not kubevirt-rs: a new kubevirt-rs version must not restart the store under
        // a serving API (one member), so it keeps the operator's own tag.
        etcd: crate::install::image(&registry, "etcd", &d.tag),
        controller: img("virt-controller"),
        handler: img("virt-handler"),
        launcher: img("virt-launcher"),
        registry,
    }
}

/// What the reconciler saw of the deployment. No `Default`: an empty list means "nothing
/// pending", which must be what the reconciler saw, never a forgotten field.
#[derive(Debug, Clone, PartialEq)]
pub struct Observed {
    /// What keeps the rollout from being done, one phrase per workload (etcd, virt-apiserver,
    /// virt-controller, virt-handler) naming what it waits for; empty once every workload runs
    /// the target's pod template with all replicas updated and available.
    pub rollout_pending: Vec<String>,
    /// Each APIService not reporting Available=True, with why; empty when both do.
    pub apiservices_pending: Vec<String>,
    /// At least one virt-apiserver replica serves (the API is up even mid-rollout).
    pub apiserver_serving: bool,
    /// A workload that is not progressing (e.g. a pod crash-looping), with why.
    pub failure: Option<String>,
    /// A field of the KubeVirt resource that cannot be applied (e.g. a bad
    /// certificateRotateStrategy), with why; what it governs is left as it is.
    pub invalid_config: Option<String>,
    /// What the resource sets that is kept but not implemented ([`unsupported_note`]).
    pub unsupported: Option<String>,
    /// A real CDI owns DataVolumes, with what that means ([`crate::cdi::Plan::note`]).
    pub cdi: Option<String>,
}

/// Reason of the Degraded condition for [`Observed::invalid_config`].
pub const INVALID_CONFIGURATION: &str = "InvalidConfiguration";

/// Container states that do not heal by waiting: the kubelet backs off and retries, but
/// something (an image, a flag, a crashing binary) has to change first.
const STUCK: &[&str] = &[
    "CrashLoopBackOff",
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

/// What a Deployment named `name` still waits for before it runs its latest pod template on
/// every replica, or `None` when it does.
pub fn deployment_pending(name: &str, d: Option<&Deployment>) -> Option<String> {
    let Some(d) = d else {
        return Some(format!("{name}: not created yet"));
    };
    let (Some(spec), Some(st)) = (d.spec.as_ref(), d.status.as_ref()) else {
        return Some(format!("{name}: no status yet"));
    };
    let want = spec.replicas.unwrap_or(1);
    if st.observed_generation < d.metadata.generation {
        return Some(format!(
            "{name}: its controller has not seen the latest spec"
        ));
    }
    let updated = st.updated_replicas.unwrap_or(0);
    let available = st.available_replicas.unwrap_or(0);
    let replicas = st.replicas.unwrap_or(0);
    (updated != want || available != want || replicas != want).then(|| {
        format!(
            "{name}: {updated} of {want} replicas updated, {available} available, {replicas} in all"
        )
    })
}

/// [`deployment_pending`] for a StatefulSet (ready replicas, one revision).
pub fn statefulset_pending(name: &str, s: Option<&StatefulSet>) -> Option<String> {
    let Some(s) = s else {
        return Some(format!("{name}: not created yet"));
    };
    let (Some(spec), Some(st)) = (s.spec.as_ref(), s.status.as_ref()) else {
        return Some(format!("{name}: no status yet"));
    };
    let want = spec.replicas.unwrap_or(1);
    if st.observed_generation < s.metadata.generation {
        return Some(format!(
            "{name}: its controller has not seen the latest spec"
        ));
    }
    let ready = st.ready_replicas.unwrap_or(0);
    let updated = st.updated_replicas.unwrap_or(0);
    if ready != want || updated != want {
        return Some(format!(
            "{name}: {updated} of {want} replicas updated, {ready} ready"
        ));
    }
    (st.current_revision != st.update_revision)
        .then(|| format!("{name}: its pods are not all at the update revision yet"))
}

/// [`deployment_pending`] for a DaemonSet (one pod per scheduled node).
pub fn daemonset_pending(name: &str, d: Option<&DaemonSet>) -> Option<String> {
    let Some(d) = d else {
        return Some(format!("{name}: not created yet"));
    };
    let Some(st) = d.status.as_ref() else {
        return Some(format!("{name}: no status yet"));
    };
    if st.observed_generation < d.metadata.generation {
        return Some(format!(
            "{name}: its controller has not seen the latest spec"
        ));
    }
    let want = st.desired_number_scheduled;
    let updated = st.updated_number_scheduled.unwrap_or(0);
    let available = st.number_available.unwrap_or(0);
    (updated != want || available != want)
        .then(|| format!("{name}: {updated} of {want} nodes updated, {available} available"))
}

/// Why the APIService `name` is not Available (kube-apiserver's reason and message), or
/// `None` when it is.
pub fn apiservice_pending(name: &str, a: Option<&APIService>) -> Option<String> {
    let Some(a) = a else {
        return Some(format!("APIService {name}: not created yet"));
    };
    let cond = a
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Available"));
    match cond {
        Some(c) if c.status == "True" => None,
        Some(c) => Some(
            format!(
                "APIService {name}: {} {}",
                c.reason.as_deref().unwrap_or("not available"),
                c.message.as_deref().unwrap_or_default()
            )
            .trim_end()
            .to_string(),
        ),
        None => Some(format!("APIService {name}: no Available condition yet")),
    }
}

/// Names of the operand pods being deleted (virt-operator's own excluded).
fn terminating_operand_pods(pods: &[k8s_openapi::api::core::v1::Pod]) -> Vec<String> {
    pods.iter()
        .filter(|p| {
            let operand = p
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app.kubernetes.io/name"))
                .is_some_and(|n| n != "virt-operator");
            operand && p.metadata.deletion_timestamp.is_some()
        })
        .map(|p| p.metadata.name.clone().unwrap_or_default())
        .collect()
}

/// What the rollout waits for because of terminating operand pods, or `None`: an old
/// virt-controller acts until it is gone (it may create a launcher pod from the previous
/// configuration), so a rollout is not done while one remains.
pub fn terminating_pending(pods: &[k8s_openapi::api::core::v1::Pod]) -> Option<String> {
    let names = terminating_operand_pods(pods);
    (!names.is_empty()).then(|| format!("pods still terminating: {}", names.join(", ")))
}

/// What the rollout waits for because more pods of Deployment `name` run than it wants,
/// or `None`. A Deployment's status can read "all replicas updated and available" a moment
/// before the old ReplicaSet's pods are deleted; until they are, an old virt-controller acts
/// on the previous configuration.
pub fn surplus_pending(
    name: &str,
    d: Option<&Deployment>,
    pods: &[k8s_openapi::api::core::v1::Pod],
) -> Option<String> {
    let want = d?.spec.as_ref()?.replicas.unwrap_or(1);
    let running = pods
        .iter()
        .filter(|p| {
            p.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app.kubernetes.io/name"))
                .is_some_and(|n| n == name)
                && p.metadata.deletion_timestamp.is_none()
                && !matches!(
                    p.status.as_ref().and_then(|s| s.phase.as_deref()),
                    Some("Succeeded" | "Failed")
                )
        })
        .count();
    (running as i32 > want).then(|| {
        format!("{name}: {running} pods running, {want} wanted (the previous ones not gone yet)")
    })
}

/// Why the deployment is failing, from its pods: the containers stuck in a state that needs
/// a change to heal (crash loops, image pulls), one sentence per pod, at most three, in
/// pod-name order so the condition does not flap between reconciles.
pub fn pod_failure(pods: &[k8s_openapi::api::core::v1::Pod]) -> Option<String> {
    let mut found: Vec<(String, String)> = Vec::new();
    for pod in pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let Some(st) = &pod.status else { continue };
        let statuses = st
            .init_container_statuses
            .iter()
            .flatten()
            .chain(st.container_statuses.iter().flatten());
        for cs in statuses {
            let Some(waiting) = cs.state.as_ref().and_then(|s| s.waiting.as_ref()) else {
                continue;
            };
            let reason = waiting.reason.as_deref().unwrap_or_default();
            if !STUCK.contains(&reason) {
                continue;
            }
            let mut why = format!("pod {name}: container {} is in {reason}", cs.name);
            if cs.restart_count > 0 {
                why.push_str(&format!(" ({} restarts", cs.restart_count));
                if let Some(t) = cs.last_state.as_ref().and_then(|s| s.terminated.as_ref()) {
                    why.push_str(&format!(", last exit code {}", t.exit_code));
                    if let Some(r) = t.reason.as_deref().filter(|r| !r.is_empty()) {
                        why.push_str(&format!(" ({r})"));
                    }
                }
                why.push(')');
            }
            if let Some(m) = waiting.message.as_deref().filter(|m| !m.is_empty()) {
                why.push_str(&format!(": {m}"));
            }
            found.push((name.clone(), why));
            break;
        }
    }
    if found.is_empty() {
        return None;
    }
    found.sort();
    let total = found.len();
    let mut text = found
        .into_iter()
        .take(3)
        .map(|(_, w)| w)
        .collect::<Vec<_>>()
        .join("; ");
    if total > 3 {
        text.push_str(&format!("; and {} more pods", total - 3));
    }
    Some(text)
}

/// KubeVirt feature gates whose feature kubevirt-rs has, always on (KubeVirt graduated them).
const ALWAYS_ON_GATES: &[&str] = &["LiveMigration"];

/// Reason of the Warning Event, and type of the status condition, naming what a KubeVirt
/// resource sets that kubevirt-rs keeps but does not implement ([`unsupported_note`]).
pub const UNSUPPORTED_FIELDS: &str = "UnsupportedFields";
/// Reason of the [`UNSUPPORTED_FIELDS`] condition.
pub const NOT_IMPLEMENTED: &str = "NotImplemented";

/// Top-level spec fields kubevirt-rs accepts with KubeVirt's schema but does not act on.
const UNIMPLEMENTED_SPEC_FIELDS: &[&str] = &[
    "imagePullSecrets",
    "productVersion",
    "productName",
    "productComponent",
    "customizeComponents",
];

/// Whether a JSON value says anything: `{}`, `[]`, `""` and null (what KubeVirt's own
/// kubevirt-cr.yaml writes for fields left at their defaults) do not.
fn is_set(v: &serde_json::Value) -> bool {
    use serde_json::Value;
    match v {
        Value::Null => false,
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => a.iter().any(is_set),
        Value::Object(m) => m.values().any(is_set),
        Value::Bool(_) | Value::Number(_) => true,
    }
}

/// The paths of the fields `spec` sets that kubevirt-rs keeps but does not implement, in a
/// stable order. Feature gates are [`unsupported_note`]'s, not listed here.
pub fn unimplemented_fields(spec: &KubeVirtSpec) -> Vec<String> {
    let v = serde_json::to_value(spec).unwrap_or_default();
    let mut out: Vec<String> = UNIMPLEMENTED_SPEC_FIELDS
        .iter()
        .filter(|f| v.get(**f).is_some_and(is_set))
        .map(|f| format!("spec.{f}"))
        .collect();
    for c in ["infra", "workloads"] {
        if v.pointer(&format!("/{c}/replicas")).is_some_and(is_set) {
            out.push(format!("spec.{c}.replicas"));
        }
    }
    if let Some(conf) = &spec.configuration {
        if let Some(dev) = &conf.developer_configuration {
            out.extend(
                dev.other
                    .iter()
                    .filter(|(_, v)| is_set(v))
                    .map(|(k, _)| format!("spec.configuration.developerConfiguration.{k}")),
            );
        }
        if let Some(m) = &conf.migrations {
            out.extend(
                m.other
                    .iter()
                    .filter(|(_, v)| is_set(v))
                    .map(|(k, _)| format!("spec.configuration.migrations.{k}")),
            );
        }
        if let Some(o) = &conf.virtual_machine_options {
            // KubeVirt's options are empty objects whose presence is the setting.
            out.extend(
                o.other
                    .keys()
                    .map(|k| format!("spec.configuration.virtualMachineOptions.{k}")),
            );
        }
        out.extend(
            conf.other
                .iter()
                .filter(|(_, v)| is_set(v))
                .map(|(k, _)| format!("spec.configuration.{k}")),
        );
    }
    out
}

/// What to tell a user whose KubeVirt resource sets what kubevirt-rs does not implement:
/// the fields (kept as given, no effect) and the feature gates (kubevirt-rs enforces only
/// HostDisk, so any other gate names a feature that is always on here or one it lacks).
/// Saying so beats silently accepting something the user relies on; rejecting it would
/// break KubeVirt users' own resources. `None` when everything set takes effect.
pub fn unsupported_note(spec: &KubeVirtSpec) -> Option<String> {
    let mut parts = Vec::new();
    let fields = unimplemented_fields(spec);
    if !fields.is_empty() {
        let (verb, pronoun) = if fields.len() == 1 {
            ("is", "it has")
        } else {
            ("are", "they have")
        };
        parts.push(format!(
            "{} {verb} kept but not implemented by kubevirt-rs; {pronoun} no effect",
            fields.join(", ")
        ));
    }
    let gates = spec
        .configuration
        .as_ref()
        .and_then(|c| c.developer_configuration.as_ref())
        .and_then(|d| d.feature_gates.clone())
        .unwrap_or_default();
    if let Some(g) = feature_gates_note(&gates) {
        parts.push(g);
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

fn feature_gates_note(gates: &[String]) -> Option<String> {
    let mut missing: Vec<&str> = gates
        .iter()
        .map(String::as_str)
        // HostDisk is a real gate: virt-apiserver enforces it (render::APISERVER_GATES).
        .filter(|g| !ALWAYS_ON_GATES.contains(g) && !crate::render::APISERVER_GATES.contains(g))
        .collect();
    missing.sort_unstable();
    missing.dedup();
    if missing.is_empty() {
        return None;
    }
    let (verb, pronoun) = if missing.len() == 1 {
        ("is", "it has")
    } else {
        ("are", "they have")
    };
    Some(format!(
        "spec.configuration.developerConfiguration.featureGates: {} {verb} not implemented by \
         kubevirt-rs; {pronoun} no effect (always on: {})",
        missing.join(", "),
        ALWAYS_ON_GATES.join(", ")
    ))
}

pub const DEPLOYING: &str = "Deploying";
pub const DEPLOYED: &str = "Deployed";
pub const DELETING: &str = "Deleting";

fn cond(type_: &str, ok: bool, reason: &str, message: &str) -> Condition {
    Condition::new(type_, ConditionStatus::from_bool(ok), reason, message)
}

/// The status for `target` given `observed`, keeping transition times of conditions whose
/// status did not change.
pub fn status(
    previous: Option<&KubeVirtStatus>,
    target: &Target,
    observed: &Observed,
    generation: Option<i64>,
    now: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> KubeVirtStatus {
    let apiservices_available = observed.apiservices_pending.is_empty();
    let done = observed.rollout_pending.is_empty() && apiservices_available;
    let prev_observed = previous.and_then(|s| s.observed_kube_virt_version.clone());
    let observed_version = if done {
        Some(target.version.clone())
    } else {
        prev_observed
    };
    let available = apiservices_available && observed.apiserver_serving;
    let waiting = observed
        .rollout_pending
        .iter()
        .chain(&observed.apiservices_pending)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join("; ");
    let mut conditions = vec![
        if available {
            cond(
                "Available",
                true,
                "AllComponentsReady",
                if done {
                    "All components are ready."
                } else {
                    "The API is served while the deployment progresses."
                },
            )
        } else {
            cond(
                "Available",
                false,
                "DeploymentInProgress",
                &if observed.apiservices_pending.is_empty() {
                    "No virt-apiserver replica is available yet.".to_string()
                } else {
                    format!(
                        "virt-apiserver is not serving both APIServices yet: {}.",
                        observed.apiservices_pending.join("; ")
                    )
                },
            )
        },
        if done {
            cond(
                "Progressing",
                false,
                "AllComponentsReady",
                "All components are ready.",
            )
        } else {
            cond(
                "Progressing",
                true,
                "DeploymentInProgress",
                &format!(
                    "Deploying version {}: waiting for {waiting}.",
                    target.version
                ),
            )
        },
        match (&observed.failure, &observed.invalid_config) {
            (Some(why), _) => cond("Degraded", true, "ComponentFailing", why),
            (None, Some(why)) => cond("Degraded", true, INVALID_CONFIGURATION, why),
            (None, None) => cond(
                "Degraded",
                false,
                "AllComponentsHealthy",
                "All components are healthy.",
            ),
        },
    ];
    // Present only while there is something to name: the usual resource has nothing.
    if let Some(note) = &observed.unsupported {
        conditions.push(cond(UNSUPPORTED_FIELDS, true, NOT_IMPLEMENTED, note));
    }
    // Present only on a cluster with CDI.
    if let Some(note) = &observed.cdi {
        conditions.push(cond(crate::cdi::CONDITION, true, crate::cdi::REASON, note));
    }
    let prev_conditions = previous
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    for c in &mut conditions {
        let same = prev_conditions
            .iter()
            .find(|p| p.type_ == c.type_)
            .filter(|p| p.status == c.status);
        c.last_transition_time = match same {
            Some(p) => p.last_transition_time.clone(),
            None => Some(now.clone()),
        };
        c.last_probe_time = None;
    }
    KubeVirtStatus {
        phase: Some(if done { DEPLOYED } else { DEPLOYING }.to_string()),
        conditions: Some(conditions),
        target_kube_virt_version: Some(target.version.clone()),
        observed_kube_virt_version: observed_version,
        observed_generation: generation,
        // virt-controller's workload updater writes it; kept as it is.
        outdated_virtual_machine_instance_workloads: previous
            .and_then(|s| s.outdated_virtual_machine_instance_workloads),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn defaults() -> Defaults {
        Defaults {
            registry: "localhost/kubevirt-rs".into(),
            tag: "latest".into(),
            version: "0.1.0".into(),
        }
    }

    fn now() -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap())
    }

    #[test]
    fn a_terminating_operand_pod_holds_the_rollout_back() {
        let pod = |name: &str, terminating: bool| -> k8s_openapi::api::core::v1::Pod {
            serde_json::from_value(serde_json::json!({"metadata": {
                "name": format!("{name}-x"),
                "labels": {"app.kubernetes.io/name": name},
                "deletionTimestamp": if terminating { serde_json::json!("2026-12-01T00:00:00Z") } else { serde_json::Value::Null },
            }}))
            .unwrap()
        };
        assert_eq!(terminating_pending(&[pod("virt-controller", false)]), None);
        assert_eq!(
            terminating_pending(&[pod("virt-controller", true)]).as_deref(),
            Some("pods still terminating: virt-controller-x")
        );
        assert_eq!(terminating_pending(&[pod("virt-operator", true)]), None);

        // More live pods than the Deployment wants: the old ReplicaSet's are still there.
        let d: Deployment = serde_json::from_value(
            serde_json::json!({"spec": {"replicas": 2, "selector": {}, "template": {}}}),
        )
        .unwrap();
        let two = [pod("virt-controller", false), pod("virt-controller", false)];
        assert_eq!(surplus_pending("virt-controller", Some(&d), &two), None);
        let mut three = two.to_vec();
        three.push(pod("virt-controller", false));
        assert_eq!(
            surplus_pending("virt-controller", Some(&d), &three).as_deref(),
            Some("virt-controller: 3 pods running, 2 wanted (the previous ones not gone yet)")
        );
        three[2] = pod("virt-controller", true);
        assert_eq!(surplus_pending("virt-controller", Some(&d), &three), None);
    }

    #[test]
    fn image_tag_and_registry_override_the_operators_defaults() {
        let t = target(&KubeVirtSpec::default(), &defaults());
        assert_eq!(t.apiserver, "localhost/kubevirt-rs/virt-apiserver:latest");
        assert_eq!(t.version, "0.1.0");
        let spec = KubeVirtSpec {
            image_tag: Some("v2".into()),
            image_registry: Some("registry.example/kv/".into()),
            ..KubeVirtSpec::default()
        };
        let t = target(&spec, &defaults());
        assert_eq!(t.handler, "registry.example/kv/virt-handler:v2");
        assert_eq!(t.launcher, "registry.example/kv/virt-launcher:v2");
        assert_eq!(t.etcd, "registry.example/kv/etcd:latest");
        assert_eq!(t.version, "v2");
    }

    /// A fresh install: nothing created yet.
    fn fresh() -> Observed {
        Observed {
            rollout_pending: vec!["kubevirt-apiserver: not created yet".into()],
            apiservices_pending: vec!["APIService v1.kubevirt.io: not created yet".into()],
            apiserver_serving: false,
            failure: None,
            invalid_config: None,
            unsupported: None,
            cdi: None,
        }
    }

    fn condition(s: &KubeVirtStatus, ty: &str) -> Condition {
        s.conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == ty)
            .unwrap()
            .clone()
    }

    #[test]
    fn deployed_only_when_rolled_out_and_the_apiservices_are_available() {
        let t = target(&KubeVirtSpec::default(), &defaults());
        let s = status(None, &t, &fresh(), Some(1), now());
        assert_eq!(s.phase.as_deref(), Some(DEPLOYING));
        assert_eq!(s.observed_kube_virt_version, None);
        // What the installation waits for is in its conditions, so `kubectl get kubevirt -o
        // yaml` (and a deploy that times out) says which part is stuck.
        assert_eq!(
            condition(&s, "Progressing").message.as_deref(),
            Some(
                "Deploying version 0.1.0: waiting for kubevirt-apiserver: not created yet; \
                 APIService v1.kubevirt.io: not created yet."
            )
        );
        assert_eq!(
            condition(&s, "Available").message.as_deref(),
            Some(
                "virt-apiserver is not serving both APIServices yet: APIService v1.kubevirt.io: \
                 not created yet."
            )
        );
        let ok = Observed {
            rollout_pending: vec![],
            apiservices_pending: vec![],
            apiserver_serving: true,
            failure: None,
            invalid_config: None,
            unsupported: None,
            cdi: None,
        };
        let s = status(Some(&s), &t, &ok, Some(1), now());
        assert_eq!(s.phase.as_deref(), Some(DEPLOYED));
        assert_eq!(s.observed_kube_virt_version.as_deref(), Some("0.1.0"));
        let avail = |s: &KubeVirtStatus, ty: &str| {
            s.conditions
                .as_ref()
                .unwrap()
                .iter()
                .find(|c| c.type_ == ty)
                .unwrap()
                .status
        };
        assert_eq!(avail(&s, "Available"), ConditionStatus::True);
        assert_eq!(avail(&s, "Progressing"), ConditionStatus::False);

        // Upgrade: the old version stays observed and the API Available while rolling.
        let spec = KubeVirtSpec {
            image_tag: Some("v2".into()),
            ..KubeVirtSpec::default()
        };
        let t2 = target(&spec, &defaults());
        let rolling = Observed {
            rollout_pending: vec!["virt-handler: 1 of 2 nodes updated, 2 available".into()],
            ..ok.clone()
        };
        let s2 = status(Some(&s), &t2, &rolling, Some(2), now());
        assert_eq!(s2.phase.as_deref(), Some(DEPLOYING));
        assert_eq!(s2.observed_kube_virt_version.as_deref(), Some("0.1.0"));
        assert_eq!(s2.target_kube_virt_version.as_deref(), Some("v2"));
        assert_eq!(avail(&s2, "Available"), ConditionStatus::True);
        assert_eq!(avail(&s2, "Progressing"), ConditionStatus::True);

        // A bad field degrades the installation but leaves it deployed.
        let bad = Observed {
            invalid_config: Some("spec.x: invalid duration \"x\"".into()),
            ..ok
        };
        let s3 = status(Some(&s), &t, &bad, Some(3), now());
        assert_eq!(s3.phase.as_deref(), Some(DEPLOYED));
        let degraded = s3
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == "Degraded")
            .unwrap();
        assert_eq!(degraded.status, ConditionStatus::True);
        assert_eq!(degraded.reason.as_deref(), Some(INVALID_CONFIGURATION));
        assert_eq!(
            degraded.message.as_deref(),
            Some("spec.x: invalid duration \"x\"")
        );
    }

    fn pod(name: &str, statuses: serde_json::Value) -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "status": {"containerStatuses": statuses}
        }))
        .unwrap()
    }

    #[test]
    fn crash_loops_and_image_pulls_are_failures_waiting_pods_are_not() {
        let healthy = pod(
            "virt-controller-a",
            serde_json::json!([{"name": "c", "ready": true, "restartCount": 0, "image": "i", "imageID": "",
                "state": {"running": {}}}]),
        );
        let creating = pod(
            "virt-handler-b",
            serde_json::json!([{"name": "h", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                "state": {"waiting": {"reason": "ContainerCreating"}}}]),
        );
        assert_eq!(pod_failure(&[healthy.clone(), creating.clone()]), None);
        let crashing = pod(
            "kubevirt-apiserver-x",
            serde_json::json!([{"name": "apiserver", "ready": false, "restartCount": 4, "image": "i", "imageID": "",
                "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 1m20s restarting failed container"}},
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]),
        );
        let pulling = pod(
            "virt-handler-a",
            serde_json::json!([{"name": "handler", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"x:nope\""}}}]),
        );
        assert_eq!(
            pod_failure(&[healthy, creating, pulling, crashing]).as_deref(),
            Some(
                "pod kubevirt-apiserver-x: container apiserver is in CrashLoopBackOff (4 restarts, \
                 last exit code 1 (Error)): back-off 1m20s restarting failed container; \
                 pod virt-handler-a: container handler is in ImagePullBackOff: Back-off pulling image \"x:nope\""
            )
        );
    }

    #[test]
    fn many_failing_pods_are_summarised() {
        let pods: Vec<_> = (0..5)
            .map(|i| {
                pod(
                    &format!("p{i}"),
                    serde_json::json!([{"name": "c", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                        "state": {"waiting": {"reason": "ErrImagePull"}}}]),
                )
            })
            .collect();
        let text = pod_failure(&pods).unwrap();
        assert!(
            text.starts_with("pod p0: container c is in ErrImagePull; pod p1"),
            "{text}"
        );
        assert!(text.ends_with("; and 2 more pods"), "{text}");
    }

    fn spec(v: serde_json::Value) -> KubeVirtSpec {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn feature_gates_we_lack_are_named_always_on_ones_are_not() {
        let gates = |g: &[&str]| {
            spec(
                serde_json::json!({"configuration": {"developerConfiguration": {"featureGates": g}}}),
            )
        };
        assert_eq!(unsupported_note(&gates(&[])), None);
        assert_eq!(unsupported_note(&gates(&["LiveMigration"])), None);
        assert_eq!(
            unsupported_note(&gates(&["HostDisk", "LiveMigration"])),
            None
        );
        assert_eq!(
            unsupported_note(&gates(&[
                "Snapshot",
                "HostDisk",
                "LiveMigration",
                "HotplugVolumes",
                "ExpandDisks",
                "Snapshot"
            ]))
            .as_deref(),
            Some(
                "spec.configuration.developerConfiguration.featureGates: ExpandDisks, Snapshot \
                 are not implemented by kubevirt-rs; they have no effect (always on: LiveMigration)"
            )
        );
        assert!(
            unsupported_note(&gates(&["Sidecar"]))
                .unwrap()
                .contains("Sidecar is not implemented by kubevirt-rs; it has no effect")
        );
    }

    #[test]
    fn kubevirts_own_cr_sets_nothing_unimplemented() {
        // KubeVirt's kubevirt-cr.yaml: empty objects say nothing.
        let s = spec(serde_json::json!({"certificateRotateStrategy": {},
            "configuration": {"developerConfiguration": {"featureGates": []}},
            "customizeComponents": {}, "imagePullPolicy": "IfNotPresent",
            "workloadUpdateStrategy": {}}));
        assert_eq!(unimplemented_fields(&s), Vec::<String>::new());
        assert_eq!(unsupported_note(&s), None);
    }

    #[test]
    fn unimplemented_fields_are_named_implemented_ones_are_not() {
        let s = spec(serde_json::json!({
            "imageTag": "v1", "imagePullPolicy": "Always", "uninstallStrategy": "RemoveWorkloads",
            "monitorNamespace": "monitoring", "productName": "", "productVersion": "v1",
            "workloadUpdateStrategy": {"workloadUpdateMethods": ["LiveMigrate"]},
            "customizeComponents": {"patches": []},
            "infra": {"replicas": 3, "nodePlacement": {"nodeSelector": {"a": "b"}}},
            "configuration": {
                "developerConfiguration": {"useEmulation": true, "featureGates": ["Snapshot"],
                    "logVerbosity": {"virtLauncher": 4}},
                "migrations": {"parallelMigrationsPerCluster": 5, "allowPostCopy": true},
                "virtualMachineOptions": {"disableSerialConsoleLog": {},
                    "disableFreePageReporting": {}},
                "network": {}}}));
        assert_eq!(
            unimplemented_fields(&s),
            [
                "spec.productVersion",
                "spec.infra.replicas",
                "spec.configuration.developerConfiguration.logVerbosity",
                "spec.configuration.migrations.allowPostCopy",
                "spec.configuration.virtualMachineOptions.disableFreePageReporting",
            ]
        );
        let note = unsupported_note(&s).unwrap();
        assert!(
            note.starts_with(
                "spec.productVersion, spec.infra.replicas, \
                 spec.configuration.developerConfiguration.logVerbosity, \
                 spec.configuration.migrations.allowPostCopy, \
                 spec.configuration.virtualMachineOptions.disableFreePageReporting are kept but not implemented by kubevirt-rs; \
                 they have no effect; spec.configuration.developerConfiguration.featureGates: \
                 Snapshot is not implemented"
            ),
            "{note}"
        );
        // The condition names them, and goes when they do.
        let t = target(&s, &defaults());
        let observed = Observed {
            unsupported: Some(note.clone()),
            ..fresh()
        };
        let st = status(None, &t, &observed, Some(1), now());
        let c = st
            .conditions
            .as_ref()
            .unwrap()
            .iter()
            .find(|c| c.type_ == UNSUPPORTED_FIELDS)
            .unwrap();
        assert_eq!(c.status, ConditionStatus::True);
        assert_eq!(c.reason.as_deref(), Some(NOT_IMPLEMENTED));
        assert_eq!(c.message.as_deref(), Some(note.as_str()));
        let st = status(Some(&st), &t, &fresh(), Some(2), now());
        assert!(
            !st.conditions
                .unwrap()
                .iter()
                .any(|c| c.type_ == UNSUPPORTED_FIELDS)
        );
    }

    #[test]
    fn each_workload_names_what_it_waits_for() {
        let dep: Deployment = serde_json::from_value(serde_json::json!({
            "metadata": {"generation": 2},
            "spec": {"replicas": 2, "selector": {}, "template": {}},
            "status": {"observedGeneration": 2, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 0},
        }))
        .unwrap();
        assert_eq!(
            deployment_pending("kubevirt-apiserver", Some(&dep)).as_deref(),
            Some("kubevirt-apiserver: 2 of 2 replicas updated, 0 available, 2 in all")
        );
        assert_eq!(
            deployment_pending("kubevirt-apiserver", None).as_deref(),
            Some("kubevirt-apiserver: not created yet")
        );
        let mut done = dep.clone();
        done.status.as_mut().unwrap().available_replicas = Some(2);
        assert_eq!(deployment_pending("kubevirt-apiserver", Some(&done)), None);
        let mut stale = done;
        stale.metadata.generation = Some(3);
        assert!(
            deployment_pending("x", Some(&stale))
                .unwrap()
                .contains("latest spec")
        );

        let ds: DaemonSet = serde_json::from_value(serde_json::json!({
            "metadata": {"generation": 1},
            "status": {"observedGeneration": 1, "desiredNumberScheduled": 2,
                       "updatedNumberScheduled": 1, "numberAvailable": 2,
                       "currentNumberScheduled": 2, "numberMisscheduled": 0, "numberReady": 2},
        }))
        .unwrap();
        assert_eq!(
            daemonset_pending("virt-handler", Some(&ds)).as_deref(),
            Some("virt-handler: 1 of 2 nodes updated, 2 available")
        );

        let sts: StatefulSet = serde_json::from_value(serde_json::json!({
            "metadata": {"generation": 1},
            "spec": {"replicas": 1, "selector": {}, "serviceName": "e", "template": {}},
            "status": {"observedGeneration": 1, "replicas": 1, "readyReplicas": 1,
                       "updatedReplicas": 1, "currentRevision": "a", "updateRevision": "b"},
        }))
        .unwrap();
        assert_eq!(
            statefulset_pending("kubevirt-etcd", Some(&sts)).as_deref(),
            Some("kubevirt-etcd: its pods are not all at the update revision yet")
        );

        let api: APIService = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "v1.kubevirt.io"},
            "spec": {"groupPriorityMinimum": 1000, "versionPriority": 15},
            "status": {"conditions": [{"type": "Available", "status": "False",
                "reason": "FailedDiscoveryCheck", "message": "failing or missing response"}]},
        }))
        .unwrap();
        assert_eq!(
            apiservice_pending("v1.kubevirt.io", Some(&api)).as_deref(),
            Some("APIService v1.kubevirt.io: FailedDiscoveryCheck failing or missing response")
        );
        assert_eq!(
            apiservice_pending("v1.kubevirt.io", None).as_deref(),
            Some("APIService v1.kubevirt.io: not created yet")
        );
    }

    #[test]
    fn cdi_installed_is_a_condition_of_its_own_while_it_lasts() {
        let t = target(&KubeVirtSpec::default(), &defaults());
        let plan = crate::cdi::decide(true, None);
        let observed = Observed {
            cdi: plan.note.clone(),
            ..fresh()
        };
        let st = status(None, &t, &observed, Some(1), now());
        let c = condition(&st, crate::cdi::CONDITION);
        assert_eq!(c.status, ConditionStatus::True);
        assert_eq!(c.reason.as_deref(), Some(crate::cdi::REASON));
        assert_eq!(c.message, plan.note);
        // Nothing else changes: it is no failure.
        assert_eq!(condition(&st, "Degraded").status, ConditionStatus::False);
        let st = status(Some(&st), &t, &fresh(), Some(2), now());
        assert!(
            !st.conditions
                .unwrap()
                .iter()
                .any(|c| c.type_ == crate::cdi::CONDITION)
        );
    }
}
