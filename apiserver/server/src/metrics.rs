//! Prometheus metrics, named like kube-apiserver's where they mean the same thing.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of a request metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// Kubernetes verb.
    pub verb: String,
    /// Resource plural.
    pub resource: String,
    /// Subresource.
    pub subresource: String,
    /// HTTP code.
    pub code: String,
}

/// Labels of a duration metric (no code, to bound cardinality).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerbLabels {
    /// Kubernetes verb.
    pub verb: String,
    /// Resource plural.
    pub resource: String,
    /// Subresource.
    pub subresource: String,
}

/// Labels of a storage metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StorageLabels {
    /// get, list, create, update, delete.
    pub operation: String,
}

/// Metrics the storage layer records.
#[derive(Debug, Clone)]
pub struct StorageMetrics {
    /// etcd request latency by operation.
    pub latency: Family<StorageLabels, Histogram>,
    /// Writes that reached etcd and succeeded.
    pub writes: Counter,
}

impl StorageMetrics {
    /// Records one etcd request.
    pub fn observe(&self, operation: &str, seconds: f64) {
        self.latency
            .get_or_create(&StorageLabels {
                operation: operation.to_string(),
            })
            .observe(seconds);
    }
}

/// Labels of a read that may be served by the watch cache.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CacheLabels {
    /// `list` or `watch`.
    pub operation: String,
    /// `cache`, or why etcd served it (`not_synced`, `too_old`, `behind`).
    pub served_by: String,
}

/// Labels of a request refused by a limit.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DroppedLabels {
    /// `readOnly`, `mutating` (the in-flight budgets) or `watch` (watches per user).
    pub request_kind: String,
}

/// All metrics of the server.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Requests by verb, resource, subresource, code.
    pub requests: Family<RequestLabels, Counter>,
    /// Latency by verb, resource, subresource.
    pub duration: Family<VerbLabels, Histogram>,
    /// Open watches and streams.
    pub longrunning: Gauge,
    /// Storage metrics (shared with [`crate::storage::Storage`]).
    pub storage: StorageMetrics,
    /// Requests refused with 429 by a limit, by which one (kube-apiserver's
    /// `apiserver_dropped_requests_total`).
    pub dropped: Family<DroppedLabels, Counter>,
    /// Reads the watch cache could serve, by whether it did.
    pub cache_reads: Family<CacheLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let duration = Family::<VerbLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0005, 2.0, 16))
        });
        let longrunning = Gauge::default();
        let storage = StorageMetrics {
            latency: Family::<StorageLabels, Histogram>::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.0002, 2.0, 16))
            }),
            writes: Counter::default(),
        };
        registry.register(
            "apiserver_request",
            "Requests by verb, resource, subresource and code",
            requests.clone(),
        );
        registry.register(
            "apiserver_request_duration_seconds",
            "Request latency by verb, resource and subresource",
            duration.clone(),
        );
        registry.register(
            "apiserver_longrunning_requests",
            "Open watches and streams",
            longrunning.clone(),
        );
        registry.register(
            "apiserver_storage_writes",
            "Successful writes to etcd",
            storage.writes.clone(),
        );
        let dropped = Family::<DroppedLabels, Counter>::default();
        registry.register(
            "apiserver_dropped_requests",
            "Requests refused with 429 by the in-flight budgets (readOnly, mutating) or the watches per user (watch)",
            dropped.clone(),
        );
        registry.register(
            "etcd_request_duration_seconds",
            "etcd request latency by operation",
            storage.latency.clone(),
        );
        let cache_reads = Family::<CacheLabels, Counter>::default();
        registry.register(
            "apiserver_watch_cache_reads",
            "LISTs and watches the watch cache could serve: served_by=cache, or the reason etcd served it",
            cache_reads.clone(),
        );
        Self {
            registry,
            requests,
            duration,
            longrunning,
            storage,
            dropped,
            cache_reads,
        }
    }
}

impl Metrics {
    /// One request refused by the limit of `request_kind` (`readOnly`, `mutating`, `watch`).
    pub fn count_dropped(&self, request_kind: &str) {
        self.dropped
            .get_or_create(&DroppedLabels {
                request_kind: request_kind.to_string(),
            })
            .inc();
    }
    /// Text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Decrements the open-stream gauge when a watch body or a console/vnc relay is dropped.
pub(crate) struct LongRunning(pub(crate) std::sync::Arc<Metrics>);

impl LongRunning {
    /// Counts one more open watch or stream until the result is dropped.
    pub(crate) fn start(metrics: std::sync::Arc<Metrics>) -> Self {
        metrics.longrunning.inc();
        Self(metrics)
    }
}

impl Drop for LongRunning {
    fn drop(&mut self) {
        self.0.longrunning.dec();
    }
}
