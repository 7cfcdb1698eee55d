//! Certificate rotation per trust domain, without restarting anything that reloads its files.
//!
//! Three trust domains, each with a CA of its own whose private key is kept:
//!
//! | domain | CA Secret | leaf Secrets (`ca.crt`, `tls.crt`, `tls.key`) |
//! |---|---|---|
//! | virt-apiserver serving | `kubevirt-rs-apiserver-ca` | `kubevirt-apiserver-tls` (+ the APIServices' `caBundle`) |
//! | virt-handler mTLS | `kubevirt-rs-handler-ca` | `virt-apiserver-handler-client`; each handler's own certificate is signed per node on request ([`crate::signer`]), the bundle published in ConfigMap `virt-handler-ca` |
//! | etcd | `kubevirt-rs-etcd-ca` | `kubevirt-etcd-server`, `kubevirt-etcd-client` (virt-apiserver) |
//!
//! **CA Secret layout** (type Opaque, see [`ca_secret`]):
//! - `tls.crt`, `tls.key`: the *active* CA, which signs every leaf of the domain;
//! - `next.crt`, `next.key` + annotation `kubevirt-rs.io/next-ca-published-at` (RFC 3339): a
//!   *pending* CA during a rotation, published in every trust bundle but signing nothing yet;
//! - `ca-bundle.crt`: the trust bundle as last published: every CA of the domain that is still
//!   valid (active, pending, and retired ones until they expire). Every leaf Secret's `ca.crt`
//!   (and for virt-apiserver the APIServices' `caBundle`) is this bundle.
//!
//! **What happens when** (the pure [`decide`], carried out by [`execute`]):
//! - a leaf is re-issued from the *same* active CA when it is due by the policy (`notAfter -
//!   renewBefore`), missing, or no longer fits (names, etcd's host, key usage): the trust
//!   anchors stay, so a pod that has not seen the new files yet still trusts and is trusted;
//! - a due CA is not used to sign at once: a new CA is generated as *pending* and the bundle
//!   (old + new) published; only [`CertPolicy::propagation_delay`] (5 minutes) later is it
//!   made active and every leaf re-issued from it. The old CA stays in the bundle until it
//!   expires (`virt_certs::ca_bundle_pruned`);
//! - **migration** from an install whose leaf Secrets carry no CA key (before this module):
//!   the CA is unknown, so a new one is created as *pending* and published together with the
//!   old `ca.crt`s, the old leaves are kept, and after the delay the leaves are re-issued from
//!   the new CA, exactly like a CA rotation: pods rolled by the upgrade (etcd included) trust
//!   both CAs before any certificate from the new one appears.
//!
//! With an invalid `certificateRotateStrategy` the reconciler decides `frozen`: nothing that
//! exists is rotated, only missing or unusable material is issued (default lifetimes).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use time::{Duration, OffsetDateTime};
use virt_certs::{Ca, CertError, IssuedCert};

use crate::policy::CertPolicy;
use crate::render::{self, NAMESPACE, components, etcd, part_of_labels};

/// Keys of a CA Secret.
pub const CA_CERT: &str = "tls.crt";
pub const CA_KEY: &str = "tls.key";
pub const NEXT_CERT: &str = "next.crt";
pub const NEXT_KEY: &str = "next.key";
pub const BUNDLE: &str = "ca-bundle.crt";
/// On a CA Secret with a pending CA: when it was first published (RFC 3339).
pub const NEXT_PUBLISHED_ANNOTATION: &str = "kubevirt-rs.io/next-ca-published-at";
/// While a CA rotation is pending, a leaf is re-issued (from the old CA) only if it would
/// expire before the new CA takes over plus this margin.
const PENDING_MARGIN: Duration = Duration::minutes(1);

/// Why rotating failed (nothing is written then).
#[derive(Debug, thiserror::Error)]
pub enum RotationError {
    #[error("issuing certificates: {0}")]
    Certs(#[from] CertError),
    #[error("{0}: no CA to sign certificates with")]
    NoSigner(&'static str),
}

/// A trust domain: one CA and the leaves it signs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Domain {
    /// virt-apiserver's serving certificate (kube-apiserver trusts it by the APIServices).
    Apiserver,
    /// mTLS between virt-apiserver and virt-handler, and between handlers.
    Handler,
    /// mTLS between virt-apiserver and etcd.
    Etcd,
}

impl Domain {
    pub const ALL: [Self; 3] = [Self::Apiserver, Self::Handler, Self::Etcd];

    /// For Events: "virt-apiserver serving", "virt-handler", "etcd".
    pub fn describe(self) -> &'static str {
        match self {
            Self::Apiserver => "virt-apiserver serving",
            Self::Handler => "virt-handler",
            Self::Etcd => "etcd",
        }
    }

    /// For metrics: "apiserver", "handler", "etcd".
    pub fn label(self) -> &'static str {
        match self {
            Self::Apiserver => "apiserver",
            Self::Handler => "handler",
            Self::Etcd => "etcd",
        }
    }

    /// The Secret holding the domain's CA with its key.
    pub fn ca_secret(self) -> &'static str {
        match self {
            Self::Apiserver => "kubevirt-rs-apiserver-ca",
            Self::Handler => "kubevirt-rs-handler-ca",
            Self::Etcd => "kubevirt-rs-etcd-ca",
        }
    }

    /// Common name of its CAs (each gets `@<unix time>` appended: CAs of one domain differ).
    fn ca_common_name(self) -> &'static str {
        self.ca_secret()
    }
}

