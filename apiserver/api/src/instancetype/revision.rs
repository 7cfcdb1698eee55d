//! The ControllerRevisions (apps/v1, in kube-apiserver) holding the copy of an instance type
//! or preference a VM uses, in KubeVirt's shape (pure): so that a later change of the
//! instance type, or its deletion, does not change an existing VM until the VM asks for it.
//!
//! One revision per namespace and copied generation, shared by every VM of the namespace
//! that captured that generation (kubevirt/kubevirt#8591: KubeVirt makes one per VM, so a
//! thousand VMs of `u1.medium` hold a thousand identical copies). The name is a function of
//! the copied object and its generation only (`<object>-<version>-<object uid>-<object
//! generation>`), so a capture that is retried (a lost status write, a restarted controller,
//! two workers) or made by another VM finds the revision (AlreadyExists with the same data)
//! and adds its VM as an owner instead of adding a copy. Each VM is one ownerReference (none
//! the controller: there are several); the garbage collector deletes the revision when the
//! last of them is gone and drops the references of the others. Adding an owner is a
//! strategic merge patch keyed by uid, so concurrent captures do not contend on a
//! read-modify-write. A revision KubeVirt made for one VM (`<vm>-<object>-…`) is still read
//! by the name a VM's status gives.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use serde_json::Value;

use super::{API_VERSION, VERSION};

/// Label: generation of the copied object.
pub const OBJECT_GENERATION_LABEL: &str = "instancetype.kubevirt.io/object-generation";
/// Label: kind of the copied object.
pub const OBJECT_KIND_LABEL: &str = "instancetype.kubevirt.io/object-kind";
/// Label: name of the copied object.
pub const OBJECT_NAME_LABEL: &str = "instancetype.kubevirt.io/object-name";
/// Label: uid of the copied object.
pub const OBJECT_UID_LABEL: &str = "instancetype.kubevirt.io/object-uid";
/// Label: API version of the copied object.
pub const OBJECT_VERSION_LABEL: &str = "instancetype.kubevirt.io/object-version";

/// The four kinds a revision may hold.
pub const KINDS: [&str; 4] = [
    "VirtualMachineInstancetype",
    "VirtualMachineClusterInstancetype",
    "VirtualMachinePreference",
    "VirtualMachineClusterPreference",
];

/// Why a revision cannot be made or read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RevisionError {
    /// The object to copy lacks a field the revision is named after.
    #[error("the {kind} to copy has no metadata.{field}")]
    Incomplete {
        /// Its kind.
        kind: String,
        /// The missing field.
        field: &'static str,
    },
    /// The VM lacks its name, namespace or uid.
    #[error("the VirtualMachine has no metadata.{0}")]
    VmIncomplete(&'static str),
    /// A revision's data is not a copy of one of the four kinds at v1beta1.
    #[error(
        "ControllerRevision {name} holds no {expected} of instancetype.kubevirt.io/v1beta1 (found {found})"
    )]
    Unexpected {
        /// The revision.
        name: String,
        /// What the caller needed (an instance type or a preference).
        expected: &'static str,
        /// What it holds.
        found: String,
    },
}

/// The shared revision's name: KubeVirt's without the VM's name in front.
pub fn revision_name(object: &str, uid: &str, generation: i64) -> String {
    format!("{object}-{VERSION}-{uid}-{generation}")
}

/// The ownerReference of the VM named `vm_name` with uid `vm_uid` on a revision it uses:
/// not the controller (a shared revision has several owners, and at most one may be);
/// blockOwnerDeletion as KubeVirt's, so a foreground deletion of the VM waits for it.
pub fn owner_reference(vm_name: &str, vm_uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: crate::API_VERSION.to_string(),
        kind: "VirtualMachine".to_string(),
        name: vm_name.to_string(),
        uid: vm_uid.to_string(),
        controller: Some(false),
        block_owner_deletion: Some(true),
    }
}

