//! The HTTP layer: a chain of tower layers ([`router`]) — panics, metrics, health, limits,
//! authentication, authorization — in front of one thin handler that hands off to
//! discovery, OpenAPI, the registry, watches or subresources. Handlers only translate
//! between HTTP and the registry.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use serde_json::{Value, json};

use kubevirt_api::catalogue;

use crate::auth::PeerIdentity;
use crate::convert::{self, IncludeObject};
use crate::discovery::Doc;
use crate::error::{ApiError, ApiResult};
use crate::kinds::ResourceDef;
use crate::metrics::{NamespaceLabels, RequestLabels, VerbLabels};
use crate::request::{self, Output, Query, RequestInfo};
use crate::rest::{
    DeleteOptions, DeleteOutcome, FieldValidation, ListOptions, Patch, WriteOptions,
};
use crate::selector::{FieldSelector, LabelSelector};
use crate::state::AppState;
use crate::watch::{self, WatchParams};

/// JSON patch content type.
const JSON_PATCH: &str = "application/json-patch+json";
/// Merge patch content type.
const MERGE_PATCH: &str = "application/merge-patch+json";
/// Server-side apply content type.
const APPLY_PATCH: &str = "application/apply-patch+yaml";
/// Strategic merge patch: accepted on `/scale` only (a Scale has no lists to merge).
const STRATEGIC_MERGE_PATCH: &str = "application/strategic-merge-patch+json";
/// Patch types we accept, in the order kube-apiserver lists them for CRDs.
const PATCH_TYPES: [&str; 3] = [JSON_PATCH, MERGE_PATCH, APPLY_PATCH];
/// Most operations a JSON patch may carry.
const MAX_PATCH_OPS: usize = 10_000;

/// The plain-HTTP metrics listener's routes (`--metrics-addr`): `/metrics` and `/healthz`,
/// nothing of the API, so it needs no credentials.
pub fn metrics_router(metrics: Arc<crate::metrics::Metrics>) -> Router {
    Router::new()
        .route(
            "/metrics",
            axum::routing::get(move || {
                let body = metrics.encode();
                async move {
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            "text/plain; version=0.0.4; charset=utf-8",
                        )],
                        body,
                    )
                }
            }),
        )
        .route("/healthz", axum::routing::get(|| async { "ok" }))
}

/// The request chain, outermost first (each a layer with one job, kube-apiserver's order):
/// panic → 500 ([`guarded`]); metrics and tracing ([`observe`]); health endpoints, which no
/// limit or credential stands in front of ([`health_checks`]); in-flight limits, before any
/// TokenReview or SubjectAccessReview is spent ([`limit_in_flight`]); the eviction webhook,
/// called by kube-apiserver without credentials; authentication ([`authenticate`]);
/// authorization and the policy actor ([`authorize`]); the watch limit per user
/// ([`limit_watches`]); then the thin handler [`serve`].
pub fn router(state: Arc<AppState>) -> Router {
    let authenticated = Router::new()
        .fallback(serve)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            limit_watches,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            authorize,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            authenticate,
        ))
        .with_state(state.clone());
    let chain = Router::new()
        .route(
            kubevirt_api::eviction::WEBHOOK_PATH,
            axum::routing::any(webhook),
        )
        .fallback_service(authenticated)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            limit_in_flight,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            health_checks,
        ))
        .layer(axum::middleware::from_fn_with_state(state.clone(), observe))
        .with_state(state);
    guarded(chain)
}

/// What the outer layers learned about a request, for the inner ones.
#[derive(Debug, Clone)]
struct Parsed {
    info: RequestInfo,
    query: Query,
}

fn parsed(req: &Request) -> Parsed {
    req.extensions()
        .get::<Parsed>()
        .cloned()
        .unwrap_or_else(|| {
            let query = Query::parse(req.uri().query());
            Parsed {
                info: request::request_info(req.method().as_str(), req.uri().path(), &query),
                query,
            }
        })
}

/// Parses the request once (RequestInfo), traces it, and counts it with its latency by code
/// (health endpoints excluded, as kube-apiserver's).
async fn observe(
    State(st): State<Arc<AppState>>,
    mut req: Request,
    next: axum::middleware::Next,
) -> Response {
    let start = Instant::now();
    let p = parsed(&req);
    req.extensions_mut().insert(p.clone());
    let span = tracing::debug_span!("request", verb = %p.info.verb, path = %req.uri().path());
    let response = tracing::Instrument::instrument(next.run(req), span).await;
    if response.extensions().get::<Unrecorded>().is_none() {
        record(&st, p.info, start, &response);
    }
    response
}

/// Marks a response [`observe`] does not count.
#[derive(Debug, Clone, Copy)]
struct Unrecorded;

async fn health_checks(
    State(st): State<Arc<AppState>>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    let p = parsed(&req);
    match health(&st, req.uri().path(), &p.query).await {
        Some(mut r) => {
            r.extensions_mut().insert(Unrecorded);
            r
        }
        None => next.run(req).await,
    }
}

/// At most so many read-only and mutating requests at once: 429 beyond. The eviction
/// webhook has its own budget per source address ([`crate::inflight::PerSource`]).
/// A request that is not long-running must complete within [`REQUEST_TIMEOUT`] (504
/// beyond), as in kube-apiserver: its slot is never held longer.
async fn limit_in_flight(
    State(st): State<Arc<AppState>>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    if req.uri().path() == kubevirt_api::eviction::WEBHOOK_PATH {
        let source = req
            .extensions()
            .get::<crate::server::RemoteAddr>()
            .map_or(std::net::IpAddr::from([0, 0, 0, 0]), |a| a.0.ip());
        let Some(_slot) = st.webhook_calls.admit(source) else {
            tracing::debug!(%source, "too many eviction webhook calls in flight from one address");
            st.metrics.count_dropped("webhook");
            return ApiError::too_many_requests().into_response();
        };
        return within(REQUEST_TIMEOUT, next.run(req)).await;
    }
    let p = parsed(&req);
    let class = crate::inflight::classify(&p.info);
    match st.in_flight.admit(class) {
        Ok(_slot) if class == crate::inflight::Class::LongRunning => next.run(req).await,
        Ok(_slot) => {
            let limit = if p.info.group == kubevirt_api::SUBRESOURCES_GROUP
                && p.info.namespace.is_empty()
                && catalogue::admin_endpoint(&p.info.resource).is_some()
            {
                ADMIN_REQUEST_TIMEOUT
            } else {
                REQUEST_TIMEOUT
            };
            within(limit, next.run(req)).await
        }
        Err(class) => {
            tracing::debug!(class = class.label(), path = %req.uri().path(), "too many requests in flight");
            st.metrics.count_dropped(class.label());
            ApiError::too_many_requests().into_response()
        }
    }
}

/// kube-apiserver's bound on a request that is not long-running (`--request-timeout`).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// The bound on backup and restore, whose documents hold every stored object.
const ADMIN_REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

/// `fut`'s response, or kube-apiserver's 504 when it takes longer than `limit`.
async fn within(limit: Duration, fut: impl std::future::Future<Output = Response>) -> Response {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r,
        Err(_) => ApiError::timeout(
            "request did not complete within requested timeout - context deadline exceeded",
            false,
        )
        .into_response(),
    }
}

