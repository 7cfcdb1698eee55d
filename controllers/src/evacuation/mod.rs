//! Evacuation controller: moves the VMIs virt-apiserver marked for evacuation
//! (`status.evacuationNodeName`, set when an eviction of their launcher pod was refused) off
//! their node by live migration, one migration per VMI at a time, with back-off after a
//! failure; the migration controller enforces the parallel limits. It removes the mark when
//! the VMI has left the node, and cancels the evacuation when the node is uncordoned before
//! the guest began to move or the mark was removed (`evacuate/cancel`). docs/cluster-flow.md
//! §7.
//!
//! [`decide`] is pure; this module reads state and executes its step.

pub mod decide;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, controller, watcher};
use kube::{Api, Resource, ResourceExt};
use kubevirt_api::eviction::{
    EVACUATION_DRAIN_ANNOTATION, EVACUATION_MIGRATION_ANNOTATION, EVACUATION_MIGRATION_PREFIX,
};
use kubevirt_api::migration::names;
use kubevirt_api::{
    VirtualMachineInstance, VirtualMachineInstanceMigration, VirtualMachineInstanceMigrationSpec,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::context::{Context, FIELD_MANAGER};
use crate::watch::Shared;
use decide::Step;

/// Why an evacuation reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum EvacuationError {
    /// An API call failed.
    #[error("{what}")]
    Api {
        /// What was being done.
        what: &'static str,
        /// The client error.
        #[source]
        source: kube::Error,
    },
}

fn api(what: &'static str) -> impl FnOnce(kube::Error) -> EvacuationError {
    move |source| EvacuationError::Api { what, source }
}

/// State of the evacuation controller.
struct Evacuations {
    ctx: Arc<Context>,
    /// Every migration (their annotations say which evacuate what).
    migrations: Store<VirtualMachineInstanceMigration>,
}

/// Runs the evacuation controller until `shutdown` is cancelled.
pub async fn run(
    ctx: Arc<Context>,
    vmis: Shared<VirtualMachineInstance>,
    shutdown: CancellationToken,
) {
    let client = ctx.client.clone();
    let vmims = ctx.watched::<VirtualMachineInstanceMigration>();
    let nodes = Api::<Node>::all(client);
    tracing::info!(
        default_strategy = %ctx.config.eviction_strategy,
        "starting evacuation controller"
    );
    let (reader, writer) = reflector::store();
    // The migration metrics of the VMIs name their migration from this cache.
    ctx.metrics.sources.set_migrations(reader.clone());
    let migration_events = reflector::reflector(
        writer,
        crate::watch::cached(
            vmims,
            watcher::Config::default(),
            "evacuation-vmims",
            &ctx.metrics.watches,
        ),
    )
    .applied_objects();
    let vmi_events = vmis.subscribe();
    let vmi_store = vmis.reader();
    let node_events = crate::watch::objects(
        nodes,
        watcher::Config::default(),
        "evacuation-nodes",
        &ctx.metrics.watches,
    );
    let state = Arc::new(Evacuations {
        ctx: ctx.clone(),
        migrations: reader,
    });
    if !vmis.wait_ready(&shutdown).await {
        return;
    }
    Controller::for_shared_stream(vmi_events, vmis.reader())
        // A migration ending (or created) looks at its VMI again.
        .watches_stream(migration_events, |m: VirtualMachineInstanceMigration| {
            let ns = m.namespace()?;
            Some(ObjectRef::<VirtualMachineInstance>::new(&m.spec.vmi_name).within(&ns))
        })
        // Cordoned or uncordoned: every VMI being evacuated from that node.
        .watches_stream(node_events, move |n: Node| {
            let name = n.name_any();
            vmi_store
                .state()
                .into_iter()
                .filter(|v| {
                    v.status.as_ref().and_then(|s| s.evacuation_node_name.as_deref())
                        == Some(name.as_str())
                })
                .map(|v| ObjectRef::from_obj(&*v))
                .collect::<Vec<_>>()
        })
        .with_config(controller::Config::default().concurrency(ctx.config.workers))
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(reconcile, error_policy, state)
        .for_each(|res| async move {
            if let Err(err) = res {
                tracing::debug!(error = %crate::vmi::reconcile::error_chain(&err), "reconcile result");
            }
        })
        .await;
    tracing::info!("evacuation controller stopped");
}

