//! Typed subset of libvirt's domain XML (`https://libvirt.org/formatdomain.html`).
//!
//! Attributes are `@name`, text is `$text` (quick-xml's serde conventions). Closed sets
//! are enums so an invalid bus or cache mode cannot be built. Unknown elements are
//! ignored when parsing, because libvirt's live XML grows with every release.

use serde::{Deserialize, Serialize};

/// An element that carries nothing but its presence (`<acpi/>`, `<readonly/>`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Empty {}

/// A libvirt domain.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename = "domain")]
pub struct Domain {
    /// Hypervisor: `qemu` (TCG) or `kvm`.
    #[serde(rename = "@type")]
    pub type_: DomainType,
    /// Unique name on the host.
    pub name: String,
    /// SMBIOS/libvirt UUID.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    /// Maximum guest memory.
    pub memory: SizedValue,
    /// Memory at boot.
    #[serde(rename = "currentMemory", skip_serializing_if = "Option::is_none")]
    pub current_memory: Option<SizedValue>,
    /// Number of vCPUs.
    pub vcpu: Vcpu,
    /// Boot configuration.
    pub os: Os,
    /// Hypervisor features.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub features: Option<Features>,
    /// CPU model and topology.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Cpu>,
    /// Guest clock.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clock: Option<Clock>,
    /// What a guest power-off does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_poweroff: Option<LifecycleAction>,
    /// What a guest reboot does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_reboot: Option<LifecycleAction>,
    /// What a guest crash does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_crash: Option<LifecycleAction>,
    /// Devices.
    pub devices: Devices,
}

/// Domain (hypervisor) type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DomainType {
    /// QEMU with TCG software emulation.
    Qemu,
    /// QEMU with KVM.
    Kvm,
}

/// A number with a unit attribute (`<memory unit='KiB'>65536</memory>`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SizedValue {
    /// Unit, e.g. `KiB`.
    #[serde(rename = "@unit")]
    pub unit: String,
    /// The number.
    #[serde(rename = "$text")]
    pub value: u64,
}

impl SizedValue {
    /// A size in KiB.
    pub fn kib(value: u64) -> Self {
        Self {
            unit: "KiB".into(),
            value,
        }
    }
}

/// vCPU count.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Vcpu {
    /// `static` or `auto`.
    #[serde(rename = "@placement", skip_serializing_if = "Option::is_none")]
    pub placement: Option<String>,
    /// vCPUs online at boot when fewer than the maximum (`count`): the rest can be
    /// hotplugged later (KubeVirt's CPU hotplug).
    #[serde(rename = "@current", default, skip_serializing_if = "Option::is_none")]
    pub current: Option<u32>,
    /// Count (the maximum when `current` is set).
    #[serde(rename = "$text")]
    pub count: u32,
}

/// Boot configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Os {
    /// `efi` for automatic UEFI firmware selection.
    #[serde(rename = "@firmware", skip_serializing_if = "Option::is_none")]
    pub firmware: Option<String>,
    /// Guest type, arch and machine.
    #[serde(rename = "type")]
    pub type_: OsType,
    /// What UEFI firmware autoselection must pick (`<firmware><feature …/></firmware>`):
    /// libvirt takes the first matching descriptor of `/usr/share/qemu/firmware`, and
    /// without these the first one may be a Secure Boot build with keys enrolled.
    #[serde(rename = "firmware", skip_serializing_if = "Option::is_none")]
    pub firmware_features: Option<FirmwareFeatures>,
    /// The firmware's loader options (`secure='yes'` for Secure Boot's SMM-protected
    /// variable store).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loader: Option<Loader>,
    /// The VM's UEFI variable store (`<nvram>PATH</nvram>`); libvirt fills in the template.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvram: Option<String>,
    /// Direct-boot kernel.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
    /// Direct-boot initrd.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initrd: Option<String>,
    /// Kernel command line.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cmdline: Option<String>,
    /// BIOS options.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bios: Option<Bios>,
}

