//! The API catalogue: every kind and every subresource kubevirt-rs serves, declared once.
//!
//! Discovery, OpenAPI, the authorisation attributes, the operator's RBAC roles and the
//! plugin's request paths are derived from these values, so adding a subresource is one
//! entry here plus its handler. Pure data: no transport.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::hotplug::{AddVolumeOptions, RemoveVolumeOptions};
use crate::options::{
    EvacuateCancelOptions, FreezeUnfreezeTimeout, MigrateOptions, OptionsError, RestartOptions,
    StartOptions, StopOptions, decode, decode_dry_run, dry_run_all, is_dry_run,
};
use crate::{GROUP, SUBRESOURCES_GROUP, VERSION};

/// A printer column of `kubectl get` (a Table column after NAME).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    /// Header (kubectl upper-cases it).
    pub name: &'static str,
    /// `string`, `date`, `integer`, `boolean`.
    pub type_: &'static str,
    /// `name` for the first column.
    pub format: &'static str,
    /// Shown by `kubectl explain` and `-o wide --show-kind`.
    pub description: &'static str,
    /// 0 = always shown, 1 = only with `-o wide`.
    pub priority: i32,
}

pub const fn column(name: &'static str, description: &'static str, priority: i32) -> Column {
    Column {
        name,
        type_: "string",
        format: "",
        description,
        priority,
    }
}

pub const AGE: Column = Column {
    name: "Age",
    type_: "date",
    format: "",
    description: "CreationTimestamp is a timestamp representing the server time when this object was created.",
    priority: 0,
};

/// A kind we serve.
#[derive(Debug, PartialEq, Eq)]
pub struct Kind {
    /// API group (`kubevirt.io`, `instancetype.kubevirt.io`).
    pub group: &'static str,
    /// The version served.
    pub version: &'static str,
    pub kind: &'static str,
    pub list_kind: &'static str,
    /// Resource name (URL segment).
    pub plural: &'static str,
    pub singular: &'static str,
    pub short_names: &'static [&'static str],
    pub categories: &'static [&'static str],
    pub namespaced: bool,
    /// Has a `/status` subresource (status is ignored on the main resource).
    pub has_status: bool,
    /// Has a `/scale` subresource (`autoscaling/v1` Scale of `spec.replicas`,
    /// `status.replicas` and `status.labelSelector`), so `kubectl scale` and an HPA work.
    pub has_scale: bool,
    /// Answered on create and stored nothing (UploadTokenRequest, like TokenReview): the
    /// only verb is `create`, and the answer is the request with its status filled in.
    pub create_only: bool,
    /// Printer columns after NAME.
    pub columns: &'static [Column],
    /// One line for OpenAPI and `kubectl explain`.
    pub description: &'static str,
}

// Each kind's entry lives with its strategy (`crate::kinds`), registered once there.
pub use crate::kinds::kubevirt::KIND as KUBEVIRT;
pub use crate::kinds::vm::KIND as VIRTUAL_MACHINE;
pub use crate::kinds::vmi::KIND as VIRTUAL_MACHINE_INSTANCE;
pub use crate::kinds::vmim::KIND as VIRTUAL_MACHINE_INSTANCE_MIGRATION;

/// Every kind, in the registration order (`crate::kinds::ALL`).
pub fn all_kinds() -> impl Iterator<Item = &'static Kind> + Clone {
    crate::kinds::ALL.iter().map(|s| s.meta)
}

/// The kinds stored in virt-apiserver's etcd, in the registration order.
pub fn stored() -> impl Iterator<Item = &'static Kind> + Clone {
    crate::kinds::KindStrategy::stored().map(|s| s.meta)
}

/// The kind with this plural name.
pub fn kind_by_plural(plural: &str) -> Option<&'static Kind> {
    all_kinds().find(|k| k.plural == plural)
}

/// The API groups of our kinds, each once, in the registration order.
pub fn kind_groups() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for k in all_kinds() {
        if !out.contains(&(k.group, k.version)) {
            out.push((k.group, k.version));
        }
    }
    out
}

/// How a subresource is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// `PUT` with an options body (the kind named in OpenAPI, `None` when it takes none);
    /// RBAC verb `update`.
    Action { options: Option<&'static str> },
    /// `GET` upgraded to a websocket; RBAC verb `get` (it reaches into the guest).
    Stream,
    /// `GET` answered with a JSON document of kind `answer` (what the guest agent reports);
    /// RBAC verb `get`, which `view` grants, as KubeVirt's view role does.
    Read { answer: &'static str },
}

/// A subresource of `subresources.kubevirt.io/v1`.
#[derive(Debug, PartialEq, Eq)]
pub struct Subresource {
    pub kind: &'static Kind,
    pub name: &'static str,
    pub style: Style,
    pub description: &'static str,
    /// Path segments after the name, each optional from the right
    /// (`portforward/{port}[/{protocol}]`), with their descriptions.
    pub path_params: &'static [(&'static str, &'static str)],
    /// A fixed segment after the name (`evacuate/cancel`); RBAC and discovery see the name
    /// only, as Kubernetes' RequestInfo takes one segment for the subresource.
    pub suffix: &'static str,
}

impl Subresource {
    /// HTTP method of a call.
    pub fn http_method(&self) -> &'static str {
        match self.style {
            Style::Action { .. } => "PUT",
            Style::Stream | Style::Read { .. } => "GET",
        }
    }

    /// The verb RBAC and SubjectAccessReview see.
    pub fn rbac_verb(&self) -> &'static str {
        match self.style {
            Style::Action { .. } => "update",
            Style::Stream | Style::Read { .. } => "get",
        }
    }

    /// `virtualmachines/start`, as RBAC rules and discovery name it.
    pub fn resource(&self) -> String {
        format!("{}/{}", self.kind.plural, self.name)
    }

    /// The request path of a call on object `name` in `namespace`. Names and namespaces are
    /// DNS labels or subdomains (validated by the callers), so nothing needs escaping.
    pub fn path(&self, namespace: &str, name: &str) -> String {
        format!(
            "/apis/{SUBRESOURCES_GROUP}/{VERSION}/namespaces/{namespace}/{}/{name}/{}",
            self.kind.plural,
            self.path_name()
        )
    }

    /// The name with its fixed suffix: the path segments after the object's name.
    pub fn path_name(&self) -> String {
        if self.suffix.is_empty() {
            self.name.to_string()
        } else {
            format!("{}/{}", self.name, self.suffix)
        }
    }

    pub fn is_stream(&self) -> bool {
        self.style == Style::Stream
    }

    /// A `GET` of a document (not a stream).
    pub fn is_read(&self) -> bool {
        matches!(self.style, Style::Read { .. })
    }
}

const fn action(
    kind: &'static Kind,
    name: &'static str,
    options: Option<&'static str>,
    description: &'static str,
) -> Subresource {
    Subresource {
        kind,
        name,
        style: Style::Action { options },
        description,
        path_params: &[],
        suffix: "",
    }
}

