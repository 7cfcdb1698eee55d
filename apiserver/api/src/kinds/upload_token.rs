//! UploadTokenRequest (`upload.cdi.kubevirt.io/v1beta1`): CDI's request for an upload token,
//! answered by virt-apiserver on create with `status.token` and stored nowhere (like
//! TokenReview; docs/design-datavolumes.md 3.1, 3.5). The token itself is
//! [`crate::cdi::upload::TokenKey`]'s.

use serde_json::{Value, json};

use super::{KindStrategy, Schemas, age_only, decode, schema_of};
use crate::catalogue::{AGE, Kind};
use crate::cdi::upload::{
    GROUP, UploadTokenRequest, UploadTokenRequestSpec, UploadTokenRequestStatus, VERSION,
};
use crate::validation::FieldError;

pub const KIND: Kind = Kind {
    group: GROUP,
    version: VERSION,
    kind: "UploadTokenRequest",
    list_kind: "UploadTokenRequestList",
    plural: "uploadtokenrequests",
    singular: "uploadtokenrequest",
    short_names: &["utr", "utrs"],
    categories: &[],
    namespaced: true,
    has_status: false,
    has_scale: false,
    create_only: true,
    columns: &[AGE],
    description: "UploadTokenRequest is the CR used to initiate a CDI upload: creating one answers with a short-lived token for the upload proxy, scoped to one claim of the namespace.",
};

pub static STRATEGY: KindStrategy = KindStrategy {
    meta: &KIND,
    stored: false,
    decode: decode::<UploadTokenRequest>,
    default: |_| {},
    validate: |v| super::validate_with::<UploadTokenRequest>(v, validate),
    admit: super::admit_anything,
    references: super::no_references,
    resolve: super::resolve_nothing,
    handler_writes: false,
    cells: age_only,
    selectable: &[],
    schemas: Schemas {
        spec: schema_of::<UploadTokenRequestSpec>,
        status: Some(schema_of::<UploadTokenRequestStatus>),
        spec_required: true,
        example_spec: Some(example_spec),
    },
};

fn example_spec() -> Value {
    json!({ "pvcName": "disk" })
}

/// CDI's rule: the claim is named.
fn validate(r: &UploadTokenRequest) -> Vec<FieldError> {
    if r.spec.pvc_name.trim().is_empty() {
        return vec![FieldError::required(
            "spec.pvcName",
            "the claim to upload into (a DataVolume with source.upload, or a claim annotated cdi.kubevirt.io/storage.upload.target)",
        )];
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_claim_is_required_and_only_create_is_served() {
        assert_eq!(KIND.verbs(), &["create"]);
        let errs = (STRATEGY.validate)(&json!({"spec": {"pvcName": ""}}));
        assert_eq!(errs[0].field, "spec.pvcName");
        assert!((STRATEGY.validate)(&json!({"spec": {"pvcName": "d"}})).is_empty());
    }
}
