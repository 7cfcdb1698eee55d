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

/// KubeVirt's per-VMI metrics of the running VM `vm`, scraped as a cluster's Prometheus
/// would: virt-handler's `/metrics` on the VM's node, through kube-apiserver's pod proxy,
/// each series with KubeVirt's labels and a value. The figures the guest's balloon driver
/// reports (available, usable) depend on the guest loading it; they are asserted with a real
/// guest and libvirt in `virt-launcher`'s `cluster_mode_end_to_end`, not here.
fn vmi_metrics_on_its_nodes_handler(c: &Cluster, ns: &Ns<'_>, vm: &str, node: &str) {
    let path = handler_metrics_path(c, node);
    let labels = format!("node=\"{node}\",namespace=\"{}\",name=\"{vm}\"", ns.name);
    // A series of `family` carrying every label of `labels` and `extra` (a VMI's own labels
    // come along as kubernetes_vmi_label_*, in between).
    let value = |text: &str, family: &str, extra: &str| -> Option<f64> {
        let want: Vec<String> = format!("{labels}{extra}")
            .split(',')
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect();
        series_value(text, family, &want)
    };
    let mut text = String::new();
    ns.wait(
        vm,
        "the VMI's series in its node's virt-handler /metrics",
        Duration::from_secs(60),
        || {
            text = c.kubectl(&["get", "--raw", &path]).unwrap_or_default();
            value(&text, "kubevirt_vmi_memory_resident_bytes", "").is_some()
                && value(
                    &text,
                    "kubevirt_vmi_network_transmit_packets_total",
                    ",interface=\"default\"",
                )
                .is_some_and(|v| v > 0.0)
        },
    );
    for (family, extra) in [
        ("kubevirt_vmi_cpu_usage_seconds_total", ""),
        ("kubevirt_vmi_cpu_user_usage_seconds_total", ""),
        (
            "kubevirt_vmi_vcpu_seconds_total",
            ",id=\"0\",state=\"running\"",
        ),
        ("kubevirt_vmi_memory_domain_bytes", ""),
        ("kubevirt_vmi_memory_resident_bytes", ""),
        // The pod network's interface, by the VMI's name for it.
        (
            "kubevirt_vmi_network_transmit_bytes_total",
            ",interface=\"default\"",
        ),
        (
            "kubevirt_vmi_network_transmit_packets_total",
            ",interface=\"default\"",
        ),
    ] {
        let v = value(&text, family, extra)
            .unwrap_or_else(|| panic!("no {family}{{{labels}{extra}}} in\n{text}"));
        assert!(v > 0.0, "{family}{{{labels}{extra}}} = {v}");
    }
    for (family, extra) in [
        ("kubevirt_vmi_vcpu_wait_seconds_total", ",id=\"0\""),
        (
            "kubevirt_vmi_network_receive_bytes_total",
            ",interface=\"default\"",
        ),
        (
            "kubevirt_vmi_network_receive_errors_total",
            ",interface=\"default\"",
        ),
        (
            "kubevirt_vmi_network_receive_packets_dropped_total",
            ",interface=\"default\"",
        ),
    ] {
        assert!(
            value(&text, family, extra).is_some(),
            "no {family}{{{labels}{extra}}} in\n{text}"
        );
    }
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
    vmi_metrics_on_its_nodes_handler(c, &ns, "boot", &node);
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
/// `runStrategy: Manual` as a user sees it: created, it does not start; `kubectl virt start`
/// starts it, and the guest's serial console is in the launcher pod's log (KubeVirt's
/// `guest-console-log` container); a guest that powers itself off stays off (Manual never
/// restarts); `start` again brings it back.
#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn manual_vm_runs_only_when_asked_and_its_console_is_in_the_pod_log() {
    let c = cluster();
    let ns = Ns::new(c, "manual");
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&common::vm_manifest(
            "manual",
            &ns.name,
            "Manual",
            &common::Guest {
                poweroff_after: Some(20),
                ..common::Guest::default()
            },
        )),
    )
    .expect("apply the Manual VM");
    ns.wait("manual", "VM manual Stopped", GONE, || {
        ns.vm_status("manual") == "Stopped"
    });
    std::thread::sleep(common::SETTLE);
    assert_eq!(ns.vmi_uid("manual"), "", "a Manual VM started by itself");

    ns.virt(&["start", "manual"]);
    ns.wait_running("manual");
    let pod = ns.launcher_pods("manual").pop().expect("launcher pod");
    ns.wait(
        "manual",
        "the banner in the guest-console-log container's log",
        BOOT,
        || {
            ns.k(&["logs", &pod, "-c", "guest-console-log"])
                .is_ok_and(|l| l.contains(virt_testguest::BANNER))
        },
    );
    let first = ns.vmi_uid("manual");
    // The guest powers itself off 20 s after its banner: Manual leaves it off (as KubeVirt,
    // the finished VMI stays, Succeeded, until the next start replaces it).
    ns.wait(
        "manual",
        "VM manual Stopped after the guest powered off",
        BOOT,
        || ns.vm_status("manual") == "Stopped",
    );
    std::thread::sleep(common::SETTLE);
    assert_eq!(ns.vm_status("manual"), "Stopped");
    assert_eq!(ns.vmi_phase("manual"), "Succeeded");
    assert_eq!(
        ns.vmi_uid("manual"),
        first,
        "Manual restarted a guest that powered off"
    );

    ns.virt(&["start", "manual"]);
    ns.wait_running("manual");
    assert_ne!(ns.vmi_uid("manual"), first, "a new VMI for the new start");
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
    // A counter the guest prints every second: what "paused" means to a user is that it
    // stops, and goes on from where it stopped.
    let console = Console::open(&ns, "pause");
    wait_for_shell(&console, &ns, "pause");
    console.line("i=0; while true; do i=$((i+1)); echo tick$i; sleep 1; done &");
    console.expect(&ns, "pause", "tick3", BOOT);

    ns.virt(&["pause", "vm", "pause"]);
    ns.wait("pause", "VM pause Paused", BOOT, || {
        ns.vm_status("pause") == "Paused"
    });
    let ticks = |screen: &str| -> u32 {
        screen
            .lines()
            .filter_map(|l| l.trim().strip_prefix("tick")?.parse().ok())
            .max()
            .unwrap_or(0)
    };
    // A tick already on its way may still arrive; after that, none for 8 s.
    std::thread::sleep(Duration::from_secs(2));
    let at_pause = ticks(&console.screen());
    std::thread::sleep(Duration::from_secs(8));
    let after = ticks(&console.screen());
    assert_eq!(
        after,
        at_pause,
        "the guest kept counting while paused:\n{}",
        console.screen()
    );
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
    // The guest runs again: the counter goes on from where it stopped (the same guest,
    // not a new boot), then its console answers.
    let next = format!("tick{}", at_pause + 2);
    console.expect(&ns, "pause", &next, BOOT);
    console.line("kill $!");
    console.clear();
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

