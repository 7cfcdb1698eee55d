//! What the QEMU guest agent tells about a guest, in KubeVirt's shapes: the answers of the
//! VMI subresources `guestosinfo`, `userlist` and `filesystemlist` (which upstream virtctl
//! decodes), `status.guestOSInfo`, and KubeVirt's rule of which agents it supports
//! (`AgentVersionNotSupported`). Pure data and functions; the launcher fills them from the
//! agent, virt-handler and virt-apiserver pass them on.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::vmi::AccessCredential;

/// `status.guestOSInfo` and `guestosinfo`'s `os` (KubeVirt's `VirtualMachineInstanceGuestOSInfo`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GuestOsInfo {
    /// Name of the guest OS (`Debian GNU/Linux`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Kernel release (`6.1.0-18-cloud-amd64`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kernel_release: String,
    /// Version (`12 (bookworm)`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// Pretty name (`Debian GNU/Linux 12 (bookworm)`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pretty_name: String,
    /// Version id (`12`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version_id: String,
    /// Kernel version (`#1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kernel_version: String,
    /// Machine (`x86_64`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub machine: String,
    /// OS id (`debian`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
}

impl GuestOsInfo {
    /// Nothing known (KubeVirt leaves `guestOSInfo` empty then).
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// A command the agent offers (KubeVirt's `GuestAgentCommandInfo`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GuestAgentCommand {
    /// Command name (`guest-ping`).
    pub name: String,
    /// Whether the agent runs it (a frozen guest's agent disables most).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub enabled: bool,
}

/// A user logged in to the guest (KubeVirt's `VirtualMachineInstanceGuestOSUser`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GuestOsUser {
    /// Login name.
    pub user_name: String,
    /// Domain (Windows guests).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub domain: String,
    /// Login time, seconds since the epoch.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub login_time: f64,
}

fn is_zero(f: &f64) -> bool {
    *f == 0.0
}

/// A disk under a guest file system (KubeVirt's `VirtualMachineInstanceFileSystemDisk`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FileSystemDisk {
    /// The disk's serial, when it has one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub serial: String,
    /// Bus (`virtio`, `scsi`, …).
    pub bus_type: String,
}

/// A mounted guest file system (KubeVirt's `VirtualMachineInstanceFileSystem`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FileSystem {
    /// Device name in the guest (`vda1`).
    pub disk_name: String,
    /// Mount point (`/`).
    pub mount_point: String,
    /// Type (`ext4`).
    pub file_system_type: String,
    /// Bytes used.
    pub used_bytes: u64,
    /// Bytes in all.
    pub total_bytes: u64,
    /// Disks it is on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disk: Vec<FileSystemDisk>,
}

/// `guestosinfo`'s `fsInfo` (KubeVirt's `VirtualMachineInstanceFileSystemInfo`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FileSystemInfo {
    /// The file systems (at most 10 here, as KubeVirt's).
    #[serde(rename = "disks", default)]
    pub filesystems: Vec<FileSystem>,
}

/// Answer of `GET …/virtualmachineinstances/{name}/guestosinfo`
/// (KubeVirt's `VirtualMachineInstanceGuestAgentInfo`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GuestAgentInfo {
    /// Always `VirtualMachineInstanceGuestAgentInfo` on the wire.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// `kubevirt.io/v1`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    /// The agent's version.
    #[serde(
        rename = "guestAgentVersion",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub guest_agent_version: String,
    /// The commands it offers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub supported_commands: Vec<GuestAgentCommand>,
    /// The guest's host name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub hostname: String,
    /// The guest OS.
    #[serde(default)]
    pub os: GuestOsInfo,
    /// `Zone, offset-seconds` (`UTC, 0`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub timezone: String,
    /// Logged-in users (at most 10).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub user_list: Vec<GuestOsUser>,
    /// Mounted file systems (at most 10).
    #[serde(default)]
    pub fs_info: FileSystemInfo,
    /// `frozen` while a freeze holds, else empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub fs_freeze_status: String,
}

/// Answer of `GET …/userlist` (KubeVirt's `VirtualMachineInstanceGuestOSUserList`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GuestOsUserList {
    /// `VirtualMachineInstanceGuestOSUserList`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// `kubevirt.io/v1`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    /// List metadata (empty).
    #[serde(default)]
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// The users.
    #[serde(default)]
    pub items: Vec<GuestOsUser>,
}

