//! CDI's upload proxy, served by virt-apiserver on a second TLS port (`--upload-proxy-bind`,
//! Service `cdi-uploadproxy`): `virtctl image-upload` sends the image here with the token of
//! an UploadTokenRequest, and the proxy streams it to the claim's upload server pod
//! (`virt-importer upload-server`), byte for byte, never holding the image.
//!
//! Why here and not in a binary of its own (docs/architecture.md, DataVolumes): the token's
//! key never leaves the process that signs it, the serving certificate is virt-apiserver's
//! (issued by virt-operator from the API CA and reloaded when rotated), and virt-apiserver
//! already relays long streams (consoles, VNC, port-forward) outside its request limits.
//!
//! The decisions ([`bearer`], [`target`]) are pure; [`router`] reads the claim and its pod
//! and forwards.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::{HeaderValue, Method, StatusCode, header};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::ResourceExt;
use kubevirt_api::cdi::annotations as ann;
use kubevirt_api::cdi::upload::{TokenClaims, TokenKey};

/// The paths CDI's proxy serves (raw and multipart, each sync and async).
pub const PATHS: [&str; 4] = [
    "/v1beta1/upload",
    "/v1beta1/upload-async",
    "/v1beta1/upload-form",
    "/v1beta1/upload-form-async",
];

/// The upload server's port when its pod names none.
const DEFAULT_SERVER_PORT: u16 = 8080;
/// How long an upload waits for its server to become ready (CDI's proxy: 10 s).
const READY_WAIT: Duration = Duration::from_secs(10);

/// What the proxy needs.
#[derive(Clone)]
pub struct ProxyState {
    /// Verifies tokens (the key UploadTokenRequests are signed with).
    pub key: TokenKey,
    /// Reads claims and pods; without it nothing can be forwarded.
    pub kube: Option<kube::Client>,
    client: Client<HttpConnector, Body>,
}

impl std::fmt::Debug for ProxyState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyState").finish_non_exhaustive()
    }
}

impl ProxyState {
    pub fn new(key: TokenKey, kube: Option<kube::Client>) -> Self {
        ProxyState {
            key,
            kube,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }
}

/// A refusal: status and a message naming what to fix (the body virtctl prints).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: StatusCode,
    pub message: String,
    /// Seconds to wait before trying again (a server not ready yet).
    pub retry_after: Option<u32>,
}

impl Refusal {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Refusal {
            status,
            message: message.into(),
            retry_after: None,
        }
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let mut r = (self.status, self.message).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

/// The token of an `Authorization: Bearer TOKEN` header (400 without one, as CDI).
pub fn bearer(value: Option<&HeaderValue>) -> Result<&str, Refusal> {
    let missing = || {
        Refusal::new(
            StatusCode::BAD_REQUEST,
            "no upload token: send `Authorization: Bearer TOKEN` with the token of an \
             UploadTokenRequest (virtctl image-upload does)",
        )
    };
    let v = value.and_then(|v| v.to_str().ok()).ok_or_else(missing)?;
    let (scheme, token) = v
        .trim()
        .split_once(char::is_whitespace)
        .ok_or_else(missing)?;
    let token = token.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || token.is_empty() {
        return Err(missing());
    }
    Ok(token)
}

/// Checks a token: 401 when it is not ours or expired.
pub fn verify(key: &TokenKey, token: &str, now: i64) -> Result<TokenClaims, Refusal> {
    key.verify(token, now)
        .map_err(|e| Refusal::new(StatusCode::UNAUTHORIZED, e.to_string()))
}

/// Where the upload for `claims` goes, given its claim and the claim's upload server pod as
/// read now: the pod's address, or why not (and whether waiting may help: 503).
pub fn target(
    claims: &TokenClaims,
    pvc: Option<&PersistentVolumeClaim>,
    pod: Option<&Pod>,
) -> Result<SocketAddr, Refusal> {
    let name = format!("{}/{}", claims.namespace, claims.pvc);
    let Some(pvc) = pvc else {
        return Err(Refusal::new(
            StatusCode::NOT_FOUND,
            format!(
                "PersistentVolumeClaim {name} not found: the token was issued for a claim that is gone"
            ),
        ));
    };
    let a = pvc.annotations();
    if !a.contains_key(ann::UPLOAD_TARGET) {
        return Err(Refusal::new(
            StatusCode::FORBIDDEN,
            format!(
                "PersistentVolumeClaim {name} does not take uploads (no {} annotation)",
                ann::UPLOAD_TARGET
            ),
        ));
    }
    if a.get(ann::POD_PHASE).map(String::as_str) == Some("Succeeded") {
        return Err(Refusal::new(
            StatusCode::CONFLICT,
            format!(
                "PersistentVolumeClaim {name} already holds a completed upload: delete the \
                 DataVolume (or claim) and create it again to upload another image"
            ),
        ));
    }
    let not_ready = |why: String| Refusal {
        status: StatusCode::SERVICE_UNAVAILABLE,
        message: format!("the upload server of PersistentVolumeClaim {name} is not ready: {why}"),
        retry_after: Some(2),
    };
    let Some(pod) = pod else {
        return Err(not_ready(match a.get(ann::UPLOAD_POD) {
            Some(p) => format!("its pod {p} does not exist yet"),
            None => "none was created yet (is virt-controller running?)".into(),
        }));
    };
    let status = pod.status.clone().unwrap_or_default();
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let ip = status
        .pod_ip
        .as_deref()
        .and_then(|ip| ip.parse::<IpAddr>().ok());
    let (true, Some(ip)) = (ready, ip) else {
        return Err(not_ready(format!(
            "pod {} is {}",
            pod.name_any(),
            status.phase.as_deref().unwrap_or("Pending")
        )));
    };
    let port = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some("upload"))
        .and_then(|p| u16::try_from(p.container_port).ok())
        .unwrap_or(DEFAULT_SERVER_PORT);
    Ok(SocketAddr::new(ip, port))
}

