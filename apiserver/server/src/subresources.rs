//! subresources.kubevirt.io/v1: action subresources (start, stop, restart, migrate,
//! pause, unpause, softreboot) and streams (console, vnc).

use std::sync::Arc;

use axum::extract::Request;
use axum::response::Response;

use crate::error::{ApiError, ApiResult};
use crate::http::AppState;
use crate::request::{Query, RequestInfo};

/// Subresource handlers.
#[derive(Debug, Default, Clone)]
pub struct Subresources {}

impl Subresources {
    /// Dispatches a request under subresources.kubevirt.io/v1.
    pub async fn handle(
        &self,
        _st: &Arc<AppState>,
        info: &RequestInfo,
        _query: &Query,
        _req: Request,
    ) -> ApiResult<Response> {
        let known = crate::kinds::ResourceDef::by_plural(&info.resource).is_some_and(|d| {
            d.actions.contains(&info.subresource.as_str())
                || d.streams.contains(&info.subresource.as_str())
        });
        if !known || info.name.is_empty() {
            return Err(ApiError::path_not_found());
        }
        Err(ApiError::path_not_found())
    }
}
