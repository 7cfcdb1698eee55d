//! `upload.cdi.kubevirt.io/v1beta1`: CDI's UploadTokenRequest, and the upload token itself.
//!
//! Creating an UploadTokenRequest (`virtctl image-upload` does, after its DataVolume or
//! claim is ready) answers with `status.token`: a short-lived token that lets its bearer
//! send one image to the upload proxy for that namespace and claim. Nothing is stored; the
//! token carries its scope and expiry and is signed (HMAC-SHA-256) with a key only
//! virt-apiserver holds, which both signs (the API) and verifies (the upload proxy it
//! serves on a second port). Pure: the caller passes the key and the clock.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// API group of UploadTokenRequest.
pub const GROUP: &str = "upload.cdi.kubevirt.io";
/// The version served.
pub const VERSION: &str = "v1beta1";
/// `apiVersion` of UploadTokenRequest.
pub const API_VERSION: &str = "upload.cdi.kubevirt.io/v1beta1";
/// How long a token is good for (CDI's: five minutes to start the upload).
pub const TOKEN_TTL_SECONDS: i64 = 300;
/// Bytes of a signing key.
pub const KEY_LEN: usize = 32;

/// CDI's UploadTokenRequest: asks for a token to upload into `spec.pvcName` of the
/// request's namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UploadTokenRequest {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default)]
    #[schemars(with = "serde_json::Value")]
    pub metadata: ObjectMeta,
    pub spec: UploadTokenRequestSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<UploadTokenRequestStatus>,
}

/// What the token is for.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UploadTokenRequestSpec {
    /// The claim (in the request's namespace) the upload goes into.
    pub pvc_name: String,
}

/// The answer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UploadTokenRequestStatus {
    /// The bearer token to send to the upload proxy.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub token: String,
}

/// What a token grants: one upload into `namespace`/`pvc` until `expires` (Unix seconds).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenClaims {
    #[serde(rename = "ns")]
    pub namespace: String,
    pub pvc: String,
    #[serde(rename = "iat")]
    pub issued: i64,
    #[serde(rename = "exp")]
    pub expires: i64,
}

/// Why a token is refused (the proxy answers 401 to each).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    /// Not `payload.signature`, or not base64/JSON.
    #[error("the upload token is malformed: create a new UploadTokenRequest")]
    Malformed,
    /// Signed with another key (or altered).
    #[error(
        "the upload token's signature does not match: it was not issued by this cluster's virt-apiserver (or was altered)"
    )]
    BadSignature,
    /// Past its expiry.
    #[error(
        "the upload token expired {ago}s ago (tokens last {TOKEN_TTL_SECONDS}s): create a new UploadTokenRequest and upload again"
    )]
    Expired { ago: i64 },
}

/// Fresh random bytes for a key (virt-operator's Secret).
pub fn random_key_bytes() -> Result<[u8; KEY_LEN], ring::error::Unspecified> {
    let mut bytes = [0u8; KEY_LEN];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)?;
    Ok(bytes)
}

/// A signing key. Debug does not print it.
#[derive(Clone)]
pub struct TokenKey(ring::hmac::Key);

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

impl TokenKey {
    /// A key from its bytes (a Secret's, or random ones).
    pub fn new(bytes: &[u8]) -> Self {
        TokenKey(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, bytes))
    }

    /// A key from fresh random bytes (a single process that both signs and verifies).
    pub fn random() -> Result<Self, ring::error::Unspecified> {
        Ok(Self::new(&random_key_bytes()?))
    }

    /// A token for one upload into `namespace`/`pvc`, good for [`TOKEN_TTL_SECONDS`] from `now`.
    pub fn sign(&self, namespace: &str, pvc: &str, now: i64) -> String {
        let claims = TokenClaims {
            namespace: namespace.into(),
            pvc: pvc.into(),
            issued: now,
            expires: now + TOKEN_TTL_SECONDS,
        };
        // Serialising a struct of strings and integers cannot fail.
        let payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).unwrap_or_default());
        let tag = ring::hmac::sign(&self.0, payload.as_bytes());
        format!("{payload}.{}", URL_SAFE_NO_PAD.encode(tag.as_ref()))
    }

    /// The claims of `token` if this key signed it and it has not expired at `now`.
    pub fn verify(&self, token: &str, now: i64) -> Result<TokenClaims, TokenError> {
        let (payload, sig) = token.trim().split_once('.').ok_or(TokenError::Malformed)?;
        let sig = URL_SAFE_NO_PAD
            .decode(sig)
            .map_err(|_| TokenError::Malformed)?;
        // Constant-time comparison (ring's verify).
        ring::hmac::verify(&self.0, payload.as_bytes(), &sig)
            .map_err(|_| TokenError::BadSignature)?;
        let raw = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| TokenError::Malformed)?;
        let claims: TokenClaims =
            serde_json::from_slice(&raw).map_err(|_| TokenError::Malformed)?;
        if now >= claims.expires {
            return Err(TokenError::Expired {
                ago: now - claims.expires,
            });
        }
        Ok(claims)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_token_names_its_claim_and_lasts_five_minutes() {
        let key = TokenKey::new(b"0123456789abcdef0123456789abcdef");
        let t = key.sign("ns", "disk", 1000);
        let c = key.verify(&t, 1000).unwrap();
        assert_eq!((c.namespace.as_str(), c.pvc.as_str()), ("ns", "disk"));
        assert_eq!(c.expires, 1300);
        assert!(key.verify(&t, 1299).is_ok());
        assert_eq!(key.verify(&t, 1300), Err(TokenError::Expired { ago: 0 }));
        assert_eq!(key.verify(&t, 1360), Err(TokenError::Expired { ago: 60 }));
    }

    #[test]
    fn another_key_an_altered_scope_or_garbage_is_refused() {
        let key = TokenKey::new(b"one key");
        let other = TokenKey::new(b"another key");
        let t = key.sign("ns", "disk", 0);
        assert_eq!(other.verify(&t, 1), Err(TokenError::BadSignature));
        // The payload rewritten for another claim: the signature no longer matches.
        let (_, sig) = t.split_once('.').unwrap();
        let forged = URL_SAFE_NO_PAD.encode(br#"{"ns":"ns","pvc":"other","iat":0,"exp":999999}"#);
        assert_eq!(
            key.verify(&format!("{forged}.{sig}"), 1),
            Err(TokenError::BadSignature)
        );
        assert_eq!(key.verify("nodot", 1), Err(TokenError::Malformed));
        assert_eq!(key.verify("a.!!", 1), Err(TokenError::Malformed));
        assert_eq!(key.verify("", 1), Err(TokenError::Malformed));
    }

    #[test]
    fn random_keys_differ_and_the_key_is_not_printed() {
        let a = TokenKey::random().unwrap();
        let b = TokenKey::random().unwrap();
        let t = a.sign("ns", "d", 0);
        assert_eq!(b.verify(&t, 1), Err(TokenError::BadSignature));
        assert_eq!(format!("{a:?}"), "TokenKey(..)");
    }

    #[test]
    fn the_request_decodes_as_virtctl_sends_it() {
        let r: UploadTokenRequest = serde_json::from_value(serde_json::json!({
            "apiVersion": "upload.cdi.kubevirt.io/v1beta1", "kind": "UploadTokenRequest",
            "metadata": {"name": "token-for-virtctl", "creationTimestamp": null},
            "spec": {"pvcName": "disk"}, "status": {}
        }))
        .unwrap();
        assert_eq!(r.spec.pvc_name, "disk");
    }
}
