//! The processes `bench scale` adds to the API harness of `bench crd`: kube-scheduler, the
//! KWOK controller with its fake Nodes, and virt-controller. Each is a child of this
//! process (its pid known, killed when dropped), logging into the harness's directory.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::Context;
use serde_json::{Value, json};

/// The annotation KWOK manages Nodes by.
const KWOK_ANNOTATION: &str = "kwok.x-k8s.io/node";

/// A child process, killed on drop.
pub struct Proc {
    pub name: &'static str,
    child: Child,
}

impl Proc {
    /// Starts `cmd`, its output into `log`.
    pub fn spawn(name: &'static str, mut cmd: Command, log: &Path) -> anyhow::Result<Self> {
        let out =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        Ok(Self { name, child })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The binaries beyond the harness's.
#[derive(Debug, Clone)]
pub struct Extra {
    pub kube_scheduler: PathBuf,
    pub kwok: PathBuf,
    pub virt_controller: PathBuf,
}

/// kube-scheduler with the admin kubeconfig, on a free loopback port. Its client's rate
/// limit is lifted (as kwokctl does for scale runs): at 50 pods/s a binding and an Event
/// per pod would exceed the default 50 requests/s, and this run measures our control
/// plane, not the scheduler's client.
pub fn scheduler(bin: &Path, kubeconfig: &Path, dir: &Path) -> anyhow::Result<Proc> {
    let port = virt_devenv::free_port()?;
    let mut cmd = Command::new(bin);
    cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!(
            "--authentication-kubeconfig={}",
            kubeconfig.display()
        ))
        .arg(format!(
            "--authorization-kubeconfig={}",
            kubeconfig.display()
        ))
        .arg("--bind-address=127.0.0.1")
        .arg(format!("--secure-port={port}"))
        .arg("--leader-elect=false")
        .arg("--kube-api-qps=5000")
        .arg("--kube-api-burst=10000");
    Proc::spawn("kube-scheduler", cmd, &dir.join("kube-scheduler.log"))
}

/// The KWOK controller, managing the Nodes annotated for it with its default stages
/// (Nodes Ready with a heartbeat, bound pods Running with an IP from the Node's podCIDR).
pub fn kwok(bin: &Path, kubeconfig: &Path, dir: &Path) -> anyhow::Result<Proc> {
    let port = virt_devenv::free_port()?;
    let mut cmd = Command::new(bin);
    cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!(
            "--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake"
        ))
        .arg("--cidr=10.240.0.0/12")
        .arg("--node-ip=10.239.0.1")
        .arg(format!("--server-address=127.0.0.1:{port}"))
        // Its default stages only: never a ~/.kwok/kwok.yaml of whoever runs this.
        .env("HOME", dir);
    Proc::spawn("kwok", cmd, &dir.join("kwok.log"))
}

/// virt-controller as its Deployment runs it, but a process with the admin kubeconfig:
/// leader election on a Lease in `kubevirt`, Events on, TCG allowed (fake nodes have no
/// /dev/kvm device plugin), metrics on a free loopback port.
pub fn virt_controller(bin: &Path, kubeconfig: &Path, dir: &Path) -> anyhow::Result<Proc> {
    let port = virt_devenv::free_port()?;
    let mut cmd = Command::new(bin);
    cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg("--lease-namespace=kubevirt")
        .arg("--identity=virt-controller-bench")
        .arg("--allow-emulation=true")
        .arg(format!("--metrics-addr=127.0.0.1:{port}"))
        .env("RUST_LOG", "info");
    Proc::spawn("virt-controller", cmd, &dir.join("virt-controller.log"))
}

/// Node `i` of the run: a fake Node KWOK manages, with room for every pod the run can
/// put there (capacity is not what this run measures) and its own /24 of pod IPs.
pub fn node(i: usize) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": node_name(i),
            "annotations": {KWOK_ANNOTATION: "fake"},
            "labels": {
                "type": "kwok",
                "kubernetes.io/hostname": node_name(i),
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
            },
        },
        "spec": {"podCIDR": format!("10.{}.{}.0/24", 240 + i / 256, i % 256)},
        "status": {
            "capacity": {"cpu": "256", "memory": "2Ti", "pods": "1000"},
            "allocatable": {"cpu": "256", "memory": "2Ti", "pods": "1000"},
        },
    })
}

pub fn node_name(i: usize) -> String {
    format!("kwok-node-{i:03}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_kwoks_with_their_own_pod_range() {
        let n = node(257);
        assert_eq!(n["metadata"]["name"], "kwok-node-257");
        assert_eq!(n["metadata"]["annotations"][KWOK_ANNOTATION], "fake");
        assert_eq!(n["spec"]["podCIDR"], "10.241.1.0/24");
        assert_eq!(node(0)["spec"]["podCIDR"], "10.240.0.0/24");
    }
}
