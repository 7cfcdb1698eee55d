//! Discovery documents, built once at start-up and served from memory (the aggregator's
//! availability probe must never wait on etcd).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Value, json};
use sha2::{Digest, Sha512};

use crate::kinds::ResourceDef;
use kubevirt_api::GROUP;
use kubevirt_api::SUBRESOURCES_GROUP;
use kubevirt_api::catalogue;

const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// A served document with its strong ETag.
#[derive(Debug, Clone)]
pub struct Doc {
    /// Serialized JSON.
    pub body: bytes::Bytes,
    /// Quoted ETag.
    pub etag: String,
}

impl Doc {
    /// Serializes `v` and hashes it.
    pub fn new(v: &Value) -> Self {
        let body = serde_json::to_vec(v).unwrap_or_default();
        let etag = format!("\"{}\"", hex::encode_upper(Sha512::digest(&body)));
        Self {
            body: body.into(),
            etag,
        }
    }
}

/// The documents that list `kubevirts` (forwarded to the KubeVirt CRD, crate::kubevirts):
/// served instead of [`Discovery`]'s own while kube-apiserver serves that CRD.
#[derive(Debug, Clone)]
pub struct WithKubeVirts {
    /// `/apis` APIGroupDiscoveryList v2.
    pub aggregated_v2: Doc,
    /// `/apis` APIGroupDiscoveryList v2beta1.
    pub aggregated_v2beta1: Doc,
    /// `/apis/kubevirt.io/v1`.
    pub resources: Doc,
}

/// All discovery documents.
#[derive(Debug, Clone)]
pub struct Discovery {
    /// `/apis` legacy APIGroupList.
    pub group_list: Doc,
    /// `/apis` APIGroupDiscoveryList v2.
    pub aggregated_v2: Doc,
    /// `/apis` APIGroupDiscoveryList v2beta1.
    pub aggregated_v2beta1: Doc,
    /// `/apis/kubevirt.io`.
    pub group: Doc,
    /// `/apis/kubevirt.io/v1`.
    pub resources: Doc,
    /// `/apis/subresources.kubevirt.io`.
    pub sub_group: Doc,
    /// `/apis/subresources.kubevirt.io/v1`.
    pub sub_resources: Doc,
    /// `/api`.
    pub core_versions: Doc,
    /// The documents listing `kubevirts` too.
    pub with_kubevirts: WithKubeVirts,
    /// Whether kube-apiserver serves the KubeVirt CRD (`kubevirt.io/v1alpha3`), the storage of
    /// `kubevirts` (crate::kubevirts::follow_crd keeps it current). Without it — no operator
    /// install, `cargo xtask deploy`, `--standalone` — `kubevirts` is not advertised: a listed
    /// resource that cannot be listed stalls the garbage collector's and `kubectl get all`.
    pub kubevirts_served: Arc<AtomicBool>,
}

fn group_doc(name: &str) -> Value {
    json!({"kind":"APIGroup","apiVersion":"v1","name":name,
        "versions":[{"groupVersion":format!("{name}/v1"),"version":"v1"}],
        "preferredVersion":{"groupVersion":format!("{name}/v1"),"version":"v1"}})
}

fn resource_list(kubevirts: bool) -> Value {
    let mut resources = Vec::new();
    for r in ResourceDef::all() {
        resources.push(
            json!({"name":r.plural,"singularName":r.singular,"namespaced":r.namespaced,"kind":r.kind,
            "verbs":VERBS,"shortNames":r.short_names,"categories":r.categories}),
        );
        resources.push(
            json!({"name":format!("{}/status",r.plural),"singularName":"","namespaced":true,
            "kind":r.kind,"verbs":["get","patch","update"]}),
        );
    }
    if kubevirts {
        let k = &catalogue::KUBEVIRT;
        resources.push(
            json!({"name":k.plural,"singularName":k.singular,"namespaced":k.namespaced,"kind":k.kind,
            "verbs":VERBS,"shortNames":k.short_names,"categories":k.categories}),
        );
        resources.push(
            json!({"name":format!("{}/status", k.plural),"singularName":"","namespaced":k.namespaced,
            "kind":k.kind,"verbs":["get","patch","update"]}),
        );
    }
    json!({"kind":"APIResourceList","apiVersion":"v1","groupVersion":format!("{GROUP}/v1"),"resources":resources})
}

