//! What the VMI controller should do, as a pure function of a VMI and its launcher pods.
//!
//! [`plan`] says which objects to touch (finalizer, pod create/delete);
//! [`derive_status`] says what the VMI status becomes given the pods as they are after
//! the plan ran. Both are deterministic (the clock is an input), so the whole
//! VMI phase × pod state table is unit-tested without a cluster. The contract is
//! docs/cluster-flow.md §3.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kubevirt_api::common::{
    Condition, ConditionStatus, find_condition, remove_condition, set_condition,
};
use kubevirt_api::vmi::{PhaseTransitionTimestamp, VirtualMachineInstancePhase as Phase};
use kubevirt_api::{VirtualMachineInstance, VirtualMachineInstanceStatus};

use super::render::{COMPUTE_CONTAINER, GRACE_PADDING_SECONDS};

/// Finalizer that keeps a VMI until its launcher pods are gone.
pub const FINALIZER: &str = "kubevirt.io/virtualMachineControllerFinalize";

/// VMI condition types this controller writes.
pub mod conditions {
    /// Mirrors the pod's PodScheduled condition while it is False.
    pub const POD_SCHEDULED: &str = "PodScheduled";
    /// False while the pod cannot be created or its images cannot be pulled.
    pub const SYNCHRONIZED: &str = "Synchronized";
    /// Written False when the VMI reaches a final phase through its pod.
    pub const READY: &str = "Ready";
    /// Whether every DataVolume the VMI uses is ready (KubeVirt's condition).
    pub const DATA_VOLUMES_READY: &str = "DataVolumesReady";
    /// True while the VMI's spec has more vCPUs than its guest (KubeVirt's condition): the
    /// workload updater migrates it to a launcher pod of the new size.
    pub const HOT_VCPU_CHANGE: &str = "HotVCPUChange";
}

/// Reasons of the VMI conditions and `status.reason`.
pub mod reasons {
    /// PodScheduled=False: no node fits the pod.
    pub const UNSCHEDULABLE: &str = "Unschedulable";
    /// Synchronized=False: the image cannot be pulled.
    pub const ERR_IMAGE_PULL: &str = "ErrImagePull";
    /// Synchronized=False: the kubelet backs off pulling the image.
    pub const IMAGE_PULL_BACK_OFF: &str = "ImagePullBackOff";
    /// Synchronized=False: creating the launcher pod failed.
    pub const FAILED_CREATE: &str = "FailedCreate";
    /// A claim the VMI names does not exist (KubeVirt's reason).
    pub const PVC_NOT_FOUND: &str = "FailedPvcNotFound";
    /// Synchronized=False: a DataVolume the VMI uses failed to populate its claim
    /// (KubeVirt's reason; the VM shows DataVolumeError).
    pub const FAILED_DATA_VOLUME_IMPORT: &str = "FailedDataVolumeImport";
    /// DataVolumesReady=True (KubeVirt's reason).
    pub const ALL_DVS_READY: &str = "AllDVsReady";
    /// DataVolumesReady=False (KubeVirt's reason).
    pub const NOT_ALL_DVS_READY: &str = "NotAllDVsReady";
    /// The launcher pod cannot be scheduled while a claim it mounts is unbound.
    pub const WAITING_FOR_VOLUME_BINDING: &str = "WaitingForVolumeBinding";
    /// Failed: the launcher pod disappeared (KubeVirt #6685).
    pub const POD_NOT_EXISTS: &str = "PodNotExists";
    /// Failed: the launcher pod was evicted (by the kubelet, or a DisruptionTarget:
    /// eviction API, preemption, taint manager).
    pub const EVICTED: &str = "Evicted";
    /// Failed: the guest crashed (launcher exit code 2).
    pub const GUEST_CRASHED: &str = "GuestCrashed";
    /// Failed: the launcher reported an error (exit code 1) or was killed.
    pub const LAUNCHER_FAILED: &str = "LauncherFailed";
    /// Failed: the init container (the busybox copy) or the pod itself failed. (A failed
    /// image copy fails the launcher, which names the file: [`LAUNCHER_FAILED`].)
    pub const POD_FAILED: &str = "PodFailed";
    /// Succeeded: the launcher exited 0 after the guest shut down.
    pub const POD_COMPLETED: &str = "PodCompleted";
}

