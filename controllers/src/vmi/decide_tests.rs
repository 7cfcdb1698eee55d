#![allow(clippy::unwrap_used, clippy::expect_used)]

use k8s_openapi::api::core::v1::Pod;
use kubevirt_api::VirtualMachineInstance;
use serde_json::{Value, json};

use super::*;

const UID: &str = "vmi-uid";

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn now() -> Timestamp {
    ts("2026-01-01T00:01:00Z")
}

fn vmi(phase: &str) -> VirtualMachineInstance {
    serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "demo", "namespace": "ns", "uid": UID, "resourceVersion": "5",
                     "creationTimestamp": "2026-01-01T00:00:00Z",
                     "finalizers": [FINALIZER]},
        "spec": {"domain": {"devices": {}}, "terminationGracePeriodSeconds": 20},
        "status": {"phase": phase}
    }))
    .unwrap()
}

fn no_finalizer(mut v: VirtualMachineInstance) -> VirtualMachineInstance {
    v.metadata.finalizers = None;
    v
}

fn deleting(mut v: VirtualMachineInstance) -> VirtualMachineInstance {
    v.metadata.deletion_timestamp = Some(Time(ts("2026-01-01T00:00:50Z")));
    v
}

/// A launcher pod of the VMI; `status` is merged over an empty pod status.
fn pod(name: &str, node: Option<&str>, status: Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": format!("{name}-uid"),
                     "creationTimestamp": "2026-01-01T00:00:01Z",
                     "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                                          "name": "demo", "uid": UID, "controller": true}]},
        "spec": {"nodeName": node, "containers": [{"name": "compute", "image": "launcher:v1"}]},
        "status": status
    }))
    .unwrap()
}

fn pending_pod() -> Pod {
    pod("p", None, json!({"phase": "Pending"}))
}

fn unschedulable_pod() -> Pod {
    pod(
        "p",
        None,
        json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
            "reason": "Unschedulable", "message": "0/1 nodes are available: 1 Insufficient memory."}]}),
    )
}

fn pulling_pod(reason: &str) -> Pod {
    pod(
        "p",
        Some("n1"),
        json!({"phase": "Pending", "initContainerStatuses": [{"name": "image-0", "image": "x",
            "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": reason, "message": "pull access denied for x"}}}]}),
    )
}

fn compute(state: Value) -> Value {
    json!([{"name": "compute", "image": "l", "imageID": "", "ready": true, "restartCount": 0, "state": state}])
}

fn running_pod() -> Pod {
    pod(
        "p",
        Some("n1"),
        json!({"phase": "Running", "containerStatuses": compute(json!({"running": {}}))}),
    )
}

fn bound_not_started_pod() -> Pod {
    pod(
        "p",
        Some("n1"),
        json!({"phase": "Pending", "containerStatuses": compute(json!({"waiting": {"reason": "PodInitializing"}}))}),
    )
}

fn exited_pod(phase: &str, code: i32, message: &str) -> Pod {
    pod(
        "p",
        Some("n1"),
        json!({"phase": phase, "containerStatuses": compute(json!({"terminated":
            {"exitCode": code, "reason": if code == 0 {"Completed"} else {"Error"}, "message": message}}))}),
    )
}

fn evicted_pod() -> Pod {
    pod(
        "p",
        Some("n1"),
        json!({"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."}),
    )
}

fn init_failed_pod() -> Pod {
    pod(
        "p",
        Some("n1"),
        json!({"phase": "Failed", "initContainerStatuses": [{"name": "image-0", "image": "x",
            "imageID": "", "ready": false, "restartCount": 0,
            "state": {"terminated": {"exitCode": 1, "message": "cp: can't stat '/disk': No such file or directory\n"}}}]}),
    )
}

fn terminating(mut p: Pod) -> Pod {
    p.metadata.deletion_timestamp = Some(Time(ts("2026-01-01T00:00:55Z")));
    p
}

fn foreign(mut p: Pod) -> Pod {
    p.metadata.owner_references.as_mut().unwrap()[0].uid = "other-vmi".into();
    p
}

fn cond<'a>(s: &'a VirtualMachineInstanceStatus, type_: &str) -> Option<&'a Condition> {
    s.conditions
        .as_deref()
        .and_then(|c| find_condition(c, type_))
}

