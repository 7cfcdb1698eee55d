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

pub use kubevirt_api::catalogue::Column;
use kubevirt_api::catalogue::{self, Kind, Subresource};

/// Decodes a JSON object through the typed struct: pruned JSON and unknown-field paths.
pub type DecodeFn = fn(&Value) -> Result<(Value, Vec<String>), Vec<FieldError>>;

/// What the server needs beyond the catalogue entry of one stored kind: typed decoding,
/// defaulting, validation, table cells and selectable fields. Dereferences to the
/// [`Kind`], so names, columns and flags come from the catalogue only.
#[derive(Debug)]
pub struct ResourceDef {
    /// The kind's catalogue entry.
    pub meta: &'static Kind,
    /// Decodes into the typed object and back: returns the pruned JSON and the paths of
    /// unknown fields, or field errors for values of the wrong type.
    pub decode: DecodeFn,
    /// Applies defaults to a pruned object.
    pub default: fn(&mut Value),
    /// Validates spec and status (metadata is validated generically).
    pub validate: fn(&Value) -> Vec<FieldError>,
    /// Cells for the catalogue's columns after NAME (AGE cells hold the creation timestamp).
    pub cells: fn(&Value) -> Vec<Value>,
    /// Field selectors beyond metadata.name/namespace.
    pub selectable: &'static [(&'static str, &'static str)],
}

impl std::ops::Deref for ResourceDef {
    type Target = Kind;

    fn deref(&self) -> &Kind {
        self.meta
    }
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

    /// The subresources of this kind (catalogue).
    pub fn subresources(&self) -> impl Iterator<Item = &'static Subresource> {
        catalogue::subresources_of(self.meta)
    }

    /// Its subresource `name`, if the catalogue has one.
    pub fn subresource(&self, name: &str) -> Option<&'static Subresource> {
        catalogue::subresource(self.meta.plural, name)
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

static RESOURCES: [ResourceDef; 3] = [
    ResourceDef {
        meta: &catalogue::VIRTUAL_MACHINE,
        decode: decode::<VirtualMachine>,
        default: |v| with_typed::<VirtualMachine>(v, defaults::default_vm),
        validate: |v| validate_with::<VirtualMachine>(v, validation::validate_vm),
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
        meta: &catalogue::VIRTUAL_MACHINE_INSTANCE,
        decode: decode::<VirtualMachineInstance>,
        default: |v| with_typed::<VirtualMachineInstance>(v, defaults::default_vmi),
        validate: |v| validate_with::<VirtualMachineInstance>(v, validation::validate_vmi),
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
        meta: &catalogue::VIRTUAL_MACHINE_INSTANCE_MIGRATION,
        decode: decode::<VirtualMachineInstanceMigration>,
        default: |v| with_typed::<VirtualMachineInstanceMigration>(v, defaults::default_migration),
        validate: |v| {
            validate_with::<VirtualMachineInstanceMigration>(v, validation::validate_migration)
        },
        cells: |o| vec![ptr(o, "/status/phase"), ptr(o, "/spec/vmiName"), age(o)],
        selectable: &[
            ("spec.vmiName", "/spec/vmiName"),
            ("status.phase", "/status/phase"),
        ],
    },
];

/// Checks the three kinds agree with their kube `Resource` impls and are exactly the
/// catalogue's stored kinds in its order (a kind added to the catalogue without its
/// definition here fails).
pub fn consistency_check() -> bool {
    RESOURCES.len() == catalogue::STORED.len()
        && VirtualMachine::plural(&()) == RESOURCES[0].plural
        && VirtualMachineInstance::plural(&()) == RESOURCES[1].plural
        && VirtualMachineInstanceMigration::plural(&()) == RESOURCES[2].plural
        && RESOURCES
            .iter()
            .zip(catalogue::STORED)
            .all(|(r, k)| r.meta == k)
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
    fn every_catalogue_column_has_a_cell() {
        for r in ResourceDef::all() {
            assert_eq!((r.cells)(&json!({})).len(), r.columns.len(), "{}", r.plural);
        }
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
