//! VirtualMachineInstance: one running (or about to run) virtual machine.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, PodDNSConfig, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use crate::common::{Condition, LocalObjectReference};
use crate::migration::VirtualMachineInstanceMigrationState;

/// Specification of a virtual machine instance: the guest's hardware, its volumes and
/// networks, and where it may be scheduled.
#[skip_serializing_none]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kubevirt.io",
    version = "v1",
    kind = "VirtualMachineInstance",
    plural = "virtualmachineinstances",
    singular = "virtualmachineinstance",
    shortname = "vmi",
    shortname = "vmis",
    category = "all",
    namespaced,
    status = "VirtualMachineInstanceStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceSpec {
    /// The guest's virtual hardware.
    #[serde(default)]
    pub domain: DomainSpec,
    /// Node labels the launcher pod must match.
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Scheduling constraints of the launcher pod.
    pub affinity: Option<Affinity>,
    /// Tolerations of the launcher pod.
    pub tolerations: Option<Vec<Toleration>>,
    /// Scheduler that places the launcher pod.
    pub scheduler_name: Option<String>,
    /// Priority class of the launcher pod.
    pub priority_class_name: Option<String>,
    /// What happens to the VMI when its launcher pod is evicted (a node drain): `LiveMigrate`, `LiveMigrateIfPossible`, `External`, `None`; unset takes the cluster's default (the KubeVirt resource's `configuration.evictionStrategy`).
    pub eviction_strategy: Option<crate::eviction::EvictionStrategy>,
    /// Seconds the guest gets to shut down after an ACPI power-button press before it is destroyed.
    pub termination_grace_period_seconds: Option<i64>,
    /// Volumes that can be attached to the guest as disks.
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub volumes: Option<Vec<Volume>>,
    /// Networks the guest's interfaces connect to.
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub networks: Option<Vec<Network>>,
    /// Hostname of the guest (defaults to the VMI name).
    pub hostname: Option<String>,
    /// Subdomain of the guest's FQDN.
    pub subdomain: Option<String>,
    /// DNS policy of the launcher pod.
    pub dns_policy: Option<String>,
    /// DNS settings of the launcher pod.
    #[serde(rename = "dnsConfig")]
    pub dns_config: Option<PodDNSConfig>,
    /// `Paused` starts the guest paused.
    pub start_strategy: Option<StartStrategy>,
    /// CPU architecture of the guest (defaults to the node's).
    pub architecture: Option<String>,
    /// SSH keys and passwords from Secrets, put into the guest by cloud-init (at boot) or
    /// by the guest agent (live, as the Secret changes).
    pub access_credentials: Option<Vec<AccessCredential>>,
    /// Whether the guest is ready for traffic: the VMI's `Ready` condition follows it.
    pub readiness_probe: Option<Probe>,
    /// Whether the guest is alive: a guest that fails it is stopped (the VMI fails).
    pub liveness_probe: Option<Probe>,
}

/// A probe of the guest (KubeVirt's `Probe`): one handler and Kubernetes' timing.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Probe {
    /// Run a command in the guest through the guest agent; exit 0 is success.
    pub exec: Option<k8s_openapi::api::core::v1::ExecAction>,
    /// The guest agent answers `guest-ping`.
    pub guest_agent_ping: Option<Empty>,
    /// An HTTP GET to the guest (KubeVirt puts it on the launcher pod).
    pub http_get: Option<k8s_openapi::api::core::v1::HTTPGetAction>,
    /// A TCP connection to the guest (KubeVirt puts it on the launcher pod).
    pub tcp_socket: Option<k8s_openapi::api::core::v1::TCPSocketAction>,
    /// Seconds after the guest starts before the first probe.
    pub initial_delay_seconds: Option<i32>,
    /// Seconds one probe may take (default 1).
    pub timeout_seconds: Option<i32>,
    /// Seconds between probes (default 10).
    pub period_seconds: Option<i32>,
    /// Successes in a row that make a failed probe pass again (default 1).
    pub success_threshold: Option<i32>,
    /// Failures in a row that make the probe fail (default 3).
    pub failure_threshold: Option<i32>,
}