/// One row: VMI, pods → plan (finalizer add/remove, create, deleted pod names) and the
/// resulting phase and reason.
struct Row {
    what: &'static str,
    vmi: VirtualMachineInstance,
    pods: Vec<Pod>,
    add_finalizer: bool,
    create: bool,
    delete: &'static [&'static str],
    remove_finalizer: bool,
    phase: Phase,
    reason: Option<&'static str>,
}

fn row(what: &'static str, vmi: VirtualMachineInstance, pods: Vec<Pod>) -> Row {
    let phase = vmi.status.as_ref().unwrap().phase;
    Row {
        what,
        vmi,
        pods,
        add_finalizer: false,
        create: false,
        delete: &[],
        remove_finalizer: false,
        phase,
        reason: None,
    }
}

#[test]
fn decision_table() {
    let rows = vec![
        Row {
            add_finalizer: true,
            create: true,
            // Before the pod exists (or when creating it failed).
            phase: Phase::Pending,
            ..row(
                "new VMI: finalizer first, then the pod",
                no_finalizer(vmi("")),
                vec![],
            )
        },
        Row {
            create: true,
            phase: Phase::Pending,
            ..row("Pending, finalizer present", vmi("Pending"), vec![])
        },
        Row {
            create: true,
            phase: Phase::Pending,
            ..row(
                "another VMI's pod is not ours",
                vmi("Pending"),
                vec![foreign(running_pod())],
            )
        },
        Row {
            phase: Phase::Scheduling,
            ..row(
                "pod created, not bound",
                vmi("Pending"),
                vec![pending_pod()],
            )
        },
        Row {
            phase: Phase::Scheduling,
            ..row(
                "bound, compute not started",
                vmi("Scheduling"),
                vec![bound_not_started_pod()],
            )
        },
        Row {
            phase: Phase::Scheduled,
            ..row(
                "bound and compute runs",
                vmi("Scheduling"),
                vec![running_pod()],
            )
        },
        row("Running stays Running", vmi("Running"), vec![running_pod()]),
        Row {
            phase: Phase::Failed,
            reason: Some(reasons::POD_NOT_EXISTS),
            ..row("Running, pod gone (#6685)", vmi("Running"), vec![])
        },
        Row {
            phase: Phase::Failed,
            reason: Some(reasons::POD_NOT_EXISTS),
            ..row("Scheduling, pod gone", vmi("Scheduling"), vec![])
        },
        Row {
            phase: Phase::Succeeded,
            reason: Some(reasons::POD_COMPLETED),
            ..row(
                "launcher exit 0",
                vmi("Running"),
                vec![exited_pod("Succeeded", 0, "")],
            )
        },
        Row {
            phase: Phase::Failed,
            reason: Some(reasons::GUEST_CRASHED),
            ..row(
                "launcher exit 2",
                vmi("Running"),
                vec![exited_pod("Failed", 2, "guest crashed")],
            )
        },
        Row {
            phase: Phase::Failed,
            reason: Some(reasons::LAUNCHER_FAILED),
            ..row(
                "launcher exit 1",
                vmi("Scheduled"),
                vec![exited_pod("Failed", 1, "no kvm")],
            )
        },
        Row {
            phase: Phase::Failed,
            reason: Some(reasons::EVICTED),
            ..row("evicted", vmi("Running"), vec![evicted_pod()])
        },
        Row {
            phase: Phase::Failed,
            reason: Some(reasons::POD_FAILED),
            ..row(
                "image copy failed",
                vmi("Scheduling"),
                vec![init_failed_pod()],
            )
        },
        row(
            "pod terminating: wait for how it ends",
            vmi("Running"),
            vec![terminating(running_pod())],
        ),
        Row {
            delete: &["p"],
            ..row(
                "final VMI frees its node",
                vmi("Failed"),
                vec![running_pod()],
            )
        },
        row(
            "final VMI keeps a terminated pod for its logs",
            vmi("Succeeded"),
            vec![exited_pod("Succeeded", 0, "")],
        ),
        Row {
            remove_finalizer: true,
            ..row("final VMI, no pod", vmi("Failed"), vec![])
        },
        Row {
            delete: &["p"],
            ..row(
                "deleted VMI: pod deleted",
                deleting(vmi("Running")),
                vec![running_pod()],
            )
        },
        Row {
            delete: &["p"],
            phase: Phase::Succeeded,
            reason: Some(reasons::POD_COMPLETED),
            ..row(
                "deleted VMI: terminated pod deleted too",
                deleting(vmi("Running")),
                vec![exited_pod("Succeeded", 0, "")],
            )
        },
        row(
            "deleted VMI: pod terminating, wait",
            deleting(vmi("Running")),
            vec![terminating(running_pod())],
        ),
        Row {
            remove_finalizer: true,
            ..row("deleted VMI: no pod left", deleting(vmi("Running")), vec![])
        },
        row(
            "deleted VMI without our finalizer, no pod",
            no_finalizer(deleting(vmi("Pending"))),
            vec![],
        ),
        Row {
            phase: Phase::Scheduling,
            ..row(
                "phases never go back",
                vmi("Scheduling"),
                vec![pending_pod()],
            )
        },
    ];
    for r in rows {
        let p = plan(&r.vmi, &r.pods);
        let deleted: Vec<&str> = p.delete_pods.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            (
                p.add_finalizer,
                p.create_pod,
                deleted.as_slice(),
                p.remove_finalizer
            ),
            (r.add_finalizer, r.create, r.delete, r.remove_finalizer),
            "plan: {}",
            r.what
        );
        let s = derive_status(&r.vmi, &r.pods, None, now());
        assert_eq!(s.phase, r.phase, "phase: {}", r.what);
        if r.reason.is_some() {
            assert_eq!(s.reason.as_deref(), r.reason, "reason: {}", r.what);
        }
        if s.phase.is_final() && !r.vmi.status.as_ref().unwrap().phase.is_final() {
            let ready = cond(&s, conditions::READY).expect("Ready on a final VMI");
            assert_eq!(ready.status, ConditionStatus::False, "{}", r.what);
        }
    }
}

