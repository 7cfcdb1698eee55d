//! VirtualMachineInstanceMigration: a request to live-migrate a VMI.

use serde_json::json;

use super::{Admission, KindStrategy, Schemas, age, decode, ptr, schema_of};
use crate::catalogue::{AGE, Kind, column};
use crate::migration::{
    VirtualMachineInstanceMigration, VirtualMachineInstanceMigrationSpec,
    VirtualMachineInstanceMigrationStatus,
};
use crate::policy::{immutable_spec, reserved_keys};
use crate::validation::FieldError;
use crate::{defaults, validation};

pub const KIND: Kind = Kind {
    group: crate::GROUP,
    version: crate::VERSION,
    kind: "VirtualMachineInstanceMigration",
    list_kind: "VirtualMachineInstanceMigrationList",
    plural: "virtualmachineinstancemigrations",
    singular: "virtualmachineinstancemigration",
    short_names: &["vmim", "vmims"],
    categories: &["all"],
    namespaced: true,
    has_status: true,
    has_scale: false,
    create_only: false,
    columns: &[
        column("Phase", "Phase of the migration", 0),
        column("VMI", "Name of the migrated instance", 0),
        AGE,
    ],
    description: "VirtualMachineInstanceMigration is a request to live-migrate a VirtualMachineInstance to another node; its status follows the migration.",
};

pub static STRATEGY: KindStrategy = KindStrategy {
    meta: &KIND,
    stored: true,
    decode: decode::<VirtualMachineInstanceMigration>,
    default: |v| {
        super::with_typed::<VirtualMachineInstanceMigration>(v, defaults::default_migration)
    },
    validate: |v| {
        super::validate_with::<VirtualMachineInstanceMigration>(v, validation::validate_migration)
    },
    admit,
    references: super::no_references,
    resolve: super::resolve_nothing,
    handler_writes: false,
    cells: |o| vec![ptr(o, "/status/phase"), ptr(o, "/spec/vmiName"), age(o)],
    selectable: &[
        ("spec.vmiName", "/spec/vmiName"),
        ("status.phase", "/status/phase"),
    ],
    schemas: Schemas {
        spec: schema_of::<VirtualMachineInstanceMigrationSpec>,
        status: Some(schema_of::<VirtualMachineInstanceMigrationStatus>),
        spec_required: true,
        example_spec: Some(|| json!({ "vmiName": "example-vmi" })),
    },
};

/// The spec is immutable (KubeVirt: "update of Migration object's spec is restricted": the
/// controller decided on the spec it saw); reserved labels are the components'.
fn admit(a: &Admission<'_>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(old) = a.old {
        errs.extend(immutable_spec(old.get("spec"), a.new.get("spec")));
    }
    // virt-controller finds a VMI's migrations by their `kubevirt.io/vmi-name` label and the
    // evacuation controller by its own: a user's label there would make a migration pass
    // for another's.
    if !a.actor.may_write_reserved() {
        errs.extend(reserved_keys(
            a.old.and_then(|o| o.get("metadata")),
            a.new.get("metadata"),
            "metadata",
        ));
    }
    errs
}
