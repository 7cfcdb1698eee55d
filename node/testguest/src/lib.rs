//! Builds the tiny test guest used by the node tests and benchmarks, from Debian packages
//! only: the cloud kernel (`linux-image-cloud-amd64`), a busybox-static initramfs and a
//! small qcow2 data disk (`qemu-utils`).
//!
//! It lives in its own crate so that both `cargo xtask guest` and the launcher's
//! integration tests can build it without linking libvirt into xtask.
//!
//! [`debian`] builds the other test guest: a real Debian 12 cloud-style disk image
//! (systemd, cloud-init, the QEMU guest agent, OpenSSH), for what the busybox guest cannot
//! show. Its boot test needs root and minutes:
//! `cargo test -p virt-testguest --test debian -- --ignored --nocapture`.

pub mod debian;

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The guest's PID 1.
const INIT: &str = include_str!("init.sh");

/// The guest's UDP echo service (guest/udp_echo.rs, compiled by build.rs), installed as
/// `/bin/udp-echo` and started on [`UDP_ECHO_PORT`].
const UDP_ECHO: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/udp-echo"));
const UDP_ECHO_SOURCE: &str = include_str!("../guest/udp_echo.rs");
/// The guest's disk benchmark (guest/disk_bench.rs, compiled by build.rs), installed as
/// `/bin/disk-bench` for `cargo xtask bench storage`.
const DISK_BENCH: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/disk-bench"));
const DISK_BENCH_SOURCE: &str = include_str!("../guest/disk_bench.rs");

/// The UDP port on which every guest sends each datagram back (the classic echo port).
pub const UDP_ECHO_PORT: u16 = 7;

/// Copy of the init script the initramfs was built with, to rebuild when it changes.
const STAMP: &str = ".init-stamp";

/// The line the guest prints on its serial console once it is up.
pub const BANNER: &str = "kubevirt-rs guest ready";

/// The guest's shell prompt.
pub const PROMPT: &str = "guest# ";

/// Kernel command line for the guest; quiet keeps TCG boot fast and the console readable.
/// `no_timer_check`, as cloud images boot: the kernel's check that the timer interrupt
/// ticks while it busy-waits fails when an emulated CPU gets a sliver of a host CPU (seen
/// with 72 TCG guests on 2 CPUs: one guest stopped for good after "MP-BIOS bug: 8254 timer
/// not connected to IO-APIC").
pub const KERNEL_ARGS: &str = "console=ttyS0 quiet panic=-1 no_timer_check";

/// Marker written at the start of `disk.qcow2`, so a guest can prove it sees the disk.
pub const DISK_MARKER: &str = "kubevirt-rs-test-disk";

/// Kernel modules the guest needs (virtio disks and NIC, the NoCloud ISO, the ACPI power
/// button, the panic device, virtio-serial);
/// the cloud kernel builds them as modules. Dependencies are added from `modules.dep`.
const MODULES: &[&str] = &[
    "kernel/drivers/virtio/virtio_pci.ko",
    "kernel/drivers/block/virtio_blk.ko",
    "kernel/drivers/scsi/virtio_scsi.ko",
    "kernel/drivers/scsi/sd_mod.ko",
    "kernel/drivers/scsi/sr_mod.ko",
    "kernel/fs/isofs/isofs.ko",
    "kernel/drivers/acpi/button.ko",
    "kernel/drivers/input/evdev.ko",
    // pvpanic on the ISA bus (ACPI QEMU0001): a panic reaches libvirt as a crash.
    "kernel/drivers/misc/pvpanic/pvpanic-mmio.ko",
    // The NIC: pod-network tests and the network benchmark talk to the guest.
    "kernel/drivers/net/virtio_net.ko",
    // virtio-serial: the guest agent's channel (kubevirt-rs.fake-agent).
    "kernel/drivers/char/virtio_console.ko",
    // The memory balloon: the guest's memory figures (KubeVirt's
    // `kubevirt_vmi_memory_{available,usable,unused}_bytes`) come from its driver.
    "kernel/drivers/virtio/virtio_balloon.ko",
];

/// Errors while building the guest.
#[derive(Debug, thiserror::Error)]
pub enum GuestError {
    /// A Debian package the build needs is not installed.
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
}

