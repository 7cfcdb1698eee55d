//! The signer of virt-handler certificates (`kubevirt.io/virt-handler`, see
//! [`virt_certs::node_identity`]).
//!
//! Each virt-handler generates its key on its node and asks for a certificate through a
//! Kubernetes CertificateSigningRequest. The request carries who asked, as kube-apiserver
//! authenticated it: the handler's service account, and (its token being bound to its pod) the
//! node that pod runs on, `authentication.kubernetes.io/node-name`. A request is approved and
//! signed only when it names exactly that node, so a handler, even a compromised one, gets a
//! certificate for its own node and no other. The handler CA of the rotation ([`rotation`])
//! signs, with the leaf lifetime of the KubeVirt resource's `certificateRotateStrategy`.
//!
//! [`review`] is the pure decision; [`run`] applies it to every request of the signer.

use std::sync::Arc;
use std::time::Duration as StdDuration;

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use serde_json::json;
use time::{Duration, OffsetDateTime};
use tokio_util::sync::CancellationToken;
use virt_certs::Ca;
use virt_certs::node_identity::{self, SIGNER_NAME, USAGES};

use crate::ctx::Ctx;
use crate::kubevirt::KubeVirt;
use crate::policy::CertPolicy;
use crate::render::{NAMESPACE, components};
use crate::rotation::{self, Domain};

/// The user extra kube-apiserver adds for a token bound to a pod: the pod's node.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

/// The user name of virt-handler's service account.
pub fn handler_user() -> String {
    format!("system:serviceaccount:{NAMESPACE}:{}", components::HANDLER)
}

/// What to do with one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Another signer's, or already decided and issued.
    Ignore,
    /// Pending and valid: approve, then sign for `node`.
    Approve { node: String },
    /// Approved (by us earlier, or by an administrator) and valid: sign for `node`.
    Sign { node: String },
    /// Pending and invalid: deny.
    Deny {
        reason: &'static str,
        message: String,
    },
    /// Approved by someone else but against this signer's rules: mark it failed, sign nothing.
    Fail {
        reason: &'static str,
        message: String,
    },
}

fn has_condition(csr: &CertificateSigningRequest, type_: &str) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == type_ && c.status == "True"))
}

/// The node a valid request is for, or why it is not valid.
fn check(
    csr: &CertificateSigningRequest,
    handler_user: &str,
) -> Result<String, (&'static str, String)> {
    let spec = &csr.spec;
    let user = spec.username.as_deref().unwrap_or_default();
    if user != handler_user {
        return Err((
            "NotVirtHandler",
            format!("requested by {user:?}; only {handler_user} may ask {SIGNER_NAME}"),
        ));
    }
    let nodes: Vec<&String> = spec
        .extra
        .as_ref()
        .and_then(|e| e.get(NODE_NAME_EXTRA))
        .map(|v| v.iter().collect())
        .unwrap_or_default();
    let [node] = nodes.as_slice() else {
        return Err((
            "NotNodeBound",
            format!(
                "the requester's token names no single node ({NODE_NAME_EXTRA}); \
                 only a token bound to a virt-handler pod may ask"
            ),
        ));
    };
    let mut usages: Vec<&str> = spec.usages.iter().flatten().map(String::as_str).collect();
    usages.sort_unstable();
    usages.dedup();
    let mut want = USAGES.to_vec();
    want.sort_unstable();
    if usages != want {
        return Err((
            "UnsupportedUsages",
            format!("usages must be {}", USAGES.join(", ")),
        ));
    }
    let pem = String::from_utf8_lossy(&spec.request.0);
    let (cn, sans) = node_identity::requested_names(&pem)
        .map_err(|e| ("BadRequest", format!("spec.request: {e}")))?;
    let want_cn = node_identity::common_name(node);
    if cn.as_deref() != Some(want_cn.as_str()) || sans != [node.as_str()] {
        return Err((
            "WrongNode",
            format!(
                "the request names CN={}, SAN={}, but the requester runs on node {node:?}: \
                 a handler may only ask for CN={want_cn}, SAN={node}",
                cn.unwrap_or_default(),
                sans.join(",")
            ),
        ));
    }
    Ok((*node).clone())
}

/// The pure decision for `csr`, asked by `handler_user` when valid.
pub fn review(csr: &CertificateSigningRequest, handler_user: &str) -> Verdict {
    if csr.spec.signer_name != SIGNER_NAME
        || csr
            .status
            .as_ref()
            .is_some_and(|s| s.certificate.as_ref().is_some_and(|c| !c.0.is_empty()))
        || has_condition(csr, "Denied")
        || has_condition(csr, "Failed")
    {
        return Verdict::Ignore;
    }
    let approved = has_condition(csr, "Approved");
    match (approved, check(csr, handler_user)) {
        (false, Ok(node)) => Verdict::Approve { node },
        (true, Ok(node)) => Verdict::Sign { node },
        (false, Err((reason, message))) => Verdict::Deny { reason, message },
        (true, Err((reason, message))) => Verdict::Fail { reason, message },
    }
}

