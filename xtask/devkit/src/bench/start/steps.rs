//! Where a VM's start goes: the time of each step from the client's create request to the
//! guest's first console byte, for one VM at a time and for a burst, against bare QEMU
//! booting the same guest in the same invocation (issue 21 point 3).
//!
//! Sources, all on this machine's one clock:
//! - the client's own watches (`kubectl get -w`) for what the API shows: VMI created, launcher
//!   pod created, scheduled, its init containers done, VMI `Running`;
//! - the kubelet's timestamp of each log line (`kubectl logs --timestamps`) for what happens
//!   in the pod: the compute container's launcher logs its steps, and the
//!   `guest-console-log` container copies the serial console as QEMU writes it.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use serde_json::Value;

use super::Kube;
use crate::bench::report::percentile;
use crate::bench::section::Runs;

/// A step of a VM's start, in the order they happen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Step {
    VmiCreated,
    PodCreated,
    PodScheduled,
    InitDone,
    LauncherStarted,
    ImagesCopied,
    VolumesPrepared,
    NetworkReady,
    LibvirtReady,
    DomainDefined,
    DomainStarted,
    VmiRunning,
    FirstOutput,
    Banner,
}

/// The steps of something timed from one request (a VM's start, a migration), in the
/// order they happen, each with its table row label.
pub trait Steps: Copy + Ord + std::fmt::Debug + 'static {
    const ALL: &'static [Self];
    /// The table's row label, with where the time comes from.
    fn label(self) -> &'static str;
}

impl Steps for Step {
    const ALL: &'static [Self] = &[
        Step::VmiCreated,
        Step::PodCreated,
        Step::PodScheduled,
        Step::InitDone,
        Step::LauncherStarted,
        Step::ImagesCopied,
        Step::VolumesPrepared,
        Step::NetworkReady,
        Step::LibvirtReady,
        Step::DomainDefined,
        Step::DomainStarted,
        Step::VmiRunning,
        Step::FirstOutput,
        Step::Banner,
    ];

    fn label(self) -> &'static str {
        match self {
            Step::VmiCreated => "VMI created (watch)",
            Step::PodCreated => "launcher pod created (watch)",
            Step::PodScheduled => "pod scheduled: nodeName set (watch)",
            Step::InitDone => "init container (busybox copy) done: kubelet's status (watch)",
            Step::LauncherStarted => "virt-launcher started (its first log line)",
            Step::ImagesCopied => "images copied by the copiers beside it (launcher log)",
            Step::VolumesPrepared => "volumes prepared (launcher log)",
            Step::NetworkReady => "pod network ready, from virt-handler (launcher log)",
            Step::LibvirtReady => "private libvirt daemon ready (launcher log)",
            Step::DomainDefined => "domain defined (launcher log)",
            Step::DomainStarted => "QEMU started: domain running (launcher log)",
            Step::VmiRunning => "VMI `Running` (watch)",
            Step::FirstOutput => "guest's first console byte (guest-console-log)",
            Step::Banner => "guest ready: its banner (guest-console-log)",
        }
    }
}

impl Step {
    /// The launcher's log message that marks the step.
    fn launcher_message(self) -> Option<&'static str> {
        Some(match self {
            Step::LauncherStarted => "virt-launcher started",
            Step::ImagesCopied => "images copied",
            Step::VolumesPrepared => "volumes prepared",
            Step::NetworkReady => "pod network ready",
            Step::LibvirtReady => "libvirt daemon ready",
            Step::DomainDefined => "domain defined",
            Step::DomainStarted => "domain started",
            _ => return None,
        })
    }
}

/// One kubelet log line, `RFC3339NANO TEXT`: its time and text.
pub fn log_line(line: &str) -> Option<(SystemTime, &str)> {
    let (ts, text) = line.split_once(' ').unwrap_or((line, ""));
    let t = time::OffsetDateTime::parse(ts, &time::format_description::well_known::Rfc3339).ok()?;
    let since = t - time::OffsetDateTime::UNIX_EPOCH;
    let d = Duration::try_from(since).ok()?;
    Some((SystemTime::UNIX_EPOCH + d, text))
}

