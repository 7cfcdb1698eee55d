//! The volume hotplug subresources (`addvolume`, `removevolume`) of VMs and VMIs, with
//! KubeVirt's semantics (virt-api's `rest/volumes.go`): a VMI's spec changes here (virt-
//! controller and virt-handler attach the volume); a VM's request is queued in its
//! `status.volumeRequests` under `HotplugVolumes` (virt-controller applies it to the template
//! and the running VMI) or written to its template under `DeclarativeHotplugVolumes` alone.
//!
//! Beyond KubeVirt, an added volume's claim must exist (a 422 naming it), and a VMI's add of
//! a ReadWriteOnce claim that a running pod on another node mounts is a 409 naming the pod
//! and its node: bad input is refused before anything is half attached. Both need
//! kube-apiserver; a standalone server (no `--kubeconfig`) has no claims to look at and skips
//! them.

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::ListParams;
use kubevirt_api::hotplug::{
    self, AddVolumeOptions, RemoveVolumeOptions, RequestError, VirtualMachineVolumeRequest,
};
use kubevirt_api::validation::FieldError;
use kubevirt_api::vm::VirtualMachineStatus;
use kubevirt_api::{VirtualMachineInstance, VirtualMachineInstancePhase as Phase};
use kubevirt_api::{VirtualMachineInstanceSpec, VirtualMachineSpec};
use serde_json::Value;

use crate::error::{ApiError, ApiResult};
use crate::rest::Via;
use crate::state::AppState;
use crate::subresources::{state_conflict as conflict, vm_def, vmi_def};

/// Field manager of the writes.
const MANAGER: &str = "kubevirt-subresources";

/// KubeVirt's 409 when the VMI does not run.
pub const VMI_NOT_RUNNING: &str = "VMI is not running";

fn request_conflict(resource: &'static str, name: &str, e: &RequestError) -> ApiError {
    conflict(resource, name, &e.to_string())
}

fn internal(what: &str, e: impl std::fmt::Display) -> ApiError {
    ApiError::internal(format!("stored {what}: {e}"))
}

/// An add, as a request.
pub fn add(o: AddVolumeOptions) -> VirtualMachineVolumeRequest {
    VirtualMachineVolumeRequest {
        add_volume_options: Some(o),
        remove_volume_options: None,
    }
}

/// A remove, as a request.
pub fn remove(o: RemoveVolumeOptions) -> VirtualMachineVolumeRequest {
    VirtualMachineVolumeRequest {
        add_volume_options: None,
        remove_volume_options: Some(o),
    }
}

/// The claim an add names: its name and the field that names it.
fn claim_of(o: &AddVolumeOptions) -> Option<(&str, &'static str)> {
    let s = o.volume_source.as_ref()?;
    if let Some(p) = &s.persistent_volume_claim {
        return Some((
            p.claim_name.as_str(),
            "volumeSource.persistentVolumeClaim.claimName",
        ));
    }
    s.data_volume
        .as_ref()
        .map(|d| (d.name.as_str(), "volumeSource.dataVolume.name"))
}

/// The added volume's claim (a DataVolume's has its name), read from kube-apiserver: a 422
/// naming it when it does not exist. `None` without kube-apiserver.
async fn existing_claim(
    st: &AppState,
    ns: &str,
    kind: &str,
    name: &str,
    o: &AddVolumeOptions,
) -> ApiResult<Option<PersistentVolumeClaim>> {
    let (Some(kube), Some((claim, field))) = (st.auth.kube.as_ref(), claim_of(o)) else {
        return Ok(None);
    };
    let claims: kube::Api<PersistentVolumeClaim> = kube::Api::namespaced(kube.clone(), ns);
    match claims.get_opt(claim).await {
        Ok(Some(c)) => Ok(Some(c)),
        Ok(None) => Err(ApiError::invalid(
            kind,
            kubevirt_api::GROUP,
            name,
            &[FieldError::invalid(
                field,
                claim,
                &format!(
                    "PersistentVolumeClaim {ns}/{claim} not found: create the claim (or \
                     DataVolume) before adding volume {}",
                    o.name
                ),
            )],
        )),
        Err(e) => Err(ApiError::internal(format!(
            "reading PersistentVolumeClaim {ns}/{claim}: {e}"
        ))),
    }
}

/// Whether a claim can only be mounted on one node at a time (ReadWriteOnce).
fn read_write_once(c: &PersistentVolumeClaim) -> bool {
    c.spec
        .as_ref()
        .and_then(|s| s.access_modes.as_ref())
        .is_some_and(|m| m.iter().any(|m| m == "ReadWriteOnce"))
}

