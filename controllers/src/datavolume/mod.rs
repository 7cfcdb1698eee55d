//! DataVolume controller (CDI's `cdi.kubevirt.io/v1beta1` DataVolumes, served by
//! virt-apiserver): each DataVolume gets its claim, an `http` one an importer pod that
//! fills it, a `pvc` one (a clone, within its namespace) a worker pod that copies the source
//! claim's disk into it; the DataVolume's status follows them (docs/design-datavolumes.md
//! §3.2).
//!
//! [`render`] makes the claim and the pod and [`decide`] turns a DataVolume, its claim
//! and its pod into a plan and the next status; both are pure. [`reconcile`] only
//! executes them. The claims, importer pods and StorageClasses come from watch caches
//! (CDI's label selects ours); the DataVolumes from one shared watch that the VM
//! controller reads too ([`shared`]).

pub mod decide;
pub mod reconcile;
pub mod render;

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, controller, watcher};
use kubevirt_api::cdi::DataVolume;
use kubevirt_api::cdi::annotations as ann;
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::watch::{Readiness, Shared};

/// What every DataVolume reconcile shares.
#[derive(Debug)]
pub struct DataVolumes {
    /// Client, configuration, metrics, back-off.
    pub ctx: Arc<Context>,
    /// Claims with CDI's label.
    pub claims: Store<PersistentVolumeClaim>,
    /// Pods with CDI's label (the importers and clone workers).
    pub pods: Store<Pod>,
    /// Every StorageClass (defaults and binding modes).
    pub classes: Store<StorageClass>,
    /// Whether each of the three stores had its first list.
    pub ready: [Arc<Readiness>; 3],
    /// The importer pods' image.
    pub importer: render::ImporterConfig,
    /// DataVolumes whose cached copy met a 409: read fresh next time.
    pub stale: crate::watch::Stale,
}

/// The DataVolumes every controller reads (this one and the VM controller), one watch and
/// one store, until `stop`: virt-apiserver's, or a real CDI's where CDI owns the group (then
/// this controller is off, `--datavolumes=false`, and the VM controller reads CDI's). Where
/// DataVolumes are not served at all (an older virt-apiserver) the watch retries quietly and
/// the store stays empty: only VMs with `dataVolumeTemplates` wait on it.
pub fn shared(ctx: &Context, stop: CancellationToken) -> Shared<DataVolume> {
    Shared::spawn(ctx.watched(), "datavolumes", &ctx.metrics.watches, stop)
}

/// CDI's label selector of the claims and pods it makes.
pub fn cdi_selector() -> String {
    format!("{}={}", ann::APP_LABEL, ann::APP_LABEL_VALUE)
}

/// The DataVolume controlling `obj`, as a reconcile trigger.
fn owner_of<K: ResourceExt>(obj: &K) -> Option<ObjectRef<DataVolume>> {
    let ns = obj.namespace()?;
    obj.owner_references()
        .iter()
        .find(|r| r.controller == Some(true) && r.kind == "DataVolume")
        .map(|r| ObjectRef::new(&r.name).within(&ns))
}

/// Runs the DataVolume controller until `shutdown` is cancelled, its DataVolumes from `dvs`.
pub async fn run(ctx: Arc<Context>, dvs: Shared<DataVolume>, shutdown: CancellationToken) {
    tracing::info!(
        workers = ctx.config.workers,
        image = %ctx.config.launcher.image,
        "starting DataVolume controller"
    );
    let selector = cdi_selector();
    let (claims, claim_writer) = reflector::store();
    let (pods, pod_writer) = reflector::store();
    let (classes, class_writer) = reflector::store();
    let ready: [Arc<Readiness>; 3] = Default::default();
    let state = Arc::new(DataVolumes {
        ctx: ctx.clone(),
        claims,
        pods,
        classes,
        ready: ready.clone(),
        importer: render::ImporterConfig {
            image: ctx.config.launcher.image.clone(),
            image_pull_policy: ctx.config.launcher.image_pull_policy.clone(),
        },
        stale: Default::default(),
    });
    // Each cache is filled before the reconcile its event triggers runs (the reflector
    // writes first), so a reconcile triggered by a claim or pod always finds it.
    let [claims_ready, pods_ready, classes_ready] = ready;
    let claim_events = reflector::reflector(
        claim_writer,
        watcher::watcher(
            ctx.watched::<PersistentVolumeClaim>(),
            watcher::Config::default().labels(&selector),
        )
        .default_backoff()
        .modify(crate::watch::slim),
    )
    .inspect_ok(move |e| claims_ready.observe(e))
    .touched_objects();
    let pod_events = reflector::reflector(
        pod_writer,
        watcher::watcher(
            ctx.watched::<Pod>(),
            watcher::Config::default().labels(&selector),
        )
        .default_backoff()
        .modify(crate::watch::slim),
    )
    .inspect_ok(move |e| pods_ready.observe(e))
    .touched_objects();
    // Classes change rarely and only matter to DataVolumes whose claim is still to be
    // made: they are read from the cache, and such a DataVolume looks again on resync.
    let class_events = reflector::reflector(
        class_writer,
        watcher::watcher(
            kube::Api::<StorageClass>::all(ctx.client.clone()),
            watcher::Config::default(),
        )
        .default_backoff()
        .modify(crate::watch::slim),
    )
    .inspect_ok(move |e| classes_ready.observe(e))
    .touched_objects();

    let store = dvs.reader();
    let forgetter = state.clone();
    let dv_events = dvs.subscribe().inspect(move |dv| {
        let Some(uid) = dv.uid() else { return };
        let current = store.get(&ObjectRef::from_obj(dv.as_ref()));
        if current.is_none_or(|c| c.uid().as_deref() != Some(uid.as_str())) {
            forgetter.ctx.backoff.reset(&uid);
            forgetter.stale.take(&uid);
        }
    });
    if !dvs.wait_ready(&shutdown).await {
        return;
    }
    Controller::for_shared_stream(dv_events, dvs.reader())
        .watches_stream(claim_events, |c: PersistentVolumeClaim| owner_of(&c))
        .watches_stream(pod_events, |p: Pod| owner_of(&p))
        // Never triggers anything: the stream only has to be polled to fill the cache.
        .watches_stream(class_events, |_: StorageClass| None::<ObjectRef<DataVolume>>)
        .with_config(controller::Config::default().concurrency(ctx.config.workers))
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(reconcile::reconcile, reconcile::error_policy, state)
        .for_each(|res| async move {
            if let Err(err) = res {
                tracing::debug!(error = %crate::vmi::reconcile::error_chain(&err), "reconcile result");
            }
        })
        .await;
    tracing::info!("DataVolume controller stopped");
}
