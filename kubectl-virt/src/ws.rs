//! WebSocket upgrade for KubeVirt's streaming subresources (console, vnc, portforward).
//!
//! kube-rs' `Client::connect` insists on the Kubernetes channel
//! subprotocols, which KubeVirt does not speak; the upgrade is therefore done
//! here over the same authenticated client stack, offering
//! `plain.kubevirt.io`.

use http::header::{
    CONNECTION, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, SEC_WEBSOCKET_PROTOCOL,
    SEC_WEBSOCKET_VERSION, UPGRADE,
};
use http::{HeaderValue, Request, StatusCode};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use kube::core::Status;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::client::generate_key;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

use crate::connect::Session;
use crate::error::{CliError, Target, error_chain, from_kube, from_status};

/// Subprotocol of KubeVirt's console, VNC and port-forward streams.
pub use kubevirt_api::handler_protocol::PLAIN_SUBPROTOCOL;

pub type Stream = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;

/// Outcome of a failed upgrade that the caller may want to retry.
#[derive(Debug)]
pub enum UpgradeError {
    /// 400 from the server: the VMI exists but is not running (yet).
    NotRunning(Status),
    /// 404 for the object itself (not for the API group).
    NotFound,
    Other(CliError),
}

/// Headers of the upgrade request. Split out so the handshake is testable.
pub fn upgrade_request(path: &str, key: &str) -> Result<Request<Vec<u8>>, CliError> {
    let key = HeaderValue::from_str(key)
        .map_err(|e| CliError::Protocol(format!("websocket key: {e}")))?;
    Request::get(path)
        .header(CONNECTION, "Upgrade")
        .header(UPGRADE, "websocket")
        .header(SEC_WEBSOCKET_VERSION, "13")
        .header(SEC_WEBSOCKET_KEY, key)
        .header(SEC_WEBSOCKET_PROTOCOL, PLAIN_SUBPROTOCOL)
        .body(Vec::new())
        .map_err(|e| CliError::Protocol(format!("building request for {path}: {e}")))
}

/// Checks a 101 answer. A missing subprotocol is accepted because KubeVirt
/// servers before PR #1485 did not echo it.
pub fn check_handshake(headers: &http::HeaderMap, key: &str) -> Result<(), CliError> {
    let header = |name| {
        headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
    };
    let bad = |what: &str| CliError::WebSocket {
        what: "the API server".into(),
        detail: what.to_owned(),
    };
    if !header(UPGRADE).is_some_and(|v| v.eq_ignore_ascii_case("websocket")) {
        return Err(bad("upgrade header is not websocket"));
    }
    if header(SEC_WEBSOCKET_ACCEPT) != Some(derive_accept_key(key.as_bytes()).as_str()) {
        return Err(bad("Sec-WebSocket-Accept does not match the key"));
    }
    match header(SEC_WEBSOCKET_PROTOCOL) {
        None => Ok(()),
        Some(p) if p.trim() == PLAIN_SUBPROTOCOL => Ok(()),
        Some(p) => Err(bad(&format!(
            "server chose subprotocol {p:?}, expected {PLAIN_SUBPROTOCOL}"
        ))),
    }
}

/// Opens the websocket at `path`; `target` describes it for error messages.
pub async fn connect(
    session: &Session,
    path: &str,
    target: &Target,
) -> Result<Stream, UpgradeError> {
    let key = generate_key();
    let req = upgrade_request(path, &key).map_err(UpgradeError::Other)?;
    let res = session
        .client
        .send(req.map(kube::client::Body::from))
        .await
        .map_err(|e| UpgradeError::Other(from_kube(target, &session.server, e)))?;

    let status = res.status();
    if status.is_client_error() || status.is_server_error() {
        let code = status.as_u16();
        let bytes = res
            .into_body()
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        let st = parse_status(code, &bytes);
        return Err(match status {
            StatusCode::BAD_REQUEST => UpgradeError::NotRunning(st),
            StatusCode::NOT_FOUND => match from_status(target, &st) {
                CliError::NotFound { .. } => UpgradeError::NotFound,
                other => UpgradeError::Other(other),
            },
            _ => UpgradeError::Other(from_status(target, &st)),
        });
    }
    if status != StatusCode::SWITCHING_PROTOCOLS {
        return Err(UpgradeError::Other(CliError::WebSocket {
            what: path.to_owned(),
            detail: format!("expected 101 Switching Protocols, got {status}"),
        }));
    }
    check_handshake(res.headers(), &key).map_err(UpgradeError::Other)?;
    let upgraded = hyper::upgrade::on(res).await.map_err(|e| {
        UpgradeError::Other(CliError::WebSocket {
            what: path.to_owned(),
            detail: error_chain(&e),
        })
    })?;
    Ok(WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Client, None).await)
}

