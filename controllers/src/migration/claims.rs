//! Claims that a live migration copies (pure): a ReadWriteOnce claim cannot follow its
//! guest to another node, so the migration makes a new claim there, the target launcher
//! pod mounts it, libvirt copies the disk into it while the guest runs (the same NBD
//! stream as containerDisk overlays), and on success the VMI and its VM name the new
//! claim (docs/architecture.md, "Persistent disks").
//!
//! The new claim's name is a function of the source claim and the migration, so every
//! reconcile computes the same one and a repeated create is harmless. Until the migration
//! succeeds the claim carries the migration's uid as a label and the migration as owner:
//! a failed or deleted migration leaves none behind.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimSpec, Pod, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;
use kubevirt_api::migration::names;
use kubevirt_api::vmi::{PersistentVolumeClaimInfo, StorageMigratedVolumeInfo};
use kubevirt_api::{API_VERSION, VirtualMachineInstance, VirtualMachineInstanceMigration};
use serde_json::Value;

/// Infix of a claim made by a migration: `<claim>-mig-<5 characters of its uid>`.
const INFIX: &str = "-mig-";
/// Characters of the migration uid in the name.
const UID_CHARS: usize = 5;
/// Longest claim name (a DNS subdomain).
const MAX_NAME: usize = 253;

/// One volume whose claim a migration replaces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimMove {
    /// The VMI volume.
    pub volume: String,
    /// The claim on the source node.
    pub from: String,
    /// The claim made for the target node.
    pub to: String,
}

/// What becomes of the source claim once the guest runs on the target.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SourcePolicy {
    /// Deleted: its data is now a stale copy.
    Delete,
    /// Kept, for the user to delete.
    Retain,
    /// Not said: a claim kubevirt-rs made (an earlier migration's copy) is deleted, a claim
    /// the user made is kept. kubevirt-rs never deletes a claim it did not create unless
    /// asked (N10 of the security review at bd37f96: a user allowed to migrate VMs but not
    /// to delete claims could have another workload's claim copied and deleted).
    #[default]
    Default,
}

/// The policy a VMI's `kubevirt-rs.io/migrated-claim-policy` annotation names (`Delete` or
/// `Retain`, case-insensitive); without one, or another value, [`SourcePolicy::Default`].
pub fn source_policy(vmi: &VirtualMachineInstance) -> SourcePolicy {
    match vmi
        .annotations()
        .get(names::MIGRATED_CLAIM_POLICY_ANNOTATION)
        .map(|v| v.trim().to_ascii_lowercase())
        .as_deref()
    {
        Some("retain") => SourcePolicy::Retain,
        Some("delete") => SourcePolicy::Delete,
        _ => SourcePolicy::Default,
    }
}

/// Whether the source claim `pvc` goes once its volume moved, under `policy`: asked for,
/// or not said and the claim is one kubevirt-rs made (it names the claim it was copied
/// from).
pub fn deletes_source(policy: SourcePolicy, pvc: Option<&PersistentVolumeClaim>) -> bool {
    match policy {
        SourcePolicy::Delete => true,
        SourcePolicy::Retain => false,
        SourcePolicy::Default => pvc.is_some_and(|c| {
            c.annotations()
                .contains_key(names::MIGRATED_FROM_ANNOTATION)
        }),
    }
}

/// The name of the claim migration `migration_uid` makes for `source`: the source's name
/// without an earlier migration's suffix (names do not grow with every migration), the
/// infix and the start of the uid.
pub fn destination_name(source: &str, migration_uid: &str) -> String {
    let base = match source.rsplit_once(INFIX) {
        Some((base, tail))
            if !base.is_empty()
                && tail.len() == UID_CHARS
                && tail.bytes().all(|b| b.is_ascii_alphanumeric()) =>
        {
            base
        }
        _ => source,
    };
    let tag: String = migration_uid
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(UID_CHARS)
        .collect::<String>()
        .to_ascii_lowercase();
    let keep = MAX_NAME - INFIX.len() - tag.len();
    let mut cut = base.len().min(keep);
    while !base.is_char_boundary(cut) {
        cut -= 1;
    }
    let base = base[..cut].trim_end_matches(['-', '.']);
    format!("{base}{INFIX}{tag}")
}

