//! kube-apiserver's max-in-flight filter: at most N read-only and M mutating requests are
//! handled at once; beyond that a request is answered 429 with `Retry-After: 1` at once,
//! instead of queueing until memory or etcd gives out. Watches and streams (console, VNC,
//! port-forward) are long-running and not counted, as in kube-apiserver: they have their
//! own gauge.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::request::RequestInfo;

/// kube-apiserver's `--max-requests-inflight` default.
pub const DEFAULT_READ_ONLY: usize = 400;
/// kube-apiserver's `--max-mutating-requests-inflight` default.
pub const DEFAULT_MUTATING: usize = 200;

/// Which budget a request draws from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// get, list and non-resource reads.
    ReadOnly,
    /// create, update, patch, delete, deletecollection and actions.
    Mutating,
    /// Watches and streams: not limited here.
    LongRunning,
}

impl Class {
    /// Label value for metrics.
    pub fn label(self) -> &'static str {
        match self {
            Class::ReadOnly => "readOnly",
            Class::Mutating => "mutating",
            Class::LongRunning => "longRunning",
        }
    }
}

/// The class of a request.
pub fn classify(info: &RequestInfo) -> Class {
    if info.verb == "watch" {
        return Class::LongRunning;
    }
    if info.group == kubevirt_api::SUBRESOURCES_GROUP
        && kubevirt_api::catalogue::subresource(&info.resource, &info.subresource)
            .is_some_and(|s| s.is_stream())
    {
        return Class::LongRunning;
    }
    match info.verb.as_str() {
        "get" | "list" | "head" | "options" => Class::ReadOnly,
        _ => Class::Mutating,
    }
}

/// The two budgets.
#[derive(Debug)]
pub struct InFlight {
    read_only: Arc<Semaphore>,
    mutating: Arc<Semaphore>,
}

impl InFlight {
    /// Budgets of `read_only` and `mutating` requests; 0 means unlimited, as in
    /// kube-apiserver.
    pub fn new(read_only: usize, mutating: usize) -> Self {
        let sem = |n: usize| {
            Arc::new(Semaphore::new(if n == 0 {
                Semaphore::MAX_PERMITS
            } else {
                n
            }))
        };
        InFlight {
            read_only: sem(read_only),
            mutating: sem(mutating),
        }
    }

    /// A slot for a request of `class`, held until the permit drops; `Err` when the
    /// budget is spent. Long-running requests always get `Ok(None)`.
    pub fn admit(&self, class: Class) -> Result<Option<OwnedSemaphorePermit>, Class> {
        let sem = match class {
            Class::LongRunning => return Ok(None),
            Class::ReadOnly => &self.read_only,
            Class::Mutating => &self.mutating,
        };
        sem.clone().try_acquire_owned().map(Some).map_err(|_| class)
    }
}

impl Default for InFlight {
    fn default() -> Self {
        Self::new(DEFAULT_READ_ONLY, DEFAULT_MUTATING)
    }
}

/// kube-apiserver has no such bound; ours keeps one identity from opening watches until
/// memory runs out. Components that share an identity (every virt-handler uses one service
/// account) open a handful each: 5000 leaves room for ~1000 nodes.
pub const DEFAULT_WATCHES_PER_USER: usize = 5000;

/// Console, VNC and port-forward streams one user may have open at once. Each costs a
/// client connection, a connection to a virt-handler and tasks on both: without a bound one
/// editor could take every connection slot of the server (N5 of the security review at
/// bd37f96). No component opens streams; 200 is far beyond what a person uses.
pub const DEFAULT_STREAMS_PER_USER: usize = 200;

/// Long-running requests (watches, or streams) open per user.
#[derive(Debug)]
pub struct PerUser {
    max: usize,
    open: std::sync::Mutex<std::collections::HashMap<String, usize>>,
}

/// One open watch or stream; the count drops with it.
#[derive(Debug)]
pub struct UserSlot {
    watches: Arc<PerUser>,
    user: String,
}

impl PerUser {
    /// At most `max` per user; 0: no limit.
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(PerUser {
            max,
            open: Default::default(),
        })
    }

    /// A slot for one more of `user`'s, or `None` when the user has `max` open.
    pub fn admit(self: &Arc<Self>, user: &str) -> Option<UserSlot> {
        let mut open = self
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = open.entry(user.to_string()).or_default();
        if self.max != 0 && *n >= self.max {
            return None;
        }
        *n += 1;
        Some(UserSlot {
            watches: self.clone(),
            user: user.to_string(),
        })
    }

    /// The most a user may hold.
    pub fn max(&self) -> usize {
        self.max
    }
}

impl Drop for UserSlot {
    fn drop(&mut self) {
        let mut open = self
            .watches
            .open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.user) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.user);
            }
        }
    }
}

/// The eviction webhook's calls at once from one source address.
pub const DEFAULT_WEBHOOK_PER_SOURCE: usize = 32;
/// The eviction webhook's calls at once in all.
pub const DEFAULT_WEBHOOK_TOTAL: usize = 1024;

