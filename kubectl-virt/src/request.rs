//! Pure mapping from a lifecycle command to the HTTP request KubeVirt's
//! subresource API expects. No I/O here, so every path and body is
//! unit-tested against the KubeVirt contract.

use std::collections::BTreeMap;

use crate::error::{CliError, Target};

pub const SUBRESOURCES_GROUP: &str = kubevirt_api::SUBRESOURCES_GROUP;
pub const SUBRESOURCES_VERSION: &str = "v1";

use kubevirt_api::catalogue::{self, Subresource, VmiActionDef};
use kubevirt_api::options::{
    EvacuateCancelOptions, MigrateOptions, PauseOptions, RestartOptions, StartOptions, StopOptions,
    dry_run_all,
};

/// A lifecycle action on a VM or VMI, after flag validation.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    Start {
        paused: bool,
        dry_run: bool,
    },
    Stop {
        grace_period: Option<i64>,
        dry_run: bool,
    },
    Restart {
        grace_period_seconds: Option<i64>,
        dry_run: bool,
    },
    Migrate {
        added_node_selector: BTreeMap<String, String>,
        dry_run: bool,
    },
    /// Any VMI action of the catalogue; its body is `dryRun` alone (the options of every
    /// action that has a command).
    Vmi {
        def: &'static VmiActionDef,
        dry_run: bool,
    },
    /// `evacuate/cancel` of a VMI (or of a VM's instance, `vmi: false`).
    EvacuateCancel {
        vmi: bool,
        dry_run: bool,
    },
}

/// A fully described subresource call: `PUT path` with a JSON body.
#[derive(Clone, Debug, PartialEq)]
pub struct SubresourceRequest {
    pub path: String,
    pub body: serde_json::Value,
    pub target: Target,
}

/// Rejects names that could not be Kubernetes object names, so that a typo
/// like `vm/x` cannot turn into a different URL.
pub fn validate_name(what: &str, name: &str) -> Result<(), CliError> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name
            .as_bytes()
            .first()
            .is_some_and(u8::is_ascii_alphanumeric)
        && name
            .as_bytes()
            .last()
            .is_some_and(u8::is_ascii_alphanumeric);
    if ok {
        Ok(())
    } else {
        Err(CliError::Usage(format!(
            "invalid {what} {name:?}: must be a lowercase RFC 1123 name (a-z, 0-9, '-', '.')"
        )))
    }
}

impl Action {
    /// The subresource this action calls.
    fn endpoint(&self) -> &'static Subresource {
        match self {
            Self::Start { .. } => &catalogue::START,
            Self::Stop { .. } => &catalogue::STOP,
            Self::Restart { .. } => &catalogue::RESTART,
            Self::Migrate { .. } => &catalogue::MIGRATE,
            Self::Vmi { def, .. } => def.subresource,
            Self::EvacuateCancel { vmi: true, .. } => &catalogue::EVACUATE_CANCEL_VMI,
            Self::EvacuateCancel { vmi: false, .. } => &catalogue::EVACUATE_CANCEL_VM,
        }
    }

    fn verb_for_messages(&self) -> &'static str {
        match self {
            Self::Start { .. } => "start",
            Self::Stop { .. } => "stop",
            Self::Restart { .. } => "restart",
            Self::Migrate { .. } => "migrate",
            Self::Vmi { def, .. } => def.command.map_or(def.subresource.name, |c| c.verb),
            Self::EvacuateCancel { .. } => "cancel its evacuation",
        }
    }

    pub fn is_dry_run(&self) -> bool {
        match self {
            Self::Start { dry_run, .. }
            | Self::Stop { dry_run, .. }
            | Self::Restart { dry_run, .. }
            | Self::Migrate { dry_run, .. }
            | Self::Vmi { dry_run, .. }
            | Self::EvacuateCancel { dry_run, .. } => *dry_run,
        }
    }

    fn body(&self) -> Result<serde_json::Value, serde_json::Error> {
        match self {
            Self::Start { paused, dry_run } => serde_json::to_value(StartOptions {
                paused: *paused,
                dry_run: dry_run_all(*dry_run),
            }),
            Self::Stop {
                grace_period,
                dry_run,
            } => serde_json::to_value(StopOptions {
                grace_period: *grace_period,
                dry_run: dry_run_all(*dry_run),
            }),
            Self::Restart {
                grace_period_seconds,
                dry_run,
            } => serde_json::to_value(RestartOptions {
                grace_period_seconds: *grace_period_seconds,
                dry_run: dry_run_all(*dry_run),
            }),
            Self::Migrate {
                added_node_selector,
                dry_run,
            } => serde_json::to_value(MigrateOptions {
                dry_run: dry_run_all(*dry_run),
                added_node_selector: (!added_node_selector.is_empty())
                    .then(|| added_node_selector.clone()),
            }),
            Self::Vmi { dry_run, .. } => serde_json::to_value(PauseOptions {
                dry_run: dry_run_all(*dry_run),
            }),
            Self::EvacuateCancel { dry_run, .. } => serde_json::to_value(EvacuateCancelOptions {
                dry_run: dry_run_all(*dry_run),
            }),
        }
    }

    /// The request for this action on the object `name` in `namespace`.
    pub fn request(&self, namespace: &str, name: &str) -> Result<SubresourceRequest, CliError> {
        let sub = self.endpoint();
        let kind = if *sub.kind == catalogue::VIRTUAL_MACHINE_INSTANCE {
            "VMI"
        } else {
            "VM"
        };
        let body = self
            .body()
            .map_err(|e| CliError::Protocol(format!("encoding {} options: {e}", sub.name)))?;
        Ok(SubresourceRequest {
            path: sub.path(namespace, name),
            body,
            target: Target {
                kind,
                group: SUBRESOURCES_GROUP,
                resource: sub.kind.plural,
                subresource: Some(sub.name),
                verb: sub.rbac_verb(),
                action: self.verb_for_messages(),
                name: name.to_owned(),
                namespace: namespace.to_owned(),
            },
        })
    }
}

