//! What the DataVolume controller does and what a DataVolume's status says, as pure
//! functions of the DataVolume, its claim and its importer pod (docs/design-datavolumes.md
//! §3.2). The reconciler only carries out the [`Plan`] and writes [`derive_status`].
//!
//! This slice carries out `http` (an importer pod fills the claim), `blank` (the
//! launcher makes the sparse `disk.img` itself, node/launcher/src/claims.rs) and `pvc`
//! within a namespace (a clone worker copies the source claim's disk, once the source is
//! bound, populated and used by no other pod); the other sources stay Pending with
//! `Running=False, NotSupported`.

use k8s_openapi::api::core::v1::{ContainerStateTerminated, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kubevirt_api::cdi::annotations as ann;
use kubevirt_api::cdi::phase;
use kubevirt_api::cdi::{
    DataVolume, DataVolumeCondition, DataVolumeSourceHttp, DataVolumeSourcePvc, DataVolumeStatus,
};
use kubevirt_api::common::ConditionStatus;
use serde::Deserialize;

use super::render;

/// Running reason of a source kubevirt-rs does not carry out yet.
pub const REASON_NOT_SUPPORTED: &str = "NotSupported";
/// Running reason (and Event) of a claim of the DataVolume's name that is not its own.
pub const REASON_RESOURCE_EXISTS: &str = "ErrResourceExists";
/// Running reason of a running importer (CDI's wording).
pub const REASON_POD_RUNNING: &str = "Pod is running";
/// Running message once the import is done (CDI's).
pub const MESSAGE_IMPORT_COMPLETE: &str = "Import Complete";
/// Running message once the upload is done (CDI's).
pub const MESSAGE_UPLOAD_COMPLETE: &str = "Upload Complete";
/// Running message once the clone is done (CDI's).
pub const MESSAGE_CLONE_COMPLETE: &str = "Clone Complete";

/// What fills a DataVolume's claim.
#[derive(Clone, Debug, PartialEq)]
pub enum Source<'a> {
    /// An importer pod downloads the image.
    Http(&'a DataVolumeSourceHttp),
    /// Nothing: the launcher creates a sparse `disk.img` on first use.
    Blank,
    /// A clone worker copies this claim of the DataVolume's namespace.
    Clone(&'a DataVolumeSourcePvc),
    /// An upload server takes the image from the upload proxy (`virtctl image-upload`).
    Upload,
    /// Not carried out by this slice; the string names it for the condition.
    Unsupported(String),
}

/// The source of `dv`, as far as this controller carries it out.
pub fn source(dv: &DataVolume) -> Source<'_> {
    if dv.spec.source_ref.is_some() {
        return Source::Unsupported("sourceRef (a DataSource)".into());
    }
    if dv.spec.content_type == Some(kubevirt_api::cdi::ContentType::Archive) {
        return Source::Unsupported("contentType archive".into());
    }
    let Some(src) = &dv.spec.source else {
        return Source::Unsupported("a DataVolume without a source".into());
    };
    if let Some(http) = &src.http {
        if render::volume_mode(dv) == "Block" {
            return Source::Unsupported("an http import into a Block-mode claim".into());
        }
        return Source::Http(http);
    }
    if src.blank.is_some() {
        return Source::Blank;
    }
    if src.upload.is_some() {
        if render::volume_mode(dv) == "Block" {
            return Source::Unsupported("an upload into a Block-mode claim".into());
        }
        return Source::Upload;
    }
    if let Some(pvc) = &src.pvc {
        if render::volume_mode(dv) == "Block" {
            return Source::Unsupported("a clone into a Block-mode claim".into());
        }
        // Admission refuses these; one stored before that rule is reported, not copied.
        if let Some(ns) = pvc.namespace.as_deref().filter(|n| !n.is_empty())
            && Some(ns) != dv.metadata.namespace.as_deref()
        {
            return Source::Unsupported(format!("a clone from another namespace ({ns})"));
        }
        return Source::Clone(pvc);
    }
    match src.types_set().first() {
        Some(t) => Source::Unsupported(format!("source {t}")),
        None => Source::Unsupported("a DataVolume without a source".into()),
    }
}

/// How the importer pod is doing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Importer {
    /// No pod.
    Absent,
    /// Created, its container not started (scheduling, pulling, waiting for the volume).
    Scheduled,
    /// Its container runs.
    Running,
    /// It finished: the claim holds the image.
    Succeeded,
    /// The pod itself failed (evicted, node lost): it is replaced.
    PodFailed(Failure),
}

