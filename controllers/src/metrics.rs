//! Prometheus metrics of the controllers: counted as things happen, plus KubeVirt's
//! inventory metrics ([`cluster`]), which the leader computes at each scrape from its
//! watch caches ([`Sources`]): a replica that does not lead exports none of them, so
//! Prometheus never counts a VM twice.

pub mod cluster;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt as _;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt as _;
use kube::runtime::reflector::Store;
use kubevirt_api::eviction::EvictionStrategy;
use kubevirt_api::{VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceMigration};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
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

/// Seconds from `from` to `to`, what the phase-transition histograms observe. Clock skew
/// between writers can make it negative; KubeVirt floors it at 0.
pub fn seconds_between(
    from: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
    to: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> Option<f64> {
    Some(to.0.duration_since(from.0).as_secs_f64().max(0.0))
}

/// KubeVirt's metrics of virt-controller that are counted as things happen (name, help,
/// KubeVirt's type), registered under these names and help texts; the inventory ones are
/// [`cluster::ALL`]. `controllers/tests/kubevirt_metrics.rs` checks both against
/// KubeVirt's metric list.
pub const KUBEVIRT_METRICS: [(&str, &str, &str); 5] = [
    (
        "kubevirt_vmi_phase_transition_time_from_creation_seconds",
        "Histogram of VM phase transitions duration from creation time in seconds.",
        "Histogram",
    ),
    (
        "kubevirt_vmi_migration_phase_transition_time_from_creation_seconds",
        "Histogram of VM migration phase transitions duration from creation time in seconds.",
        "Histogram",
    ),
    (
        "kubevirt_vmi_number_of_outdated",
        "Indication for the total number of VirtualMachineInstance workloads that are not running within the most up-to-date version of the virt-launcher environment.",
        "Gauge",
    ),
    (
        "kubevirt_virt_controller_leading_status",
        "Indication for an operating virt-controller.",
        "Gauge",
    ),
    (
        "kubevirt_virt_controller_ready_status",
        "Indication for a virt-controller that is ready to take the lead.",
        "Gauge",
    ),
];

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
    migration_phase_transitions: Family<PhaseLabels, Histogram, fn() -> Histogram>,
    /// Failures and fresh lists of the watches of our API.
    pub watches: virt_watch::WatchMetrics,
    /// Running VMIs on an outdated virt-launcher (KubeVirt's metric).
    pub outdated_vmis: Gauge,
    /// 1 while this replica leads and its caches are filled (KubeVirt's
    /// `kubevirt_virt_controller_leading_status`).
    pub leading: Gauge,
    /// 1 while this replica takes part in the leader election (KubeVirt's
    /// `kubevirt_virt_controller_ready_status`: ready to take the lead).
    pub ready: Gauge,
    /// The leader's caches the inventory metrics are computed from.
    pub sources: Sources,
}

/// The watch caches of the leader that [`cluster`]'s families are computed from, each
/// set by the controller that owns it when it starts and all cleared when leadership
/// ends ([`Sources::clear`]). Reading them only takes the stores' locks: a scrape never
/// waits on the API.
#[derive(Default)]
pub struct Sources(Mutex<SourceStores>);

#[derive(Default)]
struct SourceStores {
    vmis: Option<(
        Store<VirtualMachineInstance>,
        Arc<crate::watch::Readiness>,
        EvictionStrategy,
    )>,
    vms: Option<Store<VirtualMachine>>,
    pods: Option<Store<crate::vmi::pods::CachedPod>>,
    migrations: Option<Store<VirtualMachineInstanceMigration>>,
    claims: Option<(Store<PersistentVolumeClaim>, Arc<crate::watch::Readiness>)>,
    /// What the launcher pods are rendered with: their memory overhead.
    launcher: Option<Arc<crate::vmi::render::LauncherConfig>>,
}

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("Sources")
            .field("vmis", &s.vmis.is_some())
            .field("vms", &s.vms.is_some())
            .field("pods", &s.pods.is_some())
            .field("migrations", &s.migrations.is_some())
            .finish()
    }
}

impl Sources {
    fn lock(&self) -> std::sync::MutexGuard<'_, SourceStores> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The shared VMI store, usable once `ready`; `eviction_default` is the cluster's
    /// evictionStrategy.
    pub fn set_vmis(
        &self,
        store: Store<VirtualMachineInstance>,
        ready: Arc<crate::watch::Readiness>,
        eviction_default: EvictionStrategy,
    ) {
        self.lock().vmis = Some((store, ready, eviction_default));
    }

    /// The VM controller's store (slimmed: [`crate::vm::slim_vm`] keeps what the
    /// metrics read).
    pub fn set_vms(&self, store: Store<VirtualMachine>) {
        self.lock().vms = Some(store);
    }

    /// The VMI controller's launcher-pod store.
    pub fn set_pods(&self, store: Store<crate::vmi::pods::CachedPod>) {
        self.lock().pods = Some(store);
    }