/// The first running pod (not being deleted) that mounts `claim` on a node other than
/// `node`: its name and node.
pub fn pod_elsewhere(pods: &[Pod], claim: &str, node: &str) -> Option<(String, String)> {
    pods.iter().find_map(|p| {
        let spec = p.spec.as_ref()?;
        let on = spec.node_name.as_deref().filter(|n| !n.is_empty())?;
        let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        let mounts = spec.volumes.iter().flatten().any(|v| {
            v.persistent_volume_claim
                .as_ref()
                .is_some_and(|c| c.claim_name == claim)
        });
        (on != node && running && mounts && p.metadata.deletion_timestamp.is_none())
            .then(|| (p.metadata.name.clone().unwrap_or_default(), on.to_string()))
    })
}

/// A ReadWriteOnce claim that a running pod on another node mounts cannot be attached to
/// the VMI's node: a 409 naming the claim, the pod and its node.
async fn check_rwo(
    st: &AppState,
    ns: &str,
    name: &str,
    node: &str,
    claim: &PersistentVolumeClaim,
) -> ApiResult<()> {
    let Some(kube) = st.auth.kube.as_ref() else {
        return Ok(());
    };
    if !read_write_once(claim) || node.is_empty() {
        return Ok(());
    }
    let claim_name = claim.metadata.name.clone().unwrap_or_default();
    let pods: kube::Api<Pod> = kube::Api::namespaced(kube.clone(), ns);
    let list = pods
        .list(&ListParams::default())
        .await
        .map_err(|e| ApiError::internal(format!("listing pods of {ns}: {e}")))?;
    match pod_elsewhere(&list.items, &claim_name, node) {
        Some((pod, other)) => Err(conflict(
            "virtualmachineinstance",
            name,
            &format!(
                "PersistentVolumeClaim {claim_name} is ReadWriteOnce and used by pod {pod} on \
                 node {other}, not on the VMI's node {node}"
            ),
        )),
        None => Ok(()),
    }
}

fn typed_vmi(v: &Value) -> ApiResult<VirtualMachineInstance> {
    serde_json::from_value(v.clone()).map_err(|e| internal("VirtualMachineInstance", e))
}

fn accepted() -> Response {
    StatusCode::ACCEPTED.into_response()
}

/// `addvolume`/`removevolume` of a VMI: checked against the running VMI and applied to its
/// spec (retried on a conflicting write, checked again each time).
pub async fn vmi(
    st: &AppState,
    ns: &str,
    name: &str,
    request: VirtualMachineVolumeRequest,
    dry_run: bool,
) -> ApiResult<Response> {
    let stored = st.registry.get(vmi_def(), ns, name).await?;
    let vmi = typed_vmi(&stored)?;
    // KubeVirt: a VM's instance is changed through its VM unless ephemeral hotplug
    // (HotplugVolumes) is on.
    let owned_by_vm = vmi
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "VirtualMachine" && o.controller == Some(true));
    if owned_by_vm && !st.registry.policy().gates.hotplug_volumes {
        return Err(ApiError::bad_request(format!(
            "VMI {ns}/{name} is owned by a VM"
        )));
    }
    let status = vmi.status.as_ref();
    if status.map(|s| s.phase) != Some(Phase::Running) {
        return Err(conflict("virtualmachineinstance", name, VMI_NOT_RUNNING));
    }
    hotplug::verify(vmi.spec.volumes.as_deref().unwrap_or_default(), &request)
        .map_err(|e| request_conflict("virtualmachineinstance", name, &e))?;
    if let Some(add) = &request.add_volume_options
        && let Some(claim) = existing_claim(st, ns, "VirtualMachineInstance", name, add).await?
    {
        let node = status
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or_default();
        check_rwo(st, ns, name, node, &claim).await?;
    }
    let via = Via {
        status_only: false,
        manager: MANAGER,
    };
    st.registry
        .mutate(vmi_def(), ns, name, via, dry_run, |v| {
            let cur = typed_vmi(v)?;
            if cur.status.as_ref().map(|s| s.phase) != Some(Phase::Running) {
                return Err(conflict("virtualmachineinstance", name, VMI_NOT_RUNNING));
            }
            let volumes = cur.spec.volumes.as_deref().unwrap_or_default();
            hotplug::verify(volumes, &request)
                .map_err(|e| request_conflict("virtualmachineinstance", name, &e))?;
            let spec = hotplug::apply(&cur.spec, &request)
                .map_err(|e| request_conflict("virtualmachineinstance", name, &e))?;
            v["spec"] = serde_json::to_value(spec).map_err(|e| internal("spec", e))?;
            // A VM's instance: virt-controller leaves what is hotplugged here alone.
            if owned_by_vm {
                let key = hotplug::EPHEMERAL_ANNOTATION;
                let before = v
                    .pointer("/metadata/annotations")
                    .and_then(|a| a.get(key))
                    .and_then(Value::as_str)
                    .map(str::to_string);
                let after = hotplug::ephemeral_after(before.as_deref(), &request);
                if !v["metadata"]["annotations"].is_object() {
                    v["metadata"]["annotations"] = Value::Object(Default::default());
                }
                if let Some(a) = v["metadata"]["annotations"].as_object_mut() {
                    match after {
                        Some(names) => a.insert(key.to_string(), Value::String(names)),
                        None => a.remove(key),
                    };
                    if a.is_empty() {
                        v["metadata"]
                            .as_object_mut()
                            .map(|m| m.remove("annotations"));
                    }
                }
            }
            Ok(())
        })
        .await?;
    Ok(accepted())
}