/// kube-apiserver calls webhooks without credentials (webhook.rs says what that allows).
async fn webhook(State(st): State<Arc<AppState>>, req: Request) -> Response {
    crate::webhook::handle(&st, req).await
}

/// Who is asking: the [`crate::auth::User`] goes into the request's extensions, or 401.
async fn authenticate(
    State(st): State<Arc<AppState>>,
    mut req: Request,
    next: axum::middleware::Next,
) -> Response {
    // kube-apiserver resolves impersonation itself and forwards only the user it
    // impersonates; a client asking this server directly to act as someone else would
    // otherwise be served as itself while believing it was not (L2 of the security review
    // at 5efe883).
    if let Some(h) = req
        .headers()
        .keys()
        .find(|h| h.as_str().starts_with("impersonate-"))
    {
        return ApiError::forbidden(
            crate::error::Gr {
                resource: "",
                group: "",
            },
            "",
            format!(
                "impersonation ({h}) is not served by virt-apiserver directly; send the request \
                 through kube-apiserver, which resolves it"
            ),
        )
        .into_response();
    }
    let peer = req
        .extensions()
        .get::<PeerIdentity>()
        .cloned()
        .unwrap_or_default();
    match st.auth.authenticate(req.headers(), &peer).await {
        Ok(user) => {
            req.extensions_mut().insert(user);
            next.run(req).await
        }
        Err(e) => e.into_response(),
    }
}

/// Whether the user may (SubjectAccessReview), and as which policy actor the registry sees
/// the request ([`kubevirt_api::policy`]).
async fn authorize(
    State(st): State<Arc<AppState>>,
    mut req: Request,
    next: axum::middleware::Next,
) -> Response {
    let Some(user) = req.extensions().get::<crate::auth::User>().cloned() else {
        return ApiError::internal("no authenticated user").into_response();
    };
    let p = parsed(&req);
    if let Err(e) = st.auth.authorize(&user, &p.info).await {
        return e.into_response();
    }
    // --allow-client-ca-users (development only) grants its users full access: the
    // policy's reserved keys included, like system:masters.
    let actor = if st.auth.allow_client_ca_users && user.via_client_ca {
        kubevirt_api::policy::Actor::Component
    } else {
        st.registry.actor(&user.name, &user.groups, &user.extra)
    };
    req.extensions_mut().insert(actor);
    tracing::debug!(user = %user.name, verb = %p.info.verb, path = %req.uri().path(), "Request");
    next.run(req).await
}

/// A stream's place in its user's count ([`limit_watches`]): the stream's handler keeps it
/// for as long as the upgraded connection lives.
#[derive(Debug, Clone)]
pub struct StreamSlot {
    _slot: Arc<crate::inflight::UserSlot>,
}

/// At most so many open watches, and so many console, VNC and port-forward streams, per
/// user: a watch's slot lives as long as its body, a stream's as long as its connection.
async fn limit_watches(
    State(st): State<Arc<AppState>>,
    mut req: Request,
    next: axum::middleware::Next,
) -> Response {
    let p = parsed(&req);
    let user = req
        .extensions()
        .get::<crate::auth::User>()
        .map(|u| u.name.clone())
        .unwrap_or_default();
    if p.info.verb != "watch" {
        if crate::inflight::classify(&p.info) == crate::inflight::Class::LongRunning {
            let Some(slot) = st.streams.admit(&user) else {
                st.metrics.count_dropped("stream");
                return ApiError::too_many(format!(
                    "Too many streams: user {user:?} has {} console, VNC or port-forward \
                     connections open, the most allowed",
                    st.streams.max()
                ))
                .into_response();
            };
            req.extensions_mut().insert(StreamSlot {
                _slot: Arc::new(slot),
            });
        }
        return next.run(req).await;
    }
    let Some(slot) = st.watches.admit(&user) else {
        st.metrics.count_dropped("watch");
        return ApiError::too_many(format!(
            "Too many watches: user {user:?} has {} open, the most allowed",
            st.watches.max()
        ))
        .into_response();
    };
    next.run(req).await.map(|body| {
        Body::from_stream(body.into_data_stream().map(move |chunk| {
            let _held = &slot;
            chunk
        }))
    })
}

/// The handler behind the chain: discovery, OpenAPI, the registry, watches, subresources.
async fn serve(State(st): State<Arc<AppState>>, req: Request) -> Response {
    let p = parsed(&req);
    let agent = req
        .headers()
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .map(|ua| ua.split('/').next().unwrap_or(ua).to_string())
        .unwrap_or_default();
    let mut resp = route(&st, &p.info, &p.query, req, &agent)
        .await
        .unwrap_or_else(IntoResponse::into_response);
    // A 405 names what the path does allow (RFC 9110 §15.5.6), so a client can tell a wrong
    // method from a missing resource.
    if resp.status() == StatusCode::METHOD_NOT_ALLOWED
        && let Some(allow) = allowed_methods(&p.info)
    {
        resp.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static(allow));
    }
    resp
}

/// The methods a path serves, for the `Allow` header of a 405.
fn allowed_methods(info: &RequestInfo) -> Option<&'static str> {
    if !info.is_resource {
        return Some("GET");
    }
    if info.group == kubevirt_api::SUBRESOURCES_GROUP {
        if info.namespace.is_empty()
            && let Some(e) = catalogue::admin_endpoint(&info.resource)
        {
            return Some(e.http_method);
        }
        let def = ResourceDef::by_plural(&info.resource)?;
        return def.subresource(&info.subresource).map(|s| s.http_method());
    }
    // A create-only kind (UploadTokenRequest): POST to its collection in a namespace only.
    if ResourceDef::create_only_kind(&info.group, &info.version, &info.resource).is_some() {
        return (info.is_collection && !info.namespace.is_empty() && info.subresource.is_empty())
            .then_some("POST");
    }
    // A cluster-scoped kind's collection is its whole collection.
    let cluster_scoped = ResourceDef::by_resource(&info.group, &info.version, &info.resource)
        .is_some_and(|d| !d.namespaced);
    Some(match (info.is_collection, info.subresource.as_str()) {
        (true, _) if info.namespace.is_empty() && !cluster_scoped => "GET",
        (true, _) => "GET, POST, DELETE",
        (false, "status" | "scale") => "GET, PUT, PATCH",
        (false, _) => "GET, PUT, PATCH, DELETE",
    })
}

tokio::task_local! {
    /// Set while a request's handler runs: the process's panic hook (main.rs) lets such a
    /// panic unwind to the catch-panic layer; any other panic ends the process.
    static IN_REQUEST: ();
}

/// Whether the current code runs inside a request's handler.
pub fn in_request() -> bool {
    IN_REQUEST.try_with(|()| ()).is_ok()
}

/// Runs `fut` as part of a request (a stream relayed after an upgrade, a task producing a
/// watch): a panic in it ends that one task instead of the process.
pub fn guard<F: std::future::Future>(fut: F) -> impl std::future::Future<Output = F::Output> {
    IN_REQUEST.scope((), fut)
}

/// A response body polled as part of its request: a watch's body is produced long after its
/// handler returned, outside the handler's scope, and a panic there must end that watch's
/// connection, not the process (M5 of the security review at 5efe883).
struct GuardedBody(Body);

impl http_body::Body for GuardedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let inner = std::pin::Pin::new(&mut self.get_mut().0);
        IN_REQUEST.sync_scope((), || inner.poll_frame(cx))
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.0.size_hint()
    }
}

