//! `cargo xtask test`: the README's test command and what `.ci/run` runs. Formatting,
//! lints, every unit and integration test (real etcd, libvirt/QEMU, kubectl), then the
//! end-to-end tests on a real local Kubernetes cluster. Fails when anything fails, when no
//! test ran at all, or when the e2e phase passed fewer tests than the e2e crate contains.

use std::io::{BufRead, BufReader, Write as _};
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::Context;

mod e2e_lanes;
#[cfg(test)]
mod readme_tests;
mod report;
mod workspace;

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

/// The variable e2e tests find the skips file by (`e2e::SKIPS_FILE_ENV`).
const SKIPS_FILE_ENV: &str = "E2E_SKIPS_FILE";

/// The skips e2e tests recorded (`e2e::skip`, a JSON line each), as `test (reason)`.
fn read_skips(file: &Path) -> Vec<String> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|v| {
            format!(
                "{} ({})",
                v["test"].as_str().unwrap_or("?"),
                v["reason"].as_str().unwrap_or("?")
            )
        })
        .collect()
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

/// What one `cargo test` command or test binary printed, and how it ended.
struct Ran {
    status: std::io::Result<std::process::ExitStatus>,
    lines: Vec<String>,
    /// The tests that failed, with how long after the start each did.
    failed_after: Vec<(String, std::time::Duration)>,
}

impl Ran {
    fn passed(&self) -> bool {
        self.status.as_ref().is_ok_and(|s| s.success())
    }
}

/// Runs a `cargo test` command, echoing its output and counting results.
fn run_tests(name: &str, cmd: &mut Command, tally: &mut Tally) -> anyhow::Result<Ran> {
    eprintln!("==> {name}");
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {name}"))?;
    let (t0, mut lines, mut failed_after) = (std::time::Instant::now(), Vec::new(), Vec::new());
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            println!("{line}");
            tally.add_line(&line);
            if let Some(t) = report::failed_test(&line) {
                failed_after.push((t, t0.elapsed()));
            }
            lines.push(line);
        }
    }
    let status = child.wait();
    if !status.as_ref().is_ok_and(|s| s.success()) {
        // A binary killed (the OOM killer, a signal) prints no summary: say how it ended.
        eprintln!("{name} ended: {status:?}");
    }
    Ok(Ran {
        status,
        lines,
        failed_after,
    })
}

/// MemAvailable of /proc/meminfo, in KiB.
fn mem_available_kib() -> Option<u64> {
    std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        m.lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    })
}

/// Free disk and available memory, one line: printed after each e2e binary, so a run that
/// failed from a full disk or the OOM killer shows when it happened.
fn resources(root: &Path) -> String {
    let disk = free_bytes(root).map_or_else(
        || "?".to_string(),
        |b| format!("{:.1}", b as f64 / f64::from(1u32 << 30)),
    );
    let mem = mem_available_kib().map_or_else(
        || "?".to_string(),
        |kb| format!("{:.1}", kb as f64 / 1048576.0),
    );
    let limit = report::cgroup_memory_limit()
        .map(|l| {
            format!(
                " (this job's cgroup: at most {:.1} GiB)",
                l as f64 / f64::from(1u32 << 30)
            )
        })
        .unwrap_or_default();
    let oom =
        report::oom_kills().map_or_else(String::new, |n| format!(", {n} OOM kills since boot"));
    format!("{disk} GiB disk free, {mem} GiB memory available{limit}{oom}")
}

/// A test binary taking longer than this is named in the run's summary.
const SLOW_BINARY: std::time::Duration = std::time::Duration::from_secs(30);

