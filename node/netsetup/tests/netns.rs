//! The plan realised for real: each test creates two network namespaces of its own — a
//! "pod" (eth0 10.99.0.2/24, default route via 10.99.0.1, as a CNI plugin leaves it) and a
//! "client" (10.99.0.1, another pod on the node) joined by a veth pair — applies the plan in
//! the pod namespace, answers DHCP from the socket `exec` opens there, and boots the real
//! test guest under QEMU in the pod namespace on the tap. No traffic leaves the namespaces.
//! Needs root (namespaces, tap, nftables), `ip`, `nft` and QEMU.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use kubevirt_api::vmi::{
    Interface, InterfaceBinding, Network, PodNetwork, Port, VirtualMachineInstanceSpec,
};
use virt_netsetup::exec::{self, NetNs};
use virt_netsetup::plan::{BRIDGE, NFT_TABLE, TAP};
use virt_netsetup::{Dns, NetworkPlan, PlanInput, plan};
use virt_testguest::{
    BANNER, BareVm, Guest, default_dir, ensure, fetch_arg, fetched_line, lease_line,
};

const POD_IP: &str = "10.99.0.2";
const CLIENT_IP: &str = "10.99.0.1";
const BOOT: Duration = Duration::from_secs(90);

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Two namespaces of this test, removed on drop.
struct Net {
    pod: String,
    client: String,
}

impl Net {
    fn new() -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let tag = format!("kvrs{}-{n}", std::process::id());
        let net = Self {
            pod: format!("{tag}-pod"),
            client: format!("{tag}-cli"),
        };
        ip(&["netns", "add", &net.pod]);
        ip(&["netns", "add", &net.client]);
        // Created straight into the namespaces: the host's own namespace never sees it.
        ip(&[
            "link",
            "add",
            "veth-c",
            "netns",
            &net.client,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            &net.pod,
        ]);
        for (ns, dev, addr) in [
            (&net.client, "veth-c", CLIENT_IP),
            (&net.pod, "eth0", POD_IP),
        ] {
            ip(&["-n", ns, "link", "set", "lo", "up"]);
            ip(&[
                "-n",
                ns,
                "address",
                "add",
                &format!("{addr}/24"),
                "dev",
                dev,
            ]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
        }
        ip(&["-n", &net.pod, "route", "add", "default", "via", CLIENT_IP]);
        net
    }

    fn pod_ns(&self) -> NetNs {
        NetNs::open(&PathBuf::from(format!("/run/netns/{}", self.pod))).expect("pod netns")
    }

    fn client_ns(&self) -> NetNs {
        NetNs::open(&PathBuf::from(format!("/run/netns/{}", self.client))).expect("client netns")
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in [&self.pod, &self.client] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

fn spec(iface: Interface) -> VirtualMachineInstanceSpec {
    let mut s = VirtualMachineInstanceSpec::default();
    s.domain.devices.interfaces = Some(vec![iface]);
    s.networks = Some(vec![Network {
        name: "default".into(),
        pod: Some(PodNetwork::default()),
        ..Default::default()
    }]);
    s
}

fn masquerade(ports: &[u16]) -> Interface {
    Interface {
        name: "default".into(),
        masquerade: Some(InterfaceBinding {}),
        ports: (!ports.is_empty()).then(|| {
            ports
                .iter()
                .map(|p| Port {
                    port: i32::from(*p),
                    ..Default::default()
                })
                .collect()
        }),
        ..Default::default()
    }
}

fn plan_for(net: &Net, iface: Interface) -> NetworkPlan {
    let pod = exec::read_pod_interface(&net.pod_ns(), "eth0").expect("read eth0");
    assert_eq!(pod.address.to_string(), format!("{POD_IP}/24"));
    assert_eq!(pod.gateway, Some(CLIENT_IP.parse().unwrap()));
    let s = spec(iface);
    plan(PlanInput {
        spec: &s,
        mac_seed: "test-vmi-uid",
        hostname: Some("testvm".into()),
        pod,
        dns: Dns {
            servers: vec!["10.96.0.10".parse().unwrap()],
            search: vec!["default.svc.cluster.local".into()],
        },
    })
    .expect("plan")
    .expect("a pod interface")
}

/// Applies the plan, starts the DHCP server on the bridge and boots the guest on the tap.
fn boot(net: &Net, g: &Guest, p: &NetworkPlan, kernel_extra: &str) -> BareVm {
    let ns = net.pod_ns();
    exec::apply(&ns, p).expect("apply the plan");
    let socket = exec::dhcp_socket(&ns, BRIDGE).expect("DHCP socket");
    let lease = p.lease.clone();
    std::thread::spawn(move || exec::serve_dhcp(&socket, &lease));
    let mac = p.lease.mac.to_string();
    BareVm::start(
        g,
        &["ip", "netns", "exec", &net.pod],
        &[
            "-netdev",
            &format!("tap,id=n0,ifname={TAP},script=no,downscript=no"),
            "-device",
            &format!("virtio-net-pci,netdev=n0,mac={mac}"),
        ],
        kernel_extra,
    )
    .expect("qemu")
}

/// An HTTP GET from inside `ns`.
fn http_get(ns: &NetNs, addr: &str) -> std::io::Result<String> {
    let addr: SocketAddr = addr.parse().expect("address");
    ns.run(move || {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.write_all(b"GET / HTTP/1.0\r\n\r\n")?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        Ok(out)
    })
    .expect("enter netns")
}

/// A one-shot HTTP server in the client namespace; returns the address it saw the guest's
/// request come from.
fn client_server(net: &Net) -> std::sync::mpsc::Receiver<SocketAddr> {
    let listener = net
        .client_ns()
        .run(|| TcpListener::bind((CLIENT_IP, 8080)))
        .expect("enter client netns")
        .expect("bind client server");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        if let Ok((mut s, peer)) = listener.accept() {
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
            let _ = s.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\npong\n");
            let _ = tx.send(peer);
        }
    });
    rx
}

