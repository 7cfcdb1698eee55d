//! What the chaos loop wants of each VM, what the cluster shows, and the difference. Pure:
//! the loop and the checks feed it snapshots.

use std::collections::BTreeMap;

use serde_json::Value;

/// The state the loop last asked of one VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Want {
    pub exists: bool,
    pub running: bool,
}

impl Want {
    pub const RUNNING: Want = Want {
        exists: true,
        running: true,
    };
    pub const STOPPED: Want = Want {
        exists: true,
        running: false,
    };
    pub const ABSENT: Want = Want {
        exists: false,
        running: false,
    };
}

/// One operation of the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Op {
    Create,
    Start,
    Stop,
    Restart,
    Migrate,
    Delete,
}

impl Op {
    #[cfg(test)]
    pub const ALL: [Op; 6] = [
        Op::Create,
        Op::Start,
        Op::Stop,
        Op::Restart,
        Op::Migrate,
        Op::Delete,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Op::Create => "create",
            Op::Start => "start",
            Op::Stop => "stop",
            Op::Restart => "restart",
            Op::Migrate => "migrate",
            Op::Delete => "delete",
        }
    }

    /// What the VM should be once the operation is done.
    pub fn leaves(self) -> Want {
        match self {
            Op::Create | Op::Start | Op::Restart | Op::Migrate => Want::RUNNING,
            Op::Stop => Want::STOPPED,
            Op::Delete => Want::ABSENT,
        }
    }
}

/// The next operation on a VM in state `want`: a running VM is migrated, stopped, restarted
/// and deleted in turn (`turn` counts the operations it got while running), and every other
/// state leads back to running, so every VM goes through every operation.
pub fn next_op(want: Want, turn: usize) -> Op {
    if !want.exists {
        Op::Create
    } else if !want.running {
        Op::Start
    } else {
        [Op::Migrate, Op::Stop, Op::Restart, Op::Delete][turn % 4]
    }
}

/// The VMs a round operates on: half of them, alternating, so that the other half keeps
/// running undisturbed through the fault (the launcher victim is taken from those).
pub fn in_round(vm: usize, round: usize) -> bool {
    (vm + round).is_multiple_of(2)
}

/// One VMI as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmiSeen {
    pub uid: String,
    pub phase: String,
    pub node: String,
    /// A migration recorded on the VMI that has not ended.
    pub migrating: bool,
}

/// One launcher pod as listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSeen {
    pub name: String,
    pub uid: String,
    pub vm: String,
    pub vmi_uid: String,
    pub phase: String,
    pub deleting: bool,
}

impl PodSeen {
    /// Holds (or may still start) a guest: not finished and not on its way out.
    pub fn live(&self) -> bool {
        !self.deleting && (self.phase == "Running" || self.phase == "Pending")
    }
}

/// One QEMU process of the namespace, from the host's /proc.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QemuSeen {
    pub pid: i32,
    pub vm: String,
    pub pod_uid: Option<String>,
}

/// Everything the checks compare with the wanted states, read at one moment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    /// VM name → uid.
    pub vms: BTreeMap<String, String>,
    pub vmis: BTreeMap<String, VmiSeen>,
    pub pods: Vec<PodSeen>,
    pub qemus: Vec<QemuSeen>,
    /// Migrations (by name) not Succeeded or Failed.
    pub open_migrations: Vec<String>,
    /// Launcher pod uid → how many times its guest has booted (the test guest's banners in
    /// the pod's `guest-console-log`), where it was read: a reboot inside the same QEMU.
    pub boots: BTreeMap<String, usize>,
}

