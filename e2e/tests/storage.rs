//! Persistent disks (issue 18): a VM's `persistentVolumeClaim` disk on the local cluster's
//! default StorageClass (local-path-provisioner, dynamic provisioning) keeps its data
//! across a stop and start, volumeStatus reports the claim as KubeVirt does, a VM whose
//! claim does not exist yet says so and starts once it appears, and deleting the VM leaves
//! the claim (it is the user's).

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::{Console, Ns};

fn claim(ns: &str, name: &str, class: Option<&str>, size: &str) -> String {
    let mut spec = serde_json::json!({
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": size}}
    });
    if let Some(c) = class {
        spec["storageClassName"] = c.into();
    }
    serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec
    })
    .to_string()
}

/// The test guest with one disk, `data`, on claim `claim_name`: the guest sees it as
/// /dev/vda (it boots from its kernel and initramfs).
fn vm_with_claim(ns: &str, name: &str, claim_name: &str) -> String {
    let mut vm: serde_json::Value = serde_json::from_str(&common::vm_manifest(
        name,
        ns,
        "Always",
        &common::Guest::default(),
    ))
    .expect("VM manifest");
    let spec = &mut vm["spec"]["template"]["spec"];
    spec["domain"]["devices"]["disks"] =
        serde_json::json!([{"name": "data", "disk": {"bus": "virtio"}}]);
    spec["volumes"] =
        serde_json::json!([{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}]);
    vm.to_string()
}

/// Why the VMI's pod is held: its Synchronized condition's message.
fn synchronized_message(ns: &Ns<'_>, vm: &str) -> String {
    ns.get(
        "vmi",
        vm,
        r#"{.status.conditions[?(@.type=="Synchronized")].message}"#,
    )
}

