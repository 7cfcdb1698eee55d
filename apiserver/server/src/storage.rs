//! etcd storage. Objects are stored as JSON without `metadata.resourceVersion`; an
//! object's resourceVersion is its key's `mod_revision`, a list's is the etcd header
//! revision, so versions are monotonic across objects, lists and watch events.
//! Every write is a compare-and-swap transaction.

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, Txn, TxnOp, WatchOptions,
};
use futures::Stream;
use serde_json::Value;
use thiserror::Error;

mod endpoints;

/// A storage failure.
#[derive(Debug, Error)]
pub enum StorageError {
    /// etcd could not be reached or answered with an error.
    #[error("etcd request failed: {0}")]
    Etcd(#[from] etcd_client::Error),
    /// The requested revision was compacted away.
    #[error("required revision {0} has been compacted")]
    Compacted(i64),
    /// The requested revision is ahead of the store.
    #[error("required revision {0} is a future revision")]
    FutureRevision(i64),
    /// etcd ended a watch.
    #[error("etcd ended the watch: {0}")]
    Cancelled(String),
    /// A stored value is not valid JSON.
    #[error("stored object at {key} is corrupt")]
    Corrupt {
        /// The etcd key.
        key: String,
        /// Decode error.
        #[source]
        source: serde_json::Error,
    },
}

/// An object read from etcd.
#[derive(Debug, Clone)]
pub struct Stored {
    /// Full etcd key.
    pub key: String,
    /// The object, without resourceVersion.
    pub value: Value,
    /// `mod_revision` of the key: the object's resourceVersion.
    pub revision: i64,
}

/// One page of a range read.
#[derive(Debug)]
pub struct Page {
    /// Items in key order.
    pub items: Vec<Stored>,
    /// The revision the page was read at.
    pub revision: i64,
    /// More keys follow in the range.
    pub more: bool,
    /// Number of keys after this page (only meaningful without filtering).
    pub remaining: i64,
}

/// One stored key with its value still encoded.
#[derive(Debug, Clone)]
pub struct RawKv {
    /// Full key.
    pub key: Vec<u8>,
    /// Encoded value (JSON).
    pub value: Vec<u8>,
    /// The key's last modification revision.
    pub mod_revision: i64,
}

/// One page of a range read, still encoded: LIST decodes one item at a time so a
/// large collection never exists as decoded JSON all at once.
#[derive(Debug)]
pub struct RawPage {
    /// Keys and encoded values in key order.
    pub kvs: Vec<RawKv>,
    /// The revision the page was read at.
    pub revision: i64,
    /// More keys follow in the range.
    pub more: bool,
    /// Number of keys after this page (only meaningful without filtering).
    pub remaining: i64,
}

/// Decodes one key-value of a [`RawPage`].
pub fn decode_kv(kv: &RawKv) -> Result<Stored, StorageError> {
    decode(&kv.key, &kv.value, kv.mod_revision)
}

/// A boxed storage operation (the trait is used as `dyn Store`).
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StorageError>> + Send + 'a>>;
/// A watch's changes.
pub type Changes = Pin<Box<dyn Stream<Item = Result<Change, StorageError>> + Send>>;

/// What the REST layer (`rest.rs`) and watches need of a store: revisioned keys, reads at a
/// revision, compare-and-swap writes and a watch from a revision — etcd's model. [`Storage`]
/// is etcd; unit tests of the REST logic use an in-memory one.
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    /// Current revision of the store.
    fn current_revision(&self) -> StoreFuture<'_, i64>;
    /// Reads one key, at the latest revision.
    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Stored>>;
    /// Reads up to `limit` (0: all) keys in `[start, end of prefix)` at `revision` (0 =
    /// latest), values left encoded; `Compacted`/`FutureRevision` for a revision it cannot
    /// serve.
    fn list_raw<'a>(
        &'a self,
        prefix: &'a str,
        start: &'a str,
        revision: i64,
        limit: i64,
    ) -> StoreFuture<'a, RawPage>;
    /// Creates `key` if it does not exist: the new revision, `None` if it exists.
    fn create<'a>(&'a self, key: &'a str, value: &'a Value) -> StoreFuture<'a, Option<i64>>;
    /// Replaces `key` if its mod_revision is still `expected`; `None` on a lost race.
    fn update<'a>(
        &'a self,
        key: &'a str,
        value: &'a Value,
        expected: i64,
    ) -> StoreFuture<'a, Option<i64>>;
    /// Deletes `key` if its mod_revision is still `expected`; `None` on a lost race.
    fn delete<'a>(&'a self, key: &'a str, expected: i64) -> StoreFuture<'a, Option<i64>>;
    /// Forgets the history up to `revision` (reads and watches from before it get
    /// `Compacted`).
    fn compact(&self, revision: i64) -> StoreFuture<'_, ()>;
    /// Every change under `prefix` from `start_revision` (inclusive); ends with
    /// `Err(Compacted)` if that revision is gone. A tick on `progress` asks for a
    /// `Change::Progress` with the store's revision.
    fn watch(
        &self,
        prefix: String,
        start_revision: i64,
        progress: tokio::sync::mpsc::Receiver<()>,
    ) -> Changes;

    /// Whether the store answers (for /readyz).
    fn ping(&self) -> Pin<Box<dyn Future<Output = bool> + Send + '_>> {
        Box::pin(async {
            tokio::time::timeout(Duration::from_secs(2), self.current_revision())
                .await
                .is_ok_and(|r| r.is_ok())
        })
    }

    /// Whether a watch's `Change::Progress(r)` always comes after every change up to `r`
    /// (see [`progress_notify_reliable`]). Unknown stores are not trusted.
    fn progress_notify_reliable(&self) -> Pin<Box<dyn Future<Output = bool> + Send + '_>> {
        Box::pin(async { false })
    }
}

