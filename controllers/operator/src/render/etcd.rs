//! virt-apiserver's etcd as a StatefulSet of its own (virt-operator): client traffic over
//! mTLS with a CA of its own, data on a PVC when the cluster has a default StorageClass, else
//! in a host directory of one node the pod is pinned to ([`EtcdStorage`]), so virt-apiserver
//! pods, etcd's own pod and whole upgrades come and go without losing objects.
//!
//! One member ([`Topology::Single`]) or a cluster of up to [`MAX_MEMBERS`]
//! ([`Topology::Cluster`], `spec.kubevirtRs.etcd.members`). Cluster members need stable peer
//! addresses, and our clusters may have no DNS (the local one has none), so pod DNS names of
//! a headless Service are not an option: each member `kubevirt-etcd-N` gets a Service of its
//! own, and every pod's /etc/hosts (hostAliases) maps the names `kubevirt-etcd-N` to those
//! Services' cluster IPs. Peer URLs name `kubevirt-etcd-N`, so the membership etcd stores
//! stays right even if a Service is recreated with another IP (the pods roll with the new
//! aliases). Peers authenticate each other by a certificate of the etcd CA with the common
//! name [`PEER_COMMON_NAME`]; etcd's check of a peer's source address against its certificate
//! is off, because behind a Service that address is a pod IP, which no certificate can name.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentStrategy, RollingUpdateDeployment, StatefulSet,
    StatefulSetPersistentVolumeClaimRetentionPolicy, StatefulSetSpec,
};
use k8s_openapi::api::core::v1::{
    Affinity, ConfigMap, ConfigMapKeySelector, Container, ContainerPort, EmptyDirVolumeSource,
    EnvVar, EnvVarSource, HostAlias, HostPathVolumeSource, ObjectFieldSelector,
    PersistentVolumeClaim, PersistentVolumeClaimSpec, PodAffinityTerm, PodAntiAffinity,
    PodSecurityContext, PodSpec, PodTemplateSpec, SeccompProfile, Secret, Service, ServicePort,
    ServiceSpec, Volume, VolumeMount, VolumeResourceRequirements, WeightedPodAffinityTerm,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{
    ETCD_METRICS_PORT, NAME, NAMESPACE, Params, RUN_AS, Result, http_probe, liveness_probe,
    part_of_labels, push_doc, requests, restricted, strings,
};

/// StatefulSet, Service and pod label of etcd.
pub const ETCD: &str = "kubevirt-etcd";
/// etcd's serving certificate, key and the CA its clients must chain to.
pub const SERVER_SECRET: &str = "kubevirt-etcd-server";
/// virt-apiserver's client certificate towards etcd.
pub const CLIENT_SECRET: &str = "kubevirt-etcd-client";
/// The members' certificate towards each other (serving and client), cluster only.
pub const PEER_SECRET: &str = "kubevirt-etcd-peer";
/// Common name of [`PEER_SECRET`]'s certificate, the only one a member accepts as a peer:
/// virt-apiserver's client certificate comes from the same CA and must not pass for one.
pub const PEER_COMMON_NAME: &str = "kubevirt-etcd-peer";
/// ConfigMap with `--initial-cluster` and `--initial-cluster-state` (cluster only): read by a
/// member when it starts, so a change of membership changes no pod template and restarts no
/// running member.
pub const CLUSTER_CONFIGMAP: &str = "kubevirt-etcd-cluster";
/// Keys of [`CLUSTER_CONFIGMAP`].
pub const INITIAL_CLUSTER_KEY: &str = "initial-cluster";
pub const INITIAL_CLUSTER_STATE_KEY: &str = "initial-cluster-state";
pub const CLIENT_PORT: i32 = 2379;
/// The single member's peer URL, on loopback: what etcd's membership records for every
/// installation from before clusters.
pub const LEGACY_PEER_URL: &str = "http://127.0.0.1:2380";
pub const PEER_PORT: i32 = 2380;
/// Largest etcd cluster rendered (`spec.kubevirtRs.etcd.members` allows 1 or 3).
pub const MAX_MEMBERS: usize = 3;
/// On both Secrets: the host etcd's serving certificate names.
pub const HOST_ANNOTATION: &str = "kubevirt-rs.io/etcd-host";
/// Label kube's StatefulSet controller puts on each of its pods: a member's Service selects
/// its one pod by it.
const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
const CERT_DIR: &str = "/etc/etcd/tls";
const PEER_CERT_DIR: &str = "/etc/etcd/peer";
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
    /// One member or a cluster.
    pub topology: Topology,
}

