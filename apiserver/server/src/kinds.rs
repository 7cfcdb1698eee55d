//! The resources this server serves, each described once by a [`ResourceDef`]: names
//! for discovery, typed decoding (pruning unknown fields and reporting them), defaulting,
//! validation, printer columns and selectable fields. Everything here is pure.

use kube::Resource;
use kubevirt_api::validation::{self, FieldError};
use kubevirt_api::{
    VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceMigration, defaults,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// Printer column of a Table.
#[derive(Debug, Clone, Copy)]
pub struct Column {
    /// Header (kubectl upper-cases it).
    pub name: &'static str,
    /// `string`, `date`, `integer`, `boolean`.
    pub type_: &'static str,
    /// `name` for the first column.
    pub format: &'static str,
    /// Description shown by `kubectl get -o wide --show-kind`… and explain.
    pub description: &'static str,
    /// 0 = always shown, 1 = only with `-o wide`.
    pub priority: i32,
}

/// Decodes a JSON object through the typed struct: pruned JSON and unknown-field paths.
pub type DecodeFn = fn(&Value) -> Result<(Value, Vec<String>), Vec<FieldError>>;

/// Everything the server needs to know about one resource.
#[derive(Debug)]
pub struct ResourceDef {
    /// Plural resource name (URL segment).
    pub plural: &'static str,
    /// Singular name.
    pub singular: &'static str,
    /// Kind.
    pub kind: &'static str,
    /// Kind of the list.
    pub list_kind: &'static str,
    /// Short names for kubectl.
    pub short_names: &'static [&'static str],
    /// The resource has a `/status` subresource (status ignored on the main resource).
    pub has_status: bool,
    /// Action subresources under subresources.kubevirt.io.
    pub actions: &'static [&'static str],
    /// Streaming subresources under subresources.kubevirt.io.
    pub streams: &'static [&'static str],
    /// Decodes into the typed object and back: returns the pruned JSON and the paths of
    /// unknown fields, or field errors for values of the wrong type.
    pub decode: DecodeFn,
    /// Applies defaults to a pruned object.
    pub default: fn(&mut Value),
    /// Validates spec and status (metadata is validated generically).
    pub validate: fn(&Value) -> Vec<FieldError>,
    /// Printer columns after NAME.
    pub columns: &'static [Column],
    /// Cells for the columns after NAME (AGE cells hold the creation timestamp).
    pub cells: fn(&Value) -> Vec<Value>,
    /// Field selectors beyond metadata.name/namespace.
    pub selectable: &'static [(&'static str, &'static str)],
}

impl ResourceDef {
    /// All resources of kubevirt.io/v1.
    pub fn all() -> &'static [ResourceDef] {
        &RESOURCES
    }

    /// The resource with this plural name.
    pub fn by_plural(plural: &str) -> Option<&'static ResourceDef> {
        RESOURCES.iter().find(|r| r.plural == plural)
    }

    /// Value of a selectable field of `obj`, if `field` is selectable on this resource.
    pub fn field_value(&self, obj: &Value, field: &str) -> Option<Option<String>> {
        let pointer = match field {
            "metadata.name" => "/metadata/name",
            "metadata.namespace" => "/metadata/namespace",
            other => self
                .selectable
                .iter()
                .find(|(f, _)| *f == other)
                .map(|(_, p)| *p)?,
        };
        Some(obj.pointer(pointer).map(|v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        }))
    }
}

/// Converts a serde_ignored path (`spec.volumes.0.foo`) to Kubernetes' `spec.volumes[0].foo`.
fn kube_path(path: &str) -> String {
    let mut out = String::new();
    for seg in path.split('.').filter(|s| !s.is_empty() && *s != "?") {
        if seg.chars().all(|c| c.is_ascii_digit()) {
            out.push_str(&format!("[{seg}]"));
        } else {
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(seg);
        }
    }
    out
}

/// Turns a serde error at `path` into a Kubernetes field error.
fn field_error(path: &str, err: &serde_json::Error) -> FieldError {
    let text = err.to_string();
    let msg = text.split(" at line ").next().unwrap_or(&text);
    if let Some(rest) = msg.strip_prefix("unknown variant `")
        && let Some((value, expected)) = rest.split_once("`, expected one of ")
    {
        let supported: Vec<&str> = expected.split(", ").map(|s| s.trim_matches('`')).collect();
        return FieldError::not_supported(path, value, &supported);
    }
    if let Some(rest) = msg.strip_prefix("unknown variant `")
        && let Some((value, expected)) = rest.split_once("`, expected `")
    {
        return FieldError::not_supported(path, value, &[expected.trim_end_matches('`')]);
    }
    if let Some(field) = msg.strip_prefix("missing field `") {
        let field = field.trim_end_matches('`');
        let full = if path.is_empty() {
            field.to_string()
        } else {
            format!("{path}.{field}")
        };
        return FieldError::required(full, "");
    }
    FieldError::type_invalid(path, msg)
}

