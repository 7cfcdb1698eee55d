//! Migration controller: drives each VirtualMachineInstanceMigration from Pending to
//! Succeeded or Failed (docs/cluster-flow.md §6).
//!
//! [`decide`] is a pure function of the migration, its VMI, the VMI's pods and every
//! other migration; [`target`] renders the target launcher pod; [`reconcile`] reads
//! fresh state and executes the decision. virt-handler moves the guest and reports in
//! the VMI's `status.migrationState`; this controller validates, limits, schedules the
//! target, hands off, times out, cancels, cleans up and moves the VMI on success.

pub mod claims;
pub mod decide;
pub mod reconcile;
pub mod target;

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{controller, watcher};
use kubevirt_api::migration::names;
use kubevirt_api::{VirtualMachineInstance, VirtualMachineInstanceMigration};
use tokio_util::sync::CancellationToken;

pub use decide::MigrationConfig;
pub use reconcile::Migrations;

use crate::context::Context;

/// Runs the migration controller until `shutdown` is cancelled.
pub async fn run(ctx: Arc<Context>, cfg: MigrationConfig, shutdown: CancellationToken) {
    let (vmims, vmis, pods) = (
        ctx.watched::<VirtualMachineInstanceMigration>(),
        ctx.watched::<VirtualMachineInstance>(),
        ctx.watched::<Pod>(),
    );
    tracing::info!(
        parallel_per_cluster = cfg.parallel_migrations_per_cluster,
        parallel_outbound_per_node = cfg.parallel_outbound_migrations_per_node,
        progress_timeout = ?cfg.progress_timeout,
        completion_timeout_per_gib = ?cfg.completion_timeout_per_gib,
        "starting VirtualMachineInstanceMigration controller"
    );
    let workers = ctx.config.workers;
    let controller = crate::watch::controller(vmims, "vmims", &ctx.metrics.watches);
    let vmi_changes = crate::watch::objects(
        vmis,
        watcher::Config::default(),
        "migration-vmis",
        &ctx.metrics.watches,
    );
    let state = Arc::new(Migrations::new(ctx, cfg));
    let store = controller.store();
    controller
        // Target pods are controlled by their migration until it succeeds.
        .owns(
            pods,
            watcher::Config::default().labels(names::MIGRATION_JOB_LABEL),
        )
        // virt-handler reports in the VMI: every migration of that VMI looks again.
        .watches_stream(vmi_changes, move |vmi| {
            let ns = vmi.namespace();
            let name = vmi.name_any();
            store
                .state()
                .into_iter()
                .filter(|m| m.namespace() == ns && m.spec.vmi_name == name)
                .filter(|m| {
                    m.metadata.deletion_timestamp.is_some()
                        || !m.status.as_ref().is_some_and(|s| s.phase.is_final())
                })
                .map(|m| ObjectRef::from_obj(&*m))
                .collect::<Vec<_>>()
        })
        .with_config(controller::Config::default().concurrency(workers))
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(reconcile::reconcile, reconcile::error_policy, state)
        .for_each(|res| async move {
            if let Err(err) = res {
                tracing::debug!(error = %crate::vmi::reconcile::error_chain(&err), "reconcile result");
            }
        })
        .await;
    tracing::info!("VirtualMachineInstanceMigration controller stopped");
}
