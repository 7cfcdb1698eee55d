//! Orchestration of one VMI reconcile; the decisions live in [`super::decide`] and
//! [`super::render`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use kubevirt_api::vmi::VirtualMachineInstancePhase as Phase;
use kubevirt_api::{VirtualMachineInstance, VirtualMachineInstanceStatus};
use serde::Serialize;
use serde_json::{Value, json};

use super::Vmis;
use super::claims;
use super::decide::{self, FINALIZER, Plan};
use super::render::{self, NODE_NAME_LABEL};
use crate::context::{Context, FIELD_MANAGER};
use crate::expectations::Check;

/// Why a VMI reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The VMI object is malformed.
    #[error("VirtualMachineInstance has no namespace or uid")]
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
    /// Adding or removing the finalizer, or setting the node label, failed.
    #[error("updating the VMI metadata ({what})")]
    Metadata {
        /// Which change.
        what: &'static str,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// Creating the launcher pod failed; the Synchronized condition says so too.
    #[error("creating the launcher pod")]
    CreatePod(#[source] kube::Error),
    /// Deleting a launcher pod failed.
    #[error("deleting launcher pod {pod}")]
    DeletePod {
        /// Pod name.
        pod: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// Writing the VMI status failed.
    #[error("writing the VMI status")]
    Status(#[source] kube::Error),
    /// Serialising a patch failed (a bug).
    #[error("serialising a patch")]
    Serialize(#[from] serde_json::Error),
}

impl ReconcileError {
    /// Short reason for logs and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotPersisted => "NotPersisted",
            Self::Read { .. } => "ReadFailed",
            Self::Metadata { .. } => "FailedMetadataUpdate",
            Self::CreatePod(_) => "FailedCreate",
            Self::DeletePod { .. } => "FailedDelete",
            Self::Status(_) => "FailedStatusUpdate",
            Self::Serialize(_) => "SerializeFailed",
        }
    }

    /// Someone else wrote the VMI in between (resourceVersion precondition): retry at once.
    fn is_conflict(&self) -> bool {
        match self {
            Self::Status(kube::Error::Api(s))
            | Self::Metadata {
                source: kube::Error::Api(s),
                ..
            } => s.is_conflict(),
            _ => false,
        }
    }
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.is_not_found())
}

/// A failed uid precondition on delete is a 409: that pod is gone already.
fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    }
}

/// A merge patch that turns `old` into `new` under `status`, with removed keys set to
/// null, guarded by the resourceVersion the decision was made on: the conditions list
/// is replaced as a whole, so a concurrent virt-handler write must not be lost.
pub fn status_patch<T: Serialize>(
    resource_version: Option<&str>,
    old: &T,
    new: &T,
) -> Result<Value, serde_json::Error> {
    let mut status = serde_json::to_value(new)?;
    null_removed(&serde_json::to_value(old)?, &mut status);
    Ok(json!({
        "metadata": {"resourceVersion": resource_version},
        "status": status,
    }))
}

/// Sets the keys of `old` missing from `new` to null, in nested objects too: a merge
/// patch merges maps, so `activePods` losing a migrated-away pod (or a migrationState
/// losing a field) needs the null to shrink.
fn null_removed(old: &Value, new: &mut Value) {
    if let (Value::Object(old), Value::Object(new)) = (old, new) {
        for (k, ov) in old {
            match new.get_mut(k) {
                Some(nv) => null_removed(ov, nv),
                None => {
                    new.insert(k.clone(), Value::Null);
                }
            }
        }
    }
}

/// A merge patch of the finalizer list, guarded by resourceVersion (the list is
/// replaced as a whole).
pub fn finalizer_patch(vmi: &VirtualMachineInstance, add: bool) -> Value {
    let mut list: Vec<String> = vmi.finalizers().to_vec();
    list.retain(|f| f != FINALIZER);
    if add {
        list.push(FINALIZER.to_string());
    }
    json!({"metadata": {
        "resourceVersion": vmi.metadata.resource_version,
        "finalizers": list,
    }})
}

