//! The steps of [`crate::reconcile`]'s install, in the order it runs them (install itself is
//! only that list), and what its uninstall deletes. Each step names itself ([`step`]) for the message of a reconcile that misses
//! its deadline.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret, Service};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
};
use kube::runtime::events::EventType;
use kube::{Client, Resource, ResourceExt};
use kubevirt_api::kubevirt::KubeVirtStatus;

use crate::cdi_step::{self, CdiState};
use crate::certs_step::{self, Certs};
use crate::ctx::{Ctx, Error, MANAGER, Scope, is_api_layer, pp, step};
use crate::etcd_membership::{self, Found};
use crate::kubevirt::{FINALIZER, KubeVirt, WORKLOADS, workload_resource};
use crate::params::{self, EtcdLayout, parse_docs};
use crate::policy::{CertPolicy, PolicyError};
use crate::render::components::{self, HandlerTls};
use crate::render::etcd::{self, EtcdParams, EtcdStorage, EtcdTls};
use crate::render::{self, ClusterAuth, EtcdMode, NAMESPACE, Params, Tls};
use crate::rotation::{self, Domain};
use crate::status::{self, Observed, Target};
use crate::{cdi, etcd_evacuation, etcd_members, instancetypes, monitoring};

/// Adds the finalizer (a KubeVirt resource's, not the bootstrap's defaults) and announces a
/// version not deployed yet.
pub(crate) async fn start(kv: &KubeVirt, ctx: &Ctx, scope: Scope) -> Result<Target, Error> {
    if scope == Scope::All && !kv.finalizers().iter().any(|f| f == FINALIZER) {
        let mut fins = kv.finalizers().to_vec();
        fins.push(FINALIZER.into());
        Api::<KubeVirt>::namespaced(ctx.client.clone(), NAMESPACE)
            .patch(
                &kv.name_any(),
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"metadata": {"finalizers": fins}})),
            )
            .await?;
    }
    step("adding the finalizer");
    let target = status::target(&kv.spec, &ctx.defaults);
    if kv
        .status
        .as_ref()
        .and_then(|s| s.target_kube_virt_version.as_deref())
        != Some(&target.version)
    {
        ctx.event(
            kv,
            EventType::Normal,
            "Deploying",
            format!(
                "Deploying version {} from {}",
                target.version, target.registry
            ),
        )
        .await;
    }
    Ok(target)
}

/// Applies etcd's Service and returns its cluster IP.
pub(crate) async fn etcd_service(client: &Client) -> Result<String, Error> {
    step("applying etcd's Service");
    // etcd's Service first: its cluster IP goes into etcd's serving certificate.
    let svc = serde_json::to_value(etcd::service()).map_err(|e| Error::Other(e.to_string()))?;
    let svc = Api::<Service>::namespaced(client.clone(), NAMESPACE)
        .patch(etcd::ETCD, &pp(), &Patch::Apply(&svc))
        .await?;
    svc.spec
        .and_then(|s| s.cluster_ip)
        .filter(|ip| !ip.is_empty() && ip != "None")
        .ok_or_else(|| Error::Other("etcd Service has no cluster IP yet".into()))
}

/// The fields kubevirt-rs does not support, for the status; a Warning when the spec changed.
pub(crate) async fn unsupported_fields(kv: &KubeVirt, ctx: &Ctx) -> Option<String> {
    // Once per spec change: the status records the generation it was computed from.
    let spec_changed =
        kv.status.as_ref().and_then(|s| s.observed_generation) != kv.meta().generation;
    let unsupported = status::unsupported_note(&kv.spec);
    if spec_changed && let Some(note) = &unsupported {
        ctx.event(
            kv,
            EventType::Warning,
            status::UNSUPPORTED_FIELDS,
            note.clone(),
        )
        .await;
    }
    unsupported
}

/// The KubeVirt CRD's uid: the owner of what the namespaced resource cannot own
/// ([`owned_by_crd`]).
pub(crate) async fn kubevirt_crd_uid(client: &Client) -> Result<String, Error> {
    // A missing CRD (manifests/virt-operator.yaml being deleted) fails the reconcile: nothing
    // is applied that the garbage collector would delete again at once.
    step("reading the KubeVirt CRD and etcd's StatefulSet");
    Ok(Api::<CustomResourceDefinition>::all(client.clone())
        .get(KUBEVIRT_CRD)
        .await?
        .metadata
        .uid
        .unwrap_or_default())
}

