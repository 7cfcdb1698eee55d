//! The DataVolume type, field for field CDI's `core/v1beta1` (JSON names and optionality
//! match, so CDI's and KubeVirt's YAML decode and round-trip). Validation is
//! [`super::validation`].

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    PersistentVolumeClaimSpec, TypedLocalObjectReference, TypedObjectReference,
    VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_with::skip_serializing_none;

use crate::common::ConditionStatus;

/// A source type kubevirt-rs does not implement, kept as written so it decodes and
/// validation can refuse it by name.
pub type Opaque = BTreeMap<String, Value>;

/// Specification of a DataVolume: the claim to create and what fills it.
#[skip_serializing_none]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "cdi.kubevirt.io",
    version = "v1beta1",
    kind = "DataVolume",
    plural = "datavolumes",
    singular = "datavolume",
    shortname = "dv",
    shortname = "dvs",
    category = "all",
    namespaced,
    status = "DataVolumeStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeSpec {
    /// Where the data comes from (exactly one source type).
    pub source: Option<DataVolumeSource>,
    /// An indirect source: a DataSource naming the claim to clone.
    pub source_ref: Option<DataVolumeSourceRef>,
    /// The claim to create, taken as written.
    pub pvc: Option<PersistentVolumeClaimSpec>,
    /// The claim to create, completed from the StorageClass and its StorageProfile.
    pub storage: Option<StorageSpec>,
    /// Priority class of the importer, uploader and cloner pods.
    pub priority_class_name: Option<String>,
    /// `kubevirt` (a disk image, the default) or `archive` (a tar unpacked into the volume).
    pub content_type: Option<ContentType>,
    /// Stages of a multi-stage (warm) import.
    pub checkpoints: Option<Vec<DataVolumeCheckpoint>>,
    /// Whether the current checkpoint is the last one.
    pub final_checkpoint: Option<bool>,
    /// Allocate the whole volume in advance.
    pub preallocation: Option<bool>,
}

/// What the claim holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ContentType {
    /// A disk image (written as the volume's `disk.img`, or the block device).
    Kubevirt,
    /// A tar archive unpacked into the volume.
    Archive,
}

impl ContentType {
    /// The value as written on the wire (and in the claim's contentType annotation).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Kubevirt => "kubevirt",
            Self::Archive => "archive",
        }
    }
}

/// Where a DataVolume's data comes from: exactly one field is set.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeSource {
    /// An HTTP(S) URL.
    pub http: Option<DataVolumeSourceHttp>,
    /// An S3 bucket (not supported by kubevirt-rs).
    pub s3: Option<Opaque>,
    /// A Google Cloud Storage object (not supported by kubevirt-rs).
    pub gcs: Option<Opaque>,
    /// A container image holding the disk under `/disk/`.
    pub registry: Option<DataVolumeSourceRegistry>,
    /// An existing claim to clone.
    pub pvc: Option<DataVolumeSourcePvc>,
    /// Data sent with `virtctl image-upload`.
    pub upload: Option<Empty>,
    /// An empty disk.
    pub blank: Option<Empty>,
    /// An oVirt disk (not supported by kubevirt-rs).
    pub imageio: Option<Opaque>,
    /// A VMware disk (not supported by kubevirt-rs).
    pub vddk: Option<Opaque>,
    /// A VolumeSnapshot (not supported by kubevirt-rs).
    pub snapshot: Option<Opaque>,
}

/// A source type without parameters (`blank: {}`, `upload: {}`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Empty {}

/// An HTTP(S) source.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeSourceHttp {
    /// The URL of the image (http:// or https://).
    #[serde(default)]
    pub url: String,
    /// A Secret with `accessKeyId` (user name) and `secretKey` (password) for basic auth.
    pub secret_ref: Option<String>,
    /// A ConfigMap with the CA certificates that sign the server's certificate.
    pub cert_config_map: Option<String>,
    /// Extra request headers, each `Name: value`.
    pub extra_headers: Option<Vec<String>>,
    /// Secrets each holding an extra request header (for sensitive ones).
    pub secret_extra_headers: Option<Vec<String>>,
    /// The expected digest of the downloaded bytes, `algorithm:hex` (md5, sha1, sha256,
    /// sha512).
    pub checksum: Option<String>,
}

