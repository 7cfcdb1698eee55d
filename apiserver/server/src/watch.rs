//! WATCH: one etcd watch per request, converted to Kubernetes watch events with
//! selector transitions, bookmarks, WatchList initial events, timeouts and 410s.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::stream::BoxStream;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::cache::{Cacher, Item, Miss, Subscription};
use crate::error::{ApiError, ApiResult};
use crate::kinds::ResourceDef;
use crate::objects;
use crate::rest::{CACHE_WAIT, ListOptions, Registry};
use crate::storage::{Change, StorageError};

/// The longest a watch runs before the server ends it (the client re-watches from its
/// last resourceVersion).
pub const MAX_WATCH_TIMEOUT: Duration = Duration::from_secs(3600);

/// Parameters of a watch.
#[derive(Debug, Clone, Default)]
pub struct WatchParams {
    /// Selectors (limit/continue unused).
    pub list: ListOptions,
    /// `sendInitialEvents`.
    pub send_initial_events: Option<bool>,
    /// `allowWatchBookmarks`.
    pub allow_bookmarks: bool,
    /// `timeoutSeconds`.
    pub timeout: Option<Duration>,
    /// How often to send bookmarks.
    pub bookmark_interval: Duration,
    /// The client takes plain JSON objects: events from the cache may come as their
    /// encoded line ([`Event::encoded`]), shared by every such watcher.
    pub encoded_lines: bool,
}

/// A watch event ready for encoding: type and object (already with resourceVersion).
#[derive(Debug, Clone)]
pub struct Event {
    /// The whole line of a JSON watch stream, already encoded (then `object` is null):
    /// only for watchers with [`WatchParams::encoded_lines`].
    pub encoded: Option<bytes::Bytes>,
    /// ADDED, MODIFIED, DELETED, BOOKMARK, ERROR.
    pub type_: &'static str,
    /// The object (a Status for ERROR).
    pub object: Value,
}

fn invalid(msg: &str) -> ApiError {
    ApiError::invalid(
        "ListOptions",
        "meta.k8s.io",
        "",
        &[kubevirt_api::validation::FieldError {
            kind: kubevirt_api::validation::ErrorType::Forbidden,
            field: msg.split(':').next().unwrap_or("").to_string(),
            message: msg.split_once(": ").map(|x| x.1).unwrap_or(msg).to_string(),
        }],
    )
}

/// Validates watch parameters (R8.7.3).
pub fn validate(p: &WatchParams) -> ApiResult<()> {
    let m = p
        .list
        .resource_version_match
        .as_deref()
        .filter(|s| !s.is_empty());
    match (p.send_initial_events, m) {
        (Some(_), None) => Err(invalid(
            "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
        )),
        (None, Some(_)) => Err(invalid(
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
        )),
        (Some(_), Some(other)) if other != "NotOlderThan" => Err(ApiError::invalid(
            "ListOptions",
            "meta.k8s.io",
            "",
            &[kubevirt_api::validation::FieldError::not_supported(
                "resourceVersionMatch",
                other,
                &["NotOlderThan"],
            )],
        )),
        _ if p.list.continue_token.is_some() => Err(invalid(
            "continue: Forbidden: continue is forbidden for watch",
        )),
        _ => Ok(()),
    }
}

fn bookmark(def: &ResourceDef, rv: i64, initial_end: bool) -> Event {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    Event {
        encoded: None,
        type_: "BOOKMARK",
        object: json!({"apiVersion": def.api_version(), "kind": def.kind, "metadata": meta}),
    }
}

fn error_event(e: &ApiError) -> Event {
    Event {
        encoded: None,
        type_: "ERROR",
        object: serde_json::to_value(e.to_status()).unwrap_or_default(),
    }
}

