//! The migration decision table: phase × VMI × pods × other migrations × clock.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kubevirt_api::{
    MigrationAbortStatus, VirtualMachineInstance, VirtualMachineInstanceMigration,
    VirtualMachineInstanceMigrationPhase as Phase,
};
use serde_json::{Value, json};

use super::{Decision, MigrationConfig, Observed, ProgressMark, decide, reasons};

const MUID: &str = "m-uid";
const VMI_UID: &str = "vmi-uid";

fn now() -> Timestamp {
    "2026-11-30T10:00:00Z".parse().unwrap()
}

fn ago(secs: i64) -> Timestamp {
    now() - SignedDuration::from_secs(secs)
}

fn ts(t: Timestamp) -> String {
    t.to_string()
}

fn vmim_with(phase: &str, meta: Value, status: Value) -> VirtualMachineInstanceMigration {
    let mut metadata = json!({"name": "m", "namespace": "ns", "uid": MUID,
        "creationTimestamp": ts(ago(60)), "finalizers": ["kubevirt.io/migrationJobFinalize"]});
    if phase.is_empty() {
        metadata["finalizers"] = json!([]);
    }
    if let (Some(m), Some(e)) = (metadata.as_object_mut(), meta.as_object()) {
        m.extend(e.clone());
    }
    let mut st = json!({"phase": phase});
    if let (Some(s), Some(e)) = (st.as_object_mut(), status.as_object()) {
        s.extend(e.clone());
    }
    serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
        "metadata": metadata, "spec": {"vmiName": "a"}, "status": st,
    }))
    .unwrap()
}

fn vmim(phase: &str) -> VirtualMachineInstanceMigration {
    vmim_with(phase, json!({}), json!({}))
}

/// Another migration of another VMI leaving `node`, in `phase`.
fn other(n: usize, phase: &str, node: &str) -> VirtualMachineInstanceMigration {
    serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
        "metadata": {"name": format!("o{n}"), "namespace": "ns", "uid": format!("o{n}-uid"),
                     "creationTimestamp": ts(ago(100))},
        "spec": {"vmiName": format!("vm{n}")},
        "status": {"phase": phase, "migrationState": {"sourceNode": node}},
    }))
    .unwrap()
}

fn vmi_with(spec: Value, status: Value) -> VirtualMachineInstance {
    let mut sp = json!({"domain": {"devices": {}, "resources": {"requests": {"memory": "64Mi"}}},
                        "volumes": [{"name": "r", "containerDisk": {"image": "img"}}]});
    if let (Some(s), Some(e)) = (sp.as_object_mut(), spec.as_object()) {
        s.extend(e.clone());
    }
    let mut st = json!({"phase": "Running", "nodeName": "node-1"});
    if let (Some(s), Some(e)) = (st.as_object_mut(), status.as_object()) {
        s.extend(e.clone());
    }
    serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "a", "namespace": "ns", "uid": VMI_UID, "resourceVersion": "5",
                     "labels": {"kubevirt.io/nodeName": "node-1"}},
        "spec": sp, "status": st,
    }))
    .unwrap()
}

fn vmi() -> VirtualMachineInstance {
    vmi_with(json!({}), json!({}))
}

/// The VMI handed off to this migration, with extra migrationState fields.
fn vmi_migrating(extra: Value) -> VirtualMachineInstance {
    let mut state = json!({"migrationUid": MUID, "sourceNode": "node-1", "sourcePod": "src",
                           "targetNode": "node-2", "targetPod": "tgt"});
    if let (Some(s), Some(e)) = (state.as_object_mut(), extra.as_object()) {
        s.extend(e.clone());
    }
    let mut v = vmi_with(json!({}), json!({"migrationState": state}));
    v.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(
            "kubevirt.io/migrationTargetNodeName".into(),
            "node-2".into(),
        );
    v
}

fn source_pod() -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "src", "uid": "src-uid", "creationTimestamp": ts(ago(600)),
            "labels": {"kubevirt.io/created-by": VMI_UID},
            "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                "name": "a", "uid": VMI_UID, "controller": true}]},
        "spec": {"nodeName": "node-1", "containers": []},
        "status": {"phase": "Running", "containerStatuses": [{"name": "compute", "image": "",
            "imageID": "", "ready": true, "restartCount": 0, "state": {"running": {}}}]}
    }))
    .unwrap()
}

