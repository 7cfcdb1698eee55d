//! `cargo xtask fresh-check`: proves the README's set-up on a clean Debian 12 root filesystem
//! instead of on a development machine where everything is already installed.
//!
//! It debootstraps bookworm (cached in `target/fresh-check/pristine`, every run starts from a
//! fresh copy of it), gives the copy the host's Rust and Go read-only and the host's extra CA
//! certificates, clones this checkout's HEAD into it, and runs the README's steps inside with
//! chroot: `cargo xtask deps`, `cargo build --workspace`, `cargo xtask test --no-e2e`. The output
//! ends with the Debian packages the steps installed and the wall time of each step.
//!
//! It lives in the launcher (std and anyhow only) so that the host needs none of the project's
//! packages to run it: only debootstrap, which it installs.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use xtask::deps;

const SUITE: &str = "bookworm";

/// What the base system gets on top of debootstrap's minbase: what a user who "has Rust" has.
/// rustup needs a C linker (its installer says so: gcc and the C library's development files)
/// and reached crates.io over TLS (ca-certificates). Nothing else: the steps must install the
/// rest themselves.
const BASE_EXTRA: &[&str] = &["ca-certificates", "gcc", "libc6-dev"];

/// Where the repository is cloned inside the root filesystem.
const CLONE: &str = "/root/kubevirt-rs";

/// The host toolchains, bound read-only at the same paths inside.
const RUSTUP_HOME: &str = "/root/.rustup";
const CARGO_BIN: &str = "/root/.cargo/bin";
const GO_ROOT: &str = "/usr/local/go";

/// The README's steps, in order: name (for `--from`) and the command run in the clone.
const STEPS: &[(&str, &str)] = &[
    ("deps", "cargo xtask deps"),
    ("build", "cargo build --workspace"),
    ("test", "cargo xtask test --no-e2e"),
];

const HELP: &str = "\
Prove the README on a clean Debian 12 root filesystem (needs root; takes 30-60 min on 2 cores)

Usage: cargo xtask fresh-check [--from STEP] [--keep]

Debootstraps bookworm (minbase + ca-certificates, gcc, libc6-dev: what installing Rust needs)
into target/fresh-check (cached; every run starts from a fresh copy), binds the host's
Rust (/root/.rustup, /root/.cargo/bin) and Go (/usr/local/go) read-only, copies in the host's
extra CA certificates, clones this checkout's HEAD and runs there with chroot:
  deps   cargo xtask deps
  build  cargo build --workspace
  test   cargo xtask test --no-e2e
It ends with the Debian packages the steps installed and the wall time of each step; it
exits non-zero when a step fails. Network: Debian's mirror, crates.io and the Go proxy only.

Options:
  --from STEP  reuse the root filesystem of the previous run (its clone reset to the current
               HEAD) and start at STEP (deps, build or test)
  --keep       keep the root filesystem after a successful run (a failed run always keeps it)
  -h, --help   this text";

#[derive(Debug, Default)]
struct Opts {
    from: Option<usize>,
    keep: bool,
}

fn parse(args: &[OsString]) -> anyhow::Result<Option<Opts>> {
    let mut opts = Opts::default();
    let mut it = args.iter().map(|a| a.to_string_lossy().into_owned());
    while let Some(a) = it.next() {
        match a.as_str() {
            "-h" | "--help" => return Ok(None),
            "--keep" => opts.keep = true,
            "--from" => {
                let step = it
                    .next()
                    .context("--from needs a step: deps, build or test")?;
                let i = STEPS
                    .iter()
                    .position(|(name, _)| *name == step)
                    .with_context(|| format!("--from {step}: the steps are deps, build, test"))?;
                opts.from = Some(i);
            }
            other => bail!("unknown argument {other:?}; see `cargo xtask fresh-check --help`"),
        }
    }
    Ok(Some(opts))
}

/// Paths under `target/fresh-check`.
#[derive(Debug)]
struct Layout {
    dir: PathBuf,
    /// debootstrap's output, never modified after it is complete.
    pristine: PathBuf,
    /// Packages of the pristine system, one per line.
    pristine_packages: PathBuf,
    /// The copy the steps run in.
    root: PathBuf,
    /// One log per step.
    logs: PathBuf,
}

