//! Live migration of single VMs on the two-node local cluster (`cargo xtask cluster up
//! --nodes 2`): `kubectl virt migrate` moves a running guest to the other node without a
//! reboot and back; a cancelled migration and one whose target launcher is killed leave the
//! guest running on the source; a VM that cannot migrate says why and `migrate` is refused;
//! VMs on a shared claim and on a ReadWriteOnce claim move with their data. These touch only
//! their own namespaces, so they run beside the other e2e binaries (the ones that restart
//! virt-handler or drain nodes are `migration`, run alone).
//!
//! Needs root, tmux and the packages of docs/local-cluster.md. Uses the cluster named by
//! KUBECONFIG or brings the local one up with two nodes. Run with
//! `cargo test -p e2e --test live_migration -- --ignored --test-threads=1`.

// The helpers below serve only these tests: a failure is a test failure.
#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;
mod migration_support;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Console, Ns};
use migration_support::*;

#[test]
#[ignore = "needs root and a two-node cluster: cargo test -p e2e --test live_migration -- --ignored"]
fn migrated_vm_keeps_running_on_the_other_node_and_comes_back() {
    let c = cluster();
    let ns = Ns::new(c, "migrate");
    let (first, console, before) = running_vm(&ns, "mover", serde_json::json!({}));
    let source_pods = ns.launcher_pods_by_node("mover");
    assert_eq!(source_pods.len(), 1, "{source_pods:?}");
    assert_eq!(
        ns.get(
            "vmi",
            "mover",
            "{.status.conditions[?(@.type==\"LiveMigratable\")].status}"
        ),
        "True"
    );

    // A forward open across the migration: a request half sent, so the guest's web
    // server waits for the rest.
    common::page_via_stdio(&ns, "mover");
    let mut forward = common::plugin(&ns, &["port-forward", "--stdio", "vm/mover", "80"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl virt port-forward --stdio");
    let mut held = forward.stdin.take().expect("stdin");
    std::io::Write::write_all(&mut held, b"GET / HTTP/1.0\r\n").expect("half a request");

    let t0 = Instant::now();
    let out = ns.virt(&["migrate", "mover"]);
    assert!(out.contains("mover"), "{out}");
    ns.wait_migration_success("mover", MIGRATE);
    eprintln!("migrate → Succeeded in {:?}", t0.elapsed());
    // The forward into the source ends, saying why; a new one reaches the guest on its new
    // node.
    let ended = Instant::now();
    let out = loop {
        if let Some(_status) = forward.try_wait().expect("port-forward") {
            break forward.wait_with_output().expect("port-forward output");
        }
        assert!(
            ended.elapsed() < Duration::from_secs(30),
            "the forward into the source did not end after the migration"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    drop(held);
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("migrated to another node"), "{said}");
    eprintln!(
        "port-forward ended {:?} after the migration: {}",
        ended.elapsed(),
        said.trim()
    );
    assert!(common::page_via_stdio(&ns, "mover").contains("kubevirt-rs guest"));
    let second = ns.node_of("mover");
    assert_ne!(second, first, "the VMI did not change node");
    assert_eq!(ns.migration_state("mover", "completed"), "true");
    assert_eq!(ns.migration_state("mover", "sourceNode"), first);
    assert_eq!(ns.migration_state("mover", "targetNode"), second);
    eprintln!(
        "moved {} bytes, downtime {} ms",
        ns.migration_state("mover", "dataProcessedBytes"),
        ns.migration_state("mover", "downtimeMs")
    );
    // The source launcher pod goes; the target's is the VMI's now.
    ns.wait(
        "mover",
        "the source launcher pod gone",
        Duration::from_secs(120),
        || {
            let pods = ns.launcher_pods_by_node("mover");
            pods.len() == 1 && pods[0].1 == second && pods[0].0 != source_pods[0].0
        },
    );
    // The open console ended with the source's QEMU; a new one reaches the moved guest.
    ns.wait(
        "mover",
        "the old console session to end",
        Duration::from_secs(60),
        || console.exited(),
    );
    let console = Console::open(&ns, "mover");
    assert_eq!(
        guest_run(&console, &ns, "mover"),
        before,
        "not the same guest after the migration: restarted or rebooted"
    );
    assert_eq!(ns.get("vmi", "mover", "{.status.phase}"), "Running");

    // And back, with `--wait`: the command follows the migration and returns once it
    // succeeded, saying where the VM went.
    let out = ns.virt(&["migrate", "mover", "--wait"]);
    let last = out.lines().last().unwrap_or_default().to_string();
    assert!(
        last.starts_with("VM mover migrated to node ") && last.contains(&first),
        "migrate --wait said: {out}"
    );
    let phases = ns
        .k(&[
            "get",
            "vmim",
            "-l",
            &format!("{}=mover", kubevirt_api::migration::names::VMI_NAME_LABEL),
            "--sort-by=.metadata.creationTimestamp",
            "-o",
            "jsonpath={.items[*].status.phase}",
        ])
        .expect("the VM's migrations");
    assert_eq!(
        phases.split_whitespace().last(),
        Some("Succeeded"),
        "the newest VMIM when migrate --wait returned: {phases}"
    );
    ns.wait_migration_success("mover", MIGRATE);
    assert_eq!(ns.node_of("mover"), first);
    ns.wait(
        "mover",
        "one launcher pod, on the first node",
        Duration::from_secs(120),
        || {
            let pods = ns.launcher_pods_by_node("mover");
            pods.len() == 1 && pods[0].1 == first
        },
    );
    let console = Console::open(&ns, "mover");
    assert_eq!(
        guest_run(&console, &ns, "mover"),
        before,
        "not the same guest after the migration back: restarted or rebooted"
    );
}

#[test]
#[ignore = "needs root and a two-node cluster: cargo test -p e2e --test live_migration -- --ignored"]
fn cancelled_migration_leaves_the_guest_on_the_source() {
    let c = cluster();
    let ns = Ns::new(c, "cancel");
    let (node, console, before) = running_vm(&ns, "stay", serde_json::json!({BANDWIDTH: "1"}));
    ns.virt(&["migrate", "stay"]);
    ns.wait("stay", "the transfer to start", MIGRATE, || {
        !ns.migration_state("stay", "startTimestamp").is_empty()
    });
    // While it runs (1 MiB/s), the source's virt-handler exports its progress as KubeVirt
    // does: what was sent, what is left, the total.
    let path = common::handler_metrics_path(c, &node);
    let want = vec![
        format!("namespace=\"{}\"", ns.name),
        "name=\"stay\"".to_string(),
    ];
    let mut text = String::new();
    ns.wait(
        "stay",
        "kubevirt_vmi_migration_data_* on the source",
        Duration::from_secs(60),
        || {
            text = c.kubectl(&["get", "--raw", &path]).unwrap_or_default();
            common::series_value(&text, "kubevirt_vmi_migration_data_processed_bytes", &want)
                .is_some_and(|v| v > 0.0)
        },
    );
    let (total, remaining) = (
        common::series_value(&text, "kubevirt_vmi_migration_data_total_bytes", &want)
            .expect("kubevirt_vmi_migration_data_total_bytes"),
        common::series_value(&text, "kubevirt_vmi_migration_data_remaining_bytes", &want)
            .expect("kubevirt_vmi_migration_data_remaining_bytes"),
    );
    assert!(
        total > 0.0 && remaining <= total,
        "total {total}, remaining {remaining}"
    );
    let out = ns.virt(&["migrate-cancel", "stay"]);
    assert!(out.contains("stay"), "{out}");
    ns.wait(
        "stay",
        "the abort to be confirmed",
        Duration::from_secs(120),
        || ns.migration_state("stay", "abortStatus") == "Succeeded",
    );
    assert_eq!(ns.migration_state("stay", "failed"), "true");
    assert_eq!(ns.node_of("stay"), node);
    ns.wait(
        "stay",
        "the target pod gone and the VMIM released",
        Duration::from_secs(120),
        || ns.launcher_pods_by_node("stay").len() == 1 && ns.vmim_phases("stay").is_empty(),
    );
    assert_eq!(
        guest_run(&console, &ns, "stay"),
        before,
        "not the same guest after the cancel: restarted or rebooted"
    );
    assert!(!console.exited(), "the console on the source ended");
    assert_eq!(ns.get("vmi", "stay", "{.status.phase}"), "Running");
    // No migration, no progress series.
    ns.wait(
        "stay",
        "the migration series gone",
        Duration::from_secs(60),
        || {
            let text = c.kubectl(&["get", "--raw", &path]).unwrap_or_default();
            common::series_value(&text, "kubevirt_vmi_migration_data_total_bytes", &want).is_none()
        },
    );
}

#[test]
#[ignore = "needs root and a two-node cluster: cargo test -p e2e --test live_migration -- --ignored"]
fn killed_target_launcher_fails_the_migration_and_leaves_the_guest_on_the_source() {
    let c = cluster();
    let ns = Ns::new(c, "kill");
    let (node, console, before) = running_vm(&ns, "victim", serde_json::json!({BANDWIDTH: "1"}));
    let uid = ns.get("vmi", "victim", "{.metadata.uid}");
    ns.virt(&["migrate", "victim"]);
    ns.wait("victim", "the transfer to start", MIGRATE, || {
        !ns.migration_state("victim", "startTimestamp").is_empty()
    });
    let muid = ns.migration_state("victim", "migrationUid");
    let short: String = muid.chars().filter(|c| *c != '-').take(8).collect();
    let target_dir = format!("sockets/{uid}-{short}");
    // The target launcher: the only process whose command line is a migration target's
    // of this VMI (its pod's VMI file names the uid only inside; the socket directory of
    // the target is mounted at the usual path, so find it by its flag and the domain).
    // This migration's target launcher: the launcher process in the target pod's cgroup
    // (other tests beside this one may be migrating too).
    let target_pod = ns.migration_state("victim", "targetPod");
    let target_uid = ns.get("pod", &target_pod, "{.metadata.uid}");
    let launchers: Vec<i32> = virt_devenv::procs::in_containers()
        .into_iter()
        .filter(|p| p.comm == "virt-launcher" && p.pod_uid.as_deref() == Some(&target_uid))
        .filter(|p| p.cmdline.iter().any(|a| a == "--migration-target"))
        .map(|p| p.pid)
        .collect();
    assert_eq!(
        launchers.len(),
        1,
        "target launchers of pod {target_pod} ({target_uid}): {launchers:?} ({target_dir})"
    );
    let killed = Command::new("kill")
        .args(["-9", &launchers[0].to_string()])
        .status()
        .expect("kill");
    assert!(killed.success(), "kill -9 {}", launchers[0]);
    assert_eq!(ns.wait_migration_end("victim", MIGRATE), "Failed");
    let reason = ns.migration_state("victim", "failureReason");
    assert!(
        !reason.is_empty(),
        "no failure reason\n{}",
        ns.diagnose("victim")
    );
    eprintln!("failure reason: {reason}");
    assert_eq!(ns.node_of("victim"), node);
    ns.wait(
        "victim",
        "no target pod left",
        Duration::from_secs(120),
        || ns.launcher_pods_by_node("victim").len() == 1,
    );
    ns.wait(
        "victim",
        "no target QEMU left",
        Duration::from_secs(60),
        || {
            virt_devenv::procs::in_containers()
                .iter()
                .all(|p| p.pod_uid.as_deref() != Some(&target_uid))
                && pids_with(&["qemu-system", &format!("{}_victim", ns.name)]).len() <= 1
        },
    );
    assert_eq!(
        guest_run(&console, &ns, "victim"),
        before,
        "not the same guest after the failed migration: restarted or rebooted"
    );
    assert_eq!(ns.get("vmi", "victim", "{.status.phase}"), "Running");
}

#[test]
#[ignore = "needs root and a two-node cluster: cargo test -p e2e --test live_migration -- --ignored"]
fn vm_with_a_local_disk_is_not_live_migratable_and_migrate_is_refused() {
    let c = cluster();
    let ns = Ns::new(c, "local");
    ns.apply(&vm_manifest(
        "pinned",
        &ns.name,
        serde_json::json!({}),
        true,
    ));
    ns.wait_running("pinned");
    let cond = "{.status.conditions[?(@.type==\"LiveMigratable\")]";
    ns.wait(
        "pinned",
        "LiveMigratable=False",
        Duration::from_secs(60),
        || ns.get("vmi", "pinned", &format!("{cond}.status}}")) == "False",
    );
    assert_eq!(
        ns.get("vmi", "pinned", &format!("{cond}.reason}}")),
        "DisksNotLiveMigratable"
    );
    let (code, out, err) = ns.virt_result(&["migrate", "pinned"]);
    assert_eq!(
        code,
        Some(1),
        "migrate of a non-migratable VM succeeded: {out}"
    );
    assert!(
        err.contains("DisksNotLiveMigratable") || err.contains("HostDisk"),
        "refusal without the reason: {err}"
    );
    assert!(
        ns.vmim_phases("pinned").is_empty(),
        "a migration was created"
    );
}

#[test]
fn boot_ids_are_read_from_the_screen() {
    let id = "0f6c1c0e-3a51-4f7e-9a55-2b1d3c4e5f60";
    let screen = format!("/ # echo boot3=$(cat /proc/sys/kernel/random/boot_id)\nboot3={id}\n/ # ");
    assert_eq!(tagged_uuid(&screen, "boot3=").as_deref(), Some(id));
    assert_eq!(tagged_uuid(&screen, "boot4="), None);
    // Cut off by the edge of the screen: not an id.
    assert_eq!(tagged_uuid("boot5=0f6c1c0e-3a51", "boot5="), None);
}

/// A VM whose disk is a shared (ReadWriteMany) claim migrates with its memory only: the
/// target mounts the same claim, the guest keeps its boot and its writes, and what it
/// writes after the move lands in the same disk.img (issue 18, shared storage).
#[test]
#[ignore = "needs root and a two-node cluster: cargo test -p e2e --test live_migration -- --ignored"]
fn a_vm_on_a_shared_claim_migrates_and_keeps_writing_to_it() {
    let c = cluster();
    let ns = Ns::new(c, "shared");
    ns.apply(
        &serde_json::json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "shared-disk", "namespace": ns.name},
            "spec": {"storageClassName": "shared-path", "accessModes": ["ReadWriteMany"],
                     "resources": {"requests": {"storage": "64Mi"}}}
        })
        .to_string(),
    );
    let mut vm: serde_json::Value = serde_json::from_str(&vm_manifest(
        "sharer",
        &ns.name,
        serde_json::json!({}),
        false,
    ))
    .unwrap();
    let spec = &mut vm["spec"]["template"]["spec"];
    spec["domain"]["devices"]["disks"] =
        serde_json::json!([{"name": "data", "disk": {"bus": "virtio"}}]);
    spec["volumes"] = serde_json::json!([{"name": "data",
        "persistentVolumeClaim": {"claimName": "shared-disk"}}]);
    ns.apply(&vm.to_string());
    ns.wait_running("sharer");
    assert_eq!(
        ns.get(
            "vmi",
            "sharer",
            "{.status.conditions[?(@.type==\"LiveMigratable\")].status}"
        ),
        "True",
        "a ReadWriteMany claim is shared storage"
    );
    let first = ns.node_of("sharer");
    let console = Console::open(&ns, "sharer");
    let before = guest_run(&console, &ns, "sharer");
    // Before: a marker, synced. During: a writer that says so if a write fails. The typed
    // commands do not contain what they print (the shell computes it).
    console.line(
        "echo before-$((6*7)) | dd of=/dev/vda bs=512 seek=2048 2>/dev/null && sync && echo synced-$((6*7))",
    );
    console.expect(&ns, "sharer", "synced-42", Duration::from_secs(60));
    console.line(
        "(i=0; while true; do echo w$i | dd of=/dev/vda bs=512 seek=$((4096 + i % 1024)) 2>/dev/null && sync || echo IO-ERROR-$((6*7)); i=$((i+1)); usleep 100000; done) &",
    );

    ns.virt(&["migrate", "sharer"]);
    ns.wait_migration_success("sharer", MIGRATE);
    let second = ns.node_of("sharer");
    assert_ne!(second, first, "the VMI did not change node");
    ns.wait(
        "sharer",
        "the old console to end",
        Duration::from_secs(60),
        || console.exited(),
    );
    let screen_before = console.screen();
    assert!(!screen_before.contains("IO-ERROR-42"), "{screen_before}");
    let console = Console::open(&ns, "sharer");
    assert_eq!(
        guest_run(&console, &ns, "sharer"),
        before,
        "not the same guest after the migration: restarted or rebooted"
    );
    console.line(
        "echo after-$((6*7)) | dd of=/dev/vda bs=512 seek=2049 2>/dev/null && sync && dd if=/dev/vda bs=512 skip=2048 count=1 2>/dev/null | head -c 9; echo",
    );
    console.expect(&ns, "sharer", "before-42", Duration::from_secs(60));
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        !console.screen().contains("IO-ERROR-42"),
        "{}",
        console.screen()
    );

    // On the host: the one disk.img holds what was written on both nodes.
    if c.local {
        let pv = ns.get("pvc", "shared-disk", "{.spec.volumeName}");
        let dir = c
            .kubectl(&["get", "pv", &pv, "-o", "jsonpath={.spec.hostPath.path}"])
            .expect("the claim's volume");
        let img = std::fs::read(std::path::Path::new(&dir).join("disk.img")).expect("disk.img");
        assert_eq!(&img[2048 * 512..2048 * 512 + 9], b"before-42");
        assert_eq!(&img[2049 * 512..2049 * 512 + 8], b"after-42");
    }
}

