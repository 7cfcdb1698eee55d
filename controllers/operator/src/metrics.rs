//! Prometheus metrics of virt-operator.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
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

/// The operator's metrics and their registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
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
        Self {
            handler_requests,
            registry,
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
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
