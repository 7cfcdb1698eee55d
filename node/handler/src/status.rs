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
    /// The VMI's liveness probe failed; the guest is being stopped.
    LivenessFailed(String),
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
        Observation::LivenessFailed(why) => {
            s.phase = Phase::Failed;
            s.reason = Some(format!("LivenessProbeFailed: {why}"));
            set_condition(
                &mut conds,
                cond(condition_types::READY, false, "LivenessProbeFailed", why),
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

/// The `Ready` condition of a running VMI with a readiness probe (`Some(passing)`): False
/// until the probe passes, whatever the domain's state says.
pub fn with_readiness(
    mut status: VirtualMachineInstanceStatus,
    probe: Option<bool>,
) -> VirtualMachineInstanceStatus {
    if probe != Some(false) || status.phase != Phase::Running {
        return status;
    }
    let mut conds = status.conditions.take().unwrap_or_default();
    set_condition(
        &mut conds,
        Condition::new(
            condition_types::READY,
            ConditionStatus::False,
            "GuestNotReady",
            "the VMI's readiness probe has not passed",
        ),
    );
    status.conditions = Some(conds);
    status
}

/// KubeVirt's `infoSource` values.
pub const INFO_SOURCE_DOMAIN: &str = "domain";
/// See [`INFO_SOURCE_DOMAIN`].
pub const INFO_SOURCE_GUEST_AGENT: &str = "guest-agent";
/// See [`INFO_SOURCE_DOMAIN`].
pub const INFO_SOURCE_DOMAIN_AND_GA: &str = "domain, guest-agent";

/// What the guest agent adds to the status of a running VMI (after
/// [`with_pod_interface`], whose interfaces it merges into): `guestOSInfo`,
/// `fsFreezeStatus`, the interfaces' guest names and addresses, and the conditions
/// `AgentVersionNotSupported` and `AccessCredentialsSynchronized`, as KubeVirt's
/// virt-handler sets them. Without an agent the agent's part is gone again.
pub fn with_guest_agent(
    mut status: VirtualMachineInstanceStatus,
    vmi: &kubevirt_api::VirtualMachineInstance,
    l: &LauncherStatus,
) -> VirtualMachineInstanceStatus {
    use kubevirt_api::common::remove_condition;
    let mut conds = status.conditions.take().unwrap_or_default();
    let creds = vmi.spec.access_credentials.as_deref().unwrap_or_default();
    match l.guest_agent.as_ref().filter(|_| l.guest_agent_connected) {
        Some(ga) => {
            status.guest_os_info = ga.os.clone();
            match kubevirt_api::guestagent::agent_supported(creds, &ga.supported_commands) {
                Ok(()) => {
                    remove_condition(&mut conds, condition_types::AGENT_VERSION_NOT_SUPPORTED)
                }
                Err(reason) => set_condition(
                    &mut conds,
                    Condition::new(
                        condition_types::AGENT_VERSION_NOT_SUPPORTED,
                        ConditionStatus::True,
                        reason,
                        "",
                    ),
                ),
            }
            // Entries only the agent knew come from an earlier merge (the pod interface is
            // rebuilt each time; without a pod IP the list is the last one written).
            let mut domain = status.interfaces.take().unwrap_or_default();
            domain.retain(|i| i.info_source.as_deref() != Some(INFO_SOURCE_GUEST_AGENT));
            status.interfaces = Some(merge_interfaces(domain, &ga.interfaces, vmi));
        }
        None => remove_condition(&mut conds, condition_types::AGENT_VERSION_NOT_SUPPORTED),
    }
    // KubeVirt's field says what was asked (a freeze holds), which the launcher knows.
    status.fs_freeze_status = l
        .guest_agent
        .as_ref()
        .is_some_and(|g| g.frozen)
        .then(|| "frozen".to_string());
    match &l.access_credentials {
        Some(c) => set_condition(
            &mut conds,
            Condition::new(
                condition_types::ACCESS_CREDENTIALS_SYNCHRONIZED,
                ConditionStatus::from_bool(c.synchronized),
                if c.synchronized {
                    "AccessCredentialsSyncSuccess"
                } else {
                    "AccessCredentialsSyncFailed"
                },
                &c.message,
            ),
        ),
        None => remove_condition(&mut conds, condition_types::ACCESS_CREDENTIALS_SYNCHRONIZED),
    }
    status.conditions = (!conds.is_empty()).then_some(conds);
    status
}

/// The interfaces of the domain (the pod network's, with the pod's IP) merged with what the
/// guest agent reports, matched by MAC as KubeVirt does: a match gets the guest's name and
/// `infoSource: domain, guest-agent`; a guest interface the domain does not know is added
/// with `infoSource: guest-agent`. Addresses: per IP family, what the domain knew stays
/// (the pod IP) and the guest's fill the families it did not know. A masquerade interface
/// keeps the pod's IP first whatever the guest reports (its 10.0.2.2 is the NAT's inside,
/// unreachable from the cluster: kubevirt/kubevirt#18760).
pub fn merge_interfaces(
    mut domain: Vec<kubevirt_api::vmi::VirtualMachineInstanceNetworkInterface>,
    guest: &[virt_domain::protocol::GuestInterface],
    vmi: &kubevirt_api::VirtualMachineInstance,
) -> Vec<kubevirt_api::vmi::VirtualMachineInstanceNetworkInterface> {
    let masquerade = |name: Option<&str>| {
        vmi.spec
            .domain
            .devices
            .interfaces
            .iter()
            .flatten()
            .any(|i| Some(i.name.as_str()) == name && i.masquerade.is_some())
    };
    let v6 = |ip: &str| ip.contains(':');
    for g in guest {
        let by_mac = domain.iter().position(|d| {
            d.mac
                .as_deref()
                .zip(g.mac.as_deref())
                .is_some_and(|(a, b)| a.eq_ignore_ascii_case(b))
        });
        // A bridge binding hands the guest the pod's address and MAC, whose MAC the
        // status may not know: the address tells then.
        let by_ip = || {
            domain.iter().position(|d| {
                d.mac.is_none()
                    && d.ip_addresses
                        .iter()
                        .flatten()
                        .any(|ip| g.ip_addresses.contains(ip))
            })
        };
        match by_mac.or_else(by_ip).and_then(|i| domain.get_mut(i)) {
            Some(d) => {
                if d.mac.is_none() {
                    d.mac.clone_from(&g.mac);
                }
                d.interface_name = Some(g.name.clone());
                d.info_source = Some(INFO_SOURCE_DOMAIN_AND_GA.into());
                let known = d.ip_addresses.clone().unwrap_or_default();
                let mut ips = Vec::new();
                for family6 in [false, true] {
                    let mine: Vec<&String> = known.iter().filter(|ip| v6(ip) == family6).collect();
                    let theirs: Vec<&String> = g
                        .ip_addresses
                        .iter()
                        .filter(|ip| v6(ip) == family6)
                        .collect();
                    let keep_mine =
                        !mine.is_empty() && (!theirs.is_empty() || masquerade(d.name.as_deref()));
                    ips.extend(if keep_mine { mine } else { theirs }.into_iter().cloned());
                }
                if masquerade(d.name.as_deref()) {
                    // The pod's address first, as the domain reported it.
                    if let Some(first) = known.first() {
                        ips.retain(|ip| ip != first);
                        ips.insert(0, first.clone());
                    }
                }
                d.ip_address = ips.first().cloned();
                d.ip_addresses = (!ips.is_empty()).then_some(ips);
            }
            None => domain.push(kubevirt_api::vmi::VirtualMachineInstanceNetworkInterface {
                ip_address: g.ip_addresses.first().cloned(),
                ip_addresses: (!g.ip_addresses.is_empty()).then(|| g.ip_addresses.clone()),
                mac: g.mac.clone(),
                interface_name: Some(g.name.clone()),
                info_source: Some(INFO_SOURCE_GUEST_AGENT.into()),
                ..Default::default()
            }),
        }
    }
    domain
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
    "guestOSInfo",
    "fsFreezeStatus",
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

    fn agent_status(ifs: Vec<virt_domain::protocol::GuestInterface>) -> LauncherStatus {
        LauncherStatus {
            state: DomainState::Running,
            guest_agent_connected: true,
            guest_agent: Some(Box::new(virt_domain::protocol::GuestAgentStatus {
                version: "7.2.0".into(),
                supported_commands: kubevirt_api::guestagent::REQUIRED_COMMANDS
                    .iter()
                    .map(|n| kubevirt_api::guestagent::GuestAgentCommand {
                        name: (*n).into(),
                        enabled: true,
                    })
                    .collect(),
                os: kubevirt_api::guestagent::GuestOsInfo {
                    id: "debian".into(),
                    ..Default::default()
                },
                interfaces: ifs,
                frozen: false,
            })),
            ..LauncherStatus::default()
        }
    }

    fn gif(name: &str, mac: &str, ips: &[&str]) -> virt_domain::protocol::GuestInterface {
        virt_domain::protocol::GuestInterface {
            name: name.into(),
            mac: Some(mac.into()),
            ip_addresses: ips.iter().map(|s| (*s).to_string()).collect(),
        }
    }

    fn vmi_with(binding: &str) -> kubevirt_api::VirtualMachineInstance {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "uid": "u1"},
            "spec": {"domain": {"devices": {"interfaces": [{"name": "default", binding: {}}]}},
                     "networks": [{"name": "default", "pod": {}}]}
        }))
        .unwrap()
    }

    #[test]
    fn masquerade_keeps_the_pod_ip_and_the_guest_adds_names_and_addresses() {
        let vmi = vmi_with("masquerade");
        let base = with_pod_interface(Default::default(), &vmi, Some("10.244.0.7"));
        let mac = base.interfaces.as_ref().unwrap()[0].mac.clone().unwrap();
        let l = agent_status(vec![
            gif(
                "enp1s0",
                &mac.to_uppercase(),
                &["10.0.2.2", "fd10:0:2::2", "fe80::1"],
            ),
            gif("dummy0", "aa:bb:cc:dd:ee:ff", &["192.168.9.1"]),
        ]);
        let s = with_guest_agent(base, &vmi, &l);
        let ifs = s.interfaces.clone().unwrap();
        assert_eq!(ifs[0].ip_address.as_deref(), Some("10.244.0.7"), "#18760");
        assert_eq!(
            ifs[0].ip_addresses.as_deref().unwrap(),
            ["10.244.0.7", "fd10:0:2::2", "fe80::1"]
        );
        assert_eq!(ifs[0].interface_name.as_deref(), Some("enp1s0"));
        assert_eq!(ifs[0].info_source.as_deref(), Some("domain, guest-agent"));
        assert_eq!(ifs[0].name.as_deref(), Some("default"));
        assert_eq!(ifs[1].info_source.as_deref(), Some("guest-agent"));
        assert_eq!(ifs[1].ip_address.as_deref(), Some("192.168.9.1"));
        assert_eq!(ifs[1].name, None);
        assert_eq!(s.guest_os_info.id, "debian");
        assert!(s.condition("AgentVersionNotSupported").is_none());
        assert_eq!(s.fs_freeze_status, None);
        // A guest that lost its IPv4 address: the pod's stays on masquerade.
        let l = agent_status(vec![gif("enp1s0", &mac, &[])]);
        let s = with_guest_agent(
            with_pod_interface(Default::default(), &vmi, Some("10.244.0.7")),
            &vmi,
            &l,
        );
        assert_eq!(
            s.interfaces.unwrap()[0].ip_address.as_deref(),
            Some("10.244.0.7")
        );
    }

    #[test]
    fn bridge_takes_the_guests_addresses_of_families_the_pod_lacks() {
        let vmi = vmi_with("bridge");
        let base = with_pod_interface(Default::default(), &vmi, Some("10.244.0.7"));
        let mac = base.interfaces.as_ref().unwrap()[0].mac.clone();
        assert_eq!(
            mac, None,
            "bridge: the pod's MAC, which the plan does not know"
        );
        let l = agent_status(vec![gif(
            "eth0",
            "0a:58:0a:f4:00:07",
            &["10.244.0.7", "fe80::2"],
        )]);
        let s = with_guest_agent(base, &vmi, &l);
        let ifs = s.interfaces.unwrap();
        assert_eq!(ifs.len(), 1, "{ifs:?}");
        let i = &ifs[0];
        assert_eq!(
            i.ip_addresses.as_deref().unwrap(),
            ["10.244.0.7", "fe80::2"]
        );
        assert_eq!(i.mac.as_deref(), Some("0a:58:0a:f4:00:07"));
        assert_eq!(i.info_source.as_deref(), Some("domain, guest-agent"));
    }

    #[test]
    fn agent_conditions_freeze_and_credentials_follow_the_launcher() {
        let vmi = vmi_with("masquerade");
        let mut l = agent_status(vec![]);
        if let Some(g) = l.guest_agent.as_mut() {
            g.supported_commands
                .retain(|c| c.name != "guest-get-osinfo");
            g.frozen = true;
        }
        l.access_credentials = Some(virt_domain::protocol::CredentialsStatus {
            synchronized: false,
            message: "Secret \"keys\" is missing or empty".into(),
        });
        let s = with_guest_agent(Default::default(), &vmi, &l);
        let c = s.condition("AgentVersionNotSupported").unwrap();
        assert_eq!(c.status, ConditionStatus::True);
        assert_eq!(
            c.reason.as_deref(),
            Some("This guest agent doesn't support required basic commands")
        );
        assert_eq!(s.fs_freeze_status.as_deref(), Some("frozen"));
        let c = s.condition("AccessCredentialsSynchronized").unwrap();
        assert_eq!(c.status, ConditionStatus::False);
        assert!(c.message.as_deref().unwrap().contains("\"keys\""));
        let patch = status_patch(&Default::default(), &s).unwrap();
        assert_eq!(patch["status"]["fsFreezeStatus"], "frozen");
        assert_eq!(patch["status"]["guestOSInfo"]["id"], "debian");
        // The agent gone: its condition, OS info stays (KubeVirt keeps the last), freeze gone.
        let gone = LauncherStatus {
            state: DomainState::Running,
            ..LauncherStatus::default()
        };
        let s2 = with_guest_agent(s.clone(), &vmi, &gone);
        assert!(s2.condition("AgentVersionNotSupported").is_none());
        assert!(s2.condition("AccessCredentialsSynchronized").is_none());
        assert_eq!(s2.fs_freeze_status, None);
        assert_eq!(
            status_patch(&s, &s2).unwrap()["status"]["fsFreezeStatus"],
            serde_json::Value::Null
        );
    }

    #[test]
    fn a_readiness_probe_holds_ready_and_a_failed_liveness_probe_fails_the_vmi() {
        let running = vmi_status(&Default::default(), &launcher(DomainState::Running));
        let held = with_readiness(running.clone(), Some(false));
        let c = held.condition("Ready").unwrap();
        assert_eq!(
            (c.status, c.reason.as_deref()),
            (ConditionStatus::False, Some("GuestNotReady"))
        );
        assert_eq!(with_readiness(running.clone(), Some(true)), running);
        assert_eq!(with_readiness(running.clone(), None), running);
        let dead = vmi_status(&running, &Observation::LivenessFailed("3 in a row".into()));
        assert_eq!(dead.phase, Phase::Failed);
        assert_eq!(
            dead.reason.as_deref(),
            Some("LivenessProbeFailed: 3 in a row")
        );
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