/// A panic while handling one request is that request's 500 (a `metav1.Status`); the server
/// and every other request, watch and console go on. A panic while its body streams ends
/// that response's connection.
pub fn guarded(router: Router) -> Router {
    router
        .layer(axum::middleware::from_fn(
            |req: Request, next: axum::middleware::Next| async move {
                IN_REQUEST
                    .scope((), next.run(req))
                    .await
                    .map(|b| Body::new(GuardedBody(b)))
            },
        ))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            |_: Box<dyn std::any::Any + Send>| {
                ApiError::internal("the server hit a bug handling this request (see its log)")
                    .into_response()
            },
        ))
}

fn respond(code: StatusCode, content_type: &'static str, body: impl Into<Body>) -> Response {
    let mut r = Response::new(body.into());
    *r.status_mut() = code;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn serve_doc(doc: &Doc, headers: &HeaderMap, content_type: &'static str) -> Response {
    if headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        == Some(doc.etag.as_str())
    {
        let mut r = respond(StatusCode::NOT_MODIFIED, content_type, Body::empty());
        r.headers_mut().insert(
            header::ETAG,
            HeaderValue::from_str(&doc.etag).unwrap_or(HeaderValue::from_static("")),
        );
        return r;
    }
    let mut r = respond(StatusCode::OK, content_type, doc.body.clone());
    let h = r.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&doc.etag) {
        h.insert(header::ETAG, v);
    }
    h.insert(header::VARY, HeaderValue::from_static("Accept"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("public"));
    r
}

fn encode(output: Output, value: &Value, code: StatusCode, warnings: &[String]) -> Response {
    let mut r = if output.yaml() {
        match serde_saphyr::to_string(value) {
            Ok(y) => respond(code, "application/yaml", y),
            Err(e) => return ApiError::internal(format!("encoding YAML: {e}")).into_response(),
        }
    } else {
        respond(
            code,
            "application/json",
            serde_json::to_vec(value).unwrap_or_default(),
        )
    };
    for w in capped_warnings(warnings) {
        let text = format!("299 - {}", serde_json::to_string(&w).unwrap_or_default());
        if let Ok(v) = HeaderValue::from_str(&text) {
            r.headers_mut().append(header::WARNING, v);
        }
    }
    r
}

/// Total length of the warnings, in characters, past which each is cut to
/// [`WARNING_ITEM_CHARS`] and later ones are dropped (k8s.io/apiserver's warning recorder).
const WARNING_TOTAL_CHARS: usize = 4 * 1024;
/// A warning's length once the total is exceeded.
const WARNING_ITEM_CHARS: usize = 256;
/// At most this many Warning headers: a body with hundreds of unknown fields would otherwise
/// get as many headers, and clients with a header-count limit (Python's http.client: 100) can
/// then not read the answer at all (found by `cargo xtask fuzz`). kube-apiserver has only
/// the size limit; here the last header then says how many were left out.
const WARNING_HEADERS: usize = 50;

/// The warnings as Warning headers carry them: deduplicated, within k8s.io/apiserver's
/// size limit (the same truncation) and [`WARNING_HEADERS`].
fn capped_warnings(warnings: &[String]) -> Vec<String> {
    let mut seen = std::collections::HashSet::new();
    let unique: Vec<&String> = warnings
        .iter()
        .filter(|w| !w.is_empty() && seen.insert(w.as_str()))
        .collect();
    let total: usize = unique.iter().map(|w| w.chars().count()).sum();
    let mut out: Vec<String> = Vec::new();
    if total <= WARNING_TOTAL_CHARS {
        out.extend(unique.iter().map(|w| w.to_string()));
    } else {
        // As kube-apiserver: once the limit is crossed, every warning is cut, and those
        // that come after the total is reached again are dropped.
        let mut written = 0;
        for w in &unique {
            if written >= WARNING_TOTAL_CHARS {
                break;
            }
            let cut: String = w.chars().take(WARNING_ITEM_CHARS).collect();
            written += cut.chars().count();
            out.push(cut);
        }
    }
    if out.len() > WARNING_HEADERS {
        out.truncate(WARNING_HEADERS - 1);
        out.push(format!(
            "{} more warnings not shown",
            unique.len() - (WARNING_HEADERS - 1)
        ));
    }
    out
}

/// Every request enters here.
/// The request's latency and its count by code.
fn record(st: &AppState, info: RequestInfo, start: Instant, response: &Response) {
    let labels = VerbLabels {
        verb: info.verb.clone(),
        resource: info.resource.clone(),
        subresource: info.subresource.clone(),
    };
    st.metrics
        .duration
        .get_or_create(&labels)
        .observe(start.elapsed().as_secs_f64());
    if response.status() == http::StatusCode::CREATED
        && info.verb == "create"
        && info.group == kubevirt_api::GROUP
        && info.resource == "virtualmachines"
        && info.subresource.is_empty()
    {
        st.metrics
            .vms_created
            .get_or_create(&NamespaceLabels {
                namespace: info.namespace.clone(),
            })
            .inc();
    }
    st.metrics
        .requests
        .get_or_create(&RequestLabels {
            verb: info.verb,
            resource: info.resource,
            subresource: info.subresource,
            code: response.status().as_u16().to_string(),
        })
        .inc();
}

/// How long /readyz stays ready after etcd last answered.
const ETCD_READY_GRACE: Duration = Duration::from_secs(15);

async fn health(st: &AppState, path: &str, query: &Query) -> Option<Response> {
    let (endpoint, single) = match path.trim_end_matches('/') {
        p @ ("/healthz" | "/livez" | "/readyz") => (p.trim_start_matches('/'), None),
        p if p.starts_with("/healthz/")
            || p.starts_with("/livez/")
            || p.starts_with("/readyz/") =>
        {
            let (e, c) = p.trim_start_matches('/').split_once('/')?;
            (e, Some(c.to_string()))
        }
        _ => return None,
    };
    let mut checks: Vec<(&str, bool)> = vec![("ping", true)];
    if endpoint != "livez" {
        let answered = st.registry.storage().ping().await;
        let mut last = st
            .etcd_answered
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if answered {
            *last = Some(Instant::now());
        }
        // Ready through a short gap: while etcd's membership changes (a member moving off a
        // drained node, an election) every replica would otherwise go unready at once, and
        // with no endpoint left kube-apiserver fails the eviction webhook's calls, which
        // ends a `kubectl drain` instead of making it retry.
        let recent = endpoint == "readyz" && last.is_some_and(|t| t.elapsed() < ETCD_READY_GRACE);
        checks.push(("etcd", answered || recent));
    }
    if endpoint == "readyz" {
        checks.push(("shutdown", !st.terminating.load(Ordering::Relaxed)));
    }
    if let Some(c) = single {
        return Some(match checks.iter().find(|(n, _)| *n == c) {
            Some((_, true)) => respond(StatusCode::OK, "text/plain; charset=utf-8", "ok"),
            Some((_, false)) => respond(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain; charset=utf-8",
                "internal server error",
            ),
            None => ApiError::path_not_found().into_response(),
        });
    }
    let excluded: Vec<&str> = query
        .get("exclude")
        .map(|e| e.split(',').collect())
        .unwrap_or_default();
    let ok = checks.iter().all(|(n, pass)| *pass || excluded.contains(n));
    let verbose = query.get("verbose").is_some();
    let body = if verbose || !ok {
        let mut s = String::new();
        for (n, pass) in &checks {
            if excluded.contains(n) {
                s.push_str(&format!("[+]{n} excluded: ok\n"));
            } else if *pass {
                s.push_str(&format!("[+]{n} ok\n"));
            } else {
                s.push_str(&format!("[-]{n} failed: reason withheld\n"));
            }
        }
        s.push_str(&format!(
            "{endpoint} check {}\n",
            if ok { "passed" } else { "failed" }
        ));
        s
    } else {
        "ok".to_string()
    };
    let code = if ok {
        StatusCode::OK
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    let mut r = respond(code, "text/plain; charset=utf-8", body);
    r.headers_mut().insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    Some(r)
}

/// Largest backup a restore takes (the document is held in memory while it is checked):
/// 10,000 VMs with their instances are about 100 MiB.
const MAX_RESTORE_BYTES: usize = 256 << 20;

/// `GET …/backup` and `PUT …/restore` (crate::backup).
async fn admin(
    st: &Arc<AppState>,
    endpoint: &'static catalogue::AdminEndpoint,
    req: Request,
) -> ApiResult<Response> {
    if req.method().as_str() != endpoint.http_method {
        return Err(ApiError::method_not_allowed());
    }
    let registry = &st.registry;
    if endpoint == &catalogue::BACKUP {
        let user = req.extensions().get::<crate::auth::User>().cloned();
        // Inline cloud-init data only of namespaces whose Secrets the caller may read.
        let may_read_secrets = |ns: String| {
            let user = user.clone();
            async move {
                let Some(user) = user else { return false };
                let info = RequestInfo {
                    is_resource: true,
                    verb: "get".into(),
                    version: "v1".into(),
                    namespace: ns,
                    resource: "secrets".into(),
                    ..RequestInfo::default()
                };
                st.auth.authorize(&user, &info).await.is_ok()
            }
        };
        let backup = crate::backup::backup(registry, may_read_secrets).await?;
        return Ok(axum::Json(backup).into_response());
    }
    let bytes = axum::body::to_bytes(req.into_body(), MAX_RESTORE_BYTES)
        .await
        .map_err(|_| {
            ApiError::too_large(format!(
                "a backup to restore is at most {MAX_RESTORE_BYTES} bytes"
            ))
        })?;
    let doc: Value = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::bad_request(format!(
            "the body is not a {} document: {e}",
            kubevirt_api::backup::KIND
        ))
    })?;
    let backup = crate::backup::validate(&doc).map_err(|errors| {
        ApiError::invalid(
            kubevirt_api::backup::KIND,
            kubevirt_api::SUBRESOURCES_GROUP,
            "",
            &errors,
        )
    })?;
    let result = crate::backup::restore(registry, &backup).await?;
    Ok(axum::Json(result).into_response())
}