/// The claims migration `migration_uid` of `vmi` replaces: every claim that is not shared
/// ([`kubevirt_api::copied_claims`]).
pub fn planned_moves(vmi: &VirtualMachineInstance, migration_uid: &str) -> Vec<ClaimMove> {
    kubevirt_api::copied_claims(vmi)
        .into_iter()
        .map(|c| ClaimMove {
            to: destination_name(&c.claim, migration_uid),
            volume: c.volume,
            from: c.claim,
        })
        .collect()
}

/// The moves recorded in the VMI's `status.migratedVolumes` (written at the hand-off), the
/// account a success acts on: by then the spec may already name the new claims.
pub fn recorded_moves(vmi: &VirtualMachineInstance) -> Vec<ClaimMove> {
    vmi.status
        .as_ref()
        .and_then(|s| s.migrated_volumes.as_deref())
        .unwrap_or_default()
        .iter()
        .filter_map(|m| {
            let name = |i: &Option<PersistentVolumeClaimInfo>| i.as_ref()?.claim_name.clone();
            Some(ClaimMove {
                volume: m.volume_name.clone(),
                from: name(&m.source_pvc_info)?,
                to: name(&m.destination_pvc_info)?,
            })
        })
        .collect()
}

/// Labels and annotations a claim copy does not take from its source: the binding's
/// (set by the PV controller and the provisioner for the source's volume) and ours.
fn copied_key(key: &str) -> bool {
    const SKIP: [&str; 5] = [
        "pv.kubernetes.io/",
        "volume.kubernetes.io/",
        "volume.beta.kubernetes.io/",
        "kubevirt-rs.io/",
        "kubectl.kubernetes.io/last-applied-configuration",
    ];
    !SKIP.iter().any(|p| key.starts_with(p))
}

