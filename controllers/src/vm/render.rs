//! The VMI a VM asks for, rendered from its template (pure).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;
use kubevirt_api::vmi::StartStrategy;
use kubevirt_api::{API_VERSION, VirtualMachine, VirtualMachineInstance};

use super::decide::VM_GENERATION_ANNOTATION;

/// Why a VMI cannot be rendered.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RenderError {
    /// The VM has no namespace (it is namespaced, so the object is malformed).
    #[error("VirtualMachine {0} has no namespace")]
    MissingNamespace(String),
    /// The VM has no uid yet, so no owner reference can point at it.
    #[error("VirtualMachine {0} has no uid")]
    MissingUid(String),
    /// spec.template.spec is absent.
    #[error("VirtualMachine {0} has no spec.template.spec")]
    MissingTemplateSpec(String),
}

/// The DataVolume of one of `vm`'s `dataVolumeTemplates`, as KubeVirt creates it: the
/// template's metadata and spec in the VM's namespace, labelled
/// `kubevirt.io/created-by: <VM uid>`, controlled by the VM (the garbage collector deletes
/// it with the VM; this controller never does) and allowed to adopt an existing claim of
/// its name (`cdi.kubevirt.io/allowClaimAdoption`).
pub fn data_volume(
    vm: &VirtualMachine,
    template: &kubevirt_api::vm::DataVolumeTemplateSpec,
) -> Result<kubevirt_api::cdi::DataVolume, RenderError> {
    let ns = vm
        .namespace()
        .ok_or_else(|| RenderError::MissingNamespace(vm.name_any()))?;
    let owner = owner_reference(vm)?;
    let mut labels = template.metadata.labels.clone().unwrap_or_default();
    labels.insert(kubevirt_api::CREATED_BY_LABEL.into(), owner.uid.clone());
    let mut annotations = template.metadata.annotations.clone().unwrap_or_default();
    annotations.insert(
        kubevirt_api::cdi::annotations::ALLOW_CLAIM_ADOPTION.into(),
        "true".into(),
    );
    Ok(kubevirt_api::cdi::DataVolume {
        metadata: ObjectMeta {
            name: template.metadata.name.clone(),
            namespace: Some(ns),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: template.spec.clone(),
        status: None,
    })
}

/// The controller owner reference from a VMI to its VM; blockOwnerDeletion makes a
/// foreground delete of the VM wait for the VMI.
pub fn owner_reference(vm: &VirtualMachine) -> Result<OwnerReference, RenderError> {
    Ok(OwnerReference {
        api_version: API_VERSION.to_string(),
        kind: "VirtualMachine".to_string(),
        name: vm.name_any(),
        uid: vm
            .metadata
            .uid
            .clone()
            .ok_or_else(|| RenderError::MissingUid(vm.name_any()))?,
        controller: Some(true),
        block_owner_deletion: Some(true),
    })
}

/// Renders the VMI for `vm`: same name and namespace, the template's labels and
/// annotations, the generation it came from, and the template spec.
pub fn render_vmi(
    vm: &VirtualMachine,
    start_paused: bool,
) -> Result<VirtualMachineInstance, RenderError> {
    let name = vm.name_any();
    let namespace = vm
        .namespace()
        .ok_or_else(|| RenderError::MissingNamespace(name.clone()))?;
    let template = &vm.spec.template;
    let mut spec = template
        .spec
        .clone()
        .ok_or_else(|| RenderError::MissingTemplateSpec(name.clone()))?;
    if start_paused {
        spec.start_strategy = Some(StartStrategy::Paused);
    }
    let tmeta = template.metadata.clone().unwrap_or_default();
    let mut annotations = tmeta.annotations.unwrap_or_default();
    if let Some(g) = vm.metadata.generation {
        annotations.insert(VM_GENERATION_ANNOTATION.to_string(), g.to_string());
    }
    let mut vmi = VirtualMachineInstance::new(&name, spec);
    vmi.metadata = ObjectMeta {
        name: Some(name),
        namespace: Some(namespace),
        labels: tmeta
            .labels
            .filter(|l: &BTreeMap<String, String>| !l.is_empty()),
        annotations: (!annotations.is_empty()).then_some(annotations),
        owner_references: Some(vec![owner_reference(vm)?]),
        // Born with the VMI controller's finalizer (as KubeVirt's VM controller does): the VMI
        // controller would add it before creating the pod anyway, and that is a write per start
        // saved.
        finalizers: Some(vec![crate::vmi::decide::FINALIZER.to_string()]),
        ..ObjectMeta::default()
    };
    Ok(vmi)
}

/// `vmi` is controlled by `vm` (or by nothing, which a VM adopts by name as KubeVirt does).
pub fn controlled_by(vmi: &VirtualMachineInstance, vm: &VirtualMachine) -> bool {
    match vmi
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
    {
        None => true,
        Some(o) => Some(&o.uid) == vm.metadata.uid.as_ref(),
    }
}

/// Annotation with the node the VM's instance runs on (the NODE column of `kubectl get vm
/// -o wide`; a VM has no instance state of its own).
pub const NODE_ANNOTATION: &str = "kubevirt.io/node-name";
/// Annotation with the instance's first IP address (the IP column).
pub const IP_ANNOTATION: &str = "kubevirt.io/ip-address";

/// The merge patch that makes the VM's display annotations show where its instance runs
/// and its address (both removed while it has none), or `None` when they already do.
/// Written only when they change: once when a VM starts, once per migration.
pub fn display_annotations_patch(
    vm: &VirtualMachine,
    vmi: Option<&VirtualMachineInstance>,
) -> Option<serde_json::Value> {
    let status = vmi.and_then(|v| v.status.as_ref());
    let node = status
        .and_then(|s| s.node_name.clone())
        .filter(|n| !n.is_empty());
    let ip = status
        .and_then(|s| s.interfaces.as_ref())
        .and_then(|i| i.first())
        .and_then(|i| i.ip_address.clone())
        .filter(|ip| !ip.is_empty());
    let have = vm.annotations();
    let mut patch = serde_json::Map::new();
    for (key, want) in [(NODE_ANNOTATION, node), (IP_ANNOTATION, ip)] {
        if have.get(key) != want.as_ref() {
            patch.insert(
                key.to_string(),
                want.map_or(serde_json::Value::Null, serde_json::Value::String),
            );
        }
    }
    (!patch.is_empty()).then(|| serde_json::json!({"metadata": {"annotations": patch}}))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use kubevirt_api::vm::VirtualMachineInstanceTemplateSpec;
    use kubevirt_api::{VirtualMachineInstanceSpec, VirtualMachineSpec};
    use serde_json::json;

    use super::*;

    fn vm() -> VirtualMachine {
        let template: VirtualMachineInstanceTemplateSpec = serde_json::from_value(json!({
            "metadata": {"labels": {"app": "demo"}, "annotations": {"note": "x"}},
            "spec": {"domain": {"devices": {}}, "terminationGracePeriodSeconds": 5}
        }))
        .unwrap();
        let mut vm = VirtualMachine::new(
            "demo",
            VirtualMachineSpec {
                template,
                ..VirtualMachineSpec::default()
            },
        );
        vm.metadata.namespace = Some("ns1".into());
        vm.metadata.uid = Some("vm-uid".into());
        vm.metadata.generation = Some(4);
        vm
    }

    #[test]
    fn renders_name_metadata_owner_and_spec() {
        let vmi = render_vmi(&vm(), false).unwrap();
        let v = serde_json::to_value(&vmi).unwrap();
        assert_eq!(
            v,
            json!({
                "apiVersion": "kubevirt.io/v1",
                "kind": "VirtualMachineInstance",
                "metadata": {
                    "name": "demo",
                    "namespace": "ns1",
                    "labels": {"app": "demo"},
                    "annotations": {"note": "x", "kubevirt.io/vm-generation": "4"},
                    "ownerReferences": [{
                        "apiVersion": "kubevirt.io/v1",
                        "kind": "VirtualMachine",
                        "name": "demo",
                        "uid": "vm-uid",
                        "controller": true,
                        "blockOwnerDeletion": true
                    }],
                    "finalizers": ["kubevirt.io/virtualMachineControllerFinalize"]
                },
                "spec": {"domain": {"devices": {}}, "terminationGracePeriodSeconds": 5}
            })
        );
        assert!(controlled_by(&vmi, &vm()));
    }

    #[test]
    fn start_paused_sets_start_strategy() {
        let vmi = render_vmi(&vm(), true).unwrap();
        assert_eq!(vmi.spec.start_strategy, Some(StartStrategy::Paused));
    }

    #[test]
    fn missing_pieces_are_errors() {
        let mut v = vm();
        v.spec.template.spec = None;
        assert_eq!(
            render_vmi(&v, false).unwrap_err(),
            RenderError::MissingTemplateSpec("demo".into())
        );
        let mut v = vm();
        v.metadata.uid = None;
        assert_eq!(
            render_vmi(&v, false).unwrap_err(),
            RenderError::MissingUid("demo".into())
        );
        let mut v = vm();
        v.metadata.namespace = None;
        assert!(matches!(
            render_vmi(&v, false).unwrap_err(),
            RenderError::MissingNamespace(_)
        ));
    }

    #[test]
    fn foreign_controller_is_not_ours_orphans_are() {
        let mut vmi = VirtualMachineInstance::new("demo", VirtualMachineInstanceSpec::default());
        assert!(controlled_by(&vmi, &vm()));
        let mut other = owner_reference(&vm()).unwrap();
        other.uid = "someone-else".into();
        vmi.metadata.owner_references = Some(vec![other]);
        assert!(!controlled_by(&vmi, &vm()));
    }

    #[test]
    fn display_annotations_follow_the_instance() {
        let vm: VirtualMachine = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "vm1", "namespace": "ns", "annotations": {"other": "x"}},
            "spec": {}
        }))
        .unwrap();
        let vmi: VirtualMachineInstance = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "vm1", "namespace": "ns"},
            "spec": {"domain": {"devices": {}}},
            "status": {"nodeName": "node-a", "interfaces": [{"name": "default", "ipAddress": "10.0.0.7"}]}
        }))
        .unwrap();
        let patch = display_annotations_patch(&vm, Some(&vmi)).unwrap();
        assert_eq!(
            patch,
            serde_json::json!({"metadata": {"annotations": {
                "kubevirt.io/node-name": "node-a", "kubevirt.io/ip-address": "10.0.0.7"}}})
        );
        let mut shown = vm.clone();
        shown
            .annotations_mut()
            .insert(NODE_ANNOTATION.into(), "node-a".into());
        shown
            .annotations_mut()
            .insert(IP_ANNOTATION.into(), "10.0.0.7".into());
        assert_eq!(
            display_annotations_patch(&shown, Some(&vmi)),
            None,
            "nothing to write"
        );
        assert_eq!(
            display_annotations_patch(&shown, None).unwrap(),
            serde_json::json!({"metadata": {"annotations": {
                "kubevirt.io/node-name": null, "kubevirt.io/ip-address": null}}}),
            "stopped: removed"
        );
    }
}