/// `<firmware>`'s features, for UEFI autoselection.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FirmwareFeatures {
    /// The features, each required on or off.
    #[serde(rename = "feature", default)]
    pub features: Vec<FirmwareFeature>,
}

/// `<feature enabled='no' name='secure-boot'/>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FirmwareFeature {
    /// `yes` or `no`.
    #[serde(rename = "@enabled")]
    pub enabled: String,
    /// `secure-boot` or `enrolled-keys`.
    #[serde(rename = "@name")]
    pub name: String,
}

impl FirmwareFeature {
    /// `name` required on (`yes`) or off (`no`).
    pub fn new(name: &str, enabled: bool) -> Self {
        Self {
            enabled: if enabled { "yes" } else { "no" }.into(),
            name: name.into(),
        }
    }
}

/// `<loader secure='yes'/>`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Loader {
    /// `yes` for a firmware whose variable store only SMM may write (Secure Boot).
    #[serde(rename = "@secure", skip_serializing_if = "Option::is_none")]
    pub secure: Option<String>,
}

/// `<type arch='x86_64' machine='q35'>hvm</type>`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsType {
    /// Guest architecture.
    #[serde(rename = "@arch", skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
    /// Machine type.
    #[serde(rename = "@machine", skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// Always `hvm` for QEMU guests.
    #[serde(rename = "$text")]
    pub value: String,
}

/// BIOS options.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bios {
    /// `yes` to mirror BIOS output on the serial port.
    #[serde(rename = "@useserial", skip_serializing_if = "Option::is_none")]
    pub useserial: Option<String>,
}

/// Hypervisor features.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Features {
    /// ACPI (power button).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acpi: Option<Empty>,
    /// APIC.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub apic: Option<Empty>,
    /// System management mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub smm: Option<Smm>,
}

/// `<smm state='on'/>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Smm {
    /// `on` or `off`.
    #[serde(rename = "@state")]
    pub state: String,
}

/// CPU mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum CpuMode {
    /// The host CPU model, as close as libvirt can express it (KVM only).
    #[serde(rename = "host-model")]
    HostModel,
    /// The host CPU passed through (KVM only).
    #[serde(rename = "host-passthrough")]
    HostPassthrough,
    /// A named model.
    #[serde(rename = "custom")]
    Custom,
}

/// CPU model and topology.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cpu {
    /// Mode.
    #[serde(rename = "@mode", skip_serializing_if = "Option::is_none")]
    pub mode: Option<CpuMode>,
    /// Named model (custom mode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<CpuModel>,
    /// Topology.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topology: Option<Topology>,
}

/// A named CPU model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuModel {
    /// `allow` or `forbid`.
    #[serde(rename = "@fallback", skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
    /// Model name.
    #[serde(rename = "$text")]
    pub name: String,
}

/// Guest CPU topology.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    /// Sockets.
    #[serde(rename = "@sockets")]
    pub sockets: u32,
    /// Dies per socket (libvirt adds it on parse-back).
    #[serde(rename = "@dies", skip_serializing_if = "Option::is_none")]
    pub dies: Option<u32>,
    /// Cores per die.
    #[serde(rename = "@cores")]
    pub cores: u32,
    /// Threads per core.
    #[serde(rename = "@threads")]
    pub threads: u32,
}

/// Guest clock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Clock {
    /// `utc`, `variable` or `timezone`.
    #[serde(rename = "@offset")]
    pub offset: String,
    /// Seconds added to `basis` (variable offset).
    #[serde(rename = "@adjustment", skip_serializing_if = "Option::is_none")]
    pub adjustment: Option<i64>,
    /// `utc` (variable offset).
    #[serde(rename = "@basis", skip_serializing_if = "Option::is_none")]
    pub basis: Option<String>,
    /// Time zone (timezone offset).
    #[serde(rename = "@timezone", skip_serializing_if = "Option::is_none")]
    pub timezone: Option<String>,
}

/// Lifecycle action.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LifecycleAction {
    /// Stop the domain.
    Destroy,
    /// Restart the domain.
    Restart,
    /// Keep the domain, paused.
    Preserve,
}

