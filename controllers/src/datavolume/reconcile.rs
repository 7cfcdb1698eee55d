//! Orchestration of one DataVolume reconcile; the decisions live in [`super::decide`] and
//! [`super::render`].

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource, ResourceExt};
use kubevirt_api::cdi::annotations as ann;
use kubevirt_api::cdi::{DataVolume, phase};
use serde_json::json;

use super::DataVolumes;
use super::decide::{self, CloneSource, Observed, Source};
use super::render;
use crate::context::FIELD_MANAGER;

/// Why a DataVolume reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The DataVolume object is malformed.
    #[error("DataVolume has no namespace or uid")]
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
    /// Creating, changing or deleting the claim or the importer pod failed.
    #[error("{what}")]
    Write {
        /// What was written.
        what: &'static str,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// Writing the DataVolume status failed.
    #[error("writing the DataVolume status")]
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
            Self::Write { .. } => "WriteFailed",
            Self::Status(_) => "FailedStatusUpdate",
            Self::Serialize(_) => "SerializeFailed",
        }
    }

    fn is_conflict(&self) -> bool {
        matches!(self, Self::Status(kube::Error::Api(s)) if s.is_conflict())
    }
}

fn code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

fn post() -> PostParams {
    PostParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PostParams::default()
    }
}

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..PatchParams::default()
    }
}

/// How soon a DataVolume whose claim cannot be made yet (no size, a class to appear)
/// looks again.
const RETRY_CLAIM: Duration = Duration::from_secs(30);
/// How soon a clone waiting for its source looks again (CDI's): the source claim and the
/// pods using it are not watched (another DataVolume's, or no DataVolume's at all).
const RETRY_CLONE_SOURCE: Duration = Duration::from_secs(5);