/// Whether the VM with uid `vm_uid` is among the revision's owners.
pub fn owned_by(revision: &ControllerRevision, vm_uid: &str) -> bool {
    owners(revision).iter().any(|o| o.uid == vm_uid)
}

/// The revision's owners other than the VM with uid `vm_uid`.
pub fn other_owners<'a>(revision: &'a ControllerRevision, vm_uid: &str) -> Vec<&'a OwnerReference> {
    owners(revision)
        .iter()
        .filter(|o| o.uid != vm_uid)
        .collect()
}

fn owners(revision: &ControllerRevision) -> &[OwnerReference] {
    revision
        .metadata
        .owner_references
        .as_deref()
        .unwrap_or_default()
}

/// The strategic merge patch adding the VM as an owner: ownerReferences merge by uid on
/// the server, so two VMs adding themselves at once both end up in the list.
pub fn add_owner_patch(vm_name: &str, vm_uid: &str) -> Value {
    serde_json::json!({"metadata": {"ownerReferences": [owner_reference(vm_name, vm_uid)]}})
}

/// The strategic merge patch removing the VM from the owners (the others stay).
pub fn remove_owner_patch(vm_uid: &str) -> Value {
    serde_json::json!({"metadata": {"ownerReferences": [{"$patch": "delete", "uid": vm_uid}]}})
}

/// Whether `revision_name` is the shared revision of `object` (as stored) as it is now:
/// a revision that went (deleted by hand, or by the garbage collector in the instant
/// between its last owner's deletion and a new owner's patch) can then be made again
/// with the same content.
pub fn is_current_copy(revision: &str, object: &Value) -> bool {
    let name = object.pointer("/metadata/name").and_then(Value::as_str);
    let uid = object.pointer("/metadata/uid").and_then(Value::as_str);
    let generation = object
        .pointer("/metadata/generation")
        .and_then(Value::as_i64);
    match (name, uid, generation) {
        (Some(n), Some(u), Some(g)) => revision_name(n, u, g) == revision,
        _ => false,
    }
}

/// The ControllerRevision copying `object` (an instance type or preference as stored, with
/// `kind`) for the VM named `vm_name` with uid `vm_uid` in `namespace`, as its first owner
/// (others add themselves: [`add_owner_patch`]); labelled with what it copies; the copy
/// loses its labels, annotations, finalizers, owners and managed fields, as KubeVirt's.
pub fn controller_revision(
    vm_name: &str,
    vm_uid: &str,
    namespace: &str,
    kind: &str,
    object: &Value,
) -> Result<ControllerRevision, RevisionError> {
    let meta = |field: &'static str| {
        object
            .pointer(&format!("/metadata/{field}"))
            .cloned()
            .ok_or(RevisionError::Incomplete {
                kind: kind.to_string(),
                field,
            })
    };
    let name = meta("name")?.as_str().unwrap_or_default().to_string();
    let uid = meta("uid")?.as_str().unwrap_or_default().to_string();
    let generation = meta("generation")?.as_i64().unwrap_or_default();
    for (v, what) in [(vm_name, "name"), (vm_uid, "uid"), (namespace, "namespace")] {
        if v.is_empty() {
            return Err(RevisionError::VmIncomplete(what));
        }
    }
    let mut data = object.clone();
    if let Some(m) = data.as_object_mut() {
        m.insert("apiVersion".into(), Value::String(API_VERSION.into()));
        m.insert("kind".into(), Value::String(kind.into()));
        if let Some(Value::Object(md)) = m.get_mut("metadata") {
            for f in [
                "labels",
                "annotations",
                "finalizers",
                "ownerReferences",
                "managedFields",
            ] {
                md.remove(f);
            }
        }
    }
    sort_keys(&mut data);
    Ok(ControllerRevision {
        metadata: ObjectMeta {
            name: Some(revision_name(&name, &uid, generation)),
            namespace: Some(namespace.to_string()),
            owner_references: Some(vec![owner_reference(vm_name, vm_uid)]),
            labels: Some(BTreeMap::from([
                (OBJECT_GENERATION_LABEL.to_string(), generation.to_string()),
                (OBJECT_KIND_LABEL.to_string(), kind.to_string()),
                (OBJECT_NAME_LABEL.to_string(), name),
                (OBJECT_UID_LABEL.to_string(), uid),
                (OBJECT_VERSION_LABEL.to_string(), VERSION.to_string()),
            ])),
            ..ObjectMeta::default()
        },
        data: Some(RawExtension(data)),
        revision: 0,
    })
}