fn assert_clean(net: &Net) {
    let (links, tables) = exec::inventory(&net.pod_ns()).expect("inventory");
    assert!(
        !links.iter().any(|l| l == TAP || l == BRIDGE),
        "left behind: {links:?}"
    );
    assert!(
        !tables.iter().any(|t| t.contains(NFT_TABLE)),
        "left behind: {tables:?}"
    );
}

#[test]
fn masquerade_guest_is_reached_by_the_pod_ip_and_reaches_out_as_it() {
    let g = ensure(&default_dir()).expect("test guest");
    let net = Net::new();
    let p = plan_for(&net, masquerade(&[]));
    let seen_from = client_server(&net);
    let url = format!("{CLIENT_IP}:8080");
    let vm = boot(&net, &g, &p, &fetch_arg(&url));
    vm.wait_for(
        &format!("{}gw 10.0.2.1", lease_line("eth0", "10.0.2.2/24")),
        BOOT,
    )
    .expect("lease");
    vm.wait_for(BANNER, BOOT).expect("banner");

    // Another pod reaches the guest by the pod IP; the guest sees it.
    let page = http_get(&net.client_ns(), &format!("{POD_IP}:80")).expect("HTTP to the pod IP");
    assert!(page.contains("inet 10.0.2.2/24"), "{page}");
    // Inside the pod, 127.0.0.1 reaches the guest (kubectl port-forward to the pod).
    let page = http_get(&net.pod_ns(), "127.0.0.1:80").expect("HTTP to 127.0.0.1 in the pod");
    assert!(page.contains("inet 10.0.2.2/24"), "{page}");
    // The guest reaches the other pod, as the pod IP.
    vm.wait_for(
        &format!("{}pong", fetched_line(&url)),
        Duration::from_secs(30),
    )
    .expect("the guest's fetch");
    let peer = seen_from
        .recv_timeout(Duration::from_secs(5))
        .expect("guest's connection");
    assert_eq!(peer.ip().to_string(), POD_IP, "masqueraded to the pod IP");

    drop(vm);
    exec::teardown(&net.pod_ns(), &p).expect("teardown");
    assert_clean(&net);
}

#[test]
fn masquerade_forwards_only_the_listed_ports() {
    let g = ensure(&default_dir()).expect("test guest");
    let net = Net::new();
    let p = plan_for(&net, masquerade(&[81]));
    let vm = boot(&net, &g, &p, "");
    vm.wait_for(BANNER, BOOT).expect("banner");
    let r = http_get(&net.client_ns(), &format!("{POD_IP}:80"));
    assert!(
        r.as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused),
        "port 80 is not in ports: [81], yet: {r:?}"
    );
    drop(vm);
    exec::teardown(&net.pod_ns(), &p).expect("teardown");
    assert_clean(&net);
}

#[test]
fn bridge_guest_takes_the_pod_address() {
    let g = ensure(&default_dir()).expect("test guest");
    let net = Net::new();
    let p = plan_for(
        &net,
        Interface {
            name: "default".into(),
            bridge: Some(InterfaceBinding {}),
            ..Default::default()
        },
    );
    let before = exec::read_pod_interface(&net.pod_ns(), "eth0").expect("eth0");
    let seen_from = client_server(&net);
    let url = format!("{CLIENT_IP}:8080");
    let vm = boot(&net, &g, &p, &fetch_arg(&url));
    vm.wait_for(
        &format!(
            "{}gw {CLIENT_IP}",
            lease_line("eth0", &format!("{POD_IP}/24"))
        ),
        BOOT,
    )
    .expect("the pod's address by DHCP");
    vm.wait_for(BANNER, BOOT).expect("banner");
    let page = http_get(&net.client_ns(), &format!("{POD_IP}:80")).expect("HTTP to the pod IP");
    assert!(page.contains(&format!("inet {POD_IP}/24")), "{page}");
    vm.wait_for(
        &format!("{}pong", fetched_line(&url)),
        Duration::from_secs(30),
    )
    .expect("the guest's fetch");
    let peer = seen_from
        .recv_timeout(Duration::from_secs(5))
        .expect("guest's connection");
    assert_eq!(peer.ip().to_string(), POD_IP);

    drop(vm);
    exec::teardown(&net.pod_ns(), &p).expect("teardown");
    assert_clean(&net);
    let after = exec::read_pod_interface(&net.pod_ns(), "eth0").expect("eth0");
    assert_eq!(after, before, "the pod interface is given back as it was");
}

#[test]
fn failed_set_up_leaves_nothing_behind() {
    let net = Net::new();
    let mut p = plan_for(&net, masquerade(&[]));
    // A name nft refuses: the bridge and tap are made, then the rules fail.
    p.pod.name = "bad\"name".into();
    let err = exec::apply(&net.pod_ns(), &p).expect_err("nft must refuse the rules");
    assert!(
        err.to_string().contains("nft (masquerade rules) failed"),
        "{err}"
    );
    assert_clean(&net);
}
