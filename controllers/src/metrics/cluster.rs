//! KubeVirt's control-plane inventory metrics (`kubevirt_vmi_info`, `kubevirt_vm_info`,
//! `kubevirt_vm_resource_requests`, …): a pure function of the VMs and VMIs of the
//! controller's caches, computed at each scrape, as KubeVirt's virt-controller collectors
//! compute them from its informers (`pkg/monitoring/metrics/virt-controller/
//! vmistats_collector.go`, `vmstats_collector.go` of v1.6.0). Names, help texts and types
//! are KubeVirt's (`controllers/tests/kubevirt_metrics.rs` compares them with KubeVirt's
//! `docs/observability/metrics.md`); label names and values are those KubeVirt's code
//! gives, so its dashboards, alerts and recording rules read them unchanged.
//!
//! One approximation, because we keep no watch of instance types and preferences: KubeVirt
//! names an instance type (or preference) in `instance_type` (`preference`) only when the
//! object carries the label `instancetype.kubevirt.io/vendor` `kubevirt.io` or
//! `redhat.com`, else `<other>`. Here a cluster-wide one whose name is in KubeVirt's
//! common-instancetypes bundle (all labelled `kubevirt.io`) is named, any other is
//! `<other>` (a namespaced one, or a cluster one of another vendor or of the same name but
//! edited, would be named by KubeVirt only with that label). And `kubevirt_vm_resource_*`
//! are read from the VM's template without applying the instance type first (KubeVirt
//! applies it): a VM with an instance type shows only what its template sets itself.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::{Arc, OnceLock};

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kubevirt_api::common::ConditionStatus;
use kubevirt_api::eviction::EvictionStrategy;
use kubevirt_api::instancetype::vm::{
    CLUSTER_INSTANCETYPE_ANNOTATION, CLUSTER_PREFERENCE_ANNOTATION, INSTANCETYPE_ANNOTATION,
    PREFERENCE_ANNOTATION,
};
use kubevirt_api::vm::{Matcher, PrintableStatus};
use kubevirt_api::vmi::{DomainSpec, Interface, Network, VirtualMachineInstanceSpec, Volume};
use kubevirt_api::{VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceMigration};

/// A metric's type, as KubeVirt declares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// KubeVirt's counters here are timestamps whose names do not end in `_total`: the
    /// series keeps that name (as client_golang's text format writes it).
    Counter,
    /// Any value.
    Gauge,
}

/// A metric: KubeVirt's name, help text, type and label names (in KubeVirt's order).
#[derive(Debug, PartialEq, Eq)]
pub struct Desc {
    /// Full name.
    pub name: &'static str,
    /// Help text, KubeVirt's.
    pub help: &'static str,
    /// Type.
    pub kind: Kind,
    /// Every label of every series.
    pub labels: &'static [&'static str],
}

macro_rules! descs {
    ($($id:ident = $kind:ident($name:literal, $help:literal, [$($l:literal),*]);)*) => {
        $(
            #[doc = concat!("`", $name, "`.")]
            pub const $id: Desc = Desc {
                name: $name,
                help: $help,
                kind: Kind::$kind,
                labels: &[$($l),*],
            };
        )*
        /// Every family computed from the caches, in exposition order.
        pub const ALL: &[&Desc] = &[$(&$id),*];
    };
}

