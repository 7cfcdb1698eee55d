//! CDI's CDIConfig: the cluster's one `config`, whose `status.uploadProxyURL` (or
//! `spec.uploadProxyURLOverride`) tells `virtctl image-upload` where the upload proxy is.
//! virt-operator writes its status; the spec is the cluster administrator's. The fields
//! kubevirt-rs does not act on still decode, as CDI's schema has them.

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_with::skip_serializing_none;

/// The name of the one CDIConfig.
pub const NAME: &str = "config";

/// What the cluster administrator sets.
#[skip_serializing_none]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "cdi.kubevirt.io",
    version = "v1beta1",
    kind = "CDIConfig",
    plural = "cdiconfigs",
    singular = "cdiconfig",
    status = "CDIConfigStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct CDIConfigSpec {
    /// The upload proxy's URL as users reach it (a NodePort, an Ingress, a port-forward),
    /// preferred by virtctl over `status.uploadProxyURL`.
    #[serde(rename = "uploadProxyURLOverride")]
    pub upload_proxy_url_override: Option<String>,
    /// Accepted, not acted on.
    pub import_proxy: Option<BTreeMap<String, Value>>,
    /// Accepted, not acted on (kubevirt-rs spools next to the disk).
    pub scratch_space_storage_class: Option<String>,
    /// Accepted, not acted on.
    pub pod_resource_requirements: Option<BTreeMap<String, Value>>,
    /// Accepted, not acted on.
    pub feature_gates: Option<Vec<String>>,
    /// Accepted, not acted on (kubevirt-rs uses KubeVirt's 5.5 %).
    pub filesystem_overhead: Option<BTreeMap<String, Value>>,
    /// Accepted, not acted on.
    pub preallocation: Option<bool>,
    /// Accepted, not acted on.
    pub insecure_registries: Option<Vec<String>>,
    /// Accepted, not acted on.
    #[serde(rename = "dataVolumeTTLSeconds")]
    pub data_volume_ttl_seconds: Option<i32>,
    /// Accepted, not acted on.
    pub tls_security_profile: Option<BTreeMap<String, Value>>,
    /// Accepted, not acted on.
    pub image_pull_secrets: Option<Vec<BTreeMap<String, Value>>>,
    /// Accepted, not acted on.
    pub log_verbosity: Option<i32>,
}

/// What virt-operator reports.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CDIConfigStatus {
    /// The upload proxy's URL (its Service inside the cluster).
    #[serde(rename = "uploadProxyURL")]
    pub upload_proxy_url: Option<String>,
    /// PEM of the CA the upload proxy's certificate chains to.
    #[serde(rename = "uploadProxyCA")]
    pub upload_proxy_ca: Option<String>,
    pub import_proxy: Option<BTreeMap<String, Value>>,
    pub scratch_space_storage_class: Option<String>,
    pub default_pod_resource_requirements: Option<BTreeMap<String, Value>>,
    pub filesystem_overhead: Option<BTreeMap<String, Value>>,
    pub preallocation: Option<bool>,
    pub image_pull_secrets: Option<Vec<BTreeMap<String, Value>>>,
}
