//! KubeVirt's common-instancetypes bundle, deployed as KubeVirt's virt-operator deploys it:
//! every VirtualMachineClusterInstancetype and VirtualMachineClusterPreference of the
//! release (crate `common-instancetypes`, taken from KubeVirt's Go module at build time),
//! labelled as KubeVirt labels them, while `spec.configuration.commonInstancetypesDeployment
//! .enabled` is not false; with `false`, the ones virt-operator deployed are deleted.
//!
//! Only objects carrying virt-operator's label are ever changed or deleted: an object of the
//! same name a user created is left as it is (KubeVirt would overwrite it), and so is any
//! other instance type or preference. Objects are written only when they differ from the
//! bundle's (a reconcile of an up-to-date cluster lists the two kinds and writes nothing).

use std::collections::BTreeMap;

use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
};
use kubevirt_api::catalogue::Kind;
use serde_json::Value;

/// KubeVirt's label of what its operator manages…
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// …with this value.
pub const MANAGED_BY: &str = "virt-operator";
/// KubeVirt's component label.
pub const COMPONENT_LABEL: &str = "app.kubernetes.io/component";
/// Its value (KubeVirt's default `productComponent`).
pub const COMPONENT: &str = "kubevirt";

/// Why the bundle could not be read or deployed.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    /// A document of the bundle does not parse.
    #[error("parsing KubeVirt's {what} bundle: {message}")]
    Parse {
        /// Which bundle.
        what: &'static str,
        /// The parser's error.
        message: String,
    },
    /// The API refused a read or write.
    #[error("{what}: {source}")]
    Kube {
        /// What was done.
        what: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
}

/// One of the two kinds of the bundle and its documents.
#[derive(Debug)]
pub struct Part {
    /// The kind.
    pub kind: &'static Kind,
    /// The objects as virt-operator deploys them (its labels added).
    pub objects: Vec<Value>,
}

fn parse(what: &'static str, yaml: &str) -> Result<Vec<Value>, BundleError> {
    // Documents are separated by `---` lines (a whole line: never inside a block scalar).
    let mut texts = vec![String::new()];
    for line in yaml.lines() {
        if line == "---" {
            texts.push(String::new());
        } else if let Some(cur) = texts.last_mut() {
            cur.push_str(line);
            cur.push('\n');
        }
    }
    let mut docs = Vec::new();
    for doc in &texts {
        if doc
            .lines()
            .all(|l| l.trim().is_empty() || l.starts_with('#'))
        {
            continue;
        }
        let mut v: Value = serde_saphyr::from_str(doc).map_err(|e| BundleError::Parse {
            what,
            message: e.to_string(),
        })?;
        let labels = &mut v["metadata"]["labels"];
        if !labels.is_object() {
            *labels = Value::Object(Default::default());
        }
        labels[MANAGED_BY_LABEL] = Value::String(MANAGED_BY.into());
        labels[COMPONENT_LABEL] = Value::String(COMPONENT.into());
        docs.push(v);
    }
    Ok(docs)
}

/// The bundle as virt-operator deploys it.
pub fn bundle() -> Result<[Part; 2], BundleError> {
    Ok([
        Part {
            kind: &kubevirt_api::kinds::cluster_instancetype::KIND,
            objects: parse(
                "cluster instance types",
                common_instancetypes::CLUSTER_INSTANCETYPES,
            )?,
        },
        Part {
            kind: &kubevirt_api::kinds::cluster_preference::KIND,
            objects: parse(
                "cluster preferences",
                common_instancetypes::CLUSTER_PREFERENCES,
            )?,
        },
    ])
}

/// What to do to one kind's objects.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    /// Objects to apply (absent, or ours and different).
    pub apply: Vec<Value>,
    /// Names of our objects to delete (disabled, or no longer in the bundle).
    pub delete: Vec<String>,
}

