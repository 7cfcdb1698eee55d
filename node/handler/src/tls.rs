//! virt-handler's TLS: the server configuration (client certificates required and verified
//! against the handler CA bundle), rebuilt when its files change, and the peer's name, which
//! decides what a verified peer may do (docs/node.md, "Identities between the nodes").

use std::path::PathBuf;
use std::sync::Arc;

use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// TLS setup failures.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file does not hold what it should.
    #[error("{what}: invalid or empty PEM")]
    Pem {
        /// Which input.
        what: &'static str,
    },
    /// rustls refused the configuration.
    #[error("building the TLS configuration")]
    Rustls(#[from] rustls::Error),
    /// The client CA cannot be used for verification.
    #[error("client CA")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

/// rustls server configuration: our certificate, and client certificates required and
/// verified against `client_ca_pem` (a bundle). HTTP/1.1 only: websockets upgrade there.
pub fn tls_config(
    cert_pem: &[u8],
    key_pem: &[u8],
    client_ca_pem: &[u8],
) -> Result<rustls::ServerConfig, TlsError> {
    use rustls_pki_types::pem::PemObject;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|_| TlsError::Pem { what: "--tls-cert" })?;
    if certs.is_empty() {
        return Err(TlsError::Pem { what: "--tls-cert" });
    }
    let key =
        PrivateKeyDer::from_pem_slice(key_pem).map_err(|_| TlsError::Pem { what: "--tls-key" })?;
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(client_ca_pem) {
        let c = c.map_err(|_| TlsError::Pem {
            what: "--client-ca",
        })?;
        roots.add(c)?;
    }
    if roots.is_empty() {
        return Err(TlsError::Pem {
            what: "--client-ca",
        });
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// The files of the server's TLS material (a mounted Secret).
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// Serving certificate (PEM).
    pub cert: PathBuf,
    /// Its key (PEM).
    pub key: PathBuf,
    /// CA bundle for client certificates (PEM).
    pub client_ca: PathBuf,
}

/// Reading the TLS files failed.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct TlsLoadError(#[from] virt_certs::reload::ReloadError);

/// The server's TLS configuration. Built from files, it is rebuilt when one of them
/// changes (checked at each new connection, which is rare here): a rotated Secret takes
/// effect without a restart, so open consoles survive a rotation. A half-written update
/// keeps the previous configuration.
#[derive(Clone, Debug)]
pub struct TlsSource(Arc<virt_certs::reload::Reloading<rustls::ServerConfig>>);

const TLS_WHAT: &str = "virt-handler TLS (--tls-cert, --tls-key, --client-ca)";

impl TlsSource {
    /// A configuration that never changes.
    pub fn fixed(cfg: rustls::ServerConfig) -> Self {
        Self(Arc::new(virt_certs::reload::Reloading::fixed(
            TLS_WHAT, cfg,
        )))
    }

    /// Loads `files` (and reloads them when they change).
    pub fn from_files(files: TlsFiles) -> Result<Self, TlsLoadError> {
        let paths = vec![files.cert, files.key, files.client_ca];
        let r = virt_certs::reload::Reloading::new(TLS_WHAT, paths, |c| {
            Ok(tls_config(&c[0], &c[1], &c[2])?)
        })?;
        Ok(Self(Arc::new(r)))
    }

    /// The configuration for a new connection.
    pub(crate) fn get(&self) -> Arc<rustls::ServerConfig> {
        let cfg = self.0.get();
        if let Some(e) = self.0.last_error() {
            tracing::warn!(error = %e, "TLS files changed but cannot be loaded; keeping the previous ones");
        }
        cfg
    }
}

/// The common name of a TLS peer's certificate.
pub fn peer_name<D>(conn: &rustls::ConnectionCommon<D>) -> Option<String> {
    let cert = conn.peer_certificates()?.first()?;
    virt_certs::node_identity::peer_common_name(cert.as_ref())
}
