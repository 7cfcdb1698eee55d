//! `instancetype.kubevirt.io/v1beta1`: instance types (the guest's size: vCPUs, memory and
//! what goes with them, which a VM cannot override) and preferences (defaults a VM's own
//! values win over), namespaced and cluster-wide, with KubeVirt's schema so its
//! common-instancetypes bundle and users' YAML apply unchanged.
//!
//! Fields kubevirt-rs's VMI does not model yet (NUMA, realtime, GPUs, host devices, launch
//! security, Hyper-V, timers, TPM) are kept as objects of their own (`Opaque`): stored and
//! served as written, not applied to a VMI.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use serde_with::skip_serializing_none;

use crate::vmi::{DiskBus, Efi, FeatureState, Hugepages, Rng};

pub mod apply;
pub mod reference;
pub mod revision;
pub mod vm;

/// API group of instance types and preferences.
pub const GROUP: &str = "instancetype.kubevirt.io";
/// The version served.
pub const VERSION: &str = "v1beta1";
/// `apiVersion` of instance types and preferences.
pub const API_VERSION: &str = "instancetype.kubevirt.io/v1beta1";

/// A KubeVirt object of a type kubevirt-rs does not model: kept as written.
pub type Opaque = BTreeMap<String, Value>;

macro_rules! kind {
    ($(#[$doc:meta])* $name:ident, $spec:ty, $plural:literal, $scope:ty) => {
        $(#[$doc])*
        #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
        #[serde(rename_all = "camelCase")]
        pub struct $name {
            /// `instancetype.kubevirt.io/v1beta1`.
            #[serde(default)]
            pub api_version: String,
            /// The kind's name.
            #[serde(default)]
            pub kind: String,
            /// Standard object metadata.
            #[serde(default)]
            pub metadata: ObjectMeta,
            /// What the kind holds.
            pub spec: $spec,
        }

        impl kube::Resource for $name {
            type DynamicType = ();
            type Scope = $scope;

            fn kind(_: &()) -> std::borrow::Cow<'_, str> {
                stringify!($name).into()
            }
            fn group(_: &()) -> std::borrow::Cow<'_, str> {
                GROUP.into()
            }
            fn version(_: &()) -> std::borrow::Cow<'_, str> {
                VERSION.into()
            }
            fn plural(_: &()) -> std::borrow::Cow<'_, str> {
                $plural.into()
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

kind!(
    /// A namespaced instance type.
    VirtualMachineInstancetype,
    VirtualMachineInstancetypeSpec,
    "virtualmachineinstancetypes",
    k8s_openapi::NamespaceResourceScope
);
kind!(
    /// A cluster-wide instance type.
    VirtualMachineClusterInstancetype,
    VirtualMachineInstancetypeSpec,
    "virtualmachineclusterinstancetypes",
    k8s_openapi::ClusterResourceScope
);
kind!(
    /// A namespaced preference.
    VirtualMachinePreference,
    VirtualMachinePreferenceSpec,
    "virtualmachinepreferences",
    k8s_openapi::NamespaceResourceScope
);
kind!(
    /// A cluster-wide preference.
    VirtualMachineClusterPreference,
    VirtualMachinePreferenceSpec,
    "virtualmachineclusterpreferences",
    k8s_openapi::ClusterResourceScope
);

/// The guest's size and what comes with it. A VM using an instance type cannot set these
/// fields itself: the VM is refused naming each one it sets.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstancetypeSpec {
    /// Node labels the launcher pod must match.
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Scheduler that places the launcher pod.
    pub scheduler_name: Option<String>,
    /// The guest's vCPUs and CPU settings.
    pub cpu: CpuInstancetype,
    /// The guest's memory.
    pub memory: MemoryInstancetype,
    /// GPUs passed to the guest.
    pub gpus: Option<Vec<Opaque>>,
    /// Host devices passed to the guest.
    pub host_devices: Option<Vec<Opaque>>,
    /// `shared` or `auto` I/O thread allocation.
    pub io_threads_policy: Option<String>,
    /// Launch security (AMD SEV).
    pub launch_security: Option<Opaque>,
    /// Annotations added to the VMI.
    pub annotations: Option<BTreeMap<String, String>>,
}

/// The guest's vCPUs.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CpuInstancetype {
    /// Number of vCPUs, laid out as sockets, cores or threads as the preference says
    /// (sockets by default).
    pub guest: u32,
    /// CPU model: `host-model`, `host-passthrough` or a named model.
    pub model: Option<String>,
    /// Pin vCPUs to dedicated host CPUs.
    #[serde(rename = "dedicatedCPUPlacement")]
    pub dedicated_cpu_placement: Option<bool>,
    /// Guest NUMA topology.
    pub numa: Option<Opaque>,
    /// Run the emulator thread on its own dedicated host CPU.
    pub isolate_emulator_thread: Option<bool>,
    /// Realtime vCPUs.
    pub realtime: Option<Opaque>,
    /// Maximum sockets for CPU hotplug.
    pub max_sockets: Option<u32>,
}