async fn route(
    st: &Arc<AppState>,
    info: &RequestInfo,
    query: &Query,
    req: Request,
    agent: &str,
) -> ApiResult<Response> {
    let headers = req.headers().clone();
    let actor = actor_of(&req);
    let requester = user_of(&req);
    if !info.is_resource {
        return non_resource(st, info, &headers);
    }
    if info.group == kubevirt_api::SUBRESOURCES_GROUP
        && info.version == "v1"
        && info.namespace.is_empty()
        && info.name.is_empty()
        && let Some(endpoint) = catalogue::admin_endpoint(&info.resource)
    {
        return admin(st, endpoint, req).await;
    }
    if info.group == kubevirt_api::SUBRESOURCES_GROUP && info.version == "v1" {
        return crate::subresources::handle(st, info, query, req).await;
    }
    if let Some(def) = ResourceDef::create_only_kind(&info.group, &info.version, &info.resource) {
        if allowed_methods(info) != Some(req.method().as_str()) {
            return Err(ApiError::method_not_allowed());
        }
        let accept =
            request::parse_accept(headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()));
        // A create's options are checked as for any create (dryRun, fieldValidation,
        // fieldManager: 400/422 for a bad one); nothing is stored, so none changes more.
        write_options(query, agent, false, actor, requester)?;
        let body = read_object_body(st, def, req).await?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let answer = crate::upload_token::create(
            &st.upload_tokens,
            st.auth.kube.as_ref(),
            def,
            &info.namespace,
            &body,
            now,
        )
        .await?;
        let out = request::negotiate(&accept, false).map_err(ApiError::not_acceptable)?;
        return Ok(encode(out, &answer, StatusCode::CREATED, &[]));
    }
    let def = ResourceDef::by_resource(&info.group, &info.version, &info.resource);
    let kubevirts = info.group == crate::rest::GROUP
        && info.version == "v1"
        && info.resource == crate::kubevirts::PLURAL;
    if def.is_none() && !kubevirts {
        return Err(ApiError::path_not_found());
    }
    // A cluster-scoped kind has no objects in a namespace.
    if def.is_some_and(|d| !d.namespaced) && !info.namespace.is_empty() {
        return Err(ApiError::path_not_found());
    }
    if !allowed_methods(info).is_some_and(|a| a.split(", ").any(|m| m == req.method().as_str())) {
        return Err(ApiError::method_not_allowed());
    }
    if kubevirts {
        return crate::kubevirts::handle(st, info, req).await;
    }
    let def = def.ok_or_else(ApiError::path_not_found)?;
    let accept = request::parse_accept(headers.get(header::ACCEPT).and_then(|v| v.to_str().ok()));
    let ns = info.namespace.as_str();
    let method = req.method().clone();
    match (info.is_collection, info.subresource.as_str()) {
        (true, _) => match method {
            Method::GET if info.verb == "watch" => {
                watch_collection(st, def, info, query, &accept).await
            }
            Method::GET => list(st, def, info, query, &accept).await,
            Method::POST if !ns.is_empty() || !def.namespaced => {
                let body = read_object_body(st, def, req).await?;
                let opts = write_options(query, agent, false, actor, requester)?;
                let w = st.registry.create(def, ns, body, &opts).await?;
                written(def, w, &accept)
            }
            Method::DELETE if !ns.is_empty() || !def.namespaced => {
                let opts = delete_options(st, query, req).await?;
                let list = list_options(def, query)?;
                let listed = st.registry.delete_collection(def, ns, &list, &opts).await?;
                let out = request::negotiate(&accept, true).map_err(ApiError::not_acceptable)?;
                Ok(encode(
                    out,
                    &list_body(
                        def,
                        out,
                        &listed.items,
                        json!({"resourceVersion": listed.revision.to_string()}),
                        query,
                    )?,
                    StatusCode::OK,
                    &[],
                ))
            }
            _ => Err(ApiError::method_not_allowed()),
        },
        (false, "scale") if def.has_scale => {
            scale(st, def, info, query, req, agent, actor, requester).await
        }
        (false, sub @ ("" | "status")) => {
            let status_only = sub == "status";
            match method {
                Method::GET => {
                    let obj = st.registry.get(def, ns, &info.name).await?;
                    let out =
                        request::negotiate(&accept, false).map_err(ApiError::not_acceptable)?;
                    Ok(encode(
                        out,
                        &object_body(def, out, &obj, query)?,
                        StatusCode::OK,
                        &[],
                    ))
                }
                Method::PUT => {
                    let body = read_object_body(st, def, req).await?;
                    let opts = write_options(query, agent, false, actor, requester)?;
                    let w = st
                        .registry
                        .update(def, ns, &info.name, body, status_only, &opts)
                        .await?;
                    written(def, w, &accept)
                }
                Method::PATCH => {
                    patch(st, def, info, query, req, agent, status_only, &accept).await
                }
                Method::DELETE if !status_only => {
                    let opts = delete_options(st, query, req).await?;
                    match st.registry.delete(def, ns, &info.name, &opts).await? {
                        DeleteOutcome::Deleted(status) => Ok(encode(
                            Output::Object { yaml: false },
                            &serde_json::to_value(status).unwrap_or_default(),
                            StatusCode::OK,
                            &[],
                        )),
                        DeleteOutcome::Pending(obj) => {
                            let out = request::negotiate(&accept, false)
                                .map_err(ApiError::not_acceptable)?;
                            Ok(encode(
                                out,
                                &object_body(def, out, &obj, query)?,
                                StatusCode::OK,
                                &[],
                            ))
                        }
                    }
                }
                _ => Err(ApiError::method_not_allowed()),
            }
        }
        _ => Err(ApiError::path_not_found()),
    }
}

