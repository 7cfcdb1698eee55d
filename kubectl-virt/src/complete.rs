//! `kubectl virt <TAB>`: kubectl (1.26+) completes plugin arguments by
//! running `kubectl_complete-virt ARGS… PARTIAL` and reading cobra's
//! protocol: one candidate per line, then `:<directive>`. Symlink
//! `kubectl-virt` as `kubectl_complete-virt` on PATH to enable it;
//! `kubectl-virt __complete ARGS… PARTIAL` does the same.

use std::time::Duration;

use clap::CommandFactory;
use kube::Api;
use kube::api::ListParams;

use crate::cli::{Cli, action_command, vm_command};
use crate::connect::GlobalArgs;

/// The hidden argument cobra-style completion is requested with.
pub const COMPLETE_ARG: &str = "__complete";
/// Executable name kubectl runs for plugin completion.
pub const COMPLETE_BIN: &str = "kubectl_complete-virt";

/// cobra's ShellCompDirective bits.
pub const DIRECTIVE_DEFAULT: u32 = 0;
pub const DIRECTIVE_NO_FILE_COMP: u32 = 4;

/// A remote lookup the static analysis asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    Vms,
    Vmis,
    Namespaces,
}

/// What to offer for the word being completed.
#[derive(Clone, Debug)]
pub struct Plan {
    pub candidates: Vec<String>,
    pub lookup: Option<Lookup>,
    pub directive: u32,
    /// Connection flags already typed, so lookups hit the same cluster.
    pub global: GlobalArgs,
}

/// Commands whose first positional names a VM or a VMI.
fn name_lookup(cmd: &str) -> Option<Lookup> {
    match cmd {
        "migrate-cancel" => Some(Lookup::Vms),
        // The VM actions (start, stop, …).
        c if vm_command(c).is_some() => Some(Lookup::Vms),
        "console" | "vnc" => Some(Lookup::Vmis),
        // The VMI actions that take a VMI's name (soft-reboot, reset, …).
        c => action_command(c)
            .filter(|(_, c)| !c.vm_or_vmi)
            .map(|_| Lookup::Vmis),
    }
}

/// Whether `cmd` is a VMI action taking `vm|vmi NAME` (pause, unpause, …).
fn takes_vm_or_vmi(cmd: &str) -> bool {
    action_command(cmd).is_some_and(|(_, c)| c.vm_or_vmi)
}

fn takes_value(cmd: &clap::Command, flag: &str) -> bool {
    cmd.get_arguments().any(|a| {
        let long = flag
            .strip_prefix("--")
            .is_some_and(|l| a.get_long() == Some(l));
        let short = flag.len() == 2
            && flag
                .strip_prefix('-')
                .and_then(|s| s.chars().next())
                .is_some_and(|c| a.get_short() == Some(c));
        (long || short) && a.get_action().takes_values()
    })
}

/// Static part of completion: no I/O. `args` are the words before the one
/// being completed; `cur` is that (possibly empty) word.
pub fn plan(args: &[String], cur: &str) -> Plan {
    let root = Cli::command();
    let mut cmd = root.clone();
    let mut path: Vec<String> = Vec::new();
    let mut positionals: Vec<String> = Vec::new();
    let mut global = GlobalArgs::default();
    let mut pending_flag: Option<String> = None;

    for w in args {
        if let Some(flag) = pending_flag.take() {
            match flag.as_str() {
                "-n" | "--namespace" => global.namespace = Some(w.clone()),
                "--context" => global.context = Some(w.clone()),
                "--kubeconfig" => global.kubeconfig = Some(w.into()),
                "--cluster" => global.cluster = Some(w.clone()),
                "--user" => global.user = Some(w.clone()),
                _ => {}
            }
            continue;
        }
        if w.starts_with('-') {
            if let Some((flag, value)) = w.split_once('=') {
                match flag {
                    "--namespace" => global.namespace = Some(value.to_owned()),
                    "--context" => global.context = Some(value.to_owned()),
                    "--kubeconfig" => global.kubeconfig = Some(value.into()),
                    _ => {}
                }
            } else if takes_value(&cmd, w) || takes_value(&root, w) {
                pending_flag = Some(w.clone());
            }
            continue;
        }
        if positionals.is_empty()
            && let Some(sub) = cmd.find_subcommand(w).cloned()
        {
            path.push(w.clone());
            cmd = sub;
            continue;
        }
        positionals.push(w.clone());
    }

    let mut out = Plan {
        candidates: Vec::new(),
        lookup: None,
        directive: DIRECTIVE_NO_FILE_COMP,
        global,
    };
    if let Some(flag) = pending_flag {
        match flag.as_str() {
            "-n" | "--namespace" => out.lookup = Some(Lookup::Namespaces),
            // Paths: let the shell complete files.
            "--kubeconfig" | "--password-file" => out.directive = DIRECTIVE_DEFAULT,
            _ => {}
        }
        return out;
    }
    if cur.starts_with('-') {
        let mut flags: Vec<String> = cmd
            .get_arguments()
            .chain(root.get_arguments().filter(|a| a.is_global_set()))
            .filter(|a| !a.is_hide_set())
            .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
            .filter(|f| f.starts_with(cur))
            .collect();
        flags.sort();
        flags.dedup();
        out.candidates = flags;
        return out;
    }
    if cmd.has_subcommands() && positionals.is_empty() {
        out.candidates = cmd
            .get_subcommands()
            .filter(|s| !s.is_hide_set())
            .map(|s| s.get_name().to_owned())
            .filter(|n| n != "help" && n.starts_with(cur))
            .collect();
        return out;
    }
    let leaf = path.last().map(String::as_str).unwrap_or_default();
    match (leaf, positionals.len()) {
        (leaf, 0) if takes_vm_or_vmi(leaf) => {
            out.candidates = ["vm", "vmi"]
                .into_iter()
                .filter(|k| k.starts_with(cur))
                .map(str::to_owned)
                .collect();
        }
        (leaf, 1) if takes_vm_or_vmi(leaf) => {
            out.lookup = Some(if positionals[0] == "vmi" {
                Lookup::Vmis
            } else {
                Lookup::Vms
            });
        }
        ("completion", 0) => {
            out.candidates = ["bash", "elvish", "fish", "powershell", "zsh"]
                .into_iter()
                .filter(|k| k.starts_with(cur))
                .map(str::to_owned)
                .collect();
        }
        (leaf, 0) => out.lookup = name_lookup(leaf),
        _ => {}
    }
    out
}

