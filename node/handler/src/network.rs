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
use kubevirt_api::{LAUNCHER_UID, VirtualMachineInstance};
use tokio_util::sync::CancellationToken;
use virt_netsetup::exec::{self, NetNs};
use virt_netsetup::{Dns, NetworkPlan, PlanInput, handoff, plan};

use crate::vmis::Paths;

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
            hand_to_launcher(&e.path());
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

/// Gives a launcher its socket directory. kubelet creates it (the pod's sockets subpath)
/// owned by root, and the launcher runs as [`LAUNCHER_UID`] without any capability; it
/// waits until the directory is its own. Not following links: the directory is created
/// by kubelet, not by a launcher, but a name is checked before it is trusted.
fn hand_to_launcher(dir: &Path) {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(meta) = std::fs::symlink_metadata(dir) else {
        return;
    };
    if !meta.is_dir() || (meta.uid() == LAUNCHER_UID && meta.gid() == LAUNCHER_UID) {
        return;
    }
    if let Err(e) = std::os::unix::fs::lchown(dir, Some(LAUNCHER_UID), Some(LAUNCHER_UID)) {
        tracing::warn!(dir = %dir.display(), error = %e, "handing the socket directory to the launcher");
    }
}

/// The network plan of a VMI, in its socket directory: where its guest is on the pod
/// network.
pub const PLAN_FILE: &str = "network.json";

/// Why a connection to a guest port cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum GuestConnectError {
    /// No plan: the VMI has no pod network interface, or its network is not set up yet.
    #[error("the VMI has no interface on the pod network (or it is not set up yet)")]
    NoNetwork,
    /// The guest answered with a reset.
    #[error("the guest refused the connection to port {0} (nothing listens there?)")]
    Refused(u16),
    /// No answer in time.
    #[error("the guest did not answer on port {0} within {1:?}")]
    Timeout(u16, Duration),
    /// Anything else.
    #[error("connecting to the guest: {0}")]
    Other(String),
}

/// How long a guest has to accept a forwarded connection.
pub const GUEST_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Opens a TCP connection to `port` of the guest whose launcher has socket directory
/// `dir`. A masquerade guest (10.0.2.2) is reachable only inside the launcher pod's network
/// namespace: the connection is made there, the launcher's PID taken from the peer
/// credentials of its command socket. A bridge-bound guest holds the pod's IP and the pod's
/// namespace keeps no address to reach it from: the connection goes over the pod network
/// from virt-handler's own pod, as KubeVirt's virt-api dials such guests (NetworkPolicies
/// that isolate the VM's pod apply to it as to any client).
pub async fn connect_guest(
    dir: PathBuf,
    port: u16,
) -> Result<tokio::net::TcpStream, GuestConnectError> {
    let other = |e: &dyn std::fmt::Display| GuestConnectError::Other(e.to_string());
    let s = reach_guest(dir, port, |addr| {
        let s = std::net::TcpStream::connect_timeout(&addr, GUEST_CONNECT_TIMEOUT)?;
        let _ = s.set_nodelay(true);
        s.set_nonblocking(true)?;
        Ok(s)
    })
    .await?;
    tokio::net::TcpStream::from_std(s).map_err(|e| other(&e))
}

/// [`connect_guest`] for UDP: a socket connected to `port` of the guest (from where a TCP
/// connection would come), so that only the guest's datagrams arrive on it and an ICMP
/// "port unreachable" shows as `ConnectionRefused` on its next receive.
pub async fn connect_guest_udp(
    dir: PathBuf,
    port: u16,
) -> Result<tokio::net::UdpSocket, GuestConnectError> {
    let other = |e: &dyn std::fmt::Display| GuestConnectError::Other(e.to_string());
    let s = reach_guest(dir, port, |addr| {
        let s = std::net::UdpSocket::bind((std::net::Ipv4Addr::UNSPECIFIED, 0))?;
        s.connect(addr)?;
        s.set_nonblocking(true)?;
        Ok(s)
    })
    .await?;
    tokio::net::UdpSocket::from_std(s).map_err(|e| other(&e))
}

/// Opens a socket with `open(guest address)` where the guest is reachable (see
/// [`connect_guest`]), on a blocking thread (entering a namespace is per thread).
async fn reach_guest<S, F>(dir: PathBuf, port: u16, open: F) -> Result<S, GuestConnectError>
where
    S: Send + 'static,
    F: FnOnce(std::net::SocketAddr) -> std::io::Result<S> + Send + 'static,
{
    let other = |e: &dyn std::fmt::Display| GuestConnectError::Other(e.to_string());
    tokio::task::spawn_blocking(move || {
        let net: NetworkPlan = std::fs::read(dir.join(PLAN_FILE))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or(GuestConnectError::NoNetwork)?;
        let addr = std::net::SocketAddr::from((net.lease.address.addr, port));
        let s = if net.binding == plan::Binding::Bridge {
            open(addr)
        } else {
            let cmd = UnixStream::connect(dir.join("cmd.sock")).map_err(|e| other(&e))?;
            let pid = handoff::peer_pid(&cmd).map_err(|e| other(&e))?;
            drop(cmd);
            NetNs::of_pid(pid)
                .map_err(|e| other(&e))?
                .run(|| open(addr))
                .map_err(|e| other(&e))?
        };
        let s = s.map_err(|e| match e.kind() {
            std::io::ErrorKind::ConnectionRefused => GuestConnectError::Refused(port),
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
                GuestConnectError::Timeout(port, GUEST_CONNECT_TIMEOUT)
            }
            _ => other(&e),
        })?;
        Ok(s)
    })
    .await
    .map_err(|e| other(&e))?
}

/// Makes the node's shared QEMU capabilities cache (a host directory every launcher pod
/// mounts) the launcher user's, including what root-mode launchers left there. A launcher
/// that finds it unwritable probes QEMU itself, which costs seconds per start.
pub fn prepare_launcher_cache(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    fn walk(p: &Path) -> std::io::Result<()> {
        let meta = std::fs::symlink_metadata(p)?;
        std::os::unix::fs::lchown(p, Some(LAUNCHER_UID), Some(LAUNCHER_UID))?;
        if meta.is_dir() {
            for e in std::fs::read_dir(p)? {
                walk(&e?.path())?;
            }
        }
        Ok(())
    }
    walk(dir)
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
            // For port-forwarding later (also after a handler restart): where the guest is.
            if let Some(dir) = sock.parent()
                && let Err(e) = serde_json::to_vec(&plan)
                    .map_err(std::io::Error::other)
                    .and_then(|b| std::fs::write(dir.join(PLAN_FILE), b))
            {
                tracing::warn!(vmi = %format!("{ns}/{name}"), error = %e, "recording the network plan");
            }
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
    exec::provide_tun(pid).map_err(|e| e.to_string())?;
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
