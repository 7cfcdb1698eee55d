//! VirtualMachineClusterPreference: preferences for every namespace.

use super::{KindStrategy, Schemas, admit_anything, age_only, decode, schema_of, validate_with};
use crate::catalogue::{AGE, Kind};
use crate::instancetype::{
    self as it, VirtualMachineClusterPreference, VirtualMachinePreferenceSpec,
};

pub const KIND: Kind = Kind {
    group: it::GROUP,
    version: it::VERSION,
    kind: "VirtualMachineClusterPreference",
    list_kind: "VirtualMachineClusterPreferenceList",
    plural: "virtualmachineclusterpreferences",
    singular: "virtualmachineclusterpreference",
    short_names: &["vmcp", "vmcps"],
    categories: &[],
    namespaced: false,
    has_status: false,
    has_scale: false,
    create_only: false,
    columns: &[AGE],
    description: "VirtualMachineClusterPreference is a cluster scoped version of the VirtualMachinePreference resource.",
};

pub static STRATEGY: KindStrategy = KindStrategy {
    meta: &KIND,
    stored: true,
    decode: decode::<VirtualMachineClusterPreference>,
    default: |_| {},
    validate: |v| {
        validate_with::<VirtualMachineClusterPreference>(v, |o| {
            super::preference::validate_spec(&o.spec)
        })
    },
    admit: admit_anything,
    references: super::no_references,
    resolve: super::resolve_nothing,
    handler_writes: false,
    cells: age_only,
    selectable: &[],
    schemas: Schemas {
        spec: schema_of::<VirtualMachinePreferenceSpec>,
        status: None,
        spec_required: true,
        example_spec: Some(|| serde_json::json!({ "devices": { "preferredDiskBus": "virtio" } })),
    },
};