/// The target pod: `state` is "pending", "unschedulable:<secs ago>", "running", "failed",
/// "adopted".
fn target_pod(state: &str) -> Pod {
    let owner = if state == "adopted" {
        json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": "a",
               "uid": VMI_UID, "controller": true})
    } else {
        json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
               "name": "m", "uid": MUID, "controller": true})
    };
    let running = json!({"phase": "Running", "containerStatuses": [{"name": "compute",
        "image": "", "imageID": "", "ready": true, "restartCount": 0, "state": {"running": {}}}]});
    let (node, status) = match state {
        "pending" => (None, json!({"phase": "Pending"})),
        s if s.starts_with("unschedulable:") => {
            let secs: i64 = s["unschedulable:".len()..].parse().unwrap();
            (
                None,
                json!({"phase": "Pending", "conditions": [{"type": "PodScheduled",
                "status": "False", "reason": "Unschedulable", "lastTransitionTime": ts(ago(secs)),
                "message": "0/2 nodes are available: 1 node(s) didn't match pod anti-affinity rules"}]}),
            )
        }
        "running" | "adopted" => (Some("node-2"), running),
        // Bound, its containers not reported started yet.
        "bound" => (Some("node-2"), json!({"phase": "Pending"})),
        "failed" => (
            Some("node-2"),
            json!({"phase": "Failed", "message": "launcher crashed"}),
        ),
        other => panic!("{other}"),
    };
    let mut spec = json!({"containers": []});
    if let Some(n) = node {
        spec["nodeName"] = json!(n);
    }
    serde_json::from_value(json!({
        "metadata": {"name": "tgt", "uid": "tgt-uid", "creationTimestamp": ts(ago(30)),
            "labels": {"kubevirt.io/created-by": VMI_UID, "kubevirt.io/migrationJobUID": MUID},
            "ownerReferences": [owner]},
        "spec": spec, "status": status,
    }))
    .unwrap()
}

fn run(
    m: &VirtualMachineInstanceMigration,
    vmi: Option<&VirtualMachineInstance>,
    pods: &[Pod],
    others: &[VirtualMachineInstanceMigration],
    progress: Option<&ProgressMark>,
) -> Decision {
    run_with_claims(m, vmi, pods, &[], others, progress)
}

fn run_with_claims(
    m: &VirtualMachineInstanceMigration,
    vmi: Option<&VirtualMachineInstance>,
    pods: &[Pod],
    claims: &[PersistentVolumeClaim],
    others: &[VirtualMachineInstanceMigration],
    progress: Option<&ProgressMark>,
) -> Decision {
    let mut migrations = others.to_vec();
    migrations.push(m.clone());
    decide(
        &Observed {
            vmim: m,
            vmi,
            pods,
            claims,
            migrations: &migrations,
            progress,
            now: now(),
        },
        &MigrationConfig::default(),
    )
}

fn failure(d: &Decision) -> String {
    d.status
        .migration_state
        .as_ref()
        .and_then(|s| s.failure_reason.clone())
        .unwrap_or_default()
}

fn deleted(d: &Decision) -> Vec<&str> {
    d.delete_pods.iter().map(|p| p.name.as_str()).collect()
}

fn vmi_state(d: &Decision) -> kubevirt_api::VirtualMachineInstanceMigrationState {
    d.vmi_status
        .as_ref()
        .unwrap()
        .migration_state
        .clone()
        .unwrap()
}

#[test]
fn a_valid_migration_with_capacity_creates_its_target_pod_at_once() {
    let v = vmi();
    let d = run(&vmim(""), Some(&v), &[source_pod()], &[], None);
    assert!(d.add_finalizer && d.create_target_pod);
    assert_eq!(d.status.phase, Phase::Scheduling);
    let phases: Vec<Phase> = d
        .status
        .phase_transition_timestamps
        .iter()
        .flatten()
        .map(|t| t.phase)
        .collect();
    assert_eq!(phases, [Phase::Pending, Phase::Scheduling]);
    let s = d.status.migration_state.as_ref().unwrap();
    assert_eq!(s.source_node.as_deref(), Some("node-1"));
    assert_eq!(s.source_pod.as_deref(), Some("src"));
    assert_eq!(
        d.vmi_status, None,
        "the VMI is not touched before the hand-off"
    );
    assert!(d.vmi_labels.is_empty());
}