/// Whether etcd `version` sends a watch's progress notifications in order with its events.
/// Before 3.4.31 and 3.5.13 a notification (asked for, or periodic) can overtake events
/// still queued for the watch (etcd-io/etcd#15220, #17507): a watch cache trusting it moves
/// its revision past changes it has not seen, then drops them as already delivered. These
/// are the versions from which kube-apiserver trusts them (it logs "RequestWatchProgress
/// feature is not supported" before). Debian 12's etcd is 3.4.23.
pub fn progress_notify_reliable(version: &str) -> bool {
    let mut parts = version
        .trim()
        .trim_start_matches('v')
        .split(['.', '-', '+'])
        .map(str::parse::<u64>);
    let (Some(Ok(major)), Some(Ok(minor)), Some(Ok(patch))) =
        (parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    match (major, minor) {
        (3, 4) => patch >= 31,
        (3, 5) => patch >= 13,
        (3, m) => m > 5,
        (m, _) => m > 3,
    }
}

/// A change seen by a watch.
#[derive(Debug, Clone)]
pub enum Change {
    /// A key was created or updated; `prev` is the old value, if any.
    Put {
        /// The new state.
        new: Stored,
        /// The previous state.
        prev: Option<Stored>,
    },
    /// A key was deleted; `prev` is the last state and `revision` the deletion's.
    Delete {
        /// The last state.
        prev: Stored,
        /// Revision of the deletion.
        revision: i64,
    },
    /// No change, but the store has reached `revision` (bookmark source).
    Progress(i64),
}

/// Largest gRPC message accepted from etcd. etcd batches up to 1000 revisions into
/// one watch response, each event with its previous value: a watch resuming a few
/// hundred VMI updates back easily exceeds gRPC's 4 MiB default, which tonic reports
/// as an error that used to end the watch with a 500 on every retry.
const MAX_RECEIVE_BYTES: usize = i32::MAX as usize;

/// Handle to etcd. Cheap to clone.
#[derive(Clone)]
pub struct Storage {
    /// Replaced whole when the client certificate is rotated ([`Storage::follow_tls_files`]);
    /// requests and watches already running finish on the connection they started on.
    conn: Arc<std::sync::RwLock<Conn>>,
    metrics: Option<crate::metrics::StorageMetrics>,
}

/// The client in use and the endpoints its balancer holds ([`Storage::balance_endpoints`]).
struct Conn {
    client: Client,
    in_use: BTreeSet<String>,
    /// Counts replacements: endpoint changes made on a client that was replaced meanwhile
    /// are not recorded on its successor.
    generation: u64,
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Storage").finish_non_exhaustive()
    }
}

