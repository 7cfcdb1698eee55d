//! VirtualMachine controller: keeps exactly the instance a VM's runStrategy and
//! stateChangeRequests ask for, and reports it in the VM status.

pub mod decide;
pub mod reconcile;
pub mod render;

use std::sync::Arc;

use futures::StreamExt;
use kube::Api;
use kube::runtime::{controller, watcher};
use kubevirt_api::{VirtualMachine, VirtualMachineInstance};
use tokio_util::sync::CancellationToken;

use crate::context::Context;

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
    crate::watch::controller(vms, "vms", &ctx.metrics.watches)
        .owns_stream(crate::watch::objects(
            vmis,
            watcher::Config::default(),
            "vm-vmis",
            &ctx.metrics.watches,
        ))
        .with_config(controller::Config::default().concurrency(ctx.config.workers))
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(reconcile::reconcile, reconcile::error_policy, ctx)
        .for_each(|res| async move {
            if let Err(err) = res {
                tracing::debug!(error = %err, "reconcile result");
            }
        })
        .await;
    tracing::info!("VirtualMachine controller stopped");
}
