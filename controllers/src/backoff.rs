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
}
