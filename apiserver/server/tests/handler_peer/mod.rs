//! A stand-in for virt-handler's mTLS server (docs/cluster-flow.md §4), for tests only:
//! it records action PUTs and echoes console/vnc websocket messages. It requires a
//! client certificate from the given CA, like the real handler.
//!
//! Console commands from the client side: text `takeover` (or binary `~takeover~`)
//! closes the session with "another console session took over", as a second console
//! would. VMI `gone` answers actions with a 404 Status, VMI `busy` refuses streams
//! with a 409 Status.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path as UrlPath, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::put;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tower::ServiceExt;

/// What the peer saw.
#[derive(Debug, Default)]
pub struct Seen {
    /// `PUT ns/name/action`.
    pub calls: Mutex<Vec<String>>,
    /// Subprotocols offered on websocket requests, per request (`None`: none offered).
    pub offered: Mutex<Vec<Option<String>>>,
    /// Query strings of websocket requests.
    pub queries: Mutex<Vec<String>>,
    /// Pings received from virt-apiserver on websockets.
    pub pings: AtomicUsize,
    /// Bytes echoed.
    pub echoed: AtomicUsize,
    /// How sessions ended, seen from the peer (e.g. `client close 1000`).
    pub ends: Mutex<Vec<String>>,
    /// TLS handshakes that failed (e.g. no client certificate).
    pub tls_failures: AtomicUsize,
}

/// A running peer.
#[derive(Debug, Clone)]
pub struct Peer {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its observations.
    pub seen: Arc<Seen>,
}

fn status(code: u16, reason: &str, message: &str) -> Response {
    let body = serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code});
    (
        StatusCode::from_u16(code).unwrap(),
        [("content-type", "application/json")],
        body.to_string(),
    )
        .into_response()
}

async fn action(
    State(seen): State<Arc<Seen>>,
    UrlPath((ns, name, action)): UrlPath<(String, String, String)>,
) -> Response {
    seen.calls
        .lock()
        .unwrap()
        .push(format!("{ns}/{name}/{action}"));
    if name == "gone" {
        return status(
            404,
            "NotFound",
            &format!("virtualmachineinstances.kubevirt.io \"{name}\" not found on this node"),
        );
    }
    (StatusCode::OK, "{}").into_response()
}

async fn stream(
    State(seen): State<Arc<Seen>>,
    UrlPath((_ns, name, _sub)): UrlPath<(String, String, String)>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    ws: WebSocketUpgrade,
) -> Response {
    let offered = headers
        .get("sec-websocket-protocol")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    seen.offered.lock().unwrap().push(offered);
    seen.queries
        .lock()
        .unwrap()
        .push(uri.query().unwrap_or("").to_string());
    if name == "busy" {
        return status(409, "Conflict", "Active VNC connection");
    }
    ws.protocols(["plain.kubevirt.io"])
        .on_upgrade(move |socket| echo(socket, seen))
}

/// Closes like a console that another session took over, then reads the close reply.
async fn take_over(mut socket: WebSocket, seen: &Seen) {
    let _ = socket
        .send(Message::Close(Some(CloseFrame {
            code: 1000,
            reason: "another console session took over".into(),
        })))
        .await;
    while let Some(Ok(_)) = socket.recv().await {}
    seen.ends.lock().unwrap().push("peer closed".into());
}

async fn echo(mut socket: WebSocket, seen: Arc<Seen>) {
    while let Some(m) = socket.recv().await {
        match m {
            // Binary `~takeover~` does the same as text `takeover`, for clients that
            // send only binary (kubectl-virt).
            Ok(Message::Binary(b)) if b.as_ref() == b"~takeover~" => {
                return take_over(socket, &seen).await;
            }
            Ok(Message::Binary(b)) => {
                seen.echoed.fetch_add(b.len(), Ordering::Relaxed);
                if socket.send(Message::Binary(b)).await.is_err() {
                    seen.ends.lock().unwrap().push("send failed".into());
                    return;
                }
            }
            Ok(Message::Text(t)) if t.as_str() == "takeover" => {
                return take_over(socket, &seen).await;
            }
            Ok(Message::Ping(_)) => {
                seen.pings.fetch_add(1, Ordering::Relaxed);
            }
            Ok(Message::Close(f)) => {
                let code = f.map(|f| f.code).unwrap_or(1005);
                seen.ends
                    .lock()
                    .unwrap()
                    .push(format!("client close {code}"));
                return;
            }
            Ok(_) => {}
            Err(e) => {
                seen.ends.lock().unwrap().push(format!("error {e}"));
                return;
            }
        }
    }
    seen.ends.lock().unwrap().push("eof".into());
}

fn certs(path: &Path) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_file_iter(path)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Starts a peer serving `cert`/`key` and accepting client certificates of `client_ca`.
pub async fn start(cert: &Path, key: &Path, client_ca: &Path) -> Peer {
    let mut roots = rustls::RootCertStore::empty();
    for c in certs(client_ca) {
        roots.add(c).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs(cert), PrivateKeyDer::from_pem_file(key).unwrap())
        .unwrap();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    let seen = Arc::new(Seen::default());
    let router = Router::new()
        .route(
            "/v1/namespaces/{ns}/virtualmachineinstances/{name}/{sub}",
            put(action).get(stream),
        )
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let s = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, router, seen) = (acceptor.clone(), router.clone(), s.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    seen.tls_failures.fetch_add(1, Ordering::Relaxed);
                    return;
                };
                let svc = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        router.clone().oneshot(req.map(axum::body::Body::new))
                    },
                );
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection_with_upgrades(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    Peer { addr, seen }
}
