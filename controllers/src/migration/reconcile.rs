//! Orchestration of one migration reconcile; the decisions live in [`super::decide`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use kubevirt_api::migration::names;
use kubevirt_api::{
    API_VERSION, VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceMigration,
    VirtualMachineInstanceMigrationPhase as Phase,
};
use serde_json::{Map, Value, json};

use super::claims::{self, ClaimMove};
use super::decide::{self, Decision, MigrationConfig, Observed, ProgressMark};
use super::target;
use crate::context::{Context, FIELD_MANAGER};
use crate::vmi::reconcile::status_patch;
use crate::vmi::render::CREATED_BY_LABEL;

/// Why a migration reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    /// The migration object is malformed.
    #[error("VirtualMachineInstanceMigration has no namespace or uid")]
    NotPersisted,
    /// Reading an object failed.
    #[error("reading {what}")]
    Read {
        /// What was read.
        what: &'static str,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// Writing an object failed.
    #[error("writing {what}")]
    Write {
        /// What was written.
        what: &'static str,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// The target pod does not render (the VMI spec is unusable).
    #[error("rendering the target pod")]
    Render(#[from] target::TargetRenderError),
    /// A claim for the target cannot be made.
    #[error("target claim {claim}: {message}")]
    Claim {
        /// The claim the migration would make.
        claim: String,
        /// Why not.
        message: String,
    },
    /// Serialising a patch failed (a bug).
    #[error("serialising a patch")]
    Serialize(#[from] serde_json::Error),
}

impl MigrationError {
    /// Short reason for logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotPersisted => "NotPersisted",
            Self::Read { .. } => "ReadFailed",
            Self::Write { .. } => "WriteFailed",
            Self::Render(_) => "RenderFailed",
            Self::Claim { .. } => "ClaimFailed",
            Self::Serialize(_) => "SerializeFailed",
        }
    }

    /// Someone else wrote the object in between (resourceVersion or uid precondition).
    fn is_conflict(&self) -> bool {
        matches!(self, Self::Write { source: kube::Error::Api(s), .. } if s.code == 409)
    }
}

/// State of the migration controller.
pub struct Migrations {
    /// The shared controller context (client, events, back-off).
    pub ctx: Arc<Context>,
    /// Limits and timeouts.
    pub cfg: MigrationConfig,
    /// Last progress mark per migration uid (progressTimeout).
    progress: Mutex<HashMap<String, ProgressMark>>,
    /// Held from the capacity check to the status write of a starting migration, so
    /// that concurrent reconciles never start more than the limits allow.
    start: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Migrations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Migrations")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

impl Migrations {
    /// A controller state with the given context and configuration.
    pub fn new(ctx: Arc<Context>, cfg: MigrationConfig) -> Self {
        Self {
            ctx,
            cfg,
            progress: Mutex::new(HashMap::new()),
            start: tokio::sync::Mutex::new(()),
        }
    }

    fn progress_of(&self, uid: &str) -> Option<ProgressMark> {
        self.progress
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(uid)
            .cloned()
    }

    fn set_progress(&self, uid: &str, mark: Option<ProgressMark>) {
        let mut map = self.progress.lock().unwrap_or_else(|e| e.into_inner());
        match mark {
            Some(m) => map.insert(uid.to_string(), m),
            None => map.remove(uid),
        };
    }
}

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    }
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_not_found())
}

fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// The JSON merge patch turning `old` into `new`: changed leaves, removed keys as null,
/// nested objects recursed into (so a handler's concurrent write to a sibling field is
/// kept), arrays replaced whole. None when nothing changed.
pub fn merge_diff(old: &Value, new: &Value) -> Option<Value> {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut out = Map::new();
            for (k, nv) in n {
                match o.get(k) {
                    Some(ov) => {
                        if let Some(d) = merge_diff(ov, nv) {
                            out.insert(k.clone(), d);
                        }
                    }
                    None => {
                        out.insert(k.clone(), nv.clone());
                    }
                }
            }
            for k in o.keys() {
                if !n.contains_key(k) {
                    out.insert(k.clone(), Value::Null);
                }
            }
            (!out.is_empty()).then_some(Value::Object(out))
        }
        _ => (old != new).then(|| new.clone()),
    }
}

