//! Reaching a VM through the API server (issue 17): `kubectl virt port-forward` to the
//! guest's HTTP server on its default (masquerade) pod interface, with local ports and
//! with `--stdio` (ssh's ProxyCommand form); `kubectl virt ssh` with a key the guest got
//! from cloud-init (exit codes come back), `kubectl virt scp` of 10 MiB both ways
//! byte-exact; UDP forwarding (datagrams to the guest's echo service come back, with our
//! plugin and with upstream virtctl; a closed UDP port ends the forward with the reason);
//! upstream virtctl's port-forward and ssh, unchanged, against the same VM; a port nothing
//! listens on fails at once with a message naming it; a stopped VM is "not running". The test runs on the host, with no route used but
//! loopback and the API server.
//!
//! Run with `cargo test -p e2e --test access -- --ignored --test-threads=1`.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Ns, plugin};

/// `GET /` over a stream; the whole answer.
fn http_get(mut s: impl Read + Write) -> String {
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// Sends `payload` to the UDP `addr` until it comes back (UDP may lose the first datagrams
/// while the forward opens, and a forwarder just started may not listen yet), at most
/// `tries` times; what came back.
fn udp_echo(addr: &str, payload: &[u8], tries: usize) -> Option<Vec<u8>> {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    s.connect(addr).unwrap();
    let mut buf = vec![0u8; 65_536];
    (0..tries).find_map(|_| {
        let got = s.send(payload).and_then(|_| s.recv(&mut buf));
        match got {
            Ok(n) => Some(buf[..n].to_vec()),
            // Refused at once (nothing listens locally yet: the forwarder is starting):
            // give it a moment rather than burning the tries.
            Err(_) => {
                std::thread::sleep(Duration::from_millis(500));
                None
            }
        }
    })
}

/// A free loopback UDP port (bound, noted, released).
fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map(|a| a.port())
        .unwrap()
}

/// Starts `kubectl virt port-forward` with `args` and returns it with the local address of
/// its first "Forwarding from" line.
fn forward(ns: &Ns<'_>, args: &[&str]) -> (std::process::Child, String) {
    let mut fwd = plugin(ns, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl virt port-forward");
    let mut line = String::new();
    BufReader::new(fwd.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .strip_prefix("Forwarding from ")
        .and_then(|l| l.split(" -> ").next())
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    (fwd, addr)
}

/// The test guest with root's SSH key in its cloud-init user data.
fn web_vm(ns: &str, key: &str) -> String {
    serde_json::json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {
            "runStrategy": "Always",
            "template": {"spec": {
                "terminationGracePeriodSeconds": 5,
                "domain": {
                    "memory": {"guest": "128Mi"},
                    "devices": {"disks": [{"name": "cloudinit", "disk": {"bus": "virtio"}}]},
                    "firmware": {"kernelBoot": {
                        "kernelArgs": virt_testguest::KERNEL_ARGS,
                        "container": {
                            "image": common::TEST_GUEST,
                            "imagePullPolicy": "IfNotPresent",
                            "kernelPath": "/vmlinuz",
                            "initrdPath": "/initramfs.gz"
                        }
                    }}
                },
                "volumes": [{"name": "cloudinit", "cloudInitNoCloud": {
                    "userData": format!("#cloud-config\nssh_authorized_keys:\n  - {key}\n")
                }}]
            }}
        }
    })
    .to_string()
}