pub const START: Subresource = action(
    &VIRTUAL_MACHINE,
    "start",
    Some("StartOptions"),
    "Start a VirtualMachine.",
);
pub const STOP: Subresource = action(
    &VIRTUAL_MACHINE,
    "stop",
    Some("StopOptions"),
    "Stop a VirtualMachine.",
);
pub const RESTART: Subresource = action(
    &VIRTUAL_MACHINE,
    "restart",
    Some("RestartOptions"),
    "Restart a VirtualMachine.",
);
pub const MIGRATE: Subresource = action(
    &VIRTUAL_MACHINE,
    "migrate",
    Some("MigrateOptions"),
    "Live-migrate the VirtualMachine's instance to another node.",
);
pub const PAUSE: Subresource = action(
    &VIRTUAL_MACHINE_INSTANCE,
    "pause",
    Some("PauseOptions"),
    "Pause a VirtualMachineInstance.",
);
pub const UNPAUSE: Subresource = action(
    &VIRTUAL_MACHINE_INSTANCE,
    "unpause",
    Some("UnpauseOptions"),
    "Unpause a VirtualMachineInstance.",
);
pub const SOFTREBOOT: Subresource = action(
    &VIRTUAL_MACHINE_INSTANCE,
    "softreboot",
    None,
    "Soft-reboot a VirtualMachineInstance through the guest agent or ACPI.",
);
pub const RESET: Subresource = action(
    &VIRTUAL_MACHINE_INSTANCE,
    "reset",
    None,
    "Reset a VirtualMachineInstance: the reset button, the guest restarts at once without shutting down.",
);
pub const FREEZE: Subresource = action(
    &VIRTUAL_MACHINE_INSTANCE,
    "freeze",
    Some("FreezeUnfreezeTimeout"),
    "Freeze the file systems of a VirtualMachineInstance's guest through its guest agent (for a consistent snapshot), until unfreeze or the unfreeze timeout.",
);
pub const UNFREEZE: Subresource = action(
    &VIRTUAL_MACHINE_INSTANCE,
    "unfreeze",
    None,
    "Thaw the file systems of a VirtualMachineInstance's guest.",
);
pub const ADDVOLUME_VM: Subresource = action(
    &VIRTUAL_MACHINE,
    "addvolume",
    Some("AddVolumeOptions"),
    "Hotplug a volume into a VirtualMachine: added to its template (and so to its running instance), through status.volumeRequests under the HotplugVolumes feature gate.",
);
pub const REMOVEVOLUME_VM: Subresource = action(
    &VIRTUAL_MACHINE,
    "removevolume",
    Some("RemoveVolumeOptions"),
    "Remove a hotplugged volume from a VirtualMachine's template (and so from its running instance).",
);
pub const ADDVOLUME_VMI: Subresource = action(
    &VIRTUAL_MACHINE_INSTANCE,
    "addvolume",
    Some("AddVolumeOptions"),
    "Hotplug a volume into a running VirtualMachineInstance until it stops.",
);
pub const REMOVEVOLUME_VMI: Subresource = action(
    &VIRTUAL_MACHINE_INSTANCE,
    "removevolume",
    Some("RemoveVolumeOptions"),
    "Unplug a hotplugged volume from a running VirtualMachineInstance.",
);
const fn read(name: &'static str, answer: &'static str, description: &'static str) -> Subresource {
    Subresource {
        kind: &VIRTUAL_MACHINE_INSTANCE,
        name,
        style: Style::Read { answer },
        description,
        path_params: &[],
        suffix: "",
    }
}
pub const GUESTOSINFO: Subresource = read(
    "guestosinfo",
    crate::guestagent::GUEST_AGENT_INFO_KIND,
    "Get what the guest agent of a VirtualMachineInstance reports: its version and commands, the guest's OS, host name, time zone, logged-in users and file systems.",
);
pub const USERLIST: Subresource = read(
    "userlist",
    crate::guestagent::USER_LIST_KIND,
    "Get the users logged in to a VirtualMachineInstance's guest, from its guest agent.",
);
pub const FILESYSTEMLIST: Subresource = read(
    "filesystemlist",
    crate::guestagent::FILESYSTEM_LIST_KIND,
    "Get the mounted file systems of a VirtualMachineInstance's guest and their usage, from its guest agent.",
);
pub const CONSOLE: Subresource = Subresource {
    kind: &VIRTUAL_MACHINE_INSTANCE,
    name: "console",
    style: Style::Stream,
    description: "Open a websocket to the serial console of a VirtualMachineInstance.",
    path_params: &[],
    suffix: "",
};
pub const VNC: Subresource = Subresource {
    kind: &VIRTUAL_MACHINE_INSTANCE,
    name: "vnc",
    style: Style::Stream,
    description: "Open a websocket to the VNC display of a VirtualMachineInstance.",
    path_params: &[],
    suffix: "",
};
const PORT_PARAMS: &[(&str, &str)] = &[
    ("port", "The port of the guest to forward to (1-65535)."),
    ("protocol", "tcp (the default) or udp."),
];
pub const PORTFORWARD_VMI: Subresource = Subresource {
    kind: &VIRTUAL_MACHINE_INSTANCE,
    name: "portforward",
    style: Style::Stream,
    description: "Open a websocket carrying one connection to a port of the VirtualMachineInstance's guest.",
    path_params: PORT_PARAMS,
    suffix: "",
};
pub const PORTFORWARD_VM: Subresource = Subresource {
    kind: &VIRTUAL_MACHINE,
    name: "portforward",
    style: Style::Stream,
    description: "Open a websocket carrying one connection to a port of the VirtualMachine's running guest.",
    path_params: PORT_PARAMS,
    suffix: "",
};
pub const EVACUATE_CANCEL_VMI: Subresource = Subresource {
    suffix: "cancel",
    ..action(
        &VIRTUAL_MACHINE_INSTANCE,
        "evacuate",
        Some("EvacuateCancelOptions"),
        "Cancel the evacuation of a VirtualMachineInstance (a node drain or eviction): its evacuation migration is stopped and it stays on its node.",
    )
};
pub const EVACUATE_CANCEL_VM: Subresource = Subresource {
    suffix: "cancel",
    ..action(
        &VIRTUAL_MACHINE,
        "evacuate",
        Some("EvacuateCancelOptions"),
        "Cancel the evacuation of the VirtualMachine's running instance (a node drain or eviction).",
    )
};

/// `namespaces/{ns}/expand-vm-spec`: `PUT` a VirtualMachine, get it back expanded (upstream
/// `virtctl expand --file`). An endpoint on no object: RBAC sees it as the resource, verb
/// `update`, as KubeVirt's roles name it.
pub const EXPAND_VM_SPEC: &str = "expand-vm-spec";

pub const EXPAND_SPEC: Subresource = Subresource {
    kind: &VIRTUAL_MACHINE,
    name: "expand-spec",
    style: Style::Read {
        answer: "VirtualMachine",
    },
    description: "Get the VirtualMachine with its instance type and preference written into its template and both references dropped (upstream `virtctl expand --vm`).",
    path_params: &[],
    suffix: "",
};

/// Every subresource served under `subresources.kubevirt.io/v1`. What is listed here is
/// advertised in discovery and OpenAPI and granted by the user roles; virt-apiserver's tests
/// fail when one has no handler.
pub const SUBRESOURCES: [&Subresource; 24] = [
    &START,
    &STOP,
    &RESTART,
    &MIGRATE,
    &PAUSE,
    &UNPAUSE,
    &SOFTREBOOT,
    &RESET,
    &FREEZE,
    &UNFREEZE,
    &CONSOLE,
    &VNC,
    &PORTFORWARD_VMI,
    &PORTFORWARD_VM,
    &EVACUATE_CANCEL_VMI,
    &EVACUATE_CANCEL_VM,
    &GUESTOSINFO,
    &USERLIST,
    &FILESYSTEMLIST,
    &EXPAND_SPEC,
    &ADDVOLUME_VM,
    &REMOVEVOLUME_VM,
    &ADDVOLUME_VMI,
    &REMOVEVOLUME_VMI,
];

/// The subresources of one kind.
pub fn subresources_of(kind: &Kind) -> impl Iterator<Item = &'static Subresource> + '_ {
    SUBRESOURCES.into_iter().filter(move |s| s.kind == kind)
}

