//! A VirtualMachine's instance type and preference as virt-controller applies them (pure):
//! the VMI it creates for the VM, the VM spec they expand into (`referencePolicy: expand`,
//! the `expand-spec` endpoints), and which copies the VM's status must capture.
//!
//! KubeVirt's order, kept because it decides what a preference reaches: the preference's
//! device part first (its `autoattach*` values decide whether defaults are added), then the
//! default disks of volumes and the default pod interface (which then get the preferred bus
//! and model), then the instance type (every conflict refuses, nothing applied), then the
//! whole preference (fill-only, so applying its device part twice changes nothing).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::apply::{apply_device_preferences, apply_instancetype, apply_preference};
use super::{VirtualMachineInstancetypeSpec, VirtualMachinePreferenceSpec};
use crate::defaults::{default_network_interface, default_vmi_spec, default_volume_disks};
use crate::validation::FieldError;
use crate::vm::{ControllerRevisionRef, InstancetypeStatusRef, Matcher, VirtualMachine};
use crate::vmi::VirtualMachineInstanceSpec;

/// VMI annotation naming a namespaced instance type the VM uses (KubeVirt's).
pub const INSTANCETYPE_ANNOTATION: &str = "kubevirt.io/instancetype-name";
/// VMI annotation naming a cluster-wide instance type the VM uses.
pub const CLUSTER_INSTANCETYPE_ANNOTATION: &str = "kubevirt.io/cluster-instancetype-name";
/// VMI annotation naming a namespaced preference the VM uses.
pub const PREFERENCE_ANNOTATION: &str = "kubevirt.io/preference-name";
/// VMI annotation naming a cluster-wide preference the VM uses.
pub const CLUSTER_PREFERENCE_ANNOTATION: &str = "kubevirt.io/cluster-preference-name";

/// How a VM keeps what its instance type and preference gave it (the KubeVirt resource's
/// `spec.configuration.instancetype.referencePolicy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReferencePolicy {
    /// A copy of each in a ControllerRevision the VM's status names (the default).
    #[default]
    #[serde(rename = "reference")]
    Reference,
    /// Written into the VM's spec, the references dropped, unless copies were captured.
    #[serde(rename = "expand")]
    Expand,
    /// Written into the VM's spec, the references dropped, captured copies or not.
    #[serde(rename = "expandAll")]
    ExpandAll,
}

impl ReferencePolicy {
    /// Its name in the KubeVirt resource.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reference => "reference",
            Self::Expand => "expand",
            Self::ExpandAll => "expandAll",
        }
    }

    /// The policy named `s`.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Reference, Self::Expand, Self::ExpandAll]
            .into_iter()
            .find(|p| p.as_str() == s)
    }

    /// Whether a VM is expanded now under this policy: `expandAll` always, `expand` while
    /// neither of its references has a captured copy.
    pub fn expands(self, vm: &VirtualMachine) -> bool {
        if vm.spec.instancetype.is_none() && vm.spec.preference.is_none() {
            return false;
        }
        match self {
            Self::Reference => false,
            Self::ExpandAll => true,
            Self::Expand => {
                let captured = |r: Option<&InstancetypeStatusRef>| {
                    r.and_then(|r| r.controller_revision_ref.as_ref())
                        .and_then(|c| c.name.as_deref())
                        .is_some_and(|n| !n.is_empty())
                };
                let status = vm.status.as_ref();
                !captured(status.and_then(|s| s.instancetype_ref.as_ref()))
                    && !captured(status.and_then(|s| s.preference_ref.as_ref()))
            }
        }
    }
}

/// The instance type and preference specs a VM uses (either may be absent).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Specs {
    /// The instance type's spec.
    pub instancetype: Option<VirtualMachineInstancetypeSpec>,
    /// The preference's spec.
    pub preference: Option<VirtualMachinePreferenceSpec>,
}

/// Whether a matcher's kind names the namespaced kind (`VirtualMachineInstancetype` or
/// `VirtualMachinePreference`: KubeVirt compares it lower-cased with the resource's singular
/// and plural names); an empty kind is the cluster-wide one.
pub fn names_namespaced_kind(kind: Option<&str>, namespaced_singular: &str) -> bool {
    let k = kind.unwrap_or_default().to_ascii_lowercase();
    k == namespaced_singular || k == format!("{namespaced_singular}s")
}

/// Whether the VM's instance type is the namespaced kind.
pub fn instancetype_is_namespaced(m: &Matcher) -> bool {
    names_namespaced_kind(m.kind.as_deref(), "virtualmachineinstancetype")
}