impl Layout {
    fn new() -> anyhow::Result<Self> {
        let target = xtask::target_dir();
        fs::create_dir_all(&target)?;
        // Absolute and without symlinks: mount points are compared with /proc/self/mountinfo.
        let dir = fs::canonicalize(&target)?.join("fresh-check");
        Ok(Self {
            pristine: dir.join("pristine"),
            pristine_packages: dir.join("pristine.packages"),
            root: dir.join("root"),
            logs: dir.join("logs"),
            dir,
        })
    }

    fn clone_dir(&self) -> PathBuf {
        self.root.join(CLONE.trim_start_matches('/'))
    }
}

/// One timed entry of the final report.
#[derive(Debug)]
struct Timing {
    what: String,
    took: Option<Duration>,
    outcome: String,
}

pub fn run(args: &[OsString]) -> anyhow::Result<ExitCode> {
    let Some(opts) = parse(args)? else {
        println!("{HELP}");
        return Ok(ExitCode::SUCCESS);
    };
    anyhow::ensure!(
        deps::is_root(),
        "fresh-check must run as root (debootstrap, mount, chroot)"
    );
    for (what, path) in [
        ("Rust (rustup)", RUSTUP_HOME),
        ("Rust (cargo)", CARGO_BIN),
        ("Go", GO_ROOT),
    ] {
        anyhow::ensure!(
            Path::new(path).is_dir(),
            "{what} is not at {path}: fresh-check gives the host's toolchains to the clean system"
        );
    }
    let layout = Layout::new()?;
    fs::create_dir_all(&layout.logs)?;
    let mut timings = Vec::new();

    if deps::installed(&["debootstrap"]).is_empty() {
        let t = Instant::now();
        deps::install(&["debootstrap"])?;
        timings.push(Timing {
            what: "host: apt-get install debootstrap".into(),
            took: Some(t.elapsed()),
            outcome: "ok".into(),
        });
    }
    let (mirror, security) = host_mirrors();
    timings.push(ensure_pristine(&layout, &mirror)?);

    let first = opts.from.unwrap_or(0);
    let commit = head_commit()?;
    if opts.from.is_some() {
        anyhow::ensure!(
            layout.clone_dir().join(".git").is_dir(),
            "--from needs the root filesystem of a previous run in {}",
            layout.root.display()
        );
        teardown(&layout.root)?;
        let t = Instant::now();
        sync_clone(&layout)?;
        timings.push(Timing {
            what: format!("reuse the previous root, clone reset to {commit}"),
            took: Some(t.elapsed()),
            outcome: "ok".into(),
        });
    } else {
        let t = Instant::now();
        fresh_root(&layout, &mirror, &security)?;
        timings.push(Timing {
            what: format!("fresh copy of the base, clone of {commit}"),
            took: Some(t.elapsed()),
            outcome: "ok".into(),
        });
    }

    let mut failed = false;
    let mut summary_line = None;
    {
        // Everything the steps need mounted; unmounted when this scope ends, also on error.
        let mounts = Mounts::new(&layout.root)?;
        for (i, (name, command)) in STEPS.iter().enumerate() {
            if i < first {
                timings.push(Timing {
                    what: (*command).into(),
                    took: None,
                    outcome: "done by the previous run".into(),
                });
                continue;
            }
            if failed {
                timings.push(Timing {
                    what: (*command).into(),
                    took: None,
                    outcome: "not run".into(),
                });
                continue;
            }
            println!("\n==> fresh-check step {name}: {command}");
            let t = Instant::now();
            let log = layout.logs.join(format!("{name}.log"));
            let result = run_step(&mounts, command, &log);
            let took = t.elapsed();
            let outcome = match result {
                Ok(out) if out.success => {
                    summary_line = out.summary.or(summary_line);
                    "ok".to_string()
                }
                Ok(out) => {
                    failed = true;
                    summary_line = out.summary.or(summary_line);
                    format!("FAILED (log: {})", log.display())
                }
                Err(e) => {
                    failed = true;
                    format!("FAILED: {e:#}")
                }
            };
            timings.push(Timing {
                what: (*command).into(),
                took: Some(took),
                outcome,
            });
        }
    }
    // The mounts are gone: a left-over one would make the root impossible to remove safely.
    teardown(&layout.root)?;

    let added = added_packages(&layout);
    println!(
        "\n==> fresh-check of {commit} on Debian 12 ({SUITE}, debootstrap minbase + {})",
        BASE_EXTRA.join(", ")
    );
    match &added {
        Ok(added) => {
            println!("Debian packages the steps installed ({}):", added.len());
            print_wrapped(added);
        }
        Err(e) => println!("cannot list the installed packages: {e:#}"),
    }
    if let Some(line) = &summary_line {
        println!("tests (cargo xtask test --no-e2e): {line}");
    }
    println!("wall time:");
    let width = timings.iter().map(|t| t.what.len()).max().unwrap_or(0);
    for t in &timings {
        let took = t.took.map_or_else(|| "-".to_string(), format_duration);
        println!("  {:width$}  {took:>9}  {}", t.what, t.outcome);
    }
    if failed {
        println!(
            "fresh-check FAILED; the root filesystem is kept in {}: after a fix, commit and \
             re-run the failing step with `cargo xtask fresh-check --from STEP`",
            layout.root.display()
        );
        return Ok(ExitCode::FAILURE);
    }
    if opts.keep {
        println!(
            "fresh-check passed; root filesystem kept in {}",
            layout.root.display()
        );
    } else {
        remove_root(&layout.root)?;
        println!("fresh-check passed");
    }
    Ok(ExitCode::SUCCESS)
}

