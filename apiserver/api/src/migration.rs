//! VirtualMachineInstanceMigration: a request to live-migrate a VMI to another node.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use crate::common::Condition;
use crate::vmi::VirtualMachineInstance;

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

/// Details of a migration, kept on the VMI and mirrored on the migration object.
///
/// KubeVirt's `VirtualMachineInstanceMigrationState`, field for field, plus the progress
/// figures at the end (a kubevirt-rs extension: KubeVirt only exports them as metrics).
/// Who writes which field is the contract in docs/cluster-flow.md §6.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceMigrationState {
    /// When the transfer started.
    pub start_timestamp: Option<Time>,
    /// When the migration ended.
    pub end_timestamp: Option<Time>,
    /// When the target node saw the domain active.
    pub target_node_domain_ready_timestamp: Option<Time>,
    /// The target domain was seen running.
    pub target_node_domain_detected: Option<bool>,
    /// Address of the target's migration endpoint.
    pub target_node_address: Option<String>,
    /// Ports opened for the migration on the target node, by logical port.
    pub target_direct_migration_node_ports: Option<BTreeMap<String, i32>>,
    /// Node the guest moves to.
    pub target_node: Option<String>,
    /// Launcher pod on the target node.
    pub target_pod: Option<String>,
    /// UID of the target attachment pod for hotplug volumes.
    #[serde(rename = "targetAttachmentPodUID")]
    pub target_attachment_pod_uid: Option<String>,
    /// Node the guest leaves.
    pub source_node: Option<String>,
    /// Launcher pod on the source node.
    pub source_pod: Option<String>,
    /// The migration completed.
    pub completed: Option<bool>,
    /// The migration failed.
    pub failed: Option<bool>,
    /// Cancellation was requested.
    pub abort_requested: Option<bool>,
    /// Outcome of a requested cancellation.
    pub abort_status: Option<MigrationAbortStatus>,
    /// Why it failed.
    pub failure_reason: Option<String>,
    /// UID of the migration object.
    pub migration_uid: Option<String>,
    /// Pre-copy or post-copy.
    pub mode: Option<MigrationMode>,
    /// Name of the MigrationPolicy applied, if any.
    pub migration_policy_name: Option<String>,
    /// Dedicated CPUs of the guest on the target node.
    #[serde(rename = "targetCPUSet")]
    pub target_cpu_set: Option<Vec<i32>>,
    /// NUMA topology of the target node, for dedicated CPUs.
    pub target_node_topology: Option<String>,
    /// Bytes of memory to transfer in total (kubevirt-rs).
    pub data_total_bytes: Option<i64>,
    /// Bytes of memory already transferred (kubevirt-rs).
    pub data_processed_bytes: Option<i64>,
    /// Bytes of memory still to transfer (kubevirt-rs).
    pub data_remaining_bytes: Option<i64>,
    /// Pre-copy iteration (kubevirt-rs).
    pub iteration: Option<i64>,
    /// Measured or expected downtime in milliseconds (kubevirt-rs).
    pub downtime_ms: Option<i64>,
}

impl VirtualMachineInstanceMigrationState {
    /// The state belongs to the migration with this uid.
    pub fn is_for(&self, migration_uid: &str) -> bool {
        self.migration_uid.as_deref() == Some(migration_uid)
    }

    /// The migration ended one way or the other (completed, failed, or an end time).
    pub fn is_finished(&self) -> bool {
        self.completed == Some(true) || self.failed == Some(true) || self.end_timestamp.is_some()
    }

    /// The transfer started and has not ended: KubeVirt's `migrations.IsMigrating`,
    /// which makes a VM's printableStatus `Migrating`.
    pub fn is_transferring(&self) -> bool {
        self.start_timestamp.is_some() && self.end_timestamp.is_none()
    }
}

/// Outcome of a requested cancellation (KubeVirt's `MigrationAbortStatus`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum MigrationAbortStatus {
    /// The migration was aborted; the guest runs on the source.
    Succeeded,
    /// The abort failed; the migration goes on.
    Failed,
    /// The abort is in progress.
    Aborting,
}

