//! Discovery documents, built once at start-up and served from memory (the aggregator's
//! availability probe must never wait on etcd).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Value, json};
use sha2::{Digest, Sha512};

use crate::kinds::ResourceDef;
use kubevirt_api::catalogue::{self, Kind};
use kubevirt_api::{GROUP, SUBRESOURCES_GROUP, VERSION};

/// The verbs of every kind (what RequestInfo makes of the methods the REST handlers serve).
#[cfg(test)]
pub(crate) const VERBS: [&str; 8] = catalogue::STORED_VERBS;

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
    /// `/apis/<group>` and `/apis/<group>/<version>` of the kinds' other groups
    /// (`instancetype.kubevirt.io`), by path.
    pub other_groups: Vec<(String, Doc)>,
    /// Whether kube-apiserver serves the KubeVirt CRD (`kubevirt.io/v1alpha3`), the storage of
    /// `kubevirts` (crate::kubevirts::follow_crd keeps it current). Without it — no operator
    /// install, `cargo xtask deploy`, `--standalone` — `kubevirts` is not advertised: a listed
    /// resource that cannot be listed stalls the garbage collector's and `kubectl get all`.
    pub kubevirts_served: Arc<AtomicBool>,
}

fn group_doc(name: &str) -> Value {
    group_doc_at(name, VERSION)
}

fn group_doc_at(name: &str, version: &str) -> Value {
    json!({"kind":"APIGroup","apiVersion":"v1","name":name,
        "versions":[{"groupVersion":format!("{name}/{version}"),"version":version}],
        "preferredVersion":{"groupVersion":format!("{name}/{version}"),"version":version}})
}

/// The groups of our kinds other than `kubevirt.io` (which has `kubevirts` besides its
/// stored kinds), with their version.
fn other_kind_groups() -> Vec<(&'static str, &'static str)> {
    catalogue::kind_groups()
        .into_iter()
        .filter(|(g, _)| *g != GROUP)
        .collect()
}

/// The kinds of one group-version: the stored ones and the create-only ones
/// (UploadTokenRequest), each with its own verbs.
fn kinds_of(group: &str, version: &str) -> impl Iterator<Item = &'static Kind> {
    catalogue::all_kinds()
        .filter(|k| k.create_only || ResourceDef::by_plural(k.plural).is_some())
        .filter(move |k| k.group == group && k.version == version)
}

/// The verbs of a `/status` subresource.
pub(crate) const STATUS_VERBS: [&str; 3] = ["get", "patch", "update"];

/// The kinds of `kubevirt.io/v1` as discovery lists them: the stored ones, then `kubevirts`
/// while its CRD is served (forwarded to it, crate::kubevirts, with the same verbs).
fn kinds(kubevirts: bool) -> impl Iterator<Item = &'static Kind> {
    kinds_of(GROUP, VERSION).chain(kubevirts.then_some(&catalogue::KUBEVIRT))
}

fn scope(k: &Kind) -> &'static str {
    if k.namespaced {
        "Namespaced"
    } else {
        "Cluster"
    }
}

fn resource_list(kubevirts: bool) -> Value {
    resource_list_of(GROUP, VERSION, kinds(kubevirts))
}

fn resource_list_of(
    group: &str,
    version: &str,
    kinds: impl Iterator<Item = &'static Kind>,
) -> Value {
    let mut resources = Vec::new();
    for k in kinds {
        resources.push(
            json!({"name":k.plural,"singularName":k.singular,"namespaced":k.namespaced,"kind":k.kind,
            "verbs":k.verbs(),"shortNames":k.short_names,"categories":k.categories}),
        );
        if k.has_status {
            resources.push(
                json!({"name":format!("{}/status", k.plural),"singularName":"","namespaced":k.namespaced,
                "kind":k.kind,"verbs":STATUS_VERBS}),
            );
        }
        if k.has_scale {
            resources.push(
                json!({"name":format!("{}/scale", k.plural),"singularName":"","namespaced":k.namespaced,
                "group":"autoscaling","version":"v1","kind":"Scale","verbs":STATUS_VERBS}),
            );
        }
    }
    json!({"kind":"APIResourceList","apiVersion":"v1","groupVersion":format!("{group}/{version}"),"resources":resources})
}

/// Subresource name → verbs, for subresources.kubevirt.io (from the catalogue).
fn subresource_verbs(k: &Kind) -> Vec<(&'static str, [&'static str; 1])> {
    catalogue::subresources_of(k)
        .map(|s| (s.name, [s.rbac_verb()]))
        .collect()
}

