//! Typed handler ↔ launcher messages. Framing: one JSON document per line over the
//! launcher's unix socket. Every field is typed; nothing is JSON inside a string.

use serde::{Deserialize, Serialize};

use crate::host::Accel;

/// Version of this protocol; the handler refuses launchers it does not speak.
/// 2: live migration (`prepareMigrationTarget`, `migrate`, `cancelMigration`,
/// `watchMigration`) and the `migrated` state/event/outcome.
/// 3: guest-agent reads (`guestOsInfo`, `userList`, `filesystemList`), the agent's data in
/// the status (`guestAgent`, `accessCredentials`) and the `guestInfo` event.
/// 4: `getStats` (the domain's statistics, for virt-handler's per-VMI metrics); an older
/// launcher answers it with an error, and its VMI's metrics are left out.
/// 5: volume hotplug (`attachVolume`, `detachVolume`, the status's `hotplugged` disks); an
/// older launcher answers both with an error and reports no hotplugged disk.
pub const PROTOCOL_VERSION: u32 = 5;

/// A request from virt-handler to a launcher.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum Request {
    /// Liveness and version check.
    Ping,
    /// Current state of the domain.
    GetStatus,
    /// The running domain's statistics (libvirt's domain stats), answered with
    /// [`Response::Stats`]: read at each scrape of virt-handler's `/metrics`.
    GetStats,
    /// ACPI power button, then destroy after the grace period.
    Shutdown,
    /// Destroy the domain now.
    Kill,
    /// Stream domain events on this connection (one [`Response::Event`] per line).
    Watch,
    /// Target side of a live migration: answered with
    /// [`Response::MigrationTargetReady`] once this launcher (started with
    /// `--migration-target`) has its private libvirtd up and waits for the guest.
    PrepareMigrationTarget,
    /// Source side: start migrating the guest to the target whose facts are given.
    /// Answered with [`Response::Ok`] once libvirt's migration job runs; follow it
    /// with [`Request::WatchMigration`].
    Migrate(MigrateRequest),
    /// Abort the running migration; the guest keeps running here.
    CancelMigration,
    /// Hotplugs vCPUs into the running guest until it has `vcpus` of them (at most the
    /// domain's maximum; KubeVirt's `SyncVirtualMachineCPUs`): sent by the target's
    /// virt-handler after a migration to a launcher pod sized for the VMI's new CPUs.
    /// Answered with [`Response::Ok`]; an older launcher answers with an error.
    SetVcpus {
        /// The vCPUs the guest has afterwards.
        vcpus: u32,
    },
    /// Plugs hotplugged volume `volume` (its image mounted by virt-handler at
    /// `kubevirt_api::hotplug::launcher_image_path`) into the running guest as `disk`.
    /// Answered with [`Response::Hotplugged`], also when the guest has it already.
    AttachVolume {
        /// The VMI's disk for it.
        disk: Box<kubevirt_api::vmi::Disk>,
        /// The VMI's volume.
        volume: Box<kubevirt_api::vmi::Volume>,
    },
    /// Unplugs hotplugged volume `name` from the guest (libvirt waits for the guest to let
    /// it go). Answered with [`Response::Hotplugged`], also when the guest does not have it.
    DetachVolume {
        /// The VMI volume.
        name: String,
    },
    /// Stream [`Response::Migration`] (one per progress report, about every second,
    /// and one final) until the migration ends.
    WatchMigration,
    /// `guest-ping` through the guest agent: [`Response::Ok`] when it answers (KubeVirt's
    /// `guestAgentPing` probe).
    GuestPing,
    /// Runs a command in the guest through the guest agent (`guest-exec`), answered with
    /// [`Response::GuestExec`] (KubeVirt's `exec` probe).
    GuestExec(GuestExecRequest),
    /// A VMI action of the API catalogue (pause, unpause, softreboot, reset, …), carried
    /// out on the domain. Untagged: the action's own `op` tag names it, so the messages
    /// read as they did when each action was a variant here, and a new catalogued action
    /// needs no change to this protocol.
    #[serde(untagged)]
    Action(VmiAction),
    /// A question to the guest agent (`guestosinfo`, `userlist`, `filesystemlist`), answered
    /// with [`Response::GuestOsInfo`], [`Response::UserList`] or [`Response::FilesystemList`];
    /// untagged like [`Request::Action`].
    #[serde(untagged)]
    Guest(GuestQuery),
}

