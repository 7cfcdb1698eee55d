//! Volume hotplug of a VM (issue 44), as KubeVirt's VM controller does it: the requests
//! virt-apiserver queued in `status.volumeRequests` (its `addvolume`/`removevolume` under
//! the `HotplugVolumes` gate) are applied to the VM's template, then dropped from its status;
//! and a running VMI's hotplugged volumes follow the template (added and removed live, no
//! restart). What is applied is what [`kubevirt_api::hotplug`] says a request means, the
//! same functions virt-apiserver checks requests with.

use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use kubevirt_api::hotplug;
use kubevirt_api::{VirtualMachine, VirtualMachineInstance, VirtualMachineInstancePhase};
use serde_json::json;

use super::decide::ObservedVmi;
use super::reconcile::ReconcileError;
use crate::context::{Context, FIELD_MANAGER};

/// Applies the VM's queued volume requests to its template (one update) and drops them
/// from its status. `true` when it changed the VM (the caller looks again, fresh).
pub async fn apply_requests(
    ctx: &Context,
    vms: &Api<VirtualMachine>,
    cached: &VirtualMachine,
) -> Result<bool, ReconcileError> {
    let queued = |vm: &VirtualMachine| {
        vm.status
            .as_ref()
            .and_then(|s| s.volume_requests.clone())
            .unwrap_or_default()
    };
    if queued(cached).is_empty() {
        return Ok(false);
    }
    // The cached VM keeps only a slimmed template (`slim_vm`).
    let name = cached.name_any();
    let Some(mut vm) = vms
        .get_opt(&name)
        .await
        .map_err(|source| ReconcileError::Read {
            what: "VirtualMachine",
            source,
        })?
    else {
        return Ok(false);
    };
    let pending = queued(&vm);
    if pending.is_empty() {
        return Ok(false);
    }
    let template = vm.spec.template.spec.clone().unwrap_or_default();
    let mut spec = template.clone();
    for r in &pending {
        match hotplug::apply(&spec, r) {
            Ok(s) => spec = s,
            // Checked by virt-apiserver when queued; one that no longer applies is dropped.
            Err(e) => {
                tracing::warn!(error = %e, "dropping a volume request that does not apply");
                ctx.event(
                    &vm.object_ref(&()),
                    EventType::Warning,
                    "FailedVolumeRequest",
                    e.to_string(),
                )
                .await;
            }
        }
    }
    if spec != template {
        vm.spec.template.spec = Some(spec);
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PostParams::default()
        };
        // Guarded by the resourceVersion read: a request queued meanwhile is a 409 and a
        // fresh look.
        vm = vms
            .replace(&name, &params, &vm)
            .await
            .map_err(ReconcileError::Hotplug)?;
        tracing::info!(
            requests = pending.len(),
            "applied volume requests to the template"
        );
    }
    // Dropped from the status of the VM just written, so that a request queued since is a
    // conflict rather than lost.
    let patch = json!({
        "metadata": {"resourceVersion": vm.metadata.resource_version},
        "status": {"volumeRequests": null},
    });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    vms.patch_status(&name, &params, &Patch::Merge(&patch))
        .await
        .map_err(ReconcileError::Status)?;
    Ok(true)
}

/// Brings a running VMI's hotplugged volumes in line with its VM's template
/// ([`hotplug::sync_hotplugged`]): only while it runs, only once the template changed since
/// it started (its VM generation), never a volume that is not hotplugged nor one hotplugged
/// into the VMI alone.
pub async fn sync_vmi(
    ctx: &Context,
    vms: &Api<VirtualMachine>,
    vmis: &Api<VirtualMachineInstance>,
    cached: &VirtualMachine,
    vmi: &VirtualMachineInstance,
    fresh: bool,
) -> Result<(), ReconcileError> {
    let observed = ObservedVmi::from_vmi(vmi);
    if observed.phase != VirtualMachineInstancePhase::Running
        || observed.deleting
        || observed.migrating
        || observed.vm_generation.is_none()
        || observed.vm_generation == cached.metadata.generation
    {
        return Ok(());
    }
    let vm = if fresh {
        cached.clone()
    } else {
        match vms.get_opt(&cached.name_any()).await {
            Ok(Some(vm)) => vm,
            Ok(None) => return Ok(()),
            Err(source) => {
                return Err(ReconcileError::Read {
                    what: "VirtualMachine",
                    source,
                });
            }
        }
    };
    let Some(template) = vm.spec.template.spec.as_ref() else {
        return Ok(());
    };
    let ephemeral = hotplug::ephemeral_names(
        vmi.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(hotplug::EPHEMERAL_ANNOTATION))
            .map(String::as_str),
    );
    let synced = hotplug::sync_hotplugged(&vmi.spec, template, &ephemeral);
    if synced == vmi.spec {
        return Ok(());
    }
    let names = |s: &kubevirt_api::VirtualMachineInstanceSpec| -> Vec<String> {
        hotplug::hotplugged(s)
            .iter()
            .map(|(v, _)| v.name.clone())
            .collect()
    };
    let (before, after) = (names(&vmi.spec), names(&synced));
    // The VMI as decided on, or 409 and a fresh look.
    let patch = json!({
        "metadata": {"resourceVersion": vmi.metadata.resource_version},
        "spec": {
            "volumes": synced.volumes,
            "domain": {"devices": {"disks": synced.domain.devices.disks}},
        },
    });
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    vmis.patch(&vmi.name_any(), &params, &Patch::Merge(&patch))
        .await
        .map_err(ReconcileError::Hotplug)?;
    let added: Vec<&String> = after.iter().filter(|n| !before.contains(n)).collect();
    let removed: Vec<&String> = before.iter().filter(|n| !after.contains(n)).collect();
    tracing::info!(?added, ?removed, "hotplugged volumes carried to the VMI");
    ctx.event(
        &vm.object_ref(&()),
        EventType::Normal,
        "VolumesHotplugged",
        format!("hotplugged volumes of the running instance: added {added:?}, removed {removed:?}"),
    )
    .await;
    Ok(())
}
