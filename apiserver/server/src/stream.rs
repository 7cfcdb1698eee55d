//! Console and VNC relay: the client's websocket (upgraded through axum) on one side,
//! virt-handler's websocket on the other.
//!
//! Messages are relayed one for one (KubeVirt's framing: one binary message per chunk,
//! no channel byte), so nothing is re-framed here. Unlike KubeVirt's raw TCP copy, each
//! hop has its own keep-alive: we ping both peers every 15 s, so idle consoles survive
//! load balancers and a peer that stops answering ends the session on both sides.
//! A close from either side is passed to the other with its code and reason (e.g.
//! "another console session took over").

use std::time::Duration;

use axum::extract::ws::{self, WebSocket};
use bytes::Bytes;
use futures::{Sink, SinkExt, Stream, StreamExt};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::{self as ts, protocol::frame::coding::CloseCode};
use tokio_util::sync::CancellationToken;

use crate::handler::HandlerStream;

/// Ping period on both hops.
pub const PING_INTERVAL: Duration = Duration::from_secs(15);
/// A peer that sent nothing (not even a pong) for this long is gone.
pub const DEAD_PEER_AFTER: Duration = Duration::from_secs(60);

/// A websocket message, independent of the two websocket libraries' types (axum
/// re-exports an older tungstenite than the one we dial with).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Frame {
    /// Binary data.
    Binary(Bytes),
    /// Text; KubeVirt's receivers ignore it, we pass it on unchanged.
    Text(String),
    /// Ping.
    Ping,
    /// Pong.
    Pong,
    /// Close with an optional code and reason.
    Close(Option<(u16, String)>),
}

/// Codes that may appear in a close frame on the wire (RFC 6455 §7.4); others
/// (1005 "no status", 1006 "abnormal", 1015 "TLS") describe, but are never sent.
fn sendable(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999)
}

fn close_payload(code: u16, reason: String) -> Option<(u16, String)> {
    sendable(code).then_some((code, reason))
}

fn from_axum(m: ws::Message) -> Frame {
    match m {
        ws::Message::Binary(b) => Frame::Binary(b),
        ws::Message::Text(t) => Frame::Text(t.as_str().to_string()),
        ws::Message::Ping(_) => Frame::Ping,
        ws::Message::Pong(_) => Frame::Pong,
        ws::Message::Close(f) => {
            Frame::Close(f.and_then(|f| close_payload(f.code, f.reason.as_str().to_string())))
        }
    }
}

fn to_axum(f: Frame) -> ws::Message {
    match f {
        Frame::Binary(b) => ws::Message::Binary(b),
        Frame::Text(t) => ws::Message::Text(t.into()),
        Frame::Ping => ws::Message::Ping(Bytes::new()),
        Frame::Pong => ws::Message::Pong(Bytes::new()),
        Frame::Close(c) => ws::Message::Close(c.map(|(code, reason)| ws::CloseFrame {
            code,
            reason: reason.into(),
        })),
    }
}

fn from_ts(m: ts::Message) -> Frame {
    match m {
        ts::Message::Binary(b) => Frame::Binary(b),
        ts::Message::Text(t) => Frame::Text(t.as_str().to_string()),
        ts::Message::Ping(_) => Frame::Ping,
        ts::Message::Pong(_) | ts::Message::Frame(_) => Frame::Pong,
        ts::Message::Close(f) => Frame::Close(
            f.and_then(|f| close_payload(u16::from(f.code), f.reason.as_str().to_string())),
        ),
    }
}

fn to_ts(f: Frame) -> ts::Message {
    match f {
        Frame::Binary(b) => ts::Message::Binary(b),
        Frame::Text(t) => ts::Message::Text(t.into()),
        Frame::Ping => ts::Message::Ping(Bytes::new()),
        Frame::Pong => ts::Message::Pong(Bytes::new()),
        Frame::Close(c) => ts::Message::Close(c.map(|(code, reason)| ts::protocol::CloseFrame {
            code: CloseCode::from(code),
            reason: reason.into(),
        })),
    }
}

/// Keep-alive timing; tests shorten it.
#[derive(Debug, Clone, Copy)]
pub struct Keepalive {
    /// Ping period.
    pub ping_interval: Duration,
    /// Silence after which a peer counts as gone.
    pub dead_after: Duration,
}

impl Default for Keepalive {
    fn default() -> Self {
        Self {
            ping_interval: PING_INTERVAL,
            dead_after: DEAD_PEER_AFTER,
        }
    }
}

