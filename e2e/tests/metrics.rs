//! KubeVirt's metrics as a cluster's Prometheus sees them: a real Prometheus (built from its
//! Go module, `cargo xtask cluster up --prometheus`) discovers kubevirt-rs through the
//! ServiceMonitor virt-operator made, as the ServiceAccount whose Role virt-operator made,
//! scrapes every component, and evaluates KubeVirt's own recording rules and alerts from the
//! PrometheusRule. The assertions are PromQL over scraped data, as a dashboard or an alert
//! would read it: a running VM's memory and vCPU series, its network receive counter rising
//! while traffic flows to the guest, its storage counters rising while the guest writes, a
//! live migration's series, `VMCannotBeEvicted` firing for a VM that asks to be live-migrated
//! on eviction but cannot be, and no series left once the VMs are deleted.
//!
//! Needs root and a two-node cluster: `cargo test -p e2e --test metrics -- --ignored`.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;
mod migration_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::*;
use migration_support::MigrationNs;
use serde_json::{Value, json};

const PROMETHEUS: &str = "http://127.0.0.1:9090";

/// The two-node cluster with kubevirt-rs and Prometheus configured from what virt-operator
/// made (started, or reloaded after this binary's deploy).
fn cluster() -> &'static e2e::Cluster {
    static READY: OnceLock<()> = OnceLock::new();
    let c = migration_support::cluster();
    READY.get_or_init(|| {
        e2e::xtask(&["cluster", "up", "--nodes", "2", "--prometheus"])
            .expect("cargo xtask cluster up --prometheus");
    });
    c
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    })
}

/// GET on Prometheus' HTTP API; its `data`.
fn api(path: &str, params: &[(&str, &str)]) -> Value {
    runtime().block_on(async {
        let resp = reqwest::Client::new()
            .get(format!("{PROMETHEUS}{path}"))
            .query(params)
            .timeout(Duration::from_secs(10))
            .send()
            .await
            .unwrap_or_else(|e| panic!("Prometheus {path}: {e}"));
        let body: Value = resp.json().await.expect("Prometheus answers JSON");
        assert_eq!(body["status"], "success", "{path} {params:?}: {body}");
        body["data"].clone()
    })
}

/// An instant query's series: (labels, value).
fn query(q: &str) -> Vec<(Value, f64)> {
    let data = api("/api/v1/query", &[("query", q)]);
    data["result"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|s| {
            let v = s["value"][1]
                .as_str()
                .unwrap_or("NaN")
                .parse()
                .unwrap_or(f64::NAN);
            (s["metric"].clone(), v)
        })
        .collect()
}

/// The single value of `q`, if it has exactly one series.
fn scalar(q: &str) -> Option<f64> {
    match query(q).as_slice() {
        [(_, v)] => Some(*v),
        _ => None,
    }
}

/// Waits until `check` holds for the result of `q`; panics with the last result.
fn wait_query(
    what: &str,
    q: &str,
    timeout: Duration,
    mut check: impl FnMut(&[(Value, f64)]) -> bool,
) -> Vec<(Value, f64)> {
    let deadline = Instant::now() + timeout;
    loop {
        let r = query(q);
        if check(&r) {
            return r;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: `{q}` did not hold within {timeout:?}; last result: {r:?}"
        );
        std::thread::sleep(Duration::from_secs(2));
    }
}

