//! The guest's network stack under bare QEMU: it takes its address by DHCP, serves HTTP
//! on port 80 and echoes UDP on port 7. QEMU's user-mode network is the DHCP server here and forwards one loopback
//! port to the guest, so no namespace or privilege is needed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::time::Duration;

use virt_testguest::{BANNER, BareVm, UDP_ECHO_PORT, default_dir, ensure, lease_line};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn http_get(port: u16) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(b"GET / HTTP/1.0\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

#[test]
fn guest_takes_its_address_by_dhcp_and_serves_http() {
    let g = ensure(&default_dir()).expect("test guest");
    let port = free_port();
    let udp = UdpSocket::bind("127.0.0.1:0").expect("a UDP socket");
    let udp_port = {
        // A free UDP port for QEMU to forward from: bind, note, release.
        let probe = UdpSocket::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let vm = BareVm::start(
        &g,
        &[],
        &[
            "-netdev",
            &format!(
                "user,id=n0,hostfwd=tcp:127.0.0.1:{port}-:80,\
                 hostfwd=udp:127.0.0.1:{udp_port}-:{UDP_ECHO_PORT}"
            ),
            "-device",
            "virtio-net-pci,netdev=n0",
        ],
        "",
    )
    .expect("qemu");
    // slirp's DHCP hands out 10.0.2.15; the lease is printed before the banner.
    vm.wait_for(&lease_line("eth0", "10.0.2.15/24"), Duration::from_secs(60))
        .expect("a DHCP lease");
    vm.wait_for(BANNER, Duration::from_secs(30))
        .expect("banner");
    let page = http_get(port).expect("HTTP from the guest");
    assert!(
        page.lines().next().is_some_and(|l| l.contains(" 200 ")),
        "{page}"
    );
    assert!(page.contains("inet 10.0.2.15/24"), "{page}");
    assert!(page.contains("kubevirt-rs guest"), "{page}");
    assert!(
        vm.console().contains("gw 10.0.2.2"),
        "default route from the lease: {}",
        vm.console()
    );
    // UDP may drop the first datagrams (slirp resolving the guest's MAC): a few tries.
    udp.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    udp.connect(("127.0.0.1", udp_port)).unwrap();
    let mut buf = [0u8; 64];
    let echoed = (0..5).find_map(|_| {
        udp.send(b"kubevirt-rs datagram").ok()?;
        udp.recv(&mut buf).ok()
    });
    let n = echoed.expect("the guest echoes UDP on port 7");
    assert_eq!(&buf[..n], b"kubevirt-rs datagram");
}

#[test]
fn guest_without_a_nic_still_boots() {
    let g = ensure(&default_dir()).expect("test guest");
    let vm = BareVm::start(&g, &[], &[], "").expect("qemu");
    vm.wait_for(BANNER, Duration::from_secs(60))
        .expect("banner");
    assert!(
        !vm.console().contains("kubevirt-rs guest: eth"),
        "{}",
        vm.console()
    );
}