/// The launcher's steps in its log (`kubectl logs --timestamps -c compute`).
pub fn launcher_steps(log: &str) -> BTreeMap<Step, SystemTime> {
    logged_steps(log, SystemTime::UNIX_EPOCH, Step::launcher_message)
}

/// The first time each step's message appears in a kubelet log (`--timestamps`), at or
/// after `since`.
pub fn logged_steps<S: Steps>(
    log: &str,
    since: SystemTime,
    message: impl Fn(S) -> Option<&'static str>,
) -> BTreeMap<S, SystemTime> {
    let mut out = BTreeMap::new();
    for (t, text) in log
        .lines()
        .filter_map(log_line)
        .filter(|(t, _)| *t >= since)
    {
        for s in S::ALL {
            if let Some(m) = message(*s)
                && text.contains(m)
            {
                out.entry(*s).or_insert(t);
            }
        }
    }
    out
}

/// The guest's first output and its banner in the console log (`-c guest-console-log`).
pub fn console_steps(log: &str, banner: &str) -> BTreeMap<Step, SystemTime> {
    let mut out = BTreeMap::new();
    for (t, text) in log.lines().filter_map(log_line) {
        out.entry(Step::FirstOutput).or_insert(t);
        if text.contains(banner) {
            out.entry(Step::Banner).or_insert(t);
        }
    }
    out
}

/// One VM's start (or one migration): when the client sent the create, and when each step
/// happened.
#[derive(Debug, Clone)]
pub struct Timeline<S = Step> {
    pub created: Option<SystemTime>,
    pub at: BTreeMap<S, SystemTime>,
}

impl<S> Default for Timeline<S> {
    fn default() -> Self {
        Self {
            created: None,
            at: BTreeMap::new(),
        }
    }
}

impl<S: Steps> Timeline<S> {
    /// From the create request to `s`.
    pub fn since_create(&self, s: S) -> Option<Duration> {
        self.at.get(&s)?.duration_since(self.created?).ok()
    }

    /// From the step before `s` that this timeline has to `s` (zero when they are
    /// out of order: a watch delivers later than the log line of a later step).
    pub fn step_took(&self, s: S) -> Option<Duration> {
        let prev = S::ALL
            .iter()
            .take_while(|p| **p != s)
            .filter_map(|p| self.at.get(p))
            .last()
            .copied()
            .or(self.created)?;
        let at = self.at.get(&s)?;
        Some(at.duration_since(prev).unwrap_or_default())
    }
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// `median (min–max)` of `xs` in seconds (the file's convention, [`Runs`]), or `n/a`.
pub fn median_range(xs: &[Duration]) -> String {
    Runs::secs(xs).summary(2, "s")
}

/// The single-VM table: per step, the median (min–max) over the runs of the time since the
/// create request and of the step itself.
pub fn single_table<S: Steps>(runs: &[Timeline<S>]) -> String {
    let mut s = String::from(
        "| step | from the create request, median (min–max) | the step itself |\n|---|---|---|\n",
    );
    for &step in S::ALL {
        let since: Vec<Duration> = runs.iter().filter_map(|t| t.since_create(step)).collect();
        let took: Vec<Duration> = runs.iter().filter_map(|t| t.step_took(step)).collect();
        s.push_str(&format!(
            "| {} | {} | {} |\n",
            step.label(),
            median_range(&since),
            median_range(&took)
        ));
    }
    s
}

/// The burst table: per step, P50 and P95 over the VMs of the time since each one's create.
pub fn burst_table(vms: &[Timeline]) -> String {
    let mut s = String::from(
        "| step | VMs | from its create request, P50 | P95 | max |\n|---|---|---|---|---|\n",
    );
    for &step in Step::ALL {
        let mut v: Vec<Duration> = vms.iter().filter_map(|t| t.since_create(step)).collect();
        v.sort();
        let cell = |p: f64| {
            if v.is_empty() {
                "n/a".to_string()
            } else {
                secs(percentile(&v, p).unwrap_or_default())
            }
        };
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            step.label(),
            v.len(),
            cell(50.0),
            cell(95.0),
            cell(100.0)
        ));
    }
    s
}

