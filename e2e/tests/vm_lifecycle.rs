//! A VM really runs on the cluster: virt-controller creates the VMI and its launcher pod, the
//! launcher boots the test guest (kernelBoot from `localhost/kubevirt-rs/test-guest:latest`,
//! TCG), virt-handler reports it Running, and the console goes kubectl → kube-apiserver →
//! virt-apiserver → virt-handler → the guest's serial port. Lifecycle through `kubectl virt`
//! (stop, start, restart, pause, unpause), runStrategy Halted, deletion.
//!
//! Needs root and the packages of docs/local-cluster.md and docs/deploy.md. Uses the cluster
//! named by KUBECONFIG (images loaded with E2E_IMAGE_LOAD) or brings the local one up. Run with
//! `cargo test -p e2e -- --ignored` (`cargo xtask test` does).

// The helpers below serve only these tests: a failure is a test failure.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use e2e::Cluster;

/// The virt-controller Lease's holder.
fn controller_leader(c: &Cluster) -> String {
    c.kubectl(&[
        "-n",
        "kubevirt",
        "get",
        "lease",
        "virt-controller",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ])
    .unwrap_or_default()
    .trim()
    .to_string()
}

/// Names of the running virt-controller pods.
fn controller_pods(c: &Cluster) -> Vec<String> {
    c.component_pods("virt-controller", true, "{.items[*].metadata.name}")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// The host PID of the virt-controller process of `pod` (the local cluster runs its
/// containers on this machine): the process whose environment names the pod.
fn controller_pid(pod: &str) -> Option<u32> {
    let want = format!("POD_NAME={pod}");
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        if comm.trim() != "virt-controller" {
            return None;
        }
        let env = std::fs::read(e.path().join("environ")).ok()?;
        env.split(|b| *b == 0)
            .any(|kv| kv == want.as_bytes())
            .then_some(pid)
    })
}

