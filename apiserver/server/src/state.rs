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
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// Interval between watch bookmarks.
    pub bookmark_interval: Duration,
    /// Where VMI actions and streams are executed (subresources.rs).
    pub handler: crate::handler::HandlerClient,
    /// Read-only and mutating requests allowed at once.
    pub in_flight: crate::inflight::InFlight,
    /// Open watches per user.
    pub watches: Arc<crate::inflight::Watches>,
    /// The eviction webhook for launcher pods.
    pub eviction: LauncherEviction,
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

impl AppState {
    /// A request's headers and body, at most `max_body_bytes` of it (413 beyond).
    pub(crate) async fn read_body(&self, req: Request) -> ApiResult<(HeaderMap, Bytes)> {
        use http_body_util::BodyExt;
        let headers = req.headers().clone();
        let mut body = req.into_body();
        let mut buf = bytes::BytesMut::new();
        let mut seen = 0usize;
        // Past the limit keep reading (bounded) without storing, so an HTTP/1.1 client
        // that is still sending gets the 413 instead of a reset connection.
        while let Some(frame) = body.frame().await {
            let frame =
                frame.map_err(|e| ApiError::bad_request(format!("reading request body: {e}")))?;
            if let Some(data) = frame.data_ref() {
                seen += data.len();
                if seen <= self.max_body_bytes {
                    buf.extend_from_slice(data);
                } else if seen > self.max_body_bytes.saturating_mul(8) {
                    break;
                }
            }
        }
        if seen > self.max_body_bytes {
            return Err(ApiError::too_large(format!(
                "limit is {} bytes",
                self.max_body_bytes
            )));
        }
        Ok((headers, buf.freeze()))
    }
}
