//! Authentication and authorization.
//!
//! TLS requests but does not require a client certificate and accepts any chain at
//! handshake time (still proving key possession); chains are verified afterwards
//! against the front-proxy CA and the client CA separately, because which CA signed a
//! certificate decides whether its X-Remote-* headers may be trusted. A certificate
//! that chains to neither gets a 401 Status rather than a TLS alert, as Go servers do.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use rustls::DistinguishedName;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls_pki_types::{CertificateDer, TrustAnchor, UnixTime};
use webpki::{EndEntityCert, KeyUsage};

use crate::error::{ApiError, ApiResult, Gr};
use crate::request::RequestInfo;

/// A verified identity.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct User {
    /// Username.
    pub name: String,
    /// UID, if known.
    pub uid: Option<String>,
    /// Groups (including `system:authenticated`).
    pub groups: Vec<String>,
    /// Extra attributes.
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
    /// Authenticated by a certificate of the configured client CA (not the front proxy).
    pub via_client_ca: bool,
}

/// Trust anchors of one CA bundle, plus their subjects for CertificateRequest hints.
#[derive(Debug, Clone, Default)]
pub struct CaPool {
    anchors: Vec<TrustAnchor<'static>>,
    subjects: Vec<DistinguishedName>,
}

impl CaPool {
    /// Parses a PEM bundle.
    pub fn from_pem(pem: &[u8]) -> Result<Self, AuthConfigError> {
        use rustls_pki_types::pem::PemObject;
        let mut pool = CaPool::default();
        for der in CertificateDer::pem_slice_iter(pem) {
            let der = der.map_err(|_| AuthConfigError::BadPem)?;
            let anchor = webpki::anchor_from_trusted_cert(&der)
                .map_err(|_| AuthConfigError::BadCa)?
                .to_owned();
            pool.subjects
                .push(DistinguishedName::in_sequence(anchor.subject.as_ref()));
            pool.anchors.push(anchor);
        }
        if pool.anchors.is_empty() {
            return Err(AuthConfigError::BadPem);
        }
        Ok(pool)
    }

    /// Whether `chain` (leaf first) verifies for client auth against this pool.
    pub fn verifies(&self, chain: &[CertificateDer<'_>]) -> bool {
        let Some(leaf) = chain.first() else {
            return false;
        };
        let Ok(ee) = EndEntityCert::try_from(leaf) else {
            return false;
        };
        ee.verify_for_usage(
            webpki::ALL_VERIFICATION_ALGS,
            &self.anchors,
            &chain[1..],
            UnixTime::now(),
            KeyUsage::client_auth(),
            None,
            None,
        )
        .is_ok()
    }
}

/// Bad authentication configuration.
#[derive(Debug, thiserror::Error)]
pub enum AuthConfigError {
    /// A PEM file holds no certificate.
    #[error("no PEM certificate found")]
    BadPem,
    /// A certificate cannot be a trust anchor.
    #[error("certificate cannot be used as a CA")]
    BadCa,
}

/// Client-certificate verifier that asks for certificates and defers chain checks.
#[derive(Debug)]
pub struct DeferredClientVerifier {
    hints: Vec<DistinguishedName>,
    provider: Arc<CryptoProvider>,
}

impl DeferredClientVerifier {
    /// Advertises the subjects of both pools.
    pub fn new(pools: &[&CaPool], provider: Arc<CryptoProvider>) -> Self {
        Self {
            hints: pools
                .iter()
                .flat_map(|p| p.subjects.iter().cloned())
                .collect(),
            provider,
        }
    }
}

impl ClientCertVerifier for DeferredClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &self.hints
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// What the TLS layer learned about the peer, attached to every request.
#[derive(Debug, Clone, Default)]
pub struct PeerIdentity {
    /// A certificate was presented.
    pub presented: bool,
    /// CN of a certificate that chains to the front-proxy CA.
    pub front_proxy_cn: Option<String>,
    /// CN and O values of a certificate that chains to the client CA.
    pub client: Option<(String, Vec<String>)>,
}

fn subject_names(der: &CertificateDer<'_>) -> Option<(String, Vec<String>)> {
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).ok()?;
    let cn = cert
        .subject()
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_string();
    let orgs = cert
        .subject()
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    Some((cn, orgs))
}

