//! Pure mapping from what a launcher reports to the VMI's status.

use kubevirt_api::VirtualMachineInstancePhase as Phase;
use kubevirt_api::common::{Condition, ConditionStatus, set_condition};
use kubevirt_api::vmi::{RuntimeVersions, VirtualMachineInstanceStatus, condition_types};
use virt_domain::Accel;
use virt_domain::protocol::{DomainState, LauncherStatus};

/// What the handler knows about one VMI's launcher.
#[derive(Clone, Debug, PartialEq)]
pub enum Observation {
    /// The launcher was started; its socket is not up yet.
    Starting,
    /// The launcher answered.
    Launcher(LauncherStatus),
    /// The domain ended cleanly.
    ShutDown,
    /// The domain crashed.
    Crashed(String),
    /// The launcher process is gone without the domain having ended.
    LauncherDied(String),
}

/// The VMI status for `obs`, keeping what `prev` already had (node name, …).
pub fn vmi_status(
    prev: &VirtualMachineInstanceStatus,
    obs: &Observation,
) -> VirtualMachineInstanceStatus {
    let mut s = prev.clone();
    let mut conds = s.conditions.take().unwrap_or_default();
    let cond = |t: &str, on: bool, reason: &str, msg: &str| {
        Condition::new(t, ConditionStatus::from_bool(on), reason, msg)
    };
    match obs {
        Observation::Starting => {
            s.phase = Phase::Scheduled;
            set_condition(
                &mut conds,
                cond(condition_types::READY, false, "Starting", ""),
            );
        }
        Observation::Launcher(l) => {
            s.phase = match l.state {
                DomainState::Pending => Phase::Scheduled,
                // A migrated-away guest still runs (on the target); the migration's
                // status writer moves the VMI, not this source-side observation.
                DomainState::Running
                | DomainState::Paused
                | DomainState::ShuttingDown
                | DomainState::Migrated => Phase::Running,
                DomainState::Shutoff => Phase::Succeeded,
                DomainState::Crashed => Phase::Failed,
            };
            let running = l.state == DomainState::Running;
            set_condition(&mut conds, cond(condition_types::READY, running, "", ""));
            if l.state == DomainState::Paused {
                set_condition(
                    &mut conds,
                    cond(
                        condition_types::PAUSED,
                        true,
                        "PausedByUser",
                        "VMI was paused by user",
                    ),
                );
            } else {
                kubevirt_api::common::remove_condition(&mut conds, condition_types::PAUSED);
            }
            // As KubeVirt: present while an agent is connected, gone otherwise.
            if l.guest_agent_connected {
                set_condition(
                    &mut conds,
                    cond(condition_types::AGENT_CONNECTED, true, "", ""),
                );
            } else {
                kubevirt_api::common::remove_condition(
                    &mut conds,
                    condition_types::AGENT_CONNECTED,
                );
            }
            if l.accel == Accel::Tcg {
                set_condition(
                    &mut conds,
                    cond(
                        condition_types::SOFTWARE_EMULATION,
                        true,
                        "",
                        "Running under software emulation (TCG)",
                    ),
                );
            }
            s.runtime_versions = Some(RuntimeVersions {
                launcher: Some(l.launcher_version.clone()),
                libvirt: l.libvirt_version.clone(),
                qemu: l.qemu_version.clone(),
            });
        }
        Observation::ShutDown => {
            s.phase = Phase::Succeeded;
            set_condition(
                &mut conds,
                cond(condition_types::READY, false, "Stopped", ""),
            );
        }
        Observation::Crashed(reason) => {
            s.phase = Phase::Failed;
            s.reason = Some(format!("GuestCrashed: {reason}"));
            set_condition(
                &mut conds,
                cond(condition_types::READY, false, "Crashed", reason),
            );
        }
        Observation::LauncherDied(reason) => {
            // A final phase stays final: a launcher exiting after the guest ended is normal.
            if !s.phase.is_final() {
                s.phase = Phase::Failed;
                s.reason = Some(format!("LauncherDied: {reason}"));
                set_condition(
                    &mut conds,
                    cond(condition_types::READY, false, "LauncherDied", reason),
                );
            }
        }
    }
    // A guest that ended has no agent, whatever was last reported.
    if s.phase.is_final() {
        kubevirt_api::common::remove_condition(&mut conds, condition_types::AGENT_CONNECTED);
    }
    s.conditions = (!conds.is_empty()).then_some(conds);
    s
}