/// Builds every test binary of the workspace, runs them [`workspace::JOBS`] at a time, then
/// the doc tests. Says whether all passed, and which binaries were slow.
fn run_workspace_tests(
    env: &(dyn Fn(&mut Command) + Sync),
    tally: &mut Tally,
) -> anyhow::Result<(bool, Vec<(String, std::time::Duration)>)> {
    let linted = std::env::var_os(WRAPPER_ENV).is_some();
    eprintln!(
        "==> building the workspace's tests{}",
        if linted {
            " (and linting every target: clippy -D warnings)"
        } else {
            ""
        }
    );
    let mut build = cargo();
    build
        .args([
            "test",
            "--workspace",
            "--all-targets",
            "--no-run",
            "--message-format=json",
        ])
        .stderr(Stdio::inherit());
    env(&mut build);
    let out = build.output().context("cargo test --workspace --no-run")?;
    // The compiler's messages (clippy's among them) come as JSON on stdout: print them.
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Ok(m) = serde_json::from_str::<serde_json::Value>(line)
            && m["reason"] == "compiler-message"
            && let Some(text) = m["message"]["rendered"].as_str()
        {
            eprint!("{text}");
        }
    }
    // A lint failing is a failed build: nothing is worth testing after it, as when clippy
    // ran first.
    anyhow::ensure!(
        out.status.success(),
        "building (and linting) the workspace's tests failed"
    );
    let binaries = workspace::executables(&String::from_utf8_lossy(&out.stdout));
    anyhow::ensure!(!binaries.is_empty(), "the workspace built no test binary");
    eprintln!(
        "==> {} test binaries, {} at a time",
        binaries.len(),
        workspace::JOBS
    );
    let mut ok = true;
    let mut failed = Vec::new();
    let mut slow = Vec::new();
    workspace::run(binaries, env, &mut |o| {
        println!("==> {} ({:.1} s)", o.binary.name, o.took.as_secs_f64());
        for line in &o.lines {
            println!("{line}");
            tally.add_line(line);
        }
        if !o.passed {
            ok = false;
            failed.push(o.binary.name.clone());
        }
        if o.took > SLOW_BINARY {
            slow.push((o.binary.name, o.took));
        }
    })?;
    let mut doc = cargo();
    doc.args(["test", "--workspace", "--doc", "--no-fail-fast"]);
    env(&mut doc);
    ok &= run_tests("cargo test --workspace --doc", &mut doc, tally)?.passed();
    if !failed.is_empty() {
        eprintln!("test binaries that failed: {}", failed.join(", "));
    }
    slow.sort_by_key(|b| std::cmp::Reverse(b.1));
    Ok((ok, slow))
}

/// How one e2e phase went: each binary's outcome, the lowest free disk and memory, and
/// what changed for the worse in the cluster (with when).
struct E2ePhase {
    outcomes: Vec<report::Outcome>,
    lows: report::Lows,
    changes: Vec<(f64, String)>,
}