/// The VMI's own launcher pods: labelled with its uid and controlled by it.
pub fn owned_pods<'a>(vmi: &VirtualMachineInstance, pods: &'a [Pod]) -> Vec<&'a Pod> {
    let Some(uid) = vmi.metadata.uid.as_deref() else {
        return Vec::new();
    };
    pods.iter()
        .filter(|p| {
            p.metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.controller == Some(true) && o.uid == uid)
        })
        .collect()
}

fn pod_phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

fn is_terminal(p: &Pod) -> bool {
    matches!(pod_phase(p), "Succeeded" | "Failed")
}

fn is_deleting(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_some()
}

fn node_of(p: &Pod) -> Option<&str> {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
}

fn compute_status(p: &Pod) -> Option<&ContainerStatus> {
    p.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == COMPUTE_CONTAINER)
}

fn compute_running(p: &Pod) -> bool {
    compute_status(p)
        .and_then(|c| c.state.as_ref())
        .is_some_and(|s| s.running.is_some())
}

/// The pod runs and so does its compute container: the VMI is Scheduled.
fn launched(p: &Pod) -> bool {
    pod_phase(p) == "Running" && compute_running(p)
}

/// A pod a migration controls: its target launcher until the migration hands it to the
/// VMI.
fn migration_target(p: &Pod) -> bool {
    p.metadata.owner_references.iter().flatten().any(|o| {
        o.controller == Some(true)
            && o.kind == kubevirt_api::catalogue::VIRTUAL_MACHINE_INSTANCE_MIGRATION.kind
    })
}

fn pod_uid(p: &Pod) -> String {
    p.metadata.uid.clone().unwrap_or_default()
}

fn created(p: &Pod) -> Option<Timestamp> {
    p.metadata.creation_timestamp.as_ref().map(|t| t.0)
}

/// A pod to delete, guarded by its uid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRef {
    /// metadata.name.
    pub name: String,
    /// metadata.uid (delete precondition).
    pub uid: String,
}

/// What to change besides the status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Add [`FINALIZER`] (always before a pod is created).
    pub add_finalizer: bool,
    /// Create the launcher pod.
    pub create_pod: bool,
    /// Delete these pods.
    pub delete_pods: Vec<PodRef>,
    /// Grace period of those deletions.
    pub delete_grace_seconds: Option<i64>,
    /// Remove [`FINALIZER`]: no launcher pod remains.
    pub remove_finalizer: bool,
}

fn has_finalizer(vmi: &VirtualMachineInstance) -> bool {
    vmi.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER)
}

fn phase(vmi: &VirtualMachineInstance) -> Phase {
    vmi.status.as_ref().map(|s| s.phase).unwrap_or_default()
}

/// Grace period of a launcher pod deletion: the VMI's plus the launcher's teardown
/// padding. `metadata.deletionGracePeriodSeconds` is not used: with CRD semantics (ours
/// and kube-apiserver's) it is always 0 on a VMI held by a finalizer; a shorter grace
/// reaches the VMI as `spec.terminationGracePeriodSeconds` (`stop --grace-period`,
/// forced restart), as in KubeVirt.
pub fn delete_grace(vmi: &VirtualMachineInstance) -> i64 {
    vmi.spec
        .termination_grace_period_seconds
        .unwrap_or(30)
        .max(0)
        + GRACE_PADDING_SECONDS
}

/// Decides which objects to touch for `vmi` given its launcher `pods` (any pods: those
/// the VMI does not control are ignored).
pub fn plan(vmi: &VirtualMachineInstance, pods: &[Pod]) -> Plan {
    let ours = owned_pods(vmi, pods);
    let deleting = vmi.metadata.deletion_timestamp.is_some();
    let phase = phase(vmi);
    let mut plan = Plan::default();
    let delete_live = |plan: &mut Plan, also_terminal: bool| {
        plan.delete_pods = ours
            .iter()
            .filter(|p| !is_deleting(p) && (also_terminal || !is_terminal(p)))
            .map(|p| PodRef {
                name: p.metadata.name.clone().unwrap_or_default(),
                uid: pod_uid(p),
            })
            .collect();
        if !plan.delete_pods.is_empty() {
            plan.delete_pods.sort_by(|a, b| a.name.cmp(&b.name));
            plan.delete_grace_seconds = Some(delete_grace(vmi));
        }
    };
    if deleting {
        // The VMI goes away only after its pods: a guest must never outlive its VMI.
        delete_live(&mut plan, true);
        plan.remove_finalizer = ours.is_empty() && has_finalizer(vmi);
    } else if phase.is_final() {
        // A finished VMI frees its node; a terminated pod stays for its logs until the
        // VMI is deleted.
        delete_live(&mut plan, false);
        plan.remove_finalizer = ours.is_empty() && has_finalizer(vmi);
    } else if ours.is_empty() && matches!(phase, Phase::Unset | Phase::Pending) {
        // One pod per VMI, ever: once Scheduling was written, a missing pod means the
        // VMI failed (derive_status), never a second pod.
        plan.add_finalizer = !has_finalizer(vmi);
        plan.create_pod = true;
    }
    plan
}