/// Sets `status.interfaces` to the VMI's pod-network interface with the launcher pod's
/// IP (what KubeVirt reports before a guest agent tells more). The VMI is defaulted first,
/// as the launcher does, so an implicit `default` pod network counts. No pod network, no
/// IP: the status is left as it is.
pub fn with_pod_interface(
    mut status: VirtualMachineInstanceStatus,
    vmi: &kubevirt_api::VirtualMachineInstance,
    pod_ip: Option<&str>,
) -> VirtualMachineInstanceStatus {
    let Some(ip) = pod_ip else {
        return status;
    };
    let mut vmi = vmi.clone();
    kubevirt_api::defaults::default_vmi(&mut vmi);
    let pod_net = vmi
        .spec
        .networks
        .iter()
        .flatten()
        .find(|n| n.pod.is_some())
        .map(|n| n.name.clone());
    if let Some(name) = pod_net {
        let uid = vmi.metadata.uid.as_deref().unwrap_or_default();
        status.interfaces = Some(vec![
            kubevirt_api::vmi::VirtualMachineInstanceNetworkInterface {
                name: Some(name),
                ip_address: Some(ip.to_string()),
                ip_addresses: Some(vec![ip.to_string()]),
                mac: virt_netsetup::plan::guest_mac(&vmi.spec, uid).map(|m| m.to_string()),
                info_source: Some("domain".into()),
                ..Default::default()
            },
        ]);
    }
    status
}

/// Appends a `phaseTransitionTimestamps` entry when `next` changed the phase of `prev`
/// (KubeVirt records every phase it enters; `now` is passed in to keep this pure).
pub fn stamp_phase(
    prev: &VirtualMachineInstanceStatus,
    mut next: VirtualMachineInstanceStatus,
    now: k8s_openapi::jiff::Timestamp,
) -> VirtualMachineInstanceStatus {
    if next.phase != prev.phase {
        let mut stamps = next.phase_transition_timestamps.take().unwrap_or_default();
        stamps.push(kubevirt_api::vmi::PhaseTransitionTimestamp {
            phase: next.phase,
            phase_transition_timestamp: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                now,
            )),
        });
        next.phase_transition_timestamps = Some(stamps);
    }
    next
}

/// The status fields virt-handler owns (cluster-flow.md §3); the rest belongs to
/// virt-controller and is never part of our patches. `phaseTransitionTimestamps` is
/// shared: each side appends the phases it writes.
const OWNED: &[&str] = &[
    "phase",
    "phaseTransitionTimestamps",
    "reason",
    "conditions",
    "interfaces",
    "launcherContainerImageVersion",
    "runtimeVersions",
];

