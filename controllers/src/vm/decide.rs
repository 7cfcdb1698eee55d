//! What the VM controller should do, as a pure function of the VM and its observed VMI.
//!
//! Everything here is deterministic: the clock and the jitter are inputs, so the whole
//! runStrategy × VMI state × stateChangeRequest table is unit-tested without a cluster.
//! The reconciler only executes the [`Decision`] and writes the status [`derive_status`]
//! returns.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kubevirt_api::common::{
    Condition, ConditionStatus, find_condition, remove_condition, set_condition,
};
use kubevirt_api::vm::{VirtualMachineStartFailure, condition_types};
use kubevirt_api::vmi::VirtualMachineInstancePhase as Phase;
use kubevirt_api::{
    PrintableStatus, RunStrategy, StateChangeRequest, StateChangeRequestAction, VirtualMachine,
    VirtualMachineInstance, VirtualMachineStatus,
};

/// Annotation on a VMI: the VM `metadata.generation` it was rendered from.
pub const VM_GENERATION_ANNOTATION: &str = "kubevirt.io/vm-generation";

/// Key in a Start request's data asking for a paused start.
pub const START_PAUSED_KEY: &str = "startPaused";

/// The parts of a VMI the decisions depend on.
#[derive(Clone, Debug, PartialEq)]
pub struct ObservedVmi {
    /// metadata.uid.
    pub uid: String,
    /// status.phase.
    pub phase: Phase,
    /// metadata.deletionTimestamp is set.
    pub deleting: bool,
    /// The VMI reached Running at some point (from its phase transition timestamps).
    pub ran: bool,
    /// The VMI's Ready condition.
    pub ready: Option<Condition>,
    /// The VMI's Paused condition.
    pub paused: Option<Condition>,
    /// The VMI's PodScheduled condition (set by the VMI controller while False).
    pub pod_scheduled: Option<Condition>,
    /// The VMI's Synchronized condition (image pull and pod creation errors).
    pub synchronized: Option<Condition>,
    /// The VM generation it was rendered from.
    pub vm_generation: Option<i64>,
    /// A live migration is transferring the guest (KubeVirt's `migrations.IsMigrating`:
    /// migrationState has a start and no end).
    pub migrating: bool,
}

impl ObservedVmi {
    /// Extracts the decision inputs from a VMI.
    pub fn from_vmi(vmi: &VirtualMachineInstance) -> Self {
        let status = vmi.status.clone().unwrap_or_default();
        let conditions = status.conditions.clone().unwrap_or_default();
        let ran = status.phase == Phase::Running
            || status
                .phase_transition_timestamps
                .iter()
                .flatten()
                .any(|t| t.phase == Phase::Running);
        Self {
            uid: vmi.metadata.uid.clone().unwrap_or_default(),
            phase: status.phase,
            deleting: vmi.metadata.deletion_timestamp.is_some(),
            ran,
            ready: find_condition(&conditions, "Ready").cloned(),
            paused: find_condition(&conditions, "Paused").cloned(),
            pod_scheduled: find_condition(&conditions, "PodScheduled").cloned(),
            synchronized: find_condition(&conditions, "Synchronized").cloned(),
            vm_generation: vmi
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(VM_GENERATION_ANNOTATION))
                .and_then(|g| g.parse().ok()),
            migrating: status
                .migration_state
                .as_ref()
                .is_some_and(|m| m.is_transferring()),
        }
    }

    /// Succeeded or Failed.
    pub fn is_final(&self) -> bool {
        self.phase.is_final()
    }

    /// Exists, is not being deleted and has not finished: an instance that counts as started.
    pub fn is_live(&self) -> bool {
        !self.deleting && !self.is_final()
    }

    fn condition_true(c: &Option<Condition>) -> bool {
        c.as_ref()
            .is_some_and(|c| c.status == ConditionStatus::True)
    }

    fn condition_false_because(c: &Option<Condition>, reason: &str) -> bool {
        c.as_ref().is_some_and(|c| {
            c.status == ConditionStatus::False && c.reason.as_deref() == Some(reason)
        })
    }

    /// The error a starting instance is stuck on, from the VMI controller's conditions.
    fn start_error(&self) -> Option<PrintableStatus> {
        if Self::condition_false_because(
            &self.synchronized,
            crate::vmi::decide::reasons::WAITING_FOR_VOLUME_BINDING,
        ) {
            // Unschedulable because of its claims: KubeVirt names the volumes first.
            Some(PrintableStatus::WaitingForVolumeBinding)
        } else if Self::condition_false_because(&self.pod_scheduled, "Unschedulable") {
            Some(PrintableStatus::ErrorUnschedulable)
        } else if Self::condition_false_because(&self.synchronized, "ErrImagePull") {
            Some(PrintableStatus::ErrImagePull)
        } else if Self::condition_false_because(&self.synchronized, "ImagePullBackOff") {
            Some(PrintableStatus::ImagePullBackOff)
        } else if Self::condition_false_because(
            &self.synchronized,
            crate::vmi::decide::reasons::PVC_NOT_FOUND,
        ) {
            Some(PrintableStatus::ErrorPvcNotFound)
        } else if Self::condition_false_because(
            &self.synchronized,
            crate::vmi::decide::reasons::FAILED_DATA_VOLUME_IMPORT,
        ) {
            Some(PrintableStatus::DataVolumeError)
        } else {
            None
        }
    }
}

