//! VirtualMachine controller: keeps exactly the instance a VM's runStrategy and
//! stateChangeRequests ask for, and reports it in the VM status.

pub mod decide;
pub mod hotplug;
pub mod instancetype;
pub mod live;
pub mod reconcile;
pub mod render;

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{Controller, WatchStreamExt, controller, watcher};
use kubevirt_api::cdi::DataVolume;
use kubevirt_api::vmi::{Devices, DomainSpec, Volume};
use kubevirt_api::{VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceSpec};
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::watch::Shared;

/// What every VM reconcile shares: the controllers' context and the VMIs (the store all
/// controllers share, [`crate::watch::Shared`]).
#[derive(Debug)]
pub struct Vms {
    /// Client, configuration, metrics, back-off.
    pub ctx: Arc<Context>,
    /// The VMIs.
    pub vmis: Store<VirtualMachineInstance>,
    /// Whether `vmis` has had its first full list ([`crate::watch::Readiness`]).
    pub vmis_ready: Arc<crate::watch::Readiness>,
    /// VMs whose cached copy met a 409: read fresh next time.
    pub stale: crate::watch::Stale,
    /// The DataVolumes (the store the DataVolume controller shares): the VMs'
    /// `dataVolumeTemplates`.
    pub dvs: Store<DataVolume>,
    /// Whether `dvs` has had its first full list; only VMs with templates wait for it.
    pub dvs_ready: Arc<crate::watch::Readiness>,
}

/// Drops from a VM cached for the controller the bulk of its `spec.template`: a decision
/// reads the VM's metadata, status and run strategy ([`decide::decide`],
/// [`decide::derive_status`]), and a VMI is rendered only from a VM read fresh (a
/// reconcile re-reads both before it acts), so the cached template is never rendered.
/// Kept are only the few small parts KubeVirt's inventory metrics read at each scrape
/// ([`crate::metrics::cluster::vm_families`]): the template's annotations (`vm.kubevirt.io/
/// os|workload|flavor`), its domain's machine, cpu, memory, resources and interfaces, its
/// networks, and its volumes on claims and DataVolumes (their names only). Dropped: disks,
/// the other volumes (cloud-init user data among them), scheduling, probes, the template's
/// labels and the rest.
pub fn slim_vm(vm: &mut VirtualMachine) {
    let template = std::mem::take(&mut vm.spec.template);
    let annotations = template.metadata.and_then(|m| m.annotations);
    vm.spec.template.metadata = annotations.map(|a| ObjectMeta {
        annotations: Some(a),
        ..ObjectMeta::default()
    });
    vm.spec.template.spec = template.spec.map(|s| {
        let volumes: Vec<Volume> = s
            .volumes
            .into_iter()
            .flatten()
            .filter(|v| v.persistent_volume_claim.is_some() || v.data_volume.is_some())
            .map(|v| Volume {
                name: v.name,
                persistent_volume_claim: v.persistent_volume_claim,
                data_volume: v.data_volume,
                ..Volume::default()
            })
            .collect();
        VirtualMachineInstanceSpec {
            domain: DomainSpec {
                machine: s.domain.machine,
                cpu: s.domain.cpu,
                memory: s.domain.memory,
                resources: s.domain.resources,
                devices: Devices {
                    interfaces: s.domain.devices.interfaces,
                    ..Devices::default()
                },
                ..DomainSpec::default()
            },
            networks: s.networks,
            volumes: (!volumes.is_empty()).then_some(volumes),
            ..VirtualMachineInstanceSpec::default()
        }
    });
}

/// Runs the VM controller until `shutdown` is cancelled, its VMIs from `vmis` and the
/// DataVolumes of its templates from `dvs`.
pub async fn run(
    ctx: Arc<Context>,
    vmis: Shared<VirtualMachineInstance>,
    dvs: Shared<DataVolume>,
    shutdown: CancellationToken,
) {
    let vms = ctx.watched::<VirtualMachine>();
    tracing::info!(
        workers = ctx.config.workers,
        "starting VirtualMachine controller"
    );
    let state = Arc::new(Vms {
        ctx: ctx.clone(),
        vmis: vmis.reader(),
        vmis_ready: vmis.ready(),
        stale: Default::default(),
        dvs: dvs.reader(),
        dvs_ready: dvs.ready(),
    });
    // A DataVolume event (its phase, a delete) reconciles the VM that controls it.
    let dv_events = dvs.subscribe();
    // A VMI event (a delete included) reconciles its VM (owner reference) after the
    // store has it.
    let vmi_events = vmis.subscribe();

    // A deleted VM's back-off is dropped as its delete is seen (the controller never
    // reconciles an object that left its store).
    let (vm_reader, vm_writer) = reflector::store();
    ctx.metrics.sources.set_vms(vm_reader.clone());
    let forgetter = state.clone();
    let vm_events = reflector::reflector(
        vm_writer,
        crate::watch::cached(vms, watcher::Config::default(), "vms", &ctx.metrics.watches)
            .modify(slim_vm),
    )
    .inspect_ok(move |event| {
        if let watcher::Event::Delete(vm) = event {
            let key = reconcile::backoff_key(vm);
            forgetter.ctx.backoff.reset(&key);
            forgetter.stale.take(&key);
        }
    })
    .applied_objects();

    if !vmis.wait_ready(&shutdown).await {
        return;
    }
    Controller::for_stream(vm_events, vm_reader)
        .owns_shared_stream(vmi_events)
        .owns_shared_stream(dv_events)
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
