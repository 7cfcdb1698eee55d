//! Workload updater: after an upgrade rolls a new virt-launcher image (virt-controller's
//! `--launcher-image`), running VMIs still on the old launcher are moved onto the new one —
//! live-migrated when `workloadUpdateMethods` has `LiveMigrate` and they can migrate (the
//! migration's target pod is rendered with the current image), else their launcher pod is
//! evicted in batches when it has `Evict` (the VM's runStrategy starts it again on the new
//! launcher; the eviction goes through the eviction API, so evictionStrategy and
//! PodDisruptionBudgets apply). The count of outdated VMIs goes to the KubeVirt resource's
//! `status.outdatedVirtualMachineInstanceWorkloads` and a metric. KubeVirt's names
//! throughout (docs/cluster-flow.md §8).
//!
//! One cluster-wide decision every few seconds ([`decide::plan`], pure) rather than a
//! reconcile per VMI: the limits (parallel migrations, eviction batches) are global.

pub mod decide;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, EvictParams, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use kube::runtime::events::EventType;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};
use kubevirt_api::migration::names;
use kubevirt_api::{
    VirtualMachineInstance, VirtualMachineInstanceMigration, VirtualMachineInstanceMigrationSpec,
};
use tokio_util::sync::CancellationToken;

use crate::context::{Context, FIELD_MANAGER};
use crate::watch::Shared;
pub use decide::WorkloadUpdateConfig;
use decide::{
    Key, OUTDATED_LAUNCHER_IMAGE_LABEL, Plan, WORKLOAD_UPDATE_ANNOTATION, WORKLOAD_UPDATE_PREFIX,
};

/// How often the plan is made.
const PERIOD: Duration = Duration::from_secs(5);

/// A store of every `K`, kept by a recovering watch (virt-watch) driven on its own task.
fn store<K>(
    api: Api<K>,
    name: &'static str,
    ctx: &Context,
    shutdown: &CancellationToken,
) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let events = reflector::reflector(
        writer,
        crate::watch::cached(api, watcher::Config::default(), name, &ctx.metrics.watches),
    )
    .applied_objects();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        let mut events = std::pin::pin!(events.take_until(stop.cancelled_owned()));
        while events.next().await.is_some() {}
    });
    reader
}

/// Runs the workload updater until `shutdown` is cancelled.
pub async fn run(
    ctx: Arc<Context>,
    vmis: Shared<VirtualMachineInstance>,
    parallel: usize,
    shutdown: CancellationToken,
) {
    let cfg = ctx.config.workload_update.clone();
    let image = ctx.config.launcher.image.clone();
    tracing::info!(
        live_migrate = cfg.live_migrate,
        evict = cfg.evict,
        batch_size = cfg.batch_size,
        batch_interval = ?cfg.batch_interval,
        launcher_image = %image,
        "starting workload updater"
    );
    let vmims = ctx.watched::<VirtualMachineInstanceMigration>();
    let vmis_ready = vmis.ready();
    let vmis = vmis.reader();
    let vmims = store(vmims, "workload-vmims", &ctx, &shutdown);
    let mut last_batch: Option<tokio::time::Instant> = None;
    let mut tick = tokio::time::interval(PERIOD);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tick.tick() => {}
        }
        if !vmis_ready.wait(crate::watch::READY_WAIT).await
            || vmims.wait_until_ready().await.is_err()
        {
            continue;
        }
        // The stores' own objects: nothing is copied per round.
        let all_vmis = vmis.state();
        let all_vmims = vmims.state();
        let batch_due = last_batch.is_none_or(|t| t.elapsed() >= cfg.batch_interval);
        let plan = decide::plan(
            &all_vmis,
            &all_vmims,
            &image,
            &cfg,
            parallel,
            batch_due,
            Timestamp::now(),
        );
        if !plan.evict.is_empty() {
            last_batch = Some(tokio::time::Instant::now());
        }
        ctx.metrics
            .outdated_vmis
            .set(i64::try_from(plan.outdated).unwrap_or(i64::MAX));
        report(&ctx, plan.outdated).await;
        execute(&ctx, &all_vmis, plan).await;
    }
    tracing::info!("workload updater stopped");
}

