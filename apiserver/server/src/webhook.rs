//! The validating webhook for evictions of launcher pods (`kubectl drain`, the descheduler,
//! `kubectl evict`): kube-apiserver sends each such eviction here
//! (`ValidatingWebhookConfiguration` kubevirt-rs-launcher-eviction, objectSelector
//! `kubevirt.io=virt-launcher`). For a VMI that should move instead of stopping, the
//! eviction is refused with 429 (so the evictor retries) and the VMI is marked
//! (`status.evacuationNodeName`); virt-controller's evacuation controller then migrates it.
//! Once the VMI has left the node the old pod goes and the next eviction passes.
//! docs/cluster-flow.md §7.
//!
//! kube-apiserver presents no client certificate to webhooks, so this endpoint takes no
//! credentials. It reads only the named pod and VMI and its one write is the mark, which
//! a forged request can at worst set for a VMI whose strategy asks for it (the same exposure
//! as KubeVirt's virt-api webhooks).

use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use http::{StatusCode, header};
use k8s_openapi::api::core::v1::Pod;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use kubevirt_api::eviction::{self, EvictionStrategy, Plan};
use kubevirt_api::migration::names;
use kubevirt_api::{VirtualMachineInstance, VirtualMachineInstancePhase};
use serde_json::json;

use crate::error::ApiError;
use crate::kinds::ResourceDef;
use crate::rest::Via;
use crate::state::AppState;

/// Field manager of the evacuation mark.
const MANAGER: &str = "kubevirt-eviction";
/// Largest AdmissionReview accepted: an Eviction is small.
const MAX_REVIEW_BYTES: usize = 64 * 1024;

/// The answer to one eviction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Let the eviction proceed.
    Allow,
    /// Refuse it (429: the evictor retries) with this message.
    Refuse(String),
    /// Mark the VMI for evacuation from this node, then refuse with this message.
    Evacuate { node: String, message: String },
}

/// The verdict on evicting one of kubevirt-rs's own etcd pods (`None`: not one). Such a pod
/// holds virt-apiserver's data on a volume pinned to its node: evicted, it could start
/// nowhere else and the VM API would be gone for as long as the node is (issue 51). So its
/// eviction is refused until virt-operator has moved the member (a replacement joined
/// elsewhere, then this pod deleted), whatever the PodDisruptionBudget would allow; the
/// refusal says what the operator is doing.
pub fn etcd_verdict(pod: &Pod, components_namespace: &str) -> Option<Verdict> {
    let name = pod.metadata.name.as_deref()?;
    if pod.metadata.namespace.as_deref() != Some(components_namespace)
        || !name.starts_with(eviction::ETCD_POD_PREFIX)
    {
        return None;
    }
    // Going already, or its member replaced elsewhere: nothing left to protect.
    if pod.metadata.deletion_timestamp.is_some()
        || pod
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(eviction::ETCD_REPLACED_ANNOTATION))
    {
        return Some(Verdict::Allow);
    }
    let doing = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(eviction::ETCD_EVACUATION_STATUS_ANNOTATION))
        .map(|s| format!(" Now: {s}."))
        .unwrap_or_default();
    Some(Verdict::Refuse(format!(
        "{name} is a member of kubevirt-rs's etcd, whose volume stays on this node: \
         virt-operator moves it to another node first (a replacement member joins there, then \
         this pod is deleted and the eviction is no longer needed); retry until then.{doing}"
    )))
}

/// Asks virt-operator to move this etcd member (its node may not be cordoned: `kubectl
/// evict`, the descheduler).
async fn mark_etcd_pod(pods: &kube::Api<Pod>, name: &str) -> Result<(), String> {
    let patch = json!({"metadata": {"annotations": {
        (eviction::ETCD_EVACUATE_ANNOTATION): crate::objects::now_rfc3339()}}});
    match tokio::time::timeout(
        Duration::from_secs(5),
        pods.patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        ),
    )
    .await
    {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(format!("marking etcd pod {name} for evacuation: {e}")),
        Err(_) => Err(format!("marking etcd pod {name} for evacuation: timed out")),
    }
}

