//! virt-operator end to end: install from manifests/ plus one KubeVirt resource, upgrade to
//! another version while a VM runs and `kubectl get vm` loops, uninstall by deleting the
//! KubeVirt resource and the operator manifests.
//!
//! Replaces whatever `cargo xtask deploy` left in namespace kubevirt (objects of another field
//! manager would survive the operator's server-side apply) and deploys with `cargo xtask
//! deploy` again at the end, so the other e2e tests find the cluster as they expect. Run with
//! `cargo test -p e2e --test operator -- --ignored --test-threads=1` under the cluster lock.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use e2e::Cluster;

const INSTALL: &str = "manifests/virt-operator.yaml";
const CR: &str = "manifests/kubevirt-cr.yaml";
const UPGRADE_TAG: &str = "e2e-upgrade";
const PART_OF: &str = "app.kubernetes.io/part-of=kubevirt-rs";
/// Image copy, a cold QEMU capabilities probe, TCG boot on a machine shared with builds.
const BOOT: Duration = Duration::from_secs(240);
const GONE: Duration = Duration::from_secs(120);

/// The test guest VM (kernelBoot from the test-guest image, TCG).
fn vm_manifest(name: &str, ns: &str) -> String {
    serde_json::json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "runStrategy": "Always",
            "template": {"spec": {
                "terminationGracePeriodSeconds": 5,
                "domain": {
                    "memory": {"guest": "128Mi"},
                    "devices": {},
                    "firmware": {"kernelBoot": {
                        "kernelArgs": virt_testguest::KERNEL_ARGS,
                        "container": {
                            "image": "localhost/kubevirt-rs/test-guest:latest",
                            "imagePullPolicy": "IfNotPresent",
                            "kernelPath": "/vmlinuz",
                            "initrdPath": "/initramfs.gz"
                        }
                    }}
                }
            }}
        }
    })
    .to_string()
}

/// A namespace of the test's own, deleted (without waiting) at the end.
struct Ns<'a> {
    c: &'a Cluster,
    name: String,
}

impl<'a> Ns<'a> {
    fn new(c: &'a Cluster) -> Self {
        let name = format!("e2e-operator-{}", std::process::id());
        c.kubectl(&["create", "namespace", &name])
            .expect("namespace");
        Ns { c, name }
    }

    fn k(&self, args: &[&str]) -> anyhow::Result<String> {
        let mut a = vec!["-n", self.name.as_str()];
        a.extend_from_slice(args);
        self.c.kubectl(&a)
    }

    fn vmi(&self, vm: &str, jsonpath: &str) -> String {
        self.k(&[
            "get",
            "vmi",
            vm,
            "--ignore-not-found",
            "-o",
            &format!("jsonpath={jsonpath}"),
        ])
        .unwrap_or_default()
    }

    fn vmi_phase(&self, vm: &str) -> String {
        self.vmi(vm, "{.status.phase}")
    }

    fn vmi_uid(&self, vm: &str) -> String {
        self.vmi(vm, "{.metadata.uid}")
    }
}

impl Drop for Ns<'_> {
    fn drop(&mut self) {
        let _ = self
            .c
            .kubectl(&["delete", "namespace", &self.name, "--wait=false"]);
    }
}

fn path(rel: &str) -> String {
    e2e::workspace_root()
        .join(rel)
        .to_string_lossy()
        .into_owned()
}

fn kv_field(c: &Cluster, jsonpath: &str) -> String {
    c.kubectl(&[
        "-n",
        "kubevirt",
        "get",
        "kubevirt",
        "kubevirt",
        "-o",
        &format!("jsonpath={jsonpath}"),
    ])
    .unwrap_or_default()
}