/// Starts a watch. Invalid parameters are returned as `Err` (an HTTP error before any
/// stream); every later failure — a resourceVersion too old or too new for the store,
/// storage errors — ends an established stream with an ERROR event, as kube-apiserver
/// does. Clients depend on that form: kube-runtime's watcher re-lists on an ERROR
/// event with 410 but retries an HTTP 410 at the same resourceVersion forever.
pub async fn watch(
    registry: Registry,
    def: &'static ResourceDef,
    ns: Option<String>,
    params: WatchParams,
    shutdown: CancellationToken,
) -> ApiResult<BoxStream<'static, Event>> {
    validate(&params)?;
    let rv = params
        .list
        .resource_version
        .as_deref()
        .filter(|s| !s.is_empty())
        .map(str::to_string);
    let start_rv: i64 = match rv.as_deref() {
        None | Some("0") => 0,
        Some(r) => r
            .parse()
            .map_err(|_| ApiError::bad_request(format!("invalid resource version: {r:?}")))?,
    };
    match start(
        registry,
        def,
        ns,
        params,
        rv.is_none() || start_rv == 0,
        start_rv,
        shutdown,
    )
    .await
    {
        Ok(events) => Ok(events),
        Err(e) => Ok(futures::stream::once(async move { error_event(&e) }).boxed()),
    }
}

/// A storage change as the watch event a client with these selectors sees (none when the
/// object neither matched before nor matches now), with the change's revision.
fn convert(def: &ResourceDef, opts: &ListOptions, change: Change) -> (i64, Option<Event>) {
    match change {
        Change::Put { new, prev } => {
            let rev = new.revision;
            let new_obj = objects::with_rv(new.value, rev);
            let new_match = Registry::matches(def, opts, &new_obj);
            // The previous state at the new revision: what a client that stops seeing the
            // object must forget (kube-apiserver's rule).
            let prev_obj = prev.map(|p| objects::with_rv(p.value, rev));
            let prev_match = prev_obj.as_ref().map(|o| Registry::matches(def, opts, o));
            let event = match (prev_match, new_match, prev_obj) {
                (None | Some(false), true, _) => Some(Event {
                    encoded: None,
                    type_: "ADDED",
                    object: new_obj,
                }),
                (Some(true), true, _) => Some(Event {
                    encoded: None,
                    type_: "MODIFIED",
                    object: new_obj,
                }),
                (Some(true), false, Some(old)) => Some(Event {
                    encoded: None,
                    type_: "DELETED",
                    object: old,
                }),
                _ => None,
            };
            (rev, event)
        }
        Change::Delete { prev, revision } => {
            let obj = objects::with_rv(prev.value, revision);
            let event = Registry::matches(def, opts, &obj).then_some(Event {
                encoded: None,
                type_: "DELETED",
                object: obj,
            });
            (revision, event)
        }
        Change::Progress(rev) => (rev, None),
    }
}

/// kube-apiserver's default (a random 30–60 min, so watches do not all end at once); a
/// client's own timeoutSeconds is held to the same hour at most, so no watch outlives the
/// point where a cache of its revisions could be relied on.
fn watch_timeout(params: &WatchParams) -> Duration {
    params
        .timeout
        .map(|t| t.min(MAX_WATCH_TIMEOUT))
        .unwrap_or_else(|| Duration::from_secs(1800 + rand::random::<u64>() % 1800))
}