fn finalizer_patch(m: &VirtualMachineInstanceMigration, add: bool) -> Value {
    let mut list: Vec<String> = m.finalizers().to_vec();
    list.retain(|f| f != names::MIGRATION_FINALIZER);
    if add {
        list.push(names::MIGRATION_FINALIZER.to_string());
    }
    json!({"metadata": {"resourceVersion": m.metadata.resource_version, "finalizers": list}})
}

/// Reconciles one migration: reads it, its VMI, the VMI's pods and every migration
/// fresh, executes the decision, writes status.
#[tracing::instrument(skip_all, fields(vmim = %vmim.name_any(), ns = vmim.namespace().unwrap_or_default()))]
pub async fn reconcile(
    vmim: Arc<VirtualMachineInstanceMigration>,
    state: Arc<Migrations>,
) -> Result<Action, MigrationError> {
    let ctx = state.ctx.clone();
    let ns = vmim.namespace().ok_or(MigrationError::NotPersisted)?;
    let name = vmim.name_any();
    let client = ctx.client.clone();
    let vmims = Api::<VirtualMachineInstanceMigration>::namespaced(client.clone(), &ns);
    let vmis = Api::<VirtualMachineInstance>::namespaced(client.clone(), &ns);
    let pods = Api::<Pod>::namespaced(client.clone(), &ns);
    let read = |what| move |source| MigrationError::Read { what, source };

    let Some(mut vmim) = vmims.get_opt(&name).await.map_err(read("migration"))? else {
        if let Some(uid) = vmim.uid() {
            state.set_progress(&uid, None);
            ctx.migration_phases.forget(&uid);
        }
        return Ok(Action::await_change());
    };
    let uid = vmim.uid().ok_or(MigrationError::NotPersisted)?;
    let phase = vmim.status.as_ref().map(|s| s.phase).unwrap_or_default();
    if ctx.migration_phases.changed(&uid, phase)
        && let Some(secs) = super::decide::seconds_since_creation(&vmim, phase)
    {
        ctx.metrics.migration_phase_transition(phase.as_str(), secs);
    }
    let starting = matches!(phase, Phase::Unset | Phase::Pending)
        && vmim.metadata.deletion_timestamp.is_none();
    // Capacity is checked and taken under one lock: two Pending migrations reconciled
    // at once must not both see the last free slot.
    let _slot = if starting {
        Some(state.start.lock().await)
    } else {
        None
    };

    let vmi = vmis
        .get_opt(&vmim.spec.vmi_name)
        .await
        .map_err(read("VirtualMachineInstance"))?;
    let selector = match vmi.as_ref().and_then(|v| v.uid()) {
        Some(vmi_uid) => format!("{CREATED_BY_LABEL}={vmi_uid}"),
        None => format!("{}={uid}", names::MIGRATION_JOB_LABEL),
    };
    let mut pod_list = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(read("launcher pods"))?
        .items;
    let all = match &ctx.config.namespace {
        Some(ns) => Api::<VirtualMachineInstanceMigration>::namespaced(client.clone(), ns),
        None => Api::<VirtualMachineInstanceMigration>::all(client.clone()),
    };
    let migrations = all
        .list(&ListParams::default())
        .await
        .map_err(read("migrations"))?
        .items;
    // The claims this migration made for its target (none unless it copies a claim).
    let claim_list = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns)
        .list(&ListParams::default().labels(&format!("{}={uid}", names::MIGRATION_CLAIM_LABEL)))
        .await
        .map_err(read("migration claims"))?
        .items;
    let progress = state.progress_of(&uid);
    let d = decide::decide(
        &Observed {
            vmim: &vmim,
            vmi: vmi.as_ref(),
            pods: &pod_list,
            claims: &claim_list,
            migrations: &migrations,
            progress: progress.as_ref(),
            now: Timestamp::now(),
        },
        &state.cfg,
    );
    tracing::debug!(phase = ?d.status.phase, create = d.create_target_pod, deletes = d.delete_pods.len(), "decided");
    let regarding = vmim.object_ref(&());

    let executed = execute(&state, &mut vmim, vmi.as_ref(), &mut pod_list, &d).await;
    for (warning, reason, note) in &d.events {
        let type_ = if *warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        ctx.event(&regarding, type_, reason, note.clone()).await;
    }
    executed?;
    state.set_progress(&uid, d.progress.clone());
    ctx.backoff.reset(&uid);
    Ok(match d.requeue {
        Some(after) => Action::requeue(after),
        None => Action::requeue(ctx.config.resync),
    })
}

