//! A real distro test guest: Debian 12 (bookworm) made only from Debian's packages, booted
//! the way a cloud image is (BIOS or UEFI → grub → the cloud kernel → systemd), with cloud-init
//! (NoCloud and ConfigDrive), the QEMU guest agent and an SSH server. The busybox guest of
//! this crate proves the plumbing; this one proves what a user's VM relies on: cloud-init's
//! first-boot semantics, `kubectl virt ssh` to a user cloud-init made, the agent's answers.
//!
//! How it is made, and why so:
//! - `debootstrap --variant=minbase` with the packages of [`PACKAGES`] into a staging
//!   directory (needs root: chroot and device nodes). debootstrap keeps the packages it
//!   downloaded in `<dir>/.debs`, so a rebuild after a change of the configuration below
//!   downloads nothing.
//! - The configuration files (`src/debian/*`) are copied in, documentation, manual pages,
//!   locales and apt's caches are dropped, the SSH host keys and the machine id removed
//!   (cloud-init and systemd make new ones on the first boot of each instance).
//! - The disk is hybrid, laid out as Debian's own cloud images are, and made without a loop
//!   device, a mount or udev, all of which a container or a chroot may lack: `sfdisk`
//!   writes a GPT into a sparse 2 GiB file with a BIOS boot partition (14, 3 MiB from
//!   1 MiB), an EFI system partition (15, 124 MiB) and the root (1, the rest from 128 MiB,
//!   last on the disk so that growpart can grow it). `mkfs.ext4 -d ROOT -E offset=…` fills
//!   the root from the staging directory; `mkfs.fat --offset` and mtools' `file@@offset`
//!   make and fill the EFI system partition.
//! - BIOS: grub is put where `grub-install --target=i386-pc` would put it on a GPT disk:
//!   its `boot.img` in the protective MBR's first 440 bytes and a `core.img` (made by the
//!   guest's own `grub-mkimage`, so modules and image are of one version) in the BIOS boot
//!   partition, with the two sector numbers `grub-bios-setup` patches: where `boot.img`
//!   finds `core.img`'s first sector, and where that sector finds the rest.
//! - UEFI: `EFI/BOOT/BOOTX64.EFI` on the EFI system partition, the removable-media path
//!   firmware boots without any boot entry in its NVRAM, is a grub `x86_64-efi` image made
//!   the same way. Both images find the root file system by its UUID and read
//!   `/boot/grub/grub.cfg` there, with their modules in `/boot/grub/{i386-pc,x86_64-efi}`.
//! - `qemu-img convert -c` makes the compressed qcow2 (zlib, which every QEMU reads).
//!
//! The network is configured as in Debian 12's own cloud images: cloud-init renders
//! ifupdown's `/etc/network/interfaces.d/50-cloud-init` (its first choice when `ifup`
//! exists) and `isc-dhcp-client` takes the address.
//!
//! The boot test (`tests/debian.rs`) needs root and about ten minutes:
//! `cargo test -p virt-testguest --test debian -- --ignored --nocapture`.

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

/// The Debian release.
pub const SUITE: &str = "bookworm";

/// Where debootstrap fetches the packages.
pub const MIRROR: &str = "http://deb.debian.org/debian";

/// What is installed on top of debootstrap's minbase.
pub const PACKAGES: &[&str] = &[
    "systemd",
    "systemd-sysv",
    "udev",
    // hostnamectl, loginctl and `systemctl` as a user talk to systemd over D-Bus.
    "dbus",
    "libpam-systemd",
    "cloud-init",
    // debootstrap does not resolve virtual packages: python3-cryptography (cloud-init's)
    // depends on python3-cffi-backend-api-*, which only this package provides.
    "python3-cffi-backend",
    "qemu-guest-agent",
    "openssh-server",
    "sudo",
    "linux-image-cloud-amd64",
    "grub-pc-bin",
    // grub-mkimage -O x86_64-efi and its modules: the UEFI boot image.
    "grub-efi-amd64-bin",
    "e2fsprogs",
    // growpart: cloud-init grows the root partition to a bigger disk (a claim larger
    // than the image), as on a cloud image.
    "cloud-guest-utils",
    "iproute2",
    "ifupdown",
    "isc-dhcp-client",
    "netbase",
    "ca-certificates",
];

/// Kernel command line: the login prompt on the serial port (`console=ttyS0` last, so it
/// is `/dev/console`), and `no_timer_check` as cloud images boot: under TCG the kernel's
/// check that the timer ticks while it busy-waits can fail on a loaded host.
pub const KERNEL_ARGS: &str = "console=tty0 console=ttyS0,115200 no_timer_check";

/// The disk's virtual size: what Debian's own generic cloud image has.
pub const DISK_BYTES: u64 = 2 << 30;

/// Sector size of the disk image.
const SECTOR: u64 = 512;

/// The BIOS boot partition (GPT partition 14, as in Debian's cloud images): where grub's
/// core image lives on a GPT disk. From 1 MiB, as partitioning tools align.
const BIOS_BOOT_START: u64 = 1 << 20;
/// 3 MiB, as Debian's cloud images have it (`core.img` fills a small part of it; its
/// size is checked when it is made).
const BIOS_BOOT_BYTES: u64 = 3 << 20;

/// The EFI system partition (GPT partition 15): 124 MiB of FAT32, as Debian's cloud images.
const ESP_START: u64 = BIOS_BOOT_START + BIOS_BOOT_BYTES;
const ESP_BYTES: u64 = 124 << 20;

/// Where the root partition (GPT partition 1) starts: 128 MiB.
const ROOT_START: u64 = ESP_START + ESP_BYTES;
/// The rest of the disk but its last MiB, which holds the backup GPT (the disk's last 33
/// sectors) and stays free as sfdisk aligns a partition's end.
const ROOT_BYTES: u64 = DISK_BYTES - ROOT_START - (1 << 20);

/// GPT partition type GUIDs.
const GPT_BIOS_BOOT: &str = "21686148-6449-6E6F-744E-656564454649";
const GPT_ESP: &str = "C12A7328-F81F-11D2-BA4B-00A0C93EC3B8";
const GPT_LINUX: &str = "0FC63DAF-8483-4772-8E79-3D69D8477DE4";