descs! {
    VMI_INFO = Gauge("kubevirt_vmi_info", "Information about VirtualMachineInstances.", ["node", "namespace", "name", "phase", "os", "workload", "flavor", "instance_type", "preference", "guest_os_kernel_release", "guest_os_machine", "guest_os_arch", "guest_os_name", "guest_os_version_id", "evictable", "outdated", "vmi_pod"]);
    VMI_NON_EVICTABLE = Gauge("kubevirt_vmi_non_evictable", "Indication for a VirtualMachine that its eviction strategy is set to Live Migration but is not migratable.", ["node", "namespace", "name"]);
    VMI_ADDRESSES = Gauge("kubevirt_vmi_status_addresses", "The addresses of a VirtualMachineInstance. This metric provides the address of an available network interface associated with the VMI in the 'address' label, and about the type of address, such as internal IP, in the 'type' label.", ["node", "namespace", "name", "vnic_name", "interface_name", "address", "type"]);
    VMI_MIGRATION_START = Gauge("kubevirt_vmi_migration_start_time_seconds", "The time at which the migration started.", ["node", "namespace", "name", "migration_name"]);
    VMI_MIGRATION_END = Gauge("kubevirt_vmi_migration_end_time_seconds", "The time at which the migration ended.", ["node", "namespace", "name", "migration_name", "status"]);
    VMI_VNIC_INFO = Gauge("kubevirt_vmi_vnic_info", "Details of VirtualMachineInstance (VMI) vNIC interfaces, such as vNIC name, binding type, network name, and binding name for each vNIC of a running instance.", ["name", "namespace", "vnic_name", "binding_type", "network", "binding_name", "model"]);
    VMI_LAUNCHER_MEMORY_OVERHEAD = Gauge("kubevirt_vmi_launcher_memory_overhead_bytes", "Estimation of the memory amount required for virt-launcher's infrastructure components (e.g. libvirt, QEMU).", ["namespace", "name"]);
    VM_STARTING = Counter("kubevirt_vm_starting_status_last_transition_timestamp_seconds", "Virtual Machine last transition timestamp to starting status.", ["name", "namespace"]);
    VM_RUNNING = Counter("kubevirt_vm_running_status_last_transition_timestamp_seconds", "Virtual Machine last transition timestamp to running status.", ["name", "namespace"]);
    VM_MIGRATING = Counter("kubevirt_vm_migrating_status_last_transition_timestamp_seconds", "Virtual Machine last transition timestamp to migrating status.", ["name", "namespace"]);
    VM_NON_RUNNING = Counter("kubevirt_vm_non_running_status_last_transition_timestamp_seconds", "Virtual Machine last transition timestamp to paused/stopped status.", ["name", "namespace"]);
    VM_ERROR = Counter("kubevirt_vm_error_status_last_transition_timestamp_seconds", "Virtual Machine last transition timestamp to error status.", ["name", "namespace"]);
    VM_RESOURCE_REQUESTS = Gauge("kubevirt_vm_resource_requests", "Resources requested by Virtual Machine. Reports memory and CPU requests.", ["name", "namespace", "resource", "unit", "source"]);
    VM_RESOURCE_LIMITS = Gauge("kubevirt_vm_resource_limits", "Resources limits by Virtual Machine. Reports memory and CPU limits.", ["name", "namespace", "resource", "unit"]);
    VM_INFO = Gauge("kubevirt_vm_info", "Information about Virtual Machines.", ["name", "namespace", "os", "workload", "flavor", "machine_type", "instance_type", "preference", "status", "status_group"]);
    VM_CREATE_DATE = Gauge("kubevirt_vm_create_date_timestamp_seconds", "Virtual Machine creation timestamp.", ["name", "namespace"]);
    VM_DISK_ALLOCATED_SIZE = Gauge("kubevirt_vm_disk_allocated_size_bytes", "Allocated disk size of a Virtual Machine in bytes, based on its PersistentVolumeClaim. Includes persistentvolumeclaim (PVC name), volume_mode (disk presentation mode: Filesystem or Block), and device (disk name).", ["name", "namespace", "persistentvolumeclaim", "volume_mode", "device"]);
    VM_VNIC_INFO = Gauge("kubevirt_vm_vnic_info", "Details of Virtual Machine (VM) vNIC interfaces, such as vNIC name, binding type, network name, and binding name for each vNIC defined in the VM's configuration.", ["name", "namespace", "vnic_name", "binding_type", "network", "binding_name", "model"]);
    MIGRATIONS_PENDING = Gauge("kubevirt_vmi_migrations_in_pending_phase", "Number of current pending migrations.", []);
    MIGRATIONS_SCHEDULING = Gauge("kubevirt_vmi_migrations_in_scheduling_phase", "Number of current scheduling migrations.", []);
    MIGRATIONS_UNSET = Gauge("kubevirt_vmi_migrations_in_unset_phase", "Number of current unset migrations. These are pending items the virt-controller hasn’t processed yet from the queue.", []);
    MIGRATIONS_RUNNING = Gauge("kubevirt_vmi_migrations_in_running_phase", "Number of current running migrations.", []);
    MIGRATION_SUCCEEDED = Gauge("kubevirt_vmi_migration_succeeded", "Indicates if the VMI migration succeeded.", ["vmi", "vmim", "namespace"]);
    MIGRATION_FAILED = Gauge("kubevirt_vmi_migration_failed", "Indicates if the VMI migration failed.", ["vmi", "vmim", "namespace"]);
}

/// The VMI families, in [`ALL`]'s order.
const VMI_FAMILIES: [&Desc; 7] = [
    &VMI_INFO,
    &VMI_NON_EVICTABLE,
    &VMI_ADDRESSES,
    &VMI_MIGRATION_START,
    &VMI_MIGRATION_END,
    &VMI_VNIC_INFO,
    &VMI_LAUNCHER_MEMORY_OVERHEAD,
];

/// The VM families, in [`ALL`]'s order.
const VM_FAMILIES: [&Desc; 11] = [
    &VM_STARTING,
    &VM_RUNNING,
    &VM_MIGRATING,
    &VM_NON_RUNNING,
    &VM_ERROR,
    &VM_RESOURCE_REQUESTS,
    &VM_RESOURCE_LIMITS,
    &VM_INFO,
    &VM_CREATE_DATE,
    &VM_DISK_ALLOCATED_SIZE,
    &VM_VNIC_INFO,
];

