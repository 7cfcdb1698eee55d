//! The network plan: what a VMI's pod-network interface needs inside its launcher pod's
//! network namespace, computed from the VMI spec and the pod interface's addresses alone
//! (no side effects, so every binding is unit-tested), and rendered as the `ip -batch` and
//! `nft -f` scripts the executor runs.

use std::fmt::{self, Write as _};
use std::net::Ipv4Addr;

use kubevirt_api::vmi::{Interface, VirtualMachineInstanceSpec};

/// The bridge the tap and (for the bridge binding) the pod interface hang off, named as
/// KubeVirt names it, so tools and runbooks written for KubeVirt find it.
pub const BRIDGE: &str = "k6t-eth0";
/// The tap device QEMU opens.
pub const TAP: &str = "tap0";
/// The pod's interface on the cluster network.
pub const POD_INTERFACE: &str = "eth0";
/// The uid (and gid) QEMU runs as in the launcher pod; it owns the tap, so QEMU can open it
/// without `CAP_NET_ADMIN`.
pub const QEMU_UID: u32 = kubevirt_api::LAUNCHER_UID;
/// nftables table holding the masquerade rules.
pub const NFT_TABLE: &str = "kubevirt_rs";
/// KubeVirt's default guest network for masquerade.
pub const DEFAULT_VM_CIDR: &str = "10.0.2.0/24";
/// Address the bridge takes for the bridge binding: link-local, so it never clashes with
/// the pod network, and the DHCP server has a source address (as KubeVirt's 169.254.75.10).
pub const BRIDGE_BINDING_ADDRESS: Ipv4Addr = Ipv4Addr::new(169, 254, 75, 10);
/// DHCP lease time: infinite, the addresses live as long as the pod.
pub const INFINITE_LEASE: u32 = u32::MAX;

/// An IPv4 address with its prefix length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Cidr {
    /// The address.
    pub addr: Ipv4Addr,
    /// Prefix length, 0–32.
    pub prefix: u8,
}

impl Cidr {
    /// Parses `a.b.c.d/n`.
    pub fn parse(s: &str) -> Option<Self> {
        let (a, p) = s.split_once('/')?;
        let prefix: u8 = p.parse().ok()?;
        (prefix <= 32).then_some(Self {
            addr: a.parse().ok()?,
            prefix,
        })
    }

    /// The network address.
    pub fn network(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.addr) & u32::from(self.netmask()))
    }

    /// The netmask.
    pub fn netmask(&self) -> Ipv4Addr {
        Ipv4Addr::from(
            u32::MAX
                .checked_shl(32 - u32::from(self.prefix))
                .unwrap_or(0),
        )
    }

    /// The `n`th address of the network (`1` is the first host).
    pub fn host(&self, n: u32) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.network()) + n)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// A MAC address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Mac(pub [u8; 6]);

impl Mac {
    /// Parses `aa:bb:cc:dd:ee:ff` (or with dashes, as KubeVirt accepts).
    pub fn parse(s: &str) -> Option<Self> {
        let mut out = [0u8; 6];
        let mut parts = s.split([':', '-']);
        for b in &mut out {
            let p = parts.next()?;
            if p.len() != 2 {
                return None;
            }
            *b = u8::from_str_radix(p, 16).ok()?;
        }
        parts.next().is_none().then_some(Self(out))
    }

    /// A locally administered unicast address derived from `seed` (the VMI's uid, say), so
    /// the same VMI gets the same MAC on every node it migrates to.
    pub fn derived(seed: &str) -> Self {
        // FNV-1a: stable across releases and platforms, unlike std's hasher.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in seed.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        let b = h.to_be_bytes();
        // 02:… is locally administered and unicast, never a vendor's.
        Self([0x02, b[3], b[4], b[5], b[6], b[7]])
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

/// The pod's own interface as the CNI plugin configured it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PodInterface {
    /// Its name (`eth0`).
    pub name: String,
    /// Its MAC address.
    pub mac: Mac,
    /// Its IPv4 address.
    pub address: Cidr,
    /// The default gateway, if the pod has one.
    pub gateway: Option<Ipv4Addr>,
    /// Its MTU.
    pub mtu: u32,
}

/// The pod's DNS configuration (its `/etc/resolv.conf`), handed to the guest by DHCP.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Dns {
    /// Name servers.
    pub servers: Vec<Ipv4Addr>,
    /// Search domains.
    pub search: Vec<String>,
}

