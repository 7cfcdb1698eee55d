//! The reconciler against a real kube-apiserver (with its etcd; no kubelet or controllers, so
//! the test plays their part by writing workload status): install applies everything with
//! the finalizer and status, the APIServices only once virt-apiserver has a replica, Deployed
//! once all is rolled out; an imageTag change is a new target version; deleting the KubeVirt
//! resource removes every object and then the finalizer.
//!
//! kube-apiserver and etcd: [`kube_testenv`] (it waits for `kube-system` too).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::{Api, Client};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use virt_operator::kubevirt::KubeVirt;
use virt_operator::metrics::Metrics;
use virt_operator::reconcile::{self, Ctx};
use virt_operator::status::Defaults;

use kube_testenv::KubeApi;

async fn start() -> KubeApi {
    KubeApi::start("operator-test-token").await
}

/// Polls `f` until it returns Some, for at most 60 s.
async fn eventually<T, F, Fut>(what: &str, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    kube_testenv::eventually(what, Duration::from_secs(60), f).await
}

/// What kubelet and the workload controllers would report: every replica updated and ready.
async fn roll_out(client: &Client) {
    let pp = PatchParams::default();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "kubevirt");
    for d in deployments.list(&Default::default()).await.unwrap() {
        let n = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let status = json!({"status": {"observedGeneration": d.metadata.generation, "replicas": n,
            "updatedReplicas": n, "readyReplicas": n, "availableReplicas": n}});
        deployments
            .patch_status(
                d.metadata.name.as_deref().unwrap(),
                &pp,
                &Patch::Merge(status),
            )
            .await
            .unwrap();
    }
    let sts: Api<StatefulSet> = Api::namespaced(client.clone(), "kubevirt");
    for s in sts.list(&Default::default()).await.unwrap() {
        let status = json!({"status": {"observedGeneration": s.metadata.generation, "replicas": 1,
            "readyReplicas": 1, "updatedReplicas": 1, "currentRevision": "r", "updateRevision": "r"}});
        sts.patch_status(
            s.metadata.name.as_deref().unwrap(),
            &pp,
            &Patch::Merge(status),
        )
        .await
        .unwrap();
    }
    let ds: Api<DaemonSet> = Api::namespaced(client.clone(), "kubevirt");
    for d in ds.list(&Default::default()).await.unwrap() {
        let status = json!({"status": {"observedGeneration": d.metadata.generation,
            "desiredNumberScheduled": 1, "currentNumberScheduled": 1, "numberMisscheduled": 0,
            "numberReady": 1, "updatedNumberScheduled": 1, "numberAvailable": 1}});
        ds.patch_status(
            d.metadata.name.as_deref().unwrap(),
            &pp,
            &Patch::Merge(status),
        )
        .await
        .unwrap();
    }
    let apis: Api<APIService> = Api::all(client.clone());
    for a in apis.list(&Default::default()).await.unwrap() {
        if a.metadata
            .name
            .as_deref()
            .is_some_and(|n| n.ends_with("kubevirt.io") && n.starts_with("v1."))
        {
            let status = json!({"status": {"conditions": [{"type": "Available", "status": "True",
                "reason": "Passed", "message": "test", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
            apis.patch_status(
                a.metadata.name.as_deref().unwrap(),
                &pp,
                &Patch::Merge(status),
            )
            .await
            .unwrap();
        }
    }
}

fn kv_status(kv: &KubeVirt) -> (String, String, String) {
    let s = kv.status.clone().unwrap_or_default();
    (
        s.phase.unwrap_or_default(),
        s.target_kube_virt_version.unwrap_or_default(),
        s.observed_kube_virt_version.unwrap_or_default(),
    )
}

/// What kube-apiserver and the operator's install give a cluster: the `kubevirt` namespace,
/// the authentication ConfigMap, the KubeVirt CRD served; then the operator running.
struct Operator {
    kvs: Api<KubeVirt>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Operator {
    async fn start(c: &Client) -> Self {
        let pp = PostParams::default();
        Api::<Namespace>::all(c.clone())
            .create(
                &pp,
                &serde_json::from_value(json!({"metadata": {"name": "kubevirt"}})).unwrap(),
            )
            .await
            .unwrap();
        // kube-apiserver publishes it with --requestheader-* flags; this one runs without.
        let ca = virt_certs::Ca::generate("front-proxy", time::Duration::days(1)).unwrap();
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "extension-apiserver-authentication"},
            "data": {"client-ca-file": ca.cert_pem(), "requestheader-client-ca-file": ca.cert_pem(),
                     "requestheader-allowed-names": "[\"front-proxy-client\"]"}
        }))
        .unwrap();
        Api::<ConfigMap>::namespaced(c.clone(), "kube-system")
            .create(&pp, &cm)
            .await
            .unwrap();
        let crds: Api<CustomResourceDefinition> = Api::all(c.clone());
        crds.create(&pp, &virt_operator::kubevirt::crd())
            .await
            .unwrap();
        let kvs: Api<KubeVirt> = Api::namespaced(c.clone(), "kubevirt");
        eventually("KubeVirt served", || async {
            kvs.list(&Default::default()).await.ok()
        })
        .await;

        let metrics = Arc::new(Metrics::default());
        let ctx = Arc::new(Ctx {
            client: c.clone(),
            recorder: None,
            defaults: Defaults {
                registry: "localhost/kubevirt-rs".into(),
                tag: "latest".into(),
                version: "0.1.0".into(),
            },
            metrics: metrics.clone(),
            etcd_volume_size: "1Gi".into(),
            etcd_host_dir: "/var/lib/kubevirt-rs".into(),
        });
        let stop = CancellationToken::new();
        let task = tokio::spawn(reconcile::run(ctx, stop.clone()));
        Self {
            kvs,
            metrics,
            stop,
            task,
        }
    }

    async fn stop(self) {
        self.stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
    }
}

#[tokio::test]
async fn install_upgrade_and_uninstall_against_a_real_kube_apiserver() {
    let api = start().await;
    let c = api.client.clone();
    let pp = PostParams::default();
    let operator = Operator::start(&c).await;
    let kvs = operator.kvs.clone();

    let cr: KubeVirt = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1alpha3", "kind": "KubeVirt",
        "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
        "spec": {"configuration": {"developerConfiguration": {"useEmulation": true}}}
    }))
    .unwrap();
    // Before any KubeVirt resource: the API layer only, from the operator's defaults (so the
    // user's KubeVirt at kubevirt.io/v1 has a server), cluster-scoped objects owned by the
    // CRD (garbage-collected with manifests/virt-operator.yaml).
    let deployments = Api::<Deployment>::namespaced(c.clone(), "kubevirt");
    let boot = eventually("API layer bootstrapped", || async {
        deployments.get_opt("kubevirt-apiserver").await.ok()?
    })
    .await;
    assert_eq!(
        boot.spec.unwrap().template.spec.unwrap().containers[0]
            .image
            .as_deref(),
        Some("localhost/kubevirt-rs/virt-apiserver:latest")
    );
    assert!(
        deployments
            .get_opt("virt-controller")
            .await
            .unwrap()
            .is_none()
    );
    let crd_uid = Api::<CustomResourceDefinition>::all(c.clone())
        .get("kubevirts.kubevirt.io")
        .await
        .unwrap()
        .metadata
        .uid;
    let role = Api::<ClusterRole>::all(c.clone())
        .get("kubevirt-apiserver")
        .await
        .unwrap();
    let owner = &role.metadata.owner_references.unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), Some(owner.uid.clone())),
        ("CustomResourceDefinition", crd_uid)
    );

    kvs.create(&pp, &cr).await.unwrap();

    // Everything but the APIServices, while no virt-apiserver replica is available.
    let kv = eventually("Deploying with the workloads applied", || async {
        let kv = kvs.get("kubevirt").await.ok()?;
        let deployed = Api::<Deployment>::namespaced(c.clone(), "kubevirt")
            .get_opt("virt-controller")
            .await
            .ok()??;
        (kv_status(&kv).0 == "Deploying" && deployed.metadata.name.is_some()).then_some(kv)
    })
    .await;
    assert!(
        kv.metadata
            .finalizers
            .unwrap_or_default()
            .iter()
            .any(|f| f == virt_operator::kubevirt::FINALIZER)
    );
    assert_eq!(kv_status(&kvs.get("kubevirt").await.unwrap()).1, "0.1.0");
    let apis: Api<APIService> = Api::all(c.clone());
    assert!(
        apis.get_opt("v1.kubevirt.io").await.unwrap().is_none(),
        "APIService before a replica serves"
    );
    let sts = Api::<StatefulSet>::namespaced(c.clone(), "kubevirt")
        .get("kubevirt-etcd")
        .await
        .unwrap();
    let sts_spec = sts.spec.unwrap();
    assert!(
        sts_spec.volume_claim_templates.is_none(),
        "no StorageClass here: emptyDir"
    );
    let apiserver = Api::<Deployment>::namespaced(c.clone(), "kubevirt")
        .get("kubevirt-apiserver")
        .await
        .unwrap();
    let args = apiserver.spec.unwrap().template.spec.unwrap().containers[0]
        .args
        .clone()
        .unwrap();
    assert!(
        args.iter()
            .any(|a| a.starts_with("--etcd-servers=https://10.0.0.")),
        "{args:?}"
    );
    assert!(args.iter().any(|a| a.starts_with("--etcd-cafile=")));
    let controller = Api::<Deployment>::namespaced(c.clone(), "kubevirt")
        .get("virt-controller")
        .await
        .unwrap();
    let cargs = controller.spec.unwrap().template.spec.unwrap().containers[0]
        .args
        .clone()
        .unwrap();
    assert!(
        cargs.contains(&"--allow-emulation=true".to_string()),
        "{cargs:?}"
    );
    for s in [
        "kubevirt-apiserver-tls",
        "kubevirt-etcd-server",
        "kubevirt-etcd-client",
        "virt-apiserver-handler-client",
    ] {
        Api::<Secret>::namespaced(c.clone(), "kubevirt")
            .get(s)
            .await
            .unwrap();
    }
    // The handlers' trust bundle and certificate lifetime; each handler's own key is made on
    // its node (no Secret holds it).
    let handler_ca =
        Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(c.clone(), "kubevirt")
            .get("virt-handler-ca")
            .await
            .unwrap();
    let data = handler_ca.data.unwrap_or_default();
    assert!(data["ca.crt"].contains("BEGIN CERTIFICATE"), "{data:?}");
    assert!(data.contains_key("renew-before-seconds"), "{data:?}");

    // Replicas available: the APIServices, with a caBundle. (No virt-apiserver really serves
    // here, so kube-apiserver's availability check keeps them unavailable and the KubeVirt
    // resource Deploying: the cluster e2e test sees Deployed.)
    let a = eventually("APIServices applied", || {
        let c = c.clone();
        let apis = apis.clone();
        async move {
            roll_out(&c).await;
            apis.get_opt("v1.subresources.kubevirt.io").await.ok()??;
            apis.get_opt("v1.kubevirt.io").await.ok()?
        }
    })
    .await;
    assert!(!a.spec.unwrap().ca_bundle.unwrap().0.is_empty());
    let kv = kvs.get("kubevirt").await.unwrap();
    let conds = kv.status.clone().unwrap().conditions.unwrap();
    let progressing = conds.iter().find(|c| c.type_ == "Progressing").unwrap();
    assert_eq!(progressing.status, kubevirt_api::ConditionStatus::True);
    let uid = Api::<Secret>::namespaced(c.clone(), "kubevirt")
        .get("kubevirt-apiserver-tls")
        .await
        .unwrap()
        .metadata
        .uid;

    // Upgrade: a new tag is a new target; the images follow; certificates stay.
    kvs.patch(
        "kubevirt",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"imageTag": "v2"}})),
    )
    .await
    .unwrap();
    eventually("upgrade targeted", || async {
        let kv = kvs.get("kubevirt").await.ok()?;
        let d = Api::<Deployment>::namespaced(c.clone(), "kubevirt")
            .get("virt-controller")
            .await
            .ok()?;
        let image = d.spec?.template.spec?.containers[0].image.clone()?;
        (kv_status(&kv).1 == "v2" && image == "localhost/kubevirt-rs/virt-controller:v2")
            .then_some(())
    })
    .await;
    let sts = Api::<StatefulSet>::namespaced(c.clone(), "kubevirt")
        .get("kubevirt-etcd")
        .await
        .unwrap();
    assert_eq!(
        sts.spec.unwrap().template.spec.unwrap().containers[0]
            .image
            .as_deref(),
        Some("localhost/kubevirt-rs/etcd:latest"),
        "etcd keeps its tag"
    );
    let uid2 = Api::<Secret>::namespaced(c.clone(), "kubevirt")
        .get("kubevirt-apiserver-tls")
        .await
        .unwrap()
        .metadata
        .uid;
    assert_eq!(uid, uid2);

    // Uninstall (no VM API served here: nothing to block): everything but the API layer,
    // which stays while the operator runs, so kubevirt.io/v1 stays served for a re-install.
    kvs.delete("kubevirt", &DeleteParams::default())
        .await
        .unwrap();
    eventually("KubeVirt gone", || async {
        kvs.get_opt("kubevirt").await.ok()?.is_none().then_some(())
    })
    .await;
    let deployments = Api::<Deployment>::namespaced(c.clone(), "kubevirt");
    assert!(
        deployments
            .get_opt("virt-controller")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        Api::<DaemonSet>::namespaced(c.clone(), "kubevirt")
            .get_opt("virt-handler")
            .await
            .unwrap()
            .is_none()
    );
    for name in ["virt-controller", "virt-handler", "kubevirt.io:edit"] {
        assert!(
            Api::<ClusterRole>::all(c.clone())
                .get_opt(name)
                .await
                .unwrap()
                .is_none(),
            "{name}"
        );
    }
    assert!(apis.get_opt("v1.kubevirt.io").await.unwrap().is_some());
    assert!(
        apis.get_opt("v1.subresources.kubevirt.io")
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        deployments
            .get_opt("kubevirt-apiserver")
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        Api::<StatefulSet>::namespaced(c.clone(), "kubevirt")
            .get_opt("kubevirt-etcd")
            .await
            .unwrap()
            .is_some()
    );
    Api::<Secret>::namespaced(c.clone(), "kubevirt")
        .get("kubevirt-apiserver-tls")
        .await
        .unwrap();
    // The API layer is the bootstrap's again: back at the operator's default tag.
    eventually("API layer back at the default tag", || async {
        let d = deployments.get("kubevirt-apiserver").await.ok()?;
        let image = d.spec?.template.spec?.containers[0].image.clone()?;
        (image == "localhost/kubevirt-rs/virt-apiserver:latest").then_some(())
    })
    .await;
    operator.stop().await;
}

