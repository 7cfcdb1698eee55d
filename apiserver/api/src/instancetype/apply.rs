//! Applying an instance type and a preference to a VMI spec, as KubeVirt does (pure).
//!
//! An instance type's values are the VM's: a VM that sets one of them itself is refused,
//! each such field named with KubeVirt's message ("VM field(s) … conflicts with selected
//! instance type"), every conflict at once. A preference only fills what the VM leaves
//! unset. Where kubevirt-rs departs from KubeVirt, on purpose:
//! - resource *limits* are the launcher pod's, not the guest's, so a VM may set them (a
//!   namespace quota may demand them, kubevirt/kubevirt#12720); only a memory limit below
//!   the instance type's guest memory is refused, since the pod could never hold the guest;
//! - `domain.memory.hugepages` conflicts only when the instance type sets huge pages too (KubeVirt
//!   refuses any `domain.memory`, kubevirt/kubevirt#14685); `memory.guest` and `maxGuest`
//!   still conflict, they are the instance type's;
//! - an instance type field kubevirt-rs cannot carry to a VMI (NUMA, realtime, an isolated
//!   emulator thread, GPUs, host devices, launch security) refuses the VM, naming it,
//!   instead of starting a guest without it.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::Deserialize;

use super::{
    PreferredCpuTopology, SpreadAcross, VirtualMachineInstancetypeSpec,
    VirtualMachinePreferenceSpec,
};
use crate::quantity;
use crate::validation::{ErrorType, FieldError};
use crate::vmi::{
    Bios, Bootloader, Clock, ClockOffsetUtc, Cpu, DiskTarget, Features, Firmware, Machine, Memory,
    ResourceRequirements, VirtualMachineInstanceSpec,
};

/// KubeVirt's refusal of a VM field an instance type owns.
pub fn conflict(field: String) -> FieldError {
    let message = format!("VM field(s) {field} conflicts with selected instance type");
    FieldError {
        kind: ErrorType::Invalid,
        field,
        message,
    }
}

fn unsupported(field: &str) -> FieldError {
    FieldError {
        kind: ErrorType::Forbidden,
        field: "spec.instancetype".into(),
        message: format!(
            "the instance type sets {field}, which kubevirt-rs cannot give a VirtualMachineInstance yet"
        ),
    }
}

/// The preferred vCPU layout (sockets when the preference says nothing).
pub fn preferred_topology(pref: Option<&VirtualMachinePreferenceSpec>) -> PreferredCpuTopology {
    pref.and_then(|p| p.cpu.as_ref())
        .and_then(|c| c.preferred_cpu_topology)
        .unwrap_or_default()
        .canonical()
}

/// The `spread` topology's ratio and what it spreads across (2, sockets and cores by default).
pub fn spread_options(pref: &VirtualMachinePreferenceSpec) -> (u32, SpreadAcross) {
    let options = pref.cpu.as_ref().and_then(|c| c.spread_options.as_ref());
    let ratio = options
        .and_then(|o| o.ratio)
        .or(pref.prefer_spread_socket_to_core_ratio.filter(|r| *r != 0))
        .unwrap_or(2);
    let across = options.and_then(|o| o.across).unwrap_or_default();
    (ratio, across)
}

/// The instance type's vCPUs cannot be spread as the preference asks (KubeVirt's message,
/// on `instancetype.spec.cpu.guest`).
pub fn check_spread(
    it: &VirtualMachineInstancetypeSpec,
    pref: Option<&VirtualMachinePreferenceSpec>,
) -> Option<FieldError> {
    let pref = pref?;
    if preferred_topology(Some(pref)) != PreferredCpuTopology::Spread {
        return None;
    }
    let (ratio, across) = spread_options(pref);
    let vcpus = it.cpu.guest;
    let ratio_nz = ratio.max(1);
    let message = match across {
        SpreadAcross::SocketsCores if !vcpus.is_multiple_of(ratio_nz) => format!(
            "{vcpus} vCPUs provided by the instance type are not divisible by the Spec.PreferSpreadSocketToCoreRatio or Spec.CPU.PreferSpreadOptions.Ratio of {ratio} provided by the preference"
        ),
        SpreadAcross::CoresThreads if !vcpus.is_multiple_of(ratio_nz) => format!(
            "{vcpus} vCPUs provided by the instance type are not divisible by the number of threads per core {ratio}"
        ),
        SpreadAcross::SocketsCoresThreads
            if !vcpus.is_multiple_of(2) || !(vcpus / 2).is_multiple_of(ratio_nz) =>
        {
            format!(
                "{vcpus} vCPUs provided by the instance type are not divisible by the number of threads per core 2 and Spec.PreferSpreadSocketToCoreRatio or Spec.CPU.PreferSpreadOptions.Ratio of {ratio}"
            )
        }
        _ => return None,
    };
    Some(FieldError {
        kind: ErrorType::Invalid,
        field: "instancetype.spec.cpu.guest".into(),
        message,
    })
}

