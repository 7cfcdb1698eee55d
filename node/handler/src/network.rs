//! The privileged half of pod networking (docs/design-node-privilege-and-network.md): a
//! launcher whose VMI has a pod-network interface listens on `net.sock` in its socket
//! directory before it starts the guest; this module notices the socket, enters the
//! network namespace of the process at the other end, builds the bridge, the tap (owned by
//! QEMU's uid) and the masquerade rules there, opens the DHCP socket, and hands the plan
//! and the socket over (`virt_netsetup::handoff`). A failure is undone and reported to the
//! launcher, which fails the VMI with it.

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kubevirt_api::VirtualMachineInstance;
use tokio_util::sync::CancellationToken;
use virt_netsetup::exec::{self, NetNs};
use virt_netsetup::{Dns, NetworkPlan, PlanInput, handoff, plan};

use crate::launcher_fs::{LauncherDir, LauncherFsError, Peer, SocketsDir};
use crate::vmis::Paths;

/// How often socket directories are looked at for a launcher waiting for its network.
const POLL: Duration = Duration::from_millis(100);

/// The VMIs this handler knows (its node's and those migrating here), by uid: the plan is
/// made from the API server's VMI, never from anything the launcher says. Also the launcher
/// pods bound to this node before their VMI is (see [`crate::early`]), by pod uid.
/// And the IPs of the launcher pods on this node as the API server reports them (the
/// kubelet's `status.podIP`), by pod uid: where a bridge-bound guest is.
#[derive(Clone, Debug, Default)]
pub struct KnownVmis(
    Arc<RwLock<HashMap<String, VirtualMachineInstance>>>,
    Arc<RwLock<HashMap<String, VirtualMachineInstance>>>,
    Arc<RwLock<HashMap<String, Ipv4Addr>>>,
);

impl KnownVmis {
    /// Records the IP the API server reports for launcher pod `pod_uid` (none: forgets it).
    pub fn set_pod_ip(&self, pod_uid: &str, ip: Option<Ipv4Addr>) {
        if let Ok(mut m) = self.2.write() {
            match ip {
                Some(ip) => m.insert(pod_uid.to_string(), ip),
                None => m.remove(pod_uid),
            };
        }
    }

    /// The IP of launcher pod `pod_uid`, if the API server reported one.
    pub fn pod_ip(&self, pod_uid: &str) -> Option<Ipv4Addr> {
        self.2.read().ok()?.get(pod_uid).copied()
    }

    /// The VMI `ns/name`, if known.
    pub fn named(&self, ns: &str, name: &str) -> Option<VirtualMachineInstance> {
        self.0
            .read()
            .ok()?
            .values()
            .find(|v| v.namespace().as_deref() == Some(ns) && v.name_any() == name)
            .cloned()
    }

    /// Records a launcher pod on this node and the VMI that (per the VMI's own
    /// `status.activePods`, which only virt-controller writes) it runs.
    pub fn insert_pod(&self, pod_uid: &str, vmi: &VirtualMachineInstance) {
        if let Ok(mut m) = self.1.write() {
            m.insert(pod_uid.to_string(), vmi.clone());
        }
    }

    /// Forgets a launcher pod recorded by [`Self::insert_pod`] or [`Self::set_pod_ip`].
    pub fn remove_pod(&self, pod_uid: &str) {
        if let Ok(mut m) = self.1.write() {
            m.remove(pod_uid);
        }
        self.set_pod_ip(pod_uid, None);
    }

    /// Whether [`Self::insert_pod`] recorded this pod.
    pub fn has_pod(&self, pod_uid: &str) -> bool {
        self.1.read().is_ok_and(|m| m.contains_key(pod_uid))
    }

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

