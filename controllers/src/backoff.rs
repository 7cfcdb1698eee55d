//! Per-object exponential back-off for failed reconciles.
//!
//! kube-runtime has no per-key increasing back-off (kube-rs #1916) and `error_policy`
//! never hears about successes, so the table lives in the controller context:
//! `error_policy` grows an entry, a successful reconcile removes it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// Failures in a row per object uid.
#[derive(Debug)]
pub struct BackoffTable {
    base: Duration,
    max: Duration,
    failures: Mutex<HashMap<String, u32>>,
}

impl BackoffTable {
    /// Delays start at `base` and double up to `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            failures: Mutex::new(HashMap::new()),
        }
    }

    /// Records a failure of `key` and returns how long to wait before the next attempt.
    pub fn next_delay(&self, key: &str) -> Duration {
        let n = {
            let mut map = self.failures.lock().unwrap_or_else(|e| e.into_inner());
            let n = map.entry(key.to_string()).or_insert(0);
            *n = n.saturating_add(1);
            *n
        };
        let factor = 2u32.saturating_pow(n.saturating_sub(1).min(20));
        self.base.saturating_mul(factor).min(self.max)
    }

    /// [`Self::next_delay`] after `err`, at most [`UNAVAILABLE_MAX`] when `err` says the API
    /// was away rather than that something is wrong with the object: a virt-apiserver
    /// restart answers every request 503 for seconds, and the doubling delays each object
    /// collects meanwhile would otherwise hold it for up to a minute after the API is back
    /// (`cargo xtask chaos`: a VM restart waited 48 s after a 17 s outage).
    pub fn next_delay_after(&self, key: &str, err: &(dyn std::error::Error + 'static)) -> Duration {
        let delay = self.next_delay(key);
        if api_unavailable(err) {
            delay.min(UNAVAILABLE_MAX)
        } else {
            delay
        }
    }

    /// Forgets the failures of `key` after a success.
    pub fn reset(&self, key: &str) {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }

    /// Failures in a row recorded for `key`.
    pub fn failures(&self, key: &str) -> u32 {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .copied()
            .unwrap_or(0)
    }
}

/// Longest wait after a failure of the API itself ([`api_unavailable`]).
pub const UNAVAILABLE_MAX: Duration = Duration::from_secs(5);

/// Whether `err` (or an error it wraps) is the API being unavailable: no answer, or
/// 429/500/502/503/504 — not a verdict on the request.
pub fn api_unavailable(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(k) = e.downcast_ref::<kube::Error>() {
            return match k {
                kube::Error::Api(s) => matches!(s.code, 429 | 500 | 502 | 503 | 504),
                kube::Error::HyperError(_) | kube::Error::Service(_) => true,
                _ => false,
            };
        }
        cur = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_max_and_resets() {
        let t = BackoffTable::new(Duration::from_millis(100), Duration::from_secs(1));
        assert_eq!(t.next_delay("a"), Duration::from_millis(100));
        assert_eq!(t.next_delay("a"), Duration::from_millis(200));
        assert_eq!(t.next_delay("a"), Duration::from_millis(400));
        assert_eq!(t.next_delay("b"), Duration::from_millis(100));
        for _ in 0..10 {
            t.next_delay("a");
        }
        assert_eq!(t.next_delay("a"), Duration::from_secs(1));
        t.reset("a");
        assert_eq!(t.failures("a"), 0);
        assert_eq!(t.next_delay("a"), Duration::from_millis(100));
    }

    #[derive(Debug, thiserror::Error)]
    #[error("reading the VMI")]
    struct Wrapped(#[source] kube::Error);

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(
            kube::core::Status::failure("x", "y").with_code(code),
        ))
    }

    #[test]
    fn an_unavailable_api_caps_the_delay_and_a_refusal_does_not() {
        let t = BackoffTable::new(Duration::from_millis(500), Duration::from_secs(300));
        for _ in 0..8 {
            t.next_delay("a");
            t.next_delay("b");
        }
        assert_eq!(t.next_delay_after("a", &Wrapped(api(503))), UNAVAILABLE_MAX);
        assert!(t.next_delay_after("b", &Wrapped(api(422))) > UNAVAILABLE_MAX);
        assert!(api_unavailable(&api(429)));
        assert!(!api_unavailable(&api(404)));
        assert!(!api_unavailable(&std::io::Error::other("not kube")));
    }
}
