//! A real kube-apiserver and etcd for the controllers' integration tests.
//!
//! Pods need the real kube-apiserver (its pod validation, graceful deletion of bound
//! pods, the binding and eviction subresources, events.k8s.io). Each test starts its own
//! etcd and kube-apiserver (static token, AlwaysAllow) and serves our kinds from CRDs
//! with a /status subresource: the same CRD semantics virt-apiserver implements, without
//! the aggregation setup.
//!
//! kube-apiserver: `$KUBE_APISERVER_BIN` (set by `cargo xtask test`), else
//! `target/k8s/*/bin/kube-apiserver`, which `cargo xtask cluster up` builds. etcd:
//! Debian's `etcd-server`.

#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use kubevirt_api::vmi::VirtualMachineInstancePhase as Phase;
use kubevirt_api::{VirtualMachine, VirtualMachineInstance};
use serde_json::{Value, json};

/// The namespace the tests work in.
pub const NS: &str = "default";

/// A kind served from a CRD: plural, singular, kind, short name.
pub type Kind = (&'static str, &'static str, &'static str, &'static str);

/// VirtualMachineInstance.
pub const VMI: Kind = (
    "virtualmachineinstances",
    "virtualmachineinstance",
    "VirtualMachineInstance",
    "vmi",
);
/// VirtualMachine.
pub const VM: Kind = ("virtualmachines", "virtualmachine", "VirtualMachine", "vm");
/// VirtualMachineInstanceMigration.
pub const VMIM: Kind = (
    "virtualmachineinstancemigrations",
    "virtualmachineinstancemigration",
    "VirtualMachineInstanceMigration",
    "vmim",
);

fn kube_apiserver_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("KUBE_APISERVER_BIN") {
        return p.into();
    }
    let k8s = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/k8s");
    let found = std::fs::read_dir(&k8s).ok().and_then(|versions| {
        versions
            .filter_map(Result::ok)
            .map(|v| v.path().join("bin/kube-apiserver"))
            .find(|p| p.exists())
    });
    found.unwrap_or_else(|| {
        panic!(
            "no kube-apiserver under {}: run `cargo xtask cluster up` once (it builds the \
             Kubernetes binaries), or set KUBE_APISERVER_BIN",
            k8s.display()
        )
    })
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child process killed on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// etcd + kube-apiserver, stopped on drop.
pub struct KubeApi {
    // Field order = drop order: the apiserver stops before its etcd, the dir goes last.
    _apiserver: Proc,
    _etcd: Proc,
    /// Logs and data.
    pub dir: tempfile::TempDir,
    /// An admin client.
    pub client: Client,
}