fn data(s: &Secret, key: &str) -> String {
    s.data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| String::from_utf8(b.0.clone()).unwrap())
        .unwrap_or_default()
}

/// Pod-template annotations and generation of every workload: a change rolls pods.
async fn templates(c: &Client) -> Vec<(String, Option<i64>, String)> {
    let mut out = Vec::new();
    for (kind, plural) in [
        ("Deployment", "deployments"),
        ("DaemonSet", "daemonsets"),
        ("StatefulSet", "statefulsets"),
    ] {
        let ar =
            ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("apps", "v1", kind), plural);
        for o in Api::<DynamicObject>::namespaced_with(c.clone(), "kubevirt", &ar)
            .list(&Default::default())
            .await
            .unwrap()
        {
            out.push((
                o.metadata.name.clone().unwrap(),
                o.metadata.generation,
                o.data["spec"]["template"]["metadata"]["annotations"].to_string(),
            ));
        }
    }
    out.sort();
    out
}

const LEAVES: [(&str, &str, virt_operator::rotation::LeafKind); 4] = [
    (
        "kubevirt-apiserver-tls",
        "kubevirt-rs-apiserver-ca",
        virt_operator::rotation::LeafKind::Server,
    ),
    (
        "virt-apiserver-handler-client",
        "kubevirt-rs-handler-ca",
        virt_operator::rotation::LeafKind::Client,
    ),
    (
        "kubevirt-etcd-server",
        "kubevirt-rs-etcd-ca",
        virt_operator::rotation::LeafKind::Server,
    ),
    (
        "kubevirt-etcd-client",
        "kubevirt-rs-etcd-ca",
        virt_operator::rotation::LeafKind::Client,
    ),
];

