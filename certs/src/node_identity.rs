//! virt-handler's per-node identity (docs/node.md, "Identities").
//!
//! Each virt-handler holds a certificate of its own that names its node: common name
//! `virt-handler:<node>`, one subject alternative name, the node name. The key never leaves
//! the node: the handler generates it and asks for a certificate with a Kubernetes
//! CertificateSigningRequest to [`SIGNER_NAME`]; virt-operator signs only a request whose
//! requester's service-account token is bound to a pod on that same node. Peers then check
//! names, not just the CA: virt-apiserver dials the handler of node N expecting N, a migration
//! target accepts only the handler of the source node, and a handler serves its console, VNC,
//! port-forward and lifecycle calls only to [`APISERVER_CLIENT_NAME`]. One compromised node
//! therefore no longer speaks for every other.

use rcgen::{
    CertificateParams, CertificateSigningRequestParams, ExtendedKeyUsagePurpose, KeyPair,
    KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

use crate::{Ca, CertError, Result, check_validity, dn, parse_san};

/// The Kubernetes signer virt-operator serves for handler certificates.
pub const SIGNER_NAME: &str = "kubevirt.io/virt-handler";
/// Common name of virt-apiserver's client certificate to the handlers: the only client the
/// handlers' HTTPS server answers.
pub const APISERVER_CLIENT_NAME: &str = "virt-apiserver";
/// The key usages a handler asks for, in the CertificateSigningRequest API's words: it serves
/// (to virt-apiserver and incoming migrations) and dials (outgoing migrations).
pub const USAGES: [&str; 4] = [
    "digital signature",
    "key encipherment",
    "server auth",
    "client auth",
];
const PREFIX: &str = "virt-handler:";

/// The common name of the handler of `node`.
pub fn common_name(node: &str) -> String {
    format!("{PREFIX}{node}")
}

/// The node a handler common name stands for (`None`: not a handler's name).
pub fn node_of(common_name: &str) -> Option<&str> {
    common_name.strip_prefix(PREFIX).filter(|n| !n.is_empty())
}

/// A new key and the PEM request for the certificate of the handler of `node`.
pub struct Request {
    pub csr_pem: String,
    pub key_pem: String,
}

// The private key must never end up in logs through `{:?}`.
impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("csr_pem", &self.csr_pem)
            .field("key_pem", &"<redacted>")
            .finish()
    }
}

fn params(node: &str) -> Result<CertificateParams> {
    let mut p = CertificateParams::default();
    p.distinguished_name = dn(&common_name(node), &[])?;
    p.subject_alt_names = vec![parse_san(node)?];
    Ok(p)
}

/// Generates a key and a certificate signing request naming `node`.
pub fn request(node: &str) -> Result<Request> {
    let key = KeyPair::generate()?;
    let csr = params(node)?.serialize_request(&key)?;
    Ok(Request {
        csr_pem: csr.pem()?,
        key_pem: key.serialize_pem(),
    })
}

/// A certificate signed from a request (the key stays with the requester).
#[derive(Debug, Clone)]
pub struct Signed {
    pub cert_pem: String,
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
}

fn san_text(s: &SanType) -> String {
    match s {
        SanType::DnsName(n) => n.as_str().to_string(),
        SanType::IpAddress(ip) => ip.to_string(),
        other => format!("{other:?}"),
    }
}

/// What a request asks to be called: its common name and subject alternative names.
pub fn requested_names(csr_pem: &str) -> Result<(Option<String>, Vec<String>)> {
    let req =
        CertificateSigningRequestParams::from_pem(csr_pem).map_err(|_| CertError::BadRequest)?;
    let cn = req
        .params
        .distinguished_name
        .get(&rcgen::DnType::CommonName)
        .and_then(dn_value_text);
    let sans = req.params.subject_alt_names.iter().map(san_text).collect();
    Ok((cn, sans))
}

fn dn_value_text(v: &rcgen::DnValue) -> Option<String> {
    match v {
        rcgen::DnValue::Utf8String(s) => Some(s.clone()),
        rcgen::DnValue::PrintableString(s) => Some(s.as_str().to_string()),
        rcgen::DnValue::Ia5String(s) => Some(s.as_str().to_string()),
        _ => None,
    }
}

