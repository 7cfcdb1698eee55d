//! A tenant's processes inside its launcher pod, for the attacker e2e tests
//! (e2e/tests/security.rs). Each joins the launcher's container cgroup first (as `kubectl
//! exec` would place it) and binds a name in the launcher's sockets directory:
//! - `endless`: answers each connection with an endless line; prints, per connection, the
//!   bytes the peer took before it hung up.
//! - `hand-off`: listens, hands the listening socket to a child of its own (`keep`) and
//!   exits, so that the socket's peer credentials name a process that is gone; `keep`
//!   accepts one connection and prints the first line it is sent.

use std::io::{BufRead, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
struct Args {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand)]
enum Mode {
    /// Serve an endless line on `socket`.
    Endless {
        /// `cgroup.procs` of the container to join first (one per hierarchy).
        #[arg(long)]
        cgroup_procs: Vec<PathBuf>,
        /// The socket to bind (its name must be free).
        #[arg(long)]
        socket: PathBuf,
        /// The most to send on one connection, in MiB.
        #[arg(long, default_value_t = 1024)]
        max_mib: u64,
    },
    /// Listen on `socket`, hand it to `keep` and exit.
    HandOff {
        /// `cgroup.procs` of the container to join first (one per hierarchy).
        #[arg(long)]
        cgroup_procs: Vec<PathBuf>,
        /// The socket to bind (its name must be free).
        #[arg(long)]
        socket: PathBuf,
    },
    /// (`hand-off`'s child) Accept one connection on the listener that is stdin and print
    /// the first line sent on it.
    Keep,
}

/// Moves this process into each of `procs` ("0" names the writer itself).
fn join(procs: &[PathBuf]) -> anyhow::Result<()> {
    anyhow::ensure!(!procs.is_empty(), "no cgroup to join");
    for p in procs {
        std::fs::write(p, "0").map_err(|e| anyhow::anyhow!("joining {}: {e}", p.display()))?;
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    match Args::parse().mode {
        Mode::Endless {
            cgroup_procs,
            socket,
            max_mib,
        } => {
            join(&cgroup_procs)?;
            let listener = UnixListener::bind(&socket)?;
            let chunk = vec![b'x'; 1 << 20];
            let mut out = std::io::stdout();
            for conn in listener.incoming() {
                let mut conn = conn?;
                let mut sent = 0u64;
                while sent < max_mib << 20 {
                    match conn.write(&chunk) {
                        Ok(n) => sent += n as u64,
                        Err(_) => break,
                    }
                }
                writeln!(out, "{sent}")?;
                out.flush()?;
            }
            Ok(())
        }
        Mode::HandOff {
            cgroup_procs,
            socket,
        } => {
            join(&cgroup_procs)?;
            let listener = UnixListener::bind(&socket)?;
            std::process::Command::new(std::env::current_exe()?)
                .arg("keep")
                .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(
                    listener,
                )))
                .spawn()?;
            Ok(())
        }
        Mode::Keep => {
            let fd = std::io::stdin().as_fd().try_clone_to_owned()?;
            let listener = UnixListener::from(fd);
            let (conn, _) = listener.accept()?;
            let mut line = String::new();
            std::io::BufReader::new(conn).read_line(&mut line)?;
            let mut out = std::io::stdout();
            writeln!(out, "{}", line.trim_end())?;
            out.flush()?;
            Ok(())
        }
    }
}
