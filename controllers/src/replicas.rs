//! What the replica set and pool controllers share (pure): who controls an object, the
//! status conditions both report, and the owner reference both set.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use k8s_openapi::jiff::Timestamp;
use kubevirt_api::common::{Condition, ConditionStatus, set_condition};
use kubevirt_api::replicas::{REPLICA_FAILURE, REPLICA_PAUSED};

/// The uid of the object's controller (the owner reference with `controller: true`).
pub fn controller_uid(meta: &ObjectMeta) -> Option<&str> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| o.uid.as_str())
}

/// Whether the object is being deleted.
pub fn deleting(meta: &ObjectMeta) -> bool {
    meta.deletion_timestamp.is_some()
}

/// The controller reference to a parent: blockOwnerDeletion, so a foreground delete of the
/// parent waits for its children (the garbage collector deletes them with it).
pub fn controller_ref(api_version: &str, kind: &str, name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: name.into(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// A merge patch of `/status` that turns `old` into `new` (fields `new` lacks are nulled).
/// Not guarded by a resourceVersion: the status is derived afresh from the children at
/// each reconcile, so the last writer is right.
pub fn status_patch<S: serde::Serialize>(
    old: Option<&S>,
    new: &S,
) -> Result<serde_json::Value, serde_json::Error> {
    let mut status = serde_json::to_value(new)?;
    if let (Some(serde_json::Value::Object(old)), serde_json::Value::Object(new)) =
        (old.map(serde_json::to_value).transpose()?, &mut status)
    {
        for k in old.keys() {
            if !new.contains_key(k) {
                new.insert(k.clone(), serde_json::Value::Null);
            }
        }
    }
    Ok(serde_json::json!({ "status": status }))
}

/// A failure creating or deleting a child, for the `ReplicaFailure` condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// `FailedCreate` or `FailedDelete`, KubeVirt's reasons.
    pub reason: String,
    /// The error.
    pub message: String,
}

/// The conditions after a reconcile, KubeVirt's: `ReplicaPaused` while paused, and
/// `ReplicaFailure` while creating or deleting fails (both removed when they no longer
/// hold); other conditions kept. Transition times are kept when a status does not change.
pub fn conditions(
    old: &[Condition],
    paused: bool,
    failure: Option<&Failure>,
    now: Timestamp,
) -> Vec<Condition> {
    let mut out: Vec<Condition> = old
        .iter()
        .filter(|c| c.type_ != REPLICA_PAUSED && c.type_ != REPLICA_FAILURE)
        .cloned()
        .collect();
    let stamped = |mut c: Condition| {
        let kept = old
            .iter()
            .find(|o| o.type_ == c.type_ && o.status == c.status);
        c.last_transition_time = Some(
            kept.and_then(|o| o.last_transition_time.clone())
                .unwrap_or(Time(now)),
        );
        c
    };
    if paused {
        set_condition(
            &mut out,
            stamped(Condition::new(
                REPLICA_PAUSED,
                ConditionStatus::True,
                "Paused",
                "Controller got paused",
            )),
        );
    }
    if let Some(f) = failure {
        set_condition(
            &mut out,
            stamped(Condition::new(
                REPLICA_FAILURE,
                ConditionStatus::True,
                &f.reason,
                &f.message,
            )),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paused_and_failure_conditions_come_and_go() {
        let t0 = Timestamp::from_second(1_000).unwrap_or(Timestamp::UNIX_EPOCH);
        let t1 = Timestamp::from_second(2_000).unwrap_or(Timestamp::UNIX_EPOCH);
        let f = Failure {
            reason: "FailedCreate".into(),
            message: "quota".into(),
        };
        let c = conditions(&[], true, Some(&f), t0);
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].type_, REPLICA_PAUSED);
        assert_eq!(c[1].reason.as_deref(), Some("FailedCreate"));
        // Still paused later: the transition time is the first one.
        let again = conditions(&c, true, None, t1);
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].last_transition_time, Some(Time(t0)));
        assert!(conditions(&again, false, None, t1).is_empty());
    }
}
