#![allow(clippy::unwrap_used)]

use kubevirt_api::kubevirt::VmRolloutStrategy::{LiveUpdate, Stage};
use kubevirt_api::{VirtualMachineInstance, VirtualMachineInstanceSpec, VirtualMachineSpec};
use serde_json::{Value, json};

use super::*;

fn vm_spec(template: Value) -> VirtualMachineSpec {
    serde_json::from_value(json!({"runStrategy": "Always", "template": {"spec": template}}))
        .unwrap()
}

fn base() -> Value {
    json!({
        "nodeSelector": {"zone": "a"},
        "domain": {
            "cpu": {"sockets": 1, "cores": 1, "threads": 1},
            "resources": {"requests": {"memory": "128Mi"}},
            "devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]}
        },
        "volumes": [{"name": "root", "containerDisk": {"image": "x"}}]
    })
}

fn vmi(spec: Value, status: Value) -> VirtualMachineInstance {
    serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "v", "namespace": "ns"},
        "spec": spec, "status": status,
    }))
    .unwrap()
}

fn template(v: Value) -> VirtualMachineInstanceSpec {
    serde_json::from_value(v).unwrap()
}

#[test]
fn an_unchanged_template_or_one_changed_only_in_metadata_needs_no_restart() {
    let a = vm_spec(base());
    for s in [Stage, LiveUpdate] {
        assert_eq!(restart_required(&a, &a, s), None);
    }
    let mut b = a.clone();
    b.run_strategy = Some(kubevirt_api::RunStrategy::Manual);
    b.template.metadata = Some(Default::default());
    assert_eq!(restart_required(&a, &b, Stage), None);
}

#[test]
fn hotplugged_volumes_need_no_restart_other_volumes_do() {
    let a = vm_spec(base());
    let mut t = base();
    t["volumes"].as_array_mut().unwrap().push(
        json!({"name": "h", "persistentVolumeClaim": {"claimName": "c", "hotpluggable": true}}),
    );
    t["domain"]["devices"]["disks"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "h", "disk": {"bus": "scsi"}}));
    for s in [Stage, LiveUpdate] {
        assert_eq!(restart_required(&a, &vm_spec(t.clone()), s), None);
        assert_eq!(restart_required(&vm_spec(t.clone()), &a, s), None);
    }
    t["volumes"][1]["persistentVolumeClaim"]["hotpluggable"] = json!(false);
    assert!(restart_required(&a, &vm_spec(t), Stage).is_some());
}

#[test]
fn sockets_named_in_a_template_that_had_no_cpu_block_are_live() {
    // The common VM: no `cpu` at start (one socket), then `cpu.sockets: 2` (found by the e2e).
    let mut t = base();
    t["domain"].as_object_mut().unwrap().remove("cpu");
    let a = vm_spec(t.clone());
    t["domain"]["cpu"] = json!({"sockets": 2});
    let b = vm_spec(t.clone());
    assert_eq!(restart_required(&a, &b, LiveUpdate), None);
    // Anything more in the new block is no live change.
    t["domain"]["cpu"] = json!({"sockets": 2, "cores": 2});
    assert!(restart_required(&a, &vm_spec(t), LiveUpdate).is_some());
    assert!(restart_required(&a, &b, Stage).is_some());
}

#[test]
fn under_stage_every_template_change_needs_a_restart_naming_the_fields() {
    let a = vm_spec(base());
    let mut t = base();
    t["domain"]["cpu"]["sockets"] = json!(2);
    t.as_object_mut().unwrap().remove("nodeSelector");
    let b = vm_spec(t);
    assert_eq!(
        restart_required(&a, &b, Stage).unwrap(),
        "a non-live-updatable field was changed in the template spec: \
         spec.template.spec.domain.cpu.sockets, spec.template.spec.nodeSelector"
    );
}

