//! OpenAPI v2 and v3 documents for `kubevirt.io/v1` and `subresources.kubevirt.io/v1` (§6).
//!
//! Kind schemas come from the schemars derives of `kubevirt-api`, generated inline (one
//! self-contained schema per kind, the way kube-apiserver publishes CRD schemas) and then
//! rewritten from JSON Schema 2020-12 into the OpenAPI subset kubectl and structural-schema
//! consumers understand: no `anyOf`/`oneOf` for optionals and enums, `nullable` instead of
//! `"null"` types. Only `metadata` stays a `$ref`, to the shared
//! `io.k8s.apimachinery.pkg.apis.meta.v1.*` definitions, so the aggregator can deduplicate
//! them against kube-apiserver's own.
//!
//! Everything is built deterministically, so a hash computed once at start-up is a valid
//! ETag for the life of the process.

use std::collections::BTreeMap;

use k8s_openapi::api::autoscaling::v1::Scale;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    DeleteOptions, ListMeta, ObjectMeta, Patch, Status, WatchEvent,
};
use schemars::generate::{SchemaGenerator, SchemaSettings};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha512};

use kubevirt_api::catalogue::{self, Style};
use kubevirt_api::kinds::{self, KindStrategy};

/// Group of the core kinds.
pub const GROUP: &str = kubevirt_api::GROUP;
/// Group of the action and streaming subresources.
pub const SUBRESOURCES_GROUP: &str = kubevirt_api::SUBRESOURCES_GROUP;
/// The only version served.
pub const VERSION: &str = kubevirt_api::VERSION;
/// Key of the kinds' document in the v3 root (`/openapi/v3/<key>`).
pub const V3_KUBEVIRT: &str = "apis/kubevirt.io/v1";
/// Key of the instance types' and preferences' document in the v3 root.
pub const V3_INSTANCETYPE: &str = "apis/instancetype.kubevirt.io/v1beta1";
/// The group-version document of CDI's kinds (DataVolume).
pub const V3_CDI: &str = "apis/cdi.kubevirt.io/v1beta1";
/// The group-version document of VM pools.
pub const V3_POOL: &str = "apis/pool.kubevirt.io/v1beta1";
/// Key of the subresources' document in the v3 root.
pub const V3_SUBRESOURCES: &str = "apis/subresources.kubevirt.io/v1";
/// Every group-version document this server publishes (`apis/<group>/<version>`): each
/// group of our kinds, then the subresources'.
pub fn v3_group_versions() -> Vec<String> {
    catalogue::kind_groups()
        .into_iter()
        .map(|(g, v)| format!("apis/{g}/{v}"))
        .chain([V3_SUBRESOURCES.to_string()])
        .collect()
}

/// Prefix of the definition names of the core kinds.
pub const KIND_PREFIX: &str = "io.kubevirt.v1.";

/// Prefix of the definition names of a kind: the reverse DNS of its group and its version, as
/// kube-apiserver names CRD schemas (`io.kubevirt.v1.`, `io.kubevirt.instancetype.v1beta1.`).
fn kind_prefix(k: &KindStrategy) -> String {
    let mut parts: Vec<&str> = k.group.split('.').collect();
    parts.reverse();
    format!("{}.{}.", parts.join("."), k.version)
}
const SUBRESOURCE_PREFIX: &str = "io.kubevirt.subresources.v1.";
const META_PREFIX: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.";
/// The `autoscaling/v1` Scale every `/scale` subresource reads and writes, under
/// kube-apiserver's own definition name (the aggregator deduplicates it against its own).
const SCALE_DEF: &str = "io.k8s.api.autoscaling.v1.Scale";

/// Which OpenAPI dialect a fragment is rendered for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Flavor {
    V2,
    V3,
}

impl Flavor {
    fn reference(self, name: &str) -> Value {
        match self {
            Flavor::V2 => json!({ "$ref": format!("#/definitions/{name}") }),
            Flavor::V3 => json!({ "$ref": format!("#/components/schemas/{name}") }),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Public API
// ---------------------------------------------------------------------------------------

/// The swagger 2.0 document for `GET /openapi/v2`: paths and definitions of both groups.
pub fn openapi_v2() -> Value {
    let mut paths = Map::new();
    let mut definitions = BTreeMap::new();
    add_kind_paths(&mut paths, Flavor::V2, |_| true);
    add_subresource_paths(&mut paths, Flavor::V2);
    for (name, schema) in kind_definitions(|_| true) {
        definitions.insert(name, to_v2(schema));
    }
    for (name, schema) in subresource_definitions() {
        definitions.insert(name, to_v2(schema));
    }
    for (name, schema) in meta_definitions(kinds::ALL.iter().any(|k| k.has_scale)) {
        definitions.insert(name, to_v2(schema));
    }
    json!({
        "swagger": "2.0",
        "info": { "title": "KubeVirt", "version": VERSION },
        "paths": sorted(paths),
        "definitions": definitions.into_iter().collect::<Map<_, _>>(),
    })
}

/// The OpenAPI 3.0 document for one group-version, `key` being `apis/kubevirt.io/v1` or
/// `apis/subresources.kubevirt.io/v1` (a bare group name is accepted too). `None` for
/// anything else, which the server answers with 404.
pub fn openapi_v3_group_version(key: &str) -> Option<Value> {
    let mut paths = Map::new();
    let mut schemas = BTreeMap::new();
    let key = key.trim_matches('/');
    let group = catalogue::kind_groups()
        .into_iter()
        .find(|(g, v)| key == format!("apis/{g}/{v}") || key == *g);
    match (key, group) {
        (V3_SUBRESOURCES | SUBRESOURCES_GROUP, _) => {
            add_subresource_paths(&mut paths, Flavor::V3);
            schemas.extend(subresource_definitions());
        }
        (_, Some((group, version))) => {
            let in_group = |k: &&KindStrategy| k.group == group && k.version == version;
            add_kind_paths(&mut paths, Flavor::V3, in_group);
            schemas.extend(kind_definitions(in_group));
            let scale = kinds::ALL
                .iter()
                .copied()
                .filter(in_group)
                .any(|k| k.has_scale);
            schemas.extend(meta_definitions(scale));
        }
        _ => return None,
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": { "title": "KubeVirt", "version": VERSION },
        "paths": sorted(paths),
        "components": {
            "schemas": schemas.into_iter().collect::<Map<_, _>>(),
            "securitySchemes": {
                "BearerToken": {
                    "type": "apiKey",
                    "name": "authorization",
                    "in": "header",
                    "description": "Bearer token authentication"
                }
            }
        },
    }))
}

/// The `GET /openapi/v3` root: for each `(key, hash)` pair a `serverRelativeURL` carrying
/// the document's hash, so clients can cache the documents immutably.
pub fn openapi_v3_root(hashes: &[(&str, &str)]) -> Value {
    let paths: Map<String, Value> = hashes
        .iter()
        .map(|(key, hash)| {
            (
                (*key).to_string(),
                json!({ "serverRelativeURL": format!("/openapi/v3/{key}?hash={hash}") }),
            )
        })
        .collect();
    json!({ "paths": paths })
}

/// Upper-case hex SHA-512 of a document's compact JSON form: the `hash` query value of
/// the v3 root and a suitable (to be quoted) ETag.
pub fn document_hash(doc: &Value) -> String {
    let bytes = serde_json::to_vec(doc).unwrap_or_default();
    hex::encode_upper(Sha512::digest(&bytes))
}

/// All documents, serialized once, with their hashes; what the server keeps in memory.
#[derive(Debug, Clone)]
pub struct OpenApiDocuments {
    /// `/openapi/v2` body.
    pub v2: Vec<u8>,
    /// Hash of `v2`.
    pub v2_hash: String,
    /// `/openapi/v3` body.
    pub v3_root: Vec<u8>,
    /// Hash of `v3_root`.
    pub v3_root_hash: String,
    /// `/openapi/v3/<key>` bodies and their hashes, keyed like [`v3_group_versions`].
    pub v3: BTreeMap<String, (Vec<u8>, String)>,
}

impl OpenApiDocuments {
    /// Builds and serializes every document.
    pub fn build() -> Self {
        let v2_doc = openapi_v2();
        let mut v3 = BTreeMap::new();
        for key in v3_group_versions() {
            if let Some(doc) = openapi_v3_group_version(&key) {
                let hash = document_hash(&doc);
                v3.insert(
                    key.to_string(),
                    (serde_json::to_vec(&doc).unwrap_or_default(), hash),
                );
            }
        }
        let pairs: Vec<(&str, &str)> = v3
            .iter()
            .map(|(k, (_, h))| (k.as_str(), h.as_str()))
            .collect();
        let root = openapi_v3_root(&pairs);
        Self {
            v2_hash: document_hash(&v2_doc),
            v2: serde_json::to_vec(&v2_doc).unwrap_or_default(),
            v3_root_hash: document_hash(&root),
            v3_root: serde_json::to_vec(&root).unwrap_or_default(),
            v3,
        }
    }
}

/// The v3 (OpenAPI 3.0 flavoured) schema of one of our kinds, e.g. `VirtualMachine`, with
/// `metadata` as a `$ref`. Server-side apply derives list semantics from it.
pub fn kind_schema(kind: &str) -> Option<Value> {
    KindStrategy::by_kind(kind).map(build_kind_schema)
}

// ---------------------------------------------------------------------------------------
// Kinds (each from its strategy, `kubevirt_api::kinds`)
// ---------------------------------------------------------------------------------------

/// The `example` of a kind's create request: a minimal object the server creates as sent,
/// so an OpenAPI reader (and a generator such as schemathesis, which mixes examples into
/// what it sends) starts from a valid object rather than from the schema alone, which cannot
/// say that names are DNS subdomains or that a guest needs memory. `generateName`, so that
/// sending the example twice creates two objects instead of a conflict.
fn create_example(k: &KindStrategy) -> Option<Value> {
    let spec = (k.schemas.example_spec?)();
    // The short name (`vm`, `vmi`, `vmim`), as people name examples.
    let short = k.short_names.first().copied().unwrap_or(k.singular);
    let prefix = format!("example-{short}-");
    Some(json!({
        "apiVersion": k.api_version(),
        "kind": k.kind,
        "metadata": { "generateName": prefix },
        "spec": spec,
    }))
}

const API_VERSION_DESC: &str = "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources";
const KIND_DESC: &str = "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds";
const OBJECT_META_DESC: &str = "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";
const LIST_META_DESC: &str = "Standard list metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds";

fn gvk(group: &str, kind: &str) -> Value {
    gvk_at(group, VERSION, kind)
}

fn gvk_at(group: &str, version: &str, kind: &str) -> Value {
    json!({ "group": group, "kind": kind, "version": version })
}

fn meta_ref(name: &str, description: &str) -> Value {
    json!({
        "allOf": [Flavor::V3.reference(&format!("{META_PREFIX}{name}"))],
        "default": {},
        "description": description,
    })
}

fn build_kind_schema(k: &KindStrategy) -> Value {
    let kind = k.kind;
    let mut spec = inline_schema(k.schemas.spec);
    set_description(&mut spec, &format!("Desired state of the {kind}."));
    let mut properties = json!({
        "apiVersion": { "description": API_VERSION_DESC, "type": "string" },
        "kind": { "description": KIND_DESC, "type": "string" },
        "metadata": meta_ref("ObjectMeta", OBJECT_META_DESC),
        "spec": spec,
    });
    if let Some(status) = k.schemas.status {
        let mut status = inline_schema(status);
        set_description(&mut status, &format!("Observed state of the {kind}."));
        properties["status"] = status;
    }
    let mut schema = json!({
        "description": k.description,
        "type": "object",
        "properties": properties,
        "x-kubernetes-group-version-kind": [gvk_at(k.group, k.version, kind)],
    });
    if k.schemas.spec_required
        && let Some(m) = schema.as_object_mut()
    {
        m.insert("required".into(), json!(["spec"]));
    }
    schema
}

fn build_list_schema(k: &KindStrategy) -> Value {
    let kind = k.kind;
    json!({
        "description": format!("{kind}List is a list of {kind}."),
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": { "description": API_VERSION_DESC, "type": "string" },
            "items": {
                "description": format!("List of {}.", k.plural),
                "type": "array",
                "items": Flavor::V3.reference(&format!("{}{kind}", kind_prefix(k))),
            },
            "kind": { "description": KIND_DESC, "type": "string" },
            "metadata": meta_ref("ListMeta", LIST_META_DESC),
        },
        "x-kubernetes-group-version-kind": [gvk_at(k.group, k.version, k.list_kind)],
    })
}

