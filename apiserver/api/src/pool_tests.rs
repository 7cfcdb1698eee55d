#![allow(clippy::unwrap_used)]
use super::*;
use serde_json::json;

fn pool(spec: serde_json::Value) -> VirtualMachinePool {
    serde_json::from_value(
        json!({"apiVersion": API_VERSION, "kind": "VirtualMachinePool",
        "metadata": {"name": "p"}, "spec": spec}),
    )
    .unwrap()
}

fn template() -> serde_json::Value {
    json!({"metadata": {"labels": {"app": "p"}}, "spec": {"runStrategy": "Always",
        "dataVolumeTemplates": [{"metadata": {"name": "root"},
            "spec": {"source": {"blank": {}}, "storage": {"resources": {"requests": {"storage": "1Gi"}}}}}],
        "template": {"metadata": {"labels": {"app": "p"}}, "spec": {
            "domain": {"devices": {}, "resources": {"requests": {"memory": "64Mi"}}},
            "volumes": [{"name": "root", "dataVolume": {"name": "root"}},
                {"name": "cm", "configMap": {"name": "cfg"}},
                {"name": "s", "secret": {"secretName": "key"}}]}}}})
}

#[test]
fn kubevirts_json_round_trips_and_validates() {
    let p = pool(
        json!({"replicas": 3, "selector": {"matchLabels": {"app": "p"}},
        "virtualMachineTemplate": template(), "maxUnavailable": "50%",
        "nameGeneration": {"appendIndexToConfigMapRefs": true},
        "scaleInStrategy": {"proactive": {"selectionPolicy": {"sortPolicy": "DescendingOrder"},
            "statePreservation": "Offline"}},
        "updateStrategy": {"opportunistic": {}},
        "autohealing": {"startUpFailureThreshold": 2, "minFailingToStartDuration": "1m"}}),
    );
    assert!(validate(&p).is_empty(), "{:?}", validate(&p));
    let v = serde_json::to_value(&p).unwrap();
    assert_eq!(
        v["spec"]["scaleInStrategy"]["proactive"]["selectionPolicy"]["sortPolicy"],
        "DescendingOrder"
    );
    assert_eq!(v["spec"]["updateStrategy"]["opportunistic"], json!({}));
    assert_eq!(
        p.spec.scale_in(),
        ScaleIn::Proactive(
            VirtualMachinePoolSelectionPolicy {
                sort_policy: Some(SortPolicy::DescendingOrder),
                selectors: None
            },
            StatePreservation::Offline
        )
    );
    assert_eq!(p.spec.update(), Update::Opportunistic);
    assert_eq!(p.spec.max_unavailable(3), 1);
    assert_eq!(p.spec.max_unavailable(4), 2);
}

#[test]
fn defaults_are_kubevirts() {
    let p = pool(
        json!({"selector": {"matchLabels": {"app": "p"}}, "virtualMachineTemplate": template()}),
    );
    assert_eq!(p.spec.desired(), 1);
    assert_eq!(
        p.spec.scale_in(),
        ScaleIn::Proactive(Default::default(), StatePreservation::Disabled)
    );
    assert_eq!(p.spec.update(), Update::Proactive(Default::default()));
    assert_eq!(p.spec.max_unavailable(5), 5);
}

#[test]
fn bad_input_names_the_field() {
    let p = pool(
        json!({"replicas": -2, "selector": {"matchLabels": {"app": "other"}},
        "virtualMachineTemplate": template(), "maxUnavailable": "150%"}),
    );
    let fields: Vec<_> = validate(&p).into_iter().map(|e| e.field).collect();
    assert_eq!(
        fields,
        ["spec.replicas", "spec.selector", "spec.maxUnavailable"]
    );
    let p = pool(json!({"selector": {"matchLabels": {"app": "p"}}}));
    assert_eq!(validate(&p)[0].field, "spec.virtualMachineTemplate");
    let mut t = template();
    t["spec"]["template"]["spec"]["domain"]["resources"] = json!({});
    let p = pool(json!({"selector": {"matchLabels": {"app": "p"}}, "virtualMachineTemplate": t}));
    assert!(
        validate(&p)[0]
            .field
            .starts_with("spec.virtualMachineTemplate.spec.template.spec.domain"),
        "{:?}",
        validate(&p)
    );
}

#[test]
fn the_selector_is_fixed() {
    let a = pool(json!({"selector": {"matchLabels": {"app": "p"}}}));
    let b = pool(json!({"selector": {"matchLabels": {"app": "q"}}}));
    assert_eq!(validate_update(&a, &b)[0].field, "spec.selector");
    assert!(validate_update(&a, &a).is_empty());
}

#[test]
fn each_vm_gets_its_own_data_volumes_and_named_refs() {
    let p = pool(
        json!({"selector": {"matchLabels": {"app": "p"}}, "virtualMachineTemplate": template(),
        "nameGeneration": {"appendIndexToConfigMapRefs": true}}),
    );
    let s = indexed_spec(&p.spec, 4);
    let dvs = s.data_volume_templates.unwrap();
    assert_eq!(dvs[0].metadata.name.as_deref(), Some("root-4"));
    let v = serde_json::to_value(s.template.spec.unwrap().volumes).unwrap();
    assert_eq!(v[0]["dataVolume"]["name"], "root-4");
    assert_eq!(v[1]["configMap"]["name"], "cfg-4");
    assert_eq!(v[2]["secret"]["secretName"], "key");
}

#[test]
fn names_and_ordinals() {
    assert_eq!(vm_name("web", 2), "web-2");
    assert_eq!(ordinal("web", "web-2"), Some(2));
    assert_eq!(ordinal("web", "web-x"), None);
    assert_eq!(ordinal("web", "webby-1"), None);
}
