//! The HTTPS server on :8186 (cluster-flow.md §4): mutual TLS (only clients whose
//! certificate chains to the configured CA get past the handshake, and only virt-apiserver's
//! certificate gets an answer other than 403), KubeVirt's paths for the VMI actions of the
//! API catalogue (pause, unpause, softreboot, reset, …), and the console/VNC websockets.
//!
//! Console: one connection to QEMU's console socket per VMI, shared by every session
//! (QEMU serves one client at a time). Its output goes to all sessions; input is taken
//! from the single writer. A new writer takes over and the earlier one is closed with a
//! reason; `?readOnly=true` sessions only watch. VNC: one session per VMI, a new one
//! takes over (KubeVirt's behaviour).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use axum::{Json, Router};
use bytes::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kubevirt_api::catalogue::{self, VmiActionDef};
use kubevirt_api::handler_protocol::{
    ForwardProtocol, ForwardTarget, PLAIN_SUBPROTOCOL, ROUTE_CONSOLE, ROUTE_PORTFORWARD,
    ROUTE_SUBRESOURCE, ROUTE_VNC, route,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::net::unix::OwnedWriteHalf;
use tokio::sync::{broadcast, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;
use virt_certs::node_identity::APISERVER_CLIENT_NAME;
use virt_domain::protocol::{DomainState, Request, Response as LauncherResponse};

use crate::client::LauncherClient;
use crate::metrics::Metrics;
use crate::tls::{TlsSource, peer_name};
use crate::vmis::{Paths, Registry};

/// Close reason sent to a console or VNC session another writer took over from.
pub const TAKEN_OVER: &str = "another session took over this console";
const CHUNK: usize = 10240;
/// Read size of a forwarded guest connection: each read becomes one websocket message on
/// every hop to the client, so bulk transfers want few, large ones.
const FORWARD_CHUNK: usize = 64 * 1024;

/// What the HTTP handlers need.
#[derive(Clone, Debug)]
pub struct AppState {
    registry: Registry,
    vmis: crate::network::KnownVmis,
    paths: Paths,
    ping_every: Duration,
    consoles: Arc<tokio::sync::Mutex<HashMap<String, Weak<ConsoleHub>>>>,
    vnc: Arc<Mutex<HashMap<String, (u64, CancellationToken)>>>,
    ids: Arc<AtomicU64>,
    metrics: Arc<Metrics>,
}

impl AppState {
    /// State for the VMIs in `registry`, with sockets under `paths`; websockets are
    /// pinged every `ping_every` and closed when a ping goes unanswered until the next.
    pub fn new(
        registry: Registry,
        vmis: crate::network::KnownVmis,
        paths: Paths,
        ping_every: Duration,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            metrics,
            registry,
            vmis,
            paths,
            ping_every,
            consoles: Arc::default(),
            vnc: Arc::default(),
            ids: Arc::default(),
        }
    }
}

/// The routes.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route(&route(ROUTE_SUBRESOURCE), put(action).get(read))
        .route(&route(ROUTE_CONSOLE), get(console))
        .route(&route(ROUTE_VNC), get(vnc))
        .route(&route(ROUTE_PORTFORWARD), get(portforward))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(state)
}

/// Accepts TLS connections until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    tls: TlsSource,
    router: Router,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    loop {
        let (tcp, remote): (_, SocketAddr) = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = TlsAcceptor::from(tls.get());
        let (router, shutdown) = (router.clone(), shutdown.clone());
        tokio::spawn(async move {
            let tls =
                match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        // Clients without a certificate of our CA end here.
                        tracing::info!(%remote, error = %e, "TLS handshake refused");
                        return;
                    }
                    Err(_) => return,
                };
            // The CA also signs every handler's certificate: only virt-apiserver's name may
            // drive consoles, VNC, port-forwards and lifecycle calls here.
            let client = peer_name(tls.get_ref().1);
            let refusal = (client.as_deref() != Some(APISERVER_CLIENT_NAME)).then(|| {
                tracing::warn!(%remote, client = client.as_deref().unwrap_or("?"), "client certificate is not virt-apiserver's: refused");
                format!(
                    "client certificate {:?} is not virt-apiserver's ({APISERVER_CLIENT_NAME:?}); \
                     this server answers only virt-apiserver",
                    client.unwrap_or_default()
                )
            });
            let svc =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let refusal = refusal.clone();
                    let router = router.clone();
                    async move {
                        match refusal {
                            Some(message) => {
                                Ok(status(StatusCode::FORBIDDEN, "Forbidden", message))
                            }
                            None => router.oneshot(req.map(axum::body::Body::new)).await,
                        }
                    }
                });
            let builder = Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), svc);
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => if let Err(e) = r {
                    tracing::debug!(%remote, error = %e, "connection ended");
                },
                _ = shutdown.cancelled() => conn.as_mut().graceful_shutdown(),
            }
        });
    }
}