/// Kind and list schemas in v3 form, of the kinds `pick` chooses.
fn kind_definitions(pick: impl Fn(&&KindStrategy) -> bool) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for k in kinds::ALL.iter().copied().filter(pick) {
        let prefix = kind_prefix(k);
        out.insert(format!("{prefix}{}", k.kind), build_kind_schema(k));
        out.insert(format!("{prefix}{}", k.list_kind), build_list_schema(k));
    }
    out
}

/// The shared meta types, generated from k8s-openapi (which is generated from
/// kube-apiserver's own spec) so the content matches what the aggregator already has; with
/// `scale`, also `autoscaling/v1` Scale (and its spec and status), for a document that has
/// `/scale` paths.
fn meta_definitions(scale: bool) -> BTreeMap<String, Value> {
    let mut settings = SchemaSettings::openapi3();
    settings.meta_schema = None;
    let mut generator = SchemaGenerator::new(settings);
    generator.subschema_for::<ObjectMeta>();
    generator.subschema_for::<ListMeta>();
    generator.subschema_for::<Status>();
    generator.subschema_for::<DeleteOptions>();
    generator.subschema_for::<WatchEvent<Value>>();
    generator.subschema_for::<Patch>();
    if scale {
        generator.subschema_for::<Scale>();
    }
    generator
        .take_definitions(true)
        .into_iter()
        .map(|(name, mut schema)| {
            normalize(&mut schema);
            strip_markers(&mut schema);
            nullable_optionals(&mut schema);
            (name, schema)
        })
        .collect()
}

/// Marks every optional property of a meta type `nullable`: Kubernetes decodes JSON `null`
/// for an optional field as "not set" (kube-apiserver accepts `"propagationPolicy": null` in
/// a DeleteOptions, and so must we, for its clients), which kube-apiserver's own schemas, and
/// k8s-openapi's after them, do not say. Only v3 keeps it (swagger 2.0 has no `nullable`);
/// a `$ref` property is left alone, as siblings of a `$ref` are ignored in OpenAPI 3.0.
fn nullable_optionals(schema: &mut Value) {
    let required: Vec<String> = schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r.as_str().map(str::to_string))
        .collect();
    let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) else {
        return;
    };
    for (name, prop) in props.iter_mut() {
        if let Some(m) = prop.as_object_mut()
            && !required.contains(name)
            && !m.contains_key("$ref")
        {
            m.insert("nullable".into(), Value::Bool(true));
        }
    }
}

fn set_description(schema: &mut Value, description: &str) {
    if let Some(m) = schema.as_object_mut() {
        // Keep the type's own doc comment when it has one; it says more than our default.
        m.entry("description")
            .or_insert_with(|| Value::String(description.to_string()));
    }
}

/// A type's schema (`kubevirt_api::kinds::schema_of::<T>`) with every subschema inlined and
/// rewritten to OpenAPI 3.0 (see module docs).
fn inline_schema(schema: fn(SchemaSettings) -> schemars::Schema) -> Value {
    let mut settings = SchemaSettings::openapi3();
    settings.inline_subschemas = true;
    settings.meta_schema = None;
    let mut v = schema(settings).to_value();
    if let Some(m) = v.as_object_mut() {
        m.remove("$schema");
        m.remove("components");
        m.remove("definitions");
    }
    normalize(&mut v);
    strip_markers(&mut v);
    v
}

// ---------------------------------------------------------------------------------------
// JSON Schema → OpenAPI rewriting
// ---------------------------------------------------------------------------------------

/// Private marker carrying an enum's "Possible enum values" text up to the field that
/// uses the enum, whose own description otherwise replaces the enum type's.
const ENUM_DOC: &str = "x-virt-enum-doc";

fn for_each_subschema(m: &mut Map<String, Value>, f: &mut dyn FnMut(&mut Value)) {
    for key in ["properties", "patternProperties"] {
        if let Some(Value::Object(props)) = m.get_mut(key) {
            props.values_mut().for_each(&mut *f);
        }
    }
    for key in ["items", "additionalProperties", "not"] {
        match m.get_mut(key) {
            Some(Value::Array(a)) => a.iter_mut().for_each(&mut *f),
            Some(v @ Value::Object(_)) => f(v),
            _ => {}
        }
    }
    for key in ["allOf", "anyOf", "oneOf"] {
        if let Some(Value::Array(a)) = m.get_mut(key) {
            a.iter_mut().for_each(&mut *f);
        }
    }
}

fn is_null_schema(v: &Value) -> bool {
    v.get("type").and_then(Value::as_str) == Some("null")
        || v.get("enum") == Some(&json!([null]))
        || v.get("const") == Some(&Value::Null)
}

/// Merges `branch` into `parent`; the parent's keys win, because they describe the field
/// while the branch describes the field's type.
fn merge_into(parent: &mut Map<String, Value>, branch: Value) {
    let Value::Object(branch) = branch else {
        return;
    };
    let enum_doc = branch
        .get(ENUM_DOC)
        .and_then(Value::as_str)
        .map(str::to_string);
    let parent_had_description = parent.contains_key("description");
    for (k, v) in branch {
        parent.entry(k).or_insert(v);
    }
    if parent_had_description
        && let Some(doc) = enum_doc
        && let Some(Value::String(d)) = parent.get_mut("description")
        && !d.contains(&doc)
    {
        d.push_str(&doc);
    }
}

