//! VirtualMachinePool (`pool.kubevirt.io/v1beta1`): `replicas` stateful VMs
//! `<pool>-<ordinal>` from one VM template, with the `/scale` subresource.

use serde_json::{Value, json};

use super::replicaset::{count, replica_cells};
use super::{Admission, KindStrategy, Schemas, decode, schema_of};
use crate::catalogue::{AGE, Kind};
use crate::policy::reserved_keys;
use crate::pool::{self, VirtualMachinePool, VirtualMachinePoolSpec, VirtualMachinePoolStatus};
use crate::validation::FieldError;

pub const KIND: Kind = Kind {
    group: pool::GROUP,
    version: pool::VERSION,
    kind: "VirtualMachinePool",
    list_kind: "VirtualMachinePoolList",
    plural: "virtualmachinepools",
    singular: "virtualmachinepool",
    short_names: &["vmpool", "vmpools"],
    categories: &["all"],
    namespaced: true,
    has_status: true,
    has_scale: true,
    create_only: false,
    // KubeVirt's printer columns.
    columns: &[
        count("Desired", "Number of desired VirtualMachines"),
        count(
            "Current",
            "Number of managed and not final or deleted VirtualMachines",
        ),
        count(
            "Ready",
            "Number of managed VirtualMachines which are ready to receive traffic",
        ),
        AGE,
    ],
    description: "VirtualMachinePool resource contains a VirtualMachine configuration that can be used to replicate multiple VirtualMachine resources.",
};

pub static STRATEGY: KindStrategy = KindStrategy {
    meta: &KIND,
    stored: true,
    decode: decode::<VirtualMachinePool>,
    default: |_| {},
    validate: |v| super::validate_with::<VirtualMachinePool>(v, pool::validate),
    admit,
    references: super::no_references,
    resolve: super::resolve_nothing,
    handler_writes: false,
    cells: replica_cells,
    selectable: &[],
    schemas: Schemas {
        spec: schema_of::<VirtualMachinePoolSpec>,
        status: Some(schema_of::<VirtualMachinePoolStatus>),
        spec_required: true,
        example_spec: Some(example_spec),
    },
};

/// One small stopped VM.
pub(crate) fn example_spec() -> Value {
    json!({
        "replicas": 1,
        "selector": { "matchLabels": { "app": "example" } },
        "virtualMachineTemplate": {
            "metadata": { "labels": { "app": "example" } },
            "spec": {
                "runStrategy": "Halted",
                "template": { "spec": super::vmi::example_spec() },
            },
        },
    })
}

/// The selector is fixed once created (KubeVirt's pool admission); reserved labels and
/// annotations are the components'.
fn admit(a: &Admission<'_>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(old) = a.old
        && let (Ok(old), Ok(new)) = (
            serde_json::from_value::<VirtualMachinePool>(old.clone()),
            serde_json::from_value::<VirtualMachinePool>(a.new.clone()),
        )
    {
        errs.extend(pool::validate_update(&old, &new));
    }
    if !a.actor.may_write_reserved() {
        errs.extend(reserved_keys(
            a.old.and_then(|o| o.get("metadata")),
            a.new.get("metadata"),
            "metadata",
        ));
    }
    errs
}