/// Request-header (front proxy) settings.
#[derive(Debug, Clone)]
pub struct RequestHeaderConfig {
    /// CA of the front-proxy client certificate.
    pub ca: CaPool,
    /// Allowed CNs (empty = any).
    pub allowed_names: Vec<String>,
    /// Username headers.
    pub username_headers: Vec<String>,
    /// Group headers.
    pub group_headers: Vec<String>,
    /// Extra header prefixes.
    pub extra_prefixes: Vec<String>,
}

/// The CAs clients are verified against, replaced whole when one is rotated.
#[derive(Debug, Default)]
pub struct Trust {
    /// Front proxy.
    pub request_header: Option<RequestHeaderConfig>,
    /// Client CA for direct x509 users.
    pub client_ca: Option<CaPool>,
    /// Counts replacements: the serving configuration (whose certificate request names
    /// these CAs) is rebuilt when it moves.
    pub generation: u64,
}

/// Authentication and authorization configuration. Clones share their [`Trust`].
#[derive(Clone)]
pub struct AuthConfig {
    trust: Arc<std::sync::RwLock<Arc<Trust>>>,
    /// kube-apiserver client for TokenReview and SubjectAccessReview.
    pub kube: Option<kube::Client>,
    /// Grant everything to users authenticated by the client CA (local development only).
    pub allow_client_ca_users: bool,
    sar_cache: moka::future::Cache<String, bool>,
    token_cache: moka::future::Cache<String, Option<User>>,
}

impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = self.trust();
        f.debug_struct("AuthConfig")
            .field("request_header", &t.request_header.is_some())
            .field("client_ca", &t.client_ca.is_some())
            .field("kube", &self.kube.is_some())
            .field("allow_client_ca_users", &self.allow_client_ca_users)
            .finish()
    }
}

impl AuthConfig {
    /// Builds the configuration.
    pub fn new(
        request_header: Option<RequestHeaderConfig>,
        client_ca: Option<CaPool>,
        kube: Option<kube::Client>,
        allow_client_ca_users: bool,
    ) -> Self {
        let ttl = Duration::from_secs(10);
        Self {
            trust: Arc::new(std::sync::RwLock::new(Arc::new(Trust {
                request_header,
                client_ca,
                generation: 0,
            }))),
            kube,
            allow_client_ca_users,
            sar_cache: moka::future::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(ttl)
                .build(),
            token_cache: moka::future::Cache::builder()
                .max_capacity(10_000)
                .time_to_live(ttl)
                .build(),
        }
    }