fn format_duration(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

fn print_wrapped(words: &[String]) {
    let mut line = String::from(" ");
    for w in words {
        if line.len() + w.len() + 1 > 100 {
            println!("{line}");
            line = String::from(" ");
        }
        line.push(' ');
        line.push_str(w);
    }
    if line.trim().is_empty() {
        println!("  (none)");
    } else {
        println!("{line}");
    }
}

/// The host's Debian mirror and security mirror (what its apt uses, so the clean system reaches
/// Debian the same way); deb.debian.org when the host names none.
fn host_mirrors() -> (String, String) {
    let mut uris = Vec::new();
    let mut files = vec![PathBuf::from("/etc/apt/sources.list")];
    if let Ok(dir) = fs::read_dir("/etc/apt/sources.list.d") {
        let mut more: Vec<PathBuf> = dir
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "sources" || e == "list"))
            .collect();
        more.sort();
        files.extend(more);
    }
    for f in files {
        let Ok(text) = fs::read_to_string(&f) else {
            continue;
        };
        for line in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
            uris.extend(
                line.split_whitespace()
                    .filter(|w| w.starts_with("http://") || w.starts_with("https://"))
                    .map(|w| w.trim_end_matches('/').to_string()),
            );
        }
    }
    let main = uris
        .iter()
        .find(|u| u.ends_with("/debian"))
        .cloned()
        .unwrap_or_else(|| "http://deb.debian.org/debian".into());
    let security = uris
        .iter()
        .find(|u| u.ends_with("/debian-security"))
        .cloned()
        .unwrap_or_else(|| "http://deb.debian.org/debian-security".into());
    (main, security)
}

/// Runs `program args` on the host, failing with its name when it fails.
fn host(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let status = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .status()
        .with_context(|| format!("running {program}"))?;
    anyhow::ensure!(status.success(), "{program} {} failed", args.join(" "));
    Ok(())
}

fn path_str(p: &Path) -> anyhow::Result<&str> {
    p.to_str()
        .with_context(|| format!("{} is not UTF-8", p.display()))
}