#[test]
fn refusals_fail_the_migration_with_the_reason_and_leave_the_vmi_alone() {
    let host_disk = vmi_with(
        json!({"volumes": [{"name": "h", "hostDisk": {"path": "/x.img", "type": "Disk"}}]}),
        json!({}),
    );
    let cond_false = vmi_with(
        json!({}),
        json!({"conditions": [{"type": "LiveMigratable", "status": "False",
            "reason": "HostDeviceNotLiveMigratable", "message": "GPU"}]}),
    );
    let stopped = vmi_with(json!({}), json!({"phase": "Scheduled"}));
    let busy = vmi_with(
        json!({}),
        json!({"migrationState": {"migrationUid": "earlier", "sourceNode": "node-1"}}),
    );
    let done_before = vmi_with(
        json!({}),
        json!({"migrationState": {"migrationUid": "earlier", "completed": true,
            "endTimestamp": ts(ago(900))}}),
    );
    let mut sibling = vmim("Scheduling");
    sibling.metadata.uid = Some("sibling".into());
    sibling.metadata.name = Some("sibling".into());
    let cases: Vec<(&str, Option<&VirtualMachineInstance>, Vec<_>, &str)> = vec![
        ("no VMI", None, vec![], "VMI a does not exist"),
        (
            "hostDisk",
            Some(&host_disk),
            vec![],
            "DisksNotLiveMigratable: cannot migrate VMI with non-shared HostDisk",
        ),
        (
            "handler condition",
            Some(&cond_false),
            vec![],
            "HostDeviceNotLiveMigratable: GPU",
        ),
        ("not running", Some(&stopped), vec![], "is not running"),
        (
            "already migrating",
            Some(&busy),
            vec![],
            "already migrating",
        ),
        (
            "another migration of the VMI",
            Some(&cond_false),
            vec![sibling.clone()],
            "HostDevice",
        ),
    ];
    for (name, v, others, want) in cases {
        let d = run(&vmim(""), v, &[source_pod()], &others, None);
        assert_eq!(d.status.phase, Phase::Failed, "{name}");
        assert!(failure(&d).contains(want), "{name}: {}", failure(&d));
        assert!(!d.create_target_pod && !d.add_finalizer, "{name}");
        assert_eq!(d.vmi_status, None, "{name}");
        assert!(
            d.events
                .iter()
                .any(|e| e.0 && e.1 == reasons::FAILED_MIGRATION),
            "{name}"
        );
    }
    let v = vmi();
    let d = run(&vmim(""), Some(&v), &[source_pod()], &[sibling], None);
    assert!(failure(&d).contains("another migration of this VMI is in progress: sibling"));
    // An earlier migration that ended does not block.
    let d = run(&vmim(""), Some(&done_before), &[source_pod()], &[], None);
    assert_eq!(d.status.phase, Phase::Scheduling);
}

#[test]
fn limits_keep_extra_migrations_pending() {
    let v = vmi();
    let two_out = [
        other(1, "Running", "node-1"),
        other(2, "Scheduling", "node-1"),
    ];
    let d = run(&vmim(""), Some(&v), &[source_pod()], &two_out, None);
    assert_eq!(d.status.phase, Phase::Pending);
    assert!(d.add_finalizer && !d.create_target_pod);
    assert_eq!(d.requeue, Some(Duration::from_secs(5)));
    assert!(
        d.events
            .iter()
            .any(|e| e.1 == reasons::PENDING && e.2.contains("node-1"))
    );
    // Pending ones, final ones and those leaving other nodes take no outbound slot.
    let free = [
        other(1, "Running", "node-1"),
        other(2, "Pending", "node-1"),
        other(3, "Succeeded", "node-1"),
        other(4, "TargetReady", "node-3"),
    ];
    let d = run(&vmim("Pending"), Some(&v), &[source_pod()], &free, None);
    assert_eq!(d.status.phase, Phase::Scheduling);
    assert!(d.create_target_pod && !d.add_finalizer);
    let five: Vec<_> = (1..=5).map(|n| other(n, "Running", "node-9")).collect();
    let d = run(&vmim("Pending"), Some(&v), &[source_pod()], &five, None);
    assert_eq!(d.status.phase, Phase::Pending);
    assert!(d.events.is_empty(), "the Pending event is published once");
}

#[test]
fn scheduling_waits_for_the_target_then_hands_off() {
    let m = vmim_with(
        "Scheduling",
        json!({}),
        json!({"migrationState":
        {"migrationUid": MUID, "sourceNode": "node-1", "sourcePod": "src"}}),
    );
    let v = vmi();
    let d = run(
        &m,
        Some(&v),
        &[source_pod(), target_pod("pending")],
        &[],
        None,
    );
    assert_eq!(d.status.phase, Phase::Scheduling);
    assert_eq!(d.vmi_status, None);
    assert!(d.requeue.is_some());

    // Bound is enough: the target handler waits for the launcher itself.
    let bound = run(
        &m,
        Some(&v),
        &[source_pod(), target_pod("bound")],
        &[],
        None,
    );
    assert_eq!(bound.status.phase, Phase::Scheduled);
    assert_eq!(vmi_state(&bound).target_node.as_deref(), Some("node-2"));

    let d = run(
        &m,
        Some(&v),
        &[source_pod(), target_pod("running")],
        &[],
        None,
    );
    assert_eq!(d.status.phase, Phase::Scheduled);
    let s = vmi_state(&d);
    assert_eq!(
        (
            s.migration_uid.as_deref(),
            s.source_node.as_deref(),
            s.source_pod.as_deref()
        ),
        (Some(MUID), Some("node-1"), Some("src"))
    );
    assert_eq!(
        (s.target_node.as_deref(), s.target_pod.as_deref()),
        (Some("node-2"), Some("tgt"))
    );
    assert_eq!(
        d.vmi_status.as_ref().unwrap().migration_method.as_deref(),
        Some("BlockMigration")
    );
    assert_eq!(
        d.vmi_labels.get("kubevirt.io/migrationTargetNodeName"),
        Some(&Some("node-2".to_string()))
    );
    assert_eq!(
        d.status.migration_state.as_ref(),
        Some(&s),
        "mirrored on the migration"
    );

    // The hand-off was written but the migration status was not: the VMI's state (to
    // which the target handler may have added) is kept.
    let v = vmi_migrating(json!({"targetNodeAddress": "10.0.0.2"}));
    let d = run(
        &m,
        Some(&v),
        &[source_pod(), target_pod("running")],
        &[],
        None,
    );
    assert_eq!(d.status.phase, Phase::Scheduled);
    let kept = d
        .vmi_status
        .as_ref()
        .map_or(v.status.as_ref(), Some)
        .and_then(|s| s.migration_state.clone());
    assert_eq!(kept, v.status.as_ref().unwrap().migration_state);
    assert_eq!(
        d.status
            .migration_state
            .unwrap()
            .target_node_address
            .as_deref(),
        Some("10.0.0.2")
    );
}