/// `certificateRotateStrategy.selfSigned.server: {duration: 1m, renewBefore: 50s}`: every leaf
/// is re-issued ~10 s after it was issued, from the same CA (CA Secrets, every `ca.crt` and the
/// APIServices' caBundle stay), and no pod template changes. A bad duration then stops
/// rotation and shows as Degraded.
#[tokio::test]
async fn leaf_certificates_rotate_from_the_same_ca_without_touching_pod_templates() {
    let api = start().await;
    let c = api.client.clone();
    let operator = Operator::start(&c).await;
    let kvs = operator.kvs.clone();
    let secrets: Api<Secret> = Api::namespaced(c.clone(), "kubevirt");
    let cr: KubeVirt = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1alpha3", "kind": "KubeVirt",
        "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
        "spec": {"certificateRotateStrategy": {"selfSigned": {
            "server": {"duration": "1m", "renewBefore": "50s"}}}}
    }))
    .unwrap();
    kvs.create(&PostParams::default(), &cr).await.unwrap();
    let apis: Api<APIService> = Api::all(c.clone());
    eventually("installed with both APIServices", || {
        let c = c.clone();
        let apis = apis.clone();
        async move {
            roll_out(&c).await;
            apis.get_opt("v1.subresources.kubevirt.io").await.ok()??;
            apis.get_opt("v1.kubevirt.io").await.ok()?
        }
    })
    .await;
    let ca_bundle = || async {
        let a = apis.get("v1.kubevirt.io").await.unwrap();
        String::from_utf8(a.spec.unwrap().ca_bundle.unwrap().0).unwrap()
    };
    let snapshot = || async {
        let mut v = Vec::new();
        for (leaf, _, _) in LEAVES {
            let s = secrets.get(leaf).await.unwrap();
            v.push((data(&s, "tls.crt"), data(&s, "ca.crt")));
        }
        v
    };
    let mut cas = Vec::new();
    for ca in [
        "kubevirt-rs-apiserver-ca",
        "kubevirt-rs-handler-ca",
        "kubevirt-rs-etcd-ca",
    ] {
        let s = secrets.get(ca).await.unwrap();
        assert!(!data(&s, "tls.key").is_empty(), "{ca} keeps its key");
        assert!(data(&s, "next.crt").is_empty(), "{ca}: no rotation pending");
        cas.push(s.data.clone());
    }
    let before = snapshot().await;
    let bundle_before = ca_bundle().await;
    let templates_before = templates(&c).await;
    let ca_of = |i: usize| {
        let bundle = &before[i].1;
        assert_eq!(
            bundle.matches("BEGIN CERTIFICATE").count(),
            1,
            "{}",
            LEAVES[i].0
        );
        bundle.clone()
    };
    assert_eq!(bundle_before, ca_of(0));
    assert!(
        !templates_before
            .iter()
            .any(|(_, _, a)| a.contains("cert-sha256")),
        "{templates_before:?}"
    );

    let start = std::time::Instant::now();
    let after = eventually("every leaf re-issued", || async {
        roll_out(&c).await;
        let now = snapshot().await;
        now.iter()
            .zip(&before)
            .all(|(n, b)| n.0 != b.0)
            .then_some(now)
    })
    .await;
    let took = start.elapsed();
    eprintln!(
        "every leaf re-issued {:.1} s after the first check",
        took.as_secs_f64()
    );
    assert!(took < Duration::from_secs(30), "took {took:?}");
    let now = time::OffsetDateTime::now_utc();
    for (i, (leaf, ca_secret, kind)) in LEAVES.iter().enumerate() {
        assert_eq!(after[i].1, before[i].1, "{leaf}: ca.crt unchanged");
        let ca = data(&secrets.get(ca_secret).await.unwrap(), "tls.crt");
        assert!(
            virt_operator::rotation::verifies(&after[i].0, &[&ca], *kind, now),
            "{leaf} is signed by {ca_secret}"
        );
        let (nb, na) = virt_certs::validity_of(&after[i].0).unwrap();
        // One minute (and the 5 minutes' clock-skew allowance before now).
        assert_eq!((na - nb).whole_seconds(), 360, "{leaf}");
    }
    for (i, ca) in [
        "kubevirt-rs-apiserver-ca",
        "kubevirt-rs-handler-ca",
        "kubevirt-rs-etcd-ca",
    ]
    .iter()
    .enumerate()
    {
        assert_eq!(
            secrets.get(ca).await.unwrap().data,
            cas[i],
            "{ca} unchanged"
        );
    }
    assert_eq!(
        ca_bundle().await,
        bundle_before,
        "APIService caBundle unchanged"
    );
    assert_eq!(
        templates(&c).await,
        templates_before,
        "no pod template changed"
    );
    let metrics = operator.metrics.encode();
    for domain in ["apiserver", "handler", "etcd"] {
        assert!(
            metrics.contains(&format!(
                "kubevirt_operator_certificate_rotations_total{{domain=\"{domain}\",what=\"leaf\"}}"
            )),
            "{metrics}"
        );
    }

    // A bad duration: Degraded names the field, and the certificates are kept as they are.
    kvs.patch(
        "kubevirt",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"spec": {"certificateRotateStrategy": {"selfSigned": {
            "server": {"duration": "x"}}}}}),
        ),
    )
    .await
    .unwrap();
    let message = eventually("Degraded for the bad duration", || async {
        let kv = kvs.get("kubevirt").await.ok()?;
        let c = kv.status?.conditions?;
        let d = c.into_iter().find(|c| c.type_ == "Degraded")?;
        (d.status == kubevirt_api::ConditionStatus::True).then_some(d.message?)
    })
    .await;
    assert_eq!(
        message,
        "spec.certificateRotateStrategy.selfSigned.server.duration: invalid duration \"x\""
    );
    let frozen = snapshot().await;
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(
        snapshot().await,
        frozen,
        "no rotation with an invalid strategy"
    );
    operator.stop().await;
}