/// The migration families, in [`ALL`]'s order.
const MIGRATION_FAMILIES: [&Desc; 6] = [
    &MIGRATIONS_PENDING,
    &MIGRATIONS_SCHEDULING,
    &MIGRATIONS_UNSET,
    &MIGRATIONS_RUNNING,
    &MIGRATION_SUCCEEDED,
    &MIGRATION_FAILED,
];

/// The five status-transition families, in KubeVirt's order.
const TIMESTAMPS: [&Desc; 5] = [
    &VM_STARTING,
    &VM_RUNNING,
    &VM_MIGRATING,
    &VM_NON_RUNNING,
    &VM_ERROR,
];

/// One series: its label values, in [`Desc::labels`] order.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Label values.
    pub labels: Vec<String>,
    /// Value.
    pub value: f64,
}

/// A metric's series of one scrape.
#[derive(Debug, PartialEq)]
pub struct Family {
    /// Which metric.
    pub desc: &'static Desc,
    /// Its series; never two with the same labels.
    pub samples: Vec<Sample>,
}

impl Family {
    /// The series' labels as (name, value) pairs.
    pub fn labelled(&self, s: &Sample) -> Vec<(&'static str, String)> {
        self.desc
            .labels
            .iter()
            .copied()
            .zip(s.labels.iter().cloned())
            .collect()
    }
}

/// Collects samples per family in [`ALL`]'s order.
struct Families(Vec<Family>);

impl Families {
    fn new(descs: &[&'static Desc]) -> Self {
        Self(
            descs
                .iter()
                .map(|d| Family {
                    desc: d,
                    samples: Vec::new(),
                })
                .collect(),
        )
    }

    fn push(&mut self, desc: &'static Desc, labels: Vec<String>, value: f64) {
        debug_assert_eq!(labels.len(), desc.labels.len(), "{}", desc.name);
        // By name: a `const`'s address is not unique.
        if let Some(f) = self.0.iter_mut().find(|f| f.desc.name == desc.name) {
            f.samples.push(Sample { labels, value });
        }
    }

    /// The families with series, each series once: a duplicate would make Prometheus
    /// reject the whole scrape (KubeVirt's collector skips the same cases).
    fn finish(self) -> Vec<Family> {
        self.0
            .into_iter()
            .filter(|f| !f.samples.is_empty())
            .map(|mut f| {
                let mut seen = HashSet::new();
                f.samples.retain(|s| seen.insert(s.labels.clone()));
                f
            })
            .collect()
    }
}

/// KubeVirt's value of an empty label (operator-observability drops it; Prometheus
/// stores a label with an empty value as no label).
const NONE: &str = "";
/// KubeVirt's name of an instance type or preference it does not name.
const OTHER: &str = "<other>";
const ANNOTATION_PREFIX: &str = "vm.kubevirt.io/";
/// The label of a VMI that runs on an old launcher image (the workload updater's).
const OUTDATED_LABEL: &str = crate::workload::decide::OUTDATED_LAUNCHER_IMAGE_LABEL;
const CLUSTER_INSTANCETYPE_KIND: &str = "virtualmachineclusterinstancetype";
const INSTANCETYPE_KIND: &str = "virtualmachineinstancetype";
const CLUSTER_PREFERENCE_KIND: &str = "virtualmachineclusterpreference";
const PREFERENCE_KIND: &str = "virtualmachinepreference";

/// Names of the objects of a multi-document YAML stream of KubeVirt's bundle: the
/// `name:` of each document's top-level `metadata:` (read by lines: the bundle is
/// KubeVirt's generated YAML, two-space indented, and this is all we need of it).
fn bundle_names(yaml: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut in_metadata = false;
    for line in yaml.lines() {
        // A block scalar's empty line is not the end of the block.
        if line.trim().is_empty() {
            continue;
        }
        if !line.starts_with(' ') {
            in_metadata = line.trim_end() == "metadata:";
            continue;
        }
        if in_metadata && let Some(name) = line.strip_prefix("  name: ") {
            names.insert(name.trim().trim_matches(['"', '\'']).to_string());
        }
    }
    names
}

/// The cluster instance types and preferences of KubeVirt's common-instancetypes bundle,
/// every one labelled `instancetype.kubevirt.io/vendor: kubevirt.io`.
fn bundle() -> &'static (BTreeSet<String>, BTreeSet<String>) {
    static BUNDLE: OnceLock<(BTreeSet<String>, BTreeSet<String>)> = OnceLock::new();
    BUNDLE.get_or_init(|| {
        (
            bundle_names(common_instancetypes::CLUSTER_INSTANCETYPES),
            bundle_names(common_instancetypes::CLUSTER_PREFERENCES),
        )
    })
}