/// One credential of `spec.accessCredentials`: SSH keys or passwords from a Secret.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AccessCredential {
    /// SSH public keys (each value of the Secret, one key per line).
    pub ssh_public_key: Option<SshPublicKeyAccessCredential>,
    /// Passwords (each key of the Secret a user name, its value the password).
    pub user_password: Option<UserPasswordAccessCredential>,
}

/// Where SSH public keys come from and how they reach the guest.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SshPublicKeyAccessCredential {
    /// The Secret holding the keys.
    #[serde(default)]
    pub source: AccessCredentialSource,
    /// How the keys reach the guest.
    #[serde(default)]
    pub propagation_method: SshPublicKeyPropagation,
}

/// How SSH keys reach the guest: exactly one of the three.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SshPublicKeyPropagation {
    /// In the ConfigDrive metadata (`public_keys`), at boot.
    pub config_drive: Option<Empty>,
    /// In the NoCloud metadata (`public-keys`), at boot.
    pub no_cloud: Option<Empty>,
    /// Through the guest agent into each user's `authorized_keys`, live.
    pub qemu_guest_agent: Option<QemuGuestAgentSshPropagation>,
}

/// The users whose `authorized_keys` get the keys.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QemuGuestAgentSshPropagation {
    /// Guest users.
    #[serde(default)]
    pub users: Vec<String>,
}

/// Where passwords come from and how they reach the guest.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UserPasswordAccessCredential {
    /// The Secret holding the passwords.
    #[serde(default)]
    pub source: AccessCredentialSource,
    /// How the passwords reach the guest (the guest agent only).
    #[serde(default)]
    pub propagation_method: UserPasswordPropagation,
}

/// How passwords reach the guest.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UserPasswordPropagation {
    /// Through the guest agent (`guest-set-user-password`), live.
    pub qemu_guest_agent: Option<Empty>,
}

/// The source of a credential.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AccessCredentialSource {
    /// A Secret of the VMI's namespace.
    pub secret: Option<AccessCredentialSecretSource>,
}

/// A Secret, by name.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AccessCredentialSecretSource {
    /// Name of the Secret.
    #[serde(default)]
    pub secret_name: String,
}

/// An empty object (`{}`), as KubeVirt marks a choice.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Empty {}

impl AccessCredential {
    /// The Secret this credential reads, if named.
    pub fn secret_name(&self) -> Option<&str> {
        let source = match (&self.ssh_public_key, &self.user_password) {
            (Some(k), _) => &k.source,
            (None, Some(p)) => &p.source,
            (None, None) => return None,
        };
        source
            .secret
            .as_ref()
            .map(|s| s.secret_name.as_str())
            .filter(|n| !n.is_empty())
    }
}

/// How the guest starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum StartStrategy {
    /// The guest is created paused and waits for an unpause.
    Paused,
}

/// The guest's virtual hardware.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DomainSpec {
    /// Compute resources of the launcher pod (memory request defaults the guest memory).
    pub resources: Option<ResourceRequirements>,
    /// CPU topology and model.
    pub cpu: Option<Cpu>,
    /// Guest memory.
    pub memory: Option<Memory>,
    /// Machine type.
    pub machine: Option<Machine>,
    /// Firmware: BIOS/EFI, direct kernel boot, SMBIOS serial and UUID.
    pub firmware: Option<Firmware>,
    /// Guest clock.
    pub clock: Option<Clock>,
    /// Hypervisor features.
    pub features: Option<Features>,
    /// Disks, interfaces and other devices.
    #[serde(default)]
    pub devices: Devices,
    /// `shared` or `auto` I/O thread allocation.
    pub io_threads_policy: Option<String>,
}

/// Compute resources of the VMI.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceRequirements {
    /// Requested resources (`cpu`, `memory`).
    pub requests: Option<BTreeMap<String, Quantity>>,
    /// Resource limits (`cpu`, `memory`).
    pub limits: Option<BTreeMap<String, Quantity>>,
    /// Do not add the virtualization overhead to the pod's memory request.
    pub overcommit_guest_overhead: Option<bool>,
}