/// The KubeVirt condition of `type_`, as (status, reason, message).
async fn condition(kvs: &Api<KubeVirt>, type_: &str) -> Option<(String, String, String)> {
    let kv = kvs.get("kubevirt").await.ok()?;
    let c = kv
        .status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == type_)?;
    Some((
        format!("{:?}", c.status),
        c.reason.unwrap_or_default(),
        c.message.unwrap_or_default(),
    ))
}

fn three_members() -> KubeVirt {
    serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1alpha3", "kind": "KubeVirt",
        "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
        "spec": {"kubevirtRs": {"etcd": {"members": 3}}}
    }))
    .unwrap()
}

/// Without a default StorageClass etcd's data is in one directory (here an emptyDir: no
/// node), which three members cannot share: the field is refused by name and etcd stays one
/// member; a count other than 1 or 3 is refused by kube-apiserver itself.
#[tokio::test]
async fn three_etcd_members_without_a_storage_class_are_refused_by_name() {
    let api = start().await;
    let c = api.client.clone();
    let operator = Operator::start(&c).await;
    let kvs = operator.kvs.clone();
    kvs.create(&PostParams::default(), &three_members())
        .await
        .unwrap();
    let (status, reason, message) = eventually("Degraded names the field", || async {
        condition(&kvs, "Degraded")
            .await
            .filter(|(_, r, _)| r == "InvalidConfiguration")
    })
    .await;
    assert_eq!(status, "True");
    assert_eq!(reason, "InvalidConfiguration");
    assert!(
        message.starts_with(
            "spec.kubevirtRs.etcd.members: 3 members need a PersistentVolumeClaim each"
        ),
        "{message}"
    );
    let sts = Api::<StatefulSet>::namespaced(c.clone(), "kubevirt")
        .get("kubevirt-etcd")
        .await
        .unwrap();
    assert!(!virt_operator::render::etcd::is_cluster(&sts));
    assert_eq!(sts.spec.unwrap().replicas, Some(1));
    let two = kvs
        .patch(
            "kubevirt",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"kubevirtRs": {"etcd": {"members": 2}}}})),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        two.contains("spec.kubevirtRs.etcd.members") && two.contains("supported values"),
        "{two}"
    );
    operator.stop().await;
}

