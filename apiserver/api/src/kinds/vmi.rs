//! VirtualMachineInstance: one running (or about to run) virtual machine.

use serde_json::{Value, json};

use super::{Admission, KindStrategy, Schemas, age, condition_status, decode, ptr, schema_of};
use crate::catalogue::{AGE, Kind, column};
use crate::policy::{
    Actor, host_disk_gate, immutable_spec, reserved_keys, without_claim_names,
    without_live_updatable,
};
use crate::validation::FieldError;
use crate::vmi::{
    VirtualMachineInstance, VirtualMachineInstanceSpec, VirtualMachineInstanceStatus,
};
use crate::{defaults, validation};

pub const KIND: Kind = Kind {
    group: crate::GROUP,
    version: crate::VERSION,
    kind: "VirtualMachineInstance",
    list_kind: "VirtualMachineInstanceList",
    plural: "virtualmachineinstances",
    singular: "virtualmachineinstance",
    short_names: &["vmi", "vmis"],
    categories: &["all"],
    namespaced: true,
    has_status: true,
    has_scale: false,
    create_only: false,
    columns: &[
        AGE,
        column("Phase", "Phase of the instance", 0),
        column("IP", "First IP address", 0),
        column("NodeName", "Node the instance runs on", 0),
        column("Ready", "Ready condition", 0),
        column("Live-Migratable", "LiveMigratable condition", 1),
        column("Paused", "Paused condition", 1),
    ],
    description: "VirtualMachineInstance is one running (or about to run) virtual machine: the guest hardware, volumes and networks, and the launcher pod placement.",
};

pub static STRATEGY: KindStrategy = KindStrategy {
    meta: &KIND,
    stored: true,
    decode: decode::<VirtualMachineInstance>,
    default: |v| super::with_typed::<VirtualMachineInstance>(v, defaults::default_vmi),
    validate: |v| super::validate_with::<VirtualMachineInstance>(v, validation::validate_vmi),
    admit,
    references: super::no_references,
    resolve: super::resolve_nothing,
    handler_writes: true,
    cells: |o| {
        vec![
            age(o),
            ptr(o, "/status/phase"),
            ptr(o, "/status/interfaces/0/ipAddress"),
            ptr(o, "/status/nodeName"),
            condition_status(o, "Ready"),
            condition_status(o, "LiveMigratable"),
            condition_status(o, "Paused"),
        ]
    },
    selectable: &[
        ("status.phase", "/status/phase"),
        ("status.nodeName", "/status/nodeName"),
    ],
    schemas: Schemas {
        spec: schema_of::<VirtualMachineInstanceSpec>,
        status: Some(schema_of::<VirtualMachineInstanceStatus>),
        spec_required: true,
        example_spec: Some(example_spec),
    },
};

/// The smallest VMI spec the server accepts: a guest needs memory, nothing else.
pub(crate) fn example_spec() -> Value {
    json!({
        "domain": {
            "devices": {},
            "resources": { "requests": { "memory": "64Mi" } },
        },
    })
}

/// hostDisk needs its gate; the spec is immutable but to the server (and, for claim names,
/// the components); reserved labels and annotations are the components'.
fn admit(a: &Admission<'_>) -> Vec<FieldError> {
    let (old, new) = (a.old, a.new);
    let mut errs = host_disk_gate(
        old.and_then(|o| o.get("spec")),
        new.get("spec"),
        "spec",
        a.gates,
    );
    if let Some(old) = old {
        match a.actor {
            Actor::Server => {}
            // virt-controller points a volume at the claim a migration copied it to, and
            // carries a VM's live updates (placement, CPU sockets) and hotplugged volumes;
            // nothing else of the spec changes.
            Actor::Component => {
                let live = |spec: Option<&Value>| {
                    let mut spec = without_live_updatable(without_claim_names(spec).as_ref());
                    if let Some(s) = spec.as_mut() {
                        crate::hotplug::strip_hotplugged_json(s);
                    }
                    spec
                };
                errs.extend(immutable_spec(
                    live(old.get("spec")).as_ref(),
                    live(new.get("spec")).as_ref(),
                ))
            }
            Actor::User | Actor::Handler { .. } => {
                errs.extend(immutable_spec(old.get("spec"), new.get("spec")))
            }
        }
    }
    if !a.actor.may_write_reserved() {
        errs.extend(reserved_keys(
            old.and_then(|o| o.get("metadata")),
            new.get("metadata"),
            "metadata",
        ));
    }
    errs
}
