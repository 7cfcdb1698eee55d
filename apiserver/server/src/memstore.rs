//! An in-memory [`Store`] with etcd's model — one revision counter, every key's history
//! (reads at an old revision), compaction, compare-and-swap writes, watches from a revision —
//! so that the REST logic in rest.rs is unit-tested without etcd. Test-only: the server runs
//! on etcd ([`crate::storage::Storage`], with its own integration tests).

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde_json::Value;
use tokio::sync::broadcast;

use crate::storage::{Change, Changes, RawKv, RawPage, StorageError, Store, StoreFuture, Stored};

/// One version of a key: the revision that wrote it and its value (`None`: deleted there).
type Version = (i64, Option<Vec<u8>>);

#[derive(Debug, Default)]
struct Inner {
    revision: i64,
    compacted: i64,
    /// Per key, its versions in revision order (`None`: deleted at that revision).
    versions: BTreeMap<String, Vec<Version>>,
    /// Every change, in revision order, for watches that start in the past.
    history: Vec<(String, Change)>,
}

/// The store. Writes hold one lock, as etcd serialises them.
#[derive(Debug)]
pub struct MemStore {
    inner: Mutex<Inner>,
    events: broadcast::Sender<(String, Change)>,
    /// Ends every open watch with an error ([`MemStore::break_watches`]).
    breaks: broadcast::Sender<()>,
}

impl Default for MemStore {
    fn default() -> Self {
        Self {
            inner: Mutex::default(),
            events: broadcast::channel(4096).0,
            breaks: broadcast::channel(1).0,
        }
    }
}

impl MemStore {
    /// Ends every open watch with an error, as a broken connection to an etcd member does.
    pub fn break_watches(&self) {
        let _ = self.breaks.send(());
    }
}

fn decode(key: &str, bytes: &[u8], revision: i64) -> Result<Stored, StorageError> {
    Ok(Stored {
        key: key.to_string(),
        value: serde_json::from_slice(bytes).map_err(|source| StorageError::Corrupt {
            key: key.into(),
            source,
        })?,
        revision,
    })
}

fn encode(key: &str, value: &Value) -> Result<Vec<u8>, StorageError> {
    serde_json::to_vec(value).map_err(|source| StorageError::Corrupt {
        key: key.into(),
        source,
    })
}

impl Inner {
    /// The live version of `key` at `revision`.
    fn at(&self, key: &str, revision: i64) -> Option<(i64, &Vec<u8>)> {
        let (rev, value) = self
            .versions
            .get(key)?
            .iter()
            .rev()
            .find(|(r, _)| *r <= revision)?;
        value.as_ref().map(|v| (*rev, v))
    }

    fn latest(&self, key: &str) -> Option<(i64, &Vec<u8>)> {
        self.at(key, self.revision)
    }

    fn put(&mut self, key: &str, value: Vec<u8>) -> Result<(i64, Change), StorageError> {
        let prev = self
            .latest(key)
            .map(|(r, v)| decode(key, v, r))
            .transpose()?;
        self.revision += 1;
        let new = decode(key, &value, self.revision)?;
        self.versions
            .entry(key.to_string())
            .or_default()
            .push((self.revision, Some(value)));
        let change = Change::Put { new, prev };
        self.history.push((key.to_string(), change.clone()));
        Ok((self.revision, change))
    }
}

impl MemStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Writes under the lock, then tells the watches.
    fn write(
        &self,
        f: impl FnOnce(&mut Inner) -> Result<Option<(i64, Change, String)>, StorageError>,
    ) -> Result<Option<i64>, StorageError> {
        let mut inner = self.lock();
        let done = f(&mut inner)?;
        Ok(done.map(|(rev, change, key)| {
            let _ = self.events.send((key, change));
            rev
        }))
    }
}

fn change_revision(c: &Change) -> Option<i64> {
    match c {
        Change::Put { new, .. } => Some(new.revision),
        Change::Delete { revision, .. } => Some(*revision),
        Change::Progress(_) => None,
    }
}

