//! Certificate authority, serving and client certificates for kubevirt-rs.
//!
//! Everything is done in-process with `rcgen` (ECDSA P-256) so that no
//! component needs an `openssl` binary at run time. Rotation is split into a
//! pure decision ([`needs_rotation`]) and a trust bundle helper
//! ([`ca_bundle`]) so that callers can keep trusting the previous CA while
//! leaves signed by it are still in use.

pub mod node_identity;
pub mod reload;

use std::fs;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use time::{Duration, OffsetDateTime};

/// Default lifetime of a CA certificate.
pub const DEFAULT_CA_VALIDITY: Duration = Duration::days(365);
/// Default lifetime of a leaf (serving or client) certificate.
pub const DEFAULT_LEAF_VALIDITY: Duration = Duration::days(30);
/// Default point in a certificate's lifetime at which it is rotated.
pub const DEFAULT_ROTATION_FRACTION: f64 = 0.8;

/// Certificates are valid from slightly in the past so that peers whose
/// clocks lag ours do not reject a freshly issued certificate.
const CLOCK_SKEW_ALLOWANCE: Duration = Duration::minutes(5);

const PEM_CERT_BEGIN: &str = "-----BEGIN CERTIFICATE-----";
const PEM_CERT_END: &str = "-----END CERTIFICATE-----";

/// Errors from creating, loading or writing certificates.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("invalid subject alternative name {name:?}: {source}")]
    InvalidSan { name: String, source: rcgen::Error },
    #[error("validity must be positive, got {0}")]
    InvalidValidity(Duration),
    #[error("loaded certificate is not a CA (basic constraints CA:FALSE or missing)")]
    NotACa,
    #[error("CA private key does not match the CA certificate")]
    KeyMismatch,
    #[error("at most {MAX_ORGANISATIONS} organisations (O) are supported, got {0}")]
    TooManyOrganisations(usize),
    #[error("not a PEM certificate signing request with a valid signature")]
    BadRequest,
    #[error("the request must name {want}, it names {got}")]
    RequestNames { want: String, got: String },
    #[error("no PEM certificate found in input")]
    NoCertificate,
    #[error("writing {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

pub type Result<T, E = CertError> = std::result::Result<T, E>;

/// A leaf certificate and its private key, PEM encoded.
#[derive(Clone)]
pub struct IssuedCert {
    pub cert_pem: String,
    pub key_pem: String,
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
}

// The private key must never end up in logs through `{:?}`.
impl std::fmt::Debug for IssuedCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedCert")
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .field("key_pem", &"<redacted>")
            .finish_non_exhaustive()
    }
}

impl IssuedCert {
    /// Whether this certificate should be replaced at `now`.
    pub fn needs_rotation(&self, now: OffsetDateTime, fraction: f64) -> bool {
        needs_rotation(self.not_before, self.not_after, now, fraction)
    }

    /// Writes `<name>.crt` (0644) and `<name>.key` (0600) into `dir`.
    pub fn write_pair(&self, dir: &Path, name: &str) -> Result<(PathBuf, PathBuf)> {
        write_pair(dir, name, &self.cert_pem, &self.key_pem)
    }
}

