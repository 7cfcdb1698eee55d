//! Expectations: what a controller has just created or deleted and its watch cache has
//! not shown yet, as Kubernetes' ReplicaSet controller and KubeVirt keep them
//! (`pkg/controller/controller_utils.go` `ControllerExpectations`).
//!
//! A controller that reads its children from a watch cache must not trust that cache
//! for a parent whose own writes the cache has not caught up with: it would see no pod
//! right after creating one and create a second. So before each create or delete the
//! controller records what it expects under the parent's key, the watch records what it
//! observes, and while something is still expected (and younger than the timeout) the
//! controller leaves that parent alone. Pure bookkeeping: the caller passes the time.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long an unobserved create or delete holds its parent back. Kubernetes uses 5
/// minutes (`ExpectationsTimeout`), and so do we: a watch delivers a create within
/// milliseconds to seconds even under load (the cache is then trusted again at once), so
/// the timeout only matters when an observation is lost or the create's outcome is
/// unknown (a transport error after the request was sent), and then waiting long is the
/// safe side — for a VMI a second launcher would be a second QEMU on the same disks.
pub const TIMEOUT: Duration = Duration::from_secs(300);

/// What a parent still waits for.
#[derive(Debug)]
struct Pending {
    /// Children created and not yet seen.
    creations: u32,
    /// Uids of children deleted whose deletion was not yet seen.
    deletions: HashSet<String>,
    /// When the last expectation was recorded.
    since: Instant,
}

impl Pending {
    fn done(&self) -> bool {
        self.creations == 0 && self.deletions.is_empty()
    }
}

/// Whether a parent's cached children can be trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// Nothing expected: the cache reflects every write of ours.
    Satisfied,
    /// Writes of ours not yet seen; look again within `remaining` at the latest.
    Pending {
        /// Until the expectation expires.
        remaining: Duration,
        /// Creations not yet seen.
        creations: u32,
        /// Deletions not yet seen.
        deletions: usize,
    },
    /// Writes of ours never seen within the timeout: forgotten, the cache is trusted
    /// again (the caller should log this: a watch lost an event or a request's outcome
    /// was unknown).
    Expired {
        /// Creations never seen.
        creations: u32,
        /// Deletions never seen.
        deletions: usize,
    },
}

/// Expectations per parent key (a VMI's uid).
#[derive(Debug)]
pub struct Expectations {
    timeout: Duration,
    table: Mutex<HashMap<String, Pending>>,
}

impl Default for Expectations {
    fn default() -> Self {
        Self::new(TIMEOUT)
    }
}

