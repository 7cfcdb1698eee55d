//! The KubeVirt reconciler: level-triggered, server-side apply of everything [`crate::render`]
//! renders, certificates in Secrets rotated by [`crate::rotation`] (CAs kept with their keys;
//! no pod restarts for a new leaf), status and Events; the finalizer uninstalls everything
//! but the API layer, which [`bootstrap`] keeps up while no KubeVirt resource exists.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use tokio_util::sync::CancellationToken;

use crate::cdi_step::cdi_state;
pub use crate::ctx::{Ctx, Error};
use crate::ctx::{MANAGER, STEP, Scope, is_api_layer};
use crate::kubevirt::{BLOCK_UNINSTALL, FINALIZER, KubeVirt, REMOVE_WORKLOADS};
use crate::params::requeue_after;
use crate::policy::CertPolicy;
use crate::render::etcd;
use crate::render::{self, NAMESPACE};
use crate::status::{self, Observed};
use crate::steps::{count_workloads, dynamic_api, installed_objects, remove_workloads};
use crate::{etcd_evacuation, instancetypes, monitoring, steps};

/// Runs the controller until `stop`, and [`bootstrap`] next to it.
pub async fn run(ctx: Arc<Ctx>, stop: CancellationToken) {
    let boot = tokio::spawn(bootstrap(ctx.clone(), stop.clone()));
    let client = ctx.client.clone();
    let kvs: Api<KubeVirt> = Api::namespaced(client.clone(), NAMESPACE);
    let labels = watcher::Config::default().labels("app.kubernetes.io/part-of=kubevirt-rs");
    // Owned workloads carry no ownerReference (cluster-scoped objects cannot point at a
    // namespaced owner): a change of one re-reconciles the KubeVirt resource (there is one).
    let reconcile_all = |_| {
        std::iter::once(
            kube::runtime::reflector::ObjectRef::<KubeVirt>::new("kubevirt").within(NAMESPACE),
        )
    };
    virt_controllers::watch::controller(kvs, "kubevirts", &ctx.metrics.watches)
        .watches(
            Api::<Deployment>::namespaced(client.clone(), NAMESPACE),
            labels.clone(),
            move |_d: Deployment| reconcile_all(()),
        )
        .watches(
            Api::<DaemonSet>::namespaced(client.clone(), NAMESPACE),
            labels.clone(),
            move |_d: DaemonSet| reconcile_all(()),
        )
        .watches(
            Api::<StatefulSet>::namespaced(client.clone(), NAMESPACE),
            labels,
            move |_d: StatefulSet| reconcile_all(()),
        )
        // etcd members move off nodes being drained (etcd_evacuation): a node cordoned or
        // uncordoned, an etcd pod's eviction asked for or its pod started again elsewhere.
        .watches_stream(
            etcd_evacuation::node_changes(client.clone(), &ctx.metrics.watches),
            move |_n: Node| reconcile_all(()),
        )
        .watches_stream(
            etcd_evacuation::member_pod_changes(client.clone(), &ctx.metrics.watches),
            move |_p: Pod| reconcile_all(()),
        )
        .graceful_shutdown_on(async move { stop.cancelled().await })
        .run(reconcile, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "reconcile");
            }
        })
        .await;
    if let Err(e) = boot.await {
        tracing::warn!(error = %e, "API layer bootstrap task failed");
    }
}

/// How often [`bootstrap`] looks: soon while the API layer comes up, then about as often
/// as a Deployed installation is reconciled (certificates are renewed from here too).
const BOOTSTRAP_PENDING: Duration = Duration::from_secs(3);
const BOOTSTRAP_IDLE: Duration = Duration::from_secs(30);

