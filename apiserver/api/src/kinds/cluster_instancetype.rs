//! VirtualMachineClusterInstancetype: an instance type for every namespace.

use super::{KindStrategy, Schemas, admit_anything, age_only, decode, schema_of, validate_with};
use crate::catalogue::{AGE, Kind};
use crate::instancetype::{
    self as it, VirtualMachineClusterInstancetype, VirtualMachineInstancetypeSpec,
};

pub const KIND: Kind = Kind {
    group: it::GROUP,
    version: it::VERSION,
    kind: "VirtualMachineClusterInstancetype",
    list_kind: "VirtualMachineClusterInstancetypeList",
    plural: "virtualmachineclusterinstancetypes",
    singular: "virtualmachineclusterinstancetype",
    short_names: &[
        "vmclusterinstancetype",
        "vmclusterinstancetypes",
        "vmcf",
        "vmcfs",
    ],
    categories: &[],
    namespaced: false,
    has_status: false,
    has_scale: false,
    create_only: false,
    columns: &[AGE],
    description: "VirtualMachineClusterInstancetype is a cluster scoped version of VirtualMachineInstancetype resource.",
};

pub static STRATEGY: KindStrategy = KindStrategy {
    meta: &KIND,
    stored: true,
    decode: decode::<VirtualMachineClusterInstancetype>,
    default: |_| {},
    validate: |v| {
        validate_with::<VirtualMachineClusterInstancetype>(v, |o| {
            super::instancetype::validate_spec(&o.spec)
        })
    },
    admit: admit_anything,
    references: super::no_references,
    resolve: super::resolve_nothing,
    handler_writes: false,
    cells: age_only,
    selectable: &[],
    schemas: Schemas {
        spec: schema_of::<VirtualMachineInstancetypeSpec>,
        status: None,
        spec_required: true,
        example_spec: Some(super::instancetype::example_spec),
    },
};
