//! Input policy of the API, as KubeVirt's admission webhooks enforce it: what a writer
//! may put into a VM, VMI or VMIM beyond the object being valid in itself (that is
//! [`crate::validation`]). Pure functions over the stored JSON, so the API server calls
//! them on create and on every kind of update (PUT, JSON/merge patch, server-side apply)
//! with the object before and after, and the requester's [`Actor`].
//!
//! The rules, and why:
//! - `hostDisk` volumes need the `HostDisk` feature gate (off by default, as in
//!   KubeVirt): a hostDisk is a path on the node, so without the gate anyone allowed to
//!   create a VM could hand a node's files or devices to a guest.
//! - A VMI's spec cannot change after creation, except by virt-apiserver itself (its
//!   action subresources: a forced restart shortens the grace period) and, for the claim
//!   names of `persistentVolumeClaim` volumes only, by the other components (a migration
//!   that copied a claim points the volume at the new one). KubeVirt lets only its own
//!   service accounts change a VMI spec, for hotplug and volume migration; a spec edit
//!   would otherwise reach the node at the next migration (the target launcher is
//!   rendered from the spec) without any of the create checks.
//! - A VMIM's spec cannot change after creation (KubeVirt: "update of Migration object's
//!   spec is restricted"): the controller decided on the spec it saw.
//! - Labels and annotations under `kubevirt.io/` and `kubevirt-rs.io/` on VMs (also in
//!   their template) and VMIs are written only by kubevirt-rs components, except the
//!   ones KubeVirt documents for users ([`USER_SETTABLE`]): components trust them
//!   (`kubevirt.io/nodeName` says which virt-handler owns a VMI,
//!   `kubevirt.io/migrationTargetNodeName` which node receives it).

use std::collections::BTreeMap;

use serde_json::Value;

use crate::validation::FieldError;

/// Name of the feature gate that allows `hostDisk` volumes (KubeVirt's name).
pub const HOST_DISK_GATE: &str = "HostDisk";
/// The gate of the volume hotplug subresources, with requests queued on a VM's status.
pub const HOTPLUG_VOLUMES_GATE: &str = crate::hotplug::FEATURE_GATES[0];
/// The gate of the volume hotplug subresources, a VM's requests written to its template.
pub const DECLARATIVE_HOTPLUG_VOLUMES_GATE: &str = crate::hotplug::FEATURE_GATES[1];

/// Where the gates come from, for error messages.
const GATES_FIELD: &str = "spec.configuration.developerConfiguration.featureGates";

/// Service accounts of kubevirt-rs components (rendered by virt-operator and
/// `cargo xtask deploy` in virt-apiserver's namespace). Their requests may write the
/// reserved labels and annotations.
pub const COMPONENT_SERVICE_ACCOUNTS: [&str; 4] = [
    "kubevirt-apiserver",
    "virt-controller",
    "virt-handler",
    "virt-operator",
];

/// Reserved key prefixes: only components write keys under them, [`USER_SETTABLE`] excepted.
pub const RESERVED_PREFIXES: [&str; 2] = ["kubevirt.io/", "kubevirt-rs.io/"];

/// Keys under the reserved prefixes that users set: KubeVirt's documented user labels
/// (`kubevirt.io/domain`, `kubevirt.io/size`, `kubevirt.io/vm`, `kubevirt.io/os`, used in
/// its examples and preset selectors) and user annotations, and kubevirt-rs's own knobs.
pub const USER_SETTABLE: [&str; 11] = [
    "kubevirt.io/domain",
    "kubevirt.io/size",
    "kubevirt.io/vm",
    "kubevirt.io/os",
    "kubevirt.io/allow-pod-bridge-network-live-migration",
    "kubevirt.io/keep-launcher-alive-after-failure",
    "kubevirt.io/libvirt-log-filters",
    "kubevirt.io/ignitiondata",
    "kubevirt.io/placePCIDevicesOnRootComplex",
    // Read by virt-handler from the VMI: the migration's bandwidth (docs/node.md).
    "kubevirt-rs.io/migration-bandwidth-mib",
    // Read by virt-controller from the VMI: what becomes of a claim a migration copied
    // (docs/architecture.md, "Persistent disks").
    crate::migration::names::MIGRATED_CLAIM_POLICY_ANNOTATION,
];

