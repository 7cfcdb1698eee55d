//! What the two replicated kinds (VirtualMachineInstanceReplicaSet, VirtualMachinePool)
//! share: their label selector as a string (`status.labelSelector`, the `/scale`
//! subresource's `status.selector`, which an HPA lists pods by) and KubeVirt's admission
//! checks of replicas and selector. Pure.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};

use crate::validation::FieldError;

/// Condition type set while a replica could not be created or deleted.
pub const REPLICA_FAILURE: &str = "ReplicaFailure";
/// Condition type set while `spec.paused` holds the controller back.
pub const REPLICA_PAUSED: &str = "ReplicaPaused";

/// The selector parsed, or why it does not parse.
pub fn parse_selector(selector: &LabelSelector) -> Result<Selector, String> {
    Selector::try_from(selector.clone()).map_err(|e| e.to_string())
}

/// The selector's string form (`app=x,tier in (a,b)`), as `status.labelSelector` carries it.
pub fn selector_string(selector: &LabelSelector) -> Option<String> {
    parse_selector(selector).ok().map(|s| s.to_string())
}

/// Whether `selector` selects an object with `labels` (false for a selector that does not
/// parse: validation refuses those).
pub fn selects(selector: &LabelSelector, labels: Option<&BTreeMap<String, String>>) -> bool {
    let empty = BTreeMap::new();
    parse_selector(selector).is_ok_and(|s| s.matches(labels.unwrap_or(&empty)))
}

/// KubeVirt's checks, at `spec`: replicas not negative, a selector that parses and selects
/// the template's labels. `template_labels` is `None` when the template is missing (its own
/// error is the caller's).
pub fn validate(
    replicas: Option<i32>,
    selector: Option<&LabelSelector>,
    template_labels: Option<&BTreeMap<String, String>>,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(r) = replicas
        && r < 0
    {
        errs.push(FieldError::invalid(
            "spec.replicas",
            &r.to_string(),
            "must be greater than or equal to 0",
        ));
    }
    match selector {
        None => errs.push(FieldError::required("spec.selector", "")),
        Some(sel) => match parse_selector(sel) {
            Err(e) => errs.push(FieldError::invalid("spec.selector", "", &e)),
            Ok(s) => {
                let empty = BTreeMap::new();
                if !s.matches(template_labels.unwrap_or(&empty)) {
                    errs.push(FieldError::invalid(
                        "spec.selector",
                        &s.to_string(),
                        "selector does not match labels.",
                    ));
                }
            }
        },
    }
    errs
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn sel(v: serde_json::Value) -> LabelSelector {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_selector_must_match_the_template_and_replicas_be_positive() {
        let labels = BTreeMap::from([("app".to_string(), "web".to_string())]);
        let ok = sel(serde_json::json!({"matchLabels": {"app": "web"}}));
        assert!(validate(Some(2), Some(&ok), Some(&labels)).is_empty());
        let other = sel(serde_json::json!({"matchLabels": {"app": "db"}}));
        let errs = validate(Some(-1), Some(&other), Some(&labels));
        assert_eq!(errs.len(), 2);
        assert_eq!(errs[0].field, "spec.replicas");
        assert_eq!(errs[1].field, "spec.selector");
        assert!(errs[1].message.contains("selector does not match labels."));
        assert_eq!(validate(None, None, None)[0].field, "spec.selector");
    }

    #[test]
    fn selector_string_is_the_canonical_form() {
        let s = sel(serde_json::json!({"matchLabels": {"b": "2", "a": "1"},
            "matchExpressions": [{"key": "t", "operator": "In", "values": ["y", "x"]}]}));
        assert_eq!(selector_string(&s).unwrap(), "a=1,b=2,t in (x,y)");
    }
}