pub use kubevirt_api::catalogue::{GuestQuery, VmiAction};
use kubevirt_api::guestagent::{
    FileSystemList, GuestAgentCommand, GuestAgentInfo, GuestOsInfo, GuestOsUserList,
};

/// Directory, inside the private libvirtd's mount namespace, where the migration
/// sockets live. The launcher binds `<cmd socket dir>/migration` (host side, shared with
/// virt-handler) on it, so the same in-namespace path names a different host directory
/// on the source and on the target — the handlers' proxy sits in between.
pub const MIGRATION_NS_DIR: &str = "/var/lib/libvirt/migration";
/// Name of the host directory next to the command socket that holds the migration sockets.
pub const MIGRATION_DIR: &str = "migration";

/// The migration streams and their socket file names in [`MIGRATION_DIR`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum MigrationStream {
    /// libvirtd ↔ libvirtd (peer-to-peer control connection, libvirt's RPC).
    Libvirt,
    /// QEMU's migration stream (memory and device state).
    Memory,
    /// NBD stream of the non-shared disk copy (containerDisk overlays, emptyDisks).
    Disks,
}

impl MigrationStream {
    /// All streams.
    pub const ALL: [Self; 3] = [Self::Libvirt, Self::Memory, Self::Disks];

    /// Socket file name.
    pub fn socket_name(self) -> &'static str {
        match self {
            Self::Libvirt => "libvirt.sock",
            Self::Memory => "memory.sock",
            Self::Disks => "disks.sock",
        }
    }

    /// Parses a [`Self::socket_name`] back (the proxy's stream header).
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.socket_name() == s)
    }
}

/// Facts about a prepared migration target the source needs: its own paths, which
/// replace the source's in the domain XML sent along (the two launchers' work
/// directories differ).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigrationTarget {
    /// The target launcher's work directory (disk overlays, cloud-init ISO).
    pub work_dir: String,
    /// The target's console socket.
    pub console_socket: String,
    /// The target's VNC socket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vnc_socket: Option<String>,
}

/// Tunables of one migration.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigrationOptions {
    /// Bandwidth limit in MiB/s (KubeVirt's `bandwidthPerMigration`); unlimited when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_mib: Option<u64>,
    /// Longest acceptable pause at the switchover, in ms (libvirt's default is 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_downtime_ms: Option<u64>,
    /// Claim volumes whose disks are copied to the target's own claim (not shared: the
    /// VMI's `status.migratedVolumes`); every other claim is shared storage.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub copy_claims: Vec<String>,
}

/// Body of [`Request::Migrate`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigrateRequest {
    /// What [`Request::PrepareMigrationTarget`] answered on the target.
    pub target: MigrationTarget,
    /// Tunables.
    #[serde(default)]
    pub options: MigrationOptions,
}

/// Migration mode (KubeVirt's `migrationState.mode`); post-copy is not offered yet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum MigrationMode {
    /// Memory is copied while the guest runs, then the guest moves.
    #[default]
    PreCopy,
}

/// Progress of a migration, from libvirt's job statistics (bytes and ms).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigrationProgress {
    /// Bytes to move in all (memory + disks).
    pub data_total: u64,
    /// Bytes moved so far.
    pub data_processed: u64,
    /// Bytes still to move (dirtied pages come back).
    pub data_remaining: u64,
    /// Memory pass (1 = first full copy; more when the guest dirties memory).
    pub memory_iteration: u64,
    /// Transfer rate of memory, bytes per second.
    pub memory_bps: u64,
    /// Time since the migration started.
    pub elapsed_ms: u64,
    /// How long the guest was paused at the switchover (known at the end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downtime_ms: Option<u64>,
    /// Mode.
    pub mode: MigrationMode,
}

