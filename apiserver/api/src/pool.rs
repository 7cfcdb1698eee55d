//! VirtualMachinePool (`pool.kubevirt.io/v1beta1`): keeps `replicas` stateful VMs
//! `<pool>-<ordinal>` made from one VM template, each with its own DataVolumes. Types with
//! KubeVirt's JSON, the per-VM spec (`indexed_spec`), and KubeVirt's admission checks (pure).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::NodeSelectorRequirement;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_with::skip_serializing_none;

use crate::common::Condition;
use crate::validation::FieldError;
use crate::vm::{VirtualMachine, VirtualMachineSpec};

/// API group of VM pools.
pub const GROUP: &str = "pool.kubevirt.io";
/// The version served.
pub const VERSION: &str = "v1beta1";
/// `apiVersion` of VM pools.
pub const API_VERSION: &str = "pool.kubevirt.io/v1beta1";
/// Label on a pool's VMs (and their VMI template) naming the template revision they were
/// made from, as KubeVirt labels them; a VM whose label differs is outdated.
pub const REVISION_LABEL: &str = "kubevirt.io/vm-pool-revision-name";

/// What a pool keeps.
#[skip_serializing_none]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "pool.kubevirt.io",
    version = "v1beta1",
    kind = "VirtualMachinePool",
    plural = "virtualmachinepools",
    singular = "virtualmachinepool",
    shortname = "vmpool",
    shortname = "vmpools",
    category = "all",
    namespaced,
    status = "VirtualMachinePoolStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachinePoolSpec {
    /// How many VMs the pool keeps; 1 when unset.
    pub replicas: Option<i32>,
    /// Selects the pool's VMs; must select the template's labels.
    pub selector: Option<LabelSelector>,
    /// The VMs made.
    pub virtual_machine_template: Option<VirtualMachineTemplateSpec>,
    /// Holds the controller back: nothing is created, deleted or updated while set.
    pub paused: Option<bool>,
    /// Per-VM names of the ConfigMaps and Secrets the template's volumes name.
    pub name_generation: Option<VirtualMachinePoolNameGeneration>,
    /// How many (or what percentage) of the VMs may be unready at once during an update
    /// (100 % when unset).
    pub max_unavailable: Option<IntOrString>,
    /// How VMs are removed when `replicas` goes down.
    pub scale_in_strategy: Option<VirtualMachinePoolScaleInStrategy>,
    /// How VMs follow a changed template.
    pub update_strategy: Option<VirtualMachinePoolUpdateStrategy>,
    /// When a VM failing to start is replaced.
    pub autohealing: Option<VirtualMachinePoolAutohealingStrategy>,
}

/// The VM template of a pool.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineTemplateSpec {
    /// Labels and annotations of each VM.
    pub metadata: Option<ObjectMeta>,
    /// The VM's spec.
    pub spec: Option<VirtualMachineSpec>,
}

/// What the controller observed.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachinePoolStatus {
    /// VMs owned and not being deleted.
    pub replicas: Option<i32>,
    /// Of those, the ready ones.
    pub ready_replicas: Option<i32>,
    /// `ReplicaFailure`, `ReplicaPaused`.
    pub conditions: Option<Vec<Condition>>,
    /// The selector as a string, for the `/scale` subresource (an HPA reads it).
    pub label_selector: Option<String>,
}

/// Per-VM names of referenced ConfigMaps and Secrets (`<name>-<ordinal>`).
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachinePoolNameGeneration {
    /// `configMap` volumes name `<configMap>-<ordinal>`.
    pub append_index_to_config_map_refs: Option<bool>,
    /// `secret` volumes name `<secret>-<ordinal>`.
    pub append_index_to_secret_refs: Option<bool>,
}

/// How VMs are removed on scale-in (one of the three; proactive when none).
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachinePoolScaleInStrategy {
    /// VMs are never removed by the pool: the user removes them.
    pub unmanaged: Option<Empty>,
    /// VMs are removed only as they go by other means.
    pub opportunistic: Option<VirtualMachinePoolOpportunisticScaleInStrategy>,
    /// VMs are chosen and deleted (the default).
    pub proactive: Option<VirtualMachinePoolProactiveScaleInStrategy>,
}

/// Opportunistic scale-in.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachinePoolOpportunisticScaleInStrategy {
    /// What of a removed VM is kept.
    pub state_preservation: Option<StatePreservation>,
}

/// Proactive scale-in.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachinePoolProactiveScaleInStrategy {
    /// Which VMs go first (random when unset).
    pub selection_policy: Option<VirtualMachinePoolSelectionPolicy>,
    /// What of a removed VM is kept.
    pub state_preservation: Option<StatePreservation>,
}

/// Which VMs are chosen first.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachinePoolSelectionPolicy {
    /// The order among the rest.
    pub sort_policy: Option<SortPolicy>,
    /// VMs matching these go before the others.
    pub selectors: Option<VirtualMachinePoolSelectors>,
}

/// VMs matching both (when both are set) are chosen first.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachinePoolSelectors {
    /// The VM's labels.
    pub label_selector: Option<LabelSelector>,
    /// The node its VMI runs on.
    pub node_selector_requirement_matcher: Option<Vec<NodeSelectorRequirement>>,
}