/// Flags of `stop`, validated the way virtctl does: a grace period is only
/// sent with `--force`, and `--force` needs one.
pub fn stop_action(
    grace_period: Option<i64>,
    force: bool,
    dry_run: bool,
) -> Result<Action, CliError> {
    match (force, grace_period) {
        (true, None) => Err(CliError::Usage(
            "--force needs --grace-period (e.g. --force --grace-period=0)".into(),
        )),
        (false, Some(_)) => Err(CliError::Usage(
            "--grace-period only takes effect together with --force".into(),
        )),
        (_, Some(g)) if g < 0 => Err(CliError::Usage(format!(
            "--grace-period must be 0 or more, got {g}"
        ))),
        (true, Some(g)) => Ok(Action::Stop {
            grace_period: Some(g),
            dry_run,
        }),
        (false, None) => Ok(Action::Stop {
            grace_period: None,
            dry_run,
        }),
    }
}

/// Flags of `restart`: KubeVirt only supports an immediate forced restart
/// (`gracePeriodSeconds: 0`), so anything else is refused here rather than
/// by a 400 from the server.
pub fn restart_action(
    grace_period: Option<i64>,
    force: bool,
    dry_run: bool,
) -> Result<Action, CliError> {
    match (force, grace_period) {
        (true, None | Some(0)) => Ok(Action::Restart {
            grace_period_seconds: Some(0),
            dry_run,
        }),
        (true, Some(g)) => Err(CliError::Usage(format!(
            "a forced restart only supports --grace-period=0, got {g}"
        ))),
        (false, Some(_)) => Err(CliError::Usage(
            "--grace-period only takes effect together with --force".into(),
        )),
        (false, None) => Ok(Action::Restart {
            grace_period_seconds: None,
            dry_run,
        }),
    }
}