#[test]
fn scheduling_names_the_pod_and_scheduled_the_node() {
    let s = derive_status(&vmi(""), &[pending_pod()], None, now());
    assert_eq!(s.phase, Phase::Scheduling);
    assert_eq!(
        s.active_pods,
        Some(BTreeMap::from([("p-uid".to_string(), String::new())]))
    );
    let stamps = s.phase_transition_timestamps.clone().unwrap();
    assert_eq!(stamps.len(), 1);
    assert_eq!(stamps[0].phase, Phase::Scheduling);
    assert_eq!(stamps[0].phase_transition_timestamp, Some(Time(now())));

    let mut v = vmi("Scheduling");
    v.status = Some(s);
    // Bound but not started: nothing new to write (the node comes with Scheduled).
    let bound = derive_status(&v, &[bound_not_started_pod()], None, now());
    assert_eq!(Some(&bound), v.status.as_ref());
    let s = derive_status(&v, &[running_pod()], None, now());
    assert_eq!(s.phase, Phase::Scheduled);
    assert_eq!(s.node_name.as_deref(), Some("n1"));
    // With the node, the launcher image the guest runs in (the workload updater's input).
    assert_eq!(
        s.launcher_container_image_version.as_deref(),
        Some("launcher:v1")
    );
    assert_eq!(
        s.active_pods,
        Some(BTreeMap::from([("p-uid".to_string(), "n1".to_string())]))
    );
    assert_eq!(s.phase_transition_timestamps.as_ref().unwrap().len(), 2);
    assert_eq!(node_label(&v, &s).as_deref(), Some("n1"));
    v.metadata.labels = Some(BTreeMap::from([(
        "kubevirt.io/nodeName".to_string(),
        "n1".to_string(),
    )]));
    assert_eq!(node_label(&v, &s), None);
}

#[test]
fn status_is_stable_when_nothing_changes() {
    for (v, pods) in [
        (vmi("Pending"), vec![]),
        (vmi("Scheduling"), vec![unschedulable_pod()]),
        (vmi("Scheduling"), vec![pulling_pod("ImagePullBackOff")]),
        (vmi("Scheduled"), vec![running_pod()]),
        (vmi("Running"), vec![evicted_pod()]),
    ] {
        let mut v = v;
        let first = derive_status(&v, &pods, None, now());
        v.status = Some(first.clone());
        let later = ts("2026-01-01T00:05:00Z");
        assert_eq!(derive_status(&v, &pods, None, later), first, "{pods:?}");
    }
}