#[test]
#[ignore = "needs a local cluster: cargo xtask cluster up"]
fn a_claim_disk_keeps_its_data_across_stop_and_start() {
    let c = common::cluster();
    let default_class = c
        .kubectl(&[
            "get",
            "storageclass",
            "-o",
            r#"jsonpath={.items[?(@.metadata.annotations.storageclass\.kubernetes\.io/is-default-class=="true")].metadata.name}"#,
        ])
        .expect("storage classes");
    assert_eq!(
        default_class, "local-path",
        "cargo xtask cluster up installs local-path as the default StorageClass"
    );
    let ns = Ns::new(c, "storage");

    // A VM whose claim does not exist yet: it says so instead of waiting silently.
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&vm_with_claim(&ns.name, "late", "late-claim")),
    )
    .expect("apply VM");
    ns.wait("late", "VM late ErrorPvcNotFound", common::BOOT, || {
        ns.vm_status("late") == "ErrorPvcNotFound"
    });
    let why = synchronized_message(&ns, "late");
    assert!(
        why.contains(&format!("PVC {}/late-claim does not exist", ns.name)),
        "{why}"
    );
    assert!(
        ns.launcher_pods("late").is_empty(),
        "a pod without its claim"
    );
    // A claim that can never bind (a class nobody provisions): the VM says it waits for it.
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&claim(
            &ns.name,
            "never",
            Some("nobody-provisions-this"),
            "64Mi",
        )),
    )
    .expect("create an unbindable claim");
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&vm_with_claim(&ns.name, "waiting", "never")),
    )
    .expect("apply VM");
    ns.wait(
        "waiting",
        "VM waiting WaitingForVolumeBinding",
        common::BOOT,
        || ns.vm_status("waiting") == "WaitingForVolumeBinding",
    );
    let why = synchronized_message(&ns, "waiting");
    assert!(
        why.contains(&format!("PVC {}/never not bound yet", ns.name)),
        "{why}"
    );
    ns.k(&["delete", "vm", "waiting", "--wait=false"])
        .expect("delete VM");

    // The claim appears (no class: the default one binds it): the VM starts.
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&claim(&ns.name, "late-claim", None, "64Mi")),
    )
    .expect("create the claim");
    ns.wait_running("late");
    let info = ns.get(
        "vmi",
        "late",
        r#"{.status.volumeStatus[?(@.name=="data")].persistentVolumeClaimInfo}"#,
    );
    let info: serde_json::Value =
        serde_json::from_str(&info).unwrap_or_else(|e| panic!("{e}: {info}"));
    assert_eq!(info["volumeMode"], "Filesystem", "{info}");
    assert_eq!(info["filesystemOverhead"], "0.055", "{info}");
    assert_eq!(
        info["accessModes"],
        serde_json::json!(["ReadWriteOnce"]),
        "{info}"
    );
    assert_eq!(info["capacity"]["storage"], "64Mi", "{info}");

    // Write a marker to the disk, stop, start: the marker is there. The typed command
    // does not contain the marker itself (the shell computes it), so the screen shows it
    // only when the disk returns it.
    let marker = "kubevirt-rs-marker-42";
    {
        let console = Console::open(&ns, "late");
        common::wait_for_shell(&console, &ns, "late");
        console.line(
            "echo kubevirt-rs-marker-$((6*7)) | dd of=/dev/vda bs=512 seek=2048 && sync && echo written-$((40+2))",
        );
        console.expect(&ns, "late", "written-42", Duration::from_secs(60));
    }
    ns.virt(&["stop", "late"]);
    ns.wait_stopped("late");
    ns.virt(&["start", "late"]);
    ns.wait_running("late");
    let console = Console::open(&ns, "late");
    common::wait_for_shell(&console, &ns, "late");
    console.line("dd if=/dev/vda bs=512 skip=2048 count=1 2>/dev/null | head -c 21; echo");
    console.expect(&ns, "late", marker, Duration::from_secs(60));
    drop(console);

    // The claim is the user's: deleting the VM leaves it, bound, with its disk.img.
    ns.k(&["delete", "vm", "late", "--wait=true", "--timeout=120s"])
        .expect("delete VM");
    ns.wait("late", "VM late gone", common::GONE, || {
        ns.launcher_pods("late").is_empty()
    });
    assert_eq!(ns.get("pvc", "late-claim", "{.status.phase}"), "Bound");
    if !c.local {
        e2e::skip(
            "storage::a_claim_disk_keeps_its_data_across_stop_and_start (its disk.img size)",
            "the claim's file is read on the local cluster's host",
        );
        return;
    }
    let pv = ns.get("pvc", "late-claim", "{.spec.volumeName}");
    let path = c
        .kubectl(&["get", "pv", &pv, "-o", "jsonpath={.spec.hostPath.path}"])
        .expect("the claim's volume");
    let img = std::path::Path::new(&path).join("disk.img");
    // Sparse, at the claim's size less KubeVirt's 5.5 % filesystem overhead, in whole MiB.
    let len = std::fs::metadata(&img)
        .unwrap_or_else(|e| panic!("{}: {e}", img.display()))
        .len();
    assert_eq!(len, 60 << 20, "{}", img.display());
}

/// A loop device over a file of the test's, detached again at the end.
struct Loop {
    dev: String,
    file: std::path::PathBuf,
}

impl Loop {
    fn new(dir: &std::path::Path, bytes: u64) -> Self {
        std::fs::create_dir_all(dir).expect("loop file directory");
        let file = dir.join(format!("block-{}.img", std::process::id()));
        std::fs::File::create(&file)
            .and_then(|f| f.set_len(bytes))
            .expect("loop file");
        let out = std::process::Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&file)
            .output()
            .expect("losetup");
        assert!(out.status.success(), "losetup: {out:?}");
        let dev = String::from_utf8_lossy(&out.stdout).trim().to_string();
        Loop { dev, file }
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = std::process::Command::new("losetup")
            .args(["-d", &self.dev])
            .output();
        let _ = std::fs::remove_file(&self.file);
    }
}

