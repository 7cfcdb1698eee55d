//! Defaulting, as KubeVirt's mutating webhooks do it, as pure functions. The API server
//! calls these on create, so every consumer sees the same defaulted objects.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::migration::VirtualMachineInstanceMigration;
use crate::vm::{RunStrategy, VirtualMachine};
use crate::vmi::{
    Cpu, DiskBus, DiskTarget, Firmware, Interface, InterfaceBinding, Machine, Memory, Network,
    PodNetwork, VirtualMachineInstance, VirtualMachineInstanceSpec,
};

/// Default grace period between the ACPI power-button press and a forced stop (KubeVirt's).
pub const DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS: i64 = 180;
/// Default machine type.
pub const DEFAULT_MACHINE_TYPE: &str = "q35";
/// Name of the network and interface added when a VMI lists none.
pub const DEFAULT_NETWORK_NAME: &str = "default";

/// Namespace for name-derived firmware UUIDs, so a VMI keeps its SMBIOS UUID across restarts.
const FIRMWARE_UUID_NAMESPACE: uuid::Uuid = uuid::Uuid::from_bytes([
    0x6a, 0x1a, 0x24, 0xa1, 0x48, 0x84, 0x4a, 0x1b, 0x9e, 0x4f, 0x3d, 0x2c, 0x5b, 0x7e, 0x11, 0x90,
]);

/// Defaults a VirtualMachine: a VM with neither `running` nor `runStrategy` is Halted.
pub fn default_vm(vm: &mut VirtualMachine) {
    if vm.spec.running.is_none() && vm.spec.run_strategy.is_none() {
        vm.spec.run_strategy = Some(RunStrategy::Halted);
    }
    // KubeVirt's mutating webhook: a reference by name without a kind is to the cluster-wide
    // kind (one inferred from a volume gets its kind from the claim's label).
    for (matcher, kind) in [
        (
            &mut vm.spec.instancetype,
            "VirtualMachineClusterInstancetype",
        ),
        (&mut vm.spec.preference, "VirtualMachineClusterPreference"),
    ] {
        if let Some(m) = matcher
            && m.kind.as_deref().is_none_or(str::is_empty)
            && m.infer_from_volume.as_deref().is_none_or(str::is_empty)
        {
            m.kind = Some(kind.into());
        }
    }
}

/// Defaults a VirtualMachineInstance.
pub fn default_vmi(vmi: &mut VirtualMachineInstance) {
    let name = vmi.metadata.name.clone().unwrap_or_default();
    default_vmi_spec(&mut vmi.spec, &name);
}

/// Defaults a migration (nothing yet; kept so every kind has the same hooks).
pub fn default_migration(_m: &mut VirtualMachineInstanceMigration) {}

/// Adds the pod network and a masquerade interface on it when the spec lists neither
/// networks nor interfaces and does not turn `autoattachPodInterface` off (KubeVirt's
/// `SetDefaultNetworkInterface` with its default binding).
pub fn default_network_interface(spec: &mut VirtualMachineInstanceSpec) {
    let devices = &mut spec.domain.devices;
    let no_interfaces = devices.interfaces.as_ref().is_none_or(|i| i.is_empty());
    let no_networks = spec.networks.as_ref().is_none_or(|n| n.is_empty());
    if no_interfaces && no_networks && devices.autoattach_pod_interface != Some(false) {
        spec.networks = Some(vec![Network {
            name: DEFAULT_NETWORK_NAME.to_string(),
            pod: Some(PodNetwork::default()),
            multus: None,
        }]);
        devices.interfaces = Some(vec![Interface {
            name: DEFAULT_NETWORK_NAME.to_string(),
            masquerade: Some(InterfaceBinding::default()),
            ..Interface::default()
        }]);
    }
}

/// Adds a disk (bus left to the defaults, or to a preference) for each volume no disk names
/// (KubeVirt's `SetDefaultVolumeDisk`, which its VM controller runs before it applies an
/// instance type and preference).
pub fn default_volume_disks(spec: &mut VirtualMachineInstanceSpec) {
    let missing: Vec<String> = spec
        .volumes
        .iter()
        .flatten()
        .filter(|v| {
            !spec
                .domain
                .devices
                .disks
                .iter()
                .flatten()
                .any(|d| d.name == v.name)
        })
        .map(|v| v.name.clone())
        .collect();
    if missing.is_empty() {
        return;
    }
    let disks = spec.domain.devices.disks.get_or_insert_with(Vec::new);
    disks.extend(missing.into_iter().map(|name| crate::vmi::Disk {
        name,
        ..Default::default()
    }));
}

