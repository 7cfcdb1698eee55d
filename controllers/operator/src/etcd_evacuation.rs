//! Moving etcd members off nodes that are being drained (issue 51): what the Kubernetes API
//! says about the members' pods and the nodes, for [`crate::etcd_members::plan`], and the
//! pod and volume deletions a replacement needs.
//!
//! kubevirt-rs keeps its objects in its own etcd, a StatefulSet whose members' volumes are
//! pinned to their nodes (a node-local claim, as the default StorageClass of most small
//! clusters gives). A member evicted with its node could start nowhere else, and with it the
//! VM API would be gone for as long as the node is. So evictions of etcd pods are refused
//! (virt-apiserver's eviction webhook) while this module and `etcd_members` move the member:
//! a cordoned node or an eviction asked for ([`ETCD_EVACUATE_ANNOTATION`]) marks its member
//! as leaving; it is replaced by an empty member elsewhere, and its old pod and volume are
//! deleted here; the drain's next eviction then finds no pod.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use kubevirt_api::eviction::{
    ETCD_EVACUATE_ANNOTATION, ETCD_EVACUATION_STATUS_ANNOTATION, ETCD_REPLACED_ANNOTATION,
};

use crate::render::NAMESPACE;
use crate::render::etcd::{ETCD, MAX_MEMBERS, member_name};

/// Nodes, as far as moving members cares: an event when a node's schedulability changes
/// (a cordon, an uncordon, readiness), not at each of its status updates.
pub fn node_changes(
    client: Client,
    metrics: &virt_watch::WatchMetrics,
) -> impl futures::Stream<Item = Result<Node, kube::runtime::watcher::Error>> + Send + 'static {
    use kube::runtime::WatchStreamExt as _;
    virt_watch::watch(
        Api::<Node>::all(client),
        kube::runtime::watcher::Config::default(),
        "nodes",
        metrics.clone(),
    )
    .applied_objects()
    .predicate_filter(
        |n: &Node| Some(u64::from(schedulable(n)) | (u64::from(cordoned(n)) << 1)),
        Default::default(),
    )
}

/// etcd's member pods: an event for each change (an eviction asked for, a pod started again
/// on another node); they are at most three.
pub fn member_pod_changes(
    client: Client,
    metrics: &virt_watch::WatchMetrics,
) -> impl futures::Stream<Item = Result<Pod, kube::runtime::watcher::Error>> + Send + 'static {
    use kube::runtime::WatchStreamExt as _;
    virt_watch::watch(
        Api::<Pod>::namespaced(client, NAMESPACE),
        kube::runtime::watcher::Config::default().labels(&crate::render::etcd::pod_selector()),
        "etcd-pods",
        metrics.clone(),
    )
    .applied_objects()
}

/// The volume claim template's name: the StatefulSet names each member's claim
/// `data-<pod>`.
const CLAIM_TEMPLATE: &str = "data";

/// The claim of member `ordinal`.
pub fn claim_name(ordinal: usize) -> String {
    format!("{CLAIM_TEMPLATE}-{}", member_name(ordinal))
}

/// The ordinal of an etcd member pod (`kubevirt-etcd-N`).
pub fn ordinal(pod: &Pod) -> Option<usize> {
    pod.metadata
        .name
        .as_deref()?
        .strip_prefix(ETCD)?
        .strip_prefix('-')?
        .parse()
        .ok()
        .filter(|i| *i < MAX_MEMBERS)
}

