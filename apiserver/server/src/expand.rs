//! The `expand-spec` endpoints of subresources.kubevirt.io/v1 (upstream `virtctl expand`):
//! `GET namespaces/{ns}/virtualmachines/{name}/expand-spec` answers the stored VM, and
//! `PUT namespaces/{ns}/expand-vm-spec` the VM in the body, with its instance type and
//! preference written into its template and the references dropped — what the VM's VMI
//! gets, as a VM that needs neither.
//!
//! What is expanded is what virt-controller would apply: the copies the VM's status names
//! (ControllerRevisions in kube-apiserver), else the instance type and preference as stored
//! now. The expansion itself is `kubevirt_api::instancetype::vm::expand` (pure), shared with
//! virt-controller's `referencePolicy: expand`. Unlike KubeVirt, whose answer to a VM that
//! conflicts with its instance type, or names a missing one, is a 400 or 500 with a message,
//! both endpoints answer a 422 whose causes name each field.

use axum::response::{IntoResponse, Response};
use kubevirt_api::instancetype::reference::Reference;
use kubevirt_api::instancetype::revision;
use kubevirt_api::instancetype::vm::{Specs, captured_revision, sync_status_ref};
use kubevirt_api::kinds;
use kubevirt_api::validation::{ErrorType, FieldError};
use kubevirt_api::{VirtualMachine, instancetype::VirtualMachineInstancetypeSpec};
use serde_json::Value;

use crate::error::{ApiError, ApiResult};
use crate::rest::Registry;

pub use kubevirt_api::catalogue::EXPAND_VM_SPEC;

/// The spec of what `which` names: its captured copy, else the object as stored. `Ok(None)`
/// when the VM names none; a field error when it names something that does not exist.
async fn spec_of(
    registry: &Registry,
    vm: &VirtualMachine,
    ns: &str,
    which: Reference,
) -> ApiResult<Result<Option<Value>, FieldError>> {
    let Some(m) = which.matcher(vm) else {
        return Ok(Ok(None));
    };
    let name = m.name.clone().filter(|n| !n.is_empty());
    let Some(name) = name else {
        return Ok(Err(FieldError {
            kind: ErrorType::Required,
            field: format!("{}.name", which.field()),
            message: "Required value: a VM to expand names its instance type and preference \
                      (inferFromVolume is resolved when the VM is created)"
                .into(),
        }));
    };
    let status_ref = sync_status_ref(m, which.status_ref(vm));
    if let Some(rev) = captured_revision(Some(&status_ref))
        && let Some(found) = registry.controller_revision(ns, rev).await?
        && revision::copies(&found, &name)
    {
        return which
            .revision_spec(&found)
            .map(|s| Ok(Some(s)))
            .map_err(|e| ApiError::internal(e.to_string()));
    }
    // No copy (yet, or any longer): the object as it is now, which is what virt-controller
    // would capture.
    let def = which.strategy(m);
    let object_ns = if def.namespaced { ns } else { "" };
    match registry.get(def, object_ns, &name).await {
        Ok(o) => Ok(Ok(o.get("spec").cloned())),
        Err(e) if e.code == 404 => Ok(Err(FieldError {
            kind: ErrorType::NotFound,
            field: format!("{}.name", which.field()),
            message: format!("Not found: {}.{} {name:?}", def.meta.plural, def.meta.group),
        })),
        Err(e) => Err(e),
    }
}

/// The instance type and preference `vm` names, each as the VM uses it (its captured copy,
/// else the object as stored; `object: None` when it does not exist), for the VM admission's
/// checks on an update: a VM edited after it captured its instance type is checked against
/// that copy, as virt-controller will build the VMI from it.
pub(crate) async fn references_found(
    registry: &Registry,
    vm: &VirtualMachine,
    ns: &str,
) -> ApiResult<Vec<kinds::Found>> {
    let mut found = Vec::new();
    for which in Reference::BOTH {
        let Some(m) = which.matcher(vm) else {
            continue;
        };
        let Some(name) = m.name.clone().filter(|n| !n.is_empty()) else {
            // inferFromVolume: resolved (and checked) when the VM is created.
            continue;
        };
        let def = which.strategy(m);
        let reference = kinds::Reference {
            target: kinds::Target::Kind(def),
            namespace: if def.meta.namespaced {
                ns.to_string()
            } else {
                String::new()
            },
            name,
        };
        let object = match spec_of(registry, vm, ns, which).await? {
            Ok(spec) => Some(serde_json::json!({ "spec": spec })),
            Err(e) if e.kind == ErrorType::NotFound => None,
            Err(_) => continue,
        };
        found.push(kinds::Found { reference, object });
    }
    Ok(found)
}