/// Executes `d` in an order that is safe to interrupt: the migration status is written
/// last, so a failed step is decided again from the same phase.
async fn execute(
    state: &Migrations,
    vmim: &mut VirtualMachineInstanceMigration,
    vmi: Option<&VirtualMachineInstance>,
    pod_list: &mut Vec<Pod>,
    d: &Decision,
) -> Result<(), MigrationError> {
    let ctx = &state.ctx;
    let ns = vmim.namespace().ok_or(MigrationError::NotPersisted)?;
    let name = vmim.name_any();
    let client = ctx.client.clone();
    let vmims = Api::<VirtualMachineInstanceMigration>::namespaced(client.clone(), &ns);
    let vmis = Api::<VirtualMachineInstance>::namespaced(client.clone(), &ns);
    let pods = Api::<Pod>::namespaced(client, &ns);
    let write = |what| move |source| MigrationError::Write { what, source };

    if d.add_finalizer {
        *vmim = vmims
            .patch(
                &name,
                &patch_params(),
                &Patch::Merge(&finalizer_patch(vmim, true)),
            )
            .await
            .map_err(write("migration finalizer"))?;
    }
    if d.create_target_pod
        && let Some(vmi) = vmi
    {
        // The claims first: the pod would wait for them anyway, and a pod whose claim
        // cannot be made should never exist.
        for m in &d.create_claims {
            create_claim(ctx, vmim, m).await?;
        }
        let desired = target::target_pod(vmi, vmim, &ctx.config.launcher, &d.create_claims)?;
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PostParams::default()
        };
        match pods.create(&params, &desired).await {
            Ok(pod) => {
                ctx.metrics.pod_action("create", true);
                let pod_name = pod.name_any();
                tracing::info!(pod = %pod_name, "created migration target pod");
                ctx.event(
                    &vmim.object_ref(&()),
                    EventType::Normal,
                    decide::reasons::SUCCESSFUL_CREATE,
                    format!("Created migration target pod {pod_name}"),
                )
                .await;
                pod_list.push(pod);
            }
            Err(e) => {
                ctx.metrics.pod_action("create", false);
                ctx.event(
                    &vmim.object_ref(&()),
                    EventType::Warning,
                    "FailedCreate",
                    format!("Error creating migration target pod: {e}"),
                )
                .await;
                return Err(MigrationError::Write {
                    what: "target pod",
                    source: e,
                });
            }
        }
    }
    if let (Some(p), Some(vmi)) = (&d.adopt_target_pod, vmi) {
        // The uid in the patch is a precondition: only this very pod changes hands.
        let owner = vmi.controller_owner_ref(&()).map(|mut o| {
            o.api_version = API_VERSION.into();
            o.block_owner_deletion = Some(true);
            o
        });
        let patch = json!({"metadata": {"uid": p.uid, "ownerReferences": owner.into_iter().collect::<Vec<_>>()}});
        match pods
            .patch(&p.name, &patch_params(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => tracing::info!(pod = %p.name, "target pod handed to the VMI"),
            Err(e) if is_not_found(&e) => {}
            Err(source) => {
                return Err(MigrationError::Write {
                    what: "target pod owner",
                    source,
                });
            }
        }
    }
    if let (Some(new), Some(vmi)) = (&d.vmi_status, vmi) {
        let old = serde_json::to_value(vmi.status.clone().unwrap_or_default())?;
        if let Some(diff) = merge_diff(&old, &serde_json::to_value(new)?) {
            // Guarded by resourceVersion: conditions and migrationState were decided on
            // this version, and virt-handler writes the same object.
            let patch = json!({"metadata": {"resourceVersion": vmi.metadata.resource_version},
                               "status": diff});
            vmis.patch_status(&vmi.name_any(), &patch_params(), &Patch::Merge(&patch))
                .await
                .map_err(write("VMI status"))?;
        }
    }
    if let (false, Some(vmi)) = (d.vmi_labels.is_empty(), vmi) {
        let labels: Map<String, Value> = d
            .vmi_labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone().map_or(Value::Null, Value::String)))
            .collect();
        let patch = json!({"metadata": {"labels": labels}});
        match vmis
            .patch(&vmi.name_any(), &patch_params(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(source) => {
                return Err(MigrationError::Write {
                    what: "VMI labels",
                    source,
                });
            }
        }
    }
    if let (false, Some(vmi)) = (d.claim_moves.is_empty(), vmi) {
        move_claims(ctx, vmim, vmi, &d.claim_moves).await?;
    }
    let claim_api = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &ns);
    for c in &d.delete_claims {
        match claim_api.delete(c, &DeleteParams::default()).await {
            Ok(_) => tracing::info!(claim = %c, "deleted the target claim of a failed migration"),
            Err(e) if is_not_found(&e) => {}
            Err(source) => {
                return Err(MigrationError::Write {
                    what: "target claim deletion",
                    source,
                });
            }
        }
    }
    for p in &d.delete_pods {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(p.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match pods.delete(&p.name, &params).await {
            Ok(_) => {
                ctx.metrics.pod_action("delete", true);
                tracing::info!(pod = %p.name, "deleted launcher pod");
            }
            Err(e) if is_not_found(&e) || is_conflict(&e) => {}
            Err(source) => {
                ctx.metrics.pod_action("delete", false);
                return Err(MigrationError::Write {
                    what: "launcher pod deletion",
                    source,
                });
            }
        }
    }
    let old = vmim.status.clone().unwrap_or_default();
    if d.status != old {
        let patch = status_patch(vmim.metadata.resource_version.as_deref(), &old, &d.status)?;
        *vmim = vmims
            .patch_status(&name, &patch_params(), &Patch::Merge(&patch))
            .await
            .map_err(write("migration status"))?;
        if d.status.phase != old.phase {
            tracing::info!(
                from = old.phase.as_str(),
                to = d.status.phase.as_str(),
                "migration phase"
            );
        }
    }
    if d.remove_finalizer {
        match vmims
            .patch(
                &name,
                &patch_params(),
                &Patch::Merge(&finalizer_patch(vmim, false)),
            )
            .await
        {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(source) => {
                return Err(MigrationError::Write {
                    what: "migration finalizer",
                    source,
                });
            }
        }
    }
    Ok(())
}

