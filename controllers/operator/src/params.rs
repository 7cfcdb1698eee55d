//! What a `KubeVirt` resource asks for, as parameters: flags, placement, etcd's layout and
//! the rendered objects. Pure (no API calls), so every rule is table-tested here; the
//! reconcile only reports what these refuse.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::apps::v1::StatefulSet;
use kubevirt_api::eviction::EvictionStrategy;
use sha2::{Digest, Sha256};

use crate::certs_step::Certs;
use crate::ctx::Error;
use crate::kubevirt::KubeVirt;
use crate::render::components;
use crate::render::etcd::{self, EtcdParams, EtcdStorage};
use crate::render::{self, ClusterAuth, EtcdMode, Params, Placement};
use crate::status::Target;

pub(crate) fn placement(c: Option<&kubevirt_api::kubevirt::ComponentConfig>) -> Placement {
    let Some(np) = c.and_then(|c| c.node_placement.clone()) else {
        return Placement::default();
    };
    Placement {
        node_selector: np.node_selector,
        tolerations: np.tolerations,
        affinity: np.affinity,
    }
}

/// `developerConfiguration.useEmulation`: VMs may run on QEMU's TCG without `/dev/kvm`.
pub(crate) fn emulation_allowed(kv: &KubeVirt) -> bool {
    kv.spec
        .configuration
        .as_ref()
        .and_then(|c| c.developer_configuration.as_ref())
        .and_then(|d| d.use_emulation)
        .unwrap_or(false)
}

/// Renders everything for `kv`: (all objects but the APIServices, the APIServices).
pub(crate) fn render_all(
    kv: &KubeVirt,
    target: &Target,
    certs: &Certs,
    auth: &ClusterAuth,
    etcd_params: EtcdParams,
    datavolumes: bool,
) -> Result<(Vec<serde_json::Value>, Vec<serde_json::Value>), Error> {
    // Certificates are not in here: virt-apiserver and virt-handler re-read their mounted
    // Secrets, so a rotation restarts nothing. The cluster's CAs are read at start only.
    let annotations = BTreeMap::from([(
        "kubevirt-rs.io/auth-sha256".to_string(),
        sha256_hex(
            format!(
                "{}{}{}",
                auth.client_ca, auth.requestheader_ca, auth.allowed_names
            )
            .as_bytes(),
        ),
    )]);
    let dev = kv
        .spec
        .configuration
        .as_ref()
        .and_then(|c| c.developer_configuration.as_ref());
    let p = Params {
        apiserver_image: target.apiserver.clone(),
        etcd_image: target.etcd.clone(),
        controller_image: target.controller.clone(),
        handler_image: target.handler.clone(),
        launcher_image: target.launcher.clone(),
        pod_annotations: annotations,
        handler_annotations: BTreeMap::new(),
        controller_annotations: BTreeMap::new(),
        etcd: EtcdMode::StatefulSet(etcd_params),
        image_pull_policy: kv
            .spec
            .image_pull_policy
            .clone()
            .unwrap_or_else(|| "IfNotPresent".into()),
        allow_emulation: emulation_allowed(kv),
        feature_gates: render::apiserver_feature_gates(
            dev.and_then(|d| d.feature_gates.as_deref())
                .unwrap_or_default(),
        ),
        infra: placement(kv.spec.infra.as_ref()),
        workloads: placement(kv.spec.workloads.as_ref()),
        // An unknown value is reported (invalid_config) and the default kept.
        eviction_strategy: eviction_strategy(kv)
            .ok()
            .flatten()
            .unwrap_or(EvictionStrategy::None),
        // Invalid parts are reported (invalid_config) and left out.
        workload_update: workload_update(kv).unwrap_or_default(),
        migration_flags: migration_flags(kv)
            .unwrap_or_default()
            .into_iter()
            .chain(instancetype_flags(kv).unwrap_or_default())
            .chain(live_update_flags(kv).unwrap_or_default())
            .collect(),
        serial_console_log: kv
            .spec
            .configuration
            .as_ref()
            .is_none_or(|c| c.serial_console_log()),
        apiserver_limit_flags: apiserver_limit_flags(kv),
        datavolumes,
    };
    let mut yaml = render::static_manifest(&p)?;
    yaml.push_str(&render::cluster_manifest(&certs.serving, auth)?);
    components::handler_secrets(&mut yaml, &certs.handler)?;
    for s in certs.etcd.secrets() {
        render::push_doc(&mut yaml, &s)?;
    }
    let mut docs = parse_docs(&yaml)?;
    // The namespace holds the operator itself: it is not the operand's to own or delete.
    docs.retain(|d| d["kind"] != "Namespace");
    // Secrets and the ConfigMap before the pods that mount them.
    docs.sort_by_key(|d| !matches!(d["kind"].as_str(), Some("Secret" | "ConfigMap")));
    // The eviction webhook also waits for a serving replica: it fails closed for launcher pods.
    let (mut apiservices, rest): (Vec<_>, Vec<_>) = docs
        .into_iter()
        .partition(|d| d["kind"] == "APIService" || d["kind"] == "ValidatingWebhookConfiguration");
    let b64 = base64::engine::general_purpose::STANDARD.encode(certs.bundle.as_bytes());
    for a in &mut apiservices {
        if a["kind"] == "APIService" {
            a["spec"]["caBundle"] = serde_json::Value::String(b64.clone());
        } else if let Some(hooks) = a["webhooks"].as_array_mut() {
            for h in hooks {
                h["clientConfig"]["caBundle"] = serde_json::Value::String(b64.clone());
            }
        }
    }
    Ok((rest, apiservices))
}

