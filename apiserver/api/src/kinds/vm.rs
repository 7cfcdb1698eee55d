//! VirtualMachine: a persistent VM definition whose run strategy decides when an instance
//! of it runs.

use serde_json::{Value, json};

use super::{
    Admission, Found, KindStrategy, Reference, Schemas, Target, age, condition_status, decode, ptr,
    schema_of,
};
use crate::catalogue::{AGE, Kind, column};
use crate::instancetype::apply::{
    apply_instancetype, apply_preference, check_requirements, check_spread,
};
use crate::instancetype::{VirtualMachineInstancetypeSpec, VirtualMachinePreferenceSpec};
use crate::policy::{host_disk_gate, reserved_keys};
use crate::validation::FieldError;
use crate::validation::{ErrorType, validate_vmi_spec};
use crate::vm::{VirtualMachine, VirtualMachineSpec, VirtualMachineStatus};
use crate::{defaults, validation};

pub const KIND: Kind = Kind {
    group: crate::GROUP,
    version: crate::VERSION,
    kind: "VirtualMachine",
    list_kind: "VirtualMachineList",
    plural: "virtualmachines",
    singular: "virtualmachine",
    short_names: &["vm", "vms"],
    categories: &["all"],
    namespaced: true,
    has_status: true,
    has_scale: false,
    create_only: false,
    columns: &[
        AGE,
        column("Status", "Human Readable Status", 0),
        column("Ready", "Whether the instance is ready", 0),
        column("Node", "Node the instance runs on", 1),
        column("IP", "First IP address of the instance", 1),
    ],
    description: "VirtualMachine is a persistent virtual machine definition: a template for VirtualMachineInstances and a run strategy deciding when an instance of it runs. Its status mirrors the state of the current instance.",
};

pub static STRATEGY: KindStrategy = KindStrategy {
    meta: &KIND,
    stored: true,
    decode: decode::<VirtualMachine>,
    default: |v| super::with_typed::<VirtualMachine>(v, defaults::default_vm),
    validate: |v| super::validate_with::<VirtualMachine>(v, validate),
    admit,
    references,
    resolve,
    handler_writes: false,
    // NODE and IP come from the VM's annotations written by the controller, because a VM
    // carries no instance state of its own (KubeVirt cannot show them at all).
    cells: |o| {
        vec![
            age(o),
            ptr(o, "/status/printableStatus"),
            condition_status(o, "Ready"),
            ptr(o, "/metadata/annotations/kubevirt.io~1node-name"),
            ptr(o, "/metadata/annotations/kubevirt.io~1ip-address"),
        ]
    },
    selectable: &[("status.printableStatus", "/status/printableStatus")],
    schemas: Schemas {
        spec: schema_of::<VirtualMachineSpec>,
        status: Some(schema_of::<VirtualMachineStatus>),
        spec_required: true,
        example_spec: Some(|| {
            json!({
                // Halted: the example creates a definition, it does not start a guest.
                "runStrategy": "Halted",
                "template": { "spec": super::vmi::example_spec() },
            })
        }),
    },
};

/// The VM's own rules, then KubeVirt's `dataVolumeTemplates` admission.
fn validate(vm: &VirtualMachine) -> Vec<FieldError> {
    let mut errs = validation::validate_vm(vm);
    errs.extend(data_volume_template_errors(vm));
    errs
}