/// Whether a real CDI is installed ([`crate::cdi`]).
pub(crate) async fn cdi_state(client: &Client) -> Result<CdiState, Error> {
    // A real CDI owns cdi.kubevirt.io where its DataVolume CRD exists (crate::cdi).
    step("checking whether CDI is installed");
    Ok(cdi_step::cdi_state(client).await?)
}

/// What the reconcile knows of etcd before changing anything.
pub(crate) struct EtcdView {
    pub(crate) existing: Option<StatefulSet>,
    pub(crate) storage: EtcdStorage,
    pub(crate) nodes: Vec<Node>,
    pub(crate) pods: Vec<Pod>,
    /// Ordinals of the members on nodes being drained.
    pub(crate) leaving: BTreeSet<usize>,
    /// The members asked for (`None`: keep what there is), or what is wrong with the field.
    pub(crate) requested: Result<Option<usize>, String>,
    pub(crate) layout: EtcdLayout,
}

/// Reads etcd's StatefulSet, storage, nodes and pods, and decides its layout.
pub(crate) async fn observe_etcd(
    kv: &KubeVirt,
    ctx: &Ctx,
    scope: Scope,
    crd_uid: &str,
) -> Result<EtcdView, Error> {
    let client = &ctx.client;
    let existing = Api::<StatefulSet>::namespaced(client.clone(), NAMESPACE)
        .get_opt(etcd::ETCD)
        .await?;
    let storage = etcd_membership::etcd_storage(client, ctx, existing.as_ref(), crd_uid).await?;
    step("reading the nodes and etcd's pods");
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default().labels(&etcd::pod_selector()))
        .await?
        .items;
    let leaving = etcd_evacuation::leaving(&pods, &nodes, k8s_openapi::jiff::Timestamp::now());
    let current_members = existing
        .as_ref()
        .filter(|s| etcd::is_cluster(s))
        .and_then(|s| s.spec.as_ref())
        .and_then(|s| s.replicas)
        .and_then(|r| usize::try_from(r).ok())
        .unwrap_or(1);
    // The bootstrap (no KubeVirt resource) never changes the membership: it keeps what the
    // last resource asked for.
    let requested = match scope {
        Scope::All => params::etcd_members(kv).map(|n| {
            n.or_else(|| {
                Some(params::default_etcd_members(
                    nodes
                        .iter()
                        .filter(|n| etcd_evacuation::schedulable(n))
                        .count(),
                    current_members,
                    matches!(storage, EtcdStorage::Claim { .. }),
                ))
            })
        }),
        Scope::ApiLayer => Ok(None),
    };
    let layout = params::etcd_layout(
        requested.clone().ok().flatten(),
        &storage,
        existing.as_ref(),
        !leaving.is_empty(),
    );
    Ok(EtcdView {
        existing,
        storage,
        nodes,
        pods,
        leaving,
        requested,
        layout,
    })
}

