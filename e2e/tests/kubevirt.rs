//! kubevirt-rs on a real cluster: virt-apiserver deployed by `cargo xtask deploy`, registered as
//! an APIService, used through kube-apiserver with kubectl — discovery, OpenAPI, CRUD, RBAC
//! evaluated by both servers, the namespace controller and the garbage collector.
//!
//! Needs root and the packages of docs/local-cluster.md and docs/deploy.md. Uses the cluster named
//! by KUBECONFIG (images loaded with E2E_IMAGE_LOAD) or brings the local one up. Run with
//! `cargo test -p e2e -- --ignored`.

// The helpers below serve only these tests: a failure is a test failure.
#![allow(clippy::expect_used)]

use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use e2e::Cluster;

fn cluster() -> &'static Cluster {
    Cluster::with_kubevirt().expect("cluster with kubevirt-rs deployed")
}

/// A namespace of its own per test, deleted at the end (without waiting).
struct Ns<'a> {
    c: &'a Cluster,
    name: String,
}

impl<'a> Ns<'a> {
    fn new(c: &'a Cluster, prefix: &str) -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let name = format!("e2e-{prefix}-{}-{nanos:x}", std::process::id());
        c.kubectl(&["create", "namespace", &name])
            .expect("namespace");
        Ns { c, name }
    }
}

impl Drop for Ns<'_> {
    fn drop(&mut self) {
        let _ = self
            .c
            .kubectl(&["delete", "namespace", &self.name, "--wait=false"]);
    }
}

fn vm_manifest(name: &str, ns: &str) -> String {
    format!(
        r#"{{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine",
        "metadata":{{"name":"{name}","namespace":"{ns}","labels":{{"app":"e2e"}}}},
        "spec":{{"runStrategy":"Halted","template":{{"spec":{{"domain":{{
          "memory":{{"guest":"64Mi"}},"devices":{{}}}}}}}}}}}}"#
    )
}

fn create_vm(c: &Cluster, name: &str, ns: &str) {
    c.kubectl_stdin(&["create", "-f", "-"], Some(&vm_manifest(name, ns)))
        .expect("create VM");
}

const AVAILABLE: &str = r#"jsonpath={.status.conditions[?(@.type=="Available")].status}"#;

#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn apiservices_are_available() {
    let c = cluster();
    for api in ["v1.kubevirt.io", "v1.subresources.kubevirt.io"] {
        let status = c
            .kubectl(&["get", "apiservice", api, "-o", AVAILABLE])
            .expect("get apiservice");
        assert_eq!(status.trim(), "True", "{api}");
        // Served by our Service, not by kube-apiserver (a CRD would make it local).
        let svc = c
            .kubectl(&[
                "get",
                "apiservice",
                api,
                "-o",
                "jsonpath={.spec.service.namespace}/{.spec.service.name}",
            ])
            .expect("get apiservice");
        assert_eq!(svc, "kubevirt/kubevirt-apiserver", "{api}");
    }
}

#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn api_resources_list_our_kinds_with_short_names() {
    let c = cluster();
    let out = c
        .kubectl(&["api-resources", "--api-group=kubevirt.io", "--no-headers"])
        .expect("api-resources");
    for (name, short, kind) in [
        ("virtualmachines", "vm,vms", "VirtualMachine"),
        (
            "virtualmachineinstances",
            "vmi,vmis",
            "VirtualMachineInstance",
        ),
        (
            "virtualmachineinstancemigrations",
            "vmim,vmims",
            "VirtualMachineInstanceMigration",
        ),
    ] {
        let line = out
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|cols| cols.first() == Some(&name))
            .unwrap_or_else(|| panic!("{name} missing from:\n{out}"));
        assert_eq!(
            line,
            vec![name, short, "kubevirt.io/v1", "true", kind],
            "{out}"
        );
    }
}

#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn get_vms_all_namespaces_and_get_all_include_our_kinds() {
    let c = cluster();
    let ns = Ns::new(c, "getall");
    create_vm(c, "listed", &ns.name);
    let all_ns = c.kubectl(&["get", "vms", "-A"]).expect("get vms -A");
    assert!(
        all_ns
            .lines()
            .any(|l| l.starts_with(&ns.name) && l.contains("listed")),
        "{all_ns}"
    );
    // The "all" category: our resources advertise it, as KubeVirt's CRDs do.
    let all = c.kubectl(&["get", "all", "-n", &ns.name]).expect("get all");
    assert!(all.contains("virtualmachine.kubevirt.io/listed"), "{all}");
}