/// KubeVirt's DataVolumeTemplate admission (pkg/storage/admitters/data-volume-template.go),
/// with its messages: each template named, in the VM's namespace, used by a volume of the
/// template (a `dataVolume` volume, or a `persistentVolumeClaim` one naming the DataVolume's
/// claim), and a valid DataVolume spec (CDI's rules, `crate::cdi::validation`). Two templates
/// of one name would be one DataVolume: refused too.
pub(crate) fn data_volume_template_errors(vm: &VirtualMachine) -> Vec<FieldError> {
    let Some(templates) = &vm.spec.data_volume_templates else {
        return Vec::new();
    };
    let volumes = vm
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_deref())
        .unwrap_or_default();
    let vm_namespace = vm.metadata.namespace.as_deref().unwrap_or_default();
    let mut errs = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (i, t) in templates.iter().enumerate() {
        let field = format!("spec.dataVolumeTemplates[{i}]");
        // KubeVirt's messages spell the path `dataVolumeTemplate` (sic); kept, as users
        // search for them.
        let kv_field = format!("spec.dataVolumeTemplate[{i}]");
        let name = t.metadata.name.as_deref().unwrap_or_default();
        if name.is_empty() {
            errs.push(FieldError {
                kind: ErrorType::Required,
                field: format!("{field}.metadata.name"),
                message: format!(
                    "'name' field must not be empty for DataVolumeTemplate entry {kv_field}.name."
                ),
            });
            continue;
        }
        if !seen.insert(name) {
            errs.push(FieldError::duplicate(
                format!("{field}.metadata.name"),
                name,
            ));
        }
        if let Some(ns) = t.metadata.namespace.as_deref().filter(|n| !n.is_empty())
            && !vm_namespace.is_empty()
            && ns != vm_namespace
        {
            errs.push(FieldError {
                kind: ErrorType::Invalid,
                field: format!("{field}.metadata.namespace"),
                message: format!(
                    "Embedded DataVolume namespace {ns} differs from VM namespace {vm_namespace}"
                ),
            });
        }
        errs.extend(crate::cdi::validation::validate_spec(
            &t.spec,
            &format!("{field}.spec"),
        ));
        let referenced = volumes.iter().any(|v| {
            v.data_volume.as_ref().is_some_and(|d| d.name == name)
                || v.persistent_volume_claim
                    .as_ref()
                    .is_some_and(|c| c.claim_name == name)
        });
        if !referenced {
            errs.push(FieldError {
                kind: ErrorType::Required,
                field,
                message: format!(
                    "DataVolumeTemplate entry {kv_field} must be referenced in the VMI template's 'volumes' list"
                ),
            });
        }
    }
    errs
}

/// hostDisk needs its gate; a template may not clone a claim of another namespace (not
/// carried out yet); reserved labels and annotations (also the template's) are the
/// components'.
fn admit(a: &Admission<'_>) -> Vec<FieldError> {
    let old = a.old;
    let new: &Value = a.new;
    let mut errs = host_disk_gate(
        old.and_then(|o| o.pointer("/spec/template/spec")),
        new.pointer("/spec/template/spec"),
        "spec.template.spec",
        a.gates,
    );
    // A template cloning a claim of another namespace: refused as a DataVolume doing so is.
    errs.extend(crate::cdi::clone::cross_namespace_errors(
        KIND.kind, old, new,
    ));
    if !a.actor.may_write_reserved() {
        errs.extend(reserved_keys(
            old.and_then(|o| o.get("metadata")),
            new.get("metadata"),
            "metadata",
        ));
        errs.extend(reserved_keys(
            old.and_then(|o| o.pointer("/spec/template/metadata")),
            new.pointer("/spec/template/metadata"),
            "spec.template.metadata",
        ));
        // virt-controller copies a template's labels and annotations to its DataVolume.
        let count = |v: Option<&Value>| {
            v.and_then(|v| v.pointer("/spec/dataVolumeTemplates"))
                .and_then(Value::as_array)
                .map_or(0, Vec::len)
        };
        for i in 0..count(old).max(count(Some(new))) {
            let pointer = format!("/spec/dataVolumeTemplates/{i}/metadata");
            errs.extend(reserved_keys(
                old.and_then(|o| o.pointer(&pointer)),
                new.pointer(&pointer),
                &format!("spec.dataVolumeTemplates[{i}].metadata"),
            ));
        }
    }
    if let Some(found) = a.found {
        errs.extend(instancetype_errors(new, found));
    }
    errs
}