fn classify(err: etcd_client::Error, revision: i64) -> StorageError {
    let text = err.to_string();
    if text.contains("required revision has been compacted") {
        StorageError::Compacted(revision)
    } else if text.contains("required revision is a future revision") {
        StorageError::FutureRevision(revision)
    } else {
        StorageError::Etcd(err)
    }
}

fn decode(key: &[u8], value: &[u8], revision: i64) -> Result<Stored, StorageError> {
    let key = String::from_utf8_lossy(key).into_owned();
    let value = serde_json::from_slice(value).map_err(|source| StorageError::Corrupt {
        key: key.clone(),
        source,
    })?;
    Ok(Stored {
        key,
        value,
        revision,
    })
}

/// Client TLS towards etcd (PEM).
#[derive(Clone)]
pub struct EtcdTls {
    /// CA that signed etcd's serving certificate.
    pub ca_pem: String,
    /// Client certificate.
    pub cert_pem: String,
    /// Key of the client certificate.
    pub key_pem: String,
}

impl std::fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdTls").finish_non_exhaustive()
    }
}

/// End of the key range covering every key that starts with `prefix`.
pub fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// etcd-client's TLS options for `t`.
fn tls_options(t: &EtcdTls) -> etcd_client::TlsOptions {
    etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(&t.ca_pem))
        .identity(etcd_client::Identity::from_pem(&t.cert_pem, &t.key_pem))
}

impl Storage {
    /// Connects to etcd at `endpoints`.
    pub async fn connect(endpoints: &[String]) -> Result<Self, StorageError> {
        Self::connect_tls(endpoints, None).await
    }

    /// Connects to etcd at `endpoints` (`https://`), verifying its certificate against
    /// `tls.ca_pem` and authenticating with the client certificate. With several endpoints
    /// (the members of a cluster) requests go to those that answer; see
    /// [`Storage::balance_endpoints`].
    pub async fn connect_tls(
        endpoints: &[String],
        tls: Option<&EtcdTls>,
    ) -> Result<Self, StorageError> {
        let conn = Self::dial(endpoints, tls).await?;
        Ok(Self {
            conn: Arc::new(std::sync::RwLock::new(conn)),
            metrics: None,
        })
    }

    /// A client of the endpoints that can serve now (all of them when there is one, or when
    /// none answers): a member that is down from the start never enters the balancer.
    async fn dial(endpoints: &[String], tls: Option<&EtcdTls>) -> Result<Conn, StorageError> {
        let in_use = if endpoints.len() > 1 {
            let (healthy, down) = endpoints::probe_all(endpoints, tls).await;
            for (endpoint, why) in &down {
                tracing::warn!(%endpoint, %why, "etcd member cannot serve; not sending requests to it");
            }
            endpoints::wanted(endpoints, &healthy)
        } else {
            endpoints.iter().cloned().collect()
        };
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(Duration::from_secs(10))
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            // A member that has lost its leader refuses requests at once (and ends its
            // watches) instead of letting them wait for a leader that may be elsewhere: the
            // request goes to another member, the watch is resumed there.
            .with_require_leader(true);
        if let Some(t) = tls {
            opts = opts.with_tls(tls_options(t));
        }
        let list: Vec<&String> = in_use.iter().collect();
        let client = Client::connect(&list, Some(opts)).await?;
        Ok(Conn {
            client,
            in_use,
            generation: 0,
        })
    }

    fn client(&self) -> Client {
        self.conn
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .client
            .clone()
    }