/// Devices.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Devices {
    /// QEMU binary.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub emulator: Option<String>,
    /// Disks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disk: Vec<Disk>,
    /// Controllers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub controller: Vec<Controller>,
    /// NICs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interface: Vec<Interface>,
    /// Serial ports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub serial: Vec<Serial>,
    /// Consoles (libvirt adds one mirroring serial0 on parse-back).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub console: Vec<Serial>,
    /// virtio-serial channels (the QEMU guest agent's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub channel: Vec<Channel>,
    /// Graphics.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub graphics: Vec<Graphics>,
    /// Video adapters.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub video: Vec<Video>,
    /// Memory balloon.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memballoon: Option<MemBalloon>,
    /// Random number generators.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rng: Vec<Rng>,
    /// Panic notifiers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub panic: Vec<Panic>,
}

/// Where a disk's data lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskType {
    /// A file.
    File,
    /// A block device.
    Block,
}

/// What the guest sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskDevice {
    /// A disk.
    Disk,
    /// A CD-ROM.
    Cdrom,
    /// A SCSI LUN.
    Lun,
}

/// Image format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiskFormat {
    /// Raw image or ISO.
    Raw,
    /// qcow2 (overlays, empty disks).
    Qcow2,
}

/// Host cache mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheMode {
    /// O_DIRECT.
    None,
    /// Host page cache, synchronous writes.
    Writethrough,
    /// Host page cache.
    Writeback,
}

/// I/O mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IoMode {
    /// Linux AIO.
    Native,
    /// A thread pool.
    Threads,
}

/// Disk bus.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Bus {
    /// virtio-blk.
    Virtio,
    /// SATA (AHCI).
    Sata,
    /// virtio-scsi.
    Scsi,
    /// USB storage.
    Usb,
}

/// A disk.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Disk {
    /// Source kind.
    #[serde(rename = "@type")]
    pub type_: DiskType,
    /// Guest device kind.
    #[serde(rename = "@device")]
    pub device: DiskDevice,
    /// Driver options.
    pub driver: DiskDriver,
    /// Source.
    pub source: DiskSource,
    /// Guest target.
    pub target: DiskTarget,
    /// Boot order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boot: Option<Boot>,
    /// Read-only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub readonly: Option<Empty>,
    /// Shareable between domains.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shareable: Option<Empty>,
    /// Serial number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// Device alias.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alias: Option<Alias>,
}

/// Disk driver.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskDriver {
    /// Always `qemu`.
    #[serde(rename = "@name")]
    pub name: String,
    /// Image format.
    #[serde(rename = "@type")]
    pub format: DiskFormat,
    /// Cache mode.
    #[serde(rename = "@cache", skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheMode>,
    /// I/O mode.
    #[serde(rename = "@io", skip_serializing_if = "Option::is_none")]
    pub io: Option<IoMode>,
    /// I/O error policy.
    #[serde(rename = "@error_policy", skip_serializing_if = "Option::is_none")]
    pub error_policy: Option<String>,
}

/// Disk source.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskSource {
    /// File path.
    #[serde(rename = "@file", skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// Block device path.
    #[serde(rename = "@dev", skip_serializing_if = "Option::is_none")]
    pub dev: Option<String>,
}

/// Disk target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiskTarget {
    /// Device name hint (`vda`, `sda`).
    #[serde(rename = "@dev")]
    pub dev: String,
    /// Bus.
    #[serde(rename = "@bus")]
    pub bus: Bus,
}

/// Boot order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Boot {
    /// Order; lower first.
    #[serde(rename = "@order")]
    pub order: u32,
}

/// Device alias; `ua-` prefixed aliases are user-chosen and stable.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alias {
    /// Alias.
    #[serde(rename = "@name")]
    pub name: String,
}

/// A controller.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Controller {
    /// Controller type (`scsi`, `pci`, `usb`, …).
    #[serde(rename = "@type")]
    pub type_: String,
    /// Index.
    #[serde(rename = "@index", skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    /// Model.
    #[serde(rename = "@model", skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// A virtio-serial controller's number of ports (QEMU's `max_ports`).
    #[serde(rename = "@ports", skip_serializing_if = "Option::is_none")]
    pub ports: Option<u32>,
}