/// The instance type and preference a VM names (by name; one inferred from a volume is
/// not looked up here): each of the kind its matcher says, the cluster-wide one by default.
fn references(vm: &Value) -> Vec<Reference> {
    let namespace = vm
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let mut out = Vec::new();
    for (pointer, namespaced, cluster) in [
        (
            "/spec/instancetype",
            &super::instancetype::STRATEGY,
            &super::cluster_instancetype::STRATEGY,
        ),
        (
            "/spec/preference",
            &super::preference::STRATEGY,
            &super::cluster_preference::STRATEGY,
        ),
    ] {
        let Some(m) = vm.pointer(pointer) else {
            continue;
        };
        if let Some(claim) = inferred_claim(vm, m) {
            out.push(Reference {
                target: Target::Claim,
                namespace: namespace.to_string(),
                name: claim,
            });
            continue;
        }
        let Some(name) = m
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
        else {
            continue;
        };
        let kind = m.get("kind").and_then(Value::as_str).unwrap_or_default();
        let kind = if is_kind(kind, namespaced) {
            namespaced
        } else if kind.is_empty() || is_kind(kind, cluster) {
            cluster
        } else {
            // An unknown kind: validation names it.
            continue;
        };
        out.push(Reference {
            target: Target::Kind(kind),
            namespace: if kind.namespaced {
                namespace.to_string()
            } else {
                String::new()
            },
            name: name.to_string(),
        });
    }
    out
}

/// The volume a matcher infers from (`inferFromVolume`), as JSON.
fn inferred_volume<'a>(vm: &'a Value, matcher: &Value) -> Option<(&'a Value, String)> {
    let volume = matcher
        .get("inferFromVolume")
        .and_then(Value::as_str)
        .filter(|v| !v.is_empty())?;
    let found = vm
        .pointer("/spec/template/spec/volumes")
        .and_then(Value::as_array)
        .and_then(|vs| {
            vs.iter()
                .find(|v| v.get("name").and_then(Value::as_str) == Some(volume))
        });
    found.map(|v| (v, volume.to_string()))
}