    /// Every known VMI.
    pub fn all(&self) -> Vec<VirtualMachineInstance> {
        self.0
            .read()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    fn get(&self, uid: &str) -> Option<VirtualMachineInstance> {
        self.0.read().ok()?.get(uid).cloned()
    }

    /// The launcher pods the known VMIs name on `node` (`status.activePods`), each with
    /// its VMI.
    fn launchers_on(&self, node: &str) -> Vec<(String, VirtualMachineInstance)> {
        let Ok(m) = self.0.read() else {
            return Vec::new();
        };
        // A final VMI's pods serve nothing any more (and may be gone: looking for them
        // would scan /proc every round for as long as the VMI exists).
        let mut out: Vec<(String, VirtualMachineInstance)> = m
            .values()
            .filter(|vmi| !vmi.status.as_ref().is_some_and(|s| s.phase.is_final()))
            .flat_map(|vmi| {
                vmi.status
                    .iter()
                    .flat_map(|s| s.active_pods.iter().flatten())
                    .filter(|(_, n)| n.as_str() == node)
                    .map(|(pod, _)| (pod.clone(), vmi.clone()))
                    .collect::<Vec<_>>()
            })
            .collect();
        // Pods known early whose VMI is not known yet (once it is, its own entry counts).
        if let Ok(early) = self.1.read() {
            for (pod, vmi) in early.iter() {
                if !out.iter().any(|(p, _)| p == pod) {
                    out.push((pod.clone(), vmi.clone()));
                }
            }
        }
        out
    }
}

#[cfg(test)]
pub(crate) fn launchers_on_for_tests(
    vmis: &KnownVmis,
    node: &str,
) -> Vec<(String, VirtualMachineInstance)> {
    vmis.launchers_on(node)
}

/// The VMI uid of a socket directory: `<uid>`, or `<uid>-<suffix>` for a migration target.
fn uid_of_dir(dir: &str) -> &str {
    dir.get(..36).unwrap_or(dir)
}

/// The launchers that may be waiting for their network, by key ([`Paths::launcher`]), each
/// with its VMI: in a pod-based node those the known VMIs name on this node, in a host
/// directory the directories present.
async fn candidates(
    paths: &Paths,
    node: &str,
    vmis: &KnownVmis,
) -> Vec<(String, VirtualMachineInstance)> {
    match paths {
        Paths::Pods { .. } => vmis.launchers_on(node),
        Paths::Host { run_root } => {
            let Ok(mut dirs) = tokio::fs::read_dir(run_root.join("sockets")).await else {
                return Vec::new();
            };
            let mut out = Vec::new();
            while let Ok(Some(e)) = dirs.next_entry().await {
                let Ok(dir) = e.file_name().into_string() else {
                    continue;
                };
                // The watch may not have delivered the VMI yet: the next round sees it.
                if let Some(vmi) = vmis.get(uid_of_dir(&dir)) {
                    out.push((dir, vmi));
                }
            }
            out
        }
    }
}

/// Serves launchers waiting for their network until `shutdown`.
/// `capabilities`: this node's probed QEMU capabilities, copied into each launcher's
/// cache before it gets its network ([`crate::capabilities`]).
pub async fn run(
    paths: Paths,
    node: String,
    capabilities: Option<PathBuf>,
    vmis: KnownVmis,
    shutdown: CancellationToken,
) {
    let mut started: HashSet<String> = HashSet::new();
    // Launchers whose socket refused the connection: the socket file exists from the
    // launcher's bind() on, a moment before it listens, so a connection can come too
    // early. They are tried again on the next round.
    let (refused_tx, mut refused_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    // Launcher directories found (a launcher pod's is looked for, through /proc, only
    // until found), by key.
    let mut found: HashMap<String, Arc<SocketsDir>> = HashMap::new();
    // A launcher not found is looked for every round while it is new, then less and less
    // often: one stuck before its sockets must not keep the handler reading every
    // process's cgroup ten times a second (N12 of the security review at bd37f96).
    let mut looked_for: HashSet<String> = HashSet::new();
    let mut scan = ScanPace::default();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(POLL) => {}
        }
        while let Ok(key) = refused_rx.try_recv() {
            started.remove(&key);
        }
        let wanted = candidates(&paths, &node, &vmis).await;
        let missing: Vec<String> = wanted
            .iter()
            .map(|(k, _)| k.clone())
            .filter(|k| !found.contains_key(k))
            .collect();
        let new_ones = missing.iter().any(|k| !looked_for.contains(k));
        looked_for.retain(|k| missing.contains(k));
        if !missing.is_empty() && scan.due(new_ones, Instant::now()) {
            looked_for.extend(missing.iter().cloned());
            let paths = paths.clone();
            if let Ok(opened) =
                tokio::task::spawn_blocking(move || paths.open_launchers(&missing)).await
            {
                found.extend(opened.into_iter().map(|(k, d)| (k, Arc::new(d))));
            }
        }
        let mut present = HashSet::new();
        for (key, vmi) in &wanted {
            let Some(dir) = found.get(key) else {
                continue;
            };
            if !dir.has_socket(handoff::SOCKET) {
                continue;
            }
            present.insert(key.clone());
            if !started.insert(key.clone()) {
                continue;
            }
            let (dir, vmi, caps) = (dir.clone(), vmi.clone(), capabilities.clone());
            let (refused, key) = (refused_tx.clone(), key.clone());
            tokio::spawn(async move {
                let served =
                    tokio::task::spawn_blocking(move || serve_one(&dir, &vmi, caps.as_deref()))
                        .await;
                if matches!(served, Ok(false)) {
                    let _ = refused.send(key);
                }
            });
        }
        // A launcher removes its socket once served; a new one (a restarted launcher in a
        // host directory) is served again.
        started.retain(|k| present.contains(k));
        found.retain(|k, _| wanted.iter().any(|(w, _)| w == k));
        if matches!(paths, Paths::Host { .. }) {
            // Host directories are cheap to open: look again each round (tests restart
            // launchers in the same directory).
            found.clear();
        }
    }
}

