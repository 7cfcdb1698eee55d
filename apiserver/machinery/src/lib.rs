//! Pure building blocks of `virt-apiserver`: label/field selectors, the OpenAPI
//! documents served under `/openapi/*`, and server-side apply with managedFields.
//!
//! Nothing here does I/O, so every rule the apiserver must follow can be unit-tested
//! without a cluster.

pub mod fieldmanager;
pub mod openapi;
pub mod selector;
