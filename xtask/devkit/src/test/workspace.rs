//! The workspace's unit and integration tests, two test binaries at a time.
//!
//! `cargo test` runs test binaries one after another. Most of ours spend their time waiting
//! on real processes they started (etcd, kube-apiserver, libvirt, a guest booting under
//! TCG): measured on this 2-core machine, running the binaries took 592 s of the 15 min
//! `cargo test --workspace` took, the slowest 77 s. Each binary already runs its own tests
//! in parallel threads, each test with its own temporary directories and ports, so two
//! binaries at once are two more such tests. Output is printed per binary when it ends, so
//! a failure's lines stay together.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;

/// How many test binaries run at once.
pub const JOBS: usize = 2;

/// One test executable that `cargo test --no-run` built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TestBinary {
    /// The package's directory and the target, as the summary names it
    /// (`apiserver/server: backup`).
    pub name: String,
    pub executable: PathBuf,
    /// Its package's directory: cargo runs a test binary from there.
    pub package_dir: PathBuf,
}

/// The test executables of `cargo test --no-run --message-format=json`, in the order cargo
/// built them: unit tests (`lib`, `bin`) and integration tests (`test`) alike.
pub fn executables(messages: &str) -> Vec<TestBinary> {
    messages
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["profile"]["test"] == true)
        .filter_map(|m| {
            let executable = PathBuf::from(m["executable"].as_str()?);
            let manifest = PathBuf::from(m["manifest_path"].as_str()?);
            let package_dir = manifest.parent()?.to_path_buf();
            // The package's last two directories: `server/backup` alone would not say
            // which of our crates named `server`-something it is.
            let mut parts: Vec<String> = package_dir
                .components()
                .rev()
                .take(2)
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            parts.reverse();
            let target = m["target"]["name"].as_str()?;
            Some(TestBinary {
                name: format!("{}: {target}", parts.join("/")),
                executable,
                package_dir,
            })
        })
        .collect()
}

/// What one binary's run gave: its stdout lines, whether it passed, how long it took.
#[derive(Debug)]
pub struct Outcome {
    pub binary: TestBinary,
    pub lines: Vec<String>,
    pub passed: bool,
    pub took: Duration,
}

/// Runs `binaries`, [`JOBS`] at a time, calling `done` with each as it ends (in the order
/// they end). `env` sets what every test needs (KUBECTL, PATH, …).
pub fn run(
    binaries: Vec<TestBinary>,
    env: &(dyn Fn(&mut Command) + Sync),
    done: &mut dyn FnMut(Outcome),
) -> anyhow::Result<()> {
    let queue = Arc::new(Mutex::new(VecDeque::from(binaries)));
    let (tx, rx) = std::sync::mpsc::channel::<anyhow::Result<Outcome>>();
    std::thread::scope(|s| {
        for _ in 0..JOBS {
            let queue = Arc::clone(&queue);
            let tx = tx.clone();
            s.spawn(move || {
                loop {
                    let next = queue.lock().ok().and_then(|mut q| q.pop_front());
                    let Some(binary) = next else { break };
                    if tx.send(run_one(binary, env)).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        for outcome in rx {
            done(outcome?);
        }
        Ok(())
    })
}

fn run_one(binary: TestBinary, env: &(dyn Fn(&mut Command) + Sync)) -> anyhow::Result<Outcome> {
    let t = Instant::now();
    let mut cmd = Command::new(&binary.executable);
    cmd.current_dir(&binary.package_dir)
        .env("CARGO_MANIFEST_DIR", &binary.package_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    env(&mut cmd);
    let child = cmd
        .spawn()
        .with_context(|| format!("running {}", binary.executable.display()))?;
    // stderr (panics, tracing) is kept with stdout, after it: both read to the end at once
    // so that neither pipe fills and stalls the test.
    let out = child
        .wait_with_output()
        .with_context(|| format!("waiting for {}", binary.executable.display()))?;
    let mut lines: Vec<String> = BufReader::new(&out.stdout[..])
        .lines()
        .map_while(Result::ok)
        .collect();
    lines.extend(
        BufReader::new(&out.stderr[..])
            .lines()
            .map_while(Result::ok),
    );
    Ok(Outcome {
        binary,
        lines,
        passed: out.status.success(),
        took: t.elapsed(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_executables_of_every_kind_are_read_with_their_package() {
        let msgs = r#"{"reason":"compiler-artifact","profile":{"test":true},"target":{"kind":["lib"],"name":"virt_apiserver"},"manifest_path":"/w/apiserver/server/Cargo.toml","executable":"/t/virt_apiserver-1"}
{"reason":"compiler-artifact","profile":{"test":true},"target":{"kind":["test"],"name":"backup"},"manifest_path":"/w/apiserver/server/Cargo.toml","executable":"/t/backup-2"}
{"reason":"compiler-artifact","profile":{"test":false},"target":{"kind":["lib"],"name":"x"},"manifest_path":"/w/x/Cargo.toml","executable":null}
{"reason":"build-finished","success":true}"#;
        let e = executables(msgs);
        assert_eq!(
            e,
            vec![
                TestBinary {
                    name: "apiserver/server: virt_apiserver".into(),
                    executable: "/t/virt_apiserver-1".into(),
                    package_dir: "/w/apiserver/server".into(),
                },
                TestBinary {
                    name: "apiserver/server: backup".into(),
                    executable: "/t/backup-2".into(),
                    package_dir: "/w/apiserver/server".into(),
                },
            ]
        );
    }

    #[test]
    fn every_binary_runs_once_and_failures_are_reported() {
        let bins: Vec<TestBinary> = ["true", "false", "true"]
            .iter()
            .enumerate()
            .map(|(i, b)| TestBinary {
                name: format!("{b}-{i}"),
                executable: PathBuf::from(format!("/bin/{b}")),
                package_dir: std::env::temp_dir(),
            })
            .collect();
        let mut seen = Vec::new();
        run(bins, &|_| {}, &mut |o| seen.push((o.binary.name, o.passed))).unwrap();
        seen.sort();
        assert_eq!(
            seen,
            vec![
                ("false-1".to_string(), false),
                ("true-0".to_string(), true),
                ("true-2".to_string(), true),
            ]
        );
    }
}