/// CPU topology and model.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Cpu {
    /// Cores per socket (default 1).
    pub cores: Option<u32>,
    /// Sockets (default 1).
    pub sockets: Option<u32>,
    /// Threads per core (default 1).
    pub threads: Option<u32>,
    /// Maximum sockets for CPU hotplug.
    pub max_sockets: Option<u32>,
    /// CPU model: `host-model`, `host-passthrough` or a named model.
    pub model: Option<String>,
    /// Pin vCPUs to dedicated host CPUs.
    pub dedicated_cpu_placement: Option<bool>,
}

/// Guest memory.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Memory {
    /// Memory the guest sees (defaults to `resources.requests.memory`).
    pub guest: Option<Quantity>,
    /// Maximum guest memory for memory hotplug.
    pub max_guest: Option<Quantity>,
    /// Back guest memory with huge pages.
    pub hugepages: Option<Hugepages>,
}

/// Huge page backing.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Hugepages {
    /// Page size, e.g. `2Mi` or `1Gi`.
    #[serde(default)]
    pub page_size: String,
}

/// Machine type.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Machine {
    /// QEMU machine type, e.g. `q35`.
    #[serde(rename = "type")]
    pub type_: Option<String>,
}

/// Firmware settings.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Firmware {
    /// SMBIOS system UUID (defaults to a UUID derived from the VMI name).
    pub uuid: Option<String>,
    /// SMBIOS serial number.
    pub serial: Option<String>,
    /// BIOS or EFI.
    pub bootloader: Option<Bootloader>,
    /// Boot a kernel and initrd taken from a container image, without a bootloader.
    pub kernel_boot: Option<KernelBoot>,
}

/// Bootloader choice.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Bootloader {
    /// Legacy BIOS (SeaBIOS).
    pub bios: Option<Bios>,
    /// UEFI (OVMF).
    pub efi: Option<Efi>,
}

/// Legacy BIOS settings.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Bios {
    /// Also print BIOS output on the serial console.
    pub use_serial: Option<bool>,
}

/// UEFI settings.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Efi {
    /// Enable Secure Boot.
    pub secure_boot: Option<bool>,
    /// Keep EFI variables across restarts.
    pub persistent: Option<bool>,
}

/// Direct kernel boot.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KernelBoot {
    /// Kernel command line.
    pub kernel_args: Option<String>,
    /// The container image holding the kernel and initrd.
    pub container: Option<KernelBootContainer>,
}

/// Where the kernel and initrd come from.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KernelBootContainer {
    /// Container image reference.
    #[serde(default)]
    pub image: String,
    /// Secret with registry credentials.
    pub image_pull_secret: Option<String>,
    /// `Always`, `IfNotPresent` or `Never`.
    pub image_pull_policy: Option<String>,
    /// Path of the kernel inside the image.
    pub kernel_path: Option<String>,
    /// Path of the initrd inside the image.
    pub initrd_path: Option<String>,
}

/// Guest clock.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Clock {
    /// Guest clock in UTC, with an optional offset.
    pub utc: Option<ClockOffsetUtc>,
    /// Guest clock in the given time zone.
    pub timezone: Option<String>,
}

/// UTC clock offset.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClockOffsetUtc {
    /// Offset from UTC in seconds.
    pub offset_seconds: Option<i64>,
}

/// Hypervisor features.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Features {
    /// ACPI (enabled by default; needed for graceful shutdown).
    pub acpi: Option<FeatureState>,
    /// APIC.
    pub apic: Option<FeatureState>,
    /// System management mode (needed by Secure Boot).
    pub smm: Option<FeatureState>,
}

/// A feature that can be switched on or off.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FeatureState {
    /// Whether the feature is on (default true when the feature is listed).
    pub enabled: Option<bool>,
}

