//! virt-controller (Deployment) and virt-handler (DaemonSet), their RBAC, and the mTLS
//! certificates between virt-apiserver and virt-handler (docs/cluster-flow.md §4, §5).

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec, Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvVar,
    EnvVarSource, ObjectFieldSelector, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    SeccompProfile, Secret, SecretVolumeSource, SecurityContext, ServiceAccount, Toleration,
    Volume, VolumeMount,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use kubevirt_api::{COMPONENT_LABEL, catalogue};

use super::{
    GROUP, NAMESPACE, Params, RUN_AS, Result, http_probe, liveness_probe, push_doc, requests,
    resources, restricted, role_ref, rule, strings,
};

pub const CONTROLLER: &str = "virt-controller";
pub const HANDLER: &str = "virt-handler";
/// Where the handler certificates of an earlier version were (one key shared by every node);
/// removed once every handler has its own.
pub const RETIRED_HANDLER_CERTS: &str = "virt-handler-certs";
/// The handler CA bundle (`ca.crt`): what virt-handler checks its peers against.
pub const HANDLER_CA: &str = "virt-handler-ca";
/// virt-apiserver's client certificate towards virt-handler (CN `virt-apiserver`).
pub const HANDLER_CLIENT: &str = "virt-apiserver-handler-client";
pub const HANDLER_PORT: i32 = kubevirt_api::handler_protocol::HANDLER_PORT as i32;
const CONTROLLER_METRICS_PORT: i32 = 8080;
/// virt-handler's plain-HTTP `/metrics` and `/healthz` (the mTLS port would log every probe
/// as a refused handshake).
const HANDLER_METRICS_PORT: i32 = 8187;
/// Where virt-apiserver finds its handler client certificate.
pub const HANDLER_CLIENT_DIR: &str = "/etc/kubevirt-apiserver/handler";
const HANDLER_CA_DIR: &str = "/etc/virt-handler/ca";
/// virt-handler's own key and certificate (memory-backed: the key never reaches a disk).
const HANDLER_CERT_DIR: &str = "/var/run/virt-handler/certs";
/// Host directories shared by launcher pods and virt-handler (docs/cluster-flow.md §1).
/// Where virt-handler's init container leaves this node's probed QEMU capabilities
/// (an emptyDir of the handler pod; docs/node.md, "QEMU capabilities").
const HANDLER_CAPABILITIES_DIR: &str = "/var/cache/kubevirt-rs/qemu-capabilities";

fn labels(name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), name.into()),
        ("app.kubernetes.io/part-of".into(), "kubevirt-rs".into()),
    ])
}

fn meta(name: &str, namespace: Option<&str>, component: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: namespace.map(str::to_string),
        labels: Some(labels(component)),
        ..ObjectMeta::default()
    }
}

fn subject(sa: &str) -> k8s_openapi::api::rbac::v1::Subject {
    k8s_openapi::api::rbac::v1::Subject {
        kind: "ServiceAccount".into(),
        name: sa.into(),
        namespace: Some(NAMESPACE.into()),
        ..Default::default()
    }
}

fn field_env(name: &str, path: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                api_version: None,
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }
}

fn empty_dir(name: &str) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Volume::default()
    }
}

/// virt-handler's init container: the launcher image probes this node's QEMU
/// capabilities once, unprivileged, as the launcher user; virt-handler copies them into
/// each launcher pod's own cache.
fn capabilities_probe(p: &Params) -> Container {
    let uid = i64::from(kubevirt_api::LAUNCHER_UID);
    Container {
        name: "qemu-capabilities".into(),
        image: Some(p.launcher_image.clone()),
        image_pull_policy: Some(p.image_pull_policy.clone()),
        command: Some(vec![
            "/usr/bin/virt-launcher".into(),
            "probe-capabilities".into(),
            HANDLER_CAPABILITIES_DIR.into(),
        ]),
        volume_mounts: Some(vec![
            mount("capabilities", HANDLER_CAPABILITIES_DIR, false),
            mount("probe-tmp", "/tmp", false),
        ]),
        resources: Some(requests("10m", "64Mi")),
        security_context: Some(SecurityContext {
            run_as_user: Some(uid),
            run_as_group: Some(uid),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                ..SeccompProfile::default()
            }),
            ..virt_controllers::vmi::render::unprivileged()
        }),
        ..Container::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    }
}

