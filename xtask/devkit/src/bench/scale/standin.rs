//! The benchmark's side of the run: it creates the VMs at a fixed rate, watches their VMIs
//! (as our components watch, through kube-apiserver's aggregator) to time each one's
//! Scheduled and Running, and stands in for virt-handler on the fake nodes. It lives here,
//! never in the product.
//!
//! The stand-in: once virt-controller has seen a VMI's launcher pod Running on its node (VMI
//! `Scheduled` with `status.nodeName`), it writes what virt-handler writes when its launcher
//! reports a running TCG guest — the same pure functions (`virt_handler::status`), one JSON
//! merge patch of `/status` — as the admin user rather than virt-handler's service account.
//! It knows no pod IP, so no `interfaces` are written.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use kubevirt_api::vmi::VirtualMachineInstancePhase as Phase;
use kubevirt_api::{VirtualMachine, VirtualMachineInstance};
use tokio::sync::Semaphore;
use virt_domain::Accel;
use virt_domain::protocol::{DomainState, LauncherStatus};
use virt_handler::status::{Observation, stamp_phase, status_patch, vmi_status};

/// Status writes in flight at once (every node's handler writes on its own).
const REPORTERS: usize = 64;

/// When each VM was created and its VMI first seen Scheduled and Running.
#[derive(Debug, Default)]
pub struct Timeline {
    pub created: HashMap<String, Instant>,
    /// Every VMI seen on the watch (virt-controller created it).
    pub vmis: HashSet<String>,
    pub scheduled: HashMap<String, Instant>,
    pub running: HashMap<String, Instant>,
    /// Creates that failed, with why.
    pub create_errors: Vec<String>,
    /// Status writes of the stand-in that failed (each retried up to 5 times).
    pub report_errors: Vec<String>,
    /// VMIs that reached a final phase (Failed/Succeeded): none should.
    pub final_phase: Vec<String>,
}

impl Timeline {
    /// Create → `seen` of every VM that got there, unsorted.
    pub fn latencies(&self, seen: &HashMap<String, Instant>) -> Vec<Duration> {
        seen.iter()
            .filter_map(|(name, at)| Some(at.saturating_duration_since(*self.created.get(name)?)))
            .collect()
    }

    /// First create → last Running.
    pub fn all_running(&self) -> Option<Duration> {
        let first = self.created.values().min()?;
        let last = self.running.values().max()?;
        Some(last.saturating_duration_since(*first))
    }
}

pub type Shared = Arc<Mutex<Timeline>>;

fn lock(t: &Shared) -> std::sync::MutexGuard<'_, Timeline> {
    t.lock().unwrap_or_else(|e| e.into_inner())
}

/// `vm-00042`.
pub fn vm_name(i: usize) -> String {
    format!("vm-{i:05}")
}

/// Creates `count` VMs in `ns`, one every `1/rate` seconds (a late tick is caught up, so
/// the rate holds on average), each create in flight on its own.
pub async fn create(client: kube::Client, ns: &str, count: usize, rate: f64, t: Shared) {
    let api: Api<VirtualMachine> = Api::namespaced(client, ns);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut inflight = Vec::with_capacity(count);
    for i in 0..count {
        tick.tick().await;
        let name = vm_name(i);
        let vm: VirtualMachine = match serde_json::from_str(&super::super::test_guest_vm(&name, ns))
        {
            Ok(vm) => vm,
            Err(e) => {
                lock(&t).create_errors.push(format!("{name}: {e}"));
                continue;
            }
        };
        let (api, t) = (api.clone(), t.clone());
        lock(&t).created.insert(name.clone(), Instant::now());
        inflight.push(tokio::spawn(async move {
            if let Err(e) = api.create(&PostParams::default(), &vm).await {
                lock(&t).create_errors.push(format!("{name}: {e}"));
            }
        }));
    }
    for h in inflight {
        let _ = h.await;
    }
}