/// Answer of `GET …/filesystemlist` (KubeVirt's `VirtualMachineInstanceFileSystemList`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FileSystemList {
    /// `VirtualMachineInstanceFileSystemList`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// `kubevirt.io/v1`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub api_version: String,
    /// List metadata (empty).
    #[serde(default)]
    pub metadata: serde_json::Map<String, serde_json::Value>,
    /// The file systems.
    #[serde(default)]
    pub items: Vec<FileSystem>,
}

/// The kinds of the three answers, as OpenAPI and the answers name them.
pub const GUEST_AGENT_INFO_KIND: &str = "VirtualMachineInstanceGuestAgentInfo";
/// See [`GUEST_AGENT_INFO_KIND`].
pub const USER_LIST_KIND: &str = "VirtualMachineInstanceGuestOSUserList";
/// See [`GUEST_AGENT_INFO_KIND`].
pub const FILESYSTEM_LIST_KIND: &str = "VirtualMachineInstanceFileSystemList";

/// The answers' kinds, as OpenAPI describes them.
pub const KINDS: [&str; 3] = [GUEST_AGENT_INFO_KIND, USER_LIST_KIND, FILESYSTEM_LIST_KIND];

/// The schema of `kind` (one of [`KINDS`]) as `settings` generate it.
pub fn root_schema(
    kind: &str,
    settings: schemars::generate::SchemaSettings,
) -> Option<schemars::Schema> {
    let g = settings.into_generator();
    Some(match kind {
        GUEST_AGENT_INFO_KIND => g.into_root_schema_for::<GuestAgentInfo>(),
        USER_LIST_KIND => g.into_root_schema_for::<GuestOsUserList>(),
        FILESYSTEM_LIST_KIND => g.into_root_schema_for::<FileSystemList>(),
        _ => return None,
    })
}

impl GuestOsUserList {
    /// The list of `items`, typed as KubeVirt's.
    pub fn of(items: Vec<GuestOsUser>) -> Self {
        Self {
            kind: USER_LIST_KIND.into(),
            api_version: crate::API_VERSION.into(),
            metadata: serde_json::Map::new(),
            items,
        }
    }
}

impl FileSystemList {
    /// The list of `items`, typed as KubeVirt's.
    pub fn of(items: Vec<FileSystem>) -> Self {
        Self {
            kind: FILESYSTEM_LIST_KIND.into(),
            api_version: crate::API_VERSION.into(),
            metadata: serde_json::Map::new(),
            items,
        }
    }
}

/// The commands KubeVirt needs from every agent (its `requiredGuestAgentCommands`).
pub const REQUIRED_COMMANDS: [&str; 10] = [
    "guest-ping",
    "guest-get-time",
    "guest-info",
    "guest-shutdown",
    "guest-network-get-interfaces",
    "guest-get-fsinfo",
    "guest-get-host-name",
    "guest-get-users",
    "guest-get-timezone",
    "guest-get-osinfo",
];
/// What SSH keys through the agent take: the agent's own key commands…
pub const SSH_COMMANDS: [&str; 3] = [
    "guest-ssh-get-authorized-keys",
    "guest-ssh-add-authorized-keys",
    "guest-ssh-remove-authorized-keys",
];
/// …or, for older agents, file access and exec (KubeVirt accepts either).
pub const OLD_SSH_COMMANDS: [&str; 6] = [
    "guest-exec-status",
    "guest-exec",
    "guest-file-open",
    "guest-file-close",
    "guest-file-read",
    "guest-file-write",
];
/// What passwords through the agent take.
pub const PASSWORD_COMMANDS: [&str; 1] = ["guest-set-user-password"];