fn status(code: StatusCode, reason: &str, message: String) -> Response {
    let body = Status {
        code: Some(i32::from(code.as_u16())),
        message: Some(message),
        reason: Some(reason.to_string()),
        status: Some("Failure".into()),
        ..Status::default()
    };
    // k8s-openapi leaves out apiVersion/kind for Status; clients decode by them.
    let mut v = serde_json::to_value(&body).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("kind".into(), "Status".into());
        o.insert("apiVersion".into(), "v1".into());
        o.entry("metadata").or_insert_with(|| serde_json::json!({}));
    }
    (code, Json(v)).into_response()
}

fn not_found(ns: &str, name: &str) -> Response {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("virtualmachineinstance {ns}/{name} is not running on this node"),
    )
}

fn conflict(message: String) -> Response {
    status(StatusCode::CONFLICT, "Conflict", message)
}

async fn action(
    State(st): State<AppState>,
    UrlPath((ns, name, action)): UrlPath<(String, String, String)>,
    body: Bytes,
) -> Response {
    let metrics = st.metrics.clone();
    let def = catalogue::vmi_action_named(&action);
    let r = match def {
        Some(def) => do_action(st, ns, name, def, &body).await,
        None => status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("unknown action {action:?}"),
        ),
    };
    metrics.request(
        def.map_or("unknown", |d| d.subresource.name),
        r.status().as_u16(),
    );
    r
}

/// Any VMI action of the API catalogue: its options from the body virt-apiserver passed on,
/// its paused rule checked against the domain, then the launcher carries it out.
async fn do_action(
    st: AppState,
    ns: String,
    name: String,
    def: &'static VmiActionDef,
    body: &[u8],
) -> Response {
    let action = match (def.decode)(body) {
        Ok((action, _dry_run)) => action,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
    };
    let Some(uid) = st.registry.uid(&ns, &name) else {
        return not_found(&ns, &name);
    };
    let launcher = LauncherClient::new(st.paths.launcher(&uid));
    // The launcher is the truth about the domain's state; the VMI status may lag.
    let state = match launcher.call(&Request::GetStatus).await {
        Ok(LauncherResponse::Status(s)) => s.state,
        Ok(other) => {
            return status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                format!("launcher: unexpected reply {other:?}"),
            );
        }
        Err(e) => return conflict(format!("VMI {ns}/{name} is not running: {e}")),
    };
    let wrong = match state {
        DomainState::Running => def.refusal(false),
        DomainState::Paused => def.refusal(true),
        _ => Some("VMI is not running"),
    };
    if let Some(w) = wrong {
        return conflict(w.to_string());
    }
    match launcher.call(&Request::Action(action)).await {
        Ok(LauncherResponse::Ok) => {
            tracing::info!(%ns, %name, action = action.name(), "done");
            (StatusCode::OK, Json(serde_json::json!({}))).into_response()
        }
        Ok(LauncherResponse::Error { message }) => conflict(message),
        Ok(other) => status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            format!("launcher: unexpected reply {other:?}"),
        ),
        Err(e) => status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            e.to_string(),
        ),
    }
}

/// A guest-agent read of the API catalogue (`guestosinfo`, `userlist`, `filesystemlist`):
/// the launcher asks its guest agent and the answer, KubeVirt's document, goes back as it is.
async fn read(
    State(st): State<AppState>,
    UrlPath((ns, name, sub)): UrlPath<(String, String, String)>,
) -> Response {
    let Some(def) = catalogue::vmi_read_named(&sub) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("unknown subresource {sub:?}"),
        );
    };
    let r = do_read(&st, &ns, &name, def).await;
    st.metrics
        .request(def.subresource.name, r.status().as_u16());
    r
}

async fn do_read(
    st: &AppState,
    ns: &str,
    name: &str,
    def: &'static catalogue::VmiReadDef,
) -> Response {
    let Some(uid) = st.registry.uid(ns, name) else {
        return not_found(ns, name);
    };
    let launcher = LauncherClient::new(st.paths.launcher(&uid));
    let internal = |m: String| status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", m);
    match launcher.call(&Request::Guest(def.query)).await {
        Ok(LauncherResponse::GuestOsInfo { info }) => Json(info).into_response(),
        Ok(LauncherResponse::UserList { list }) => Json(list).into_response(),
        Ok(LauncherResponse::FilesystemList { list }) => Json(list).into_response(),
        // KubeVirt's 409 for a guest without an agent, and for whatever the agent refused.
        Ok(LauncherResponse::Error { message }) => conflict(message),
        Ok(other) => internal(format!("launcher: unexpected reply {other:?}")),
        Err(e) => conflict(format!("VMI {ns}/{name} is not running: {e}")),
    }
}