/// Whether an instance type (`preference` false) or preference of this kind and name
/// is one KubeVirt would name (see the module's doc for the approximation).
fn vendor_name(cluster: bool, preference: bool, name: &str) -> String {
    let (types, prefs) = bundle();
    let known = if preference { prefs } else { types };
    if cluster && known.contains(name) {
        name.to_string()
    } else {
        OTHER.to_string()
    }
}

fn annotation<'a>(
    annotations: Option<&'a std::collections::BTreeMap<String, String>>,
    key: &str,
) -> Option<&'a str> {
    annotations.and_then(|a| a.get(key)).map(String::as_str)
}

/// `os`, `workload`, `flavor` from the `vm.kubevirt.io/*` annotations.
fn system_info(annotations: Option<&std::collections::BTreeMap<String, String>>) -> [String; 3] {
    ["os", "workload", "flavor"].map(|k| {
        annotation(annotations, &format!("{ANNOTATION_PREFIX}{k}"))
            .unwrap_or(NONE)
            .to_string()
    })
}

/// KubeVirt's `getVMIInstancetype` / `getVMIPreference`: from the VMI's annotations, the
/// namespaced one first.
fn vmi_reference(vmi: &VirtualMachineInstance, preference: bool) -> String {
    let a = vmi.metadata.annotations.as_ref();
    let (namespaced, cluster) = if preference {
        (PREFERENCE_ANNOTATION, CLUSTER_PREFERENCE_ANNOTATION)
    } else {
        (INSTANCETYPE_ANNOTATION, CLUSTER_INSTANCETYPE_ANNOTATION)
    };
    if let Some(n) = annotation(a, namespaced) {
        return vendor_name(false, preference, n);
    }
    if let Some(n) = annotation(a, cluster) {
        return vendor_name(true, preference, n);
    }
    NONE.to_string()
}

/// KubeVirt's `getVMInstancetype` / `getVMPreference`: by the matcher's kind (a kind
/// KubeVirt does not know gives no name).
fn vm_reference(matcher: Option<&Matcher>, preference: bool) -> String {
    let Some(m) = matcher else {
        return NONE.to_string();
    };
    let name = m.name.as_deref().unwrap_or_default();
    let kind = m.kind.as_deref().unwrap_or_default().to_ascii_lowercase();
    let (namespaced, cluster) = if preference {
        (PREFERENCE_KIND, CLUSTER_PREFERENCE_KIND)
    } else {
        (INSTANCETYPE_KIND, CLUSTER_INSTANCETYPE_KIND)
    };
    if kind == namespaced {
        vendor_name(false, preference, name)
    } else if kind == cluster {
        vendor_name(true, preference, name)
    } else {
        NONE.to_string()
    }
}

/// KubeVirt's `isVMEvictable`: a VMI whose eviction strategy (its own, else the
/// cluster's) migrates it on eviction must have the `LiveMigratable` condition, and not
/// `False` (an absent condition counts as not migratable: the metric feeds an alert,
/// KubeVirt errs on that side). `LiveMigrateIfPossible` never blocks: it migrates only
/// when the condition is `True`.
pub fn evictable(vmi: &VirtualMachineInstance, cluster_default: EvictionStrategy) -> bool {
    let cond = vmi
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "LiveMigratable"));
    let migrates_on_eviction = match kubevirt_api::eviction::effective(vmi, cluster_default) {
        EvictionStrategy::LiveMigrate => true,
        EvictionStrategy::LiveMigrateIfPossible => {
            cond.is_some_and(|c| c.status == ConditionStatus::True)
        }
        EvictionStrategy::None | EvictionStrategy::External => false,
    };
    !(migrates_on_eviction && cond.is_none_or(|c| c.status == ConditionStatus::False))
}

fn seconds(t: &Time) -> f64 {
    t.0.as_second() as f64
}

/// What the VMI families read besides the VMIs.
#[derive(Debug, Default)]
pub struct VmiContext {
    /// The cluster's evictionStrategy (VMIs that set none).
    pub eviction_default: Option<EvictionStrategy>,
    /// Running launcher pods: VMI uid → (node, pod name).
    pub launcher_pods: HashMap<String, Vec<(String, String)>>,
    /// Migration uid → name.
    pub migrations: HashMap<String, String>,
    /// VMI uid → the memory its launcher pod asks beyond the guest's, in bytes (what the
    /// VMI controller renders; none for a VMI it cannot render).
    pub launcher_overhead: HashMap<String, f64>,
}

