//! The migration target launcher pod (pure): the VMI's launcher pod from
//! [`crate::vmi::render::launcher_pod`], changed where a target differs
//! (docs/cluster-flow.md §6).

use k8s_openapi::api::core::v1::{Affinity, Pod, PodAffinityTerm, PodAntiAffinity};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, OwnerReference};
use kube::ResourceExt;
use kubevirt_api::migration::names;
use kubevirt_api::{API_VERSION, VirtualMachineInstance, VirtualMachineInstanceMigration};

use super::claims::{ClaimMove, retarget_pod};
use crate::vmi::render::{
    COMPUTE_CONTAINER, CREATED_BY_LABEL, LauncherConfig, PodRenderError, launcher_pod,
};

/// Launcher flag: wait for the incoming migration instead of booting the guest.
pub const MIGRATION_TARGET_FLAG: &str = "--migration-target";
/// Topology key of the anti-affinity that keeps the target off the source node.
pub const HOSTNAME_TOPOLOGY_KEY: &str = "kubernetes.io/hostname";

/// Why a target pod cannot be rendered.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TargetRenderError {
    /// The VMI's own pod does not render.
    #[error(transparent)]
    Pod(#[from] PodRenderError),
    /// The migration has no uid (not read from the API).
    #[error("migration {0} has no uid")]
    NotPersisted(String),
}

/// Renders the target launcher pod of `vmim` for `vmi`:
/// - label `kubevirt.io/migrationJobUID=<uid>`, annotation `kubevirt.io/migrationJobName`;
/// - controlled by the migration until the migration succeeds and hands it to the VMI,
///   so the VMI controller does not take a target that may never run the guest for
///   the VMI's pod;
/// - required pod anti-affinity on `kubernetes.io/hostname` against every pod of the
///   VMI (KubeVirt's): never the source node;
/// - `spec.addedNodeSelector` merged into the node selector;
/// - the launcher waits for the incoming guest (`--migration-target`); its sockets are in
///   its own emptyDir like every launcher pod's;
/// - the claims the migration copies (`moves`) are mounted from their new claims, where
///   the source pod mounts the old ones.
pub fn target_pod(
    vmi: &VirtualMachineInstance,
    vmim: &VirtualMachineInstanceMigration,
    cfg: &LauncherConfig,
    moves: &[ClaimMove],
) -> Result<Pod, TargetRenderError> {
    let muid = vmim
        .metadata
        .uid
        .clone()
        .ok_or_else(|| TargetRenderError::NotPersisted(vmim.name_any()))?;
    let mut pod = launcher_pod(vmi, cfg)?;
    retarget_pod(&mut pod, moves);
    let vmi_uid = vmi.metadata.uid.clone().unwrap_or_default();

    pod.labels_mut()
        .insert(names::MIGRATION_JOB_LABEL.into(), muid.clone());
    pod.annotations_mut()
        .insert(names::MIGRATION_JOB_NAME_ANNOTATION.into(), vmim.name_any());
    pod.metadata.owner_references = Some(vec![OwnerReference {
        api_version: API_VERSION.into(),
        kind: "VirtualMachineInstanceMigration".into(),
        name: vmim.name_any(),
        uid: muid.clone(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);

    let spec = pod.spec.get_or_insert_with(Default::default);
    if let Some(added) = &vmim.spec.added_node_selector {
        let sel = spec.node_selector.get_or_insert_with(Default::default);
        sel.extend(added.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    let term = PodAffinityTerm {
        label_selector: Some(LabelSelector {
            match_labels: Some([(CREATED_BY_LABEL.to_string(), vmi_uid)].into()),
            ..LabelSelector::default()
        }),
        topology_key: HOSTNAME_TOPOLOGY_KEY.into(),
        ..PodAffinityTerm::default()
    };
    spec.affinity
        .get_or_insert_with(Affinity::default)
        .pod_anti_affinity
        .get_or_insert_with(PodAntiAffinity::default)
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_with(Vec::new)
        .push(term);
    for c in spec
        .containers
        .iter_mut()
        .filter(|c| c.name == COMPUTE_CONTAINER)
    {
        c.args
            .get_or_insert_with(Vec::new)
            .push(MIGRATION_TARGET_FLAG.into());
    }
    Ok(pod)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    #[test]
    fn target_pod_differs_from_the_launcher_pod_only_where_a_target_must() {
        let vmi: VirtualMachineInstance = serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "a", "namespace": "ns", "uid": "vmi-uid"},
            "spec": {"domain": {"devices": {}, "resources": {"requests": {"memory": "64Mi"}}},
                     "nodeSelector": {"disk": "ssd"},
                     "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                         {"topologyKey": "zone", "labelSelector": {"matchLabels": {"app": "x"}}}]}}}
        }))
        .unwrap();
        let vmim: VirtualMachineInstanceMigration = serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
            "metadata": {"name": "m", "namespace": "ns", "uid": "1234abcd-ef00-0000-0000-000000000000"},
            "spec": {"vmiName": "a", "addedNodeSelector": {"rack": "r2"}}
        }))
        .unwrap();
        let cfg = LauncherConfig::default();
        let base = serde_json::to_value(launcher_pod(&vmi, &cfg).unwrap()).unwrap();
        let pod = serde_json::to_value(target_pod(&vmi, &vmim, &cfg, &[]).unwrap()).unwrap();
        assert_eq!(
            pod["metadata"]["labels"]["kubevirt.io/migrationJobUID"],
            vmim.metadata.uid.clone().unwrap()
        );
        assert_eq!(
            pod["metadata"]["labels"]["kubevirt.io/created-by"],
            "vmi-uid"
        );
        assert_eq!(
            pod["metadata"]["annotations"]["kubevirt.io/migrationJobName"],
            "m"
        );
        assert_eq!(
            pod["metadata"]["ownerReferences"],
            json!([{"apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstanceMigration", "name": "m",
            "uid": "1234abcd-ef00-0000-0000-000000000000", "controller": true, "blockOwnerDeletion": true}])
        );
        assert_eq!(
            pod["spec"]["nodeSelector"],
            json!({"disk": "ssd", "rack": "r2"})
        );
        assert_eq!(
            pod["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"],
            json!([{"topologyKey": "zone", "labelSelector": {"matchLabels": {"app": "x"}}},
                   {"topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": {"kubevirt.io/created-by": "vmi-uid"}}}])
        );
        let args = pod["spec"]["containers"][0]["args"].as_array().unwrap();
        assert_eq!(args.last().unwrap(), "--migration-target");
        assert_eq!(
            args.len(),
            base["spec"]["containers"][0]["args"]
                .as_array()
                .unwrap()
                .len()
                + 1
        );
        assert_eq!(
            pod["spec"]["containers"][0]["volumeMounts"],
            base["spec"]["containers"][0]["volumeMounts"]
        );
        assert_eq!(pod["spec"]["volumes"], base["spec"]["volumes"]);
        // Everything else is the VMI's launcher pod.
        assert_eq!(
            pod["spec"]["containers"][0]["resources"],
            base["spec"]["containers"][0]["resources"]
        );
        assert_eq!(
            pod["metadata"]["generateName"],
            base["metadata"]["generateName"]
        );
    }
}