impl Dns {
    /// Reads a resolv.conf: `nameserver` (IPv4 only) and `search` lines, others ignored.
    pub fn from_resolv_conf(text: &str) -> Self {
        let mut dns = Self::default();
        for line in text.lines() {
            let mut words = line.split_whitespace();
            match words.next() {
                Some("nameserver") => {
                    dns.servers
                        .extend(words.next().and_then(|w| w.parse::<Ipv4Addr>().ok()));
                }
                Some("search") => dns.search = words.map(str::to_string).collect(),
                _ => {}
            }
        }
        dns
    }
}

/// A transport protocol of a forwarded port.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

impl Protocol {
    fn nft(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
        }
    }
}

/// How the guest's NIC meets the pod network.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Binding {
    /// NAT behind the pod IP; `ports` empty forwards every port.
    Masquerade {
        /// The guest's network (`10.0.2.0/24`): the bridge takes the first host, the
        /// guest the second.
        vm_cidr: Cidr,
        /// Ports forwarded from the pod IP to the guest; empty means all.
        ports: Vec<(Protocol, u16)>,
    },
    /// The guest takes the pod's address and MAC; the pod interface joins the bridge.
    Bridge,
}

/// What the guest's DHCP client is told.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Lease {
    /// The guest NIC's MAC; the server answers no other client.
    pub mac: Mac,
    /// The guest's address.
    pub address: Cidr,
    /// Its default gateway.
    pub gateway: Option<Ipv4Addr>,
    /// The server's own address (DHCP option 54).
    pub server: Ipv4Addr,
    /// DNS.
    pub dns: Dns,
    /// MTU of the path (the pod interface's).
    pub mtu: u32,
    /// The guest's host name.
    pub hostname: Option<String>,
    /// Lease time in seconds.
    pub lease_secs: u32,
}

/// The whole plan for one VMI's pod-network interface.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NetworkPlan {
    /// The VMI interface's name (`default`).
    pub interface: String,
    /// The binding.
    pub binding: Binding,
    /// The pod interface as found.
    pub pod: PodInterface,
    /// For the bridge binding, the MAC the pod interface takes once the guest has its own.
    pub pod_new_mac: Option<Mac>,
    /// The bridge's address.
    pub bridge_address: Cidr,
    /// What the guest is told.
    pub lease: Lease,
}

/// Why a VMI's network cannot be planned. Each names the field at fault.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// An interface or network setting this node cannot realise.
    #[error("{field}: {reason}")]
    Invalid {
        /// The field (`spec.domain.devices.interfaces[0].ports[1].port`).
        field: String,
        /// Why.
        reason: String,
    },
}

fn invalid(field: String, reason: impl Into<String>) -> PlanError {
    PlanError::Invalid {
        field,
        reason: reason.into(),
    }
}

/// Facts about the VMI and its pod the plan needs beyond the spec.
#[derive(Clone, Debug)]
pub struct PlanInput<'a> {
    /// The VMI's spec.
    pub spec: &'a VirtualMachineInstanceSpec,
    /// Seed for a MAC when the interface names none (the VMI's uid).
    pub mac_seed: &'a str,
    /// The guest's host name (`spec.hostname`, else the VMI's name).
    pub hostname: Option<String>,
    /// The pod interface.
    pub pod: PodInterface,
    /// The pod's DNS.
    pub dns: Dns,
}

/// The index and interface of the VMI's pod-network interface, if it has one.
pub fn pod_interface(spec: &VirtualMachineInstanceSpec) -> Option<(usize, &Interface)> {
    let network = spec.networks.iter().flatten().find(|n| n.pod.is_some())?;
    spec.domain
        .devices
        .interfaces
        .iter()
        .flatten()
        .enumerate()
        .find(|(_, i)| i.name == network.name)
}