    /// Runs `op` on the KV client, again after a failure another attempt may cure (a member
    /// that went down, an election: [`endpoints::transient`]) or, with `patience`, an attempt
    /// that took longer than that, pausing [`endpoints::RETRY_DELAYS`] between attempts. Also
    /// says whether a failed attempt may have been applied nonetheless (only a write cares:
    /// see [`Storage::cas`]).
    async fn with_retries<T, F, Fut>(
        &self,
        patience: Option<Duration>,
        mut op: F,
    ) -> (Result<T, etcd_client::Error>, bool)
    where
        F: FnMut(etcd_client::KvClient) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut delays = endpoints::RETRY_DELAYS.iter();
        let mut maybe_applied = false;
        loop {
            let attempt = op(self.kv());
            let outcome = match patience {
                Some(p) => tokio::time::timeout(p, attempt).await.map_err(|_| p),
                None => Ok(attempt.await),
            };
            let e = match outcome {
                Ok(Err(e)) if endpoints::transient(&e) => e,
                Ok(other) => return (other, maybe_applied),
                Err(p) => etcd_client::Error::GRpcStatus(tonic::Status::deadline_exceeded(
                    format!("no answer from etcd within {p:?}"),
                )),
            };
            maybe_applied |= !endpoints::not_applied(&e);
            let Some(d) = delays.next() else {
                return (Err(e), maybe_applied);
            };
            tracing::debug!(error = %e, "etcd request failed; sending it again");
            tokio::time::sleep(*d).await;
        }
    }

    /// A read of one key, sent again after a transient failure or when it does not answer
    /// within [`endpoints::ATTEMPT_TIMEOUT`] (a member waiting for a leader that is gone).
    async fn read<T, F, Fut>(&self, op: F) -> Result<T, etcd_client::Error>
    where
        F: FnMut(etcd_client::KvClient) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.with_retries(Some(endpoints::ATTEMPT_TIMEOUT), op)
            .await
            .0
    }

    /// A request that may legitimately take long (a range over a whole collection, a
    /// compaction): sent again after a transient failure only, within the client's own
    /// timeout.
    async fn read_long<T, F, Fut>(&self, op: F) -> Result<T, etcd_client::Error>
    where
        F: FnMut(etcd_client::KvClient) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.with_retries(None, op).await.0
    }

    /// A compare-and-swap write of `key` (`wrote`: the value put, `None` for a delete): the
    /// new revision, `None` when the compare failed. Sent again after a transient failure,
    /// which is safe because a compare-and-swap applies at most once. If an attempt failed in a
    /// way that may have applied it (a timeout, a broken connection, a leader that failed
    /// mid-proposal) and the next attempt's compare fails, the key is read: holding exactly
    /// what was written (or gone, for a delete), the write was this one's. (If another writer
    /// changed the key in the moment between, it counts as a lost race, as it would without
    /// the failure.)
    async fn cas(
        &self,
        key: &str,
        txn: Txn,
        wrote: Option<&Value>,
    ) -> Result<Option<i64>, StorageError> {
        let (resp, maybe_applied) = self
            .with_retries(Some(endpoints::ATTEMPT_TIMEOUT), |mut kv| {
                let txn = txn.clone();
                async move { kv.txn(txn).await }
            })
            .await;
        let resp = resp?;
        if resp.succeeded() {
            return Ok(Some(
                resp.header().map(|h| h.revision()).unwrap_or_default(),
            ));
        }
        if !maybe_applied {
            return Ok(None);
        }
        let now = self.get(key).await?;
        Ok(match (wrote, now) {
            (Some(v), Some(s)) if s.value == *v => {
                tracing::info!(
                    key,
                    revision = s.revision,
                    "etcd write whose answer was lost was applied"
                );
                Some(s.revision)
            }
            (None, None) => {
                tracing::info!(key, "etcd delete whose answer was lost was applied");
                Some(self.current_revision().await?)
            }
            _ => None,
        })
    }

    /// Keeps the client's endpoints to the members that can serve ([`endpoints`]): every
    /// `every`, asks each of `all` for its status and adds or removes endpoints of the client
    /// in use (a client rebuilt by [`Storage::follow_tls_files`] included). Only for more than
    /// one endpoint.
    pub fn balance_endpoints(
        &self,
        all: Vec<String>,
        tls: Option<Arc<virt_certs::reload::Reloading<EtcdTls>>>,
        every: Duration,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> Option<tokio::task::JoinHandle<()>> {
        if all.len() < 2 {
            return None;
        }
        let slot = self.conn.clone();
        Some(tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(every) => {}
                }
                let tls = tls.as_ref().map(|t| t.get());
                let (healthy, down) = endpoints::probe_all(&all, tls.as_deref()).await;
                let wanted = endpoints::wanted(&all, &healthy);
                let (client, in_use, generation) = {
                    let c = slot
                        .read()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    (c.client.clone(), c.in_use.clone(), c.generation)
                };
                let (add, remove) = endpoints::changes(&in_use, &wanted);
                let mut now_in_use = in_use;
                for endpoint in add {
                    match client.add_endpoint(&endpoint).await {
                        Ok(()) => {
                            tracing::info!(%endpoint, "etcd member serves again; sending requests to it");
                            now_in_use.insert(endpoint);
                        }
                        Err(e) => tracing::warn!(%endpoint, error = %e, "adding an etcd endpoint"),
                    }
                }
                for endpoint in remove {
                    let why = down
                        .iter()
                        .find(|(e, _)| *e == endpoint)
                        .map_or("", |(_, w)| w.as_str());
                    match client.remove_endpoint(&endpoint).await {
                        Ok(()) => {
                            tracing::warn!(%endpoint, %why, "etcd member cannot serve; not sending requests to it");
                            now_in_use.remove(&endpoint);
                        }
                        Err(e) => {
                            tracing::warn!(%endpoint, error = %e, "removing an etcd endpoint")
                        }
                    }
                }
                let mut c = slot
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                // Only if the client is still the one changed here (not replaced meanwhile by
                // a certificate rotation, whose client starts from its own probe).
                if c.generation == generation {
                    c.in_use = now_in_use;
                }
            }
        }))
    }

    /// The KV client without gRPC's 4 MiB default receive limit: a LIST page, a
    /// deletecollection's read or a revision's worth of watch events can be larger
    /// (kube-apiserver lifts the limit the same way, to 2 GiB).
    fn kv(&self) -> etcd_client::KvClient {
        self.client()
            .kv_client()
            .max_decoding_message_size(MAX_RECEIVE_BYTES)
    }

    /// Follows the operator's rotation of the etcd client certificate: every `every`, if
    /// the files behind `tls` changed, connects anew with them and uses that connection
    /// for every later request. Without it a connection re-established after etcd restarts
    /// would present the certificate from start-up, expired after a long enough uptime.
    pub fn follow_tls_files(
        &self,
        endpoints: Vec<String>,
        tls: Arc<virt_certs::reload::Reloading<EtcdTls>>,
        every: Duration,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let slot = self.conn.clone();
        tokio::spawn(async move {
            let mut current = tls.get();
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(every) => {}
                }
                let latest = tls.get();
                if let Some(e) = tls.last_error() {
                    tracing::warn!(error = %e, "etcd client certificate files changed but cannot be used; keeping the previous ones");
                }
                if Arc::ptr_eq(&latest, &current) {
                    continue;
                }
                match Self::dial(&endpoints, Some(&latest)).await {
                    Ok(mut conn) => {
                        let mut c = slot
                            .write()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        conn.generation = c.generation + 1;
                        *c = conn;
                        current = latest;
                        tracing::info!("etcd client certificate rotated: new connection in use");
                    }
                    Err(e) => {
                        // Tried again at the next tick: `current` still differs.
                        tracing::warn!(error = %e, "Cannot connect to etcd with the rotated client certificate; keeping the old connection");
                    }
                }
            }
        })
    }

    /// Records etcd latency and writes into `metrics`.
    #[must_use]
    pub fn with_metrics(mut self, metrics: crate::metrics::StorageMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    fn observe(&self, op: &str, start: std::time::Instant, wrote: bool) {
        if let Some(m) = &self.metrics {
            m.observe(op, start.elapsed().as_secs_f64());
            if wrote {
                m.writes.inc();
            }
        }
    }

    /// Current revision of the store (a cheap read of a key that never exists).
    pub async fn current_revision(&self) -> Result<i64, StorageError> {
        let resp = self
            .read(|mut kv| async move { kv.get("\0kubevirt-rs-revision-probe", None).await })
            .await?;
        Ok(resp.header().map(|h| h.revision()).unwrap_or_default())
    }

    /// Reads one key, at the latest revision.
    pub async fn get(&self, key: &str) -> Result<Option<Stored>, StorageError> {
        let start = std::time::Instant::now();
        let resp = self
            .read(|mut kv| async move { kv.get(key, None).await })
            .await?;
        self.observe("get", start, false);
        resp.kvs()
            .first()
            .map(|kv| decode(kv.key(), kv.value(), kv.mod_revision()))
            .transpose()
    }

    /// Reads up to `limit` keys in `[start, end of prefix)` at `revision` (0 = latest).
    pub async fn list(
        &self,
        prefix: &str,
        start: &str,
        revision: i64,
        limit: i64,
    ) -> Result<Page, StorageError> {
        let raw = self.list_raw(prefix, start, revision, limit).await?;
        let items = raw
            .kvs
            .iter()
            .map(decode_kv)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Page {
            items,
            revision: raw.revision,
            more: raw.more,
            remaining: raw.remaining,
        })
    }

    /// As [`Storage::list`], with the values left encoded.
    pub async fn list_raw(
        &self,
        prefix: &str,
        start: &str,
        revision: i64,
        limit: i64,
    ) -> Result<RawPage, StorageError> {
        let mut opts = GetOptions::new().with_range(prefix_end(prefix));
        if revision > 0 {
            opts = opts.with_revision(revision);
        }
        if limit > 0 {
            opts = opts.with_limit(limit);
        }
        let from = if start.is_empty() { prefix } else { start };
        let start = std::time::Instant::now();
        let mut resp = self
            .read_long(|mut kv| {
                let opts = opts.clone();
                async move { kv.get(from, Some(opts)).await }
            })
            .await
            .map_err(|e| classify(e, revision))?;
        self.observe("list", start, false);
        let kvs: Vec<RawKv> = resp
            .take_kvs()
            .into_iter()
            .map(|kv| {
                let mod_revision = kv.mod_revision();
                let (key, value) = kv.into_key_value();
                RawKv {
                    key,
                    value,
                    mod_revision,
                }
            })
            .collect();
        let rev = resp.header().map(|h| h.revision()).unwrap_or(revision);
        let remaining = resp.count() - kvs.len() as i64;
        Ok(RawPage {
            kvs,
            revision: if revision > 0 { revision } else { rev },
            more: resp.more(),
            remaining,
        })
    }

    /// Creates `key` if it does not exist. Returns the new revision, or `None` if it exists.
    pub async fn create(&self, key: &str, value: &Value) -> Result<Option<i64>, StorageError> {
        let bytes = serde_json::to_vec(value).map_err(|source| StorageError::Corrupt {
            key: key.into(),
            source,
        })?;
        let txn = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(key, bytes, None)]);
        let start = std::time::Instant::now();
        let rev = self.cas(key, txn, Some(value)).await?;
        self.observe("create", start, rev.is_some());
        Ok(rev)
    }

    /// Replaces `key` if its mod_revision is still `expected`. `None` on a lost race.
    pub async fn update(
        &self,
        key: &str,
        value: &Value,
        expected: i64,
    ) -> Result<Option<i64>, StorageError> {
        let bytes = serde_json::to_vec(value).map_err(|source| StorageError::Corrupt {
            key: key.into(),
            source,
        })?;
        let txn = Txn::new()
            .when([Compare::mod_revision(key, CompareOp::Equal, expected)])
            .and_then([TxnOp::put(key, bytes, None)]);
        let start = std::time::Instant::now();
        let rev = self.cas(key, txn, Some(value)).await?;
        self.observe("update", start, rev.is_some());
        Ok(rev)
    }

    /// Deletes `key` if its mod_revision is still `expected`. `None` on a lost race.
    pub async fn delete(&self, key: &str, expected: i64) -> Result<Option<i64>, StorageError> {
        let txn = Txn::new()
            .when([Compare::mod_revision(key, CompareOp::Equal, expected)])
            .and_then([TxnOp::delete(key, None)]);
        let start = std::time::Instant::now();
        let rev = self.cas(key, txn, None).await?;
        self.observe("delete", start, rev.is_some());
        Ok(rev)
    }

    /// Compacts history up to `revision` (used by tests and maintenance).
    pub async fn compact(&self, revision: i64) -> Result<(), StorageError> {
        // Compacting twice to one revision changes nothing the first did not.
        self.read_long(|mut kv| async move {
            kv.compact(
                revision,
                Some(etcd_client::CompactionOptions::new().with_physical()),
            )
            .await
        })
        .await?;
        Ok(())
    }

    /// The version of the etcd member that answers (e.g. `3.4.23`).
    pub async fn server_version(&self) -> Result<String, StorageError> {
        let status = self.client().maintenance_client().status().await?;
        Ok(status.version().to_string())
    }

    /// Checks etcd is reachable (for /readyz), within a second: kubelet gives the probe two,
    /// and a probe that times out fails whatever the answer would have been.
    pub async fn ping(&self) -> bool {
        tokio::time::timeout(Duration::from_secs(1), self.current_revision())
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Watches every key under `prefix` from `start_revision` (inclusive). The stream
    /// ends with `Err(Compacted)` if that revision is gone. `progress` asks etcd for a
    /// progress notification whenever it ticks, which yields `Change::Progress`.
    pub fn watch(
        &self,
        prefix: String,
        start_revision: i64,
        mut progress: tokio::sync::mpsc::Receiver<()>,
    ) -> impl Stream<Item = Result<Change, StorageError>> + Send + 'static + use<> {
        let mut client = self
            .client()
            .watch_client()
            .max_decoding_message_size(MAX_RECEIVE_BYTES);
        async_stream::stream! {
            let opts = WatchOptions::new()
                .with_range(prefix_end(&prefix))
                .with_start_revision(start_revision)
                .with_prev_key()
                .with_progress_notify();
            let (mut watcher, mut stream) = match client.watch(prefix.as_bytes().to_vec(), Some(opts)).await {
                Ok(w) => w.split(),
                Err(e) => { yield Err(classify(e, start_revision)); return; }
            };
            loop {
                tokio::select! {
                    tick = progress.recv() => {
                        if tick.is_none() { break; }
                        if let Err(e) = watcher.request_progress().await {
                            yield Err(StorageError::Etcd(e));
                            break;
                        }
                    }
                    msg = stream.message() => {
                        let resp = match msg {
                            Ok(Some(r)) => r,
                            Ok(None) => {
                                tracing::warn!("etcd closed the watch stream");
                                yield Err(StorageError::Cancelled("stream closed".into()));
                                break;
                            }
                            Err(e) => { yield Err(classify(e, start_revision)); break; }
                        };
                        if resp.compact_revision() > 0
                            || (resp.canceled() && resp.cancel_reason().contains("compacted"))
                        {
                            yield Err(StorageError::Compacted(resp.compact_revision()));
                            break;
                        }
                        if resp.canceled() {
                            tracing::warn!(reason = %resp.cancel_reason(), "etcd cancelled the watch");
                            yield Err(StorageError::Cancelled(resp.cancel_reason().to_string()));
                            break;
                        }
                        if resp.events().is_empty() {
                            if let Some(h) = resp.header() && !resp.created() {
                                yield Ok(Change::Progress(h.revision()));
                            }
                            continue;
                        }
                        for ev in resp.events() {
                            let Some(kv) = ev.kv() else { continue };
                            let prev = match ev.prev_kv() {
                                Some(p) => match decode(p.key(), p.value(), p.mod_revision()) {
                                    Ok(s) => Some(s),
                                    Err(e) => { yield Err(e); continue; }
                                },
                                None => None,
                            };
                            match ev.event_type() {
                                EventType::Put => match decode(kv.key(), kv.value(), kv.mod_revision()) {
                                    Ok(new) => yield Ok(Change::Put { new, prev }),
                                    Err(e) => yield Err(e),
                                },
                                EventType::Delete => {
                                    if let Some(prev) = prev {
                                        yield Ok(Change::Delete { prev, revision: kv.mod_revision() });
                                    }
                                }
                            }
                        }
                    }
                }
            }
            drop(watcher);
        }
    }
}

