//! The second node of `cargo xtask cluster up --nodes 2`: another kubelet on this machine,
//! registered as its own Node, so that VMs can live-migrate between two nodes
//! (docs/local-cluster.md, "Two nodes").
//!
//! What it has of its own: the node name (`<host>-2`), node IP [`NODE2_IP`] (a second
//! address on our bridge), kubelet ports, root directory, pod logs, a cgroup root (a kubelet
//! garbage-collects pod cgroups it does not know under its `kubepods`) and its own
//! containerd (a kubelet also removes containers it does not know from its runtime, so two
//! kubelets cannot share one containerd namespace). What it shares: the host's network
//! namespace (one kube-proxy serves both), the CNI configuration and IPAM store (one pod
//! range, host-local's file lock keeps addresses unique), the control plane and the
//! cluster CA.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::Context;

use super::config::{self, KubeletSpec};
use super::daemon::{self, Daemon};
use super::{Layout, Progress, images, kubectl, loopback, start};

/// Node IP of the second node, on our bridge (below the pod range).
pub const NODE2_IP: &str = "10.213.0.2";
const KUBELET_PORT: u16 = 10350;
const KUBELET_HEALTHZ_PORT: u16 = 10348;
/// Its kubelet's cgroup root (`/kubevirt-rs-node2/kubepods/…` in every hierarchy).
pub const CGROUP_ROOT: &str = "kubevirt-rs-node2";
/// Daemon names (PID and log files).
pub const CONTAINERD: &str = "containerd-2";
pub const KUBELET: &str = "kubelet-2";

/// The second node's name.
pub fn name(first: &str) -> String {
    format!("{first}-2")
}

fn dir(layout: &Layout) -> PathBuf {
    layout.state.join("node2")
}

/// The layout as seen by the second node's containerd (only its socket differs), for the
/// image and cleanup helpers written for the first.
pub fn node_layout(layout: &Layout) -> Layout {
    Layout {
        containerd_socket: layout.run.join("containerd-2.sock"),
        ..layout.clone()
    }
}

/// Whether the second node's containerd runs.
pub fn running(layout: &Layout) -> bool {
    daemon::running_pid(layout, CONTAINERD).is_some()
}

/// The cgroup root directories in every mounted v1 hierarchy (or the v2 root).
pub fn cgroup_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        dirs.push(Path::new("/sys/fs/cgroup").join(CGROUP_ROOT));
    } else if let Ok(d) = fs::read_dir("/sys/fs/cgroup") {
        for e in d.filter_map(|e| e.ok()) {
            let p = e.path();
            // Every v1 hierarchy kubelet checks (name=systemd included), not the hybrid
            // unified tree.
            if e.file_type().is_ok_and(|t| t.is_dir()) && !p.ends_with("unified") {
                dirs.push(p.join(CGROUP_ROOT));
            }
        }
    }
    dirs
}

fn create_cgroup_root() -> anyhow::Result<()> {
    for d in cgroup_dirs() {
        fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
        // A new cpuset cgroup has no CPUs or memory nodes: inherit the parent's.
        for f in ["cpuset.cpus", "cpuset.mems"] {
            let (mine, parent) = (d.join(f), d.parent().map(|p| p.join(f)));
            if let Some(parent) = parent
                && mine.exists()
                && fs::read_to_string(&mine).is_ok_and(|v| v.trim().is_empty())
            {
                let v = fs::read_to_string(&parent)?;
                fs::write(&mine, v.trim())
                    .with_context(|| format!("writing {}", mine.display()))?;
            }
        }
    }
    Ok(())
}

/// `ctr images ls` as `name digest` pairs.
fn image_list(socket: &Path) -> Vec<(String, String)> {
    let out = Command::new("ctr")
        .arg("--address")
        .arg(socket)
        .args(["--namespace", "k8s.io", "images", "ls"])
        .output();
    let Ok(out) = out else { return Vec::new() };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 3).then(|| (f[0].to_string(), f[2].to_string()))
        })
        .collect()
}

