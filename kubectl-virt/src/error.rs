//! Errors a person can act on. Every failure the plugin reports goes through
//! [`CliError`], whose `Display` is the whole message printed to the user.

use kube::core::Status;

/// Name of the APIServices a user should inspect when the aggregated API is
/// missing; kubevirt-rs serves both groups from virt-apiserver.
pub const APISERVICE_HINT: &str =
    "check `kubectl get apiservice v1.kubevirt.io v1.subresources.kubevirt.io`";

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{kind} \"{name}\" not found in namespace \"{namespace}\"")]
    NotFound {
        kind: &'static str,
        name: String,
        namespace: String,
    },

    #[error(
        "permission denied: you may not {verb} \"{resource}\" in API group \"{group}\" in namespace \"{namespace}\"{}",
        server_detail(message)
    )]
    Forbidden {
        verb: &'static str,
        resource: String,
        group: &'static str,
        namespace: String,
        message: String,
    },

    #[error(
        "not authenticated to the API server: check the credentials in your kubeconfig{}",
        server_detail(message)
    )]
    Unauthorized { message: String },

    #[error(
        "the kubevirt.io API is not registered or not available: {APISERVICE_HINT}{}",
        server_detail(detail)
    )]
    ApiUnavailable { detail: String },

    #[error("cannot reach the API server at {server}: {detail}")]
    Unreachable { server: String, detail: String },

    #[error(
        "TLS connection to the API server at {server} failed: {detail}; check certificate-authority(-data) and the server address in your kubeconfig"
    )]
    Tls { server: String, detail: String },

    #[error("cannot {action} {kind} \"{name}\" in namespace \"{namespace}\": {message}")]
    Conflict {
        action: &'static str,
        kind: &'static str,
        name: String,
        namespace: String,
        message: String,
    },

    #[error(
        "{kind} \"{name}\" in namespace \"{namespace}\" is not running{}",
        server_detail(message)
    )]
    NotRunning {
        kind: &'static str,
        name: String,
        namespace: String,
        message: String,
    },

    #[error(
        "{action} {kind} \"{name}\" in namespace \"{namespace}\" failed: {message} (HTTP {code})"
    )]
    Server {
        action: &'static str,
        kind: &'static str,
        name: String,
        namespace: String,
        code: u16,
        message: String,
    },

    #[error("no active migration for VMI \"{name}\" in namespace \"{namespace}\"")]
    NoActiveMigration { name: String, namespace: String },

    #[error("migration of VM \"{name}\" in namespace \"{namespace}\" failed: {reason}")]
    MigrationFailed {
        name: String,
        namespace: String,
        reason: String,
    },

    #[error(
        "timed out after {minutes} minute(s) waiting for VMI \"{name}\" in namespace \"{namespace}\" to be running{}",
        server_detail(last)
    )]
    Timeout {
        minutes: u64,
        name: String,
        namespace: String,
        last: String,
    },

    #[error("cannot load Kubernetes configuration: {0}")]
    Config(String),

    #[error("{0}")]
    Usage(String),

    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },

    #[error("cannot serialise YAML: {0}")]
    Yaml(String),

    #[error("websocket to {what}: {detail}")]
    WebSocket { what: String, detail: String },

    #[error("unexpected response from the API server: {0}")]
    Protocol(String),
}

impl CliError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }
}

fn server_detail(message: &str) -> String {
    let m = message.trim();
    if m.is_empty() {
        String::new()
    } else {
        format!(" (server said: {m})")
    }
}

/// What a request was about, so that a bare HTTP status can be turned into a
/// sentence naming the object, the namespace and the permission involved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// Human label: "VM", "VMI", "migration".
    pub kind: &'static str,
    /// API group the request went to.
    pub group: &'static str,
    /// Plural resource, as RBAC sees it.
    pub resource: &'static str,
    /// Subresource (start, console, …), as RBAC sees it.
    pub subresource: Option<&'static str>,
    /// RBAC verb of the request.
    pub verb: &'static str,
    /// Verb for messages ("start", "pause", "connect to the console of").
    pub action: &'static str,
    pub name: String,
    pub namespace: String,
}

impl Target {
    fn rbac_resource(&self) -> String {
        match self.subresource {
            Some(sub) => format!("{}/{}", self.resource, sub),
            None => self.resource.to_owned(),
        }
    }