#[test]
fn unschedulable_pod_sets_pod_scheduled_false_until_bound() {
    let s = derive_status(&vmi("Scheduling"), &[unschedulable_pod()], None, now());
    let c = cond(&s, conditions::POD_SCHEDULED).unwrap();
    assert_eq!(c.status, ConditionStatus::False);
    assert_eq!(c.reason.as_deref(), Some("Unschedulable"));
    assert_eq!(
        c.message.as_deref(),
        Some("0/1 nodes are available: 1 Insufficient memory.")
    );
    assert_eq!(c.last_transition_time, Some(Time(now())));
    let mut v = vmi("Scheduling");
    v.status = Some(s);
    let s = derive_status(&v, &[running_pod()], None, now());
    assert!(cond(&s, conditions::POD_SCHEDULED).is_none());
}

#[test]
fn image_pull_errors_set_synchronized_false_with_the_message() {
    for reason in ["ErrImagePull", "ImagePullBackOff"] {
        let s = derive_status(&vmi("Scheduling"), &[pulling_pod(reason)], None, now());
        assert_eq!(s.phase, Phase::Scheduling);
        let c = cond(&s, conditions::SYNCHRONIZED).unwrap();
        assert_eq!(c.status, ConditionStatus::False);
        assert_eq!(c.reason.as_deref(), Some(reason));
        assert_eq!(c.message.as_deref(), Some("pull access denied for x"));
        let mut v = vmi("Scheduling");
        v.status = Some(s);
        let s = derive_status(&v, &[running_pod()], None, now());
        assert!(cond(&s, conditions::SYNCHRONIZED).is_none(), "{reason}");
    }
}

#[test]
fn a_synchronized_condition_of_another_writer_is_left_alone() {
    let mut v = vmi("Scheduled");
    v.status.as_mut().unwrap().conditions = Some(vec![Condition::new(
        "Synchronized",
        ConditionStatus::False,
        "SomethingElse",
        "",
    )]);
    let s = derive_status(&v, &[running_pod()], None, now());
    assert_eq!(
        cond(&s, conditions::SYNCHRONIZED)
            .unwrap()
            .reason
            .as_deref(),
        Some("SomethingElse")
    );
}

#[test]
fn failed_create_is_reported_and_cleared() {
    let s = derive_status(
        &vmi("Pending"),
        &[],
        Some((reasons::FAILED_CREATE, "pods is forbidden: quota")),
        now(),
    );
    assert_eq!(s.phase, Phase::Pending);
    let c = cond(&s, conditions::SYNCHRONIZED).unwrap();
    assert_eq!(c.reason.as_deref(), Some("FailedCreate"));
    assert_eq!(c.message.as_deref(), Some("pods is forbidden: quota"));
    let mut v = vmi("Pending");
    v.status = Some(s);
    let s = derive_status(&v, &[pending_pod()], None, now());
    assert_eq!(s.phase, Phase::Scheduling);
    assert!(cond(&s, conditions::SYNCHRONIZED).is_none());
}

#[test]
fn failure_messages_name_the_cause() {
    let s = derive_status(
        &vmi("Running"),
        &[exited_pod("Failed", 1, "no kvm\n")],
        None,
        now(),
    );
    assert_eq!(
        cond(&s, conditions::READY).unwrap().message.as_deref(),
        Some("launcher exit code 1: no kvm")
    );
    let s = derive_status(&vmi("Scheduling"), &[init_failed_pod()], None, now());
    assert_eq!(
        cond(&s, conditions::READY).unwrap().message.as_deref(),
        Some("init container image-0 exited 1: cp: can't stat '/disk': No such file or directory")
    );
    let s = derive_status(&vmi("Running"), &[evicted_pod()], None, now());
    assert_eq!(
        cond(&s, conditions::READY).unwrap().message.as_deref(),
        Some("The node was low on resource: memory.")
    );
}