impl Store for MemStore {
    fn current_revision(&self) -> StoreFuture<'_, i64> {
        let rev = self.lock().revision;
        Box::pin(async move { Ok(rev) })
    }

    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Stored>> {
        let got = {
            let inner = self.lock();
            inner
                .latest(key)
                .map(|(r, v)| decode(key, v, r))
                .transpose()
        };
        Box::pin(async move { got })
    }

    fn list_raw<'a>(
        &'a self,
        prefix: &'a str,
        start: &'a str,
        revision: i64,
        limit: i64,
    ) -> StoreFuture<'a, RawPage> {
        let page = (|| {
            let inner = self.lock();
            if revision > inner.revision {
                return Err(StorageError::FutureRevision(revision));
            }
            if revision > 0 && revision < inner.compacted {
                return Err(StorageError::Compacted(inner.compacted));
            }
            let at = if revision > 0 {
                revision
            } else {
                inner.revision
            };
            let from = if start.is_empty() { prefix } else { start };
            let all: Vec<RawKv> = inner
                .versions
                .range(from.to_string()..)
                .take_while(|(k, _)| k.starts_with(prefix))
                .filter_map(|(k, _)| {
                    inner.at(k, at).map(|(r, v)| RawKv {
                        key: k.as_bytes().to_vec(),
                        value: v.clone(),
                        mod_revision: r,
                    })
                })
                .collect();
            let total = all.len() as i64;
            let kvs: Vec<RawKv> = if limit > 0 {
                all.into_iter().take(limit as usize).collect()
            } else {
                all
            };
            let n = kvs.len() as i64;
            Ok(RawPage {
                kvs,
                revision: at,
                more: n < total,
                remaining: total - n,
            })
        })();
        Box::pin(async move { page })
    }

    fn create<'a>(&'a self, key: &'a str, value: &'a Value) -> StoreFuture<'a, Option<i64>> {
        let r = self.write(|inner| {
            if inner.latest(key).is_some() {
                return Ok(None);
            }
            let (rev, change) = inner.put(key, encode(key, value)?)?;
            Ok(Some((rev, change, key.to_string())))
        });
        Box::pin(async move { r })
    }

    fn update<'a>(
        &'a self,
        key: &'a str,
        value: &'a Value,
        expected: i64,
    ) -> StoreFuture<'a, Option<i64>> {
        let r = self.write(|inner| {
            // etcd compares mod_revision; an absent key has 0.
            let current = inner.latest(key).map_or(0, |(r, _)| r);
            if current != expected {
                return Ok(None);
            }
            let (rev, change) = inner.put(key, encode(key, value)?)?;
            Ok(Some((rev, change, key.to_string())))
        });
        Box::pin(async move { r })
    }

    fn delete<'a>(&'a self, key: &'a str, expected: i64) -> StoreFuture<'a, Option<i64>> {
        let r = self.write(|inner| {
            let Some((current, bytes)) = inner.latest(key) else {
                return Ok(None);
            };
            if current != expected {
                return Ok(None);
            }
            let prev = decode(key, bytes, current)?;
            inner.revision += 1;
            let revision = inner.revision;
            inner
                .versions
                .entry(key.to_string())
                .or_default()
                .push((revision, None));
            let change = Change::Delete { prev, revision };
            inner.history.push((key.to_string(), change.clone()));
            Ok(Some((revision, change, key.to_string())))
        });
        Box::pin(async move { r })
    }

    fn compact(&self, revision: i64) -> StoreFuture<'_, ()> {
        let mut inner = self.lock();
        inner.compacted = revision;
        inner
            .history
            .retain(|(_, c)| change_revision(c).is_none_or(|r| r > revision));
        Box::pin(async { Ok(()) })
    }

    /// Its progress follows the events it has sent (like a fixed etcd).
    fn progress_notify_reliable(
        &self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send + '_>> {
        Box::pin(async { true })
    }

    fn watch(
        &self,
        prefix: String,
        start_revision: i64,
        mut progress: tokio::sync::mpsc::Receiver<()>,
    ) -> Changes {
        // Replay and subscription under one lock: no change falls between them.
        let (replay, mut live, compacted, revision_of) = {
            let inner = self.lock();
            let compacted = (start_revision <= inner.compacted).then_some(inner.compacted);
            let replay: Vec<Change> = inner
                .history
                .iter()
                .filter(|(k, c)| {
                    k.starts_with(&prefix)
                        && change_revision(c).is_some_and(|r| r >= start_revision)
                })
                .map(|(_, c)| c.clone())
                .collect();
            (replay, self.events.subscribe(), compacted, inner.revision)
        };
        let mut broken = self.breaks.subscribe();
        Box::pin(async_stream::stream! {
            if let Some(c) = compacted {
                yield Err(StorageError::Compacted(c));
                return;
            }
            let mut seen = start_revision - 1;
            for c in replay {
                seen = change_revision(&c).unwrap_or(seen);
                yield Ok(c);
            }
            let mut last = seen.max(revision_of);
            loop {
                tokio::select! {
                    _ = broken.recv() => {
                        yield Err(StorageError::Cancelled("connection to the member lost".into()));
                        break;
                    }
                    tick = progress.recv() => {
                        if tick.is_none() { break; }
                        yield Ok(Change::Progress(last));
                    }
                    ev = live.recv() => match ev {
                        Ok((key, change)) => {
                            let rev = change_revision(&change).unwrap_or(last);
                            last = last.max(rev);
                            if key.starts_with(&prefix) && rev > seen {
                                yield Ok(change);
                            }
                        }
                        Err(broadcast::error::RecvError::Lagged(_)) => {
                            yield Err(StorageError::Cancelled("watch fell behind".into()));
                            break;
                        }
                        Err(broadcast::error::RecvError::Closed) => break,
                    }
                }
            }
        })
    }
}