impl Expectations {
    /// An empty table whose expectations expire after `timeout`.
    pub fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            table: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Pending>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn entry<'a>(
        table: &'a mut HashMap<String, Pending>,
        key: &str,
        now: Instant,
    ) -> &'a mut Pending {
        let p = table.entry(key.to_string()).or_insert_with(|| Pending {
            creations: 0,
            deletions: HashSet::new(),
            since: now,
        });
        p.since = now;
        p
    }

    /// Records a create about to be sent for `key` (before the request: the watch may
    /// deliver the child before the response arrives).
    pub fn expect_creation(&self, key: &str, now: Instant) {
        Self::entry(&mut self.lock(), key, now).creations += 1;
    }

    /// A create that certainly made nothing (the server refused it), or a child of `key`
    /// seen by the watch: one creation fewer to wait for.
    pub fn creation_observed(&self, key: &str) {
        let mut table = self.lock();
        if let Some(p) = table.get_mut(key) {
            p.creations = p.creations.saturating_sub(1);
            if p.done() {
                table.remove(key);
            }
        }
    }

    /// Records deletes about to be sent for children `uids` of `key`.
    pub fn expect_deletions<I, S>(&self, key: &str, uids: I, now: Instant)
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut table = self.lock();
        let p = Self::entry(&mut table, key, now);
        p.deletions.extend(uids.into_iter().map(Into::into));
        if p.done() {
            table.remove(key);
        }
    }

    /// The deletion of child `uid` of `key` was seen (gone, or being deleted), or the
    /// delete failed: nothing to wait for from it.
    pub fn deletion_observed(&self, key: &str, uid: &str) {
        let mut table = self.lock();
        if let Some(p) = table.get_mut(key) {
            p.deletions.remove(uid);
            if p.done() {
                table.remove(key);
            }
        }
    }

    /// A child of `key` with `uid` seen by the watch: `deleting` when it is gone or has a
    /// deletionTimestamp. Seeing any child satisfies a pending creation: a parent creates
    /// only when its cache shows no child, so whichever child appears first is one the
    /// next decision must see, and it stops another create.
    pub fn observe(&self, key: &str, uid: &str, deleting: bool) {
        let mut table = self.lock();
        if let Some(p) = table.get_mut(key) {
            p.creations = p.creations.saturating_sub(1);
            if deleting {
                p.deletions.remove(uid);
            }
            if p.done() {
                table.remove(key);
            }
        }
    }

    /// After the cache was rebuilt from a fresh list (a re-list: events in between may
    /// never arrive): `children(key)` is what the cache now holds for `key`, as (uid,
    /// deleting). A creation is satisfied by any child, a deletion by its child being
    /// absent or deleting.
    pub fn resync<F>(&self, children: F)
    where
        F: Fn(&str) -> Vec<(String, bool)>,
    {
        let mut table = self.lock();
        table.retain(|key, p| {
            let now = children(key);
            if !now.is_empty() {
                p.creations = 0;
            }
            p.deletions
                .retain(|uid| now.iter().any(|(u, deleting)| u == uid && !deleting));
            !p.done()
        });
    }

    /// How long a reconcile of `key` should wait before trusting its cached `children`
    /// (a name for the log), at most `recheck`: `None` when the cache can be trusted now.
    /// Writes never seen within the timeout are logged and forgotten.
    pub fn wait_for_cache(&self, key: &str, children: &str, recheck: Duration) -> Option<Duration> {
        match self.check(key, Instant::now()) {
            Check::Satisfied => None,
            Check::Pending {
                remaining,
                creations,
                deletions,
            } => {
                tracing::debug!(
                    creations,
                    deletions,
                    children,
                    "waiting for the watch to show our writes"
                );
                Some(remaining.min(recheck))
            }
            Check::Expired {
                creations,
                deletions,
            } => {
                tracing::warn!(
                    creations,
                    deletions,
                    children,
                    timeout = ?self.timeout,
                    "writes of ours never seen by the watch; trusting the cache again"
                );
                None
            }
        }
    }

    /// Whether `key`'s cached children can be trusted at `now`. An expired entry is
    /// removed.
    pub fn check(&self, key: &str, now: Instant) -> Check {
        let mut table = self.lock();
        let Some(p) = table.get(key) else {
            return Check::Satisfied;
        };
        let age = now.saturating_duration_since(p.since);
        let (creations, deletions) = (p.creations, p.deletions.len());
        if age >= self.timeout {
            table.remove(key);
            return Check::Expired {
                creations,
                deletions,
            };
        }
        Check::Pending {
            remaining: self.timeout - age,
            creations,
            deletions,
        }
    }

    /// Forgets `key` (its parent is gone).
    pub fn forget(&self, key: &str) {
        self.lock().remove(key);
    }

    /// Parents with something pending.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Nothing pending for any parent.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(300);

    fn pending(remaining: Duration, creations: u32, deletions: usize) -> Check {
        Check::Pending {
            remaining,
            creations,
            deletions,
        }
    }

    #[test]
    fn nothing_expected_is_satisfied() {
        let e = Expectations::new(T);
        assert_eq!(e.check("vmi", Instant::now()), Check::Satisfied);
        assert!(e.is_empty());
    }

    #[test]
    fn a_creation_holds_until_a_child_is_seen() {
        let e = Expectations::new(T);
        let t0 = Instant::now();
        e.expect_creation("vmi", t0);
        assert_eq!(
            e.check("vmi", t0 + Duration::from_secs(1)),
            pending(T - Duration::from_secs(1), 1, 0)
        );
        // Another parent's child satisfies nothing here.
        e.observe("other", "p", false);
        assert!(matches!(e.check("vmi", t0), Check::Pending { .. }));
        e.observe("vmi", "pod-uid", false);
        assert_eq!(e.check("vmi", t0), Check::Satisfied);
        assert!(e.is_empty(), "a satisfied parent keeps no entry");
        // Later updates of the pod change nothing.
        e.observe("vmi", "pod-uid", false);
        assert_eq!(e.check("vmi", t0), Check::Satisfied);
    }

    #[test]
    fn a_child_seen_before_the_create_returns_still_counts() {
        // The watch can deliver the pod before the POST's response: the expectation is
        // recorded before the request, so the early sighting is not lost.
        let e = Expectations::new(T);
        let t0 = Instant::now();
        e.expect_creation("vmi", t0);
        e.observe("vmi", "pod-uid", false);
        assert_eq!(e.check("vmi", t0), Check::Satisfied);
    }

    #[test]
    fn a_refused_create_releases_its_expectation() {
        let e = Expectations::new(T);
        let t0 = Instant::now();
        e.expect_creation("vmi", t0);
        e.creation_observed("vmi");
        assert_eq!(e.check("vmi", t0), Check::Satisfied);
    }

    #[test]
    fn an_unseen_creation_expires_after_the_timeout_and_is_forgotten() {
        let e = Expectations::new(T);
        let t0 = Instant::now();
        e.expect_creation("vmi", t0);
        assert!(matches!(
            e.check("vmi", t0 + T - Duration::from_millis(1)),
            Check::Pending { .. }
        ));
        assert_eq!(
            e.check("vmi", t0 + T),
            Check::Expired {
                creations: 1,
                deletions: 0
            }
        );
        assert_eq!(e.check("vmi", t0 + T), Check::Satisfied);
        assert!(e.is_empty());
    }

    #[test]
    fn a_new_expectation_restarts_the_clock() {
        let e = Expectations::new(T);
        let t0 = Instant::now();
        e.expect_creation("vmi", t0);
        let t1 = t0 + Duration::from_secs(200);
        e.expect_deletions("vmi", ["a"], t1);
        assert_eq!(
            e.check("vmi", t0 + T),
            pending(Duration::from_secs(200), 1, 1)
        );
    }

    #[test]
    fn deletions_hold_until_each_is_seen_deleting() {
        let e = Expectations::new(T);
        let t0 = Instant::now();
        e.expect_deletions("vmi", ["a", "b"], t0);
        assert_eq!(e.check("vmi", t0), pending(T, 0, 2));
        // An update of a pod not yet deleting is not its deletion.
        e.observe("vmi", "a", false);
        assert_eq!(e.check("vmi", t0), pending(T, 0, 2));
        e.observe("vmi", "a", true);
        assert_eq!(e.check("vmi", t0), pending(T, 0, 1));
        // A failed delete waits for nothing.
        e.deletion_observed("vmi", "b");
        assert_eq!(e.check("vmi", t0), Check::Satisfied);
    }

    #[test]
    fn no_deletions_expect_nothing() {
        let e = Expectations::new(T);
        e.expect_deletions("vmi", Vec::<String>::new(), Instant::now());
        assert!(e.is_empty());
    }

    #[test]
    fn a_relist_settles_what_the_cache_now_shows() {
        let e = Expectations::new(T);
        let t0 = Instant::now();
        e.expect_creation("created", t0);
        e.expect_creation("not-yet", t0);
        e.expect_deletions("deleted", ["gone", "deleting", "alive"], t0);
        e.resync(|key| match key {
            "created" => vec![("p".into(), false)],
            "deleted" => vec![("deleting".into(), true), ("alive".into(), false)],
            _ => Vec::new(),
        });
        assert_eq!(e.check("created", t0), Check::Satisfied);
        assert_eq!(e.check("not-yet", t0), pending(T, 1, 0));
        assert_eq!(e.check("deleted", t0), pending(T, 0, 1));
    }

    #[test]
    fn forget_drops_a_parent() {
        let e = Expectations::new(T);
        e.expect_creation("vmi", Instant::now());
        e.forget("vmi");
        assert!(e.is_empty());
    }
}