/// The pod the VMI status follows: a live pod before a terminal one, one not being
/// deleted before one that is, one on the VMI's node before others, then the newest.
/// Creation timestamps have whole-second resolution, so after a migration hands over
/// the target pod the node and the deletion of the source decide, not the clock.
/// The image of the pod's compute container (virt-launcher).
fn compute_image(pod: &Pod) -> Option<String> {
    pod.spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == super::render::COMPUTE_CONTAINER)?
        .image
        .clone()
}

fn current_pod<'a>(ours: &[&'a Pod], node: Option<&str>) -> Option<&'a Pod> {
    let key = |p: &Pod| {
        let on_node =
            node.is_some_and(|n| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(n));
        (
            is_terminal(p),
            is_deleting(p),
            !on_node,
            std::cmp::Reverse(created(p)),
        )
    };
    ours.iter().copied().min_by_key(|p| key(p))
}

/// The last non-empty line of a termination message, without terminal colour codes.
/// With `FallbackToLogsOnError` the message is the log's tail, whose last line is the
/// launcher's error (`virt-launcher: …`).
pub fn last_line(message: &str) -> String {
    let mut plain = String::with_capacity(message.len());
    let mut chars = message.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters… final byte in @..~
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
            continue;
        }
        plain.push(c);
    }
    plain
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .unwrap_or_default()
        .to_string()
}

/// The pod's DisruptionTarget condition, as its message: the eviction API (drain),
/// preemption, the taint manager or a kubelet shutdown is terminating it. The launcher
/// may well exit 0 after shutting the guest down, but the guest did not choose to stop,
/// so the VMI fails (a RerunOnFailure VM starts it again) — as soon as the condition
/// appears, before virt-handler can report a clean shutdown.
fn disruption(p: &Pod) -> Option<String> {
    let c = p
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "DisruptionTarget" && c.status == "True")?;
    Some(format!(
        "{}: {}",
        c.reason.as_deref().unwrap_or("DisruptionTarget"),
        c.message.as_deref().unwrap_or("")
    ))
}

/// How a terminated pod ended, as (phase, reason, message).
fn pod_outcome(p: &Pod) -> (Phase, &'static str, String) {
    let status = p.status.as_ref();
    let pod_message = status.and_then(|s| s.message.clone()).unwrap_or_default();
    if status.and_then(|s| s.reason.as_deref()) == Some("Evicted") {
        return (Phase::Failed, reasons::EVICTED, pod_message);
    }
    if let Some(message) = disruption(p) {
        return (Phase::Failed, reasons::EVICTED, message);
    }
    let terminated = compute_status(p)
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.as_ref());
    if let Some(t) = terminated {
        let message = t
            .message
            .as_deref()
            .map(last_line)
            .filter(|m| !m.is_empty())
            .or_else(|| t.reason.clone())
            .unwrap_or_default();
        return match t.exit_code {
            0 => (
                Phase::Succeeded,
                reasons::POD_COMPLETED,
                "the launcher exited after the guest shut down".into(),
            ),
            2 => (Phase::Failed, reasons::GUEST_CRASHED, message),
            code => (
                Phase::Failed,
                reasons::LAUNCHER_FAILED,
                format!("launcher exit code {code}: {message}"),
            ),
        };
    }
    if pod_phase(p) == "Succeeded" {
        return (
            Phase::Succeeded,
            reasons::POD_COMPLETED,
            "the launcher pod completed".into(),
        );
    }
    // No compute state: the init container (the busybox copy) failed, or the pod was
    // rejected by the kubelet.
    let init_failure = status
        .and_then(|s| s.init_container_statuses.as_ref())
        .into_iter()
        .flatten()
        .find_map(|c| {
            let t = c.state.as_ref()?.terminated.as_ref()?;
            (t.exit_code != 0).then(|| {
                format!(
                    "init container {} exited {}: {}",
                    c.name,
                    t.exit_code,
                    last_line(t.message.as_deref().unwrap_or(""))
                )
            })
        });
    let message = init_failure.unwrap_or(if pod_message.is_empty() {
        "the launcher pod failed".into()
    } else {
        pod_message
    });
    (Phase::Failed, reasons::POD_FAILED, message)
}