/// When to look through /proc again for launchers not found yet: every round while one is
/// new, then after a pause that doubles up to [`SCAN_PAUSE_MAX`].
#[derive(Debug)]
struct ScanPace {
    pause: Duration,
    next: Option<Instant>,
}

/// The longest pause between looks for a launcher not found yet.
const SCAN_PAUSE_MAX: Duration = Duration::from_secs(2);

impl Default for ScanPace {
    fn default() -> Self {
        Self {
            pause: POLL,
            next: None,
        }
    }
}

impl ScanPace {
    /// Whether to look now; `new_ones`: a launcher not looked for before is among those
    /// missing (it is looked for at once).
    fn due(&mut self, new_ones: bool, now: Instant) -> bool {
        if new_ones {
            self.pause = POLL;
        } else if self.next.is_some_and(|n| now < n) {
            return false;
        }
        self.next = Some(now + self.pause);
        self.pause = (self.pause * 2).min(SCAN_PAUSE_MAX);
        true
    }
}

/// Why a connection to a guest port cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum GuestConnectError {
    /// The VMI has no pod network interface, or its pod's address is not known yet.
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

/// Where a guest is, for a port-forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestAddress {
    /// Behind the pod's NAT (masquerade): reachable only inside the launcher pod's network
    /// namespace, at this address.
    InPod(Ipv4Addr),
    /// Holding the pod's own IP (bridge): reachable over the pod network.
    PodNetwork(Ipv4Addr),
}

/// Where the guest of `vmi` is: the binding and, for masquerade, the guest's address
/// follow from the VMI's spec; for bridge the guest holds its pod's IP, `pod_ip` as the API
/// server reports it. Never from anything in the launcher's reach (a file it can rewrite
/// would point virt-handler's connections at any address: N3 of the security review at
/// bd37f96).
pub fn guest_address(
    vmi: &VirtualMachineInstance,
    pod_ip: Option<Ipv4Addr>,
) -> Result<GuestAddress, GuestConnectError> {
    let pod = virt_netsetup::PodInterface {
        name: virt_netsetup::plan::POD_INTERFACE.into(),
        mac: virt_netsetup::plan::Mac([0; 6]),
        address: virt_netsetup::plan::Cidr {
            addr: pod_ip.unwrap_or(Ipv4Addr::UNSPECIFIED),
            prefix: 32,
        },
        gateway: None,
        mtu: 1500,
    };
    let uid = vmi.uid().unwrap_or_default();
    let planned = plan(PlanInput {
        spec: &vmi.spec,
        mac_seed: &uid,
        hostname: None,
        pod,
        dns: Dns::default(),
    })
    .map_err(|e| GuestConnectError::Other(e.to_string()))?
    .ok_or(GuestConnectError::NoNetwork)?;
    match planned.binding {
        plan::Binding::Bridge => pod_ip
            .map(GuestAddress::PodNetwork)
            .ok_or(GuestConnectError::NoNetwork),
        plan::Binding::Masquerade { .. } => Ok(GuestAddress::InPod(planned.lease.address.addr)),
    }
}