/// The user extra kube-apiserver puts on a pod-bound service account token: the node the
/// pod runs on (Kubernetes ≥ 1.30, `ServiceAccountTokenPodNodeInfo`).
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

/// virt-handler's service account (one of [`COMPONENT_SERVICE_ACCOUNTS`]).
const HANDLER_SERVICE_ACCOUNT: &str = "virt-handler";

/// Who is writing, as far as the policy cares.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Actor {
    /// Anyone else: every rule applies.
    #[default]
    User,
    /// A kubevirt-rs service account or `system:masters`: may write reserved keys.
    Component,
    /// A virt-handler, speaking for the node its pod-bound token names (empty when it
    /// names none): it may write only the VMIs of that node, as KubeVirt's node
    /// restriction has it. Without this a handler's token, stolen on one node, could
    /// rewrite every VMI of the cluster (N7 of the security review at bd37f96).
    Handler {
        /// The node.
        node: String,
    },
    /// virt-apiserver's own read-modify-writes (action subresources), already
    /// authorized for what they do: may also change a VMI's spec.
    Server,
}

impl Actor {
    /// The actor of an authenticated user: virt-handler's service account in `namespace`
    /// speaks for the node its token names (`extra`, [`NODE_NAME_EXTRA`]); the other
    /// [`COMPONENT_SERVICE_ACCOUNTS`] in `namespace` and `system:masters` are components.
    pub fn of(
        user: &str,
        groups: &[String],
        extra: &BTreeMap<String, Vec<String>>,
        namespace: &str,
    ) -> Self {
        let sa = user
            .strip_prefix("system:serviceaccount:")
            .and_then(|rest| rest.split_once(':'))
            .filter(|(ns, _)| *ns == namespace)
            .map(|(_, name)| name);
        if groups.iter().any(|g| g == "system:masters") {
            return Self::Component;
        }
        match sa {
            Some(HANDLER_SERVICE_ACCOUNT) => Self::Handler {
                node: extra
                    .get(NODE_NAME_EXTRA)
                    .and_then(|v| v.first())
                    .cloned()
                    .unwrap_or_default(),
            },
            Some(name) if COMPONENT_SERVICE_ACCOUNTS.contains(&name) => Self::Component,
            _ => Self::User,
        }
    }

    /// May write the reserved labels and annotations.
    pub(crate) fn may_write_reserved(&self) -> bool {
        matches!(self, Self::Component | Self::Server)
    }
}

/// What a virt-handler speaking for `node` may not do to a VMI (`old` → `new`): anything to
/// a VMI that is neither on its node (`status.nodeName`) nor migrating to it (the target
/// node label), creating one, and changing which node or pods serve it — those decide where
/// consoles and migrations go, and are virt-controller's to write.
fn node_restriction(old: Option<&Value>, new: &Value, node: &str) -> Vec<FieldError> {
    let forbidden = |field: &str, why: String| vec![FieldError::forbidden(field, &why)];
    let Some(old) = old else {
        return forbidden(
            "metadata",
            format!("virt-handler of node {node:?} may not create VirtualMachineInstances"),
        );
    };
    let on = |v: &Value, p: &str| v.pointer(p).and_then(Value::as_str).map(str::to_string);
    let target_label = format!(
        "/metadata/labels/{}",
        crate::migration::names::MIGRATION_TARGET_NODE_NAME_LABEL.replace('/', "~1")
    );
    let here = !node.is_empty()
        && (on(old, "/status/nodeName").as_deref() == Some(node)
            || on(old, &target_label).as_deref() == Some(node));
    if !here {
        return forbidden(
            "metadata.name",
            format!(
                "virt-handler of node {node:?} may only write VirtualMachineInstances on that node"
            ),
        );
    }
    let mut errs = Vec::new();
    for (pointer, field) in [
        ("/status/nodeName", "status.nodeName"),
        ("/status/activePods", "status.activePods"),
    ] {
        if old.pointer(pointer) != new.pointer(pointer) {
            errs.push(FieldError::forbidden(
                field,
                "written by virt-controller only, not by virt-handler",
            ));
        }
    }
    errs
}