fn io<T>(path: &Path, r: std::io::Result<T>) -> Result<T, GuestError> {
    r.map_err(|source| GuestError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Files of a built guest.
#[derive(Clone, Debug)]
pub struct Guest {
    /// Directory holding the files (an "image" for `--image-dir`).
    pub dir: PathBuf,
    /// The kernel.
    pub kernel: PathBuf,
    /// The initramfs.
    pub initrd: PathBuf,
    /// The qcow2 data disk.
    pub disk: PathBuf,
}

impl Guest {
    /// The guest files under `dir`, whether built or not.
    pub fn at(dir: &Path) -> Self {
        Self {
            dir: dir.to_path_buf(),
            kernel: dir.join("vmlinuz"),
            initrd: dir.join("initramfs.gz"),
            disk: dir.join("disk.qcow2"),
        }
    }

    /// Whether every file exists and the initramfs carries the current init script.
    pub fn is_built(&self) -> bool {
        self.is_built_with(&[])
    }

    fn is_built_with(&self, extra: &[&str]) -> bool {
        [&self.kernel, &self.initrd, &self.disk]
            .iter()
            .all(|p| p.is_file())
            && fs::read_to_string(self.dir.join(STAMP)).is_ok_and(|s| s == stamp(extra))
    }
}

/// `target/guest` of the workspace that contains this crate.
pub fn default_dir() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let workspace = manifest
        .join("../..")
        .canonicalize()
        .unwrap_or_else(|_| manifest.join("../.."));
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"));
    target.join("guest")
}

/// Size of `/zeros` on the guest's web server (port 80), for throughput measurements.
pub const ZEROS_BYTES: u64 = 100 * 1024 * 1024;

/// Programs every guest carries: an SSH server (Debian's dropbear) and `scp` for its
/// remote end, so that `kubectl virt ssh`/`scp` reach it as they reach a cloud image.
pub const SSH_PROGRAMS: &[&str] = &["/usr/sbin/dropbear", "/usr/bin/scp"];

/// Builds the guest into `dir` unless it is already there.
/// Safe to call from several threads and processes at once (test binaries run in
/// parallel): the build holds a lock file in `dir`.
pub fn ensure(dir: &Path) -> Result<Guest, GuestError> {
    ensure_with(dir, &[])
}

/// [`ensure`] for a guest that also carries host `programs` (with their shared libraries)
/// in `/bin`: the network benchmark's guest has `iperf3`, which the everyday guest does
/// not need (a bigger initramfs boots slower under TCG).
pub fn ensure_with(dir: &Path, programs: &[&str]) -> Result<Guest, GuestError> {
    let g = Guest::at(dir);
    if g.is_built_with(programs) {
        return Ok(g);
    }
    io(dir, fs::create_dir_all(dir))?;
    let lock_path = dir.join(".build-lock");
    let lock = io(&lock_path, fs::File::create(&lock_path))?;
    io(&lock_path, lock.lock())?;
    // Another caller may have built it while this one waited for the lock.
    if g.is_built_with(programs) {
        Ok(g)
    } else {
        build_with(dir, programs)
    }
}

/// What the stamp file holds: the init script and the extra programs it was built with.
fn stamp(extra: &[&str]) -> String {
    // The modules too: a guest built before one was added would boot without it.
    let base = format!(
        "{INIT}\n{UDP_ECHO_SOURCE}\n{DISK_BENCH_SOURCE}\n# modules: {}",
        MODULES.join(" ")
    );
    if extra.is_empty() {
        base
    } else {
        format!("{base}\n# extra: {}\n", extra.join(" "))
    }
}

/// Builds the guest into `dir`, replacing what is there.
pub fn build(dir: &Path) -> Result<Guest, GuestError> {
    build_with(dir, &[])
}

fn build_with(dir: &Path, programs: &[&str]) -> Result<Guest, GuestError> {
    let g = Guest::at(dir);
    io(dir, fs::create_dir_all(dir))?;
    let (kernel, version) = find_kernel()?;
    // Copy to a temporary name and rename, so a concurrent reader never sees half a file.
    let tmp = dir.join(".vmlinuz.tmp");
    io(&tmp, fs::copy(&kernel, &tmp))?;
    io(&g.kernel, fs::rename(&tmp, &g.kernel))?;
    build_initramfs(dir, &version, &g.initrd, programs)?;
    build_disk(dir, &g.disk)?;
    let stamp_path = dir.join(STAMP);
    io(&stamp_path, fs::write(&stamp_path, stamp(programs)))?;
    Ok(g)
}

/// Copies the host's shared library `lib` to the same path under `root`.
fn copy_library(root: &Path, lib: &Path) -> Result<(), GuestError> {
    let dst = root.join(lib.strip_prefix("/").unwrap_or(lib));
    if let Some(parent) = dst.parent() {
        io(parent, fs::create_dir_all(parent))?;
    }
    let real = io(lib, lib.canonicalize())?;
    io(&dst, fs::copy(&real, &dst))?;
    Ok(())
}

/// The shared libraries `ldd` names for `program`, and the loader.
fn shared_libraries(program: &Path) -> Result<Vec<PathBuf>, GuestError> {
    let out = Command::new("ldd")
        .arg(program)
        .output()
        .map_err(|_| GuestError::Missing {
            what: "ldd".into(),
            hint: "apt-get install libc-bin",
        })?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            // "libx.so => /lib/…/libx.so (0x…)" or "/lib64/ld-linux-x86-64.so.2 (0x…)"
            let path = l
                .split("=>")
                .nth(1)
                .unwrap_or(l)
                .split_whitespace()
                .next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

/// Debian's cloud kernel and its version (`6.1.0-…-cloud-amd64`).
fn find_kernel() -> Result<(PathBuf, String), GuestError> {
    let boot = Path::new("/boot");
    let mut found: Vec<String> = io(boot, fs::read_dir(boot))?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("vmlinuz-") && n.ends_with("-cloud-amd64"))
        .collect();
    found.sort();
    let name = found.pop().ok_or(GuestError::Missing {
        what: "/boot/vmlinuz-*-cloud-amd64".into(),
        hint: "apt-get install linux-image-cloud-amd64",
    })?;
    let version = name.trim_start_matches("vmlinuz-").to_string();
    Ok((boot.join(name), version))
}

fn busybox() -> Result<PathBuf, GuestError> {
    let p = PathBuf::from("/bin/busybox");
    let out = Command::new(&p).arg("--list").output();
    match out {
        Ok(o) if o.status.success() && String::from_utf8_lossy(&o.stdout).contains("cttyhack") => {
            Ok(p)
        }
        _ => Err(GuestError::Missing {
            what: "/bin/busybox with cttyhack".into(),
            hint: "apt-get install busybox-static",
        }),
    }
}

/// Modules in load order (dependencies first), as paths relative to the modules dir.
fn module_closure(modules_dir: &Path) -> Result<Vec<String>, GuestError> {
    let dep_file = modules_dir.join("modules.dep");
    let deps = io(&dep_file, fs::read_to_string(&dep_file))?;
    let lookup = |m: &str| -> Vec<String> {
        deps.lines()
            .find_map(|l| l.strip_prefix(m).and_then(|r| r.strip_prefix(':')))
            .map(|r| r.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default()
    };
    let mut order: Vec<String> = Vec::new();
    fn visit(m: &str, lookup: &dyn Fn(&str) -> Vec<String>, order: &mut Vec<String>) {
        if order.iter().any(|o| o == m) {
            return;
        }
        // modules.dep lists the full transitive set, deepest last, so load it reversed.
        for d in lookup(m).iter().rev() {
            visit(d, lookup, order);
        }
        order.push(m.to_string());
    }
    for m in MODULES {
        if modules_dir.join(m).is_file() {
            visit(m, &lookup, &mut order);
        }
    }
    Ok(order)
}

fn build_initramfs(
    dir: &Path,
    kernel_version: &str,
    out: &Path,
    programs: &[&str],
) -> Result<(), GuestError> {
    let bb = busybox()?;
    let root = dir.join(".initramfs-root");
    if root.exists() {
        io(&root, fs::remove_dir_all(&root))?;
    }
    for d in [
        "bin",
        "dev",
        "proc",
        "sys",
        "mnt",
        "etc",
        "lib/modules",
        "tmp",
    ] {
        let p = root.join(d);
        io(&p, fs::create_dir_all(&p))?;
    }
    let bin = root.join("bin/busybox");
    io(&bin, fs::copy(&bb, &bin))?;
    let sh = root.join("bin/sh");
    io(&sh, std::os::unix::fs::symlink("busybox", &sh))?;
    // A root account for the SSH server.
    for (f, text) in [
        ("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"),
        ("etc/group", "root:x:0:\n"),
    ] {
        io(&root.join(f), fs::write(root.join(f), text))?;
    }
    for (name, program) in [("bin/udp-echo", UDP_ECHO), ("bin/disk-bench", DISK_BENCH)] {
        let path = root.join(name);
        io(&path, fs::write(&path, program))?;
        io(
            &path,
            fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)),
        )?;
        for lib in shared_libraries(&path)? {
            copy_library(&root, &lib)?;
        }
    }
    for program in SSH_PROGRAMS.iter().chain(programs) {
        let host = Path::new(program);
        let name = host.file_name().ok_or_else(|| GuestError::Missing {
            what: (*program).into(),
            hint: "a program path",
        })?;
        if !host.is_file() {
            return Err(GuestError::Missing {
                what: (*program).into(),
                hint: "cargo xtask deps installs it",
            });
        }
        let dst = root.join("bin").join(name);
        io(&dst, fs::copy(host, &dst))?;
        for lib in shared_libraries(host)? {
            copy_library(&root, &lib)?;
        }
    }
    let init = root.join("init");
    io(&init, fs::write(&init, INIT))?;
    io(
        &init,
        fs::set_permissions(&init, std::os::unix::fs::PermissionsExt::from_mode(0o755)),
    )?;

    let modules_dir = Path::new("/lib/modules").join(kernel_version);
    let order = module_closure(&modules_dir)?;
    for m in &order {
        let dst = root.join("lib/modules").join(m);
        if let Some(parent) = dst.parent() {
            io(parent, fs::create_dir_all(parent))?;
        }
        io(&dst, fs::copy(modules_dir.join(m), &dst))?;
    }
    let order_file = root.join("etc/modules-order");
    io(&order_file, fs::write(&order_file, order.join("\n") + "\n"))?;

    // busybox cpio takes the file list on stdin, relative to the current directory.
    let mut files = Vec::new();
    collect(&root, &root, &mut files)?;
    let cpio_path = dir.join(".initramfs.cpio");
    let cpio_file = io(&cpio_path, fs::File::create(&cpio_path))?;
    let mut child = io(
        &bb,
        Command::new(&bb)
            .args(["cpio", "-o", "-H", "newc", "-R", "0:0"])
            .current_dir(&root)
            .stdin(Stdio::piped())
            .stdout(cpio_file)
            .stderr(Stdio::piped())
            .spawn(),
    )?;
    if let Some(mut stdin) = child.stdin.take() {
        io(&bb, stdin.write_all((files.join("\n") + "\n").as_bytes()))?;
    }
    let o = io(&bb, child.wait_with_output())?;
    if !o.status.success() {
        return Err(GuestError::Tool {
            tool: "busybox cpio".into(),
            stderr: String::from_utf8_lossy(&o.stderr).into(),
        });
    }
    let gz = io(
        &bb,
        Command::new(&bb)
            .args(["gzip", "-9", "-f"])
            .arg(&cpio_path)
            .output(),
    )?;
    if !gz.status.success() {
        return Err(GuestError::Tool {
            tool: "busybox gzip".into(),
            stderr: String::from_utf8_lossy(&gz.stderr).into(),
        });
    }
    let gz_path = dir.join(".initramfs.cpio.gz");
    io(out, fs::rename(&gz_path, out))?;
    io(&root, fs::remove_dir_all(&root))?;
    Ok(())
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<(), GuestError> {
    let mut entries: Vec<_> = io(dir, fs::read_dir(dir))?.filter_map(|e| e.ok()).collect();
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let p = e.path();
        let rel = p
            .strip_prefix(root)
            .unwrap_or(&p)
            .to_string_lossy()
            .into_owned();
        out.push(rel);
        let ft = io(&p, e.file_type())?;
        if ft.is_dir() {
            collect(root, &p, out)?;
        }
    }
    Ok(())
}

