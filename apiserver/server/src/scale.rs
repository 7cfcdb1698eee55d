//! The `/scale` subresource of the replicated kinds (`autoscaling/v1` Scale, as a CRD's
//! scale subresource serves it): `spec.replicas` read and written, `status.replicas` and
//! `status.labelSelector` read, so `kubectl scale` (a merge patch of the Scale) and an HPA
//! (GET, then PUT with the resourceVersion it read) work. The Scale is a view: every write
//! is a read-modify-write of the object with the registry's CAS retries.

use axum::Json;
use axum::response::{IntoResponse, Response};
use kubevirt_api::validation::FieldError;
use serde_json::{Value, json};

use crate::error::{ApiError, ApiResult, Gr};
use crate::kinds::ResourceDef;
use crate::rest::{Patch, Registry, Via};

/// Scale's kind and group, for 422s (`Scale.autoscaling "web" is invalid: …`).
const KIND: &str = "Scale";
const GROUP: &str = "autoscaling";

/// The Scale view of `obj`.
pub fn scale_of(obj: &Value) -> Value {
    let meta = |k: &str| obj.pointer(&format!("/metadata/{k}")).cloned();
    let mut metadata = serde_json::Map::new();
    for k in [
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "creationTimestamp",
    ] {
        if let Some(v) = meta(k) {
            metadata.insert(k.into(), v);
        }
    }
    let replicas = obj
        .pointer("/spec/replicas")
        .and_then(Value::as_i64)
        .unwrap_or(1);
    let mut status = json!({
        "replicas": obj.pointer("/status/replicas").and_then(Value::as_i64).unwrap_or(0),
    });
    if let Some(sel) = obj
        .pointer("/status/labelSelector")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
    {
        status["selector"] = json!(sel);
    }
    json!({
        "kind": KIND,
        "apiVersion": "autoscaling/v1",
        "metadata": metadata,
        "spec": {"replicas": replicas},
        "status": status,
    })
}

/// The replicas a Scale asks for, or the field errors of a bad one.
pub fn desired_replicas(scale: &Value) -> Result<i32, Vec<FieldError>> {
    let field = "spec.replicas";
    match scale.pointer("/spec/replicas") {
        // Scale's replicas is optional: absent means 0, as kube-apiserver decodes it.
        None | Some(Value::Null) => Ok(0),
        Some(Value::Number(n)) => match n.as_i64() {
            Some(r) if r < 0 => Err(vec![FieldError::invalid(
                field,
                &r.to_string(),
                "must be greater than or equal to 0",
            )]),
            Some(r) => i32::try_from(r)
                .map_err(|_| vec![FieldError::invalid(field, &r.to_string(), "out of range")]),
            None => Err(vec![FieldError::type_invalid(field, "expected an integer")]),
        },
        Some(other) => Err(vec![FieldError::type_invalid(
            field,
            &format!("expected an integer, got {other}"),
        )]),
    }
}

/// A written Scale must be one: `autoscaling/v1` `Scale` where it says (kube-apiserver's
/// decoder refuses another type with a 400), a JSON object.
fn check_type(scale: &Value) -> ApiResult<()> {
    if !scale.is_object() {
        return Err(ApiError::bad_request("a Scale must be a JSON object"));
    }
    for (field, want) in [("apiVersion", "autoscaling/v1"), ("kind", KIND)] {
        match scale.get(field) {
            None | Some(Value::Null) => {}
            Some(Value::String(v)) if v == want || v.is_empty() => {}
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "{field} {other} in the body: a /scale write takes an autoscaling/v1 Scale"
                )));
            }
        }
    }
    Ok(())
}

/// How a `/scale` write changes the Scale.
#[derive(Debug)]
pub enum Change {
    /// PUT: the whole Scale.
    Replace(Value),
    /// PATCH of the current Scale.
    Patch(Patch),
}

/// GET `/scale`.
pub async fn get(
    registry: &Registry,
    def: &ResourceDef,
    ns: &str,
    name: &str,
) -> ApiResult<Response> {
    let obj = registry.get(def, ns, name).await?;
    Ok(Json(scale_of(&obj)).into_response())
}

