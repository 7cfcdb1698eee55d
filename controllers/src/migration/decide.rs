//! What the migration controller should do, as a pure function of a
//! VirtualMachineInstanceMigration, its VMI, the VMI's launcher pods and every other
//! migration.
//!
//! [`decide`] returns the whole [`Decision`]: objects to touch (finalizer, target pod and
//! claims, pods and claims to delete, the target pod to adopt, claims to move the VMI
//! to), the next VMI status and labels, and the
//! next migration status. The clock and the last progress seen are inputs, so the full
//! phase × VMI × pod table is unit-tested without a cluster. The contract with
//! virt-handler is docs/cluster-flow.md §6.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kubevirt_api::common::{Condition, ConditionStatus, find_condition, set_condition};
use kubevirt_api::migration::{
    MigrationAbortStatus, MigrationPhaseTransitionTimestamp, live_migratable, names,
};
use kubevirt_api::quantity;
use kubevirt_api::vmi::VirtualMachineInstancePhase;
use kubevirt_api::{
    VirtualMachineInstance, VirtualMachineInstanceMigration,
    VirtualMachineInstanceMigrationPhase as Phase, VirtualMachineInstanceMigrationState,
    VirtualMachineInstanceMigrationStatus, VirtualMachineInstanceStatus,
};

use super::claims::{self, ClaimMove};
use crate::vmi::decide::PodRef;

/// Limits and timeouts; KubeVirt's defaults (`pkg/virt-config`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigrationConfig {
    /// Migrations past Pending in the whole cluster.
    pub parallel_migrations_per_cluster: usize,
    /// Migrations past Pending leaving one node.
    pub parallel_outbound_migrations_per_node: usize,
    /// A transfer whose progress figures do not move for this long is aborted.
    pub progress_timeout: Duration,
    /// A transfer may last this long per GiB of guest memory (at least one GiB's worth).
    pub completion_timeout_per_gib: Duration,
    /// A target pod may stay unschedulable this long (annotation
    /// `kubevirt.io/migrationUnschedulablePodTimeoutSeconds` overrides).
    pub unschedulable_pod_timeout: Duration,
    /// A target pod may stay pending for any reason this long (annotation
    /// `kubevirt.io/migrationPendingPodTimeoutSeconds` overrides).
    pub pending_pod_timeout: Duration,
    /// How often a Pending migration looks for capacity again, and how often a running
    /// one checks its timeouts.
    pub poll: Duration,
}

impl Default for MigrationConfig {
    fn default() -> Self {
        Self {
            parallel_migrations_per_cluster: 5,
            parallel_outbound_migrations_per_node: 2,
            progress_timeout: Duration::from_secs(150),
            completion_timeout_per_gib: Duration::from_secs(150),
            unschedulable_pod_timeout: Duration::from_secs(5 * 60),
            pending_pod_timeout: Duration::from_secs(15 * 60),
            poll: Duration::from_secs(5),
        }
    }
}

/// The progress figures of a transfer and since when they have not changed; kept in
/// memory by the reconciler (a restart only restarts the progress clock).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgressMark {
    /// dataProcessedBytes.
    pub processed: Option<i64>,
    /// dataRemainingBytes.
    pub remaining: Option<i64>,
    /// iteration.
    pub iteration: Option<i64>,
    /// When these figures were first seen.
    pub since: Timestamp,
}

/// Everything the decision depends on.
#[derive(Clone, Debug)]
pub struct Observed<'a> {
    /// The migration.
    pub vmim: &'a VirtualMachineInstanceMigration,
    /// Its VMI, when it exists.
    pub vmi: Option<&'a VirtualMachineInstance>,
    /// The VMI's launcher pods (source and targets, any state).
    pub pods: &'a [Pod],
    /// The claims this migration made for the target (labelled with its uid).
    pub claims: &'a [PersistentVolumeClaim],
    /// Every migration in the cluster (this one is skipped by uid).
    pub migrations: &'a [VirtualMachineInstanceMigration],
    /// The last progress mark of this migration.
    pub progress: Option<&'a ProgressMark>,
    /// The clock.
    pub now: Timestamp,
}

