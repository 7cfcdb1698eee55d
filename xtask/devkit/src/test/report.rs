//! What a failed run must say in its last lines: a CI log keeps only its tail, so how each
//! e2e binary ended, the lowest free disk and memory while they ran, and the cluster's
//! broken pods come last, a few lines each.

use std::process::ExitStatus;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How one e2e binary ended.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub name: String,
    /// Minutes from the start of the e2e phase.
    pub started: f64,
    pub took: Duration,
    /// `exit status: 101`, `signal: 9 (SIGKILL)`, or why it could not be waited for.
    pub status: String,
    pub passed: bool,
    /// Whether libtest printed its `test result:` line (a killed binary does not).
    pub summary: bool,
    pub failed_tests: Vec<String>,
    /// Each failed test, when it failed (minutes from the start of the e2e phase) and the
    /// first lines of its panic: the cause a CI log's tail must name.
    pub failures: Vec<Failure>,
}

/// One failed test of an e2e binary.
#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub binary: String,
    pub test: String,
    pub at: f64,
    pub message: String,
}

impl Outcome {
    pub fn new(
        name: &str,
        started: f64,
        took: Duration,
        status: std::io::Result<ExitStatus>,
        lines: &[String],
        failed_after: &[(String, Duration)],
    ) -> Outcome {
        let messages = panic_messages(lines);
        let binary = name.split_whitespace().next().unwrap_or(name).to_string();
        let failures = failed_tests(lines)
            .into_iter()
            .map(|test| Failure {
                binary: binary.clone(),
                at: failed_after
                    .iter()
                    .find(|(t, _)| *t == test)
                    .map_or(started + took.as_secs_f64() / 60.0, |(_, d)| {
                        started + d.as_secs_f64() / 60.0
                    }),
                message: messages.get(&test).cloned().unwrap_or_default(),
                test,
            })
            .collect();
        Outcome {
            failures,
            name: name.to_string(),
            started,
            took,
            passed: status.as_ref().is_ok_and(|s| s.success()),
            status: match status {
                Ok(s) => s.to_string(),
                Err(e) => format!("not waited for: {e}"),
            },
            summary: lines
                .iter()
                .any(|l| l.trim_start().starts_with("test result: ")),
            failed_tests: failed_tests(lines),
        }
    }

    /// One line: when it ran, how it ended, and which tests failed.
    pub fn line(&self) -> String {
        let mut s = format!(
            "e2e {} ({:.1}–{:.1} min): ",
            self.name,
            self.started,
            self.started + self.took.as_secs_f64() / 60.0
        );
        if self.passed {
            s.push_str("passed");
            return s;
        }
        s.push_str(&self.status);
        if !self.summary {
            s.push_str(", no libtest summary (killed or aborted mid-test)");
        }
        if !self.failed_tests.is_empty() {
            s.push_str(&format!("; failed: {}", self.failed_tests.join(", ")));
        }
        s
    }
}

/// The test a libtest `test NAME ... FAILED` line names.
pub fn failed_test(line: &str) -> Option<String> {
    let rest = line.trim().strip_prefix("test ")?;
    Some(rest.strip_suffix(" ... FAILED")?.to_string())
}

/// The names of libtest's `test NAME ... FAILED` lines.
pub fn failed_tests(lines: &[String]) -> Vec<String> {
    lines.iter().filter_map(|l| failed_test(l)).collect()
}

/// How much of a panic message the summary keeps per test.
const MESSAGE_CHARS: usize = 320;

/// Each failed test's panic message from libtest's failure section (`---- NAME stdout ----`,
/// then the test's captured output, then `thread 'NAME' panicked at FILE:LINE:COL:`, or since
/// Rust 1.9x `thread 'NAME' (TID) panicked at …`, and the message): its first two lines, with
/// where it panicked.
pub fn panic_messages(lines: &[String]) -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::new();
    let mut test: Option<String> = None;
    let mut it = lines.iter().peekable();
    while let Some(l) = it.next() {
        if let Some(name) = l
            .trim()
            .strip_prefix("---- ")
            .and_then(|r| r.strip_suffix(" stdout ----"))
        {
            test = Some(name.to_string());
            continue;
        }
        let Some(t) = test.as_ref() else { continue };
        let Some((_, at)) = l
            .trim()
            .strip_prefix("thread '")
            .and_then(|r| r.split_once(" panicked at "))
        else {
            continue;
        };
        let mut msg: Vec<String> = Vec::new();
        while let Some(next) = it.peek() {
            let n = next.trim();
            if n.is_empty() || n.starts_with("note: ") || n.starts_with("---- ") || msg.len() == 2 {
                break;
            }
            msg.push(n.to_string());
            it.next();
        }
        let text = format!("{} ({})", msg.join(" / "), at.trim_end_matches(':'));
        out.entry(t.clone())
            .or_insert_with(|| text.chars().take(MESSAGE_CHARS).collect());
        test = None;
    }
    out
}