/// Why an attempt failed: the importer's typed reason and its message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// `HTTPNotFound`, `ChecksumError`, … (the importer's), or kubelet's.
    pub reason: String,
    /// For people.
    pub message: String,
}

/// The importer's result line (node/importer/src/result.rs).
#[derive(Deserialize)]
struct ImporterResult {
    reason: Option<String>,
    message: Option<String>,
}

/// The failure a terminated container reports: the importer's JSON termination message,
/// else kubelet's reason and whatever text the message holds.
pub fn failure_of(t: &ContainerStateTerminated) -> Failure {
    let text = t.message.as_deref().unwrap_or_default().trim();
    let line = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default();
    match serde_json::from_str::<ImporterResult>(line) {
        Ok(r) if r.reason.is_some() => Failure {
            reason: r.reason.unwrap_or_default(),
            message: r.message.unwrap_or_default(),
        },
        _ => Failure {
            reason: t
                .reason
                .clone()
                .unwrap_or_else(|| phase::REASON_ERROR.into()),
            message: if text.is_empty() {
                format!("importer exited with code {}", t.exit_code)
            } else {
                text.to_string()
            },
        },
    }
}

/// The importer pod's state, its last failed attempt (if the latest attempt failed and no
/// later one succeeded) and its container's restart count.
pub fn importer(pod: Option<&Pod>) -> (Importer, Option<Failure>, i32) {
    let Some(pod) = pod else {
        return (Importer::Absent, None, 0);
    };
    let status = pod.status.clone().unwrap_or_default();
    let cs = status.container_statuses.unwrap_or_default();
    let c = cs
        .iter()
        .find(|c| {
            [
                render::IMPORTER_CONTAINER,
                render::CLONE_CONTAINER,
                render::UPLOAD_CONTAINER,
            ]
            .contains(&c.name.as_str())
        })
        .or(cs.first());
    let restarts = c.map_or(0, |c| c.restart_count);
    let state = c.and_then(|c| c.state.clone()).unwrap_or_default();
    let last = c
        .and_then(|c| c.last_state.as_ref())
        .and_then(|s| s.terminated.as_ref())
        .filter(|t| t.exit_code != 0)
        .map(failure_of);
    if status.phase.as_deref() == Some("Succeeded")
        || state.terminated.as_ref().is_some_and(|t| t.exit_code == 0)
    {
        return (Importer::Succeeded, None, restarts);
    }
    if status.phase.as_deref() == Some("Failed") {
        let f = state
            .terminated
            .as_ref()
            .map(failure_of)
            .unwrap_or_else(|| Failure {
                reason: status
                    .reason
                    .clone()
                    .unwrap_or_else(|| phase::REASON_ERROR.into()),
                message: status
                    .message
                    .clone()
                    .unwrap_or_else(|| "the importer pod failed".into()),
            });
        return (Importer::PodFailed(f.clone()), Some(f), restarts);
    }
    if let Some(t) = state.terminated.as_ref() {
        // Terminated non-zero, about to be restarted by kubelet (OnFailure).
        return (Importer::Running, Some(failure_of(t)), restarts);
    }
    if let Some(w) = state.waiting.as_ref() {
        let reason = w.reason.as_deref().unwrap_or_default();
        if matches!(
            reason,
            "ErrImagePull" | "ImagePullBackOff" | "InvalidImageName"
        ) {
            let f = Failure {
                reason: phase::REASON_IMAGE_PULL_FAILED.into(),
                message: w.message.clone().unwrap_or_else(|| reason.to_string()),
            };
            return (Importer::Scheduled, Some(f), restarts);
        }
        if reason == "CreateContainerConfigError" {
            let f = Failure {
                reason: reason.into(),
                message: w.message.clone().unwrap_or_default(),
            };
            return (Importer::Scheduled, Some(f), restarts);
        }
        // CrashLoopBackOff: the last attempt's failure stands.
        if last.is_some() {
            return (Importer::Running, last, restarts);
        }
        return (Importer::Scheduled, None, restarts);
    }
    if state.running.is_some() {
        // A retry runs; CDI keeps showing the previous attempt's failure until one succeeds.
        return (Importer::Running, last, restarts);
    }
    (Importer::Scheduled, None, restarts)
}