fn decode<T: serde::de::DeserializeOwned>(
    v: Value,
    field: &str,
    errs: &mut Vec<FieldError>,
) -> Option<T> {
    match serde_json::from_value(v) {
        Ok(t) => Some(t),
        Err(e) => {
            errs.push(FieldError::type_invalid(field, &e.to_string()));
            None
        }
    }
}

/// `vm` expanded: the JSON of a VirtualMachine, or a 422 naming each field in the way.
async fn expand(registry: &Registry, vm: &VirtualMachine, ns: &str) -> ApiResult<Value> {
    let name = vm.metadata.name.clone().unwrap_or_default();
    let invalid =
        |errs: &[FieldError]| ApiError::invalid("VirtualMachine", crate::rest::GROUP, &name, errs);
    let mut errs = Vec::new();
    let mut specs = Specs::default();
    match spec_of(registry, vm, ns, Reference::Instancetype).await? {
        Ok(Some(s)) => {
            specs.instancetype =
                decode::<VirtualMachineInstancetypeSpec>(s, "spec.instancetype", &mut errs)
        }
        Ok(None) => {}
        Err(e) => errs.push(e),
    }
    match spec_of(registry, vm, ns, Reference::Preference).await? {
        Ok(Some(s)) => specs.preference = decode(s, "spec.preference", &mut errs),
        Ok(None) => {}
        Err(e) => errs.push(e),
    }
    if !errs.is_empty() {
        return Err(invalid(&errs));
    }
    let expanded =
        kubevirt_api::instancetype::vm::expand(vm, &specs).map_err(|errs| invalid(&errs))?;
    serde_json::to_value(&expanded).map_err(|e| ApiError::internal(e.to_string()))
}

fn answer(v: Value) -> Response {
    axum::Json(v).into_response()
}

/// `GET …/virtualmachines/{name}/expand-spec`: the stored VM, expanded.
pub async fn stored(registry: &Registry, ns: &str, name: &str) -> ApiResult<Response> {
    let stored = registry.get(&kinds::vm::STRATEGY, ns, name).await?;
    let vm: VirtualMachine = serde_json::from_value(stored)
        .map_err(|e| ApiError::internal(format!("stored VirtualMachine: {e}")))?;
    Ok(answer(expand(registry, &vm, ns).await?))
}

/// `PUT …/namespaces/{ns}/expand-vm-spec`: the VM in the body (in namespace `ns`, or in
/// none), validated as a create would validate it, expanded. Nothing is stored.
pub async fn body(registry: &Registry, ns: &str, bytes: &[u8]) -> ApiResult<Response> {
    let mut v: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("the body is not a VirtualMachine: {e}")))?;
    // virtctl sends the file's object as it decoded it: its kind, if the file has one.
    let kind = v.get("kind").and_then(Value::as_str).unwrap_or_default();
    if !matches!(kind, "" | "VirtualMachine") {
        return Err(ApiError::bad_request(format!(
            "the body is a {kind:?}, not a VirtualMachine"
        )));
    }
    let name = v
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    match v.pointer("/metadata/namespace").and_then(Value::as_str) {
        None | Some("") => {}
        Some(n) if n == ns => {}
        Some(_) => {
            return Err(ApiError::bad_request(format!(
                "VM namespace must be empty or {ns}"
            )));
        }
    }
    if let Some(md) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        md.insert("namespace".into(), Value::String(ns.to_string()));
    }
    let def = &kinds::vm::STRATEGY;
    let errs = (def.validate)(&v);
    if !errs.is_empty() {
        return Err(ApiError::invalid(
            "VirtualMachine",
            crate::rest::GROUP,
            &name,
            &errs,
        ));
    }
    let vm: VirtualMachine = serde_json::from_value(v)
        .map_err(|e| ApiError::bad_request(format!("the body is not a VirtualMachine: {e}")))?;
    Ok(answer(expand(registry, &vm, ns).await?))
}