/// Where UEFI firmware looks for a bootloader when its NVRAM names none (removable-media
/// path), so a fresh VM's empty variable store boots the disk.
const EFI_BOOT_PATH: &str = "EFI/BOOT/BOOTX64.EFI";

/// grub's `boot.img`: the 8-byte LBA of `core.img`'s first sector (`kernel_sector`,
/// GRUB_BOOT_MACHINE_KERNEL_SECTOR in grub's `i386/pc/boot.h`).
const BOOT_IMG_KERNEL_SECTOR: usize = 0x5c;
/// `core.img`'s first sector (diskboot.img): its block list's 8-byte start LBA, 12 bytes
/// before the sector's end (start, 2-byte length, 2-byte segment); grub-mkimage fills the
/// length, grub-bios-setup the start.
const DISKBOOT_BLOCKLIST_START: usize = 0x200 - 12;

/// Where a containerDisk image holds its disk (KubeVirt: the only file in `/disk`).
pub const CONTAINER_DISK_PATH: &str = "/disk/disk.qcow2";

/// KubeVirt's `qemu` user and group, who must be able to read a containerDisk's disk.
pub const QEMU_UID: u32 = 107;

/// The mode KubeVirt's documentation asks for a containerDisk's disk: read-only, for its
/// owner (`qemu`) and group.
pub const CONTAINER_DISK_MODE: u32 = 0o440;

/// Bumped whenever the build steps below change in a way the stamp's other inputs do not
/// show (what is deleted, how the disk is laid out).
const BUILDER_VERSION: &str = "2";

const CLOUD_CFG: &str = include_str!("debian/cloud.cfg");
const GRUB_CFG: &str = include_str!("debian/grub.cfg");
const EARLY_GRUB_CFG: &str = include_str!("debian/early-grub.cfg");
const DPKG_NODOC: &str = include_str!("debian/dpkg-nodoc.cfg");
const SOURCES_LIST: &str = include_str!("debian/sources.list");
const HOSTS: &str = include_str!("debian/hosts");

/// Units the image does not start: `e2scrub_reap` took 17 s of the single vCPU of a TCG
/// boot for nothing (it cleans up LVM snapshots, and the guest has no LVM); the apt timers
/// would fetch package lists at random times in the middle of tests.
const DISABLED_UNITS: &[&str] = &[
    "multi-user.target.wants/e2scrub_reap.service",
    "timers.target.wants/e2scrub_all.timer",
    "timers.target.wants/apt-daily.timer",
    "timers.target.wants/apt-daily-upgrade.timer",
];

/// Holds the hash of the build's inputs.
const STAMP: &str = ".stamp";

/// Errors while building or booting the Debian guest.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// debootstrap chroots and makes device nodes.
    #[error("building the Debian guest needs root (debootstrap chroots into the new system)")]
    NotRoot,
    /// A program the build needs is not installed.
    #[error("{what} not found ({hint})")]
    Missing {
        /// What is missing.
        what: String,
        /// How to get it.
        hint: &'static str,
    },
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A tool exited with an error.
    #[error("{tool} failed: {stderr}")]
    Tool {
        /// The tool.
        tool: String,
        /// Its error output.
        stderr: String,
    },
    /// The guest did not do something in time.
    #[error("{what} within {timeout:?}; the serial console's last lines:\n{console}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        timeout: Duration,
        /// The end of the serial console.
        console: String,
    },
}

fn io<T>(path: &Path, r: std::io::Result<T>) -> Result<T, Error> {
    r.map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Runs `cmd`, naming `tool` in errors; `hint` says which package brings it.
fn run(tool: &str, hint: &'static str, cmd: &mut Command) -> Result<String, Error> {
    let out = cmd.output().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::Missing {
            what: tool.into(),
            hint,
        },
        _ => Error::Tool {
            tool: tool.into(),
            stderr: e.to_string(),
        },
    })?;
    if !out.status.success() {
        return Err(Error::Tool {
            tool: tool.into(),
            stderr: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
            .trim()
            .into(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The files of a built Debian guest.
#[derive(Clone, Debug)]
pub struct DebianGuest {
    /// The directory holding them.
    pub dir: PathBuf,
    /// The bootable compressed qcow2 (what a claim or a containerDisk holds).
    pub disk: PathBuf,
}

impl DebianGuest {
    /// The guest under `dir`, whether built or not.
    pub fn at(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
            disk: dir.join("disk.qcow2"),
        }
    }

    /// Whether the disk exists and was built from the current inputs.
    pub fn is_built(&self) -> bool {
        self.disk.is_file()
            && fs::read_to_string(self.dir.join(STAMP)).is_ok_and(|s| s.trim() == stamp())
    }
}

/// `target/guest-debian` of the workspace that contains this crate (beside the busybox
/// guest's `target/guest`).
pub fn default_dir() -> PathBuf {
    crate::default_dir().with_file_name("guest-debian")
}

/// The SHA-256 of everything the image is made from.
fn stamp() -> String {
    let mut h = Sha256::new();
    for part in [
        BUILDER_VERSION,
        SUITE,
        MIRROR,
        &PACKAGES.join(" "),
        KERNEL_ARGS,
        &DISK_BYTES.to_string(),
        &DISABLED_UNITS.join(" "),
        CLOUD_CFG,
        GRUB_CFG,
        EARLY_GRUB_CFG,
        DPKG_NODOC,
        SOURCES_LIST,
        HOSTS,
    ] {
        // Length-prefixed, so that moving text from one input to the next changes the hash.
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    hex::encode(h.finalize())
}

/// Builds the guest into `dir` unless it is already there from the same inputs. Safe to
/// call from several processes at once: the build holds a lock file in `dir`.
pub fn ensure(dir: &Path) -> Result<DebianGuest, Error> {
    let g = DebianGuest::at(dir);
    if g.is_built() {
        return Ok(g);
    }
    io(dir, fs::create_dir_all(dir))?;
    let lock_path = dir.join(".build-lock");
    let lock = io(&lock_path, fs::File::create(&lock_path))?;
    io(&lock_path, lock.lock())?;
    // Another caller may have built it while this one waited for the lock.
    if g.is_built() { Ok(g) } else { build(dir) }
}

/// Whether this process runs as root (effective uid 0).
fn is_root() -> bool {
    fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1))
            == Some("0")
    })
}