#[test]
fn final_is_final() {
    for phase in ["Succeeded", "Failed"] {
        for pods in [
            vec![],
            vec![running_pod()],
            vec![exited_pod("Failed", 2, "")],
        ] {
            let v = vmi(phase);
            let s = derive_status(&v, &pods, None, now());
            assert_eq!(s.phase, v.status.as_ref().unwrap().phase);
            assert_eq!(s.phase_transition_timestamps, None);
        }
    }
}

#[test]
fn a_live_pod_is_followed_before_a_terminated_one() {
    let mut old = exited_pod("Failed", 2, "");
    old.metadata.name = Some("old".into());
    old.metadata.uid = Some("old-uid".into());
    let s = derive_status(&vmi("Scheduling"), &[old, running_pod()], None, now());
    assert_eq!(s.phase, Phase::Scheduled);
}

#[test]
fn after_a_migration_the_pod_on_the_vmis_node_is_followed_not_the_deleted_source() {
    // Both pods were created in the same second: the clock cannot tell them apart.
    let mut src = terminating(running_pod());
    src.metadata.name = Some("src".into());
    src.metadata.uid = Some("src-uid".into());
    let mut dst = running_pod();
    dst.metadata.name = Some("dst".into());
    dst.metadata.uid = Some("dst-uid".into());
    dst.spec.as_mut().unwrap().node_name = Some("n2".into());
    let pods = [src.clone(), dst.clone()];
    let refs: Vec<&Pod> = pods.iter().collect();
    let picked = current_pod(&refs, Some("n2")).unwrap();
    assert_eq!(picked.metadata.name.as_deref(), Some("dst"));
    // Without a node the live, not-deleting pod still wins over the deleted source.
    let picked = current_pod(&refs, None).unwrap();
    assert_eq!(picked.metadata.name.as_deref(), Some("dst"));
    // A lone pod being deleted is still followed (eviction, VMI deletion).
    let lone = [src];
    let refs: Vec<&Pod> = lone.iter().collect();
    assert_eq!(
        current_pod(&refs, Some("n2"))
            .unwrap()
            .metadata
            .name
            .as_deref(),
        Some("src")
    );
}

#[test]
fn delete_grace_is_the_vmis_plus_padding() {
    let v = deleting(vmi("Running"));
    let p = plan(&v, &[running_pod()]);
    assert_eq!(p.delete_grace_seconds, Some(20 + 15));
    let mut v = v;
    // Always 0 on a finalizer-held custom resource: not a request for a forced stop.
    v.metadata.deletion_grace_period_seconds = Some(0);
    assert_eq!(delete_grace(&v), 35);
    v.spec.termination_grace_period_seconds = Some(1);
    assert_eq!(delete_grace(&v), 16);
    assert_eq!(
        plan(&v, &[terminating(running_pod())]).delete_grace_seconds,
        None
    );
}

#[test]
fn seconds_since_creation_uses_the_latest_entry() {
    let mut v = vmi("Scheduled");
    v.status.as_mut().unwrap().phase_transition_timestamps = Some(vec![
        PhaseTransitionTimestamp {
            phase: Phase::Scheduling,
            phase_transition_timestamp: Some(Time(ts("2026-01-01T00:00:01Z"))),
        },
        PhaseTransitionTimestamp {
            phase: Phase::Scheduled,
            phase_transition_timestamp: Some(Time(ts("2026-01-01T00:00:03.5Z"))),
        },
    ]);
    assert_eq!(seconds_since_creation(&v, Phase::Scheduled), Some(3.5));
    assert_eq!(seconds_since_creation(&v, Phase::Scheduling), Some(1.0));
    assert_eq!(seconds_since_creation(&v, Phase::Running), None);
    // Skew between writers floors at 0.
    v.metadata.creation_timestamp = Some(Time(ts("2026-01-01T00:00:10Z")));
    assert_eq!(seconds_since_creation(&v, Phase::Scheduled), Some(0.0));
}

#[test]
fn termination_messages_keep_the_last_line_without_colours() {
    let logs = "\u{1b}[2m2026-11-30T06:28:02Z\u{1b}[0m \u{1b}[31mERROR\u{1b}[0m launcher failed\n\
                virt-launcher: libvirtd did not come up: sh: 2: mkdir: not found\n\n";
    assert_eq!(
        last_line(logs),
        "virt-launcher: libvirtd did not come up: sh: 2: mkdir: not found"
    );
    assert_eq!(last_line("\u{1b}[1mbold\u{1b}[0m"), "bold");
    assert_eq!(last_line(" \n "), "");
    let s = derive_status(
        &vmi("Scheduled"),
        &[exited_pod("Failed", 1, logs)],
        None,
        now(),
    );
    assert_eq!(
        cond(&s, conditions::READY).unwrap().message.as_deref(),
        Some(
            "launcher exit code 1: virt-launcher: libvirtd did not come up: sh: 2: mkdir: not found"
        )
    );
}

