//! The privileged half of pod networking (docs/design-node-privilege-and-network.md): a
//! launcher whose VMI has a pod-network interface listens on `net.sock` in its socket
//! directory before it starts the guest; this module notices the socket, enters the
//! network namespace of the process at the other end, builds the bridge, the tap (owned by
//! QEMU's uid) and the masquerade rules there, opens the DHCP socket, and hands the plan
//! and the socket over (`virt_netsetup::handoff`). A failure is undone and reported to the
//! launcher, which fails the VMI with it.

use std::collections::{HashMap, HashSet};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kubevirt_api::VirtualMachineInstance;
use tokio_util::sync::CancellationToken;
use virt_netsetup::exec::{self, NetNs};
use virt_netsetup::{Dns, NetworkPlan, PlanInput, handoff, plan};

use crate::cluster::Paths;

/// How often socket directories are looked at for a launcher waiting for its network.
const POLL: Duration = Duration::from_millis(100);

/// The VMIs this handler knows (its node's and those migrating here), by uid: the plan is
/// made from the API server's VMI, never from anything the launcher says.
#[derive(Clone, Debug, Default)]
pub struct KnownVmis(Arc<RwLock<HashMap<String, VirtualMachineInstance>>>);

impl KnownVmis {
    /// Records the latest version of a VMI.
    pub fn insert(&self, vmi: &VirtualMachineInstance) {
        if let (Some(uid), Ok(mut m)) = (vmi.uid(), self.0.write()) {
            m.insert(uid, vmi.clone());
        }
    }

    /// Forgets a VMI.
    pub fn remove(&self, uid: &str) {
        if let Ok(mut m) = self.0.write() {
            m.remove(uid);
        }
    }

    fn get(&self, uid: &str) -> Option<VirtualMachineInstance> {
        self.0.read().ok()?.get(uid).cloned()
    }
}

/// The VMI uid of a socket directory: `<uid>`, or `<uid>-<suffix>` for a migration target.
fn uid_of_dir(dir: &str) -> &str {
    dir.get(..36).unwrap_or(dir)
}

/// Serves launchers waiting for their network until `shutdown`.
pub async fn run(paths: Paths, vmis: KnownVmis, shutdown: CancellationToken) {
    let mut started: HashSet<String> = HashSet::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(POLL) => {}
        }
        let Ok(mut dirs) = tokio::fs::read_dir(paths.sockets()).await else {
            continue;
        };
        let mut present = HashSet::new();
        while let Ok(Some(e)) = dirs.next_entry().await {
            let Ok(dir) = e.file_name().into_string() else {
                continue;
            };
            let sock = e.path().join(handoff::SOCKET);
            if !sock.exists() {
                continue;
            }
            present.insert(dir.clone());
            if started.contains(&dir) {
                continue;
            }
            // The watch may not have delivered the VMI yet: try again next round.
            let Some(vmi) = vmis.get(uid_of_dir(&dir)) else {
                continue;
            };
            started.insert(dir.clone());
            tokio::task::spawn_blocking(move || serve_one(&sock, &vmi));
        }
        // A launcher removes its socket once served; a new one (a restarted pod) is served
        // again.
        started.retain(|d| present.contains(d));
    }
}

/// Sets up one launcher's network and tells it the outcome.
fn serve_one(sock: &Path, vmi: &VirtualMachineInstance) {
    let t0 = Instant::now();
    let (ns, name) = (vmi.namespace().unwrap_or_default(), vmi.name_any());
    let stream = match UnixStream::connect(sock) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(socket = %sock.display(), error = %e, "launcher's network socket");
            return;
        }
    };
    match set_up(&stream, vmi) {
        Ok((plan, dhcp)) => {
            if let Err(e) = handoff::send_ready(&stream, &plan, &dhcp) {
                tracing::warn!(vmi = %format!("{ns}/{name}"), error = %e, "handing the network over");
                return;
            }
            tracing::info!(
                vmi = %format!("{ns}/{name}"),
                binding = ?plan.binding,
                guest = %plan.lease.address,
                pod = %plan.pod.address,
                elapsed_ms = t0.elapsed().as_millis() as u64,
                "pod network ready"
            );
        }
        Err(e) => {
            tracing::warn!(vmi = %format!("{ns}/{name}"), error = %e, "pod network set-up failed");
            let _ = handoff::send_failed(&stream, &e);
        }
    }
}

fn set_up(
    stream: &UnixStream,
    vmi: &VirtualMachineInstance,
) -> Result<(NetworkPlan, std::net::UdpSocket), String> {
    let pid = handoff::peer_pid(stream).map_err(|e| e.to_string())?;
    let netns = NetNs::of_pid(pid).map_err(|e| e.to_string())?;
    let pod = exec::read_pod_interface(&netns, virt_netsetup::plan::POD_INTERFACE)
        .map_err(|e| e.to_string())?;
    // The pod's resolv.conf, as kubelet wrote it for the launcher (cluster DNS, search
    // domains of its namespace).
    let resolv = PathBuf::from(format!("/proc/{pid}/root/etc/resolv.conf"));
    let dns = std::fs::read_to_string(&resolv)
        .map(|t| Dns::from_resolv_conf(&t))
        .unwrap_or_default();
    let uid = vmi.uid().unwrap_or_default();
    let hostname = vmi.spec.hostname.clone().or_else(|| Some(vmi.name_any()));
    let plan = plan(PlanInput {
        spec: &vmi.spec,
        mac_seed: &uid,
        hostname,
        pod,
        dns,
    })
    .map_err(|e| e.to_string())?
    .ok_or_else(|| "the VMI has no interface on the pod network".to_string())?;
    // A handler that died half-way left some of it: start from nothing.
    if exec::inventory(&netns)
        .is_ok_and(|(links, _)| links.iter().any(|l| l == virt_netsetup::plan::BRIDGE))
    {
        let _ = exec::teardown(&netns, &plan);
    }
    exec::apply(&netns, &plan).map_err(|e| e.to_string())?;
    let dhcp = match exec::dhcp_socket(&netns, virt_netsetup::plan::BRIDGE) {
        Ok(s) => s,
        Err(e) => {
            let _ = exec::teardown(&netns, &plan);
            return Err(e.to_string());
        }
    };
    Ok((plan, dhcp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_directories_name_their_vmi() {
        let uid = "5b0f3c1e-8a8e-4c7e-9d55-1f0b8c9c2a10";
        assert_eq!(uid_of_dir(uid), uid);
        assert_eq!(uid_of_dir(&format!("{uid}-1a2b3c4d")), uid);
        assert_eq!(uid_of_dir("short"), "short");
    }
}