fn deleting(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// When the pod's member was replaced elsewhere, if it was.
fn replaced_at(pod: &Pod) -> Option<k8s_openapi::jiff::Timestamp> {
    pod.annotations()
        .get(ETCD_REPLACED_ANNOTATION)?
        .parse()
        .ok()
}

fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

fn cordoned(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

fn ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether new pods may land on `node`: ready, not cordoned, no taint that keeps new pods
/// off (etcd's pods tolerate none of their own).
pub fn schedulable(node: &Node) -> bool {
    ready(node)
        && !cordoned(node)
        && !node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| {
                t.iter()
                    .any(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
            })
}

/// How long an asked eviction keeps its member leaving: an evictor that still wants the pod
/// gone asks again (a drain every 5 s), one that gave up leaves the member where it is.
pub const EVICTION_ASKED_TTL: Duration = Duration::from_secs(300);

/// The ordinals whose pod must leave its node: the node is cordoned (a drain begins so), or
/// the pod's eviction was asked for within [`EVICTION_ASKED_TTL`] of `now`. A pod already
/// being deleted, or whose member was replaced elsewhere, is on its way.
pub fn leaving(pods: &[Pod], nodes: &[Node], now: k8s_openapi::jiff::Timestamp) -> BTreeSet<usize> {
    pods.iter()
        .filter(|p| !deleting(p) && replaced_at(p).is_none())
        .filter(|p| {
            let asked = p
                .annotations()
                .get(ETCD_EVACUATE_ANNOTATION)
                .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
                .is_some_and(|t| now.duration_since(t).unsigned_abs() < EVICTION_ASKED_TTL);
            let on_cordoned = node_of(p).is_some_and(|n| {
                nodes
                    .iter()
                    .any(|node| node.metadata.name.as_deref() == Some(n) && cordoned(node))
            });
            asked || on_cordoned
        })
        .filter_map(ordinal)
        .collect()
}

/// The ordinals whose pod is still that of a replaced member (marked, not yet deleting).
pub fn replaced(pods: &[Pod]) -> BTreeSet<usize> {
    pods.iter()
        .filter(|p| !deleting(p) && replaced_at(p).is_some())
        .filter_map(ordinal)
        .collect()
}

/// Whether some node can take a member's new pod: a schedulable one.
pub fn room(nodes: &[Node]) -> bool {
    nodes.iter().any(schedulable)
}

/// The ordinals of `learners` whose pod was created more than `deadline` before `now`
/// without the learner answering (the caller passes only learners that do not): killed
/// mid-join, or its volume unusable.
pub fn stuck(
    pods: &[Pod],
    learners: &BTreeSet<usize>,
    now: k8s_openapi::jiff::Timestamp,
    deadline: Duration,
) -> BTreeSet<usize> {
    pods.iter()
        .filter(|p| !deleting(p))
        .filter(|p| {
            p.metadata
                .creation_timestamp
                .as_ref()
                .is_some_and(|t| now.duration_since(t.0).unsigned_abs().ge(&deadline))
        })
        .filter_map(ordinal)
        .filter(|i| learners.contains(i))
        .collect()
}

/// Member pods that wait for a claim that is gone or going: the StatefulSet created the pod
/// again while its old claim was still being deleted, and it would wait for ever (the
/// StatefulSet makes a claim only with a new pod). Deleting such a pod lets the StatefulSet
/// create both anew.
pub fn waiting_on_a_gone_claim(pods: &[Pod], claims: &[PersistentVolumeClaim]) -> Vec<String> {
    pods.iter()
        .filter(|p| !deleting(p) && node_of(p).is_none())
        .filter_map(|p| {
            let i = ordinal(p)?;
            let claim = claims
                .iter()
                .find(|c| c.metadata.name.as_deref() == Some(claim_name(i).as_str()));
            let gone = claim.is_none_or(|c| c.metadata.deletion_timestamp.is_some());
            gone.then(|| member_name(i))
        })
        .collect()
}

/// Once member `ordinal` has been replaced: its claim is deleted (it stays, terminating,
/// until its pod is gone, so that the StatefulSet starts the pod again with a new claim,
/// which the scheduler places on a node that can take it) and its pod marked replaced, so
/// that the drain's eviction of it passes. The pod goes by that eviction, not by the
/// operator: a drain evicts a pod by name until it is gone, and would otherwise evict the
/// new pod of the same name on its new node; without a drain the operator deletes it after
/// [`REPLACED_GRACE`] ([`overdue`]).
pub async fn mark_replaced(client: &Client, ordinal: usize) -> Result<(), kube::Error> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let not_found = |e: &kube::Error| matches!(e, kube::Error::Api(s) if s.code == 404);
    match claims
        .delete(&claim_name(ordinal), &DeleteParams::default())
        .await
    {
        Ok(_) => {}
        Err(e) if not_found(&e) => {}
        Err(e) => return Err(e),
    }
    let patch = serde_json::json!({"metadata": {"annotations": {
        (ETCD_REPLACED_ANNOTATION): k8s_openapi::jiff::Timestamp::now().to_string()}}});
    match pods
        .patch(
            &member_name(ordinal),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if not_found(&e) => Ok(()),
        Err(e) => Err(e),
    }
}

/// How long a replaced member's pod waits for a drain's eviction before the operator
/// deletes it itself (a drain retries every 5 s).
pub const REPLACED_GRACE: Duration = Duration::from_secs(20);

/// The pods whose member was replaced more than `grace` before `now` and that nobody
/// evicted (a cordon without a drain).
pub fn overdue(pods: &[Pod], now: k8s_openapi::jiff::Timestamp, grace: Duration) -> Vec<String> {
    pods.iter()
        .filter(|p| !deleting(p))
        .filter(|p| replaced_at(p).is_some_and(|t| now.duration_since(t).unsigned_abs().ge(&grace)))
        .filter_map(|p| p.metadata.name.clone())
        .collect()
}

/// Why a container that does not run stays down: what a newer template can cure.
const STUCK_REASONS: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

/// Member pods from an older template than the StatefulSet's (`update_revision`) that cannot
/// run: their image is gone from the node, or they crash. The StatefulSet controller replaces
/// a pod of an old revision only once it is Running and Ready, so such a pod would wait
/// forever for the template that fixes it (Kubernetes' "forced rollback", which it leaves
/// to a human). A member that does not run serves nothing: deleting it costs no quorum, and
/// its data stays on its volume for the pod started from the new template.
pub fn stuck_on_an_old_template(pods: &[Pod], update_revision: Option<&str>) -> Vec<String> {
    let Some(want) = update_revision.filter(|r| !r.is_empty()) else {
        return Vec::new();
    };
    pods.iter()
        .filter(|p| !deleting(p))
        .filter(|p| {
            p.labels()
                .get("controller-revision-hash")
                .is_some_and(|r| r != want)
        })
        .filter(|p| {
            let statuses = p
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref());
            statuses.is_some_and(|cs| {
                cs.iter().any(|c| {
                    !c.ready
                        && c.state
                            .as_ref()
                            .and_then(|s| s.waiting.as_ref())
                            .and_then(|w| w.reason.as_deref())
                            .is_some_and(|r| STUCK_REASONS.contains(&r))
                })
            })
        })
        .filter_map(|p| p.metadata.name.clone())
        .collect()
}