/// Query of the websocket paths.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StreamQuery {
    /// Watch the console without taking it over.
    #[serde(default)]
    read_only: bool,
    /// VNC: refuse (503) instead of taking over an active session (KubeVirt's).
    #[serde(default)]
    preserve_session: bool,
}

/// Largest websocket message or frame a client may send: console input and VNC client
/// messages are keystrokes, pointer events and small requests (a pasted block at most).
/// With [`QUEUE`] messages queued each way, a session holds a few MiB at most (the
/// library's defaults, 64 MiB messages, allowed gigabytes).
const MAX_CLIENT_MESSAGE: usize = 256 * 1024;
/// Messages queued per direction of a session before the sender waits.
const QUEUE: usize = 8;
/// Read-only console sessions of one VMI at once.
const MAX_OBSERVERS: usize = 16;

fn bounded(ws: WebSocketUpgrade) -> WebSocketUpgrade {
    ws.max_message_size(MAX_CLIENT_MESSAGE)
        .max_frame_size(MAX_CLIENT_MESSAGE)
}

async fn console(
    State(st): State<AppState>,
    UrlPath((ns, name)): UrlPath<(String, String)>,
    Query(q): Query<StreamQuery>,
    ws: WebSocketUpgrade,
) -> Response {
    let metrics = st.metrics.clone();
    let r = open_console(st, ns, name, q, ws).await;
    metrics.request("console", r.status().as_u16());
    r
}

async fn open_console(
    st: AppState,
    ns: String,
    name: String,
    q: StreamQuery,
    ws: WebSocketUpgrade,
) -> Response {
    let Some(uid) = st.registry.uid(&ns, &name) else {
        return not_found(&ns, &name);
    };
    let id = st.ids.fetch_add(1, Ordering::Relaxed);
    let (hub, feed) = match st.hub(&uid, (!q.read_only).then_some(id)).await {
        Ok(h) => h,
        Err(e) if e.kind() == std::io::ErrorKind::QuotaExceeded => {
            return status(
                StatusCode::TOO_MANY_REQUESTS,
                "TooManyRequests",
                format!("console of VMI {ns}/{name}: {e}"),
            );
        }
        Err(e) => {
            return conflict(format!("console of VMI {ns}/{name} is not available: {e}"));
        }
    };
    let ping = st.ping_every;
    let open = st.metrics.sessions("console");
    bounded(ws)
        .protocols([PLAIN_SUBPROTOCOL])
        .on_upgrade(move |ws| async move {
            open.inc();
            tracing::info!(%ns, %name, session = id, read_only = q.read_only, "console session opened");
            console_session(ws, hub, feed, id, ping).await;
            open.dec();
            tracing::info!(%ns, %name, session = id, "console session closed");
        })
}

async fn vnc(
    State(st): State<AppState>,
    UrlPath((ns, name)): UrlPath<(String, String)>,
    Query(q): Query<StreamQuery>,
    ws: WebSocketUpgrade,
) -> Response {
    let metrics = st.metrics.clone();
    let r = open_vnc(st, ns, name, q.preserve_session, ws).await;
    metrics.request("vnc", r.status().as_u16());
    r
}

async fn open_vnc(
    st: AppState,
    ns: String,
    name: String,
    preserve: bool,
    ws: WebSocketUpgrade,
) -> Response {
    let Some(uid) = st.registry.uid(&ns, &name) else {
        return not_found(&ns, &name);
    };
    if preserve && st.vnc.lock().is_ok_and(|m| m.contains_key(&uid)) {
        return status(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            "Active VNC connection".into(),
        );
    }
    let sock = match st
        .paths
        .launcher(&uid)
        .connect(crate::launcher_fs::VNC_SOCKET)
        .await
    {
        Ok(s) => s,
        Err(e) => return conflict(format!("VNC of VMI {ns}/{name} is not available: {e}")),
    };
    let id = st.ids.fetch_add(1, Ordering::Relaxed);
    let stop = CancellationToken::new();
    if let Ok(mut m) = st.vnc.lock()
        && let Some((_, old)) = m.insert(uid.clone(), (id, stop.clone()))
    {
        old.cancel();
    }
    let (ping, vnc_map) = (st.ping_every, st.vnc.clone());
    let open = st.metrics.sessions("vnc");
    bounded(ws)
        .protocols([PLAIN_SUBPROTOCOL])
        .on_upgrade(move |ws| async move {
            open.inc();
            tracing::info!(%ns, %name, session = id, "VNC session opened");
            let (r, w) = sock.into_split();
            let (out_rx, in_tx, tasks) = socket_tasks(r, w, CHUNK, CancellationToken::new());
            pump(ws, out_rx, Some(in_tx), stop, ping, &|| {
                (1000, "VNC connection closed")
            })
            .await;
            drop(tasks);
            if let Ok(mut m) = vnc_map.lock()
                && m.get(&uid).is_some_and(|(cur, _)| *cur == id)
            {
                m.remove(&uid);
            }
            open.dec();
            tracing::info!(%ns, %name, session = id, "VNC session closed");
        })
}

