//! etcd's membership as the reconciler sees it from the Kubernetes side: where etcd keeps its
//! data, the member Services, and one membership step per reconcile with its Event. Apart from
//! [`crate::etcd_members`], which is only etcd's membership API and the pure plan (no
//! Kubernetes client, no reconciler state), so that it stays table-tested on its own.

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ListParams, Patch};
use kube::runtime::events::EventType;
use kube::{Client, ResourceExt};

use crate::certs_step::Certs;
use crate::ctx::{Ctx, Error, pp};
use crate::kubevirt::KubeVirt;
use crate::params::EtcdLayout;
use crate::render::NAMESPACE;
use crate::render::etcd::{self, EtcdStorage};
use crate::{etcd_evacuation, etcd_members, rotation, status};

/// Where etcd keeps its data. A StatefulSet's volumeClaimTemplates cannot change, so an
/// existing one decides: with a claim it stays on its claim; without one it stays in (or moves
/// to) a host directory. A new one gets a claim when the cluster has a default StorageClass.
pub(crate) async fn etcd_storage(
    client: &Client,
    ctx: &Ctx,
    existing: Option<&StatefulSet>,
    installation_uid: &str,
) -> Result<EtcdStorage, Error> {
    let has_claim = existing
        .and_then(|s| s.spec.as_ref())
        .and_then(|s| s.volume_claim_templates.as_ref())
        .is_some_and(|v| !v.is_empty());
    if has_claim || (existing.is_none() && has_default_storage_class(client).await?) {
        return Ok(EtcdStorage::Claim {
            size: ctx.etcd_volume_size.clone(),
        });
    }
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let current = existing.and_then(etcd::pinned_node);
    Ok(match etcd::pick_node(current.as_deref(), &nodes) {
        Some(node) => EtcdStorage::HostPath {
            node,
            path: etcd::host_dir(&ctx.etcd_host_dir, installation_uid),
        },
        None => EtcdStorage::Ephemeral,
    })
}

async fn has_default_storage_class(client: &Client) -> Result<bool, Error> {
    let scs = Api::<StorageClass>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    Ok(scs.items.iter().any(|sc| {
        let a = sc.annotations();
        a.get("storageclass.kubernetes.io/is-default-class")
            .map(String::as_str)
            == Some("true")
            || a.get("storageclass.beta.kubernetes.io/is-default-class")
                .map(String::as_str)
                == Some("true")
    }))
}

/// Applies every member's Service and returns their cluster IPs by ordinal: they go into the
/// certificates and every member's host aliases.
pub(crate) async fn member_service_ips(client: &Client) -> Result<Vec<String>, Error> {
    let api = Api::<Service>::namespaced(client.clone(), NAMESPACE);
    let mut ips = Vec::new();
    for i in 0..etcd::MAX_MEMBERS {
        let svc = etcd::member_service(i);
        let name = etcd::member_name(i);
        let body = serde_json::to_value(&svc).map_err(|e| Error::Other(e.to_string()))?;
        let applied = api.patch(&name, &pp(), &Patch::Apply(&body)).await?;
        let ip = applied
            .spec
            .and_then(|s| s.cluster_ip)
            .filter(|ip| !ip.is_empty() && ip != "None")
            .ok_or_else(|| Error::Other(format!("Service {name} has no cluster IP yet")))?;
        ips.push(ip);
    }
    Ok(ips)
}

/// What the Kubernetes API says about etcd's members for [`etcd_membership`].
pub(crate) struct Found<'a> {
    pub(crate) pods: &'a [Pod],
    pub(crate) nodes: &'a [Node],
    pub(crate) leaving: &'a std::collections::BTreeSet<usize>,
}

