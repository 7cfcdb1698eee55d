//! The e2e phase's order: which test binaries run alone, and which run beside `access`.
//!
//! `access` keeps an ssh session idle for ten minutes (KubeVirt #9827: sessions died after
//! a few idle minutes) while it does the rest of its work, so most of its time is waiting.
//! Binaries that neither restart nor reinstall kubevirt-rs, drain nodes nor restore
//! backups run beside it on the same cluster: every test keeps to a namespace of its own.
//! Everything else runs alone, one binary at a time, afterwards (`operator` last: it
//! uninstalls and reinstalls everything).

use std::collections::BTreeMap;
use std::path::PathBuf;

/// The binary whose waiting the others fill.
pub const BESIDE: &str = "access";
/// Runs alone first: it deploys kubevirt-rs (building the images) before two binaries
/// would deploy at once.
pub const FIRST: &str = "kubevirt";
/// May run while `access` runs: they touch their own namespaces only.
pub const WITH_ACCESS: &[&str] = &[
    "aggregation",
    "apiserver_authz",
    "cluster",
    "network",
    "security",
    "storage",
    "vm_lifecycle",
];
/// Runs after everything else.
pub const LAST: &str = "operator";

/// The order of a run: the first binary, then `access` and the lane beside it, then the
/// rest one by one. A binary not named here runs alone (a new one is not assumed to be
/// harmless to the others).
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    pub first: Vec<String>,
    pub beside: Option<String>,
    pub lane: Vec<String>,
    pub after: Vec<String>,
}

pub fn plan(binaries: &[String]) -> Plan {
    let has = |n: &str| binaries.iter().any(|b| b == n);
    let beside = has(BESIDE).then(|| BESIDE.to_string());
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
            b != FIRST && b != BESIDE && b != LAST && !WITH_ACCESS.contains(&b)
        })
        .cloned()
        .collect();
    if has(LAST) {
        after.push(LAST.to_string());
    }
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
            "kubevirt",
            "migration",
            "new_binary",
            "operator",
            "plugin",
            "security",
            "vm_lifecycle",
            "watch_recovery",
        ]));
        assert_eq!(p.first, names(&["kubevirt"]));
        assert_eq!(p.beside.as_deref(), Some("access"));
        assert_eq!(p.lane, names(&["aggregation", "security", "vm_lifecycle"]));
        assert_eq!(
            p.after,
            names(&[
                "migration",
                "new_binary",
                "plugin",
                "watch_recovery",
                "operator"
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