/// KubeVirt's `getBinding`: the binding's type and name, empty for one it does not name
/// (passt, a core binding of v1.6's API, is among those).
fn binding(iface: &Interface) -> (&str, &str) {
    if iface.masquerade.is_some() {
        ("core", "masquerade")
    } else if iface.bridge.is_some() {
        ("core", "bridge")
    } else if iface.sriov.is_some() {
        ("core", "sriov")
    } else if let Some(b) = &iface.binding {
        ("plugin", b.name.as_str())
    } else {
        ("", "")
    }
}

/// KubeVirt's vNIC series (`kubevirt_vm_vnic_info`, `kubevirt_vmi_vnic_info`) of one spec:
/// the label values after name and namespace of each interface whose network is the pod
/// network or a Multus network; an interface without such a network has none.
fn vnics(interfaces: &[Interface], networks: &[Network]) -> Vec<[String; 5]> {
    interfaces
        .iter()
        .filter_map(|iface| {
            let net = networks.iter().find(|n| n.name == iface.name)?;
            let network = match (&net.pod, &net.multus) {
                (Some(_), _) => "pod networking".to_string(),
                (None, Some(m)) => m.network_name.clone(),
                (None, None) => return None,
            };
            let (binding_type, binding_name) = binding(iface);
            Some([
                iface.name.clone(),
                binding_type.to_string(),
                network,
                binding_name.to_string(),
                iface.model.clone().unwrap_or_else(|| "<none>".to_string()),
            ])
        })
        .collect()
}

fn vnic_series(spec: Option<&VirtualMachineInstanceSpec>) -> Vec<[String; 5]> {
    let Some(spec) = spec else {
        return Vec::new();
    };
    vnics(
        spec.domain
            .devices
            .interfaces
            .as_deref()
            .unwrap_or_default(),
        spec.networks.as_deref().unwrap_or_default(),
    )
}

/// The `kubevirt_vmi_*` families of these VMIs.
pub fn vmi_families(vmis: &[Arc<VirtualMachineInstance>], cx: &VmiContext) -> Vec<Family> {
    let mut out = Families::new(&VMI_FAMILIES);
    let default = cx.eviction_default.unwrap_or(EvictionStrategy::None);
    for vmi in vmis {
        let status = vmi.status.clone().unwrap_or_default();
        let node = status.node_name.clone().unwrap_or_default();
        let ns = vmi.metadata.namespace.clone().unwrap_or_default();
        let name = vmi.metadata.name.clone().unwrap_or_default();
        let uid = vmi.metadata.uid.as_deref().unwrap_or_default();
        let evictable = evictable(vmi, default);
        let [os, workload, flavor] = system_info(vmi.metadata.annotations.as_ref());
        let g = &status.guest_os_info;
        // KubeVirt's getVMIPod: the Running launcher on the VMI's node.
        let pod = cx
            .launcher_pods
            .get(uid)
            .and_then(|pods| pods.iter().find(|(n, _)| *n == node))
            .map(|(_, p)| p.clone())
            .unwrap_or_default();
        let outdated = vmi
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(OUTDATED_LABEL));
        out.push(
            &VMI_INFO,
            vec![
                node.clone(),
                ns.clone(),
                name.clone(),
                status.phase.as_str().to_ascii_lowercase(),
                os,
                workload,
                flavor,
                vmi_reference(vmi, false),
                vmi_reference(vmi, true),
                g.kernel_release.clone(),
                // KubeVirt's naming: guest_os_machine is the machine type, guest_os_arch
                // the guest agent's `machine`.
                status
                    .machine
                    .as_ref()
                    .and_then(|m| m.type_.clone())
                    .unwrap_or_default(),
                g.machine.clone(),
                g.name.clone(),
                g.version_id.clone(),
                evictable.to_string(),
                outdated.to_string(),
                pod,
            ],
            1.0,
        );
        out.push(
            &VMI_NON_EVICTABLE,
            vec![node.clone(), ns.clone(), name.clone()],
            if evictable { 0.0 } else { 1.0 },
        );
        for vnic in vnic_series(Some(&vmi.spec)) {
            let mut labels = vec![name.clone(), ns.clone()];
            labels.extend(vnic);
            out.push(&VMI_VNIC_INFO, labels, 1.0);
        }
        if let Some(bytes) = cx.launcher_overhead.get(uid) {
            out.push(
                &VMI_LAUNCHER_MEMORY_OVERHEAD,
                vec![ns.clone(), name.clone()],
                *bytes,
            );
        }
        for iface in status.interfaces.iter().flatten() {
            let vnic = iface.name.clone().unwrap_or_default();
            let ifname = iface.interface_name.clone().unwrap_or_default();
            let ip = iface.ip_address.clone().unwrap_or_default();
            let kind = if !ip.is_empty() {
                "ExternalInterface"
            } else if vnic.is_empty() && ifname.is_empty() {
                continue;
            } else {
                "SystemInterface"
            };
            out.push(
                &VMI_ADDRESSES,
                vec![
                    node.clone(),
                    ns.clone(),
                    name.clone(),
                    vnic,
                    ifname,
                    ip,
                    kind.to_string(),
                ],
                1.0,
            );
        }
        if let Some(m) = &status.migration_state {
            let migration = m
                .migration_uid
                .as_ref()
                .and_then(|u| cx.migrations.get(u))
                .cloned()
                .unwrap_or_default();
            if let Some(t) = &m.start_timestamp {
                out.push(
                    &VMI_MIGRATION_START,
                    vec![node.clone(), ns.clone(), name.clone(), migration.clone()],
                    seconds(t),
                );
            }
            if let Some(t) = &m.end_timestamp {
                let result = match (m.completed, m.failed) {
                    (Some(true), Some(true)) => "failed",
                    (Some(true), _) => "succeeded",
                    _ => "",
                };
                out.push(
                    &VMI_MIGRATION_END,
                    vec![node, ns, name, migration, result.to_string()],
                    seconds(t),
                );
            }
        }
    }
    out.finish()
}