#[test]
fn a_disrupted_pod_fails_the_vmi_even_when_the_launcher_exits_0() {
    let mut p = exited_pod("Succeeded", 0, "");
    p.status.as_mut().unwrap().conditions = Some(vec![
        serde_json::from_value(json!({"type": "DisruptionTarget", "status": "True",
            "reason": "EvictionByEvictionAPI", "message": "Eviction API: evicting"}))
        .unwrap(),
    ]);
    let s = derive_status(&vmi("Running"), std::slice::from_ref(&p), None, now());
    assert_eq!(s.phase, Phase::Failed);
    assert_eq!(s.reason.as_deref(), Some(reasons::EVICTED));
    assert_eq!(
        cond(&s, conditions::READY).unwrap().message.as_deref(),
        Some("EvictionByEvictionAPI: Eviction API: evicting")
    );
    // Already while the pod terminates: virt-handler must not get to call it a clean
    // shutdown first.
    let mut running = terminating(running_pod());
    running.status.as_mut().unwrap().conditions = p.status.unwrap().conditions;
    let s = derive_status(&vmi("Running"), &[running], None, now());
    assert_eq!(s.phase, Phase::Failed);
    assert_eq!(s.reason.as_deref(), Some(reasons::EVICTED));
}

#[test]
fn reaching_a_final_phase_is_an_event_once() {
    let v = vmi("Running");
    let s = derive_status(&v, &[exited_pod("Failed", 1, "no kvm")], None, now());
    assert_eq!(
        final_event(&v, &s),
        Some((
            true,
            reasons::LAUNCHER_FAILED,
            "launcher exit code 1: no kvm".to_string()
        ))
    );
    let s = derive_status(&v, &[exited_pod("Succeeded", 0, "")], None, now());
    assert_eq!(
        final_event(&v, &s).map(|e| (e.0, e.1)),
        Some((false, reasons::POD_COMPLETED))
    );
    let mut done = vmi("Failed");
    done.status = Some(s.clone());
    assert_eq!(final_event(&done, &s), None, "already final");
    assert_eq!(
        final_event(&v, &derive_status(&v, &[running_pod()], None, now())),
        None
    );
}

#[test]
fn an_image_missing_under_pull_policy_never_is_err_image_pull() {
    let s = derive_status(
        &vmi("Scheduling"),
        &[pulling_pod("ErrImageNeverPull")],
        None,
        now(),
    );
    let c = cond(&s, conditions::SYNCHRONIZED).unwrap();
    assert_eq!(c.reason.as_deref(), Some("ErrImagePull"));
    assert_eq!(c.message.as_deref(), Some("pull access denied for x"));
}

#[test]
fn an_unschedulable_pod_with_unbound_claims_waits_for_volume_binding() {
    let now = Timestamp::now();
    let unschedulable = Condition::new(
        conditions::POD_SCHEDULED,
        ConditionStatus::False,
        reasons::UNSCHEDULABLE,
        "0/2 nodes are available: pod has unbound immediate PersistentVolumeClaims.",
    );
    let mut status = VirtualMachineInstanceStatus {
        conditions: Some(vec![unschedulable.clone()]),
        ..Default::default()
    };
    volume_binding_condition(&mut status, "ns", &["data"], now);
    let c = find_condition(
        status.conditions.as_deref().unwrap(),
        conditions::SYNCHRONIZED,
    )
    .expect("Synchronized")
    .clone();
    assert_eq!(
        c.reason.as_deref(),
        Some(reasons::WAITING_FOR_VOLUME_BINDING)
    );
    let m = c.message.unwrap_or_default();
    assert!(
        m.contains("PVC ns/data not bound yet") && m.contains("unbound immediate"),
        "{m}"
    );

    // A WaitForFirstConsumer claim is unbound before its pod is placed: alone, no condition.
    let mut fresh = VirtualMachineInstanceStatus::default();
    volume_binding_condition(&mut fresh, "ns", &["data"], now);
    assert!(fresh.conditions.is_none());

    // Placed, or bound: the condition goes; the pod's own condition stays as it is.
    volume_binding_condition(&mut status, "ns", &[], now);
    let conds = status.conditions.as_deref().unwrap();
    assert!(find_condition(conds, conditions::SYNCHRONIZED).is_none());
    assert!(find_condition(conds, conditions::POD_SCHEDULED).is_some());
}

