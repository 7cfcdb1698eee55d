//! What the pool controller does, as a pure function of a pool, the VMs it controls and
//! their VMIs (KubeVirt's `watch/pool`): how many VMs to create, which to delete on
//! scale-in (by the pool's selection policy) or to replace (autohealing), which outdated
//! VMs to rewrite from the template and which of their VMIs to restart within
//! `maxUnavailable`, and the next status.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kubevirt_api::common::{ConditionStatus, find_condition};
use kubevirt_api::pool::{
    self, REVISION_LABEL, ScaleIn, SortPolicy, StatePreservation, Update, VirtualMachinePool,
    VirtualMachinePoolSelectionPolicy, VirtualMachinePoolStatus,
};
use kubevirt_api::vm::PrintableStatus;
use kubevirt_api::{VirtualMachine, VirtualMachineInstance};

use crate::replicas::{Failure, conditions, controller_ref, controller_uid, deleting};

/// The kind, for owner references.
pub const KIND: &str = "VirtualMachinePool";
/// How soon a rollout held back by `maxUnavailable` looks again.
pub const ROLLOUT_RECHECK: Duration = Duration::from_secs(5);
/// KubeVirt's autohealing defaults.
const DEFAULT_FAILURE_THRESHOLD: u32 = 3;
const DEFAULT_FAILING_DURATION: Duration = Duration::from_secs(300);

/// A member of the pool: its VM and, when it runs, its VMI.
#[derive(Debug, Clone, Copy)]
pub struct Member<'a> {
    /// The VM.
    pub vm: &'a VirtualMachine,
    /// Its VMI (same name).
    pub vmi: Option<&'a VirtualMachineInstance>,
}

/// An object to delete, by name and uid (the delete's precondition).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Doomed {
    /// Its name.
    pub name: String,
    /// Its uid.
    pub uid: String,
}

impl Doomed {
    fn of(meta: &ObjectMeta) -> Self {
        Self {
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
        }
    }
}

/// One reconcile's plan.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    /// VMs to create (the lowest free ordinals, chosen against every VM name of the
    /// namespace when carried out).
    pub create: usize,
    /// VMs to delete on scale-in.
    pub scale_in: Vec<Doomed>,
    /// Keep the DataVolumes of the VMs deleted on scale-in (statePreservation), for the
    /// VM of the same ordinal to find again.
    pub preserve_state: bool,
    /// VMs failing to start that are replaced (deleted now, made again next round).
    pub heal: Vec<Doomed>,
    /// Outdated VMs rewritten from the current template.
    pub update: Vec<String>,
    /// VMIs restarted so they run the current template (proactive update).
    pub restart: Vec<Doomed>,
    /// Look again after this long (a rollout held back by `maxUnavailable`).
    pub wait: Option<Duration>,
}

/// The pool's template revision: a stable hash of what a VM is made from (template and
/// name generation), so a VM made from another revision is outdated. Stable across
/// versions of virt-controller (FNV-1a, not std's hasher), or an upgrade would restart
/// every pool VM.
pub fn revision(p: &VirtualMachinePool) -> String {
    let text = serde_json::to_string(&(&p.spec.virtual_machine_template, &p.spec.name_generation))
        .unwrap_or_default();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

fn revision_of(meta: Option<&ObjectMeta>) -> Option<&str> {
    meta?
        .labels
        .as_ref()?
        .get(REVISION_LABEL)
        .map(String::as_str)
}

/// The VMs of `vms` that `pool` controls.
pub fn owned<'a>(
    p: &VirtualMachinePool,
    vms: impl IntoIterator<Item = &'a VirtualMachine>,
) -> Vec<&'a VirtualMachine> {
    let Some(uid) = p.metadata.uid.as_deref() else {
        return Vec::new();
    };
    vms.into_iter()
        .filter(|v| controller_uid(&v.metadata) == Some(uid))
        .collect()
}

/// Whether the VM is ready (its instance runs and is ready).
pub fn is_ready(vm: &VirtualMachine) -> bool {
    vm.status.as_ref().and_then(|s| s.ready) == Some(true)
}

