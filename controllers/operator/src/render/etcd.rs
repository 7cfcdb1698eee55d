//! virt-apiserver's etcd as a StatefulSet of its own (virt-operator): client traffic over
//! mTLS with a CA of its own, data on a PVC when the cluster has a default StorageClass, else
//! in a host directory of one node the pod is pinned to ([`EtcdStorage`]), so virt-apiserver
//! pods, etcd's own pod and whole upgrades come and go without losing objects.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentStrategy, RollingUpdateDeployment, StatefulSet, StatefulSetSpec,
};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EmptyDirVolumeSource, HostPathVolumeSource, PersistentVolumeClaim,
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
    /// Where etcd keeps its data.
    pub storage: EtcdStorage,
    /// Of the etcd pod template (the operator's: a hash of the trust bundle, which etcd reads
    /// only at start; its certificate and key it re-reads on every handshake).
    pub annotations: BTreeMap<String, String>,
}

/// Where etcd's data lives.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum EtcdStorage {
    /// A PVC of this size from the cluster's default StorageClass.
    Claim { size: String },
    /// A directory of one node (no StorageClass: a bare kubeadm cluster, our local one): the
    /// pod is pinned to that node by name. The directory is per installation (see
    /// [`host_dir`]), so a reinstall starts empty as a reinstall of KubeVirt does.
    HostPath { node: String, path: String },
    /// An emptyDir: only while the cluster has no node to pin to (nothing runs then anyway).
    #[default]
    Ephemeral,
}

/// Node label the host-directory mode pins etcd's pod with.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// The host directory of one installation under `base`: named after the uid of the KubeVirt
/// CRD, which lives exactly as long as the installation (deleting
/// manifests/virt-operator.yaml deletes it, a reinstall creates a new one).
pub fn host_dir(base: &str, installation_uid: &str) -> String {
    format!("{}/etcd-{installation_uid}", base.trim_end_matches('/'))
}

/// The node to keep etcd's data on: the one it is on already if that node still exists,
/// else a schedulable Ready node, control-plane nodes first (they are the ones an
/// administrator keeps), then by name so that every reconcile picks the same.
pub fn pick_node(
    current: Option<&str>,
    nodes: &[k8s_openapi::api::core::v1::Node],
) -> Option<String> {
    let name = |n: &k8s_openapi::api::core::v1::Node| n.metadata.name.clone().unwrap_or_default();
    if let Some(cur) = current
        && nodes.iter().any(|n| name(n) == cur)
    {
        return Some(cur.to_string());
    }
    let ready = |n: &k8s_openapi::api::core::v1::Node| {
        let schedulable = !n
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        let ready = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        schedulable && ready
    };
    let control_plane = |n: &k8s_openapi::api::core::v1::Node| {
        n.metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key("node-role.kubernetes.io/control-plane"))
    };
    let mut candidates: Vec<_> = nodes.iter().filter(|n| ready(n)).collect();
    candidates.sort_by_key(|n| (!control_plane(n), name(n)));
    candidates.first().map(|n| name(n))
}

