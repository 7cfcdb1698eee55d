#![allow(clippy::unwrap_used)]
use super::*;
use serde_json::{Value, json};

fn pool(spec: Value) -> VirtualMachinePool {
    let mut base = json!({"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
        "virtualMachineTemplate": {"metadata": {"labels": {"app": "web"}},
            "spec": {"runStrategy": "Always", "template": {"spec": {"domain": {"devices": {}}}}}}});
    json_patch::merge(&mut base, &spec);
    serde_json::from_value(
        json!({"apiVersion": "pool.kubevirt.io/v1beta1", "kind": KIND,
        "metadata": {"name": "web", "namespace": "ns", "uid": "pool-uid"}, "spec": base}),
    )
    .unwrap()
}

fn vm(p: &VirtualMachinePool, index: u32, ready: bool, created: i64) -> VirtualMachine {
    let mut vm = desired_vm(p, index, &revision(p)).unwrap();
    vm.metadata.uid = Some(format!("vm{index}"));
    vm.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        Timestamp::from_second(created).unwrap(),
    ));
    vm.status = Some(serde_json::from_value(json!({"ready": ready})).unwrap());
    vm
}

fn vmi_of(vm: &VirtualMachine) -> VirtualMachineInstance {
    let labels = vm.spec.template.metadata.as_ref().unwrap().labels.clone();
    serde_json::from_value(
        json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": vm.name_any(), "namespace": "ns",
            "uid": format!("{}-vmi", vm.name_any()), "labels": labels},
        "spec": {"domain": {"devices": {}}}}),
    )
    .unwrap()
}

fn members<'a>(vms: &'a [VirtualMachine], vmis: &'a [VirtualMachineInstance]) -> Vec<Member<'a>> {
    vms.iter()
        .map(|vm| Member {
            vm,
            vmi: vmis.iter().find(|v| v.name_any() == vm.name_any()),
        })
        .collect()
}

fn names(d: &[Doomed]) -> Vec<&str> {
    d.iter().map(|d| d.name.as_str()).collect()
}

const NOW: Timestamp = Timestamp::UNIX_EPOCH;

#[test]
fn vms_are_named_by_ordinal_owned_and_labelled_with_the_revision() {
    let p = pool(json!({}));
    let v = desired_vm(&p, 2, "rev").unwrap();
    assert_eq!(v.name_any(), "web-2");
    assert_eq!(v.metadata.labels.as_ref().unwrap()[REVISION_LABEL], "rev");
    assert_eq!(v.metadata.labels.as_ref().unwrap()["app"], "web");
    let t = v.spec.template.metadata.as_ref().unwrap();
    assert_eq!(t.labels.as_ref().unwrap()[REVISION_LABEL], "rev");
    let o = &v.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (o.kind.as_str(), o.uid.as_str(), o.controller),
        (KIND, "pool-uid", Some(true))
    );
    assert_eq!(o.api_version, "pool.kubevirt.io/v1beta1");
}

#[test]
fn free_ordinals_fill_gaps_first() {
    let taken: BTreeSet<String> = ["web-0", "web-2", "other-1"].map(String::from).into();
    assert_eq!(free_ordinals("web", &taken, 3), [1, 3, 4]);
}

#[test]
fn the_revision_follows_the_template_only() {
    let a = pool(json!({}));
    let b = pool(json!({"replicas": 7, "paused": true}));
    let c =
        pool(json!({"virtualMachineTemplate": {"metadata": {"labels": {"app": "web", "v": "2"}}}}));
    assert_eq!(revision(&a), revision(&b));
    assert_ne!(revision(&a), revision(&c));
    assert_eq!(revision(&a).len(), 16);
}

#[test]
fn missing_and_deleted_members_are_created() {
    let p = pool(json!({}));
    let mut gone = vm(&p, 1, true, 2);
    gone.metadata.deletion_timestamp = gone.metadata.creation_timestamp.clone();
    let vms = [vm(&p, 0, true, 1), gone];
    let plan = plan(&p, &members(&vms, &[]), &BTreeMap::new(), NOW, 1);
    assert_eq!(plan.create, 2);
    assert!(plan.scale_in.is_empty());
}

#[test]
fn scale_in_follows_the_selection_policy() {
    let desc = pool(json!({"replicas": 1,
        "scaleInStrategy": {"proactive": {"selectionPolicy": {"sortPolicy": "DescendingOrder"}}}}));
    let vms: Vec<_> = (0..4).map(|i| vm(&desc, i, true, i64::from(i))).collect();
    let p = plan(&desc, &members(&vms, &[]), &BTreeMap::new(), NOW, 1);
    assert_eq!(names(&p.scale_in), ["web-3", "web-2", "web-1"]);
    assert!(!p.preserve_state);

    let oldest = pool(json!({"replicas": 2,
        "scaleInStrategy": {"proactive": {"selectionPolicy": {"sortPolicy": "Oldest"}}}}));
    let vms = [
        vm(&oldest, 0, true, 5),
        vm(&oldest, 1, true, 1),
        vm(&oldest, 2, true, 3),
    ];
    let p = plan(&oldest, &members(&vms, &[]), &BTreeMap::new(), NOW, 1);
    assert_eq!(names(&p.scale_in), ["web-1"]);

    // Selectors first, then the sort policy; state kept where asked.
    let sel = pool(json!({"replicas": 2, "scaleInStrategy": {"proactive": {
        "statePreservation": "Offline",
        "selectionPolicy": {"sortPolicy": "AscendingOrder",
            "selectors": {"labelSelector": {"matchLabels": {"drain": "yes"}}}}}}}));
    let mut vms: Vec<_> = (0..4).map(|i| vm(&sel, i, true, 1)).collect();
    vms[2]
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("drain".into(), "yes".into());
    let p = plan(&sel, &members(&vms, &[]), &BTreeMap::new(), NOW, 1);
    assert_eq!(names(&p.scale_in), ["web-2", "web-0"]);
    assert!(p.preserve_state);
}

