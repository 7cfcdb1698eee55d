//! Admission that kube-apiserver does not run for aggregated resources and that we must
//! do ourselves: namespace lifecycle (no creation in missing or terminating namespaces), and
//! the claims a VM infers its instance type and preference from.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{StatusCause, StatusDetails};

use crate::error::{ApiError, ApiResult};

/// Namespace phase lookups against kube-apiserver, cached briefly.
#[derive(Clone)]
pub struct NamespaceLifecycle {
    client: kube::Client,
    cache: moka::future::Cache<String, Option<String>>,
}

impl std::fmt::Debug for NamespaceLifecycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamespaceLifecycle").finish_non_exhaustive()
    }
}

impl NamespaceLifecycle {
    /// Uses `client` for lookups.
    pub fn new(client: kube::Client) -> Self {
        let cache = moka::future::Cache::builder()
            .max_capacity(10_000)
            .time_to_live(Duration::from_secs(2))
            .build();
        Self { client, cache }
    }

    async fn phase(&self, ns: &str) -> ApiResult<Option<String>> {
        if let Some(hit) = self.cache.get(ns).await {
            return Ok(hit);
        }
        let api: kube::Api<Namespace> = kube::Api::all(self.client.clone());
        let found = api.get_opt(ns).await.map_err(|e| {
            tracing::warn!(error = %e, namespace = %ns, "Namespace lookup failed");
            ApiError::internal("namespace lookup failed")
        })?;
        let phase = found.map(|n| {
            n.status
                .and_then(|s| s.phase)
                .unwrap_or_else(|| "Active".into())
        });
        // Only a yes is cached: a refusal (missing, terminating) is always checked live, since
        // a namespace deleted and created again within the cache's life would be refused.
        if phase.as_deref() == Some("Active") {
            self.cache.insert(ns.to_string(), phase.clone()).await;
        }
        Ok(phase)
    }

    /// PersistentVolumeClaim `ns/name` as kube-apiserver has it (its labels name a VM's
    /// default instance type and preference), or `None`. Read live: only a VM create that
    /// infers from a volume asks.
    pub async fn claim(&self, ns: &str, name: &str) -> ApiResult<Option<serde_json::Value>> {
        let api: kube::Api<PersistentVolumeClaim> = kube::Api::namespaced(self.client.clone(), ns);
        let found = api.get_opt(name).await.map_err(|e| {
            tracing::warn!(error = %e, namespace = %ns, claim = %name, "PersistentVolumeClaim lookup failed");
            ApiError::internal("PersistentVolumeClaim lookup failed")
        })?;
        Ok(found.map(|c| serde_json::json!({"metadata": {"name": c.metadata.name, "labels": c.metadata.labels}})))
    }

    /// ControllerRevision `ns/name` (apps/v1, kube-apiserver), or `None`: the copy of an
    /// instance type or preference a VM captured, which the `expand-spec` endpoints read.
    pub async fn controller_revision(
        &self,
        ns: &str,
        name: &str,
    ) -> ApiResult<Option<k8s_openapi::api::apps::v1::ControllerRevision>> {
        let api: kube::Api<k8s_openapi::api::apps::v1::ControllerRevision> =
            kube::Api::namespaced(self.client.clone(), ns);
        api.get_opt(name).await.map_err(|e| {
            tracing::warn!(error = %e, namespace = %ns, revision = %name, "ControllerRevision lookup failed");
            ApiError::internal("ControllerRevision lookup failed")
        })
    }

    /// Checks that objects may be created in `ns`.
    pub async fn admit_create(&self, ns: &str, resource: &str, name: &str) -> ApiResult<()> {
        match self.phase(ns).await?.as_deref() {
            None => {
                let mut e = ApiError::not_found(
                    crate::error::Gr {
                        resource: "namespaces",
                        group: "",
                    },
                    ns,
                );
                e.message = format!("namespaces {ns:?} not found");
                Err(e)
            }
            Some("Terminating") => {
                let mut e = ApiError::forbidden(
                    crate::error::Gr {
                        resource: "",
                        group: "",
                    },
                    name,
                    format!(
                        "{resource}.kubevirt.io {name:?} is forbidden: unable to create new content in namespace {ns} because it is being terminated"
                    ),
                );
                e.details = Some(StatusDetails {
                    name: Some(name.to_string()),
                    group: Some(kubevirt_api::GROUP.into()),
                    kind: Some(resource.to_string()),
                    causes: Some(vec![StatusCause {
                        reason: Some("NamespaceTerminating".into()),
                        message: Some(format!("namespace {ns} is being terminated")),
                        field: Some("metadata.namespace".into()),
                    }]),
                    ..Default::default()
                });
                Err(e)
            }
            Some(_) => Ok(()),
        }
    }
}
