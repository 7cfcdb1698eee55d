//! The watch cache: one etcd watch per stored resource feeds every client watch and the
//! LISTs that may be served from memory, as kube-apiserver's cacher does. Without it each
//! client watch held its own etcd watch, so etcd's load grew with the number of watchers
//! (one per virt-handler node, every controller, every `kubectl get -w`).
//!
//! A reflector task per resource lists the resource's whole prefix at one revision, then
//! follows an etcd watch from there. It keeps:
//! - the current objects, still encoded (decoded JSON is ~10× its text; a LIST decodes one
//!   item at a time, as it does from etcd);
//! - the last events, decoded once and shared by every watcher, so that a client resuming
//!   from a recent resourceVersion is served from memory;
//! - its revision, advanced by events and by etcd's progress notifications, which it asks
//!   for when a reader needs a revision it has not seen (a revision of another resource).
//!   Only from an etcd whose notifications cannot overtake its events (3.4.31, 3.5.13 on:
//!   [`crate::storage::progress_notify_reliable`]); with an older one the revision moves with
//!   events only, and reads that need etcd's latest revision (a LIST without a
//!   resourceVersion) are served from it only when its resource had etcd's last write
//!   (its revision is then etcd's), else by etcd, as kube-apiserver does. A change older than the cache's
//!   revision (a notification that overtook it after all) makes the reflector list again
//!   instead of being dropped as already delivered.
//!
//! When the reflector's watch breaks it is resumed from the cache's revision (on another etcd
//! member if its own went down), and watchers stay connected; only a compacted revision or a
//! watch that cannot be resumed makes it list again, which ends the watchers of the old
//! generation (their clients watch again from their last resourceVersion). Readers fall back to
//! etcd whenever the cache cannot answer exactly: not synced yet, a resourceVersion older
//! than its events, a paged or exact read.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::StreamExt;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::metrics::CacheLabels;
use crate::storage::{Change, RawKv, StorageError, Store};

/// Events a cache keeps for watchers resuming from an earlier resourceVersion.
pub const DEFAULT_HISTORY: usize = 1024;
/// Keys read per etcd request while listing (keeps each gRPC message small at any size).
const LIST_PAGE: i64 = 500;
/// Events buffered per watcher before it is ended as too slow (it watches again).
const WATCHER_QUEUE: usize = 1024;
/// Failed resumes of the reflector's etcd watch in a row (about 4 s with their pauses)
/// before it lists again instead.
const RESUME_ATTEMPTS: u32 = 6;

/// One change of the cached resource, shared by every watcher that receives it.
#[derive(Debug)]
pub struct Event {
    /// The changed key.
    pub key: String,
    /// The change's revision.
    pub revision: i64,
    /// The change as the storage reported it.
    pub change: Change,
    /// The change's JSON watch line for watchers without selectors, encoded by the first
    /// of them and shared with the rest.
    line: std::sync::OnceLock<Option<bytes::Bytes>>,
}

impl Event {
    /// The change encoded by `encode` once, however many watchers ask.
    pub fn json_line(&self, encode: fn(&Change) -> Option<bytes::Bytes>) -> Option<bytes::Bytes> {
        self.line.get_or_init(|| encode(&self.change)).clone()
    }
}

/// What a watcher receives, in revision order.
#[derive(Debug, Clone)]
pub enum Item {
    /// A change.
    Event(Arc<Event>),
    /// Every change up to this revision has been sent.
    Progress(i64),
}

/// An object as stored: its encoded value (without resourceVersion) and revision.
#[derive(Debug, Clone)]
pub struct Raw {
    /// The key's mod_revision: the object's resourceVersion.
    pub revision: i64,
    /// The encoded object.
    pub bytes: Arc<[u8]>,
}

/// Why the cache cannot serve a read: the caller goes to etcd instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Miss {
    /// The reflector has not listed yet, or is listing again after a failure.
    NotSynced,
    /// The revision asked for is older than the cache's events.
    TooOld {
        /// The cache holds every event after this revision.
        oldest: i64,
    },
    /// The cache did not reach the revision in time.
    Behind,
    /// The read needs etcd's latest revision, which the cache cannot confirm without
    /// progress notifications it can trust.
    NoProgress,
}

