//! The migration tunnel between two virt-handlers (KubeVirt's migration proxy, with
//! mutual TLS always on).
//!
//! The launchers' private libvirtds and QEMUs only ever see unix sockets in their
//! migration directory (`<socket dir>/migration`, bound on
//! [`MIGRATION_NS_DIR`](virt_domain::protocol::MIGRATION_NS_DIR) inside the daemon's
//! namespace). On the source, [`SourceProxy`] listens on `libvirt.sock`, `memory.sock` and
//! `disks.sock` there; each connection is carried over one TLS connection to the target
//! handler's [`TargetProxy`], which connects it to the socket of the same name in the
//! target's migration directory (the target libvirtd's relay, QEMU's incoming
//! migration and NBD listeners). The first line on each TLS connection names the stream;
//! nothing else is accepted. Both ends present certificates of the handlers' CA, so no
//! unauthenticated port ever carries a guest's memory or a libvirt connection.

use std::net::SocketAddr;
use std::sync::Arc;

use rustls_pki_types::ServerName;
use tokio::io::{AsyncBufReadExt, AsyncReadExt as _, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::task::JoinSet;
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_util::sync::CancellationToken;
use virt_domain::protocol::MigrationStream;

use crate::launcher_fs::SocketsDir;

/// ALPN protocol of the tunnel, so a migration connection is never mistaken for HTTP.
pub const ALPN: &[u8] = b"kubevirt-rs-migration/1";

/// Errors setting up a proxy.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// A socket could not be bound.
    #[error("binding {what}: {source}")]
    Bind {
        /// Which socket.
        what: String,
        /// Cause.
        source: std::io::Error,
    },
    /// TLS configuration.
    #[error("TLS configuration: {0}")]
    Tls(String),
    /// The target's facts could not be read through the tunnel.
    #[error("reading the migration target's facts from {target}: {message}")]
    Fetch {
        /// Target proxy address.
        target: SocketAddr,
        /// What went wrong.
        message: String,
    },
}

/// Server side TLS for the target proxy: the handler's certificate, client certificates
/// of `ca_pem` required.
pub fn server_tls(
    cert_pem: &[u8],
    key_pem: &[u8],
    ca_pem: &[u8],
) -> Result<Arc<rustls::ServerConfig>, ProxyError> {
    let mut cfg = crate::tls::tls_config(cert_pem, key_pem, ca_pem)
        .map_err(|e| ProxyError::Tls(e.to_string()))?;
    cfg.alpn_protocols = vec![ALPN.to_vec()];
    Ok(Arc::new(cfg))
}

/// Client side TLS for the source proxy: our certificate (it needs the clientAuth
/// usage), the target verified against `ca_pem`.
pub fn client_tls(
    cert_pem: &[u8],
    key_pem: &[u8],
    ca_pem: &[u8],
) -> Result<Arc<rustls::ClientConfig>, ProxyError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let bad = |what: &str| ProxyError::Tls(format!("{what} is not PEM"));
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|_| bad("certificate"))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|_| bad("key"))?;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem) {
        roots
            .add(c.map_err(|_| bad("CA"))?)
            .map_err(|e| ProxyError::Tls(e.to_string()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ProxyError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)
        .map_err(|e| ProxyError::Tls(e.to_string()))?;
    cfg.alpn_protocols = vec![ALPN.to_vec()];
    Ok(Arc::new(cfg))
}

/// The target end: a TLS listener that connects streams to the target launcher's
/// migration directory. Stops (and cuts every connection) when dropped or closed.
#[derive(Debug)]
pub struct TargetProxy {
    addr: SocketAddr,
    stop: CancellationToken,
}

impl TargetProxy {
    /// Listens on `listen` (port 0: any) for the migration into `dir`, from the peer whose
    /// certificate's common name is `source` (the source node's handler) only.
    pub async fn start(
        listen: SocketAddr,
        tls: Arc<rustls::ServerConfig>,
        dir: Arc<SocketsDir>,
        source: String,
    ) -> Result<Self, ProxyError> {
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| ProxyError::Bind {
                what: listen.to_string(),
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| ProxyError::Bind {
            what: listen.to_string(),
            source,
        })?;
        let stop = CancellationToken::new();
        let acceptor = TlsAcceptor::from(tls);
        let token = stop.clone();
        tokio::spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                tokio::select! {
                    _ = token.cancelled() => break,
                    accepted = listener.accept() => {
                        let Ok((tcp, peer)) = accepted else { continue };
                        let _ = tcp.set_nodelay(true);
                        conns.spawn(target_conn(acceptor.clone(), tcp, peer, dir.clone(), source.clone()));
                    }
                    Some(_) = conns.join_next(), if !conns.is_empty() => {}
                }
            }
            conns.abort_all();
        });
        Ok(Self { addr, stop })
    }

    /// Where the source proxy connects.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops listening and cuts every stream (cancel or failure: the migration fails
    /// and the source keeps the guest).
    pub fn close(&self) {
        self.stop.cancel();
    }
}