/// Reconciles one VMI: reads its pods from the launcher-pod cache, executes the plan,
/// writes status.
///
/// The VMI is the controller's cached copy and the pods come from the watch cache
/// ([`super::pods`]), not fresh reads: a fresh pod LIST per reconcile saturated
/// kube-apiserver at 10,000 VMIs. Two guards make the caches safe:
/// - every VMI write carries the resourceVersion the decision was made on (status, node
///   label, finalizer patches), so a stale cached VMI gets 409 and is reconciled again
///   once the watch has the newer one — it never overwrites what virt-handler wrote;
/// - a pod create or delete of ours that the pod cache has not shown yet holds the VMI
///   (expectations): the reconcile then neither creates another pod nor derives status
///   from a cache that does not have it (a missing pod would fail the VMI), and looks
///   again when the pod's event arrives.
#[tracing::instrument(skip_all, fields(vmi = %vmi.name_any(), ns = vmi.namespace().unwrap_or_default()))]
pub async fn reconcile(
    vmi: Arc<VirtualMachineInstance>,
    state: Arc<Vmis>,
) -> Result<Action, ReconcileError> {
    let ctx = &state.ctx;
    let ns = vmi.namespace().ok_or(ReconcileError::NotPersisted)?;
    let uid = vmi.uid().ok_or(ReconcileError::NotPersisted)?;
    let name = vmi.name_any();
    let vmis = Api::<VirtualMachineInstance>::namespaced(ctx.client.clone(), &ns);
    let pod_api = Api::<Pod>::namespaced(ctx.client.clone(), &ns);

    // Before the first full pod list the cache would show no pod for any VMI.
    if !state.pods.wait_until_ready(crate::watch::READY_WAIT).await {
        return Ok(Action::requeue(crate::watch::READY_WAIT));
    }
    match state.pods.check(&uid) {
        Check::Satisfied => {}
        Check::Pending {
            remaining,
            creations,
            deletions,
        } => {
            tracing::debug!(
                creations,
                deletions,
                "waiting for the pod watch to show our writes"
            );
            return Ok(Action::requeue(remaining.min(EXPECTATION_RECHECK)));
        }
        Check::Expired {
            creations,
            deletions,
        } => {
            tracing::warn!(
                creations,
                deletions,
                timeout = ?crate::expectations::TIMEOUT,
                "pod writes of ours never seen by the watch; trusting the pod cache again"
            );
        }
    }
    // The cached VMI, unless a write of the last reconcile found it stale.
    let mut vmi = if state.stale.take(&uid) {
        match vmis
            .get_opt(&name)
            .await
            .map_err(|source| ReconcileError::Read {
                what: "VirtualMachineInstance",
                source,
            })? {
            Some(fresh) if fresh.uid().as_deref() == Some(uid.as_str()) => fresh,
            // Gone, or replaced by a VMI of the same name that the watch will bring.
            _ => return Ok(Action::await_change()),
        }
    } else {
        (*vmi).clone()
    };
    observe_phase(ctx, &uid, &vmi);

    let mut pods: Vec<Pod> = state.pods.pods_of(&uid);

    let plan = decide::plan(&vmi, &pods);
    tracing::debug!(?plan, "planned");
    let regarding = vmi.object_ref(&());
    // Published after the writes: an Event is for humans and must not delay the pod
    // or the status.
    let mut events: Vec<(EventType, &'static str, String)> = Vec::new();

    if plan.add_finalizer {
        vmi = vmis
            .patch(
                &name,
                &patch_params(),
                &Patch::Merge(&finalizer_patch(&vmi, true)),
            )
            .await
            .map_err(|source| ReconcileError::Metadata {
                what: "finalizer",
                source,
            })?;
    }

    // The claims behind persistentVolumeClaim volumes: the pod mounts them as their
    // volumeMode says, volumeStatus reports them, and a missing or unbound one holds the
    // start. Only until the guest runs: a running VMI's status update (the most frequent
    // reconcile) costs no claim reads, and its volumeStatus is kept as it was written.
    let starting = vmi.status.as_ref().is_none_or(|s| {
        matches!(
            s.phase,
            Phase::Unset | Phase::Pending | Phase::Scheduling | Phase::Scheduled
        )
    });
    let claims = if !starting {
        claims::Claims::default()
    } else {
        claims::lookup(&ctx.client, &ns, &vmi)
            .await
            .map_err(|source| ReconcileError::Read {
                what: "PersistentVolumeClaims",
                source,
            })?
    };
    let mut create_error: Option<(&'static str, String)> = None;
    let mut failure: Option<ReconcileError> = None;
    // Any problem holds the pod; only those that are errors say so in Synchronized (a
    // DataVolume still importing is a plain wait, as in KubeVirt: DataVolumesReady says it).
    let held = plan.create_pod && !claims.problems.is_empty();
    if held
        && let Some((reason, message)) = claims
            .problems
            .iter()
            .find_map(|p| Some((p.reason()?, p.message(&ns))))
    {
        let already = vmi
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| {
                c.iter().any(|c| {
                    c.reason.as_deref() == Some(reason) && c.message.as_deref() == Some(&message)
                })
            });
        if !already {
            tracing::info!(%message, "launcher pod held");
            events.push((EventType::Warning, reason, message.clone()));
        }
        create_error = Some((reason, message));
    } else if held {
        tracing::debug!(problems = ?claims.problems, "launcher pod waits for its DataVolumes");
    } else if plan.create_pod {
        // The launcher's Secret of inline cloud-init data first: kubelet starts the pod
        // only once every Secret it mounts exists.
        if let Err(e) = ensure_cloud_init_secret(&ctx.client, &vmi).await {
            tracing::warn!(error = %e, "creating the cloud-init Secret failed");
            events.push((
                EventType::Warning,
                "FailedCreate",
                format!("Error creating the cloud-init Secret: {e}"),
            ));
        }
        // Rendered with the claims as the status about to be written records them.
        let mut rendered = vmi.clone();
        if !claims.found.is_empty() {
            let st = rendered.status.get_or_insert_with(Default::default);
            st.volume_status = claims::volume_status(st.volume_status.as_deref(), &claims);
        }
        match render::launcher_pod(&rendered, &ctx.config.launcher) {
            Ok(desired) => {
                let params = PostParams {
                    field_manager: Some(FIELD_MANAGER.to_string()),
                    ..PostParams::default()
                };
                // Recorded before the request: the watch may show the pod before the
                // response arrives.
                state
                    .pods
                    .expectations
                    .expect_creation(&uid, Instant::now());
                match pod_api.create(&params, &desired).await {
                    Ok(pod) => {
                        ctx.metrics.pod_action("create", true);
                        let pod_name = pod.name_any();
                        tracing::info!(pod = %pod_name, "created launcher pod");
                        events.push((
                            EventType::Normal,
                            "SuccessfulCreate",
                            format!("Created virtual machine pod {pod_name}"),
                        ));
                        pods.push(pod);
                    }
                    Err(e) => {
                        // The server refused it: nothing was made, nothing to wait for.
                        // A transport error or a 5xx may have made the pod anyway: the
                        // expectation then holds until the watch shows it or expires.
                        if matches!(&e, kube::Error::Api(s) if s.code < 500) {
                            state.pods.expectations.creation_observed(&uid);
                        }
                        ctx.metrics.pod_action("create", false);
                        tracing::warn!(error = %e, "creating launcher pod failed");
                        events.push((
                            EventType::Warning,
                            "FailedCreate",
                            format!("Error creating pod: {e}"),
                        ));
                        create_error = Some((decide::reasons::FAILED_CREATE, e.to_string()));
                        failure = Some(ReconcileError::CreatePod(e));
                    }
                }
            }
            // The spec will not render until it changes: say so and wait for a change
            // rather than retry.
            Err(e) => {
                ctx.metrics.pod_action("create", false);
                tracing::warn!(error = %e, "launcher pod cannot be rendered");
                events.push((
                    EventType::Warning,
                    "FailedCreate",
                    format!("Error rendering pod: {e}"),
                ));
                create_error = Some((decide::reasons::FAILED_CREATE, e.to_string()));
            }
        }
    }

    if let Err(e) = delete_pods(&state, &uid, &pod_api, &plan, &mut events).await {
        failure.get_or_insert(e);
    }
    if let Err(e) = sync_attachments(&state, &vmi, &uid, &pods, &pod_api, &mut events).await {
        failure.get_or_insert(e);
    }

    let mut status = decide::derive_status(
        &vmi,
        &pods,
        create_error.as_ref().map(|(r, m)| (*r, m.as_str())),
        Timestamp::now(),
    );
    if !claims.found.is_empty() {
        status.volume_status = claims::volume_status(status.volume_status.as_deref(), &claims);
    }
    let unbound: Vec<&str> = claims
        .found
        .values()
        .filter(|c| c.phase == "Pending")
        .map(|c| c.claim_name.as_str())
        .collect();
    decide::volume_binding_condition(&mut status, &ns, &unbound, Timestamp::now());
    if starting {
        decide::data_volumes_condition(
            &mut status,
            claims.data_volumes,
            &claims.data_volumes_not_ready(&ns),
            Timestamp::now(),
        );
    }
    if let Some((warning, reason, note)) = decide::final_event(&vmi, &status) {
        // The VMI of a VM that restarts is deleted at once: the Event is what is left
        // to say why it ended.
        let type_ = if warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        events.push((type_, reason, note));
    }
    let written = write_back(&vmis, vmi, &status, &plan, ctx).await;
    for (type_, reason, note) in events {
        ctx.event(&regarding, type_, reason, note).await;
    }
    written?;

    if let Some(e) = failure {
        return Err(e);
    }
    ctx.backoff.reset(&uid);
    if !claims.problems.is_empty() && plan.create_pod {
        // Claims and DataVolumes are not watched here: look again soon.
        return Ok(Action::requeue(CLAIM_RECHECK));
    }
    Ok(Action::requeue(ctx.config.resync))
}

/// How soon a VMI held by a missing claim looks for it again.
const CLAIM_RECHECK: Duration = Duration::from_secs(5);

/// How soon a VMI whose pod writes the cache has not shown yet looks again, at the
/// latest: the pod's event normally brings it back sooner.
const EXPECTATION_RECHECK: Duration = Duration::from_secs(1);

/// How soon a VMI whose write met a newer resourceVersion is reconciled again (with a
/// fresh read).
const CONFLICT_RETRY: Duration = Duration::from_millis(50);

/// Writes the status the pods imply, the node label and the finalizer removal.
async fn write_back(
    vmis: &Api<VirtualMachineInstance>,
    mut vmi: VirtualMachineInstance,
    status: &VirtualMachineInstanceStatus,
    plan: &Plan,
    ctx: &Context,
) -> Result<(), ReconcileError> {
    let name = vmi.name_any();
    let old = vmi.status.clone().unwrap_or_default();
    if *status != old {
        vmi = write_status(vmis, &vmi, &old, status).await?;
        ctx.metrics.vmi_status_written();
        if status.phase != old.phase {
            tracing::info!(from = old.phase.as_str(), to = status.phase.as_str(), reason = ?status.reason, "VMI phase");
        }
    }
    if let Some(node) = decide::node_label(&vmi, status) {
        let patch = json!({"metadata": {
            "resourceVersion": vmi.metadata.resource_version,
            "labels": {NODE_NAME_LABEL: node},
        }});
        vmi = vmis
            .patch(&name, &patch_params(), &Patch::Merge(&patch))
            .await
            .map_err(|source| ReconcileError::Metadata {
                what: "node label",
                source,
            })?;
    }
    if plan.remove_finalizer {
        match vmis
            .patch(
                &name,
                &patch_params(),
                &Patch::Merge(&finalizer_patch(&vmi, false)),
            )
            .await
        {
            Ok(_) => tracing::info!("no launcher pod left; finalizer removed"),
            Err(e) if is_not_found(&e) => {}
            Err(source) => {
                return Err(ReconcileError::Metadata {
                    what: "finalizer",
                    source,
                });
            }
        }
    }

    Ok(())
}

/// Observes the phase transition metric when this VMI's phase changed since last seen.
fn observe_phase(ctx: &Context, uid: &str, vmi: &VirtualMachineInstance) {
    let phase = vmi.status.as_ref().map(|s| s.phase).unwrap_or_default();
    if ctx.vmi_phases.changed(uid, phase)
        && let Some(secs) = decide::seconds_since_creation(vmi, phase)
    {
        ctx.metrics.vmi_phase_transition(phase.as_str(), secs);
    }
}

async fn delete_pods(
    state: &Vmis,
    vmi_uid: &str,
    pod_api: &Api<Pod>,
    plan: &Plan,
    events: &mut Vec<(EventType, &'static str, String)>,
) -> Result<(), ReconcileError> {
    let ctx = &state.ctx;
    let mut first_error = None;
    // Recorded before the requests, as creations are: an already-deleting pod the cache
    // still shows alive must not be deleted (and reported) twice.
    if !plan.delete_pods.is_empty() {
        state.pods.expectations.expect_deletions(
            vmi_uid,
            plan.delete_pods.iter().map(|p| p.uid.clone()),
            Instant::now(),
        );
    }
    for pod in &plan.delete_pods {
        let params = DeleteParams {
            grace_period_seconds: plan
                .delete_grace_seconds
                .and_then(|g| u32::try_from(g).ok()),
            preconditions: Some(Preconditions {
                uid: Some(pod.uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match pod_api.delete(&pod.name, &params).await {
            Ok(_) => {
                ctx.metrics.pod_action("delete", true);
                tracing::info!(pod = %pod.name, grace = ?plan.delete_grace_seconds, "deleting launcher pod");
                events.push((
                    EventType::Normal,
                    "SuccessfulDelete",
                    format!("Deleted virtual machine pod {}", pod.name),
                ));
            }
            // Gone, or replaced: the cache will show it; nothing of ours to wait for.
            Err(e) if is_not_found(&e) || is_conflict(&e) => {
                state.pods.expectations.deletion_observed(vmi_uid, &pod.uid);
            }
            Err(e) => {
                state.pods.expectations.deletion_observed(vmi_uid, &pod.uid);
                ctx.metrics.pod_action("delete", false);
                tracing::warn!(pod = %pod.name, error = %e, "deleting launcher pod failed");
                events.push((
                    EventType::Warning,
                    "FailedDelete",
                    format!("Error deleting pod {}: {e}", pod.name),
                ));
                first_error.get_or_insert(ReconcileError::DeletePod {
                    pod: pod.name.clone(),
                    source: e,
                });
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Creates and deletes the attachment pods of the VMI's hotplugged volumes
/// ([`super::hotplug`]).
async fn sync_attachments(
    state: &Vmis,
    vmi: &VirtualMachineInstance,
    uid: &str,
    launchers: &[Pod],
    pod_api: &Api<Pod>,
    events: &mut Vec<(EventType, &'static str, String)>,
) -> Result<(), ReconcileError> {
    use kubevirt_api::hotplug::ATTACHMENT_VMI_UID_LABEL;
    let ns = vmi.namespace().unwrap_or_default();
    let mut attached: Vec<Pod> = state
        .attachments
        .state()
        .iter()
        .filter(|p| {
            p.namespace().as_deref() == Some(ns.as_str())
                && p.labels().get(ATTACHMENT_VMI_UID_LABEL).map(String::as_str) == Some(uid)
        })
        .map(|p| p.to_pod())
        .collect();
    if attached.is_empty() && super::hotplug::wanted(vmi).is_empty() {
        return Ok(());
    }
    let launcher = super::hotplug::attach_to(vmi, launchers);
    let mut plan = super::hotplug::plan(vmi, launcher, &attached);
    if !plan.create.is_empty() {
        // The watch may not show a pod made a moment ago: ask before making another.
        attached = pod_api
            .list(&ListParams::default().labels(&super::hotplug::selector(uid)))
            .await
            .map_err(|source| ReconcileError::Read {
                what: "attachment pods",
                source,
            })?
            .items;
        plan = super::hotplug::plan(vmi, launcher, &attached);
    }
    for name in &plan.delete {
        match pod_api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {
                tracing::info!(pod = %name, "deleting attachment pod");
                events.push((
                    EventType::Normal,
                    "SuccessfulDelete",
                    format!("Deleted attachment pod {name}"),
                ));
            }
            Err(e) if is_not_found(&e) => {}
            Err(e) => {
                return Err(ReconcileError::DeletePod {
                    pod: name.clone(),
                    source: e,
                });
            }
        }
    }
    let (Some(launcher), false) = (launcher, plan.create.is_empty()) else {
        return Ok(());
    };
    let claims = Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(
        state.ctx.client.clone(),
        &ns,
    );
    for (volume, claim, read_only) in &plan.create {
        let Some(pvc) = claims
            .get_opt(claim)
            .await
            .map_err(|source| ReconcileError::Read {
                what: "PersistentVolumeClaim",
                source,
            })?
        else {
            events.push((
                EventType::Warning,
                "FailedHotplug",
                format!(
                    "Hotplugged volume {volume}: PersistentVolumeClaim {ns}/{claim} does not exist"
                ),
            ));
            continue;
        };
        let c = super::claims::Claim::from_pvc(&pvc);
        let pod = super::hotplug::attachment_pod(
            vmi,
            launcher,
            volume,
            &c,
            *read_only,
            &state.ctx.config.launcher,
        );
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PostParams::default()
        };
        match pod_api.create(&params, &pod).await {
            Ok(p) => {
                tracing::info!(pod = %p.name_any(), %volume, "created attachment pod");
                events.push((
                    EventType::Normal,
                    "SuccessfulCreate",
                    format!(
                        "Created attachment pod {} for hotplugged volume {volume}",
                        p.name_any()
                    ),
                ));
            }
            Err(e) => {
                events.push((
                    EventType::Warning,
                    "FailedCreate",
                    format!("Error creating the attachment pod of volume {volume}: {e}"),
                ));
                return Err(ReconcileError::CreatePod(e));
            }
        }
    }
    Ok(())
}

async fn write_status(
    vmis: &Api<VirtualMachineInstance>,
    vmi: &VirtualMachineInstance,
    old: &VirtualMachineInstanceStatus,
    new: &VirtualMachineInstanceStatus,
) -> Result<VirtualMachineInstance, ReconcileError> {
    let patch = status_patch(vmi.metadata.resource_version.as_deref(), old, new)?;
    vmis.patch_status(&vmi.name_any(), &patch_params(), &Patch::Merge(&patch))
        .await
        .map_err(ReconcileError::Status)
}

/// `err` and its sources, `: `-separated (the variants do not repeat their source).
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// Retry policy: conflicts retry at once, other errors back off per object.
pub fn error_policy(
    vmi: Arc<VirtualMachineInstance>,
    err: &ReconcileError,
    state: Arc<Vmis>,
) -> Action {
    let ctx = &state.ctx;
    if err.is_conflict() {
        // The cached VMI is older than the server's: read it fresh and retry at once.
        if let Some(uid) = vmi.uid() {
            state.stale.mark(&uid);
        }
        return Action::requeue(CONFLICT_RETRY);
    }
    let key = vmi.uid().unwrap_or_else(|| vmi.name_any());
    let delay = ctx.backoff.next_delay_after(&key, err);
    tracing::warn!(vmi = %vmi.name_any(), error = %error_chain(err), reason = err.reason(), retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}

/// Creates the VMI's Secret of inline cloud-init data unless it exists (the VMI spec is
/// immutable, so an existing one is current).
async fn ensure_cloud_init_secret(
    client: &kube::Client,
    vmi: &VirtualMachineInstance,
) -> Result<(), kube::Error> {
    let Ok(Some(secret)) = render::cloud_init_secret(vmi) else {
        return Ok(());
    };
    let ns = secret.metadata.namespace.clone().unwrap_or_default();
    let api = Api::<Secret>::namespaced(client.clone(), &ns);
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PostParams::default()
    };
    match api.create(&params, &secret).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use kubevirt_api::VirtualMachineInstance;
    use serde_json::json;

    use super::{ReconcileError, error_chain, finalizer_patch, status_patch};

    #[test]
    fn error_chain_names_the_cause() {
        let e = ReconcileError::Read {
            what: "launcher pods",
            source: kube::Error::LinesCodecMaxLineLengthExceeded,
        };
        assert_eq!(
            error_chain(&e),
            format!(
                "reading launcher pods: {}",
                kube::Error::LinesCodecMaxLineLengthExceeded
            )
        );
    }

    #[test]
    fn finalizer_patch_keeps_other_finalizers_and_carries_the_resource_version() {
        let vmi: VirtualMachineInstance = serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "a", "resourceVersion": "7", "finalizers": ["other"]},
            "spec": {"domain": {"devices": {}}}
        }))
        .unwrap();
        assert_eq!(
            finalizer_patch(&vmi, true),
            json!({"metadata": {"resourceVersion": "7",
                "finalizers": ["other", "kubevirt.io/virtualMachineControllerFinalize"]}})
        );
        assert_eq!(
            finalizer_patch(&vmi, false),
            json!({"metadata": {"resourceVersion": "7", "finalizers": ["other"]}})
        );
    }

    #[test]
    fn status_patch_nulls_removed_fields() {
        let p = status_patch(
            Some("3"),
            &json!({"phase": "Scheduling", "conditions": [{"type": "PodScheduled"}]}),
            &json!({"phase": "Scheduled", "nodeName": "n1"}),
        )
        .unwrap();
        assert_eq!(
            p,
            json!({"metadata": {"resourceVersion": "3"},
                   "status": {"phase": "Scheduled", "nodeName": "n1", "conditions": null}})
        );
        // A pod leaving activePods (the source after a migration) is nulled in the map.
        let p = status_patch(
            None,
            &json!({"activePods": {"src": "n1", "tgt": "n2"}}),
            &json!({"activePods": {"tgt": "n2"}}),
        )
        .unwrap();
        assert_eq!(
            p["status"],
            json!({"activePods": {"tgt": "n2", "src": null}})
        );
    }
}