/// Interface kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum InterfaceType {
    /// QEMU user-mode networking (slirp), no host privileges or devices.
    User,
    /// An existing host tap device.
    Ethernet,
    /// A host bridge.
    Bridge,
}

/// NIC model.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetModel {
    /// virtio-net.
    Virtio,
    /// Intel e1000.
    E1000,
    /// Intel e1000e.
    E1000e,
    /// Realtek 8139.
    Rtl8139,
}

/// A NIC.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    /// Kind.
    #[serde(rename = "@type")]
    pub type_: InterfaceType,
    /// MAC address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mac: Option<Mac>,
    /// The host device (`ethernet`: a tap made by someone else).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<InterfaceTarget>,
    /// Model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<Model<NetModel>>,
    /// The guest NIC's MTU.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtu: Option<Mtu>,
    /// Boot order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boot: Option<Boot>,
    /// Alias.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alias: Option<Alias>,
}

/// `<target dev='tap0' managed='no'/>`: libvirt opens the existing device and neither
/// creates nor configures it (it could not: the launcher has no network privileges).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InterfaceTarget {
    /// Device name.
    #[serde(rename = "@dev")]
    pub dev: String,
    /// `no`.
    #[serde(rename = "@managed")]
    pub managed: String,
}

/// `<mtu size='1450'/>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mtu {
    /// Bytes.
    #[serde(rename = "@size")]
    pub size: u32,
}

/// `<mac address='…'/>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mac {
    /// Address.
    #[serde(rename = "@address")]
    pub address: String,
}

/// `<model type='…'/>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Model<T> {
    /// Model.
    #[serde(rename = "@type")]
    pub type_: T,
}

/// Character device kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CharType {
    /// A unix socket.
    Unix,
    /// A pseudo terminal.
    Pty,
    /// Discarded.
    Null,
}

/// A serial port or console.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Serial {
    /// Backend kind.
    #[serde(rename = "@type")]
    pub type_: CharType,
    /// Backend source.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<CharSource>,
    /// Guest side.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<CharTarget>,
    /// Also write the output to this file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log: Option<CharLog>,
    /// Alias.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alias: Option<Alias>,
}

/// Socket of a character device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CharSource {
    /// `bind` (QEMU listens) or `connect`.
    #[serde(rename = "@mode", skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Socket path.
    #[serde(rename = "@path", skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// Guest side of a character device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CharTarget {
    /// `isa-serial` or `serial`.
    #[serde(rename = "@type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// Port.
    #[serde(rename = "@port", skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
}

/// Log file of a character device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CharLog {
    /// Path.
    #[serde(rename = "@file")]
    pub file: String,
    /// `on` to append.
    #[serde(rename = "@append", skip_serializing_if = "Option::is_none")]
    pub append: Option<String>,
}

/// The name of the QEMU guest agent's virtio-serial port, which qemu-guest-agent in the
/// guest opens and libvirt recognises as the agent's channel.
pub const GUEST_AGENT_CHANNEL: &str = "org.qemu.guest_agent.0";

/// A virtio-serial channel between host and guest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Channel {
    /// Host side kind.
    #[serde(rename = "@type")]
    pub type_: CharType,
    /// Host side socket; without a path libvirt chooses one in its own state directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<CharSource>,
    /// Guest side.
    pub target: ChannelTarget,
}

/// `<target type='virtio' name='org.qemu.guest_agent.0'/>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelTarget {
    /// `virtio`.
    #[serde(rename = "@type")]
    pub type_: String,
    /// Port name the guest sees.
    #[serde(rename = "@name", skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Live XML only: whether a guest process has the port open.
    #[serde(rename = "@state", skip_serializing_if = "Option::is_none")]
    pub state: Option<ChannelState>,
}

/// A virtio-serial port's state as libvirt reports it in the live XML.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChannelState {
    /// A guest process (the agent) has the port open.
    Connected,
    /// Nothing in the guest listens.
    Disconnected,
}