/// Each invalid part of the configuration, joined for the Degraded condition; a Warning
/// saying what is done instead unless the condition already says so.
pub(crate) async fn invalid_configuration(
    kv: &KubeVirt,
    ctx: &Ctx,
    policy: &Result<CertPolicy, PolicyError>,
    etcd: &EtcdView,
) -> Option<String> {
    // Each invalid part of the configuration: the field at fault, and what is done instead.
    let invalid: Vec<(String, &str)> = [
        policy
            .as_ref()
            .err()
            .map(|e| (e.to_string(), "the certificates are kept as they are")),
        etcd.requested
            .clone()
            .err()
            .or(etcd.layout.refused.clone())
            .map(|e| (e, "etcd keeps the members it has")),
        params::eviction_strategy(kv)
            .err()
            .map(|e| (e, "VMIs without their own evictionStrategy use None")),
        params::instancetype_flags(kv)
            .err()
            .map(|e| (e, "VMs keep their instance types by reference")),
        params::live_update_flags(kv)
            .err()
            .map(|e| (e, "running VMs get template changes at their next restart")),
        params::workload_update(kv).err().map(|e| {
            (
                e,
                "VMIs are not moved onto a new virt-launcher automatically",
            )
        }),
    ]
    .into_iter()
    .flatten()
    .collect();
    let invalid_config = (!invalid.is_empty()).then(|| {
        invalid
            .iter()
            .map(|(e, _)| e.as_str())
            .collect::<Vec<_>>()
            .join("; ")
    });
    if let Some(why) = &invalid_config {
        let already = kv
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| {
                c.iter().any(|c| {
                    c.type_ == "Degraded"
                        && c.reason.as_deref() == Some(status::INVALID_CONFIGURATION)
                        && c.message.as_deref() == Some(why.as_str())
                })
            });
        if !already {
            ctx.event(
                kv,
                EventType::Warning,
                status::INVALID_CONFIGURATION,
                invalid
                    .iter()
                    .map(|(e, then)| format!("{e}; {then}"))
                    .collect::<Vec<_>>()
                    .join("; "),
            )
            .await;
        }
    }
    invalid_config
}

/// The etcd members' cluster IPs by ordinal, their Services applied (none for a single
/// member).
pub(crate) async fn member_ips(client: &Client, layout: &EtcdLayout) -> Result<Vec<String>, Error> {
    if layout.cluster {
        step("applying the etcd members' Services");
        etcd_membership::member_service_ips(client).await
    } else {
        Ok(Vec::new())
    }
}

/// Renews the certificates and makes the upload token key; each rotation is logged, counted
/// and announced.
pub(crate) async fn certificates(
    kv: &KubeVirt,
    ctx: &Ctx,
    etcd_hosts: &etcd::EtcdHosts,
    policy: &Result<CertPolicy, PolicyError>,
    now: time::OffsetDateTime,
) -> Result<Certs, Error> {
    let client = &ctx.client;
    step("reading and renewing certificates");
    let certs = certs_step::certificates(client, etcd_hosts, policy.as_ref().ok(), now).await?;
    cdi_step::upload_token_key(client).await?;
    let delay = policy
        .as_ref()
        .map(CertPolicy::propagation_delay)
        .unwrap_or(crate::policy::PROPAGATION_DELAY);
    for (domain, decision, had_leaves) in &certs.changes {
        let Some((note, what)) = certs_step::rotation_note(*domain, decision, *had_leaves, delay)
        else {
            continue;
        };
        tracing::info!(domain = domain.label(), "{note}");
        if let Some(what) = what {
            ctx.metrics.rotated(domain.label(), what);
        }
        ctx.event(kv, EventType::Normal, "CertificateRotated", note)
            .await;
    }
    Ok(certs)
}

/// One step of etcd's membership where etcd is a cluster; a single member only says why it
/// cannot move off a node being drained.
pub(crate) async fn membership(
    kv: &KubeVirt,
    ctx: &Ctx,
    etcd: &EtcdView,
    member_ips: &[String],
    certs: &Certs,
    now: time::OffsetDateTime,
) -> etcd_members::Plan {
    if etcd.layout.cluster {
        step("changing etcd's membership");
        let found = Found {
            pods: &etcd.pods,
            nodes: &etcd.nodes,
            leaving: &etcd.leaving,
        };
        etcd_membership::etcd_membership(
            kv,
            ctx,
            &etcd.layout,
            etcd.existing.as_ref(),
            member_ips,
            certs,
            &found,
            now,
        )
        .await
    } else {
        etcd_members::Plan {
            replicas: 1,
            step: None,
            pending: (!etcd.leaving.is_empty()).then(|| match &etcd.storage {
                EtcdStorage::HostPath { node, path } => format!(
                    "etcd keeps its data in the host directory {path} of node {node} (the \
                     cluster had no default StorageClass when it was installed): it cannot \
                     move, and draining {node} waits for it; move it by reinstalling with a \
                     StorageClass (docs/deploy.md)"
                ),
                _ => "etcd has no volume of its own that could move".to_string(),
            }),
        }
    }
}