/// A certificate authority able to sign leaf certificates.
pub struct Ca {
    // rcgen signs with the issuer's parameters (DN, key identifier); for a
    // loaded CA these are re-derived from the PEM, so `cert` may differ
    // byte-wise from `cert_pem`, which is what peers actually trust.
    cert: Certificate,
    key: KeyPair,
    cert_pem: String,
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca")
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl Ca {
    /// Creates a new self-signed CA valid for `validity` from now.
    pub fn generate(common_name: &str, validity: Duration) -> Result<Self> {
        Self::generate_at(common_name, validity, OffsetDateTime::now_utc())
    }

    /// Like [`Ca::generate`] but with an explicit clock, for tests and for
    /// callers that need reproducible validity windows.
    pub fn generate_at(common_name: &str, validity: Duration, now: OffsetDateTime) -> Result<Self> {
        check_validity(validity)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(common_name, &[])?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.not_before = now - CLOCK_SKEW_ALLOWANCE;
        params.not_after = now + validity;
        let (not_before, not_after) = (params.not_before, params.not_after);
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        let cert_pem = cert.pem();
        Ok(Self {
            cert,
            key,
            cert_pem,
            not_before,
            not_after,
        })
    }

    /// Loads an existing CA from its PEM certificate and PEM (PKCS#8) key.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self> {
        let key = KeyPair::from_pem(key_pem)?;
        let params = CertificateParams::from_ca_cert_pem(cert_pem)?;
        if !matches!(params.is_ca, IsCa::Ca(_)) {
            return Err(CertError::NotACa);
        }
        let (not_before, not_after) = (params.not_before, params.not_after);
        let cert = params.self_signed(&key)?;
        if !key_matches_cert(cert_pem, &key)? {
            return Err(CertError::KeyMismatch);
        }
        Ok(Self {
            cert,
            key,
            cert_pem: cert_pem.to_owned(),
            not_before,
            not_after,
        })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn key_pem(&self) -> String {
        self.key.serialize_pem()
    }

    pub fn not_before(&self) -> OffsetDateTime {
        self.not_before
    }

    pub fn not_after(&self) -> OffsetDateTime {
        self.not_after
    }

    pub fn needs_rotation(&self, now: OffsetDateTime, fraction: f64) -> bool {
        needs_rotation(self.not_before, self.not_after, now, fraction)
    }

    /// Writes `<name>.crt` (0644) and `<name>.key` (0600) into `dir`.
    pub fn write_pair(&self, dir: &Path, name: &str) -> Result<(PathBuf, PathBuf)> {
        write_pair(dir, name, &self.cert_pem, &self.key.serialize_pem())
    }

    /// Issues a TLS serving certificate. Each SAN that parses as an IP
    /// address becomes an IP SAN, everything else a DNS SAN.
    pub fn issue_server<S: AsRef<str>>(
        &self,
        common_name: &str,
        sans: &[S],
        validity: Duration,
    ) -> Result<IssuedCert> {
        self.issue_server_at(common_name, sans, validity, OffsetDateTime::now_utc())
    }

    pub fn issue_server_at<S: AsRef<str>>(
        &self,
        common_name: &str,
        sans: &[S],
        validity: Duration,
        now: OffsetDateTime,
    ) -> Result<IssuedCert> {
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(common_name, &[])?;
        params.subject_alt_names = sans
            .iter()
            .map(|s| parse_san(s.as_ref()))
            .collect::<Result<_>>()?;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params, validity, now)
    }

    /// Issues a certificate valid for both server and client auth, for
    /// components that talk mTLS in both directions (virt-handler ⇄
    /// virt-apiserver) with one identity.
    pub fn issue_peer<S: AsRef<str>>(
        &self,
        common_name: &str,
        sans: &[S],
        validity: Duration,
    ) -> Result<IssuedCert> {
        self.issue_peer_at(common_name, sans, validity, OffsetDateTime::now_utc())
    }

    /// [`Self::issue_peer`] as of `now` (rotation decides with its own clock).
    pub fn issue_peer_at<S: AsRef<str>>(
        &self,
        common_name: &str,
        sans: &[S],
        validity: Duration,
        now: OffsetDateTime,
    ) -> Result<IssuedCert> {
        let mut params = CertificateParams::default();
        params.distinguished_name = dn(common_name, &[])?;
        params.subject_alt_names = sans
            .iter()
            .map(|s| parse_san(s.as_ref()))
            .collect::<Result<_>>()?;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        self.sign(params, validity, now)
    }

    /// Issues a TLS client certificate. Kubernetes maps the CN to the user
    /// name and each O to a group, which is how RBAC sees the client. At
    /// most [`MAX_ORGANISATIONS`] organisations are supported.
    pub fn issue_client<S: AsRef<str>>(
        &self,
        common_name: &str,
        organisations: &[S],
        validity: Duration,
    ) -> Result<IssuedCert> {
        self.issue_client_at(
            common_name,
            organisations,
            validity,
            OffsetDateTime::now_utc(),
        )
    }