impl Seen {
    /// Reads `kubectl get vm,vmi,vmim -o json`, the launcher pods' list and the
    /// namespace's QEMU processes.
    pub fn from_lists(objects: &Value, pods: &Value, qemus: Vec<QemuSeen>) -> Seen {
        let mut seen = Seen {
            qemus,
            ..Seen::default()
        };
        let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
        for o in items(objects) {
            let name = s(&o["metadata"]["name"]);
            match o["kind"].as_str() {
                Some("VirtualMachine") => {
                    seen.vms.insert(name, s(&o["metadata"]["uid"]));
                }
                Some("VirtualMachineInstance") => {
                    let m = &o["status"]["migrationState"];
                    let migrating = m.is_object() && m["completed"] != true && m["failed"] != true;
                    seen.vmis.insert(
                        name,
                        VmiSeen {
                            uid: s(&o["metadata"]["uid"]),
                            phase: s(&o["status"]["phase"]),
                            node: s(&o["status"]["nodeName"]),
                            migrating,
                        },
                    );
                }
                Some("VirtualMachineInstanceMigration") => {
                    let phase = o["status"]["phase"].as_str().unwrap_or_default();
                    if phase != "Succeeded" && phase != "Failed" {
                        seen.open_migrations.push(name);
                    }
                }
                _ => {}
            }
        }
        for p in items(pods) {
            let labels = &p["metadata"]["labels"];
            seen.pods.push(PodSeen {
                name: s(&p["metadata"]["name"]),
                uid: s(&p["metadata"]["uid"]),
                vm: s(&labels["vm.kubevirt.io/name"]),
                vmi_uid: s(&labels["kubevirt.io/created-by"]),
                phase: s(&p["status"]["phase"]),
                deleting: p["metadata"]["deletionTimestamp"].is_string(),
            });
        }
        seen
    }
}

fn items(list: &Value) -> impl Iterator<Item = &Value> {
    list["items"].as_array().into_iter().flatten()
}

/// What differs from the wanted states: an empty list means converged. `uids` holds the
/// uid each existing VM had when the loop created it (a VM lost and made again by someone
/// else has another).
pub fn violations(
    want: &BTreeMap<String, Want>,
    uids: &BTreeMap<String, String>,
    seen: &Seen,
) -> Vec<String> {
    let mut out = Vec::new();
    for (vm, w) in want {
        let pods: Vec<&PodSeen> = seen
            .pods
            .iter()
            .filter(|p| &p.vm == vm && p.live())
            .collect();
        let qemus: Vec<&QemuSeen> = seen.qemus.iter().filter(|q| &q.vm == vm).collect();
        match (w.exists, seen.vms.get(vm)) {
            (true, None) => out.push(format!("VM {vm} lost")),
            (true, Some(uid)) => {
                if uids.get(vm).is_some_and(|want| want != uid) {
                    out.push(format!("VM {vm} is another object (uid {uid})"));
                }
            }
            (false, Some(_)) => out.push(format!("VM {vm} still exists after its delete")),
            (false, None) => {}
        }
        if !w.running {
            if let Some(vmi) = seen.vmis.get(vm) {
                out.push(format!("VMI {vm} still there ({}) after a stop", vmi.phase));
            }
            for p in &pods {
                out.push(format!(
                    "launcher pod {} of stopped VM {vm} still live",
                    p.name
                ));
            }
            for q in &qemus {
                out.push(format!(
                    "QEMU pid {} without a VMI ({vm} is stopped)",
                    q.pid
                ));
            }
            continue;
        }
        let Some(vmi) = seen.vmis.get(vm) else {
            out.push(format!("VMI {vm} missing"));
            continue;
        };
        if vmi.phase != "Running" {
            out.push(format!("VMI {vm} {}", or_unset(&vmi.phase)));
        }
        if vmi.migrating {
            out.push(format!("VMI {vm} still migrating"));
        }
        let own: Vec<&&PodSeen> = pods.iter().filter(|p| p.vmi_uid == vmi.uid).collect();
        if pods.len() != 1 || own.len() != 1 {
            let names: Vec<&str> = pods.iter().map(|p| p.name.as_str()).collect();
            out.push(format!(
                "VMI {vm}: {} live launcher pods of its uid, {} of the VM ({})",
                own.len(),
                pods.len(),
                names.join(", ")
            ));
        }
        match qemus.as_slice() {
            [] => out.push(format!("VMI {vm} Running without a QEMU process")),
            [q] => {
                if let Some(pod) = own.first()
                    && q.pod_uid.as_deref() != Some(pod.uid.as_str())
                {
                    out.push(format!(
                        "QEMU pid {} of {vm} is not in its launcher pod {}",
                        q.pid, pod.name
                    ));
                }
            }
            many => out.push(format!(
                "VMI {vm} has {} QEMU processes: pids {:?}",
                many.len(),
                many.iter().map(|q| q.pid).collect::<Vec<_>>()
            )),
        }
    }
    for vm in seen.vms.keys().filter(|v| !want.contains_key(*v)) {
        out.push(format!("VM {vm} nobody created"));
    }
    for (vm, vmi) in seen.vmis.iter().filter(|(v, _)| !want.contains_key(*v)) {
        out.push(format!("VMI {vm} ({}) of no VM", or_unset(&vmi.phase)));
    }
    for q in seen.qemus.iter().filter(|q| !want.contains_key(&q.vm)) {
        out.push(format!("QEMU pid {} ({}) of no VM", q.pid, q.vm));
    }
    for m in &seen.open_migrations {
        out.push(format!("migration {m} not finished"));
    }
    out
}