#[test]
#[ignore = "needs root and a two-node cluster: cargo test -p e2e --test metrics -- --ignored"]
fn prometheus_scrapes_every_component_and_evaluates_kubevirts_rules() {
    let _c = cluster();
    // Discovery through kube-apiserver as monitoring/prometheus-k8s: every component's pods
    // found through kubevirt-prometheus-metrics, and scraped.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let targets = api("/api/v1/targets", &[("state", "active")]);
        let active = targets["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let up_containers: Vec<String> = active
            .iter()
            .filter(|t| t["health"] == "up")
            .filter_map(|t| t["labels"]["container"].as_str().map(str::to_string))
            .collect();
        let missing: Vec<&str> = [
            "virt-apiserver",
            "virt-controller",
            "virt-handler",
            "virt-operator",
        ]
        .into_iter()
        .filter(|c| !up_containers.iter().any(|u| u == c))
        .collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no healthy target for {missing:?}; targets: {}",
            serde_json::to_string_pretty(&active).unwrap()
        );
        std::thread::sleep(Duration::from_secs(2));
    }
    // Every component's own up series, as KubeVirt's rules read them.
    wait_query(
        "virt-handler seen by KubeVirt's recording rule",
        "kubevirt_virt_handler_up",
        Duration::from_secs(60),
        |r| r.iter().any(|(_, v)| *v >= 1.0),
    );
    wait_query(
        "virt-apiserver seen by KubeVirt's recording rule (pods renamed for kubevirt-rs)",
        "kubevirt_virt_api_up",
        Duration::from_secs(60),
        |r| r.iter().any(|(_, v)| *v >= 1.0),
    );
    wait_query(
        "one leading virt-operator, by KubeVirt's recording rule",
        "kubevirt_virt_operator_leading",
        Duration::from_secs(60),
        |r| r.len() == 1 && r[0].1 == 1.0,
    );
    // Every component's requests to kube-apiserver, as KubeVirt's *RESTErrorsHigh alerts
    // read them.
    wait_query(
        "REST client requests of every component",
        "sum by (container) (kubevirt_rest_client_requests_total{namespace=\"kubevirt\"})",
        Duration::from_secs(60),
        |r| {
            [
                "virt-apiserver",
                "virt-controller",
                "virt-handler",
                "virt-operator",
            ]
            .iter()
            .all(|c| r.iter().any(|(m, v)| m["container"] == *c && *v > 0.0))
        },
    );
    // KubeVirt's rules, loaded from virt-operator's PrometheusRule, all evaluate.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let groups = api("/api/v1/rules", &[])["groups"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let rules: Vec<Value> = groups
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        let alerts = rules.iter().filter(|r| r["type"] == "alerting").count();
        let recording = rules.iter().filter(|r| r["type"] == "recording").count();
        let evaluated = rules.iter().all(|r| {
            r["lastEvaluation"]
                .as_str()
                .is_some_and(|t| !t.starts_with("0001"))
        });
        let broken: Vec<String> = rules
            .iter()
            .filter(|r| r["health"] == "err")
            .map(|r| format!("{}: {}", r["name"], r["lastError"]))
            .collect();
        assert!(broken.is_empty(), "rules failing: {broken:#?}");
        if evaluated {
            assert!(alerts >= 20, "{alerts} alerts loaded");
            assert!(recording >= 15, "{recording} recording rules loaded");
            assert!(
                rules.iter().filter(|r| r["type"] == "alerting").all(|r| {
                    r["annotations"]["runbook_url"]
                        .as_str()
                        .is_some_and(|u| u.starts_with("https://"))
                }),
                "an alert without its runbook"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "rules not all evaluated within 60 s"
        );
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// The test guest with an empty scratch disk (written to below), migratable, asking to be
/// live-migrated on eviction.
fn watched_vm(name: &str, ns: &str) -> String {
    let mut vm: Value =
        serde_json::from_str(&migration_support::vm_manifest(name, ns, json!({}), false)).unwrap();
    let spec = &mut vm["spec"]["template"]["spec"];
    spec["evictionStrategy"] = json!("LiveMigrate");
    spec["domain"]["devices"]["disks"] = json!([{"name": "scratch", "disk": {"bus": "virtio"}}]);
    spec["volumes"] = json!([{"name": "scratch", "emptyDisk": {"capacity": "16Mi"}}]);
    // What the VMI would get by default, written out: KubeVirt's `kubevirt_vm_vnic_info`
    // reads the VM's own spec, which defaulting does not touch.
    spec["domain"]["devices"]["interfaces"] = json!([{"name": "default", "masquerade": {}}]);
    spec["networks"] = json!([{"name": "default", "pod": {}}]);
    vm.to_string()
}

/// A node-local disk (not live-migratable) and `evictionStrategy: LiveMigrate`: what
/// `VMCannotBeEvicted` is about.
fn pinned_vm(name: &str, ns: &str) -> String {
    let mut vm: Value =
        serde_json::from_str(&migration_support::vm_manifest(name, ns, json!({}), true)).unwrap();
    vm["spec"]["template"]["spec"]["evictionStrategy"] = json!("LiveMigrate");
    vm.to_string()
}

/// Gets `requests` HTTP requests through to the guest's web server at `ip` (the pod network's
/// address, on this machine's bridge); returns the bytes sent.
fn traffic_to_guest(ip: &str, requests: usize) -> usize {
    let request = format!("GET /{} HTTP/1.0\r\n\r\n", "x".repeat(900));
    let mut sent = 0;
    // Requests until `requests` of them reached the guest, within two minutes: under TCG,
    // on a machine running other tests' guests, a connect may time out now and then.
    let deadline = Instant::now() + Duration::from_secs(120);
    while sent < requests * request.len() && Instant::now() < deadline {
        let Ok(mut s) = TcpStream::connect_timeout(
            &format!("{ip}:80").parse().unwrap(),
            Duration::from_secs(3),
        ) else {
            continue;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(3)));
        if s.write_all(request.as_bytes()).is_ok() {
            sent += request.len();
        }
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
    }
    sent
}