/// debootstraps the base system once; later runs reuse it.
fn ensure_pristine(layout: &Layout, mirror: &str) -> anyhow::Result<Timing> {
    let stamp = layout.pristine.join(".fresh-check-complete");
    if stamp.exists() && layout.pristine_packages.exists() {
        return Ok(Timing {
            what: format!(
                "debootstrap {SUITE} (cached in {})",
                layout.pristine.display()
            ),
            took: None,
            outcome: "reused".into(),
        });
    }
    let t = Instant::now();
    let partial = layout.dir.join("pristine.partial");
    teardown(&partial)?;
    remove_tree(&partial)?;
    teardown(&layout.pristine)?;
    remove_tree(&layout.pristine)?;
    println!(
        "==> debootstrap {SUITE} into {} ({mirror})",
        partial.display()
    );
    let include = format!("--include={}", BASE_EXTRA.join(","));
    let result = host(
        "debootstrap",
        &[
            "--variant=minbase",
            &include,
            SUITE,
            path_str(&partial)?,
            mirror,
        ],
    );
    // debootstrap mounts proc and sys inside while it works; an interrupted one leaves them.
    teardown(&partial)?;
    result?;
    let packages = chroot_output(&partial, &["dpkg-query", "-W", "-f=${Package}\\n"])?;
    fs::write(&layout.pristine_packages, packages)?;
    fs::write(partial.join(".fresh-check-complete"), mirror)?;
    fs::rename(&partial, &layout.pristine)?;
    Ok(Timing {
        what: format!("debootstrap {SUITE} minbase + {}", BASE_EXTRA.join(", ")),
        took: Some(t.elapsed()),
        outcome: "ok".into(),
    })
}

/// `chroot ROOT ARGS` without any mount, for dpkg-query and update-ca-certificates.
fn chroot_output(root: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("chroot")
        .arg(root)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::null())
        .output()
        .context("running chroot")?;
    anyhow::ensure!(
        out.status.success(),
        "chroot {} {} failed: {}",
        root.display(),
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The commit this checkout's HEAD is at (what the clone gets).
fn head_commit() -> anyhow::Result<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(xtask::workspace_root())
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .context("running git rev-parse")?;
    anyhow::ensure!(out.status.success(), "git rev-parse HEAD failed");
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A fresh copy of the pristine base, set up like a freshly installed machine whose owner
/// installed Rust and Go, with the repository cloned into it.
fn fresh_root(layout: &Layout, mirror: &str, security: &str) -> anyhow::Result<()> {
    teardown(&layout.root)?;
    remove_tree(&layout.root)?;
    println!(
        "==> fresh copy of the base system in {}",
        layout.root.display()
    );
    host(
        "cp",
        &[
            "-a",
            "--reflink=auto",
            path_str(&layout.pristine)?,
            path_str(&layout.root)?,
        ],
    )?;
    let root = &layout.root;
    let write = |rel: &str, text: &str| -> anyhow::Result<()> {
        let path = root.join(rel);
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        fs::write(&path, text).with_context(|| format!("writing {}", path.display()))
    };
    // An installed Debian 12 has updates and security as well as the release.
    write(
        "etc/apt/sources.list",
        &format!(
            "deb {mirror} {SUITE} main\ndeb {mirror} {SUITE}-updates main\n\
             deb {security} {SUITE}-security main\n"
        ),
    )?;
    // Name resolution as on the host.
    for f in ["etc/resolv.conf", "etc/hosts"] {
        let host_file = Path::new("/").join(f);
        if host_file.exists() {
            let _ = fs::remove_file(root.join(f));
            fs::copy(&host_file, root.join(f))
                .with_context(|| format!("copying {}", host_file.display()))?;
        }
    }
    // Packages must not start their daemons (etcd, libvirtd, containerd) inside a chroot:
    // they would run on the host, outlive the check and hold its mounts. On a real machine
    // systemd starts them; the tests start their own anyway.
    write("usr/sbin/policy-rc.d", "#!/bin/sh\nexit 101\n")?;
    host(
        "chmod",
        &["755", path_str(&root.join("usr/sbin/policy-rc.d"))?],
    )?;
    // The host's extra CA certificates: the registries are reached through the same TLS
    // trust as on the host.
    let extra = root.join("usr/local/share/ca-certificates");
    fs::create_dir_all(&extra)?;
    let mut copied = 0;
    if let Ok(dir) = fs::read_dir("/usr/local/share/ca-certificates") {
        for e in dir.flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "crt") {
                fs::copy(&p, extra.join(e.file_name()))?;
                copied += 1;
            }
        }
    }
    chroot_output(root, &["update-ca-certificates"])?;
    println!("{copied} extra CA certificate(s) from the host");
    // Mount points for the host's toolchains.
    for p in [RUSTUP_HOME, CARGO_BIN, GO_ROOT] {
        fs::create_dir_all(root.join(p.trim_start_matches('/')))?;
    }
    println!(
        "==> git clone of {} (HEAD)",
        xtask::workspace_root().display()
    );
    host(
        "git",
        &[
            "clone",
            "--quiet",
            "--no-hardlinks",
            path_str(&xtask::workspace_root())?,
            path_str(&layout.clone_dir())?,
        ],
    )?;
    Ok(())
}

