//! VirtualMachineInstance controller: creates each VMI's launcher pod and follows the
//! pod into the VMI status until virt-handler takes over (docs/cluster-flow.md §2–3).
//!
//! [`render`] turns a VMI into its pod and [`decide`] turns a VMI and its pods into a
//! plan and the next status; both are pure. [`reconcile`] only executes them.

pub mod claims;
pub mod decide;
pub mod reconcile;
pub mod render;

#[cfg(test)]
mod golden_tests;

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{controller, watcher};
use kube::{Api, ResourceExt};
use kubevirt_api::VirtualMachineInstance;
use tokio_util::sync::CancellationToken;

use crate::context::Context;

/// Label selector of every launcher pod.
pub fn launcher_selector() -> String {
    format!(
        "{}={}",
        render::LAUNCHER_LABEL,
        render::LAUNCHER_LABEL_VALUE
    )
}

/// Runs the VMI controller until `shutdown` is cancelled.
pub async fn run(ctx: Arc<Context>, shutdown: CancellationToken) {
    let (vmis, pods) = match &ctx.config.namespace {
        Some(ns) => (
            Api::<VirtualMachineInstance>::namespaced(ctx.client.clone(), ns),
            Api::<Pod>::namespaced(ctx.client.clone(), ns),
        ),
        None => (
            Api::<VirtualMachineInstance>::all(ctx.client.clone()),
            Api::<Pod>::all(ctx.client.clone()),
        ),
    };
    tracing::info!(
        workers = ctx.config.workers,
        image = %ctx.config.launcher.image,
        allow_emulation = ctx.config.launcher.allow_emulation,
        "starting VirtualMachineInstance controller"
    );
    crate::watch::controller(vmis, "vmis", &ctx.metrics.watches)
        // A pod event (bound, started, failed, deleted) reconciles its VMI, named by the
        // pod's label: its own pods and a migration's target (controlled by the migration,
        // but recorded in the VMI's activePods once it launched).
        .watches(
            pods,
            watcher::Config::default().labels(&launcher_selector()),
            |pod: Pod| {
                let ns = pod.namespace()?;
                let name = pod.labels().get(render::VM_NAME_LABEL)?;
                Some(ObjectRef::new(name).within(&ns))
            },
        )
        .with_config(controller::Config::default().concurrency(ctx.config.workers))
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(reconcile::reconcile, reconcile::error_policy, ctx)
        .for_each(|res| async move {
            if let Err(err) = res {
                tracing::debug!(error = %reconcile::error_chain(&err), "reconcile result");
            }
        })
        .await;
    tracing::info!("VirtualMachineInstance controller stopped");
}
