//! Orchestration of one VM reconcile; the decisions live in [`super::decide`].

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use kubevirt_api::cdi::DataVolume;
use kubevirt_api::{VirtualMachine, VirtualMachineInstance, VirtualMachineStatus};
use serde_json::{Value, json};

use super::Vms;
use super::decide::{self, ObservedVmi, Outcome, StatusInputs, VmiAction};
use super::instancetype::{self, Captured, InstancetypeError};
use super::live;
use super::render::{self, RenderError};
use crate::context::FIELD_MANAGER;

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The VM object is malformed.
    #[error("VirtualMachine has no namespace")]
    MissingNamespace,
    /// Reading an object failed.
    #[error("reading {what}: {source}")]
    Read {
        /// What was read.
        what: &'static str,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// Creating the VMI failed.
    #[error("creating the VMI: {0}")]
    Create(#[source] kube::Error),
    /// The VMI cannot be rendered from the template.
    #[error(transparent)]
    Render(#[from] RenderError),
    /// Deleting the VMI failed.
    #[error("deleting the VMI: {0}")]
    Delete(#[source] kube::Error),
    /// Writing the VM status failed.
    #[error("writing the VM status: {0}")]
    Status(#[source] kube::Error),
    /// Creating or deleting the VMI failed; the Failure condition says so too.
    #[error("{reason}: {message}")]
    Action {
        /// FailedCreate or FailedDelete.
        reason: String,
        /// The error.
        message: String,
    },
    /// Serialising the status failed (a bug).
    #[error("serialising the VM status: {0}")]
    Serialize(#[from] serde_json::Error),
    /// The VM's instance type or preference could not be captured or applied.
    #[error("{0}")]
    Instancetype(#[from] InstancetypeError),
    /// Reading, creating or deleting the VM's start revision failed.
    #[error("{what} ControllerRevision {name}: {source}")]
    Revision {
        /// reading, creating or deleting.
        what: &'static str,
        /// The revision.
        name: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// Carrying a live update to the VMI failed.
    #[error("updating the VMI live: {0}")]
    LiveUpdate(#[source] kube::Error),
    /// Applying volume requests to the template, or hotplugged volumes to the VMI, failed.
    #[error("hotplugging volumes: {0}")]
    Hotplug(#[source] kube::Error),
    /// Creating a DataVolume of the VM's templates failed.
    #[error("creating DataVolume {name}: {source}")]
    DataVolume {
        /// The DataVolume.
        name: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
}

impl ReconcileError {
    /// Short reason for logs and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::MissingNamespace => "MissingNamespace",
            Self::Read { .. } => "ReadFailed",
            Self::Create(_) | Self::Render(_) => "FailedCreate",
            Self::Delete(_) => "FailedDelete",
            Self::Status(_) => "FailedStatusUpdate",
            Self::Action { .. } => "ActionFailed",
            Self::Serialize(_) => "SerializeFailed",
            Self::Instancetype(e) => e.reason(),
            Self::DataVolume { .. } => "FailedDataVolumeCreate",
            Self::Revision { .. } => "FailedRevision",
            Self::LiveUpdate(_) => "FailedLiveUpdate",
            Self::Hotplug(_) => "FailedHotplug",
        }
    }

    /// An optimistic-concurrency conflict: someone else wrote in between; retry at once.
    fn is_conflict(&self) -> bool {
        matches!(self, Self::Status(kube::Error::Api(s)) | Self::LiveUpdate(kube::Error::Api(s)) | Self::Hotplug(kube::Error::Api(s)) if s.is_conflict())
    }
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_not_found())
}

/// AlreadyExists on create, a failed precondition on delete: both are 409.
fn is_already_exists(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_already_exists() || s.code == 409)
}

/// The back-off key of a VM: its uid (a re-created VM starts afresh).
pub fn backoff_key(vm: &VirtualMachine) -> String {
    vm.metadata
        .uid
        .clone()
        .unwrap_or_else(|| format!("{}/{}", vm.namespace().unwrap_or_default(), vm.name_any()))
}

/// Reconciles one VM: decides on its cached copy and its VMI's, executes the decision,
/// writes status.
///
/// Most reconciles (a VMI changed phase) only write status, from the watch caches: the
/// write carries the VM's resourceVersion, so a stale cached VM gets 409 and is
/// reconciled again with the newer one. A decision to create or delete a VMI is made
/// again on fresh reads of both before it is carried out: the start failure back-off and
/// the stateChangeRequests this controller wrote a moment ago must be seen, or a stale
/// cache could start an instance too early or twice, or lose a request. (A create from a
/// VMI cache that lags is safe anyway: the VMI's name is the VM's, so a second create
/// gets AlreadyExists.)
#[tracing::instrument(skip_all, fields(vm = %vm.name_any(), ns = vm.namespace().unwrap_or_default()))]
pub async fn reconcile(vm: Arc<VirtualMachine>, state: Arc<Vms>) -> Result<Action, ReconcileError> {
    let ctx = &state.ctx;
    let ns = vm.namespace().ok_or(ReconcileError::MissingNamespace)?;
    let name = vm.name_any();
    let key = backoff_key(&vm);
    let vms = Api::<VirtualMachine>::namespaced(ctx.client.clone(), &ns);
    let vmis = Api::<VirtualMachineInstance>::namespaced(ctx.client.clone(), &ns);

    // Before the first full VMI list the cache would show no VMI for any VM.
    if !state.vmis_ready.wait(crate::watch::READY_WAIT).await {
        return Ok(Action::requeue(crate::watch::READY_WAIT));
    }
    // referencePolicy expand/expandAll: the VM's spec is rewritten first; its update
    // brings the VM back as a plain one.
    if ctx.config.reference_policy.expands(&vm) {
        let regarding = vm.object_ref(&());
        return match instancetype::expand(&ctx.client, &vm).await {
            Ok(_) => Ok(Action::requeue(Duration::from_secs(1))),
            Err(e) => {
                ctx.event(
                    &regarding,
                    EventType::Warning,
                    e.reason(),
                    format!("error encountered while expanding into VirtualMachine: {e}"),
                )
                .await;
                Err(e.into())
            }
        };
    }
    // Volume requests queued by virt-apiserver go into the template first; the writes bring
    // the VM back, read fresh.
    if super::hotplug::apply_requests(ctx, &vms, &vm).await? {
        state.stale.mark(&key);
        return Ok(Action::requeue(Duration::from_millis(200)));
    }
    let mut vm = (*vm).clone();
    let mut vmi = state
        .vmis
        .get(&ObjectRef::new(&name).within(&ns))
        .map(|v| (*v).clone());
    // A write of the last reconcile found the cached VM stale: read both fresh.
    let mut fresh = state.stale.take(&key);
    if fresh {
        let Some((current, current_vmi)) = read_fresh(&vms, &vmis, &name).await? else {
            ctx.backoff.reset(&key);
            return Ok(Action::await_change());
        };
        vm = current;
        vmi = current_vmi;
    }
    // The template DataVolumes, from the store the DataVolume controller shares: only VMs
    // with templates wait for its first list (DataVolumes may not be served at all).
    let has_templates = vm
        .spec
        .data_volume_templates
        .as_ref()
        .is_some_and(|t| !t.is_empty());
    if has_templates && !state.dvs_ready.wait(crate::watch::READY_WAIT).await {
        tracing::debug!("waiting for the DataVolume cache");
        return Ok(Action::requeue(crate::watch::READY_WAIT));
    }
    let template_dvs = |vm: &VirtualMachine| -> Vec<Option<Arc<DataVolume>>> {
        vm.spec
            .data_volume_templates
            .iter()
            .flatten()
            .map(|t| {
                let name = t.metadata.name.as_deref()?;
                state.dvs.get(&ObjectRef::new(name).within(&ns))
            })
            .collect()
    };
    let (observed, decision, now, starting, dv_state) = loop {
        // A VMI of the same name that another controller owns is not ours to touch, and
        // creating ours would only collide with it: wait until it goes away.
        if let Some(v) = vmi.as_ref().filter(|v| !render::controlled_by(v, &vm)) {
            tracing::warn!(vmi_uid = ?v.metadata.uid, "a VMI of this name belongs to another controller");
            ctx.backoff.reset(&key);
            return Ok(Action::requeue(ctx.config.resync));
        }
        let observed = vmi.as_ref().map(ObservedVmi::from_vmi);
        let now = Timestamp::now();
        let decision = decide::decide(&vm, observed.as_ref(), now);
        let starting = matches!(decision.action, VmiAction::Create { .. });
        let dvs = template_dvs(&vm);
        let dv_state =
            decide::data_volumes(&vm, &dvs.iter().map(|d| d.as_deref()).collect::<Vec<_>>());
        // KubeVirt creates the VMI only once every template DataVolume is ready.
        let decision = decide::hold_for_data_volumes(decision, dv_state);
        if fresh || matches!(decision.action, VmiAction::Nothing) {
            break (observed, decision, now, starting, dv_state);
        }
        // An action: decide again on what the apiserver has now.
        let Some((current, current_vmi)) = read_fresh(&vms, &vmis, &name).await? else {
            ctx.backoff.reset(&key);
            return Ok(Action::await_change());
        };
        vm = current;
        vmi = current_vmi;
        fresh = true;
    };

    // The copies of the instance type and preference the VM uses, captured once (KubeVirt
    // does it as soon as it sees the VM, before any VMI): their references go into the
    // status this reconcile writes anyway.
    let original_status = vm.status.clone();
    let captured = if instancetype::uses_instancetype(&vm) {
        match instancetype::capture(&ctx.client, &vm).await {
            Ok(c) => {
                c.set_refs(&mut vm);
                Some(c)
            }
            Err(e) => {
                ctx.event(
                    &vm.object_ref(&()),
                    EventType::Warning,
                    e.reason(),
                    format!("error encountered while storing instancetype.kubevirt.io controllerRevisions: {e}"),
                )
                .await;
                return Err(e.into());
            }
        }
    } else {
        None
    };

    // Missing template DataVolumes are created (never deleted: the garbage collector
    // takes them with the VM). A create the cache has not shown yet meets AlreadyExists.
    let mut dv_failure = None;
    if has_templates && decide::create_data_volumes(&vm, starting) {
        let api = Api::<DataVolume>::namespaced(ctx.client.clone(), &ns);
        let existing = template_dvs(&vm);
        let templates = vm.spec.data_volume_templates.clone().unwrap_or_default();
        for (t, dv) in templates.iter().zip(existing) {
            if dv.is_some() {
                continue;
            }
            let dv_name = t.metadata.name.clone().unwrap_or_default();
            let desired = render::data_volume(&vm, t)?;
            match api.create(&post_params(), &desired).await {
                Ok(_) => {
                    tracing::info!(dv = %dv_name, "created DataVolume");
                    ctx.event(
                        &vm.object_ref(&()),
                        EventType::Normal,
                        "SuccessfulDataVolumeCreate",
                        format!("Created DataVolume {dv_name}"),
                    )
                    .await;
                }
                Err(e) if is_already_exists(&e) => {}
                Err(e) => {
                    tracing::warn!(dv = %dv_name, error = %e, "creating DataVolume failed");
                    ctx.event(
                        &vm.object_ref(&()),
                        EventType::Warning,
                        "FailedDataVolumeCreate",
                        format!("Error creating DataVolume {dv_name}: {e}"),
                    )
                    .await;
                    dv_failure.get_or_insert(ReconcileError::DataVolume {
                        name: dv_name,
                        source: e,
                    });
                }
            }
        }
    }

    let jitter = rand::random::<f64>();
    tracing::debug!(action = ?decision.action, "decided");
    let regarding = vm.object_ref(&());
    let derive = |outcome: &Outcome| {
        decide::derive_status(
            &vm,
            observed.as_ref(),
            &StatusInputs {
                decision: &decision,
                outcome,
                backoff: &ctx.config.crash_loop,
                now,
                jitter,
                data_volumes: dv_state,
            },
        )
    };

    // A finished VMI is the only record of how it ended (a failed start to back off
    // from, a RerunOnFailure restart to queue). Write that into the VM status before
    // deleting the VMI, so that a failed status write cannot lose it.
    let mut current = vm.clone();
    current.status = original_status;
    if matches!(decision.action, VmiAction::Delete { .. })
        && observed.as_ref().is_some_and(ObservedVmi::is_final)
    {
        let status = derive(&Outcome::Done);
        if Some(&status) != current.status.as_ref() {
            current = write_status(&vms, &current, &status).await?;
            ctx.metrics.status_written();
        }
    }

    let outcome = match &decision.action {
        VmiAction::Nothing => Outcome::Done,
        VmiAction::Create { start_paused } => {
            let result = match start_revision(ctx, &vm).await {
                Ok(()) => {
                    render_with_instancetype(ctx, &vm, *start_paused, captured.as_ref()).await
                }
                Err(e) => Err(e),
            };
            let result = match result {
                Ok(desired) => vmis
                    .create(
                        &PostParams {
                            field_manager: Some(FIELD_MANAGER.to_string()),
                            ..PostParams::default()
                        },
                        &desired,
                    )
                    .await
                    .map(|created| created.metadata.uid.unwrap_or_default())
                    .map_err(ReconcileError::Create),
                Err(e) => Err(e),
            };
            match result {
                Ok(uid) => {
                    ctx.metrics.vmi_action("create", true);
                    tracing::info!(vmi_uid = %uid, strategy = ?decide::run_strategy(&vm), "created VMI");
                    ctx.event(
                        &regarding,
                        EventType::Normal,
                        "SuccessfulCreate",
                        format!("Started the virtual machine by creating the new virtual machine instance {name}"),
                    )
                    .await;
                    Outcome::Done
                }
                // The previous instance is still terminating, or a watch was behind: the
                // VMI's events will bring us back.
                Err(ReconcileError::Create(e)) if is_already_exists(&e) => {
                    tracing::debug!("VMI already exists");
                    return Ok(Action::requeue(Duration::from_secs(1)));
                }
                Err(e) => {
                    ctx.metrics.vmi_action("create", false);
                    tracing::warn!(error = %e, "creating VMI failed");
                    ctx.event(
                        &regarding,
                        EventType::Warning,
                        "FailedCreate",
                        format!("Error creating virtual machine instance: {e}"),
                    )
                    .await;
                    Outcome::Failed {
                        reason: "FailedCreate".to_string(),
                        message: e.to_string(),
                    }
                }
            }
        }
        VmiAction::Delete { uid, .. } => {
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(uid.clone()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match vmis.delete(&name, &params).await {
                Ok(_) => {
                    // What the stopped instance started from no longer matters.
                    if let Err(e) = prune_revisions(ctx, &vm, None).await {
                        tracing::debug!(error = %e, "deleting the VM's start revisions");
                    }
                    ctx.metrics.vmi_action("delete", true);
                    tracing::info!(vmi_uid = %uid, strategy = ?decide::run_strategy(&vm), "deleted VMI");
                    ctx.event(
                        &regarding,
                        EventType::Normal,
                        "SuccessfulDelete",
                        format!("Stopped the virtual machine by deleting the virtual machine instance {uid}"),
                    )
                    .await;
                    Outcome::Done
                }
                // Gone already, or replaced (uid precondition failed): the instance we
                // meant to stop no longer exists either way.
                Err(e) if is_not_found(&e) || is_already_exists(&e) => Outcome::Done,
                Err(e) => {
                    ctx.metrics.vmi_action("delete", false);
                    tracing::warn!(error = %e, "deleting VMI failed");
                    ctx.event(
                        &regarding,
                        EventType::Warning,
                        "FailedDelete",
                        format!("Error deleting virtual machine instance {uid}: {e}"),
                    )
                    .await;
                    Outcome::Failed {
                        reason: "FailedDelete".to_string(),
                        message: e.to_string(),
                    }
                }
            }
        }
    };

    // KubeVirt clears RestartRequired when it starts or stops the VM; a running VM's
    // template is compared with the one it started from.
    let mut live_wait = None;
    let restart = match (&decision.action, vmi.as_ref()) {
        (VmiAction::Create { .. } | VmiAction::Delete { .. }, _) | (_, None) => {
            live::RestartRequired::Clear
        }
        (VmiAction::Nothing, Some(v)) => {
            super::hotplug::sync_vmi(ctx, &vms, &vmis, &vm, v, fresh).await?;
            let (restart, wait) = live_update(ctx, &vms, &vmis, &vm, v, fresh).await?;
            live_wait = wait;
            restart
        }
    };
    let mut status = derive(&outcome);
    if restart != live::RestartRequired::Keep {
        let mut conditions = status.conditions.take().unwrap_or_default();
        live::apply_restart_required(&mut conditions, &restart, now);
        status.conditions = Some(conditions);
    }
    if Some(&status) != current.status.as_ref() {
        write_status(&vms, &current, &status).await?;
        ctx.metrics.status_written();
    }
    if let Some(patch) = render::display_annotations_patch(&vm, vmi.as_ref()) {
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PatchParams::default()
        };
        // Display only: a failure is retried with the next reconcile, never an error.
        if let Err(e) = vms.patch(&name, &params, &Patch::Merge(&patch)).await {
            tracing::debug!(error = %e, "writing the node and IP annotations");
        }
    }

    if let Some(e) = dv_failure {
        return Err(e);
    }
    if let Outcome::Failed { message, reason } = outcome {
        // The Failure condition is written; the retry goes through error_policy's back-off.
        return Err(ReconcileError::Action { reason, message });
    }
    ctx.backoff.reset(&key);
    Ok(match decision.wait.or(live_wait) {
        Some(wait) => Action::requeue(wait),
        None => Action::requeue(ctx.config.resync),
    })
}

fn post_params() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PostParams::default()
    }
}

/// The VMI for `vm`: its template, with the instance type and preference copies it
/// captured applied.
async fn render_with_instancetype(
    ctx: &crate::context::Context,
    vm: &VirtualMachine,
    start_paused: bool,
    captured: Option<&Captured>,
) -> Result<VirtualMachineInstance, ReconcileError> {
    let mut vmi = render::render_vmi(vm, start_paused)?;
    if let Some(captured) = captured {
        let specs = instancetype::specs(&ctx.client, vm, captured).await?;
        instancetype::apply(vm, &specs, &mut vmi)?;
    }
    // KubeVirt's VMI defaulting under LiveUpdate: room for more sockets later.
    ctx.config.live_update.default_max_sockets(&mut vmi.spec);
    Ok(vmi)
}

/// Label on the VM's start revisions: the VM's uid (to find them again without a list of
/// every revision of the namespace).
const REVISION_VM_LABEL: &str = "kubevirt.io/vm-uid";

/// Records the VM's spec as its next VMI starts from it (KubeVirt's `createVMRevision`),
/// its earlier start revisions deleted.
async fn start_revision(
    ctx: &crate::context::Context,
    vm: &VirtualMachine,
) -> Result<(), ReconcileError> {
    let uid = vm.metadata.uid.clone().unwrap_or_default();
    let name = live::revision_name(&uid, vm.metadata.generation.unwrap_or_default());
    prune_revisions(ctx, vm, Some(&name)).await?;
    let ns = vm.namespace().unwrap_or_default();
    let api = Api::<ControllerRevision>::namespaced(ctx.client.clone(), &ns);
    let revision = ControllerRevision {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            namespace: Some(ns),
            labels: Some([(REVISION_VM_LABEL.to_string(), uid)].into()),
            owner_references: Some(vec![render::owner_reference(vm)?]),
            ..ObjectMeta::default()
        },
        data: Some(k8s_openapi::apimachinery::pkg::runtime::RawExtension(
            live::revision_data(&vm.spec)?,
        )),
        revision: vm.metadata.generation.unwrap_or_default(),
    };
    match api.create(&post_params(), &revision).await {
        Ok(_) => Ok(()),
        Err(e) if is_already_exists(&e) => Ok(()),
        // No apps API (virt-apiserver alone, `cargo xtask dev-apiserver`): the VM starts
        // anyway, without RestartRequired.
        Err(e) if is_not_found(&e) => Ok(()),
        Err(source) => Err(ReconcileError::Revision {
            what: "creating",
            name,
            source,
        }),
    }
}

/// Deletes the VM's start revisions but `keep`.
async fn prune_revisions(
    ctx: &crate::context::Context,
    vm: &VirtualMachine,
    keep: Option<&str>,
) -> Result<(), ReconcileError> {
    let uid = vm.metadata.uid.clone().unwrap_or_default();
    let api = Api::<ControllerRevision>::namespaced(
        ctx.client.clone(),
        &vm.namespace().unwrap_or_default(),
    );
    let params = kube::api::ListParams::default().labels(&format!("{REVISION_VM_LABEL}={uid}"));
    let list = match api.list_metadata(&params).await {
        Ok(l) => l,
        // No apps API (virt-apiserver alone): no revisions either.
        Err(e) if is_not_found(&e) => return Ok(()),
        Err(source) => {
            return Err(ReconcileError::Revision {
                what: "listing",
                name: live::revision_prefix(&uid),
                source,
            });
        }
    };
    for r in list.items {
        let name = r.name_any();
        if Some(name.as_str()) == keep {
            continue;
        }
        match api.delete(&name, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {}
            Err(source) => {
                return Err(ReconcileError::Revision {
                    what: "deleting",
                    name,
                    source,
                });
            }
        }
    }
    Ok(())
}

/// How soon a live update held back (a migration or a CPU hotplug in flight) looks again.
const LIVE_UPDATE_RECHECK: Duration = Duration::from_secs(5);

/// For a running VM whose spec changed since its VMI started: whether it needs a restart
/// and, under LiveUpdate, the changes carried to the VMI (KubeVirt's
/// `addRestartRequiredIfNeeded` and its live-update handlers).
async fn live_update(
    ctx: &crate::context::Context,
    vms: &Api<VirtualMachine>,
    vmis: &Api<VirtualMachineInstance>,
    cached: &VirtualMachine,
    vmi: &VirtualMachineInstance,
    fresh: bool,
) -> Result<(live::RestartRequired, Option<Duration>), ReconcileError> {
    let keep = Ok((live::RestartRequired::Keep, None));
    let started = ObservedVmi::from_vmi(vmi).vm_generation;
    // Set once, kept until the restart (KubeVirt blocks live updates meanwhile): nothing
    // to read or compare.
    if live::has_restart_required(cached)
        || vmi.metadata.deletion_timestamp.is_some()
        || ObservedVmi::from_vmi(vmi).is_final()
        || started.is_none()
        || started == cached.metadata.generation
    {
        return keep;
    }
    // The cached VM keeps only a slimmed template (`slim_vm`).
    let vm = if fresh {
        cached.clone()
    } else {
        match vms.get_opt(&cached.name_any()).await {
            Ok(Some(vm)) => vm,
            Ok(None) => return keep,
            Err(source) => {
                return Err(ReconcileError::Read {
                    what: "VirtualMachine",
                    source,
                });
            }
        }
    };
    let uid = vm.metadata.uid.clone().unwrap_or_default();
    let name = live::revision_name(&uid, started.unwrap_or_default());
    let api = Api::<ControllerRevision>::namespaced(
        ctx.client.clone(),
        &vm.namespace().unwrap_or_default(),
    );
    let revision = match api.get_opt(&name).await {
        Ok(r) => r,
        Err(e) if is_not_found(&e) => None,
        Err(source) => {
            return Err(ReconcileError::Revision {
                what: "reading",
                name: name.clone(),
                source,
            });
        }
    };
    // Started before revisions were kept: nothing to compare with (as KubeVirt).
    let Some(started_spec) = revision
        .and_then(|r| r.data)
        .and_then(|d| live::spec_of_revision(&d.0).ok())
    else {
        tracing::debug!(revision = %name, "no start revision");
        return keep;
    };
    let strategy = ctx.config.live_update.strategy;
    if let Some(message) = live::restart_required(&started_spec, &vm.spec, strategy) {
        return Ok((live::RestartRequired::Set(message), None));
    }
    if !ctx.config.live_update.is_live_update() || live::has_restart_required(&vm) {
        return keep;
    }
    let Some(template) = vm.spec.template.spec.as_ref() else {
        return keep;
    };
    let plan = live::live_plan(template, vmi);
    if let Some(message) = plan.restart_required {
        return Ok((live::RestartRequired::Set(message), None));
    }
    if let Some(reason) = plan.wait {
        tracing::debug!(reason, "live update held back");
        return Ok((live::RestartRequired::Keep, Some(LIVE_UPDATE_RECHECK)));
    }
    if let Some(mut patch) = plan.vmi_spec_patch {
        // The VMI as decided on, or 409 and a fresh look.
        patch["metadata"] = json!({"resourceVersion": vmi.metadata.resource_version});
        let params = PatchParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PatchParams::default()
        };
        vmis.patch(&vmi.name_any(), &params, &Patch::Merge(&patch))
            .await
            .map_err(ReconcileError::LiveUpdate)?;
        tracing::info!(sockets = ?plan.sockets, "carried the VM's live update to its VMI");
        ctx.event(
            &vm.object_ref(&()),
            EventType::Normal,
            "LiveUpdated",
            match plan.sockets {
                Some(n) => format!("hotplugging cpu to {n} sockets"),
                None => "node placement updated on the running instance".to_string(),
            },
        )
        .await;
    }
    Ok((live::RestartRequired::Keep, None))
}

/// The VM and its VMI as the apiserver has them now; None when the VM is gone.
async fn read_fresh(
    vms: &Api<VirtualMachine>,
    vmis: &Api<VirtualMachineInstance>,
    name: &str,
) -> Result<Option<(VirtualMachine, Option<VirtualMachineInstance>)>, ReconcileError> {
    let Some(vm) = vms
        .get_opt(name)
        .await
        .map_err(|source| ReconcileError::Read {
            what: "VirtualMachine",
            source,
        })?
    else {
        return Ok(None);
    };
    let vmi = vmis
        .get_opt(name)
        .await
        .map_err(|source| ReconcileError::Read {
            what: "VirtualMachineInstance",
            source,
        })?;
    Ok(Some((vm, vmi)))
}

/// A merge patch of /status that turns `old` into `new`, guarded by the resourceVersion
/// the decision was made on so that a stateChangeRequest appended meanwhile is not lost.
pub fn status_patch(
    resource_version: Option<&str>,
    old: &VirtualMachineStatus,
    new: &VirtualMachineStatus,
) -> Result<Value, serde_json::Error> {
    let mut status = serde_json::to_value(new)?;
    if let (Value::Object(old), Value::Object(new)) = (serde_json::to_value(old)?, &mut status) {
        for k in old.keys() {
            if !new.contains_key(k) {
                new.insert(k.clone(), Value::Null);
            }
        }
    }
    Ok(json!({
        "metadata": {"resourceVersion": resource_version},
        "status": status,
    }))
}

async fn write_status(
    vms: &Api<VirtualMachine>,
    vm: &VirtualMachine,
    new: &VirtualMachineStatus,
) -> Result<VirtualMachine, ReconcileError> {
    let old = vm.status.clone().unwrap_or_default();
    let patch = status_patch(vm.metadata.resource_version.as_deref(), &old, new)?;
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    };
    let written = vms
        .patch_status(&vm.name_any(), &params, &Patch::Merge(&patch))
        .await
        .map_err(ReconcileError::Status)?;
    tracing::debug!(printable = ?new.printable_status, "status written");
    Ok(written)
}

/// Retry policy: conflicts retry at once, other errors back off per object.
pub fn error_policy(vm: Arc<VirtualMachine>, err: &ReconcileError, state: Arc<Vms>) -> Action {
    let ctx = &state.ctx;
    let key = backoff_key(&vm);
    if err.is_conflict() {
        // The cached VM is older than the server's: read it fresh and retry at once.
        state.stale.mark(&key);
        return Action::requeue(Duration::from_millis(50));
    }
    let delay = ctx.backoff.next_delay_after(&key, err);
    tracing::warn!(vm = %vm.name_any(), error = %err, reason = err.reason(), retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use kubevirt_api::{PrintableStatus, VirtualMachineStatus};
    use serde_json::json;

    use super::status_patch;

    #[test]
    fn status_patch_nulls_removed_fields_and_carries_the_resource_version() {
        let old: VirtualMachineStatus = serde_json::from_value(json!({
            "created": true, "printableStatus": "Running",
            "stateChangeRequests": [{"action": "Start"}],
            "startFailure": {"consecutiveFailCount": 1}
        }))
        .unwrap();
        let new = VirtualMachineStatus {
            created: Some(false),
            printable_status: Some(PrintableStatus::Stopped),
            ..VirtualMachineStatus::default()
        };
        let p = status_patch(Some("42"), &old, &new).unwrap();
        assert_eq!(
            p,
            json!({
                "metadata": {"resourceVersion": "42"},
                "status": {
                    "created": false, "printableStatus": "Stopped",
                    "stateChangeRequests": null, "startFailure": null
                }
            })
        );
    }
}