/// The subresource `name` of the kind with this plural name.
pub fn subresource(plural: &str, name: &str) -> Option<&'static Subresource> {
    SUBRESOURCES
        .into_iter()
        .find(|s| s.kind.plural == plural && s.name == name)
}

/// An action virt-handler carries out on a VMI's guest through its launcher, with its
/// options. virt-apiserver decodes it from the request ([`VmiActionDef::decode`]), virt-handler
/// checks it against the domain's state ([`VmiActionDef::refusal`]) and sends it to the
/// launcher as it is: serialized, it is the launcher protocol's request, tagged `op` with the
/// names older launchers already read (`{"op":"pause"}`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum VmiAction {
    /// Pause the guest's vCPUs.
    Pause,
    /// Resume the guest's vCPUs.
    Unpause,
    /// ACPI reboot request.
    SoftReboot,
    /// Hard reset (the reset button): the guest restarts at once, nothing shuts down.
    Reset,
    /// Freeze the guest's file systems (guest agent); thawed after the timeout unless
    /// unfrozen first (0: no timeout).
    Freeze { unfreeze_timeout_seconds: u64 },
    /// Thaw the guest's file systems.
    Unfreeze,
}

impl VmiAction {
    /// Its catalogue entry. The one match over the actions outside the launcher, which
    /// carries them out.
    pub fn def(&self) -> &'static VmiActionDef {
        match self {
            Self::Pause => &PAUSE_ACTION,
            Self::Unpause => &UNPAUSE_ACTION,
            Self::SoftReboot => &SOFTREBOOT_ACTION,
            Self::Reset => &RESET_ACTION,
            Self::Freeze { .. } => &FREEZE_ACTION,
            Self::Unfreeze => &UNFREEZE_ACTION,
        }
    }

    /// The subresource's name (`pause`), as paths, logs and metrics labels name it.
    pub fn name(&self) -> &'static str {
        self.def().subresource.name
    }
}

/// What a VMI action requires of the guest's paused state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PausedRule {
    /// Allowed either way.
    Either,
    /// Refused (409, with this message) while the guest is paused.
    NotPaused(&'static str),
    /// Refused (409, with this message) while the guest runs.
    Paused(&'static str),
}

/// The `kubectl virt` command of a VMI action, as upstream virtctl spells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActionCommand {
    /// Subcommand name.
    pub name: &'static str,
    /// One line of help (no final period, like the plugin's other commands).
    pub about: &'static str,
    /// Takes `vm|vmi NAME` (a VM's action goes to its instance) rather than a VMI's name.
    pub vm_or_vmi: bool,
    /// Offers `--dry-run`.
    pub dry_run: bool,
    /// The verb of the confirmation, `VMI a was scheduled to <verb>`.
    pub verb: &'static str,
}

/// A decoded VMI action request: the action, and whether it is a dry run.
pub type Decoded = (VmiAction, bool);

/// The facts of one VMI action: everything virt-apiserver, virt-handler and the plugin need,
/// so that none of them names an action.
#[derive(Debug)]
pub struct VmiActionDef {
    pub subresource: &'static Subresource,
    /// Checked by virt-handler against the domain's state, which is the truth (the VMI's
    /// Paused condition may lag).
    pub paused: PausedRule,
    /// virt-apiserver also checks `paused` on the VMI's Paused condition before it calls
    /// virt-handler (KubeVirt's virt-api does so for pause and unpause).
    pub checked_by_api: bool,
    /// Decodes a request body (empty: the defaults) into the action and whether it is a
    /// dry run; the type decoded is the one `subresource`'s options name.
    pub decode: fn(&[u8]) -> Result<Decoded, OptionsError>,
    /// The plugin's command; `None` when upstream virtctl has none.
    pub command: Option<ActionCommand>,
}

/// Compared by their subresource (each has its own): `decode` is a function pointer, whose
/// addresses are not reliable to compare.
impl PartialEq for VmiActionDef {
    fn eq(&self, other: &Self) -> bool {
        self.subresource == other.subresource
    }
}

impl Eq for VmiActionDef {}

impl VmiActionDef {
    /// The 409 message when the guest's paused state refuses this action.
    pub fn refusal(&self, paused: bool) -> Option<&'static str> {
        match (self.paused, paused) {
            (PausedRule::NotPaused(why), true) | (PausedRule::Paused(why), false) => Some(why),
            _ => None,
        }
    }
}

pub const PAUSE_ACTION: VmiActionDef = VmiActionDef {
    subresource: &PAUSE,
    paused: PausedRule::NotPaused("VMI is already paused"),
    checked_by_api: true,
    decode: |b| Ok((VmiAction::Pause, decode_dry_run(b)?)),
    command: Some(ActionCommand {
        name: "pause",
        about: "Pause a VM's or VMI's guest",
        vm_or_vmi: true,
        dry_run: true,
        verb: "pause",
    }),
};
pub const UNPAUSE_ACTION: VmiActionDef = VmiActionDef {
    subresource: &UNPAUSE,
    paused: PausedRule::Paused("VMI is not paused"),
    checked_by_api: true,
    decode: |b| Ok((VmiAction::Unpause, decode_dry_run(b)?)),
    command: Some(ActionCommand {
        name: "unpause",
        about: "Resume a paused VM or VMI",
        vm_or_vmi: true,
        dry_run: true,
        verb: "unpause",
    }),
};
pub const SOFTREBOOT_ACTION: VmiActionDef = VmiActionDef {
    subresource: &SOFTREBOOT,
    paused: PausedRule::NotPaused("VMI is paused"),
    checked_by_api: false,
    // No options type of its own; KubeVirt's clients may send PauseOptions' dryRun.
    decode: |b| Ok((VmiAction::SoftReboot, decode_dry_run(b)?)),
    command: Some(ActionCommand {
        name: "soft-reboot",
        about: "Ask the guest to reboot (ACPI or guest agent)",
        vm_or_vmi: false,
        dry_run: false,
        verb: "soft-reboot",
    }),
};
pub const RESET_ACTION: VmiActionDef = VmiActionDef {
    subresource: &RESET,
    paused: PausedRule::Either,
    checked_by_api: false,
    decode: |b| Ok((VmiAction::Reset, decode_dry_run(b)?)),
    command: Some(ActionCommand {
        name: "reset",
        about: "Reset the VMI at once, as the reset button (no guest shutdown)",
        vm_or_vmi: false,
        dry_run: false,
        verb: "reset",
    }),
};

pub const FREEZE_ACTION: VmiActionDef = VmiActionDef {
    subresource: &FREEZE,
    paused: PausedRule::Either,
    checked_by_api: false,
    decode: |b| {
        let o: FreezeUnfreezeTimeout = decode(b)?;
        // KubeVirt's virt-handler wording; the duration's whole seconds, as it takes them.
        let timeout = o.unfreeze_timeout.ok_or_else(|| {
            OptionsError::Invalid("Unfreeze timeout in freeze request is not set".into())
        })?;
        let d = crate::duration::parse(&timeout)
            .map_err(|e| OptionsError::Invalid(format!("unfreezeTimeout: {e}")))?;
        let unfreeze_timeout_seconds = d.as_secs();
        Ok((
            VmiAction::Freeze {
                unfreeze_timeout_seconds,
            },
            false,
        ))
    },
    // Upstream virtctl has no freeze command (VM snapshots call it).
    command: None,
};
pub const UNFREEZE_ACTION: VmiActionDef = VmiActionDef {
    subresource: &UNFREEZE,
    paused: PausedRule::Either,
    checked_by_api: false,
    // KubeVirt reads no body for unfreeze.
    decode: |_| Ok((VmiAction::Unfreeze, false)),
    command: None,
};

