//! Shared state of the controllers: client, event recorder, configuration, back-off.

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::EventType;

use crate::events::Recorder;

use std::collections::HashMap;
use std::sync::Mutex;

use kubevirt_api::migration::VirtualMachineInstanceMigrationPhase as MigrationPhase;
use kubevirt_api::vmi::VirtualMachineInstancePhase;

use crate::backoff::BackoffTable;
use crate::metrics::Metrics;
use crate::vm::decide::BackoffConfig;
use crate::vmi::render::LauncherConfig;

/// Field manager of every write the controllers make.
pub const FIELD_MANAGER: &str = "virt-controller";

/// Concurrent reconciles of each controller unless configured ([`Config::workers`]).
pub const DEFAULT_WORKERS: u16 = 64;

/// Validated controller configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// Concurrent reconciles of each controller (0 = unbounded). A reconcile mostly waits
    /// on the API (its writes, and the reads it still makes), so this bounds throughput, not
    /// CPU: with 4, VMs created at 50/s (`cargo xtask bench scale`) got about 6 VMIs a
    /// second while virt-controller used 10 % of a CPU.
    pub workers: u16,
    /// Crash-loop back-off of VM restarts.
    pub crash_loop: BackoffConfig,
    /// First retry delay after a failed reconcile.
    pub error_backoff_base: Duration,
    /// Longest retry delay after failed reconciles.
    pub error_backoff_max: Duration,
    /// Periodic resync of every VM.
    pub resync: Duration,
    /// Watch only this namespace (all namespaces when None).
    pub namespace: Option<String>,
    /// Launcher pods: image, pull policy, emulation, memory overhead.
    pub launcher: LauncherConfig,
    /// evictionStrategy of VMIs that set none (the KubeVirt resource's default).
    pub eviction_strategy: kubevirt_api::eviction::EvictionStrategy,
    /// workloadUpdateStrategy: how VMIs move onto a new launcher after an upgrade.
    pub workload_update: crate::workload::WorkloadUpdateConfig,
    /// How VMs keep their instance type and preference (the KubeVirt resource's
    /// `configuration.instancetype.referencePolicy`).
    pub reference_policy: kubevirt_api::instancetype::vm::ReferencePolicy,
    /// `vmRolloutStrategy` and `liveUpdateConfiguration`: what of a running VM's changed
    /// template reaches it live.
    pub live_update: crate::vm::live::LiveUpdateConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            workers: DEFAULT_WORKERS,
            crash_loop: BackoffConfig::default(),
            error_backoff_base: Duration::from_millis(500),
            error_backoff_max: Duration::from_secs(300),
            resync: Duration::from_secs(300),
            namespace: None,
            launcher: LauncherConfig::default(),
            eviction_strategy: kubevirt_api::eviction::EvictionStrategy::None,
            workload_update: crate::workload::WorkloadUpdateConfig::default(),
            reference_policy: Default::default(),
            live_update: Default::default(),
        }
    }
}

/// Everything a reconcile needs.
pub struct Context {
    /// Client for our API (kubevirt.io) and, in a cluster, the core API.
    pub client: Client,
    /// Publishes Kubernetes Events; None where no core API exists (the dev apiserver).
    pub recorder: Option<Recorder>,
    /// Configuration.
    pub config: Config,
    /// Per-object back-off of failed reconciles.
    pub backoff: BackoffTable,
    /// Prometheus metrics.
    pub metrics: Metrics,
    /// Last VMI phase seen per VMI uid, to observe each phase transition once.
    pub vmi_phases: PhaseTracker,
    /// The same for migrations.
    pub migration_phases: PhaseTracker<MigrationPhase>,
}

/// A lifecycle phase whose transitions are observed ([`PhaseTracker`]).
pub trait TrackedPhase: Copy + PartialEq {
    /// Nothing follows it.
    fn is_final(self) -> bool;
}

impl TrackedPhase for VirtualMachineInstancePhase {
    fn is_final(self) -> bool {
        VirtualMachineInstancePhase::is_final(self)
    }
}

impl TrackedPhase for MigrationPhase {
    fn is_final(self) -> bool {
        MigrationPhase::is_final(self)
    }
}

/// The phase each VMI (or migration) had when last reconciled. Like KubeVirt's informer
/// update handler, a transition is only counted when it is seen happen: the first sighting
/// (e.g. every VMI after a restart) is recorded, not counted.
#[derive(Debug)]
pub struct PhaseTracker<P = VirtualMachineInstancePhase>(Mutex<HashMap<String, P>>);

impl<P> Default for PhaseTracker<P> {
    fn default() -> Self {
        Self(Mutex::new(HashMap::new()))
    }
}

impl<P: TrackedPhase> PhaseTracker<P> {
    /// Records `phase` for `uid`; true when it differs from a phase seen before.
    /// Final phases are not kept: nothing follows them, and a finished VMI that is
    /// never deleted must not hold an entry forever.
    pub fn changed(&self, uid: &str, phase: P) -> bool {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if phase.is_final() {
            return map.remove(uid).is_some_and(|old| old != phase);
        }
        match map.insert(uid.to_string(), phase) {
            Some(old) => old != phase,
            None => false,
        }
    }

    /// VMIs tracked.
    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// No VMI tracked.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets a VMI that is gone.
    pub fn forget(&self, uid: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(uid);
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("recorder", &self.recorder.is_some())
            .field("config", &self.config)
            .field("backoff", &self.backoff)
            .field("metrics", &self.metrics)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// The `K`s the controllers watch: those of the configured namespace, else all.
    pub fn watched<K>(&self) -> kube::Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        match &self.config.namespace {
            Some(ns) => kube::Api::namespaced(self.client.clone(), ns),
            None => kube::Api::all(self.client.clone()),
        }
    }

    /// A context with the given client, recorder and configuration.
    pub fn new(client: Client, recorder: Option<Recorder>, config: Config) -> Self {
        let backoff = BackoffTable::new(config.error_backoff_base, config.error_backoff_max);
        Self {
            client,
            recorder,
            config,
            backoff,
            metrics: Metrics::default(),
            vmi_phases: PhaseTracker::default(),
            migration_phases: PhaseTracker::default(),
        }
    }

    /// Publishes an Event, best effort: an Event that cannot be written is logged and
    /// never fails the reconcile that produced it.
    pub async fn event(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let Some(recorder) = &self.recorder else {
            return;
        };
        if let Err(err) = recorder
            .publish(regarding, type_, reason, reason, &note)
            .await
        {
            tracing::debug!(error = %err, reason, "could not publish event");
        }
    }
}

#[cfg(test)]
mod tests {
    use kubevirt_api::vmi::VirtualMachineInstancePhase as Phase;

    use super::{Config, DEFAULT_WORKERS, PhaseTracker};

    #[test]
    fn reconciles_run_concurrently_by_default() {
        assert_eq!(Config::default().workers, DEFAULT_WORKERS);
    }

    #[test]
    fn phase_tracker_counts_seen_transitions_and_drops_final_vmis() {
        let t = PhaseTracker::default();
        assert!(
            !t.changed("a", Phase::Running),
            "first sighting is not a transition"
        );
        assert!(!t.changed("a", Phase::Running));
        assert!(t.changed("a", Phase::Failed));
        assert!(t.is_empty(), "final VMIs are forgotten");
        assert!(!t.changed("a", Phase::Failed), "a finished VMI seen again");
        assert!(!t.changed("b", Phase::Pending));
        assert!(t.changed("b", Phase::Scheduling));
        t.forget("b");
        assert!(t.is_empty());
    }
}