/// Where a migration is (source side).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "camelCase")]
pub enum MigrationStatus {
    /// No migration has been asked for.
    #[default]
    Idle,
    /// libvirt's job runs.
    Running {
        /// Latest statistics.
        progress: MigrationProgress,
    },
    /// The guest runs on the target; this launcher ends.
    Completed {
        /// Final statistics (with the downtime).
        progress: MigrationProgress,
    },
    /// The migration failed; the guest still runs here.
    Failed {
        /// libvirt's reason.
        reason: String,
    },
    /// Cancelled on request; the guest still runs here.
    Cancelled,
}

impl MigrationStatus {
    /// Completed, failed or cancelled.
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            Self::Completed { .. } | Self::Failed { .. } | Self::Cancelled
        )
    }
}

/// A launcher's reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Response {
    /// Reply to [`Request::Ping`].
    Pong {
        /// Protocol version the launcher speaks.
        version: u32,
    },
    /// Reply to [`Request::GetStatus`].
    Status(LauncherStatus),
    /// Reply to [`Request::GetStats`].
    Stats {
        /// The statistics.
        stats: Box<crate::stats::DomainStats>,
    },
    /// The hotplugged disks the guest has, after an attach or detach.
    Hotplugged {
        /// By volume.
        disks: Vec<crate::schema::HotpluggedDisk>,
    },
    /// The request was carried out.
    Ok,
    /// The request failed.
    Error {
        /// Why.
        message: String,
    },
    /// A domain event (after [`Request::Watch`]).
    Event(DomainEvent),
    /// Reply to [`Request::PrepareMigrationTarget`].
    MigrationTargetReady(MigrationTarget),
    /// Migration status (after [`Request::WatchMigration`]).
    Migration(MigrationStatus),
    /// Reply to [`Request::GuestExec`].
    GuestExec(GuestExecResult),
    /// Reply to [`GuestQuery::GuestOsInfo`].
    GuestOsInfo {
        /// KubeVirt's `VirtualMachineInstanceGuestAgentInfo`.
        info: Box<GuestAgentInfo>,
    },
    /// Reply to [`GuestQuery::UserList`].
    UserList {
        /// KubeVirt's `VirtualMachineInstanceGuestOSUserList`.
        list: GuestOsUserList,
    },
    /// Reply to [`GuestQuery::FilesystemList`].
    FilesystemList {
        /// KubeVirt's `VirtualMachineInstanceFileSystemList`.
        list: FileSystemList,
    },
}

/// Body of [`Request::GuestExec`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GuestExecRequest {
    /// The program and its arguments (no shell).
    pub command: Vec<String>,
    /// How long it may run.
    pub timeout_seconds: u32,
}

/// How a [`Request::GuestExec`] command ended.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GuestExecResult {
    /// Its exit code (a signal's number as the shell gives it: 128 + n).
    pub exit_code: i32,
    /// What it wrote to stdout (lossy UTF-8).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stdout: String,
    /// What it wrote to stderr (lossy UTF-8).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stderr: String,
}

/// What the guest agent last reported that the VMI's status shows (polled by the launcher
/// while the agent is connected).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GuestAgentStatus {
    /// The agent's version.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// The commands it offers (for `AgentVersionNotSupported`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub supported_commands: Vec<GuestAgentCommand>,
    /// `status.guestOSInfo`.
    #[serde(default)]
    pub os: GuestOsInfo,
    /// The guest's network interfaces (loopback left out).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<GuestInterface>,
    /// A freeze holds (`status.fsFreezeStatus: frozen`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub frozen: bool,
}

/// A network interface as the guest agent reports it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GuestInterface {
    /// Its name in the guest (`enp1s0`).
    pub name: String,
    /// Its MAC address, lower case.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Its addresses, without prefix length, in the agent's order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_addresses: Vec<String>,
}