fn build_disk(dir: &Path, out: &Path) -> Result<(), GuestError> {
    let raw = dir.join(".disk.raw");
    let mut data = DISK_MARKER.as_bytes().to_vec();
    data.push(b'\n');
    data.resize(16 * 1024 * 1024, 0);
    io(&raw, fs::write(&raw, &data))?;
    let tmp = dir.join(".disk.qcow2.tmp");
    let o = Command::new("qemu-img")
        .args(["convert", "-q", "-f", "raw", "-O", "qcow2"])
        .arg(&raw)
        .arg(&tmp)
        .output()
        .map_err(|_| GuestError::Missing {
            what: "qemu-img".into(),
            hint: "apt-get install qemu-utils",
        })?;
    io(&raw, fs::remove_file(&raw))?;
    if !o.status.success() {
        return Err(GuestError::Tool {
            tool: "qemu-img convert".into(),
            stderr: String::from_utf8_lossy(&o.stderr).into(),
        });
    }
    io(out, fs::rename(&tmp, out))?;
    Ok(())
}

/// The guest under bare QEMU (TCG, no libvirt), its serial console collected: the floor
/// the launcher is measured against, and the guest network tests' VM. Killed on drop.
pub struct BareVm {
    child: std::process::Child,
    console: std::sync::Arc<(std::sync::Mutex<Vec<u8>>, std::sync::Condvar)>,
    started: Instant,
}