/// The `n` earliest failures of a run, a line each: when, which test, and its panic.
pub fn first_failures(outcomes: &[Outcome], n: usize) -> Vec<String> {
    let mut all: Vec<&Failure> = outcomes.iter().flat_map(|o| &o.failures).collect();
    all.sort_by(|a, b| a.at.total_cmp(&b.at));
    all.into_iter()
        .take(n)
        .map(|f| {
            format!(
                "failed at {:.1} min: {}::{}: {}",
                f.at,
                f.binary,
                f.test,
                if f.message.is_empty() {
                    "(no panic message)"
                } else {
                    &f.message
                }
            )
        })
        .collect()
}

/// The lowest free disk and available memory seen while the e2e binaries ran, sampled every
/// few seconds: a disk that filled for a minute and was freed again (images, guest disks)
/// shows here, not in the figures printed between binaries.
#[derive(Debug, Clone, Copy, Default)]
pub struct Lows {
    /// (GiB, minutes from the start of the e2e phase)
    pub disk: Option<(f64, f64)>,
    pub memory: Option<(f64, f64)>,
    /// The kernel's OOM kill counter at the first sample and the last, and when it first grew:
    /// a killed etcd or test binary says nothing itself.
    pub oom_kills: Option<(u64, u64, Option<f64>)>,
}

impl Lows {
    fn note_oom(&mut self, count: Option<u64>, at: f64) {
        let Some(n) = count else { return };
        self.oom_kills = Some(match self.oom_kills {
            None => (n, n, None),
            Some((first, last, when)) => (first, n, when.or_else(|| (n > last).then_some(at))),
        });
    }

    fn note(&mut self, disk: Option<f64>, memory: Option<f64>, at: f64) {
        if let Some(d) = disk
            && self.disk.is_none_or(|(low, _)| d < low)
        {
            self.disk = Some((d, at));
        }
        if let Some(m) = memory
            && self.memory.is_none_or(|(low, _)| m < low)
        {
            self.memory = Some((m, at));
        }
    }

    pub fn line(&self) -> String {
        let f = |v: Option<(f64, f64)>| {
            v.map_or_else(
                || "?".to_string(),
                |(g, at)| format!("{g:.1} GiB at {at:.1} min"),
            )
        };
        let oom = match self.oom_kills {
            Some((first, last, Some(at))) => {
                format!("; {} OOM kills, the first at {at:.1} min", last - first)
            }
            Some(_) => "; no OOM kill".to_string(),
            None => String::new(),
        };
        format!(
            "lowest during e2e: disk free {}, memory available {}{oom}",
            f(self.disk),
            f(self.memory)
        )
    }
}

