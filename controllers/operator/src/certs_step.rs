//! The certificates step of a reconcile: reads each trust domain's Secrets, carries out
//! [`crate::rotation`]'s decision (pure, in rotation.rs) and writes the CA Secrets, and words
//! what changed for the Event and the metric. Next to rotation.rs rather than in it because
//! this is the part that talks to the API.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::Client;
use kube::api::{Api, Patch};

use crate::ctx::{Error, pp};
use crate::policy::CertPolicy;
use crate::render::components::HandlerTls;
use crate::render::etcd::{self, EtcdTls};
use crate::render::{self, NAMESPACE, Tls};
use crate::rotation::{self, CaStep, Decision, Domain};

/// Certificates of the installation after this reconcile's rotation step
/// ([`crate::rotation`]): the leaf material to render, and what changed.
pub(crate) struct Certs {
    pub(crate) serving: Tls,
    pub(crate) handler: HandlerTls,
    pub(crate) etcd: EtcdTls,
    /// The etcd domain as stored after rotation: its CA signs virt-operator's own client
    /// certificate for membership changes.
    pub(crate) etcd_state: rotation::DomainState,
    /// caBundle of the APIServices: the serving trust bundle (every serving CA still valid, so
    /// a CA rotation never leaves kube-apiserver unable to verify a replica).
    pub(crate) bundle: String,
    /// Per domain that changed: what was decided, and whether leaves existed before (a first
    /// install is no rotation).
    pub(crate) changes: Vec<(Domain, Decision, bool)>,
    /// When the next certificate or CA step is due (`None` with an invalid strategy).
    pub(crate) next_due: Option<time::OffsetDateTime>,
}

/// Reads each trust domain's CA Secret and leaf Secrets, decides and carries out its rotation
/// step, and writes the CA Secrets (before any leaf signed by or bundle naming a new CA is
/// written). `policy` is `None` with an invalid strategy: nothing existing is rotated.
pub(crate) async fn certificates(
    client: &Client,
    etcd_hosts: &etcd::EtcdHosts,
    policy: Option<&CertPolicy>,
    now: time::OffsetDateTime,
) -> Result<Certs, Error> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let frozen = policy.is_none();
    let policy = policy.copied().unwrap_or_default();
    let previous_ca_bundle = Api::<APIService>::all(client.clone())
        .get_opt(&format!("v1.{}", render::GROUP))
        .await?
        .and_then(|a| a.spec?.ca_bundle)
        .and_then(|b| String::from_utf8(b.0).ok());
    let mut states = BTreeMap::new();
    let mut changes = Vec::new();
    let mut next_due: Option<time::OffsetDateTime> = None;
    for domain in Domain::ALL {
        let specs = rotation::leaf_specs(domain, etcd_hosts);
        let ca_stored = secrets.get_opt(domain.ca_secret()).await?;
        let mut leaves = Vec::new();
        for spec in &specs {
            leaves.push(secrets.get_opt(spec.secret).await?);
        }
        let extra_trust = match domain {
            Domain::Apiserver => previous_ca_bundle.iter().cloned().collect(),
            Domain::Handler | Domain::Etcd => Vec::new(),
        };
        let r = rotation::rotate(
            domain,
            &specs,
            ca_stored.as_ref(),
            &leaves,
            extra_trust,
            &policy,
            now,
            frozen,
        )?;
        let desired = rotation::ca_secret(domain, &r.state.ca);
        if rotation::ca_secret_differs(ca_stored.as_ref(), &desired) {
            let s = serde_json::to_value(&desired).map_err(|e| Error::Other(e.to_string()))?;
            secrets
                .patch(domain.ca_secret(), &pp(), &Patch::Apply(&s))
                .await?;
        }
        if !frozen && let Some(t) = rotation::next_due(&r.state, &policy) {
            next_due = Some(next_due.map_or(t, |n| n.min(t)));
        }
        if r.decision.changes() {
            changes.push((domain, r.decision, r.had_leaves));
        }
        states.insert(domain, r.state);
    }
    let missing = |d: Domain| Error::Other(format!("{}: certificates missing", d.describe()));
    let state = |d: Domain| states.get(&d).ok_or_else(|| missing(d));
    let serving = rotation::serving_tls(state(Domain::Apiserver)?)
        .ok_or_else(|| missing(Domain::Apiserver))?;
    let bundle = serving.ca.clone();
    let mut handler =
        rotation::handler_tls(state(Domain::Handler)?).ok_or_else(|| missing(Domain::Handler))?;
    // What signer.rs signs handler certificates with: the handlers renew theirs by it.
    handler.lifetime = Some(policy.leaf());
    let etcd_state = state(Domain::Etcd)?.clone();
    let etcd = rotation::etcd_tls(&etcd_state, etcd_hosts).ok_or_else(|| missing(Domain::Etcd))?;
    Ok(Certs {
        serving,
        handler,
        etcd,
        etcd_state,
        bundle,
        changes,
        next_due,
    })
}

/// The `CertificateRotated` Event text of one domain's change and what the rotations metric
/// counts (`ca`, `leaf`, or nothing while a new CA is only published); `None`: a first
/// install, nothing rotated.
pub(crate) fn rotation_note(
    domain: Domain,
    d: &Decision,
    had_leaves: bool,
    delay: time::Duration,
) -> Option<(String, Option<&'static str>)> {
    let name = domain.describe();
    let delay = crate::policy::go_duration(delay);
    let reissued = d.reissue.iter().any(|r| *r);
    match d.step {
        CaStep::StartRotation => Some((
            format!(
                "{name} CA is due: a new CA is published in the trust bundle; certificates \
                 switch to it in {delay}"
            ),
            None,
        )),
        CaStep::CreatePending => Some((
            format!(
                "{name} CA stored with its key (the certificates in use have none): a new CA \
                 is published in the trust bundle; certificates switch to it in {delay}"
            ),
            None,
        )),
        CaStep::Activate => Some((
            format!("{name} CA rotated: certificates re-issued from the new CA"),
            Some("ca"),
        )),
        CaStep::CreateActive if had_leaves => Some((
            format!("{name} CA created anew (no usable one was stored): certificates re-issued"),
            Some("ca"),
        )),
        CaStep::Keep if had_leaves && reissued => Some((
            format!("{name} certificates were due: re-issued from the same CA"),
            Some("leaf"),
        )),
        CaStep::Keep | CaStep::CreateActive => None,
    }
}
