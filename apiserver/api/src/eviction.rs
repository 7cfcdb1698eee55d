//! Eviction of a launcher pod (a node drain, the descheduler): what a VMI's
//! `evictionStrategy` asks for, shared by virt-apiserver (which answers the eviction) and
//! virt-controller (which migrates the VMIs it marked). docs/cluster-flow.md §7.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::VirtualMachineInstance;
use crate::migration::migratable;

/// Annotation of a migration created to evacuate a VMI: the node it leaves (KubeVirt's).
pub const EVACUATION_MIGRATION_ANNOTATION: &str = "kubevirt.io/evacuationMigration";
/// Annotation of an evacuation migration created while its node was cordoned (a drain):
/// uncordoning the node before the guest starts moving cancels it.
pub const EVACUATION_DRAIN_ANNOTATION: &str = "kubevirt-rs.io/evacuation-drain";
/// Path of virt-apiserver's validating webhook for launcher pods' evictions.
pub const WEBHOOK_PATH: &str = "/admission/launcher-eviction";
/// Name prefix of launcher pods (`generateName` `virt-launcher-<vmi>-`): what the webhook's
/// match condition selects.
pub const LAUNCHER_POD_PREFIX: &str = "virt-launcher-";
/// Name prefix of the pods of kubevirt-rs's own etcd (StatefulSet `kubevirt-etcd`, in the
/// components' namespace): their evictions go to the same webhook, which refuses them until
/// virt-operator has moved the member to another node (issue 51, docs/deploy.md).
pub const ETCD_POD_PREFIX: &str = "kubevirt-etcd-";
/// Annotation the webhook puts on an etcd pod whose eviction was asked (RFC 3339 time): the
/// operator moves that member even when its node is not cordoned.
pub const ETCD_EVACUATE_ANNOTATION: &str = "kubevirt-rs.io/evacuation-requested";
/// Annotation virt-operator keeps on an etcd pod it is moving, or cannot move: what it is
/// doing, which the webhook's refusal quotes.
pub const ETCD_EVACUATION_STATUS_ANNOTATION: &str = "kubevirt-rs.io/evacuation-status";
/// Annotation virt-operator puts on an etcd pod whose member it has replaced elsewhere (RFC
/// 3339 time): the pod holds nothing any more, and its eviction passes. A drain evicts a pod
/// by name again and again until it is gone: the old pod must go by that eviction, or the
/// drain would next evict its successor of the same name on another node.
pub const ETCD_REPLACED_ANNOTATION: &str = "kubevirt-rs.io/etcd-member-replaced";
/// `generateName` of evacuation migrations (KubeVirt's).
pub const EVACUATION_MIGRATION_PREFIX: &str = "kubevirt-evacuation-";

/// What happens to a VMI when its launcher pod is evicted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum EvictionStrategy {
    /// The pod goes and the guest with it; the VM's runStrategy decides what follows.
    None,
    /// The eviction is refused while the VMI is live-migrated away; a VMI that cannot
    /// migrate blocks the eviction.
    LiveMigrate,
    /// As `LiveMigrate` when the VMI can migrate, else as `None`.
    LiveMigrateIfPossible,
    /// The eviction is refused and `status.evacuationNodeName` set; another controller
    /// (cluster-api-provider-kubevirt) acts on it.
    External,
}

impl EvictionStrategy {
    /// Every value, in KubeVirt's order.
    pub const ALL: [Self; 4] = [
        Self::None,
        Self::LiveMigrate,
        Self::LiveMigrateIfPossible,
        Self::External,
    ];

    /// The value as written in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "None",
            Self::LiveMigrate => "LiveMigrate",
            Self::LiveMigrateIfPossible => "LiveMigrateIfPossible",
            Self::External => "External",
        }
    }

    /// Parses an API value (the cluster default comes as a flag).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.as_str() == s)
    }
}