/// Keeps etcd's pods moving: what a drain waiting on one is told, and pods deleted that
/// wait on a deleted claim, overstay a replacement or cannot run an older template.
pub(crate) async fn tend_etcd_pods(
    client: &Client,
    etcd: &EtcdView,
    pending: Option<&str>,
) -> Result<(), Error> {
    // What the webhook tells a drain that waits on a member (none once it has moved).
    // A failure here must not hold the rest of the reconcile (the StatefulSet's replicas
    // for a member just added): it is only the message.
    step("annotating etcd's pods");
    if let Err(e) = etcd_evacuation::annotate(client, &etcd.pods, &etcd.leaving, pending).await {
        tracing::warn!(error = %e, "writing what happens to etcd's pods");
    }
    if etcd.layout.cluster {
        let claims = Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(
            client.clone(),
            NAMESPACE,
        )
        .list(&ListParams::default())
        .await?
        .items;
        let mut stranded = etcd_evacuation::waiting_on_a_gone_claim(&etcd.pods, &claims);
        stranded.extend(etcd_evacuation::overdue(
            &etcd.pods,
            k8s_openapi::jiff::Timestamp::now(),
            etcd_evacuation::REPLACED_GRACE,
        ));
        if let Err(e) = etcd_evacuation::delete_pods(client, &stranded).await {
            tracing::warn!(error = %e, "deleting etcd pods that wait on a deleted claim");
        }
    }
    let update_revision = etcd
        .existing
        .as_ref()
        .and_then(|s| s.status.as_ref())
        .and_then(|s| s.update_revision.as_deref());
    let stuck = etcd_evacuation::stuck_on_an_old_template(&etcd.pods, update_revision);
    if !stuck.is_empty() {
        tracing::info!(pods = ?stuck, "etcd pods of an older template cannot run: starting them from the current one");
        if let Err(e) = etcd_evacuation::delete_pods(client, &stuck).await {
            tracing::warn!(error = %e, "deleting etcd pods stuck on an older template");
        }
    }
    Ok(())
}

/// etcd's rendering parameters after this reconcile's membership step.
pub(crate) fn etcd_params(
    host: &str,
    storage: EtcdStorage,
    certs: &Certs,
    layout: &EtcdLayout,
    member_ips: Vec<String>,
    replicas: i32,
) -> EtcdParams {
    EtcdParams {
        host: host.to_string(),
        storage,
        // etcd re-reads its certificate and key on every handshake but its trusted CA file
        // only at start: a new trust bundle (a CA rotation) restarts it, a new leaf does not.
        annotations: BTreeMap::from([(
            "kubevirt-rs.io/etcd-ca-sha256".to_string(),
            params::sha256_hex(certs.etcd.ca.as_bytes()),
        )]),
        topology: if layout.cluster {
            etcd::Topology::Cluster(etcd::ClusterTopology {
                member_ips,
                replicas,
            })
        } else {
            etcd::Topology::Single
        },
    }
}

/// The objects to apply, limited to `scope`, and the APIServices (and eviction webhook),
/// applied apart.
#[allow(clippy::too_many_arguments)]
pub(crate) fn render(
    kv: &KubeVirt,
    ctx: &Ctx,
    scope: Scope,
    target: &Target,
    certs: &Certs,
    auth: &ClusterAuth,
    etcd_params: EtcdParams,
    coexist: &CdiState,
    crd_uid: &str,
) -> Result<(Vec<serde_json::Value>, Vec<serde_json::Value>), Error> {
    ctx.metrics
        .emulation_enabled
        .set(i64::from(params::emulation_allowed(kv)));
    let (mut docs, mut apiservices) = params::render_all(
        kv,
        target,
        certs,
        auth,
        etcd_params,
        coexist.plan().datavolume_controller,
    )?;
    // Never written over kube-apiserver's local APIService of CDI's CRD.
    apiservices.retain(|a| {
        a["kind"] != "APIService"
            || coexist.applies(a["metadata"]["name"].as_str().unwrap_or_default())
    });
    if scope == Scope::ApiLayer {
        docs.retain(is_api_layer);
    }
    owned_by_crd(&mut docs, crd_uid);
    owned_by_crd(&mut apiservices, crd_uid);
    Ok((docs, apiservices))
}