fn non_resource(st: &AppState, info: &RequestInfo, headers: &HeaderMap) -> ApiResult<Response> {
    if info.verb != "get" {
        return Err(ApiError::method_not_allowed());
    }
    let path = info.path.trim_end_matches('/');
    let d = &st.discovery;
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    match path {
        "/apis" => {
            let ranges = request::parse_accept(accept);
            for m in &ranges {
                if m.param("as") == Some("APIGroupDiscoveryList") && m.param("g") == Some("apidiscovery.k8s.io") && m.accepts("json") {
                    match m.param("v") {
                        Some("v2") => return Ok(serve_doc(d.current_aggregated_v2(), headers, "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList")),
                        Some("v2beta1") => return Ok(serve_doc(d.current_aggregated_v2beta1(), headers, "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList")),
                        _ => continue,
                    }
                }
                if m.param("as").is_none() && m.accepts("json") {
                    return Ok(serve_doc(&d.group_list, headers, "application/json"));
                }
            }
            Err(ApiError::not_acceptable("only the following media types are accepted: application/json, application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"))
        }
        "/api" => Ok(serve_doc(&d.core_versions, headers, "application/json")),
        "/apis/kubevirt.io" => Ok(serve_doc(&d.group, headers, "application/json")),
        "/apis/kubevirt.io/v1" => Ok(serve_doc(d.current_resources(), headers, "application/json")),
        "/apis/subresources.kubevirt.io" => Ok(serve_doc(&d.sub_group, headers, "application/json")),
        "/apis/subresources.kubevirt.io/v1" => Ok(serve_doc(&d.sub_resources, headers, "application/json")),
        "/version" => Ok(respond(StatusCode::OK, "application/json", serde_json::to_vec(&crate::discovery::version_info()).unwrap_or_default())),
        "/metrics" => Ok(respond(StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", st.metrics.encode())),
        "/openapi/v2" => st.openapi.v2.as_ref().map(|d| serve_doc(d, headers, "application/json")).ok_or_else(ApiError::path_not_found),
        "/openapi/v3" => st.openapi.v3_root.as_ref().map(|d| serve_doc(d, headers, "application/json")).ok_or_else(ApiError::path_not_found),
        "" => Ok(respond(StatusCode::OK, "application/json", serde_json::to_vec(&json!({"paths":[
            "/apis","/apis/kubevirt.io","/apis/kubevirt.io/v1","/apis/subresources.kubevirt.io","/apis/subresources.kubevirt.io/v1",
            "/healthz","/livez","/metrics","/openapi/v2","/openapi/v3","/readyz","/version"]})).unwrap_or_default())),
        p if d.other_group(p).is_some() => d
            .other_group(p)
            .map(|doc| serve_doc(doc, headers, "application/json"))
            .ok_or_else(ApiError::path_not_found),
        p if p.starts_with("/openapi/v3/") => {
            let gv = &p["/openapi/v3/".len()..];
            st.openapi
                .v3
                .iter()
                .find(|(k, _)| k == gv)
                .map(|(_, d)| serve_doc(d, headers, "application/json"))
                .ok_or_else(ApiError::path_not_found)
        }
        _ => Err(ApiError::path_not_found()),
    }
}

fn object_body(def: &ResourceDef, out: Output, obj: &Value, query: &Query) -> ApiResult<Value> {
    Ok(match out {
        Output::Object { .. } => obj.clone(),
        Output::Metadata { .. } => convert::partial(obj),
        Output::Table { .. } => {
            let include =
                IncludeObject::parse(query.get("includeObject")).map_err(ApiError::bad_request)?;
            let rv = obj
                .pointer("/metadata/resourceVersion")
                .cloned()
                .unwrap_or(Value::Null);
            convert::table(
                def,
                std::slice::from_ref(obj),
                json!({"resourceVersion": rv}),
                include,
                true,
            )
        }
    })
}

fn list_body(
    def: &ResourceDef,
    out: Output,
    items: &[Value],
    meta: Value,
    query: &Query,
) -> ApiResult<Value> {
    Ok(match out {
        Output::Object { .. } => {
            json!({"apiVersion": def.api_version(), "kind": def.list_kind, "metadata": meta, "items": items})
        }
        Output::Metadata { .. } => convert::partial_list(items, meta),
        Output::Table { .. } => {
            let include =
                IncludeObject::parse(query.get("includeObject")).map_err(ApiError::bad_request)?;
            convert::table(def, items, meta, include, true)
        }
    })
}

fn written(
    def: &ResourceDef,
    w: crate::rest::Written,
    accept: &[request::MediaRange],
) -> ApiResult<Response> {
    let out = request::negotiate(accept, false).map_err(ApiError::not_acceptable)?;
    let body = object_body(def, out, &w.object, &Query::default())?;
    let code = if w.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok(encode(out, &body, code, &w.warnings))
}

fn list_options(def: &ResourceDef, query: &Query) -> ApiResult<ListOptions> {
    let label_selector = match query.get("labelSelector").filter(|s| !s.trim().is_empty()) {
        Some(s) => Some(
            LabelSelector::parse(s).map_err(|e| ApiError::bad_request(e.message().to_string()))?,
        ),
        None => None,
    };
    let field_selector = match query.get("fieldSelector").filter(|s| !s.trim().is_empty()) {
        Some(s) => {
            let fs = FieldSelector::parse(s)
                .map_err(|e| ApiError::bad_request(e.message().to_string()))?;
            let mut supported = vec!["metadata.name", "metadata.namespace"];
            supported.extend(def.selectable.iter().map(|(f, _)| *f));
            fs.check_supported(&supported)
                .map_err(|e| ApiError::bad_request(e.message().to_string()))?;
            Some(fs)
        }
        None => None,
    };
    let limit = query
        .int("limit")
        .map_err(ApiError::bad_request)?
        .unwrap_or(0)
        .max(0);
    // Parameters that only steer the request (or a watch, not this list): garbage is a 400
    // naming the parameter rather than a silent choice of one meaning.
    // `sendInitialEvents` too: a delete of a collection reads its list parameters, and
    // kube-apiserver refuses a non-boolean one there (schemathesis sent `null`).
    for flag in ["watch", "allowWatchBookmarks", "sendInitialEvents"] {
        query.bool(flag).map_err(ApiError::bad_request)?;
    }
    query.int("timeoutSeconds").map_err(ApiError::bad_request)?;
    Ok(ListOptions {
        label_selector,
        field_selector,
        limit,
        continue_token: query
            .get("continue")
            .filter(|s| !s.is_empty())
            .map(str::to_string),
        resource_version: query.get("resourceVersion").map(str::to_string),
        resource_version_match: query.get("resourceVersionMatch").map(str::to_string),
    })
}

async fn list(
    st: &AppState,
    def: &'static ResourceDef,
    info: &RequestInfo,
    query: &Query,
    accept: &[request::MediaRange],
) -> ApiResult<Response> {
    let out = request::negotiate(accept, true).map_err(ApiError::not_acceptable)?;
    if query.get("sendInitialEvents").is_some() {
        return Err(ApiError::invalid(
            "ListOptions",
            "meta.k8s.io",
            "",
            &[kubevirt_api::validation::FieldError::forbidden(
                "sendInitialEvents",
                "sendInitialEvents is forbidden for list",
            )],
        ));
    }
    let opts = list_options(def, query)?;
    let ns = (!info.namespace.is_empty()).then_some(info.namespace.as_str());
    if out.yaml() {
        // YAML is rare (kubectl asks for JSON and converts) and its encoder wants the
        // whole document as a Value.
        let listed = st.registry.list(def, ns, &opts).await?;
        let meta = list_meta(listed.revision, &listed.continue_token, listed.remaining);
        return Ok(encode(
            out,
            &list_body(def, out, &listed.items, meta, query)?,
            StatusCode::OK,
            &[],
        ));
    }
    let include = match out {
        Output::Table { .. } => {
            IncludeObject::parse(query.get("includeObject")).map_err(ApiError::bad_request)?
        }
        _ => IncludeObject::None,
    };
    // Each item is encoded as soon as it is decoded from etcd's bytes and then dropped:
    // materialising every item as a Value (and json! cloning them into the list) made a
    // 5000-object LIST peak at ~140 MiB, which glibc kept. The list's own metadata is
    // only known at the end (continue, remainingItemCount), so it goes in a separate
    // head chunk; the body is head, items, tail with the keys in the usual order.
    let now = chrono::Utc::now().timestamp();
    let mut items = Vec::new();
    let listed = st
        .registry
        .list_each(def, ns, &opts, |obj| {
            if !items.is_empty() {
                items.push(b',');
            }
            match out {
                Output::Object { .. } => serde_json::to_writer(&mut items, &obj),
                Output::Metadata { .. } => {
                    serde_json::to_writer(&mut items, &convert::partial(&obj))
                }
                Output::Table { .. } => {
                    serde_json::to_writer(&mut items, &convert::row(def, &obj, include, now))
                }
            }
            .map_err(|e| ApiError::internal(format!("encoding JSON: {e}")))
        })
        .await?;
    let meta = list_meta(listed.revision, &listed.continue_token, listed.remaining);
    let (head, field) = match out {
        Output::Object { .. } => (
            json!({"apiVersion": def.api_version(), "kind": def.list_kind, "metadata": meta}),
            "items",
        ),
        Output::Metadata { .. } => (
            json!({"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":meta}),
            "items",
        ),
        Output::Table { .. } => (
            json!({"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":meta,
                "columnDefinitions": convert::columns(def)}),
            "rows",
        ),
    };
    let mut head = serde_json::to_vec(&head).unwrap_or_default();
    // `{...}` → `{...,"items":[`: the head object stays open for the items.
    head.pop();
    head.extend_from_slice(format!(",\"{field}\":[").as_bytes());
    let chunks = [head, items, b"]}".to_vec()]
        .map(|c| Ok::<Bytes, std::convert::Infallible>(Bytes::from(c)));
    Ok(respond(
        StatusCode::OK,
        "application/json",
        Body::from_stream(futures::stream::iter(chunks)),
    ))
}

fn list_meta(revision: i64, continue_token: &Option<String>, remaining: Option<i64>) -> Value {
    let mut meta = json!({"resourceVersion": revision.to_string()});
    if let Some(c) = continue_token {
        meta["continue"] = json!(c);
    }
    if let Some(r) = remaining {
        meta["remainingItemCount"] = json!(r);
    }
    meta
}

async fn watch_collection(
    st: &Arc<AppState>,
    def: &'static ResourceDef,
    info: &RequestInfo,
    query: &Query,
    accept: &[request::MediaRange],
) -> ApiResult<Response> {
    let out = request::negotiate(accept, false).map_err(ApiError::not_acceptable)?;
    let include =
        IncludeObject::parse(query.get("includeObject")).map_err(ApiError::bad_request)?;
    let params = WatchParams {
        list: list_options(def, query)?,
        send_initial_events: query
            .bool("sendInitialEvents")
            .map_err(ApiError::bad_request)?,
        allow_bookmarks: query.flag("allowWatchBookmarks"),
        timeout: query
            .int("timeoutSeconds")
            .map_err(ApiError::bad_request)?
            .filter(|t| *t > 0)
            .map(|t| Duration::from_secs(t as u64)),
        bookmark_interval: st.bookmark_interval,
        encoded_lines: matches!(out, Output::Object { yaml: false }),
    };
    let ns = (!info.namespace.is_empty()).then(|| info.namespace.clone());
    let events = watch::watch(st.registry.clone(), def, ns, params, st.shutdown.clone()).await?;
    let metrics = st.metrics.clone();
    let guard = crate::metrics::LongRunning::start(metrics);
    let mut first = true;
    let yaml = out.yaml();
    let body = events.map(move |ev| {
        let _keep = &guard;
        if let Some(line) = ev.encoded {
            return Ok::<Bytes, std::convert::Infallible>(line);
        }
        let object = match (out, ev.type_) {
            (_, "ERROR") | (Output::Object { .. }, _) => ev.object,
            (Output::Metadata { .. }, _) => convert::partial(&ev.object),
            (Output::Table { .. }, "BOOKMARK") => convert::partial(&ev.object),
            (Output::Table { .. }, _) => {
                let rv = ev
                    .object
                    .pointer("/metadata/resourceVersion")
                    .cloned()
                    .unwrap_or(Value::Null);
                let t = convert::table(
                    def,
                    std::slice::from_ref(&ev.object),
                    json!({"resourceVersion": rv}),
                    include,
                    first,
                );
                first = false;
                t
            }
        };
        let line = json!({"type": ev.type_, "object": object});
        let mut bytes = if yaml {
            format!(
                "---\n{}",
                serde_saphyr::to_string(&line).unwrap_or_default()
            )
            .into_bytes()
        } else {
            serde_json::to_vec(&line).unwrap_or_default()
        };
        bytes.push(b'\n');
        Ok::<Bytes, std::convert::Infallible>(Bytes::from(bytes))
    });
    let mut r = Response::new(Body::from_stream(body));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(if yaml {
            "application/yaml"
        } else {
            "application/json"
        }),
    );
    Ok(r)
}

fn content_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|c| {
            c.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default()
}

fn parse_yaml(bytes: &[u8]) -> Result<Value, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| e.to_string())?;
    serde_saphyr::from_str::<Value>(text).map_err(|e| e.to_string())
}

