//! CDI's DataVolumes as a KubeVirt user writes them (issue 41): a DataVolume importing a disk
//! image over HTTP fills a claim (`kubectl get dv` shows its phase and progress), a VM with
//! `spec.dataVolumeTemplates` creates its DataVolume, waits for the import and boots with the
//! imported disk, an import from a URL that answers 404 says so on the DataVolume and on the
//! VM (no launcher pod is made for a disk that is not there), and deleting the VM deletes its
//! DataVolume and claim. A DataVolume cloning the imported one (`source.pvc`, same
//! namespace) gets a copy of its disk, and a VM whose template clones it boots from the copy.
//!
//! The images come from an HTTP server this test runs on the node's bridge address (pods reach
//! the node there; nothing listens beyond it), made with the host's `qemu-img` from a raw disk
//! with a marker the guest reads back.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::{Console, Ns};

/// The node's address on the pod bridge (`cargo xtask cluster up`).
const NODE_IP: &str = "10.213.0.1";
/// Where the marker sits in the image: sector 2048 (1 MiB).
const MARKER_SECTOR: u64 = 2048;
const MARKER: &str = "kubevirt-rs-imported-42";
/// An import, once the importer pod runs, takes seconds; scheduling and the pod's start
/// under a loaded run take longer.
const IMPORT: Duration = Duration::from_secs(300);

/// Files served over HTTP (axum, on a runtime of its own), 404 for anything else; counts
/// requests.
struct Server {
    port: u16,
    requests: Arc<AtomicUsize>,
}

impl Server {
    fn start(files: Vec<(&'static str, PathBuf)>) -> Server {
        let listener =
            std::net::TcpListener::bind((NODE_IP, 0)).expect("bind on the node's bridge address");
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(AtomicUsize::new(0));
        let count = requests.clone();
        let files: Arc<HashMap<String, Vec<u8>>> = Arc::new(
            files
                .into_iter()
                .map(|(name, path)| (name.to_string(), std::fs::read(path).unwrap()))
                .collect(),
        );
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let app = axum::Router::new().route(
                    "/{name}",
                    axum::routing::get(
                        move |axum::extract::Path(name): axum::extract::Path<String>| {
                            count.fetch_add(1, Ordering::Relaxed);
                            let body = files.get(&name).cloned();
                            async move {
                                match body {
                                    Some(b) => (axum::http::StatusCode::OK, b),
                                    None => {
                                        (axum::http::StatusCode::NOT_FOUND, b"not found".to_vec())
                                    }
                                }
                            }
                        },
                    ),
                );
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                axum::serve(listener, app).await.unwrap();
            });
        });
        Server { port, requests }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{NODE_IP}:{}/{path}", self.port)
    }
}

/// An 8 MiB raw disk with [`MARKER`] at [`MARKER_SECTOR`], and the same as qcow2.
fn images(dir: &Path) -> (PathBuf, PathBuf) {
    let raw = dir.join("disk.raw");
    let mut data = vec![0u8; 8 << 20];
    let at = usize::try_from(MARKER_SECTOR * 512).unwrap();
    data[at..at + MARKER.len()].copy_from_slice(MARKER.as_bytes());
    std::fs::write(&raw, &data).unwrap();
    let qcow2 = dir.join("disk.qcow2");
    let ok = Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "qcow2"])
        .arg(&raw)
        .arg(&qcow2)
        .status()
        .expect("qemu-img (cargo xtask deps installs it)");
    assert!(ok.success(), "qemu-img convert");
    (raw, qcow2)
}

fn dv_field(ns: &Ns<'_>, name: &str, jsonpath: &str) -> String {
    ns.k(&["get", "dv", name, "-o", &format!("jsonpath={jsonpath}")])
        .unwrap_or_default()
}

fn dv_diagnosis(ns: &Ns<'_>, name: &str) -> String {
    let dv = ns.k(&["get", "dv", name, "-o", "yaml"]).unwrap_or_default();
    let pods = ns.k(&["get", "pods", "-o", "wide"]).unwrap_or_default();
    let events = ns
        .k(&["get", "events", "--sort-by=.lastTimestamp"])
        .unwrap_or_default();
    format!("DataVolume:\n{dv}\npods:\n{pods}\nevents:\n{events}")
}