fn secret_volume(name: &str, secret: &str) -> Volume {
    Volume {
        name: name.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.into()),
            default_mode: Some(0o440),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    }
}

fn cluster_role_and_binding(out: &mut String, name: &str, rules: Vec<PolicyRule>) -> Result<()> {
    push_doc(
        out,
        &ClusterRole {
            metadata: meta(name, None, name),
            rules: Some(rules),
            aggregation_rule: None,
        },
    )?;
    push_doc(
        out,
        &ClusterRoleBinding {
            metadata: meta(name, None, name),
            role_ref: role_ref("ClusterRole", name),
            subjects: Some(vec![subject(name)]),
        },
    )
}

/// `GET /readyz` on the port named `metrics`, asked every 2 s: not ready while one of the
/// process's API watches is failing, so a component that cannot see its objects shows it.
fn ready() -> Probe {
    http_probe("/readyz", "metrics", "HTTP", 2, 3)
}

/// `GET /healthz` on the port named `metrics`: liveness ([`liveness_probe`]).
fn alive() -> Probe {
    liveness_probe("/healthz", "metrics", "HTTP")
}

/// virt-handler's liveness: asked every 45 s, as KubeVirt asks its virt-handler, so it is
/// restarted only after 2 minutes without an answer. Its node is where the guests run; a
/// node busy with them (TCG guests booting, all wanting CPU, each pod weighing more than the
/// handler's small request) can keep it from answering for tens of seconds, and a restart
/// then only adds work. `cargo xtask fuzz --cluster` saw a 45 s budget run out that way.
fn handler_alive() -> Probe {
    Probe {
        period_seconds: Some(45),
        ..alive()
    }
}

/// The API groups whose stored kinds virt-controller reconciles (writes, and their status).
const RECONCILED_GROUPS: [&str; 3] = [GROUP, kubevirt_api::cdi::GROUP, kubevirt_api::pool::GROUP];

/// virt-controller's cluster-wide rules. Its own kinds come from the catalogue: it reconciles
/// every stored kind and writes their status.
fn controller_rules() -> Vec<PolicyRule> {
    let all = [
        "get", "list", "watch", "create", "update", "patch", "delete",
    ];
    // It reconciles the kinds of kubevirt.io and CDI's (a VM creates its DataVolumes, a
    // DataVolume its claim) and reads the others (instance types and preferences, which it
    // applies to the VMIs it creates).
    let stored = catalogue::stored().filter(|k| RECONCILED_GROUPS.contains(&k.group));
    let read_only = catalogue::stored().filter(|k| !RECONCILED_GROUPS.contains(&k.group));
    let mut rules = crate::render::rules_by_group(stored.clone(), "", &all);
    rules.extend(crate::render::rules_by_group(
        stored.clone().filter(|k| k.has_status),
        "/status",
        &["get", "update", "patch"],
    ));
    // ownerReferences with blockOwnerDeletion need update on the owner's finalizers
    // where OwnerReferencesPermissionEnforcement is enabled, and every stored kind owns
    // something with it: a VM its VMI and DataVolumes, a VMI its launcher pod, a migration
    // its target pod, a DataVolume its claim.
    rules.extend(crate::render::rules_by_group(
        stored,
        "/finalizers",
        &["update"],
    ));
    rules.extend(crate::render::rules_by_group(
        read_only,
        "",
        &["get", "list", "watch"],
    ));
    rules.extend([
        // The copies of a VM's instance type and preference it captures (KubeVirt's
        // ControllerRevisions, owned by the VM).
        rule(
            "apps",
            strings(&["controllerrevisions"]),
            // patch: a VM sharing another VM's copy adds itself to its owners.
            &["get", "list", "watch", "create", "patch", "delete"],
        ),
        rule("", strings(&["pods"]), &all),
        // The workload updater evicts launcher pods that cannot migrate (Evict).
        rule("", strings(&["pods/eviction"]), &["create"]),
        // …and reports outdated VMIs in the KubeVirt resource's status.
        rule(
            GROUP,
            resources([&catalogue::KUBEVIRT], ""),
            &["get", "list", "watch"],
        ),
        rule(
            GROUP,
            resources([&catalogue::KUBEVIRT], "/status"),
            &["patch"],
        ),
        // The launcher's Secret of a VMI's inline cloud-init data (not in the pod's
        // annotations, which `view` reads).
        rule("", strings(&["secrets"]), &["create"]),
        // The claims behind persistentVolumeClaim volumes: their volumeMode and size
        // shape the launcher pod and volumeStatus; a migration that copies a
        // ReadWriteOnce claim makes the target's claim, hands it over and deletes the old.
        rule(
            "",
            strings(&["persistentvolumeclaims"]),
            &["get", "list", "watch", "create", "patch", "delete"],
        ),
        rule("", strings(&["nodes"]), &["get", "list", "watch"]),
        // A DataVolume's `storage:` claim takes the default (virt) StorageClass, and a
        // blank one waits for its first consumer where the class binds on it.
        rule(
            "storage.k8s.io",
            strings(&["storageclasses"]),
            &["get", "list", "watch"],
        ),
        rule("", strings(&["events"]), &["create", "update", "patch"]),
        rule(
            "events.k8s.io",
            strings(&["events"]),
            &["create", "update", "patch"],
        ),
    ]);
    rules
}