fn kv_available(c: &Cluster) -> bool {
    kv_field(c, r#"{.status.conditions[?(@.type=="Available")].status}"#) == "True"
}

fn operator_diagnosis(c: &Cluster) -> String {
    let mut out = String::new();
    for args in [
        vec![
            "-n",
            "kubevirt",
            "get",
            "kubevirt,pods,deploy,ds,sts",
            "-o",
            "wide",
        ],
        vec![
            "-n", "kubevirt", "get", "kubevirt", "kubevirt", "-o", "yaml",
        ],
        vec![
            "-n",
            "kubevirt",
            "logs",
            "deployment/virt-operator",
            "--tail=30",
        ],
        vec!["get", "apiservice", "v1.kubevirt.io", "-o", "yaml"],
    ] {
        match c.kubectl(&args) {
            Ok(s) => out.push_str(&s),
            Err(e) => out.push_str(&format!("{e:#}\n")),
        }
    }
    out
}

/// No KubeVirt resource with a finalizer nobody will remove, no operator, no operand: what an
/// earlier run or `cargo xtask deploy` left.
fn clean_slate(c: &Cluster) {
    // The operator first: a running one would put its finalizer back.
    let _ = c.kubectl(&[
        "-n",
        "kubevirt",
        "delete",
        "deployment",
        "virt-operator",
        "--ignore-not-found",
        "--wait=true",
        "--timeout=60s",
    ]);
    let _ = c.kubectl(&[
        "-n",
        "kubevirt",
        "wait",
        "--for=delete",
        "pod",
        "-l",
        "app.kubernetes.io/name=virt-operator",
        "--timeout=60s",
    ]);
    let _ = c.kubectl(&[
        "-n",
        "kubevirt",
        "patch",
        "kubevirt",
        "kubevirt",
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":[]}}"#,
    ]);
    // APIServices before the namespace: one pointing at a deleted Service fails discovery,
    // and the namespace controller does not finish a deletion while discovery fails.
    let _ = c.kubectl(&[
        "delete",
        "apiservice",
        "v1.kubevirt.io",
        "v1.subresources.kubevirt.io",
        "--ignore-not-found",
    ]);
    let _ = c.kubectl(&[
        "delete",
        "-f",
        &path(INSTALL),
        "--ignore-not-found",
        "--wait=false",
    ]);
    let _ = c.kubectl(&[
        "delete",
        "namespace",
        "kubevirt",
        "--ignore-not-found",
        "--wait=true",
        "--timeout=180s",
    ]);
    for kind in ["clusterrolebinding", "clusterrole"] {
        let _ = c.kubectl(&["delete", kind, "-l", PART_OF, "--ignore-not-found"]);
    }
    let _ = c.kubectl(&[
        "-n",
        "kube-system",
        "delete",
        "rolebinding,role",
        "-l",
        PART_OF,
        "--ignore-not-found",
    ]);
}

/// Puts `cargo xtask deploy`'s deployment back whatever happened.
struct Restore<'a>(&'a Cluster);

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        clean_slate(self.0);
        let kc = self.0.kubeconfig.to_string_lossy().into_owned();
        if let Err(e) = e2e::xtask(&["deploy", "--kubeconfig", &kc]) {
            eprintln!("restoring cargo xtask deploy failed: {e:#}");
        }
    }
}

fn leftovers(c: &Cluster) -> Vec<String> {
    let mut left = Vec::new();
    for name in ["v1.kubevirt.io", "v1.subresources.kubevirt.io"] {
        let found = c
            .kubectl(&[
                "get",
                "apiservice",
                name,
                "--ignore-not-found",
                "-o",
                "name",
            ])
            .unwrap_or_default();
        if !found.trim().is_empty() {
            left.push(format!("apiservice/{name}"));
        }
    }
    for (ns, kind) in [
        (None, "clusterrole"),
        (None, "clusterrolebinding"),
        (Some("kube-system"), "rolebinding"),
        (Some("kube-system"), "role"),
    ] {
        let mut args = vec![];
        if let Some(ns) = ns {
            args.extend(["-n", ns]);
        }
        args.extend(["get", kind, "-l", PART_OF, "-o", "name"]);
        let out = c.kubectl(&args).unwrap_or_default();
        left.extend(out.lines().map(str::to_string));
    }
    let ns = c
        .kubectl(&[
            "get",
            "namespace",
            "kubevirt",
            "--ignore-not-found",
            "-o",
            "name",
        ])
        .unwrap_or_default();
    left.extend(ns.lines().map(str::to_string));
    let pods = c
        .kubectl(&["get", "pods", "-A", "-l", PART_OF, "-o", "name"])
        .unwrap_or_default();
    left.extend(pods.lines().map(str::to_string));
    let crd = c
        .kubectl(&[
            "get",
            "crd",
            "kubevirts.kubevirt.io",
            "--ignore-not-found",
            "-o",
            "name",
        ])
        .unwrap_or_default();
    left.extend(crd.lines().map(str::to_string));
    left
}

