//! What the reconciler's parts share: its state ([`Ctx`]), its error, its field manager, the
//! step a running reconcile is in, and which objects belong to the API layer. A module of
//! its own so that the steps (steps.rs, params.rs, cdi_step.rs, certs_step.rs,
//! etcd_membership.rs) and the loop that calls them (reconcile.rs) import from here, not
//! from each other.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::PatchParams;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Client, Resource};

use crate::kubevirt::KubeVirt;
use crate::metrics::Metrics;
use crate::render::{self, etcd};
use crate::rotation;
use crate::status::Defaults;

pub(crate) const MANAGER: &str = "virt-operator";

/// Why a reconcile failed (it is retried).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Render(#[from] render::RenderError),
    #[error(transparent)]
    Rotation(#[from] rotation::RotationError),
    #[error("{0}")]
    Other(String),
}

/// Shared state of the reconciler.
pub struct Ctx {
    pub client: Client,
    pub recorder: Option<Recorder>,
    pub defaults: Defaults,
    pub metrics: Arc<Metrics>,
    /// PVC size of etcd where a default StorageClass exists.
    pub etcd_volume_size: String,
    /// Where etcd's host directories go on a cluster without a default StorageClass.
    pub etcd_host_dir: String,
}

impl std::fmt::Debug for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx")
            .field("defaults", &self.defaults)
            .finish_non_exhaustive()
    }
}

impl Ctx {
    pub(crate) async fn event(&self, kv: &KubeVirt, type_: EventType, reason: &str, note: String) {
        let Some(r) = &self.recorder else {
            return;
        };
        // The API layer's bootstrap reconciles the operator's defaults, not a stored object:
        // there is nothing to attach an Event to.
        if kv.metadata.uid.is_none() {
            return;
        }
        step("publishing an Event");
        let reference: ObjectReference = kv.object_ref(&());
        // kube-runtime's recorder folds every Event with the same type, reason and action
        // into the series of the first one, which keeps that first note: the steps of an
        // etcd membership change (one reason, several messages) would show only the first.
        // The note's hash in the action keeps distinct messages apart; a repeated message
        // still counts up one series.
        let action = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            note.hash(&mut h);
            format!("{reason}-{:08x}", h.finish() as u32)
        };
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action,
            secondary: None,
        };
        if let Err(e) = r.publish(&ev, &reference).await {
            tracing::debug!(error = %e, reason, "could not publish event");
        }
    }
}

/// Which objects a reconcile applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scope {
    /// Everything a KubeVirt resource asks for.
    All,
    /// Only the API layer ([`is_api_layer`]): what serves `kubevirt.io/v1` (KubeVirt
    /// included) before any KubeVirt resource exists and after it is deleted.
    ApiLayer,
}

/// Whether a rendered object belongs to the API layer: etcd, virt-apiserver (with its RBAC,
/// PDB and Service), the APIServices, and the certificates and CA ConfigMap they use (all
/// Secrets: virt-apiserver mounts the handler client certificate too, and keeping the CAs
/// lets a re-install reuse them). Everything else (virt-controller, virt-handler, the user
/// roles) comes and goes with the KubeVirt resource.
pub fn is_api_layer(doc: &serde_json::Value) -> bool {
    let kind = doc["kind"].as_str().unwrap_or_default();
    let name = doc["metadata"]["name"].as_str().unwrap_or_default();
    matches!(kind, "Secret" | "ConfigMap" | "APIService")
        || name.starts_with(render::NAME)
        || name.starts_with(etcd::ETCD)
}

tokio::task_local! {
    /// What the running reconcile is doing, for the message when it misses its deadline.
    pub(crate) static STEP: Arc<std::sync::Mutex<&'static str>>;
}

/// Records what the running reconcile does next.
pub(crate) fn step(what: &'static str) {
    let _ = STEP.try_with(|s| {
        *s.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = what;
    });
}

pub(crate) fn pp() -> PatchParams {
    PatchParams::apply(MANAGER).force()
}
