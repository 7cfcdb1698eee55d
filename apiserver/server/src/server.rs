//! The TLS listener: rustls with deferred client-certificate verification, HTTP/1.1
//! and HTTP/2 on one port (upgrades allowed), the peer identity attached to requests,
//! and graceful shutdown that ends watches cleanly.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use rustls::ServerConfig;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use virt_certs::reload::{ReloadError, Reloading};

use crate::auth::{AuthConfig, DeferredClientVerifier};

/// A TLS setup failure.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// PEM could not be parsed.
    #[error("reading {what}: invalid PEM")]
    Pem {
        /// Which file.
        what: &'static str,
    },
    /// rustls rejected the configuration.
    #[error("building TLS configuration")]
    Rustls(#[from] rustls::Error),
}

/// Builds the rustls server configuration, asking clients for certificates of `auth`'s CAs.
pub fn tls_config(
    cert_pem: &[u8],
    key_pem: &[u8],
    auth: &AuthConfig,
) -> Result<ServerConfig, TlsError> {
    let trust = auth.trust();
    use rustls_pki_types::pem::PemObject;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|_| TlsError::Pem {
            what: "serving certificate",
        })?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|_| TlsError::Pem {
        what: "serving key",
    })?;
    let mut pools = Vec::new();
    if let Some(rh) = &trust.request_header {
        pools.push(&rh.ca);
    }
    if let Some(ca) = &trust.client_ca {
        pools.push(ca);
    }
    let verifier = Arc::new(DeferredClientVerifier::new(&pools, provider.clone()));
    let mut cfg = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}

/// The serving configuration, rebuilt from the certificate files when the operator rotates
/// them and when the client CAs change (checked per new connection): kube-apiserver's next
/// connection gets the new certificate, or is asked for one of the new CA, while open
/// consoles keep theirs, so a rotation needs no restart.
#[derive(Clone, Debug)]
pub struct ServingTls(Arc<Serving>);

#[derive(Debug)]
enum Serving {
    Files(Box<ServingFiles>),
    Fixed(Arc<ServerConfig>),
}

#[derive(Debug)]
struct ServingFiles {
    /// The certificate and key as read (checked to make a configuration).
    files: Reloading<(Vec<u8>, Vec<u8>)>,
    auth: AuthConfig,
    /// The configuration in use: from which files, for which trust generation.
    built: std::sync::Mutex<Built>,
}

#[derive(Debug)]
struct Built {
    files: Arc<(Vec<u8>, Vec<u8>)>,
    generation: u64,
    config: Arc<ServerConfig>,
}

impl Built {
    fn new(files: Arc<(Vec<u8>, Vec<u8>)>, auth: &AuthConfig) -> Result<Self, TlsError> {
        let generation = auth.trust().generation;
        let config = Arc::new(tls_config(&files.0, &files.1, auth)?);
        Ok(Self {
            files,
            generation,
            config,
        })
    }
}

impl ServingTls {
    /// Serves the certificate and key in these files, re-read when they change; clients are
    /// verified against `auth`'s CAs, whichever they are at the time.
    pub fn from_files(cert: PathBuf, key: PathBuf, auth: &AuthConfig) -> Result<Self, ReloadError> {
        let check = auth.clone();
        let files = Reloading::new(
            "serving certificate (--tls-cert-file, --tls-private-key-file)",
            vec![cert, key],
            move |c| {
                tls_config(&c[0], &c[1], &check)?;
                Ok((c[0].clone(), c[1].clone()))
            },
        )?;
        let built = Built::new(files.get(), auth).map_err(|e| ReloadError::Build {
            what: "serving certificate".into(),
            source: e.into(),
        })?;
        Ok(Self(Arc::new(Serving::Files(Box::new(ServingFiles {
            files,
            auth: auth.clone(),
            built: std::sync::Mutex::new(built),
        })))))
    }

    /// A configuration that never changes (tests).
    pub fn fixed(cfg: ServerConfig) -> Self {
        Self(Arc::new(Serving::Fixed(Arc::new(cfg))))
    }

