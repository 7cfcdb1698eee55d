//! A private libvirt daemon for one VM, as KubeVirt runs one inside each launcher pod.
//!
//! Two modes, chosen by who runs the launcher:
//! - **Session** (any non-root user; in a pod always uid 107, docs/node.md): libvirt's own
//!   unprivileged mode. Every path the daemon uses is set through `XDG_*`/`HOME` into the
//!   launcher's work directory, QEMU runs as the same user, and libvirt touches no cgroup,
//!   device or namespace. The daemon runs below [`crate::reaper`], which adopts and reaps
//!   the QEMU libvirt double-forks and takes it along when the launcher dies.
//! - **Root** (a launcher run by root on a host: tests, `cargo xtask bench launcher`):
//!   Debian 12's monolithic `libvirtd` has fixed state paths in privileged mode
//!   (/run/libvirt, /var/lib/libvirt, /etc/libvirt), so it runs in its own mount
//!   namespace with tmpfs over the state directories and our own config bound over
//!   /etc/libvirt, and in its own PID namespace so that its QEMU dies with it.
//!
//! In both, only the QEMU driver module is loaded (`LIBVIRT_DRIVER_DIR`), which keeps
//! startup and memory small, and the QEMU capabilities cache is shared between launchers,
//! because probing QEMU takes seconds.
//!
//! Lifetime: a parent-death signal ties the daemon to the thread that spawned it (the
//! libvirt actor thread); in root mode `unshare --kill-child` tears down the PID
//! namespace — daemon and QEMU — when that dies, in session mode the reaper kills its
//! children, so even `kill -9` of the launcher leaves nothing.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Errors starting the private daemon.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Writing its configuration failed.
    #[error("preparing libvirt daemon directory {path}: {source}")]
    Io {
        /// Path.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// It could not be spawned.
    #[error("spawning libvirtd (needs util-linux setpriv/unshare and libvirt-daemon): {0}")]
    Spawn(std::io::Error),
    /// The session-mode daemon's reaper is not installed beside the launcher.
    #[error(
        "{0} missing: virt-launcher runs libvirtd below it (build both binaries of the virt-launcher package)"
    )]
    NoReaper(PathBuf),
    /// It exited or did not create its socket in time.
    #[error("libvirtd did not come up: {0}")]
    NotReady(String),
}

const SCRIPT: &str = r#"set -e
mkdir -p /run/libvirt /var/lib/libvirt /var/cache/libvirt /var/log/libvirt
mount -t tmpfs tmpfs /run/libvirt
mount -t tmpfs tmpfs /var/lib/libvirt
mount -t tmpfs tmpfs /var/log/libvirt
mount --bind "$2" /var/cache/libvirt
mount --bind "$1/etc" /etc/libvirt
# The migration sockets: the same in-namespace path on source and target names each
# launcher's own host directory, where virt-handler's proxy meets them.
mkdir -p "$5"
mount --bind "$4" "$5"
if [ "$3" = hide-kvm ]; then
    # A /dev without kvm: libvirt then neither probes KVM (which may hang) nor
    # invalidates its capabilities cache on every start (/dev/null as kvm would).
    mkdir -p "$1/dev/pts" "$1/dev/shm"
    for n in null zero full random urandom tty ptmx; do
        [ -e "/dev/$n" ] || continue
        : > "$1/dev/$n"
        mount --bind "/dev/$n" "$1/dev/$n"
    done
    # QEMU opens the pod network's tap through /dev/net/tun.
    if [ -e /dev/net/tun ]; then
        mkdir -p "$1/dev/net"
        : > "$1/dev/net/tun"
        mount --bind /dev/net/tun "$1/dev/net/tun"
    fi
    mount --bind /dev/pts "$1/dev/pts"
    mount -t tmpfs tmpfs "$1/dev/shm"
    # Recursive: the device nodes bound above are mounts of their own, which a plain
    # --bind would leave behind (QEMU then saw empty regular files).
    mount --rbind "$1/dev" /dev
fi
set +e
# Not exec: as PID 1 of the namespace the shell reaps QEMU's daemonised processes,
# which libvirtd (not written to be an init) would leave as zombies.
libvirtd -f "$1/etc/libvirtd.conf" -p "$1/libvirtd.pid"
exit $?
"#;

/// Session mode: QEMU runs as the launcher's own user; no security driver (there is no
/// other user to separate from), no virtlogd (QEMU writes its log file itself).
const SESSION_QEMU_CONF: &str = r#"# Written by virt-launcher (session mode).
security_driver = "none"
stdio_handler = "file"
"#;

const QEMU_CONF: &str = r#"# Written by virt-launcher: QEMU runs as root inside the launcher's namespaces.
user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
security_driver = "none"
stdio_handler = "file"
cgroup_controllers = [ ]
namespaces = [ ]
"#;