#[derive(Debug, Default)]
struct Inner {
    synced: bool,
    objects: BTreeMap<String, Raw>,
    history: VecDeque<Arc<Event>>,
    /// `history` holds every change after this revision.
    oldest: i64,
    revision: i64,
    /// Senders of the current generation's watchers; dropped when the reflector lists
    /// again, which ends those watches.
    watchers: Vec<mpsc::Sender<Item>>,
}

/// The cache of one resource (every namespace).
#[derive(Debug)]
pub struct Cacher {
    prefix: String,
    capacity: usize,
    inner: RwLock<Inner>,
    /// The synced revision, for readers waiting for one.
    revision: watch::Sender<i64>,
    /// Asks the reflector's etcd watch for a progress notification.
    progress: Mutex<Option<mpsc::Sender<()>>>,
    /// Whether progress notifications move the revision (checked at each sync).
    trusts_progress: AtomicBool,
}

/// A watcher's start: what it sends first, then the live items.
#[derive(Debug)]
pub struct Subscription {
    /// The events after the requested revision (empty for a snapshot start).
    pub replay: Vec<Arc<Event>>,
    /// The objects of a snapshot start (key, object), in key order.
    pub snapshot: Vec<(String, Raw)>,
    /// The revision the watcher is at after `replay`/`snapshot`.
    pub revision: i64,
    /// Live items after `revision`; closed when the watcher falls behind or the cache
    /// lists again.
    pub live: mpsc::Receiver<Item>,
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Cacher {
    fn new(prefix: String, capacity: usize) -> Self {
        Self {
            prefix,
            capacity: capacity.max(1),
            inner: RwLock::default(),
            revision: watch::channel(0).0,
            progress: Mutex::default(),
            trusts_progress: AtomicBool::new(false),
        }
    }

    /// Whether the cache can reach etcd's latest revision on a quiet prefix (its etcd's
    /// progress notifications are trusted); without that, reads needing it go to etcd.
    pub fn trusts_progress(&self) -> bool {
        self.trusts_progress.load(Ordering::Relaxed)
    }

    /// The key prefix this cache holds.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Asks etcd where it is; the answer advances the cache's revision.
    pub fn request_progress(&self) {
        if !self.trusts_progress() {
            return;
        }
        if let Some(tx) = self
            .progress
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
        {
            let _ = tx.try_send(());
        }
    }

    /// Waits until the cache has seen every change up to `want`.
    pub async fn wait_for(&self, want: i64, timeout: Duration) -> Result<(), Miss> {
        let mut rx = self.revision.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if !read(&self.inner).synced {
                return Err(Miss::NotSynced);
            }
            if *rx.borrow_and_update() >= want {
                return Ok(());
            }
            self.request_progress();
            // Progress requests are answered within milliseconds; ask again if one was
            // lost (etcd drops them while the watch is catching up).
            let step = (deadline - tokio::time::Instant::now()).min(Duration::from_millis(250));
            if step.is_zero() {
                return Err(Miss::Behind);
            }
            let _ = tokio::time::timeout(step, rx.changed()).await;
        }
    }

    /// The cache's revision, if it is synced.
    pub fn revision(&self) -> Option<i64> {
        let g = read(&self.inner);
        g.synced.then_some(g.revision)
    }

