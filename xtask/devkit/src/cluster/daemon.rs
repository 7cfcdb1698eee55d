//! Long-running cluster processes, tracked by PID files so that `up` can reuse them and `down`
//! can stop exactly what we started (never by name: other people's etcd or containerd may run on
//! the same machine).

use std::fs;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::Layout;

/// One daemon: a name (PID and log file names), the program and its arguments.
#[derive(Debug)]
pub struct Daemon {
    pub name: &'static str,
    pub program: PathBuf,
    pub args: Vec<String>,
}

impl Daemon {
    pub fn new(name: &'static str, program: impl Into<PathBuf>) -> Self {
        Self {
            name,
            program: program.into(),
            args: Vec::new(),
        }
    }

    pub fn arg(mut self, a: impl Into<String>) -> Self {
        self.args.push(a.into());
        self
    }

    /// Starts the daemon unless the one recorded in its PID file still runs. Returns the PID and
    /// whether it was already running.
    pub fn ensure(&self, layout: &Layout) -> anyhow::Result<(i32, bool)> {
        if let Some(pid) = running_pid(layout, self.name) {
            return Ok((pid, true));
        }
        fs::create_dir_all(&layout.logs)?;
        fs::create_dir_all(&layout.run)?;
        let log_path = layout.logs.join(format!("{}.log", self.name));
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Own process group: Ctrl-C on `cargo xtask cluster up` must not take the cluster down.
            .process_group(0);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", self.program.display()))?;
        let pid = i32::try_from(child.id())?;
        fs::write(pid_file(layout, self.name), pid.to_string())?;
        Ok((pid, false))
    }
}

fn pid_file(layout: &Layout, name: &str) -> PathBuf {
    layout.run.join(format!("{name}.pid"))
}

/// The PID of the daemon `name` if it is alive and still the program we started.
pub fn running_pid(layout: &Layout, name: &str) -> Option<i32> {
    let pid: i32 = fs::read_to_string(pid_file(layout, name))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (alive(pid) && ours(layout, pid)).then_some(pid)
}

/// After a reboot or crash a stale PID file may name an unrelated process: every daemon we start
/// has our work dir in its arguments, anything else is not ours to reuse or to signal.
/// Our own children count too: between fork and exec a child's command line is still ours.
fn ours(layout: &Layout, pid: i32) -> bool {
    // The daemons were started with the real path: a target dir reached through a symlink
    // (a helper's CARGO_TARGET_DIR whose `cluster` links to the main checkout's) names them
    // by another, and the second node then looked stopped (its images never imported).
    let needle = layout
        .cluster
        .canonicalize()
        .unwrap_or_else(|_| layout.cluster.clone())
        .display()
        .to_string();
    let ppid = fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let (_, rest) = stat.rsplit_once(')')?;
            rest.split_whitespace().nth(1)?.parse::<u32>().ok()
        });
    ppid == Some(std::process::id())
        || fs::read(format!("/proc/{pid}/cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&needle))
}

/// Alive and not a zombie: our children that die before `up` exits linger as zombies.
fn alive(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next());
            !matches!(state, Some('Z') | Some('X') | None)
        }
        Err(_) => false,
    }
}

/// Stops the daemon `name`: SIGTERM, then SIGKILL after `grace`. Returns whether one was running.
pub fn stop(layout: &Layout, name: &str, grace: Duration) -> anyhow::Result<bool> {
    let file = pid_file(layout, name);
    let Some(pid) = running_pid(layout, name) else {
        let _ = fs::remove_file(&file);
        return Ok(false);
    };
    let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    let deadline = Instant::now() + grace;
    while alive(pid) && Instant::now() < deadline {
        // Reaps it if it is our own child (when `up` fails and cleans up after itself).
        let _ = nix::sys::wait::waitpid(
            Pid::from_raw(pid),
            Some(nix::sys::wait::WaitPidFlag::WNOHANG),
        );
        sleep(Duration::from_millis(100));
    }
    if alive(pid) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        let deadline = Instant::now() + Duration::from_secs(5);
        while alive(pid) && Instant::now() < deadline {
            sleep(Duration::from_millis(100));
        }
    }
    let _ = fs::remove_file(&file);
    Ok(true)
}

/// Polls `check` until it returns `Ok(true)`; fails after `timeout` with the last error and a
/// pointer to the log of `name`, and fails at once if the daemon has died.
pub fn wait_for(
    layout: &Layout,
    name: &str,
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    let log = layout.logs.join(format!("{name}.log"));
    let mut last = String::new();
    loop {
        match check() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => last = format!("{e:#}"),
        }
        if running_pid(layout, name).is_none() {
            bail!("{name} exited; see {}\n{}", log.display(), tail(&log, 15));
        }
        if Instant::now() > deadline {
            bail!(
                "{name}: {what} not reached within {timeout:?} ({last}); see {}\n{}",
                log.display(),
                tail(&log, 15)
            );
        }
        sleep(Duration::from_millis(200));
    }
}

/// The last `n` lines of a log file, for error messages.
pub fn tail(path: &Path, n: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A plain-HTTP GET on loopback returning the status code (etcd and kubelet healthz are plain HTTP).
pub fn http_status(addr: SocketAddr, path: &str) -> anyhow::Result<u16> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    let head = String::from_utf8_lossy(&buf);
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("malformed HTTP response")?;
    Ok(code)
}

/// Whether something accepts TCP connections on `addr`.
pub fn port_open(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_ok()
}
