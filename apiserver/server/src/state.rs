//! What every request handler shares: the registry, discovery and OpenAPI documents,
//! authentication, limits, metrics and the clients of other components. Its own module so
//! that handlers (http.rs, subresources.rs, webhook.rs, kubevirts.rs) depend on it and not on
//! each other.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use axum::extract::Request;
use bytes::Bytes;
use http::HeaderMap;
use kubevirt_api::eviction::EvictionStrategy;
use tokio_util::sync::CancellationToken;

use crate::auth::AuthConfig;
use crate::discovery::{Discovery, Doc};
use crate::error::{ApiError, ApiResult};
use crate::metrics::Metrics;
use crate::rest::Registry;

/// OpenAPI documents served by the server.
#[derive(Debug, Clone, Default)]
pub struct OpenApiDocs {
    /// `/openapi/v2`.
    pub v2: Option<Doc>,
    /// `/openapi/v3`.
    pub v3_root: Option<Doc>,
    /// `/openapi/v3/apis/<group>/v1` by group.
    pub v3: Vec<(String, Doc)>,
}

/// Shared state of all requests.
pub struct AppState {
    /// REST registry.
    pub registry: Registry,
    /// Discovery documents.
    pub discovery: Discovery,
    /// OpenAPI documents.
    pub openapi: OpenApiDocs,
    /// Authn/authz.
    pub auth: AuthConfig,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Cancelled on shutdown; ends watches.
    pub shutdown: CancellationToken,
    /// Set once termination begins, so /readyz fails first.
    pub terminating: AtomicBool,
    /// When etcd last answered a health check (/readyz tolerates a short gap).
    pub etcd_answered: std::sync::Mutex<Option<std::time::Instant>>,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// Interval between watch bookmarks.
    pub bookmark_interval: Duration,
    /// Where VMI actions and streams are executed (subresources.rs).
    pub handler: crate::handler::HandlerClient,
    /// Read-only and mutating requests allowed at once.
    pub in_flight: crate::inflight::InFlight,
    /// Open watches per user.
    pub watches: Arc<crate::inflight::PerUser>,
    /// Open console, VNC and port-forward streams per user.
    pub streams: Arc<crate::inflight::PerUser>,
    /// The eviction webhook's calls at once, per source address.
    pub webhook_calls: Arc<crate::inflight::PerSource>,
    /// The eviction webhook for launcher pods.
    pub eviction: LauncherEviction,
    /// Signs UploadTokenRequests' tokens (and verifies them at the upload proxy).
    pub upload_tokens: kubevirt_api::cdi::upload::TokenKey,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").finish_non_exhaustive()
    }
}

/// What the webhook needs besides the store.
#[derive(Clone, Default)]
pub struct LauncherEviction {
    /// Reads the evicted pod.
    pub kube: Option<kube::Client>,
    /// `evictionStrategy` of VMIs that set none (`--eviction-strategy`).
    pub default_strategy: Option<EvictionStrategy>,
}

impl std::fmt::Debug for LauncherEviction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LauncherEviction")
            .field("default_strategy", &self.default_strategy)
            .finish_non_exhaustive()
    }
}

/// How long a request's body may take to arrive. A client that sends its body slowly holds
/// an in-flight slot meanwhile: without a bound a handful of them would hold every slot
/// (N2 of the security review at bd37f96). kube-apiserver bounds a whole non-long-running
/// request at 60 s; the body alone gets half of that.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(30);

impl AppState {
    /// A request's headers and body, at most `max_body_bytes` of it (413 beyond), within
    /// [`BODY_TIMEOUT`] (408 beyond).
    pub(crate) async fn read_body(&self, req: Request) -> ApiResult<(HeaderMap, Bytes)> {
        read_body_within(req, self.max_body_bytes, BODY_TIMEOUT).await
    }
}

/// [`AppState::read_body`] with its limits given.
pub(crate) async fn read_body_within(
    req: Request,
    max_body_bytes: usize,
    timeout: Duration,
) -> ApiResult<(HeaderMap, Bytes)> {
    let headers = req.headers().clone();
    let body = tokio::time::timeout(timeout, collect_body(req.into_body(), max_body_bytes))
        .await
        .map_err(|_| {
            ApiError::request_timeout(format!(
                "the request body did not arrive within {}s",
                timeout.as_secs()
            ))
        })??;
    Ok((headers, body))
}

async fn collect_body(mut body: axum::body::Body, max_body_bytes: usize) -> ApiResult<Bytes> {
    {
        use http_body_util::BodyExt;
        let mut buf = bytes::BytesMut::new();
        let mut seen = 0usize;
        // Past the limit keep reading (bounded) without storing, so an HTTP/1.1 client
        // that is still sending gets the 413 instead of a reset connection.
        while let Some(frame) = body.frame().await {
            let frame =
                frame.map_err(|e| ApiError::bad_request(format!("reading request body: {e}")))?;
            if let Some(data) = frame.data_ref() {
                seen += data.len();
                if seen <= max_body_bytes {
                    buf.extend_from_slice(data);
                } else if seen > max_body_bytes.saturating_mul(8) {
                    break;
                }
            }
        }
        if seen > max_body_bytes {
            return Err(ApiError::too_large(format!(
                "limit is {max_body_bytes} bytes"
            )));
        }
        Ok(buf.freeze())
    }
}