/// With a default StorageClass, three members render as a cluster: a Service per member whose
/// cluster IP is in every pod's host aliases and in the certificates, the initial cluster in a
/// ConfigMap, a PDB, a peer certificate, virt-apiserver dialling every member. The existing
/// single member (already a cluster of one) is kept and the operator waits for it before
/// adding members; no etcd runs here, so that is where this stops.
#[tokio::test]
async fn three_etcd_members_render_a_cluster_around_the_existing_member() {
    let api = start().await;
    let c = api.client.clone();
    let sc: k8s_openapi::api::storage::v1::StorageClass = serde_json::from_value(json!({
        "metadata": {"name": "standard",
                     "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
        "provisioner": "example.com/none"
    }))
    .unwrap();
    Api::<k8s_openapi::api::storage::v1::StorageClass>::all(c.clone())
        .create(&PostParams::default(), &sc)
        .await
        .unwrap();
    let operator = Operator::start(&c).await;
    let kvs = operator.kvs.clone();
    let sts_api = Api::<StatefulSet>::namespaced(c.clone(), "kubevirt");
    // The bootstrap's single member, on a claim, as an installation from before clusters.
    let single = eventually("the single member", || async {
        sts_api.get_opt("kubevirt-etcd").await.ok()?
    })
    .await;
    // A new installation on claims is a cluster of one from the start, so that a drain can
    // replace its member through a learner without a change of template.
    assert!(virt_operator::render::etcd::is_cluster(&single));
    kvs.create(&PostParams::default(), &three_members())
        .await
        .unwrap();
    let sts = eventually("the three members' template", || async {
        let s = sts_api.get("kubevirt-etcd").await.ok()?;
        let aliases = s
            .spec
            .as_ref()?
            .template
            .spec
            .as_ref()?
            .host_aliases
            .as_ref()?
            .len();
        (aliases == 3).then_some(s)
    })
    .await;
    let spec = sts.spec.unwrap();
    assert_eq!(spec.replicas, Some(1), "members join one at a time");
    assert!(spec.volume_claim_templates.is_some());
    let services = Api::<k8s_openapi::api::core::v1::Service>::namespaced(c.clone(), "kubevirt");
    let mut ips = Vec::new();
    for i in 0..3 {
        let s = services.get(&format!("kubevirt-etcd-{i}")).await.unwrap();
        ips.push(s.spec.unwrap().cluster_ip.unwrap());
    }
    let aliases: Vec<(String, Vec<String>)> = spec
        .template
        .spec
        .unwrap()
        .host_aliases
        .unwrap()
        .into_iter()
        .map(|a| (a.ip, a.hostnames.unwrap()))
        .collect();
    assert_eq!(
        aliases,
        (0..3)
            .map(|i| (ips[i].clone(), vec![format!("kubevirt-etcd-{i}")]))
            .collect::<Vec<_>>()
    );
    let cm = Api::<ConfigMap>::namespaced(c.clone(), "kubevirt")
        .get("kubevirt-etcd-cluster")
        .await
        .unwrap();
    assert_eq!(
        cm.data.unwrap()["initial-cluster"],
        "kubevirt-etcd-0=https://kubevirt-etcd-0:2380"
    );
    Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::namespaced(c.clone(), "kubevirt")
        .get("kubevirt-etcd")
        .await
        .unwrap();
    let peer = Api::<Secret>::namespaced(c.clone(), "kubevirt")
        .get("kubevirt-etcd-peer")
        .await
        .unwrap();
    let host = peer.metadata.annotations.unwrap()["kubevirt-rs.io/etcd-host"].clone();
    for ip in &ips {
        assert!(host.contains(ip.as_str()), "{host} lacks {ip}");
    }
    let apiserver = Api::<Deployment>::namespaced(c.clone(), "kubevirt")
        .get("kubevirt-apiserver")
        .await
        .unwrap();
    let args = apiserver.spec.unwrap().template.spec.unwrap().containers[0]
        .args
        .clone()
        .unwrap();
    let want = format!(
        "--etcd-servers={}",
        ips.iter()
            .map(|ip| format!("https://{ip}:2379"))
            .collect::<Vec<_>>()
            .join(",")
    );
    assert!(args.contains(&want), "{args:?}");
    let (_, _, message) = eventually("Progressing says what etcd waits for", || async {
        condition(&kvs, "Progressing")
            .await
            .filter(|(_, _, m)| m.contains("etcd"))
    })
    .await;
    assert!(
        message.contains("etcd member kubevirt-etcd-0") || message.contains("etcd's membership"),
        "{message}"
    );
    operator.stop().await;
}

/// A minimal CRD of the prometheus-operator's `kind` (any spec kept): what the operator checks
/// for before it makes a ServiceMonitor or PrometheusRule.
fn monitoring_crd(kind: &str, plural: &str) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "metadata": {"name": format!("{plural}.monitoring.coreos.com")},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(),
                      "listKind": format!("{kind}List")},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    }))
    .unwrap()
}