/// Whether the VM's preference is the namespaced kind.
pub fn preference_is_namespaced(m: &Matcher) -> bool {
    names_namespaced_kind(m.kind.as_deref(), "virtualmachinepreference")
}

/// The VMI annotations naming what the VM uses (KubeVirt's, one per reference).
pub fn reference_annotations(vm: &VirtualMachine) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if let Some(m) = &vm.spec.instancetype {
        let key = if instancetype_is_namespaced(m) {
            INSTANCETYPE_ANNOTATION
        } else {
            CLUSTER_INSTANCETYPE_ANNOTATION
        };
        out.push((key, m.name.clone().unwrap_or_default()));
    }
    if let Some(m) = &vm.spec.preference {
        let key = if preference_is_namespaced(m) {
            PREFERENCE_ANNOTATION
        } else {
            CLUSTER_PREFERENCE_ANNOTATION
        };
        out.push((key, m.name.clone().unwrap_or_default()));
    }
    out
}

/// Applies `specs` to the spec and annotations of the VMI virt-controller creates for `vm`,
/// in KubeVirt's order (module docs). Every conflict with the instance type, or nothing
/// applied to the instance type's fields (the VMI is then not created).
pub fn apply_to_vmi(
    vm: &VirtualMachine,
    specs: &Specs,
    spec: &mut VirtualMachineInstanceSpec,
    annotations: &mut BTreeMap<String, String>,
) -> Vec<FieldError> {
    if specs.instancetype.is_none() && specs.preference.is_none() {
        return Vec::new();
    }
    if let Some(p) = &specs.preference {
        apply_device_preferences(p, spec);
    }
    default_volume_disks(spec);
    default_network_interface(spec);
    for (k, v) in reference_annotations(vm) {
        annotations.insert(k.to_string(), v);
    }
    apply_specs("spec", specs, spec, annotations)
}

fn apply_specs(
    base: &str,
    specs: &Specs,
    spec: &mut VirtualMachineInstanceSpec,
    annotations: &mut BTreeMap<String, String>,
) -> Vec<FieldError> {
    if let Some(it) = &specs.instancetype {
        let conflicts = apply_instancetype(base, it, specs.preference.as_ref(), spec, annotations);
        if !conflicts.is_empty() {
            return conflicts;
        }
    }
    if let Some(p) = &specs.preference {
        apply_preference(p, spec, annotations);
    }
    Vec::new()
}

/// The VM with its instance type and preference written into its template and its
/// references dropped (KubeVirt's `expand`: what `referencePolicy: expand` stores and the
/// `expand-spec` endpoints answer): the default disks and pod interface, both applied, the
/// VMI defaults; `spec.instancetype`, `spec.preference` and the status' references removed.
/// A VM with neither comes back unchanged.
pub fn expand(vm: &VirtualMachine, specs: &Specs) -> Result<VirtualMachine, Vec<FieldError>> {
    if vm.spec.instancetype.is_none() && vm.spec.preference.is_none() {
        return Ok(vm.clone());
    }
    let mut out = vm.clone();
    let template = &mut out.spec.template;
    let spec = template.spec.get_or_insert_with(Default::default);
    default_volume_disks(spec);
    default_network_interface(spec);
    let metadata = template.metadata.get_or_insert_with(Default::default);
    let mut annotations = metadata.annotations.clone().unwrap_or_default();
    let errs = apply_specs("spec.template.spec", specs, spec, &mut annotations);
    if !errs.is_empty() {
        return Err(errs);
    }
    // The VMI defaults, except the firmware UUID the VMI's own name gives it at start.
    let uuid = spec.domain.firmware.as_ref().and_then(|f| f.uuid.clone());
    default_vmi_spec(spec, vm.metadata.name.as_deref().unwrap_or_default());
    if let Some(f) = spec.domain.firmware.as_mut() {
        f.uuid = uuid;
        if *f == Default::default() {
            spec.domain.firmware = None;
        }
    }
    metadata.annotations = (!annotations.is_empty()).then_some(annotations);
    out.spec.instancetype = None;
    out.spec.preference = None;
    if let Some(status) = out.status.as_mut() {
        status.instancetype_ref = None;
        status.preference_ref = None;
    }
    Ok(out)
}

