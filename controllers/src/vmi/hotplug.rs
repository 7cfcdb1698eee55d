//! Attachment pods of hotplugged volumes (issue 44): a running pod cannot gain a volume, so
//! each hotplugged claim is mounted on the VMI's node by a pod of its own, which
//! virt-handler takes the disk image from into the launcher pod (docs/architecture.md,
//! "Volume hotplug").
//!
//! **Why one pod per volume** (KubeVirt uses one pod for all of a VMI's hotplugged
//! volumes and replaces it on every change): adding or removing a volume never touches
//! the pod of another, which is what broke KubeVirt's first volume when a second one came
//! or went (kubevirt/kubevirt#6564, #9263).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    Affinity, Container, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec, ResourceRequirements,
    SeccompProfile, Toleration, Volume, VolumeDevice, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;
use kubevirt_api::VirtualMachineInstance;
use kubevirt_api::hotplug::{
    ATTACHMENT_APP, ATTACHMENT_MOUNT_DIR, ATTACHMENT_VMI_UID_LABEL, ATTACHMENT_VOLUME_LABEL,
};
use kubevirt_api::vmi::VirtualMachineInstancePhase as Phase;

use super::claims::{Claim, Mode};
use super::render::{LAUNCHER_LABEL, LauncherConfig, unprivileged};

/// Annotation of an attachment pod: bytes of the `disk.img` virt-handler creates in an
/// empty Filesystem-mode claim (the claim's capacity less the file system's overhead, as
/// the launcher sizes the `disk.img` of a claim it mounts itself).
pub const DISK_SIZE_ANNOTATION: &str = "kubevirt-rs.io/hotplug-disk-size";

/// The label selector of `vmi`'s attachment pods.
pub fn selector(vmi_uid: &str) -> String {
    format!("{LAUNCHER_LABEL}={ATTACHMENT_APP},{ATTACHMENT_VMI_UID_LABEL}={vmi_uid}")
}

/// The hotplugged volumes of `vmi` and their claims (a DataVolume's claim has its name).
pub fn wanted(vmi: &VirtualMachineInstance) -> BTreeMap<String, (String, bool)> {
    kubevirt_api::hotplug::hotplugged(&vmi.spec)
        .into_iter()
        .filter_map(|(v, _)| {
            let (claim, ro) = match (&v.persistent_volume_claim, &v.data_volume) {
                (Some(p), _) => (p.claim_name.clone(), p.read_only == Some(true)),
                (None, Some(d)) => (d.name.clone(), false),
                _ => return None,
            };
            Some((v.name.clone(), (claim, ro)))
        })
        .collect()
}

/// What the VMI controller does about `vmi`'s attachment pods.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Volumes (with their claim and read-only flag) that need a pod on the VMI's node.
    pub create: Vec<(String, String, bool)>,
    /// Pods (by name) to delete: of a volume that is gone from the spec and that
    /// virt-handler has let go of (no `volumeStatus` entry any more), or on another node.
    pub delete: Vec<String>,
}

/// The node and launcher pod a hotplugged volume is attached for: a Running VMI's.
pub fn attach_to<'a>(vmi: &VirtualMachineInstance, launchers: &'a [Pod]) -> Option<&'a Pod> {
    let st = vmi.status.as_ref()?;
    if st.phase != Phase::Running {
        return None;
    }
    let node = st.node_name.as_deref()?;
    launchers.iter().find(|p| {
        p.metadata.deletion_timestamp.is_none()
            && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            && st
                .active_pods
                .as_ref()
                .is_some_and(|a| p.uid().is_some_and(|u| a.contains_key(&u)))
    })
}

/// Decides on `vmi`'s attachment pods `pods`, the launcher they serve being `launcher`
/// (`None`: the VMI does not run, every pod goes once virt-handler let its volume go).
pub fn plan(vmi: &VirtualMachineInstance, launcher: Option<&Pod>, pods: &[Pod]) -> Plan {
    let wanted = if launcher.is_some() {
        wanted(vmi)
    } else {
        BTreeMap::new()
    };
    // Volumes virt-handler still reports: their pod stays until it unplugged them.
    let held: BTreeSet<&str> = vmi
        .status
        .as_ref()
        .and_then(|s| s.volume_status.as_ref())
        .into_iter()
        .flatten()
        .filter(|s| s.hotplug_volume.is_some())
        .map(|s| s.name.as_str())
        .collect();
    let node = launcher.and_then(|l| l.spec.as_ref()?.node_name.as_deref());
    let mut plan = Plan::default();
    let mut have = BTreeSet::new();
    for p in pods {
        let volume = p
            .labels()
            .get(ATTACHMENT_VOLUME_LABEL)
            .cloned()
            .unwrap_or_default();
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let owner_ok = launcher.is_some_and(|l| {
            p.owner_references()
                .iter()
                .any(|o| Some(&o.uid) == l.metadata.uid.as_ref())
        });
        let failed = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed");
        let keep = (wanted.contains_key(&volume) && owner_ok && !failed)
            || (held.contains(volume.as_str()) && node.is_some() && owner_ok);
        if keep {
            have.insert(volume);
        } else {
            plan.delete.push(p.name_any());
        }
    }
    for (volume, (claim, ro)) in wanted {
        if !have.contains(&volume) {
            plan.create.push((volume, claim, ro));
        }
    }
    plan
}

