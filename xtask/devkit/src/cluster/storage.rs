//! Dynamic provisioning for the local cluster, as kind users have it: Rancher's
//! local-path-provisioner, built from its Go module at the version `e2e/local-path/go.mod`
//! pins, runs beside kube-controller-manager as a host process (like the rest of this
//! cluster's control plane) and serves two StorageClasses:
//!
//! - `local-path` (the default): ReadWriteOnce volumes in a directory of the node the first
//!   pod lands on (`WaitForFirstConsumer`), bound to that node — a node's local disk;
//! - `shared-path`: ReadWriteOnce/ReadWriteMany volumes without node affinity in one host
//!   directory every node mounts (both nodes of this cluster share the machine's
//!   filesystem), standing in for NFS or CephFS: what live migration with a shared disk
//!   needs.
//!
//! The provisioner creates and removes the directories through short-lived helper pods
//! (its design); their image is a static busybox built here.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::bail;

use super::daemon::{self, Daemon};
use super::images::{self, ImageFile, ImageSpec};
use super::{Layout, Progress, kube_build};

/// The provisioner's name in StorageClasses.
pub const PROVISIONER: &str = "rancher.io/local-path";
/// The default StorageClass: node-local volumes.
pub const LOCAL_CLASS: &str = "local-path";
/// The StorageClass every node sees.
pub const SHARED_CLASS: &str = "shared-path";
const NAMESPACE: &str = "local-path-storage";
const CONFIG_MAP: &str = "local-path-config";
const SERVICE_ACCOUNT: &str = "local-path-provisioner";
/// The local-path helper pods' image (a static busybox); also the client pod of `bench
/// migrate`'s Service probe, since it is on every node already.
pub(crate) const HELPER_IMAGE: &str = "localhost/kubevirt-rs/local-path-helper:1";
const DAEMON: &str = "local-path-provisioner";

/// The provisioner, built from the module `e2e/local-path/go.mod` pins.
const TOOL: kube_build::GoTool = kube_build::GoTool {
    dir: "e2e/local-path",
    module: "github.com/rancher/local-path-provisioner",
    package: "github.com/rancher/local-path-provisioner",
    tags: &[],
    name: "local-path-provisioner",
    cache: "local-path",
};

/// The helper pods' image: a static busybox as /bin/sh, mkdir and rm.
fn ensure_helper_image(layout: &Layout, progress: &Progress) -> anyhow::Result<()> {
    let busybox = Path::new("/bin/busybox");
    if !busybox.exists() {
        bail!("/bin/busybox missing (apt-get install busybox-static)");
    }
    let archive = layout.cache.join("local-path-helper.oci.tar");
    if !archive.exists() {
        let files: Vec<ImageFile> = ["busybox", "sh", "mkdir", "rm"]
            .iter()
            .map(|n| ImageFile {
                host: busybox.to_path_buf(),
                image: format!("/bin/{n}"),
            })
            .collect();
        images::build_image(
            layout,
            HELPER_IMAGE,
            &ImageSpec {
                files: &files,
                entrypoint: &["/bin/sh"],
                env: &["PATH=/bin"],
                ..ImageSpec::default()
            },
            &archive,
        )?;
    }
    images::import_all(layout, &archive)?;
    progress.step(&format!("{HELPER_IMAGE} imported"));
    Ok(())
}

/// Host directory of the node-local volumes of `node`.
fn local_dir(layout: &Layout, node: &str) -> PathBuf {
    layout.state.join("storage/local").join(node)
}

/// Host directory of the shared volumes.
fn shared_dir(layout: &Layout) -> PathBuf {
    layout.state.join("storage/shared")
}

/// The provisioner's configuration: one directory per node for `local-path`, one shared
/// directory for `shared-path`.
pub fn config_json(layout: &Layout, nodes: &[String]) -> serde_json::Value {
    let mut map: Vec<serde_json::Value> = nodes
        .iter()
        .map(|n| serde_json::json!({"node": n, "paths": [local_dir(layout, n)]}))
        .collect();
    // A node added later still gets volumes, next to the others.
    map.push(serde_json::json!({
        "node": "DEFAULT_PATH_FOR_NON_LISTED_NODES",
        "paths": [layout.state.join("storage/local/other")]
    }));
    serde_json::json!({
        "storageClassConfigs": {
            LOCAL_CLASS: {"nodePathMap": map},
            SHARED_CLASS: {"sharedFileSystemPath": shared_dir(layout)},
        }
    })
}

