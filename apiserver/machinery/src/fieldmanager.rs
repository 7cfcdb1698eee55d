//! Server-side apply and `metadata.managedFields` (R8.10.4).
//!
//! No Rust implementation of Kubernetes' structured-merge-diff exists, so this is a small
//! schema-driven one. Objects are handled as JSON; the only schema knowledge needed is
//! which lists are associative (`x-kubernetes-list-type: map` + keys) or sets, which the
//! caller supplies as a lookup (see [`ListTypes`]). Every other list is atomic, as for
//! CRDs.
//!
//! Model: an object is flattened into "owned paths": scalar leaves, atomic lists, empty
//! objects, set items and associative-list items (the item itself *and* its fields).
//! Each managedFields entry owns a set of such paths, encoded as the FieldsV1 trie.
//!
//! Use from the REST layer:
//!
//! ```
//! use serde_json::json;
//! use virt_apimachinery::fieldmanager::{apply, update, ListTypes};
//!
//! let lists = ListTypes::cached("VirtualMachine").expect("served kind");
//! let keys = |p: &[_]| lists.get(p);
//! let now = "2026-01-01T00:00:00Z";
//! // POST (create) by kubectl: record an Update entry.
//! let vm = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
//!                 "metadata": {"name": "vm1"}, "spec": {"runStrategy": "Always"}});
//! let stored = update(None, &vm, "kubectl-create", None, now, &keys);
//! // PATCH application/apply-patch+yaml?fieldManager=kubectl: a different value conflicts.
//! let intent = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
//!                     "metadata": {"name": "vm1"}, "spec": {"runStrategy": "Halted"}});
//! let err = apply(Some(&stored), &intent, "kubectl", false, now, &keys).unwrap_err();
//! assert!(err.to_string().starts_with("Apply failed with 1 conflict"));
//! // With force=true the applier takes the field over.
//! let merged = apply(Some(&stored), &intent, "kubectl", true, now, &keys).unwrap();
//! assert_eq!(merged["spec"]["runStrategy"], "Halted");
//! ```
//!
//! Call [`apply`]/[`update`] before defaulting: fields the server adds afterwards are owned
//! by nobody, as in kube-apiserver.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::OnceLock;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::StatusCause;
use serde_json::{Map, Value, json};

// ---------------------------------------------------------------------------------------
// Paths and field sets
// ---------------------------------------------------------------------------------------

/// One step of a field path, as in the FieldsV1 encoding.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathElement {
    /// `f:<name>`: an object field.
    Field(String),
    /// `k:<json>`: an associative-list item, by its key fields (canonical JSON, keys sorted).
    Key(String),
    /// `v:<json>`: a set item, by its value (canonical JSON).
    Value(String),
    /// `i:<n>`: a list item by position (only for items that lack their keys).
    Index(usize),
}

impl PathElement {
    /// The FieldsV1 trie key.
    pub fn encode(&self) -> String {
        match self {
            PathElement::Field(n) => format!("f:{n}"),
            PathElement::Key(k) => format!("k:{k}"),
            PathElement::Value(v) => format!("v:{v}"),
            PathElement::Index(i) => format!("i:{i}"),
        }
    }

    /// Parses a FieldsV1 trie key.
    pub fn decode(s: &str) -> Option<Self> {
        let (prefix, rest) = s.split_at_checked(2)?;
        match prefix {
            "f:" => Some(PathElement::Field(rest.to_string())),
            "k:" => match serde_json::from_str::<Value>(rest).ok()? {
                v @ Value::Object(_) => Some(PathElement::Key(canonical_json(&v))),
                _ => None,
            },
            "v:" => Some(PathElement::Value(canonical_json(
                &serde_json::from_str::<Value>(rest).ok()?,
            ))),
            "i:" => rest.parse().ok().map(PathElement::Index),
            _ => None,
        }
    }

    /// The key element of an associative-list item, `None` if a key field is missing.
    fn for_item(item: &Value, keys: &[String]) -> Option<Self> {
        let obj = item.as_object()?;
        let mut sorted: Vec<&String> = keys.iter().collect();
        sorted.sort();
        let mut key = Map::new();
        for k in sorted {
            let v = obj.get(k.as_str()).filter(|v| !v.is_null())?;
            key.insert(k.clone(), v.clone());
        }
        Some(PathElement::Key(canonical_json(&Value::Object(key))))
    }
}

/// Renders like Kubernetes' conflict messages: `.spec.volumes[name="disk0"].containerDisk`.
impl fmt::Display for PathElement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PathElement::Field(n) => write!(f, ".{n}"),
            PathElement::Key(k) => {
                let parsed: Map<String, Value> = serde_json::from_str(k).unwrap_or_default();
                let parts: Vec<String> = parsed.iter().map(|(k, v)| format!("{k}={v}")).collect();
                write!(f, "[{}]", parts.join(","))
            }
            PathElement::Value(v) => write!(f, "[={v}]"),
            PathElement::Index(i) => write!(f, "[{i}]"),
        }
    }
}

/// A field path from the object root.
pub type Path = Vec<PathElement>;

/// `.spec.runStrategy`-style rendering of a path.
pub fn path_string(path: &[PathElement]) -> String {
    path.iter().map(ToString::to_string).collect()
}

/// JSON text with object keys sorted, so equal values give equal path elements.
fn canonical_json(v: &Value) -> String {
    fn sort(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let sorted: BTreeMap<&String, Value> =
                    m.iter().map(|(k, v)| (k, sort(v))).collect();
                Value::Object(sorted.into_iter().map(|(k, v)| (k.clone(), v)).collect())
            }
            Value::Array(a) => Value::Array(a.iter().map(sort).collect()),
            other => other.clone(),
        }
    }
    serde_json::to_string(&sort(v)).unwrap_or_default()
}

/// A set of owned paths.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSet(BTreeSet<Path>);

impl FieldSet {
    /// The empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the set contains `path`.
    pub fn contains(&self, path: &[PathElement]) -> bool {
        self.0.contains(path)
    }

    /// Adds a path.
    pub fn insert(&mut self, path: Path) {
        self.0.insert(path);
    }

    /// The paths, sorted.
    pub fn iter(&self) -> impl Iterator<Item = &Path> {
        self.0.iter()
    }

    /// Number of paths.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The FieldsV1 trie: `{"f:spec":{"f:running":{}}}`; `"."` marks a path that is owned
    /// itself and also has owned descendants (associative-list items).
    pub fn to_fields_v1(&self) -> Value {
        #[derive(Default)]
        struct Trie {
            member: bool,
            children: BTreeMap<String, Trie>,
        }
        fn render(t: &Trie) -> Value {
            let mut m = Map::new();
            if t.member && !t.children.is_empty() {
                m.insert(".".into(), json!({}));
            }
            for (k, c) in &t.children {
                m.insert(k.clone(), render(c));
            }
            Value::Object(m)
        }
        let mut root = Trie::default();
        for path in &self.0 {
            let mut node = &mut root;
            for el in path {
                node = node.children.entry(el.encode()).or_default();
            }
            node.member = true;
        }
        render(&root)
    }

    /// Parses a FieldsV1 trie.
    pub fn from_fields_v1(v: &Value) -> Result<Self, ApplyError> {
        fn walk(v: &Value, path: &mut Path, out: &mut BTreeSet<Path>) -> Result<(), ApplyError> {
            let Value::Object(m) = v else {
                return Err(ApplyError::Invalid(format!(
                    "invalid FieldsV1 at {}: not an object",
                    path_string(path)
                )));
            };
            for (k, child) in m {
                if k == "." {
                    if !path.is_empty() {
                        out.insert(path.clone());
                    }
                    continue;
                }
                let el = PathElement::decode(k)
                    .ok_or_else(|| ApplyError::Invalid(format!("invalid FieldsV1 key {k:?}")))?;
                path.push(el);
                if child.as_object().is_some_and(Map::is_empty) {
                    out.insert(path.clone());
                } else {
                    walk(child, path, out)?;
                }
                path.pop();
            }
            Ok(())
        }
        let mut out = BTreeSet::new();
        walk(v, &mut Vec::new(), &mut out)?;
        Ok(Self(out))
    }
}

impl FromIterator<Path> for FieldSet {
    fn from_iter<I: IntoIterator<Item = Path>>(iter: I) -> Self {
        Self(iter.into_iter().collect())
    }
}

// ---------------------------------------------------------------------------------------
// managedFields entries
// ---------------------------------------------------------------------------------------

/// `operation` of a managedFields entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Operation {
    /// Server-side apply.
    Apply,
    /// Any other write (create, update, JSON/merge patch).
    Update,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Apply => "Apply",
            Operation::Update => "Update",
        }
    }
}