/// Objects of virt-controller: ServiceAccount, RBAC, Deployment.
pub fn controller(out: &mut String, p: &Params) -> Result<()> {
    push_doc(
        out,
        &ServiceAccount {
            metadata: meta(CONTROLLER, Some(NAMESPACE), CONTROLLER),
            ..ServiceAccount::default()
        },
    )?;
    cluster_role_and_binding(out, CONTROLLER, controller_rules())?;
    // The leader Lease lives in our namespace only.
    push_doc(
        out,
        &Role {
            metadata: meta(CONTROLLER, Some(NAMESPACE), CONTROLLER),
            rules: Some(vec![rule(
                "coordination.k8s.io",
                strings(&["leases"]),
                &["get", "list", "watch", "create", "update", "patch"],
            )]),
        },
    )?;
    push_doc(
        out,
        &RoleBinding {
            metadata: meta(CONTROLLER, Some(NAMESPACE), CONTROLLER),
            role_ref: role_ref("Role", CONTROLLER),
            subjects: Some(vec![subject(CONTROLLER)]),
        },
    )?;
    let mut d = controller_deployment(p);
    if let Some(spec) = d.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
        p.infra.apply(spec);
    }
    push_doc(out, &d)
}

fn controller_deployment(p: &Params) -> Deployment {
    let selector = BTreeMap::from([("app.kubernetes.io/name".to_string(), CONTROLLER.into())]);
    let mut pod_labels = labels(CONTROLLER);
    pod_labels.insert(COMPONENT_LABEL.into(), CONTROLLER.into());
    // Behind kubevirt-prometheus-metrics: its /metrics is on the port named `metrics`.
    pod_labels.extend([super::monitoring::pod_label()]);
    let container = Container {
        name: CONTROLLER.into(),
        image: Some(p.controller_image.clone()),
        image_pull_policy: Some(p.image_pull_policy.clone()),
        args: Some(
            [
                format!("--metrics-addr=0.0.0.0:{CONTROLLER_METRICS_PORT}"),
                format!("--launcher-image={}", p.launcher_image),
                // Nested KVM is not dependable on our machines (and absent on kind): VMs may
                // fall back to QEMU's TCG, as KubeVirt's developerConfiguration.useEmulation
                // allows.
                format!("--allow-emulation={}", p.allow_emulation),
            ]
            .into_iter()
            .chain(super::eviction_strategy_flag(p))
            .chain(super::serial_console_log_flag(p))
            .chain(super::datavolumes_flag(p))
            .chain(super::workload_update_flags(p))
            .chain(p.migration_flags.iter().cloned())
            .collect(),
        ),
        env: Some(vec![
            // Identity in the leader Lease, and the Lease's namespace.
            field_env("POD_NAME", "metadata.name"),
            field_env("POD_NAMESPACE", "metadata.namespace"),
        ]),
        ports: Some(vec![ContainerPort {
            name: Some("metrics".into()),
            container_port: CONTROLLER_METRICS_PORT,
            ..ContainerPort::default()
        }]),
        liveness_probe: Some(alive()),
        readiness_probe: Some(ready()),
        resources: Some(requests("20m", "32Mi")),
        security_context: Some(restricted()),
        ..Container::default()
    };
    Deployment {
        metadata: meta(CONTROLLER, Some(NAMESPACE), CONTROLLER),
        spec: Some(DeploymentSpec {
            // Two replicas, one leader (Lease): a standby takes over when the leader's node or
            // pod goes away.
            replicas: Some(2),
            selector: LabelSelector {
                match_labels: Some(selector),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: (!p.controller_annotations.is_empty())
                        .then(|| p.controller_annotations.clone()),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(CONTROLLER.into()),
                    enable_service_links: Some(false),
                    termination_grace_period_seconds: Some(10),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        run_as_user: Some(RUN_AS),
                        run_as_group: Some(RUN_AS),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".into(),
                            ..SeccompProfile::default()
                        }),
                        ..PodSecurityContext::default()
                    }),
                    containers: vec![container],
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    }
}