fn wait_dv_phase(ns: &Ns<'_>, name: &str, phase: &str) {
    if let Err(e) =
        ns.c.eventually(&format!("DataVolume {name} {phase}"), IMPORT, || {
            Ok(dv_field(ns, name, "{.status.phase}") == phase)
        })
    {
        panic!("{e:#}\n{}", dv_diagnosis(ns, name));
    }
}

fn data_volume(name: &str, url: &str, size: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataVolume",
        "metadata": {"name": name},
        "spec": {
            "source": {"http": {"url": url}},
            "storage": {"resources": {"requests": {"storage": size}}}
        }
    })
}

/// A DataVolume copying claim `source` of its own namespace (CDI's `pvc` source), its size
/// the source's.
fn clone_volume(name: &str, source: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataVolume",
        "metadata": {"name": name},
        "spec": {"source": {"pvc": {"name": source}}, "storage": {}}
    })
}

/// The test guest (kernel boot) with one disk, `data`, from the DataVolume template `dv`
/// importing `url`: as KubeVirt's docs write a VM with dataVolumeTemplates.
fn vm_with_template(ns: &str, name: &str, dv: &str, url: &str) -> String {
    vm_with_data_volume(ns, name, dv, &data_volume(dv, url, "64Mi")["spec"])
}

/// The test guest with one disk, `data`, from the DataVolume template `dv` of spec `spec`.
fn vm_with_data_volume(ns: &str, name: &str, dv: &str, spec: &serde_json::Value) -> String {
    let mut vm: serde_json::Value = serde_json::from_str(&common::vm_manifest(
        name,
        ns,
        "Always",
        &common::Guest::default(),
    ))
    .unwrap();
    vm["spec"]["dataVolumeTemplates"] = serde_json::json!([{
        "metadata": {"name": dv},
        "spec": spec,
    }]);
    let spec = &mut vm["spec"]["template"]["spec"];
    spec["domain"]["devices"]["disks"] =
        serde_json::json!([{"name": "data", "disk": {"bus": "virtio"}}]);
    spec["volumes"] = serde_json::json!([{"name": "data", "dataVolume": {"name": dv}}]);
    vm.to_string()
}