/// While no KubeVirt resource exists, keeps the API layer up from the operator's own
/// defaults (its image registry and tag), so that `kubevirt.io/v1` — and with it the
/// `KubeVirt` kind at v1, which virt-apiserver serves — is there for the user's first
/// `kubectl apply` (docs/deploy.md "Install"). Once a KubeVirt resource exists its reconcile
/// owns everything, the API layer included (then following the resource's settings); after
/// it is deleted the API layer is left running and this loop takes it over again.
///
/// A KubeVirt resource created between this loop's check and its apply can see the API
/// layer applied once more with the defaults: harmless, its own reconcile (triggered by the
/// creation and by the Deployment change) applies its settings right after.
async fn bootstrap(ctx: Arc<Ctx>, stop: CancellationToken) {
    let kvs: Api<KubeVirt> = Api::namespaced(ctx.client.clone(), NAMESPACE);
    loop {
        let wait = match kvs.list(&ListParams::default()).await {
            Ok(l) if l.items.is_empty() => {
                let mut kv = KubeVirt::new("kubevirt", crate::kubevirt::KubeVirtSpec::default());
                kv.metadata.namespace = Some(NAMESPACE.into());
                match bounded(install(&kv, &ctx, Scope::ApiLayer)).await {
                    Ok(Action { .. }) if api_layer_available(&ctx.client).await => BOOTSTRAP_IDLE,
                    Ok(_) => BOOTSTRAP_PENDING,
                    Err(e) => {
                        tracing::warn!(error = %e, "bringing up the API layer (no KubeVirt resource yet)");
                        BOOTSTRAP_PENDING
                    }
                }
            }
            Ok(_) => BOOTSTRAP_IDLE,
            Err(e) => {
                tracing::warn!(error = %e, "listing KubeVirt resources");
                BOOTSTRAP_PENDING
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

async fn api_layer_available(client: &Client) -> bool {
    let Ok(coexist) = cdi_state(client).await else {
        return false;
    };
    let apis: Api<APIService> = Api::all(client.clone());
    for name in coexist.served() {
        match apis.get_opt(&name).await {
            Ok(Some(a)) if apiservice_available(&a) => {}
            _ => return false,
        }
    }
    true
}

/// Longest a reconcile may take. One normally takes a second or two; a request that never
/// answers would otherwise hold the KubeVirt resource's reconcile for the client's read
/// timeout (almost five minutes), with nothing in the log and no retry.
const RECONCILE_DEADLINE: Duration = Duration::from_secs(60);

/// Runs one reconcile within [`RECONCILE_DEADLINE`]; missing it is an error naming the step
/// it was in, so the reconcile is retried instead of waiting on a request that hangs.
async fn bounded(
    fut: impl std::future::Future<Output = Result<Action, Error>>,
) -> Result<Action, Error> {
    bounded_within(RECONCILE_DEADLINE, fut).await
}

async fn bounded_within(
    deadline: Duration,
    fut: impl std::future::Future<Output = Result<Action, Error>>,
) -> Result<Action, Error> {
    let at = Arc::new(std::sync::Mutex::new("starting"));
    match tokio::time::timeout(deadline, STEP.scope(at.clone(), fut)).await {
        Ok(r) => r,
        Err(_) => Err(Error::Other(format!(
            "reconcile did not finish within {:?}; it was {}",
            deadline,
            at.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
        ))),
    }
}

fn error_policy(_kv: Arc<KubeVirt>, e: &Error, ctx: Arc<Ctx>) -> Action {
    tracing::warn!(error = %e, "reconcile failed");
    ctx.metrics.reconcile("error");
    Action::requeue(Duration::from_secs(5))
}

async fn reconcile(kv: Arc<KubeVirt>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let start = std::time::Instant::now();
    let r = if kv.meta().deletion_timestamp.is_some() {
        bounded(uninstall(&kv, &ctx)).await
    } else {
        bounded(install(&kv, &ctx, Scope::All)).await
    };
    ctx.metrics.observe(start.elapsed().as_secs_f64());
    if r.is_ok() {
        ctx.metrics.reconcile("success");
    }
    r
}

fn apiservice_available(a: &APIService) -> bool {
    status::apiservice_pending("", Some(a)).is_none()
}

/// Applies what `kv` asks for, limited to `scope`. With [`Scope::ApiLayer`] `kv` is the
/// operator's defaults, not a stored object: no finalizer, Events or status.
async fn install(kv: &KubeVirt, ctx: &Ctx, scope: Scope) -> Result<Action, Error> {
    let client = &ctx.client;
    let target = steps::start(kv, ctx, scope).await?;
    let host = steps::etcd_service(client).await?;
    let auth = steps::cluster_auth(client).await?;
    let unsupported = steps::unsupported_fields(kv, ctx).await;
    let policy = CertPolicy::from_spec(kv.spec.certificate_rotate_strategy.as_ref());
    let crd_uid = steps::kubevirt_crd_uid(client).await?;
    let coexist = steps::cdi_state(client).await?;
    let etcd = steps::observe_etcd(kv, ctx, scope, &crd_uid).await?;
    let invalid_config = steps::invalid_configuration(kv, ctx, &policy, &etcd).await;
    let now = time::OffsetDateTime::now_utc();
    let member_ips = steps::member_ips(client, &etcd.layout).await?;
    let etcd_hosts = etcd::EtcdHosts {
        service: host.clone(),
        members: member_ips.clone(),
    };
    let certs = steps::certificates(kv, ctx, &etcd_hosts, &policy, now).await?;
    let membership = steps::membership(kv, ctx, &etcd, &member_ips, &certs, now).await;
    steps::tend_etcd_pods(client, &etcd, membership.pending.as_deref()).await?;
    let etcd_params = steps::etcd_params(
        &host,
        etcd.storage,
        &certs,
        &etcd.layout,
        member_ips,
        membership.replicas,
    );
    let (docs, apiservices) = steps::render(
        kv,
        ctx,
        scope,
        &target,
        &certs,
        &auth,
        etcd_params,
        &coexist,
        &crd_uid,
    )?;
    let (apiserver, serving) = steps::apply(client, &docs, &apiservices, &coexist).await?;
    if scope == Scope::ApiLayer {
        return Ok(Action::requeue(BOOTSTRAP_IDLE));
    }
    steps::monitoring(client, kv, &crd_uid).await;
    let apiservices_pending = steps::apiservices_pending(client, &coexist).await?;
    if serving && apiservices_pending.is_empty() {
        steps::once_the_api_answers(client, kv, &coexist, &certs).await;
    }
    let (rollout_pending, pods) =
        steps::rollout(client, membership.pending, apiserver.as_ref()).await?;
    if !rollout_pending.is_empty() || !apiservices_pending.is_empty() {
        tracing::debug!(?rollout_pending, ?apiservices_pending, "rollout not done");
    }
    let observed = Observed {
        rollout_pending,
        apiservices_pending,
        apiserver_serving: serving,
        failure: status::pod_failure(&pods),
        invalid_config,
        unsupported,
        cdi: coexist.plan().note,
    };
    let new_status = steps::write_status(kv, ctx, &target, &observed).await?;
    Ok(if new_status.phase.as_deref() == Some(status::DEPLOYED) {
        // Certificates are checked again within the minute, and when one is due.
        Action::requeue(requeue_after(certs.next_due, now))
    } else {
        Action::requeue(Duration::from_secs(3))
    })
}

async fn uninstall(kv: &KubeVirt, ctx: &Ctx) -> Result<Action, Error> {
    let client = &ctx.client;
    let kvs: Api<KubeVirt> = Api::namespaced(client.clone(), NAMESPACE);
    let name = kv.name_any();
    if !kv.finalizers().iter().any(|f| f == FINALIZER) {
        return Ok(Action::await_change());
    }
    if kv.status.as_ref().and_then(|s| s.phase.as_deref()) != Some(status::DELETING) {
        kvs.patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"phase": status::DELETING}})),
        )
        .await?;
        ctx.event(
            kv,
            EventType::Normal,
            "Deleting",
            "Uninstalling kubevirt-rs".into(),
        )
        .await;
    }
    let apis: Api<APIService> = Api::all(client.clone());
    let api_up = apis
        .get_opt(&format!("v1.{}", render::GROUP))
        .await?
        .as_ref()
        .is_some_and(apiservice_available);
    if api_up {
        let strategy = kv
            .spec
            .uninstall_strategy
            .as_deref()
            .unwrap_or(BLOCK_UNINSTALL);
        let n = count_workloads(client).await?;
        if n > 0 {
            if strategy == REMOVE_WORKLOADS {
                remove_workloads(client).await?;
                return Ok(Action::requeue(Duration::from_secs(2)));
            }
            ctx.event(
                kv,
                EventType::Warning,
                "UninstallBlocked",
                format!(
                    "{n} VirtualMachines/VirtualMachineInstances exist and uninstallStrategy is \
                     {BLOCK_UNINSTALL}: delete them or set spec.uninstallStrategy: {REMOVE_WORKLOADS}"
                ),
            )
            .await;
            return Ok(Action::requeue(Duration::from_secs(10)));
        }
    }
    if api_up && let Err(e) = instancetypes::sync(client, false, MANAGER).await {
        tracing::warn!(error = %e, "removing the common-instancetypes bundle");
    }
    if let Err(e) = monitoring::sync(client, None, "", MANAGER).await {
        tracing::warn!(error = %e, "removing the ServiceMonitor and PrometheusRule");
    }
    // Everything but the API layer, which stays while the operator runs: kubevirt.io/v1 (and
    // the KubeVirt kind at v1) remains served for a re-install, and [`bootstrap`] takes it
    // over once this resource is gone. etcd's data (and PVC) stays with it.
    let docs = installed_objects()?;
    for d in docs.iter().filter(|d| !is_api_layer(d)) {
        let (api, obj) = dynamic_api(client, d)?;
        match api.delete(&obj, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    let fins: Vec<String> = kv
        .finalizers()
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    kvs.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"finalizers": fins}})),
    )
    .await?;
    ctx.metrics.uninstalled();
    tracing::info!(kubevirt = %name, "uninstalled");
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::ctx::step;

    #[tokio::test]
    async fn a_reconcile_that_hangs_fails_naming_its_step() {
        let hang = async {
            step("applying the APIServices");
            futures::future::pending::<()>().await;
            Ok(Action::await_change())
        };
        let e = bounded_within(Duration::from_millis(50), hang)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("it was applying the APIServices"), "{e}");
        let quick = bounded_within(Duration::from_secs(5), async { Ok(Action::await_change()) });
        assert!(quick.await.is_ok());
    }

    #[test]
    fn the_api_layer_is_etcd_virt_apiserver_the_apiservices_and_certificates() {
        let docs = installed_objects().unwrap();
        let layer: std::collections::BTreeSet<String> = docs
            .iter()
            .filter(|d| is_api_layer(d))
            .map(|d| {
                format!(
                    "{}/{}",
                    d["kind"].as_str().unwrap(),
                    d["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect();
        for want in [
            "APIService/v1.kubevirt.io",
            "APIService/v1.subresources.kubevirt.io",
            "StatefulSet/kubevirt-etcd",
            "Service/kubevirt-etcd",
            "Deployment/kubevirt-apiserver",
            "Service/kubevirt-apiserver",
            "PodDisruptionBudget/kubevirt-apiserver",
            "ServiceAccount/kubevirt-apiserver",
            "ClusterRole/kubevirt-apiserver",
            "ClusterRoleBinding/kubevirt-apiserver:system:auth-delegator",
            "RoleBinding/kubevirt-apiserver:auth-reader",
            "Secret/kubevirt-apiserver-tls",
            "Secret/kubevirt-rs-apiserver-ca",
            "Secret/virt-apiserver-handler-client",
            "ConfigMap/kubevirt-apiserver-auth",
        ] {
            assert!(layer.contains(want), "{want} missing from {layer:?}");
        }
        for not in [
            "Deployment/virt-controller",
            "DaemonSet/virt-handler",
            "ClusterRole/virt-controller",
            "ClusterRole/kubevirt.io:edit",
        ] {
            assert!(!layer.contains(not), "{not} in the API layer");
        }
    }
}
