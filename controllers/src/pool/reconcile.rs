//! Orchestration of one pool reconcile; the decisions live in [`super::decide`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use kubevirt_api::cdi::DataVolume;
use kubevirt_api::pool::{REVISION_LABEL, VirtualMachinePool};
use kubevirt_api::{VirtualMachine, VirtualMachineInstance};
use serde_json::json;

use super::Pools;
use super::decide::{self, Doomed, Member};
use crate::context::FIELD_MANAGER;
use crate::replicas::Failure;

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The pool has no namespace or uid (a malformed object).
    #[error("VirtualMachinePool has no namespace or uid")]
    MissingMeta,
    /// Reading objects failed.
    #[error("reading {what}: {source}")]
    Read {
        /// What was read.
        what: &'static str,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// Creating, deleting or updating VMs failed; the ReplicaFailure condition says so.
    #[error("{reason}: {message}")]
    Replicas {
        /// FailedCreate, FailedDelete or FailedUpdate.
        reason: String,
        /// The error.
        message: String,
    },
    /// Writing the status failed.
    #[error("writing the status: {0}")]
    Status(#[source] kube::Error),
    /// Serialising the status failed (a bug).
    #[error("serialising the status: {0}")]
    Serialize(#[from] serde_json::Error),
}

impl ReconcileError {
    /// Short reason for logs and the back-off.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::MissingMeta => "MissingMeta",
            Self::Read { .. } => "ReadFailed",
            Self::Replicas { .. } => "ReplicaFailure",
            Self::Status(_) => "FailedStatusUpdate",
            Self::Serialize(_) => "SerializeFailed",
        }
    }
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_not_found())
}

fn is_already_exists(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_already_exists())
}

/// How soon a pool whose own writes the VM cache has not shown yet looks again (the VM's
/// watch event reconciles it anyway).
const PENDING_RECHECK: Duration = Duration::from_secs(2);

fn write_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    }
}

fn failed(reason: &str, e: &kube::Error) -> Failure {
    Failure {
        reason: reason.into(),
        message: e.to_string(),
    }
}