#[test]
#[ignore = "needs a local cluster: cargo xtask cluster up"]
fn a_block_claim_is_the_guests_disk_itself() {
    let c = common::cluster();
    if !c.local {
        e2e::skip(
            "storage::a_block_claim_is_the_guests_disk_itself",
            "a Block-mode volume here is a loop device of the local cluster's host",
        );
        return;
    }
    // A local PersistentVolume in Block mode (what a SAN or local-disk CSI driver gives),
    // bound statically: local-path-provisioner makes directories only.
    let lo = Loop::new(&e2e::workspace_root().join("target/e2e-block"), 64 << 20);
    let ns = Ns::new(c, "block");
    let node = c
        .kubectl(&["get", "nodes", "-o", "jsonpath={.items[0].metadata.name}"])
        .expect("nodes");
    let pv = format!("{}-pv", ns.name);
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(
            &serde_json::json!({
                "apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": pv},
                "spec": {
                    "capacity": {"storage": "64Mi"}, "volumeMode": "Block",
                    "accessModes": ["ReadWriteOnce"], "storageClassName": "",
                    "persistentVolumeReclaimPolicy": "Retain",
                    "local": {"path": lo.dev},
                    "claimRef": {"namespace": ns.name, "name": "raw"},
                    "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}
                }
            })
            .to_string(),
        ),
    )
    .expect("create the PersistentVolume");
    let mut pvc: serde_json::Value =
        serde_json::from_str(&claim(&ns.name, "raw", Some(""), "64Mi")).unwrap();
    pvc["spec"]["volumeMode"] = "Block".into();
    pvc["spec"]["volumeName"] = pv.clone().into();
    c.kubectl_stdin(&["apply", "-f", "-"], Some(&pvc.to_string()))
        .expect("create the claim");
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&vm_with_claim(&ns.name, "blocky", "raw")),
    )
    .expect("apply VM");
    ns.wait_running("blocky");
    let mode = ns.get(
        "vmi",
        "blocky",
        r#"{.status.volumeStatus[?(@.name=="data")].persistentVolumeClaimInfo.volumeMode}"#,
    );
    assert_eq!(mode, "Block");
    {
        let console = Console::open(&ns, "blocky");
        common::wait_for_shell(&console, &ns, "blocky");
        console.line(
            // conv=fsync: a raw device's `sync` writes the guest's cache but sends no flush;
            // this makes QEMU flush the host device's cache too.
            "echo kubevirt-rs-block-$((6*7)) | dd of=/dev/vda bs=512 seek=2048 conv=fsync && echo written-$((40+2))",
        );
        console.expect(&ns, "blocky", "written-42", Duration::from_secs(60));
    }
    // The guest wrote to the device itself: the bytes are on the loop device and, flushed,
    // in its file.
    for path in [std::path::Path::new(&lo.dev), lo.file.as_path()] {
        let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let at = &data[2048 * 512..2048 * 512 + 20];
        assert_eq!(
            at,
            b"kubevirt-rs-block-42",
            "{}: {:?}",
            path.display(),
            String::from_utf8_lossy(at)
        );
    }
    ns.k(&["delete", "vm", "blocky", "--wait=true", "--timeout=120s"])
        .expect("delete VM");
    ns.wait("blocky", "VM blocky gone", common::GONE, || {
        ns.launcher_pods("blocky").is_empty()
    });
    let _ = c.kubectl(&["delete", "pv", &pv, "--wait=false"]);
}