/// The pod is Ready (an upload server: it accepts an upload).
pub fn pod_ready(pod: Option<&Pod>) -> bool {
    pod.and_then(|p| p.status.as_ref())
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// The claim's `…storage.pod.phase` says the import is done.
pub fn claim_succeeded(pvc: &PersistentVolumeClaim) -> bool {
    pvc.annotations().get(ann::POD_PHASE).map(String::as_str) == Some(phase::SUCCEEDED)
}

fn claim_phase(pvc: &PersistentVolumeClaim) -> &str {
    pvc.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

/// What the controller observed of a DataVolume's objects.
#[derive(Clone, Copy, Debug)]
pub struct Observed<'a> {
    /// The claim of the DataVolume's name, if any (ours or not).
    pub claim: Option<&'a PersistentVolumeClaim>,
    /// The importer pod, if any.
    pub pod: Option<&'a Pod>,
    /// The claim's StorageClass binds on first consumer (WaitForFirstConsumer).
    pub wait_for_first_consumer: bool,
    /// Why the claim cannot be rendered (a fault of the spec), if it cannot.
    pub claim_error: Option<&'a str>,
    /// For a clone whose worker is not there yet: its source as read now; None when it was
    /// not looked at (not a clone, or nothing left to start).
    pub clone_source: Option<CloneSource<'a>>,
}

/// The claim a clone copies, as observed.
#[derive(Clone, Copy, Debug)]
pub struct CloneSource<'a> {
    /// The claim, None when it does not exist.
    pub claim: Option<&'a PersistentVolumeClaim>,
    /// The pods that use it and may write it ([`claim_users`]), `namespace/name`.
    pub users: &'a [String],
}

/// Why a clone cannot start yet: its Running reason and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CloneWait {
    /// [`phase::REASON_CLONE_WITHOUT_SOURCE`], [`phase::REASON_CLONE_SOURCE_NOT_READY`],
    /// [`phase::REASON_CLONE_SOURCE_IN_USE`] or [`phase::REASON_CLONE_VALIDATION_FAILED`].
    pub reason: &'static str,
    /// For people.
    pub message: String,
}

/// The pods of `pods` that use claim `claim` and may change it while it is copied: not
/// finished, and mounting it writable. Readers are left out (another clone of the same
/// source, a VM with the disk read-only): the content they see does not move.
pub fn claim_users(pods: &[Pod], claim: &str) -> Vec<String> {
    pods.iter()
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .filter(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.volumes.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|v| v.persistent_volume_claim.as_ref())
                .any(|c| c.claim_name == claim && c.read_only != Some(true))
        })
        .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
        .collect()
}

/// Whether a claim holds its data: one a DataVolume, an upload or a clone fills (CDI's
/// annotations, or a DataVolume controlling it) only once its worker recorded success; any
/// other claim as it is (its owner decides what it holds), as CDI's `IsPopulated`.
fn populated(pvc: &PersistentVolumeClaim) -> bool {
    let a = pvc.annotations();
    let filled_by_cdi = [ann::IMPORT_SOURCE, ann::UPLOAD_TARGET, ann::CLONE_REQUEST]
        .iter()
        .any(|k| a.contains_key(*k))
        || pvc
            .owner_references()
            .iter()
            .any(|r| r.controller == Some(true) && r.kind == "DataVolume");
    !filled_by_cdi || claim_succeeded(pvc)
}

