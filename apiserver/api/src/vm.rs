//! VirtualMachine: a VM definition whose runStrategy decides whether an instance runs.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use crate::cdi::DataVolumeSpec;
use crate::common::Condition;
use crate::vmi::VirtualMachineInstanceSpec;

/// Specification of a VirtualMachine.
#[skip_serializing_none]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kubevirt.io",
    version = "v1",
    kind = "VirtualMachine",
    plural = "virtualmachines",
    singular = "virtualmachine",
    shortname = "vm",
    shortname = "vms",
    category = "all",
    namespaced,
    status = "VirtualMachineStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineSpec {
    /// Deprecated: use runStrategy. `true` = Always, `false` = Halted.
    pub running: Option<bool>,
    /// When an instance of this VM should run: Always, RerunOnFailure, Manual, Halted, Once.
    pub run_strategy: Option<RunStrategy>,
    /// The VirtualMachineInstance created for this VM.
    #[serde(default)]
    pub template: VirtualMachineInstanceTemplateSpec,
    /// The instance type (`instancetype.kubevirt.io`) sizing the guest: its values cannot be
    /// set in the template.
    pub instancetype: Option<Matcher>,
    /// The preference (`instancetype.kubevirt.io`) filling what the template leaves unset.
    pub preference: Option<Matcher>,
    /// DataVolumes virt-controller creates for this VM (owned by it, deleted with it), each
    /// used by a `dataVolume` volume of the template of the same name.
    pub data_volume_templates: Option<Vec<DataVolumeTemplateSpec>>,
}

/// A DataVolume a VM creates: its metadata (name, labels, annotations) and CDI's spec.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeTemplateSpec {
    /// Deprecated, ignored: KubeVirt's template inlines a TypeMeta that old examples fill
    /// (`cdi.kubevirt.io/v1beta1`).
    pub api_version: Option<String>,
    /// Deprecated, ignored (`DataVolume`).
    pub kind: Option<String>,
    /// The DataVolume's name (required), namespace (the VM's), labels and annotations.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// The DataVolume's spec.
    #[serde(default)]
    pub spec: DataVolumeSpec,
    /// Accepted and ignored (KubeVirt's placeholder status).
    pub status: Option<crate::cdi::datavolume::Opaque>,
}

/// A VM's reference to an instance type or preference.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Matcher {
    /// Its name.
    pub name: Option<String>,
    /// Its kind: the cluster-wide kind when unset (`VirtualMachineClusterInstancetype`,
    /// `VirtualMachineClusterPreference`), or the namespaced one.
    pub kind: Option<String>,
    /// The ControllerRevision holding the copy the VM uses.
    pub revision_name: Option<String>,
    /// A volume whose claim's `instancetype.kubevirt.io/default-instancetype` (or
    /// `default-preference`) label names it.
    pub infer_from_volume: Option<String>,
    /// What happens when inferring fails: `Reject` (the default) or `Ignore`.
    pub infer_from_volume_failure_policy: Option<InferFromVolumeFailurePolicy>,
}

/// What happens when inferring an instance type or preference from a volume fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum InferFromVolumeFailurePolicy {
    /// Refuse the VM.
    Reject,
    /// Create the VM without it.
    Ignore,
}

/// The instance type or preference a VM uses, as captured by virt-controller.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstancetypeStatusRef {
    /// Its name.
    pub name: Option<String>,
    /// Its kind.
    pub kind: Option<String>,
    /// The ControllerRevision holding the copy the VM uses.
    pub controller_revision_ref: Option<ControllerRevisionRef>,
    /// The volume it was inferred from.
    pub infer_from_volume: Option<String>,
    /// What happens when inferring fails.
    pub infer_from_volume_failure_policy: Option<InferFromVolumeFailurePolicy>,
}

/// A ControllerRevision by name.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ControllerRevisionRef {
    /// Its name.
    pub name: Option<String>,
}

/// Template of the VMIs a VM creates.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceTemplateSpec {
    /// Labels and annotations copied to the VMI.
    pub metadata: Option<ObjectMeta>,
    /// The VMI spec.
    pub spec: Option<VirtualMachineInstanceSpec>,
}

/// When an instance of a VM should run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum RunStrategy {
    /// Always keep an instance running; restart it whatever way it stops.
    Always,
    /// Restart the instance only when it fails; a clean guest shutdown stops the VM.
    RerunOnFailure,
    /// Start and stop only on request (start/stop/restart subresources).
    Manual,
    /// Never run an instance.
    Halted,
    /// Run an instance once, until it stops for any reason.
    Once,
    /// Wait for an incoming cross-cluster migration.
    WaitAsReceiver,
}

impl RunStrategy {
    /// The strategy as written on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Always => "Always",
            Self::RerunOnFailure => "RerunOnFailure",
            Self::Manual => "Manual",
            Self::Halted => "Halted",
            Self::Once => "Once",
            Self::WaitAsReceiver => "WaitAsReceiver",
        }
    }
}

