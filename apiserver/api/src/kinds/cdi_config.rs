//! CDIConfig (`cdi.kubevirt.io/v1beta1`, cluster-scoped): the singleton `config` virtctl
//! reads the upload proxy's URL from (docs/design-datavolumes.md 3.2, 3.5). virt-operator
//! creates it and writes its status.

use serde_json::Value;

use super::{Admission, KindStrategy, Schemas, age_only, decode, schema_of};
use crate::catalogue::{AGE, Kind};
use crate::cdi::config::{CDIConfig, CDIConfigSpec, CDIConfigStatus, NAME};
use crate::cdi::{GROUP, VERSION};
use crate::validation::FieldError;

pub const KIND: Kind = Kind {
    group: GROUP,
    version: VERSION,
    kind: "CDIConfig",
    list_kind: "CDIConfigList",
    plural: "cdiconfigs",
    singular: "cdiconfig",
    short_names: &[],
    categories: &[],
    namespaced: false,
    has_status: true,
    has_scale: false,
    create_only: false,
    columns: &[AGE],
    description: "CDIConfig provides a user configuration for CDI: the upload proxy's URL virtctl image-upload uses.",
};

pub static STRATEGY: KindStrategy = KindStrategy {
    meta: &KIND,
    stored: true,
    decode: decode::<CDIConfig>,
    default: |_| {},
    validate: |_| Vec::new(),
    admit,
    references: super::no_references,
    resolve: super::resolve_nothing,
    handler_writes: false,
    cells: age_only,
    selectable: &[],
    schemas: Schemas {
        spec: schema_of::<CDIConfigSpec>,
        status: Some(schema_of::<CDIConfigStatus>),
        spec_required: false,
        example_spec: None,
    },
};

/// CDI's rule: one CDIConfig, named `config`.
fn admit(a: &Admission<'_>) -> Vec<FieldError> {
    let name = a
        .new
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if a.old.is_none() && name != NAME && !name.is_empty() {
        return vec![FieldError::invalid(
            "metadata.name",
            name,
            &format!("the CDIConfig is a singleton named {NAME:?}"),
        )];
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Actor, FeatureGates};
    use serde_json::json;

    #[test]
    fn only_config_is_admitted() {
        let (actor, gates) = (Actor::default(), FeatureGates::default());
        let admit_named = |name: &str| {
            let new = json!({"metadata": {"name": name}, "spec": {}});
            admit(&Admission {
                old: None,
                new: &new,
                actor: &actor,
                gates: &gates,
                found: None,
            })
        };
        assert!(admit_named("config").is_empty());
        let errs = admit_named("other");
        assert_eq!(errs[0].field, "metadata.name");
    }
}