/// KubeVirt's `getVMStatusGroup`.
pub fn status_group(status: Option<PrintableStatus>) -> &'static str {
    use PrintableStatus as S;
    match status {
        Some(S::Provisioning | S::Starting | S::WaitingForVolumeBinding) => "starting",
        Some(S::Running) => "running",
        Some(S::Migrating) => "migrating",
        Some(S::Stopped | S::Paused | S::Stopping | S::Terminating) => "non_running",
        Some(
            S::CrashLoopBackOff
            | S::Unknown
            | S::ErrorUnschedulable
            | S::ErrImagePull
            | S::ImagePullBackOff
            | S::ErrorPvcNotFound
            | S::DataVolumeError,
        ) => "error",
        Some(S::WaitingForReceiver) | None => "<unknown>",
    }
}

/// The transition family of a status (KubeVirt's `getMetricDesc`: an unknown status
/// counts as an error).
fn timestamp_family(status: Option<PrintableStatus>) -> &'static Desc {
    match status_group(status) {
        "starting" => &VM_STARTING,
        "running" => &VM_RUNNING,
        "migrating" => &VM_MIGRATING,
        "non_running" => &VM_NON_RUNNING,
        _ => &VM_ERROR,
    }
}

/// Ceiling of a quantity in whole units, 0 when absent or not a quantity (KubeVirt's
/// `Quantity.Value()` rounds up).
fn whole(q: Option<&Quantity>) -> f64 {
    q.and_then(|q| kubevirt_api::quantity::parse(&q.0).ok())
        .map(f64::ceil)
        .unwrap_or(0.0)
}

/// A CPU quantity in cores, to the milli-core rounded up (KubeVirt's
/// `ScaledValue(resource.Milli) / 1000`).
fn cores(q: Option<&Quantity>) -> f64 {
    q.and_then(|q| kubevirt_api::quantity::parse(&q.0).ok())
        .map(|v| (v * 1000.0).ceil() / 1000.0)
        .unwrap_or(0.0)
}

/// KubeVirt's `CollectResourceRequestsAndLimits` of one VM's domain: (family, resource,
/// unit, source — none for limits, value).
fn resources(
    domain: &DomainSpec,
    uses_instancetype: bool,
) -> Vec<(
    &'static Desc,
    &'static str,
    &'static str,
    Option<&'static str>,
    f64,
)> {
    let mut out = Vec::new();
    let res = domain.resources.as_ref();
    let request = |k: &str| res.and_then(|r| r.requests.as_ref()).and_then(|m| m.get(k));
    let limit = |k: &str| res.and_then(|r| r.limits.as_ref()).and_then(|m| m.get(k));
    let mem = whole(request("memory"));
    if mem != 0.0 {
        out.push((
            &VM_RESOURCE_REQUESTS,
            "memory",
            "bytes",
            Some("domain"),
            mem,
        ));
    }
    if let Some(m) = &domain.memory {
        let guest = whole(m.guest.as_ref());
        if guest != 0.0 {
            out.push((
                &VM_RESOURCE_REQUESTS,
                "memory",
                "bytes",
                Some("guest"),
                guest,
            ));
        }
        // KubeVirt reports the page size as the hugepages request.
        if let Some(h) = &m.hugepages
            && let Ok(size) = kubevirt_api::quantity::parse(&h.page_size)
        {
            out.push((
                &VM_RESOURCE_REQUESTS,
                "memory",
                "bytes",
                Some("hugepages"),
                size.ceil(),
            ));
        }
    }
    let mem_limit = whole(limit("memory"));
    if mem_limit != 0.0 {
        out.push((&VM_RESOURCE_LIMITS, "memory", "bytes", None, mem_limit));
    }
    if let Some(cpu) = &domain.cpu {
        for (unit, n) in [
            ("cores", cpu.cores),
            ("threads", cpu.threads),
            ("sockets", cpu.sockets),
        ] {
            if let Some(n) = n.filter(|n| *n != 0) {
                out.push((
                    &VM_RESOURCE_REQUESTS,
                    "cpu",
                    unit,
                    Some("domain"),
                    f64::from(n),
                ));
            }
        }
    }
    let cpu_request = cores(request("cpu"));
    if cpu_request != 0.0 {
        out.push((
            &VM_RESOURCE_REQUESTS,
            "cpu",
            "cores",
            Some("requests"),
            cpu_request,
        ));
    } else if domain.cpu.is_none() && !uses_instancetype {
        // KubeVirt: a VMI without CPU topology nor request gets one core, thread and
        // socket. (With an instance type KubeVirt reports the topology it gives, which
        // we do not see: no default series rather than a wrong one.)
        for unit in ["cores", "threads", "sockets"] {
            out.push((&VM_RESOURCE_REQUESTS, "cpu", unit, Some("default"), 1.0));
        }
    }
    let cpu_limit = cores(limit("cpu"));
    if cpu_limit != 0.0 {
        out.push((&VM_RESOURCE_LIMITS, "cpu", "cores", None, cpu_limit));
    }
    out
}