/// Whether the VMI's access credentials reached the guest (`AccessCredentialsSynchronized`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CredentialsStatus {
    /// Everything the Secrets hold is in the guest.
    pub synchronized: bool,
    /// Why not (a missing Secret, no agent, the agent's error), or what was done.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// Observed state of the domain.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum DomainState {
    /// Not defined or not started yet.
    #[default]
    Pending,
    /// The guest runs.
    Running,
    /// The guest is paused.
    Paused,
    /// The guest is shutting down.
    ShuttingDown,
    /// The guest stopped cleanly.
    Shutoff,
    /// The guest or QEMU crashed.
    Crashed,
    /// The guest moved to another launcher (live migration); this one ends.
    Migrated,
}

/// What a launcher reports about its VM.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LauncherStatus {
    /// libvirt domain name.
    pub domain: String,
    /// Domain state.
    pub state: DomainState,
    /// KVM or TCG (the SoftwareEmulation condition).
    pub accel: Accel,
    /// virt-launcher version.
    pub launcher_version: String,
    /// libvirt version.
    pub libvirt_version: Option<String>,
    /// QEMU version.
    pub qemu_version: Option<String>,
    /// PID of the QEMU process, when known.
    pub qemu_pid: Option<u32>,
    /// The launcher pod's IP (the VMI's pod-network interface in `status.interfaces`).
    /// Optional and defaulted, so launchers and handlers of either side of this field
    /// still understand each other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_ip: Option<String>,
    /// The guest runs a QEMU guest agent (its channel's port is open): KubeVirt's
    /// `AgentConnected` condition. Defaulted, as `pod_ip`, for launchers without it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub guest_agent_connected: bool,
    /// What the connected guest agent reports (absent without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_agent: Option<Box<GuestAgentStatus>>,
    /// State of the agent-propagated access credentials (absent when the VMI has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_credentials: Option<CredentialsStatus>,
    /// The hotplugged disks the guest has now (protocol 5).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hotplugged: Vec<crate::schema::HotpluggedDisk>,
}

/// A domain lifecycle event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "camelCase")]
pub enum DomainEvent {
    /// The guest started.
    Started,
    /// The guest was paused.
    Paused,
    /// The guest resumed.
    Resumed,
    /// The guest shut down.
    ShutDown,
    /// The guest or QEMU crashed.
    Crashed {
        /// Details.
        reason: String,
    },
    /// The guest left for a migration target.
    Migrated,
    /// The guest agent connected or went away (re-read the status). A handler that
    /// does not know this event only loses its stream once and subscribes again.
    GuestAgent {
        /// Whether it is connected now.
        connected: bool,
    },
    /// What the guest agent reports changed (an address, the OS), or the access
    /// credentials' state did: re-read the status.
    GuestInfo,
}

/// File a launcher writes next to its command socket when it ends, so that a handler
/// that was not listening (restarted, or the event was lost with the connection) still
/// learns how the VM ended instead of only seeing the socket gone.
pub const OUTCOME_FILE: &str = "outcome.json";