fn normalize(v: &mut Value) {
    let Value::Object(m) = v else {
        return;
    };
    for_each_subschema(m, &mut normalize);

    // Repeat: hoisting a branch can expose another construct to rewrite.
    for _ in 0..8 {
        let mut changed = false;

        if let Some(Value::Array(types)) = m.get("type").cloned() {
            let non_null: Vec<Value> = types
                .iter()
                .filter(|t| t.as_str() != Some("null"))
                .cloned()
                .collect();
            if non_null.len() < types.len() {
                m.insert("nullable".into(), Value::Bool(true));
            }
            match non_null.as_slice() {
                [single] => {
                    m.insert("type".into(), single.clone());
                }
                _ => {
                    m.remove("type");
                }
            }
            changed = true;
        }

        if let Some(c) = m.remove("const") {
            m.insert("enum".into(), json!([c]));
            changed = true;
        }

        for key in ["anyOf", "oneOf"] {
            let Some(Value::Array(branches)) = m.get(key).cloned() else {
                continue;
            };
            let (nulls, rest): (Vec<Value>, Vec<Value>) =
                branches.into_iter().partition(is_null_schema);
            if !nulls.is_empty() {
                m.insert("nullable".into(), Value::Bool(true));
            }
            if rest.len() == 1 {
                m.remove(key);
                rest.into_iter().for_each(|b| merge_into(m, b));
                changed = true;
            } else if !rest.is_empty() && rest.iter().all(is_string_enum) {
                m.remove(key);
                merge_string_enums(m, rest);
                changed = true;
            } else if !rest.is_empty() && rest.iter().all(is_object_or_string_enum) {
                // Externally tagged enums: one object branch per data-carrying variant.
                // A structural schema cannot say "exactly one of", so, like CRDs generated
                // by kube, list every variant's property and leave the choice to validation.
                m.remove(key);
                hoist_variants(m, rest);
                changed = true;
            } else if nulls.is_empty() {
                // Nothing to do (or nothing we can express); leave as is.
            } else {
                m.insert(key.into(), Value::Array(rest));
                changed = true;
            }
        }

        if let Some(Value::Array(all)) = m.get("allOf")
            && all.len() == 1
            && all[0].get("$ref").is_none()
        {
            if let Some(Value::Array(mut all)) = m.remove("allOf") {
                merge_into(m, all.remove(0));
            }
            changed = true;
        }

        if !changed {
            break;
        }
    }

    m.remove("$schema");
    m.remove("title");
    m.remove("uniqueItems");
    m.remove("examples");
    if m.get("default") == Some(&Value::Null) {
        m.remove("default");
    }
    match m.get("additionalProperties") {
        Some(Value::Bool(false)) => {
            m.remove("additionalProperties");
        }
        Some(Value::Bool(true)) if m.contains_key("properties") => {
            m.remove("additionalProperties");
            m.insert(
                "x-kubernetes-preserve-unknown-fields".into(),
                Value::Bool(true),
            );
        }
        _ => {}
    }
    // Kubernetes clients know only int32 and int64; unsigned formats become the signed
    // format wide enough to hold them (schemars already adds `minimum: 0`).
    if let Some(Value::String(f)) = m.get("format") {
        let mapped = match f.as_str() {
            "uint8" | "uint16" | "int8" | "int16" => Some("int32"),
            "uint32" | "uint64" | "uint" | "int" => Some("int64"),
            _ => None,
        };
        if let Some(mapped) = mapped {
            m.insert("format".into(), Value::String(mapped.into()));
        }
    }
}

fn is_string_enum(v: &Value) -> bool {
    v.get("enum")
        .and_then(Value::as_array)
        .is_some_and(|e| !e.is_empty() && e.iter().all(Value::is_string))
        && v.get("properties").is_none()
}

fn is_object_or_string_enum(v: &Value) -> bool {
    is_string_enum(v) || v.get("properties").is_some()
}

fn merge_string_enums(m: &mut Map<String, Value>, branches: Vec<Value>) {
    let mut values = Vec::new();
    let mut doc = String::new();
    for b in &branches {
        let Some(e) = b.get("enum").and_then(Value::as_array) else {
            continue;
        };
        for value in e {
            if values.contains(value) {
                continue;
            }
            values.push(value.clone());
            if let (Some(s), Some(d)) =
                (value.as_str(), b.get("description").and_then(Value::as_str))
            {
                doc.push_str(&format!("\n - `{s:?}` {d}"));
            }
        }
    }
    m.insert("type".into(), Value::String("string".into()));
    m.insert("enum".into(), Value::Array(values));
    if !doc.is_empty() {
        let doc = format!("\n\nPossible enum values:{doc}");
        if let Some(Value::String(d)) = m.get_mut("description") {
            d.push_str(&doc);
        } else {
            m.insert("description".into(), Value::String(doc.trim().to_string()));
        }
        m.insert(ENUM_DOC.into(), Value::String(doc));
    }
}

fn hoist_variants(m: &mut Map<String, Value>, branches: Vec<Value>) {
    let mut props = match m.remove("properties") {
        Some(Value::Object(p)) => p,
        _ => Map::new(),
    };
    for b in branches {
        if let Some(Value::Object(p)) = b.get("properties") {
            for (k, v) in p {
                props.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
    }
    m.insert("type".into(), Value::String("object".into()));
    m.insert("properties".into(), Value::Object(props));
}

fn strip_markers(v: &mut Value) {
    if let Value::Object(m) = v {
        m.remove(ENUM_DOC);
        for_each_subschema(m, &mut strip_markers);
    }
}

/// Rewrites a v3 schema (or whole document fragment) into swagger 2.0 form.
fn to_v2(mut v: Value) -> Value {
    fn walk(v: &mut Value) {
        match v {
            Value::Object(m) => {
                // v2 has no `nullable`; a `$ref` may carry siblings there (they are ignored
                // by readers, but kube-apiserver publishes descriptions that way).
                m.remove("nullable");
                m.remove("deprecated");
                if let Some(Value::Array(all)) = m.get("allOf")
                    && all.len() == 1
                    && let Some(Value::Array(mut all)) = m.remove("allOf")
                {
                    if let Value::Object(inner) = all.remove(0) {
                        for (k, val) in inner {
                            m.insert(k, val);
                        }
                    }
                    m.remove("default");
                }
                if let Some(Value::String(r)) = m.get_mut("$ref")
                    && let Some(rest) = r.strip_prefix("#/components/schemas/")
                {
                    *r = format!("#/definitions/{rest}");
                }
                m.values_mut().for_each(walk);
            }
            Value::Array(a) => a.iter_mut().for_each(walk),
            _ => {}
        }
    }
    walk(&mut v);
    v
}

fn sorted(m: Map<String, Value>) -> Value {
    let b: BTreeMap<String, Value> = m.into_iter().collect();
    Value::Object(b.into_iter().collect())
}

// ---------------------------------------------------------------------------------------
// Paths
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy)]
struct Param {
    name: &'static str,
    location: &'static str,
    ty: &'static str,
    description: &'static str,
    required: bool,
    /// What the server accepts beyond the type, so that the schema says it: a client (or a
    /// generator such as schemathesis) otherwise learns it from a 400/422 only.
    constraint: Constraint,
}

#[derive(Clone, Copy)]
enum Constraint {
    None,
    /// One of these values.
    OneOf(&'static [&'static str]),
    /// A string of at most `max_length` characters matching `pattern`.
    Text {
        pattern: &'static str,
        max_length: u32,
    },
}

impl Constraint {
    fn render(self, m: &mut Map<String, Value>) {
        match self {
            Constraint::None => {}
            Constraint::OneOf(values) => {
                m.insert("enum".into(), json!(values));
            }
            Constraint::Text {
                pattern,
                max_length,
            } => {
                m.insert("pattern".into(), json!(pattern));
                m.insert("maxLength".into(), json!(max_length));
            }
        }
    }
}

const fn q(name: &'static str, ty: &'static str, description: &'static str) -> Param {
    Param {
        name,
        location: "query",
        ty,
        description,
        required: false,
        constraint: Constraint::None,
    }
}

const fn with(p: Param, constraint: Constraint) -> Param {
    Param { constraint, ..p }
}