impl BareVm {
    /// Starts QEMU on `g` with `extra` arguments (NICs, say); with none the guest has no NIC.
    /// `prefix` runs QEMU through another program (`ip netns exec NS`), if given;
    /// `kernel_extra` is appended to the kernel command line (the guest's test hooks).
    pub fn start(
        g: &Guest,
        prefix: &[&str],
        extra: &[&str],
        kernel_extra: &str,
    ) -> Result<Self, GuestError> {
        use std::io::Read;
        let (program, prefix_args) = match prefix.split_first() {
            Some((p, rest)) => (*p, rest),
            None => ("qemu-system-x86_64", &[][..]),
        };
        let mut cmd = Command::new(program);
        cmd.args(prefix_args);
        if !prefix.is_empty() {
            cmd.arg("qemu-system-x86_64");
        }
        let started = Instant::now();
        let mut child = cmd
            .args([
                "-accel",
                "tcg",
                "-M",
                "q35",
                "-m",
                "256",
                "-nographic",
                "-nodefaults",
                "-no-user-config",
            ])
            .args(["-serial", "stdio", "-monitor", "none"])
            .arg("-kernel")
            .arg(&g.kernel)
            .arg("-initrd")
            .arg(&g.initrd)
            .arg("-append")
            .arg(format!("{KERNEL_ARGS} {kernel_extra}").trim_end())
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|_| GuestError::Missing {
                what: program.into(),
                hint: "apt-get install qemu-system-x86",
            })?;
        let mut stdout = child.stdout.take().ok_or(GuestError::Tool {
            tool: "qemu".into(),
            stderr: "no stdout".into(),
        })?;
        let console =
            std::sync::Arc::new((std::sync::Mutex::new(Vec::new()), std::sync::Condvar::new()));
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