/// Tasks moving bytes between a socket and [`pump`]'s channels: what the socket sends
/// comes out of the receiver, what goes into the sender is written to it. Dropping or
/// aborting the set ends both.
fn socket_tasks<R, W>(
    mut r: R,
    mut w: W,
    chunk: usize,
    until: CancellationToken,
) -> (
    mpsc::Receiver<Bytes>,
    mpsc::Sender<Bytes>,
    tokio::task::JoinSet<()>,
)
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (out_tx, out_rx) = mpsc::channel::<Bytes>(QUEUE);
    let (in_tx, mut in_rx) = mpsc::channel::<Bytes>(QUEUE);
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(async move {
        let mut buf = vec![0u8; chunk];
        loop {
            let n = tokio::select! {
                _ = until.cancelled() => break,
                n = r.read(&mut buf) => match n {
                    Ok(n) => n,
                    Err(_) => break,
                },
            };
            if n == 0
                || out_tx
                    .send(Bytes::copy_from_slice(&buf[..n]))
                    .await
                    .is_err()
            {
                break;
            }
        }
    });
    tasks.spawn(async move {
        while let Some(b) = in_rx.recv().await {
            if w.write_all(&b).await.is_err() {
                break;
            }
        }
        let _ = w.shutdown().await;
    });
    (out_rx, in_tx, tasks)
}

async fn portforward(
    State(st): State<AppState>,
    UrlPath((ns, name, port, protocol)): UrlPath<(String, String, String, String)>,
    ws: WebSocketUpgrade,
) -> Response {
    let metrics = st.metrics.clone();
    let r = open_portforward(st, ns, name, port, protocol, ws).await;
    metrics.request("portforward", r.status().as_u16());
    r
}

/// One forwarded connection: the guest is dialled before the upgrade is answered, so a
/// closed port is an HTTP error naming it, not a websocket that closes at once.
async fn open_portforward(
    st: AppState,
    ns: String,
    name: String,
    port: String,
    protocol: String,
    ws: WebSocketUpgrade,
) -> Response {
    let Some(uid) = st.registry.uid(&ns, &name) else {
        return not_found(&ns, &name);
    };
    let ForwardTarget { port, protocol } = match ForwardTarget::parse(&port, Some(&protocol)) {
        Ok(t) => t,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
    };
    // Where the guest is comes from the VMI and the pod's IP as the API server has them,
    // never from the launcher.
    let address = match st.vmis.named(&ns, &name) {
        Some(vmi) => crate::network::guest_address(&vmi, st.vmis.pod_ip(&uid)),
        None => Err(crate::network::GuestConnectError::NoNetwork),
    };
    let dir = st.paths.launcher(&uid);
    let guest = match address {
        Err(e) => Err(e),
        Ok(a) if protocol == ForwardProtocol::Tcp => crate::network::connect_guest(dir, a, port)
            .await
            .map(GuestSocket::Tcp),
        Ok(a) => crate::network::connect_guest_udp(dir, a, port)
            .await
            .map(GuestSocket::Udp),
    };
    let guest = match guest {
        Ok(s) => s,
        Err(e) => {
            let code = match e {
                crate::network::GuestConnectError::Other(_) => StatusCode::INTERNAL_SERVER_ERROR,
                _ => StatusCode::BAD_REQUEST,
            };
            let reason = if code == StatusCode::BAD_REQUEST {
                "BadRequest"
            } else {
                "InternalError"
            };
            return status(code, reason, format!("VMI {ns}/{name}: {e}"));
        }
    };
    let ping = st.ping_every;
    let launcher = LauncherClient::new(st.paths.launcher(&uid));
    let open = st.metrics.sessions("portforward");
    bounded(ws)
        .protocols([PLAIN_SUBPROTOCOL])
        .on_upgrade(move |ws| async move {
            open.inc();
            tracing::info!(%ns, %name, port, %protocol, "port-forward opened");
            // A connection into the pod's network outlives the guest it reached: once the
            // guest has migrated (or stopped) nothing answers there and it would hang until
            // TCP gives up. The launcher's events say when: the forward ends then, with the
            // reason, and the next one reaches the guest on its new node.
            let gone = CancellationToken::new();
            let left = Arc::new(std::sync::atomic::AtomicU8::new(GUEST_HERE));
            let watch = tokio::spawn(watch_for_departure(launcher, left.clone(), gone.clone()));
            let refused = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let (out_rx, in_tx, tasks) = match guest {
                // Bulk transfers (scp, downloads): fewer, larger messages through every hop.
                GuestSocket::Tcp(tcp) => {
                    let (r, w) = tcp.into_split();
                    socket_tasks(r, w, FORWARD_CHUNK, gone)
                }
                GuestSocket::Udp(udp) => datagram_tasks(udp, gone, refused.clone()),
            };
            let reason = move || match left.load(Ordering::Acquire) {
                GUEST_MIGRATED => (1001, MIGRATED_AWAY),
                GUEST_STOPPED => (1001, STOPPED_HERE),
                _ if refused.load(Ordering::Acquire) => (1011, UDP_PORT_CLOSED),
                _ => (1000, "the guest closed the connection"),
            };
            pump(
                ws,
                out_rx,
                Some(in_tx),
                CancellationToken::new(),
                ping,
                &reason,
            )
            .await;
            watch.abort();
            drop(tasks);
            open.dec();
            tracing::info!(%ns, %name, port, %protocol, "port-forward closed");
        })
}