#[test]
#[ignore = "needs a local cluster: cargo xtask cluster up"]
fn http_imports_fill_claims_and_a_vm_boots_from_its_data_volume_template() {
    let c = common::cluster();
    let dir = tempfile::tempdir().unwrap();
    let (raw, qcow2) = images(dir.path());
    let server = Server::start(vec![("disk.raw", raw), ("disk.qcow2", qcow2)]);
    let ns = Ns::new(c, "dv");

    // The API as `kubectl` shows it.
    let resources = c
        .kubectl(&["api-resources", "--api-group=cdi.kubevirt.io", "-o", "name"])
        .unwrap();
    assert!(
        resources
            .lines()
            .any(|l| l == "datavolumes.cdi.kubevirt.io"),
        "{resources}"
    );

    // A standalone DataVolume: qcow2 over HTTP into a claim of the default class.
    c.kubectl_stdin(
        &["-n", &ns.name, "create", "-f", "-"],
        Some(&data_volume("plain", &server.url("disk.qcow2"), "64Mi").to_string()),
    )
    .expect("create the DataVolume");
    wait_dv_phase(&ns, "plain", "Succeeded");
    assert_eq!(dv_field(&ns, "plain", "{.status.progress}"), "100.0%");
    assert_eq!(
        dv_field(
            &ns,
            "plain",
            r#"{.status.conditions[?(@.type=="Ready")].status}"#
        ),
        "True"
    );
    let table = ns.k(&["get", "dv", "plain"]).unwrap();
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["NAME", "PHASE", "PROGRESS", "RESTARTS", "AGE"],
        "{table}"
    );
    let owner = ns.get("pvc", "plain", "{.metadata.ownerReferences[0].kind}");
    assert_eq!(owner, "DataVolume", "the claim belongs to its DataVolume");
    assert!(
        server.requests.load(Ordering::Relaxed) >= 1,
        "the importer never asked the server"
    );

    // A VM with a DataVolume template: the DataVolume is made and owned by the VM, the VM
    // starts once it is imported, and the guest reads the marker from the imported disk.
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&vm_with_template(
            &ns.name,
            "booted",
            "booted-disk",
            &server.url("disk.raw"),
        )),
    )
    .expect("apply the VM");
    wait_dv_phase(&ns, "booted-disk", "Succeeded");
    assert_eq!(
        ns.get("dv", "booted-disk", "{.metadata.ownerReferences[0].kind}"),
        "VirtualMachine"
    );
    expect_marker_on_disk(&ns, "booted");

    // A clone of `plain` in its namespace (`source.pvc`): a claim of its own, owned by the
    // DataVolume, holding the copy of the disk; the source stays as it was.
    c.kubectl_stdin(
        &["-n", &ns.name, "create", "-f", "-"],
        Some(&clone_volume("cloned", "plain").to_string()),
    )
    .expect("create the cloning DataVolume");
    wait_dv_phase(&ns, "cloned", "Succeeded");
    assert_eq!(
        ns.get("pvc", "cloned", "{.metadata.ownerReferences[0].kind}"),
        "DataVolume",
        "the clone's claim belongs to its DataVolume"
    );
    assert_eq!(
        ns.get("pvc", "cloned", "{.metadata.ownerReferences[0].name}"),
        "cloned"
    );
    assert_eq!(dv_field(&ns, "plain", "{.status.phase}"), "Succeeded");

    // A VM whose template clones `plain` boots from the copy: the marker is on its disk.
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&vm_with_data_volume(
            &ns.name,
            "cloned-boot",
            "cloned-boot-disk",
            &clone_volume("cloned-boot-disk", "plain")["spec"],
        )),
    )
    .expect("apply the VM cloning plain");
    wait_dv_phase(&ns, "cloned-boot-disk", "Succeeded");
    assert_eq!(
        ns.get(
            "dv",
            "cloned-boot-disk",
            "{.metadata.ownerReferences[0].kind}"
        ),
        "VirtualMachine"
    );
    expect_marker_on_disk(&ns, "cloned-boot");
    ns.k(&["delete", "vm", "cloned-boot", "--wait=false"])
        .unwrap();

    // Upstream virtctl's `create vm --volume-import`, applied as printed: its
    // dataVolumeTemplate imports the disk into a claim of the default class.
    let virtctl = e2e::upstream_virtctl().expect("upstream virtctl");
    let out = Command::new(&virtctl)
        .env("KUBECONFIG", &c.kubeconfig)
        .args([
            "-n",
            &ns.name,
            "create",
            "vm",
            "--name",
            "printed",
            "--run-strategy",
            "Halted",
            &format!(
                "--volume-import=type:http,url:{},size:64Mi,name:printed-disk",
                server.url("disk.qcow2")
            ),
        ])
        .output()
        .expect("virtctl create vm");
    let manifest = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "virtctl create vm: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    c.kubectl_stdin(&["-n", &ns.name, "apply", "-f", "-"], Some(&manifest))
        .unwrap_or_else(|e| panic!("virtctl's VM was refused: {e:#}\n{manifest}"));
    wait_dv_phase(&ns, "printed-disk", "Succeeded");
    assert_eq!(
        ns.get("dv", "printed-disk", "{.metadata.ownerReferences[0].name}"),
        "printed"
    );

    // A URL that answers 404: the DataVolume says which and why, the VM says its disk failed
    // and gets no launcher pod.
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&vm_with_template(
            &ns.name,
            "missing",
            "missing-disk",
            &server.url("nowhere.qcow2"),
        )),
    )
    .expect("apply the VM");
    let reason = |ns: &Ns<'_>| {
        dv_field(
            ns,
            "missing-disk",
            r#"{.status.conditions[?(@.type=="Running")].reason}"#,
        )
    };
    if let Err(e) = c.eventually("the 404 on the DataVolume", IMPORT, || {
        Ok(reason(&ns) == "HTTPNotFound")
    }) {
        panic!("{e:#}\n{}", dv_diagnosis(&ns, "missing-disk"));
    }
    let message = dv_field(
        &ns,
        "missing-disk",
        r#"{.status.conditions[?(@.type=="Running")].message}"#,
    );
    assert!(message.contains("nowhere.qcow2"), "{message}");
    ns.wait("missing", "VM missing DataVolumeError", IMPORT, || {
        ns.vm_status("missing") == "DataVolumeError"
    });
    assert!(
        ns.launcher_pods("missing").is_empty(),
        "a launcher pod for a disk that was never imported"
    );

    // Deleting the VM deletes its DataVolume and, with it, the claim.
    ns.k(&["delete", "vm", "booted", "--wait=true", "--timeout=120s"])
        .unwrap();
    c.eventually(
        "DataVolume and claim of the deleted VM gone",
        common::GONE,
        || {
            Ok(ns.get("dv", "booted-disk", "{.metadata.name}").is_empty()
                && ns.get("pvc", "booted-disk", "{.metadata.name}").is_empty())
        },
    )
    .unwrap_or_else(|e| panic!("{e:#}\n{}", dv_diagnosis(&ns, "booted-disk")));
}

