//! Events (`events.k8s.io/v1`) with a bounded memory of the recent ones.
//!
//! kube-runtime's `Recorder` keeps every Event it wrote in the last six minutes, whole,
//! to count repeats into a series, and scans them all on each publish: at 2,000 VMIs
//! started in a minute that was 13.6 MB, a quarter of virt-controller's heap (heaptrack,
//! `cargo xtask bench scale --vms 2000`), and it grows with the start rate. Here a repeat
//! needs only the Event's name and count, and at most [`CAPACITY`] of them are kept, as
//! client-go's correlator keeps an LRU of 4,096: a repeat older than that becomes a new
//! Event, which is what a reader of `kubectl get events` sees either way.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Api, Client};

/// Most Events remembered for counting repeats.
pub const CAPACITY: usize = 4096;

/// How long an Event takes repeats into its series (kube-runtime's and client-go's).
pub const SERIES_WINDOW: Duration = Duration::from_secs(6 * 60);

/// Writes Events about objects, counting a repeat (same object, type, reason, action and
/// note within [`SERIES_WINDOW`]) into the first Event's `series` instead of writing another.
/// The note is part of what makes a repeat, as in client-go's correlator: two Events with the
/// same reason but different notes ("runs on node vm", then "claim rwo-disk kept") are two
/// facts, and a series would show only the first.
pub struct Recorder {
    client: Client,
    controller: String,
    instance: String,
    recent: Mutex<Recent>,
}

/// The Event a repeat is counted into.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    namespace: String,
    name: String,
    count: i32,
    at: Instant,
}

/// The remembered Events, by a hash of what makes two of them the same.
#[derive(Debug, Default)]
struct Recent {
    by_key: HashMap<u64, Seen>,
}

impl Recent {
    /// The Event `key` repeats, counted, if it is still in its window.
    fn repeat(&mut self, key: u64, now: Instant) -> Option<Seen> {
        let seen = self.by_key.get_mut(&key)?;
        if now.duration_since(seen.at) >= SERIES_WINDOW {
            self.by_key.remove(&key);
            return None;
        }
        seen.count = seen.count.saturating_add(1);
        seen.at = now;
        Some(seen.clone())
    }

    /// Remembers a new Event, making room first: the ones out of their window go, then,
    /// if that is not enough, the least recently seen.
    fn remember(&mut self, key: u64, seen: Seen) {
        if self.by_key.len() >= CAPACITY && !self.by_key.contains_key(&key) {
            let now = seen.at;
            self.by_key
                .retain(|_, s| now.duration_since(s.at) < SERIES_WINDOW);
            if self.by_key.len() >= CAPACITY
                && let Some(oldest) = self
                    .by_key
                    .iter()
                    .min_by_key(|(_, s)| s.at)
                    .map(|(k, _)| *k)
            {
                self.by_key.remove(&oldest);
            }
        }
        self.by_key.insert(key, seen);
    }

    fn forget(&mut self, key: u64) {
        self.by_key.remove(&key);
    }
}