fn error_policy(
    _vmi: Arc<VirtualMachineInstance>,
    err: &EvacuationError,
    _state: Arc<Evacuations>,
) -> Action {
    tracing::warn!(error = %crate::vmi::reconcile::error_chain(err), "evacuation reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

async fn reconcile(
    vmi: Arc<VirtualMachineInstance>,
    state: Arc<Evacuations>,
) -> Result<Action, EvacuationError> {
    let ctx = &state.ctx;
    let ns = vmi.namespace().unwrap_or_default();
    let name = vmi.name_any();
    let marked = vmi
        .status
        .as_ref()
        .and_then(|s| s.evacuation_node_name.clone())
        .filter(|n| !n.is_empty());
    let of_vmi = |m: &VirtualMachineInstanceMigration| {
        m.metadata.namespace.as_deref() == Some(ns.as_str()) && m.spec.vmi_name == name
    };
    // A marked VMI is decided on fresh reads, its migrations first and then the VMI: the
    // store's copy may predate the migration that just moved it, and "still on the node"
    // beside "its migration succeeded" would evacuate it a second time. In this order a
    // succeeded migration is always seen with the VMI it moved (the migration controller
    // writes the VMI before the migration's phase).
    let fresh;
    let (vmi, migrations): (
        &VirtualMachineInstance,
        Vec<VirtualMachineInstanceMigration>,
    ) = if marked.is_some() {
        let migrations =
            Api::<VirtualMachineInstanceMigration>::namespaced(ctx.client.clone(), &ns)
                .list(&ListParams::default())
                .await
                .map_err(api("listing migrations"))?
                .items
                .into_iter()
                .filter(|m| of_vmi(m))
                .collect();
        match Api::<VirtualMachineInstance>::namespaced(ctx.client.clone(), &ns)
            .get_opt(&name)
            .await
            .map_err(api("reading the VMI"))?
        {
            Some(v) => {
                fresh = v;
                (&fresh, migrations)
            }
            None => return Ok(Action::await_change()),
        }
    } else {
        // Unmarked VMIs are the many: only a cancelled evacuation needs a look.
        let cached: Vec<_> = state
            .migrations
            .state()
            .into_iter()
            .filter(|m| of_vmi(m))
            .map(|m| (*m).clone())
            .collect();
        if !cached.iter().any(|m| {
            m.annotations()
                .contains_key(EVACUATION_MIGRATION_ANNOTATION)
        }) {
            return Ok(Action::await_change());
        }
        (&*vmi, cached)
    };
    let marked = vmi
        .status
        .as_ref()
        .and_then(|s| s.evacuation_node_name.clone())
        .filter(|n| !n.is_empty());
    let node = match &marked {
        Some(n) => Api::<Node>::all(ctx.client.clone())
            .get_opt(n)
            .await
            .map_err(api("reading the evacuated node"))?,
        None => None,
    };
    let step = decide::decide(
        vmi,
        node.as_ref(),
        &migrations,
        ctx.config.eviction_strategy,
        Timestamp::now(),
    );
    let vmis = Api::<VirtualMachineInstance>::namespaced(ctx.client.clone(), &ns);
    let regarding = vmi.object_ref(&());
    match step {
        Step::Idle => Ok(Action::await_change()),
        Step::Wait(d) => Ok(Action::requeue(d)),
        Step::Migrate { node, drain } => {
            let mut annotations =
                BTreeMap::from([(EVACUATION_MIGRATION_ANNOTATION.to_string(), node.clone())]);
            if drain {
                annotations.insert(EVACUATION_DRAIN_ANNOTATION.into(), "true".into());
            }
            let vmim = VirtualMachineInstanceMigration {
                metadata: kube::api::ObjectMeta {
                    generate_name: Some(EVACUATION_MIGRATION_PREFIX.into()),
                    namespace: Some(ns.clone()),
                    labels: Some(BTreeMap::from([(
                        names::VMI_NAME_LABEL.to_string(),
                        name.clone(),
                    )])),
                    annotations: Some(annotations),
                    ..Default::default()
                },
                spec: VirtualMachineInstanceMigrationSpec {
                    vmi_name: name.clone(),
                    ..Default::default()
                },
                status: None,
            };
            let created =
                Api::<VirtualMachineInstanceMigration>::namespaced(ctx.client.clone(), &ns)
                    .create(
                        &PostParams {
                            field_manager: Some(FIELD_MANAGER.into()),
                            ..Default::default()
                        },
                        &vmim,
                    )
                    .await
                    .map_err(api("creating an evacuation migration"))?;
            tracing::info!(namespace = %ns, vmi = %name, node = %node, drain, migration = %created.name_any(), "Evacuating");
            ctx.event(
                &regarding,
                EventType::Normal,
                decide::reasons::CREATED,
                format!(
                    "Created migration {} to evacuate node {node}",
                    created.name_any()
                ),
            )
            .await;
            Ok(Action::await_change())
        }
        Step::Unmark { reason, message } => {
            let patch = json!({
                "metadata": {"resourceVersion": vmi.resource_version()},
                "status": {"evacuationNodeName": null},
            });
            vmis.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(api("removing status.evacuationNodeName"))?;
            tracing::info!(namespace = %ns, vmi = %name, reason, "{message}");
            ctx.event(&regarding, EventType::Normal, reason, message)
                .await;
            Ok(Action::await_change())
        }
        Step::Cancel(names) => {
            let migrations =
                Api::<VirtualMachineInstanceMigration>::namespaced(ctx.client.clone(), &ns);
            for m in &names {
                match migrations.delete(m, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(api("deleting a cancelled evacuation migration")(e)),
                }
            }
            tracing::info!(namespace = %ns, vmi = %name, migrations = ?names, "Evacuation cancelled");
            ctx.event(
                &regarding,
                EventType::Normal,
                decide::reasons::CANCELLED,
                format!(
                    "Evacuation cancelled: deleted migration {}",
                    names.join(", ")
                ),
            )
            .await;
            Ok(Action::await_change())
        }
    }
}