/// Whether a member serves: its VM ready and its VMI there and not going.
fn is_available(m: &Member<'_>) -> bool {
    is_ready(m.vm) && m.vmi.is_some_and(|v| !deleting(&v.metadata))
}

/// The VM of ordinal `index`, as KubeVirt's pool makes it: `<pool>-<index>`, the template's
/// labels and annotations, the revision label on the VM and its VMI template, each
/// DataVolume `<name>-<index>` (and `nameGeneration`'s ConfigMaps and Secrets), controlled
/// by the pool.
pub fn desired_vm(p: &VirtualMachinePool, index: u32, revision: &str) -> Option<VirtualMachine> {
    let name = pool::vm_name(&p.name_any(), index);
    let template = p.spec.virtual_machine_template.as_ref()?;
    let meta = template.metadata.clone().unwrap_or_default();
    let mut spec = pool::indexed_spec(&p.spec, index);
    let tmeta = spec
        .template
        .metadata
        .get_or_insert_with(ObjectMeta::default);
    tmeta
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(REVISION_LABEL.into(), revision.into());
    let mut labels = meta.labels.unwrap_or_default();
    labels.insert(REVISION_LABEL.into(), revision.into());
    let mut vm = VirtualMachine::new(&name, spec);
    vm.metadata = ObjectMeta {
        name: Some(name),
        namespace: p.namespace(),
        labels: Some(labels),
        annotations: meta.annotations,
        owner_references: Some(vec![controller_ref(
            pool::API_VERSION,
            KIND,
            &p.name_any(),
            p.metadata.uid.as_deref()?,
        )]),
        ..ObjectMeta::default()
    };
    Some(vm)
}

/// The `count` lowest ordinals whose name no VM of the namespace has (KubeVirt's choice: a
/// deleted member's ordinal is the first reused).
pub fn free_ordinals(pool_name: &str, taken: &BTreeSet<String>, count: usize) -> Vec<u32> {
    (0u32..)
        .filter(|i| !taken.contains(&pool::vm_name(pool_name, *i)))
        .take(count)
        .collect()
}

/// `members` in the order a selection policy picks them: those its selectors match first
/// (VM labels, and the labels of the node the VMI runs on), then by its sort policy
/// (random by default, from `seed`).
pub fn selection_order<'a>(
    pool_name: &str,
    mut members: Vec<Member<'a>>,
    policy: &VirtualMachinePoolSelectionPolicy,
    node_labels: &BTreeMap<String, BTreeMap<String, String>>,
    seed: u64,
) -> Vec<Member<'a>> {
    let ordinal = |m: &Member<'_>| pool::ordinal(pool_name, &m.vm.name_any()).unwrap_or(0);
    match policy.sort_policy.unwrap_or_default() {
        SortPolicy::AscendingOrder => members.sort_by_key(ordinal),
        SortPolicy::DescendingOrder => members.sort_by_key(|m| std::cmp::Reverse(ordinal(m))),
        SortPolicy::Oldest => members.sort_by_key(|m| m.vm.metadata.creation_timestamp.clone()),
        SortPolicy::Newest => {
            members.sort_by_key(|m| std::cmp::Reverse(m.vm.metadata.creation_timestamp.clone()))
        }
        SortPolicy::Random => shuffle(&mut members, seed),
    }
    let Some(selectors) = &policy.selectors else {
        return members;
    };
    let matches = |m: &Member<'_>| {
        let labels_ok = selectors
            .label_selector
            .as_ref()
            .is_none_or(|s| kubevirt_api::replicas::selects(s, m.vm.metadata.labels.as_ref()));
        let node_ok = selectors
            .node_selector_requirement_matcher
            .as_ref()
            .is_none_or(|reqs| {
                let node = m
                    .vmi
                    .and_then(|v| v.status.as_ref())
                    .and_then(|s| s.node_name.as_deref());
                let empty = BTreeMap::new();
                let labels = node.and_then(|n| node_labels.get(n)).unwrap_or(&empty);
                node.is_some() && reqs.iter().all(|r| node_requirement(r, labels))
            });
        labels_ok && node_ok
    };
    // Stable: the sort policy's order within each group.
    members.sort_by_key(|m| !matches(m));
    members
}