/// The status reference of a VM's matcher after it was seen (KubeVirt's
/// `syncStatusWithMatcher`): a name, kind or volume changed since the copy was captured
/// drops the copy; a `revisionName` the matcher names is the copy. Its
/// `controllerRevisionRef` is `None` when a copy must be captured now.
pub fn sync_status_ref(
    matcher: &Matcher,
    current: Option<&InstancetypeStatusRef>,
) -> InstancetypeStatusRef {
    let mut r = current.cloned().unwrap_or_default();
    let set = |v: &Option<String>| v.as_deref().filter(|s| !s.is_empty()).map(str::to_string);
    let mut changed = false;
    for (from, to) in [
        (set(&matcher.name), &mut r.name),
        (set(&matcher.kind), &mut r.kind),
        (set(&matcher.infer_from_volume), &mut r.infer_from_volume),
    ] {
        if let Some(v) = from
            && to.as_ref() != Some(&v)
        {
            *to = Some(v);
            changed = true;
        }
    }
    if changed {
        r.controller_revision_ref = None;
    }
    if let Some(p) = matcher.infer_from_volume_failure_policy {
        r.infer_from_volume_failure_policy = Some(p);
    }
    if let Some(name) = set(&matcher.revision_name) {
        r.controller_revision_ref = Some(ControllerRevisionRef { name: Some(name) });
    }
    if r.controller_revision_ref
        .as_ref()
        .and_then(|c| c.name.as_deref())
        .is_none_or(str::is_empty)
    {
        r.controller_revision_ref = None;
    }
    r
}