/// Copy mode of a running migration (KubeVirt's `MigrationMode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum MigrationMode {
    /// Memory is copied while the guest runs on the source.
    PreCopy,
    /// The guest runs on the target and pulls missing pages from the source.
    PostCopy,
}

/// How a VMI's disks travel in a migration (`status.migrationMethod`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum MigrationMethod {
    /// Some disks are local to the source and are copied with the memory.
    BlockMigration,
    /// Every disk is shared; only memory and device state move.
    LiveMigration,
}

impl MigrationMethod {
    /// The method as written on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::BlockMigration => "BlockMigration",
            Self::LiveMigration => "LiveMigration",
        }
    }
}

/// Well-known migration labels, annotations, finalizer and condition types (KubeVirt's).
pub mod names {
    /// Label of a migration target pod: the migration's uid.
    pub const MIGRATION_JOB_LABEL: &str = "kubevirt.io/migrationJobUID";
    /// Annotation of a migration target pod: the migration's name.
    pub const MIGRATION_JOB_NAME_ANNOTATION: &str = "kubevirt.io/migrationJobName";
    /// VMI label naming the node of the migration target pod while a migration runs.
    pub const MIGRATION_TARGET_NODE_NAME_LABEL: &str = "kubevirt.io/migrationTargetNodeName";
    /// Finalizer that keeps a migration until its target pod is cleaned up.
    pub const MIGRATION_FINALIZER: &str = "kubevirt.io/migrationJobFinalize";
    /// Label `migrate` puts on the migrations it creates: the VMI name.
    pub const VMI_NAME_LABEL: &str = "kubevirt.io/vmi-name";
    /// Migration annotation: seconds an unschedulable target pod may wait (KubeVirt's,
    /// for functional tests).
    pub const UNSCHEDULABLE_POD_TIMEOUT_ANNOTATION: &str =
        "kubevirt.io/migrationUnschedulablePodTimeoutSeconds";
    /// Migration annotation: seconds a target pod may stay Pending for any reason.
    pub const PENDING_POD_TIMEOUT_ANNOTATION: &str =
        "kubevirt.io/migrationPendingPodTimeoutSeconds";
    /// VMI annotation allowing a bridge binding on the pod network to migrate.
    pub const ALLOW_POD_BRIDGE_MIGRATION_ANNOTATION: &str =
        "kubevirt.io/allow-pod-bridge-network-live-migration";
    /// Migration condition: an abort was requested.
    pub const CONDITION_ABORT_REQUESTED: &str = "migrationAbortRequested";
    /// VMI annotation (from the VM template): what becomes of a claim whose disk a
    /// migration copied to a new claim, once the guest runs on the target: `Delete` (the
    /// default) or `Retain`.
    pub const MIGRATED_CLAIM_POLICY_ANNOTATION: &str = "kubevirt-rs.io/migrated-claim-policy";
    /// Label of a claim a migration creates on the target node: the migration's uid
    /// (removed once the migration succeeded and the claim is the VM's).
    pub const MIGRATION_CLAIM_LABEL: &str = "kubevirt-rs.io/migration-uid";
    /// Annotation of a claim a migration created: the claim it was copied from.
    pub const MIGRATED_FROM_ANNOTATION: &str = "kubevirt-rs.io/migrated-from";
}

/// KubeVirt's reasons of `LiveMigratable=False`.
pub mod not_migratable_reasons {
    /// A disk cannot be shared or copied (non-shared PVC or hostDisk).
    pub const DISKS: &str = "DisksNotLiveMigratable";
    /// An interface binding cannot follow the guest (bridge on the pod network).
    pub const INTERFACE: &str = "InterfaceNotLiveMigratable";
}

/// Why a VMI cannot be live-migrated: the `reason` and `message` of its
/// `LiveMigratable=False` condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotMigratable {
    /// KubeVirt's reason, from [`not_migratable_reasons`].
    pub reason: &'static str,
    /// KubeVirt's message.
    pub message: String,
}

impl std::fmt::Display for NotMigratable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.reason, self.message)
    }
}