impl Drop for TargetProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn target_conn(
    acceptor: TlsAcceptor,
    tcp: TcpStream,
    peer: SocketAddr,
    dir: Arc<SocketsDir>,
    source: String,
) {
    let tls = match acceptor.accept(tcp).await {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(%peer, error = %e, "migration proxy: TLS handshake refused");
            return;
        }
    };
    // Every handler's certificate chains to the same CA: only the source node's may send
    // this guest's memory and reach the target's libvirt.
    let name = crate::tls::peer_name(tls.get_ref().1);
    if name.as_deref() != Some(source.as_str()) {
        tracing::warn!(%peer, client = name.as_deref().unwrap_or("?"), expected = %source, "migration proxy: not the source node's handler, refused");
        return;
    }
    let mut tls = BufReader::new(tls);
    let mut header = String::new();
    // One short line names the stream; a peer that sends more is not ours.
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        (&mut tls).take(64).read_line(&mut header),
    )
    .await;
    if matches!(read, Ok(Ok(_))) && header.trim_end() == TARGET_FILE {
        // The prepared target's facts, written by the target handler next to the sockets.
        let read = tokio::task::spawn_blocking(move || dir.read(TARGET_FILE, 64 * 1024)).await;
        match read
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
        {
            Ok(b) => {
                let _ = tls.get_mut().write_all(&b).await;
                let _ = tls.get_mut().shutdown().await;
            }
            Err(e) => tracing::warn!(%peer, error = %e, "migration proxy: no target facts"),
        }
        return;
    }
    let Some(stream) = matches!(read, Ok(Ok(_)))
        .then(|| MigrationStream::from_name(header.trim_end()))
        .flatten()
    else {
        tracing::warn!(%peer, header = header.trim_end(), "migration proxy: unknown stream");
        return;
    };
    let mut unix = match dir.connect(stream.socket_name()).await {
        Ok(u) => u,
        Err(e) => {
            tracing::warn!(error = %e, "migration proxy: target socket");
            return;
        }
    };
    tracing::debug!(%peer, ?stream, "migration stream in");
    if let Err(e) =
        tokio::io::copy_bidirectional_with_sizes(&mut tls, &mut unix, STREAM_BUF, STREAM_BUF).await
    {
        tracing::debug!(?stream, error = %e, "migration stream ended");
    }
}

/// Copy buffer of a migration stream, each way: memory and disk copies are bulk
/// streams of up to gigabytes, and tokio's default 8 KiB means a read, a TLS record and a
/// write per 8 KiB.
const STREAM_BUF: usize = 256 << 10;

/// File in the target's migration directory holding its
/// [`MigrationTarget`](virt_domain::protocol::MigrationTarget) (JSON); the source handler
/// reads it through the tunnel ([`fetch_target`]) before starting the migration, since
/// the target launcher's work directory is known only on its node.
pub const TARGET_FILE: &str = "target.json";

/// Reads the prepared target's facts from the target proxy at `target`.
pub async fn fetch_target(
    target: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
    server_name: ServerName<'static>,
) -> Result<virt_domain::protocol::MigrationTarget, ProxyError> {
    let io = |e: std::io::Error| ProxyError::Fetch {
        target,
        message: e.to_string(),
    };
    let fut = async {
        let tcp = TcpStream::connect(target).await.map_err(io)?;
        let mut tls = TlsConnector::from(tls)
            .connect(server_name, tcp)
            .await
            .map_err(io)?;
        tls.write_all(format!("{TARGET_FILE}\n").as_bytes())
            .await
            .map_err(io)?;
        let mut buf = Vec::new();
        (&mut tls)
            .take(64 * 1024)
            .read_to_end(&mut buf)
            .await
            .map_err(io)?;
        serde_json::from_slice(&buf).map_err(|e| ProxyError::Fetch {
            target,
            message: e.to_string(),
        })
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), fut)
        .await
        .map_err(|_| io(std::io::ErrorKind::TimedOut.into()))?
}

/// The source end: unix listeners in the source launcher's migration directory, each
/// connection tunnelled to the target proxy. Stops, cuts every stream and removes its
/// sockets when dropped or closed.
#[derive(Debug)]
pub struct SourceProxy {
    dir: Arc<SocketsDir>,
    stop: CancellationToken,
}

