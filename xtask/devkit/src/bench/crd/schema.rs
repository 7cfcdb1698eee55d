//! The CRD side: VirtualMachine under a group of its own, so that it sits beside
//! kubevirt.io in the same kube-apiserver, with our OpenAPI v3 schema made structural (the
//! same schema, so kube-apiserver validates and prunes the same document we decode).

use serde_json::{Value, json};

use super::harness::{poll, post};

pub const GROUP: &str = "crdbench.kubevirt.io";
pub const CRD_NAME: &str = "virtualmachines.crdbench.kubevirt.io";
/// The collection, relative to kube-apiserver.
pub const COLLECTION: &str = "/apis/crdbench.kubevirt.io/v1/namespaces/default/virtualmachines";

/// Creates the CRD and waits until its collection answers.
pub async fn install(c: &reqwest::Client, base: &str) -> anyhow::Result<()> {
    let crds = format!("{base}/apis/apiextensions.k8s.io/v1/customresourcedefinitions");
    post(c, &crds, &crd_object()?).await?;
    let crd = format!("{crds}/{CRD_NAME}");
    let collection = format!("{base}{COLLECTION}");
    poll(&format!("CRD {CRD_NAME} established"), || async {
        let v: Value = c.get(&crd).send().await.ok()?.json().await.ok()?;
        let established = v["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Established" && c["status"] == "True")
        });
        let serves = established && c.get(&collection).send().await.ok()?.status() == 200;
        serves.then_some(())
    })
    .await
}

/// The CRD: our VirtualMachine schema, made structural.
pub fn crd_object() -> anyhow::Result<Value> {
    let mut schema = virt_apimachinery::openapi::kind_schema("VirtualMachine")
        .ok_or_else(|| anyhow::anyhow!("no VirtualMachine schema"))?;
    structural(&mut schema);
    if let Some(props) = schema["properties"].as_object_mut() {
        props.insert("metadata".into(), json!({"type": "object"}));
        props.insert("apiVersion".into(), json!({"type": "string"}));
        props.insert("kind".into(), json!({"type": "string"}));
    }
    Ok(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": "virtualmachines", "singular": "virtualmachine",
                      "kind": "VirtualMachine", "listKind": "VirtualMachineList"},
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": schema},
                "subresources": {"status": {}},
            }],
        },
    }))
}

/// Rewrites an OpenAPI v3 schema into what a CRD accepts: no `$ref` (those become
/// objects that keep unknown fields), no vendor keys CRDs reject, no composition.
fn structural(v: &mut Value) {
    let Some(obj) = v.as_object_mut() else {
        if let Some(arr) = v.as_array_mut() {
            arr.iter_mut().for_each(structural);
        }
        return;
    };
    let is_ref = obj.contains_key("$ref")
        || obj.get("allOf").is_some_and(|a| {
            a.as_array()
                .is_some_and(|a| a.iter().any(|x| x.get("$ref").is_some()))
        });
    if is_ref {
        let desc = obj.get("description").cloned();
        obj.clear();
        obj.insert("type".into(), json!("object"));
        obj.insert("x-kubernetes-preserve-unknown-fields".into(), json!(true));
        if let Some(d) = desc {
            obj.insert("description".into(), d);
        }
        return;
    }
    obj.retain(|k, _| {
        !matches!(
            k.as_str(),
            "x-kubernetes-group-version-kind" | "allOf" | "oneOf" | "anyOf" | "default" | "format"
        )
    });
    // CRDs want list-map keys required (or defaulted) in the items.
    let keys = obj
        .get("x-kubernetes-list-map-keys")
        .and_then(Value::as_array)
        .cloned();
    if let (Some(keys), Some(items)) = (keys, obj.get_mut("items").and_then(Value::as_object_mut)) {
        let required = items.entry("required").or_insert_with(|| json!([]));
        if let Some(req) = required.as_array_mut() {
            for k in keys {
                if !req.contains(&k) {
                    req.push(k);
                }
            }
        }
    }
    if obj.get("x-kubernetes-int-or-string") == Some(&json!(true)) {
        obj.remove("type");
    }
    if obj.get("type") == Some(&json!("object"))
        && !obj.contains_key("properties")
        && !obj.contains_key("additionalProperties")
    {
        obj.insert("x-kubernetes-preserve-unknown-fields".into(), json!(true));
    }
    for (_, child) in obj.iter_mut() {
        structural(child);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crd_schema_is_structural() {
        let crd = crd_object().unwrap();
        assert!(!crd.to_string().contains("$ref"));
        let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
        assert_eq!(schema["properties"]["metadata"], json!({"type": "object"}));
        assert!(schema["properties"]["spec"].is_object());
        assert_eq!(crd["spec"]["group"], GROUP);
        assert!(COLLECTION.starts_with(&format!("/apis/{GROUP}/v1/")));
    }
}