fn monitoring_api(c: &Client, ns: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("monitoring.coreos.com", "v1", kind),
        plural,
    );
    Api::namespaced_with(c.clone(), ns, &ar)
}

/// KubeVirt's monitoring objects: the `kubevirt-prometheus-metrics` Service always; without the
/// prometheus-operator's CRDs no ServiceMonitor nor PrometheusRule and no error; once the CRDs
/// and Prometheus' ServiceAccount (KubeVirt's default `monitoring/prometheus-k8s`) exist, the
/// operator's next reconcile makes both, and the uninstall removes them.
#[tokio::test]
async fn service_monitor_and_prometheus_rule_only_with_the_prometheus_operator() {
    let api = start().await;
    let c = api.client.clone();
    let pp = PostParams::default();
    let operator = Operator::start(&c).await;
    let kvs = operator.kvs.clone();
    let cr: KubeVirt = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1alpha3", "kind": "KubeVirt",
        "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
        "spec": {}
    }))
    .unwrap();
    kvs.create(&pp, &cr).await.unwrap();
    let services = Api::<k8s_openapi::api::core::v1::Service>::namespaced(c.clone(), "kubevirt");
    let svc = eventually("kubevirt-prometheus-metrics applied", || async {
        services.get_opt("kubevirt-prometheus-metrics").await.ok()?
    })
    .await;
    let spec = svc.spec.unwrap();
    assert_eq!(
        spec.selector
            .unwrap()
            .get("prometheus.kubevirt.io")
            .map(String::as_str),
        Some("true")
    );
    assert_eq!(spec.ports.unwrap()[0].name.as_deref(), Some("metrics"));
    // The metrics pods are behind it.
    let controller = Api::<Deployment>::namespaced(c.clone(), "kubevirt")
        .get("virt-controller")
        .await
        .unwrap();
    let labels = controller
        .spec
        .unwrap()
        .template
        .metadata
        .unwrap()
        .labels
        .unwrap();
    assert_eq!(labels["prometheus.kubevirt.io"], "true");

    // No prometheus-operator: nothing, and no error.
    let kv = kvs.get("kubevirt").await.unwrap();
    let synced = virt_operator::monitoring::sync(&c, Some(&kv), "", "virt-operator")
        .await
        .unwrap();
    assert_eq!((synced.applied, synced.deleted), (0, 0));
    assert!(!synced.apis.service_monitors && !synced.apis.prometheus_rules);
    assert!(
        condition(&kvs, "Degraded")
            .await
            .is_none_or(|(s, _, _)| s == "False")
    );

    // The prometheus-operator and its Prometheus' ServiceAccount arrive.
    let crds: Api<CustomResourceDefinition> = Api::all(c.clone());
    crds.create(&pp, &monitoring_crd("ServiceMonitor", "servicemonitors"))
        .await
        .unwrap();
    crds.create(&pp, &monitoring_crd("PrometheusRule", "prometheusrules"))
        .await
        .unwrap();
    Api::<Namespace>::all(c.clone())
        .create(
            &pp,
            &serde_json::from_value(json!({"metadata": {"name": "monitoring"}})).unwrap(),
        )
        .await
        .unwrap();
    Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(c.clone(), "monitoring")
        .create(
            &pp,
            &serde_json::from_value(json!({"metadata": {"name": "prometheus-k8s"}})).unwrap(),
        )
        .await
        .unwrap();
    let sms = monitoring_api(&c, "monitoring", "ServiceMonitor", "servicemonitors");
    let sm = eventually("the operator made the ServiceMonitor", || async {
        sms.get_opt("prometheus-kubevirt-rules").await.ok()?
    })
    .await;
    assert_eq!(sm.data["spec"]["endpoints"][0]["scheme"], "http");
    assert_eq!(
        sm.data["spec"]["namespaceSelector"]["matchNames"],
        json!(["kubevirt"])
    );
    let owner = &sm.metadata.owner_references.clone().unwrap()[0];
    assert_eq!(owner.kind, "CustomResourceDefinition");
    let rules = monitoring_api(&c, "kubevirt", "PrometheusRule", "prometheusrules");
    let rule = eventually("the operator made the PrometheusRule", || async {
        rules.get_opt("prometheus-kubevirt-rules").await.ok()?
    })
    .await;
    let text = rule.data["spec"].to_string();
    for name in [
        "kubevirt_number_of_vms",
        "VirtControllerDown",
        "runbook_url",
    ] {
        assert!(text.contains(name), "{name} missing");
    }
    let binding = Api::<k8s_openapi::api::rbac::v1::RoleBinding>::namespaced(c.clone(), "kubevirt")
        .get("kubevirt-monitoring")
        .await
        .unwrap();
    let subject = &binding.subjects.unwrap()[0];
    assert_eq!(
        (subject.name.as_str(), subject.namespace.as_deref()),
        ("prometheus-k8s", Some("monitoring"))
    );

    // Uninstall removes them with the rest.
    kvs.delete("kubevirt", &DeleteParams::default())
        .await
        .unwrap();
    eventually("KubeVirt gone", || async {
        kvs.get_opt("kubevirt").await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(
        sms.get_opt("prometheus-kubevirt-rules")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        rules
            .get_opt("prometheus-kubevirt-rules")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        services
            .get_opt("kubevirt-prometheus-metrics")
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        Api::<k8s_openapi::api::rbac::v1::Role>::namespaced(c.clone(), "kubevirt")
            .get_opt("kubevirt-monitoring")
            .await
            .unwrap()
            .is_none()
    );
    operator.stop().await;
}

/// A minimal CRD of CDI's DataVolume (any spec kept): what the operator checks for before it
/// registers `cdi.kubevirt.io` for virt-apiserver.
fn datavolume_crd() -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "metadata": {"name": "datavolumes.cdi.kubevirt.io"},
        "spec": {
            "group": "cdi.kubevirt.io",
            "scope": "Namespaced",
            "names": {"kind": "DataVolume", "plural": "datavolumes", "singular": "datavolume",
                      "listKind": "DataVolumeList"},
            "versions": [{"name": "v1beta1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object",
                    "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    }))
    .unwrap()
}

async fn controller_args(c: &Client) -> Option<Vec<String>> {
    Api::<Deployment>::namespaced(c.clone(), "kubevirt")
        .get_opt("virt-controller")
        .await
        .ok()??
        .spec?
        .template
        .spec?
        .containers
        .first()?
        .args
        .clone()
}

/// A change of the KubeVirt resource: the operator reconciles at once.
async fn poke(kvs: &Api<KubeVirt>, n: usize) {
    kvs.patch(
        "kubevirt",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"metadata": {"annotations": {"test.kubevirt-rs.io/poke": n.to_string()}}}),
        ),
    )
    .await
    .unwrap();
}