#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn explain_works_through_aggregated_openapi() {
    let c = cluster();
    // kube-apiserver merges our OpenAPI v3 after the APIService becomes Available: give it time.
    let mut out = String::new();
    c.eventually("kubectl explain vm.spec", Duration::from_secs(60), || {
        out = c.kubectl(&["explain", "vm.spec"])?;
        Ok(out.contains("runStrategy") && out.contains("template"))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{out}"));
    assert!(out.contains("VirtualMachine"), "{out}");
    let field = c
        .kubectl(&["explain", "vm.spec.runStrategy"])
        .expect("explain field");
    assert!(field.contains("FIELD: runStrategy"), "{field}");
}

#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn vm_create_get_delete_through_kube_apiserver() {
    let c = cluster();
    let ns = Ns::new(c, "crud");
    create_vm(c, "crud", &ns.name);
    let got = c
        .kubectl(&["-n", &ns.name, "get", "vm", "crud", "-o", "json"])
        .expect("get vm");
    let vm: serde_json::Value = serde_json::from_str(&got).expect("VM JSON");
    assert_eq!(vm["kind"], "VirtualMachine");
    assert_eq!(vm["spec"]["runStrategy"], "Halted");
    assert!(
        vm["metadata"]["uid"]
            .as_str()
            .is_some_and(|u| !u.is_empty())
    );
    // Table output comes from our server (columns AGE, STATUS, READY).
    let table = c.kubectl(&["-n", &ns.name, "get", "vms"]).expect("get vms");
    assert!(table.starts_with("NAME"), "{table}");
    c.kubectl(&["-n", &ns.name, "delete", "vm", "crud"])
        .expect("delete vm");
    let (ok, _, err) = c
        .kubectl_result(&["-n", &ns.name, "get", "vm", "crud"])
        .expect("kubectl");
    assert!(!ok && err.contains("NotFound"), "{err}");
}

#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn service_account_needs_kubevirt_edit_role() {
    let c = cluster();
    let ns = Ns::new(c, "rbac");
    let n = ns.name.as_str();
    c.kubectl(&["-n", n, "create", "serviceaccount", "alice"])
        .expect("service account");
    create_vm(c, "vm1", n);
    let who = format!("--as=system:serviceaccount:{n}:alice");
    let start_path =
        format!("/apis/subresources.kubevirt.io/v1/namespaces/{n}/virtualmachines/vm1/start");
    let start = |c: &Cluster| {
        c.kubectl_stdin_result(&[&who, "replace", "--raw", &start_path, "-f", "-"], "{}")
    };

    let (ok, _, err) = c
        .kubectl_result(&[&who, "-n", n, "get", "vms"])
        .expect("kubectl");
    assert!(
        !ok && err.contains("Forbidden"),
        "get vms without RBAC: {err}"
    );
    let (ok, _, err) = start(c).expect("kubectl");
    assert!(
        !ok && err.contains("Forbidden"),
        "start without RBAC: {err}"
    );

    c.kubectl(&[
        "-n",
        n,
        "create",
        "rolebinding",
        "alice-edit",
        "--clusterrole=kubevirt.io:edit",
        &format!("--serviceaccount={n}:alice"),
    ])
    .expect("rolebinding");
    // RBAC reaches kube-apiserver's authorizer through an informer: eventually.
    c.eventually(
        "get vms with kubevirt.io:edit",
        Duration::from_secs(30),
        || {
            Ok(c.kubectl(&[&who, "-n", n, "get", "vms", "-o", "name"])?
                .contains("virtualmachine.kubevirt.io/vm1"))
        },
    )
    .expect("allowed with kubevirt.io:edit");
    c.eventually(
        "start with kubevirt.io:edit",
        Duration::from_secs(30),
        || {
            let (ok, out, err) = start(c)?;
            if !ok {
                anyhow::bail!("{out}{err}");
            }
            Ok(true)
        },
    )
    .expect("start allowed with kubevirt.io:edit");
    // Still nothing outside the namespace of the RoleBinding.
    let (ok, _, err) = c
        .kubectl_result(&[&who, "get", "vms", "-A"])
        .expect("kubectl");
    assert!(!ok && err.contains("Forbidden"), "{err}");
}

/// The pod IP of virt-apiserver (on our bridge for the local cluster).
fn apiserver_pod_ip(c: &Cluster) -> String {
    c.component_pods("kubevirt-apiserver", true, "{.items[0].status.podIP}")
        .expect("virt-apiserver pod IP")
}