/// Makes the claim `m.to` for the target, a copy of `m.from`'s shape; one that exists
/// already must be this migration's (a repeated reconcile), never a user's.
async fn create_claim(
    ctx: &Context,
    vmim: &VirtualMachineInstanceMigration,
    m: &ClaimMove,
) -> Result<(), MigrationError> {
    let ns = vmim.namespace().ok_or(MigrationError::NotPersisted)?;
    let uid = vmim.uid().ok_or(MigrationError::NotPersisted)?;
    let api = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &ns);
    let fail = |message: String| MigrationError::Claim {
        claim: m.to.clone(),
        message,
    };
    let source = api
        .get_opt(&m.from)
        .await
        .map_err(|source| MigrationError::Read {
            what: "source claim",
            source,
        })?
        .ok_or_else(|| fail(format!("its source claim {} does not exist", m.from)))?;
    let desired = claims::destination_claim(&source, m, vmim);
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PostParams::default()
    };
    match api.create(&params, &desired).await {
        Ok(_) => {
            tracing::info!(claim = %m.to, from = %m.from, volume = %m.volume, "created the target claim");
            ctx.event(
                &vmim.object_ref(&()),
                EventType::Normal,
                decide::reasons::SUCCESSFUL_CREATE,
                format!(
                    "Created claim {} for volume {} on the target node (copy of {})",
                    m.to, m.volume, m.from
                ),
            )
            .await;
            Ok(())
        }
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let existing = api
                .get_opt(&m.to)
                .await
                .map_err(|source| MigrationError::Read {
                    what: "target claim",
                    source,
                })?;
            match existing {
                Some(c) if claims::made_by(&c, &uid) => Ok(()),
                _ => Err(fail(
                    "a claim of that name exists and was not made by this migration".into(),
                )),
            }
        }
        Err(e) => {
            ctx.event(
                &vmim.object_ref(&()),
                EventType::Warning,
                "FailedCreate",
                format!("Error creating claim {} for volume {}: {e}", m.to, m.volume),
            )
            .await;
            Err(MigrationError::Write {
                what: "target claim",
                source: e,
            })
        }
    }
}