/// The name of the ControllerRevision a status reference names, if any.
pub fn captured_revision(r: Option<&InstancetypeStatusRef>) -> Option<&str> {
    r.and_then(|r| r.controller_revision_ref.as_ref())
        .and_then(|c| c.name.as_deref())
        .filter(|n| !n.is_empty())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn vm(v: serde_json::Value) -> VirtualMachine {
        serde_json::from_value(v).unwrap()
    }

    fn specs(it: serde_json::Value, pref: serde_json::Value) -> Specs {
        Specs {
            instancetype: (!it.is_null()).then(|| serde_json::from_value(it).unwrap()),
            preference: (!pref.is_null()).then(|| serde_json::from_value(pref).unwrap()),
        }
    }

    fn small_vm() -> VirtualMachine {
        vm(json!({
            "metadata": {"name": "small", "namespace": "ns"},
            "spec": {
                "instancetype": {"name": "u1.nano", "kind": "VirtualMachineClusterInstancetype"},
                "preference": {"name": "linux", "kind": "virtualmachinepreference"},
                "template": {"spec": {
                    "domain": {"devices": {}},
                    "volumes": [{"name": "root", "containerDisk": {"image": "busybox"}}]
                }}
            }
        }))
    }

    #[test]
    fn the_vmi_gets_the_instance_types_size_and_the_preferences_defaults() {
        let vm = small_vm();
        let s = specs(
            json!({"cpu": {"guest": 2}, "memory": {"guest": "128Mi"}}),
            json!({"cpu": {"preferredCPUTopology": "cores"},
                "devices": {"preferredDiskBus": "sata", "preferredInterfaceModel": "e1000e"},
                "preferredTerminationGracePeriodSeconds": 7}),
        );
        let mut spec = vm.spec.template.spec.clone().unwrap();
        let mut ann = BTreeMap::new();
        assert!(apply_to_vmi(&vm, &s, &mut spec, &mut ann).is_empty());
        let cpu = spec.domain.cpu.clone().unwrap();
        assert_eq!(
            (cpu.sockets, cpu.cores, cpu.threads),
            (Some(1), Some(2), Some(1))
        );
        assert_eq!(spec.domain.memory.unwrap().guest.unwrap().0, "128Mi");
        // The volume's default disk and the default pod interface got the preferred bus
        // and model: added before the preference was applied.
        let disks = spec.domain.devices.disks.unwrap();
        assert_eq!(disks[0].name, "root");
        assert_eq!(
            disks[0].disk.as_ref().unwrap().bus,
            Some(crate::vmi::DiskBus::Sata)
        );
        let iface = &spec.domain.devices.interfaces.unwrap()[0];
        assert_eq!(iface.model.as_deref(), Some("e1000e"));
        assert!(iface.masquerade.is_some());
        assert_eq!(spec.termination_grace_period_seconds, Some(7));
        assert_eq!(ann[CLUSTER_INSTANCETYPE_ANNOTATION], "u1.nano");
        assert_eq!(ann[PREFERENCE_ANNOTATION], "linux");
    }

    #[test]
    fn a_preference_turning_the_pod_interface_off_keeps_it_off() {
        let mut vm = small_vm();
        vm.spec.instancetype = None;
        let s = specs(
            serde_json::Value::Null,
            json!({"devices": {"preferredAutoattachPodInterface": false}}),
        );
        let mut spec = vm.spec.template.spec.clone().unwrap();
        spec.domain.memory = Some(crate::vmi::Memory {
            guest: Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
                "64Mi".into(),
            )),
            ..Default::default()
        });
        assert!(apply_to_vmi(&vm, &s, &mut spec, &mut BTreeMap::new()).is_empty());
        assert_eq!(spec.domain.devices.autoattach_pod_interface, Some(false));
        assert!(spec.domain.devices.interfaces.is_none());
        assert!(spec.networks.is_none());
    }

    #[test]
    fn a_conflict_names_the_vmi_field() {
        let mut vm = small_vm();
        let template = vm.spec.template.spec.as_mut().unwrap();
        template.domain.cpu = Some(crate::vmi::Cpu {
            sockets: Some(2),
            ..Default::default()
        });
        let s = specs(
            json!({"cpu": {"guest": 1}, "memory": {"guest": "64Mi"}}),
            serde_json::Value::Null,
        );
        let mut spec = vm.spec.template.spec.clone().unwrap();
        let errs = apply_to_vmi(&vm, &s, &mut spec, &mut BTreeMap::new());
        assert_eq!(errs[0].field, "spec.domain.cpu.sockets");
    }

    #[test]
    fn expanding_writes_both_into_the_template_and_drops_the_references() {
        let mut small = small_vm();
        small.status = Some(
            serde_json::from_value(json!({
                "instancetypeRef": {"name": "u1.nano", "controllerRevisionRef": {"name": "r1"}}
            }))
            .unwrap(),
        );
        let s = specs(
            json!({"cpu": {"guest": 1}, "memory": {"guest": "64Mi"}}),
            json!({"devices": {"preferredDiskBus": "virtio"}, "annotations": {"a": "b"}}),
        );
        let out = expand(&small, &s).unwrap();
        assert!(out.spec.instancetype.is_none() && out.spec.preference.is_none());
        assert!(out.status.unwrap().instancetype_ref.is_none());
        let spec = out.spec.template.spec.unwrap();
        assert_eq!(spec.domain.memory.unwrap().guest.unwrap().0, "64Mi");
        assert_eq!(spec.domain.machine.unwrap().type_.as_deref(), Some("q35"));
        assert!(
            spec.domain.firmware.is_none(),
            "no UUID: the VMI's name gives it at start"
        );
        assert_eq!(
            out.spec.template.metadata.unwrap().annotations.unwrap()["a"],
            "b"
        );
        let plain = vm(json!({"metadata": {"name": "p"}, "spec": {"template": {}}}));
        assert_eq!(
            serde_json::to_value(expand(&plain, &Specs::default()).unwrap()).unwrap(),
            serde_json::to_value(&plain).unwrap()
        );
    }

    #[test]
    fn status_references_follow_the_matcher() {
        let m: Matcher = serde_json::from_value(
            json!({"name": "u1.nano", "kind": "VirtualMachineClusterInstancetype"}),
        )
        .unwrap();
        let fresh = sync_status_ref(&m, None);
        assert_eq!(fresh.name.as_deref(), Some("u1.nano"));
        assert!(fresh.controller_revision_ref.is_none(), "capture needed");
        let captured = InstancetypeStatusRef {
            controller_revision_ref: Some(ControllerRevisionRef {
                name: Some("vm-u1.nano-v1beta1-uid-1".into()),
            }),
            ..fresh.clone()
        };
        assert_eq!(sync_status_ref(&m, Some(&captured)), captured, "kept");
        let other: Matcher = serde_json::from_value(json!({"name": "u1.small"})).unwrap();
        let moved = sync_status_ref(&other, Some(&captured));
        assert_eq!(moved.name.as_deref(), Some("u1.small"));
        assert!(moved.controller_revision_ref.is_none(), "a new copy");
        let pinned: Matcher =
            serde_json::from_value(json!({"name": "u1.nano", "revisionName": "mine"})).unwrap();
        assert_eq!(
            captured_revision(Some(&sync_status_ref(&pinned, None))),
            Some("mine")
        );
    }

    #[test]
    fn expand_policies() {
        let mut vm = small_vm();
        assert!(!ReferencePolicy::Reference.expands(&vm));
        assert!(ReferencePolicy::Expand.expands(&vm));
        vm.status = Some(
            serde_json::from_value(json!({
                "preferenceRef": {"name": "linux", "controllerRevisionRef": {"name": "r"}}
            }))
            .unwrap(),
        );
        assert!(!ReferencePolicy::Expand.expands(&vm), "a copy was captured");
        assert!(ReferencePolicy::ExpandAll.expands(&vm));
        assert_eq!(
            ReferencePolicy::parse("expandAll"),
            Some(ReferencePolicy::ExpandAll)
        );
        assert_eq!(ReferencePolicy::parse("Expand"), None);
    }
}
