//! Which running VMIs are on an outdated virt-launcher and what to do about them: a pure
//! function of every VMI, every migration and the configuration.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kubevirt_api::migration::migratable;
use kubevirt_api::{
    VirtualMachineInstance, VirtualMachineInstanceMigration,
    VirtualMachineInstanceMigrationPhase as Phase, VirtualMachineInstancePhase,
};

/// Annotation of a migration created to move a VMI onto the current launcher (KubeVirt's).
pub const WORKLOAD_UPDATE_ANNOTATION: &str = "kubevirt.io/workloadUpdateMigration";
/// `generateName` of those migrations (KubeVirt's).
pub const WORKLOAD_UPDATE_PREFIX: &str = "kubevirt-workload-update-";
/// A VMI whose workload-update migration failed waits this long before the next one.
pub const RETRY_AFTER: Duration = Duration::from_secs(60);

/// `workloadUpdateStrategy` of the KubeVirt resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadUpdateConfig {
    /// `LiveMigrate` is among the methods.
    pub live_migrate: bool,
    /// `Evict` is among the methods.
    pub evict: bool,
    /// VMIs evicted per batch (`batchEvictionSize`).
    pub batch_size: usize,
    /// Time between batches (`batchEvictionInterval`).
    pub batch_interval: Duration,
}

impl Default for WorkloadUpdateConfig {
    /// KubeVirt's: no method (nothing automated), batches of 10 every minute.
    fn default() -> Self {
        Self {
            live_migrate: false,
            evict: false,
            batch_size: 10,
            batch_interval: Duration::from_secs(60),
        }
    }
}

/// An object by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    pub namespace: String,
    pub name: String,
}

fn key_of(meta: &kube::api::ObjectMeta) -> Key {
    Key {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
    }
}

/// KubeVirt's label on a VMI, and on its launcher pod, while the pod runs an outdated
/// launcher image (empty value): how users and alerts select what an update still has to move.
pub const OUTDATED_LAUNCHER_IMAGE_LABEL: &str = "kubevirt.io/outdatedLauncherImage";

fn labelled_outdated(vmi: &VirtualMachineInstance) -> bool {
    vmi.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(OUTDATED_LAUNCHER_IMAGE_LABEL))
}

/// What to do now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Running VMIs on an outdated launcher (the KubeVirt status's
    /// `outdatedVirtualMachineInstanceWorkloads`).
    pub outdated: usize,
    /// VMIs to live-migrate onto the current launcher.
    pub migrate: Vec<Key>,
    /// VMIs whose launcher pod to evict (this batch).
    pub evict: Vec<Key>,
    /// Workload-update migrations no longer needed (their VMI is up to date) that have not
    /// begun to move the guest.
    pub abort: Vec<Key>,
    /// VMIs (and their launcher pods) whose [`OUTDATED_LAUNCHER_IMAGE_LABEL`] is to be set
    /// (`true`) or removed (`false`).
    pub relabel: Vec<(Key, bool)>,
}

fn phase(m: &VirtualMachineInstanceMigration) -> Phase {
    m.status.as_ref().map(|s| s.phase).unwrap_or_default()
}

fn is_update(m: &VirtualMachineInstanceMigration) -> bool {
    m.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(WORKLOAD_UPDATE_ANNOTATION))
}

fn unfinished(m: &VirtualMachineInstanceMigration) -> bool {
    !phase(m).is_final() && m.metadata.deletion_timestamp.is_none()
}

fn failed_at(m: &VirtualMachineInstanceMigration) -> Option<Timestamp> {
    m.status
        .as_ref()?
        .phase_transition_timestamps
        .as_ref()?
        .iter()
        .rev()
        .find(|t| t.phase == Phase::Failed)?
        .phase_transition_timestamp
        .as_ref()
        .map(|t| t.0)
}

/// Whether `vmi` runs on a launcher other than `image` (an empty version is not known yet).
pub fn outdated(vmi: &VirtualMachineInstance, image: &str) -> bool {
    vmi.status
        .as_ref()
        .and_then(|s| s.launcher_container_image_version.as_deref())
        .is_some_and(|v| !v.is_empty() && v != image)
}

/// Whether the VMI says its spec has vCPUs its guest does not (KubeVirt's `HotVCPUChange`).
fn hot_vcpu_change(vmi: &VirtualMachineInstance) -> bool {
    vmi.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter().any(|c| {
                c.type_ == crate::vmi::decide::conditions::HOT_VCPU_CHANGE
                    && c.status == kubevirt_api::ConditionStatus::True
            })
        })
}