/// Devices of the guest.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Devices {
    /// Disks, CD-ROMs and LUNs, each backed by a volume of the same name.
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub disks: Option<Vec<Disk>>,
    /// Network interfaces, each connected to a network of the same name.
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub interfaces: Option<Vec<Interface>>,
    /// Attach a serial console (default true).
    pub autoattach_serial_console: Option<bool>,
    /// Attach a VNC graphics device (default true).
    pub autoattach_graphics_device: Option<bool>,
    /// Attach an interface to the pod network when none is listed (default true).
    pub autoattach_pod_interface: Option<bool>,
    /// Attach a memory balloon (default true).
    pub autoattach_mem_balloon: Option<bool>,
    /// Write the serial console to the launcher's log as well.
    pub log_serial_console: Option<bool>,
    /// Attach a virtio RNG device.
    pub rng: Option<Rng>,
    /// Multi-queue virtio-net.
    pub network_interface_multiqueue: Option<bool>,
    /// Multi-queue virtio-blk.
    pub block_multi_queue: Option<bool>,
    /// Panic notifiers: a guest kernel panic stops the guest and fails the VMI instead of
    /// going unnoticed (KubeVirt's `panicDevices`).
    pub panic_devices: Option<Vec<PanicDevice>>,
}

/// A device through which the guest reports a kernel panic to the host.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PanicDevice {
    /// The device model (default `isa`).
    pub model: Option<PanicDeviceModel>,
}

/// Model of a panic device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PanicDeviceModel {
    /// QEMU's pvpanic on the ISA bus (I/O port 0x505).
    #[default]
    Isa,
    /// Hyper-V's crash MSRs (Windows guests).
    Hyperv,
    /// QEMU's pvpanic as a PCI device.
    Pvpanic,
}

/// A virtio random number generator.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Rng {}

/// A disk device attached to the guest.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Disk {
    /// Name of the disk; must match a volume.
    #[serde(default)]
    pub name: String,
    /// Attach as a disk (the default when none of disk/cdrom/lun is given).
    pub disk: Option<DiskTarget>,
    /// Attach as a CD-ROM.
    pub cdrom: Option<CdRomTarget>,
    /// Attach as a SCSI LUN.
    pub lun: Option<LunTarget>,
    /// Boot order; lower boots first. Disks without one are not bootable.
    pub boot_order: Option<u32>,
    /// Serial number the guest sees.
    pub serial: Option<String>,
    /// Host cache mode: `none`, `writethrough`, `writeback`.
    pub cache: Option<DiskCache>,
    /// I/O mode: `native` or `threads`.
    pub io: Option<String>,
    /// Give this disk its own I/O thread.
    pub dedicated_io_thread: Option<bool>,
    /// Allow several VMs to attach this disk.
    pub shareable: Option<bool>,
    /// What to do on an I/O error: `stop`, `ignore`, `report`, `enospace`.
    pub error_policy: Option<String>,
}

/// Host cache mode of a disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DiskCache {
    /// O_DIRECT, no host page cache.
    None,
    /// Host page cache, writes go through.
    Writethrough,
    /// Host page cache, writes are cached.
    Writeback,
}

/// Bus a disk attaches to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DiskBus {
    /// Paravirtualised virtio-blk (default).
    #[default]
    Virtio,
    /// SATA (AHCI).
    Sata,
    /// SCSI (virtio-scsi).
    Scsi,
    /// USB mass storage.
    Usb,
}

/// Options of a plain disk.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiskTarget {
    /// Bus (default `virtio`).
    pub bus: Option<DiskBus>,
    /// Attach read-only.
    pub readonly: Option<bool>,
    /// PCI address of the device.
    pub pci_address: Option<String>,
}

/// Options of a CD-ROM.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CdRomTarget {
    /// Bus (default `sata`).
    pub bus: Option<DiskBus>,
    /// Read-only (always true for CD-ROMs).
    pub readonly: Option<bool>,
    /// `open` or `closed`.
    pub tray: Option<String>,
}

/// Options of a LUN.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LunTarget {
    /// Bus (default `scsi`).
    pub bus: Option<DiskBus>,
    /// Attach read-only.
    pub readonly: Option<bool>,
    /// Pass SCSI reservations through.
    pub reservation: Option<bool>,
}

