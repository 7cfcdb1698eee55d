#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use kubevirt_api::VirtualMachineSpec;

use super::*;

const VMI_UID: &str = "vmi-1";

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn now() -> Timestamp {
    ts("2026-01-01T00:00:00Z")
}

fn vm(strategy: RunStrategy, requests: Vec<StateChangeRequest>) -> VirtualMachine {
    let mut vm = VirtualMachine::new(
        "demo",
        VirtualMachineSpec {
            run_strategy: Some(strategy),
            ..VirtualMachineSpec::default()
        },
    );
    vm.metadata.namespace = Some("default".into());
    vm.metadata.uid = Some("vm-uid".into());
    vm.metadata.generation = Some(3);
    vm.status = Some(VirtualMachineStatus {
        run_strategy: Some(strategy),
        state_change_requests: (!requests.is_empty()).then_some(requests),
        ..VirtualMachineStatus::default()
    });
    vm
}

fn vmi(phase: Phase) -> ObservedVmi {
    ObservedVmi {
        uid: VMI_UID.into(),
        phase,
        deleting: false,
        ran: phase == Phase::Running,
        ready: None,
        paused: None,
        pod_scheduled: None,
        synchronized: None,
        vm_generation: Some(3),
        migrating: false,
    }
}

fn start() -> StateChangeRequest {
    StateChangeRequest {
        action: StateChangeRequestAction::Start,
        data: None,
        uid: None,
    }
}

fn stop(uid: &str) -> StateChangeRequest {
    StateChangeRequest {
        action: StateChangeRequestAction::Stop,
        data: None,
        uid: Some(uid.into()),
    }
}

