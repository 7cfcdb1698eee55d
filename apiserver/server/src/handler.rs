//! The client side of virt-handler's mTLS server (docs/cluster-flow.md §4, §5): finds
//! the handler of a node, forwards VMI actions (pause, unpause, softreboot) and dials
//! its console/VNC websockets.
//!
//! Every connection is fresh: actions are rare and a console lives for minutes, so
//! pooling would only keep sockets to handlers that may have been replaced.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HOST, SEC_WEBSOCKET_PROTOCOL};
use http::{HeaderValue, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use rustls::ClientConfig;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use kubevirt_api::handler_protocol::{HANDLER_PORT, PLAIN_SUBPROTOCOL, vmi_path};

use crate::wsclient::WsConnectError;

/// The Host of requests to a handler (its certificate is checked against its node's name).
pub const HANDLER_SERVER_NAME: &str = "virt-handler";
/// TCP connect plus TLS handshake.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A whole action request; softreboot and pause answer in well under a second.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a node → handler address lookup is reused. Short, because a handler pod
/// that is replaced gets a new IP; a failed dial also drops the entry.
const LOOKUP_TTL: Duration = Duration::from_secs(10);
/// Largest error body we read from a handler.
const MAX_ERROR_BODY: usize = 64 * 1024;
/// Largest guest-agent document read from a handler (a guest with many users or mounts
/// is a few KiB; the launcher's lines are capped at 1 MiB).
const MAX_DOCUMENT: usize = 1024 * 1024;

/// A stream to a handler.
pub type HandlerStream = crate::wsclient::WsClient;

/// Why a handler could not be used. Everything but [`HandlerError::Status`] becomes a
/// 503 naming the node: the VMI is fine, its node's handler is not reachable.
#[derive(Debug, thiserror::Error)]
pub enum HandlerError {
    /// No TLS material was configured.
    #[error(
        "virt-apiserver has no client certificate for virt-handler (--handler-ca, --handler-client-cert, --handler-client-key)"
    )]
    NotConfigured,
    /// The VMI has no node yet.
    #[error("the VMI is not scheduled to a node")]
    NoNode,
    /// Standalone mode and no `--handler-address` for the node.
    #[error(
        "no address for virt-handler on node {node:?}: no kube-apiserver to look it up and no --handler-address"
    )]
    NoLookup {
        /// Node name.
        node: String,
    },
    /// Listing handler pods failed.
    #[error("looking up virt-handler on node {node:?}")]
    Lookup {
        /// Node name.
        node: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// No running handler pod on the node.
    #[error("no running virt-handler pod on node {node:?}")]
    NoHandler {
        /// Node name.
        node: String,
    },
    /// TCP, TLS or HTTP failure talking to the handler.
    #[error("virt-handler on node {node:?} ({addr}) is not reachable: {detail}")]
    Unreachable {
        /// Node name.
        node: String,
        /// Dialled address.
        addr: String,
        /// What failed (io, TLS or protocol error text).
        detail: String,
    },
    /// The handler answered with something that is not a Status.
    #[error("virt-handler on node {node:?} answered {code}: {body}")]
    Unexpected {
        /// Node name.
        node: String,
        /// HTTP code.
        code: u16,
        /// Start of the body.
        body: String,
    },
    /// The handler's own error (404 unknown VMI, 409 wrong state): passed through.
    #[error("virt-handler answered {code}: {message}")]
    Status {
        /// HTTP code.
        code: u16,
        /// The Status message.
        message: String,
        /// The handler's Status document, passed on byte for byte.
        body: Bytes,
    },
}