/// The MAC the guest's pod-network NIC has, as far as the spec decides it: the one set on
/// the interface, else for masquerade the one derived from `mac_seed` (the VMI's uid). For
/// the bridge binding without one, the guest takes the pod's: `None` here.
pub fn guest_mac(spec: &VirtualMachineInstanceSpec, mac_seed: &str) -> Option<Mac> {
    let (_, iface) = pod_interface(spec)?;
    match iface.mac_address.as_deref() {
        Some(m) => Mac::parse(m),
        None if iface.masquerade.is_some() => Some(Mac::derived(mac_seed)),
        None => None,
    }
}

/// Plans the pod-network interface of a VMI; `None` when it has none (no pod network, or no
/// interface on it).
pub fn plan(input: PlanInput<'_>) -> Result<Option<NetworkPlan>, PlanError> {
    let Some((i, iface)) = pod_interface(input.spec) else {
        return Ok(None);
    };
    let field = format!("spec.domain.devices.interfaces[{i}]");
    let guest_mac = match iface.mac_address.as_deref() {
        Some(m) => Some(Mac::parse(m).ok_or_else(|| {
            invalid(
                format!("{field}.macAddress"),
                format!("{m:?} is not a MAC address"),
            )
        })?),
        None => None,
    };
    let pod = input.pod;
    if iface.bridge.is_some() {
        if iface.ports.as_ref().is_some_and(|p| !p.is_empty()) {
            return Err(invalid(
                format!("{field}.ports"),
                "ports apply to the masquerade binding only",
            ));
        }
        // The guest takes over the pod's MAC too (unless one is set), so the CNI plugin's
        // view of the pod (ARP, anti-spoofing) stays true; the pod interface gets another.
        let mac = guest_mac.unwrap_or(pod.mac);
        let lease = Lease {
            mac,
            address: pod.address,
            gateway: pod.gateway,
            server: BRIDGE_BINDING_ADDRESS,
            dns: input.dns,
            mtu: pod.mtu,
            hostname: input.hostname,
            lease_secs: INFINITE_LEASE,
        };
        let pod_new_mac = Mac::derived(&format!("{}/pod", input.mac_seed));
        return Ok(Some(NetworkPlan {
            interface: iface.name.clone(),
            binding: Binding::Bridge,
            bridge_address: Cidr {
                addr: BRIDGE_BINDING_ADDRESS,
                prefix: 32,
            },
            pod,
            pod_new_mac: Some(pod_new_mac),
            lease,
        }));
    }
    if iface.masquerade.is_none() {
        let binding = if iface.sriov.is_some() {
            "sriov"
        } else if iface.passt_binding.is_some() {
            "passtBinding"
        } else if iface.binding.is_some() {
            "binding"
        } else {
            "none"
        };
        return Err(invalid(
            field,
            format!("binding {binding} on the pod network is not supported (masquerade or bridge)"),
        ));
    }
    let cidr_field = "spec.networks[].pod.vmNetworkCIDR";
    let cidr_text = input
        .spec
        .networks
        .iter()
        .flatten()
        .find_map(|n| n.pod.as_ref()?.vm_network_cidr.clone())
        .unwrap_or_else(|| DEFAULT_VM_CIDR.to_string());
    let vm_cidr = Cidr::parse(&cidr_text).ok_or_else(|| {
        invalid(
            cidr_field.into(),
            format!("{cidr_text:?} is not an IPv4 CIDR"),
        )
    })?;
    if vm_cidr.prefix > 30 {
        return Err(invalid(
            cidr_field.into(),
            format!("{cidr_text}: needs room for a gateway and the guest (/30 or larger)"),
        ));
    }
    let gateway = Cidr {
        addr: vm_cidr.host(1),
        prefix: vm_cidr.prefix,
    };
    let guest = Cidr {
        addr: vm_cidr.host(2),
        prefix: vm_cidr.prefix,
    };
    let mut ports = Vec::new();
    for (j, p) in iface.ports.iter().flatten().enumerate() {
        let proto = match p
            .protocol
            .as_deref()
            .map(str::to_ascii_uppercase)
            .as_deref()
        {
            None | Some("TCP") => Protocol::Tcp,
            Some("UDP") => Protocol::Udp,
            Some(other) => {
                return Err(invalid(
                    format!("{field}.ports[{j}].protocol"),
                    format!("{other:?}: TCP or UDP"),
                ));
            }
        };
        let port = u16::try_from(p.port)
            .ok()
            .filter(|p| *p > 0)
            .ok_or_else(|| {
                invalid(
                    format!("{field}.ports[{j}].port"),
                    format!("{}: 1–65535", p.port),
                )
            })?;
        if !ports.contains(&(proto, port)) {
            ports.push((proto, port));
        }
    }
    ports.sort();
    Ok(Some(NetworkPlan {
        interface: iface.name.clone(),
        binding: Binding::Masquerade { vm_cidr, ports },
        bridge_address: gateway,
        lease: Lease {
            mac: guest_mac.unwrap_or_else(|| Mac::derived(input.mac_seed)),
            address: guest,
            gateway: Some(gateway.addr),
            server: gateway.addr,
            dns: input.dns,
            mtu: pod.mtu,
            hostname: input.hostname,
            lease_secs: INFINITE_LEASE,
        },
        pod,
        pod_new_mac: None,
    }))
}

