//! Launcher pods from the moment they are bound to this node.
//!
//! virt-handler's VMI watch selects `status.nodeName`, which virt-controller records once the
//! launcher runs (the kubelet reported its container started, up to a second after it did).
//! A launcher with a pod-network interface waits for this handler to build its network before
//! QEMU can start, so learning of it from the VMI alone made every start wait for that status
//! round trip (about 2 s here, `cargo xtask bench start`). This watch follows the launcher pods
//! bound to this node instead and, as soon as one's VMI vouches for it, lets the network
//! module serve it.
//!
//! Trust is unchanged: a pod is taken only when its VMI, read from the API server, names the
//! pod in `status.activePods` (written by virt-controller alone when it creates the pod), and
//! the network plan still comes from that VMI, never from the pod or the launcher.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use kubevirt_api::VirtualMachineInstance;
use tokio_util::sync::CancellationToken;

use crate::network::KnownVmis;

/// How long a bound pod's VMI may take to name it (virt-controller writes `activePods` with
/// the status it writes after creating the pod).
const VOUCH_WAIT: Duration = Duration::from_secs(30);
const VOUCH_POLL: Duration = Duration::from_millis(200);

/// The VMI a pod says it runs, as (namespace, name, uid): its controller owner of kind
/// VirtualMachineInstance, or for a migration's target pod (controlled by its
/// VirtualMachineInstanceMigration) the VMI its labels name. A claim only: the VMI must
/// vouch for the pod ([`vouches`]) before anything serves it.
pub fn owner_vmi(pod: &Pod) -> Option<(String, String, String)> {
    let o = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))?;
    if o.kind == kubevirt_api::catalogue::VIRTUAL_MACHINE_INSTANCE.kind {
        return Some((pod.namespace()?, o.name.clone(), o.uid.clone()));
    }
    // A target learnt of only once virt-controller records it launched (the kubelet's
    // report, up to a second after its container started) kept every migration's target
    // launcher waiting that long for its network (`cargo xtask bench migrate`).
    if o.kind == kubevirt_api::catalogue::VIRTUAL_MACHINE_INSTANCE_MIGRATION.kind {
        let labels = pod.labels();
        return Some((
            pod.namespace()?,
            labels.get(kubevirt_api::VM_NAME_LABEL)?.clone(),
            labels.get(kubevirt_api::CREATED_BY_LABEL)?.clone(),
        ));
    }
    None
}

/// Whether `vmi` vouches for `pod`: it is the pod's owner, not final, and its
/// `status.activePods` names the pod.
pub fn vouches(vmi: &VirtualMachineInstance, pod: &Pod) -> bool {
    let (Some(pod_uid), Some((_, _, owner))) = (pod.uid(), owner_vmi(pod)) else {
        return false;
    };
    let Some(status) = vmi.status.as_ref() else {
        return false;
    };
    vmi.uid().as_deref() == Some(owner.as_str())
        && !status.phase.is_final()
        && status
            .active_pods
            .as_ref()
            .is_some_and(|p| p.contains_key(&pod_uid))
}

/// The pod's IPv4 address as the API server reports it.
fn pod_ip(pod: &Pod) -> Option<std::net::Ipv4Addr> {
    pod.status.as_ref()?.pod_ip.as_deref()?.parse().ok()
}

fn done(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
        || pod
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p == "Succeeded" || p == "Failed")
}

/// Asks the API server for the pod's VMI until it vouches for the pod (then records it),
/// says it never will (another uid, final), or [`VOUCH_WAIT`] passed.
async fn resolve(client: Client, pod: Pod, vmis: KnownVmis) {
    let (Some(pod_uid), Some((ns, name, _))) = (pod.uid(), owner_vmi(&pod)) else {
        return;
    };
    let api: Api<VirtualMachineInstance> = Api::namespaced(client, &ns);
    let deadline = tokio::time::Instant::now() + VOUCH_WAIT;
    loop {
        match api.get_opt(&name).await {
            Ok(Some(vmi)) if vouches(&vmi, &pod) => {
                tracing::debug!(pod = %pod.name_any(), vmi = %name, "launcher pod known before its VMI is scheduled");
                vmis.insert_pod(&pod_uid, &vmi);
                return;
            }
            Ok(Some(vmi))
                if vmi.uid() != owner_vmi(&pod).map(|o| o.2)
                    || vmi.status.as_ref().is_some_and(|s| s.phase.is_final()) =>
            {
                return;
            }
            Ok(None) => return,
            Ok(Some(_)) => {}
            Err(e) => tracing::debug!(error = %e, vmi = %name, "reading a launcher pod's VMI"),
        }
        if tokio::time::Instant::now() > deadline {
            return;
        }
        tokio::time::sleep(VOUCH_POLL).await;
    }
}