/// What to do with the VM's instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VmiAction {
    /// Leave things as they are.
    Nothing,
    /// Create the VMI from the template.
    Create {
        /// A Start request asked for a paused start.
        start_paused: bool,
    },
    /// Delete exactly the VMI with this uid.
    Delete {
        /// metadata.uid of the VMI to delete (used as a delete precondition).
        uid: String,
        /// RerunOnFailure: the VMI failed, so queue a Start for after it is gone; the
        /// deleted VMI is the only record of the failure.
        requeue_start: bool,
    },
}

/// Tunables of the crash-loop back-off.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BackoffConfig {
    /// Delay after the first failure; later ones grow with the square of the count.
    pub min_interval: Duration,
    /// Upper bound of the delay.
    pub max_delay: Duration,
}

impl Default for BackoffConfig {
    /// KubeVirt's values: 10 s × failures², plus up to 50 % jitter, at most 5 min.
    fn default() -> Self {
        Self {
            min_interval: Duration::from_secs(10),
            max_delay: Duration::from_secs(300),
        }
    }
}

impl BackoffConfig {
    /// Delay before retry number `fail_count`; `jitter` in [0, 1) spreads VMs that fail together.
    pub fn delay(&self, fail_count: i32, jitter: f64) -> Duration {
        let n = f64::from(fail_count.max(1));
        let base = self.min_interval.as_secs_f64() * n * n;
        let jittered = base + base / 2.0 * jitter.clamp(0.0, 1.0);
        Duration::from_secs_f64(jittered.min(self.max_delay.as_secs_f64()))
    }
}

/// The outcome of [`decide`].
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    /// The action on the VMI.
    pub action: VmiAction,
    /// status.stateChangeRequests after dropping those the observed state has satisfied.
    pub requests: Vec<StateChangeRequest>,
    /// A start is held back by the crash-loop back-off for this long.
    pub wait: Option<Duration>,
}

/// The effective strategy, with KubeVirt's fallback from the deprecated `running` bool.
pub fn run_strategy(vm: &VirtualMachine) -> RunStrategy {
    vm.spec.effective_run_strategy()
}

fn requests_of(vm: &VirtualMachine) -> Vec<StateChangeRequest> {
    vm.status
        .as_ref()
        .and_then(|s| s.state_change_requests.clone())
        .unwrap_or_default()
}