/// Names from the cluster; any failure (no cluster, no permission) just
/// yields no candidates, as completion must never print errors.
async fn lookup(plan: &Plan, cur: &str) -> Vec<String> {
    let Some(kind) = &plan.lookup else {
        return Vec::new();
    };
    let fetch = async {
        let session = plan.global.session().await.ok()?;
        let lp = ListParams::default();
        let names: Vec<String> = match kind {
            Lookup::Vms => Api::<kubevirt_api::VirtualMachine>::namespaced(
                session.client.clone(),
                &session.namespace,
            )
            .list_metadata(&lp)
            .await
            .ok()?
            .items
            .into_iter()
            .filter_map(|o| o.metadata.name)
            .collect(),
            Lookup::Vmis => Api::<kubevirt_api::VirtualMachineInstance>::namespaced(
                session.client.clone(),
                &session.namespace,
            )
            .list_metadata(&lp)
            .await
            .ok()?
            .items
            .into_iter()
            .filter_map(|o| o.metadata.name)
            .collect(),
            Lookup::Namespaces => {
                Api::<k8s_openapi::api::core::v1::Namespace>::all(session.client.clone())
                    .list_metadata(&lp)
                    .await
                    .ok()?
                    .items
                    .into_iter()
                    .filter_map(|o| o.metadata.name)
                    .collect()
            }
        };
        Some(names)
    };
    tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .ok()
        .flatten()
        .unwrap_or_default()
        .into_iter()
        .filter(|n| n.starts_with(cur))
        .collect()
}

/// Runs the completion protocol for `words` (everything after
/// `__complete`; the last word is the one being completed).
pub async fn run(words: &[String]) -> String {
    let (cur, args) = match words.split_last() {
        Some((cur, args)) => (cur.as_str(), args),
        None => ("", words),
    };
    let plan = plan(args, cur);
    let mut candidates = plan.candidates.clone();
    candidates.extend(lookup(&plan, cur).await);
    render(&candidates, plan.directive)
}

/// cobra's wire format.
pub fn render(candidates: &[String], directive: u32) -> String {
    let mut out = String::new();
    for c in candidates {
        out.push_str(c);
        out.push('\n');
    }
    out.push_str(&format!(":{directive}\n"));
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn p(args: &[&str], cur: &str) -> Plan {
        let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
        plan(&args, cur)
    }

    #[test]
    fn subcommands() {
        let pl = p(&[], "st");
        assert_eq!(pl.candidates, vec!["start", "stop"]);
        assert_eq!(pl.directive, DIRECTIVE_NO_FILE_COMP);
        let pl = p(&["create"], "");
        assert_eq!(pl.candidates, vec!["vm"]);
    }

    #[test]
    fn names_need_lookups() {
        assert_eq!(p(&["start"], "").lookup, Some(Lookup::Vms));
        assert_eq!(
            p(&["-n", "prod", "console"], "f").lookup,
            Some(Lookup::Vmis)
        );
        assert_eq!(
            p(&["-n", "prod", "console"], "f")
                .global
                .namespace
                .as_deref(),
            Some("prod")
        );
        assert_eq!(p(&["start", "vm1"], "").lookup, None);
        assert_eq!(p(&["pause"], "").candidates, vec!["vm", "vmi"]);
        assert_eq!(p(&["pause", "vmi"], "").lookup, Some(Lookup::Vmis));
        assert_eq!(p(&["unpause", "vm"], "").lookup, Some(Lookup::Vms));
        assert_eq!(p(&["soft-reboot"], "").lookup, Some(Lookup::Vmis));
        assert_eq!(p(&["reset"], "").lookup, Some(Lookup::Vmis));
    }

    #[test]
    fn flags_and_flag_values() {
        let pl = p(&["stop"], "--gr");
        assert_eq!(pl.candidates, vec!["--grace-period"]);
        let pl = p(&["stop"], "--n");
        assert_eq!(pl.candidates, vec!["--namespace"]);
        assert_eq!(p(&["start", "-n"], "").lookup, Some(Lookup::Namespaces));
        assert_eq!(p(&["--kubeconfig"], "").directive, DIRECTIVE_DEFAULT);
        let pl = p(&["--context=dev", "stop"], "");
        assert_eq!(pl.global.context.as_deref(), Some("dev"));
        assert_eq!(pl.lookup, Some(Lookup::Vms));
    }

    #[test]
    fn wire_format() {
        assert_eq!(render(&["a".into(), "b".into()], 4), "a\nb\n:4\n");
        assert_eq!(render(&[], 0), ":0\n");
    }
}
