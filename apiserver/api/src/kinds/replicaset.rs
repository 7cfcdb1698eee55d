//! VirtualMachineInstanceReplicaSet: `replicas` ephemeral VMIs from one template, with the
//! `/scale` subresource (`kubectl scale vmirs`, an HPA).

use serde_json::{Value, json};

use super::{Admission, KindStrategy, Schemas, age, decode, ptr, schema_of};
use crate::catalogue::{AGE, Column, Kind, column};
use crate::policy::{host_disk_gate, reserved_keys};
use crate::replicaset::{
    self as rs, VirtualMachineInstanceReplicaSet, VirtualMachineInstanceReplicaSetSpec,
    VirtualMachineInstanceReplicaSetStatus,
};
use crate::validation::FieldError;

/// An integer column (KubeVirt's replica counts).
pub(crate) const fn count(name: &'static str, description: &'static str) -> Column {
    Column {
        type_: "integer",
        ..column(name, description, 0)
    }
}

pub const KIND: Kind = Kind {
    group: crate::GROUP,
    version: crate::VERSION,
    kind: "VirtualMachineInstanceReplicaSet",
    list_kind: "VirtualMachineInstanceReplicaSetList",
    plural: "virtualmachineinstancereplicasets",
    singular: "virtualmachineinstancereplicaset",
    short_names: &["vmirs", "vmirss"],
    categories: &["all"],
    namespaced: true,
    has_status: true,
    has_scale: true,
    create_only: false,
    // KubeVirt's printer columns.
    columns: &[
        count("Desired", "Number of desired VirtualMachineInstances"),
        count(
            "Current",
            "Number of managed and not final or deleted VirtualMachineInstances",
        ),
        count(
            "Ready",
            "Number of managed VirtualMachineInstances which are ready to receive traffic",
        ),
        AGE,
    ],
    description: "VirtualMachineInstanceReplicaSet keeps the requested number of VirtualMachineInstances made from one template running.",
};

pub static STRATEGY: KindStrategy = KindStrategy {
    meta: &KIND,
    stored: true,
    decode: decode::<VirtualMachineInstanceReplicaSet>,
    default: |_| {},
    validate: |v| super::validate_with::<VirtualMachineInstanceReplicaSet>(v, rs::validate),
    admit,
    references: super::no_references,
    resolve: super::resolve_nothing,
    handler_writes: false,
    cells: replica_cells,
    selectable: &[],
    schemas: Schemas {
        spec: schema_of::<VirtualMachineInstanceReplicaSetSpec>,
        status: Some(schema_of::<VirtualMachineInstanceReplicaSetStatus>),
        spec_required: true,
        example_spec: Some(example_spec),
    },
};

/// Desired, Current, Ready, Age (both replicated kinds).
pub(crate) fn replica_cells(o: &Value) -> Vec<Value> {
    vec![
        ptr(o, "/spec/replicas"),
        ptr(o, "/status/replicas"),
        ptr(o, "/status/readyReplicas"),
        age(o),
    ]
}

/// One small VMI.
pub(crate) fn example_spec() -> Value {
    json!({
        "replicas": 1,
        "selector": { "matchLabels": { "app": "example" } },
        "template": {
            "metadata": { "labels": { "app": "example" } },
            "spec": super::vmi::example_spec(),
        },
    })
}

/// hostDisk in the template needs its gate; reserved labels and annotations are the
/// components'.
fn admit(a: &Admission<'_>) -> Vec<FieldError> {
    let template = |o: &Value| o.pointer("/spec/template/spec").cloned();
    let mut errs = host_disk_gate(
        a.old.and_then(template).as_ref(),
        template(a.new).as_ref(),
        "spec.template.spec",
        a.gates,
    );
    if !a.actor.may_write_reserved() {
        errs.extend(reserved_keys(
            a.old.and_then(|o| o.get("metadata")),
            a.new.get("metadata"),
            "metadata",
        ));
    }
    errs
}
