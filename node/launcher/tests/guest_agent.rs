//! The guest agent and cloud-init with a real Linux guest: the Debian 12 test guest
//! (docs/test-guests.md) run by `virt-launcher` from a persistent claim with a NoCloud seed
//! and access credentials, driven over the command socket as virt-handler drives it.
//!
//! One test, because every boot costs one to two minutes under TCG: it checks the
//! `guestosinfo`/`userlist`/`filesystemlist` answers, the status's guest OS and interfaces,
//! how fast a new guest address reaches the status, freeze/unfreeze and the thaw at the
//! timeout, SSH keys and a password through the agent, the CPU the agent's polling costs,
//! and, after a second boot of the same VM, that cloud-init kept its instance id and did not
//! run its first-boot commands again.
//!
//! Needs root and minutes (the image is built on first use, ~4-8 min):
//! `cargo test -p virt-launcher --test guest_agent -- --ignored --nocapture`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// A TCG boot of the Debian guest takes ~1.5 min here; the machine is shared.
const BOOT: Duration = Duration::from_secs(600);
const USER: &str = "tester";
const MARKER_FILE: &str = "/var/tmp/marker";
const VM: &str = "agent-vm";
const PASSWORD: &str = "Secr3t-pw";

/// The root disk as a persistent claim (a Filesystem-mode claim's `disk.img`, raw), so that
/// the second boot finds what the first one wrote — a containerDisk starts afresh each time,
/// where cloud-init's instance id cannot matter.
fn claim_dir(parent: &Path) -> PathBuf {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test starts a private libvirtd in namespaces and builds the guest as root"
    );
    let dir = virt_testguest::debian::default_dir();
    let guest = virt_testguest::debian::ensure(&dir).expect("the Debian test guest builds");
    let claim = parent.join("claim");
    std::fs::create_dir_all(&claim).unwrap();
    let out = Command::new("qemu-img")
        .args(["convert", "-O", "raw"])
        .arg(&guest.disk)
        .arg(claim.join("disk.img"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    claim
}

/// An ed25519 public key line (a fresh key pair; only the public half is used).
fn public_key(dir: &Path, name: &str) -> String {
    let path = dir.join(name);
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C"])
        .arg(format!("{name}@test"))
        .arg("-f")
        .arg(&path)
        .output()
        .expect("ssh-keygen (openssh-client)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_to_string(path.with_extension("pub"))
        .unwrap()
        .trim()
        .to_string()
}

fn vmi(uid: &str, own_key: &str) -> Value {
    let user_data = format!(
        "#cloud-config\nusers:\n  - name: {USER}\n    shell: /bin/bash\n    lock_passwd: true\n    ssh_authorized_keys:\n      - {own_key}\nruncmd:\n  - [sh, -c, 'echo first-boot >> {MARKER_FILE}']\n"
    );
    json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": VM, "namespace": format!("ga-{}", std::process::id()), "uid": uid},
        "spec": {
            "terminationGracePeriodSeconds": 120,
            "domain": {
                "resources": {"requests": {"memory": "1024Mi"}},
                "devices": {"disks": [
                    {"name": "root", "bootOrder": 1, "disk": {"bus": "virtio"}},
                    {"name": "cloudinit", "disk": {"bus": "virtio"}}
                ]}
            },
            "volumes": [
                {"name": "root", "persistentVolumeClaim": {"claimName": "root"}},
                {"name": "cloudinit", "cloudInitNoCloud": {"userData": user_data}}
            ],
            "accessCredentials": [
                {"sshPublicKey": {"source": {"secret": {"secretName": "keys"}},
                                  "propagationMethod": {"qemuGuestAgent": {"users": [USER]}}}},
                {"userPassword": {"source": {"secret": {"secretName": "pw"}},
                                  "propagationMethod": {"qemuGuestAgent": {}}}}
            ]
        }
    })
}

struct Launcher {
    child: Child,
    dir: PathBuf,
}