/// What keeps the clone of `src` into `dv` from starting, if anything: CDI's checks before
/// its host-assisted clone. The source must exist, be bound and populated, be used by no
/// pod that may write it (the copy would be torn), and fit: same content type, Filesystem
/// (a Block source is not copied yet), and no larger than a size the DataVolume asks for.
pub fn clone_wait(
    dv: &DataVolume,
    src: &DataVolumeSourcePvc,
    observed: Option<&CloneSource<'_>>,
) -> Option<CloneWait> {
    let ns = dv.namespace().unwrap_or_default();
    let name = &src.name;
    let wait = |reason, message: String| Some(CloneWait { reason, message });
    let Some(observed) = observed else {
        return wait(
            phase::REASON_CLONE_SOURCE_NOT_READY,
            format!("looking at the source claim {ns}/{name}"),
        );
    };
    let Some(claim) = observed.claim else {
        // CDI's message.
        return wait(
            phase::REASON_CLONE_WITHOUT_SOURCE,
            format!("The source pvc {name} doesn't exist"),
        );
    };
    let source_type = claim
        .annotations()
        .get(ann::CONTENT_TYPE)
        .map_or("kubevirt", String::as_str);
    let target_type = dv.spec.content_type.map_or("kubevirt", |c| c.as_str());
    if source_type != target_type {
        return wait(
            phase::REASON_CLONE_VALIDATION_FAILED,
            format!(
                "Source contentType ({source_type}) and target contentType ({target_type}) do not match"
            ),
        );
    }
    if claim.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block") {
        return wait(
            phase::REASON_CLONE_VALIDATION_FAILED,
            format!(
                "the source claim {ns}/{name} is a Block-mode claim: kubevirt-rs clones \
                 Filesystem claims only, for now"
            ),
        );
    }
    let asked = dv
        .spec
        .pvc
        .as_ref()
        .and_then(|p| p.resources.as_ref())
        .or_else(|| dv.spec.storage.as_ref().and_then(|s| s.resources.as_ref()))
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .and_then(|q| kubevirt_api::quantity::parse_bytes(&q.0).ok())
        .map(|bytes| {
            // What the claim will request: storage: grows a Filesystem request by the
            // overhead (render::claim), pvc: is as written.
            if dv.spec.pvc.is_none() && render::volume_mode(dv) == "Filesystem" {
                crate::vmi::claims::request_for_disk(bytes)
            } else {
                bytes
            }
        });
    if let (Some(target), Some(source)) = (asked, render::requested_bytes(claim))
        && target < source
    {
        return wait(
            phase::REASON_CLONE_VALIDATION_FAILED,
            format!(
                "target resources requests storage size is smaller than the source: the claim \
                 would request {target} bytes, the source claim {ns}/{name} requests {source}; \
                 ask for at least as much, or leave the size out to take the source's"
            ),
        );
    }
    let phase_of = claim_phase(claim);
    if phase_of != "Bound" {
        return wait(
            phase::REASON_CLONE_SOURCE_NOT_READY,
            format!("the source claim {ns}/{name} is {phase_of}: waiting for it to be bound"),
        );
    }
    if !populated(claim) {
        let worker = claim
            .annotations()
            .get(ann::POD_PHASE)
            .map_or("not started", String::as_str);
        return wait(
            phase::REASON_CLONE_SOURCE_NOT_READY,
            format!(
                "the source claim {ns}/{name} is not populated yet (its worker: {worker}): \
                 waiting for its DataVolume to succeed"
            ),
        );
    }
    if let Some(pod) = observed.users.first() {
        // CDI's event message.
        let more = match observed.users.len() {
            1 => String::new(),
            n => format!(" (and {} more)", n - 1),
        };
        return wait(
            phase::REASON_CLONE_SOURCE_IN_USE,
            format!("pod {pod} using PersistentVolumeClaim {name}{more}"),
        );
    }
    None
}

/// What to do.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Create the claim ([`render::claim`]).
    pub create_claim: bool,
    /// Create the importer pod ([`render::importer_pod`]).
    pub create_pod: bool,
    /// Annotate the claim `…storage.pod.phase: Succeeded` (CDI's record that it is
    /// populated: `virtctl image-upload` and KubeVirt read it).
    pub mark_succeeded: bool,
    /// Delete this pod (name, uid): done, or failed as a pod.
    pub delete_pod: Option<(String, String)>,
    /// Set the claim's `…storage.pod.ready` to this (an upload server's readiness, which
    /// `virtctl image-upload pvc` waits for).
    pub mark_ready: Option<bool>,
}

fn owned<'a>(
    dv: &DataVolume,
    pvc: Option<&'a PersistentVolumeClaim>,
) -> Option<&'a PersistentVolumeClaim> {
    pvc.filter(|p| render::controlled_by(p.metadata.owner_references.as_deref(), dv))
}

