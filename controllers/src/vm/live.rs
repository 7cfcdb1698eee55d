//! Changes to a running VM's template (pure; no I/O): which of them wait for a restart
//! (the VM's `RestartRequired` condition, with the fields that changed) and which are
//! carried to the running VMI under the `LiveUpdate` rollout strategy (node selector,
//! affinity, tolerations, CPU sockets), as KubeVirt's VM controller decides them
//! (`addRestartRequiredIfNeeded`, `handleCPUChangeRequest`, `handleAffinityChangeRequest`,
//! `handleTolerationsChangeRequest`).
//!
//! What the VM looked like when its VMI started is kept in a ControllerRevision named as
//! KubeVirt names it (`revision-start-vm-<vm uid>-<generation>`, data `{"spec": …}`),
//! created with the VMI and deleted when the VM starts or stops again.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Affinity, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kubevirt_api::kubevirt::VmRolloutStrategy;
use kubevirt_api::vmi::Cpu;
use kubevirt_api::{VirtualMachineInstance, VirtualMachineInstanceSpec, VirtualMachineSpec};
use serde_json::{Map, Value, json};

/// KubeVirt's message when a field that cannot change live changed.
pub const NON_LIVE_UPDATABLE: &str = "a non-live-updatable field was changed in the template spec";
/// KubeVirt's message when the sockets went past the VMI's `maxSockets`.
pub const SOCKETS_ABOVE_MAX: &str =
    "CPU sockets updated in template spec to a value higher than what's available";
/// KubeVirt's message when the sockets went down.
pub const SOCKETS_REDUCED: &str = "Reduction of CPU socket count requires a restart";
/// VMI condition: the VMI's vCPUs differ from what its guest has (KubeVirt's
/// `HotVCPUChange`), until a migration to a launcher pod of the new size carried them.
pub const HOT_VCPU_CHANGE: &str = crate::vmi::decide::conditions::HOT_VCPU_CHANGE;

/// KubeVirt's default `maxHotplugRatio`.
pub const DEFAULT_MAX_HOTPLUG_RATIO: u32 = 4;
/// The most vCPUs KubeVirt gives a VMI's `maxSockets` when it computes it.
const MAX_VCPUS: u32 = 512;

/// The KubeVirt resource's `vmRolloutStrategy` and `liveUpdateConfiguration`.
#[derive(Clone, Debug, PartialEq)]
pub struct LiveUpdateConfig {
    /// Stage (everything waits for a restart) or LiveUpdate.
    pub strategy: VmRolloutStrategy,
    /// `maxSockets` of a VMI that sets none: its sockets times this.
    pub max_hotplug_ratio: u32,
    /// `maxSockets` of every VMI that sets none, when set.
    pub max_cpu_sockets: Option<u32>,
    /// `memory.maxGuest` bound (kept for memory hotplug; not used yet).
    pub max_guest: Option<Quantity>,
}

impl Default for LiveUpdateConfig {
    fn default() -> Self {
        Self {
            strategy: VmRolloutStrategy::Stage,
            max_hotplug_ratio: DEFAULT_MAX_HOTPLUG_RATIO,
            max_cpu_sockets: None,
            max_guest: None,
        }
    }
}

impl LiveUpdateConfig {
    /// Under `LiveUpdate`.
    pub fn is_live_update(&self) -> bool {
        self.strategy == VmRolloutStrategy::LiveUpdate
    }

    /// Sets `maxSockets` of a VMI about to be created that has none, as KubeVirt's VMI
    /// defaulting does under `LiveUpdate` (the cluster's `maxCpuSockets` when set, else
    /// sockets × `maxHotplugRatio`, at most 512 vCPUs); nothing under `Stage`.
    pub fn default_max_sockets(&self, spec: &mut VirtualMachineInstanceSpec) {
        if !self.is_live_update() {
            return;
        }
        let cpu = spec.domain.cpu.get_or_insert_with(Cpu::default);
        if cpu.max_sockets.is_some_and(|m| m > 0) {
            return;
        }
        let sockets = cpu.sockets.unwrap_or(1).max(1);
        let per_socket = cpu.cores.unwrap_or(1).max(1) * cpu.threads.unwrap_or(1).max(1);
        let max = match self.max_cpu_sockets.filter(|m| *m > 0) {
            Some(m) => m.max(sockets),
            None => {
                let m = sockets.saturating_mul(self.max_hotplug_ratio.max(1));
                if m.saturating_mul(per_socket) > MAX_VCPUS {
                    (MAX_VCPUS / per_socket).max(sockets)
                } else {
                    m
                }
            }
        };
        cpu.max_sockets = Some(max);
    }
}