impl KubeApi {
    /// Starts etcd and kube-apiserver, installs a CRD per kind and the `default`
    /// ServiceAccount, and waits until every kind is served.
    pub async fn start(token: &str, kinds: &[Kind]) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (etcd_port, peer_port, api_port) = (free_port(), free_port(), free_port());
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let etcd = Proc(
            Command::new("/usr/bin/etcd")
                .arg("--data-dir")
                .arg(d.join("etcd"))
                .args(["--listen-client-urls", &etcd_url])
                .args(["--advertise-client-urls", &etcd_url])
                .args(["--listen-peer-urls", &peer_url])
                .args(["--initial-advertise-peer-urls", &peer_url])
                .args(["--initial-cluster", &format!("default={peer_url}")])
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(d.join("etcd.log")).unwrap())
                .spawn()
                .expect("start etcd (install Debian's etcd-server)"),
        );
        let key = d.join("sa.key");
        let ok = Command::new("openssl")
            .args(["genrsa", "-out"])
            .arg(&key)
            .arg("2048")
            .stderr(Stdio::null())
            .status()
            .expect("openssl");
        assert!(ok.success(), "openssl genrsa failed");
        std::fs::write(
            d.join("tokens.csv"),
            format!("{token},admin,admin-uid,system:masters\n"),
        )
        .unwrap();
        let apiserver = Proc(
            Command::new(kube_apiserver_bin())
                .args(["--etcd-servers", &etcd_url])
                .args(["--bind-address", "127.0.0.1"])
                .args(["--secure-port", &api_port.to_string()])
                .arg("--cert-dir")
                .arg(d.join("certs"))
                .arg("--token-auth-file")
                .arg(d.join("tokens.csv"))
                .args(["--authorization-mode", "AlwaysAllow"])
                // Launcher pods are privileged.
                .arg("--allow-privileged=true")
                .args(["--service-account-issuer", "https://kubernetes.default.svc"])
                .arg("--service-account-key-file")
                .arg(&key)
                .arg("--service-account-signing-key-file")
                .arg(&key)
                .args(["--service-cluster-ip-range", "10.0.0.0/24"])
                // No kubernetes Service endpoints: nothing here runs in a pod.
                .args(["--endpoint-reconciler-type", "none"])
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(d.join("kube-apiserver.log")).unwrap())
                .spawn()
                .expect("start kube-apiserver"),
        );
        let kubeconfig = d.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: t\n\
                 clusters: [{{name: t, cluster: {{server: 'https://127.0.0.1:{api_port}', insecure-skip-tls-verify: true}}}}]\n\
                 users: [{{name: t, user: {{token: {token}}}}}]\n\
                 contexts: [{{name: t, context: {{cluster: t, user: t}}}}]\n"
            ),
        )
        .unwrap();
        let kc = kube::config::Kubeconfig::read_from(&kubeconfig).unwrap();
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        let client = Client::try_from(cfg).unwrap();
        let api = Self {
            _apiserver: apiserver,
            _etcd: etcd,
            dir,
            client,
        };
        api.wait_ready().await;
        api.install(kinds).await;
        api
    }

    async fn wait_ready(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let req = http::Request::get("/readyz").body(Vec::new()).unwrap();
            if self.client.request_text(req).await.is_ok() {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "kube-apiserver not ready; see {}",
                self.dir.path().join("kube-apiserver.log").display()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The CRDs and the ServiceAccount pods are admitted with (no controller-manager
    /// creates `default` here).
    async fn install(&self, kinds: &[Kind]) {
        let crds = Api::<CustomResourceDefinition>::all(self.client.clone());
        for (plural, singular, kind, short) in kinds {
            let crd: CustomResourceDefinition = serde_json::from_value(json!({
                "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": format!("{plural}.kubevirt.io")},
                "spec": {"group": "kubevirt.io", "scope": "Namespaced",
                    "names": {"plural": plural, "singular": singular, "kind": kind,
                              "shortNames": [short]},
                    "versions": [{"name": "v1", "served": true, "storage": true,
                        "subresources": {"status": {}},
                        "schema": {"openAPIV3Schema": {"type": "object",
                            "x-kubernetes-preserve-unknown-fields": true}}}]}
            }))
            .unwrap();
            crds.create(&PostParams::default(), &crd).await.unwrap();
        }
        let sa: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap();
        eventually("the default ServiceAccount", || async {
            Api::<ServiceAccount>::namespaced(self.client.clone(), NS)
                .create(&PostParams::default(), &sa)
                .await
                .ok()
        })
        .await;
        for (plural, ..) in kinds {
            eventually(&format!("{plural} to be served"), || async {
                let path = format!("/apis/kubevirt.io/v1/namespaces/{NS}/{plural}");
                let req = http::Request::get(path).body(Vec::new()).unwrap();
                self.client.request_text(req).await.ok()
            })
            .await;
        }
    }
}

/// What the tests do through the API, and the scheduler's and kubelet's parts they play.
impl KubeApi {
    pub fn vmis(&self) -> Api<VirtualMachineInstance> {
        Api::namespaced(self.client.clone(), NS)
    }

    pub fn vms(&self) -> Api<VirtualMachine> {
        Api::namespaced(self.client.clone(), NS)
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NS)
    }

    pub async fn vmi_where(
        &self,
        name: &str,
        what: &str,
        f: impl Fn(&VirtualMachineInstance) -> bool,
    ) -> VirtualMachineInstance {
        eventually(what, || async {
            self.vmis().get_opt(name).await.unwrap().filter(|v| f(v))
        })
        .await
    }

    pub async fn phase(&self, name: &str, phase: Phase) -> VirtualMachineInstance {
        self.vmi_where(name, &format!("{name} in {phase:?}"), |v| {
            v.status.as_ref().is_some_and(|s| s.phase == phase)
        })
        .await
    }

    pub async fn launcher_pods(&self, vmi: &VirtualMachineInstance) -> Vec<Pod> {
        let sel = format!("kubevirt.io/created-by={}", vmi.uid().unwrap());
        self.pods()
            .list(&ListParams::default().labels(&sel))
            .await
            .unwrap()
            .items
    }

    pub async fn only_pod(&self, vmi: &VirtualMachineInstance) -> Pod {
        let pods = self.launcher_pods(vmi).await;
        assert_eq!(pods.len(), 1, "{pods:?}");
        pods.into_iter().next().unwrap()
    }

    /// The scheduler's part: bind the pod to a node.
    pub async fn bind(&self, pod: &str, node: &str) {
        let binding = json!({"apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": pod}, "target": {"kind": "Node", "name": node}});
        let _: Value = self
            .pods()
            .create_subresource("binding", pod, &PostParams::default(), &binding)
            .await
            .unwrap();
    }

    /// The kubelet's (or scheduler's) part: write pod status.
    pub async fn pod_status(&self, pod: &str, status: Value) {
        self.pods()
            .patch_status(
                pod,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "status": status })),
            )
            .await
            .unwrap();
    }

    pub async fn events_of(&self, name: &str) -> Vec<String> {
        Api::<Event>::namespaced(self.client.clone(), NS)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .filter_map(|e| e.reason)
            .collect()
    }
}

/// Polls `f` until it returns Some, for at most 30 s.
pub async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
