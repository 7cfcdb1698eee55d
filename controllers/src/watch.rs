//! Controllers whose watches of our API re-list on their own ([`virt_watch`]): a
//! `kube::runtime::Controller` built on kube-runtime's own watcher would retry a
//! failing resourceVersion forever and stop seeing VMs, VMIs or migrations.

use std::fmt::Debug;

use futures::Stream;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

use virt_watch::WatchMetrics;

/// A controller of every `K` in `api`, its watch labelled `name` in logs and metrics.
pub fn controller<K>(api: Api<K>, name: &'static str, metrics: &WatchMetrics) -> Controller<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    selected_controller(api, watcher::Config::default(), name, metrics)
}

/// [`controller`] over the objects `config` selects.
pub fn selected_controller<K>(
    api: Api<K>,
    config: watcher::Config,
    name: &'static str,
    metrics: &WatchMetrics,
) -> Controller<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (reader, writer): (Store<K>, _) = reflector::store();
    let events = cached(api, config, name, metrics);
    Controller::for_stream(
        reflector::reflector(writer, events).applied_objects(),
        reader,
    )
}

/// The watch events of `api` as the stores here keep them: [`slim`]med, with
/// [`virt_watch`]'s recovery.
pub fn cached<K>(
    api: Api<K>,
    config: watcher::Config,
    name: &'static str,
    metrics: &WatchMetrics,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    virt_watch::watch(api, config, name, metrics.clone()).modify(slim)
}

/// Drops what no controller reads from a cached object: `managedFields`, the server-side
/// apply bookkeeping, often the largest part of an object's metadata. Controllers write by
/// patches that name their fields (guarded by the cached resourceVersion where a stale
/// object must not win), never by sending a cached object back, so nothing is lost on the
/// server.
pub fn slim<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

/// The objects of `api` selected by `config` as they change (for `owns_stream` and
/// `watches_stream`), with the same recovery.
pub fn objects<K>(
    api: Api<K>,
    config: watcher::Config,
    name: &'static str,
    metrics: &WatchMetrics,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    virt_watch::watch(api, config, name, metrics.clone()).touched_objects()
}

/// How long a reconcile waits for its cache's first list before it steps aside and is
/// requeued (so that it never holds a graceful shutdown).
pub const READY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether a reflector's store has had its first full list, for any number of tasks
/// waiting at once.
///
/// kube-runtime's `Store::wait_until_ready` wakes only the last of several concurrent
/// waiters: its `DelayedInit` polls one `futures` oneshot receiver, which keeps a single
/// waker, so each waiter's poll replaces the previous one's. A new leader starts every
/// reconcile before its first lists complete; all but one then waited forever, and the
/// controller, which holds an object's triggers while its reconcile runs, never looked at
/// those objects again (a VMI left in Scheduling after a leader change, a stop never acted
/// on). A watch channel wakes every waiter; a bounded wait keeps a reconcile from holding
/// a graceful shutdown when the list never completes.
#[derive(Debug)]
pub struct Readiness(tokio::sync::watch::Sender<bool>);

impl Default for Readiness {
    fn default() -> Self {
        Self(tokio::sync::watch::Sender::new(false))
    }
}

impl Readiness {
    /// Takes in an event the reflector has just applied: the first `InitDone` makes the
    /// store ready (for good: a later re-list swaps the store's contents at its own
    /// `InitDone` and serves the old ones until then).
    pub fn observe<K>(&self, event: &watcher::Event<K>) {
        if matches!(event, watcher::Event::InitDone) {
            self.0.send_replace(true);
        }
    }

    /// Whether the store is ready now (a scrape, which must not wait).
    pub fn is_ready(&self) -> bool {
        *self.0.borrow()
    }

    /// Whether the store is ready, waiting up to `timeout` for it.
    pub async fn wait(&self, timeout: std::time::Duration) -> bool {
        let mut rx = self.0.subscribe();
        matches!(
            tokio::time::timeout(timeout, rx.wait_for(|ready| *ready)).await,
            Ok(Ok(_))
        )
    }
}

/// Objects whose cached copy a write found stale (409 on its resourceVersion): their next
/// reconcile reads them fresh. A conflict normally means the watch is a moment behind and
/// its next event brings the newer object, but if that event never comes (a watch that
/// restarted past it), a reconcile on the cache would meet the same 409 forever; one
/// fresh read per conflict keeps the cache from ever wedging an object.
#[derive(Debug, Default)]
pub struct Stale(std::sync::Mutex<std::collections::HashSet<String>>);

impl Stale {
    /// Marks `key` (a uid): its cached copy is older than the server's.
    pub fn mark(&self, key: &str) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.to_string());
    }

    /// Whether `key` was marked, unmarking it.
    pub fn take(&self, key: &str) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(key)
    }
}

/// Objects sent to each subscriber ahead of its reading them.
const FEED_BUFFER: usize = 256;