/// Whether the StorageClass of `claim` (or the one it will get) binds on first consumer.
fn binds_on_first_consumer(
    claim: Option<&PersistentVolumeClaim>,
    classes: &[Arc<StorageClass>],
) -> bool {
    let plain: Vec<StorageClass> = classes.iter().map(|c| (**c).clone()).collect();
    let name = claim
        .and_then(|c| c.spec.as_ref()?.storage_class_name.clone())
        .or_else(|| render::default_class(&plain).map(|c| c.name_any()));
    name.and_then(|n| plain.into_iter().find(|c| c.name_any() == n))
        .is_some_and(|c| c.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer"))
}

/// Reconciles one DataVolume: its claim and worker pod (importer or clone worker) from the
/// caches, a clone's source read live while it waits to start, the plan carried out, the
/// status written when it changed.
///
/// The caches may lag behind this controller's own writes; every write is safe against
/// that: creates of the claim and pod (fixed names) meet AlreadyExists and read the object
/// instead, the pod delete carries its uid, and an importer is only started after a fresh
/// read of the claim says it is not populated yet (so a finished import whose pod is gone
/// is never run again from a stale claim).
#[tracing::instrument(skip_all, fields(dv = %dv.name_any(), ns = dv.namespace().unwrap_or_default()))]
pub async fn reconcile(
    dv: Arc<DataVolume>,
    state: Arc<DataVolumes>,
) -> Result<Action, ReconcileError> {
    let ctx = &state.ctx;
    let ns = dv.namespace().ok_or(ReconcileError::NotPersisted)?;
    let uid = dv.uid().ok_or(ReconcileError::NotPersisted)?;
    let name = dv.name_any();
    for r in &state.ready {
        if !r.wait(crate::watch::READY_WAIT).await {
            return Ok(Action::requeue(crate::watch::READY_WAIT));
        }
    }
    let dvs = Api::<DataVolume>::namespaced(ctx.client.clone(), &ns);
    let claims = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &ns);
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), &ns);
    let dv = if state.stale.take(&uid) {
        match dvs
            .get_opt(&name)
            .await
            .map_err(|source| ReconcileError::Read {
                what: "DataVolume",
                source,
            })? {
            Some(fresh) if fresh.uid().as_deref() == Some(uid.as_str()) => fresh,
            _ => return Ok(Action::await_change()),
        }
    } else {
        (*dv).clone()
    };

    let pod_name = render::worker_pod_name(&dv);
    let mut claim: Option<PersistentVolumeClaim> = state
        .claims
        .get(&ObjectRef::new(&name).within(&ns))
        .map(|c| (*c).clone());
    let mut pod: Option<Pod> = state
        .pods
        .get(&ObjectRef::new(&pod_name).within(&ns))
        .map(|p| (*p).clone())
        // Only ours: a pod of that name another controller made is not our importer.
        .filter(|p| render::controlled_by(p.metadata.owner_references.as_deref(), &dv));
    let classes = state.classes.state();
    let plain: Vec<StorageClass> = classes.iter().map(|c| (**c).clone()).collect();
    // A clone with no worker yet and nothing copied: its source as it is now.
    let populated = dv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phase::SUCCEEDED)
        || claim.as_ref().is_some_and(decide::claim_succeeded);
    let looked = match decide::source(&dv) {
        Source::Clone(src) if pod.is_none() && !populated => {
            Some(read_clone_source(&claims, &pods, &src.name).await?)
        }
        _ => None,
    };
    let clone_source = looked.as_ref().map(|(claim, users)| CloneSource {
        claim: claim.as_ref(),
        users,
    });
    let rendered = render::claim(&dv, &plain, clone_source.and_then(|s| s.claim));
    let claim_error = rendered.as_ref().err().map(ToString::to_string);
    let plan = decide::plan(
        &dv,
        &Observed {
            claim: claim.as_ref(),
            pod: pod.as_ref(),
            wait_for_first_consumer: false,
            claim_error: claim_error.as_deref(),
            clone_source,
        },
    );
    tracing::debug!(?plan, "planned");

    if plan.create_claim
        && let Ok(desired) = &rendered
    {
        match claims.create(&post(), desired).await {
            Ok(c) => {
                tracing::info!(claim = %name, class = ?c.spec.as_ref().and_then(|s| s.storage_class_name.clone()), "created claim");
                claim = Some(c);
            }
            // A claim of that name the cache has not shown (ours, or someone else's:
            // decide reports the latter).
            Err(e) if code(&e) == Some(409) => {
                claim = claims
                    .get_opt(&name)
                    .await
                    .map_err(|source| ReconcileError::Read {
                        what: "PersistentVolumeClaim",
                        source,
                    })?;
            }
            Err(source) => {
                return Err(ReconcileError::Write {
                    what: "creating the claim",
                    source,
                });
            }
        }
    }
    if plan.mark_succeeded {
        let patch = json!({"metadata": {"annotations": {ann::POD_PHASE: phase::SUCCEEDED}}});
        match claims
            .patch(&name, &patch_params(), &Patch::Merge(&patch))
            .await
        {
            Ok(c) => claim = Some(c),
            Err(e) if code(&e) == Some(404) => {}
            Err(source) => {
                return Err(ReconcileError::Write {
                    what: "annotating the claim populated",
                    source,
                });
            }
        }
    }
    if let Some(ready) = plan.mark_ready {
        // What `virtctl image-upload pvc` polls before it sends the image.
        let value = if ready { "true" } else { "false" };
        let patch = json!({"metadata": {"annotations": {ann::POD_READY: value}}});
        match claims
            .patch(&name, &patch_params(), &Patch::Merge(&patch))
            .await
        {
            Ok(c) => claim = Some(c),
            Err(e) if code(&e) == Some(404) => {}
            Err(source) => {
                return Err(ReconcileError::Write {
                    what: "annotating the claim's upload server ready",
                    source,
                });
            }
        }
    }
    if let Some((pod_name, pod_uid)) = &plan.delete_pod {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(pod_uid.clone()),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match pods.delete(pod_name, &params).await {
            Ok(_) => tracing::info!(pod = %pod_name, "deleted importer pod"),
            // Gone already, or replaced.
            Err(e) if matches!(code(&e), Some(404 | 409)) => {}
            Err(source) => {
                return Err(ReconcileError::Write {
                    what: "deleting the importer pod",
                    source,
                });
            }
        }
        // The status is derived from the claim from now on.
        if decide::importer(pod.as_ref()).0 == decide::Importer::Succeeded {
            pod = None;
        }
    }
    let src = decide::source(&dv);
    if plan.create_pod && matches!(src, Source::Http(_) | Source::Clone(_) | Source::Upload) {
        // Fresh: a populated claim whose importer is gone must not be imported into again.
        let fresh = claims
            .get_opt(&name)
            .await
            .map_err(|source| ReconcileError::Read {
                what: "PersistentVolumeClaim",
                source,
            })?;
        match fresh {
            Some(c) if decide::claim_succeeded(&c) => claim = Some(c),
            None => claim = None,
            Some(c) => {
                let desired = match &src {
                    Source::Clone(from) => render::clone_pod(&dv, from, &c, &state.importer),
                    Source::Http(http) => render::importer_pod(&dv, http, &c, &state.importer),
                    Source::Upload => render::upload_pod(&dv, &c, &state.importer),
                    // No worker is ever planned for these (decide::plan).
                    Source::Blank | Source::Unsupported(_) => {
                        Err(render::RenderError::NoClaimSpec(name.clone()))
                    }
                };
                match desired {
                    Ok(desired) => match pods.create(&post(), &desired).await {
                        Ok(p) => {
                            let (url, from) = match &src {
                                Source::Http(h) => (Some(h.url.as_str()), None),
                                Source::Clone(f) => (None, Some(f.name.as_str())),
                                _ => (None, None),
                            };
                            tracing::info!(pod = %p.name_any(), url, clone_of = from, "created worker pod");
                            pod = Some(p);
                        }
                        Err(e) if code(&e) == Some(409) => {
                            pod = pods.get_opt(&pod_name).await.map_err(|source| {
                                ReconcileError::Read {
                                    what: "worker pod",
                                    source,
                                }
                            })?;
                        }
                        Err(source) => {
                            return Err(ReconcileError::Write {
                                what: "creating the worker pod",
                                source,
                            });
                        }
                    },
                    // Only a claim too small for any disk: the status says the claim is
                    // not valid until the spec changes.
                    Err(e) => tracing::warn!(error = %e, "worker pod cannot be rendered"),
                }
                claim = Some(c);
            }
        }
    }

    let wffc = binds_on_first_consumer(claim.as_ref(), &classes);
    let observed = Observed {
        claim: claim.as_ref(),
        pod: pod.as_ref(),
        wait_for_first_consumer: wffc,
        claim_error: claim_error.as_deref(),
        clone_source,
    };
    let status = decide::derive_status(&dv, &observed, Timestamp::now());
    // A clone waiting for its source looks again soon; one whose source does not fit (a
    // fault of the spec, or of the source's owner) less often.
    let clone_retry = match &src {
        Source::Clone(from)
            if pod.is_none() && status.phase.as_deref() != Some(phase::SUCCEEDED) =>
        {
            decide::clone_wait(&dv, from, observed.clone_source.as_ref()).map(|w| {
                if w.reason == phase::REASON_CLONE_VALIDATION_FAILED {
                    RETRY_CLAIM
                } else {
                    RETRY_CLONE_SOURCE
                }
            })
        }
        _ => None,
    };
    let old = dv.status.clone().unwrap_or_default();
    let notes = decide::events(&dv, &status);
    if status != old {
        let patch = crate::vmi::reconcile::status_patch(
            dv.metadata.resource_version.as_deref(),
            &old,
            &status,
        )?;
        dvs.patch_status(&name, &patch_params(), &Patch::Merge(&patch))
            .await
            .map_err(ReconcileError::Status)?;
        if old.phase != status.phase {
            tracing::info!(from = ?old.phase, to = ?status.phase, "DataVolume phase");
        }
    }
    let regarding = dv.object_ref(&());
    for (warning, reason, note) in notes {
        let type_ = if warning {
            EventType::Warning
        } else {
            EventType::Normal
        };
        ctx.event(&regarding, type_, reason, note).await;
    }
    ctx.backoff.reset(&uid);
    if let Some(after) = clone_retry {
        return Ok(Action::requeue(after));
    }
    if claim.is_none() && claim_error.is_some() {
        return Ok(Action::requeue(RETRY_CLAIM));
    }
    Ok(Action::requeue(ctx.config.resync))
}

