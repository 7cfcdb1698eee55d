//! virt-launcher: one per VMI. Prepares the VMI's volumes, runs a private libvirt daemon,
//! defines and starts the QEMU domain through the `virt` crate on a dedicated thread,
//! serves the serial console on a unix socket and shuts the guest down gracefully.

pub mod actor;
pub mod agent;
pub mod claims;
pub mod cmd_server;
pub mod console_log;
pub mod daemon;
#[cfg(test)]
mod fake;
pub mod launcher;
pub mod lifeline;
pub mod network;
pub mod probe;
pub mod reaper;
pub mod relay;
pub mod stats;
pub mod volumes;

pub use launcher::{Config, LauncherError, Outcome, run};