    pub fn issue_client_at<S: AsRef<str>>(
        &self,
        common_name: &str,
        organisations: &[S],
        validity: Duration,
        now: OffsetDateTime,
    ) -> Result<IssuedCert> {
        let mut params = CertificateParams::default();
        let orgs: Vec<&str> = organisations.iter().map(AsRef::as_ref).collect();
        params.distinguished_name = dn(common_name, &orgs)?;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params, validity, now)
    }

    /// The validity window of a leaf issued at `now`: from slightly in the past, and never
    /// beyond this CA (a leaf outliving its CA would fail verification before its own
    /// rotation point).
    fn window(&self, validity: Duration, now: OffsetDateTime) -> (OffsetDateTime, OffsetDateTime) {
        (
            now - CLOCK_SKEW_ALLOWANCE,
            std::cmp::min(now + validity, self.not_after),
        )
    }

    fn sign(
        &self,
        mut params: CertificateParams,
        validity: Duration,
        now: OffsetDateTime,
    ) -> Result<IssuedCert> {
        check_validity(validity)?;
        params.use_authority_key_identifier_extension = true;
        let (not_before, not_after) = self.window(validity, now);
        params.not_before = not_before;
        params.not_after = not_after;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.cert, &self.key)?;
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            not_before,
            not_after,
        })
    }
}

/// Pure rotation decision: true once `fraction` of the lifetime between
/// `not_before` and `not_after` has elapsed at `now` (or the certificate is
/// already expired or not yet valid). `fraction` is clamped to `0.0..=1.0`.
pub fn needs_rotation(
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
    now: OffsetDateTime,
    fraction: f64,
) -> bool {
    if now < not_before || now >= not_after {
        return true;
    }
    let fraction = if fraction.is_nan() {
        DEFAULT_ROTATION_FRACTION
    } else {
        fraction.clamp(0.0, 1.0)
    };
    let lifetime = not_after - not_before;
    let threshold = not_before + lifetime * fraction;
    now >= threshold
}

/// Reads the validity window of a PEM certificate, for deciding whether a
/// certificate found on disk or in a Secret must be rotated.
pub fn validity_of(cert_pem: &str) -> Result<(OffsetDateTime, OffsetDateTime)> {
    let params = CertificateParams::from_ca_cert_pem(cert_pem)?;
    Ok((params.not_before, params.not_after))
}

/// Whether a PEM certificate may act as a TLS client (extended key usage clientAuth),
/// e.g. a peer certificate from [`Ca::issue_peer`] rather than a serving one: a
/// certificate reused from a Secret may predate a component's need for it.
pub fn has_client_auth(cert_pem: &str) -> Result<bool> {
    let params = CertificateParams::from_ca_cert_pem(cert_pem)?;
    Ok(params
        .extended_key_usages
        .contains(&ExtendedKeyUsagePurpose::ClientAuth))
}

/// What a leaf certificate is checked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    /// TLS server authentication.
    Server,
    /// TLS client authentication.
    Client,
}

/// Whether the PEM certificate `cert_pem` chains to one of the CAs in `cas` (PEM, each may
/// hold several) at `now`, for `usage`.
pub fn verifies(cert_pem: &str, cas: &[&str], usage: Usage, now: OffsetDateTime) -> bool {
    let ders: Vec<CertificateDer<'static>> = cas
        .iter()
        .flat_map(|pem| CertificateDer::pem_slice_iter(pem.as_bytes()))
        .filter_map(std::result::Result::ok)
        .collect();
    let anchors: Vec<_> = ders
        .iter()
        .filter_map(|d| webpki::anchor_from_trusted_cert(d).ok())
        .collect();
    let Ok(leaf) = CertificateDer::from_pem_slice(cert_pem.as_bytes()) else {
        return false;
    };
    let Ok(ee) = webpki::EndEntityCert::try_from(&leaf) else {
        return false;
    };
    let Ok(secs) = u64::try_from(now.unix_timestamp()) else {
        return false;
    };
    let at = rustls_pki_types::UnixTime::since_unix_epoch(std::time::Duration::from_secs(secs));
    let usage = match usage {
        Usage::Server => webpki::KeyUsage::server_auth(),
        Usage::Client => webpki::KeyUsage::client_auth(),
    };
    ee.verify_for_usage(
        webpki::ALL_VERIFICATION_ALGS,
        &anchors,
        &[],
        at,
        usage,
        None,
        None,
    )
    .is_ok()
}