/// The claim whose labels name what a matcher infers: a `persistentVolumeClaim` volume's
/// claim, or a `dataVolume` volume's (CDI names a DataVolume's claim after it; KubeVirt reads
/// that claim when no DataVolume object answers, and kubevirt-rs has none).
fn inferred_claim(vm: &Value, matcher: &Value) -> Option<String> {
    let (volume, _) = inferred_volume(vm, matcher)?;
    volume
        .pointer("/persistentVolumeClaim/claimName")
        .or_else(|| volume.pointer("/dataVolume/name"))
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// KubeVirt's label naming a volume's default instance type.
pub const DEFAULT_INSTANCETYPE_LABEL: &str = "instancetype.kubevirt.io/default-instancetype";
/// …and its kind.
pub const DEFAULT_INSTANCETYPE_KIND_LABEL: &str =
    "instancetype.kubevirt.io/default-instancetype-kind";
/// KubeVirt's label naming a volume's default preference.
pub const DEFAULT_PREFERENCE_LABEL: &str = "instancetype.kubevirt.io/default-preference";
/// …and its kind.
pub const DEFAULT_PREFERENCE_KIND_LABEL: &str = "instancetype.kubevirt.io/default-preference-kind";

/// KubeVirt's inference (its VM mutating webhook, on create): a matcher with
/// `inferFromVolume` becomes `{name, kind}` from the labels of the volume's claim. A failure
/// KubeVirt calls ignorable (an unsupported volume type, a claim without the label) drops
/// the matcher under `inferFromVolumeFailurePolicy: Ignore` and refuses the VM otherwise;
/// a missing volume or claim always refuses it. Each error names the matcher's field.
fn resolve(vm: &mut Value, found: &[Found]) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for (key, label, kind_label, default_kind) in [
        (
            "instancetype",
            DEFAULT_INSTANCETYPE_LABEL,
            DEFAULT_INSTANCETYPE_KIND_LABEL,
            "VirtualMachineClusterInstancetype",
        ),
        (
            "preference",
            DEFAULT_PREFERENCE_LABEL,
            DEFAULT_PREFERENCE_KIND_LABEL,
            "VirtualMachineClusterPreference",
        ),
    ] {
        let Some(m) = vm.pointer(&format!("/spec/{key}")).cloned() else {
            continue;
        };
        let Some(volume) = m
            .get("inferFromVolume")
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
        else {
            continue;
        };
        // A name or kind beside inferFromVolume is refused by validation (KubeVirt checks
        // the matcher before it infers).
        let set = |f: &str| {
            m.get(f)
                .and_then(Value::as_str)
                .is_some_and(|v| !v.is_empty())
        };
        if set("name") || set("kind") {
            continue;
        }
        let ignore = m
            .get("inferFromVolumeFailurePolicy")
            .and_then(Value::as_str)
            == Some("Ignore");
        let field = format!("spec.{key}.inferFromVolume");
        // Ok(name, kind), Err((ignorable, message)).
        let outcome: Result<(String, Option<String>), (bool, String)> =
            match inferred_volume(vm, &m) {
                None => Err((
                    false,
                    format!("unable to find volume {volume} to infer defaults"),
                )),
                Some(_) => match inferred_claim(vm, &m) {
                    None => Err((
                        true,
                        format!(
                            "unable to infer defaults from volume {volume} as type is not supported"
                        ),
                    )),
                    Some(claim) => {
                        let object = found
                            .iter()
                            .find(|f| {
                                f.reference.target == Target::Claim && f.reference.name == claim
                            })
                            .and_then(|f| f.object.as_ref());
                        match object {
                            None => {
                                Err((false, format!("persistentvolumeclaims {claim:?} not found")))
                            }
                            Some(pvc) => {
                                let labels = pvc.pointer("/metadata/labels");
                                let get = |l: &str| {
                                    labels
                                        .and_then(|ls| ls.get(l))
                                        .and_then(Value::as_str)
                                        .map(str::to_string)
                                };
                                match get(label) {
                                    Some(name) => {
                                        Ok((name, get(kind_label).filter(|k| !k.is_empty())))
                                    }
                                    None => Err((
                                        true,
                                        format!(
                                            "unable to find required {label} label on the volume"
                                        ),
                                    )),
                                }
                            }
                        }
                    }
                },
            };
        let Some(spec) = vm.get_mut("spec").and_then(Value::as_object_mut) else {
            continue;
        };
        match outcome {
            Ok((name, kind)) => {
                spec.insert(
                    key.into(),
                    json!({"name": name, "kind": kind.unwrap_or_else(|| default_kind.to_string())}),
                );
                // KubeVirt: a VM that may fall back to its own size (Ignore) carries a
                // memory of its own, which an inferred instance type would conflict with.
                if ignore
                    && key == "instancetype"
                    && let Some(domain) = spec
                        .get_mut("template")
                        .and_then(|t| t.get_mut("spec"))
                        .and_then(|t| t.get_mut("domain"))
                        .and_then(Value::as_object_mut)
                {
                    domain.remove("memory");
                }
            }
            Err((true, _)) if ignore => {
                spec.remove(key);
            }
            Err((_, message)) => errs.push(FieldError {
                kind: ErrorType::Invalid,
                field,
                message,
            }),
        }
    }
    errs
}

/// KubeVirt accepts a matcher's kind as the kind, or its singular or plural resource name,
/// in any case.
fn is_kind(kind: &str, s: &KindStrategy) -> bool {
    kind.eq_ignore_ascii_case(s.kind) || kind.eq_ignore_ascii_case(s.plural)
}