/// An Event to publish: (warning, reason, note).
pub type EventNote = (bool, &'static str, String);

/// What to do.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Decision {
    /// Add the finalizer `kubevirt.io/migrationJobFinalize`.
    pub add_finalizer: bool,
    /// Remove it: nothing is left to clean up.
    pub remove_finalizer: bool,
    /// Create the target launcher pod (the status below assumes it was created).
    pub create_target_pod: bool,
    /// Before the pod: make these claims for the target, copies of the moves' sources.
    pub create_claims: Vec<ClaimMove>,
    /// Delete these claims this migration made (it failed).
    pub delete_claims: Vec<String>,
    /// The guest runs on the target: point the VMI and its VM at these moves' new claims,
    /// hand the new claims over and let the old ones go (per the VMI's policy).
    pub claim_moves: Vec<ClaimMove>,
    /// Hand the target pod over to the VMI (controller ownerReference).
    pub adopt_target_pod: Option<PodRef>,
    /// Delete these pods (a failed target pod, or the source pod after success).
    pub delete_pods: Vec<PodRef>,
    /// The next VMI status, when it changes.
    pub vmi_status: Option<VirtualMachineInstanceStatus>,
    /// VMI labels to set (Some) or remove (None).
    pub vmi_labels: BTreeMap<String, Option<String>>,
    /// The next migration status.
    pub status: VirtualMachineInstanceMigrationStatus,
    /// The progress mark to keep (None forgets it).
    pub progress: Option<ProgressMark>,
    /// Events to publish on the migration.
    pub events: Vec<EventNote>,
    /// Look again after this long even without a watch event.
    pub requeue: Option<Duration>,
}

/// Event reasons.
pub mod reasons {
    /// The target pod was created.
    pub const SUCCESSFUL_CREATE: &str = "SuccessfulCreate";
    /// The migration failed or was refused.
    pub const FAILED_MIGRATION: &str = "FailedMigration";
    /// The guest runs on the target.
    pub const SUCCESSFUL_MIGRATION: &str = "SuccessfulMigration";
    /// The controller asked virt-handler to abort.
    pub const ABORT_REQUESTED: &str = "MigrationAbortRequested";
    /// No capacity: the migration waits.
    pub const PENDING: &str = "MigrationPending";
    /// Abort reason: the migration object was deleted.
    pub const DELETED: &str = "MigrationDeleted";
    /// Abort reason: no progress for progressTimeout.
    pub const PROGRESS_TIMEOUT: &str = "ProgressTimeout";
    /// Abort reason: completionTimeoutPerGiB exceeded.
    pub const COMPLETION_TIMEOUT: &str = "CompletionTimeout";
}

/// Seconds from the migration's creation to when it entered `phase` (its last entry in
/// `phaseTransitionTimestamps`): what KubeVirt's migration phase histogram observes.
pub fn seconds_since_creation(m: &VirtualMachineInstanceMigration, phase: Phase) -> Option<f64> {
    let entered = m
        .status
        .as_ref()?
        .phase_transition_timestamps
        .iter()
        .flatten()
        .rev()
        .find(|t| t.phase == phase)?
        .phase_transition_timestamp
        .as_ref()?;
    crate::metrics::seconds_between(m.metadata.creation_timestamp.as_ref()?, entered)
}

fn rank(p: Phase) -> u8 {
    match p {
        Phase::Unset => 0,
        Phase::Pending => 1,
        Phase::Scheduling => 2,
        Phase::Scheduled => 3,
        Phase::PreparingTarget => 4,
        Phase::TargetReady => 5,
        Phase::Running => 6,
        Phase::Succeeded | Phase::Failed => 7,
    }
}

/// Past Pending and not final: the migration holds a slot.
pub fn holds_slot(p: Phase) -> bool {
    (2..=6).contains(&rank(p))
}

fn phase_of(m: &VirtualMachineInstanceMigration) -> Phase {
    m.status.as_ref().map(|s| s.phase).unwrap_or_default()
}

fn has_finalizer(m: &VirtualMachineInstanceMigration) -> bool {
    m.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == names::MIGRATION_FINALIZER)
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

fn pod_ref(p: &Pod) -> PodRef {
    PodRef {
        name: p.metadata.name.clone().unwrap_or_default(),
        uid: p.metadata.uid.clone().unwrap_or_default(),
    }
}

fn created(p: &Pod) -> Option<Timestamp> {
    p.metadata.creation_timestamp.as_ref().map(|t| t.0)
}

fn label<'a>(p: &'a Pod, key: &str) -> Option<&'a str> {
    p.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// Target pods of the migration with this uid, newest first.
pub fn target_pods<'a>(uid: &str, pods: &'a [Pod]) -> Vec<&'a Pod> {
    let mut v: Vec<&Pod> = pods
        .iter()
        .filter(|p| label(p, names::MIGRATION_JOB_LABEL) == Some(uid))
        .collect();
    v.sort_by_key(|p| std::cmp::Reverse(created(p)));
    v
}

