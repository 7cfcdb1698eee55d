//! DataVolume (`cdi.kubevirt.io/v1beta1`): a claim and where its content comes from,
//! served by virt-apiserver instead of CDI's CRD (docs/design-datavolumes.md, 3.1): no
//! admission webhook to fail, progress updates stay out of the cluster's etcd, one catalogue.

use serde_json::{Value, json};

use super::{Admission, KindStrategy, Schemas, age, decode, ptr, schema_of};
use crate::catalogue::{AGE, Column, Kind, column};
use crate::cdi::validation::{default_data_volume, validate_data_volume};
use crate::cdi::{self, DataVolume, DataVolumeSpec, DataVolumeStatus};
use crate::policy::reserved_keys;
use crate::validation::FieldError;

pub const KIND: Kind = Kind {
    group: cdi::GROUP,
    version: cdi::VERSION,
    kind: "DataVolume",
    list_kind: "DataVolumeList",
    plural: "datavolumes",
    singular: "datavolume",
    short_names: &["dv", "dvs"],
    categories: &["all"],
    namespaced: true,
    has_status: true,
    has_scale: false,
    create_only: false,
    // CDI's printer columns, in its order: AGE last.
    columns: &[
        column("Phase", "The phase the data volume is in", 0),
        column(
            "Progress",
            "Transfer progress in percentage if known, N/A otherwise",
            0,
        ),
        Column {
            type_: "integer",
            ..column(
                "Restarts",
                "The number of times the transfer has been restarted.",
                0,
            )
        },
        AGE,
    ],
    description: "DataVolume is an abstraction on top of PersistentVolumeClaims to allow easy population of those PersistentVolumeClaims with relation to VirtualMachines.",
};

pub static STRATEGY: KindStrategy = KindStrategy {
    meta: &KIND,
    stored: true,
    decode: decode::<DataVolume>,
    default: |v| super::with_typed::<DataVolume>(v, default_data_volume),
    validate: |v| super::validate_with::<DataVolume>(v, validate_data_volume),
    admit,
    references: super::no_references,
    resolve: super::resolve_nothing,
    handler_writes: false,
    cells: |o| {
        vec![
            ptr(o, "/status/phase"),
            ptr(o, "/status/progress"),
            ptr(o, "/status/restartCount"),
            age(o),
        ]
    },
    selectable: &[("status.phase", "/status/phase")],
    schemas: Schemas {
        spec: schema_of::<DataVolumeSpec>,
        status: Some(schema_of::<DataVolumeStatus>),
        spec_required: true,
        example_spec: Some(example_spec),
    },
};

/// A blank 1Gi disk: the smallest DataVolume the server accepts.
pub(crate) fn example_spec() -> Value {
    json!({
        "source": { "blank": {} },
        "storage": { "resources": { "requests": { "storage": "1Gi" } } },
    })
}

/// CDI's rule: the spec is fixed at creation (the claim is made from it once; a changed
/// source would not be imported again). Reserved labels and annotations are the
/// components' (virt-controller labels a VM's DataVolumes with the VM's uid). A clone from
/// another namespace is refused until kubevirt-rs can carry it out.
fn admit(a: &Admission<'_>) -> Vec<FieldError> {
    let mut errs = Vec::new();
    if let Some(old) = a.old {
        errs.extend(immutable_spec(old.get("spec"), a.new.get("spec")));
    }
    errs.extend(cdi::clone::cross_namespace_errors(KIND.kind, a.old, a.new));
    if !a.actor.may_write_reserved() {
        errs.extend(reserved_keys(
            a.old.and_then(|o| o.get("metadata")),
            a.new.get("metadata"),
            "metadata",
        ));
    }
    errs
}

/// One error per top-level spec field that changed.
fn immutable_spec(old: Option<&Value>, new: Option<&Value>) -> Vec<FieldError> {
    let empty = serde_json::Map::new();
    let fields = |v: Option<&Value>| v.and_then(Value::as_object).unwrap_or(&empty).clone();
    let (old, new) = (fields(old), fields(new));
    let mut keys: Vec<&String> = old.keys().chain(new.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| old.get(*k) != new.get(*k))
        .map(|k| {
            FieldError::forbidden(
                format!("spec.{k}"),
                "Cannot update DataVolume Spec: a DataVolume's spec is fixed at creation; \
                 delete the DataVolume and create it again",
            )
        })
        .collect()
}
