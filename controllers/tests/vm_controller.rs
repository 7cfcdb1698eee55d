//! The VM controller in-process against a real etcd and the real virt-apiserver.
//!
//! Each test starts its own DevEnv and runs the controller scoped to the test's
//! namespace. No launcher pods exist here, so VMIs stay in the phase they were created
//! with unless a test writes their status through /status, as virt-handler would.
//!
//! The virt-apiserver binary: a binary of another package is not available through
//! `CARGO_BIN_EXE_*`, and a nested `cargo build` from a test would wait on the build
//! directory lock `cargo test` holds. So the tests use `$VIRT_APISERVER_BIN`, else the
//! `virt-apiserver` next to this test's own target directory, which `cargo test
//! --workspace` (and `cargo xtask test`) builds; with `cargo test -p virt-controllers`
//! alone, run `cargo build -p virt-apiserver` first.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kubevirt_api::{PrintableStatus, VirtualMachine, VirtualMachineInstance};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use virt_controllers::vm::decide::BackoffConfig;
use virt_controllers::{Config, Context};
use virt_devenv::{DevEnv, Options};

const NS: &str = "default";

/// The VMI controller's part that these tests need: VMIs are born with its finalizer and it
/// lets a deleted one go once no launcher pod remains, which here is at once (there are none).
async fn release_finalizers(client: Client, shutdown: CancellationToken) {
    use virt_controllers::vmi::decide::FINALIZER;
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client, NS);
    while !shutdown.is_cancelled() {
        if let Ok(list) = vmis.list(&Default::default()).await {
            for v in list.items {
                let fins = v.metadata.finalizers.clone().unwrap_or_default();
                if v.metadata.deletion_timestamp.is_some() && fins.iter().any(|f| f == FINALIZER) {
                    let keep: Vec<&String> = fins.iter().filter(|f| *f != FINALIZER).collect();
                    let patch = json!({"metadata": {
                        "finalizers": keep, "resourceVersion": v.metadata.resource_version}});
                    let name = v.metadata.name.clone().unwrap_or_default();
                    let _ = vmis
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

struct Harness {
    // Dropped last: stops virt-apiserver and etcd.
    _env: DevEnv,
    client: Client,
    server: String,
    shutdown: CancellationToken,
    controller: Option<tokio::task::JoinHandle<()>>,
    ctx: Arc<Context>,
}

impl Harness {
    async fn start() -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let env = tokio::task::spawn_blocking(|| {
            DevEnv::start(Options {
                apiserver_bin: virt_devenv::apiserver_bin_beside_test()
                    .expect("virt-apiserver binary"),
                ..Options::default()
            })
            .expect("start etcd and virt-apiserver (is Debian's etcd-server installed?)")
        })
        .await
        .unwrap();
        let kc = kube::config::Kubeconfig::read_from(&env.kubeconfig).unwrap();
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        let client = Client::try_from(cfg).unwrap();
        let config = Config {
            namespace: Some(NS.to_string()),
            // Short enough that a crash-loop retry happens within a test.
            crash_loop: BackoffConfig {
                min_interval: Duration::from_secs(1),
                max_delay: Duration::from_secs(5),
            },
            error_backoff_base: Duration::from_millis(100),
            ..Config::default()
        };
        let ctx = Arc::new(Context::new(client.clone(), None, config));
        let shutdown = CancellationToken::new();
        let vmis = virt_controllers::vmi::shared(&ctx, shutdown.clone());
        let dvs = virt_controllers::datavolume::shared(&ctx, shutdown.clone());
        let controller = tokio::spawn(virt_controllers::vm::run(
            ctx.clone(),
            vmis,
            dvs,
            shutdown.clone(),
        ));
        tokio::spawn(release_finalizers(client.clone(), shutdown.clone()));
        Self {
            server: env.server_url.clone(),
            _env: env,
            client,
            shutdown,
            controller: Some(controller),
            ctx,
        }
    }

    fn vms(&self) -> Api<VirtualMachine> {
        Api::namespaced(self.client.clone(), NS)
    }

    fn vmis(&self) -> Api<VirtualMachineInstance> {
        Api::namespaced(self.client.clone(), NS)
    }

    async fn create_vm(&self, name: &str, strategy: &str) -> VirtualMachine {
        let vm: VirtualMachine = serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": name, "labels": {"app": "demo"}},
            "spec": {"runStrategy": strategy, "template": {
                "metadata": {"labels": {"kubevirt.io/vm": name}},
                "spec": {
                    "domain": {"devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]},
                               "resources": {"requests": {"memory": "64Mi"}}},
                    "volumes": [{"name": "root", "containerDisk": {"image": "localhost/kubevirt-rs/test-guest:latest"}}]}}}
        }))
        .unwrap();
        self.vms()
            .create(&PostParams::default(), &vm)
            .await
            .unwrap()
    }

    /// PUT on a subresources.kubevirt.io action; returns the HTTP status code.
    async fn action(&self, name: &str, action: &str) -> u16 {
        self.action_with(name, action, json!({})).await
    }

    async fn action_with(&self, name: &str, action: &str, body: serde_json::Value) -> u16 {
        let url = format!(
            "{}/apis/subresources.kubevirt.io/v1/namespaces/{NS}/virtualmachines/{name}/{action}",
            self.server
        );
        let req = http::Request::put(url)
            .header("content-type", "application/json")
            .body(body.to_string().into_bytes())
            .unwrap();
        match self.client.request_text(req).await {
            Ok(_) => 202,
            Err(kube::Error::Api(s)) => s.code,
            Err(e) => panic!("{action}: {e}"),
        }
    }

    async fn set_vmi_phase(&self, name: &str, phase: &str, ran: bool) {
        let mut status = json!({"phase": phase});
        if ran {
            status["phaseTransitionTimestamps"] =
                json!([{"phase": "Running", "phaseTransitionTimestamp": "2026-01-01T00:00:00Z"}]);
        }
        self.vmis()
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "status": status })),
            )
            .await
            .unwrap();
    }

    async fn vmi(&self, name: &str) -> Option<VirtualMachineInstance> {
        self.vmis().get_opt(name).await.unwrap()
    }

    async fn vm(&self, name: &str) -> VirtualMachine {
        self.vms().get(name).await.unwrap()
    }

    /// Polls `f` until it returns Some, for at most 20 s.
    async fn eventually<T, F, Fut>(&self, what: &str, f: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        kube_testenv::eventually(what, Duration::from_secs(20), f).await
    }

    async fn vmi_uid(&self, name: &str) -> String {
        self.eventually("a VMI", || async {
            self.vmi(name)
                .await
                .filter(|v| v.metadata.deletion_timestamp.is_none())
                .and_then(|v| v.metadata.uid)
        })
        .await
    }

    async fn new_vmi_uid(&self, name: &str, old: &str) -> String {
        self.eventually("a new VMI", || async {
            self.vmi(name)
                .await
                .and_then(|v| v.metadata.uid)
                .filter(|u| u != old)
        })
        .await
    }

    async fn vmi_gone(&self, name: &str) {
        self.eventually("the VMI to be gone", || async {
            self.vmi(name).await.is_none().then_some(())
        })
        .await
    }

    async fn printable(&self, name: &str, want: PrintableStatus) -> VirtualMachine {
        self.eventually(&format!("printableStatus {want:?}"), || async {
            let vm = self.vm(name).await;
            (vm.status.as_ref().and_then(|s| s.printable_status) == Some(want)).then_some(vm)
        })
        .await
    }

    async fn stop_controller(mut self) {
        self.shutdown.cancel();
        if let Some(c) = self.controller.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), c).await;
        }
    }
}

