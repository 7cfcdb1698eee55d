//! `cargo xtask test`: the README's test command and what `.ci/run` runs. Formatting,
//! lints, every unit and integration test (real etcd, libvirt/QEMU, kubectl), then the
//! end-to-end tests on a real local Kubernetes cluster. Fails when anything fails, when no
//! test ran at all, or when the e2e phase passed fewer tests than the e2e crate contains.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::Context;

mod e2e_lanes;

/// Arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Skip the end-to-end tests on the local cluster.
    #[arg(long)]
    pub no_e2e: bool,
    /// Skip cargo fmt and clippy.
    #[arg(long)]
    pub no_lint: bool,
    /// Only the end-to-end phase (no lints, no workspace tests): for iterating on e2e.
    #[arg(long, conflicts_with_all = ["no_e2e", "no_lint"])]
    pub e2e_only: bool,
}

#[derive(Debug, Default)]
struct Tally {
    passed: u64,
    failed: u64,
    ignored: u64,
}

impl Tally {
    fn add(&mut self, other: &Tally) {
        self.passed += other.passed;
        self.failed += other.failed;
        self.ignored += other.ignored;
    }

    /// Reads one `test result: ok. 3 passed; 0 failed; 1 ignored; …` line.
    fn add_line(&mut self, line: &str) {
        let Some(rest) = line.trim().strip_prefix("test result: ") else {
            return;
        };
        for part in rest.split(';') {
            let words: Vec<&str> = part.split_whitespace().collect();
            let n = words
                .iter()
                .rev()
                .nth(1)
                .and_then(|w| w.parse::<u64>().ok());
            match (n, words.last()) {
                (Some(n), Some(&"passed")) => self.passed += n,
                (Some(n), Some(&"failed")) => self.failed += n,
                (Some(n), Some(&"ignored")) => self.ignored += n,
                _ => {}
            }
        }
    }
}

/// The libtest arguments that select the e2e tests (they are `#[ignore]`d so that
/// `cargo test --workspace` does not run them without a cluster): the same for listing and
/// running them, so the count and the run cannot disagree on what "every e2e test" is.
const E2E_SELECT: &[&str] = &["--ignored"];

/// How many tests the e2e phase must pass: the tests `cargo test -p e2e -- --ignored --list`
/// lists.
fn e2e_test_count(test_env: &dyn Fn(&mut Command)) -> anyhow::Result<u64> {
    eprintln!("==> listing the e2e tests");
    let mut cmd = cargo();
    cmd.args(["test", "-p", "e2e", "--"])
        .args(E2E_SELECT)
        .arg("--list")
        .stderr(Stdio::inherit());
    test_env(&mut cmd);
    let out = cmd
        .output()
        .context("running cargo test -p e2e -- --list")?;
    anyhow::ensure!(out.status.success(), "listing the e2e tests failed");
    let n = count_listed(&String::from_utf8_lossy(&out.stdout));
    anyhow::ensure!(n > 0, "the e2e crate lists no test");
    Ok(n)
}

/// Whether the e2e phase passed every test the e2e crate lists: a test binary that did not
/// build or died before its summary passes nothing and fails nothing, so only the count shows it.
fn e2e_complete(e2e: &Tally, expected: u64) -> Result<(), String> {
    if e2e.passed < expected {
        return Err(format!(
            "the e2e phase passed {} of the {expected} tests the e2e crate contains",
            e2e.passed
        ));
    }
    Ok(())
}

/// Counts the `name: test` lines of libtest's `--list` output.
fn count_listed(list: &str) -> u64 {
    list.lines()
        .filter(|l| l.trim_end().ends_with(": test"))
        .count() as u64
}

fn cargo() -> Command {
    xtask::cargo()
}

fn step(name: &str, cmd: &mut Command) -> anyhow::Result<()> {
    eprintln!("==> {name}");
    let status = cmd.status().with_context(|| format!("running {name}"))?;
    anyhow::ensure!(status.success(), "{name} failed");
    Ok(())
}