/// Applies the objects, then the APIServices once virt-apiserver serves, and leaves CDI's
/// group to CDI. Returns virt-apiserver's Deployment as read, and whether a replica serves.
pub(crate) async fn apply(
    client: &Client,
    docs: &[serde_json::Value],
    apiservices: &[serde_json::Value],
    coexist: &CdiState,
) -> Result<(Option<Deployment>, bool), Error> {
    step("applying the installation's objects");
    apply_all(client, docs).await?;

    step("reading virt-apiserver's Deployment");
    let apiserver = Api::<Deployment>::namespaced(client.clone(), NAMESPACE)
        .get_opt(render::NAME)
        .await?;
    let serving = apiserver
        .as_ref()
        .and_then(|d| d.status.as_ref())
        .and_then(|s| s.available_replicas)
        .unwrap_or(0)
        > 0;
    // The APIServices only once a replica serves: discovery never points at nothing.
    if serving {
        step("applying the APIServices");
        apply_all(client, apiservices).await?;
    }
    step("leaving CDI's group to CDI");
    cdi_step::remove_cdi_apiservices(client, coexist).await?;
    Ok((apiserver, serving))
}

/// The ServiceMonitor and PrometheusRule.
pub(crate) async fn monitoring(client: &Client, kv: &KubeVirt, crd_uid: &str) {
    // A failure is logged and retried with the next reconcile: monitoring never holds the
    // installation, and a cluster without the prometheus-operator is no failure at all.
    step("keeping the ServiceMonitor and PrometheusRule");
    match monitoring::sync(client, Some(kv), crd_uid, MANAGER).await {
        Ok(s) => {
            if (s.apis.service_monitors || s.apis.prometheus_rules) && s.monitor.is_none() {
                tracing::debug!(
                    "prometheus-operator CRDs exist but no Prometheus ServiceAccount was found \
                     (spec.monitorNamespace/monitorAccount): no ServiceMonitor nor PrometheusRule"
                );
            }
            if s.deleted > 0 {
                tracing::info!(
                    deleted = s.deleted,
                    "removed monitoring objects no longer called for"
                );
            }
        }
        Err(e) => tracing::warn!(error = %e, "keeping the ServiceMonitor and PrometheusRule"),
    }
}

/// Why each APIService virt-apiserver serves here is not available yet.
pub(crate) async fn apiservices_pending(
    client: &Client,
    coexist: &CdiState,
) -> Result<Vec<String>, Error> {
    step("reading the rollout's state");
    let apis: Api<APIService> = Api::all(client.clone());
    let mut pending = Vec::new();
    for name in coexist.served() {
        let a = apis.get_opt(&name).await?;
        pending.extend(status::apiservice_pending(&name, a.as_ref()));
    }
    Ok(pending)
}

/// What needs kubevirt.io's API to answer: the common-instancetypes bundle and CDIConfig
/// `config`. Failures are logged and retried with the next reconcile: neither holds the
/// rest of the installation.
pub(crate) async fn once_the_api_answers(
    client: &Client,
    kv: &KubeVirt,
    coexist: &CdiState,
    certs: &Certs,
) {
    // KubeVirt's common-instancetypes bundle, once its API answers (a failure is logged
    // and retried with the next reconcile: it never holds the rest of the installation).
    step("deploying the common-instancetypes bundle");
    let enabled = kv
        .spec
        .configuration
        .as_ref()
        .is_none_or(|c| c.common_instancetypes_enabled());
    match instancetypes::sync(client, enabled, MANAGER).await {
        Ok((0, 0)) => {}
        Ok((written, deleted)) => tracing::info!(
            written,
            deleted,
            enabled,
            "common-instancetypes bundle reconciled"
        ),
        Err(e) => tracing::warn!(error = %e, "deploying the common-instancetypes bundle"),
    }
    // CDI's CDIConfig `config`: where virtctl image-upload finds the upload proxy. Not
    // while a real CDI owns the group (its CDIConfig is CDI's).
    if coexist.plan().datavolume_controller {
        step("writing CDIConfig config");
        if let Err(e) = cdi_step::cdi_config(client, &certs.bundle).await {
            tracing::warn!(error = %e, "writing CDIConfig config");
        }
    }
}

