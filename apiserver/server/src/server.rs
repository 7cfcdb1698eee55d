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

/// Builds the rustls server configuration.
pub fn tls_config(
    cert_pem: &[u8],
    key_pem: &[u8],
    auth: &AuthConfig,
) -> Result<ServerConfig, TlsError> {
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
    if let Some(rh) = &auth.request_header {
        pools.push(&rh.ca);
    }
    if let Some(ca) = &auth.client_ca {
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
/// them (checked per new connection): kube-apiserver's next connection gets the new
/// certificate while open consoles keep theirs, so a rotation needs no restart.
#[derive(Clone, Debug)]
pub struct ServingTls(Arc<Reloading<ServerConfig>>);

impl ServingTls {
    /// Serves the certificate and key in these files, re-read when they change; clients are
    /// verified against `auth`'s CAs.
    pub fn from_files(cert: PathBuf, key: PathBuf, auth: &AuthConfig) -> Result<Self, ReloadError> {
        let auth = auth.clone();
        let r = Reloading::new(
            "serving certificate (--tls-cert-file, --tls-private-key-file)",
            vec![cert, key],
            move |c| Ok(tls_config(&c[0], &c[1], &auth)?),
        )?;
        Ok(Self(Arc::new(r)))
    }

    /// A configuration that never changes (tests).
    pub fn fixed(cfg: ServerConfig) -> Self {
        Self(Arc::new(Reloading::fixed("serving certificate", cfg)))
    }

    fn get(&self) -> Arc<ServerConfig> {
        let cfg = self.0.get();
        if let Some(e) = self.0.last_error() {
            tracing::warn!(error = %e, "Serving certificate files changed but cannot be used; keeping the previous ones");
        }
        cfg
    }
}

/// Bounds on connections, so that clients that connect and say nothing cannot pile up.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    /// Open connections at most. A connection accepted at the limit closes the oldest one
    /// that has not sent a request yet ([`Unproven`]); when every connection has, it waits
    /// until one closes (the kernel's backlog holds the rest).
    pub max_connections: usize,
    /// HTTP/1: time for a request's headers to arrive, counted from when the connection
    /// waits for one, so it also ends idle keep-alive connections.
    pub header_read_timeout: Duration,
    /// TLS handshake.
    pub handshake_timeout: Duration,
    /// HTTP/2: ping interval, and how long an unanswered ping may stay unanswered before the
    /// connection is dropped (a vanished peer otherwise holds its streams forever).
    pub h2_keepalive: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: 8192,
            header_read_timeout: Duration::from_secs(30),
            handshake_timeout: Duration::from_secs(10),
            h2_keepalive: Duration::from_secs(30),
        }
    }
}

/// Connections that have not sent a request yet (in their TLS handshake or before their
/// first request's headers), oldest first. At the connection limit the oldest of them is
/// closed to make room for a new one: clients that connect and say nothing cannot crowd out
/// the rest, and a connection that has served a request is never shed this way.
#[derive(Debug, Default)]
pub struct Unproven {
    next: std::sync::atomic::AtomicU64,
    waiting: std::sync::Mutex<std::collections::BTreeMap<u64, CancellationToken>>,
}

/// A connection's place in [`Unproven`], left at its first request or when it ends.
#[derive(Debug)]
pub struct UnprovenEntry {
    set: Arc<Unproven>,
    id: u64,
    /// Cancelled when the connection is shed.
    pub shed: CancellationToken,
}

impl Unproven {
    /// Registers a new connection.
    pub fn enter(self: &Arc<Self>) -> UnprovenEntry {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let shed = CancellationToken::new();
        self.lock().insert(id, shed.clone());
        UnprovenEntry {
            set: self.clone(),
            id,
            shed,
        }
    }

    /// Closes the oldest connection that has not sent a request; false when there is none.
    pub fn shed_oldest(&self) -> bool {
        match self.lock().pop_first() {
            Some((_, shed)) => {
                shed.cancel();
                true
            }
            None => false,
        }
    }

    /// How many connections have not sent a request.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether every connection has sent a request.
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

impl UnprovenEntry {
    /// The connection sent a request: it is no longer shed at the limit.
    pub fn proven(&self) {
        self.set.lock().remove(&self.id);
    }
}

impl Drop for UnprovenEntry {
    fn drop(&mut self) {
        self.proven();
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
    let unproven = Arc::new(Unproven::default());
    loop {
        // At the limit with every connection serving requests, leave new ones in the
        // kernel's backlog until one closes.
        if slots.available_permits() == 0 && unproven.is_empty() {
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
                if unproven.shed_oldest() {
                    tracing::debug!(%remote, "At the connection limit: closed the oldest connection without a request");
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
        let entry = unproven.enter();
        let _ = tcp.set_nodelay(true);
        let acceptor = TlsAcceptor::from(tls.get());
        let router = router.clone();
        let auth = auth.clone();
        let shutdown = shutdown.clone();
        tracker.spawn(async move {
            let _slot = slot;
            let shed = entry.shed.clone();
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
            let entry = Arc::new(entry);
            let svc = hyper::service::service_fn(
                move |mut req: hyper::Request<hyper::body::Incoming>| {
                    entry.proven();
                    req.extensions_mut().insert(peer.clone());
                    let router = router.clone();
                    async move { router.oneshot(req.map(axum::body::Body::new)).await }
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
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(tls), svc);
            tokio::pin!(conn);
            tokio::select! {
                res = conn.as_mut() => {
                    if let Err(e) = res {
                        tracing::debug!(%remote, error = %e, "Connection ended with error");
                    }
                }
                // Cancelled only while no request has come: nothing to finish.
                _ = shed.cancelled() => {}
                _ = shutdown.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), conn).await;
                }
            }
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
    fn the_oldest_connection_without_a_request_is_shed_first() {
        let set = Arc::new(Unproven::default());
        let a = set.enter();
        let b = set.enter();
        let c = set.enter();
        assert_eq!(set.len(), 3);
        // `a` sent a request: never shed at the limit.
        a.proven();
        assert!(set.shed_oldest());
        assert!(!a.shed.is_cancelled());
        assert!(b.shed.is_cancelled());
        assert!(!c.shed.is_cancelled());
        // A connection that ends leaves the set.
        drop(c);
        assert!(set.is_empty());
        assert!(!set.shed_oldest());
    }
}
