//! One strategy per kind, registered once ([`ALL`]): everything the API server, OpenAPI,
//! discovery, the operator's roles and the plugin need to know about a kind — its names,
//! scope and columns (the [`Kind`] of the catalogue), its typed decoding, defaulting,
//! validation, admission rules, table cells, selectable fields and schema. Like
//! k8s.io/apiserver's `RESTStrategy` per resource: the REST logic is written once for all
//! kinds and asks the strategy at each step, so nothing else names a kind.
//!
//! Adding a kind is one file here (its `KIND` and `STRATEGY`) and one line in [`ALL`]
//! (docs/architecture.md, "How to add a kind").

use schemars::generate::{SchemaGenerator, SchemaSettings};
use schemars::{JsonSchema, Schema};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::catalogue::{Kind, Subresource};
use crate::policy::{Actor, FeatureGates};
use crate::validation::FieldError;

pub mod cdi_config;
pub mod cluster_instancetype;
pub mod cluster_preference;
pub mod datavolume;
pub mod instancetype;
pub mod kubevirt;
pub mod pool;
pub mod preference;
pub mod replicaset;
pub mod upload_token;
pub mod vm;
pub mod vmi;
pub mod vmim;

/// Every kind, in the order discovery, OpenAPI and backups list them. The one registration
/// line of a new kind.
pub static ALL: &[&KindStrategy] = &[
    &vm::STRATEGY,
    &vmi::STRATEGY,
    &vmim::STRATEGY,
    &kubevirt::STRATEGY,
    &instancetype::STRATEGY,
    &cluster_instancetype::STRATEGY,
    &preference::STRATEGY,
    &cluster_preference::STRATEGY,
    &datavolume::STRATEGY,
    &cdi_config::STRATEGY,
    &replicaset::STRATEGY,
    &pool::STRATEGY,
    &upload_token::STRATEGY,
];

/// Decodes a JSON object through the typed struct: the pruned JSON and the paths of unknown
/// fields, or field errors for values of the wrong type.
pub type DecodeFn = fn(&Value) -> Result<(Value, Vec<String>), Vec<FieldError>>;

/// What the input policy is asked about one write.
#[derive(Debug)]
pub struct Admission<'a> {
    /// The object before (None on create).
    pub old: Option<&'a Value>,
    /// The object to store.
    pub new: &'a Value,
    /// Who writes.
    pub actor: &'a Actor,
    /// The enforced feature gates.
    pub gates: &'a FeatureGates,
    /// The objects the kind's [`KindStrategy::references`] named, as read for this write;
    /// `None` when they were not read (then rules needing them are not checked).
    pub found: Option<&'a [Found]>,
}

/// What a [`Reference`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// An object of one of our kinds (virt-apiserver's etcd).
    Kind(&'static KindStrategy),
    /// A PersistentVolumeClaim (kube-apiserver), read for its labels.
    Claim,
}

/// An object whose content another kind's admission needs (the instance type a VM names,
/// the claim it infers one from).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// What it is.
    pub target: Target,
    /// Its namespace (empty for a cluster-scoped kind).
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// A [`Reference`] and the object it names, if it exists.
#[derive(Debug, Clone)]
pub struct Found {
    /// What was looked up.
    pub reference: Reference,
    /// The stored object.
    pub object: Option<Value>,
}

impl Reference {
    /// The kind it names, when it is one of ours.
    pub fn kind(&self) -> Option<&'static KindStrategy> {
        match self.target {
            Target::Kind(k) => Some(k),
            Target::Claim => None,
        }
    }
}

/// A kind that needs no other object.
pub fn no_references(_: &Value) -> Vec<Reference> {
    Vec::new()
}

/// A kind that infers nothing from other objects.
pub fn resolve_nothing(_: &mut Value, _: &[Found]) -> Vec<FieldError> {
    Vec::new()
}

/// The schema of a kind's `spec` and `status`, for OpenAPI (and through it `kubectl
/// explain` and server-side apply's list semantics).
#[derive(Debug)]
pub struct Schemas {
    /// `spec`'s type.
    pub spec: fn(SchemaSettings) -> Schema,
    /// `status`'s type; `None` for kinds without status.
    pub status: Option<fn(SchemaSettings) -> Schema>,
    /// Whether `spec` is required.
    pub spec_required: bool,
    /// Spec of the `example` on the create request in OpenAPI: a minimal object the
    /// server creates as sent; `None` when the server's validation is not ours to promise.
    pub example_spec: Option<fn() -> Value>,
}