/// The KubeVirt feature gates the API enforces.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FeatureGates {
    /// `HostDisk`: hostDisk volumes are allowed.
    pub host_disk: bool,
    /// `HotplugVolumes`: the addvolume/removevolume subresources, a VM's requests queued in
    /// its `status.volumeRequests`.
    pub hotplug_volumes: bool,
    /// `DeclarativeHotplugVolumes`: the same subresources, a VM's requests applied to its
    /// template at once.
    pub declarative_hotplug_volumes: bool,
}

impl FeatureGates {
    /// Gates from their KubeVirt names; returns the names this server does not enforce
    /// (they are not errors: KubeVirt has many gates for features kubevirt-rs lacks).
    pub fn from_names<S: AsRef<str>>(names: &[S]) -> (Self, Vec<String>) {
        let mut gates = Self::default();
        let mut other = Vec::new();
        for n in names.iter().map(AsRef::as_ref).filter(|n| !n.is_empty()) {
            match n {
                HOST_DISK_GATE => gates.host_disk = true,
                HOTPLUG_VOLUMES_GATE => gates.hotplug_volumes = true,
                DECLARATIVE_HOTPLUG_VOLUMES_GATE => gates.declarative_hotplug_volumes = true,
                _ => other.push(n.to_string()),
            }
        }
        (gates, other)
    }

    /// Whether the enforced gate of this KubeVirt name is on (false for a gate this server
    /// does not know).
    pub fn enabled(&self, name: &str) -> bool {
        match name {
            HOST_DISK_GATE => self.host_disk,
            HOTPLUG_VOLUMES_GATE => self.hotplug_volumes,
            DECLARATIVE_HOTPLUG_VOLUMES_GATE => self.declarative_hotplug_volumes,
            _ => false,
        }
    }

    /// The gates this server enforces, by their KubeVirt names.
    pub const ENFORCED: [&'static str; 3] = [
        HOST_DISK_GATE,
        HOTPLUG_VOLUMES_GATE,
        DECLARATIVE_HOTPLUG_VOLUMES_GATE,
    ];
}

/// Every policy error of writing `new` over `old` (None on create) as `actor`: the rules
/// common to every kind (what virt-handler may write), then the kind's own
/// ([`crate::kinds::KindStrategy::admit`]).
pub fn admit(
    kind: &str,
    old: Option<&Value>,
    new: &Value,
    actor: &Actor,
    gates: &FeatureGates,
) -> Vec<FieldError> {
    admit_with(kind, old, new, actor, gates, None)
}

/// [`admit`] with the objects the kind's references named, read for this write.
pub fn admit_with(
    kind: &str,
    old: Option<&Value>,
    new: &Value,
    actor: &Actor,
    gates: &FeatureGates,
    found: Option<&[crate::kinds::Found]>,
) -> Vec<FieldError> {
    let Some(strategy) = crate::kinds::KindStrategy::by_kind(kind) else {
        return Vec::new();
    };
    let mut errs = Vec::new();
    if let Actor::Handler { node } = actor {
        if !strategy.handler_writes {
            return vec![FieldError::forbidden(
                "kind",
                &format!("virt-handler writes VirtualMachineInstances only, not {kind}"),
            )];
        }
        errs.extend(node_restriction(old, new, node));
    }
    errs.extend((strategy.admit)(&crate::kinds::Admission {
        old,
        new,
        actor,
        gates,
        found,
    }));
    errs
}

/// The policy of a `/status` write: spec and metadata come from the stored object there, so
/// only who writes is checked — virt-handler writes the status of its own node's VMIs only
/// (its node restriction), never which node or pods serve one.
pub fn admit_status(kind: &str, old: &Value, new: &Value, actor: &Actor) -> Vec<FieldError> {
    let Actor::Handler { node } = actor else {
        return Vec::new();
    };
    if !crate::kinds::KindStrategy::by_kind(kind).is_some_and(|s| s.handler_writes) {
        return vec![FieldError::forbidden(
            "kind",
            &format!("virt-handler writes VirtualMachineInstances only, not {kind}"),
        )];
    }
    node_restriction(Some(old), new, node)
}