/// The proxy's routes: the CDI paths (POST and PUT forwarded; HEAD answered here, which is
/// how virtctl learns the async path exists) and `/healthz`.
pub fn router(state: Arc<ProxyState>) -> Router {
    let mut r = Router::new().route("/healthz", get(|| async { "ok" }));
    for p in PATHS {
        r = r.route(p, post(upload).put(upload).head(upload));
    }
    r.with_state(state)
}

async fn upload(State(st): State<Arc<ProxyState>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let mut body = Some(body);
    match forward(&st, parts, &mut body).await {
        Ok(r) => r,
        Err(refusal) => {
            tracing::info!(status = %refusal.status, message = %refusal.message, "upload refused");
            if let Some(body) = body {
                drain(body).await;
            }
            refusal.into_response()
        }
    }
}

/// How much of a refused upload's body is read and dropped before the answer.
const DRAIN_LIMIT: usize = 64 << 20;
/// How long a refused upload's body is read before the answer.
const DRAIN_WAIT: Duration = Duration::from_secs(5);

/// Reads a refused request's body, bounded, before the refusal is sent. A client writes its
/// whole body before it reads an answer; closing on unread bytes resets the connection and
/// the client reports a broken pipe instead of the refusal's message (Go's net/http drains
/// for the same reason). A body beyond the bounds still gets the reset.
async fn drain(body: Body) {
    use futures::StreamExt;
    let mut stream = body.into_data_stream();
    let mut read = 0usize;
    let _ = tokio::time::timeout(DRAIN_WAIT, async {
        while let Some(Ok(chunk)) = stream.next().await {
            read += chunk.len();
            if read > DRAIN_LIMIT {
                break;
            }
        }
    })
    .await;
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Forwards the upload, taking `body` only once the upload server is known; a refusal before
/// that leaves it for [`drain`].
async fn forward(
    st: &ProxyState,
    parts: http::request::Parts,
    body: &mut Option<Body>,
) -> Result<Response, Refusal> {
    let token = bearer(parts.headers.get(header::AUTHORIZATION))?;
    let claims = verify(&st.key, token, now())?;
    if parts.method == Method::HEAD {
        return Ok(StatusCode::OK.into_response());
    }
    let Some(kube) = &st.kube else {
        return Err(Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the upload proxy has no access to kube-apiserver (virt-apiserver runs --standalone)",
        ));
    };
    let addr = wait_for_server(kube, &claims).await?;
    let body = body.take().unwrap_or_default();
    let path = parts.uri.path().to_string();
    let uri: http::Uri = format!("http://{addr}{path}").parse().map_err(|e| {
        Refusal::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("upload server address {addr}: {e}"),
        )
    })?;
    let mut out = http::Request::builder().method(parts.method).uri(uri);
    // The length and type travel on (the server checks a raw image's size against the
    // claim before taking it); the token stays here.
    for h in [header::CONTENT_LENGTH, header::CONTENT_TYPE] {
        if let Some(v) = parts.headers.get(&h) {
            out = out.header(h, v.clone());
        }
    }
    let out = out
        .body(body)
        .map_err(|e| Refusal::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    tracing::info!(namespace = %claims.namespace, pvc = %claims.pvc, %addr, %path, "forwarding an upload");
    let resp = st.client.request(out).await.map_err(|e| {
        Refusal::new(
            StatusCode::BAD_GATEWAY,
            format!(
                "the upload server of PersistentVolumeClaim {}/{} at {addr}: {e}",
                claims.namespace, claims.pvc
            ),
        )
    })?;
    tracing::info!(namespace = %claims.namespace, pvc = %claims.pvc, status = %resp.status(), "upload answered");
    Ok(resp.map(Body::new))
}