/// Drops the leading requests that the observed state already satisfies. A Stop is
/// done once its VMI is gone (or replaced); a Start once a live VMI exists. Requests
/// are handled strictly in order, so a restart's Start waits for its Stop.
pub fn consume_requests(
    mut requests: Vec<StateChangeRequest>,
    vmi: Option<&ObservedVmi>,
) -> Vec<StateChangeRequest> {
    loop {
        let done = match requests.first() {
            None => break,
            Some(r) => match r.action {
                StateChangeRequestAction::Stop => match (vmi, r.uid.as_deref()) {
                    (None, _) | (_, None) => true,
                    (Some(v), Some(uid)) => v.uid != uid,
                },
                StateChangeRequestAction::Start => vmi.is_some_and(ObservedVmi::is_live),
            },
        };
        if !done {
            break;
        }
        requests.remove(0);
    }
    requests
}

fn backoff_left(vm: &VirtualMachine, now: Timestamp) -> Option<Duration> {
    let retry = vm
        .status
        .as_ref()?
        .start_failure
        .as_ref()?
        .retry_after_timestamp
        .as_ref()?
        .0;
    let left = retry.duration_since(now);
    (left > SignedDuration::ZERO).then(|| Duration::try_from(left).unwrap_or_default())
}

fn start_paused(head: Option<&StateChangeRequest>) -> bool {
    head.filter(|r| r.action == StateChangeRequestAction::Start)
        .and_then(|r| r.data.as_ref())
        .and_then(|d| d.get(START_PAUSED_KEY))
        .is_some_and(|v| v == "true")
}

/// Decides the action for `vm` given its observed VMI at time `now`.
pub fn decide(vm: &VirtualMachine, vmi: Option<&ObservedVmi>, now: Timestamp) -> Decision {
    let requests = consume_requests(requests_of(vm), vmi);
    let head = requests.first();
    let stop_for_vmi = |v: &ObservedVmi| {
        head.is_some_and(|r| {
            r.action == StateChangeRequestAction::Stop && r.uid.as_deref() == Some(v.uid.as_str())
        })
    };
    let has_start = head.is_some_and(|r| r.action == StateChangeRequestAction::Start);
    let delete = |v: &ObservedVmi, requeue_start: bool| VmiAction::Delete {
        uid: v.uid.clone(),
        requeue_start,
    };
    let create = VmiAction::Create {
        start_paused: start_paused(head),
    };
    let mut wait = None;
    let strategy = run_strategy(vm);

    let action = if vm.metadata.deletion_timestamp.is_some() {
        // A VM being deleted takes its instance with it and never starts a new one.
        match vmi {
            Some(v) if !v.deleting => delete(v, false),
            _ => VmiAction::Nothing,
        }
    } else {
        match (strategy, vmi) {
            (_, Some(v)) if v.deleting => VmiAction::Nothing,
            (RunStrategy::Always, Some(v)) if stop_for_vmi(v) || v.is_final() => delete(v, false),
            (RunStrategy::RerunOnFailure, Some(v)) if stop_for_vmi(v) || v.is_final() => {
                let queued = requests
                    .iter()
                    .any(|r| r.action == StateChangeRequestAction::Start);
                delete(v, v.phase == Phase::Failed && !stop_for_vmi(v) && !queued)
            }
            (RunStrategy::Manual, Some(v)) if stop_for_vmi(v) => delete(v, false),
            // A Start for a finished instance first clears the old one away (same name).
            (RunStrategy::Manual, Some(v)) if has_start && v.is_final() => delete(v, false),
            (RunStrategy::Halted, Some(v)) => delete(v, false),
            (_, Some(_)) => VmiAction::Nothing,
            (RunStrategy::Always, None) => match backoff_left(vm, now) {
                Some(left) => {
                    wait = Some(left);
                    VmiAction::Nothing
                }
                None => create,
            },
            (RunStrategy::RerunOnFailure, None) => {
                let switched_here =
                    vm.status.as_ref().and_then(|s| s.run_strategy) != Some(strategy);
                if !has_start && !switched_here {
                    VmiAction::Nothing
                } else if let Some(left) = backoff_left(vm, now) {
                    wait = Some(left);
                    VmiAction::Nothing
                } else {
                    create
                }
            }
            (RunStrategy::Manual, None) if has_start => create,
            (RunStrategy::Once, None) => create,
            (RunStrategy::Manual | RunStrategy::Halted | RunStrategy::WaitAsReceiver, None) => {
                VmiAction::Nothing
            }
        }
    };
    Decision {
        action,
        requests,
        wait,
    }
}

