//! VirtualMachinePool and VirtualMachineInstanceReplicaSet as a KubeVirt user drives them
//! (issue 48): a pool of the test guest scaled 2 → 3 by `kubectl scale vmpool`, a deleted
//! member made again under its name, scaled in to 1 (highest ordinals first), a template
//! change rolled out to the running member (its VMI restarted with the new template), and
//! the pool's deletion taking its VMs with it (the garbage collector sees
//! `pool.kubevirt.io` through discovery); a replica set scaled by `kubectl scale vmirs`,
//! a deleted VMI replaced, scaled in, and deleted with its VMIs.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{BOOT, GONE, Guest, Ns, TEST_GUEST};
use serde_json::{Value, json};

/// The test guest's VMI spec (kernel boot, 128 MiB, a short grace period).
fn guest_spec() -> Value {
    let guest = Guest::default();
    json!({
        "terminationGracePeriodSeconds": 5,
        "domain": {
            "memory": {"guest": "128Mi"},
            "devices": guest.devices(),
            "firmware": {"kernelBoot": {
                "kernelArgs": guest.kernel_args(),
                "container": {
                    "image": TEST_GUEST,
                    "imagePullPolicy": "IfNotPresent",
                    "kernelPath": "/vmlinuz",
                    "initrdPath": "/initramfs.gz"
                }
            }}
        }
    })
}

fn pool_manifest(ns: &str, replicas: u32, tier: &str) -> String {
    json!({
        "apiVersion": "pool.kubevirt.io/v1beta1", "kind": "VirtualMachinePool",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web-pool"}},
            "scaleInStrategy": {"proactive": {"selectionPolicy": {"sortPolicy": "DescendingOrder"}}},
            "virtualMachineTemplate": {
                "metadata": {"labels": {"app": "web-pool"}},
                "spec": {
                    "runStrategy": "Always",
                    "template": {
                        "metadata": {"labels": {"app": "web-pool", "tier": tier}},
                        "spec": guest_spec(),
                    }
                }
            }
        }
    })
    .to_string()
}

/// The names of the objects of `kind` selected by `selector`, without those being deleted.
fn names(ns: &Ns<'_>, kind: &str, selector: &str) -> anyhow::Result<BTreeSet<String>> {
    // kubectl's JSONPath has no negation: each name with its deletionTimestamp, kept when
    // it has none.
    let out = ns.k(&[
        "get",
        kind,
        "-l",
        selector,
        "-o",
        "jsonpath={range .items[*]}{.metadata.name} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
    ])?;
    Ok(out
        .lines()
        .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            [name] => Some(name.to_string()),
            _ => None,
        })
        .collect())
}

fn set(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn wait_vms(ns: &Ns<'_>, want: &[&str], timeout: Duration) {
    let want = set(want);
    if let Err(e) = ns.c.eventually(&format!("pool VMs {want:?}"), timeout, || {
        Ok(names(ns, "vm", "app=web-pool")? == want)
    }) {
        panic!("{e:#}\n{}", ns.diagnose("web-0"));
    }
}

fn wait_running(ns: &Ns<'_>, vms: &[&str]) {
    for vm in vms {
        ns.wait_running(vm);
    }
}

#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e --test pool -- --ignored"]
fn a_pool_scales_heals_rolls_out_and_goes_with_its_vms() {
    let c = common::cluster();
    let ns = Ns::new(c, "pool");
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&pool_manifest(&ns.name, 2, "1")),
    )
    .expect("apply pool");
    wait_vms(&ns, &["web-0", "web-1"], BOOT);
    wait_running(&ns, &["web-0", "web-1"]);

    // `kubectl scale` through the scale subresource.
    let out = ns
        .k(&["scale", "vmpool", "web", "--replicas=3"])
        .expect("kubectl scale vmpool");
    assert!(out.contains("scaled"), "{out}");
    wait_vms(&ns, &["web-0", "web-1", "web-2"], BOOT);
    wait_running(&ns, &["web-2"]);
    c.eventually("status.replicas 3", BOOT, || {
        Ok(ns.try_get("vmpool", "web", "{.status.replicas}")? == "3")
    })
    .expect("pool status");
    let table = ns.k(&["get", "vmpool", "web"]).expect("get vmpool");
    assert!(table.lines().next().unwrap().contains("DESIRED"), "{table}");

    // A deleted member is made again under its name.
    let old = ns.get("vm", "web-1", "{.metadata.uid}");
    ns.k(&["delete", "vm", "web-1", "--wait=false"])
        .expect("delete vm");
    ns.wait("web-1", "web-1 made again", BOOT, || {
        let uid = ns.get("vm", "web-1", "{.metadata.uid}");
        !uid.is_empty() && uid != old
    });
    wait_running(&ns, &["web-1"]);

    // Scale in: the highest ordinals go (DescendingOrder), their VMIs with them.
    ns.k(&["scale", "vmpool", "web", "--replicas=1"])
        .expect("scale in");
    wait_vms(&ns, &["web-0"], GONE);
    ns.wait("web-2", "web-1 and web-2's VMIs gone", GONE, || {
        ns.vmi_uid("web-1").is_empty() && ns.vmi_uid("web-2").is_empty()
    });

    // A template change: the VM is rewritten and its VMI restarted with the new template.
    let vmi_before = ns.vmi_uid("web-0");
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&pool_manifest(&ns.name, 1, "2")),
    )
    .expect("apply changed pool");
    ns.wait(
        "web-0",
        "web-0's VMI made from the new template",
        BOOT,
        || {
            let uid = ns.vmi_uid("web-0");
            !uid.is_empty()
                && uid != vmi_before
                && ns.get("vmi", "web-0", "{.metadata.labels.tier}") == "2"
        },
    );
    wait_running(&ns, &["web-0"]);

    // Deleting the pool deletes its VMs (the garbage collector follows the owner reference).
    ns.k(&["delete", "vmpool", "web", "--wait=false"])
        .expect("delete pool");
    ns.wait("web-0", "the pool's VMs gone with it", GONE, || {
        ns.get("vm", "web-0", "{.metadata.name}").is_empty()
    });
}