/// The request columns of the table.
fn request_sets() -> [(&'static str, Vec<StateChangeRequest>); 5] {
    [
        ("none", vec![]),
        ("Start", vec![start()]),
        ("Stop(own)", vec![stop(VMI_UID)]),
        ("Stop(other)", vec![stop("older-vmi")]),
        ("restart", vec![stop(VMI_UID), start()]),
    ]
}

/// The VMI rows of the table.
fn vmi_states() -> [(&'static str, Option<ObservedVmi>); 9] {
    let deleting = ObservedVmi {
        deleting: true,
        ..vmi(Phase::Running)
    };
    [
        ("none", None),
        ("unset", Some(vmi(Phase::Unset))),
        ("Pending", Some(vmi(Phase::Pending))),
        ("Scheduling", Some(vmi(Phase::Scheduling))),
        ("Scheduled", Some(vmi(Phase::Scheduled))),
        ("Running", Some(vmi(Phase::Running))),
        ("Succeeded", Some(vmi(Phase::Succeeded))),
        ("Failed", Some(vmi(Phase::Failed))),
        ("deleting", Some(deleting)),
    ]
}

fn code(a: &VmiAction) -> char {
    match a {
        VmiAction::Nothing => '-',
        VmiAction::Create { .. } => 'C',
        VmiAction::Delete { .. } => 'D',
    }
}

/// Expected action per (strategy, VMI state), one character per request column:
/// none, Start, Stop(own uid), Stop(other uid), restart (Stop(own) + Start).
/// C = create the VMI, D = delete it, - = nothing.
fn expected(strategy: RunStrategy, state: &str) -> &'static str {
    use RunStrategy::*;
    let live = matches!(
        state,
        "unset" | "Pending" | "Scheduling" | "Scheduled" | "Running"
    );
    match (strategy, state) {
        (_, "deleting") => "-----",
        (Always, "none") => "CCCCC",
        (Always, "Succeeded" | "Failed") => "DDDDD",
        (Always, _) if live => "--D-D",
        (RerunOnFailure, "none") => "-C--C",
        (RerunOnFailure, "Succeeded" | "Failed") => "DDDDD",
        (RerunOnFailure, _) if live => "--D-D",
        (Manual, "none") => "-C--C",
        (Manual, "Succeeded" | "Failed") => "-DD-D",
        (Manual, _) if live => "--D-D",
        (Halted, "none") => "-----",
        (Halted, _) => "DDDDD",
        (Once, "none") => "CCCCC",
        (Once, _) => "-----",
        other => panic!("no row for {other:?}"),
    }
}

#[test]
fn run_strategy_decision_table() {
    let strategies = [
        RunStrategy::Always,
        RunStrategy::RerunOnFailure,
        RunStrategy::Manual,
        RunStrategy::Halted,
        RunStrategy::Once,
    ];
    let mut checked = 0;
    for strategy in strategies {
        for (state, observed) in vmi_states() {
            let want: Vec<char> = expected(strategy, state).chars().collect();
            for (i, (req_name, requests)) in request_sets().into_iter().enumerate() {
                let d = decide(&vm(strategy, requests), observed.as_ref(), now());
                assert_eq!(
                    code(&d.action),
                    want[i],
                    "{strategy:?} × VMI {state} × request {req_name}: got {:?}",
                    d.action
                );
                if let VmiAction::Delete { uid, .. } = &d.action {
                    assert_eq!(uid, VMI_UID, "a delete targets exactly the observed VMI");
                }
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 5 * 9 * 5);
}

#[test]
fn deprecated_running_maps_to_always_and_halted() {
    let mut v = vm(RunStrategy::Always, vec![]);
    v.spec.run_strategy = None;
    v.spec.running = Some(true);
    assert_eq!(run_strategy(&v), RunStrategy::Always);
    assert!(matches!(
        decide(&v, None, now()).action,
        VmiAction::Create { .. }
    ));
    v.spec.running = Some(false);
    assert_eq!(run_strategy(&v), RunStrategy::Halted);
    assert!(matches!(
        decide(&v, Some(&vmi(Phase::Running)), now()).action,
        VmiAction::Delete { .. }
    ));
    v.spec.running = None;
    assert_eq!(run_strategy(&v), RunStrategy::Halted);
}

#[test]
fn requests_are_consumed_in_order_by_observed_state() {
    // Stop of a VMI that is gone, then Start: the Stop is done, the Start waits for a VMI.
    let left = consume_requests(vec![stop(VMI_UID), start()], None);
    assert_eq!(left, vec![start()]);
    // With a live VMI of another uid both are done (the restart completed).
    let newer = ObservedVmi {
        uid: "vmi-2".into(),
        ..vmi(Phase::Pending)
    };
    assert!(consume_requests(vec![stop(VMI_UID), start()], Some(&newer)).is_empty());
    // A Stop of the current VMI blocks everything behind it.
    let r = consume_requests(vec![stop(VMI_UID), start()], Some(&vmi(Phase::Running)));
    assert_eq!(r.len(), 2);
    // A Start is not done by a finished or terminating VMI.
    assert_eq!(
        consume_requests(vec![start()], Some(&vmi(Phase::Failed))).len(),
        1
    );
    let terminating = ObservedVmi {
        deleting: true,
        ..vmi(Phase::Running)
    };
    assert_eq!(consume_requests(vec![start()], Some(&terminating)).len(), 1);
    // A Stop without uid cannot be acted upon and is dropped.
    let no_uid = StateChangeRequest {
        uid: None,
        ..stop("x")
    };
    assert!(consume_requests(vec![no_uid], Some(&vmi(Phase::Running))).is_empty());
}

#[test]
fn rerun_on_failure_requeues_a_start_only_after_failure() {
    let d = decide(
        &vm(RunStrategy::RerunOnFailure, vec![]),
        Some(&vmi(Phase::Failed)),
        now(),
    );
    assert_eq!(
        d.action,
        VmiAction::Delete {
            uid: VMI_UID.into(),
            requeue_start: true
        }
    );
    let d = decide(
        &vm(RunStrategy::RerunOnFailure, vec![]),
        Some(&vmi(Phase::Succeeded)),
        now(),
    );
    assert_eq!(
        d.action,
        VmiAction::Delete {
            uid: VMI_UID.into(),
            requeue_start: false
        }
    );
    // A user's Stop of a VMI that failed meanwhile is a stop, not a restart.
    let d = decide(
        &vm(RunStrategy::RerunOnFailure, vec![stop(VMI_UID)]),
        Some(&vmi(Phase::Failed)),
        now(),
    );
    assert_eq!(
        d.action,
        VmiAction::Delete {
            uid: VMI_UID.into(),
            requeue_start: false
        }
    );
    // A Start already queued (an earlier attempt whose delete failed) is not doubled.
    let d = decide(
        &vm(RunStrategy::RerunOnFailure, vec![start()]),
        Some(&vmi(Phase::Failed)),
        now(),
    );
    assert_eq!(
        d.action,
        VmiAction::Delete {
            uid: VMI_UID.into(),
            requeue_start: false
        }
    );
    // The requeued Start is written with the delete.
    let status = status_after(
        &vm(RunStrategy::RerunOnFailure, vec![]),
        Some(&vmi(Phase::Failed)),
    );
    assert_eq!(status.state_change_requests, Some(vec![start()]));
}

#[test]
fn rerun_on_failure_starts_when_switched_to() {
    let mut v = vm(RunStrategy::RerunOnFailure, vec![]);
    v.status.as_mut().unwrap().run_strategy = Some(RunStrategy::Halted);
    assert!(matches!(
        decide(&v, None, now()).action,
        VmiAction::Create { .. }
    ));
    v.status = None;
    assert!(matches!(
        decide(&v, None, now()).action,
        VmiAction::Create { .. }
    ));
}

#[test]
fn deleted_vm_deletes_its_vmi_and_never_creates() {
    for strategy in [RunStrategy::Always, RunStrategy::Once, RunStrategy::Manual] {
        let mut v = vm(strategy, vec![start()]);
        v.metadata.deletion_timestamp = Some(Time(now()));
        assert_eq!(decide(&v, None, now()).action, VmiAction::Nothing);
        assert!(matches!(
            decide(&v, Some(&vmi(Phase::Running)), now()).action,
            VmiAction::Delete { .. }
        ));
        let s = status_after(&v, Some(&vmi(Phase::Running)));
        assert_eq!(s.printable_status, Some(PrintableStatus::Terminating));
    }
}

#[test]
fn start_paused_request_renders_paused_create() {
    let mut data = BTreeMap::new();
    data.insert(START_PAUSED_KEY.to_string(), "true".to_string());
    let req = StateChangeRequest {
        data: Some(data),
        ..start()
    };
    let d = decide(&vm(RunStrategy::Always, vec![req]), None, now());
    assert_eq!(d.action, VmiAction::Create { start_paused: true });
    let d = decide(&vm(RunStrategy::Always, vec![]), None, now());
    assert_eq!(
        d.action,
        VmiAction::Create {
            start_paused: false
        }
    );
}

fn false_because(type_: &str, reason: &str) -> Condition {
    Condition::new(type_, ConditionStatus::False, reason, "details")
}

fn status_after(v: &VirtualMachine, observed: Option<&ObservedVmi>) -> VirtualMachineStatus {
    let decision = decide(v, observed, now());
    derive_status(
        v,
        observed,
        &StatusInputs {
            decision: &decision,
            outcome: &Outcome::Done,
            backoff: &BackoffConfig::default(),
            now: now(),
            jitter: 0.0,
            data_volumes: Default::default(),
        },
    )
}

#[test]
fn printable_status_derivation() {
    use PrintableStatus as P;
    let cases: Vec<(RunStrategy, Option<ObservedVmi>, P)> = vec![
        (RunStrategy::Halted, None, P::Stopped),
        (RunStrategy::Always, None, P::Starting),
        (RunStrategy::Manual, None, P::Stopped),
        (RunStrategy::Always, Some(vmi(Phase::Unset)), P::Starting),
        (RunStrategy::Always, Some(vmi(Phase::Pending)), P::Starting),
        (
            RunStrategy::Always,
            Some(vmi(Phase::Scheduling)),
            P::Starting,
        ),
        (
            RunStrategy::Always,
            Some(vmi(Phase::Scheduled)),
            P::Starting,
        ),
        (RunStrategy::Always, Some(vmi(Phase::Running)), P::Running),
        (RunStrategy::Halted, Some(vmi(Phase::Running)), P::Stopping),
        (RunStrategy::Once, Some(vmi(Phase::Succeeded)), P::Stopped),
        (RunStrategy::Once, Some(vmi(Phase::Failed)), P::Stopped),
        (RunStrategy::Always, Some(vmi(Phase::Unknown)), P::Unknown),
        (
            RunStrategy::Always,
            Some(ObservedVmi {
                deleting: true,
                ..vmi(Phase::Running)
            }),
            P::Stopping,
        ),
        (
            RunStrategy::Always,
            Some(ObservedVmi {
                paused: Some(Condition::new(
                    "Paused",
                    ConditionStatus::True,
                    "PausedByUser",
                    "",
                )),
                ..vmi(Phase::Running)
            }),
            P::Paused,
        ),
        (
            RunStrategy::Always,
            Some(ObservedVmi {
                migrating: true,
                paused: Some(Condition::new(
                    "Paused",
                    ConditionStatus::True,
                    "PausedByUser",
                    "",
                )),
                ..vmi(Phase::Running)
            }),
            P::Migrating,
        ),
        (
            RunStrategy::Halted,
            Some(ObservedVmi {
                migrating: true,
                ..vmi(Phase::Running)
            }),
            P::Stopping,
        ),
        (RunStrategy::WaitAsReceiver, None, P::WaitingForReceiver),
        (
            RunStrategy::Always,
            Some(ObservedVmi {
                pod_scheduled: Some(false_because("PodScheduled", "Unschedulable")),
                // Unschedulable wins over an image error, as in KubeVirt.
                synchronized: Some(false_because("Synchronized", "ErrImagePull")),
                ..vmi(Phase::Scheduling)
            }),
            P::ErrorUnschedulable,
        ),
        (
            RunStrategy::Always,
            Some(ObservedVmi {
                pod_scheduled: Some(false_because("PodScheduled", "Unschedulable")),
                synchronized: Some(false_because("Synchronized", "WaitingForVolumeBinding")),
                ..vmi(Phase::Scheduling)
            }),
            P::WaitingForVolumeBinding,
        ),
        (
            RunStrategy::Always,
            Some(ObservedVmi {
                synchronized: Some(false_because("Synchronized", "ErrImagePull")),
                ..vmi(Phase::Scheduling)
            }),
            P::ErrImagePull,
        ),
        (
            RunStrategy::Always,
            Some(ObservedVmi {
                synchronized: Some(false_because("Synchronized", "ImagePullBackOff")),
                ..vmi(Phase::Scheduling)
            }),
            P::ImagePullBackOff,
        ),
        (
            RunStrategy::Always,
            Some(ObservedVmi {
                // A pod creation error is not an image error: still Starting.
                synchronized: Some(false_because("Synchronized", "FailedCreate")),
                ..vmi(Phase::Pending)
            }),
            P::Starting,
        ),
        (
            RunStrategy::Always,
            Some(ObservedVmi {
                // Stale conditions of a running instance do not hide that it runs.
                synchronized: Some(false_because("Synchronized", "ImagePullBackOff")),
                ..vmi(Phase::Running)
            }),
            P::Running,
        ),
    ];
    for (strategy, observed, want) in cases {
        let s = status_after(&vm(strategy, vec![]), observed.as_ref());
        assert_eq!(
            s.printable_status,
            Some(want),
            "{strategy:?} with {observed:?}"
        );
    }
}

#[test]
fn failed_create_is_not_starting_and_sets_failure_condition() {
    let v = vm(RunStrategy::Always, vec![]);
    let decision = decide(&v, None, now());
    let s = derive_status(
        &v,
        None,
        &StatusInputs {
            decision: &decision,
            outcome: &Outcome::Failed {
                reason: "FailedCreate".into(),
                message: "quota".into(),
            },
            backoff: &BackoffConfig::default(),
            now: now(),
            jitter: 0.0,
            data_volumes: Default::default(),
        },
    );
    assert_eq!(s.printable_status, Some(PrintableStatus::Stopped));
    assert_eq!(s.created, Some(false));
    let conds = s.conditions.unwrap();
    let f = find_condition(&conds, condition_types::FAILURE).unwrap();
    assert_eq!(f.status, ConditionStatus::True);
    assert_eq!(f.reason.as_deref(), Some("FailedCreate"));
    // Success afterwards removes it.
    let mut v2 = v.clone();
    v2.status.as_mut().unwrap().conditions = Some(conds);
    let s2 = status_after(&v2, None);
    assert!(find_condition(&s2.conditions.unwrap(), condition_types::FAILURE).is_none());
}

#[test]
fn create_consumes_the_start_and_reports_created() {
    let v = vm(RunStrategy::Manual, vec![start()]);
    let s = status_after(&v, None);
    assert_eq!(s.state_change_requests, None);
    assert_eq!(s.created, Some(true));
    assert_eq!(s.ready, Some(false));
    assert_eq!(s.printable_status, Some(PrintableStatus::Starting));
    assert_eq!(s.desired_generation, Some(3));
    assert_eq!(s.observed_generation, Some(3));
    assert_eq!(s.run_strategy, Some(RunStrategy::Manual));

    // When the new VMI's watch event arrives, nothing is left to write.
    let mut after = v.clone();
    after.status = Some(s.clone());
    let created = ObservedVmi {
        uid: "new".into(),
        ..vmi(Phase::Unset)
    };
    assert_eq!(status_after(&after, Some(&created)), s);
}

#[test]
fn ready_and_paused_conditions_mirror_the_vmi() {
    let s = status_after(&vm(RunStrategy::Halted, vec![]), None);
    let c = s.conditions.unwrap();
    let ready = find_condition(&c, "Ready").unwrap();
    assert_eq!(ready.status, ConditionStatus::False);
    assert_eq!(ready.reason.as_deref(), Some("VMINotExists"));
    assert_eq!(ready.last_transition_time, Some(Time(now())));

    let v = vm(RunStrategy::Always, vec![]);

    let running = ObservedVmi {
        ready: Some(Condition::new("Ready", ConditionStatus::True, "", "")),
        paused: Some(Condition::new(
            "Paused",
            ConditionStatus::True,
            "PausedByUser",
            "",
        )),
        ..vmi(Phase::Running)
    };
    let s = status_after(&v, Some(&running));
    assert_eq!(s.ready, Some(true));
    let c = s.conditions.unwrap();
    assert_eq!(
        find_condition(&c, "Ready").unwrap().status,
        ConditionStatus::True
    );
    assert_eq!(
        find_condition(&c, "Paused").unwrap().status,
        ConditionStatus::True
    );

    let mut v2 = v.clone();
    v2.status.as_mut().unwrap().conditions = Some(c);
    let s = status_after(&v2, Some(&vmi(Phase::Running)));
    let c = s.conditions.unwrap();
    assert!(find_condition(&c, "Paused").is_none());
    assert_eq!(
        find_condition(&c, "Ready").unwrap().reason.as_deref(),
        Some("VMIConditionMissing")
    );
}

#[test]
fn status_is_stable_when_nothing_changes() {
    let v = vm(RunStrategy::Always, vec![]);
    let observed = vmi(Phase::Running);
    let first = status_after(&v, Some(&observed));
    let mut v2 = v.clone();
    v2.status = Some(first.clone());
    let later = ts("2026-01-01T00:05:00Z");
    let decision = decide(&v2, Some(&observed), later);
    let second = derive_status(
        &v2,
        Some(&observed),
        &StatusInputs {
            decision: &decision,
            outcome: &Outcome::Done,
            backoff: &BackoffConfig::default(),
            now: later,
            jitter: 0.7,
            data_volumes: Default::default(),
        },
    );
    assert_eq!(first, second, "no write when the world did not change");
}

#[test]
fn early_failures_back_off_into_crash_loop() {
    let b = BackoffConfig::default();
    assert_eq!(b.delay(1, 0.0), Duration::from_secs(10));
    assert_eq!(b.delay(2, 0.0), Duration::from_secs(40));
    assert_eq!(b.delay(1, 0.999).as_secs(), 14);
    assert_eq!(b.delay(10, 0.0), Duration::from_secs(300));

    // A VMI that failed without ever running is a failed start.
    let v = vm(RunStrategy::Always, vec![]);
    let failed = vmi(Phase::Failed);
    let s = status_after(&v, Some(&failed));
    let f = s.start_failure.clone().unwrap();
    assert_eq!(f.consecutive_fail_count, Some(1));
    assert_eq!(f.last_failed_vmi_uid.as_deref(), Some(VMI_UID));
    assert_eq!(
        f.retry_after_timestamp,
        Some(Time(ts("2026-01-01T00:00:10Z")))
    );
    assert_eq!(s.printable_status, Some(PrintableStatus::CrashLoopBackOff));

    // The same failure is counted once.
    let mut v2 = v.clone();
    v2.status = Some(s);
    let again = status_after(&v2, Some(&failed));
    assert_eq!(again.start_failure.unwrap().consecutive_fail_count, Some(1));

    // While backing off, no VMI is created; the wait is reported for a requeue.
    let d = decide(&v2, None, now());
    assert_eq!(d.action, VmiAction::Nothing);
    assert_eq!(d.wait, Some(Duration::from_secs(10)));
    assert_eq!(
        status_after(&v2, None).printable_status,
        Some(PrintableStatus::CrashLoopBackOff)
    );
    // After the deadline it starts again.
    let d = decide(&v2, None, ts("2026-01-01T00:00:11Z"));
    assert!(matches!(d.action, VmiAction::Create { .. }));

    // A newer VMI that runs clears the record.
    let newer = ObservedVmi {
        uid: "vmi-2".into(),
        ..vmi(Phase::Running)
    };
    assert_eq!(status_after(&v2, Some(&newer)).start_failure, None);
    let succeeded = ObservedVmi {
        uid: "vmi-3".into(),
        ..vmi(Phase::Succeeded)
    };
    assert_eq!(status_after(&v2, Some(&succeeded)).start_failure, None);
}

#[test]
fn crash_loop_only_while_a_restart_is_pending() {
    let mut v = vm(RunStrategy::RerunOnFailure, vec![]);
    v.status.as_mut().unwrap().start_failure = Some(VirtualMachineStartFailure {
        last_failed_vmi_uid: Some("old".into()),
        retry_after_timestamp: Some(Time(ts("2025-12-31T23:59:00Z"))),
        consecutive_fail_count: Some(2),
    });
    // No VMI, no pending start, back-off expired: the VM is simply stopped.
    assert_eq!(
        status_after(&v, None).printable_status,
        Some(PrintableStatus::Stopped)
    );
    // Back-off still running with a Start queued: crash-looping.
    let mut waiting = vm(RunStrategy::RerunOnFailure, vec![start()]);
    waiting.status.as_mut().unwrap().start_failure = Some(VirtualMachineStartFailure {
        retry_after_timestamp: Some(Time(ts("2026-01-01T00:01:00Z"))),
        ..v.status.as_ref().unwrap().start_failure.clone().unwrap()
    });
    let d = decide(&waiting, None, now());
    assert_eq!(d.wait, Some(Duration::from_secs(60)));
    assert_eq!(
        status_after(&waiting, None).printable_status,
        Some(PrintableStatus::CrashLoopBackOff)
    );
}

#[test]
fn a_failure_after_running_is_not_a_start_failure() {
    let v = vm(RunStrategy::Always, vec![]);
    let failed = ObservedVmi {
        ran: true,
        ..vmi(Phase::Failed)
    };
    let s = status_after(&v, Some(&failed));
    assert_eq!(s.start_failure, None);
    assert_eq!(s.printable_status, Some(PrintableStatus::Stopped));
}

#[test]
fn observed_vmi_reads_phase_history_and_generation() {
    let mut vmi = VirtualMachineInstance::new("demo", Default::default());
    vmi.metadata.uid = Some("u".into());
    vmi.metadata.annotations = Some(BTreeMap::from([(
        VM_GENERATION_ANNOTATION.to_string(),
        "7".to_string(),
    )]));
    vmi.status = Some(kubevirt_api::VirtualMachineInstanceStatus {
        phase: Phase::Failed,
        phase_transition_timestamps: Some(vec![kubevirt_api::vmi::PhaseTransitionTimestamp {
            phase: Phase::Running,
            phase_transition_timestamp: None,
        }]),
        ..Default::default()
    });
    let o = ObservedVmi::from_vmi(&vmi);
    assert!(o.ran);
    assert!(o.is_final());
    assert!(!o.is_live());
    assert_eq!(o.vm_generation, Some(7));
}

#[test]
fn migrating_is_a_started_transfer_without_an_end() {
    let with = |state: serde_json::Value| -> VirtualMachineInstance {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "demo", "uid": VMI_UID},
            "spec": {"domain": {"devices": {}}},
            "status": {"phase": "Running", "migrationState": state}
        }))
        .unwrap()
    };
    let handed_off = with(serde_json::json!({"migrationUid": "m", "targetNode": "n2"}));
    let started =
        with(serde_json::json!({"migrationUid": "m", "startTimestamp": "2026-01-01T00:00:00Z"}));
    let ended = with(
        serde_json::json!({"migrationUid": "m", "startTimestamp": "2026-01-01T00:00:00Z",
        "endTimestamp": "2026-01-01T00:00:09Z", "completed": true}),
    );
    assert!(!ObservedVmi::from_vmi(&handed_off).migrating);
    assert!(ObservedVmi::from_vmi(&started).migrating);
    assert!(!ObservedVmi::from_vmi(&ended).migrating);
}