/// What makes two Events the same series.
fn key(
    regarding: &ObjectReference,
    type_: EventType,
    reason: &str,
    action: &str,
    note: &str,
) -> u64 {
    let mut h = DefaultHasher::new();
    (
        &regarding.uid,
        &regarding.kind,
        &regarding.namespace,
        &regarding.name,
    )
        .hash(&mut h);
    matches!(type_, EventType::Warning).hash(&mut h);
    (reason, action, note).hash(&mut h);
    h.finish()
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("controller", &self.controller)
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl Recorder {
    /// A recorder writing as `controller` (`reportingController`), replica `instance`.
    pub fn new(client: Client, controller: &str, instance: &str) -> Self {
        Self {
            client,
            controller: controller.to_string(),
            instance: instance.to_string(),
            recent: Mutex::default(),
        }
    }

    /// Writes an Event about `regarding`, or counts it into the one it repeats.
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: &str,
    ) -> Result<(), kube::Error> {
        let key = key(regarding, type_, reason, action, note);
        let now = Instant::now();
        let repeat = self
            .recent
            .lock()
            .map(|mut r| r.repeat(key, now))
            .unwrap_or(None);
        let stamp = MicroTime(Timestamp::now());
        if let Some(seen) = repeat {
            let api = Api::<Event>::namespaced(self.client.clone(), &seen.namespace);
            let series = Event {
                series: Some(EventSeries {
                    count: seen.count,
                    last_observed_time: stamp.clone(),
                }),
                ..Event::default()
            };
            match api
                .patch(&seen.name, &PatchParams::default(), &Patch::Merge(&series))
                .await
            {
                Ok(_) => return Ok(()),
                // Gone (its TTL, or deleted): the repeat starts a new Event.
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    if let Ok(mut r) = self.recent.lock() {
                        r.forget(key);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        let namespace = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_string());
        // Unique per Event as kube-runtime and client-go name them: the object, then the
        // time in nanoseconds.
        let name = format!(
            "{}.{:x}",
            regarding.name.as_deref().unwrap_or(&self.controller),
            stamp.0.as_nanosecond()
        );
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(namespace.clone()),
                ..ObjectMeta::default()
            },
            action: Some(action.to_string()),
            reason: Some(reason.to_string()),
            note: Some(note.to_string()),
            event_time: Some(stamp),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            type_: Some(
                match type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .to_string(),
            ),
            ..Event::default()
        };
        Api::<Event>::namespaced(self.client.clone(), &namespace)
            .create(&PostParams::default(), &event)
            .await?;
        if let Ok(mut r) = self.recent.lock() {
            r.remember(
                key,
                Seen {
                    namespace,
                    name,
                    count: 1,
                    at: now,
                },
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(name: &str) -> ObjectReference {
        ObjectReference {
            kind: Some("VirtualMachineInstance".into()),
            namespace: Some("ns".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..ObjectReference::default()
        }
    }

    fn seen(name: &str, at: Instant) -> Seen {
        Seen {
            namespace: "ns".into(),
            name: name.into(),
            count: 1,
            at,
        }
    }

    #[test]
    fn the_same_event_is_a_repeat_a_different_one_is_not() {
        let k = |o: &str, t, reason: &str, action: &str, note: &str| {
            key(&obj(o), t, reason, action, note)
        };
        let a = k(
            "a",
            EventType::Normal,
            "SuccessfulCreate",
            "Create",
            "made x",
        );
        assert_eq!(
            a,
            k(
                "a",
                EventType::Normal,
                "SuccessfulCreate",
                "Create",
                "made x"
            )
        );
        for other in [
            k(
                "b",
                EventType::Normal,
                "SuccessfulCreate",
                "Create",
                "made x",
            ),
            k(
                "a",
                EventType::Warning,
                "SuccessfulCreate",
                "Create",
                "made x",
            ),
            k("a", EventType::Normal, "FailedCreate", "Create", "made x"),
            k(
                "a",
                EventType::Normal,
                "SuccessfulCreate",
                "Delete",
                "made x",
            ),
            // Same reason, another fact: its own Event, not a repeat of the first.
            k(
                "a",
                EventType::Normal,
                "SuccessfulCreate",
                "Create",
                "made y",
            ),
        ] {
            assert_ne!(a, other);
        }
    }

    #[test]
    fn repeats_count_into_the_first_event_within_the_window() {
        let t0 = Instant::now();
        let mut r = Recent::default();
        assert_eq!(r.repeat(1, t0), None, "never seen");
        r.remember(1, seen("e1", t0));
        let again = r.repeat(1, t0 + Duration::from_secs(10));
        assert_eq!(again.map(|s| (s.name, s.count)), Some(("e1".into(), 2)));
        assert_eq!(
            r.repeat(1, t0 + Duration::from_secs(20)).map(|s| s.count),
            Some(3)
        );
        // The window runs from the last repeat.
        assert_eq!(
            r.repeat(1, t0 + Duration::from_secs(20) + SERIES_WINDOW),
            None,
            "out of the window: a new Event"
        );
        assert!(r.by_key.is_empty(), "an expired entry is dropped");
    }

    #[test]
    fn memory_is_bounded_and_the_least_recent_goes_first() {
        let t0 = Instant::now();
        let mut r = Recent::default();
        for k in 0..CAPACITY as u64 {
            r.remember(k, seen("e", t0 + Duration::from_millis(k)));
        }
        // Key 0 was seen again: key 1 is now the least recent.
        assert!(r.repeat(0, t0 + Duration::from_secs(60)).is_some());
        r.remember(u64::MAX, seen("new", t0 + Duration::from_secs(61)));
        assert_eq!(r.by_key.len(), CAPACITY);
        assert!(r.by_key.contains_key(&0) && r.by_key.contains_key(&u64::MAX));
        assert!(!r.by_key.contains_key(&1));
    }

    #[test]
    fn expired_entries_make_room_before_live_ones() {
        let t0 = Instant::now();
        let mut r = Recent::default();
        for k in 0..CAPACITY as u64 {
            r.remember(k, seen("e", t0));
        }
        let later = t0 + SERIES_WINDOW + Duration::from_secs(1);
        r.remember(u64::MAX, seen("new", later));
        assert_eq!(r.by_key.len(), 1, "every expired entry went at once");
    }
}
