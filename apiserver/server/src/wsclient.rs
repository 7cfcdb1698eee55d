//! The client side of a websocket handshake that keeps a refusal's whole answer.
//!
//! tungstenite's own client handshake returns, for a non-101 answer, only the body bytes that
//! happened to arrive with the headers: a `metav1.Status` in a later TCP segment was lost, so a
//! user saw "429" or "403" without the message saying why (a CI run on 2026-12-07 saw a 429
//! with an empty body). Here hyper reads the answer as HTTP, so a refusal comes with its body
//! (capped), and only a 101 is handed to tungstenite as an upgraded connection.

use bytes::Bytes;
use http::header::{
    CONNECTION, HOST, SEC_WEBSOCKET_ACCEPT, SEC_WEBSOCKET_KEY, SEC_WEBSOCKET_VERSION, UPGRADE,
};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::client::generate_key;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

/// An open client websocket.
pub type WsClient = WebSocketStream<TokioIo<Upgraded>>;

/// Largest refusal body kept; a Status is a few hundred bytes.
pub const MAX_REFUSAL_BODY: usize = 64 * 1024;

/// Why a websocket did not open.
#[derive(Debug, thiserror::Error)]
pub enum WsConnectError {
    /// The server answered without upgrading: its status, headers and body.
    #[error("HTTP {status} instead of a websocket")]
    Refused {
        status: StatusCode,
        headers: Box<HeaderMap>,
        body: Bytes,
    },
    /// The server upgraded but not as RFC 6455 asks (a wrong `Sec-WebSocket-Accept`).
    #[error("not a websocket answer: {0}")]
    Protocol(String),
    /// The connection failed or the request could not be made.
    #[error("{0}")]
    Transport(String),
}

/// Sends a websocket upgrade for `path_and_query` to `authority` over `io` (already connected,
/// TLS done), with `headers` added (authorization, `Sec-WebSocket-Protocol`, ...). The answer's
/// head comes back with the stream so callers can read the chosen subprotocol.
pub async fn connect<IO>(
    io: IO,
    authority: &str,
    path_and_query: &str,
    headers: HeaderMap,
) -> Result<(WsClient, Response<()>), WsConnectError>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let transport = |e: &dyn std::fmt::Display| WsConnectError::Transport(e.to_string());
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| transport(&e))?;
    // The connection task ends when the websocket is dropped (or the refusal is read).
    tokio::spawn(async move {
        let _ = conn.with_upgrades().await;
    });

    let key = generate_key();
    let mut req = Request::get(path_and_query)
        .body(Empty::<Bytes>::new())
        .map_err(|e| transport(&e))?;
    let h = req.headers_mut();
    h.insert(
        HOST,
        HeaderValue::from_str(authority).map_err(|e| transport(&e))?,
    );
    h.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(SEC_WEBSOCKET_VERSION, HeaderValue::from_static("13"));
    h.insert(
        SEC_WEBSOCKET_KEY,
        HeaderValue::from_str(&key).map_err(|e| transport(&e))?,
    );
    for (name, value) in headers.iter() {
        h.insert(name.clone(), value.clone());
    }

    let res = sender.send_request(req).await.map_err(|e| transport(&e))?;
    if res.status() != StatusCode::SWITCHING_PROTOCOLS {
        let (parts, body) = res.into_parts();
        // A body longer than the cap, or cut short, still leaves the status to report.
        let body = Limited::new(body, MAX_REFUSAL_BODY)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        return Err(WsConnectError::Refused {
            status: parts.status,
            headers: Box::new(parts.headers),
            body,
        });
    }
    let expected = derive_accept_key(key.as_bytes());
    let accept = res.headers().get(SEC_WEBSOCKET_ACCEPT);
    if accept.map(HeaderValue::as_bytes) != Some(expected.as_bytes()) {
        return Err(WsConnectError::Protocol(format!(
            "Sec-WebSocket-Accept {accept:?}, expected {expected}"
        )));
    }
    let head = {
        let mut r = Response::new(());
        *r.status_mut() = res.status();
        *r.headers_mut() = res.headers().clone();
        r
    };
    let upgraded = hyper::upgrade::on(res).await.map_err(|e| transport(&e))?;
    let ws = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Client, None).await;
    Ok((ws, head))
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::{SinkExt, StreamExt};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_tungstenite::tungstenite::Message;

    /// A server that writes the head of a refusal, waits, then the body: the case
    /// tungstenite's handshake answered with an empty body.
    #[tokio::test]
    async fn a_refusal_whose_body_arrives_later_keeps_its_body() {
        let (client, mut server) = tokio::io::duplex(4096);
        let srv = tokio::spawn(async move {
            let mut buf = [0u8; 2048];
            let _ = server.read(&mut buf).await.unwrap();
            let body = br#"{"kind":"Status","code":429,"message":"Too many streams"}"#;
            let head = format!(
                "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            server.write_all(head.as_bytes()).await.unwrap();
            server.flush().await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            server.write_all(body).await.unwrap();
            server.flush().await.unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        });
        let Err(err) = connect(client, "example", "/x", HeaderMap::new()).await else {
            panic!("upgraded");
        };
        match err {
            WsConnectError::Refused { status, body, .. } => {
                assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
                assert!(
                    String::from_utf8_lossy(&body).contains("Too many streams"),
                    "{body:?}"
                );
            }
            e => panic!("{e}"),
        }
        srv.await.unwrap();
    }

    /// A real websocket server (tungstenite's accept) upgrades, echoes, and its chosen
    /// subprotocol is visible in the answer's head.
    #[tokio::test]
    async fn an_upgrade_carries_messages_and_the_chosen_subprotocol() {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let srv = tokio::spawn(async move {
            let cb = |req: &tokio_tungstenite::tungstenite::handshake::server::Request,
                      mut res: tokio_tungstenite::tungstenite::handshake::server::Response| {
                assert_eq!(
                    req.headers().get("authorization").unwrap(),
                    "Bearer t0ken"
                );
                res.headers_mut().insert(
                    "sec-websocket-protocol",
                    HeaderValue::from_static("plain.kubevirt.io"),
                );
                Ok(res)
            };
            let mut ws = tokio_tungstenite::accept_hdr_async(server, cb)
                .await
                .unwrap();
            while let Some(Ok(m)) = ws.next().await {
                if m.is_binary() {
                    ws.send(m).await.unwrap();
                }
            }
        });
        let mut headers = HeaderMap::new();
        headers.insert("authorization", HeaderValue::from_static("Bearer t0ken"));
        headers.insert(
            "sec-websocket-protocol",
            HeaderValue::from_static("plain.kubevirt.io"),
        );
        let (mut ws, head) = connect(client, "example", "/console", headers)
            .await
            .unwrap();
        assert_eq!(
            head.headers().get("sec-websocket-protocol").unwrap(),
            "plain.kubevirt.io"
        );
        ws.send(Message::binary(b"hello".to_vec())).await.unwrap();
        let echo = ws.next().await.unwrap().unwrap();
        assert_eq!(echo.into_data().as_ref(), b"hello");
        drop(ws);
        srv.await.unwrap();
    }
}