fn controlled_by(p: &Pod, uid: &str) -> bool {
    p.metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == uid)
}

/// The pod the guest runs in now: controlled by the VMI, live, on its node.
fn source_pod<'a>(vmi: &VirtualMachineInstance, pods: &'a [Pod]) -> Option<&'a Pod> {
    let uid = vmi.metadata.uid.as_deref()?;
    let node = vmi.status.as_ref()?.node_name.as_deref()?;
    pods.iter()
        .filter(|p| controlled_by(p, uid) && !is_terminal(p) && !is_deleting(p))
        .filter(|p| node_of(p) == Some(node))
        .max_by_key(|p| created(p))
}

/// The PodScheduled=False/Unschedulable condition of a pod: since when, and why.
fn unschedulable(p: &Pod) -> Option<(Option<Timestamp>, String)> {
    let c = p
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "PodScheduled")?;
    (c.status == "False" && c.reason.as_deref() == Some("Unschedulable")).then(|| {
        (
            c.last_transition_time.as_ref().map(|t| t.0),
            c.message.clone().unwrap_or_default(),
        )
    })
}

fn annotation_seconds(m: &VirtualMachineInstanceMigration, key: &str) -> Option<Duration> {
    m.metadata
        .annotations
        .as_ref()?
        .get(key)?
        .parse::<u64>()
        .ok()
        .map(Duration::from_secs)
}

fn elapsed(now: Timestamp, since: Timestamp) -> Duration {
    Duration::try_from(now.duration_since(since)).unwrap_or_default()
}

/// Guest memory in bytes: memory.guest, else requests.memory, else limits.memory.
pub fn guest_memory_bytes(vmi: &VirtualMachineInstance) -> Option<u64> {
    let d = &vmi.spec.domain;
    let res = d.resources.as_ref();
    let q = d
        .memory
        .as_ref()
        .and_then(|m| m.guest.clone())
        .or_else(|| res.and_then(|r| r.requests.as_ref()?.get("memory").cloned()))
        .or_else(|| res.and_then(|r| r.limits.as_ref()?.get("memory").cloned()))?;
    quantity::parse_bytes(&q.0).ok()
}

/// completionTimeoutPerGiB × guest GiB, rounded up, at least one GiB's worth: a small
/// guest must not get a timeout shorter than one GiB's, which a TCG guest needs.
pub fn completion_timeout(vmi: &VirtualMachineInstance, per_gib: Duration) -> Duration {
    const GIB: u64 = 1 << 30;
    let gib = guest_memory_bytes(vmi).unwrap_or(GIB).div_ceil(GIB).max(1);
    per_gib.saturating_mul(u32::try_from(gib).unwrap_or(u32::MAX))
}

/// Why a migration cannot start now, as its failure reason; None when it may.
fn refusal(o: &Observed<'_>, vmi: &VirtualMachineInstance) -> Option<String> {
    let uid = o.vmim.metadata.uid.as_deref().unwrap_or_default();
    let status = vmi.status.clone().unwrap_or_default();
    if status.phase != VirtualMachineInstancePhase::Running {
        return Some(format!(
            "VMI {} is not running (phase {:?})",
            vmi.metadata.name.as_deref().unwrap_or_default(),
            status.phase.as_str()
        ));
    }
    if let Err(why) = kubevirt_api::migration::migratable(vmi) {
        return Some(why);
    }
    if let Some(s) = status
        .migration_state
        .as_ref()
        .filter(|s| !s.is_for(uid) && !s.is_finished())
    {
        return Some(format!(
            "VMI is already migrating (migration {})",
            s.migration_uid.as_deref().unwrap_or("unknown")
        ));
    }
    // Of two migrations of one VMI, the older one goes; KubeVirt refuses the second at
    // admission, which our apiserver does not do for direct creations.
    let key = |m: &VirtualMachineInstanceMigration| {
        (
            m.metadata.creation_timestamp.as_ref().map(|t| t.0),
            m.metadata.name.clone(),
        )
    };
    let ns = o.vmim.metadata.namespace.as_deref();
    let older = o.migrations.iter().find(|m| {
        m.metadata.uid.as_deref() != Some(uid)
            && m.metadata.namespace.as_deref() == ns
            && m.spec.vmi_name == o.vmim.spec.vmi_name
            && m.metadata.deletion_timestamp.is_none()
            && !phase_of(m).is_final()
            && (holds_slot(phase_of(m)) || key(m) < key(o.vmim))
    });
    older.map(|m| {
        format!(
            "another migration of this VMI is in progress: {}",
            m.metadata.name.as_deref().unwrap_or_default()
        )
    })
}