#[test]
fn an_unschedulable_target_fails_after_the_timeout_and_leaves_the_vmi_alone() {
    let m = vmim("Scheduling");
    let v = vmi();
    let d = run(
        &m,
        Some(&v),
        &[source_pod(), target_pod("unschedulable:10")],
        &[],
        None,
    );
    assert_eq!(d.status.phase, Phase::Scheduling);
    assert!(d.delete_pods.is_empty());

    let d = run(
        &m,
        Some(&v),
        &[source_pod(), target_pod("unschedulable:301")],
        &[],
        None,
    );
    assert_eq!(d.status.phase, Phase::Failed);
    assert!(
        failure(&d).contains("unschedulable for 301s"),
        "{}",
        failure(&d)
    );
    assert!(failure(&d).contains("anti-affinity"));
    assert_eq!(deleted(&d), ["tgt"]);
    assert_eq!(d.vmi_status, None);
    assert!(d.vmi_labels.is_empty());

    // KubeVirt's test annotation shortens the wait.
    let m = vmim_with(
        "Scheduling",
        json!({"annotations": {"kubevirt.io/migrationUnschedulablePodTimeoutSeconds": "5"}}),
        json!({}),
    );
    let d = run(
        &m,
        Some(&v),
        &[source_pod(), target_pod("unschedulable:10")],
        &[],
        None,
    );
    assert_eq!(d.status.phase, Phase::Failed);

    // A target that never starts for other reasons hits the pending timeout.
    let m = vmim_with(
        "Scheduling",
        json!({"annotations": {"kubevirt.io/migrationPendingPodTimeoutSeconds": "20"}}),
        json!({}),
    );
    let d = run(
        &m,
        Some(&v),
        &[source_pod(), target_pod("pending")],
        &[],
        None,
    );
    assert_eq!(d.status.phase, Phase::Failed);
    assert!(failure(&d).contains("did not start within 20s"));
}

#[test]
fn handler_reports_drive_the_phase_forward() {
    let cases = [
        ("Scheduled", json!({}), Phase::PreparingTarget),
        (
            "PreparingTarget",
            json!({"targetNodeAddress": "10.0.0.2"}),
            Phase::TargetReady,
        ),
        (
            "TargetReady",
            json!({"targetNodeAddress": "10.0.0.2", "startTimestamp": ts(ago(3)), "mode": "PreCopy"}),
            Phase::Running,
        ),
        // Never backwards.
        ("Running", json!({}), Phase::Running),
    ];
    for (phase, extra, want) in cases {
        let v = vmi_migrating(extra);
        let d = run(
            &vmim(phase),
            Some(&v),
            &[source_pod(), target_pod("running")],
            &[],
            None,
        );
        assert_eq!(d.status.phase, want, "{phase}");
        assert_eq!(d.vmi_status, None, "{phase}: the controller only reads");
        assert_eq!(
            d.status.migration_state,
            v.status.as_ref().unwrap().migration_state,
            "{phase}: mirrored"
        );
    }
}

