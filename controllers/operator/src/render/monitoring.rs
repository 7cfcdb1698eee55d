//! KubeVirt's monitoring objects: the `kubevirt-prometheus-metrics` Service (always), and, on a
//! cluster with the prometheus-operator, the ServiceMonitor, the PrometheusRule and the Role
//! that lets Prometheus read the endpoints — named, labelled and placed as KubeVirt's
//! virt-operator does (`pkg/virt-operator/resource/generate/components/prometheus.go`,
//! `deployments.go` `NewPrometheusService`, `rbac/servicemonitor.go`, `install/strategy.go`).
//!
//! One difference: kubevirt-rs' components serve `/metrics` over plain HTTP (KubeVirt's over
//! HTTPS on 8443), so the ServiceMonitor scrapes with `scheme: http` and no TLS settings.
//!
//! The PrometheusRule's spec is KubeVirt's own, generated at build time by running KubeVirt's
//! rule code (build.rs, `promrules/`), never retyped.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::json;

use super::{NAMESPACE, RenderError, Result};

/// The headless Service over every pod that serves KubeVirt metrics.
pub const SERVICE: &str = "kubevirt-prometheus-metrics";
/// The label that puts a pod behind [`SERVICE`] (and the ServiceMonitor selects the Service by).
pub const PROMETHEUS_LABEL: &str = "prometheus.kubevirt.io";
pub const PROMETHEUS_LABEL_VALUE: &str = "true";
/// KubeVirt names both the PrometheusRule and the ServiceMonitor so.
pub const RULE_NAME: &str = "prometheus-kubevirt-rules";
/// The Role and RoleBinding that let the monitoring ServiceAccount read the endpoints.
pub const RBAC_NAME: &str = "kubevirt-monitoring";
/// Where KubeVirt looks for Prometheus when `spec.monitorNamespace` is unset, in this order:
/// OpenShift's, then kube-prometheus'.
pub const DEFAULT_MONITOR_NAMESPACES: [&str; 2] = ["openshift-monitoring", "monitoring"];
/// Prometheus' ServiceAccount when `spec.monitorAccount` is unset (KubeVirt's default).
pub const DEFAULT_MONITOR_ACCOUNT: &str = "prometheus-k8s";
/// The prometheus-operator's API.
pub const MONITORING_GROUP: &str = "monitoring.coreos.com";
pub const MONITORING_API_VERSION: &str = "monitoring.coreos.com/v1";
pub const SERVICE_MONITOR_CRD: &str = "servicemonitors.monitoring.coreos.com";
pub const PROMETHEUS_RULE_CRD: &str = "prometheusrules.monitoring.coreos.com";

/// KubeVirt's PrometheusRule as KubeVirt's code builds it for namespace `kubevirt` (build.rs).
const KUBEVIRT_RULE: &str =
    include_str!(concat!(env!("OUT_DIR"), "/prometheus-kubevirt-rules.json"));
/// The `kubevirt.io/kubevirt` version the rules were built from.
pub const RULES_KUBEVIRT_VERSION: &str = env!("KUBEVIRT_RULES_MODULE_VERSION");

/// The labels kubevirt-rs' watches and prunes find its objects by, on top of KubeVirt's.
fn ours(mut labels: BTreeMap<String, String>, name: &str) -> BTreeMap<String, String> {
    labels.extend(super::part_of_labels(name));
    labels
}

fn prometheus_label() -> (String, String) {
    (PROMETHEUS_LABEL.into(), PROMETHEUS_LABEL_VALUE.into())
}

/// `prometheus.kubevirt.io: "true"`, for the pod templates of the components that serve
/// `/metrics` on a port named `metrics`.
pub fn pod_label() -> (String, String) {
    prometheus_label()
}

