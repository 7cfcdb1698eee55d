//! Configuration files for containerd, CNI and kubelet.

use super::{
    BRIDGE, BRIDGE_IP, BRIDGE_SUBNET, Layout, POD_RANGE, SERVICE_CIDR, images::PAUSE_IMAGE,
};

/// containerd 1.6 (config version 2), entirely under our work dir so that it coexists with a
/// system containerd and leaves nothing behind.
pub fn containerd(layout: &Layout) -> String {
    let d = layout.state.join("containerd");
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
        sock = layout.containerd_socket.display(),
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
    let pki = layout.state.join("pki");
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {pki}/ca.crt
authorization:
  mode: Webhook
tlsCertFile: {pki}/kubelet.crt
tlsPrivateKeyFile: {pki}/kubelet.key
cgroupDriver: cgroupfs
failCgroupV1: false
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
evictionHard:
  memory.available: 100Mi
  nodefs.available: 2%
  imagefs.available: 2%
  nodefs.inodesFree: 2%
"#,
        pki = pki.display(),
        sock = layout.containerd_socket.display(),
        state = layout.state.display(),
    )
}