/// The guest's memory.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MemoryInstancetype {
    /// Memory the guest sees.
    pub guest: Quantity,
    /// Back guest memory with huge pages.
    pub hugepages: Option<Hugepages>,
    /// Percent of the guest memory not requested for the launcher pod (0-100).
    pub overcommit_percent: Option<i32>,
    /// Maximum guest memory for memory hotplug.
    pub max_guest: Option<Quantity>,
}

/// Defaults for a VM: each fills only what the VM leaves unset.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachinePreferenceSpec {
    /// Guest clock.
    pub clock: Option<ClockPreferences>,
    /// vCPU layout.
    pub cpu: Option<CpuPreferences>,
    /// Devices.
    pub devices: Option<DevicePreferences>,
    /// Hypervisor features.
    pub features: Option<FeaturePreferences>,
    /// Firmware.
    pub firmware: Option<FirmwarePreferences>,
    /// Machine type.
    pub machine: Option<MachinePreferences>,
    /// Volumes.
    pub volumes: Option<VolumePreferences>,
    /// Subdomain of the guest's FQDN.
    pub preferred_subdomain: Option<String>,
    /// Seconds the guest gets to shut down.
    pub preferred_termination_grace_period_seconds: Option<i64>,
    /// What a VM (or its instance type) must provide for this preference.
    pub requirements: Option<PreferenceRequirements>,
    /// Annotations added to the VMI (the VM's own win).
    pub annotations: Option<BTreeMap<String, String>>,
    /// Deprecated: `cpu.spreadOptions.ratio`.
    pub prefer_spread_socket_to_core_ratio: Option<u32>,
}

/// Where volumes are provisioned.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumePreferences {
    /// StorageClass of the VM's new volumes.
    pub preferred_storage_class_name: Option<String>,
}

/// How the instance type's vCPUs are laid out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum PreferredCpuTopology {
    /// All vCPUs as sockets (the default).
    #[default]
    #[serde(rename = "sockets")]
    Sockets,
    /// All vCPUs as cores of one socket.
    #[serde(rename = "cores")]
    Cores,
    /// All vCPUs as threads of one core.
    #[serde(rename = "threads")]
    Threads,
    /// Spread over sockets, cores (and threads) by `spreadOptions`.
    #[serde(rename = "spread")]
    Spread,
    /// Any layout (as sockets).
    #[serde(rename = "any")]
    Any,
    /// Deprecated spelling of `sockets`.
    #[serde(rename = "preferSockets")]
    PreferSockets,
    /// Deprecated spelling of `cores`.
    #[serde(rename = "preferCores")]
    PreferCores,
    /// Deprecated spelling of `threads`.
    #[serde(rename = "preferThreads")]
    PreferThreads,
    /// Deprecated spelling of `spread`.
    #[serde(rename = "preferSpread")]
    PreferSpread,
    /// Deprecated spelling of `any`.
    #[serde(rename = "preferAny")]
    PreferAny,
}

impl PreferredCpuTopology {
    /// The topology without its deprecated spellings.
    pub fn canonical(self) -> Self {
        match self {
            Self::PreferSockets => Self::Sockets,
            Self::PreferCores => Self::Cores,
            Self::PreferThreads => Self::Threads,
            Self::PreferSpread => Self::Spread,
            Self::PreferAny => Self::Any,
            other => other,
        }
    }
}

/// vCPU layout preferences.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CpuPreferences {
    /// How the instance type's vCPUs are laid out.
    #[serde(rename = "preferredCPUTopology")]
    pub preferred_cpu_topology: Option<PreferredCpuTopology>,
    /// How `spread` lays them out.
    pub spread_options: Option<SpreadOptions>,
    /// CPU features to enable.
    #[serde(rename = "preferredCPUFeatures")]
    pub preferred_cpu_features: Option<Vec<Opaque>>,
}

/// What `spread` spreads across.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum SpreadAcross {
    /// Sockets and cores (the default): `ratio` cores per socket.
    #[default]
    SocketsCores,
    /// Cores and threads: `ratio` threads per core.
    CoresThreads,
    /// Sockets, cores and two threads per core: `ratio` cores per socket.
    SocketsCoresThreads,
}

/// Options of the `spread` topology.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SpreadOptions {
    /// What to spread across.
    pub across: Option<SpreadAcross>,
    /// Cores per socket or threads per core (default 2).
    pub ratio: Option<u32>,
}