/// Resets the previous run's clone to this checkout's HEAD (for `--from` after a fix).
fn sync_clone(layout: &Layout) -> anyhow::Result<()> {
    let clone = layout.clone_dir();
    let clone = path_str(&clone)?;
    host(
        "git",
        &[
            "-C",
            clone,
            "fetch",
            "--quiet",
            path_str(&xtask::workspace_root())?,
            "HEAD",
        ],
    )?;
    host(
        "git",
        &["-C", clone, "reset", "--quiet", "--hard", "FETCH_HEAD"],
    )
}

/// The mounts of the root filesystem while the steps run.
#[derive(Debug)]
struct Mounts {
    root: PathBuf,
}

impl Mounts {
    fn new(root: &Path) -> anyhow::Result<Self> {
        let mounts = Self {
            root: root.to_path_buf(),
        };
        // From here on, Drop unmounts whatever was mounted, also when a later mount fails.
        let r = |rel: &str| mounts.root.join(rel.trim_start_matches('/'));
        let at = |rel: &str| -> anyhow::Result<String> { Ok(path_str(&r(rel))?.to_string()) };
        // "/" inside must be a mount point, as on a real machine: `unshare --mount` (the
        // launcher's private libvirtd) makes "/" private first and fails with "cannot change
        // root filesystem propagation: Invalid argument" on a plain directory.
        let root = path_str(&mounts.root)?.to_string();
        host("mount", &["--bind", &root, &root])?;
        host("mount", &["--make-private", &root])?;
        host("mount", &["-t", "proc", "proc", &at("proc")?])?;
        // /sys with its cgroup mounts. rslave: unmounting them here must never propagate to
        // the host's mounts.
        host("mount", &["--rbind", "/sys", &at("sys")?])?;
        host("mount", &["--make-rslave", &at("sys")?])?;
        // A /dev of its own, never the host's: package scripts change device nodes (qemu's
        // postinst chgrps /dev/kvm to the chroot's kvm group, which is another group on the
        // host), and those must be the chroot's own nodes.
        private_dev(&r("dev"))?;
        // The host's toolchains, read-only: the check may use them, never change them.
        for p in [RUSTUP_HOME, CARGO_BIN, GO_ROOT] {
            host("mount", &["--bind", p, &at(p)?])?;
            host("mount", &["-o", "remount,bind,ro", &at(p)?])?;
        }
        Ok(mounts)
    }
}

/// Device nodes the steps use (the launcher tests boot guests: kvm, tun), made in the chroot's
/// own /dev with the host's numbers and modes, when the host has them.
const DEVICES: &[&str] = &[
    "null",
    "zero",
    "full",
    "random",
    "urandom",
    "tty",
    "kvm",
    "net/tun",
    "fuse",
    "vhost-net",
];

/// tmpfs on `dev` with [`DEVICES`], a devpts instance of its own, /dev/shm and the usual links.
fn private_dev(dev: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let d = path_str(dev)?;
    host(
        "mount",
        &["-t", "tmpfs", "-o", "mode=755,nosuid", "tmpfs", d],
    )?;
    for name in DEVICES {
        let Ok(meta) = fs::metadata(Path::new("/dev").join(name)) else {
            continue;
        };
        let rdev = meta.rdev();
        // Linux's dev_t encoding (glibc's major()/minor()).
        let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff);
        let minor = (rdev & 0xff) | ((rdev >> 12) & !0xff);
        let node = dev.join(name);
        if let Some(parent) = node.parent() {
            fs::create_dir_all(parent)?;
        }
        let mode = format!("{:o}", meta.permissions().mode() & 0o777);
        host(
            "mknod",
            &[
                "-m",
                &mode,
                path_str(&node)?,
                "c",
                &major.to_string(),
                &minor.to_string(),
            ],
        )?;
    }
    for sub in ["pts", "shm"] {
        fs::create_dir_all(dev.join(sub))?;
    }
    host(
        "mount",
        &[
            "-t",
            "devpts",
            "-o",
            "newinstance,ptmxmode=0666,mode=620",
            "devpts",
            path_str(&dev.join("pts"))?,
        ],
    )?;
    host(
        "mount",
        &[
            "-t",
            "tmpfs",
            "-o",
            "mode=1777,nosuid,nodev",
            "tmpfs",
            path_str(&dev.join("shm"))?,
        ],
    )?;
    for (link, to) in [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(to, dev.join(link))
            .with_context(|| format!("linking /dev/{link}"))?;
    }
    Ok(())
}

