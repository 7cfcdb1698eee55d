//! `console`: the guest's serial console over KubeVirt's websocket, with the
//! local terminal in raw mode and Ctrl+] to leave.

use std::io::{IsTerminal, Read};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use crate::connect::Session;
use crate::error::{CliError, Target};
use crate::request::validate_name;
use crate::ws::{self, UpgradeError};
use kubevirt_api::catalogue::{self, Subresource};

/// Ctrl+] (also what Ctrl+5 sends on most terminals), virtctl's escape.
pub const ESCAPE_BYTE: u8 = 0x1d;
/// Keeps NATs and load balancers from dropping an idle console.
const PING_INTERVAL: Duration = Duration::from_secs(10);
/// A peer that has answered nothing (not even a pong) for this long is gone.
const DEAD_PEER_AFTER: Duration = Duration::from_secs(90);
/// How often to retry while the VMI is not running yet (virtctl: 1 s).
const RETRY_INTERVAL: Duration = Duration::from_secs(1);

/// Splits input at the escape byte: the bytes to forward, and whether the
/// user asked to leave.
pub fn split_escape(chunk: &[u8]) -> (&[u8], bool) {
    match chunk.iter().position(|b| *b == ESCAPE_BYTE) {
        Some(i) => (&chunk[..i], true),
        None => (chunk, false),
    }
}

pub fn console_target(namespace: &str, name: &str, sub: &'static Subresource) -> Target {
    Target {
        kind: "VMI",
        group: crate::request::SUBRESOURCES_GROUP,
        resource: sub.kind.plural,
        subresource: Some(sub.name),
        verb: sub.rbac_verb(),
        action: if *sub == catalogue::VNC {
            "open VNC of"
        } else {
            "connect to the console of"
        },
        name: name.to_owned(),
        namespace: namespace.to_owned(),
    }
}

/// Connects to a streaming subresource of a VMI, waiting up to `timeout`
/// while the server answers 400 (VMI not running) or the VMI does not
/// exist yet although its VM is meant to run.
pub async fn connect_when_running(
    session: &Session,
    name: &str,
    sub: &'static Subresource,
    timeout: Duration,
) -> Result<ws::Stream, CliError> {
    validate_name("name", name)?;
    let path = sub.path(&session.namespace, name);
    let target = console_target(&session.namespace, name, sub);
    let deadline = Instant::now() + timeout;
    let mut announced = false;
    loop {
        let last = match ws::connect(session, &path, &target).await {
            Ok(s) => return Ok(s),
            Err(UpgradeError::Other(e)) => return Err(e),
            Err(UpgradeError::NotRunning(st)) => st.message,
            Err(UpgradeError::NotFound) => {
                // No VMI: only worth waiting for when a VM will create one.
                let vm = match crate::ops::get_vm(session, name).await {
                    Ok(vm) => vm,
                    Err(CliError::NotFound { .. }) => {
                        return Err(CliError::NotFound {
                            kind: "VMI",
                            name: name.to_owned(),
                            namespace: session.namespace.clone(),
                        });
                    }
                    Err(e) => return Err(e),
                };
                if vm.spec.effective_run_strategy() == kubevirt_api::RunStrategy::Halted {
                    return Err(CliError::NotRunning {
                        kind: "VM",
                        name: name.to_owned(),
                        namespace: session.namespace.clone(),
                        message: format!(
                            "it is stopped; start it with `kubectl virt start {name} -n {}`",
                            session.namespace
                        ),
                    });
                }
                "the VM's instance does not exist yet".to_owned()
            }
        };
        if Instant::now() + RETRY_INTERVAL > deadline {
            return Err(CliError::Timeout {
                minutes: timeout.as_secs() / 60,
                name: name.to_owned(),
                namespace: session.namespace.clone(),
                last,
            });
        }
        if !announced {
            eprintln!(
                "VMI {name} is not running yet ({}); waiting up to {} minute(s)...",
                last.trim(),
                timeout.as_secs().div_ceil(60)
            );
            announced = true;
        }
        tokio::time::sleep(RETRY_INTERVAL).await;
    }
}

/// Puts the terminal in raw mode for its lifetime. Dropping it restores the
/// terminal, so every return path (errors included) restores it.
#[derive(Debug)]
pub struct RawModeGuard {
    active: bool,
}

impl RawModeGuard {
    pub fn enable() -> Result<Self, CliError> {
        if !std::io::stdin().is_terminal() {
            return Ok(Self { active: false });
        }
        crossterm::terminal::enable_raw_mode()
            .map_err(|e| CliError::io("switching the terminal to raw mode", e))?;
        Ok(Self { active: true })
    }
}

impl Drop for RawModeGuard {
    fn drop(&mut self) {
        if self.active {
            let _ = crossterm::terminal::disable_raw_mode();
        }
    }
}

/// Restores the terminal before a panic message is printed; the release
/// profile aborts on panic, so Drop guards would not run.
pub fn install_panic_hook() {
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let _ = crossterm::terminal::disable_raw_mode();
        prev(info);
    }));
}