/// The leaf Secrets of `domain` (etcd's certificates name the addresses in `etcd`; a cluster's
/// members get a peer certificate too).
pub fn leaf_specs(domain: Domain, etcd: &etcd::EtcdHosts) -> Vec<LeafSpec> {
    match domain {
        Domain::Apiserver => vec![LeafSpec {
            secret: render::TLS_SECRET,
            kind: LeafKind::Server,
            common_name: render::NAME,
            sans: render::service_names(),
            host: None,
        }],
        // Each handler's own certificate is asked for by the handler and signed per node
        // (signer.rs); only virt-apiserver's client certificate is a Secret.
        Domain::Handler => vec![LeafSpec {
            secret: components::HANDLER_CLIENT,
            kind: LeafKind::Client,
            common_name: virt_certs::node_identity::APISERVER_CLIENT_NAME,
            sans: vec![],
            host: None,
        }],
        Domain::Etcd => {
            let host = Some(etcd.key());
            let mut specs = vec![
                LeafSpec {
                    secret: etcd::SERVER_SECRET,
                    kind: LeafKind::Server,
                    common_name: etcd::ETCD,
                    sans: etcd::server_names(etcd),
                    host: host.clone(),
                },
                LeafSpec {
                    secret: etcd::CLIENT_SECRET,
                    kind: LeafKind::Client,
                    common_name: "virt-apiserver",
                    sans: vec![],
                    host: host.clone(),
                },
            ];
            if !etcd.members.is_empty() {
                // Serving and client auth: members dial each other with it.
                specs.push(LeafSpec {
                    secret: etcd::PEER_SECRET,
                    kind: LeafKind::Peer,
                    common_name: etcd::PEER_COMMON_NAME,
                    sans: etcd::peer_names(etcd),
                    host,
                });
            }
            specs
        }
    }
}

/// A PEM certificate with its PEM private key.
#[derive(Clone, PartialEq, Eq)]
pub struct Pem {
    pub cert: String,
    pub key: String,
}

impl std::fmt::Debug for Pem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pem")
            .field("cert_len", &self.cert.len())
            .field("key", &"<redacted>")
            .finish()
    }
}

/// A CA published but not signing yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub ca: Pem,
    pub published_at: OffsetDateTime,
}

/// What a domain's CA Secret holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CaStore {
    pub active: Option<Pem>,
    pub next: Option<Pending>,
    /// The trust bundle as last published (PEM, may be empty).
    pub bundle: String,
}

/// What a leaf certificate is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeafKind {
    /// Serving only.
    Server,
    /// Serving and client auth, one identity for both directions.
    Peer,
    /// Client only.
    Client,
}

/// One leaf Secret of a domain and what its certificate must say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafSpec {
    pub secret: &'static str,
    pub kind: LeafKind,
    pub common_name: &'static str,
    pub sans: Vec<String>,
    /// etcd's Secrets name the host of the serving certificate (annotation); a new host is a
    /// new certificate.
    pub host: Option<String>,
}

/// A leaf Secret as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leaf {
    pub pem: Pem,
    /// Its `ca.crt`: the trust bundle.
    pub ca: String,
    pub host: Option<String>,
}

/// Everything stored of one domain.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DomainState {
    pub ca: CaStore,
    /// One per [`LeafSpec`] of the domain, in order.
    pub leaves: Vec<Option<Leaf>>,
    /// More CAs that were published and must stay trusted while valid (the APIServices'
    /// current `caBundle` for virt-apiserver).
    pub extra_trust: Vec<String>,
}

/// What happens to a domain's CA.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaStep {
    Keep,
    /// No CA and nothing signed by one in use: a new active CA (fresh install).
    CreateActive,
    /// No CA known but leaves in use (an install without CA keys): a new pending CA.
    CreatePending,
    /// The active CA is due: a new pending CA is published.
    StartRotation,
    /// The pending CA has been published long enough: it becomes the active one.
    Activate,
}

/// Which CA signs the leaves re-issued now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signer {
    Active,
    Pending,
}

/// What [`decide`] found for one domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub step: CaStep,
    /// Per leaf: issue a new certificate.
    pub reissue: Vec<bool>,
    pub signer: Signer,
}

impl Decision {
    /// Whether any certificate or CA changes.
    pub fn changes(&self) -> bool {
        self.step != CaStep::Keep || self.reissue.iter().any(|r| *r)
    }
}

/// Validity of a CA whose certificate and key load and match.
fn usable_ca(p: &Pem) -> Option<(OffsetDateTime, OffsetDateTime)> {
    Ca::from_pem(&p.cert, &p.key)
        .ok()
        .map(|c| (c.not_before(), c.not_after()))
}

fn validity(pem: &str) -> Option<(OffsetDateTime, OffsetDateTime)> {
    virt_certs::validity_of(pem).ok()
}

/// Whether the stored leaf is what `spec` asks for (apart from its age and issuer).
fn fits(spec: &LeafSpec, leaf: &Leaf) -> bool {
    if leaf.pem.key.trim().is_empty() || validity(&leaf.pem.cert).is_none() {
        return false;
    }
    if spec.host.is_some() && leaf.host != spec.host {
        return false;
    }
    match spec.kind {
        LeafKind::Peer => virt_certs::has_client_auth(&leaf.pem.cert).unwrap_or(false),
        LeafKind::Server | LeafKind::Client => true,
    }
}

/// Whether `cert_pem` chains to one of the CAs in `cas` (PEM, each may hold several) at `now`,
/// for its purpose.
pub fn verifies(cert_pem: &str, cas: &[&str], kind: LeafKind, now: OffsetDateTime) -> bool {
    let usage = match kind {
        LeafKind::Server | LeafKind::Peer => virt_certs::Usage::Server,
        LeafKind::Client => virt_certs::Usage::Client,
    };
    virt_certs::verifies(cert_pem, cas, usage, now)
}

/// The CAs of `sources` (PEM, any number of certificates each) still valid at `now`, without
/// duplicates, in order of first appearance; unparsable sources are skipped.
pub fn trust_bundle(sources: &[&str], now: OffsetDateTime) -> String {
    let kept: Vec<String> = sources
        .iter()
        .filter(|s| !s.trim().is_empty())
        .filter_map(|s| virt_certs::ca_bundle_pruned(&[*s], now).ok())
        .collect();
    virt_certs::ca_bundle(&kept).unwrap_or_default()
}

/// Every CA that may be trusted in `st`, in a stable order (what was published first, then
/// new CAs), so a bundle changes only when a CA is added or expires.
fn trust_sources(st: &DomainState) -> Vec<&str> {
    let mut v = vec![st.ca.bundle.as_str()];
    v.extend(st.leaves.iter().flatten().map(|l| l.ca.as_str()));
    v.extend(st.extra_trust.iter().map(String::as_str));
    v.extend(st.ca.active.iter().map(|p| p.cert.as_str()));
    v.extend(st.ca.next.iter().map(|p| p.ca.cert.as_str()));
    v
}

