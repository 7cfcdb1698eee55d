//! `cdi.kubevirt.io/v1beta1`: CDI's DataVolume (a claim plus where its content comes from),
//! served by virt-apiserver with CDI's schema so KubeVirt's and CDI's YAML, `virtctl
//! image-upload` and VMs' `dataVolumeTemplates` work unchanged (docs/design-datavolumes.md).
//!
//! The types decode everything CDI v1beta1 defines; what kubevirt-rs cannot carry out
//! (s3, gcs, imageio, vddk and snapshot sources, archive content) still decodes, so the
//! refusal is a 422 naming the field rather than an "unknown field" prune.

pub mod annotations;
pub mod clone;
pub mod config;
pub mod datavolume;
pub mod phase;
pub mod upload;
pub mod validation;

pub use datavolume::{
    ContentType, DataVolume, DataVolumeCheckpoint, DataVolumeCondition, DataVolumeSource,
    DataVolumeSourceHttp, DataVolumeSourcePvc, DataVolumeSourceRef, DataVolumeSourceRegistry,
    DataVolumeSpec, DataVolumeStatus, RegistryPullMethod, StorageSpec,
};

/// API group of CDI's kinds.
pub const GROUP: &str = "cdi.kubevirt.io";
/// The version served.
pub const VERSION: &str = "v1beta1";
/// `apiVersion` of CDI's kinds.
pub const API_VERSION: &str = "cdi.kubevirt.io/v1beta1";
/// The only kind a DataVolume's `sourceRef` may name.
pub const DATA_SOURCE_KIND: &str = "DataSource";
