//! VMI → libvirt domain, as pure functions: one per facet, applied in a fixed order
//! (KubeVirt's "Configurator" idea without the side effects).

use std::collections::BTreeMap;
use std::path::Path;

use kubevirt_api::VirtualMachineInstance;
use kubevirt_api::quantity;
use kubevirt_api::vmi::{self, DomainSpec};

use crate::host::{Accel, HostFacts, NetworkMode, PreparedVolume};
use crate::schema::*;

/// Why a VMI cannot be turned into a domain.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConvertError {
    /// No guest memory size was given.
    #[error(
        "no guest memory: set spec.domain.memory.guest or spec.domain.resources.requests.memory"
    )]
    MissingMemory,
    /// A memory quantity does not parse.
    #[error("invalid memory quantity {value:?} at {field}")]
    InvalidMemory {
        /// Field path.
        field: String,
        /// The bad value.
        value: String,
    },
    /// A disk names a volume that does not exist.
    #[error("disk {disk:?} references volume {disk:?}, which is not in spec.volumes")]
    VolumeNotFound {
        /// The disk.
        disk: String,
    },
    /// A volume was not prepared on the host.
    #[error("volume {volume:?} has no prepared source on the host")]
    VolumeNotPrepared {
        /// The volume.
        volume: String,
    },
    /// kernelBoot is set but no kernel was resolved.
    #[error("firmware.kernelBoot is set but its kernel and initrd were not resolved on the host")]
    KernelBootNotPrepared,
    /// `cache: none` on a disk whose file system refuses `O_DIRECT`.
    #[error(
        "{field}: cache mode none needs direct I/O, which the file system of {path} does not support; leave the cache mode unset or choose writethrough"
    )]
    DirectIoUnsupported {
        /// Field path.
        field: String,
        /// The disk's file.
        path: String,
    },
    /// A field value this implementation does not support.
    #[error("unsupported value {value:?} for {field}")]
    Unsupported {
        /// Field path.
        field: String,
        /// The value.
        value: String,
    },
}

/// Domain name for a VMI: `<namespace>_<name>`, as KubeVirt names them.
pub fn domain_name(vmi: &VirtualMachineInstance) -> String {
    let ns = vmi.metadata.namespace.as_deref().unwrap_or("default");
    let name = vmi.metadata.name.as_deref().unwrap_or("vmi");
    format!("{ns}_{name}")
}

/// Converts a (defaulted) VMI into a libvirt domain for this host.
pub fn domain_for(vmi: &VirtualMachineInstance, host: &HostFacts) -> Result<Domain, ConvertError> {
    let spec = &vmi.spec.domain;
    let mut d = Domain {
        type_: match host.accel {
            Accel::Kvm => DomainType::Kvm,
            Accel::Tcg => DomainType::Qemu,
        },
        name: domain_name(vmi),
        uuid: spec.firmware.as_ref().and_then(|f| f.uuid.clone()),
        memory: SizedValue::kib(0),
        current_memory: None,
        vcpu: Vcpu {
            placement: Some("static".into()),
            current: None,
            count: 1,
        },
        os: Os::default(),
        features: None,
        cpu: None,
        clock: None,
        // A guest power-off ends the VMI; the launcher decides what happens next.
        on_poweroff: Some(LifecycleAction::Destroy),
        on_reboot: Some(LifecycleAction::Restart),
        on_crash: Some(LifecycleAction::Destroy),
        devices: Devices {
            emulator: host.emulator.as_deref().map(path_str),
            ..Devices::default()
        },
    };
    memory(spec, &mut d)?;
    cpu(spec, host, &mut d)?;
    firmware(spec, host, &mut d)?;
    features(spec, &mut d);
    clock(spec, &mut d);
    disks(&vmi.spec, host, &mut d)?;
    interfaces(spec, host, &mut d)?;
    console(spec, host, &mut d);
    guest_agent_channel(&mut d);
    graphics(spec, host, &mut d);
    misc_devices(spec, &mut d);
    Ok(d)
}

fn path_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