/// The VM controller's cache drops the template but for what the inventory metrics read
/// (`super::super::slim_vm`): every decision must come out the same without it.
#[test]
fn decisions_do_not_read_the_template() {
    let now = Timestamp::now();
    for strategy in [
        RunStrategy::Always,
        RunStrategy::Halted,
        RunStrategy::Manual,
        RunStrategy::RerunOnFailure,
        RunStrategy::Once,
    ] {
        let mut full = vm(strategy, Vec::new());
        full.spec.template = serde_json::from_value(serde_json::json!({
            "metadata": {"labels": {"app": "demo"}, "annotations": {"vm.kubevirt.io/os": "fedora"}},
            "spec": {"domain": {"devices": {"disks": [{"name": "root"}]}, "memory": {"guest": "64Mi"},
                "cpu": {"cores": 2}, "machine": {"type": "q35"},
                "resources": {"requests": {"memory": "64Mi"}}},
                "volumes": [{"name": "root", "containerDisk": {"image": "x"}},
                    {"name": "data", "persistentVolumeClaim": {"claimName": "c", "readOnly": true}}],
                "networks": [{"name": "default", "pod": {}}]},
        }))
        .unwrap();
        let mut slim = full.clone();
        crate::vm::slim_vm(&mut slim);
        let kept: kubevirt_api::vm::VirtualMachineInstanceTemplateSpec =
            serde_json::from_value(serde_json::json!({
                "metadata": {"annotations": {"vm.kubevirt.io/os": "fedora"}},
                "spec": {"domain": {"memory": {"guest": "64Mi"}, "cpu": {"cores": 2},
                    "machine": {"type": "q35"}, "resources": {"requests": {"memory": "64Mi"}}},
                    "volumes": [{"name": "data",
                        "persistentVolumeClaim": {"claimName": "c", "readOnly": true}}],
                    "networks": [{"name": "default", "pod": {}}]},
            }))
            .unwrap();
        assert_eq!(slim.spec.template, kept);
        for observed in [None, Some(vmi(Phase::Running)), Some(vmi(Phase::Failed))] {
            assert_eq!(
                decide(&full, observed.as_ref(), now),
                decide(&slim, observed.as_ref(), now),
                "{strategy:?} {observed:?}"
            );
        }
    }
}