/// Deletes the member pods [`waiting_on_a_gone_claim`] or [`overdue`] names.
pub async fn delete_pods(client: &Client, names: &[String]) -> Result<(), kube::Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    for n in names {
        match pods.delete(n, &DeleteParams::default()).await {
            Ok(_) => tracing::info!(pod = %n, "deleted an etcd pod"),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes what the operator does about each leaving member onto its pod (`None`: nothing to
/// say any more), so that the eviction webhook's refusal quotes it.
pub async fn annotate(
    client: &Client,
    pods: &[Pod],
    leaving: &BTreeSet<usize>,
    status: Option<&str>,
) -> Result<(), kube::Error> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    for p in pods.iter().filter(|p| !deleting(p)) {
        let Some(i) = ordinal(p) else { continue };
        let want = status.filter(|_| leaving.contains(&i));
        let have = p
            .annotations()
            .get(ETCD_EVACUATION_STATUS_ANNOTATION)
            .map(String::as_str);
        if want == have {
            continue;
        }
        let patch = serde_json::json!({"metadata": {"annotations": {
            (ETCD_EVACUATION_STATUS_ANNOTATION): want}}});
        match api
            .patch(
                &p.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn member(name: &str, revision: &str, waiting: Option<&str>, ready: bool) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"controller-revision-hash": revision}},
            "status": {"containerStatuses": [{
                "name": "etcd", "image": "etcd", "imageID": "", "restartCount": 0,
                "ready": ready,
                "state": waiting.map_or_else(
                    || serde_json::json!({"running": {}}),
                    |r| serde_json::json!({"waiting": {"reason": r}}))
            }]}
        }))
        .expect("pod")
    }

    #[test]
    fn only_old_members_that_cannot_run_are_deleted_for_the_new_template() {
        let pods = [
            member("kubevirt-etcd-0", "old", Some("ImagePullBackOff"), false),
            member("kubevirt-etcd-1", "old", None, true),
            member("kubevirt-etcd-2", "new", Some("CrashLoopBackOff"), false),
            member("kubevirt-etcd-3", "old", Some("ContainerCreating"), false),
        ];
        assert_eq!(
            stuck_on_an_old_template(&pods, Some("new")),
            vec!["kubevirt-etcd-0".to_string()]
        );
        assert!(stuck_on_an_old_template(&pods, None).is_empty());
    }
    use serde_json::json;

    fn pod(i: usize, node: Option<&str>, annotations: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": member_name(i), "namespace": NAMESPACE,
                "annotations": annotations, "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"nodeName": node, "containers": []},
        }))
        .unwrap()
    }

    fn node(name: &str, cordoned: bool, ready: bool) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"unschedulable": cordoned},
            "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]},
        }))
        .unwrap()
    }

    #[test]
    fn a_member_leaves_with_its_cordoned_node_or_when_its_eviction_was_asked() {
        let nodes = [node("a", true, true), node("b", false, true)];
        let pods = [
            pod(0, Some("a"), json!({})),
            pod(1, Some("b"), json!({})),
            pod(
                2,
                Some("b"),
                json!({(ETCD_EVACUATE_ANNOTATION): "2026-01-01T00:00:00Z"}),
            ),
        ];
        let now: k8s_openapi::jiff::Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        assert_eq!(leaving(&pods, &nodes, now), BTreeSet::from([0, 2]));
        // An eviction asked long ago and not again: the evictor gave up.
        let later: k8s_openapi::jiff::Timestamp = "2026-01-01T01:00:00Z".parse().unwrap();
        assert_eq!(leaving(&pods, &nodes, later), BTreeSet::from([0]));
        assert!(room(&nodes));
        // Being deleted: on its way already.
        let mut going = pod(0, Some("a"), json!({}));
        going.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert!(leaving(&[going], &nodes, now).is_empty());
        // Every node cordoned or not ready: nowhere to go.
        assert!(!room(&[node("a", true, true), node("b", false, false)]));
    }

    #[test]
    fn a_learner_whose_pod_started_long_ago_is_stuck() {
        let pods = [pod(0, Some("a"), json!({})), pod(1, Some("b"), json!({}))];
        let now: k8s_openapi::jiff::Timestamp = "2026-01-01T00:05:00Z".parse().unwrap();
        let learners = BTreeSet::from([1]);
        assert_eq!(
            stuck(&pods, &learners, now, Duration::from_secs(180)),
            BTreeSet::from([1])
        );
        assert!(stuck(&pods, &learners, now, Duration::from_secs(600)).is_empty());
    }

    /// A replaced member's pod is no longer leaving (it would be replaced again), and goes
    /// by the operator's hand only once a drain had time to evict it.
    #[test]
    fn a_replaced_pod_is_not_leaving_and_is_deleted_only_when_overdue() {
        let nodes = [node("a", true, true)];
        let replaced = pod(
            0,
            Some("a"),
            json!({(ETCD_REPLACED_ANNOTATION): "2026-01-01T00:00:00Z"}),
        );
        assert!(
            leaving(
                std::slice::from_ref(&replaced),
                &nodes,
                k8s_openapi::jiff::Timestamp::now()
            )
            .is_empty()
        );
        let at = |s: &str| s.parse::<k8s_openapi::jiff::Timestamp>().unwrap();
        let pods = [replaced, pod(1, Some("b"), json!({}))];
        assert!(overdue(&pods, at("2026-01-01T00:00:10Z"), REPLACED_GRACE).is_empty());
        assert_eq!(
            overdue(&pods, at("2026-01-01T00:00:30Z"), REPLACED_GRACE),
            vec![member_name(0)]
        );
    }

    #[test]
    fn an_unscheduled_pod_whose_claim_is_gone_is_named() {
        let claim = |i: usize, deleting: bool| -> PersistentVolumeClaim {
            let mut c: PersistentVolumeClaim =
                serde_json::from_value(json!({"metadata": {"name": claim_name(i)}})).unwrap();
            if deleting {
                c.metadata.deletion_timestamp =
                    Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                    ));
            }
            c
        };
        let pods = [
            pod(0, None, json!({})),
            pod(1, None, json!({})),
            pod(2, Some("b"), json!({})),
        ];
        assert_eq!(
            waiting_on_a_gone_claim(&pods, &[claim(0, true), claim(1, false)]),
            vec![member_name(0)]
        );
        assert_eq!(
            waiting_on_a_gone_claim(&pods, &[claim(1, false)]),
            vec![member_name(0)]
        );
        assert_eq!(claim_name(1), "data-kubevirt-etcd-1");
    }
}