/// Reconciles one pool: its VMs from the controller's cache (trusted only once every
/// create and delete of ours has been seen there, [`crate::expectations`]) and their VMIs
/// from the shared cache, the plan carried out, the status written.
#[tracing::instrument(skip_all, fields(vmpool = %p.name_any(), ns = p.namespace().unwrap_or_default()))]
pub async fn reconcile(
    p: Arc<VirtualMachinePool>,
    state: Arc<Pools>,
) -> Result<Action, ReconcileError> {
    let ctx = &state.ctx;
    let (Some(ns), Some(uid)) = (p.namespace(), p.uid()) else {
        return Err(ReconcileError::MissingMeta);
    };
    if !state.vms_ready.wait(crate::watch::READY_WAIT).await
        || !state.vmis_ready.wait(crate::watch::READY_WAIT).await
    {
        return Ok(Action::requeue(crate::watch::READY_WAIT));
    }
    // Going: the garbage collector deletes the VMs it controls.
    if p.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    if let Some(wait) = state
        .expectations
        .wait_for_cache(&uid, "VMs", PENDING_RECHECK)
    {
        return Ok(Action::requeue(wait));
    }
    let cached = state.vms.state();
    let vms = decide::owned(&p, cached.iter().map(AsRef::as_ref));
    let vmis: Vec<Option<Arc<VirtualMachineInstance>>> = vms
        .iter()
        .map(|vm| state.vmis.get(&ObjectRef::new(&vm.name_any()).within(&ns)))
        .collect();
    let members: Vec<Member<'_>> = vms
        .iter()
        .zip(&vmis)
        .map(|(vm, vmi)| Member {
            vm,
            vmi: vmi.as_deref(),
        })
        .collect();
    let nodes = if decide::needs_nodes(&p) {
        node_labels(&ctx.client).await?
    } else {
        BTreeMap::new()
    };
    let plan = decide::plan(&p, &members, &nodes, Timestamp::now(), rand::random());
    let regarding = p.object_ref(&());
    let vm_api = Api::<VirtualMachine>::namespaced(ctx.client.clone(), &ns);
    let mut failure = None;

    // Replacements and scale-in first: a healed VM's ordinal is made again once it is gone.
    let mut doomed: Vec<(&Doomed, bool, &str)> = Vec::new();
    doomed.extend(plan.heal.iter().map(|d| (d, false, "autohealing")));
    doomed.extend(
        plan.scale_in
            .iter()
            .map(|d| (d, plan.preserve_state, "scale-in")),
    );
    if !doomed.is_empty() {
        state.expectations.expect_deletions(
            &uid,
            doomed.iter().map(|(d, _, _)| d.uid.clone()),
            Instant::now(),
        );
    }
    for (d, preserve, why) in doomed {
        if preserve
            && let Some(vm) = vms
                .iter()
                .find(|v| v.metadata.uid.as_deref() == Some(&d.uid))
            && let Err(e) = release_data_volumes(ctx.client.clone(), &ns, vm).await
        {
            state.expectations.deletion_observed(&uid, &d.uid);
            failure = Some(failed("FailedDelete", &e));
            continue;
        }
        match delete(&vm_api, d).await {
            Ok(()) => {
                tracing::info!(vm = %d.name, why, "deleted VM");
                ctx.event(
                    &regarding,
                    EventType::Normal,
                    "SuccessfulDelete",
                    format!(
                        "Deleted VM {ns}/{} with uid {} from pool ({why})",
                        d.name, d.uid
                    ),
                )
                .await;
            }
            Err(e) if is_not_found(&e) => state.expectations.deletion_observed(&uid, &d.uid),
            Err(e) => {
                state.expectations.deletion_observed(&uid, &d.uid);
                ctx.event(
                    &regarding,
                    EventType::Warning,
                    "FailedDelete",
                    format!("Error deleting virtual machine {ns}/{}: {e}", d.name),
                )
                .await;
                failure = Some(failed("FailedDelete", &e));
            }
        }
    }

    if plan.create > 0 {
        // Names against every VM of the namespace, read now: another VM (not the pool's,
        // or one the cache has not shown) may hold an ordinal's name.
        let taken: BTreeSet<String> = vm_api
            .list_metadata(&ListParams::default())
            .await
            .map_err(|source| ReconcileError::Read {
                what: "VirtualMachines",
                source,
            })?
            .items
            .into_iter()
            .filter_map(|m| m.metadata.name)
            .collect();
        let revision = decide::revision(&p);
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..PostParams::default()
        };
        for index in decide::free_ordinals(&p.name_any(), &taken, plan.create) {
            let Some(vm) = decide::desired_vm(&p, index, &revision) else {
                break;
            };
            state.expectations.expect_creation(&uid, Instant::now());
            match vm_api.create(&params, &vm).await {
                Ok(created) => {
                    tracing::info!(vm = %created.name_any(), "created VM");
                    ctx.event(
                        &regarding,
                        EventType::Normal,
                        "SuccessfulCreate",
                        format!("Created VM {ns}/{}", created.name_any()),
                    )
                    .await;
                }
                Err(e) => {
                    state.expectations.creation_observed(&uid);
                    if is_already_exists(&e) {
                        // Taken meanwhile: the next round picks another ordinal.
                        continue;
                    }
                    tracing::warn!(vm = %vm.name_any(), error = %e, "creating a VM failed");
                    ctx.event(
                        &regarding,
                        EventType::Warning,
                        "FailedCreate",
                        format!("Error creating VM: {e}"),
                    )
                    .await;
                    failure = Some(failed("FailedCreate", &e));
                    break;
                }
            }
        }
    }

    // Updates: each outdated VM rewritten from the template (read fresh and replaced at
    // its version, so a concurrent change is never overwritten blindly), then the VMIs
    // restarted — in that order, so the VM controller makes each new VMI from the new spec.
    let revision = decide::revision(&p);
    for name in &plan.update {
        if let Err(e) = update_vm(&vm_api, &p, name, &revision).await {
            tracing::warn!(vm = %name, error = %e, "updating a VM failed");
            failure = Some(failed("FailedUpdate", &e));
        }
    }
    if failure.is_none() && !plan.restart.is_empty() {
        let vmi_api = Api::<VirtualMachineInstance>::namespaced(ctx.client.clone(), &ns);
        for d in &plan.restart {
            match delete(&vmi_api, d).await {
                Ok(()) => {
                    ctx.event(
                        &regarding,
                        EventType::Normal,
                        "SuccessfulUpdate",
                        format!("Restarted VMI {ns}/{} to apply the pool's template", d.name),
                    )
                    .await;
                }
                Err(e) if is_not_found(&e) => {}
                Err(e) => failure = Some(failed("FailedUpdate", &e)),
            }
        }
    }

    let status = decide::status(&p, &members, failure.as_ref(), Timestamp::now());
    if p.status.as_ref() != Some(&status) {
        let patch = crate::replicas::status_patch(p.status.as_ref(), &status)?;
        Api::<VirtualMachinePool>::namespaced(ctx.client.clone(), &ns)
            .patch_status(&p.name_any(), &write_params(), &Patch::Merge(&patch))
            .await
            .map_err(ReconcileError::Status)?;
    }
    if let Some(Failure { reason, message }) = failure {
        return Err(ReconcileError::Replicas { reason, message });
    }
    ctx.backoff.reset(&uid);
    Ok(Action::requeue(plan.wait.unwrap_or(ctx.config.resync)))
}