fn done(dv: &DataVolume, claim: &PersistentVolumeClaim) -> bool {
    claim_succeeded(claim)
        || dv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phase::SUCCEEDED)
}

/// What the controller does for `dv` given what it observed.
pub fn plan(dv: &DataVolume, o: &Observed<'_>) -> Plan {
    let mut plan = Plan::default();
    if dv.metadata.deletion_timestamp.is_some() {
        // The garbage collector takes the claim and the pod with it.
        return plan;
    }
    let src = source(dv);
    if matches!(src, Source::Unsupported(_)) {
        return plan;
    }
    let blocked = blocked(dv, &src, o);
    let Some(claim) = o.claim else {
        // A clone's claim waits for its source too: it is sized from it, and a claim made
        // for a source that never comes would only hold storage.
        plan.create_claim = o.claim_error.is_none() && blocked.is_none();
        return plan;
    };
    let Some(claim) = owned(dv, Some(claim)) else {
        return plan;
    };
    let delete = |p: &Pod| Some((p.name_any(), p.uid().unwrap_or_default()));
    match src {
        Source::Blank => {
            plan.mark_succeeded = claim_phase(claim) == "Bound" && !claim_succeeded(claim);
        }
        Source::Http(_) | Source::Clone(_) | Source::Upload => {
            let (state, ..) = importer(o.pod);
            if done(dv, claim) {
                plan.mark_succeeded = !claim_succeeded(claim);
                plan.delete_pod = o.pod.and_then(delete);
            } else {
                match state {
                    Importer::Absent => plan.create_pod = blocked.is_none(),
                    Importer::Succeeded => {
                        plan.mark_succeeded = true;
                        plan.delete_pod = o.pod.and_then(delete);
                    }
                    Importer::PodFailed(_) => plan.delete_pod = o.pod.and_then(delete),
                    Importer::Scheduled | Importer::Running => {}
                }
            }
        }
        Source::Unsupported(_) => {}
    }
    if src == Source::Upload {
        let ready = pod_ready(o.pod) && !done(dv, claim);
        let noted = claim.annotations().get(ann::POD_READY).map(String::as_str);
        if noted != Some(if ready { "true" } else { "false" }) {
            plan.mark_ready = Some(ready);
        }
    }
    // A pod already on its way out is not deleted again.
    if plan.delete_pod.as_ref().is_some_and(|_| {
        o.pod
            .is_some_and(|p| p.metadata.deletion_timestamp.is_some())
    }) {
        plan.delete_pod = None;
    }
    plan
}

/// What keeps `dv`'s worker from starting: only a clone waits (on its source).
fn blocked(dv: &DataVolume, src: &Source<'_>, o: &Observed<'_>) -> Option<CloneWait> {
    match src {
        Source::Clone(pvc) => clone_wait(dv, pvc, o.clone_source.as_ref()),
        _ => None,
    }
}

/// The phase of a clone that waits: a source that does not fit is a fault of the spec
/// (Pending, as CDI leaves it); anything else waits for the source (CloneScheduled).
fn waiting(w: &CloneWait) -> (&'static str, (ConditionStatus, String, String)) {
    let phase_ = if w.reason == phase::REASON_CLONE_VALIDATION_FAILED {
        phase::PENDING
    } else {
        phase::CLONE_SCHEDULED
    };
    (
        phase_,
        (ConditionStatus::False, w.reason.into(), w.message.clone()),
    )
}