/// Largest websocket message or frame a client may send (the library's default is 64 MiB):
/// console input, VNC client messages and port-forward chunks are far smaller, and
/// virt-handler refuses anything larger anyway. The relay holds one message per direction,
/// so a session costs this much at most whatever the client sends.
pub const MAX_CLIENT_MESSAGE: usize = 256 * 1024;

/// Whether a read failed on a message over the size limit. axum wraps its own tungstenite,
/// whose error type is not reachable from here: its text is what is left.
fn too_big(error: &str) -> bool {
    error.contains("Message too long") || error.contains("Space limit exceeded")
}

/// Relays between the client and the handler until either side closes, a peer stops
/// answering, or the server shuts down. `what` names the session in logs.
pub async fn relay(
    client: WebSocket,
    handler: HandlerStream,
    keepalive: Keepalive,
    shutdown: CancellationToken,
    what: String,
) {
    let (client_tx, client_rx) = client.split();
    let (handler_tx, handler_rx) = handler.split();
    let client_rx = client_rx.map(|m| m.map(from_axum).map_err(|e| e.to_string()));
    let handler_rx = handler_rx.map(|m| m.map(from_ts).map_err(|e| e.to_string()));
    let client_tx = client_tx.with(|f| futures::future::ready(Ok::<_, axum::Error>(to_axum(f))));
    let handler_tx = handler_tx.with(|f| futures::future::ready(Ok::<_, ts::Error>(to_ts(f))));
    // Whichever direction ends first tells the other how to close its peer.
    let (end_tx, end_rx) = watch::channel(None::<Option<(u16, String)>>);
    let up = one_way(
        client_rx,
        handler_tx,
        Side::Client,
        keepalive,
        end_tx.clone(),
        end_rx.clone(),
        shutdown.clone(),
    );
    let down = one_way(
        handler_rx,
        client_tx,
        Side::Handler,
        keepalive,
        end_tx,
        end_rx,
        shutdown,
    );
    tracing::info!(session = %what, "Stream opened");
    let (a, b) = tokio::join!(up, down);
    tracing::info!(session = %what, client = %a, handler = %b, "Stream closed");
}

/// The peer a direction reads from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Client,
    Handler,
}

impl Side {
    fn gone(self) -> &'static str {
        match self {
            Side::Client => "the client connection was lost",
            Side::Handler => "the connection to virt-handler was lost",
        }
    }
}

/// Copies `src` to `dst`, pings `dst`, and watches `src` for liveness. Returns how the
/// direction ended (for the log).
async fn one_way<S, K, E>(
    mut src: S,
    mut dst: K,
    side: Side,
    keepalive: Keepalive,
    end_tx: watch::Sender<Option<Option<(u16, String)>>>,
    mut end_rx: watch::Receiver<Option<Option<(u16, String)>>>,
    shutdown: CancellationToken,
) -> String
where
    S: Stream<Item = Result<Frame, String>> + Unpin,
    K: Sink<Frame, Error = E> + Unpin,
    E: std::fmt::Display,
{
    let mut ping = tokio::time::interval(keepalive.ping_interval);
    ping.tick().await;
    let mut last_heard = Instant::now();
    // The close to send to `dst`, and what to tell the other direction.
    let (close, outcome): (Option<(u16, String)>, String) = loop {
        tokio::select! {
            m = src.next() => {
                last_heard = Instant::now();
                match m {
                    Some(Ok(Frame::Close(c))) => {
                        let why = match &c {
                            Some((code, reason)) => format!("closed {code} {reason:?}"),
                            None => "closed".into(),
                        };
                        let _ = end_tx.send(Some(c.clone()));
                        break (c, why);
                    }
                    Some(Ok(f @ (Frame::Binary(_) | Frame::Text(_)))) => {
                        if let Err(e) = dst.send(f).await {
                            // dst is gone; the other direction notices on its read.
                            let _ = end_tx.send(Some(Some((1011, side_other(side).gone().into()))));
                            return format!("forwarding failed: {e}");
                        }
                    }
                    // Pings are answered by the websocket libraries themselves.
                    Some(Ok(Frame::Ping | Frame::Pong)) => {}
                    Some(Err(e)) => {
                        let c = Some(if side == Side::Client && too_big(&e) {
                            (1009, format!("message too big: at most {MAX_CLIENT_MESSAGE} bytes"))
                        } else {
                            (1011, side.gone().to_string())
                        });
                        let _ = end_tx.send(Some(c.clone()));
                        break (c, format!("read error: {e}"));
                    }
                    None => {
                        let c = Some((1011, side.gone().to_string()));
                        let _ = end_tx.send(Some(c.clone()));
                        break (c, "connection ended".into());
                    }
                }
            }
            _ = ping.tick() => {
                if last_heard.elapsed() > keepalive.dead_after {
                    let why = format!(
                        "{} did not answer for {}s",
                        match side { Side::Client => "the client", Side::Handler => "virt-handler" },
                        keepalive.dead_after.as_secs()
                    );
                    let c = Some((1011, why.clone()));
                    let _ = end_tx.send(Some(c.clone()));
                    break (c, why);
                }
                if let Err(e) = dst.send(Frame::Ping).await {
                    let _ = end_tx.send(Some(Some((1011, side_other(side).gone().into()))));
                    return format!("ping failed: {e}");
                }
            }
            changed = end_rx.changed() => {
                let c = match changed {
                    Ok(()) => end_rx.borrow_and_update().clone().flatten(),
                    Err(_) => None,
                };
                break (c, "other side ended".into());
            }
            () = shutdown.cancelled() => {
                break (Some((1001, "virt-apiserver is shutting down".into())), "shutdown".into());
            }
        }
    };
    // Best effort: dst may already have closed.
    let _ = dst.send(Frame::Close(close)).await;
    let _ = dst.close().await;
    outcome
}

