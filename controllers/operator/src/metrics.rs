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

/// The operator's metrics and their registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    reconciles: Family<ResultLabels, Counter>,
    duration: Histogram,
    uninstalls: Counter,
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
        Self {
            registry,
            reconciles,
            duration,
            uninstalls,
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

    /// Text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}