impl NetworkPlan {
    /// Commands for `ip -batch -` that build the bridge and the tap (and, for the bridge
    /// binding, hand the pod interface over to the bridge).
    pub fn ip_batch(&self) -> String {
        let mut s = String::new();
        let pod = &self.pod.name;
        let mtu = self.pod.mtu;
        // Writing to a String cannot fail.
        let mut line = |l: String| {
            let _ = writeln!(s, "{l}");
        };
        line(format!("link add {BRIDGE} type bridge"));
        line(format!("link set {BRIDGE} mtu {mtu}"));
        if let (Binding::Bridge, Some(new_mac)) = (&self.binding, self.pod_new_mac) {
            line(format!("address del {} dev {pod}", self.pod.address));
            line(format!("link set {pod} down"));
            line(format!("link set {pod} address {new_mac}"));
            line(format!("link set {pod} master {BRIDGE}"));
            line(format!("link set {pod} up"));
        }
        line(format!("address add {} dev {BRIDGE}", self.bridge_address));
        line(format!(
            "tuntap add dev {TAP} mode tap user {QEMU_UID} group {QEMU_UID} vnet_hdr"
        ));
        line(format!("link set {TAP} mtu {mtu} master {BRIDGE}"));
        line(format!("link set {TAP} up"));
        line(format!("link set {BRIDGE} up"));
        s
    }

    /// Commands for `ip -batch -` that undo [`Self::ip_batch`] (deleting the bridge frees
    /// its ports; the pod interface gets its address and MAC back).
    pub fn ip_teardown(&self) -> String {
        let mut s = format!("link del {TAP}\nlink del {BRIDGE}\n");
        if self.binding == Binding::Bridge {
            let pod = &self.pod.name;
            let _ = writeln!(s, "link set {pod} down");
            let _ = writeln!(s, "link set {pod} address {}", self.pod.mac);
            let _ = writeln!(s, "address add {} dev {pod}", self.pod.address);
            let _ = writeln!(s, "link set {pod} up");
            if let Some(gw) = self.pod.gateway {
                let _ = writeln!(s, "route add default via {gw} dev {pod}");
            }
        }
        s
    }

