//! Orchestration of one replica set reconcile; the decisions live in [`super::decide`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use kubevirt_api::VirtualMachineInstance;
use kubevirt_api::replicaset::VirtualMachineInstanceReplicaSet;

use super::ReplicaSets;
use super::decide;
use crate::context::FIELD_MANAGER;
use crate::replicas::Failure;

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The replica set has no namespace or uid (a malformed object).
    #[error("VirtualMachineInstanceReplicaSet has no namespace or uid")]
    MissingMeta,
    /// Creating or deleting VMIs failed; the ReplicaFailure condition says so too.
    #[error("{reason}: {message}")]
    Replicas {
        /// FailedCreate or FailedDelete.
        reason: String,
        /// The error.
        message: String,
    },
    /// Writing the status failed.
    #[error("writing the status: {0}")]
    Status(#[source] kube::Error),
    /// Serialising the status failed (a bug).
    #[error("serialising the status: {0}")]
    Serialize(#[from] serde_json::Error),
}

impl ReconcileError {
    /// Short reason for logs and the back-off.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::MissingMeta => "MissingMeta",
            Self::Replicas { .. } => "ReplicaFailure",
            Self::Status(_) => "FailedStatusUpdate",
            Self::Serialize(_) => "SerializeFailed",
        }
    }
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_not_found())
}

/// How soon a replica set whose own writes the VMI cache has not shown yet looks again (the
/// watch event of the VMI reconciles it anyway).
const PENDING_RECHECK: Duration = Duration::from_secs(2);

/// Reconciles one replica set: its VMIs from the shared cache (trusted only once every
/// create and delete of ours has been seen there, [`crate::expectations`]), the plan
/// carried out, the status written.
#[tracing::instrument(skip_all, fields(vmirs = %rs.name_any(), ns = rs.namespace().unwrap_or_default()))]
pub async fn reconcile(
    rs: Arc<VirtualMachineInstanceReplicaSet>,
    state: Arc<ReplicaSets>,
) -> Result<Action, ReconcileError> {
    let ctx = &state.ctx;
    let (Some(ns), Some(uid)) = (rs.namespace(), rs.uid()) else {
        return Err(ReconcileError::MissingMeta);
    };
    if !state.vmis_ready.wait(crate::watch::READY_WAIT).await {
        return Ok(Action::requeue(crate::watch::READY_WAIT));
    }
    // Going: the garbage collector deletes the VMIs it controls.
    if rs.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    if let Some(wait) = state
        .expectations
        .wait_for_cache(&uid, "VMIs", PENDING_RECHECK)
    {
        return Ok(Action::requeue(wait));
    }
    let cached = state.vmis.state();
    let owned = decide::owned(&rs, cached.iter().map(AsRef::as_ref));
    let plan = decide::plan(&rs, &owned);
    let api = Api::<VirtualMachineInstance>::namespaced(ctx.client.clone(), &ns);
    let regarding = rs.object_ref(&());
    let mut failure = None;

    if plan.create > 0
        && let Some(vmi) = decide::render(&rs)
    {
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PostParams::default()
        };
        for _ in 0..plan.create {
            state.expectations.expect_creation(&uid, Instant::now());
            match api.create(&params, &vmi).await {
                Ok(created) => {
                    tracing::info!(vmi = %created.name_any(), "created VMI");
                    ctx.event(
                        &regarding,
                        EventType::Normal,
                        "SuccessfulCreate",
                        format!("Created virtual machine instance: {}", created.name_any()),
                    )
                    .await;
                }
                Err(e) => {
                    state.expectations.creation_observed(&uid);
                    tracing::warn!(error = %e, "creating a VMI failed");
                    ctx.event(
                        &regarding,
                        EventType::Warning,
                        "FailedCreate",
                        format!("Error creating VMI: {e}"),
                    )
                    .await;
                    failure = Some(Failure {
                        reason: "FailedCreate".into(),
                        message: e.to_string(),
                    });
                    // The next ones would fail alike (quota, a refused template).
                    break;
                }
            }
        }
    }
    if !plan.delete.is_empty() {
        state.expectations.expect_deletions(
            &uid,
            plan.delete.iter().map(|d| d.uid.clone()),
            Instant::now(),
        );
    }
    for d in &plan.delete {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(d.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&d.name, &params).await {
            Ok(_) => {
                tracing::info!(vmi = %d.name, "deleted VMI");
                ctx.event(
                    &regarding,
                    EventType::Normal,
                    "SuccessfulDelete",
                    format!("Deleted virtual machine instance {}", d.name),
                )
                .await;
            }
            Err(e) if is_not_found(&e) => state.expectations.deletion_observed(&uid, &d.uid),
            Err(e) => {
                state.expectations.deletion_observed(&uid, &d.uid);
                tracing::warn!(vmi = %d.name, error = %e, "deleting a VMI failed");
                ctx.event(
                    &regarding,
                    EventType::Warning,
                    "FailedDelete",
                    format!("Error deleting VMI {}: {e}", d.name),
                )
                .await;
                failure = Some(Failure {
                    reason: "FailedDelete".into(),
                    message: e.to_string(),
                });
            }
        }
    }

    let status = decide::status(&rs, &owned, failure.as_ref(), Timestamp::now());
    if rs.status.as_ref() != Some(&status) {
        let patch = crate::replicas::status_patch(rs.status.as_ref(), &status)?;
        let rss = Api::<VirtualMachineInstanceReplicaSet>::namespaced(ctx.client.clone(), &ns);
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PatchParams::default()
        };
        rss.patch_status(&rs.name_any(), &params, &Patch::Merge(&patch))
            .await
            .map_err(ReconcileError::Status)?;
    }
    if let Some(Failure { reason, message }) = failure {
        return Err(ReconcileError::Replicas { reason, message });
    }
    ctx.backoff.reset(&uid);
    Ok(Action::requeue(ctx.config.resync))
}

/// Failed reconciles back off per replica set.
pub fn error_policy(
    rs: Arc<VirtualMachineInstanceReplicaSet>,
    err: &ReconcileError,
    state: Arc<ReplicaSets>,
) -> Action {
    let key = rs.uid().unwrap_or_else(|| rs.name_any());
    let delay = state.ctx.backoff.next_delay_after(&key, err);
    tracing::warn!(vmirs = %rs.name_any(), error = %err, reason = err.reason(), retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}