    /// A store of the migrations (their names by uid).
    pub fn set_migrations(&self, store: Store<VirtualMachineInstanceMigration>) {
        self.lock().migrations = Some(store);
    }

    /// The cluster's claims (`kubevirt_vm_disk_allocated_size_bytes`), usable once `ready`.
    pub fn set_claims(
        &self,
        store: Store<PersistentVolumeClaim>,
        ready: Arc<crate::watch::Readiness>,
    ) {
        self.lock().claims = Some((store, ready));
    }

    /// The launcher configuration (`kubevirt_vmi_launcher_memory_overhead_bytes`).
    pub fn set_launcher(&self, cfg: crate::vmi::render::LauncherConfig) {
        self.lock().launcher = Some(Arc::new(cfg));
    }

    /// Leadership ended: no more inventory metrics from this replica.
    pub fn clear(&self) {
        *self.lock() = SourceStores::default();
    }

    /// The families of this moment; none of a cache that has not had its first list
    /// (it would show a partial inventory).
    pub fn families(&self) -> Vec<cluster::Family> {
        let (vmis, vms, pods, migrations, claims, launcher) = {
            let s = self.lock();
            (
                s.vmis.clone(),
                s.vms.clone(),
                s.pods.clone(),
                s.migrations.clone(),
                s.claims.clone(),
                s.launcher.clone(),
            )
        };
        let mut out = Vec::new();
        if let Some((store, ready, eviction_default)) = vmis
            && ready.is_ready()
        {
            let mut cx = cluster::VmiContext {
                eviction_default: Some(eviction_default),
                ..Default::default()
            };
            for pod in pods.iter().flat_map(Store::state) {
                if let Some((uid, node)) = pod.running_launcher() {
                    cx.launcher_pods
                        .entry(uid.to_string())
                        .or_default()
                        .push((node.to_string(), pod.name_any()));
                }
            }
            for m in migrations.iter().flat_map(Store::state) {
                if let Some(uid) = m.uid() {
                    cx.migrations.insert(uid, m.name_any());
                }
            }
            let vmis = store.state();
            if let Some(cfg) = &launcher {
                for vmi in &vmis {
                    if let (Some(uid), Ok(mib)) = (
                        vmi.metadata.uid.as_ref(),
                        crate::vmi::render::memory_overhead_mib(vmi, cfg),
                    ) {
                        cx.launcher_overhead
                            .insert(uid.clone(), (mib * 1024 * 1024) as f64);
                    }
                }
            }
            out.extend(cluster::vmi_families(&vmis, &cx));
        }
        if let Some(store) = &migrations
            && store
                .wait_until_ready()
                .now_or_never()
                .is_some_and(|r| r.is_ok())
        {
            out.extend(cluster::migration_families(&store.state()));
        }
        if let Some(store) = vms
            && store
                .wait_until_ready()
                .now_or_never()
                .is_some_and(|r| r.is_ok())
        {
            // Without a filled claim cache, no disk series rather than a partial set.
            let claims = claims
                .filter(|(_, ready)| ready.is_ready())
                .map(|(c, _)| c.state())
                .unwrap_or_default();
            out.extend(cluster::vm_families(&store.state(), &claims));
        }
        out
    }
}

/// One scrape's [`cluster`] families, for the encoder.
#[derive(Debug)]
struct ClusterFamilies(Vec<cluster::Family>);

