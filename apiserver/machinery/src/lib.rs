//! Pure building blocks of `virt-apiserver`: label/field selectors, the OpenAPI
//! documents served under `/openapi/*`, and server-side apply with managedFields.
//!
//! Nothing here does I/O, so every rule the apiserver must follow can be unit-tested
//! without a cluster.
//!
//! * [`selector`]: `?labelSelector=` / `?fieldSelector=` parsing and matching (R8.6).
//! * [`openapi`]: `/openapi/v2`, `/openapi/v3` and `/openapi/v3/apis/<group>/v1` (§6).
//! * [`fieldmanager`]: `application/apply-patch+yaml` and `metadata.managedFields`
//!   (R8.10.4).

pub mod fieldmanager;
pub mod openapi;
pub mod selector;