impl Store for Storage {
    fn current_revision(&self) -> StoreFuture<'_, i64> {
        Box::pin(Storage::current_revision(self))
    }

    fn get<'a>(&'a self, key: &'a str) -> StoreFuture<'a, Option<Stored>> {
        Box::pin(Storage::get(self, key))
    }

    fn list_raw<'a>(
        &'a self,
        prefix: &'a str,
        start: &'a str,
        revision: i64,
        limit: i64,
    ) -> StoreFuture<'a, RawPage> {
        Box::pin(Storage::list_raw(self, prefix, start, revision, limit))
    }

    fn create<'a>(&'a self, key: &'a str, value: &'a Value) -> StoreFuture<'a, Option<i64>> {
        Box::pin(Storage::create(self, key, value))
    }

    fn update<'a>(
        &'a self,
        key: &'a str,
        value: &'a Value,
        expected: i64,
    ) -> StoreFuture<'a, Option<i64>> {
        Box::pin(Storage::update(self, key, value, expected))
    }

    fn delete<'a>(&'a self, key: &'a str, expected: i64) -> StoreFuture<'a, Option<i64>> {
        Box::pin(Storage::delete(self, key, expected))
    }

    fn compact(&self, revision: i64) -> StoreFuture<'_, ()> {
        Box::pin(Storage::compact(self, revision))
    }

    fn watch(
        &self,
        prefix: String,
        start_revision: i64,
        progress: tokio::sync::mpsc::Receiver<()>,
    ) -> Changes {
        Box::pin(Storage::watch(self, prefix, start_revision, progress))
    }

    fn ping(&self) -> Pin<Box<dyn Future<Output = bool> + Send + '_>> {
        Box::pin(Storage::ping(self))
    }

    fn progress_notify_reliable(&self) -> Pin<Box<dyn Future<Output = bool> + Send + '_>> {
        Box::pin(async {
            match tokio::time::timeout(Duration::from_secs(5), Storage::server_version(self)).await
            {
                Ok(Ok(v)) => progress_notify_reliable(&v),
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "etcd's version unknown: its progress notifications are not trusted");
                    false
                }
                Err(_) => {
                    tracing::warn!(
                        "etcd's version unknown (no answer in 5 s): its progress notifications are not trusted"
                    );
                    false
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{prefix_end, progress_notify_reliable};

    #[test]
    fn progress_notifications_are_trusted_from_the_fixed_etcd_releases_on() {
        for v in [
            "3.4.31",
            "3.4.37",
            "3.5.13",
            "v3.5.21",
            "3.6.0",
            "3.6.5-rc.0",
            "4.0.0",
        ] {
            assert!(progress_notify_reliable(v), "{v}");
        }
        for v in [
            "3.4.23", "3.4.30", "3.5.0", "3.5.12", "3.3.27", "2.3.8", "", "garbage", "3.5",
        ] {
            assert!(!progress_notify_reliable(v), "{v}");
        }
    }

    #[test]
    fn prefix_end_increments_last_byte() {
        assert_eq!(prefix_end("/a/b/"), b"/a/b0".to_vec());
        assert_eq!(prefix_end("a\u{7f}"), b"a\x80".to_vec());
    }
}