/// Opens a TCP connection to `port` of the guest at `guest`, whose launcher has socket
/// directory `dir`. A masquerade guest is reachable only inside the launcher pod's network
/// namespace: the connection is made there, entered through the process at the other end
/// of the launcher's command socket, checked to be of the pod. A bridge-bound guest holds
/// the pod's IP and the pod's namespace keeps no address to reach it from: the connection
/// goes over the pod network from virt-handler's own pod, as KubeVirt's virt-api dials such
/// guests (NetworkPolicies that isolate the VM's pod apply to it as to any client).
pub async fn connect_guest(
    dir: LauncherDir,
    guest: GuestAddress,
    port: u16,
) -> Result<tokio::net::TcpStream, GuestConnectError> {
    let other = |e: &dyn std::fmt::Display| GuestConnectError::Other(e.to_string());
    let s = reach_guest(dir, guest, port, |addr| {
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
    dir: LauncherDir,
    guest: GuestAddress,
    port: u16,
) -> Result<tokio::net::UdpSocket, GuestConnectError> {
    let other = |e: &dyn std::fmt::Display| GuestConnectError::Other(e.to_string());
    let s = reach_guest(dir, guest, port, |addr| {
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
async fn reach_guest<S, F>(
    dir: LauncherDir,
    guest: GuestAddress,
    port: u16,
    open: F,
) -> Result<S, GuestConnectError>
where
    S: Send + 'static,
    F: FnOnce(std::net::SocketAddr) -> std::io::Result<S> + Send + 'static,
{
    let other = |e: &dyn std::fmt::Display| GuestConnectError::Other(e.to_string());
    let dir = match guest {
        GuestAddress::InPod(_) => Some(dir.get().await.map_err(|_| GuestConnectError::NoNetwork)?),
        GuestAddress::PodNetwork(_) => None,
    };
    tokio::task::spawn_blocking(move || {
        let s = match (guest, dir) {
            (GuestAddress::PodNetwork(ip), _) => open((ip, port).into()),
            (GuestAddress::InPod(ip), Some(dir)) => {
                let cmd = dir
                    .connect_blocking(crate::client::CMD_SOCKET)
                    .map_err(|e| other(&e))?;
                let peer = dir.peer(&cmd).map_err(|e| other(&e))?;
                drop(cmd);
                let ns = NetNs::from_fd(peer.net_ns().map_err(|e| other(&e))?, NETNS);
                ns.run(|| open((ip, port).into())).map_err(|e| other(&e))?
            }
            (GuestAddress::InPod(_), None) => return Err(GuestConnectError::NoNetwork),
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

/// What messages call a launcher pod's network namespace.
const NETNS: &str = "the launcher pod's network namespace";

/// Sets up one launcher's network and tells it the outcome; false when the launcher could
/// not be reached (to be tried again).
fn serve_one(dir: &SocketsDir, vmi: &VirtualMachineInstance, capabilities: Option<&Path>) -> bool {
    let t0 = Instant::now();
    let (ns, name) = (vmi.namespace().unwrap_or_default(), vmi.name_any());
    let stream = match dir.connect_blocking(handoff::SOCKET) {
        Ok(s) => s,
        Err(e) => {
            // Tried again every round: refused (too early) is expected, anything else is not.
            if matches!(&e, LauncherFsError::Io { source, .. }
                if source.kind() == std::io::ErrorKind::ConnectionRefused)
            {
                tracing::debug!(vmi = %format!("{ns}/{name}"), "launcher's network socket not listening yet");
            } else {
                tracing::warn!(vmi = %format!("{ns}/{name}"), error = %e, "launcher's network socket");
            }
            return false;
        }
    };
    let peer = match dir.peer(&stream) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(vmi = %format!("{ns}/{name}"), error = %e, "launcher's network socket: refused");
            let _ = handoff::send_failed(&stream, &e.to_string());
            return true;
        }
    };
    if let Some(from) = capabilities {
        seed_capabilities(from, &peer, &format!("{ns}/{name}"));
    }
    match set_up(&peer, vmi) {
        Ok((plan, dhcp)) => {
            if let Err(e) = handoff::send_ready(&stream, &plan, &dhcp) {
                tracing::warn!(vmi = %format!("{ns}/{name}"), error = %e, "handing the network over");
                return true;
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
    true
}

/// Gives the launcher process `peer` this node's QEMU capabilities; a failure only costs
/// the launcher a probe of its own.
fn seed_capabilities(from: &Path, peer: &Peer, vmi: &str) {
    let t0 = Instant::now();
    match crate::capabilities::seed(from, peer) {
        Ok(files) => {
            tracing::debug!(%vmi, files, elapsed_us = t0.elapsed().as_micros() as u64, "QEMU capabilities copied to the launcher")
        }
        Err(e) => {
            tracing::warn!(%vmi, error = %e, "copying QEMU capabilities to the launcher; it probes QEMU itself")
        }
    }
}

/// Builds the network of the launcher process `peer` (checked to be of its pod): every
/// namespace, root and file is reached through it, never through a pid.
fn set_up(
    peer: &Peer,
    vmi: &VirtualMachineInstance,
) -> Result<(NetworkPlan, std::net::UdpSocket), String> {
    let netns = NetNs::from_fd(peer.net_ns().map_err(|e| e.to_string())?, NETNS);
    exec::provide_tun(peer.root().map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    let pod = exec::read_pod_interface(&netns, virt_netsetup::plan::POD_INTERFACE)
        .map_err(|e| e.to_string())?;
    // The pod's resolv.conf, as kubelet wrote it for the launcher (cluster DNS, search
    // domains of its namespace).
    let dns = peer
        .read("etc/resolv.conf", 64 * 1024)
        .map(|b| Dns::from_resolv_conf(&String::from_utf8_lossy(&b)))
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
    fn launchers_are_the_active_pods_on_this_node_of_vmis_not_final() {
        let vmi = |uid: &str, phase: &str, pods: serde_json::Value| -> VirtualMachineInstance {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                "metadata": {"name": uid, "namespace": "ns", "uid": uid},
                "spec": {"domain": {"devices": {}}},
                "status": {"phase": phase, "activePods": pods}
            }))
            .unwrap()
        };
        let known = KnownVmis::default();
        known.insert(&vmi(
            "a",
            "Running",
            serde_json::json!({"pa": "n1", "pt": "n2"}),
        ));
        known.insert(&vmi("b", "Succeeded", serde_json::json!({"pb": "n1"})));
        known.insert(&vmi("c", "Scheduled", serde_json::json!({"pc": "n2"})));
        let on = |node: &str| {
            let mut v: Vec<String> = known
                .launchers_on(node)
                .into_iter()
                .map(|(p, _)| p)
                .collect();
            v.sort();
            v
        };
        assert_eq!(on("n1"), ["pa"]);
        assert_eq!(on("n2"), ["pc", "pt"]);
    }

    /// The socket file exists from the launcher's bind() on, a moment before it listens: a
    /// connection refused then must be tried again, not taken as served.
    #[tokio::test]
    async fn a_launcher_socket_not_listening_yet_is_tried_again() {
        use rustix::net::{AddressFamily, SocketAddrUnix, SocketType};
        let root = tempfile::tempdir().unwrap();
        let uid = "5b0f3c1e-8a8e-4c7e-9d55-1f0b8c9c2a10";
        let dir = root.path().join("sockets").join(uid);
        std::fs::create_dir_all(&dir).unwrap();
        let fd = rustix::net::socket(AddressFamily::UNIX, SocketType::STREAM, None).unwrap();
        rustix::net::bind(
            &fd,
            &SocketAddrUnix::new(dir.join(handoff::SOCKET)).unwrap(),
        )
        .unwrap();
        let known = KnownVmis::default();
        known.insert(
            &serde_json::from_value(serde_json::json!({
                "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                "metadata": {"name": "a", "namespace": "ns", "uid": uid},
                "spec": {"domain": {"devices": {}}},
            }))
            .unwrap(),
        );
        let stop = CancellationToken::new();
        let paths = Paths::Host {
            run_root: root.path().to_path_buf(),
        };
        let served = tokio::spawn(run(paths, "n1".into(), None, known, stop.clone()));
        // Several rounds find the socket and are refused.
        tokio::time::sleep(POLL * 5).await;
        rustix::net::listen(&fd, 1).unwrap();
        let listener = std::os::unix::net::UnixListener::from(fd);
        let accepted = tokio::task::spawn_blocking(move || {
            listener.set_nonblocking(true).unwrap();
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(5) {
                if listener.accept().is_ok() {
                    return true;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            false
        })
        .await
        .unwrap();
        stop.cancel();
        served.await.unwrap();
        assert!(
            accepted,
            "the handler never came back to the launcher's socket"
        );
    }

    /// N3 of the security review at bd37f96: where port-forward connects follows from the
    /// VMI and the pod IP the API server reports, whatever the launcher's directory holds.
    #[test]
    fn the_guest_address_comes_from_the_vmi_and_the_api() {
        let vmi = |iface: serde_json::Value, net: serde_json::Value| -> VirtualMachineInstance {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                "metadata": {"name": "a", "namespace": "ns", "uid": "u1"},
                "spec": {"domain": {"devices": {"interfaces": [iface]}}, "networks": [net]},
            }))
            .unwrap()
        };
        let pod_ip: Ipv4Addr = "10.244.1.7".parse().unwrap();
        let masq = vmi(
            serde_json::json!({"name": "default", "masquerade": {}}),
            serde_json::json!({"name": "default", "pod": {}}),
        );
        assert_eq!(
            guest_address(&masq, Some(pod_ip)).unwrap(),
            GuestAddress::InPod("10.0.2.2".parse().unwrap())
        );
        let masq_cidr = vmi(
            serde_json::json!({"name": "default", "masquerade": {}}),
            serde_json::json!({"name": "default", "pod": {"vmNetworkCIDR": "192.168.7.0/29"}}),
        );
        assert_eq!(
            guest_address(&masq_cidr, None).unwrap(),
            GuestAddress::InPod("192.168.7.2".parse().unwrap())
        );
        let bridge = vmi(
            serde_json::json!({"name": "default", "bridge": {}}),
            serde_json::json!({"name": "default", "pod": {}}),
        );
        assert_eq!(
            guest_address(&bridge, Some(pod_ip)).unwrap(),
            GuestAddress::PodNetwork(pod_ip)
        );
        assert!(matches!(
            guest_address(&bridge, None),
            Err(GuestConnectError::NoNetwork)
        ));
        let none: VirtualMachineInstance = serde_json::from_value(serde_json::json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "a", "namespace": "ns", "uid": "u1"},
            "spec": {"domain": {"devices": {}}},
        }))
        .unwrap();
        assert!(matches!(
            guest_address(&none, Some(pod_ip)),
            Err(GuestConnectError::NoNetwork)
        ));
    }

    #[test]
    fn a_launcher_not_found_is_looked_for_less_and_less_often() {
        let mut pace = ScanPace::default();
        let t0 = Instant::now();
        assert!(pace.due(true, t0));
        // Not again before the pause, which doubles up to its bound.
        assert!(!pace.due(false, t0 + POLL / 2));
        assert!(pace.due(false, t0 + POLL));
        let mut at = t0 + POLL;
        let mut looks = 0;
        while at < t0 + Duration::from_secs(10) {
            at += POLL;
            if pace.due(false, at) {
                looks += 1;
            }
        }
        assert!(
            looks <= 8,
            "{looks} looks in 10 s for a launcher stuck before its sockets"
        );
        // A new launcher is looked for at once.
        assert!(pace.due(true, at));
    }

    #[test]
    fn socket_directories_name_their_vmi() {
        let uid = "5b0f3c1e-8a8e-4c7e-9d55-1f0b8c9c2a10";
        assert_eq!(uid_of_dir(uid), uid);
        assert_eq!(uid_of_dir(&format!("{uid}-1a2b3c4d")), uid);
        assert_eq!(uid_of_dir("short"), "short");
    }
}