/// A kind's strategy. Dereferences to its [`Kind`], so names, columns and flags come from
/// the catalogue entry only.
#[derive(Debug)]
pub struct KindStrategy {
    /// The catalogue entry.
    pub meta: &'static Kind,
    /// Stored in virt-apiserver's etcd (not: `kubevirts`, forwarded to its CRD).
    pub stored: bool,
    /// Typed decoding (prunes unknown fields and reports them).
    pub decode: DecodeFn,
    /// Applies defaults to a pruned object.
    pub default: fn(&mut Value),
    /// Validates spec and status (metadata is validated generically).
    pub validate: fn(&Value) -> Vec<FieldError>,
    /// The input policy of a write (KubeVirt's admission webhooks): who may write what.
    pub admit: fn(&Admission<'_>) -> Vec<FieldError>,
    /// The objects `admit` (and `resolve`) need to see: the server reads them first.
    pub references: fn(&Value) -> Vec<Reference>,
    /// Fills in what the object infers from the objects `references` named (KubeVirt's
    /// mutating webhook: a VM's instance type named by its claim's label), on create before
    /// admission; the server then reads the references again. Errors refuse the write.
    pub resolve: fn(&mut Value, &[Found]) -> Vec<FieldError>,
    /// virt-handler writes objects of this kind (only on its own node); it writes no
    /// other kind.
    pub handler_writes: bool,
    /// Cells for the catalogue's columns after NAME (AGE cells hold the creation timestamp).
    pub cells: fn(&Value) -> Vec<Value>,
    /// Field selectors beyond metadata.name/namespace, with their JSON pointers.
    pub selectable: &'static [(&'static str, &'static str)],
    /// OpenAPI schemas.
    pub schemas: Schemas,
}

impl std::ops::Deref for KindStrategy {
    type Target = Kind;

    fn deref(&self) -> &Kind {
        self.meta
    }
}

/// Compared by their kind (function pointers have no reliable address to compare).
impl PartialEq for KindStrategy {
    fn eq(&self, other: &Self) -> bool {
        self.meta == other.meta
    }
}

impl Eq for KindStrategy {}

impl KindStrategy {
    /// Every kind stored in virt-apiserver's etcd, in [`ALL`]'s order.
    pub fn stored() -> impl Iterator<Item = &'static KindStrategy> + Clone {
        ALL.iter().copied().filter(|s| s.stored)
    }