    /// The CAs in use now.
    pub fn trust(&self) -> Arc<Trust> {
        self.trust
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Replaces the CAs (one was rotated): connections made from now on are verified
    /// against these, and the serving configuration asks for certificates of these
    /// (a Go client such as kube-apiserver sends its certificate only to a server that
    /// names its CA). Connections already open keep the identity they were given.
    pub fn set_trust(
        &self,
        request_header: Option<RequestHeaderConfig>,
        client_ca: Option<CaPool>,
    ) {
        let mut t = self
            .trust
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let generation = t.generation + 1;
        *t = Arc::new(Trust {
            request_header,
            client_ca,
            generation,
        });
    }

    /// Classifies the peer's certificate chain once per connection.
    pub fn identify(&self, chain: Option<&[CertificateDer<'_>]>) -> PeerIdentity {
        let trust = self.trust();
        let Some(chain) = chain.filter(|c| !c.is_empty()) else {
            return PeerIdentity::default();
        };
        let mut id = PeerIdentity {
            presented: true,
            ..Default::default()
        };
        let names = subject_names(&chain[0]);
        if let Some(rh) = &trust.request_header
            && rh.ca.verifies(chain)
        {
            id.front_proxy_cn = names.as_ref().map(|n| n.0.clone());
        }
        if let Some(ca) = &trust.client_ca
            && ca.verifies(chain)
        {
            id.client = names;
        }
        id
    }

    /// Authenticates a request; `Err` is a 401.
    pub async fn authenticate(
        &self,
        headers: &http::HeaderMap,
        peer: &PeerIdentity,
    ) -> Result<User, ApiError> {
        let mut had_error = false;
        let trust = self.trust();
        if let (Some(rh), Some(cn)) = (&trust.request_header, &peer.front_proxy_cn) {
            if rh.allowed_names.is_empty() || rh.allowed_names.iter().any(|n| n == cn) {
                if let Some(user) = request_header_user(rh, headers) {
                    return Ok(user);
                }
            } else {
                tracing::info!(cn = %cn, "Front-proxy certificate CN not in the allowed list");
                had_error = true;
            }
        }
        if let Some((cn, orgs)) = &peer.client {
            let mut groups = orgs.clone();
            groups.push("system:authenticated".into());
            return Ok(User {
                name: cn.clone(),
                groups,
                via_client_ca: true,
                ..Default::default()
            });
        }
        if peer.presented && peer.front_proxy_cn.is_none() {
            tracing::info!("Client certificate does not chain to a trusted CA");
            had_error = true;
        }
        if let Some(token) = bearer_token(headers) {
            match self.token_review(&token).await {
                Some(u) => return Ok(u),
                None => had_error = true,
            }
        }
        let _ = had_error;
        // Anonymous access is not offered: every API request needs an identity.
        Err(ApiError::unauthorized())
    }

    async fn token_review(&self, token: &str) -> Option<User> {
        let kube = self.kube.clone()?;
        let key = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(token.as_bytes()));
        if let Some(hit) = self.token_cache.get(&key).await {
            return hit;
        }
        let api: kube::Api<TokenReview> = kube::Api::all(kube);
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_string()),
                audiences: None,
            },
            ..Default::default()
        };
        let result = match api.create(&PostParams::default(), &review).await {
            Ok(r) => r
                .status
                .filter(|s| s.authenticated == Some(true))
                .and_then(|s| s.user)
                .map(|u| {
                    let mut groups = u.groups.unwrap_or_default();
                    if !groups.iter().any(|g| g == "system:authenticated") {
                        groups.push("system:authenticated".into());
                    }
                    User {
                        name: u.username.unwrap_or_default(),
                        uid: u.uid,
                        groups,
                        extra: u.extra.unwrap_or_default().into_iter().collect(),
                        via_client_ca: false,
                    }
                }),
            Err(e) => {
                tracing::warn!(error = %e, "TokenReview failed");
                return None;
            }
        };
        self.token_cache.insert(key, result.clone()).await;
        result
    }

    /// Authorizes a request; `Err` is a 403 (or 500 when the SAR call fails).
    pub async fn authorize(&self, user: &User, info: &RequestInfo) -> Result<(), ApiError> {
        if user.groups.iter().any(|g| g == "system:masters") {
            return Ok(());
        }
        if self.allow_client_ca_users && user.via_client_ca {
            return Ok(());
        }
        if !info.is_resource && info.verb == "get" && is_discovery_path(&info.path) {
            return Ok(());
        }
        let Some(kube) = self.kube.clone() else {
            return Err(forbidden(user, info, "no authorizer is configured"));
        };
        let spec = sar_spec(user, info);
        let key = serde_json::to_string(&spec).unwrap_or_default();
        if let Some(allowed) = self.sar_cache.get(&key).await {
            return if allowed {
                Ok(())
            } else {
                Err(forbidden(user, info, ""))
            };
        }
        let api: kube::Api<SubjectAccessReview> = kube::Api::all(kube);
        let sar = SubjectAccessReview {
            spec,
            ..Default::default()
        };
        match api.create(&PostParams::default(), &sar).await {
            Ok(r) => {
                let status = r.status.unwrap_or_default();
                let allowed = status.allowed && status.denied != Some(true);
                self.sar_cache.insert(key, allowed).await;
                if allowed {
                    Ok(())
                } else {
                    Err(forbidden(
                        user,
                        info,
                        status.reason.as_deref().unwrap_or(""),
                    ))
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "SubjectAccessReview failed");
                Err(ApiError::internal(
                    "authorization failed: SubjectAccessReview request error",
                ))
            }
        }
    }
}