/// The order in which VMs are chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum SortPolicy {
    /// Lowest ordinal first.
    AscendingOrder,
    /// Highest ordinal first.
    DescendingOrder,
    /// Most recently created first.
    Newest,
    /// Least recently created first.
    Oldest,
    /// Any (KubeVirt's default).
    #[default]
    Random,
}

/// What of a VM removed by scale-in is kept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum StatePreservation {
    /// Nothing: the VM and its DataVolumes go.
    #[default]
    Disabled,
    /// Its DataVolumes (and claims) are kept and reused when the ordinal comes back.
    Offline,
    /// Its disks and memory: kubevirt-rs keeps the VM stopped, as Offline.
    Online,
}

/// How VMs follow a changed template (one of the three; proactive when none).
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachinePoolUpdateStrategy {
    /// VMs are never updated.
    pub unmanaged: Option<Empty>,
    /// The VM is updated; its VMI follows at its next restart.
    pub opportunistic: Option<Empty>,
    /// The VM is updated and its VMI restarted (the default).
    pub proactive: Option<VirtualMachinePoolProactiveUpdateStrategy>,
}

/// Proactive update.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachinePoolProactiveUpdateStrategy {
    /// Which VMs are updated first.
    pub selection_policy: Option<VirtualMachinePoolSelectionPolicy>,
}

/// When a VM failing to start is replaced.
#[skip_serializing_none]
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachinePoolAutohealingStrategy {
    /// Consecutive start failures before the VM is replaced (3 when unset).
    pub start_up_failure_threshold: Option<u32>,
    /// How long a VM must have failed to start before it is replaced (`5m` when unset).
    pub min_failing_to_start_duration: Option<String>,
}

/// An option without settings (`unmanaged: {}`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Empty {}

/// What the pool does on scale-in, resolved from `scaleInStrategy`.
#[derive(Clone, Debug, PartialEq)]
pub enum ScaleIn {
    /// Nothing: the user removes VMs.
    Unmanaged,
    /// Nothing proactive; VMs removed otherwise are not replaced beyond `replicas`.
    Opportunistic(StatePreservation),
    /// Choose by the policy and delete.
    Proactive(VirtualMachinePoolSelectionPolicy, StatePreservation),
}

/// What the pool does when the template changes, resolved from `updateStrategy`.
#[derive(Clone, Debug, PartialEq)]
pub enum Update {
    /// Nothing.
    Unmanaged,
    /// Update the VM only.
    Opportunistic,
    /// Update the VM and restart its VMI, in this order.
    Proactive(VirtualMachinePoolSelectionPolicy),
}

impl VirtualMachinePoolSpec {
    /// `replicas`, 1 when unset.
    pub fn desired(&self) -> i32 {
        self.replicas.unwrap_or(1)
    }

    /// Whether `paused` is set.
    pub fn is_paused(&self) -> bool {
        self.paused.unwrap_or(false)
    }

    /// The scale-in strategy (proactive, random, nothing kept when unset: KubeVirt's).
    pub fn scale_in(&self) -> ScaleIn {
        match &self.scale_in_strategy {
            Some(s) if s.unmanaged.is_some() => ScaleIn::Unmanaged,
            Some(s) if s.opportunistic.is_some() => ScaleIn::Opportunistic(
                s.opportunistic
                    .as_ref()
                    .and_then(|o| o.state_preservation)
                    .unwrap_or_default(),
            ),
            Some(VirtualMachinePoolScaleInStrategy {
                proactive: Some(p), ..
            }) => ScaleIn::Proactive(
                p.selection_policy.clone().unwrap_or_default(),
                p.state_preservation.unwrap_or_default(),
            ),
            _ => ScaleIn::Proactive(Default::default(), StatePreservation::Disabled),
        }
    }

    /// The update strategy (proactive, random when unset: KubeVirt's).
    pub fn update(&self) -> Update {
        match &self.update_strategy {
            Some(s) if s.unmanaged.is_some() => Update::Unmanaged,
            Some(s) if s.opportunistic.is_some() => Update::Opportunistic,
            Some(VirtualMachinePoolUpdateStrategy {
                proactive: Some(p), ..
            }) => Update::Proactive(p.selection_policy.clone().unwrap_or_default()),
            _ => Update::Proactive(Default::default()),
        }
    }

    /// How many VMs may be unready at once during an update, of `replicas` (at least 1).
    pub fn max_unavailable(&self, replicas: i32) -> i32 {
        let n = match &self.max_unavailable {
            None => replicas,
            Some(IntOrString::Int(n)) => *n,
            Some(IntOrString::String(s)) => s
                .trim_end_matches('%')
                .parse::<i64>()
                .map(|p| ((i64::from(replicas) * p) / 100) as i32)
                .unwrap_or(replicas),
        };
        n.max(1)
    }
}

/// The name of the pool's VM of ordinal `index`.
pub fn vm_name(pool: &str, index: u32) -> String {
    format!("{pool}-{index}")
}