/// An image pull problem of any container of the pod, as (reason, message).
fn image_pull_problem(p: &Pod) -> Option<(&'static str, String)> {
    let status = p.status.as_ref()?;
    status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .find_map(|c| {
            let w = c.state.as_ref()?.waiting.as_ref()?;
            let reason = match w.reason.as_deref()? {
                // An image that is not there under pull policy Never (local clusters
                // with imported images) or is misspelt will not come either; the
                // kubelet's message says which.
                "ErrImagePull" | "ErrImageNeverPull" | "InvalidImageName" => {
                    reasons::ERR_IMAGE_PULL
                }
                "ImagePullBackOff" => reasons::IMAGE_PULL_BACK_OFF,
                _ => return None,
            };
            Some((reason, w.message.clone().unwrap_or_default()))
        })
}

/// The pod's PodScheduled condition when it says Unschedulable, as its message.
fn unschedulable(p: &Pod) -> Option<String> {
    let c = p
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled")?;
    (c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))
        .then(|| c.message.clone().unwrap_or_default())
}

fn rank(p: Phase) -> u8 {
    match p {
        Phase::Unset => 0,
        Phase::Pending => 1,
        Phase::Scheduling => 2,
        Phase::Scheduled => 3,
        Phase::Running | Phase::WaitingForSync | Phase::Unknown => 4,
        Phase::Succeeded | Phase::Failed => 5,
    }
}

/// Whether the running VMI's spec has other vCPUs than its guest (`currentCPUTopology`)
/// while it has room for hotplug (`maxSockets`).
fn hot_vcpu_change(vmi: &VirtualMachineInstance, status: &VirtualMachineInstanceStatus) -> bool {
    let (Some(cpu), Some(cur)) = (
        vmi.spec.domain.cpu.as_ref(),
        status.current_cpu_topology.as_ref(),
    ) else {
        return false;
    };
    let n = |c: Option<u32>| c.unwrap_or(1).max(1);
    status.phase == Phase::Running
        && cpu.max_sockets.is_some_and(|m| m > 0)
        && n(cpu.sockets) * n(cpu.cores) * n(cpu.threads)
            != n(cur.sockets) * n(cur.cores) * n(cur.threads)
}