const DRIVER_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/libvirt/connection-driver",
    "/usr/lib/aarch64-linux-gnu/libvirt/connection-driver",
    "/usr/lib64/libvirt/connection-driver",
    "/usr/lib/libvirt/connection-driver",
];

/// How the daemon runs (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// libvirt's unprivileged session mode, as the launcher's user.
    Session,
    /// Privileged libvirtd in private mount and PID namespaces (root on a host).
    Root,
}

impl Mode {
    /// Session unless the launcher runs as root.
    pub fn for_current_user() -> Self {
        if nix::unistd::geteuid().is_root() {
            Self::Root
        } else {
            Self::Session
        }
    }

    /// The URI path of a daemon in this mode (`qemu:///session`, `qemu:///system`).
    pub fn uri_path(self) -> &'static str {
        match self {
            Self::Session => "session",
            Self::Root => "system",
        }
    }
}

/// A running private libvirtd.
#[derive(Debug)]
pub struct PrivateDaemon {
    child: Child,
    dir: PathBuf,
    mode: Mode,
    /// Session mode's short configuration and runtime directory, removed on drop.
    _short: Option<tempfile::TempDir>,
    /// URI to connect to it.
    pub uri: String,
}

impl PrivateDaemon {
    /// Starts a daemon whose files live in `dir`; `cache` holds QEMU capabilities.
    /// Root mode: with `hide_kvm`, /dev/kvm is invisible to it, so libvirt never touches a
    /// KVM that may hang (its capability probe would otherwise block for minutes), and
    /// `migration_dir` is bound on [`MIGRATION_NS_DIR`](virt_domain::protocol::MIGRATION_NS_DIR).
    /// Session mode sees the devices and paths of the pod as they are: a launcher pod has
    /// /dev/kvm only when it asked for it, and every launcher pod mounts its migration
    /// directory at the same path.
    pub fn start(
        dir: &Path,
        cache: &Path,
        hide_kvm: bool,
        migration_dir: &Path,
        timeout: Duration,
    ) -> Result<Self, DaemonError> {
        let io = |path: &Path, r: std::io::Result<()>| {
            r.map_err(|source| DaemonError::Io {
                path: path.into(),
                source,
            })
        };
        let etc = dir.join("etc");
        let sock = dir.join("sock");
        let drivers = dir.join("drivers");
        for d in [
            &etc,
            &sock,
            &drivers,
            &cache.to_path_buf(),
            &migration_dir.to_path_buf(),
        ] {
            io(d, fs::create_dir_all(d))?;
        }
        let conf = format!(
            "unix_sock_dir = \"{}\"\nunix_sock_rw_perms = \"0700\"\nauth_unix_rw = \"none\"\nauth_unix_ro = \"none\"\nlog_outputs = \"3:stderr\"\n\
             min_workers = 1\nmax_workers = 4\nprio_workers = 1\nadmin_min_workers = 1\nadmin_max_workers = 1\n",
            sock.display()
        );
        let mode = Mode::for_current_user();
        // Session mode reads its configuration from $XDG_CONFIG_HOME/libvirt and keeps the
        // QEMU monitor sockets below it (`libvirt/qemu/lib/domain-N-NAME/monitor.sock`):
        // a short directory of its own, since a unix socket path has 107 bytes and the
        // pod's work directory takes half of them.
        let short = match mode {
            Mode::Root => None,
            Mode::Session => Some(tempfile::Builder::new().prefix(".vl-").tempdir().map_err(
                |source| DaemonError::Io {
                    path: std::env::temp_dir(),
                    source,
                },
            )?),
        };
        let etc = match &short {
            None => etc,
            Some(short) => {
                let e = short.path().join("config/libvirt");
                io(&e, fs::create_dir_all(&e))?;
                e
            }
        };
        io(&etc, fs::write(etc.join("libvirtd.conf"), conf))?;
        let qemu_conf = match mode {
            Mode::Root => QEMU_CONF,
            Mode::Session => SESSION_QEMU_CONF,
        };
        io(&etc, fs::write(etc.join("qemu.conf"), qemu_conf))?;
        let mut cmd = match mode {
            Mode::Root => Command::new("setpriv"),
            Mode::Session => {
                let exe = std::env::current_exe().map_err(DaemonError::Spawn)?;
                let reaper = exe.with_file_name(crate::reaper::BINARY);
                if !reaper.is_file() {
                    return Err(DaemonError::NoReaper(reaper));
                }
                Command::new(reaper)
            }
        };
        if let Some(d) = DRIVER_DIRS
            .iter()
            .map(Path::new)
            .find(|d| d.join("libvirt_driver_qemu.so").is_file())
        {
            let link = drivers.join("libvirt_driver_qemu.so");
            if !link.exists() {
                io(
                    &link,
                    std::os::unix::fs::symlink(d.join("libvirt_driver_qemu.so"), &link),
                )?;
            }
            cmd.env("LIBVIRT_DRIVER_DIR", &drivers);
        }
        let log = dir.join("libvirtd.log");
        let log_file = fs::File::create(&log).map_err(|source| DaemonError::Io {
            path: log.clone(),
            source,
        })?;
        let log_err = log_file.try_clone().map_err(|source| DaemonError::Io {
            path: log.clone(),
            source,
        })?;
        if mode == Mode::Session {
            // Everything libvirt's session mode keeps goes below `dir`; the QEMU
            // capabilities cache (`$XDG_CACHE_HOME/libvirt/qemu/capabilities`) is the
            // shared one.
            let xdg_cache = dir.join("cache");
            io(&xdg_cache, fs::create_dir_all(&xdg_cache))?;
            let link = xdg_cache.join("libvirt");
            if !link.exists() {
                io(&link, std::os::unix::fs::symlink(cache, &link))?;
            }
            let short = short.as_ref().map(|t| t.path()).unwrap_or(dir);
            for d in [dir.join("home"), short.join("run")] {
                io(&d, fs::create_dir_all(&d))?;
            }
            cmd.env("HOME", dir.join("home"))
                .env("XDG_CONFIG_HOME", short.join("config"))
                .env("XDG_RUNTIME_DIR", short.join("run"))
                .env("XDG_CACHE_HOME", &xdg_cache)
                .env("XDG_DATA_HOME", dir.join("home"));
            // The reaper arms its parent-death signal itself and then checks that its
            // parent is still this process (no window in which our death goes unseen).
            cmd.arg(std::process::id().to_string())
                .args(["--", "libvirtd", "-f"])
                .arg(etc.join("libvirtd.conf"))
                .stdin(Stdio::null())
                .stdout(log_file)
                .stderr(log_err);
        } else {
            cmd.args([
                "--pdeathsig",
                "KILL",
                "unshare",
                "--mount",
                "--propagation",
                "private",
            ])
            .args([
                "--pid",
                "--fork",
                "--kill-child=SIGKILL",
                "--mount-proc",
                "sh",
                "-c",
                SCRIPT,
                "sh",
            ])
            .arg(dir)
            .arg(cache)
            .arg(if hide_kvm { "hide-kvm" } else { "keep-kvm" })
            .arg(migration_dir)
            .arg(virt_domain::protocol::MIGRATION_NS_DIR)
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(log_err);
        }
        let child = cmd.spawn().map_err(DaemonError::Spawn)?;
        let uri = format!(
            "qemu:///{}?socket={}",
            mode.uri_path(),
            sock.join("libvirt-sock").display()
        );
        let mut d = Self {
            child,
            dir: dir.to_path_buf(),
            mode,
            _short: short,
            uri,
        };
        let start = Instant::now();
        // Connectable, not merely present: a unix socket's file appears at bind() and a
        // connect before listen() is refused. The launcher connects right after this
        // returns, and a refused first connect is an early `exit 1` — a short window,
        // but a loaded 2-core machine can stretch it.
        while std::os::unix::net::UnixStream::connect(sock.join("libvirt-sock")).is_err() {
            if let Ok(Some(status)) = d.child.try_wait() {
                return Err(DaemonError::NotReady(format!(
                    "exited with {status}: {}",
                    d.log_tail()
                )));
            }
            if start.elapsed() > timeout {
                let tail = d.log_tail();
                d.stop();
                return Err(DaemonError::NotReady(format!(
                    "no socket after {timeout:?}: {tail}"
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(d)
    }

    /// PID of the namespace holder (`unshare`); the daemon is its child.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Last lines of the daemon's log, for error messages.
    pub fn log_tail(&self) -> String {
        let s = fs::read_to_string(self.dir.join("libvirtd.log")).unwrap_or_default();
        let lines: Vec<&str> = s.lines().rev().take(5).collect();
        lines.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// The mode it runs in.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Stops the daemon and its QEMU.
    pub fn stop(&mut self) {
        if self.mode == Mode::Session {
            // The reaper kills the daemon and every QEMU it adopted on SIGTERM.
            let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
            if nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).is_ok() {
                let deadline = Instant::now() + Duration::from_secs(5);
                while Instant::now() < deadline {
                    if !matches!(self.child.try_wait(), Ok(None)) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
        // unshare ignores SIGTERM while it waits for its child; SIGKILL makes the kernel
        // deliver the child's parent-death SIGKILL, which ends the whole PID namespace.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for PrivateDaemon {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.stop();
        }
    }
}