#[test]
fn under_live_update_placement_and_sockets_are_live_the_rest_is_not() {
    let a = vm_spec(base());
    let mut t = base();
    t["domain"]["cpu"]["sockets"] = json!(2);
    t["nodeSelector"] = json!({"zone": "b"});
    t["tolerations"] = json!([{"key": "k", "operator": "Exists"}]);
    t["affinity"] = json!({"nodeAffinity": {}});
    assert_eq!(restart_required(&a, &vm_spec(t.clone()), LiveUpdate), None);
    t["domain"]["resources"]["requests"]["memory"] = json!("256Mi");
    t["domain"]["devices"]["disks"][0]["disk"]["bus"] = json!("sata");
    assert_eq!(
        restart_required(&a, &vm_spec(t), LiveUpdate).unwrap(),
        "a non-live-updatable field was changed in the template spec: \
         spec.template.spec.domain.devices.disks, \
         spec.template.spec.domain.resources.requests.memory"
    );
}

#[test]
fn another_instance_type_needs_a_restart_its_captured_revision_does_not() {
    let mut a = vm_spec(json!({"domain": {}}));
    a.instancetype = Some(kubevirt_api::vm::Matcher {
        name: Some("u1.small".into()),
        ..Default::default()
    });
    let mut captured = a.clone();
    captured.instancetype.as_mut().unwrap().revision_name = Some("rev".into());
    assert_eq!(restart_required(&a, &captured, LiveUpdate), None);
    let mut other = a.clone();
    other.instancetype.as_mut().unwrap().name = Some("u1.large".into());
    assert!(
        restart_required(&a, &other, LiveUpdate)
            .unwrap()
            .ends_with(": spec.instancetype.name")
    );
}

#[test]
fn revisions_are_named_and_read_back_as_kubevirt_has_them() {
    assert_eq!(revision_name("u-1", 3), "revision-start-vm-u-1-3");
    let spec = vm_spec(base());
    let data = revision_data(&spec).unwrap();
    assert_eq!(data["spec"]["runStrategy"], "Always");
    assert_eq!(spec_of_revision(&data).unwrap(), spec);
}

#[test]
fn max_sockets_defaults_only_under_live_update() {
    let mut spec = template(base());
    LiveUpdateConfig::default().default_max_sockets(&mut spec);
    assert_eq!(spec.domain.cpu.as_ref().unwrap().max_sockets, None);
    let live = LiveUpdateConfig {
        strategy: LiveUpdate,
        ..LiveUpdateConfig::default()
    };
    live.default_max_sockets(&mut spec);
    assert_eq!(spec.domain.cpu.as_ref().unwrap().max_sockets, Some(4));
    // Set by the VM: kept.
    let mut own = template(json!({"domain": {"cpu": {"sockets": 2, "maxSockets": 3}}}));
    live.default_max_sockets(&mut own);
    assert_eq!(own.domain.cpu.unwrap().max_sockets, Some(3));
    // The cluster's maxCpuSockets wins, never below the sockets.
    let capped = LiveUpdateConfig {
        max_cpu_sockets: Some(2),
        max_hotplug_ratio: 8,
        ..live.clone()
    };
    let mut s = template(json!({"domain": {"cpu": {"sockets": 3}}}));
    capped.default_max_sockets(&mut s);
    assert_eq!(s.domain.cpu.unwrap().max_sockets, Some(3));
    // At most 512 vCPUs from the ratio.
    let mut big = template(json!({"domain": {"cpu": {"sockets": 2, "cores": 128}}}));
    live.default_max_sockets(&mut big);
    assert_eq!(big.domain.cpu.unwrap().max_sockets, Some(4));
    // No CPU section: one socket, so four.
    let mut none = template(json!({"domain": {}}));
    live.default_max_sockets(&mut none);
    assert_eq!(none.domain.cpu.unwrap().max_sockets, Some(4));
}

#[test]
fn placement_changes_are_carried_to_the_vmi_removed_ones_as_null() {
    let mut t = base();
    t.as_object_mut().unwrap().remove("nodeSelector");
    t["tolerations"] = json!([{"key": "k", "operator": "Exists", "effect": "NoSchedule"}]);
    let v = vmi(base(), json!({"phase": "Running"}));
    let plan = live_plan(&template(t), &v);
    assert_eq!(plan.restart_required, None);
    assert_eq!(plan.wait, None);
    assert_eq!(
        plan.vmi_spec_patch.unwrap(),
        json!({"spec": {
            "nodeSelector": null,
            "tolerations": [{"key": "k", "operator": "Exists", "effect": "NoSchedule"}]
        }})
    );
    assert_eq!(live_plan(&template(base()), &v), LivePlan::default());
}