#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn vm_always_boots_and_its_console_answers() {
    let c = cluster();
    let ns = Ns::new(c, "boot");
    ns.apply_vm("boot", "Always");
    ns.wait_running("boot");
    // The launcher pod is the VMI's, on the node the VMI names.
    let node = ns.get("vmi", "boot", "{.status.nodeName}");
    assert!(!node.is_empty(), "Running VMI without nodeName");
    let pods = ns.launcher_pods("boot");
    assert_eq!(pods.len(), 1, "{pods:?}");
    // virt-controller writes the VM's printableStatus after it sees the VMI Running: a
    // reconcile later, not at the same instant.
    ns.wait(
        "boot",
        "VM boot printableStatus Running",
        Duration::from_secs(30),
        || ns.vm_status("boot").trim() == "Running",
    );

    let console = Console::open(&ns, "boot");
    // The banner may have scrolled past before we connected: Enter brings a fresh prompt.
    console.line("");
    console.expect(&ns, "boot", virt_testguest::PROMPT.trim(), BOOT);
    compute(&console, &ns, "boot", 6, 7);
    // Ctrl+] leaves the console; the VM keeps running.
    console.key("C-]");
    ns.wait(
        "boot",
        "kubectl virt console to exit on Ctrl+]",
        Duration::from_secs(30),
        || console.exited(),
    );
    assert_eq!(ns.vmi_phase("boot"), "Running");
}
#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn banner_on_the_console_from_the_first_boot() {
    let c = cluster();
    let ns = Ns::new(c, "banner");
    // Halted first, so that the console is attached before the guest prints anything.
    ns.apply_vm("banner", "Halted");
    ns.wait("banner", "VM banner Stopped", GONE, || {
        ns.vm_status("banner") == "Stopped"
    });
    ns.virt(&["start", "banner"]);
    // The plugin waits for the VMI to run, then attaches.
    let console = Console::open(&ns, "banner");
    ns.wait_running("banner");
    console.expect(&ns, "banner", virt_testguest::BANNER, BOOT);
}
#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn stop_start_restart_through_the_plugin() {
    let c = cluster();
    let ns = Ns::new(c, "life");
    ns.apply_vm("life", "Always");
    ns.wait_running("life");

    ns.virt(&["stop", "life"]);
    ns.wait_stopped("life");

    ns.virt(&["start", "life"]);
    ns.wait_running("life");
    let before = ns.vmi_uid("life");
    assert!(!before.is_empty());

    ns.virt(&["restart", "life"]);
    ns.wait("life", "a new VMI Running after restart", BOOT, || {
        let uid = ns.vmi_uid("life");
        !uid.is_empty() && uid != before && ns.vmi_phase("life") == "Running"
    });
    ns.wait("life", "the old launcher pod gone", GONE, || {
        ns.launcher_pods("life").len() == 1
    });
}
#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn halted_vm_never_starts() {
    let c = cluster();
    let ns = Ns::new(c, "halted");
    ns.apply_vm("halted", "Halted");
    // Once the controller has written the VM's status it has decided: nothing to run.
    ns.wait("halted", "VM halted Stopped", GONE, || {
        ns.vm_status("halted") == "Stopped"
    });
    assert_eq!(ns.vmi_uid("halted"), "");
    assert!(ns.launcher_pods("halted").is_empty());
    // A spec change is another chance for a wrong decision.
    ns.k(&["label", "vm", "halted", "touched=yes"])
        .expect("label");
    ns.wait(
        "halted",
        "VM halted relabelled and still Stopped",
        GONE,
        || {
            ns.get("vm", "halted", "{.metadata.labels.touched}") == "yes"
                && ns.vm_status("halted") == "Stopped"
        },
    );
    assert_eq!(ns.vmi_uid("halted"), "");
    assert!(ns.launcher_pods("halted").is_empty());
}
#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn deleting_the_vm_deletes_its_vmi_and_pod() {
    let c = cluster();
    let ns = Ns::new(c, "delete");
    ns.apply_vm("gone", "Always");
    ns.wait_running("gone");
    assert_eq!(ns.launcher_pods("gone").len(), 1);
    ns.k(&["delete", "vm", "gone", "--wait=false"])
        .expect("delete vm");
    ns.wait("gone", "VM, VMI and launcher pod gone", GONE, || {
        ns.get("vm", "gone", "{.metadata.name}").is_empty()
            && ns.vmi_uid("gone").is_empty()
            && ns.launcher_pods("gone").is_empty()
    });
}
#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn console_survives_90_seconds_idle() {
    let c = cluster();
    let ns = Ns::new(c, "idle");
    ns.apply_vm("idle", "Always");
    ns.wait_running("idle");
    let console = Console::open(&ns, "idle");
    console.line("");
    console.expect(&ns, "idle", virt_testguest::PROMPT.trim(), BOOT);
    compute(&console, &ns, "idle", 6, 7);
    // Longer than any proxy's idle timeout we know of (kube-apiserver, virt-apiserver,
    // virt-handler): the pings must keep every hop open.
    std::thread::sleep(Duration::from_secs(90));
    assert!(
        !console.exited(),
        "console closed while idle:\n{}",
        console.screen()
    );
    compute(&console, &ns, "idle", 7, 191);
}
#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn pause_and_unpause_show_in_kubectl_get_vm() {
    let c = cluster();
    let ns = Ns::new(c, "pause");
    ns.apply_vm("pause", "Always");
    ns.wait_running("pause");

    ns.virt(&["pause", "vm", "pause"]);
    ns.wait("pause", "VM pause Paused", BOOT, || {
        ns.vm_status("pause") == "Paused"
    });
    let printed = ns.k(&["get", "vm", "pause"]).expect("get vm");
    assert!(printed.contains("Paused"), "{printed}");
    let paused = ns.get(
        "vmi",
        "pause",
        r#"{.status.conditions[?(@.type=="Paused")].status}"#,
    );
    assert_eq!(paused, "True");

    ns.virt(&["unpause", "vm", "pause"]);
    ns.wait("pause", "VM pause Running again", BOOT, || {
        ns.vm_status("pause") == "Running"
    });
    let printed = ns.k(&["get", "vm", "pause"]).expect("get vm");
    assert!(printed.contains("Running"), "{printed}");
    // The guest runs again: its console answers.
    let console = Console::open(&ns, "pause");
    console.line("");
    console.expect(&ns, "pause", virt_testguest::PROMPT.trim(), BOOT);
    compute(&console, &ns, "pause", 6, 7);

    // Reset (the reset button), by upstream virtctl unchanged and by the plugin: the guest
    // boots again in the same instance, which stays Running.
    let uid = ns.vmi_uid("pause");
    console.clear();
    let virtctl = e2e::upstream_virtctl().expect("upstream virtctl");
    let out = std::process::Command::new(&virtctl)
        .env("KUBECONFIG", &ns.c.kubeconfig)
        .args(["-n", &ns.name, "reset", "pause"])
        .output()
        .expect("virtctl reset");
    assert!(
        out.status.success(),
        "virtctl reset: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    console.expect(&ns, "pause", virt_testguest::BANNER, BOOT);
    console.clear();
    ns.virt(&["reset", "pause"]);
    console.expect(&ns, "pause", virt_testguest::BANNER, BOOT);
    assert_eq!(ns.vmi_uid("pause"), uid, "the same instance");
    assert_eq!(ns.vmi_phase("pause"), "Running");
}
#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn rerun_on_failure_restarts_a_guest_whose_kernel_panics() {
    let c = cluster();
    let ns = Ns::new(c, "rerun");
    let guest = Guest {
        panic_after: Some(10),
        panic_device: true,
        ..Guest::default()
    };
    ns.apply_guest("rerun", "RerunOnFailure", &guest);
    ns.wait_running("rerun");
    let first = ns.vmi_uid("rerun");
    let watch = VmiWatch::start(&ns);
    ns.wait("rerun", "a new VMI Running after the panic", BOOT, || {
        let uid = ns.vmi_uid("rerun");
        !uid.is_empty() && uid != first && ns.vmi_phase("rerun") == "Running"
    });
    let seen = watch.seen();
    let failed = seen
        .iter()
        .find(|s| s.uid == first && s.phase == "Failed")
        .unwrap_or_else(|| panic!("the first VMI never showed Failed: {seen:?}"));
    assert!(
        failed.reason.starts_with("GuestCrashed") && failed.reason.contains("panic"),
        "failure reason {:?}",
        failed.reason
    );
    ns.wait("rerun", "the failed VMI's launcher pod gone", GONE, || {
        ns.launcher_pods("rerun").len() == 1
    });
}
#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn once_does_not_restart_a_guest_whose_kernel_panics() {
    let c = cluster();
    let ns = Ns::new(c, "once");
    let guest = Guest {
        panic_after: Some(5),
        panic_device: true,
        ..Guest::default()
    };
    ns.apply_guest("once", "Once", &guest);
    ns.wait_running("once");
    let first = ns.vmi_uid("once");
    ns.wait("once", "VMI once Failed", BOOT, || {
        ns.vmi_phase("once") == "Failed"
    });
    let reason = ns.get("vmi", "once", "{.status.reason}");
    assert!(
        reason.starts_with("GuestCrashed") && reason.contains("panic"),
        "failure reason {reason:?}"
    );
    ns.wait("once", "VM once Stopped", GONE, || {
        ns.vm_status("once") == "Stopped"
    });
    std::thread::sleep(SETTLE);
    assert_eq!(ns.vmi_uid("once"), first, "Once started another VMI");
    assert_eq!(ns.vmi_phase("once"), "Failed");
    assert_eq!(ns.vm_status("once"), "Stopped");
}
#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn rerun_on_failure_leaves_a_guest_that_powered_off_stopped() {
    let c = cluster();
    let ns = Ns::new(c, "poweroff");
    let guest = Guest {
        poweroff_after: Some(5),
        ..Guest::default()
    };
    ns.apply_guest("off", "RerunOnFailure", &guest);
    ns.wait_running("off");
    let first = ns.vmi_uid("off");
    let watch = VmiWatch::start(&ns);
    // KubeVirt's behaviour: the Succeeded VMI is removed and nothing replaces it.
    ns.wait_stopped("off");
    let seen = watch.seen();
    assert!(
        seen.iter()
            .any(|s| s.uid == first && s.phase == "Succeeded"),
        "the VMI never showed Succeeded: {seen:?}"
    );
    std::thread::sleep(SETTLE);
    assert_eq!(
        ns.vmi_uid("off"),
        "",
        "RerunOnFailure restarted a clean power-off"
    );
    assert_eq!(ns.vm_status("off"), "Stopped");
    assert!(ns.launcher_pods("off").is_empty());
}
#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn killing_the_controller_leader_mid_start_lets_the_other_replica_finish() {
    let c = cluster();
    let ns = Ns::new(c, "leader");
    let mut leader = String::new();
    let mut others = Vec::new();
    ns.wait(
        "lead",
        "two virt-controller replicas, one leading",
        GONE,
        || {
            leader = controller_leader(c);
            let pods = controller_pods(c);
            others = pods.iter().filter(|p| **p != leader).cloned().collect();
            pods.contains(&leader) && !others.is_empty()
        },
    );

    ns.apply_vm("lead", "Always");
    // Mid-start: the VMI exists and does not run yet (its pod is created, scheduled, the
    // guest boots; several controller writes are still to come).
    ns.wait("lead", "VMI lead created", GONE, || {
        !ns.vmi_uid("lead").is_empty()
    });
    let phase_at_kill = ns.vmi_phase("lead");
    assert_ne!(
        phase_at_kill, "Running",
        "too late to kill the leader mid-start"
    );
    let killed = std::time::Instant::now();
    // SIGKILL: no chance to release the Lease, so the other replica must wait it out.
    // Then the pod goes, so that a restarted container (same identity) cannot take it back.
    // A pod delete alone would let the leader release the Lease: without the kill this
    // test fails rather than testing the gentler case.
    assert!(
        c.local,
        "SIGKILLing the leader needs the local cluster (its containers run on this machine)"
    );
    let pid = controller_pid(&leader)
        .unwrap_or_else(|| panic!("no virt-controller process of pod {leader} on this machine"));
    let status = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(
        status.success(),
        "kill -9 {pid} (virt-controller of {leader}) failed"
    );
    c.kubectl(&[
        "-n",
        "kubevirt",
        "delete",
        "pod",
        &leader,
        "--grace-period=0",
        "--force",
        "--wait=false",
    ])
    .expect("delete the leader pod");

    let mut new_leader = String::new();
    ns.wait("lead", "another replica holding the Lease", GONE, || {
        new_leader = controller_leader(c);
        !new_leader.is_empty() && new_leader != leader
    });
    let failover = killed.elapsed();
    // A standby that ran before the kill, or the Deployment's replacement pod: both race
    // for the expired Lease (whichever retries first wins), and either is a valid heir.
    let pods = controller_pods(c);
    assert!(
        pods.contains(&new_leader),
        "{new_leader} holds the Lease but is not a virt-controller pod: {pods:?} (standbys before the kill: {others:?})"
    );
    ns.wait_running("lead");
    let running = killed.elapsed();
    // Exactly one instance: no second VMI, no second launcher pod, also a moment later.
    std::thread::sleep(Duration::from_secs(5));
    let vmis = ns
        .k(&["get", "vmi", "-o", "name"])
        .unwrap_or_default()
        .lines()
        .count();
    assert_eq!(vmis, 1);
    assert_eq!(ns.launcher_pods("lead").len(), 1, "{}", ns.diagnose("lead"));
    assert_eq!(ns.vmi_phase("lead"), "Running");
    println!(
        "leader {leader} killed at VMI phase {phase_at_kill:?}: {new_leader} leads after \
         {:.1} s, VMI Running {:.1} s after the kill",
        failover.as_secs_f64(),
        running.as_secs_f64()
    );
}