/// How a launcher's run ended (the content of [`OUTCOME_FILE`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "camelCase")]
pub enum LauncherOutcome {
    /// The guest shut down (or was stopped after its grace period).
    ShutDown,
    /// The guest or QEMU crashed.
    Crashed {
        /// Details.
        reason: String,
    },
    /// The guest moved away by live migration: neither Succeeded nor Failed.
    Migrated,
    /// The launcher failed (the message it exits with).
    Failed {
        /// Why.
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_tagged_json() -> Result<(), serde_json::Error> {
        assert_eq!(
            serde_json::to_string(&Request::Action(VmiAction::Pause))?,
            r#"{"op":"pause"}"#
        );
        for (line, req) in [
            (r#"{"op":"pause"}"#, Request::Action(VmiAction::Pause)),
            (
                r#"{"op":"softReboot"}"#,
                Request::Action(VmiAction::SoftReboot),
            ),
            (r#"{"op":"getStatus"}"#, Request::GetStatus),
            (r#"{"op":"getStats"}"#, Request::GetStats),
        ] {
            assert_eq!(serde_json::from_str::<Request>(line)?, req);
        }
        assert!(serde_json::from_str::<Request>(r#"{"op":"fly"}"#).is_err());
        let r = Response::Event(DomainEvent::Crashed {
            reason: "qemu died".into(),
        });
        let s = serde_json::to_string(&r)?;
        assert_eq!(
            s,
            r#"{"kind":"event","event":"crashed","reason":"qemu died"}"#
        );
        assert_eq!(serde_json::from_str::<Response>(&s)?, r);
        let m = Request::Migrate(MigrateRequest {
            target: MigrationTarget {
                work_dir: "/w".into(),
                console_socket: "/c".into(),
                vnc_socket: None,
            },
            options: MigrationOptions {
                bandwidth_mib: Some(4),
                max_downtime_ms: None,
                copy_claims: vec!["d".into()],
            },
        });
        let s = serde_json::to_string(&m)?;
        assert_eq!(
            s,
            r#"{"op":"migrate","target":{"workDir":"/w","consoleSocket":"/c"},"options":{"bandwidthMib":4,"copyClaims":["d"]}}"#
        );
        assert_eq!(serde_json::from_str::<Request>(&s)?, m);
        assert_eq!(
            serde_json::to_string(&Response::Migration(MigrationStatus::Failed {
                reason: "r".into()
            }))?,
            r#"{"kind":"migration","state":"failed","reason":"r"}"#
        );
        assert_eq!(
            serde_json::to_string(&Response::Event(DomainEvent::GuestAgent {
                connected: true
            }))?,
            r#"{"kind":"event","event":"guestAgent","connected":true}"#
        );
        // Reported only when connected; a status without the field reads as not connected.
        let st = LauncherStatus::default();
        let s = serde_json::to_string(&st)?;
        assert!(!s.contains("guestAgentConnected"), "{s}");
        let on = LauncherStatus {
            guest_agent_connected: true,
            ..st
        };
        let s = serde_json::to_string(&on)?;
        assert!(s.contains(r#""guestAgentConnected":true"#), "{s}");
        assert_eq!(serde_json::from_str::<LauncherStatus>(&s)?, on);
        for (line, q) in [
            (r#"{"op":"guestOsInfo"}"#, GuestQuery::GuestOsInfo),
            (r#"{"op":"userList"}"#, GuestQuery::UserList),
            (r#"{"op":"filesystemList"}"#, GuestQuery::FilesystemList),
        ] {
            assert_eq!(serde_json::from_str::<Request>(line)?, Request::Guest(q));
            assert_eq!(serde_json::to_string(&Request::Guest(q))?, line);
        }
        let exec = Request::GuestExec(GuestExecRequest {
            command: vec!["true".into()],
            timeout_seconds: 5,
        });
        let s = serde_json::to_string(&exec)?;
        assert_eq!(
            s,
            r#"{"op":"guestExec","command":["true"],"timeoutSeconds":5}"#
        );
        assert_eq!(serde_json::from_str::<Request>(&s)?, exec);
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"op":"guestPing"}"#)?,
            Request::GuestPing
        );
        // The answer's own `kind` (KubeVirt's) does not clash with the reply's tag.
        let r = Response::UserList {
            list: GuestOsUserList::of(vec![]),
        };
        let s = serde_json::to_string(&r)?;
        assert!(
            s.starts_with(
                r#"{"kind":"userList","list":{"kind":"VirtualMachineInstanceGuestOSUserList""#
            ),
            "{s}"
        );
        assert_eq!(serde_json::from_str::<Response>(&s)?, r);
        assert_eq!(
            serde_json::to_string(&Response::Event(DomainEvent::GuestInfo))?,
            r#"{"kind":"event","event":"guestInfo"}"#
        );
        assert_eq!(
            serde_json::to_string(&LauncherOutcome::Crashed { reason: "x".into() })?,
            r#"{"outcome":"crashed","reason":"x"}"#
        );
        Ok(())
    }
}