fn requests(vm: &VirtualMachine) -> usize {
    vm.status
        .as_ref()
        .and_then(|s| s.state_change_requests.as_ref())
        .map_or(0, Vec::len)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_creates_a_vmi_owned_by_the_vm() {
    let h = Harness::start().await;
    let vm = h.create_vm("always", "Always").await;
    h.vmi_uid("always").await;
    let vmi = h.vmi("always").await.unwrap();
    let owner = &vmi.metadata.owner_references.clone().unwrap()[0];
    assert_eq!(owner.kind, "VirtualMachine");
    assert_eq!(owner.api_version, "kubevirt.io/v1");
    assert_eq!(owner.name, "always");
    assert_eq!(Some(&owner.uid), vm.metadata.uid.as_ref());
    assert_eq!(owner.controller, Some(true));
    assert_eq!(owner.block_owner_deletion, Some(true));
    assert_eq!(
        vmi.metadata
            .labels
            .unwrap()
            .get("kubevirt.io/vm")
            .map(String::as_str),
        Some("always")
    );
    let vm = h.printable("always", PrintableStatus::Starting).await;
    let st = vm.status.unwrap();
    assert_eq!(st.created, Some(true));
    assert_eq!(st.ready, Some(false));
    assert_eq!(st.run_strategy, Some(kubevirt_api::RunStrategy::Always));
    assert_eq!(st.observed_generation, vm.metadata.generation);

    // The guest runs (as virt-handler would report): Running.
    h.set_vmi_phase("always", "Running", false).await;
    h.printable("always", PrintableStatus::Running).await;
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_and_start_subresources() {
    let h = Harness::start().await;
    h.create_vm("ss", "Always").await;
    let first = h.vmi_uid("ss").await;

    assert_eq!(h.action("ss", "stop").await, 202);
    h.vmi_gone("ss").await;
    let vm = h.printable("ss", PrintableStatus::Stopped).await;
    assert_eq!(
        vm.spec.run_strategy,
        Some(kubevirt_api::RunStrategy::Halted)
    );
    assert_eq!(vm.status.unwrap().created, Some(false));

    assert_eq!(h.action("ss", "start").await, 202);
    let second = h.new_vmi_uid("ss", &first).await;
    assert_ne!(first, second);
    h.printable("ss", PrintableStatus::Starting).await;
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_start_request_creates_and_is_consumed() {
    let h = Harness::start().await;
    h.create_vm("manual", "Manual").await;
    h.printable("manual", PrintableStatus::Stopped).await;
    assert!(h.vmi("manual").await.is_none());

    assert_eq!(h.action("manual", "start").await, 202);
    let uid = h.vmi_uid("manual").await;
    let vm = h
        .eventually("the start request consumed", || async {
            let vm = h.vm("manual").await;
            (requests(&vm) == 0).then_some(vm)
        })
        .await;
    assert_eq!(vm.status.unwrap().created, Some(true));

    // Stop of exactly that VMI.
    assert_eq!(h.action("manual", "stop").await, 202);
    h.vmi_gone("manual").await;
    let vm = h.printable("manual", PrintableStatus::Stopped).await;
    h.eventually("the stop request consumed", || async {
        (requests(&h.vm("manual").await) == 0).then_some(())
    })
    .await;
    assert_eq!(
        vm.spec.run_strategy,
        Some(kubevirt_api::RunStrategy::Manual)
    );
    // Manual does not restart on its own.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(h.vmi("manual").await.is_none(), "{uid} must stay stopped");
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn halted_never_creates() {
    let h = Harness::start().await;
    h.create_vm("halted", "Halted").await;
    let vm = h.printable("halted", PrintableStatus::Stopped).await;
    assert_eq!(vm.status.unwrap().created, Some(false));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(h.vmi("halted").await.is_none());
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerun_on_failure_recreates_only_failed_vmis() {
    let h = Harness::start().await;
    h.create_vm("rerun", "RerunOnFailure").await;
    let first = h.vmi_uid("rerun").await;

    // A guest that ran and then failed is restarted at once.
    h.set_vmi_phase("rerun", "Failed", true).await;
    let second = h.new_vmi_uid("rerun", &first).await;
    h.eventually("the requeued start consumed", || async {
        (requests(&h.vm("rerun").await) == 0).then_some(())
    })
    .await;

    // A failure before ever running is a failed start: recreated after the back-off.
    h.set_vmi_phase("rerun", "Failed", false).await;
    let third = h.new_vmi_uid("rerun", &second).await;
    let vm = h.vm("rerun").await;
    let failure = vm.status.unwrap().start_failure.unwrap();
    assert_eq!(failure.consecutive_fail_count, Some(1));
    assert_eq!(
        failure.last_failed_vmi_uid.as_deref(),
        Some(second.as_str())
    );

    // A clean shutdown stops the VM for good.
    h.vmi_uid("rerun").await;
    h.set_vmi_phase("rerun", "Succeeded", true).await;
    h.vmi_gone("rerun").await;
    h.printable("rerun", PrintableStatus::Stopped).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        h.vmi("rerun").await.is_none(),
        "{third} must not be replaced"
    );
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_does_not_recreate() {
    let h = Harness::start().await;
    h.create_vm("once", "Once").await;
    let uid = h.vmi_uid("once").await;
    h.set_vmi_phase("once", "Failed", true).await;
    h.printable("once", PrintableStatus::Stopped).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let vmi = h.vmi("once").await.expect("the finished VMI stays");
    assert_eq!(vmi.metadata.uid.as_deref(), Some(uid.as_str()));
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_replaces_the_vmi() {
    let h = Harness::start().await;
    h.create_vm("restart", "Always").await;
    let first = h.vmi_uid("restart").await;
    assert_eq!(h.action("restart", "restart").await, 202);
    let second = h.new_vmi_uid("restart", &first).await;
    assert_ne!(first, second);
    h.eventually("the restart requests consumed", || async {
        (requests(&h.vm("restart").await) == 0).then_some(())
    })
    .await;
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steady_state_makes_no_status_writes() {
    let h = Harness::start().await;
    h.create_vm("quiet", "Always").await;
    h.vmi_uid("quiet").await;
    let vm = h.printable("quiet", PrintableStatus::Starting).await;
    // Steady state: no further writes while nothing changes.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let later = h.vm("quiet").await;
    assert_eq!(
        vm.metadata.resource_version, later.metadata.resource_version,
        "the controller keeps rewriting an unchanged status"
    );
    // A start costs one VMI create and one VM status write.
    let text = h.ctx.metrics.encode();
    assert!(
        text.contains("virt_controller_vm_status_writes_total 1\n"),
        "{text}"
    );
    assert!(
        text.contains(
            "virt_controller_vmi_actions_total{action=\"create\",result=\"success\"} 1\n"
        ),
        "{text}"
    );
    // KubeVirt's inventory from the controller's VM cache (slimmed, but for what it reads).
    let vm_series = |family: &str| {
        text.lines()
            .filter(|l| l.starts_with(&format!("{family}{{name=\"quiet\"")))
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let info = vm_series("kubevirt_vm_info");
    assert_eq!(info.len(), 1, "{text}");
    assert!(
        info[0].ends_with("status=\"starting\",status_group=\"starting\"} 1.0"),
        "{info:?}"
    );
    // 64Mi of memory from the template, and KubeVirt's default topology of one.
    let requests = vm_series("kubevirt_vm_resource_requests");
    let ends = [
        "unit=\"bytes\",source=\"domain\"} 67108864.0",
        "unit=\"cores\",source=\"default\"} 1.0",
        "unit=\"threads\",source=\"default\"} 1.0",
        "unit=\"sockets\",source=\"default\"} 1.0",
    ];
    assert_eq!(requests.len(), ends.len(), "{requests:?}");
    for (line, end) in requests.iter().zip(ends) {
        assert!(line.ends_with(end), "{line}");
    }
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_paused_creates_a_paused_vmi() {
    let h = Harness::start().await;
    h.create_vm("paused", "Halted").await;
    h.printable("paused", PrintableStatus::Stopped).await;
    assert_eq!(
        h.action_with("paused", "start", json!({"paused": true}))
            .await,
        202
    );
    h.vmi_uid("paused").await;
    let vmi = h.vmi("paused").await.unwrap();
    assert_eq!(
        vmi.spec.start_strategy,
        Some(kubevirt_api::vmi::StartStrategy::Paused)
    );
    h.eventually("the start request consumed", || async {
        (requests(&h.vm("paused").await) == 0).then_some(())
    })
    .await;
    h.stop_controller().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_runs_against_the_apiserver() {
    let h = Harness::start().await;
    // Only the binary may act here.
    h.shutdown.cancel();
    let bin = env!("CARGO_BIN_EXE_virt-controller");
    let mut child = tokio::process::Command::new(bin)
        .args([
            "--leader-elect=false",
            "--events=false",
            "--watch-namespace",
            NS,
        ])
        .arg("--kubeconfig")
        .arg(&h._env.kubeconfig)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    h.create_vm("bin", "Always").await;
    h.vmi_uid("bin").await;
    h.printable("bin", PrintableStatus::Starting).await;
    child.kill().await.unwrap();
}

/// The controller's status writes rely on the apiserver rejecting a merge patch of
/// /status whose metadata.resourceVersion is stale (else a stateChangeRequest appended
/// by a subresource between our read and our write would be silently dropped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_status_patch_is_a_conflict() {
    let h = Harness::start().await;
    h.shutdown.cancel();
    let vm = h.create_vm("rv", "Manual").await;
    let stale = vm.metadata.resource_version.clone().unwrap();
    // Someone else writes in between (as the start subresource does).
    assert_eq!(h.action("rv", "start").await, 202);
    let patch = json!({
        "metadata": {"resourceVersion": stale},
        "status": {"stateChangeRequests": null, "printableStatus": "Stopped"}
    });
    let err = h
        .vms()
        .patch_status("rv", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect_err("a stale resourceVersion must not be accepted");
    match err {
        kube::Error::Api(s) => assert_eq!(s.code, 409, "{s:?}"),
        other => panic!("{other}"),
    }
    assert_eq!(requests(&h.vm("rv").await), 1, "the start request survived");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vmi_owned_by_another_controller_is_left_alone() {
    let h = Harness::start().await;
    let vmi: VirtualMachineInstance = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "foreign", "ownerReferences": [{
            "apiVersion": "example.com/v1", "kind": "Other", "name": "x",
            "uid": "00000000-0000-0000-0000-000000000001", "controller": true}]},
        "spec": {"domain": {"devices": {}, "resources": {"requests": {"memory": "64Mi"}}}}
    }))
    .unwrap();
    let created = h.vmis().create(&PostParams::default(), &vmi).await.unwrap();
    h.create_vm("foreign", "Halted").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let still = h
        .vmi("foreign")
        .await
        .expect("not deleted by the Halted VM");
    assert_eq!(still.metadata.uid, created.metadata.uid);
    h.stop_controller().await;
}
