//! Prometheus metrics, named like kube-apiserver's where they mean the same thing, and
//! KubeVirt's virt-api connection gauges under KubeVirt's names, labels and help texts
//! ([`CONNECTION_METRICS`], checked against KubeVirt's metric list by
//! `controllers/tests/kubevirt_metrics.rs`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::sync::atomic::AtomicU64;

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

/// Labels of KubeVirt's connection gauges (`namespace`, `vmi`, as virt-api's).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConnectionLabels {
    /// Namespace of the VMI (or VM) the stream is to.
    pub namespace: String,
    /// Name in the request: the VMI's, or the VM's for a VM's port-forward (KubeVirt's).
    pub vmi: String,
}

/// The kinds of stream virt-api counts, each its own KubeVirt gauge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Connection {
    /// A serial console (`kubevirt_console_active_connections`).
    Console,
    /// A VNC session (`kubevirt_vnc_active_connections`).
    Vnc,
    /// A port-forward tunnel (`kubevirt_portforward_active_tunnels`).
    PortForward,
}

impl Connection {
    /// The kind of the stream subresource `sub` (`console`, `vnc`, `portforward/22/tcp`).
    pub fn of(sub: &str) -> Option<Self> {
        match sub.split('/').next() {
            Some("console") => Some(Self::Console),
            Some("vnc") => Some(Self::Vnc),
            Some("portforward") => Some(Self::PortForward),
            _ => None,
        }
    }

    /// KubeVirt's name and help text of its gauge.
    pub fn desc(self) -> (&'static str, &'static str) {
        CONNECTION_METRICS[self as usize]
    }
}

/// KubeVirt's connection gauges of virt-api (name, help), in [`Connection`] order; names
/// and help texts are KubeVirt's (`pkg/monitoring/metrics/virt-api/connection_metrics.go`).
pub const CONNECTION_METRICS: [(&str, &str); 3] = [
    (
        "kubevirt_console_active_connections",
        "Amount of active Console connections, broken down by namespace and vmi name.",
    ),
    (
        "kubevirt_vnc_active_connections",
        "Amount of active VNC connections, broken down by namespace and vmi name.",
    ),
    (
        "kubevirt_portforward_active_tunnels",
        "Amount of active portforward tunnels, broken down by namespace and vmi name.",
    ),
];

/// KubeVirt's time of the last console, VNC or port-forward stream to a VMI, set when the
/// stream ends (virt-api sets it in a `defer` of each stream handler).
pub const LAST_CONNECTION_METRIC: (&str, &str) = (
    "kubevirt_vmi_last_api_connection_timestamp_seconds",
    "Virtual Machine Instance last API connection timestamp. Including VNC, console, portforward, SSH and usbredir connections.",
);

/// KubeVirt's count of VirtualMachines created (virt-api's admitter counts each admitted
/// create), by namespace; KubeVirt's recording rule `kubevirt_number_of_vms_created` sums it.
pub const VM_CREATED_METRIC: (&str, &str) = (
    "kubevirt_vm_created_by_pod_total",
    "The total number of VMs created by namespace and virt-api pod, since install.",
);

/// The namespace of a counted object.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NamespaceLabels {
    pub namespace: String,
}