/// What a benchmark's watches saw, by object name (a VMI's, a migration's): the first
/// time of each API-visible step, and the first launcher pod seen for it.
pub struct Seen<S> {
    at: BTreeMap<(String, S), SystemTime>,
    pods: BTreeMap<String, String>,
}

impl<S> Default for Seen<S> {
    fn default() -> Self {
        Self {
            at: BTreeMap::new(),
            pods: BTreeMap::new(),
        }
    }
}

impl<S: Steps> Seen<S> {
    /// Records `step` of `name` at `t` unless it was seen before.
    pub fn note(seen: &Mutex<Self>, name: &str, step: S, t: SystemTime) {
        if let Ok(mut s) = seen.lock() {
            s.at.entry((name.to_string(), step)).or_insert(t);
        }
    }

    /// Records pod `p` for `name` unless one was seen before (a VMI's migration target is
    /// another pod of the same VMI: only the first counts).
    pub fn first_pod(seen: &Mutex<Self>, name: &str, p: &Value) {
        if let (Some(pod), Ok(mut s)) = (
            p.pointer("/metadata/name").and_then(Value::as_str),
            seen.lock(),
        ) {
            s.pods.entry(name.to_string()).or_insert(pod.to_string());
        }
    }

    /// The steps of `name` seen so far, and its pod.
    pub fn of(seen: &Mutex<Self>, name: &str) -> (BTreeMap<S, SystemTime>, Option<String>) {
        let Ok(s) = seen.lock() else {
            return (BTreeMap::new(), None);
        };
        let at = S::ALL
            .iter()
            .filter_map(|st| Some((*st, *s.at.get(&(name.to_string(), *st))?)))
            .collect();
        (at, s.pods.get(name).cloned())
    }
}

/// The watch processes of a benchmark, killed and reaped when dropped.
#[derive(Default)]
pub struct Children(pub Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `kubectl get vmi,pods -w` in the namespace, recording first times.
pub(super) struct Watches {
    _children: Children,
    seen: Arc<Mutex<Seen<Step>>>,
}

fn note(seen: &Mutex<Seen<Step>>, name: &str, step: Step, t: SystemTime) {
    Seen::note(seen, name, step, t);
}

fn pod_event(seen: &Mutex<Seen<Step>>, p: &Value, t: SystemTime) {
    let Some(vmi) = p
        .pointer("/metadata/labels/vm.kubevirt.io~1name")
        .and_then(Value::as_str)
    else {
        return;
    };
    Seen::first_pod(seen, vmi, p);
    pod_steps(
        p,
        [Step::PodCreated, Step::PodScheduled, Step::InitDone],
        |s| note(seen, vmi, s, t),
    );
}

/// A watched launcher pod's own steps, each handed to `note`: created (any event), bound
/// to a node, init containers done.
pub fn pod_steps<S: Copy>(p: &Value, [created, bound, init]: [S; 3], mut note: impl FnMut(S)) {
    note(created);
    if p.pointer("/spec/nodeName")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty())
    {
        note(bound);
    }
    if init_done(p) {
        note(init);
    }
}

/// Whether the kubelet reports a pod's init containers done (without init containers:
/// whether a container runs).
fn init_done(p: &Value) -> bool {
    let inits = p
        .pointer("/status/initContainerStatuses")
        .and_then(Value::as_array);
    let all_done = |v: &Vec<Value>| {
        v.iter()
            .all(|c| c.pointer("/state/terminated/exitCode") == Some(&Value::from(0)))
    };
    let compute_running = p
        .pointer("/status/containerStatuses")
        .and_then(Value::as_array)
        .is_some_and(|cs| cs.iter().any(|c| c.pointer("/state/running").is_some()));
    inits.is_some_and(all_done) || (inits.is_none() && compute_running)
}