/// Builds the guest into `dir`, replacing what is there (the downloaded packages in
/// `dir/.debs` are kept).
pub fn build(dir: &Path) -> Result<DebianGuest, Error> {
    if !is_root() {
        return Err(Error::NotRoot);
    }
    let g = DebianGuest::at(dir);
    io(dir, fs::create_dir_all(dir))?;
    // A stamp left from an older build must not vouch for a half-made disk.
    let stamp_path = dir.join(STAMP);
    let _ = fs::remove_file(&stamp_path);
    let staging = dir.join(".staging");
    remove_staging(&staging)?;
    let debs = dir.join(".debs");
    io(&debs, fs::create_dir_all(&debs))?;
    let root = staging.join("root");
    debootstrap(&root, &debs)?;
    let uuid = new_uuid()?;
    configure(&root, &uuid)?;
    trim(&root)?;
    let images = grub_images(&root, &uuid)?;
    let raw = staging.join("disk.raw");
    make_disk(&raw, &root, &uuid, images)?;
    let tmp = dir.join(".disk.qcow2.tmp");
    run(
        "qemu-img",
        "apt-get install qemu-utils",
        Command::new("qemu-img")
            .args(["convert", "-q", "-c", "-f", "raw", "-O", "qcow2"])
            .arg(&raw)
            .arg(&tmp),
    )?;
    io(&g.disk, fs::rename(&tmp, &g.disk))?;
    remove_staging(&staging)?;
    io(&stamp_path, fs::write(&stamp_path, stamp() + "\n"))?;
    Ok(g)
}

/// Removes the staging directory, first unmounting what an interrupted debootstrap may
/// have left mounted in it (`/proc`, `/sys`): removing files through such a mount would
/// reach the host's.
fn remove_staging(staging: &Path) -> Result<(), Error> {
    if !staging.exists() {
        return Ok(());
    }
    let canonical = io(staging, staging.canonicalize())?;
    let mountinfo = io(
        Path::new("/proc/self/mountinfo"),
        fs::read_to_string("/proc/self/mountinfo"),
    )?;
    let mut mounts: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mountinfo)
        .filter(|p| p.starts_with(&canonical))
        .collect();
    // Deepest first: a mount inside another must go before it.
    mounts.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    for m in mounts {
        run(
            "umount",
            "apt-get install mount",
            Command::new("umount").arg("--lazy").arg(&m),
        )?;
    }
    io(staging, fs::remove_dir_all(staging))
}