fn sub_resource_list() -> Value {
    let mut resources = Vec::new();
    for k in kinds(false) {
        for (sub, verbs) in subresource_verbs(k) {
            resources.push(
                json!({"name":format!("{}/{sub}", k.plural),"singularName":"","namespaced":k.namespaced,
                "kind":k.kind,"verbs":verbs}),
            );
        }
    }
    resources.push(expand_vm_spec_resource());
    json!({"kind":"APIResourceList","apiVersion":"v1","groupVersion":format!("{SUBRESOURCES_GROUP}/{VERSION}"),"resources":resources})
}

/// `namespaces/{ns}/expand-vm-spec`, listed as KubeVirt's virt-api lists it (a namespaced
/// resource of its own, not a VM's subresource), with the verb RBAC checks on it.
fn expand_vm_spec_resource() -> Value {
    json!({"name":catalogue::EXPAND_VM_SPEC,"singularName":"","namespaced":true,
        "kind":catalogue::VIRTUAL_MACHINE.kind,"verbs":["update"]})
}

/// The aggregated discovery entries of these kinds.
fn aggregated_kinds(kinds: impl Iterator<Item = &'static Kind>) -> Vec<Value> {
    kinds
        .map(|k| {
            let gvk = json!({"group":k.group,"version":k.version,"kind":k.kind});
            // A Scale answers `/scale` (autoscaling/v1), as a CRD's scale subresource.
            let scale = json!({"group":"autoscaling","version":"v1","kind":"Scale"});
            let status: Vec<Value> = k
                .has_status
                .then(|| json!({"subresource":"status","responseKind":gvk,"verbs":STATUS_VERBS}))
                .into_iter()
                .chain(k.has_scale.then(
                    || json!({"subresource":"scale","responseKind":scale,"verbs":STATUS_VERBS}),
                ))
                .collect();
            json!({"resource":k.plural,"responseKind":gvk,"scope":scope(k),"singularResource":k.singular,
                "verbs":k.verbs(),"shortNames":k.short_names,"categories":k.categories,
                "subresources":status})
        })
        .collect()
}

fn aggregated(version: &str, kubevirts: bool) -> Value {
    let kv = aggregated_kinds(kinds(kubevirts));
    let sub: Vec<Value> = kinds(false)
        .filter(|k| !subresource_verbs(k).is_empty())
        .map(|k| {
            let subs: Vec<Value> = subresource_verbs(k)
                .into_iter()
                .map(|(s, verbs)| json!({"subresource":s,"responseKind":{"group":"","version":"","kind":""},"verbs":verbs}))
                .collect();
            json!({"resource":k.plural,"responseKind":{"group":GROUP,"version":VERSION,"kind":k.kind},"scope":scope(k),
                "singularResource":k.singular,"verbs":[],"subresources":subs})
        })
        .chain(std::iter::once(json!({"resource":catalogue::EXPAND_VM_SPEC,
            "responseKind":{"group":GROUP,"version":VERSION,"kind":catalogue::VIRTUAL_MACHINE.kind},
            "scope":"Namespaced","singularResource":"","verbs":["update"]})))
        .collect();
    let mut items = vec![
        json!({"metadata":{"name":GROUP},"versions":[{"version":VERSION,"freshness":"Current","resources":kv}]}),
        json!({"metadata":{"name":SUBRESOURCES_GROUP},"versions":[{"version":VERSION,"freshness":"Current","resources":sub}]}),
    ];
    for (g, v) in other_kind_groups() {
        let resources = aggregated_kinds(kinds_of(g, v));
        items.push(json!({"metadata":{"name":g},"versions":[{"version":v,"freshness":"Current","resources":resources}]}));
    }
    json!({"kind":"APIGroupDiscoveryList","apiVersion":format!("apidiscovery.k8s.io/{version}"),"metadata":{},
    "items":items})
}

