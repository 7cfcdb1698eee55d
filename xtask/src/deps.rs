//! Debian packages the project needs, installed on demand so that a fresh machine
//! (and CI) needs nothing but the repository, Rust and Go.

use std::collections::BTreeSet;
use std::process::Command;

use anyhow::Context;

use crate::Needs;

/// One Debian package and why the project needs it.
#[derive(Debug, Clone, Copy)]
pub struct Package {
    pub name: &'static str,
    pub why: &'static str,
    /// Needed to compile the workspace (build scripts, linking), not only to run things.
    pub build: bool,
}

const fn build(name: &'static str, why: &'static str) -> Package {
    Package {
        name,
        why,
        build: true,
    }
}

const fn run(name: &'static str, why: &'static str) -> Package {
    Package {
        name,
        why,
        build: false,
    }
}

/// Packages for building and testing everything.
pub const PACKAGES: &[Package] = &[
    build("protobuf-compiler", "etcd-client build (protoc)"),
    // protoc's own Recommends, which --no-install-recommends leaves out; without it etcd-client's
    // build fails with "google/protobuf/descriptor.proto: File not found" (fresh-check found it).
    build(
        "libprotobuf-dev",
        "etcd-client build (google/protobuf/*.proto, the well-known types protoc imports)",
    ),
    build("pkg-config", "virt crate build"),
    build("libvirt-dev", "virt crate build"),
    build("gcc", "C parts of ring and virt-sys; the pause image"),
    build("libc6-dev", "linking; the pause image"),
    run(
        "etcd-server",
        "etcd for virt-apiserver and the local cluster",
    ),
    run("libvirt-daemon-system", "libvirt daemons for virt-launcher"),
    run(
        "libvirt-clients",
        "virt-xml-validate: the domain XML golden files are checked against libvirt's schema",
    ),
    // A minimal Debian (debootstrap's minbase, containers) has no /bin/kill; fresh-check found it.
    run("procps", "kill, used by tests and the cluster tooling"),
    // virt-xml-validate runs xmllint, which libvirt-clients does not pull in.
    run("libxml2-utils", "xmllint, which virt-xml-validate runs"),
    run("qemu-system-x86", "QEMU for guests"),
    run(
        "ovmf",
        "UEFI firmware for `efi` VMs (the launcher image's OVMF and libvirt's firmware descriptors) and the Debian guest's UEFI boot test",
    ),
    run("qemu-utils", "qemu-img for overlays and empty disks"),
    run("xorriso", "cloud-init NoCloud ISO"),
    run("busybox-static", "test guest initramfs and test images"),
    run("linux-image-cloud-amd64", "test guest kernel"),
    run("cpio", "test guest initramfs"),
    // The Debian test guest (virt-testguest's debian.rs) is made with these: the guest's own
    // grub (grub-pc-bin inside it, run in its chroot) makes its boot image, so the host needs
    // no grub.
    run("debootstrap", "the Debian 12 test guest's root file system"),
    run(
        "fdisk",
        "sfdisk: the Debian test guest's partition table, written into an image file",
    ),
    run(
        "e2fsprogs",
        "mkfs.ext4 -d: the Debian test guest's root file system, filled without a mount",
    ),
    run(
        "dosfstools",
        "mkfs.fat --offset: the Debian test guest's EFI system partition, made in the image file",
    ),
    run(
        "mtools",
        "mmd/mcopy -i file@@offset: grub's BOOTX64.EFI onto that partition, without a mount",
    ),
    run("containerd", "local cluster container runtime"),
    run("runc", "local cluster OCI runtime"),
    run("containernetworking-plugins", "local cluster pod network"),
    run("buildah", "building images without Docker"),
    run("iptables", "local cluster network isolation"),
    run(
        "nftables",
        "local cluster network isolation; the masquerade binding's rules (virt-netsetup)",
    ),
    run(
        "iproute2",
        "local cluster bridge; the guest's bridge and tap (virt-netsetup)",
    ),
    run("tmux", "interactive console tests"),
    run("dropbear-bin", "the test guest's SSH server"),
    run(
        "openssh-client",
        "ssh and scp for kubectl virt ssh/scp, and scp in the test guest; ssh-keygen and ssh for the Debian test guest's boot test",
    ),
    run(
        "iperf3",
        "cargo xtask bench network (host side and the benchmark guest)",
    ),
    run("curl", "health checks in scripts and e2e tests"),
    run("binutils", "strip for small images"),
    run(
        "dmidecode",
        "libvirtd in the virt-launcher image reads SMBIOS with it",
    ),
];

/// The packages of `names` that are installed, in one dpkg-query call (one per package
/// would add a noticeable pause to every `cargo xtask …`).
pub fn installed(names: &[&str]) -> BTreeSet<String> {
    let Ok(out) = Command::new("dpkg-query")
        .args(["-W", "-f=${Package} ${Status}\n"])
        .args(names)
        .output()
    else {
        return BTreeSet::new();
    };
    // dpkg-query exits 1 when a package was never known, but still reports the others.
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.ends_with("install ok installed"))
        .filter_map(|l| l.split_whitespace().next())
        // Multi-arch packages may be reported as name:arch.
        .map(|p| p.split(':').next().unwrap_or(p).to_string())
        .collect()
}

/// The packages `needs` asks for that are not installed.
pub fn missing(needs: Needs) -> Vec<&'static str> {
    let wanted: Vec<&str> = PACKAGES
        .iter()
        .filter(|p| p.build || needs == Needs::All)
        .map(|p| p.name)
        .collect();
    let have = installed(&wanted);
    wanted.into_iter().filter(|p| !have.contains(*p)).collect()
}

/// Whether this process runs as root (apt-get needs it).
pub fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Installs every missing package `needs` asks for with apt-get (needs root).
pub fn ensure(needs: Needs) -> anyhow::Result<()> {
    let missing = missing(needs);
    if missing.is_empty() {
        return Ok(());
    }
    anyhow::ensure!(
        std::path::Path::new("/usr/bin/apt-get").exists(),
        "missing packages {missing:?} and no apt-get: kubevirt-rs's tooling expects Debian 12"
    );
    anyhow::ensure!(
        is_root(),
        "missing Debian packages {missing:?}; run as root or install them with \
         `apt-get install {}`",
        missing.join(" ")
    );
    install(&missing)
}

/// `apt-get update` and `apt-get install` of `packages`, non-interactively.
pub fn install(packages: &[&str]) -> anyhow::Result<()> {
    eprintln!("==> installing Debian packages: {}", packages.join(" "));
    let status = Command::new("apt-get")
        .args(["update", "-qq"])
        .status()
        .context("running apt-get update")?;
    anyhow::ensure!(status.success(), "apt-get update failed");
    let status = Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(packages)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .context("running apt-get install")?;
    anyhow::ensure!(status.success(), "apt-get install {packages:?} failed");
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_package_is_listed_once() {
        let mut names: Vec<&str> = super::PACKAGES.iter().map(|p| p.name).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(before, names.len(), "a package is listed twice");
    }
}
