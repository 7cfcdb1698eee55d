//! REST semantics over etcd, shared by every kind: the registry/strategy split of
//! kube-apiserver with CRD semantics (status subresource, generation, finalizers,
//! deletion, dryRun, field validation, optimistic concurrency with CAS retries).

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Status, StatusDetails};
use kubevirt_api::policy::{Actor, FeatureGates};
use kubevirt_api::validation::{FieldError, validate_object_meta};
use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio_util::sync::CancellationToken;

use crate::cache::{Cacher, Miss, WatchCache};
use crate::error::{ApiError, ApiResult, Gr};
use crate::kinds::ResourceDef;
use crate::metrics::CacheLabels;
use crate::objects::{self, meta_str, set_meta};
use crate::storage::{StorageError, Store, Stored};
use kubevirt_api::kinds::{Found, Target};

pub use kubevirt_api::{API_VERSION, GROUP};
/// Attempts of a read-modify-write before giving up on a contended key.
const MAX_RETRIES: usize = 64;
/// Generated name suffix alphabet (no vowels, no confusable characters), as Kubernetes.
const NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// What to do with unknown fields in a request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldValidation {
    /// Drop them silently.
    Ignore,
    /// Drop them and return a warning for each.
    #[default]
    Warn,
    /// Reject the request.
    Strict,
}

/// Options common to writes.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    /// `dryRun=All`: validate, do not persist.
    pub dry_run: bool,
    /// Unknown field handling.
    pub field_validation: FieldValidation,
    /// Field manager recorded in managedFields.
    pub field_manager: String,
    /// Who writes, for the input policy ([`kubevirt_api::policy`]).
    pub actor: Actor,
    /// The authenticated user the write is made for: reviews that ask kube-apiserver about
    /// this user (a clone's source) need it. None for the server's own writes.
    pub requester: Option<crate::auth::User>,
}

/// Result of a write: the object and warnings for the client.
#[derive(Debug)]
pub struct Written {
    /// Object to return.
    pub object: Value,
    /// `Warning` headers.
    pub warnings: Vec<String>,
    /// 201 instead of 200.
    pub created: bool,
}

/// Delete propagation policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
pub enum Propagation {
    /// Owner goes first, GC deletes dependents in the background.
    Background,
    /// Dependents with blockOwnerDeletion go first.
    Foreground,
    /// Dependents are kept and lose their owner reference.
    Orphan,
}

/// DeleteOptions as received (body or query).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeleteOptions {
    /// Ignored for our kinds beyond validation (no graceful deletion, CRD semantics).
    pub grace_period_seconds: Option<i64>,
    /// Preconditions.
    pub preconditions: Option<Preconditions>,
    /// Deprecated orphan flag.
    pub orphan_dependents: Option<bool>,
    /// Propagation policy.
    pub propagation_policy: Option<String>,
    /// `["All"]` for a dry run.
    pub dry_run: Option<Vec<String>>,
}

/// Delete preconditions.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Preconditions {
    /// Required UID.
    pub uid: Option<String>,
    /// Required resourceVersion.
    pub resource_version: Option<String>,
}

/// Parameters of a list.
#[derive(Debug, Clone, Default)]
pub struct ListOptions {
    /// Parsed label selector.
    pub label_selector: Option<crate::selector::LabelSelector>,
    /// Parsed field selector.
    pub field_selector: Option<crate::selector::FieldSelector>,
    /// Page size (0 = everything).
    pub limit: i64,
    /// Continue token.
    pub continue_token: Option<String>,
    /// resourceVersion parameter.
    pub resource_version: Option<String>,
    /// resourceVersionMatch parameter.
    pub resource_version_match: Option<String>,
}

/// A listed page.
#[derive(Debug)]
pub struct Listed {
    /// Items, with resourceVersion.
    pub items: Vec<Value>,
    /// Snapshot revision.
    pub revision: i64,
    /// Token for the next page.
    pub continue_token: Option<String>,
    /// Items left after this page when known.
    pub remaining: Option<i64>,
}

/// What a LIST says about itself besides its items.
#[derive(Debug)]
pub struct ListMeta {
    /// Snapshot revision.
    pub revision: i64,
    /// Token for the next page.
    pub continue_token: Option<String>,
    /// Items left after this page when known.
    pub remaining: Option<i64>,
}

/// Keys per etcd read of an unpaged LIST.
const UNPAGED_CHUNK: i64 = 500;
/// How long a read waits for the watch cache to reach a revision before etcd answers.
pub const CACHE_WAIT: Duration = Duration::from_secs(1);

#[derive(Debug, Serialize, Deserialize)]
struct ContinueToken {
    v: String,
    rv: i64,
    start: String,
}

/// The registry: REST operations for every kind over one etcd.
#[derive(Debug, Clone)]
pub struct Registry {
    storage: Arc<dyn Store>,
    prefix: String,
    namespaces: Option<crate::admission::NamespaceLifecycle>,
    policy: Policy,
    cache: Option<Arc<WatchCache>>,
    clone_review: Option<crate::auth::AuthConfig>,
}

/// Configuration of the input policy: the enforced feature gates and the namespace
/// whose kubevirt-rs service accounts count as components.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Feature gates from the KubeVirt configuration (`--feature-gates`).
    pub gates: FeatureGates,
    /// Namespace of the components' service accounts.
    pub components_namespace: String,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            gates: FeatureGates::default(),
            components_namespace: "kubevirt".into(),
        }
    }
}

fn gr(def: &ResourceDef) -> Gr<'static> {
    Gr {
        resource: def.plural,
        group: def.group,
    }
}

pub(crate) fn storage_error(e: StorageError) -> ApiError {
    tracing::warn!(error = %e, "Storage request failed");
    match e {
        StorageError::Compacted(_) => {
            ApiError::expired("The resourceVersion for the provided list is too old.")
        }
        StorageError::FutureRevision(_) => ApiError::timeout("Too large resource version", true),
        StorageError::Etcd(_) | StorageError::Cancelled(_) => {
            ApiError::unavailable("the server is currently unable to handle the request")
        }
        StorageError::Corrupt { key, .. } => {
            ApiError::internal(format!("stored object at {key} is corrupt"))
        }
    }
}

fn parse_rv(s: &str) -> ApiResult<i64> {
    s.parse::<i64>()
        .ok()
        .filter(|v| *v >= 0)
        .ok_or_else(|| ApiError::bad_request(format!("invalid resource version: {s:?}")))
}

fn list_options_invalid(msg: &str) -> ApiError {
    ApiError::invalid(
        "ListOptions",
        "meta.k8s.io",
        "",
        &[FieldError {
            kind: kubevirt_api::validation::ErrorType::Forbidden,
            field: msg.split(':').next().unwrap_or("").to_string(),
            message: msg.split_once(": ").map(|x| x.1).unwrap_or(msg).to_string(),
        }],
    )
}

fn generate_name(prefix: &str) -> String {
    let mut rng = rand::rng();
    let base: String = prefix.chars().take(58).collect();
    let suffix: String = (0..5)
        .map(|_| NAME_ALPHABET[rng.random_range(0..NAME_ALPHABET.len())] as char)
        .collect();
    format!("{base}{suffix}")
}

