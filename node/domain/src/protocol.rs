//! Typed handler ↔ launcher messages. Framing: one JSON document per line over the
//! launcher's unix socket. Every field is typed; nothing is JSON inside a string.

use serde::{Deserialize, Serialize};

use crate::host::Accel;

/// Version of this protocol; the handler refuses launchers it does not speak.
pub const PROTOCOL_VERSION: u32 = 1;

/// A request from virt-handler to a launcher.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "camelCase")]
pub enum Request {
    /// Liveness and version check.
    Ping,
    /// Current state of the domain.
    GetStatus,
    /// Pause the guest's vCPUs.
    Pause,
    /// Resume the guest's vCPUs.
    Unpause,
    /// ACPI reboot request.
    SoftReboot,
    /// ACPI power button, then destroy after the grace period.
    Shutdown,
    /// Destroy the domain now.
    Kill,
    /// Stream domain events on this connection (one [`Response::Event`] per line).
    Watch,
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
        assert_eq!(serde_json::to_string(&Request::Pause)?, r#"{"op":"pause"}"#);
        let r = Response::Event(DomainEvent::Crashed {
            reason: "qemu died".into(),
        });
        let s = serde_json::to_string(&r)?;
        assert_eq!(
            s,
            r#"{"kind":"event","event":"crashed","reason":"qemu died"}"#
        );
        assert_eq!(serde_json::from_str::<Response>(&s)?, r);
        assert_eq!(
            serde_json::to_string(&LauncherOutcome::Crashed { reason: "x".into() })?,
            r#"{"outcome":"crashed","reason":"x"}"#
        );
        Ok(())
    }
}