/// Deletes `d` if it is still the object of that uid.
async fn delete<K>(api: &Api<K>, d: &Doomed) -> Result<(), kube::Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(d.uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    api.delete(&d.name, &params).await.map(|_| ())
}

/// The VM `name` rewritten from the pool's template: its labels and annotations, and the
/// spec of its ordinal.
async fn update_vm(
    api: &Api<VirtualMachine>,
    p: &VirtualMachinePool,
    name: &str,
    revision: &str,
) -> Result<(), kube::Error> {
    let Some(index) = kubevirt_api::pool::ordinal(&p.name_any(), name) else {
        return Ok(());
    };
    let Some(desired) = decide::desired_vm(p, index, revision) else {
        return Ok(());
    };
    let Some(mut vm) = api.get_opt(name).await? else {
        return Ok(());
    };
    if vm.labels().get(REVISION_LABEL).map(String::as_str) == Some(revision) {
        return Ok(());
    }
    let mut labels = vm.metadata.labels.take().unwrap_or_default();
    labels.extend(desired.metadata.labels.unwrap_or_default());
    vm.metadata.labels = Some(labels);
    if let Some(a) = desired.metadata.annotations {
        vm.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .extend(a);
    }
    vm.spec = desired.spec;
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    api.replace(name, &params, &vm).await?;
    tracing::info!(vm = %name, revision, "updated VM to the pool's template");
    Ok(())
}

/// statePreservation: the VM's DataVolumes no longer name it as owner, so the garbage
/// collector keeps them (and their claims) when the VM goes; the VM of the same ordinal
/// finds them again by name.
async fn release_data_volumes(
    client: kube::Client,
    ns: &str,
    vm: &VirtualMachine,
) -> Result<(), kube::Error> {
    let api = Api::<DataVolume>::namespaced(client, ns);
    let Some(uid) = vm.metadata.uid.as_deref() else {
        return Ok(());
    };
    for t in vm.spec.data_volume_templates.iter().flatten() {
        let Some(name) = t.metadata.name.as_deref() else {
            continue;
        };
        let Some(dv) = api.get_opt(name).await? else {
            continue;
        };
        let owners: Vec<_> = dv
            .owner_references()
            .iter()
            .filter(|o| o.uid != uid)
            .cloned()
            .collect();
        if owners.len() == dv.owner_references().len() {
            continue;
        }
        let patch = json!({"metadata": {
            "ownerReferences": owners,
            "resourceVersion": dv.resource_version(),
        }});
        api.patch(name, &write_params(), &Patch::Merge(&patch))
            .await?;
        tracing::info!(dv = %name, vm = %vm.name_any(), "kept DataVolume for the VM's ordinal");
    }
    Ok(())
}

/// Node name → labels (only read when a selection policy matches nodes).
async fn node_labels(
    client: &kube::Client,
) -> Result<BTreeMap<String, BTreeMap<String, String>>, ReconcileError> {
    let nodes = Api::<Node>::all(client.clone())
        .list_metadata(&ListParams::default())
        .await
        .map_err(|source| ReconcileError::Read {
            what: "Nodes",
            source,
        })?;
    Ok(nodes
        .items
        .into_iter()
        .filter_map(|n| Some((n.metadata.name?, n.metadata.labels.unwrap_or_default())))
        .collect())
}

/// Failed reconciles back off per pool.
pub fn error_policy(p: Arc<VirtualMachinePool>, err: &ReconcileError, state: Arc<Pools>) -> Action {
    let key = p.uid().unwrap_or_else(|| p.name_any());
    let delay = state.ctx.backoff.next_delay_after(&key, err);
    tracing::warn!(vmpool = %p.name_any(), error = %err, reason = err.reason(), retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}