async fn read_object_body(st: &AppState, def: &ResourceDef, req: Request) -> ApiResult<Value> {
    let (headers, bytes) = st.read_body(req).await?;
    let ct = content_type(&headers);
    let cannot = |e: String| {
        ApiError::bad_request(format!(
            "{} in version \"v1\" cannot be handled as a {}: {e}",
            def.kind, def.kind
        ))
    };
    match ct.as_str() {
        "" | "application/json" => {
            serde_json::from_slice(&bytes).map_err(|e| cannot(e.to_string()))
        }
        "application/yaml" => parse_yaml(&bytes).map_err(cannot),
        _ => Err(ApiError::unsupported_media_type(&[
            "application/json",
            "application/yaml",
        ])),
    }
}

/// The authenticated user of this request, if any.
fn user_of(req: &Request) -> Option<crate::auth::User> {
    req.extensions().get::<crate::auth::User>().cloned()
}

/// The policy actor `handle` recorded for this request (a plain user if none).
fn actor_of(req: &Request) -> kubevirt_api::policy::Actor {
    req.extensions()
        .get::<kubevirt_api::policy::Actor>()
        .cloned()
        .unwrap_or_default()
}

fn write_options(
    query: &Query,
    agent: &str,
    apply: bool,
    actor: kubevirt_api::policy::Actor,
    requester: Option<crate::auth::User>,
) -> ApiResult<WriteOptions> {
    // `dryRun=` (empty) is refused as kube-apiserver refuses it: the published schema says
    // the one value is `All`, and a client that meant "not dry" would send nothing.
    let dry_run = match query.get("dryRun") {
        None => false,
        Some("All") => true,
        Some(other) => {
            return Err(ApiError::invalid(
                "CreateOptions",
                "meta.k8s.io",
                "",
                &[kubevirt_api::validation::FieldError::not_supported(
                    "dryRun",
                    other,
                    &["All"],
                )],
            ));
        }
    };
    let field_validation = match query.get("fieldValidation") {
        None | Some("") | Some("Warn") => FieldValidation::Warn,
        Some("Strict") => FieldValidation::Strict,
        Some("Ignore") => FieldValidation::Ignore,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "fieldValidation must be one of \"Ignore\", \"Warn\", or \"Strict\", got {other:?}"
            )));
        }
    };
    let field_manager = match query.get("fieldManager") {
        Some(m) if m.len() > 128 || m.chars().any(|c| c.is_control()) => {
            return Err(ApiError::invalid(
                "PatchOptions",
                "meta.k8s.io",
                "",
                &[kubevirt_api::validation::FieldError::too_long(
                    "fieldManager",
                    128,
                )],
            ));
        }
        Some(m) if !m.is_empty() => m.to_string(),
        _ if apply => {
            return Err(ApiError::invalid(
                "PatchOptions",
                "meta.k8s.io",
                "",
                &[kubevirt_api::validation::FieldError::required(
                    "fieldManager",
                    "is required for apply patch",
                )],
            ));
        }
        _ => agent.to_string(),
    };
    Ok(WriteOptions {
        dry_run,
        field_validation,
        field_manager,
        actor,
        requester,
    })
}