/// What identifies a running guest's instance: a restart of any part shows as a change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    pub vmi_uid: String,
    pub pod_uid: String,
    pub qemu_pid: i32,
    /// Boots of the guest in this pod, where they were read.
    pub boots: Option<usize>,
}

/// The instance of each of `vms` that runs now (a Running VMI with one live launcher pod of
/// its uid and one QEMU process in that pod); VMs in any other state are left out.
pub fn instances<'a>(
    seen: &Seen,
    vms: impl IntoIterator<Item = &'a String>,
) -> BTreeMap<String, Instance> {
    let mut out = BTreeMap::new();
    for vm in vms {
        let Some(vmi) = seen.vmis.get(vm).filter(|v| v.phase == "Running") else {
            continue;
        };
        let pods: Vec<&PodSeen> = seen
            .pods
            .iter()
            .filter(|p| &p.vm == vm && p.live() && p.vmi_uid == vmi.uid)
            .collect();
        let qemus: Vec<&QemuSeen> = seen.qemus.iter().filter(|q| &q.vm == vm).collect();
        if let ([pod], [q]) = (pods.as_slice(), qemus.as_slice()) {
            out.insert(
                vm.clone(),
                Instance {
                    vmi_uid: vmi.uid.clone(),
                    pod_uid: pod.uid.clone(),
                    qemu_pid: q.pid,
                    boots: seen.boots.get(&pod.uid).copied(),
                },
            );
        }
    }
    out
}

/// The guests a round left alone that were restarted anyway: for each VM of `before`, its
/// instance now differs (another VMI, launcher pod or QEMU process) or it no longer runs.
/// Under `runStrategy: Always` a wrongly restarted guest converges like any other, so only
/// this comparison sees it.
pub fn disturbed(before: &BTreeMap<String, Instance>, seen: &Seen) -> Vec<String> {
    let now = instances(seen, before.keys());
    let mut out = Vec::new();
    for (vm, b) in before {
        match now.get(vm) {
            None => out.push(format!(
                "{vm}, left alone by the round, no longer runs as it did"
            )),
            Some(n) if n.vmi_uid != b.vmi_uid => out.push(format!(
                "{vm}, left alone by the round, got a new VMI ({} → {})",
                b.vmi_uid, n.vmi_uid
            )),
            Some(n) if n.pod_uid != b.pod_uid => out.push(format!(
                "{vm}, left alone by the round, got a new launcher pod ({} → {})",
                b.pod_uid, n.pod_uid
            )),
            Some(n) if n.qemu_pid != b.qemu_pid => out.push(format!(
                "{vm}, left alone by the round, got a new QEMU process (pid {} → {})",
                b.qemu_pid, n.qemu_pid
            )),
            Some(Instance {
                boots: Some(now), ..
            // 0 → 1 is a guest still booting when the round began finishing its first boot.
            }) if b.boots.is_some_and(|was| was >= 1 && *now > was) => out.push(format!(
                "{vm}, left alone by the round, rebooted inside its QEMU ({} → {now} boots)",
                b.boots.unwrap_or(0)
            )),
            Some(_) => {}
        }
    }
    out
}

