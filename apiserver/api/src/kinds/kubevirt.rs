//! KubeVirt: the object deploying kubevirt-rs. Served by virt-apiserver at `kubevirt.io/v1`
//! by forwarding to virt-operator's `v1alpha3` CRD (not stored in our etcd).

use super::{KindStrategy, Schemas, admit_anything, decode, schema_of};
use crate::catalogue::Kind;
use crate::kubevirt::{KubeVirt, KubeVirtSpec, KubeVirtStatus};

pub const KIND: Kind = Kind {
    group: crate::GROUP,
    version: crate::VERSION,
    kind: "KubeVirt",
    list_kind: "KubeVirtList",
    plural: "kubevirts",
    singular: "kubevirt",
    short_names: &["kv", "kvs"],
    categories: &["all"],
    namespaced: true,
    has_status: true,
    has_scale: false,
    create_only: false,
    columns: &[],
    description: "KubeVirt represents the object deploying all kubevirt-rs components (stored by kube-apiserver as kubevirt.io/v1alpha3, served here at kubevirt.io/v1).",
};

/// kube-apiserver validates and stores it; only the schema is ours (`kubectl explain
/// kubevirt.spec` reads the fields the CRD accepts).
pub static STRATEGY: KindStrategy = KindStrategy {
    meta: &KIND,
    stored: false,
    decode: decode::<KubeVirt>,
    default: |_| {},
    validate: |_| Vec::new(),
    admit: admit_anything,
    references: super::no_references,
    resolve: super::resolve_nothing,
    handler_writes: false,
    cells: |_| Vec::new(),
    selectable: &[],
    schemas: Schemas {
        spec: schema_of::<KubeVirtSpec>,
        status: Some(schema_of::<KubeVirtStatus>),
        spec_required: true,
        // Stored by kube-apiserver, whose validation is not ours to promise.
        example_spec: None,
    },
};