/// hostDisk volumes of `new` (a VMI spec at `path`) that need the gate: all on create,
/// on update only those not already there unchanged, so objects created while the gate
/// was on can still be updated (finalizers removed, labels written) after it is off.
pub(crate) fn host_disk_gate(
    old: Option<&Value>,
    new: Option<&Value>,
    path: &str,
    gates: &FeatureGates,
) -> Vec<FieldError> {
    if gates.host_disk {
        return Vec::new();
    }
    let volumes = |spec: Option<&Value>| -> Vec<Value> {
        spec.and_then(|s| s.get("volumes"))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let before = volumes(old);
    volumes(new)
        .iter()
        .enumerate()
        .filter(|(_, v)| v.get("hostDisk").is_some())
        .filter(|(_, v)| !before.contains(v))
        .map(|(i, _)| {
            FieldError::forbidden(
                format!("{path}.volumes[{i}].hostDisk"),
                &format!(
                    "hostDisk volumes need the {HOST_DISK_GATE} feature gate, which is not enabled \
                     in the KubeVirt configuration ({GATES_FIELD})"
                ),
            )
        })
        .collect()
}

/// A VMI spec with the claim names of its `persistentVolumeClaim` volumes blanked: the
/// one change a component may make (a migration moved the volume to another claim).
pub(crate) fn without_claim_names(spec: Option<&Value>) -> Option<Value> {
    let mut spec = spec?.clone();
    for v in spec
        .get_mut("volumes")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        if let Some(c) = v.pointer_mut("/persistentVolumeClaim/claimName") {
            *c = Value::Null;
        }
    }
    Some(spec)
}

/// `spec` without what virt-controller changes on a running VMI under the `LiveUpdate`
/// rollout strategy, as KubeVirt's VM controller does: node selector, affinity,
/// tolerations, CPU sockets and the CPU requests and limits that follow them.
pub(crate) fn without_live_updatable(spec: Option<&Value>) -> Option<Value> {
    let mut spec = spec?.clone();
    if let Some(o) = spec.as_object_mut() {
        for k in ["nodeSelector", "affinity", "tolerations"] {
            o.remove(k);
        }
    }
    for p in [
        "/domain/cpu",
        "/domain/resources/requests",
        "/domain/resources/limits",
    ] {
        if let Some(o) = spec.pointer_mut(p).and_then(Value::as_object_mut) {
            o.remove(if p == "/domain/cpu" { "sockets" } else { "cpu" });
        }
    }
    Some(spec)
}

/// One `Forbidden: field is immutable` per top-level spec field that differs.
pub(crate) fn immutable_spec(old: Option<&Value>, new: Option<&Value>) -> Vec<FieldError> {
    let empty = serde_json::Map::new();
    let fields = |v: Option<&Value>| v.and_then(Value::as_object).unwrap_or(&empty).clone();
    let (old, new) = (fields(old), fields(new));
    let mut keys: Vec<&String> = old.keys().chain(new.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| old.get(*k) != new.get(*k))
        .map(|k| FieldError::forbidden(format!("spec.{k}"), "field is immutable"))
        .collect()
}

