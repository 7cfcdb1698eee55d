//! The launcher pods the VMI controller decides on: a watch cache (kube-runtime's
//! reflector store, fed by the launcher-pod watch that also triggers reconciles), an
//! index from VMI uid to its pods, and the [`Expectations`] that say when the cache can be
//! trusted for a VMI.
//!
//! Why a cache: a fresh LIST by label per reconcile is served by kube-apiserver from etcd
//! whenever etcd lacks progress requests (etcd < 3.5.13), reading every pod of the
//! namespace, so its cost grows with the pods and 10,000 VMIs saturated kube-apiserver
//! (docs/benchmarks.md, control plane at scale). Why expectations: the cache can lag the
//! controller's own create by the time the watch takes to deliver it; without them a
//! reconcile in that window would see no pod and create a second launcher.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;

use super::render::CREATED_BY_LABEL;
use crate::expectations::{Check, Expectations};
use crate::watch::Readiness;

/// A launcher pod as the cache keeps it: only what the VMI controller's decisions read,
/// deserialized straight from the API's JSON (unknown fields skipped). A `k8s_openapi`
/// `Pod`, however slimmed, still costs ~7 KB: its `PodSpec` is 1.4 KB and each
/// `Container` 2.1 KB inline even when empty (heaptrack, docs/benchmarks.md). Decisions
/// get a `Pod` rebuilt from this ([`CachedPod::to_pod`]) for the one reconcile.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct CachedPod {
    pub metadata: ObjectMeta,
    #[serde(default)]
    spec: CachedSpec,
    #[serde(default)]
    status: Option<PodStatus>,
}

#[derive(Clone, Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct CachedSpec {
    #[serde(default)]
    node_name: Option<String>,
    #[serde(default)]
    containers: Vec<CachedContainer>,
}

#[derive(Clone, Debug, serde::Deserialize)]
struct CachedContainer {
    name: String,
    #[serde(default)]
    image: Option<String>,
}

impl CachedPod {
    /// The pod as decisions read it.
    pub fn to_pod(&self) -> Pod {
        Pod {
            metadata: self.metadata.clone(),
            spec: Some(PodSpec {
                node_name: self.spec.node_name.clone(),
                containers: self
                    .spec
                    .containers
                    .iter()
                    .map(|c| Container {
                        name: c.name.clone(),
                        image: c.image.clone(),
                        ..Container::default()
                    })
                    .collect(),
                ..PodSpec::default()
            }),
            status: self.status.clone(),
        }
    }
}

impl CachedPod {
    /// The VMI uid and node of a Running launcher pod (KubeVirt's `vmi_pod` label of
    /// `kubevirt_vmi_info` names the Running launcher on the VMI's node).
    pub fn running_launcher(&self) -> Option<(&str, &str)> {
        let running = self.status.as_ref()?.phase.as_deref() == Some("Running");
        let node = self.spec.node_name.as_deref()?;
        running.then_some((owner_key(self)?, node))
    }
}

// Pods, at the pods' URL: only the cached form differs.
impl kube::Resource for CachedPod {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        <Pod as kube::Resource>::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        <Pod as kube::Resource>::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        <Pod as kube::Resource>::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        <Pod as kube::Resource>::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The launcher-pod cache of the VMI controller.
#[derive(Debug)]
pub struct LauncherPods {
    store: Store<CachedPod>,
    /// VMI uid → (namespace, name) of its pods in `store`: the store is keyed by pod
    /// name (generated), and scanning 10,000 pods per reconcile would cost as the LIST
    /// did, only in our process.
    index: Mutex<HashMap<String, BTreeSet<(String, String)>>>,
    /// Creates and deletes of ours the cache has not shown yet, per VMI uid.
    pub expectations: Expectations,
    /// Whether the first full list is in (and indexed).
    ready: Readiness,
}

/// The VMI a launcher pod belongs to: its `kubevirt.io/created-by` label (a migration's
/// target pod carries it too).
fn owner_key(pod: &CachedPod) -> Option<&str> {
    pod.labels().get(CREATED_BY_LABEL).map(String::as_str)
}

fn pod_key(pod: &CachedPod) -> (String, String) {
    (pod.namespace().unwrap_or_default(), pod.name_any())
}

impl LauncherPods {
    /// A cache over `store`, which the caller's reflector fills.
    pub fn new(store: Store<CachedPod>, expectations: Expectations) -> Self {
        Self {
            store,
            index: Mutex::new(HashMap::new()),
            expectations,
            ready: Readiness::default(),
        }
    }