/// One decoded `metadata.managedFields` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagedFieldsEntry {
    /// Field manager name.
    pub manager: String,
    /// Apply or Update.
    pub operation: Operation,
    /// API version the fields were written with.
    pub api_version: String,
    /// RFC 3339 time of the last change of this entry.
    pub time: Option<String>,
    /// `status` for writes through the status subresource.
    pub subresource: Option<String>,
    /// Owned fields.
    pub fields: FieldSet,
}

impl ManagedFieldsEntry {
    fn same_identity(&self, manager: &str, op: Operation, subresource: Option<&str>) -> bool {
        self.manager == manager
            && self.operation == op
            && self.subresource.as_deref() == subresource
    }

    fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("manager".into(), Value::String(self.manager.clone()));
        m.insert(
            "operation".into(),
            Value::String(self.operation.as_str().into()),
        );
        m.insert("apiVersion".into(), Value::String(self.api_version.clone()));
        if let Some(t) = &self.time {
            m.insert("time".into(), Value::String(t.clone()));
        }
        m.insert("fieldsType".into(), Value::String("FieldsV1".into()));
        m.insert("fieldsV1".into(), self.fields.to_fields_v1());
        if let Some(s) = &self.subresource {
            m.insert("subresource".into(), Value::String(s.clone()));
        }
        Value::Object(m)
    }

    fn from_json(v: &Value) -> Option<Self> {
        let operation = match v.get("operation")?.as_str()? {
            "Apply" => Operation::Apply,
            "Update" => Operation::Update,
            _ => return None,
        };
        if v.get("fieldsType")
            .and_then(Value::as_str)
            .unwrap_or("FieldsV1")
            != "FieldsV1"
        {
            return None;
        }
        let fields = match v.get("fieldsV1") {
            Some(f) => FieldSet::from_fields_v1(f).ok()?,
            None => FieldSet::new(),
        };
        Some(Self {
            manager: v.get("manager")?.as_str()?.to_string(),
            operation,
            api_version: v
                .get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            time: v.get("time").and_then(Value::as_str).map(str::to_string),
            subresource: v
                .get("subresource")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string),
            fields,
        })
    }
}

/// Decodes `metadata.managedFields`. Entries that do not decode are dropped, as
/// kube-apiserver drops undecodable managedFields rather than failing the write.
pub fn managed_fields(obj: &Value) -> Vec<ManagedFieldsEntry> {
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(ManagedFieldsEntry::from_json).collect())
        .unwrap_or_default()
}

/// Writes entries into `metadata.managedFields` in kube-apiserver's order (Apply before
/// Update, then by time, manager, apiVersion, subresource); drops empty entries.
fn set_managed_fields(obj: &mut Value, mut entries: Vec<ManagedFieldsEntry>) {
    entries.retain(|e| !e.fields.is_empty());
    entries.sort_by(|a, b| {
        (
            a.operation,
            &a.time,
            &a.manager,
            &a.api_version,
            &a.subresource,
        )
            .cmp(&(
                b.operation,
                &b.time,
                &b.manager,
                &b.api_version,
                &b.subresource,
            ))
    });
    let Some(root) = obj.as_object_mut() else {
        return;
    };
    let meta = root
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(meta) = meta.as_object_mut() else {
        return;
    };
    if entries.is_empty() {
        meta.remove("managedFields");
    } else {
        meta.insert(
            "managedFields".into(),
            Value::Array(entries.iter().map(ManagedFieldsEntry::to_json).collect()),
        );
    }
}

// ---------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------

/// A field owned by another manager that an apply would change.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Conflict {
    /// The other manager.
    pub manager: String,
    /// Its operation: the applier's own `Update` entry is another manager too.
    pub operation: Operation,
    /// Its apiVersion.
    pub api_version: String,
    /// Its subresource, if it wrote through one.
    pub subresource: Option<String>,
    /// The field, e.g. `.spec.runStrategy`.
    pub field: String,
}

impl Conflict {
    fn who(&self) -> String {
        let mut s = format!("{:?}", self.manager);
        if let Some(sub) = &self.subresource {
            s.push_str(&format!(" with subresource {sub:?}"));
        }
        if !self.api_version.is_empty() {
            s.push_str(&format!(" using {}", self.api_version));
        }
        s
    }

    /// The Status cause message: `conflict with "<manager>" using kubevirt.io/v1`.
    pub fn cause_message(&self) -> String {
        format!("conflict with {}", self.who())
    }
}

fn conflicts_message(conflicts: &[Conflict]) -> String {
    let n = conflicts.len();
    let head = format!(
        "Apply failed with {n} conflict{}: ",
        if n == 1 { "" } else { "s" }
    );
    if let [only] = conflicts {
        return format!("{head}conflict with {}: {}", only.who(), only.field);
    }
    let mut groups: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for c in conflicts {
        groups.entry(c.who()).or_default().push(&c.field);
    }
    let mut body = String::from("conflicts with");
    let single_group = groups.len() == 1;
    for (who, fields) in groups {
        body.push_str(if single_group { " " } else { "\n" });
        body.push_str(&who);
        body.push(':');
        for f in fields {
            body.push_str("\n- ");
            body.push_str(f);
        }
    }
    format!("{head}{body}")
}

/// Why an apply failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// Fields owned by other managers would change; answer 409 Conflict with
    /// [`ApplyError::causes`]. Retrying with `force=true` takes them over.
    #[error("{}", conflicts_message(.0))]
    Conflicts(Vec<Conflict>),
    /// The applied configuration is malformed (not an object, list item without its key,
    /// duplicate keys); answer 422 or 400.
    #[error("{0}")]
    Invalid(String),
}

impl ApplyError {
    /// `details.causes` of the 409 Status: one `FieldManagerConflict` per field.
    pub fn causes(&self) -> Vec<StatusCause> {
        match self {
            ApplyError::Conflicts(cs) => cs
                .iter()
                .map(|c| StatusCause {
                    reason: Some("FieldManagerConflict".into()),
                    message: Some(c.cause_message()),
                    field: Some(c.field.clone()),
                })
                .collect(),
            ApplyError::Invalid(_) => Vec::new(),
        }
    }
}

// ---------------------------------------------------------------------------------------
// List semantics
// ---------------------------------------------------------------------------------------

/// Lookup of list semantics by path: `Some(keys)` for an associative list, `Some([])` for
/// a set, `None` for an atomic list. Paths contain the list items' elements (`Key`, …).
pub type ListMapKeys<'a> = &'a dyn Fn(&[PathElement]) -> Option<Vec<String>>;

#[derive(Debug, Clone, PartialEq, Eq)]
enum ListKind {
    Atomic,
    Set,
    Map(Vec<String>),
}

fn list_kind(path: &[PathElement], lists: ListMapKeys<'_>) -> ListKind {
    // ObjectMeta's lists are the same everywhere (and the k8s-openapi schema lacks the
    // extensions), so they are known here rather than asked of every caller.
    if let [.., PathElement::Field(m), PathElement::Field(f)] = path
        && m == "metadata"
    {
        match f.as_str() {
            "finalizers" => return ListKind::Set,
            "ownerReferences" => return ListKind::Map(vec!["uid".into()]),
            _ => {}
        }
    }
    match lists(path) {
        Some(k) if k.is_empty() => ListKind::Set,
        Some(k) => ListKind::Map(k),
        None => ListKind::Atomic,
    }
}

/// List semantics of a kind's schema: every array with `x-kubernetes-list-type: map`
/// (keys from `x-kubernetes-list-map-keys`) or `set`.
#[derive(Debug, Clone, Default)]
pub struct ListTypes {
    root: SchemaNode,
}

#[derive(Debug, Clone, Default)]
struct SchemaNode {
    properties: BTreeMap<String, SchemaNode>,
    additional: Option<Box<SchemaNode>>,
    items: Option<Box<SchemaNode>>,
    list: Option<Vec<String>>,
}

impl ListTypes {
    /// Walks an (inline) OpenAPI v3 schema; `$ref`s are not followed.
    pub fn from_schema(schema: &Value) -> Self {
        Self {
            root: Self::node(schema, 0),
        }
    }

    /// The list semantics of one of our kinds, from its published OpenAPI schema.
    /// Generating the schema takes a few milliseconds; [`ListTypes::cached`] keeps them.
    pub fn for_kind(kind: &str) -> Option<Self> {
        crate::openapi::kind_schema(kind).map(|s| Self::from_schema(&s))
    }

