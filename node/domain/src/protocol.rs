//! Typed handler ↔ launcher messages. Framing: one JSON document per line over the
//! launcher's unix socket. Every field is typed; nothing is JSON inside a string.

use serde::{Deserialize, Serialize};

use crate::host::Accel;

/// Version of this protocol; the handler refuses launchers it does not speak.
/// 2: live migration (`prepareMigrationTarget`, `migrate`, `cancelMigration`,
/// `watchMigration`) and the `migrated` state/event/outcome.
pub const PROTOCOL_VERSION: u32 = 2;

/// A request from virt-handler to a launcher.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum Request {
    /// Liveness and version check.
    Ping,
    /// Current state of the domain.
    GetStatus,
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
    /// Stream [`Response::Migration`] (one per progress report, about every second,
    /// and one final) until the migration ends.
    WatchMigration,
    /// A VMI action of the API catalogue (pause, unpause, softreboot, reset, …), carried
    /// out on the domain. Untagged: the action's own `op` tag names it, so the messages
    /// read as they did when each action was a variant here, and a new catalogued action
    /// needs no change to this protocol.
    #[serde(untagged)]
    Action(VmiAction),
}

pub use kubevirt_api::catalogue::VmiAction;

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
        assert_eq!(
            serde_json::to_string(&LauncherOutcome::Crashed { reason: "x".into() })?,
            r#"{"outcome":"crashed","reason":"x"}"#
        );
        Ok(())
    }
}
