//! API errors and their `metav1.Status` form. Every failure a client can see goes
//! through [`ApiError`], so codes, reasons and messages match kube-apiserver's.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    ListMeta, Status, StatusCause, StatusDetails,
};
use kubevirt_api::validation::FieldError;

/// A failed API request, with everything needed to render its Status.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// Machine-readable reason (`NotFound`, `Conflict`, …).
    pub reason: &'static str,
    /// Human-readable message.
    pub message: String,
    /// Details: name, group, kind, causes.
    pub details: Option<StatusDetails>,
    /// `metadata.continue` for an expired continue token.
    pub continue_token: Option<String>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

/// Resource identity used in error messages: `virtualmachines.kubevirt.io "vm1"`.
#[derive(Debug, Clone, Copy)]
pub struct Gr<'a> {
    /// Resource plural.
    pub resource: &'a str,
    /// API group.
    pub group: &'a str,
}

impl Gr<'_> {
    fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.resource.to_string()
        } else {
            format!("{}.{}", self.resource, self.group)
        }
    }

    fn details(&self, name: &str) -> StatusDetails {
        StatusDetails {
            name: (!name.is_empty()).then(|| name.to_string()),
            group: (!self.group.is_empty()).then(|| self.group.to_string()),
            kind: Some(self.resource.to_string()),
            ..Default::default()
        }
    }
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
            continue_token: None,
        }
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 401 Unauthorized.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// 403 Forbidden.
    pub fn forbidden(gr: Gr<'_>, name: &str, message: impl Into<String>) -> Self {
        let mut e = Self::new(403, "Forbidden", message);
        e.details = Some(gr.details(name));
        e
    }

    /// 404 for an object that does not exist.
    pub fn not_found(gr: Gr<'_>, name: &str) -> Self {
        let mut e = Self::new(
            404,
            "NotFound",
            format!("{} {name:?} not found", gr.qualified()),
        );
        e.details = Some(gr.details(name));
        e
    }

    /// 404 for a path the server does not serve.
    pub fn path_not_found() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed() -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    /// 406 NotAcceptable.
    pub fn not_acceptable(message: impl Into<String>) -> Self {
        Self::new(406, "NotAcceptable", message)
    }

    /// 409 AlreadyExists.
    pub fn already_exists(gr: Gr<'_>, name: &str) -> Self {
        let mut e = Self::new(
            409,
            "AlreadyExists",
            format!("{} {name:?} already exists", gr.qualified()),
        );
        e.details = Some(gr.details(name));
        e
    }

    /// 409 Conflict with an explanation.
    pub fn conflict(gr: Gr<'_>, name: &str, why: &str) -> Self {
        let mut e = Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} {name:?}: {why}",
                gr.qualified()
            ),
        );
        e.details = Some(gr.details(name));
        e
    }

    /// 409 for a stale resourceVersion.
    pub fn stale(gr: Gr<'_>, name: &str) -> Self {
        Self::conflict(
            gr,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 410 Expired.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 408 RequestTimeout: the client did not send its request (body) in time.
    pub fn request_timeout(message: impl Into<String>) -> Self {
        Self::new(408, "Timeout", message)
    }

    /// 413 RequestEntityTooLarge.
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            format!("Request entity too large: {}", message.into()),
        )
    }

    /// 415 UnsupportedMediaType.
    pub fn unsupported_media_type(accepted: &[&str]) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: {}",
                accepted.join(", ")
            ),
        )
    }

    /// 422 Invalid with one cause per field error.
    pub fn invalid(kind: &str, group: &str, name: &str, errors: &[FieldError]) -> Self {
        let qualified = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let list: Vec<String> = errors.iter().map(ToString::to_string).collect();
        let summary = if list.len() == 1 {
            list[0].clone()
        } else {
            format!("[{}]", list.join(", "))
        };
        let mut e = Self::new(
            422,
            "Invalid",
            format!("{qualified} {name:?} is invalid: {summary}"),
        );
        e.details = Some(StatusDetails {
            name: Some(name.to_string()),
            group: Some(group.to_string()),
            kind: Some(kind.to_string()),
            causes: Some(
                errors
                    .iter()
                    .map(|f| StatusCause {
                        reason: Some(f.kind.cause_type().to_string()),
                        message: Some(f.message.clone()),
                        field: Some(f.field.clone()),
                    })
                    .collect(),
            ),
            ..Default::default()
        });
        e
    }

    /// 500 InternalError. The cause is logged by the caller, not shown in full.
    pub fn internal(message: impl Into<String>) -> Self {
        let message = message.into();
        let mut e = Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {message}"),
        );
        e.details = Some(StatusDetails {
            causes: Some(vec![StatusCause {
                message: Some(message),
                ..Default::default()
            }]),
            ..Default::default()
        });
        e
    }

    /// 429 TooManyRequests (more requests in flight than allowed), kube-apiserver's words.
    pub fn too_many_requests() -> Self {
        Self::too_many("Too many requests, please try again later.")
    }

    /// 429 TooManyRequests with a message of its own.
    pub fn too_many(message: impl Into<String>) -> Self {
        let mut e = Self::new(429, "TooManyRequests", message);
        e.details = Some(StatusDetails {
            retry_after_seconds: Some(1),
            ..Default::default()
        });
        e
    }

    /// 503 ServiceUnavailable (storage down).
    pub fn unavailable(message: impl Into<String>) -> Self {
        let mut e = Self::new(503, "ServiceUnavailable", message);
        e.details = Some(StatusDetails {
            retry_after_seconds: Some(1),
            ..Default::default()
        });
        e
    }

    /// 504 Timeout.
    pub fn timeout(message: impl Into<String>, too_large_rv: bool) -> Self {
        let mut e = Self::new(504, "Timeout", format!("Timeout: {}", message.into()));
        e.details = Some(StatusDetails {
            retry_after_seconds: Some(1),
            causes: too_large_rv.then(|| {
                vec![StatusCause {
                    reason: Some("ResourceVersionTooLarge".into()),
                    message: Some("Too large resource version".into()),
                    field: None,
                }]
            }),
            ..Default::default()
        });
        e
    }

    /// The `metav1.Status` for this error.
    pub fn to_status(&self) -> Status {
        Status {
            code: Some(i32::from(self.code)),
            details: self.details.clone(),
            message: Some(self.message.clone()),
            metadata: ListMeta {
                continue_: self.continue_token.clone(),
                ..Default::default()
            },
            reason: Some(self.reason.to_string()),
            status: Some("Failure".to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::to_vec(&self.to_status()).unwrap_or_default();
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut resp = (code, body).into_response();
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(secs) = self.details.as_ref().and_then(|d| d.retry_after_seconds)
            && let Ok(v) = HeaderValue::from_str(&secs.to_string())
        {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        resp
    }
}

/// Result alias for request handling.
pub type ApiResult<T> = Result<T, ApiError>;
