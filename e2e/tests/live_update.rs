//! Changing a running VM on the two-node local cluster (issue 44): a change that cannot
//! reach the guest live sets the VM's `RestartRequired`, naming the field, until a restart
//! clears it; under `vmRolloutStrategy: LiveUpdate` a node selector removed from a running
//! VM reaches its VMI, so a migration's target pod may go to the other node.
//!
//! The LiveUpdate test switches the cluster's KubeVirt resource to `LiveUpdate` (a
//! virt-controller rollout) and back at its end; run this binary alone:
//! `cargo test -p e2e --test live_update -- --ignored --test-threads=1`.

// The helpers below serve only these tests: a failure is a test failure.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;
mod migration_support;

use std::time::Duration;

use common::Ns;
use e2e::Cluster;
use migration_support::*;

const ROLLOUT: Duration = Duration::from_secs(300);

/// The VM's `RestartRequired` condition: its status and message ("" when absent).
fn restart_required(ns: &Ns<'_>, vm: &str) -> (String, String) {
    let jp = |f: &str| {
        ns.get(
            "vm",
            vm,
            &format!("{{.status.conditions[?(@.type==\"RestartRequired\")].{f}}}"),
        )
    };
    (jp("status"), jp("message"))
}

fn patch_vm(ns: &Ns<'_>, vm: &str, patch: &str) {
    ns.k(&["patch", "vm", vm, "--type=merge", "-p", patch])
        .expect("patch the VM");
}

fn set_rollout_strategy(c: &Cluster, strategy: Option<&str>) {
    let value = strategy.map_or_else(|| "null".to_string(), |s| format!("\"{s}\""));
    c.kubectl(&[
        "-n",
        "kubevirt",
        "patch",
        "kubevirt",
        "kubevirt",
        "--type=merge",
        "-p",
        &format!(r#"{{"spec":{{"configuration":{{"vmRolloutStrategy":{value}}}}}}}"#),
    ])
    .expect("patch spec.configuration.vmRolloutStrategy");
}

/// Whether virt-controller runs with `--vm-rollout-strategy=LiveUpdate` (or without the
/// flag) on every replica.
fn controller_rolled_out(c: &Cluster, live: bool) -> bool {
    let Ok(out) = c.kubectl(&[
        "-n",
        "kubevirt",
        "get",
        "deployment",
        "virt-controller",
        "-o",
        "jsonpath={.spec.template.spec.containers[0].args} {.spec.replicas} \
         {.status.updatedReplicas} {.status.readyReplicas} {.status.replicas}",
    ]) else {
        return false;
    };
    let Some((args, counts)) = out.rsplit_once(']') else {
        return false;
    };
    let n: Vec<&str> = counts.split_whitespace().collect();
    args.contains("--vm-rollout-strategy=LiveUpdate") == live
        && n.len() == 4
        && n.iter().all(|x| *x == n[0])
}

/// Puts the cluster back on KubeVirt's default rollout strategy.
struct StageAgain<'a>(&'a Cluster);

impl Drop for StageAgain<'_> {
    fn drop(&mut self) {
        set_rollout_strategy(self.0, None);
        if let Err(e) = self.0.eventually(
            "virt-controller back on the Stage rollout strategy",
            ROLLOUT,
            || Ok(controller_rolled_out(self.0, false)),
        ) {
            eprintln!("{e:#}");
        }
    }
}

