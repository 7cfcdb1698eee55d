//! The values CDI writes in a DataVolume's status, as constants: the phases, condition
//! types and reasons clients (virtctl, KubeVirt's VM controller, users' scripts) compare
//! against, so kubevirt-rs's controllers write exactly CDI's strings.

/// No phase yet (CDI's `PhaseUnset`, the empty string).
pub const UNSET: &str = "";
/// The DataVolume exists, its claim is not bound yet.
pub const PENDING: &str = "Pending";
/// The claim is bound, nothing populates it yet.
pub const PVC_BOUND: &str = "PVCBound";
/// The importer pod is created.
pub const IMPORT_SCHEDULED: &str = "ImportScheduled";
/// The importer pod runs.
pub const IMPORT_IN_PROGRESS: &str = "ImportInProgress";
/// The clone pod(s) are created.
pub const CLONE_SCHEDULED: &str = "CloneScheduled";
/// The clone runs.
pub const CLONE_IN_PROGRESS: &str = "CloneInProgress";
/// The upload server pod is created.
pub const UPLOAD_SCHEDULED: &str = "UploadScheduled";
/// The upload server accepts data (what `virtctl image-upload` waits for).
pub const UPLOAD_READY: &str = "UploadReady";
/// The claim waits for a first consumer pod (a WaitForFirstConsumer StorageClass).
pub const WAIT_FOR_FIRST_CONSUMER: &str = "WaitForFirstConsumer";
/// CDI's populators have not created the claim yet (kubevirt-rs never uses populators, but
/// KubeVirt counts this phase as ready, so it is named).
pub const PENDING_POPULATION: &str = "PendingPopulation";
/// The claim holds the data.
pub const SUCCEEDED: &str = "Succeeded";
/// Populating the claim failed.
pub const FAILED: &str = "Failed";
/// The state cannot be determined.
pub const UNKNOWN: &str = "Unknown";
/// A multi-stage import waits for its next checkpoint.
pub const PAUSED: &str = "Paused";
/// A claim is being expanded (CDI's clone flow).
pub const EXPANSION_IN_PROGRESS: &str = "ExpansionInProgress";

/// Condition type: the DataVolume can be consumed (True only at Succeeded).
pub const CONDITION_READY: &str = "Ready";
/// Condition type: the claim is bound.
pub const CONDITION_BOUND: &str = "Bound";
/// Condition type: the import/upload/clone pod runs.
pub const CONDITION_RUNNING: &str = "Running";

/// Bound reason: the claim is bound.
pub const REASON_BOUND: &str = "Bound";
/// Bound reason: the claim is pending.
pub const REASON_PENDING: &str = "Pending";
/// Bound reason: the claim lost its volume.
pub const REASON_CLAIM_LOST: &str = "ClaimLost";
/// Bound reason: there is no claim.
pub const REASON_NOT_FOUND: &str = "NotFound";
/// Ready reason while the transfer runs.
pub const REASON_TRANSFER_RUNNING: &str = "TransferRunning";
/// Running reason: the worker pod cannot be scheduled.
pub const REASON_UNSCHEDULABLE: &str = "Unschedulable";
/// Running reason: the worker finished.
pub const REASON_COMPLETED: &str = "Completed";
/// Running reason: the worker failed (KubeVirt's DataVolumeError status reads it).
pub const REASON_ERROR: &str = "Error";
/// Running reason: the registry image could not be pulled (KubeVirt reads it too).
pub const REASON_IMAGE_PULL_FAILED: &str = "ImagePullFailed";
/// Event and Bound reason: the claim CDI would create is not valid (virtctl image-upload
/// stops waiting and prints its message).
pub const REASON_ERR_CLAIM_NOT_VALID: &str = "ErrClaimNotValid";
/// Event reason: the claim exceeds a quota.
pub const REASON_ERR_EXCEEDED_QUOTA: &str = "ErrExceededQuota";
/// Event reason: a worker pod could not start.
pub const REASON_ERR_STARTING_POD: &str = "ErrStartingPod";
/// Event reason: the import failed.
pub const REASON_ERR_IMPORT_FAILED: &str = "ErrImportFailed";
/// Event reason: the import finished.
pub const REASON_IMPORT_SUCCEEDED: &str = "ImportSucceeded";
/// Event reason: the upload finished.
pub const REASON_UPLOAD_SUCCEEDED: &str = "UploadSucceeded";
/// Event reason: the clone finished.
pub const REASON_CLONE_SUCCEEDED: &str = "CloneSucceeded";
/// Running reason and Event: the claim to clone does not exist (CDI's).
pub const REASON_CLONE_WITHOUT_SOURCE: &str = "CloneWithoutSource";
/// Running reason and Event: a pod other than a clone's reader uses the claim to clone, so
/// its content may change under the copy: the clone waits (CDI's).
pub const REASON_CLONE_SOURCE_IN_USE: &str = "CloneSourceInUse";
/// Running reason and Event: the claim to clone does not fit the DataVolume (content type,
/// size, volume mode) (CDI's).
pub const REASON_CLONE_VALIDATION_FAILED: &str = "CloneValidationFailed";
/// Running reason: the claim to clone is not bound, or not populated yet (its own
/// DataVolume still running). kubevirt-rs's name: CDI only logs this wait.
pub const REASON_CLONE_SOURCE_NOT_READY: &str = "CloneSourceNotReady";
/// Event reason: a clone attempt failed (the worker's reason in the note).
pub const REASON_ERR_CLONE_FAILED: &str = "ErrCloneFailed";
/// Event reason on a claim (from the provisioner): virtctl image-upload prints it and stops.
pub const REASON_PROVISIONING_FAILED: &str = "ProvisioningFailed";

/// `status.progress` when it is not known.
pub const PROGRESS_NA: &str = "N/A";
/// `status.progress` when the transfer is done.
pub const PROGRESS_DONE: &str = "100.0%";

/// Phases in which KubeVirt treats a DataVolume as ready for a VM to start (KubeVirt's
/// `handleDataVolumes`: a WaitForFirstConsumer claim is bound by the VM's own pod).
pub const VM_READY_PHASES: [&str; 3] = [SUCCEEDED, WAIT_FOR_FIRST_CONSUMER, PENDING_POPULATION];