/// Name of the ControllerRevision holding the VM's spec as its VMI of `generation` started
/// (KubeVirt's `getVMRevisionName`).
pub fn revision_name(vm_uid: &str, generation: i64) -> String {
    format!("{}-{generation}", revision_prefix(vm_uid))
}

/// What every start revision of the VM's name begins with.
pub fn revision_prefix(vm_uid: &str) -> String {
    format!("revision-start-vm-{vm_uid}")
}

/// The data of a start revision: the VM's spec (KubeVirt's `VirtualMachineRevisionData`).
pub fn revision_data(spec: &VirtualMachineSpec) -> Result<Value, serde_json::Error> {
    Ok(json!({ "spec": serde_json::to_value(spec)? }))
}

/// The VM spec a start revision holds.
pub fn spec_of_revision(data: &Value) -> Result<VirtualMachineSpec, serde_json::Error> {
    serde_json::from_value(data.get("spec").cloned().unwrap_or(Value::Null))
}

/// The part of a VM spec a change of which concerns the running VMI: its template's spec
/// and the instance type and preference it names (their captured revisions aside).
fn relevant(spec: &VirtualMachineSpec) -> Value {
    let matcher = |m: &Option<kubevirt_api::vm::Matcher>| {
        m.as_ref().map(|m| {
            let mut m = m.clone();
            m.revision_name = None;
            m
        })
    };
    // Hotplugged volumes reach the running VMI live (hotplug.rs): no restart for them.
    let template = spec
        .template
        .spec
        .as_ref()
        .map(kubevirt_api::hotplug::without_hotplugged);
    json!({
        "template": {"spec": template},
        "instancetype": matcher(&spec.instancetype),
        "preference": matcher(&spec.preference),
    })
}

/// Why the VM needs a restart because of how its spec changed since its VMI started, or
/// `None` when every change can reach the VMI live: KubeVirt's message, then the fields
/// that changed. Under `Stage` every change of the template's spec counts; under
/// `LiveUpdate` not the CPU sockets, node selector, affinity and tolerations.
pub fn restart_required(
    started: &VirtualMachineSpec,
    current: &VirtualMachineSpec,
    strategy: VmRolloutStrategy,
) -> Option<String> {
    let mut old = started.clone();
    if strategy == VmRolloutStrategy::LiveUpdate {
        // Ignore the live-updatable fields by copying them over.
        if let (Some(o), Some(c)) = (old.template.spec.as_mut(), current.template.spec.as_ref()) {
            // A VM started without a `cpu` block (one socket) that now names its sockets
            // changed only them: the started spec gets a block with the same sockets.
            if let Some(ccpu) = c.domain.cpu.as_ref() {
                o.domain.cpu.get_or_insert_with(Default::default).sockets = ccpu.sockets;
            }
            o.node_selector = c.node_selector.clone();
            o.affinity = c.affinity.clone();
            o.tolerations = c.tolerations.clone();
        }
    }
    let mut changed = Vec::new();
    diff_paths("spec", &relevant(&old), &relevant(current), &mut changed);
    if changed.is_empty() {
        return None;
    }
    Some(format!("{NON_LIVE_UPDATABLE}: {}", changed.join(", ")))
}

/// The paths under `path` where `a` and `b` differ, down through objects (an array or a
/// value that differs is named as a whole).
fn diff_paths(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
    if a == b {
        return;
    }
    match (a, b) {
        // A field added or removed as a whole is named as a whole.
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                let (x, y) = (
                    a.get(k).unwrap_or(&Value::Null),
                    b.get(k).unwrap_or(&Value::Null),
                );
                diff_paths(&format!("{path}.{k}"), x, y, out);
            }
        }
        _ => out.push(path.to_string()),
    }
}