impl Drop for Mounts {
    fn drop(&mut self) {
        if let Err(e) = teardown(&self.root) {
            eprintln!("fresh-check: {e:#}");
        }
    }
}

/// The environment of the steps: a login as root on the fresh machine with Rust and Go on
/// PATH, plus what makes the registries reachable as from the host (CA bundle variables,
/// proxies).
fn step_env() -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = [
        ("HOME", "/root"),
        ("USER", "root"),
        ("LOGNAME", "root"),
        ("LANG", "C.UTF-8"),
        (
            "PATH",
            "/root/.cargo/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ),
        ("RUSTUP_HOME", RUSTUP_HOME),
        // Writable, inside the clean system: the registry cache starts empty.
        ("CARGO_HOME", "/root/.cargo"),
        // As in .ci/run: one build, no incremental caches (they would only take disk).
        ("CARGO_INCREMENTAL", "0"),
        ("CARGO_TERM_COLOR", "never"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    const PASS: &[&str] = &[
        "http_proxy",
        "https_proxy",
        "no_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "ALL_PROXY",
        "GOPROXY",
        "GOSUMDB",
        "GONOSUMDB",
        "GOPRIVATE",
        "TERM",
    ];
    for (k, v) in std::env::vars() {
        // The host's TLS trust variables (SSL_CERT_FILE, CURL_CA_BUNDLE, GIT_SSL_CAINFO, …)
        // name /etc/ssl paths, which update-ca-certificates fills the same way inside.
        let ca = v.starts_with("/etc/ssl/") && !k.starts_with("CARGO");
        if ca || PASS.contains(&k.as_str()) {
            env.push((k, v));
        }
    }
    env
}

#[derive(Debug)]
struct StepOutput {
    success: bool,
    /// `cargo xtask test`'s `N passed, N failed, N skipped` line, if it printed one.
    summary: Option<String>,
}

/// Runs `command` in the clone inside the root filesystem, echoing its output and writing it
/// to `log`.
fn run_step(mounts: &Mounts, command: &str, log: &Path) -> anyhow::Result<StepOutput> {
    let script = format!("set -e; cd {CLONE}; exec {command} 2>&1");
    let mut child = Command::new("chroot")
        .arg(&mounts.root)
        .args(["/usr/bin/env", "-i"])
        .args(step_env().into_iter().map(|(k, v)| format!("{k}={v}")))
        .args(["/bin/bash", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .context("running chroot")?;
    let mut file = fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let mut summary = None;
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            println!("{line}");
            let _ = writeln!(file, "{line}");
            if is_summary(&line) {
                summary = Some(line.trim().to_string());
            }
        }
    }
    let status = child.wait().context("waiting for the step")?;
    Ok(StepOutput {
        success: status.success(),
        summary,
    })
}

/// `cargo xtask test`'s last line: `12 passed, 0 failed, 3 skipped`.
fn is_summary(line: &str) -> bool {
    let words: Vec<&str> = line.split_whitespace().collect();
    matches!(
        words.as_slice(),
        [p, "passed,", f, "failed,", s, "skipped"]
            if [p, f, s].iter().all(|n| n.parse::<u64>().is_ok())
    )
}

/// Packages installed in the root filesystem that the pristine base did not have.
fn added_packages(layout: &Layout) -> anyhow::Result<Vec<String>> {
    let base: BTreeSet<String> = fs::read_to_string(&layout.pristine_packages)?
        .lines()
        .map(str::to_string)
        .collect();
    let now = chroot_output(&layout.root, &["dpkg-query", "-W", "-f=${Package}\\n"])?;
    Ok(now
        .lines()
        .filter(|p| !base.contains(*p))
        .map(str::to_string)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect())
}

/// Mount points at or under `root`, deepest first.
fn mounts_under(root: &Path) -> Vec<PathBuf> {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return Vec::new();
    };
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mountinfo(p)))
        .filter(|p| p.starts_with(root))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            let code: String = chars.by_ref().take(3).collect();
            match u8::from_str_radix(&code, 8) {
                Ok(b) => out.push(char::from(b)),
                Err(_) => {
                    out.push('\\');
                    out.push_str(&code);
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Ends the processes still running inside `root` (a test's etcd or libvirtd that outlived its
/// step would keep the mounts busy) and unmounts everything under it.
fn teardown(root: &Path) -> anyhow::Result<()> {
    if !root.exists() {
        return Ok(());
    }
    kill_inside(root);
    for _ in 0..5 {
        let points = mounts_under(root);
        if points.is_empty() {
            return Ok(());
        }
        for p in points {
            let ok = Command::new("umount")
                .arg(&p)
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                // Busy: detach it now, the kernel frees it when its last user goes.
                let _ = Command::new("umount").arg("-l").arg(&p).status();
            }
        }
    }
    let left = mounts_under(root);
    anyhow::ensure!(
        left.is_empty(),
        "cannot unmount {left:?}; unmount them by hand before removing {}",
        root.display()
    );
    Ok(())
}

/// Kills, by PID, the processes whose root directory is `root`: all started by this check.
fn kill_inside(root: &Path) {
    let Ok(canonical) = fs::canonicalize(root) else {
        return;
    };
    let inside = || -> Vec<i32> {
        let Ok(dir) = fs::read_dir("/proc") else {
            return Vec::new();
        };
        dir.flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .filter(|pid| fs::read_link(format!("/proc/{pid}/root")).is_ok_and(|r| r == canonical))
            .collect()
    };
    for signal in ["TERM", "KILL"] {
        let pids = inside();
        if pids.is_empty() {
            return;
        }
        eprintln!(
            "fresh-check: ending {} process(es) left inside {} (SIG{signal})",
            pids.len(),
            root.display()
        );
        let _ = Command::new("kill")
            .arg(format!("-{signal}"))
            .args(pids.iter().map(i32::to_string))
            .status();
        std::thread::sleep(Duration::from_secs(3));
    }
}

/// Removes a root filesystem, refusing while anything is mounted in it: `rm -r` through a
/// bind mount of /dev or of the host's toolchains would delete the host's files.
fn remove_tree(dir: &Path) -> anyhow::Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    let left = mounts_under(dir);
    anyhow::ensure!(
        left.is_empty(),
        "refusing to remove {}: still mounted: {left:?}",
        dir.display()
    );
    // --one-file-system: a second line of defence against a mount appearing meanwhile.
    host("rm", &["-rf", "--one-file-system", path_str(dir)?])
}

fn remove_root(root: &Path) -> anyhow::Result<()> {
    teardown(root)?;
    remove_tree(root)
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_test_summary_line() {
        assert!(super::is_summary("1234 passed, 0 failed, 12 skipped"));
        assert!(!super::is_summary("e2e: 3 of 36 tests passed (0 failed)"));
        assert!(!super::is_summary("test result: ok. 3 passed; 0 failed"));
    }

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(super::unescape_mountinfo("/a\\040b/c"), "/a b/c");
        assert_eq!(super::unescape_mountinfo("/plain"), "/plain");
    }

    #[test]
    fn steps_parse_by_name() {
        let args: Vec<std::ffi::OsString> = vec!["--from".into(), "build".into()];
        let opts = super::parse(&args)
            .unwrap_or_else(|e| panic!("{e:#}"))
            .unwrap_or_else(|| panic!("help"));
        assert_eq!(opts.from, Some(1));
        assert!(super::parse(&["--from".into(), "nope".into()]).is_err());
    }
}