/// VM annotation: `"false"` creates the template DataVolumes only when the VM starts
/// (KubeVirt's; any other value or none creates them at once).
pub const IMMEDIATE_DATA_VOLUME_CREATION: &str = "kubevirt.io/immediate-data-volume-creation";

/// How a VM's template DataVolumes stand, for its start and its printable status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DataVolumes {
    /// No templates, or every DataVolume is ready for the VM to start.
    #[default]
    Ready,
    /// A DataVolume is missing or still being populated.
    Provisioning,
    /// A DataVolume failed, or its population keeps failing.
    Error,
}

/// Whether `dv` lets a VM start: KubeVirt's `handleDataVolumes` counts Succeeded,
/// WaitForFirstConsumer (the VM's own launcher pod binds the claim) and PendingPopulation.
pub fn data_volume_ready(dv: &kubevirt_api::cdi::DataVolume) -> bool {
    let phase = dv.status.as_ref().and_then(|s| s.phase.as_deref());
    phase.is_some_and(|p| kubevirt_api::cdi::phase::VM_READY_PHASES.contains(&p))
}

/// Whether `dv` is in error, KubeVirt's rule (pkg/storage/types/dv.go): phase Failed, or
/// `Running=False` with reason `Error` or `ImagePullFailed`. kubevirt-rs's importer
/// reports typed reasons (`HTTPNotFound`, `ChecksumError`, …) where CDI says `Error`, so a
/// `Running=False` with any other reason counts once kubelet has retried the importer
/// (restartCount > 0: the failure is not a one-off), and at once for the reasons that
/// never heal by retrying (an unsupported source, an invalid claim, a foreign claim).
pub fn data_volume_error(dv: &kubevirt_api::cdi::DataVolume) -> bool {
    use kubevirt_api::cdi::phase;
    let Some(status) = dv.status.as_ref() else {
        return false;
    };
    if status.phase.as_deref() == Some(phase::FAILED) {
        return true;
    }
    let Some(reason) = status
        .condition(phase::CONDITION_RUNNING)
        .filter(|c| c.status == ConditionStatus::False)
        .and_then(|c| c.reason.as_deref())
        .filter(|r| !r.is_empty() && *r != phase::REASON_COMPLETED)
    else {
        return false;
    };
    match reason {
        phase::REASON_ERROR | phase::REASON_IMAGE_PULL_FAILED => true,
        crate::datavolume::decide::REASON_NOT_SUPPORTED
        | crate::datavolume::decide::REASON_RESOURCE_EXISTS
        | phase::REASON_ERR_CLAIM_NOT_VALID => true,
        _ => status.restart_count.unwrap_or(0) > 0,
    }
}

/// How the DataVolumes of `vm`'s templates stand, each looked up by the template's name
/// (`dvs[i]` for template `i`, None when it does not exist yet).
pub fn data_volumes(
    vm: &VirtualMachine,
    dvs: &[Option<&kubevirt_api::cdi::DataVolume>],
) -> DataVolumes {
    let n = vm.spec.data_volume_templates.as_ref().map_or(0, Vec::len);
    if n == 0 {
        return DataVolumes::Ready;
    }
    if dvs.iter().flatten().any(|d| data_volume_error(d)) {
        return DataVolumes::Error;
    }
    if dvs.len() < n || dvs.iter().any(|d| !d.is_some_and(data_volume_ready)) {
        return DataVolumes::Provisioning;
    }
    DataVolumes::Ready
}