/// PUT or PATCH `/scale`: the object's `spec.replicas` set from the changed Scale; a
/// resourceVersion in the Scale must be the object's (409 otherwise, as for any update).
pub async fn write(
    registry: &Registry,
    def: &ResourceDef,
    ns: &str,
    name: &str,
    change: Change,
    dry_run: bool,
    manager: &str,
) -> ApiResult<Response> {
    let via = Via {
        status_only: false,
        manager,
    };
    let gr = Gr {
        resource: def.plural,
        group: def.group,
    };
    let updated = registry
        .mutate(def, ns, name, via, dry_run, |obj| {
            let current = scale_of(obj);
            let scale = match &change {
                Change::Replace(s) => s.clone(),
                Change::Patch(p) => {
                    let mut s = current.clone();
                    match p {
                        Patch::Merge(m) => json_patch::merge(&mut s, m),
                        Patch::Json(ops) => json_patch::patch(&mut s, ops).map_err(|e| {
                            ApiError::invalid(KIND, GROUP, name, &[FieldError::invalid(
                                "",
                                "",
                                &format!("the server rejected our request due to an error in our request: {e}"),
                            )])
                        })?,
                    }
                    s
                }
            };
            check_type(&scale)?;
            // kube-apiserver validates a replaced Scale's metadata like any object's.
            let named = scale
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty());
            if matches!(change, Change::Replace(_)) && !named {
                return Err(ApiError::invalid(
                    KIND,
                    GROUP,
                    name,
                    &[FieldError::required(
                        "metadata.name",
                        "name or generateName is required",
                    )],
                ));
            }
            if let Some(n) = scale.pointer("/metadata/name").and_then(Value::as_str)
                && !n.is_empty()
                && n != name
            {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )));
            }
            let rv = scale
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .unwrap_or("");
            let current_rv = current
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .unwrap_or("");
            if !rv.is_empty() && rv != current_rv {
                return Err(ApiError::stale(
                    Gr {
                        resource: gr.resource,
                        group: gr.group,
                    },
                    name,
                ));
            }
            let replicas = desired_replicas(&scale)
                .map_err(|errs| ApiError::invalid(KIND, GROUP, name, &errs))?;
            match obj.get_mut("spec").and_then(Value::as_object_mut) {
                Some(spec) => {
                    spec.insert("replicas".into(), json!(replicas));
                }
                None => obj["spec"] = json!({ "replicas": replicas }),
            }
            Ok(())
        })
        .await?;
    Ok(Json(scale_of(&updated)).into_response())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_scale_view_has_the_selector_and_counts() {
        let obj = json!({"metadata": {"name": "p", "namespace": "n", "uid": "u", "resourceVersion": "7",
            "labels": {"x": "y"}}, "spec": {"replicas": 3},
            "status": {"replicas": 2, "labelSelector": "app=p"}});
        let s = scale_of(&obj);
        assert_eq!(s["kind"], "Scale");
        assert_eq!(s["apiVersion"], "autoscaling/v1");
        assert_eq!(
            s["metadata"],
            json!({"name": "p", "namespace": "n", "uid": "u", "resourceVersion": "7"})
        );
        assert_eq!(s["spec"]["replicas"], 3);
        assert_eq!(s["status"], json!({"replicas": 2, "selector": "app=p"}));
        // Unset replicas are the kind's default of 1; no status yet is 0 and no selector.
        let s = scale_of(&json!({"metadata": {"name": "p"}, "spec": {}}));
        assert_eq!(s["spec"]["replicas"], 1);
        assert_eq!(s["status"], json!({"replicas": 0}));
    }

    #[test]
    fn negative_or_wrong_replicas_name_the_field() {
        assert_eq!(
            desired_replicas(&json!({"spec": {"replicas": 4}})).unwrap(),
            4
        );
        assert_eq!(desired_replicas(&json!({"spec": {}})).unwrap(), 0);
        let errs = desired_replicas(&json!({"spec": {"replicas": -1}})).unwrap_err();
        assert_eq!(errs[0].field, "spec.replicas");
        let errs = desired_replicas(&json!({"spec": {"replicas": "x"}})).unwrap_err();
        assert_eq!(errs[0].field, "spec.replicas");
    }
}