/// The client's answer: the handler's Status as is, else a 503 naming the node.
impl axum::response::IntoResponse for HandlerError {
    fn into_response(self) -> axum::response::Response {
        match self {
            HandlerError::Status { code, body, .. } => {
                let code = StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_GATEWAY);
                let mut r = (code, body).into_response();
                r.headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                r
            }
            other => {
                tracing::warn!(error = %error_chain(&other), "virt-handler not usable");
                crate::error::ApiError::unavailable(error_chain(&other)).into_response()
            }
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// A configuration problem found at startup.
#[derive(Debug, thiserror::Error)]
pub enum HandlerConfigError {
    /// Reading a file failed.
    #[error("reading {path}")]
    Read {
        /// File.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// PEM could not be parsed.
    #[error("{what}: invalid PEM")]
    Pem {
        /// Which flag.
        what: &'static str,
    },
    /// rustls rejected the material.
    #[error("virt-handler client TLS configuration")]
    Rustls(#[from] rustls::Error),
    /// Only some of the TLS flags were given.
    #[error("--handler-ca, --handler-client-cert and --handler-client-key go together")]
    Partial,
    /// A malformed `--handler-address`.
    #[error("--handler-address {0:?}: expected NODE=HOST:PORT")]
    Address(String),
    /// Loading the files failed otherwise.
    #[error(transparent)]
    Reload(virt_certs::reload::ReloadError),
}

/// The mTLS client configuration towards virt-handlers, rebuilt when the operator rotates
/// the files (checked per connection).
pub type HandlerTls = Arc<virt_certs::reload::Reloading<ClientConfig>>;

/// Files of the client identity and the CA that signed virt-handler's certificate.
#[derive(Debug, Clone, Default)]
pub struct HandlerTlsFiles {
    /// CA bundle of virt-handler's serving certificate.
    pub ca: Option<PathBuf>,
    /// Client certificate (PEM).
    pub cert: Option<PathBuf>,
    /// Client key (PEM).
    pub key: Option<PathBuf>,
}

/// Parses `NODE=HOST:PORT` flags.
pub fn parse_addresses(flags: &[String]) -> Result<BTreeMap<String, String>, HandlerConfigError> {
    flags
        .iter()
        .map(|f| match f.split_once('=') {
            Some((node, addr))
                if !node.is_empty()
                    && addr
                        .rsplit_once(':')
                        .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok()) =>
            {
                Ok((node.to_string(), addr.to_string()))
            }
            _ => Err(HandlerConfigError::Address(f.clone())),
        })
        .collect()
}

/// Builds the mTLS client configuration, re-read whenever the files change; `None` when no
/// flag was given.
pub fn client_tls(files: &HandlerTlsFiles) -> Result<Option<HandlerTls>, HandlerConfigError> {
    use virt_certs::reload::{ReloadError, Reloading};
    let paths = match (&files.ca, &files.cert, &files.key) {
        (None, None, None) => return Ok(None),
        (Some(a), Some(b), Some(c)) => vec![a.clone(), b.clone(), c.clone()],
        _ => return Err(HandlerConfigError::Partial),
    };
    let r = Reloading::new("virt-handler client TLS", paths, |c| {
        Ok(client_config(&c[0], &c[1], &c[2])?)
    })
    .map_err(|e| match e {
        ReloadError::Read { path, source } => HandlerConfigError::Read { path, source },
        ReloadError::Build { what, source } => match source.downcast::<HandlerConfigError>() {
            Ok(typed) => *typed,
            Err(source) => HandlerConfigError::Reload(ReloadError::Build { what, source }),
        },
    })?;
    Ok(Some(Arc::new(r)))
}

/// The client configuration from PEM: the CA bundle of virt-handler's certificate and our
/// client identity.
fn client_config(ca: &[u8], cert: &[u8], key: &[u8]) -> Result<ClientConfig, HandlerConfigError> {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca) {
        roots.add(c.map_err(|_| HandlerConfigError::Pem {
            what: "--handler-ca",
        })?)?;
    }
    if roots.is_empty() {
        return Err(HandlerConfigError::Pem {
            what: "--handler-ca",
        });
    }
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<_, _>>()
        .map_err(|_| HandlerConfigError::Pem {
            what: "--handler-client-cert",
        })?;
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|_| HandlerConfigError::Pem {
        what: "--handler-client-key",
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)?;
    // Both the actions and the websocket upgrade are HTTP/1.1.
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// Finds and talks to virt-handlers.
#[derive(Clone)]
pub struct HandlerClient {
    tls: Option<HandlerTls>,
    overrides: Arc<BTreeMap<String, String>>,
    kube: Option<kube::Client>,
    namespace: String,
    port: u16,
    cache: moka::future::Cache<String, String>,
}

impl std::fmt::Debug for HandlerClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandlerClient")
            .field("configured", &self.tls.is_some())
            .field("overrides", &self.overrides)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Default for HandlerClient {
    /// Unconfigured: every use is a 503 saying what is missing.
    fn default() -> Self {
        Self::new(None, BTreeMap::new(), None, "kubevirt".into(), HANDLER_PORT)
    }
}

impl HandlerClient {
    /// A client with `tls` (None: not configured), fixed addresses by node, and a
    /// kube client to find handler pods in `namespace`.
    pub fn new(
        tls: Option<HandlerTls>,
        overrides: BTreeMap<String, String>,
        kube: Option<kube::Client>,
        namespace: String,
        port: u16,
    ) -> Self {
        Self {
            tls,
            overrides: Arc::new(overrides),
            kube,
            namespace,
            port,
            cache: moka::future::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(LOOKUP_TTL)
                .build(),
        }
    }

    /// The address of the handler on `node`.
    async fn resolve(&self, node: &str) -> Result<String, HandlerError> {
        if let Some(a) = self.overrides.get(node) {
            return Ok(a.clone());
        }
        if let Some(a) = self.cache.get(node).await {
            return Ok(a);
        }
        let kube = self.kube.clone().ok_or_else(|| HandlerError::NoLookup {
            node: node.to_string(),
        })?;
        let pods: kube::Api<Pod> = kube::Api::namespaced(kube, &self.namespace);
        let lp = kube::api::ListParams::default()
            .labels(&format!(
                "{}={}",
                kubevirt_api::COMPONENT_LABEL,
                kubevirt_api::HANDLER_COMPONENT
            ))
            .fields(&format!("spec.nodeName={node}"));
        let list = pods
            .list(&lp)
            .await
            .map_err(|source| HandlerError::Lookup {
                node: node.to_string(),
                source,
            })?;
        let ip = pick_handler(&list.items).ok_or_else(|| HandlerError::NoHandler {
            node: node.to_string(),
        })?;
        let addr = std::net::SocketAddr::new(ip, self.port).to_string();
        self.cache.insert(node.to_string(), addr.clone()).await;
        Ok(addr)
    }

    /// TCP + mTLS to the handler of `node`.
    async fn connect(&self, node: &str) -> Result<(String, TlsStream<TcpStream>), HandlerError> {
        let tls = self.tls.as_ref().ok_or(HandlerError::NotConfigured)?.get();
        let addr = self.resolve(node).await?;
        let unreachable = |detail: String| HandlerError::Unreachable {
            node: node.to_string(),
            addr: addr.clone(),
            detail,
        };
        let dial = async {
            let tcp = TcpStream::connect(addr.as_str())
                .await
                .map_err(|e| unreachable(e.to_string()))?;
            let _ = tcp.set_nodelay(true);
            // Each handler's certificate names its node, and every handler's chains to the
            // same CA: expecting the node's name keeps one node from answering for another.
            let name = ServerName::try_from(node.to_string())
                .map_err(|e| unreachable(format!("node name as TLS server name: {e}")))?;
            TlsConnector::from(tls)
                .connect(name, tcp)
                .await
                .map_err(|e| unreachable(format!("TLS: {}", error_chain(&e))))
        };
        let res = match tokio::time::timeout(CONNECT_TIMEOUT, dial).await {
            Ok(r) => r,
            Err(_) => Err(unreachable(format!(
                "no connection within {}s",
                CONNECT_TIMEOUT.as_secs()
            ))),
        };
        if res.is_err() {
            // The pod may have been replaced: look it up again next time.
            self.cache.invalidate(node).await;
        }
        Ok((addr.clone(), res?))
    }

    /// `PUT /v1/namespaces/{ns}/virtualmachineinstances/{name}/{action}` on the handler, with
    /// the action's options body as the client sent it.
    pub async fn put_action(
        &self,
        node: &str,
        ns: &str,
        name: &str,
        action: &str,
        body: Bytes,
    ) -> Result<(), HandlerError> {
        self.exchange(
            node,
            http::Method::PUT,
            &vmi_path(ns, name, action, None),
            body,
            MAX_ERROR_BODY,
        )
        .await
        .map(drop)
    }

    /// `GET /v1/namespaces/{ns}/virtualmachineinstances/{name}/{sub}` on the handler: the
    /// JSON document it answers (a guest-agent read).
    pub async fn get_document(
        &self,
        node: &str,
        ns: &str,
        name: &str,
        sub: &str,
    ) -> Result<Bytes, HandlerError> {
        self.exchange(
            node,
            http::Method::GET,
            &vmi_path(ns, name, sub, None),
            Bytes::new(),
            MAX_DOCUMENT,
        )
        .await
    }

    /// One request to the handler of `node`; its body when it succeeds (at most `limit`
    /// bytes), its Status as an error otherwise.
    async fn exchange(
        &self,
        node: &str,
        method: http::Method,
        path: &str,
        body: Bytes,
        limit: usize,
    ) -> Result<Bytes, HandlerError> {
        let (addr, tls) = self.connect(node).await?;
        let unreachable = |detail: String| HandlerError::Unreachable {
            node: node.to_string(),
            addr: addr.clone(),
            detail,
        };
        let exchange = async {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                .await
                .map_err(|e| unreachable(error_chain(&e)))?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            let req = http::Request::builder()
                .method(method)
                .uri(path)
                .header(HOST, HANDLER_SERVER_NAME)
                .header(CONTENT_TYPE, "application/json")
                .body(Full::new(body))
                .map_err(|e| unreachable(e.to_string()))?;
            let res = sender
                .send_request(req)
                .await
                .map_err(|e| unreachable(error_chain(&e)))?;
            let code = res.status();
            let body = Limited::new(res.into_body(), limit)
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            Ok::<_, HandlerError>((code, body))
        };
        let (code, body) = tokio::time::timeout(REQUEST_TIMEOUT, exchange)
            .await
            .map_err(|_| {
                unreachable(format!("no answer within {}s", REQUEST_TIMEOUT.as_secs()))
            })??;
        if code.is_success() {
            return Ok(body);
        }
        Err(status_error(node, code.as_u16(), &body))
    }

    /// Opens the handler's `console` or `vnc` websocket; `query` is passed on.
    pub async fn dial_stream(
        &self,
        node: &str,
        ns: &str,
        name: &str,
        sub: &str,
        query: Option<&str>,
    ) -> Result<HandlerStream, HandlerError> {
        let (addr, tls) = self.connect(node).await?;
        let unreachable = |detail: String| HandlerError::Unreachable {
            node: node.to_string(),
            addr: addr.clone(),
            detail,
        };
        let mut headers = http::HeaderMap::new();
        headers.insert(
            SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static(PLAIN_SUBPROTOCOL),
        );
        let path = vmi_path(ns, name, sub, query);
        let handshake = crate::wsclient::connect(tls, HANDLER_SERVER_NAME, &path, headers);
        match tokio::time::timeout(REQUEST_TIMEOUT, handshake).await {
            Err(_) => Err(unreachable(format!(
                "no websocket answer within {}s",
                REQUEST_TIMEOUT.as_secs()
            ))),
            Ok(Ok((ws, _))) => Ok(ws),
            Ok(Err(WsConnectError::Refused { status, body, .. })) => {
                Err(status_error(node, status.as_u16(), &body))
            }
            Ok(Err(e)) => Err(unreachable(format!("websocket: {e}"))),
        }
    }
}

/// The handler's path for a VMI subresource.
/// A handler's error answer: its Status passed through, anything else explained.
fn status_error(node: &str, code: u16, body: &[u8]) -> HandlerError {
    match serde_json::from_slice::<Status>(body) {
        Ok(status) if status.message.is_some() || status.reason.is_some() => HandlerError::Status {
            code,
            message: status.message.or(status.reason).unwrap_or_default(),
            body: Bytes::copy_from_slice(body),
        },
        _ => HandlerError::Unexpected {
            node: node.to_string(),
            code,
            body: String::from_utf8_lossy(&body[..body.len().min(512)])
                .trim()
                .to_string(),
        },
    }
}

/// The pod IP of the handler to use among the pods listed for one node: a running,
/// not terminating pod with an IP, ready ones first, then the newest (during a rollout
/// the old pod may still be listed).
pub fn pick_handler(pods: &[Pod]) -> Option<std::net::IpAddr> {
    let mut candidates: Vec<(bool, String, std::net::IpAddr)> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let status = p.status.as_ref()?;
            if status.phase.as_deref() != Some("Running") {
                return None;
            }
            let ip = status.pod_ip.as_deref()?.parse().ok()?;
            let ready = status
                .conditions
                .as_ref()
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            let created = p
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.to_string())
                .unwrap_or_default();
            Some((ready, created, ip))
        })
        .collect();
    candidates.sort();
    candidates.pop().map(|(_, _, ip)| ip)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;

