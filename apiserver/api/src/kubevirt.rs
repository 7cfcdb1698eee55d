//! KubeVirt: the install/upgrade resource reconciled by virt-operator, with every field of
//! KubeVirt's `KubeVirtSpec`. It is stored by kube-apiserver as a CRD at
//! `kubevirt.io/v1alpha3` ([`crd_v1alpha3`]), so the operator works before our API server
//! runs; virt-apiserver serves the same objects at `kubevirt.io/v1` by forwarding to that CRD
//! (docs/deploy.md). Fields kubevirt-rs does not implement are typed where KubeVirt types
//! them, or kept as free-form objects, so a KubeVirt user's resource is never rejected; the
//! operator names the ones set in an Event and a condition.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResource;
use kube::core::CustomResourceExt;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use crate::common::Condition;

/// The version kube-apiserver serves the KubeVirt CRD at (v1 belongs to virt-apiserver's
/// APIService, see docs/deploy.md).
pub const CRD_VERSION: &str = "v1alpha3";
/// `apiVersion` of KubeVirt objects as kube-apiserver stores them.
pub const CRD_API_VERSION: &str = "kubevirt.io/v1alpha3";
/// Plural resource name of KubeVirt.
pub const PLURAL: &str = crate::catalogue::KUBEVIRT.plural;
/// Name of the KubeVirt CRD (`<plural>.<group>`; a test holds it to both).
pub const CRD_NAME: &str = "kubevirts.kubevirt.io";

/// Specification of a kubevirt-rs installation: KubeVirt's `KubeVirtSpec`, field for field.
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
    category = "all",
    namespaced,
    status = "KubeVirtStatus",
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".status.observedKubeVirtVersion"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct KubeVirtSpec {
    /// The image tag to use for the container images installed. Defaults to the same tag as
    /// the operator's container image.
    pub image_tag: Option<String>,
    /// The image registry to pull the container images from. Defaults to the same registry
    /// the operator's container image is pulled from.
    pub image_registry: Option<String>,
    /// The ImagePullPolicy to use: `Always`, `IfNotPresent` or `Never`.
    pub image_pull_policy: Option<String>,
    /// The imagePullSecrets to pull the container images with (not implemented by
    /// kubevirt-rs: kept and reported).
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub image_pull_secrets: Option<Vec<k8s_openapi::api::core::v1::LocalObjectReference>>,
    /// The namespace of Prometheus' ServiceAccount (default: the first of
    /// `openshift-monitoring`, `monitoring` holding it); virt-operator lets it read the
    /// metrics endpoints and, with the prometheus-operator, installs a ServiceMonitor.
    pub monitor_namespace: Option<String>,
    /// The namespace the ServiceMonitor is deployed in (default: the monitor namespace).
    pub service_monitor_namespace: Option<String>,
    /// The Prometheus ServiceAccount that needs read access to KubeVirt endpoints (default
    /// `prometheus-k8s`).
    pub monitor_account: Option<String>,
    /// How workloads are updated after an upgrade (not implemented: VMs keep running on
    /// the launcher they started with; kept and reported).
    pub workload_update_strategy: Option<KubeVirtWorkloadUpdateStrategy>,
    /// `BlockUninstallIfWorkloadsExist` (default) or `RemoveWorkloads`.
    pub uninstall_strategy: Option<String>,
    /// Lifetimes and renewal of the operator's self-signed certificates.
    pub certificate_rotate_strategy: Option<KubeVirtCertificateRotateStrategy>,
    /// The `app.kubernetes.io/version` label of the components (not implemented: kept and
    /// reported).
    pub product_version: Option<String>,
    /// The `app.kubernetes.io/part-of` label of the components (not implemented: kept and
    /// reported).
    pub product_name: Option<String>,
    /// The `app.kubernetes.io/component` label of the components (not implemented: kept and
    /// reported).
    pub product_component: Option<String>,
    /// Cluster-wide configuration (KubeVirt's virt-config).
    pub configuration: Option<KubeVirtConfiguration>,
    /// Placement of the control-plane components (etcd, virt-apiserver, virt-controller).
    pub infra: Option<ComponentConfig>,
    /// Placement of virt-handler.
    pub workloads: Option<ComponentConfig>,
    /// Patches and flags applied to the rendered components (not implemented: kept and
    /// reported).
    pub customize_components: Option<CustomizeComponents>,
    /// kubevirt-rs's own settings, which upstream KubeVirt does not have. Named after the
    /// project so that no future upstream field can collide with them.
    pub kubevirt_rs: Option<KubevirtRsSpec>,
}

