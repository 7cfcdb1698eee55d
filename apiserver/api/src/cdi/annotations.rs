//! CDI's annotation names (its `pkg/controller/common`), which kubevirt-rs's DataVolume and
//! populate controllers write and read on claims, pods and DataVolumes. The names are
//! CDI's own because clients read them: `virtctl image-upload` waits on
//! [`POD_PHASE`]/[`POD_READY`] and checks [`UPLOAD_TARGET`] and [`CONTENT_TYPE`] on a
//! claim, and a claim annotated by hand (`image-upload pvc --no-create`) must start an upload.

/// Prefix of every CDI annotation.
pub const PREFIX: &str = "cdi.kubevirt.io";

/// Claim: the import source type (`http`, `registry`, `none` for blank, …).
pub const IMPORT_SOURCE: &str = "cdi.kubevirt.io/storage.import.source";
/// Claim: the import URL.
pub const IMPORT_ENDPOINT: &str = "cdi.kubevirt.io/storage.import.endpoint";
/// Claim: the Secret with the source's credentials.
pub const IMPORT_SECRET: &str = "cdi.kubevirt.io/storage.import.secretName";
/// Claim: the ConfigMap with the source's CA certificates.
pub const IMPORT_CERT_CONFIG_MAP: &str = "cdi.kubevirt.io/storage.import.certConfigMap";
/// Claim: extra HTTP headers (JSON list).
pub const IMPORT_EXTRA_HEADERS: &str = "cdi.kubevirt.io/storage.import.extraHeaders";
/// Claim: Secrets holding extra HTTP headers (JSON list).
pub const IMPORT_SECRET_EXTRA_HEADERS: &str = "cdi.kubevirt.io/storage.import.secretExtraHeaders";
/// Claim: the expected checksum of the source (`sha256:…`).
pub const IMPORT_CHECKSUM: &str = "cdi.kubevirt.io/storage.import.checksum";
/// Claim: `pod` or `node` pull of a registry source.
pub const IMPORT_REGISTRY_METHOD: &str = "cdi.kubevirt.io/storage.import.registryImportMethod";
/// Claim: the name of its importer pod.
pub const IMPORT_POD: &str = "cdi.kubevirt.io/storage.import.importPodName";
/// Claim: the import needs scratch space.
pub const IMPORT_REQUIRES_SCRATCH: &str = "cdi.kubevirt.io/storage.import.requiresScratch";
/// Claim: the claim it is a clone of, `namespace/name` (CDI's `AnnCloneRequest`; its
/// presence marks the claim as one a worker fills, like the import annotations).
pub const CLONE_REQUEST: &str = "k8s.io/CloneRequest";
/// Claim: how it is cloned (`copy`: a worker pod copies the disk, CDI's host-assisted clone).
pub const CLONE_TYPE: &str = "cdi.kubevirt.io/cloneType";
/// Claim: make it an upload target (its presence starts an upload server pod).
pub const UPLOAD_TARGET: &str = "cdi.kubevirt.io/storage.upload.target";
/// A claim's upload server pod (CDI's): where the upload proxy sends the claim's upload.
pub const UPLOAD_POD: &str = "cdi.kubevirt.io/storage.uploadPodName";
/// Claim: `kubevirt` (a disk image) or `archive`.
pub const CONTENT_TYPE: &str = "cdi.kubevirt.io/storage.contentType";
/// Claim and DataVolume: bind at once instead of waiting for a first consumer (presence
/// means true, as CDI's `ImmediateBindingRequested`).
pub const BIND_IMMEDIATE_REQUESTED: &str = "cdi.kubevirt.io/storage.bind.immediate.requested";
/// Claim: the phase of its worker pod (`Pending`, `Running`, `Succeeded`, `Failed`).
pub const POD_PHASE: &str = "cdi.kubevirt.io/storage.pod.phase";
/// Claim: whether its worker pod is ready (an upload server accepts data).
pub const POD_READY: &str = "cdi.kubevirt.io/storage.pod.ready";
/// Claim: how many times its worker pod restarted.
pub const POD_RESTARTS: &str = "cdi.kubevirt.io/storage.pod.restarts";
/// Claim: the priority class of its worker pod.
pub const POD_PRIORITY_CLASS_NAME: &str = "cdi.kubevirt.io/storage.pod.priorityclassname";
/// Claim: keep the worker pod after success.
pub const POD_RETAIN_AFTER_COMPLETION: &str = "cdi.kubevirt.io/storage.pod.retainAfterCompletion";
/// Claim: the worker's Running condition (`true`/`false`).
pub const CONDITION_RUNNING: &str = "cdi.kubevirt.io/storage.condition.running";
/// Claim: …its message.
pub const CONDITION_RUNNING_MESSAGE: &str = "cdi.kubevirt.io/storage.condition.running.message";
/// Claim: …its reason.
pub const CONDITION_RUNNING_REASON: &str = "cdi.kubevirt.io/storage.condition.running.reason";
/// Claim: a Bound condition the worker reports (`true`/`false`).
pub const CONDITION_BOUND: &str = "cdi.kubevirt.io/storage.condition.bound";
/// Claim: …its message.
pub const CONDITION_BOUND_MESSAGE: &str = "cdi.kubevirt.io/storage.condition.bound.message";
/// Claim: …its reason.
pub const CONDITION_BOUND_REASON: &str = "cdi.kubevirt.io/storage.condition.bound.reason";
/// Claim: preallocate the target.
pub const PREALLOCATION_REQUESTED: &str = "cdi.kubevirt.io/storage.preallocation.requested";
/// Claim: the DataVolume it is populated for.
pub const POPULATED_FOR: &str = "cdi.kubevirt.io/storage.populatedFor";
/// Claim: delete the DataVolume once it succeeded (virtctl reads it for its message).
pub const DELETE_AFTER_COMPLETION: &str = "cdi.kubevirt.io/storage.deleteAfterCompletion";
/// DataVolume: CDI used populators (virtctl then uploads to the prime claim). kubevirt-rs
/// never sets it.
pub const USE_POPULATOR: &str = "cdi.kubevirt.io/storage.usePopulator";
/// DataVolume: the prime claim of a populator.
pub const POPULATOR_PVC_PRIME: &str = "cdi.kubevirt.io/storage.populator.pvcPrime";
/// DataVolume: may adopt an existing claim of its name (KubeVirt sets it on the DataVolumes
/// of a VM's templates).
pub const ALLOW_CLAIM_ADOPTION: &str = "cdi.kubevirt.io/allowClaimAdoption";
/// Pod: created by CDI's controller for a claim.
pub const CREATED_BY_CONTROLLER: &str = "cdi.kubevirt.io/storage.createdByController";
/// StorageClass: the default class for virtualization (before the cluster default).
pub const DEFAULT_VIRT_STORAGE_CLASS: &str = "storageclass.kubevirt.io/is-default-virt-class";
/// StorageClass: the cluster's default class.
pub const DEFAULT_STORAGE_CLASS: &str = "storageclass.kubernetes.io/is-default-class";

/// Values of [`IMPORT_SOURCE`].
pub mod source {
    /// An HTTP(S) URL.
    pub const HTTP: &str = "http";
    /// A container registry image.
    pub const REGISTRY: &str = "registry";
    /// Nothing to import: a blank disk.
    pub const NONE: &str = "none";
}

/// Label CDI puts on the claims and pods it makes.
pub const APP_LABEL: &str = "app";
/// Value of [`APP_LABEL`].
pub const APP_LABEL_VALUE: &str = "containerized-data-importer";