    fn get(&self) -> Arc<ServerConfig> {
        let ServingFiles { files, auth, built } = match &*self.0 {
            Serving::Fixed(c) => return c.clone(),
            Serving::Files(f) => &**f,
        };
        let pems = files.get();
        if let Some(e) = files.last_error() {
            tracing::warn!(error = %e, "Serving certificate files changed but cannot be used; keeping the previous ones");
        }
        let mut built = built
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !Arc::ptr_eq(&built.files, &pems) || built.generation != auth.trust().generation {
            // The files were checked when read: a failure here keeps the configuration
            // in use.
            match Built::new(pems, auth) {
                Ok(b) => *built = b,
                Err(e) => tracing::warn!(error = %e, "rebuilding the serving configuration"),
            }
        }
        built.config.clone()
    }
}

/// Bounds on connections, so that clients that connect and say nothing, or connect, ask
/// once and then hold the connection open, cannot pile up (N2 of the security review at
/// bd37f96: 8192 HTTP/2 connections that each sent one request held every slot for good).
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    /// Open connections at most. A connection accepted at the limit closes the one that has
    /// been idle (no request in flight) the longest; when none is idle, accepting waits
    /// until one closes (the kernel's backlog holds the rest).
    pub max_connections: usize,
    /// HTTP/1: time for a request's headers to arrive, counted from when the connection
    /// waits for one, so it also ends idle keep-alive connections. Also the time any
    /// connection has, from its accept, to send its first request (an HTTP/2 client that
    /// completes TLS and says nothing is closed then).
    pub header_read_timeout: Duration,
    /// TLS handshake.
    pub handshake_timeout: Duration,
    /// HTTP/2: ping interval, and how long an unanswered ping may stay unanswered before the
    /// connection is dropped (a vanished peer otherwise holds its streams forever).
    pub h2_keepalive: Duration,
    /// A connection that has served requests and has none in flight is closed after this
    /// long (Go's `http.Server.IdleTimeout`, 90 s in kube-apiserver).
    pub idle_timeout: Duration,
    /// After this long a connection takes no new requests (HTTP/2 GOAWAY; clients open a
    /// new one) and closes once those in flight end.
    pub max_age: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: 8192,
            header_read_timeout: Duration::from_secs(30),
            handshake_timeout: Duration::from_secs(10),
            h2_keepalive: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(90),
            max_age: Duration::from_secs(30 * 60),
        }
    }
}

/// The client's address, in each request's extensions (the eviction webhook's budget is
/// per address).
#[derive(Clone, Copy, Debug)]
pub struct RemoteAddr(pub SocketAddr);

/// Connections with no request in flight, the longest idle first: a new connection (in its
/// handshake or before its first request) counts as idle from its accept. At the connection
/// limit the one idle the longest is closed to make room for a new one: clients that hold
/// connections without using them cannot crowd out the rest, and a connection with a
/// request in flight (a watch, a console) is never shed this way.
#[derive(Debug, Default)]
pub struct Idle {
    next: std::sync::atomic::AtomicU64,
    waiting: std::sync::Mutex<std::collections::BTreeMap<u64, CancellationToken>>,
}

/// One connection's requests in flight and idle time, and its place in [`Idle`].
#[derive(Debug)]
pub struct Conn {
    set: Arc<Idle>,
    state: std::sync::Mutex<ConnState>,
    /// Cancelled when the connection is shed.
    pub shed: CancellationToken,
}

#[derive(Debug)]
struct ConnState {
    in_flight: usize,
    /// Its key in [`Idle`] while it has no request in flight.
    idle_key: Option<u64>,
    idle_since: std::time::Instant,
    served: bool,
}

/// A request in flight on a [`Conn`]: the connection is idle again when the last one ends.
#[derive(Debug)]
pub struct Active(Arc<Conn>);

impl Idle {
    /// Registers a new connection, idle from now.
    pub fn enter(self: &Arc<Self>) -> Arc<Conn> {
        let shed = CancellationToken::new();
        let key = self.insert(shed.clone());
        Arc::new(Conn {
            set: self.clone(),
            state: std::sync::Mutex::new(ConnState {
                in_flight: 0,
                idle_key: Some(key),
                idle_since: std::time::Instant::now(),
                served: false,
            }),
            shed,
        })
    }