/// mountinfo writes space, tab, newline and backslash in paths as `\ooo` octal escapes.
fn unescape_mountinfo(field: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b.get(i + 1..i + 4).and_then(|d| {
            std::str::from_utf8(d)
                .ok()
                .and_then(|s| u8::from_str_radix(s, 8).ok())
        });
        match (b[i], octal) {
            (b'\\', Some(c)) => {
                out.push(c);
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

fn debootstrap(root: &Path, debs: &Path) -> Result<(), Error> {
    let mut cmd = Command::new("debootstrap");
    cmd.args(["--variant=minbase", "--merged-usr"])
        .arg(format!("--cache-dir={}", debs.display()))
        .arg(format!("--include={}", PACKAGES.join(",")))
        .arg(SUITE)
        .arg(root)
        .arg(MIRROR)
        // Package scripts must not ask questions (there is no one to answer).
        .env("DEBIAN_FRONTEND", "noninteractive");
    match run("debootstrap", "apt-get install debootstrap", &mut cmd) {
        Ok(_) => Ok(()),
        Err(Error::Tool { tool, stderr }) => {
            // debootstrap's own output only points at its log; the cause is at its end.
            let log = fs::read_to_string(root.join("debootstrap/debootstrap.log"))
                .map(|l| last_lines(&l, 30))
                .unwrap_or_default();
            Err(Error::Tool {
                tool,
                stderr: format!("{}\n{log}", last_lines(&stderr, 10)),
            })
        }
        Err(e) => Err(e),
    }
}

/// The last `n` lines of `text`.
pub fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn new_uuid() -> Result<String, Error> {
    let p = Path::new("/proc/sys/kernel/random/uuid");
    Ok(io(p, fs::read_to_string(p))?.trim().to_string())
}

fn write(root: &Path, rel: &str, text: &str) -> Result<(), Error> {
    let p = root.join(rel);
    if let Some(parent) = p.parent() {
        io(parent, fs::create_dir_all(parent))?;
    }
    // debootstrap copied some of these from the host (resolv.conf, hosts, hostname): remove
    // first, in case one is a symlink that would lead the write out of the root.
    remove_if_exists(&p)?;
    io(&p, fs::write(&p, text))
}

fn remove_if_exists(p: &Path) -> Result<(), Error> {
    match fs::remove_file(p) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::Io {
            path: p.to_path_buf(),
            source: e,
        }),
        _ => Ok(()),
    }
}

fn configure(root: &Path, uuid: &str) -> Result<(), Error> {
    write(root, "etc/cloud/cloud.cfg.d/90_kubevirt-rs.cfg", CLOUD_CFG)?;
    write(root, "etc/dpkg/dpkg.cfg.d/90_kubevirt-rs-nodoc", DPKG_NODOC)?;
    write(root, "etc/apt/sources.list", SOURCES_LIST)?;
    write(root, "etc/hosts", HOSTS)?;
    // cloud-init sets the instance's; this is the name until then (debootstrap copied the
    // host's).
    write(root, "etc/hostname", "debian\n")?;
    // dhclient writes it from the lease; debootstrap copied the host's.
    write(root, "etc/resolv.conf", "")?;
    write(
        root,
        "etc/fstab",
        &format!("UUID={uuid} / ext4 rw,discard,errors=remount-ro 0 1\n"),
    )?;
    // Empty: systemd makes a new machine id on each instance's first boot (an image with
    // one would give every VM the same, and the same DHCP client id).
    write(root, "etc/machine-id", "")?;
    remove_if_exists(&root.join("var/lib/dbus/machine-id"))?;
    // Every VM of the image would share them; cloud-init makes new ones on first boot.
    let ssh = root.join("etc/ssh");
    for e in io(&ssh, fs::read_dir(&ssh))?.filter_map(|e| e.ok()) {
        if e.file_name().to_string_lossy().starts_with("ssh_host_") {
            remove_if_exists(&e.path())?;
        }
    }
    for unit in DISABLED_UNITS {
        remove_if_exists(&root.join("etc/systemd/system").join(unit))?;
    }
    // grub's modules where grub-install would copy them, so that the boot images stay
    // small and the `insmod`s of grub.cfg find them, for either firmware.
    for platform in GRUB_PLATFORMS {
        let modules = root.join("usr/lib/grub").join(platform);
        let dst = root.join("boot/grub").join(platform);
        io(&dst, fs::create_dir_all(&dst))?;
        for e in io(&modules, fs::read_dir(&modules))?.filter_map(|e| e.ok()) {
            let name = e.file_name();
            let n = name.to_string_lossy();
            if n.ends_with(".mod") || n.ends_with(".lst") {
                io(&e.path(), fs::copy(e.path(), dst.join(&name)))?;
            }
        }
    }
    let grub_cfg = GRUB_CFG
        .replace("@UUID@", uuid)
        .replace("@ARGS@", KERNEL_ARGS);
    write(root, "boot/grub/grub.cfg", &grub_cfg)
}

/// Removes what a VM never reads: documentation (but the copyright files), manual pages,
/// translations, apt's package lists and caches (the guest fetches fresh lists with
/// `apt-get update`), logs of the build.
fn trim(root: &Path) -> Result<(), Error> {
    let doc = root.join("usr/share/doc");
    for e in io(&doc, fs::read_dir(&doc))?.filter_map(|e| e.ok()) {
        let p = e.path();
        if io(&p, e.file_type())?.is_dir() {
            for f in io(&p, fs::read_dir(&p))?.filter_map(|e| e.ok()) {
                if f.file_name() != "copyright" {
                    remove_any(&f.path())?;
                }
            }
        } else {
            remove_any(&p)?;
        }
    }
    for (dir, keep) in [
        ("usr/share/man", None),
        ("usr/share/info", None),
        ("usr/share/lintian", None),
        ("usr/share/locale", Some("locale.alias")),
        ("var/lib/apt/lists", Some("lock")),
        ("var/cache/apt", None),
        ("tmp", None),
    ] {
        let d = root.join(dir);
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for e in entries.filter_map(|e| e.ok()) {
            if keep.is_some_and(|k| e.file_name() == k) {
                continue;
            }
            remove_any(&e.path())?;
        }
    }
    // Keep the directories of var/log: services expect them (journald's, apt's).
    remove_files(&root.join("var/log"))?;
    for old in [
        "var/cache/debconf/config.dat-old",
        "var/cache/debconf/templates.dat-old",
    ] {
        remove_if_exists(&root.join(old))?;
    }
    Ok(())
}

fn remove_any(p: &Path) -> Result<(), Error> {
    let meta = io(p, fs::symlink_metadata(p))?;
    if meta.is_dir() {
        io(p, fs::remove_dir_all(p))
    } else {
        io(p, fs::remove_file(p))
    }
}

fn remove_files(dir: &Path) -> Result<(), Error> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(());
    };
    for e in entries.filter_map(|e| e.ok()) {
        if io(&e.path(), e.file_type())?.is_dir() {
            remove_files(&e.path())?;
        } else {
            io(&e.path(), fs::remove_file(e.path()))?;
        }
    }
    Ok(())
}

/// grub's platforms in the image: BIOS and 64-bit UEFI.
const GRUB_PLATFORMS: [&str; 2] = ["i386-pc", "x86_64-efi"];

/// The two boot images of the disk.
struct BootImages {
    /// grub's BIOS core image, for the BIOS boot partition.
    bios_core: Vec<u8>,
    /// grub's UEFI application, for the EFI system partition.
    efi: Vec<u8>,
}

/// grub's boot images, made by the guest's own grub-mkimage (run in the chroot) so that
/// they match the modules in the image. Each holds only what it needs to find the root
/// file system by UUID on a GPT disk; the rest loads from `/boot/grub/<platform>`.
fn grub_images(root: &Path, uuid: &str) -> Result<BootImages, Error> {
    let early = root.join("tmp/early-grub.cfg");
    io(
        &early,
        fs::write(&early, EARLY_GRUB_CFG.replace("@UUID@", uuid)),
    )?;
    let mkimage = |format: &str, platform: &str, disk_module: Option<&str>| {
        let out = root.join("tmp/grub.img");
        let mut cmd = Command::new("chroot");
        cmd.arg(root)
            .args(["grub-mkimage", "-O", format, "-d"])
            .arg(format!("/usr/lib/grub/{platform}"))
            .args(["-c", "/tmp/early-grub.cfg", "-o", "/tmp/grub.img"])
            .args(["-p", "/boot/grub"])
            .args(disk_module)
            .args(["part_gpt", "ext2", "search_fs_uuid"]);
        run(
            "grub-mkimage",
            "the guest's grub-pc-bin and grub-efi-amd64-bin; chroot is in coreutils",
            &mut cmd,
        )?;
        let img = io(&out, fs::read(&out))?;
        io(&out, fs::remove_file(&out))?;
        Ok::<_, Error>(img)
    };
    // UEFI reads disks through the firmware's own drivers: no disk module.
    let efi = mkimage("x86_64-efi", "x86_64-efi", None)?;
    let bios_core = mkimage("i386-pc", "i386-pc", Some("biosdisk"))?;
    io(&early, fs::remove_file(&early))?;
    if bios_core.len() as u64 > BIOS_BOOT_BYTES {
        return Err(Error::Tool {
            tool: "grub-mkimage".into(),
            stderr: format!(
                "core.img is {} bytes, more than the BIOS boot partition's {BIOS_BOOT_BYTES}",
                bios_core.len(),
            ),
        });
    }
    Ok(BootImages { bios_core, efi })
}