impl Registry {
    /// A registry storing under `prefix` (e.g. `/registry`).
    pub fn new(storage: impl Store, prefix: &str) -> Self {
        Self {
            storage: Arc::new(storage),
            prefix: prefix.trim_end_matches('/').to_string(),
            namespaces: None,
            policy: Policy::default(),
            cache: None,
            clone_review: None,
        }
    }

    /// Serves watches and the LISTs it can from a watch cache of every stored resource
    /// (one etcd watch each), keeping `history` events per resource; its reflectors run
    /// until `shutdown`.
    #[must_use]
    pub fn with_watch_cache(
        mut self,
        history: usize,
        reads: Family<CacheLabels, Counter>,
        shutdown: CancellationToken,
    ) -> Self {
        let prefixes: Vec<String> = ResourceDef::stored()
            .map(|d| self.collection_prefix(d, None))
            .collect();
        self.cache = Some(Arc::new(
            WatchCache::start(self.storage.clone(), prefixes, history, shutdown)
                .with_metrics(reads),
        ));
        self
    }

    /// The watch cache, if the registry has one.
    pub fn watch_cache(&self) -> Option<&WatchCache> {
        self.cache.as_deref()
    }

    /// The cache of `def`, if the registry has a watch cache.
    pub fn cacher(&self, def: &ResourceDef) -> Option<&Arc<Cacher>> {
        self.cache
            .as_ref()
            .and_then(|c| c.cacher(&self.collection_prefix(def, None)))
    }

    /// Enforces the input policy with these gates and components.
    #[must_use]
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// The policy actor of an authenticated user.
    pub fn actor(
        &self,
        user: &str,
        groups: &[String],
        extra: &std::collections::BTreeMap<String, Vec<String>>,
    ) -> Actor {
        Actor::of(user, groups, extra, &self.policy.components_namespace)
    }

    /// The input policy's settings.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Asks `auth`'s authorizer whether the author of a DataVolume or VM that clones a claim
    /// may read it ([`Self::review_clones`]). Without it no such review is made.
    #[must_use]
    pub fn with_clone_review(mut self, auth: crate::auth::AuthConfig) -> Self {
        self.clone_review = Some(auth);
        self
    }

    /// CDI's clone authorization (`kubevirt_api::cdi::clone`): each claim `new` clones that
    /// `old` did not must be readable by the requesting user, or the write is a 403 naming
    /// what is missing. Writes without a requester (the server's own) and components' are
    /// not reviewed: virt-controller creates a VM's DataVolumes after the VM's author was.
    async fn review_clones(
        &self,
        def: &ResourceDef,
        old: Option<&Value>,
        new: &Value,
        opts: &WriteOptions,
    ) -> ApiResult<()> {
        let (Some(auth), Some(user)) = (&self.clone_review, &opts.requester) else {
            return Ok(());
        };
        if opts.actor != Actor::User {
            return Ok(());
        }
        for source in kubevirt_api::cdi::clone::new_clone_sources(def.kind, old, new) {
            if !auth
                .may_clone(user, &source.namespace, &source.name)
                .await?
            {
                let name = meta_str(new, "name").unwrap_or("");
                return Err(crate::auth::clone_forbidden(
                    gr(def),
                    name,
                    user,
                    &source.namespace,
                    &source.name,
                ));
            }
        }
        Ok(())
    }

    /// Enforces namespace lifecycle on create (needs kube-apiserver).
    #[must_use]
    pub fn with_namespace_lifecycle(mut self, n: crate::admission::NamespaceLifecycle) -> Self {
        self.namespaces = Some(n);
        self
    }

    /// The underlying storage.
    pub fn storage(&self) -> &dyn Store {
        &*self.storage
    }

    fn key(&self, def: &ResourceDef, ns: &str, name: &str) -> String {
        // Cluster-scoped objects have no namespace segment, as in kube-apiserver's keys.
        if def.namespaced {
            format!("{}/{}/{}/{ns}/{name}", self.prefix, def.group, def.plural)
        } else {
            format!("{}/{}/{}/{name}", self.prefix, def.group, def.plural)
        }
    }

    /// Whether objects may be created in namespace `ns` (it exists and is not terminating).
    pub async fn admit_namespace(&self, ns: &str, resource: &str, name: &str) -> ApiResult<()> {
        match &self.namespaces {
            Some(n) => n.admit_create(ns, resource, name).await,
            None => Ok(()),
        }
    }

    /// ControllerRevision `ns/name` from kube-apiserver (`None` without one: a bare dev
    /// server has no revisions).
    pub async fn controller_revision(
        &self,
        ns: &str,
        name: &str,
    ) -> ApiResult<Option<k8s_openapi::api::apps::v1::ControllerRevision>> {
        match &self.namespaces {
            Some(n) => n.controller_revision(ns, name).await,
            None => Ok(None),
        }
    }

    /// The etcd key of object `ns/name` of `def`.
    pub fn object_key(&self, def: &ResourceDef, ns: &str, name: &str) -> String {
        self.key(def, ns, name)
    }

    /// Key prefix of a collection (one namespace, or all when `ns` is None).
    pub fn collection_prefix(&self, def: &ResourceDef, ns: Option<&str>) -> String {
        match ns {
            Some(ns) if def.namespaced => {
                format!("{}/{}/{}/{ns}/", self.prefix, def.group, def.plural)
            }
            _ => format!("{}/{}/{}/", self.prefix, def.group, def.plural),
        }
    }

    /// GET one object.
    pub async fn get(&self, def: &ResourceDef, ns: &str, name: &str) -> ApiResult<Value> {
        let stored = self
            .storage
            .get(&self.key(def, ns, name))
            .await
            .map_err(storage_error)?;
        match stored {
            Some(s) => Ok(objects::with_rv(s.value, s.revision)),
            None => Err(ApiError::not_found(gr(def), name)),
        }
    }

