//! The test guest's UDP service: every datagram to the port goes back to its sender.
//! busybox has no UDP server applet; port-forward tests of `udp` need something that
//! answers. Built by build.rs with the host's rustc, std only, and copied into the guest.

use std::net::UdpSocket;

fn main() {
    let port = std::env::args().nth(1).unwrap_or_else(|| "7".into());
    let socket = match UdpSocket::bind(format!("0.0.0.0:{port}")) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("udp-echo: binding port {port}: {e}");
            std::process::exit(1);
        }
    };
    let mut buf = vec![0u8; 65536];
    loop {
        if let Ok((n, peer)) = socket.recv_from(&mut buf) {
            let _ = socket.send_to(&buf[..n], peer);
        }
    }
}