/// Where a watch served by the cache begins: a snapshot (initial events), the events
/// after the client's resourceVersion, or now. `Ok(Err(miss))`: etcd serves it.
async fn subscribe(
    registry: &Registry,
    c: &Cacher,
    prefix: &str,
    params: &WatchParams,
    no_rv: bool,
    start_rv: i64,
) -> ApiResult<Result<Subscription, Miss>> {
    let initial = params.send_initial_events.unwrap_or(no_rv);
    let rv_unset = params
        .list
        .resource_version
        .as_deref()
        .is_none_or(str::is_empty);
    // Without a resourceVersion the watch starts at the latest state: etcd's current
    // revision, which the cache must have reached (kube-apiserver's rule). A cache that
    // cannot wait for it (no trusted progress notifications) serves it only if it is there
    // already; else a plain watch starts at the cache's own latest revision, as
    // kube-apiserver's does, and initial events, a consistent read, come from etcd.
    let want = if rv_unset {
        let current = registry
            .storage()
            .current_revision()
            .await
            .map_err(crate::rest::storage_error)?;
        if !c.trusts_progress() && c.revision().is_none_or(|r| r < current) {
            return Ok(if initial {
                Err(Miss::NoProgress)
            } else {
                c.subscribe_now()
            });
        }
        current
    } else {
        start_rv
    };
    if let Err(miss) = c.wait_for(want, CACHE_WAIT).await {
        return Ok(Err(miss));
    }
    Ok(if initial {
        c.subscribe_snapshot(prefix)
    } else if start_rv > 0 {
        c.subscribe_since(start_rv)
    } else {
        c.subscribe_now()
    })
}

/// A cached change as this watcher's event: none when it was already sent, is outside the
/// watched namespace, or matches the selectors neither before nor after. Moves `last_rv`.
/// Without selectors, a watcher that takes plain JSON gets the line encoded once for all
/// of them (kube-apiserver's cachingObject): a change reaches a thousand watchers with one
/// encoding instead of a thousand copies of the object.
fn deliver(
    def: &ResourceDef,
    opts: &ListOptions,
    encoded_lines: bool,
    prefix: &str,
    last_rv: &mut i64,
    ev: &crate::cache::Event,
) -> Option<Event> {
    if ev.revision <= *last_rv {
        return None;
    }
    *last_rv = ev.revision;
    if !ev.key.starts_with(prefix) {
        return None;
    }
    if encoded_lines && opts.label_selector.is_none() && opts.field_selector.is_none() {
        return ev.json_line(plain_line).map(|line| Event {
            encoded: Some(line),
            type_: "",
            object: Value::Null,
        });
    }
    convert(def, opts, ev.change.clone()).1
}

/// A change as the JSON watch line every watcher without selectors receives (what
/// [`convert`] gives them, encoded); none for progress.
pub(crate) fn plain_line(change: &Change) -> Option<bytes::Bytes> {
    let (type_, object) = match change {
        Change::Put { new, prev } => (
            if prev.is_some() { "MODIFIED" } else { "ADDED" },
            objects::with_rv(new.value.clone(), new.revision),
        ),
        Change::Delete { prev, revision } => {
            ("DELETED", objects::with_rv(prev.value.clone(), *revision))
        }
        Change::Progress(_) => return None,
    };
    let mut line = serde_json::to_vec(&json!({"type": type_, "object": object})).ok()?;
    line.push(b'\n');
    Some(line.into())
}