/// The sfdisk script of the disk's GPT: Debian's cloud image layout (partition numbers
/// 14, 15, 1; the root last on the disk, so that growpart can grow it into a bigger disk).
fn gpt_script(disk_name: &str) -> String {
    let sectors = |bytes: u64| bytes / SECTOR;
    format!(
        "label: gpt\n\
         {disk_name}14 : start={}, size={}, type={GPT_BIOS_BOOT}, name=\"BIOS boot\"\n\
         {disk_name}15 : start={}, size={}, type={GPT_ESP}, name=\"EFI system\"\n\
         {disk_name}1 : start={}, size={}, type={GPT_LINUX}, name=\"root\"\n",
        sectors(BIOS_BOOT_START),
        sectors(BIOS_BOOT_BYTES),
        sectors(ESP_START),
        sectors(ESP_BYTES),
        sectors(ROOT_START),
        sectors(ROOT_BYTES),
    )
}

/// Puts into grub's `boot.img` and `core.img` the sector numbers `grub-bios-setup` writes
/// for a core image in a BIOS boot partition: `boot.img` loads `core.img`'s first sector
/// from `start_lba`, and that sector loads the rest from the sector after it (the length
/// grub-mkimage already wrote).
fn patch_bios_boot(boot_img: &mut [u8], core: &mut [u8], start_lba: u64) -> Result<(), Error> {
    let bad = |what: &str| Error::Tool {
        tool: "grub-bios-setup's patch".into(),
        stderr: format!("{what} is too short"),
    };
    boot_img
        .get_mut(BOOT_IMG_KERNEL_SECTOR..BOOT_IMG_KERNEL_SECTOR + 8)
        .ok_or_else(|| bad("boot.img"))?
        .copy_from_slice(&start_lba.to_le_bytes());
    core.get_mut(DISKBOOT_BLOCKLIST_START..DISKBOOT_BLOCKLIST_START + 8)
        .ok_or_else(|| bad("core.img"))?
        .copy_from_slice(&(start_lba + 1).to_le_bytes());
    Ok(())
}

/// Writes the bootable raw disk: the GPT, the ext4 root from `root`, grub for BIOS in the
/// protective MBR and the BIOS boot partition, grub for UEFI on the EFI system partition.
fn make_disk(raw: &Path, root: &Path, uuid: &str, images: BootImages) -> Result<(), Error> {
    let f = io(raw, fs::File::create(raw))?;
    io(raw, f.set_len(DISK_BYTES))?;
    drop(f);
    let mut sfdisk = io(
        raw,
        Command::new("sfdisk")
            .arg("--quiet")
            .arg(raw)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn(),
    )
    .map_err(|_| Error::Missing {
        what: "sfdisk".into(),
        hint: "apt-get install fdisk",
    })?;
    if let Some(mut stdin) = sfdisk.stdin.take() {
        // sfdisk numbers a partition after the digits that end its name.
        let table = gpt_script(&raw.to_string_lossy());
        io(raw, stdin.write_all(table.as_bytes()))?;
    }
    let o = io(raw, sfdisk.wait_with_output())?;
    if !o.status.success() {
        return Err(Error::Tool {
            tool: "sfdisk".into(),
            stderr: String::from_utf8_lossy(&o.stderr).into(),
        });
    }
    let root_kib = ROOT_BYTES / 1024;
    run(
        "mkfs.ext4",
        "apt-get install e2fsprogs",
        Command::new("mkfs.ext4")
            .args(["-q", "-F", "-L", "root", "-U", uuid])
            .arg("-E")
            .arg(format!("offset={ROOT_START}"))
            .arg("-d")
            .arg(root)
            .arg(raw)
            .arg(format!("{root_kib}k")),
    )?;
    make_esp(raw, uuid, &images.efi)?;
    let boot_img_path = root.join("usr/lib/grub/i386-pc/boot.img");
    let mut boot_img = io(&boot_img_path, fs::read(&boot_img_path))?;
    let mut core = images.bios_core;
    patch_bios_boot(&mut boot_img, &mut core, BIOS_BOOT_START / SECTOR)?;
    // 440 bytes: the rest of the MBR is the disk signature and the protective partition
    // table sfdisk wrote.
    let code = boot_img.get(..440).ok_or_else(|| Error::Tool {
        tool: "grub boot.img".into(),
        stderr: format!("{} bytes, expected 512", boot_img.len()),
    })?;
    let f = io(raw, fs::OpenOptions::new().write(true).open(raw))?;
    io(raw, f.write_all_at(code, 0))?;
    io(raw, f.write_all_at(&core, BIOS_BOOT_START))?;
    io(raw, f.sync_all())
}

/// Makes the EFI system partition's FAT32 in place (`mkfs.fat --offset`, mtools'
/// `file@@offset`: no loop device) with grub's UEFI image at the removable-media path.
fn make_esp(raw: &Path, uuid: &str, efi: &[u8]) -> Result<(), Error> {
    // The FAT volume id: from the root's UUID, so one build's two file systems go together.
    let volume_id: String = uuid.chars().filter(|c| *c != '-').take(8).collect();
    run(
        "mkfs.fat",
        "apt-get install dosfstools",
        Command::new("mkfs.fat")
            .arg("--offset")
            .arg((ESP_START / SECTOR).to_string())
            // One sector per cluster: FAT32 needs 65525 clusters, 124 MiB has 253952.
            .args(["-F", "32", "-S", "512", "-s", "1", "-n", "EFI", "-i"])
            .arg(&volume_id)
            .arg(raw)
            .arg((ESP_BYTES / 1024).to_string()),
    )?;
    let image = format!("{}@@{ESP_START}", raw.display());
    let efi_file = raw.with_file_name("BOOTX64.EFI");
    io(&efi_file, fs::write(&efi_file, efi))?;
    let mtools = |tool: &str, args: &[&str]| {
        run(
            tool,
            "apt-get install mtools",
            Command::new(tool)
                .arg("-i")
                .arg(&image)
                .args(args)
                // mtools checks a FAT's geometry against a floppy's; this one is a partition.
                .env("MTOOLS_SKIP_CHECK", "1"),
        )
    };
    mtools("mmd", &["::EFI", "::EFI/BOOT"])?;
    let dst = format!("::{EFI_BOOT_PATH}");
    mtools("mcopy", &[&efi_file.to_string_lossy(), &dst])?;
    io(&efi_file, fs::remove_file(&efi_file))
}