    /// The nftables ruleset for masquerade (`nft -f -`), `None` for the bridge binding.
    ///
    /// Traffic to the pod IP on the forwarded ports (all if none are listed) is DNATed to
    /// the guest, the guest's own traffic leaves as the pod IP, and connections to
    /// 127.0.0.1 inside the pod (`kubectl port-forward` to the launcher pod) reach the guest
    /// too. Connection tracking returns the replies.
    pub fn nft_ruleset(&self) -> Option<String> {
        let Binding::Masquerade { ports, .. } = &self.binding else {
            return None;
        };
        let guest = self.lease.address.addr;
        let gateway = self.bridge_address.addr;
        let pod = &self.pod.name;
        let mut matches: Vec<String> = Vec::new();
        if ports.is_empty() {
            matches.push("meta l4proto { tcp, udp }".into());
        } else {
            for proto in [Protocol::Tcp, Protocol::Udp] {
                let list: Vec<String> = ports
                    .iter()
                    .filter(|(p, _)| *p == proto)
                    .map(|(_, n)| n.to_string())
                    .collect();
                if !list.is_empty() {
                    matches.push(format!("{} dport {{ {} }}", proto.nft(), list.join(", ")));
                }
            }
        }
        let mut s = String::new();
        let _ = writeln!(s, "table ip {NFT_TABLE} {{");
        let _ = writeln!(s, "  chain prerouting {{");
        let _ = writeln!(
            s,
            "    type nat hook prerouting priority dstnat; policy accept;"
        );
        for m in &matches {
            let _ = writeln!(s, "    iifname \"{pod}\" {m} counter dnat to {guest}");
        }
        let _ = writeln!(s, "  }}");
        let _ = writeln!(s, "  chain output {{");
        let _ = writeln!(s, "    type nat hook output priority -100; policy accept;");
        for m in &matches {
            let _ = writeln!(s, "    ip daddr 127.0.0.1 {m} counter dnat to {guest}");
        }
        let _ = writeln!(s, "  }}");
        let _ = writeln!(s, "  chain postrouting {{");
        let _ = writeln!(
            s,
            "    type nat hook postrouting priority srcnat; policy accept;"
        );
        let _ = writeln!(
            s,
            "    ip saddr {guest} oifname \"{pod}\" counter masquerade"
        );
        let _ = writeln!(
            s,
            "    ip saddr 127.0.0.1 oifname \"{BRIDGE}\" counter snat to {gateway}"
        );
        let _ = writeln!(s, "  }}");
        let _ = writeln!(s, "}}");
        Some(s)
    }

    /// Kernel settings of the pod's network namespace the binding needs (path under
    /// `/proc/sys`, value).
    pub fn sysctls(&self) -> Vec<(String, &'static str)> {
        match self.binding {
            Binding::Masquerade { .. } => vec![
                ("net/ipv4/ip_forward".into(), "1"),
                // Lets 127.0.0.1 traffic be routed to the guest once DNATed.
                (format!("net/ipv4/conf/{BRIDGE}/route_localnet"), "1"),
            ],
            Binding::Bridge => Vec::new(),
        }
    }