/// KubeVirt's `kubevirt-prometheus-metrics`: headless, over every pod labelled
/// [`PROMETHEUS_LABEL`], its port `metrics` pointing at each pod's port named `metrics`
/// (virt-controller's 8080, virt-handler's 8187, virt-apiserver's 8188, virt-operator's 8080). The Service's own port
/// number (443, KubeVirt's) is never dialled: a headless Service's endpoints carry the pods'
/// ports, and Prometheus scrapes those.
pub fn prometheus_service() -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(SERVICE.into()),
            namespace: Some(NAMESPACE.into()),
            labels: Some(ours(
                BTreeMap::from([
                    (kubevirt_api::COMPONENT_LABEL.into(), String::new()),
                    prometheus_label(),
                ]),
                SERVICE,
            )),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            selector: Some(BTreeMap::from([prometheus_label()])),
            ports: Some(vec![ServicePort {
                name: Some("metrics".into()),
                port: 443,
                target_port: Some(IntOrString::String("metrics".into())),
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            type_: Some("ClusterIP".into()),
            cluster_ip: Some("None".into()),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// Where Prometheus runs, as KubeVirt finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Monitor {
    /// The namespace of Prometheus' ServiceAccount.
    pub namespace: String,
    /// Prometheus' ServiceAccount.
    pub account: String,
    /// Where the ServiceMonitor goes: `spec.serviceMonitorNamespace`, else [`Self::namespace`].
    pub service_monitor_namespace: String,
}

/// The namespaces to look for Prometheus' ServiceAccount in, in order, and that account:
/// `spec.monitorNamespace` alone when set, else [`DEFAULT_MONITOR_NAMESPACES`];
/// `spec.monitorAccount`, else [`DEFAULT_MONITOR_ACCOUNT`] (KubeVirt's `getMonitorNamespace`).
pub fn monitor_candidates(
    monitor_namespace: Option<&str>,
    monitor_account: Option<&str>,
) -> (Vec<String>, String) {
    let namespaces = match monitor_namespace.filter(|n| !n.is_empty()) {
        Some(ns) => vec![ns.to_string()],
        None => DEFAULT_MONITOR_NAMESPACES.map(str::to_string).to_vec(),
    };
    let account = monitor_account
        .filter(|a| !a.is_empty())
        .unwrap_or(DEFAULT_MONITOR_ACCOUNT)
        .to_string();
    (namespaces, account)
}

/// Which prometheus-operator kinds the cluster serves (their CRDs exist).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MonitoringApis {
    pub service_monitors: bool,
    pub prometheus_rules: bool,
}

/// KubeVirt's ServiceMonitor in `namespace`: it scrapes the `metrics` port of
/// [`SERVICE`] in the install namespace — over HTTP, kubevirt-rs' components serve no TLS
/// there (KubeVirt's: `https` with `insecureSkipVerify`).
pub fn service_monitor(namespace: &str) -> serde_json::Value {
    let labels = ours(
        BTreeMap::from([
            ("openshift.io/cluster-monitoring".into(), String::new()),
            prometheus_label(),
            ("k8s-app".into(), "kubevirt".into()),
        ]),
        RULE_NAME,
    );
    json!({
        "apiVersion": MONITORING_API_VERSION,
        "kind": "ServiceMonitor",
        "metadata": {"name": RULE_NAME, "namespace": namespace, "labels": labels},
        "spec": {
            "selector": {"matchLabels": {PROMETHEUS_LABEL: PROMETHEUS_LABEL_VALUE}},
            "namespaceSelector": {"matchNames": [NAMESPACE]},
            "endpoints": [{"port": "metrics", "scheme": "http", "honorLabels": true}],
        },
    })
}

/// KubeVirt's PrometheusRule `prometheus-kubevirt-rules` in the install namespace: its
/// recording rules and alerts (each alert with its `runbook_url`), as KubeVirt's code builds
/// them, with kubevirt-rs' labels added.
pub fn prometheus_rule() -> Result<serde_json::Value> {
    let mut rule: serde_json::Value = serde_json::from_str(KUBEVIRT_RULE)
        .map_err(|e| RenderError::Yaml(format!("KubeVirt's PrometheusRule: {e}")))?;
    let meta = rule["metadata"]
        .as_object_mut()
        .ok_or_else(|| RenderError::Yaml("KubeVirt's PrometheusRule has no metadata".into()))?;
    // Go's zero time, which server-side apply would try to own.
    meta.remove("creationTimestamp");
    let labels: BTreeMap<String, String> =
        serde_json::from_value(meta.get("labels").cloned().unwrap_or_default()).unwrap_or_default();
    meta.insert("labels".into(), json!(ours(labels, RULE_NAME)));
    for_our_pods(&mut rule);
    Ok(rule)
}

/// KubeVirt's expressions name its API server's pods `virt-api-…` and its container
/// `virt-api`; kubevirt-rs' are `kubevirt-apiserver-…` running container `virt-apiserver`.
/// Without this `kubevirt_virt_api_up` would be 0 on every kubevirt-rs cluster and
/// `VirtAPIDown` and `LowVirtAPICount` would fire forever. Only these selectors change: every
/// rule and alert keeps KubeVirt's name, labels, annotations and runbook.
const OUR_NAMES: [(&str, &str); 3] = [
    ("pod=~'virt-api-.*'", "pod=~'kubevirt-apiserver-.*'"),
    ("pod=~\"virt-api-.*\"", "pod=~\"kubevirt-apiserver-.*\""),
    (
        "virt-controller|virt-api|virt-handler|virt-operator",
        "virt-controller|virt-apiserver|virt-handler|virt-operator",
    ),
];

fn for_our_pods(rule: &mut serde_json::Value) {
    let groups = rule["spec"]["groups"].as_array_mut().into_iter().flatten();
    for r in groups.flat_map(|g| g["rules"].as_array_mut().into_iter().flatten()) {
        if let Some(expr) = r["expr"].as_str() {
            let expr = OUR_NAMES
                .iter()
                .fold(expr.to_string(), |e, (theirs, ours)| {
                    e.replace(theirs, ours)
                });
            r["expr"] = json!(expr);
        }
    }
}

/// The Role and RoleBinding that let Prometheus' ServiceAccount read the install namespace's
/// services, endpoints and pods (KubeVirt's `rbac.GetAllServiceMonitor`).
pub fn monitor_rbac(m: &Monitor) -> (Role, RoleBinding) {
    let meta = || ObjectMeta {
        name: Some(RBAC_NAME.into()),
        namespace: Some(NAMESPACE.into()),
        labels: Some(ours(
            BTreeMap::from([(kubevirt_api::COMPONENT_LABEL.into(), String::new())]),
            RBAC_NAME,
        )),
        ..ObjectMeta::default()
    };
    let role = Role {
        metadata: meta(),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(["services", "endpoints", "pods"].map(String::from).to_vec()),
            verbs: ["get", "list", "watch"].map(String::from).to_vec(),
            ..PolicyRule::default()
        }]),
    };
    let binding = RoleBinding {
        metadata: meta(),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: RBAC_NAME.into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: m.account.clone(),
            namespace: Some(m.namespace.clone()),
            ..Subject::default()
        }]),
    };
    (role, binding)
}