/// The cluster's default evictionStrategy (`spec.configuration.evictionStrategy`), or why it
/// is not one.
pub(crate) fn eviction_strategy(kv: &KubeVirt) -> Result<Option<EvictionStrategy>, String> {
    let Some(v) = kv
        .spec
        .configuration
        .as_ref()
        .and_then(|c| c.eviction_strategy.as_deref())
    else {
        return Ok(None);
    };
    EvictionStrategy::parse(v).map(Some).ok_or_else(|| {
        let supported: Vec<&str> = EvictionStrategy::ALL.iter().map(|s| s.as_str()).collect();
        format!(
            "spec.configuration.evictionStrategy: Unsupported value: {v:?}: supported values: {}",
            supported.join(", ")
        )
    })
}

/// `spec.configuration.migrations` as virt-controller's flags (only the fields set), or the
/// field that is wrong.
pub(crate) fn migration_flags(kv: &KubeVirt) -> Result<Vec<String>, String> {
    let Some(m) = kv
        .spec
        .configuration
        .as_ref()
        .and_then(|c| c.migrations.as_ref())
    else {
        return Ok(Vec::new());
    };
    let fields = [
        (
            "parallelMigrationsPerCluster",
            m.parallel_migrations_per_cluster,
            "--parallel-migrations-per-cluster",
        ),
        (
            "parallelOutboundMigrationsPerNode",
            m.parallel_outbound_migrations_per_node,
            "--parallel-outbound-migrations-per-node",
        ),
        (
            "progressTimeout",
            m.progress_timeout,
            "--migration-progress-timeout-seconds",
        ),
        (
            "completionTimeoutPerGiB",
            m.completion_timeout_per_gib,
            "--migration-completion-timeout-per-gib-seconds",
        ),
    ];
    let mut out = Vec::new();
    for (field, value, flag) in fields {
        match value {
            None => {}
            Some(v) if v >= 1 => out.push(format!("{flag}={v}")),
            Some(v) => {
                return Err(format!(
                    "spec.configuration.migrations.{field}: Invalid value: {v}: must be at least 1"
                ));
            }
        }
    }
    Ok(out)
}

/// `spec.configuration.instancetype.referencePolicy` as virt-controller's flag (none for
/// the default), or the field that is wrong.
pub(crate) fn instancetype_flags(kv: &KubeVirt) -> Result<Vec<String>, String> {
    use kubevirt_api::instancetype::vm::ReferencePolicy;
    let Some(v) = kv
        .spec
        .configuration
        .as_ref()
        .and_then(|c| c.instancetype.as_ref())
        .and_then(|i| i.reference_policy.as_deref())
    else {
        return Ok(Vec::new());
    };
    match ReferencePolicy::parse(v) {
        Some(ReferencePolicy::Reference) => Ok(Vec::new()),
        Some(p) => Ok(vec![format!(
            "--instancetype-reference-policy={}",
            p.as_str()
        )]),
        None => Err(format!(
            "spec.configuration.instancetype.referencePolicy: Unsupported value: {v:?}: \
             supported values: reference, expand, expandAll"
        )),
    }
}