#[test]
fn random_scale_in_is_kubevirts_default_and_takes_the_right_count() {
    let p = pool(json!({"replicas": 2}));
    let vms: Vec<_> = (0..5).map(|i| vm(&p, i, true, 1)).collect();
    let a = plan(&p, &members(&vms, &[]), &BTreeMap::new(), NOW, 7);
    assert_eq!(a.scale_in.len(), 3);
    let mut seen = BTreeSet::new();
    for seed in 0..40 {
        let plan = plan(&p, &members(&vms, &[]), &BTreeMap::new(), NOW, seed);
        seen.extend(plan.scale_in.into_iter().map(|d| d.name));
    }
    assert_eq!(seen.len(), 5, "every member can be chosen");
}

#[test]
fn unmanaged_and_opportunistic_scale_in_delete_nothing() {
    for s in [json!({"unmanaged": {}}), json!({"opportunistic": {}})] {
        let p = pool(json!({"replicas": 1, "scaleInStrategy": s}));
        let vms: Vec<_> = (0..3).map(|i| vm(&p, i, true, 1)).collect();
        let plan = plan(&p, &members(&vms, &[]), &BTreeMap::new(), NOW, 1);
        assert!(plan.scale_in.is_empty());
        assert_eq!(plan.create, 0);
    }
}

#[test]
fn paused_does_nothing() {
    let p = pool(json!({"replicas": 5, "paused": true}));
    let vms = [vm(&p, 0, true, 1)];
    assert_eq!(
        plan(&p, &members(&vms, &[]), &BTreeMap::new(), NOW, 1),
        Plan::default()
    );
    let s = status(&p, &members(&vms, &[]), None, NOW);
    assert_eq!(s.replicas, Some(1));
    assert_eq!(s.conditions.unwrap()[0].type_, "ReplicaPaused");
}

#[test]
fn a_template_change_rewrites_vms_and_restarts_unready_ones_first_within_max_unavailable() {
    let old = pool(json!({"replicas": 4, "maxUnavailable": 1}));
    let vms: Vec<_> = (0..4).map(|i| vm(&old, i, i != 3, 1)).collect();
    let vmis: Vec<_> = vms.iter().map(vmi_of).collect();
    let new = pool(json!({"replicas": 4, "maxUnavailable": 1,
        "virtualMachineTemplate": {"metadata": {"labels": {"app": "web", "v": "2"}}}}));
    let p = plan(&new, &members(&vms, &vmis), &BTreeMap::new(), NOW, 1);
    assert_eq!(p.update, ["web-0", "web-1", "web-2", "web-3"]);
    // web-3 is unready: restarted at once, and it already uses the one unavailable slot.
    assert_eq!(names(&p.restart), ["web-3"]);
    assert_eq!(p.wait, Some(ROLLOUT_RECHECK));

    // Every member ready: one ready member at a time.
    let vms: Vec<_> = (0..4).map(|i| vm(&old, i, true, 1)).collect();
    let vmis: Vec<_> = vms.iter().map(vmi_of).collect();
    let p = plan(&new, &members(&vms, &vmis), &BTreeMap::new(), NOW, 1);
    assert_eq!(p.restart.len(), 1);

    // Opportunistic: the VMs only.
    let opp = pool(
        json!({"replicas": 4, "updateStrategy": {"opportunistic": {}},
        "virtualMachineTemplate": {"metadata": {"labels": {"app": "web", "v": "2"}}}}),
    );
    let p = plan(&opp, &members(&vms, &vmis), &BTreeMap::new(), NOW, 1);
    assert_eq!(p.update.len(), 4);
    assert!(p.restart.is_empty());

    // Up to date: nothing.
    let p = plan(&old, &members(&vms, &vmis), &BTreeMap::new(), NOW, 1);
    assert!(p.update.is_empty() && p.restart.is_empty() && p.wait.is_none());
}

#[test]
fn autohealing_replaces_vms_that_keep_failing_to_start() {
    let p = pool(json!({"replicas": 2, "autohealing": {"startUpFailureThreshold": 2}}));
    let mut failing = vm(&p, 1, false, 1);
    failing.status =
        Some(serde_json::from_value(json!({"startFailure": {"consecutiveFailCount": 2}})).unwrap());
    let vms = [vm(&p, 0, true, 1), failing.clone()];
    let plan = plan(&p, &members(&vms, &[]), &BTreeMap::new(), NOW, 1);
    assert_eq!(names(&plan.heal), ["web-1"]);
    assert_eq!(plan.create, 0, "made again once it is gone");
    // Without autohealing it stays.
    let q = pool(json!({"replicas": 2}));
    let vms = [vm(&q, 0, true, 1), failing];
    assert!(
        super::plan(&q, &members(&vms, &[]), &BTreeMap::new(), NOW, 1)
            .heal
            .is_empty()
    );
}

#[test]
fn status_counts_active_and_ready_members() {
    let p = pool(json!({}));
    let mut gone = vm(&p, 2, true, 1);
    gone.metadata.deletion_timestamp = gone.metadata.creation_timestamp.clone();
    let vms = [vm(&p, 0, true, 1), vm(&p, 1, false, 1), gone];
    let s = status(&p, &members(&vms, &[]), None, NOW);
    assert_eq!((s.replicas, s.ready_replicas), (Some(2), Some(1)));
    assert_eq!(s.label_selector.as_deref(), Some("app=web"));
}