/// Bytes as a Kubernetes quantity in binary units where they divide evenly.
fn binary_quantity(bytes: u64) -> Quantity {
    const UNITS: [(&str, u64); 4] = [
        ("Ti", 1 << 40),
        ("Gi", 1 << 30),
        ("Mi", 1 << 20),
        ("Ki", 1 << 10),
    ];
    for (suffix, size) in UNITS {
        if bytes >= size && bytes.is_multiple_of(size) {
            return Quantity(format!("{}{suffix}", bytes / size));
        }
    }
    Quantity(bytes.to_string())
}

/// Applies instance type `it` (and the layout of preference `pref`) to `spec` at `base`
/// (`spec.template.spec` for a VM, `spec` for a VMI), and its annotations to `annotations`.
/// Every conflict, or nothing changed.
pub fn apply_instancetype(
    base: &str,
    it: &VirtualMachineInstancetypeSpec,
    pref: Option<&VirtualMachinePreferenceSpec>,
    spec: &mut VirtualMachineInstanceSpec,
    annotations: &mut BTreeMap<String, String>,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let at = |f: &str| format!("{base}.{f}");
    for (set, field) in [
        (it.cpu.numa.is_some(), "cpu.numa"),
        (it.cpu.realtime.is_some(), "cpu.realtime"),
        (
            it.cpu.isolate_emulator_thread == Some(true),
            "cpu.isolateEmulatorThread",
        ),
        (it.gpus.as_ref().is_some_and(|g| !g.is_empty()), "gpus"),
        (
            it.host_devices.as_ref().is_some_and(|h| !h.is_empty()),
            "hostDevices",
        ),
        (it.launch_security.is_some(), "launchSecurity"),
    ] {
        if set {
            errs.push(unsupported(field));
        }
    }
    if it.node_selector.is_some() && spec.node_selector.is_some() {
        errs.push(conflict(at("nodeSelector")));
    }
    if it.scheduler_name.is_some() && spec.scheduler_name.is_some() {
        errs.push(conflict(at("schedulerName")));
    }
    let resources = spec.domain.resources.clone().unwrap_or_default();
    let has = |m: &Option<BTreeMap<String, Quantity>>, k: &str| {
        m.as_ref().is_some_and(|m| m.contains_key(k))
    };
    if has(&resources.requests, "cpu") {
        errs.push(conflict(at("domain.resources.requests.cpu")));
    }
    let cpu = spec.domain.cpu.clone().unwrap_or_default();
    for (set, field) in [
        (cpu.sockets.is_some_and(|v| v != 0), "domain.cpu.sockets"),
        (cpu.cores.is_some_and(|v| v != 0), "domain.cpu.cores"),
        (cpu.threads.is_some_and(|v| v != 0), "domain.cpu.threads"),
        (
            cpu.model.as_ref().is_some_and(|m| !m.is_empty()) && it.cpu.model.is_some(),
            "domain.cpu.model",
        ),
        (
            cpu.dedicated_cpu_placement == Some(true) && it.cpu.dedicated_cpu_placement.is_some(),
            "domain.cpu.dedicatedCPUPlacement",
        ),
        (
            cpu.max_sockets.is_some() && it.cpu.max_sockets.is_some(),
            "domain.cpu.maxSockets",
        ),
    ] {
        if set {
            errs.push(conflict(at(field)));
        }
    }
    let memory = spec.domain.memory.clone().unwrap_or_default();
    if memory.guest.is_some() {
        errs.push(conflict(at("domain.memory.guest")));
    }
    if memory.max_guest.is_some() && it.memory.max_guest.is_some() {
        errs.push(conflict(at("domain.memory.maxGuest")));
    }
    if memory.hugepages.is_some() && it.memory.hugepages.is_some() {
        errs.push(conflict(at("domain.memory.hugepages")));
    }
    if has(&resources.requests, "memory") {
        errs.push(conflict(at("domain.resources.requests.memory")));
    }
    let guest_bytes = quantity::parse_bytes(&it.memory.guest.0).unwrap_or(0);
    if let Some(limit) = resources.limits.as_ref().and_then(|l| l.get("memory"))
        && quantity::parse_bytes(&limit.0).is_ok_and(|l| l < guest_bytes)
    {
        errs.push(FieldError {
            kind: ErrorType::Invalid,
            field: at("domain.resources.limits.memory"),
            message: format!(
                "a memory limit of {} is below the selected instance type's guest memory of {}",
                limit.0, it.memory.guest.0
            ),
        });
    }
    if it.io_threads_policy.is_some() && spec.domain.io_threads_policy.is_some() {
        errs.push(conflict(at("domain.ioThreadsPolicy")));
    }
    for (k, v) in it.annotations.iter().flatten() {
        if annotations.get(k).is_some_and(|own| own != v) {
            errs.push(conflict(format!("annotations.{k}")));
        }
    }
    if !errs.is_empty() {
        return errs;
    }

    // No conflict: the instance type's values.
    if let Some(ns) = &it.node_selector {
        spec.node_selector = Some(ns.clone());
    }
    if let Some(s) = &it.scheduler_name {
        spec.scheduler_name = Some(s.clone());
    }
    let mut cpu = Cpu {
        model: cpu.model.or_else(|| it.cpu.model.clone()),
        dedicated_cpu_placement: it
            .cpu
            .dedicated_cpu_placement
            .or(cpu.dedicated_cpu_placement),
        max_sockets: it.cpu.max_sockets.or(cpu.max_sockets),
        ..cpu
    };
    let (sockets, cores, threads) = topology(it.cpu.guest, pref);
    cpu.sockets = Some(sockets);
    cpu.cores = Some(cores);
    cpu.threads = Some(threads);
    spec.domain.cpu = Some(cpu);
    let mut memory = Memory {
        guest: Some(it.memory.guest.clone()),
        ..memory
    };
    if let Some(h) = &it.memory.hugepages {
        memory.hugepages = Some(h.clone());
    }
    if let Some(m) = &it.memory.max_guest {
        memory.max_guest = Some(m.clone());
    }
    spec.domain.memory = Some(memory);
    if let Some(percent) = it.memory.overcommit_percent.filter(|p| *p > 0) {
        // KubeVirt's arithmetic: the pod requests the guest memory less the percentage.
        let request = (guest_bytes as f64 * (1.0 - f64::from(percent) / 100.0)) as u64;
        let mut resources: ResourceRequirements = spec.domain.resources.clone().unwrap_or_default();
        resources
            .requests
            .get_or_insert_with(BTreeMap::new)
            .insert("memory".into(), binary_quantity(request));
        spec.domain.resources = Some(resources);
    }
    if let Some(p) = &it.io_threads_policy {
        spec.domain.io_threads_policy = Some(p.clone());
    }
    for (k, v) in it.annotations.iter().flatten() {
        annotations.entry(k.clone()).or_insert_with(|| v.clone());
    }
    Vec::new()
}