/// A label value in the text format: `\`, `"` and newlines escaped (prometheus_client
/// writes label values as given, and annotations and guest names are free text).
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Collector for ClusterFamilies {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for f in &self.0 {
            // KubeVirt's counters here are timestamps named without `_total`, which
            // client_golang's text format (KubeVirt's /metrics) writes as they are and
            // KubeVirt's recording rules query so: declared a counter, each series is
            // written as a gauge's, which keeps the name (this endpoint is served as the
            // Prometheus text format, where that is valid).
            let kind = match f.desc.kind {
                cluster::Kind::Counter => prometheus_client::metrics::MetricType::Counter,
                cluster::Kind::Gauge => prometheus_client::metrics::MetricType::Gauge,
            };
            let mut m = encoder.encode_descriptor(f.desc.name, f.desc.help, None, kind)?;
            for s in &f.samples {
                let labels: Vec<(&str, String)> = f
                    .desc
                    .labels
                    .iter()
                    .copied()
                    .zip(s.labels.iter().map(|v| escape(v)))
                    .collect();
                ConstGauge::new(s.value).encode(m.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

impl Default for Metrics {
    fn default() -> Self {
        // No registry-wide prefix: the KubeVirt metric keeps its own name.
        let mut registry = Registry::default();
        kube_client_metrics::global().register(&mut registry);
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
        // The registry ends every help text with a period itself: KubeVirt's have theirs.
        let help = |m: (&'static str, &'static str, &str)| m.1.strip_suffix('.').unwrap_or(m.1);
        let [
            phases,
            migration_phases,
            outdated,
            leading_status,
            ready_status,
        ] = KUBEVIRT_METRICS;
        registry.register(phases.0, help(phases), phase_transitions.clone());
        let migration_phase_transitions =
            Family::<PhaseLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                phase_histogram,
            );
        registry.register(
            migration_phases.0,
            help(migration_phases),
            migration_phase_transitions.clone(),
        );
        let outdated_vmis = Gauge::default();
        registry.register(outdated.0, help(outdated), outdated_vmis.clone());
        let leading = Gauge::default();
        registry.register(leading_status.0, help(leading_status), leading.clone());
        let ready = Gauge::default();
        registry.register(ready_status.0, help(ready_status), ready.clone());
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
            migration_phase_transitions,
            watches,
            outdated_vmis,
            leading,
            ready,
            sources: Sources::default(),
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

    /// Observes a migration entering `phase` `seconds` after its creation.
    pub fn migration_phase_transition(&self, phase: &str, seconds: f64) {
        self.migration_phase_transitions
            .get_or_create(&PhaseLabels {
                phase: phase.to_string(),
            })
            .observe(seconds);
    }

    /// The text exposition format: the registry's metrics, then the leader's inventory
    /// ([`Sources::families`], a registry of this scrape only).
    pub fn encode(&self) -> String {
        use prometheus_client::encoding::text::{encode_eof, encode_registry};
        let mut scrape = Registry::default();
        scrape.register_collector(Box::new(ClusterFamilies(self.sources.families())));
        let mut out = String::new();
        let encoded = encode_registry(&mut out, &self.registry)
            .and_then(|()| encode_registry(&mut out, &scrape))
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

    fn store<K>(objs: Vec<K>) -> (Store<K>, Arc<crate::watch::Readiness>)
    where
        K: kube::Resource<DynamicType = ()> + Clone + 'static,
    {
        use kube::runtime::watcher::Event;
        let (reader, mut writer) = kube::runtime::reflector::store();
        let ready = Arc::new(crate::watch::Readiness::default());
        for e in [Event::Init]
            .into_iter()
            .chain(objs.into_iter().map(Event::InitApply))
            .chain([Event::InitDone])
        {
            writer.apply_watcher_event(&e);
            ready.observe(&e);
        }
        (reader, ready)
    }

    /// Only a replica with the leader's caches exports the inventory; the counters of
    /// KubeVirt keep their names (no `_total`); label values are escaped.
    #[test]
    fn the_inventory_is_the_leaders_only() {
        let m = Metrics::default();
        let text = m.encode();
        assert!(!text.contains("kubevirt_vm_info"), "{text}");
        assert!(!text.contains("kubevirt_vmi_info"), "{text}");
        assert!(
            text.contains("kubevirt_virt_controller_leading_status 0"),
            "{text}"
        );
        assert!(text.contains("kubevirt_virt_controller_ready_status 0"));
        // KubeVirt's help texts, each with its one final period.
        for (name, help, _) in KUBEVIRT_METRICS {
            assert!(
                text.contains(&format!("# HELP {name} {help}\n")),
                "{name}: {text}"
            );
        }
        assert!(text.ends_with("# EOF\n"));

        let vm: VirtualMachine = serde_json::from_value(serde_json::json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "vm1", "namespace": "ns",
                "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"template": {"metadata": {"annotations": {"vm.kubevirt.io/os": "a\"b"}},
                "spec": {"domain": {}}}},
            "status": {"printableStatus": "Running", "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:01:00Z"}]},
        }))
        .unwrap();
        let vmi: VirtualMachineInstance = serde_json::from_value(serde_json::json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "vm1", "namespace": "ns", "uid": "u1"},
            "spec": {"domain": {}}, "status": {"phase": "Running", "nodeName": "n1"},
        }))
        .unwrap();
        let (vms, _) = store(vec![vm]);
        let (vmis, ready) = store(vec![vmi]);
        m.sources.set_vms(vms);
        m.sources
            .set_vmis(vmis, ready, EvictionStrategy::LiveMigrate);
        m.leading.set(1);
        let text = m.encode();
        let name = "kubevirt_vm_running_status_last_transition_timestamp_seconds";
        assert!(text.contains(&format!("# TYPE {name} counter\n")), "{text}");
        assert!(
            text.contains(&format!(
                "{name}{{name=\"vm1\",namespace=\"ns\"}} 1767225660"
            )),
            "{text}"
        );
        assert!(!text.contains(&format!("{name}_total")));
        assert!(text.contains(&format!(
            "# HELP {name} Virtual Machine last transition timestamp to running status.\n"
        )));
        assert!(text.contains("os=\"a\\\"b\""), "{text}");
        assert!(
            text.contains(
                "kubevirt_vmi_non_evictable{node=\"n1\",namespace=\"ns\",name=\"vm1\"} 1"
            )
        );
        assert!(text.contains("kubevirt_virt_controller_leading_status 1"));
        assert!(text.ends_with("# EOF\n"));

        m.sources.clear();
        assert!(!m.encode().contains("kubevirt_vmi_info"));
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