fn side_other(side: Side) -> Side {
    match side {
        Side::Client => Side::Handler,
        Side::Handler => Side::Client,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn close_codes() {
        assert!(sendable(1000) && sendable(1011) && sendable(4000));
        assert!(!sendable(1005) && !sendable(1006) && !sendable(1015) && !sendable(999));
        let f = ts::Message::Close(Some(ts::protocol::CloseFrame {
            code: CloseCode::Normal,
            reason: "another console session took over".into(),
        }));
        let frame = from_ts(f);
        assert_eq!(
            frame,
            Frame::Close(Some((1000, "another console session took over".into())))
        );
        match to_axum(frame) {
            ws::Message::Close(Some(c)) => {
                assert_eq!(c.code, 1000);
                assert_eq!(c.reason.as_str(), "another console session took over");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            from_axum(ws::Message::Close(Some(ws::CloseFrame {
                code: 1005,
                reason: "".into()
            }))),
            Frame::Close(None)
        );
    }

    #[tokio::test]
    async fn relays_in_order_and_propagates_close() {
        let (src_tx, src_rx) = futures::channel::mpsc::unbounded::<Result<Frame, String>>();
        let (dst_tx, mut dst_rx) = futures::channel::mpsc::unbounded::<Frame>();
        let (end_tx, end_rx) = watch::channel(None);
        let mut watcher = end_rx.clone();
        for i in 0..3u8 {
            src_tx
                .unbounded_send(Ok(Frame::Binary(Bytes::from(vec![i]))))
                .unwrap();
        }
        src_tx
            .unbounded_send(Ok(Frame::Close(Some((1000, "bye".into())))))
            .unwrap();
        let outcome = one_way(
            src_rx,
            dst_tx,
            Side::Handler,
            Keepalive::default(),
            end_tx,
            end_rx,
            CancellationToken::new(),
        )
        .await;
        assert!(outcome.contains("bye"), "{outcome}");
        let got: Vec<Frame> = (&mut dst_rx).collect().await;
        assert_eq!(
            got,
            vec![
                Frame::Binary(Bytes::from_static(&[0])),
                Frame::Binary(Bytes::from_static(&[1])),
                Frame::Binary(Bytes::from_static(&[2])),
                Frame::Close(Some((1000, "bye".into()))),
            ]
        );
        assert_eq!(
            *watcher.borrow_and_update(),
            Some(Some((1000, "bye".to_string())))
        );
    }

    #[tokio::test]
    async fn silent_peer_is_closed() {
        let (_src_tx, src_rx) = futures::channel::mpsc::unbounded::<Result<Frame, String>>();
        let (dst_tx, dst_rx) = futures::channel::mpsc::unbounded::<Frame>();
        let (end_tx, end_rx) = watch::channel(None);
        let outcome = one_way(
            src_rx,
            dst_tx,
            Side::Client,
            Keepalive {
                ping_interval: Duration::from_millis(20),
                dead_after: Duration::from_millis(100),
            },
            end_tx,
            end_rx,
            CancellationToken::new(),
        )
        .await;
        assert!(outcome.contains("did not answer"), "{outcome}");
        let got: Vec<Frame> = dst_rx.collect().await;
        // At least the first tick pings (later ones may merge on a loaded machine).
        assert!(got.contains(&Frame::Ping), "{got:?}");
        assert!(matches!(got.last(), Some(Frame::Close(Some((1011, _))))));
    }
}