/// A network interface of the guest.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Interface {
    /// Name of the interface; must match a network.
    #[serde(default)]
    pub name: String,
    /// NIC model (default `virtio`).
    pub model: Option<String>,
    /// MAC address (generated when unset).
    pub mac_address: Option<String>,
    /// Boot order for network boot.
    pub boot_order: Option<u32>,
    /// PCI address of the device.
    pub pci_address: Option<String>,
    /// Ports to forward (masquerade binding).
    pub ports: Option<Vec<Port>>,
    /// Bridge the guest to the pod interface.
    pub bridge: Option<InterfaceBinding>,
    /// NAT the guest behind the pod IP (the default for the pod network).
    pub masquerade: Option<InterfaceBinding>,
    /// SR-IOV passthrough.
    pub sriov: Option<InterfaceBinding>,
    /// User-space networking with passt.
    pub passt_binding: Option<InterfaceBinding>,
    /// Network binding plugin.
    pub binding: Option<PluginBinding>,
}

/// An interface binding method (carries no options).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct InterfaceBinding {}

/// A network binding plugin reference.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PluginBinding {
    /// Plugin name.
    #[serde(default)]
    pub name: String,
}

/// A port to forward to the guest.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Port {
    /// Port name.
    pub name: Option<String>,
    /// `TCP` (default) or `UDP`.
    pub protocol: Option<String>,
    /// Port number.
    #[serde(default)]
    pub port: i32,
}

/// A network the guest connects to.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Network {
    /// Network name; interfaces refer to it.
    #[serde(default)]
    pub name: String,
    /// The pod network.
    pub pod: Option<PodNetwork>,
    /// A Multus secondary network.
    pub multus: Option<MultusNetwork>,
}

/// The pod network.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodNetwork {
    /// CIDR of the guest side of a masquerade interface.
    #[serde(rename = "vmNetworkCIDR")]
    pub vm_network_cidr: Option<String>,
    /// IPv6 CIDR of the guest side of a masquerade interface.
    #[serde(rename = "vmIPv6NetworkCIDR")]
    pub vm_ipv6_network_cidr: Option<String>,
}

/// A Multus network.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MultusNetwork {
    /// NetworkAttachmentDefinition name (`ns/name` or `name`).
    #[serde(default)]
    pub network_name: String,
    /// Use it as the pod's default network.
    pub default: Option<bool>,
}

/// A volume: the storage behind a disk. Exactly one source must be set.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Volume {
    /// Volume name; disks refer to it.
    #[serde(default)]
    pub name: String,
    /// A disk image inside a container image, used through a throw-away overlay.
    pub container_disk: Option<ContainerDiskSource>,
    /// A NoCloud cloud-init data source.
    pub cloud_init_no_cloud: Option<CloudInitSource>,
    /// A ConfigDrive cloud-init data source.
    pub cloud_init_config_drive: Option<CloudInitSource>,
    /// A sparse scratch disk that lives as long as the VMI.
    pub empty_disk: Option<EmptyDiskSource>,
    /// A PersistentVolumeClaim.
    pub persistent_volume_claim: Option<PersistentVolumeClaimVolumeSource>,
    /// A PVC used through a throw-away overlay.
    pub ephemeral: Option<EphemeralVolumeSource>,
    /// A CDI DataVolume.
    pub data_volume: Option<DataVolumeSource>,
    /// A disk image on the host.
    pub host_disk: Option<HostDisk>,
    /// A ConfigMap presented as a disk.
    pub config_map: Option<ConfigMapVolumeSource>,
    /// A Secret presented as a disk.
    pub secret: Option<SecretVolumeSource>,
    /// A ServiceAccount token presented as a disk.
    pub service_account: Option<ServiceAccountVolumeSource>,
}

impl Volume {
    /// Names of the sources set on this volume, in schema order.
    pub fn source_names(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.container_disk.is_some() {
            v.push("containerDisk");
        }
        if self.cloud_init_no_cloud.is_some() {
            v.push("cloudInitNoCloud");
        }
        if self.cloud_init_config_drive.is_some() {
            v.push("cloudInitConfigDrive");
        }
        if self.empty_disk.is_some() {
            v.push("emptyDisk");
        }
        if self.persistent_volume_claim.is_some() {
            v.push("persistentVolumeClaim");
        }
        if self.ephemeral.is_some() {
            v.push("ephemeral");
        }
        if self.data_volume.is_some() {
            v.push("dataVolume");
        }
        if self.host_disk.is_some() {
            v.push("hostDisk");
        }
        if self.config_map.is_some() {
            v.push("configMap");
        }
        if self.secret.is_some() {
            v.push("secret");
        }
        if self.service_account.is_some() {
            v.push("serviceAccount");
        }
        v
    }
}