/// Subresource name → verbs, for subresources.kubevirt.io (from the catalogue).
fn subresource_verbs(r: &ResourceDef) -> Vec<(String, Vec<&'static str>)> {
    r.subresources()
        .map(|s| (s.name.to_string(), vec![s.rbac_verb()]))
        .collect()
}

fn sub_resource_list() -> Value {
    let mut resources = Vec::new();
    for r in ResourceDef::all() {
        for (sub, verbs) in subresource_verbs(r) {
            resources.push(
                json!({"name":format!("{}/{sub}",r.plural),"singularName":"","namespaced":true,
                "kind":r.kind,"verbs":verbs}),
            );
        }
    }
    json!({"kind":"APIResourceList","apiVersion":"v1","groupVersion":format!("{SUBRESOURCES_GROUP}/v1"),"resources":resources})
}

fn aggregated(version: &str, kubevirts: bool) -> Value {
    let kv: Vec<Value> = ResourceDef::all()
        .iter()
        .map(|r| {
            let gvk = json!({"group":GROUP,"version":"v1","kind":r.kind});
            json!({"resource":r.plural,"responseKind":gvk,"scope":"Namespaced","singularResource":r.singular,
                "verbs":VERBS,"shortNames":r.short_names,"categories":r.categories,
                "subresources":[{"subresource":"status","responseKind":gvk,"verbs":["get","patch","update"]}]})
        })
        .chain(kubevirts.then(|| {
            // Forwarded to the v1alpha3 CRD (crate::kubevirts), same verbs as our kinds.
            let k = &catalogue::KUBEVIRT;
            let gvk = json!({"group":GROUP,"version":"v1","kind":k.kind});
            json!({"resource":k.plural,"responseKind":gvk,"scope":"Namespaced","singularResource":k.singular,
                "verbs":VERBS,"shortNames":k.short_names,"categories":k.categories,
                "subresources":[{"subresource":"status","responseKind":gvk,"verbs":["get","patch","update"]}]})
        }))
        .collect();
    let sub: Vec<Value> = ResourceDef::all()
        .iter()
        .filter(|r| !subresource_verbs(r).is_empty())
        .map(|r| {
            let subs: Vec<Value> = subresource_verbs(r)
                .into_iter()
                .map(|(s, verbs)| json!({"subresource":s,"responseKind":{"group":"","version":"","kind":""},"verbs":verbs}))
                .collect();
            json!({"resource":r.plural,"responseKind":{"group":GROUP,"version":"v1","kind":r.kind},"scope":"Namespaced",
                "singularResource":r.singular,"verbs":[],"subresources":subs})
        })
        .collect();
    json!({"kind":"APIGroupDiscoveryList","apiVersion":format!("apidiscovery.k8s.io/{version}"),"metadata":{},
    "items":[
        {"metadata":{"name":GROUP},"versions":[{"version":"v1","freshness":"Current","resources":kv}]},
        {"metadata":{"name":SUBRESOURCES_GROUP},"versions":[{"version":"v1","freshness":"Current","resources":sub}]}
    ]})
}

