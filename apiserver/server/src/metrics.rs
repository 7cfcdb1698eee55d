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
    /// Writes that reached etcd.
    pub etcd_writes: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        let duration = Family::<VerbLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0005, 2.0, 16))
        });
        let longrunning = Gauge::default();
        let etcd_writes = Counter::default();
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
            "Writes sent to etcd",
            etcd_writes.clone(),
        );
        Self {
            registry,
            requests,
            duration,
            longrunning,
            etcd_writes,
        }
    }
}

impl Metrics {
    /// Text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