/// The ordinal of a pool's VM from its name (`<pool>-<ordinal>`).
pub fn ordinal(pool: &str, vm: &str) -> Option<u32> {
    vm.strip_prefix(pool)?.strip_prefix('-')?.parse().ok()
}

/// The VM spec of ordinal `index` (KubeVirt's `indexVMSpec`): each DataVolume template
/// `<dv>-<index>` and the volumes using it renamed, and, where `nameGeneration` asks,
/// ConfigMap and Secret volumes `<name>-<index>`.
pub fn indexed_spec(pool: &VirtualMachinePoolSpec, index: u32) -> VirtualMachineSpec {
    let mut spec = pool
        .virtual_machine_template
        .as_ref()
        .and_then(|t| t.spec.clone())
        .unwrap_or_default();
    let mut renamed = BTreeMap::new();
    for dv in spec.data_volume_templates.iter_mut().flatten() {
        if let Some(name) = &mut dv.metadata.name {
            let new = format!("{name}-{index}");
            renamed.insert(name.clone(), new.clone());
            *name = new;
        }
    }
    let generation = pool.name_generation.clone().unwrap_or_default();
    let config_maps = generation.append_index_to_config_map_refs.unwrap_or(false);
    let secrets = generation.append_index_to_secret_refs.unwrap_or(false);
    let volumes = spec.template.spec.as_mut().and_then(|s| s.volumes.as_mut());
    for v in volumes.into_iter().flatten() {
        if let Some(c) = &mut v.persistent_volume_claim
            && let Some(n) = renamed.get(&c.claim_name)
        {
            c.claim_name = n.clone();
        } else if let Some(d) = &mut v.data_volume
            && let Some(n) = renamed.get(&d.name)
        {
            d.name = n.clone();
        } else if let Some(c) = &mut v.config_map
            && config_maps
        {
            c.name = format!("{}-{index}", c.name);
        } else if let Some(s) = &mut v.secret
            && secrets
            && let Some(name) = &mut s.secret_name
        {
            *name = format!("{name}-{index}");
        }
    }
    spec
}

/// KubeVirt's pool admission: a VM template whose spec is a valid VM spec, a selector that
/// selects its labels, no negative count, a valid `maxUnavailable`; the selector is fixed
/// once created (see [`validate_update`]).
pub fn validate(pool: &VirtualMachinePool) -> Vec<FieldError> {
    let spec = &pool.spec;
    let mut errs = Vec::new();
    let template = spec.virtual_machine_template.as_ref();
    match template.and_then(|t| t.spec.as_ref()) {
        None => errs.push(FieldError::required(
            "spec.virtualMachineTemplate",
            "missing virtual machine template.",
        )),
        Some(vm_spec) => {
            let mut vm = VirtualMachine::new("", vm_spec.clone());
            crate::defaults::default_vm(&mut vm);
            if let Some(s) = vm.spec.template.spec.as_mut() {
                crate::defaults::default_vmi_spec(s, "");
            }
            errs.extend(
                crate::validation::validate_vm(&vm)
                    .into_iter()
                    .map(|mut e| {
                        e.field = format!("spec.virtualMachineTemplate.{}", e.field);
                        e
                    }),
            );
        }
    }
    errs.extend(crate::replicas::validate(
        spec.replicas,
        spec.selector.as_ref(),
        template
            .and_then(|t| t.metadata.as_ref())
            .and_then(|m| m.labels.as_ref()),
    ));
    errs.extend(max_unavailable_errors(spec.max_unavailable.as_ref()));
    errs
}

/// The selector is fixed once created (KubeVirt's message).
pub fn validate_update(old: &VirtualMachinePool, new: &VirtualMachinePool) -> Vec<FieldError> {
    if old.spec.selector != new.spec.selector {
        return vec![FieldError::invalid(
            "spec.selector",
            "",
            "selector is immutable after creation.",
        )];
    }
    Vec::new()
}

fn max_unavailable_errors(m: Option<&IntOrString>) -> Vec<FieldError> {
    let field = "spec.maxUnavailable";
    match m {
        None => Vec::new(),
        Some(IntOrString::Int(n)) if *n <= 0 => vec![FieldError::invalid(
            field,
            &n.to_string(),
            "maxUnavailable must be greater than 0",
        )],
        Some(IntOrString::Int(_)) => Vec::new(),
        Some(IntOrString::String(s)) => {
            let Some(p) = s.strip_suffix('%') else {
                return vec![FieldError::invalid(
                    field,
                    s,
                    "maxUnavailable percentage must end with %",
                )];
            };
            match p.parse::<i64>() {
                Err(e) => vec![FieldError::invalid(
                    field,
                    s,
                    &format!("maxUnavailable percentage value {p:?} is invalid: {e}"),
                )],
                Ok(v) if !(1..=100).contains(&v) => vec![FieldError::invalid(
                    field,
                    s,
                    &format!("maxUnavailable percentage value {v} must be between 1 and 100"),
                )],
                Ok(_) => Vec::new(),
            }
        }
    }
}

#[cfg(test)]
#[path = "pool_tests.rs"]
mod tests;