/// Every VMI action, in the order the plugin lists their commands.
pub const VMI_ACTIONS: [&VmiActionDef; 6] = [
    &PAUSE_ACTION,
    &UNPAUSE_ACTION,
    &SOFTREBOOT_ACTION,
    &RESET_ACTION,
    &FREEZE_ACTION,
    &UNFREEZE_ACTION,
];

/// The VMI action this subresource is, if it is one.
pub fn vmi_action(sub: &Subresource) -> Option<&'static VmiActionDef> {
    VMI_ACTIONS.into_iter().find(|a| a.subresource == sub)
}

/// The VMI action of this subresource name (the last segment of virt-handler's path).
pub fn vmi_action_named(name: &str) -> Option<&'static VmiActionDef> {
    VMI_ACTIONS.into_iter().find(|a| a.subresource.name == name)
}

/// An action virt-apiserver carries out itself, by editing objects (a VM's runStrategy or
/// `status.stateChangeRequests`, a migration, a VMI's evacuation mark), with its typed
/// options; the controllers act on the edits. virt-apiserver decodes it from the request
/// ([`VmActionDef::decode`]) and applies it in one match; the plugin builds it from its
/// command's flags ([`VmCommand::build`]) and sends it serialized, which is its options body.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum VmAction {
    Start(StartOptions),
    Stop(StopOptions),
    Restart(RestartOptions),
    Migrate(MigrateOptions),
    /// evacuate/cancel of a VM's running instance.
    EvacuateCancelVm(EvacuateCancelOptions),
    /// evacuate/cancel of a VMI.
    EvacuateCancelVmi(EvacuateCancelOptions),
    /// addvolume of a VM: its template, directly or through `status.volumeRequests`
    /// (boxed: a disk is large beside the other actions' options).
    AddVolumeVm(Box<AddVolumeOptions>),
    /// removevolume of a VM.
    RemoveVolumeVm(RemoveVolumeOptions),
    /// addvolume of a VMI: its spec, until it stops.
    AddVolumeVmi(Box<AddVolumeOptions>),
    /// removevolume of a VMI.
    RemoveVolumeVmi(RemoveVolumeOptions),
}

impl VmAction {
    /// Its catalogue entry.
    pub fn def(&self) -> &'static VmActionDef {
        match self {
            Self::Start(_) => &START_ACTION,
            Self::Stop(_) => &STOP_ACTION,
            Self::Restart(_) => &RESTART_ACTION,
            Self::Migrate(_) => &MIGRATE_ACTION,
            Self::EvacuateCancelVm(_) => &EVACUATE_CANCEL_VM_ACTION,
            Self::EvacuateCancelVmi(_) => &EVACUATE_CANCEL_VMI_ACTION,
            Self::AddVolumeVm(_) => &ADDVOLUME_VM_ACTION,
            Self::RemoveVolumeVm(_) => &REMOVEVOLUME_VM_ACTION,
            Self::AddVolumeVmi(_) => &ADDVOLUME_VMI_ACTION,
            Self::RemoveVolumeVmi(_) => &REMOVEVOLUME_VMI_ACTION,
        }
    }

    /// Whether its options ask for a dry run; the message of a 400 when their `dryRun` is
    /// not a valid one.
    pub fn dry_run(&self) -> Result<bool, String> {
        let d = match self {
            Self::Start(o) => &o.dry_run,
            Self::Stop(o) => &o.dry_run,
            Self::Restart(o) => &o.dry_run,
            Self::Migrate(o) => &o.dry_run,
            Self::EvacuateCancelVm(o) | Self::EvacuateCancelVmi(o) => &o.dry_run,
            Self::AddVolumeVm(o) | Self::AddVolumeVmi(o) => &o.dry_run,
            Self::RemoveVolumeVm(o) | Self::RemoveVolumeVmi(o) => &o.dry_run,
        };
        is_dry_run(d.as_deref())
    }
}

/// What a flag of a VM action's command takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlagValue {
    /// Nothing: given or not.
    Switch,
    /// One integer, negative ones too (the server words their refusal).
    Integer { value_name: &'static str },
    /// Repeatable, each a string.
    List { value_name: &'static str },
}

/// A flag of a VM action's command, as the plugin offers it (`--grace-period SECONDS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flag {
    /// The long name, without `--`.
    pub long: &'static str,
    /// Another spelling shown in help (upstream virtctl's camel case).
    pub alias: Option<&'static str>,
    /// One line of help (no final period).
    pub help: &'static str,
    pub value: FlagValue,
}

/// The values a command line gave to a command's [`Flag`]s, by their long names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FlagValues {
    pub switches: Vec<&'static str>,
    pub integers: Vec<(&'static str, i64)>,
    pub lists: Vec<(&'static str, Vec<String>)>,
}

impl FlagValues {
    pub fn switch(&self, long: &str) -> bool {
        self.switches.contains(&long)
    }

    pub fn integer(&self, long: &str) -> Option<i64> {
        self.integers
            .iter()
            .find(|(l, _)| *l == long)
            .map(|(_, v)| *v)
    }

    pub fn list(&self, long: &str) -> &[String] {
        self.lists
            .iter()
            .find(|(l, _)| *l == long)
            .map_or(&[], |(_, v)| v.as_slice())
    }
}

/// The `kubectl virt` command of a VM action, as upstream virtctl spells it: `NAME` (a VM's),
/// its [`Flag`]s, then `--dry-run`, which every VM action takes.
#[derive(Clone, Copy, Debug)]
pub struct VmCommand {
    /// Subcommand name.
    pub name: &'static str,
    /// One line of help (no final period, like the plugin's other commands).
    pub about: &'static str,
    /// Its flags before `--dry-run`, in the order help lists them.
    pub flags: &'static [Flag],
    /// It creates a migration: the plugin offers `--wait` to follow it and lists the command
    /// with its other migration commands.
    pub migrates: bool,
    /// The action of the flags given and `--dry-run`; a usage error's message when they do
    /// not make one, checked as virtctl checks them.
    pub build: fn(&FlagValues, bool) -> Result<VmAction, String>,
}

/// The facts of one VM action: everything virt-apiserver and the plugin need, so that
/// neither names an action outside virt-apiserver's one match that applies it.
#[derive(Debug)]
pub struct VmActionDef {
    pub subresource: &'static Subresource,
    /// Decodes a request body (empty: the defaults) into the action; the type decoded is the
    /// one `subresource`'s options name.
    pub decode: fn(&[u8]) -> Result<VmAction, OptionsError>,
    /// The verb of the plugin's confirmation, `VM a was scheduled to <verb>`.
    pub verb: &'static str,
    /// The plugin's command; `None` when the plugin offers it otherwise (evacuate-cancel
    /// also cancels a node's evacuations, addvolume looks the volume's source up).
    pub command: Option<VmCommand>,
    /// Feature gates of which one must be on (none: always served); otherwise a 400 with
    /// `gate_refusal`, before the body is read, as KubeVirt's virt-api answers.
    pub feature_gates: &'static [&'static str],
    pub gate_refusal: &'static str,
}

/// Compared by their subresource, as [`VmiActionDef`]s are.
impl PartialEq for VmActionDef {
    fn eq(&self, other: &Self) -> bool {
        self.subresource == other.subresource
    }
}

impl Eq for VmActionDef {}

const GRACE_PERIOD: &str = "grace-period";
const FORCE: &str = "force";

/// A flag without another spelling.
const fn flag(long: &'static str, help: &'static str, value: FlagValue) -> Flag {
    Flag {
        long,
        alias: None,
        help,
        value,
    }
}

const SECONDS: FlagValue = FlagValue::Integer {
    value_name: "SECONDS",
};

