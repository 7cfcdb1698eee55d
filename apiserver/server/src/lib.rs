//! virt-apiserver: the aggregated API server for `kubevirt.io/v1` and
//! `subresources.kubevirt.io/v1`, storing VirtualMachine, VirtualMachineInstance and
//! VirtualMachineInstanceMigration in its own etcd with Kubernetes API semantics.

// ApiError carries a full metav1.Status (details, causes) by design; errors are the
// rare path, and boxing every handler result would only add noise.
#![allow(clippy::result_large_err)]

pub mod admission;
pub mod auth;
pub mod authconfig;
pub mod backup;
pub mod cache;
pub mod config;
pub mod convert;
pub mod discovery;
pub mod error;
pub mod expand;
pub mod handler;
pub mod http;
pub mod inflight;
pub mod kinds;
pub mod kubevirts;
pub mod managed;
#[cfg(test)]
mod memstore;
pub mod metrics;
pub mod objects;
pub mod openapi;
pub mod request;
pub mod rest;
pub mod scale;
pub mod server;
pub mod state;
pub mod storage;
pub mod stream;
pub mod subresources;
pub mod upload_token;
pub mod uploadproxy;
pub mod volumes;
pub mod watch;
pub mod webhook;
pub mod wsclient;

pub use virt_apimachinery::selector;