/// The instance type's vCPUs as (sockets, cores, threads), laid out as the preference says.
pub fn topology(vcpus: u32, pref: Option<&VirtualMachinePreferenceSpec>) -> (u32, u32, u32) {
    if vcpus <= 1 {
        return (1, 1, 1);
    }
    match preferred_topology(pref) {
        PreferredCpuTopology::Cores => (1, vcpus, 1),
        PreferredCpuTopology::Threads => (1, 1, vcpus),
        PreferredCpuTopology::Spread => {
            let (ratio, across) = pref
                .map(spread_options)
                .unwrap_or((2, SpreadAcross::SocketsCores));
            let ratio = ratio.max(1);
            match across {
                SpreadAcross::SocketsCores => (vcpus / ratio, ratio, 1),
                SpreadAcross::CoresThreads => (1, vcpus / ratio, ratio),
                SpreadAcross::SocketsCoresThreads => (vcpus / 2 / ratio, ratio, 2),
            }
        }
        _ => (vcpus, 1, 1),
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ClockOffset {
    utc: Option<ClockOffsetUtc>,
    timezone: Option<String>,
}

/// Fills what `spec` leaves unset from preference `pref` (and its annotations into
/// `annotations`, the VM's own winning). Preferences for devices kubevirt-rs does not model
/// (Hyper-V, timers, TPM, input devices, sound) are left out.
pub fn apply_preference(
    pref: &VirtualMachinePreferenceSpec,
    spec: &mut VirtualMachineInstanceSpec,
    annotations: &mut BTreeMap<String, String>,
) {
    apply_device_preferences(pref, spec);
    apply_other_preferences(pref, spec, annotations);
}

/// The device part of [`apply_preference`]. virt-controller applies it once more before it
/// adds the default disks and pod interface (KubeVirt's order), so `autoattach*`
/// preferences decide whether those are added and the added ones get the preferred bus and
/// model.
pub fn apply_device_preferences(
    pref: &VirtualMachinePreferenceSpec,
    spec: &mut VirtualMachineInstanceSpec,
) {
    if let Some(d) = &pref.devices {
        let devices = &mut spec.domain.devices;
        fill(
            &mut devices.autoattach_graphics_device,
            d.preferred_autoattach_graphics_device,
        );
        fill(
            &mut devices.autoattach_mem_balloon,
            d.preferred_autoattach_mem_balloon,
        );
        fill(
            &mut devices.autoattach_pod_interface,
            d.preferred_autoattach_pod_interface,
        );
        fill(
            &mut devices.autoattach_serial_console,
            d.preferred_autoattach_serial_console,
        );
        fill(
            &mut devices.block_multi_queue,
            d.preferred_block_multi_queue,
        );
        fill(
            &mut devices.network_interface_multiqueue,
            d.preferred_network_interface_multi_queue,
        );
        if devices.rng.is_none() {
            devices.rng = d.preferred_rng.clone();
        }
        for disk in devices.disks.iter_mut().flatten() {
            if disk.disk.is_none() && disk.cdrom.is_none() && disk.lun.is_none() {
                disk.disk = Some(DiskTarget::default());
            }
            if let Some(target) = &mut disk.disk {
                fill(&mut target.bus, d.preferred_disk_bus);
                if disk.cache.is_none() {
                    disk.cache = d.preferred_disk_cache;
                }
                if disk.io.is_none() {
                    disk.io = d.preferred_disk_io.clone();
                }
                if disk.dedicated_io_thread.is_none()
                    && target.bus.unwrap_or_default() == crate::vmi::DiskBus::Virtio
                {
                    disk.dedicated_io_thread = d.preferred_disk_dedicated_io_thread;
                }
            } else if let Some(target) = &mut disk.cdrom {
                fill(&mut target.bus, d.preferred_cdrom_bus);
            } else if let Some(target) = &mut disk.lun {
                fill(&mut target.bus, d.preferred_lun_bus);
            }
        }
        let pod_networks: Vec<String> = spec
            .networks
            .iter()
            .flatten()
            .filter(|n| n.pod.is_some())
            .map(|n| n.name.clone())
            .collect();
        for iface in spec.domain.devices.interfaces.iter_mut().flatten() {
            if iface.model.is_none() {
                iface.model = d.preferred_interface_model.clone();
            }
            let unbound = iface.bridge.is_none()
                && iface.masquerade.is_none()
                && iface.sriov.is_none()
                && iface.passt_binding.is_none()
                && iface.binding.is_none();
            if unbound && pod_networks.contains(&iface.name) {
                iface.masquerade = d.preferred_interface_masquerade.clone();
            }
        }
        if let Some(model) = d.preferred_panic_device_model {
            for p in spec.domain.devices.panic_devices.iter_mut().flatten() {
                fill(&mut p.model, Some(model));
            }
        }
    }
}

fn apply_other_preferences(
    pref: &VirtualMachinePreferenceSpec,
    spec: &mut VirtualMachineInstanceSpec,
    annotations: &mut BTreeMap<String, String>,
) {
    if let Some(f) = &pref.features {
        let features = spec.domain.features.get_or_insert_with(Features::default);
        if features.acpi.is_none() {
            features.acpi = f.preferred_acpi.clone();
        }
        if features.apic.is_none() {
            features.apic = f.preferred_apic.clone();
        }
        if features.smm.is_none() {
            features.smm = f.preferred_smm.clone();
        }
    }
    if let Some(f) = &pref.firmware {
        let firmware = spec.domain.firmware.get_or_insert_with(Firmware::default);
        let boot = firmware.bootloader.get_or_insert_with(Bootloader::default);
        if f.preferred_use_bios == Some(true) && boot.bios.is_none() && boot.efi.is_none() {
            boot.bios = Some(Bios::default());
        }
        if let Some(bios) = &mut boot.bios {
            fill(&mut bios.use_serial, f.preferred_use_bios_serial);
        }
        if boot.efi.is_none() && boot.bios.is_none() {
            if let Some(efi) = &f.preferred_efi {
                boot.efi = Some(efi.clone());
            } else if f.preferred_use_efi == Some(true) {
                boot.efi = Some(crate::vmi::Efi::default());
            }
        }
        if f.preferred_efi.is_none()
            && let Some(efi) = &mut boot.efi
        {
            fill(&mut efi.secure_boot, f.preferred_use_secure_boot);
        }
        if boot.bios.is_none() && boot.efi.is_none() {
            firmware.bootloader = None;
        }
        if *firmware == Firmware::default() {
            spec.domain.firmware = None;
        }
    }
    if let Some(m) = pref
        .machine
        .as_ref()
        .and_then(|m| m.preferred_machine_type.clone())
    {
        let machine = spec.domain.machine.get_or_insert_with(Machine::default);
        if machine.type_.as_deref().is_none_or(str::is_empty) {
            machine.type_ = Some(m);
        }
    }
    if let Some(offset) = pref
        .clock
        .as_ref()
        .and_then(|c| c.preferred_clock_offset.as_ref())
    {
        let offset: ClockOffset = serde_json::to_value(offset)
            .and_then(serde_json::from_value)
            .unwrap_or_default();
        let clock = spec.domain.clock.get_or_insert_with(Clock::default);
        if clock.utc.is_none() && clock.timezone.is_none() {
            clock.utc = offset.utc;
            clock.timezone = offset.timezone;
        }
        if *clock == Clock::default() {
            spec.domain.clock = None;
        }
    }
    if spec.subdomain.is_none() {
        spec.subdomain = pref.preferred_subdomain.clone();
    }
    fill(
        &mut spec.termination_grace_period_seconds,
        pref.preferred_termination_grace_period_seconds,
    );
    for (k, v) in pref.annotations.iter().flatten() {
        annotations.entry(k.clone()).or_insert_with(|| v.clone());
    }
}

fn fill<T: Copy>(slot: &mut Option<T>, preferred: Option<T>) {
    if slot.is_none() {
        *slot = preferred;
    }
}

/// A preference's `requirements` the instance type (or, without one, the VM) does not meet:
/// KubeVirt's message, on `spec.instancetype` or the VM's field. `spec` has the instance type
/// applied already.
pub fn check_requirements(
    it: Option<&VirtualMachineInstancetypeSpec>,
    pref: &VirtualMachinePreferenceSpec,
    spec: &VirtualMachineInstanceSpec,
) -> Option<FieldError> {
    let req = pref.requirements.as_ref()?;
    let failed = |field: &str, detail: String| FieldError {
        kind: ErrorType::NotFound,
        field: field.into(),
        message: format!("failure checking preference requirements: {detail}"),
    };
    if let Some(cpu) = &req.cpu {
        let need = cpu.guest;
        if let Some(it) = it {
            if it.cpu.guest < need {
                return Some(failed(
                    "spec.instancetype",
                    format!(
                        "insufficient CPU resources of {} vCPU provided by instance type, preference requires {need} vCPU",
                        it.cpu.guest
                    ),
                ));
            }
        } else {
            let base = "spec.template.spec.domain.cpu";
            let Some(c) = &spec.domain.cpu else {
                return Some(failed(
                    base,
                    format!(
                        "no CPU resources provided by VirtualMachine, preference requires {need} vCPU"
                    ),
                ));
            };
            // Unset counts are one (the VMI's defaults).
            let (s, co, t) = (
                c.sockets.unwrap_or(1),
                c.cores.unwrap_or(1),
                c.threads.unwrap_or(1),
            );
            let (have, field, what) = match preferred_topology(Some(pref)) {
                PreferredCpuTopology::Threads => {
                    (t, format!("{base}.threads"), "threads".to_string())
                }
                PreferredCpuTopology::Cores => (co, format!("{base}.cores"), "cores".to_string()),
                PreferredCpuTopology::Spread => {
                    let (_, across) = spread_options(pref);
                    let (have, what) = match across {
                        SpreadAcross::SocketsCores => (s * co, "SocketsCores"),
                        SpreadAcross::CoresThreads => (co * t, "CoresThreads"),
                        SpreadAcross::SocketsCoresThreads => (s * co * t, "SocketsCoresThreads"),
                    };
                    (have, format!("{base}.sockets"), what.to_string())
                }
                PreferredCpuTopology::Any => (
                    s * co * t,
                    format!("{base}.cores"),
                    "cores, sockets and threads".to_string(),
                ),
                _ => (s, format!("{base}.sockets"), "sockets".to_string()),
            };
            if have < need {
                return Some(failed(
                    &field,
                    format!(
                        "insufficient CPU resources of {have} vCPU provided by VirtualMachine, preference requires {need} vCPU provided as {what}"
                    ),
                ));
            }
        }
    }
    if let Some(mem) = &req.memory {
        let need = quantity::parse_bytes(&mem.guest.0).unwrap_or(0);
        let (field, by, provided) = match it {
            Some(it) => (
                "spec.instancetype",
                "instance type",
                it.memory.guest.0.clone(),
            ),
            None => (
                "spec.template.spec.domain.memory",
                "VirtualMachine",
                spec.domain
                    .memory
                    .as_ref()
                    .and_then(|m| m.guest.as_ref())
                    .map(|q| q.0.clone())
                    .unwrap_or_else(|| "0".into()),
            ),
        };
        if quantity::parse_bytes(&provided).unwrap_or(0) < need {
            return Some(failed(
                field,
                format!(
                    "insufficient Memory resources of {provided} provided by {by}, preference requires {}",
                    mem.guest.0
                ),
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn it(v: serde_json::Value) -> VirtualMachineInstancetypeSpec {
        serde_json::from_value(v).unwrap()
    }
    fn pref(v: serde_json::Value) -> VirtualMachinePreferenceSpec {
        serde_json::from_value(v).unwrap()
    }
    fn vmi(v: serde_json::Value) -> VirtualMachineInstanceSpec {
        serde_json::from_value(v).unwrap()
    }
    const BASE: &str = "spec.template.spec";

    #[test]
    fn the_instance_type_sizes_the_guest() {
        let mut spec = vmi(json!({"domain": {"devices": {}}}));
        let mut ann = BTreeMap::new();
        let t = it(
            json!({"cpu": {"guest": 4}, "memory": {"guest": "4Gi", "overcommitPercent": 50},
            "annotations": {"a": "b"}}),
        );
        assert!(apply_instancetype(BASE, &t, None, &mut spec, &mut ann).is_empty());
        let cpu = spec.domain.cpu.unwrap();
        assert_eq!(
            (cpu.sockets, cpu.cores, cpu.threads),
            (Some(4), Some(1), Some(1))
        );
        assert_eq!(
            spec.domain.memory.unwrap().guest,
            Some(Quantity("4Gi".into()))
        );
        assert_eq!(
            spec.domain.resources.unwrap().requests.unwrap()["memory"],
            Quantity("2Gi".into())
        );
        assert_eq!(ann["a"], "b");
    }

    #[test]
    fn every_conflict_is_named_with_kubevirts_message() {
        let mut spec = vmi(
            json!({"domain": {"devices": {}, "cpu": {"sockets": 2, "cores": 1},
            "memory": {"guest": "1Gi"},
            "resources": {"requests": {"memory": "1Gi", "cpu": "1"}}}}),
        );
        let t = it(json!({"cpu": {"guest": 2}, "memory": {"guest": "2Gi"}}));
        let before = spec.clone();
        let errs = apply_instancetype(BASE, &t, None, &mut spec, &mut BTreeMap::new());
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.template.spec.domain.resources.requests.cpu",
                "spec.template.spec.domain.cpu.sockets",
                "spec.template.spec.domain.cpu.cores",
                "spec.template.spec.domain.memory.guest",
                "spec.template.spec.domain.resources.requests.memory",
            ]
        );
        assert_eq!(
            errs[1].message,
            "VM field(s) spec.template.spec.domain.cpu.sockets conflicts with selected instance type"
        );
        assert_eq!(spec, before, "nothing applied on a conflict");
    }

    #[test]
    fn limits_and_hugepages_the_instance_type_leaves_unset_are_the_vms() {
        // kubevirt/kubevirt#12720 and #14685.
        let t = it(json!({"cpu": {"guest": 1}, "memory": {"guest": "1Gi"}}));
        let mut spec = vmi(
            json!({"domain": {"devices": {}, "memory": {"hugepages": {"pageSize": "2Mi"}},
            "resources": {"limits": {"memory": "2Gi", "cpu": "2"}}}}),
        );
        assert!(apply_instancetype(BASE, &t, None, &mut spec, &mut BTreeMap::new()).is_empty());
        let memory = spec.domain.memory.unwrap();
        assert_eq!(memory.hugepages.unwrap().page_size, "2Mi");
        assert_eq!(memory.guest, Some(Quantity("1Gi".into())));
        let mut low =
            vmi(json!({"domain": {"devices": {}, "resources": {"limits": {"memory": "512Mi"}}}}));
        let errs = apply_instancetype(BASE, &t, None, &mut low, &mut BTreeMap::new());
        assert_eq!(
            errs[0].field,
            "spec.template.spec.domain.resources.limits.memory"
        );
        let huge = it(
            json!({"cpu": {"guest": 1}, "memory": {"guest": "1Gi", "hugepages": {"pageSize": "1Gi"}}}),
        );
        let mut both =
            vmi(json!({"domain": {"devices": {}, "memory": {"hugepages": {"pageSize": "2Mi"}}}}));
        let errs = apply_instancetype(BASE, &huge, None, &mut both, &mut BTreeMap::new());
        assert_eq!(errs[0].field, "spec.template.spec.domain.memory.hugepages");
    }

    #[test]
    fn what_kubevirt_rs_cannot_carry_refuses_the_vm() {
        let t = it(json!({"cpu": {"guest": 2, "isolateEmulatorThread": true,
            "numa": {"guestMappingPassthrough": {}}}, "memory": {"guest": "1Gi"}}));
        let mut spec = vmi(json!({"domain": {"devices": {}}}));
        let errs = apply_instancetype(BASE, &t, None, &mut spec, &mut BTreeMap::new());
        assert_eq!(errs.len(), 2);
        assert!(errs.iter().all(|e| e.field == "spec.instancetype"));
        assert!(errs[0].message.contains("cpu.numa"));
    }

    #[test]
    fn topologies_lay_out_the_vcpus() {
        let p = |t: &str| pref(json!({"cpu": {"preferredCPUTopology": t}}));
        assert_eq!(topology(4, None), (4, 1, 1));
        assert_eq!(topology(4, Some(&p("cores"))), (1, 4, 1));
        assert_eq!(topology(4, Some(&p("preferThreads"))), (1, 1, 4));
        assert_eq!(topology(4, Some(&p("any"))), (4, 1, 1));
        assert_eq!(topology(8, Some(&p("spread"))), (4, 2, 1));
        let sct = pref(json!({"cpu": {"preferredCPUTopology": "spread",
            "spreadOptions": {"across": "SocketsCoresThreads", "ratio": 2}}}));
        assert_eq!(topology(8, Some(&sct)), (2, 2, 2));
        assert_eq!(topology(1, Some(&sct)), (1, 1, 1));
        let t = it(json!({"cpu": {"guest": 3}, "memory": {"guest": "1Gi"}}));
        let e = check_spread(&t, Some(&p("spread"))).unwrap();
        assert_eq!(e.field, "instancetype.spec.cpu.guest");
        assert!(
            e.message
                .starts_with("3 vCPUs provided by the instance type are not divisible")
        );
    }

    #[test]
    fn preferences_fill_only_what_the_vm_leaves_unset() {
        let p = pref(json!({
            "devices": {"preferredDiskBus": "sata", "preferredInterfaceModel": "e1000e",
                "preferredRng": {}, "preferredDiskDedicatedIoThread": true},
            "firmware": {"preferredEfi": {"secureBoot": true}},
            "features": {"preferredSmm": {}},
            "machine": {"preferredMachineType": "q35"},
            "clock": {"preferredClockOffset": {"utc": {}}, "preferredTimer": {"hpet": {"present": false}}},
            "preferredTerminationGracePeriodSeconds": 3600,
            "annotations": {"vm.kubevirt.io/os": "linux", "mine": "theirs"}}));
        let mut spec = vmi(json!({"domain": {"devices": {
            "disks": [{"name": "a"}, {"name": "b", "disk": {"bus": "virtio"}}, {"name": "c", "cdrom": {}}],
            "interfaces": [{"name": "default", "model": "virtio"}, {"name": "other"}]}},
            "networks": [{"name": "default", "pod": {}}], "terminationGracePeriodSeconds": 5}));
        let mut ann = BTreeMap::from([("mine".to_string(), "ours".to_string())]);
        apply_preference(&p, &mut spec, &mut ann);
        let disks = spec.domain.devices.disks.clone().unwrap();
        assert_eq!(
            disks[0].disk.as_ref().unwrap().bus,
            Some(crate::vmi::DiskBus::Sata)
        );
        assert_eq!(
            disks[1].disk.as_ref().unwrap().bus,
            Some(crate::vmi::DiskBus::Virtio)
        );
        assert_eq!(disks[1].dedicated_io_thread, Some(true));
        assert_eq!(disks[0].dedicated_io_thread, None);
        assert_eq!(disks[2].cdrom.as_ref().unwrap().bus, None);
        let ifaces = spec.domain.devices.interfaces.clone().unwrap();
        assert_eq!(ifaces[0].model.as_deref(), Some("virtio"));
        assert_eq!(ifaces[1].model.as_deref(), Some("e1000e"));
        assert!(spec.domain.devices.rng.is_some());
        let efi = spec
            .domain
            .firmware
            .unwrap()
            .bootloader
            .unwrap()
            .efi
            .unwrap();
        assert_eq!(efi.secure_boot, Some(true));
        assert!(spec.domain.features.unwrap().smm.is_some());
        assert_eq!(spec.domain.machine.unwrap().type_.as_deref(), Some("q35"));
        assert!(spec.domain.clock.unwrap().utc.is_some());
        assert_eq!(spec.termination_grace_period_seconds, Some(5));
        assert_eq!(ann["mine"], "ours");
        assert_eq!(ann["vm.kubevirt.io/os"], "linux");
    }

    #[test]
    fn requirements_name_what_falls_short() {
        let p = pref(json!({"requirements": {"cpu": {"guest": 2}, "memory": {"guest": "2Gi"}}}));
        let small = it(json!({"cpu": {"guest": 1}, "memory": {"guest": "4Gi"}}));
        let spec = vmi(json!({"domain": {"devices": {}}}));
        let e = check_requirements(Some(&small), &p, &spec).unwrap();
        assert_eq!(e.field, "spec.instancetype");
        assert_eq!(
            e.message,
            "failure checking preference requirements: insufficient CPU resources of 1 vCPU provided by instance type, preference requires 2 vCPU"
        );
        let lowmem = it(json!({"cpu": {"guest": 2}, "memory": {"guest": "1Gi"}}));
        let e = check_requirements(Some(&lowmem), &p, &spec).unwrap();
        assert!(e.message.contains("insufficient Memory resources of 1Gi provided by instance type, preference requires 2Gi"));
        assert!(
            check_requirements(
                Some(&it(
                    json!({"cpu": {"guest": 2}, "memory": {"guest": "2Gi"}})
                )),
                &p,
                &spec
            )
            .is_none()
        );
        let own = vmi(
            json!({"domain": {"devices": {}, "cpu": {"sockets": 1}, "memory": {"guest": "4Gi"}}}),
        );
        let e = check_requirements(None, &p, &own).unwrap();
        assert_eq!(e.field, "spec.template.spec.domain.cpu.sockets");
    }
}