/// The VMI status after the plan ran, given its pods as they are now (a pod created in
/// this reconcile included) and the error of a failed pod creation.
pub fn derive_status(
    vmi: &VirtualMachineInstance,
    pods: &[Pod],
    create_error: Option<(&str, &str)>,
    now: Timestamp,
) -> VirtualMachineInstanceStatus {
    let old = vmi.status.clone().unwrap_or_default();
    let mut status = old.clone();
    let ours = owned_pods(vmi, pods);
    let deleting = vmi.metadata.deletion_timestamp.is_some();
    let mut conditions = old.conditions.clone().unwrap_or_default();
    let set = |conds: &mut Vec<Condition>, type_: &str, reason: &str, message: &str| {
        let mut c = Condition::new(type_, ConditionStatus::False, reason, message);
        let same = find_condition(conds, type_)
            .is_some_and(|o| o.status == c.status && o.reason == c.reason);
        c.last_transition_time = if same {
            find_condition(conds, type_).and_then(|o| o.last_transition_time.clone())
        } else {
            Some(Time(now))
        };
        set_condition(conds, c);
    };
    let clear_ours = |conds: &mut Vec<Condition>, type_: &str, ours: &[&str]| {
        if find_condition(conds, type_)
            .is_some_and(|c| c.reason.as_deref().is_some_and(|r| ours.contains(&r)))
        {
            remove_condition(conds, type_);
        }
    };

    let mut next = old.phase;
    if old.phase.is_final() {
        // Final is final: only the pod list is kept up to date.
    } else if let Some(pod) = current_pod(&ours, old.node_name.as_deref()) {
        if let Some(message) = disruption(pod).filter(|_| !is_terminal(pod)) {
            next = Phase::Failed;
            status.reason = Some(reasons::EVICTED.to_string());
            set(
                &mut conditions,
                conditions::READY,
                reasons::EVICTED,
                &message,
            );
        } else if is_terminal(pod) {
            let (p, reason, message) = pod_outcome(pod);
            next = p;
            status.reason = Some(reason.to_string());
            set(&mut conditions, conditions::READY, reason, &message);
        } else {
            let bound = node_of(pod).is_some();
            if bound && launched(pod) {
                next = Phase::Scheduled;
                status.node_name = node_of(pod).map(str::to_string);
                // The launcher the guest runs in (KubeVirt's field holds the image): the
                // workload updater compares it with the current one after an upgrade.
                if let Some(image) = compute_image(pod) {
                    status.launcher_container_image_version = Some(image);
                }
            } else {
                next = Phase::Scheduling;
            }
            match unschedulable(pod) {
                Some(m) if !bound => set(
                    &mut conditions,
                    conditions::POD_SCHEDULED,
                    reasons::UNSCHEDULABLE,
                    &m,
                ),
                _ => remove_condition(&mut conditions, conditions::POD_SCHEDULED),
            }
            match image_pull_problem(pod) {
                Some((reason, m)) => set(&mut conditions, conditions::SYNCHRONIZED, reason, &m),
                None => clear_ours(
                    &mut conditions,
                    conditions::SYNCHRONIZED,
                    &[
                        reasons::ERR_IMAGE_PULL,
                        reasons::IMAGE_PULL_BACK_OFF,
                        reasons::FAILED_CREATE,
                    ],
                ),
            }
        }
    } else if matches!(old.phase, Phase::Unset | Phase::Pending) {
        next = Phase::Pending;
        match create_error {
            Some((reason, e)) => set(&mut conditions, conditions::SYNCHRONIZED, reason, e),
            None => clear_ours(
                &mut conditions,
                conditions::SYNCHRONIZED,
                &[
                    reasons::FAILED_CREATE,
                    reasons::PVC_NOT_FOUND,
                    reasons::FAILED_DATA_VOLUME_IMPORT,
                ],
            ),
        }
    } else if !deleting {
        // KubeVirt #6685: a VMI whose pod disappeared must never stay Running.
        next = Phase::Failed;
        status.reason = Some(reasons::POD_NOT_EXISTS.to_string());
        set(
            &mut conditions,
            conditions::READY,
            reasons::POD_NOT_EXISTS,
            "the launcher pod disappeared",
        );
    }
    // Phases only move forward; Running and later come from virt-handler.
    if !next.is_final() && rank(next) < rank(old.phase) {
        next = old.phase;
    }
    if next.is_final() {
        remove_condition(&mut conditions, conditions::POD_SCHEDULED);
    }
    if next != old.phase {
        status.phase = next;
        let mut stamps = old.phase_transition_timestamps.clone().unwrap_or_default();
        stamps.push(PhaseTransitionTimestamp {
            phase: next,
            phase_transition_timestamp: Some(Time(now)),
        });
        status.phase_transition_timestamps = Some(stamps);
    }
    status.conditions = (!conditions.is_empty()).then_some(conditions);
    // The topology the guest boots with (KubeVirt's VMI defaulting sets it at creation):
    // a CPU hotplug later changes the spec first and this once the guest has the vCPUs.
    if status.current_cpu_topology.is_none()
        && !status.phase.is_final()
        && let Some(cpu) = vmi.spec.domain.cpu.as_ref()
    {
        status.current_cpu_topology = Some(kubevirt_api::vmi::CpuTopology {
            cores: Some(cpu.cores.unwrap_or(1)),
            sockets: Some(cpu.sockets.unwrap_or(1)),
            threads: Some(cpu.threads.unwrap_or(1)),
        });
    }
    // KubeVirt's HotVCPUChange: the spec has more vCPUs than the guest (a CPU hotplug the
    // VM controller carried to the VMI) until the target of a migration to a launcher pod
    // of the new size hotplugged them and reported the topology.
    let mut conditions = status.conditions.take().unwrap_or_default();
    if hot_vcpu_change(vmi, &status) {
        if find_condition(&conditions, conditions::HOT_VCPU_CHANGE).is_none() {
            conditions.push(Condition {
                type_: conditions::HOT_VCPU_CHANGE.to_string(),
                status: ConditionStatus::True,
                last_transition_time: Some(Time(now)),
                ..Condition::default()
            });
        }
    } else {
        remove_condition(&mut conditions, conditions::HOT_VCPU_CHANGE);
    }
    status.conditions = (!conditions.is_empty()).then_some(conditions);
    // A pod's node is recorded once it is launched, which is when the VMI turns
    // Scheduled anyway: recording it at binding, a moment earlier, cost every start
    // a status write of its own. Once recorded it stays.
    // Every pod that runs or may run this VMI's guest, as KubeVirt's `activePods`: its own
    // and a migration's target while it is alive. virt-handler finds the launcher it talks
    // to on its node here (the target's once recorded).
    let known = old.active_pods.clone().unwrap_or_default();
    let targets = pods.iter().filter(|p| {
        migration_target(p) && !is_terminal(p) && p.metadata.deletion_timestamp.is_none()
    });
    let candidates: Vec<&Pod> = ours.iter().copied().chain(targets).collect();
    // A pod on its way out is left out where a live one of the VMI is on the same node:
    // virt-handler takes the one pod this map names on its node. A VM migrated back to a
    // node while its old pod there still terminated had two, and the target's handler
    // waited on the old pod's launcher until the migration failed.
    let live_nodes: BTreeSet<&str> = candidates
        .iter()
        .filter(|p| !is_terminal(p) && !is_deleting(p))
        .filter_map(|p| node_of(p))
        .collect();
    let active: BTreeMap<String, String> = candidates
        .into_iter()
        .filter(|p| {
            let leaving = is_terminal(p) || is_deleting(p);
            !(leaving && node_of(p).is_some_and(|n| live_nodes.contains(n)))
        })
        .map(|p| {
            let uid = pod_uid(p);
            let node = match known.get(&uid).filter(|n| !n.is_empty()) {
                Some(n) => n.clone(),
                // A migration's target at binding: its handler prepares the target from
                // then on (the migration controller hands off at binding).
                None if launched(p) || migration_target(p) => {
                    node_of(p).unwrap_or_default().to_string()
                }
                None => String::new(),
            };
            (uid, node)
        })
        .collect();
    status.active_pods = (!active.is_empty()).then_some(active);
    status
}