/// Builds the e2e test binaries and runs them in [`e2e_lanes::plan`]'s order; says how each
/// ended (printed again in the run's summary, where a CI log's tail shows it), the lowest
/// free disk and memory while they ran, and what happened to the cluster's nodes and pods.
fn run_e2e(root: &Path, env: &dyn Fn(&mut Command), tally: &mut Tally) -> anyhow::Result<E2ePhase> {
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
    let start = std::time::Instant::now();
    let minutes = move || start.elapsed().as_secs_f64() / 60.0;
    let sampler = report::Sampler::start(
        root,
        start,
        Some((
            crate::deploy::kubectl_binary(),
            root.join("target/cluster/kubeconfig"),
        )),
    );
    let mut outcomes = Vec::new();
    let mut run_one = |name: &str, tally: &mut Tally| -> anyhow::Result<()> {
        let (t, started) = (std::time::Instant::now(), minutes());
        let ran = run_tests(&format!("e2e {name}"), &mut command(name), tally)?;
        eprintln!(
            "e2e {name}: {:.1} min; {}",
            t.elapsed().as_secs_f64() / 60.0,
            resources(root)
        );
        outcomes.push(report::Outcome::new(
            name,
            started,
            t.elapsed(),
            ran.status,
            &ran.lines,
            &ran.failed_after,
        ));
        Ok(())
    };
    for name in &plan.first {
        run_one(name, tally)?;
    }
    // The binaries beside the lane: their output is kept and printed when they end (in one
    // block, between two lines of the lane's), so that the lane's streams on undisturbed and
    // the log still tells failures in the order they happened.
    let mut beside = Vec::new();
    for name in &plan.beside {
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
        let started = minutes();
        beside.push(std::thread::spawn(move || {
            let t = std::time::Instant::now();
            let (mut lines, mut failed_after) = (Vec::new(), Vec::new());
            for line in out
                .into_iter()
                .flat_map(|o| BufReader::new(o).lines().map_while(Result::ok))
            {
                if let Some(test) = report::failed_test(&line) {
                    failed_after.push((test, t.elapsed()));
                }
                lines.push(line);
            }
            let status = child.wait();
            {
                let mut stdout = std::io::stdout().lock();
                let _ = writeln!(stdout, "==> e2e {name} (beside the lane) ended: {status:?}");
                for line in &lines {
                    let _ = writeln!(stdout, "{line}");
                }
            }
            let outcome = report::Outcome::new(
                &format!("{name} (beside the lane)"),
                started,
                t.elapsed(),
                status,
                &lines,
                &failed_after,
            );
            (name, lines, outcome)
        }));
    }
    for name in &plan.lane {
        run_one(name, tally)?;
    }
    let mut beside_outcomes = Vec::new();
    for h in beside {
        let (name, lines, outcome) = h.join().map_err(|_| {
            anyhow::anyhow!("a thread running an e2e binary beside the lane panicked")
        })?;
        for line in &lines {
            tally.add_line(line);
        }
        eprintln!("e2e {name}: {:.1} min", outcome.took.as_secs_f64() / 60.0);
        beside_outcomes.push(outcome);
    }
    for name in &plan.after {
        run_one(name, tally)?;
    }
    outcomes.extend(beside_outcomes);
    let (lows, changes) = sampler.finish();
    Ok(E2ePhase {
        outcomes,
        lows,
        changes,
    })
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

/// The cluster's unwell nodes and pods, one line each, and the last log lines of
/// kubevirt-rs's own unwell pods: for the run's summary.
fn unwell_cluster(kubectl: &Path, kubeconfig: &Path) -> Vec<String> {
    let get = |args: &[&str]| -> Option<serde_json::Value> {
        let out = Command::new(kubectl)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(["--request-timeout=20s"])
            .args(args)
            .output()
            .ok()?;
        serde_json::from_slice(&out.stdout).ok()
    };
    let (Some(pods), Some(nodes)) = (
        get(&["get", "pods", "-A", "-o", "json"]),
        get(&["get", "nodes", "-o", "json"]),
    ) else {
        return vec!["the cluster's API did not answer".to_string()];
    };
    let mut out = report::unwell(&pods, &nodes);
    let ours: Vec<String> = out
        .iter()
        .filter_map(|l| l.strip_prefix("pod kubevirt/"))
        .filter_map(|l| l.split_whitespace().next())
        .take(3)
        .map(str::to_string)
        .collect();
    for pod in ours {
        let Ok(logs) = Command::new(kubectl)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args([
                "-n",
                "kubevirt",
                "logs",
                &pod,
                "--all-containers",
                "--tail=3",
            ])
            .args(["--request-timeout=20s"])
            .output()
        else {
            continue;
        };
        for l in String::from_utf8_lossy(&logs.stdout).lines() {
            out.push(format!(
                "  {pod}: {}",
                l.chars().take(240).collect::<String>()
            ));
        }
    }
    out
}

/// What the cluster looked like when e2e tests failed (the full listing; a few lines of it
/// go into the summary at the end, where a CI log's tail shows them).
fn cluster_diagnostics(root: &std::path::Path) -> Vec<String> {
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
    unwell_cluster(&kubectl, &kubeconfig)
}

/// Runs everything.
/// The variable naming the compiler wrapper of the workspace's own crates.
const WRAPPER_ENV: &str = "RUSTC_WORKSPACE_WRAPPER";
/// clippy-driver's lint flags (what `cargo clippy -- -D warnings` passes it).
const CLIPPY_ARGS: &str = "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__";

/// clippy-driver on PATH (rustup's proxy), or why not.
fn clippy_driver() -> anyhow::Result<std::path::PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("clippy-driver"))
        .find(|p| p.is_file())
        .context("clippy-driver not found on PATH: `rustup component add clippy`")
}