/// Exactly `n` of the replica set's VMIs are active, all of them Running.
fn running(ns: &Ns<'_>, n: usize) -> anyhow::Result<bool> {
    let out = ns.k(&[
        "get",
        "vmi",
        "-l",
        "app=rs",
        "-o",
        "jsonpath={range .items[?(@.status.phase==\"Running\")]}{.metadata.name}{\"\\n\"}{end}",
    ])?;
    let active = names(ns, "vmi", "app=rs")?;
    Ok(out.lines().filter(|l| !l.is_empty()).count() == n && active.len() == n)
}

#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e --test pool -- --ignored"]
fn a_replica_set_scales_and_heals() {
    let c = common::cluster();
    let ns = Ns::new(c, "vmirs");
    let rs = json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceReplicaSet",
        "metadata": {"name": "rs", "namespace": ns.name},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "rs"}},
            "template": {"metadata": {"labels": {"app": "rs"}}, "spec": guest_spec()}}
    });
    c.kubectl_stdin(&["apply", "-f", "-"], Some(&rs.to_string()))
        .expect("apply vmirs");
    c.eventually("2 VMIs Running", BOOT, || running(&ns, 2))
        .expect("replica set VMIs");

    let out = ns
        .k(&["scale", "vmirs", "rs", "--replicas=3"])
        .expect("kubectl scale vmirs");
    assert!(out.contains("scaled"), "{out}");
    c.eventually("3 VMIs Running", BOOT, || running(&ns, 3))
        .expect("scaled out");

    // A deleted VMI is replaced at once (by a VMI of another name).
    let before = names(&ns, "vmi", "app=rs").unwrap();
    let victim = before.iter().next().unwrap().clone();
    ns.k(&["delete", "vmi", &victim, "--wait=false"])
        .expect("delete vmi");
    c.eventually("a replacement VMI Running", BOOT, || {
        let now = names(&ns, "vmi", "app=rs")?;
        Ok(!now.contains(&victim) && running(&ns, 3)?)
    })
    .expect("healed");
    c.eventually("status.readyReplicas 3", BOOT, || {
        Ok(ns.try_get("vmirs", "rs", "{.status.replicas}")? == "3")
    })
    .expect("replica set status");

    ns.k(&["scale", "vmirs", "rs", "--replicas=1"])
        .expect("scale in");
    c.eventually(
        "1 VMI",
        GONE,
        || Ok(names(&ns, "vmi", "app=rs")?.len() == 1),
    )
    .expect("scaled in");

    // Deleting the replica set deletes its VMIs.
    ns.k(&["delete", "vmirs", "rs", "--wait=false"])
        .expect("delete vmirs");
    c.eventually("the replica set's VMIs gone", GONE, || {
        Ok(names(&ns, "vmi", "app=rs")?.is_empty())
    })
    .expect("VMIs gone with the replica set");
}