/// What a reconcile does about a running VMI whose VM's template may differ from it under
/// `LiveUpdate`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LivePlan {
    /// Set the VM's `RestartRequired` with this message.
    pub restart_required: Option<String>,
    /// A merge patch of the VMI's spec carrying the changes, when there are any.
    pub vmi_spec_patch: Option<Value>,
    /// Not now (a migration or a CPU hotplug in flight): look again later, for this reason.
    pub wait: Option<&'static str>,
    /// The sockets the VMI gets, when they change.
    pub sockets: Option<u32>,
}

fn vcpus(cpu: Option<&Cpu>) -> u32 {
    let c = cpu.cloned().unwrap_or_default();
    c.sockets.unwrap_or(1).max(1) * c.cores.unwrap_or(1).max(1) * c.threads.unwrap_or(1).max(1)
}

/// Whether a migration of the VMI is under way (KubeVirt's `migrations.IsMigrating`).
pub fn is_migrating(vmi: &VirtualMachineInstance) -> bool {
    vmi.status
        .as_ref()
        .and_then(|s| s.migration_state.as_ref())
        .is_some_and(|m| m.start_timestamp.is_some() && m.end_timestamp.is_none())
}

fn has_true_condition(vmi: &VirtualMachineInstance, type_: &str) -> bool {
    vmi.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == type_ && c.status == kubevirt_api::ConditionStatus::True)
        })
}

/// A CPU quantity plus `delta` whole CPUs, in millicores unless whole.
fn add_cpus(q: &Quantity, delta: i64) -> Option<Quantity> {
    let s = q.0.trim();
    let milli: i64 = match s.strip_suffix('m') {
        Some(m) => m.parse().ok()?,
        None => (s.parse::<f64>().ok()? * 1000.0).round() as i64,
    };
    let new = milli + delta * 1000;
    Some(Quantity(if new % 1000 == 0 {
        (new / 1000).to_string()
    } else {
        format!("{new}m")
    }))
}