/// Lifetime of a handler certificate: the policy's leaf lifetime, shorter if the request asks.
pub fn validity(policy: &CertPolicy, expiration_seconds: Option<i32>) -> Duration {
    let asked = expiration_seconds
        .filter(|s| *s > 0)
        .map(|s| Duration::seconds(i64::from(s)));
    asked.map_or(policy.server.duration, |a| a.min(policy.server.duration))
}

#[derive(Debug, thiserror::Error)]
pub enum SignerError {
    #[error("{0}")]
    Kube(#[from] kube::Error),
    #[error("no virt-handler CA yet (Secret {NAMESPACE}/{0} has none)")]
    NoCa(&'static str),
    #[error("signing: {0}")]
    Certs(#[from] virt_certs::CertError),
}

fn condition(type_: &str, reason: &str, message: String) -> CertificateSigningRequestCondition {
    let now =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    CertificateSigningRequestCondition {
        type_: type_.into(),
        status: "True".into(),
        reason: Some(reason.into()),
        message: Some(message),
        last_update_time: Some(now.clone()),
        last_transition_time: Some(now),
    }
}

async fn policy(ctx: &Ctx) -> CertPolicy {
    let kvs: Api<KubeVirt> = Api::namespaced(ctx.client.clone(), NAMESPACE);
    match kvs.list(&Default::default()).await {
        Ok(list) => list
            .items
            .first()
            .and_then(|kv| CertPolicy::from_spec(kv.spec.certificate_rotate_strategy.as_ref()).ok())
            .unwrap_or_default(),
        Err(e) => {
            tracing::warn!(error = %e, "reading the KubeVirt resource; default certificate lifetimes");
            CertPolicy::default()
        }
    }
}

async fn sign(
    ctx: &Ctx,
    api: &Api<CertificateSigningRequest>,
    csr: &CertificateSigningRequest,
    node: &str,
) -> Result<(), SignerError> {
    // The approval just written wakes this controller again while its cache may still show
    // the request unsigned: a second certificate would be refused by kube-apiserver (one
    // certificate per request), so the stored object decides.
    let fresh = api.get(&csr.name_any()).await?;
    if fresh
        .status
        .as_ref()
        .and_then(|s| s.certificate.as_ref())
        .is_some_and(|c| !c.0.is_empty())
    {
        return Ok(());
    }
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), NAMESPACE);
    let secret_name = Domain::Handler.ca_secret();
    let now = OffsetDateTime::now_utc();
    let store = secrets
        .get_opt(secret_name)
        .await?
        .map(|s| rotation::read_ca_secret(&s, now))
        .unwrap_or_default();
    // A pending CA signs only while there is no active one (an install being migrated).
    let pem = store
        .active
        .or(store.next.map(|p| p.ca))
        .ok_or(SignerError::NoCa(secret_name))?;
    let ca = Ca::from_pem(&pem.cert, &pem.key)?;
    let validity = validity(&policy(ctx).await, csr.spec.expiration_seconds);
    let request = String::from_utf8_lossy(&csr.spec.request.0);
    let signed = ca.sign_handler_request(&request, node, validity, now)?;
    let patch = json!({"status": {"certificate": ByteString(signed.cert_pem.into_bytes())}});
    api.patch_status(
        &csr.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    tracing::info!(csr = %csr.name_any(), node, not_after = %signed.not_after, "signed a virt-handler certificate");
    ctx.metrics.handler_request("signed");
    Ok(())
}

async fn apply(csr: Arc<CertificateSigningRequest>, ctx: Arc<Ctx>) -> Result<Action, SignerError> {
    let api: Api<CertificateSigningRequest> = Api::all(ctx.client.clone());
    let name = csr.name_any();
    match review(&csr, &handler_user()) {
        Verdict::Ignore => {}
        Verdict::Approve { node } => {
            let cond = condition(
                "Approved",
                "NodeBoundHandler",
                format!("requested by the virt-handler of node {node}, for that node"),
            );
            let patch = json!({"status": {"conditions": [cond]}});
            let approved = api
                .patch_approval(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            sign(&ctx, &api, &approved, &node).await?;
        }
        Verdict::Sign { node } => sign(&ctx, &api, &csr, &node).await?,
        Verdict::Deny { reason, message } => {
            tracing::warn!(csr = %name, reason, %message, "denied a virt-handler certificate request");
            let patch = json!({"status": {"conditions": [condition("Denied", reason, message)]}});
            api.patch_approval(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            ctx.metrics.handler_request("denied");
        }
        Verdict::Fail { reason, message } => {
            tracing::warn!(csr = %name, reason, %message, "an approved virt-handler certificate request breaks the signer's rules; not signed");
            let mut conditions = csr
                .status
                .as_ref()
                .and_then(|s| s.conditions.clone())
                .unwrap_or_default();
            conditions.push(condition("Failed", reason, message));
            let patch = json!({"status": {"conditions": conditions}});
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            ctx.metrics.handler_request("failed");
        }
    }
    Ok(Action::await_change())
}

fn retry(_csr: Arc<CertificateSigningRequest>, e: &SignerError, _ctx: Arc<Ctx>) -> Action {
    tracing::warn!(error = %e, "handling a virt-handler certificate request failed; retrying");
    Action::requeue(StdDuration::from_secs(5))
}

/// Signs virt-handler certificate requests until `stop`.
pub async fn run(ctx: Arc<Ctx>, stop: CancellationToken) {
    let api: Api<CertificateSigningRequest> = Api::all(ctx.client.clone());
    let config = watcher::Config::default().fields(&format!("spec.signerName={SIGNER_NAME}"));
    virt_controllers::watch::selected_controller(
        api,
        config,
        "certificatesigningrequests",
        &ctx.metrics.watches,
    )
    .graceful_shutdown_on(async move { stop.cancelled().await })
    .run(apply, retry, ctx)
    .for_each(|_| async {})
    .await;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::collections::BTreeMap;

    use k8s_openapi::api::certificates::v1::{
        CertificateSigningRequestSpec, CertificateSigningRequestStatus,
    };

    use super::*;

    fn csr(names: &str, bound_to: Option<&str>, user: &str) -> CertificateSigningRequest {
        let req = node_identity::request(names).unwrap();
        CertificateSigningRequest {
            spec: CertificateSigningRequestSpec {
                signer_name: SIGNER_NAME.into(),
                request: ByteString(req.csr_pem.into_bytes()),
                usages: Some(USAGES.iter().rev().map(|u| u.to_string()).collect()),
                username: Some(user.into()),
                extra: bound_to.map(|n| {
                    BTreeMap::from([
                        (NODE_NAME_EXTRA.to_string(), vec![n.to_string()]),
                        (
                            "authentication.kubernetes.io/pod-name".to_string(),
                            vec!["virt-handler-x".to_string()],
                        ),
                    ])
                }),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn with_condition(mut c: CertificateSigningRequest, t: &str) -> CertificateSigningRequest {
        c.status = Some(CertificateSigningRequestStatus {
            conditions: Some(vec![condition(t, "Test", String::new())]),
            ..Default::default()
        });
        c
    }

    #[test]
    fn a_handler_gets_a_certificate_for_its_own_node_only() {
        let u = handler_user();
        assert_eq!(
            review(&csr("node-a", Some("node-a"), &u), &u),
            Verdict::Approve {
                node: "node-a".into()
            }
        );
        let Verdict::Deny { reason, message } = review(&csr("node-b", Some("node-a"), &u), &u)
        else {
            panic!("a request for another node must be denied");
        };
        assert_eq!(reason, "WrongNode");
        assert!(
            message.contains("node-b") && message.contains("\"node-a\""),
            "{message}"
        );
        let Verdict::Deny { reason, .. } = review(&csr("node-a", None, &u), &u) else {
            panic!("an unbound token must be denied");
        };
        assert_eq!(reason, "NotNodeBound");
        let Verdict::Deny { reason, .. } = review(
            &csr("node-a", Some("node-a"), "system:serviceaccount:default:x"),
            &u,
        ) else {
            panic!("another account must be denied");
        };
        assert_eq!(reason, "NotVirtHandler");
        let mut narrow = csr("node-a", Some("node-a"), &u);
        narrow.spec.usages = Some(vec!["client auth".into()]);
        assert!(matches!(
            review(&narrow, &u),
            Verdict::Deny {
                reason: "UnsupportedUsages",
                ..
            }
        ));
    }

    #[test]
    fn decided_requests_are_left_alone_and_foreign_approvals_are_checked() {
        let u = handler_user();
        let mut other = csr("node-a", Some("node-a"), &u);
        other.spec.signer_name = "kubernetes.io/kube-apiserver-client".into();
        assert_eq!(review(&other, &u), Verdict::Ignore);
        let denied = with_condition(csr("node-a", Some("node-a"), &u), "Denied");
        assert_eq!(review(&denied, &u), Verdict::Ignore);
        let approved = with_condition(csr("node-a", Some("node-a"), &u), "Approved");
        assert_eq!(
            review(&approved, &u),
            Verdict::Sign {
                node: "node-a".into()
            }
        );
        let approved_wrong = with_condition(csr("node-b", Some("node-a"), &u), "Approved");
        assert!(matches!(
            review(&approved_wrong, &u),
            Verdict::Fail {
                reason: "WrongNode",
                ..
            }
        ));
        let mut issued = approved;
        if let Some(s) = issued.status.as_mut() {
            s.certificate = Some(ByteString(b"-----BEGIN CERTIFICATE-----".to_vec()));
        }
        assert_eq!(review(&issued, &u), Verdict::Ignore);
    }

    #[test]
    fn lifetime_is_the_policy_unless_the_request_asks_for_less() {
        let p = CertPolicy::default();
        assert_eq!(validity(&p, None), p.server.duration);
        assert_eq!(validity(&p, Some(3600)), Duration::hours(1));
        assert_eq!(validity(&p, Some(0)), p.server.duration);
        assert_eq!(validity(&p, Some(i32::MAX)), p.server.duration);
    }
}