async fn execute(ctx: &Context, vmis: &[Arc<VirtualMachineInstance>], plan: Plan) {
    let find = |k: &Key| {
        vmis.iter().find(|v| {
            v.metadata.namespace.as_deref() == Some(k.namespace.as_str())
                && v.metadata.name.as_deref() == Some(k.name.as_str())
        })
    };
    for k in &plan.migrate {
        let api =
            Api::<VirtualMachineInstanceMigration>::namespaced(ctx.client.clone(), &k.namespace);
        let vmim = VirtualMachineInstanceMigration {
            metadata: kube::api::ObjectMeta {
                generate_name: Some(WORKLOAD_UPDATE_PREFIX.into()),
                namespace: Some(k.namespace.clone()),
                labels: Some(BTreeMap::from([(
                    names::VMI_NAME_LABEL.to_string(),
                    k.name.clone(),
                )])),
                annotations: Some(BTreeMap::from([(
                    WORKLOAD_UPDATE_ANNOTATION.to_string(),
                    String::new(),
                )])),
                ..Default::default()
            },
            spec: VirtualMachineInstanceMigrationSpec {
                vmi_name: k.name.clone(),
                ..Default::default()
            },
            status: None,
        };
        let pp = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        let (type_, reason, note) = match api.create(&pp, &vmim).await {
            Ok(m) => {
                tracing::info!(namespace = %k.namespace, vmi = %k.name, migration = %m.name_any(), "Moving to the current launcher");
                (
                    EventType::Normal,
                    "SuccessfulCreate",
                    format!(
                        "Created Migration {} for automated workload update",
                        m.name_any()
                    ),
                )
            }
            Err(e) => {
                tracing::warn!(namespace = %k.namespace, vmi = %k.name, error = %e, "Workload update migration not created");
                (
                    EventType::Warning,
                    "FailedCreate",
                    format!("Error creating a Migration for automated workload update: {e}"),
                )
            }
        };
        if let Some(v) = find(k) {
            ctx.event(&v.object_ref(&()), type_, reason, note).await;
        }
    }
    for k in &plan.evict {
        let Some(vmi) = find(k) else { continue };
        let (type_, reason, note) = match evict(ctx, vmi).await {
            Ok(pod) => (
                EventType::Normal,
                "SuccessfulEvict",
                format!("Initiated eviction of pod {pod} as part of automated workload update"),
            ),
            Err(e) => (
                EventType::Warning,
                "FailedEvict",
                format!("Error evicting the launcher pod during automated workload update: {e}"),
            ),
        };
        tracing::info!(namespace = %k.namespace, vmi = %k.name, reason, "{note}");
        ctx.event(&vmi.object_ref(&()), type_, reason, note).await;
    }
    for (k, on) in &plan.relabel {
        let Some(vmi) = find(k) else { continue };
        if let Err(e) = relabel(ctx, vmi, *on).await {
            tracing::warn!(namespace = %k.namespace, vmi = %k.name, error = %e, "Updating the outdated-launcher label");
        }
    }
    for k in &plan.abort {
        let api =
            Api::<VirtualMachineInstanceMigration>::namespaced(ctx.client.clone(), &k.namespace);
        match api.delete(&k.name, &DeleteParams::default()).await {
            Ok(_) => {
                tracing::info!(namespace = %k.namespace, migration = %k.name, "Workload update no longer needed: migration deleted")
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                tracing::warn!(namespace = %k.namespace, migration = %k.name, error = %e, "Deleting an unneeded workload update migration")
            }
        }
    }
}