/// One watch and one store of `K` for every controller that reads it, instead of one
/// each: at 2,000 VMIs virt-controller kept four copies of every VMI (VMI, VM and
/// evacuation controllers, workload updater) and decoded each change four times; the
/// copies were about 40 % of its heap (heaptrack, `cargo xtask bench scale --vms 2000`).
///
/// A subscriber's stream has every object the watch applies or deletes, after the store
/// has it (a deleted one is no longer in the store), and, if it subscribed after the
/// first list, the store's objects first. Controllers built on it must start only once
/// [`Shared::wait_ready`] returns true: kube-runtime's controller waits for its store
/// with `Store::wait_until_ready`, which wakes one of several waiters ([`Readiness`]).
pub struct Shared<K: Resource<DynamicType = ()> + Clone + 'static> {
    reader: Store<K>,
    ready: std::sync::Arc<Readiness>,
    feeds: std::sync::Arc<std::sync::Mutex<Vec<tokio::sync::mpsc::Sender<std::sync::Arc<K>>>>>,
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Clone for Shared<K> {
    fn clone(&self) -> Self {
        Self {
            reader: self.reader.clone(),
            ready: self.ready.clone(),
            feeds: self.feeds.clone(),
        }
    }
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> std::fmt::Debug for Shared<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("ready", &self.ready)
            .finish_non_exhaustive()
    }
}