/// A watch fed by the cache: the snapshot or the replayed events, then live ones, with
/// the same events, bookmarks and timeouts as one fed by etcd.
fn from_cache(
    def: &'static ResourceDef,
    cacher: Arc<Cacher>,
    prefix: String,
    params: WatchParams,
    start_rv: i64,
    sub: Subscription,
    shutdown: CancellationToken,
) -> BoxStream<'static, Event> {
    let timeout = watch_timeout(&params);
    let send_end_bookmark = params.send_initial_events == Some(true) && params.allow_bookmarks;
    let allow_bookmarks = params.allow_bookmarks;
    let encoded_lines = params.encoded_lines;
    let interval = params.bookmark_interval;
    let list_opts = params.list;
    let Subscription {
        replay,
        snapshot,
        revision,
        mut live,
    } = sub;
    async_stream::stream! {
        for (key, raw) in snapshot {
            if !key.starts_with(&prefix) {
                continue;
            }
            match serde_json::from_slice::<Value>(&raw.bytes) {
                Ok(v) => {
                    let obj = objects::with_rv(v, raw.revision);
                    if Registry::matches(def, &list_opts, &obj) {
                        yield Event { encoded: None, type_: "ADDED", object: obj };
                    }
                }
                Err(e) => tracing::warn!(key, error = %e, "Skipping a corrupt cached object"),
            }
        }
        if send_end_bookmark {
            yield bookmark(def, revision, true);
        }
        // The replay holds the events after the client's resourceVersion.
        let mut last_rv = start_rv;
        for ev in replay {
            if let Some(e) = deliver(def, &list_opts, encoded_lines, &prefix, &mut last_rv, &ev) {
                yield e;
            }
        }
        // Every change up to the subscription's revision was in the replay.
        last_rv = last_rv.max(revision);
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut ticker = tokio::time::interval(interval);
        ticker.tick().await;
        loop {
            tokio::select! {
                _ = &mut deadline => break,
                _ = shutdown.cancelled() => break,
                _ = ticker.tick(), if allow_bookmarks => {
                    cacher.request_progress();
                    yield bookmark(def, last_rv, false);
                }
                item = live.recv() => match item {
                    // Ended: the watcher fell behind or the cache is listing again. The
                    // client watches again from its last resourceVersion.
                    None => break,
                    Some(Item::Progress(rev)) => {
                        if rev > last_rv {
                            last_rv = rev;
                            if allow_bookmarks {
                                yield bookmark(def, rev, false);
                            }
                        }
                    }
                    Some(Item::Event(ev)) => {
                        if let Some(e) = deliver(def, &list_opts, encoded_lines, &prefix, &mut last_rv, &ev) {
                            yield e;
                        }
                    }
                }
            }
        }
    }
    .boxed()
}