impl SourceProxy {
    /// Listens in `dir` for the migration to `target` (verified as `server_name`).
    pub fn start(
        dir: Arc<SocketsDir>,
        target: SocketAddr,
        tls: Arc<rustls::ClientConfig>,
        server_name: ServerName<'static>,
    ) -> Result<Self, ProxyError> {
        let bind_err = |name: &str, e: crate::launcher_fs::LauncherFsError| ProxyError::Bind {
            what: name.to_string(),
            source: e.into_io(),
        };
        let stop = CancellationToken::new();
        let connector = TlsConnector::from(tls);
        for stream in MigrationStream::ALL {
            let name = stream.socket_name();
            dir.remove(name).map_err(|e| bind_err(name, e))?;
            let path = dir.bind_path(name).map_err(|e| bind_err(name, e))?;
            let listener = UnixListener::bind(&path).map_err(|source| ProxyError::Bind {
                what: name.to_string(),
                source,
            })?;
            // The launcher's libvirt and QEMU connect as the unprivileged launcher user;
            // the directory is the pod's own, so nobody else reaches the socket.
            dir.chmod_socket(name, 0o666)
                .map_err(|e| bind_err(name, e))?;
            let dir = dir.clone();
            let (token, connector, name) = (stop.clone(), connector.clone(), server_name.clone());
            tokio::spawn(async move {
                let mut conns = JoinSet::new();
                loop {
                    tokio::select! {
                        _ = token.cancelled() => break,
                        accepted = listener.accept() => {
                            let Ok((unix, _)) = accepted else { continue };
                            conns.spawn(source_conn(unix, stream, target, connector.clone(), name.clone()));
                        }
                        Some(_) = conns.join_next(), if !conns.is_empty() => {}
                    }
                }
                conns.abort_all();
                let _ = dir.remove(stream.socket_name());
            });
        }
        Ok(Self { dir, stop })
    }

    /// Stops and cuts every stream.
    pub fn close(&self) {
        self.stop.cancel();
        remove_sockets(&self.dir);
    }
}

fn remove_sockets(dir: &SocketsDir) {
    for s in MigrationStream::ALL {
        let _ = dir.remove(s.socket_name());
    }
}

impl Drop for SourceProxy {
    fn drop(&mut self) {
        self.close();
    }
}