/// The VMI a launcher pod runs: its controller owner's name and uid.
fn owner_vmi(pod: &Pod) -> Option<(&str, &str)> {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "VirtualMachineInstance" && o.controller == Some(true))
        .map(|o| (o.name.as_str(), o.uid.as_str()))
}

/// What to do with an eviction of `pod`, whose VMI (by owner name) is `vmi`. Pure.
///
/// KubeVirt's rules (pod-eviction-admitter), with two differences: an old source pod of a
/// finished migration (still on the node the VMI left) is let go at once, and a pod already
/// terminating is never held.
pub fn verdict(
    pod: &Pod,
    vmi: Option<&VirtualMachineInstance>,
    default: EvictionStrategy,
) -> Verdict {
    let is_launcher = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(kubevirt_api::COMPONENT_LABEL))
        .is_some_and(|v| v == kubevirt_api::LAUNCHER_COMPONENT);
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if !is_launcher
        || matches!(phase, Some("Succeeded" | "Failed"))
        || pod.metadata.deletion_timestamp.is_some()
    {
        return Verdict::Allow;
    }
    let (Some((_, owner_uid)), Some(vmi)) = (owner_vmi(pod), vmi) else {
        return Verdict::Allow;
    };
    // A VMI of the same name created since: this pod is an orphan.
    if vmi.metadata.uid.as_deref() != Some(owner_uid) {
        return Verdict::Allow;
    }
    let status = vmi.status.clone().unwrap_or_default();
    if vmi.metadata.deletion_timestamp.is_some() || status.phase.is_final() {
        return Verdict::Allow;
    }
    let pod_node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default();
    let ns = vmi.metadata.namespace.as_deref().unwrap_or_default();
    let name = vmi.metadata.name.as_deref().unwrap_or_default();
    let vmi_node = status.node_name.as_deref().unwrap_or_default();
    let is_target = pod
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(names::MIGRATION_JOB_LABEL));
    if pod_node.is_empty()
        || vmi_node.is_empty()
        || status.phase != VirtualMachineInstancePhase::Running
    {
        // Not running yet (or no longer): nothing to move; the pod may go, as a pod
        // evicted before its guest started.
        return if is_target {
            Verdict::Refuse("Eviction request for a migration target Pod".into())
        } else {
            Verdict::Allow
        };
    }
    if pod_node != vmi_node {
        return if is_target {
            // The migration's own target: evicting it fails the migration, which retries.
            Verdict::Refuse("Eviction request for a migration target Pod".into())
        } else {
            // The source of a finished migration: the guest has left this pod.
            Verdict::Allow
        };
    }
    let strategy = eviction::effective(vmi, default);
    match eviction::plan(vmi, strategy) {
        Plan::Allow => Verdict::Allow,
        Plan::Refuse(why) => Verdict::Refuse(why),
        Plan::Evacuate if status.evacuation_node_name.as_deref() == Some(pod_node) => {
            Verdict::Refuse(format!(
                "Evacuation in progress: Eviction triggered evacuation of VMI \"{ns}/{name}\""
            ))
        }
        // This message format is what the descheduler expects (KubeVirt's).
        Plan::Evacuate => Verdict::Evacuate {
            node: pod_node.to_string(),
            message: format!("Eviction triggered evacuation of VMI \"{ns}/{name}\""),
        },
    }
}

/// Whether the Eviction asks for a dry run (the request's flag or its deleteOptions).
fn dry_run(req: &AdmissionRequest<DynamicObject>) -> bool {
    req.dry_run
        || req
            .object
            .as_ref()
            .and_then(|o| o.data.pointer("/deleteOptions/dryRun"))
            .and_then(|d| d.as_array())
            .is_some_and(|d| d.iter().any(|v| v == "All"))
}