#[test]
fn success_moves_the_vmi_adopts_the_target_and_deletes_the_source() {
    let mut v = vmi_migrating(
        json!({"startTimestamp": ts(ago(20)), "endTimestamp": ts(ago(1)),
        "completed": true, "targetNodeDomainDetected": true}),
    );
    // Being evacuated from its node (a drain): the move ends the evacuation.
    v.status.as_mut().unwrap().evacuation_node_name = Some("node-1".into());
    let d = run(
        &vmim("Running"),
        Some(&v),
        &[source_pod(), target_pod("running")],
        &[],
        None,
    );
    assert_eq!(d.status.phase, Phase::Succeeded);
    assert_eq!(
        d.adopt_target_pod.as_ref().map(|p| p.name.as_str()),
        Some("tgt")
    );
    assert_eq!(deleted(&d), ["src"]);
    assert_eq!(
        d.vmi_status.as_ref().unwrap().node_name.as_deref(),
        Some("node-2")
    );
    assert_eq!(d.vmi_status.as_ref().unwrap().evacuation_node_name, None);
    assert_eq!(
        d.vmi_labels.get("kubevirt.io/nodeName"),
        Some(&Some("node-2".to_string()))
    );
    assert_eq!(
        d.vmi_labels.get("kubevirt.io/migrationTargetNodeName"),
        Some(&None)
    );
    assert_eq!(d.requeue, None);
    assert!(
        d.events
            .iter()
            .any(|e| e.1 == reasons::SUCCESSFUL_MIGRATION)
    );

    // Replayed after a partial write (target already adopted, source deleting): the
    // same end, nothing done twice.
    let mut src = source_pod();
    src.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()));
    let d = run(
        &vmim("Running"),
        Some(&v),
        &[src, target_pod("adopted")],
        &[],
        None,
    );
    assert_eq!(d.status.phase, Phase::Succeeded);
    assert_eq!(d.adopt_target_pod, None);
    assert!(d.delete_pods.is_empty());
}

#[test]
fn a_failure_reported_by_the_handler_fails_and_cleans_up() {
    let v = vmi_migrating(
        json!({"startTimestamp": ts(ago(20)), "endTimestamp": ts(ago(1)),
        "failed": true, "failureReason": "Unable to connect to the target"}),
    );
    let d = run(
        &vmim("Running"),
        Some(&v),
        &[source_pod(), target_pod("running")],
        &[],
        None,
    );
    assert_eq!(d.status.phase, Phase::Failed);
    assert_eq!(failure(&d), "Unable to connect to the target");
    assert_eq!(deleted(&d), ["tgt"]);
    assert_eq!(
        d.vmi_labels.get("kubevirt.io/migrationTargetNodeName"),
        Some(&None)
    );
    assert_eq!(
        d.vmi_status, None,
        "the handler's account of the VMI stands"
    );
    // Afterwards the target is deleted again while it exists, nothing else.
    let failed = vmim("Failed");
    let d = run(
        &failed,
        Some(&v),
        &[source_pod(), target_pod("running")],
        &[],
        None,
    );
    assert_eq!(deleted(&d), ["tgt"]);
    assert_eq!(d.status, failed.status.clone().unwrap());
}

#[test]
fn a_target_pod_that_dies_fails_the_migration() {
    // Before the transfer the controller ends the VMI's migrationState itself.
    let v = vmi_migrating(json!({}));
    let d = run(
        &vmim("PreparingTarget"),
        Some(&v),
        &[source_pod(), target_pod("failed")],
        &[],
        None,
    );
    assert_eq!(d.status.phase, Phase::Failed);
    assert!(failure(&d).contains("launcher crashed"));
    let s = vmi_state(&d);
    assert_eq!((s.failed, s.abort_requested), (Some(true), None));
    assert!(s.end_timestamp.is_some());
    // During the transfer the source handler must stop it: abort requested.
    let v = vmi_migrating(json!({"startTimestamp": ts(ago(5))}));
    let d = run(&vmim("Running"), Some(&v), &[source_pod()], &[], None);
    assert_eq!(d.status.phase, Phase::Failed);
    assert_eq!(failure(&d), "the target pod disappeared");
    let s = vmi_state(&d);
    assert_eq!((s.failed, s.abort_requested), (None, Some(true)));
}