    fn not_found(&self) -> CliError {
        CliError::NotFound {
            kind: self.kind,
            name: self.name.clone(),
            namespace: self.namespace.clone(),
        }
    }
}

/// Bodies kube-apiserver and the aggregator send for paths no APIService
/// covers (as opposed to a Status about a missing object).
fn is_unknown_path_404(status: &Status, target: &Target) -> bool {
    let details_name = status.details.as_ref().map(|d| d.name.as_str());
    if details_name == Some(target.name.as_str()) {
        return false;
    }
    let msg = status.message.to_ascii_lowercase();
    if msg.contains(&format!(
        "\"{}\" not found",
        target.name.to_ascii_lowercase()
    )) {
        return false;
    }
    // The generic apiserver's NotFoundHandler and Go's default mux.
    msg.contains("the server could not find the requested resource")
        || msg.contains("404 page not found")
        || status.reason != "NotFound"
}

/// Drops apimachinery's `Operation cannot be fulfilled on R "name": `
/// preamble, which would repeat what our own message already says.
fn strip_conflict_prefix(message: &str) -> &str {
    message
        .strip_prefix("Operation cannot be fulfilled on ")
        .and_then(|rest| rest.split_once("\": "))
        .map_or(message, |(_, why)| why)
}

/// Turns a failed request's Status into an actionable error.
pub fn from_status(target: &Target, status: &Status) -> CliError {
    let message = status.message.trim().to_owned();
    match status.code {
        401 => CliError::Unauthorized { message },
        403 => CliError::Forbidden {
            verb: target.verb,
            resource: target.rbac_resource(),
            group: target.group,
            namespace: target.namespace.clone(),
            message,
        },
        404 if is_unknown_path_404(status, target) => CliError::ApiUnavailable {
            detail: format!("{} {}: {}", 404, status.reason, message),
        },
        404 => target.not_found(),
        503 => CliError::ApiUnavailable {
            detail: if message.is_empty() {
                "503 service unavailable".to_owned()
            } else {
                format!("503: {message}")
            },
        },
        409 => CliError::Conflict {
            action: target.action,
            kind: target.kind,
            name: target.name.clone(),
            namespace: target.namespace.clone(),
            message: strip_conflict_prefix(&message).to_owned(),
        },
        code => CliError::Server {
            action: target.action,
            kind: target.kind,
            name: target.name.clone(),
            namespace: target.namespace.clone(),
            code,
            message,
        },
    }
}

/// Maps any client error for a request about `target`. `server` is the
/// API server URL, for "cannot reach" messages.
pub fn from_kube(target: &Target, server: &str, err: kube::Error) -> CliError {
    match err {
        kube::Error::Api(status) => from_status(target, &status),
        kube::Error::HyperError(e) => connection_error(server, error_chain(&e)),
        kube::Error::Service(e) => connection_error(server, error_chain(e.as_ref())),
        kube::Error::Auth(e) => CliError::Unauthorized {
            message: error_chain(&e),
        },
        other => CliError::Protocol(error_chain(&other)),
    }
}

fn connection_error(server: &str, detail: String) -> CliError {
    // rustls' errors arrive flattened into io::Error text ("invalid peer
    // certificate", "received corrupt message" for a plain-HTTP port);
    // telling them apart from a refused connection points at the fix.
    let lower = detail.to_ascii_lowercase();
    const TLS_HINTS: &[&str] = &[
        "certificate",
        "tls",
        "handshake",
        "corrupt message",
        "alert",
    ];
    if TLS_HINTS.iter().any(|h| lower.contains(h)) {
        CliError::Tls {
            server: server.to_owned(),
            detail,
        }
    } else {
        CliError::Unreachable {
            server: server.to_owned(),
            detail,
        }
    }
}