/// KubeVirt's `getLastConditionDetails`: the latest transition of the `Ready`, `Failure`
/// and `Paused` conditions, -1 when none has one.
fn last_transition(vm: &VirtualMachine) -> f64 {
    vm.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| matches!(c.type_.as_str(), "Ready" | "Failure" | "Paused"))
        .filter_map(|c| c.last_transition_time.as_ref().map(seconds))
        .fold(-1.0, f64::max)
}

/// KubeVirt's `getPVCAndDiskName`: the claim behind a volume (a DataVolume's claim has its
/// name), and whether it is a DataVolume's.
fn claim_of(v: &Volume) -> Option<(&str, bool)> {
    if let Some(c) = &v.persistent_volume_claim {
        Some((c.claim_name.as_str(), false))
    } else {
        v.data_volume.as_ref().map(|d| (d.name.as_str(), true))
    }
}

/// The storage request of the VM's `dataVolumeTemplates` entry `name` (KubeVirt's
/// `getSizeFromDataVolumeTemplates`: `pvc`, else `storage`).
fn template_size(vm: &VirtualMachine, name: &str) -> Option<Quantity> {
    let t = vm
        .spec
        .data_volume_templates
        .iter()
        .flatten()
        .find(|t| t.metadata.name.as_deref() == Some(name))?;
    let requests = match (&t.spec.pvc, &t.spec.storage) {
        (Some(pvc), _) => pvc.resources.as_ref()?.requests.as_ref()?,
        (None, Some(storage)) => storage.resources.as_ref()?.requests.as_ref()?,
        (None, None) => return None,
    };
    requests.get("storage").cloned()
}

/// KubeVirt's `CollectDiskAllocatedSize` of one VM: per volume on a claim that exists,
/// (claim, volume mode, volume name, bytes): a DataVolume's from its template when the VM
/// has one, else the claim's request.
fn disk_sizes(
    vm: &VirtualMachine,
    claims: &HashMap<(&str, &str), &PersistentVolumeClaim>,
) -> Vec<(String, String, String, f64)> {
    let ns = vm.metadata.namespace.as_deref().unwrap_or_default();
    let volumes = vm
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_deref())
        .unwrap_or_default();
    volumes
        .iter()
        .filter_map(|v| {
            let (claim, is_dv) = claim_of(v)?;
            let pvc = claims.get(&(ns, claim))?;
            let spec = pvc.spec.as_ref();
            let size = is_dv
                .then(|| template_size(vm, claim))
                .flatten()
                .or_else(|| {
                    spec.and_then(|s| s.resources.as_ref())
                        .and_then(|r| r.requests.as_ref())
                        .and_then(|r| r.get("storage"))
                        .cloned()
                });
            let mode = spec.and_then(|s| s.volume_mode.clone()).unwrap_or_default();
            Some((
                claim.to_string(),
                mode,
                v.name.clone(),
                whole(size.as_ref()),
            ))
        })
        .collect()
}