impl AuthConfig {
    /// Whether `user` may clone claim `namespace/claim`: CDI's rule
    /// ([`kubevirt_api::cdi::clone`]), `create` on `datavolumes/source` named after the
    /// claim, or else `create` on `pods`, in the claim's namespace — each the usual
    /// SubjectAccessReview of [`Self::authorize`] (cached alike). `Err` only when the review
    /// itself could not be made.
    pub async fn may_clone(&self, user: &User, namespace: &str, claim: &str) -> ApiResult<bool> {
        for (verb, group, resource, subresource) in
            kubevirt_api::cdi::clone::SOURCE_RESOURCE_ATTRIBUTES
        {
            let info = RequestInfo {
                is_resource: true,
                verb: verb.into(),
                group: group.into(),
                version: if group.is_empty() {
                    "v1".into()
                } else {
                    kubevirt_api::cdi::VERSION.into()
                },
                namespace: namespace.into(),
                resource: resource.into(),
                subresource: subresource.into(),
                name: claim.into(),
                ..RequestInfo::default()
            };
            match self.authorize(user, &info).await {
                Ok(()) => return Ok(true),
                Err(e) if e.code == 403 => {}
                Err(e) => return Err(e),
            }
        }
        tracing::info!(user = %user.name, namespace, claim, "clone of a claim not allowed");
        Ok(false)
    }
}

/// The 403 for a write that clones claim `namespace/claim` its author may not read
/// ([`AuthConfig::may_clone`]), naming what would allow it. The first sentence is CDI's.
pub fn clone_forbidden(
    gr: Gr<'_>,
    name: &str,
    user: &User,
    namespace: &str,
    claim: &str,
) -> ApiError {
    let subject = if name.is_empty() {
        format!("{}.{} is forbidden", gr.resource, gr.group)
    } else {
        format!("{}.{} {name:?} is forbidden", gr.resource, gr.group)
    };
    ApiError::forbidden(
        gr,
        name,
        format!(
            "{subject}: User {:?} has insufficient permissions in clone source namespace \
             {namespace:?}: cloning PersistentVolumeClaim {claim:?} needs \"create\" on \
             \"datavolumes/source\" in API group {:?} (resourceName {claim:?}) or \
             \"create\" on \"pods\" in namespace {namespace:?}",
            user.name,
            kubevirt_api::cdi::GROUP,
        ),
    )
}

fn is_discovery_path(path: &str) -> bool {
    let p = path.trim_end_matches('/');
    p == "/apis"
        || p == "/api"
        || p == "/version"
        || p.starts_with("/openapi/")
        || p == "/openapi"
        || (p.starts_with("/apis/") && p.split('/').filter(|s| !s.is_empty()).count() <= 3)
}

