//! The operator's own install (`manifests/virt-operator.yaml`): Namespace, the KubeVirt CRD,
//! least-privilege RBAC and the operator Deployment; plus an example KubeVirt resource and,
//! for reference, what the operator deploys. `virt-operator gen-manifests` and `cargo xtask
//! gen-manifests` write them; a test fails when manifests/ is stale.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EnvVar, Namespace, PodSecurityContext, PodSpec, PodTemplateSpec,
    SeccompProfile, ServiceAccount,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

use kubevirt_api::catalogue;

use crate::kubevirt;
use crate::render::{self, NAMESPACE, Result, monitoring, part_of_labels};

pub const OPERATOR: &str = "virt-operator";
pub const DEFAULT_OPERATOR_IMAGE: &str = "localhost/kubevirt-rs/virt-operator:latest";
/// Default registry of the component images (`<registry>/<component>:<tag>`).
pub const DEFAULT_REGISTRY: &str = "localhost/kubevirt-rs";
/// The tag of the images an operator built from this tree deploys by default.
pub const DEFAULT_TAG: &str = "latest";
pub const METRICS_PORT: i32 = 8080;

/// Operator install file, relative to the workspace root.
pub const INSTALL_MANIFEST: &str = "manifests/virt-operator.yaml";
/// Example KubeVirt resource.
pub const CR_MANIFEST: &str = "manifests/kubevirt-cr.yaml";
/// What the operator deploys (default images, etcd host placeholder).
pub const REFERENCE_MANIFEST: &str = "manifests/reference/operator-deploys.yaml";

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: namespace.map(str::to_string),
        labels: Some(part_of_labels(OPERATOR)),
        ..ObjectMeta::default()
    }
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> PolicyRule {
    let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(s(groups)),
        resources: Some(s(resources)),
        verbs: s(verbs),
        ..PolicyRule::default()
    }
}

/// A rule on kinds of our API group, named from the catalogue.
fn kind_rule(resources: Vec<String>, verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![render::GROUP.into()]),
        resources: Some(resources),
        verbs: verbs.iter().map(|s| s.to_string()).collect(),
        ..PolicyRule::default()
    }
}

const ALL: &[&str] = &[
    "get", "list", "watch", "create", "update", "patch", "delete",
];