/// Whether a cluster slot and an outbound slot of `source_node` are free.
fn capacity(o: &Observed<'_>, source_node: &str, cfg: &MigrationConfig) -> Result<(), String> {
    let uid = o.vmim.metadata.uid.as_deref();
    let active: Vec<&VirtualMachineInstanceMigration> = o
        .migrations
        .iter()
        .filter(|m| m.metadata.uid.as_deref() != uid && holds_slot(phase_of(m)))
        .collect();
    if active.len() >= cfg.parallel_migrations_per_cluster {
        return Err(format!(
            "{} migrations are running in the cluster (parallelMigrationsPerCluster {})",
            active.len(),
            cfg.parallel_migrations_per_cluster
        ));
    }
    let outbound = active
        .iter()
        .filter(|m| {
            m.status
                .as_ref()
                .and_then(|s| s.migration_state.as_ref())
                .and_then(|s| s.source_node.as_deref())
                == Some(source_node)
        })
        .count();
    if outbound >= cfg.parallel_outbound_migrations_per_node {
        return Err(format!(
            "{outbound} migrations are leaving node {source_node} \
             (parallelOutboundMigrationsPerNode {})",
            cfg.parallel_outbound_migrations_per_node
        ));
    }
    Ok(())
}

/// Builds the decision step by step.
struct Step<'a> {
    o: &'a Observed<'a>,
    uid: String,
    d: Decision,
    vmi_status: Option<VirtualMachineInstanceStatus>,
}