/// Whether `vmi` can be live-migrated, as KubeVirt's `LiveMigratable` condition: the
/// way its disks travel, or the reason and message of `LiveMigratable=False`.
///
/// Pure, so virt-handler (which writes the condition), virt-apiserver (which refuses
/// `migrate`) and virt-controller (which fails a migration) agree. Checked in
/// KubeVirt's order, disks before interfaces:
/// - a PVC is shared when ReadWriteMany (or ReadOnlyMany), as its
///   `status.volumeStatus[].persistentVolumeClaimInfo.accessModes` says; any other known
///   access mode (ReadWriteOnce, ReadWriteOncePod) is copied to a new claim on the target
///   node (`BlockMigration`, [`copied_claims`]; KubeVirt refuses these), unless its disk
///   is read-only (libvirt never copies a read-only disk); unknown access modes are not
///   migratable (the controller could not make the target's claim);
/// - a DataVolume must be ReadWriteMany (kubevirt-rs has no CDI to make a target one);
/// - a hostDisk must be `shared`;
/// - containerDisk, ephemeral, emptyDisk, cloud-init, ConfigMap, Secret and
///   ServiceAccount disks are local and are copied (`BlockMigration`) or rebuilt;
/// - a `bridge` binding on the pod network cannot keep the guest's address on another
///   node, unless the VMI carries `kubevirt.io/allow-pod-bridge-network-live-migration`.
pub fn live_migratable(vmi: &VirtualMachineInstance) -> Result<MigrationMethod, NotMigratable> {
    let mut method = MigrationMethod::LiveMigration;
    let volume_status = vmi
        .status
        .as_ref()
        .and_then(|s| s.volume_status.as_deref())
        .unwrap_or_default();
    for v in vmi.spec.volumes.iter().flatten() {
        // The target would need the volume's attachment pod and mount before the guest
        // arrives (issue 44, not built yet): said rather than failed half-way.
        if crate::hotplug::is_hotpluggable(v) {
            return Err(NotMigratable {
                reason: not_migratable_reasons::DISKS,
                message: format!(
                    "cannot migrate VMI: hotplugged volume {} cannot be moved to another node                      yet; remove it (virtctl removevolume) to migrate",
                    v.name
                ),
            });
        }
        let claim = v
            .persistent_volume_claim
            .as_ref()
            .map(|c| c.claim_name.as_str())
            .or_else(|| v.data_volume.as_ref().map(|d| d.name.as_str()));
        if let Some(claim) = claim {
            let modes = volume_status
                .iter()
                .find(|s| s.name == v.name)
                .and_then(|s| s.persistent_volume_claim_info.as_ref())
                .and_then(|i| i.access_modes.as_deref())
                .filter(|m| !m.is_empty());
            let shared = modes.is_some_and(|m| {
                m.iter()
                    .any(|m| m == "ReadWriteMany" || m == "ReadOnlyMany")
            });
            if shared {
                continue;
            }
            let not_shared = || NotMigratable {
                reason: not_migratable_reasons::DISKS,
                message: format!(
                    "cannot migrate VMI: PVC {claim} is not shared, live migration requires \
                     that all PVCs must be shared (using ReadWriteMany access mode)"
                ),
            };
            if modes.is_none() || v.data_volume.is_some() {
                return Err(not_shared());
            }
            if disk_is_read_only(vmi, &v.name) {
                return Err(NotMigratable {
                    reason: not_migratable_reasons::DISKS,
                    message: format!(
                        "cannot migrate VMI: PVC {claim} is not shared and its disk {} is \
                         read-only or shareable, so it cannot be copied to the target node",
                        v.name
                    ),
                });
            }
            method = MigrationMethod::BlockMigration;
        } else if let Some(hd) = &v.host_disk {
            if hd.shared != Some(true) {
                return Err(NotMigratable {
                    reason: not_migratable_reasons::DISKS,
                    message: "cannot migrate VMI with non-shared HostDisk".into(),
                });
            }
        } else if v.container_disk.is_some() || v.ephemeral.is_some() || v.empty_disk.is_some() {
            // Local writable state: copied along with the memory.
            method = MigrationMethod::BlockMigration;
        }
    }
    let pod_networks: Vec<&str> = vmi
        .spec
        .networks
        .iter()
        .flatten()
        .filter(|n| n.pod.is_some())
        .map(|n| n.name.as_str())
        .collect();
    let bridge_allowed = vmi
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(names::ALLOW_POD_BRIDGE_MIGRATION_ANNOTATION));
    let bridged_pod_network = vmi
        .spec
        .domain
        .devices
        .interfaces
        .iter()
        .flatten()
        .any(|i| i.bridge.is_some() && pod_networks.contains(&i.name.as_str()));
    if bridged_pod_network && !bridge_allowed {
        return Err(NotMigratable {
            reason: not_migratable_reasons::INTERFACE,
            message: "cannot migrate VMI which does not use masquerade, bridge with \
                      kubevirt.io/allow-pod-bridge-network-live-migration VM annotation or a \
                      migratable plugin to connect to the pod network"
                .into(),
        });
    }
    Ok(method)
}