/// Whether `a` is kube-apiserver's local APIService (a CRD's): no service, automanaged.
fn is_local(a: &APIService) -> bool {
    a.spec.as_ref().is_some_and(|s| s.service.is_none())
        && a.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("kube-aggregator.kubernetes.io/automanaged"))
            .is_some()
}

/// Coexistence with a real CDI (docs/design-datavolumes.md §3.1): without CDI's CRD the
/// APIService `v1beta1.cdi.kubevirt.io` is virt-apiserver's and virt-controller runs its
/// DataVolume controller (no flag); once the CRD exists the operator deletes its APIService,
/// kube-apiserver's local one takes the name and is never written over, virt-controller gets
/// `--datavolumes=false` and the KubeVirt resource says why; with the CRD gone again it is
/// all as before.
#[tokio::test]
async fn with_cdis_crd_datavolumes_are_left_to_cdi() {
    let api = start().await;
    let c = api.client.clone();
    let pp = PostParams::default();
    let operator = Operator::start(&c).await;
    let kvs = operator.kvs.clone();
    let cr: KubeVirt = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1alpha3", "kind": "KubeVirt",
        "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
        "spec": {}
    }))
    .unwrap();
    kvs.create(&pp, &cr).await.unwrap();
    let apis: Api<APIService> = Api::all(c.clone());
    const NAME: &str = "v1beta1.cdi.kubevirt.io";

    // No CDI: ours, once virt-apiserver serves.
    let ours = eventually("virt-apiserver's cdi.kubevirt.io APIService", || async {
        controller_args(&c).await?;
        roll_out(&c).await;
        apis.get_opt(NAME).await.ok()?
    })
    .await;
    let spec = ours.spec.clone().unwrap();
    assert_eq!(
        spec.service.and_then(|s| s.name).as_deref(),
        Some("kubevirt-apiserver")
    );
    assert!(!is_local(&ours));
    let args = controller_args(&c).await.unwrap();
    assert!(
        !args.iter().any(|a| a.starts_with("--datavolumes")),
        "{args:?}"
    );
    assert!(condition(&kvs, "CDIInstalled").await.is_none());

    // CDI arrives.
    let crds: Api<CustomResourceDefinition> = Api::all(c.clone());
    crds.create(&pp, &datavolume_crd()).await.unwrap();
    let mut n = 0;
    let (status, reason, message) = eventually("CDIInstalled reported", || {
        n += 1;
        let (kvs, n) = (kvs.clone(), n);
        async move {
            poke(&kvs, n).await;
            condition(&kvs, "CDIInstalled").await
        }
    })
    .await;
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "DataVolumesServedByCDI")
    );
    assert!(
        message.starts_with(
            "CDI is installed (CRD datavolumes.cdi.kubevirt.io): DataVolumes are CDI's; \
             kubevirt-rs serves none"
        ),
        "{message}"
    );
    let args = controller_args(&c).await.unwrap();
    assert!(
        args.contains(&"--datavolumes=false".to_string()),
        "{args:?}"
    );
    // kube-apiserver's own APIService for the CRD replaces ours, and stays.
    let local = eventually("kube-apiserver's local APIService", || async {
        apis.get_opt(NAME).await.ok()?.filter(is_local)
    })
    .await;
    poke(&kvs, 1000).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = apis.get(NAME).await.unwrap();
    assert!(is_local(&after), "{after:?}");
    assert_eq!(after.metadata.uid, local.metadata.uid);
    // Discovery of the group is kube-apiserver's (the CRD's), not an unavailable service.
    let dv = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("cdi.kubevirt.io", "v1beta1", "DataVolume"),
        "datavolumes",
    );
    eventually("DataVolumes served from the CRD", || async {
        Api::<DynamicObject>::namespaced_with(c.clone(), "default", &dv)
            .list(&Default::default())
            .await
            .ok()
    })
    .await;

    // CDI uninstalled: ours again, the flag and the condition gone.
    crds.delete("datavolumes.cdi.kubevirt.io", &DeleteParams::default())
        .await
        .unwrap();
    let mut n = 2000;
    let back = eventually("virt-apiserver's APIService again", || {
        n += 1;
        let (kvs, apis, c, n) = (kvs.clone(), apis.clone(), c.clone(), n);
        async move {
            poke(&kvs, n).await;
            roll_out(&c).await;
            let a = apis.get_opt(NAME).await.ok()??;
            let args = controller_args(&c).await?;
            let cdi = condition(&kvs, "CDIInstalled").await;
            (!is_local(&a) && !args.iter().any(|a| a.starts_with("--datavolumes")) && cdi.is_none())
                .then_some(a)
        }
    })
    .await;
    assert_eq!(
        back.metadata.labels.unwrap()["app.kubernetes.io/part-of"],
        "kubevirt-rs"
    );
    operator.stop().await;
}
