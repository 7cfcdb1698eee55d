//! Changing a running VM on the two-node local cluster (issue 44): a change that cannot
//! reach the guest live sets the VM's `RestartRequired`, naming the field, until a restart
//! clears it; under `vmRolloutStrategy: LiveUpdate` a node selector removed from a running
//! VM reaches its VMI, so a migration's target pod may go to the other node, and CPU
//! sockets raised on a running VM reach its guest through a migration, without a reboot.
//!
//! The LiveUpdate tests switch the cluster's KubeVirt resource to `LiveUpdate` with the
//! workload updater's `LiveMigrate` (a virt-controller rollout) and back at their end; run
//! this binary alone:
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

/// Sets `vmRolloutStrategy` (None: KubeVirt's default) and, with LiveUpdate, the workload
/// updater's LiveMigrate method, which KubeVirt's CPU hotplug rides on (the migration to a
/// launcher pod of the new size); `workloadUpdateStrategy` goes back to what it was.
fn set_rollout_strategy(c: &Cluster, strategy: Option<&str>, workload_update: &str) {
    let value = strategy.map_or_else(|| "null".to_string(), |s| format!("\"{s}\""));
    c.kubectl(&[
        "-n",
        "kubevirt",
        "patch",
        "kubevirt",
        "kubevirt",
        "--type=merge",
        "-p",
        &format!(
            r#"{{"spec":{{"configuration":{{"vmRolloutStrategy":{value}}},"workloadUpdateStrategy":{workload_update}}}}}"#
        ),
    ])
    .expect("patch spec.configuration.vmRolloutStrategy");
}

/// The KubeVirt resource's `workloadUpdateStrategy` as JSON (`null` when unset).
fn workload_update_strategy(c: &Cluster) -> String {
    let out = c
        .kubectl(&[
            "-n",
            "kubevirt",
            "get",
            "kubevirt",
            "kubevirt",
            "-o",
            "jsonpath={.spec.workloadUpdateStrategy}",
        ])
        .expect("the KubeVirt resource");
    if out.trim().is_empty() {
        "null".to_string()
    } else {
        out.trim().to_string()
    }
}

/// Switches the cluster to LiveUpdate (with LiveMigrate workload updates) until dropped.
fn live_update(c: &Cluster) -> StageAgain<'_> {
    let before = workload_update_strategy(c);
    let guard = StageAgain(c, before);
    set_rollout_strategy(
        c,
        Some("LiveUpdate"),
        r#"{"workloadUpdateMethods":["LiveMigrate"]}"#,
    );
    c.eventually(
        "virt-controller rolled out with --vm-rollout-strategy=LiveUpdate",
        ROLLOUT,
        || Ok(controller_rolled_out(c, true)),
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    guard
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
    // The deployment's counts leave out pods already terminating, and such a pod may still
    // hold the leader lease and render VMIs with the old strategy for a while: wait until
    // every pod, terminating or not, runs the new arguments.
    let Ok(pods) = c.component_pods(
        "virt-controller",
        false,
        r#"{range .items[*]}{.spec.containers[0].args}{"\n"}{end}"#,
    ) else {
        return false;
    };
    args.contains("--vm-rollout-strategy=LiveUpdate") == live
        && n.len() == 4
        && n.iter().all(|x| *x == n[0])
        && pods
            .lines()
            .filter(|l| !l.trim().is_empty())
            .all(|l| l.contains("--vm-rollout-strategy=LiveUpdate") == live)
}

/// Puts the cluster back on KubeVirt's default rollout strategy and the workload update
/// strategy it had.
struct StageAgain<'a>(&'a Cluster, String);

impl Drop for StageAgain<'_> {
    fn drop(&mut self) {
        set_rollout_strategy(self.0, None, &self.1);
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
    let _stage = live_update(c);

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

/// The guest's online CPUs, read through the console (the test guest has no udev to online
/// hotplugged CPUs, so the test onlines every present one first, as a distribution's udev
/// rule does).
fn guest_cpus(console: &common::Console, ns: &Ns<'_>, vm: &str) -> u32 {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let tag = format!(
        "cpus{}=",
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let mut got = None;
    ns.wait(vm, "the guest's CPU count", Duration::from_secs(60), || {
        console.line(&format!(
            "for c in /sys/devices/system/cpu/cpu[0-9]*/online; do echo 1 > $c; done 2>/dev/null; \
             echo {tag}$(grep -c ^processor /proc/cpuinfo)"
        ));
        std::thread::sleep(Duration::from_secs(2));
        let screen = console.screen();
        got = screen.match_indices(&tag).find_map(|(i, _)| {
            let n: String = screen[i + tag.len()..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            n.parse().ok()
        });
        got.is_some()
    });
    got.unwrap()
}

/// Issue 44's CPU hotplug as KubeVirt does it: sockets raised 1 → 2 on a running VM under
/// LiveUpdate reach the VMI (`HotVCPUChange`), the workload updater migrates it to a
/// launcher pod sized for two, the target hotplugs the vCPU (`<vcpu current>` of a domain
/// defined with maxSockets' vCPUs), `status.currentCPUTopology` says two sockets, and the
/// guest counts two CPUs without a reboot (same boot id, same VMI).
#[test]
#[ignore = "needs root and a two-node cluster: cargo test -p e2e --test live_update -- --ignored"]
fn sockets_raised_live_reach_the_guest_through_a_migration() {
    let c = cluster();
    let _stage = live_update(c);
    let ns = Ns::new(c, "cpuhotplug");
    let (node, console, before) = running_vm(&ns, "grower", serde_json::json!({}));
    assert_eq!(
        ns.get("vmi", "grower", "{.spec.domain.cpu.maxSockets}"),
        "4"
    );
    assert_eq!(
        ns.get("vmi", "grower", "{.status.currentCPUTopology.sockets}"),
        "1"
    );
    assert_eq!(guest_cpus(&console, &ns, "grower"), 1);

    patch_vm(
        &ns,
        "grower",
        r#"{"spec":{"template":{"spec":{"domain":{"cpu":{"sockets":2}}}}}}"#,
    );
    ns.wait(
        "grower",
        "two sockets in the VMI's spec",
        Duration::from_secs(60),
        || ns.get("vmi", "grower", "{.spec.domain.cpu.sockets}") == "2",
    );
    ns.wait(
        "grower",
        "the guest's topology reported with two sockets",
        MIGRATE,
        || ns.get("vmi", "grower", "{.status.currentCPUTopology.sockets}") == "2",
    );
    // The target reports the topology as it hotplugs; the migration object's Succeeded is
    // written by virt-controller just after.
    ns.wait("grower", "the migration Succeeded", MIGRATE, || {
        ns.vmim_phases("grower").last().map(String::as_str) == Some("Succeeded")
    });
    assert_ne!(
        ns.node_of("grower"),
        node,
        "no migration carried the change"
    );
    ns.wait(
        "grower",
        "HotVCPUChange gone",
        Duration::from_secs(60),
        || {
            ns.get(
                "vmi",
                "grower",
                "{.status.conditions[?(@.type==\"HotVCPUChange\")].status}",
            )
            .is_empty()
        },
    );
    assert_eq!(restart_required(&ns, "grower").0, "");
    let console = common::Console::open(&ns, "grower");
    assert_eq!(guest_cpus(&console, &ns, "grower"), 2);
    assert_eq!(
        guest_run(&console, &ns, "grower"),
        before,
        "not the same guest: restarted or rebooted"
    );
}