/// VM `vm` runs and its guest reads [`MARKER`] at [`MARKER_SECTOR`] of its data disk.
fn expect_marker_on_disk(ns: &Ns<'_>, vm: &str) {
    ns.wait_running(vm);
    let console = Console::open(ns, vm);
    common::wait_for_shell(&console, ns, vm);
    console.line(&format!(
        "dd if=/dev/vda bs=512 skip={MARKER_SECTOR} count=1 2>/dev/null | head -c {}; echo",
        MARKER.len()
    ));
    console.expect(ns, vm, MARKER, Duration::from_secs(60));
}

/// `kubectl port-forward` to the upload proxy's Service, as a user without a NodePort or
/// Ingress reaches it (docs/local-cluster.md, "Uploading disk images"): the child and the local port.
struct ProxyForward {
    child: std::process::Child,
    port: u16,
}

impl Drop for ProxyForward {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn forward_upload_proxy(c: &e2e::Cluster) -> ProxyForward {
    use std::io::BufRead;
    let mut child = Command::new(c.kubectl_path())
        .env("KUBECONFIG", &c.kubeconfig)
        .args([
            "-n",
            "kubevirt",
            "port-forward",
            "svc/cdi-uploadproxy",
            "--address=127.0.0.1",
            ":443",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("kubectl port-forward");
    let stdout = child.stdout.take().unwrap();
    let mut reader = std::io::BufReader::new(stdout);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    // kubectl writes a line per connection ("Handling connection for …"): keep reading, or
    // its next write hits a closed pipe and kills it (Go exits on SIGPIPE from stdout), and
    // virtctl's upload then finds the port refused.
    std::thread::spawn(move || {
        let mut sink = String::new();
        while reader.read_line(&mut sink).is_ok_and(|n| n > 0) {
            sink.clear();
        }
    });
    // "Forwarding from 127.0.0.1:PORT -> 8444"
    let port = line
        .split_whitespace()
        .nth(2)
        .and_then(|a| a.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"));
    ProxyForward { child, port }
}

/// The test guest with one disk, `data`, the existing DataVolume `dv`.
fn vm_on_data_volume(ns: &str, name: &str, dv: &str) -> String {
    let mut vm: serde_json::Value = serde_json::from_str(&common::vm_manifest(
        name,
        ns,
        "Always",
        &common::Guest::default(),
    ))
    .unwrap();
    let spec = &mut vm["spec"]["template"]["spec"];
    spec["domain"]["devices"]["disks"] =
        serde_json::json!([{"name": "data", "disk": {"bus": "virtio"}}]);
    spec["volumes"] = serde_json::json!([{"name": "data", "dataVolume": {"name": dv}}]);
    vm.to_string()
}

#[test]
#[ignore = "needs a local cluster: cargo xtask cluster up"]
fn virtctl_image_upload_fills_a_data_volume_a_vm_boots_and_bad_tokens_are_refused() {
    let c = common::cluster();
    let dir = tempfile::tempdir().unwrap();
    let (_raw, qcow2) = images(dir.path());
    let ns = Ns::new(c, "upload");
    let forward = forward_upload_proxy(c);
    let proxy = format!("https://127.0.0.1:{}", forward.port);

    // CDIConfig names the proxy's Service; users outside the cluster pass their way in.
    // Polled: right after an upgrade that adds the kind, kube-apiserver's discovery of the
    // group can still be the old version's for a while, and virt-operator writes the status
    // after the rollout.
    let mut url = String::new();
    c.eventually(
        "CDIConfig config with the proxy's URL",
        Duration::from_secs(120),
        || {
            url = c.kubectl(&[
                "get",
                "cdiconfig",
                "config",
                "-o",
                "jsonpath={.status.uploadProxyURL}",
            ])?;
            Ok(!url.is_empty())
        },
    )
    .unwrap();
    assert_eq!(url, "https://cdi-uploadproxy.kubevirt.svc");

    // Upstream virtctl, unchanged: creates the DataVolume, waits for UploadReady, asks for
    // a token, sends the qcow2 through the proxy and waits for the claim to be populated.
    let virtctl = e2e::upstream_virtctl().expect("upstream virtctl");
    let out = Command::new(&virtctl)
        .env("KUBECONFIG", &c.kubeconfig)
        .args([
            "-n",
            &ns.name,
            "image-upload",
            "dv",
            "uploaded",
            "--size=64Mi",
            "--force-bind",
            "--insecure",
            &format!("--uploadproxy-url={proxy}"),
            "--image-path",
        ])
        .arg(&qcow2)
        .output()
        .expect("virtctl image-upload");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "virtctl image-upload: {stdout}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        dv_diagnosis(&ns, "uploaded")
    );
    assert!(stdout.contains("completed successfully"), "{stdout}");
    wait_dv_phase(&ns, "uploaded", "Succeeded");
    assert_eq!(
        ns.get(
            "pvc",
            "uploaded",
            "{.metadata.annotations.cdi\\.kubevirt\\.io/storage\\.pod\\.phase}"
        ),
        "Succeeded"
    );

    // A VM on the uploaded DataVolume reads the marker from its disk.
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&vm_on_data_volume(&ns.name, "from-upload", "uploaded")),
    )
    .expect("apply the VM");
    expect_marker_on_disk(&ns, "from-upload");