/// Builds a CA bundle from several PEM inputs (each may hold one or more
/// certificates), dropping duplicates while keeping order. During rotation
/// pass `[new_ca, old_ca]` so that leaves signed by either verify.
pub fn ca_bundle<S: AsRef<str>>(pems: &[S]) -> Result<String> {
    let mut seen: Vec<String> = Vec::new();
    for pem in pems {
        for block in pem_cert_blocks(pem.as_ref()) {
            if !seen.contains(&block) {
                seen.push(block);
            }
        }
    }
    if seen.is_empty() {
        return Err(CertError::NoCertificate);
    }
    let mut out = String::new();
    for block in seen {
        out.push_str(&block);
        out.push('\n');
    }
    Ok(out)
}

/// Like [`ca_bundle`] but drops certificates that have expired at `now`, so
/// that a retired CA falls out of the bundle once nothing it signed can be
/// valid any more.
pub fn ca_bundle_pruned<S: AsRef<str>>(pems: &[S], now: OffsetDateTime) -> Result<String> {
    let bundle = ca_bundle(pems)?;
    let mut kept = Vec::new();
    for block in pem_cert_blocks(&bundle) {
        let (_, not_after) = validity_of(&block)?;
        if not_after > now {
            kept.push(block);
        }
    }
    ca_bundle(&kept)
}

/// Writes `<name>.crt` (0644) and `<name>.key` (0600) into `dir`,
/// creating `dir` if needed.
pub fn write_pair(
    dir: &Path,
    name: &str,
    cert_pem: &str,
    key_pem: &str,
) -> Result<(PathBuf, PathBuf)> {
    fs::create_dir_all(dir).map_err(|source| CertError::Io {
        path: dir.to_owned(),
        source,
    })?;
    let cert_path = dir.join(format!("{name}.crt"));
    let key_path = dir.join(format!("{name}.key"));
    write_file(&key_path, key_pem.as_bytes(), 0o600)?;
    write_file(&cert_path, cert_pem.as_bytes(), 0o644)?;
    Ok((cert_path, key_path))
}

fn write_file(path: &Path, contents: &[u8], mode: u32) -> Result<()> {
    let io = |source| CertError::Io {
        path: path.to_owned(),
        source,
    };
    // Write to a sibling temp file created with the final mode, then rename:
    // the key is never readable by others, not even briefly, and readers
    // never see a half-written file.
    let tmp = path.with_extension(format!(
        "{}.tmp",
        path.extension()
            .and_then(|e| e.to_str())
            .unwrap_or_default()
    ));
    let mut opts = fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(mode);
    }
    let mut f = opts.open(&tmp).map_err(io)?;
    #[cfg(unix)]
    {
        // The mode passed to open() is filtered by the umask and ignored
        // when the temp file already existed.
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(io)?;
    }
    #[cfg(not(unix))]
    let _ = mode;
    f.write_all(contents).map_err(io)?;
    f.sync_all().map_err(io)?;
    drop(f);
    fs::rename(&tmp, path).map_err(io)
}

fn check_validity(validity: Duration) -> Result<()> {
    if validity <= Duration::ZERO {
        return Err(CertError::InvalidValidity(validity));
    }
    Ok(())
}

/// OID of the X.520 organizationName attribute (2.5.4.10).
const OID_ORGANIZATION_NAME: [u64; 4] = [2, 5, 4, 10];

/// Most organisations a client certificate can carry; see [`dn`].
pub const MAX_ORGANISATIONS: usize = 2;