/// The Status in an error body, or a synthetic one for plain-text bodies
/// (proxies, kube-apiserver's "service unavailable").
pub fn parse_status(code: u16, body: &[u8]) -> Status {
    if let Ok(mut st) = serde_json::from_slice::<Status>(body) {
        if st.code == 0 {
            st.code = code;
        }
        return st;
    }
    let text = String::from_utf8_lossy(body);
    Status::failure(text.trim(), "").with_code(code)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn upgrade_request_offers_plain_subprotocol() {
        let r = upgrade_request(
            "/apis/subresources.kubevirt.io/v1/namespaces/d/virtualmachineinstances/v/console",
            "dGhlIHNhbXBsZSBub25jZQ==",
        )
        .unwrap();
        assert_eq!(r.method(), http::Method::GET);
        let h = r.headers();
        assert_eq!(h[SEC_WEBSOCKET_PROTOCOL], "plain.kubevirt.io");
        assert_eq!(h[UPGRADE], "websocket");
        assert_eq!(h[CONNECTION], "Upgrade");
        assert_eq!(h[SEC_WEBSOCKET_VERSION], "13");
    }

    #[test]
    fn handshake_checks() {
        let key = "dGhlIHNhbXBsZSBub25jZQ==";
        let mut h = http::HeaderMap::new();
        h.insert(UPGRADE, HeaderValue::from_static("websocket"));
        // RFC 6455's worked example.
        h.insert(
            SEC_WEBSOCKET_ACCEPT,
            HeaderValue::from_static("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="),
        );
        check_handshake(&h, key).unwrap();
        h.insert(
            SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static("plain.kubevirt.io"),
        );
        check_handshake(&h, key).unwrap();
        h.insert(
            SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static("v4.channel.k8s.io"),
        );
        assert!(check_handshake(&h, key).is_err());
        h.remove(SEC_WEBSOCKET_PROTOCOL);
        h.insert(SEC_WEBSOCKET_ACCEPT, HeaderValue::from_static("wrong"));
        assert!(check_handshake(&h, key).is_err());
    }

    #[test]
    fn status_bodies() {
        let st = parse_status(
            400,
            br#"{"kind":"Status","message":"VMI is not running","reason":"BadRequest","code":400}"#,
        );
        assert_eq!(st.code, 400);
        assert_eq!(st.message, "VMI is not running");
        let st = parse_status(503, b"service unavailable\n");
        assert_eq!(st.code, 503);
        assert_eq!(st.message, "service unavailable");
    }
}

/// What [`splice`] does when the local side stops sending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalEof {
    /// Close the websocket: the local peer is gone (a VNC viewer that quit).
    Close,
    /// Keep receiving until the remote side closes: the local peer may only be done
    /// sending (a request piped into `port-forward --stdio`); a websocket cannot
    /// half-close, so the remote learns of the end when this process closes it.
    Wait,
}

/// Copies bytes both ways between a local stream and a websocket of binary messages until
/// the remote closes, either side fails, or (with [`LocalEof::Close`]) the local side
/// ends. `what` names the stream in errors.
pub async fn splice<R, W>(
    ws: Stream,
    mut rd: R,
    mut wr: W,
    what: &str,
    on_eof: LocalEof,
) -> Result<(), CliError>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    use futures::{SinkExt, StreamExt};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
    let (mut sink, mut source) = ws.split();
    let ws_err = |e: tokio_tungstenite::tungstenite::Error| CliError::WebSocket {
        what: what.to_owned(),
        detail: e.to_string(),
    };
    let up = async {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            let n = rd
                .read(&mut buf)
                .await
                .map_err(|e| CliError::io(format!("reading the local end of {what}"), e))?;
            if n == 0 {
                if on_eof == LocalEof::Close {
                    let _ = sink.send(Message::Close(None)).await;
                }
                return Ok::<(), CliError>(());
            }
            sink.send(Message::Binary(buf[..n].to_vec().into()))
                .await
                .map_err(ws_err)?;
        }
    };
    let down = async {
        while let Some(msg) = source.next().await {
            match msg.map_err(ws_err)? {
                Message::Binary(b) => {
                    let local = |e| CliError::io(format!("writing the local end of {what}"), e);
                    wr.write_all(&b).await.map_err(local)?;
                    wr.flush().await.map_err(local)?;
                }
                // Anything but a normal close says why the stream ended (e.g. the VMI
                // migrated away: a new connection reaches it on its new node).
                Message::Close(Some(f)) if f.code != CloseCode::Normal && !f.reason.is_empty() => {
                    let _ = wr.shutdown().await;
                    return Err(CliError::WebSocket {
                        what: what.to_owned(),
                        detail: f.reason.to_string(),
                    });
                }
                Message::Close(_) => break,
                _ => {}
            }
        }
        let _ = wr.shutdown().await;
        Ok::<(), CliError>(())
    };
    tokio::pin!(up, down);
    tokio::select! {
        r = &mut up => match (r, on_eof) {
            (Err(e), _) => Err(e),
            (Ok(()), LocalEof::Close) => Ok(()),
            (Ok(()), LocalEof::Wait) => down.await,
        },
        r = &mut down => r,
    }
}