/// Lints ride on the test build: with clippy-driver as the workspace crates' compiler
/// (what `cargo clippy` runs, in build mode here), one build both lints every target and
/// makes the test binaries, and the e2e images' binaries reuse it; a separate `cargo
/// clippy` compiled the whole workspace and its dependencies a second time (about 8 of a
/// cold CI run's minutes). Every cargo of this run must see the same wrapper or it
/// rebuilds the workspace's crates, so a run started without it starts itself again with
/// it (`.ci/run` sets it first, which saves that).
fn with_lints() -> anyhow::Result<Option<std::process::ExitCode>> {
    if std::env::var_os(WRAPPER_ENV).is_some() && std::env::var_os("CLIPPY_ARGS").is_some() {
        return Ok(None);
    }
    let driver = clippy_driver()?;
    eprintln!(
        "==> lints through the build: running again with {WRAPPER_ENV}={}",
        driver.display()
    );
    let status = xtask::cargo()
        .arg("xtask")
        .args(std::env::args_os().skip(1))
        .env(WRAPPER_ENV, &driver)
        .env("CLIPPY_ARGS", CLIPPY_ARGS)
        .current_dir(crate::workspace_root())
        .status()
        .context("running cargo xtask test with clippy-driver")?;
    Ok(Some(std::process::ExitCode::from(
        u8::try_from(status.code().unwrap_or(1)).unwrap_or(1),
    )))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let lint = !args.no_lint && !args.e2e_only;
    if lint && let Some(code) = with_lints()? {
        if code == std::process::ExitCode::SUCCESS {
            return Ok(());
        }
        anyhow::bail!("cargo xtask test (with clippy-driver) failed");
    }
    xtask::deps::ensure(xtask::Needs::All)?;
    let root = crate::workspace_root();
    std::env::set_current_dir(&root).context("entering the workspace")?;
    report_disk("at start", &root);
    // Where the time went, printed at the end (CI shows the end of the log): the budget
    // is 60 minutes.
    let mut times: Vec<(&str, std::time::Duration)> = Vec::new();
    let mut outcomes: Vec<report::Outcome> = Vec::new();
    let mut lows = None;
    let mut changes = Vec::new();
    let mut skipped = Vec::new();
    let mut unwell = Vec::new();
    let mut t = std::time::Instant::now();
    if lint {
        step(
            "cargo fmt --check",
            cargo().args(["fmt", "--all", "--", "--check"]),
        )?;
        times.push(("fmt (clippy runs in the test build)", t.elapsed()));
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
    let mut slow_binaries = Vec::new();
    if !args.e2e_only {
        let (passed, slow) = run_workspace_tests(&test_env, &mut tally)?;
        ok = passed;
        slow_binaries = slow;
        times.push(("workspace tests (build and run)", t.elapsed()));
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
            let skips_file = root.join("target/e2e-skips.log");
            let _ = std::fs::remove_file(&skips_file);
            let e2e_env = |cmd: &mut Command| {
                cmd.env("KUBECONFIG", root.join("target/cluster/kubeconfig"))
                    .env(SKIPS_FILE_ENV, &skips_file)
                    // Images from the debug build the workspace tests just made, not a
                    // second, optimised build of everything ([`crate::images::Profile::Dev`]).
                    .env(crate::images::PROFILE_ENV, "dev");
                test_env(cmd);
            };
            let phase = run_e2e(&root, &e2e_env, &mut e2e)?;
            skipped = read_skips(&skips_file);
            // libtest counted them as passed; they checked nothing.
            let n = skipped.len() as u64;
            e2e.passed = e2e.passed.saturating_sub(n);
            e2e.ignored += n;
            let e2e_ok = phase.outcomes.iter().all(|o| o.passed);
            if !e2e_ok {
                unwell = cluster_diagnostics(&root);
            }
            if !phase.changes.is_empty() {
                eprintln!("==> what changed in the cluster during the e2e phase (min)");
                for (at, what) in &phase.changes {
                    eprintln!("{at:>5.1} {what}");
                }
            }
            ok &= e2e_ok;
            outcomes = phase.outcomes;
            lows = Some(phase.lows);
            changes = phase.changes;
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
    // The summary, last, in few lines: a CI log keeps only its tail.
    println!("==> summary");
    let phases: Vec<String> = times
        .iter()
        .map(|(what, took)| format!("{what} {:.1}", took.as_secs_f64() / 60.0))
        .collect();
    let slow: Vec<String> = slow_binaries
        .iter()
        .map(|(b, took)| format!("{b} {:.1}", took.as_secs_f64() / 60.0))
        .collect();
    if !slow.is_empty() {
        println!("slow workspace test binaries (min): {}", slow.join("; "));
    }
    let e2e_took: Vec<String> = outcomes
        .iter()
        .map(|o| format!("{} {:.1}", o.name, o.took.as_secs_f64() / 60.0))
        .collect();
    if !e2e_took.is_empty() {
        println!("e2e binaries (min): {}", e2e_took.join("; "));
    }
    for o in outcomes.iter().filter(|o| !o.passed) {
        println!("{}", o.line());
    }
    if let Some(lows) = lows {
        println!("{}", lows.line());
    }
    if !unwell.is_empty() {
        println!("cluster after the failed e2e tests:");
        for l in unwell.iter().take(20) {
            println!("  {l}");
        }
    }
    if !skipped.is_empty() {
        println!(
            "e2e checks skipped ({}; a skip is not a pass): {}",
            skipped.len(),
            skipped.join("; ")
        );
    }
    // Last, where the shortest tail still shows them: what went wrong first.
    if !changes.is_empty() {
        println!("{}", report::changes_line(&changes, 900));
    }
    for l in report::first_failures(&outcomes, 3) {
        println!("{l}");
    }
    // Where the time went, in the shortest tail too: CI's budget is 60 minutes.
    println!("time (min): {}", phases.join("; "));
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