fn curl_status(args: &[&str]) -> String {
    let out = Command::new("curl")
        .args([
            "-sk",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "5",
        ])
        .args(args)
        .output()
        .expect("curl (apt-get install curl)");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn direct_request_with_spoofed_identity_is_unauthorized() {
    let c = cluster();
    // Pod IPs of other clusters (kind) are not reachable from the host in general: on
    // those this test fails rather than passing having sent nothing.
    let pki = c.local_pki().expect(
        "needs the local cluster (pod network reachable from the host, its PKI): \
         KUBECONFIG=target/cluster/kubeconfig",
    );
    let ip = apiserver_pod_ip(c);
    let url = format!("https://{ip}:8443/apis/kubevirt.io/v1/namespaces/default/virtualmachines");
    let spoof = [
        "-H",
        "X-Remote-User: system:admin",
        "-H",
        "X-Remote-Group: system:masters",
    ];
    let mut args = spoof.to_vec();
    args.push(&url);
    assert_eq!(curl_status(&args), "401", "no client certificate");

    // A client certificate of the cluster CA (admin, system:masters) is a client-CA user, whose
    // X-Remote-* headers must not count either: authorised as itself, not as the spoofed user.
    let other_cert = pki.join("admin.crt").to_string_lossy().into_owned();
    let other_key = pki.join("admin.key").to_string_lossy().into_owned();
    let mut args = spoof.to_vec();
    args.extend(["--cert", &other_cert, "--key", &other_key, &url]);
    assert_eq!(curl_status(&args), "200", "client-CA user admin");
    let mut args = vec![
        "-H",
        "X-Remote-User: system:anonymous",
        "--cert",
        &other_cert,
        "--key",
        &other_key,
    ];
    args.push(&url);
    assert_eq!(
        curl_status(&args),
        "200",
        "headers ignored for a client-CA user"
    );

    // Control: the real front-proxy certificate with the same headers is trusted.
    let cert = pki
        .join("front-proxy-client.crt")
        .to_string_lossy()
        .into_owned();
    let key = pki
        .join("front-proxy-client.key")
        .to_string_lossy()
        .into_owned();
    let mut args = spoof.to_vec();
    args.extend(["--cert", &cert, "--key", &key, &url]);
    assert_eq!(curl_status(&args), "200", "front-proxy certificate");
    // Health needs no credentials (kubelet probes).
    assert_eq!(curl_status(&[&format!("https://{ip}:8443/readyz")]), "200");
}

#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn deleting_a_namespace_deletes_its_vms() {
    let c = cluster();
    let ns = Ns::new(c, "nsdel");
    create_vm(c, "doomed", &ns.name);
    c.kubectl(&["delete", "namespace", &ns.name, "--wait=false"])
        .expect("delete namespace");
    c.eventually("namespace gone", Duration::from_secs(120), || {
        Ok(
            c.kubectl(&["get", "namespace", &ns.name, "--ignore-not-found"])?
                .trim()
                .is_empty(),
        )
    })
    .unwrap_or_else(|e| {
        let status = c
            .kubectl(&["get", "namespace", &ns.name, "-o", "jsonpath={.status}"])
            .unwrap_or_default();
        panic!("{e:#}\n{status}")
    });
    let left = c
        .kubectl(&["get", "vms", "-A", "--no-headers"])
        .expect("get vms");
    assert!(!left.contains(&ns.name), "{left}");
}

#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn object_owned_by_a_vm_is_garbage_collected() {
    let c = cluster();
    let ns = Ns::new(c, "gc");
    let n = ns.name.as_str();
    create_vm(c, "owner", n);
    let uid = c
        .kubectl(&[
            "-n",
            n,
            "get",
            "vm",
            "owner",
            "-o",
            "jsonpath={.metadata.uid}",
        ])
        .expect("VM uid");
    let cm = format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"owned","namespace":"{n}",
        "ownerReferences":[{{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachine",
        "name":"owner","uid":"{uid}"}}]}},"data":{{"k":"v"}}}}"#
    );
    c.kubectl_stdin(&["create", "-f", "-"], Some(&cm))
        .expect("owned ConfigMap");
    c.kubectl(&["-n", n, "delete", "vm", "owner"])
        .expect("delete VM");
    // The garbage collector finds the owner gone through our API (GET → 404).
    c.eventually(
        "owned ConfigMap collected",
        Duration::from_secs(120),
        || {
            Ok(
                c.kubectl(&["-n", n, "get", "configmap", "owned", "--ignore-not-found"])?
                    .trim()
                    .is_empty(),
            )
        },
    )
    .expect("garbage collection");
}

#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e -- --ignored"]
fn default_view_role_includes_kubevirt_read_only() {
    let c = cluster();
    let ns = Ns::new(c, "view");
    let n = ns.name.as_str();
    c.kubectl(&["-n", n, "create", "serviceaccount", "bob"])
        .expect("service account");
    create_vm(c, "seen", n);
    // The built-in `view` role, not ours: kubevirt.io:view is aggregated into it by label.
    c.kubectl(&[
        "-n",
        n,
        "create",
        "rolebinding",
        "bob-view",
        "--clusterrole=view",
        &format!("--serviceaccount={n}:bob"),
    ])
    .expect("rolebinding");
    let who = format!("--as=system:serviceaccount:{n}:bob");
    c.eventually("get vms with view", Duration::from_secs(30), || {
        Ok(
            c.kubectl(&[&who, "-n", n, "get", "vm", "seen", "-o", "name"])?
                .contains("virtualmachine.kubevirt.io/seen"),
        )
    })
    .expect("view reads VMs");
    let (ok, _, err) = c
        .kubectl_result(&[&who, "-n", n, "delete", "vm", "seen"])
        .expect("kubectl");
    assert!(
        !ok && err.contains("Forbidden"),
        "view must not delete: {err}"
    );
}
