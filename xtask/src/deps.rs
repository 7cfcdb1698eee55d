//! Debian packages the project needs, installed on demand so that a fresh machine
//! (and CI) needs nothing but the repository and a Rust toolchain.

use std::process::Command;

use anyhow::Context;

/// Packages for building and testing everything, with why each is needed.
pub const PACKAGES: &[(&str, &str)] = &[
    (
        "etcd-server",
        "etcd for virt-apiserver and the local cluster",
    ),
    ("protobuf-compiler", "etcd-client build"),
    ("pkg-config", "virt crate build"),
    ("libvirt-dev", "virt crate build"),
    ("libvirt-daemon-system", "libvirt daemons for virt-launcher"),
    ("qemu-system-x86", "QEMU for guests"),
    ("qemu-utils", "qemu-img for overlays and empty disks"),
    ("xorriso", "cloud-init NoCloud ISO"),
    ("busybox-static", "test guest initramfs and test images"),
    ("linux-image-cloud-amd64", "test guest kernel"),
    ("cpio", "test guest initramfs"),
    ("containerd", "local cluster container runtime"),
    ("runc", "local cluster OCI runtime"),
    ("containernetworking-plugins", "local cluster pod network"),
    ("buildah", "building images without Docker"),
    ("iptables", "local cluster network isolation"),
    ("nftables", "local cluster network isolation"),
    ("iproute2", "local cluster bridge"),
    ("gcc", "pause image"),
    ("libc6-dev", "pause image"),
    ("tmux", "interactive console tests"),
    ("curl", "health checks in scripts and e2e tests"),
    ("binutils", "strip for small images"),
    (
        "dmidecode",
        "libvirtd in the virt-launcher image reads SMBIOS with it",
    ),
];

fn installed(pkg: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", pkg])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

/// Installs every missing package with apt-get (needs root).
pub fn ensure() -> anyhow::Result<()> {
    let missing: Vec<&str> = PACKAGES
        .iter()
        .map(|(p, _)| *p)
        .filter(|p| !installed(p))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("==> installing Debian packages: {}", missing.join(" "));
    let is_root = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0");
    anyhow::ensure!(
        is_root,
        "missing Debian packages {missing:?}; run as root or install them with apt-get"
    );
    let status = Command::new("apt-get")
        .arg("update")
        .arg("-qq")
        .status()
        .context("running apt-get update")?;
    anyhow::ensure!(status.success(), "apt-get update failed");
    let status = Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .context("running apt-get install")?;
    anyhow::ensure!(status.success(), "apt-get install {missing:?} failed");
    Ok(())
}