fn memory(spec: &DomainSpec, d: &mut Domain) -> Result<(), ConvertError> {
    let res = spec.resources.as_ref();
    let (field, q) = if let Some(q) = spec.memory.as_ref().and_then(|m| m.guest.as_ref()) {
        ("spec.domain.memory.guest", q)
    } else if let Some(q) = res
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("memory"))
    {
        ("spec.domain.resources.requests.memory", q)
    } else if let Some(q) = res
        .and_then(|r| r.limits.as_ref())
        .and_then(|r| r.get("memory"))
    {
        ("spec.domain.resources.limits.memory", q)
    } else {
        return Err(ConvertError::MissingMemory);
    };
    let bytes = quantity::parse_bytes(&q.0)
        .ok()
        .filter(|b| *b > 0)
        .ok_or_else(|| ConvertError::InvalidMemory {
            field: field.into(),
            value: q.0.clone(),
        })?;
    // libvirt stores KiB; round up so the guest never gets less than it asked for.
    d.memory = SizedValue::kib(bytes.div_ceil(1024));
    Ok(())
}

fn cpu(spec: &DomainSpec, host: &HostFacts, d: &mut Domain) -> Result<(), ConvertError> {
    let c = spec.cpu.clone().unwrap_or_default();
    let sockets = c.sockets.unwrap_or(1).max(1);
    let cores = c.cores.unwrap_or(1).max(1);
    let threads = c.threads.unwrap_or(1).max(1);
    d.vcpu.count = sockets * cores * threads;
    // Room for CPU hotplug (a VMI started under LiveUpdate has maxSockets): as KubeVirt, the
    // topology has every socket the VMI may grow to and only its sockets' vCPUs are online;
    // the others are hotplugged after a migration to a launcher pod of the new size.
    let max_sockets = c.max_sockets.unwrap_or(0).max(sockets);
    if max_sockets > sockets {
        d.vcpu.current = Some(d.vcpu.count);
        d.vcpu.count = max_sockets * cores * threads;
    }
    let topology = Some(Topology {
        sockets: max_sockets,
        dies: None,
        cores,
        threads,
    });
    let model = c.model.as_deref().filter(|m| !m.is_empty());
    d.cpu = Some(match (host.accel, model) {
        // TCG cannot provide the host's CPU: fall back to QEMU's default model, as
        // KubeVirt does under useEmulation.
        (Accel::Tcg, None | Some("host-model" | "host-passthrough")) => Cpu {
            mode: None,
            model: None,
            topology,
        },
        (Accel::Kvm, None | Some("host-model")) => Cpu {
            mode: Some(CpuMode::HostModel),
            model: None,
            topology,
        },
        (Accel::Kvm, Some("host-passthrough")) => Cpu {
            mode: Some(CpuMode::HostPassthrough),
            model: None,
            topology,
        },
        (_, Some(name)) => Cpu {
            mode: Some(CpuMode::Custom),
            model: Some(CpuModel {
                fallback: Some("allow".into()),
                name: name.to_string(),
            }),
            topology,
        },
    });
    Ok(())
}

