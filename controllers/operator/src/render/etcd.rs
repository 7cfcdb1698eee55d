//! virt-apiserver's etcd as a StatefulSet of its own (virt-operator): client traffic over
//! mTLS with a CA of its own, data on a PVC when the cluster has a default StorageClass (an
//! emptyDir otherwise), so virt-apiserver pods can be replaced and rolled without losing
//! objects.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentStrategy, RollingUpdateDeployment, StatefulSet, StatefulSetSpec,
};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EmptyDirVolumeSource, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PodSecurityContext, PodSpec, PodTemplateSpec, SeccompProfile,
    Secret, Service, ServicePort, ServiceSpec, Volume, VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{
    ETCD_METRICS_PORT, NAME, NAMESPACE, Params, RUN_AS, Result, http_probe, part_of_labels,
    push_doc, requests, restricted, strings,
};

/// StatefulSet, Service and pod label of etcd.
pub const ETCD: &str = "kubevirt-etcd";
/// etcd's serving certificate, key and the CA its clients must chain to.
pub const SERVER_SECRET: &str = "kubevirt-etcd-server";
/// virt-apiserver's client certificate towards etcd.
pub const CLIENT_SECRET: &str = "kubevirt-etcd-client";
pub const CLIENT_PORT: i32 = 2379;
/// On both Secrets: the host etcd's serving certificate names.
pub const HOST_ANNOTATION: &str = "kubevirt-rs.io/etcd-host";
const CERT_DIR: &str = "/etc/etcd/tls";
const APISERVER_ETCD_DIR: &str = "/etc/kubevirt-apiserver/etcd";
/// virt-apiserver replicas when etcd is shared: one can be replaced while the other serves.
pub const APISERVER_REPLICAS: i32 = 2;

/// What the etcd StatefulSet needs from the cluster.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EtcdParams {
    /// Host (the Service's cluster IP: our clusters may have no DNS) clients dial.
    pub host: String,
    /// Size of the PVC; `None`: an emptyDir.
    pub volume_size: Option<String>,
    /// Of the etcd pod template (the operator's: a hash of the trust bundle, which etcd reads
    /// only at start; its certificate and key it re-reads on every handshake).
    pub annotations: BTreeMap<String, String>,
}

impl EtcdParams {
    /// `https://HOST:2379`.
    pub fn endpoint(&self) -> String {
        if self.host.contains(':') {
            format!("https://[{}]:{CLIENT_PORT}", self.host)
        } else {
            format!("https://{}:{CLIENT_PORT}", self.host)
        }
    }
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(NAMESPACE.into()),
        labels: Some(part_of_labels(ETCD)),
        ..ObjectMeta::default()
    }
}

fn selector() -> BTreeMap<String, String> {
    BTreeMap::from([("app.kubernetes.io/name".to_string(), ETCD.to_string())])
}