    fn index(&self) -> std::sync::MutexGuard<'_, HashMap<String, BTreeSet<(String, String)>>> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes in a watch event the reflector has just applied to the store: the index
    /// first, then the expectations, so that an expectation is only ever satisfied once
    /// the pod that satisfies it can be read.
    pub fn observe(&self, event: &watcher::Event<CachedPod>) {
        match event {
            watcher::Event::Apply(pod) => {
                let Some(key) = owner_key(pod) else { return };
                self.index()
                    .entry(key.to_string())
                    .or_default()
                    .insert(pod_key(pod));
                let uid = pod.uid().unwrap_or_default();
                self.expectations
                    .observe(key, &uid, pod.metadata.deletion_timestamp.is_some());
            }
            watcher::Event::Delete(pod) => {
                let Some(key) = owner_key(pod) else { return };
                {
                    let mut index = self.index();
                    if let Some(set) = index.get_mut(key) {
                        set.remove(&pod_key(pod));
                        if set.is_empty() {
                            index.remove(key);
                        }
                    }
                }
                self.expectations
                    .observe(key, &pod.uid().unwrap_or_default(), true);
            }
            // The store swaps in the new list at InitDone; until then it serves the old.
            watcher::Event::Init | watcher::Event::InitApply(_) => {}
            watcher::Event::InitDone => {
                let mut fresh: HashMap<String, BTreeSet<(String, String)>> = HashMap::new();
                for pod in self.store.state() {
                    if let Some(key) = owner_key(&pod) {
                        fresh
                            .entry(key.to_string())
                            .or_default()
                            .insert(pod_key(&pod));
                    }
                }
                *self.index() = fresh;
                self.expectations.resync(|key| {
                    self.cached_of(key)
                        .iter()
                        .map(|p| {
                            (
                                p.uid().unwrap_or_default(),
                                p.metadata.deletion_timestamp.is_some(),
                            )
                        })
                        .collect()
                });
            }
        }
        self.ready.observe(event);
    }

    /// The cached pods of the VMI with `uid` (its own and migration targets) as decisions
    /// read them: what the LIST by `kubevirt.io/created-by=<uid>` returned, slimmed.
    pub fn pods_of(&self, uid: &str) -> Vec<Pod> {
        self.cached_of(uid).iter().map(|p| p.to_pod()).collect()
    }

    fn cached_of(&self, uid: &str) -> Vec<Arc<CachedPod>> {
        let keys: Vec<(String, String)> = match self.index().get(uid) {
            Some(set) => set.iter().cloned().collect(),
            None => return Vec::new(),
        };
        keys.into_iter()
            .filter_map(|(ns, name)| {
                let mut r = ObjectRef::new(&name);
                if !ns.is_empty() {
                    r = r.within(&ns);
                }
                self.store.get(&r)
            })
            .collect()
    }

    /// Whether the cache can be trusted for the VMI with `uid` now.
    pub fn check(&self, uid: &str) -> Check {
        self.expectations.check(uid, Instant::now())
    }