const PRETTY: Param = q(
    "pretty",
    "string",
    "If 'true', then the output is pretty printed.",
);
const DRY_RUN: Param = with(
    q(
        "dryRun",
        "string",
        "When present, modifications are validated and not persisted. The only valid value is All.",
    ),
    Constraint::OneOf(&["All"]),
);
const FIELD_MANAGER: Param = with(
    q(
        "fieldManager",
        "string",
        "Name of the actor making the change, recorded in managedFields. At most 128 printable characters; required for apply patches.",
    ),
    // Printable: no control character (Unicode category Cc), as the server checks.
    Constraint::Text {
        pattern: "^[^\\u0000-\\u001f\\u007f-\\u009f]*$",
        max_length: 128,
    },
);
const FIELD_VALIDATION: Param = with(
    q(
        "fieldValidation",
        "string",
        "How unknown or duplicate fields in the body are treated: Ignore, Warn (the default) or Strict.",
    ),
    // Empty is the default, as in kube-apiserver.
    Constraint::OneOf(&["", "Ignore", "Warn", "Strict"]),
);
const FORCE: Param = q(
    "force",
    "boolean",
    "Apply patches only: take ownership of fields other managers own instead of failing with a conflict.",
);
const GRACE_PERIOD: Param = q(
    "gracePeriodSeconds",
    "integer",
    "Seconds before the object is deleted; zero means immediately.",
);
const ORPHAN: Param = q(
    "orphanDependents",
    "boolean",
    "Deprecated: use propagationPolicy. Whether dependents are orphaned.",
);
const PROPAGATION: Param = with(
    q(
        "propagationPolicy",
        "string",
        "Garbage collection of dependents: Orphan, Background or Foreground.",
    ),
    Constraint::OneOf(&["Orphan", "Background", "Foreground"]),
);
const LIST_PARAMS: [Param; 10] = [
    q(
        "allowWatchBookmarks",
        "boolean",
        "Watch only: the server may send BOOKMARK events.",
    ),
    q(
        "continue",
        "string",
        "Continue token from a previous paginated list response.",
    ),
    q(
        "fieldSelector",
        "string",
        "Restrict results by field values, e.g. metadata.name=vm1. Defaults to everything.",
    ),
    q(
        "labelSelector",
        "string",
        "Restrict results by labels. Defaults to everything.",
    ),
    q(
        "limit",
        "integer",
        "Maximum number of items in one list response; a continue token fetches the rest.",
    ),
    q(
        "resourceVersion",
        "string",
        "Which state to serve (lists) or to start from (watches). See resourceVersionMatch.",
    ),
    q(
        "resourceVersionMatch",
        "string",
        "How resourceVersion applies to list calls: Exact or NotOlderThan.",
    ),
    q(
        "sendInitialEvents",
        "boolean",
        "Watch only: start with synthetic ADDED events for the current state, then a bookmark.",
    ),
    q(
        "timeoutSeconds",
        "integer",
        "Timeout for list and watch calls.",
    ),
    q("watch", "boolean", "Watch for changes instead of listing."),
];

fn path_param(name: &'static str, description: &'static str) -> Param {
    Param {
        name,
        location: "path",
        ty: "string",
        description,
        required: true,
        constraint: Constraint::None,
    }
}

fn render_param(p: &Param, flavor: Flavor) -> Value {
    let mut v = json!({ "name": p.name, "in": p.location, "description": p.description });
    if let Some(m) = v.as_object_mut() {
        if p.required {
            m.insert("required".into(), Value::Bool(true));
        }
        match flavor {
            Flavor::V2 => {
                m.insert("type".into(), Value::String(p.ty.into()));
                m.insert("uniqueItems".into(), Value::Bool(true));
                p.constraint.render(m);
            }
            Flavor::V3 => {
                let mut schema = json!({ "type": p.ty, "uniqueItems": true });
                if let Some(s) = schema.as_object_mut() {
                    p.constraint.render(s);
                }
                m.insert("schema".into(), schema);
            }
        }
    }
    v
}

const JSON: &str = "application/json";
const YAML: &str = "application/yaml";
const JSON_STREAM: &str = "application/json;stream=watch";
const PATCH_TYPES: [&str; 3] = [
    "application/json-patch+json",
    "application/merge-patch+json",
    "application/apply-patch+yaml",
];