    fn pod(name: &str, phase: &str, ip: Option<&str>, ready: bool, created: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "creationTimestamp": created},
            "status": {"phase": phase, "podIP": ip,
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
        }))
        .unwrap()
    }

    #[test]
    fn picks_running_ready_newest() {
        assert_eq!(pick_handler(&[]), None);
        let pending = pod("a", "Pending", None, false, "2026-01-01T00:00:00Z");
        assert_eq!(pick_handler(std::slice::from_ref(&pending)), None);
        let old = pod(
            "b",
            "Running",
            Some("10.0.0.1"),
            true,
            "2026-01-01T00:00:00Z",
        );
        let new_unready = pod(
            "c",
            "Running",
            Some("10.0.0.2"),
            false,
            "2026-01-02T00:00:00Z",
        );
        let new_ready = pod(
            "d",
            "Running",
            Some("fd00::3"),
            true,
            "2026-01-03T00:00:00Z",
        );
        assert_eq!(
            pick_handler(&[pending.clone(), old.clone(), new_unready.clone()]),
            Some("10.0.0.1".parse().unwrap())
        );
        assert_eq!(
            pick_handler(&[new_ready, old, new_unready]),
            Some("fd00::3".parse().unwrap())
        );
        let mut gone = pod(
            "e",
            "Running",
            Some("10.0.0.9"),
            true,
            "2026-01-09T00:00:00Z",
        );
        gone.metadata.deletion_timestamp = gone.metadata.creation_timestamp.clone();
        assert_eq!(pick_handler(&[gone]), None);
    }

    #[test]
    fn addresses() {
        let a = parse_addresses(&["node1=127.0.0.1:8186".into(), "n2=[::1]:1".into()]).unwrap();
        assert_eq!(a["node1"], "127.0.0.1:8186");
        assert_eq!(a["n2"], "[::1]:1");
        for bad in ["node1", "=h:1", "n=h", "n=:1", "n=h:x"] {
            assert!(parse_addresses(&[bad.into()]).is_err(), "{bad}");
        }
    }

    #[test]
    fn status_bodies_pass_through() {
        let st = br#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"VMI is not paused","reason":"Conflict","code":409}"#;
        match status_error("n", 409, st) {
            HandlerError::Status {
                code,
                message,
                body,
            } => {
                assert_eq!((code, message.as_str()), (409, "VMI is not paused"));
                assert_eq!(body.as_ref(), st, "passed on byte for byte");
            }
            other => panic!("{other:?}"),
        }
        let e = status_error("n1", 500, b"boom\n");
        assert_eq!(
            e.to_string(),
            "virt-handler on node \"n1\" answered 500: boom"
        );
    }

    #[test]
    fn tls_flags_go_together() {
        assert!(client_tls(&HandlerTlsFiles::default()).unwrap().is_none());
        let dir = tempfile::tempdir().unwrap();
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not pem").unwrap();
        let partial = HandlerTlsFiles {
            ca: Some(junk.clone()),
            ..Default::default()
        };
        assert!(matches!(
            client_tls(&partial),
            Err(HandlerConfigError::Partial)
        ));
        let bad = HandlerTlsFiles {
            ca: Some(junk.clone()),
            cert: Some(junk.clone()),
            key: Some(junk),
        };
        assert!(matches!(
            client_tls(&bad),
            Err(HandlerConfigError::Pem {
                what: "--handler-ca"
            })
        ));
    }
}