pub const START_ACTION: VmActionDef = VmActionDef {
    subresource: &START,
    feature_gates: &[],
    gate_refusal: "",
    decode: |b| Ok(VmAction::Start(decode(b)?)),
    verb: "start",
    command: Some(VmCommand {
        name: "start",
        about: "Start a virtual machine",
        flags: &[flag("paused", "Start the VM paused", FlagValue::Switch)],
        migrates: false,
        build: |f, dry_run| {
            Ok(VmAction::Start(StartOptions {
                paused: f.switch("paused"),
                dry_run: dry_run_all(dry_run),
            }))
        },
    }),
};
pub const STOP_ACTION: VmActionDef = VmActionDef {
    subresource: &STOP,
    feature_gates: &[],
    gate_refusal: "",
    decode: |b| Ok(VmAction::Stop(decode(b)?)),
    verb: "stop",
    command: Some(VmCommand {
        name: "stop",
        about: "Stop a virtual machine",
        flags: &[
            flag(
                GRACE_PERIOD,
                "Seconds the guest gets to shut down (only with --force)",
                SECONDS,
            ),
            flag(
                FORCE,
                "Stop immediately with the given --grace-period, overriding the VM's",
                FlagValue::Switch,
            ),
        ],
        migrates: false,
        // virtctl's checks: a grace period is only sent with --force, which needs one.
        build: |f, dry_run| {
            let grace_period = match (f.switch(FORCE), f.integer(GRACE_PERIOD)) {
                (true, None) => {
                    return Err(
                        "--force needs --grace-period (e.g. --force --grace-period=0)".into(),
                    );
                }
                (false, Some(_)) => {
                    return Err("--grace-period only takes effect together with --force".into());
                }
                (_, Some(g)) if g < 0 => {
                    return Err(format!("--grace-period must be 0 or more, got {g}"));
                }
                (_, g) => g,
            };
            Ok(VmAction::Stop(StopOptions {
                grace_period,
                dry_run: dry_run_all(dry_run),
            }))
        },
    }),
};
pub const RESTART_ACTION: VmActionDef = VmActionDef {
    subresource: &RESTART,
    feature_gates: &[],
    gate_refusal: "",
    decode: |b| Ok(VmAction::Restart(decode(b)?)),
    verb: "restart",
    command: Some(VmCommand {
        name: "restart",
        about: "Restart a virtual machine",
        flags: &[
            flag(
                GRACE_PERIOD,
                "Only 0 is supported, together with --force",
                SECONDS,
            ),
            flag(
                FORCE,
                "Restart immediately, without a graceful guest shutdown",
                FlagValue::Switch,
            ),
        ],
        migrates: false,
        // KubeVirt only supports an immediate forced restart (`gracePeriodSeconds: 0`), so
        // anything else is refused by the plugin rather than by a 400 from the server.
        build: |f, dry_run| {
            let grace_period_seconds = match (f.switch(FORCE), f.integer(GRACE_PERIOD)) {
                (true, None | Some(0)) => Some(0),
                (true, Some(g)) => {
                    return Err(format!(
                        "a forced restart only supports --grace-period=0, got {g}"
                    ));
                }
                (false, Some(_)) => {
                    return Err("--grace-period only takes effect together with --force".into());
                }
                (false, None) => None,
            };
            Ok(VmAction::Restart(RestartOptions {
                grace_period_seconds,
                dry_run: dry_run_all(dry_run),
            }))
        },
    }),
};
pub const MIGRATE_ACTION: VmActionDef = VmActionDef {
    subresource: &MIGRATE,
    feature_gates: &[],
    gate_refusal: "",
    decode: |b| Ok(VmAction::Migrate(decode(b)?)),
    verb: "migrate",
    command: Some(VmCommand {
        name: "migrate",
        about: "Live-migrate a VM's instance to another node",
        flags: &[Flag {
            long: "added-node-selector",
            alias: Some("addedNodeSelector"),
            help: "Extra node selector for the target, key=value[,key=value]",
            value: FlagValue::List {
                value_name: "K=V,…",
            },
        }],
        migrates: true,
        build: |f, dry_run| {
            let sel = parse_node_selector(f.list("added-node-selector"))?;
            Ok(VmAction::Migrate(MigrateOptions {
                added_node_selector: (!sel.is_empty()).then_some(sel),
                dry_run: dry_run_all(dry_run),
            }))
        },
    }),
};
pub const EVACUATE_CANCEL_VM_ACTION: VmActionDef = VmActionDef {
    subresource: &EVACUATE_CANCEL_VM,
    feature_gates: &[],
    gate_refusal: "",
    decode: |b| Ok(VmAction::EvacuateCancelVm(decode(b)?)),
    verb: "cancel its evacuation",
    command: None,
};
pub const EVACUATE_CANCEL_VMI_ACTION: VmActionDef = VmActionDef {
    subresource: &EVACUATE_CANCEL_VMI,
    feature_gates: &[],
    gate_refusal: "",
    decode: |b| Ok(VmAction::EvacuateCancelVmi(decode(b)?)),
    verb: "cancel its evacuation",
    command: None,
};

/// KubeVirt's 400 when neither hotplug gate is on.
pub const HOTPLUG_DISABLED: &str =
    "Enable DeclarativeHotplugVolumes or HotplugVolumes feature gate to use this API.";
/// KubeVirt's 400 for a volume request without a body.
pub const VOLUME_REQUEST_NO_BODY: &str =
    "Request with no body, a new name is expected as the request body";

/// An addvolume body in KubeVirt's normal form ([`AddVolumeOptions::normalized`]); the
/// request's missing parts are 400s with KubeVirt's words.
fn decode_add_volume(body: &[u8]) -> Result<AddVolumeOptions, OptionsError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(OptionsError::Invalid(VOLUME_REQUEST_NO_BODY.into()));
    }
    let o: AddVolumeOptions = decode(body)?;
    o.normalized()
        .map_err(|e| OptionsError::Invalid(e.to_string()))
}

fn decode_remove_volume(body: &[u8]) -> Result<RemoveVolumeOptions, OptionsError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(OptionsError::Invalid(VOLUME_REQUEST_NO_BODY.into()));
    }
    let o: RemoveVolumeOptions = decode(body)?;
    if o.name.is_empty() {
        return Err(OptionsError::Invalid(
            crate::hotplug::RequestError::RemoveNoName.to_string(),
        ));
    }
    Ok(o)
}

pub const ADDVOLUME_VM_ACTION: VmActionDef = VmActionDef {
    subresource: &ADDVOLUME_VM,
    feature_gates: &crate::hotplug::FEATURE_GATES,
    gate_refusal: HOTPLUG_DISABLED,
    decode: |b| Ok(VmAction::AddVolumeVm(Box::new(decode_add_volume(b)?))),
    verb: "add a volume",
    command: None,
};
pub const REMOVEVOLUME_VM_ACTION: VmActionDef = VmActionDef {
    subresource: &REMOVEVOLUME_VM,
    feature_gates: &crate::hotplug::FEATURE_GATES,
    gate_refusal: HOTPLUG_DISABLED,
    decode: |b| Ok(VmAction::RemoveVolumeVm(decode_remove_volume(b)?)),
    verb: "remove a volume",
    command: None,
};
pub const ADDVOLUME_VMI_ACTION: VmActionDef = VmActionDef {
    subresource: &ADDVOLUME_VMI,
    feature_gates: &crate::hotplug::FEATURE_GATES,
    gate_refusal: HOTPLUG_DISABLED,
    decode: |b| Ok(VmAction::AddVolumeVmi(Box::new(decode_add_volume(b)?))),
    verb: "add a volume",
    command: None,
};
pub const REMOVEVOLUME_VMI_ACTION: VmActionDef = VmActionDef {
    subresource: &REMOVEVOLUME_VMI,
    feature_gates: &crate::hotplug::FEATURE_GATES,
    gate_refusal: HOTPLUG_DISABLED,
    decode: |b| Ok(VmAction::RemoveVolumeVmi(decode_remove_volume(b)?)),
    verb: "remove a volume",
    command: None,
};