struct Op {
    method: &'static str,
    action: &'static str,
    operation_id: String,
    description: String,
    tag: String,
    gvk: Value,
    params: Vec<Param>,
    /// Definition name and request content types.
    body: Option<(String, Vec<&'static str>)>,
    /// `example` of the request body (v3 only: swagger 2.0 has no place for one).
    example: Option<Value>,
    /// Status code, description, definition name (`None`: no body; `Some("")`: string).
    responses: Vec<(&'static str, &'static str, Option<String>)>,
    produces: Vec<&'static str>,
}

fn render_op(op: &Op, flavor: Flavor) -> Value {
    let mut params: Vec<Value> = Vec::new();
    let mut out = Map::new();
    out.insert("description".into(), Value::String(op.description.clone()));
    if flavor == Flavor::V2 {
        let consumes = op
            .body
            .as_ref()
            .map(|(_, c)| c.clone())
            .unwrap_or_else(|| vec!["*/*"]);
        out.insert("consumes".into(), json!(consumes));
        out.insert("produces".into(), json!(op.produces));
        out.insert("schemes".into(), json!(["https"]));
    }
    out.insert("tags".into(), json!([op.tag]));
    out.insert("operationId".into(), Value::String(op.operation_id.clone()));
    if let Some((schema, content_types)) = &op.body {
        match flavor {
            Flavor::V2 => params.push(json!({
                "name": "body",
                "in": "body",
                "required": true,
                "schema": flavor.reference(schema),
            })),
            Flavor::V3 => {
                let content: Map<String, Value> = content_types
                    .iter()
                    .map(|ct| {
                        let mut media = json!({ "schema": flavor.reference(schema) });
                        if let Some(example) = &op.example {
                            media["example"] = example.clone();
                        }
                        ((*ct).to_string(), media)
                    })
                    .collect();
                out.insert(
                    "requestBody".into(),
                    json!({ "content": content, "required": true }),
                );
            }
        }
    }
    params.extend(op.params.iter().map(|p| render_param(p, flavor)));
    if !params.is_empty() {
        out.insert("parameters".into(), Value::Array(params));
    }
    let mut responses = Map::new();
    for (code, description, schema) in &op.responses {
        let schema = schema.as_ref().map(|s| {
            if s.is_empty() {
                json!({ "type": "string" })
            } else {
                flavor.reference(s)
            }
        });
        let mut r = json!({ "description": description });
        if let (Some(schema), Some(m)) = (schema, r.as_object_mut()) {
            match flavor {
                Flavor::V2 => {
                    m.insert("schema".into(), schema);
                }
                Flavor::V3 => {
                    let content: Map<String, Value> = op
                        .produces
                        .iter()
                        .map(|ct| ((*ct).to_string(), json!({ "schema": schema })))
                        .collect();
                    m.insert("content".into(), Value::Object(content));
                }
            }
        }
        responses.insert((*code).to_string(), r);
    }
    responses.insert("401".into(), json!({ "description": "Unauthorized" }));
    out.insert("responses".into(), Value::Object(responses));
    out.insert(
        "x-kubernetes-action".into(),
        Value::String(op.action.into()),
    );
    out.insert("x-kubernetes-group-version-kind".into(), op.gvk.clone());
    Value::Object(out)
}

fn path_item(path_params: &[Param], ops: &[Op], flavor: Flavor) -> Value {
    let mut item = Map::new();
    for op in ops {
        item.insert(op.method.into(), render_op(op, flavor));
    }
    let mut params: Vec<Value> = path_params
        .iter()
        .map(|p| render_param(p, flavor))
        .collect();
    params.push(render_param(&PRETTY, flavor));
    item.insert("parameters".into(), Value::Array(params));
    Value::Object(item)
}

/// `kubevirt.io` → `KubevirtIo`, as in kube-apiserver's operation IDs and tags.
fn camel_group(group: &str) -> String {
    group
        .split('.')
        .map(|part| {
            let mut c = part.chars();
            match c.next() {
                Some(f) => f.to_uppercase().chain(c).collect::<String>(),
                None => String::new(),
            }
        })
        .collect()
}

fn tag_for(group: &str) -> String {
    tag_at(group, VERSION)
}

/// `instancetype.kubevirt.io`, `v1beta1` → `instancetypeKubevirtIo_v1beta1`.
fn tag_at(group: &str, version: &str) -> String {
    let mut t = camel_group(group);
    if let Some(first) = t.get(..1) {
        t = first.to_lowercase() + &t[1..];
    }
    format!("{t}_{version}")
}

/// The paths of the kinds `pick` chooses: namespaced kinds under `namespaces/{namespace}`
/// with a list across namespaces, cluster-scoped ones at the group-version's root, as
/// kube-apiserver publishes them.
fn add_kind_paths(
    paths: &mut Map<String, Value>,
    flavor: Flavor,
    pick: impl Fn(&&KindStrategy) -> bool,
) {
    let ns_param = path_param(
        "namespace",
        "object name and auth scope, such as for teams and projects",
    );
    let name = path_param("name", "name of the object");
    for k in kinds::ALL.iter().copied().filter(pick) {
        let kind = k.kind;
        let base = format!("/apis/{}/{}", k.group, k.version);
        let id = format!("{}{}", camel_group(k.group), camel_group(k.version));
        let tag = tag_at(k.group, k.version);
        // What a collection's and an object's path add, and the operation ids' word.
        let (prefix, scope_params, namespaced): (String, Vec<Param>, &str) = if k.namespaced {
            (
                format!("{base}/namespaces/{{namespace}}"),
                vec![ns_param],
                "Namespaced",
            )
        } else {
            (base.clone(), Vec::new(), "")
        };
        let def = format!("{}{kind}", kind_prefix(k));
        let list_def = format!("{}{}", kind_prefix(k), k.list_kind);
        let status_def = format!("{META_PREFIX}Status");
        let delete_options = format!("{META_PREFIX}DeleteOptions");
        let patch = format!("{META_PREFIX}Patch");
        let kind_gvk = gvk_at(k.group, k.version, kind);
        let list_produces = vec![JSON, YAML, JSON_STREAM];
        let obj_produces = vec![JSON, YAML];
        let mk = |method, action, op_id: String, description: String| Op {
            method,
            action,
            operation_id: op_id,
            description,
            tag: tag.clone(),
            gvk: kind_gvk.clone(),
            params: Vec::new(),
            body: None,
            example: None,
            responses: Vec::new(),
            produces: obj_produces.clone(),
        };

        if k.create_only {
            // Answered on create, stored nowhere (UploadTokenRequest): one path, one POST.
            let create = Op {
                params: vec![DRY_RUN, FIELD_MANAGER, FIELD_VALIDATION],
                body: Some((def.clone(), vec![JSON, YAML])),
                example: create_example(k),
                responses: vec![
                    ("200", "OK", Some(def.clone())),
                    ("201", "Created", Some(def.clone())),
                    ("202", "Accepted", Some(def.clone())),
                ],
                ..mk(
                    "post",
                    "post",
                    format!("create{id}{namespaced}{kind}"),
                    format!("create a {kind}"),
                )
            };
            paths.insert(
                format!("{prefix}/{}", k.plural),
                path_item(&scope_params, &[create], flavor),
            );
            continue;
        }

        if k.namespaced {
            let list_all = Op {
                params: LIST_PARAMS.to_vec(),
                responses: vec![("200", "OK", Some(list_def.clone()))],
                produces: list_produces.clone(),
                ..mk(
                    "get",
                    "list",
                    format!("list{id}{kind}ForAllNamespaces"),
                    format!("list or watch objects of kind {kind}"),
                )
            };
            paths.insert(
                format!("{base}/{}", k.plural),
                path_item(&[], &[list_all], flavor),
            );
        }

        // Namespaced collection.
        let list = Op {
            params: LIST_PARAMS.to_vec(),
            responses: vec![("200", "OK", Some(list_def.clone()))],
            produces: list_produces.clone(),
            ..mk(
                "get",
                "list",
                format!("list{id}{namespaced}{kind}"),
                format!("list or watch objects of kind {kind}"),
            )
        };
        let create = Op {
            params: vec![DRY_RUN, FIELD_MANAGER, FIELD_VALIDATION],
            body: Some((def.clone(), vec![JSON, YAML])),
            example: create_example(k),
            responses: vec![
                ("200", "OK", Some(def.clone())),
                ("201", "Created", Some(def.clone())),
                ("202", "Accepted", Some(def.clone())),
            ],
            ..mk(
                "post",
                "post",
                format!("create{id}{namespaced}{kind}"),
                format!("create a {kind}"),
            )
        };
        let mut dc_params = vec![DRY_RUN, GRACE_PERIOD, ORPHAN, PROPAGATION];
        dc_params.extend(LIST_PARAMS);
        let delete_collection = Op {
            params: dc_params,
            body: Some((delete_options.clone(), vec![JSON, YAML])),
            responses: vec![("200", "OK", Some(status_def.clone()))],
            ..mk(
                "delete",
                "deletecollection",
                format!("delete{id}Collection{namespaced}{kind}"),
                format!("delete collection of {kind}"),
            )
        };
        paths.insert(
            format!("{prefix}/{}", k.plural),
            path_item(&scope_params, &[list, create, delete_collection], flavor),
        );

        // Single object and its status.
        let object_params: Vec<Param> = [name].into_iter().chain(scope_params.clone()).collect();
        let status = k.has_status.then_some(("/status", "Status"));
        for (suffix, what) in [("", "")].into_iter().chain(status) {
            let target = if what.is_empty() {
                format!("the specified {kind}")
            } else {
                format!("status of the specified {kind}")
            };
            let read = Op {
                responses: vec![("200", "OK", Some(def.clone()))],
                ..mk(
                    "get",
                    "get",
                    format!("read{id}{namespaced}{kind}{what}"),
                    format!("read {target}"),
                )
            };
            let replace = Op {
                params: vec![DRY_RUN, FIELD_MANAGER, FIELD_VALIDATION],
                body: Some((def.clone(), vec![JSON, YAML])),
                responses: vec![
                    ("200", "OK", Some(def.clone())),
                    ("201", "Created", Some(def.clone())),
                ],
                ..mk(
                    "put",
                    "put",
                    format!("replace{id}{namespaced}{kind}{what}"),
                    format!("replace {target}"),
                )
            };
            let patch_op = Op {
                params: vec![DRY_RUN, FIELD_MANAGER, FIELD_VALIDATION, FORCE],
                body: Some((patch.clone(), PATCH_TYPES.to_vec())),
                responses: vec![
                    ("200", "OK", Some(def.clone())),
                    ("201", "Created", Some(def.clone())),
                ],
                ..mk(
                    "patch",
                    "patch",
                    format!("patch{id}{namespaced}{kind}{what}"),
                    format!("partially update {target}"),
                )
            };
            let mut ops = vec![read, replace, patch_op];
            if what.is_empty() {
                ops.push(Op {
                    params: vec![DRY_RUN, GRACE_PERIOD, ORPHAN, PROPAGATION],
                    body: Some((delete_options.clone(), vec![JSON, YAML])),
                    responses: vec![
                        ("200", "OK", Some(status_def.clone())),
                        ("202", "Accepted", Some(status_def.clone())),
                    ],
                    ..mk(
                        "delete",
                        "delete",
                        format!("delete{id}{namespaced}{kind}"),
                        format!("delete a {kind}"),
                    )
                });
            }
            paths.insert(
                format!("{prefix}/{}/{{name}}{suffix}", k.plural),
                path_item(&object_params, &ops, flavor),
            );
        }

        // The Scale view, as kube-apiserver publishes a Deployment's: read, replace (an
        // HPA) and patch (`kubectl scale`), each an `autoscaling/v1` Scale.
        if k.has_scale {
            let target = format!("scale of the specified {kind}");
            let scale_op = |method, action, verb: &str, description: String| Op {
                gvk: gvk_at("autoscaling", "v1", "Scale"),
                responses: vec![
                    ("200", "OK", Some(SCALE_DEF.to_string())),
                    ("201", "Created", Some(SCALE_DEF.to_string())),
                ],
                ..mk(
                    method,
                    action,
                    format!("{verb}{id}{namespaced}{kind}Scale"),
                    description,
                )
            };
            let read = Op {
                responses: vec![("200", "OK", Some(SCALE_DEF.to_string()))],
                ..scale_op("get", "get", "read", format!("read {target}"))
            };
            let replace = Op {
                params: vec![DRY_RUN, FIELD_MANAGER, FIELD_VALIDATION],
                body: Some((SCALE_DEF.to_string(), vec![JSON, YAML])),
                ..scale_op("put", "put", "replace", format!("replace {target}"))
            };
            let patch_op = Op {
                params: vec![DRY_RUN, FIELD_MANAGER, FIELD_VALIDATION, FORCE],
                body: Some((patch.clone(), PATCH_TYPES.to_vec())),
                ..scale_op(
                    "patch",
                    "patch",
                    "patch",
                    format!("partially update {target}"),
                )
            };
            paths.insert(
                format!("{prefix}/{}/{{name}}/scale", k.plural),
                path_item(&object_params, &[read, replace, patch_op], flavor),
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// subresources.kubevirt.io
// ---------------------------------------------------------------------------------------

/// An options kind's schema from its type (`kubevirt_api::options`), with the
/// apiVersion/kind every Kubernetes body has and its group-version-kind.
fn options_schema(kind: &str) -> Option<Value> {
    let mut settings = SchemaSettings::openapi3();
    settings.inline_subschemas = true;
    settings.meta_schema = None;
    let mut v = kubevirt_api::options::root_schema(kind, settings.clone())
        .or_else(|| kubevirt_api::backup::root_schema(kind, settings.clone()))
        .or_else(|| kubevirt_api::guestagent::root_schema(kind, settings))?
        .to_value();
    if let Some(m) = v.as_object_mut() {
        m.remove("$schema");
        m.remove("title");
    }
    normalize(&mut v);
    strip_markers(&mut v);
    let mut properties = v["properties"].as_object().cloned().unwrap_or_default();
    properties.insert(
        "apiVersion".into(),
        json!({ "description": API_VERSION_DESC, "type": "string" }),
    );
    properties.insert(
        "kind".into(),
        json!({ "description": KIND_DESC, "type": "string" }),
    );
    if let Some(d) = properties.get_mut("dryRun") {
        d["x-kubernetes-list-type"] = json!("atomic");
    }
    Some(json!({
        "description": v["description"],
        "type": "object",
        "properties": sorted(properties),
        "x-kubernetes-group-version-kind": [gvk(SUBRESOURCES_GROUP, kind)],
    }))
}

fn subresource_definitions() -> BTreeMap<String, Value> {
    kubevirt_api::options::KINDS
        .into_iter()
        .chain(kubevirt_api::backup::KINDS)
        .chain(kubevirt_api::guestagent::KINDS)
        .filter_map(|kind| Some((format!("{SUBRESOURCE_PREFIX}{kind}"), options_schema(kind)?)))
        .collect()
}

fn add_subresource_paths(paths: &mut Map<String, Value>, flavor: Flavor) {
    let prefix = format!("/apis/{SUBRESOURCES_GROUP}/{VERSION}/namespaces/{{namespace}}");
    let id = format!("{}V1", camel_group(SUBRESOURCES_GROUP));
    let tag = tag_for(SUBRESOURCES_GROUP);
    let ns = path_param(
        "namespace",
        "object name and auth scope, such as for teams and projects",
    );
    let name_param = path_param("name", "name of the object");
    let camel = |s: &str| {
        let mut c = s.chars();
        c.next()
            .map(|f| f.to_uppercase().chain(c).collect::<String>())
            .unwrap_or_default()
    };
    for e in catalogue::ADMIN_ENDPOINTS {
        let (method, action, params, body, response) = match e.http_method {
            "GET" => ("get", "list", Vec::new(), None, e.body_kind),
            _ => (
                "put",
                "put",
                Vec::new(),
                Some((format!("{SUBRESOURCE_PREFIX}{}", e.body_kind), vec![JSON])),
                kubevirt_api::backup::RESULT_KIND,
            ),
        };
        let op = Op {
            method,
            action,
            operation_id: format!("{}{id}{}", e.http_method.to_lowercase(), camel(e.name)),
            description: e.description.to_string(),
            tag: tag.clone(),
            gvk: gvk(SUBRESOURCES_GROUP, e.body_kind),
            params,
            body,
            example: None,
            responses: vec![("200", "OK", Some(format!("{SUBRESOURCE_PREFIX}{response}")))],
            produces: vec![JSON],
        };
        paths.insert(e.path(), path_item(&[], &[op], flavor));
    }
    for sub in catalogue::SUBRESOURCES {
        let (parent, name) = (sub.kind.kind, sub.name);
        let op = match sub.style {
            Style::Action { options } => {
                let (gvk_value, body) = match options {
                    Some(kind) => (
                        gvk(SUBRESOURCES_GROUP, kind),
                        Some((format!("{SUBRESOURCE_PREFIX}{kind}"), vec![JSON])),
                    ),
                    None => (gvk(GROUP, parent), None),
                };
                Op {
                    method: "put",
                    action: "put",
                    operation_id: format!("{name}{id}Namespaced{parent}{}", camel(name)),
                    description: sub.description.to_string(),
                    tag: tag.clone(),
                    gvk: gvk_value,
                    params: vec![DRY_RUN],
                    body,
                    example: None,
                    responses: vec![("202", "Accepted", None)],
                    produces: vec![JSON],
                }
            }
            // A read answering its object's own kind (expand-spec's VirtualMachine) names
            // that kind, whose schema is kubevirt.io's, not one of this group's.
            Style::Read { answer } if answer == parent => Op {
                method: "get",
                action: "get",
                operation_id: format!("{name}{id}Namespaced{parent}{}", camel(name)),
                description: sub.description.to_string(),
                tag: tag.clone(),
                gvk: gvk(GROUP, parent),
                params: Vec::new(),
                body: None,
                example: None,
                responses: vec![("200", "OK", None)],
                produces: vec![JSON],
            },
            Style::Read { answer } => Op {
                method: "get",
                action: "get",
                operation_id: format!("{name}{id}Namespaced{parent}{}", camel(name)),
                description: sub.description.to_string(),
                tag: tag.clone(),
                gvk: gvk(SUBRESOURCES_GROUP, answer),
                params: Vec::new(),
                body: None,
                example: None,
                responses: vec![("200", "OK", Some(format!("{SUBRESOURCE_PREFIX}{answer}")))],
                produces: vec![JSON],
            },
            Style::Stream => Op {
                method: "get",
                action: "connect",
                operation_id: format!("connect{id}Namespaced{parent}{}", camel(name)),
                description: sub.description.to_string(),
                tag: tag.clone(),
                gvk: gvk(GROUP, parent),
                params: Vec::new(),
                body: None,
                example: None,
                responses: vec![("200", "OK", Some(String::new()))],
                produces: vec!["*/*"],
            },
        };
        let base = format!("{prefix}/{}/{{name}}/{}", sub.kind.plural, sub.path_name());
        if sub.path_params.is_empty() {
            paths.insert(base, path_item(&[name_param, ns], &[op], flavor));
            continue;
        }
        // One path per optional trailing segment, as KubeVirt's (`…/portforward/{port}`
        // and `…/portforward/{port}/{protocol}`).
        for n in 1..=sub.path_params.len() {
            let mut path = base.clone();
            let mut params = vec![name_param, ns];
            for (p, d) in &sub.path_params[..n] {
                path.push_str(&format!("/{{{p}}}"));
                params.push(path_param(p, d));
            }
            paths.insert(path, path_item(&params, std::slice::from_ref(&op), flavor));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v3() -> Value {
        openapi_v3_group_version(V3_KUBEVIRT).expect("kubevirt document")
    }

    fn walk<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
        out.push(v);
        match v {
            Value::Object(m) => m.values().for_each(|c| walk(c, out)),
            Value::Array(a) => a.iter().for_each(|c| walk(c, out)),
            _ => {}
        }
    }

    /// Schema nodes only (a property may be called `type`).
    fn schema_nodes(v: &Value, out: &mut Vec<Value>) {
        out.push(v.clone());
        let mut v = v.clone();
        if let Value::Object(m) = &mut v {
            for_each_subschema(m, &mut |c| schema_nodes(c, out));
        }
    }

    fn refs(doc: &Value) -> Vec<String> {
        let mut all = Vec::new();
        walk(doc, &mut all);
        all.iter()
            .filter_map(|v| v.get("$ref").and_then(Value::as_str).map(str::to_string))
            .collect()
    }

    /// What `kubectl explain vm.spec.runStrategy` does with the v3 document: GVR → path →
    /// operation GVK → the schema whose GVK array contains it → field walk.
    #[test]
    fn explain_lookup_finds_run_strategy() {
        let doc = v3();
        let op =
            &doc["paths"]["/apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachines"]["get"];
        let wanted = &op["x-kubernetes-group-version-kind"];
        let schemas = doc["components"]["schemas"].as_object().expect("schemas");
        let (_, schema) = schemas
            .iter()
            .find(|(_, s)| {
                s["x-kubernetes-group-version-kind"]
                    .as_array()
                    .is_some_and(|a| a.contains(wanted))
            })
            .expect("schema with the operation's GVK");
        let resolve = |s: &Value| -> Value {
            let target = s
                .get("allOf")
                .and_then(|a| a.get(0))
                .unwrap_or(s)
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|r| r.strip_prefix("#/components/schemas/"))
                .and_then(|n| schemas.get(n));
            target.cloned().unwrap_or_else(|| s.clone())
        };
        let mut node = schema.clone();
        for field in ["spec", "runStrategy"] {
            node = resolve(&node["properties"][field]);
        }
        assert_eq!(node["type"], "string");
        assert!(node["enum"].as_array().is_some_and(|e| e.len() == 6));
        // metadata resolves to the shared ObjectMeta.
        let meta = resolve(&schema["properties"]["metadata"]);
        assert!(meta["properties"].get("managedFields").is_some());
    }

    /// Every kind of the catalogue has a schema, in the catalogue's order.
    #[test]
    fn every_catalogued_kind_has_a_schema() {
        for k in catalogue::all_kinds() {
            assert!(kind_schema(k.kind).is_some(), "{}", k.kind);
        }
    }

    #[test]
    fn documents_are_deterministic() {
        assert_eq!(openapi_v2(), openapi_v2());
        assert_eq!(document_hash(&v3()), document_hash(&v3()));
        let a = OpenApiDocuments::build();
        let b = OpenApiDocuments::build();
        assert_eq!(a.v2_hash, b.v2_hash);
        assert_eq!(a.v3_root, b.v3_root);
        assert_eq!(a.v3_root_hash.len(), 128);
        assert!(
            a.v3_root_hash
                .chars()
                .all(|c| c.is_ascii_digit() || c.is_ascii_uppercase())
        );
    }

    /// DataVolumes: CDI's group in its own document with CDI's definition names, the status
    /// subresource, and `kubectl explain datavolume.spec.source.http` reaching the URL.
    #[test]
    fn datavolumes_are_in_cdis_document() {
        let doc = openapi_v3_group_version(V3_CDI).expect("doc");
        let paths = doc["paths"].as_object().expect("paths");
        let base = "/apis/cdi.kubevirt.io/v1beta1";
        for p in [
            "/namespaces/{namespace}/datavolumes",
            "/namespaces/{namespace}/datavolumes/{name}",
            "/namespaces/{namespace}/datavolumes/{name}/status",
            "/datavolumes",
        ] {
            assert!(paths.contains_key(&format!("{base}{p}")), "{p}");
        }
        let dv = &doc["components"]["schemas"]["io.kubevirt.cdi.v1beta1.DataVolume"];
        assert_eq!(
            dv["x-kubernetes-group-version-kind"][0],
            json!({"group": "cdi.kubevirt.io", "kind": "DataVolume", "version": "v1beta1"})
        );
        let http = &dv["properties"]["spec"]["properties"]["source"]["properties"]["http"];
        assert_eq!(http["properties"]["url"]["type"], "string");
        assert_eq!(
            dv["properties"]["status"]["properties"]["restartCount"]["type"],
            "integer"
        );
    }

    /// Instance types: their group's document, cluster-scoped kinds at the group-version's
    /// root without a namespace or status, `kubectl explain` reaching into the spec.
    #[test]
    fn instancetype_kinds_are_in_their_own_document() {
        let doc = openapi_v3_group_version(V3_INSTANCETYPE).expect("doc");
        let paths = doc["paths"].as_object().expect("paths");
        let base = "/apis/instancetype.kubevirt.io/v1beta1";
        for p in [
            "/namespaces/{namespace}/virtualmachineinstancetypes/{name}",
            "/virtualmachineinstancetypes",
            "/virtualmachineclusterinstancetypes",
            "/virtualmachineclusterinstancetypes/{name}",
        ] {
            assert!(paths.contains_key(&format!("{base}{p}")), "{p}");
        }
        assert!(!paths.keys().any(|p| p.ends_with("/status")));
        assert!(
            !paths
                .keys()
                .any(|p| p.contains("namespaces/{namespace}/virtualmachineclusterinstancetypes"))
        );
        let op = &paths[&format!("{base}/virtualmachineclusterinstancetypes")]["post"];
        assert_eq!(
            op["operationId"],
            "createInstancetypeKubevirtIoV1beta1VirtualMachineClusterInstancetype"
        );
        let schemas = &doc["components"]["schemas"];
        let it = &schemas["io.kubevirt.instancetype.v1beta1.VirtualMachineClusterInstancetype"];
        assert_eq!(
            it["x-kubernetes-group-version-kind"][0],
            json!({"group": "instancetype.kubevirt.io", "kind": "VirtualMachineClusterInstancetype", "version": "v1beta1"})
        );
        let guest = &it["properties"]["spec"]["properties"]["cpu"]["properties"]["guest"];
        assert_eq!(guest["type"], "integer");
        assert!(it["properties"].get("status").is_none());
        assert!(
            openapi_v3_group_version(V3_KUBEVIRT).expect("kubevirt")["paths"]
                .as_object()
                .expect("paths")
                .keys()
                .all(|p| p.starts_with("/apis/kubevirt.io/"))
        );
    }

    #[test]
    fn v3_root_lists_only_our_group_versions() {
        let docs = OpenApiDocuments::build();
        let root: Value = serde_json::from_slice(&docs.v3_root).expect("json");
        let paths = root["paths"].as_object().expect("paths");
        assert_eq!(
            paths.keys().collect::<Vec<_>>(),
            vec![
                V3_CDI,
                V3_INSTANCETYPE,
                V3_KUBEVIRT,
                V3_POOL,
                V3_SUBRESOURCES,
                "apis/upload.cdi.kubevirt.io/v1beta1"
            ]
        );
        let (_, hash) = &docs.v3[V3_KUBEVIRT];
        assert_eq!(
            paths[V3_KUBEVIRT]["serverRelativeURL"],
            format!("/openapi/v3/apis/kubevirt.io/v1?hash={hash}")
        );
        assert!(openapi_v3_group_version("api/v1").is_none());
        assert_eq!(openapi_v3_group_version("kubevirt.io"), Some(v3()));
    }

    #[test]
    fn every_reference_resolves() {
        let doc = v3();
        for r in refs(&doc) {
            let name = r
                .strip_prefix("#/components/schemas/")
                .unwrap_or_else(|| panic!("bad v3 ref {r}"));
            assert!(doc["components"]["schemas"].get(name).is_some(), "{r}");
        }
        let sub = openapi_v3_group_version(V3_SUBRESOURCES).expect("doc");
        for r in refs(&sub) {
            let name = r.trim_start_matches("#/components/schemas/");
            assert!(sub["components"]["schemas"].get(name).is_some(), "{r}");
        }
        let v2 = openapi_v2();
        for r in refs(&v2) {
            let name = r
                .strip_prefix("#/definitions/")
                .unwrap_or_else(|| panic!("bad v2 ref {r}"));
            assert!(v2["definitions"].get(name).is_some(), "{r}");
        }
    }

    #[test]
    fn kind_schemas_are_inline_and_plain_openapi() {
        for kind in [
            "VirtualMachine",
            "VirtualMachineInstance",
            "VirtualMachineInstanceMigration",
        ] {
            let schema = kind_schema(kind).expect("kind");
            let r = refs(&schema);
            assert_eq!(
                r,
                vec![format!("#/components/schemas/{META_PREFIX}ObjectMeta")],
                "{kind} must reference only ObjectMeta"
            );
            let mut all = Vec::new();
            schema_nodes(&schema, &mut all);
            for node in all {
                if let Some(m) = node.as_object() {
                    for bad in ["anyOf", "oneOf", "$schema", "$defs", "const", ENUM_DOC] {
                        assert!(!m.contains_key(bad), "{kind}: {bad} in {node}");
                    }
                    if let Some(t) = m.get("type") {
                        assert!(t.is_string(), "{kind}: type {t}");
                        assert_ne!(t, "null");
                    }
                }
            }
            assert_eq!(
                schema["x-kubernetes-group-version-kind"],
                json!([{"group": "kubevirt.io", "kind": kind, "version": "v1"}])
            );
            assert_eq!(schema["required"], json!(["spec"]));
        }
    }

    #[test]
    fn run_strategy_has_enum_and_field_description() {
        let doc = v3();
        let vm = &doc["components"]["schemas"]["io.kubevirt.v1.VirtualMachine"];
        let rs = &vm["properties"]["spec"]["properties"]["runStrategy"];
        assert_eq!(rs["type"], "string");
        assert_eq!(rs["nullable"], true);
        assert_eq!(
            rs["enum"],
            json!([
                "Always",
                "RerunOnFailure",
                "Manual",
                "Halted",
                "Once",
                "WaitAsReceiver"
            ])
        );
        let d = rs["description"].as_str().expect("description");
        assert!(
            d.starts_with("When an instance of this VM should run"),
            "{d}"
        );
        assert!(
            d.contains("Possible enum values:\n - `\"Always\"` Always keep"),
            "{d}"
        );
        // v2 has no nullable.
        let v2 = openapi_v2();
        let rs2 = &v2["definitions"]["io.kubevirt.v1.VirtualMachine"]["properties"]["spec"]["properties"]
            ["runStrategy"];
        assert_eq!(rs2["enum"], rs["enum"]);
        assert!(rs2.get("nullable").is_none());
        assert_eq!(
            v2["definitions"]["io.kubevirt.v1.VirtualMachine"]["properties"]["metadata"]["$ref"],
            "#/definitions/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
        );
    }

    #[test]
    fn list_map_extensions_survive() {
        let vmi = kind_schema("VirtualMachineInstance").expect("vmi");
        let spec = &vmi["properties"]["spec"]["properties"];
        for f in ["volumes", "networks"] {
            assert_eq!(spec[f]["x-kubernetes-list-type"], "map", "{f}");
            assert_eq!(
                spec[f]["x-kubernetes-list-map-keys"],
                json!(["name"]),
                "{f}"
            );
            assert_eq!(spec[f]["items"]["type"], "object", "{f}");
        }
        let devices = &spec["domain"]["properties"]["devices"]["properties"];
        for f in ["disks", "interfaces"] {
            assert_eq!(
                devices[f]["x-kubernetes-list-map-keys"],
                json!(["name"]),
                "{f}"
            );
        }
        let vm = kind_schema("VirtualMachine").expect("vm");
        assert_eq!(
            vm["properties"]["status"]["properties"]["conditions"]["x-kubernetes-list-map-keys"],
            json!(["type"])
        );
    }

    #[test]
    fn meta_definitions_use_upstream_names() {
        let doc = v3();
        let schemas = doc["components"]["schemas"].as_object().expect("schemas");
        for name in [
            "ObjectMeta",
            "ListMeta",
            "Status",
            "DeleteOptions",
            "WatchEvent",
            "Patch",
        ] {
            assert!(
                schemas.contains_key(&format!("{META_PREFIX}{name}")),
                "{name}"
            );
        }
        assert!(
            schemas.keys().all(|k| k.starts_with("io.")),
            "{:?}",
            schemas.keys()
        );
    }

    /// Every create of a kind we store carries an example that decodes into the kind's type
    /// without an unknown field and passes the server's validation, so the example is one
    /// the server creates as sent (`tests/kubectl.rs` creates them through kubectl).
    #[test]
    fn creates_carry_a_valid_minimal_example() {
        use kubevirt_api::validation::{
            validate_migration, validate_object_meta, validate_vm, validate_vmi,
        };
        use kubevirt_api::{
            VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceMigration,
        };
        let doc = v3();
        let example = |plural: &str| {
            let body = &doc["paths"]
                [&format!("/apis/kubevirt.io/v1/namespaces/{{namespace}}/{plural}")]["post"]["requestBody"]
                ["content"];
            let json = body[JSON]["example"].clone();
            assert_eq!(body[YAML]["example"], json, "{plural}");
            assert_eq!(json["apiVersion"], "kubevirt.io/v1");
            let meta: ObjectMeta = serde_json::from_value(json["metadata"].clone()).expect("meta");
            assert!(validate_object_meta(&meta, "metadata").is_empty(), "{json}");
            assert!(
                meta.generate_name
                    .is_some_and(|g| g.starts_with("example-"))
            );
            json
        };
        // Decoding into the type and back loses nothing: no field the schema lacks.
        fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(v: &Value) -> T {
            let t: T = serde_json::from_value(v.clone()).expect("decodes");
            let back = serde_json::to_value(&t).expect("encodes");
            assert_eq!(back["spec"], v["spec"]);
            t
        }
        let vm: VirtualMachine = round_trip(&example("virtualmachines"));
        assert!(validate_vm(&vm).is_empty(), "{:?}", validate_vm(&vm));
        let vmi: VirtualMachineInstance = round_trip(&example("virtualmachineinstances"));
        assert!(validate_vmi(&vmi).is_empty(), "{:?}", validate_vmi(&vmi));
        let vmim: VirtualMachineInstanceMigration =
            round_trip(&example("virtualmachineinstancemigrations"));
        assert!(validate_migration(&vmim).is_empty());
        // KubeVirt is stored by kube-apiserver: no promise made there; swagger 2.0 has no
        // place for a body example.
        assert!(
            doc["paths"]["/apis/kubevirt.io/v1/namespaces/{namespace}/kubevirts"]["post"]
                ["requestBody"]["content"][JSON]
                .get("example")
                .is_none()
        );
        assert!(
            !serde_json::to_string(&openapi_v2())
                .expect("v2")
                .contains("example-vm-")
        );
    }

    /// JSON null for an optional meta field means "not set" (the server takes it, as
    /// kube-apiserver does), and the v3 schema says so; v2 has no `nullable`.
    #[test]
    fn optional_meta_fields_are_nullable_in_v3_only() {
        let doc = v3();
        let delete = &doc["components"]["schemas"][&format!("{META_PREFIX}DeleteOptions")];
        assert_eq!(delete["properties"]["propagationPolicy"]["nullable"], true);
        assert_eq!(delete["properties"]["dryRun"]["nullable"], true);
        let v2 = openapi_v2();
        assert!(
            v2["definitions"][&format!("{META_PREFIX}DeleteOptions")]["properties"]
                ["propagationPolicy"]
                .get("nullable")
                .is_none()
        );
        // Parameters say what the server accepts.
        let create = &doc["paths"]["/apis/kubevirt.io/v1/namespaces/{namespace}/virtualmachines"]["post"]
            ["parameters"];
        let param = |n: &str| {
            create
                .as_array()
                .expect("params")
                .iter()
                .find(|p| p["name"] == n)
                .expect("param")["schema"]
                .clone()
        };
        assert_eq!(param("dryRun")["enum"], json!(["All"]));
        assert_eq!(param("fieldManager")["maxLength"], 128);
        assert_eq!(
            param("fieldValidation")["enum"],
            json!(["", "Ignore", "Warn", "Strict"])
        );
    }

    #[test]
    fn paths_and_operations() {
        for (doc, flavor) in [(v3(), Flavor::V3), (openapi_v2(), Flavor::V2)] {
            let paths = doc["paths"].as_object().expect("paths");
            for (plural, kind) in [
                ("virtualmachines", "VirtualMachine"),
                ("virtualmachineinstances", "VirtualMachineInstance"),
                (
                    "virtualmachineinstancemigrations",
                    "VirtualMachineInstanceMigration",
                ),
            ] {
                let base = format!("/apis/kubevirt.io/v1/namespaces/{{namespace}}/{plural}");
                let expect = [
                    (
                        format!("/apis/kubevirt.io/v1/{plural}"),
                        vec![("get", "list")],
                    ),
                    (
                        base.clone(),
                        vec![
                            ("get", "list"),
                            ("post", "post"),
                            ("delete", "deletecollection"),
                        ],
                    ),
                    (
                        format!("{base}/{{name}}"),
                        vec![
                            ("get", "get"),
                            ("put", "put"),
                            ("patch", "patch"),
                            ("delete", "delete"),
                        ],
                    ),
                    (
                        format!("{base}/{{name}}/status"),
                        vec![("get", "get"), ("put", "put"), ("patch", "patch")],
                    ),
                ];
                for (path, ops) in expect {
                    let item = paths.get(&path).unwrap_or_else(|| panic!("{path}"));
                    for (method, action) in ops {
                        let op = &item[method];
                        assert_eq!(op["x-kubernetes-action"], action, "{path} {method}");
                        assert_eq!(
                            op["x-kubernetes-group-version-kind"],
                            json!({"group": "kubevirt.io", "kind": kind, "version": "v1"})
                        );
                    }
                }
                let list = &paths[&base]["get"];
                let names: Vec<&str> = list["parameters"]
                    .as_array()
                    .expect("params")
                    .iter()
                    .filter_map(|p| p["name"].as_str())
                    .collect();
                for n in [
                    "labelSelector",
                    "fieldSelector",
                    "limit",
                    "continue",
                    "resourceVersion",
                    "resourceVersionMatch",
                    "watch",
                    "allowWatchBookmarks",
                    "sendInitialEvents",
                    "timeoutSeconds",
                ] {
                    assert!(names.contains(&n), "{n}");
                }
                let patch = &paths[&format!("{base}/{{name}}")]["patch"];
                let names: Vec<&str> = patch["parameters"]
                    .as_array()
                    .expect("params")
                    .iter()
                    .filter_map(|p| p["name"].as_str())
                    .collect();
                for n in ["dryRun", "fieldManager", "fieldValidation", "force"] {
                    assert!(names.contains(&n), "{n}");
                }
                let content_types: Vec<String> = match flavor {
                    Flavor::V3 => patch["requestBody"]["content"]
                        .as_object()
                        .expect("content")
                        .keys()
                        .cloned()
                        .collect(),
                    Flavor::V2 => {
                        serde_json::from_value(patch["consumes"].clone()).expect("consumes")
                    }
                };
                assert_eq!(content_types, PATCH_TYPES.map(String::from).to_vec());
            }
        }
    }

    #[test]
    fn subresource_document() {
        let doc = openapi_v3_group_version(V3_SUBRESOURCES).expect("doc");
        let paths = doc["paths"].as_object().expect("paths");
        let p = "/apis/subresources.kubevirt.io/v1/namespaces/{namespace}";
        for a in ["start", "stop", "restart", "migrate"] {
            let op = &paths[&format!("{p}/virtualmachines/{{name}}/{a}")]["put"];
            assert_eq!(op["x-kubernetes-action"], "put");
            assert!(op["responses"].get("202").is_some());
        }
        for a in ["pause", "unpause", "softreboot"] {
            assert!(paths[&format!("{p}/virtualmachineinstances/{{name}}/{a}")]["put"].is_object());
        }
        for s in ["console", "vnc"] {
            let op = &paths[&format!("{p}/virtualmachineinstances/{{name}}/{s}")]["get"];
            assert_eq!(op["x-kubernetes-action"], "connect");
        }
        assert_eq!(
            doc["components"]["schemas"]["io.kubevirt.subresources.v1.StartOptions"]["x-kubernetes-group-version-kind"],
            json!([{"group": "subresources.kubevirt.io", "kind": "StartOptions", "version": "v1"}])
        );
        // The kinds' document must not carry subresource paths and vice versa.
        assert!(
            v3()["paths"]
                .as_object()
                .expect("paths")
                .keys()
                .all(|k| k.starts_with("/apis/kubevirt.io/"))
        );
        assert!(
            paths
                .keys()
                .all(|k| k.starts_with("/apis/subresources.kubevirt.io/"))
        );
    }

    #[test]
    fn v3_documents_parse_as_openapi_3() {
        for key in v3_group_versions() {
            let doc = openapi_v3_group_version(&key).expect("doc");
            let parsed: openapiv3::OpenAPI =
                serde_json::from_value(doc).unwrap_or_else(|e| panic!("{key}: {e}"));
            assert!(!parsed.paths.paths.is_empty());
            for (path, item) in parsed.paths.iter() {
                let item = item.as_item().unwrap_or_else(|| panic!("{path}"));
                assert!(item.iter().count() > 0, "{path}");
                for (_, op) in item.iter() {
                    assert!(op.extensions.contains_key("x-kubernetes-action"), "{path}");
                    assert!(
                        op.extensions
                            .contains_key("x-kubernetes-group-version-kind")
                    );
                }
            }
        }
    }

    #[test]
    fn v2_has_no_v3_constructs() {
        let v2 = openapi_v2();
        let mut all = Vec::new();
        walk(&v2, &mut all);
        for node in all {
            if let Some(m) = node.as_object() {
                assert!(!m.contains_key("nullable"), "{node}");
                assert!(!m.contains_key("requestBody"));
                assert!(
                    !m.contains_key("anyOf") && !m.contains_key("oneOf"),
                    "{node}"
                );
            }
        }
        assert_eq!(v2["swagger"], "2.0");
    }
}