/// Whether libvirt leaves the disk of volume `volume` out of a migration's copy: a
/// `readonly` disk, a CD-ROM (read-only in KubeVirt unless it says otherwise), a `lun`
/// marked read-only, or a shareable disk.
fn disk_is_read_only(vmi: &VirtualMachineInstance, volume: &str) -> bool {
    vmi.spec
        .domain
        .devices
        .disks
        .iter()
        .flatten()
        .find(|d| d.name == volume)
        .is_some_and(|d| {
            d.disk.as_ref().is_some_and(|t| t.readonly == Some(true))
                || d.cdrom.as_ref().is_some_and(|t| t.readonly != Some(false))
                || d.lun.as_ref().is_some_and(|t| t.readonly == Some(true))
                || d.shareable == Some(true)
        })
}

/// A claim whose disk a live migration copies to a new claim on the target node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopiedClaim {
    /// The VMI volume.
    pub volume: String,
    /// The claim it names now (on the source node).
    pub claim: String,
}

/// The `persistentVolumeClaim` volumes of a migratable `vmi` whose disks a migration copies
/// (not shared: see [`live_migratable`]), in spec order. Empty when the VMI is not
/// migratable or all its claims are shared.
pub fn copied_claims(vmi: &VirtualMachineInstance) -> Vec<CopiedClaim> {
    if live_migratable(vmi).is_err() {
        return Vec::new();
    }
    let volume_status = vmi
        .status
        .as_ref()
        .and_then(|s| s.volume_status.as_deref())
        .unwrap_or_default();
    vmi.spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| Some((v, v.persistent_volume_claim.as_ref()?)))
        .filter(|(v, _)| {
            !volume_status
                .iter()
                .find(|s| s.name == v.name)
                .and_then(|s| s.persistent_volume_claim_info.as_ref())
                .and_then(|i| i.access_modes.as_ref())
                .is_some_and(|m| {
                    m.iter()
                        .any(|m| m == "ReadWriteMany" || m == "ReadOnlyMany")
                })
        })
        .map(|(v, c)| CopiedClaim {
            volume: v.name.clone(),
            claim: c.claim_name.clone(),
        })
        .collect()
}

/// Whether `vmi` can be live-migrated now, or why not: the spec (disks, interfaces) and
/// virt-handler's `LiveMigratable` condition, which knows the node's side.
pub fn migratable(vmi: &VirtualMachineInstance) -> Result<(), String> {
    if let Err(e) = live_migratable(vmi) {
        return Err(format!("{}: {}", e.reason, e.message));
    }
    let status = vmi.status.as_ref();
    match status.and_then(|s| s.condition(crate::vmi::condition_types::LIVE_MIGRATABLE)) {
        Some(c) if c.status == crate::ConditionStatus::False => Err(format!(
            "{}: {}",
            c.reason.as_deref().unwrap_or("NotLiveMigratable"),
            c.message
                .as_deref()
                .unwrap_or("the VMI is not live-migratable")
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
#[path = "migration_tests.rs"]
mod tests;