impl Launcher {
    fn start(dir: &Path, claim: &Path, vmi: &Value) -> Self {
        let file = dir.join("vmi.json");
        std::fs::write(&file, serde_json::to_vec_pretty(vmi).unwrap()).unwrap();
        let work = dir.join("work");
        std::fs::create_dir_all(&work).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_virt-launcher"))
            .arg("--vmi")
            .arg(&file)
            .arg("--console-socket")
            .arg(dir.join("console.sock"))
            .arg("--cmd-socket")
            .arg(dir.join("cmd.sock"))
            .arg("--console-log")
            .arg(dir.join("serial0.log"))
            .arg("--claim")
            .arg(format!("root={}", claim.display()))
            .arg("--work-dir")
            .arg(&work)
            .arg("--access-credentials-dir")
            .arg(dir.join("creds"))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Self {
            child,
            dir: dir.to_path_buf(),
        }
    }

    fn call(&self, req: &Value) -> Value {
        let mut s = UnixStream::connect(self.dir.join("cmd.sock")).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        s.write_all(format!("{req}\n").as_bytes()).unwrap();
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap()
    }

    fn status(&self) -> Value {
        self.call(&json!({"op": "getStatus"}))
    }

    fn console_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("serial0.log")).unwrap_or_default();
        virt_testguest::debian::last_lines(&log, 15)
    }

    /// Waits until `f` holds for the status; how long it took.
    fn wait_status(
        &mut self,
        what: &str,
        timeout: Duration,
        f: impl Fn(&Value) -> bool,
    ) -> Duration {
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                let mut err = String::new();
                let _ = self.child.stderr.as_mut().unwrap().read_to_string(&mut err);
                panic!("launcher exited ({st}) waiting for {what}: {err}");
            }
            if self.dir.join("cmd.sock").exists() && f(&self.status()) {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < timeout,
                "{what} not within {timeout:?}; status {}; console:\n{}",
                self.status(),
                self.console_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Logs `user` in on the serial console (a real login: getty, login, utmp).
    fn console_login(&self, user: &str, password: &str) {
        let mut c = UnixStream::connect(self.dir.join("console.sock")).unwrap();
        c.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut seen = String::new();
        let mut expect = |c: &mut UnixStream, pat: &str, poke: &[u8]| {
            let start = Instant::now();
            let mut buf = [0u8; 4096];
            seen.clear();
            loop {
                if seen.contains(pat) {
                    return;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(120),
                    "no {pat:?} on the console: {seen:?}"
                );
                if !poke.is_empty() {
                    c.write_all(poke).unwrap();
                }
                if let Ok(n) = c.read(&mut buf) {
                    seen.push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            }
        };
        expect(&mut c, "login:", b"\n");
        c.write_all(format!("{user}\n").as_bytes()).unwrap();
        expect(&mut c, "Password:", b"");
        c.write_all(format!("{password}\n").as_bytes()).unwrap();
        expect(&mut c, "$ ", b"");
    }

    /// Runs a shell command in the guest through the agent.
    fn exec(&self, script: &str) -> (i64, String) {
        let r = self.call(
            &json!({"op": "guestExec", "command": ["/bin/sh", "-c", script], "timeoutSeconds": 60}),
        );
        assert_eq!(r["kind"], "guestExec", "{script}: {r}");
        (
            r["exitCode"].as_i64().unwrap(),
            r["stdout"].as_str().unwrap_or_default().to_string(),
        )
    }

    fn authorized_keys(&self) -> String {
        self.exec(&format!("cat /home/{USER}/.ssh/authorized_keys"))
            .1
    }

    /// ACPI shutdown (what deleting the pod does) and the launcher's exit.
    fn stop(mut self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let start = Instant::now();
        while self.child.try_wait().unwrap().is_none() {
            assert!(
                start.elapsed() < Duration::from_secs(180),
                "launcher did not stop"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn connected_with_os(s: &Value) -> bool {
    s["guestAgentConnected"] == true && s["guestAgent"]["os"]["id"] == "debian"
}

fn addresses(s: &Value) -> Vec<String> {
    s["guestAgent"]["interfaces"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|i| i["ipAddresses"].as_array().cloned().unwrap_or_default())
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect()
}

/// Write a Secret's key as kubelet would update it: the whole file replaced at once.
fn write_secret(dir: &Path, secret: &str, key: &str, value: &str) {
    let d = dir.join(format!("creds/{secret}-access-cred"));
    std::fs::create_dir_all(&d).unwrap();
    let tmp = d.join(format!("..{key}.tmp"));
    std::fs::write(&tmp, value).unwrap();
    std::fs::rename(&tmp, d.join(key)).unwrap();
}

/// CPU seconds (user + system) of a process and its descendants.
fn cpu_seconds(pid: u32) -> f64 {
    let tick = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    let mut total = 0.0;
    let mut stack = vec![pid];
    while let Some(p) = stack.pop() {
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat"))
            && let Some((_, rest)) = stat.rsplit_once(')')
        {
            let f: Vec<&str> = rest.split_whitespace().collect();
            // utime, stime are fields 14, 15 (1-based); rest starts at field 3.
            total += f[11].parse::<f64>().unwrap_or(0.0) + f[12].parse::<f64>().unwrap_or(0.0);
        }
        for t in std::fs::read_dir(format!("/proc/{p}/task"))
            .into_iter()
            .flatten()
            .flatten()
        {
            if let Ok(children) = std::fs::read_to_string(t.path().join("children")) {
                stack.extend(
                    children
                        .split_whitespace()
                        .filter_map(|c| c.parse::<u32>().ok()),
                );
            }
        }
    }
    total / tick
}

/// The QEMU process of this VM (counted apart: the guest's own idling under TCG is there).
fn qemu_pid(domain: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
        let cmd = String::from_utf8_lossy(&cmd);
        (cmd.contains("qemu-system") && cmd.contains(&format!("guest={domain},")))
            .then(|| e.file_name().to_str()?.parse().ok())?
    })
}

#[test]
#[ignore = "needs root and minutes: boots the Debian test guest twice under TCG"]
fn debian_guest_agent_end_to_end() {
    let tmp = tempfile::Builder::new().prefix("ga-").tempdir().unwrap();
    let dir = tmp.path();
    let images = claim_dir(dir);
    let own = public_key(dir, "own");
    let (k1, k2) = (public_key(dir, "k1"), public_key(dir, "k2"));
    write_secret(dir, "keys", "key1", &format!("{k1}\n"));
    write_secret(dir, "pw", USER, &format!("{PASSWORD}\n"));
    // The `pw` Secret's password reaches the guest; a VMI's first uid.
    let mut l = Launcher::start(dir, &images, &vmi("uid-boot-1", &own));
    let took = l.wait_status("the guest agent with the OS", BOOT, connected_with_os);
    println!("boot 1: agent connected with OS info after {took:?}");

    // guestosinfo, userlist, filesystemlist: KubeVirt's shapes.
    let info = l.call(&json!({"op": "guestOsInfo"}));
    assert_eq!(info["kind"], "guestOsInfo", "{info}");
    let info = &info["info"];
    assert_eq!(info["kind"], "VirtualMachineInstanceGuestAgentInfo");
    assert_eq!(info["os"]["id"], "debian");
    assert_eq!(info["os"]["versionId"], "12");
    assert_eq!(
        info["hostname"], VM,
        "cloud-init's host name from the VM's name"
    );
    assert!(
        info["guestAgentVersion"]
            .as_str()
            .is_some_and(|v| !v.is_empty()),
        "{info}"
    );
    assert!(
        info["supportedCommands"]
            .as_array()
            .is_some_and(|c| c.len() > 10)
    );
    let fs = l.call(&json!({"op": "filesystemList"}));
    let items = fs["list"]["items"].as_array().unwrap();
    let root = items
        .iter()
        .find(|f| f["mountPoint"] == "/")
        .expect("/ in fslist");
    assert_eq!(root["fileSystemType"], "ext4");
    assert!(root["totalBytes"].as_u64().unwrap() > root["usedBytes"].as_u64().unwrap());
    assert_eq!(fs["list"]["kind"], "VirtualMachineInstanceFileSystemList");
    let users = l.call(&json!({"op": "userList"}));
    assert_eq!(
        users["list"]["kind"],
        "VirtualMachineInstanceGuestOSUserList"
    );
    assert!(users["list"]["items"].is_array());

    // The status: the guest's interface with slirp's address, the agent's commands.
    let st = l.status();
    assert!(addresses(&st).contains(&"10.0.2.15".to_string()), "{st}");
    let ifname = st["guestAgent"]["interfaces"][0]["name"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        st["guestAgent"]["supportedCommands"]
            .as_array()
            .is_some_and(|c| !c.is_empty())
    );

    // A new address reaches the status within seconds.
    let t0 = Instant::now();
    let (code, _) = l.exec(&format!("ip addr add 10.0.2.99/24 dev {ifname}"));
    assert_eq!(code, 0);
    let seen = l.wait_status("the new address", Duration::from_secs(30), |s| {
        addresses(s).contains(&"10.0.2.99".to_string())
    });
    println!(
        "address change to status: {:?} (exec returned after {:?})",
        t0.elapsed(),
        t0.elapsed() - seen
    );
    assert!(t0.elapsed() < Duration::from_secs(5), "budget is 5 s");

    // SSH keys through the agent: ours added, the user's own kept.
    l.wait_status("credentials synchronised", Duration::from_secs(60), |s| {
        s["accessCredentials"]["synchronized"] == true
    });
    let keys = l.authorized_keys();
    assert!(keys.contains(&own), "{keys}");
    assert!(
        keys.contains(&format!("{k1} kubevirt-rs:access-credential")),
        "{keys}"
    );
    let shadow = l.exec(&format!("getent shadow {USER} | cut -d: -f2")).1;
    assert!(shadow.starts_with('$'), "the password was set: {shadow:?}");
    // Replaced.
    let t0 = Instant::now();
    write_secret(dir, "keys", "key1", &format!("{k2}\n"));
    loop {
        let keys = l.authorized_keys();
        if keys.contains(&k2) && !keys.contains(&k1) {
            assert!(keys.contains(&own), "{keys}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "key not replaced: {keys}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    println!("key replaced in the guest after {:?}", t0.elapsed());
    // Removed.
    write_secret(dir, "keys", "key1", "");
    let t0 = Instant::now();
    loop {
        let keys = l.authorized_keys();
        if !keys.contains(&k2) {
            let lines: Vec<&str> = keys
                .lines()
                .filter(|l| !l.trim().is_empty() && !l.starts_with('#'))
                .collect();
            assert_eq!(lines, [own.as_str()], "only the user's own key is left");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "key not removed: {keys}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // A missing Secret is named.
    std::fs::remove_dir_all(dir.join("creds/pw-access-cred")).unwrap();
    l.wait_status("the missing Secret named", Duration::from_secs(30), |s| {
        s["accessCredentials"]["synchronized"] == false
            && s["accessCredentials"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("\"pw\""))
    });
    // A user logging in on the serial console with the password the agent set shows in
    // userlist (read when asked).
    let t0 = Instant::now();
    l.console_login(USER, PASSWORD);
    loop {
        let users = l.call(&json!({"op": "userList"}));
        let names: Vec<String> = users["list"]["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|u| u["userName"].as_str().map(str::to_string))
            .collect();
        if names.iter().any(|n| n == USER) {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no login in {users}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    println!("console login seen in userlist after {:?}", t0.elapsed());

    // Freeze and unfreeze; then a freeze thawed by its timeout.
    let r = l.call(&json!({"op": "freeze", "unfreezeTimeoutSeconds": 0}));
    assert_eq!(r["kind"], "ok", "{r}");
    l.wait_status("frozen", Duration::from_secs(5), |s| {
        s["guestAgent"]["frozen"] == true
    });
    let info = l.call(&json!({"op": "guestOsInfo"}));
    assert_eq!(info["info"]["fsFreezeStatus"], "frozen");
    let r = l.call(&json!({"op": "freeze", "unfreezeTimeoutSeconds": 0}));
    assert_eq!(r["kind"], "ok", "a second freeze is no error: {r}");
    let r = l.call(&json!({"op": "unfreeze"}));
    assert_eq!(r["kind"], "ok", "{r}");
    l.wait_status("thawed", Duration::from_secs(5), |s| {
        s["guestAgent"]["frozen"] != true
    });
    let t0 = Instant::now();
    let r = l.call(&json!({"op": "freeze", "unfreezeTimeoutSeconds": 3}));
    assert_eq!(r["kind"], "ok", "{r}");
    l.wait_status("frozen", Duration::from_secs(5), |s| {
        s["guestAgent"]["frozen"] == true
    });
    l.wait_status("thawed by the timeout", Duration::from_secs(20), |s| {
        s["guestAgent"]["frozen"] != true
    });
    println!("thawed by its 3 s timeout after {:?}", t0.elapsed());
    let (code, _) = l.exec("echo thawed > /var/tmp/thawed && sync");
    assert_eq!(code, 0, "the file systems take writes again");

    // What the polling costs, over a minute with the agent connected and nothing asked:
    // the agent inside the guest, and the launcher with its libvirtd beside QEMU.
    let ga_cpu = |l: &Launcher| -> f64 {
        let out = l.exec("cut -d' ' -f14,15 /proc/$(pidof qemu-ga)/stat").1;
        let t: Vec<f64> = out
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        t.iter().sum::<f64>() / 100.0
    };
    let domain = format!("ga-{}_{VM}", std::process::id());
    let qemu = qemu_pid(&domain).expect("QEMU of the VM");
    let launcher_pid = l.child.id();
    let (ga0, host0, qemu0) = (ga_cpu(&l), cpu_seconds(launcher_pid), cpu_seconds(qemu));
    std::thread::sleep(Duration::from_secs(60));
    let (ga1, host1, qemu1) = (ga_cpu(&l), cpu_seconds(launcher_pid), cpu_seconds(qemu));
    // The launcher's tree includes QEMU (libvirtd's child): take it out.
    let launcher_cpu = (host1 - host0) - (qemu1 - qemu0);
    println!(
        "polling cost over 60 s: qemu-ga in the guest {:.2} s CPU ({:.2} %), launcher + libvirtd {:.2} s ({:.2} %), QEMU (whole idle TCG guest) {:.2} s",
        ga1 - ga0,
        (ga1 - ga0) / 60.0 * 100.0,
        launcher_cpu,
        launcher_cpu / 60.0 * 100.0,
        qemu1 - qemu0
    );

    // cloud-init's first boot is done (its runcmd ran) and its instance id is the VM's
    // SMBIOS UUID, which comes from the VM's name.
    let t0 = Instant::now();
    while l.exec(&format!("cat {MARKER_FILE}")).0 != 0 {
        assert!(
            t0.elapsed() < BOOT,
            "first-boot runcmd never ran: {}",
            l.console_tail()
        );
        std::thread::sleep(Duration::from_secs(2));
    }
    let instance_1 = l.exec("cat /var/lib/cloud/data/instance-id").1;
    let smbios = l.exec("cat /sys/class/dmi/id/product_uuid").1;
    assert_eq!(instance_1.trim(), smbios.trim().to_lowercase());
    l.stop();

    // The same VM again (a new VMI, a new uid): same instance id, no first boot again.
    let mut l = Launcher::start(dir, &images, &vmi("uid-boot-2", &own));
    let took = l.wait_status(
        "the guest agent after the second boot",
        BOOT,
        connected_with_os,
    );
    println!("boot 2: agent connected with OS info after {took:?}");
    let instance_2 = l.exec("cat /var/lib/cloud/data/instance-id").1;
    assert_eq!(instance_1.trim(), instance_2.trim());
    assert_eq!(
        instance_1.trim().len(),
        36,
        "the firmware UUID: {instance_1:?}"
    );
    let (code, marker) = l.exec(&format!("cat {MARKER_FILE}"));
    assert_eq!(code, 0, "the first boot's marker is on the claim");
    assert_eq!(
        marker.lines().count(),
        1,
        "first-boot runcmd ran once: {marker:?}"
    );
    assert_eq!(l.exec("hostname").1.trim(), VM);
    l.stop();
}
