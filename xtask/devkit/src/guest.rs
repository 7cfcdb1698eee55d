//! `cargo xtask guest`: builds the tiny test guest into target/guest (see `virt-testguest`),
//! and `--bench`: the launcher benchmark (time to the guest's banner through
//! virt-launcher versus bare QEMU, and the launcher's per-VM memory beside QEMU).

use std::io::Read;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// Arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Output directory (default: target/guest).
    #[arg(long)]
    out: Option<PathBuf>,
    /// After building, boot it with bare QEMU (TCG) and print the time to the banner.
    #[arg(long)]
    measure: bool,
    /// Run the launcher benchmark (builds virt-launcher in release mode).
    #[arg(long)]
    bench: bool,
    /// Runs per variant for --bench.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Build the Debian 12 cloud-style test guest instead (default: target/guest-debian),
    /// unless it is current; needs root, about 3.5 minutes (docs/test-guests.md).
    #[arg(long, conflicts_with_all = ["measure", "bench"])]
    debian: bool,
    /// With --debian: also build its containerDisk image (and load it into the local
    /// cluster when that runs).
    #[arg(long, requires = "debian")]
    image: bool,
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    if args.debian {
        return run_debian(args.out, args.image);
    }
    let dir = args.out.unwrap_or_else(virt_testguest::default_dir);
    let g = virt_testguest::build(&dir)?;
    println!(
        "guest built in {}: vmlinuz, initramfs.gz, disk.qcow2",
        g.dir.display()
    );
    if args.measure {
        let t = virt_testguest::bare_qemu_boot_time(&g, Duration::from_secs(60))?;
        println!(
            "bare qemu-system-x86_64 -accel tcg: banner after {:.2} s",
            t.as_secs_f64()
        );
    }
    if args.bench {
        print!("{}", bench_launcher(args.runs)?.markdown());
    }
    Ok(())
}

fn run_debian(out: Option<PathBuf>, image: bool) -> anyhow::Result<()> {
    use virt_testguest::debian;
    let dir = out.unwrap_or_else(debian::default_dir);
    let t = Instant::now();
    let g = debian::ensure(&dir)?;
    println!(
        "Debian guest in {}: disk.qcow2 ({:.1} MiB, {:.1} s)",
        g.dir.display(),
        std::fs::metadata(&g.disk)?.len() as f64 / (1 << 20) as f64,
        t.elapsed().as_secs_f64()
    );
    if image {
        if dir != debian::default_dir() {
            bail!("--image builds from the default directory only (no --out)");
        }
        let (name, archive) = crate::images::debian_guest_image(&crate::images::Load::Local)?;
        println!("{name}: {}", archive.display());
    }
    Ok(())
}

/// Figures of one benchmark run.
#[derive(Debug, Default)]
pub struct LauncherBench {
    /// Bare QEMU: spawn → banner, per run.
    pub bare: Vec<Duration>,
    /// virt-launcher as root (libvirt's daemon in root mode: how the launcher ran while
    /// its pod was privileged, before issue 15): spawn → banner on the console socket.
    pub launcher: Vec<Duration>,
    /// (RSS, PSS) in KiB of virt-launcher as root.
    pub launcher_mem: (u64, u64),
    /// (RSS, PSS) in KiB of its private libvirtd plus its namespace helpers.
    pub libvirtd_mem: (u64, u64),
    /// virt-launcher as in a pod: an ordinary user (uid 107 there), no capability,
    /// libvirt in session mode.
    pub unprivileged: Vec<Duration>,
    /// (RSS, PSS) in KiB of the unprivileged virt-launcher and of its daemon.
    pub unprivileged_mem: ((u64, u64), (u64, u64)),
}