    /// Waits until the console has shown `text`; returns the time since QEMU was spawned.
    pub fn wait_for(&self, text: &str, timeout: Duration) -> Result<Duration, GuestError> {
        self.wait_until(text, timeout, |seen| {
            String::from_utf8_lossy(seen).contains(text)
        })
    }

    /// Waits for the guest's first console byte; returns the time since QEMU was spawned.
    pub fn wait_first_output(&self, timeout: Duration) -> Result<Duration, GuestError> {
        self.wait_until("any output", timeout, |seen| !seen.is_empty())
    }

    fn wait_until(
        &self,
        text: &str,
        timeout: Duration,
        done: impl Fn(&[u8]) -> bool,
    ) -> Result<Duration, GuestError> {
        let deadline = Instant::now() + timeout;
        let (seen, cv) = &*self.console;
        let mut guard = seen.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if done(&guard) {
                return Ok(self.started.elapsed());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(GuestError::Tool {
                    tool: "qemu-system-x86_64".into(),
                    stderr: format!(
                        "no {text:?} on the console within {timeout:?}; it showed:\n{}",
                        String::from_utf8_lossy(&guard)
                    ),
                });
            }
            guard = cv
                .wait_timeout(guard, left)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    /// Everything the console showed so far.
    pub fn console(&self) -> String {
        let (seen, _) = &*self.console;
        String::from_utf8_lossy(&seen.lock().unwrap_or_else(|e| e.into_inner())).into_owned()
    }
}

impl std::fmt::Debug for BareVm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BareVm")
            .field("pid", &self.child.id())
            .finish()
    }
}

impl Drop for BareVm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The console line the guest prints when `iface` got `addr` (`10.0.2.2/24`) by DHCP.
pub fn lease_line(iface: &str, addr: &str) -> String {
    format!("kubevirt-rs guest: {iface} {addr} ")
}

/// Kernel argument making the guest send `GET /` over HTTP to `target` (`IP:PORT`) once it
/// is up and print [`fetched_line`]`(target)` followed by the last line of the answer:
/// proves the guest reaches out.
pub fn fetch_arg(target: &str) -> String {
    format!("kubevirt-rs.fetch={target}")
}

/// Kernel argument making the guest serve its page on `port` too (it always serves port 80).
pub fn listen_arg(port: u16) -> String {
    format!("kubevirt-rs.listen={port}")
}

/// The start of the console line a [`fetch_arg`] fetch prints.
pub fn fetched_line(target: &str) -> String {
    format!("kubevirt-rs guest: fetched {target}: ")
}

/// Boots the guest with bare QEMU (TCG, no libvirt, no NIC) and returns the time from
/// spawning QEMU to the banner on the serial console: the physical floor for the launcher.
pub fn bare_qemu_boot_time(g: &Guest, timeout: Duration) -> Result<Duration, GuestError> {
    BareVm::start(g, &[], &[], "")?.wait_for(BANNER, timeout)
}
