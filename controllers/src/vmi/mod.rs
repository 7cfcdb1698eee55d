//! VirtualMachineInstance controller: creates each VMI's launcher pod and follows the
//! pod into the VMI status until virt-handler takes over (docs/cluster-flow.md §2–3).
//!
//! [`render`] turns a VMI into its pod and [`decide`] turns a VMI and its pods into a
//! plan and the next status; both are pure. [`reconcile`] only executes them.

pub mod claims;
pub mod decide;
pub mod hotplug;
pub mod pods;
pub mod reconcile;
pub mod render;

#[cfg(test)]
mod golden_tests;

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use kube::ResourceExt;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{Controller, WatchStreamExt, controller, watcher};
use kubevirt_api::VirtualMachineInstance;
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::expectations::Expectations;
use crate::watch::Shared;
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
    /// The attachment pods of hotplugged volumes ([`hotplug`]), as their watch shows them.
    pub attachments: reflector::Store<pods::CachedPod>,
}

/// The VMIs every controller reads, one watch and one store ([`Shared`]), until `stop`.
pub fn shared(ctx: &Context, stop: CancellationToken) -> Shared<VirtualMachineInstance> {
    Shared::spawn(ctx.watched(), "vmis", &ctx.metrics.watches, stop)
}

/// Label selector of every launcher pod.
pub fn launcher_selector() -> String {
    format!(
        "{}={}",
        render::LAUNCHER_LABEL,
        render::LAUNCHER_LABEL_VALUE
    )
}

/// Runs the VMI controller until `shutdown` is cancelled, its VMIs from `vmis`.
pub async fn run(
    ctx: Arc<Context>,
    vmis: Shared<VirtualMachineInstance>,
    shutdown: CancellationToken,
) {
    let pods = ctx.watched::<pods::CachedPod>();
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
    // kubevirt_vmi_info names each VMI's Running launcher from this cache.
    ctx.metrics.sources.set_pods(pod_reader.clone());
    // The attachment pods (few: one per hotplugged volume), kept whole but for what no
    // decision reads.
    let (attachment_reader, attachment_writer) = reflector::store();
    let attachment_events = reflector::reflector(
        attachment_writer,
        watcher::watcher(
            pods.clone(),
            watcher::Config::default().labels(&format!(
                "{}={}",
                render::LAUNCHER_LABEL,
                kubevirt_api::hotplug::ATTACHMENT_APP
            )),
        )
        .default_backoff()
        .modify(|p: &mut pods::CachedPod| {
            p.metadata.managed_fields = None;
        }),
    )
    .touched_objects();
    let state = Arc::new(Vmis {
        ctx: ctx.clone(),
        pods: LauncherPods::new(pod_reader, Expectations::default()),
        stale: Default::default(),
        attachments: attachment_reader,
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
    // controller never reconciles an object that left its store). The feed has each
    // object after the store: one no longer there, or replaced by a namesake, is gone.
    let store = vmis.reader();
    let forgetter = state.clone();
    let vmi_events = vmis.subscribe().inspect(move |vmi| {
        let Some(uid) = vmi.uid() else { return };
        let current = store.get(&ObjectRef::from_obj(vmi.as_ref()));
        if current.is_none_or(|c| c.uid().as_deref() != Some(uid.as_str())) {
            forgetter.ctx.vmi_phases.forget(&uid);
            forgetter.ctx.backoff.reset(&uid);
            forgetter.pods.expectations.forget(&uid);
            forgetter.stale.take(&uid);
        }
    });
    if !vmis.wait_ready(&shutdown).await {
        return;
    }

    Controller::for_shared_stream(vmi_events, vmis.reader())
        // A pod event (bound, started, failed, deleted) reconciles its VMI, named by the
        // pod's label: its own pods and a migration's target (controlled by the migration,
        // but recorded in the VMI's activePods once it launched).
        .watches_stream(pod_events, |pod: pods::CachedPod| {
            let ns = pod.namespace()?;
            let name = pod.labels().get(render::VM_NAME_LABEL)?;
            Some(ObjectRef::new(name).within(&ns))
        })
        // An attachment pod's changes (bound, running, deleted) reconcile its VMI.
        .watches_stream(attachment_events, |pod: pods::CachedPod| {
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