#[test]
#[ignore = "needs root and a cluster: cargo test -p e2e --test operator -- --ignored"]
fn install_upgrade_uninstall_through_one_kubevirt_resource() {
    let c = Cluster::get().expect("cluster");
    // The images, named as the operator deploys them: :latest, and another tag to upgrade to.
    e2e::xtask(&["images", "--tag", UPGRADE_TAG]).expect("cargo xtask images");
    let _restore = Restore(c);
    clean_slate(c);

    // Install: the operator manifests, then one KubeVirt resource.
    let t0 = Instant::now();
    c.kubectl(&["apply", "--server-side", "-f", &path(INSTALL)])
        .expect("apply operator");
    c.kubectl(&[
        "wait",
        "--for=condition=Established",
        "crd/kubevirts.kubevirt.io",
        "--timeout=60s",
    ])
    .expect("CRD established");
    c.kubectl(&["apply", "-f", &path(CR)])
        .expect("apply KubeVirt");
    if let Err(e) = c.eventually("KubeVirt Available", Duration::from_secs(180), || {
        Ok(kv_available(c) && kv_field(c, "{.status.phase}") == "Deployed")
    }) {
        panic!("{e:#}\n{}", operator_diagnosis(c));
    }
    let installed = t0.elapsed();
    let version = kv_field(c, "{.status.observedKubeVirtVersion}");
    println!(
        "installed: KubeVirt Available after {:.1} s (version {version})",
        installed.as_secs_f64()
    );
    c.kubectl(&["get", "vms", "-A"])
        .expect("kubectl get vms through kube-apiserver");
    for name in ["v1.kubevirt.io", "v1.subresources.kubevirt.io"] {
        let ca = c
            .kubectl(&["get", "apiservice", name, "-o", "jsonpath={.spec.caBundle}"])
            .unwrap();
        assert!(!ca.is_empty(), "{name} without caBundle");
    }
    let etcd_mode = c
        .kubectl(&[
            "-n",
            "kubevirt",
            "get",
            "statefulset",
            "kubevirt-etcd",
            "-o",
            "jsonpath={.spec.replicas}",
        ])
        .unwrap();
    assert_eq!(etcd_mode, "1");

    // A VM to keep running through the upgrade.
    let ns = Ns::new(c);
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&vm_manifest("survivor", &ns.name)),
    )
    .expect("apply VM");
    if let Err(e) = c.eventually("VMI Running", BOOT, || {
        Ok(ns.vmi_phase("survivor") == "Running")
    }) {
        panic!(
            "{e:#}\n{}",
            ns.k(&["get", "vm,vmi,pods", "-o", "wide"])
                .unwrap_or_default()
        );
    }
    let uid = ns.vmi_uid("survivor");

    // Upgrade while `kubectl get vm` loops: not one request may fail.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let errors = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let looper = {
        let (stop, ok, failed, errors) = (stop.clone(), ok.clone(), failed.clone(), errors.clone());
        let kubeconfig = c.kubeconfig.clone();
        let kubectl = e2e::kubectl_binary();
        let ns = ns.name.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let out = std::process::Command::new(&kubectl)
                    .arg("--kubeconfig")
                    .arg(&kubeconfig)
                    .args([
                        "-n",
                        &ns,
                        "get",
                        "vm",
                        "survivor",
                        "-o",
                        "name",
                        "--request-timeout=10s",
                    ])
                    .output();
                match out {
                    Ok(o) if o.status.success() => {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(o) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        errors
                            .lock()
                            .unwrap()
                            .push(String::from_utf8_lossy(&o.stderr).into_owned());
                    }
                    Err(e) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        errors.lock().unwrap().push(e.to_string());
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let t1 = Instant::now();
    c.kubectl(&[
        "-n",
        "kubevirt",
        "patch",
        "kubevirt",
        "kubevirt",
        "--type=merge",
        "-p",
        &format!(r#"{{"spec":{{"imageTag":"{UPGRADE_TAG}"}}}}"#),
    ])
    .expect("patch imageTag");
    let upgraded = c.eventually("upgrade deployed", Duration::from_secs(300), || {
        Ok(
            kv_field(c, "{.status.observedKubeVirtVersion}") == UPGRADE_TAG
                && kv_field(c, "{.status.phase}") == "Deployed",
        )
    });
    // A few more requests against the new pods.
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    looper.join().unwrap();
    if let Err(e) = upgraded {
        panic!("{e:#}\n{}", operator_diagnosis(c));
    }
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    println!(
        "upgraded to {UPGRADE_TAG} in {:.1} s; kubectl get vm during the upgrade: {ok} ok, {failed} failed",
        t1.elapsed().as_secs_f64()
    );
    assert_eq!(
        failed,
        0,
        "failed requests during the upgrade: {:?}",
        errors.lock().unwrap()
    );
    assert!(ok > 10, "the loop hardly ran: {ok}");
    let image = c
        .kubectl(&[
            "-n",
            "kubevirt",
            "get",
            "deployment",
            "kubevirt-apiserver",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}",
        ])
        .unwrap();
    assert!(image.ends_with(&format!(":{UPGRADE_TAG}")), "{image}");
    assert_eq!(ns.vmi_phase("survivor"), "Running");
    assert_eq!(
        ns.vmi_uid("survivor"),
        uid,
        "the VM was restarted by the upgrade"
    );

    // Uninstall is refused while a VM exists (BlockUninstallIfWorkloadsExist)...
    c.kubectl(&[
        "-n",
        "kubevirt",
        "delete",
        "kubevirt",
        "kubevirt",
        "--wait=false",
    ])
    .expect("delete KubeVirt");
    c.eventually("phase Deleting", Duration::from_secs(30), || {
        Ok(kv_field(c, "{.status.phase}") == "Deleting")
    })
    .expect("Deleting");
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        c.kubectl(&["get", "apiservice", "v1.kubevirt.io", "-o", "name"])
            .is_ok(),
        "uninstalled although a VM exists"
    );
    // ...and proceeds once the VM is gone.
    ns.k(&["delete", "vm", "survivor", "--wait=true", "--timeout=120s"])
        .expect("delete VM");
    c.eventually("VMI gone", GONE, || Ok(ns.vmi_uid("survivor").is_empty()))
        .expect("VMI gone");
    let t2 = Instant::now();
    if let Err(e) = c.eventually("KubeVirt gone", Duration::from_secs(120), || {
        Ok(kv_field(c, "{.metadata.name}").is_empty())
    }) {
        panic!("{e:#}\n{}", operator_diagnosis(c));
    }
    c.kubectl(&[
        "delete",
        "-f",
        &path(INSTALL),
        "--wait=true",
        "--timeout=180s",
    ])
    .expect("delete operator");
    drop(ns);
    let mut left = Vec::new();
    let gone = c.eventually("nothing left", Duration::from_secs(120), || {
        left = leftovers(c);
        Ok(left.is_empty())
    });
    assert!(gone.is_ok(), "left after uninstall: {left:?}");
    println!("uninstalled in {:.1} s", t2.elapsed().as_secs_f64());
}