/// Runs a `cargo test` command, echoing its output and counting results.
fn run_tests(name: &str, cmd: &mut Command, tally: &mut Tally) -> anyhow::Result<bool> {
    eprintln!("==> {name}");
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {name}"))?;
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            println!("{line}");
            tally.add_line(&line);
        }
    }
    Ok(child.wait()?.success())
}

/// Builds the e2e test binaries and runs them in the order of [`e2e_lanes::plan`].
fn run_e2e(root: &Path, env: &dyn Fn(&mut Command), tally: &mut Tally) -> anyhow::Result<bool> {
    eprintln!("==> building the e2e tests");
    let mut build = cargo();
    build
        .args(["test", "-p", "e2e", "--no-run", "--message-format=json"])
        .stderr(Stdio::inherit());
    env(&mut build);
    let out = build.output().context("cargo test -p e2e --no-run")?;
    anyhow::ensure!(out.status.success(), "building the e2e tests failed");
    let exes = e2e_lanes::executables(&String::from_utf8_lossy(&out.stdout));
    anyhow::ensure!(!exes.is_empty(), "the e2e crate built no test binary");
    let plan = e2e_lanes::plan(&exes.keys().cloned().collect::<Vec<_>>());
    eprintln!("e2e order: {plan:?}");
    let command = |name: &str| {
        let mut cmd = Command::new(&exes[name]);
        cmd.args(E2E_SELECT)
            .arg("--test-threads=1")
            // As cargo runs test binaries: from their package.
            .current_dir(root.join("e2e"));
        env(&mut cmd);
        cmd
    };
    let mut ok = true;
    let run_one = |name: &str, tally: &mut Tally| -> anyhow::Result<bool> {
        let t = std::time::Instant::now();
        let passed = run_tests(&format!("e2e {name}"), &mut command(name), tally)?;
        eprintln!("e2e {name}: {:.1} min", t.elapsed().as_secs_f64() / 60.0);
        Ok(passed)
    };
    for name in &plan.first {
        ok &= run_one(name, tally)?;
    }
    // `access` beside the lane: its output is kept and printed when it ends, so that the
    // lane's streams on undisturbed.
    let beside = match &plan.beside {
        Some(name) => {
            eprintln!(
                "==> e2e {name} (beside {:?}; its output follows when it ends)",
                plan.lane
            );
            let mut child = command(name)
                .stdout(Stdio::piped())
                .spawn()
                .with_context(|| format!("running e2e {name}"))?;
            let out = child.stdout.take();
            let name = name.clone();
            Some(std::thread::spawn(move || {
                let t = std::time::Instant::now();
                let lines: Vec<String> = out
                    .map(|o| BufReader::new(o).lines().map_while(Result::ok).collect())
                    .unwrap_or_default();
                let ok = child.wait().is_ok_and(|s| s.success());
                (name, lines, ok, t.elapsed())
            }))
        }
        None => None,
    };
    for name in &plan.lane {
        ok &= run_one(name, tally)?;
    }
    if let Some(h) = beside {
        let (name, lines, beside_ok, took) = h
            .join()
            .map_err(|_| anyhow::anyhow!("the thread running e2e access panicked"))?;
        eprintln!("==> e2e {name} (ran beside the lane)");
        for line in &lines {
            println!("{line}");
            tally.add_line(line);
        }
        eprintln!("e2e {name}: {:.1} min", took.as_secs_f64() / 60.0);
        ok &= beside_ok;
    }
    for name in &plan.after {
        ok &= run_one(name, tally)?;
    }
    Ok(ok)
}

/// A fresh build (debug tests, release images, the cluster's state) takes about 15 GB of
/// target/; below this a run is likely to end in "no space left on device" part-way.
const LOW_DISK_BYTES: u64 = 20 << 30;

/// Free bytes on the filesystem holding `path`.
fn free_bytes(path: &std::path::Path) -> Option<u64> {
    let s = nix::sys::statvfs::statvfs(path).ok()?;
    Some(s.blocks_available() as u64 * s.fragment_size() as u64)
}