    /// [`ListTypes::for_kind`], computed once per process for every kind we serve.
    pub fn cached(kind: &str) -> Option<&'static Self> {
        static CACHE: OnceLock<BTreeMap<&'static str, ListTypes>> = OnceLock::new();
        CACHE
            .get_or_init(|| {
                kubevirt_api::catalogue::all_kinds()
                    .filter_map(|k| Some((k.kind, Self::for_kind(k.kind)?)))
                    .collect()
            })
            .get(kind)
    }

    fn node(schema: &Value, depth: usize) -> SchemaNode {
        let mut node = SchemaNode::default();
        // Generated schemas are inline and acyclic; the bound only guards odd input.
        if depth > 64 {
            return node;
        }
        if let Some(Value::Array(all)) = schema.get("allOf") {
            for s in all {
                let sub = Self::node(s, depth + 1);
                node.properties.extend(sub.properties);
                node.additional = node.additional.or(sub.additional);
                node.items = node.items.or(sub.items);
                node.list = node.list.or(sub.list);
            }
        }
        if let Some(Value::Object(props)) = schema.get("properties") {
            for (k, s) in props {
                node.properties.insert(k.clone(), Self::node(s, depth + 1));
            }
        }
        if let Some(s @ Value::Object(_)) = schema.get("additionalProperties") {
            node.additional = Some(Box::new(Self::node(s, depth + 1)));
        }
        if let Some(s @ Value::Object(_)) = schema.get("items") {
            node.items = Some(Box::new(Self::node(s, depth + 1)));
        }
        match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
            Some("map") => {
                let keys: Vec<String> = schema
                    .get("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(Value::as_str)
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default();
                // A map without keys cannot be merged by key; atomic is the safe reading.
                if !keys.is_empty() {
                    node.list = Some(keys);
                }
            }
            Some("set") => node.list = Some(Vec::new()),
            _ => {}
        }
        node
    }

    /// List semantics at `path` (see [`ListMapKeys`]).
    pub fn get(&self, path: &[PathElement]) -> Option<Vec<String>> {
        let mut node = &self.root;
        for el in path {
            node = match el {
                PathElement::Field(n) => node.properties.get(n).or(node.additional.as_deref())?,
                _ => node.items.as_deref()?,
            };
        }
        node.list.clone()
    }
}

// ---------------------------------------------------------------------------------------
// Flattening, removal, merging
// ---------------------------------------------------------------------------------------

/// Which part of an object a write manages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    /// The main resource: everything but `status`.
    Main,
    /// The status subresource: only `status`.
    Status,
    /// Everything (to know which owned paths still exist).
    All,
}

impl Scope {
    fn of(subresource: Option<&str>) -> Self {
        match subresource {
            Some("status") => Scope::Status,
            _ => Scope::Main,
        }
    }
}

/// Fields set by the server or naming the object; nobody owns them.
const UNOWNED_META: [&str; 10] = [
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
    "managedFields",
];

/// Server-controlled metadata an apply must not write (name/namespace stay: they must
/// match anyway, and a create needs them).
const SERVER_META: [&str; 8] = [
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
    "managedFields",
];

/// The part of `obj` whose fields can be owned in `scope`.
fn ownable(obj: &Value, scope: Scope) -> Value {
    let Some(m) = obj.as_object() else {
        return Value::Object(Map::new());
    };
    let mut out = Map::new();
    for (k, v) in m {
        let keep = match (k.as_str(), scope) {
            ("apiVersion" | "kind", _) => false,
            ("status", Scope::Main) => false,
            ("status", _) => true,
            (_, Scope::Status) => false,
            _ => true,
        };
        if !keep {
            continue;
        }
        if k == "metadata"
            && let Some(meta) = v.as_object()
        {
            let meta: Map<String, Value> = meta
                .iter()
                .filter(|(k, _)| !UNOWNED_META.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if !meta.is_empty() {
                out.insert(k.clone(), Value::Object(meta));
            }
            continue;
        }
        out.insert(k.clone(), v.clone());
    }
    Value::Object(out)
}

/// What a flattened path holds.
#[derive(Debug, Clone, PartialEq)]
enum Leaf {
    Scalar(Value),
    Item,
}

type Flat = BTreeMap<Path, Leaf>;

/// Flattens an object into its owned paths. `strict` rejects associative-list items
/// without keys and duplicate keys (applied configurations); otherwise such items are
/// tracked by index or skipped (stored objects written before the rules applied).
fn flatten(
    v: &Value,
    path: &mut Path,
    lists: ListMapKeys<'_>,
    strict: bool,
    out: &mut Flat,
) -> Result<(), ApplyError> {
    match v {
        Value::Null => {}
        Value::Object(m) if m.is_empty() => {
            if !path.is_empty() {
                out.insert(path.clone(), Leaf::Scalar(json!({})));
            }
        }
        Value::Object(m) => {
            for (k, c) in m {
                path.push(PathElement::Field(k.clone()));
                let r = flatten(c, path, lists, strict, out);
                path.pop();
                r?;
            }
        }
        Value::Array(items) => match list_kind(path, lists) {
            ListKind::Atomic => {
                out.insert(path.clone(), Leaf::Scalar(v.clone()));
            }
            ListKind::Set => {
                for item in items.iter().filter(|i| !i.is_null()) {
                    path.push(PathElement::Value(canonical_json(item)));
                    let dup = out
                        .insert(path.clone(), Leaf::Scalar(item.clone()))
                        .is_some();
                    let p = path_string(path);
                    path.pop();
                    if dup && strict {
                        return Err(ApplyError::Invalid(format!(
                            "{}: duplicate entries for set value {p}",
                            path_string(path)
                        )));
                    }
                }
            }
            ListKind::Map(keys) => {
                for (i, item) in items.iter().enumerate() {
                    let el = match PathElement::for_item(item, &keys) {
                        Some(el) => el,
                        None if strict => {
                            return Err(ApplyError::Invalid(format!(
                                "{}: element {i}: associative list with keys has an element that omits key field(s) {}",
                                path_string(path),
                                keys.iter()
                                    .map(|k| format!("{k:?}"))
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            )));
                        }
                        None => PathElement::Index(i),
                    };
                    path.push(el);
                    if out.contains_key(path.as_slice()) {
                        let p = path_string(path);
                        path.pop();
                        if strict {
                            return Err(ApplyError::Invalid(format!(
                                "{}: duplicate entries for key {}",
                                path_string(path),
                                p.rsplit_once('[')
                                    .map(|(_, k)| format!("[{k}"))
                                    .unwrap_or(p.clone())
                            )));
                        }
                        continue;
                    }
                    out.insert(path.clone(), Leaf::Item);
                    let r = match item.as_object() {
                        Some(m) => m.iter().try_for_each(|(k, c)| {
                            path.push(PathElement::Field(k.clone()));
                            let r = flatten(c, path, lists, strict, out);
                            path.pop();
                            r
                        }),
                        None => Ok(()),
                    };
                    path.pop();
                    r?;
                }
            }
        },
        scalar => {
            out.insert(path.clone(), Leaf::Scalar(scalar.clone()));
        }
    }
    Ok(())
}

fn flat_of(obj: &Value, scope: Scope, lists: ListMapKeys<'_>) -> Flat {
    let mut out = Flat::new();
    // Stored objects are flattened leniently, which cannot fail.
    let _ = flatten(
        &ownable(obj, scope),
        &mut Vec::new(),
        lists,
        false,
        &mut out,
    );
    out
}

/// Removes one owned path from `v`; objects and lists emptied by the removal go too, so
/// dropping a manager's last label does not leave `labels: {}` behind.
fn remove_path(v: &mut Value, path: &[PathElement], prefix: &mut Path, lists: ListMapKeys<'_>) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    match (first, v) {
        (PathElement::Field(name), Value::Object(m)) => {
            if rest.is_empty() {
                m.remove(name);
                return;
            }
            if let Some(child) = m.get_mut(name) {
                prefix.push(first.clone());
                remove_path(child, rest, prefix, lists);
                prefix.pop();
                if is_empty_container(child) {
                    m.remove(name);
                }
            }
        }
        (PathElement::Key(_), Value::Array(items)) => {
            let ListKind::Map(keys) = list_kind(prefix, lists) else {
                return;
            };
            let Some(idx) = items
                .iter()
                .position(|it| PathElement::for_item(it, &keys).as_ref() == Some(first))
            else {
                return;
            };
            if rest.is_empty() {
                items.remove(idx);
            } else {
                prefix.push(first.clone());
                remove_path(&mut items[idx], rest, prefix, lists);
                prefix.pop();
            }
        }
        (PathElement::Value(val), Value::Array(items)) => {
            items.retain(|it| &canonical_json(it) != val);
        }
        // Index paths only name key-less items of old objects; leave those alone.
        _ => {}
    }
}

