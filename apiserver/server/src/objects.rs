//! Small helpers over an object's JSON form. The server stores and moves objects as
//! `serde_json::Value` after decoding them once through the typed structs (pruning),
//! so that the generic REST logic is written once for every kind.

use serde_json::{Map, Value};

/// `metadata` of an object, created if missing.
pub fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.is_object() {
        *obj = Value::Object(Map::new());
    }
    let Value::Object(root) = obj else {
        unreachable!("obj was just made an object")
    };
    let entry = root
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !entry.is_object() {
        *entry = Value::Object(Map::new());
    }
    let Value::Object(m) = entry else {
        unreachable!("metadata was just made an object")
    };
    m
}

/// A string field of `metadata`.
pub fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

/// Sets or removes a `metadata` field.
pub fn set_meta(obj: &mut Value, field: &str, value: Option<Value>) {
    let m = meta_mut(obj);
    match value {
        Some(v) => {
            m.insert(field.to_string(), v);
        }
        None => {
            m.remove(field);
        }
    }
}

/// `metadata.finalizers` as strings.
pub fn finalizers(obj: &Value) -> Vec<String> {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Replaces `metadata.finalizers` (removed when empty).
pub fn set_finalizers(obj: &mut Value, fins: &[String]) {
    if fins.is_empty() {
        set_meta(obj, "finalizers", None);
    } else {
        set_meta(obj, "finalizers", Some(Value::from(fins.to_vec())));
    }
}

/// `metadata.labels` as a map.
pub fn labels(obj: &Value) -> std::collections::BTreeMap<String, String> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// The object with `metadata.resourceVersion` set.
pub fn with_rv(mut obj: Value, rv: i64) -> Value {
    set_meta(
        &mut obj,
        "resourceVersion",
        Some(Value::String(rv.to_string())),
    );
    obj
}

/// The object without the fields the server never stores in etcd.
pub fn without_rv(mut obj: Value) -> Value {
    set_meta(&mut obj, "resourceVersion", None);
    obj
}

/// Everything outside `metadata` (and `status` when it is a subresource): the part
/// whose change bumps `metadata.generation`.
pub fn spec_part(obj: &Value, has_status: bool) -> Map<String, Value> {
    obj.as_object()
        .map(|m| {
            m.iter()
                .filter(|(k, _)| {
                    !matches!(k.as_str(), "metadata" | "apiVersion" | "kind")
                        && (!has_status || k.as_str() != "status")
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// The object minus `managedFields` and resourceVersion: what "unchanged" compares.
pub fn comparable(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
        m.remove("resourceVersion");
    }
    o
}

/// RFC 3339 UTC with second precision, as Kubernetes writes timestamps.
pub fn now_rfc3339() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn spec_part_excludes_metadata_and_status() {
        let o =
            json!({"apiVersion":"v","kind":"k","metadata":{"a":1},"spec":{"x":1},"status":{"y":2}});
        assert_eq!(Value::Object(spec_part(&o, true)), json!({"spec":{"x":1}}));
        assert_eq!(
            Value::Object(spec_part(&o, false)),
            json!({"spec":{"x":1},"status":{"y":2}})
        );
    }

    #[test]
    fn meta_helpers_roundtrip() {
        let mut o = json!({});
        set_meta(&mut o, "name", Some(json!("a")));
        assert_eq!(meta_str(&o, "name"), Some("a"));
        set_finalizers(&mut o, &["x".to_string()]);
        assert_eq!(finalizers(&o), vec!["x"]);
        set_finalizers(&mut o, &[]);
        assert!(o.pointer("/metadata/finalizers").is_none());
    }
}