fn firmware(spec: &DomainSpec, host: &HostFacts, d: &mut Domain) -> Result<(), ConvertError> {
    let machine = spec
        .machine
        .as_ref()
        .and_then(|m| m.type_.clone())
        .unwrap_or_else(|| "q35".into());
    d.os.type_ = OsType {
        arch: (!host.arch.is_empty()).then(|| host.arch.clone()),
        machine: Some(machine),
        value: "hvm".into(),
    };
    let Some(fw) = spec.firmware.as_ref() else {
        return Ok(());
    };
    if let Some(bl) = &fw.bootloader {
        if let Some(efi) = &bl.efi {
            // KubeVirt keeps a persistent variable store on a backend-storage claim (its
            // VMPersistentState feature); here the store lives and dies with the pod, so
            // asking to keep it is refused rather than silently lost at the next start.
            if efi.persistent == Some(true) {
                return Err(ConvertError::Unsupported {
                    field: "spec.domain.firmware.bootloader.efi.persistent".into(),
                    value: "true".into(),
                });
            }
            // libvirt picks OVMF from the QEMU firmware descriptors (Debian's `ovmf`); the
            // features make it pick the build asked for rather than the first one listed,
            // which on Debian is the Secure Boot build with Microsoft's keys enrolled. The
            // variable store is libvirt's per-domain NVRAM file, made from the descriptor's
            // template at `host.nvram` (the launcher's work directory): per pod, as
            // KubeVirt's without `persistent`.
            let secure = secure_boot(spec);
            d.os.firmware = Some("efi".into());
            d.os.firmware_features = Some(FirmwareFeatures {
                features: if secure {
                    vec![
                        FirmwareFeature::new("secure-boot", true),
                        FirmwareFeature::new("enrolled-keys", true),
                    ]
                } else {
                    vec![FirmwareFeature::new("secure-boot", false)]
                },
            });
            d.os.nvram = host.nvram.as_deref().map(path_str);
            if secure {
                // Secure Boot's firmware keeps its variables writable by SMM only: the
                // loader is marked secure, and `features` turns SMM on.
                d.os.loader = Some(Loader {
                    secure: Some("yes".into()),
                });
            }
        } else if bl.bios.as_ref().and_then(|b| b.use_serial) == Some(true) {
            d.os.bios = Some(Bios {
                useserial: Some("yes".into()),
            });
        }
    }
    if let Some(kb) = &fw.kernel_boot {
        let wants_files = kb
            .container
            .as_ref()
            .is_some_and(|c| c.kernel_path.is_some() || c.initrd_path.is_some());
        let files = host.kernel_boot.as_ref();
        if wants_files && files.is_none_or(|f| f.kernel.is_none() && f.initrd.is_none()) {
            return Err(ConvertError::KernelBootNotPrepared);
        }
        if let Some(f) = files {
            d.os.kernel = f.kernel.as_deref().map(path_str);
            d.os.initrd = f.initrd.as_deref().map(path_str);
        }
        d.os.cmdline = kb.kernel_args.clone().filter(|a| !a.is_empty());
    }
    Ok(())
}

/// Whether the VMI boots UEFI with Secure Boot (`efi.secureBoot: true`; unset is off here,
/// where KubeVirt defaults it on and then refuses a VMI without SMM).
fn secure_boot(spec: &DomainSpec) -> bool {
    spec.firmware
        .as_ref()
        .and_then(|f| f.bootloader.as_ref())
        .and_then(|b| b.efi.as_ref())
        .is_some_and(|e| e.secure_boot == Some(true))
}

fn features(spec: &DomainSpec, d: &mut Domain) {
    let f = spec.features.as_ref();
    let on = |s: Option<&vmi::FeatureState>, default: bool| {
        s.map_or(default, |s| s.enabled.unwrap_or(true))
    };
    // ACPI is on unless switched off: graceful shutdown depends on the power button.
    d.features = Some(Features {
        acpi: on(f.and_then(|f| f.acpi.as_ref()), true).then(Empty::default),
        apic: on(f.and_then(|f| f.apic.as_ref()), true).then(Empty::default),
        // Secure Boot's OVMF needs SMM (KubeVirt refuses Secure Boot without it, libvirt
        // too): on for it whatever `features.smm` says.
        smm: (on(f.and_then(|f| f.smm.as_ref()), false) || secure_boot(spec))
            .then(|| Smm { state: "on".into() }),
    });
}

fn clock(spec: &DomainSpec, d: &mut Domain) {
    let c = spec.clock.as_ref();
    d.clock = Some(
        match (
            c.and_then(|c| c.utc.as_ref()),
            c.and_then(|c| c.timezone.as_ref()),
        ) {
            (_, Some(tz)) => Clock {
                offset: "timezone".into(),
                adjustment: None,
                basis: None,
                timezone: Some(tz.clone()),
            },
            (Some(utc), None) if utc.offset_seconds.unwrap_or(0) != 0 => Clock {
                offset: "variable".into(),
                adjustment: utc.offset_seconds,
                basis: Some("utc".into()),
                timezone: None,
            },
            _ => Clock {
                offset: "utc".into(),
                adjustment: None,
                basis: None,
                timezone: None,
            },
        },
    );
}

