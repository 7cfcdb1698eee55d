//! Small types shared by several kinds.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

/// Status of a condition, as in Kubernetes: `True`, `False` or `Unknown`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ConditionStatus {
    /// The condition holds.
    True,
    /// The condition does not hold.
    False,
    /// It is not known whether the condition holds.
    #[default]
    Unknown,
}

impl ConditionStatus {
    /// `True` for `true`, `False` otherwise.
    pub fn from_bool(b: bool) -> Self {
        if b { Self::True } else { Self::False }
    }
}

/// A condition of a VirtualMachine, VirtualMachineInstance or migration.
///
/// KubeVirt's conditions predate `metav1.Condition` and carry `lastProbeTime` and no
/// `observedGeneration`; we keep KubeVirt's shape so existing status documents decode.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Condition type, e.g. `Ready`, `Paused`, `LiveMigratable`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: ConditionStatus,
    /// Last time the condition was probed.
    pub last_probe_time: Option<Time>,
    /// Last time the condition changed status.
    pub last_transition_time: Option<Time>,
    /// One-word CamelCase reason for the last transition.
    pub reason: Option<String>,
    /// Human-readable details about the last transition.
    pub message: Option<String>,
}

impl Condition {
    /// A condition of `type_` with the given status, reason and message.
    pub fn new(type_: &str, status: ConditionStatus, reason: &str, message: &str) -> Self {
        Self {
            type_: type_.to_string(),
            status,
            reason: (!reason.is_empty()).then(|| reason.to_string()),
            message: (!message.is_empty()).then(|| message.to_string()),
            ..Self::default()
        }
    }
}

/// Finds the condition of `type_` in `conditions`.
pub fn find_condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Inserts or replaces the condition with the same type. The transition time is kept
/// when the status did not change, so that `lastTransitionTime` means what it says.
pub fn set_condition(conditions: &mut Vec<Condition>, mut new: Condition) {
    if let Some(old) = conditions.iter_mut().find(|c| c.type_ == new.type_) {
        if old.status == new.status && new.last_transition_time.is_none() {
            new.last_transition_time = old.last_transition_time.clone();
        }
        *old = new;
    } else {
        conditions.push(new);
    }
}

/// Removes the condition of `type_`, if present.
pub fn remove_condition(conditions: &mut Vec<Condition>, type_: &str) {
    conditions.retain(|c| c.type_ != type_);
}

/// A reference to a Secret in the same namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalObjectReference {
    /// Name of the referent.
    #[serde(default)]
    pub name: String,
}