/// The guest runs on the target and its copied disks are on the new claims: the VMI and
/// its VM name them (so a restart finds the data), each new claim is handed over (no
/// longer labelled or owned by the migration: the VM's, as the old one was the user's),
/// and each old claim is deleted or kept as the VMI's policy says. Every step is
/// idempotent: an interrupted success is completed by the next reconcile.
async fn move_claims(
    ctx: &Context,
    vmim: &VirtualMachineInstanceMigration,
    vmi: &VirtualMachineInstance,
    moves: &[ClaimMove],
) -> Result<(), MigrationError> {
    let ns = vmim.namespace().ok_or(MigrationError::NotPersisted)?;
    let client = ctx.client.clone();
    let write = |what| move |source| MigrationError::Write { what, source };
    let vmis = Api::<VirtualMachineInstance>::namespaced(client.clone(), &ns);
    // Fresh: the status write before this changed the resourceVersion.
    if let Some(fresh) =
        vmis.get_opt(&vmi.name_any())
            .await
            .map_err(|source| MigrationError::Read {
                what: "VirtualMachineInstance",
                source,
            })?
    {
        let spec = serde_json::to_value(&fresh.spec)?;
        if let Some(volumes) = claims::moved_volumes(spec.get("volumes"), moves) {
            let patch = json!({"metadata": {"resourceVersion": fresh.metadata.resource_version},
                               "spec": {"volumes": volumes}});
            vmis.patch(&fresh.name_any(), &patch_params(), &Patch::Merge(&patch))
                .await
                .map_err(write("VMI volumes"))?;
            tracing::info!(?moves, "VMI volumes point at the migrated claims");
        }
    }
    let vm_name = vmi
        .owner_references()
        .iter()
        .find(|o| o.kind == "VirtualMachine" && o.controller == Some(true))
        .map(|o| (o.name.clone(), o.uid.clone()));
    if let Some((vm_name, vm_uid)) = vm_name {
        let vms = Api::<VirtualMachine>::namespaced(client.clone(), &ns);
        let vm = vms
            .get_opt(&vm_name)
            .await
            .map_err(|source| MigrationError::Read {
                what: "VirtualMachine",
                source,
            })?;
        if let Some(vm) = vm.filter(|vm| vm.metadata.uid.as_deref() == Some(vm_uid.as_str())) {
            let spec = serde_json::to_value(&vm.spec)?;
            if let Some(volumes) =
                claims::moved_volumes(spec.pointer("/template/spec/volumes"), moves)
            {
                let patch = json!({"metadata": {"resourceVersion": vm.metadata.resource_version},
                                   "spec": {"template": {"spec": {"volumes": volumes}}}});
                vms.patch(&vm_name, &patch_params(), &Patch::Merge(&patch))
                    .await
                    .map_err(write("VM template volumes"))?;
                tracing::info!(vm = %vm_name, ?moves, "VM template points at the migrated claims");
            }
        }
    }
    let claim_api = Api::<PersistentVolumeClaim>::namespaced(client, &ns);
    let release = json!({"metadata": {"labels": {names::MIGRATION_CLAIM_LABEL: null},
                                      "ownerReferences": null}});
    let policy = claims::source_policy(vmi);
    for m in moves {
        match claim_api
            .patch(&m.to, &patch_params(), &Patch::Merge(&release))
            .await
        {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {
                tracing::warn!(claim = %m.to, "the migrated claim is gone");
            }
            Err(source) => {
                return Err(MigrationError::Write {
                    what: "migrated claim hand-over",
                    source,
                });
            }
        }
        if m.from == m.to {
            continue;
        }
        let source = claim_api
            .get_opt(&m.from)
            .await
            .map_err(|source| MigrationError::Write {
                what: "source claim lookup",
                source,
            })?;
        if !claims::deletes_source(policy, source.as_ref()) {
            if source.is_some() {
                ctx.event(
                    &vmim.object_ref(&()),
                    EventType::Normal,
                    decide::reasons::SUCCESSFUL_MIGRATION,
                    format!(
                        "Volume {} now on claim {}; claim {} kept (it is not one kubevirt-rs made; \
                         {}: Delete on the VM's template to have such claims deleted)",
                        m.volume,
                        m.to,
                        m.from,
                        names::MIGRATED_CLAIM_POLICY_ANNOTATION
                    ),
                )
                .await;
            }
            continue;
        }
        match claim_api.delete(&m.from, &DeleteParams::default()).await {
            Ok(_) => {
                tracing::info!(claim = %m.from, "deleted the source claim of a migrated volume");
                ctx.event(
                    &vmim.object_ref(&()),
                    EventType::Normal,
                    decide::reasons::SUCCESSFUL_MIGRATION,
                    format!(
                        "Volume {} now on claim {}; claim {} deleted",
                        m.volume, m.to, m.from
                    ),
                )
                .await;
            }
            Err(e) if is_not_found(&e) => {}
            Err(source) => {
                return Err(MigrationError::Write {
                    what: "source claim deletion",
                    source,
                });
            }
        }
    }
    Ok(())
}