/// What of the rollout is not done (etcd's membership, each component, pods terminating or
/// left over), with the namespace's pods; once every handler has its own certificate, the
/// key they used to share goes.
pub(crate) async fn rollout(
    client: &Client,
    membership_pending: Option<String>,
    apiserver: Option<&Deployment>,
) -> Result<(Vec<String>, Vec<Pod>), Error> {
    let etcd_pending = status::statefulset_pending(
        etcd::ETCD,
        Api::<StatefulSet>::namespaced(client.clone(), NAMESPACE)
            .get_opt(etcd::ETCD)
            .await?
            .as_ref(),
    );
    let controller = Api::<Deployment>::namespaced(client.clone(), NAMESPACE)
        .get_opt(components::CONTROLLER)
        .await?;
    let controller_pending =
        status::deployment_pending(components::CONTROLLER, controller.as_ref());
    let handler_pending = status::daemonset_pending(
        components::HANDLER,
        Api::<DaemonSet>::namespaced(client.clone(), NAMESPACE)
            .get_opt(components::HANDLER)
            .await?
            .as_ref(),
    );
    let apiserver_pending = status::deployment_pending(render::NAME, apiserver);
    let handler_done = handler_pending.is_none();
    if handler_done {
        // Every handler now has its own certificate: the key an earlier version shared
        // between all nodes goes (its certificate no longer passes any name check).
        let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
        if secrets
            .get_opt(components::RETIRED_HANDLER_CERTS)
            .await?
            .is_some()
        {
            secrets
                .delete(components::RETIRED_HANDLER_CERTS, &Default::default())
                .await?;
            tracing::info!(
                secret = components::RETIRED_HANDLER_CERTS,
                "deleted the handler key shared by every node"
            );
        }
    }
    let pods = Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .list(&ListParams::default())
        .await?
        .items;
    let pending: Vec<String> = [
        membership_pending,
        etcd_pending,
        apiserver_pending,
        controller_pending,
        handler_pending,
        status::terminating_pending(&pods),
        status::surplus_pending(render::NAME, apiserver, &pods),
        status::surplus_pending(components::CONTROLLER, controller.as_ref(), &pods),
    ]
    .into_iter()
    .flatten()
    .collect();
    Ok((pending, pods))
}

/// Writes the status computed from `observed` (if it changed), with the Deployed and
/// CDIInstalled Events when they are news; returns it.
pub(crate) async fn write_status(
    kv: &KubeVirt,
    ctx: &Ctx,
    target: &Target,
    observed: &Observed,
) -> Result<KubeVirtStatus, Error> {
    let new_status = status::status(
        kv.status.as_ref(),
        target,
        observed,
        kv.meta().generation,
        Time(k8s_openapi::jiff::Timestamp::now()),
    );
    let was_deployed_version = kv
        .status
        .as_ref()
        .and_then(|s| s.observed_kube_virt_version.clone());
    if new_status.observed_kube_virt_version != was_deployed_version
        && new_status.phase.as_deref() == Some(status::DEPLOYED)
    {
        ctx.event(
            kv,
            EventType::Normal,
            "Deployed",
            format!("Version {} is deployed and Available", target.version),
        )
        .await;
    }
    let had_cdi = kv
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == cdi::CONDITION));
    if let Some(note) = observed.cdi.as_ref().filter(|_| !had_cdi) {
        ctx.event(kv, EventType::Normal, cdi::CONDITION, note.clone())
            .await;
    }
    step("writing the KubeVirt status");
    if kv.status.as_ref() != Some(&new_status) {
        let mut patch = serde_json::json!({"status": new_status});
        // virt-controller's field: the value read at the start of this reconcile may be stale
        // by now, and a merge patch without it leaves it alone.
        if let Some(s) = patch["status"].as_object_mut() {
            s.remove("outdatedVirtualMachineInstanceWorkloads");
        }
        Api::<KubeVirt>::namespaced(ctx.client.clone(), NAMESPACE)
            .patch_status(
                &kv.name_any(),
                &PatchParams::default(),
                &Patch::Merge(patch),
            )
            .await?;
    }
    Ok(new_status)
}