/// A container registry source.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeSourceRegistry {
    /// The image, `docker://REGISTRY/IMAGE:TAG` or `oci-archive://PATH`.
    pub url: Option<String>,
    /// An OpenShift image stream (with `pullMethod: node`).
    pub image_stream: Option<String>,
    /// `pod` (the importer pulls) or `node` (the node's runtime pulls).
    pub pull_method: Option<RegistryPullMethod>,
    /// A Secret with the registry's credentials.
    pub secret_ref: Option<String>,
    /// A ConfigMap with the registry's CA certificates.
    pub cert_config_map: Option<String>,
    /// The platform of the image to pull from a multi-platform index.
    pub platform: Option<PlatformOptions>,
}

/// How a registry image is pulled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RegistryPullMethod {
    /// The importer pod pulls the image.
    Pod,
    /// The node's container runtime pulls it (its cache and credentials).
    Node,
}

/// The platform of a multi-platform image.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlatformOptions {
    /// The CPU architecture (`amd64`, `arm64`, …).
    pub architecture: Option<String>,
}

/// A claim to clone.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeSourcePvc {
    /// Its namespace (the DataVolume's when empty).
    pub namespace: Option<String>,
    /// Its name.
    #[serde(default)]
    pub name: String,
}

/// A reference to a DataSource that names the data.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeSourceRef {
    /// `DataSource`, the only kind CDI supports.
    #[serde(default)]
    pub kind: String,
    /// Its namespace (the DataVolume's when unset).
    pub namespace: Option<String>,
    /// Its name.
    #[serde(default)]
    pub name: String,
}

/// The claim to create, with the values CDI completes from the StorageClass (access modes,
/// volume mode) left out.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageSpec {
    /// The access modes (from the StorageProfile when unset).
    pub access_modes: Option<Vec<String>>,
    /// Volumes to consider for binding.
    pub selector: Option<LabelSelector>,
    /// The size (`requests.storage`).
    pub resources: Option<VolumeResourceRequirements>,
    /// The PersistentVolume to bind to.
    pub volume_name: Option<String>,
    /// The StorageClass (the virtualization default, else the cluster default, when unset).
    pub storage_class_name: Option<String>,
    /// `Filesystem`, `Block`, or `FromStorageProfile`.
    pub volume_mode: Option<String>,
    /// An object to populate the volume from (external population).
    pub data_source: Option<TypedLocalObjectReference>,
    /// An object to populate the volume from (external population).
    pub data_source_ref: Option<TypedObjectReference>,
}

/// One stage of a multi-stage import.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeCheckpoint {
    /// The snapshot of the previous checkpoint.
    #[serde(default)]
    pub previous: String,
    /// The snapshot of this checkpoint.
    #[serde(default)]
    pub current: String,
}

/// What happened to a DataVolume, written by virt-controller.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeStatus {
    /// The claim holding the data (named as the DataVolume).
    pub claim_name: Option<String>,
    /// The phase (`super::phase`: Pending, ImportInProgress, Succeeded, …).
    pub phase: Option<String>,
    /// Transfer progress, `45.30%`, or `N/A`.
    pub progress: Option<String>,
    /// How many times the pod populating the claim restarted.
    pub restart_count: Option<i32>,
    /// Ready, Bound and Running.
    pub conditions: Option<Vec<DataVolumeCondition>>,
}

/// A condition of a DataVolume (CDI's shape: with `lastHeartbeatTime`).
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeCondition {
    /// `Ready`, `Bound` or `Running`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: ConditionStatus,
    /// When the status last changed.
    pub last_transition_time: Option<Time>,
    /// When the condition was last written.
    pub last_heartbeat_time: Option<Time>,
    /// Why, in one word.
    pub reason: Option<String>,
    /// Why, for people.
    pub message: Option<String>,
}

impl DataVolumeSource {
    /// The JSON names of the source types set, in CDI's field order.
    pub fn types_set(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        let mut push = |set: bool, name| {
            if set {
                out.push(name);
            }
        };
        push(self.http.is_some(), "http");
        push(self.s3.is_some(), "s3");
        push(self.gcs.is_some(), "gcs");
        push(self.registry.is_some(), "registry");
        push(self.pvc.is_some(), "pvc");
        push(self.upload.is_some(), "upload");
        push(self.blank.is_some(), "blank");
        push(self.imageio.is_some(), "imageio");
        push(self.vddk.is_some(), "vddk");
        push(self.snapshot.is_some(), "snapshot");
        out
    }
}

impl DataVolumeStatus {
    /// The condition of this type, if any.
    pub fn condition(&self, type_: &str) -> Option<&DataVolumeCondition> {
        self.conditions
            .as_deref()
            .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
    }
}