/// Every VM action, in the order the plugin lists their commands.
pub const VM_ACTIONS: [&VmActionDef; 10] = [
    &START_ACTION,
    &STOP_ACTION,
    &RESTART_ACTION,
    &MIGRATE_ACTION,
    &EVACUATE_CANCEL_VM_ACTION,
    &EVACUATE_CANCEL_VMI_ACTION,
    &ADDVOLUME_VM_ACTION,
    &REMOVEVOLUME_VM_ACTION,
    &ADDVOLUME_VMI_ACTION,
    &REMOVEVOLUME_VMI_ACTION,
];

/// The VM action this subresource is, if it is one.
pub fn vm_action(sub: &Subresource) -> Option<&'static VmActionDef> {
    VM_ACTIONS.into_iter().find(|a| a.subresource == sub)
}

/// Parses `k=v,k2=v2` (virtctl's `--addedNodeSelector`), repeatable.
pub fn parse_node_selector(raw: &[String]) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for item in raw.iter().flat_map(|s| s.split(',')) {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let Some((k, v)) = item.split_once('=') else {
            return Err(format!(
                "invalid node selector {item:?}: expected key=value"
            ));
        };
        if k.trim().is_empty() {
            return Err(format!("invalid node selector {item:?}: empty key"));
        }
        out.insert(k.trim().to_owned(), v.trim().to_owned());
    }
    Ok(out)
}

/// A question to a VMI's guest agent, answered by its launcher: serialized, the launcher
/// protocol's request (`{"op":"guestOsInfo"}`), as [`VmiAction`]s are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum GuestQuery {
    /// Everything the agent reports (`guestosinfo`).
    GuestOsInfo,
    /// The logged-in users (`userlist`).
    UserList,
    /// The mounted file systems (`filesystemlist`).
    FilesystemList,
}

/// A read subresource of a VMI that its guest agent answers: what virt-apiserver checks,
/// virt-handler asks the launcher and the plugin offers, so that none of them names one.
#[derive(Debug, PartialEq, Eq)]
pub struct VmiReadDef {
    pub subresource: &'static Subresource,
    /// The launcher's question.
    pub query: GuestQuery,
    /// The `kubectl virt` command, as upstream virtctl names it.
    pub command: &'static str,
}

pub const GUESTOSINFO_READ: VmiReadDef = VmiReadDef {
    subresource: &GUESTOSINFO,
    query: GuestQuery::GuestOsInfo,
    command: "guestosinfo",
};
pub const USERLIST_READ: VmiReadDef = VmiReadDef {
    subresource: &USERLIST,
    query: GuestQuery::UserList,
    command: "userlist",
};
pub const FILESYSTEMLIST_READ: VmiReadDef = VmiReadDef {
    subresource: &FILESYSTEMLIST,
    query: GuestQuery::FilesystemList,
    command: "fslist",
};

/// Every guest-agent read of a VMI.
pub const VMI_READS: [&VmiReadDef; 3] = [&GUESTOSINFO_READ, &USERLIST_READ, &FILESYSTEMLIST_READ];

/// The guest-agent read this subresource is, if it is one.
pub fn vmi_read(sub: &Subresource) -> Option<&'static VmiReadDef> {
    VMI_READS.into_iter().find(|r| r.subresource == sub)
}

/// The guest-agent read of this subresource name (the last segment of virt-handler's path).
pub fn vmi_read_named(name: &str) -> Option<&'static VmiReadDef> {
    VMI_READS.into_iter().find(|r| r.subresource.name == name)
}

impl GuestQuery {
    /// Its catalogue entry.
    pub fn def(&self) -> &'static VmiReadDef {
        match self {
            Self::GuestOsInfo => &GUESTOSINFO_READ,
            Self::UserList => &USERLIST_READ,
            Self::FilesystemList => &FILESYSTEMLIST_READ,
        }
    }
}

/// A cluster-wide administrative endpoint of `subresources.kubevirt.io/v1`, on no kind and
/// in no namespace. No kubevirt.io role grants one: cluster administrators (`*`) reach it,
/// and a ClusterRole naming its resource and verb grants it to anyone else.
#[derive(Debug, PartialEq, Eq)]
pub struct AdminEndpoint {
    /// The path segment, which RBAC and discovery see as the resource.
    pub name: &'static str,
    pub http_method: &'static str,
    /// The verb RBAC and SubjectAccessReview see (Kubernetes' RequestInfo: `GET` on a path
    /// without a name is `list`, `PUT` is `update`).
    pub rbac_verb: &'static str,
    pub description: &'static str,
    /// The kind of the request body (`PUT`) or of the answer (`GET`).
    pub body_kind: &'static str,
}

impl AdminEndpoint {
    /// `/apis/subresources.kubevirt.io/v1/<name>`.
    pub fn path(&self) -> String {
        format!("/apis/{SUBRESOURCES_GROUP}/{VERSION}/{}", self.name)
    }
}

pub const BACKUP: AdminEndpoint = AdminEndpoint {
    name: "backup",
    http_method: "GET",
    rbac_verb: "list",
    description: "read every VirtualMachine, VirtualMachineInstance and \
                  VirtualMachineInstanceMigration as stored, at one etcd revision",
    body_kind: crate::backup::KIND,
};

pub const RESTORE: AdminEndpoint = AdminEndpoint {
    name: "restore",
    http_method: "PUT",
    rbac_verb: "update",
    description: "set the stored objects back to a backup: objects created since are \
                  deleted, deleted ones created again with their uid, changed ones set back \
                  (an object that still exists keeps its current status)",
    body_kind: crate::backup::KIND,
};

/// Every administrative endpoint (described in OpenAPI; not in discovery, like `…/version`:
/// they are endpoints, not resources; no user role grants them).
pub const ADMIN_ENDPOINTS: [&AdminEndpoint; 2] = [&BACKUP, &RESTORE];

/// The administrative endpoint at path segment `name`.
pub fn admin_endpoint(name: &str) -> Option<&'static AdminEndpoint> {
    ADMIN_ENDPOINTS.into_iter().find(|e| e.name == name)
}

/// `kubevirt.io/v1`.
pub fn group_version() -> String {
    format!("{GROUP}/{VERSION}")
}

/// The verbs of a stored kind (what RequestInfo makes of the methods the REST handlers serve).
pub const STORED_VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

/// The verbs of a [`Kind::create_only`] kind.
pub const CREATE_ONLY_VERBS: [&str; 1] = ["create"];

