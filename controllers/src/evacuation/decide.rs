//! What the evacuation controller does for one VMI: a pure function of the VMI, the node it
//! is being evacuated from, and its migrations.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kubevirt_api::eviction::{
    self, EVACUATION_DRAIN_ANNOTATION, EVACUATION_MIGRATION_ANNOTATION, EvictionStrategy,
};
use kubevirt_api::{
    VirtualMachineInstance, VirtualMachineInstanceMigration,
    VirtualMachineInstanceMigrationPhase as Phase,
};

/// First wait after a failed evacuation migration; doubled per further failure.
pub const BACKOFF_BASE: Duration = Duration::from_secs(20);
/// Longest wait between evacuation migrations of one VMI.
pub const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// Event reasons.
pub mod reasons {
    /// An evacuation migration was created.
    pub const CREATED: &str = "SuccessfulCreate";
    /// The evacuation ended without the VMI moving: uncordoned node or explicit cancel.
    pub const CANCELLED: &str = "EvacuationCancelled";
    /// The VMI left the evacuated node.
    pub const DONE: &str = "Evacuated";
}

/// The next step for one VMI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing to do.
    Idle,
    /// Look again after this long (back-off after a failed migration).
    Wait(Duration),
    /// Create an evacuation migration off `node`; `drain`: the node is cordoned.
    Migrate { node: String, drain: bool },
    /// Remove `status.evacuationNodeName`, with this Event (reason, message).
    Unmark {
        reason: &'static str,
        message: String,
    },
    /// Delete these unfinished evacuation migrations (the evacuation was cancelled).
    Cancel(Vec<String>),
}

fn phase(m: &VirtualMachineInstanceMigration) -> Phase {
    m.status.as_ref().map(|s| s.phase).unwrap_or_default()
}

fn finished(m: &VirtualMachineInstanceMigration) -> bool {
    phase(m).is_final()
}

fn evacuation_node(m: &VirtualMachineInstanceMigration) -> Option<&str> {
    m.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(EVACUATION_MIGRATION_ANNOTATION))
        .map(String::as_str)
}

fn is_drain(m: &VirtualMachineInstanceMigration) -> bool {
    m.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(EVACUATION_DRAIN_ANNOTATION))
}

/// The guest has not begun to move: cancelling costs nothing.
fn not_moving(m: &VirtualMachineInstanceMigration) -> bool {
    matches!(
        phase(m),
        Phase::Unset
            | Phase::Pending
            | Phase::Scheduling
            | Phase::Scheduled
            | Phase::PreparingTarget
            | Phase::TargetReady
    )
}