/// `spec.kubevirtRs`: settings of kubevirt-rs that have no counterpart in KubeVirt.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubevirtRsSpec {
    /// virt-apiserver's own etcd.
    pub etcd: Option<EtcdSpec>,
    /// virt-apiserver's limits per user.
    pub apiserver: Option<ApiserverSpec>,
}

/// `spec.kubevirtRs.apiserver`: what one user may hold open at once on virt-apiserver. A
/// user beyond a limit gets 429 (Too Many Requests) naming it; everyone else is unaffected.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApiserverSpec {
    /// Console, VNC and port-forward streams one user may have open at once, per
    /// virt-apiserver replica (default 200; 0: no limit).
    #[schemars(range(min = 0))]
    pub max_streams_per_user: Option<i64>,
    /// Watches one user may have open at once, per replica (default 5000; 0: no limit).
    #[schemars(range(min = 0))]
    pub max_watches_per_user: Option<i64>,
}

/// `spec.kubevirtRs.etcd`: the etcd that stores VirtualMachines, VMIs and migrations.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdSpec {
    /// Members of the etcd cluster: 1 (the default) or 3. Three members keep the VM API
    /// answering while any one of them is down (a node drained or lost); they need a default
    /// StorageClass (each member keeps its data on a PersistentVolumeClaim of its own).
    /// Changing it on a running installation adds or removes members one at a time through
    /// etcd's membership API, keeping every object.
    #[schemars(extend("enum" = [1, 3]))]
    pub members: Option<i32>,
}

/// The etcd member counts [`EtcdSpec::members`] allows.
pub const ETCD_MEMBER_COUNTS: [i32; 2] = [1, 3];

/// How workloads are updated after an upgrade.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KubeVirtWorkloadUpdateStrategy {
    /// Methods that may disrupt workloads during automated updates: `LiveMigrate`,
    /// `Evict`. An empty list means no automated workload updating.
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub workload_update_methods: Option<Vec<String>>,
    /// Number of VMIs that can be forcibly updated per batchEvictionInterval (KubeVirt's
    /// default 10).
    pub batch_eviction_size: Option<i64>,
    /// Interval between batches of shutdowns (a Go duration, KubeVirt's default 1m).
    pub batch_eviction_interval: Option<String>,
}

/// Patches and flags for the rendered components.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CustomizeComponents {
    /// Patches to the rendered objects.
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub patches: Option<Vec<CustomizeComponentsPatch>>,
    /// Replacement command-line flags of the Deployments and DaemonSets.
    pub flags: Option<Flags>,
}

/// Replacement flags per component.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Flags {
    /// virt-api flags.
    pub api: Option<BTreeMap<String, String>>,
    /// virt-controller flags.
    pub controller: Option<BTreeMap<String, String>>,
    /// virt-handler flags.
    pub handler: Option<BTreeMap<String, String>>,
}

/// One patch to a rendered object.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CustomizeComponentsPatch {
    /// Name of the patched object.
    #[serde(default)]
    pub resource_name: String,
    /// Kind of the patched object.
    #[serde(default)]
    pub resource_type: String,
    /// The patch.
    #[serde(default)]
    pub patch: String,
    /// `json`, `merge` or `strategic`.
    #[serde(default, rename = "type")]
    pub type_: String,
}