/// The Service clients reach etcd by (its cluster IP goes into the serving certificate).
pub fn service() -> Service {
    Service {
        metadata: meta(ETCD),
        spec: Some(ServiceSpec {
            selector: Some(selector()),
            ports: Some(vec![ServicePort {
                name: Some("client".into()),
                port: CLIENT_PORT,
                target_port: Some(IntOrString::String("client".into())),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// SANs of etcd's serving certificate.
pub fn server_names(host: &str) -> Vec<String> {
    vec![
        host.to_string(),
        format!("{ETCD}.{NAMESPACE}.svc"),
        format!("{ETCD}.{NAMESPACE}.svc.cluster.local"),
        format!("{ETCD}-0.{ETCD}.{NAMESPACE}.svc"),
        "127.0.0.1".into(),
    ]
}

/// Service and StatefulSet.
pub fn objects(out: &mut String, p: &Params, e: &EtcdParams) -> Result<()> {
    push_doc(out, &service())?;
    push_doc(out, &statefulset(p, e))
}

fn statefulset(p: &Params, e: &EtcdParams) -> StatefulSet {
    let container = Container {
        name: "etcd".into(),
        image: Some(p.etcd_image.clone()),
        image_pull_policy: Some(p.image_pull_policy.clone()),
        args: Some(
            [
                format!("--name={ETCD}"),
                "--data-dir=/var/lib/etcd/data".into(),
                format!("--listen-client-urls=https://0.0.0.0:{CLIENT_PORT}"),
                format!("--advertise-client-urls={}", e.endpoint()),
                // One member: the peer port stays on loopback.
                "--listen-peer-urls=http://127.0.0.1:2380".into(),
                "--initial-advertise-peer-urls=http://127.0.0.1:2380".into(),
                format!("--initial-cluster={ETCD}=http://127.0.0.1:2380"),
                format!("--cert-file={CERT_DIR}/tls.crt"),
                format!("--key-file={CERT_DIR}/tls.key"),
                format!("--trusted-ca-file={CERT_DIR}/ca.crt"),
                "--client-cert-auth=true".into(),
                // /health for kubelet's probes (and /metrics), plain HTTP on the pod IP.
                format!("--listen-metrics-urls=http://0.0.0.0:{ETCD_METRICS_PORT}"),
                "--auto-compaction-mode=periodic".into(),
                "--auto-compaction-retention=1h".into(),
            ]
            .into(),
        ),
        ports: Some(vec![
            ContainerPort {
                name: Some("client".into()),
                container_port: CLIENT_PORT,
                ..ContainerPort::default()
            },
            ContainerPort {
                name: Some("etcd-metrics".into()),
                container_port: ETCD_METRICS_PORT,
                ..ContainerPort::default()
            },
        ]),
        startup_probe: Some(http_probe("/health", "etcd-metrics", "HTTP", 1, 60)),
        liveness_probe: Some(http_probe("/health", "etcd-metrics", "HTTP", 10, 3)),
        readiness_probe: Some(http_probe("/health", "etcd-metrics", "HTTP", 2, 3)),
        volume_mounts: Some(vec![
            VolumeMount {
                name: "data".into(),
                mount_path: "/var/lib/etcd".into(),
                ..VolumeMount::default()
            },
            VolumeMount {
                name: "tls".into(),
                mount_path: CERT_DIR.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            },
        ]),
        resources: Some(requests("50m", "64Mi")),
        security_context: Some(restricted()),
        ..Container::default()
    };
    let mut volumes = vec![Volume {
        name: "tls".into(),
        secret: Some(k8s_openapi::api::core::v1::SecretVolumeSource {
            secret_name: Some(SERVER_SECRET.into()),
            default_mode: Some(0o440),
            ..Default::default()
        }),
        ..Volume::default()
    }];
    let claims = match &e.volume_size {
        Some(size) => Some(vec![PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("data".into()),
                labels: Some(part_of_labels(ETCD)),
                ..ObjectMeta::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(strings(&["ReadWriteOnce"])),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([(
                        "storage".to_string(),
                        Quantity(size.clone()),
                    )])),
                    ..VolumeResourceRequirements::default()
                }),
                ..PersistentVolumeClaimSpec::default()
            }),
            ..PersistentVolumeClaim::default()
        }]),
        None => {
            volumes.push(Volume {
                name: "data".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Volume::default()
            });
            None
        }
    };
    let mut labels = part_of_labels(ETCD);
    labels.insert("kubevirt.io".into(), ETCD.into());
    let mut spec = PodSpec {
        enable_service_links: Some(false),
        automount_service_account_token: Some(false),
        termination_grace_period_seconds: Some(30),
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(RUN_AS),
            run_as_group: Some(RUN_AS),
            fs_group: Some(RUN_AS),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..SeccompProfile::default()
            }),
            ..PodSecurityContext::default()
        }),
        containers: vec![container],
        volumes: Some(volumes),
        ..PodSpec::default()
    };
    p.infra.apply(&mut spec);
    StatefulSet {
        metadata: meta(ETCD),
        spec: Some(StatefulSetSpec {
            replicas: Some(1),
            service_name: Some(ETCD.into()),
            selector: LabelSelector {
                match_labels: Some(selector()),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    annotations: (!e.annotations.is_empty()).then(|| e.annotations.clone()),
                    ..ObjectMeta::default()
                }),
                spec: Some(spec),
            },
            volume_claim_templates: claims,
            ..StatefulSetSpec::default()
        }),
        ..StatefulSet::default()
    }
}