/// Whether the missing template DataVolumes are created now: at once unless the VM asks
/// to wait for its start ([`IMMEDIATE_DATA_VOLUME_CREATION`]), and always when it starts
/// (`starting`: the decision, before [`hold_for_data_volumes`], creates the VMI).
pub fn create_data_volumes(vm: &VirtualMachine, starting: bool) -> bool {
    let deferred = vm
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(IMMEDIATE_DATA_VOLUME_CREATION))
        .is_some_and(|v| v == "false");
    vm.metadata.deletion_timestamp.is_none() && (!deferred || starting)
}

/// `decision` with its start held back until the DataVolumes are ready: the VMI is created
/// only once they are (its Start request stays queued meanwhile).
pub fn hold_for_data_volumes(mut decision: Decision, dvs: DataVolumes) -> Decision {
    if dvs != DataVolumes::Ready && matches!(decision.action, VmiAction::Create { .. }) {
        decision.action = VmiAction::Nothing;
    }
    decision
}

/// How executing the decision went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The action (possibly Nothing) succeeded.
    Done,
    /// The action failed; `reason` is FailedCreate or FailedDelete.
    Failed {
        /// Condition reason.
        reason: String,
        /// Human-readable error.
        message: String,
    },
}

fn ready_condition(vmi: Option<&ObservedVmi>, created_now: bool) -> Condition {
    match vmi {
        // A VMI created this very reconcile has no conditions yet either; saying so now
        // spares a second status write when its watch event arrives.
        None if created_now => Condition::new(
            condition_types::READY,
            ConditionStatus::False,
            "VMIConditionMissing",
            "VMI is missing the Ready condition",
        ),
        None => Condition::new(
            condition_types::READY,
            ConditionStatus::False,
            "VMINotExists",
            "VMI does not exist",
        ),
        Some(v) => match &v.ready {
            None => Condition::new(
                condition_types::READY,
                ConditionStatus::False,
                "VMIConditionMissing",
                "VMI is missing the Ready condition",
            ),
            Some(c) => Condition {
                type_: condition_types::READY.to_string(),
                status: c.status,
                reason: c.reason.clone(),
                message: c.message.clone(),
                ..Condition::default()
            },
        },
    }
}