/// Reads stdin on a plain thread: a blocking read cannot be cancelled, and
/// a thread (unlike a tokio blocking task) does not keep the process alive.
fn spawn_stdin_reader() -> mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = mpsc::channel::<Vec<u8>>(16);
    std::thread::spawn(move || {
        let mut stdin = std::io::stdin().lock();
        let mut buf = [0u8; 4096];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if tx.blocking_send(buf[..n].to_vec()).is_err() {
                        break;
                    }
                }
            }
        }
    });
    rx
}

/// Why an interactive session ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    Escape,
    StdinClosed,
    ServerClosed,
    Signal,
}

/// `kubectl virt console NAME`.
pub async fn run(session: &Session, name: &str, timeout: Duration) -> Result<Ended, CliError> {
    let stream = connect_when_running(session, name, &catalogue::CONSOLE, timeout).await?;
    // The banner goes to stderr so that stdout carries guest output only
    // and can be piped or checksummed.
    eprintln!("Successfully connected to {name} console. The escape sequence is ^]");
    let guard = RawModeGuard::enable()?;
    let result = pump(stream, name).await;
    drop(guard);
    eprintln!();
    result
}

/// Timing of the keep-alive, separate so tests can shorten it.
#[derive(Clone, Copy, Debug)]
pub struct Keepalive {
    pub ping_interval: Duration,
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

async fn pump(stream: ws::Stream, name: &str) -> Result<Ended, CliError> {
    let mut signals = Signals::new()?;
    let mut stdout = tokio::io::stdout();
    bridge(
        stream,
        spawn_stdin_reader(),
        &mut stdout,
        Keepalive::default(),
        name,
        signals.recv(),
    )
    .await
}

/// Copies `input` to the websocket and binary messages to `out` until the
/// escape byte, end of input, a close from the server, or `stop`.
pub async fn bridge<S, W>(
    stream: WebSocketStream<S>,
    mut input: mpsc::Receiver<Vec<u8>>,
    out: &mut W,
    keepalive: Keepalive,
    name: &str,
    stop: impl std::future::Future<Output = ()>,
) -> Result<Ended, CliError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let (mut sink, mut source) = stream.split();
    let mut ping = tokio::time::interval(keepalive.ping_interval);
    ping.tick().await;
    let mut last_heard = Instant::now();
    let ws_err = |e: tokio_tungstenite::tungstenite::Error| CliError::WebSocket {
        what: format!("the console of {name}"),
        detail: e.to_string(),
    };
    let out_err = |e| CliError::io("writing to stdout", e);
    tokio::pin!(stop);

    let ended = loop {
        tokio::select! {
            msg = source.next() => {
                last_heard = Instant::now();
                match msg {
                    Some(Ok(Message::Binary(b))) => {
                        out.write_all(&b).await.map_err(out_err)?;
                        out.flush().await.map_err(out_err)?;
                    }
                    Some(Ok(Message::Close(frame))) => {
                        close_outcome(frame.as_ref()).map_err(|detail| CliError::WebSocket {
                            what: format!("the console of {name}"),
                            detail,
                        })?;
                        break Ended::ServerClosed;
                    }
                    None => break Ended::ServerClosed,
                    // Text frames carry nothing in KubeVirt's protocol;
                    // pings are answered by tungstenite itself.
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(ws_err(e)),
                }
            }
            chunk = input.recv() => {
                let Some(chunk) = chunk else { break Ended::StdinClosed };
                let (data, escape) = split_escape(&chunk);
                if !data.is_empty() {
                    sink.send(Message::Binary(data.to_vec().into())).await.map_err(ws_err)?;
                }
                if escape {
                    break Ended::Escape;
                }
            }
            _ = ping.tick() => {
                if last_heard.elapsed() > keepalive.dead_after {
                    return Err(CliError::WebSocket {
                        what: format!("the console of {name}"),
                        detail: format!("no answer from the server for {}s; connection lost", keepalive.dead_after.as_secs()),
                    });
                }
                sink.send(Message::Ping(Vec::new().into())).await.map_err(ws_err)?;
            }
            () = &mut stop => break Ended::Signal,
        }
    };
    // Best effort: the server learns the session ended cleanly.
    let _ = sink
        .send(Message::Close(Some(CloseFrame {
            code: CloseCode::Normal,
            reason: "".into(),
        })))
        .await;
    Ok(ended)
}

/// How a server's close frame ends the session: a normal close is a clean
/// end (its reason, e.g. another client taking the console over, is shown);
/// any other code is an error.
pub fn close_outcome(frame: Option<&CloseFrame>) -> Result<(), String> {
    let Some(frame) = frame else { return Ok(()) };
    let reason = frame.reason.as_str().trim();
    match frame.code {
        CloseCode::Normal | CloseCode::Away => {
            if !reason.is_empty() {
                eprintln!("\r\nconsole closed by the server: {reason}\r");
            }
            Ok(())
        }
        code => Err(format!(
            "closed by the server with code {}{}",
            u16::from(code),
            if reason.is_empty() {
                String::new()
            } else {
                format!(": {reason}")
            }
        )),
    }
}