/// A file of a containerDisk image: where it is on the host, where it goes in the image,
/// and whose it is there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImageEntry {
    /// The file on the host.
    pub host: PathBuf,
    /// Its path in the image.
    pub image: String,
    /// Owner and group in the image.
    pub uid: u32,
    /// Group in the image.
    pub gid: u32,
    /// Permission bits in the image.
    pub mode: u32,
}

/// The guest as a containerDisk image's content, in KubeVirt's layout: the qcow2 as
/// `/disk/disk.qcow2`, owned by `qemu` (107:107), mode 0440.
pub fn container_disk_files(g: &DebianGuest) -> Vec<ImageEntry> {
    vec![ImageEntry {
        host: g.disk.clone(),
        image: CONTAINER_DISK_PATH.into(),
        uid: QEMU_UID,
        gid: QEMU_UID,
        mode: CONTAINER_DISK_MODE,
    }]
}

/// Writes [`container_disk_files`] as a tar archive at `out` (an image layer: owners and
/// modes as KubeVirt asks, `/disk` itself root's and 0755 as a Dockerfile's `ADD` makes
/// it), for image builders that copy files as root-owned (buildah's `copy`) but unpack
/// archives as they are (`add`).
pub fn container_disk_tar(g: &DebianGuest, out: &Path) -> Result<(), Error> {
    let staging = g.dir.join(".containerdisk");
    if staging.exists() {
        io(&staging, fs::remove_dir_all(&staging))?;
    }
    let disk_dir = staging.join("disk");
    io(&disk_dir, fs::create_dir_all(&disk_dir))?;
    let tmp = out.with_extension("tar.tmp");
    let result = (|| {
        for entry in container_disk_files(g) {
            let rel = entry.image.trim_start_matches('/');
            // A hard link: the tar gets the file's bytes, the owner and mode come from
            // tar's options, and the host's qcow2 keeps its own.
            let link = staging.join(rel);
            io(&link, fs::hard_link(&entry.host, &link))?;
        }
        let tar = |args: &[String]| {
            run(
                "tar",
                "apt-get install tar",
                Command::new("tar")
                    .arg("--file")
                    .arg(&tmp)
                    .arg("--directory")
                    .arg(&staging)
                    .args(["--numeric-owner", "--sort=name", "--mtime=@0"])
                    .args(args),
            )
        };
        tar(&[
            "--create".into(),
            "--no-recursion".into(),
            "--owner=0".into(),
            "--group=0".into(),
            "--mode=0755".into(),
            "disk".into(),
        ])?;
        for entry in container_disk_files(g) {
            tar(&[
                "--append".into(),
                format!("--owner={}", entry.uid),
                format!("--group={}", entry.gid),
                format!("--mode={:o}", entry.mode),
                entry.image.trim_start_matches('/').into(),
            ])?;
        }
        io(out, fs::rename(&tmp, out))
    })();
    let _ = fs::remove_dir_all(&staging);
    let _ = fs::remove_file(&tmp);
    result
}

/// Writes a NoCloud seed ISO (volume label `cidata`, as the launcher makes them) holding
/// `meta-data` and `user-data`, at `iso`.
pub fn nocloud_iso(iso: &Path, meta_data: &str, user_data: &str) -> Result<(), Error> {
    let dir = iso.with_extension("cidata");
    if dir.exists() {
        io(&dir, fs::remove_dir_all(&dir))?;
    }
    io(&dir, fs::create_dir_all(&dir))?;
    for (name, text) in [("meta-data", meta_data), ("user-data", user_data)] {
        let p = dir.join(name);
        io(&p, fs::write(&p, text))?;
    }
    run(
        "xorriso",
        "apt-get install xorriso",
        Command::new("xorriso")
            .args([
                "-as", "mkisofs", "-quiet", "-volid", "cidata", "-joliet", "-rock", "-output",
            ])
            .arg(iso)
            .arg(&dir),
    )?;
    io(&dir, fs::remove_dir_all(&dir))
}

/// The Debian guest under bare QEMU (TCG): its disk (an overlay, so that the image stays
/// as built), a seed ISO, user networking with the guest's port 22 forwarded from
/// `127.0.0.1:ssh_port`, and the guest agent's virtio-serial channel on a unix socket.
/// Killed on drop.
pub struct Vm {
    child: std::process::Child,
    console: Arc<(Mutex<Vec<u8>>, Condvar)>,
    started: Instant,
}

/// What a [`Vm`] boots.
#[derive(Clone, Debug)]
pub struct VmConfig<'a> {
    /// The qcow2 the guest boots from (writable).
    pub disk: &'a Path,
    /// A NoCloud seed ISO, if any.
    pub seed: Option<&'a Path>,
    /// The loopback port forwarded to the guest's SSH server.
    pub ssh_port: u16,
    /// Where QEMU listens for the guest agent's channel.
    pub agent_socket: &'a Path,
    /// Guest memory in MiB.
    pub memory_mib: u32,
    /// BIOS or UEFI: the disk boots under both.
    pub firmware: Firmware<'a>,
}

/// Debian's OVMF (package `ovmf`) without Secure Boot, the 4 MiB flash layout its QEMU
/// firmware descriptor (`/usr/share/qemu/firmware/60-edk2-x86_64.json`) names too.
pub const OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.fd";
/// The empty UEFI variable store that goes with [`OVMF_CODE`].
pub const OVMF_VARS: &str = "/usr/share/OVMF/OVMF_VARS_4M.fd";