/// `spec.configuration.vmRolloutStrategy` and `liveUpdateConfiguration` as
/// virt-controller's flags (none for the defaults), or the field that is wrong.
pub(crate) fn live_update_flags(kv: &KubeVirt) -> Result<Vec<String>, String> {
    use kubevirt_api::kubevirt::VmRolloutStrategy;
    let Some(c) = kv.spec.configuration.as_ref() else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    if let Some(v) = c.vm_rollout_strategy.as_deref() {
        match VmRolloutStrategy::parse(v) {
            Some(VmRolloutStrategy::Stage) => {}
            Some(s) => out.push(format!("--vm-rollout-strategy={}", s.as_str())),
            None => {
                return Err(format!(
                    "spec.configuration.vmRolloutStrategy: Unsupported value: {v:?}: \
                     supported values: Stage, LiveUpdate"
                ));
            }
        }
    }
    let Some(l) = c.live_update_configuration.as_ref() else {
        return Ok(out);
    };
    for (field, value, flag) in [
        (
            "maxHotplugRatio",
            l.max_hotplug_ratio,
            "--max-hotplug-ratio",
        ),
        ("maxCpuSockets", l.max_cpu_sockets, "--max-cpu-sockets"),
    ] {
        match value {
            None => {}
            Some(v) if v >= 1 => out.push(format!("{flag}={v}")),
            Some(v) => {
                return Err(format!(
                    "spec.configuration.liveUpdateConfiguration.{field}: Invalid value: {v}: \
                     must be at least 1"
                ));
            }
        }
    }
    if let Some(q) = &l.max_guest {
        out.push(format!("--max-guest={}", q.0));
    }
    Ok(out)
}

/// `spec.workloadUpdateStrategy` as virt-controller's flags take it, or what is wrong.
pub(crate) fn workload_update(kv: &KubeVirt) -> Result<render::WorkloadUpdate, String> {
    let Some(w) = kv.spec.workload_update_strategy.as_ref() else {
        return Ok(render::WorkloadUpdate::default());
    };
    let mut methods = Vec::new();
    for m in w.workload_update_methods.iter().flatten() {
        match m.as_str() {
            "LiveMigrate" | "Evict" if !methods.contains(m) => methods.push(m.clone()),
            "LiveMigrate" | "Evict" => {}
            other => {
                return Err(format!(
                    "spec.workloadUpdateStrategy.workloadUpdateMethods: Unsupported value: \
                     {other:?}: supported values: LiveMigrate, Evict"
                ));
            }
        }
    }
    if let Some(n) = w.batch_eviction_size
        && n < 1
    {
        return Err(format!(
            "spec.workloadUpdateStrategy.batchEvictionSize: Invalid value: {n}: must be at least 1"
        ));
    }
    let interval = match &w.batch_eviction_interval {
        None => None,
        Some(s) => {
            let d = crate::policy::parse_duration(s)
                .map_err(|e| format!("spec.workloadUpdateStrategy.batchEvictionInterval: {e}"))?;
            Some(u64::try_from(d.whole_seconds()).unwrap_or(0).max(1))
        }
    };
    Ok(render::WorkloadUpdate {
        methods,
        batch_size: w.batch_eviction_size,
        batch_interval_seconds: interval,
    })
}

/// virt-apiserver's flags from `spec.kubevirtRs.apiserver`: the per-user limits that are
/// set (kube-apiserver refuses negative values: the CRD's minimum).
pub(crate) fn apiserver_limit_flags(kv: &KubeVirt) -> Vec<String> {
    let Some(a) = kv
        .spec
        .kubevirt_rs
        .as_ref()
        .and_then(|r| r.apiserver.as_ref())
    else {
        return Vec::new();
    };
    [
        ("--max-streams-per-user", a.max_streams_per_user),
        ("--max-watches-per-user", a.max_watches_per_user),
    ]
    .into_iter()
    .filter_map(|(flag, v)| Some(format!("{flag}={}", v?.max(0))))
    .collect()
}

/// The field that sets etcd's member count.
pub const ETCD_MEMBERS_FIELD: &str = "spec.kubevirtRs.etcd.members";