/// A change of the guest's memory cannot reach the running guest: the VM says
/// RestartRequired with the field (KubeVirt's message), the VMI keeps what it started with,
/// and a restart brings the new memory and clears the condition.
#[test]
#[ignore = "needs root and a two-node cluster: cargo test -p e2e --test live_update -- --ignored"]
fn a_non_live_change_says_restart_required_until_a_restart() {
    let c = cluster();
    let ns = Ns::new(c, "restartreq");
    let (_node, _console, before) = running_vm(&ns, "edited", serde_json::json!({}));
    assert_eq!(restart_required(&ns, "edited").0, "");

    patch_vm(
        &ns,
        "edited",
        r#"{"spec":{"template":{"spec":{"domain":{"memory":{"guest":"160Mi"}}}}}}"#,
    );
    ns.wait(
        "edited",
        "RestartRequired=True",
        Duration::from_secs(60),
        || restart_required(&ns, "edited").0 == "True",
    );
    let (_, message) = restart_required(&ns, "edited");
    assert!(
        message.starts_with("a non-live-updatable field was changed in the template spec")
            && message.contains("spec.template.spec.domain.memory.guest"),
        "{message}"
    );
    assert_eq!(
        ns.get("vmi", "edited", "{.spec.domain.memory.guest}"),
        "128Mi"
    );
    assert_eq!(ns.vmi_uid("edited"), before.vmi_uid, "restarted on its own");

    ns.virt(&["restart", "edited"]);
    ns.wait(
        "edited",
        "a new VMI Running after the restart",
        Duration::from_secs(180),
        || {
            let uid = ns.vmi_uid("edited");
            !uid.is_empty() && uid != before.vmi_uid && ns.vmi_phase("edited") == "Running"
        },
    );
    assert_eq!(
        ns.get("vmi", "edited", "{.spec.domain.memory.guest}"),
        "160Mi"
    );
    ns.wait(
        "edited",
        "RestartRequired cleared",
        Duration::from_secs(60),
        || restart_required(&ns, "edited").0.is_empty(),
    );
}

/// The user story of issue 44: a VM started with a nodeSelector pinning it to its node, then
/// freed of it, could not be moved (its migration's target pod stayed unschedulable on the
/// old selector). Under LiveUpdate the VMI gets the change live, no restart, and the
/// migration goes to the other node.
#[test]
#[ignore = "needs root and a two-node cluster: cargo test -p e2e --test live_update -- --ignored"]
fn a_node_selector_removed_live_reaches_the_vmi_and_the_vm_can_move() {
    let c = cluster();
    let _stage = StageAgain(c);
    set_rollout_strategy(c, Some("LiveUpdate"));
    c.eventually(
        "virt-controller rolled out with --vm-rollout-strategy=LiveUpdate",
        ROLLOUT,
        || Ok(controller_rolled_out(c, true)),
    )
    .unwrap_or_else(|e| panic!("{e:#}"));

    let ns = Ns::new(c, "liveplace");
    let nodes = c
        .kubectl(&["get", "nodes", "-o", "jsonpath={.items[0].metadata.name}"])
        .expect("nodes");
    let pinned = nodes.trim().to_string();
    let mut vm: serde_json::Value = serde_json::from_str(&vm_manifest(
        "pinned",
        &ns.name,
        serde_json::json!({}),
        false,
    ))
    .unwrap();
    vm["spec"]["template"]["spec"]["nodeSelector"] =
        serde_json::json!({"kubernetes.io/hostname": pinned});
    ns.apply(&vm.to_string());
    ns.wait_running("pinned");
    assert_eq!(ns.node_of("pinned"), pinned);
    let uid = ns.vmi_uid("pinned");
    // LiveUpdate's room for CPU hotplug: 4 × the sockets.
    assert_eq!(
        ns.get("vmi", "pinned", "{.spec.domain.cpu.maxSockets}"),
        "4"
    );

    patch_vm(
        &ns,
        "pinned",
        r#"{"spec":{"template":{"spec":{"nodeSelector":null}}}}"#,
    );
    ns.wait(
        "pinned",
        "the nodeSelector gone from the VMI",
        Duration::from_secs(60),
        || ns.get("vmi", "pinned", "{.spec.nodeSelector}").is_empty(),
    );
    assert_eq!(ns.vmi_uid("pinned"), uid, "the same instance");
    assert_eq!(restart_required(&ns, "pinned").0, "");

    ns.virt(&["migrate", "pinned"]);
    ns.wait_migration_success("pinned", MIGRATE);
    assert_ne!(ns.node_of("pinned"), pinned, "the VM did not move");
    assert_eq!(ns.vmi_uid("pinned"), uid);
}
