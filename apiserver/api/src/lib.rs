//! `kubevirt.io/v1` API types shared by every kubevirt-rs component, plus the pure
//! functions that belong to the API itself: defaulting, validation, quantity parsing.
//!
//! This crate does no I/O. The apiserver, the controllers, the node agents and the
//! `kubectl virt` plugin all depend on it, so the wire format is defined exactly once.
//! Field names and shapes follow KubeVirt's `kubevirt.io/v1` schema so that existing
//! VM YAML applies unchanged.

pub mod backup;
pub mod catalogue;
pub mod cdi;
pub mod cloudinit;
pub mod common;
pub mod defaults;
pub mod duration;
pub mod eviction;
pub mod guestagent;
pub mod handler_protocol;
pub mod hotplug;
pub mod instancetype;
pub mod kinds;
pub mod kubevirt;
pub mod migration;
pub mod options;
pub mod policy;
pub mod pool;
pub mod quantity;
pub mod replicas;
pub mod replicaset;
pub mod validation;
pub mod vm;
pub mod vmi;

pub use common::{Condition, ConditionStatus};
pub use kubevirt::{KubeVirt, KubeVirtSpec, KubeVirtStatus};
pub use migration::{
    CopiedClaim, MigrationAbortStatus, MigrationMethod, MigrationMode, NotMigratable,
    VirtualMachineInstanceMigration, VirtualMachineInstanceMigrationPhase,
    VirtualMachineInstanceMigrationSpec, VirtualMachineInstanceMigrationState,
    VirtualMachineInstanceMigrationStatus, copied_claims, live_migratable,
};
pub use vm::{
    PrintableStatus, RunStrategy, StateChangeRequest, StateChangeRequestAction, VirtualMachine,
    VirtualMachineSpec, VirtualMachineStatus,
};
pub use vmi::{
    StorageMigratedVolumeInfo, VirtualMachineInstance, VirtualMachineInstancePhase,
    VirtualMachineInstanceSpec, VirtualMachineInstanceStatus,
};

/// API group of the kinds in this crate.
pub const GROUP: &str = "kubevirt.io";
/// API version of the kinds in this crate.
pub const VERSION: &str = "v1";
/// `apiVersion` value of every object in this crate.
pub const API_VERSION: &str = "kubevirt.io/v1";
/// API group of the action and streaming subresources (start, stop, console, …).
pub const SUBRESOURCES_GROUP: &str = "subresources.kubevirt.io";
/// Label key naming the component a pod belongs to, as KubeVirt labels its pods
/// (`kubevirt.io=virt-launcher`). Other components select pods by it: virt-apiserver's
/// eviction webhook (is this a launcher pod?) and its lookup of a node's virt-handler, and
/// users' drains with `--pod-selector`. Spelled like [`GROUP`], but a label key, so it
/// must not follow a change of the group.
pub const COMPONENT_LABEL: &str = "kubevirt.io";
/// Value of [`COMPONENT_LABEL`] on launcher pods.
pub const LAUNCHER_COMPONENT: &str = "virt-launcher";
/// Label virt-controller puts on every launcher pod (a migration's target included): the
/// uid of the VMI it runs.
pub const CREATED_BY_LABEL: &str = "kubevirt.io/created-by";
/// Label virt-controller puts on every launcher pod: the name of the VMI it runs (its VM's).
pub const VM_NAME_LABEL: &str = "vm.kubevirt.io/name";
/// Value of [`COMPONENT_LABEL`] on virt-handler pods.
pub const HANDLER_COMPONENT: &str = "virt-handler";
/// The user (and group) virt-launcher, its libvirt and QEMU run as in a launcher pod
/// (KubeVirt's `qemu` user; docs/node.md, "Privilege model").
pub const LAUNCHER_UID: u32 = 107;
/// Environment variable naming the FIFO a launcher holds open for its whole life: the
/// pod's image copiers read it and end when it reaches end-of-file, i.e. with the launcher
/// however it ends (virt-controller renders the pod, virt-launcher holds it).
pub const LAUNCHER_LIFELINE_ENV: &str = "VIRT_LAUNCHER_LIFELINE";