fn with_templates(mut v: VirtualMachine, names: &[&str]) -> VirtualMachine {
    v.spec.data_volume_templates = Some(
        names
            .iter()
            .map(|n| {
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": n},
                    "spec": {"source": {"blank": {}},
                             "storage": {"resources": {"requests": {"storage": "1Gi"}}}}
                }))
                .unwrap()
            })
            .collect(),
    );
    v
}

fn dv(phase: &str, running: Option<(&str, i32)>) -> kubevirt_api::cdi::DataVolume {
    let mut status = serde_json::json!({"phase": phase});
    if let Some((reason, restarts)) = running {
        status["conditions"] =
            serde_json::json!([{"type": "Running", "status": "False", "reason": reason}]);
        status["restartCount"] = serde_json::json!(restarts);
    }
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "d"}, "spec": {}, "status": status
    }))
    .unwrap()
}

#[test]
fn data_volumes_are_ready_provisioning_or_in_error_as_kubevirt_counts_them() {
    let v = with_templates(vm(RunStrategy::Always, vec![]), &["a", "b"]);
    let ok = dv("Succeeded", None);
    let wffc = dv("WaitForFirstConsumer", None);
    let importing = dv("ImportInProgress", None);
    let first_failure = dv("ImportInProgress", Some(("HTTPNotFound", 0)));
    let retried = dv("ImportInProgress", Some(("HTTPNotFound", 1)));
    let kubevirt_error = dv("ImportInProgress", Some(("Error", 0)));
    let failed = dv("Failed", None);
    let unsupported = dv("Pending", Some(("NotSupported", 0)));
    let rows: Vec<(Vec<Option<&kubevirt_api::cdi::DataVolume>>, DataVolumes)> = vec![
        (vec![Some(&ok), Some(&wffc)], DataVolumes::Ready),
        (vec![Some(&ok), None], DataVolumes::Provisioning),
        (vec![Some(&ok), Some(&importing)], DataVolumes::Provisioning),
        (
            vec![Some(&ok), Some(&first_failure)],
            DataVolumes::Provisioning,
        ),
        (vec![Some(&ok), Some(&retried)], DataVolumes::Error),
        (vec![None, Some(&kubevirt_error)], DataVolumes::Error),
        (vec![Some(&failed), Some(&ok)], DataVolumes::Error),
        (vec![Some(&unsupported), Some(&ok)], DataVolumes::Error),
    ];
    for (i, (dvs, want)) in rows.into_iter().enumerate() {
        assert_eq!(data_volumes(&v, &dvs), want, "row {i}");
    }
    // No templates: nothing to wait for.
    assert_eq!(
        data_volumes(&vm(RunStrategy::Always, vec![]), &[]),
        DataVolumes::Ready
    );
}