/// The pure rotation decision for one domain: given what is stored, the leaves it must have,
/// the policy and the time, what to do with the CA and which leaves to re-issue. `frozen`
/// (invalid strategy): keep everything that exists, issue only what is missing or unusable.
pub fn decide(
    st: &DomainState,
    specs: &[LeafSpec],
    policy: &CertPolicy,
    now: OffsetDateTime,
    frozen: bool,
) -> Decision {
    let active = st
        .ca
        .active
        .as_ref()
        .and_then(usable_ca)
        .filter(|(_, na)| now < *na);
    let pending = st
        .ca
        .next
        .as_ref()
        .filter(|p| usable_ca(&p.ca).is_some_and(|(_, na)| now < na));
    let leaf_at = |i: usize| st.leaves.get(i).and_then(Option::as_ref);
    let broken = |i: usize| match (leaf_at(i), specs.get(i)) {
        (Some(l), Some(spec)) => {
            !fits(spec, l) || validity(&l.pem.cert).is_none_or(|(_, na)| now >= na)
        }
        _ => true,
    };
    let live_leaf = st
        .leaves
        .iter()
        .flatten()
        .any(|l| validity(&l.pem.cert).is_some_and(|(_, na)| now < na));
    let delay = policy.propagation_delay();
    let step = match (active, pending) {
        (_, Some(p)) if !frozen && now >= p.published_at + delay => CaStep::Activate,
        (_, Some(_)) => CaStep::Keep,
        (Some((nb, na)), None) if !frozen && policy.ca.due(nb, na, now) => CaStep::StartRotation,
        (Some(_), None) => CaStep::Keep,
        (None, None) if !live_leaf => CaStep::CreateActive,
        (None, None) if frozen && !(0..specs.len()).any(broken) => CaStep::Keep,
        (None, None) => CaStep::CreatePending,
    };
    let (signer, pending_until) = match step {
        CaStep::CreateActive | CaStep::Activate => (Signer::Active, None),
        CaStep::StartRotation => (Signer::Active, Some(now + delay)),
        CaStep::CreatePending => (Signer::Pending, Some(now + delay)),
        CaStep::Keep => match (active, pending) {
            (Some(_), Some(p)) => (Signer::Active, Some(p.published_at + delay)),
            (None, Some(p)) => (Signer::Pending, Some(p.published_at + delay)),
            _ => (Signer::Active, None),
        },
    };
    let trusted = trust_sources(st);
    let reissue = (0..specs.len())
        .map(|i| {
            if broken(i) {
                return true;
            }
            let (Some(leaf), Some(spec)) = (leaf_at(i), specs.get(i)) else {
                return true;
            };
            let Some((nb, na)) = validity(&leaf.pem.cert) else {
                return true;
            };
            if frozen {
                return false;
            }
            match (step, pending_until) {
                (CaStep::CreateActive | CaStep::Activate, _) => true,
                // The new CA is not trusted everywhere yet: keep what is in use unless it
                // would expire before the switch.
                (_, Some(until)) => {
                    now < nb
                        || na <= until + PENDING_MARGIN
                        || !verifies(&leaf.pem.cert, &trusted, spec.kind, now)
                }
                (_, None) => match &st.ca.active {
                    Some(ca) => {
                        !verifies(&leaf.pem.cert, &[ca.cert.as_str()], spec.kind, now)
                            || policy.leaf().due(nb, na, now)
                    }
                    None => false,
                },
            }
        })
        .collect();
    Decision {
        step,
        reissue,
        signer,
    }
}

/// A new CA of `domain`.
fn generate(domain: Domain, policy: &CertPolicy, now: OffsetDateTime) -> Result<Pem, CertError> {
    let ca = Ca::generate_at(
        &format!("{}@{}", domain.ca_common_name(), now.unix_timestamp()),
        policy.ca.duration,
        now,
    )?;
    Ok(Pem {
        cert: ca.cert_pem().to_string(),
        key: ca.key_pem(),
    })
}

fn issue(
    ca: &Ca,
    spec: &LeafSpec,
    validity: Duration,
    now: OffsetDateTime,
) -> Result<IssuedCert, CertError> {
    match spec.kind {
        LeafKind::Server => ca.issue_server_at(spec.common_name, &spec.sans, validity, now),
        LeafKind::Peer => ca.issue_peer_at(spec.common_name, &spec.sans, validity, now),
        LeafKind::Client => ca.issue_client_at::<&str>(spec.common_name, &[], validity, now),
    }
}

/// Carries out `d` on `st`: the domain's new stored state (CA Secret and leaves, every leaf's
/// `ca.crt` the new trust bundle). Nothing is written here; on error nothing changes.
pub fn execute(
    domain: Domain,
    st: &DomainState,
    specs: &[LeafSpec],
    d: &Decision,
    policy: &CertPolicy,
    now: OffsetDateTime,
) -> Result<DomainState, RotationError> {
    let mut ca = st.ca.clone();
    match d.step {
        CaStep::Keep => {}
        CaStep::CreateActive => {
            ca.active = Some(generate(domain, policy, now)?);
            ca.next = None;
        }
        CaStep::CreatePending => {
            // Whatever is stored as active is unusable (else the step would not be this).
            ca.active = None;
            ca.next = Some(Pending {
                ca: generate(domain, policy, now)?,
                published_at: now,
            });
        }
        CaStep::StartRotation => {
            ca.next = Some(Pending {
                ca: generate(domain, policy, now)?,
                published_at: now,
            });
        }
        CaStep::Activate => {
            if let Some(p) = ca.next.take() {
                ca.active = Some(p.ca);
            }
        }
    }
    let with_ca = DomainState {
        ca: ca.clone(),
        ..st.clone()
    };
    let bundle = trust_bundle(&trust_sources(&with_ca), now);
    let signer = if d.reissue.iter().any(|r| *r) {
        let pem = match d.signer {
            Signer::Active => ca.active.as_ref(),
            Signer::Pending => ca.next.as_ref().map(|p| &p.ca),
        }
        .ok_or(RotationError::NoSigner(domain.describe()))?;
        Some(Ca::from_pem(&pem.cert, &pem.key)?)
    } else {
        None
    };
    let mut leaves = Vec::with_capacity(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        let old = st.leaves.get(i).and_then(Option::as_ref);
        let leaf = match (d.reissue.get(i).copied().unwrap_or(true), old, &signer) {
            (false, Some(l), _) => Leaf {
                ca: bundle.clone(),
                ..l.clone()
            },
            (_, _, Some(ca)) => {
                let c = issue(ca, spec, policy.server.duration, now)?;
                Leaf {
                    pem: Pem {
                        cert: c.cert_pem,
                        key: c.key_pem,
                    },
                    ca: bundle.clone(),
                    host: spec.host.clone(),
                }
            }
            (_, _, None) => return Err(RotationError::NoSigner(domain.describe())),
        };
        leaves.push(Some(leaf));
    }
    ca.bundle = bundle;
    Ok(DomainState {
        ca,
        leaves,
        extra_trust: st.extra_trust.clone(),
    })
}