/// The cluster's client CAs and front proxy's names, which virt-apiserver authenticates
/// kube-apiserver's requests by.
pub(crate) async fn cluster_auth(client: &Client) -> Result<ClusterAuth, Error> {
    step("reading the cluster's authentication ConfigMap");
    let cm = Api::<ConfigMap>::namespaced(client.clone(), "kube-system")
        .get("extension-apiserver-authentication")
        .await?;
    let data = cm.data.unwrap_or_default();
    let requestheader_ca = data.get("requestheader-client-ca-file").cloned().ok_or_else(|| {
        Error::Other("kube-apiserver runs without --requestheader-client-ca-file: aggregated API servers cannot authenticate its requests".into())
    })?;
    let client_ca = data.get("client-ca-file").cloned().ok_or_else(|| {
        Error::Other("extension-apiserver-authentication has no client-ca-file".into())
    })?;
    let names: Vec<String> = data
        .get("requestheader-allowed-names")
        .and_then(|s| serde_json::from_str(s).ok())
        .unwrap_or_default();
    Ok(ClusterAuth {
        client_ca,
        requestheader_ca,
        allowed_names: names.join(","),
    })
}

/// Makes every cluster-scoped object (APIServices, ClusterRoles, ClusterRoleBindings) and
/// every object outside the install namespace (the RoleBinding in kube-system) a dependent
/// of the KubeVirt CRD, a cluster-scoped object of manifests/virt-operator.yaml: they
/// cannot be owned by the namespaced KubeVirt resource, and the API layer outlives that
/// resource, so without an owner `kubectl delete -f manifests/virt-operator.yaml` would
/// leave them behind. Kubernetes' garbage collector deletes them once the CRD is gone.
///
/// Why the CRD and not the namespace: the namespace controller does not finish deleting a
/// namespace while an APIService is unavailable (its discovery fails), and the APIServices'
/// server runs in that namespace — owned by the namespace they would wait for each other.
/// The CRD goes at once (after its KubeVirt objects), and with it the APIServices.
pub(crate) fn owned_by_crd(docs: &mut [serde_json::Value], crd_uid: &str) {
    for d in docs {
        if d["metadata"]["namespace"].as_str() == Some(NAMESPACE) {
            continue;
        }
        d["metadata"]["ownerReferences"] = serde_json::json!([{
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "name": KUBEVIRT_CRD, "uid": crd_uid,
        }]);
    }
}

/// Name of the KubeVirt CRD.
pub(crate) const KUBEVIRT_CRD: &str = kubevirt_api::kubevirt::CRD_NAME;

/// `Api<DynamicObject>` for one rendered object.
pub(crate) fn dynamic_api(
    client: &Client,
    obj: &serde_json::Value,
) -> Result<(Api<DynamicObject>, String), Error> {
    let api_version = obj["apiVersion"].as_str().unwrap_or_default();
    let kind = obj["kind"].as_str().unwrap_or_default();
    let plural = match kind {
        "Namespace" => "namespaces",
        "ServiceAccount" => "serviceaccounts",
        "ClusterRole" => "clusterroles",
        "ClusterRoleBinding" => "clusterrolebindings",
        "Role" => "roles",
        "RoleBinding" => "rolebindings",
        "Deployment" => "deployments",
        "DaemonSet" => "daemonsets",
        "StatefulSet" => "statefulsets",
        "Service" => "services",
        "Secret" => "secrets",
        "ConfigMap" => "configmaps",
        "APIService" => "apiservices",
        "PodDisruptionBudget" => "poddisruptionbudgets",
        "ValidatingWebhookConfiguration" => "validatingwebhookconfigurations",
        other => return Err(Error::Other(format!("no resource known for kind {other}"))),
    };
    let (group, version) = match api_version.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", api_version),
    };
    let ar =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    let name = obj["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let api = match obj["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    Ok((api, name))
}

pub(crate) async fn apply_all(client: &Client, docs: &[serde_json::Value]) -> Result<(), Error> {
    for d in docs {
        let (api, name) = dynamic_api(client, d)?;
        api.patch(&name, &pp(), &Patch::Apply(d)).await?;
    }
    Ok(())
}