/// What the VM's instance type and preference refuse (KubeVirt's VM admission): a missing
/// one, a VM field the instance type owns, an instance type whose vCPUs the preference
/// cannot lay out, a template invalid once both are applied, unmet preference requirements.
fn instancetype_errors(new: &Value, found: &[Found]) -> Vec<FieldError> {
    let Ok(vm) = serde_json::from_value::<VirtualMachine>(new.clone()) else {
        return Vec::new();
    };
    let mut errs = Vec::new();
    let mut spec_of = |field: &str, group: &[&KindStrategy]| -> Option<Value> {
        let f = found
            .iter()
            .find(|f| f.reference.kind().is_some_and(|k| group.contains(&k)))?;
        match &f.object {
            Some(o) => o.get("spec").cloned(),
            None => {
                errs.push(FieldError {
                    kind: ErrorType::NotFound,
                    field: format!("{field}.name"),
                    message: match f.reference.kind() {
                        Some(k) => {
                            format!("{}.{} {:?} not found", k.plural, k.group, f.reference.name)
                        }
                        None => format!("{:?} not found", f.reference.name),
                    },
                });
                None
            }
        }
    };
    let it = spec_of(
        "spec.instancetype",
        &[
            &super::instancetype::STRATEGY,
            &super::cluster_instancetype::STRATEGY,
        ],
    )
    .and_then(|s| serde_json::from_value::<VirtualMachineInstancetypeSpec>(s).ok());
    let pref = spec_of(
        "spec.preference",
        &[
            &super::preference::STRATEGY,
            &super::cluster_preference::STRATEGY,
        ],
    )
    .and_then(|s| serde_json::from_value::<VirtualMachinePreferenceSpec>(s).ok());
    if !errs.is_empty() || (it.is_none() && pref.is_none()) {
        return errs;
    }
    if let Some(e) = it.as_ref().and_then(|it| check_spread(it, pref.as_ref())) {
        return vec![e];
    }
    let mut spec = vm.spec.template.spec.clone().unwrap_or_default();
    let mut annotations = vm
        .spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.clone())
        .unwrap_or_default();
    if let Some(it) = &it {
        let conflicts = apply_instancetype(
            "spec.template.spec",
            it,
            pref.as_ref(),
            &mut spec,
            &mut annotations,
        );
        if !conflicts.is_empty() {
            return conflicts;
        }
        // The template is valid once the instance type is applied (its memory, say).
        errs.extend(validate_vmi_spec(&spec, "spec.template.spec"));
    }
    if let Some(p) = &pref {
        apply_preference(p, &mut spec, &mut annotations);
        errs.extend(check_requirements(it.as_ref(), p, &spec));
    }
    errs
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A VM with these dataVolumeTemplates and these template volumes, through decode,
    /// defaulting and validation.
    fn errors(templates: Value, volumes: Value) -> Vec<FieldError> {
        let vm = json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "vm1", "namespace": "ns1"},
            "spec": {"runStrategy": "Halted", "dataVolumeTemplates": templates,
                "template": {"spec": {"domain": {"devices": {}, "resources": {"requests": {"memory": "64Mi"}}},
                    "volumes": volumes}}}});
        let (mut v, unknown) = (STRATEGY.decode)(&vm).unwrap();
        assert!(unknown.is_empty(), "{unknown:?}");
        (STRATEGY.default)(&mut v);
        (STRATEGY.validate)(&v)
    }

    fn template(name: &str) -> Value {
        json!({"metadata": {"name": name},
            "spec": {"source": {"http": {"url": "https://example.org/disk.qcow2"}},
                "storage": {"resources": {"requests": {"storage": "1Gi"}}}}})
    }

    fn dv_volume(name: &str) -> Value {
        json!({"name": "root", "dataVolume": {"name": name}})
    }

    #[test]
    fn templates_used_by_a_volume_are_accepted() {
        // KubeVirt's docs' form, with the deprecated TypeMeta and an empty status.
        let mut t = template("disk1");
        t["apiVersion"] = json!("cdi.kubevirt.io/v1beta1");
        t["kind"] = json!("DataVolume");
        t["status"] = json!({});
        t["metadata"]["labels"] = json!({"app": "x"});
        t["metadata"]["namespace"] = json!("ns1");
        assert_eq!(errors(json!([t]), json!([dv_volume("disk1")])), vec![]);
        // A persistentVolumeClaim volume naming the DataVolume's claim counts too.
        assert_eq!(
            errors(
                json!([template("d2")]),
                json!([{"name": "root", "persistentVolumeClaim": {"claimName": "d2"}}])
            ),
            vec![]
        );
    }

    #[test]
    fn an_unreferenced_template_is_refused_in_kubevirts_words() {
        let errs = errors(json!([template("disk1")]), json!([dv_volume("other")]));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].field, "spec.dataVolumeTemplates[0]");
        assert_eq!(
            errs[0].message,
            "DataVolumeTemplate entry spec.dataVolumeTemplate[0] must be referenced in the VMI template's 'volumes' list"
        );
    }

    #[test]
    fn name_namespace_duplicates_and_the_spec_are_checked() {
        let mut unnamed = template("x");
        unnamed["metadata"] = json!({});
        let errs = errors(json!([unnamed]), json!([dv_volume("x")]));
        assert_eq!(errs[0].field, "spec.dataVolumeTemplates[0].metadata.name");
        assert!(errs[0].message.contains("'name' field must not be empty"));

        let mut elsewhere = template("d");
        elsewhere["metadata"]["namespace"] = json!("other");
        let errs = errors(json!([elsewhere]), json!([dv_volume("d")]));
        assert_eq!(
            errs[0].field,
            "spec.dataVolumeTemplates[0].metadata.namespace"
        );
        assert_eq!(
            errs[0].message,
            "Embedded DataVolume namespace other differs from VM namespace ns1"
        );

        let errs = errors(
            json!([template("d"), template("d")]),
            json!([dv_volume("d")]),
        );
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].field, "spec.dataVolumeTemplates[1].metadata.name");

        let mut bad = template("d");
        bad["spec"] = json!({"source": {"s3": {"url": "https://b/x"}}});
        let errs = errors(json!([bad]), json!([dv_volume("d")]));
        let fields: Vec<&str> = errs.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "spec.dataVolumeTemplates[0].spec.storage",
                "spec.dataVolumeTemplates[0].spec.source.s3"
            ]
        );
    }

    #[test]
    fn template_metadata_keys_are_reserved_as_the_vms() {
        let mut t = template("d");
        t["metadata"]["labels"] = json!({"kubevirt.io/created-by": "forged"});
        let vm = json!({"metadata": {"name": "vm1", "namespace": "ns1"},
            "spec": {"dataVolumeTemplates": [t], "template": {}}});
        let errs = admit(&Admission {
            old: None,
            new: &vm,
            actor: &crate::policy::Actor::User,
            gates: &crate::policy::FeatureGates::default(),
            found: None,
        });
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            errs[0]
                .field
                .starts_with("spec.dataVolumeTemplates[0].metadata.labels"),
            "{errs:?}"
        );
    }

    #[test]
    fn a_template_cloning_from_another_namespace_is_refused() {
        let mut t = template("d");
        t["spec"] = json!({"source": {"pvc": {"namespace": "images", "name": "golden"}},
            "storage": {}});
        let vm = json!({"metadata": {"name": "vm1", "namespace": "ns1"},
            "spec": {"dataVolumeTemplates": [t], "template": {}}});
        let admitted = |vm: &Value| {
            admit(&Admission {
                old: None,
                new: vm,
                actor: &crate::policy::Actor::Component,
                gates: &crate::policy::FeatureGates::default(),
                found: None,
            })
        };
        let errs = admitted(&vm);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(
            errs[0].field,
            "spec.dataVolumeTemplates[0].spec.source.pvc.namespace"
        );
        let mut same = vm.clone();
        same["spec"]["dataVolumeTemplates"][0]["spec"]["source"]["pvc"]["namespace"] = json!("ns1");
        assert_eq!(admitted(&same), vec![]);
    }
}