/// Upstream virtctl unchanged, in this test's namespace: stdout, or the test fails with
/// stderr.
fn virtctl(ns: &Ns<'_>, args: &[&str]) -> String {
    let virtctl = e2e::upstream_virtctl().expect("upstream virtctl");
    let out = Command::new(&virtctl)
        .env("KUBECONFIG", &ns.c.kubeconfig)
        .args(["-n", &ns.name])
        .args(args)
        .output()
        .expect("running virtctl");
    assert!(
        out.status.success(),
        "virtctl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Instance types end to end, with one small VM: virt-operator deployed KubeVirt's
/// common-instancetypes bundle; a VM naming a (namespaced) instance type and preference and
/// no size of its own runs with the instance type's vCPUs and memory laid out as the
/// preference prefers; the copies are ControllerRevisions named in its status, shared by a
/// second VM of the same generations (each VM an owner); upstream `virtctl expand` (`--vm`, `--file`) and `virtctl create vm
/// --instancetype --preference` work unchanged; the garbage collector removes the copies
/// with the last VM that owns them.
#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn a_vm_sized_by_an_instancetype_runs_with_its_size() {
    let c = cluster();
    // The bundle, as `kubectl get virtualmachineclusterinstancetypes` shows it (virt-operator
    // applies it once the instancetype APIService answers: a reconcile after the deploy).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let bundle = loop {
        let bundle = c
            .kubectl(&["get", "virtualmachineclusterinstancetypes", "-o", "name"])
            .unwrap_or_default();
        if bundle.contains("/u1.small\n") || std::time::Instant::now() > deadline {
            break bundle;
        }
        std::thread::sleep(Duration::from_secs(2));
    };
    for name in [
        "u1.small",
        "u1.medium",
        "cx1.large",
        "m1.large",
        "o1.medium",
    ] {
        assert!(
            bundle.contains(&format!("/{name}\n")),
            "{name} in:\n{bundle}"
        );
    }
    let prefs = c
        .kubectl(&["get", "vmcp", "-o", "name"])
        .expect("list cluster preferences");
    assert!(prefs.contains("/fedora\n"), "{prefs}");

    let ns = Ns::new(c, "itype");
    let objects = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "instancetype.kubevirt.io/v1beta1", "kind": "VirtualMachineInstancetype",
         "metadata": {"name": "e2e-small"},
         "spec": {"cpu": {"guest": 2}, "memory": {"guest": "128Mi"}}},
        {"apiVersion": "instancetype.kubevirt.io/v1beta1", "kind": "VirtualMachinePreference",
         "metadata": {"name": "e2e-pref"},
         "spec": {"cpu": {"preferredCPUTopology": "cores"},
                  "preferredTerminationGracePeriodSeconds": 5}}
    ]});
    ns.c.kubectl_stdin(
        &["-n", &ns.name, "apply", "-f", "-"],
        Some(&objects.to_string()),
    )
    .expect("apply instance type and preference");
    // The test guest with no size and no grace period: both come from the references.
    let mut vm: serde_json::Value =
        serde_json::from_str(&vm_manifest("it", &ns.name, "Always", &Guest::default())).unwrap();
    let spec = &mut vm["spec"];
    spec["instancetype"] =
        serde_json::json!({"name": "e2e-small", "kind": "VirtualMachineInstancetype"});
    spec["preference"] =
        serde_json::json!({"name": "e2e-pref", "kind": "VirtualMachinePreference"});
    let template = spec["template"]["spec"].as_object_mut().unwrap();
    template.remove("terminationGracePeriodSeconds");
    template["domain"].as_object_mut().unwrap().remove("memory");
    ns.c.kubectl_stdin(&["apply", "-f", "-"], Some(&vm.to_string()))
        .expect("apply VM");
    ns.wait_running("it");

    // The VMI: the instance type's 2 vCPUs as cores (the preference's layout), its memory,
    // the preference's grace period.
    let vmi_spec = |path: &str| ns.get("vmi", "it", path);
    assert_eq!(vmi_spec("{.spec.domain.cpu.cores}"), "2");
    assert_eq!(vmi_spec("{.spec.domain.cpu.sockets}"), "1");
    assert_eq!(vmi_spec("{.spec.domain.memory.guest}"), "128Mi");
    assert_eq!(vmi_spec("{.spec.terminationGracePeriodSeconds}"), "5");

    // The copies: one ControllerRevision per reference, owned by the VM, named in its status.
    let rev = ns.get(
        "vm",
        "it",
        "{.status.instancetypeRef.controllerRevisionRef.name}",
    );
    assert!(rev.starts_with("e2e-small-v1beta1-"), "{rev:?}");
    let pref_rev = ns.get(
        "vm",
        "it",
        "{.status.preferenceRef.controllerRevisionRef.name}",
    );
    assert!(pref_rev.starts_with("e2e-pref-v1beta1-"), "{pref_rev:?}");
    let vm_uid = ns.get("vm", "it", "{.metadata.uid}");
    // A second VM of the same instance type and preference (halted: capturing needs no
    // start) shares both copies instead of making its own (kubevirt/kubevirt#8591).
    vm["metadata"]["name"] = serde_json::json!("it2");
    vm["spec"]["runStrategy"] = serde_json::json!("Halted");
    ns.c.kubectl_stdin(&["apply", "-f", "-"], Some(&vm.to_string()))
        .expect("apply VM it2");
    ns.wait("it2", "it2 naming both copies", GONE, || {
        ns.get(
            "vm",
            "it2",
            "{.status.instancetypeRef.controllerRevisionRef.name} {.status.preferenceRef.controllerRevisionRef.name}",
        ) == format!("{rev} {pref_rev}")
    });
    let vm2_uid = ns.get("vm", "it2", "{.metadata.uid}");
    for r in [&rev, &pref_rev] {
        let owners = ns.get(
            "controllerrevision",
            r,
            "{.metadata.ownerReferences[*].uid}",
        );
        let mut owners: Vec<&str> = owners.split_whitespace().collect();
        owners.sort_unstable();
        let mut want = vec![vm_uid.as_str(), vm2_uid.as_str()];
        want.sort_unstable();
        assert_eq!(owners, want, "owners of {r}");
    }
    // The shared copies; each VM's own start revision (`revision-start-vm-…`, what
    // RestartRequired compares with) aside.
    let revisions = ns.k(&["get", "controllerrevisions", "-o", "name"]).unwrap();
    let copies = revisions
        .lines()
        .filter(|r| !r.contains("/revision-start-vm-"))
        .count();
    assert_eq!(copies, 2, "{revisions}");

    // virtctl expand --vm: the VM as it runs, with neither reference.
    let expanded = virtctl(&ns, &["expand", "--vm", "it", "--output", "json"]);
    let expanded: serde_json::Value = serde_json::from_str(&expanded).expect("expand json");
    assert!(expanded["spec"].get("instancetype").is_none(), "{expanded}");
    let domain = &expanded["spec"]["template"]["spec"]["domain"];
    assert_eq!(domain["cpu"]["cores"], 2, "{expanded}");
    assert_eq!(domain["memory"]["guest"], "128Mi", "{expanded}");

    // virtctl create vm from the bundle, then expand --file: u1.medium's 4Gi, as fedora
    // lays it out; the VM is accepted by the API (dry run: nothing runs).
    let created = virtctl(
        &ns,
        &[
            "create",
            "vm",
            "--name",
            "made",
            "--instancetype",
            "u1.medium",
            "--preference",
            "fedora",
            &format!("--volume-containerdisk=src:{TEST_GUEST},name:root"),
        ],
    );
    ns.c.kubectl_stdin(
        &["-n", &ns.name, "apply", "--dry-run=server", "-f", "-"],
        Some(&created),
    )
    .expect("virtctl create vm | kubectl apply");
    let file = std::env::temp_dir().join(format!("{}-made.yaml", ns.name));
    std::fs::write(&file, &created).unwrap();
    let expanded = virtctl(
        &ns,
        &[
            "expand",
            "--file",
            file.to_str().unwrap(),
            "--output",
            "json",
        ],
    );
    let _ = std::fs::remove_file(&file);
    let expanded: serde_json::Value = serde_json::from_str(&expanded).expect("expand json");
    assert_eq!(
        expanded["spec"]["template"]["spec"]["domain"]["memory"]["guest"], "4Gi",
        "{expanded}"
    );

    // virtctl create instancetype and create preference, applied as printed (namespaced, as
    // a user sizes their own); then create vm --infer-instancetype --infer-preference from a
    // claim labelled with them, as CDI labels an imported image: the API resolves the
    // inference when the VM is created (dry run: nothing runs).
    for (args, kind, name) in [
        (
            &[
                "create",
                "instancetype",
                "--namespaced",
                "--name",
                "e2e-made",
                "--cpu",
                "1",
                "--memory",
                "96Mi",
            ][..],
            "vminstancetype",
            "e2e-made",
        ),
        (
            &[
                "create",
                "preference",
                "--namespaced",
                "--name",
                "e2e-made-pref",
                "--cpu-topology",
                "cores",
            ][..],
            "vmpref",
            "e2e-made-pref",
        ),
    ] {
        let printed = virtctl(&ns, args);
        ns.c.kubectl_stdin(&["-n", &ns.name, "apply", "-f", "-"], Some(&printed))
            .unwrap_or_else(|e| panic!("virtctl {} | kubectl apply: {e}\n{printed}", args[1]));
        assert_eq!(ns.get(kind, name, "{.metadata.name}"), name, "{printed}");
    }
    assert_eq!(
        ns.get(
            "vminstancetype",
            "e2e-made",
            "{.spec.cpu.guest}/{.spec.memory.guest}"
        ),
        "1/96Mi"
    );
    assert_eq!(
        ns.get(
            "vmpref",
            "e2e-made-pref",
            "{.spec.cpu.preferredCPUTopology}"
        ),
        "cores"
    );
    let claim = serde_json::json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": "labelled", "namespace": ns.name, "labels": {
            "instancetype.kubevirt.io/default-instancetype": "e2e-made",
            "instancetype.kubevirt.io/default-instancetype-kind": "VirtualMachineInstancetype",
            "instancetype.kubevirt.io/default-preference": "e2e-made-pref",
            "instancetype.kubevirt.io/default-preference-kind": "VirtualMachinePreference"}},
        "spec": {"accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "64Mi"}}}});
    ns.c.kubectl_stdin(&["apply", "-f", "-"], Some(&claim.to_string()))
        .expect("labelled claim");
    let printed = virtctl(
        &ns,
        &[
            "create",
            "vm",
            "--name",
            "inferred",
            "--volume-pvc=src:labelled,name:root",
            "--infer-instancetype",
            "--infer-preference",
        ],
    );
    let out =
        ns.c.kubectl_stdin(
            &[
                "-n",
                &ns.name,
                "apply",
                "--dry-run=server",
                "-o",
                "json",
                "-f",
                "-",
            ],
            Some(&printed),
        )
        .unwrap_or_else(|e| {
            panic!("virtctl create vm --infer-instancetype | kubectl apply: {e}\n{printed}")
        });
    let inferred: serde_json::Value = serde_json::from_str(&out).expect("applied VM json");
    let spec = &inferred["spec"];
    assert_eq!(spec["instancetype"]["name"], "e2e-made", "{inferred}");
    assert_eq!(
        spec["instancetype"]["kind"], "VirtualMachineInstancetype",
        "{inferred}"
    );
    assert_eq!(spec["preference"]["name"], "e2e-made-pref", "{inferred}");
    assert_eq!(
        spec["preference"]["kind"], "VirtualMachinePreference",
        "{inferred}"
    );

    // The garbage collector keeps the copies while a VM owns them, and deletes them with
    // the last.
    ns.k(&["delete", "vm", "it", "--wait=true"]).unwrap();
    ns.wait(
        "it2",
        "it's reference dropped from the copies",
        GONE,
        || {
            ns.get(
                "controllerrevision",
                &rev,
                "{.metadata.ownerReferences[*].uid}",
            ) == vm2_uid
        },
    );
    ns.k(&["delete", "vm", "it2", "--wait=false"]).unwrap();
    ns.wait("it2", "its ControllerRevisions gone", GONE, || {
        ns.k(&["get", "controllerrevisions", "-o", "name"])
            .is_ok_and(|o| o.trim().is_empty())
    });
}