fn or_unset(phase: &str) -> &str {
    if phase.is_empty() {
        "without a phase"
    } else {
        phase
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn every_vm_goes_through_every_operation() {
        let mut want = Want::RUNNING;
        let mut seen = Vec::new();
        let mut turn = 0;
        for _ in 0..12 {
            let op = next_op(want, turn);
            if want.running {
                turn += 1;
            }
            seen.push(op);
            want = op.leaves();
        }
        for op in Op::ALL {
            assert!(seen.contains(&op), "{op:?} never chosen: {seen:?}");
        }
    }

    #[test]
    fn half_the_vms_are_left_alone_each_round() {
        for round in 0..4 {
            let n = (0..10).filter(|vm| in_round(*vm, round)).count();
            assert_eq!(n, 5);
        }
        assert_ne!(in_round(3, 0), in_round(3, 1));
    }

    fn lists() -> (Value, Value) {
        let objects = json!({"items": [
            {"kind": "VirtualMachine", "metadata": {"name": "a", "uid": "vm-a"}},
            {"kind": "VirtualMachineInstance", "metadata": {"name": "a", "uid": "vmi-a"},
             "status": {"phase": "Running",
                        "migrationState": {"completed": true, "sourceNode": "vm"}}},
            {"kind": "VirtualMachine", "metadata": {"name": "b", "uid": "vm-b"}},
            {"kind": "VirtualMachineInstanceMigration", "metadata": {"name": "a-m1"},
             "status": {"phase": "Succeeded"}},
        ]});
        let pods = json!({"items": [
            {"metadata": {"name": "virt-launcher-a-1", "uid": "pod-a1",
                          "labels": {"vm.kubevirt.io/name": "a", "kubevirt.io/created-by": "vmi-a"}},
             "status": {"phase": "Succeeded"}},
            {"metadata": {"name": "virt-launcher-a-2", "uid": "pod-a2",
                          "labels": {"vm.kubevirt.io/name": "a", "kubevirt.io/created-by": "vmi-a"}},
             "status": {"phase": "Running"}},
        ]});
        (objects, pods)
    }

    fn want() -> (BTreeMap<String, Want>, BTreeMap<String, String>) {
        let want = BTreeMap::from([
            ("a".to_string(), Want::RUNNING),
            ("b".to_string(), Want::STOPPED),
            ("c".to_string(), Want::ABSENT),
        ]);
        let uids = BTreeMap::from([
            ("a".to_string(), "vm-a".to_string()),
            ("b".to_string(), "vm-b".to_string()),
        ]);
        (want, uids)
    }

    #[test]
    fn a_guest_left_alone_must_keep_its_vmi_pod_and_qemu() {
        let (objects, pods) = lists();
        let qemus = vec![QemuSeen {
            pid: 42,
            vm: "a".into(),
            pod_uid: Some("pod-a2".into()),
        }];
        let seen = Seen::from_lists(&objects, &pods, qemus.clone());
        let before = instances(&seen, [&"a".to_string(), &"gone".to_string()]);
        assert_eq!(
            before.len(),
            1,
            "only a running guest has an instance: {before:?}"
        );
        assert!(disturbed(&before, &seen).is_empty());
        // The same VM converged again, but with another QEMU: a restart nobody asked for.
        let mut restarted = qemus;
        restarted[0].pid = 43;
        let again = Seen::from_lists(&objects, &pods, restarted);
        let d = disturbed(&before, &again);
        assert_eq!(d.len(), 1, "{d:?}");
        assert!(d[0].contains("new QEMU process (pid 42 → 43)"), "{d:?}");
        // Gone entirely.
        let none = Seen::from_lists(&objects, &serde_json::json!({"items": []}), vec![]);
        assert!(disturbed(&before, &none)[0].contains("no longer runs"));
        // The same VMI, pod and QEMU, but the guest booted again (a reset, a guest reboot).
        let mut booted = Seen::from_lists(
            &objects,
            &pods,
            vec![QemuSeen {
                pid: 42,
                vm: "a".into(),
                pod_uid: Some("pod-a2".into()),
            }],
        );
        // Still booting when the round began: its first banner later is no reboot.
        booted.boots.insert("pod-a2".into(), 0);
        let booting = instances(&booted, [&"a".to_string()]);
        booted.boots.insert("pod-a2".into(), 1);
        assert!(disturbed(&booting, &booted).is_empty());
        let before = instances(&booted, [&"a".to_string()]);
        assert!(disturbed(&before, &booted).is_empty());
        booted.boots.insert("pod-a2".into(), 2);
        let d = disturbed(&before, &booted);
        assert!(
            d[0].contains("rebooted inside its QEMU (1 → 2 boots)"),
            "{d:?}"
        );
    }

    #[test]
    fn a_converged_namespace_has_no_violation() {
        let (objects, pods) = lists();
        let qemu = QemuSeen {
            pid: 7,
            vm: "a".into(),
            pod_uid: Some("pod-a2".into()),
        };
        let seen = Seen::from_lists(&objects, &pods, vec![qemu]);
        let (want, uids) = want();
        assert_eq!(violations(&want, &uids, &seen), Vec::<String>::new());
    }

    #[test]
    fn lost_duplicated_stuck_and_orphaned_are_each_named() {
        let (objects, pods) = lists();
        let mut seen = Seen::from_lists(&objects, &pods, Vec::new());
        let (want, mut uids) = want();
        // A running VMI without QEMU, and a QEMU of a stopped VM, and one of no VM at all.
        seen.qemus = vec![
            QemuSeen {
                pid: 8,
                vm: "b".into(),
                pod_uid: None,
            },
            QemuSeen {
                pid: 9,
                vm: "zz".into(),
                pod_uid: None,
            },
        ];
        let v = violations(&want, &uids, &seen).join("\n");
        assert!(v.contains("VMI a Running without a QEMU process"), "{v}");
        assert!(v.contains("QEMU pid 8 without a VMI"), "{v}");
        assert!(v.contains("QEMU pid 9 (zz) of no VM"), "{v}");

        // A second live launcher of the same VM, a VM that is another object, a stuck VMI.
        let mut dup = seen.pods[1].clone();
        dup.name = "virt-launcher-a-3".into();
        dup.phase = "Pending".into();
        seen.pods.push(dup);
        uids.insert("b".into(), "vm-b-before".into());
        seen.vmis.get_mut("a").unwrap().phase = "Scheduling".into();
        seen.vms.remove("a");
        seen.open_migrations.push("a-m2".into());
        let v = violations(&want, &uids, &seen).join("\n");
        assert!(v.contains("VM a lost"), "{v}");
        assert!(v.contains("VM b is another object"), "{v}");
        assert!(v.contains("VMI a Scheduling"), "{v}");
        assert!(v.contains("2 live launcher pods of its uid"), "{v}");
        assert!(v.contains("migration a-m2 not finished"), "{v}");
    }

    #[test]
    fn an_unfinished_migration_state_counts_as_migrating() {
        let objects = json!({"items": [
            {"kind": "VirtualMachineInstance", "metadata": {"name": "a", "uid": "u"},
             "status": {"phase": "Running", "migrationState": {"sourceNode": "vm"}}},
        ]});
        let seen = Seen::from_lists(&objects, &json!({"items": []}), Vec::new());
        assert!(seen.vmis["a"].migrating);
    }
}
