//! Prometheus metrics of virt-operator.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RotationLabels {
    /// `apiserver`, `handler` or `etcd`.
    domain: String,
    /// `leaf` (certificates re-issued from the same CA) or `ca` (a new CA took over).
    what: String,
}

/// KubeVirt's metrics of virt-operator (name, help, KubeVirt's type), registered under
/// these names and help texts; `controllers/tests/kubevirt_metrics.rs` checks them against
/// KubeVirt's metric list. KubeVirt's recording rules (`kubevirt_virt_operator_ready`,
/// `_leading`) and alerts (`NoLeadingVirtOperator`, `NoReadyVirtOperator`,
/// `KubeVirtNoAvailableNodesToRunVMs`) read them.
pub const KUBEVIRT_METRICS: [(&str, &str, &str); 3] = [
    (
        "kubevirt_virt_operator_leading_status",
        "Indication for an operating virt-operator.",
        "Gauge",
    ),
    (
        "kubevirt_virt_operator_ready_status",
        "Indication for a virt-operator that is ready to take the lead.",
        "Gauge",
    ),
    (
        "kubevirt_configuration_emulation_enabled",
        "Indicates whether the Software Emulation is enabled in the configuration.",
        "Gauge",
    ),
];

/// The operator's metrics and their registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// KubeVirt's own names, without this registry's prefix ([`KUBEVIRT_METRICS`]).
    kubevirt: Registry,
    /// 1 while this replica leads.
    pub leading: Gauge,
    /// 1 while this replica takes part in the election (ready to take the lead).
    pub ready: Gauge,
    /// 1 when the KubeVirt resource allows QEMU's software emulation (`useEmulation`);
    /// set by the leader's reconcile.
    pub emulation_enabled: Gauge,
    reconciles: Family<ResultLabels, Counter>,
    duration: Histogram,
    uninstalls: Counter,
    rotations: Family<RotationLabels, Counter>,
    handler_requests: Family<ResultLabels, Counter>,
    /// Failures and fresh lists of the operator's watches.
    pub watches: virt_watch::WatchMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("kubevirt_operator");
        let reconciles = Family::<ResultLabels, Counter>::default();
        let duration = Histogram::new(exponential_buckets(0.005, 2.0, 14));
        let uninstalls = Counter::default();
        registry.register(
            "reconciles",
            "KubeVirt reconciles by result (success or error)",
            reconciles.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time of one KubeVirt reconcile",
            duration.clone(),
        );
        registry.register("uninstalls", "Completed uninstalls", uninstalls.clone());
        let rotations = Family::<RotationLabels, Counter>::default();
        registry.register(
            "certificate_rotations",
            "Certificate rotations by trust domain (apiserver, handler, etcd) and what rotated \
             (leaf: re-issued from the same CA; ca: a new CA signs)",
            rotations.clone(),
        );
        let handler_requests = Family::<ResultLabels, Counter>::default();
        registry.register(
            "handler_certificate_requests",
            "virt-handler certificate signing requests by result (signed, denied, failed)",
            handler_requests.clone(),
        );
        let watches = virt_watch::WatchMetrics::default();
        watches.register(&mut registry);
        let mut kubevirt = Registry::default();
        kube_client_metrics::global().register(&mut kubevirt);
        // The registry ends every help text with a period itself: KubeVirt's have theirs.
        let help = |m: (&'static str, &'static str, &str)| m.1.strip_suffix('.').unwrap_or(m.1);
        let [leading_status, ready_status, emulation] = KUBEVIRT_METRICS;
        let (leading, ready, emulation_enabled) =
            (Gauge::default(), Gauge::default(), Gauge::default());
        kubevirt.register(leading_status.0, help(leading_status), leading.clone());
        kubevirt.register(ready_status.0, help(ready_status), ready.clone());
        kubevirt.register(emulation.0, help(emulation), emulation_enabled.clone());
        Self {
            handler_requests,
            registry,
            kubevirt,
            leading,
            ready,
            emulation_enabled,
            reconciles,
            duration,
            uninstalls,
            rotations,
            watches,
        }
    }
}

impl Metrics {
    pub fn reconcile(&self, result: &str) {
        self.reconciles
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }

    pub fn observe(&self, seconds: f64) {
        self.duration.observe(seconds);
    }

    pub fn uninstalled(&self) {
        self.uninstalls.inc();
    }

    /// One rotation in `domain` of `what` (`leaf` or `ca`).
    pub fn rotated(&self, domain: &str, what: &str) {
        self.rotations
            .get_or_create(&RotationLabels {
                domain: domain.into(),
                what: what.into(),
            })
            .inc();
    }

    /// One virt-handler certificate request handled with `result`.
    pub fn handler_request(&self, result: &str) {
        self.handler_requests
            .get_or_create(&ResultLabels {
                result: result.into(),
            })
            .inc();
    }

    /// Text exposition format.
    pub fn encode(&self) -> String {
        use prometheus_client::encoding::text::{encode_eof, encode_registry};
        let mut out = String::new();
        let encoded = encode_registry(&mut out, &self.registry)
            .and_then(|()| encode_registry(&mut out, &self.kubevirt))
            .and_then(|()| encode_eof(&mut out));
        if encoded.is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubevirts_operator_gauges_keep_their_names() {
        let m = Metrics::default();
        m.leading.set(1);
        m.ready.set(1);
        let text = m.encode();
        assert!(
            text.contains("kubevirt_virt_operator_leading_status 1"),
            "{text}"
        );
        assert!(
            text.contains("kubevirt_virt_operator_ready_status 1"),
            "{text}"
        );
        assert!(
            text.contains("kubevirt_configuration_emulation_enabled 0"),
            "{text}"
        );
        assert!(text.contains("# HELP kubevirt_virt_operator_leading_status Indication for an operating virt-operator.\n"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert_eq!(text.matches("# EOF").count(), 1);
    }

    #[test]
    fn rotations_are_counted_per_domain() {
        let m = Metrics::default();
        m.rotated("handler", "leaf");
        m.rotated("handler", "leaf");
        m.rotated("etcd", "ca");
        let text = m.encode();
        assert!(
            text.contains(
                "kubevirt_operator_certificate_rotations_total{domain=\"handler\",what=\"leaf\"} 2"
            ),
            "{text}"
        );
        assert!(text.contains(
            "kubevirt_operator_certificate_rotations_total{domain=\"etcd\",what=\"ca\"} 1"
        ));
    }
}