/// The Event of a VMI this status makes final, as (warning, reason, note): the reason
/// and the Ready message written with it.
pub fn final_event(
    vmi: &VirtualMachineInstance,
    status: &VirtualMachineInstanceStatus,
) -> Option<(bool, &'static str, String)> {
    if phase(vmi).is_final() || !status.phase.is_final() {
        return None;
    }
    let message = status
        .conditions
        .as_deref()
        .and_then(|c| find_condition(c, conditions::READY))
        .and_then(|c| c.message.clone())
        .unwrap_or_default();
    let reason = match status.reason.as_deref() {
        Some(reasons::POD_NOT_EXISTS) => reasons::POD_NOT_EXISTS,
        Some(reasons::EVICTED) => reasons::EVICTED,
        Some(reasons::GUEST_CRASHED) => reasons::GUEST_CRASHED,
        Some(reasons::LAUNCHER_FAILED) => reasons::LAUNCHER_FAILED,
        Some(reasons::POD_COMPLETED) => reasons::POD_COMPLETED,
        _ => reasons::POD_FAILED,
    };
    Some((status.phase == Phase::Failed, reason, message))
}

/// The value of the VMI's `kubevirt.io/nodeName` label the status implies, when it
/// differs from the current one.
pub fn node_label(
    vmi: &VirtualMachineInstance,
    status: &VirtualMachineInstanceStatus,
) -> Option<String> {
    let node = status.node_name.as_ref()?;
    let current = vmi
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(super::render::NODE_NAME_LABEL));
    (current != Some(node)).then(|| node.clone())
}