/// Cluster-wide: only the cluster-scoped kinds it owns, plus reading VMs for the uninstall
/// check. `bind`/`escalate` on RBAC kinds let it grant the components their rules (and bind
/// system:auth-delegator) without holding every one of those permissions itself.
fn cluster_rules() -> Vec<PolicyRule> {
    // Uninstalling counts and, by uninstallStrategy, deletes the workloads (in their groups).
    let workloads = render::rules_by_group(
        crate::kubevirt::WORKLOADS,
        "",
        &["get", "list", "delete", "deletecollection"],
    );
    // CDIConfig `config`: created once, its status (the upload proxy's URL and CA) written.
    let cdi_config = kubevirt_api::kinds::cdi_config::KIND.plural;
    let cdi_config_status = format!("{cdi_config}/status");
    let mut rules = vec![
        rule(
            &[kubevirt_api::cdi::GROUP],
            &[cdi_config],
            &["get", "list", "watch", "create"],
        ),
        rule(
            &[kubevirt_api::cdi::GROUP],
            &[cdi_config_status.as_str()],
            &["get", "update", "patch"],
        ),
        rule(&["apiregistration.k8s.io"], &["apiservices"], ALL),
        rule(
            &["admissionregistration.k8s.io"],
            &["validatingwebhookconfigurations"],
            ALL,
        ),
        rule(
            &["rbac.authorization.k8s.io"],
            &["clusterroles", "clusterrolebindings"],
            &[ALL, &["bind", "escalate"]].concat(),
        ),
        rule(
            &["storage.k8s.io"],
            &["storageclasses"],
            &["get", "list", "watch"],
        ),
        rule(&[""], &["namespaces"], &["get", "list", "watch"]),
        // Without a default StorageClass etcd keeps its data on one node: which nodes exist.
        // An etcd member moves off a node being drained: which nodes are cordoned, as it
        // happens (etcd_evacuation).
        rule(&[""], &["nodes"], &["get", "list", "watch"]),
        // The KubeVirt CRD's uid: it owns the cluster-scoped objects (steps::owned_by_crd).
        // The prometheus-operator's CRDs: whether a ServiceMonitor and PrometheusRule can be
        // made (monitoring.rs). CDI's DataVolume CRD: whether CDI owns cdi.kubevirt.io
        // (cdi.rs).
        PolicyRule {
            resource_names: Some(vec![
                kubevirt_api::kubevirt::CRD_NAME.into(),
                monitoring::SERVICE_MONITOR_CRD.into(),
                monitoring::PROMETHEUS_RULE_CRD.into(),
                crate::cdi::DATAVOLUME_CRD.into(),
            ]),
            ..rule(
                &["apiextensions.k8s.io"],
                &["customresourcedefinitions"],
                &["get"],
            )
        },
        // Where Prometheus runs: its ServiceAccount, in the namespace the KubeVirt resource
        // names or a usual one (monitoring.rs), and the ServiceMonitor there.
        rule(&[""], &["serviceaccounts"], &["get"]),
        rule(
            &[monitoring::MONITORING_GROUP],
            &["servicemonitors"],
            &["get", "list", "create", "update", "patch", "delete"],
        ),
        // KubeVirt's common-instancetypes bundle (instancetypes.rs): it lists both cluster
        // kinds and applies and deletes its own objects of them.
        PolicyRule {
            api_groups: Some(vec![kubevirt_api::instancetype::GROUP.into()]),
            resources: Some(render::resources(
                [
                    &kubevirt_api::kinds::cluster_instancetype::KIND,
                    &kubevirt_api::kinds::cluster_preference::KIND,
                ],
                "",
            )),
            verbs: ["get", "list", "watch", "create", "patch", "delete"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            ..PolicyRule::default()
        },
        // The signer of virt-handler certificates (signer.rs): it reads the requests, approves
        // or denies them, and writes the certificate, for its own signer name only.
        rule(
            &["certificates.k8s.io"],
            &["certificatesigningrequests"],
            &["get", "list", "watch"],
        ),
        rule(
            &["certificates.k8s.io"],
            &[
                "certificatesigningrequests/approval",
                "certificatesigningrequests/status",
            ],
            &["update", "patch"],
        ),
        PolicyRule {
            resource_names: Some(vec![virt_certs::node_identity::SIGNER_NAME.into()]),
            ..rule(&["certificates.k8s.io"], &["signers"], &["approve", "sign"])
        },
    ];
    rules.extend(workloads);
    rules
}

/// In its namespace: everything it deploys there, its KubeVirt resource, its Lease.
fn namespace_rules() -> Vec<PolicyRule> {
    vec![
        kind_rule(
            render::resources([&catalogue::KUBEVIRT], ""),
            &["get", "list", "watch", "update", "patch"],
        ),
        kind_rule(
            [
                render::resources([&catalogue::KUBEVIRT], "/status"),
                render::resources([&catalogue::KUBEVIRT], "/finalizers"),
            ]
            .concat(),
            &["get", "update", "patch"],
        ),
        rule(
            &["apps"],
            &["deployments", "daemonsets", "statefulsets"],
            ALL,
        ),
        rule(
            &[""],
            &[
                "services",
                "secrets",
                "configmaps",
                "serviceaccounts",
                "persistentvolumeclaims",
            ],
            ALL,
        ),
        rule(&[""], &["pods"], &["get", "list", "watch"]),
        // An etcd member moved off a drained node: its pod goes (etcd_evacuation), and says
        // what the operator does about it.
        PolicyRule {
            resource_names: Some(
                (0..render::etcd::MAX_MEMBERS)
                    .map(render::etcd::member_name)
                    .collect(),
            ),
            ..rule(&[""], &["pods"], &["patch", "delete"])
        },
        rule(&["policy"], &["poddisruptionbudgets"], ALL),
        // KubeVirt's recording rules and alerts (monitoring.rs).
        rule(
            &[monitoring::MONITORING_GROUP],
            &["prometheusrules"],
            &["get", "list", "create", "update", "patch", "delete"],
        ),
        rule(
            &["rbac.authorization.k8s.io"],
            &["roles", "rolebindings"],
            &[ALL, &["bind", "escalate"]].concat(),
        ),
        rule(
            &["coordination.k8s.io"],
            &["leases"],
            &["get", "list", "watch", "create", "update", "patch"],
        ),
        rule(
            &["", "events.k8s.io"],
            &["events"],
            &["create", "update", "patch"],
        ),
    ]
}

fn role_ref(kind: &str, name: &str) -> k8s_openapi::api::rbac::v1::RoleRef {
    k8s_openapi::api::rbac::v1::RoleRef {
        api_group: "rbac.authorization.k8s.io".into(),
        kind: kind.into(),
        name: name.into(),
    }
}

fn subject() -> k8s_openapi::api::rbac::v1::Subject {
    k8s_openapi::api::rbac::v1::Subject {
        kind: "ServiceAccount".into(),
        name: OPERATOR.into(),
        namespace: Some(NAMESPACE.into()),
        ..Default::default()
    }
}

fn env(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..EnvVar::default()
    }
}