/// How many members, and how they reach each other.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Topology {
    /// One member whose peer port stays on loopback: every installation from before member
    /// counts existed and every new one of 1 member. Rendered exactly as before, so that an
    /// upgrade does not restart the store.
    #[default]
    Single,
    /// Members `kubevirt-etcd-0..` with peer TLS between them. Only ever on PVCs (a host
    /// directory would put every member's data into one directory of one node).
    Cluster(ClusterTopology),
}

/// A cluster's addresses and size.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClusterTopology {
    /// Cluster IP of each member's Service, by ordinal ([`MAX_MEMBERS`] of them, all created
    /// up front: their names are in every pod's /etc/hosts and the certificates).
    pub member_ips: Vec<String>,
    /// Members in etcd's membership now, which is the StatefulSet's replicas: a member is
    /// added to etcd before its pod starts and removed before its pod goes.
    pub replicas: i32,
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

/// Whether an existing etcd StatefulSet runs as a cluster (peer TLS, members by name), as
/// opposed to the single member with loopback peers: read from what only the cluster's pod
/// template has, the ConfigMap reference for `--initial-cluster`.
pub fn is_cluster(sts: &StatefulSet) -> bool {
    sts.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .is_some_and(|p| {
            p.containers
                .iter()
                .flat_map(|c| c.env.iter().flatten())
                .any(|e| e.name == "ETCD_INITIAL_CLUSTER")
        })
}

/// Member `i`'s name: its pod's name, its Service's name and the host name in its peer URL.
pub fn member_name(i: usize) -> String {
    format!("{ETCD}-{i}")
}

/// The peer URL member `i` advertises (and etcd's membership records).
pub fn peer_url(i: usize) -> String {
    format!("https://{}:{PEER_PORT}", member_name(i))
}

/// `https://HOST:PORT`, brackets around an IPv6 address.
fn https_url(host: &str, port: i32) -> String {
    if host.contains(':') {
        format!("https://[{host}]:{port}")
    } else {
        format!("https://{host}:{port}")
    }
}

/// A member's client URL at its Service's cluster IP (what virt-apiserver and virt-operator
/// dial: they have no host aliases).
pub fn member_client_url(ip: &str) -> String {
    https_url(ip, CLIENT_PORT)
}

/// `--initial-cluster` and `--initial-cluster-state` for a cluster of `replicas` members. A
/// member reads them only when it starts with an empty data directory, so they describe the
/// membership a member joining now finds: one member bootstraps a new cluster, every later
/// member joins an existing one (added by virt-operator through etcd's membership API before
/// its pod starts). Once there are two members no member's configuration says `new` any more:
/// a member that lost its volume then tries to join and is refused, rather than bootstrapping
/// a second, empty cluster under the same identity.
pub fn initial_cluster(replicas: i32) -> (String, &'static str) {
    let urls: Vec<String> = (0..MAX_MEMBERS).map(peer_url).collect();
    initial_cluster_of(&urls, replicas)
}

/// [`initial_cluster`] for members whose peer URLs, by ordinal, are `peer_urls` (tests run
/// members on loopback ports).
pub fn initial_cluster_of(peer_urls: &[String], replicas: i32) -> (String, &'static str) {
    let n = usize::try_from(replicas)
        .unwrap_or(1)
        .clamp(1, peer_urls.len().max(1));
    let members: Vec<String> = peer_urls
        .iter()
        .take(n)
        .enumerate()
        .map(|(i, url)| format!("{}={url}", member_name(i)))
        .collect();
    (members.join(","), if n == 1 { "new" } else { "existing" })
}