    fn insert(&self, shed: CancellationToken) -> u64 {
        let key = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.lock().insert(key, shed);
        key
    }

    /// Closes the connection idle the longest; false when none is idle.
    pub fn shed_oldest(&self) -> bool {
        match self.lock().pop_first() {
            Some((_, shed)) => {
                shed.cancel();
                true
            }
            None => false,
        }
    }

    /// How many connections are idle.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether every connection has a request in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<u64, CancellationToken>> {
        // The map stays consistent whatever panicked while holding it.
        self.waiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Conn {
    fn lock(&self) -> std::sync::MutexGuard<'_, ConnState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A request starts: the connection is busy until the returned guard drops (when the
    /// response's body has been sent).
    pub fn start(self: &Arc<Self>) -> Active {
        let mut st = self.lock();
        st.in_flight += 1;
        st.served = true;
        if let Some(key) = st.idle_key.take() {
            self.set.lock().remove(&key);
        }
        Active(self.clone())
    }

    /// How long it has had no request in flight (`None`: it has one), and whether it ever
    /// had one.
    pub fn idle(&self) -> (Option<Duration>, bool) {
        let st = self.lock();
        let idle = (st.in_flight == 0).then(|| st.idle_since.elapsed());
        (idle, st.served)
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        let mut st = self.0.lock();
        st.in_flight = st.in_flight.saturating_sub(1);
        if st.in_flight == 0 && st.idle_key.is_none() {
            st.idle_since = std::time::Instant::now();
            st.idle_key = Some(self.0.set.insert(self.0.shed.clone()));
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if let Some(key) = self.lock().idle_key.take() {
            self.set.lock().remove(&key);
        }
    }
}

/// A response body that keeps its request counted in flight on its connection until it
/// has been sent (a watch is busy for as long as it streams).
struct Tracked {
    body: axum::body::Body,
    _active: Active,
}

impl http_body::Body for Tracked {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// Resolves when `conn` has been idle for its limit: [`ConnectionLimits::header_read_timeout`]
/// before its first request, [`ConnectionLimits::idle_timeout`] after.
async fn idle_expired(conn: &Conn, limits: &ConnectionLimits) {
    loop {
        let (idle, served) = conn.idle();
        let limit = if served {
            limits.idle_timeout
        } else {
            limits.header_read_timeout
        };
        let wait = match idle {
            Some(d) if d >= limit => return,
            Some(d) => limit - d,
            // Busy: look again later (a request ending restarts the count).
            None => limit,
        };
        tokio::time::sleep(wait).await;
    }
}

/// Binds `addr` with the kernel's largest accept queue (`net.core.somaxconn`), as Go
/// servers such as kube-apiserver do. Tokio's default of 1024 is the queue a burst of
/// clients overflows first, and a connection dropped from a full queue after the client
/// saw it established is never answered nor reset: it hangs until the client gives up.
pub fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(somaxconn())
}

fn somaxconn() -> u32 {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(4096)
}

/// Accepts connections until `shutdown` is cancelled, then waits for open connections.
pub async fn serve(
    listener: TcpListener,
    tls: ServingTls,
    router: axum::Router,
    auth: AuthConfig,
    limits: ConnectionLimits,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let tracker = tokio_util::task::TaskTracker::new();
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let idle = Arc::new(Idle::default());
    loop {
        // At the limit with every connection serving requests, leave new ones in the
        // kernel's backlog until one closes.
        if slots.available_permits() == 0 && idle.is_empty() {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                slot = slots.acquire() => match slot {
                    Ok(s) => drop(s),
                    Err(_) => break,
                },
            }
        }
        let (tcp, remote): (_, SocketAddr) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "Accept failed");
                    continue;
                }
            },
        };
        let slot = match slots.clone().try_acquire_owned() {
            Ok(s) => s,
            Err(tokio::sync::TryAcquireError::Closed) => break,
            Err(tokio::sync::TryAcquireError::NoPermits) => {
                if idle.shed_oldest() {
                    tracing::debug!(%remote, "At the connection limit: closed the connection idle the longest");
                }
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    slot = slots.clone().acquire_owned() => match slot {
                        Ok(s) => s,
                        Err(_) => break,
                    },
                }
            }
        };
        let conn = idle.enter();
        let _ = tcp.set_nodelay(true);
        let acceptor = TlsAcceptor::from(tls.get());
        let router = router.clone();
        let auth = auth.clone();
        let shutdown = shutdown.clone();
        tracker.spawn(async move {
            let _slot = slot;
            let shed = conn.shed.clone();
            let handshake = tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp));
            let tls = tokio::select! {
                _ = shed.cancelled() => return,
                r = handshake => match r {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        tracing::debug!(%remote, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => return,
                },
            };
            let peer = auth.identify(tls.get_ref().1.peer_certificates());
            let tracked = conn.clone();
            let svc = hyper::service::service_fn(
                move |mut req: hyper::Request<hyper::body::Incoming>| {
                    let active = tracked.start();
                    req.extensions_mut().insert(peer.clone());
                    req.extensions_mut().insert(RemoteAddr(remote));
                    let router = router.clone();
                    async move {
                        let resp = router.oneshot(req.map(axum::body::Body::new)).await?;
                        Ok::<_, std::convert::Infallible>(resp.map(|body| {
                            axum::body::Body::new(Tracked {
                                body,
                                _active: active,
                            })
                        }))
                    }
                },
            );
            let mut builder = Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout);
            builder
                .http2()
                .timer(TokioTimer::new())
                .keep_alive_interval(limits.h2_keepalive)
                .keep_alive_timeout(limits.h2_keepalive)
                .max_concurrent_streams(1000);
            let conn_fut = builder.serve_connection_with_upgrades(TokioIo::new(tls), svc);
            tokio::pin!(conn_fut);
            let finish: Option<Duration> = tokio::select! {
                res = conn_fut.as_mut() => {
                    if let Err(e) = res {
                        tracing::debug!(%remote, error = %e, "Connection ended with error");
                    }
                    return;
                }
                // Shed at the limit, or idle too long: nothing in flight to finish.
                _ = shed.cancelled() => return,
                _ = idle_expired(&conn, &limits) => {
                    tracing::debug!(%remote, "Closing an idle connection");
                    return;
                }
                _ = tokio::time::sleep(limits.max_age) => None,
                _ = shutdown.cancelled() => Some(Duration::from_secs(10)),
            };
            // No new requests; those in flight end first (bounded on shutdown; a watch on a
            // connection past its age ends at its own timeout).
            conn_fut.as_mut().graceful_shutdown();
            let grace = match finish {
                Some(g) => g,
                None => tokio::select! {
                    _ = conn_fut.as_mut() => return,
                    _ = shutdown.cancelled() => Duration::from_secs(10),
                },
            };
            let _ = tokio::time::timeout(grace, conn_fut).await;
        });
    }
    tracker.close();
    tracker.wait().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_idle_the_longest_is_shed_first() {
        let set = Arc::new(Idle::default());
        let a = set.enter();
        let b = set.enter();
        let c = set.enter();
        assert_eq!(set.len(), 3);
        // `a` has a request in flight: never shed at the limit.
        let busy = a.start();
        assert!(set.shed_oldest());
        assert!(!a.shed.is_cancelled());
        assert!(b.shed.is_cancelled());
        assert!(!c.shed.is_cancelled());
        // Its request done, `a` is idle again, behind `c`.
        drop(busy);
        assert_eq!(set.len(), 2);
        assert!(set.shed_oldest());
        assert!(c.shed.is_cancelled());
        assert!(!a.shed.is_cancelled());
        // A connection that ends leaves the set.
        drop(a);
        assert!(set.is_empty());
        assert!(!set.shed_oldest());
    }

    #[test]
    fn idle_time_counts_from_the_last_request() {
        let set = Arc::new(Idle::default());
        let c = set.enter();
        assert!(matches!(c.idle(), (Some(_), false)));
        let r1 = c.start();
        let r2 = c.start();
        assert!(matches!(c.idle(), (None, true)));
        drop(r1);
        assert!(
            matches!(c.idle(), (None, true)),
            "one request still in flight"
        );
        drop(r2);
        let (idle, served) = c.idle();
        assert!(served && idle.is_some_and(|d| d < Duration::from_secs(1)));
    }
}