fn node_requirement(
    r: &k8s_openapi::api::core::v1::NodeSelectorRequirement,
    labels: &BTreeMap<String, String>,
) -> bool {
    let values = r.values.clone().unwrap_or_default();
    let v = labels.get(&r.key);
    match r.operator.as_str() {
        "In" => v.is_some_and(|v| values.contains(v)),
        "NotIn" => v.is_none_or(|v| !values.contains(v)),
        "Exists" => v.is_some(),
        "DoesNotExist" => v.is_none(),
        "Gt" | "Lt" => {
            let (Some(Ok(have)), Some(Ok(want))) = (
                v.map(|v| v.parse::<i64>()),
                values.first().map(|w| w.parse::<i64>()),
            ) else {
                return false;
            };
            if r.operator == "Gt" {
                have > want
            } else {
                have < want
            }
        }
        _ => false,
    }
}

/// Fisher–Yates with a small xorshift generator: the reconcile passes a random seed, tests
/// a fixed one.
fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut x = seed | 1;
    for i in (1..items.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let j = usize::try_from(x % (i as u64 + 1)).unwrap_or(0);
        items.swap(i, j);
    }
}

/// Whether autohealing replaces this VM: its start failed `startUpFailureThreshold` times
/// in a row, or it has been failing to start (crash loop, unschedulable, image or volume
/// errors) for `minFailingToStartDuration`.
fn needs_healing(p: &VirtualMachinePool, vm: &VirtualMachine, now: Timestamp) -> bool {
    let Some(a) = &p.spec.autohealing else {
        return false;
    };
    let Some(status) = &vm.status else {
        return false;
    };
    let threshold = a
        .start_up_failure_threshold
        .unwrap_or(DEFAULT_FAILURE_THRESHOLD);
    let failures = status
        .start_failure
        .as_ref()
        .and_then(|f| f.consecutive_fail_count)
        .unwrap_or(0);
    if u32::try_from(failures).unwrap_or(0) >= threshold {
        return true;
    }
    let failing = matches!(
        status.printable_status,
        Some(
            PrintableStatus::CrashLoopBackOff
                | PrintableStatus::ErrorUnschedulable
                | PrintableStatus::ErrImagePull
                | PrintableStatus::ImagePullBackOff
                | PrintableStatus::ErrorPvcNotFound
                | PrintableStatus::DataVolumeError
        )
    );
    let min = a
        .min_failing_to_start_duration
        .as_deref()
        .and_then(|d| kubevirt_api::duration::parse(d).ok())
        .unwrap_or(DEFAULT_FAILING_DURATION);
    let since = status
        .conditions
        .as_deref()
        .and_then(|c| find_condition(c, "Ready"))
        .filter(|c| c.status != ConditionStatus::True)
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0);
    failing
        && since.is_some_and(|t| {
            now.duration_since(t)
                .try_into()
                .is_ok_and(|d: Duration| d >= min)
        })
}

