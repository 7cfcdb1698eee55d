//! Prometheus metrics of the controllers.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of a reconcile outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `success` or the error reason.
    pub result: String,
}

/// Labels of a VMI action.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabels {
    /// `create` or `delete`.
    pub action: String,
    /// `success` or `failure`.
    pub result: String,
}

/// The controllers' metrics and their registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    reconciles: Family<ResultLabels, Counter>,
    vmi_actions: Family<ActionLabels, Counter>,
    status_writes: Counter,
    reconcile_duration: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("virt_controller");
        let reconciles = Family::<ResultLabels, Counter>::default();
        let vmi_actions = Family::<ActionLabels, Counter>::default();
        let status_writes = Counter::default();
        let reconcile_duration = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        registry.register(
            "vm_reconciles",
            "VirtualMachine reconciles by result",
            reconciles.clone(),
        );
        registry.register(
            "vmi_actions",
            "VMI creations and deletions made for VirtualMachines",
            vmi_actions.clone(),
        );
        registry.register(
            "vm_status_writes",
            "VirtualMachine status writes (one per start is the goal)",
            status_writes.clone(),
        );
        registry.register(
            "vm_reconcile_duration_seconds",
            "Duration of VirtualMachine reconciles",
            reconcile_duration.clone(),
        );
        Self {
            registry,
            reconciles,
            vmi_actions,
            status_writes,
            reconcile_duration,
        }
    }
}

impl Metrics {
    /// Counts a finished reconcile.
    pub fn reconciled(&self, result: &str, took: Duration) {
        self.reconciles
            .get_or_create(&ResultLabels {
                result: result.to_string(),
            })
            .inc();
        self.reconcile_duration.observe(took.as_secs_f64());
    }

    /// Counts a VMI create or delete.
    pub fn vmi_action(&self, action: &str, ok: bool) {
        self.vmi_actions
            .get_or_create(&ActionLabels {
                action: action.to_string(),
                result: if ok { "success" } else { "failure" }.to_string(),
            })
            .inc();
    }

    /// Counts a status write.
    pub fn status_written(&self) {
        self.status_writes.inc();
    }

    /// The text exposition format.
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
    fn encodes_counters() {
        let m = Metrics::default();
        m.reconciled("success", Duration::from_millis(3));
        m.vmi_action("create", true);
        m.status_written();
        let text = m.encode();
        assert!(
            text.contains("virt_controller_vm_reconciles_total{result=\"success\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "virt_controller_vmi_actions_total{action=\"create\",result=\"success\"} 1"
            )
        );
        assert!(text.contains("virt_controller_vm_status_writes_total 1"));
    }
}