/// SIGTERM/SIGHUP/SIGINT as one future, so the terminal is restored when
/// the plugin is killed or its terminal goes away.
struct Signals {
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> Result<Self, CliError> {
        use tokio::signal::unix::{SignalKind, signal};
        let reg = |k| signal(k).map_err(|e| CliError::io("installing signal handlers", e));
        Ok(Self {
            term: reg(SignalKind::terminate())?,
            hup: reg(SignalKind::hangup())?,
            int: reg(SignalKind::interrupt())?,
        })
    }

    async fn recv(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.hup.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn escape_splits_input() {
        assert_eq!(split_escape(b"ls\r"), (&b"ls\r"[..], false));
        assert_eq!(split_escape(b"ab\x1dcd"), (&b"ab"[..], true));
        assert_eq!(split_escape(b"\x1d"), (&b""[..], true));
    }

    use tokio_tungstenite::tungstenite::protocol::Role;

    async fn pair() -> (
        WebSocketStream<tokio::io::DuplexStream>,
        WebSocketStream<tokio::io::DuplexStream>,
    ) {
        let (a, b) = tokio::io::duplex(1 << 16);
        let client = WebSocketStream::from_raw_socket(a, Role::Client, None).await;
        let server = WebSocketStream::from_raw_socket(b, Role::Server, None).await;
        (client, server)
    }

    fn fast() -> Keepalive {
        Keepalive {
            ping_interval: Duration::from_millis(50),
            dead_after: Duration::from_millis(400),
        }
    }

    #[tokio::test]
    async fn idle_session_is_kept_alive_by_pings() {
        let (client, mut server) = pair().await;
        let (tx, rx) = mpsc::channel(4);
        let srv = tokio::spawn(async move {
            // Reading drives tungstenite's automatic pong replies.
            let mut pings = 0;
            while let Some(Ok(m)) = server.next().await {
                match m {
                    Message::Ping(_) => pings += 1,
                    Message::Binary(b) if b.as_ref() == b"bye" => break,
                    _ => {}
                }
            }
            pings
        });
        let mut out = Vec::new();
        let session = bridge(client, rx, &mut out, fast(), "t", std::future::pending());
        let driver = async {
            // Idle for several dead-peer periods: pongs must keep it open.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            tx.send(b"bye\x1d".to_vec()).await.unwrap();
        };
        let (ended, ()) = tokio::join!(session, driver);
        assert_eq!(ended.unwrap(), Ended::Escape);
        assert!(srv.await.unwrap() >= 10);
    }

    #[tokio::test]
    async fn silent_peer_is_detected() {
        let (client, server) = pair().await;
        // The server never reads, so it never answers pings.
        let _hold = server;
        let (_tx, rx) = mpsc::channel(4);
        let mut out = Vec::new();
        let err = bridge(client, rx, &mut out, fast(), "t", std::future::pending())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("connection lost"), "{err}");
    }

    #[tokio::test]
    async fn output_text_frames_and_stop() {
        let (client, mut server) = pair().await;
        let (_tx, rx) = mpsc::channel(4);
        server
            .send(Message::Binary(b"abc"[..].into()))
            .await
            .unwrap();
        server.send(Message::Text("ignored".into())).await.unwrap();
        server
            .send(Message::Binary(b"\x00\x1d\xff"[..].into()))
            .await
            .unwrap();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let mut out = Vec::new();
        let stop = async {
            let _ = stop_rx.await;
        };
        let session = bridge(client, rx, &mut out, Keepalive::default(), "t", stop);
        let driver = async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            stop_tx.send(()).unwrap();
        };
        let (ended, ()) = tokio::join!(session, driver);
        assert_eq!(ended.unwrap(), Ended::Signal);
        assert_eq!(out, b"abc\x00\x1d\xff");
    }

    #[test]
    fn close_frames() {
        assert!(close_outcome(None).is_ok());
        let normal = CloseFrame {
            code: CloseCode::Normal,
            reason: "".into(),
        };
        assert!(close_outcome(Some(&normal)).is_ok());
        let err = CloseFrame {
            code: CloseCode::Error,
            reason: "serial socket gone".into(),
        };
        assert_eq!(
            close_outcome(Some(&err)).unwrap_err(),
            "closed by the server with code 1011: serial socket gone"
        );
    }

    #[test]
    fn console_path() {
        assert_eq!(
            catalogue::CONSOLE.path("ns", "vm1"),
            "/apis/subresources.kubevirt.io/v1/namespaces/ns/virtualmachineinstances/vm1/console"
        );
        let t = console_target("ns", "vm1", &catalogue::CONSOLE);
        assert_eq!((t.verb, t.subresource), ("get", Some("console")));
    }
}