#[allow(clippy::too_many_arguments)]
async fn patch(
    st: &AppState,
    def: &'static ResourceDef,
    info: &RequestInfo,
    query: &Query,
    req: Request,
    agent: &str,
    status_only: bool,
    accept: &[request::MediaRange],
) -> ApiResult<Response> {
    let actor = actor_of(&req);
    let requester = user_of(&req);
    let (headers, bytes) = st.read_body(req).await?;
    let ct = content_type(&headers);
    let ns = info.namespace.as_str();
    let force = check_force(query, &ct)?;
    let bad = |e: String| ApiError::bad_request(format!("error decoding patch: {e}"));
    let w = match ct.as_str() {
        JSON_PATCH => {
            let ops: Value = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
            if ops.as_array().is_some_and(|a| a.len() > MAX_PATCH_OPS) {
                return Err(ApiError::too_large(format!(
                    "The allowed maximum operations in a JSON patch is {MAX_PATCH_OPS}"
                )));
            }
            let p: json_patch::Patch =
                serde_json::from_value(ops).map_err(|e| bad(e.to_string()))?;
            let opts = write_options(query, agent, false, actor, requester)?;
            st.registry
                .patch(def, ns, &info.name, &Patch::Json(p), status_only, &opts)
                .await?
        }
        MERGE_PATCH => {
            let p: Value = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
            if !p.is_object() {
                return Err(bad("a merge patch must be a JSON object".into()));
            }
            let opts = write_options(query, agent, false, actor, requester)?;
            st.registry
                .patch(def, ns, &info.name, &Patch::Merge(p), status_only, &opts)
                .await?
        }
        APPLY_PATCH => {
            let applied = parse_yaml(&bytes).map_err(bad)?;
            let opts = write_options(query, agent, true, actor, requester)?;
            st.registry
                .apply(
                    def,
                    ns,
                    &info.name,
                    applied,
                    crate::rest::ApplyHow {
                        force: force.unwrap_or(false),
                        status_only,
                    },
                    &opts,
                )
                .await?
        }
        _ => return Err(ApiError::unsupported_media_type(&PATCH_TYPES)),
    };
    written(def, w, accept)
}

/// A PATCH's `force`: a boolean (else 400), and only for an apply patch (else 422), as
/// kube-apiserver has it.
fn check_force(query: &Query, content_type: &str) -> ApiResult<Option<bool>> {
    // A bare `force=` is given, and true, to kube-apiserver (any value but "0" and "false"
    // is): a non-apply patch carrying it is refused (found by `cargo xtask fuzz --cluster`).
    let force = match query.get("force") {
        Some("") => Some(true),
        _ => query.bool("force").map_err(ApiError::bad_request)?,
    };
    if content_type != APPLY_PATCH && force.is_some() {
        return Err(ApiError::invalid(
            "PatchOptions",
            "meta.k8s.io",
            "",
            &[kubevirt_api::validation::FieldError::forbidden(
                "force",
                "may not be specified for non-apply patch",
            )],
        ));
    }
    Ok(force)
}