    /// The address the VMI reports for this interface: the pod IP for masquerade (what
    /// other pods reach it by, as KubeVirt reports), the guest's own for bridge.
    pub fn reported_address(&self) -> Ipv4Addr {
        match self.binding {
            Binding::Masquerade { .. } => self.pod.address.addr,
            Binding::Bridge => self.lease.address.addr,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubevirt_api::vmi::{InterfaceBinding, Network, PodNetwork, Port};

    fn pod() -> PodInterface {
        PodInterface {
            name: "eth0".into(),
            mac: Mac::parse("0a:58:0a:f4:00:07").unwrap(),
            address: Cidr::parse("10.244.0.7/24").unwrap(),
            gateway: Some("10.244.0.1".parse().unwrap()),
            mtu: 1450,
        }
    }

    fn spec(iface: Interface, pod_net: PodNetwork) -> VirtualMachineInstanceSpec {
        let mut s = VirtualMachineInstanceSpec::default();
        s.domain.devices.interfaces = Some(vec![iface]);
        s.networks = Some(vec![Network {
            name: "default".into(),
            pod: Some(pod_net),
            ..Default::default()
        }]);
        s
    }

    fn masquerade(ports: Option<Vec<Port>>) -> Interface {
        Interface {
            name: "default".into(),
            masquerade: Some(InterfaceBinding {}),
            ports,
            ..Default::default()
        }
    }

    fn input(spec: &VirtualMachineInstanceSpec) -> PlanInput<'_> {
        PlanInput {
            spec,
            mac_seed: "uid-1",
            hostname: Some("vm1".into()),
            pod: pod(),
            dns: Dns::from_resolv_conf(
                "search ns1.svc.cluster.local svc.cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n",
            ),
        }
    }

    #[test]
    fn masquerade_gives_the_guest_10_0_2_2_behind_the_pod_ip() {
        let s = spec(masquerade(None), PodNetwork::default());
        let p = plan(input(&s)).unwrap().unwrap();
        assert_eq!(p.lease.address, Cidr::parse("10.0.2.2/24").unwrap());
        assert_eq!(p.lease.gateway, Some("10.0.2.1".parse().unwrap()));
        assert_eq!(p.lease.server, "10.0.2.1".parse::<Ipv4Addr>().unwrap());
        assert_eq!(
            p.lease.dns.servers,
            vec!["10.96.0.10".parse::<Ipv4Addr>().unwrap()]
        );
        assert_eq!(
            p.lease.dns.search,
            vec!["ns1.svc.cluster.local", "svc.cluster.local"]
        );
        assert_eq!(p.lease.mtu, 1450);
        assert_eq!(p.bridge_address.to_string(), "10.0.2.1/24");
        assert_eq!(p.reported_address().to_string(), "10.244.0.7");
        // Stable per VMI (the same on a migration target), locally administered.
        assert_eq!(p.lease.mac, Mac::derived("uid-1"));
        assert_eq!(p.lease.mac.0[0], 0x02);
        assert_eq!(guest_mac(&s, "uid-1"), Some(p.lease.mac));
        let batch = p.ip_batch();
        assert!(
            batch.contains("address add 10.0.2.1/24 dev k6t-eth0"),
            "{batch}"
        );
        assert!(
            batch.contains("tuntap add dev tap0 mode tap user 107 group 107"),
            "{batch}"
        );
        assert!(
            !batch
                .lines()
                .any(|l| l.contains("dev eth0") || l.starts_with("link set eth0")),
            "the pod interface is untouched: {batch}"
        );
        let nft = p.nft_ruleset().unwrap();
        assert!(
            nft.contains("iifname \"eth0\" meta l4proto { tcp, udp } counter dnat to 10.0.2.2"),
            "{nft}"
        );
        assert!(
            nft.contains("ip saddr 10.0.2.2 oifname \"eth0\" counter masquerade"),
            "{nft}"
        );
        assert!(
            p.sysctls()
                .iter()
                .any(|(k, v)| k == "net/ipv4/ip_forward" && *v == "1")
        );
    }

    #[test]
    fn masquerade_forwards_exactly_the_listed_ports() {
        let ports = vec![
            Port {
                port: 80,
                ..Default::default()
            },
            Port {
                port: 53,
                protocol: Some("UDP".into()),
                ..Default::default()
            },
            Port {
                port: 22,
                protocol: Some("tcp".into()),
                name: Some("ssh".into()),
            },
            Port {
                port: 80,
                ..Default::default()
            },
        ];
        let s = spec(masquerade(Some(ports)), PodNetwork::default());
        let p = plan(input(&s)).unwrap().unwrap();
        let nft = p.nft_ruleset().unwrap();
        assert!(
            nft.contains("iifname \"eth0\" tcp dport { 22, 80 } counter dnat to 10.0.2.2"),
            "{nft}"
        );
        assert!(
            nft.contains("iifname \"eth0\" udp dport { 53 } counter dnat to 10.0.2.2"),
            "{nft}"
        );
        assert!(!nft.contains("l4proto"), "{nft}");
    }

    #[test]
    fn masquerade_honours_vm_network_cidr_and_mac() {
        let mut iface = masquerade(None);
        iface.mac_address = Some("DE-AD-00-00-BE-AF".into());
        let s = spec(
            iface,
            PodNetwork {
                vm_network_cidr: Some("192.168.7.0/29".into()),
                ..Default::default()
            },
        );
        let p = plan(input(&s)).unwrap().unwrap();
        assert_eq!(p.lease.address.to_string(), "192.168.7.2/29");
        assert_eq!(p.bridge_address.to_string(), "192.168.7.1/29");
        assert_eq!(p.lease.mac.to_string(), "de:ad:00:00:be:af");
    }

    #[test]
    fn bridge_hands_the_pod_address_and_mac_to_the_guest() {
        let s = spec(
            Interface {
                name: "default".into(),
                bridge: Some(InterfaceBinding {}),
                ..Default::default()
            },
            PodNetwork::default(),
        );
        let p = plan(input(&s)).unwrap().unwrap();
        assert_eq!(p.lease.address.to_string(), "10.244.0.7/24");
        assert_eq!(p.lease.gateway, Some("10.244.0.1".parse().unwrap()));
        assert_eq!(p.lease.mac, pod().mac);
        assert_eq!(p.lease.server, BRIDGE_BINDING_ADDRESS);
        assert_ne!(p.pod_new_mac, Some(pod().mac));
        assert_eq!(p.reported_address().to_string(), "10.244.0.7");
        assert!(p.nft_ruleset().is_none());
        let batch = p.ip_batch();
        let del = batch.find("address del 10.244.0.7/24 dev eth0").unwrap();
        let enslave = batch.find("link set eth0 master k6t-eth0").unwrap();
        assert!(del < enslave, "{batch}");
        let undo = p.ip_teardown();
        assert!(
            undo.contains("address add 10.244.0.7/24 dev eth0"),
            "{undo}"
        );
        assert!(
            undo.contains("route add default via 10.244.0.1 dev eth0"),
            "{undo}"
        );
    }

    #[test]
    fn no_pod_network_means_no_plan() {
        let mut s = spec(masquerade(None), PodNetwork::default());
        s.networks = Some(vec![]);
        assert_eq!(plan(input(&s)).unwrap(), None);
        let mut s = spec(masquerade(None), PodNetwork::default());
        s.domain.devices.interfaces = None;
        assert_eq!(plan(input(&s)).unwrap(), None);
    }

    #[test]
    fn bad_settings_name_their_field() {
        let bad_port = spec(
            masquerade(Some(vec![Port {
                port: 70000,
                ..Default::default()
            }])),
            PodNetwork::default(),
        );
        assert_eq!(
            plan(input(&bad_port)).unwrap_err(),
            PlanError::Invalid {
                field: "spec.domain.devices.interfaces[0].ports[0].port".into(),
                reason: "70000: 1–65535".into()
            }
        );
        let bad_proto = spec(
            masquerade(Some(vec![Port {
                port: 1,
                protocol: Some("SCTP".into()),
                name: None,
            }])),
            PodNetwork::default(),
        );
        assert!(
            plan(input(&bad_proto))
                .unwrap_err()
                .to_string()
                .contains("ports[0].protocol")
        );
        let bad_cidr = spec(
            masquerade(None),
            PodNetwork {
                vm_network_cidr: Some("10.0.2.0/31".into()),
                ..Default::default()
            },
        );
        assert!(
            plan(input(&bad_cidr))
                .unwrap_err()
                .to_string()
                .contains("vmNetworkCIDR")
        );
        let mut sriov = masquerade(None);
        sriov.masquerade = None;
        sriov.sriov = Some(InterfaceBinding {});
        let s = spec(sriov, PodNetwork::default());
        assert!(
            plan(input(&s))
                .unwrap_err()
                .to_string()
                .contains("binding sriov")
        );
        let mut bad_mac = masquerade(None);
        bad_mac.mac_address = Some("02:00:00".into());
        let s = spec(bad_mac, PodNetwork::default());
        assert!(
            plan(input(&s))
                .unwrap_err()
                .to_string()
                .contains("macAddress")
        );
    }

    #[test]
    fn cidr_and_mac_parsing() {
        let c = Cidr::parse("10.1.2.3/16").unwrap();
        assert_eq!(c.network().to_string(), "10.1.0.0");
        assert_eq!(c.netmask().to_string(), "255.255.0.0");
        assert_eq!(
            Cidr::parse("10.0.0.0/0").unwrap().netmask().to_string(),
            "0.0.0.0"
        );
        assert_eq!(Cidr::parse("10.0.0.0/33"), None);
        assert_eq!(Mac::parse("02:00:00:00:00:01:02"), None);
        assert_eq!(Mac::parse("02:00:00:00:00:1"), None);
    }
}
