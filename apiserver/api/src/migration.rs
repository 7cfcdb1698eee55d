//! VirtualMachineInstanceMigration: a request to live-migrate a VMI to another node.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use crate::common::Condition;

/// Specification of a migration.
#[skip_serializing_none]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kubevirt.io",
    version = "v1",
    kind = "VirtualMachineInstanceMigration",
    plural = "virtualmachineinstancemigrations",
    singular = "virtualmachineinstancemigration",
    shortname = "vmim",
    shortname = "vmims",
    category = "all",
    namespaced,
    status = "VirtualMachineInstanceMigrationStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceMigrationSpec {
    /// Name of the VMI to migrate, in the same namespace.
    #[serde(default)]
    pub vmi_name: String,
    /// Extra node selector terms for the target pod.
    pub added_node_selector: Option<BTreeMap<String, String>>,
}

/// Phase of a migration.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum VirtualMachineInstanceMigrationPhase {
    /// Not yet seen by the controller.
    #[default]
    #[serde(rename = "")]
    Unset,
    /// Accepted, waiting for capacity.
    Pending,
    /// The target pod is being scheduled.
    Scheduling,
    /// The target pod runs.
    Scheduled,
    /// The target node prepares the domain.
    PreparingTarget,
    /// The target waits for the memory stream.
    TargetReady,
    /// Memory is being transferred.
    Running,
    /// The guest runs on the target.
    Succeeded,
    /// The migration failed or was cancelled; the guest runs on the source.
    Failed,
}

impl VirtualMachineInstanceMigrationPhase {
    /// Succeeded or Failed.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }

    /// The phase as written on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unset => "",
            Self::Pending => "Pending",
            Self::Scheduling => "Scheduling",
            Self::Scheduled => "Scheduled",
            Self::PreparingTarget => "PreparingTarget",
            Self::TargetReady => "TargetReady",
            Self::Running => "Running",
            Self::Succeeded => "Succeeded",
            Self::Failed => "Failed",
        }
    }
}

/// Observed state of a migration.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceMigrationStatus {
    /// Phase.
    #[serde(default, skip_serializing_if = "is_unset")]
    pub phase: VirtualMachineInstanceMigrationPhase,
    /// When each phase was entered.
    pub phase_transition_timestamps: Option<Vec<MigrationPhaseTransitionTimestamp>>,
    /// Conditions.
    pub conditions: Option<Vec<Condition>>,
    /// Details of the migration.
    pub migration_state: Option<VirtualMachineInstanceMigrationState>,
}

fn is_unset(p: &VirtualMachineInstanceMigrationPhase) -> bool {
    *p == VirtualMachineInstanceMigrationPhase::Unset
}

/// When a migration phase was entered.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigrationPhaseTransitionTimestamp {
    /// The phase.
    #[serde(default)]
    pub phase: VirtualMachineInstanceMigrationPhase,
    /// When it was entered.
    pub phase_transition_timestamp: Option<Time>,
}

/// Details of a migration, kept on the VMI and the migration object.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceMigrationState {
    /// UID of the migration object.
    pub migration_uid: Option<String>,
    /// When the transfer started.
    pub start_timestamp: Option<Time>,
    /// When the migration ended.
    pub end_timestamp: Option<Time>,
    /// Node the guest leaves.
    pub source_node: Option<String>,
    /// Node the guest moves to.
    pub target_node: Option<String>,
    /// Launcher pod on the source node.
    pub source_pod: Option<String>,
    /// Launcher pod on the target node.
    pub target_pod: Option<String>,
    /// Address of the target's migration endpoint.
    pub target_node_address: Option<String>,
    /// The target domain was seen running.
    pub target_node_domain_detected: Option<bool>,
    /// `PreCopy` or `PostCopy`.
    pub mode: Option<String>,
    /// The migration completed.
    pub completed: Option<bool>,
    /// The migration failed.
    pub failed: Option<bool>,
    /// Cancellation was requested.
    pub abort_requested: Option<bool>,
    /// `Aborting`, `Succeeded` or `Failed`.
    pub abort_status: Option<String>,
    /// Why it failed.
    pub failure_reason: Option<String>,
    /// Bytes of memory to transfer in total.
    pub data_total_bytes: Option<i64>,
    /// Bytes of memory already transferred.
    pub data_processed_bytes: Option<i64>,
    /// Bytes of memory still to transfer.
    pub data_remaining_bytes: Option<i64>,
    /// Pre-copy iteration.
    pub iteration: Option<i64>,
    /// Measured or expected downtime in milliseconds.
    pub downtime_ms: Option<i64>,
}