fn bus_of(b: Option<vmi::DiskBus>, default: Bus) -> Bus {
    match b {
        None => default,
        Some(vmi::DiskBus::Virtio) => Bus::Virtio,
        Some(vmi::DiskBus::Sata) => Bus::Sata,
        Some(vmi::DiskBus::Scsi) => Bus::Scsi,
        Some(vmi::DiskBus::Usb) => Bus::Usb,
    }
}

/// `vda`, …, `vdz`, `vdaa`, … like the kernel names them.
fn device_name(prefix: &str, mut index: usize) -> String {
    let mut suffix = Vec::new();
    loop {
        suffix.push(b'a' + (index % 26) as u8);
        if index < 26 {
            break;
        }
        index = index / 26 - 1;
    }
    suffix.reverse();
    format!("{prefix}{}", String::from_utf8_lossy(&suffix))
}

/// The cache mode of a disk: the one asked for, else `none` (no host page cache: the
/// guest's own cache suffices, the launcher pod's memory is not filled with its disk,
/// and a write the guest saw complete is on the storage) where the file opens with
/// `O_DIRECT`, else `writethrough`, as KubeVirt defaults it. `None` when `none` is asked
/// for and cannot be had.
fn cache_mode(asked: Option<vmi::DiskCache>, direct_io: bool) -> Option<CacheMode> {
    match asked {
        Some(vmi::DiskCache::Writethrough) => Some(CacheMode::Writethrough),
        Some(vmi::DiskCache::Writeback) => Some(CacheMode::Writeback),
        Some(vmi::DiskCache::None) => direct_io.then_some(CacheMode::None),
        None if direct_io => Some(CacheMode::None),
        None => Some(CacheMode::Writethrough),
    }
}

fn disks(
    vmi_spec: &vmi::VirtualMachineInstanceSpec,
    host: &HostFacts,
    d: &mut Domain,
) -> Result<(), ConvertError> {
    let volumes: BTreeMap<&str, &vmi::Volume> = vmi_spec
        .volumes
        .iter()
        .flatten()
        .map(|v| (v.name.as_str(), v))
        .collect();
    let mut per_prefix: BTreeMap<&'static str, usize> = BTreeMap::new();
    for (i, disk) in vmi_spec.domain.devices.disks.iter().flatten().enumerate() {
        let Some(volume) = volumes.get(disk.name.as_str()) else {
            return Err(ConvertError::VolumeNotFound {
                disk: disk.name.clone(),
            });
        };
        // A hotplugged volume is not the pod's: virt-handler plugs it into the running
        // guest once its attachment pod has it on the node (hotplug_disk).
        if kubevirt_api::hotplug::is_hotpluggable(volume) {
            continue;
        }
        let prepared =
            host.volumes
                .get(&disk.name)
                .ok_or_else(|| ConvertError::VolumeNotPrepared {
                    volume: disk.name.clone(),
                })?;
        let (_, bus, _) = disk_kind(i, disk)?;
        let prefix = dev_prefix(bus);
        let idx = per_prefix.entry(prefix).or_insert(0);
        let dev = device_name(prefix, *idx);
        *idx += 1;
        d.devices
            .disk
            .push(disk_element(i, disk, volume, prepared, dev)?);
    }
    // libvirt adds a USB controller on x86 unless told otherwise; without USB disks it only
    // costs boot time and memory (KubeVirt disables it the same way).
    if !d
        .devices
        .disk
        .iter()
        .any(|disk| disk.target.bus == Bus::Usb)
    {
        d.devices.controller.push(Controller {
            type_: "usb".into(),
            index: Some(0),
            model: Some("none".into()),
            ports: None,
        });
    }
    // Always there, as in KubeVirt: `virtctl addvolume` plugs SCSI disks by default, and
    // a controller cannot be added to a running q35 guest without a free PCIe port.
    d.devices.controller.push(Controller {
        type_: "scsi".into(),
        index: Some(0),
        model: Some("virtio-scsi".into()),
        ports: None,
    });
    Ok(())
}