/// The JSON merge patch (`{"status": {…}}`) that turns `prev` into `next` for the fields
/// virt-handler owns, or `None` when nothing changed. A field that disappears is sent as
/// `null`, which a merge patch deletes; arrays (conditions) are replaced whole, which is
/// what removes a `Paused` condition.
pub fn status_patch(
    prev: &VirtualMachineInstanceStatus,
    next: &VirtualMachineInstanceStatus,
) -> Option<serde_json::Value> {
    let (Ok(p), Ok(n)) = (serde_json::to_value(prev), serde_json::to_value(next)) else {
        return None;
    };
    let mut out = serde_json::Map::new();
    for k in OWNED {
        let (a, b) = (p.get(*k), n.get(*k));
        if a != b {
            out.insert(
                (*k).to_string(),
                b.cloned().unwrap_or(serde_json::Value::Null),
            );
        }
    }
    (!out.is_empty()).then(|| serde_json::json!({ "status": out }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn launcher(state: DomainState) -> Observation {
        Observation::Launcher(LauncherStatus {
            domain: "ns_a".into(),
            state,
            accel: Accel::Tcg,
            launcher_version: "0.1.0".into(),
            ..LauncherStatus::default()
        })
    }

    #[test]
    fn agent_connected_follows_the_launcher_and_ends_with_the_guest() {
        let with_agent = |connected: bool| {
            Observation::Launcher(LauncherStatus {
                state: DomainState::Running,
                guest_agent_connected: connected,
                ..LauncherStatus::default()
            })
        };
        let s = vmi_status(&Default::default(), &launcher(DomainState::Running));
        assert!(s.condition("AgentConnected").is_none());
        let s = vmi_status(&s, &with_agent(true));
        assert_eq!(
            s.condition("AgentConnected").map(|c| c.status),
            Some(ConditionStatus::True)
        );
        let gone = vmi_status(&s, &with_agent(false));
        assert!(gone.condition("AgentConnected").is_none());
        let done = vmi_status(&s, &Observation::ShutDown);
        assert!(done.condition("AgentConnected").is_none());
    }

    #[test]
    fn phases_and_conditions_follow_the_launcher() {
        let s = vmi_status(&Default::default(), &Observation::Starting);
        assert_eq!(s.phase, Phase::Scheduled);
        let s = vmi_status(&s, &launcher(DomainState::Running));
        assert_eq!(s.phase, Phase::Running);
        assert_eq!(
            s.condition("Ready").map(|c| c.status),
            Some(ConditionStatus::True)
        );
        assert_eq!(
            s.condition("SoftwareEmulation").map(|c| c.status),
            Some(ConditionStatus::True)
        );
        let s = vmi_status(&s, &launcher(DomainState::Paused));
        assert_eq!(
            s.condition("Paused").map(|c| c.status),
            Some(ConditionStatus::True)
        );
        assert_eq!(
            s.condition("Ready").map(|c| c.status),
            Some(ConditionStatus::False)
        );
        let s = vmi_status(&s, &launcher(DomainState::Running));
        assert!(s.condition("Paused").is_none());
        let failed = vmi_status(&s, &Observation::LauncherDied("killed by SIGKILL".into()));
        assert_eq!(failed.phase, Phase::Failed);
        assert!(
            failed
                .reason
                .as_deref()
                .is_some_and(|r| r.contains("SIGKILL"))
        );
        assert_eq!(status_patch(&s, &s), None);
        let paused = vmi_status(&s, &launcher(DomainState::Paused));
        let patch = status_patch(&paused, &s).unwrap();
        // Only owned fields; the conditions array is replaced whole (Paused gone).
        assert_eq!(
            patch["status"]
                .as_object()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            vec!["conditions"]
        );
        let mut with_reason = paused.clone();
        with_reason.reason = Some("x".into());
        with_reason.node_name = Some("other".into());
        let patch = status_patch(&with_reason, &paused).unwrap();
        assert_eq!(patch["status"]["reason"], serde_json::Value::Null);
        assert!(patch["status"].get("nodeName").is_none());
        let vmi: kubevirt_api::VirtualMachineInstance = serde_json::from_value(
            serde_json::json!({"metadata": {"name": "a"}, "spec": {"domain": {}}}),
        )
        .unwrap();
        let with_ip = with_pod_interface(s.clone(), &vmi, Some("10.244.0.7"));
        let ifs = with_ip.interfaces.clone().unwrap();
        assert_eq!(ifs[0].name.as_deref(), Some("default"));
        assert_eq!(ifs[0].ip_address.as_deref(), Some("10.244.0.7"));
        assert_eq!(with_pod_interface(s.clone(), &vmi, None), s);
        let now = k8s_openapi::jiff::Timestamp::UNIX_EPOCH;
        let scheduled = vmi_status(&Default::default(), &Observation::Starting);
        let stamped = stamp_phase(&scheduled, s.clone(), now);
        let stamps = stamped.phase_transition_timestamps.clone().unwrap();
        assert_eq!(stamps.len(), 1);
        assert_eq!(stamps[0].phase, Phase::Running);
        assert_eq!(
            stamp_phase(&s, s.clone(), now),
            s,
            "no phase change, no stamp"
        );
        let done = vmi_status(&s, &Observation::ShutDown);
        let after = vmi_status(&done, &Observation::LauncherDied("exited".into()));
        assert_eq!(
            after.phase,
            Phase::Succeeded,
            "a launcher exiting after shutdown is not a failure"
        );
    }
}