/// Runs `kubectl get … -w -o json` (`cmd`, stdout piped here) and hands every object it
/// prints to `on` with the time it arrived; the caller kills the child when done.
pub fn watch_json(
    mut cmd: std::process::Command,
    on: impl Fn(&Value, SystemTime) + Send + 'static,
) -> anyhow::Result<Child> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("kubectl get -w")?;
    let stdout = child.stdout.take().context("watch stdout")?;
    std::thread::spawn(move || {
        for v in serde_json::Deserializer::from_reader(stdout).into_iter::<Value>() {
            let Ok(v) = v else { break };
            on(&v, SystemTime::now());
        }
    });
    Ok(child)
}

fn vmi_event(seen: &Mutex<Seen<Step>>, v: &Value, t: SystemTime) {
    let Some(name) = v.pointer("/metadata/name").and_then(Value::as_str) else {
        return;
    };
    note(seen, name, Step::VmiCreated, t);
    if v.pointer("/status/phase").and_then(Value::as_str) == Some("Running") {
        note(seen, name, Step::VmiRunning, t);
    }
}

impl Watches {
    pub(super) fn start(kube: &Kube, ns: &str) -> anyhow::Result<Self> {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let mut children = Vec::new();
        for (args, on) in [
            (
                vec!["-n", ns, "get", "vmi", "-w", "-o", "json"],
                vmi_event as fn(&Mutex<Seen<Step>>, &Value, SystemTime),
            ),
            (
                vec![
                    "-n",
                    ns,
                    "get",
                    "pods",
                    "-l",
                    "kubevirt.io=virt-launcher",
                    "-w",
                    "-o",
                    "json",
                ],
                pod_event,
            ),
        ] {
            let mut cmd = kube.cmd();
            cmd.args(&args);
            let sink = seen.clone();
            children.push(watch_json(cmd, move |v, t| on(&sink, v, t))?);
        }
        Ok(Self {
            _children: Children(children),
            seen,
        })
    }

    fn get(&self, vmi: &str, step: Step) -> Option<SystemTime> {
        self.steps(vmi).get(&step).copied()
    }

    fn pod(&self, vmi: &str) -> Option<String> {
        Seen::of(&self.seen, vmi).1
    }

    /// The API-visible steps of `vmi` seen so far.
    fn steps(&self, vmi: &str) -> BTreeMap<Step, SystemTime> {
        Seen::of(&self.seen, vmi).0
    }
}

