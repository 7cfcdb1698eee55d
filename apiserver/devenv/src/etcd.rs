//! One way to start a throwaway etcd, shared by [`crate::DevEnv`] and kube-testenv: a
//! benchmark that puts virt-apiserver and kube-apiserver side by side compares their etcds
//! only if both run the same binary with the same flags.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{DevEnvError, free_port, io};

/// An etcd process on free loopback ports (client, peer, metrics), its data and log in a
/// directory the caller owns; killed on drop.
#[derive(Debug)]
pub struct Etcd {
    child: Child,
    /// Client URL, `http://127.0.0.1:<port>`; `/metrics` is served there too.
    pub url: String,
}

impl Etcd {
    /// Starts `bin` with its data in `dir/etcd` and its log in `dir/etcd.log`, with etcd's
    /// default settings otherwise, and returns once the client port accepts connections.
    pub fn start(bin: &Path, dir: &Path) -> Result<Self, DevEnvError> {
        let client_port = free_port()?;
        let url = format!("http://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{}", free_port()?);
        let log = std::fs::File::create(dir.join("etcd.log")).map_err(io("creating etcd.log"))?;
        let child = Command::new(bin)
            .args(["--name", "default", "--data-dir"])
            .arg(dir.join("etcd"))
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("default={peer}")])
            .args([
                "--listen-metrics-urls",
                &format!("http://127.0.0.1:{}", free_port()?),
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .map_err(io(format!(
                "starting {} (install Debian's etcd-server package)",
                bin.display()
            )))?;
        // Killed on drop from here, also when it never listens.
        let etcd = Self { child, url };
        // Seconds normally; a test binary started beside builds and other test binaries on a
        // 2-CPU machine has seen more than 20.
        wait_tcp(client_port, Duration::from_secs(60), "etcd")?;
        Ok(etcd)
    }

    /// Its process id, for /proc.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it still runs.
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGKILL, to test behaviour while storage is unreachable.
    pub fn kill(&mut self) {
        if self.alive() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }

    /// SIGTERM, then SIGKILL after 10 s.
    pub fn stop(&mut self) {
        crate::terminate(&mut self.child);
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Waits until something listens on 127.0.0.1:`port`.
pub(crate) fn wait_tcp(port: u16, timeout: Duration, what: &str) -> Result<(), DevEnvError> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(DevEnvError::NotReady(format!(
        "{what} did not listen on 127.0.0.1:{port} within {timeout:?}"
    )))
}
