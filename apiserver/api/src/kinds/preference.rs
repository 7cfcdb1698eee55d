//! VirtualMachinePreference: namespaced defaults for VMs (each fills only what the VM leaves
//! unset).

use serde_json::json;

use super::{KindStrategy, Schemas, admit_anything, age_only, decode, schema_of, validate_with};
use crate::catalogue::{AGE, Kind};
use crate::instancetype::{
    self as it, PreferredCpuTopology, SpreadAcross, VirtualMachinePreference,
    VirtualMachinePreferenceSpec,
};
use crate::validation::FieldError;

pub const KIND: Kind = Kind {
    group: it::GROUP,
    version: it::VERSION,
    kind: "VirtualMachinePreference",
    list_kind: "VirtualMachinePreferenceList",
    plural: "virtualmachinepreferences",
    singular: "virtualmachinepreference",
    short_names: &["vmpref", "vmprefs", "vmp", "vmps"],
    categories: &["all"],
    namespaced: true,
    has_status: false,
    has_scale: false,
    create_only: false,
    columns: &[AGE],
    description: "VirtualMachinePreference resource contains optional preferences related to the VirtualMachine.",
};

pub static STRATEGY: KindStrategy = KindStrategy {
    meta: &KIND,
    stored: true,
    decode: decode::<VirtualMachinePreference>,
    default: |_| {},
    validate: |v| validate_with::<VirtualMachinePreference>(v, |o| validate_spec(&o.spec)),
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
        example_spec: Some(|| json!({ "devices": { "preferredDiskBus": "virtio" } })),
    },
};

/// KubeVirt's preference webhook: a `spread` topology across cores and threads takes a ratio
/// of 2 only (an unknown topology or `across` is refused by decoding already).
pub(crate) fn validate_spec(spec: &VirtualMachinePreferenceSpec) -> Vec<FieldError> {
    let cpu = spec.cpu.as_ref();
    let spread = cpu
        .and_then(|c| c.preferred_cpu_topology)
        .is_some_and(|t| t.canonical() == PreferredCpuTopology::Spread);
    if !spread {
        return Vec::new();
    }
    let (ratio, across) = crate::instancetype::apply::spread_options(spec);
    if across == SpreadAcross::CoresThreads && ratio != 2 {
        return vec![FieldError::invalid(
            "spec.cpu.spreadOptions.ratio",
            &ratio.to_string(),
            "only a ratio of 2 (1 core 2 threads) is allowed when spreading vCPUs over cores and threads",
        )];
    }
    Vec::new()
}