    /// The stored kind with this plural name (plural names are unique across our groups).
    pub fn by_plural(plural: &str) -> Option<&'static KindStrategy> {
        Self::stored().find(|s| s.plural == plural)
    }

    /// The stored kind served at `group`/`version` as `plural`.
    pub fn by_resource(group: &str, version: &str, plural: &str) -> Option<&'static KindStrategy> {
        Self::stored().find(|s| s.group == group && s.version == version && s.plural == plural)
    }

    /// The create-only kind ([`Kind::create_only`]) served at `group`/`version` as `plural`.
    pub fn create_only_kind(
        group: &str,
        version: &str,
        plural: &str,
    ) -> Option<&'static KindStrategy> {
        ALL.iter().copied().find(|s| {
            s.create_only && s.group == group && s.version == version && s.plural == plural
        })
    }

    /// The strategy of kind `kind` (stored or not).
    pub fn by_kind(kind: &str) -> Option<&'static KindStrategy> {
        ALL.iter().copied().find(|s| s.meta.kind == kind)
    }

    /// The subresources of this kind (catalogue).
    pub fn subresources(&self) -> impl Iterator<Item = &'static Subresource> + use<> {
        crate::catalogue::subresources_of(self.meta)
    }

    /// Its subresource `name`, if the catalogue has one.
    pub fn subresource(&self, name: &str) -> Option<&'static Subresource> {
        crate::catalogue::subresource(self.meta.plural, name)
    }

    /// Value of a selectable field of `obj`, if `field` is selectable on this kind.
    pub fn field_value(&self, obj: &Value, field: &str) -> Option<Option<String>> {
        let pointer = match field {
            "metadata.name" => "/metadata/name",
            "metadata.namespace" if self.namespaced => "/metadata/namespace",
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

/// The schema of `T` as a root schema with these settings (OpenAPI rewrites it).
pub fn schema_of<T: JsonSchema>(settings: SchemaSettings) -> Schema {
    SchemaGenerator::new(settings).into_root_schema_for::<T>()
}

/// Admission of a kind with no rules of its own.
pub fn admit_anything(_: &Admission<'_>) -> Vec<FieldError> {
    Vec::new()
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
        // Two variants read "expected `a` or `b`".
        let supported: Vec<&str> = expected.trim_end_matches('`').split("` or `").collect();
        return FieldError::not_supported(path, value, &supported);
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

/// [`DecodeFn`] of the kind whose type is `T`.
pub fn decode<T: DeserializeOwned + Serialize>(
    v: &Value,
) -> Result<(Value, Vec<String>), Vec<FieldError>> {
    let (t, unknown) = decode_typed::<T>(v)?;
    let pruned =
        serde_json::to_value(&t).map_err(|e| vec![FieldError::type_invalid("", &e.to_string())])?;
    Ok((pruned, unknown))
}

/// Runs a typed defaulting function on a JSON object (left alone if it does not decode:
/// validation reports that).
pub fn with_typed<T: DeserializeOwned + Serialize>(v: &mut Value, f: fn(&mut T)) {
    if let Ok(mut t) = serde_json::from_value::<T>(v.clone()) {
        f(&mut t);
        if let Ok(out) = serde_json::to_value(&t) {
            *v = out;
        }
    }
}

/// Runs a typed validation function on a JSON object.
pub fn validate_with<T: DeserializeOwned>(
    v: &Value,
    f: fn(&T) -> Vec<FieldError>,
) -> Vec<FieldError> {
    match serde_json::from_value::<T>(v.clone()) {
        Ok(t) => f(&t),
        Err(e) => vec![FieldError::type_invalid("", &e.to_string())],
    }
}

/// The status of condition `type_` of `obj` (a Table cell), null without it.
pub fn condition_status(obj: &Value, type_: &str) -> Value {
    obj.pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
        })
        .and_then(|c| c.get("status").cloned())
        .unwrap_or(Value::Null)
}

/// The value at JSON pointer `p` (a Table cell), null without it.
pub fn ptr(obj: &Value, p: &str) -> Value {
    obj.pointer(p).cloned().unwrap_or(Value::Null)
}

/// The AGE cell: the creation timestamp (the client shows the age).
pub fn age(obj: &Value) -> Value {
    ptr(obj, "/metadata/creationTimestamp")
}

/// The cells of a kind whose only column is AGE.
pub fn age_only(obj: &Value) -> Vec<Value> {
    vec![age(obj)]
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn every_catalogue_column_has_a_cell() {
        for s in ALL {
            assert_eq!((s.cells)(&json!({})).len(), s.columns.len(), "{}", s.plural);
        }
    }

    #[test]
    fn names_are_unique_and_lookups_find_each_kind() {
        for (i, a) in ALL.iter().enumerate() {
            for b in &ALL[i + 1..] {
                assert_ne!(a.kind, b.kind);
                assert_ne!(a.plural, b.plural);
                for short in a.short_names {
                    assert!(!b.short_names.contains(short), "{short} twice");
                }
            }
            assert_eq!(KindStrategy::by_kind(a.kind), Some(*a));
            if a.stored {
                assert_eq!(KindStrategy::by_plural(a.plural), Some(*a));
                assert_eq!(
                    KindStrategy::by_resource(a.group, a.version, a.plural),
                    Some(*a)
                );
            }
        }
        assert_eq!(
            KindStrategy::by_resource("kubevirt.io", "v1beta1", "virtualmachines"),
            None
        );
    }

    #[test]
    fn unknown_fields_are_reported_with_kube_paths() {
        let vm = json!({"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine","metadata":{"name":"a","bogus":1},
            "spec":{"runStrategy":"Always","foo":1,"template":{"spec":{"domain":{"devices":{"disks":[{"name":"d","x":1}]}}}}}});
        let (pruned, unknown) = (vm::STRATEGY.decode)(&vm).unwrap();
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
        let errs = (vm::STRATEGY.decode)(&vm).unwrap_err();
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
        let errs = (vmi::STRATEGY.decode)(&vmi).unwrap_err();
        assert_eq!(errs[0].field, "spec.domain.cpu.cores");
    }
}