async fn source_conn(
    mut unix: UnixStream,
    stream: MigrationStream,
    target: SocketAddr,
    connector: TlsConnector,
    name: ServerName<'static>,
) {
    let tcp = match TcpStream::connect(target).await {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(%target, error = %e, "migration proxy: connecting to the target");
            return;
        }
    };
    let _ = tcp.set_nodelay(true);
    let mut tls = match connector.connect(name, tcp).await {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(%target, error = %e, "migration proxy: TLS to the target");
            return;
        }
    };
    let header = format!("{}\n", stream.socket_name());
    if tls.write_all(header.as_bytes()).await.is_err() {
        return;
    }
    tracing::debug!(%target, ?stream, "migration stream out");
    if let Err(e) =
        tokio::io::copy_bidirectional_with_sizes(&mut unix, &mut tls, STREAM_BUF, STREAM_BUF).await
    {
        tracing::debug!(?stream, error = %e, "migration stream ended");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::path::Path;
    use tokio::io::AsyncReadExt;

    struct Pki {
        server: Arc<rustls::ServerConfig>,
        client: Arc<rustls::ClientConfig>,
        rogue: Arc<rustls::ClientConfig>,
        impostor: Arc<rustls::ClientConfig>,
    }

    /// The handlers of node-a (source) and node-b (target); a handler of another CA; the
    /// handler of node-c, of the same CA.
    fn pki() -> Pki {
        let v = time::Duration::days(1);
        let ca = virt_certs::Ca::generate("kubevirt-rs-ca", v).unwrap();
        let other = virt_certs::Ca::generate("someone-else", v).unwrap();
        let handler = |ca: &virt_certs::Ca, node: &str| {
            let c = ca.issue_handler(node, v).unwrap();
            (c.cert_pem, c.key_pem)
        };
        let (a, b, r, c) = (
            handler(&ca, "node-a"),
            handler(&ca, "node-b"),
            handler(&other, "node-a"),
            handler(&ca, "node-c"),
        );
        let ca_pem = ca.cert_pem().as_bytes();
        let client = |(cert, key): &(String, String)| {
            client_tls(cert.as_bytes(), key.as_bytes(), ca_pem).unwrap()
        };
        Pki {
            server: server_tls(b.0.as_bytes(), b.1.as_bytes(), ca_pem).unwrap(),
            client: client(&a),
            rogue: client(&r),
            impostor: client(&c),
        }
    }

    /// An echo server on `dir/<stream socket>`, counting connections.
    fn echo(dir: &Path, stream: MigrationStream) -> Arc<std::sync::atomic::AtomicUsize> {
        let n = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let l = UnixListener::bind(dir.join(stream.socket_name())).unwrap();
        let count = n.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        n
    }

    #[tokio::test]
    async fn streams_pass_only_from_the_source_nodes_handler() {
        let pki = pki();
        let (src, dst) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let hits = echo(dst.path(), MigrationStream::Memory);
        let target = TargetProxy::start(
            "127.0.0.1:0".parse().unwrap(),
            pki.server.clone(),
            Arc::new(SocketsDir::at(dst.path()).unwrap()),
            virt_certs::node_identity::common_name("node-a"),
        )
        .await
        .unwrap();
        let name = ServerName::try_from("node-b").unwrap();
        let source = SourceProxy::start(
            Arc::new(SocketsDir::at(src.path()).unwrap()),
            target.addr(),
            pki.client.clone(),
            name.clone(),
        )
        .unwrap();
        // Through the tunnel: what QEMU writes to memory.sock comes back from the target.
        let mut s = UnixStream::connect(src.path().join("memory.sock"))
            .await
            .unwrap();
        s.write_all(b"guest pages").await.unwrap();
        let mut buf = [0u8; 11];
        s.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"guest pages");
        assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);

        // A client of another CA never gets a stream.
        let tcp = TcpStream::connect(target.addr()).await.unwrap();
        let rogue = TlsConnector::from(pki.rogue.clone())
            .connect(name.clone(), tcp)
            .await;
        if let Ok(mut t) = rogue {
            // TLS 1.3: the refusal arrives with the first read.
            let _ = t.write_all(b"memory.sock\nx").await;
            let mut b = [0u8; 1];
            assert!(matches!(t.read(&mut b).await, Ok(0) | Err(_)));
        }
        // Nor does the handler of another node, although its CA is the same.
        let tcp = TcpStream::connect(target.addr()).await.unwrap();
        let mut t = TlsConnector::from(pki.impostor.clone())
            .connect(name.clone(), tcp)
            .await
            .unwrap();
        let _ = t.write_all(b"memory.sock\nx").await;
        let mut b = [0u8; 1];
        assert!(matches!(t.read(&mut b).await, Ok(0) | Err(_)));
        assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);
        // And a source expecting another node's handler does not talk to this one.
        let tcp = TcpStream::connect(target.addr()).await.unwrap();
        assert!(
            TlsConnector::from(pki.client.clone())
                .connect(ServerName::try_from("node-c").unwrap(), tcp)
                .await
                .is_err()
        );
        // Nor does an unknown stream name from a good client.
        let tcp = TcpStream::connect(target.addr()).await.unwrap();
        let mut t = TlsConnector::from(pki.client.clone())
            .connect(name.clone(), tcp)
            .await
            .unwrap();
        t.write_all(b"../../etc/passwd\nx").await.unwrap();
        let mut b = [0u8; 1];
        assert!(matches!(t.read(&mut b).await, Ok(0) | Err(_)));
        assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);

        // The target's facts come through the tunnel, to a client of the CA only.
        let facts = virt_domain::protocol::MigrationTarget {
            work_dir: "/var/run/kubevirt-rs/work/virt-launcher-x".into(),
            console_socket: "/var/run/kubevirt-rs/sockets/console.sock".into(),
            vnc_socket: None,
        };
        std::fs::write(
            dst.path().join(TARGET_FILE),
            serde_json::to_vec(&facts).unwrap(),
        )
        .unwrap();
        let got = fetch_target(target.addr(), pki.client.clone(), name.clone())
            .await
            .unwrap();
        assert_eq!(got, facts);
        for stranger in [&pki.rogue, &pki.impostor] {
            assert!(
                fetch_target(target.addr(), stranger.clone(), name.clone())
                    .await
                    .is_err()
            );
        }

        // Closing the source proxy removes its sockets and cuts the stream.
        source.close();
        assert!(!src.path().join("memory.sock").exists());
        let mut b = [0u8; 1];
        let cut = tokio::time::timeout(std::time::Duration::from_secs(5), s.read(&mut b)).await;
        assert!(matches!(cut, Ok(Ok(0) | Err(_))), "{cut:?}");
    }
}