/// virt-handler's resources. Memory is bounded (N4 of the security review at bd37f96): the
/// one privileged daemon of a node serves every launcher there, and one that could make it
/// grow would take consoles, networks and migrations of every VM on the node with it. Measured:
/// 35 MiB resident with VMs running (debug build, two-node local cluster); what grows with the
/// VMs is a few KiB each, plus up to 1.3 MiB per console with a reader that lags (its hub's
/// buffer of 128 chunks of 10 KiB): 256 MiB leaves room for a hundred such consoles.
fn handler_resources() -> k8s_openapi::api::core::v1::ResourceRequirements {
    let mut r = requests("20m", "32Mi");
    r.limits = Some(std::collections::BTreeMap::from([(
        "memory".to_string(),
        k8s_openapi::apimachinery::pkg::api::resource::Quantity("256Mi".into()),
    )]));
    r
}

/// virt-handler's cluster-wide rules: of the catalogue's kinds it reads VMIs and writes
/// their status only (virt-apiserver narrows that to the VMIs of the handler's own node:
/// `kubevirt_api::policy::Actor::Handler`); nothing on Nodes (N7 of the security review at
/// bd37f96: it never used its `patch` on every Node).
fn handler_rules() -> Vec<PolicyRule> {
    let vmi = [&catalogue::VIRTUAL_MACHINE_INSTANCE];
    vec![
        rule(GROUP, resources(vmi, ""), &["get", "list", "watch"]),
        rule(
            GROUP,
            resources(vmi, "/status"),
            &["get", "patch", "update"],
        ),
        rule("", strings(&["pods"]), &["get", "list", "watch"]),
        // Its own certificate, asked for with its pod-bound token (signer.rs).
        rule(
            "certificates.k8s.io",
            strings(&["certificatesigningrequests"]),
            &["create", "get"],
        ),
        rule("", strings(&["events"]), &["create", "update", "patch"]),
        rule(
            "events.k8s.io",
            strings(&["events"]),
            &["create", "update", "patch"],
        ),
    ]
}

/// Objects of virt-handler: ServiceAccount, RBAC, DaemonSet.
pub fn handler(out: &mut String, p: &Params) -> Result<()> {
    push_doc(
        out,
        &ServiceAccount {
            metadata: meta(HANDLER, Some(NAMESPACE), HANDLER),
            ..ServiceAccount::default()
        },
    )?;
    cluster_role_and_binding(out, HANDLER, handler_rules())?;
    let mut ds = handler_daemonset(p);
    if let Some(spec) = ds.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
        p.workloads.apply(spec);
    }
    push_doc(out, &ds)
}