/// Device preferences.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DevicePreferences {
    /// Attach a VNC graphics device.
    pub preferred_autoattach_graphics_device: Option<bool>,
    /// Attach a memory balloon.
    pub preferred_autoattach_mem_balloon: Option<bool>,
    /// Attach an interface to the pod network when none is listed.
    pub preferred_autoattach_pod_interface: Option<bool>,
    /// Attach a serial console.
    pub preferred_autoattach_serial_console: Option<bool>,
    /// Attach an input device.
    pub preferred_autoattach_input_device: Option<bool>,
    /// Disable hotplug.
    pub preferred_disable_hotplug: Option<bool>,
    /// vGPU options.
    #[serde(rename = "preferredVirtualGPUOptions")]
    pub preferred_virtual_gpu_options: Option<Opaque>,
    /// Sound device model.
    pub preferred_sound_model: Option<String>,
    /// Use virtio-transitional devices.
    pub preferred_use_virtio_transitional: Option<bool>,
    /// Bus of input devices.
    pub preferred_input_bus: Option<String>,
    /// Type of input devices.
    pub preferred_input_type: Option<String>,
    /// Bus of disks.
    pub preferred_disk_bus: Option<DiskBus>,
    /// Bus of LUNs.
    pub preferred_lun_bus: Option<DiskBus>,
    /// Bus of CD-ROMs.
    pub preferred_cdrom_bus: Option<DiskBus>,
    /// Give virtio disks their own I/O thread.
    pub preferred_disk_dedicated_io_thread: Option<bool>,
    /// Host cache mode of disks.
    pub preferred_disk_cache: Option<crate::vmi::DiskCache>,
    /// I/O mode of disks.
    #[serde(rename = "preferredDiskIO")]
    pub preferred_disk_io: Option<String>,
    /// Block sizes of disks.
    pub preferred_disk_block_size: Option<Opaque>,
    /// NIC model of interfaces.
    pub preferred_interface_model: Option<String>,
    /// A virtio RNG device.
    pub preferred_rng: Option<Rng>,
    /// Multi-queue virtio-blk.
    pub preferred_block_multi_queue: Option<bool>,
    /// Multi-queue virtio-net.
    pub preferred_network_interface_multi_queue: Option<bool>,
    /// A TPM device.
    #[serde(rename = "preferredTPM")]
    pub preferred_tpm: Option<Opaque>,
    /// Masquerade binding for pod-network interfaces without one.
    pub preferred_interface_masquerade: Option<crate::vmi::InterfaceBinding>,
    /// Model of panic devices.
    pub preferred_panic_device_model: Option<crate::vmi::PanicDeviceModel>,
}

/// Hypervisor feature preferences.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FeaturePreferences {
    /// ACPI.
    pub preferred_acpi: Option<FeatureState>,
    /// APIC.
    pub preferred_apic: Option<FeatureState>,
    /// Hyper-V enlightenments.
    pub preferred_hyperv: Option<Opaque>,
    /// KVM features.
    pub preferred_kvm: Option<Opaque>,
    /// Paravirtual spinlocks.
    pub preferred_pvspinlock: Option<FeatureState>,
    /// System management mode.
    pub preferred_smm: Option<FeatureState>,
}

/// Firmware preferences.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FirmwarePreferences {
    /// Boot with BIOS.
    pub preferred_use_bios: Option<bool>,
    /// BIOS output on the serial console.
    pub preferred_use_bios_serial: Option<bool>,
    /// Deprecated: `preferredEfi`.
    pub preferred_use_efi: Option<bool>,
    /// Deprecated: `preferredEfi.secureBoot`.
    pub preferred_use_secure_boot: Option<bool>,
    /// Boot with this EFI configuration.
    pub preferred_efi: Option<Efi>,
}

/// Machine preferences.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachinePreferences {
    /// QEMU machine type.
    pub preferred_machine_type: Option<String>,
}

/// Clock preferences.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClockPreferences {
    /// Clock offset: `utc` (with `offsetSeconds`) or `timezone`.
    pub preferred_clock_offset: Option<Opaque>,
    /// Timers.
    pub preferred_timer: Option<Opaque>,
}

/// What a VM needs for a preference.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreferenceRequirements {
    /// Minimum vCPUs.
    pub cpu: Option<CpuRequirement>,
    /// Minimum guest memory.
    pub memory: Option<MemoryRequirement>,
}

/// Minimum vCPUs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CpuRequirement {
    /// vCPUs.
    pub guest: u32,
}

/// Minimum guest memory.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MemoryRequirement {
    /// Memory.
    pub guest: Quantity,
}