/// One step of etcd's membership towards `layout.desired` ([`etcd_members`]): observes the
/// members, carries out the next change, and says how many members there are afterwards (the
/// StatefulSet's replicas). Failing to reach etcd is no reconcile error: etcd keeps its
/// members, and the reason is in the Progressing condition.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn etcd_membership(
    kv: &KubeVirt,
    ctx: &Ctx,
    layout: &EtcdLayout,
    existing: Option<&StatefulSet>,
    member_ips: &[String],
    certs: &Certs,
    found: &Found<'_>,
    now: time::OffsetDateTime,
) -> etcd_members::Plan {
    let current = existing
        .and_then(|s| s.spec.as_ref())
        .and_then(|s| s.replicas)
        .unwrap_or(1);
    let Some(existing) = existing else {
        // A new cluster: its first member bootstraps it alone, the others join afterwards.
        return etcd_members::Plan {
            replicas: 1,
            step: None,
            pending: (layout.desired > 1)
                .then(|| format!("etcd member {}: starting the cluster", etcd::member_name(0))),
        };
    };
    let addresses = etcd_members::Addresses {
        peer_urls: (0..etcd::MAX_MEMBERS).map(etcd::peer_url).collect(),
        client_urls: member_ips
            .iter()
            .map(|ip| etcd::member_client_url(ip))
            .collect(),
        legacy_peer_url: etcd::LEGACY_PEER_URL.into(),
    };
    let unreachable = |why: String| etcd_members::Plan {
        replicas: current,
        step: None,
        pending: Some(format!("etcd's membership cannot be read: {why}")),
    };
    let tls = match rotation::operator_etcd_client(&certs.etcd_state, time::Duration::hours(1), now)
    {
        Ok(pem) => etcd_members::ClientTls {
            ca: certs.etcd.ca.clone(),
            cert: pem.cert,
            key: pem.key,
        },
        Err(e) => return unreachable(e.to_string()),
    };
    let rolled_out = etcd::is_cluster(existing)
        && status::statefulset_pending(etcd::ETCD, Some(existing)).is_none();
    let (mut observed, mut client) =
        match etcd_members::observe(&addresses, Some(&tls), rolled_out).await {
            Ok(o) => o,
            Err(e) => return unreachable(e.to_string()),
        };
    observed.leaving = found.leaving.clone();
    observed.room = etcd_evacuation::room(found.nodes);
    observed.replaced = etcd_evacuation::replaced(found.pods);
    let silent_learners = observed
        .members
        .iter()
        .filter(|m| m.learner)
        .filter_map(|m| addresses.ordinal(m))
        .filter(|i| !observed.healthy.contains(i))
        .collect();
    observed.stuck = etcd_evacuation::stuck(
        found.pods,
        &silent_learners,
        k8s_openapi::jiff::Timestamp::now(),
        etcd_members::LEARNER_DEADLINE,
    );
    let plan = etcd_members::plan(layout.desired, &addresses, &observed);
    let Some(change) = plan.step else {
        return plan;
    };
    match etcd_members::execute(&mut client, &addresses, change).await {
        Ok(etcd_members::Outcome::Done) => {
            if let etcd_members::Step::Replace { ordinal, .. } = change
                && let Err(e) = etcd_evacuation::mark_replaced(&ctx.client, ordinal).await
            {
                // The member is already a learner again: its old pod, still leaving, is
                // replaced once more by a later reconcile (its data is none of the cluster's).
                tracing::warn!(ordinal, error = %e, "marking a replaced etcd member's pod");
            }
            let note = plan.pending.clone().unwrap_or_default();
            tracing::info!(
                ?change,
                members = plan.replicas,
                "etcd membership changed: {note}"
            );
            ctx.event(kv, EventType::Normal, "EtcdMembership", note)
                .await;
            plan
        }
        // The next reconcile tries again; the membership is as it was.
        Ok(etcd_members::Outcome::NotYet(why)) => etcd_members::Plan {
            replicas: current,
            step: None,
            pending: Some(format!(
                "{}: {why}",
                plan.pending
                    .unwrap_or_else(|| "changing etcd's membership".into())
            )),
        },
        Err(e) => {
            tracing::warn!(?change, error = %e, "changing etcd's membership");
            etcd_members::Plan {
                replicas: current,
                step: None,
                pending: Some(format!(
                    "{}: {e}",
                    plan.pending
                        .unwrap_or_else(|| "changing etcd's membership".into())
                )),
            }
        }
    }
}