    /// Whether the first full list is in, waiting up to `timeout` for it (a reconcile
    /// before it would see no pods at all).
    pub async fn wait_until_ready(&self, timeout: std::time::Duration) -> bool {
        self.ready.wait(timeout).await
    }
}

/// Drops from a cached launcher pod everything the VMI controller's decisions
/// ([`super::decide`]) do not read and [`CachedPod`] did not skip already —
/// managedFields, annotations, other labels, the statuses' resources and volume mounts —
/// so the cache costs a fraction of the pods' size (virt-controller's budget is 20 KB per
/// VMI). Kept: the metadata (the created-by and VM-name labels, owner references, uid,
/// timestamps), `spec.nodeName`, the compute container's name and image, and the phase,
/// reason, message, the `DisruptionTarget` and `PodScheduled` conditions and the container
/// states that can change a decision ([`worth_keeping`]). The cache is never written back.
pub fn slim(pod: &mut CachedPod) {
    let meta = &mut pod.metadata;
    meta.managed_fields = None;
    meta.annotations = None;
    // The pod carries its VMI's labels; only these two are read here (the index, and the
    // VMI a pod event reconciles).
    if let Some(labels) = meta.labels.as_mut() {
        labels.retain(|k, _| {
            k == super::render::CREATED_BY_LABEL || k == super::render::VM_NAME_LABEL
        });
    }
    // Only the compute container's image is read.
    pod.spec
        .containers
        .retain(|c| c.name == super::render::COMPUTE_CONTAINER);
    if let Some(status) = pod.status.take() {
        let slim_all = |list: Option<Vec<ContainerStatus>>| {
            list.map(|l| {
                l.into_iter()
                    .filter(worth_keeping)
                    .map(|c| ContainerStatus {
                        name: c.name,
                        state: c.state,
                        ready: c.ready,
                        restart_count: c.restart_count,
                        started: c.started,
                        ..ContainerStatus::default()
                    })
                    .collect()
            })
        };
        pod.status = Some(PodStatus {
            phase: status.phase,
            reason: status.reason,
            message: status.message,
            // Only these two are read (`decide::disruption`, `decide::unschedulable`).
            conditions: status.conditions.map(|l| {
                l.into_iter()
                    .filter(|c| c.type_ == "DisruptionTarget" || c.type_ == "PodScheduled")
                    .collect()
            }),
            container_statuses: slim_all(status.container_statuses),
            init_container_statuses: slim_all(status.init_container_statuses),
            ..PodStatus::default()
        });
    }
}

/// Whether a container's status can change a decision: the compute container's always,
/// another's only while it waits (an image pull problem) or after it failed (an init
/// container's exit); a sidecar running or an image copy done is 1 KiB of nothing.
fn worth_keeping(c: &ContainerStatus) -> bool {
    let state = c.state.as_ref();
    c.name == super::render::COMPUTE_CONTAINER
        || state.is_some_and(|s| s.waiting.is_some())
        || state
            .and_then(|s| s.terminated.as_ref())
            .is_some_and(|t| t.exit_code != 0)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::{Duration, Instant};

    use kube::runtime::reflector;
    use serde_json::json;

    use super::*;

    fn pod(name: &str, uid: &str, vmi_uid: &str, deleting: bool) -> CachedPod {
        let mut p: CachedPod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": uid,
                "labels": {"kubevirt.io": "virt-launcher", "kubevirt.io/created-by": vmi_uid}},
        }))
        .unwrap();
        if deleting {
            p.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::now(),
                ));
        }
        p
    }

    fn cache() -> (LauncherPods, reflector::store::Writer<CachedPod>) {
        let (reader, writer) = reflector::store();
        (
            LauncherPods::new(reader, Expectations::new(Duration::from_secs(300))),
            writer,
        )
    }

    fn apply(
        c: &LauncherPods,
        w: &mut reflector::store::Writer<CachedPod>,
        ev: watcher::Event<CachedPod>,
    ) {
        w.apply_watcher_event(&ev);
        c.observe(&ev);
    }

    fn names(pods: &[Pod]) -> Vec<String> {
        pods.iter().map(|p| p.name_any()).collect()
    }

    #[test]
    fn pods_are_found_by_their_vmi_and_forgotten_when_deleted() {
        let (c, mut w) = cache();
        apply(&c, &mut w, watcher::Event::Init);
        apply(
            &c,
            &mut w,
            watcher::Event::InitApply(pod("a", "ua", "vmi1", false)),
        );
        apply(&c, &mut w, watcher::Event::InitDone);
        assert_eq!(names(&c.pods_of("vmi1")), ["a"]);
        apply(
            &c,
            &mut w,
            watcher::Event::Apply(pod("b", "ub", "vmi1", false)),
        );
        apply(
            &c,
            &mut w,
            watcher::Event::Apply(pod("c", "uc", "vmi2", false)),
        );
        assert_eq!(names(&c.pods_of("vmi1")), ["a", "b"]);
        assert_eq!(names(&c.pods_of("vmi2")), ["c"]);
        apply(
            &c,
            &mut w,
            watcher::Event::Delete(pod("a", "ua", "vmi1", true)),
        );
        assert_eq!(names(&c.pods_of("vmi1")), ["b"]);
        assert!(c.pods_of("vmi3").is_empty());
    }

    #[test]
    fn a_creation_is_satisfied_only_once_its_pod_can_be_read() {
        let (c, mut w) = cache();
        apply(&c, &mut w, watcher::Event::Init);
        apply(&c, &mut w, watcher::Event::InitDone);
        c.expectations.expect_creation("vmi1", Instant::now());
        assert!(matches!(c.check("vmi1"), Check::Pending { .. }));
        apply(
            &c,
            &mut w,
            watcher::Event::Apply(pod("a", "ua", "vmi1", false)),
        );
        assert_eq!(c.check("vmi1"), Check::Satisfied);
        assert_eq!(names(&c.pods_of("vmi1")), ["a"]);
    }

    #[test]
    fn a_deletion_is_satisfied_by_the_deletion_timestamp_or_the_delete() {
        let (c, mut w) = cache();
        apply(
            &c,
            &mut w,
            watcher::Event::Apply(pod("a", "ua", "vmi1", false)),
        );
        apply(
            &c,
            &mut w,
            watcher::Event::Apply(pod("b", "ub", "vmi1", false)),
        );
        c.expectations
            .expect_deletions("vmi1", ["ua", "ub"], Instant::now());
        apply(
            &c,
            &mut w,
            watcher::Event::Apply(pod("a", "ua", "vmi1", true)),
        );
        assert!(matches!(
            c.check("vmi1"),
            Check::Pending { deletions: 1, .. }
        ));
        apply(
            &c,
            &mut w,
            watcher::Event::Delete(pod("b", "ub", "vmi1", true)),
        );
        assert_eq!(c.check("vmi1"), Check::Satisfied);
    }

    #[test]
    fn a_relist_rebuilds_the_index_and_settles_expectations() {
        let (c, mut w) = cache();
        apply(
            &c,
            &mut w,
            watcher::Event::Apply(pod("old", "uo", "vmi1", false)),
        );
        c.expectations.expect_creation("vmi2", Instant::now());
        // The re-list no longer has "old" (its delete was missed) but has vmi2's new pod.
        apply(&c, &mut w, watcher::Event::Init);
        apply(
            &c,
            &mut w,
            watcher::Event::InitApply(pod("new", "un", "vmi2", false)),
        );
        assert!(
            matches!(c.check("vmi2"), Check::Pending { .. }),
            "not before the swap"
        );
        apply(&c, &mut w, watcher::Event::InitDone);
        assert!(c.pods_of("vmi1").is_empty());
        assert_eq!(names(&c.pods_of("vmi2")), ["new"]);
        assert_eq!(c.check("vmi2"), Check::Satisfied);
    }

    #[test]
    fn slim_drops_statuses_no_decision_reads() {
        let mut p: CachedPod = serde_json::from_value(json!({
            "metadata": {"name": "virt-launcher-a-x", "namespace": "ns"},
            "status": {"phase": "Running",
                "initContainerStatuses": [
                    {"name": "virt-bin", "image": "", "imageID": "", "ready": true, "restartCount": 0,
                        "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
                    {"name": "image-0", "image": "", "imageID": "", "ready": false, "restartCount": 0,
                        "state": {"terminated": {"exitCode": 1, "message": "not a regular file"}}},
                    {"name": "image-1", "image": "", "imageID": "", "ready": false, "restartCount": 0,
                        "state": {"waiting": {"reason": "ErrImagePull"}}}],
                "containerStatuses": [
                    {"name": "compute", "image": "", "imageID": "", "ready": false, "restartCount": 0},
                    {"name": "guest-console-log", "image": "", "imageID": "", "ready": true,
                        "restartCount": 0, "state": {"running": {}}}]}
        }))
        .unwrap();
        slim(&mut p);
        let status = p.status.unwrap();
        let names = |l: Option<Vec<ContainerStatus>>| -> Vec<String> {
            l.unwrap_or_default().into_iter().map(|c| c.name).collect()
        };
        assert_eq!(
            names(status.init_container_statuses),
            ["image-0", "image-1"]
        );
        assert_eq!(names(status.container_statuses), ["compute"]);
    }

    #[test]
    fn slim_keeps_what_decisions_read() {
        let mut p: CachedPod = serde_json::from_value(json!({
            "metadata": {"name": "virt-launcher-a-x", "namespace": "ns", "uid": "u",
                "labels": {"kubevirt.io/created-by": "vmi", "vm.kubevirt.io/name": "a",
                    "kubevirt.io": "virt-launcher", "app": "from-the-vmi"},
                "annotations": {"big": "x"},
                "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                    "name": "a", "uid": "vmi", "controller": true}],
                "managedFields": [{"manager": "m"}]},
            "spec": {"nodeName": "n1", "volumes": [{"name": "v", "emptyDir": {}}],
                "containers": [{"name": "compute", "image": "launcher:1", "args": ["--a"],
                    "env": [{"name": "E", "value": "v"}]},
                    {"name": "guest-console-log", "image": "launcher:1"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1", "reason": "r", "message": "m",
                "conditions": [{"type": "Ready", "status": "True"},
                    {"type": "PodScheduled", "status": "True"}],
                "containerStatuses": [{"name": "compute", "image": "launcher:1", "imageID": "sha",
                    "ready": true, "restartCount": 0, "started": true,
                    "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
                    "volumeMounts": [{"name": "v", "mountPath": "/v"}]}]}
        }))
        .unwrap();
        slim(&mut p);
        // Decisions read exactly what they read from a whole pod slimmed the old way.
        assert_eq!(
            serde_json::to_value(p.to_pod()).unwrap(),
            json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "virt-launcher-a-x", "namespace": "ns", "uid": "u",
                    "labels": {"kubevirt.io/created-by": "vmi", "vm.kubevirt.io/name": "a"},
                    "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                        "name": "a", "uid": "vmi", "controller": true}]},
                "spec": {"nodeName": "n1", "containers": [{"name": "compute", "image": "launcher:1"}]},
                "status": {"phase": "Running", "reason": "r", "message": "m",
                    "conditions": [{"type": "PodScheduled", "status": "True"}],
                    "containerStatuses": [{"name": "compute", "image": "", "imageID": "",
                        "ready": true, "restartCount": 0, "started": true,
                        "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}
            })
        );
    }
}
