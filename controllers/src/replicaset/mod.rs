//! VirtualMachineInstanceReplicaSet controller: keeps `replicas` VMIs made from the
//! replica set's template, replaces finished and deleted ones at once, removes the surplus
//! on scale-in, stops while `paused`, and reports counts, the selector and conditions in
//! the status (KubeVirt's `watch/replicaset`). The VMIs come from the VMI store every
//! controller shares ([`crate::watch::Shared`]).

pub mod decide;
pub mod reconcile;

use std::sync::Arc;

use futures::StreamExt;
use kube::ResourceExt;
use kube::runtime::controller;
use kube::runtime::reflector::{ObjectRef, Store};
use kubevirt_api::VirtualMachineInstance;
use kubevirt_api::replicaset::VirtualMachineInstanceReplicaSet;
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::expectations::Expectations;
use crate::watch::Shared;

/// What every replica set reconcile shares.
#[derive(Debug)]
pub struct ReplicaSets {
    /// Client, configuration, metrics, back-off.
    pub ctx: Arc<Context>,
    /// The VMIs.
    pub vmis: Store<VirtualMachineInstance>,
    /// Whether `vmis` has had its first full list.
    pub vmis_ready: Arc<crate::watch::Readiness>,
    /// Creates and deletes not yet seen in `vmis`, per replica set uid.
    pub expectations: Expectations,
}

/// Runs the replica set controller until `shutdown` is cancelled.
pub async fn run(
    ctx: Arc<Context>,
    vmis: Shared<VirtualMachineInstance>,
    shutdown: CancellationToken,
) {
    tracing::info!("starting VirtualMachineInstanceReplicaSet controller");
    let state = Arc::new(ReplicaSets {
        ctx: ctx.clone(),
        vmis: vmis.reader(),
        vmis_ready: vmis.ready(),
        expectations: Expectations::default(),
    });
    // Each VMI event is an observation for the replica set controlling it: a create seen,
    // or a delete (gone from the store, or being deleted).
    let store = vmis.reader();
    let observer = state.clone();
    let vmi_events = vmis.subscribe().inspect(move |vmi| {
        let (Some(owner), Some(uid)) = (crate::replicas::controller_uid(&vmi.metadata), vmi.uid())
        else {
            return;
        };
        let current = store.get(&ObjectRef::from_obj(vmi.as_ref()));
        let gone = current.is_none_or(|c| c.uid().as_deref() != Some(uid.as_str()));
        observer.expectations.observe(
            owner,
            &uid,
            gone || vmi.metadata.deletion_timestamp.is_some(),
        );
    });
    if !vmis.wait_ready(&shutdown).await {
        return;
    }
    crate::watch::controller(
        ctx.watched::<VirtualMachineInstanceReplicaSet>(),
        "vmirs",
        &ctx.metrics.watches,
    )
    .owns_shared_stream(vmi_events)
    .with_config(controller::Config::default().concurrency(ctx.config.workers))
    .graceful_shutdown_on(async move { shutdown.cancelled().await })
    .run(reconcile::reconcile, reconcile::error_policy, state)
    .for_each(|res| async move {
        if let Err(err) = res {
            tracing::debug!(error = %err, "reconcile result");
        }
    })
    .await;
    tracing::info!("VirtualMachineInstanceReplicaSet controller stopped");
}
