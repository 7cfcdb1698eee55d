//! Configuration files for containerd, CNI and kubelet.

use super::{
    BRIDGE, BRIDGE_IP, BRIDGE_SUBNET, Layout, POD_RANGE, SERVICE_CIDR, images::PAUSE_IMAGE,
};

/// containerd 1.6 (config version 2), entirely under our work dir so that it coexists with a
/// system containerd and leaves nothing behind.
pub fn containerd(layout: &Layout) -> String {
    containerd_at(
        layout,
        &layout.state.join("containerd"),
        &layout.containerd_socket,
    )
}

/// A containerd with its own root and state under `d`, serving on `sock`; the CNI setup (and
/// with it the IPAM store, whose file lock keeps two containerds from handing out one pod IP
/// twice) is the cluster's.
pub fn containerd_at(layout: &Layout, d: &std::path::Path, sock: &std::path::Path) -> String {
    format!(
        r#"version = 2
root = "{root}"
state = "{state}"
# Lists of plugins we do not use; they only log errors on this machine.
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "{sock}"

[ttrpc]
  address = "{sock}.ttrpc"

[debug]
  address = ""

[metrics]
  address = ""

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "{pause}"
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    enable_selinux = false
    # Root here lacks CAP_SYS_RESOURCE: without this runc fails every sandbox trying to lower
    # its oom_score_adj ("can't get final child's PID from pipe: EOF").
    restrict_oom_score_adj = true
    # A Block-mode volume's device node takes the container's runAsUser/runAsGroup, so the
    # unprivileged launcher (uid 107) can open its claim; KubeVirt asks the same of every
    # cluster that gives non-root VMs block volumes.
    device_ownership_from_security_context = true
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
          BinaryName = "/usr/sbin/runc"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "{cni}"
      max_conf_num = 1
  [plugins."io.containerd.internal.v1.opt"]
    path = "{opt}"
"#,
        root = d.join("root").display(),
        state = d.join("state").display(),
        sock = sock.display(),
        pause = PAUSE_IMAGE,
        cni = layout.state.join("cni/net.d").display(),
        opt = d.join("opt").display(),
    )
}

/// The pod network: our bridge, no default route and no masquerading, so pods reach only each
/// other, the node (bridge IP) and the service range.
pub fn cni(layout: &Layout) -> String {
    serde_json::json!({
        "cniVersion": "0.4.0",
        "name": "kubevirt-rs",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": true,
                "isDefaultGateway": false,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "dataDir": layout.state.join("cni/ipam").display().to_string(),
                    "ranges": [[{
                        "subnet": BRIDGE_SUBNET,
                        "rangeStart": POD_RANGE.0,
                        "rangeEnd": POD_RANGE.1,
                        "gateway": BRIDGE_IP,
                    }]],
                    "routes": [{ "dst": SERVICE_CIDR }],
                },
            },
            { "type": "portmap", "capabilities": { "portMappings": true } },
        ],
    })
    .to_string()
}

/// KubeletConfiguration: everything on loopback, cgroupfs on this cgroup v1 host, state under
/// our work dir wherever kubelet lets us choose.
pub fn kubelet(layout: &Layout) -> String {
    kubelet_for(
        layout,
        &KubeletSpec {
            address: super::BRIDGE_IP.into(),
            cert: "kubelet".into(),
            port: super::KUBELET_PORT,
            healthz_port: super::KUBELET_HEALTHZ_PORT,
            containerd_socket: layout.containerd_socket.clone(),
            state: layout.state.clone(),
            cgroup_root: None,
        },
    )
}

/// What differs between the kubelets of one machine.
pub struct KubeletSpec {
    /// Where the kubelet API listens: the node IP, which kube-apiserver dials for logs,
    /// exec and port-forward (`--kubelet-preferred-address-types=InternalIP`).
    pub address: String,
    /// Serving certificate and key in `pki/` (`<cert>.crt`, SAN = the node IP).
    pub cert: String,
    pub port: u16,
    pub healthz_port: u16,
    pub containerd_socket: std::path::PathBuf,
    /// Pod logs and volume plugins go below.
    pub state: std::path::PathBuf,
    /// A cgroup root of its own (`/` when unset): a kubelet removes pod cgroups it does
    /// not know under its `kubepods`, so two must never share one.
    pub cgroup_root: Option<String>,
}

/// KubeletConfiguration of one kubelet.
pub fn kubelet_for(layout: &Layout, k: &KubeletSpec) -> String {
    let pki = layout.state.join("pki");
    let cgroup_root = k
        .cgroup_root
        .as_ref()
        .map(|r| format!("cgroupRoot: {r}\n"))
        .unwrap_or_default();
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {address}
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {pki}/ca.crt
authorization:
  mode: Webhook
tlsCertFile: {pki}/{cert}.crt
tlsPrivateKeyFile: {pki}/{cert}.key
cgroupDriver: cgroupfs
{cgroup_root}failCgroupV1: false
containerRuntimeEndpoint: unix://{sock}
podLogsDir: {state}/pod-logs
volumePluginDir: {state}/volume-plugins
failSwapOn: false
resolvConf: {state}/resolv.conf
clusterDomain: cluster.local
makeIPTablesUtilChains: false
serializeImagePulls: false
# Our images cannot be pulled again (there is no registry): never garbage-collect them.
imageGCHighThresholdPercent: 100
# The node's disk is the host's, shared with cargo's target/ and whatever else the host
# runs: a percentage threshold (2 % of a 250 GB disk is 5 GB) evicted virt-apiserver,
# etcd and every virt-handler in CI while gigabytes were still free. As kind does, disk
# never evicts here; a really full disk fails loudly on its own.
evictionHard:
  memory.available: 100Mi
  nodefs.available: "0%"
  imagefs.available: "0%"
  nodefs.inodesFree: "0%"
  imagefs.inodesFree: "0%"
"#,
        pki = pki.display(),
        sock = k.containerd_socket.display(),
        state = k.state.display(),
        port = k.port,
        address = k.address,
        cert = k.cert,
        healthz = k.healthz_port,
    )
}