fn is_empty_container(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

/// Merges `applied` into `live`: objects field by field, associative lists by key,
/// sets by value; everything else (scalars, atomic lists) is replaced.
fn merge(live: &mut Value, applied: &Value, path: &mut Path, lists: ListMapKeys<'_>) {
    match (live, applied) {
        (Value::Object(l), Value::Object(a)) => {
            for (k, av) in a {
                if av.is_null() {
                    continue;
                }
                path.push(PathElement::Field(k.clone()));
                match l.get_mut(k) {
                    Some(lv) => merge(lv, av, path, lists),
                    None => {
                        l.insert(k.clone(), av.clone());
                    }
                }
                path.pop();
            }
        }
        (Value::Array(l), Value::Array(a)) => match list_kind(path, lists) {
            ListKind::Map(keys) => {
                let mut rest: Vec<Option<Value>> = l.drain(..).map(Some).collect();
                let mut out = Vec::with_capacity(a.len() + rest.len());
                for item in a {
                    let key = PathElement::for_item(item, &keys);
                    let found = key.as_ref().and_then(|k| {
                        rest.iter().position(|r| {
                            r.as_ref()
                                .and_then(|r| PathElement::for_item(r, &keys))
                                .as_ref()
                                == Some(k)
                        })
                    });
                    match (found, key) {
                        (Some(i), Some(k)) => {
                            let mut merged = rest[i].take().unwrap_or(Value::Null);
                            path.push(k);
                            merge(&mut merged, item, path, lists);
                            path.pop();
                            out.push(merged);
                        }
                        _ => out.push(item.clone()),
                    }
                }
                // Items only the live object has (owned by others) keep their order after
                // the applied ones.
                out.extend(rest.into_iter().flatten());
                *l = out;
            }
            ListKind::Set => {
                let mut out: Vec<Value> = Vec::new();
                for v in a.iter().chain(l.iter()) {
                    if !v.is_null() && !out.contains(v) {
                        out.push(v.clone());
                    }
                }
                *l = out;
            }
            ListKind::Atomic => *l = a.clone(),
        },
        (live, applied) => *live = applied.clone(),
    }
}

fn strip_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, v| !v.is_null());
            m.values_mut().for_each(strip_nulls);
        }
        Value::Array(a) => a.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

/// The part of an applied configuration that is merged into the live object.
fn merge_input(applied: &Value, scope: Scope) -> Value {
    let mut v = applied.clone();
    strip_nulls(&mut v);
    let Some(m) = v.as_object_mut() else {
        return v;
    };
    match scope {
        Scope::Status => {
            let status = m.remove("status");
            let mut out = Map::new();
            if let Some(s) = status {
                out.insert("status".into(), s);
            }
            Value::Object(out)
        }
        Scope::Main | Scope::All => {
            if scope == Scope::Main {
                m.remove("status");
            }
            if let Some(Value::Object(meta)) = m.get_mut("metadata") {
                meta.retain(|k, _| !SERVER_META.contains(&k.as_str()));
            }
            v
        }
    }
}

fn api_version_of(objs: &[Option<&Value>]) -> String {
    objs.iter()
        .flatten()
        .find_map(|o| o.get("apiVersion").and_then(Value::as_str))
        .unwrap_or_default()
        .to_string()
}

fn without_managed_fields(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(Value::Object(meta)) = v.get_mut("metadata") {
        meta.remove("managedFields");
    }
    v
}

// ---------------------------------------------------------------------------------------
// Apply and Update
// ---------------------------------------------------------------------------------------

/// Server-side apply of `applied` (the caller's intent) by `manager` to the main resource.
///
/// Returns the merged object with updated `metadata.managedFields`; `live` is `None` when
/// the object does not exist yet (apply creates). Server-set metadata (uid,
/// resourceVersion, generation, creationTimestamp) and `status` are neither merged nor
/// owned. `now` is the RFC 3339 time recorded for changed entries.
pub fn apply(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    now: &str,
    list_map_keys: ListMapKeys<'_>,
) -> Result<Value, ApplyError> {
    apply_subresource(live, applied, manager, None, force, now, list_map_keys)
}

/// [`apply`] through a subresource: with `Some("status")` only `status` is merged and
/// owned, and the entry records `subresource: status`.
pub fn apply_subresource(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    subresource: Option<&str>,
    force: bool,
    now: &str,
    list_map_keys: ListMapKeys<'_>,
) -> Result<Value, ApplyError> {
    let lists = list_map_keys;
    if !applied.is_object() {
        return Err(ApplyError::Invalid(
            "the applied configuration must be an object".into(),
        ));
    }
    // Ownership is the server's bookkeeping; an applier cannot state it (kube-apiserver
    // answers 400 with this message).
    if applied
        .pointer("/metadata/managedFields")
        .is_some_and(|m| !m.is_null())
    {
        return Err(ApplyError::Invalid(
            "metadata.managedFields must be nil".into(),
        ));
    }
    let scope = Scope::of(subresource);
    let empty = Value::Object(Map::new());
    let live_obj = live.unwrap_or(&empty);
    let api_version = api_version_of(&[Some(applied), live]);

    let input = merge_input(applied, scope);
    let mut applied_flat = Flat::new();
    flatten(
        &ownable(&input, scope),
        &mut Vec::new(),
        lists,
        true,
        &mut applied_flat,
    )?;
    let applied_set: FieldSet = applied_flat.keys().cloned().collect();

    let mut entries = managed_fields(live_obj);
    let me = entries
        .iter()
        .position(|e| e.same_identity(manager, Operation::Apply, subresource));
    let previous = me.map(|i| entries[i].fields.clone()).unwrap_or_default();
    let others: BTreeSet<&Path> = entries
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != me)
        .flat_map(|(_, e)| e.fields.iter())
        .collect();

    // Fields this manager applied before and omits now, unless someone else still owns
    // them (or something inside them).
    let keep = |p: &Path| {
        others.contains(p)
            || applied_set.contains(p)
            || others.iter().any(|o| o.len() > p.len() && o.starts_with(p))
            || applied_set
                .iter()
                .any(|o| o.len() > p.len() && o.starts_with(p))
            || is_key_field(p)
    };
    let to_remove: Vec<&Path> = previous.iter().filter(|p| !keep(p)).collect();

    let mut merged = without_managed_fields(live_obj);
    // Sorted order removes an item before its fields, so items are still found by key.
    for p in &to_remove {
        remove_path(&mut merged, p, &mut Vec::new(), lists);
    }
    merge(&mut merged, &input, &mut Vec::new(), lists);

    // Conflicts: others' fields whose value this apply changes (or removes).
    let live_flat = flat_of(live_obj, Scope::All, lists);
    let merged_flat = flat_of(&merged, Scope::All, lists);
    let changed = |p: &Path| {
        let (before, after) = (live_flat.get(p), merged_flat.get(p));
        if before == after {
            return false;
        }
        // Filling an empty object someone owns (`masquerade: {}` → `{…}`) keeps their intent.
        let filled = before == Some(&Leaf::Scalar(json!({})))
            && after.is_none()
            && merged_flat
                .keys()
                .any(|k| k.len() > p.len() && k.starts_with(p));
        !filled
    };
    let mut conflicts = Vec::new();
    let mut conflicting: Vec<(usize, Path)> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if Some(i) == me {
            continue;
        }
        for p in e.fields.iter().filter(|p| changed(p)) {
            conflicts.push(Conflict {
                manager: e.manager.clone(),
                operation: e.operation,
                api_version: e.api_version.clone(),
                subresource: e.subresource.clone(),
                field: path_string(p),
            });
            conflicting.push((i, p.clone()));
        }
    }
    if !conflicts.is_empty() && !force {
        conflicts.sort();
        conflicts.dedup();
        return Err(ApplyError::Conflicts(conflicts));
    }
    for (i, p) in conflicting {
        entries[i].fields.0.remove(&p);
    }

    let content_changed = merged != without_managed_fields(live_obj);
    // Compare what will be recorded: paths that do not exist (an applied `spec: {}` on a
    // non-empty spec) are pruned below and must not count as a change of ownership.
    let applied_set: FieldSet = applied_set
        .iter()
        .filter(|p| merged_flat.contains_key(*p))
        .cloned()
        .collect();
    match me {
        Some(i) => {
            if entries[i].fields != applied_set || content_changed {
                entries[i].time = Some(now.to_string());
            }
            entries[i].fields = applied_set;
            entries[i].api_version = api_version;
        }
        None => entries.push(ManagedFieldsEntry {
            manager: manager.to_string(),
            operation: Operation::Apply,
            api_version,
            time: Some(now.to_string()),
            subresource: subresource.map(str::to_string),
            fields: applied_set,
        }),
    }
    prune(&mut entries, &merged_flat);
    set_managed_fields(&mut merged, entries);
    if live.is_some() && &merged == live_obj {
        return Ok(live_obj.clone());
    }
    Ok(merged)
}

