//! The `KubeVirt` resource virt-operator reconciles, and the one CRD kubevirt-rs ships.
//!
//! Its fields are KubeVirt's (every field of `KubeVirtSpec`; status phase, conditions,
//! observed/target version) and the spec types are `kubevirt-api`'s. The
//! CRD serves it as **`kubevirt.io/v1alpha3`** (KubeVirt serves the same schema at v1 and
//! v1alpha3): kubevirt.io/v1 is served by virt-apiserver through the APIService
//! `v1.kubevirt.io`, and a CRD version v1 in that group would make kube-apiserver's
//! autoregister controller claim that APIService for itself (docs/deploy.md).

use std::borrow::Cow;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
pub use kubevirt_api::kubevirt::KubeVirtSpec;
use kubevirt_api::kubevirt::KubeVirtStatus;
use serde::{Deserialize, Serialize};

/// The version the CRD serves.
pub const VERSION: &str = kubevirt_api::kubevirt::CRD_VERSION;
/// `apiVersion` of KubeVirt objects.
pub const API_VERSION: &str = kubevirt_api::kubevirt::CRD_API_VERSION;
/// Finalizer that makes deleting the KubeVirt resource uninstall everything first.
pub const FINALIZER: &str = "kubevirt.io/virtOperatorFinalizer";
/// Uninstall is refused while VirtualMachines or VirtualMachineInstances exist.
pub const BLOCK_UNINSTALL: &str = "BlockUninstallIfWorkloadsExist";
/// Uninstall deletes VirtualMachines and VirtualMachineInstances with everything else.
pub const REMOVE_WORKLOADS: &str = "RemoveWorkloads";

/// A KubeVirt object as the operator reads it from kube-apiserver, at
/// [`API_VERSION`]: `kubevirt-api`'s spec and status (one schema for v1 and v1alpha3), with a
/// `kube::Resource` of its own because the derived one is v1, which only virt-apiserver
/// serves (and the operator must work before it runs).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct KubeVirt {
    /// Standard object metadata.
    pub metadata: ObjectMeta,
    /// Desired installation.
    #[serde(default)]
    pub spec: KubeVirtSpec,
    /// Observed installation.
    #[serde(default)]
    pub status: Option<KubeVirtStatus>,
}

impl KubeVirt {
    /// A KubeVirt object named `name` with `spec`.
    pub fn new(name: &str, spec: KubeVirtSpec) -> Self {
        Self {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..ObjectMeta::default()
            },
            spec,
            status: None,
        }
    }
}

/// With `apiVersion` and `kind` always written (kube-apiserver refuses an object without
/// them), as kube's derive does.
impl Serialize for KubeVirt {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("KubeVirt", 5)?;
        st.serialize_field("apiVersion", API_VERSION)?;
        st.serialize_field("kind", "KubeVirt")?;
        st.serialize_field("metadata", &self.metadata)?;
        st.serialize_field("spec", &self.spec)?;
        if let Some(status) = &self.status {
            st.serialize_field("status", status)?;
        } else {
            st.skip_field("status")?;
        }
        st.end()
    }
}

impl kube::Resource for KubeVirt {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "KubeVirt".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        kubevirt_api::GROUP.into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        VERSION.into()
    }
    fn api_version(_: &()) -> Cow<'_, str> {
        API_VERSION.into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        kubevirt_api::kubevirt::PLURAL.into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The CRD of [`KubeVirt`].
pub fn crd() -> CustomResourceDefinition {
    let mut crd = kubevirt_api::kubevirt::crd_v1alpha3();
    crd.metadata.labels = Some(crate::render::part_of_labels("virt-operator"));
    crd
}

/// Whether the CRD `name` exists: how the operator learns what else the cluster runs (the
/// prometheus-operator's kinds, CDI's DataVolume). Its ClusterRole may get only the CRDs
/// install.rs names.
pub async fn crd_exists(client: &kube::Client, name: &str) -> Result<bool, kube::Error> {
    kube::Api::<CustomResourceDefinition>::all(client.clone())
        .get_opt(name)
        .await
        .map(|c| c.is_some())
}

/// The kinds an uninstall counts and, by uninstallStrategy, deletes (the operator's
/// ClusterRole grants exactly these). A migration is no workload of its own (it moves a
/// VMI); any left go with the store. Pools and replica sets first: deleted after their VMs
/// or VMIs, they would make them again.
pub(crate) const WORKLOADS: [&kubevirt_api::catalogue::Kind; 4] = [
    &kubevirt_api::kinds::pool::KIND,
    &kubevirt_api::kinds::replicaset::KIND,
    &kubevirt_api::catalogue::VIRTUAL_MACHINE,
    &kubevirt_api::catalogue::VIRTUAL_MACHINE_INSTANCE,
];

/// The API resource of one of [`WORKLOADS`]' kinds (or any catalogue kind).
pub(crate) fn workload_resource(k: &kubevirt_api::catalogue::Kind) -> kube::api::ApiResource {
    kube::api::ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk(k.group, k.version, k.kind),
        k.plural,
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn written_at_v1alpha3_with_its_kind_and_read_from_any_version() {
        let v = serde_json::to_value(KubeVirt::new("kubevirt", KubeVirtSpec::default())).unwrap();
        assert_eq!(v["apiVersion"], API_VERSION);
        assert_eq!(v["kind"], "KubeVirt");
        assert!(v.get("status").is_none());
        let kv: KubeVirt = serde_json::from_value(serde_json::json!({
            "apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
            "metadata": {"name": "kubevirt"}, "spec": {"imageTag": "t"}}))
        .unwrap();
        assert_eq!(kv.spec.image_tag.as_deref(), Some("t"));
    }
}