/// `/scale` (crate::scale): GET, PUT of a Scale, or a JSON or merge patch of it (what
/// `kubectl scale` sends; strategic merge is a merge patch on a Scale, which has no lists).
#[allow(clippy::too_many_arguments)]
async fn scale(
    st: &AppState,
    def: &'static ResourceDef,
    info: &RequestInfo,
    query: &Query,
    req: Request,
    agent: &str,
    actor: kubevirt_api::policy::Actor,
    requester: Option<crate::auth::User>,
) -> ApiResult<Response> {
    let ns = info.namespace.as_str();
    let method = req.method().clone();
    if method == Method::GET {
        return crate::scale::get(&st.registry, def, ns, &info.name).await;
    }
    let opts = write_options(query, agent, false, actor, requester)?;
    let (headers, bytes) = st.read_body(req).await?;
    if method == Method::PATCH {
        // Found by `cargo xtask fuzz --cluster`: `force=5e-324` was taken on /scale.
        check_force(query, &content_type(&headers))?;
    }
    let bad = |e: String| ApiError::bad_request(format!("error decoding patch: {e}"));
    let change = match (method, content_type(&headers).as_str()) {
        (Method::PUT, _) => {
            let v: Value = serde_json::from_slice(&bytes)
                .map_err(|e| ApiError::bad_request(format!("the body is not a Scale: {e}")))?;
            crate::scale::Change::Replace(v)
        }
        (Method::PATCH, JSON_PATCH) => {
            let ops: Value = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
            if ops.as_array().is_some_and(|a| a.len() > MAX_PATCH_OPS) {
                return Err(ApiError::too_large(format!(
                    "The allowed maximum operations in a JSON patch is {MAX_PATCH_OPS}"
                )));
            }
            let p: json_patch::Patch =
                serde_json::from_value(ops).map_err(|e| bad(e.to_string()))?;
            crate::scale::Change::Patch(Patch::Json(p))
        }
        (Method::PATCH, MERGE_PATCH | STRATEGIC_MERGE_PATCH) => {
            let p: Value = serde_json::from_slice(&bytes).map_err(|e| bad(e.to_string()))?;
            if !p.is_object() {
                return Err(bad("a merge patch must be a JSON object".into()));
            }
            crate::scale::Change::Patch(Patch::Merge(p))
        }
        (Method::PATCH, _) => {
            return Err(ApiError::unsupported_media_type(&[
                JSON_PATCH,
                MERGE_PATCH,
                STRATEGIC_MERGE_PATCH,
            ]));
        }
        _ => return Err(ApiError::method_not_allowed()),
    };
    crate::scale::write(
        &st.registry,
        def,
        ns,
        &info.name,
        change,
        opts.dry_run,
        &opts.field_manager,
    )
    .await
}

async fn delete_options(st: &AppState, query: &Query, req: Request) -> ApiResult<DeleteOptions> {
    let from_query = DeleteOptions {
        grace_period_seconds: query
            .int("gracePeriodSeconds")
            .map_err(ApiError::bad_request)?,
        propagation_policy: query.get("propagationPolicy").map(str::to_string),
        orphan_dependents: query
            .bool("orphanDependents")
            .map_err(ApiError::bad_request)?,
        dry_run: query.get("dryRun").map(|d| vec![d.to_string()]),
        preconditions: None,
    };
    let (_, bytes) = st.read_body(req).await?;
    if !bytes.iter().all(u8::is_ascii_whitespace) {
        // The body's options win, as in kube-apiserver, which then ignores the query; a
        // parameter the published schema refuses is refused here all the same, rather than
        // silently dropped (schemathesis: `propagationPolicy=AAA` beside a body accepted).
        crate::rest::validate_delete_options(&from_query)?;
        let v: Value = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?;
        // k8s-openapi's DeleteOptions skips its type fields whatever they hold; kube-apiserver
        // refuses a non-string one (schemathesis: `"kind": true` accepted).
        for field in ["apiVersion", "kind"] {
            if v.get(field).is_some_and(|f| !f.is_string() && !f.is_null()) {
                return Err(ApiError::bad_request(format!(
                    "invalid DeleteOptions: {field} must be a string"
                )));
            }
        }
        return serde_json::from_value(v)
            .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")));
    }
    Ok(from_query)
}

#[cfg(test)]
mod option_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn dry_run_is_all_or_absent() {
        let opts = |q: &str| {
            write_options(
                &Query::parse(Some(q)),
                "agent",
                false,
                kubevirt_api::policy::Actor::default(),
                None,
            )
        };
        assert!(opts("dryRun=All").unwrap().dry_run);
        assert!(!opts("").unwrap().dry_run);
        for bad in ["dryRun=", "dryRun=all", "dryRun=x"] {
            let e = opts(bad).unwrap_err();
            assert_eq!(e.code, 422, "{bad}");
            assert!(e.message.contains("dryRun"), "{bad}: {}", e.message);
        }
    }
}

#[cfg(test)]
mod panic_tests {
    #![allow(clippy::unwrap_used, clippy::panic)]
    use super::*;
    use tower::ServiceExt;

    /// A handler that panics answers 500 with a Status, and the same router then serves the
    /// next request; the handler ran with [`in_request`] set, outside it is not.
    #[tokio::test]
    async fn a_panicking_request_is_a_500_and_the_server_goes_on() {
        let app = guarded(Router::new().fallback(|req: Request| async move {
            assert!(in_request());
            if req.uri().path() == "/boom" {
                panic!("bug");
            }
            StatusCode::OK
        }));
        let r = app
            .clone()
            .oneshot(Request::get("/boom").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
        let body = axum::body::to_bytes(r.into_body(), 1 << 16).await.unwrap();
        let status: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            (status["kind"].as_str(), status["code"].as_i64()),
            (Some("Status"), Some(500))
        );
        let ok = app
            .oneshot(Request::get("/fine").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        assert!(!in_request());
    }
}

#[cfg(test)]
mod metrics_listener_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tower::ServiceExt;

    /// The plain listener serves the metrics and a health check, and nothing of the API.
    #[tokio::test]
    async fn the_plain_listener_serves_metrics_and_nothing_else() {
        let metrics = Arc::new(crate::metrics::Metrics::default());
        let app = metrics_router(metrics.clone());
        let get = |path: &'static str| {
            app.clone()
                .oneshot(Request::get(path).body(Body::empty()).unwrap())
        };
        let r = get("/metrics").await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert!(
            r.headers()[axum::http::header::CONTENT_TYPE]
                .to_str()
                .unwrap()
                .starts_with("text/plain; version=0.0.4")
        );
        let body = axum::body::to_bytes(r.into_body(), 1 << 24).await.unwrap();
        assert_eq!(String::from_utf8_lossy(&body), metrics.encode());
        assert_eq!(get("/healthz").await.unwrap().status(), StatusCode::OK);
        for path in [
            "/apis",
            "/apis/kubevirt.io/v1/virtualmachines",
            "/openapi/v2",
        ] {
            assert_eq!(get(path).await.unwrap().status(), StatusCode::NOT_FOUND);
        }
    }
}

#[cfg(test)]
mod warning_tests {
    use super::*;

    #[test]
    fn warnings_are_deduplicated_and_kept_whole_within_the_limit() {
        let w = vec!["a".to_string(), "b".to_string(), "a".to_string()];
        assert_eq!(capped_warnings(&w), ["a", "b"]);
    }

    #[test]
    fn past_the_total_each_is_cut_and_the_rest_dropped_as_kube_apiserver_does() {
        let long: Vec<String> = (0..20)
            .map(|i| format!("{i:02}{}", "x".repeat(998)))
            .collect();
        let out = capped_warnings(&long);
        // Cut to 256 characters each; dropped once 4096 are written: 16 fit.
        assert_eq!(out.len(), 16);
        assert!(out.iter().all(|w| w.chars().count() == 256));
        assert!(out[15].starts_with("15"));
    }

    #[test]
    fn hundreds_of_short_warnings_fit_in_fifty_headers() {
        let many: Vec<String> = (0..300)
            .map(|i| format!("unknown field \"f{i}\""))
            .collect();
        let out = capped_warnings(&many);
        assert_eq!(out.len(), WARNING_HEADERS);
        assert_eq!(out[0], "unknown field \"f0\"");
        // Those past the size limit are dropped as kube-apiserver drops them; of the rest,
        // the ones past the 49th are counted in the last header.
        assert!(out[49].ends_with("more warnings not shown"), "{}", out[49]);
    }
}