fn dev_prefix(bus: Bus) -> &'static str {
    match bus {
        Bus::Virtio => "vd",
        Bus::Sata | Bus::Scsi | Bus::Usb => "sd",
    }
}

/// The device kind, bus and read-only flag `disk` asks for.
fn disk_kind(i: usize, disk: &vmi::Disk) -> Result<(DiskDevice, Bus, bool), ConvertError> {
    if let Some(c) = &disk.cdrom {
        Ok((DiskDevice::Cdrom, bus_of(c.bus, Bus::Sata), true))
    } else if disk.lun.is_some() {
        Err(ConvertError::Unsupported {
            field: format!("spec.domain.devices.disks[{i}].lun"),
            value: disk.name.clone(),
        })
    } else {
        let t = disk.disk.clone().unwrap_or_default();
        Ok((
            DiskDevice::Disk,
            bus_of(t.bus, Bus::Virtio),
            t.readonly.unwrap_or(false),
        ))
    }
}

/// The `<disk>` of VMI disk `disk` (the `i`th) on `volume`, prepared as `prepared`, as
/// guest device `dev`.
fn disk_element(
    i: usize,
    disk: &vmi::Disk,
    volume: &vmi::Volume,
    prepared: &PreparedVolume,
    dev: String,
) -> Result<Disk, ConvertError> {
    let (device, bus, readonly) = disk_kind(i, disk)?;
    // A claim mounted read-only (persistentVolumeClaim.readOnly) cannot take writes.
    let readonly = readonly
        || volume
            .persistent_volume_claim
            .as_ref()
            .and_then(|p| p.read_only)
            == Some(true);
    let io = match disk.io.as_deref() {
        None => None,
        Some("native") => Some(IoMode::Native),
        Some("threads") => Some(IoMode::Threads),
        Some(other) => {
            return Err(ConvertError::Unsupported {
                field: format!("spec.domain.devices.disks[{i}].io"),
                value: other.into(),
            });
        }
    };
    let path = path_str(&prepared.path);
    let cache = cache_mode(disk.cache, prepared.direct_io).ok_or_else(|| {
        ConvertError::DirectIoUnsupported {
            field: format!("spec.domain.devices.disks[{i}].cache"),
            path: path.clone(),
        }
    })?;
    // Without the page cache, native AIO is QEMU's faster path for a block device
    // (KubeVirt's choice too; for files it leaves threads, as sparse files can block).
    let io = io.or(
        (cache == CacheMode::None && prepared.kind == DiskType::Block).then_some(IoMode::Native),
    );
    Ok(Disk {
        type_: prepared.kind,
        device,
        driver: DiskDriver {
            name: "qemu".into(),
            format: prepared.format,
            cache: Some(cache),
            io,
            error_policy: disk.error_policy.clone(),
        },
        source: match prepared.kind {
            DiskType::File => DiskSource {
                file: Some(path),
                dev: None,
            },
            DiskType::Block => DiskSource {
                file: None,
                dev: Some(path),
            },
        },
        target: DiskTarget { dev, bus },
        boot: disk.boot_order.map(|order| Boot { order }),
        readonly: readonly.then(Empty::default),
        shareable: disk.shareable.unwrap_or(false).then(Empty::default),
        serial: disk.serial.clone(),
        alias: Some(Alias {
            name: format!("ua-{}", disk.name),
        }),
    })
}