impl LauncherBench {
    /// The figures as markdown tables (no heading: the caller places them).
    pub fn markdown(&self) -> String {
        use crate::bench::section::Runs;
        let bare = Runs::secs(&self.bare);
        let root = Runs::secs(&self.launcher);
        let user = Runs::secs(&self.unprivileged);
        let over = |r: &Runs| r.median().unwrap_or(0.0) - bare.median().unwrap_or(0.0);
        let mib = |k: u64| k as f64 / 1024.0;
        let (ul, ud) = self.unprivileged_mem;
        format!(
            "| what | median of {} (min–max) | overhead (difference of the medians) |\n|---|---|---|\n\
             | bare qemu-system-x86_64 → banner | {} | |\n\
             | virt-launcher as root, libvirt in root mode (the privileged launcher before issue 15) → banner on its console socket | {} | {:.2} s |\n\
             | virt-launcher as an ordinary user, no capability, libvirt in session mode (as in a pod) → banner on its console socket | {} | {:.2} s |\n\n\
             | per-VM memory beside QEMU | as root: RSS | PSS | unprivileged: RSS | PSS |\n|---|---|---|---|---|\n\
             | virt-launcher | {:.1} MiB | {:.1} MiB | {:.1} MiB | {:.1} MiB |\n\
             | private libvirtd (+ its helpers) | {:.1} MiB | {:.1} MiB | {:.1} MiB | {:.1} MiB |\n\
             | total | {:.1} MiB | {:.1} MiB | {:.1} MiB | {:.1} MiB |\n",
            bare.len(),
            bare.summary(2, "s"),
            root.summary(2, "s"),
            over(&root),
            user.summary(2, "s"),
            over(&user),
            mib(self.launcher_mem.0),
            mib(self.launcher_mem.1),
            mib(ul.0),
            mib(ul.1),
            mib(self.libvirtd_mem.0),
            mib(self.libvirtd_mem.1),
            mib(ud.0),
            mib(ud.1),
            mib(self.launcher_mem.0 + self.libvirtd_mem.0),
            mib(self.launcher_mem.1 + self.libvirtd_mem.1),
            mib(ul.0 + ud.0),
            mib(ul.1 + ud.1),
        )
    }
}