/// When something of `st` is next due: the pending CA's switch, else the earliest renewal
/// point of the active CA and the leaves. `None`: nothing is stored.
pub fn next_due(st: &DomainState, policy: &CertPolicy) -> Option<OffsetDateTime> {
    if let Some(p) = &st.ca.next {
        return Some(p.published_at + policy.propagation_delay());
    }
    let ca = st
        .ca
        .active
        .as_ref()
        .and_then(|p| validity(&p.cert))
        .map(|(nb, na)| policy.ca.next_due(nb, na));
    let leaf = policy.leaf();
    st.leaves
        .iter()
        .flatten()
        .filter_map(|l| validity(&l.pem.cert))
        .map(|(nb, na)| leaf.next_due(nb, na))
        .chain(ca)
        .min()
}

fn rfc3339(t: OffsetDateTime) -> String {
    k8s_openapi::jiff::Timestamp::from_second(t.unix_timestamp())
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn parse_rfc3339(s: &str) -> Option<OffsetDateTime> {
    let t: k8s_openapi::jiff::Timestamp = s.parse().ok()?;
    OffsetDateTime::from_unix_timestamp(t.as_second()).ok()
}

fn data(s: &Secret, key: &str) -> Option<String> {
    s.data
        .as_ref()?
        .get(key)
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
}

/// The CA Secret of `domain`.
pub fn ca_secret(domain: Domain, store: &CaStore) -> Secret {
    let mut data = BTreeMap::new();
    let mut put = |k: &str, v: &str| {
        data.insert(k.to_string(), ByteString(v.as_bytes().to_vec()));
    };
    if let Some(a) = &store.active {
        put(CA_CERT, &a.cert);
        put(CA_KEY, &a.key);
    }
    if let Some(n) = &store.next {
        put(NEXT_CERT, &n.ca.cert);
        put(NEXT_KEY, &n.ca.key);
    }
    put(BUNDLE, &store.bundle);
    let annotations = store.next.as_ref().map(|n| {
        BTreeMap::from([(
            NEXT_PUBLISHED_ANNOTATION.to_string(),
            rfc3339(n.published_at),
        )])
    });
    Secret {
        metadata: ObjectMeta {
            name: Some(domain.ca_secret().into()),
            namespace: Some(NAMESPACE.into()),
            labels: Some(part_of_labels(domain.ca_secret())),
            annotations,
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".into()),
        data: Some(data),
        ..Secret::default()
    }
}

/// Whether the stored CA Secret differs from `desired` in what the rotation relies on (its
/// data and the publication time of a pending CA), i.e. must be written.
pub fn ca_secret_differs(stored: Option<&Secret>, desired: &Secret) -> bool {
    let published = |s: &Secret| {
        s.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(NEXT_PUBLISHED_ANNOTATION).cloned())
    };
    stored.is_none_or(|s| s.data != desired.data || published(s) != published(desired))
}

/// What a CA Secret holds (missing pieces are `None`; a pending CA without a readable
/// publication time counts as published now).
pub fn read_ca_secret(s: &Secret, now: OffsetDateTime) -> CaStore {
    let pem = |c: &str, k: &str| {
        Some(Pem {
            cert: data(s, c)?,
            key: data(s, k)?,
        })
    };
    let published_at = s
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(NEXT_PUBLISHED_ANNOTATION))
        .and_then(|t| parse_rfc3339(t))
        .unwrap_or(now);
    CaStore {
        active: pem(CA_CERT, CA_KEY),
        next: pem(NEXT_CERT, NEXT_KEY).map(|ca| Pending { ca, published_at }),
        bundle: data(s, BUNDLE).unwrap_or_default(),
    }
}

/// A leaf Secret as stored (`None` without `tls.crt`/`tls.key`).
pub fn read_leaf_secret(s: &Secret, host_annotation: &str) -> Option<Leaf> {
    Some(Leaf {
        pem: Pem {
            cert: data(s, "tls.crt")?,
            key: data(s, "tls.key")?,
        },
        ca: data(s, "ca.crt").unwrap_or_default(),
        host: s
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(host_annotation).cloned()),
    })
}

/// One domain after its rotation step.
#[derive(Debug, Clone)]
pub struct Rotated {
    pub decision: Decision,
    /// What to store and render.
    pub state: DomainState,
    /// Whether any leaf Secret existed before (a first install is no rotation).
    pub had_leaves: bool,
}