/// The printable status; first match wins, in KubeVirt's precedence.
pub fn printable_status(
    vm: &VirtualMachine,
    vmi: Option<&ObservedVmi>,
    action: &VmiAction,
    start_failure: Option<&VirtualMachineStartFailure>,
    backing_off: bool,
    dvs: DataVolumes,
) -> PrintableStatus {
    let creating = matches!(action, VmiAction::Create { .. });
    let deleting_now = matches!(action, VmiAction::Delete { .. });
    let live = vmi.filter(|v| v.is_live());
    let gone_or_final = vmi.is_none_or(ObservedVmi::is_final);
    let start_error = live
        .filter(|v| v.phase != Phase::Running)
        .and_then(ObservedVmi::start_error);
    let crash_looping = start_failure
        .and_then(|f| f.consecutive_fail_count)
        .is_some_and(|n| n > 0)
        && matches!(
            run_strategy(vm),
            RunStrategy::Always | RunStrategy::RerunOnFailure
        )
        // Only while a restart is actually pending: a VM that stopped cleanly after
        // earlier failures is Stopped, not crash-looping.
        && (backing_off || vmi.is_some_and(|v| v.phase == Phase::Failed));
    if vm.metadata.deletion_timestamp.is_some() {
        PrintableStatus::Terminating
    } else if vmi.is_some_and(|v| !v.is_final() && (v.deleting || deleting_now)) {
        PrintableStatus::Stopping
    } else if live.is_some_and(|v| v.migrating) {
        // KubeVirt's order: Migrating before Paused and Running.
        PrintableStatus::Migrating
    } else if live.is_some_and(|v| ObservedVmi::condition_true(&v.paused)) {
        PrintableStatus::Paused
    } else if live.is_some_and(|v| v.phase == Phase::Running) {
        PrintableStatus::Running
    } else if dvs == DataVolumes::Error {
        // KubeVirt's order: DataVolumeError, Unschedulable, Provisioning, then the rest,
        // whether or not an instance exists (a stopped VM's DataVolumes are created too).
        PrintableStatus::DataVolumeError
    } else if let Some(err) = start_error.filter(|e| *e == PrintableStatus::ErrorUnschedulable) {
        err
    } else if dvs == DataVolumes::Provisioning {
        PrintableStatus::Provisioning
    } else if let Some(err) = start_error {
        // KubeVirt's order: Unschedulable, then image pulls, before plain Starting.
        err
    } else if (vmi.is_none() && creating)
        || live.is_some_and(|v| {
            matches!(
                v.phase,
                Phase::Unset | Phase::Pending | Phase::Scheduling | Phase::Scheduled
            )
        })
    {
        PrintableStatus::Starting
    } else if gone_or_final && !creating && crash_looping {
        PrintableStatus::CrashLoopBackOff
    } else if vmi.is_none() && run_strategy(vm) == RunStrategy::WaitAsReceiver {
        PrintableStatus::WaitingForReceiver
    } else if gone_or_final {
        PrintableStatus::Stopped
    } else {
        PrintableStatus::Unknown
    }
}

/// Start-failure tracking: a VMI that failed before ever running counts as a failed
/// start and pushes the next start back; a newer VMI that runs or succeeds clears it.
pub fn start_failure(
    current: Option<&VirtualMachineStartFailure>,
    vmi: Option<&ObservedVmi>,
    backoff: &BackoffConfig,
    now: Timestamp,
    jitter: f64,
) -> Option<VirtualMachineStartFailure> {
    let Some(v) = vmi else {
        return current.cloned();
    };
    let last_uid = current.and_then(|f| f.last_failed_vmi_uid.as_deref());
    // A newer instance that runs, or shut down cleanly, proves the VM can start.
    if matches!(v.phase, Phase::Running | Phase::Succeeded) && last_uid != Some(v.uid.as_str()) {
        return None;
    }
    if v.phase == Phase::Failed && !v.ran && last_uid != Some(v.uid.as_str()) {
        let count = current.and_then(|f| f.consecutive_fail_count).unwrap_or(0) + 1;
        let delay = backoff.delay(count, jitter);
        let retry = now
            .checked_add(SignedDuration::try_from(delay).unwrap_or(SignedDuration::ZERO))
            .unwrap_or(now);
        return Some(VirtualMachineStartFailure {
            last_failed_vmi_uid: Some(v.uid.clone()),
            retry_after_timestamp: Some(Time(retry)),
            consecutive_fail_count: Some(count),
        });
    }
    current.cloned()
}

/// Inputs to [`derive_status`] besides the VM and the VMI.
#[derive(Clone, Debug)]
pub struct StatusInputs<'a> {
    /// The decision that was executed.
    pub decision: &'a Decision,
    /// How executing it went.
    pub outcome: &'a Outcome,
    /// Crash-loop back-off tunables.
    pub backoff: &'a BackoffConfig,
    /// The current time, for condition transitions and back-off deadlines.
    pub now: Timestamp,
    /// In [0, 1): spreads the back-off of VMs that failed together.
    pub jitter: f64,
    /// How the VM's template DataVolumes stand.
    pub data_volumes: DataVolumes,
}