/// The VMI's active launcher pod (on its node, not being deleted), if any.
async fn active_pod(
    ctx: &Context,
    vmi: &VirtualMachineInstance,
) -> Result<Option<Pod>, kube::Error> {
    let ns = vmi.namespace().unwrap_or_default();
    let uid = vmi.uid().unwrap_or_default();
    let node = vmi.status.as_ref().and_then(|s| s.node_name.clone());
    let list = Api::<Pod>::namespaced(ctx.client.clone(), &ns)
        .list(
            &ListParams::default()
                .labels(&format!("{}={uid}", crate::vmi::render::CREATED_BY_LABEL)),
        )
        .await?;
    Ok(list.items.into_iter().find(|p| {
        p.spec.as_ref().and_then(|s| s.node_name.clone()) == node
            && p.metadata.deletion_timestamp.is_none()
    }))
}

/// Evicts the VMI's active launcher pod through the eviction API; its name.
async fn evict(ctx: &Context, vmi: &VirtualMachineInstance) -> Result<String, kube::Error> {
    let Some(pod) = active_pod(ctx, vmi).await? else {
        return Ok(String::from("(none: already gone)"));
    };
    let name = pod.name_any();
    Api::<Pod>::namespaced(ctx.client.clone(), &vmi.namespace().unwrap_or_default())
        .evict(&name, &EvictParams::default())
        .await?;
    Ok(name)
}

/// Sets (`on`) or removes [`OUTDATED_LAUNCHER_IMAGE_LABEL`] on the VMI and its active
/// launcher pod, as KubeVirt's VMI controller does. The pod first: the plan looks at the
/// VMI's label only, so a pod write that failed after the VMI's would never be tried again.
async fn relabel(ctx: &Context, vmi: &VirtualMachineInstance, on: bool) -> Result<(), kube::Error> {
    let value = if on {
        serde_json::json!("")
    } else {
        serde_json::Value::Null
    };
    let patch = serde_json::json!({"metadata": {"labels": {OUTDATED_LAUNCHER_IMAGE_LABEL: value}}});
    let pp = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    let ns = vmi.namespace().unwrap_or_default();
    if let Some(pod) = active_pod(ctx, vmi).await? {
        Api::<Pod>::namespaced(ctx.client.clone(), &ns)
            .patch(&pod.name_any(), &pp, &Patch::Merge(&patch))
            .await?;
    }
    Api::<VirtualMachineInstance>::namespaced(ctx.client.clone(), &ns)
        .patch(&vmi.name_any(), &pp, &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Writes the count into the status of every KubeVirt resource that shows another (read
/// each round: anyone's write in between, or a failed one, is repaired by the next).
async fn report(ctx: &Context, outdated: usize) {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(
            kubevirt_api::GROUP,
            kubevirt_api::kubevirt::CRD_VERSION,
            "KubeVirt",
        ),
        kubevirt_api::kubevirt::PLURAL,
    );
    let all: Api<DynamicObject> = Api::all_with(ctx.client.clone(), &ar);
    let list = match all.list(&ListParams::default()).await {
        Ok(l) => l,
        Err(e) => {
            // No KubeVirt kind at all (the dev apiserver) is a 404: nothing to report.
            tracing::debug!(error = %e, "listing KubeVirt resources");
            return;
        }
    };
    for kv in list.items {
        if kv.data["status"]["outdatedVirtualMachineInstanceWorkloads"].as_u64()
            == u64::try_from(outdated).ok()
        {
            continue;
        }
        let api: Api<DynamicObject> =
            Api::namespaced_with(ctx.client.clone(), &kv.namespace().unwrap_or_default(), &ar);
        let patch =
            serde_json::json!({"status": {"outdatedVirtualMachineInstanceWorkloads": outdated}});
        if let Err(e) = api
            .patch_status(
                &kv.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            tracing::debug!(error = %e, "writing outdatedVirtualMachineInstanceWorkloads");
        }
    }
}