fn review_response(review: AdmissionReview<DynamicObject>) -> Response {
    let mut r = Response::new(Body::from(serde_json::to_vec(&review).unwrap_or_default()));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

fn refuse(resp: AdmissionResponse, message: String) -> AdmissionResponse {
    let mut resp = resp.deny(&message);
    resp.result.code = StatusCode::TOO_MANY_REQUESTS.as_u16();
    resp.result.reason = "TooManyRequests".into();
    resp
}

/// How long an AdmissionReview's body may take to arrive.
const REVIEW_BODY_TIMEOUT: Duration = Duration::from_secs(5);

/// Serves `POST` [`eviction::WEBHOOK_PATH`].
pub async fn handle(st: &AppState, req: axum::extract::Request) -> Response {
    if req.method() != http::Method::POST {
        return ApiError::method_not_allowed().into_response();
    }
    // kube-apiserver sends a review of about a KiB at once: a caller that trickles its body
    // is cut off quickly, so it holds its source's slot (http.rs) for seconds at most.
    let bytes =
        match crate::state::read_body_within(req, MAX_REVIEW_BYTES, REVIEW_BODY_TIMEOUT).await {
            Ok((_, b)) => b,
            Err(e) => return e.into_response(),
        };
    let review: AdmissionReview<DynamicObject> = match serde_json::from_slice(&bytes) {
        Ok(r) => r,
        Err(e) => {
            return ApiError::bad_request(format!("decoding the AdmissionReview: {e}"))
                .into_response();
        }
    };
    let request: AdmissionRequest<DynamicObject> = match review.try_into() {
        Ok(r) => r,
        Err(e) => {
            return review_response(AdmissionResponse::invalid(e.to_string()).into_review());
        }
    };
    let resp = AdmissionResponse::from(&request);
    let resp = decide(st, &request).await.map_or_else(
        // Fail closed: a launcher pod whose VMI we cannot read is kept.
        |why| refuse(resp.clone(), why),
        |v| match v {
            Verdict::Allow => resp.clone(),
            Verdict::Refuse(m) | Verdict::Evacuate { message: m, .. } => refuse(resp.clone(), m),
        },
    );
    review_response(resp.into_review())
}

/// Reads the pod and its VMI, decides, and marks the VMI when the verdict says so.
async fn decide(st: &AppState, req: &AdmissionRequest<DynamicObject>) -> Result<Verdict, String> {
    let ns = req.namespace.clone().unwrap_or_default();
    let Some(kube) = st.eviction.kube.clone() else {
        return Err("virt-apiserver has no Kubernetes client to read the pod".into());
    };
    let pods: kube::Api<Pod> = kube::Api::namespaced(kube, &ns);
    let pod = match tokio::time::timeout(Duration::from_secs(5), pods.get_opt(&req.name)).await {
        Ok(Ok(Some(p))) => p,
        // Gone already: nothing to protect.
        Ok(Ok(None)) => return Ok(Verdict::Allow),
        Ok(Err(e)) => return Err(format!("reading pod {ns}/{}: {e}", req.name)),
        Err(_) => return Err(format!("reading pod {ns}/{}: timed out", req.name)),
    };
    if let Some(v) = etcd_verdict(&pod, &st.registry.policy().components_namespace) {
        if matches!(v, Verdict::Refuse(_)) && !dry_run(req) {
            mark_etcd_pod(&pods, &req.name).await?;
        }
        return Ok(v);
    }
    let Some((vmi_name, _)) = owner_vmi(&pod) else {
        return Ok(Verdict::Allow);
    };
    let def: &ResourceDef = &kubevirt_api::kinds::vmi::STRATEGY;
    let vmi = match st.registry.get(def, &ns, vmi_name).await {
        Ok(v) => Some(
            serde_json::from_value::<VirtualMachineInstance>(v)
                .map_err(|e| format!("decoding VMI {ns}/{vmi_name}: {e}"))?,
        ),
        Err(e) if e.code == 404 => None,
        Err(e) => return Err(format!("kubevirt failed getting the VMI: {}", e.message)),
    };
    let verdict = verdict(
        &pod,
        vmi.as_ref(),
        st.eviction
            .default_strategy
            .unwrap_or(EvictionStrategy::None),
    );
    if let Verdict::Evacuate { node, .. } = &verdict {
        let via = Via {
            status_only: true,
            manager: MANAGER,
        };
        let node = node.clone();
        st.registry
            .mutate(def, &ns, vmi_name, via, dry_run(req), |v| {
                v["status"]["evacuationNodeName"] = json!(node);
                Ok(())
            })
            .await
            .map_err(|e| {
                format!(
                    "kubevirt failed marking the VMI for eviction: {}",
                    e.message
                )
            })?;
        tracing::info!(
            namespace = %ns,
            vmi = %vmi_name,
            pod = %req.name,
            node = %node,
            dry_run = dry_run(req),
            "Eviction of a launcher pod: evacuating its VMI"
        );
    }
    Ok(verdict)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::Value;

    fn pod(node: &str, extra_labels: Value, phase: &str) -> Pod {
        let mut labels = json!({"kubevirt.io": "virt-launcher"});
        if let (Some(l), Some(e)) = (labels.as_object_mut(), extra_labels.as_object()) {
            l.extend(e.clone());
        }
        serde_json::from_value(json!({
            "metadata": {"name": "virt-launcher-a-x", "namespace": "ns", "labels": labels,
                "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                    "name": "a", "uid": "u1", "controller": true}]},
            "spec": {"nodeName": node, "containers": []},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    fn vmi(strategy: Option<&str>, node: &str, evacuating: Option<&str>) -> VirtualMachineInstance {
        let mut spec = json!({"domain": {"devices": {}}});
        if let Some(s) = strategy {
            spec["evictionStrategy"] = json!(s);
        }
        serde_json::from_value(json!({
            "metadata": {"name": "a", "namespace": "ns", "uid": "u1"},
            "spec": spec,
            "status": {"phase": "Running", "nodeName": node, "evacuationNodeName": evacuating},
        }))
        .unwrap()
    }

    const NONE: EvictionStrategy = EvictionStrategy::None;

    #[test]
    fn an_etcd_member_is_never_evicted_and_the_refusal_says_what_happens() {
        let etcd = |ns: &str, name: &str, status: Option<&str>| -> Pod {
            let mut annotations = serde_json::Map::new();
            if let Some(s) = status {
                annotations.insert(eviction::ETCD_EVACUATION_STATUS_ANNOTATION.into(), json!(s));
            }
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": ns, "annotations": annotations},
                "spec": {"nodeName": "n1", "containers": []},
            }))
            .unwrap()
        };
        let v = etcd_verdict(&etcd("kubevirt", "kubevirt-etcd-0", None), "kubevirt");
        assert!(
            matches!(&v, Some(Verdict::Refuse(m)) if m.contains("virt-operator moves it")),
            "{v:?}"
        );
        let v = etcd_verdict(
            &etcd(
                "kubevirt",
                "kubevirt-etcd-0",
                Some("no other schedulable node can take it"),
            ),
            "kubevirt",
        );
        assert!(
            matches!(&v, Some(Verdict::Refuse(m)) if m.contains("no other schedulable node")),
            "{v:?}"
        );
        // A pod of that name elsewhere is not ours.
        assert_eq!(
            etcd_verdict(&etcd("tenant", "kubevirt-etcd-0", None), "kubevirt"),
            None
        );
        let mut replaced = etcd("kubevirt", "kubevirt-etcd-0", None);
        replaced.metadata.annotations = Some(
            [(
                eviction::ETCD_REPLACED_ANNOTATION.to_string(),
                "t".to_string(),
            )]
            .into(),
        );
        assert_eq!(etcd_verdict(&replaced, "kubevirt"), Some(Verdict::Allow));
        let mut going = etcd("kubevirt", "kubevirt-etcd-1", None);
        going.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert_eq!(etcd_verdict(&going, "kubevirt"), Some(Verdict::Allow));
    }

    #[test]
    fn a_migratable_vmi_is_marked_and_the_eviction_refused() {
        let v = verdict(
            &pod("n1", json!({}), "Running"),
            Some(&vmi(Some("LiveMigrate"), "n1", None)),
            NONE,
        );
        assert_eq!(
            v,
            Verdict::Evacuate {
                node: "n1".into(),
                message: "Eviction triggered evacuation of VMI \"ns/a\"".into()
            }
        );
        // The cluster default applies to a VMI without its own strategy.
        let v = verdict(
            &pod("n1", json!({}), "Running"),
            Some(&vmi(None, "n1", None)),
            EvictionStrategy::LiveMigrate,
        );
        assert!(matches!(v, Verdict::Evacuate { .. }), "{v:?}");
    }

    #[test]
    fn a_marked_vmi_is_refused_without_a_new_mark() {
        let v = verdict(
            &pod("n1", json!({}), "Running"),
            Some(&vmi(Some("LiveMigrate"), "n1", Some("n1"))),
            NONE,
        );
        assert!(
            matches!(v, Verdict::Refuse(ref m) if m.starts_with("Evacuation in progress")),
            "{v:?}"
        );
    }

    #[test]
    fn strategy_none_and_gone_or_finished_pods_pass() {
        let running = pod("n1", json!({}), "Running");
        assert_eq!(
            verdict(&running, Some(&vmi(None, "n1", None)), NONE),
            Verdict::Allow
        );
        assert_eq!(
            verdict(&running, None, EvictionStrategy::LiveMigrate),
            Verdict::Allow
        );
        let done = pod("n1", json!({}), "Succeeded");
        assert_eq!(
            verdict(&done, Some(&vmi(Some("LiveMigrate"), "n1", None)), NONE),
            Verdict::Allow
        );
        let mut other_vmi = vmi(Some("LiveMigrate"), "n1", None);
        other_vmi.metadata.uid = Some("u2".into());
        assert_eq!(verdict(&running, Some(&other_vmi), NONE), Verdict::Allow);
        let not_launcher: Pod = {
            let mut p = running.clone();
            p.metadata.labels = None;
            p
        };
        assert_eq!(
            verdict(
                &not_launcher,
                Some(&vmi(Some("LiveMigrate"), "n1", None)),
                NONE
            ),
            Verdict::Allow
        );
    }

    #[test]
    fn the_old_source_goes_and_the_target_stays() {
        let moved = vmi(Some("LiveMigrate"), "n2", Some("n1"));
        assert_eq!(
            verdict(&pod("n1", json!({}), "Running"), Some(&moved), NONE),
            Verdict::Allow
        );
        let target = pod(
            "n2",
            json!({"kubevirt.io/migrationJobUID": "m1"}),
            "Running",
        );
        let migrating = vmi(Some("LiveMigrate"), "n1", Some("n1"));
        assert!(matches!(
            verdict(&target, Some(&migrating), NONE),
            Verdict::Refuse(_)
        ));
    }

    #[test]
    fn a_vmi_that_cannot_migrate_blocks_its_eviction_only_under_live_migrate() {
        let mut v = vmi(Some("LiveMigrate"), "n1", None);
        v.status.as_mut().unwrap().conditions = Some(vec![
            serde_json::from_value(json!({
            "type": "LiveMigratable", "status": "False", "reason": "DisksNotLiveMigratable",
            "message": "PVC d is not shared"}))
            .unwrap(),
        ]);
        let p = pod("n1", json!({}), "Running");
        assert!(
            matches!(verdict(&p, Some(&v), NONE), Verdict::Refuse(ref m) if m.contains("not live-migratable"))
        );
        v.spec.eviction_strategy = Some(EvictionStrategy::LiveMigrateIfPossible);
        assert_eq!(verdict(&p, Some(&v), NONE), Verdict::Allow);
    }
}
