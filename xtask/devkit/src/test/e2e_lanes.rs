//! The e2e phase's order: which test binaries run alone, and which run beside `access` and `guest`.
//!
//! `access` keeps an ssh session idle for ten minutes (KubeVirt #9827: sessions died after
//! a few idle minutes) while it does the rest of its work, so most of its time is waiting.
//! Binaries that neither restart nor reinstall kubevirt-rs, drain nodes nor restore
//! backups run beside it on the same cluster: every test keeps to a namespace of its own.
//! Everything else runs alone, one binary at a time, afterwards (`operator`, then `migration`, last: see [`LAST`]; `operator`
//! uninstalls and reinstalls everything).

use std::collections::BTreeMap;
use std::path::PathBuf;

/// Binaries run in the background beside the lane and beside each other. `access` and
/// `guest` mostly wait (an ssh session idle for ten minutes; a Debian guest booting under
/// TCG): their waiting is what the lane fills. `network` is the lane's longest binary (8.3
/// of its 18.6 min in CI): run beside, it takes the lane under `access`'s ten idle
/// minutes, which bound this part of the run anyway. They keep to namespaces of their own.
/// `live_migration` too: in the lane it took 11.3 of the lane's 22 min (a full run at
/// 5dcb0e4), making the lane the longest part; beside, it overlaps.
/// `datavolume` too: imports and a VM in a namespace of its own, mostly waiting on pods.
/// `metrics` too: two VMs in a namespace of its own, and a minute's wait for an alert.
/// `pool` too: its pools and replica sets keep to a namespace of their own, and in the lane
/// it took 5.4 of the lane's 18.4 min (a full run at 2a7f795), making the lane, not
/// `access`, the longest part.
pub const BESIDE: &[&str] = &[
    "access",
    "datavolume",
    "guest",
    "live_migration",
    "metrics",
    "network",
    "pool",
];
/// Runs alone first: it deploys kubevirt-rs (building the images) before two binaries
/// would deploy at once.
pub const FIRST: &str = "kubevirt";
/// May run while `access` runs: they touch their own namespaces only. (The migrations that
/// restart virt-handler or drain nodes are `migration`'s, run alone.) Not `plugin`: its
/// 10 MB console transfer is CPU-bound under TCG and took 12.5 min in the lane beside the
/// others against 3.2 alone (full runs at a9da117+ and 2a7f795), lengthening the lane more
/// than it saved after it.
pub const WITH_ACCESS: &[&str] = &[
    "aggregation",
    "apiserver_authz",
    "cluster",
    "security",
    "storage",
    "vm_lifecycle",
];
/// Run after everything else, in this order: `operator` uninstalls and reinstalls
/// everything (and puts the deployment back); `migration` drains nodes, etcd's among them,
/// and a failed drain can leave the cluster without its API for the rest of the run, so
/// nothing comes after it.
pub const LAST: &[&str] = &["operator", "migration"];

/// The order of a run: the first binary, then `access` and the lane beside it, then the
/// rest one by one. A binary not named here runs alone (a new one is not assumed to be
/// harmless to the others).
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    pub first: Vec<String>,
    pub beside: Vec<String>,
    pub lane: Vec<String>,
    pub after: Vec<String>,
}

pub fn plan(binaries: &[String]) -> Plan {
    let has = |n: &str| binaries.iter().any(|b| b == n);
    let beside: Vec<String> = BESIDE
        .iter()
        .filter(|b| has(b))
        .map(|b| b.to_string())
        .collect();
    let first: Vec<String> = has(FIRST).then(|| FIRST.to_string()).into_iter().collect();
    let lane: Vec<String> = binaries
        .iter()
        .filter(|b| WITH_ACCESS.contains(&b.as_str()))
        .cloned()
        .collect();
    let mut after: Vec<String> = binaries
        .iter()
        .filter(|b| {
            let b = b.as_str();
            b != FIRST && !BESIDE.contains(&b) && !LAST.contains(&b) && !WITH_ACCESS.contains(&b)
        })
        .cloned()
        .collect();
    after.extend(LAST.iter().filter(|l| has(l)).map(|l| l.to_string()));
    Plan {
        first,
        beside,
        lane,
        after,
    }
}

/// The e2e test executables by binary name, from `cargo test --no-run`'s JSON messages.
pub fn executables(messages: &str) -> BTreeMap<String, PathBuf> {
    messages
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["profile"]["test"] == true)
        .filter(|m| {
            m["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "test"))
        })
        .filter_map(|m| {
            Some((
                m["target"]["name"].as_str()?.to_string(),
                PathBuf::from(m["executable"].as_str()?),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn access_runs_beside_the_harmless_and_disruptive_ones_run_alone_after() {
        let p = plan(&names(&[
            "access",
            "aggregation",
            "datavolume",
            "guest",
            "kubevirt",
            "live_migration",
            "migration",
            "network",
            "new_binary",
            "operator",
            "plugin",
            "pool",
            "security",
            "vm_lifecycle",
            "watch_recovery",
        ]));
        assert_eq!(p.first, names(&["kubevirt"]));
        assert_eq!(
            p.beside,
            names(&[
                "access",
                "datavolume",
                "guest",
                "live_migration",
                "network",
                "pool"
            ])
        );
        assert_eq!(p.lane, names(&["aggregation", "security", "vm_lifecycle"]));
        assert_eq!(
            p.after,
            names(&[
                "new_binary",
                "plugin",
                "watch_recovery",
                "operator",
                "migration"
            ])
        );
    }

    #[test]
    fn test_executables_are_read_from_cargo_messages() {
        let msgs = r#"{"reason":"compiler-artifact","profile":{"test":true},"target":{"kind":["test"],"name":"access"},"executable":"/t/access-1"}
{"reason":"compiler-artifact","profile":{"test":false},"target":{"kind":["lib"],"name":"e2e"},"executable":null}
{"reason":"compiler-artifact","profile":{"test":true},"target":{"kind":["lib"],"name":"e2e"},"executable":"/t/e2e-2"}
{"reason":"build-finished","success":true}"#;
        let e = executables(msgs);
        assert_eq!(e.len(), 1);
        assert_eq!(e["access"], PathBuf::from("/t/access-1"));
    }
}