/// Every object an installation consists of (Secrets, ConfigMap, APIServices included), as
/// (apiVersion-kind API, name); rendering with any parameters gives the same names.
pub(crate) fn installed_objects() -> Result<Vec<serde_json::Value>, Error> {
    // A cluster: its objects (member Services, ConfigMap, PDB) are a superset of one
    // member's.
    let p = Params {
        etcd: EtcdMode::StatefulSet(EtcdParams {
            topology: etcd::Topology::Cluster(etcd::ClusterTopology {
                member_ips: vec![String::new(); etcd::MAX_MEMBERS],
                replicas: 1,
            }),
            ..EtcdParams::default()
        }),
        ..Params::default()
    };
    let tls = Tls {
        ca: String::new(),
        cert: String::new(),
        key: String::new(),
    };
    let auth = ClusterAuth {
        client_ca: String::new(),
        requestheader_ca: String::new(),
        allowed_names: String::new(),
    };
    let mut yaml = render::static_manifest(&p)?;
    yaml.push_str(&render::cluster_manifest(&tls, &auth)?);
    let handler = HandlerTls {
        ca: String::new(),
        client_cert: String::new(),
        client_key: String::new(),
        lifetime: None,
    };
    components::handler_secrets(&mut yaml, &handler)?;
    let etcd_tls = EtcdTls {
        host: String::new(),
        ca: String::new(),
        server_cert: String::new(),
        server_key: String::new(),
        client_cert: String::new(),
        client_key: String::new(),
        peer: Some((String::new(), String::new())),
    };
    for s in etcd_tls.secrets() {
        render::push_doc(&mut yaml, &s)?;
    }
    for domain in Domain::ALL {
        render::push_doc(
            &mut yaml,
            &rotation::ca_secret(domain, &rotation::CaStore::default()),
        )?;
    }
    let mut docs = parse_docs(&yaml)?;
    docs.retain(|d| d["kind"] != "Namespace");
    Ok(docs)
}

pub(crate) async fn count_workloads(client: &Client) -> Result<usize, Error> {
    let mut n = 0;
    for k in WORKLOADS {
        let ar = workload_resource(k);
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        n += api.list(&ListParams::default()).await?.items.len();
    }
    Ok(n)
}

pub(crate) async fn remove_workloads(client: &Client) -> Result<(), Error> {
    for k in WORKLOADS {
        let ar = workload_resource(k);
        let all: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        for o in all.list(&ListParams::default()).await?.items {
            let ns = o.namespace().unwrap_or_default();
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
            let _ = api.delete(&o.name_any(), &DeleteParams::default()).await;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn objects_outside_the_namespace_are_owned_by_the_crd() {
        let mut docs = installed_objects().unwrap();
        owned_by_crd(&mut docs, "crd-uid");
        for d in &docs {
            let owners = &d["metadata"]["ownerReferences"];
            if d["metadata"]["namespace"] == NAMESPACE {
                assert!(owners.is_null(), "{d}");
            } else {
                assert_eq!(owners[0]["kind"], "CustomResourceDefinition", "{d}");
                assert_eq!(owners[0]["name"], KUBEVIRT_CRD);
                assert_eq!(owners[0]["uid"], "crd-uid");
            }
        }
        assert!(docs.iter().any(|d| d["kind"] == "APIService"
            && d["metadata"]["ownerReferences"][0]["name"] == KUBEVIRT_CRD));
    }

    #[test]
    fn uninstall_knows_every_object_and_its_resource() {
        let docs = installed_objects().unwrap();
        let kinds: std::collections::BTreeSet<&str> =
            docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
        for k in [
            "APIService",
            "StatefulSet",
            "Deployment",
            "DaemonSet",
            "Secret",
            "ClusterRole",
            "RoleBinding",
            "PodDisruptionBudget",
        ] {
            assert!(kinds.contains(k), "{k} missing: {kinds:?}");
        }
        assert!(!kinds.contains("Namespace"));
        // Every kind maps to a resource (no client call is made by dynamic_api).
        for d in &docs {
            let plural_known = !matches!(d["kind"].as_str(), Some("Unknown"));
            assert!(plural_known);
        }
    }
}