/// Defaults a VMI spec; `name` seeds the firmware UUID.
pub fn default_vmi_spec(spec: &mut VirtualMachineInstanceSpec, name: &str) {
    if spec.termination_grace_period_seconds.is_none() {
        spec.termination_grace_period_seconds = Some(DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS);
    }
    let domain = &mut spec.domain;
    if domain
        .machine
        .as_ref()
        .and_then(|m| m.type_.as_ref())
        .is_none()
    {
        domain.machine = Some(Machine {
            type_: Some(DEFAULT_MACHINE_TYPE.to_string()),
        });
    }
    let cpu = domain.cpu.get_or_insert_with(Cpu::default);
    cpu.cores.get_or_insert(1);
    cpu.sockets.get_or_insert(1);
    cpu.threads.get_or_insert(1);

    // The guest sees the requested memory unless told otherwise (KubeVirt's rule).
    let has_guest = domain.memory.as_ref().is_some_and(|m| m.guest.is_some());
    if !has_guest {
        let res = domain.resources.as_ref();
        let from = res
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("memory"))
            .or_else(|| {
                res.and_then(|r| r.limits.as_ref())
                    .and_then(|l| l.get("memory"))
            })
            .cloned();
        if let Some(q) = from {
            domain.memory.get_or_insert_with(Memory::default).guest = Some(Quantity(q.0));
        }
    }

    let firmware = domain.firmware.get_or_insert_with(Firmware::default);
    if firmware.uuid.is_none() {
        firmware.uuid =
            Some(uuid::Uuid::new_v5(&FIRMWARE_UUID_NAMESPACE, name.as_bytes()).to_string());
    }

    for disk in domain.devices.disks.iter_mut().flatten() {
        if disk.disk.is_none() && disk.cdrom.is_none() && disk.lun.is_none() {
            disk.disk = Some(DiskTarget::default());
        }
        if let Some(t) = disk.disk.as_mut() {
            t.bus.get_or_insert(DiskBus::Virtio);
        }
        if let Some(t) = disk.cdrom.as_mut() {
            t.bus.get_or_insert(DiskBus::Sata);
            t.readonly.get_or_insert(true);
        }
        if let Some(t) = disk.lun.as_mut() {
            t.bus.get_or_insert(DiskBus::Scsi);
        }
    }

    default_network_interface(spec);
    for iface in spec.domain.devices.interfaces.iter_mut().flatten() {
        let has_binding = iface.bridge.is_some()
            || iface.masquerade.is_some()
            || iface.sriov.is_some()
            || iface.passt_binding.is_some()
            || iface.binding.is_some();
        if !has_binding {
            iface.bridge = Some(InterfaceBinding::default());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vmi::Disk;

    #[test]
    fn vm_without_strategy_is_halted() {
        let mut vm = VirtualMachine::new("a", Default::default());
        default_vm(&mut vm);
        assert_eq!(vm.spec.run_strategy, Some(RunStrategy::Halted));
        let mut running = VirtualMachine::new("b", Default::default());
        running.spec.running = Some(true);
        default_vm(&mut running);
        assert_eq!(
            running.spec.run_strategy, None,
            "the deprecated field is kept as written"
        );
    }

    #[test]
    fn vmi_defaults_fill_topology_memory_disks_and_network() {
        let mut spec = VirtualMachineInstanceSpec::default();
        spec.domain.resources = Some(crate::vmi::ResourceRequirements {
            requests: Some([("memory".to_string(), Quantity("64Mi".into()))].into()),
            ..Default::default()
        });
        spec.domain.devices.disks = Some(vec![Disk {
            name: "root".into(),
            ..Default::default()
        }]);
        default_vmi_spec(&mut spec, "vmi1");
        assert_eq!(
            spec.domain.memory.as_ref().unwrap().guest,
            Some(Quantity("64Mi".into()))
        );
        assert_eq!(spec.domain.cpu.as_ref().unwrap().cores, Some(1));
        let disk = &spec.domain.devices.disks.as_ref().unwrap()[0];
        assert_eq!(disk.disk.as_ref().unwrap().bus, Some(DiskBus::Virtio));
        assert_eq!(spec.networks.as_ref().unwrap()[0].name, "default");
        assert!(
            spec.domain.devices.interfaces.as_ref().unwrap()[0]
                .masquerade
                .is_some()
        );
        assert_eq!(spec.termination_grace_period_seconds, Some(180));
        let uuid1 = spec.domain.firmware.as_ref().unwrap().uuid.clone();
        let mut again = VirtualMachineInstanceSpec::default();
        default_vmi_spec(&mut again, "vmi1");
        assert_eq!(
            again.domain.firmware.unwrap().uuid,
            uuid1,
            "UUID is stable for a name"
        );
    }
}
