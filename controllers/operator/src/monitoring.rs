//! Keeps KubeVirt's ServiceMonitor, PrometheusRule and monitoring RBAC
//! ([`crate::render::monitoring`]) in step with the cluster, as KubeVirt's virt-operator: only
//! where the prometheus-operator's CRDs exist and Prometheus' ServiceAccount is found. Checked on
//! every reconcile (KubeVirt checks once, at start), so a prometheus-operator installed later is
//! picked up within a reconcile period without restarting the operator. The
//! `kubevirt-prometheus-metrics` Service is not here: it is always rendered
//! (`render::static_manifest`).

use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use kube::{Client, ResourceExt};

use crate::kubevirt::KubeVirt;
use crate::render::NAMESPACE;
use crate::render::monitoring::{
    self as mon, MONITORING_GROUP, Monitor, MonitoringApis, PROMETHEUS_RULE_CRD, RBAC_NAME,
    RULE_NAME, SERVICE_MONITOR_CRD,
};

/// Why keeping the monitoring objects failed (the reconcile goes on; the next one retries).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Render(#[from] crate::render::RenderError),
    #[error("encoding {0}: {1}")]
    Encode(&'static str, serde_json::Error),
}

/// What a sync did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Synced {
    /// The prometheus-operator kinds the cluster serves.
    pub apis: MonitoringApis,
    /// Where Prometheus was found (`None`: not looked for, or not found).
    pub monitor: Option<Monitor>,
    /// Objects applied and deleted.
    pub applied: usize,
    pub deleted: usize,
}

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(MONITORING_GROUP, "v1", kind), plural)
}

fn service_monitors() -> ApiResource {
    resource("ServiceMonitor", "servicemonitors")
}

fn prometheus_rules() -> ApiResource {
    resource("PrometheusRule", "prometheusrules")
}

/// Which of the prometheus-operator's CRDs exist.
pub async fn apis(client: &Client) -> Result<MonitoringApis, kube::Error> {
    Ok(MonitoringApis {
        service_monitors: crate::kubevirt::crd_exists(client, SERVICE_MONITOR_CRD).await?,
        prometheus_rules: crate::kubevirt::crd_exists(client, PROMETHEUS_RULE_CRD).await?,
    })
}

/// Prometheus' ServiceAccount as KubeVirt looks for it: the first candidate namespace that
/// exists and holds the account ([`mon::monitor_candidates`]).
pub async fn find_monitor(client: &Client, kv: &KubeVirt) -> Result<Option<Monitor>, kube::Error> {
    let (namespaces, account) = mon::monitor_candidates(
        kv.spec.monitor_namespace.as_deref(),
        kv.spec.monitor_account.as_deref(),
    );
    let nss: Api<Namespace> = Api::all(client.clone());
    for ns in namespaces {
        if nss.get_opt(&ns).await?.is_none() {
            continue;
        }
        let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
        if sas.get_opt(&account).await?.is_some() {
            let service_monitor_namespace = kv
                .spec
                .service_monitor_namespace
                .clone()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| ns.clone());
            return Ok(Some(Monitor {
                namespace: ns,
                account,
                service_monitor_namespace,
            }));
        }
    }
    Ok(None)
}