    /// The objects under `prefix` (a namespace's, or all), with the revision they are at.
    pub fn list(&self, prefix: &str) -> Result<(Vec<Raw>, i64), Miss> {
        let g = read(&self.inner);
        if !g.synced {
            return Err(Miss::NotSynced);
        }
        let items = g
            .objects
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| v.clone())
            .collect();
        Ok((items, g.revision))
    }

    /// Starts a watcher at the current state: the objects under `prefix`, then changes.
    pub fn subscribe_snapshot(&self, prefix: &str) -> Result<Subscription, Miss> {
        let mut g = write(&self.inner);
        if !g.synced {
            return Err(Miss::NotSynced);
        }
        let snapshot = g
            .objects
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let (tx, live) = mpsc::channel(WATCHER_QUEUE);
        g.watchers.push(tx);
        Ok(Subscription {
            replay: Vec::new(),
            snapshot,
            revision: g.revision,
            live,
        })
    }

    /// Starts a watcher after revision `from`: the cached events after it, then changes.
    pub fn subscribe_since(&self, from: i64) -> Result<Subscription, Miss> {
        let mut g = write(&self.inner);
        if !g.synced {
            return Err(Miss::NotSynced);
        }
        if from < g.oldest {
            return Err(Miss::TooOld { oldest: g.oldest });
        }
        if from > g.revision {
            return Err(Miss::Behind);
        }
        let replay = g
            .history
            .iter()
            .filter(|e| e.revision > from)
            .cloned()
            .collect();
        let (tx, live) = mpsc::channel(WATCHER_QUEUE);
        g.watchers.push(tx);
        Ok(Subscription {
            replay,
            snapshot: Vec::new(),
            revision: g.revision,
            live,
        })
    }

    /// Starts a watcher at the cache's current revision: later changes only.
    pub fn subscribe_now(&self) -> Result<Subscription, Miss> {
        let from = self.revision().ok_or(Miss::NotSynced)?;
        self.subscribe_since(from)
    }

    /// Hands `item` to every watcher; one whose queue is full is dropped (its stream ends
    /// and its client watches again from its last resourceVersion).
    fn fan_out(g: &mut Inner, item: &Item) {
        g.watchers.retain(|tx| tx.try_send(item.clone()).is_ok());
    }

    /// Applies one change of the reflector's watch; `Err` with the change's and the cache's
    /// revisions when it is not newer than everything applied (the cache must list again).
    fn apply(&self, change: Change) -> Result<(), (i64, i64)> {
        let mut g = write(&self.inner);
        let revision = match &change {
            Change::Put { new, .. } => Some(new.revision),
            Change::Delete { revision, .. } => Some(*revision),
            Change::Progress(_) => None,
        };
        if let Some(r) = revision
            && r <= g.revision
        {
            return Err((r, g.revision));
        }
        let (key, revision) = match &change {
            Change::Put { new, .. } => {
                let Ok(bytes) = serde_json::to_vec(&new.value) else {
                    return Ok(());
                };
                g.objects.insert(
                    new.key.clone(),
                    Raw {
                        revision: new.revision,
                        bytes: bytes.into(),
                    },
                );
                (new.key.clone(), new.revision)
            }
            Change::Delete { prev, revision } => {
                g.objects.remove(&prev.key);
                (prev.key.clone(), *revision)
            }
            Change::Progress(rev) => {
                if self.trusts_progress() && *rev > g.revision {
                    g.revision = *rev;
                    Self::fan_out(&mut g, &Item::Progress(*rev));
                    self.revision.send_replace(*rev);
                }
                return Ok(());
            }
        };
        let ev = Arc::new(Event {
            key,
            revision,
            change,
            line: std::sync::OnceLock::new(),
        });
        g.history.push_back(ev.clone());
        while g.history.len() > self.capacity {
            if let Some(old) = g.history.pop_front() {
                g.oldest = old.revision;
            }
        }
        g.revision = revision;
        Self::fan_out(&mut g, &Item::Event(ev));
        self.revision.send_replace(g.revision);
        Ok(())
    }

    fn reset(&self, objects: BTreeMap<String, Raw>, revision: i64) {
        let mut g = write(&self.inner);
        g.objects = objects;
        g.history.clear();
        g.oldest = revision;
        g.revision = revision;
        g.synced = true;
        // Watchers of the previous generation may have missed changes: end them.
        g.watchers.clear();
        self.revision.send_replace(revision);
    }

    fn unsync(&self) {
        let mut g = write(&self.inner);
        g.synced = false;
        g.watchers.clear();
    }

    /// Lists the prefix at one revision, then applies its changes until the watch fails.
    async fn sync_once(&self, store: &dyn Store) -> Result<(), StorageError> {
        let mut objects = BTreeMap::new();
        let mut revision = 0;
        let mut start = self.prefix.clone();
        loop {
            let page = store
                .list_raw(&self.prefix, &start, revision, LIST_PAGE)
                .await?;
            revision = page.revision;
            let last = page.kvs.last().map(|kv| kv.key.clone());
            for RawKv {
                key,
                value,
                mod_revision,
            } in page.kvs
            {
                objects.insert(
                    String::from_utf8_lossy(&key).into_owned(),
                    Raw {
                        revision: mod_revision,
                        bytes: value.into(),
                    },
                );
            }
            match last {
                Some(k) if page.more => {
                    start = format!("{}\0", String::from_utf8_lossy(&k));
                }
                _ => break,
            }
        }
        let trusts_progress = store.progress_notify_reliable().await;
        self.trusts_progress
            .store(trusts_progress, Ordering::Relaxed);
        let mut changes = self.watch_from(store, revision + 1);
        self.reset(objects, revision);
        tracing::info!(prefix = %self.prefix, revision, trusts_progress, "Watch cache synced");
        // A watch that breaks (its etcd member went down, lost its leader, or the connection
        // broke) is resumed where it stopped, on whichever member serves now: every change up
        // to the cache's revision has arrived, etcd's revisions are the whole cluster's, so
        // nothing is missed and the watchers stay connected. Only a compacted revision, or a
        // watch that cannot be resumed at all, makes it list again.
        let mut failures = 0;
        let mut delay = Duration::from_millis(50);
        loop {
            match changes.next().await {
                Some(Ok(c)) => {
                    failures = 0;
                    delay = Duration::from_millis(50);
                    if let Err((change, cache)) = self.apply(c) {
                        tracing::warn!(prefix = %self.prefix, change, cache, "Watch cache got a change older than its revision (a progress notification overtook it); listing again");
                        return Err(StorageError::Cancelled(format!(
                            "a change at revision {change} arrived after revision {cache}"
                        )));
                    }
                }
                Some(Err(e @ StorageError::Compacted(_))) => return Err(e),
                other => {
                    failures += 1;
                    let why = match other {
                        Some(Err(e)) => e.to_string(),
                        _ => "the watch ended".to_string(),
                    };
                    if failures > RESUME_ATTEMPTS {
                        return Err(StorageError::Cancelled(why));
                    }
                    let from = read(&self.inner).revision + 1;
                    tracing::info!(prefix = %self.prefix, from, error = %why, "Watch cache resuming its etcd watch");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(1));
                    changes = self.watch_from(store, from);
                }
            }
        }
    }

    /// An etcd watch of the prefix from `revision`, whose progress notifications
    /// [`Cacher::request_progress`] asks for.
    fn watch_from(&self, store: &dyn Store, revision: i64) -> crate::storage::Changes {
        let (ptx, prx) = mpsc::channel(1);
        *self
            .progress
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(ptx);
        store.watch(self.prefix.clone(), revision, prx)
    }

    /// The reflector: syncs, and syncs again after each failure, until `shutdown`.
    async fn run(self: Arc<Self>, store: Arc<dyn Store>, shutdown: CancellationToken) {
        let mut backoff = Duration::from_millis(100);
        loop {
            let started = tokio::time::Instant::now();
            tokio::select! {
                _ = shutdown.cancelled() => return,
                r = self.sync_once(&*store) => {
                    if let Err(e) = r {
                        tracing::warn!(prefix = %self.prefix, error = %e, "Watch cache lost its etcd watch; listing again");
                    }
                }
            }
            self.unsync();
            if started.elapsed() > Duration::from_secs(30) {
                backoff = Duration::from_millis(100);
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }
}

/// The caches of every stored resource, by key prefix.
#[derive(Debug, Default)]
pub struct WatchCache {
    cachers: Vec<Arc<Cacher>>,
    reads: Family<CacheLabels, Counter>,
}

impl WatchCache {
    /// Starts a reflector for each prefix (each a resource's collection prefix, ending in
    /// `/`) keeping `capacity` events.
    pub fn start(
        store: Arc<dyn Store>,
        prefixes: impl IntoIterator<Item = String>,
        capacity: usize,
        shutdown: CancellationToken,
    ) -> Self {
        let cachers = prefixes
            .into_iter()
            .map(|p| {
                let c = Arc::new(Cacher::new(p, capacity));
                tokio::spawn(c.clone().run(store.clone(), shutdown.clone()));
                c
            })
            .collect();
        Self {
            cachers,
            reads: Family::default(),
        }
    }

    /// Counts reads into `reads` (the server's metric family).
    #[must_use]
    pub fn with_metrics(mut self, reads: Family<CacheLabels, Counter>) -> Self {
        self.reads = reads;
        self
    }

    /// Counts one read: served from the cache (`None`), or by etcd because of `miss`.
    pub fn count(&self, operation: &str, miss: Option<Miss>) {
        let served_by = match miss {
            None => "cache",
            Some(Miss::NotSynced) => "not_synced",
            Some(Miss::TooOld { .. }) => "too_old",
            Some(Miss::Behind) => "behind",
            Some(Miss::NoProgress) => "no_progress",
        };
        self.reads
            .get_or_create(&CacheLabels {
                operation: operation.to_string(),
                served_by: served_by.to_string(),
            })
            .inc();
    }

    /// The cache holding keys under `prefix`.
    pub fn cacher(&self, prefix: &str) -> Option<&Arc<Cacher>> {
        self.cachers
            .iter()
            .find(|c| prefix.starts_with(c.prefix.as_str()))
    }

    /// Whether every cache has listed (for /readyz).
    pub fn synced(&self) -> bool {
        self.cachers.iter().all(|c| c.revision().is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memstore::MemStore;
    use serde_json::json;

    async fn started(store: &Arc<MemStore>, capacity: usize) -> (WatchCache, CancellationToken) {
        let token = CancellationToken::new();
        let dynstore: Arc<dyn Store> = store.clone();
        let cache = WatchCache::start(dynstore, ["/r/vms/".to_string()], capacity, token.clone());
        for _ in 0..100 {
            if cache.synced() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(cache.synced());
        (cache, token)
    }

    /// Waits until the cache has every write (through a relist if it lost its watch).
    async fn settle(c: &Cacher, store: &MemStore) {
        let want = store.current_revision().await.expect("revision");
        for _ in 0..100 {
            match c.wait_for(want, Duration::from_secs(2)).await {
                Ok(()) => return,
                Err(Miss::NotSynced) => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(e) => panic!("cache behind: {e:?}"),
            }
        }
        panic!("cache never synced");
    }

    #[tokio::test]
    async fn lists_follow_writes_and_other_prefixes_are_not_held() {
        let store = Arc::new(MemStore::default());
        store
            .create("/r/vms/a/x", &json!({"n": 1}))
            .await
            .expect("create");
        let (cache, _t) = started(&store, 16).await;
        let c = cache.cacher("/r/vms/a/").expect("cacher").clone();
        let rev = store
            .create("/r/vms/b/y", &json!({"n": 2}))
            .await
            .expect("create")
            .expect("new");
        store
            .create("/r/vmis/a/z", &json!({"n": 3}))
            .await
            .expect("create");
        settle(&c, &store).await;
        let (all, at) = c.list("/r/vms/").expect("synced");
        assert_eq!(all.len(), 2);
        assert!(
            at > rev,
            "the other prefix's write advanced the revision by progress"
        );
        let (a, _) = c.list("/r/vms/a/").expect("synced");
        assert_eq!(a.len(), 1);
        assert_eq!(a[0].revision, 1);
    }

    #[tokio::test]
    async fn watchers_resume_from_history_and_older_revisions_miss() {
        let store = Arc::new(MemStore::default());
        let (cache, _t) = started(&store, 2).await;
        let c = cache.cacher("/r/vms/").expect("cacher").clone();
        let mut revs = Vec::new();
        for i in 0..4 {
            revs.push(
                store
                    .create(&format!("/r/vms/a/{i}"), &json!({"i": i}))
                    .await
                    .expect("create")
                    .expect("new"),
            );
        }
        settle(&c, &store).await;
        // Two events kept: from the second-last's predecessor on.
        let sub = c.subscribe_since(revs[1]).expect("in history");
        assert_eq!(
            sub.replay.iter().map(|e| e.revision).collect::<Vec<_>>(),
            vec![revs[2], revs[3]]
        );
        assert_eq!(
            c.subscribe_since(revs[0]).map(|_| ()),
            Err(Miss::TooOld { oldest: revs[1] })
        );
        // A live change reaches the subscriber.
        let mut sub = c.subscribe_since(revs[3]).expect("current");
        let r = store
            .update("/r/vms/a/0", &json!({"i": 9}), revs[0])
            .await
            .expect("update")
            .expect("won");
        match sub.live.recv().await {
            Some(Item::Event(e)) => assert_eq!((e.key.as_str(), e.revision), ("/r/vms/a/0", r)),
            other => panic!("expected the update, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_snapshot_and_its_changes_have_no_gap() {
        let store = Arc::new(MemStore::default());
        let (cache, _t) = started(&store, 16).await;
        let c = cache.cacher("/r/vms/").expect("cacher").clone();
        store
            .create("/r/vms/a/1", &json!({}))
            .await
            .expect("create");
        settle(&c, &store).await;
        let mut sub = c.subscribe_snapshot("/r/vms/a/").expect("synced");
        assert_eq!(sub.snapshot.len(), 1);
        let r = store
            .create("/r/vms/a/2", &json!({}))
            .await
            .expect("create")
            .expect("new");
        match sub.live.recv().await {
            Some(Item::Event(e)) => assert_eq!(e.revision, r),
            other => panic!("expected the create, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_watcher_that_falls_behind_is_ended_and_the_cache_goes_on() {
        let store = Arc::new(MemStore::default());
        let (cache, _t) = started(&store, 16).await;
        let c = cache.cacher("/r/vms/").expect("cacher").clone();
        let mut sub = c
            .subscribe_since(c.revision().expect("synced"))
            .expect("sub");
        // Nobody reads `sub`: past its queue it is dropped, not waited for. (The writes
        // also outrun the in-memory store's event buffer, so the reflector loses its watch
        // and lists again: the path a compacted etcd watch takes.)
        for i in 0..5000 {
            store
                .create(&format!("/r/vms/a/{i}"), &json!({}))
                .await
                .expect("create");
        }
        let mut closed = false;
        for _ in 0..6000 {
            match tokio::time::timeout(Duration::from_secs(2), sub.live.recv()).await {
                Ok(Some(_)) => {}
                Ok(None) => {
                    closed = true;
                    break;
                }
                Err(_) => break,
            }
        }
        assert!(closed, "the slow watcher was ended");
        settle(&c, &store).await;
        assert_eq!(c.list("/r/vms/").expect("synced").0.len(), 5000);
    }

    fn put(key: &str, revision: i64) -> Change {
        Change::Put {
            new: crate::storage::Stored {
                key: key.to_string(),
                value: json!({}),
                revision,
            },
            prev: None,
        }
    }

    /// etcd before 3.4.31/3.5.13 may send a progress notification ahead of changes still
    /// queued for the watch. Trusted, it would move the cache past them, and every watcher
    /// would then drop them as already delivered (VMIs whose status never arrived).
    #[test]
    fn an_untrusted_progress_notification_does_not_move_the_revision() {
        let c = Cacher::new("/r/vms/".into(), 16);
        c.reset(BTreeMap::new(), 5);
        let mut sub = c.subscribe_now().expect("synced");
        c.request_progress(); // untrusted: not even asked for
        assert_eq!(c.apply(Change::Progress(9)), Ok(()));
        assert_eq!(c.revision(), Some(5));
        assert_eq!(c.apply(put("/r/vms/a/x", 7)), Ok(()));
        assert_eq!(c.revision(), Some(7));
        match sub.live.try_recv() {
            Ok(Item::Event(e)) => assert_eq!(e.revision, 7),
            other => panic!("the change was not delivered: {other:?}"),
        }
    }

    /// A change older than the cache's revision is never dropped silently: the reflector
    /// is told to list again (which ends the watchers, who then get 410 for older revisions).
    #[test]
    fn a_change_behind_a_trusted_progress_notification_asks_for_a_relist() {
        let c = Cacher::new("/r/vms/".into(), 16);
        c.trusts_progress.store(true, Ordering::Relaxed);
        c.reset(BTreeMap::new(), 5);
        assert_eq!(c.apply(Change::Progress(9)), Ok(()));
        assert_eq!(c.revision(), Some(9));
        assert_eq!(c.apply(put("/r/vms/a/x", 7)), Err((7, 9)));
        assert!(c.list("/r/vms/").expect("synced").0.is_empty());
    }

    /// A broken etcd watch (its member went down) is resumed where it stopped: the cache's
    /// watchers stay connected and receive every later change, none twice.
    #[tokio::test]
    async fn a_broken_etcd_watch_is_resumed_and_watchers_stay() {
        let store = Arc::new(MemStore::default());
        let (cache, _t) = started(&store, 64).await;
        let c = cache.cacher("/r/vms/").expect("cacher").clone();
        let mut sub = c
            .subscribe_since(c.revision().expect("synced"))
            .expect("sub");
        let first = store
            .create("/r/vms/a/1", &json!({}))
            .await
            .expect("create")
            .expect("new");
        store.break_watches();
        let second = store
            .create("/r/vms/a/2", &json!({}))
            .await
            .expect("create")
            .expect("new");
        let mut got = Vec::new();
        while got.len() < 2 {
            match tokio::time::timeout(Duration::from_secs(5), sub.live.recv()).await {
                Ok(Some(Item::Event(e))) => got.push(e.revision),
                Ok(Some(Item::Progress(_))) => {}
                other => panic!("the watcher was ended or starved: {other:?} after {got:?}"),
            }
        }
        assert_eq!(got, [first, second]);
        assert!(
            c.list("/r/vms/").is_ok(),
            "still synced, never listed again"
        );
    }
}