/// The whole step for one domain from its Secrets as stored (the CA Secret and one per
/// [`leaf_specs`] entry, in order): read, [`decide`], [`execute`]. Pure: virt-operator reads
/// the Secrets through the API, `cargo xtask deploy` through kubectl; both write
/// [`ca_secret`] of the result before any leaf it signed.
#[allow(clippy::too_many_arguments)]
pub fn rotate(
    domain: Domain,
    specs: &[LeafSpec],
    ca: Option<&Secret>,
    leaves: &[Option<Secret>],
    extra_trust: Vec<String>,
    policy: &CertPolicy,
    now: OffsetDateTime,
    frozen: bool,
) -> Result<Rotated, RotationError> {
    let stored = DomainState {
        ca: ca.map(|s| read_ca_secret(s, now)).unwrap_or_default(),
        leaves: leaves
            .iter()
            .map(|s| {
                s.as_ref()
                    .and_then(|s| read_leaf_secret(s, etcd::HOST_ANNOTATION))
            })
            .collect(),
        extra_trust,
    };
    let decision = decide(&stored, specs, policy, now, frozen);
    let state = execute(domain, &stored, specs, &decision, policy, now)?;
    Ok(Rotated {
        decision,
        state,
        had_leaves: stored.leaves.iter().any(Option::is_some),
    })
}

/// A first install's state of `domain` (nothing stored before), for tests of what is rendered
/// from it.
#[cfg(test)]
pub(crate) fn first_install(domain: Domain, etcd: &etcd::EtcdHosts) -> DomainState {
    let specs = leaf_specs(domain, etcd);
    let none = vec![None; specs.len()];
    let now = OffsetDateTime::now_utc();
    rotate(
        domain,
        &specs,
        None,
        &none,
        Vec::new(),
        &CertPolicy::default(),
        now,
        false,
    )
    .map(|r| r.state)
    .unwrap_or_default()
}

fn leaf_at(st: &DomainState, i: usize) -> Option<&Leaf> {
    st.leaves.get(i).and_then(Option::as_ref)
}

/// virt-apiserver's serving material of an [`Domain::Apiserver`] state (`ca`: the trust
/// bundle, also the APIServices' `caBundle`).
pub fn serving_tls(st: &DomainState) -> Option<render::Tls> {
    let l = leaf_at(st, 0)?;
    Some(render::Tls {
        ca: st.ca.bundle.clone(),
        cert: l.pem.cert.clone(),
        key: l.pem.key.clone(),
    })
}

/// The virt-handler mTLS material of a [`Domain::Handler`] state.
pub fn handler_tls(st: &DomainState) -> Option<components::HandlerTls> {
    let client = leaf_at(st, 0)?;
    Some(components::HandlerTls {
        ca: st.ca.bundle.clone(),
        client_cert: client.pem.cert.clone(),
        client_key: client.pem.key.clone(),
        lifetime: None,
    })
}

/// The etcd material of a [`Domain::Etcd`] state whose certificates name `hosts` (the peer
/// certificate when there is one: a cluster's).
pub fn etcd_tls(st: &DomainState, hosts: &etcd::EtcdHosts) -> Option<etcd::EtcdTls> {
    let (server, client) = (leaf_at(st, 0)?, leaf_at(st, 1)?);
    Some(etcd::EtcdTls {
        host: hosts.key(),
        ca: st.ca.bundle.clone(),
        server_cert: server.pem.cert.clone(),
        server_key: server.pem.key.clone(),
        client_cert: client.pem.cert.clone(),
        client_key: client.pem.key.clone(),
        peer: leaf_at(st, 2).map(|p| (p.pem.cert.clone(), p.pem.key.clone())),
    })
}

