//! The VMI's `readinessProbe` and `livenessProbe` of kinds `guestAgentPing` and `exec`,
//! run through the launcher's guest agent (`guestPing`, `guestExec`).
//!
//! KubeVirt turns them into probes of the launcher pod that run `virt-probe` in the compute
//! container, and copies the pod's readiness into the VMI. Here virt-handler, which already
//! writes the VMI's `Ready` condition and talks to the launcher, runs them itself: no probe
//! binary in the pod, no second writer of the VMI's conditions. The counting is Kubernetes'
//! (thresholds of results in a row); this module is the pure part.

use std::time::Duration;

use kubevirt_api::vmi::Probe;
use virt_domain::protocol::{GuestExecRequest, Request};

/// How one probe is asked of the launcher, or `None` for a kind run elsewhere (KubeVirt
/// runs `httpGet` and `tcpSocket` from the kubelet; not here yet).
pub fn request(p: &Probe) -> Option<Request> {
    if p.guest_agent_ping.is_some() {
        return Some(Request::GuestPing);
    }
    let exec = p.exec.as_ref()?;
    Some(Request::GuestExec(GuestExecRequest {
        command: exec.command.clone().unwrap_or_default(),
        timeout_seconds: timing(p).timeout.as_secs() as u32,
    }))
}

/// A probe's timing with Kubernetes' defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// Before the first probe.
    pub initial_delay: Duration,
    /// One probe's limit.
    pub timeout: Duration,
    /// Between probes.
    pub period: Duration,
    /// Successes in a row that pass.
    pub success_threshold: u32,
    /// Failures in a row that fail.
    pub failure_threshold: u32,
}

/// `p`'s timing, defaulted and clamped as Kubernetes does (at least 1 s and 1 result).
pub fn timing(p: &Probe) -> Timing {
    let secs = |v: Option<i32>, d: i32| Duration::from_secs(v.unwrap_or(d).max(0) as u64);
    Timing {
        initial_delay: secs(p.initial_delay_seconds, 0),
        timeout: secs(p.timeout_seconds, 1).max(Duration::from_secs(1)),
        period: secs(p.period_seconds, 10).max(Duration::from_secs(1)),
        success_threshold: p.success_threshold.unwrap_or(1).max(1) as u32,
        failure_threshold: p.failure_threshold.unwrap_or(3).max(1) as u32,
    }
}

/// The results of one probe so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counter {
    timing: Timing,
    successes: u32,
    failures: u32,
    /// Passing now (readiness starts failing, liveness passing, as in Kubernetes).
    pub passing: bool,
}

impl Counter {
    /// A readiness probe (not ready until it passes) or a liveness probe (alive until it
    /// fails).
    pub fn new(p: &Probe, readiness: bool) -> Self {
        Self {
            timing: timing(p),
            successes: 0,
            failures: 0,
            passing: !readiness,
        }
    }

    /// Counts one result; whether `passing` changed.
    pub fn record(&mut self, ok: bool) -> bool {
        if ok {
            self.successes += 1;
            self.failures = 0;
        } else {
            self.failures += 1;
            self.successes = 0;
        }
        let before = self.passing;
        if self.passing && self.failures >= self.timing.failure_threshold {
            self.passing = false;
        } else if !self.passing && self.successes >= self.timing.success_threshold {
            self.passing = true;
        }
        before != self.passing
    }
}

/// Whether a launcher's answer to [`request`] is a success.
pub fn succeeded(r: &virt_domain::protocol::Response) -> bool {
    use virt_domain::protocol::Response;
    match r {
        Response::Ok => true,
        Response::GuestExec(e) => e.exit_code == 0,
        _ => false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use virt_domain::protocol::{GuestExecResult, Response};

    fn probe(v: serde_json::Value) -> Probe {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn probes_become_launcher_requests_with_kubernetes_defaults() {
        let ping = probe(serde_json::json!({"guestAgentPing": {}}));
        assert_eq!(request(&ping), Some(Request::GuestPing));
        let t = timing(&ping);
        assert_eq!(
            (
                t.initial_delay,
                t.timeout,
                t.period,
                t.success_threshold,
                t.failure_threshold
            ),
            (
                Duration::ZERO,
                Duration::from_secs(1),
                Duration::from_secs(10),
                1,
                3
            )
        );
        let exec = probe(serde_json::json!({
            "exec": {"command": ["cat", "/tmp/healthy"]},
            "timeoutSeconds": 5, "periodSeconds": 0, "failureThreshold": 1
        }));
        assert_eq!(
            request(&exec),
            Some(Request::GuestExec(GuestExecRequest {
                command: vec!["cat".into(), "/tmp/healthy".into()],
                timeout_seconds: 5
            }))
        );
        assert_eq!(timing(&exec).period, Duration::from_secs(1), "clamped");
        let http = probe(serde_json::json!({"httpGet": {"port": 80}}));
        assert_eq!(request(&http), None);
        assert!(succeeded(&Response::Ok));
        assert!(!succeeded(&Response::GuestExec(GuestExecResult {
            exit_code: 1,
            ..Default::default()
        })));
        assert!(!succeeded(&Response::Error {
            message: "VMI does not have guest agent connected".into()
        }));
    }

    #[test]
    fn results_count_in_a_row_as_kubernetes_does() {
        let p = probe(
            serde_json::json!({"guestAgentPing": {}, "successThreshold": 2, "failureThreshold": 2}),
        );
        let mut ready = Counter::new(&p, true);
        assert!(!ready.passing);
        assert!(!ready.record(true));
        assert!(ready.record(true) && ready.passing, "two successes");
        assert!(!ready.record(false), "one failure is not enough");
        assert!(!ready.record(true));
        assert!(!ready.record(false));
        assert!(ready.record(false) && !ready.passing);
        let mut live = Counter::new(&p, false);
        assert!(live.passing);
        live.record(false);
        assert!(live.record(false) && !live.passing);
    }
}