#[test]
#[ignore = "needs root and a two-node cluster: cargo test -p e2e --test metrics -- --ignored"]
fn a_vm_seen_through_promql_from_start_to_deletion() {
    let c = cluster();
    let ns = Ns::new(c, "prom");
    let vm = "watched";
    ns.apply(&watched_vm(vm, &ns.name));
    ns.apply(&pinned_vm("pinned", &ns.name));
    ns.wait_running(vm);
    let sel = format!("namespace=\"{}\",name=\"{vm}\"", ns.name);

    // Memory and vCPU, as KubeVirt's dashboards read them.
    for q in [
        format!("kubevirt_vmi_memory_domain_bytes{{{sel}}}"),
        format!("kubevirt_vmi_memory_resident_bytes{{{sel}}}"),
        format!("sum(kubevirt_vmi_vcpu_seconds_total{{{sel}}})"),
        format!("kubevirt_vmi_cpu_usage_seconds_total{{{sel}}}"),
        format!("kubevirt_vmi_info{{{sel},phase=\"running\"}}"),
        // The control plane's vNIC and launcher overhead series (virt-controller's).
        format!("kubevirt_vmi_vnic_info{{{sel},network=\"pod networking\"}}"),
        format!("kubevirt_vm_vnic_info{{{sel},network=\"pod networking\"}}"),
        format!("kubevirt_vmi_launcher_memory_overhead_bytes{{{sel}}}"),
        format!("kubevirt_vmi_node_cpu_affinity{{{sel}}}"),
    ] {
        wait_query(&q, &q, Duration::from_secs(90), |r| {
            r.len() == 1 && r[0].1 > 0.0
        });
    }
    // The guest's dirty rate: measured between scrapes (an idle guest's may be 0).
    let q = format!("kubevirt_vmi_dirty_rate_bytes_per_second{{{sel}}}");
    wait_query(&q, &q, Duration::from_secs(90), |r| r.len() == 1);

    // The network receive counter rises by at least what was sent to the guest.
    let ip = ns.get("vmi", vm, "{.status.interfaces[0].ipAddress}");
    assert!(!ip.is_empty(), "the VMI has no address");
    // Summed: a label the VMI gains (e.g. its node label) starts a new series, and a range
    // query still sees the old one for a minute.
    let rx_series =
        format!("kubevirt_vmi_network_receive_bytes_total{{{sel},interface=\"default\"}}");
    let rx = format!("sum({rx_series})");
    let before = wait_query("rx before", &rx, Duration::from_secs(30), |r| r.len() == 1)[0].1;
    let sent = traffic_to_guest(&ip, 100);
    assert!(
        sent > 50_000,
        "only {sent} bytes reached the guest's web server at {ip}"
    );
    wait_query(
        "rx after traffic to the guest",
        &rx,
        Duration::from_secs(60),
        |r| r.len() == 1 && r[0].1 >= before + sent as f64,
    );
    wait_query(
        "rate of rx while traffic flows",
        &format!("sum(rate({rx_series}[1m]))"),
        Duration::from_secs(30),
        |r| r.len() == 1 && r[0].1 > 0.0,
    );

    // The storage write counters rise while the guest writes its scratch disk.
    let written = format!("sum(kubevirt_vmi_storage_write_traffic_bytes_total{{{sel}}})");
    let writes = format!("sum(kubevirt_vmi_storage_iops_write_total{{{sel}}})");
    let bytes_before = wait_query("storage before", &written, Duration::from_secs(30), |r| {
        r.len() == 1
    })[0]
        .1;
    let console = Console::open(&ns, vm);
    wait_for_shell(&console, &ns, vm);
    console.line("dd if=/dev/zero of=/dev/vda bs=64k count=128 conv=fsync && echo DD-DONE");
    console.expect(&ns, vm, "DD-DONE", Duration::from_secs(60));
    wait_query(
        "storage written after 8 MiB of dd",
        &written,
        Duration::from_secs(60),
        |r| r.len() == 1 && r[0].1 >= bytes_before + 8.0 * 1024.0 * 1024.0,
    );
    wait_query("write operations", &writes, Duration::from_secs(30), |r| {
        r.len() == 1 && r[0].1 > 0.0
    });

    // A live migration: its outcome, times and phase histogram.
    let histogram = "sum(kubevirt_vmi_migration_phase_transition_time_from_creation_seconds_count\
                     {phase=\"Succeeded\"})";
    let succeeded_before = scalar(histogram).unwrap_or(0.0);
    let from = ns.node_of(vm);
    ns.virt(&["migrate", vm]);
    ns.wait_migration_success(vm, Duration::from_secs(180));
    assert_ne!(ns.node_of(vm), from, "the VMI did not move");
    let vmim = ns
        .k(&[
            "get",
            "vmim",
            "-o",
            &format!("jsonpath={{.items[?(@.spec.vmiName==\"{vm}\")].metadata.name}}"),
        ])
        .expect("the VM's migration");
    let vmim = vmim.trim();
    assert!(
        !vmim.is_empty() && !vmim.contains(' '),
        "migrations: {vmim:?}"
    );
    wait_query(
        "kubevirt_vmi_migration_succeeded of the migration",
        &format!(
            "kubevirt_vmi_migration_succeeded{{namespace=\"{}\",vmi=\"{vm}\",vmim=\"{vmim}\"}}",
            ns.name
        ),
        Duration::from_secs(60),
        |r| r.len() == 1 && r[0].1 == 1.0,
    );
    wait_query(
        "migration start and end times",
        &format!(
            "kubevirt_vmi_migration_end_time_seconds{{{sel},status=\"succeeded\"}} \
             - on(namespace,name,migration_name) \
             kubevirt_vmi_migration_start_time_seconds{{{sel}}}"
        ),
        Duration::from_secs(60),
        |r| r.len() == 1 && r[0].1 >= 0.0,
    );
    wait_query(
        "the migration's Succeeded transition in the histogram",
        histogram,
        Duration::from_secs(60),
        |r| r.len() == 1 && r[0].1 > succeeded_before,
    );
    // Cluster-wide counts (other tests may migrate meanwhile): present, whatever their value.
    for gauge in [
        "kubevirt_vmi_migrations_in_pending_phase",
        "kubevirt_vmi_migrations_in_scheduling_phase",
        "kubevirt_vmi_migrations_in_unset_phase",
        "kubevirt_vmi_migrations_in_running_phase",
    ] {
        wait_query(gauge, gauge, Duration::from_secs(30), |r| !r.is_empty());
    }
    // The guest's series come from the target node's virt-handler now.
    let node = ns.node_of(vm);
    wait_query(
        "memory series from the target node",
        &format!("kubevirt_vmi_memory_domain_bytes{{{sel},node=\"{node}\"}}"),
        Duration::from_secs(60),
        |r| r.len() == 1,
    );

    // VMCannotBeEvicted: LiveMigrate asked for, not migratable (its `for` is 1 min).
    ns.wait_running("pinned");
    wait_query(
        "VMCannotBeEvicted firing for the pinned VM",
        &format!(
            "ALERTS{{alertname=\"VMCannotBeEvicted\",alertstate=\"firing\",\
             namespace=\"{}\",name=\"pinned\"}}",
            ns.name
        ),
        Duration::from_secs(180),
        |r| r.len() == 1,
    );
    assert!(
        query(&format!(
            "ALERTS{{alertname=\"VMCannotBeEvicted\",namespace=\"{}\",name=\"{vm}\"}}",
            ns.name
        ))
        .is_empty(),
        "VMCannotBeEvicted for a migratable VM"
    );

    // Deleted: nothing of either VM is left in an instant query.
    ns.k(&[
        "delete",
        "vm",
        vm,
        "pinned",
        "--wait=true",
        "--timeout=120s",
    ])
    .expect("delete the VMs");
    wait_query(
        "no series of the deleted VMs",
        &format!("{{namespace=\"{}\",name=~\"{vm}|pinned\"}}", ns.name),
        Duration::from_secs(90),
        |r| r.is_empty(),
    );
}