/// A disk image shipped in a container image.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContainerDiskSource {
    /// Container image reference.
    #[serde(default)]
    pub image: String,
    /// Secret with registry credentials.
    pub image_pull_secret: Option<String>,
    /// Path of the disk image inside the container (default: the only file under `/disk`).
    pub path: Option<String>,
    /// `Always`, `IfNotPresent` or `Never`.
    pub image_pull_policy: Option<String>,
}

/// cloud-init data, inline or from Secrets.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CloudInitSource {
    /// Inline user-data.
    pub user_data: Option<String>,
    /// Base64-encoded user-data.
    pub user_data_base64: Option<String>,
    /// Secret holding `userdata`/`userData`.
    pub secret_ref: Option<LocalObjectReference>,
    /// Inline network-config.
    pub network_data: Option<String>,
    /// Base64-encoded network-config.
    pub network_data_base64: Option<String>,
    /// Secret holding `networkdata`/`networkData`.
    pub network_data_secret_ref: Option<LocalObjectReference>,
}

/// A scratch disk.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EmptyDiskSource {
    /// Size of the disk.
    pub capacity: Quantity,
}

/// A PersistentVolumeClaim.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PersistentVolumeClaimVolumeSource {
    /// Claim name.
    #[serde(default)]
    pub claim_name: String,
    /// Attach read-only.
    pub read_only: Option<bool>,
    /// May be hot-plugged.
    pub hotpluggable: Option<bool>,
}

/// A PVC used through a throw-away overlay.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EphemeralVolumeSource {
    /// The claim.
    pub persistent_volume_claim: Option<PersistentVolumeClaimVolumeSource>,
}

/// A CDI DataVolume.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DataVolumeSource {
    /// DataVolume name.
    #[serde(default)]
    pub name: String,
    /// May be hot-plugged.
    pub hotpluggable: Option<bool>,
}

/// A disk image on the host.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostDisk {
    /// Path of the image on the host.
    #[serde(default)]
    pub path: String,
    /// `Disk` or `DiskOrCreate`.
    #[serde(rename = "type", default)]
    pub type_: String,
    /// Size when created.
    pub capacity: Option<Quantity>,
    /// Shared between VMs.
    pub shared: Option<bool>,
}

/// A ConfigMap as a disk.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapVolumeSource {
    /// ConfigMap name.
    #[serde(default)]
    pub name: String,
    /// Tolerate a missing ConfigMap.
    pub optional: Option<bool>,
    /// Filesystem label of the disk.
    pub volume_label: Option<String>,
}

/// A Secret as a disk.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretVolumeSource {
    /// Secret name.
    pub secret_name: Option<String>,
    /// Tolerate a missing Secret.
    pub optional: Option<bool>,
    /// Filesystem label of the disk.
    pub volume_label: Option<String>,
}

/// A ServiceAccount as a disk.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceAccountVolumeSource {
    /// ServiceAccount name.
    pub service_account_name: Option<String>,
}

/// Phase of a VirtualMachineInstance.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum VirtualMachineInstancePhase {
    /// Not yet seen by the controller.
    #[default]
    #[serde(rename = "")]
    Unset,
    /// Accepted; the launcher pod is not created yet.
    Pending,
    /// The launcher pod exists and waits for a node.
    Scheduling,
    /// The launcher pod runs on a node; the guest is being started.
    Scheduled,
    /// The guest runs.
    Running,
    /// The guest shut down cleanly.
    Succeeded,
    /// The guest crashed or could not start.
    Failed,
    /// Waiting for a decentralised migration source.
    WaitingForSync,
    /// State cannot be determined.
    Unknown,
}

