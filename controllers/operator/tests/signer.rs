//! The signer of virt-handler certificates against a real kube-apiserver: a request made with
//! a service-account token bound to a virt-handler pod on node-a gets a certificate naming
//! node-a, signed by the handler CA; the same token asking for node-b, and a request by any
//! other user, are denied with the reason, and nothing is signed for them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret, ServiceAccount};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use virt_certs::node_identity::{self, SIGNER_NAME, USAGES};
use virt_operator::metrics::Metrics;
use virt_operator::reconcile::Ctx;
use virt_operator::rotation::{self, CaStore, Domain, Pem};
use virt_operator::status::Defaults;

const NS: &str = "kubevirt";

async fn apply<K>(api: &Api<K>, name: &str, v: serde_json::Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(
        name,
        &PatchParams::apply("signer-test").force(),
        &Patch::Apply(v),
    )
    .await
    .unwrap()
}

/// A client authenticating with `token` against the same kube-apiserver.
async fn client_with_token(env: &kube_testenv::KubeApi, token: &str) -> Client {
    let mut kc = kube::config::Kubeconfig::read_from(env.dir.path().join("kubeconfig")).unwrap();
    for u in &mut kc.auth_infos {
        if let Some(a) = u.auth_info.as_mut() {
            a.token = Some(token.to_string().into());
        }
    }
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    Client::try_from(cfg).unwrap()
}

async fn ask(c: &Client, name: &str, for_node: &str) -> CertificateSigningRequest {
    let req = node_identity::request(for_node).unwrap();
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            name: Some(name.into()),
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
    Api::<CertificateSigningRequest>::all(c.clone())
        .create(&PostParams::default(), &csr)
        .await
        .unwrap()
}

/// The request once decided: its certificate, or the condition that refused it.
async fn decided(admin: &Client, name: &str) -> Result<String, (String, String)> {
    let api: Api<CertificateSigningRequest> = Api::all(admin.clone());
    kube_testenv::eventually(
        &format!("CertificateSigningRequest {name} decided"),
        Duration::from_secs(60),
        || async {
            let st = api.get(name).await.ok()?.status?;
            if let Some(c) = st
                .conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == "Denied" || c.type_ == "Failed")
            {
                return Some(Err((
                    c.reason.clone().unwrap_or_default(),
                    c.message.clone().unwrap_or_default(),
                )));
            }
            let cert = st.certificate.filter(|c| !c.0.is_empty())?;
            Some(Ok(String::from_utf8(cert.0).unwrap()))
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handlers_get_certificates_for_their_own_node_only() {
    let env = kube_testenv::KubeApi::start("signer-test-token").await;
    let admin = env.client.clone();
    apply(
        &Api::<Namespace>::all(admin.clone()),
        NS,
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}),
    )
    .await;
    let sa: Api<ServiceAccount> = Api::namespaced(admin.clone(), NS);
    apply(
        &sa,
        "virt-handler",
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "virt-handler"}}),
    )
    .await;
    for n in ["node-a", "node-b"] {
        apply(
            &Api::<Node>::all(admin.clone()),
            n,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n}}),
        )
        .await;
    }
    let pod = apply(
        &Api::<Pod>::namespaced(admin.clone(), NS),
        "virt-handler-a",
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "virt-handler-a"},
            "spec": {"nodeName": "node-a", "serviceAccountName": "virt-handler",
                "containers": [{"name": "virt-handler", "image": "x"}]}}),
    )
    .await;

    // The handler CA, as the rotation stores it.
    let ca = virt_certs::Ca::generate("kubevirt-rs-handler-ca", time::Duration::days(30)).unwrap();
    let store = CaStore {
        active: Some(Pem {
            cert: ca.cert_pem().to_string(),
            key: ca.key_pem(),
        }),
        next: None,
        bundle: ca.cert_pem().to_string(),
    };
    let secret = rotation::ca_secret(Domain::Handler, &store);
    Api::<Secret>::namespaced(admin.clone(), NS)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();

    let ctx = Arc::new(Ctx {
        client: admin.clone(),
        recorder: None,
        defaults: Defaults {
            registry: "localhost/kubevirt-rs".into(),
            tag: "latest".into(),
            version: "0.1.0".into(),
        },
        metrics: Arc::new(Metrics::default()),
        etcd_volume_size: "1Gi".into(),
        etcd_host_dir: "/var/lib/kubevirt-rs".into(),
    });
    let stop = CancellationToken::new();
    let signer = tokio::spawn(virt_operator::signer::run(ctx.clone(), stop.clone()));

    // The token kubelet would mount into the handler pod of node-a.
    let tr = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec!["https://kubernetes.default.svc".into()],
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
            expiration_seconds: Some(3600),
        },
        ..TokenRequest::default()
    };
    let token = sa
        .create_token_request("virt-handler", &PostParams::default(), &tr)
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
    let handler_a = client_with_token(&env, &token).await;

    ask(&handler_a, "own-node", "node-a").await;
    let cert = decided(&admin, "own-node").await.expect("signed");
    assert_eq!(
        node_identity::common_name_of_pem(&cert).as_deref(),
        Some("virt-handler:node-a")
    );
    assert!(rotation::verifies(
        &cert,
        &[ca.cert_pem()],
        rotation::LeafKind::Peer,
        time::OffsetDateTime::now_utc()
    ));

    ask(&handler_a, "other-node", "node-b").await;
    let (reason, message) = decided(&admin, "other-node").await.unwrap_err();
    assert_eq!(reason, "WrongNode", "{message}");
    assert!(
        message.contains("node-b") && message.contains("\"node-a\""),
        "{message}"
    );

    // Anyone else (here the cluster admin) asking this signer: denied, whatever the node.
    ask(&admin, "not-a-handler", "node-a").await;
    let (reason, message) = decided(&admin, "not-a-handler").await.unwrap_err();
    assert_eq!(reason, "NotVirtHandler", "{message}");

    let metrics = ctx.metrics.encode();
    assert!(
        metrics
            .contains("kubevirt_operator_handler_certificate_requests_total{result=\"signed\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics
            .contains("kubevirt_operator_handler_certificate_requests_total{result=\"denied\"} 2"),
        "{metrics}"
    );
    stop.cancel();
    let _ = signer.await;
}