/// The eviction webhook's own budget. kube-apiserver calls the webhook without credentials,
/// so anyone who reaches the port can call it too; its calls neither draw from the API's
/// budgets (slow bodies there held every mutating slot: N2 of the security review at
/// bd37f96) nor share one pool among callers: each source address gets at most
/// `per_source` at once, so kube-apiserver's own calls (a drain) find room whatever
/// another address sends.
#[derive(Debug)]
pub struct PerSource {
    per_source: usize,
    total: Arc<Semaphore>,
    open: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
}

/// One call in [`PerSource`]; both counts drop with it.
#[derive(Debug)]
pub struct SourceSlot {
    set: Arc<PerSource>,
    source: std::net::IpAddr,
    _total: OwnedSemaphorePermit,
}

impl PerSource {
    /// At most `per_source` calls per address and `total` in all.
    pub fn new(per_source: usize, total: usize) -> Arc<Self> {
        Arc::new(Self {
            per_source: per_source.max(1),
            total: Arc::new(Semaphore::new(total.max(1))),
            open: Default::default(),
        })
    }

    /// A slot for a call from `source`, or `None` when that address or all have their most.
    pub fn admit(self: &Arc<Self>, source: std::net::IpAddr) -> Option<SourceSlot> {
        let total = self.total.clone().try_acquire_owned().ok()?;
        let mut open = self.lock();
        let n = open.entry(source).or_default();
        if *n >= self.per_source {
            return None;
        }
        *n += 1;
        Some(SourceSlot {
            set: self.clone(),
            source,
            _total: total,
        })
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<std::net::IpAddr, usize>> {
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut open = self.set.lock();
        if let Some(n) = open.get_mut(&self.source) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.source);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::request::{Query, request_info};

    fn class(method: &str, path: &str, query: &str) -> Class {
        classify(&request_info(method, path, &Query::parse(Some(query))))
    }

    #[test]
    fn watches_and_streams_are_long_running_the_rest_read_or_write() {
        let vms = "/apis/kubevirt.io/v1/namespaces/d/virtualmachines";
        assert_eq!(class("GET", vms, "watch=true"), Class::LongRunning);
        assert_eq!(class("GET", vms, ""), Class::ReadOnly);
        assert_eq!(class("GET", &format!("{vms}/a"), ""), Class::ReadOnly);
        assert_eq!(class("POST", vms, ""), Class::Mutating);
        assert_eq!(class("PATCH", &format!("{vms}/a"), ""), Class::Mutating);
        let sub = "/apis/subresources.kubevirt.io/v1/namespaces/d";
        assert_eq!(
            class(
                "GET",
                &format!("{sub}/virtualmachineinstances/a/console"),
                ""
            ),
            Class::LongRunning
        );
        assert_eq!(
            class(
                "GET",
                &format!("{sub}/virtualmachines/a/portforward/22"),
                ""
            ),
            Class::LongRunning
        );
        assert_eq!(
            class("PUT", &format!("{sub}/virtualmachines/a/start"), ""),
            Class::Mutating
        );
        assert_eq!(class("GET", "/openapi/v2", ""), Class::ReadOnly);
    }

    #[test]
    fn a_spent_budget_refuses_until_a_slot_frees() {
        let f = InFlight::new(1, 1);
        let a = f.admit(Class::ReadOnly).unwrap();
        assert_eq!(f.admit(Class::ReadOnly).unwrap_err(), Class::ReadOnly);
        // The budgets are separate; long-running requests are never refused.
        let _w = f.admit(Class::Mutating).unwrap();
        assert!(f.admit(Class::LongRunning).unwrap().is_none());
        drop(a);
        assert!(f.admit(Class::ReadOnly).unwrap().is_some());
        let unlimited = InFlight::new(0, 0);
        let held: Vec<_> = (0..1000)
            .map(|_| unlimited.admit(Class::Mutating).unwrap())
            .collect();
        assert_eq!(held.len(), 1000);
    }

    #[test]
    fn watches_are_counted_per_user_and_released_on_drop() {
        let w = PerUser::new(2);
        let a1 = w.admit("alice").unwrap();
        let _a2 = w.admit("alice").unwrap();
        assert!(w.admit("alice").is_none());
        let _b = w.admit("bob").unwrap();
        drop(a1);
        assert!(w.admit("alice").is_some());
        let unlimited = PerUser::new(0);
        let held: Vec<_> = (0..5000).map(|_| unlimited.admit("x").unwrap()).collect();
        drop(held);
        assert!(unlimited.open.lock().unwrap().is_empty());
    }
}

#[cfg(test)]
mod per_source_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn one_source_cannot_take_another_ones_webhook_slots() {
        let set = PerSource::new(2, 3);
        let a: std::net::IpAddr = "10.0.0.1".parse().unwrap();
        let b: std::net::IpAddr = "10.0.0.2".parse().unwrap();
        let a1 = set.admit(a).unwrap();
        let _a2 = set.admit(a).unwrap();
        assert!(set.admit(a).is_none(), "a third call from one address");
        let _b1 = set.admit(b).unwrap();
        assert!(set.admit(b).is_none(), "the total is spent");
        drop(a1);
        assert!(set.admit(b).is_some());
    }
}