/// Seconds from the VMI's creation to its entering `phase`, from its phase transition
/// timestamps; KubeVirt's `kubevirt_vmi_phase_transition_time_from_creation_seconds`.
pub fn seconds_since_creation(vmi: &VirtualMachineInstance, phase: Phase) -> Option<f64> {
    let entered = vmi
        .status
        .as_ref()?
        .phase_transition_timestamps
        .iter()
        .flatten()
        .rev()
        .find(|t| t.phase == phase)?
        .phase_transition_timestamp
        .as_ref()?;
    crate::metrics::seconds_between(vmi.metadata.creation_timestamp.as_ref()?, entered)
}

/// Says why a launcher pod is unschedulable when claims it mounts are unbound (`unbound`:
/// their names): Synchronized=False, `WaitingForVolumeBinding`, naming the claims, with the
/// scheduler's words. Claims of a `WaitForFirstConsumer` class are unbound until the pod is
/// placed, so an unbound claim alone says nothing: only together with an unschedulable pod.
/// The condition goes once the pod is placed or every claim is bound.
pub fn volume_binding_condition(
    status: &mut VirtualMachineInstanceStatus,
    namespace: &str,
    unbound: &[&str],
    now: Timestamp,
) {
    let mut conditions = status.conditions.take().unwrap_or_default();
    let unschedulable = find_condition(&conditions, conditions::POD_SCHEDULED)
        .filter(|c| {
            c.status == ConditionStatus::False
                && c.reason.as_deref() == Some(reasons::UNSCHEDULABLE)
        })
        .map(|c| c.message.clone().unwrap_or_default());
    match unschedulable {
        Some(why) if !unbound.is_empty() => {
            let names: Vec<String> = unbound.iter().map(|n| format!("{namespace}/{n}")).collect();
            let message = format!(
                "PVC {} not bound yet; the launcher pod waits: {why}",
                names.join(", ")
            );
            let kept = find_condition(&conditions, conditions::SYNCHRONIZED)
                .filter(|c| c.reason.as_deref() == Some(reasons::WAITING_FOR_VOLUME_BINDING))
                .and_then(|c| c.last_transition_time.clone());
            let mut c = Condition::new(
                conditions::SYNCHRONIZED,
                ConditionStatus::False,
                reasons::WAITING_FOR_VOLUME_BINDING,
                &message,
            );
            c.last_transition_time = kept.or(Some(Time(now)));
            set_condition(&mut conditions, c);
        }
        _ => {
            if find_condition(&conditions, conditions::SYNCHRONIZED)
                .is_some_and(|c| c.reason.as_deref() == Some(reasons::WAITING_FOR_VOLUME_BINDING))
            {
                remove_condition(&mut conditions, conditions::SYNCHRONIZED);
            }
        }
    }
    status.conditions = (!conditions.is_empty()).then_some(conditions);
}

/// KubeVirt's `DataVolumesReady` condition of a VMI with `dataVolume` volumes: True once
/// every one is ready to be used, else False naming those that are not (`not_ready`: each
/// DataVolume with what it waits on). VMIs without DataVolumes (`any` false) get none.
pub fn data_volumes_condition(
    status: &mut VirtualMachineInstanceStatus,
    any: bool,
    not_ready: &[String],
    now: Timestamp,
) {
    let mut conditions = status.conditions.take().unwrap_or_default();
    if any {
        let (st, reason, message) = if not_ready.is_empty() {
            (
                ConditionStatus::True,
                reasons::ALL_DVS_READY,
                "All of the VMI's DVs are bound and ready".to_string(),
            )
        } else {
            (
                ConditionStatus::False,
                reasons::NOT_ALL_DVS_READY,
                format!(
                    "Not all of the VMI's DVs are ready: {}",
                    not_ready.join("; ")
                ),
            )
        };
        let kept = find_condition(&conditions, conditions::DATA_VOLUMES_READY)
            .filter(|c| c.status == st)
            .and_then(|c| c.last_transition_time.clone());
        let mut c = Condition::new(conditions::DATA_VOLUMES_READY, st, reason, &message);
        c.last_transition_time = kept.or(Some(Time(now)));
        set_condition(&mut conditions, c);
    }
    status.conditions = (!conditions.is_empty()).then_some(conditions);
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
