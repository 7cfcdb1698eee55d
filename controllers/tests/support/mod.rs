//! A real kube-apiserver and etcd for the controllers' integration tests.
//!
//! Pods need the real kube-apiserver (its pod validation, graceful deletion of bound
//! pods, the binding and eviction subresources, events.k8s.io). Each test starts its own
//! etcd and kube-apiserver (static token, AlwaysAllow) and serves our kinds from CRDs
//! with a /status subresource: the same CRD semantics virt-apiserver implements, without
//! the aggregation setup.
//!
//! kube-apiserver and etcd: [`kube_testenv`].

#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

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

/// VirtualMachineInstanceReplicaSet.
pub const VMIRS: Kind = (
    "virtualmachineinstancereplicasets",
    "virtualmachineinstancereplicaset",
    "VirtualMachineInstanceReplicaSet",
    "vmirs",
);

/// kube-apiserver and its etcd ([`kube_testenv::KubeApi`]) serving our kinds from CRDs.
pub struct KubeApi {
    env: kube_testenv::KubeApi,
    /// An admin client.
    pub client: Client,
}

impl KubeApi {
    /// Starts etcd and kube-apiserver, installs a CRD per kind and the `default`
    /// ServiceAccount, and waits until every kind is served.
    pub async fn start(token: &str, kinds: &[Kind]) -> Self {
        let env = kube_testenv::KubeApi::start(token).await;
        let api = Self {
            client: env.client.clone(),
            env,
        };
        api.install(kinds).await;
        api
    }

    /// Logs (`kube-apiserver.log`, `etcd.log`).
    pub fn dir(&self) -> &std::path::Path {
        self.env.dir.path()
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

/// The four `instancetype.kubevirt.io/v1beta1` kinds, served from CRDs (virt-apiserver
/// serves them in a cluster): plural, singular, kind, namespaced.
pub const INSTANCETYPE_KINDS: [(&str, &str, &str, bool); 4] = [
    (
        "virtualmachineinstancetypes",
        "virtualmachineinstancetype",
        "VirtualMachineInstancetype",
        true,
    ),
    (
        "virtualmachineclusterinstancetypes",
        "virtualmachineclusterinstancetype",
        "VirtualMachineClusterInstancetype",
        false,
    ),
    (
        "virtualmachinepreferences",
        "virtualmachinepreference",
        "VirtualMachinePreference",
        true,
    ),
    (
        "virtualmachineclusterpreferences",
        "virtualmachineclusterpreference",
        "VirtualMachineClusterPreference",
        false,
    ),
];

impl KubeApi {
    /// Serves the instance type kinds from CRDs too.
    pub async fn install_instancetype_kinds(&self) {
        let crds = Api::<CustomResourceDefinition>::all(self.client.clone());
        for (plural, singular, kind, namespaced) in INSTANCETYPE_KINDS {
            let crd: CustomResourceDefinition = serde_json::from_value(json!({
                "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": format!("{plural}.instancetype.kubevirt.io")},
                "spec": {"group": "instancetype.kubevirt.io",
                    "scope": if namespaced { "Namespaced" } else { "Cluster" },
                    "names": {"plural": plural, "singular": singular, "kind": kind},
                    "versions": [{"name": "v1beta1", "served": true, "storage": true,
                        "schema": {"openAPIV3Schema": {"type": "object",
                            "x-kubernetes-preserve-unknown-fields": true}}}]}
            }))
            .unwrap();
            crds.create(&PostParams::default(), &crd).await.unwrap();
        }
        for (plural, ..) in INSTANCETYPE_KINDS {
            eventually(&format!("{plural} to be served"), || async {
                let path = format!("/apis/instancetype.kubevirt.io/v1beta1/{plural}");
                let req = http::Request::get(path).body(Vec::new()).unwrap();
                self.client.request_text(req).await.ok()
            })
            .await;
        }
    }
}

impl KubeApi {
    /// Serves CDI's DataVolumes from a CRD with a /status subresource (virt-apiserver
    /// serves them in a cluster).
    pub async fn install_datavolumes(&self) {
        let crds = Api::<CustomResourceDefinition>::all(self.client.clone());
        let crd: CustomResourceDefinition = serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "datavolumes.cdi.kubevirt.io"},
            "spec": {"group": "cdi.kubevirt.io", "scope": "Namespaced",
                "names": {"plural": "datavolumes", "singular": "datavolume",
                          "kind": "DataVolume", "shortNames": ["dv"]},
                "versions": [{"name": "v1beta1", "served": true, "storage": true,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": {"type": "object",
                        "x-kubernetes-preserve-unknown-fields": true}}}]}
        }))
        .unwrap();
        crds.create(&PostParams::default(), &crd).await.unwrap();
        eventually("datavolumes to be served", || async {
            let path = format!("/apis/cdi.kubevirt.io/v1beta1/namespaces/{NS}/datavolumes");
            let req = http::Request::get(path).body(Vec::new()).unwrap();
            self.client.request_text(req).await.ok()
        })
        .await;
    }
}

impl KubeApi {
    /// Serves VirtualMachinePools (`pool.kubevirt.io/v1beta1`) from a CRD with a /status
    /// subresource (virt-apiserver serves them in a cluster).
    pub async fn install_pools(&self) {
        let crds = Api::<CustomResourceDefinition>::all(self.client.clone());
        let crd: CustomResourceDefinition = serde_json::from_value(json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "virtualmachinepools.pool.kubevirt.io"},
            "spec": {"group": "pool.kubevirt.io", "scope": "Namespaced",
                "names": {"plural": "virtualmachinepools", "singular": "virtualmachinepool",
                          "kind": "VirtualMachinePool", "shortNames": ["vmpool"]},
                "versions": [{"name": "v1beta1", "served": true, "storage": true,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": {"type": "object",
                        "x-kubernetes-preserve-unknown-fields": true}}}]}
        }))
        .unwrap();
        crds.create(&PostParams::default(), &crd).await.unwrap();
        eventually("virtualmachinepools to be served", || async {
            let path =
                format!("/apis/pool.kubevirt.io/v1beta1/namespaces/{NS}/virtualmachinepools");
            let req = http::Request::get(path).body(Vec::new()).unwrap();
            self.client.request_text(req).await.ok()
        })
        .await;
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
pub async fn eventually<T, F, Fut>(what: &str, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    kube_testenv::eventually(what, Duration::from_secs(30), f).await
}