fn handler_daemonset(p: &Params) -> DaemonSet {
    let selector = BTreeMap::from([("app.kubernetes.io/name".to_string(), HANDLER.into())]);
    let mut pod_labels = labels(HANDLER);
    // virt-apiserver finds the handler of a node by this label (docs/cluster-flow.md §5).
    pod_labels.insert(
        COMPONENT_LABEL.into(),
        kubevirt_api::HANDLER_COMPONENT.into(),
    );
    // Behind kubevirt-prometheus-metrics: its /metrics is on the port named `metrics`.
    pod_labels.extend([super::monitoring::pod_label()]);
    let container = Container {
        name: HANDLER.into(),
        image: Some(p.handler_image.clone()),
        image_pull_policy: Some(p.image_pull_policy.clone()),
        args: Some(vec![
            "--node-name=$(NODE_NAME)".into(),
            format!("--certificate-dir={HANDLER_CERT_DIR}"),
            format!("--client-ca={HANDLER_CA_DIR}/ca.crt"),
            format!("--metrics-addr=0.0.0.0:{HANDLER_METRICS_PORT}"),
            format!("--qemu-capabilities={HANDLER_CAPABILITIES_DIR}"),
        ]),
        env: Some(vec![
            field_env("NODE_NAME", "spec.nodeName"),
            // Migration targets listen on the pod IP (docs/cluster-flow.md §6.6).
            field_env("POD_IP", "status.podIP"),
        ]),
        ports: Some(vec![
            ContainerPort {
                name: Some("handler".into()),
                container_port: HANDLER_PORT,
                ..ContainerPort::default()
            },
            ContainerPort {
                name: Some("metrics".into()),
                container_port: HANDLER_METRICS_PORT,
                ..ContainerPort::default()
            },
        ]),
        readiness_probe: Some(ready()),
        liveness_probe: Some(handler_alive()),
        volume_mounts: Some(vec![
            // This node's directory of the host's per-node tree (docs/cluster-flow.md §1):
            // two nodes sharing a filesystem never see each other's sockets.
            mount("capabilities", HANDLER_CAPABILITIES_DIR, true),
            mount("ca", HANDLER_CA_DIR, true),
            mount("certs", HANDLER_CERT_DIR, false),
        ]),
        resources: Some(handler_resources()),
        // Enters launcher pods' network namespaces and reaches their sockets through
        // /proc/<pid>/root (docs/node.md, "Privilege model").
        security_context: Some(SecurityContext {
            privileged: Some(true),
            run_as_user: Some(0),
            ..SecurityContext::default()
        }),
        ..Container::default()
    };
    DaemonSet {
        metadata: meta(HANDLER, Some(NAMESPACE), HANDLER),
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(selector),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    annotations: (!p.handler_annotations.is_empty())
                        .then(|| p.handler_annotations.clone()),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    // Sees the launchers' processes: their network namespaces are
                    // entered through /proc/<pid>/ns/net, the pid taken from the peer
                    // credentials of the launcher's socket (docs/design-node-privilege-and-network.md).
                    host_pid: Some(true),
                    service_account_name: Some(HANDLER.into()),
                    enable_service_links: Some(false),
                    termination_grace_period_seconds: Some(10),
                    // Every node that may run VMs, control-plane nodes included.
                    tolerations: Some(vec![Toleration {
                        operator: Some("Exists".into()),
                        ..Toleration::default()
                    }]),
                    init_containers: Some(vec![capabilities_probe(p)]),
                    containers: vec![container],
                    volumes: Some(vec![
                        empty_dir("capabilities"),
                        empty_dir("probe-tmp"),
                        Volume {
                            name: "ca".into(),
                            config_map: Some(ConfigMapVolumeSource {
                                name: HANDLER_CA.into(),
                                ..ConfigMapVolumeSource::default()
                            }),
                            ..Volume::default()
                        },
                        Volume {
                            name: "certs".into(),
                            empty_dir: Some(EmptyDirVolumeSource {
                                medium: Some("Memory".into()),
                                size_limit: Some(Quantity("1Mi".into())),
                            }),
                            ..Volume::default()
                        },
                    ]),
                    ..PodSpec::default()
                }),
            },
            ..DaemonSetSpec::default()
        }),
        ..DaemonSet::default()
    }
}