/// Retry policy: conflicts retry at once, other errors back off per object.
pub fn error_policy(
    vmim: Arc<VirtualMachineInstanceMigration>,
    err: &MigrationError,
    state: Arc<Migrations>,
) -> Action {
    if err.is_conflict() {
        return Action::requeue(Duration::from_millis(50));
    }
    let key = vmim.uid().unwrap_or_else(|| vmim.name_any());
    let delay = state.ctx.backoff.next_delay_after(&key, err);
    tracing::warn!(vmim = %vmim.name_any(), error = %crate::vmi::reconcile::error_chain(err), reason = err.reason(), retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::merge_diff;

    #[test]
    fn merge_diff_recurses_into_objects_and_nulls_removed_keys() {
        let old = json!({"phase": "Running", "migrationState": {"migrationUid": "a",
            "completed": true, "endTimestamp": "t"}, "conditions": [{"type": "Ready"}]});
        let new = json!({"phase": "Running", "migrationState": {"migrationUid": "b",
            "targetNode": "n2"}, "conditions": [{"type": "Ready"}]});
        assert_eq!(
            merge_diff(&old, &new),
            Some(
                json!({"migrationState": {"migrationUid": "b", "targetNode": "n2",
                "completed": null, "endTimestamp": null}})
            )
        );
        assert_eq!(merge_diff(&old, &old), None);
    }
}