/// `addvolume`/`removevolume` of a VM: checked against its template, then queued in its
/// status (HotplugVolumes) or applied to its template (DeclarativeHotplugVolumes alone).
pub async fn vm(
    st: &AppState,
    ns: &str,
    name: &str,
    request: VirtualMachineVolumeRequest,
    dry_run: bool,
) -> ApiResult<Response> {
    let template = |v: &Value| -> ApiResult<VirtualMachineInstanceSpec> {
        let spec: VirtualMachineSpec = serde_json::from_value(v["spec"].clone())
            .map_err(|e| internal("VirtualMachine spec", e))?;
        Ok(spec.template.spec.unwrap_or_default())
    };
    let check = |v: &Value| -> ApiResult<VirtualMachineInstanceSpec> {
        let t = template(v)?;
        hotplug::verify(t.volumes.as_deref().unwrap_or_default(), &request)
            .map_err(|e| request_conflict("virtualmachine", name, &e))?;
        Ok(t)
    };
    let stored = st.registry.get(vm_def(), ns, name).await?;
    check(&stored)?;
    if let Some(add) = &request.add_volume_options {
        existing_claim(st, ns, "VirtualMachine", name, add).await?;
    }
    let queued = st.registry.policy().gates.hotplug_volumes;
    let via = Via {
        status_only: queued,
        manager: MANAGER,
    };
    st.registry
        .mutate(vm_def(), ns, name, via, dry_run, |v| {
            let t = check(v)?;
            if queued {
                let status: Option<VirtualMachineStatus> =
                    serde_json::from_value(v.get("status").cloned().unwrap_or(Value::Null))
                        .map_err(|e| internal("VirtualMachine status", e))?;
                let pending = status.and_then(|s| s.volume_requests).unwrap_or_default();
                let next = hotplug::queue(&pending, &request)
                    .map_err(|e| request_conflict("virtualmachine", name, &e))?;
                if !v.get("status").is_some_and(Value::is_object) {
                    v["status"] = Value::Object(Default::default());
                }
                v["status"]["volumeRequests"] =
                    serde_json::to_value(next).map_err(|e| internal("volumeRequests", e))?;
            } else {
                let spec = hotplug::apply(&t, &request)
                    .map_err(|e| request_conflict("virtualmachine", name, &e))?;
                v["spec"]["template"]["spec"] =
                    serde_json::to_value(spec).map_err(|e| internal("template", e))?;
            }
            Ok(())
        })
        .await?;
    Ok(accepted())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pod(name: &str, node: &str, claim: &str, phase: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"nodeName": node, "containers": [],
                     "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    #[test]
    fn a_claim_is_elsewhere_when_a_running_pod_on_another_node_mounts_it() {
        let pods = [
            pod("same-node", "n1", "c", "Running"),
            pod("done", "n2", "c", "Succeeded"),
            pod("other-claim", "n2", "d", "Running"),
        ];
        assert_eq!(pod_elsewhere(&pods, "c", "n1"), None);
        let pods = [pod("user", "n2", "c", "Running")];
        assert_eq!(
            pod_elsewhere(&pods, "c", "n1"),
            Some(("user".into(), "n2".into()))
        );
    }
}