/// Reads the claim and its server pod until the server is ready, at most [`READY_WAIT`].
async fn wait_for_server(kube: &kube::Client, claims: &TokenClaims) -> Result<SocketAddr, Refusal> {
    let pvcs: kube::Api<PersistentVolumeClaim> =
        kube::Api::namespaced(kube.clone(), &claims.namespace);
    let pods: kube::Api<Pod> = kube::Api::namespaced(kube.clone(), &claims.namespace);
    let read_error = |what: &str, e: kube::Error| {
        Refusal::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("reading {what} {}/{}: {e}", claims.namespace, claims.pvc),
        )
    };
    let deadline = tokio::time::Instant::now() + READY_WAIT;
    loop {
        let pvc = pvcs
            .get_opt(&claims.pvc)
            .await
            .map_err(|e| read_error("PersistentVolumeClaim", e))?;
        let pod_name = pvc
            .as_ref()
            .and_then(|p| p.annotations().get(ann::UPLOAD_POD).cloned());
        let pod = match &pod_name {
            Some(n) => pods
                .get_opt(n)
                .await
                .map_err(|e| read_error("the upload server pod of", e))?,
            None => None,
        };
        match target(claims, pvc.as_ref(), pod.as_ref()) {
            Err(r) if r.retry_after.is_some() && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn claims() -> TokenClaims {
        TokenClaims {
            namespace: "ns".into(),
            pvc: "disk".into(),
            issued: 0,
            expires: 300,
        }
    }

    fn pvc(annotations: serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(json!({"metadata": {"name": "disk", "namespace": "ns",
            "annotations": annotations}}))
        .unwrap()
    }

    fn pod(ready: bool, ip: Option<&str>, port: Option<i32>) -> Pod {
        let ports = port.map(|p| json!([{"name": "upload", "containerPort": p}]));
        serde_json::from_value(json!({
            "metadata": {"name": "cdi-upload-disk", "namespace": "ns"},
            "spec": {"containers": [{"name": "cdi-upload-server", "ports": ports}]},
            "status": {"phase": "Running", "podIP": ip,
                "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}
        }))
        .unwrap()
    }

    #[test]
    fn the_bearer_token_is_required() {
        let h = |s: &str| HeaderValue::from_str(s).unwrap();
        assert_eq!(bearer(Some(&h("Bearer abc.def"))).unwrap(), "abc.def");
        assert_eq!(bearer(Some(&h("bearer   abc"))).unwrap(), "abc");
        for bad in ["", "Bearer", "Basic abc", "Bearer  "] {
            assert_eq!(
                bearer(Some(&h(bad))).unwrap_err().status,
                StatusCode::BAD_REQUEST,
                "{bad:?}"
            );
        }
        assert_eq!(bearer(None).unwrap_err().status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn a_bad_or_expired_token_is_401() {
        let key = TokenKey::new(b"k");
        let t = key.sign("ns", "disk", 0);
        assert_eq!(verify(&key, &t, 10).unwrap().pvc, "disk");
        let r = verify(&key, &t, 301).unwrap_err();
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
        assert!(r.message.contains("expired"), "{}", r.message);
        let other = TokenKey::new(b"other");
        assert_eq!(
            verify(&other, &t, 10).unwrap_err().status,
            StatusCode::UNAUTHORIZED
        );
    }

    #[test]
    fn the_claim_and_its_server_decide_where_the_bytes_go() {
        let target_ok = pvc(json!({ann::UPLOAD_TARGET: "", ann::UPLOAD_POD: "cdi-upload-disk"}));
        let ready = pod(true, Some("10.0.0.7"), Some(8080));
        assert_eq!(
            target(&claims(), Some(&target_ok), Some(&ready)).unwrap(),
            "10.0.0.7:8080".parse().unwrap()
        );
        // A test's server on another port: the pod's port is used.
        let elsewhere = pod(true, Some("127.0.0.1"), Some(41234));
        assert_eq!(
            target(&claims(), Some(&target_ok), Some(&elsewhere)).unwrap(),
            "127.0.0.1:41234".parse().unwrap()
        );
        assert_eq!(
            target(&claims(), None, None).unwrap_err().status,
            StatusCode::NOT_FOUND
        );
        // Another claim, one that does not take uploads: forbidden.
        let plain = pvc(json!({}));
        let r = target(&claims(), Some(&plain), Some(&ready)).unwrap_err();
        assert_eq!(r.status, StatusCode::FORBIDDEN);
        assert!(r.message.contains("ns/disk"), "{}", r.message);
        let done = pvc(json!({ann::UPLOAD_TARGET: "", ann::POD_PHASE: "Succeeded"}));
        assert_eq!(
            target(&claims(), Some(&done), None).unwrap_err().status,
            StatusCode::CONFLICT
        );
        for (p, what) in [
            (None, "does not exist yet"),
            (Some(pod(false, Some("10.0.0.7"), None)), "is Running"),
            (Some(pod(true, None, None)), "is Running"),
        ] {
            let r = target(&claims(), Some(&target_ok), p.as_ref()).unwrap_err();
            assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(r.retry_after, Some(2));
            assert!(r.message.contains(what), "{}", r.message);
        }
    }
}