/// What to have besides the Service, KubeVirt's decision: nothing without a Prometheus
/// ServiceAccount found ([`monitor_candidates`]); else the RBAC and ServiceMonitor when the
/// cluster serves ServiceMonitors, the PrometheusRule when it serves PrometheusRules.
pub fn monitoring_objects(
    apis: MonitoringApis,
    monitor: Option<&Monitor>,
) -> Result<Vec<serde_json::Value>> {
    let Some(m) = monitor else {
        return Ok(Vec::new());
    };
    let to_value = |v: serde_json::Result<serde_json::Value>| {
        v.map_err(|e| RenderError::Yaml(format!("monitoring RBAC: {e}")))
    };
    let mut out = Vec::new();
    if apis.service_monitors {
        let (role, binding) = monitor_rbac(m);
        out.push(to_value(serde_json::to_value(&role))?);
        out.push(to_value(serde_json::to_value(&binding))?);
        out.push(service_monitor(&m.service_monitor_namespace));
    }
    if apis.prometheus_rules {
        out.push(prometheus_rule()?);
    }
    Ok(out)
}

#[cfg(test)]
mod our_pods_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// KubeVirt's API server rules count kubevirt-rs' API server pods: no selector of
    /// KubeVirt's pod or container name for it is left, and `kubevirt_virt_api_up` counts ours.
    #[test]
    fn the_api_server_rules_select_our_pods() {
        let rule = prometheus_rule().unwrap();
        let exprs: Vec<(String, String)> = rule["spec"]["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap().iter())
            .map(|r| {
                let name = r["record"].as_str().or(r["alert"].as_str()).unwrap_or("");
                (
                    name.to_string(),
                    r["expr"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect();
        for (name, expr) in &exprs {
            assert!(!expr.contains("virt-api-"), "{name}: {expr}");
            assert!(!expr.contains("|virt-api|"), "{name}: {expr}");
        }
        let up = exprs
            .iter()
            .find(|(n, _)| n == "kubevirt_virt_api_up")
            .expect("kubevirt_virt_api_up");
        assert!(up.1.contains("pod=~'kubevirt-apiserver-.*'"), "{}", up.1);
        assert!(
            exprs.iter().any(|(n, _)| n == "VirtAPIDown"),
            "the alert itself is kept"
        );
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn monitor() -> Monitor {
        Monitor {
            namespace: "monitoring".into(),
            account: "prometheus-k8s".into(),
            service_monitor_namespace: "monitoring".into(),
        }
    }

    #[test]
    fn the_service_is_kubevirts_headless_metrics_service() {
        let s = prometheus_service();
        assert_eq!(
            s.metadata.name.as_deref(),
            Some("kubevirt-prometheus-metrics")
        );
        assert_eq!(s.metadata.namespace.as_deref(), Some(NAMESPACE));
        let labels = s.metadata.labels.unwrap();
        assert_eq!(labels["prometheus.kubevirt.io"], "true");
        assert_eq!(labels["kubevirt.io"], "");
        let spec = s.spec.unwrap();
        assert_eq!(
            spec.selector.unwrap(),
            BTreeMap::from([("prometheus.kubevirt.io".to_string(), "true".to_string())])
        );
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        let ports = spec.ports.unwrap();
        assert_eq!(ports.len(), 1);
        assert_eq!(ports[0].name.as_deref(), Some("metrics"));
        assert_eq!(
            ports[0].target_port,
            Some(IntOrString::String("metrics".into()))
        );
    }

    #[test]
    fn the_service_monitor_scrapes_the_service_over_http() {
        let sm = service_monitor("openshift-monitoring");
        assert_eq!(sm["apiVersion"], "monitoring.coreos.com/v1");
        assert_eq!(sm["kind"], "ServiceMonitor");
        assert_eq!(sm["metadata"]["name"], "prometheus-kubevirt-rules");
        assert_eq!(sm["metadata"]["namespace"], "openshift-monitoring");
        let labels = &sm["metadata"]["labels"];
        assert_eq!(labels["k8s-app"], "kubevirt");
        assert_eq!(labels["prometheus.kubevirt.io"], "true");
        assert_eq!(labels["openshift.io/cluster-monitoring"], "");
        let spec = &sm["spec"];
        assert_eq!(
            spec["selector"]["matchLabels"]["prometheus.kubevirt.io"],
            "true"
        );
        assert_eq!(spec["namespaceSelector"]["matchNames"], json!([NAMESPACE]));
        let ep = &spec["endpoints"][0];
        assert_eq!(ep["port"], "metrics");
        assert_eq!(ep["scheme"], "http");
        assert_eq!(ep["honorLabels"], true);
        assert!(ep.get("tlsConfig").is_none());
    }

    /// (recording rule names, alerts) of the rule.
    fn rules(rule: &serde_json::Value) -> (Vec<String>, Vec<serde_json::Value>) {
        let mut records = Vec::new();
        let mut alerts = Vec::new();
        for g in rule["spec"]["groups"].as_array().unwrap() {
            for r in g["rules"].as_array().unwrap() {
                if let Some(n) = r["record"].as_str() {
                    records.push(n.to_string());
                } else {
                    alerts.push(r.clone());
                }
            }
        }
        (records, alerts)
    }

    #[test]
    fn the_prometheus_rule_is_kubevirts_with_its_recording_rules_and_alerts() {
        let rule = prometheus_rule().unwrap();
        assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
        assert_eq!(rule["kind"], "PrometheusRule");
        assert_eq!(rule["metadata"]["name"], "prometheus-kubevirt-rules");
        // The expressions are written for the install namespace (build.rs builds them so).
        assert_eq!(rule["metadata"]["namespace"], NAMESPACE);
        assert!(rule["metadata"].get("creationTimestamp").is_none());
        let labels = &rule["metadata"]["labels"];
        assert_eq!(labels["prometheus.kubevirt.io"], "true");
        assert_eq!(labels["k8s-app"], "kubevirt");
        let (records, alerts) = rules(&rule);
        for r in ["kubevirt_number_of_vms", "kubevirt_vmi_phase_count"] {
            assert!(records.iter().any(|n| n == r), "{r} missing: {records:?}");
        }
        let names: Vec<&str> = alerts.iter().filter_map(|a| a["alert"].as_str()).collect();
        assert_eq!(names.len(), alerts.len());
        for a in [
            "VMCannotBeEvicted",
            "VirtControllerDown",
            "VirtHandlerRESTErrorsBurst",
        ] {
            assert!(names.contains(&a), "{a} missing: {names:?}");
        }
        for a in &alerts {
            let name = a["alert"].as_str().unwrap();
            assert_eq!(
                a["annotations"]["runbook_url"],
                format!("https://kubevirt.io/monitoring/runbooks/{name}"),
                "{a}"
            );
            assert_eq!(a["labels"]["kubernetes_operator_part_of"], "kubevirt");
            assert!(a["labels"]["severity"].is_string(), "{a}");
        }
        // The control plane's expressions name the install namespace.
        let exprs = rule.to_string();
        assert!(
            exprs.contains(&format!("namespace='{NAMESPACE}'")),
            "{exprs}"
        );
    }

    #[test]
    fn kubevirt_looks_for_prometheus_in_the_named_namespace_or_the_usual_ones() {
        assert_eq!(
            monitor_candidates(None, None),
            (
                vec!["openshift-monitoring".to_string(), "monitoring".to_string()],
                "prometheus-k8s".to_string()
            )
        );
        assert_eq!(
            monitor_candidates(Some("mon"), Some("prom")),
            (vec!["mon".to_string()], "prom".to_string())
        );
        assert_eq!(
            monitor_candidates(Some(""), Some("")),
            monitor_candidates(None, None)
        );
    }

    #[test]
    fn the_monitoring_objects_follow_the_apis_the_cluster_serves() {
        let kinds = |apis, m: Option<&Monitor>| -> Vec<(String, String)> {
            monitoring_objects(apis, m)
                .unwrap()
                .iter()
                .map(|o| {
                    (
                        o["kind"].as_str().unwrap().to_string(),
                        o["metadata"]["namespace"].as_str().unwrap().to_string(),
                    )
                })
                .collect()
        };
        let both = MonitoringApis {
            service_monitors: true,
            prometheus_rules: true,
        };
        // No prometheus-operator: nothing (and no error).
        assert!(kinds(MonitoringApis::default(), Some(&monitor())).is_empty());
        // No Prometheus ServiceAccount found: nothing either, as KubeVirt.
        assert!(kinds(both, None).is_empty());
        let m = Monitor {
            service_monitor_namespace: "elsewhere".into(),
            ..monitor()
        };
        let ns = |s: &str| s.to_string();
        assert_eq!(
            kinds(both, Some(&m)),
            vec![
                (ns("Role"), ns(NAMESPACE)),
                (ns("RoleBinding"), ns(NAMESPACE)),
                (ns("ServiceMonitor"), ns("elsewhere")),
                (ns("PrometheusRule"), ns(NAMESPACE)),
            ]
        );
        let rules_only = MonitoringApis {
            service_monitors: false,
            prometheus_rules: true,
        };
        assert_eq!(
            kinds(rules_only, Some(&m)),
            vec![(ns("PrometheusRule"), ns(NAMESPACE))]
        );
        let objs = monitoring_objects(both, Some(&m)).unwrap();
        assert_eq!(objs[1]["subjects"][0]["name"], "prometheus-k8s");
        assert_eq!(objs[1]["subjects"][0]["namespace"], "monitoring");
        assert_eq!(
            objs[0]["rules"][0]["resources"],
            json!(["services", "endpoints", "pods"])
        );
    }
}