impl<K> Shared<K>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// Starts watching every `K` of `api` ([`cached`]: slimmed, with recovery) until
    /// `stop` is cancelled.
    pub fn spawn(
        api: Api<K>,
        name: &'static str,
        metrics: &WatchMetrics,
        stop: tokio_util::sync::CancellationToken,
    ) -> Self {
        Self::spawn_stream(cached(api, watcher::Config::default(), name, metrics), stop)
    }

    /// [`Shared::spawn`] over any watch event stream.
    pub fn spawn_stream(
        events: impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
        stop: tokio_util::sync::CancellationToken,
    ) -> Self {
        let (reader, mut writer): (Store<K>, _) = reflector::store();
        let shared = Self {
            reader: reader.clone(),
            ready: Default::default(),
            feeds: Default::default(),
        };
        let ready = shared.ready.clone();
        let feeds = shared.feeds.clone();
        tokio::spawn(async move {
            use futures::StreamExt;
            let mut events = std::pin::pin!(events.take_until(stop.cancelled_owned()));
            while let Some(event) = events.next().await {
                let event = match event {
                    Ok(event) => event,
                    // virt_watch recovers on its own; the error is already logged there.
                    Err(_) => continue,
                };
                writer.apply_watcher_event(&event);
                ready.observe(&event);
                let touched: Vec<std::sync::Arc<K>> = match &event {
                    watcher::Event::Apply(obj) => reader
                        .get(&reflector::ObjectRef::from_obj(obj))
                        .into_iter()
                        .collect(),
                    watcher::Event::Delete(obj) => vec![std::sync::Arc::new(obj.clone())],
                    watcher::Event::InitDone => reader.state(),
                    watcher::Event::Init | watcher::Event::InitApply(_) => Vec::new(),
                };
                if touched.is_empty() {
                    continue;
                }
                let senders = feeds.lock().unwrap_or_else(|e| e.into_inner()).clone();
                for tx in senders {
                    for obj in &touched {
                        if tx.send(obj.clone()).await.is_err() {
                            // Its controller stopped: stop feeding it.
                            feeds
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .retain(|t| !t.same_channel(&tx));
                            break;
                        }
                    }
                }
            }
        });
        shared
    }
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> Shared<K> {
    /// The store, shared by every reader.
    pub fn reader(&self) -> Store<K> {
        self.reader.clone()
    }

    /// Whether the store has had its first full list.
    pub fn ready(&self) -> std::sync::Arc<Readiness> {
        self.ready.clone()
    }

    /// Waits for the first full list in steps of [`READY_WAIT`]; false if `stop` came
    /// first.
    pub async fn wait_ready(&self, stop: &tokio_util::sync::CancellationToken) -> bool {
        while !stop.is_cancelled() {
            if self.ready.wait(READY_WAIT).await {
                return true;
            }
        }
        false
    }

    /// The objects the watch touches from now on (see [`Shared`]).
    pub fn subscribe(&self) -> impl Stream<Item = std::sync::Arc<K>> + Send + 'static
    where
        K: Send + Sync,
    {
        use futures::StreamExt;
        let (tx, rx) = tokio::sync::mpsc::channel(FEED_BUFFER);
        self.feeds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(tx);
        // Registered before looking: an object listed meanwhile comes twice at most.
        let first = if *self.ready.0.borrow() {
            self.reader.state()
        } else {
            Vec::new()
        };
        futures::stream::iter(first).chain(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|obj| (obj, rx))
        }))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_stale_mark_is_taken_once() {
        let s = super::Stale::default();
        assert!(!s.take("a"));
        s.mark("a");
        s.mark("a");
        assert!(s.take("a"));
        assert!(!s.take("a"));
    }

    use super::*;
    use kubevirt_api::VirtualMachineInstance;

    #[tokio::test]
    async fn every_concurrent_waiter_sees_the_store_ready() {
        let ready = std::sync::Arc::new(Readiness::default());
        let waiters: Vec<_> = (0..50)
            .map(|_| {
                let r = ready.clone();
                tokio::spawn(async move { r.wait(std::time::Duration::from_secs(30)).await })
            })
            .collect();
        // Every waiter is parked before the list completes, as a new leader's are.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        ready.observe(&watcher::Event::<VirtualMachineInstance>::Init);
        ready.observe(&watcher::Event::<VirtualMachineInstance>::InitDone);
        for w in waiters {
            assert!(
                tokio::time::timeout(std::time::Duration::from_secs(5), w)
                    .await
                    .expect("a waiter was never woken")
                    .unwrap()
            );
        }
        // Ready for good, whatever comes next.
        ready.observe(&watcher::Event::<VirtualMachineInstance>::Init);
        assert!(ready.wait(std::time::Duration::ZERO).await);
    }

    fn vmi(name: &str, uid: &str) -> VirtualMachineInstance {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": name, "namespace": "ns", "uid": uid},
            "spec": {"domain": {"devices": {}}},
        }))
        .unwrap()
    }

    async fn next_name<S: Stream<Item = std::sync::Arc<VirtualMachineInstance>> + Unpin>(
        feed: &mut S,
    ) -> String {
        use futures::StreamExt;
        let obj = tokio::time::timeout(std::time::Duration::from_secs(5), feed.next())
            .await
            .expect("nothing fed")
            .expect("feed ended");
        obj.metadata.name.clone().unwrap()
    }

    #[tokio::test]
    async fn one_store_feeds_every_subscriber_after_the_store_has_the_change() {
        use futures::SinkExt;
        let (mut tx, rx) = futures::channel::mpsc::channel(16);
        let stop = tokio_util::sync::CancellationToken::new();
        let shared = Shared::spawn_stream(rx, stop.clone());
        let mut early = Box::pin(shared.subscribe());
        let dropped = shared.subscribe();
        drop(dropped);
        for ev in [
            watcher::Event::Init,
            watcher::Event::InitApply(vmi("a", "1")),
            watcher::Event::InitApply(vmi("b", "2")),
            watcher::Event::InitDone,
        ] {
            tx.send(Ok(ev)).await.unwrap();
        }
        let mut first = vec![next_name(&mut early).await, next_name(&mut early).await];
        first.sort();
        assert_eq!(first, ["a", "b"], "the first list, once complete");
        assert!(shared.wait_ready(&stop).await);
        // A subscriber after the list starts from the store's objects.
        let mut late = Box::pin(shared.subscribe());
        let mut seen = vec![next_name(&mut late).await, next_name(&mut late).await];
        seen.sort();
        assert_eq!(seen, ["a", "b"]);

        tx.send(Ok(watcher::Event::Apply(vmi("c", "3"))))
            .await
            .unwrap();
        tx.send(Ok(watcher::Event::Delete(vmi("a", "1"))))
            .await
            .unwrap();
        for feed in [&mut early, &mut late] {
            assert_eq!(next_name(feed).await, "c");
            assert_eq!(next_name(feed).await, "a", "a delete is fed too");
        }
        let reader = shared.reader();
        assert!(
            reader
                .get(&reflector::ObjectRef::new("a").within("ns"))
                .is_none()
        );
        assert!(
            reader
                .get(&reflector::ObjectRef::new("c").within("ns"))
                .is_some()
        );
        assert_eq!(
            shared.feeds.lock().unwrap().len(),
            2,
            "the dropped subscriber is no longer fed"
        );
        stop.cancel();
    }

    #[tokio::test]
    async fn a_store_never_listed_is_not_ready_after_the_timeout() {
        let ready = Readiness::default();
        ready.observe(&watcher::Event::<VirtualMachineInstance>::Init);
        assert!(!ready.wait(std::time::Duration::from_millis(20)).await);
    }

    #[test]
    fn slim_objects_keep_everything_but_managed_fields() {
        let vmi: VirtualMachineInstance = serde_json::from_value(serde_json::json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "a", "namespace": "ns", "uid": "u", "labels": {"l": "v"},
                "annotations": {"a": "b"}, "resourceVersion": "7",
                "managedFields": [{"manager": "kubectl", "operation": "Update",
                    "apiVersion": "kubevirt.io/v1", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {}}}]},
            "spec": {"domain": {"devices": {}}},
            "status": {"phase": "Running", "nodeName": "n1"},
        }))
        .unwrap();
        let mut slim_vmi = vmi.clone();
        slim(&mut slim_vmi);
        assert_eq!(slim_vmi.metadata.managed_fields, None);
        let mut without = serde_json::to_value(&vmi).unwrap();
        without["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("managedFields");
        assert_eq!(serde_json::to_value(&slim_vmi).unwrap(), without);
    }
}