impl Discovery {
    /// Builds every document.
    pub fn build() -> Self {
        let mut group_docs = vec![group_doc(GROUP), group_doc(SUBRESOURCES_GROUP)];
        let mut other_groups = Vec::new();
        for (g, v) in other_kind_groups() {
            group_docs.push(group_doc_at(g, v));
            other_groups.push((format!("/apis/{g}"), Doc::new(&group_doc_at(g, v))));
            other_groups.push((
                format!("/apis/{g}/{v}"),
                Doc::new(&resource_list_of(g, v, kinds_of(g, v))),
            ));
        }
        let groups = json!({"kind":"APIGroupList","apiVersion":"v1","groups":group_docs});
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
            other_groups,
            kubevirts_served: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The document of another kind group at `path` (`/apis/<group>[/<version>]`).
    pub fn other_group(&self, path: &str) -> Option<&Doc> {
        self.other_groups
            .iter()
            .find(|(p, _)| p == path)
            .map(|(_, d)| d)
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

    fn strs(v: &Value) -> Vec<&str> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect()
    }

    /// `resource verb scope` lines of a legacy APIResourceList.
    fn legacy_lines(list: &Value) -> Vec<String> {
        let mut out = Vec::new();
        for r in list["resources"].as_array().into_iter().flatten() {
            let scope = if r["namespaced"] == true {
                "Namespaced"
            } else {
                "Cluster"
            };
            for v in strs(&r["verbs"]) {
                out.push(format!("{} {v} {scope}", r["name"].as_str().unwrap_or("")));
            }
        }
        out.sort();
        out
    }

    /// `resource verb scope` lines of one group of an aggregated document (resources
    /// and their subresources).
    fn aggregated_lines(doc: &Value, group: &str) -> Vec<String> {
        let items = doc["items"].as_array().into_iter().flatten();
        let g: Vec<&Value> = items.filter(|g| g["metadata"]["name"] == group).collect();
        assert_eq!(g.len(), 1, "{group} once");
        let mut out = Vec::new();
        for r in g[0]["versions"][0]["resources"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let (name, scope) = (r["resource"].as_str().unwrap_or(""), &r["scope"]);
            let scope = scope.as_str().unwrap_or("");
            for v in strs(&r["verbs"]) {
                out.push(format!("{name} {v} {scope}"));
            }
            for s in r["subresources"].as_array().into_iter().flatten() {
                let sub = s["subresource"].as_str().unwrap_or("");
                for v in strs(&s["verbs"]) {
                    out.push(format!("{name}/{sub} {v} {scope}"));
                }
            }
        }
        out.sort();
        out
    }

    /// Discovery of subresources.kubevirt.io, legacy and aggregated, lists exactly the
    /// catalogue's subresources with the verb RBAC checks: a subresource served but not
    /// discoverable (or advertised but not catalogued, so neither routed nor granted)
    /// fails here. The administrative endpoints stay out (they are no resources).
    #[test]
    fn subresource_discovery_is_exactly_the_catalogue() {
        let mut want: Vec<String> = catalogue::SUBRESOURCES
            .iter()
            .map(|s| format!("{} {} {}", s.resource(), s.rbac_verb(), scope(s.kind)))
            .chain(std::iter::once(format!(
                "{} update Namespaced",
                catalogue::EXPAND_VM_SPEC
            )))
            .collect();
        want.sort();
        assert_eq!(legacy_lines(&sub_resource_list()), want, "APIResourceList");
        for version in ["v2", "v2beta1"] {
            for kubevirts in [false, true] {
                let doc = aggregated(version, kubevirts);
                assert_eq!(
                    aggregated_lines(&doc, SUBRESOURCES_GROUP),
                    want,
                    "{version}, kubevirts {kubevirts}"
                );
            }
        }
        let legacy = sub_resource_list().to_string();
        for e in catalogue::ADMIN_ENDPOINTS {
            assert!(!legacy.contains(&format!("\"{}\"", e.name)), "{}", e.name);
        }
    }

    /// Discovery of kubevirt.io lists the catalogue's stored kinds (and `kubevirts` while its
    /// CRD is served) with every verb, in their scope, and a status subresource where the
    /// catalogue declares one.
    #[test]
    fn kind_discovery_is_exactly_the_catalogue() {
        for kubevirts in [false, true] {
            let kinds = catalogue::stored()
                .filter(|k| k.group == GROUP)
                .chain(kubevirts.then_some(&catalogue::KUBEVIRT));
            let mut want = Vec::new();
            for k in kinds {
                let sc = scope(k);
                want.extend(VERBS.map(|v| format!("{} {v} {sc}", k.plural)));
                if k.has_status {
                    want.extend(STATUS_VERBS.map(|v| format!("{}/status {v} {sc}", k.plural)));
                }
                if k.has_scale {
                    want.extend(STATUS_VERBS.map(|v| format!("{}/scale {v} {sc}", k.plural)));
                }
            }
            want.sort();
            assert_eq!(legacy_lines(&resource_list(kubevirts)), want);
            for version in ["v2", "v2beta1"] {
                let doc = aggregated(version, kubevirts);
                assert_eq!(aggregated_lines(&doc, GROUP), want, "{version}");
            }
        }
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