impl EtcdParams {
    /// Where virt-apiserver dials etcd: the Service's cluster IP for one member, every
    /// member's Service for a cluster (its etcd client balances across those that answer).
    pub fn endpoints(&self) -> Vec<String> {
        match &self.topology {
            Topology::Single => vec![https_url(&self.host, CLIENT_PORT)],
            Topology::Cluster(c) => c
                .member_ips
                .iter()
                .map(|ip| member_client_url(ip))
                .collect(),
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

/// The label selector of etcd's pods, as a list or watch takes it.
pub fn pod_selector() -> String {
    selector()
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn port(name: &str, port: i32) -> ServicePort {
    ServicePort {
        name: Some(name.into()),
        port,
        target_port: Some(IntOrString::String(name.into())),
        ..ServicePort::default()
    }
}

/// The Service clients reach etcd by (its cluster IP goes into the serving certificate).
pub fn service() -> Service {
    Service {
        metadata: meta(ETCD),
        spec: Some(ServiceSpec {
            selector: Some(selector()),
            ports: Some(vec![port("client", CLIENT_PORT)]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// Member `i`'s own Service: a stable address for a pod whose IP changes. It publishes the
/// pod before it is Ready: members must reach each other to elect a leader, and etcd is Ready
/// only once there is one.
pub fn member_service(i: usize) -> Service {
    let name = member_name(i);
    Service {
        metadata: meta(&name),
        spec: Some(ServiceSpec {
            selector: Some(BTreeMap::from([(POD_NAME_LABEL.to_string(), name)])),
            ports: Some(vec![port("client", CLIENT_PORT), port("peer", PEER_PORT)]),
            publish_not_ready_addresses: Some(true),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// SANs of etcd's serving certificate: the client Service and, for a cluster, every member's
/// Service IP and name.
pub fn server_names(hosts: &EtcdHosts) -> Vec<String> {
    let mut out = vec![
        hosts.service.clone(),
        format!("{ETCD}.{NAMESPACE}.svc"),
        format!("{ETCD}.{NAMESPACE}.svc.cluster.local"),
        format!("{ETCD}-0.{ETCD}.{NAMESPACE}.svc"),
        "127.0.0.1".into(),
    ];
    for (i, ip) in hosts.members.iter().enumerate() {
        out.push(ip.clone());
        out.push(member_name(i));
    }
    out
}

/// SANs of the members' peer certificate: the names in their peer URLs (a member verifies
/// the one it dials by it) and the Services' IPs.
pub fn peer_names(hosts: &EtcdHosts) -> Vec<String> {
    hosts
        .members
        .iter()
        .enumerate()
        .flat_map(|(i, ip)| [member_name(i), ip.clone()])
        .collect()
}

/// The addresses etcd's certificates name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EtcdHosts {
    /// The client Service's cluster IP.
    pub service: String,
    /// The members' Services' cluster IPs by ordinal; empty for a single member.
    pub members: Vec<String>,
}

impl EtcdHosts {
    /// What the Secrets' [`HOST_ANNOTATION`] records: certificates issued for other
    /// addresses are issued anew. One member: the Service IP alone, as before clusters.
    pub fn key(&self) -> String {
        std::iter::once(self.service.as_str())
            .chain(self.members.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// etcd's objects: the client Service, for a cluster the members' Services, the ConfigMap
/// with the initial cluster and the PodDisruptionBudget, and the StatefulSet.
pub fn objects(out: &mut String, p: &Params, e: &EtcdParams) -> Result<()> {
    push_doc(out, &service())?;
    if let Topology::Cluster(c) = &e.topology {
        for i in 0..MAX_MEMBERS {
            push_doc(out, &member_service(i))?;
        }
        push_doc(out, &cluster_configmap(c.replicas))?;
        push_doc(out, &pdb())?;
    }
    push_doc(out, &statefulset(p, e))
}

/// [`CLUSTER_CONFIGMAP`] for `replicas` members ([`initial_cluster`]).
pub fn cluster_configmap(replicas: i32) -> ConfigMap {
    let (cluster, state) = initial_cluster(replicas);
    ConfigMap {
        metadata: meta(CLUSTER_CONFIGMAP),
        data: Some(BTreeMap::from([
            (INITIAL_CLUSTER_KEY.to_string(), cluster),
            (INITIAL_CLUSTER_STATE_KEY.to_string(), state.to_string()),
        ])),
        ..ConfigMap::default()
    }
}

/// At most one member away for a voluntary disruption (a drain): three members keep quorum
/// with one gone, not with two.
pub fn pdb() -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: meta(ETCD),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector()),
                ..LabelSelector::default()
            }),
            // A replaced member's old pod is not ready (its etcd left the cluster) and must
            // still go by the drain's eviction (etcd_evacuation::mark_replaced).
            unhealthy_pod_eviction_policy: Some("AlwaysAllow".into()),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    }
}

/// Members on different nodes where there are enough (preferred, not required: a cluster of
/// fewer nodes still runs, e.g. the local cluster's two).
fn spread_members() -> PodAntiAffinity {
    PodAntiAffinity {
        preferred_during_scheduling_ignored_during_execution: Some(vec![WeightedPodAffinityTerm {
            weight: 100,
            pod_affinity_term: PodAffinityTerm {
                label_selector: Some(LabelSelector {
                    match_labels: Some(selector()),
                    ..LabelSelector::default()
                }),
                topology_key: HOSTNAME_LABEL.into(),
                ..PodAffinityTerm::default()
            },
        }]),
        ..PodAntiAffinity::default()
    }
}

/// Where every member keeps its data and serves clients.
fn common_args() -> Vec<String> {
    vec![
        "--data-dir=/var/lib/etcd/data".into(),
        format!("--listen-client-urls=https://0.0.0.0:{CLIENT_PORT}"),
    ]
}

/// The single member's flags, unchanged since before clusters (a change would restart it).
fn single_args(e: &EtcdParams) -> Vec<String> {
    let mut args = vec![format!("--name={ETCD}")];
    args.extend(common_args());
    args.extend([
        format!(
            "--advertise-client-urls={}",
            https_url(&e.host, CLIENT_PORT)
        ),
        // One member: the peer port stays on loopback.
        format!("--listen-peer-urls={LEGACY_PEER_URL}"),
        format!("--initial-advertise-peer-urls={LEGACY_PEER_URL}"),
        format!("--initial-cluster={ETCD}={LEGACY_PEER_URL}"),
    ]);
    args.extend(tls_args());
    args
}

/// A cluster member's flags: the same for every pod (one template), the member's own name
/// from its pod name, `--initial-cluster(-state)` from [`CLUSTER_CONFIGMAP`] through the
/// environment (etcd reads `ETCD_<FLAG>` for a flag not on the command line).
fn cluster_args() -> Vec<String> {
    let mut args = vec!["--name=$(POD_NAME)".to_string()];
    args.extend(common_args());
    args.extend([
        format!("--advertise-client-urls=https://$(POD_NAME):{CLIENT_PORT}"),
        format!("--listen-peer-urls=https://0.0.0.0:{PEER_PORT}"),
        format!("--initial-advertise-peer-urls=https://$(POD_NAME):{PEER_PORT}"),
        format!("--initial-cluster-token={ETCD}"),
    ]);
    args.extend(tls_args());
    args.extend([
        format!("--peer-cert-file={PEER_CERT_DIR}/tls.crt"),
        format!("--peer-key-file={PEER_CERT_DIR}/tls.key"),
        format!("--peer-trusted-ca-file={PEER_CERT_DIR}/ca.crt"),
        "--peer-client-cert-auth=true".into(),
        format!("--peer-cert-allowed-cn={PEER_COMMON_NAME}"),
        // A peer connects from its pod IP (a Service translates only the destination), which
        // no certificate can name: peers are authenticated by CA and common name instead.
        "--experimental-peer-skip-client-san-verification=true".into(),
        // A member moving off a drained node passes through two voters, which need each
        // other for quorum: virt-operator removes the one leaving right after the other
        // is promoted, having checked that it answers (etcd_members), instead of etcd
        // holding every change for five seconds of connection history; the shorter the two
        // voters need each other, the less a hiccup of either costs.
        "--strict-reconfig-check=false".into(),
        // Workers are busy machines (VMs, and under TCG their CPUs): a heartbeat missed
        // while a node is loaded must not cost an election, and with it the API for the
        // seconds the election takes (etcd's defaults are 100 ms and 1 s).
        "--heartbeat-interval=250".into(),
        "--election-timeout=2500".into(),
    ]);
    args
}

fn tls_args() -> Vec<String> {
    vec![
        format!("--cert-file={CERT_DIR}/tls.crt"),
        format!("--key-file={CERT_DIR}/tls.key"),
        format!("--trusted-ca-file={CERT_DIR}/ca.crt"),
        "--client-cert-auth=true".into(),
        // /health for kubelet's probes (and /metrics), plain HTTP on the pod IP.
        format!("--listen-metrics-urls=http://0.0.0.0:{ETCD_METRICS_PORT}"),
        "--auto-compaction-mode=periodic".into(),
        "--auto-compaction-retention=1h".into(),
    ]
}

fn env_from_configmap(name: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            config_map_key_ref: Some(ConfigMapKeySelector {
                name: CLUSTER_CONFIGMAP.into(),
                key: key.into(),
                optional: Some(false),
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

fn cluster_env() -> Vec<EnvVar> {
    vec![
        EnvVar {
            name: "POD_NAME".into(),
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    field_path: "metadata.name".into(),
                    ..ObjectFieldSelector::default()
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        },
        env_from_configmap("ETCD_INITIAL_CLUSTER", INITIAL_CLUSTER_KEY),
        env_from_configmap("ETCD_INITIAL_CLUSTER_STATE", INITIAL_CLUSTER_STATE_KEY),
    ]
}

fn secret_volume(name: &str, secret: &str) -> Volume {
    Volume {
        name: name.into(),
        secret: Some(k8s_openapi::api::core::v1::SecretVolumeSource {
            secret_name: Some(secret.into()),
            default_mode: Some(0o440),
            ..Default::default()
        }),
        ..Volume::default()
    }
}

fn statefulset(p: &Params, e: &EtcdParams) -> StatefulSet {
    let cluster = match &e.topology {
        Topology::Single => None,
        Topology::Cluster(c) => Some(c),
    };
    let mut ports = vec![ContainerPort {
        name: Some("client".into()),
        container_port: CLIENT_PORT,
        ..ContainerPort::default()
    }];
    if cluster.is_some() {
        ports.push(ContainerPort {
            name: Some("peer".into()),
            container_port: PEER_PORT,
            ..ContainerPort::default()
        });
    }
    ports.push(ContainerPort {
        name: Some("etcd-metrics".into()),
        container_port: ETCD_METRICS_PORT,
        ..ContainerPort::default()
    });
    let mut mounts = vec![
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
    ];
    let mut volumes = vec![secret_volume("tls", SERVER_SECRET)];
    if cluster.is_some() {
        mounts.push(VolumeMount {
            name: "peer-tls".into(),
            mount_path: PEER_CERT_DIR.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        });
        volumes.push(secret_volume("peer-tls", PEER_SECRET));
    }
    let container = Container {
        name: "etcd".into(),
        image: Some(p.etcd_image.clone()),
        image_pull_policy: Some(p.image_pull_policy.clone()),
        args: Some(match cluster {
            None => single_args(e),
            Some(_) => cluster_args(),
        }),
        env: cluster.map(|_| cluster_env()),
        ports: Some(ports),
        startup_probe: Some(http_probe("/health", "etcd-metrics", "HTTP", 1, 60)),
        liveness_probe: Some(liveness_probe("/health", "etcd-metrics", "HTTP")),
        readiness_probe: Some(http_probe("/health", "etcd-metrics", "HTTP", 2, 3)),
        volume_mounts: Some(mounts),
        resources: Some(requests("50m", "64Mi")),
        security_context: Some(restricted()),
        ..Container::default()
    };
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
    if let Some(c) = cluster {
        spec.host_aliases = Some(
            c.member_ips
                .iter()
                .enumerate()
                .map(|(i, ip)| HostAlias {
                    ip: ip.clone(),
                    hostnames: Some(vec![member_name(i)]),
                })
                .collect(),
        );
        // Spread across nodes unless the infra placement says where members go.
        let affinity = spec.affinity.get_or_insert_with(Affinity::default);
        if affinity.pod_anti_affinity.is_none() {
            affinity.pod_anti_affinity = Some(spread_members());
        }
    }
    StatefulSet {
        metadata: meta(ETCD),
        spec: Some(StatefulSetSpec {
            replicas: Some(cluster.map_or(1, |c| c.replicas.max(1))),
            // A member removed from etcd takes its volume along when its pod goes: one that
            // is added again later must start empty and join, not come back with the data
            // and identity of a removed member.
            persistent_volume_claim_retention_policy: cluster.map(|_| {
                StatefulSetPersistentVolumeClaimRetentionPolicy {
                    when_scaled: Some("Delete".into()),
                    when_deleted: Some("Retain".into()),
                }
            }),
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
/// rolled one at a time (a new pod serves before an old one goes). A cluster's every member,
/// whatever its current size: growing or shrinking it then rolls no virt-apiserver, which
/// uses the members that answer.
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
                format!("--etcd-servers={}", e.endpoints().join(",")),
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
/// certificate and, for a cluster, the members' peer certificate.
#[derive(Clone, PartialEq)]
pub struct EtcdTls {
    /// The hosts the serving certificate was issued for (annotation [`HOST_ANNOTATION`],
    /// [`EtcdHosts::key`]).
    pub host: String,
    pub ca: String,
    pub server_cert: String,
    pub server_key: String,
    pub client_cert: String,
    pub client_key: String,
    /// The peer certificate and key (cluster only).
    pub peer: Option<(String, String)>,
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTls").finish_non_exhaustive()
    }
}

impl EtcdTls {
    /// The server and client Secrets, and the peer Secret of a cluster.
    pub fn secrets(&self) -> Vec<Secret> {
        [
            (SERVER_SECRET, &self.server_cert, &self.server_key),
            (CLIENT_SECRET, &self.client_cert, &self.client_key),
        ]
        .into_iter()
        .chain(
            self.peer
                .as_ref()
                .map(|(cert, key)| (PEER_SECRET, cert, key)),
        )
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
        let hosts = EtcdHosts {
            service: "10.96.0.20".into(),
            members: vec![],
        };
        let st = crate::rotation::first_install(crate::rotation::Domain::Etcd, &hosts);
        let t = crate::rotation::etcd_tls(&st, &hosts).unwrap();
        assert!(t.peer.is_none(), "one member has no peers");
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

    fn cluster(replicas: i32) -> EtcdParams {
        EtcdParams {
            host: "10.96.0.20".into(),
            storage: EtcdStorage::Claim { size: "1Gi".into() },
            annotations: BTreeMap::new(),
            topology: Topology::Cluster(ClusterTopology {
                member_ips: vec![
                    "10.96.0.30".into(),
                    "10.96.0.31".into(),
                    "10.96.0.32".into(),
                ],
                replicas,
            }),
        }
    }

    fn pod(sts: &StatefulSet) -> PodSpec {
        sts.spec.clone().unwrap().template.spec.unwrap()
    }

    /// Every pod has one template, so everything that differs per member comes from the pod
    /// (its name) or, read at start, from the ConfigMap: a membership change restarts nobody.
    #[test]
    fn one_template_for_every_member_whatever_the_membership() {
        let p = Params::default();
        let (one, three) = (statefulset(&p, &cluster(1)), statefulset(&p, &cluster(3)));
        assert_eq!(
            one.spec.as_ref().unwrap().template,
            three.spec.as_ref().unwrap().template
        );
        assert_eq!(three.spec.as_ref().unwrap().replicas, Some(3));
        assert_eq!(one.spec.as_ref().unwrap().replicas, Some(1));
        assert!(is_cluster(&three));
        assert!(!is_cluster(&statefulset(&p, &EtcdParams::default())));
        let retention = three
            .spec
            .unwrap()
            .persistent_volume_claim_retention_policy
            .unwrap();
        assert_eq!(
            (
                retention.when_scaled.as_deref(),
                retention.when_deleted.as_deref()
            ),
            (Some("Delete"), Some("Retain"))
        );
    }

    /// The flags of a cluster member, in full: peers by name over TLS, authenticated by CA and
    /// common name (not by source address, which is a pod IP behind the Service).
    #[test]
    fn a_cluster_member_is_named_by_its_pod_and_talks_peer_tls() {
        let pod = pod(&statefulset(&Params::default(), &cluster(3)));
        let c = &pod.containers[0];
        assert_eq!(
            c.args.clone().unwrap(),
            [
                "--name=$(POD_NAME)",
                "--data-dir=/var/lib/etcd/data",
                "--listen-client-urls=https://0.0.0.0:2379",
                "--advertise-client-urls=https://$(POD_NAME):2379",
                "--listen-peer-urls=https://0.0.0.0:2380",
                "--initial-advertise-peer-urls=https://$(POD_NAME):2380",
                "--initial-cluster-token=kubevirt-etcd",
                "--cert-file=/etc/etcd/tls/tls.crt",
                "--key-file=/etc/etcd/tls/tls.key",
                "--trusted-ca-file=/etc/etcd/tls/ca.crt",
                "--client-cert-auth=true",
                "--listen-metrics-urls=http://0.0.0.0:2381",
                "--auto-compaction-mode=periodic",
                "--auto-compaction-retention=1h",
                "--peer-cert-file=/etc/etcd/peer/tls.crt",
                "--peer-key-file=/etc/etcd/peer/tls.key",
                "--peer-trusted-ca-file=/etc/etcd/peer/ca.crt",
                "--peer-client-cert-auth=true",
                "--peer-cert-allowed-cn=kubevirt-etcd-peer",
                "--experimental-peer-skip-client-san-verification=true",
                "--strict-reconfig-check=false",
                "--heartbeat-interval=250",
                "--election-timeout=2500",
            ]
        );
        let env: Vec<(String, String)> = c
            .env
            .clone()
            .unwrap()
            .into_iter()
            .map(|e| {
                let from = e.value_from.unwrap();
                let src = match (from.field_ref, from.config_map_key_ref) {
                    (Some(f), None) => f.field_path,
                    (None, Some(k)) => format!("{}/{}", k.name, k.key),
                    other => panic!("{other:?}"),
                };
                (e.name, src)
            })
            .collect();
        assert_eq!(
            env,
            [
                ("POD_NAME".into(), "metadata.name".into()),
                (
                    "ETCD_INITIAL_CLUSTER".into(),
                    "kubevirt-etcd-cluster/initial-cluster".into()
                ),
                (
                    "ETCD_INITIAL_CLUSTER_STATE".into(),
                    "kubevirt-etcd-cluster/initial-cluster-state".into()
                ),
            ]
        );
        // The names in the peer URLs, without DNS: each pod's /etc/hosts.
        let aliases: Vec<(String, Vec<String>)> = pod
            .host_aliases
            .unwrap()
            .into_iter()
            .map(|a| (a.ip, a.hostnames.unwrap()))
            .collect();
        assert_eq!(
            aliases,
            [
                ("10.96.0.30".into(), vec!["kubevirt-etcd-0".to_string()]),
                ("10.96.0.31".into(), vec!["kubevirt-etcd-1".to_string()]),
                ("10.96.0.32".into(), vec!["kubevirt-etcd-2".to_string()]),
            ]
        );
        let spread = pod.affinity.unwrap().pod_anti_affinity.unwrap();
        let term = &spread
            .preferred_during_scheduling_ignored_during_execution
            .unwrap()[0];
        assert_eq!(term.pod_affinity_term.topology_key, HOSTNAME_LABEL);
        assert!(
            spread
                .required_during_scheduling_ignored_during_execution
                .is_none()
        );
        let peer = pod
            .volumes
            .unwrap()
            .into_iter()
            .find(|v| v.name == "peer-tls")
            .unwrap();
        assert_eq!(
            peer.secret.unwrap().secret_name.as_deref(),
            Some(PEER_SECRET)
        );
    }

    /// The single member stays exactly as every installation before clusters ran it: an
    /// upgrade must not restart the store.
    #[test]
    fn a_single_member_keeps_its_flags() {
        let e = EtcdParams {
            host: "10.96.0.20".into(),
            ..EtcdParams::default()
        };
        let pod = pod(&statefulset(&Params::default(), &e));
        let c = &pod.containers[0];
        assert_eq!(
            c.args.clone().unwrap(),
            [
                "--name=kubevirt-etcd",
                "--data-dir=/var/lib/etcd/data",
                "--listen-client-urls=https://0.0.0.0:2379",
                "--advertise-client-urls=https://10.96.0.20:2379",
                "--listen-peer-urls=http://127.0.0.1:2380",
                "--initial-advertise-peer-urls=http://127.0.0.1:2380",
                "--initial-cluster=kubevirt-etcd=http://127.0.0.1:2380",
                "--cert-file=/etc/etcd/tls/tls.crt",
                "--key-file=/etc/etcd/tls/tls.key",
                "--trusted-ca-file=/etc/etcd/tls/ca.crt",
                "--client-cert-auth=true",
                "--listen-metrics-urls=http://0.0.0.0:2381",
                "--auto-compaction-mode=periodic",
                "--auto-compaction-retention=1h",
            ]
        );
        assert!(c.env.is_none() && pod.host_aliases.is_none() && pod.affinity.is_none());
        let ports: Vec<i32> = c.ports.iter().flatten().map(|p| p.container_port).collect();
        assert_eq!(ports, [2379, 2381]);
    }

    #[test]
    fn the_initial_cluster_bootstraps_once_then_every_member_joins() {
        assert_eq!(
            initial_cluster(1),
            (
                "kubevirt-etcd-0=https://kubevirt-etcd-0:2380".to_string(),
                "new"
            )
        );
        assert_eq!(
            initial_cluster(2),
            (
                "kubevirt-etcd-0=https://kubevirt-etcd-0:2380,\
                 kubevirt-etcd-1=https://kubevirt-etcd-1:2380"
                    .to_string(),
                "existing"
            )
        );
        assert_eq!(initial_cluster(3).1, "existing");
        assert_eq!(initial_cluster(3).0.matches("https://").count(), 3);
        let cm = cluster_configmap(3);
        assert_eq!(cm.data.unwrap()[INITIAL_CLUSTER_STATE_KEY], "existing");
    }

    #[test]
    fn a_cluster_adds_member_services_its_configmap_and_a_pdb() {
        let p = Params::default();
        let mut out = String::new();
        objects(&mut out, &p, &cluster(3)).unwrap();
        let docs: Vec<serde_json::Value> = out
            .split("---\n")
            .filter(|d| !d.trim().is_empty())
            .map(|d| serde_saphyr::from_str(d).unwrap())
            .collect();
        let names: Vec<String> = docs
            .iter()
            .map(|d| {
                format!(
                    "{}/{}",
                    d["kind"].as_str().unwrap(),
                    d["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect();
        assert_eq!(
            names,
            [
                "Service/kubevirt-etcd",
                "Service/kubevirt-etcd-0",
                "Service/kubevirt-etcd-1",
                "Service/kubevirt-etcd-2",
                "ConfigMap/kubevirt-etcd-cluster",
                "PodDisruptionBudget/kubevirt-etcd",
                "StatefulSet/kubevirt-etcd",
            ]
        );
        let member = &docs[2];
        assert_eq!(
            member["spec"]["selector"]["statefulset.kubernetes.io/pod-name"],
            "kubevirt-etcd-1"
        );
        assert_eq!(member["spec"]["publishNotReadyAddresses"], true);
        assert_eq!(docs[5]["spec"]["maxUnavailable"], 1);
        let mut single = String::new();
        objects(&mut single, &p, &EtcdParams::default()).unwrap();
        assert!(!single.contains("kubevirt-etcd-0") && !single.contains("PodDisruptionBudget"));
    }

    #[test]
    fn virt_apiserver_dials_every_member_of_a_cluster() {
        assert_eq!(
            cluster(1).endpoints(),
            [
                "https://10.96.0.30:2379",
                "https://10.96.0.31:2379",
                "https://10.96.0.32:2379"
            ]
        );
        let single = EtcdParams {
            host: "fd00::1".into(),
            ..EtcdParams::default()
        };
        assert_eq!(single.endpoints(), ["https://[fd00::1]:2379"]);
        let p = Params {
            etcd: super::super::EtcdMode::StatefulSet(cluster(1)),
            ..Params::default()
        };
        let text = super::super::static_manifest(&p).unwrap();
        assert!(text.contains(
            "--etcd-servers=https://10.96.0.30:2379,https://10.96.0.31:2379,https://10.96.0.32:2379"
        ));
    }

    #[test]
    fn a_cluster_has_a_peer_certificate_naming_every_member() {
        let hosts = EtcdHosts {
            service: "10.96.0.20".into(),
            members: vec![
                "10.96.0.30".into(),
                "10.96.0.31".into(),
                "10.96.0.32".into(),
            ],
        };
        assert_eq!(hosts.key(), "10.96.0.20,10.96.0.30,10.96.0.31,10.96.0.32");
        let st = crate::rotation::first_install(crate::rotation::Domain::Etcd, &hosts);
        let t = crate::rotation::etcd_tls(&st, &hosts).unwrap();
        let (peer, _) = t.peer.clone().unwrap();
        assert!(virt_certs::has_client_auth(&peer).unwrap());
        assert_eq!(
            virt_certs::node_identity::common_name_of_pem(&peer).as_deref(),
            Some(PEER_COMMON_NAME)
        );
        assert_eq!(
            peer_names(&hosts),
            [
                "kubevirt-etcd-0",
                "10.96.0.30",
                "kubevirt-etcd-1",
                "10.96.0.31",
                "kubevirt-etcd-2",
                "10.96.0.32"
            ]
        );
        assert!(server_names(&hosts).contains(&"10.96.0.31".to_string()));
        let names: Vec<String> = t
            .secrets()
            .into_iter()
            .map(|s| s.metadata.name.unwrap())
            .collect();
        assert_eq!(names, [SERVER_SECRET, CLIENT_SECRET, PEER_SECRET]);
    }
}