/// A client certificate for virt-operator itself towards etcd (membership changes), issued
/// from the active etcd CA of `st` for `validity`: kept in memory only, never in a Secret, so
/// no other component can use it.
pub fn operator_etcd_client(
    st: &DomainState,
    validity: Duration,
    now: OffsetDateTime,
) -> Result<Pem, RotationError> {
    let ca = st
        .ca
        .active
        .as_ref()
        .ok_or(RotationError::NoSigner(Domain::Etcd.describe()))?;
    let ca = Ca::from_pem(&ca.cert, &ca.key)?;
    let c = ca.issue_client_at("virt-operator", &[] as &[&str], validity, now)?;
    Ok(Pem {
        cert: c.cert_pem,
        key: c.key_pem,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::policy::Lifetime;

    fn now() -> OffsetDateTime {
        // Whole seconds: the publication time goes through an RFC 3339 annotation.
        let n = OffsetDateTime::now_utc();
        n.replace_nanosecond(0).unwrap()
    }

    fn handler_specs() -> Vec<LeafSpec> {
        vec![
            LeafSpec {
                secret: "virt-handler-certs",
                kind: LeafKind::Peer,
                common_name: "virt-handler",
                sans: vec!["virt-handler".into()],
                host: None,
            },
            LeafSpec {
                secret: "virt-apiserver-handler-client",
                kind: LeafKind::Client,
                common_name: "virt-apiserver",
                sans: vec![],
                host: None,
            },
        ]
    }

    fn etcd_specs(host: &str) -> Vec<LeafSpec> {
        vec![
            LeafSpec {
                secret: "kubevirt-etcd-server",
                kind: LeafKind::Server,
                common_name: "kubevirt-etcd",
                sans: vec![host.into(), "127.0.0.1".into()],
                host: Some(host.into()),
            },
            LeafSpec {
                secret: "kubevirt-etcd-client",
                kind: LeafKind::Client,
                common_name: "virt-apiserver",
                sans: vec![],
                host: Some(host.into()),
            },
        ]
    }

    fn short_leaves() -> CertPolicy {
        CertPolicy {
            server: Lifetime {
                duration: Duration::minutes(1),
                renew_before: Duration::seconds(50),
            },
            ..CertPolicy::default()
        }
    }

    /// Decide and execute once.
    fn step(
        st: &DomainState,
        specs: &[LeafSpec],
        p: &CertPolicy,
        at: OffsetDateTime,
    ) -> (Decision, DomainState) {
        let d = decide(st, specs, p, at, false);
        let next = execute(Domain::Handler, st, specs, &d, p, at).unwrap();
        (d, next)
    }

    /// Right after executing, nothing is due (no re-issue loop).
    fn settled(st: &DomainState, specs: &[LeafSpec], p: &CertPolicy, at: OffsetDateTime) {
        let d = decide(st, specs, p, at, false);
        assert!(!d.changes(), "not settled: {d:?}");
    }

    fn leaf(st: &DomainState, i: usize) -> &Leaf {
        st.leaves[i].as_ref().unwrap()
    }

    fn all_verify(st: &DomainState, specs: &[LeafSpec], cas: &[&str], at: OffsetDateTime) {
        for (i, spec) in specs.iter().enumerate() {
            assert!(
                verifies(&leaf(st, i).pem.cert, cas, spec.kind, at),
                "{} does not verify",
                spec.secret
            );
            assert!(
                verifies(
                    &leaf(st, i).pem.cert,
                    &[leaf(st, i).ca.as_str()],
                    spec.kind,
                    at
                ),
                "{} does not verify against its own ca.crt",
                spec.secret
            );
        }
    }

    fn count_certs(pem: &str) -> usize {
        pem.matches("BEGIN CERTIFICATE").count()
    }

    #[test]
    fn fresh_install_creates_an_active_ca_and_every_leaf() {
        let specs = handler_specs();
        let p = CertPolicy::default();
        let t = now();
        let (d, st) = step(&DomainState::default(), &specs, &p, t);
        assert_eq!(d.step, CaStep::CreateActive);
        assert_eq!(d.reissue, vec![true, true]);
        let ca = st.ca.active.clone().unwrap();
        assert!(st.ca.next.is_none());
        assert_eq!(count_certs(&st.ca.bundle), 1);
        all_verify(&st, &specs, &[&ca.cert], t);
        let (nb, na) = virt_certs::validity_of(&leaf(&st, 0).pem.cert).unwrap();
        assert_eq!(
            na - (t - Duration::minutes(5)),
            Duration::days(30) + Duration::minutes(5)
        );
        assert!(nb < t);
        assert!(virt_certs::has_client_auth(&leaf(&st, 0).pem.cert).unwrap());
        settled(&st, &specs, &p, t);
        // Next due: the leaves' renewal point, 24 days on.
        assert_eq!(next_due(&st, &p), Some(na - Duration::days(6)));
    }

    #[test]
    fn leaf_rotation_keeps_the_ca_and_the_bundle() {
        let specs = etcd_specs("10.0.0.10");
        let p = short_leaves();
        let t = now();
        let (_, st) = step(&DomainState::default(), &specs, &p, t);
        settled(&st, &specs, &p, t + Duration::seconds(9));
        let due = next_due(&st, &p).unwrap();
        assert_eq!(due, t + Duration::seconds(10));
        let (d, st2) = step(&st, &specs, &p, due);
        assert_eq!(d.step, CaStep::Keep);
        assert_eq!(d.reissue, vec![true, true]);
        assert_eq!(st2.ca, st.ca, "CA Secret unchanged");
        for i in 0..2 {
            assert_ne!(leaf(&st2, i).pem.cert, leaf(&st, i).pem.cert);
            assert_eq!(leaf(&st2, i).ca, st.ca.bundle, "ca.crt unchanged");
        }
        // The new leaves chain to the same anchor: peers still holding the old bundle
        // trust them.
        all_verify(&st2, &specs, &[&leaf(&st, 0).ca], t);
        settled(&st2, &specs, &p, due);
    }

    #[test]
    fn ca_rotation_publishes_first_and_signs_with_the_new_ca_after_the_delay() {
        let specs = handler_specs();
        let p = CertPolicy {
            ca: Lifetime {
                duration: Duration::hours(1),
                renew_before: Duration::minutes(20),
            },
            server: Lifetime {
                duration: Duration::minutes(30),
                renew_before: Duration::minutes(5),
            },
        };
        assert_eq!(p.propagation_delay(), Duration::minutes(5));
        let t = now();
        // Installed 41 minutes ago: the CA (1 h, renewed 20 min before its end) is due.
        let t0 = t - Duration::minutes(41);
        let (_, installed) = step(&DomainState::default(), &specs, &p, t0);
        let old_ca = installed.ca.active.clone().unwrap();
        // Leaves re-issued a minute ago (from the old CA): not due themselves.
        let mut st = installed.clone();
        let d = Decision {
            step: CaStep::Keep,
            reissue: vec![true, true],
            signer: Signer::Active,
        };
        st = execute(
            Domain::Handler,
            &st,
            &specs,
            &d,
            &p,
            t - Duration::minutes(1),
        )
        .unwrap();
        let old_leaves = st.leaves.clone();

        // 1. Due: a pending CA, published in the bundle; leaves untouched.
        let (d, pending) = step(&st, &specs, &p, t);
        assert_eq!(d.step, CaStep::StartRotation);
        assert_eq!(d.reissue, vec![false, false]);
        assert_eq!(pending.ca.active, Some(old_ca.clone()));
        let new_ca = pending.ca.next.clone().unwrap();
        assert_eq!(new_ca.published_at, t);
        assert_eq!(count_certs(&pending.ca.bundle), 2);
        assert!(pending.ca.bundle.contains(old_ca.cert.trim()));
        assert!(pending.ca.bundle.contains(new_ca.ca.cert.trim()));
        for (i, old) in old_leaves.iter().enumerate() {
            let (old, new) = (old.as_ref().unwrap(), leaf(&pending, i));
            assert_eq!(new.pem, old.pem, "leaf {i} still from the old CA");
            assert_eq!(new.ca, pending.ca.bundle, "ca.crt is the new bundle");
        }
        all_verify(&pending, &specs, &[&old_ca.cert], t);
        assert_eq!(next_due(&pending, &p), Some(t + Duration::minutes(5)));

        // 2. Within the delay: nothing changes, not even a due leaf is re-signed by the new CA.
        let within = t + Duration::minutes(4);
        let d = decide(&pending, &specs, &p, within, false);
        assert!(!d.changes(), "{d:?}");

        // 3. After the delay: the new CA signs every leaf; the old one stays in the bundle.
        let after = t + Duration::minutes(5);
        let (d, switched) = step(&pending, &specs, &p, after);
        assert_eq!(d.step, CaStep::Activate);
        assert_eq!(d.reissue, vec![true, true]);
        assert_eq!(switched.ca.active, Some(new_ca.ca.clone()));
        assert!(switched.ca.next.is_none());
        assert_eq!(
            switched.ca.bundle, pending.ca.bundle,
            "bundle unchanged: no etcd restart"
        );
        // New leaves verify against the new CA alone and against the bundle peers hold.
        all_verify(&switched, &specs, &[&new_ca.ca.cert], t);
        all_verify(&switched, &specs, &[&pending.ca.bundle], t);
        for (i, spec) in specs.iter().enumerate() {
            assert!(!verifies(
                &leaf(&switched, i).pem.cert,
                &[&old_ca.cert],
                spec.kind,
                t
            ));
        }
        settled(&switched, &specs, &p, after);

        // 4. Once the old CA has expired it drops out of the bundle.
        let later = t0 + Duration::hours(1) + Duration::minutes(1);
        let d = decide(&switched, &specs, &p, later, false);
        let pruned = execute(Domain::Handler, &switched, &specs, &d, &p, later).unwrap();
        assert_eq!(count_certs(&pruned.ca.bundle), 1);
        assert!(pruned.ca.bundle.contains(new_ca.ca.cert.trim()));
    }

    #[test]
    fn migration_from_leaves_without_a_ca_key_publishes_before_switching() {
        // What the previous operator left: both Secrets with ca.crt, no CA Secret.
        let t = now();
        let legacy = Ca::generate_at(
            "kubevirt-rs-handler-ca",
            Duration::days(365),
            t - Duration::days(10),
        )
        .unwrap();
        let server = legacy
            .issue_peer("virt-handler", &["virt-handler"], Duration::days(90))
            .unwrap();
        let client = legacy
            .issue_client_at::<&str>(
                "virt-apiserver",
                &[],
                Duration::days(90),
                t - Duration::days(10),
            )
            .unwrap();
        let legacy_leaf = |c: &IssuedCert| {
            Some(Leaf {
                pem: Pem {
                    cert: c.cert_pem.clone(),
                    key: c.key_pem.clone(),
                },
                ca: legacy.cert_pem().to_string(),
                host: None,
            })
        };
        let st = DomainState {
            leaves: vec![legacy_leaf(&server), legacy_leaf(&client)],
            ..DomainState::default()
        };
        let specs = handler_specs();
        let p = CertPolicy::default();
        let (d, pending) = step(&st, &specs, &p, t);
        assert_eq!(d.step, CaStep::CreatePending);
        assert_eq!(
            d.reissue,
            vec![false, false],
            "90-day leaves kept until the switch"
        );
        assert!(pending.ca.active.is_none());
        assert_eq!(count_certs(&pending.ca.bundle), 2);
        assert!(pending.ca.bundle.contains(legacy.cert_pem().trim()));
        assert_eq!(leaf(&pending, 0).pem, st.leaves[0].as_ref().unwrap().pem);
        settled(&pending, &specs, &p, t + Duration::minutes(4));
        let after = t + Duration::minutes(5);
        let (d, migrated) = step(&pending, &specs, &p, after);
        assert_eq!(d.step, CaStep::Activate);
        let new_ca = migrated.ca.active.clone().unwrap();
        all_verify(&migrated, &specs, &[&new_ca.cert], t);
        all_verify(&migrated, &specs, &[&pending.ca.bundle], t);
        assert_eq!(migrated.ca.bundle, pending.ca.bundle);
        settled(&migrated, &specs, &p, after);
    }

    #[test]
    fn a_missing_leaf_during_migration_is_signed_by_the_pending_ca() {
        let t = now();
        let legacy = Ca::generate("old", Duration::days(365)).unwrap();
        let server = legacy
            .issue_peer("virt-handler", &["virt-handler"], Duration::days(90))
            .unwrap();
        let st = DomainState {
            leaves: vec![
                Some(Leaf {
                    pem: Pem {
                        cert: server.cert_pem,
                        key: server.key_pem,
                    },
                    ca: legacy.cert_pem().into(),
                    host: None,
                }),
                None,
            ],
            ..DomainState::default()
        };
        let specs = handler_specs();
        let (d, next) = step(&st, &specs, &CertPolicy::default(), t);
        assert_eq!(d.step, CaStep::CreatePending);
        assert_eq!(d.reissue, vec![false, true]);
        assert_eq!(d.signer, Signer::Pending);
        let pending = next.ca.next.clone().unwrap();
        assert!(verifies(
            &leaf(&next, 1).pem.cert,
            &[&pending.ca.cert],
            LeafKind::Client,
            t
        ));
    }

    #[test]
    fn etcd_leaves_follow_the_service_ip_from_the_same_ca() {
        let t = now();
        let p = CertPolicy::default();
        let (_, st) = step(&DomainState::default(), &etcd_specs("10.0.0.10"), &p, t);
        settled(&st, &etcd_specs("10.0.0.10"), &p, t);
        let specs = etcd_specs("10.0.0.11");
        let (d, moved) = step(&st, &specs, &p, t);
        assert_eq!(d.step, CaStep::Keep);
        assert_eq!(d.reissue, vec![true, true]);
        assert_eq!(moved.ca, st.ca);
        assert_eq!(leaf(&moved, 0).host.as_deref(), Some("10.0.0.11"));
        use rustls_pki_types::pem::PemObject;
        let der =
            rustls_pki_types::CertificateDer::from_pem_slice(leaf(&moved, 0).pem.cert.as_bytes())
                .unwrap();
        let ee = webpki::EndEntityCert::try_from(&der).unwrap();
        let ip = rustls_pki_types::ServerName::try_from("10.0.0.11").unwrap();
        ee.verify_is_valid_for_subject_name(&ip).unwrap();
        settled(&moved, &specs, &p, t);
    }

    /// Growing etcd to a cluster: the server and client certificates name the members'
    /// addresses from then on, a peer certificate (serving and client auth, the CN members
    /// accept) joins them, all from the same CA; a single member's leaves stay as they were.
    #[test]
    fn a_cluster_adds_a_peer_certificate_from_the_same_ca() {
        let t = now();
        let p = CertPolicy::default();
        let single = etcd::EtcdHosts {
            service: "10.0.0.10".into(),
            members: vec![],
        };
        let specs = leaf_specs(Domain::Etcd, &single);
        assert_eq!(specs.len(), 2);
        assert_eq!(specs[0].host.as_deref(), Some("10.0.0.10"));
        let (_, st) = step(&DomainState::default(), &specs, &p, t);
        let cluster = etcd::EtcdHosts {
            service: "10.0.0.10".into(),
            members: vec!["10.0.0.20".into(), "10.0.0.21".into(), "10.0.0.22".into()],
        };
        let specs = leaf_specs(Domain::Etcd, &cluster);
        assert_eq!(specs[2].secret, etcd::PEER_SECRET);
        assert_eq!(specs[2].kind, LeafKind::Peer);
        let mut grown = st.clone();
        grown.leaves.push(None);
        let (d, grown) = step(&grown, &specs, &p, t);
        assert_eq!(d.step, CaStep::Keep, "the CA stays");
        assert_eq!(d.reissue, [true, true, true]);
        assert_eq!(grown.ca.active, st.ca.active);
        all_verify(&grown, &specs, &[grown.ca.bundle.as_str()], t);
        let peer = &leaf(&grown, 2).pem.cert;
        assert!(virt_certs::has_client_auth(peer).unwrap());
        assert_eq!(
            virt_certs::node_identity::common_name_of_pem(peer).as_deref(),
            Some(etcd::PEER_COMMON_NAME)
        );
        settled(&grown, &specs, &p, t);
    }

    #[test]
    fn leaves_from_another_ca_are_replaced_from_the_active_one() {
        let t = now();
        let specs = handler_specs();
        let p = CertPolicy::default();
        let (_, st) = step(&DomainState::default(), &specs, &p, t);
        let stranger = Ca::generate("stranger", Duration::days(365)).unwrap();
        let c = stranger
            .issue_client::<&str>("virt-apiserver", &[], Duration::days(30))
            .unwrap();
        let mut tampered = st.clone();
        tampered.leaves[1] = Some(Leaf {
            pem: Pem {
                cert: c.cert_pem,
                key: c.key_pem,
            },
            ca: st.ca.bundle.clone(),
            host: None,
        });
        let d = decide(&tampered, &specs, &p, t, false);
        assert_eq!(d.step, CaStep::Keep);
        assert_eq!(d.reissue, vec![false, true]);
    }

    #[test]
    fn frozen_keeps_what_exists_and_only_fills_gaps() {
        let t = now();
        let specs = handler_specs();
        let p = short_leaves();
        let (_, st) = step(&DomainState::default(), &specs, &p, t);
        let later = t + Duration::seconds(30);
        assert!(decide(&st, &specs, &p, later, false).changes());
        let d = decide(&st, &specs, &p, later, true);
        assert!(!d.changes(), "{d:?}");
        let mut gap = st.clone();
        gap.leaves[0] = None;
        let d = decide(&gap, &specs, &p, later, true);
        assert_eq!(d.step, CaStep::Keep);
        assert_eq!(d.reissue, vec![true, false]);
        // A fresh install with a bad strategy still gets certificates.
        let d = decide(&DomainState::default(), &specs, &p, t, true);
        assert_eq!(d.step, CaStep::CreateActive);
    }

    #[test]
    fn a_leaf_cut_at_its_cas_end_is_not_reissued_in_a_loop() {
        // Leaves renewed 30 min before their end, the CA only 6 min before its end: a leaf
        // issued late in the CA's life is cut at the CA's notAfter.
        let p = CertPolicy::short_ca_long_leaf_renewal();
        let specs = handler_specs();
        let t = now();
        let (_, installed) = step(
            &DomainState::default(),
            &specs,
            &p,
            t - Duration::minutes(100),
        );
        let (_, st) = step(&installed, &specs, &p, t);
        settled(&st, &specs, &p, t);
    }

    #[test]
    fn ca_secret_round_trips() {
        let t = now();
        let specs = handler_specs();
        let p = CertPolicy::default();
        let (_, st) = step(&DomainState::default(), &specs, &p, t);
        let store = CaStore {
            next: Some(Pending {
                ca: st.ca.active.clone().unwrap(),
                published_at: t,
            }),
            ..st.ca.clone()
        };
        let s = ca_secret(Domain::Etcd, &store);
        assert_eq!(s.metadata.name.as_deref(), Some("kubevirt-rs-etcd-ca"));
        assert_eq!(read_ca_secret(&s, t + Duration::hours(1)), store);
        let keys: Vec<&String> = s.data.as_ref().unwrap().keys().collect();
        assert_eq!(
            keys,
            [
                "ca-bundle.crt",
                "next.crt",
                "next.key",
                "tls.crt",
                "tls.key"
            ]
        );
        let plain = ca_secret(Domain::Etcd, &st.ca);
        assert!(plain.metadata.annotations.is_none());
        assert_eq!(read_ca_secret(&plain, t), st.ca);
        assert!(!ca_secret_differs(Some(&s), &s));
        assert!(ca_secret_differs(None, &s));
        assert!(ca_secret_differs(Some(&plain), &s));
        // A pending CA whose publication time was lost reads as published now, and the
        // time is written down.
        let mut lost = s.clone();
        lost.metadata.annotations = None;
        let read = read_ca_secret(&lost, t + Duration::hours(1));
        assert_eq!(
            read.next.as_ref().unwrap().published_at,
            t + Duration::hours(1)
        );
        assert!(ca_secret_differs(
            Some(&lost),
            &ca_secret(Domain::Etcd, &read)
        ));
    }

    #[test]
    fn bundle_skips_garbage_and_expired() {
        let t = now();
        let ca = Ca::generate("a", Duration::days(1)).unwrap();
        let old = Ca::generate_at("b", Duration::days(1), t - Duration::days(2)).unwrap();
        let b = trust_bundle(
            &["garbage", "", old.cert_pem(), ca.cert_pem(), ca.cert_pem()],
            t,
        );
        assert_eq!(count_certs(&b), 1);
        assert!(b.contains(ca.cert_pem().trim()));
        assert_eq!(trust_bundle(&["garbage"], t), "");
    }
}
