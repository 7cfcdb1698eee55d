//! Facts about the host and the prepared volumes, gathered before conversion so that
//! [`crate::domain_for`] does no I/O and is deterministic.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::schema::{DiskFormat, DiskType};

/// How the guest's CPU is executed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    /// KVM hardware virtualisation (`/dev/kvm` probed and working).
    Kvm,
    /// TCG software emulation (KubeVirt's `useEmulation`).
    #[default]
    Tcg,
}

/// How VMI interfaces are realised on this host.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// Drop all interfaces; the guest has no NIC.
    None,
    /// Every interface becomes QEMU user-mode networking (slirp): needs no host
    /// privileges, bridge or tap, and is what the standalone launcher uses for the pod
    /// network's masquerade binding.
    #[default]
    User,
    /// The pod network as KubeVirt does it: the interface on the VMI's pod network is the
    /// tap virt-handler made in the pod ([`HostFacts::pod_tap`]); the guest gets its
    /// address by DHCP from the launcher.
    Pod,
}

/// The tap virt-handler prepared for the VMI's pod-network interface.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodTap {
    /// The VMI interface it belongs to (`default`).
    pub interface: String,
    /// Device name (`tap0`).
    pub device: String,
    /// The guest NIC's MAC: the one the DHCP lease is for.
    pub mac: String,
    /// MTU of the pod network.
    pub mtu: u32,
}

/// A volume made ready on the host (overlay created, ISO written, …).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedVolume {
    /// Path of the file or block device QEMU opens.
    pub path: PathBuf,
    /// Its format.
    pub format: DiskFormat,
    /// File or block device.
    pub kind: DiskType,
    /// Whether it (and the image it is layered on, if any) opens with `O_DIRECT`: a disk
    /// without a cache mode gets `none` when it does and `writethrough` when it does not,
    /// and an explicit `none` is refused without it, as KubeVirt decides.
    #[serde(default)]
    pub direct_io: bool,
}

/// Kernel and initrd of `firmware.kernelBoot`, resolved to host paths.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelBootFiles {
    /// Kernel image.
    pub kernel: Option<PathBuf>,
    /// Initrd.
    pub initrd: Option<PathBuf>,
}

/// Everything the conversion needs to know about the host.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostFacts {
    /// Guest architecture (`x86_64`).
    pub arch: String,
    /// KVM or TCG.
    pub accel: Accel,
    /// QEMU binary; libvirt picks one when unset.
    pub emulator: Option<PathBuf>,
    /// Prepared volumes by VMI volume name.
    pub volumes: BTreeMap<String, PreparedVolume>,
    /// Resolved kernel boot files.
    pub kernel_boot: Option<KernelBootFiles>,
    /// Unix socket QEMU binds for the serial console; a pty when unset.
    pub console_socket: Option<PathBuf>,
    /// File the serial console output is also logged to.
    pub console_log: Option<PathBuf>,
    /// Unix socket QEMU binds for VNC; no graphics when unset.
    pub vnc_socket: Option<PathBuf>,
    /// How interfaces are realised.
    pub network: NetworkMode,
    /// With [`NetworkMode::Pod`]: the pod interface's tap.
    pub pod_tap: Option<PodTap>,
    /// Where an `efi` VM's UEFI variable store goes (libvirt makes it from the firmware's
    /// template); libvirt's own directory when unset. In the launcher's work directory, so
    /// that a migration's path rewrite names the target's, and it goes with the pod.
    #[serde(default)]
    pub nvram: Option<PathBuf>,
}

impl HostFacts {
    /// Facts for an x86_64 host with the given accelerator and nothing prepared.
    pub fn x86_64(accel: Accel) -> Self {
        Self {
            arch: "x86_64".into(),
            accel,
            ..Self::default()
        }
    }
}
