//! Pure conversion of a VirtualMachineInstance into a libvirt domain.
//!
//! Host facts (accelerator, prepared volume paths, console socket, …) are gathered by
//! the launcher first and passed in; nothing here touches the host or links libvirt,
//! so every conversion is deterministic and unit-testable with golden files.

pub mod convert;
pub mod host;
pub mod protocol;
pub mod schema;
pub mod stats;

pub use convert::{ConvertError, domain_for, domain_name, hotplug_disk};
pub use host::{Accel, HostFacts, KernelBootFiles, NetworkMode, PodTap, PreparedVolume};
pub use schema::{Domain, XmlError};