/// The attachment pod of hotplugged volume `volume` (claim `claim`) of `vmi`, for its
/// launcher pod `launcher` on that pod's node.
pub fn attachment_pod(
    vmi: &VirtualMachineInstance,
    launcher: &Pod,
    volume: &str,
    claim: &Claim,
    read_only: bool,
    cfg: &LauncherConfig,
) -> Pod {
    let node = launcher
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    let labels = BTreeMap::from([
        (LAUNCHER_LABEL.to_string(), ATTACHMENT_APP.to_string()),
        (
            ATTACHMENT_VMI_UID_LABEL.to_string(),
            vmi.uid().unwrap_or_default(),
        ),
        (ATTACHMENT_VOLUME_LABEL.to_string(), volume.to_string()),
        // The VMI a change of this pod reconciles.
        (super::render::VM_NAME_LABEL.to_string(), vmi.name_any()),
    ]);
    let annotations = claim
        .disk_img_size()
        .filter(|_| claim.mode == Mode::Filesystem)
        .map(|b| BTreeMap::from([(DISK_SIZE_ANNOTATION.to_string(), b.to_string())]));
    let path = format!("{ATTACHMENT_MOUNT_DIR}/{volume}");
    let (mounts, devices) = match claim.mode {
        Mode::Filesystem => (
            Some(vec![VolumeMount {
                name: "hotplug".into(),
                mount_path: path,
                read_only: Some(read_only),
                ..VolumeMount::default()
            }]),
            None,
        ),
        Mode::Block => (
            None,
            Some(vec![VolumeDevice {
                name: "hotplug".into(),
                device_path: path,
            }]),
        ),
    };
    let q = |s: &str| Quantity(s.into());
    Pod {
        metadata: ObjectMeta {
            generate_name: Some("hp-volume-".into()),
            namespace: vmi.namespace(),
            labels: Some(labels),
            annotations,
            // Goes with the launcher pod (the garbage collector), whatever happens here.
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: launcher.name_any(),
                uid: launcher.uid().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            // Scheduled, not bound by name: the scheduler binds a WaitForFirstConsumer
            // claim for the node and checks the volume's topology.
            affinity: Some(Affinity {
                node_affinity: Some(NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                        node_selector_terms: vec![NodeSelectorTerm {
                            match_fields: Some(vec![NodeSelectorRequirement {
                                key: "metadata.name".into(),
                                operator: "In".into(),
                                values: Some(vec![node]),
                            }]),
                            ..NodeSelectorTerm::default()
                        }],
                    }),
                    ..NodeAffinity::default()
                }),
                ..Affinity::default()
            }),
            // Wherever the VMI runs, even on a cordoned or tainted node.
            tolerations: Some(vec![Toleration {
                operator: Some("Exists".into()),
                ..Toleration::default()
            }]),
            containers: vec![Container {
                name: "hotplug-disk".into(),
                image: Some(cfg.image.clone()),
                image_pull_policy: cfg.image_pull_policy.clone(),
                // Only holds the mount; sleeps as PID 1 (which ignores SIGTERM: the grace
                // period below is short).
                command: Some(vec![
                    "/usr/bin/busybox".into(),
                    "sleep".into(),
                    "2147483647".into(),
                ]),
                resources: Some(ResourceRequirements {
                    requests: Some(BTreeMap::from([
                        ("cpu".into(), q("1m")),
                        ("memory".into(), q("4Mi")),
                    ])),
                    limits: Some(BTreeMap::from([
                        ("cpu".into(), q("10m")),
                        ("memory".into(), q("16Mi")),
                    ])),
                    ..ResourceRequirements::default()
                }),
                security_context: Some(unprivileged()),
                volume_mounts: mounts,
                volume_devices: devices,
                termination_message_policy: Some("FallbackToLogsOnError".into()),
                ..Container::default()
            }],
            termination_grace_period_seconds: Some(1),
            volumes: Some(vec![Volume {
                name: "hotplug".into(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim.claim_name.clone(),
                    read_only: Some(read_only),
                }),
                ..Volume::default()
            }]),
            security_context: Some(PodSecurityContext {
                run_as_user: Some(kubevirt_api::LAUNCHER_UID.into()),
                run_as_group: Some(kubevirt_api::LAUNCHER_UID.into()),
                run_as_non_root: Some(true),
                fs_group: Some(kubevirt_api::LAUNCHER_UID.into()),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    ..SeccompProfile::default()
                }),
                ..PodSecurityContext::default()
            }),
            ..PodSpec::default()
        }),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn vmi(status: serde_json::Value) -> VirtualMachineInstance {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "v", "namespace": "ns", "uid": "vmi-uid"},
            "spec": {
                "domain": {"devices": {"disks": [
                    {"name": "root"}, {"name": "data", "disk": {"bus": "scsi"}}]}},
                "volumes": [
                    {"name": "root", "persistentVolumeClaim": {"claimName": "root-pvc"}},
                    {"name": "data", "persistentVolumeClaim": {"claimName": "data-pvc", "hotpluggable": true}}]
            },
            "status": status
        }))
        .unwrap()
    }

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    fn launcher() -> Pod {
        pod(serde_json::json!({
            "metadata": {"name": "virt-launcher-v-abc", "uid": "pod-uid"},
            "spec": {"nodeName": "n1", "containers": []},
            "status": {"phase": "Running"}
        }))
    }

    fn attachment(volume: &str, owner: &str) -> Pod {
        pod(serde_json::json!({
            "metadata": {"name": format!("hp-volume-{volume}"),
                "labels": {ATTACHMENT_VOLUME_LABEL: volume},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "l", "uid": owner}]},
            "spec": {"containers": []}
        }))
    }

    fn running() -> VirtualMachineInstance {
        vmi(serde_json::json!({"phase": "Running", "nodeName": "n1",
            "activePods": {"pod-uid": "n1"}}))
    }

    #[test]
    fn a_hotplugged_volume_of_a_running_vmi_gets_one_pod_on_its_node() {
        let v = running();
        let launchers = [launcher()];
        let l = attach_to(&v, &launchers).expect("the launcher");
        assert_eq!(
            plan(&v, Some(l), &[]).create,
            [("data".to_string(), "data-pvc".to_string(), false)]
        );
        assert_eq!(
            plan(&v, Some(l), &[attachment("data", "pod-uid")]),
            Plan::default()
        );
        // Not before the VMI runs.
        let pending = vmi(serde_json::json!({"phase": "Scheduled", "nodeName": "n1"}));
        assert!(attach_to(&pending, &launchers).is_none());
        let claim = Claim {
            claim_name: "data-pvc".into(),
            mode: Mode::Filesystem,
            capacity: Some(1 << 30),
            phase: "Bound".into(),
            info: Default::default(),
        };
        let p = attachment_pod(&v, l, "data", &claim, false, &LauncherConfig::default());
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(
            spec.volumes.as_ref().unwrap()[0]
                .persistent_volume_claim
                .as_ref()
                .unwrap()
                .claim_name,
            "data-pvc"
        );
        assert_eq!(
            spec.containers[0].volume_mounts.as_ref().unwrap()[0].mount_path,
            "/hp/data"
        );
        assert_eq!(p.owner_references()[0].uid, "pod-uid");
        assert!(p.annotations().contains_key(DISK_SIZE_ANNOTATION));
    }

    #[test]
    fn a_removed_volume_keeps_its_pod_until_virt_handler_lets_it_go() {
        let mut v = running();
        v.spec.volumes.as_mut().unwrap().truncate(1);
        let launchers = [launcher()];
        let l = attach_to(&v, &launchers);
        let pods = [attachment("data", "pod-uid")];
        assert_eq!(plan(&v, l, &pods).delete, ["hp-volume-data"]);
        v.status.as_mut().unwrap().volume_status = Some(vec![
            serde_json::from_value(
                serde_json::json!({"name": "data", "phase": "Detaching", "hotplugVolume": {}}),
            )
            .unwrap(),
        ]);
        assert_eq!(plan(&v, l, &pods), Plan::default());
        // A pod of another launcher (a previous node) goes.
        let v = running();
        let pods = [attachment("data", "old-pod")];
        let p = plan(&v, l, &pods);
        assert_eq!(p.delete, ["hp-volume-data"]);
        assert_eq!(p.create.len(), 1);
    }
}
