//! What the replica set controller does, as a pure function of a replica set and the VMIs
//! it controls (KubeVirt's `watch/replicaset`): VMIs to create, VMIs to delete (finished
//! ones, and the surplus on scale-in, least useful first), and the next status.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kubevirt_api::common::{ConditionStatus, find_condition};
use kubevirt_api::replicaset::{
    VirtualMachineInstanceReplicaSet, VirtualMachineInstanceReplicaSetStatus,
};
use kubevirt_api::vmi::{VirtualMachineInstancePhase as Phase, condition_types};
use kubevirt_api::{API_VERSION, VirtualMachineInstance};

use crate::replicas::{Failure, conditions, controller_ref, controller_uid, deleting};

/// The kind, for owner references.
pub const KIND: &str = "VirtualMachineInstanceReplicaSet";

/// A VMI to delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Doomed {
    /// Its name.
    pub name: String,
    /// Its uid (a delete precondition: never another VMI of the same name).
    pub uid: String,
}

/// One reconcile's plan.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    /// VMIs to create from the template.
    pub create: usize,
    /// VMIs to delete.
    pub delete: Vec<Doomed>,
}

/// Whether a VMI is ready (its Ready condition is True).
pub fn is_ready(vmi: &VirtualMachineInstance) -> bool {
    vmi.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .and_then(|c| find_condition(c, condition_types::READY))
        .is_some_and(|c| c.status == ConditionStatus::True)
}

fn phase(vmi: &VirtualMachineInstance) -> Phase {
    vmi.status
        .as_ref()
        .map(|s| s.phase)
        .unwrap_or(Phase::Pending)
}

/// Whether the VMI is one of the replica set's running replicas: not finished, not going.
pub fn is_active(vmi: &VirtualMachineInstance) -> bool {
    !deleting(&vmi.metadata) && !phase(vmi).is_final()
}

/// The VMIs of `vmis` that `rs` controls.
pub fn owned<'a>(
    rs: &VirtualMachineInstanceReplicaSet,
    vmis: impl IntoIterator<Item = &'a VirtualMachineInstance>,
) -> Vec<&'a VirtualMachineInstance> {
    let Some(uid) = rs.metadata.uid.as_deref() else {
        return Vec::new();
    };
    vmis.into_iter()
        .filter(|v| controller_uid(&v.metadata) == Some(uid))
        .collect()
}

/// The plan for `rs` and the VMIs it controls. Paused: nothing. Otherwise finished VMIs
/// go (KubeVirt cleans them up; their replacements count as missing at once), missing
/// ones are created, and on scale-in the least useful go first: not yet running before
/// running, unready before ready, the youngest first.
pub fn plan(rs: &VirtualMachineInstanceReplicaSet, owned: &[&VirtualMachineInstance]) -> Plan {
    if rs.spec.is_paused() {
        return Plan::default();
    }
    let doomed = |v: &VirtualMachineInstance| Doomed {
        name: v.name_any(),
        uid: v.metadata.uid.clone().unwrap_or_default(),
    };
    let mut delete: Vec<Doomed> = owned
        .iter()
        .filter(|v| !deleting(&v.metadata) && phase(v).is_final())
        .map(|v| doomed(v))
        .collect();
    let mut active: Vec<&VirtualMachineInstance> =
        owned.iter().copied().filter(|v| is_active(v)).collect();
    let desired = usize::try_from(rs.spec.desired().max(0)).unwrap_or(0);
    let create = desired.saturating_sub(active.len());
    if active.len() > desired {
        active.sort_by_key(|v| {
            (
                phase(v) == Phase::Running,
                is_ready(v),
                std::cmp::Reverse(v.metadata.creation_timestamp.clone()),
            )
        });
        delete.extend(active[..active.len() - desired].iter().map(|v| doomed(v)));
    }
    Plan { create, delete }
}