#[test]
fn the_vmi_waits_for_the_data_volumes_and_the_vm_says_why() {
    let v = with_templates(vm(RunStrategy::Always, vec![]), &["a"]);
    let d = decide(&v, None, now());
    assert!(matches!(d.action, VmiAction::Create { .. }));
    assert!(create_data_volumes(&v, true));
    for (dvs, printable) in [
        (DataVolumes::Provisioning, PrintableStatus::Provisioning),
        (DataVolumes::Error, PrintableStatus::DataVolumeError),
    ] {
        let held = hold_for_data_volumes(d.clone(), dvs);
        assert_eq!(held.action, VmiAction::Nothing);
        let s = derive_status(
            &v,
            None,
            &StatusInputs {
                decision: &held,
                outcome: &Outcome::Done,
                backoff: &BackoffConfig::default(),
                now: now(),
                jitter: 0.0,
                data_volumes: dvs,
            },
        );
        assert_eq!(s.printable_status, Some(printable));
        assert_eq!(s.created, Some(false));
    }
    assert_eq!(hold_for_data_volumes(d.clone(), DataVolumes::Ready), d);
    // A stopped VM provisions its DataVolumes too (KubeVirt's order: before Stopped),
    // unless it asks to create them only on start.
    let mut halted = with_templates(vm(RunStrategy::Halted, vec![]), &["a"]);
    assert!(create_data_volumes(&halted, false));
    halted.metadata.annotations = Some(BTreeMap::from([(
        IMMEDIATE_DATA_VOLUME_CREATION.to_string(),
        "false".to_string(),
    )]));
    assert!(!create_data_volumes(&halted, false));
    assert!(create_data_volumes(&halted, true));
}