fn string_map(meta: Option<&Value>, field: &str) -> BTreeMap<String, String> {
    meta.and_then(|m| m.get(field))
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// Whether only kubevirt-rs components may set `key`.
pub fn is_reserved(key: &str) -> bool {
    RESERVED_PREFIXES.iter().any(|p| key.starts_with(p)) && !USER_SETTABLE.contains(&key)
}

/// Reserved labels and annotations that a non-component adds, changes or removes
/// between `old` and `new` metadata at `path`.
pub(crate) fn reserved_keys(
    old: Option<&Value>,
    new: Option<&Value>,
    path: &str,
) -> Vec<FieldError> {
    let mut errs = Vec::new();
    for field in ["labels", "annotations"] {
        let (before, after) = (string_map(old, field), string_map(new, field));
        let mut keys: Vec<&String> = before.keys().chain(after.keys()).collect();
        keys.sort();
        keys.dedup();
        for k in keys.into_iter().filter(|k| is_reserved(k)) {
            if before.get(k) != after.get(k) {
                errs.push(FieldError::forbidden(
                    format!("{path}.{field}[{k}]"),
                    &format!(
                        "{k} is reserved: only kubevirt-rs components set, change or remove it"
                    ),
                ));
            }
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::validation::ErrorType;
    use serde_json::json;

    const VM: &str = "VirtualMachine";
    const VMI: &str = "VirtualMachineInstance";
    const VMIM: &str = "VirtualMachineInstanceMigration";

    fn vmi(volumes: Value, labels: Value) -> Value {
        json!({"metadata": {"name": "v", "labels": labels},
               "spec": {"domain": {"devices": {}}, "volumes": volumes}})
    }

    fn host_disk() -> Value {
        json!([{"name": "h", "hostDisk": {"path": "/dev/sda", "type": "Disk"}}])
    }

    const OFF: FeatureGates = FeatureGates {
        host_disk: false,
        hotplug_volumes: false,
        declarative_hotplug_volumes: false,
    };
    const ON: FeatureGates = FeatureGates {
        host_disk: true,
        hotplug_volumes: false,
        declarative_hotplug_volumes: false,
    };

    #[test]
    fn gates_parse_by_kubevirt_name() {
        let (g, other) = FeatureGates::from_names(&["LiveMigration", "HostDisk", ""]);
        assert!(g.host_disk);
        assert_eq!(other, vec!["LiveMigration".to_string()]);
        assert!(!FeatureGates::from_names::<&str>(&[]).0.host_disk);
        let (g, other) = FeatureGates::from_names(&["HotplugVolumes", "DeclarativeHotplugVolumes"]);
        assert!(other.is_empty());
        assert!(g.hotplug_volumes && g.declarative_hotplug_volumes && !g.host_disk);
        assert!(g.enabled("HotplugVolumes") && !g.enabled("HostDisk") && !g.enabled("Nope"));
    }

    #[test]
    fn host_disk_needs_the_gate_for_everyone() {
        let new = vmi(host_disk(), json!({}));
        for actor in [Actor::User, Actor::Component, Actor::Server] {
            let errs = admit(VMI, None, &new, &actor, &OFF);
            assert_eq!(errs.len(), 1, "{actor:?}");
            assert_eq!(errs[0].field, "spec.volumes[0].hostDisk");
            assert_eq!(errs[0].kind, ErrorType::Forbidden);
            assert!(errs[0].message.contains("HostDisk feature gate"));
        }
        assert!(admit(VMI, None, &new, &Actor::User, &ON).is_empty());
        let vm = json!({"metadata": {}, "spec": {"template": {"spec": {"volumes": host_disk()}}}});
        let errs = admit(VM, None, &vm, &Actor::User, &OFF);
        assert_eq!(errs[0].field, "spec.template.spec.volumes[0].hostDisk");
    }

    #[test]
    fn an_existing_host_disk_does_not_block_updates_once_the_gate_is_off() {
        let vm = json!({"metadata": {}, "spec": {"running": false,
            "template": {"spec": {"volumes": host_disk()}}}});
        let mut started = vm.clone();
        started["spec"]["running"] = json!(true);
        assert!(admit(VM, Some(&vm), &started, &Actor::User, &OFF).is_empty());
        // A changed hostDisk is a new one.
        let mut moved = vm.clone();
        moved["spec"]["template"]["spec"]["volumes"][0]["hostDisk"]["path"] = json!("/etc");
        assert_eq!(admit(VM, Some(&vm), &moved, &Actor::User, &OFF).len(), 1);
    }

    #[test]
    fn vmi_spec_is_immutable_except_for_the_server() {
        let old = vmi(json!([]), json!({}));
        let new = vmi(host_disk(), json!({}));
        for actor in [Actor::User, Actor::Component] {
            let errs = admit(VMI, Some(&old), &new, &actor, &ON);
            assert_eq!(
                errs,
                vec![FieldError::forbidden("spec.volumes", "field is immutable")]
            );
            assert_eq!(
                errs[0].to_string(),
                "spec.volumes: Forbidden: field is immutable"
            );
        }
        assert!(admit(VMI, Some(&old), &new, &Actor::Server, &ON).is_empty());
        // A component may point a claim volume at another claim, and change nothing else.
        let claim = |name: &str| {
            vmi(
                json!([{"name": "d", "persistentVolumeClaim": {"claimName": name}}]),
                json!({}),
            )
        };
        let (before, after) = (claim("data"), claim("data-mig-1a2b3"));
        assert!(admit(VMI, Some(&before), &after, &Actor::Component, &ON).is_empty());
        assert_eq!(
            admit(VMI, Some(&before), &after, &Actor::User, &ON),
            vec![FieldError::forbidden("spec.volumes", "field is immutable")]
        );
        let mut read_only = after.clone();
        read_only["spec"]["volumes"][0]["persistentVolumeClaim"]["readOnly"] = json!(true);
        assert_eq!(
            admit(VMI, Some(&before), &read_only, &Actor::Component, &ON),
            vec![FieldError::forbidden("spec.volumes", "field is immutable")]
        );
        // A component (virt-controller) may hotplug volumes with their disks into a
        // running VMI and unplug them, nothing else of the volumes.
        let mut hot = old.clone();
        hot["spec"]["volumes"] = json!([{"name": "h",
            "persistentVolumeClaim": {"claimName": "c", "hotpluggable": true}}]);
        hot["spec"]["domain"]["devices"]["disks"] = json!([{"name": "h", "disk": {"bus": "scsi"}}]);
        assert!(admit(VMI, Some(&old), &hot, &Actor::Component, &ON).is_empty());
        assert!(admit(VMI, Some(&hot), &old, &Actor::Component, &ON).is_empty());
        assert_eq!(
            admit(VMI, Some(&old), &hot, &Actor::User, &ON).len(),
            2,
            "volumes and domain"
        );
        let mut cold = hot.clone();
        cold["spec"]["volumes"][0]["persistentVolumeClaim"]["hotpluggable"] = json!(false);
        assert_eq!(
            admit(VMI, Some(&old), &cold, &Actor::Component, &ON).len(),
            2
        );
        // Removing a field is a change too; metadata and status are not the spec.
        let mut no_volumes = old.clone();
        no_volumes["spec"]
            .as_object_mut()
            .unwrap()
            .remove("volumes");
        assert_eq!(
            admit(VMI, Some(&old), &no_volumes, &Actor::User, &ON).len(),
            1
        );
        let mut relabelled = old.clone();
        relabelled["metadata"]["labels"] = json!({"app": "x"});
        relabelled["status"] = json!({"phase": "Running"});
        assert!(admit(VMI, Some(&old), &relabelled, &Actor::User, &ON).is_empty());
    }

    #[test]
    fn a_component_carries_live_updates_to_a_vmi_and_nothing_else() {
        let old = json!({"metadata": {"name": "v"}, "spec": {
            "nodeSelector": {"zone": "a"},
            "domain": {"cpu": {"sockets": 1, "cores": 1, "maxSockets": 4},
                       "resources": {"requests": {"cpu": "1", "memory": "64Mi"}}}}});
        let mut new = old.clone();
        new["spec"].as_object_mut().unwrap().remove("nodeSelector");
        new["spec"]["tolerations"] = json!([{"key": "k", "operator": "Exists"}]);
        new["spec"]["affinity"] = json!({"nodeAffinity": {}});
        new["spec"]["domain"]["cpu"]["sockets"] = json!(2);
        new["spec"]["domain"]["resources"]["requests"]["cpu"] = json!("2");
        assert!(admit(VMI, Some(&old), &new, &Actor::Component, &ON).is_empty());
        assert_eq!(
            admit(VMI, Some(&old), &new, &Actor::User, &ON)
                .iter()
                .map(|e| e.field.as_str())
                .collect::<Vec<_>>(),
            [
                "spec.affinity",
                "spec.domain",
                "spec.nodeSelector",
                "spec.tolerations"
            ]
        );
        let mut cores = new.clone();
        cores["spec"]["domain"]["cpu"]["cores"] = json!(2);
        assert_eq!(
            admit(VMI, Some(&old), &cores, &Actor::Component, &ON),
            vec![FieldError::forbidden("spec.domain", "field is immutable")]
        );
        let mut memory = new.clone();
        memory["spec"]["domain"]["resources"]["requests"]["memory"] = json!("128Mi");
        assert_eq!(
            admit(VMI, Some(&old), &memory, &Actor::Component, &ON).len(),
            1
        );
    }

    #[test]
    fn vmim_spec_is_immutable_for_everyone() {
        let old = json!({"metadata": {}, "spec": {"vmiName": "a"}});
        let new = json!({"metadata": {"labels": {"x": "y"}}, "spec": {"vmiName": "b"}});
        for actor in [Actor::User, Actor::Component, Actor::Server] {
            let errs = admit(VMIM, Some(&old), &new, &actor, &OFF);
            assert_eq!(
                errs,
                vec![FieldError::forbidden("spec.vmiName", "field is immutable")]
            );
        }
        assert!(admit(VMIM, None, &new, &Actor::User, &OFF).is_empty());
    }

    #[test]
    fn reserved_keys_are_for_components() {
        let new = vmi(json!([]), json!({"kubevirt.io/nodeName": "n1", "app": "a"}));
        let errs = admit(VMI, None, &new, &Actor::User, &OFF);
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].field, "metadata.labels[kubevirt.io/nodeName]");
        assert!(errs[0].message.contains("kubevirt.io/nodeName is reserved"));
        assert!(admit(VMI, None, &new, &Actor::Component, &OFF).is_empty());

        // Unchanged reserved keys are fine in a user's update; changes and removals not.
        let kept = vmi(json!([]), json!({"kubevirt.io/nodeName": "n1", "app": "b"}));
        assert!(admit(VMI, Some(&new), &kept, &Actor::User, &OFF).is_empty());
        let moved = vmi(json!([]), json!({"kubevirt.io/nodeName": "n2"}));
        assert_eq!(admit(VMI, Some(&new), &moved, &Actor::User, &OFF).len(), 1);
        let removed = vmi(json!([]), json!({}));
        assert_eq!(
            admit(VMI, Some(&new), &removed, &Actor::User, &OFF).len(),
            1
        );
        assert!(admit(VMI, Some(&new), &removed, &Actor::Component, &OFF).is_empty());
    }

    #[test]
    fn reserved_keys_on_vms_and_their_templates_and_user_knobs() {
        let vm = json!({
            "metadata": {"labels": {"kubevirt.io/vm": "x"},
                         "annotations": {"kubevirt.io/created-by": "me"}},
            "spec": {"template": {
                "metadata": {"labels": {"kubevirt.io/domain": "d", "kubevirt.io/migrationTargetNodeName": "n"},
                             "annotations": {"kubevirt-rs.io/migration-bandwidth-mib": "64",
                                             "kubevirt-rs.io/vmi": "x",
                                             "kubevirt.io/allow-pod-bridge-network-live-migration": ""}},
                "spec": {}}}
        });
        let fields: Vec<String> = admit(VM, None, &vm, &Actor::User, &OFF)
            .into_iter()
            .map(|e| e.field)
            .collect();
        assert_eq!(
            fields,
            vec![
                "metadata.annotations[kubevirt.io/created-by]",
                "spec.template.metadata.labels[kubevirt.io/migrationTargetNodeName]",
                "spec.template.metadata.annotations[kubevirt-rs.io/vmi]",
            ]
        );
        assert!(admit(VM, None, &vm, &Actor::Component, &OFF).is_empty());
        // Similar prefixes are not reserved.
        assert!(!is_reserved("vm.kubevirt.io/name"));
        assert!(!is_reserved("kubevirt.iox/a"));
        assert!(is_reserved("kubevirt.io/schedulable"));
    }

    /// N7 of the security review at bd37f96: a handler's identity writes only the VMIs of
    /// its own node (or migrating to it), and never which node or pods serve them.
    #[test]
    fn a_handler_writes_only_the_vmis_of_its_node() {
        let on = |node: &str, target: Option<&str>| {
            let mut v = vmi(json!([]), json!({}));
            v["status"] = json!({"nodeName": node, "activePods": {"p1": node}});
            if let Some(t) = target {
                v["metadata"]["labels"] = json!({"kubevirt.io/migrationTargetNodeName": t});
            }
            v
        };
        let a = Actor::Handler { node: "a".into() };
        let mut running = on("a", None);
        running["status"]["phase"] = json!("Running");
        assert!(admit(VMI, Some(&on("a", None)), &running, &a, &OFF).is_empty());
        // Another node's VMI, even with the status it would write.
        let mut theirs = on("b", None);
        theirs["status"]["phase"] = json!("Running");
        let errs = admit(VMI, Some(&on("b", None)), &theirs, &a, &OFF);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(errs[0].message.contains("may only write"), "{errs:?}");
        // A VMI migrating to it: yes (the target's status).
        let incoming = on("b", Some("a"));
        assert!(admit(VMI, Some(&incoming), &incoming, &a, &OFF).is_empty());
        // Never where the VMI runs or which pods serve it.
        let mut moved = on("a", None);
        moved["status"]["nodeName"] = json!("b");
        moved["status"]["activePods"] = json!({"evil": "a"});
        let fields: Vec<String> = admit(VMI, Some(&on("a", None)), &moved, &a, &OFF)
            .into_iter()
            .map(|e| e.field)
            .collect();
        assert_eq!(fields, ["status.nodeName", "status.activePods"]);
        // The same through /status, where the rest of the policy has nothing to check.
        assert_eq!(admit_status(VMI, &on("b", None), &theirs, &a).len(), 1);
        assert!(admit_status(VMI, &on("a", None), &running, &a).is_empty());
        assert_eq!(admit_status(VMI, &on("a", None), &moved, &a).len(), 2);
        assert!(admit_status(VMI, &on("b", None), &theirs, &Actor::Component).is_empty());
        // No creates, no other kinds; a token that names no node writes nothing.
        assert_eq!(admit(VMI, None, &on("a", None), &a, &OFF).len(), 1);
        assert_eq!(admit(VM, None, &json!({"metadata": {}}), &a, &OFF).len(), 1);
        let nowhere = Actor::Handler {
            node: String::new(),
        };
        assert_eq!(
            admit(VMI, Some(&on("", None)), &on("", None), &nowhere, &OFF).len(),
            1
        );
        // Its service account is a handler for the node its token names.
        let extra = BTreeMap::from([(NODE_NAME_EXTRA.to_string(), vec!["a".to_string()])]);
        assert_eq!(
            Actor::of(
                "system:serviceaccount:kubevirt:virt-handler",
                &[],
                &extra,
                "kubevirt"
            ),
            a
        );
    }

    #[test]
    fn reserved_keys_on_migrations_are_for_components() {
        let new = json!({"metadata": {"labels": {"kubevirt.io/vmi-name": "other"}},
                         "spec": {"vmiName": "mine"}});
        let errs = admit(VMIM, None, &new, &Actor::User, &OFF);
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].field, "metadata.labels[kubevirt.io/vmi-name]");
        assert!(admit(VMIM, None, &new, &Actor::Server, &OFF).is_empty());
    }

    #[test]
    fn components_are_our_service_accounts_and_masters() {
        let none: Vec<String> = Vec::new();
        let extra = BTreeMap::new();
        for sa in COMPONENT_SERVICE_ACCOUNTS
            .iter()
            .filter(|s| **s != "virt-handler")
        {
            let user = format!("system:serviceaccount:kubevirt:{sa}");
            assert_eq!(
                Actor::of(&user, &none, &extra, "kubevirt"),
                Actor::Component
            );
            assert_eq!(Actor::of(&user, &none, &extra, "other"), Actor::User);
        }
        assert_eq!(
            Actor::of(
                "system:serviceaccount:kubevirt:default",
                &none,
                &extra,
                "kubevirt"
            ),
            Actor::User
        );
        assert_eq!(
            Actor::of(
                "system:serviceaccount:kubevirt:virt-handler:x",
                &none,
                &extra,
                "kubevirt"
            ),
            Actor::User
        );
        assert_eq!(Actor::of("alice", &none, &extra, "kubevirt"), Actor::User);
        assert_eq!(
            Actor::of("admin", &["system:masters".to_string()], &extra, "kubevirt"),
            Actor::Component
        );
    }
}