/// The kernel's count of processes the OOM killer killed (`oom_kill` of /proc/vmstat; a
/// cgroup's OOM kills count too).
pub fn oom_kills() -> Option<u64> {
    std::fs::read_to_string("/proc/vmstat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))?
        .trim()
        .parse()
        .ok()
}

/// The memory limit of this process's own cgroup, when it has one: a CI job in a container
/// may be held to less than /proc/meminfo shows.
pub fn cgroup_memory_limit() -> Option<u64> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let read = |p: String| -> Option<u64> { std::fs::read_to_string(p).ok()?.trim().parse().ok() };
    for line in cgroups.lines() {
        let mut f = line.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        let limit = if controllers.is_empty() {
            read(format!("/sys/fs/cgroup{path}/memory.max"))
        } else if controllers.split(',').any(|c| c == "memory") {
            read(format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes"))
        } else {
            continue;
        };
        // cgroup v1 says "no limit" with a huge number, v2 with "max" (not a number).
        if let Some(l) = limit.filter(|l| *l < 1 << 50) {
            return Some(l);
        }
    }
    None
}

/// What the sampler last saw of the cluster, to name what changed for the worse between two
/// looks: a node no longer Ready, a container restarted (with how it last ended), a pod of
/// kubevirt-rs' own no longer ready (and ready again), the API not answering.
#[derive(Debug, Default)]
pub struct ClusterSeen {
    looked: bool,
    api_down: bool,
    nodes_ready: std::collections::BTreeMap<String, bool>,
    restarts: std::collections::BTreeMap<String, u64>,
    ours_ready: std::collections::BTreeMap<String, bool>,
}

/// The namespace of kubevirt-rs' own pods, whose readiness the sampler follows.
const OURS: &str = "kubevirt";

impl ClusterSeen {
    /// The API did not answer this look.
    pub fn unanswered(&mut self) -> Vec<String> {
        if std::mem::replace(&mut self.api_down, true) {
            return Vec::new();
        }
        vec!["the cluster's API did not answer".to_string()]
    }

    /// What changed since the last look, from `kubectl get pods -A -o json` and `kubectl get
    /// nodes -o json`.
    pub fn look(&mut self, pods: &serde_json::Value, nodes: &serde_json::Value) -> Vec<String> {
        let mut out = Vec::new();
        if std::mem::replace(&mut self.api_down, false) {
            out.push("the cluster's API answers again".to_string());
        }
        let first = !std::mem::replace(&mut self.looked, true);
        for n in nodes["items"].as_array().into_iter().flatten() {
            let name = n["metadata"]["name"].as_str().unwrap_or("?").to_string();
            let ready = n["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|c| c["type"] == "Ready");
            let is = ready.is_some_and(|c| c["status"] == "True");
            let was = self.nodes_ready.insert(name.clone(), is);
            if was.unwrap_or(true) != is {
                out.push(if is {
                    format!("node {name} Ready again")
                } else {
                    format!(
                        "node {name} not Ready: {}",
                        ready.and_then(|c| c["message"].as_str()).unwrap_or("")
                    )
                });
            }
        }
        for p in pods["items"].as_array().into_iter().flatten() {
            let ns = p["metadata"]["namespace"].as_str().unwrap_or("?");
            let pod = format!("{ns}/{}", p["metadata"]["name"].as_str().unwrap_or("?"));
            for c in ["initContainerStatuses", "containerStatuses"]
                .iter()
                .flat_map(|k| p["status"][*k].as_array().into_iter().flatten())
            {
                let key = format!("{pod}/{}", c["name"].as_str().unwrap_or("?"));
                let n = c["restartCount"].as_u64().unwrap_or(0);
                let before = self.restarts.insert(key.clone(), n);
                if n > before.unwrap_or(if first { n } else { 0 }) {
                    let last = &c["lastState"]["terminated"];
                    out.push(format!(
                        "{key} restarted ({n} in all; last: {} {}{})",
                        last["reason"].as_str().unwrap_or("?"),
                        last["exitCode"].as_i64().unwrap_or(0),
                        last["finishedAt"]
                            .as_str()
                            .map(|t| format!(" at {t}"))
                            .unwrap_or_default()
                    ));
                }
            }
            if ns != OURS || !p["metadata"]["deletionTimestamp"].is_null() {
                continue;
            }
            let ready = p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            match self.ours_ready.insert(pod.clone(), ready) {
                Some(true) if !ready => out.push(format!("pod {pod} not ready")),
                Some(false) if ready => out.push(format!("pod {pod} ready again")),
                _ => {}
            }
        }
        out
    }
}

/// How often the sampler looks at the cluster (a kubectl call for pods, one for nodes).
const CLUSTER_LOOK_EVERY: u32 = 4;
/// How many of the cluster's changes a run keeps.
const CLUSTER_CHANGES_KEPT: usize = 300;

/// Samples free disk and memory in the background until dropped.
/// and, given kubectl and a kubeconfig, what changes in the cluster (see [`ClusterSeen`]).
pub struct Sampler {
    stop: Arc<AtomicBool>,
    lows: Arc<Mutex<Lows>>,
    changes: Arc<Mutex<Vec<(f64, String)>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// `kubectl get RESOURCE -o json` (all namespaces for pods), or None when the API did not
/// answer.
fn get_json(
    kube: &(std::path::PathBuf, std::path::PathBuf),
    args: &[&str],
) -> Option<serde_json::Value> {
    let out = std::process::Command::new(&kube.0)
        .arg("--kubeconfig")
        .arg(&kube.1)
        .arg("--request-timeout=10s")
        .args(args)
        .args(["-o", "json"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

impl Sampler {
    pub fn start(
        root: &std::path::Path,
        since: Instant,
        kube: Option<(std::path::PathBuf, std::path::PathBuf)>,
    ) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let lows = Arc::new(Mutex::new(Lows::default()));
        let changes = Arc::new(Mutex::new(Vec::new()));
        let (s, l, c, root) = (
            stop.clone(),
            lows.clone(),
            changes.clone(),
            root.to_path_buf(),
        );
        let thread = std::thread::spawn(move || {
            let mut seen = ClusterSeen::default();
            let mut round = 0u32;
            while !s.load(Ordering::Relaxed) {
                let at = since.elapsed().as_secs_f64() / 60.0;
                let disk = super::free_bytes(&root).map(|b| b as f64 / f64::from(1u32 << 30));
                let mem = super::mem_available_kib().map(|kb| kb as f64 / 1048576.0);
                if let Ok(mut lows) = l.lock() {
                    lows.note(disk, mem, at);
                    lows.note_oom(oom_kills(), at);
                }
                if let Some(kube) = kube
                    .as_ref()
                    .filter(|_| round.is_multiple_of(CLUSTER_LOOK_EVERY))
                {
                    let found = match (
                        get_json(kube, &["get", "pods", "-A"]),
                        get_json(kube, &["get", "nodes"]),
                    ) {
                        (Some(pods), Some(nodes)) => seen.look(&pods, &nodes),
                        _ => seen.unanswered(),
                    };
                    if let Ok(mut c) = c.lock() {
                        for f in found {
                            if c.len() < CLUSTER_CHANGES_KEPT {
                                c.push((at, f));
                            }
                        }
                    }
                }
                round = round.wrapping_add(1);
                std::thread::sleep(Duration::from_secs(5));
            }
        });
        Sampler {
            stop,
            lows,
            changes,
            thread: Some(thread),
        }
    }

    /// The lows, and what changed in the cluster with when (minutes from `since`).
    pub fn finish(mut self) -> (Lows, Vec<(f64, String)>) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        (
            self.lows.lock().map(|l| *l).unwrap_or_default(),
            self.changes.lock().map(|c| c.clone()).unwrap_or_default(),
        )
    }
}

/// The cluster's changes on one line of at most `max` characters, the earliest first: a
/// CI log folds longer lines.
pub fn changes_line(changes: &[(f64, String)], max: usize) -> String {
    let mut line = format!("cluster during e2e ({} changes):", changes.len());
    for (i, (at, what)) in changes.iter().enumerate() {
        let item = format!(" {at:.1} {what};");
        if line.len() + item.len() > max {
            line.push_str(&format!(" … {} more", changes.len() - i));
            break;
        }
        line.push_str(&item);
    }
    line
}

/// The pods and nodes that are not well, one line each, from `kubectl get pods -A -o json`
/// and `kubectl get nodes -o json`: phase, the containers' waiting or last termination
/// reasons, restarts; a node's pressure conditions.
pub fn unwell(pods: &serde_json::Value, nodes: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    for n in nodes["items"].as_array().into_iter().flatten() {
        let name = n["metadata"]["name"].as_str().unwrap_or("?");
        for c in n["status"]["conditions"].as_array().into_iter().flatten() {
            let (t, s) = (
                c["type"].as_str().unwrap_or(""),
                c["status"].as_str().unwrap_or(""),
            );
            let bad = if t == "Ready" {
                s != "True"
            } else {
                s == "True"
            };
            if bad {
                out.push(format!(
                    "node {name}: {t}={s} {}",
                    c["message"].as_str().unwrap_or("")
                ));
            }
        }
    }
    for p in pods["items"].as_array().into_iter().flatten() {
        let phase = p["status"]["phase"].as_str().unwrap_or("?");
        if phase == "Succeeded" {
            continue;
        }
        let ready = p["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        let statuses: Vec<&serde_json::Value> = ["initContainerStatuses", "containerStatuses"]
            .iter()
            .flat_map(|k| p["status"][*k].as_array().into_iter().flatten())
            .collect();
        let restarts: u64 = statuses
            .iter()
            .filter_map(|c| c["restartCount"].as_u64())
            .sum();
        if ready && restarts == 0 {
            continue;
        }
        let mut why = Vec::new();
        for c in &statuses {
            let cname = c["name"].as_str().unwrap_or("?");
            if let Some(r) = c["state"]["waiting"]["reason"].as_str() {
                why.push(format!("{cname} waiting {r}"));
            }
            if let Some(r) = c["state"]["terminated"]["reason"].as_str()
                && r != "Completed"
            {
                why.push(format!("{cname} terminated {r}"));
            }
            if let Some(r) = c["lastState"]["terminated"]["reason"].as_str() {
                let code = c["lastState"]["terminated"]["exitCode"]
                    .as_i64()
                    .unwrap_or(0);
                why.push(format!("{cname} last {r} ({code})"));
            }
        }
        if let Some(r) = p["status"]["reason"].as_str() {
            why.push(r.to_string());
        }
        out.push(format!(
            "pod {}/{} on {}: {phase}{}, {restarts} restarts{}{}",
            p["metadata"]["namespace"].as_str().unwrap_or("?"),
            p["metadata"]["name"].as_str().unwrap_or("?"),
            p["spec"]["nodeName"].as_str().unwrap_or("-"),
            if ready { "" } else { " not ready" },
            if why.is_empty() { "" } else { ": " },
            why.join(", ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_killed_binary_says_so_and_names_no_test() {
        use std::os::unix::process::ExitStatusExt;
        let o = Outcome::new(
            "access",
            5.3,
            Duration::from_secs(450),
            Ok(ExitStatus::from_raw(9)),
            &lines(&["running 1 test"]),
            &[],
        );
        assert!(!o.passed && !o.summary);
        assert_eq!(
            o.line(),
            "e2e access (5.3–12.8 min): signal: 9 (SIGKILL), no libtest summary (killed or \
             aborted mid-test)"
        );
    }

    #[test]
    fn failed_tests_are_named() {
        use std::os::unix::process::ExitStatusExt;
        let out = lines(&[
            "test a ... ok",
            "test plugin_errors ... FAILED",
            "test result: FAILED. 1 passed; 1 failed; 0 ignored",
        ]);
        let o = Outcome::new(
            "plugin",
            0.0,
            Duration::ZERO,
            Ok(ExitStatus::from_raw(101 << 8)),
            &out,
            &[],
        );
        assert!(o.summary);
        assert_eq!(o.failed_tests, vec!["plugin_errors"]);
        assert!(
            o.line()
                .ends_with("exit status: 101; failed: plugin_errors")
        );
    }

    #[test]
    fn the_earliest_failures_come_with_their_panic() {
        use std::os::unix::process::ExitStatusExt;
        let out = lines(&[
            "test drains ... FAILED",
            "test boots ... FAILED",
            "",
            "failures:",
            "",
            "---- boots stdout ----",
            "some output of the test",
            "thread 'boots' panicked at e2e/tests/x.rs:10:5:",
            "VM did not boot: phase Scheduling",
            "  pod pending",
            "  third line dropped",
            "note: run with `RUST_BACKTRACE=1`",
            "",
            "---- drains stdout ----",
            "thread 'drains' (2996) panicked at e2e/tests/common/mod.rs:43:30:",
            "cluster with kubevirt-rs deployed: failed",
            "",
        ]);
        let o = Outcome::new(
            "migration (beside the lane)",
            10.0,
            Duration::from_secs(600),
            Ok(ExitStatus::from_raw(101 << 8)),
            &out,
            &[
                ("drains".to_string(), Duration::from_secs(60)),
                ("boots".to_string(), Duration::from_secs(30)),
            ],
        );
        assert_eq!(
            first_failures(&[o], 5),
            vec![
                "failed at 10.5 min: migration::boots: VM did not boot: phase Scheduling / pod \
                 pending (e2e/tests/x.rs:10:5)",
                "failed at 11.0 min: migration::drains: cluster with kubevirt-rs deployed: \
                 failed (e2e/tests/common/mod.rs:43:30)",
            ]
        );
    }

    #[test]
    fn the_cluster_changes_for_the_worse_are_named_once() {
        let pods = |ready: bool, restarts: u64| {
            serde_json::json!({"items": [
                {"metadata": {"namespace": "kubevirt", "name": "kubevirt-etcd-0"},
                 "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}],
                            "containerStatuses": [{"name": "etcd", "restartCount": restarts,
                                "lastState": {"terminated": {"reason": "Error", "exitCode": 137}}}]}},
            ]})
        };
        let nodes = |ready: &str| {
            serde_json::json!({"items": [
                {"metadata": {"name": "vm-2"}, "status": {"conditions": [
                    {"type": "Ready", "status": ready, "message": "kubelet stopped posting"}]}}
            ]})
        };
        let mut seen = ClusterSeen::default();
        // The first look names only what is already wrong.
        assert!(seen.look(&pods(true, 2), &nodes("True")).is_empty());
        assert!(seen.look(&pods(true, 2), &nodes("True")).is_empty());
        assert_eq!(
            seen.look(&pods(false, 3), &nodes("Unknown")),
            vec![
                "node vm-2 not Ready: kubelet stopped posting",
                "kubevirt/kubevirt-etcd-0/etcd restarted (3 in all; last: Error 137)",
                "pod kubevirt/kubevirt-etcd-0 not ready",
            ]
        );
        assert_eq!(seen.unanswered(), vec!["the cluster's API did not answer"]);
        assert!(seen.unanswered().is_empty());
        assert_eq!(
            seen.look(&pods(true, 3), &nodes("True")),
            vec![
                "the cluster's API answers again",
                "node vm-2 Ready again",
                "pod kubevirt/kubevirt-etcd-0 ready again",
            ]
        );
        let changes: Vec<(f64, String)> = (0..50).map(|i| (f64::from(i), "x".repeat(30))).collect();
        let line = changes_line(&changes, 200);
        assert!(line.len() < 220 && line.ends_with("more"), "{line}");
    }

    #[test]
    fn lows_keep_the_lowest_and_when() {
        let mut l = Lows::default();
        l.note(Some(20.0), Some(10.0), 1.0);
        l.note(Some(3.5), Some(12.0), 2.0);
        l.note(Some(9.0), None, 3.0);
        assert_eq!(
            l.line(),
            "lowest during e2e: disk free 3.5 GiB at 2.0 min, memory available 10.0 GiB at 1.0 min"
        );
        l.note_oom(Some(4), 1.0);
        l.note_oom(Some(4), 2.0);
        assert!(l.line().ends_with("; no OOM kill"), "{}", l.line());
        l.note_oom(Some(6), 2.5);
        l.note_oom(Some(7), 3.0);
        assert!(
            l.line().ends_with("; 3 OOM kills, the first at 2.5 min"),
            "{}",
            l.line()
        );
    }

    #[test]
    fn only_unwell_pods_and_nodes_are_listed() {
        let pods = serde_json::json!({"items": [
            {"metadata": {"namespace": "kubevirt", "name": "ok"}, "spec": {"nodeName": "vm"},
             "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}],
                        "containerStatuses": [{"name": "c", "restartCount": 0}]}},
            {"metadata": {"namespace": "kubevirt", "name": "kubevirt-etcd-0"}, "spec": {"nodeName": "vm-2"},
             "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}],
                        "containerStatuses": [{"name": "etcd", "restartCount": 4,
                            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                            "lastState": {"terminated": {"reason": "Error", "exitCode": 2}}}]}},
            {"metadata": {"namespace": "x", "name": "done"}, "status": {"phase": "Succeeded"}},
            {"metadata": {"namespace": "x", "name": "gone"}, "spec": {"nodeName": "vm"},
             "status": {"phase": "Failed", "reason": "Evicted"}}
        ]});
        let nodes = serde_json::json!({"items": [
            {"metadata": {"name": "vm"}, "status": {"conditions": [
                {"type": "DiskPressure", "status": "True", "message": "low on disk"},
                {"type": "Ready", "status": "True"}]}}
        ]});
        assert_eq!(
            unwell(&pods, &nodes),
            vec![
                "node vm: DiskPressure=True low on disk",
                "pod kubevirt/kubevirt-etcd-0 on vm-2: Running not ready, 4 restarts: etcd \
                 waiting CrashLoopBackOff, etcd last Error (2)",
                "pod x/gone on vm: Failed not ready, 0 restarts: Evicted",
            ]
        );
    }
}