/// The CRD kube-apiserver stores KubeVirt objects in: this type's schema at
/// [`CRD_VERSION`] (the only CRD kubevirt-rs ships; see the module docs for why not v1).
pub fn crd_v1alpha3() -> CustomResourceDefinition {
    let mut crd = KubeVirt::crd();
    for v in &mut crd.spec.versions {
        v.name = CRD_VERSION.to_string();
    }
    crd
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

/// Cluster-wide configuration. What kubevirt-rs implements is typed; every other field of
/// KubeVirt's `KubeVirtConfiguration` (migrations, network, smbios, …) is kept as given in
/// [`Self::other`] and reported by the operator, never rejected.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct KubeVirtConfiguration {
    /// Developer settings.
    pub developer_configuration: Option<DeveloperConfiguration>,
    /// Default `evictionStrategy` of VMIs that set none: `None` (KubeVirt's default),
    /// `LiveMigrate`, `LiveMigrateIfPossible` or `External`. A string, so that a wrong value
    /// is reported by virt-operator rather than making the resource unreadable.
    pub eviction_strategy: Option<String>,
    /// Live migration limits and timeouts.
    pub migrations: Option<MigrationConfiguration>,
    /// Cluster-wide defaults of VMs.
    pub virtual_machine_options: Option<VirtualMachineOptions>,
    /// Whether virt-operator deploys KubeVirt's common-instancetypes bundle (enabled unless
    /// `enabled: false`).
    pub common_instancetypes_deployment: Option<CommonInstancetypesDeployment>,
    /// Instance type settings: how VMs keep their instance type and preference.
    pub instancetype: Option<InstancetypeConfiguration>,
    /// How a running VM gets a changed template: `Stage` (the default: at its next
    /// restart, `RestartRequired` saying so) or `LiveUpdate` (node selector, affinity,
    /// tolerations and CPU sockets carried to the running VMI). A string, so that a wrong
    /// value is reported by virt-operator rather than making the resource unreadable.
    pub vm_rollout_strategy: Option<String>,
    /// Limits of live updates (KubeVirt's `LiveUpdateConfiguration`).
    pub live_update_configuration: Option<LiveUpdateConfiguration>,
    /// The other fields of KubeVirt's configuration, as given.
    #[serde(flatten)]
    #[schemars(skip)]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// Cluster-wide defaults of VMs (KubeVirt's `VirtualMachineOptions`).
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct VirtualMachineOptions {
    /// Present (`{}`, as KubeVirt's empty struct): launcher pods get no `guest-console-log`
    /// container unless a VMI asks with `domain.devices.logSerialConsole: true`. Absent:
    /// every VMI's serial console is logged unless it sets `logSerialConsole: false`.
    pub disable_serial_console_log: Option<DisableSerialConsoleLog>,
    /// The other fields (disableFreePageReporting, …), as given.
    #[serde(flatten)]
    #[schemars(skip)]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// KubeVirt's `CommonInstancetypesDeployment`.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CommonInstancetypesDeployment {
    /// Deploy the bundle (default true); false removes what virt-operator deployed.
    pub enabled: Option<bool>,
}

/// KubeVirt's `InstancetypeConfiguration`.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstancetypeConfiguration {
    /// `reference` (the default: a copy in a ControllerRevision the VM's status names),
    /// `expand` (written into VMs that captured no copy yet, the references dropped) or
    /// `expandAll` (into every VM). A string, so that a wrong value is reported by
    /// virt-operator rather than making the resource unreadable.
    pub reference_policy: Option<String>,
}

/// KubeVirt's `LiveUpdateConfiguration`: how far a running VM may grow.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LiveUpdateConfiguration {
    /// `maxSockets` of a VM that sets none is its sockets times this (default 4).
    pub max_hotplug_ratio: Option<u32>,
    /// Upper bound of every VM's `maxSockets` (none by default).
    pub max_cpu_sockets: Option<u32>,
    /// Upper bound of every VM's `memory.maxGuest` (none by default).
    pub max_guest: Option<k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
}

