//! This handler's own certificate ([`virt_certs::node_identity`]): a key generated here, a
//! certificate asked for with a CertificateSigningRequest and signed by virt-operator for this
//! node only, both kept in a memory-backed directory (`--certificate-dir`) that the TLS server
//! and the migration tunnel read. Renewed at 80 % of its lifetime, or at once when the CA
//! bundle no longer vouches for it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use virt_certs::node_identity::{self, SIGNER_NAME, USAGES};

/// File names in the certificate directory.
pub const CERT_FILE: &str = "tls.crt";
pub const KEY_FILE: &str = "tls.key";
/// How long a request may wait for virt-operator before it is asked again.
const DECISION_WAIT: Duration = Duration::from_secs(120);
const POLL: Duration = Duration::from_millis(500);
const RETRY: Duration = Duration::from_secs(10);
/// How often the certificate is checked against the CA bundle and the published lifetime
/// between renewals (a few small file reads).
const CHECK_EVERY: Duration = Duration::from_secs(30);

/// Why no certificate was obtained.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("creating the key and request: {0}")]
    Certs(#[from] virt_certs::CertError),
    #[error("CertificateSigningRequest: {0}")]
    Kube(#[from] kube::Error),
    #[error("CertificateSigningRequest {name} was {how}: {message}")]
    Refused {
        name: String,
        how: &'static str,
        message: String,
    },
    #[error("CertificateSigningRequest {name} not decided within {}s (is virt-operator running?)", DECISION_WAIT.as_secs())]
    Undecided { name: String },
    #[error("the certificate of CertificateSigningRequest {name} is unusable: {why}")]
    Unusable { name: String, why: String },
}

/// Where the handler of `node` keeps its certificate, and what vouches for it.
#[derive(Debug, Clone)]
pub struct Identity {
    pub node: String,
    pub dir: PathBuf,
    /// The handlers' CA bundle (PEM file).
    pub ca: PathBuf,
}

impl Identity {
    pub fn cert(&self) -> PathBuf {
        self.dir.join(CERT_FILE)
    }

    pub fn key(&self) -> PathBuf {
        self.dir.join(KEY_FILE)
    }

    /// The lifetime virt-operator publishes beside the CA bundle (`None`: not published).
    pub fn lifetime(&self) -> Option<Lifetime> {
        let dir = self.ca.parent()?;
        let secs = |key: &str| -> Option<time::Duration> {
            let s = std::fs::read_to_string(dir.join(key)).ok()?;
            s.trim()
                .parse::<i64>()
                .ok()
                .filter(|s| *s > 0)
                .map(time::Duration::seconds)
        };
        Some(Lifetime {
            duration: secs(DURATION_KEY)?,
            renew_before: secs(RENEW_BEFORE_KEY)?,
        })
    }

    /// When the stored certificate is to be renewed, `None` if it is not usable now.
    pub fn stored_renewal(&self, now: OffsetDateTime) -> Option<OffsetDateTime> {
        let cert = std::fs::read_to_string(self.cert()).ok()?;
        let ca = std::fs::read_to_string(&self.ca).ok()?;
        std::fs::metadata(self.key()).ok()?;
        renewal_point(&cert, &ca, &self.node, self.lifetime(), now)
    }

    /// A usable certificate: the stored one, or a new one asked for and written.
    pub async fn ensure(&self, client: &Client) -> Result<OffsetDateTime, IdentityError> {
        let now = OffsetDateTime::now_utc();
        if let Some(due) = self.stored_renewal(now).filter(|d| *d > now) {
            tracing::info!(node = %self.node, renew_at = %due, "using the stored handler certificate");
            return Ok(due);
        }
        self.obtain(client).await
    }

    /// Asks for a new certificate and writes it (key first: a reader that sees the new
    /// certificate also finds its key); returns when it is due for renewal.
    pub async fn obtain(&self, client: &Client) -> Result<OffsetDateTime, IdentityError> {
        let req = node_identity::request(&self.node)?;
        let api: Api<CertificateSigningRequest> = Api::all(client.clone());
        let csr = CertificateSigningRequest {
            metadata: ObjectMeta {
                generate_name: Some(format!("virt-handler-{}-", self.node)),
                ..ObjectMeta::default()
            },
            spec: CertificateSigningRequestSpec {
                request: ByteString(req.csr_pem.into_bytes()),
                signer_name: SIGNER_NAME.into(),
                usages: Some(USAGES.iter().map(|u| u.to_string()).collect()),
                ..CertificateSigningRequestSpec::default()
            },
            ..CertificateSigningRequest::default()
        };
        let created = api.create(&PostParams::default(), &csr).await?;
        let name = created.metadata.name.clone().unwrap_or_default();
        tracing::info!(csr = %name, node = %self.node, "asked for this handler's certificate");
        let cert = wait_for(&api, &name).await?;
        let ca = std::fs::read_to_string(&self.ca).unwrap_or_default();
        let now = OffsetDateTime::now_utc();
        let due = renewal_point(&cert, &ca, &self.node, self.lifetime(), now).ok_or_else(|| {
            IdentityError::Unusable {
                name: name.clone(),
                why: format!(
                    "it does not name {} or does not chain to {}",
                    node_identity::common_name(&self.node),
                    self.ca.display()
                ),
            }
        })?;
        virt_certs::write_pair(&self.dir, "tls", &cert, &req.key_pem)?;
        tracing::info!(csr = %name, renew_at = %due, "handler certificate in place");
        Ok(due)
    }

    /// Keeps the certificate current until `stop`: renews when due or when the CA bundle no
    /// longer vouches for it; a failed attempt is retried.
    pub async fn renew(self, client: Client, mut due: OffsetDateTime, stop: CancellationToken) {
        loop {
            let now = OffsetDateTime::now_utc();
            let wait = std::time::Duration::try_from(due - now)
                .unwrap_or(Duration::ZERO)
                .min(CHECK_EVERY);
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            let now = OffsetDateTime::now_utc();
            match self.stored_renewal(now) {
                Some(d) if d > now => {
                    due = d;
                    continue;
                }
                _ => {}
            }
            match self.obtain(&client).await {
                Ok(d) => due = d,
                Err(e) => {
                    tracing::warn!(error = %e, "renewing this handler's certificate failed; retrying");
                    due = OffsetDateTime::now_utc() + RETRY;
                }
            }
        }
    }
}

async fn wait_for(
    api: &Api<CertificateSigningRequest>,
    name: &str,
) -> Result<String, IdentityError> {
    let started = std::time::Instant::now();
    loop {
        let csr = api.get(name).await?;
        let status = csr.status.unwrap_or_default();
        for c in status.conditions.iter().flatten() {
            let how = match c.type_.as_str() {
                "Denied" => "denied",
                "Failed" => "failed",
                _ => continue,
            };
            return Err(IdentityError::Refused {
                name: name.to_string(),
                how,
                message: format!(
                    "{}: {}",
                    c.reason.clone().unwrap_or_default(),
                    c.message.clone().unwrap_or_default()
                ),
            });
        }
        if let Some(cert) = status.certificate.filter(|c| !c.0.is_empty()) {
            return String::from_utf8(cert.0).map_err(|_| IdentityError::Unusable {
                name: name.to_string(),
                why: "not PEM text".into(),
            });
        }
        if started.elapsed() > DECISION_WAIT {
            return Err(IdentityError::Undecided {
                name: name.to_string(),
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// How long handler certificates live and when they are renewed, as virt-operator publishes
/// it from the KubeVirt resource's `certificateRotateStrategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetime {
    pub duration: time::Duration,
    pub renew_before: time::Duration,
}

/// Keys of the lifetime beside the CA bundle (virt-operator's handler CA ConfigMap).
pub const DURATION_KEY: &str = "duration-seconds";
pub const RENEW_BEFORE_KEY: &str = "renew-before-seconds";
/// A certificate living longer than the published duration by more than this was issued
/// before the duration was shortened: renewed at once.
const LONGER_THAN_PUBLISHED: time::Duration = time::Duration::minutes(1);

/// When `cert_pem` is to be renewed, if it is the handler certificate of `node` and `ca_pem`
/// vouches for it at `now`: `renewBefore` ahead of its end (at once if it outlives the
/// published duration), or at 80 % of its lifetime when nothing is published.
pub fn renewal_point(
    cert_pem: &str,
    ca_pem: &str,
    node: &str,
    lifetime: Option<Lifetime>,
    now: OffsetDateTime,
) -> Option<OffsetDateTime> {
    let want = node_identity::common_name(node);
    if node_identity::common_name_of_pem(cert_pem).as_deref() != Some(want.as_str()) {
        return None;
    }
    if !virt_certs::verifies(cert_pem, &[ca_pem], virt_certs::Usage::Server, now) {
        return None;
    }
    let (nb, na) = virt_certs::validity_of(cert_pem).ok()?;
    Some(match lifetime {
        Some(l) if na - now > l.duration + LONGER_THAN_PUBLISHED => now,
        Some(l) => na - l.renew_before,
        None => nb + (na - nb) * virt_certs::DEFAULT_ROTATION_FRACTION,
    })
}

/// The directory exists and only its owner can read it.
pub fn prepare_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use virt_certs::{Ca, DEFAULT_CA_VALIDITY, DEFAULT_LEAF_VALIDITY};

    #[test]
    fn a_stored_certificate_counts_only_for_its_node_and_its_ca() {
        let ca = Ca::generate("ca", DEFAULT_CA_VALIDITY).unwrap();
        let other = Ca::generate("other", DEFAULT_CA_VALIDITY).unwrap();
        let now = OffsetDateTime::now_utc();
        let req = node_identity::request("node-a").unwrap();
        let signed = ca
            .sign_handler_request(&req.csr_pem, "node-a", DEFAULT_LEAF_VALIDITY, now)
            .unwrap();
        let cert = &signed.cert_pem;
        let due = renewal_point(cert, ca.cert_pem(), "node-a", None, now).unwrap();
        let lifetime = signed.not_after - signed.not_before;
        assert!(due > now && due < signed.not_after - lifetime * 0.19);
        assert!(renewal_point(cert, ca.cert_pem(), "node-b", None, now).is_none());
        assert!(renewal_point(cert, other.cert_pem(), "node-a", None, now).is_none());
        let bundle = virt_certs::ca_bundle(&[other.cert_pem(), ca.cert_pem()]).unwrap();
        assert!(renewal_point(cert, &bundle, "node-a", None, now).is_some());
        let later = signed.not_after + time::Duration::minutes(1);
        assert!(renewal_point(cert, ca.cert_pem(), "node-a", None, later).is_none());
        // The published lifetime: renewBefore ahead of the end; at once when the duration
        // was shortened below what this certificate lives.
        let published = Lifetime {
            duration: DEFAULT_LEAF_VALIDITY,
            renew_before: time::Duration::days(3),
        };
        assert_eq!(
            renewal_point(cert, ca.cert_pem(), "node-a", Some(published), now),
            Some(virt_certs::validity_of(cert).unwrap().1 - time::Duration::days(3))
        );
        let shortened = Lifetime {
            duration: time::Duration::minutes(4),
            renew_before: time::Duration::minutes(3),
        };
        assert_eq!(
            renewal_point(cert, ca.cert_pem(), "node-a", Some(shortened), now),
            Some(now)
        );
    }
}