/// `p` as a migration's target pod: controlled by migration `m`, not by the VMI.
fn owned_by_migration(mut p: Pod) -> Pod {
    p.metadata.owner_references = Some(vec![
        serde_json::from_value(json!({"apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstanceMigration", "name": "m", "uid": "m-uid",
            "controller": true}))
        .unwrap(),
    ]);
    p
}

/// `status.activePods` of (pod uid, node) pairs.
fn active(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
    Some(
        pairs
            .iter()
            .map(|(u, n)| (u.to_string(), n.to_string()))
            .collect(),
    )
}

/// A migration's target pod is an active pod of the VMI once it launched (KubeVirt's
/// `activePods`): the target node's virt-handler finds its launcher there. A finished or
/// deleted target is not.
#[test]
fn a_bound_migration_target_is_an_active_pod_on_its_node() {
    let mut v = vmi("Running");
    v.status.as_mut().unwrap().node_name = Some("n1".into());
    v.status.as_mut().unwrap().active_pods = active(&[("p-uid", "n1")]);
    let target = |status: Value| owned_by_migration(pod("t", Some("n2"), status));
    let mut unbound = target(json!({"phase": "Pending"}));
    unbound.spec.as_mut().unwrap().node_name = None;
    let s = derive_status(&v, &[running_pod(), unbound], None, now());
    assert_eq!(s.active_pods, active(&[("p-uid", "n1"), ("t-uid", "")]));
    // Bound is enough for a target (its handler prepares from the hand-off on); a VMI's
    // own pod is recorded once launched.
    let bound = target(json!({"phase": "Pending"}));
    let s = derive_status(&v, &[running_pod(), bound], None, now());
    assert_eq!(s.active_pods, active(&[("p-uid", "n1"), ("t-uid", "n2")]));
    let launched =
        target(json!({"phase": "Running", "containerStatuses": compute(json!({"running": {}}))}));
    let s = derive_status(&v, &[running_pod(), launched], None, now());
    assert_eq!(s.active_pods, active(&[("p-uid", "n1"), ("t-uid", "n2")]));
    let failed = target(json!({"phase": "Failed"}));
    let s = derive_status(&v, &[running_pod(), failed], None, now());
    assert_eq!(s.active_pods, active(&[("p-uid", "n1")]));
}

/// A VM migrated back to a node while its old pod there still terminates: the map names
/// the new target on that node, not the old pod, since virt-handler takes the one pod the
/// map names on its node. A pod on its way out alone on its node stays (a VM being
/// stopped still has its launcher to talk to).
#[test]
fn a_pod_on_its_way_out_gives_way_to_a_live_one_on_its_node() {
    let mut v = vmi("Running");
    v.status.as_mut().unwrap().node_name = Some("n1".into());
    v.status.as_mut().unwrap().active_pods = active(&[("p-uid", "n1"), ("old-uid", "n2")]);
    let running = json!({"phase": "Running", "containerStatuses": compute(json!({"running": {}}))});
    let mut old = pod("old", Some("n2"), running.clone());
    old.metadata.deletion_timestamp = Some(Time(now()));
    let back = owned_by_migration(pod("back", Some("n2"), json!({"phase": "Pending"})));
    let s = derive_status(&v, &[running_pod(), old.clone(), back], None, now());
    assert_eq!(
        s.active_pods,
        active(&[("p-uid", "n1"), ("back-uid", "n2")])
    );
    // Before the migration back, the old pod is the only one on n2 and stays listed.
    let s = derive_status(&v, &[running_pod(), old], None, now());
    assert_eq!(s.active_pods, active(&[("p-uid", "n1"), ("old-uid", "n2")]));
}