/// The claim `m.to` for migration `vmim`, like `source`: same class, access modes and
/// volume mode, a request of the source's capacity (its disk.img, sized from that
/// capacity, must fit), the source's labels and annotations but for the binding's. No
/// volume name, selector or data source: the class provisions it where the target pod
/// lands (a WaitForFirstConsumer class, such as local-path, on the target's node).
pub fn destination_claim(
    source: &PersistentVolumeClaim,
    m: &ClaimMove,
    vmim: &VirtualMachineInstanceMigration,
) -> PersistentVolumeClaim {
    let uid = vmim.metadata.uid.clone().unwrap_or_default();
    let spec = source.spec.clone().unwrap_or_default();
    let capacity = source
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .or_else(|| {
            spec.resources
                .as_ref()
                .and_then(|r| r.requests.as_ref())
                .and_then(|r| r.get("storage"))
        })
        .cloned();
    let mut labels: BTreeMap<String, String> = source
        .labels()
        .iter()
        .filter(|(k, _)| copied_key(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    labels.insert(names::MIGRATION_CLAIM_LABEL.into(), uid.clone());
    let mut annotations: BTreeMap<String, String> = source
        .annotations()
        .iter()
        .filter(|(k, _)| copied_key(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    annotations.insert(names::MIGRATED_FROM_ANNOTATION.into(), m.from.clone());
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(m.to.clone()),
            namespace: source.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: Some(annotations),
            owner_references: Some(vec![OwnerReference {
                api_version: API_VERSION.into(),
                kind: "VirtualMachineInstanceMigration".into(),
                name: vmim.name_any(),
                uid,
                controller: Some(true),
                block_owner_deletion: Some(false),
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: spec.access_modes.clone(),
            storage_class_name: spec.storage_class_name.clone(),
            volume_mode: spec.volume_mode.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: capacity.map(|q: Quantity| BTreeMap::from([("storage".into(), q)])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        status: None,
    }
}

/// Whether `pvc` is the claim migration `migration_uid` made and has not handed over yet.
pub fn made_by(pvc: &PersistentVolumeClaim, migration_uid: &str) -> bool {
    pvc.labels()
        .get(names::MIGRATION_CLAIM_LABEL)
        .map(String::as_str)
        == Some(migration_uid)
}

/// The target launcher pod mounts the new claims where the source pod mounts the old.
pub fn retarget_pod(pod: &mut Pod, moves: &[ClaimMove]) {
    let volumes = pod
        .spec
        .as_mut()
        .and_then(|s| s.volumes.as_mut())
        .into_iter()
        .flatten();
    for v in volumes {
        if let Some(c) = v.persistent_volume_claim.as_mut()
            && let Some(m) = moves.iter().find(|m| m.from == c.claim_name)
        {
            c.claim_name = m.to.clone();
        }
    }
}

/// `status.migratedVolumes` at the hand-off: each move with what is known of both claims
/// (the source's from the VMI's volumeStatus, the target's from the claim itself).
pub fn migrated_volumes(
    vmi: &VirtualMachineInstance,
    moves: &[ClaimMove],
    destinations: &[PersistentVolumeClaim],
) -> Result<Vec<StorageMigratedVolumeInfo>, String> {
    let volume_status = vmi
        .status
        .as_ref()
        .and_then(|s| s.volume_status.as_deref())
        .unwrap_or_default();
    moves
        .iter()
        .map(|m| {
            let mut source = volume_status
                .iter()
                .find(|s| s.name == m.volume)
                .and_then(|s| s.persistent_volume_claim_info.clone())
                .unwrap_or_default();
            source.claim_name = Some(m.from.clone());
            let dest = destinations
                .iter()
                .find(|p| p.metadata.name.as_deref() == Some(m.to.as_str()))
                .ok_or_else(|| {
                    format!("the target claim {} of volume {} is gone", m.to, m.volume)
                })?;
            Ok(StorageMigratedVolumeInfo {
                volume_name: m.volume.clone(),
                source_pvc_info: Some(source),
                destination_pvc_info: Some(crate::vmi::claims::Claim::from_pvc(dest).info),
            })
        })
        .collect()
}

/// `volumes` (a VMI's `spec.volumes` or a VM's `spec.template.spec.volumes`) with each
/// moved volume pointing at its new claim, for a merge patch guarded by the object's
/// resourceVersion; None when nothing is left to change (a repeated success).
pub fn moved_volumes(volumes: Option<&Value>, moves: &[ClaimMove]) -> Option<Value> {
    let mut out = volumes?.as_array()?.clone();
    let mut changed = false;
    for v in &mut out {
        let name = v.get("name").and_then(Value::as_str).map(str::to_string);
        let Some(claim) = v.pointer_mut("/persistentVolumeClaim/claimName") else {
            continue;
        };
        if let Some(m) = moves
            .iter()
            .find(|m| Some(&m.volume) == name.as_ref() && claim.as_str() == Some(m.from.as_str()))
        {
            *claim = Value::String(m.to.clone());
            changed = true;
        }
    }
    changed.then_some(Value::Array(out))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    fn vmim() -> VirtualMachineInstanceMigration {
        serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
            "metadata": {"name": "m", "namespace": "ns", "uid": "7F3a9c00-0000-4000-8000-000000000000"},
            "spec": {"vmiName": "a"}
        }))
        .unwrap()
    }

    #[test]
    fn destination_names_do_not_grow_and_stay_valid() {
        let uid = "7f3a9c00-0000-4000-8000-000000000000";
        assert_eq!(destination_name("data", uid), "data-mig-7f3a9");
        // A claim an earlier migration made: its suffix is replaced, not extended.
        assert_eq!(destination_name("data-mig-1b2c3", uid), "data-mig-7f3a9");
        // Not our suffix: kept.
        assert_eq!(destination_name("data-mig-x", uid), "data-mig-x-mig-7f3a9");
        assert_eq!(destination_name("-mig-abcde", uid), "-mig-abcde-mig-7f3a9");
        let long = "a".repeat(253);
        let n = destination_name(&long, uid);
        assert_eq!(n.len(), 253);
        assert!(n.ends_with("a-mig-7f3a9"));
        // A cut that would end in a dash does not.
        let dashed = format!("{}-{}", "b".repeat(242), "c".repeat(20));
        assert!(destination_name(&dashed, uid).ends_with("b-mig-7f3a9"));
    }

    #[test]
    fn the_destination_claim_is_like_the_source_but_unbound_and_owned_by_the_migration() {
        let source: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "ns", "uid": "src",
                "labels": {"app": "db"},
                "annotations": {"note": "x", "pv.kubernetes.io/bind-completed": "yes",
                    "volume.kubernetes.io/selected-node": "n1"},
                "finalizers": ["kubernetes.io/pvc-protection"]},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local-path",
                "volumeMode": "Filesystem", "volumeName": "pvc-123",
                "selector": {"matchLabels": {"x": "y"}},
                "resources": {"requests": {"storage": "1Gi"}}},
            "status": {"phase": "Bound", "capacity": {"storage": "2Gi"}}
        }))
        .unwrap();
        let m = ClaimMove {
            volume: "d".into(),
            from: "data".into(),
            to: "data-mig-7f3a9".into(),
        };
        let got = serde_json::to_value(destination_claim(&source, &m, &vmim())).unwrap();
        assert_eq!(
            got,
            json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "data-mig-7f3a9", "namespace": "ns",
                    "labels": {"app": "db", "kubevirt-rs.io/migration-uid": "7F3a9c00-0000-4000-8000-000000000000"},
                    "annotations": {"note": "x", "kubevirt-rs.io/migrated-from": "data"},
                    "ownerReferences": [{"apiVersion": "kubevirt.io/v1",
                        "kind": "VirtualMachineInstanceMigration", "name": "m",
                        "uid": "7F3a9c00-0000-4000-8000-000000000000",
                        "controller": true, "blockOwnerDeletion": false}]},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local-path",
                    "volumeMode": "Filesystem", "resources": {"requests": {"storage": "2Gi"}}}
            })
        );
    }

    #[test]
    fn moved_volumes_change_only_the_moved_claims() {
        let moves = [ClaimMove {
            volume: "d".into(),
            from: "data".into(),
            to: "data-mig-7f3a9".into(),
        }];
        let volumes = json!([
            {"name": "r", "containerDisk": {"image": "x"}},
            {"name": "d", "persistentVolumeClaim": {"claimName": "data", "readOnly": false}},
            {"name": "e", "persistentVolumeClaim": {"claimName": "data"}}
        ]);
        assert_eq!(
            moved_volumes(Some(&volumes), &moves),
            Some(json!([
                {"name": "r", "containerDisk": {"image": "x"}},
                {"name": "d", "persistentVolumeClaim": {"claimName": "data-mig-7f3a9", "readOnly": false}},
                {"name": "e", "persistentVolumeClaim": {"claimName": "data"}}
            ]))
        );
        // Already moved (a repeated success): nothing to do.
        let moved =
            json!([{"name": "d", "persistentVolumeClaim": {"claimName": "data-mig-7f3a9"}}]);
        assert_eq!(moved_volumes(Some(&moved), &moves), None);
        assert_eq!(moved_volumes(None, &moves), None);
    }

    /// N10 of the security review at bd37f96: a claim the user made is kept unless the VM
    /// asks for deletion; one kubevirt-rs made (an earlier copy) goes.
    #[test]
    fn only_claims_kubevirt_rs_made_are_deleted_unless_asked() {
        let claim = |annotations: serde_json::Value| -> PersistentVolumeClaim {
            serde_json::from_value(json!({"metadata": {"name": "c", "annotations": annotations}}))
                .unwrap()
        };
        let users = claim(json!({}));
        let ours = claim(json!({(names::MIGRATED_FROM_ANNOTATION): "data"}));
        assert!(!deletes_source(SourcePolicy::Default, Some(&users)));
        assert!(deletes_source(SourcePolicy::Default, Some(&ours)));
        assert!(deletes_source(SourcePolicy::Delete, Some(&users)));
        assert!(!deletes_source(SourcePolicy::Retain, Some(&ours)));
        assert!(!deletes_source(SourcePolicy::Default, None));
        let with = |v: &str| -> VirtualMachineInstance {
            serde_json::from_value(json!({
                "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                "metadata": {"name": "a", "annotations": {(names::MIGRATED_CLAIM_POLICY_ANNOTATION): v}},
                "spec": {"domain": {"devices": {}}}}))
            .unwrap()
        };
        assert_eq!(source_policy(&with("delete")), SourcePolicy::Delete);
        assert_eq!(source_policy(&with(" Retain")), SourcePolicy::Retain);
        assert_eq!(source_policy(&with("sometimes")), SourcePolicy::Default);
    }

    #[test]
    fn moves_are_planned_from_the_spec_and_acted_on_from_the_record() {
        let vmi: VirtualMachineInstance = serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "a", "namespace": "ns",
                "annotations": {"kubevirt-rs.io/migrated-claim-policy": "Retain"}},
            "spec": {"domain": {"devices": {}}, "volumes": [
                {"name": "d", "persistentVolumeClaim": {"claimName": "data"}},
                {"name": "s", "persistentVolumeClaim": {"claimName": "shared"}}]},
            "status": {"volumeStatus": [
                {"name": "d", "persistentVolumeClaimInfo": {"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem"}},
                {"name": "s", "persistentVolumeClaimInfo": {"accessModes": ["ReadWriteMany"]}}]}
        }))
        .unwrap();
        let moves = planned_moves(&vmi, "7f3a9c00");
        assert_eq!(
            moves,
            [ClaimMove {
                volume: "d".into(),
                from: "data".into(),
                to: "data-mig-7f3a9".into()
            }]
        );
        assert_eq!(source_policy(&vmi), SourcePolicy::Retain);

        let dest: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "data-mig-7f3a9"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
            "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}}
        }))
        .unwrap();
        let record = migrated_volumes(&vmi, &moves, std::slice::from_ref(&dest)).unwrap();
        assert_eq!(
            serde_json::to_value(&record).unwrap(),
            json!([{"volumeName": "d",
                "sourcePVCInfo": {"claimName": "data", "accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem"},
                "destinationPVCInfo": {"claimName": "data-mig-7f3a9", "accessModes": ["ReadWriteOnce"],
                    "volumeMode": "Filesystem", "capacity": {"storage": "1Gi"},
                    "requests": {"storage": "1Gi"}, "filesystemOverhead": "0.055"}}])
        );
        assert!(
            migrated_volumes(&vmi, &moves, &[])
                .unwrap_err()
                .contains("data-mig-7f3a9")
        );
        let mut recorded = vmi.clone();
        recorded.status.as_mut().unwrap().migrated_volumes = Some(record);
        assert_eq!(recorded_moves(&recorded), moves);

        let mut pod: Pod = serde_json::from_value(json!({"spec": {"containers": [], "volumes": [
            {"name": "claim-0", "persistentVolumeClaim": {"claimName": "data"}},
            {"name": "claim-1", "persistentVolumeClaim": {"claimName": "shared"}}]}}))
        .unwrap();
        retarget_pod(&mut pod, &moves);
        let v = serde_json::to_value(&pod).unwrap();
        assert_eq!(
            v["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
            "data-mig-7f3a9"
        );
        assert_eq!(
            v["spec"]["volumes"][1]["persistentVolumeClaim"]["claimName"],
            "shared"
        );
    }
}
