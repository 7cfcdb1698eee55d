//! Pure mapping from a lifecycle command to the HTTP request KubeVirt's
//! subresource API expects. No I/O here, so every path and body is
//! unit-tested against the KubeVirt contract.

use crate::error::{CliError, Target};

pub const SUBRESOURCES_GROUP: &str = kubevirt_api::SUBRESOURCES_GROUP;
pub const SUBRESOURCES_VERSION: &str = "v1";

use kubevirt_api::catalogue::{self, Subresource, VmAction, VmiActionDef};
use kubevirt_api::options::{PauseOptions, dry_run_all};

/// A lifecycle action on a VM or VMI, after flag validation.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Any VM action of the catalogue, with its options (its body).
    Vm(VmAction),
    /// Any VMI action of the catalogue; its body is `dryRun` alone (the options of every
    /// action that has a command).
    Vmi {
        def: &'static VmiActionDef,
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
            Self::Vm(a) => a.def().subresource,
            Self::Vmi { def, .. } => def.subresource,
        }
    }

    fn verb_for_messages(&self) -> &'static str {
        match self {
            Self::Vm(a) => a.def().verb,
            Self::Vmi { def, .. } => def.command.map_or(def.subresource.name, |c| c.verb),
        }
    }

    pub fn is_dry_run(&self) -> bool {
        match self {
            Self::Vm(a) => a.dry_run() == Ok(true),
            Self::Vmi { dry_run, .. } => *dry_run,
        }
    }

    fn body(&self) -> Result<serde_json::Value, serde_json::Error> {
        match self {
            Self::Vm(a) => serde_json::to_value(a),
            Self::Vmi { dry_run, .. } => serde_json::to_value(PauseOptions {
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

/// The action of a VM action's command line (`--grace-period`, `--force`, …), checked as
/// its catalogue entry checks them.
pub fn vm_action(c: &crate::cli::VmActionCommand) -> Result<Action, CliError> {
    (c.command.build)(&c.flags, c.dry_run)
        .map(Action::Vm)
        .map_err(CliError::Usage)
}

/// `evacuate/cancel` of a VMI (`vmi`) or of a VM's instance.
pub fn evacuate_cancel(vmi: bool, dry_run: bool) -> Action {
    let o = kubevirt_api::options::EvacuateCancelOptions {
        dry_run: dry_run_all(dry_run),
    };
    Action::Vm(if vmi {
        VmAction::EvacuateCancelVmi(o)
    } else {
        VmAction::EvacuateCancelVm(o)
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use serde_json::json;

    fn req(a: Action) -> SubresourceRequest {
        a.request("ns1", "vm1").unwrap()
    }

    /// The action a VM action's command builds from these flags.
    fn build(
        def: &catalogue::VmActionDef,
        flags: catalogue::FlagValues,
        dry_run: bool,
    ) -> Result<Action, String> {
        (def.command.expect("a command").build)(&flags, dry_run).map(Action::Vm)
    }

    fn grace_flags(grace_period: Option<i64>, force: bool) -> catalogue::FlagValues {
        catalogue::FlagValues {
            switches: if force { vec!["force"] } else { vec![] },
            integers: grace_period
                .map(|g| ("grace-period", g))
                .into_iter()
                .collect(),
            lists: vec![],
        }
    }

    fn stop_action(g: Option<i64>, force: bool, dry_run: bool) -> Result<Action, String> {
        build(&catalogue::STOP_ACTION, grace_flags(g, force), dry_run)
    }

    fn restart_action(g: Option<i64>, force: bool, dry_run: bool) -> Result<Action, String> {
        build(&catalogue::RESTART_ACTION, grace_flags(g, force), dry_run)
    }

    fn start_action(paused: bool, dry_run: bool) -> Action {
        let flags = catalogue::FlagValues {
            switches: if paused { vec!["paused"] } else { vec![] },
            ..Default::default()
        };
        build(&catalogue::START_ACTION, flags, dry_run).unwrap()
    }

    fn migrate_action(selector: &[String], dry_run: bool) -> Result<Action, String> {
        let flags = catalogue::FlagValues {
            lists: vec![("added-node-selector", selector.to_vec())],
            ..Default::default()
        };
        build(&catalogue::MIGRATE_ACTION, flags, dry_run)
    }

    #[test]
    fn start_paths_and_bodies() {
        let r = req(start_action(false, false));
        assert_eq!(
            r.path,
            "/apis/subresources.kubevirt.io/v1/namespaces/ns1/virtualmachines/vm1/start"
        );
        assert_eq!(r.body, json!({}));
        assert_eq!(r.target.subresource, Some("start"));
        assert_eq!(r.target.verb, "update");
        let r = req(start_action(true, true));
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
        let r = req(migrate_action(&["zone=a, disk=ssd".into(), "x=1".into()], true).unwrap());
        assert_eq!(
            r.path,
            "/apis/subresources.kubevirt.io/v1/namespaces/ns1/virtualmachines/vm1/migrate"
        );
        assert_eq!(
            r.body,
            json!({"dryRun": ["All"], "addedNodeSelector": {"disk": "ssd", "x": "1", "zone": "a"}})
        );
        let r = req(migrate_action(&[], false).unwrap());
        assert_eq!(r.body, json!({}));
        assert!(migrate_action(&["novalue".into()], false).is_err());
        assert!(migrate_action(&["=v".into()], false).is_err());
    }

    #[test]
    fn evacuate_cancel_paths_and_confirmations() {
        let r = req(evacuate_cancel(true, true));
        assert!(
            r.path
                .ends_with("/virtualmachineinstances/vm1/evacuate/cancel")
        );
        assert_eq!(r.body, json!({"dryRun": ["All"]}));
        assert_eq!(r.target.action, "cancel its evacuation");
        assert_eq!(r.target.kind, "VMI");
        let r = req(evacuate_cancel(false, false));
        assert!(r.path.ends_with("/virtualmachines/vm1/evacuate/cancel"));
        assert_eq!(r.body, json!({}));
        assert_eq!(r.target.kind, "VM");
        assert!(!evacuate_cancel(false, false).is_dry_run());
        assert!(evacuate_cancel(false, true).is_dry_run());
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