fn dn(common_name: &str, organisations: &[&str]) -> Result<DistinguishedName> {
    // rcgen keys a DistinguishedName by attribute type, so pushing O twice
    // keeps only the last value. A second O is smuggled in as a custom type
    // carrying the same OID, which encodes identically on the wire;
    // Kubernetes reads every O attribute as a group.
    let mut dn = DistinguishedName::new();
    let mut types = [
        DnType::OrganizationName,
        DnType::CustomDnType(OID_ORGANIZATION_NAME.to_vec()),
    ]
    .into_iter();
    for o in organisations {
        let ty = types
            .next()
            .ok_or(CertError::TooManyOrganisations(organisations.len()))?;
        dn.push(ty, *o);
    }
    dn.push(DnType::CommonName, common_name);
    Ok(dn)
}

fn parse_san(name: &str) -> Result<SanType> {
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Ok(SanType::IpAddress(ip));
    }
    name.to_owned()
        .try_into()
        .map(SanType::DnsName)
        .map_err(|source| CertError::InvalidSan {
            name: name.to_owned(),
            source,
        })
}

fn pem_cert_blocks(pem: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut rest = pem;
    while let Some(start) = rest.find(PEM_CERT_BEGIN) {
        let Some(end) = rest[start..].find(PEM_CERT_END) else {
            break;
        };
        let end = start + end + PEM_CERT_END.len();
        let block: String = rest[start..end]
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join("\n");
        blocks.push(block);
        rest = &rest[end..];
    }
    blocks
}