/// Graphics kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GraphicsType {
    /// VNC.
    Vnc,
}

/// A graphics device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Graphics {
    /// Kind.
    #[serde(rename = "@type")]
    pub type_: GraphicsType,
    /// Where it listens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<GraphicsListen>,
}

/// `<listen type='socket' socket='…'/>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GraphicsListen {
    /// `socket`, `address` or `none`.
    #[serde(rename = "@type")]
    pub type_: String,
    /// Socket path.
    #[serde(rename = "@socket", skip_serializing_if = "Option::is_none")]
    pub socket: Option<String>,
}

/// A video adapter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Video {
    /// Model.
    pub model: VideoModel,
}

/// `<model type='vga' heads='1'/>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VideoModel {
    /// `vga`, `virtio`, `bochs`, `none`.
    #[serde(rename = "@type")]
    pub type_: String,
    /// Heads.
    #[serde(rename = "@heads", skip_serializing_if = "Option::is_none")]
    pub heads: Option<u32>,
}

/// Memory balloon.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemBalloon {
    /// `virtio` or `none`.
    #[serde(rename = "@model")]
    pub model: String,
    /// How often QEMU asks the guest's balloon driver for its memory figures.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stats: Option<BalloonStatsPeriod>,
}

/// `<stats period='10'/>` of a memory balloon.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BalloonStatsPeriod {
    /// Seconds.
    #[serde(rename = "@period")]
    pub period: u32,
}

/// `<panic model='isa'/>`: the guest reports a kernel panic, libvirt applies `on_crash`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Panic {
    /// `isa`, `hyperv` or `pvpanic`.
    #[serde(rename = "@model")]
    pub model: String,
}

/// Random number generator.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rng {
    /// `virtio`.
    #[serde(rename = "@model")]
    pub model: String,
    /// Entropy source.
    pub backend: RngBackend,
}

/// `<backend model='random'>/dev/urandom</backend>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RngBackend {
    /// `random`.
    #[serde(rename = "@model")]
    pub model: String,
    /// Device.
    #[serde(rename = "$text")]
    pub path: String,
}