/// `a: b: c` from an error and its sources, so TLS and DNS failures show
/// their root cause rather than "client error (Connect)".
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let s = e.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cur = e.source();
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn target() -> Target {
        Target {
            kind: "VM",
            group: "subresources.kubevirt.io",
            resource: "virtualmachines",
            subresource: Some("start"),
            verb: "update",
            action: "start",
            name: "vm1".into(),
            namespace: "prod".into(),
        }
    }

    fn status(json: &str) -> Status {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn vm_not_found_names_namespace() {
        let s = status(
            r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"virtualmachines.kubevirt.io \"vm1\" not found","reason":"NotFound","details":{"name":"vm1","group":"kubevirt.io","kind":"virtualmachines"},"code":404}"#,
        );
        let e = from_status(&target(), &s);
        assert!(matches!(e, CliError::NotFound { .. }));
        assert_eq!(e.to_string(), "VM \"vm1\" not found in namespace \"prod\"");
    }

    #[test]
    fn unknown_group_404_means_api_not_registered() {
        // kube-apiserver's answer for a path no APIService covers.
        let s = status(
            r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"the server could not find the requested resource","reason":"NotFound","details":{},"code":404}"#,
        );
        let e = from_status(&target(), &s);
        assert!(matches!(e, CliError::ApiUnavailable { .. }), "{e}");
        assert!(e.to_string().starts_with(
            "the kubevirt.io API is not registered or not available: check `kubectl get apiservice v1.kubevirt.io"
        ));
        // A plain-text body, which kube-rs wraps in a synthetic Status.
        let s = Status::failure("404 page not found", "Failed to parse error data").with_code(404);
        assert!(matches!(
            from_status(&target(), &s),
            CliError::ApiUnavailable { .. }
        ));
    }

    #[test]
    fn service_unavailable_means_api_not_available() {
        let s = Status::failure("service unavailable", "Failed to parse error data").with_code(503);
        let e = from_status(&target(), &s);
        assert_eq!(
            e.to_string(),
            "the kubevirt.io API is not registered or not available: check `kubectl get apiservice v1.kubevirt.io v1.subresources.kubevirt.io` (server said: 503: service unavailable)"
        );
    }

    #[test]
    fn forbidden_names_verb_and_subresource() {
        let s = status(
            r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"virtualmachines.subresources.kubevirt.io \"vm1\" is forbidden: User \"alice\" cannot update resource \"virtualmachines/start\" in API group \"subresources.kubevirt.io\" in the namespace \"prod\"","reason":"Forbidden","details":{"name":"vm1","group":"subresources.kubevirt.io","kind":"virtualmachines"},"code":403}"#,
        );
        let e = from_status(&target(), &s);
        let msg = e.to_string();
        assert!(
            msg.starts_with(
                "permission denied: you may not update \"virtualmachines/start\" in API group \"subresources.kubevirt.io\" in namespace \"prod\""
            ),
            "{msg}"
        );
        assert!(msg.contains("User \\\"alice\\\"") || msg.contains("User \"alice\""));
    }

    #[test]
    fn conflict_carries_server_reason() {
        let s = status(
            r#"{"kind":"Status","status":"Failure","message":"VM is already running","reason":"Conflict","code":409}"#,
        );
        assert_eq!(
            from_status(&target(), &s).to_string(),
            "cannot start VM \"vm1\" in namespace \"prod\": VM is already running"
        );
    }

    #[test]
    fn conflict_preamble_is_dropped() {
        let s = status(
            r#"{"kind":"Status","status":"Failure","message":"Operation cannot be fulfilled on virtualmachines.kubevirt.io \"vm1\": VM is not running","reason":"Conflict","code":409}"#,
        );
        assert_eq!(
            from_status(&target(), &s).to_string(),
            "cannot start VM \"vm1\" in namespace \"prod\": VM is not running"
        );
    }

    #[test]
    fn tls_failures_are_told_apart() {
        assert!(matches!(
            connection_error(
                "https://x/",
                "invalid peer certificate: UnknownIssuer".into()
            ),
            CliError::Tls { .. }
        ));
        assert!(matches!(
            connection_error("https://x/", "tcp connect error: Connection refused".into()),
            CliError::Unreachable { .. }
        ));
    }

    #[test]
    fn unauthorized_and_other_codes() {
        let s = Status::failure("Unauthorized", "Unauthorized").with_code(401);
        assert!(matches!(
            from_status(&target(), &s),
            CliError::Unauthorized { .. }
        ));
        let s = Status::failure("boom", "InternalError").with_code(500);
        assert_eq!(
            from_status(&target(), &s).to_string(),
            "start VM \"vm1\" in namespace \"prod\" failed: boom (HTTP 500)"
        );
    }
}