impl VirtualMachineSpec {
    /// The effective run strategy: `runStrategy`, else the deprecated `running`, else Halted.
    pub fn effective_run_strategy(&self) -> RunStrategy {
        match (self.run_strategy, self.running) {
            (Some(s), _) => s,
            (None, Some(true)) => RunStrategy::Always,
            _ => RunStrategy::Halted,
        }
    }
}

/// Human-readable status of a VM, shown by `kubectl get vm`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum PrintableStatus {
    /// No instance exists.
    Stopped,
    /// Volumes are being prepared.
    Provisioning,
    /// An instance is being started.
    Starting,
    /// The instance runs.
    Running,
    /// The instance is paused.
    Paused,
    /// The instance is being stopped.
    Stopping,
    /// The VM is being deleted.
    Terminating,
    /// The instance keeps failing; restarts are backed off.
    CrashLoopBackOff,
    /// The instance is being migrated.
    Migrating,
    /// The state cannot be determined.
    Unknown,
    /// The launcher pod cannot be scheduled.
    ErrorUnschedulable,
    /// An image cannot be pulled.
    ErrImagePull,
    /// Pulling an image is backed off.
    ImagePullBackOff,
    /// A referenced PVC does not exist.
    ErrorPvcNotFound,
    /// A DataVolume failed.
    DataVolumeError,
    /// A PVC waits for binding.
    WaitingForVolumeBinding,
    /// Waiting for an incoming migration.
    WaitingForReceiver,
}

impl PrintableStatus {
    /// The status as written on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stopped => "Stopped",
            Self::Provisioning => "Provisioning",
            Self::Starting => "Starting",
            Self::Running => "Running",
            Self::Paused => "Paused",
            Self::Stopping => "Stopping",
            Self::Terminating => "Terminating",
            Self::CrashLoopBackOff => "CrashLoopBackOff",
            Self::Migrating => "Migrating",
            Self::Unknown => "Unknown",
            Self::ErrorUnschedulable => "ErrorUnschedulable",
            Self::ErrImagePull => "ErrImagePull",
            Self::ImagePullBackOff => "ImagePullBackOff",
            Self::ErrorPvcNotFound => "ErrorPvcNotFound",
            Self::DataVolumeError => "DataVolumeError",
            Self::WaitingForVolumeBinding => "WaitingForVolumeBinding",
            Self::WaitingForReceiver => "WaitingForReceiver",
        }
    }
}

/// Observed state of a VirtualMachine.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineStatus {
    /// An instance of this VM exists.
    pub created: Option<bool>,
    /// The instance is ready.
    pub ready: Option<bool>,
    /// Human-readable status.
    pub printable_status: Option<PrintableStatus>,
    /// Conditions: Ready, Failure, Paused, …
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Option<Vec<Condition>>,
    /// Pending start/stop requests, consumed by the controller in order.
    pub state_change_requests: Option<Vec<StateChangeRequest>>,
    /// The run strategy the controller last acted on.
    pub run_strategy: Option<RunStrategy>,
    /// metadata.generation the controller last acted on.
    pub observed_generation: Option<i64>,
    /// metadata.generation of the spec the current VMI was made from.
    pub desired_generation: Option<i64>,
    /// Restart back-off after repeated failures.
    pub start_failure: Option<VirtualMachineStartFailure>,
    /// The instance type the VM uses.
    pub instancetype_ref: Option<InstancetypeStatusRef>,
    /// The preference the VM uses.
    pub preference_ref: Option<InstancetypeStatusRef>,
    /// Volumes to add or remove (`addvolume`/`removevolume`), applied by virt-controller to
    /// the VM's template and its running VMI, then dropped from here.
    pub volume_requests: Option<Vec<crate::hotplug::VirtualMachineVolumeRequest>>,
}

/// A request to start or stop a VM's instance.
#[skip_serializing_none]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StateChangeRequest {
    /// Start or Stop.
    pub action: StateChangeRequestAction,
    /// Extra data, e.g. the start mode.
    pub data: Option<std::collections::BTreeMap<String, String>>,
    /// For Stop: the UID of the instance to stop (a restart stops exactly that one).
    pub uid: Option<String>,
}

/// Action of a state change request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum StateChangeRequestAction {
    /// Start an instance.
    Start,
    /// Stop the instance.
    Stop,
}

/// Back-off state after repeated start failures.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineStartFailure {
    /// UID of the last instance that failed.
    #[serde(rename = "lastFailedVMIUID")]
    pub last_failed_vmi_uid: Option<String>,
    /// When the next start may happen.
    pub retry_after_timestamp: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
    /// Failures in a row.
    pub consecutive_fail_count: Option<i32>,
}

/// Well-known VM condition types.
pub mod condition_types {
    /// The VM's instance is ready.
    pub const READY: &str = "Ready";
    /// Creating or running the instance failed.
    pub const FAILURE: &str = "Failure";
    /// The instance is paused.
    pub const PAUSED: &str = "Paused";
    /// A spec change needs a restart to take effect.
    pub const RESTART_REQUIRED: &str = "RestartRequired";
}
