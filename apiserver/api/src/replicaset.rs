//! VirtualMachineInstanceReplicaSet (`kubevirt.io/v1`): keeps `replicas` ephemeral VMIs
//! made from one template running, as KubeVirt's. Types with KubeVirt's JSON, defaulting
//! and validation (pure).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use crate::common::Condition;
use crate::validation::{FieldError, validate_vmi_spec};
use crate::vm::VirtualMachineInstanceTemplateSpec;

/// What a replica set keeps running.
#[skip_serializing_none]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "kubevirt.io",
    version = "v1",
    kind = "VirtualMachineInstanceReplicaSet",
    plural = "virtualmachineinstancereplicasets",
    singular = "virtualmachineinstancereplicaset",
    shortname = "vmirs",
    shortname = "vmirss",
    category = "all",
    namespaced,
    status = "VirtualMachineInstanceReplicaSetStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceReplicaSetSpec {
    /// How many VMIs should run; 1 when unset.
    pub replicas: Option<i32>,
    /// Selects the VMIs this replica set owns; must select the template's labels.
    pub selector: Option<LabelSelector>,
    /// The VMIs made (`<name><random suffix>`).
    pub template: Option<VirtualMachineInstanceTemplateSpec>,
    /// Holds the controller back: no VMI is created or deleted while set.
    pub paused: Option<bool>,
}

/// What the controller observed.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceReplicaSetStatus {
    /// VMIs owned and not final or deleted.
    pub replicas: Option<i32>,
    /// Of those, the ready ones.
    pub ready_replicas: Option<i32>,
    /// `ReplicaFailure`, `ReplicaPaused`.
    pub conditions: Option<Vec<Condition>>,
    /// The selector as a string, for the `/scale` subresource (an HPA reads it).
    pub label_selector: Option<String>,
}

impl VirtualMachineInstanceReplicaSetSpec {
    /// `replicas`, 1 when unset.
    pub fn desired(&self) -> i32 {
        self.replicas.unwrap_or(1)
    }

    /// Whether `paused` is set.
    pub fn is_paused(&self) -> bool {
        self.paused.unwrap_or(false)
    }
}

/// KubeVirt's replica set admission: a template, a selector that selects its labels, no
/// negative count, and a valid VMI spec (checked with the VMI's defaults applied, as the
/// VMIs will be).
pub fn validate(rs: &VirtualMachineInstanceReplicaSet) -> Vec<FieldError> {
    let spec = &rs.spec;
    let labels = spec
        .template
        .as_ref()
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.labels.as_ref());
    let mut errs = Vec::new();
    match spec.template.as_ref().and_then(|t| t.spec.as_ref()) {
        None => errs.push(FieldError::required(
            "spec.template",
            "missing virtual machine template.",
        )),
        Some(vmi) => {
            let mut vmi = vmi.clone();
            crate::defaults::default_vmi_spec(&mut vmi, "");
            errs.extend(validate_vmi_spec(&vmi, "spec.template.spec"));
        }
    }
    errs.extend(crate::replicas::validate(
        spec.replicas,
        spec.selector.as_ref(),
        labels,
    ));
    errs
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    pub(crate) fn rs(spec: serde_json::Value) -> VirtualMachineInstanceReplicaSet {
        serde_json::from_value(json!({"apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstanceReplicaSet", "metadata": {"name": "r"}, "spec": spec}))
        .unwrap()
    }

    #[test]
    fn kubevirts_json_round_trips() {
        let r = rs(json!({"replicas": 2, "paused": true,
            "selector": {"matchLabels": {"app": "a"}},
            "template": {"metadata": {"labels": {"app": "a"}},
                "spec": {"domain": {"devices": {}, "resources": {"requests": {"memory": "64Mi"}}}}}}));
        assert!(validate(&r).is_empty(), "{:?}", validate(&r));
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["spec"]["replicas"], 2);
        assert_eq!(v["spec"]["paused"], true);
        assert_eq!(r.spec.desired(), 2);
    }

    #[test]
    fn a_selector_not_matching_the_template_names_spec_selector() {
        let r = rs(
            json!({"replicas": -1, "selector": {"matchLabels": {"app": "b"}},
            "template": {"metadata": {"labels": {"app": "a"}},
                "spec": {"domain": {"devices": {}, "resources": {"requests": {"memory": "64Mi"}}}}}}),
        );
        let fields: Vec<_> = validate(&r).into_iter().map(|e| e.field).collect();
        assert_eq!(fields, ["spec.replicas", "spec.selector"]);
    }
}