/// The VM rollout strategies (`spec.configuration.vmRolloutStrategy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VmRolloutStrategy {
    /// A changed template reaches a running VM at its next restart (KubeVirt's default).
    #[default]
    Stage,
    /// What can change live does (node placement, CPU sockets); the rest waits for a
    /// restart.
    LiveUpdate,
}

impl VmRolloutStrategy {
    /// Both, as KubeVirt spells them.
    pub const ALL: [Self; 2] = [Self::Stage, Self::LiveUpdate];

    /// KubeVirt's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stage => "Stage",
            Self::LiveUpdate => "LiveUpdate",
        }
    }

    /// The strategy spelled `s`, if any.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.as_str() == s)
    }
}

/// KubeVirt's `DisableSerialConsoleLog`: an empty object whose presence is the setting.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DisableSerialConsoleLog {}

impl KubeVirtConfiguration {
    /// Whether KubeVirt's common-instancetypes bundle is deployed (KubeVirt's default: yes).
    pub fn common_instancetypes_enabled(&self) -> bool {
        self.common_instancetypes_deployment
            .as_ref()
            .and_then(|d| d.enabled)
            .unwrap_or(true)
    }

    /// Whether launcher pods log the serial console by default.
    pub fn serial_console_log(&self) -> bool {
        self.virtual_machine_options
            .as_ref()
            .is_none_or(|o| o.disable_serial_console_log.is_none())
    }
}

/// Live migration settings (KubeVirt's `MigrationConfiguration`). What virt-controller
/// enforces is typed; the other fields (bandwidthPerMigration, allowPostCopy, …) are kept in
/// [`Self::other`] and reported as not implemented.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct MigrationConfiguration {
    /// Migrations past Pending in the whole cluster (default 5).
    pub parallel_migrations_per_cluster: Option<i64>,
    /// Migrations leaving one node at once (default 2).
    pub parallel_outbound_migrations_per_node: Option<i64>,
    /// Seconds a migration may make no progress before it is aborted (default 150).
    pub progress_timeout: Option<i64>,
    /// Seconds per GiB of guest memory a migration may take before it is aborted (default
    /// 150).
    #[serde(rename = "completionTimeoutPerGiB")]
    pub completion_timeout_per_gib: Option<i64>,
    /// The other migration fields, as given.
    #[serde(flatten)]
    #[schemars(skip)]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// Developer settings. As with [`KubeVirtConfiguration`], KubeVirt's other developer fields
/// (logVerbosity, memoryOvercommit, …) are kept in [`Self::other`].
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct DeveloperConfiguration {
    /// Fall back to software emulation (TCG) when KVM is unusable.
    pub use_emulation: Option<bool>,
    /// Enabled feature gates.
    pub feature_gates: Option<Vec<String>>,
    /// The other developer fields, as given.
    #[serde(flatten)]
    #[schemars(skip)]
    pub other: BTreeMap<String, serde_json::Value>,
}

/// Placement of a group of components.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComponentConfig {
    /// Node placement.
    pub node_placement: Option<NodePlacement>,
    /// Replicas of the control-plane components (not implemented: kept and reported).
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
    /// Running VMIs still on an older virt-launcher (written by virt-controller's workload
    /// updater).
    pub outdated_virtual_machine_instance_workloads: Option<i64>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// KubeVirt's `disableSerialConsoleLog` is an empty object whose presence disables;
    /// the other VM options survive a round trip.
    #[test]
    fn disable_serial_console_log_is_a_presence() {
        let c =
            |v: serde_json::Value| -> KubeVirtConfiguration { serde_json::from_value(v).unwrap() };
        assert!(c(serde_json::json!({})).serial_console_log());
        assert!(c(serde_json::json!({"virtualMachineOptions": {}})).serial_console_log());
        let off = c(serde_json::json!({"virtualMachineOptions": {
            "disableSerialConsoleLog": {}, "disableFreePageReporting": {}}}));
        assert!(!off.serial_console_log());
        assert_eq!(
            serde_json::to_value(&off).unwrap(),
            serde_json::json!({"virtualMachineOptions": {
                "disableSerialConsoleLog": {}, "disableFreePageReporting": {}}})
        );
    }

    /// The kubevirt-cr.yaml KubeVirt's releases ship, unchanged.
    const KUBEVIRT_CR: &str = "apiVersion: kubevirt.io/v1