/// The status after a reconcile: the active and ready counts, the selector for `/scale`,
/// the conditions.
pub fn status(
    rs: &VirtualMachineInstanceReplicaSet,
    owned: &[&VirtualMachineInstance],
    failure: Option<&Failure>,
    now: Timestamp,
) -> VirtualMachineInstanceReplicaSetStatus {
    let active: Vec<_> = owned.iter().filter(|v| is_active(v)).collect();
    let old = rs.status.clone().unwrap_or_default();
    let conds = conditions(
        old.conditions.as_deref().unwrap_or_default(),
        rs.spec.is_paused(),
        failure,
        now,
    );
    VirtualMachineInstanceReplicaSetStatus {
        replicas: Some(count(active.len())),
        ready_replicas: Some(count(active.iter().filter(|v| is_ready(v)).count())),
        conditions: (!conds.is_empty()).then_some(conds),
        label_selector: rs
            .spec
            .selector
            .as_ref()
            .and_then(kubevirt_api::replicas::selector_string),
    }
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// A VMI of `rs`: named `<rs><random suffix>` by the server (generateName, as KubeVirt),
/// the template's labels and annotations, controlled by the replica set.
pub fn render(rs: &VirtualMachineInstanceReplicaSet) -> Option<VirtualMachineInstance> {
    let template = rs.spec.template.as_ref()?;
    let spec = template.spec.clone()?;
    let meta = template.metadata.clone().unwrap_or_default();
    let mut vmi = VirtualMachineInstance::new("", spec);
    vmi.metadata = ObjectMeta {
        generate_name: Some(rs.name_any()),
        namespace: rs.namespace(),
        labels: meta.labels,
        annotations: meta.annotations,
        owner_references: Some(vec![controller_ref(
            API_VERSION,
            KIND,
            &rs.name_any(),
            rs.metadata.uid.as_deref()?,
        )]),
        // The VMI controller's finalizer from birth, as the VM controller creates VMIs.
        finalizers: Some(vec![crate::vmi::decide::FINALIZER.to_string()]),
        ..ObjectMeta::default()
    };
    Some(vmi)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn rs(replicas: i32, paused: bool) -> VirtualMachineInstanceReplicaSet {
        serde_json::from_value(json!({"apiVersion": "kubevirt.io/v1",
            "kind": KIND, "metadata": {"name": "web", "namespace": "ns", "uid": "rs-uid"},
            "spec": {"replicas": replicas, "paused": paused,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"domain": {"devices": {}}}}}}))
        .unwrap()
    }

    fn vmi(name: &str, phase: &str, ready: bool, created: i64) -> VirtualMachineInstance {
        let ts = Timestamp::from_second(created).unwrap();
        serde_json::from_value(
            json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "namespace": "ns", "uid": format!("{name}-uid"),
                "creationTimestamp": ts.to_string(),
                "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": KIND, "name": "web",
                    "uid": "rs-uid", "controller": true}]},
            "spec": {"domain": {"devices": {}}},
            "status": {"phase": phase, "conditions": [{"type": "Ready",
                "status": if ready { "True" } else { "False" }}]}}),
        )
        .unwrap()
    }

    #[test]
    fn missing_replicas_are_created_and_finished_ones_replaced() {
        let r = rs(3, false);
        let vmis = [
            vmi("a", "Running", true, 1),
            vmi("b", "Failed", false, 2),
            vmi("other", "Running", true, 3),
        ];
        let mut foreign = vmis[2].clone();
        foreign.metadata.owner_references = None;
        let all = [vmis[0].clone(), vmis[1].clone(), foreign];
        let owned = owned(&r, &all);
        assert_eq!(owned.len(), 2);
        let p = plan(&r, &owned);
        assert_eq!(p.create, 2, "the failed one does not count");
        assert_eq!(
            p.delete,
            [Doomed {
                name: "b".into(),
                uid: "b-uid".into()
            }]
        );
        let s = status(&r, &owned, None, Timestamp::UNIX_EPOCH);
        assert_eq!((s.replicas, s.ready_replicas), (Some(1), Some(1)));
        assert_eq!(s.label_selector.as_deref(), Some("app=web"));
    }

    #[test]
    fn scale_in_removes_pending_then_unready_then_youngest() {
        let r = rs(1, false);
        let all = [
            vmi("old-ready", "Running", true, 1),
            vmi("young-ready", "Running", true, 5),
            vmi("unready", "Running", false, 2),
            vmi("pending", "Scheduling", false, 3),
        ];
        let owned = owned(&r, &all);
        let names: Vec<String> = plan(&r, &owned)
            .delete
            .into_iter()
            .map(|d| d.name)
            .collect();
        assert_eq!(names, ["pending", "unready", "young-ready"]);
    }

    #[test]
    fn paused_does_nothing_but_report() {
        let r = rs(5, true);
        let all = [vmi("a", "Failed", false, 1)];
        let owned = owned(&r, &all);
        assert_eq!(plan(&r, &owned), Plan::default());
        let s = status(&r, &owned, None, Timestamp::UNIX_EPOCH);
        assert_eq!(s.conditions.unwrap()[0].type_, "ReplicaPaused");
    }

    #[test]
    fn deleting_vmis_are_replaced_at_once() {
        let r = rs(2, false);
        let mut going = vmi("a", "Running", true, 1);
        going.metadata.deletion_timestamp = going.metadata.creation_timestamp.clone();
        let all = [going, vmi("b", "Running", true, 2)];
        let owned = owned(&r, &all);
        let p = plan(&r, &owned);
        assert_eq!(p.create, 1);
        assert!(p.delete.is_empty());
    }

    #[test]
    fn rendered_vmis_are_named_by_the_server_and_owned() {
        let v = render(&rs(1, false)).unwrap();
        assert_eq!(v.metadata.generate_name.as_deref(), Some("web"));
        assert!(v.metadata.name.is_none());
        let o = &v.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (o.kind.as_str(), o.uid.as_str(), o.controller),
            (KIND, "rs-uid", Some(true))
        );
        assert_eq!(v.metadata.labels.unwrap()["app"], "web");
    }
}
