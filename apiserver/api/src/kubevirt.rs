//! KubeVirt: the install/upgrade resource reconciled by virt-operator. Unlike the VM kinds
//! it is a CRD served by kube-apiserver, so the operator works before our API server runs.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use crate::common::Condition;

/// Specification of a kubevirt-rs installation.
#[skip_serializing_none]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kubevirt.io",
    version = "v1",
    kind = "KubeVirt",
    plural = "kubevirts",
    singular = "kubevirt",
    shortname = "kv",
    shortname = "kvs",
    namespaced,
    status = "KubeVirtStatus",
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct KubeVirtSpec {
    /// Image tag of the components (defaults to the operator's own version).
    pub image_tag: Option<String>,
    /// Image registry of the components.
    pub image_registry: Option<String>,
    /// `Always`, `IfNotPresent` or `Never`.
    pub image_pull_policy: Option<String>,
    /// Cluster-wide configuration.
    pub configuration: Option<KubeVirtConfiguration>,
    /// `BlockUninstallIfWorkloadsExist` (default) or `RemoveWorkloads`.
    pub uninstall_strategy: Option<String>,
    /// Placement of the control-plane components.
    pub infra: Option<ComponentConfig>,
    /// Placement of virt-handler.
    pub workloads: Option<ComponentConfig>,
    /// Lifetimes and renewal of the operator's self-signed certificates (KubeVirt's
    /// `certificateRotateStrategy`).
    pub certificate_rotate_strategy: Option<KubeVirtCertificateRotateStrategy>,
}

/// How the operator's certificates rotate.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeVirtCertificateRotateStrategy {
    /// Self-signed CAs and the certificates they issue.
    pub self_signed: Option<KubeVirtSelfSignConfiguration>,
}

/// Lifetimes of the self-signed CAs and of the certificates they issue. Durations are Go
/// `metav1.Duration` strings (`24h0m0s`, `4m`, `1h30m`).
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeVirtSelfSignConfiguration {
    /// Deprecated. Use ca.duration instead.
    pub ca_rotate_interval: Option<String>,
    /// Deprecated. Use server.duration instead.
    pub cert_rotate_interval: Option<String>,
    /// Deprecated. Use ca.duration and ca.renewBefore instead.
    pub ca_overlap_interval: Option<String>,
    /// CA configuration. CA certificates are kept in the CA bundle as long as they are valid.
    pub ca: Option<CertConfig>,
    /// Server (and client) certificate configuration. Certificates are rotated and discarded.
    pub server: Option<CertConfig>,
}

/// Lifetime of one kind of certificate.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CertConfig {
    /// The requested 'duration' (i.e. lifetime) of the Certificate.
    pub duration: Option<String>,
    /// The amount of time before the currently issued certificate's "notAfter" time that we
    /// will begin to attempt to renew the certificate.
    pub renew_before: Option<String>,
}

/// Cluster-wide configuration.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeVirtConfiguration {
    /// Developer settings.
    pub developer_configuration: Option<DeveloperConfiguration>,
}

/// Developer settings.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeveloperConfiguration {
    /// Fall back to software emulation (TCG) when KVM is unusable.
    pub use_emulation: Option<bool>,
    /// Enabled feature gates.
    pub feature_gates: Option<Vec<String>>,
}

/// Placement of a group of components.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentConfig {
    /// Node placement.
    pub node_placement: Option<NodePlacement>,
    /// Replicas of the control-plane components.
    pub replicas: Option<u8>,
}

/// Node placement.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodePlacement {
    /// Node selector.
    pub node_selector: Option<std::collections::BTreeMap<String, String>>,
    /// Tolerations.
    pub tolerations: Option<Vec<k8s_openapi::api::core::v1::Toleration>>,
    /// Affinity.
    pub affinity: Option<k8s_openapi::api::core::v1::Affinity>,
}

/// Observed state of the installation.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeVirtStatus {
    /// `Deploying`, `Deployed`, `Deleting`, `Deleted`.
    pub phase: Option<String>,
    /// Available, Progressing, Degraded.
    pub conditions: Option<Vec<Condition>>,
    /// Version being deployed.
    pub target_kube_virt_version: Option<String>,
    /// Version fully deployed.
    pub observed_kube_virt_version: Option<String>,
    /// Generation acted on.
    pub observed_generation: Option<i64>,
}