/// The hex digest right after `tag` on the screen (the typed command has `$(` there).
fn tagged_sha(screen: &str, tag: &str) -> Option<String> {
    screen.match_indices(tag).find_map(|(i, _)| {
        let h: String = screen[i + tag.len()..]
            .chars()
            .take_while(char::is_ascii_hexdigit)
            .collect();
        (h.len() == 64).then_some(h)
    })
}

/// Runs `script` in the guest, which must print `<tag>$(… | sha256sum)`, and returns the
/// digest. Each call uses a new tag, so an earlier answer is never taken for this one.
fn guest_sha(console: &Console, ns: &Ns<'_>, vm: &str, script: &str) -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let tag = format!(
        "sha{}=",
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    console.line(&script.replace("TAG=", &tag));
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        if let Some(h) = tagged_sha(&console.screen(), &tag) {
            return h;
        }
        if Instant::now() > deadline {
            panic!(
                "no digest {tag} from the guest\nscreen:\n{}\n{}",
                console.screen(),
                ns.diagnose(vm)
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Claims a migration made and still owns, in the namespace.
fn migration_claims(ns: &Ns<'_>) -> Vec<String> {
    ns.k(&[
        "get",
        "pvc",
        "-l",
        "kubevirt-rs.io/migration-uid",
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ])
    .expect("claims")
    .split_whitespace()
    .map(str::to_string)
    .collect()
}

/// A VM whose disk is a ReadWriteOnce claim on node-local storage (local-path) migrates
/// anyway (issue 18, beyond KubeVirt, which refuses): the migration makes a claim on the
/// target node and copies the disk into it while the guest runs and writes. A cancelled
/// migration leaves no claim behind; a successful one moves the VM to the new claim
/// (its template too, so a restart finds the data) and deletes the old claim.
#[test]
#[ignore = "needs root and a two-node cluster: cargo test -p e2e --test live_migration -- --ignored"]
fn a_vm_on_a_readwriteonce_claim_migrates_with_its_disk_copied() {
    let c = cluster();
    let ns = Ns::new(c, "rwo");
    ns.apply(
        &serde_json::json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "rwo-disk", "namespace": ns.name},
            "spec": {"accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "600Mi"}}}
        })
        .to_string(),
    );
    // Throttled (MiB/s), so that the guest writes while its disk is being copied and a
    // cancel comes in mid-transfer. The throttle counts the disk's unwritten (sparse)
    // part too: 567 MiB take ~35 s at 16 MiB/s, within the completion timeout.
    let mut vm: serde_json::Value = serde_json::from_str(&vm_manifest(
        "copier",
        &ns.name,
        serde_json::json!({BANDWIDTH: "16"}),
        false,
    ))
    .unwrap();
    let spec = &mut vm["spec"]["template"]["spec"];
    spec["domain"]["devices"]["disks"] =
        serde_json::json!([{"name": "data", "disk": {"bus": "virtio"}}]);
    spec["volumes"] =
        serde_json::json!([{"name": "data", "persistentVolumeClaim": {"claimName": "rwo-disk"}}]);
    ns.apply(&vm.to_string());
    ns.wait_running("copier");
    assert_eq!(
        ns.get(
            "vmi",
            "copier",
            "{.status.conditions[?(@.type==\"LiveMigratable\")].status}"
        ),
        "True",
        "a ReadWriteOnce claim is copied, so the VMI is live-migratable"
    );
    let first = ns.node_of("copier");
    let console = Console::open(&ns, "copier");
    let before = guest_run(&console, &ns, "copier");
    // 32 MiB of random data at the start of the disk (a 567 MiB disk.img), written
    // before any migration.
    let pre = guest_sha(
        &console,
        &ns,
        "copier",
        "dd if=/dev/urandom of=/dev/vda bs=1M count=32 2>/dev/null; sync; echo TAG=$(dd if=/dev/vda bs=1M count=32 2>/dev/null | sha256sum)",
    );

    // A cancelled migration: its claim goes with it, the VMI keeps its own.
    ns.virt(&["migrate", "copier"]);
    ns.wait("copier", "the transfer to start", MIGRATE, || {
        !ns.migration_state("copier", "startTimestamp").is_empty()
    });
    let made = migration_claims(&ns);
    assert_eq!(made.len(), 1, "{made:?}");
    assert!(made[0].starts_with("rwo-disk-mig-"), "{made:?}");
    ns.virt(&["migrate-cancel", "copier"]);
    ns.wait(
        "copier",
        "the cancelled migration's claim and pod gone",
        Duration::from_secs(180),
        || {
            migration_claims(&ns).is_empty()
                && ns.launcher_pods_by_node("copier").len() == 1
                && ns.vmim_phases("copier").is_empty()
        },
    );
    assert_eq!(
        ns.k(&["get", "pvc", &made[0], "--ignore-not-found", "-o", "name"])
            .expect("claim"),
        "",
        "the cancelled migration's claim is still there"
    );
    assert_eq!(ns.node_of("copier"), first);
    assert_eq!(
        ns.get(
            "vmi",
            "copier",
            "{.spec.volumes[0].persistentVolumeClaim.claimName}"
        ),
        "rwo-disk"
    );

    // The migration that goes through, with a writer running (it prints IO-ERROR-42 if a
    // write fails) and 4 MiB more written while the disk is being copied.
    console.line(
        "(i=0; while true; do echo w$i | dd of=/dev/vda bs=512 seek=$((200000 + i % 1024)) 2>/dev/null && sync || echo IO-ERROR-$((6*7)); i=$((i+1)); usleep 100000; done) &",
    );
    // The VMI's migrationState still describes the cancelled migration until the new one's
    // hand-off replaces it.
    let cancelled = ns.migration_state("copier", "migrationUid");
    ns.virt(&["migrate", "copier"]);
    ns.wait("copier", "the transfer to start", MIGRATE, || {
        ns.migration_state("copier", "migrationUid") != cancelled
            && !ns.migration_state("copier", "startTimestamp").is_empty()
    });
    let mid = guest_sha(
        &console,
        &ns,
        "copier",
        "dd if=/dev/urandom of=/dev/vda bs=1M count=4 seek=100 2>/dev/null; sync; echo TAG=$(dd if=/dev/vda bs=1M count=4 skip=100 2>/dev/null | sha256sum)",
    );
    assert!(
        ns.migration_state("copier", "endTimestamp").is_empty(),
        "the migration ended before the guest's write during the copy: not a test of it"
    );
    ns.wait_migration_success("copier", MIGRATE);
    let second = ns.node_of("copier");
    assert_ne!(second, first, "the VMI did not change node");
    ns.wait(
        "copier",
        "the old console to end",
        Duration::from_secs(60),
        || console.exited(),
    );
    assert!(
        !console.screen().contains("IO-ERROR-42"),
        "{}",
        console.screen()
    );
    let console = Console::open(&ns, "copier");
    assert_eq!(
        guest_run(&console, &ns, "copier"),
        before,
        "not the same guest after the migration: restarted or rebooted"
    );
    let read = |skip: u32, count: u32| {
        guest_sha(
            &console,
            &ns,
            "copier",
            &format!(
                "echo TAG=$(dd if=/dev/vda bs=1M count={count} skip={skip} 2>/dev/null | sha256sum)"
            ),
        )
    };
    assert_eq!(read(0, 32), pre, "data written before the migration");
    assert_eq!(read(100, 4), mid, "data written during the copy");
    assert!(
        !console.screen().contains("IO-ERROR-42"),
        "{}",
        console.screen()
    );

    // The VM lives on the new claim now: the VMI, its volumeStatus and the VM's template
    // name it; it is handed over (no migration label or owner); the user's own claim is
    // kept (kubevirt-rs deletes only claims it made, unless asked), an Event saying so.
    let claim = ns.get(
        "vmi",
        "copier",
        "{.spec.volumes[0].persistentVolumeClaim.claimName}",
    );
    assert!(claim.starts_with("rwo-disk-mig-"), "{claim}");
    assert_eq!(
        ns.get(
            "vm",
            "copier",
            "{.spec.template.spec.volumes[0].persistentVolumeClaim.claimName}"
        ),
        claim
    );
    assert_eq!(
        ns.get(
            "vmi",
            "copier",
            "{.status.volumeStatus[?(@.name==\"data\")].persistentVolumeClaimInfo.claimName}"
        ),
        claim
    );
    assert_eq!(
        ns.get(
            "pvc",
            &claim,
            "{.metadata.labels.kubevirt-rs\\.io/migration-uid}{.metadata.ownerReferences}"
        ),
        ""
    );
    assert_eq!(
        ns.get(
            "pvc",
            &claim,
            "{.metadata.annotations.kubevirt-rs\\.io/migrated-from}"
        ),
        "rwo-disk"
    );
    ns.wait(
        "copier",
        "an Event saying the user's claim was kept",
        Duration::from_secs(120),
        || {
            ns.k(&["get", "events", "-o", "jsonpath={.items[*].message}"])
                .is_ok_and(|m| m.contains("claim rwo-disk kept"))
        },
    );
    assert_eq!(
        ns.k(&["get", "pvc", "rwo-disk", "-o", "name"])
            .unwrap()
            .trim(),
        "persistentvolumeclaim/rwo-disk",
        "the user's claim was deleted"
    );
    if c.local {
        let pv = ns.get("pvc", &claim, "{.spec.volumeName}");
        let affinity = c
            .kubectl(&["get", "pv", &pv, "-o", "jsonpath={.spec.nodeAffinity}"])
            .expect("the new claim's volume");
        assert!(affinity.contains(&second), "{affinity}");
    }

    // A stop and start runs the guest from the new claim, with the data.
    drop(console);
    ns.virt(&["stop", "copier"]);
    ns.wait_stopped("copier");
    ns.virt(&["start", "copier"]);
    ns.wait_running("copier");
    assert_eq!(ns.node_of("copier"), second, "the new claim is on {second}");
    let console = Console::open(&ns, "copier");
    common::wait_for_shell(&console, &ns, "copier");
    assert_eq!(
        guest_sha(
            &console,
            &ns,
            "copier",
            "echo TAG=$(dd if=/dev/vda bs=1M count=32 2>/dev/null | sha256sum)"
        ),
        pre,
        "data after a restart on the new claim"
    );
}