fn condition(
    old: Option<&DataVolumeStatus>,
    type_: &str,
    status: ConditionStatus,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> DataVolumeCondition {
    let prev = old.and_then(|s| s.condition(type_));
    let same = prev
        .is_some_and(|p| p.status == status && p.reason.as_deref().unwrap_or_default() == reason);
    // Stamped only when it changes: a status that says the same thing is not rewritten.
    let stamp = if same {
        prev.and_then(|p| p.last_transition_time.clone())
    } else {
        Some(Time(now))
    };
    let heartbeat =
        if same && prev.is_some_and(|p| p.message.as_deref().unwrap_or_default() == message) {
            prev.and_then(|p| p.last_heartbeat_time.clone())
        } else {
            Some(Time(now))
        };
    DataVolumeCondition {
        type_: type_.into(),
        status,
        last_transition_time: stamp,
        last_heartbeat_time: heartbeat,
        reason: Some(reason.to_string()).filter(|r| !r.is_empty()),
        message: Some(message.to_string()).filter(|m| !m.is_empty()),
    }
}

/// The status of `dv` given what was observed after the plan ran (the pod created in this
/// reconcile included), CDI's phases, conditions and reasons.
pub fn derive_status(dv: &DataVolume, o: &Observed<'_>, now: Timestamp) -> DataVolumeStatus {
    let old = dv.status.as_ref();
    let name = dv.name_any();
    let src = source(dv);
    let claim = owned(dv, o.claim);
    let (state, failure, restarts) = importer(o.pod);

    // Bound: the claim's phase.
    let bound = match (o.claim, claim) {
        (None, _) => (
            ConditionStatus::Unknown,
            phase::REASON_NOT_FOUND,
            "No PVC found".to_string(),
        ),
        (Some(_), None) => (
            ConditionStatus::False,
            REASON_RESOURCE_EXISTS,
            format!("PVC {name} already exists and is not owned by DataVolume {name}"),
        ),
        (_, Some(c)) => match claim_phase(c) {
            "Bound" => (
                ConditionStatus::True,
                phase::REASON_BOUND,
                format!("PVC {name} Bound"),
            ),
            "Lost" => (
                ConditionStatus::False,
                phase::REASON_CLAIM_LOST,
                "Claim Lost".to_string(),
            ),
            _ => (
                ConditionStatus::False,
                phase::REASON_PENDING,
                format!("PVC {name} Pending"),
            ),
        },
    };
    let claim_bound = bound.0 == ConditionStatus::True;
    let immediate = dv.annotations().contains_key(ann::BIND_IMMEDIATE_REQUESTED);
    let blocked = blocked(dv, &src, o);
    let clone = matches!(src, Source::Clone(_));
    let upload = src == Source::Upload;

    // Phase and the Running condition.
    let (phase_, running): (&str, (ConditionStatus, String, String)) = match (&src, claim) {
        // A clone waiting for its source, before its claim: says what it waits for.
        (Source::Clone(_), None) if o.claim.is_none() && blocked.is_some() => blocked
            .as_ref()
            .map_or((phase::PENDING, not_running()), waiting),
        (Source::Unsupported(what), _) => (
            phase::PENDING,
            (
                ConditionStatus::False,
                REASON_NOT_SUPPORTED.into(),
                format!("kubevirt-rs does not import from {what} yet"),
            ),
        ),
        _ if o.claim.is_some() && claim.is_none() => (
            phase::PENDING,
            (
                ConditionStatus::False,
                REASON_RESOURCE_EXISTS.into(),
                bound.2.clone(),
            ),
        ),
        (_, None) => match o.claim_error {
            Some(e) => (
                phase::PENDING,
                (
                    ConditionStatus::False,
                    phase::REASON_ERR_CLAIM_NOT_VALID.into(),
                    e.to_string(),
                ),
            ),
            None => (
                phase::PENDING,
                (ConditionStatus::False, String::new(), String::new()),
            ),
        },
        (Source::Blank, Some(c)) => {
            if claim_bound || claim_succeeded(c) {
                (phase::SUCCEEDED, completed(&src))
            } else if o.wait_for_first_consumer && !immediate {
                (phase::WAIT_FOR_FIRST_CONSUMER, not_running())
            } else {
                (phase::PENDING, not_running())
            }
        }
        (Source::Http(_) | Source::Clone(_) | Source::Upload, Some(c)) => {
            let (scheduled, in_progress) = if clone {
                (phase::CLONE_SCHEDULED, phase::CLONE_IN_PROGRESS)
            } else if upload {
                // CDI's: ready to take the upload, or not yet; a running server that
                // is not ready (just started, or converting what it received) is
                // scheduled.
                let ready = pod_ready(o.pod);
                (
                    phase::UPLOAD_SCHEDULED,
                    if ready {
                        phase::UPLOAD_READY
                    } else {
                        phase::UPLOAD_SCHEDULED
                    },
                )
            } else {
                (phase::IMPORT_SCHEDULED, phase::IMPORT_IN_PROGRESS)
            };
            if done(dv, c) || state == Importer::Succeeded {
                (phase::SUCCEEDED, completed(&src))
            } else if let Some(f) = &failure {
                (
                    if state == Importer::Scheduled {
                        scheduled
                    } else {
                        in_progress
                    },
                    (ConditionStatus::False, f.reason.clone(), f.message.clone()),
                )
            } else {
                match state {
                    Importer::Absent if blocked.is_some() => blocked
                        .as_ref()
                        .map_or((phase::PENDING, not_running()), waiting),
                    Importer::Absent if claim_bound => (phase::PVC_BOUND, not_running()),
                    Importer::Absent => (phase::PENDING, not_running()),
                    Importer::Scheduled => (scheduled, not_running()),
                    Importer::Running => (
                        in_progress,
                        (
                            ConditionStatus::True,
                            REASON_POD_RUNNING.into(),
                            String::new(),
                        ),
                    ),
                    // Covered above: a failed pod always carries its failure.
                    Importer::PodFailed(_) | Importer::Succeeded => (in_progress, not_running()),
                }
            }
        }
    };
    let (bound_status, bound_reason, mut bound_message) = bound;
    if phase_ == phase::WAIT_FOR_FIRST_CONSUMER {
        bound_message = format!(
            "PVC {name} Pending: its StorageClass binds it on the node of its first consumer \
             (the virtual machine's launcher pod)"
        );
    }
    let ready = match phase_ {
        phase::SUCCEEDED => (ConditionStatus::True, ""),
        phase::IMPORT_SCHEDULED
        | phase::IMPORT_IN_PROGRESS
        | phase::UPLOAD_SCHEDULED
        | phase::UPLOAD_READY => (ConditionStatus::False, phase::REASON_TRANSFER_RUNNING),
        // A clone waiting for its source has no transfer yet.
        phase::CLONE_SCHEDULED | phase::CLONE_IN_PROGRESS if o.pod.is_some() => {
            (ConditionStatus::False, phase::REASON_TRANSFER_RUNNING)
        }
        _ => (ConditionStatus::False, ""),
    };
    let conditions = vec![
        condition(old, phase::CONDITION_READY, ready.0, ready.1, "", now),
        condition(
            old,
            phase::CONDITION_BOUND,
            bound_status,
            bound_reason,
            &bound_message,
            now,
        ),
        condition(
            old,
            phase::CONDITION_RUNNING,
            running.0,
            &running.1,
            &running.2,
            now,
        ),
    ];
    let old_restarts = old.and_then(|s| s.restart_count).unwrap_or(0);
    DataVolumeStatus {
        claim_name: claim.map(|_| name.clone()),
        phase: Some(phase_.to_string()),
        progress: Some(
            if phase_ == phase::SUCCEEDED {
                phase::PROGRESS_DONE
            } else {
                phase::PROGRESS_NA
            }
            .to_string(),
        ),
        // The pod goes after success; its count stays.
        restart_count: Some(if o.pod.is_some() {
            restarts.max(0)
        } else {
            old_restarts
        }),
        conditions: Some(conditions),
    }
}

fn completed(src: &Source<'_>) -> (ConditionStatus, String, String) {
    (
        ConditionStatus::False,
        phase::REASON_COMPLETED.into(),
        match src {
            Source::Clone(_) => MESSAGE_CLONE_COMPLETE,
            Source::Upload => MESSAGE_UPLOAD_COMPLETE,
            _ => MESSAGE_IMPORT_COMPLETE,
        }
        .into(),
    )
}

fn not_running() -> (ConditionStatus, String, String) {
    (ConditionStatus::False, String::new(), String::new())
}

/// An Event to publish: warning?, reason, note.
pub type Note = (bool, &'static str, String);

/// The Events a status change is worth: phase changes, and each new failure (a failed
/// attempt, an unsupported source, an invalid claim).
pub fn events(dv: &DataVolume, new: &DataVolumeStatus) -> Vec<Note> {
    let name = dv.name_any();
    let old = dv.status.clone().unwrap_or_default();
    let mut out = Vec::new();
    let src = source(dv);
    let http = matches!(src, Source::Http(_));
    let upload = src == Source::Upload;
    // CDI's notes name the source as `namespace/name`.
    let from = match &src {
        Source::Clone(pvc) => format!(
            "{}/{}",
            pvc.namespace
                .as_deref()
                .filter(|n| !n.is_empty())
                .unwrap_or(&dv.namespace().unwrap_or_default()),
            pvc.name
        ),
        _ => String::new(),
    };
    let into = format!("{}/{name}", dv.namespace().unwrap_or_default());
    if old.phase != new.phase {
        let note = |p: &str| -> Option<(&'static str, String)> {
            Some(match p {
                phase::PENDING => (phase::PENDING, format!("PVC {name} Pending")),
                phase::PVC_BOUND => (phase::PVC_BOUND, format!("PVC {name} Bound")),
                phase::IMPORT_SCHEDULED => (
                    phase::IMPORT_SCHEDULED,
                    format!("Import into {name} scheduled"),
                ),
                phase::IMPORT_IN_PROGRESS => (
                    phase::IMPORT_IN_PROGRESS,
                    format!("Import into {name} in progress"),
                ),
                phase::WAIT_FOR_FIRST_CONSUMER => (
                    phase::WAIT_FOR_FIRST_CONSUMER,
                    format!("PVC {name} waits for its first consumer to bind"),
                ),
                phase::UPLOAD_SCHEDULED => (
                    phase::UPLOAD_SCHEDULED,
                    format!("Upload Scheduled for {name}"),
                ),
                phase::UPLOAD_READY => (phase::UPLOAD_READY, format!("Upload Ready for {name}")),
                phase::SUCCEEDED if upload => (
                    phase::REASON_UPLOAD_SUCCEEDED,
                    format!("Successfully uploaded into PVC {name}"),
                ),
                phase::SUCCEEDED if http => (
                    phase::REASON_IMPORT_SUCCEEDED,
                    format!("Successfully imported into PVC {name}"),
                ),
                phase::CLONE_SCHEDULED => (
                    phase::CLONE_SCHEDULED,
                    format!("Cloning from {from} into {into} scheduled"),
                ),
                phase::CLONE_IN_PROGRESS => (
                    phase::CLONE_IN_PROGRESS,
                    format!("Cloning from {from} into {into} in progress"),
                ),
                phase::SUCCEEDED if !from.is_empty() => (
                    phase::REASON_CLONE_SUCCEEDED,
                    format!("Successfully cloned from {from} into {into}"),
                ),
                phase::SUCCEEDED => (phase::SUCCEEDED, format!("PVC {name} is ready")),
                _ => return None,
            })
        };
        if let Some((reason, n)) = new.phase.as_deref().and_then(note) {
            out.push((false, reason, n));
        }
    }
    let running = |s: &DataVolumeStatus| {
        s.condition(phase::CONDITION_RUNNING)
            .filter(|c| c.status == ConditionStatus::False)
            .and_then(|c| Some((c.reason.clone()?, c.message.clone().unwrap_or_default())))
    };
    if let Some((reason, message)) = running(new)
        && reason != phase::REASON_COMPLETED
        && (running(&old) != running(new) || new.restart_count > old.restart_count)
    {
        let (r, note): (&'static str, String) = match reason.as_str() {
            REASON_NOT_SUPPORTED => (REASON_NOT_SUPPORTED, message),
            REASON_RESOURCE_EXISTS => (REASON_RESOURCE_EXISTS, message),
            phase::REASON_ERR_CLAIM_NOT_VALID => (phase::REASON_ERR_CLAIM_NOT_VALID, message),
            phase::REASON_CLONE_WITHOUT_SOURCE => (phase::REASON_CLONE_WITHOUT_SOURCE, message),
            phase::REASON_CLONE_SOURCE_IN_USE => (phase::REASON_CLONE_SOURCE_IN_USE, message),
            phase::REASON_CLONE_SOURCE_NOT_READY => (phase::REASON_CLONE_SOURCE_NOT_READY, message),
            phase::REASON_CLONE_VALIDATION_FAILED => {
                (phase::REASON_CLONE_VALIDATION_FAILED, message)
            }
            _ if !from.is_empty() => (
                phase::REASON_ERR_CLONE_FAILED,
                format!("Unable to clone from {from} into {into}: {reason}: {message}"),
            ),
            _ => (
                phase::REASON_ERR_IMPORT_FAILED,
                format!("Unable to import into PVC {name}: {reason}: {message}"),
            ),
        };
        out.push((true, r, note));
    }
    out
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
