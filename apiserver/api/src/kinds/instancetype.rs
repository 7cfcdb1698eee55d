//! VirtualMachineInstancetype: a namespaced instance type (the guest's size; a VM using it
//! cannot override its values).

use serde_json::json;

use super::{KindStrategy, Schemas, admit_anything, age_only, decode, schema_of, validate_with};
use crate::catalogue::{AGE, Kind};
use crate::instancetype::{self as it, VirtualMachineInstancetype, VirtualMachineInstancetypeSpec};
use crate::validation::FieldError;

pub const KIND: Kind = Kind {
    group: it::GROUP,
    version: it::VERSION,
    kind: "VirtualMachineInstancetype",
    list_kind: "VirtualMachineInstancetypeList",
    plural: "virtualmachineinstancetypes",
    singular: "virtualmachineinstancetype",
    short_names: &["vminstancetype", "vminstancetypes", "vmf", "vmfs"],
    categories: &["all"],
    namespaced: true,
    has_status: false,
    has_scale: false,
    create_only: false,
    columns: &[AGE],
    description: "VirtualMachineInstancetype resource contains quantitative and resource related VirtualMachine configuration that can be used by multiple VirtualMachine resources.",
};

pub static STRATEGY: KindStrategy = KindStrategy {
    meta: &KIND,
    stored: true,
    decode: decode::<VirtualMachineInstancetype>,
    default: |_| {},
    validate: |v| validate_with::<VirtualMachineInstancetype>(v, |o| validate_spec(&o.spec)),
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
        example_spec: Some(example_spec),
    },
};

/// The smallest instance type.
pub(crate) fn example_spec() -> serde_json::Value {
    json!({ "cpu": { "guest": 1 }, "memory": { "guest": "64Mi" } })
}

/// KubeVirt's instance type webhook: `overcommitPercent` in 0..=100 and not with huge pages
/// (overcommitted memory would be backed by pages the pod never reserved).
pub(crate) fn validate_spec(spec: &VirtualMachineInstancetypeSpec) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let field = "spec.memory.overcommitPercent";
    let percent = spec.memory.overcommit_percent.unwrap_or(0);
    if !(0..=100).contains(&percent) {
        errs.push(FieldError::invalid(
            field,
            &percent.to_string(),
            &format!("{field} '{percent}': must be in range between 0 and 100."),
        ));
    }
    if percent != 0 && spec.memory.hugepages.is_some() {
        errs.push(FieldError::invalid(
            field,
            &percent.to_string(),
            "spec.memory.overcommitPercent and spec.memory.hugepages should not be requested together.",
        ));
    }
    if spec.cpu.guest == 0 {
        errs.push(FieldError::required("spec.cpu.guest", "at least one vCPU"));
    }
    errs
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn overcommit_is_a_percentage_and_not_with_hugepages() {
        let spec = |v: serde_json::Value| -> VirtualMachineInstancetypeSpec {
            serde_json::from_value(v).unwrap()
        };
        assert!(validate_spec(&spec(example_spec())).is_empty());
        let errs = validate_spec(&spec(
            json!({"cpu":{"guest":1},"memory":{"guest":"1Gi","overcommitPercent":101}}),
        ));
        assert_eq!(errs[0].field, "spec.memory.overcommitPercent");
        assert!(
            errs[0]
                .message
                .contains("must be in range between 0 and 100")
        );
        let errs = validate_spec(&spec(json!({"cpu":{"guest":1},
            "memory":{"guest":"1Gi","overcommitPercent":50,"hugepages":{"pageSize":"2Mi"}}})));
        assert!(errs[0].message.contains("should not be requested together"));
        let errs = validate_spec(&spec(json!({"cpu":{"guest":0},"memory":{"guest":"1Gi"}})));
        assert_eq!(errs[0].field, "spec.cpu.guest");
    }
}