/// Follows a launcher pod's `guest-console-log` until the guest's banner (or `timeout`).
fn follow_console(
    kube: &Kube,
    ns: &str,
    pod: &str,
    banner: &str,
    deadline: Instant,
) -> anyhow::Result<String> {
    // The container may not have started yet: `logs -f` then fails at once; try again.
    loop {
        let mut child = kube
            .cmd()
            .args([
                "-n",
                ns,
                "logs",
                "-f",
                "--timestamps",
                "-c",
                "guest-console-log",
                pod,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("kubectl logs -f")?;
        let stdout = child.stdout.take().context("logs stdout")?;
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut text = String::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left.min(Duration::from_secs(1))) {
                Ok(line) => {
                    let done = line.contains(banner);
                    text.push_str(&line);
                    text.push('\n');
                    if done {
                        let _ = child.kill();
                        let _ = child.wait();
                        return Ok(text);
                    }
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) if !left.is_zero() => {}
                Err(_) => break,
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        if Instant::now() >= deadline {
            bail!("no banner on {pod}'s guest-console-log in time; it showed:\n{text}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Once `vmi` shows its banner: its whole timeline.
pub(super) fn collect(
    kube: &Kube,
    ns: &str,
    w: &Watches,
    vmi: &str,
    created: SystemTime,
    timeout: Duration,
) -> anyhow::Result<Timeline> {
    let deadline = Instant::now() + timeout;
    let pod = loop {
        if let Some(p) = w.pod(vmi) {
            break p;
        }
        if Instant::now() > deadline {
            bail!("no launcher pod of {vmi} within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let console = follow_console(kube, ns, &pod, virt_testguest::BANNER, deadline)?;
    // The watch reports Running shortly after the guest's output began, at most.
    while w.get(vmi, Step::VmiRunning).is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let launcher = kube.run(&["-n", ns, "logs", "--timestamps", "-c", "compute", &pod])?;
    let mut at = w.steps(vmi);
    at.extend(launcher_steps(&launcher));
    at.extend(console_steps(&console, virt_testguest::BANNER));
    Ok(Timeline {
        created: Some(created),
        at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> SystemTime {
        log_line(&format!("{s} x")).unwrap().0
    }

    #[test]
    fn kubelet_timestamps_are_parsed_to_the_nanosecond() {
        let (at, text) = log_line("2026-12-03T19:05:01.123456789Z hello world").unwrap();
        assert_eq!(text, "hello world");
        let d = at.duration_since(SystemTime::UNIX_EPOCH).unwrap();
        assert_eq!(d.subsec_nanos(), 123_456_789);
        assert_eq!(
            t("2026-12-03T19:05:01.5Z"),
            t("2026-12-03T20:05:01.5+01:00")
        );
        assert!(log_line("not a timestamp").is_none());
    }

    #[test]
    fn launcher_and_console_logs_give_their_steps() {
        let launcher = "2026-12-03T19:00:00.100Z  INFO virt_launcher: virt-launcher started version=0.1.0\n\
            2026-12-03T19:00:00.200Z  INFO virt_launcher::launcher: volumes prepared elapsed_ms=90\n\
            2026-12-03T19:00:00.300Z  INFO virt_launcher::network: pod network ready guest=10.0.0.2\n\
            2026-12-03T19:00:00.900Z  INFO virt_launcher::launcher: libvirt daemon ready elapsed_ms=800\n\
            2026-12-03T19:00:01.000Z  INFO virt_launcher::launcher: domain defined\n\
            2026-12-03T19:00:01.200Z  INFO virt_launcher::launcher: domain started domain=ns_vm elapsed_ms=1100\n";
        let s = launcher_steps(launcher);
        assert_eq!(s.len(), 6);
        assert_eq!(s[&Step::DomainStarted], t("2026-12-03T19:00:01.200Z"));
        let console = "2026-12-03T19:00:01.700Z [    0.000000] Linux version 6.1\n\
            2026-12-03T19:00:02.900Z kubevirt-rs guest ready\n";
        let c = console_steps(console, "kubevirt-rs guest ready");
        assert_eq!(c[&Step::FirstOutput], t("2026-12-03T19:00:01.700Z"));
        assert_eq!(c[&Step::Banner], t("2026-12-03T19:00:02.900Z"));
    }

    #[test]
    fn steps_are_measured_from_the_create_and_from_the_step_before() {
        let mut tl = Timeline {
            created: Some(t("2026-12-03T19:00:00Z")),
            ..Timeline::default()
        };
        tl.at.insert(Step::VmiCreated, t("2026-12-03T19:00:00.1Z"));
        tl.at.insert(Step::PodCreated, t("2026-12-03T19:00:00.3Z"));
        // Missing steps are skipped: the next one counts from the last one present.
        tl.at
            .insert(Step::LauncherStarted, t("2026-12-03T19:00:01Z"));
        assert_eq!(
            tl.since_create(Step::PodCreated),
            Some(Duration::from_millis(300))
        );
        assert_eq!(
            tl.step_took(Step::VmiCreated),
            Some(Duration::from_millis(100))
        );
        assert_eq!(
            tl.step_took(Step::LauncherStarted),
            Some(Duration::from_millis(700))
        );
        assert_eq!(tl.since_create(Step::Banner), None);
        let table = single_table(&[tl.clone(), tl]);
        assert!(
            table.contains(
                "| launcher pod created (watch) | 0.30 s (0.30–0.30) | 0.20 s (0.20–0.20) |"
            ),
            "{table}"
        );
    }
}
