//! The `KubeVirt` resource virt-operator reconciles, and the one CRD kubevirt-rs ships.
//!
//! Its fields are KubeVirt's (`kubevirt.io` KubeVirt: spec.imageTag, imageRegistry,
//! configuration.developerConfiguration, infra/workloads placement, uninstallStrategy,
//! certificateRotateStrategy; status phase, conditions, observed/target version) and the spec
//! types are `kubevirt-api`'s. The
//! CRD serves it as **`kubevirt.io/v1alpha3`** (KubeVirt serves the same schema at v1 and
//! v1alpha3): kubevirt.io/v1 is served by virt-apiserver through the APIService
//! `v1.kubevirt.io`, and a CRD version v1 in that group would make kube-apiserver's
//! autoregister controller claim that APIService for itself (docs/deploy.md).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResource;
use kube::core::CustomResourceExt;
use kubevirt_api::kubevirt::{
    ComponentConfig, KubeVirtCertificateRotateStrategy, KubeVirtConfiguration, KubeVirtStatus,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The version the CRD serves.
pub const VERSION: &str = "v1alpha3";
/// `apiVersion` of KubeVirt objects.
pub const API_VERSION: &str = "kubevirt.io/v1alpha3";
/// Finalizer that makes deleting the KubeVirt resource uninstall everything first.
pub const FINALIZER: &str = "kubevirt.io/virtOperatorFinalizer";
/// Uninstall is refused while VirtualMachines or VirtualMachineInstances exist.
pub const BLOCK_UNINSTALL: &str = "BlockUninstallIfWorkloadsExist";
/// Uninstall deletes VirtualMachines and VirtualMachineInstances with everything else.
pub const REMOVE_WORKLOADS: &str = "RemoveWorkloads";

/// Specification of a kubevirt-rs installation.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kubevirt.io",
    version = "v1alpha3",
    kind = "KubeVirt",
    plural = "kubevirts",
    singular = "kubevirt",
    shortname = "kv",
    shortname = "kvs",
    category = "all",
    namespaced,
    status = "KubeVirtStatus",
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".status.observedKubeVirtVersion"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct KubeVirtSpec {
    /// Image tag of the components (defaults to the images the operator was deployed with).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_tag: Option<String>,
    /// Image registry of the components, e.g. `localhost/kubevirt-rs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_registry: Option<String>,
    /// `Always`, `IfNotPresent` or `Never`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    /// Cluster-wide configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration: Option<KubeVirtConfiguration>,
    /// `BlockUninstallIfWorkloadsExist` (default) or `RemoveWorkloads`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uninstall_strategy: Option<String>,
    /// Placement of the control-plane components (etcd, virt-apiserver, virt-controller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infra: Option<ComponentConfig>,
    /// Placement of virt-handler.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workloads: Option<ComponentConfig>,
    /// Lifetimes and renewal of the self-signed CAs and certificates (docs/deploy.md
    /// "Certificates").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_rotate_strategy: Option<KubeVirtCertificateRotateStrategy>,
}

/// The CRD of [`KubeVirt`].
pub fn crd() -> CustomResourceDefinition {
    let mut crd = KubeVirt::crd();
    crd.metadata.labels = Some(crate::render::part_of_labels("virt-operator"));
    crd
}