/// Upstream `virtctl` with the test's kubeconfig, in `ns`: its exit status and output.
fn virtctl(ns: &Ns<'_>, args: &[&str]) -> (bool, String) {
    let virtctl = e2e::upstream_virtctl().expect("upstream virtctl");
    let out = std::process::Command::new(&virtctl)
        .env("KUBECONFIG", &ns.c.kubeconfig)
        .args(["-n", &ns.name])
        .args(args)
        .output()
        .expect("virtctl");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The phase of hotplugged volume `volume` in the VMI's `status.volumeStatus`.
fn volume_phase(ns: &Ns<'_>, vmi: &str, volume: &str) -> String {
    ns.get(
        "vmi",
        vmi,
        &format!(r#"{{.status.volumeStatus[?(@.name=="{volume}")].phase}}"#),
    )
}

/// Types a command that prints which SCSI disk has serial `serial` (`found-sdX`), computed
/// by the guest so that the typed line itself never matches.
fn find_serial(console: &Console, serial: &str) {
    console.line(&format!(
        "for d in /sys/block/sd*; do grep -q {serial} $d/device/vpd_pg80 2>/dev/null && echo found$((1-1))-${{d##*/}}; done; echo scan-done$((1-1))"
    ));
}

#[test]
#[ignore = "needs a local cluster: cargo xtask cluster up"]
fn claims_hotplugged_by_upstream_virtctl_reach_the_running_guest_and_leave_it() {
    let c = common::cluster();
    let ns = Ns::new(c, "hotplug");
    for name in ["hp-data", "hp-second"] {
        c.kubectl_stdin(
            &["apply", "-f", "-"],
            Some(&claim(&ns.name, name, None, "64Mi")),
        )
        .expect("claim");
    }
    ns.apply_vm("hp", "Always");
    ns.wait_running("hp");
    let console = Console::open(&ns, "hp");
    common::wait_for_shell(&console, &ns, "hp");

    // Upstream virtctl's defaults: a SCSI disk whose serial is the volume's name, on the
    // VMI only (no --persist).
    let (ok, out) = virtctl(&ns, &["addvolume", "hp", "--volume-name=hp-data"]);
    assert!(ok, "virtctl addvolume: {out}");
    ns.wait("hp", "hp-data Ready", common::BOOT, || {
        volume_phase(&ns, "hp", "hp-data") == "Ready"
    });
    let target = ns.get(
        "vmi",
        "hp",
        r#"{.status.volumeStatus[?(@.name=="hp-data")].target}"#,
    );
    assert!(target.starts_with("sd"), "target {target:?}");
    let pod = ns.get(
        "vmi",
        "hp",
        r#"{.status.volumeStatus[?(@.name=="hp-data")].hotplugVolume.attachPodName}"#,
    );
    assert!(pod.starts_with("hp-volume-"), "attachment pod {pod:?}");
    console.clear();
    find_serial(&console, "hp-data");
    console.expect(
        &ns,
        "hp",
        &format!("found0-{target}"),
        Duration::from_secs(60),
    );
    // The guest writes to it, and keeps writing while a second volume comes.
    console.line(&format!(
        "echo hp-marker-$((6*7)) | dd of=/dev/{target} bs=512 seek=100 2>/dev/null && sync && echo wrote-$((40+2))"
    ));
    console.expect(&ns, "hp", "wrote-42", Duration::from_secs(60));
    console.line(&format!(
        "(i=0; while true; do echo tick-$i | dd of=/dev/{target} bs=512 seek=300 conv=fsync 2>/dev/null || echo write-failed-$((1+1)); i=$((i+1)); sleep 1; done) &"
    ));

    // The second one with --persist: through the VM, kept in its template.
    let (ok, out) = virtctl(
        &ns,
        &[
            "addvolume",
            "hp",
            "--volume-name=hp-second",
            "--persist",
            "--serial=second-disk",
        ],
    );
    assert!(ok, "virtctl addvolume --persist: {out}");
    ns.wait("hp", "hp-second Ready", common::BOOT, || {
        volume_phase(&ns, "hp", "hp-second") == "Ready"
    });
    let template = ns.get("vm", "hp", "{.spec.template.spec.volumes[*].name}");
    assert!(
        template.contains("hp-second"),
        "VM template volumes: {template}"
    );
    assert_eq!(
        ns.get(
            "vm",
            "hp",
            r#"{.status.conditions[?(@.type=="RestartRequired")].status}"#
        ),
        "",
        "a hotplug is no restart"
    );
    console.clear();
    find_serial(&console, "second-disk");
    console.expect(&ns, "hp", "scan-done0", Duration::from_secs(60));
    let screen = console.screen();
    assert!(
        screen.contains("found0-sd"),
        "second disk in the guest: {screen}"
    );
    // The first one still answers and was never refused a write.
    console.clear();
    console.line(&format!(
        "dd if=/dev/{target} bs=512 skip=100 count=1 2>/dev/null | head -c 13; echo; dd if=/dev/{target} bs=512 skip=300 count=1 2>/dev/null | head -c 8; echo"
    ));
    console.expect(&ns, "hp", "hp-marker-42", Duration::from_secs(60));
    assert!(
        !console.screen().contains("write-failed-2"),
        "writes to the first volume failed: {}",
        console.screen()
    );

    // The attachment pod of the first volume dies (kubevirt/kubevirt#9263 lost the disk so):
    // the guest keeps its disk and its writes, and a new pod takes the old one's place.
    ns.k(&["delete", "pod", &pod, "--wait=true", "--timeout=60s"])
        .expect("delete the attachment pod");
    ns.wait(
        "hp",
        "a new attachment pod for hp-data",
        common::BOOT,
        || {
            let now = ns.get(
                "vmi",
                "hp",
                r#"{.status.volumeStatus[?(@.name=="hp-data")].hotplugVolume.attachPodName}"#,
            );
            !now.is_empty() && now != pod && volume_phase(&ns, "hp", "hp-data") == "Ready"
        },
    );
    let pod = ns.get(
        "vmi",
        "hp",
        r#"{.status.volumeStatus[?(@.name=="hp-data")].hotplugVolume.attachPodName}"#,
    );
    console.clear();
    console.line(&format!(
        "echo again-$((6*7)) | dd of=/dev/{target} bs=512 seek=101 conv=fsync 2>/dev/null && dd if=/dev/{target} bs=512 skip=100 count=1 2>/dev/null | head -c 13; echo; dd if=/dev/{target} bs=512 skip=101 count=1 2>/dev/null | head -c 8; echo"
    ));
    console.expect(&ns, "hp", "again-42", Duration::from_secs(60));
    assert!(
        console.screen().contains("hp-marker-42") && !console.screen().contains("write-failed-2"),
        "the first volume after its attachment pod was replaced: {}",
        console.screen()
    );

    // Bad input says what is wrong and changes nothing.
    let (ok, out) = virtctl(&ns, &["addvolume", "hp", "--volume-name=hp-data"]);
    assert!(
        !ok && out.contains("hp-data"),
        "a second add of hp-data: {out}"
    );
    let (ok, out) = virtctl(&ns, &["addvolume", "hp", "--volume-name=no-such-claim"]);
    assert!(
        !ok && out.contains("no-such-claim"),
        "a missing claim: {out}"
    );
    let (ok, out) = virtctl(&ns, &["removevolume", "hp", "--volume-name=nothing-here"]);
    assert!(
        !ok && out.contains("nothing-here"),
        "removing what is not there: {out}"
    );

    // Unplugged: gone from the guest, from the status, and its attachment pod deleted.
    let (ok, out) = virtctl(&ns, &["removevolume", "hp", "--volume-name=hp-data"]);
    assert!(ok, "virtctl removevolume: {out}");
    ns.wait("hp", "hp-data gone from volumeStatus", common::BOOT, || {
        !ns.get("vmi", "hp", "{.status.volumeStatus[*].name}")
            .split_whitespace()
            .any(|n| n == "hp-data")
    });
    ns.wait(
        "hp",
        "attachment pod of hp-data deleted",
        common::GONE,
        || {
            ns.try_get("pod", &pod, "{.metadata.name}")
                .unwrap_or_default()
                .is_empty()
        },
    );
    console.clear();
    find_serial(&console, "hp-data");
    console.expect(&ns, "hp", "scan-done0", Duration::from_secs(60));
    assert!(
        !console.screen().contains("found0-"),
        "hp-data still in the guest: {}",
        console.screen()
    );
    drop(console);

    // The persisted volume comes back after a restart, hotplugged again.
    let uid = ns.vmi_uid("hp");
    ns.virt(&["restart", "hp"]);
    ns.wait("hp", "a new instance", common::BOOT, || {
        let now = ns
            .try_get("vmi", "hp", "{.metadata.uid}")
            .unwrap_or_default();
        !now.is_empty() && now != uid
    });
    ns.wait(
        "hp",
        "hp-second Ready after the restart",
        common::BOOT * 2,
        || volume_phase(&ns, "hp", "hp-second") == "Ready",
    );
    let console = Console::open(&ns, "hp");
    common::wait_for_shell(&console, &ns, "hp");
    find_serial(&console, "second-disk");
    console.expect(&ns, "hp", "found0-sd", Duration::from_secs(60));
}