    // Bad tokens at the proxy: none 400, garbage or foreign 401, an expired one 401 saying
    // so, one for a claim that takes no uploads 403; the claim is untouched by all of them.
    let key = c
        .kubectl(&[
            "-n",
            "kubevirt",
            "get",
            "secret",
            "kubevirt-rs-upload-token",
            "-o",
            "jsonpath={.data.key}",
        ])
        .unwrap();
    use base64::Engine as _;
    let key = kubevirt_api::cdi::upload::TokenKey::new(
        &base64::engine::general_purpose::STANDARD
            .decode(key.trim())
            .unwrap(),
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    c.kubectl_stdin(
        &["-n", &ns.name, "create", "-f", "-"],
        Some(
            &serde_json::json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "plain"},
                "spec": {"accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "64Mi"}}}})
            .to_string(),
        ),
    )
    .unwrap();
    let foreign = kubevirt_api::cdi::upload::TokenKey::new(b"not this cluster's key")
        .sign(&ns.name, "uploaded", now);
    let cases = [
        (None, 400, "Authorization"),
        (Some("garbage".to_string()), 401, "malformed"),
        (Some(foreign), 401, "signature"),
        (
            Some(key.sign(&ns.name, "uploaded", now - 600)),
            401,
            "expired",
        ),
        (
            Some(key.sign(&ns.name, "plain", now)),
            403,
            "does not take uploads",
        ),
    ];
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .unwrap();
    for (token, code, words) in cases {
        // A forward per refused request: kubectl's port-forward may end a stream whose
        // server answered with `Connection: close`.
        let forward = forward_upload_proxy(c);
        let proxy = format!("https://127.0.0.1:{}", forward.port);
        let mut req = client
            .post(format!("{proxy}/v1beta1/upload"))
            .body(std::fs::read(&qcow2).unwrap());
        if let Some(t) = &token {
            req = req.bearer_auth(t);
        }
        let (status, body) = rt.block_on(async {
            let r = req.send().await.expect("the upload proxy answers");
            (r.status().as_u16(), r.text().await.unwrap_or_default())
        });
        assert_eq!(status, code, "{token:?}: {body}");
        assert!(body.contains(words), "{token:?}: {body}");
    }
    assert_eq!(dv_field(&ns, "uploaded", "{.status.phase}"), "Succeeded");
    drop(forward);
}