#[test]
fn placement_waits_for_a_migration_in_flight() {
    let mut t = base();
    t["nodeSelector"] = json!({"zone": "b"});
    let v = vmi(
        base(),
        json!({"migrationState": {"startTimestamp": "2026-01-01T00:00:00Z"}}),
    );
    let plan = live_plan(&template(t.clone()), &v);
    assert!(plan.wait.is_some());
    assert_eq!(plan.vmi_spec_patch, None);
    let done = vmi(
        base(),
        json!({"migrationState": {"startTimestamp": "2026-01-01T00:00:00Z",
                                  "endTimestamp": "2026-01-01T00:00:10Z"}}),
    );
    assert!(live_plan(&template(t), &done).vmi_spec_patch.is_some());
}

fn with_max(mut spec: Value, max: u32) -> Value {
    spec["domain"]["cpu"]["maxSockets"] = json!(max);
    spec
}

#[test]
fn sockets_raised_within_max_reach_the_vmi_with_their_cpu_requests() {
    let mut t = base();
    t["domain"]["cpu"]["sockets"] = json!(2);
    t["domain"]["resources"]["requests"]["cpu"] = json!("500m");
    let mut running = with_max(base(), 4);
    running["domain"]["resources"]["requests"]["cpu"] = json!("500m");
    let plan = live_plan(&template(t), &vmi(running, json!({})));
    assert_eq!(plan.sockets, Some(2));
    assert_eq!(
        plan.vmi_spec_patch.unwrap(),
        json!({"spec": {"domain": {
            "cpu": {"sockets": 2},
            "resources": {"requests": {"cpu": "1500m"}}
        }}})
    );
}

#[test]
fn sockets_lowered_or_above_max_need_a_restart() {
    let running = vmi(with_max(base(), 2), json!({}));
    let mut t = base();
    t["domain"]["cpu"]["sockets"] = json!(3);
    let plan = live_plan(&template(t.clone()), &running);
    assert_eq!(plan.restart_required.as_deref(), Some(SOCKETS_ABOVE_MAX));
    assert_eq!(plan.vmi_spec_patch, None);
    // No maxSockets (started under Stage): any raise is above it.
    let plain = vmi(base(), json!({}));
    assert_eq!(
        live_plan(&template(t), &plain).restart_required.as_deref(),
        Some(SOCKETS_ABOVE_MAX)
    );
    let mut two = with_max(base(), 4);
    two["domain"]["cpu"]["sockets"] = json!(2);
    assert_eq!(
        live_plan(&template(base()), &vmi(two, json!({})))
            .restart_required
            .as_deref(),
        Some(SOCKETS_REDUCED)
    );
}

#[test]
fn sockets_wait_for_a_hotplug_or_migration_in_flight() {
    let mut t = base();
    t["domain"]["cpu"]["sockets"] = json!(2);
    let hotplugging = vmi(
        with_max(base(), 4),
        json!({"conditions": [{"type": "HotVCPUChange", "status": "True"}]}),
    );
    let plan = live_plan(&template(t.clone()), &hotplugging);
    assert_eq!(plan.wait, Some("another CPU hotplug is in progress"));
    assert_eq!(plan.vmi_spec_patch, None);
    let migrating = vmi(
        with_max(base(), 4),
        json!({"migrationState": {"startTimestamp": "2026-01-01T00:00:00Z"}}),
    );
    assert!(live_plan(&template(t), &migrating).wait.is_some());
}

#[test]
fn cpu_quantities_grow_by_whole_cpus() {
    let q = |s: &str| Quantity(s.to_string());
    assert_eq!(add_cpus(&q("1"), 1), Some(q("2")));
    assert_eq!(add_cpus(&q("500m"), 2), Some(q("2500m")));
    assert_eq!(add_cpus(&q("0.5"), 1), Some(q("1500m")));
    assert_eq!(add_cpus(&q("x"), 1), None);
}