#[test]
fn deleting_the_migration_cancels_it() {
    let deleting =
        |phase: &str| vmim_with(phase, json!({"deletionTimestamp": ts(ago(1))}), json!({}));
    // Before the hand-off: the target pod goes, the VMI is untouched.
    let v = vmi();
    let d = run(
        &deleting("Scheduling"),
        Some(&v),
        &[source_pod(), target_pod("pending")],
        &[],
        None,
    );
    assert_eq!(d.status.phase, Phase::Failed);
    assert_eq!(deleted(&d), ["tgt"]);
    assert!(d.remove_finalizer);
    assert_eq!(d.vmi_status, None);

    // After the hand-off, before the transfer: the controller cancels on the VMI.
    let v = vmi_migrating(json!({"targetNodeAddress": "10.0.0.2"}));
    let d = run(
        &deleting("TargetReady"),
        Some(&v),
        &[source_pod(), target_pod("running")],
        &[],
        None,
    );
    assert_eq!(d.status.phase, Phase::Failed);
    let s = vmi_state(&d);
    assert_eq!(s.abort_status, Some(MigrationAbortStatus::Succeeded));
    assert_eq!((s.failed, s.abort_requested), (Some(true), Some(true)));
    assert!(d.remove_finalizer);

    // During the transfer: abort requested, the finalizer waits for the handler.
    let v = vmi_migrating(json!({"startTimestamp": ts(ago(5))}));
    let d = run(
        &deleting("Running"),
        Some(&v),
        &[source_pod(), target_pod("running")],
        &[],
        None,
    );
    assert_eq!(d.status.phase, Phase::Running);
    assert_eq!(vmi_state(&d).abort_requested, Some(true));
    assert!(!d.remove_finalizer && d.delete_pods.is_empty());
    assert!(d.events.iter().any(|e| e.1 == reasons::ABORT_REQUESTED));

    // The handler aborted: Failed, target gone, finalizer removed.
    let v = vmi_migrating(
        json!({"startTimestamp": ts(ago(5)), "endTimestamp": ts(ago(1)),
        "abortRequested": true, "abortStatus": "Succeeded", "failed": true,
        "failureReason": "Live migration aborted"}),
    );
    let m = vmim_with(
        "Running",
        json!({"deletionTimestamp": ts(ago(1))}),
        json!({"conditions": [{"type": "migrationAbortRequested", "status": "True",
            "reason": "MigrationDeleted", "message": "the migration object was deleted"}]}),
    );
    let d = run(
        &m,
        Some(&v),
        &[source_pod(), target_pod("running")],
        &[],
        None,
    );
    assert_eq!(d.status.phase, Phase::Failed);
    assert_eq!(failure(&d), "the migration object was deleted");
    assert_eq!(deleted(&d), ["tgt"]);
    assert!(d.remove_finalizer);

    // Too late to abort: the migration completed; it still succeeds.
    let v = vmi_migrating(
        json!({"startTimestamp": ts(ago(5)), "endTimestamp": ts(ago(1)),
        "abortRequested": true, "abortStatus": "Failed", "completed": true}),
    );
    let d = run(
        &deleting("Running"),
        Some(&v),
        &[source_pod(), target_pod("running")],
        &[],
        None,
    );
    assert_eq!(d.status.phase, Phase::Succeeded);
    assert!(d.remove_finalizer);

    // Deleted while Pending or never seen: nothing to clean up.
    let d = run(
        &deleting("Pending"),
        Some(&vmi()),
        &[source_pod()],
        &[],
        None,
    );
    assert_eq!(d.status.phase, Phase::Failed);
    assert!(d.remove_finalizer && !d.create_target_pod);
    let d = run(&deleting(""), Some(&vmi()), &[source_pod()], &[], None);
    assert!(!d.create_target_pod && !d.add_finalizer);
}

#[test]
fn timeouts_request_an_abort() {
    let running = |extra: Value| {
        let mut state = json!({"startTimestamp": ts(ago(60)), "dataProcessedBytes": 1000,
                               "dataRemainingBytes": 5000, "iteration": 1});
        if let (Some(s), Some(e)) = (state.as_object_mut(), extra.as_object()) {
            s.extend(e.clone());
        }
        vmi_migrating(state)
    };
    let pods = [source_pod(), target_pod("running")];
    let m = vmim("Running");
    // First sighting: the progress clock starts.
    let v = running(json!({}));
    let d = run(&m, Some(&v), &pods, &[], None);
    let mark = d.progress.clone().unwrap();
    assert_eq!((mark.processed, mark.since), (Some(1000), now()));
    assert_eq!(d.vmi_status, None);

    // The same figures for 151 s: stuck.
    let stale = ProgressMark {
        since: ago(151),
        ..mark.clone()
    };
    let d = run(&m, Some(&v), &pods, &[], Some(&stale));
    assert_eq!(vmi_state(&d).abort_requested, Some(true));
    let c = &d.status.conditions.as_ref().unwrap()[0];
    assert_eq!(
        (c.type_.as_str(), c.reason.as_deref()),
        ("migrationAbortRequested", Some(reasons::PROGRESS_TIMEOUT))
    );
    assert_eq!(
        c.message.as_deref(),
        Some("Live migration stuck for 151 sec and has been aborted")
    );
    assert_eq!(
        d.status.phase,
        Phase::Running,
        "the handler reports the end"
    );

    // New figures reset the clock.
    let v2 = running(json!({"dataProcessedBytes": 2000}));
    let d = run(&m, Some(&v2), &pods, &[], Some(&stale));
    assert_eq!(d.vmi_status, None);
    assert_eq!(d.progress.unwrap().since, now());

    // 64 MiB guest: one GiB's worth, 150 s, from the start of the transfer.
    let v = running(json!({"startTimestamp": ts(ago(151))}));
    let fresh = ProgressMark {
        since: ago(1),
        ..mark
    };
    let d = run(&m, Some(&v), &pods, &[], Some(&fresh));
    let c = &d.status.conditions.as_ref().unwrap()[0];
    assert_eq!(c.reason.as_deref(), Some(reasons::COMPLETION_TIMEOUT));
    assert_eq!(vmi_state(&d).abort_requested, Some(true));

    // The timeout abort ends as a failure with the timeout as its reason.
    let v = running(json!({"endTimestamp": ts(ago(1)), "abortRequested": true,
        "abortStatus": "Succeeded", "failed": true}));
    let m = vmim_with(
        "Running",
        json!({}),
        json!({"conditions": [d.status.conditions.as_ref().unwrap()[0]]}),
    );
    let d = run(&m, Some(&v), &pods, &[], None);
    assert_eq!(d.status.phase, Phase::Failed);
    assert!(failure(&d).starts_with("Live migration is not completed after 151 sec"));
}