fn decode_typed<T: DeserializeOwned + Serialize>(
    v: &Value,
) -> Result<(T, Vec<String>), Vec<FieldError>> {
    let mut unknown = Vec::new();
    let mut on_unknown = |p: serde_ignored::Path<'_>| unknown.push(kube_path(&p.to_string()));
    let de = serde_ignored::Deserializer::new(v, &mut on_unknown);
    match serde_path_to_error::deserialize::<_, T>(de) {
        // apiVersion and kind are checked against the endpoint before decoding.
        Ok(t) => Ok((
            t,
            unknown
                .into_iter()
                .filter(|u| u != "apiVersion" && u != "kind")
                .collect(),
        )),
        Err(e) => {
            let path = kube_path(&e.path().to_string());
            Err(vec![field_error(&path, e.inner())])
        }
    }
}

fn decode<T: DeserializeOwned + Serialize>(
    v: &Value,
) -> Result<(Value, Vec<String>), Vec<FieldError>> {
    let (t, unknown) = decode_typed::<T>(v)?;
    let pruned =
        serde_json::to_value(&t).map_err(|e| vec![FieldError::type_invalid("", &e.to_string())])?;
    Ok((pruned, unknown))
}

fn with_typed<T: DeserializeOwned + Serialize>(v: &mut Value, f: fn(&mut T)) {
    if let Ok(mut t) = serde_json::from_value::<T>(v.clone()) {
        f(&mut t);
        if let Ok(out) = serde_json::to_value(&t) {
            *v = out;
        }
    }
}

fn validate_with<T: DeserializeOwned>(v: &Value, f: fn(&T) -> Vec<FieldError>) -> Vec<FieldError> {
    match serde_json::from_value::<T>(v.clone()) {
        Ok(t) => f(&t),
        Err(e) => vec![FieldError::type_invalid("", &e.to_string())],
    }
}

fn condition_status(obj: &Value, type_: &str) -> Value {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
        })
        .and_then(|c| c.get("status").cloned())
        .unwrap_or(Value::Null)
}

fn ptr(obj: &Value, p: &str) -> Value {
    obj.pointer(p).cloned().unwrap_or(Value::Null)
}

fn age(obj: &Value) -> Value {
    ptr(obj, "/metadata/creationTimestamp")
}

const AGE: Column = Column {
    name: "Age",
    type_: "date",
    format: "",
    description: "CreationTimestamp is a timestamp representing the server time when this object was created.",
    priority: 0,
};