/// Whether `p` is a key field of an associative-list item (`…[name="a"].name`): it stays
/// as long as the item does, or the item could no longer be found by its key.
fn is_key_field(p: &[PathElement]) -> bool {
    match p {
        [.., PathElement::Key(k), PathElement::Field(f)] => {
            serde_json::from_str::<Map<String, Value>>(k).is_ok_and(|m| m.contains_key(f))
        }
        _ => false,
    }
}

/// Drops owned paths that no longer exist in the object.
fn prune(entries: &mut [ManagedFieldsEntry], present: &Flat) {
    for e in entries {
        e.fields.0.retain(|p| present.contains_key(p));
    }
}

/// Records a non-apply write (create, update, JSON/merge patch) by `manager`: it takes
/// ownership of every field it changed (`operation: Update`), other managers lose those
/// fields, and ownership of fields that no longer exist is dropped.
///
/// The managedFields of `old` are the base, unless the request itself set a non-empty,
/// different `metadata.managedFields` (clients may reset them, e.g. with `[{}]`).
pub fn update(
    old: Option<&Value>,
    new: &Value,
    manager: &str,
    operation_subresource: Option<&str>,
    now: &str,
    list_map_keys: ListMapKeys<'_>,
) -> Value {
    let lists = list_map_keys;
    let subresource = operation_subresource;
    let scope = Scope::of(subresource);
    let old_managed = old.and_then(|o| o.pointer("/metadata/managedFields"));
    let new_managed = new.pointer("/metadata/managedFields");
    let requested = new_managed
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty())
        && new_managed != old_managed;
    let mut entries = if requested {
        managed_fields(new)
    } else {
        old.map(managed_fields).unwrap_or_default()
    };

    let empty = Value::Object(Map::new());
    let old_flat = flat_of(old.unwrap_or(&empty), scope, lists);
    let new_flat = flat_of(new, scope, lists);
    let changed: Vec<&Path> = new_flat
        .iter()
        .filter(|(p, v)| old_flat.get(*p) != Some(*v))
        .map(|(p, _)| p)
        .collect();

    if !changed.is_empty() {
        for e in entries.iter_mut() {
            if !e.same_identity(manager, Operation::Update, subresource) {
                for p in &changed {
                    e.fields.0.remove(*p);
                }
            }
        }
        let api_version = api_version_of(&[Some(new), old]);
        let idx = match entries
            .iter()
            .position(|e| e.same_identity(manager, Operation::Update, subresource))
        {
            Some(i) => i,
            None => {
                entries.push(ManagedFieldsEntry {
                    manager: manager.to_string(),
                    operation: Operation::Update,
                    api_version: api_version.clone(),
                    time: None,
                    subresource: subresource.map(str::to_string),
                    fields: FieldSet::new(),
                });
                entries.len() - 1
            }
        };
        let e = &mut entries[idx];
        e.fields.0.extend(changed.into_iter().cloned());
        e.time = Some(now.to_string());
        e.api_version = api_version;
    }

    let present = flat_of(new, Scope::All, lists);
    prune(&mut entries, &present);
    let mut out = new.clone();
    set_managed_fields(&mut out, entries);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const T1: &str = "2026-01-01T00:00:00Z";
    const T2: &str = "2026-01-02T00:00:00Z";
    const T3: &str = "2026-01-03T00:00:00Z";

    fn vmi_lists(path: &[PathElement]) -> Option<Vec<String>> {
        thread_local! {
            static LT: ListTypes = ListTypes::for_kind("VirtualMachine").unwrap_or_default();
        }
        LT.with(|lt| lt.get(path))
    }

    fn no_lists(_: &[PathElement]) -> Option<Vec<String>> {
        None
    }

    fn vm(spec: Value) -> Value {
        json!({
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachine",
            "metadata": {"name": "vm1", "namespace": "default"},
            "spec": spec,
        })
    }

    fn entry<'a>(obj: &'a Value, manager: &str) -> &'a Value {
        obj["metadata"]["managedFields"]
            .as_array()
            .and_then(|a| a.iter().find(|e| e["manager"] == manager))
            .unwrap_or_else(|| panic!("no entry for {manager} in {obj}"))
    }

    fn owns(obj: &Value, manager: &str, path: &str) -> bool {
        managed_fields(obj)
            .iter()
            .filter(|e| e.manager == manager)
            .any(|e| e.fields.iter().any(|p| path_string(p) == path))
    }

    fn ok(r: Result<Value, ApplyError>) -> Value {
        r.unwrap_or_else(|e| panic!("apply failed: {e}"))
    }

    #[test]
    fn fields_v1_matches_kubernetes_docs_example() {
        // The ConfigMap example of the Kubernetes server-side apply documentation.
        let applied = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "test-cm", "namespace": "default", "labels": {"test-label": "test"}},
            "data": {"key": "some value"}
        });
        let out = ok(apply(None, &applied, "kubectl", false, T1, &no_lists));
        assert_eq!(
            out["metadata"]["managedFields"],
            json!([{
                "manager": "kubectl",
                "operation": "Apply",
                "apiVersion": "v1",
                "time": T1,
                "fieldsType": "FieldsV1",
                "fieldsV1": {
                    "f:data": {"f:key": {}},
                    "f:metadata": {"f:labels": {"f:test-label": {}}}
                }
            }])
        );
        assert_eq!(out["data"], applied["data"]);
        assert_eq!(out["metadata"]["labels"], applied["metadata"]["labels"]);
    }

    #[test]
    fn fields_v1_list_map_items_and_round_trip() {
        let applied = vm(json!({
            "template": {"spec": {
                "domain": {"devices": {"disks": [{"name": "disk0", "disk": {"bus": "virtio"}}]}},
                "volumes": [{"name": "disk0", "containerDisk": {"image": "quay.io/x"}}]
            }}
        }));
        let out = ok(apply(None, &applied, "m", false, T1, &vmi_lists));
        let f = &entry(&out, "m")["fieldsV1"];
        assert_eq!(
            f["f:spec"]["f:template"]["f:spec"]["f:volumes"],
            json!({"k:{\"name\":\"disk0\"}": {
                ".": {},
                "f:containerDisk": {"f:image": {}},
                "f:name": {}
            }})
        );
        assert_eq!(
            f["f:spec"]["f:template"]["f:spec"]["f:domain"]["f:devices"]["f:disks"]["k:{\"name\":\"disk0\"}"]
                ["f:disk"],
            json!({"f:bus": {}})
        );
        let set = FieldSet::from_fields_v1(f).expect("decodes");
        assert_eq!(set.to_fields_v1(), *f);
        assert!(set.contains(&[
            PathElement::Field("spec".into()),
            PathElement::Field("template".into()),
            PathElement::Field("spec".into()),
            PathElement::Field("volumes".into()),
            PathElement::Key("{\"name\":\"disk0\"}".into()),
        ]));
    }

    #[test]
    fn path_elements_encode_decode_and_render() {
        for s in ["f:spec", "k:{\"name\":\"a\",\"port\":80}", "v:\"x\"", "i:3"] {
            let el = PathElement::decode(s).expect("decodes");
            assert_eq!(el.encode(), s);
        }
        // Keys are canonicalized: field order does not matter.
        assert_eq!(
            PathElement::decode("k:{\"port\":80,\"name\":\"a\"}"),
            PathElement::decode("k:{\"name\":\"a\",\"port\":80}")
        );
        assert_eq!(PathElement::decode("x:1"), None);
        let p = vec![
            PathElement::Field("spec".into()),
            PathElement::Field("volumes".into()),
            PathElement::Key("{\"name\":\"disk0\"}".into()),
            PathElement::Field("containerDisk".into()),
            PathElement::Value("\"a\"".into()),
            PathElement::Index(2),
        ];
        assert_eq!(
            path_string(&p),
            ".spec.volumes[name=\"disk0\"].containerDisk[=\"a\"][2]"
        );
    }

    #[test]
    fn applying_twice_changes_nothing() {
        let applied = vm(json!({"runStrategy": "Always", "template": {"spec": {
            "volumes": [{"name": "v", "containerDisk": {"image": "i"}}]}}}));
        let once = ok(apply(None, &applied, "kubectl", false, T1, &vmi_lists));
        let twice = ok(apply(
            Some(&once),
            &applied,
            "kubectl",
            false,
            T2,
            &vmi_lists,
        ));
        assert_eq!(once, twice);
        assert_eq!(entry(&twice, "kubectl")["time"], T1);
    }

    #[test]
    fn server_fields_and_status_are_not_owned_or_merged() {
        let mut live = vm(json!({"runStrategy": "Halted"}));
        live["metadata"]["uid"] = json!("u1");
        live["metadata"]["resourceVersion"] = json!("5");
        live["metadata"]["generation"] = json!(2);
        live["metadata"]["creationTimestamp"] = json!(T1);
        live["status"] = json!({"ready": true});
        let mut applied = vm(json!({"runStrategy": "Always"}));
        applied["metadata"]["uid"] = json!("other");
        applied["metadata"]["resourceVersion"] = json!("1");
        applied["status"] = json!({"ready": false});
        let out = ok(apply(Some(&live), &applied, "m", false, T2, &vmi_lists));
        assert_eq!(out["metadata"]["uid"], "u1");
        assert_eq!(out["metadata"]["resourceVersion"], "5");
        assert_eq!(out["status"], json!({"ready": true}));
        assert_eq!(out["spec"]["runStrategy"], "Always");
        assert_eq!(
            entry(&out, "m")["fieldsV1"],
            json!({"f:spec": {"f:runStrategy": {}}})
        );
    }

    #[test]
    fn conflict_with_update_manager_has_kubernetes_message() {
        let created = vm(json!({"runStrategy": "Always"}));
        let live = update(
            None,
            &created,
            "kubectl-client-side-apply",
            None,
            T1,
            &vmi_lists,
        );
        assert!(owns(
            &live,
            "kubectl-client-side-apply",
            ".spec.runStrategy"
        ));
        let applied = vm(json!({"runStrategy": "Halted"}));
        let err = apply(Some(&live), &applied, "kubectl", false, T2, &vmi_lists)
            .expect_err("must conflict");
        assert_eq!(
            err.to_string(),
            "Apply failed with 1 conflict: conflict with \"kubectl-client-side-apply\" using kubevirt.io/v1: .spec.runStrategy"
        );
        let causes = err.causes();
        assert_eq!(causes.len(), 1);
        assert_eq!(causes[0].reason.as_deref(), Some("FieldManagerConflict"));
        assert_eq!(
            causes[0].message.as_deref(),
            Some("conflict with \"kubectl-client-side-apply\" using kubevirt.io/v1")
        );
        assert_eq!(causes[0].field.as_deref(), Some(".spec.runStrategy"));
    }

    #[test]
    fn several_conflicts_message() {
        let live = ok(apply(
            None,
            &vm(json!({"runStrategy": "Always", "running": true})),
            "a",
            false,
            T1,
            &vmi_lists,
        ));
        let err = apply(
            Some(&live),
            &vm(json!({"runStrategy": "Halted", "running": false})),
            "b",
            false,
            T2,
            &vmi_lists,
        )
        .expect_err("conflicts");
        assert_eq!(
            err.to_string(),
            "Apply failed with 2 conflicts: conflicts with \"a\" using kubevirt.io/v1:\n- .spec.runStrategy\n- .spec.running"
        );
        // Two managers.
        let live = update(
            Some(&live),
            &{
                let mut v = live.clone();
                v["spec"]["running"] = json!(false);
                v
            },
            "c",
            None,
            T2,
            &vmi_lists,
        );
        let err = apply(
            Some(&live),
            &vm(json!({"runStrategy": "Halted", "running": true})),
            "b",
            false,
            T3,
            &vmi_lists,
        )
        .expect_err("conflicts");
        assert_eq!(
            err.to_string(),
            "Apply failed with 2 conflicts: conflicts with\n\"a\" using kubevirt.io/v1:\n- .spec.runStrategy\n\"c\" using kubevirt.io/v1:\n- .spec.running"
        );
    }

    #[test]
    fn force_takes_ownership() {
        let live = ok(apply(
            None,
            &vm(json!({"runStrategy": "Always", "running": true})),
            "a",
            false,
            T1,
            &vmi_lists,
        ));
        let out = ok(apply(
            Some(&live),
            &vm(json!({"runStrategy": "Halted"})),
            "b",
            true,
            T2,
            &vmi_lists,
        ));
        assert_eq!(out["spec"]["runStrategy"], "Halted");
        assert!(owns(&out, "b", ".spec.runStrategy"));
        assert!(!owns(&out, "a", ".spec.runStrategy"));
        assert!(owns(&out, "a", ".spec.running"));
        // "a" re-applying its old intent now conflicts with "b".
        let err = apply(
            Some(&out),
            &vm(json!({"runStrategy": "Always", "running": true})),
            "a",
            false,
            T3,
            &vmi_lists,
        )
        .expect_err("conflict");
        assert!(err.to_string().contains("conflict with \"b\""), "{err}");
    }

    #[test]
    fn same_value_is_shared_without_conflict() {
        let live = ok(apply(
            None,
            &vm(json!({"runStrategy": "Always"})),
            "a",
            false,
            T1,
            &vmi_lists,
        ));
        let out = ok(apply(
            Some(&live),
            &vm(json!({"runStrategy": "Always"})),
            "b",
            false,
            T2,
            &vmi_lists,
        ));
        assert!(owns(&out, "a", ".spec.runStrategy"));
        assert!(owns(&out, "b", ".spec.runStrategy"));
        // "a" dropping the field keeps it, because "b" still owns it.
        let out = ok(apply(
            Some(&out),
            &vm(json!({})),
            "a",
            false,
            T3,
            &vmi_lists,
        ));
        assert_eq!(out["spec"]["runStrategy"], "Always");
        assert!(!owns(&out, "a", ".spec.runStrategy"));
    }

    #[test]
    fn omitted_fields_are_removed() {
        let live = ok(apply(
            None,
            &{
                let mut v = vm(json!({"runStrategy": "Always", "running": true}));
                v["metadata"]["labels"] = json!({"app": "x"});
                v
            },
            "a",
            false,
            T1,
            &vmi_lists,
        ));
        let out = ok(apply(
            Some(&live),
            &vm(json!({"runStrategy": "Always"})),
            "a",
            false,
            T2,
            &vmi_lists,
        ));
        assert_eq!(out["spec"], json!({"runStrategy": "Always"}));
        // The emptied labels map goes too.
        assert!(out["metadata"].get("labels").is_none(), "{out}");
        assert_eq!(out["metadata"]["name"], "vm1");
        assert_eq!(entry(&out, "a")["time"], T2);
        // Fields written by someone else are not removed by an apply that never owned them.
        let mut edited = out.clone();
        edited["spec"]["running"] = json!(false);
        let edited = update(Some(&out), &edited, "kubectl-edit", None, T2, &vmi_lists);
        let out = ok(apply(
            Some(&edited),
            &vm(json!({"runStrategy": "Always"})),
            "a",
            false,
            T3,
            &vmi_lists,
        ));
        assert_eq!(out["spec"]["running"], false);
    }

    #[test]
    fn list_map_merges_by_key() {
        let spec = |vols: Value| vm(json!({"template": {"spec": {"volumes": vols}}}));
        let live = ok(apply(
            None,
            &spec(json!([
                {"name": "a", "containerDisk": {"image": "ia"}},
                {"name": "b", "containerDisk": {"image": "ib"}}
            ])),
            "one",
            false,
            T1,
            &vmi_lists,
        ));
        // A second manager adds its own item and co-owns nothing.
        let live = ok(apply(
            Some(&live),
            &spec(json!([{"name": "c", "emptyDisk": {"capacity": "1Gi"}}])),
            "two",
            false,
            T2,
            &vmi_lists,
        ));
        let names = |o: &Value| -> Vec<String> {
            o["spec"]["template"]["spec"]["volumes"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v["name"].as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default()
        };
        assert_eq!(names(&live), vec!["c", "a", "b"]);
        // The first manager changes b, drops a: only its own items are affected.
        let out = ok(apply(
            Some(&live),
            &spec(json!([{"name": "b", "containerDisk": {"image": "ib2"}}])),
            "one",
            false,
            T3,
            &vmi_lists,
        ));
        assert_eq!(names(&out), vec!["b", "c"]);
        let vols = &out["spec"]["template"]["spec"]["volumes"];
        assert_eq!(vols[0]["containerDisk"]["image"], "ib2");
        assert_eq!(vols[1]["emptyDisk"]["capacity"], "1Gi");
        assert!(owns(
            &out,
            "two",
            ".spec.template.spec.volumes[name=\"c\"].emptyDisk.capacity"
        ));
        assert!(!owns(
            &out,
            "one",
            ".spec.template.spec.volumes[name=\"a\"]"
        ));
    }

    #[test]
    fn list_item_kept_while_someone_owns_a_field_in_it() {
        let spec = |vols: Value| vm(json!({"template": {"spec": {"volumes": vols}}}));
        let live = ok(apply(
            None,
            &spec(json!([{"name": "a", "containerDisk": {"image": "ia"}}])),
            "one",
            false,
            T1,
            &vmi_lists,
        ));
        let mut edited = live.clone();
        edited["spec"]["template"]["spec"]["volumes"][0]["containerDisk"]["imagePullPolicy"] =
            json!("Always");
        let live = update(Some(&live), &edited, "editor", None, T2, &vmi_lists);
        let out = ok(apply(
            Some(&live),
            &spec(json!([])),
            "one",
            false,
            T3,
            &vmi_lists,
        ));
        let vols = &out["spec"]["template"]["spec"]["volumes"];
        assert_eq!(vols[0]["name"], "a");
        assert_eq!(vols[0]["containerDisk"]["imagePullPolicy"], "Always");
        assert!(vols[0]["containerDisk"].get("image").is_none(), "{vols}");
    }

    #[test]
    fn atomic_lists_are_replaced_and_owned_whole() {
        let spec = |sel: Value| vm(json!({"template": {"spec": {"tolerations": sel}}}));
        let live = ok(apply(
            None,
            &spec(json!([{"key": "a"}, {"key": "b"}])),
            "m",
            false,
            T1,
            &vmi_lists,
        ));
        assert!(owns(&live, "m", ".spec.template.spec.tolerations"));
        let out = ok(apply(
            Some(&live),
            &spec(json!([{"key": "c"}])),
            "m",
            false,
            T2,
            &vmi_lists,
        ));
        assert_eq!(
            out["spec"]["template"]["spec"]["tolerations"],
            json!([{"key": "c"}])
        );
        let err = apply(
            Some(&out),
            &spec(json!([{"key": "d"}])),
            "x",
            false,
            T3,
            &vmi_lists,
        )
        .expect_err("conflict");
        assert!(
            err.to_string()
                .ends_with(": .spec.template.spec.tolerations"),
            "{err}"
        );
    }

    #[test]
    fn finalizers_are_a_set() {
        let with = |f: Value| {
            let mut v = vm(json!({}));
            v["metadata"]["finalizers"] = f;
            v
        };
        let live = ok(apply(
            None,
            &with(json!(["a/x"])),
            "one",
            false,
            T1,
            &vmi_lists,
        ));
        let live = ok(apply(
            Some(&live),
            &with(json!(["b/y"])),
            "two",
            false,
            T2,
            &vmi_lists,
        ));
        assert_eq!(live["metadata"]["finalizers"], json!(["b/y", "a/x"]));
        assert_eq!(
            entry(&live, "two")["fieldsV1"],
            // `spec: {}` is applied too: an empty object is owned as a leaf.
            json!({"f:metadata": {"f:finalizers": {"v:\"b/y\"": {}}}, "f:spec": {}})
        );
        let out = ok(apply(
            Some(&live),
            &with(json!([])),
            "one",
            false,
            T3,
            &vmi_lists,
        ));
        assert_eq!(out["metadata"]["finalizers"], json!(["b/y"]));
    }

    #[test]
    fn update_records_changed_fields_and_steals_ownership() {
        let live = ok(apply(
            None,
            &vm(json!({"runStrategy": "Always", "running": true})),
            "kubectl",
            false,
            T1,
            &vmi_lists,
        ));
        let mut edited = live.clone();
        edited["spec"]["runStrategy"] = json!("Halted");
        let out = update(Some(&live), &edited, "kubectl-edit", None, T2, &vmi_lists);
        let e = entry(&out, "kubectl-edit");
        assert_eq!(e["operation"], "Update");
        assert_eq!(e["time"], T2);
        assert_eq!(e["fieldsV1"], json!({"f:spec": {"f:runStrategy": {}}}));
        assert!(!owns(&out, "kubectl", ".spec.runStrategy"));
        assert!(owns(&out, "kubectl", ".spec.running"));
        // Apply entries sort before Update entries.
        assert_eq!(out["metadata"]["managedFields"][0]["manager"], "kubectl");
        // An update that changes nothing records nothing.
        let same = update(Some(&out), &out, "other", None, T3, &vmi_lists);
        assert_eq!(same, out);
        // Removing a field drops its ownership.
        let mut removed = out.clone();
        if let Some(spec) = removed["spec"].as_object_mut() {
            spec.remove("running");
        }
        let out = update(Some(&out), &removed, "kubectl-edit", None, T3, &vmi_lists);
        assert!(!owns(&out, "kubectl", ".spec.running"));
    }

    #[test]
    fn status_updates_are_recorded_with_subresource() {
        let live = update(
            None,
            &vm(json!({"runStrategy": "Always"})),
            "kubectl-create",
            None,
            T1,
            &vmi_lists,
        );
        let mut with_status = live.clone();
        with_status["status"] = json!({"ready": true, "printableStatus": "Running"});
        let out = update(
            Some(&live),
            &with_status,
            "virt-controller",
            Some("status"),
            T2,
            &vmi_lists,
        );
        let e = entry(&out, "virt-controller");
        assert_eq!(e["subresource"], "status");
        assert_eq!(
            e["fieldsV1"],
            json!({"f:status": {"f:printableStatus": {}, "f:ready": {}}})
        );
        // Creation by POST records every field the creator set (none of status).
        assert_eq!(
            entry(&out, "kubectl-create")["fieldsV1"],
            json!({"f:spec": {"f:runStrategy": {}}})
        );
        // A main-resource apply neither conflicts with nor removes status fields.
        let out = ok(apply(
            Some(&out),
            &vm(json!({"runStrategy": "Always"})),
            "kubectl",
            false,
            T3,
            &vmi_lists,
        ));
        assert_eq!(out["status"]["ready"], true);
        assert!(owns(&out, "virt-controller", ".status.ready"));
        // Status apply owns status fields under the subresource.
        let mut st = vm(json!({}));
        st["status"] = json!({"ready": false});
        let err = apply_subresource(
            Some(&out),
            &st,
            "other",
            Some("status"),
            false,
            T3,
            &vmi_lists,
        )
        .expect_err("conflict");
        assert_eq!(
            err.to_string(),
            "Apply failed with 1 conflict: conflict with \"virt-controller\" with subresource \"status\" using kubevirt.io/v1: .status.ready"
        );
    }

    #[test]
    fn client_can_reset_managed_fields() {
        let live = ok(apply(
            None,
            &vm(json!({"runStrategy": "Always"})),
            "a",
            false,
            T1,
            &vmi_lists,
        ));
        let mut reset = live.clone();
        reset["metadata"]["managedFields"] = json!([{}]);
        let out = update(Some(&live), &reset, "b", None, T2, &vmi_lists);
        assert!(out["metadata"].get("managedFields").is_none(), "{out}");
        // An empty list is not a reset.
        let mut keep = live.clone();
        keep["metadata"]["managedFields"] = json!([]);
        let out = update(Some(&live), &keep, "b", None, T2, &vmi_lists);
        assert!(owns(&out, "a", ".spec.runStrategy"));
    }

    #[test]
    fn invalid_applied_configurations() {
        let missing_key =
            vm(json!({"template": {"spec": {"volumes": [{"containerDisk": {"image": "i"}}]}}}));
        let err = apply(None, &missing_key, "m", false, T1, &vmi_lists).expect_err("invalid");
        assert_eq!(
            err.to_string(),
            ".spec.template.spec.volumes: element 0: associative list with keys has an element that omits key field(s) \"name\""
        );
        let dup = vm(json!({"template": {"spec": {"volumes": [{"name": "a"}, {"name": "a"}]}}}));
        let err = apply(None, &dup, "m", false, T1, &vmi_lists).expect_err("invalid");
        assert_eq!(
            err.to_string(),
            ".spec.template.spec.volumes: duplicate entries for key [name=\"a\"]"
        );
        assert!(matches!(
            apply(None, &json!([1]), "m", false, T1, &vmi_lists),
            Err(ApplyError::Invalid(_))
        ));
        let mut with_mf = vm(json!({}));
        with_mf["metadata"]["managedFields"] = json!([]);
        assert_eq!(
            apply(None, &with_mf, "m", false, T1, &vmi_lists),
            Err(ApplyError::Invalid(
                "metadata.managedFields must be nil".into()
            ))
        );
    }

    #[test]
    fn null_in_applied_configuration_is_ignored() {
        let live = ok(apply(
            None,
            &vm(json!({"runStrategy": "Always"})),
            "a",
            false,
            T1,
            &vmi_lists,
        ));
        let out = ok(apply(
            Some(&live),
            &vm(json!({"runStrategy": "Always", "running": null})),
            "a",
            false,
            T1,
            &vmi_lists,
        ));
        assert_eq!(out, live);
    }

    #[test]
    fn multi_key_lists_and_caller_supplied_sets() {
        // A caller-supplied lookup: `ports` keyed by (port, protocol), `tags` a set.
        let lists = |p: &[PathElement]| match p {
            [PathElement::Field(f)] if f == "ports" => {
                Some(vec!["protocol".to_string(), "port".to_string()])
            }
            [PathElement::Field(f)] if f == "tags" => Some(vec![]),
            _ => None,
        };
        let live = ok(apply(
            None,
            &json!({"ports": [{"port": 80, "protocol": "TCP", "name": "http"}], "tags": ["a"]}),
            "one",
            false,
            T1,
            &lists,
        ));
        assert_eq!(
            entry(&live, "one")["fieldsV1"],
            json!({
                "f:ports": {"k:{\"port\":80,\"protocol\":\"TCP\"}": {
                    ".": {}, "f:name": {}, "f:port": {}, "f:protocol": {}
                }},
                "f:tags": {"v:\"a\"": {}}
            })
        );
        let err = apply(
            Some(&live),
            &json!({"ports": [{"port": 80, "protocol": "TCP", "name": "web"}]}),
            "two",
            false,
            T2,
            &lists,
        )
        .expect_err("conflict");
        assert!(
            err.to_string()
                .ends_with(": .ports[port=80,protocol=\"TCP\"].name"),
            "{err}"
        );
        // Same port, other protocol: a different item, no conflict.
        let out = ok(apply(
            Some(&live),
            &json!({"ports": [{"port": 80, "protocol": "UDP"}], "tags": ["b"]}),
            "two",
            false,
            T2,
            &lists,
        ));
        assert_eq!(out["ports"].as_array().map(Vec::len), Some(2));
        assert_eq!(out["tags"], json!(["b", "a"]));
    }

    /// Deterministic pseudo-random sequences of applies and updates by three managers;
    /// checks the invariants every sequence must keep.
    #[test]
    fn random_sequences_keep_invariants() {
        struct Lcg(u64);
        impl Lcg {
            fn next(&mut self, n: usize) -> usize {
                self.0 = self
                    .0
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((self.0 >> 33) as usize) % n
            }
        }
        fn config(r: &mut Lcg) -> Value {
            let mut spec = Map::new();
            if r.next(2) == 0 {
                spec.insert("runStrategy".into(), json!(["Always", "Halted"][r.next(2)]));
            }
            if r.next(3) == 0 {
                spec.insert("running".into(), json!(r.next(2) == 0));
            }
            let mut tspec = Map::new();
            let mut vols = Vec::new();
            for n in ["v1", "v2", "v3"] {
                if r.next(2) == 0 {
                    continue;
                }
                let mut cd = json!({"image": (["i1", "i2"][r.next(2)])});
                if r.next(3) == 0 {
                    cd["imagePullPolicy"] = json!("Always");
                }
                vols.push(json!({"name": n, "containerDisk": cd}));
            }
            if !vols.is_empty() {
                tspec.insert("volumes".into(), Value::Array(vols));
            }
            if r.next(3) == 0 {
                tspec.insert(
                    "tolerations".into(),
                    json!([{"key": (["a", "b"][r.next(2)])}]),
                );
            }
            if !tspec.is_empty() {
                spec.insert("template".into(), json!({"spec": tspec}));
            }
            let mut obj = vm(Value::Object(spec));
            let mut labels = Map::new();
            for k in ["a", "b"] {
                if r.next(2) == 0 {
                    labels.insert(k.to_string(), json!(["x", "y"][r.next(2)]));
                }
            }
            if !labels.is_empty() {
                obj["metadata"]["labels"] = Value::Object(labels);
            }
            let fins: Vec<Value> = ["f/1", "f/2"]
                .iter()
                .filter(|_| r.next(2) == 0)
                .map(|f| json!(f))
                .collect();
            if !fins.is_empty() {
                obj["metadata"]["finalizers"] = Value::Array(fins);
            }
            obj
        }
        fn check_owned_paths_exist(obj: &Value) {
            let present = flat_of(obj, Scope::All, &vmi_lists);
            for e in managed_fields(obj) {
                assert!(!e.fields.is_empty(), "empty entry kept: {obj}");
                for p in e.fields.iter() {
                    assert!(
                        present.contains_key(p),
                        "{} owns missing {}",
                        e.manager,
                        path_string(p)
                    );
                }
            }
        }
        let managers = ["m1", "m2", "m3"];
        for seed in 0..300u64 {
            let mut r = Lcg(seed);
            let mut live: Option<Value> = None;
            for step in 0..8 {
                let manager = managers[r.next(3)];
                let now = format!("2026-01-01T00:00:{step:02}Z");
                let cfg = config(&mut r);
                if r.next(3) == 0 {
                    let new = match &live {
                        // A JSON-merge-patch-like write of the whole config.
                        Some(l) => {
                            let mut n = l.clone();
                            merge(&mut n, &cfg, &mut Vec::new(), &vmi_lists);
                            n
                        }
                        None => cfg.clone(),
                    };
                    let out = update(live.as_ref(), &new, manager, None, &now, &vmi_lists);
                    check_owned_paths_exist(&out);
                    live = Some(out);
                    continue;
                }
                let force = r.next(2) == 0;
                match apply(live.as_ref(), &cfg, manager, force, &now, &vmi_lists) {
                    Ok(out) => {
                        check_owned_paths_exist(&out);
                        // Omitted fields survive only if someone else holds them (or
                        // something inside them, or they key a surviving item).
                        let before = live.as_ref().map(managed_fields).unwrap_or_default();
                        let after = managed_fields(&out);
                        let present = flat_of(&out, Scope::All, &vmi_lists);
                        let wanted_now = flat_of(&cfg, Scope::Main, &vmi_lists);
                        let held = |p: &Path| {
                            after
                                .iter()
                                .filter(|e| e.manager != manager || e.operation != Operation::Apply)
                                .any(|e| e.fields.iter().any(|q| q.starts_with(p)))
                                || is_key_field(p)
                        };
                        for e in before
                            .iter()
                            .filter(|e| e.manager == manager && e.operation == Operation::Apply)
                        {
                            for p in e.fields.iter() {
                                if present.contains_key(p) && !wanted_now.contains_key(p) {
                                    assert!(
                                        held(p),
                                        "seed {seed} step {step}: {} kept unowned",
                                        path_string(p)
                                    );
                                }
                            }
                        }
                        // The applied intent holds: every owned leaf has the applied value.
                        let wanted = flat_of(&cfg, Scope::Main, &vmi_lists);
                        let got = flat_of(&out, Scope::Main, &vmi_lists);
                        for (p, v) in &wanted {
                            if matches!(v, Leaf::Scalar(Value::Object(o)) if o.is_empty()) {
                                continue;
                            }
                            assert_eq!(
                                got.get(p),
                                Some(v),
                                "seed {seed} step {step}: {}",
                                path_string(p)
                            );
                        }
                        // Re-applying the same intent changes nothing.
                        let again = apply(
                            Some(&out),
                            &cfg,
                            manager,
                            false,
                            "2027-01-01T00:00:00Z",
                            &vmi_lists,
                        )
                        .unwrap_or_else(|e| panic!("seed {seed} step {step}: re-apply: {e}"));
                        assert_eq!(again, out, "seed {seed} step {step}");
                        live = Some(out);
                    }
                    Err(ApplyError::Conflicts(cs)) => {
                        assert!(!force && !cs.is_empty());
                        assert!(
                            cs.iter()
                                .all(|c| c.manager != manager || c.operation != Operation::Apply),
                            "self-conflict: {cs:?}"
                        );
                    }
                    Err(e) => panic!("seed {seed} step {step}: {e}"),
                }
            }
        }
    }

    #[test]
    fn list_types_from_schema() {
        let vm = ListTypes::for_kind("VirtualMachine").expect("vm");
        let f = |s: &str| PathElement::Field(s.into());
        let k = PathElement::Key("{\"name\":\"x\"}".into());
        assert_eq!(
            vm.get(&[f("spec"), f("template"), f("spec"), f("volumes")]),
            Some(vec!["name".to_string()])
        );
        assert_eq!(
            vm.get(&[
                f("spec"),
                f("template"),
                f("spec"),
                f("domain"),
                f("devices"),
                f("disks")
            ]),
            Some(vec!["name".to_string()])
        );
        assert_eq!(
            vm.get(&[f("status"), f("conditions")]),
            Some(vec!["type".to_string()])
        );
        assert_eq!(
            vm.get(&[f("spec"), f("template"), f("spec"), f("tolerations")]),
            None
        );
        assert_eq!(
            vm.get(&[
                f("spec"),
                f("template"),
                f("spec"),
                f("volumes"),
                k,
                f("name")
            ]),
            None
        );
        let vmi = ListTypes::for_kind("VirtualMachineInstance").expect("vmi");
        assert_eq!(
            vmi.get(&[f("spec"), f("domain"), f("devices"), f("interfaces")]),
            Some(vec!["name".to_string()])
        );
        let set = ListTypes::from_schema(&json!({"properties": {"a": {
            "type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}}}}));
        assert_eq!(set.get(&[f("a")]), Some(vec![]));
        assert!(ListTypes::for_kind("Nope").is_none());
    }
}