/// The Kubernetes objects: namespace, the helper pods' service account, the ConfigMap the
/// helper pods mount their scripts from, and the two StorageClasses.
pub fn manifest(config: &serde_json::Value) -> anyhow::Result<String> {
    // World-writable like the provisioner's own default: launcher pods run as uid 107 and a
    // hostPath volume gets no fsGroup.
    let setup = "set -eu\nmkdir -m 0777 -p \"$VOL_DIR\"\n";
    let teardown = "set -eu\nrm -rf \"$VOL_DIR\"\n";
    let helper_pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "helper-pod"},
        "spec": {
            "priorityClassName": "system-node-critical",
            "containers": [{
                "name": "helper-pod",
                "image": HELPER_IMAGE,
                "imagePullPolicy": "Never",
            }],
        },
    });
    let class = |name: &str, default: bool, binding: &str| {
        serde_json::json!({
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": name,
                "annotations": {
                    "storageclass.kubernetes.io/is-default-class": default.to_string(),
                },
            },
            "provisioner": PROVISIONER,
            "volumeBindingMode": binding,
            "reclaimPolicy": "Delete",
        })
    };
    let docs = [
        serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}),
        serde_json::json!({
            "apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": SERVICE_ACCOUNT, "namespace": NAMESPACE},
            "automountServiceAccountToken": false,
        }),
        serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": CONFIG_MAP, "namespace": NAMESPACE},
            "data": {
                "config.json": serde_json::to_string_pretty(config)?,
                "setup": setup,
                "teardown": teardown,
                "helperPod.yaml": serde_json::to_string_pretty(&helper_pod)?,
            },
        }),
        class(LOCAL_CLASS, true, "WaitForFirstConsumer"),
        // Immediate: a shared volume has no node to wait for.
        class(SHARED_CLASS, false, "Immediate"),
    ];
    let items = serde_json::Value::Array(docs.to_vec());
    Ok(serde_json::to_string_pretty(
        &serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}),
    )?)
}

/// Builds (once), configures and starts the provisioner; idempotent.
pub fn up(
    layout: &Layout,
    progress: &Progress,
    bin: &Path,
    nodes: &[String],
) -> anyhow::Result<()> {
    let provisioner = TOOL.ensure(layout, progress, "")?;
    ensure_helper_image(layout, progress)?;
    for n in nodes {
        fs::create_dir_all(local_dir(layout, n))?;
    }
    fs::create_dir_all(shared_dir(layout))?;
    let config = config_json(layout, nodes);
    let config_path = layout.state.join("local-path-config.json");
    fs::write(&config_path, serde_json::to_string_pretty(&config)?)?;
    let manifest_path = layout.state.join("local-path-storage.json");
    fs::write(&manifest_path, manifest(&config)?)?;
    super::kubectl(
        layout,
        bin,
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &manifest_path.to_string_lossy(),
        ],
    )?;
    let d = Daemon::new(DAEMON, provisioner)
        .arg("--debug")
        .arg("start")
        .arg(format!("--config={}", config_path.display()))
        .arg(format!("--provisioner-name={PROVISIONER}"))
        .arg(format!("--namespace={NAMESPACE}"))
        .arg(format!("--configmap-name={CONFIG_MAP}"))
        .arg(format!("--service-account-name={SERVICE_ACCOUNT}"))
        .arg(format!("--helper-image={HELPER_IMAGE}"))
        .arg(format!(
            "--kubeconfig={}",
            layout.admin_kubeconfig().display()
        ));
    let (pid, reused) = d.ensure(layout)?;
    let log = layout.logs.join(format!("{DAEMON}.log"));
    daemon::wait_for(
        layout,
        DAEMON,
        "started",
        std::time::Duration::from_secs(30),
        || Ok(fs::read_to_string(&log).is_ok_and(|l| l.contains("Provisioner started"))),
    )?;
    progress.step(&format!(
        "{DAEMON} {} (pid {pid}): StorageClasses {LOCAL_CLASS} (default) and {SHARED_CLASS}",
        if reused { "already running" } else { "started" }
    ));
    Ok(())
}

/// The daemon's name, for `down`'s stop order.
pub const DAEMON_NAME: &str = DAEMON;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn the_pinned_version_comes_from_go_mod() {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        assert!(TOOL.version(&root).unwrap().starts_with("v0.0."));
    }

    #[test]
    fn each_node_has_its_directory_and_the_shared_class_one_for_all() {
        let layout = super::super::tests::scratch_layout("storage");
        let c = config_json(&layout, &["vm".into(), "vm-2".into()]);
        let local = &c["storageClassConfigs"][LOCAL_CLASS]["nodePathMap"];
        assert_eq!(local[0]["node"], "vm");
        assert!(
            local[1]["paths"][0]
                .as_str()
                .unwrap()
                .ends_with("storage/local/vm-2")
        );
        assert!(
            c["storageClassConfigs"][SHARED_CLASS]["sharedFileSystemPath"]
                .as_str()
                .unwrap()
                .ends_with("storage/shared")
        );
        let m: serde_json::Value = serde_json::from_str(&manifest(&c).unwrap()).unwrap();
        let classes: Vec<(&str, &str)> = m["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["kind"] == "StorageClass")
            .map(|d| {
                (
                    d["metadata"]["name"].as_str().unwrap(),
                    d["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"]
                        .as_str()
                        .unwrap(),
                )
            })
            .collect();
        assert_eq!(classes, [(LOCAL_CLASS, "true"), (SHARED_CLASS, "false")]);
    }
}