impl std::fmt::Display for EvictionStrategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The strategy in force for `vmi`: its own, else the cluster's default (KubeVirt's
/// `configuration.evictionStrategy`, itself `None` unless set).
pub fn effective(
    vmi: &VirtualMachineInstance,
    cluster_default: EvictionStrategy,
) -> EvictionStrategy {
    vmi.spec.eviction_strategy.unwrap_or(cluster_default)
}

/// What an eviction of a VMI's active launcher pod does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Let the pod go (the guest stops).
    Allow,
    /// Refuse, and mark the VMI for evacuation from its node.
    Evacuate,
    /// Refuse with this reason; nothing changes (the evictor retries).
    Refuse(String),
}

/// What evicting the active launcher pod of `vmi` does under `strategy`.
pub fn plan(vmi: &VirtualMachineInstance, strategy: EvictionStrategy) -> Plan {
    match strategy {
        EvictionStrategy::None => Plan::Allow,
        EvictionStrategy::External => Plan::Evacuate,
        EvictionStrategy::LiveMigrateIfPossible => match migratable(vmi) {
            Ok(()) => Plan::Evacuate,
            Err(_) => Plan::Allow,
        },
        EvictionStrategy::LiveMigrate => match migratable(vmi) {
            Ok(()) => Plan::Evacuate,
            Err(why) => Plan::Refuse(format!(
                "VMI {}/{} has evictionStrategy LiveMigrate but is not live-migratable ({why}): \
                 it keeps its node until it can migrate, is stopped, or its evictionStrategy changes",
                vmi.metadata.namespace.as_deref().unwrap_or_default(),
                vmi.metadata.name.as_deref().unwrap_or_default(),
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn vmi(extra_spec: serde_json::Value, status: serde_json::Value) -> VirtualMachineInstance {
        let mut spec = json!({"domain": {"devices": {}}});
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra_spec.as_object()) {
            s.extend(e.clone());
        }
        serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "a", "namespace": "ns"},
            "spec": spec, "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn the_vmi_strategy_wins_over_the_cluster_default() {
        let own = vmi(json!({"evictionStrategy": "None"}), json!({}));
        assert_eq!(
            effective(&own, EvictionStrategy::LiveMigrate),
            EvictionStrategy::None
        );
        let unset = vmi(json!({}), json!({}));
        assert_eq!(
            effective(&unset, EvictionStrategy::LiveMigrate),
            EvictionStrategy::LiveMigrate
        );
    }

    #[test]
    fn every_value_parses_back() {
        for v in EvictionStrategy::ALL {
            assert_eq!(EvictionStrategy::parse(v.as_str()), Some(v));
            assert_eq!(serde_json::to_value(v).unwrap(), json!(v.as_str()));
        }
        assert_eq!(EvictionStrategy::parse("Migrate"), None);
    }

    #[test]
    fn plans_follow_kubevirt() {
        let ok = vmi(json!({}), json!({}));
        let not = vmi(
            json!({}),
            json!({"conditions": [{"type": "LiveMigratable", "status": "False",
                "reason": "DisksNotLiveMigratable", "message": "PVC d is not shared"}]}),
        );
        use EvictionStrategy as S;
        assert_eq!(plan(&ok, S::None), Plan::Allow);
        assert_eq!(plan(&ok, S::LiveMigrate), Plan::Evacuate);
        assert_eq!(plan(&ok, S::LiveMigrateIfPossible), Plan::Evacuate);
        assert_eq!(plan(&ok, S::External), Plan::Evacuate);
        assert_eq!(plan(&not, S::LiveMigrateIfPossible), Plan::Allow);
        assert_eq!(plan(&not, S::External), Plan::Evacuate);
        match plan(&not, S::LiveMigrate) {
            Plan::Refuse(why) => {
                assert!(why.contains("ns/a"), "{why}");
                assert!(why.contains("PVC d is not shared"), "{why}");
            }
            other => panic!("{other:?}"),
        }
    }
}