/// Orders every object's keys as Go's encoder does: kube-apiserver keeps `data` as the bytes
/// it was given and refuses any change to them, but a strategic merge patch of the revision
/// (the garbage collector's, dropping a deleted VM's ownerReference) re-encodes `data` with
/// sorted keys; the two must be the same bytes, or every such patch fails as "data: field is
/// immutable" (serde_json keeps insertion order here).
fn sort_keys(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.sort_keys();
            m.values_mut().for_each(sort_keys);
        }
        Value::Array(a) => a.iter_mut().for_each(sort_keys),
        _ => {}
    }
}

/// The name of the VM's own revision of a copy, for when the shared one cannot take
/// another owner (KubeVirt's naming: the VM's name in front of the shared one's).
pub fn own_revision_name(vm_name: &str, shared: &str) -> String {
    format!("{vm_name}-{shared}")
}

/// The spec a revision holds, if it is a copy of one of `kinds` (the two instance type
/// kinds, or the two preference kinds) at v1beta1.
pub fn spec_of(
    revision: &ControllerRevision,
    kinds: &[&str],
    expected: &'static str,
) -> Result<Value, RevisionError> {
    let data = revision.data.as_ref().map(|d| &d.0);
    let kind = data
        .and_then(|d| d.get("kind"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    let api_version = data
        .and_then(|d| d.get("apiVersion"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    match data.and_then(|d| d.get("spec")) {
        Some(spec) if api_version == API_VERSION && kinds.contains(&kind) => Ok(spec.clone()),
        _ => Err(RevisionError::Unexpected {
            name: revision.metadata.name.clone().unwrap_or_default(),
            expected,
            found: format!("{api_version} {kind}"),
        }),
    }
}

/// The spec of a revision holding an instance type.
pub fn instancetype_spec(revision: &ControllerRevision) -> Result<Value, RevisionError> {
    spec_of(revision, &KINDS[..2], "instance type")
}

/// The spec of a revision holding a preference.
pub fn preference_spec(revision: &ControllerRevision) -> Result<Value, RevisionError> {
    spec_of(revision, &KINDS[2..], "preference")
}

/// Whether two revisions hold the same copy (KubeVirt compares their specs): an existing
/// revision of the expected name is reused only then.
pub fn same_copy(a: &ControllerRevision, b: &ControllerRevision) -> bool {
    let spec = |r: &ControllerRevision| r.data.as_ref().and_then(|d| d.0.get("spec")).cloned();
    spec(a).is_some() && spec(a) == spec(b)
}

/// Whether `revision` copies the object named `name` (KubeVirt's check before it uses a
/// captured revision: a reference renamed since uses a new copy).
pub fn copies(revision: &ControllerRevision, name: &str) -> bool {
    revision
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(OBJECT_NAME_LABEL))
        .is_some_and(|n| n == name)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn stored() -> Value {
        json!({
            "apiVersion": "instancetype.kubevirt.io/v1beta1",
            "kind": "VirtualMachineClusterInstancetype",
            "metadata": {"name": "u1.nano", "uid": "it-uid", "generation": 3,
                "resourceVersion": "17", "labels": {"app.kubernetes.io/managed-by": "virt-operator"},
                "annotations": {"a": "b"}},
            "spec": {"cpu": {"guest": 1}, "memory": {"guest": "512Mi"}}
        })
    }

    #[test]
    fn a_revision_is_named_for_the_copied_generation_owned_and_labelled() {
        let r = controller_revision(
            "vm1",
            "vm-uid",
            "ns",
            "VirtualMachineClusterInstancetype",
            &stored(),
        )
        .unwrap();
        assert_eq!(r.metadata.name.as_deref(), Some("u1.nano-v1beta1-it-uid-3"));
        assert!(is_current_copy("u1.nano-v1beta1-it-uid-3", &stored()));
        let mut newer = stored();
        newer["metadata"]["generation"] = json!(4);
        assert!(!is_current_copy("u1.nano-v1beta1-it-uid-3", &newer));
        let owner = &r.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (
                owner.kind.as_str(),
                owner.uid.as_str(),
                owner.controller,
                owner.block_owner_deletion
            ),
            ("VirtualMachine", "vm-uid", Some(false), Some(true))
        );
        assert!(owned_by(&r, "vm-uid") && !owned_by(&r, "other"));
        assert!(other_owners(&r, "vm-uid").is_empty());
        let labels = r.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[OBJECT_NAME_LABEL], "u1.nano");
        assert_eq!(labels[OBJECT_GENERATION_LABEL], "3");
        assert_eq!(
            labels[OBJECT_KIND_LABEL],
            "VirtualMachineClusterInstancetype"
        );
        let data = &r.data.as_ref().unwrap().0;
        // Keys in Go's order at every level, so a patch's re-encoding leaves the bytes be.
        let text = serde_json::to_string(data).unwrap();
        assert!(
            text.starts_with(r#"{"apiVersion":"instancetype.kubevirt.io/v1beta1","kind":"#),
            "{text}"
        );
        assert!(text.contains(r#""metadata":{"generation":3,"name":"u1.nano","resourceVersion":"17","uid":"it-uid"}"#), "{text}");
        assert!(data.pointer("/metadata/labels").is_none());
        assert!(data.pointer("/metadata/annotations").is_none());
        assert_eq!(
            instancetype_spec(&r).unwrap(),
            json!({"cpu": {"guest": 1}, "memory": {"guest": "512Mi"}})
        );
        assert!(copies(&r, "u1.nano") && !copies(&r, "u1.small"));
        let e = preference_spec(&r).unwrap_err();
        assert!(e.to_string().contains("holds no preference"), "{e}");
    }

    #[test]
    fn owners_are_added_and_removed_by_uid() {
        let add = add_owner_patch("vm2", "uid-2");
        assert_eq!(add["metadata"]["ownerReferences"][0]["uid"], "uid-2");
        assert_eq!(add["metadata"]["ownerReferences"][0]["controller"], false);
        assert_eq!(
            remove_owner_patch("uid-2"),
            json!({"metadata": {"ownerReferences": [{"$patch": "delete", "uid": "uid-2"}]}})
        );
    }

    #[test]
    fn the_same_copy_is_recognised() {
        let a = controller_revision(
            "vm1",
            "u",
            "ns",
            "VirtualMachineClusterInstancetype",
            &stored(),
        )
        .unwrap();
        let mut changed = stored();
        changed["spec"]["cpu"]["guest"] = json!(2);
        let b = controller_revision(
            "vm1",
            "u",
            "ns",
            "VirtualMachineClusterInstancetype",
            &changed,
        )
        .unwrap();
        assert!(same_copy(&a, &a.clone()));
        assert!(!same_copy(&a, &b));
    }

    #[test]
    fn incomplete_objects_are_refused() {
        let mut o = stored();
        o["metadata"].as_object_mut().unwrap().remove("uid");
        assert_eq!(
            controller_revision("vm1", "u", "ns", "VirtualMachineClusterInstancetype", &o)
                .unwrap_err(),
            RevisionError::Incomplete {
                kind: "VirtualMachineClusterInstancetype".into(),
                field: "uid"
            }
        );
        assert_eq!(
            controller_revision(
                "vm1",
                "",
                "ns",
                "VirtualMachineClusterInstancetype",
                &stored()
            )
            .unwrap_err(),
            RevisionError::VmIncomplete("uid")
        );
    }
}