/// The guest end of a port-forward.
enum GuestSocket {
    Tcp(tokio::net::TcpStream),
    /// Connected to the guest's port: one datagram per websocket message, both ways, as
    /// upstream virtctl frames UDP.
    Udp(tokio::net::UdpSocket),
}

/// Close reason of a UDP forward whose guest port answered ICMP "port unreachable".
pub const UDP_PORT_CLOSED: &str =
    "the guest's UDP port is closed (ICMP port unreachable): nothing listens there?";

/// Largest datagram relayed (UDP's payload limit).
const MAX_DATAGRAM: usize = 65_535;

/// [`socket_tasks`] for a connected UDP socket, keeping datagram boundaries: each datagram
/// from the guest is one chunk out, each chunk in is one datagram. Ends when `until` fires
/// or the guest's port is unreachable (then `refused` is set: UDP has no close to end a
/// forward, and a client sending into a closed port should hear why nothing comes back).
fn datagram_tasks(
    sock: tokio::net::UdpSocket,
    until: CancellationToken,
    refused: Arc<std::sync::atomic::AtomicBool>,
) -> (
    mpsc::Receiver<Bytes>,
    mpsc::Sender<Bytes>,
    tokio::task::JoinSet<()>,
) {
    let (out_tx, out_rx) = mpsc::channel::<Bytes>(QUEUE);
    let (in_tx, mut in_rx) = mpsc::channel::<Bytes>(QUEUE);
    let sock = Arc::new(sock);
    let mut tasks = tokio::task::JoinSet::new();
    let done = CancellationToken::new();
    let (rx_sock, rx_done, rx_refused) = (sock.clone(), done.clone(), refused.clone());
    tasks.spawn(async move {
        let mut buf = vec![0u8; MAX_DATAGRAM];
        loop {
            let n = tokio::select! {
                _ = until.cancelled() => break,
                _ = rx_done.cancelled() => break,
                n = rx_sock.recv(&mut buf) => n,
            };
            match n {
                Ok(n) => {
                    if out_tx
                        .send(Bytes::copy_from_slice(&buf[..n]))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    rx_refused.store(true, Ordering::Release);
                    break;
                }
                Err(_) => break,
            }
        }
        // Dropping the sender ends the websocket with the reason.
    });
    tasks.spawn(async move {
        while let Some(b) = in_rx.recv().await {
            match sock.send(&b).await {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    refused.store(true, Ordering::Release);
                    done.cancel();
                    break;
                }
                // A datagram the network refuses (too large, say) is lost, as UDP loses it.
                Err(_) => {}
            }
        }
    });
    (out_rx, in_tx, tasks)
}

/// How a port-forward's guest left: still here, migrated away, or stopped.
const GUEST_HERE: u8 = 0;
const GUEST_MIGRATED: u8 = 1;
const GUEST_STOPPED: u8 = 2;

/// Close reason of a port-forward whose guest stopped running on this node.
pub const STOPPED_HERE: &str = "the VMI stopped running on this node";