impl VirtualMachineInstancePhase {
    /// The phase as written on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unset => "",
            Self::Pending => "Pending",
            Self::Scheduling => "Scheduling",
            Self::Scheduled => "Scheduled",
            Self::Running => "Running",
            Self::Succeeded => "Succeeded",
            Self::Failed => "Failed",
            Self::WaitingForSync => "WaitingForSync",
            Self::Unknown => "Unknown",
        }
    }

    /// Succeeded or Failed: the VMI will never run again.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed)
    }
}

/// Observed state of a VirtualMachineInstance.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceStatus {
    /// Lifecycle phase.
    #[serde(default, skip_serializing_if = "is_unset")]
    pub phase: VirtualMachineInstancePhase,
    /// When each phase was entered.
    pub phase_transition_timestamps: Option<Vec<PhaseTransitionTimestamp>>,
    /// Node the guest runs on.
    pub node_name: Option<String>,
    /// Short reason for the current phase (e.g. why it failed).
    pub reason: Option<String>,
    /// Conditions: Ready, Paused, LiveMigratable, SoftwareEmulation, …
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Option<Vec<Condition>>,
    /// Guest network interfaces as observed.
    pub interfaces: Option<Vec<VirtualMachineInstanceNetworkInterface>>,
    /// State of the current or last migration.
    pub migration_state: Option<VirtualMachineInstanceMigrationState>,
    /// `BlockMigration` or `LiveMigration`.
    pub migration_method: Option<String>,
    /// QoS class of the launcher pod.
    pub qos_class: Option<String>,
    /// Version of the launcher that runs the guest.
    pub launcher_container_image_version: Option<String>,
    /// Launcher pods of this VMI by pod UID, with their node.
    pub active_pods: Option<BTreeMap<String, String>>,
    /// Node the VMI is being evacuated from.
    pub evacuation_node_name: Option<String>,
    /// Machine type the guest actually got.
    pub machine: Option<Machine>,
    /// Guest-visible CPU topology.
    #[serde(rename = "currentCPUTopology")]
    pub current_cpu_topology: Option<CpuTopology>,
    /// Per-volume status.
    pub volume_status: Option<Vec<VolumeStatus>>,
    /// Versions of the components running the guest.
    pub runtime_versions: Option<RuntimeVersions>,
    /// The guest OS as its guest agent reports it.
    #[serde(
        rename = "guestOSInfo",
        default,
        skip_serializing_if = "crate::guestagent::GuestOsInfo::is_empty"
    )]
    pub guest_os_info: crate::guestagent::GuestOsInfo,
    /// `frozen` while a freeze of the guest's file systems holds (KubeVirt's field: what
    /// was asked, not the guest's own state).
    pub fs_freeze_status: Option<String>,
    /// Volumes whose claims the current (or last) migration copies to new claims on the
    /// target node (KubeVirt's field of its volume migration): written by virt-controller
    /// when it creates the target, read by the source virt-handler.
    pub migrated_volumes: Option<Vec<StorageMigratedVolumeInfo>>,
}

/// One volume of a migration that moves its claim (KubeVirt's `StorageMigratedVolumeInfo`).
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageMigratedVolumeInfo {
    /// The VMI volume.
    #[serde(default)]
    pub volume_name: String,
    /// The claim the data comes from.
    #[serde(rename = "sourcePVCInfo")]
    pub source_pvc_info: Option<PersistentVolumeClaimInfo>,
    /// The claim the data goes to.
    #[serde(rename = "destinationPVCInfo")]
    pub destination_pvc_info: Option<PersistentVolumeClaimInfo>,
}

fn is_unset(p: &VirtualMachineInstancePhase) -> bool {
    *p == VirtualMachineInstancePhase::Unset
}

/// When a phase was entered.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PhaseTransitionTimestamp {
    /// The phase.
    #[serde(default)]
    pub phase: VirtualMachineInstancePhase,
    /// When it was entered.
    pub phase_transition_timestamp: Option<Time>,
}