#[test]
#[ignore = "needs a local cluster: cargo xtask cluster up"]
fn port_forward_reaches_the_guest_through_the_api_server() {
    let c = common::cluster();
    let ns = Ns::new(c, "portfwd");
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("id");
    let ok = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&key)
        .status()
        .unwrap();
    assert!(ok.success(), "ssh-keygen");
    let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    c.kubectl_stdin(
        &["apply", "-f", "-"],
        Some(&web_vm(&ns.name, public.trim())),
    )
    .expect("apply VM");
    ns.wait_running("web");

    // stdin/stdout, as ssh's ProxyCommand uses it.
    let page = common::page_via_stdio(&ns, "web");
    assert!(
        page.starts_with("HTTP/1.") && page.contains("200"),
        "{page}"
    );

    // A local port: every connection is a forward of its own.
    let (mut fwd, addr) = forward(&ns, &["port-forward", "vm/web", "0:80"]);
    for _ in 0..3 {
        let s = std::net::TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let page = http_get(s);
        assert!(page.contains("kubevirt-rs guest"), "via {addr}: {page}");
    }
    let _ = fwd.kill();
    let _ = fwd.wait();

    // UDP (virtctl's `udp/LOCAL:REMOTE`): one websocket message per datagram, to the guest's
    // echo service; every datagram keeps its bounds, a large one included.
    let udp_port = virt_testguest::UDP_ECHO_PORT.to_string();
    let (mut fwd, addr) = forward(
        &ns,
        &["port-forward", "vm/web", &format!("udp/0:{udp_port}")],
    );
    let small = udp_echo(&addr, b"kubevirt-rs datagram", 10);
    assert_eq!(
        small.as_deref(),
        Some(&b"kubevirt-rs datagram"[..]),
        "UDP echo via {addr}"
    );
    let large: Vec<u8> = (0..8000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(
        udp_echo(&addr, &large, 5),
        Some(large),
        "an 8000-byte datagram"
    );
    let _ = fwd.kill();
    let _ = fwd.wait();
    // A UDP port nothing listens on: the guest's "port unreachable" ends the forward, and
    // the plugin says why instead of leaving the client waiting for ever.
    let (mut fwd, addr) = forward(&ns, &["port-forward", "vm/web", "udp/0:9"]);
    assert_eq!(udp_echo(&addr, b"anyone?", 3), None);
    let _ = fwd.kill();
    let out = fwd.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("UDP port is closed"), "closed UDP port: {err}");

    // ssh and scp with the local OpenSSH client, carried by port-forward --stdio.
    let ssh = |args: &[&str]| {
        let (sub, args) = args.split_first().unwrap();
        let mut a = vec![
            *sub,
            "-i",
            key.to_str().unwrap(),
            "--local-ssh-opts=-o StrictHostKeyChecking=no",
            "--local-ssh-opts=-o UserKnownHostsFile=/dev/null",
            "--local-ssh-opts=-o LogLevel=ERROR",
        ];
        a.extend_from_slice(args);
        plugin(&ns, &a).stdin(Stdio::null()).output().unwrap()
    };
    let start = Instant::now();
    loop {
        let out = ssh(&["ssh", "root@vm/web", "-c", "echo ssh-ok"]);
        if String::from_utf8_lossy(&out.stdout).contains("ssh-ok") {
            break;
        }
        assert!(
            start.elapsed() < common::BOOT,
            "no ssh: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_secs(2));
    }
    let out = ssh(&["ssh", "root@vm/web", "-c", "exit 7"]);
    assert_eq!(out.status.code(), Some(7), "the guest command's exit code");

    // An ssh session left idle while the rest runs, used again at the end: idle sessions
    // must not die (KubeVirt #9827: close 1006 after a few idle minutes). Ten minutes by
    // default (E2E_IDLE_SSH_SECONDS); the rest of this test fills the first ones.
    let idle_for = Duration::from_secs(
        std::env::var("E2E_IDLE_SSH_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(600),
    );
    let idle_since = Instant::now();
    let mut idle = plugin(
        &ns,
        &[
            "ssh",
            "-i",
            key.to_str().unwrap(),
            "--local-ssh-opts=-o StrictHostKeyChecking=no",
            "--local-ssh-opts=-o UserKnownHostsFile=/dev/null",
            "--local-ssh-opts=-o LogLevel=ERROR",
            "root@vm/web",
            "-c",
            "read line; echo still-here-$line",
        ],
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("kubectl virt ssh (idle)");

    let blob = dir.path().join("blob");
    let data: Vec<u8> = (0..10 * 1024 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&blob, &data).unwrap();
    let out = ssh(&["scp", blob.to_str().unwrap(), "root@vm/web:/tmp/blob"]);
    assert!(
        out.status.success(),
        "scp up: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = ssh(&["ssh", "root@vm/web", "-c", "sha256sum /tmp/blob"]);
    let want = {
        use sha2::Digest as _;
        hex::encode(sha2::Sha256::digest(&data))
    };
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with(&want),
        "sha256 in the guest: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let back = dir.path().join("back");
    let out = ssh(&["scp", "root@vm/web:/tmp/blob", back.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "scp down: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        std::fs::read(&back).unwrap() == data,
        "10 MiB came back changed"
    );

    // Upstream virtctl, unchanged, against the same VM: port-forward and ssh (its
    // default local-ssh mode runs ssh with itself as the ProxyCommand).
    let virtctl = e2e::upstream_virtctl().expect("upstream virtctl");
    let upstream = |args: &[&str]| {
        Command::new(&virtctl)
            .env("KUBECONFIG", &ns.c.kubeconfig)
            .args(["-n", &ns.name])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("virtctl")
    };
    // virtctl ends the forward when its stdin ends: keep it open until the answer is in.
    let mut pf = upstream(&["port-forward", "--stdio", "vm/web", "80"]);
    let mut stdin = pf.stdin.take().unwrap();
    stdin.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut stdout = pf.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut page = String::new();
        let _ = stdout.read_to_string(&mut page);
        page
    });
    let page = reader.join().unwrap();
    drop(stdin);
    let out = pf.wait_with_output().unwrap();
    assert!(
        page.contains("kubevirt-rs guest"),
        "virtctl port-forward: {page:?} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = upstream(&[
        "ssh",
        "-i",
        key.to_str().unwrap(),
        "--known-hosts=/dev/null",
        "--local-ssh-opts=-o StrictHostKeyChecking=no",
        "--local-ssh-opts=-o LogLevel=ERROR",
        "-c",
        "echo virtctl-ssh-ok",
        "root@vm/web",
    ])
    .wait_with_output()
    .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("virtctl-ssh-ok"),
        "virtctl ssh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // (virtctl itself turns any failure of ssh into its own exit code 1.)
    assert!(out.status.success(), "virtctl ssh: {out:?}");
    // virtctl's UDP forward (a local port it listens on until killed).
    let local = free_udp_port();
    let mut pf = upstream(&["port-forward", "vm/web", &format!("udp/{local}:{udp_port}")]);
    let echoed = udp_echo(&format!("127.0.0.1:{local}"), b"virtctl datagram", 10);
    let _ = pf.kill();
    let out = pf.wait_with_output().unwrap();
    assert_eq!(
        echoed.as_deref(),
        Some(&b"virtctl datagram"[..]),
        "virtctl UDP port-forward: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Nothing listens on 81: the forward fails at once, naming the port.
    let t0 = Instant::now();
    let out = plugin(&ns, &["port-forward", "--stdio", "vm/web", "81"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("refused the connection to port 81"), "{err}");
    // Not a performance figure: a refused port must end the forward, not hang it (the
    // handler gives a guest 10 s to answer at all).
    assert!(
        t0.elapsed() < Duration::from_secs(60),
        "hung for {:?}",
        t0.elapsed()
    );

    // expose: a NodePort Service in front of the VM, answered on a node's address.
    let out = plugin(
        &ns,
        &[
            "expose",
            "vm",
            "web",
            "--name",
            "web-np",
            "--port",
            "8080",
            "--target-port",
            "80",
            "--type",
            "NodePort",
        ],
    )
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "expose: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let node_port = ns.get("service", "web-np", "{.spec.ports[0].nodePort}");
    let node_ip =
        ns.c.kubectl(&[
            "get",
            "nodes",
            "-o",
            "jsonpath={.items[0].status.addresses[?(@.type==\"InternalIP\")].address}",
        ])
        .unwrap();
    let addr = format!("{}:{node_port}", node_ip.trim());
    let mut last = String::new();
    ns.wait(
        "web",
        &format!("the guest's page via NodePort {addr}"),
        Duration::from_secs(60),
        || {
            last = std::net::TcpStream::connect(&addr)
                .map(|s| {
                    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
                    http_get(s)
                })
                .unwrap_or_default();
            last.contains("kubevirt-rs guest")
        },
    );

    // The idle session, once idle long enough, still carries a command's input and output.
    let rest = idle_for.saturating_sub(idle_since.elapsed());
    eprintln!("idle ssh session: waiting {rest:?} more");
    std::thread::sleep(rest);
    assert!(
        idle.try_wait().expect("ssh").is_none(),
        "the idle ssh session ended after {:?}",
        idle_since.elapsed()
    );
    idle.stdin
        .take()
        .unwrap()
        .write_all(b"after-idle\n")
        .unwrap();
    let out = idle.wait_with_output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("still-here-after-idle"),
        "the ssh session idle for {:?} no longer works: {}",
        idle_since.elapsed(),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("idle ssh session usable after {:?}", idle_since.elapsed());

    // N3 of the security review at bd37f96: the launcher's own directory cannot redirect
    // port-forward. Someone with `kubectl exec` into the launcher writes the network plan
    // virt-handler once read there, pointing the forward at virt-handler's own loopback;
    // the forward still reaches the guest (the address comes from the VMI and the API).
    let pods = ns.launcher_pods("web");
    let pod = pods[0].trim_start_matches("pod/");
    let forged = r#"{"interface":"default","binding":"Bridge",
        "pod":{"name":"eth0","mac":[2,0,0,0,0,1],"address":{"addr":"127.0.0.1","prefix":8},"gateway":null,"mtu":1500},
        "pod_new_mac":null,"bridge_address":{"addr":"169.254.75.10","prefix":32},
        "lease":{"mac":[2,0,0,0,0,1],"address":{"addr":"127.0.0.1","prefix":8},"gateway":null,
            "server":"169.254.75.10","dns":{"servers":[],"search":[]},"mtu":1500,"hostname":null,
            "lease_secs":4294967295}}"#;
    c.kubectl_stdin(
        &[
            "-n",
            &ns.name,
            "exec",
            "-i",
            pod,
            "-c",
            "compute",
            "--",
            "sh",
            "-c",
            "cat > /var/run/kubevirt-rs/sockets/network.json",
        ],
        Some(forged),
    )
    .expect("writing network.json in the launcher");
    let page = common::page_via_stdio(&ns, "web");
    assert!(
        page.contains("kubevirt-rs guest"),
        "a plan written by the launcher redirected the forward: {page}"
    );

    // Bad input and a stopped VM.
    let out = plugin(&ns, &["port-forward", "--stdio", "vm/web", "70000"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("ports 1-65535"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ns.virt(&["stop", "web"]);
    ns.wait_stopped("web");
    let out = plugin(&ns, &["port-forward", "--stdio", "vm/web", "80"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("is not running"),
        "{err}"
    );
}