impl Kind {
    /// The verbs it is served with (discovery, roles).
    pub fn verbs(&self) -> &'static [&'static str] {
        if self.create_only {
            &CREATE_ONLY_VERBS
        } else {
            &STORED_VERBS
        }
    }

    /// `group/version`, the objects' `apiVersion`.
    pub fn api_version(&self) -> String {
        format!("{}/{}", self.group, self.version)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::Resource;

    #[test]
    fn kinds_agree_with_the_types() {
        use crate::{
            KubeVirt, VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceMigration,
        };
        let types = [
            (VirtualMachine::kind(&()), VirtualMachine::plural(&())),
            (
                VirtualMachineInstance::kind(&()),
                VirtualMachineInstance::plural(&()),
            ),
            (
                VirtualMachineInstanceMigration::kind(&()),
                VirtualMachineInstanceMigration::plural(&()),
            ),
            (KubeVirt::kind(&()), KubeVirt::plural(&())),
        ];
        for (k, (kind, plural)) in all_kinds().zip(types) {
            assert_eq!((k.kind, k.plural), (&*kind, &*plural));
            assert_eq!(k.list_kind, format!("{kind}List"));
            assert_eq!(k.singular, k.kind.to_lowercase());
        }
    }

    #[test]
    fn subresource_names_are_unique_per_kind_and_paths_are_kubevirts() {
        for (i, a) in SUBRESOURCES.iter().enumerate() {
            for b in &SUBRESOURCES[i + 1..] {
                assert!(
                    a.kind != b.kind || a.name != b.name,
                    "{} twice",
                    a.resource()
                );
            }
        }
        assert_eq!(
            START.path("ns1", "vm1"),
            "/apis/subresources.kubevirt.io/v1/namespaces/ns1/virtualmachines/vm1/start"
        );
        assert_eq!((CONSOLE.http_method(), CONSOLE.rbac_verb()), ("GET", "get"));
        assert_eq!((PAUSE.http_method(), PAUSE.rbac_verb()), ("PUT", "update"));
        assert_eq!(subresource("virtualmachineinstances", "vnc"), Some(&VNC));
        assert_eq!(subresources_of(&VIRTUAL_MACHINE).count(), 9);
        assert_eq!(
            EXPAND_SPEC.path("ns1", "vm1"),
            "/apis/subresources.kubevirt.io/v1/namespaces/ns1/virtualmachines/vm1/expand-spec"
        );
        assert_eq!(
            (EXPAND_SPEC.http_method(), EXPAND_SPEC.rbac_verb()),
            ("GET", "get")
        );
        assert_eq!(
            EVACUATE_CANCEL_VMI.path("ns1", "a"),
            "/apis/subresources.kubevirt.io/v1/namespaces/ns1/virtualmachineinstances/a/evacuate/cancel"
        );
        assert_eq!(
            EVACUATE_CANCEL_VMI.resource(),
            "virtualmachineinstances/evacuate"
        );
    }

    #[test]
    fn vmi_actions_are_catalogued_vmi_subresources_each_once() {
        for (i, a) in VMI_ACTIONS.iter().enumerate() {
            assert!(
                SUBRESOURCES.contains(&a.subresource),
                "{}",
                a.subresource.name
            );
            assert_eq!(a.subresource.kind, &VIRTUAL_MACHINE_INSTANCE);
            assert!(!a.subresource.is_stream());
            assert!(
                VMI_ACTIONS[i + 1..]
                    .iter()
                    .all(|b| b.subresource != a.subresource)
            );
            assert_eq!(vmi_action(a.subresource), Some(*a));
            assert_eq!(vmi_action_named(a.subresource.name), Some(*a));
            // The action an entry decodes has that entry (freeze needs its timeout).
            let body = if *a == &FREEZE_ACTION {
                r#"{"unfreezeTimeout":"1m"}"#
            } else {
                ""
            };
            let (action, dry) = (a.decode)(body.as_bytes()).expect("defaults decode");
            assert_eq!((action.def(), dry), (*a, false));
            assert_eq!(action.name(), a.subresource.name);
        }
        assert_eq!(vmi_action(&CONSOLE), None);
        assert_eq!(vmi_action(&EVACUATE_CANCEL_VMI), None);
        assert_eq!(vmi_action(&GUESTOSINFO), None);
        let commands: Vec<&str> = VMI_ACTIONS
            .iter()
            .filter_map(|a| a.command.map(|c| c.name))
            .collect();
        assert_eq!(commands, ["pause", "unpause", "soft-reboot", "reset"]);
    }

    #[test]
    fn vm_actions_are_catalogued_action_subresources_each_once() {
        for (i, a) in VM_ACTIONS.iter().enumerate() {
            let sub = a.subresource;
            assert!(SUBRESOURCES.contains(&sub), "{}", sub.resource());
            assert_eq!((sub.http_method(), sub.rbac_verb()), ("PUT", "update"));
            assert!(VM_ACTIONS[i + 1..].iter().all(|b| b.subresource != sub));
            assert_eq!(vm_action(sub), Some(*a));
            assert_eq!(vmi_action(sub), None);
            if !a.feature_gates.is_empty() {
                // The volume actions: a body is required (KubeVirt's 400).
                let e = (a.decode)(b"").err().map(|e| e.to_string());
                assert_eq!(e.as_deref(), Some(VOLUME_REQUEST_NO_BODY));
                continue;
            }
            // Defaults decode (an empty body) to the entry's own action, whose body is `{}`
            // and a dry run `dryRun: ["All"]`.
            let action = (a.decode)(b"").expect("defaults decode");
            assert_eq!((action.def(), action.dry_run()), (*a, Ok(false)));
            assert_eq!(
                serde_json::to_value(&action).ok(),
                Some(serde_json::json!({}))
            );
            let dry = (a.decode)(br#"{"dryRun":["All"]}"#).expect("decodes");
            assert_eq!(dry.dry_run(), Ok(true));
            assert_eq!(
                serde_json::to_value(&dry).ok(),
                Some(serde_json::json!({"dryRun": ["All"]}))
            );
            let bad = (a.decode)(br#"{"dryRun":["x"]}"#).expect("decodes");
            assert!(bad.dry_run().is_err());
            assert!((a.decode)(b"{").is_err());
            // A command builds its entry's action, dry run or not.
            if let Some(c) = a.command {
                for dry_run in [false, true] {
                    let built = (c.build)(&FlagValues::default(), dry_run).expect("builds");
                    assert_eq!((built.def(), built.dry_run()), (*a, Ok(dry_run)));
                }
            }
        }
        // Every action subresource is a VM action or a VMI action.
        for sub in SUBRESOURCES {
            if matches!(sub.style, Style::Action { .. }) {
                assert!(
                    vm_action(sub).is_some() != vmi_action(sub).is_some(),
                    "{}",
                    sub.resource()
                );
            }
        }
        let commands: Vec<(&str, bool)> = VM_ACTIONS
            .iter()
            .filter_map(|a| a.command.map(|c| (c.name, c.migrates)))
            .collect();
        assert_eq!(
            commands,
            [
                ("start", false),
                ("stop", false),
                ("restart", false),
                ("migrate", true)
            ]
        );
    }

    #[test]
    fn vm_commands_check_their_flags_as_virtctl() {
        let flags = |force: bool, grace: Option<i64>| FlagValues {
            switches: if force { vec![FORCE] } else { vec![] },
            integers: grace.map(|g| (GRACE_PERIOD, g)).into_iter().collect(),
            lists: vec![],
        };
        let build = |def: &VmActionDef, f: FlagValues| def.command.map(|c| (c.build)(&f, false));
        let stop = |force, grace| build(&STOP_ACTION, flags(force, grace));
        assert_eq!(
            stop(true, Some(0)),
            Some(Ok(VmAction::Stop(StopOptions {
                grace_period: Some(0),
                dry_run: None
            })))
        );
        assert!(matches!(stop(true, None), Some(Err(e)) if e.contains("--force needs")));
        assert!(matches!(stop(false, Some(3)), Some(Err(_))));
        let restart = |force, grace| build(&RESTART_ACTION, flags(force, grace));
        assert_eq!(
            restart(true, None),
            Some(Ok(VmAction::Restart(RestartOptions {
                grace_period_seconds: Some(0),
                dry_run: None
            })))
        );
        assert!(matches!(restart(true, Some(30)), Some(Err(_))));
        assert_eq!(
            parse_node_selector(&["a=1, b=2".into(), "c=3".into()]).map(|m| m.len()),
            Ok(3)
        );
        assert!(parse_node_selector(&["=v".into()]).is_err());
    }

    #[test]
    fn volume_actions_decode_kubevirts_bodies_and_refusals() {
        let add = br#"{"name":"v","disk":{"disk":{"bus":"scsi"}},"volumeSource":{"persistentVolumeClaim":{"claimName":"c"}},"dryRun":["All"]}"#;
        for def in [&ADDVOLUME_VM_ACTION, &ADDVOLUME_VMI_ACTION] {
            let a = (def.decode)(add).expect("decodes");
            assert_eq!((a.def(), a.dry_run()), (def, Ok(true)));
            let (VmAction::AddVolumeVm(o) | VmAction::AddVolumeVmi(o)) = a else {
                panic!("not an add: {a:?}");
            };
            let disk = o.disk.expect("disk");
            assert_eq!(disk.name, "v");
            let claim = o.volume_source.and_then(|s| s.persistent_volume_claim);
            assert_eq!(claim.and_then(|c| c.hotpluggable), Some(true));
            let message = |b: &str| (def.decode)(b.as_bytes()).err().map(|e| e.to_string());
            assert_eq!(
                message(r#"{"disk":{}}"#).as_deref(),
                Some("AddVolumeOptions requires name to be set")
            );
            assert_eq!(
                message(r#"{"name":"v"}"#).as_deref(),
                Some("AddVolumeOptions requires disk to not be nil")
            );
            assert_eq!(
                message(r#"{"name":"v","disk":{}}"#).as_deref(),
                Some("AddVolumeOptions requires VolumeSource to not be nil")
            );
            assert_eq!(def.feature_gates, crate::hotplug::FEATURE_GATES);
        }
        for def in [&REMOVEVOLUME_VM_ACTION, &REMOVEVOLUME_VMI_ACTION] {
            let a = (def.decode)(br#"{"name":"v"}"#).expect("decodes");
            assert_eq!((a.def(), a.dry_run()), (def, Ok(false)));
            assert_eq!(
                serde_json::to_value(&a).ok(),
                Some(serde_json::json!({"name": "v"}))
            );
            let e = (def.decode)(b"{}").err().map(|e| e.to_string());
            assert_eq!(
                e.as_deref(),
                Some("RemoveVolumeOptions requires name to be set")
            );
        }
        assert_eq!(vm_action(&ADDVOLUME_VMI), Some(&ADDVOLUME_VMI_ACTION));
        assert_eq!(
            ADDVOLUME_VMI.path("ns", "a"),
            "/apis/subresources.kubevirt.io/v1/namespaces/ns/virtualmachineinstances/a/addvolume"
        );
    }

    #[test]
    fn guest_agent_reads_are_catalogued_gets_each_once() {
        for (i, r) in VMI_READS.iter().enumerate() {
            assert!(
                SUBRESOURCES.contains(&r.subresource),
                "{}",
                r.subresource.name
            );
            assert_eq!(r.subresource.kind, &VIRTUAL_MACHINE_INSTANCE);
            assert!(r.subresource.is_read() && !r.subresource.is_stream());
            assert_eq!(
                (r.subresource.http_method(), r.subresource.rbac_verb()),
                ("GET", "get")
            );
            assert!(
                VMI_READS[i + 1..]
                    .iter()
                    .all(|b| b.subresource != r.subresource)
            );
            assert_eq!(vmi_read(r.subresource), Some(*r));
            assert_eq!(vmi_read_named(r.subresource.name), Some(*r));
            assert_eq!(r.query.def(), *r);
        }
        assert_eq!(vmi_read(&PAUSE), None);
        let json = |q: GuestQuery| serde_json::to_string(&q).unwrap_or_default();
        assert_eq!(json(GuestQuery::GuestOsInfo), r#"{"op":"guestOsInfo"}"#);
        assert_eq!(json(GuestQuery::UserList), r#"{"op":"userList"}"#);
        assert_eq!(
            json(GuestQuery::FilesystemList),
            r#"{"op":"filesystemList"}"#
        );
        assert_eq!(
            FILESYSTEMLIST.path("ns", "a"),
            "/apis/subresources.kubevirt.io/v1/namespaces/ns/virtualmachineinstances/a/filesystemlist"
        );
    }

    #[test]
    fn paused_rules_word_kubevirts_refusals() {
        assert_eq!(PAUSE_ACTION.refusal(true), Some("VMI is already paused"));
        assert_eq!(PAUSE_ACTION.refusal(false), None);
        assert_eq!(UNPAUSE_ACTION.refusal(false), Some("VMI is not paused"));
        assert_eq!(UNPAUSE_ACTION.refusal(true), None);
        assert_eq!(SOFTREBOOT_ACTION.refusal(true), Some("VMI is paused"));
        assert_eq!(RESET_ACTION.refusal(true), None);
        let by_api: Vec<&str> = VMI_ACTIONS
            .iter()
            .filter(|a| a.checked_by_api)
            .map(|a| a.subresource.name)
            .collect();
        assert_eq!(by_api, ["pause", "unpause"]);
    }

    #[test]
    fn vmi_actions_decode_dry_runs_and_serialize_as_the_launchers_requests() {
        let dry = (PAUSE_ACTION.decode)(br#"{"dryRun":["All"]}"#).expect("decodes");
        assert_eq!(dry, (VmiAction::Pause, true));
        assert!((UNPAUSE_ACTION.decode)(b"{").is_err());
        assert!((RESET_ACTION.decode)(br#"{"dryRun":["Some"]}"#).is_err());
        let json = |a: VmiAction| serde_json::to_string(&a).unwrap_or_default();
        assert_eq!(json(VmiAction::Pause), r#"{"op":"pause"}"#);
        assert_eq!(json(VmiAction::Unpause), r#"{"op":"unpause"}"#);
        assert_eq!(json(VmiAction::SoftReboot), r#"{"op":"softReboot"}"#);
        assert_eq!(json(VmiAction::Reset), r#"{"op":"reset"}"#);
        assert_eq!(
            json(VmiAction::Freeze {
                unfreeze_timeout_seconds: 300
            }),
            r#"{"op":"freeze","unfreezeTimeoutSeconds":300}"#
        );
        assert_eq!(json(VmiAction::Unfreeze), r#"{"op":"unfreeze"}"#);
    }

    #[test]
    fn freeze_needs_kubevirts_unfreeze_timeout() {
        let freeze = |body: &str| (FREEZE_ACTION.decode)(body.as_bytes());
        let f = |s| VmiAction::Freeze {
            unfreeze_timeout_seconds: s,
        };
        assert_eq!(
            freeze(r#"{"unfreezeTimeout":"5m0s"}"#).ok(),
            Some((f(300), false))
        );
        assert_eq!(
            freeze(r#"{"unfreezeTimeout":"1.9s"}"#).ok(),
            Some((f(1), false))
        );
        assert_eq!(
            freeze(r#"{"unfreezeTimeout":"0s"}"#).ok(),
            Some((f(0), false))
        );
        let message = |body| freeze(body).err().map(|e| e.to_string());
        assert_eq!(
            message(""),
            Some("Unfreeze timeout in freeze request is not set".into())
        );
        assert_eq!(
            message(r#"{"unfreezeTimeout":"5 minutes"}"#),
            Some(r#"unfreezeTimeout: invalid duration "5 minutes""#.into())
        );
        assert_eq!(
            (UNFREEZE_ACTION.decode)(b"anything").ok(),
            Some((VmiAction::Unfreeze, false))
        );
        assert_eq!(FREEZE_ACTION.refusal(true), None);
        assert_eq!(vmi_action(&FREEZE), Some(&FREEZE_ACTION));
    }
}