/// A guest network interface as observed.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceNetworkInterface {
    /// Name from the VMI spec.
    pub name: Option<String>,
    /// Primary IP address.
    pub ip_address: Option<String>,
    /// All IP addresses.
    pub ip_addresses: Option<Vec<String>>,
    /// MAC address.
    pub mac: Option<String>,
    /// Interface name inside the guest.
    pub interface_name: Option<String>,
    /// Where the information came from (`domain`, `guest-agent`, …).
    pub info_source: Option<String>,
    /// Number of queues.
    pub queue_count: Option<i32>,
    /// Name of the launcher pod's interface behind it.
    pub pod_interface_name: Option<String>,
    /// `up` or `down`.
    pub link_state: Option<String>,
}

/// Guest-visible CPU topology.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CpuTopology {
    /// Cores per socket.
    pub cores: Option<u32>,
    /// Sockets.
    pub sockets: Option<u32>,
    /// Threads per core.
    pub threads: Option<u32>,
}

/// Status of one volume.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStatus {
    /// Volume name.
    #[serde(default)]
    pub name: String,
    /// Disk target in the guest (e.g. `vda`).
    pub target: Option<String>,
    /// Phase of the volume.
    pub phase: Option<String>,
    /// Reason for the phase.
    pub reason: Option<String>,
    /// Details.
    pub message: Option<String>,
    /// Size in bytes.
    pub size: Option<i64>,
    /// The claim behind a PVC or DataVolume volume, as virt-controller saw it.
    pub persistent_volume_claim_info: Option<PersistentVolumeClaimInfo>,
    /// For a hotplugged volume: the pod that attaches it to the node.
    pub hotplug_volume: Option<crate::hotplug::HotplugVolumeStatus>,
}

/// What is known of the claim behind a volume (KubeVirt's `PersistentVolumeClaimInfo`).
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PersistentVolumeClaimInfo {
    /// The claim's name (set in `migratedVolumes`).
    pub claim_name: Option<String>,
    /// Access modes of the claim (`ReadWriteMany` makes it shared).
    pub access_modes: Option<Vec<String>>,
    /// `Filesystem` or `Block`.
    pub volume_mode: Option<String>,
    /// Capacity of the bound volume.
    pub capacity: Option<BTreeMap<String, Quantity>>,
    /// Requested resources of the claim.
    pub requests: Option<BTreeMap<String, Quantity>>,
    /// Share of a Filesystem-mode claim not available to `disk.img` (e.g. `"0.055"`).
    pub filesystem_overhead: Option<String>,
}

/// Versions of the software that runs the guest.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeVersions {
    /// virt-launcher version.
    pub launcher: Option<String>,
    /// libvirt version.
    pub libvirt: Option<String>,
    /// QEMU version.
    pub qemu: Option<String>,
}

/// Well-known VMI condition types.
pub mod condition_types {
    /// The guest runs and is ready.
    pub const READY: &str = "Ready";
    /// The guest is paused.
    pub const PAUSED: &str = "Paused";
    /// The guest can be live-migrated.
    pub const LIVE_MIGRATABLE: &str = "LiveMigratable";
    /// The guest runs under software emulation (TCG) because KVM is unusable.
    pub const SOFTWARE_EMULATION: &str = "SoftwareEmulation";
    /// The launcher pod could not be scheduled, pulled or started.
    pub const POD_SCHEDULED: &str = "PodScheduled";
    /// Failure reported by the controller.
    pub const SYNCHRONIZED: &str = "Synchronized";
    /// A QEMU guest agent runs in the guest.
    pub const AGENT_CONNECTED: &str = "AgentConnected";
    /// The guest agent lacks a command KubeVirt requires (KubeVirt's type name).
    pub const AGENT_VERSION_NOT_SUPPORTED: &str = "AgentVersionNotSupported";
    /// The access credentials reached the guest (or, False, why not).
    pub const ACCESS_CREDENTIALS_SYNCHRONIZED: &str = "AccessCredentialsSynchronized";
}

impl VirtualMachineInstanceStatus {
    /// The condition of `type_`, if present.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions
            .as_deref()
            .and_then(|c| crate::common::find_condition(c, type_))
    }
}