/// `spec.kubevirtRs.etcd.members`, or what is wrong with it (`None`: unset). kube-apiserver
/// already refuses other values (the CRD's enum); this holds for a resource stored before.
pub(crate) fn etcd_members(kv: &KubeVirt) -> Result<Option<usize>, String> {
    let Some(n) = kv
        .spec
        .kubevirt_rs
        .as_ref()
        .and_then(|r| r.etcd.as_ref())
        .and_then(|e| e.members)
    else {
        return Ok(None);
    };
    if kubevirt_api::kubevirt::ETCD_MEMBER_COUNTS.contains(&n) {
        Ok(usize::try_from(n).ok())
    } else {
        Err(format!(
            "{ETCD_MEMBERS_FIELD}: Unsupported value: {n}: supported values: \"1\", \"3\""
        ))
    }
}

/// Members when `spec.kubevirtRs.etcd.members` is unset: three where the cluster has three
/// schedulable nodes to spread them over (one node lost, the API still answers), else one,
/// which [`etcd_evacuation`] moves off a node being drained. Never fewer than there are (a
/// node drained for maintenance is no reason to give up a member), and only on claims.
pub(crate) fn default_etcd_members(
    schedulable_nodes: usize,
    current: usize,
    on_claims: bool,
) -> usize {
    // Two is never a target: it is a single member's spare while it moves.
    if current >= etcd::MAX_MEMBERS || (on_claims && schedulable_nodes >= etcd::MAX_MEMBERS) {
        etcd::MAX_MEMBERS
    } else {
        1
    }
}

/// etcd's shape for one reconcile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EtcdLayout {
    /// Render the cluster (member Services, peer TLS) rather than the single member.
    pub(crate) cluster: bool,
    /// Members to have.
    pub(crate) desired: usize,
    /// Why the requested count is not taken (the field named), if it is not.
    pub(crate) refused: Option<String>,
}

/// Where etcd goes from here: `requested` members (`None`: keep what there is), given where
/// its data lives and the StatefulSet there is. A cluster needs a volume per member, i.e. a
/// PVC: on a host directory every member would share one directory of one node, so more than
/// one member is refused there, naming the field. Once a cluster, always rendered as one
/// (also at 1 member): going back would restart the member for nothing.
pub(crate) fn etcd_layout(
    requested: Option<usize>,
    storage: &EtcdStorage,
    existing: Option<&StatefulSet>,
    leaving: bool,
) -> EtcdLayout {
    // A member can move (etcd_evacuation) only with peers that can reach it: new
    // installations on claims are clusters from their first member on, and a single member
    // from before is made one when its node is drained (one restart of the member, with
    // the API down for its seconds: the last time).
    let on_claims = matches!(storage, EtcdStorage::Claim { .. });
    let is_cluster =
        existing.is_some_and(etcd::is_cluster) || (on_claims && (existing.is_none() || leaving));
    let current = existing
        .and_then(|s| s.spec.as_ref())
        .and_then(|s| s.replicas)
        .and_then(|r| usize::try_from(r).ok())
        .filter(|_| is_cluster)
        .unwrap_or(1);
    let want = requested.unwrap_or(current);
    if want > 1 && !matches!(storage, EtcdStorage::Claim { .. }) {
        let why = match storage {
            EtcdStorage::HostPath { node, path } => format!(
                "etcd keeps its data in the host directory {path} of node {node} (the cluster \
                 had no default StorageClass when it was installed)"
            ),
            _ => "the cluster has no default StorageClass".to_string(),
        };
        return EtcdLayout {
            cluster: is_cluster,
            desired: current,
            refused: Some(format!(
                "{ETCD_MEMBERS_FIELD}: {want} members need a PersistentVolumeClaim each, but \
                 {why}: staying at {current} (docs/deploy.md, \"etcd members\")"
            )),
        };
    }
    EtcdLayout {
        cluster: is_cluster || want > 1,
        desired: want,
        refused: None,
    }
}

/// When to reconcile a Deployed installation again: when the next certificate step is due
/// (a little after, so it is due then), at least a second and at most a minute from now.
pub(crate) fn requeue_after(
    next_due: Option<time::OffsetDateTime>,
    now: time::OffsetDateTime,
) -> Duration {
    const MAX: Duration = Duration::from_secs(60);
    let Some(due) = next_due else {
        return MAX;
    };
    let wait = due - now + time::Duration::milliseconds(200);
    let wait = Duration::try_from(wait).unwrap_or(Duration::ZERO);
    wait.clamp(Duration::from_secs(1), MAX)
}