fn sar_spec(user: &User, info: &RequestInfo) -> SubjectAccessReviewSpec {
    let mut spec = SubjectAccessReviewSpec {
        user: Some(user.name.clone()),
        uid: user.uid.clone(),
        groups: Some(user.groups.clone()),
        extra: (!user.extra.is_empty()).then(|| user.extra.clone().into_iter().collect()),
        ..Default::default()
    };
    if info.is_resource {
        spec.resource_attributes = Some(ResourceAttributes {
            namespace: Some(info.namespace.clone()).filter(|s| !s.is_empty()),
            verb: Some(info.verb.clone()),
            group: Some(info.group.clone()),
            version: Some(info.version.clone()),
            resource: Some(info.resource.clone()),
            subresource: Some(info.subresource.clone()).filter(|s| !s.is_empty()),
            name: Some(info.name.clone()).filter(|s| !s.is_empty()),
            ..Default::default()
        });
    } else {
        spec.non_resource_attributes = Some(NonResourceAttributes {
            path: Some(info.path.clone()),
            verb: Some(info.verb.clone()),
        });
    }
    spec
}

/// The 403 for a denied request, worded like kube-apiserver's.
pub fn forbidden(user: &User, info: &RequestInfo, reason: &str) -> ApiError {
    let suffix = if reason.is_empty() {
        String::new()
    } else {
        format!(": {reason}")
    };
    if !info.is_resource {
        return ApiError::forbidden(
            Gr {
                resource: "",
                group: "",
            },
            "",
            format!(
                "forbidden: User {:?} cannot {} path {:?}{suffix}",
                user.name, info.verb, info.path
            ),
        );
    }
    let res = if info.subresource.is_empty() {
        info.resource.clone()
    } else {
        format!("{}/{}", info.resource, info.subresource)
    };
    let scope = if info.namespace.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace {:?}", info.namespace)
    };
    let subject = if info.name.is_empty() {
        format!("{}.{} is forbidden", info.resource, info.group)
    } else {
        format!(
            "{}.{} {:?} is forbidden",
            info.resource, info.group, info.name
        )
    };
    let msg = format!(
        "{subject}: User {:?} cannot {} resource {res:?} in API group {:?} {scope}{suffix}",
        user.name, info.verb, info.group
    );
    let msg = msg
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;");
    ApiError::forbidden(
        Gr {
            resource: leak_free(&info.resource),
            group: leak_free(&info.group),
        },
        &info.name,
        msg,
    )
}

// Gr holds &'static str for the common case; for arbitrary request strings we map to
// the static names we serve, or to an empty string.
fn leak_free(s: &str) -> &'static str {
    if let Some(k) = kubevirt_api::catalogue::kind_by_plural(s) {
        return k.plural;
    }
    [kubevirt_api::GROUP, kubevirt_api::SUBRESOURCES_GROUP]
        .into_iter()
        .find(|g| *g == s)
        .unwrap_or("")
}

fn header_values<'a>(headers: &'a http::HeaderMap, name: &str) -> impl Iterator<Item = &'a str> {
    headers.get_all(name).iter().filter_map(|v| v.to_str().ok())
}