impl Ca {
    /// Signs `csr_pem` as the certificate of the handler of `node`, valid for `validity`
    /// from `now` (at most until this CA expires). Only the request's public key is taken
    /// from it: the names and usages are this function's, and a request naming anything
    /// else than `node` is refused.
    pub fn sign_handler_request(
        &self,
        csr_pem: &str,
        node: &str,
        validity: Duration,
        now: OffsetDateTime,
    ) -> Result<Signed> {
        check_validity(validity)?;
        let (cn, sans) = requested_names(csr_pem)?;
        let want_cn = common_name(node);
        if cn.as_deref() != Some(want_cn.as_str()) || sans != [node] {
            return Err(CertError::RequestNames {
                want: format!("CN={want_cn}, SAN={node}"),
                got: format!("CN={}, SAN={}", cn.unwrap_or_default(), sans.join(",")),
            });
        }
        let req = CertificateSigningRequestParams::from_pem(csr_pem)
            .map_err(|_| CertError::BadRequest)?;
        let mut p = params(node)?;
        p.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let (not_before, not_after) = self.window(validity, now);
        p.not_before = not_before;
        p.not_after = not_after;
        p.use_authority_key_identifier_extension = true;
        let signed = CertificateSigningRequestParams {
            params: p,
            public_key: req.public_key,
        }
        .signed_by(&self.cert, &self.key)?;
        Ok(Signed {
            cert_pem: signed.pem(),
            not_before,
            not_after,
        })
    }
}

impl Ca {
    /// The certificate and a new key of the handler of `node` in one step, as a request
    /// signed by [`Ca::sign_handler_request`] gives it (tests and standalone set-ups; in a
    /// cluster the key is made on the node and only the request travels).
    pub fn issue_handler(&self, node: &str, validity: Duration) -> Result<crate::IssuedCert> {
        let req = request(node)?;
        let signed =
            self.sign_handler_request(&req.csr_pem, node, validity, OffsetDateTime::now_utc())?;
        Ok(crate::IssuedCert {
            cert_pem: signed.cert_pem,
            key_pem: req.key_pem,
            not_before: signed.not_before,
            not_after: signed.not_after,
        })
    }
}

/// The common name of a DER certificate (e.g. a TLS peer's), if it has one.
pub fn peer_common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    cert.subject()
        .iter_common_name()
        .next()?
        .as_str()
        .ok()
        .map(str::to_string)
}

/// The common name of the first certificate of a PEM text.
pub fn common_name_of_pem(cert_pem: &str) -> Option<String> {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    let der = CertificateDer::from_pem_slice(cert_pem.as_bytes()).ok()?;
    peer_common_name(der.as_ref())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::{DEFAULT_CA_VALIDITY, DEFAULT_LEAF_VALIDITY};

    #[test]
    fn names_round_trip() {
        assert_eq!(common_name("node-1"), "virt-handler:node-1");
        assert_eq!(node_of("virt-handler:node-1"), Some("node-1"));
        assert_eq!(node_of("virt-handler:"), None);
        assert_eq!(node_of("virt-apiserver"), None);
    }

    #[test]
    fn signs_a_request_for_its_node_only() {
        let ca = Ca::generate("ca", DEFAULT_CA_VALIDITY).unwrap();
        let req = request("node-1").unwrap();
        assert!(!format!("{req:?}").contains("PRIVATE"));
        let now = OffsetDateTime::now_utc();
        let signed = ca
            .sign_handler_request(&req.csr_pem, "node-1", DEFAULT_LEAF_VALIDITY, now)
            .unwrap();
        assert_eq!(
            common_name_of_pem(&signed.cert_pem).as_deref(),
            Some("virt-handler:node-1")
        );
        assert!(crate::has_client_auth(&signed.cert_pem).unwrap());
        assert!(signed.not_after <= ca.not_after());
        let err = ca
            .sign_handler_request(&req.csr_pem, "node-2", DEFAULT_LEAF_VALIDITY, now)
            .unwrap_err();
        assert!(err.to_string().contains("node-2"), "{err}");
        assert!(matches!(
            ca.sign_handler_request("garbage", "node-1", DEFAULT_LEAF_VALIDITY, now),
            Err(CertError::BadRequest)
        ));
    }

    #[test]
    fn ip_node_names_become_ip_sans() {
        let req = request("10.0.0.7").unwrap();
        let (cn, sans) = requested_names(&req.csr_pem).unwrap();
        assert_eq!(cn.as_deref(), Some("virt-handler:10.0.0.7"));
        assert_eq!(sans, ["10.0.0.7"]);
    }
}