/// The `<disk>` that plugs hotplugged volume `volume` (its disk `disk`, its image prepared
/// as `prepared`) into a running guest whose disks already use the device names `taken`:
/// the first free name of its bus. Only disks and virtio/SCSI buses can be hotplugged.
pub fn hotplug_disk(
    disk: &vmi::Disk,
    volume: &vmi::Volume,
    prepared: &PreparedVolume,
    taken: &[String],
) -> Result<Disk, ConvertError> {
    let (device, bus, _) = disk_kind(0, disk)?;
    if device != DiskDevice::Disk || !matches!(bus, Bus::Scsi | Bus::Virtio) {
        return Err(ConvertError::Unsupported {
            field: format!("hotplugged disk {}", disk.name),
            value: "only a disk on the scsi or virtio bus can be hotplugged".into(),
        });
    }
    let prefix = dev_prefix(bus);
    let dev = (0..)
        .map(|i| device_name(prefix, i))
        .find(|d| !taken.contains(d))
        .unwrap_or_default();
    let mut d = disk_element(0, disk, volume, prepared, dev)?;
    d.boot = None;
    Ok(d)
}

fn interfaces(spec: &DomainSpec, host: &HostFacts, d: &mut Domain) -> Result<(), ConvertError> {
    if host.network == NetworkMode::None {
        return Ok(());
    }
    for (i, iface) in spec.devices.interfaces.iter().flatten().enumerate() {
        if iface.sriov.is_some() || iface.binding.is_some() {
            return Err(ConvertError::Unsupported {
                field: format!("spec.domain.devices.interfaces[{i}]"),
                value: "sriov/binding plugin".into(),
            });
        }
        let model = match iface.model.as_deref() {
            None | Some("virtio") => NetModel::Virtio,
            Some("e1000") => NetModel::E1000,
            Some("e1000e") => NetModel::E1000e,
            Some("rtl8139") => NetModel::Rtl8139,
            Some(other) => {
                return Err(ConvertError::Unsupported {
                    field: format!("spec.domain.devices.interfaces[{i}].model"),
                    value: other.into(),
                });
            }
        };
        let spec_mac = iface.mac_address.as_ref().map(|m| Mac {
            address: m.to_lowercase().replace('-', ":"),
        });
        let (type_, mac, target, mtu) = match host.network {
            NetworkMode::Pod => {
                // Only the pod network is realised on a node; secondary (Multus) networks
                // are refused at the API.
                let tap = host
                    .pod_tap
                    .as_ref()
                    .filter(|t| t.interface == iface.name)
                    .ok_or_else(|| ConvertError::Unsupported {
                        field: format!("spec.domain.devices.interfaces[{i}]"),
                        value: format!("{}: not on the pod network", iface.name),
                    })?;
                (
                    InterfaceType::Ethernet,
                    Some(Mac {
                        address: tap.mac.clone(),
                    }),
                    Some(InterfaceTarget {
                        dev: tap.device.clone(),
                        managed: "no".into(),
                    }),
                    Some(Mtu { size: tap.mtu }),
                )
            }
            _ => (InterfaceType::User, spec_mac, None, None),
        };
        d.devices.interface.push(Interface {
            type_,
            mac,
            target,
            model: Some(Model { type_: model }),
            mtu,
            boot: iface.boot_order.map(|order| Boot { order }),
            alias: Some(Alias {
                name: format!("ua-{}", iface.name),
            }),
        });
    }
    Ok(())
}

fn console(spec: &DomainSpec, host: &HostFacts, d: &mut Domain) {
    if spec.devices.autoattach_serial_console == Some(false) {
        return;
    }
    let (type_, source) = match &host.console_socket {
        Some(p) => (
            CharType::Unix,
            Some(CharSource {
                mode: Some("bind".into()),
                path: Some(path_str(p)),
            }),
        ),
        None => (CharType::Pty, None),
    };
    d.devices.serial.push(Serial {
        type_,
        source,
        target: Some(CharTarget {
            type_: Some("isa-serial".into()),
            port: Some(0),
        }),
        log: host.console_log.as_deref().map(|p| CharLog {
            file: path_str(p),
            append: Some("on".into()),
        }),
        alias: Some(Alias {
            name: "serial0".into(),
        }),
    });
}