static RESOURCES: [ResourceDef; 3] = [
    ResourceDef {
        plural: "virtualmachines",
        singular: "virtualmachine",
        kind: "VirtualMachine",
        list_kind: "VirtualMachineList",
        short_names: &["vm", "vms"],
        has_status: true,
        actions: &["start", "stop", "restart", "migrate"],
        // No portforward: it is not served (no pod network path from here), and what is
        // listed here is advertised in discovery and granted by the RBAC roles.
        streams: &[],
        decode: decode::<VirtualMachine>,
        default: |v| with_typed::<VirtualMachine>(v, defaults::default_vm),
        validate: |v| validate_with::<VirtualMachine>(v, validation::validate_vm),
        columns: &[
            AGE,
            Column {
                name: "Status",
                type_: "string",
                format: "",
                description: "Human Readable Status",
                priority: 0,
            },
            Column {
                name: "Ready",
                type_: "string",
                format: "",
                description: "Whether the instance is ready",
                priority: 0,
            },
            Column {
                name: "Node",
                type_: "string",
                format: "",
                description: "Node the instance runs on",
                priority: 1,
            },
            Column {
                name: "IP",
                type_: "string",
                format: "",
                description: "First IP address of the instance",
                priority: 1,
            },
        ],
        // NODE and IP come from the VM's annotations written by the controller, because a
        // VM carries no instance state of its own (KubeVirt cannot show them at all).
        cells: |o| {
            vec![
                age(o),
                ptr(o, "/status/printableStatus"),
                condition_status(o, "Ready"),
                ptr(o, "/metadata/annotations/kubevirt.io~1node-name"),
                ptr(o, "/metadata/annotations/kubevirt.io~1ip-address"),
            ]
        },
        selectable: &[("status.printableStatus", "/status/printableStatus")],
    },
    ResourceDef {
        plural: "virtualmachineinstances",
        singular: "virtualmachineinstance",
        kind: "VirtualMachineInstance",
        list_kind: "VirtualMachineInstanceList",
        short_names: &["vmi", "vmis"],
        has_status: true,
        actions: &["pause", "unpause", "softreboot"],
        streams: &["console", "vnc"],
        decode: decode::<VirtualMachineInstance>,
        default: |v| with_typed::<VirtualMachineInstance>(v, defaults::default_vmi),
        validate: |v| validate_with::<VirtualMachineInstance>(v, validation::validate_vmi),
        columns: &[
            AGE,
            Column {
                name: "Phase",
                type_: "string",
                format: "",
                description: "Phase of the instance",
                priority: 0,
            },
            Column {
                name: "IP",
                type_: "string",
                format: "",
                description: "First IP address",
                priority: 0,
            },
            Column {
                name: "NodeName",
                type_: "string",
                format: "",
                description: "Node the instance runs on",
                priority: 0,
            },
            Column {
                name: "Ready",
                type_: "string",
                format: "",
                description: "Ready condition",
                priority: 0,
            },
            Column {
                name: "Live-Migratable",
                type_: "string",
                format: "",
                description: "LiveMigratable condition",
                priority: 1,
            },
            Column {
                name: "Paused",
                type_: "string",
                format: "",
                description: "Paused condition",
                priority: 1,
            },
        ],
        cells: |o| {
            vec![
                age(o),
                ptr(o, "/status/phase"),
                ptr(o, "/status/interfaces/0/ipAddress"),
                ptr(o, "/status/nodeName"),
                condition_status(o, "Ready"),
                condition_status(o, "LiveMigratable"),
                condition_status(o, "Paused"),
            ]
        },
        selectable: &[
            ("status.phase", "/status/phase"),
            ("status.nodeName", "/status/nodeName"),
        ],
    },
    ResourceDef {
        plural: "virtualmachineinstancemigrations",
        singular: "virtualmachineinstancemigration",
        kind: "VirtualMachineInstanceMigration",
        list_kind: "VirtualMachineInstanceMigrationList",
        short_names: &["vmim", "vmims"],
        has_status: true,
        actions: &[],
        streams: &[],
        decode: decode::<VirtualMachineInstanceMigration>,
        default: |v| with_typed::<VirtualMachineInstanceMigration>(v, defaults::default_migration),
        validate: |v| {
            validate_with::<VirtualMachineInstanceMigration>(v, validation::validate_migration)
        },
        columns: &[
            Column {
                name: "Phase",
                type_: "string",
                format: "",
                description: "Phase of the migration",
                priority: 0,
            },
            Column {
                name: "VMI",
                type_: "string",
                format: "",
                description: "Name of the migrated instance",
                priority: 0,
            },
            AGE,
        ],
        cells: |o| vec![ptr(o, "/status/phase"), ptr(o, "/spec/vmiName"), age(o)],
        selectable: &[
            ("spec.vmiName", "/spec/vmiName"),
            ("status.phase", "/status/phase"),
        ],
    },
];

/// Checks the three kinds agree with their kube `Resource` impls (guards typos above).
pub fn consistency_check() -> bool {
    VirtualMachine::plural(&()) == RESOURCES[0].plural
        && VirtualMachineInstance::plural(&()) == RESOURCES[1].plural
        && VirtualMachineInstanceMigration::plural(&()) == RESOURCES[2].plural
}

/// A placeholder for an empty status, so `status: {}` reads the same as no status.
pub fn empty_status() -> Value {
    json!({})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_match_kube_metadata() {
        assert!(consistency_check());
    }

    #[test]
    fn unknown_fields_are_reported_with_kube_paths() {
        let vm = json!({"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{"name":"a","bogus":1},
            "spec":{"runStrategy":"Always","foo":1,"template":{"spec":{"domain":{"devices":{"disks":[{"name":"d","x":1}]}}}}}});
        let (pruned, unknown) = (RESOURCES[0].decode)(&vm).unwrap();
        assert_eq!(
            unknown,
            vec![
                "metadata.bogus",
                "spec.foo",
                "spec.template.spec.domain.devices.disks[0].x"
            ]
        );
        assert!(pruned.pointer("/spec/foo").is_none());
        assert_eq!(pruned.pointer("/spec/runStrategy"), Some(&json!("Always")));
    }

    #[test]
    fn invalid_enum_is_unsupported_value() {
        let vm = json!({"spec":{"runStrategy":"Sometimes","template":{}}});
        let errs = (RESOURCES[0].decode)(&vm).unwrap_err();
        assert_eq!(errs[0].field, "spec.runStrategy");
        assert!(
            errs[0]
                .message
                .starts_with("Unsupported value: \"Sometimes\": supported values: \"Always\""),
            "{}",
            errs[0].message
        );
    }

    #[test]
    fn wrong_type_names_the_field() {
        let vmi = json!({"spec":{"domain":{"cpu":{"cores":"two"}}}});
        let errs = (RESOURCES[1].decode)(&vmi).unwrap_err();
        assert_eq!(errs[0].field, "spec.domain.cpu.cores");
    }
}