/// The documents of a rendered YAML stream (`---` lines separate them; PEM blocks inside
/// block scalars end in `-----` too, so only a whole line counts).
pub(crate) fn parse_docs(yaml: &str) -> Result<Vec<serde_json::Value>, Error> {
    let mut docs = Vec::new();
    let mut cur = String::new();
    for line in yaml.lines().chain(std::iter::once("---")) {
        if line == "---" {
            if cur
                .lines()
                .any(|l| !l.trim().is_empty() && !l.starts_with('#'))
            {
                docs.push(
                    serde_saphyr::from_str(&cur)
                        .map_err(|e| Error::Other(format!("parsing rendered YAML: {e}")))?,
                );
            }
            cur.clear();
        } else {
            cur.push_str(line);
            cur.push('\n');
        }
    }
    Ok(docs)
}

pub(crate) fn sha256_hex(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::rotation::{self, Domain};

    #[test]
    fn etcd_members_need_a_claim_each_and_a_cluster_stays_one() {
        let claim = EtcdStorage::Claim { size: "1Gi".into() };
        let host = EtcdStorage::HostPath {
            node: "node-a".into(),
            path: "/var/lib/kubevirt-rs/etcd-1".into(),
        };
        let sts = |cluster: bool, replicas: i32| {
            let e = EtcdParams {
                storage: claim.clone(),
                topology: if cluster {
                    etcd::Topology::Cluster(etcd::ClusterTopology {
                        member_ips: vec!["10.0.0.1".into(); 3],
                        replicas,
                    })
                } else {
                    etcd::Topology::Single
                },
                ..EtcdParams::default()
            };
            let p = Params {
                etcd: EtcdMode::StatefulSet(e),
                ..Params::default()
            };
            let text = render::static_manifest(&p).unwrap();
            let doc = parse_docs(&text)
                .unwrap()
                .into_iter()
                .find(|d| d["kind"] == "StatefulSet")
                .unwrap();
            serde_json::from_value::<StatefulSet>(doc).unwrap()
        };
        let layout = |requested, storage: &EtcdStorage, existing: Option<&StatefulSet>| {
            let l = etcd_layout(requested, storage, existing, false);
            (l.cluster, l.desired, l.refused.is_some())
        };
        // A new installation on claims is a cluster from its first member on (so that the
        // member can move off a drained node); the single member from before clusters stays
        // as it is until its node is drained.
        assert_eq!(layout(Some(1), &claim, None), (true, 1, false));
        assert_eq!(layout(Some(1), &host, None), (false, 1, false));
        assert_eq!(layout(Some(3), &claim, None), (true, 3, false));
        let single = sts(false, 1);
        assert_eq!(layout(Some(1), &claim, Some(&single)), (false, 1, false));
        assert!(
            etcd_layout(Some(1), &claim, Some(&single), true).cluster,
            "a single member on a claim whose node is drained becomes a cluster"
        );
        assert!(!etcd_layout(Some(1), &host, Some(&single), true).cluster);
        assert_eq!(layout(Some(3), &claim, Some(&single)), (true, 3, false));
        // The bootstrap (no KubeVirt resource) keeps what there is.
        let three = sts(true, 3);
        assert_eq!(layout(None, &claim, Some(&three)), (true, 3, false));
        assert_eq!(layout(None, &claim, Some(&single)), (false, 1, false));
        // Shrunk back to one: still rendered as a cluster (no restart for nothing).
        assert_eq!(layout(Some(1), &claim, Some(&three)), (true, 1, false));
        // One directory of one node cannot hold three members: refused, by name.
        assert_eq!(layout(Some(3), &host, Some(&single)), (false, 1, true));
        let refused = etcd_layout(Some(3), &host, Some(&single), false)
            .refused
            .unwrap();
        assert!(
            refused.starts_with(
                "spec.kubevirtRs.etcd.members: 3 members need a PersistentVolumeClaim each"
            ) && refused.contains("node node-a"),
            "{refused}"
        );
        let none = etcd_layout(Some(3), &EtcdStorage::Ephemeral, None, false)
            .refused
            .unwrap();
        assert!(none.contains("no default StorageClass"), "{none}");
    }

    #[test]
    fn an_etcd_member_count_kube_apiserver_would_refuse_names_the_field() {
        let kv = |n: i32| -> KubeVirt {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
                "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
                "spec": {"kubevirtRs": {"etcd": {"members": n}}},
            }))
            .unwrap()
        };
        assert_eq!(etcd_members(&kv(3)), Ok(Some(3)));
        assert_eq!(
            etcd_members(&KubeVirt::new("kubevirt", Default::default())),
            Ok(None)
        );
        assert_eq!(
            etcd_members(&kv(2)),
            Err("spec.kubevirtRs.etcd.members: Unsupported value: 2: supported values: \"1\", \"3\"".into())
        );
    }

    /// Only the limits set become flags: an installation that sets none keeps its pods.
    #[test]
    fn apiserver_limits_become_flags_only_when_set() {
        let kv = |spec: serde_json::Value| -> KubeVirt {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
                "metadata": {"name": "kubevirt"}, "spec": spec}))
            .unwrap()
        };
        assert!(apiserver_limit_flags(&kv(serde_json::json!({}))).is_empty());
        assert_eq!(
            apiserver_limit_flags(&kv(
                serde_json::json!({"kubevirtRs": {"apiserver": {"maxStreamsPerUser": 2}}})
            )),
            vec!["--max-streams-per-user=2"]
        );
        assert_eq!(
            apiserver_limit_flags(&kv(serde_json::json!({"kubevirtRs": {"apiserver":
                {"maxStreamsPerUser": 0, "maxWatchesPerUser": 50}}}))),
            vec!["--max-streams-per-user=0", "--max-watches-per-user=50"]
        );
    }

    /// Issue 51 point 3: unset, three members where three schedulable nodes can hold them
    /// (on claims), else one; never fewer than there are.
    #[test]
    fn etcd_members_default_to_three_where_three_nodes_can_hold_them() {
        assert_eq!(default_etcd_members(2, 1, true), 1);
        assert_eq!(default_etcd_members(3, 1, true), 3);
        assert_eq!(
            default_etcd_members(5, 1, false),
            1,
            "a host directory holds one"
        );
        assert_eq!(
            default_etcd_members(2, 3, true),
            3,
            "a drained node costs no member"
        );
        assert_eq!(
            default_etcd_members(2, 2, true),
            1,
            "a spare left by a move goes once it is not needed"
        );
    }

    /// `disableSerialConsoleLog` reaches virt-controller as a flag; without it the
    /// controller's arguments stay as they were.
    #[test]
    fn disable_serial_console_log_becomes_a_controller_flag() {
        let p = Params {
            serial_console_log: false,
            ..Params::default()
        };
        assert_eq!(
            render::serial_console_log_flag(&p).as_deref(),
            Some("--serial-console-log=false")
        );
        assert_eq!(render::serial_console_log_flag(&Params::default()), None);
    }

    #[test]
    fn an_unknown_eviction_strategy_names_the_field() {
        let kv = |v: &str| -> KubeVirt {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
                "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
                "spec": {"configuration": {"evictionStrategy": v}},
            }))
            .unwrap()
        };
        assert_eq!(
            eviction_strategy(&kv("LiveMigrate")),
            Ok(Some(EvictionStrategy::LiveMigrate))
        );
        let err = eviction_strategy(&kv("Migrate")).unwrap_err();
        assert!(
            err.starts_with("spec.configuration.evictionStrategy: Unsupported value: \"Migrate\""),
            "{err}"
        );
    }

    #[test]
    fn workload_update_strategy_becomes_flags_or_names_the_field() {
        let kv = |w: serde_json::Value| -> KubeVirt {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
                "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
                "spec": {"workloadUpdateStrategy": w},
            }))
            .unwrap()
        };
        let w = workload_update(&kv(serde_json::json!({
            "workloadUpdateMethods": ["LiveMigrate", "Evict", "LiveMigrate"],
            "batchEvictionSize": 3, "batchEvictionInterval": "1m30s"})))
        .unwrap();
        let p = Params {
            workload_update: w,
            ..Params::default()
        };
        assert_eq!(
            render::workload_update_flags(&p),
            [
                "--workload-update-methods=LiveMigrate,Evict",
                "--workload-update-batch-size=3",
                "--workload-update-batch-interval-seconds=90"
            ]
        );
        // KubeVirt's own kubevirt-cr.yaml: `workloadUpdateStrategy: {}`, nothing automated.
        let none = workload_update(&kv(serde_json::json!({}))).unwrap();
        assert!(
            render::workload_update_flags(&Params {
                workload_update: none,
                ..Params::default()
            })
            .is_empty()
        );
        let err = workload_update(&kv(
            serde_json::json!({"workloadUpdateMethods": ["Migrate"]}),
        ))
        .unwrap_err();
        assert!(
            err.starts_with("spec.workloadUpdateStrategy.workloadUpdateMethods"),
            "{err}"
        );
        let err =
            workload_update(&kv(serde_json::json!({"batchEvictionInterval": "soon"}))).unwrap_err();
        assert!(
            err.starts_with("spec.workloadUpdateStrategy.batchEvictionInterval"),
            "{err}"
        );
    }

    #[test]
    fn rollout_strategy_and_live_update_limits_become_controller_flags() {
        let kv = |c: serde_json::Value| -> KubeVirt {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
                "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
                "spec": {"configuration": c},
            }))
            .unwrap()
        };
        assert!(
            live_update_flags(&kv(serde_json::json!({"vmRolloutStrategy": "Stage"})))
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            live_update_flags(&kv(serde_json::json!({
                "vmRolloutStrategy": "LiveUpdate",
                "liveUpdateConfiguration": {"maxHotplugRatio": 2, "maxCpuSockets": 8, "maxGuest": "8Gi"}
            })))
            .unwrap(),
            [
                "--vm-rollout-strategy=LiveUpdate",
                "--max-hotplug-ratio=2",
                "--max-cpu-sockets=8",
                "--max-guest=8Gi"
            ]
        );
        let err =
            live_update_flags(&kv(serde_json::json!({"vmRolloutStrategy": "Live"}))).unwrap_err();
        assert!(
            err.starts_with("spec.configuration.vmRolloutStrategy: Unsupported value"),
            "{err}"
        );
        let err = live_update_flags(&kv(serde_json::json!({
            "liveUpdateConfiguration": {"maxHotplugRatio": 0}
        })))
        .unwrap_err();
        assert!(err.contains("maxHotplugRatio"), "{err}");
    }

    #[test]
    fn migration_configuration_becomes_controller_flags() {
        let kv = |m: serde_json::Value| -> KubeVirt {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
                "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
                "spec": {"configuration": {"migrations": m}},
            }))
            .unwrap()
        };
        assert_eq!(
            migration_flags(&kv(serde_json::json!({
                "parallelMigrationsPerCluster": 10, "parallelOutboundMigrationsPerNode": 4,
                "completionTimeoutPerGiB": 800, "bandwidthPerMigration": "64Mi"})))
            .unwrap(),
            [
                "--parallel-migrations-per-cluster=10",
                "--parallel-outbound-migrations-per-node=4",
                "--migration-completion-timeout-per-gib-seconds=800"
            ]
        );
        let err = migration_flags(&kv(serde_json::json!({"progressTimeout": 0}))).unwrap_err();
        assert!(
            err.starts_with("spec.configuration.migrations.progressTimeout"),
            "{err}"
        );
    }

    #[test]
    fn rendered_secrets_parse_back_with_their_pem_blocks() {
        let handler = rotation::handler_tls(&rotation::first_install(
            Domain::Handler,
            &Default::default(),
        ))
        .unwrap();
        let mut yaml = String::new();
        components::handler_secrets(&mut yaml, &handler).unwrap();
        let auth = ClusterAuth {
            client_ca: handler.ca.clone(),
            requestheader_ca: handler.ca.clone(),
            allowed_names: "front-proxy-client".into(),
        };
        let tls = rotation::serving_tls(&rotation::first_install(
            Domain::Apiserver,
            &Default::default(),
        ))
        .unwrap();
        yaml.push_str(&render::cluster_manifest(&tls, &auth).unwrap());
        let docs = parse_docs(&yaml).unwrap();
        // Handler client Secret and CA ConfigMap, serving Secret and ConfigMap, APIServices
        // (one per group-version), eviction webhook.
        assert_eq!(docs.len(), 2 + 2 + render::api_services().len() + 1);
        let handler_ca = docs
            .iter()
            .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == "virt-handler-ca")
            .unwrap();
        assert_eq!(handler_ca["data"]["ca.crt"], handler.ca.as_str());
        let cm = docs
            .iter()
            .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] != "virt-handler-ca")
            .unwrap();
        assert_eq!(cm["data"]["client-ca-file"], handler.ca.as_str());
    }
}