/// A node that takes new pods again.
fn schedulable(node: &Node) -> bool {
    !node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// When the last failed evacuation migration off `node` may be followed by another.
fn retry_at(migrations: &[VirtualMachineInstanceMigration], node: &str) -> Option<Timestamp> {
    let failed: Vec<Timestamp> = migrations
        .iter()
        .filter(|m| evacuation_node(m) == Some(node) && phase(m) == Phase::Failed)
        .filter_map(|m| {
            m.status
                .as_ref()
                .and_then(|s| s.phase_transition_timestamps.as_ref())
                .and_then(|t| t.iter().rev().find(|t| t.phase == Phase::Failed))
                .and_then(|t| t.phase_transition_timestamp.as_ref())
                .map(|t| t.0)
                .or_else(|| m.metadata.creation_timestamp.as_ref().map(|t| t.0))
        })
        .collect();
    let last = failed.iter().max()?;
    let n = u32::try_from(failed.len()).unwrap_or(u32::MAX).min(8);
    let wait = BACKOFF_BASE.saturating_mul(1 << (n - 1)).min(BACKOFF_MAX);
    last.checked_add(wait).ok()
}

/// The step for `vmi`, given the node named by its `status.evacuationNodeName` (None when
/// unmarked or the node is gone) and every migration of the VMI.
pub fn decide(
    vmi: &VirtualMachineInstance,
    node: Option<&Node>,
    migrations: &[VirtualMachineInstanceMigration],
    default: EvictionStrategy,
    now: Timestamp,
) -> Step {
    let status = vmi.status.clone().unwrap_or_default();
    let on = status.node_name.as_deref().unwrap_or_default();
    let unfinished_evacuations: Vec<&VirtualMachineInstanceMigration> = migrations
        .iter()
        .filter(|m| !finished(m) && m.metadata.deletion_timestamp.is_none())
        .filter(|m| evacuation_node(m).is_some_and(|n| n == on))
        .collect();
    let Some(marked) = status
        .evacuation_node_name
        .clone()
        .filter(|n| !n.is_empty())
    else {
        // Unmarked (cancelled) while its migration had not finished: stop it.
        let names: Vec<String> = unfinished_evacuations
            .iter()
            .filter_map(|m| m.metadata.name.clone())
            .collect();
        return if names.is_empty() {
            Step::Idle
        } else {
            Step::Cancel(names)
        };
    };
    if vmi.metadata.deletion_timestamp.is_some() || status.phase.is_final() {
        return Step::Idle;
    }
    if !on.is_empty() && on != marked {
        return Step::Unmark {
            reason: reasons::DONE,
            message: format!("The VMI left node {marked} and runs on {on}"),
        };
    }
    if eviction::effective(vmi, default) == EvictionStrategy::External {
        // Another controller acts on the mark.
        return Step::Idle;
    }
    if node.is_some_and(schedulable)
        && !unfinished_evacuations.is_empty()
        && unfinished_evacuations
            .iter()
            .all(|m| is_drain(m) && not_moving(m))
    {
        return Step::Unmark {
            reason: reasons::CANCELLED,
            message: format!(
                "Node {marked} was uncordoned before the VMI began to migrate: the evacuation \
                 is cancelled"
            ),
        };
    }
    let busy = migrations
        .iter()
        .any(|m| !finished(m) && m.metadata.deletion_timestamp.is_none())
        || status
            .migration_state
            .as_ref()
            .is_some_and(|s| !s.is_finished());
    if busy {
        return Step::Idle;
    }
    if let Some(at) = retry_at(migrations, &marked)
        && at > now
    {
        let secs = at.duration_since(now).as_secs_f64().max(1.0);
        return Step::Wait(Duration::from_secs_f64(secs));
    }
    Step::Migrate {
        drain: node.is_some_and(|n| !schedulable(n)),
        node: marked,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::{Value, json};

    fn vmi(node: &str, marked: Option<&str>) -> VirtualMachineInstance {
        serde_json::from_value(json!({
            "metadata": {"name": "a", "namespace": "ns", "uid": "u1"},
            "spec": {"domain": {"devices": {}}},
            "status": {"phase": "Running", "nodeName": node, "evacuationNodeName": marked},
        }))
        .unwrap()
    }

    fn node(unschedulable: bool) -> Node {
        serde_json::from_value(
            json!({"metadata": {"name": "n1"}, "spec": {"unschedulable": unschedulable}}),
        )
        .unwrap()
    }

    fn vmim(
        name: &str,
        phase: &str,
        annotations: Value,
        failed_at: Option<&str>,
    ) -> VirtualMachineInstanceMigration {
        let mut status = json!({"phase": phase});
        if let Some(t) = failed_at {
            status["phaseTransitionTimestamps"] =
                json!([{"phase": "Failed", "phaseTransitionTimestamp": t}]);
        }
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "annotations": annotations},
            "spec": {"vmiName": "a"},
            "status": status,
        }))
        .unwrap()
    }

    fn now() -> Timestamp {
        "2026-12-01T10:00:00Z".parse().unwrap()
    }

    const LM: EvictionStrategy = EvictionStrategy::LiveMigrate;

    #[test]
    fn a_marked_vmi_gets_one_migration_flagged_as_drain_when_cordoned() {
        let step = decide(&vmi("n1", Some("n1")), Some(&node(true)), &[], LM, now());
        assert_eq!(
            step,
            Step::Migrate {
                node: "n1".into(),
                drain: true
            }
        );
        let step = decide(&vmi("n1", Some("n1")), Some(&node(false)), &[], LM, now());
        assert_eq!(
            step,
            Step::Migrate {
                node: "n1".into(),
                drain: false
            }
        );
        let running = vmim(
            "m",
            "Running",
            json!({EVACUATION_MIGRATION_ANNOTATION: "n1"}),
            None,
        );
        assert_eq!(
            decide(
                &vmi("n1", Some("n1")),
                Some(&node(true)),
                &[running],
                LM,
                now()
            ),
            Step::Idle
        );
    }

    #[test]
    fn arriving_elsewhere_removes_the_mark() {
        let step = decide(&vmi("n2", Some("n1")), Some(&node(true)), &[], LM, now());
        assert!(
            matches!(
                step,
                Step::Unmark {
                    reason: reasons::DONE,
                    ..
                }
            ),
            "{step:?}"
        );
    }

    #[test]
    fn uncordoning_cancels_a_drain_migration_that_has_not_started() {
        let pending = vmim(
            "m",
            "Scheduling",
            json!({EVACUATION_MIGRATION_ANNOTATION: "n1", EVACUATION_DRAIN_ANNOTATION: "true"}),
            None,
        );
        let step = decide(
            &vmi("n1", Some("n1")),
            Some(&node(false)),
            std::slice::from_ref(&pending),
            LM,
            now(),
        );
        assert!(
            matches!(
                step,
                Step::Unmark {
                    reason: reasons::CANCELLED,
                    ..
                }
            ),
            "{step:?}"
        );
        // Still cordoned: it goes on.
        assert_eq!(
            decide(
                &vmi("n1", Some("n1")),
                Some(&node(true)),
                std::slice::from_ref(&pending),
                LM,
                now()
            ),
            Step::Idle
        );
        // Unmarked: the migration is deleted.
        assert_eq!(
            decide(&vmi("n1", None), Some(&node(false)), &[pending], LM, now()),
            Step::Cancel(vec!["m".into()])
        );
        // A moving guest finishes its migration.
        let moving = vmim(
            "m",
            "Running",
            json!({EVACUATION_MIGRATION_ANNOTATION: "n1", EVACUATION_DRAIN_ANNOTATION: "true"}),
            None,
        );
        assert_eq!(
            decide(
                &vmi("n1", Some("n1")),
                Some(&node(false)),
                &[moving],
                LM,
                now()
            ),
            Step::Idle
        );
    }

    #[test]
    fn failed_evacuations_back_off_exponentially() {
        let failed = |n: &str, t: &str| {
            vmim(
                n,
                "Failed",
                json!({EVACUATION_MIGRATION_ANNOTATION: "n1"}),
                Some(t),
            )
        };
        let one = [failed("m1", "2026-12-01T09:59:50Z")];
        assert_eq!(
            decide(&vmi("n1", Some("n1")), Some(&node(true)), &one, LM, now()),
            Step::Wait(Duration::from_secs(10))
        );
        let two = [
            failed("m1", "2026-12-01T09:59:00Z"),
            failed("m2", "2026-12-01T09:59:50Z"),
        ];
        assert_eq!(
            decide(&vmi("n1", Some("n1")), Some(&node(true)), &two, LM, now()),
            Step::Wait(Duration::from_secs(30))
        );
        let old = [failed("m1", "2026-12-01T09:00:00Z")];
        assert!(matches!(
            decide(&vmi("n1", Some("n1")), Some(&node(true)), &old, LM, now()),
            Step::Migrate { .. }
        ));
    }

    #[test]
    fn external_and_unmarked_vmis_are_left_alone() {
        let mut v = vmi("n1", Some("n1"));
        v.spec.eviction_strategy = Some(EvictionStrategy::External);
        assert_eq!(decide(&v, Some(&node(true)), &[], LM, now()), Step::Idle);
        assert_eq!(
            decide(&vmi("n1", None), Some(&node(true)), &[], LM, now()),
            Step::Idle
        );
        // A finished evacuation migration of an unmarked VMI is history, not a cancel.
        let done = vmim(
            "m",
            "Succeeded",
            json!({EVACUATION_MIGRATION_ANNOTATION: "n1"}),
            None,
        );
        assert_eq!(
            decide(&vmi("n1", None), None, &[done], LM, now()),
            Step::Idle
        );
    }
}