impl Discovery {
    /// Builds every document.
    pub fn build() -> Self {
        let groups = json!({"kind":"APIGroupList","apiVersion":"v1","groups":[group_doc(GROUP), group_doc(SUBRESOURCES_GROUP)]});
        Self {
            group_list: Doc::new(&groups),
            aggregated_v2: Doc::new(&aggregated("v2", false)),
            aggregated_v2beta1: Doc::new(&aggregated("v2beta1", false)),
            group: Doc::new(&group_doc(GROUP)),
            resources: Doc::new(&resource_list(false)),
            sub_group: Doc::new(&group_doc(SUBRESOURCES_GROUP)),
            sub_resources: Doc::new(&sub_resource_list()),
            core_versions: Doc::new(
                &json!({"kind":"APIVersions","versions":[],"serverAddressByClientCIDRs":[]}),
            ),
            with_kubevirts: WithKubeVirts {
                aggregated_v2: Doc::new(&aggregated("v2", true)),
                aggregated_v2beta1: Doc::new(&aggregated("v2beta1", true)),
                resources: Doc::new(&resource_list(true)),
            },
            kubevirts_served: Arc::new(AtomicBool::new(false)),
        }
    }

    fn kubevirts(&self) -> bool {
        self.kubevirts_served.load(Ordering::Relaxed)
    }

    /// `/apis` APIGroupDiscoveryList v2, as served now.
    pub fn current_aggregated_v2(&self) -> &Doc {
        if self.kubevirts() {
            &self.with_kubevirts.aggregated_v2
        } else {
            &self.aggregated_v2
        }
    }

    /// `/apis` APIGroupDiscoveryList v2beta1, as served now.
    pub fn current_aggregated_v2beta1(&self) -> &Doc {
        if self.kubevirts() {
            &self.with_kubevirts.aggregated_v2beta1
        } else {
            &self.aggregated_v2beta1
        }
    }

    /// `/apis/kubevirt.io/v1`, as served now.
    pub fn current_resources(&self) -> &Doc {
        if self.kubevirts() {
            &self.with_kubevirts.resources
        } else {
            &self.resources
        }
    }
}

/// `/version` document.
pub fn version_info() -> serde_json::Value {
    let v = env!("CARGO_PKG_VERSION");
    let mut parts = v.split('.');
    serde_json::json!({"major": parts.next().unwrap_or("0"), "minor": parts.next().unwrap_or("0"),
        "gitVersion": format!("v{v}"), "gitCommit": option_env!("KUBEVIRT_RS_GIT_COMMIT").unwrap_or(""),
        "gitTreeState": "", "buildDate": "", "goVersion": "", "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, if std::env::consts::ARCH == "x86_64" { "amd64" } else { std::env::consts::ARCH })})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_list_has_short_names_and_status() {
        let v = resource_list(true);
        let names: Vec<&str> = v["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert!(names.contains(&"virtualmachines/status"));
        assert!(names.contains(&"kubevirts") && names.contains(&"kubevirts/status"));
        let without = resource_list(false).to_string();
        assert!(!without.contains("kubevirts"));
        let vm = &v["resources"][0];
        assert_eq!(vm["shortNames"], json!(["vm", "vms"]));
        assert_eq!(vm["categories"], json!(["all"]));
    }

    #[test]
    fn kubevirts_are_advertised_only_while_their_crd_is_served() {
        let d = Discovery::build();
        let has = |doc: &Doc| String::from_utf8_lossy(&doc.body).contains("\"kubevirts\"");
        assert!(!has(d.current_resources()) && !has(d.current_aggregated_v2()));
        d.kubevirts_served.store(true, Ordering::Relaxed);
        assert!(has(d.current_resources()) && has(d.current_aggregated_v2()));
        assert!(has(d.current_aggregated_v2beta1()));
        assert_ne!(d.current_resources().etag, d.resources.etag);
    }

    #[test]
    fn aggregated_lists_subresource_group() {
        let v = aggregated("v2", false);
        assert_eq!(v["items"][1]["metadata"]["name"], json!(SUBRESOURCES_GROUP));
        let vm = &v["items"][1]["versions"][0]["resources"][0];
        let subs: Vec<&str> = vm["subresources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["subresource"].as_str().unwrap())
            .collect();
        assert!(subs.contains(&"start") && subs.contains(&"migrate"));
    }
}
