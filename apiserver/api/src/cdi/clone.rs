//! Clone sources: the claims a DataVolume (`spec.source.pvc`) or a VM's dataVolumeTemplates
//! copy. Admission reads them twice: to refuse what kubevirt-rs cannot carry out yet (a
//! source in another namespace, [`cross_namespace_errors`]) and, in virt-apiserver, to ask
//! kube-apiserver whether the requesting user may read the source (CDI's rule, below).
//!
//! CDI's rule (its `authorize_utils.go`): the user may clone claim `ns/name` if a
//! SubjectAccessReview allows `create` on `datavolumes/source` (group `cdi.kubevirt.io`,
//! name = the claim) in `ns`, or else `create` on `pods` in `ns` — whoever can create a pod
//! there can mount the claim and read it anyway. CDI skips the review within one namespace;
//! kubevirt-rs asks it there too, since its clone worker is exactly such a pod mounting the
//! source, made on the user's behalf ([`SOURCE_RESOURCE_ATTRIBUTES`]).

use serde_json::Value;

use crate::validation::FieldError;

/// The subresource whose `create` grants cloning a claim (CDI's
/// `DataVolumeCloneSourceSubresource`).
pub const SOURCE_SUBRESOURCE: &str = "source";

/// The two reviews that allow a clone of a claim in its namespace, in the order CDI asks
/// them: (verb, group, resource, subresource).
pub const SOURCE_RESOURCE_ATTRIBUTES: [(&str, &str, &str, &str); 2] = [
    ("create", super::GROUP, "datavolumes", SOURCE_SUBRESOURCE),
    ("create", "", "pods", ""),
];

/// One claim an object clones.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CloneSource {
    /// The claim's namespace (the cloning object's when the spec leaves it out).
    pub namespace: String,
    /// The claim's name.
    pub name: String,
    /// Where the object names it: `spec.source.pvc`, or
    /// `spec.dataVolumeTemplates[0].spec.source.pvc`.
    pub field: String,
    /// Whether the spec names the namespace (the field to blame for a wrong one).
    pub namespace_written: bool,
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// The claim the DataVolume spec `spec` clones, if its source is `pvc`.
fn spec_source(spec: &Value, namespace: &str, field: &str) -> Option<CloneSource> {
    let pvc = spec.pointer("/source/pvc")?;
    let written = str_at(pvc, "/namespace");
    Some(CloneSource {
        namespace: written.unwrap_or(namespace).to_string(),
        name: str_at(pvc, "/name").unwrap_or_default().to_string(),
        field: format!("{field}.source.pvc"),
        namespace_written: written.is_some(),
    })
}