/// All metrics of the server.
#[derive(Debug)]
pub struct Metrics {
    /// VirtualMachines created, by namespace ([`VM_CREATED_METRIC`]).
    pub vms_created: Family<NamespaceLabels, Counter>,
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
    /// Open consoles, VNC sessions and port-forward tunnels, in [`Connection`] order.
    connections: [Family<ConnectionLabels, Gauge>; 3],
    /// When the last stream to each VMI ended ([`LAST_CONNECTION_METRIC`]).
    last_connection: Family<ConnectionLabels, Gauge<f64, AtomicU64>>,
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
        let connections: [Family<ConnectionLabels, Gauge>; 3] = Default::default();
        for ((name, help), family) in CONNECTION_METRICS.iter().zip(&connections) {
            // The registry ends every help text with a period itself: KubeVirt's have theirs.
            let help = help.strip_suffix('.').unwrap_or(help);
            registry.register(*name, help, family.clone());
        }
        let last_connection = Family::<ConnectionLabels, Gauge<f64, AtomicU64>>::default();
        let (name, help) = LAST_CONNECTION_METRIC;
        registry.register(
            name,
            help.strip_suffix('.').unwrap_or(help),
            last_connection.clone(),
        );
        kube_client_metrics::global().register(&mut registry);
        let vms_created = Family::<NamespaceLabels, Counter>::default();
        let (name, help) = VM_CREATED_METRIC;
        registry.register(
            // The registry appends `_total` to a counter's name.
            name.strip_suffix("_total").unwrap_or(name),
            help.strip_suffix('.').unwrap_or(help),
            vms_created.clone(),
        );
        Self {
            vms_created,
            registry,
            requests,
            duration,
            longrunning,
            storage,
            dropped,
            cache_reads,
            connections,
            last_connection,
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

/// One open console, VNC session or port-forward tunnel in KubeVirt's gauge of its kind,
/// until dropped (as virt-api's recorder is decremented when its stream ends).
/// When it ends, the VMI's last-connection time is set.
#[derive(Debug)]
pub struct ActiveConnection {
    open: Gauge,
    last: Family<ConnectionLabels, Gauge<f64, AtomicU64>>,
    labels: ConnectionLabels,
}

impl ActiveConnection {
    /// Counts one more open `kind` stream to `namespace`/`vmi`.
    pub fn start(metrics: &Metrics, kind: Connection, namespace: &str, vmi: &str) -> Self {
        let labels = ConnectionLabels {
            namespace: namespace.to_string(),
            vmi: vmi.to_string(),
        };
        let open = metrics.connections[kind as usize]
            .get_or_create(&labels)
            .clone();
        open.inc();
        Self {
            open,
            last: metrics.last_connection.clone(),
            labels,
        }
    }
}

impl Drop for ActiveConnection {
    fn drop(&mut self) {
        self.open.dec();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        // Created here, not at the start: KubeVirt's series appears once a stream ended.
        self.last.get_or_create(&self.labels).set(now);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_stream_is_counted_under_kubevirts_name_until_dropped() {
        let m = Metrics::default();
        let line = "kubevirt_portforward_active_tunnels{namespace=\"ns\",vmi=\"vm1\"}";
        let kind = Connection::of("portforward/22/tcp").expect("a stream kind");
        let open = ActiveConnection::start(&m, kind, "ns", "vm1");
        let second = ActiveConnection::start(&m, kind, "ns", "vm1");
        assert!(m.encode().contains(&format!("{line} 2")), "{}", m.encode());
        drop(open);
        assert!(m.encode().contains(&format!("{line} 1")));
        drop(second);
        let text = m.encode();
        assert!(text.contains(&format!("{line} 0")), "{text}");
        let (last, help) = LAST_CONNECTION_METRIC;
        assert!(text.contains(&format!("# HELP {last} {help}\n")), "{text}");
        let at: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{last}{{namespace=\"ns\",vmi=\"vm1\"}} ")))
            .expect("the last connection's time")
            .parse()
            .unwrap();
        assert!(at > 1.7e9, "{text}");
        assert!(text.contains("# TYPE kubevirt_console_active_connections gauge"));
        assert!(text.contains("# TYPE kubevirt_vnc_active_connections gauge"));
        for (name, help) in CONNECTION_METRICS {
            assert!(text.contains(&format!("# HELP {name} {help}\n")), "{text}");
        }
        assert_eq!(Connection::of("console"), Some(Connection::Console));
        assert_eq!(Connection::of("vnc"), Some(Connection::Vnc));
        assert_eq!(Connection::of("usbredir"), None);
        assert_eq!(Connection::Vnc.desc().0, "kubevirt_vnc_active_connections");
    }
}