/// Says how much disk is left, loudly when it is little: an image import or a build that
/// fails for want of space otherwise looks like a product failure.
fn report_disk(when: &str, path: &std::path::Path) {
    let Some(free) = free_bytes(path) else { return };
    let gib = free as f64 / f64::from(1u32 << 30);
    if free < LOW_DISK_BYTES {
        eprintln!(
            "WARNING {when}: only {gib:.1} GiB free on the filesystem of {}; a full run needs \
             about 20 GiB (builds, images, the cluster's containerd)",
            path.display()
        );
    } else {
        eprintln!(
            "{when}: {gib:.1} GiB free on the filesystem of {}",
            path.display()
        );
    }
}

/// What the cluster looked like when e2e tests failed, printed last so that a CI summary that
/// shows only the end of the log still shows it.
fn cluster_diagnostics(root: &std::path::Path) {
    let kubeconfig = root.join("target/cluster/kubeconfig");
    let kubectl = crate::deploy::kubectl_binary();
    eprintln!("==> cluster state after failed e2e tests");
    report_disk("now", root);
    for args in [
        &["get", "nodes", "-o", "wide"][..],
        &[
            "get",
            "pods",
            "-A",
            "-o",
            "wide",
            "--field-selector=status.phase!=Succeeded",
        ][..],
        &[
            "get",
            "events",
            "-A",
            "--field-selector=type=Warning",
            "--sort-by=.lastTimestamp",
        ][..],
    ] {
        match Command::new(&kubectl)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(args)
            .output()
        {
            Ok(out) => {
                let text = String::from_utf8_lossy(&out.stdout);
                let lines: Vec<&str> = text.lines().collect();
                eprintln!("$ kubectl {}", args.join(" "));
                // The newest events are last; a wedged cluster has hundreds.
                for l in &lines[lines.len().saturating_sub(25)..] {
                    eprintln!("{l}");
                }
                let err = String::from_utf8_lossy(&out.stderr);
                if !err.trim().is_empty() {
                    eprintln!("{}", err.trim());
                }
            }
            Err(e) => eprintln!("kubectl {}: {e}", args.join(" ")),
        }
    }
}