/// Builds virt-launcher (release) and the guest, then alternates bare-QEMU and launcher
/// boots `runs` times each.
pub fn bench_launcher(runs: usize) -> anyhow::Result<LauncherBench> {
    let guest = virt_testguest::ensure(&virt_testguest::default_dir())?;
    let status = xtask::cargo()
        .args([
            "build",
            "--release",
            "-q",
            "-p",
            "virt-launcher",
            "--bin",
            "virt-launcher",
            // Session-mode libvirt runs below it.
            "--bin",
            "virt-reaper",
        ])
        .status()
        .context("cargo build virt-launcher")?;
    if !status.success() {
        bail!("building virt-launcher failed");
    }
    let bin = virt_testguest::default_dir().join("../release/virt-launcher");
    let work = std::env::temp_dir().join(format!("kubevirt-rs-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let vmi = serde_json::json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "bench", "namespace": "bench"},
        "spec": {"terminationGracePeriodSeconds": 5, "domain": {
            "resources": {"requests": {"memory": "256Mi"}},
            "firmware": {"kernelBoot": {"kernelArgs": virt_testguest::KERNEL_ARGS,
                "container": {"image": "guest:latest", "kernelPath": "/vmlinuz", "initrdPath": "/initramfs.gz"}}}}}
    });
    let vmi_file = work.join("vmi.json");
    std::fs::write(&vmi_file, serde_json::to_vec(&vmi)?)?;
    // The unprivileged launcher's own tree, owned by its user as a pod's volumes are: the
    // VMI, the guest's files, its work directory and its QEMU capabilities cache.
    let user_dir = work.join("unprivileged");
    for d in ["images", "run", "cache"] {
        std::fs::create_dir_all(user_dir.join(d))?;
    }
    let user_vmi = user_dir.join("vmi.json");
    std::fs::copy(&vmi_file, &user_vmi)?;
    for f in ["vmlinuz", "initramfs.gz"] {
        std::fs::copy(guest.dir.join(f), user_dir.join("images").join(f))?;
    }
    let chown = Command::new("chown")
        .args(["-R", &format!("{QEMU_UID}:{QEMU_UID}")])
        .arg(&user_dir)
        .status()
        .context("chown")?;
    if !chown.success() {
        bail!("chown -R {QEMU_UID} {} failed", user_dir.display());
    }
    // Its parents must let uid 107 through.
    std::fs::set_permissions(&work, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let user = As {
        uid: QEMU_UID,
        cache: user_dir.join("cache"),
    };
    let mut out = LauncherBench::default();
    // One unmeasured run of each launcher warms its QEMU capabilities cache (a pod's
    // comes seeded by virt-handler) and the page cache.
    for i in 0..=runs {
        if i > 0 {
            out.bare.push(virt_testguest::bare_qemu_boot_time(
                &guest,
                Duration::from_secs(60),
            )?);
        }
        let (t, lmem, dmem) = launcher_once(&bin, &vmi_file, &guest.dir, &work, None)?;
        let (u, ulmem, udmem) = launcher_once(
            &bin,
            &user_vmi,
            &user_dir.join("images"),
            &user_dir.join("run"),
            Some(&user),
        )?;
        if i > 0 {
            out.launcher.push(t);
            out.launcher_mem = lmem;
            out.libvirtd_mem = dmem;
            out.unprivileged.push(u);
            out.unprivileged_mem = (ulmem, udmem);
        }
    }
    let _ = std::fs::remove_dir_all(&work);
    Ok(out)
}

/// The unprivileged user here: `nobody`. A launcher pod runs as uid 107 (KubeVirt's QEMU
/// user), which its image names in /etc/passwd; libvirt's session mode needs such a
/// record and this machine has none for 107. Which uid it is costs nothing measurable.
const QEMU_UID: u32 = 65534;

/// Runs the launcher as this user, with no capability and its own capabilities cache.
struct As {
    uid: u32,
    cache: PathBuf,
}

type Mem = (u64, u64);

fn launcher_once(
    bin: &Path,
    vmi: &Path,
    images: &Path,
    work: &Path,
    user: Option<&As>,
) -> anyhow::Result<(Duration, Mem, Mem)> {
    let sock = work.join("console.sock");
    let mut command = match user {
        None => Command::new(bin),
        Some(u) => {
            let mut c = Command::new("setpriv");
            c.arg(format!("--reuid={}", u.uid))
                .arg(format!("--regid={}", u.uid))
                .args(["--clear-groups", "--inh-caps=-all"])
                .arg(bin)
                .arg("--libvirt-cache")
                .arg(&u.cache)
                .arg("--work-dir")
                .arg(work);
            c
        }
    };
    let start = Instant::now();
    // setpriv execs the launcher: the child's pid is the launcher's.
    let mut child = command
        .arg("--vmi")
        .arg(vmi)
        .arg("--console-socket")
        .arg(&sock)
        .arg("--image-dir")
        .arg(format!("guest:latest={}", images.display()))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .context("spawning virt-launcher")?;
    let result = (|| -> anyhow::Result<(Duration, Mem, Mem)> {
        let mut s = loop {
            if let Ok(s) = UnixStream::connect(&sock) {
                break s;
            }
            if child.try_wait()?.is_some() || start.elapsed() > Duration::from_secs(60) {
                bail!("virt-launcher exited or its console never appeared");
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        s.set_read_timeout(Some(Duration::from_secs(60)))?;
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&seen).contains(virt_testguest::BANNER) {
            let n = s.read(&mut buf)?;
            if n == 0 {
                bail!("console closed before the banner");
            }
            seen.extend_from_slice(&buf[..n]);
        }
        let took = start.elapsed();
        let launcher = mem_of(child.id());
        let mut daemon = (0, 0);
        for pid in descendants(child.id()) {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if !comm.starts_with("qemu") {
                let m = mem_of(pid);
                daemon = (daemon.0 + m.0, daemon.1 + m.1);
            }
        }
        Ok((took, launcher, daemon))
    })();
    let _ = nix_kill_term(child.id());
    let _ = child.wait();
    result
}

fn nix_kill_term(pid: u32) -> std::io::Result<()> {
    Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status()
        .map(|_| ())
}

/// (VmRSS, Pss) in KiB.
fn mem_of(pid: u32) -> Mem {
    let field = |file: &str, key: &str| -> u64 {
        std::fs::read_to_string(format!("/proc/{pid}/{file}"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|r| r.split_whitespace().next().and_then(|n| n.parse().ok()))
            .unwrap_or(0)
    };
    (field("status", "VmRSS:"), field("smaps_rollup", "Pss:"))
}

fn descendants(root: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        parents.push((pid, ppid));
    }
    let mut out = vec![];
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for (c, _) in parents.iter().filter(|(_, pp)| *pp == p) {
            out.push(*c);
            frontier.push(*c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launcher_table_has_medians_ranges_and_overhead() {
        let s = Duration::from_millis;
        let b = LauncherBench {
            bare: vec![s(2400), s(2200), s(2300)],
            launcher: vec![s(2900), s(2700), s(2800)],
            launcher_mem: (20 * 1024, 10 * 1024),
            libvirtd_mem: (30 * 1024, 15 * 1024),
            unprivileged: vec![s(3000), s(2950), s(3100)],
            unprivileged_mem: ((21 * 1024, 11 * 1024), (31 * 1024, 16 * 1024)),
        };
        let t = b.markdown();
        assert!(
            t.contains("| what | median of 3 (min–max) | overhead (difference of the medians) |"),
            "{t}"
        );
        assert!(t.contains("| 2.30 s (2.20–2.40) | |"), "{t}");
        assert!(t.contains("| 2.80 s (2.70–2.90) | 0.50 s |"), "{t}");
        assert!(t.contains("| 3.00 s (2.95–3.10) | 0.70 s |"), "{t}");
        assert!(
            t.contains("| total | 50.0 MiB | 25.0 MiB | 52.0 MiB | 27.0 MiB |"),
            "{t}"
        );
    }
}
