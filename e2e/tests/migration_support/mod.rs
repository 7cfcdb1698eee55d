//! What the live migration e2e binaries share (`live_migration`, the per-VM migrations that
//! run beside the other tests; `migration`, the ones that restart virt-handler or drain
//! nodes, which run alone): the two-node cluster, the VM they migrate, the guest's boot id.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use crate::common::{self, Console, Ns, TEST_GUEST};
use e2e::Cluster;

/// A migration: target pod (image copy, libvirtd), then the transfer of a 128 MiB guest.
pub const MIGRATE: Duration = Duration::from_secs(240);

pub const VMIM: &str = "virtualmachineinstancemigrations";

/// Bandwidth annotation of virt-handler (MiB/s): slow enough to act mid-transfer.
pub const BANDWIDTH: &str = "kubevirt-rs.io/migration-bandwidth-mib";

pub fn cluster() -> &'static Cluster {
    common::two_node_cluster()
}

/// What the migration tests ask of a test namespace, beyond the shared helpers.
pub trait MigrationNs {
    fn apply(&self, manifest: &str);
    fn node_of(&self, vm: &str) -> String;
    fn migration_state(&self, vm: &str, field: &str) -> String;
    /// Phases of the VM's migrations, oldest first.
    fn vmim_phases(&self, vm: &str) -> Vec<String>;
    /// The VM's launcher pods with their nodes.
    fn launcher_pods_by_node(&self, vm: &str) -> Vec<(String, String)>;
    /// Waits for the newest migration of `vm` to end and returns its phase.
    fn wait_migration_end(&self, vm: &str, timeout: Duration) -> String;
    /// Waits for the migration to succeed; a failure panics with its reason.
    fn wait_migration_success(&self, vm: &str, timeout: Duration);
}

impl MigrationNs for Ns<'_> {
    fn apply(&self, manifest: &str) {
        self.c
            .kubectl_stdin(&["apply", "-f", "-"], Some(manifest))
            .expect("apply");
    }

    fn node_of(&self, vm: &str) -> String {
        self.get("vmi", vm, "{.status.nodeName}")
    }

    fn migration_state(&self, vm: &str, field: &str) -> String {
        self.get("vmi", vm, &format!("{{.status.migrationState.{field}}}"))
    }

    fn vmim_phases(&self, vm: &str) -> Vec<String> {
        self.k(&[
            "get",
            VMIM,
            "-l",
            &format!("kubevirt.io/vmi-name={vm}"),
            "--sort-by=.metadata.creationTimestamp",
            "-o",
            "jsonpath={range .items[*]}{.status.phase}{\"\\n\"}{end}",
        ])
        // A failed listing is not "no migration".
        .unwrap_or_else(|e| panic!("{e:#}"))
        .lines()
        .map(str::to_string)
        .collect()
    }

    fn launcher_pods_by_node(&self, vm: &str) -> Vec<(String, String)> {
        self.k(&[
            "get",
            "pods",
            "-l",
            &format!("kubevirt.io=virt-launcher,vm.kubevirt.io/name={vm}"),
            "-o",
            "jsonpath={range .items[*]}{.metadata.name} {.spec.nodeName}{\"\\n\"}{end}",
        ])
        // A failed listing is not "no pods".
        .unwrap_or_else(|e| panic!("{e:#}"))
        .lines()
        .filter_map(|l| {
            let (p, n) = l.split_once(' ')?;
            Some((p.to_string(), n.to_string()))
        })
        .collect()
    }

    fn wait_migration_end(&self, vm: &str, timeout: Duration) -> String {
        let mut last = String::new();
        self.wait(vm, "the migration to end", timeout, || {
            last = self.vmim_phases(vm).pop().unwrap_or_default();
            last == "Succeeded" || last == "Failed"
        });
        last
    }

    fn wait_migration_success(&self, vm: &str, timeout: Duration) {
        let phase = self.wait_migration_end(vm, timeout);
        assert_eq!(
            phase,
            "Succeeded",
            "migration of {vm} ended {phase}: {}",
            self.migration_state(vm, "failureReason")
        );
    }
}

