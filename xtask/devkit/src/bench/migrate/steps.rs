//! Where a live migration's time goes (issue 21 point 5): the time of each step from the
//! client's VMIM create request to `Succeeded`, on this machine's one clock, as
//! `bench start` does for a VM's start:
//! - the client's own watches (`kubectl get -w`) of the migration and of its target pod;
//! - the kubelet's timestamp of each log line of the target launcher and of the two
//!   nodes' virt-handlers (the source's drives the transfer, the target's opens its proxy).

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use serde_json::Value;

use crate::bench::start::steps::{self as start_steps, Steps, Timeline};
use crate::deploy::Kubectl as Kube;

/// A step of a live migration, in the order they happen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Step {
    VmimCreated,
    TargetPodCreated,
    TargetPodScheduled,
    TargetInitDone,
    TargetLauncherStarted,
    TargetLibvirtReady,
    TargetWaiting,
    TargetProxyReady,
    VmimTargetReady,
    TransferStarted,
    TransferDone,
    TargetRuns,
    Succeeded,
}

impl Steps for Step {
    const ALL: &'static [Self] = &[
        Step::VmimCreated,
        Step::TargetPodCreated,
        Step::TargetPodScheduled,
        Step::TargetInitDone,
        Step::TargetLauncherStarted,
        Step::TargetLibvirtReady,
        Step::TargetWaiting,
        Step::TargetProxyReady,
        Step::VmimTargetReady,
        Step::TransferStarted,
        Step::TransferDone,
        Step::TargetRuns,
        Step::Succeeded,
    ];

    fn label(self) -> &'static str {
        match self {
            Step::VmimCreated => "VMIM created (watch)",
            Step::TargetPodCreated => "target launcher pod created (watch)",
            Step::TargetPodScheduled => "target pod scheduled: nodeName set (watch)",
            Step::TargetInitDone => {
                "target's init container (busybox copy) done: kubelet's status (watch)"
            }
            Step::TargetLauncherStarted => "target virt-launcher started (its first log line)",
            Step::TargetLibvirtReady => "target's private libvirt daemon ready (launcher log)",
            Step::TargetWaiting => {
                "target launcher ready: waiting for the incoming guest (launcher log)"
            }
            Step::TargetProxyReady => {
                "target node's proxy ready: \"migration target ready\" (target handler log)"
            }
            Step::VmimTargetReady => "VMIM `TargetReady` (watch)",
            Step::TransferStarted => {
                "transfer started: source handler opens the tunnel (source handler log)"
            }
            Step::TransferDone => {
                "transfer and switch-over done: libvirt's job ended (source handler log)"
            }
            Step::TargetRuns => "guest runs on the target (target launcher log)",
            Step::Succeeded => "VMIM `Succeeded`: hand-over through the API done (watch)",
        }
    }
}

impl Step {
    /// The target launcher's log message that marks the step.
    fn launcher_message(self) -> Option<&'static str> {
        Some(match self {
            Step::TargetLauncherStarted => "virt-launcher started",
            Step::TargetLibvirtReady => "libvirt daemon ready",
            Step::TargetWaiting => "waiting for the incoming migration",
            Step::TargetRuns => "the migrated guest runs here",
            _ => return None,
        })
    }

    /// The virt-handlers' log message that marks the step (either node's).
    fn handler_message(self) -> Option<&'static str> {
        Some(match self {
            Step::TargetProxyReady => "migration target ready",
            Step::TransferStarted => "starting outgoing migration",
            Step::TransferDone => "outgoing migration ended",
            _ => return None,
        })
    }
}

/// What the watches saw, by migration name (its target pod as the pod).
type Seen = start_steps::Seen<Step>;

fn note(seen: &Mutex<Seen>, name: &str, step: Step, t: SystemTime) {
    Seen::note(seen, name, step, t);
}

fn vmim_event(seen: &Mutex<Seen>, v: &Value, t: SystemTime) {
    let Some(name) = v.pointer("/metadata/name").and_then(Value::as_str) else {
        return;
    };
    note(seen, name, Step::VmimCreated, t);
    let phase = v.pointer("/status/phase").and_then(Value::as_str);
    if matches!(phase, Some("TargetReady" | "Running" | "Succeeded")) {
        note(seen, name, Step::VmimTargetReady, t);
    }
    if phase == Some("Succeeded") {
        note(seen, name, Step::Succeeded, t);
    }
}

fn pod_event(seen: &Mutex<Seen>, p: &Value, t: SystemTime) {
    let Some(name) = p
        .pointer("/metadata/annotations/kubevirt.io~1migrationJobName")
        .and_then(Value::as_str)
    else {
        return;
    };
    Seen::first_pod(seen, name, p);
    start_steps::pod_steps(
        p,
        [
            Step::TargetPodCreated,
            Step::TargetPodScheduled,
            Step::TargetInitDone,
        ],
        |s| note(seen, name, s, t),
    );
}

/// The client's watches of the namespace's migrations and their target pods.
pub struct Watches {
    _children: start_steps::Children,
    seen: Arc<Mutex<Seen>>,
}

impl Watches {
    pub fn start(kube: &Kube, ns: &str) -> anyhow::Result<Self> {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let mut children = Vec::new();
        for (args, on) in [
            (
                vec!["-n", ns, "get", "vmim", "-w", "-o", "json"],
                vmim_event as fn(&Mutex<Seen>, &Value, SystemTime),
            ),
            (
                vec![
                    "-n",
                    ns,
                    "get",
                    "pods",
                    "-l",
                    "kubevirt.io/migrationJobUID",
                    "-w",
                    "-o",
                    "json",
                ],
                pod_event,
            ),
        ] {
            let mut cmd = Command::new(&kube.bin);
            cmd.arg("--kubeconfig").arg(&kube.kubeconfig).args(&args);
            let sink = seen.clone();
            children.push(start_steps::watch_json(cmd, move |v, t| on(&sink, v, t))?);
        }
        Ok(Self {
            _children: start_steps::Children(children),
            seen,
        })
    }

