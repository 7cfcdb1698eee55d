//! Prometheus metrics of the controllers.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
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

/// Labels of a VMI phase.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    /// The phase entered.
    pub phase: String,
}

/// KubeVirt's bucket bounds of the phase transition histograms
/// (`PhaseTransitionTimeBuckets`), so dashboards and `histogram_quantile` queries
/// written for KubeVirt give the same quantiles here.
pub const PHASE_TRANSITION_BUCKETS: [f64; 18] = [
    0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 90.0, 120.0, 180.0, 300.0, 600.0,
    1200.0, 1800.0, 3600.0,
];

fn phase_histogram() -> Histogram {
    Histogram::new(PHASE_TRANSITION_BUCKETS)
}

/// The controllers' metrics and their registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    reconciles: Family<ResultLabels, Counter>,
    vmi_actions: Family<ActionLabels, Counter>,
    status_writes: Counter,
    reconcile_duration: Histogram,
    pod_actions: Family<ActionLabels, Counter>,
    vmi_status_writes: Counter,
    phase_transitions: Family<PhaseLabels, Histogram, fn() -> Histogram>,
    /// Failures and fresh lists of the watches of our API.
    pub watches: virt_watch::WatchMetrics,
    /// Running VMIs on an outdated virt-launcher (KubeVirt's metric).
    pub outdated_vmis: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        // No registry-wide prefix: the KubeVirt metric keeps its own name.
        let mut registry = Registry::default();
        let reconciles = Family::<ResultLabels, Counter>::default();
        let vmi_actions = Family::<ActionLabels, Counter>::default();
        let status_writes = Counter::default();
        let reconcile_duration = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        registry.register(
            "virt_controller_vm_reconciles",
            "VirtualMachine reconciles by result",
            reconciles.clone(),
        );
        registry.register(
            "virt_controller_vmi_actions",
            "VMI creations and deletions made for VirtualMachines",
            vmi_actions.clone(),
        );
        registry.register(
            "virt_controller_vm_status_writes",
            "VirtualMachine status writes (one per start is the goal)",
            status_writes.clone(),
        );
        registry.register(
            "virt_controller_vm_reconcile_duration_seconds",
            "Duration of VirtualMachine reconciles",
            reconcile_duration.clone(),
        );
        let pod_actions = Family::<ActionLabels, Counter>::default();
        let vmi_status_writes = Counter::default();
        let phase_transitions =
            Family::<PhaseLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                phase_histogram,
            );
        registry.register(
            "virt_controller_launcher_pod_actions",
            "Launcher pod creations and deletions",
            pod_actions.clone(),
        );
        registry.register(
            "virt_controller_vmi_status_writes",
            "VirtualMachineInstance status writes",
            vmi_status_writes.clone(),
        );
        registry.register(
            "kubevirt_vmi_phase_transition_time_from_creation_seconds",
            "Histogram of VM phase transitions duration from creation time in seconds",
            phase_transitions.clone(),
        );
        let outdated_vmis = Gauge::default();
        registry.register(
            "kubevirt_vmi_number_of_outdated",
            "Indication for the total number of VirtualMachineInstance workloads that are not running within the most up-to-date version of the virt-launcher environment",
            outdated_vmis.clone(),
        );
        let watches = virt_watch::WatchMetrics::default();
        watches.register(registry.sub_registry_with_prefix("virt_controller"));
        Self {
            registry,
            reconciles,
            vmi_actions,
            status_writes,
            reconcile_duration,
            pod_actions,
            vmi_status_writes,
            phase_transitions,
            watches,
            outdated_vmis,
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

    /// Counts a launcher pod create or delete.
    pub fn pod_action(&self, action: &str, ok: bool) {
        self.pod_actions
            .get_or_create(&ActionLabels {
                action: action.to_string(),
                result: if ok { "success" } else { "failure" }.to_string(),
            })
            .inc();
    }

    /// Counts a VMI status write.
    pub fn vmi_status_written(&self) {
        self.vmi_status_writes.inc();
    }

    /// Observes a VMI entering `phase` `seconds` after its creation.
    pub fn vmi_phase_transition(&self, phase: &str, seconds: f64) {
        self.phase_transitions
            .get_or_create(&PhaseLabels {
                phase: phase.to_string(),
            })
            .observe(seconds);
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

    #[test]
    fn phase_transitions_use_kubevirts_name_and_buckets() {
        let m = Metrics::default();
        m.vmi_phase_transition("Scheduled", 1.5);
        m.vmi_phase_transition("Scheduled", 45.0);
        let text = m.encode();
        let name = "kubevirt_vmi_phase_transition_time_from_creation_seconds";
        assert!(text.contains(&format!("# TYPE {name} histogram")), "{text}");
        assert!(
            text.contains(&format!(
                "{name}_bucket{{le=\"1.0\",phase=\"Scheduled\"}} 0"
            )),
            "{text}"
        );
        assert!(text.contains(&format!(
            "{name}_bucket{{le=\"2.0\",phase=\"Scheduled\"}} 1"
        )));
        assert!(text.contains(&format!(
            "{name}_bucket{{le=\"50.0\",phase=\"Scheduled\"}} 2"
        )));
        assert!(text.contains(&format!(
            "{name}_bucket{{le=\"3600.0\",phase=\"Scheduled\"}} 2"
        )));
        assert!(text.contains(&format!("{name}_count{{phase=\"Scheduled\"}} 2")));
        assert!(text.contains(&format!("{name}_sum{{phase=\"Scheduled\"}} 46.5")));
    }
}