/// The node an existing etcd StatefulSet is pinned to.
pub fn pinned_node(sts: &StatefulSet) -> Option<String> {
    sts.spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .node_selector
        .as_ref()?
        .get(HOSTNAME_LABEL)
        .cloned()
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
    let claims = match &e.storage {
        EtcdStorage::Claim { size } => Some(vec![PersistentVolumeClaim {
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
        EtcdStorage::HostPath { path, .. } => {
            volumes.push(Volume {
                name: "data".into(),
                host_path: Some(HostPathVolumeSource {
                    path: path.clone(),
                    type_: Some("DirectoryOrCreate".into()),
                }),
                ..Volume::default()
            });
            None
        }
        EtcdStorage::Ephemeral => {
            volumes.push(Volume {
                name: "data".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Volume::default()
            });
            None
        }
    };
    let mut labels = part_of_labels(ETCD);
    labels.insert(kubevirt_api::COMPONENT_LABEL.into(), ETCD.into());
    let mut spec = PodSpec {
        enable_service_links: Some(false),
        automount_service_account_token: Some(false),
        termination_grace_period_seconds: Some(30),
        security_context: Some(pod_security(&e.storage)),
        containers: vec![container],
        volumes: Some(volumes),
        ..PodSpec::default()
    };
    p.infra.apply(&mut spec);
    if let EtcdStorage::HostPath { node, .. } = &e.storage {
        // Added after the infra placement: whatever else it selects, the data is on this node.
        spec.node_selector
            .get_or_insert_with(BTreeMap::new)
            .insert(HOSTNAME_LABEL.into(), node.clone());
    }
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

/// etcd's pod identity. On a PVC or an emptyDir: an unprivileged user, the volume made its
/// own through fsGroup. A host directory is created by kubelet as root with mode 0755 and
/// fsGroup does not apply to it, so there etcd runs as uid 0 — with every capability dropped
/// (no CAP_DAC_OVERRIDE: it can write only what root owns, i.e. its own directory; no
/// CAP_CHOWN, no escalation, read-only root filesystem), which is less than a chown init
/// container running as root with CAP_CHOWN would need.
fn pod_security(storage: &EtcdStorage) -> PodSecurityContext {
    let seccomp = Some(SeccompProfile {
        type_: "RuntimeDefault".into(),
        ..SeccompProfile::default()
    });
    match storage {
        EtcdStorage::HostPath { .. } => PodSecurityContext {
            run_as_non_root: Some(false),
            run_as_user: Some(0),
            run_as_group: Some(0),
            seccomp_profile: seccomp,
            ..PodSecurityContext::default()
        },
        EtcdStorage::Claim { .. } | EtcdStorage::Ephemeral => PodSecurityContext {
            run_as_non_root: Some(true),
            run_as_user: Some(RUN_AS),
            run_as_group: Some(RUN_AS),
            fs_group: Some(RUN_AS),
            seccomp_profile: seccomp,
            ..PodSecurityContext::default()
        },
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
            storage: EtcdStorage::Claim { size: "1Gi".into() },
            ..e.clone()
        };
        let mut out = String::new();
        objects(&mut out, &p, &with_pvc).unwrap();
        assert!(out.contains("volumeClaimTemplates") && !out.contains("emptyDir"));
        assert!(out.contains("runAsNonRoot: true"));
    }

    #[test]
    fn host_directory_mode_pins_the_pod_to_its_node() {
        let e = EtcdParams {
            host: "10.96.0.20".into(),
            storage: EtcdStorage::HostPath {
                node: "node-a".into(),
                path: host_dir("/var/lib/kubevirt-rs/", "1234"),
            },
            ..EtcdParams::default()
        };
        let p = Params {
            infra: super::super::Placement {
                node_selector: Some(BTreeMap::from([("infra".into(), "yes".into())])),
                ..Default::default()
            },
            ..Params::default()
        };
        let sts = statefulset(&p, &e);
        assert_eq!(pinned_node(&sts).as_deref(), Some("node-a"));
        let pod = sts.spec.unwrap().template.spec.unwrap();
        assert_eq!(pod.node_selector.unwrap()["infra"], "yes");
        let data = pod
            .volumes
            .unwrap()
            .into_iter()
            .find(|v| v.name == "data")
            .unwrap();
        assert_eq!(
            data.host_path.unwrap().path,
            "/var/lib/kubevirt-rs/etcd-1234"
        );
        let sc = pod.security_context.unwrap();
        assert_eq!((sc.run_as_user, sc.fs_group), (Some(0), None));
        let c = &pod.containers[0].security_context.clone().unwrap();
        assert_eq!(c.capabilities.clone().unwrap().drop.unwrap(), vec!["ALL"]);
        assert_eq!(c.allow_privilege_escalation, Some(false));
    }

    fn node(
        name: &str,
        ready: bool,
        control_plane: bool,
        unschedulable: bool,
    ) -> k8s_openapi::api::core::v1::Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": if control_plane {
                serde_json::json!({"node-role.kubernetes.io/control-plane": ""})
            } else { serde_json::json!({}) }},
            "spec": {"unschedulable": unschedulable},
            "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}
        }))
        .unwrap()
    }

    #[test]
    fn the_data_node_stays_while_it_exists() {
        let nodes = [
            node("a", true, false, false),
            node("b", true, true, false),
            node("c", false, true, false),
            node("d", true, true, true),
        ];
        assert_eq!(pick_node(None, &nodes).as_deref(), Some("b"));
        // Where the data is wins even when that node is not Ready: moving would lose it.
        assert_eq!(pick_node(Some("c"), &nodes).as_deref(), Some("c"));
        assert_eq!(pick_node(Some("gone"), &nodes).as_deref(), Some("b"));
        assert_eq!(pick_node(None, &nodes[..1]).as_deref(), Some("a"));
        assert_eq!(pick_node(None, &nodes[2..3]), None);
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