    fn steps(&self, name: &str) -> (BTreeMap<Step, SystemTime>, Option<String>) {
        Seen::of(&self.seen, name)
    }
}

/// `t` as kubectl's `--since-time` takes it (whole seconds, rounded down).
fn since_time(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    k8s_openapi::jiff::Timestamp::from_second(secs as i64)
        .map(|ts| ts.to_string())
        .unwrap_or_default()
}

/// Once migration `name` (created at `created`) has succeeded: its whole timeline. Waits
/// up to a few seconds for the watches to deliver `Succeeded`.
pub fn collect(
    kube: &Kube,
    ns: &str,
    w: &Watches,
    name: &str,
    created: SystemTime,
) -> anyhow::Result<Timeline<Step>> {
    for _ in 0..50 {
        if w.steps(name).0.contains_key(&Step::Succeeded) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let (mut at, pod) = w.steps(name);
    let pod = pod.with_context(|| format!("no target pod of migration {name} was seen"))?;
    // The migration can end before the kubelet reports the target's containers started
    // (the hand-off is at binding), and until then the API refuses their logs.
    let mut tries = 0;
    let launcher = loop {
        match kube.run(
            &["-n", ns, "logs", "--timestamps", "-c", "compute", &pod],
            None,
        ) {
            Ok(log) => break log,
            Err(e) if tries < 50 && format!("{e:#}").contains("waiting to start") => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) => return Err(e),
        }
    };
    at.extend(start_steps::logged_steps(
        &launcher,
        created,
        Step::launcher_message,
    ));
    let since = since_time(created);
    let handlers = kube.run(
        &[
            "-n",
            virt_operator::render::NAMESPACE,
            "get",
            "pods",
            "-l",
            "kubevirt.io=virt-handler",
            "-o",
            "name",
        ],
        None,
    )?;
    for h in handlers.lines().filter(|l| !l.is_empty()) {
        let log = kube.run(
            &[
                "-n",
                virt_operator::render::NAMESPACE,
                "logs",
                "--timestamps",
                "--since-time",
                &since,
                "-c",
                "virt-handler",
                h,
            ],
            None,
        )?;
        for (s, t) in start_steps::logged_steps(&log, created, Step::handler_message) {
            let e = at.entry(s).or_insert(t);
            *e = (*e).min(t);
        }
    }
    Ok(Timeline {
        created: Some(created),
        at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> SystemTime {
        start_steps::log_line(&format!("{s} x")).unwrap().0
    }

    #[test]
    fn handler_and_launcher_logs_give_their_steps_after_the_create() {
        let handler = "2026-12-05T03:00:00.500Z  INFO virt_handler::cluster_migration: starting outgoing migration addr=…\n\
            2026-12-05T03:00:01.000Z  INFO virt_handler::cluster_migration: starting outgoing migration addr=…\n\
            2026-12-05T03:00:03.000Z  INFO virt_handler::cluster_migration: outgoing migration ended outcome=Some(Completed) took_ms=2000\n";
        let s = start_steps::logged_steps(
            handler,
            t("2026-12-05T03:00:00.800Z"),
            Step::handler_message,
        );
        // The earlier migration's line (before this create) does not count.
        assert_eq!(s[&Step::TransferStarted], t("2026-12-05T03:00:01.000Z"));
        assert_eq!(s[&Step::TransferDone], t("2026-12-05T03:00:03.000Z"));
        let launcher = "2026-12-05T03:00:00.900Z  INFO virt_launcher: virt-launcher started version=0.1.0\n\
            2026-12-05T03:00:00.950Z  INFO virt_launcher::launcher: waiting for the incoming migration domain=ns_vm elapsed_ms=40\n\
            2026-12-05T03:00:03.100Z  INFO virt_launcher::launcher: the migrated guest runs here\n";
        let l = start_steps::logged_steps(launcher, SystemTime::UNIX_EPOCH, Step::launcher_message);
        assert_eq!(l.len(), 3);
        assert_eq!(l[&Step::TargetRuns], t("2026-12-05T03:00:03.100Z"));
    }

    #[test]
    fn watched_objects_give_their_steps() {
        let seen = Mutex::new(Seen::default());
        let at = t("2026-12-05T03:00:00Z");
        vmim_event(
            &seen,
            &serde_json::json!({"metadata": {"name": "m"}, "status": {"phase": "Running"}}),
            at,
        );
        pod_event(
            &seen,
            &serde_json::json!({"metadata": {"name": "virt-launcher-x", "annotations": {"kubevirt.io/migrationJobName": "m"}}, "spec": {"nodeName": "n2"}}),
            at,
        );
        let (at, pod) = Seen::of(&seen, "m");
        assert!(at.contains_key(&Step::VmimTargetReady));
        assert!(!at.contains_key(&Step::Succeeded));
        assert!(at.contains_key(&Step::TargetPodScheduled));
        assert_eq!(pod.as_deref(), Some("virt-launcher-x"));
        assert_eq!(
            since_time(t("2026-12-05T03:00:00.9Z")),
            "2026-12-05T03:00:00Z"
        );
    }
}
