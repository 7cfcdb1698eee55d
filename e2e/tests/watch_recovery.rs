//! Watches that outlive etcd's history (issue 22): after an etcd compaction past every
//! watcher's resourceVersion and a restart of virt-apiserver (every watch reconnects from
//! where it was), virt-handler on each node re-lists on its own — a migration to each node
//! succeeds and a new VM starts on each node, with no component restarted by hand.
//!
//! Needs root (it SIGKILLs virt-apiserver on this host) and the two-node local cluster.
//! Run with `cargo test -p e2e --test watch_recovery -- --ignored --test-threads=1`.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::{BOOT, Ns, TEST_GUEST};
use e2e::Cluster;
use serde_json::{Value, json};

const MIGRATE: Duration = Duration::from_secs(240);

fn cluster() -> &'static Cluster {
    let c = common::cluster();
    let nodes = c.kubectl(&["get", "nodes", "-o", "name"]).expect("nodes");
    assert!(
        nodes.lines().count() >= 2,
        "needs two nodes (cargo xtask cluster up --nodes 2); have:\n{nodes}"
    );
    c
}

fn nodes(c: &Cluster) -> Vec<String> {
    c.kubectl(&["get", "nodes", "-o", "jsonpath={.items[*].metadata.name}"])
        .expect("nodes")
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// virt-operator's etcd through a port-forward (`virt_devenv::cluster_etcd`).
struct EtcdForward {
    rt: tokio::runtime::Runtime,
    storage: virt_apiserver::storage::Storage,
    _forward: virt_devenv::cluster_etcd::ClusterEtcd,
}

impl EtcdForward {
    fn open(c: &Cluster) -> Self {
        let forward = virt_devenv::cluster_etcd::ClusterEtcd::open(c.kubectl_path(), &c.kubeconfig)
            .expect("port-forward to the cluster's etcd");
        let tls = virt_apiserver::storage::EtcdTls {
            ca_pem: forward.ca_pem.clone(),
            cert_pem: forward.cert_pem.clone(),
            key_pem: forward.key_pem.clone(),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let storage = rt
            .block_on(virt_apiserver::storage::Storage::connect_tls(
                std::slice::from_ref(&forward.url),
                Some(&tls),
            ))
            .expect("connecting to etcd");
        EtcdForward {
            rt,
            storage,
            _forward: forward,
        }
    }

    fn revision(&self) -> i64 {
        self.rt
            .block_on(self.storage.current_revision())
            .expect("etcd revision")
    }

    fn compact(&self, revision: i64) {
        self.rt
            .block_on(self.storage.compact(revision))
            .expect("etcd compaction");
    }
}

/// `kubevirt_handler_watch_relists_total{reason="expired"}` summed over a handler's watches.
fn handler_relists(c: &Cluster, pod: &str) -> u64 {
    let text = c
        .kubectl(&["get", "--raw", &common::pod_metrics_path(c, pod)])
        .expect("handler metrics");
    text.lines()
        .filter(|l| {
            l.starts_with("kubevirt_handler_watch_relists_total{")
                && l.contains("reason=\"expired\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

fn vm_on(ns: &Ns<'_>, name: &str, node: &str) -> String {
    let mut vm: Value = serde_json::from_str(&common::vm_manifest(
        name,
        &ns.name,
        "Always",
        &Default::default(),
    ))
    .unwrap();
    vm["spec"]["template"]["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": node});
    assert!(vm.to_string().contains(TEST_GUEST));
    vm.to_string()
}

fn vmi_node(ns: &Ns<'_>, vm: &str) -> String {
    ns.k(&["get", "vmi", vm, "-o", "jsonpath={.status.nodeName}"])
        .expect("VMI readable")
}

fn vmim_phases(ns: &Ns<'_>, vm: &str) -> Vec<String> {
    ns.k(&[
        "get",
        "virtualmachineinstancemigrations",
        "-l",
        &format!("kubevirt.io/vmi-name={vm}"),
        "--sort-by=.metadata.creationTimestamp",
        "-o",
        "jsonpath={range .items[*]}{.status.phase}{\"\\n\"}{end}",
    ])
    .expect("VMIMs readable")
    .lines()
    .map(str::to_string)
    .collect()
}

/// Migrates `vm` and returns the node it runs on afterwards.
fn migrate_and_wait(ns: &Ns<'_>, vm: &str) -> String {
    let before = vmi_node(ns, vm);
    let earlier = vmim_phases(ns, vm).len();
    ns.virt(&["migrate", vm]);
    let mut phase = String::new();
    ns.wait(vm, "the migration to end", MIGRATE, || {
        let phases = vmim_phases(ns, vm);
        phase = phases.get(earlier).cloned().unwrap_or_default();
        phase == "Succeeded" || phase == "Failed"
    });
    assert_eq!(phase, "Succeeded", "migration of {vm}");
    let mut after = String::new();
    ns.wait(
        vm,
        "the VMI handed over to the target node",
        MIGRATE,
        || {
            after = vmi_node(ns, vm);
            after != before
        },
    );
    after
}

#[test]
#[ignore = "needs root and the two-node local cluster: cargo test -p e2e --test watch_recovery -- --ignored"]
fn handlers_recover_from_a_compaction_past_their_watches() {
    let c = cluster();
    let nodes = nodes(c);
    let ns = Ns::new(c, "compact");
    let handlers: Vec<String> = c
        .component_pods("virt-handler", true, "{.items[*].metadata.name}")
        .expect("virt-handler pods")
        .split_whitespace()
        .map(str::to_string)
        .collect();
    assert_eq!(handlers.len(), nodes.len(), "one virt-handler per node");
    let relists_before: Vec<u64> = handlers.iter().map(|h| handler_relists(c, h)).collect();

    c.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&common::vm_manifest(
            "mover",
            &ns.name,
            "Always",
            &Default::default(),
        )),
    )
    .expect("apply VM");
    ns.wait("mover", "Running", BOOT, || {
        ns.k(&["get", "vmi", "mover", "-o", "jsonpath={.status.phase}"])
            .is_ok_and(|p| p == "Running")
    });

    // History the handlers' watches never saw (their selectors match none of it).
    for i in 0..10 {
        let mut vm: Value = serde_json::from_str(&common::vm_manifest(
            &format!("filler-{i}"),
            &ns.name,
            "Halted",
            &Default::default(),
        ))
        .unwrap();
        vm["metadata"]["labels"] = json!({"app": "filler"});
        c.kubectl_stdin(&["apply", "-f", "-"], Some(&vm.to_string()))
            .expect("apply filler VM");
    }
    ns.k(&["delete", "vm", "-l", "app=filler"])
        .expect("delete fillers");

    // Every watch drops (every virt-apiserver killed; kubelet restarts the containers, etcd
    // and its data stay) and etcd forgets what they knew before they return.
    let etcd = EtcdForward::open(c);
    assert!(
        e2e::kill_in_containers("virt-apiserver") > 0,
        "no virt-apiserver container process on this host"
    );
    let rev = etcd.revision();
    etcd.compact(rev);
    drop(etcd);
    let t0 = Instant::now();
    c.eventually("the API to answer again", Duration::from_secs(120), || {
        c.kubectl(&["get", "vmi", "-A"]).map(|_| true)
    })
    .unwrap();
    eprintln!("compacted at {rev}; API back after {:?}", t0.elapsed());

    // Each handler re-listed by itself...
    c.eventually(
        "each virt-handler to re-list",
        Duration::from_secs(120),
        || {
            for (h, before) in handlers.iter().zip(&relists_before) {
                let now = handler_relists(c, h);
                anyhow::ensure!(now > *before, "{h}: {now} expired re-lists, was {before}");
            }
            Ok(true)
        },
    )
    .unwrap();
    // ...and sees its VMIs and incoming migrations: a VM starts on each node and migrates
    // to the other.
    for (i, node) in nodes.iter().take(2).enumerate() {
        let name = format!("after-{i}");
        c.kubectl_stdin(&["apply", "-f", "-"], Some(&vm_on(&ns, &name, node)))
            .expect("apply VM");
        ns.wait(&name, "Running on its node", BOOT, || {
            ns.k(&["get", "vmi", &name, "-o", "jsonpath={.status.phase}"])
                .is_ok_and(|p| p == "Running")
        });
        assert_eq!(&vmi_node(&ns, &name), node);
    }
    // The migrations: a VM started before the compaction moves to the other node and back,
    // so each node's handler prepares an incoming migration it learnt of after re-listing.
    let first = vmi_node(&ns, "mover");
    let second = migrate_and_wait(&ns, "mover");
    assert_eq!(migrate_and_wait(&ns, "mover"), first, "back from {second}");
}