impl Step<'_> {
    fn enter(&mut self, phase: Phase) {
        if self.d.status.phase == phase {
            return;
        }
        self.d.status.phase = phase;
        self.d
            .status
            .phase_transition_timestamps
            .get_or_insert_with(Vec::new)
            .push(MigrationPhaseTransitionTimestamp {
                phase,
                phase_transition_timestamp: Some(Time(self.o.now)),
            });
    }

    /// The VMI's migrationState when it belongs to this migration.
    fn vmi_state(&self) -> Option<&VirtualMachineInstanceMigrationState> {
        self.vmi_status
            .as_ref()?
            .migration_state
            .as_ref()
            .filter(|s| s.is_for(&self.uid))
    }

    fn vmi_state_mut(&mut self) -> Option<&mut VirtualMachineInstanceMigrationState> {
        let uid = self.uid.clone();
        self.vmi_status
            .as_mut()?
            .migration_state
            .as_mut()
            .filter(|s| s.is_for(&uid))
    }

    fn mirror(&mut self) {
        if let Some(s) = self.vmi_state().cloned() {
            self.d.status.migration_state = Some(s);
        }
    }

    fn delete_targets(&mut self) {
        for p in target_pods(&self.uid, self.o.pods) {
            // An adopted pod is the VMI's now: never delete it from here.
            if !is_deleting(p) && controlled_by(p, &self.uid) {
                self.d.delete_pods.push(pod_ref(p));
            }
        }
        // Only claims still labelled as this migration's: a handed-over one is the VM's.
        self.d.delete_claims = self
            .o
            .claims
            .iter()
            .filter(|c| claims::made_by(c, &self.uid) && c.metadata.deletion_timestamp.is_none())
            .filter_map(|c| c.metadata.name.clone())
            .collect();
    }

    fn clear_target_label(&mut self) {
        let has = self
            .o
            .vmi
            .and_then(|v| v.metadata.labels.as_ref())
            .is_some_and(|l| l.contains_key(names::MIGRATION_TARGET_NODE_NAME_LABEL));
        if has {
            self.d
                .vmi_labels
                .insert(names::MIGRATION_TARGET_NODE_NAME_LABEL.into(), None);
        }
    }

    /// Fails the migration: the guest stays where it is. A transfer in flight is
    /// aborted by the source handler, which reports the end; before the transfer the
    /// controller ends the VMI's migrationState itself.
    fn fail(&mut self, message: String, cancelled: bool) {
        let now = Time(self.o.now);
        if self.vmi_state().is_some()
            && let Some(st) = self.vmi_status.as_mut()
        {
            // The guest stays on its claims: the record of this migration's copies goes.
            st.migrated_volumes = None;
        }
        if let Some(s) = self.vmi_state_mut() {
            if s.is_finished() {
                // virt-handler reported the end: its account stands.
            } else if s.is_transferring() {
                s.abort_requested = Some(true);
            } else {
                s.failed = Some(true);
                s.end_timestamp = Some(now);
                s.failure_reason = Some(message.clone());
                if cancelled {
                    s.abort_requested = Some(true);
                    s.abort_status = Some(MigrationAbortStatus::Succeeded);
                }
            }
        }
        self.mirror();
        let st = self.d.status.migration_state.get_or_insert_with(|| {
            VirtualMachineInstanceMigrationState {
                migration_uid: Some(self.uid.clone()),
                ..Default::default()
            }
        });
        st.failed = Some(true);
        st.failure_reason = Some(message.clone());
        if cancelled {
            st.abort_requested = Some(true);
        }
        self.delete_targets();
        self.clear_target_label();
        self.d.progress = None;
        self.enter(Phase::Failed);
        self.d
            .events
            .push((true, reasons::FAILED_MIGRATION, message));
    }

    /// Asks the source handler to abort the transfer, once.
    fn request_abort(&mut self, reason: &'static str, message: String) {
        let already = self
            .vmi_state()
            .is_some_and(|s| s.abort_requested == Some(true));
        if let Some(s) = self.vmi_state_mut() {
            s.abort_requested = Some(true);
        }
        let conds = self.d.status.conditions.get_or_insert_with(Vec::new);
        if find_condition(conds, names::CONDITION_ABORT_REQUESTED).is_none() {
            let mut c = Condition::new(
                names::CONDITION_ABORT_REQUESTED,
                ConditionStatus::True,
                reason,
                &message,
            );
            c.last_transition_time = Some(Time(self.o.now));
            set_condition(conds, c);
        }
        if !already {
            self.d
                .events
                .push((true, reasons::ABORT_REQUESTED, message));
        }
    }

    /// Why the abort was requested, for the failure reason of the aborted migration.
    fn abort_message(&self) -> Option<String> {
        self.d
            .status
            .conditions
            .as_deref()
            .and_then(|c| find_condition(c, names::CONDITION_ABORT_REQUESTED))
            .and_then(|c| c.message.clone())
    }

    /// The guest runs on the target: move the VMI there, adopt the target pod, delete
    /// the source pod.
    fn succeed(&mut self, target: Option<&Pod>) {
        let vmi = self.o.vmi;
        let target_node = self.vmi_state().and_then(|s| s.target_node.clone());
        if let (Some(status), Some(node)) = (self.vmi_status.as_mut(), target_node.clone()) {
            // Leaving the node it was being evacuated from ends the evacuation, in the same
            // write as the move: nobody can see the VMI moved but still marked and evacuate
            // it again (KubeVirt clears it on arrival too).
            if status.evacuation_node_name.is_some()
                && status.evacuation_node_name != Some(node.clone())
            {
                status.evacuation_node_name = None;
            }
            status.node_name = Some(node);
        }
        if let Some(node) = target_node {
            let current = vmi
                .and_then(|v| v.metadata.labels.as_ref())
                .and_then(|l| l.get(crate::vmi::render::NODE_NAME_LABEL));
            if current != Some(&node) {
                self.d
                    .vmi_labels
                    .insert(crate::vmi::render::NODE_NAME_LABEL.into(), Some(node));
            }
        }
        self.clear_target_label();
        if let Some(t) = target.filter(|t| controlled_by(t, &self.uid)) {
            self.d.adopt_target_pod = Some(pod_ref(t));
        }
        // Copied claims: the volumes now live on the new claims, as volumeStatus says.
        if let Some(v) = vmi {
            self.d.claim_moves = claims::recorded_moves(v);
        }
        if let Some(st) = self.vmi_status.as_mut() {
            let record = st.migrated_volumes.clone().unwrap_or_default();
            for s in st.volume_status.iter_mut().flatten() {
                if let Some(dest) = record
                    .iter()
                    .find(|m| m.volume_name == s.name)
                    .and_then(|m| m.destination_pvc_info.clone())
                {
                    s.persistent_volume_claim_info = Some(dest);
                }
            }
        }
        let target_uid = target.and_then(|t| t.metadata.uid.clone());
        if let Some(vmi_uid) = vmi.and_then(|v| v.metadata.uid.as_deref()) {
            for p in self.o.pods {
                let is_target = p.metadata.uid.is_some() && p.metadata.uid == target_uid;
                if !is_target
                    && controlled_by(p, vmi_uid)
                    && !is_deleting(p)
                    && label(p, names::MIGRATION_JOB_LABEL) != Some(&self.uid)
                {
                    self.d.delete_pods.push(pod_ref(p));
                }
            }
        }
        self.mirror();
        self.d.progress = None;
        self.enter(Phase::Succeeded);
        let node = self
            .vmi_state()
            .and_then(|s| s.target_node.clone())
            .unwrap_or_default();
        self.d.events.push((
            false,
            reasons::SUCCESSFUL_MIGRATION,
            format!("The VMI runs on node {node}"),
        ));
    }
}