/// Copies the images of the first node's containerd the second lacks (or has under another
/// digest): there is no registry to pull from. Later imports go to both.
fn sync_images(layout: &Layout, l2: &Layout, progress: &Progress) -> anyhow::Result<()> {
    let have = image_list(&l2.containerd_socket);
    let missing: Vec<String> = image_list(&layout.containerd_socket)
        .into_iter()
        // CRI's own `sha256:<id>` aliases come with the named image.
        .filter(|(n, _)| !n.starts_with("sha256:"))
        .filter(|i| !have.contains(i))
        .map(|(n, _)| n)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let archive = dir(layout).join("images-sync.tar");
    let out = Command::new("ctr")
        .arg("--address")
        .arg(&layout.containerd_socket)
        .args(["--namespace", "k8s.io", "images", "export"])
        .arg(&archive)
        .args(&missing)
        .output()
        .context("ctr images export")?;
    anyhow::ensure!(
        out.status.success(),
        "exporting images for node 2: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let r = images::import(l2, &archive);
    let _ = fs::remove_file(&archive);
    r?;
    progress.step(&format!(
        "{} image(s) copied to node 2's containerd",
        missing.len()
    ));
    Ok(())
}

/// Starts (or finds running) the second node and waits until it is Ready.
pub fn up(layout: &Layout, progress: &Progress, bin: &Path, first: &str) -> anyhow::Result<()> {
    let node = name(first);
    let l2 = node_layout(layout);
    let d = dir(layout);
    fs::create_dir_all(&d)?;
    super::net::add_address(NODE2_IP)?;

    let pki = super::pki::Pki::new(layout);
    pki.ensure_node_client("kubelet-client-2", &node)?;
    pki.ensure_node_serving("kubelet-2", &node, NODE2_IP)?;
    let kubeconfig = layout.kubeconfigs.join("kubelet-client-2.kubeconfig");
    pki.write_kubeconfig(
        "kubelet-client-2",
        &format!("https://127.0.0.1:{}", super::APISERVER_PORT),
        &kubeconfig,
    )?;

    let containerd_config = d.join("containerd.toml");
    fs::write(
        &containerd_config,
        config::containerd_at(layout, &d.join("containerd"), &l2.containerd_socket),
    )?;
    let sock = l2.containerd_socket.clone();
    start(
        layout,
        progress,
        Daemon::new(CONTAINERD, "containerd")
            .arg(format!("--config={}", containerd_config.display())),
        &[],
        "serving",
        Duration::from_secs(30),
        || {
            Ok(Command::new("ctr")
                .arg("--address")
                .arg(&sock)
                .arg("version")
                .output()?
                .status
                .success())
        },
    )?;
    sync_images(layout, &l2, progress)?;

    create_cgroup_root()?;
    let kubelet_config = d.join("kubelet.yaml");
    fs::write(
        &kubelet_config,
        config::kubelet_for(
            layout,
            &KubeletSpec {
                address: NODE2_IP.into(),
                cert: "kubelet-2".into(),
                port: KUBELET_PORT,
                healthz_port: KUBELET_HEALTHZ_PORT,
                containerd_socket: l2.containerd_socket.clone(),
                state: d.clone(),
                cgroup_root: Some(format!("/{CGROUP_ROOT}")),
            },
        ),
    )?;
    fs::write(d.join("resolv.conf"), "nameserver 127.0.0.1\n")?;
    start(
        layout,
        progress,
        Daemon::new(KUBELET, bin.join("kubelet"))
            .arg(format!("--config={}", kubelet_config.display()))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--root-dir={}", d.join("kubelet").display()))
            .arg(format!("--hostname-override={node}"))
            .arg(format!("--node-ip={NODE2_IP}")),
        &[KUBELET_PORT, KUBELET_HEALTHZ_PORT],
        "healthy",
        Duration::from_secs(60),
        || Ok(daemon::http_status(loopback(KUBELET_HEALTHZ_PORT), "/healthz")? == 200),
    )?;
    let jsonpath = r#"jsonpath={.status.conditions[?(@.type=="Ready")].status}"#;
    daemon::wait_for(
        layout,
        KUBELET,
        "node Ready",
        Duration::from_secs(90),
        || Ok(kubectl(layout, bin, &["get", "node", &node, "-o", jsonpath])?.trim() == "True"),
    )?;
    progress.step(&format!("node {node} Ready"));
    Ok(())
}
