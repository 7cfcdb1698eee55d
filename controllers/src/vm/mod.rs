//! VirtualMachine controller: keeps exactly the instance a VM's runStrategy and
//! stateChangeRequests ask for, and reports it in the VM status.

pub mod decide;
pub mod reconcile;
pub mod render;

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use kube::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{Controller, WatchStreamExt, controller, watcher};
use kubevirt_api::{VirtualMachine, VirtualMachineInstance};
use tokio_util::sync::CancellationToken;

use crate::context::Context;

/// What every VM reconcile shares: the controllers' context and the VMIs as the watch
/// shows them, [`slim_vmi`]med.
#[derive(Debug)]
pub struct Vms {
    /// Client, configuration, metrics, back-off.
    pub ctx: Arc<Context>,
    /// The VMIs, without what the VM controller does not read.
    pub vmis: Store<VirtualMachineInstance>,
    /// Whether `vmis` has had its first full list ([`crate::watch::Readiness`]).
    pub vmis_ready: crate::watch::Readiness,
    /// VMs whose cached copy met a 409: read fresh next time.
    pub stale: crate::watch::Stale,
}

/// Drops from a VMI cached for the VM controller what its decisions
/// ([`decide::ObservedVmi`], [`render::controlled_by`],
/// [`render::display_annotations_patch`]) do not read: the spec (the largest part),
/// managedFields and every annotation but the VM generation it was rendered from. The
/// VMI controller keeps its own full copy; this one costs little per VMI.
pub fn slim_vmi(vmi: &mut VirtualMachineInstance) {
    vmi.spec = Default::default();
    vmi.metadata.managed_fields = None;
    if let Some(a) = vmi.metadata.annotations.as_mut() {
        a.retain(|k, _| k == decide::VM_GENERATION_ANNOTATION);
    }
}

/// Runs the VM controller until `shutdown` is cancelled.
pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) {
    let (vms, vmis) = match &ctx.config.namespace {
        Some(ns) => (
            Api::<VirtualMachine>::namespaced(ctx.client.clone(), ns),
            Api::<VirtualMachineInstance>::namespaced(ctx.client.clone(), ns),
        ),
        None => (
            Api::<VirtualMachine>::all(ctx.client.clone()),
            Api::<VirtualMachineInstance>::all(ctx.client.clone()),
        ),
    };
    tracing::info!(
        workers = ctx.config.workers,
        "starting VirtualMachine controller"
    );
    let (vmi_reader, vmi_writer) = reflector::store();
    let state = Arc::new(Vms {
        ctx: ctx.clone(),
        vmis: vmi_reader,
        vmis_ready: Default::default(),
        stale: Default::default(),
    });
    let marker = state.clone();
    // A VMI event reconciles its VM (owner reference) after the store has it.
    let vmi_events = reflector::reflector(
        vmi_writer,
        crate::watch::cached(
            vmis,
            watcher::Config::default(),
            "vm-vmis",
            &ctx.metrics.watches,
        )
        .modify(slim_vmi),
    )
    .inspect_ok(move |event| marker.vmis_ready.observe(event))
    .touched_objects();

    // A deleted VM's back-off is dropped as its delete is seen (the controller never
    // reconciles an object that left its store).
    let (vm_reader, vm_writer) = reflector::store();
    let forgetter = state.clone();
    let vm_events = reflector::reflector(
        vm_writer,
        crate::watch::cached(vms, watcher::Config::default(), "vms", &ctx.metrics.watches),
    )
    .inspect_ok(move |event| {
        if let watcher::Event::Delete(vm) = event {
            let key = reconcile::backoff_key(vm);
            forgetter.ctx.backoff.reset(&key);
            forgetter.stale.take(&key);
        }
    })
    .applied_objects();

    Controller::for_stream(vm_events, vm_reader)
        .owns_stream(vmi_events)
        .with_config(controller::Config::default().concurrency(ctx.config.workers))
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(reconcile::reconcile, reconcile::error_policy, state)
        .for_each(|res| async move {
            if let Err(err) = res {
                tracing::debug!(error = %err, "reconcile result");
            }
        })
        .await;
    tracing::info!("VirtualMachine controller stopped");
}