pub fn vm_manifest(
    name: &str,
    ns: &str,
    annotations: serde_json::Value,
    host_disk: bool,
) -> String {
    let mut vm = serde_json::json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "runStrategy": "Always",
            "template": {
                "metadata": {"annotations": annotations},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "domain": {
                        "memory": {"guest": "128Mi"},
                        "devices": {},
                        "firmware": {"kernelBoot": {
                            "kernelArgs": virt_testguest::KERNEL_ARGS,
                            "container": {
                                "image": TEST_GUEST,
                                "imagePullPolicy": "IfNotPresent",
                                "kernelPath": "/vmlinuz",
                                "initrdPath": "/initramfs.gz"
                            }
                        }}
                    }
                }
            }
        }
    });
    if host_disk {
        // A node-local disk: not live-migratable (DisksNotLiveMigratable).
        let spec = &mut vm["spec"]["template"]["spec"];
        spec["domain"]["devices"]["disks"] =
            serde_json::json!([{"name": "local", "disk": {"bus": "virtio"}}]);
        spec["volumes"] = serde_json::json!([{"name": "local", "hostDisk": {
            "path": "/var/run/kubevirt-rs/work/local.img",
            "type": "DiskOrCreate",
            "capacity": "1Mi"
        }}]);
    }
    vm.to_string()
}

/// The guest kernel's boot id, read through the console: a new one on every boot, also
/// a reboot inside the same QEMU (which keeps the VMI and its uid).
pub fn boot_id(console: &Console, ns: &Ns<'_>, vm: &str) -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let tag = format!(
        "boot{}=",
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        // Sent again until answered: the first keys may arrive before the session.
        console.line(&format!("echo {tag}$(cat /proc/sys/kernel/random/boot_id)"));
        let wait_until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < wait_until {
            if let Some(id) = tagged_uuid(&console.screen(), &tag) {
                return id;
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        if Instant::now() > deadline {
            panic!(
                "no boot id from the guest\nscreen:\n{}\n{}",
                console.screen(),
                ns.diagnose(vm)
            );
        }
    }
}

/// The UUID right after `tag` on the screen (the typed command has `$(` there instead).
pub fn tagged_uuid(screen: &str, tag: &str) -> Option<String> {
    screen.match_indices(tag).find_map(|(i, _)| {
        let id: String = screen[i + tag.len()..]
            .chars()
            .take_while(|c| c.is_ascii_hexdigit() || *c == '-')
            .collect();
        (id.len() == 36).then_some(id)
    })
}

/// What identifies one run of a guest: the VMI (a restart by the controller makes a new
/// one) and the guest kernel's boot (a reboot inside the same VMI changes it).
#[derive(Debug, PartialEq, Eq)]
pub struct GuestRun {
    pub vmi_uid: String,
    pub boot_id: String,
}

pub fn guest_run(console: &Console, ns: &Ns<'_>, vm: &str) -> GuestRun {
    let vmi_uid = ns.vmi_uid(vm);
    assert!(!vmi_uid.is_empty(), "VMI {vm} is gone");
    GuestRun {
        vmi_uid,
        boot_id: boot_id(console, ns, vm),
    }
}

/// PIDs of processes whose command line contains every one of `needles`.
pub fn pids_with(needles: &[&str]) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                let c = String::from_utf8_lossy(&c).replace('\0', " ");
                needles.iter().all(|n| c.contains(n))
            })
        })
        .collect()
}

/// Starts a VM and waits until it runs and its console answers; returns the node, the
/// console and what identifies this run of the guest.
pub fn running_vm(
    ns: &Ns<'_>,
    vm: &str,
    annotations: serde_json::Value,
) -> (String, Console, GuestRun) {
    ns.apply(&vm_manifest(vm, &ns.name, annotations, false));
    ns.wait_running(vm);
    let node = ns.node_of(vm);
    let console = Console::open(ns, vm);
    let run = guest_run(&console, ns, vm);
    (node, console, run)
}