/// Runs everything.
pub fn run(args: Args) -> anyhow::Result<()> {
    xtask::deps::ensure(xtask::Needs::All)?;
    let root = crate::workspace_root();
    std::env::set_current_dir(&root).context("entering the workspace")?;
    report_disk("at start", &root);
    // Where the time went, printed at the end (CI shows the end of the log): the budget
    // is 60 minutes.
    let mut times: Vec<(&str, std::time::Duration)> = Vec::new();
    let mut t = std::time::Instant::now();
    if !args.no_lint && !args.e2e_only {
        step(
            "cargo fmt --check",
            cargo().args(["fmt", "--all", "--", "--check"]),
        )?;
        step(
            "cargo clippy",
            cargo().args([
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ]),
        )?;
        times.push(("fmt and clippy", t.elapsed()));
        t = std::time::Instant::now();
    }
    // The controllers' integration tests run their own kube-apiserver: build (or find
    // cached) the pinned Kubernetes binaries first, also with --no-e2e.
    let kube_bin = crate::cluster::ensure_kubernetes_binaries().context("Kubernetes binaries")?;
    times.push(("Kubernetes binaries", t.elapsed()));
    t = std::time::Instant::now();
    // kubectl for the tests that drive it: the one built for the cluster (a fresh machine has
    // none in /usr/bin), as $KUBECTL and first in PATH with kubectl-virt (target/bin).
    let user_bin = crate::user_bin::link(&kube_bin)?;
    let kubectl = kube_bin.join("kubectl");
    let path = crate::user_bin::path_env();
    eprintln!(
        "tests use KUBECTL={} and PATH={}:…",
        kubectl.display(),
        user_bin.display()
    );
    let test_env = |cmd: &mut Command| {
        cmd.env("KUBE_APISERVER_BIN", kube_bin.join("kube-apiserver"))
            .env("KUBECTL", &kubectl)
            .env("PATH", &path);
    };
    let mut tally = Tally::default();
    let mut ok = true;
    if !args.e2e_only {
        let mut workspace = cargo();
        workspace.args(["test", "--workspace", "--no-fail-fast"]);
        test_env(&mut workspace);
        ok = run_tests("cargo test --workspace", &mut workspace, &mut tally)?;
        times.push(("cargo test --workspace (build and run)", t.elapsed()));
    }
    t = std::time::Instant::now();
    if !args.no_e2e {
        // What the e2e phase must run: every test of the e2e crate that `--ignored` selects.
        // Fewer passed than listed (a test binary that did not build, a filter, a panic
        // before libtest's summary) is a failure, not a smaller green run.
        let expected = e2e_test_count(&test_env)?;
        let xtask = std::env::current_exe().context("locating xtask")?;
        let up = Command::new(&xtask)
            // Two nodes: the live migration e2e tests move VMs between them.
            .args(["cluster", "up", "--nodes", "2"])
            .status()
            .context("cluster up")?;
        times.push(("e2e test build and cluster up", t.elapsed()));
        t = std::time::Instant::now();
        report_disk("before the e2e tests", &root);
        let mut e2e = Tally::default();
        if up.success() {
            let e2e_env = |cmd: &mut Command| {
                cmd.env("KUBECONFIG", root.join("target/cluster/kubeconfig"))
                    // Images from the debug build the workspace tests just made, not a
                    // second, optimised build of everything ([`crate::images::Profile::Dev`]).
                    .env(crate::images::PROFILE_ENV, "dev");
                test_env(cmd);
            };
            let e2e_ok = run_e2e(&root, &e2e_env, &mut e2e)?;
            if !e2e_ok {
                cluster_diagnostics(&root);
            }
            ok &= e2e_ok;
        } else {
            eprintln!("cluster up failed; logs in target/cluster/logs");
            e2e.failed += 1;
            ok = false;
        }
        println!(
            "e2e: {} of {expected} tests passed ({} failed)",
            e2e.passed, e2e.failed
        );
        if let Err(e) = e2e_complete(&e2e, expected) {
            eprintln!("{e}");
            ok = false;
        }
        tally.add(&e2e);
        times.push(("e2e phase (images, deploy, tests)", t.elapsed()));
        let down = Command::new(&xtask)
            .args(["cluster", "down"])
            .status()
            .context("cluster down")?;
        ok &= down.success();
    }
    for (what, took) in &times {
        println!("time: {what}: {:.1} min", took.as_secs_f64() / 60.0);
    }
    println!(
        "{} passed, {} failed, {} skipped",
        tally.passed, tally.failed, tally.ignored
    );
    anyhow::ensure!(
        tally.passed > 0,
        "no test ran: treating an empty run as a failure"
    );
    anyhow::ensure!(ok && tally.failed == 0, "tests failed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Tally;

    #[test]
    fn tally_reads_cargo_result_lines() {
        let mut t = Tally::default();
        t.add_line("test result: ok. 21 passed; 0 failed; 2 ignored; 0 measured; 0 filtered out; finished in 0.00s");
        t.add_line(
            "test result: FAILED. 3 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out",
        );
        t.add_line("running 5 tests");
        assert_eq!((t.passed, t.failed, t.ignored), (24, 1, 2));
    }

    /// The failure this check exists for: one of two e2e binaries ends without a summary
    /// (killed, or it did not build), the other passes; nothing "failed".
    #[test]
    fn an_e2e_run_with_a_missing_binary_is_incomplete() {
        let mut e2e = Tally::default();
        e2e.add_line("test result: ok. 30 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out");
        assert_eq!(e2e.failed, 0);
        assert!(super::e2e_complete(&e2e, 36).is_err());
        e2e.add_line("test result: ok. 6 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out");
        assert_eq!(super::e2e_complete(&e2e, 36), Ok(()));
    }

    #[test]
    fn counts_listed_tests_only() {
        let list = "migration::a_vm_moves: test\nplugin::console: test\n\
                    src/lib.rs - xtask (line 27): test\nbench_x: benchmark\n\n\
                    3 tests, 1 benchmark\n";
        assert_eq!(super::count_listed(list), 3);
    }
}