/// The QEMU guest agent's channel, on every domain as KubeVirt does: whether the guest
/// runs an agent is only known once it opens the port. The socket has no path, so libvirt
/// places it in its own per-domain state directory: the XML names nothing of this
/// launcher, libvirt leaves its own path out of the migratable XML, and a migration
/// target picks its own.
///
/// Its virtio-serial controller gets only the ports the channels need: libvirt's default is
/// QEMU's 31 ports, 64 virtqueues, and that device alone cost 5–10 % of random 4 KiB IOPS on
/// an unrelated virtio disk under TCG (measured apart against bare QEMU: docs/benchmarks.md,
/// storage). Port 0 is reserved for a console, so the channels start at port 1. A migration
/// keeps the source's count (the target runs the source's migratable XML).
fn guest_agent_channel(d: &mut Domain) {
    d.devices.channel.push(Channel {
        type_: CharType::Unix,
        source: Some(CharSource {
            mode: Some("bind".into()),
            path: None,
        }),
        target: ChannelTarget {
            type_: "virtio".into(),
            name: Some(GUEST_AGENT_CHANNEL.into()),
            state: None,
        },
    });
    let ports = u32::try_from(d.devices.channel.len()).unwrap_or(u32::MAX - 1) + 1;
    d.devices.controller.push(Controller {
        type_: "virtio-serial".into(),
        index: Some(0),
        model: None,
        ports: Some(ports),
    });
}

fn graphics(spec: &DomainSpec, host: &HostFacts, d: &mut Domain) {
    let Some(sock) = &host.vnc_socket else { return };
    if spec.devices.autoattach_graphics_device == Some(false) {
        return;
    }
    d.devices.graphics.push(Graphics {
        type_: GraphicsType::Vnc,
        listen: Some(GraphicsListen {
            type_: "socket".into(),
            socket: Some(path_str(sock)),
        }),
    });
    d.devices.video.push(Video {
        model: VideoModel {
            type_: "vga".into(),
            heads: Some(1),
        },
    });
}

/// KubeVirt's default `memBalloonStatsPeriod` (seconds).
pub const BALLOON_STATS_PERIOD_SECONDS: u32 = 10;

fn misc_devices(spec: &DomainSpec, d: &mut Domain) {
    let balloon = spec.devices.autoattach_mem_balloon != Some(false);
    // Without an explicit element libvirt adds a balloon on x86; say "none" to really omit it.
    d.devices.memballoon = Some(MemBalloon {
        model: if balloon { "virtio" } else { "none" }.into(),
        // KubeVirt's default `memBalloonStatsPeriod`: without a period the guest never
        // reports its memory, and `kubevirt_vmi_memory_{available,usable,unused}_bytes`
        // have nothing to say.
        stats: balloon.then_some(BalloonStatsPeriod {
            period: BALLOON_STATS_PERIOD_SECONDS,
        }),
    });
    if spec.devices.rng.is_some() {
        d.devices.rng.push(Rng {
            model: "virtio".into(),
            backend: RngBackend {
                model: "random".into(),
                path: "/dev/urandom".into(),
            },
        });
    }
    d.devices.panic = panic_devices(spec);
}

