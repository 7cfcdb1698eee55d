//! virt-importer: CDI's worker in kubevirt-rs (docs/design-datavolumes.md, 3.3). `import`
//! fills a claim (`disk.img` in a Filesystem claim's directory, or a block device) from an
//! HTTP(S) source: checksum, format sniff, gzip/xz unpacked in-stream, raw written sparse,
//! other formats converted by qemu-img; the result a typed termination message. `clone`
//! copies one claim's disk into another (a DataVolume's `pvc` source), sparse, the same way.
//! `upload-server` takes the image as an HTTP request body (`virtctl image-upload` through
//! the upload proxy) into the same pipeline as `import`.

pub mod checksum;
pub mod clone;
pub mod convert;
pub mod http;
pub mod import;
pub mod progress;
pub mod result;
pub mod sniff;
pub mod target;
pub mod units;
pub mod upload;

pub use clone::{CloneConfig, CloneOutcome, clone};
pub use import::{Config, Outcome, import};
pub use result::{COMPLETED, ImportError, termination_message};