    /// Decodes a request body into the kind, applying field validation. Returns the
    /// pruned object and warnings.
    pub fn decode_body(
        &self,
        def: &ResourceDef,
        body: Value,
        validation: FieldValidation,
    ) -> ApiResult<(Value, Vec<String>)> {
        let mut body = body;
        if !body.is_object() {
            return Err(ApiError::bad_request(format!(
                "{} in version \"v1\" cannot be handled as a {}: body must be a JSON object",
                def.kind, def.kind
            )));
        }
        let api_version = def.api_version();
        match body.get("apiVersion").and_then(Value::as_str) {
            None | Some("") => {
                body["apiVersion"] = json!(api_version);
            }
            Some(v) if v == api_version => {}
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "the API version in the data ({other}) does not match the expected API version ({api_version})"
                )));
            }
        }
        match body.get("kind").and_then(Value::as_str) {
            None | Some("") => {
                body["kind"] = json!(def.kind);
            }
            Some(k) if k == def.kind => {}
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "{other} in version \"v1\" cannot be handled as a {}: the kind does not match the endpoint",
                    def.kind
                )));
            }
        }
        let name = meta_str(&body, "name").unwrap_or("").to_string();
        let (pruned, unknown) = (def.decode)(&body)
            .map_err(|errs| ApiError::invalid(def.kind, def.group, &name, &errs))?;
        let mut warnings = Vec::new();
        if !unknown.is_empty() {
            match validation {
                FieldValidation::Strict => {
                    let list: Vec<String> = unknown
                        .iter()
                        .map(|f| format!("unknown field {f:?}"))
                        .collect();
                    return Err(ApiError::bad_request(format!(
                        "{} in version \"v1\" cannot be handled as a {}: strict decoding error: {}",
                        def.kind,
                        def.kind,
                        list.join(", ")
                    )));
                }
                FieldValidation::Warn => {
                    warnings.extend(unknown.iter().map(|f| format!("unknown field {f:?}")))
                }
                FieldValidation::Ignore => {}
            }
        }
        Ok((pruned, warnings))
    }

    /// The input policy's errors for writing `obj` over `old` (None on create) as `actor`.
    pub(crate) fn policy_errors(
        &self,
        def: &ResourceDef,
        old: Option<&Value>,
        obj: &Value,
        actor: &Actor,
    ) -> Vec<FieldError> {
        kubevirt_api::policy::admit(def.kind, old, obj, actor, &self.policy.gates)
    }

    /// Reads the objects `obj`'s kind needs for its admission (a VM's instance type and
    /// preference): each as stored now, or `None` when it does not exist.
    async fn read_references(&self, def: &ResourceDef, obj: &Value) -> ApiResult<Vec<Found>> {
        let mut found = Vec::new();
        for reference in (def.references)(obj) {
            let object = match reference.target {
                Target::Kind(kind) => {
                    let key = self.key(kind, &reference.namespace, &reference.name);
                    self.storage
                        .get(&key)
                        .await
                        .map_err(storage_error)?
                        .map(|s| s.value)
                }
                // Without kube-apiserver (a bare dev server) no claim is found.
                Target::Claim => match &self.namespaces {
                    Some(n) => n.claim(&reference.namespace, &reference.name).await?,
                    None => None,
                },
            };
            found.push(Found { reference, object });
        }
        Ok(found)
    }

    /// The objects `obj`'s kind needs for its admission, after it inferred what it infers
    /// from them (`KindStrategy::resolve`, which may rewrite `obj`: then they are read again
    /// for what it names now).
    async fn resolve_references(
        &self,
        def: &ResourceDef,
        obj: &mut Value,
    ) -> ApiResult<Vec<Found>> {
        let found = self.read_references(def, obj).await?;
        let before = obj.clone();
        let errs = (def.resolve)(obj, &found);
        if !errs.is_empty() {
            let name = meta_str(obj, "name").unwrap_or("").to_string();
            return Err(ApiError::invalid(def.kind, def.group, &name, &errs));
        }
        if *obj == before {
            return Ok(found);
        }
        self.read_references(def, obj).await
    }

    /// Validation and input policy of writing `obj` over `old` (None on create).
    fn validate(
        &self,
        def: &ResourceDef,
        old: Option<&Value>,
        obj: &Value,
        actor: Actor,
        found: Option<&[Found]>,
    ) -> ApiResult<()> {
        let name = meta_str(obj, "name").unwrap_or("").to_string();
        let meta: ObjectMeta =
            serde_json::from_value(obj.get("metadata").cloned().unwrap_or(json!({})))
                .map_err(|e| ApiError::bad_request(format!("invalid metadata: {e}")))?;
        let mut errs = validate_object_meta(&meta, "metadata");
        errs.extend((def.validate)(obj));
        errs.extend(kubevirt_api::policy::admit_with(
            def.kind,
            old,
            obj,
            &actor,
            &self.policy.gates,
            found,
        ));
        if errs.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid(def.kind, def.group, &name, &errs))
        }
    }

    /// POST: create an object from an already decoded body.
    pub async fn create(
        &self,
        def: &ResourceDef,
        ns: &str,
        body: Value,
        opts: &WriteOptions,
    ) -> ApiResult<Written> {
        let (mut obj, warnings) = self.decode_body(def, body, opts.field_validation)?;
        match meta_str(&obj, "namespace") {
            // A cluster-scoped object has none, whatever the body says (kube-apiserver).
            _ if !def.namespaced => set_meta(&mut obj, "namespace", None),
            None | Some("") => set_meta(&mut obj, "namespace", Some(json!(ns))),
            Some(n) if n == ns => {}
            Some(_) => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
        }
        if meta_str(&obj, "resourceVersion").is_some_and(|rv| !rv.is_empty()) {
            return Err(ApiError::bad_request(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        for f in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
            "generation",
        ] {
            set_meta(&mut obj, f, None);
        }
        if def.has_status
            && let Some(m) = obj.as_object_mut()
        {
            m.remove("status");
        }
        (def.default)(&mut obj);
        let generate = meta_str(&obj, "name")
            .is_none_or(str::is_empty)
            .then(|| meta_str(&obj, "generateName").unwrap_or("").to_string())
            .filter(|g| !g.is_empty());
        if let Some(prefix) = &generate {
            set_meta(&mut obj, "name", Some(json!(generate_name(prefix))));
        }
        let found = self.resolve_references(def, &mut obj).await?;
        self.validate(def, None, &obj, opts.actor.clone(), Some(&found))?;
        self.review_clones(def, None, &obj, opts).await?;
        if let Some(n) = &self.namespaces
            && def.namespaced
        {
            n.admit_create(ns, def.plural, meta_str(&obj, "name").unwrap_or(""))
                .await?;
        }
        set_meta(
            &mut obj,
            "uid",
            Some(json!(uuid::Uuid::new_v4().to_string())),
        );
        set_meta(
            &mut obj,
            "creationTimestamp",
            Some(json!(objects::now_rfc3339())),
        );
        set_meta(&mut obj, "generation", Some(json!(1)));
        crate::managed::record_update(def, None, &mut obj, &opts.field_manager, None);

        if opts.dry_run {
            return Ok(Written {
                object: obj,
                warnings,
                created: true,
            });
        }
        let attempts = if generate.is_some() { 8 } else { 1 };
        for attempt in 0..attempts {
            let name = meta_str(&obj, "name").unwrap_or("").to_string();
            let key = self.key(def, ns, &name);
            match self
                .storage
                .create(&key, &obj)
                .await
                .map_err(storage_error)?
            {
                Some(rev) => {
                    return Ok(Written {
                        object: objects::with_rv(obj, rev),
                        warnings,
                        created: true,
                    });
                }
                None => {
                    if let Some(prefix) = &generate
                        && attempt + 1 < attempts
                    {
                        set_meta(&mut obj, "name", Some(json!(generate_name(prefix))));
                        continue;
                    }
                    let mut err = ApiError::already_exists(gr(def), &name);
                    if generate.is_some() {
                        err.message.push_str(
                            ", the server was not able to generate a unique name for the object",
                        );
                        if let Some(d) = err.details.as_mut() {
                            d.retry_after_seconds = Some(1);
                        }
                    } else if let Ok(Some(existing)) = self.storage.get(&key).await
                        && existing
                            .value
                            .pointer("/metadata/deletionTimestamp")
                            .is_some()
                    {
                        err.message = format!("object is being deleted: {}", err.message);
                    }
                    return Err(err);
                }
            }
        }
        Err(ApiError::already_exists(
            gr(def),
            meta_str(&obj, "name").unwrap_or(""),
        ))
    }

    /// A VM whose spec changed is checked again against the instance type and preference
    /// it names (KubeVirt's VM admission does so on every update): a template field the
    /// instance type owns, or a reference to one that does not exist, is refused with the
    /// field named, whoever writes. Creates are checked in [`Self::create`].
    async fn recheck_references(
        &self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        current: &Value,
        desired: &Value,
    ) -> ApiResult<()> {
        if def.kind != kubevirt_api::catalogue::VIRTUAL_MACHINE.kind
            || objects::spec_part(desired, def.has_status)
                == objects::spec_part(current, def.has_status)
        {
            return Ok(());
        }
        // Not a VM: validation already said why.
        let Ok(vm) = serde_json::from_value::<kubevirt_api::VirtualMachine>(desired.clone()) else {
            return Ok(());
        };
        let found = crate::expand::references_found(self, &vm, ns).await?;
        if found.is_empty() {
            return Ok(());
        }
        let errs = kubevirt_api::policy::admit_with(
            def.kind,
            Some(current),
            desired,
            &Actor::Server,
            &self.policy.gates,
            Some(&found),
        );
        if errs.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid(def.kind, def.group, name, &errs))
        }
    }

    /// Read-modify-write with CAS retries. `mutate` gets the current object (with its
    /// resourceVersion) and returns the desired one, or an error to abort.
    async fn guaranteed_update<F>(
        &self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        dry_run: bool,
        review: Option<&WriteOptions>,
        mut mutate: F,
    ) -> ApiResult<Value>
    where
        F: FnMut(&Value) -> ApiResult<Value>,
    {
        let key = self.key(def, ns, name);
        for _ in 0..MAX_RETRIES {
            let Some(current) = self.storage.get(&key).await.map_err(storage_error)? else {
                return Err(ApiError::not_found(gr(def), name));
            };
            let Stored {
                value, revision, ..
            } = current;
            let current_obj = objects::with_rv(value.clone(), revision);
            let desired = objects::without_rv(mutate(&current_obj)?);
            if objects::comparable(&desired) == objects::comparable(&value) {
                // Nothing changed: no write, no event, same resourceVersion.
                return Ok(current_obj);
            }
            self.recheck_references(def, ns, name, &value, &desired)
                .await?;
            if let Some(opts) = review {
                self.review_clones(def, Some(&value), &desired, opts)
                    .await?;
            }
            let finalizing = desired.pointer("/metadata/deletionTimestamp").is_some()
                && objects::finalizers(&desired).is_empty();
            if dry_run {
                return Ok(objects::with_rv(desired, revision));
            }
            if finalizing {
                if let Some(rev) = self
                    .storage
                    .delete(&key, revision)
                    .await
                    .map_err(storage_error)?
                {
                    return Ok(objects::with_rv(desired, rev));
                }
                continue;
            }
            if let Some(rev) = self
                .storage
                .update(&key, &desired, revision)
                .await
                .map_err(storage_error)?
            {
                return Ok(objects::with_rv(desired, rev));
            }
        }
        Err(ApiError::conflict(
            gr(def),
            name,
            "too many concurrent writers, please try again",
        ))
    }

    /// Merges an incoming full object (PUT or patched result) onto the current one,
    /// applying every update rule. `status_only` is the /status subresource; `actor`
    /// is who writes, for the input policy (kept out of `Via`, which server code builds).
    #[allow(clippy::too_many_arguments)]
    fn prepare_update(
        &self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        current: &Value,
        incoming: &Value,
        via: Via<'_>,
        actor: Actor,
    ) -> ApiResult<Value> {
        let Via {
            status_only,
            manager,
        } = via;
        let gr = gr(def);
        match meta_str(incoming, "name") {
            Some(n) if n != name => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )));
            }
            _ => {}
        }
        match meta_str(incoming, "namespace") {
            Some(n) if !n.is_empty() && n != ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => {}
        }
        let current_rv = meta_str(current, "resourceVersion").unwrap_or("");
        match meta_str(incoming, "resourceVersion") {
            Some(rv) if !rv.is_empty() && rv != current_rv => {
                return Err(ApiError::stale(gr, name));
            }
            _ => {}
        }
        if let Some(uid) = meta_str(incoming, "uid")
            && !uid.is_empty()
            && Some(uid) != meta_str(current, "uid")
        {
            return Err(ApiError::conflict(
                gr,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(current, "uid").unwrap_or("")
                ),
            ));
        }

        let mut new = if status_only {
            // CRD semantics: only .status (and managedFields) come from the request.
            let mut n = current.clone();
            match incoming.get("status") {
                Some(s) => n["status"] = s.clone(),
                None => {
                    if let Some(m) = n.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
            n
        } else {
            let mut n = incoming.clone();
            if def.has_status {
                match current.get("status") {
                    Some(s) => n["status"] = s.clone(),
                    None => {
                        if let Some(m) = n.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
            }
            n
        };
        // Server-owned metadata always comes from storage.
        for f in [
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
        ] {
            set_meta(
                &mut new,
                f,
                current.pointer(&format!("/metadata/{f}")).cloned(),
            );
        }
        set_meta(&mut new, "selfLink", None);
        new["apiVersion"] = json!(def.api_version());
        new["kind"] = json!(def.kind);

        let deleting = current.pointer("/metadata/deletionTimestamp").is_some();
        if deleting && !status_only {
            let old: std::collections::HashSet<String> =
                objects::finalizers(current).into_iter().collect();
            let added: Vec<String> = objects::finalizers(&new)
                .into_iter()
                .filter(|f| !old.contains(f))
                .collect();
            if !added.is_empty() {
                return Err(ApiError::invalid(
                    def.kind,
                    def.group,
                    name,
                    &[FieldError::forbidden(
                        "metadata.finalizers",
                        &format!(
                            "no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
                        ),
                    )],
                ));
            }
        }
        // /status takes nothing but status from the request: of the policy only who may
        // write it applies there (virt-handler's node restriction).
        if status_only {
            let errs = kubevirt_api::policy::admit_status(def.kind, current, &new, &actor);
            if !errs.is_empty() {
                return Err(ApiError::invalid(def.kind, def.group, name, &errs));
            }
        } else {
            self.validate(def, Some(current), &new, actor, None)?;
        }
        if objects::spec_part(&new, def.has_status) != objects::spec_part(current, def.has_status) {
            let g = current
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            set_meta(&mut new, "generation", Some(json!(g + 1)));
        }
        crate::managed::record_update(
            def,
            Some(current),
            &mut new,
            manager,
            status_only.then_some("status"),
        );
        Ok(new)
    }

    /// PUT on the main resource or `/status`.
    pub async fn update(
        &self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        body: Value,
        status_only: bool,
        opts: &WriteOptions,
    ) -> ApiResult<Written> {
        let (incoming, warnings) = self.decode_body(def, body, opts.field_validation)?;
        if meta_str(&incoming, "resourceVersion").is_none_or(str::is_empty) {
            return Err(ApiError::invalid(
                def.kind,
                def.group,
                name,
                &[FieldError::invalid(
                    "metadata.resourceVersion",
                    "0x0",
                    "must be specified for an update",
                )],
            ));
        }
        let object = self
            .guaranteed_update(def, ns, name, opts.dry_run, Some(opts), |cur| {
                self.prepare_update(
                    def,
                    ns,
                    name,
                    cur,
                    &incoming,
                    Via {
                        status_only,
                        manager: &opts.field_manager,
                    },
                    opts.actor.clone(),
                )
            })
            .await?;
        Ok(Written {
            object,
            warnings,
            created: false,
        })
    }

    /// Read-modify-write by server code (action subresources): `f` edits a copy of
    /// the current object; the result goes through every update rule and CAS retries.
    pub async fn mutate<F>(
        &self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        via: Via<'_>,
        dry_run: bool,
        mut f: F,
    ) -> ApiResult<Value>
    where
        F: FnMut(&mut Value) -> ApiResult<()>,
    {
        self.guaranteed_update(def, ns, name, dry_run, None, |cur| {
            let mut next = cur.clone();
            f(&mut next)?;
            // Server code: the action subresource was authorized for what it writes.
            self.prepare_update(def, ns, name, cur, &next, via, Actor::Server)
        })
        .await
    }

    /// PATCH with JSON patch or merge patch (server-side apply is in [`Self::apply`]).
    pub async fn patch(
        &self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        patch: &Patch,
        status_only: bool,
        opts: &WriteOptions,
    ) -> ApiResult<Written> {
        let mut warnings = Vec::new();
        let object = self
            .guaranteed_update(def, ns, name, opts.dry_run, Some(opts), |cur| {
                let mut doc = cur.clone();
                match patch {
                    Patch::Json(p) => match apply_json_patch(&mut doc, p, JSON_PATCH_MAX_COPY_BYTES) {
                        Ok(()) => {}
                        Err(JsonPatchError::CopyLimit { limit }) => {
                            return Err(ApiError::too_large(format!(
                                "the JSON patch copies more than the {limit} bytes allowed"
                            )));
                        }
                        Err(JsonPatchError::Patch(e)) => {
                            return Err(ApiError::invalid(def.kind, def.group, name, &[FieldError::invalid("", "", &format!("the server rejected our request due to an error in our request: {e}"))]));
                        }
                    },
                    Patch::Merge(p) => json_patch::merge(&mut doc, p),
                }
                let (decoded, w) = self.decode_body(def, doc, opts.field_validation)?;
                warnings = w;
                self.prepare_update(def, ns, name, cur, &decoded, Via { status_only, manager: &opts.field_manager }, opts.actor.clone())
            })
            .await?;
        Ok(Written {
            object,
            warnings,
            created: false,
        })
    }

    /// Server-side apply (`application/apply-patch+yaml`): creates the object when absent.
    pub async fn apply(
        &self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        applied: Value,
        how: ApplyHow,
        opts: &WriteOptions,
    ) -> ApiResult<Written> {
        let ApplyHow { force, status_only } = how;
        let key = self.key(def, ns, name);
        // An apply to /status names the status only, and its kind may require a spec: decode
        // it with the live object's spec, as kube-apiserver decodes an apply configuration
        // merged onto the live object, then drop that spec again (it is not the manager's).
        // Found when virt-operator's status apply of CDIConfig was refused "spec: Required".
        let borrowed_spec = status_only && applied.get("spec").is_none();
        let mut applied = applied;
        if borrowed_spec
            && applied.is_object()
            && let Some(cur) = self.storage.get(&key).await.map_err(storage_error)?
            && let Some(spec) = cur.value.get("spec")
        {
            applied["spec"] = spec.clone();
        }
        let (mut applied, warnings) = self.decode_body(def, applied, opts.field_validation)?;
        if borrowed_spec && let Some(o) = applied.as_object_mut() {
            o.remove("spec");
        }
        if meta_str(&applied, "name").is_none_or(str::is_empty) {
            return Err(ApiError::invalid(
                def.kind,
                def.group,
                name,
                &[FieldError::required("metadata.name", "")],
            ));
        }
        // The request was authorized for the URL's name: an apply that would create an
        // object under another name is refused, as kube-apiserver refuses it (L1 of the
        // security review at 5efe883).
        if let Some(n) = meta_str(&applied, "name")
            && n != name
        {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({n}) does not match the name on the URL ({name})"
            )));
        }
        if !status_only
            && self
                .storage
                .get(&key)
                .await
                .map_err(storage_error)?
                .is_none()
        {
            let mut obj =
                crate::managed::apply_to(None, &applied, &opts.field_manager, force, def, None)
                    .map_err(|e| e.into_api_error(def, name))?;
            // The apply entry replaces the Update entry create would record.
            let created = self.create_applied(def, ns, &mut obj, opts).await;
            match created {
                Err(e) if e.reason == "AlreadyExists" => {} // raced with a creator: apply onto it
                other => {
                    return other.map(|mut w| {
                        w.warnings.extend(warnings.clone());
                        w
                    });
                }
            }
        }
        let object = self
            .guaranteed_update(def, ns, name, opts.dry_run, Some(opts), |cur| {
                let merged = crate::managed::apply_to(
                    Some(cur),
                    &applied,
                    &opts.field_manager,
                    force,
                    def,
                    status_only.then_some("status"),
                )
                .map_err(|e| e.into_api_error(def, name))?;
                let mut next = self.prepare_update(
                    def,
                    ns,
                    name,
                    cur,
                    &merged,
                    Via {
                        status_only,
                        manager: "",
                    },
                    opts.actor.clone(),
                )?;
                // prepare_update must not record an Update entry for an apply.
                crate::managed::copy_managed_fields(&merged, &mut next);
                Ok(next)
            })
            .await?;
        Ok(Written {
            object,
            warnings,
            created: false,
        })
    }

    async fn create_applied(
        &self,
        def: &ResourceDef,
        ns: &str,
        obj: &mut Value,
        opts: &WriteOptions,
    ) -> ApiResult<Written> {
        let managed = obj.pointer("/metadata/managedFields").cloned();
        let mut create_opts = opts.clone();
        create_opts.field_validation = FieldValidation::Ignore;
        create_opts.field_manager = String::new();
        let mut body = obj.clone();
        set_meta(&mut body, "managedFields", None);
        let mut w = self
            .create_with_managed(def, ns, body, &create_opts, managed)
            .await?;
        w.created = true;
        Ok(w)
    }

    async fn create_with_managed(
        &self,
        def: &ResourceDef,
        ns: &str,
        body: Value,
        opts: &WriteOptions,
        managed: Option<Value>,
    ) -> ApiResult<Written> {
        let mut body = body;
        set_meta(&mut body, "managedFields", managed);
        let mut opts = opts.clone();
        opts.field_manager = crate::managed::KEEP_MANAGED.to_string();
        self.create(def, ns, body, &opts).await
    }

    /// DELETE one object.
    pub async fn delete(
        &self,
        def: &ResourceDef,
        ns: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> ApiResult<DeleteOutcome> {
        validate_delete_options(opts)?;
        let dry_run = opts
            .dry_run
            .as_ref()
            .is_some_and(|d| d.iter().any(|x| x == "All"));
        let key = self.key(def, ns, name);
        let gr = gr(def);
        for _ in 0..MAX_RETRIES {
            let Some(cur) = self.storage.get(&key).await.map_err(storage_error)? else {
                return Err(ApiError::not_found(gr, name));
            };
            let uid = meta_str(&cur.value, "uid").unwrap_or("").to_string();
            if let Some(p) = &opts.preconditions {
                if let Some(want) = &p.uid
                    && *want != uid
                {
                    return Err(ApiError::conflict(
                        gr,
                        name,
                        &format!(
                            "the UID in the precondition ({want}) does not match the UID in record ({uid}). The object might have been deleted and then recreated"
                        ),
                    ));
                }
                if let Some(want) = &p.resource_version
                    && *want != cur.revision.to_string()
                {
                    return Err(ApiError::conflict(
                        gr,
                        name,
                        &format!(
                            "the ResourceVersion in the precondition ({want}) does not match the ResourceVersion in record ({}). The object might have been modified",
                            cur.revision
                        ),
                    ));
                }
            }
            let mut fins = objects::finalizers(&cur.value);
            let policy = match (opts.propagation_policy.as_deref(), opts.orphan_dependents) {
                (Some("Orphan"), _) | (None, Some(true)) => Some(Propagation::Orphan),
                (Some("Foreground"), _) => Some(Propagation::Foreground),
                (Some("Background"), _) | (None, Some(false)) => Some(Propagation::Background),
                _ => None,
            };
            let ensure = |fins: &mut Vec<String>, f: &str, on: bool| {
                fins.retain(|x| x != f);
                if on {
                    fins.push(f.to_string());
                }
            };
            match policy {
                Some(Propagation::Orphan) => {
                    ensure(&mut fins, "foregroundDeletion", false);
                    ensure(&mut fins, "orphan", true);
                }
                Some(Propagation::Foreground) => {
                    ensure(&mut fins, "orphan", false);
                    ensure(&mut fins, "foregroundDeletion", true);
                }
                Some(Propagation::Background) => {
                    ensure(&mut fins, "orphan", false);
                    ensure(&mut fins, "foregroundDeletion", false);
                }
                None => {}
            }
            if fins.is_empty() {
                if dry_run {
                    return Ok(DeleteOutcome::Deleted(Box::new(success_status(
                        def, name, &uid,
                    ))));
                }
                if self
                    .storage
                    .delete(&key, cur.revision)
                    .await
                    .map_err(storage_error)?
                    .is_some()
                {
                    return Ok(DeleteOutcome::Deleted(Box::new(success_status(
                        def, name, &uid,
                    ))));
                }
                continue;
            }
            let mut next = cur.value.clone();
            objects::set_finalizers(&mut next, &fins);
            if next.pointer("/metadata/deletionTimestamp").is_none() {
                set_meta(
                    &mut next,
                    "deletionTimestamp",
                    Some(json!(objects::now_rfc3339())),
                );
                set_meta(&mut next, "deletionGracePeriodSeconds", Some(json!(0)));
                let g = next
                    .pointer("/metadata/generation")
                    .and_then(Value::as_i64)
                    .unwrap_or(1);
                set_meta(&mut next, "generation", Some(json!(g + 1)));
            }
            if next == cur.value || dry_run {
                return Ok(DeleteOutcome::Pending(objects::with_rv(next, cur.revision)));
            }
            if let Some(rev) = self
                .storage
                .update(&key, &next, cur.revision)
                .await
                .map_err(storage_error)?
            {
                return Ok(DeleteOutcome::Pending(objects::with_rv(next, rev)));
            }
        }
        Err(ApiError::conflict(
            gr,
            name,
            "too many concurrent writers, please try again",
        ))
    }

    /// DELETE a collection: every object matching the list options, one by one.
    pub async fn delete_collection(
        &self,
        def: &ResourceDef,
        ns: &str,
        list: &ListOptions,
        opts: &DeleteOptions,
    ) -> ApiResult<Listed> {
        validate_delete_options(opts)?;
        let listed = self.list(def, Some(ns), list).await?;
        for item in &listed.items {
            let name = meta_str(item, "name").unwrap_or("");
            match self.delete(def, ns, name, opts).await {
                Ok(_) => {}
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(listed)
    }

    /// Resolves list resourceVersion parameters into the revision to read (0 = latest).
    pub async fn list_revision(&self, opts: &ListOptions) -> ApiResult<i64> {
        let rv = opts.resource_version.as_deref().filter(|s| !s.is_empty());
        let m = opts
            .resource_version_match
            .as_deref()
            .filter(|s| !s.is_empty());
        if opts.continue_token.is_some() {
            if rv.is_some_and(|r| r != "0") {
                return Err(ApiError::bad_request(
                    "specifying resource version is not allowed when using continue",
                ));
            }
            if m.is_some() {
                return Err(list_options_invalid(
                    "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue is provided",
                ));
            }
            return Ok(0);
        }
        match (rv, m) {
            (None, Some(_)) => Err(list_options_invalid(
                "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
            )),
            (_, Some(other)) if other != "Exact" && other != "NotOlderThan" => {
                Err(ApiError::invalid(
                    "ListOptions",
                    "meta.k8s.io",
                    "",
                    &[FieldError::not_supported(
                        "resourceVersionMatch",
                        other,
                        &["Exact", "NotOlderThan", ""],
                    )],
                ))
            }
            (Some("0"), Some("Exact")) => Err(list_options_invalid(
                "resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
            )),
            (None, None) | (Some("0"), _) => Ok(0),
            (Some(r), Some("Exact")) => parse_rv(r),
            (Some(r), None) if opts.limit > 0 => parse_rv(r),
            (Some(r), _) => {
                let want = parse_rv(r)?;
                self.wait_for_revision(want).await?;
                Ok(0)
            }
        }
    }

    /// Waits (up to 3 s) until the store has reached `want`, else 504 as kube-apiserver.
    pub async fn wait_for_revision(&self, want: i64) -> ApiResult<()> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
        loop {
            let cur = self
                .storage
                .current_revision()
                .await
                .map_err(storage_error)?;
            if cur >= want {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(ApiError::timeout("Too large resource version", true));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Whether `obj` matches the selectors of `opts`.
    pub fn matches(def: &ResourceDef, opts: &ListOptions, obj: &Value) -> bool {
        if let Some(ls) = &opts.label_selector
            && !ls.matches(&objects::labels(obj))
        {
            return false;
        }
        if let Some(fs) = &opts.field_selector
            && !fs.matches(&|f: &str| def.field_value(obj, f).flatten())
        {
            return false;
        }
        true
    }

    /// LIST with selectors, paging and resourceVersion semantics.
    pub async fn list(
        &self,
        def: &ResourceDef,
        ns: Option<&str>,
        opts: &ListOptions,
    ) -> ApiResult<Listed> {
        let mut items = Vec::new();
        let meta = self
            .list_each(def, ns, opts, |obj| {
                items.push(obj);
                Ok(())
            })
            .await?;
        Ok(Listed {
            items,
            revision: meta.revision,
            continue_token: meta.continue_token,
            remaining: meta.remaining,
        })
    }

    /// LIST from the watch cache, when it can answer as etcd would: an unpaged LIST at the
    /// latest revision (after the cache has caught up with etcd's current revision, as
    /// kube-apiserver's consistent reads from cache), at `0` (any) or not older than a
    /// revision. `None`: etcd answers (exact and paged reads, a cache not synced or slow,
    /// a latest-revision read when the cache cannot trust etcd's progress notifications).
    async fn list_cached(
        &self,
        def: &ResourceDef,
        ns: Option<&str>,
        opts: &ListOptions,
        sink: &mut impl FnMut(Value) -> ApiResult<()>,
    ) -> ApiResult<Option<ListMeta>> {
        let (Some(cache), Some(c)) = (self.cache.as_deref(), self.cacher(def)) else {
            return Ok(None);
        };
        if opts.continue_token.is_some() || opts.limit > 0 {
            return Ok(None);
        }
        let rv = opts.resource_version.as_deref().filter(|s| !s.is_empty());
        let m = opts
            .resource_version_match
            .as_deref()
            .filter(|s| !s.is_empty());
        let want = match (rv, m) {
            (None, None) => {
                let current = self
                    .storage
                    .current_revision()
                    .await
                    .map_err(storage_error)?;
                // Without trusted progress notifications the cache reaches etcd's revision
                // only when this resource had the last write: then it answers at once,
                // else etcd does (waiting could take forever on a quiet resource).
                if !c.trusts_progress() && c.revision().is_none_or(|r| r < current) {
                    cache.count("list", Some(Miss::NoProgress));
                    return Ok(None);
                }
                current
            }
            (Some(r), None | Some("NotOlderThan")) => match r.parse::<i64>() {
                Ok(v) if v >= 0 => v,
                _ => return Ok(None),
            },
            _ => return Ok(None),
        };
        let listed = match c.wait_for(want, CACHE_WAIT).await {
            Ok(()) => c.list(&self.collection_prefix(def, ns)),
            Err(miss) => Err(miss),
        };
        let (items, revision) = match listed {
            Ok(l) => l,
            Err(miss) => {
                cache.count("list", Some(miss));
                return Ok(None);
            }
        };
        cache.count("list", None);
        for raw in items {
            let value: Value = serde_json::from_slice(&raw.bytes)
                .map_err(|_| ApiError::internal("a cached object is corrupt"))?;
            let obj = objects::with_rv(value, raw.revision);
            if Self::matches(def, opts, &obj) {
                sink(obj)?;
            }
        }
        Ok(Some(ListMeta {
            revision,
            continue_token: None,
            remaining: None,
        }))
    }

    /// LIST that hands each matching item (with resourceVersion) to `sink` as soon as it
    /// is decoded, instead of collecting them: the HTTP LIST encodes items one by one,
    /// so a large collection is held only as etcd's encoded bytes and the encoded
    /// response, never as a `Vec<Value>` (decoded JSON is ~10× its text). The sink's
    /// error aborts the LIST.
    pub async fn list_each(
        &self,
        def: &ResourceDef,
        ns: Option<&str>,
        opts: &ListOptions,
        mut sink: impl FnMut(Value) -> ApiResult<()>,
    ) -> ApiResult<ListMeta> {
        if let Some(meta) = self.list_cached(def, ns, opts, &mut sink).await? {
            return Ok(meta);
        }
        let prefix = self.collection_prefix(def, ns);
        let mut revision = self.list_revision(opts).await?;
        let mut start = prefix.clone();
        if let Some(tok) = &opts.continue_token {
            let t = decode_continue(tok)?;
            if t.rv > 0 {
                revision = t.rv;
            }
            start = format!("{prefix}{}", t.start);
        }
        // An unpaged LIST still reads etcd in pages (at the first page's revision), so no
        // gRPC message grows with the collection.
        let chunk = if opts.limit > 0 {
            opts.limit.max(50)
        } else {
            UNPAGED_CHUNK
        };
        let mut emitted = 0i64;
        loop {
            let page = match self
                .storage
                .list_raw(&prefix, &start, revision, chunk)
                .await
            {
                Ok(p) => p,
                Err(StorageError::Compacted(_)) if opts.continue_token.is_some() => {
                    let mut e = ApiError::expired(
                        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
                    );
                    e.continue_token = Some(encode_continue(
                        -1,
                        start.strip_prefix(&prefix).unwrap_or(""),
                    ));
                    return Err(e);
                }
                Err(e) => return Err(storage_error(e)),
            };
            revision = page.revision;
            let n = page.kvs.len();
            let mut last_key = None;
            for (i, kv) in page.kvs.iter().enumerate() {
                let s = crate::storage::decode_kv(kv).map_err(storage_error)?;
                let obj = objects::with_rv(s.value, s.revision);
                if Self::matches(def, opts, &obj) {
                    sink(obj)?;
                    emitted += 1;
                }
                if opts.limit > 0 && emitted >= opts.limit {
                    let more = i + 1 < n || page.more;
                    let token = more.then(|| {
                        encode_continue(
                            revision,
                            &format!("{}\0", s.key.strip_prefix(&prefix).unwrap_or("")),
                        )
                    });
                    let remaining =
                        (more && opts.label_selector.is_none() && opts.field_selector.is_none())
                            .then_some(page.remaining + (n - i - 1) as i64);
                    return Ok(ListMeta {
                        revision,
                        continue_token: token,
                        remaining,
                    });
                }
                last_key = Some(s.key);
            }
            if !page.more {
                return Ok(ListMeta {
                    revision,
                    continue_token: None,
                    remaining: None,
                });
            }
            if let Some(k) = last_key {
                start = format!("{k}\0");
            }
        }
    }
}

/// How an update is made: through `/status` or not, and by which field manager.
#[derive(Debug, Clone, Copy)]
pub struct Via<'a> {
    /// The /status subresource.
    pub status_only: bool,
    /// Field manager recorded for the write ("" keeps managedFields as they are).
    pub manager: &'a str,
}

/// Options of a server-side apply.
#[derive(Debug, Clone, Copy)]
pub struct ApplyHow {
    /// Take ownership of conflicting fields.
    pub force: bool,
    /// Apply to /status.
    pub status_only: bool,
}

/// Outcome of a DELETE.
#[derive(Debug)]
pub enum DeleteOutcome {
    /// Removed from storage: return the Success Status.
    Deleted(Box<Status>),
    /// Finalizers remain: return the object with deletionTimestamp.
    Pending(Value),
}

fn success_status(def: &ResourceDef, name: &str, uid: &str) -> Status {
    Status {
        status: Some("Success".into()),
        details: Some(StatusDetails {
            name: Some(name.into()),
            group: Some(def.group.into()),
            kind: Some(def.plural.into()),
            uid: Some(uid.into()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(crate) fn validate_delete_options(opts: &DeleteOptions) -> ApiResult<()> {
    let mut errs = Vec::new();
    if opts.orphan_dependents.is_some() && opts.propagation_policy.is_some() {
        errs.push(FieldError::invalid(
            "propagationPolicy",
            opts.propagation_policy.as_deref().unwrap_or(""),
            "orphanDependents and deletionPropagation cannot be both set",
        ));
    }
    if let Some(p) = &opts.propagation_policy
        && !matches!(p.as_str(), "Foreground" | "Background" | "Orphan")
    {
        errs.push(FieldError::not_supported(
            "propagationPolicy",
            p,
            &["Foreground", "Background", "Orphan", "nil"],
        ));
    }
    for d in opts.dry_run.iter().flatten() {
        if d != "All" {
            errs.push(FieldError::not_supported("dryRun", d, &["All"]));
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid("DeleteOptions", "meta.k8s.io", "", &errs))
    }
}

/// A parsed patch body.
#[derive(Debug)]
pub enum Patch {
    /// RFC 6902.
    Json(json_patch::Patch),
    /// RFC 7386.
    Merge(Value),
}

/// How many bytes the `copy` operations of one JSON patch may copy in all, as
/// kube-apiserver's JSONPatchMaxCopyBytes: each copy of `/spec` into itself doubles the
/// object, so without a bound a few dozen operations exhaust memory.
pub const JSON_PATCH_MAX_COPY_BYTES: usize = 3 << 20;

/// Why a JSON patch was not applied.
#[derive(Debug, thiserror::Error)]
pub enum JsonPatchError {
    /// The copies add up to more than allowed.
    #[error("the JSON patch copies more than {limit} bytes")]
    CopyLimit { limit: usize },
    /// An operation failed (missing path, failed test…).
    #[error(transparent)]
    Patch(#[from] json_patch::PatchError),
}

/// Applies `patch` operation by operation, stopping before a `copy` would take the bytes
/// copied so far over `max_copy_bytes`. On error `doc` is half-patched: callers patch a
/// copy of the stored object and drop it.
pub fn apply_json_patch(
    doc: &mut Value,
    patch: &json_patch::Patch,
    max_copy_bytes: usize,
) -> Result<(), JsonPatchError> {
    let mut copied = 0usize;
    for op in patch.iter() {
        if let json_patch::PatchOperation::Copy(c) = op
            && let Some(from) = doc.pointer(c.from.as_str())
        {
            copied = copied.saturating_add(json_size(from));
            if copied > max_copy_bytes {
                return Err(JsonPatchError::CopyLimit {
                    limit: max_copy_bytes,
                });
            }
        }
        // kube-apiserver's JSON patch (evanphx/json-patch) takes a missing member of an
        // existing object as equal to `null`: upstream virtctl relies on it (`credentials
        // add-ssh-key` tests `accessCredentials` for null before adding the array).
        if let json_patch::PatchOperation::Test(t) = op
            && t.value.is_null()
            && doc.pointer(t.path.as_str()).is_none()
            && t.path
                .parent()
                .is_some_and(|p| doc.pointer(p.as_str()).is_some_and(Value::is_object))
        {
            continue;
        }
        json_patch::patch(doc, std::slice::from_ref(op))?;
    }
    Ok(())
}

/// The size of `v` serialized, without building the text.
fn json_size(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut n = Count(0);
    // Writing a Value to an infallible writer cannot fail.
    let _ = serde_json::to_writer(&mut n, v);
    n.0
}

fn encode_continue(rv: i64, start: &str) -> String {
    let t = ContinueToken {
        v: "meta.k8s.io/v1".into(),
        rv,
        start: start.to_string(),
    };
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(serde_json::to_vec(&t).unwrap_or_default())
}

fn decode_continue(tok: &str) -> ApiResult<ContinueToken> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(tok.trim_end_matches('='))
        .or_else(|_| base64::engine::general_purpose::URL_SAFE.decode(tok))
        .map_err(|e| ApiError::bad_request(format!("invalid continue token: {e}")))?;
    let t: ContinueToken = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("invalid continue token: {e}")))?;
    if t.v != "meta.k8s.io/v1" || t.start.contains("..") || t.start.starts_with('/') {
        return Err(ApiError::bad_request(
            "invalid continue token: unsupported version or key",
        ));
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ops(v: serde_json::Value) -> json_patch::Patch {
        serde_json::from_value(v).expect("patch")
    }

    #[test]
    fn a_json_patch_copy_bomb_stops_at_the_copy_limit() {
        let mut doc = serde_json::json!({"spec": {"x": "a".repeat(1000)}});
        // Each copy of /spec into itself doubles it: 40 of them would need 2^40 × 1 kB.
        let bomb: Vec<_> = (0..40)
            .map(|i| serde_json::json!({"op": "copy", "from": "/spec", "path": format!("/spec/c{i}")}))
            .collect();
        let e = apply_json_patch(&mut doc, &ops(bomb.into()), 1 << 20).unwrap_err();
        assert!(
            matches!(e, JsonPatchError::CopyLimit { limit } if limit == 1 << 20),
            "{e}"
        );
        assert!(json_size(&doc) < 2 << 20, "{} bytes", json_size(&doc));
    }

    #[test]
    fn ordinary_json_patches_apply_and_count_only_copies() {
        let mut doc = serde_json::json!({"spec": {"a": 1}, "metadata": {"labels": {}}});
        let p = ops(serde_json::json!([
            {"op": "test", "path": "/spec/a", "value": 1},
            {"op": "add", "path": "/metadata/labels/x", "value": "y".repeat(100)},
            {"op": "copy", "from": "/spec/a", "path": "/spec/b"},
            {"op": "move", "from": "/spec/b", "path": "/spec/c"}
        ]));
        apply_json_patch(&mut doc, &p, 16).unwrap();
        assert_eq!(doc["spec"], serde_json::json!({"a": 1, "c": 1}));
        let failing = ops(serde_json::json!([{"op": "test", "path": "/spec/a", "value": 2}]));
        assert!(matches!(
            apply_json_patch(&mut doc, &failing, 16),
            Err(JsonPatchError::Patch(_))
        ));
        // A missing member tests equal to null, as in kube-apiserver (virtctl's
        // `credentials add-ssh-key` patch); a missing parent still fails.
        let virtctl = ops(serde_json::json!([
            {"op": "test", "path": "/spec/accessCredentials", "value": null},
            {"op": "add", "path": "/spec/accessCredentials", "value": []},
            {"op": "add", "path": "/spec/accessCredentials/-", "value": {"x": 1}}
        ]));
        apply_json_patch(&mut doc, &virtctl, 16).unwrap();
        assert_eq!(
            doc["spec"]["accessCredentials"],
            serde_json::json!([{"x": 1}])
        );
        let missing_parent =
            ops(serde_json::json!([{"op": "test", "path": "/nope/x", "value": null}]));
        assert!(apply_json_patch(&mut doc, &missing_parent, 16).is_err());
        let present = ops(serde_json::json!([{"op": "test", "path": "/spec/a", "value": null}]));
        assert!(apply_json_patch(&mut doc, &present, 16).is_err());
    }

    #[test]
    fn continue_token_roundtrip() {
        let t = encode_continue(42, "ns/vm-7\0");
        let d = decode_continue(&t).unwrap();
        assert_eq!((d.rv, d.start.as_str()), (42, "ns/vm-7\0"));
        assert_eq!(decode_continue("!!").unwrap_err().code, 400);
    }

    #[test]
    fn generated_names_have_five_char_suffix() {
        let n = generate_name("vm-");
        assert_eq!(n.len(), 8);
        assert!(n[3..].bytes().all(|b| NAME_ALPHABET.contains(&b)));
        assert_eq!(generate_name(&"a".repeat(100)).len(), 63);
    }

    #[test]
    fn delete_options_validation() {
        let bad = DeleteOptions {
            propagation_policy: Some("Later".into()),
            ..Default::default()
        };
        assert_eq!(validate_delete_options(&bad).unwrap_err().code, 422);
        let both = DeleteOptions {
            propagation_policy: Some("Orphan".into()),
            orphan_dependents: Some(true),
            ..Default::default()
        };
        assert_eq!(validate_delete_options(&both).unwrap_err().code, 422);
    }
}

/// The registry over an in-memory store: the REST logic without etcd.
#[cfg(test)]
mod registry_tests;