/// The plan for `p`, its members (the VMs it controls with their VMIs) and its current
/// revision. Paused: nothing.
pub fn plan(
    p: &VirtualMachinePool,
    members: &[Member<'_>],
    node_labels: &BTreeMap<String, BTreeMap<String, String>>,
    now: Timestamp,
    seed: u64,
) -> Plan {
    let mut out = Plan::default();
    if p.spec.is_paused() {
        return out;
    }
    let name = p.name_any();
    let revision = revision(p);
    let active: Vec<Member<'_>> = members
        .iter()
        .copied()
        .filter(|m| !deleting(&m.vm.metadata))
        .collect();
    let desired = usize::try_from(p.spec.desired().max(0)).unwrap_or(0);

    // Autohealing: a VM failing to start goes; its ordinal is made again once it is gone.
    let (healing, healthy): (Vec<Member<'_>>, Vec<Member<'_>>) = active
        .into_iter()
        .partition(|m| needs_healing(p, m.vm, now));
    out.heal = healing.iter().map(|m| Doomed::of(&m.vm.metadata)).collect();

    out.create = desired.saturating_sub(healthy.len() + healing.len());
    if healthy.len() > desired
        && let ScaleIn::Proactive(policy, preservation) = p.spec.scale_in()
    {
        let ordered = selection_order(&name, healthy.clone(), &policy, node_labels, seed);
        out.scale_in = ordered[..healthy.len() - desired]
            .iter()
            .map(|m| Doomed::of(&m.vm.metadata))
            .collect();
        out.preserve_state = preservation != StatePreservation::Disabled;
    }
    let staying: Vec<Member<'_>> = healthy
        .into_iter()
        .filter(|m| {
            !out.scale_in
                .iter()
                .any(|d| Some(&d.name) == m.vm.metadata.name.as_ref())
        })
        .collect();

    // Updates: outdated VMs are rewritten (opportunistic and proactive), and, proactive,
    // their VMIs restarted: the unready ones at once (they serve nothing; an update is
    // never skipped because a member is not ready), the ready ones within maxUnavailable.
    let update = p.spec.update();
    if update == Update::Unmanaged {
        return out;
    }
    out.update = staying
        .iter()
        .filter(|m| revision_of(Some(&m.vm.metadata)) != Some(revision.as_str()))
        .map(|m| m.vm.name_any())
        .collect();
    let Update::Proactive(policy) = update else {
        return out;
    };
    let outdated_vmi = |m: &Member<'_>| {
        m.vmi.is_some_and(|v| {
            !deleting(&v.metadata) && revision_of(Some(&v.metadata)) != Some(revision.as_str())
        })
    };
    let (unready, ready): (Vec<Member<'_>>, Vec<Member<'_>>) = staying
        .iter()
        .copied()
        .filter(outdated_vmi)
        .partition(|m| !is_available(m));
    let unavailable = staying.iter().filter(|m| !is_available(m)).count();
    let budget = usize::try_from(p.spec.max_unavailable(p.spec.desired()))
        .unwrap_or(1)
        .saturating_sub(unavailable);
    let ordered = selection_order(&name, ready, &policy, node_labels, seed);
    let doomed = |m: &Member<'_>| m.vmi.map(|v| Doomed::of(&v.metadata));
    out.restart = unready.iter().filter_map(doomed).collect();
    out.restart
        .extend(ordered.iter().take(budget).filter_map(doomed));
    if ordered.len() > budget {
        out.wait = Some(ROLLOUT_RECHECK);
    }
    out
}

/// The status after a reconcile.
pub fn status(
    p: &VirtualMachinePool,
    members: &[Member<'_>],
    failure: Option<&Failure>,
    now: Timestamp,
) -> VirtualMachinePoolStatus {
    let active: Vec<_> = members
        .iter()
        .filter(|m| !deleting(&m.vm.metadata))
        .collect();
    let old = p.status.clone().unwrap_or_default();
    let conds = conditions(
        old.conditions.as_deref().unwrap_or_default(),
        p.spec.is_paused(),
        failure,
        now,
    );
    let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
    VirtualMachinePoolStatus {
        replicas: Some(count(active.len())),
        ready_replicas: Some(count(active.iter().filter(|m| is_ready(m.vm)).count())),
        conditions: (!conds.is_empty()).then_some(conds),
        label_selector: p
            .spec
            .selector
            .as_ref()
            .and_then(kubevirt_api::replicas::selector_string),
    }
}

/// Whether `selector` of a scale-in or update policy needs the nodes' labels.
pub fn needs_nodes(p: &VirtualMachinePool) -> bool {
    let uses = |s: &Option<VirtualMachinePoolSelectionPolicy>| {
        s.as_ref()
            .and_then(|s| s.selectors.as_ref())
            .is_some_and(|s| s.node_selector_requirement_matcher.is_some())
    };
    let scale_in = p
        .spec
        .scale_in_strategy
        .as_ref()
        .and_then(|s| s.proactive.as_ref())
        .is_some_and(|s| uses(&s.selection_policy));
    let update = p
        .spec
        .update_strategy
        .as_ref()
        .and_then(|s| s.proactive.as_ref())
        .is_some_and(|s| uses(&s.selection_policy));
    scale_in || update
}

#[cfg(test)]
#[path = "decide_tests.rs"]
mod tests;