/// Parses `k=v,k2=v2` (as virtctl's `--addedNodeSelector`).
pub fn parse_node_selector(raw: &[String]) -> Result<BTreeMap<String, String>, CliError> {
    let mut out = BTreeMap::new();
    for item in raw.iter().flat_map(|s| s.split(',')) {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let Some((k, v)) = item.split_once('=') else {
            return Err(CliError::Usage(format!(
                "invalid node selector {item:?}: expected key=value"
            )));
        };
        if k.trim().is_empty() {
            return Err(CliError::Usage(format!(
                "invalid node selector {item:?}: empty key"
            )));
        }
        out.insert(k.trim().to_owned(), v.trim().to_owned());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use serde_json::json;

    fn req(a: Action) -> SubresourceRequest {
        a.request("ns1", "vm1").unwrap()
    }

    #[test]
    fn start_paths_and_bodies() {
        let r = req(Action::Start {
            paused: false,
            dry_run: false,
        });
        assert_eq!(
            r.path,
            "/apis/subresources.kubevirt.io/v1/namespaces/ns1/virtualmachines/vm1/start"
        );
        assert_eq!(r.body, json!({}));
        assert_eq!(r.target.subresource, Some("start"));
        assert_eq!(r.target.verb, "update");
        let r = req(Action::Start {
            paused: true,
            dry_run: true,
        });
        assert_eq!(r.body, json!({"paused": true, "dryRun": ["All"]}));
    }

    #[test]
    fn stop_flags() {
        let r = req(stop_action(None, false, false).unwrap());
        assert_eq!(
            r.path,
            "/apis/subresources.kubevirt.io/v1/namespaces/ns1/virtualmachines/vm1/stop"
        );
        assert_eq!(r.body, json!({}));
        let r = req(stop_action(Some(0), true, true).unwrap());
        assert_eq!(r.body, json!({"gracePeriod": 0, "dryRun": ["All"]}));
        assert!(stop_action(None, true, false).is_err());
        assert!(stop_action(Some(5), false, false).is_err());
        assert!(stop_action(Some(-1), true, false).is_err());
    }

    #[test]
    fn restart_flags() {
        let r = req(restart_action(None, false, false).unwrap());
        assert_eq!(
            r.path,
            "/apis/subresources.kubevirt.io/v1/namespaces/ns1/virtualmachines/vm1/restart"
        );
        assert_eq!(r.body, json!({}));
        let r = req(restart_action(None, true, false).unwrap());
        assert_eq!(r.body, json!({"gracePeriodSeconds": 0}));
        let r = req(restart_action(Some(0), true, true).unwrap());
        assert_eq!(r.body, json!({"gracePeriodSeconds": 0, "dryRun": ["All"]}));
        assert!(restart_action(Some(30), true, false).is_err());
        assert!(restart_action(Some(0), false, false).is_err());
    }

    #[test]
    fn migrate_body() {
        let sel = parse_node_selector(&["zone=a, disk=ssd".into(), "x=1".into()]).unwrap();
        let r = req(Action::Migrate {
            added_node_selector: sel,
            dry_run: true,
        });
        assert_eq!(
            r.path,
            "/apis/subresources.kubevirt.io/v1/namespaces/ns1/virtualmachines/vm1/migrate"
        );
        assert_eq!(
            r.body,
            json!({"dryRun": ["All"], "addedNodeSelector": {"disk": "ssd", "x": "1", "zone": "a"}})
        );
        let r = req(Action::Migrate {
            added_node_selector: BTreeMap::new(),
            dry_run: false,
        });
        assert_eq!(r.body, json!({}));
        assert!(parse_node_selector(&["novalue".into()]).is_err());
        assert!(parse_node_selector(&["=v".into()]).is_err());
    }

    #[test]
    fn vmi_actions() {
        let vmi = |def, dry_run| Action::Vmi { def, dry_run };
        let r = req(vmi(&catalogue::PAUSE_ACTION, false));
        assert_eq!(
            r.path,
            "/apis/subresources.kubevirt.io/v1/namespaces/ns1/virtualmachineinstances/vm1/pause"
        );
        assert_eq!(r.target.resource, "virtualmachineinstances");
        assert_eq!(r.target.kind, "VMI");
        assert_eq!(r.body, json!({}));
        let r = req(vmi(&catalogue::UNPAUSE_ACTION, true));
        assert!(r.path.ends_with("/virtualmachineinstances/vm1/unpause"));
        assert_eq!(r.body, json!({"dryRun": ["All"]}));
        let r = req(vmi(&catalogue::SOFTREBOOT_ACTION, false));
        assert!(r.path.ends_with("/virtualmachineinstances/vm1/softreboot"));
        assert_eq!(r.target.subresource, Some("softreboot"));
    }

    #[test]
    fn names_are_validated() {
        assert!(validate_name("VM name", "vm-1.a").is_ok());
        for bad in ["", "Vm", "a/b", "-a", "a-", "a b", "a?x=1"] {
            assert!(validate_name("VM name", bad).is_err(), "{bad:?}");
        }
    }
}