/// Watches the VMIs of `ns` until `stop`: records phases and reports each Scheduled VMI
/// Running as virt-handler would.
pub async fn observe(
    client: kube::Client,
    ns: String,
    t: Shared,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let api: Api<VirtualMachineInstance> = Api::namespaced(client, &ns);
    let events = virt_watch::watch(
        api.clone(),
        watcher::Config::default(),
        "bench-scale-vmis",
        virt_watch::WatchMetrics::default(),
    );
    let mut events = std::pin::pin!(events);
    let permits = Arc::new(Semaphore::new(REPORTERS));
    let mut reported: HashSet<String> = HashSet::new();
    let mut stop = stop;
    loop {
        let ev = tokio::select! {
            ev = events.next() => ev,
            _ = stop.changed() => break,
        };
        let Some(ev) = ev else { break };
        let vmi = match ev {
            Ok(watcher::Event::Apply(v) | watcher::Event::InitApply(v)) => v,
            Ok(_) => continue,
            Err(e) => {
                eprintln!("VMI watch: {e}");
                continue;
            }
        };
        let now = Instant::now();
        let name = vmi.name_any();
        let status = vmi.status.clone().unwrap_or_default();
        {
            let mut tl = lock(&t);
            if !tl.vmis.contains(&name) {
                tl.vmis.insert(name.clone());
            }
            if matches!(status.phase, Phase::Scheduled | Phase::Running) {
                tl.scheduled.entry(name.clone()).or_insert(now);
            }
            if status.phase == Phase::Running {
                tl.running.entry(name.clone()).or_insert(now);
            }
            if status.phase.is_final() && !tl.final_phase.contains(&name) {
                tl.final_phase.push(name.clone());
            }
        }
        let on_node = status.node_name.as_deref().is_some_and(|n| !n.is_empty());
        if status.phase == Phase::Scheduled && on_node && reported.insert(name.clone()) {
            let (api, t, permits) = (api.clone(), t.clone(), permits.clone());
            tokio::spawn(async move {
                let Ok(_permit) = permits.acquire().await else {
                    return;
                };
                if let Err(e) = report_running(&api, &vmi).await {
                    lock(&t).report_errors.push(format!("{name}: {e}"));
                }
            });
        }
    }
}

/// The launcher's report of a running guest under TCG.
fn running_guest(vmi: &VirtualMachineInstance) -> Observation {
    Observation::Launcher(LauncherStatus {
        domain: format!("{}_{}", vmi.namespace().unwrap_or_default(), vmi.name_any()),
        state: DomainState::Running,
        accel: Accel::Tcg,
        launcher_version: env!("CARGO_PKG_VERSION").into(),
        ..LauncherStatus::default()
    })
}

/// virt-handler's status patch for a running guest, from the VMI as last seen.
pub fn running_patch(
    vmi: &VirtualMachineInstance,
    now: k8s_openapi::jiff::Timestamp,
) -> Option<serde_json::Value> {
    let prev = vmi.status.clone().unwrap_or_default();
    let next = vmi_status(&prev, &running_guest(vmi));
    let next = stamp_phase(&prev, next, now);
    status_patch(&prev, &next)
}

async fn report_running(
    api: &Api<VirtualMachineInstance>,
    vmi: &VirtualMachineInstance,
) -> anyhow::Result<()> {
    let Some(patch) = running_patch(vmi, k8s_openapi::jiff::Timestamp::now()) else {
        return Ok(());
    };
    let name = vmi.name_any();
    let mut last = None;
    for _ in 0..5 {
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(last.map_or_else(|| anyhow::anyhow!("no attempt"), Into::into))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_patch_is_virt_handlers_running_guest() {
        let vmi: VirtualMachineInstance = serde_json::from_value(serde_json::json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "vm-00001", "namespace": "default"},
            "spec": {"domain": {"devices": {}}},
            "status": {"phase": "Scheduled", "nodeName": "kwok-node-001"},
        }))
        .unwrap();
        let now = k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let p = running_patch(&vmi, now).unwrap();
        let s = &p["status"];
        assert_eq!(s["phase"], "Running");
        let conds = s["conditions"].as_array().unwrap();
        assert!(
            conds
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        );
        assert!(conds.iter().any(|c| c["type"] == "SoftwareEmulation"));
        assert_eq!(s["phaseTransitionTimestamps"][0]["phase"], "Running");
        // virt-controller's fields are never part of it.
        assert!(s.get("nodeName").is_none());
    }

    #[test]
    fn latencies_are_from_each_vms_own_create() {
        let t0 = Instant::now();
        let mut t = Timeline::default();
        t.created.insert("a".into(), t0);
        t.created.insert("b".into(), t0 + Duration::from_secs(1));
        t.running.insert("a".into(), t0 + Duration::from_secs(3));
        t.running.insert("b".into(), t0 + Duration::from_secs(5));
        t.running.insert("stray".into(), t0);
        let mut l = t.latencies(&t.running);
        l.sort();
        assert_eq!(l, [Duration::from_secs(3), Duration::from_secs(4)]);
        assert_eq!(t.all_running(), Some(Duration::from_secs(5)));
    }
}