#[test]
fn completion_timeout_scales_with_guest_memory() {
    let per = Duration::from_secs(150);
    let with = |mem: &str| {
        vmi_with(
            json!({"domain": {"devices": {}, "memory": {"guest": mem}}}),
            json!({}),
        )
    };
    assert_eq!(
        super::completion_timeout(&with("256Mi"), per),
        Duration::from_secs(150)
    );
    assert_eq!(
        super::completion_timeout(&with("2Gi"), per),
        Duration::from_secs(300)
    );
    assert_eq!(
        super::completion_timeout(&with("2049Mi"), per),
        Duration::from_secs(450)
    );
}

#[test]
fn the_vmi_going_away_fails_a_running_migration() {
    let mut v = vmi_migrating(json!({}));
    v.status.as_mut().unwrap().phase = kubevirt_api::vmi::VirtualMachineInstancePhase::Failed;
    let d = run(
        &vmim("PreparingTarget"),
        Some(&v),
        &[target_pod("running")],
        &[],
        None,
    );
    assert_eq!(d.status.phase, Phase::Failed);
    assert_eq!(deleted(&d), ["tgt"]);
    let d = run(
        &vmim("Scheduling"),
        None,
        &[target_pod("pending")],
        &[],
        None,
    );
    assert_eq!(d.status.phase, Phase::Failed);
    assert_eq!(deleted(&d), ["tgt"]);
}

#[test]
fn an_abort_never_confirmed_is_forced_by_deleting_the_target() {
    let v = vmi_migrating(json!({"startTimestamp": ts(ago(300)), "abortRequested": true}));
    let requested = |secs: i64| {
        vmim_with(
            "Running",
            json!({"deletionTimestamp": ts(ago(secs))}),
            json!({"conditions": [{"type": "migrationAbortRequested", "status": "True",
                "reason": "MigrationDeleted", "message": "the migration object was deleted",
                "lastTransitionTime": ts(ago(secs))}]}),
        )
    };
    let pods = [source_pod(), target_pod("running")];
    let d = run(&requested(10), Some(&v), &pods, &[], None);
    assert_eq!(d.status.phase, Phase::Running, "waits for the handler");
    assert!(d.delete_pods.is_empty() && !d.remove_finalizer);
    let d = run(&requested(151), Some(&v), &pods, &[], None);
    assert_eq!(d.status.phase, Phase::Failed);
    assert_eq!(deleted(&d), ["tgt"]);
    assert!(d.remove_finalizer);
    assert!(
        failure(&d).contains("not confirmed within 151s"),
        "{}",
        failure(&d)
    );
}

#[test]
fn a_transfer_that_never_starts_fails_after_the_pending_timeout() {
    let v = vmi_migrating(json!({"targetNodeAddress": "10.0.0.2"}));
    let at = |secs: i64| {
        vmim_with(
            "TargetReady",
            json!({}),
            json!({"phaseTransitionTimestamps": [
                {"phase": "Scheduled", "phaseTransitionTimestamp": ts(ago(secs))}]}),
        )
    };
    let pods = [source_pod(), target_pod("running")];
    assert_eq!(
        run(&at(60), Some(&v), &pods, &[], None).status.phase,
        Phase::TargetReady
    );
    let d = run(&at(901), Some(&v), &pods, &[], None);
    assert_eq!(d.status.phase, Phase::Failed);
    assert_eq!(deleted(&d), ["tgt"]);
    assert!(
        failure(&d).contains("did not start within 901s"),
        "{}",
        failure(&d)
    );
    // Before the transfer the controller ends the VMI's state itself.
    assert_eq!(vmi_state(&d).failed, Some(true));
}

/// A VMI whose disk `d` is on ReadWriteOnce claim `data`, with extra status.
fn rwo_vmi(status: Value) -> VirtualMachineInstance {
    let mut st = json!({"volumeStatus": [{"name": "d", "persistentVolumeClaimInfo":
        {"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem",
         "capacity": {"storage": "1Gi"}}}]});
    if let (Some(s), Some(e)) = (st.as_object_mut(), status.as_object()) {
        s.extend(e.clone());
    }
    vmi_with(
        json!({"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data"}}]}),
        st,
    )
}

