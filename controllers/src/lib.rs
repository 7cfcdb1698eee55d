//! virt-controller: the cluster-wide controllers of kubevirt-rs.
//!
//! The VirtualMachine controller ([`vm`]) creates and deletes each VM's
//! VirtualMachineInstance according to its runStrategy and stateChangeRequests and
//! reports the result in the VM status. The VirtualMachineInstance controller
//! ([`vmi`]) creates each VMI's launcher pod and follows it into the VMI status until
//! virt-handler takes over. The migration controller ([`migration`]) moves a running
//! VMI to another node with virt-handler (docs/cluster-flow.md §6). Decisions are pure functions ([`vm::decide`],
//! [`vm::render`], [`vmi::decide`], [`vmi::render`], [`migration::decide`]); the reconcilers only execute them.
//! The DataVolume controller ([`datavolume`]) gives each CDI DataVolume its claim and
//! importer pod (docs/design-datavolumes.md).
//! [`leader`] keeps a single active replica with a coordination.k8s.io Lease.

pub mod backoff;
pub mod client;
pub mod context;
pub mod datavolume;
pub mod evacuation;
pub mod events;
pub mod expectations;
pub mod leader;
pub mod metrics;
pub mod migration;
pub mod pool;
pub mod replicas;
pub mod replicaset;
pub mod signal;
pub mod vm;
pub mod vmi;
pub mod watch;
pub mod workload;

pub use context::{Config, Context, FIELD_MANAGER};
