//! Output conversions: Table (for `kubectl get`) and PartialObjectMetadata (for the
//! garbage collector and namespace controller). Pure functions over JSON objects.

use serde_json::{Value, json};

use crate::kinds::ResourceDef;
use crate::request::human_duration;

/// `includeObject` of a Table request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncludeObject {
    /// No object.
    None,
    /// PartialObjectMetadata (default).
    Metadata,
    /// The full object.
    Object,
}

impl IncludeObject {
    /// Parses the query value.
    pub fn parse(v: Option<&str>) -> Result<Self, String> {
        match v {
            None | Some("") | Some("Metadata") => Ok(Self::Metadata),
            Some("None") => Ok(Self::None),
            Some("Object") => Ok(Self::Object),
            Some(o) => Err(format!(
                "includeObject must be one of None, Metadata, Object; got {o:?}"
            )),
        }
    }
}

/// PartialObjectMetadata of an object.
pub fn partial(obj: &Value) -> Value {
    json!({"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":obj.get("metadata").cloned().unwrap_or(json!({}))})
}

/// PartialObjectMetadataList of objects.
pub fn partial_list(items: &[Value], list_meta: Value) -> Value {
    json!({"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":list_meta,
        "items":items.iter().map(partial).collect::<Vec<_>>()})
}

/// Table column definitions of a resource.
pub fn columns(def: &ResourceDef) -> Value {
    let mut cols = vec![json!({"name":"Name","type":"string","format":"name",
        "description":"Name must be unique within a namespace.","priority":0})];
    cols.extend(def.columns.iter().map(|c| {
        json!({"name":c.name,"type":c.type_,"format":c.format,"description":c.description,"priority":c.priority})
    }));
    Value::Array(cols)
}

/// One Table row; `now` (Unix seconds) is when the Age column is measured from.
pub fn row(def: &ResourceDef, obj: &Value, include: IncludeObject, now: i64) -> Value {
    let name = obj
        .pointer("/metadata/name")
        .cloned()
        .unwrap_or(Value::Null);
    let mut cells = vec![name];
    for (col, cell) in def.columns.iter().zip((def.cells)(obj)) {
        if col.type_ == "date" {
            let age = cell
                .as_str()
                .and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok())
                .map(|t| human_duration(now - t.timestamp()))
                .unwrap_or_else(|| "<unknown>".into());
            cells.push(Value::String(age));
        } else {
            cells.push(cell);
        }
    }
    let mut r = json!({"cells":cells});
    match include {
        IncludeObject::None => {}
        IncludeObject::Metadata => r["object"] = partial(obj),
        IncludeObject::Object => r["object"] = obj.clone(),
    }
    r
}

/// A Table of `items`; `with_columns` is false for watch events after the first.
pub fn table(
    def: &ResourceDef,
    items: &[Value],
    list_meta: Value,
    include: IncludeObject,
    with_columns: bool,
) -> Value {
    let now = chrono::Utc::now().timestamp();
    json!({"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":list_meta,
        "columnDefinitions": if with_columns { columns(def) } else { json!([]) },
        "rows": items.iter().map(|o| row(def, o, include, now)).collect::<Vec<_>>()})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_table_has_status_and_ready() {
        let def = ResourceDef::by_plural("virtualmachines").unwrap();
        let vm = json!({"metadata":{"name":"vm1","creationTimestamp":"2020-01-01T00:00:00Z"},
            "status":{"printableStatus":"Running","conditions":[{"type":"Ready","status":"True"}]}});
        let t = table(
            def,
            &[vm],
            json!({"resourceVersion":"5"}),
            IncludeObject::Metadata,
            true,
        );
        let cols: Vec<&str> = t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(cols, ["Name", "Age", "Status", "Ready", "Node", "IP"]);
        let cells = &t["rows"][0]["cells"];
        assert_eq!(cells[0], json!("vm1"));
        assert_eq!(cells[2], json!("Running"));
        assert_eq!(cells[3], json!("True"));
        assert_eq!(
            t["rows"][0]["object"]["kind"],
            json!("PartialObjectMetadata")
        );
        assert_eq!(t["metadata"]["resourceVersion"], json!("5"));
    }

    #[test]
    fn vmi_and_vmim_columns() {
        let vmi = ResourceDef::by_plural("virtualmachineinstances").unwrap();
        let cols: Vec<String> = columns(vmi)
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(
            cols,
            [
                "Name",
                "Age",
                "Phase",
                "IP",
                "NodeName",
                "Ready",
                "Live-Migratable",
                "Paused"
            ]
        );
        let vmim = ResourceDef::by_plural("virtualmachineinstancemigrations").unwrap();
        let cols: Vec<String> = columns(vmim)
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(cols, ["Name", "Phase", "VMI", "Age"]);
    }
}