/// Points virt-apiserver's Deployment at the StatefulSet: no sidecar, mTLS flags, two replicas
/// rolled one at a time (a new pod serves before an old one goes).
pub fn externalise(d: &mut Deployment, e: &EtcdParams) {
    let Some(spec) = d.spec.as_mut() else {
        return;
    };
    spec.replicas = Some(APISERVER_REPLICAS);
    spec.strategy = Some(DeploymentStrategy {
        type_: Some("RollingUpdate".into()),
        rolling_update: Some(RollingUpdateDeployment {
            max_surge: Some(IntOrString::Int(1)),
            max_unavailable: Some(IntOrString::Int(0)),
        }),
    });
    let Some(pod) = spec.template.spec.as_mut() else {
        return;
    };
    pod.init_containers = None;
    if let Some(v) = pod.volumes.as_mut() {
        v.retain(|v| v.name != "etcd-data");
        v.push(Volume {
            name: "etcd-client".into(),
            secret: Some(k8s_openapi::api::core::v1::SecretVolumeSource {
                secret_name: Some(CLIENT_SECRET.into()),
                default_mode: Some(0o440),
                ..Default::default()
            }),
            ..Volume::default()
        });
    }
    for c in pod
        .containers
        .iter_mut()
        .filter(|c| c.name == "virt-apiserver")
    {
        if let Some(args) = c.args.as_mut() {
            args.retain(|a| !a.starts_with("--etcd-servers="));
            args.extend([
                format!("--etcd-servers={}", e.endpoint()),
                format!("--etcd-cafile={APISERVER_ETCD_DIR}/ca.crt"),
                format!("--etcd-certfile={APISERVER_ETCD_DIR}/tls.crt"),
                format!("--etcd-keyfile={APISERVER_ETCD_DIR}/tls.key"),
            ]);
        }
        c.volume_mounts
            .get_or_insert_with(Vec::new)
            .push(VolumeMount {
                name: "etcd-client".into(),
                mount_path: APISERVER_ETCD_DIR.into(),
                read_only: Some(true),
                ..VolumeMount::default()
            });
    }
}

/// At most one virt-apiserver pod away for a voluntary disruption (node drain).
pub fn apiserver_pdb() -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: ObjectMeta {
            name: Some(NAME.into()),
            namespace: Some(NAMESPACE.into()),
            labels: Some(part_of_labels(NAME)),
            ..ObjectMeta::default()
        },
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    "app.kubernetes.io/name".to_string(),
                    NAME.to_string(),
                )])),
                ..LabelSelector::default()
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    }
}

/// etcd's mTLS material (PEM): a CA, etcd's serving certificate, virt-apiserver's client
/// certificate.
#[derive(Clone, PartialEq)]
pub struct EtcdTls {
    /// The host the serving certificate was issued for (annotation [`HOST_ANNOTATION`]).
    pub host: String,
    pub ca: String,
    pub server_cert: String,
    pub server_key: String,
    pub client_cert: String,
    pub client_key: String,
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTls").finish_non_exhaustive()
    }
}

impl EtcdTls {
    /// The two Secrets.
    pub fn secrets(&self) -> Vec<Secret> {
        [
            (SERVER_SECRET, &self.server_cert, &self.server_key),
            (CLIENT_SECRET, &self.client_cert, &self.client_key),
        ]
        .into_iter()
        .map(|(name, cert, key)| Secret {
            metadata: ObjectMeta {
                annotations: Some(BTreeMap::from([(
                    HOST_ANNOTATION.to_string(),
                    self.host.clone(),
                )])),
                ..meta(name)
            },
            type_: Some("kubernetes.io/tls".into()),
            data: Some(BTreeMap::from([
                ("ca.crt".into(), ByteString(self.ca.clone().into_bytes())),
                ("tls.crt".into(), ByteString(cert.clone().into_bytes())),
                ("tls.key".into(), ByteString(key.clone().into_bytes())),
            ])),
            ..Secret::default()
        })
        .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn externalised_apiserver_has_no_sidecar_and_dials_etcd_over_tls() {
        let e = EtcdParams {
            host: "10.96.0.20".into(),
            ..EtcdParams::default()
        };
        let p = Params {
            etcd: super::super::EtcdMode::StatefulSet(e.clone()),
            ..Params::default()
        };
        let text = super::super::static_manifest(&p).unwrap();
        assert!(text.contains("--etcd-servers=https://10.96.0.20:2379"));
        assert!(text.contains("kind: StatefulSet"));
        assert!(!text.contains("--etcd-servers=http://127.0.0.1:2379"));
        assert!(text.contains("--client-cert-auth=true"));
        assert!(text.contains("emptyDir"));
        let with_pvc = EtcdParams {
            volume_size: Some("1Gi".into()),
            ..e
        };
        let mut out = String::new();
        objects(&mut out, &p, &with_pvc).unwrap();
        assert!(out.contains("volumeClaimTemplates") && !out.contains("emptyDir"));
    }

    #[test]
    fn etcd_secrets_carry_the_host_they_were_issued_for() {
        let st = crate::rotation::first_install(crate::rotation::Domain::Etcd, "10.96.0.20");
        let t = crate::rotation::etcd_tls(&st, "10.96.0.20").unwrap();
        let now = time::OffsetDateTime::now_utc();
        for pem in [&t.server_cert, &t.client_cert] {
            let (nb, na) = virt_certs::validity_of(pem).unwrap();
            assert!(nb <= now && now < na);
        }
        for s in t.secrets() {
            let host = s
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(HOST_ANNOTATION));
            assert_eq!(host.map(String::as_str), Some("10.96.0.20"));
        }
    }
}
