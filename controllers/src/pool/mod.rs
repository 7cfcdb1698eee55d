//! VirtualMachinePool controller (`pool.kubevirt.io/v1beta1`): keeps `replicas` VMs
//! `<pool>-<ordinal>` made from the pool's VM template (each with its own DataVolumes),
//! makes a deleted member again at once, removes the surplus on scale-in by the pool's
//! strategy and selection policy (keeping their DataVolumes where asked), rolls a changed
//! template out by the update strategy within `maxUnavailable`, replaces VMs that keep
//! failing to start (autohealing), stops while `paused`, and reports counts, the selector
//! and conditions in the status (KubeVirt's `watch/pool`).
//!
//! Its VMs come from a watch of the VMs carrying the pool revision label (every pool VM
//! has it), slimmed as the VM controller slims its own; their VMIs from the VMI store every
//! controller shares.

pub mod decide;
pub mod reconcile;

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use kube::ResourceExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, controller, watcher};
use kubevirt_api::pool::{REVISION_LABEL, VirtualMachinePool};
use kubevirt_api::{VirtualMachine, VirtualMachineInstance};
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::expectations::Expectations;
use crate::watch::{Readiness, Shared};

/// What every pool reconcile shares.
#[derive(Debug)]
pub struct Pools {
    /// Client, configuration, metrics, back-off.
    pub ctx: Arc<Context>,
    /// The pools' VMs (those with the revision label).
    pub vms: Store<VirtualMachine>,
    /// Whether `vms` has had its first full list.
    pub vms_ready: Arc<Readiness>,
    /// The VMIs.
    pub vmis: Store<VirtualMachineInstance>,
    /// Whether `vmis` has had its first full list.
    pub vmis_ready: Arc<Readiness>,
    /// Creates and deletes not yet seen in `vms`, per pool uid.
    pub expectations: Expectations,
}

/// Runs the pool controller until `shutdown` is cancelled.
pub async fn run(
    ctx: Arc<Context>,
    vmis: Shared<VirtualMachineInstance>,
    shutdown: CancellationToken,
) {
    tracing::info!("starting VirtualMachinePool controller");
    let (vm_reader, vm_writer) = reflector::store();
    let state = Arc::new(Pools {
        ctx: ctx.clone(),
        vms: vm_reader,
        vms_ready: Default::default(),
        vmis: vmis.reader(),
        vmis_ready: vmis.ready(),
        expectations: Expectations::default(),
    });
    let observer = state.clone();
    let vm_events = reflector::reflector(
        vm_writer,
        crate::watch::cached(
            ctx.watched::<VirtualMachine>(),
            watcher::Config::default().labels(REVISION_LABEL),
            "pool-vms",
            &ctx.metrics.watches,
        )
        .modify(crate::vm::slim_vm),
    )
    .inspect_ok(move |event| {
        observer.vms_ready.observe(event);
        // A VM seen is an observation for the pool controlling it: a create seen, or a
        // delete (gone, or being deleted).
        let (vm, gone) = match event {
            watcher::Event::Apply(vm) | watcher::Event::InitApply(vm) => (vm, false),
            watcher::Event::Delete(vm) => (vm, true),
            _ => return,
        };
        if let (Some(owner), Some(uid)) = (crate::replicas::controller_uid(&vm.metadata), vm.uid())
        {
            observer.expectations.observe(
                owner,
                &uid,
                gone || vm.metadata.deletion_timestamp.is_some(),
            );
        }
    })
    .touched_objects();
    if !vmis.wait_ready(&shutdown).await {
        return;
    }
    crate::watch::controller(
        ctx.watched::<VirtualMachinePool>(),
        "vmpools",
        &ctx.metrics.watches,
    )
    .owns_stream(vm_events)
    .with_config(controller::Config::default().concurrency(ctx.config.workers))
    .graceful_shutdown_on(async move { shutdown.cancelled().await })
    .run(reconcile::reconcile, reconcile::error_policy, state)
    .for_each(|res| async move {
        if let Err(err) = res {
            tracing::debug!(error = %err, "reconcile result");
        }
    })
    .await;
    tracing::info!("VirtualMachinePool controller stopped");
}