/// virt-apiserver may list the handler pods of its namespace (docs/cluster-flow.md §5).
pub fn apiserver_pod_reader(out: &mut String) -> Result<()> {
    let name = "kubevirt-apiserver:pod-reader";
    push_doc(
        out,
        &Role {
            metadata: meta(name, Some(NAMESPACE), super::NAME),
            rules: Some(vec![
                rule("", strings(&["pods"]), &["get", "list", "watch"]),
                // The eviction webhook marks an etcd pod whose eviction was asked, so that
                // virt-operator moves that member (webhook.rs); only those pods.
                PolicyRule {
                    resource_names: Some(
                        (0..super::etcd::MAX_MEMBERS)
                            .map(super::etcd::member_name)
                            .collect(),
                    ),
                    ..rule("", strings(&["pods"]), &["patch"])
                },
            ]),
        },
    )?;
    push_doc(
        out,
        &RoleBinding {
            metadata: meta(name, Some(NAMESPACE), super::NAME),
            role_ref: role_ref("Role", name),
            subjects: Some(vec![subject(super::NAME)]),
        },
    )
}

/// The volume and mount of virt-apiserver's handler client certificate.
pub fn apiserver_handler_volume() -> (Volume, VolumeMount) {
    (
        secret_volume("handler-client", HANDLER_CLIENT),
        mount("handler-client", HANDLER_CLIENT_DIR, true),
    )
}

/// virt-apiserver's flags for talking to virt-handler.
pub fn apiserver_handler_flags() -> Vec<String> {
    vec![
        format!("--handler-ca={HANDLER_CLIENT_DIR}/ca.crt"),
        format!("--handler-client-cert={HANDLER_CLIENT_DIR}/tls.crt"),
        format!("--handler-client-key={HANDLER_CLIENT_DIR}/tls.key"),
    ]
}

/// The mTLS material between virt-apiserver and virt-handler (PEM): the handler CA bundle and
/// virt-apiserver's client certificate (CN `virt-apiserver`). Handlers ask for their own.
#[derive(Debug, Clone)]
pub struct HandlerTls {
    pub ca: String,
    pub client_cert: String,
    pub client_key: String,
    /// The lifetime virt-operator signs handler certificates with, published for the
    /// handlers to renew theirs by ([`HANDLER_DURATION_KEY`], [`HANDLER_RENEW_BEFORE_KEY`]).
    pub lifetime: Option<crate::policy::Lifetime>,
}

/// Keys of the handler CA ConfigMap with the lifetime of handler certificates, in seconds.
pub const HANDLER_DURATION_KEY: &str = "duration-seconds";
pub const HANDLER_RENEW_BEFORE_KEY: &str = "renew-before-seconds";