/// The VM status after executing the decision: printableStatus, conditions, created,
/// ready, generations, runStrategy, start-failure back-off and the remaining requests.
pub fn derive_status(
    vm: &VirtualMachine,
    vmi: Option<&ObservedVmi>,
    inp: &StatusInputs<'_>,
) -> VirtualMachineStatus {
    let old = vm.status.clone().unwrap_or_default();
    let ok = *inp.outcome == Outcome::Done;
    let created_now = ok && matches!(inp.decision.action, VmiAction::Create { .. });

    let mut requests = inp.decision.requests.clone();
    let head_is_start = requests
        .first()
        .is_some_and(|r| r.action == StateChangeRequestAction::Start);
    match &inp.decision.action {
        // The instance exists now: its Start is done, which saves a status write.
        VmiAction::Create { .. } if ok && head_is_start => {
            requests.remove(0);
        }
        VmiAction::Delete {
            requeue_start: true,
            ..
        } if ok => requests.push(StateChangeRequest {
            action: StateChangeRequestAction::Start,
            data: None,
            uid: None,
        }),
        _ => {}
    }

    // Only strategies that restart an instance have anything to back off.
    let start_failure = if matches!(
        run_strategy(vm),
        RunStrategy::Always | RunStrategy::RerunOnFailure
    ) {
        start_failure(
            old.start_failure.as_ref(),
            vmi,
            inp.backoff,
            inp.now,
            inp.jitter,
        )
    } else {
        None
    };

    let mut conditions = old.conditions.clone().unwrap_or_default();
    let stamp = |mut c: Condition| {
        c.last_transition_time = Some(Time(inp.now));
        c
    };
    let set = |conds: &mut Vec<Condition>, c: Condition| {
        let same = find_condition(conds, &c.type_).is_some_and(|o| o.status == c.status);
        set_condition(conds, if same { c } else { stamp(c) });
    };
    set(&mut conditions, ready_condition(vmi, created_now));
    match vmi.and_then(|v| v.paused.clone()) {
        Some(p) if p.status == ConditionStatus::True => set(
            &mut conditions,
            Condition {
                type_: condition_types::PAUSED.to_string(),
                status: p.status,
                reason: p.reason,
                message: p.message,
                ..Condition::default()
            },
        ),
        _ => remove_condition(&mut conditions, condition_types::PAUSED),
    }
    match inp.outcome {
        Outcome::Done => remove_condition(&mut conditions, condition_types::FAILURE),
        Outcome::Failed { reason, message } => set(
            &mut conditions,
            Condition::new(
                condition_types::FAILURE,
                ConditionStatus::True,
                reason,
                message,
            ),
        ),
    }

    let created = vmi.is_some() || created_now;
    let ready = vmi.is_some_and(|v| ObservedVmi::condition_true(&v.ready));
    let desired_generation = if created_now {
        vm.metadata.generation
    } else {
        vmi.and_then(|v| v.vm_generation)
    };

    VirtualMachineStatus {
        created: Some(created),
        ready: Some(ready),
        printable_status: Some(printable_status(
            vm,
            vmi,
            if ok {
                &inp.decision.action
            } else {
                &VmiAction::Nothing
            },
            start_failure.as_ref(),
            inp.decision.wait.is_some(),
            inp.data_volumes,
        )),
        conditions: Some(conditions),
        state_change_requests: (!requests.is_empty()).then_some(requests),
        run_strategy: Some(run_strategy(vm)),
        observed_generation: vm.metadata.generation,
        desired_generation,
        start_failure,
        // The instance type and preference captured for the VM are kept as they are.
        instancetype_ref: vm.status.as_ref().and_then(|s| s.instancetype_ref.clone()),
        preference_ref: vm.status.as_ref().and_then(|s| s.preference_ref.clone()),
        // Queued by virt-apiserver, dropped by the reconcile that applies them.
        volume_requests: vm.status.as_ref().and_then(|s| s.volume_requests.clone()),
    }
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