fn request_header_user(rh: &RequestHeaderConfig, headers: &http::HeaderMap) -> Option<User> {
    let name = rh
        .username_headers
        .iter()
        .find_map(|h| header_values(headers, h).find(|v| !v.is_empty()))?
        .to_string();
    let mut groups: Vec<String> = rh
        .group_headers
        .iter()
        .flat_map(|h| {
            header_values(headers, h)
                .filter(|v| !v.is_empty())
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    let mut extra = std::collections::BTreeMap::<String, Vec<String>>::new();
    for (k, v) in headers {
        let lk = k.as_str().to_ascii_lowercase();
        for prefix in &rh.extra_prefixes {
            if let Some(rest) = lk.strip_prefix(&prefix.to_ascii_lowercase())
                && let Ok(v) = v.to_str()
            {
                let key = percent_decode(rest).unwrap_or_else(|| rest.to_string());
                extra.entry(key).or_default().push(v.to_string());
            }
        }
    }
    if name != "system:anonymous" && !groups.iter().any(|g| g == "system:authenticated") {
        groups.push("system:authenticated".into());
    }
    Some(User {
        name,
        uid: None,
        groups,
        extra,
        via_client_ca: false,
    })
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

fn bearer_token(headers: &http::HeaderMap) -> Option<String> {
    if let Some(t) = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    {
        return Some(t.trim().to_string());
    }
    // Browsers cannot set headers on websockets, so the token rides in a subprotocol.
    headers
        .get(http::header::SEC_WEBSOCKET_PROTOCOL)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.split(',')
                .map(str::trim)
                .find_map(|p| p.strip_prefix("base64url.bearer.authorization.k8s.io."))
                .and_then(|b| {
                    use base64::Engine;
                    base64::engine::general_purpose::URL_SAFE_NO_PAD
                        .decode(b.trim_end_matches('='))
                        .ok()
                        .and_then(|d| String::from_utf8(d).ok())
                })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rh() -> RequestHeaderConfig {
        RequestHeaderConfig {
            ca: CaPool::default(),
            allowed_names: vec!["front-proxy-client".into()],
            username_headers: vec!["X-Remote-User".into()],
            group_headers: vec!["X-Remote-Group".into()],
            extra_prefixes: vec!["X-Remote-Extra-".into()],
        }
    }

    #[test]
    fn request_header_user_reads_every_group_line_and_extras() {
        let mut h = http::HeaderMap::new();
        h.insert("x-remote-user", "alice".parse().unwrap());
        h.append("x-remote-group", "team-a".parse().unwrap());
        h.append("x-remote-group", "team-b,c".parse().unwrap());
        h.insert(
            "x-remote-extra-authentication.kubernetes.io%2fpod-name",
            "p1".parse().unwrap(),
        );
        let u = request_header_user(&rh(), &h).unwrap();
        assert_eq!(u.name, "alice");
        assert_eq!(u.groups, vec!["team-a", "team-b,c", "system:authenticated"]);
        assert_eq!(u.extra["authentication.kubernetes.io/pod-name"], vec!["p1"]);
    }

    #[test]
    fn forbidden_message_matches_kube_apiserver() {
        let user = User {
            name: "bob".into(),
            ..Default::default()
        };
        let info = crate::request::request_info(
            "PUT",
            "/apis/subresources.kubevirt.io/v1/namespaces/d/virtualmachines/vm1/start",
            &crate::request::Query::default(),
        );
        let e = forbidden(&user, &info, "");
        assert_eq!(e.code, 403);
        assert_eq!(
            e.message,
            "virtualmachines.subresources.kubevirt.io \"vm1\" is forbidden: User \"bob\" cannot update resource \"virtualmachines/start\" in API group \"subresources.kubevirt.io\" in the namespace \"d\""
        );
    }

    /// For every catalogued subresource, administrative endpoint and kind verb, the
    /// SubjectAccessReview sent for a call is the one the catalogue declares, so the roles
    /// derived from it (virt-operator's render.rs) grant exactly what is checked. A path the
    /// RequestInfo parsing reads differently (a suffix taken for the subresource, a verb
    /// other than the catalogue's) fails here.
    #[test]
    fn subject_access_reviews_are_the_catalogues() {
        use crate::discovery::{STATUS_VERBS, VERBS};
        use crate::request::{Query, request_info};
        use kubevirt_api::{SUBRESOURCES_GROUP, VERSION, catalogue};

        let user = User::default();
        let sar = |method: &str, path: &str, query: Option<&str>| {
            let info = request_info(method, path, &Query::parse(query));
            sar_spec(&user, &info)
                .resource_attributes
                .unwrap_or_else(|| panic!("{method} {path}: not a resource request"))
        };
        let want = |verb: &str, group: &str, resource: &str, sub: &str, ns: &str, name: &str| {
            let some = |s: &str| Some(s.to_string()).filter(|s| !s.is_empty());
            let version = catalogue::kind_groups()
                .into_iter()
                .find(|(g, _)| *g == group)
                .map_or(VERSION, |(_, v)| v);
            ResourceAttributes {
                verb: some(verb),
                group: some(group),
                version: some(version),
                resource: some(resource),
                subresource: some(sub),
                namespace: some(ns),
                name: some(name),
                ..Default::default()
            }
        };

        for s in catalogue::SUBRESOURCES {
            // The bare path and each optional trailing parameter (`…/portforward/{port}`,
            // `…/portforward/{port}/{protocol}`).
            let mut path = s.path("ns1", "obj1");
            let mut paths = vec![path.clone()];
            for (param, _) in s.path_params {
                path = format!("{path}/{param}");
                paths.push(path.clone());
            }
            if !s.path_params.is_empty() {
                paths.remove(0);
            }
            for p in paths {
                assert_eq!(
                    sar(s.http_method(), &p, None),
                    want(
                        s.rbac_verb(),
                        SUBRESOURCES_GROUP,
                        s.kind.plural,
                        s.name,
                        "ns1",
                        "obj1"
                    ),
                    "{} {p}",
                    s.http_method()
                );
            }
        }

        for e in catalogue::ADMIN_ENDPOINTS {
            assert_eq!(
                sar(e.http_method, &e.path(), None),
                want(e.rbac_verb, SUBRESOURCES_GROUP, e.name, "", "", ""),
                "{} {}",
                e.http_method,
                e.path()
            );
        }

        // A create-only kind's create is authorized as any other (the SAR is the same).
        for k in catalogue::all_kinds().filter(|k| !k.create_only) {
            let (group, version) = (k.group, k.version);
            let ns = if k.namespaced { "ns1" } else { "" };
            let scope = if k.namespaced { "/namespaces/ns1" } else { "" };
            let coll = format!("/apis/{group}/{version}{scope}/{}", k.plural);
            let watch = format!("/apis/{group}/{version}/watch{scope}/{}", k.plural);
            let obj = format!("{coll}/obj1");
            let calls = [
                ("GET", &coll, None, "list", ""),
                ("GET", &coll, Some("watch=true"), "watch", ""),
                ("GET", &watch, None, "watch", ""),
                ("POST", &coll, None, "create", ""),
                ("DELETE", &coll, None, "deletecollection", ""),
                ("GET", &obj, None, "get", "obj1"),
                ("PUT", &obj, None, "update", "obj1"),
                ("PATCH", &obj, None, "patch", "obj1"),
                ("DELETE", &obj, None, "delete", "obj1"),
            ];
            let mut verbs = Vec::new();
            for (method, path, query, verb, name) in calls {
                assert_eq!(
                    sar(method, path, query),
                    want(verb, group, k.plural, "", ns, name),
                    "{method} {path}"
                );
                verbs.push(verb);
            }
            verbs.sort();
            verbs.dedup();
            assert_eq!(verbs, VERBS, "{}: the verbs discovery advertises", k.plural);
            // A list across namespaces names none.
            let all = format!("/apis/{group}/{version}/{}", k.plural);
            assert_eq!(
                sar("GET", &all, None),
                want("list", group, k.plural, "", "", "")
            );
            if k.has_status {
                let status = format!("{obj}/status");
                let mut verbs = Vec::new();
                for (method, verb) in [("GET", "get"), ("PUT", "update"), ("PATCH", "patch")] {
                    assert_eq!(
                        sar(method, &status, None),
                        want(verb, group, k.plural, "status", ns, "obj1"),
                        "{method} {status}"
                    );
                    verbs.push(verb);
                }
                verbs.sort();
                assert_eq!(verbs, STATUS_VERBS, "{}/status", k.plural);
            }
        }
    }

    #[test]
    fn websocket_bearer_token_is_decoded() {
        let mut h = http::HeaderMap::new();
        h.insert(
            "sec-websocket-protocol",
            "base64url.bearer.authorization.k8s.io.dG9rZW4, plain.kubevirt.io"
                .parse()
                .unwrap(),
        );
        assert_eq!(bearer_token(&h).as_deref(), Some("token"));
    }
}