/// virt-apiserver's client Secret and the handlers' CA ConfigMap of [`HandlerTls`].
pub fn handler_secrets(out: &mut String, tls: &HandlerTls) -> Result<()> {
    push_doc(
        out,
        &Secret {
            metadata: meta(HANDLER_CLIENT, Some(NAMESPACE), super::NAME),
            type_: Some("kubernetes.io/tls".into()),
            data: Some(BTreeMap::from([
                ("ca.crt".into(), ByteString(tls.ca.clone().into_bytes())),
                (
                    "tls.crt".into(),
                    ByteString(tls.client_cert.clone().into_bytes()),
                ),
                (
                    "tls.key".into(),
                    ByteString(tls.client_key.clone().into_bytes()),
                ),
            ])),
            ..Secret::default()
        },
    )?;
    push_doc(
        out,
        &ConfigMap {
            metadata: meta(HANDLER_CA, Some(NAMESPACE), HANDLER),
            data: Some(
                [("ca.crt".to_string(), tls.ca.clone())]
                    .into_iter()
                    .chain(tls.lifetime.iter().flat_map(|l| {
                        [
                            (
                                HANDLER_DURATION_KEY.to_string(),
                                l.duration.whole_seconds().to_string(),
                            ),
                            (
                                HANDLER_RENEW_BEFORE_KEY.to_string(),
                                l.renew_before.whole_seconds().to_string(),
                            ),
                        ]
                    }))
                    .collect(),
            ),
            ..ConfigMap::default()
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::render::grants;

    /// The grants on kubevirt.io, written out: a change to the catalogue that changes a
    /// component's permissions shows here.
    #[test]
    fn controller_holds_every_stored_kind_and_its_status() {
        let want: Vec<String> = [
            "kubevirts get",
            "kubevirts list",
            "kubevirts watch",
            "kubevirts/status patch",
        ]
        .into_iter()
        .map(String::from)
        .chain(
            catalogue::stored()
                .filter(|k| k.group == GROUP)
                .flat_map(|k| {
                    let p = k.plural;
                    [
                        "get", "list", "watch", "create", "update", "patch", "delete",
                    ]
                    .map(|v| format!("{p} {v}"))
                    .into_iter()
                    .chain(["get", "update", "patch"].map(|v| format!("{p}/status {v}")))
                    .chain([format!("{p}/finalizers update")])
                }),
        )
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
        assert_eq!(grants(&controller_rules(), GROUP), want);
        // …and CDI's DataVolumes, which it creates for VMs and whose status it writes.
        let cdi = grants(&controller_rules(), kubevirt_api::cdi::GROUP);
        for g in [
            "datavolumes create",
            "datavolumes delete",
            "datavolumes watch",
            "datavolumes/status update",
            "datavolumes/status patch",
            "datavolumes/finalizers update",
        ] {
            assert!(cdi.contains(&g.to_string()), "{g}: {cdi:?}");
        }
        assert!(want.contains(&"virtualmachineinstancemigrations/status patch".to_string()));
        assert!(want.contains(&"virtualmachines/finalizers update".to_string()));
    }

    #[test]
    fn handler_holds_vmis_and_their_status_only() {
        assert_eq!(
            grants(&handler_rules(), GROUP),
            [
                "virtualmachineinstances get",
                "virtualmachineinstances list",
                "virtualmachineinstances watch",
                "virtualmachineinstances/status get",
                "virtualmachineinstances/status patch",
                "virtualmachineinstances/status update",
            ]
        );
    }

    #[test]
    fn handler_touches_no_node() {
        assert!(
            grants(&handler_rules(), "")
                .iter()
                .all(|g| !g.starts_with("nodes"))
        );
    }

    #[test]
    fn handler_pods_carry_the_label_virt_apiserver_selects() {
        let ds = handler_daemonset(&Params::default());
        let labels = ds
            .spec
            .and_then(|s| s.template.metadata)
            .and_then(|m| m.labels)
            .unwrap_or_default();
        assert_eq!(
            labels.get("kubevirt.io").map(String::as_str),
            Some("virt-handler")
        );
    }

    /// Every container's mounts name volumes of its pod (kube-apiserver refuses the
    /// workload otherwise, and the operator's rollout stalls on it).
    fn mounts_name_volumes(what: &str, spec: &PodSpec) {
        let volumes: Vec<&str> = spec
            .volumes
            .iter()
            .flatten()
            .map(|v| v.name.as_str())
            .collect();
        for c in spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
        {
            for m in c.volume_mounts.iter().flatten() {
                assert!(
                    volumes.contains(&m.name.as_str()),
                    "{what}: container {} mounts {:?}, not a volume of the pod {volumes:?}",
                    c.name,
                    m.name
                );
            }
        }
    }

    fn handler_pod(p: &Params) -> PodSpec {
        handler_daemonset(p)
            .spec
            .and_then(|s| s.template.spec)
            .unwrap_or_default()
    }

    #[test]
    fn workloads_mount_only_their_own_volumes() {
        let p = Params::default();
        mounts_name_volumes("virt-handler", &handler_pod(&p));
        let dep = controller_deployment(&p)
            .spec
            .and_then(|s| s.template.spec)
            .unwrap_or_default();
        mounts_name_volumes("virt-controller", &dep);
    }

    /// virt-handler's pod: the QEMU capabilities come from its own init container with the
    /// launcher image, unprivileged; nothing of a launcher is on a host path any more.
    #[test]
    fn handler_probes_qemu_capabilities_unprivileged_and_holds_no_launcher_host_path() {
        let p = Params::default();
        let spec = handler_pod(&p);
        let init = spec.init_containers.clone().unwrap_or_default();
        assert_eq!(init.len(), 1);
        assert_eq!(init[0].image.as_deref(), Some(p.launcher_image.as_str()));
        let sc = init[0].security_context.clone().unwrap_or_default();
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(sc.privileged, None);
        assert!(spec.volumes.iter().flatten().all(|v| v.host_path.is_none()));
        assert!(
            spec.containers[0]
                .args
                .iter()
                .flatten()
                .any(|a| a.starts_with("--qemu-capabilities="))
        );
    }
}
