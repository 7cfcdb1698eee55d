//! The Debian 12 test guest under bare QEMU (TCG), as a user's VM is used: cloud-init's
//! NoCloud seed makes a user with an SSH key and runs a first-boot command, SSH reaches the
//! guest through a loopback port forward, the guest agent answers on its virtio-serial
//! channel, and a second boot of the same instance does not run the first-boot command
//! again.
//!
//! Needs root (debootstrap) and network access to deb.debian.org for the first build, and
//! minutes: `cargo test -p virt-testguest --test debian -- --ignored --nocapture`
//! (the figures it prints are in docs/test-guests.md).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use virt_testguest::debian::{self, Agent, Firmware, Vm, VmConfig};

/// Generous: a TCG boot here takes about two minutes, and the machine is shared.
const BOOT: Duration = Duration::from_secs(600);

const USER: &str = "tester";
const MARKER_LINE: &str = "kubevirt-rs first boot";
const MARKER_FILE: &str = "/var/tmp/marker";
const INSTANCE_ID: &str = "kubevirt-rs-debian-test-1";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// A directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    /// `name` tells the tests of one process apart.
    fn new(name: &str) -> Self {
        // Short: the agent's unix socket lives here (at most 107 bytes of path).
        let p = std::env::temp_dir().join(format!("kvrs-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn ssh(key: &Path, port: u16, command: &str) -> Result<String, String> {
    let out = Command::new("ssh")
        .arg("-i")
        .arg(key)
        .args(["-p", &port.to_string()])
        .args([
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=10",
            "-o",
            "LogLevel=ERROR",
        ])
        .arg(format!("{USER}@127.0.0.1"))
        .arg(command)
        .output()
        .map_err(|e| format!("running ssh: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Runs `command` over SSH until it succeeds with an output `done` accepts. Returns the
/// output, when SSH first answered and when `done` was met (both since QEMU's start).
fn ssh_until(
    vm: &Vm,
    key: &Path,
    port: u16,
    command: &str,
    done: impl Fn(&str) -> bool,
) -> (String, Duration, Duration) {
    let deadline = Instant::now() + BOOT;
    let mut answered = None;
    loop {
        let last = match ssh(key, port, command) {
            Ok(out) => {
                let now = vm.started().elapsed();
                let first = *answered.get_or_insert(now);
                if done(&out) {
                    return (out, first, now);
                }
                format!("answered {out:?}")
            }
            Err(e) => e,
        };
        assert!(
            Instant::now() < deadline,
            "ssh -p {port} {USER}@127.0.0.1 {command:?}: not done within {BOOT:?} \
             (last: {last}); the serial console's last lines:\n{}",
            vm.console_tail(40)
        );
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// Starts the agent's handshake in a thread from QEMU's start, so that its time is the
/// agent's own and not the end of what the test waited for before.
fn agent_in_background(
    socket: PathBuf,
    started: Instant,
) -> std::thread::JoinHandle<Result<(Agent, Duration), debian::Error>> {
    std::thread::spawn(move || {
        let a = Agent::connect(&socket, BOOT)?;
        Ok((a, started.elapsed()))
    })
}

/// A throw-away SSH key pair in `dir` and a NoCloud seed whose user data makes [`USER`]
/// with it and appends [`MARKER_LINE`] to [`MARKER_FILE`] on the instance's first boot.
fn key_and_seed(dir: &Path, instance_id: &str) -> (PathBuf, PathBuf) {
    let key = dir.join("key");
    let keygen = Command::new("ssh-keygen")
        .args([
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "kubevirt-rs-test",
            "-f",
        ])
        .arg(&key)
        .status()
        .expect("ssh-keygen (openssh-client)");
    assert!(keygen.success(), "ssh-keygen: {keygen}");
    let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    let user_data = format!(
        "#cloud-config\n\
         users:\n\
         \x20 - name: {USER}\n\
         \x20   sudo: \"ALL=(ALL) NOPASSWD:ALL\"\n\
         \x20   shell: /bin/bash\n\
         \x20   ssh_authorized_keys:\n\
         \x20     - {}\n\
         runcmd:\n\
         \x20 - echo '{MARKER_LINE}' >> {MARKER_FILE}\n",
        public.trim()
    );
    let seed = dir.join("seed.iso");
    debian::nocloud_iso(
        &seed,
        &format!("instance-id: {instance_id}\nlocal-hostname: debian-test\n"),
        &user_data,
    )
    .expect("seed ISO");
    (key, seed)
}

/// A qcow2 overlay at `path` on `base`: the built image stays pristine.
fn overlay(base: &Path, path: &Path) -> PathBuf {
    let st = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b"])
        .arg(base)
        .arg(path)
        .status()
        .unwrap();
    assert!(st.success(), "qemu-img create: {st}");
    path.to_path_buf()
}

fn json(line: &str) -> serde_json::Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("agent answer {line:?}: {e}"))
}

#[test]
#[ignore = "needs root and deb.debian.org for the first build (about 5 min), then boots \
            Debian twice under TCG (about 5 min): \
            cargo test -p virt-testguest --test debian -- --ignored --nocapture"]
fn debian_guest_boots_with_cloud_init_ssh_and_the_agent() {
    let t = Instant::now();
    let g = debian::ensure(&debian::default_dir()).expect("the Debian guest");
    let size = std::fs::metadata(&g.disk).unwrap().len();
    eprintln!(
        "guest: {} ({:.1} MiB), ensured in {:.1} s",
        g.disk.display(),
        size as f64 / (1 << 20) as f64,
        t.elapsed().as_secs_f64()
    );

    let tmp = TempDir::new("boot");
    let (key, seed) = key_and_seed(&tmp.0, INSTANCE_ID);
    // An overlay: the built image stays pristine, and both boots share one disk.
    let overlay = overlay(&g.disk, &tmp.0.join("overlay.qcow2"));
    let socket = tmp.0.join("qga.sock");
    let port = free_port();
    let config = VmConfig {
        disk: &overlay,
        seed: Some(&seed),
        ssh_port: port,
        agent_socket: &socket,
        memory_mib: 1024,
        firmware: Firmware::Bios,
    };

    // First boot.
    let mut vm = Vm::start(&config).expect("qemu");
    let agent = agent_in_background(socket.clone(), vm.started());
    let login = vm
        .wait_for(" login:", BOOT)
        .unwrap_or_else(|e| panic!("first boot: no login prompt on the serial console: {e}"));
    let (marker, ssh_first, marker_at) = ssh_until(
        &vm,
        &key,
        port,
        &format!("cat {MARKER_FILE} 2>/dev/null || true"),
        |o| o.contains(MARKER_LINE),
    );
    assert_eq!(
        marker.trim(),
        MARKER_LINE,
        "the first boot's runcmd ran once"
    );
    let (mut agent, agent_at) = agent.join().unwrap().unwrap_or_else(|e| {
        panic!(
            "the guest agent: {e}; the serial console's last lines:\n{}",
            vm.console_tail(40)
        )
    });
    let t = Duration::from_secs(30);
    let ping = agent.execute(r#"{"execute":"guest-ping"}"#, t).unwrap();
    assert_eq!(json(&ping)["return"], serde_json::json!({}), "{ping}");
    let osinfo = json(
        &agent
            .execute(r#"{"execute":"guest-get-osinfo"}"#, t)
            .unwrap(),
    );
    assert_eq!(osinfo["return"]["id"], "debian", "{osinfo}");
    assert_eq!(osinfo["return"]["version-id"], "12", "{osinfo}");
    let ifaces = json(
        &agent
            .execute(r#"{"execute":"guest-network-get-interfaces"}"#, t)
            .unwrap(),
    );
    // slirp's DHCP server gives the guest 10.0.2.15: cloud-init's network config (ifupdown,
    // DHCP) brought the virtio NIC up.
    let addresses: Vec<&str> = ifaces["return"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|i| i["ip-addresses"].as_array().into_iter().flatten())
        .filter_map(|a| a["ip-address"].as_str())
        .collect();
    assert!(addresses.contains(&"10.0.2.15"), "{ifaces}");
    eprintln!(
        "first boot under TCG: login prompt {:.1} s, ssh answers {:.1} s, runcmd's marker {:.1} s, agent answers {:.1} s (after QEMU's start)",
        login.as_secs_f64(),
        ssh_first.as_secs_f64(),
        marker_at.as_secs_f64(),
        agent_at.as_secs_f64(),
    );
    // The agent powers the guest off, as KubeVirt's graceful shutdown asks: the file
    // systems are synced, and the second boot sees what the first wrote.
    agent
        .execute(r#"{"execute":"guest-shutdown"}"#, Duration::from_millis(1))
        .ok();
    drop(agent);
    assert!(
        vm.wait_exit(Duration::from_secs(180)),
        "the guest did not power off after guest-shutdown; the serial console's last lines:\n{}",
        vm.console_tail(40)
    );
    drop(vm);

    // Second boot: same disk, same seed, same instance-id.
    let _ = std::fs::remove_file(&socket);
    let vm = Vm::start(&config).expect("qemu");
    let agent = agent_in_background(socket.clone(), vm.started());
    let login2 = vm
        .wait_for(" login:", BOOT)
        .unwrap_or_else(|e| panic!("second boot: no login prompt on the serial console: {e}"));
    // `cloud-init status --wait` returns once every stage of this boot is done, so a
    // runcmd that would run again has run by then.
    let (out, ssh2, _) = ssh_until(
        &vm,
        &key,
        port,
        &format!(
            "sudo cloud-init status --wait >/dev/null; \
             echo instance=$(cat /var/lib/cloud/data/instance-id); cat {MARKER_FILE}"
        ),
        |o| o.contains("instance="),
    );
    assert!(
        out.contains(&format!("instance={INSTANCE_ID}")),
        "second boot's instance id: {out}"
    );
    let runs = out.lines().filter(|l| l.contains(MARKER_LINE)).count();
    assert_eq!(
        runs, 1,
        "the first-boot runcmd must not run again for the same instance-id: {out}"
    );
    let (_, agent2) = agent.join().unwrap().unwrap_or_else(|e| {
        panic!(
            "second boot, the guest agent: {e}; the serial console's last lines:\n{}",
            vm.console_tail(40)
        )
    });
    eprintln!(
        "second boot under TCG: login prompt {:.1} s, ssh answers {:.1} s, agent answers {:.1} s",
        login2.as_secs_f64(),
        ssh2.as_secs_f64(),
        agent2.as_secs_f64(),
    );
}

/// The one disk boots under both firmwares, as Debian's cloud images do: OVMF (UEFI,
/// Secure Boot off) through grub's `BOOTX64.EFI` on the EFI system partition, SeaBIOS
/// through `boot.img` and the BIOS boot partition's `core.img`. Each boot is checked from
/// inside: the kernel sees `/sys/firmware/efi` only under UEFI.
#[test]
#[ignore = "needs root and the built Debian guest (minutes), then boots it under UEFI and \
            BIOS under TCG (about 5 min): \
            cargo test -p virt-testguest --test debian -- --ignored --nocapture uefi"]
fn debian_guest_boots_under_uefi_and_bios() {
    let g = debian::ensure(&debian::default_dir()).expect("the Debian guest");
    let tmp = TempDir::new("fw");
    let (key, seed) = key_and_seed(&tmp.0, "kubevirt-rs-debian-firmware");
    let vars = tmp.0.join("OVMF_VARS.fd");
    for (name, firmware) in [
        ("uefi", Firmware::Uefi { vars: &vars }),
        ("bios", Firmware::Bios),
    ] {
        // A disk of its own per firmware: each boot is a first boot, timed alike.
        let disk = overlay(&g.disk, &tmp.0.join(format!("{name}.qcow2")));
        let socket = tmp.0.join(format!("qga-{name}.sock"));
        let port = free_port();
        let vm = Vm::start(&VmConfig {
            disk: &disk,
            seed: Some(&seed),
            ssh_port: port,
            agent_socket: &socket,
            memory_mib: 1024,
            firmware,
        })
        .expect("qemu");
        let agent = agent_in_background(socket.clone(), vm.started());
        // The firmware's and grub's share of the boot: until the kernel's first line.
        let kernel = vm
            .wait_for("Linux version", BOOT)
            .unwrap_or_else(|e| panic!("{name}: the kernel did not start: {e}"));
        let login = vm
            .wait_for(" login:", BOOT)
            .unwrap_or_else(|e| panic!("{name}: no login prompt on the serial console: {e}"));
        let (out, ssh_at, _) = ssh_until(
            &vm,
            &key,
            port,
            "test -d /sys/firmware/efi && echo firmware=uefi || echo firmware=bios",
            |o| o.contains("firmware="),
        );
        assert_eq!(out.trim(), format!("firmware={name}"), "{name} boot");
        // OVMF's boot manager names the device it boots (the disk, through the
        // removable-media path); SeaBIOS prints nothing of the kind.
        assert_eq!(
            vm.console().contains("BdsDxe: starting Boot"),
            name == "uefi",
            "{name}: OVMF's boot manager on the console; the first lines:\n{}",
            vm.console().lines().take(10).collect::<Vec<_>>().join("\n")
        );
        let (mut agent, agent_at) = agent.join().unwrap().unwrap_or_else(|e| {
            panic!(
                "{name}: the guest agent: {e}; the serial console's last lines:\n{}",
                vm.console_tail(40)
            )
        });
        let ping = agent
            .execute(r#"{"execute":"guest-ping"}"#, Duration::from_secs(30))
            .unwrap();
        assert_eq!(json(&ping)["return"], serde_json::json!({}), "{ping}");
        eprintln!(
            "{name} first boot under TCG: kernel starts {:.1} s, login prompt {:.1} s, agent answers {:.1} s, ssh answers {:.1} s (after QEMU's start)",
            kernel.as_secs_f64(),
            login.as_secs_f64(),
            agent_at.as_secs_f64(),
            ssh_at.as_secs_f64(),
        );
    }
    // OVMF wrote its variable store (the boot options it found): the copy was writable.
    assert!(std::fs::metadata(&vars).unwrap().len() > 0);
}

#[test]
#[ignore = "needs the built Debian guest (root, minutes): \
            cargo test -p virt-testguest --test debian -- --ignored"]
fn container_disk_tar_has_kubevirt_layout() {
    let g = debian::ensure(&debian::default_dir()).expect("the Debian guest");
    let tmp = TempDir::new("tar");
    let tar = tmp.0.join("containerdisk.tar");
    debian::container_disk_tar(&g, &tar).expect("tar");
    let out = Command::new("tar")
        .args(["--list", "--verbose", "--numeric-owner", "--file"])
        .arg(&tar)
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = listing.lines().collect();
    assert_eq!(lines.len(), 2, "{listing}");
    assert!(
        lines[0].starts_with("drwxr-xr-x 0/0") && lines[0].ends_with(" disk/"),
        "{listing}"
    );
    assert!(
        lines[1].starts_with("-r--r----- 107/107") && lines[1].ends_with(" disk/disk.qcow2"),
        "{listing}"
    );
}