/// The claim `name` a clone copies (the DataVolume's namespace: `claims`, `pods`) and the
/// pods that may write it ([`decide::claim_users`]). Read live: neither is in the caches,
/// which hold CDI's claims and pods only, and this is read only while a clone waits to start.
async fn read_clone_source(
    claims: &Api<PersistentVolumeClaim>,
    pods: &Api<Pod>,
    name: &str,
) -> Result<(Option<PersistentVolumeClaim>, Vec<String>), ReconcileError> {
    let claim = claims
        .get_opt(name)
        .await
        .map_err(|source| ReconcileError::Read {
            what: "the clone's source claim",
            source,
        })?;
    if claim.is_none() {
        return Ok((None, Vec::new()));
    }
    let listed =
        pods.list(&ListParams::default())
            .await
            .map_err(|source| ReconcileError::Read {
                what: "the pods using the clone's source claim",
                source,
            })?;
    Ok((claim, decide::claim_users(&listed.items, name)))
}

/// Retry policy: conflicts retry at once on a fresh read, other errors back off per object.
pub fn error_policy(dv: Arc<DataVolume>, err: &ReconcileError, state: Arc<DataVolumes>) -> Action {
    let key = dv.uid().unwrap_or_else(|| dv.name_any());
    if err.is_conflict() {
        state.stale.mark(&key);
        return Action::requeue(Duration::from_millis(50));
    }
    let delay = state.ctx.backoff.next_delay_after(&key, err);
    tracing::warn!(dv = %dv.name_any(), error = %crate::vmi::reconcile::error_chain(err), reason = err.reason(), retry_in = ?delay, "reconcile failed");
    Action::requeue(delay)
}