/// Decides what to do for one migration.
pub fn decide(o: &Observed<'_>, cfg: &MigrationConfig) -> Decision {
    let uid = o.vmim.metadata.uid.clone().unwrap_or_default();
    let mut step = Step {
        o,
        uid: uid.clone(),
        d: Decision {
            status: o.vmim.status.clone().unwrap_or_default(),
            progress: o.progress.cloned(),
            ..Decision::default()
        },
        vmi_status: o.vmi.map(|v| v.status.clone().unwrap_or_default()),
    };
    decide_phase(&mut step, cfg);
    let Step {
        mut d, vmi_status, ..
    } = step;
    let old_vmi = o.vmi.map(|v| v.status.clone().unwrap_or_default());
    if vmi_status != old_vmi {
        d.vmi_status = vmi_status;
    }
    let deleting = o.vmim.metadata.deletion_timestamp.is_some();
    if deleting && (d.status.phase.is_final() || d.status.phase == Phase::Unset) {
        d.add_finalizer = false;
        d.remove_finalizer = has_finalizer(o.vmim);
    }
    if d.remove_finalizer || d.status.phase.is_final() {
        d.requeue = None;
    }
    d
}

fn decide_phase(step: &mut Step<'_>, cfg: &MigrationConfig) {
    let o = step.o;
    let phase = step.d.status.phase;
    let deleting = o.vmim.metadata.deletion_timestamp.is_some();
    let uid = step.uid.clone();

    if phase.is_final() {
        // A failed migration keeps no target pod; a deleted one keeps nothing.
        if phase == Phase::Failed {
            step.delete_targets();
        }
        return;
    }

    let Some(vmi) = o.vmi else {
        if deleting && phase == Phase::Unset {
            return;
        }
        step.fail(
            format!("VMI {} does not exist", o.vmim.spec.vmi_name),
            deleting,
        );
        return;
    };
    let vmi_phase = vmi.status.as_ref().map(|s| s.phase).unwrap_or_default();
    if vmi.metadata.deletion_timestamp.is_some() || vmi_phase.is_final() {
        step.fail(
            format!(
                "VMI {} is shutting down or has stopped",
                o.vmim.spec.vmi_name
            ),
            deleting,
        );
        return;
    }

    if rank(phase) <= rank(Phase::Pending) {
        if deleting {
            // Never started: nothing to clean up.
            if phase == Phase::Pending {
                step.enter(Phase::Failed);
                step.d.status.migration_state = Some(VirtualMachineInstanceMigrationState {
                    migration_uid: Some(uid),
                    failed: Some(true),
                    abort_requested: Some(true),
                    failure_reason: Some("the migration was deleted before it started".into()),
                    ..Default::default()
                });
            }
            return;
        }
        if let Some(why) = refusal(o, vmi) {
            step.fail(why, false);
            return;
        }
        step.d.add_finalizer = !has_finalizer(o.vmim);
        step.enter(Phase::Pending);
        let source = source_pod(vmi, o.pods);
        let source_node = vmi
            .status
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        let Some(source) = source else {
            step.fail(
                format!("VMI has no running launcher pod on its node {source_node:?}"),
                false,
            );
            return;
        };
        if let Err(why) = capacity(o, &source_node, cfg) {
            if phase == Phase::Unset {
                step.d.events.push((false, reasons::PENDING, why));
            }
            step.d.requeue = Some(cfg.poll);
            return;
        }
        step.d.create_target_pod = true;
        step.d.create_claims = claims::planned_moves(vmi, &uid);
        step.d.status.migration_state = Some(VirtualMachineInstanceMigrationState {
            migration_uid: Some(uid),
            source_node: Some(source_node),
            source_pod: source.metadata.name.clone(),
            ..Default::default()
        });
        step.enter(Phase::Scheduling);
        step.d.requeue = Some(cfg.poll);
        return;
    }

    // Scheduling and later: the target pod must be there and alive until the end.
    let targets = target_pods(&uid, o.pods);
    let target = targets.first().copied();
    let transferring = step.vmi_state().is_some_and(|s| s.is_transferring());
    let state = step.vmi_state().cloned();

    // What virt-handler reported decides first: a finished transfer is a fact.
    if let Some(s) = &state {
        if s.completed == Some(true) && s.failed != Some(true) {
            step.succeed(target);
            if deleting {
                step.d.remove_finalizer = has_finalizer(o.vmim);
            }
            return;
        }
        if s.failed == Some(true) || s.abort_status == Some(MigrationAbortStatus::Succeeded) {
            let reason = step
                .abort_message()
                .filter(|_| s.abort_status == Some(MigrationAbortStatus::Succeeded))
                .or_else(|| s.failure_reason.clone())
                .unwrap_or_else(|| "the migration failed".into());
            step.fail(reason, deleting);
            return;
        }
    }

    // An abort virt-handler does not confirm within progressTimeout is forced: the
    // target pod goes, which makes the transfer fail on the source, so a cancel or a
    // timeout always ends.
    let abort_since = step
        .d
        .status
        .conditions
        .as_deref()
        .and_then(|c| find_condition(c, names::CONDITION_ABORT_REQUESTED))
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0);
    if let Some(since) = abort_since.filter(|_| transferring) {
        let waited = elapsed(o.now, since);
        if waited >= cfg.progress_timeout {
            let why = step.abort_message().unwrap_or_default();
            step.fail(
                format!(
                    "{why}; the abort was not confirmed within {}s, the target pod is deleted",
                    waited.as_secs()
                ),
                deleting,
            );
            return;
        }
    }

    if deleting {
        if transferring {
            step.request_abort(reasons::DELETED, "the migration object was deleted".into());
            step.mirror();
            step.d.requeue = Some(cfg.poll);
        } else {
            step.fail(
                "Migration aborted: the migration object was deleted".into(),
                true,
            );
        }
        return;
    }

    let Some(target) = target else {
        step.fail("the target pod disappeared".into(), false);
        return;
    };
    if is_terminal(target) || is_deleting(target) {
        let why = target
            .status
            .as_ref()
            .and_then(|s| s.message.clone().or_else(|| s.reason.clone()))
            .unwrap_or_else(|| format!("phase {}", pod_phase(target)));
        step.fail(
            format!(
                "target pod {} ended: {why}",
                target.metadata.name.as_deref().unwrap_or_default()
            ),
            false,
        );
        return;
    }

    if phase == Phase::Scheduling {
        let target_node = node_of(target);
        // Hand-off as soon as the target pod is bound, not once the kubelet reports its
        // launcher running: that report comes a relist or two after the launcher runs
        // (1–2 s with the pod's containers started one by one), while the target handler
        // already serves the bound pod (its network) and waits for the launcher's socket
        // itself (and fails the migration if it never comes). A target that ends first
        // is caught above.
        if let Some(node) = target_node {
            // Hand-off: the VMI now names both ends; the target handler prepares.
            let moves = claims::planned_moves(vmi, &uid);
            let migrated = match claims::migrated_volumes(vmi, &moves, o.claims) {
                Ok(m) => (!m.is_empty()).then_some(m),
                Err(why) => {
                    step.fail(why, false);
                    return;
                }
            };
            let source_node = vmi.status.as_ref().and_then(|s| s.node_name.clone());
            let state = VirtualMachineInstanceMigrationState {
                migration_uid: Some(uid.clone()),
                source_node,
                source_pod: step
                    .d
                    .status
                    .migration_state
                    .as_ref()
                    .and_then(|s| s.source_pod.clone()),
                target_node: Some(node.to_string()),
                target_pod: target.metadata.name.clone(),
                ..Default::default()
            };
            // A hand-off written before a failed status write is kept as it is: the
            // target handler may already have added to it.
            if let Some(st) = step
                .vmi_status
                .as_mut()
                .filter(|s| !s.migration_state.as_ref().is_some_and(|m| m.is_for(&uid)))
            {
                st.migration_state = Some(state);
                st.migration_method = live_migratable(vmi).ok().map(|m| m.as_str().to_string());
                // Which claims the source copies, and where to: read by the source handler
                // and, on success, by the move to the new claims.
                st.migrated_volumes = migrated;
            }
            step.d.vmi_labels.insert(
                names::MIGRATION_TARGET_NODE_NAME_LABEL.into(),
                Some(node.to_string()),
            );
            step.mirror();
            step.enter(Phase::Scheduled);
            step.d.requeue = Some(cfg.poll);
            return;
        }
        let since = created(target).unwrap_or(o.now);
        let unsched_limit = annotation_seconds(o.vmim, names::UNSCHEDULABLE_POD_TIMEOUT_ANNOTATION)
            .unwrap_or(cfg.unschedulable_pod_timeout);
        let pending_limit = annotation_seconds(o.vmim, names::PENDING_POD_TIMEOUT_ANNOTATION)
            .unwrap_or(cfg.pending_pod_timeout);
        if let Some((when, message)) = unschedulable(target).filter(|_| target_node.is_none()) {
            let waited = elapsed(o.now, when.unwrap_or(since));
            if waited >= unsched_limit {
                step.fail(
                    format!(
                        "target pod {} unschedulable for {}s: {message}",
                        target.metadata.name.as_deref().unwrap_or_default(),
                        waited.as_secs()
                    ),
                    false,
                );
                return;
            }
            step.d.requeue = Some((unsched_limit - waited).min(cfg.poll));
            return;
        }
        let waited = elapsed(o.now, since);
        if waited >= pending_limit {
            step.fail(
                format!(
                    "target pod {} did not start within {}s",
                    target.metadata.name.as_deref().unwrap_or_default(),
                    pending_limit.as_secs()
                ),
                false,
            );
            return;
        }
        step.d.requeue = Some((pending_limit - waited).min(cfg.poll));
        return;
    }

    // Scheduled and later: the VMI carries this migration's state.
    let Some(s) = state else {
        step.fail(
            "the VMI's migrationState no longer names this migration".into(),
            false,
        );
        return;
    };
    let next = if s.start_timestamp.is_some() {
        Phase::Running
    } else if s.target_node_address.is_some() {
        Phase::TargetReady
    } else {
        Phase::PreparingTarget
    };
    if rank(next) > rank(phase) {
        step.enter(next);
    }
    // Handlers that never start the transfer must not hold a slot and a target pod
    // forever: the same limit as a target pod that never starts.
    if s.start_timestamp.is_none() {
        let handed_off = step
            .d
            .status
            .phase_transition_timestamps
            .iter()
            .flatten()
            .find(|t| t.phase == Phase::Scheduled)
            .and_then(|t| t.phase_transition_timestamp.as_ref())
            .map(|t| t.0);
        let limit = annotation_seconds(o.vmim, names::PENDING_POD_TIMEOUT_ANNOTATION)
            .unwrap_or(cfg.pending_pod_timeout);
        if let Some(since) = handed_off.filter(|t| elapsed(o.now, *t) >= limit) {
            step.fail(
                format!(
                    "the transfer did not start within {}s of the hand-off (phase {})",
                    elapsed(o.now, since).as_secs(),
                    step.d.status.phase.as_str()
                ),
                false,
            );
            return;
        }
    }
    if let Some(start) = s
        .start_timestamp
        .as_ref()
        .map(|t| t.0)
        .filter(|_| transferring)
    {
        check_timeouts(step, cfg, vmi, &s, start);
    }
    step.mirror();
    step.d.requeue = Some(cfg.poll);
}