/// KubeVirt's verdict on an agent (`isGuestAgentSupported`): `Err(reason)` when it lacks a
/// command KubeVirt requires, for every guest or for what `credentials` propagate through it.
/// A list of commands that is empty (not known yet) is not judged.
pub fn agent_supported(
    credentials: &[AccessCredential],
    commands: &[GuestAgentCommand],
) -> Result<(), &'static str> {
    if commands.is_empty() {
        return Ok(());
    }
    let has = |names: &[&str]| {
        names
            .iter()
            .all(|n| commands.iter().any(|c| c.name == *n && c.enabled))
    };
    if !has(&REQUIRED_COMMANDS) {
        return Err("This guest agent doesn't support required basic commands");
    }
    let ssh = credentials.iter().any(|c| {
        c.ssh_public_key
            .as_ref()
            .is_some_and(|k| k.propagation_method.qemu_guest_agent.is_some())
    });
    if ssh && !has(&SSH_COMMANDS) && !has(&OLD_SSH_COMMANDS) {
        return Err("This guest agent doesn't support required public key commands");
    }
    let password = credentials.iter().any(|c| {
        c.user_password
            .as_ref()
            .is_some_and(|p| p.propagation_method.qemu_guest_agent.is_some())
    });
    if password && !has(&PASSWORD_COMMANDS) {
        return Err("This guest agent doesn't support required password commands");
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn answers_have_kubevirts_field_names() {
        let info = GuestAgentInfo {
            kind: GUEST_AGENT_INFO_KIND.into(),
            api_version: "kubevirt.io/v1".into(),
            guest_agent_version: "7.2.0".into(),
            hostname: "vm1".into(),
            os: GuestOsInfo {
                id: "debian".into(),
                version_id: "12".into(),
                ..GuestOsInfo::default()
            },
            timezone: "UTC, 0".into(),
            user_list: vec![GuestOsUser {
                user_name: "tester".into(),
                login_time: 1.5,
                ..GuestOsUser::default()
            }],
            fs_info: FileSystemInfo {
                filesystems: vec![FileSystem {
                    disk_name: "vda1".into(),
                    mount_point: "/".into(),
                    file_system_type: "ext4".into(),
                    used_bytes: 1,
                    total_bytes: 2,
                    disk: vec![FileSystemDisk {
                        serial: String::new(),
                        bus_type: "virtio".into(),
                    }],
                }],
            },
            ..GuestAgentInfo::default()
        };
        let v = serde_json::to_value(&info).unwrap();
        assert_eq!(v["guestAgentVersion"], "7.2.0");
        assert_eq!(v["os"]["versionId"], "12");
        assert_eq!(v["userList"][0]["userName"], "tester");
        assert_eq!(v["userList"][0]["loginTime"], 1.5);
        assert_eq!(v["fsInfo"]["disks"][0]["mountPoint"], "/");
        assert_eq!(v["fsInfo"]["disks"][0]["fileSystemType"], "ext4");
        assert_eq!(v["fsInfo"]["disks"][0]["disk"][0]["busType"], "virtio");
        assert!(v.get("fsFreezeStatus").is_none());
        let users = serde_json::to_value(GuestOsUserList::of(vec![])).unwrap();
        assert_eq!(
            users,
            serde_json::json!({"kind": USER_LIST_KIND, "apiVersion": "kubevirt.io/v1", "metadata": {}, "items": []})
        );
        let fs = serde_json::to_value(FileSystemList::of(vec![])).unwrap();
        assert_eq!(fs["kind"], FILESYSTEM_LIST_KIND);
        assert_eq!(serde_json::from_value::<GuestAgentInfo>(v).unwrap(), info);
    }

    #[test]
    fn agents_lacking_kubevirts_commands_are_not_supported() {
        let cmds = |names: &[&str]| -> Vec<GuestAgentCommand> {
            names
                .iter()
                .map(|n| GuestAgentCommand {
                    name: (*n).into(),
                    enabled: true,
                })
                .collect()
        };
        assert_eq!(agent_supported(&[], &[]), Ok(()), "not known yet");
        assert!(agent_supported(&[], &cmds(&["guest-ping"])).is_err());
        let basic = cmds(&REQUIRED_COMMANDS);
        assert_eq!(agent_supported(&[], &basic), Ok(()));
        let ssh: AccessCredential = serde_json::from_value(serde_json::json!({
            "sshPublicKey": {"source": {"secret": {"secretName": "k"}},
                             "propagationMethod": {"qemuGuestAgent": {"users": ["root"]}}}
        }))
        .unwrap();
        assert_eq!(
            agent_supported(std::slice::from_ref(&ssh), &basic),
            Err("This guest agent doesn't support required public key commands")
        );
        let mut with_ssh = basic.clone();
        with_ssh.extend(cmds(&SSH_COMMANDS));
        assert_eq!(
            agent_supported(std::slice::from_ref(&ssh), &with_ssh),
            Ok(())
        );
        let pw: AccessCredential = serde_json::from_value(serde_json::json!({
            "userPassword": {"source": {"secret": {"secretName": "p"}},
                             "propagationMethod": {"qemuGuestAgent": {}}}
        }))
        .unwrap();
        assert!(agent_supported(&[ssh, pw], &with_ssh).is_err());
        // A disabled command counts as missing (a frozen agent disables most).
        let mut disabled = basic;
        disabled[0].enabled = false;
        assert!(agent_supported(&[], &disabled).is_err());
    }
}