/// Follows the launcher's domain events until its guest leaves (migrated, shut down,
/// crashed, or the launcher ended: then its outcome file says how), records how in `left`
/// and cancels `gone`.
async fn watch_for_departure(
    launcher: LauncherClient,
    left: Arc<std::sync::atomic::AtomicU8>,
    gone: CancellationToken,
) {
    use virt_domain::protocol::{DomainEvent, LauncherOutcome, OUTCOME_FILE};
    let from_outcome = || async {
        match launcher.dir().read(OUTCOME_FILE, 64 * 1024).await {
            Ok(b) if matches!(serde_json::from_slice(&b), Ok(LauncherOutcome::Migrated)) => {
                GUEST_MIGRATED
            }
            _ => GUEST_STOPPED,
        }
    };
    let how = match launcher.watch().await {
        Ok(mut events) => loop {
            match events.next().await {
                Ok(Some(DomainEvent::Migrated)) => break GUEST_MIGRATED,
                Ok(Some(DomainEvent::ShutDown | DomainEvent::Crashed { .. })) => {
                    break GUEST_STOPPED;
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break from_outcome().await,
            }
        },
        Err(_) => from_outcome().await,
    };
    left.store(how, Ordering::Release);
    gone.cancel();
}

/// Close reason of a console or port-forward whose guest live-migrated to another node.
pub const MIGRATED_AWAY: &str = "the VMI migrated to another node; reconnect to reach it there";

/// Moves bytes between a websocket and a launcher socket: `out` chunks become binary
/// messages, binary messages go to `input` (dropped for observers; other message kinds
/// are skipped, as KubeVirt's clients do). Pings every `ping_every`; a ping unanswered
/// until the next one closes the session. `stop` closes it with [`TAKEN_OVER`].
async fn pump(
    mut ws: WebSocket,
    mut out: mpsc::Receiver<Bytes>,
    input: Option<mpsc::Sender<Bytes>>,
    stop: CancellationToken,
    ping_every: Duration,
    eof_reason: &(dyn Fn() -> (u16, &'static str) + Send + Sync),
) {
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + ping_every, ping_every);
    // After a long blocking send, catch-up ticks would find the fresh ping unanswered and
    // close a healthy session; the next ping waits a full interval instead.
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut awaiting_pong = false;
    // A client message waiting for room in the input queue. While it waits the loop goes on
    // sending output and reads no more input: awaiting the queue here instead would stop
    // the output too, and a peer that echoes (a console, a forwarded port) blocks writing
    // its echo, never drains the input, and both sides wait for ever.
    let mut pending: Option<Bytes> = None;
    let close: Option<(u16, &str)> = loop {
        tokio::select! {
            _ = stop.cancelled() => break Some((1000, TAKEN_OVER)),
            chunk = out.recv() => match chunk {
                Some(b) => if ws.send(Message::Binary(b)).await.is_err() { break None },
                // A taken-over writer's channel ends with the takeover: say which it was.
                None if stop.is_cancelled() => break Some((1000, TAKEN_OVER)),
                None => break Some(eof_reason()),
            },
            room = reserve(input.as_ref()), if pending.is_some() => match room {
                Some(permit) => {
                    if let Some(b) = pending.take() {
                        permit.send(b);
                    }
                }
                None => break Some(eof_reason()),
            },
            msg = ws.recv(), if pending.is_none() => match msg {
                Some(Ok(Message::Binary(b))) => {
                    if input.is_some() {
                        pending = Some(b);
                    }
                }
                Some(Ok(Message::Pong(_))) => awaiting_pong = false,
                Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break None,
                Some(Ok(_)) => {}
            },
            _ = ticker.tick() => {
                if awaiting_pong {
                    tracing::info!("no pong within {ping_every:?}; closing");
                    break Some((1001, "no pong"));
                }
                awaiting_pong = true;
                if ws.send(Message::Ping(Bytes::new())).await.is_err() {
                    break None;
                }
            }
        }
    };
    if let Some((code, reason)) = close {
        let _ = ws
            .send(Message::Close(Some(CloseFrame {
                code,
                reason: reason.into(),
            })))
            .await;
    }
}

/// Room for one message in `tx`; `None` when there is no queue or its reader is gone.
async fn reserve(tx: Option<&mpsc::Sender<Bytes>>) -> Option<mpsc::Permit<'_, Bytes>> {
    tx?.reserve().await.ok()
}

async fn console_session(ws: WebSocket, hub: Arc<ConsoleHub>, feed: Feed, id: u64, ping: Duration) {
    let (out_rx, stop, input, forward) = match feed {
        // The writer's output is paced: the hub waits for it, so nothing is lost (the guest's
        // serial line waits instead, as a real one with flow control does).
        Feed::Writer { rx, stop } => {
            let (in_tx, mut in_rx) = mpsc::channel::<Bytes>(QUEUE);
            let hub = hub.clone();
            tokio::spawn(async move {
                while let Some(b) = in_rx.recv().await {
                    if !hub.write(id, &b).await {
                        break;
                    }
                }
            });
            (rx, stop, Some(in_tx), None)
        }
        Feed::Observer(mut rx) => {
            let (out_tx, out_rx) = mpsc::channel::<Bytes>(QUEUE);
            let closed = hub.closed.clone();
            let forward = tokio::spawn(async move {
                loop {
                    let b = tokio::select! {
                        _ = closed.cancelled() => return,
                        r = rx.recv() => match r {
                            Ok(b) => b,
                            // A slow observer loses output rather than stalling the guest.
                            Err(broadcast::error::RecvError::Lagged(n)) => {
                                tracing::debug!(chunks = n, "console observer lagging; output dropped");
                                continue;
                            }
                            Err(broadcast::error::RecvError::Closed) => return,
                        },
                    };
                    if out_tx.send(b).await.is_err() {
                        return;
                    }
                }
            });
            (out_rx, CancellationToken::new(), None, Some(forward))
        }
    };
    let migrated = hub.migrated.clone();
    let reason = move || {
        if migrated.load(Ordering::Acquire) {
            (1000, MIGRATED_AWAY)
        } else {
            (1000, "console connection closed")
        }
    };
    pump(ws, out_rx, input, stop, ping, &reason).await;
    if let Some(f) = forward {
        f.abort();
    }
    hub.release(id);
}

/// What a console session reads from its hub.
enum Feed {
    /// The writer: every chunk, paced by how fast the session takes them; `stop` is cancelled
    /// when another writer takes over.
    Writer {
        rx: mpsc::Receiver<Bytes>,
        stop: CancellationToken,
    },
    /// A read-only observer: a copy that skips what it was too slow for.
    Observer(broadcast::Receiver<Bytes>),
}

/// The current writer of a hub: its session id, its takeover token and its output channel.
type WriterSlot = Arc<Mutex<Option<(u64, CancellationToken, mpsc::Sender<Bytes>)>>>;

/// One connection to a VMI's console socket, shared by its sessions. Dropped with the
/// last session, which closes the connection so QEMU accepts the next one.
#[derive(Debug)]
struct ConsoleHub {
    /// Copies for observers.
    out: broadcast::Sender<Bytes>,
    input: tokio::sync::Mutex<OwnedWriteHalf>,
    /// The writer, whose output the reader waits for.
    writer: WriterSlot,
    /// The console socket hit EOF.
    closed: CancellationToken,
    /// ... because the guest live-migrated to another node (set before `closed`).
    migrated: Arc<std::sync::atomic::AtomicBool>,
    /// Cancelled on drop: ends the reader task.
    dropped: CancellationToken,
}

impl Drop for ConsoleHub {
    fn drop(&mut self) {
        self.dropped.cancel();
    }
}

impl ConsoleHub {
    /// Makes `id` the writer; the previous writer's token is cancelled (it gets closed).
    fn claim(&self, id: u64) -> Feed {
        let stop = CancellationToken::new();
        let (tx, rx) = mpsc::channel(QUEUE);
        if let Ok(mut w) = self.writer.lock()
            && let Some((_, old, _)) = w.replace((id, stop.clone(), tx))
        {
            old.cancel();
        }
        Feed::Writer { rx, stop }
    }

    fn release(&self, id: u64) {
        if let Ok(mut w) = self.writer.lock()
            && w.as_ref().is_some_and(|(cur, ..)| *cur == id)
        {
            *w = None;
        }
    }

    /// Writes if `id` is still the writer; false when it is not or the socket failed.
    async fn write(&self, id: u64, b: &[u8]) -> bool {
        let current = self
            .writer
            .lock()
            .map(|w| w.as_ref().is_some_and(|(cur, ..)| *cur == id))
            .unwrap_or(false);
        current && self.input.lock().await.write_all(b).await.is_ok()
    }
}

impl AppState {
    /// The console hub of `uid` and the session's feed: the writer's (`writer`: its session
    /// id) or an observer's. Taken before the hub's reader starts, so a new session misses
    /// nothing QEMU sends after the connection is made.
    async fn hub(
        &self,
        uid: &str,
        writer: Option<u64>,
    ) -> std::io::Result<(Arc<ConsoleHub>, Feed)> {
        let feed = |h: &ConsoleHub| match writer {
            Some(id) => Ok(h.claim(id)),
            // Each observer costs a connection from virt-apiserver and a task here (N5 of
            // the security review at bd37f96).
            None if h.out.receiver_count() >= MAX_OBSERVERS => Err(std::io::Error::new(
                std::io::ErrorKind::QuotaExceeded,
                format!("{MAX_OBSERVERS} read-only sessions are open, the most allowed"),
            )),
            None => Ok(Feed::Observer(h.out.subscribe())),
        };
        let mut hubs = self.consoles.lock().await;
        if let Some(h) = hubs.get(uid).and_then(Weak::upgrade)
            && !h.closed.is_cancelled()
        {
            let f = feed(&h)?;
            return Ok((h, f));
        }
        let dir = self.paths.launcher(uid);
        let sock = dir
            .connect(crate::launcher_fs::CONSOLE_SOCKET)
            .await
            .map_err(crate::launcher_fs::LauncherFsError::into_io)?;
        let (mut r, w) = sock.into_split();
        // Observers skip what they are too slow for: the buffer bounds what one console
        // holds for them (128 chunks of at most CHUNK bytes).
        let (out, _) = broadcast::channel(128);
        let hub = Arc::new(ConsoleHub {
            out: out.clone(),
            input: tokio::sync::Mutex::new(w),
            writer: WriterSlot::default(),
            closed: CancellationToken::new(),
            migrated: Arc::default(),
            dropped: CancellationToken::new(),
        });
        let first = feed(&hub)?;
        let slot = hub.writer.clone();
        let (closed, dropped) = (hub.closed.clone(), hub.dropped.clone());
        let (migrated, launcher) = (
            hub.migrated.clone(),
            crate::client::LauncherClient::new(dir),
        );
        tokio::spawn(async move {
            let mut buf = vec![0u8; CHUNK];
            loop {
                let n = tokio::select! {
                    _ = dropped.cancelled() => break,
                    n = r.read(&mut buf) => n,
                };
                match n {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let chunk = Bytes::copy_from_slice(&buf[..n]);
                        // No observer is no error.
                        let _ = out.send(chunk.clone());
                        let writer = slot
                            .lock()
                            .ok()
                            .and_then(|w| w.as_ref().map(|(.., tx)| tx.clone()));
                        if let Some(tx) = writer {
                            // Waits while the writer's session is behind; a closed session
                            // (gone, or taken over meanwhile) just misses the chunk.
                            tokio::select! {
                                _ = dropped.cancelled() => break,
                                _ = tx.send(chunk) => {}
                            }
                        }
                    }
                }
            }
            // QEMU's console ends when the guest has left for a migration target; the
            // launcher says so (cluster-flow.md §6.6: consoles end, reconnect follows).
            // The launcher may still report `running` for a moment after the switchover.
            for _ in 0..5 {
                use virt_domain::protocol::{DomainState, Request, Response};
                match launcher.call(&Request::GetStatus).await {
                    Ok(Response::Status(s)) if s.state == DomainState::Migrated => {
                        migrated.store(true, Ordering::Release);
                        break;
                    }
                    Ok(Response::Status(s)) if s.state == DomainState::Running => {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    _ => break,
                }
            }
            closed.cancel();
            // The writer's channel ends too: its session closes with the reason.
            if let Ok(mut w) = slot.lock() {
                *w = None;
            }
        });
        hubs.retain(|_, h| h.strong_count() > 0);
        hubs.insert(uid.to_string(), Arc::downgrade(&hub));
        Ok((hub, first))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::sync::atomic::AtomicBool;
    use tokio::net::UdpSocket;

    #[tokio::test]
    async fn datagrams_keep_their_bounds_and_a_closed_port_ends_the_forward() {
        let echo = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let echo_addr = echo.local_addr().unwrap();
        tokio::spawn(async move {
            let mut b = vec![0u8; MAX_DATAGRAM];
            while let Ok((n, peer)) = echo.recv_from(&mut b).await {
                let _ = echo.send_to(&b[..n], peer).await;
            }
        });
        let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        sock.connect(echo_addr).await.unwrap();
        let refused = Arc::new(AtomicBool::new(false));
        let (mut out, input, _tasks) =
            datagram_tasks(sock, CancellationToken::new(), refused.clone());
        let big = Bytes::from(vec![7u8; 9000]);
        for d in [
            Bytes::from_static(b"one"),
            big.clone(),
            Bytes::from_static(b"two"),
        ] {
            input.send(d).await.unwrap();
        }
        assert_eq!(&out.recv().await.unwrap()[..], b"one");
        assert_eq!(out.recv().await.unwrap(), big);
        assert_eq!(&out.recv().await.unwrap()[..], b"two");
        assert!(!refused.load(Ordering::Acquire));

        // Nothing listens: the kernel's "port unreachable" ends the forward and says so.
        let closed = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let closed_addr = closed.local_addr().unwrap();
        drop(closed);
        let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        sock.connect(closed_addr).await.unwrap();
        let refused = Arc::new(AtomicBool::new(false));
        let (mut out, input, _tasks) =
            datagram_tasks(sock, CancellationToken::new(), refused.clone());
        input.send(Bytes::from_static(b"anyone?")).await.unwrap();
        let end = tokio::time::timeout(Duration::from_secs(10), out.recv())
            .await
            .expect("the forward ends");
        assert!(end.is_none());
        assert!(refused.load(Ordering::Acquire));
    }
}