/// progressTimeout and completionTimeoutPerGiB of a running transfer.
fn check_timeouts(
    step: &mut Step<'_>,
    cfg: &MigrationConfig,
    vmi: &VirtualMachineInstance,
    s: &VirtualMachineInstanceMigrationState,
    start: Timestamp,
) {
    let now = step.o.now;
    let figures = (s.data_processed_bytes, s.data_remaining_bytes, s.iteration);
    let mark = match step.o.progress {
        Some(m) if (m.processed, m.remaining, m.iteration) == figures => m.clone(),
        // New figures (or none seen yet): the clock starts now, or at the start of
        // the transfer when nothing was ever reported.
        _ => ProgressMark {
            processed: figures.0,
            remaining: figures.1,
            iteration: figures.2,
            since: if step.o.progress.is_none() && figures == (None, None, None) {
                start
            } else {
                now
            },
        },
    };
    let stalled = elapsed(now, mark.since);
    step.d.progress = Some(mark);
    if s.abort_requested == Some(true) {
        return;
    }
    let limit = completion_timeout(vmi, cfg.completion_timeout_per_gib);
    let running = elapsed(now, start);
    if stalled >= cfg.progress_timeout {
        step.request_abort(
            reasons::PROGRESS_TIMEOUT,
            format!(
                "Live migration stuck for {} sec and has been aborted",
                stalled.as_secs()
            ),
        );
    } else if running >= limit {
        step.request_abort(
            reasons::COMPLETION_TIMEOUT,
            format!(
                "Live migration is not completed after {} sec and has been aborted",
                running.as_secs()
            ),
        );
    }
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