/// Errors serialising or parsing domain XML.
#[derive(Debug, thiserror::Error)]
pub enum XmlError {
    /// Serialisation failed.
    #[error("serialising domain XML: {0}")]
    Serialize(#[from] quick_xml::SeError),
    /// Parsing failed.
    #[error("parsing domain XML: {0}")]
    Parse(#[from] quick_xml::DeError),
}

impl Disk {
    /// The `<disk>` element alone, as libvirt's attach and detach calls take it.
    pub fn to_xml(&self) -> Result<String, XmlError> {
        Ok(quick_xml::se::to_string_with_root("disk", self)?)
    }
}

impl Domain {
    /// The domain as libvirt XML, indented for humans and golden files.
    pub fn to_xml(&self) -> Result<String, XmlError> {
        let mut out = String::new();
        let mut ser = quick_xml::se::Serializer::new(&mut out);
        ser.indent(' ', 2);
        self.serialize(ser)?;
        out.push('\n');
        Ok(out)
    }

    /// Parses libvirt domain XML (ours or libvirt's live description).
    pub fn from_xml(xml: &str) -> Result<Self, XmlError> {
        Ok(quick_xml::de::from_str(xml)?)
    }
}

/// The VMI's names of a running domain's disks and interfaces, by the name libvirt's
/// statistics give them (a disk's target `vda`, an interface's host device `tap0`): the
/// `ua-<name>` aliases the conversion gives every device the VMI names. Devices without
/// such an alias are left out. Only those elements are read, as in
/// [`guest_agent_connected`].
pub fn device_aliases(
    live_xml: &str,
) -> Result<std::collections::BTreeMap<String, String>, XmlError> {
    #[derive(Deserialize)]
    struct Live {
        #[serde(default)]
        devices: LiveDevices,
    }
    #[derive(Default, Deserialize)]
    struct LiveDevices {
        #[serde(default)]
        disk: Vec<LiveDevice>,
        #[serde(default)]
        interface: Vec<LiveDevice>,
    }
    #[derive(Deserialize)]
    struct LiveDevice {
        target: Option<LiveTarget>,
        alias: Option<Alias>,
    }
    #[derive(Deserialize)]
    struct LiveTarget {
        #[serde(rename = "@dev")]
        dev: Option<String>,
    }
    let live: Live = quick_xml::de::from_str(live_xml)?;
    Ok(live
        .devices
        .disk
        .iter()
        .chain(&live.devices.interface)
        .filter_map(|d| {
            let dev = d.target.as_ref()?.dev.clone()?;
            let name = d.alias.as_ref()?.name.strip_prefix("ua-")?;
            Some((dev, name.to_string()))
        })
        .collect())
}

/// A hotplugged disk of a running domain: its volume and guest device name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HotpluggedDisk {
    /// The VMI volume.
    pub name: String,
    /// The guest device (`sda`).
    pub target: String,
}

/// The disks of libvirt's live domain XML whose image is under `hotplug_dir` (where
/// virt-handler mounts hotplugged volumes), by their `ua-<volume>` alias, and every guest
/// device name in use (for the next hotplugged disk's).
pub fn live_disks(
    live_xml: &str,
    hotplug_dir: &str,
) -> Result<(Vec<HotpluggedDisk>, Vec<String>), XmlError> {
    #[derive(Deserialize)]
    struct Live {
        #[serde(default)]
        devices: LiveDevices,
    }
    #[derive(Default, Deserialize)]
    struct LiveDevices {
        #[serde(default)]
        disk: Vec<LiveDisk>,
    }
    #[derive(Deserialize)]
    struct LiveDisk {
        source: Option<LiveSource>,
        target: Option<LiveTarget>,
        alias: Option<Alias>,
    }
    #[derive(Deserialize)]
    struct LiveSource {
        #[serde(rename = "@file")]
        file: Option<String>,
        #[serde(rename = "@dev")]
        dev: Option<String>,
    }
    #[derive(Deserialize)]
    struct LiveTarget {
        #[serde(rename = "@dev")]
        dev: Option<String>,
    }
    let live: Live = quick_xml::de::from_str(live_xml)?;
    let prefix = format!("{}/", hotplug_dir.trim_end_matches('/'));
    let taken = live
        .devices
        .disk
        .iter()
        .filter_map(|d| d.target.as_ref()?.dev.clone())
        .collect();
    let hot = live
        .devices
        .disk
        .iter()
        .filter(|d| {
            d.source.as_ref().is_some_and(|s| {
                s.file
                    .as_deref()
                    .or(s.dev.as_deref())
                    .is_some_and(|p| p.starts_with(&prefix))
            })
        })
        .filter_map(|d| {
            Some(HotpluggedDisk {
                name: d.alias.as_ref()?.name.strip_prefix("ua-")?.to_string(),
                target: d.target.as_ref()?.dev.clone()?,
            })
        })
        .collect();
    Ok((hot, taken))
}

/// Whether libvirt's live domain XML shows a guest agent in the guest: its channel's port
/// is open. Only the channels are read, so nothing else libvirt adds to a running
/// domain's XML can make this fail.
pub fn guest_agent_connected(live_xml: &str) -> Result<bool, XmlError> {
    #[derive(Deserialize)]
    struct Live {
        #[serde(default)]
        devices: LiveDevices,
    }
    #[derive(Default, Deserialize)]
    struct LiveDevices {
        #[serde(default)]
        channel: Vec<LiveChannel>,
    }
    #[derive(Deserialize)]
    struct LiveChannel {
        target: Option<ChannelTarget>,
    }
    let live: Live = quick_xml::de::from_str(live_xml)?;
    Ok(live.devices.channel.iter().any(|c| {
        c.target.as_ref().is_some_and(|t| {
            t.name.as_deref() == Some(GUEST_AGENT_CHANNEL)
                && t.state == Some(ChannelState::Connected)
        })
    }))
}