/// The firmware a [`Vm`] boots with.
#[derive(Clone, Copy, Debug)]
pub enum Firmware<'a> {
    /// SeaBIOS, QEMU's default: grub's `boot.img` in the MBR, `core.img` in the BIOS boot
    /// partition.
    Bios,
    /// OVMF, Secure Boot off: grub's `BOOTX64.EFI` from the EFI system partition. `vars`
    /// is the VM's own variable store (what libvirt keeps as the domain's NVRAM), copied
    /// from [`OVMF_VARS`] when absent, so that a second boot sees what the first wrote.
    Uefi {
        /// The writable variable store.
        vars: &'a Path,
    },
}

/// Whether `path` opens with `O_DIRECT` (QEMU's cache mode `none` needs it).
fn opens_direct(path: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_DIRECT)
        .open(path)
        .is_ok()
}

impl Vm {
    /// Starts QEMU.
    pub fn start(c: &VmConfig<'_>) -> Result<Self, Error> {
        let started = Instant::now();
        let mut cmd = Command::new("qemu-system-x86_64");
        cmd.args(["-accel", "tcg", "-M", "q35", "-smp", "1"])
            .args(["-m", &c.memory_mib.to_string()])
            .args(["-nographic", "-nodefaults", "-no-user-config"])
            .args(["-serial", "stdio", "-monitor", "none"])
            .arg("-drive")
            // As the launcher's domain has it (node/domain): no host page cache where the
            // file system takes O_DIRECT, so a comparison with the cluster is on equal terms.
            .arg(format!(
                "file={},format=qcow2,if=virtio,cache={}",
                c.disk.display(),
                if opens_direct(c.disk) {
                    "none"
                } else {
                    "writethrough"
                }
            ));
        if let Firmware::Uefi { vars } = c.firmware {
            if !Path::new(OVMF_CODE).is_file() {
                return Err(Error::Missing {
                    what: OVMF_CODE.into(),
                    hint: "apt-get install ovmf",
                });
            }
            if !vars.exists() {
                io(vars, fs::copy(OVMF_VARS, vars))?;
            }
            // QEMU's file names in -drive are comma-separated options: a path with a comma
            // would need doubling, which these (ours and Debian's) do not have.
            cmd.arg("-drive")
                .arg(format!(
                    "if=pflash,unit=0,format=raw,readonly=on,file={OVMF_CODE}"
                ))
                .arg("-drive")
                .arg(format!(
                    "if=pflash,unit=1,format=raw,file={}",
                    vars.display()
                ));
        }
        if let Some(seed) = c.seed {
            cmd.arg("-drive").arg(format!(
                "file={},format=raw,if=virtio,readonly=on",
                seed.display()
            ));
        }
        cmd.arg("-netdev")
            .arg(format!(
                "user,id=n0,hostfwd=tcp:127.0.0.1:{}-:22",
                c.ssh_port
            ))
            .args(["-device", "virtio-net-pci,netdev=n0"])
            // Two ports, as the launcher's domain: QEMU's default of 31 costs guest I/O.
            .args(["-device", "virtio-serial-pci,max_ports=2"])
            .arg("-chardev")
            .arg(format!(
                "socket,id=qga,path={},server=on,wait=off",
                c.agent_socket.display()
            ))
            .args([
                "-device",
                "virtserialport,chardev=qga,name=org.qemu.guest_agent.0",
            ]);
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|_| Error::Missing {
                what: "qemu-system-x86_64".into(),
                hint: "apt-get install qemu-system-x86",
            })?;
        let mut stdout = child.stdout.take().ok_or(Error::Tool {
            tool: "qemu-system-x86_64".into(),
            stderr: "no stdout".into(),
        })?;
        let console = Arc::new((Mutex::new(Vec::new()), Condvar::new()));
        let sink = console.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let (seen, cv) = &*sink;
                seen.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .extend_from_slice(&buf[..n]);
                cv.notify_all();
            }
        });
        Ok(Self {
            child,
            console,
            started,
        })
    }

    /// When QEMU was spawned.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Waits until the console has shown `text`; returns the time since QEMU was spawned.
    pub fn wait_for(&self, text: &str, timeout: Duration) -> Result<Duration, Error> {
        let deadline = Instant::now() + timeout;
        let (seen, cv) = &*self.console;
        let mut guard = seen.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if String::from_utf8_lossy(&guard).contains(text) {
                return Ok(self.started.elapsed());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                drop(guard);
                return Err(self.timeout(&format!("no {text:?} on the console"), timeout));
            }
            guard = cv
                .wait_timeout(guard, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// A [`Error::Timeout`] for `what`, with the console's last lines.
    pub fn timeout(&self, what: &str, timeout: Duration) -> Error {
        Error::Timeout {
            what: what.into(),
            timeout,
            console: self.console_tail(40),
        }
    }

    /// Everything the console showed so far.
    pub fn console(&self) -> String {
        let (seen, _) = &*self.console;
        String::from_utf8_lossy(&seen.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }

    /// The console's last `n` lines.
    pub fn console_tail(&self, n: usize) -> String {
        last_lines(&self.console(), n)
    }

    /// Waits up to `timeout` for QEMU to exit (after the guest powered off); kills it
    /// then. Returns whether it exited by itself.
    pub fn wait_exit(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        false
    }
}

impl std::fmt::Debug for Vm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vm").field("pid", &self.child.id()).finish()
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A connection to the guest agent's channel. The protocol is one JSON object per line
/// each way; before the first command a client sends `guest-sync-delimited`, whose answer
/// the agent precedes with a 0xFF byte, so that the client can drop whatever an earlier
/// client left unread in the channel.
#[derive(Debug)]
pub struct Agent {
    reader: BufReader<std::os::unix::net::UnixStream>,
    writer: std::os::unix::net::UnixStream,
}

impl Agent {
    /// Connects to the socket QEMU listens on and waits until the agent answers a
    /// `guest-sync-delimited` (it starts once the guest's udev has seen the port).
    pub fn connect(path: &Path, timeout: Duration) -> Result<Self, Error> {
        let deadline = Instant::now() + timeout;
        let stream = loop {
            match std::os::unix::net::UnixStream::connect(path) {
                Ok(s) => break s,
                Err(source) if Instant::now() >= deadline => {
                    return Err(Error::Io {
                        path: path.to_path_buf(),
                        source,
                    });
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        };
        let writer = io(path, stream.try_clone())?;
        let mut agent = Self {
            reader: BufReader::new(stream),
            writer,
        };
        // Until the agent runs, nothing answers: ask again every few seconds, each time
        // with a new id, and take the answer to any of them.
        let mut id: u64 = u64::from(std::process::id()) << 16;
        loop {
            id += 1;
            let sync =
                format!("{{\"execute\":\"guest-sync-delimited\",\"arguments\":{{\"id\":{id}}}}}\n");
            io(path, agent.writer.write_all(sync.as_bytes()))?;
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Tool {
                    tool: "guest agent".into(),
                    stderr: format!("no answer to guest-sync-delimited within {timeout:?}"),
                });
            }
            if agent.read_sync(id, left.min(Duration::from_secs(5)))? {
                return Ok(agent);
            }
        }
    }

    /// Reads sync answers (0xFF, then `{"return": ID}`) for up to `wait` until the one to
    /// `id`: an agent that starts late answers every sync queued before it, in order.
    fn read_sync(&mut self, id: u64, wait: Duration) -> Result<bool, Error> {
        let path = Path::new("guest agent socket");
        let deadline = Instant::now() + wait;
        let want = format!("\"return\": {id}}}");
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            io(path, self.reader.get_ref().set_read_timeout(Some(left)))?;
            let mut junk = Vec::new();
            let mut line = String::new();
            let read = self
                .reader
                .read_until(0xff, &mut junk)
                .and_then(|_| self.reader.read_line(&mut line));
            match read {
                Ok(0) => {
                    return Err(Error::Tool {
                        tool: "guest agent".into(),
                        stderr: "QEMU closed the channel".into(),
                    });
                }
                Ok(_) if line.replace(' ', "").contains(&want.replace(' ', "")) => {
                    return Ok(true);
                }
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    return Ok(false);
                }
                Err(source) => {
                    return Err(Error::Io {
                        path: path.to_path_buf(),
                        source,
                    });
                }
            }
        }
    }

    /// Sends `command` (a JSON object) and returns the agent's answer line.
    pub fn execute(&mut self, command: &str, timeout: Duration) -> Result<String, Error> {
        let path = Path::new("guest agent socket");
        io(path, self.writer.write_all(command.as_bytes()))?;
        io(path, self.writer.write_all(b"\n"))?;
        io(path, self.reader.get_ref().set_read_timeout(Some(timeout)))?;
        let mut line = String::new();
        io(path, self.reader.read_line(&mut line))?;
        Ok(line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(
            unescape_mountinfo(r"/tmp/a\040b/root\134x"),
            PathBuf::from(r"/tmp/a b/root\x")
        );
        assert_eq!(unescape_mountinfo("/plain"), PathBuf::from("/plain"));
        // A backslash not followed by three octal digits stays as it is.
        assert_eq!(unescape_mountinfo(r"/a\9"), PathBuf::from(r"/a\9"));
    }

    #[test]
    fn stamp_is_a_stable_sha256() {
        assert_eq!(stamp(), stamp());
        assert_eq!(stamp().len(), 64);
    }

    #[test]
    fn container_disk_is_in_kubevirt_layout() {
        let g = DebianGuest::at(Path::new("/x"));
        assert_eq!(
            container_disk_files(&g),
            vec![ImageEntry {
                host: PathBuf::from("/x/disk.qcow2"),
                image: "/disk/disk.qcow2".into(),
                uid: 107,
                gid: 107,
                mode: 0o440,
            }]
        );
    }

    #[test]
    fn templates_are_filled() {
        let cfg = GRUB_CFG
            .replace("@UUID@", "u")
            .replace("@ARGS@", KERNEL_ARGS);
        assert!(!cfg.contains('@'), "{cfg}");
        assert!(cfg.contains("console=ttyS0"), "{cfg}");
        assert!(!EARLY_GRUB_CFG.replace("@UUID@", "u").contains('@'));
    }

    /// Debian's cloud layout, in sectors: BIOS boot 2048+6144, EFI 8192+253952, root from
    /// 262144 to the last MiB; nothing overlaps.
    #[test]
    fn gpt_layout_is_debians() {
        let script = gpt_script("/d.raw");
        assert!(script.starts_with("label: gpt\n"), "{script}");
        assert!(
            script.contains(&format!(
                "/d.raw14 : start=2048, size=6144, type={GPT_BIOS_BOOT}"
            )),
            "{script}"
        );
        assert!(
            script.contains(&format!(
                "/d.raw15 : start=8192, size=253952, type={GPT_ESP}"
            )),
            "{script}"
        );
        assert!(
            script.contains(&format!(
                "/d.raw1 : start=262144, size={}, type={GPT_LINUX}",
                (DISK_BYTES >> 9) - 262144 - 2048
            )),
            "{script}"
        );
    }

    /// What grub-bios-setup writes for a core image at sector 2048: boot.img's
    /// kernel_sector 2048, the core's block list from 2049; nothing else changes.
    #[test]
    fn bios_boot_sectors_are_patched() {
        let mut boot = vec![0u8; 512];
        boot[BOOT_IMG_KERNEL_SECTOR] = 1;
        let mut core = vec![0u8; 1024];
        core[DISKBOOT_BLOCKLIST_START] = 2;
        core[DISKBOOT_BLOCKLIST_START + 8] = 7;
        patch_bios_boot(&mut boot, &mut core, 2048).unwrap();
        assert_eq!(
            boot[BOOT_IMG_KERNEL_SECTOR..BOOT_IMG_KERNEL_SECTOR + 8],
            2048u64.to_le_bytes()
        );
        assert_eq!(
            core[DISKBOOT_BLOCKLIST_START..DISKBOOT_BLOCKLIST_START + 8],
            2049u64.to_le_bytes()
        );
        // The length grub-mkimage wrote stays.
        assert_eq!(core[DISKBOOT_BLOCKLIST_START + 8], 7);
        assert!(patch_bios_boot(&mut [0u8; 16], &mut core, 2048).is_err());
    }

    #[test]
    fn last_lines_keeps_the_end() {
        assert_eq!(last_lines("a\nb\nc\n", 2), "b\nc");
        assert_eq!(last_lines("a", 5), "a");
    }
}