fn name(v: &Value) -> &str {
    v.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// Whether virt-operator deployed `existing` (its label).
pub fn ours(existing: &Value) -> bool {
    existing
        .pointer("/metadata/labels")
        .and_then(|l| l.get(MANAGED_BY_LABEL))
        .and_then(Value::as_str)
        == Some(MANAGED_BY)
}

/// `existing` already is `desired`: same spec, and every label and annotation of `desired`.
fn up_to_date(existing: &Value, desired: &Value) -> bool {
    let subset = |field: &str| {
        let have = existing.pointer(&format!("/metadata/{field}"));
        desired
            .pointer(&format!("/metadata/{field}"))
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .all(|(k, v)| have.and_then(|h| h.get(k)) == Some(v))
    };
    existing.get("spec") == desired.get("spec") && subset("labels") && subset("annotations")
}

/// The plan for one kind (pure): `desired` is the bundle's objects, `existing` what the API
/// has of the kind now.
pub fn plan(desired: &[Value], existing: &[Value], enabled: bool) -> Plan {
    let by_name: BTreeMap<&str, &Value> = existing.iter().map(|e| (name(e), e)).collect();
    let mut out = Plan::default();
    if enabled {
        for d in desired {
            match by_name.get(name(d)) {
                None => out.apply.push(d.clone()),
                Some(e) if ours(e) && !up_to_date(e, d) => out.apply.push(d.clone()),
                // A user's own object of that name, or ours and current.
                Some(_) => {}
            }
        }
    }
    out.delete = existing
        .iter()
        .filter(|e| ours(e))
        .filter(|e| e.pointer("/metadata/deletionTimestamp").is_none())
        .filter(|e| !enabled || !desired.iter().any(|d| name(d) == name(e)))
        .map(|e| name(e).to_string())
        .collect();
    out
}

fn api(client: &Client, kind: &Kind) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(kind.group, kind.version, kind.kind),
        kind.plural,
    );
    Api::all_with(client.clone(), &ar)
}

/// Brings the cluster's instance types and preferences to the bundle (`enabled`) or removes
/// what virt-operator deployed (`!enabled`); returns how many objects were written and
/// deleted.
pub async fn sync(
    client: &Client,
    enabled: bool,
    manager: &str,
) -> Result<(usize, usize), BundleError> {
    let mut written = 0;
    let mut deleted = 0;
    for part in bundle()? {
        let api = api(client, part.kind);
        let existing: Vec<Value> = api
            .list(&ListParams::default())
            .await
            .map_err(|source| BundleError::Kube {
                what: format!("listing {}", part.kind.plural),
                source,
            })?
            .items
            .into_iter()
            .filter_map(|o| serde_json::to_value(o).ok())
            .collect();
        let plan = plan(&part.objects, &existing, enabled);
        for obj in &plan.apply {
            let n = name(obj);
            api.patch(
                n,
                &kube::api::PatchParams::apply(manager).force(),
                &Patch::Apply(obj),
            )
            .await
            .map_err(|source| BundleError::Kube {
                what: format!("applying {} {n}", part.kind.kind),
                source,
            })?;
            written += 1;
        }
        for n in &plan.delete {
            match api.delete(n, &DeleteParams::default()).await {
                Ok(_) => deleted += 1,
                Err(kube::Error::Api(s)) if s.is_not_found() => {}
                Err(source) => {
                    return Err(BundleError::Kube {
                        what: format!("deleting {} {n}", part.kind.kind),
                        source,
                    });
                }
            }
        }
    }
    Ok((written, deleted))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn the_bundle_is_kubevirts_labelled_as_kubevirt_labels_it() {
        let [its, prefs] = bundle().unwrap();
        assert!(its.objects.len() > 40 && prefs.objects.len() > 40);
        let nano = its.objects.iter().find(|o| name(o) == "u1.nano").unwrap();
        assert_eq!(nano["kind"], "VirtualMachineClusterInstancetype");
        assert_eq!(nano["spec"]["cpu"]["guest"], 1);
        assert!(ours(nano));
        assert_eq!(
            nano["metadata"]["labels"]["instancetype.kubevirt.io/vendor"], "kubevirt.io",
            "the bundle's own labels are kept"
        );
        for series in ["u1.", "o1.", "cx1.", "m1.", "n1."] {
            assert!(
                its.objects.iter().any(|o| name(o).starts_with(series)),
                "{series}"
            );
        }
        assert!(prefs.objects.iter().any(|o| name(o) == "fedora"));
    }

    fn obj(n: &str, guest: i64, ours_: bool) -> Value {
        let mut v =
            json!({"metadata": {"name": n, "labels": {}}, "spec": {"cpu": {"guest": guest}}});
        if ours_ {
            v["metadata"]["labels"][MANAGED_BY_LABEL] = json!(MANAGED_BY);
        }
        v
    }

    #[test]
    fn only_what_is_missing_or_ours_and_stale_is_written() {
        let desired = vec![obj("a", 1, true), obj("b", 2, true), obj("c", 3, true)];
        let existing = vec![
            obj("a", 1, true),  // current
            obj("b", 1, true),  // ours, stale
            obj("c", 9, false), // the user's own "c"
            obj("old", 1, true),
            obj("mine", 1, false),
        ];
        let p = plan(&desired, &existing, true);
        assert_eq!(p.apply, vec![obj("b", 2, true)]);
        assert_eq!(p.delete, vec!["old".to_string()]);
        let empty = plan(&desired, &[], true);
        assert_eq!(empty.apply.len(), 3);
        let off = plan(&desired, &existing, false);
        assert!(off.apply.is_empty());
        assert_eq!(
            off.delete,
            vec!["a", "b", "old"],
            "the user's c and mine stay"
        );
    }
}