async fn start(
    registry: Registry,
    def: &'static ResourceDef,
    ns: Option<String>,
    params: WatchParams,
    no_rv: bool,
    start_rv: i64,
    shutdown: CancellationToken,
) -> ApiResult<BoxStream<'static, Event>> {
    if let (Some(cache), Some(c)) = (registry.watch_cache(), registry.cacher(def)) {
        let prefix = registry.collection_prefix(def, ns.as_deref());
        match subscribe(&registry, c, &prefix, &params, no_rv, start_rv).await? {
            Ok(sub) => {
                cache.count("watch", None);
                return Ok(from_cache(
                    def,
                    c.clone(),
                    prefix,
                    params,
                    start_rv,
                    sub,
                    shutdown,
                ));
            }
            Err(miss) => cache.count("watch", Some(miss)),
        }
    }
    let initial = params.send_initial_events.unwrap_or(no_rv);
    let mut initial_items = Vec::new();
    let mut from = start_rv;
    if !initial && start_rv > 0 {
        // An etcd watch from a future revision waits silently until etcd gets there,
        // so a client holding a resourceVersion from before a storage reset (a new,
        // empty etcd) would hear nothing for hours. After kube-apiserver's 3 s grace
        // the client gets 410 Gone, on which every client (client-go, kube-rs)
        // re-lists; a 504 "too large" would make kube-rs retry the same version.
        if let Err(e) = registry.wait_for_revision(start_rv).await {
            if e.code != 504 {
                return Err(e);
            }
            let current = registry.storage().current_revision().await.unwrap_or(0);
            return Err(ApiError::expired(format!(
                "too large resource version: {start_rv}, current: {current} \
                 (this server's storage is older than the version; list again)"
            )));
        }
    }
    if initial {
        // A consistent snapshot at or after `start_rv`, then changes after it.
        if start_rv > 0 {
            registry.wait_for_revision(start_rv).await?;
        }
        let mut opts = params.list.clone();
        opts.resource_version = None;
        opts.resource_version_match = None;
        opts.limit = 0;
        let listed = registry.list(def, ns.as_deref(), &opts).await?;
        from = listed.revision;
        initial_items = listed.items;
    }
    let prefix = registry.collection_prefix(def, ns.as_deref());
    let (tick_tx, tick_rx) = tokio::sync::mpsc::channel(1);
    let changes = registry.storage().watch(prefix, from + 1, tick_rx);
    let timeout = watch_timeout(&params);
    let send_end_bookmark = params.send_initial_events == Some(true) && params.allow_bookmarks;
    let allow_bookmarks = params.allow_bookmarks;
    let interval = params.bookmark_interval;
    let list_opts = params.list;

    Ok(async_stream::stream! {
        for obj in initial_items {
            yield Event { encoded: None, type_: "ADDED", object: obj };
        }
        if send_end_bookmark {
            yield bookmark(def, from, true);
        }
        let mut last_rv = from;
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut ticker = tokio::time::interval(interval);
        ticker.tick().await;
        let mut changes = Box::pin(changes);
        loop {
            tokio::select! {
                _ = &mut deadline => break,
                _ = shutdown.cancelled() => break,
                _ = ticker.tick(), if allow_bookmarks => {
                    // etcd 3.4 has no progress requests; every event up to last_rv has
                    // been delivered, so a bookmark there is always safe. Newer etcds
                    // also answer the progress request with a later revision.
                    let _ = tick_tx.try_send(());
                    yield bookmark(def, last_rv, false);
                }
                next = changes.next() => {
                    let Some(next) = next else { break };
                    match next {
                        Ok(Change::Progress(rev)) => {
                            if allow_bookmarks && rev > last_rv {
                                last_rv = rev;
                                yield bookmark(def, rev, false);
                            }
                        }
                        Ok(change @ (Change::Put { .. } | Change::Delete { .. })) => {
                            let (rev, event) = convert(def, &list_opts, change);
                            last_rv = rev;
                            if let Some(e) = event {
                                yield e;
                            }
                        }
                        Err(StorageError::Compacted(compacted)) => {
                            // The form of kube-apiserver's message, which clients match.
                            yield error_event(&ApiError::expired(format!(
                                "too old resource version: {last_rv} ({compacted})"
                            )));
                            break;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, resource = def.plural, "Watch ended by storage error");
                            yield error_event(&ApiError::internal("watch ended: storage unavailable"));
                            break;
                        }
                    }
                }
            }
        }
    }
    .boxed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_line_is_what_convert_gives_a_watcher_without_selectors() {
        use crate::storage::Stored;
        let def = ResourceDef::by_plural("virtualmachines").unwrap();
        let stored = |name: &str, revision: i64| Stored {
            key: format!("/registry/kubevirt.io/virtualmachines/default/{name}"),
            value: json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                          "metadata": {"name": name, "namespace": "default"}}),
            revision,
        };
        let changes = [
            Change::Put {
                new: stored("a", 5),
                prev: None,
            },
            Change::Put {
                new: stored("a", 6),
                prev: Some(stored("a", 5)),
            },
            Change::Delete {
                prev: stored("a", 6),
                revision: 7,
            },
        ];
        for change in changes {
            let (_, ev) = convert(def, &ListOptions::default(), change.clone());
            let ev = ev.unwrap();
            let mut want =
                serde_json::to_vec(&json!({"type": ev.type_, "object": ev.object})).unwrap();
            want.push(b'\n');
            assert_eq!(plain_line(&change).unwrap(), want);
        }
        assert!(plain_line(&Change::Progress(9)).is_none());
    }

    #[test]
    fn send_initial_events_requires_not_older_than() {
        let p = WatchParams {
            send_initial_events: Some(true),
            ..Default::default()
        };
        assert_eq!(validate(&p).unwrap_err().code, 422);
        let mut p = WatchParams {
            send_initial_events: Some(true),
            ..Default::default()
        };
        p.list.resource_version_match = Some("NotOlderThan".into());
        assert!(validate(&p).is_ok());
        let mut p = WatchParams::default();
        p.list.resource_version_match = Some("Exact".into());
        assert_eq!(validate(&p).unwrap_err().code, 422);
    }
}