/// Whether `key` is the private key of the PEM certificate.
fn key_matches_cert(cert_pem: &str, key: &KeyPair) -> Result<bool> {
    let der = CertificateDer::from_pem_slice(cert_pem.as_bytes())
        .map_err(|_| CertError::NoCertificate)?;
    // rcgen has no accessor for a parsed certificate's SPKI; the DER
    // encoding of the key's SPKI appears verbatim inside the certificate's
    // TBS, and a P-256/RSA SPKI is far too long to occur there by accident.
    let spki = key.public_key_der();
    Ok(der.windows(spki.len()).any(|w| w == spki.as_slice()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use rustls_pki_types::{ServerName, UnixTime};
    use webpki::{EndEntityCert, KeyUsage};

    fn der(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
    }

    fn at(t: OffsetDateTime) -> UnixTime {
        UnixTime::since_unix_epoch(std::time::Duration::from_secs(
            u64::try_from(t.unix_timestamp()).unwrap(),
        ))
    }

    /// Verifies `leaf_pem` against every certificate in `bundle_pem`.
    fn verify(
        bundle_pem: &str,
        leaf_pem: &str,
        usage: KeyUsage,
        now: OffsetDateTime,
    ) -> Result<(), webpki::Error> {
        let ca_ders: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(bundle_pem.as_bytes())
                .collect::<Result<_, _>>()
                .unwrap();
        let anchors: Vec<_> = ca_ders
            .iter()
            .map(|d| webpki::anchor_from_trusted_cert(d).unwrap())
            .collect();
        let leaf = der(leaf_pem);
        let ee = EndEntityCert::try_from(&leaf).unwrap();
        ee.verify_for_usage(
            webpki::ALL_VERIFICATION_ALGS,
            &anchors,
            &[],
            at(now),
            usage,
            None,
            None,
        )
        .map(|_| ())
    }

    fn now() -> OffsetDateTime {
        OffsetDateTime::now_utc()
    }

    #[test]
    fn server_cert_verifies_with_sans() {
        let ca = Ca::generate("kubevirt-ca", DEFAULT_CA_VALIDITY).unwrap();
        let leaf = ca
            .issue_server(
                "virt-api",
                &["virt-api.kubevirt.svc", "127.0.0.1"],
                DEFAULT_LEAF_VALIDITY,
            )
            .unwrap();
        verify(
            ca.cert_pem(),
            &leaf.cert_pem,
            KeyUsage::server_auth(),
            now(),
        )
        .unwrap();

        let leaf_der = der(&leaf.cert_pem);
        let ee = EndEntityCert::try_from(&leaf_der).unwrap();
        ee.verify_is_valid_for_subject_name(
            &ServerName::try_from("virt-api.kubevirt.svc").unwrap(),
        )
        .unwrap();
        ee.verify_is_valid_for_subject_name(&ServerName::try_from("127.0.0.1").unwrap())
            .unwrap();
        assert!(
            ee.verify_is_valid_for_subject_name(&ServerName::try_from("evil.example").unwrap())
                .is_err()
        );
        // A serving cert is not a client cert.
        assert!(
            verify(
                ca.cert_pem(),
                &leaf.cert_pem,
                KeyUsage::client_auth(),
                now()
            )
            .is_err()
        );
    }

    #[test]
    fn client_cert_verifies_and_carries_cn_and_orgs() {
        let ca = Ca::generate("kubevirt-ca", DEFAULT_CA_VALIDITY).unwrap();
        let leaf = ca
            .issue_client(
                "system:kube-apiserver",
                &["system:masters", "kubevirt"],
                DEFAULT_LEAF_VALIDITY,
            )
            .unwrap();
        verify(
            ca.cert_pem(),
            &leaf.cert_pem,
            KeyUsage::client_auth(),
            now(),
        )
        .unwrap();
        assert!(
            verify(
                ca.cert_pem(),
                &leaf.cert_pem,
                KeyUsage::server_auth(),
                now()
            )
            .is_err()
        );

        let params = CertificateParams::from_ca_cert_pem(&leaf.cert_pem).unwrap();
        let cn: Vec<_> = params
            .distinguished_name
            .iter()
            .filter(|(t, _)| **t == DnType::CommonName)
            .map(|(_, v)| v.clone())
            .collect();
        assert_eq!(
            cn,
            vec![rcgen::DnValue::Utf8String("system:kube-apiserver".into())]
        );
        // rcgen's parser folds repeated attributes, so count O attributes in
        // the DER: OID 2.5.4.10 is 06 03 55 04 0a.
        let der = der(&leaf.cert_pem);
        let oid = [0x06, 0x03, 0x55, 0x04, 0x0a];
        assert_eq!(der.windows(5).filter(|w| *w == oid).count(), 2);
        for org in ["system:masters", "kubevirt"] {
            assert!(der.windows(org.len()).any(|w| w == org.as_bytes()));
        }
        let err = ca
            .issue_client("u", &["a", "b", "c"], DEFAULT_LEAF_VALIDITY)
            .unwrap_err();
        assert!(matches!(err, CertError::TooManyOrganisations(3)), "{err:?}");
    }

    #[test]
    fn peer_cert_serves_and_authenticates() {
        let ca = Ca::generate("ca", DEFAULT_CA_VALIDITY).unwrap();
        let leaf = ca
            .issue_peer(
                "virt-handler",
                &["node-1", "10.0.0.7"],
                DEFAULT_LEAF_VALIDITY,
            )
            .unwrap();
        verify(
            ca.cert_pem(),
            &leaf.cert_pem,
            KeyUsage::server_auth(),
            now(),
        )
        .unwrap();
        verify(
            ca.cert_pem(),
            &leaf.cert_pem,
            KeyUsage::client_auth(),
            now(),
        )
        .unwrap();
        let d = der(&leaf.cert_pem);
        let ee = EndEntityCert::try_from(&d).unwrap();
        ee.verify_is_valid_for_subject_name(&ServerName::try_from("10.0.0.7").unwrap())
            .unwrap();
        assert!(has_client_auth(&leaf.cert_pem).unwrap());
        let server = ca
            .issue_server("virt-handler", &["virt-handler"], DEFAULT_LEAF_VALIDITY)
            .unwrap();
        assert!(!has_client_auth(&server.cert_pem).unwrap());
    }

    #[test]
    fn wrong_ca_fails() {
        let ca = Ca::generate("ca-a", DEFAULT_CA_VALIDITY).unwrap();
        let other = Ca::generate("ca-b", DEFAULT_CA_VALIDITY).unwrap();
        let leaf = ca
            .issue_server("svc", &["svc.ns.svc"], DEFAULT_LEAF_VALIDITY)
            .unwrap();
        let err = verify(
            other.cert_pem(),
            &leaf.cert_pem,
            KeyUsage::server_auth(),
            now(),
        )
        .unwrap_err();
        assert!(matches!(err, webpki::Error::UnknownIssuer), "{err:?}");
    }

    #[test]
    fn expiry_is_respected() {
        let ca = Ca::generate("ca", DEFAULT_CA_VALIDITY).unwrap();
        let leaf = ca.issue_server("svc", &["svc"], Duration::days(1)).unwrap();
        let n = now();
        verify(
            ca.cert_pem(),
            &leaf.cert_pem,
            KeyUsage::server_auth(),
            n + Duration::hours(23),
        )
        .unwrap();
        let err = verify(
            ca.cert_pem(),
            &leaf.cert_pem,
            KeyUsage::server_auth(),
            n + Duration::days(2),
        )
        .unwrap_err();
        assert!(matches!(err, webpki::Error::CertExpired { .. }), "{err:?}");
        // Not yet valid, beyond the clock-skew allowance.
        let err = verify(
            ca.cert_pem(),
            &leaf.cert_pem,
            KeyUsage::server_auth(),
            n - Duration::hours(1),
        )
        .unwrap_err();
        assert!(
            matches!(err, webpki::Error::CertNotValidYet { .. }),
            "{err:?}"
        );
    }

    #[test]
    fn validity_is_configurable_and_clamped_to_ca() {
        let n = now();
        let ca = Ca::generate_at("ca", Duration::days(10), n).unwrap();
        assert_eq!(ca.not_after(), n + Duration::days(10));
        let leaf = ca
            .issue_server_at("svc", &["svc"], Duration::days(3), n)
            .unwrap();
        assert_eq!(leaf.not_after, n + Duration::days(3));
        let long = ca
            .issue_server_at("svc", &["svc"], Duration::days(30), n)
            .unwrap();
        assert_eq!(long.not_after, ca.not_after());
        let (nb, na) = validity_of(&leaf.cert_pem).unwrap();
        assert_eq!(na.unix_timestamp(), leaf.not_after.unix_timestamp());
        assert_eq!(nb.unix_timestamp(), leaf.not_before.unix_timestamp());
        assert!(matches!(
            Ca::generate("ca", Duration::ZERO),
            Err(CertError::InvalidValidity(_))
        ));
    }

    #[test]
    fn defaults() {
        assert_eq!(DEFAULT_CA_VALIDITY, Duration::days(365));
        assert_eq!(DEFAULT_LEAF_VALIDITY, Duration::days(30));
    }

    #[test]
    fn rotation_decision() {
        let nb = OffsetDateTime::UNIX_EPOCH;
        let na = nb + Duration::days(10);
        assert!(!needs_rotation(nb, na, nb + Duration::days(1), 0.8));
        assert!(!needs_rotation(nb, na, nb + Duration::days(7), 0.8));
        assert!(needs_rotation(nb, na, nb + Duration::days(8), 0.8));
        assert!(needs_rotation(nb, na, nb + Duration::days(9), 0.8));
        assert!(needs_rotation(nb, na, na, 0.8));
        assert!(needs_rotation(nb, na, na + Duration::days(1), 0.8));
        assert!(needs_rotation(nb, na, nb - Duration::days(1), 0.8));
        // Out-of-range fractions are clamped rather than disabling rotation.
        assert!(!needs_rotation(nb, na, nb + Duration::days(9), 7.0));
        assert!(needs_rotation(nb, na, nb + Duration::seconds(1), -1.0));
        assert!(needs_rotation(nb, na, nb + Duration::days(9), f64::NAN));
    }

    #[test]
    fn rotation_overlap_bundle_trusts_old_and_new() {
        let n = now();
        let old = Ca::generate_at("ca", DEFAULT_CA_VALIDITY, n - Duration::days(300)).unwrap();
        assert!(old.needs_rotation(n, DEFAULT_ROTATION_FRACTION));
        let new = Ca::generate_at("ca", DEFAULT_CA_VALIDITY, n).unwrap();
        assert!(!new.needs_rotation(n, DEFAULT_ROTATION_FRACTION));

        let old_leaf = old
            .issue_server_at(
                "svc",
                &["svc"],
                DEFAULT_LEAF_VALIDITY,
                n - Duration::days(1),
            )
            .unwrap();
        let new_leaf = new
            .issue_server_at("svc", &["svc"], DEFAULT_LEAF_VALIDITY, n)
            .unwrap();

        let bundle = ca_bundle(&[new.cert_pem(), old.cert_pem(), new.cert_pem()]).unwrap();
        assert_eq!(
            bundle.matches(PEM_CERT_BEGIN).count(),
            2,
            "duplicates dropped"
        );
        verify(&bundle, &old_leaf.cert_pem, KeyUsage::server_auth(), n).unwrap();
        verify(&bundle, &new_leaf.cert_pem, KeyUsage::server_auth(), n).unwrap();
        // Without the overlap the old leaf is rejected.
        assert!(
            verify(
                new.cert_pem(),
                &old_leaf.cert_pem,
                KeyUsage::server_auth(),
                n
            )
            .is_err()
        );

        // Once the old CA has expired, pruning drops it.
        let later = old.not_after() + Duration::days(1);
        let pruned = ca_bundle_pruned(&[bundle.as_str()], later).unwrap();
        assert_eq!(pruned.matches(PEM_CERT_BEGIN).count(), 1);
        verify(&pruned, &new_leaf.cert_pem, KeyUsage::server_auth(), n).unwrap();
    }

    #[test]
    fn ca_roundtrips_through_pem() {
        let ca = Ca::generate("kubevirt-ca", DEFAULT_CA_VALIDITY).unwrap();
        let loaded = Ca::from_pem(ca.cert_pem(), &ca.key_pem()).unwrap();
        assert_eq!(loaded.cert_pem(), ca.cert_pem());
        assert_eq!(
            loaded.not_after().unix_timestamp(),
            ca.not_after().unix_timestamp()
        );
        let leaf = loaded
            .issue_server("svc", &["svc.ns.svc"], DEFAULT_LEAF_VALIDITY)
            .unwrap();
        // Peers trust the original PEM, not our re-derived copy.
        verify(
            ca.cert_pem(),
            &leaf.cert_pem,
            KeyUsage::server_auth(),
            now(),
        )
        .unwrap();

        let other = Ca::generate("other", DEFAULT_CA_VALIDITY).unwrap();
        assert!(matches!(
            Ca::from_pem(ca.cert_pem(), &other.key_pem()),
            Err(CertError::KeyMismatch)
        ));
        let not_ca = ca
            .issue_server("svc", &["svc"], DEFAULT_LEAF_VALIDITY)
            .unwrap();
        assert!(matches!(
            Ca::from_pem(&not_ca.cert_pem, &not_ca.key_pem),
            Err(CertError::NotACa)
        ));
        assert!(Ca::from_pem("garbage", "garbage").is_err());
    }

    #[test]
    fn invalid_san_is_rejected() {
        let ca = Ca::generate("ca", DEFAULT_CA_VALIDITY).unwrap();
        // rcgen rejects names that are not IA5 strings.
        let err = ca
            .issue_server("svc", &["ünicode.example"], DEFAULT_LEAF_VALIDITY)
            .unwrap_err();
        assert!(matches!(err, CertError::InvalidSan { .. }), "{err:?}");
    }

    #[test]
    fn write_pair_sets_key_mode_0600() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Ca::generate("ca", DEFAULT_CA_VALIDITY).unwrap();
        let leaf = ca
            .issue_server("svc", &["svc"], DEFAULT_LEAF_VALIDITY)
            .unwrap();
        let sub = dir.path().join("tls");
        let (crt, key) = leaf.write_pair(&sub, "tls").unwrap();
        assert_eq!(crt, sub.join("tls.crt"));
        assert_eq!(key, sub.join("tls.key"));
        assert_eq!(fs::read_to_string(&crt).unwrap(), leaf.cert_pem);
        assert_eq!(fs::read_to_string(&key).unwrap(), leaf.key_pem);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode(&key), 0o600);
            assert_eq!(mode(&crt), 0o644);
        }
        // Overwriting keeps working and keeps the mode.
        let (_, key2) = ca.write_pair(&sub, "tls").unwrap();
        assert_eq!(key2, key);
        assert_eq!(fs::read_to_string(&key).unwrap(), ca.key_pem());
        let debug = format!("{leaf:?}");
        assert!(!debug.contains("PRIVATE KEY"));
    }
}