/// Follows the launcher pods bound to `node` until `shutdown`.
pub async fn run(
    client: Client,
    node: String,
    vmis: KnownVmis,
    metrics: virt_watch::WatchMetrics,
    shutdown: CancellationToken,
) {
    let pods: Api<Pod> = Api::all(client.clone());
    let config = watcher::Config::default()
        .fields(&format!("spec.nodeName={node}"))
        .labels(&format!(
            "{}={}",
            kubevirt_api::COMPONENT_LABEL,
            kubevirt_api::LAUNCHER_COMPONENT
        ));
    let stream = virt_watch::watch(pods, config, "launcher-pods", metrics);
    tokio::pin!(stream);
    let resolving: Arc<Mutex<HashSet<String>>> = Arc::default();
    loop {
        let ev = tokio::select! {
            _ = shutdown.cancelled() => return,
            ev = stream.next() => ev,
        };
        let pod = match ev {
            None => return,
            Some(Ok(Event::Apply(p) | Event::InitApply(p))) => p,
            Some(Ok(Event::Delete(p))) => {
                if let Some(uid) = p.uid() {
                    vmis.remove_pod(&uid);
                }
                continue;
            }
            Some(Ok(Event::Init | Event::InitDone)) => continue,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "launcher pod watch failed; retrying");
                continue;
            }
        };
        let Some(uid) = pod.uid() else { continue };
        if done(&pod) {
            vmis.remove_pod(&uid);
            continue;
        }
        // The kubelet's report of the pod's address (from the CNI plugin): where a
        // bridge-bound guest is reached for port-forwarding.
        vmis.set_pod_ip(&uid, pod_ip(&pod));
        if vmis.has_pod(&uid) || owner_vmi(&pod).is_none() {
            continue;
        }
        if let Ok(mut r) = resolving.lock()
            && !r.insert(uid.clone())
        {
            continue;
        }
        let (client, vmis, resolving) = (client.clone(), vmis.clone(), resolving.clone());
        tokio::spawn(async move {
            resolve(client, pod, vmis).await;
            if let Ok(mut r) = resolving.lock() {
                r.remove(&uid);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(owner_kind: &str, owner_uid: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "virt-launcher-vm-abcde", "namespace": "ns", "uid": "pod-1",
                "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": owner_kind,
                    "name": "vm", "uid": owner_uid, "controller": true}]}
        }))
        .unwrap()
    }

    fn vmi(uid: &str, phase: &str, active: serde_json::Value) -> VirtualMachineInstance {
        serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "vm", "namespace": "ns", "uid": uid},
            "spec": {"domain": {"devices": {}}},
            "status": {"phase": phase, "activePods": active}
        }))
        .unwrap()
    }

    #[test]
    fn only_the_owning_vmi_naming_the_pod_vouches_for_it() {
        let p = pod("VirtualMachineInstance", "vmi-1");
        assert_eq!(
            owner_vmi(&p),
            Some(("ns".into(), "vm".into(), "vmi-1".into()))
        );
        assert!(vouches(
            &vmi("vmi-1", "Scheduling", json!({"pod-1": ""})),
            &p
        ));
        // Not (yet) named by virt-controller: a pod anyone could have made.
        assert!(!vouches(&vmi("vmi-1", "Scheduling", json!({})), &p));
        // A VMI of the same name but another uid (recreated).
        assert!(!vouches(
            &vmi("vmi-2", "Scheduling", json!({"pod-1": ""})),
            &p
        ));
        // Final VMIs serve nothing.
        assert!(!vouches(&vmi("vmi-1", "Failed", json!({"pod-1": ""})), &p));
        // A migration target is owned by its migration; its labels name the VMI, which
        // must vouch for it as for any pod.
        let mut target = pod("VirtualMachineInstanceMigration", "mig-1");
        assert_eq!(owner_vmi(&target), None, "no labels, no VMI");
        target.metadata.labels = Some(
            [
                (kubevirt_api::VM_NAME_LABEL, "vm"),
                (kubevirt_api::CREATED_BY_LABEL, "vmi-1"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        );
        assert_eq!(
            owner_vmi(&target),
            Some(("ns".into(), "vm".into(), "vmi-1".into()))
        );
        assert!(vouches(
            &vmi("vmi-1", "Running", json!({"pod-1": ""})),
            &target
        ));
        assert!(!vouches(&vmi("vmi-1", "Running", json!({})), &target));
        assert!(!vouches(
            &vmi("vmi-2", "Running", json!({"pod-1": ""})),
            &target
        ));
        // Owned by anything else: no claim at all.
        assert_eq!(owner_vmi(&pod("ReplicaSet", "rs-1")), None);
    }

    #[test]
    fn pods_known_early_are_launchers_until_their_vmi_names_them_itself() {
        let known = KnownVmis::default();
        let v = vmi("vmi-1", "Scheduling", json!({"pod-1": ""}));
        known.insert_pod("pod-1", &v);
        assert!(known.has_pod("pod-1"));
        let on = crate::network::launchers_on_for_tests(&known, "node-a");
        assert_eq!(on.len(), 1);
        assert_eq!(on[0].0, "pod-1");
        // The VMI's own entry (launched on node-a) replaces it, without a duplicate.
        known.insert(&vmi("vmi-1", "Scheduled", json!({"pod-1": "node-a"})));
        assert_eq!(
            crate::network::launchers_on_for_tests(&known, "node-a").len(),
            1
        );
        known.remove_pod("pod-1");
        assert!(!known.has_pod("pod-1"));
    }
}