/// What to carry from the VM's template to its running VMI under `LiveUpdate` (the VM
/// has no `RestartRequired`): node selector, affinity and tolerations as they are, and CPU
/// sockets raised within the VMI's `maxSockets` (the CPU requests and limits the template
/// sets raised by as many vCPUs). Sockets lowered or above `maxSockets` need a restart.
pub fn live_plan(template: &VirtualMachineInstanceSpec, vmi: &VirtualMachineInstance) -> LivePlan {
    let mut plan = LivePlan::default();
    let spec = &vmi.spec;
    let mut patch = Map::new();
    let placement_changed = template.node_selector != spec.node_selector
        || template.affinity != spec.affinity
        || template.tolerations != spec.tolerations;
    if placement_changed && is_migrating(vmi) {
        plan.wait = Some("node placement should not be changed during VMI migration");
        return plan;
    }
    let null_or = |v: Value| if v.is_null() { Value::Null } else { v };
    if template.node_selector != spec.node_selector {
        let s: Option<&BTreeMap<String, String>> = template.node_selector.as_ref();
        patch.insert("nodeSelector".into(), null_or(json!(s)));
    }
    if template.affinity != spec.affinity {
        let a: Option<&Affinity> = template.affinity.as_ref();
        patch.insert("affinity".into(), null_or(json!(a)));
    }
    if template.tolerations != spec.tolerations {
        let t: Option<&Vec<Toleration>> = template.tolerations.as_ref();
        patch.insert("tolerations".into(), null_or(json!(t)));
    }

    let (tcpu, vcpu) = (template.domain.cpu.as_ref(), spec.domain.cpu.as_ref());
    let (want, have) = (
        tcpu.and_then(|c| c.sockets).unwrap_or(1),
        vcpu.and_then(|c| c.sockets).unwrap_or(1),
    );
    if tcpu.is_some() && vcpu.is_some() && want != have {
        let max = vcpu.and_then(|c| c.max_sockets).unwrap_or(0);
        if has_true_condition(vmi, HOT_VCPU_CHANGE) {
            plan.wait = Some("another CPU hotplug is in progress");
        } else if is_migrating(vmi) {
            plan.wait = Some("CPU hotplug is not allowed while VMI is migrating");
        } else if want > max {
            plan.restart_required = Some(SOCKETS_ABOVE_MAX.to_string());
        } else if want < have {
            plan.restart_required = Some(SOCKETS_REDUCED.to_string());
        } else {
            plan.sockets = Some(want);
            let mut domain = Map::new();
            domain.insert("cpu".into(), json!({"sockets": want}));
            let delta = i64::from(vcpus(tcpu)) - i64::from(vcpus(vcpu));
            let mut resources = Map::new();
            for (field, template_q, vmi_q) in [
                (
                    "requests",
                    template
                        .domain
                        .resources
                        .as_ref()
                        .and_then(|r| r.requests.as_ref()),
                    spec.domain
                        .resources
                        .as_ref()
                        .and_then(|r| r.requests.as_ref()),
                ),
                (
                    "limits",
                    template
                        .domain
                        .resources
                        .as_ref()
                        .and_then(|r| r.limits.as_ref()),
                    spec.domain
                        .resources
                        .as_ref()
                        .and_then(|r| r.limits.as_ref()),
                ),
            ] {
                let set_in_template = template_q.is_some_and(|m| m.contains_key("cpu"));
                if let (true, Some(q)) = (set_in_template, vmi_q.and_then(|m| m.get("cpu")))
                    && let Some(new) = add_cpus(q, delta)
                {
                    resources.insert(field.into(), json!({"cpu": new}));
                }
            }
            if !resources.is_empty() {
                domain.insert("resources".into(), Value::Object(resources));
            }
            patch.insert("domain".into(), Value::Object(domain));
        }
    }
    if !patch.is_empty() {
        plan.vmi_spec_patch = Some(json!({ "spec": patch }));
    }
    plan
}

/// What the VM's `RestartRequired` condition becomes this reconcile.
#[derive(Clone, Debug, PartialEq)]
pub enum RestartRequired {
    /// As it is (nothing compared this time).
    Keep,
    /// Gone: the VM starts or stops, or runs nothing.
    Clear,
    /// True with this message (KubeVirt keeps the first until the restart).
    Set(String),
}

/// Applies `what` to the VM status `conditions`: a condition already True keeps its
/// message and transition time (KubeVirt sets it once and blocks further live updates
/// until the restart).
pub fn apply_restart_required(
    conditions: &mut Vec<kubevirt_api::Condition>,
    what: &RestartRequired,
    now: k8s_openapi::jiff::Timestamp,
) {
    use kubevirt_api::common::{find_condition, remove_condition};
    use kubevirt_api::vm::condition_types::RESTART_REQUIRED;
    match what {
        RestartRequired::Keep => {}
        RestartRequired::Clear => remove_condition(conditions, RESTART_REQUIRED),
        RestartRequired::Set(message) => {
            if find_condition(conditions, RESTART_REQUIRED)
                .is_some_and(|c| c.status == kubevirt_api::ConditionStatus::True)
            {
                return;
            }
            remove_condition(conditions, RESTART_REQUIRED);
            conditions.push(kubevirt_api::Condition {
                type_: RESTART_REQUIRED.to_string(),
                status: kubevirt_api::ConditionStatus::True,
                message: Some(message.clone()),
                last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    now,
                )),
                ..kubevirt_api::Condition::default()
            });
        }
    }
}

/// Whether the VM's status already says it needs a restart.
pub fn has_restart_required(vm: &kubevirt_api::VirtualMachine) -> bool {
    vm.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| {
            kubevirt_api::common::find_condition(
                c,
                kubevirt_api::vm::condition_types::RESTART_REQUIRED,
            )
        })
        .is_some_and(|c| c.status == kubevirt_api::ConditionStatus::True)
}

#[cfg(test)]
#[path = "live_tests.rs"]
mod tests;
