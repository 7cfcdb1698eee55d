//! VirtualMachineInstance controller: creates each VMI's launcher pod and follows the
//! pod into the VMI status until virt-handler takes over (docs/cluster-flow.md §2–3).
//!
//! [`render`] turns a VMI into its pod and [`decide`] turns a VMI and its pods into a
//! plan and the next status; both are pure. [`reconcile`] only executes them.

pub mod claims;
pub mod decide;
pub mod pods;
pub mod reconcile;
pub mod render;

#[cfg(test)]
mod golden_tests;

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{Controller, WatchStreamExt, controller, watcher};
use kube::{Api, ResourceExt};
use kubevirt_api::VirtualMachineInstance;
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::expectations::Expectations;
use pods::LauncherPods;

/// What every VMI reconcile shares: the controllers' context and the launcher-pod cache.
#[derive(Debug)]
pub struct Vmis {
    /// Client, configuration, metrics, back-off.
    pub ctx: Arc<Context>,
    /// The launcher pods as the watch shows them, with the expectations that say when
    /// they can be trusted.
    pub pods: LauncherPods,
    /// VMIs whose cached copy met a 409: read fresh next time.
    pub stale: crate::watch::Stale,
}

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
    // One launcher-pod watch feeds the cache the reconciles read (instead of a LIST per
    // reconcile) and triggers them: the store is written first, then the index and the
    // expectations (LauncherPods::observe), then the reconcile is queued, so a reconcile
    // triggered by a pod always finds it.
    let (pod_reader, pod_writer) = reflector::store();
    let state = Arc::new(Vmis {
        ctx: ctx.clone(),
        pods: LauncherPods::new(pod_reader, Expectations::default()),
        stale: Default::default(),
    });
    let observer = state.clone();
    let pod_events = reflector::reflector(
        pod_writer,
        watcher::watcher(
            pods,
            watcher::Config::default().labels(&launcher_selector()),
        )
        .default_backoff()
        .modify(pods::slim),
    )
    .inspect_ok(move |event| observer.pods.observe(event))
    .touched_objects();

    // The VMIs: a deleted one's bookkeeping is dropped as its delete is seen (the
    // controller never reconciles an object that left its store).
    let (vmi_reader, vmi_writer) = reflector::store();
    let forgetter = state.clone();
    let vmi_events = reflector::reflector(
        vmi_writer,
        crate::watch::cached(
            vmis,
            watcher::Config::default(),
            "vmis",
            &ctx.metrics.watches,
        ),
    )
    .inspect_ok(move |event| {
        if let watcher::Event::Delete(vmi) = event
            && let Some(uid) = vmi.uid()
        {
            forgetter.ctx.vmi_phases.forget(&uid);
            forgetter.ctx.backoff.reset(&uid);
            forgetter.pods.expectations.forget(&uid);
            forgetter.stale.take(&uid);
        }
    })
    .applied_objects();

    Controller::for_stream(vmi_events, vmi_reader)
        // A pod event (bound, started, failed, deleted) reconciles its VMI, named by the
        // pod's label: its own pods and a migration's target (controlled by the migration,
        // but recorded in the VMI's activePods once it launched).
        .watches_stream(pod_events, |pod: Pod| {
            let ns = pod.namespace()?;
            let name = pod.labels().get(render::VM_NAME_LABEL)?;
            Some(ObjectRef::new(name).within(&ns))
        })
        .with_config(controller::Config::default().concurrency(ctx.config.workers))
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(reconcile::reconcile, reconcile::error_policy, state)
        .for_each(|res| async move {
            if let Err(err) = res {
                tracing::debug!(error = %reconcile::error_chain(&err), "reconcile result");
            }
        })
        .await;
    tracing::info!("VirtualMachineInstance controller stopped");
}