/// Every claim `obj` (a `kind` object: DataVolume or VirtualMachine) clones.
pub fn clone_sources(kind: &str, obj: &Value) -> Vec<CloneSource> {
    let namespace = str_at(obj, "/metadata/namespace").unwrap_or_default();
    match kind {
        "DataVolume" => obj
            .get("spec")
            .and_then(|s| spec_source(s, namespace, "spec"))
            .into_iter()
            .collect(),
        "VirtualMachine" => obj
            .pointer("/spec/dataVolumeTemplates")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
            .filter_map(|(i, t)| {
                // A template lives in the VM's namespace (its admission says so).
                t.get("spec").and_then(|s| {
                    spec_source(s, namespace, &format!("spec.dataVolumeTemplates[{i}].spec"))
                })
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// The claims `new` clones that `old` did not (all of them on create): what a write asks
/// to copy anew, so an update that keeps its templates is not reviewed again.
pub fn new_clone_sources(kind: &str, old: Option<&Value>, new: &Value) -> Vec<CloneSource> {
    let before = old.map(|o| clone_sources(kind, o)).unwrap_or_default();
    clone_sources(kind, new)
        .into_iter()
        .filter(|s| {
            !before
                .iter()
                .any(|b| b.namespace == s.namespace && b.name == s.name)
        })
        .filter(|s| !s.name.is_empty())
        .collect()
}

/// A clone from another namespace needs a worker on each side (claims are namespaced: no
/// pod mounts both) and the upload path between them, which kubevirt-rs does not have yet:
/// refused at admission, naming the field, instead of a DataVolume that never progresses.
pub fn cross_namespace_errors(kind: &str, old: Option<&Value>, new: &Value) -> Vec<FieldError> {
    let namespace = str_at(new, "/metadata/namespace").unwrap_or_default();
    new_clone_sources(kind, old, new)
        .into_iter()
        .filter(|s| !namespace.is_empty() && s.namespace != namespace)
        .map(|s| {
            FieldError::invalid(
                format!("{}.namespace", s.field),
                &s.namespace,
                &format!(
                    "cross-namespace clones are not supported by kubevirt-rs yet: the source \
                     claim must be in namespace {namespace}, the DataVolume's"
                ),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    fn dv(source: Value) -> Value {
        json!({"metadata": {"name": "d", "namespace": "ns1"},
               "spec": {"source": source, "storage": {}}})
    }

    fn vm(templates: Value) -> Value {
        json!({"metadata": {"name": "v", "namespace": "ns1"},
               "spec": {"dataVolumeTemplates": templates}})
    }

    #[test]
    fn a_data_volume_clones_its_pvc_source_in_its_namespace_by_default() {
        assert_eq!(
            clone_sources("DataVolume", &dv(json!({"pvc": {"name": "golden"}}))),
            [CloneSource {
                namespace: "ns1".into(),
                name: "golden".into(),
                field: "spec.source.pvc".into(),
                namespace_written: false,
            }]
        );
        let other = clone_sources(
            "DataVolume",
            &dv(json!({"pvc": {"name": "golden", "namespace": "images"}})),
        );
        assert_eq!(
            (other[0].namespace.as_str(), other[0].namespace_written),
            ("images", true)
        );
        assert!(clone_sources("DataVolume", &dv(json!({"blank": {}}))).is_empty());
        assert!(
            clone_sources("VirtualMachineInstance", &dv(json!({"pvc": {"name": "a"}}))).is_empty()
        );
    }

    #[test]
    fn a_vm_clones_what_its_templates_name_and_an_update_only_what_is_new() {
        let t = |name: &str, source: Value| json!({"metadata": {"name": name}, "spec": {"source": source}});
        let old = vm(json!([
            t("a", json!({"pvc": {"name": "golden"}})),
            t("b", json!({"blank": {}}))
        ]));
        let new = vm(json!([
            t("a", json!({"pvc": {"name": "golden"}})),
            t("b", json!({"blank": {}})),
            t("c", json!({"pvc": {"name": "other", "namespace": "ns1"}}))
        ]));
        let all = clone_sources("VirtualMachine", &new);
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].field, "spec.dataVolumeTemplates[2].spec.source.pvc");
        let fresh = new_clone_sources("VirtualMachine", Some(&old), &new);
        assert_eq!(fresh.len(), 1);
        assert_eq!(
            (fresh[0].namespace.as_str(), fresh[0].name.as_str()),
            ("ns1", "other")
        );
        assert_eq!(new_clone_sources("VirtualMachine", None, &new).len(), 2);
        // A missing name is validation's to report, not a claim to review.
        assert!(new_clone_sources("DataVolume", None, &dv(json!({"pvc": {}}))).is_empty());
    }

    #[test]
    fn another_namespace_is_refused_on_the_namespace_field() {
        let errs = cross_namespace_errors(
            "DataVolume",
            None,
            &dv(json!({"pvc": {"name": "golden", "namespace": "images"}})),
        );
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "spec.source.pvc.namespace");
        assert!(
            errs[0]
                .message
                .contains("cross-namespace clones are not supported"),
            "{}",
            errs[0].message
        );
        // The same namespace, written or not, is fine.
        for source in [
            json!({"pvc": {"name": "golden"}}),
            json!({"pvc": {"name": "golden", "namespace": "ns1"}}),
        ] {
            assert!(cross_namespace_errors("DataVolume", None, &dv(source)).is_empty());
        }
        let errs = cross_namespace_errors(
            "VirtualMachine",
            None,
            &vm(json!([{"metadata": {"name": "a"},
                "spec": {"source": {"pvc": {"name": "g", "namespace": "images"}}}}])),
        );
        assert_eq!(
            errs[0].field,
            "spec.dataVolumeTemplates[0].spec.source.pvc.namespace"
        );
    }
}
