//! `kubectl virt adm backup` and `adm restore` against the real cluster: the stored objects
//! are set back without a running guest noticing, and a restore obeys the rules of every
//! write. A restore is cluster-wide (it deletes what other tests created after the backup):
//! this binary runs alone (xtask/devkit/src/test/e2e_lanes.rs).
//!
//! Needs root and the packages of docs/local-cluster.md and docs/deploy.md. Run with
//! `cargo test -p e2e --test restore -- --ignored --test-threads=1`.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;
mod migration_support;

use common::*;

/// `adm backup` then `adm restore` on the live cluster: a VM created after the backup is
/// deleted, a VM deleted since comes back with its uid, and a running guest does not notice
/// (same VMI, same launcher pod, still Running).
#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn adm_restore_sets_objects_back_and_running_guests_keep_running() {
    let c = cluster();
    let ns = Ns::new(c, "restore");
    ns.apply_vm("run", "Always");
    ns.apply_vm("gone", "Halted");
    ns.wait_running("run");
    ns.wait("gone", "VM gone Stopped", GONE, || {
        ns.vm_status("gone") == "Stopped"
    });
    let (vmi, pods) = (ns.vmi_uid("run"), ns.launcher_pods("run"));
    let console = Console::open(&ns, "run");
    wait_for_shell(&console, &ns, "run");
    let boot = migration_support::boot_id(&console, &ns, "run");
    let gone_uid = ns.get("vm", "gone", "{.metadata.uid}");
    let file = std::env::temp_dir().join(format!("{}-backup.json", ns.name));
    let file_arg = file.to_str().unwrap();
    let out = ns.virt(&["adm", "backup", "--to", file_arg]);
    assert!(out.starts_with("Backed up "), "{out}");

    ns.apply_vm("later", "Halted");
    ns.k(&["delete", "vm", "gone", "--wait=true"])
        .expect("delete vm gone");
    let out = ns.virt(&["adm", "restore", "--from", file_arg]);
    assert!(out.starts_with("Restored "), "{out}");
    assert_eq!(
        ns.get("vm", "later", "{.metadata.name}"),
        "",
        "a VM created after the backup is deleted: {out}"
    );
    assert_eq!(
        ns.get("vm", "gone", "{.metadata.uid}"),
        gone_uid,
        "a deleted VM comes back with its uid: {out}"
    );
    // virt-controller has acted on the restore once the restored VM has its status back
    // (the restore writes objects without status); by then a wrong decision about the
    // running one would have been taken too.
    ns.wait("gone", "the restored VM reconciled (Stopped)", GONE, || {
        ns.vm_status("gone") == "Stopped"
    });
    std::thread::sleep(SETTLE);
    assert_eq!(
        migration_support::boot_id(&console, &ns, "run"),
        boot,
        "the running guest rebooted across the restore"
    );
    assert_eq!(ns.vmi_uid("run"), vmi, "{}", ns.diagnose("run"));
    assert_eq!(ns.vmi_phase("run"), "Running", "{}", ns.diagnose("run"));
    assert_eq!(ns.launcher_pods("run"), pods, "{}", ns.diagnose("run"));

    // A restore obeys the rules of every write (N6 of the security review at bd37f96): a
    // document whose item claims another object's uid is refused whole, naming the field,
    // with nothing written; a VMI created by a restore does not take the document's status
    // (a node, another tenant's pod).
    let backup: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).expect("read the backup"))
            .expect("backup json");
    let items = backup["items"].as_array().expect("items");
    let vmi_item = items
        .iter()
        .find(|i| {
            i["resource"] == "virtualmachineinstances"
                && i["name"] == "run"
                && i["namespace"] == ns.name.as_str()
        })
        .unwrap_or_else(|| panic!("the running VM's VMI in the backup"))
        .clone();
    let run_uid = ns.get("vm", "run", "{.metadata.uid}");
    let mut stolen = backup.clone();
    let mut copy = items
        .iter()
        .find(|i| i["resource"] == "virtualmachines" && i["name"] == "gone")
        .expect("VM gone in the backup")
        .clone();
    copy["name"] = serde_json::json!("copy");
    copy["object"]["metadata"]["name"] = serde_json::json!("copy");
    copy["object"]["metadata"]["uid"] = serde_json::json!(run_uid);
    stolen["items"].as_array_mut().unwrap().push(copy);
    let stolen_file = std::env::temp_dir().join(format!("{}-stolen.json", ns.name));
    std::fs::write(&stolen_file, stolen.to_string()).unwrap();
    let (code, out, err) =
        ns.virt_result(&["adm", "restore", "--from", stolen_file.to_str().unwrap()]);
    assert_ne!(
        code,
        Some(0),
        "a restore claiming another object's uid: {out}{err}"
    );
    assert!(
        err.contains(".object.metadata.uid"),
        "the refusal names the field: {err}"
    );
    assert_eq!(
        ns.get("vm", "copy", "{.metadata.name}"),
        "",
        "nothing written: {err}"
    );

    let mut forged_doc = backup.clone();
    let mut forged = vmi_item;
    forged["name"] = serde_json::json!("forged");
    let meta = forged["object"]["metadata"].as_object_mut().unwrap();
    meta.insert("name".into(), serde_json::json!("forged"));
    meta.insert(
        "uid".into(),
        serde_json::json!("22222222-2222-2222-2222-222222222222"),
    );
    for k in ["ownerReferences", "labels", "finalizers", "resourceVersion"] {
        meta.remove(k);
    }
    forged["object"]["status"] = serde_json::json!({
        "phase": "Running", "nodeName": "node-of-another-tenant",
        "activePods": {"uid-of-another-tenants-pod": "node-of-another-tenant"}});
    forged_doc["items"].as_array_mut().unwrap().push(forged);
    let forged_file = std::env::temp_dir().join(format!("{}-forged.json", ns.name));
    std::fs::write(&forged_file, forged_doc.to_string()).unwrap();
    let out = ns.virt(&["adm", "restore", "--from", forged_file.to_str().unwrap()]);
    assert!(out.starts_with("Restored "), "{out}");
    let status = ns.get("vmi", "forged", "{.status}");
    assert!(
        !status.contains("uid-of-another-tenants-pod")
            && !status.contains("node-of-another-tenant"),
        "the restored VMI took the document's status: {status}"
    );
    ns.k(&["delete", "vmi", "forged", "--wait=false"])
        .expect("delete vmi forged");
    for f in [&file, &stolen_file, &forged_file] {
        let _ = std::fs::remove_file(f);
    }
}