/// Component image `<registry>/<component>:<tag>`.
pub fn image(registry: &str, component: &str, tag: &str) -> String {
    format!("{registry}/{component}:{tag}")
}

/// What the operator Deployment of an install manifest runs.
#[derive(Debug, Clone)]
pub struct OperatorImage<'a> {
    /// The operator's own image.
    pub image: &'a str,
    /// The tag of the component images it deploys unless the KubeVirt resource names one.
    pub tag: &'a str,
    /// The version it reports for that tag (its own crate version if `None`).
    pub version: Option<&'a str>,
}

fn deployment(op: &OperatorImage<'_>) -> Deployment {
    let selector = BTreeMap::from([("app.kubernetes.io/name".to_string(), OPERATOR.to_string())]);
    let mut labels = part_of_labels(OPERATOR);
    labels.insert(kubevirt_api::COMPONENT_LABEL.into(), OPERATOR.into());
    // Behind kubevirt-prometheus-metrics, as KubeVirt's virt-operator: its /metrics is on the
    // port named `metrics`.
    labels.extend([render::monitoring::pod_label()]);
    let field = |name: &str, path: &str| EnvVar {
        name: name.into(),
        value_from: Some(k8s_openapi::api::core::v1::EnvVarSource {
            field_ref: Some(k8s_openapi::api::core::v1::ObjectFieldSelector {
                field_path: path.into(),
                api_version: None,
            }),
            ..Default::default()
        }),
        ..EnvVar::default()
    };
    let container = Container {
        name: OPERATOR.into(),
        image: Some(op.image.into()),
        image_pull_policy: Some("IfNotPresent".into()),
        args: Some(vec!["run".into()]),
        env: Some(
            [
                field("POD_NAME", "metadata.name"),
                field("POD_NAMESPACE", "metadata.namespace"),
                env("VIRT_OPERATOR_IMAGE_REGISTRY", DEFAULT_REGISTRY),
                env("VIRT_OPERATOR_IMAGE_TAG", op.tag),
            ]
            .into_iter()
            .chain(op.version.map(|v| env("VIRT_OPERATOR_VERSION", v)))
            .collect(),
        ),
        ports: Some(vec![ContainerPort {
            name: Some("metrics".into()),
            container_port: METRICS_PORT,
            ..ContainerPort::default()
        }]),
        liveness_probe: Some(render::liveness_probe("/healthz", "metrics", "HTTP")),
        readiness_probe: Some(render::http_probe("/readyz", "metrics", "HTTP", 2, 3)),
        resources: Some(k8s_openapi::api::core::v1::ResourceRequirements {
            requests: Some(BTreeMap::from([
                (
                    "cpu".into(),
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity("10m".into()),
                ),
                (
                    "memory".into(),
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity("32Mi".into()),
                ),
            ])),
            ..Default::default()
        }),
        security_context: Some(k8s_openapi::api::core::v1::SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(k8s_openapi::api::core::v1::Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Container::default()
    };
    Deployment {
        metadata: meta(OPERATOR, Some(NAMESPACE)),
        spec: Some(DeploymentSpec {
            // Two replicas, one leader (Lease), as virt-controller.
            replicas: Some(2),
            selector: LabelSelector {
                match_labels: Some(selector),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(OPERATOR.into()),
                    enable_service_links: Some(false),
                    termination_grace_period_seconds: Some(10),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        run_as_user: Some(65532),
                        run_as_group: Some(65532),
                        seccomp_profile: Some(SeccompProfile {
                            type_: "RuntimeDefault".into(),
                            ..SeccompProfile::default()
                        }),
                        ..PodSecurityContext::default()
                    }),
                    // The operator must run wherever the control plane may: tolerate
                    // control-plane taints.
                    tolerations: Some(vec![k8s_openapi::api::core::v1::Toleration {
                        key: Some("node-role.kubernetes.io/control-plane".into()),
                        operator: Some("Exists".into()),
                        effect: Some("NoSchedule".into()),
                        ..Default::default()
                    }]),
                    containers: vec![container],
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        }),
        ..Deployment::default()
    }
}

/// `manifests/virt-operator.yaml`.
pub fn install_manifest(operator_image: &str) -> Result<String> {
    install_manifest_for(&OperatorImage {
        image: operator_image,
        tag: DEFAULT_TAG,
        version: None,
    })
}

/// The install manifest for an operator of the given image, deploying component images of the
/// given tag (`cargo xtask deploy`: the content-hash tag of the images it just built).
pub fn install_manifest_for(op: &OperatorImage<'_>) -> Result<String> {
    let mut out = String::from(
        "# Generated by `virt-operator gen-manifests` (controllers/operator/src/install.rs); do not edit.\n\
         # Installs virt-operator; then apply a KubeVirt resource (manifests/kubevirt-cr.yaml).\n\
         # See docs/deploy.md.\n",
    );
    render::push_doc(
        &mut out,
        &Namespace {
            metadata: ObjectMeta {
                name: Some(NAMESPACE.into()),
                labels: Some(part_of_labels(OPERATOR)),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        },
    )?;
    render::push_doc(&mut out, &kubevirt::crd())?;
    render::push_doc(
        &mut out,
        &ServiceAccount {
            metadata: meta(OPERATOR, Some(NAMESPACE)),
            ..ServiceAccount::default()
        },
    )?;
    render::push_doc(
        &mut out,
        &ClusterRole {
            metadata: meta(OPERATOR, None),
            rules: Some(cluster_rules()),
            aggregation_rule: None,
        },
    )?;
    render::push_doc(
        &mut out,
        &ClusterRoleBinding {
            metadata: meta(OPERATOR, None),
            role_ref: role_ref("ClusterRole", OPERATOR),
            subjects: Some(vec![subject()]),
        },
    )?;
    render::push_doc(
        &mut out,
        &Role {
            metadata: meta(OPERATOR, Some(NAMESPACE)),
            rules: Some(namespace_rules()),
        },
    )?;
    render::push_doc(
        &mut out,
        &RoleBinding {
            metadata: meta(OPERATOR, Some(NAMESPACE)),
            role_ref: role_ref("Role", OPERATOR),
            subjects: Some(vec![subject()]),
        },
    )?;
    // kube-system: read the cluster's CAs, and bind virt-apiserver to the same reader role.
    render::push_doc(
        &mut out,
        &Role {
            metadata: meta(OPERATOR, Some("kube-system")),
            rules: Some(vec![
                PolicyRule {
                    resource_names: Some(vec!["extension-apiserver-authentication".into()]),
                    ..rule(&[""], &["configmaps"], &["get", "list", "watch"])
                },
                rule(
                    &["rbac.authorization.k8s.io"],
                    &["rolebindings"],
                    &[ALL, &["bind"]].concat(),
                ),
                PolicyRule {
                    resource_names: Some(vec!["extension-apiserver-authentication-reader".into()]),
                    ..rule(&["rbac.authorization.k8s.io"], &["roles"], &["bind"])
                },
            ]),
        },
    )?;
    render::push_doc(
        &mut out,
        &RoleBinding {
            metadata: meta(OPERATOR, Some("kube-system")),
            role_ref: role_ref("Role", OPERATOR),
            subjects: Some(vec![subject()]),
        },
    )?;
    render::push_doc(&mut out, &deployment(op))?;
    Ok(out)
}

/// `manifests/kubevirt-cr.yaml`: the KubeVirt resource of a default install.
pub fn example_cr() -> Result<String> {
    let kv = serde_json::json!({
        "apiVersion": kubevirt::API_VERSION,
        "kind": "KubeVirt",
        "metadata": {"name": "kubevirt", "namespace": NAMESPACE},
        "spec": {
            "configuration": {
                "developerConfiguration": {"useEmulation": true, "featureGates": []}
            },
            "uninstallStrategy": kubevirt::BLOCK_UNINSTALL,
        },
    });
    let mut out = String::from(
        "# Generated by `virt-operator gen-manifests`; do not edit. A KubeVirt resource: apply it\n\
         # after manifests/virt-operator.yaml. useEmulation: VMs may run on QEMU's TCG where KVM\n\
         # is missing (nested virtualisation, kind).\n",
    );
    render::push_doc(&mut out, &kv)?;
    Ok(out)
}

/// What the operator deploys for the default KubeVirt resource, with `ETCD_SERVICE_IP` in place
/// of the etcd Service's cluster IP; per-cluster Secrets, ConfigMap and APIServices are not
/// shown (their caBundle and keys are generated in the cluster).
pub fn reference_manifest() -> Result<String> {
    let p = render::Params {
        etcd: render::EtcdMode::StatefulSet(render::etcd::EtcdParams {
            host: "ETCD_SERVICE_IP".into(),
            ..Default::default()
        }),
        ..render::Params::default()
    };
    Ok(format!(
        "# Generated by `virt-operator gen-manifests`; do not edit. For reference only: what\n\
         # virt-operator applies for manifests/kubevirt-cr.yaml, besides the per-cluster Secrets\n\
         # (serving, etcd and virt-handler certificates), the ConfigMap with the cluster's CAs\n\
         # and both APIServices.\n{}",
        render::static_manifest(&p)?
    ))
}

/// Every generated file: (path relative to the workspace root, content).
pub fn all_manifests() -> Result<Vec<(&'static str, String)>> {
    Ok(vec![
        (INSTALL_MANIFEST, install_manifest(DEFAULT_OPERATOR_IMAGE)?),
        (CR_MANIFEST, example_cr()?),
        (REFERENCE_MANIFEST, reference_manifest()?),
    ])
}

/// Writes [`all_manifests`] under `root`.
pub fn write_manifests(root: &std::path::Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    let files = all_manifests().map_err(std::io::Error::other)?;
    let mut written = Vec::new();
    for (rel, text) in files {
        let path = root.join(rel);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&path, text)?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn manifests_directory_is_current() {
        let root = crate::workspace_root();
        for (rel, text) in all_manifests().unwrap() {
            let committed = std::fs::read_to_string(root.join(rel)).unwrap_or_default();
            assert!(
                committed == text,
                "{rel} is stale: run `cargo xtask gen-manifests` (or `virt-operator gen-manifests`)"
            );
        }
    }

    /// The operator's grants on kubevirt.io, written out.
    #[test]
    fn operator_holds_its_kubevirt_resource_and_the_workloads_it_removes() {
        use crate::render::grants;
        assert_eq!(
            grants(&cluster_rules(), render::GROUP),
            [
                "virtualmachineinstancereplicasets delete",
                "virtualmachineinstancereplicasets deletecollection",
                "virtualmachineinstancereplicasets get",
                "virtualmachineinstancereplicasets list",
                "virtualmachineinstances delete",
                "virtualmachineinstances deletecollection",
                "virtualmachineinstances get",
                "virtualmachineinstances list",
                "virtualmachines delete",
                "virtualmachines deletecollection",
                "virtualmachines get",
                "virtualmachines list",
            ]
        );
        // …and pools, in their group.
        assert_eq!(
            grants(&cluster_rules(), kubevirt_api::pool::GROUP),
            [
                "virtualmachinepools delete",
                "virtualmachinepools deletecollection",
                "virtualmachinepools get",
                "virtualmachinepools list",
            ]
        );
        assert_eq!(
            grants(&namespace_rules(), render::GROUP),
            [
                "kubevirts get",
                "kubevirts list",
                "kubevirts patch",
                "kubevirts update",
                "kubevirts watch",
                "kubevirts/finalizers get",
                "kubevirts/finalizers patch",
                "kubevirts/finalizers update",
                "kubevirts/status get",
                "kubevirts/status patch",
                "kubevirts/status update",
            ]
        );
        let crd = cluster_rules()
            .into_iter()
            .find(|r| r.resource_names.is_some())
            .and_then(|r| r.resource_names);
        // Its own CRD, and whether the prometheus-operator's and CDI's exist: no other CRD.
        assert_eq!(
            crd,
            Some(vec![
                "kubevirts.kubevirt.io".to_string(),
                "servicemonitors.monitoring.coreos.com".to_string(),
                "prometheusrules.monitoring.coreos.com".to_string(),
                "datavolumes.cdi.kubevirt.io".to_string(),
            ])
        );
    }

    #[test]
    fn install_ships_exactly_one_crd_not_at_v1() {
        let text = install_manifest(DEFAULT_OPERATOR_IMAGE).unwrap();
        let docs: Vec<serde_json::Value> = text
            .split("---\n")
            .filter(|d| !d.trim().is_empty() && !d.trim_start().starts_with('#'))
            .map(|d| serde_saphyr::from_str(d).unwrap())
            .collect();
        let crds: Vec<&serde_json::Value> = docs
            .iter()
            .filter(|d| d["kind"] == "CustomResourceDefinition")
            .collect();
        assert_eq!(crds.len(), 1);
        assert_eq!(crds[0]["metadata"]["name"], "kubevirts.kubevirt.io");
        // v1 of kubevirt.io belongs to virt-apiserver's APIService.
        let versions = crds[0]["spec"]["versions"].as_array().unwrap();
        assert!(versions.iter().all(|v| v["name"] != "v1"));
        // No wildcard permission anywhere.
        assert!(!text.contains("'*'") && !text.contains("\"*\""));
    }
}