/// Applies what `kv` calls for on this cluster and deletes the operator's monitoring objects
/// it no longer does (a moved ServiceMonitor namespace, a Prometheus gone); `kv` `None`
/// (uninstall): deletes them all. Without the CRDs there is nothing of their kinds to keep.
///
/// `crd_uid`: the KubeVirt CRD's, owner of a ServiceMonitor outside the install namespace
/// (garbage-collected with manifests/virt-operator.yaml, as every object outside it).
pub async fn sync(
    client: &Client,
    kv: Option<&KubeVirt>,
    crd_uid: &str,
    manager: &str,
) -> Result<Synced, Error> {
    let apis = apis(client).await?;
    let monitor = match kv {
        Some(kv) if apis.service_monitors || apis.prometheus_rules => {
            find_monitor(client, kv).await?
        }
        _ => None,
    };
    let desired = mon::monitoring_objects(apis, monitor.as_ref())?;
    let mut synced = Synced {
        apis,
        monitor,
        ..Synced::default()
    };
    let pp = PatchParams::apply(manager).force();
    let mut want_rbac = false;
    let mut want_sm_ns = None;
    let mut want_rule = false;
    for mut obj in desired {
        match obj["kind"].as_str() {
            Some("Role") => {
                want_rbac = true;
                let role: Role =
                    serde_json::from_value(obj).map_err(|e| Error::Encode("Role", e))?;
                Api::<Role>::namespaced(client.clone(), NAMESPACE)
                    .patch(RBAC_NAME, &pp, &Patch::Apply(&role))
                    .await?;
            }
            Some("RoleBinding") => {
                let rb: RoleBinding =
                    serde_json::from_value(obj).map_err(|e| Error::Encode("RoleBinding", e))?;
                Api::<RoleBinding>::namespaced(client.clone(), NAMESPACE)
                    .patch(RBAC_NAME, &pp, &Patch::Apply(&rb))
                    .await?;
            }
            Some("ServiceMonitor") => {
                let ns = obj["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or(NAMESPACE)
                    .to_string();
                if ns != NAMESPACE {
                    obj["metadata"]["ownerReferences"] = serde_json::json!([{
                        "apiVersion": "apiextensions.k8s.io/v1",
                        "kind": "CustomResourceDefinition",
                        "name": kubevirt_api::kubevirt::CRD_NAME,
                        "uid": crd_uid,
                    }]);
                }
                Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &service_monitors())
                    .patch(RULE_NAME, &pp, &Patch::Apply(&obj))
                    .await?;
                want_sm_ns = Some(ns);
            }
            Some("PrometheusRule") => {
                want_rule = true;
                Api::<DynamicObject>::namespaced_with(
                    client.clone(),
                    NAMESPACE,
                    &prometheus_rules(),
                )
                .patch(RULE_NAME, &pp, &Patch::Apply(&obj))
                .await?;
            }
            _ => continue,
        }
        synced.applied += 1;
    }

    // Only objects the operator made: its name and its part-of label (a user's own
    // ServiceMonitor of that name stays).
    let ours = ListParams::default().labels("app.kubernetes.io/part-of=kubevirt-rs");
    if apis.service_monitors {
        let all: Api<DynamicObject> = Api::all_with(client.clone(), &service_monitors());
        for sm in all.list(&ours).await? {
            let ns = sm.namespace().unwrap_or_default();
            if sm.name_any() == RULE_NAME && want_sm_ns.as_deref() != Some(ns.as_str()) {
                let api: Api<DynamicObject> =
                    Api::namespaced_with(client.clone(), &ns, &service_monitors());
                synced.deleted += delete(&api, RULE_NAME).await?;
            }
        }
    }
    if apis.prometheus_rules && !want_rule {
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), NAMESPACE, &prometheus_rules());
        if api
            .list(&ours)
            .await?
            .items
            .iter()
            .any(|r| r.name_any() == RULE_NAME)
        {
            synced.deleted += delete(&api, RULE_NAME).await?;
        }
    }
    if !want_rbac {
        let roles: Api<Role> = Api::namespaced(client.clone(), NAMESPACE);
        if is_ours(roles.get_opt(RBAC_NAME).await?.as_ref()) {
            synced.deleted += delete(&roles, RBAC_NAME).await?;
        }
        let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), NAMESPACE);
        if is_ours(bindings.get_opt(RBAC_NAME).await?.as_ref()) {
            synced.deleted += delete(&bindings, RBAC_NAME).await?;
        }
    }
    Ok(synced)
}

fn is_ours<K: kube::Resource>(o: Option<&K>) -> bool {
    o.is_some_and(|o| {
        o.labels()
            .get("app.kubernetes.io/part-of")
            .map(String::as_str)
            == Some("kubevirt-rs")
    })
}

/// Deletes `name`; 1 when it was there.
async fn delete<K>(api: &Api<K>, name: &str) -> Result<usize, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(1),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(0),
        Err(e) => Err(e),
    }
}