/// The claim this migration made for the target, bound.
fn made_claim(label: &str) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "metadata": {"name": "data-mig-muid", "namespace": "ns",
            "labels": {"kubevirt-rs.io/migration-uid": label}},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}}
    }))
    .unwrap()
}

#[test]
fn a_readwriteonce_claim_is_copied_to_a_claim_made_for_the_target() {
    use super::claims::ClaimMove;
    let moved = ClaimMove {
        volume: "d".into(),
        from: "data".into(),
        to: "data-mig-muid".into(),
    };
    // Start: the claim is made with the target pod.
    let v = rwo_vmi(json!({}));
    let d = run(&vmim(""), Some(&v), &[source_pod()], &[], None);
    assert!(d.create_target_pod, "{d:?}");
    assert_eq!(d.create_claims, std::slice::from_ref(&moved));

    // Hand-off: the VMI records the copy, with both claims.
    let mut pods = vec![source_pod(), target_pod("running")];
    let claim = made_claim(MUID);
    let d = run_with_claims(
        &vmim("Scheduling"),
        Some(&v),
        &pods,
        std::slice::from_ref(&claim),
        &[],
        None,
    );
    assert_eq!(d.status.phase, Phase::Scheduled);
    let st = d.vmi_status.as_ref().unwrap();
    assert_eq!(st.migration_method.as_deref(), Some("BlockMigration"));
    let rec = serde_json::to_value(st.migrated_volumes.as_ref().unwrap()).unwrap();
    assert_eq!(rec[0]["volumeName"], "d");
    assert_eq!(rec[0]["sourcePVCInfo"]["claimName"], "data");
    assert_eq!(rec[0]["destinationPVCInfo"]["claimName"], "data-mig-muid");
    // …and without the made claim the hand-off fails, naming it.
    let d = run(&vmim("Scheduling"), Some(&v), &pods, &[], None);
    assert_eq!(d.status.phase, Phase::Failed);
    assert!(failure(&d).contains("data-mig-muid"), "{}", failure(&d));

    // Success: the moves come from the record; volumeStatus names the new claim.
    let record = json!([{"volumeName": "d",
        "sourcePVCInfo": {"claimName": "data", "accessModes": ["ReadWriteOnce"]},
        "destinationPVCInfo": {"claimName": "data-mig-muid", "accessModes": ["ReadWriteOnce"],
            "capacity": {"storage": "1Gi"}}}]);
    let mut done = rwo_vmi(json!({"migratedVolumes": record,
        "migrationState": {"migrationUid": MUID, "sourceNode": "node-1", "targetNode": "node-2",
            "targetPod": "tgt", "completed": true, "startTimestamp": ts(ago(20)),
            "endTimestamp": ts(ago(1))}}));
    done.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(
            "kubevirt.io/migrationTargetNodeName".into(),
            "node-2".into(),
        );
    let d = run_with_claims(
        &vmim("Running"),
        Some(&done),
        &pods,
        std::slice::from_ref(&claim),
        &[],
        None,
    );
    assert_eq!(d.status.phase, Phase::Succeeded);
    assert_eq!(d.claim_moves, [moved]);
    assert!(d.delete_claims.is_empty());
    let vs = &d
        .vmi_status
        .as_ref()
        .unwrap()
        .volume_status
        .as_ref()
        .unwrap()[0];
    assert_eq!(
        vs.persistent_volume_claim_info
            .as_ref()
            .unwrap()
            .claim_name
            .as_deref(),
        Some("data-mig-muid")
    );

    // Failure: the claims this migration still owns go, the record too.
    let failed = rwo_vmi(json!({"migratedVolumes": record,
        "migrationState": {"migrationUid": MUID, "sourceNode": "node-1", "targetNode": "node-2",
            "failed": true, "failureReason": "boom", "endTimestamp": ts(ago(1))}}));
    let d = run_with_claims(
        &vmim("Running"),
        Some(&failed),
        &pods,
        std::slice::from_ref(&claim),
        &[],
        None,
    );
    assert_eq!(d.status.phase, Phase::Failed);
    assert_eq!(d.delete_claims, ["data-mig-muid"]);
    assert!(d.claim_moves.is_empty());
    assert_eq!(d.vmi_status.as_ref().unwrap().migrated_volumes, None);
    // …also when the failed migration is looked at again, but never a claim handed over.
    let d = run_with_claims(
        &vmim("Failed"),
        Some(&failed),
        &pods,
        std::slice::from_ref(&claim),
        &[],
        None,
    );
    assert_eq!(d.delete_claims, ["data-mig-muid"]);
    let d = run_with_claims(
        &vmim("Failed"),
        Some(&failed),
        &pods,
        &[made_claim("another-migration")],
        &[],
        None,
    );
    assert!(d.delete_claims.is_empty());
    pods.clear();
}