/// The `kubevirt_vm_*` families of these VMs; `claims` are the cluster's
/// PersistentVolumeClaims (for `kubevirt_vm_disk_allocated_size_bytes`).
pub fn vm_families(
    vms: &[Arc<VirtualMachine>],
    claims: &[Arc<PersistentVolumeClaim>],
) -> Vec<Family> {
    let claims: HashMap<(&str, &str), &PersistentVolumeClaim> = claims
        .iter()
        .filter_map(|c| {
            Some((
                (
                    c.metadata.namespace.as_deref()?,
                    c.metadata.name.as_deref()?,
                ),
                c.as_ref(),
            ))
        })
        .collect();
    let mut out = Families::new(&VM_FAMILIES);
    let default_domain = DomainSpec::default();
    for vm in vms {
        let ns = vm.metadata.namespace.clone().unwrap_or_default();
        let name = vm.metadata.name.clone().unwrap_or_default();
        let template = &vm.spec.template;
        let domain = template
            .spec
            .as_ref()
            .map(|s| &s.domain)
            .unwrap_or(&default_domain);
        let status = vm.status.as_ref().and_then(|s| s.printable_status);

        // KubeVirt's reportVmStats: all five, the current status's the last transition.
        let current = timestamp_family(status);
        let last = last_transition(vm);
        for desc in TIMESTAMPS {
            let value = if desc.name == current.name { last } else { 0.0 };
            out.push(desc, vec![name.clone(), ns.clone()], value);
        }

        for (desc, resource, unit, source, value) in
            resources(domain, vm.spec.instancetype.is_some())
        {
            let mut labels = vec![
                name.clone(),
                ns.clone(),
                resource.to_string(),
                unit.to_string(),
            ];
            labels.extend(source.map(str::to_string));
            out.push(desc, labels, value);
        }

        let [os, workload, flavor] = system_info(
            template
                .metadata
                .as_ref()
                .and_then(|m| m.annotations.as_ref()),
        );
        out.push(
            &VM_INFO,
            vec![
                name.clone(),
                ns.clone(),
                os,
                workload,
                flavor,
                domain
                    .machine
                    .as_ref()
                    .and_then(|m| m.type_.clone())
                    .unwrap_or_default(),
                vm_reference(vm.spec.instancetype.as_ref(), false),
                vm_reference(vm.spec.preference.as_ref(), true),
                status
                    .map(|s| s.as_str().to_ascii_lowercase())
                    .unwrap_or_default(),
                status_group(status).to_string(),
            ],
            1.0,
        );
        if let Some(t) = &vm.metadata.creation_timestamp {
            out.push(&VM_CREATE_DATE, vec![name.clone(), ns.clone()], seconds(t));
        }
        for (claim, mode, device, bytes) in disk_sizes(vm, &claims) {
            out.push(
                &VM_DISK_ALLOCATED_SIZE,
                vec![name.clone(), ns.clone(), claim, mode, device],
                bytes,
            );
        }
        for vnic in vnic_series(template.spec.as_ref()) {
            let mut labels = vec![name.clone(), ns.clone()];
            labels.extend(vnic);
            out.push(&VM_VNIC_INFO, labels, 1.0);
        }
    }
    out.finish()
}

/// KubeVirt's migration inventory (`reportMigrationStats`): how many migrations are in each
/// phase before the switch-over (the four counts always, zeros included; the phases between
/// Scheduled and Running count as running), and one series per finished migration, its
/// outcome.
pub fn migration_families(migrations: &[Arc<VirtualMachineInstanceMigration>]) -> Vec<Family> {
    use kubevirt_api::migration::VirtualMachineInstanceMigrationPhase as Phase;
    let mut out = Families::new(&MIGRATION_FAMILIES);
    let (mut pending, mut scheduling, mut unset, mut running) = (0.0, 0.0, 0.0, 0.0);
    for m in migrations {
        let phase = m.status.as_ref().map(|s| s.phase).unwrap_or_default();
        let finished = |desc| {
            (
                desc,
                vec![
                    m.spec.vmi_name.clone(),
                    m.metadata.name.clone().unwrap_or_default(),
                    m.metadata.namespace.clone().unwrap_or_default(),
                ],
            )
        };
        let series = match phase {
            Phase::Pending => {
                pending += 1.0;
                None
            }
            Phase::Scheduling => {
                scheduling += 1.0;
                None
            }
            Phase::Unset => {
                unset += 1.0;
                None
            }
            Phase::Scheduled | Phase::PreparingTarget | Phase::TargetReady | Phase::Running => {
                running += 1.0;
                None
            }
            Phase::Succeeded => Some(finished(&MIGRATION_SUCCEEDED)),
            Phase::Failed => Some(finished(&MIGRATION_FAILED)),
        };
        if let Some((desc, labels)) = series {
            out.push(desc, labels, 1.0);
        }
    }
    for (desc, n) in [
        (&MIGRATIONS_PENDING, pending),
        (&MIGRATIONS_SCHEDULING, scheduling),
        (&MIGRATIONS_UNSET, unset),
        (&MIGRATIONS_RUNNING, running),
    ] {
        out.push(desc, Vec::new(), n);
    }
    out.finish()
}

#[cfg(test)]
#[path = "cluster_tests.rs"]
mod tests;