kind: KubeVirt
metadata: {name: kubevirt, namespace: kubevirt}
spec:
  certificateRotateStrategy: {}
  configuration:
    developerConfiguration:
      featureGates: []
  customizeComponents: {}
  imagePullPolicy: IfNotPresent
  workloadUpdateStrategy: {}
";

    #[test]
    fn crd_name_is_plural_dot_group() {
        assert_eq!(CRD_NAME, format!("{PLURAL}.{}", crate::GROUP));
        assert_eq!(crd_v1alpha3().metadata.name.as_deref(), Some(CRD_NAME));
    }

    #[test]
    fn kubevirts_own_cr_round_trips_unchanged() {
        let kv: KubeVirt = serde_saphyr::from_str(KUBEVIRT_CR).unwrap();
        let back = serde_json::to_value(&kv).unwrap();
        let want: serde_json::Value = serde_saphyr::from_str(KUBEVIRT_CR).unwrap();
        assert_eq!(back["spec"], want["spec"]);
    }

    #[test]
    fn configuration_fields_we_do_not_type_are_kept() {
        let spec = serde_json::json!({"configuration": {
            "developerConfiguration": {"useEmulation": true, "logVerbosity": {"virtLauncher": 4}},
            "migrations": {"parallelMigrationsPerCluster": 5, "allowPostCopy": true},
            "network": {"defaultNetworkInterface": "masquerade"}},
            "workloads": {"replicas": 3}});
        let s: KubeVirtSpec = serde_json::from_value(spec.clone()).unwrap();
        let c = s.configuration.as_ref().unwrap();
        assert!(c.other.contains_key("network"));
        let m = c.migrations.as_ref().unwrap();
        assert_eq!(m.parallel_migrations_per_cluster, Some(5));
        assert!(m.other.contains_key("allowPostCopy"));
        assert_eq!(
            c.developer_configuration.as_ref().unwrap().use_emulation,
            Some(true)
        );
        assert_eq!(serde_json::to_value(&s).unwrap(), spec);
    }

    #[test]
    fn the_crd_is_v1alpha3_and_keeps_unknown_configuration() {
        let crd = crd_v1alpha3();
        assert_eq!(crd.spec.versions.len(), 1);
        let v = &crd.spec.versions[0];
        assert_eq!(v.name, CRD_VERSION);
        let schema = serde_json::to_value(v.schema.as_ref().unwrap()).unwrap();
        let spec = &schema["openAPIV3Schema"]["properties"]["spec"]["properties"];
        for f in [
            "certificateRotateStrategy",
            "configuration",
            "customizeComponents",
            "imagePullPolicy",
            "imagePullSecrets",
            "imageRegistry",
            "imageTag",
            "infra",
            "monitorAccount",
            "monitorNamespace",
            "productComponent",
            "productName",
            "productVersion",
            "serviceMonitorNamespace",
            "uninstallStrategy",
            "workloadUpdateStrategy",
            "workloads",
            "kubevirtRs",
        ] {
            assert!(spec.get(f).is_some(), "{f} missing from the CRD schema");
        }
        // kube-apiserver itself refuses any other member count, naming the field.
        let members = &spec["kubevirtRs"]["properties"]["etcd"]["properties"]["members"];
        assert_eq!(
            members["enum"],
            serde_json::json!(ETCD_MEMBER_COUNTS),
            "{members}"
        );
        let conf = &spec["configuration"];
        assert_eq!(conf["x-kubernetes-preserve-unknown-fields"], true, "{conf}");
        assert_eq!(
            conf["properties"]["developerConfiguration"]["x-kubernetes-preserve-unknown-fields"],
            true
        );
    }
}