/// The plan for this moment. `parallel` is the cluster's migration limit; `batch_due`:
/// the batch interval has passed since the last eviction batch.
pub fn plan(
    vmis: &[Arc<VirtualMachineInstance>],
    migrations: &[Arc<VirtualMachineInstanceMigration>],
    image: &str,
    cfg: &WorkloadUpdateConfig,
    parallel: usize,
    batch_due: bool,
    now: Timestamp,
) -> Plan {
    let mut p = Plan::default();
    let of = |m: &VirtualMachineInstanceMigration, k: &Key| {
        m.metadata.namespace.as_deref() == Some(k.namespace.as_str()) && m.spec.vmi_name == k.name
    };
    let active = migrations.iter().filter(|m| unfinished(m)).count();
    let mut migrate = Vec::new();
    let mut evict = Vec::new();
    for vmi in vmis {
        let Some(status) = vmi.status.as_ref() else {
            continue;
        };
        if status.phase != VirtualMachineInstancePhase::Running
            || vmi.metadata.deletion_timestamp.is_some()
        {
            continue;
        }
        let k = key_of(&vmi.metadata);
        let is_outdated = outdated(vmi, image);
        if is_outdated != labelled_outdated(vmi) {
            p.relabel.push((k.clone(), is_outdated));
        }
        // KubeVirt's workload updater also moves a VMI whose CPUs were hotplugged in its
        // spec to a launcher pod of the new size (HotVCPUChange); such a VMI is not
        // outdated, and only a migration carries the change.
        let hotplug = hot_vcpu_change(vmi);
        if !is_outdated && !hotplug {
            // Up to date (again): a pending update migration has nothing left to do.
            p.abort.extend(
                migrations
                    .iter()
                    .filter(|m| of(m, &k) && is_update(m) && unfinished(m))
                    .filter(|m| {
                        matches!(
                            phase(m),
                            Phase::Unset | Phase::Pending | Phase::Scheduling | Phase::Scheduled
                        )
                    })
                    .map(|m| key_of(&m.metadata)),
            );
            continue;
        }
        if is_outdated {
            p.outdated += 1;
        }
        let busy = migrations.iter().any(|m| of(m, &k) && unfinished(m))
            || status
                .migration_state
                .as_ref()
                .is_some_and(|s| !s.is_finished());
        if busy {
            continue;
        }
        let recently_failed = migrations.iter().any(|m| {
            of(m, &k)
                && is_update(m)
                && failed_at(m)
                    .is_some_and(|t| t.checked_add(RETRY_AFTER).is_ok_and(|until| until > now))
        });
        if cfg.live_migrate && migratable(vmi).is_ok() {
            if !recently_failed {
                migrate.push(k);
            }
        } else if cfg.evict && !hotplug {
            evict.push(k);
        }
    }
    migrate.sort();
    migrate.truncate(parallel.saturating_sub(active));
    p.migrate = migrate;
    if batch_due {
        evict.sort();
        evict.truncate(cfg.batch_size);
        p.evict = evict;
    }
    p
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::{Value, json};

    const NEW: &str = "launcher:v2";

    fn vmi(name: &str, image: &str, extra_status: Value) -> Arc<VirtualMachineInstance> {
        let mut status = json!({"phase": "Running", "nodeName": "n1",
            "launcherContainerImageVersion": image});
        if let (Some(s), Some(e)) = (status.as_object_mut(), extra_status.as_object()) {
            s.extend(e.clone());
        }
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ns"},
                "spec": {"domain": {"devices": {}}},
                "status": status,
            }))
            .unwrap(),
        )
    }

    fn vmim(
        name: &str,
        vmi: &str,
        phase: &str,
        update: bool,
        failed_at: Option<&str>,
    ) -> Arc<VirtualMachineInstanceMigration> {
        let mut status = json!({"phase": phase});
        if let Some(t) = failed_at {
            status["phaseTransitionTimestamps"] =
                json!([{"phase": "Failed", "phaseTransitionTimestamp": t}]);
        }
        let annotations = if update {
            json!({WORKLOAD_UPDATE_ANNOTATION: ""})
        } else {
            json!({})
        };
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ns", "annotations": annotations},
                "spec": {"vmiName": vmi},
                "status": status,
            }))
            .unwrap(),
        )
    }

    fn now() -> Timestamp {
        "2026-12-01T10:00:00Z".parse().unwrap()
    }

    fn cfg(live_migrate: bool, evict: bool) -> WorkloadUpdateConfig {
        WorkloadUpdateConfig {
            live_migrate,
            evict,
            batch_size: 1,
            ..WorkloadUpdateConfig::default()
        }
    }

    fn names(keys: &[Key]) -> Vec<&str> {
        keys.iter().map(|k| k.name.as_str()).collect()
    }

    #[test]
    fn the_outdated_label_follows_the_launcher_image() {
        let labelled = |name: &str, image: &str| {
            let mut v = (*vmi(name, image, json!({}))).clone();
            v.metadata.labels = Some(std::collections::BTreeMap::from([(
                OUTDATED_LAUNCHER_IMAGE_LABEL.to_string(),
                String::new(),
            )]));
            Arc::new(v)
        };
        let vmis = [
            vmi("old", "launcher:v1", json!({})),
            labelled("old-labelled", "launcher:v1"),
            labelled("updated", NEW),
            vmi("current", NEW, json!({})),
        ];
        let p = plan(&vmis, &[], NEW, &cfg(false, false), 5, false, now());
        let relabel: Vec<(&str, bool)> = p
            .relabel
            .iter()
            .map(|(k, on)| (k.name.as_str(), *on))
            .collect();
        assert_eq!(relabel, [("old", true), ("updated", false)]);
    }

    #[test]
    fn outdated_vmis_migrate_within_the_parallel_limit() {
        let vmis = [
            vmi("a", "launcher:v1", json!({})),
            vmi("b", "launcher:v1", json!({})),
            vmi("c", NEW, json!({})),
        ];
        let p = plan(&vmis, &[], NEW, &cfg(true, false), 5, false, now());
        assert_eq!(p.outdated, 2);
        assert_eq!(names(&p.migrate), ["a", "b"]);
        // One slot left: one migration runs already.
        let running = [vmim("m", "c", "Running", false, None)];
        let p = plan(&vmis, &running, NEW, &cfg(true, false), 2, false, now());
        assert_eq!(names(&p.migrate), ["a"]);
    }

    #[test]
    fn a_cpu_hotplug_migrates_a_current_vmi_and_is_never_an_eviction() {
        let hot = json!({"conditions": [{"type": "HotVCPUChange", "status": "True"}]});
        let vmis = vec![vmi("a", "new", hot.clone())];
        let p = plan(&vmis, &[], "new", &cfg(true, true), 5, true, now());
        assert_eq!((p.outdated, names(&p.migrate)), (0, vec!["a"]));
        let p = plan(&vmis, &[], "new", &cfg(false, true), 5, true, now());
        assert!(p.migrate.is_empty() && p.evict.is_empty());
    }

    #[test]
    fn without_a_method_nothing_moves_but_the_count_is_kept() {
        let vmis = [vmi("a", "launcher:v1", json!({}))];
        let p = plan(
            &vmis,
            &[],
            NEW,
            &WorkloadUpdateConfig::default(),
            5,
            true,
            now(),
        );
        assert_eq!((p.outdated, p.migrate.len(), p.evict.len()), (1, 0, 0));
        // An unknown version (not reported yet) is not outdated.
        let p = plan(
            &[vmi("a", "", json!({}))],
            &[],
            NEW,
            &cfg(true, true),
            5,
            true,
            now(),
        );
        assert_eq!(p, Plan::default());
    }

    #[test]
    fn vmis_that_cannot_migrate_are_evicted_in_batches() {
        let stuck = json!({"conditions": [{"type": "LiveMigratable", "status": "False", "reason": "DisksNotLiveMigratable"}]});
        let vmis = [
            vmi("a", "launcher:v1", stuck.clone()),
            vmi("b", "launcher:v1", stuck),
        ];
        let p = plan(&vmis, &[], NEW, &cfg(true, true), 5, true, now());
        assert_eq!((names(&p.migrate), names(&p.evict)), (vec![], vec!["a"]));
        let p = plan(&vmis, &[], NEW, &cfg(true, true), 5, false, now());
        assert!(p.evict.is_empty(), "not before the batch interval");
        let p = plan(&vmis, &[], NEW, &cfg(true, false), 5, true, now());
        assert!(p.evict.is_empty(), "Evict is not among the methods");
    }

    #[test]
    fn a_failed_update_migration_waits_and_a_pending_one_is_aborted_when_no_longer_needed() {
        let vmis = [vmi("a", "launcher:v1", json!({}))];
        let failed = [vmim("m", "a", "Failed", true, Some("2026-12-01T09:59:30Z"))];
        assert!(
            plan(&vmis, &failed, NEW, &cfg(true, false), 5, false, now())
                .migrate
                .is_empty()
        );
        let old = [vmim("m", "a", "Failed", true, Some("2026-12-01T09:50:00Z"))];
        assert_eq!(
            names(&plan(&vmis, &old, NEW, &cfg(true, false), 5, false, now()).migrate),
            ["a"]
        );
        // Back on the current launcher (a roll-back): the pending update migration goes.
        let pending = [vmim("m", "a", "Scheduling", true, None)];
        let p = plan(
            &vmis,
            &pending,
            "launcher:v1",
            &cfg(true, false),
            5,
            false,
            now(),
        );
        assert_eq!(names(&p.abort), ["m"]);
        // A migration moving the guest is left to finish; a user's migration is not ours.
        let moving = [
            vmim("m", "a", "Running", true, None),
            vmim("u", "a", "Pending", false, None),
        ];
        assert!(
            plan(
                &vmis,
                &moving,
                "launcher:v1",
                &cfg(true, false),
                5,
                false,
                now()
            )
            .abort
            .is_empty()
        );
    }
}