/// The VMI's panic devices; on_crash (destroy) turns a reported panic into a crashed
/// domain, so the VMI fails instead of the guest rebooting unnoticed.
fn panic_devices(spec: &DomainSpec) -> Vec<Panic> {
    spec.devices
        .panic_devices
        .iter()
        .flatten()
        .map(|p| {
            let model = match p.model.unwrap_or_default() {
                vmi::PanicDeviceModel::Isa => "isa",
                vmi::PanicDeviceModel::Hyperv => "hyperv",
                vmi::PanicDeviceModel::Pvpanic => "pvpanic",
            };
            Panic {
                model: model.into(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panic_devices_default_to_isa_and_keep_their_model() {
        let mut spec = DomainSpec::default();
        spec.devices.panic_devices = Some(vec![
            vmi::PanicDevice::default(),
            vmi::PanicDevice {
                model: Some(vmi::PanicDeviceModel::Hyperv),
            },
        ]);
        let panics = panic_devices(&spec);
        let models: Vec<&str> = panics.iter().map(|p| p.model.as_str()).collect();
        assert_eq!(models, ["isa", "hyperv"]);
        // None asked for, none added: a panic then reboots the guest as before.
        assert!(panic_devices(&DomainSpec::default()).is_empty());
    }

    /// EFI asks libvirt's firmware autoselection for the build the VMI wants: without
    /// Secure Boot explicitly (Debian lists the Secure Boot build with enrolled keys
    /// first), with it the enrolled build, a secure loader and SMM.
    #[test]
    fn efi_selects_the_firmware_build_by_secure_boot() {
        let render =
            |secure_boot: Option<bool>, persistent: Option<bool>| -> Result<String, ConvertError> {
                let spec = DomainSpec {
                    firmware: Some(vmi::Firmware {
                        bootloader: Some(vmi::Bootloader {
                            efi: Some(vmi::Efi {
                                secure_boot,
                                persistent,
                            }),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                };
                let mut d = Domain {
                    type_: DomainType::Qemu,
                    name: "n".into(),
                    uuid: None,
                    memory: SizedValue::kib(1),
                    current_memory: None,
                    vcpu: Vcpu {
                        placement: None,
                        current: None,
                        count: 1,
                    },
                    os: Os::default(),
                    features: None,
                    cpu: None,
                    clock: None,
                    on_poweroff: None,
                    on_reboot: None,
                    on_crash: None,
                    devices: Devices::default(),
                };
                firmware(&spec, &HostFacts::default(), &mut d)?;
                features(&spec, &mut d);
                Ok(d.to_xml().expect("serialises"))
            };
        // A variable store kept across restarts needs storage the pod does not have.
        assert!(matches!(
            render(Some(false), Some(true)),
            Err(ConvertError::Unsupported { field, .. }) if field.ends_with("efi.persistent")
        ));
        for off in [Some(false), None] {
            let xml = render(off, Some(false)).expect("converts");
            assert!(xml.contains("<os firmware=\"efi\">"), "{xml}");
            assert!(
                xml.contains("<firmware>\n      <feature enabled=\"no\" name=\"secure-boot\"/>\n    </firmware>"),
                "{xml}"
            );
            assert!(!xml.contains("<loader") && !xml.contains("<smm"), "{xml}");
        }
        let xml = render(Some(true), None).expect("converts");
        assert!(
            xml.contains("<feature enabled=\"yes\" name=\"secure-boot\"/>")
                && xml.contains("<feature enabled=\"yes\" name=\"enrolled-keys\"/>")
                && xml.contains("<loader secure=\"yes\"/>")
                && xml.contains("<smm state=\"on\"/>"),
            "{xml}"
        );
    }

    #[test]
    fn every_domain_has_a_guest_agent_channel_without_a_path() {
        let mut d = Domain {
            type_: DomainType::Qemu,
            name: "n".into(),
            uuid: None,
            memory: SizedValue::kib(1),
            current_memory: None,
            vcpu: Vcpu {
                placement: None,
                current: None,
                count: 1,
            },
            os: Os::default(),
            features: None,
            cpu: None,
            clock: None,
            on_poweroff: None,
            on_reboot: None,
            on_crash: None,
            devices: Devices::default(),
        };
        guest_agent_channel(&mut d);
        let xml = d.to_xml().expect("serialises");
        assert!(
            xml.contains(
                "<channel type=\"unix\">\n      <source mode=\"bind\"/>\n      \
                 <target type=\"virtio\" name=\"org.qemu.guest_agent.0\"/>\n    </channel>"
            ),
            "{xml}"
        );
        // Its controller has port 0 (reserved for a console) and the channel's, not 31.
        assert!(
            xml.contains("<controller type=\"virtio-serial\" index=\"0\" ports=\"2\"/>"),
            "{xml}"
        );
    }

    #[test]
    fn device_names_follow_the_kernel() {
        assert_eq!(device_name("vd", 0), "vda");
        assert_eq!(device_name("vd", 25), "vdz");
        assert_eq!(device_name("vd", 26), "vdaa");
        assert_eq!(device_name("sd", 27), "sdab");
    }
}
