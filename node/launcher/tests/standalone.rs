//! Integration tests of the standalone launcher against real libvirt and QEMU (TCG).
//! Each test starts `virt-launcher` (which starts its own private libvirtd) and checks
//! afterwards that no QEMU, libvirtd or file of its own is left behind.
//!
//! Needs root and the Debian packages listed in docs/node.md. The test guest is built
//! into target/guest on first use (what `cargo xtask guest` does).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use virt_testguest::{KERNEL_ARGS, PROMPT};

/// Two TCG guests at once on a 2-core machine make every timeout flaky; one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn guest_dir() -> PathBuf {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests start a private libvirtd in mount and PID namespaces and need root"
    );
    let dir = virt_testguest::default_dir();
    match virt_testguest::ensure(&dir) {
        Ok(g) => g.dir,
        Err(e) => panic!(
            "cannot build the test guest into {} (cargo xtask guest): {e}",
            dir.display()
        ),
    }
}

fn vmi(name: &str, grace: i64, kernel_args: &str, disks: Value, volumes: Value) -> Value {
    json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": name, "namespace": format!("test-{}", std::process::id())},
        "spec": {
            "terminationGracePeriodSeconds": grace,
            "domain": {
                "resources": {"requests": {"memory": "256Mi"}},
                "firmware": {"kernelBoot": {
                    "kernelArgs": kernel_args,
                    "container": {"image": "guest:latest", "kernelPath": "/vmlinuz", "initrdPath": "/initramfs.gz"}
                }},
                "devices": {"disks": disks}
            },
            "volumes": volumes
        }
    })
}

fn simple_vmi(name: &str) -> Value {
    vmi(name, 30, KERNEL_ARGS, json!([]), json!([]))
}

struct Launcher {
    child: Option<Child>,
    dir: tempfile::TempDir,
    domain: String,
}

impl Launcher {
    fn console(&self) -> PathBuf {
        self.dir.path().join("console.sock")
    }
    fn cmd_socket(&self) -> PathBuf {
        self.dir.path().join("cmd.sock")
    }
    fn work(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    fn vnc(&self) -> PathBuf {
        self.dir.path().join("vnc.sock")
    }

    /// The serial console's log file (`--console-log`, as in a pod).
    fn console_log(&self) -> PathBuf {
        self.dir.path().join("console-log/serial0.log")
    }

    /// The launcher's lifeline FIFO (in a pod in the `life` volume its sidecars mount).
    fn lifeline(&self) -> PathBuf {
        self.dir.path().join("life/launcher")
    }

    fn start(vmi: &Value, image_dir: &Path) -> Self {
        Self::start_as(vmi, image_dir, None)
    }

    /// Starts the launcher as user and group `uid` (session-mode libvirt, as in a pod)
    /// when given, else as root (root-mode libvirt in private namespaces).
    fn start_as(vmi: &Value, image_dir: &Path, uid: Option<u32>) -> Self {
        Self::start_with(vmi, image_dir, uid, None)
    }

    /// As root in the network namespace `pod`, with the pod network (`--network pod`):
    /// the launcher waits for [`PodNet::hand_over`], as in a pod for virt-handler.
    fn start_in_pod(vmi: &Value, image_dir: &Path, pod: &PodNet) -> Self {
        Self::start_with(vmi, image_dir, None, Some(pod))
    }

    fn start_with(vmi: &Value, image_dir: &Path, uid: Option<u32>, pod: Option<&PodNet>) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("vl-test-")
            .tempdir()
            .unwrap();
        let file = dir.path().join("vmi.json");
        std::fs::write(&file, serde_json::to_vec_pretty(vmi).unwrap()).unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir(&work).unwrap();
        std::fs::create_dir(dir.path().join("console-log")).unwrap();
        std::fs::create_dir(dir.path().join("life")).unwrap();
        let mut command = match (uid, pod) {
            (None, None) => Command::new(env!("CARGO_BIN_EXE_virt-launcher")),
            (_, Some(pod)) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &pod.name])
                    .arg(env!("CARGO_BIN_EXE_virt-launcher"))
                    .args(["--network", "pod"]);
                c
            }
            (Some(uid), None) => {
                for e in walkdir(dir.path()) {
                    std::os::unix::fs::lchown(e, Some(uid), Some(uid)).unwrap();
                }
                let mut c = Command::new("setpriv");
                c.arg(format!("--reuid={uid}"))
                    .arg(format!("--regid={uid}"))
                    .args(["--clear-groups", "--inh-caps=-all"])
                    .arg(env!("CARGO_BIN_EXE_virt-launcher"))
                    // Its own cache: the shared default belongs to root.
                    .arg("--libvirt-cache")
                    .arg(dir.path().join("cache"));
                c
            }
        };
        let child = command
            .arg("--vmi")
            .arg(&file)
            .arg("--console-socket")
            .arg(dir.path().join("console.sock"))
            .arg("--cmd-socket")
            .arg(dir.path().join("cmd.sock"))
            .arg("--vnc-socket")
            .arg(dir.path().join("vnc.sock"))
            .arg("--image-dir")
            .arg(format!("guest:latest={}", image_dir.display()))
            .arg("--work-dir")
            .arg(&work)
            .arg("--console-log")
            .arg(dir.path().join("console-log/serial0.log"))
            .env(
                kubevirt_api::LAUNCHER_LIFELINE_ENV,
                dir.path().join("life/launcher"),
            )
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let domain = format!(
            "{}_{}",
            vmi["metadata"]["namespace"].as_str().unwrap_or("default"),
            vmi["metadata"]["name"].as_str().unwrap()
        );
        Self {
            child: Some(child),
            dir,
            domain,
        }
    }

    fn connect_console(&mut self, timeout: Duration) -> Console {
        let start = Instant::now();
        loop {
            if let Ok(s) = UnixStream::connect(self.console()) {
                return Console {
                    s,
                    seen: String::new(),
                };
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "launcher exited with {status} before the console came up: {}",
                    self.stderr()
                );
            }
            assert!(
                start.elapsed() < timeout,
                "no console socket after {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.child.as_ref().unwrap().id() as i32);
        nix::sys::signal::kill(pid, sig).unwrap();
    }

    /// Waits for exit; returns (exit code, stderr, how long it took).
    fn wait(&mut self, timeout: Duration) -> (i32, String, Duration) {
        let start = Instant::now();
        let child = self.child.as_mut().unwrap();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                let took = start.elapsed();
                let err = self.stderr();
                self.child = None;
                return (status.code().unwrap_or(-1), err, took);
            }
            if start.elapsed() > timeout {
                let _ = child.kill();
                panic!(
                    "launcher did not exit within {timeout:?}: {}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stderr(&mut self) -> String {
        let mut s = String::new();
        if let Some(e) = self.child.as_mut().and_then(|c| c.stderr.as_mut()) {
            let _ = e.read_to_string(&mut s);
        }
        s
    }

    /// Nothing of this launcher may survive it: no QEMU for its domain, no libvirtd
    /// from its work directory, no files, no sockets.
    fn assert_clean(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let work = self.work().display().to_string();
        loop {
            let left = leftover_processes(&self.domain, &work);
            if left.is_empty() {
                break;
            }
            assert!(Instant::now() < deadline, "processes left behind: {left:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
        let files: Vec<_> = std::fs::read_dir(self.work()).unwrap().collect();
        assert!(files.is_empty(), "work directory not cleaned: {files:?}");
        assert!(!self.console().exists(), "console socket left behind");
        assert!(!self.cmd_socket().exists(), "command socket left behind");
        assert!(!self.vnc().exists(), "VNC socket left behind");
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn walkdir(p: &Path) -> Vec<PathBuf> {
    let mut out = vec![p.to_path_buf()];
    if p.is_dir() && !p.is_symlink() {
        for e in std::fs::read_dir(p).unwrap().flatten() {
            out.extend(walkdir(&e.path()));
        }
    }
    out
}

/// Live (non-zombie) processes that belong to this test's VM.
fn leftover_processes(domain: &str, work: &str) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let p = e.path();
        let Ok(cmdline) = std::fs::read(p.join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let stat = std::fs::read_to_string(p.join("stat")).unwrap_or_default();
        let zombie = stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
        let ours = (cmd.contains("qemu-system") && cmd.contains(&format!("guest={domain},")))
            || (cmd.contains("libvirtd") && cmd.contains(work));
        if ours && !zombie {
            out.push(cmd);
        }
    }
    out
}

struct Console {
    s: UnixStream,
    seen: String,
}

impl Console {
    /// Reads until `pat` appears in the output after the current position.
    fn expect(&mut self, pat: &str, timeout: Duration) -> String {
        let start = Instant::now();
        let mut buf = [0u8; 4096];
        let from = self.seen.len();
        loop {
            if let Some(i) = self.seen[from..].find(pat) {
                let upto = from + i + pat.len();
                let chunk = self.seen[from..upto].to_string();
                self.seen.drain(..upto);
                return chunk;
            }
            let left = timeout.checked_sub(start.elapsed()).unwrap_or_else(|| {
                panic!(
                    "{pat:?} not seen on the console within {timeout:?}; got: {:?}",
                    &self.seen[from..]
                )
            });
            self.s
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .unwrap();
            match self.s.read(&mut buf) {
                Ok(0) => panic!(
                    "console closed before {pat:?}; got: {:?}",
                    &self.seen[from..]
                ),
                Ok(n) => self.seen.push_str(&String::from_utf8_lossy(&buf[..n])),
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(e) => panic!("console read: {e}"),
            }
        }
    }

    fn send(&mut self, line: &str) {
        self.s.write_all(format!("{line}\n").as_bytes()).unwrap();
    }

    /// Waits for the shell; pokes it with a newline in case the prompt was printed
    /// before we connected.
    fn prompt(&mut self) {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(60) {
            let from = self.seen.len();
            let mut buf = [0u8; 4096];
            self.s
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            match self.s.read(&mut buf) {
                Ok(0) => panic!("console closed before the prompt"),
                Ok(n) => self.seen.push_str(&String::from_utf8_lossy(&buf[..n])),
                Err(_) => self.send(""),
            }
            if self.seen[from.saturating_sub(PROMPT.len())..].contains(PROMPT)
                || self.seen.contains(PROMPT)
            {
                let i = self.seen.rfind(PROMPT).unwrap() + PROMPT.len();
                self.seen.drain(..i);
                return;
            }
        }
        panic!("no shell prompt within 60 s; got: {:?}", self.seen);
    }

    /// Runs a command in the guest shell and returns its output up to a marker.
    fn run(&mut self, cmd: &str) -> String {
        self.send(&format!("{cmd}; echo __done__$((1+1))"));
        let out = self.expect("__done__2", Duration::from_secs(30));
        out.replace('\r', "")
    }
}

fn cmd(path: &Path, req: &str) -> Value {
    let mut s = UnixStream::connect(path).unwrap();
    s.write_all(format!("{req}\n").as_bytes()).unwrap();
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while s.read(&mut b).unwrap() == 1 && b[0] != b'\n' {
        line.push(b[0]);
    }
    serde_json::from_slice(&line).unwrap()
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A pod's network namespace of this test, removed on drop: `eth0` with the pod's address
/// and default route, as a CNI plugin leaves them (one end of a veth pair whose other end
/// stays in the namespace: no traffic leaves it).
struct PodNet {
    name: String,
}

impl PodNet {
    fn new() -> Self {
        let net = Self {
            name: format!("vl-pod-{}", std::process::id()),
        };
        ip(&["netns", "add", &net.name]);
        let ns = net.name.as_str();
        ip(&[
            "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", "peer0",
        ]);
        ip(&["-n", ns, "address", "add", "10.99.0.2/24", "dev", "eth0"]);
        for dev in ["lo", "peer0", "eth0"] {
            ip(&["-n", ns, "link", "set", dev, "up"]);
        }
        ip(&["-n", ns, "route", "add", "default", "via", "10.99.0.1"]);
        net
    }

    /// What virt-handler does for the launcher `l` waiting in this namespace: builds the
    /// plan's bridge, tap and NAT here and passes the plan and the DHCP socket over the
    /// launcher's `net.sock`.
    fn hand_over(&self, l: &Launcher, vmi: &Value) {
        use virt_netsetup::{Dns, PlanInput, exec, handoff, plan};
        let sock = l.dir.path().join(handoff::SOCKET);
        let deadline = Instant::now() + Duration::from_secs(60);
        let stream = loop {
            match UnixStream::connect(&sock) {
                Ok(s) => break s,
                Err(e) => assert!(
                    Instant::now() < deadline,
                    "the launcher never listened on {}: {e}",
                    sock.display()
                ),
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let ns = exec::NetNs::open(&PathBuf::from(format!("/run/netns/{}", self.name))).unwrap();
        let spec = serde_json::from_value(vmi["spec"].clone()).unwrap();
        let plan = plan::plan(PlanInput {
            spec: &spec,
            mac_seed: "standalone-test",
            hostname: None,
            pod: exec::read_pod_interface(&ns, plan::POD_INTERFACE).unwrap(),
            dns: Dns::default(),
        })
        .unwrap()
        .expect("the VMI has a pod interface");
        exec::apply(&ns, &plan).unwrap();
        let dhcp = exec::dhcp_socket(&ns, plan::BRIDGE).unwrap();
        handoff::send_ready(&stream, &plan, &dhcp).unwrap();
    }
}

impl Drop for PodNet {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// What a launcher pod runs: the launcher as an ordinary user (here `nobody`; uid 107 in a
/// pod) with no capability, libvirt in session mode below the launcher's reaper, QEMU as
/// that user. And `kill -9` of the launcher still leaves no daemon and no QEMU.
#[test]
fn unprivileged_launcher_runs_libvirt_in_session_mode() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let images = guest_dir();
    let copy = readable_guest_copy(&images);
    const NOBODY: u32 = 65534;
    let mut l = Launcher::start_as(&simple_vmi("unpriv"), copy.path(), Some(NOBODY));
    // The pod's guest-console-log container: `virt-tail` from the same image, as the same
    // user.
    let mut tail = Command::new("setpriv")
        .arg(format!("--reuid={NOBODY}"))
        .arg(format!("--regid={NOBODY}"))
        .args(["--clear-groups", "--inh-caps=-all"])
        .arg(env!("CARGO_BIN_EXE_virt-tail"))
        .arg("--lifeline")
        .arg(l.lifeline())
        .arg(l.console_log())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut c = l.connect_console(Duration::from_secs(60));
    c.prompt();
    c.send("echo $((6*7))");
    c.expect("42", Duration::from_secs(20));
    let status = cmd(&l.cmd_socket(), r#"{"op":"getStatus"}"#);
    assert_eq!(status["state"], "running", "{status}");

    let qemu = qemu_pids(&l.domain);
    assert_eq!(qemu.len(), 1, "one QEMU for {}: {qemu:?}", l.domain);
    let proc_status = std::fs::read_to_string(format!("/proc/{}/status", qemu[0])).unwrap();
    let field = |name: &str| {
        proc_status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap()
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert!(
        field("Uid:").iter().all(|u| *u == NOBODY.to_string()),
        "{proc_status}"
    );
    assert_eq!(field("CapEff:"), ["0000000000000000"], "{proc_status}");

    l.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = l.wait(Duration::from_secs(10));
    // The tail ends with the launcher, even killed, having copied the whole boot (logged
    // before anyone attached to the console) and what the console session typed.
    let deadline = Instant::now() + Duration::from_secs(10);
    while tail.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "the log tail outlived the launcher"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut logged = String::new();
    tail.stdout
        .take()
        .unwrap()
        .read_to_string(&mut logged)
        .unwrap();
    assert!(
        logged.contains(virt_testguest::BANNER) && logged.contains("42"),
        "{logged}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let work = l.work().display().to_string();
    loop {
        let left = leftover_processes(&l.domain, &work);
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left behind after kill -9: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The guest files copied where an unprivileged user can read them (the build
/// directory's parents may not be).
fn readable_guest_copy(images: &Path) -> tempfile::TempDir {
    let copy = tempfile::tempdir().unwrap();
    for f in ["vmlinuz", "initramfs.gz"] {
        std::fs::copy(images.join(f), copy.path().join(f)).unwrap();
    }
    std::fs::set_permissions(
        copy.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    copy
}

/// `simple_vmi` booting UEFI: `firmware.bootloader.efi` beside its kernel boot (OVMF
/// loads the kernel QEMU hands it, as KubeVirt's EFI VMs with kernelBoot do).
fn efi_vmi(name: &str, grace: i64, secure_boot: bool) -> Value {
    let mut v = vmi(name, grace, KERNEL_ARGS, json!([]), json!([]));
    v["spec"]["domain"]["firmware"]["bootloader"] = json!({"efi": {"secureBoot": secure_boot}});
    v
}

fn qemu_cmdline(pid: u32) -> String {
    String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap())
        .replace('\0', " ")
}

/// An `efi` VMI in a pod's setting (session-mode libvirt as an unprivileged user): libvirt
/// picks Debian's OVMF through its firmware descriptors and makes the VM's NVRAM from the
/// template in the daemon's own directory; with Secure Boot, the Secure Boot build with
/// SMM. Without Secure Boot the guest boots to its shell.
#[test]
fn efi_vmi_boots_ovmf_in_session_mode() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    assert!(
        Path::new("/usr/share/qemu/firmware/60-edk2-x86_64.json").is_file(),
        "OVMF's firmware descriptors missing (apt-get install ovmf; cargo xtask deps)"
    );
    let images = guest_dir();
    let copy = readable_guest_copy(&images);
    const NOBODY: u32 = 65534;

    let started = Instant::now();
    let mut l = Launcher::start_as(&efi_vmi("efi", 30, false), copy.path(), Some(NOBODY));
    let mut c = l.connect_console(Duration::from_secs(60));
    c.prompt();
    eprintln!(
        "efi: shell prompt {:.1} s after the launcher's start",
        started.elapsed().as_secs_f64()
    );
    c.send("echo $((6*7)); ls -d /sys/firmware/efi");
    c.expect("42", Duration::from_secs(20));
    // The kernel came up through UEFI (its EFI stub), not SeaBIOS.
    c.expect("/sys/firmware/efi", Duration::from_secs(20));
    let qemu = qemu_pids(&l.domain);
    assert_eq!(qemu.len(), 1, "one QEMU for {}: {qemu:?}", l.domain);
    let cmdline = qemu_cmdline(qemu[0]);
    assert!(
        cmdline.contains("/usr/share/OVMF/OVMF_CODE_4M.fd"),
        "the plain OVMF build: {cmdline}"
    );
    assert!(
        cmdline.contains(&format!("{}/virt-launcher-", l.work().display()))
            && cmdline.contains("/efi-vars.fd"),
        "the VM's NVRAM file in the launcher's work directory: {cmdline}"
    );
    l.signal(nix::sys::signal::Signal::SIGTERM);
    let (code, err, _) = l.wait(Duration::from_secs(60));
    assert_eq!(code, 0, "{err}");
    l.assert_clean();

    // Secure Boot: the enrolled build, SMM on. This guest's kernel is not signed by the
    // enrolled keys, so only the start is checked.
    let mut l = Launcher::start_as(&efi_vmi("efi-sb", 2, true), copy.path(), Some(NOBODY));
    let _c = l.connect_console(Duration::from_secs(60));
    let deadline = Instant::now() + Duration::from_secs(60);
    let cmdline = loop {
        if let Some(pid) = qemu_pids(&l.domain).first() {
            break qemu_cmdline(*pid);
        }
        assert!(Instant::now() < deadline, "no QEMU for {}", l.domain);
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        cmdline.contains("OVMF_CODE_4M.ms.fd") && cmdline.contains("smm=on"),
        "the Secure Boot build with SMM: {cmdline}"
    );
    // The command socket opens after QEMU's start; the domain reads as running once libvirt
    // has resumed it, which under load comes a little later.
    while !l.cmd_socket().exists() {
        assert!(Instant::now() < deadline, "no command socket");
        std::thread::sleep(Duration::from_millis(100));
    }
    loop {
        let status = cmd(&l.cmd_socket(), r#"{"op":"getStatus"}"#);
        if status["state"] == "running" {
            break;
        }
        assert!(Instant::now() < deadline, "never running: {status}");
        std::thread::sleep(Duration::from_millis(200));
    }
    l.signal(nix::sys::signal::Signal::SIGTERM);
    let (code, err, _) = l.wait(Duration::from_secs(60));
    assert_eq!(code, 0, "{err}");
    l.assert_clean();
}

fn qemu_pids(domain: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            (cmd.contains("qemu-system") && cmd.contains(&format!("guest={domain},")))
                .then_some(pid)
        })
        .collect()
}

#[test]
fn boots_guest_and_runs_a_shell_command() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let images = guest_dir();
    let mut l = Launcher::start(&simple_vmi("answer"), &images);
    let mut c = l.connect_console(Duration::from_secs(60));
    c.prompt();
    c.send("echo $((6*7))");
    c.expect("42", Duration::from_secs(20));
    let status = cmd(&l.cmd_socket(), r#"{"op":"getStatus"}"#);
    assert_eq!(status["state"], "running");
    assert_eq!(
        status["accel"], "tcg",
        "KVM hangs on this machine; the probe must fall back to TCG"
    );
    // VNC is served by QEMU on its unix socket: an RFB greeting proves it.
    let mut vnc = UnixStream::connect(l.vnc()).unwrap();
    vnc.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut greeting = [0u8; 12];
    vnc.read_exact(&mut greeting).unwrap();
    assert!(
        greeting.starts_with(b"RFB 003."),
        "not a VNC server: {greeting:?}"
    );
    drop(vnc);
    l.signal(nix::sys::signal::Signal::SIGTERM);
    let (code, err, _) = l.wait(Duration::from_secs(40));
    assert_eq!(code, 0, "{err}");
    l.assert_clean();
}

/// The VMI's volumes reach the guest. With them and a NIC on the pod network (this test
/// playing virt-handler's part), `getStats` also shows every family the metrics read.
#[test]
fn volumes_reach_the_guest() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let images = guest_dir();
    let image_disk = images.join("disk.qcow2");
    let before = std::fs::read(&image_disk).unwrap();
    let mut v = vmi(
        "volumes",
        30,
        KERNEL_ARGS,
        json!([
            {"name": "cloudinit", "disk": {"bus": "virtio"}},
            {"name": "root", "disk": {"bus": "virtio"}},
            {"name": "scratch", "disk": {"bus": "virtio"}}
        ]),
        json!([
            {"name": "cloudinit", "cloudInitNoCloud": {
                "userData": "#cloud-config\nkubevirt_rs_marker: user-data-arrived\n",
                "networkData": "version: 2\n"
            }},
            {"name": "root", "containerDisk": {"image": "guest:latest"}},
            {"name": "scratch", "emptyDisk": {"capacity": "64Mi"}}
        ]),
    );
    v["spec"]["domain"]["devices"]["interfaces"] = json!([{"name": "default", "masquerade": {}}]);
    v["spec"]["networks"] = json!([{"name": "default", "pod": {}}]);
    let pod = PodNet::new();
    let mut l = Launcher::start_in_pod(&v, &images, &pod);
    pod.hand_over(&l, &v);
    let mut c = l.connect_console(Duration::from_secs(60));
    c.prompt();
    let out = c.run("mount -t iso9660 -o ro $(findfs LABEL=cidata) /mnt && cat /mnt/user-data && ls /mnt; umount /mnt");
    assert!(
        out.contains("kubevirt_rs_marker: user-data-arrived"),
        "user-data not in the guest: {out}"
    );
    assert!(
        out.contains("meta-data") && out.contains("network-config"),
        "NoCloud files missing: {out}"
    );
    // The container disk is seen through an overlay: writes go to the overlay only.
    let out = c
        .run("head -c 21 /dev/vdb; echo; echo overwritten | dd of=/dev/vdb conv=fsync 2>/dev/null");
    assert!(
        out.contains(virt_testguest::DISK_MARKER),
        "containerDisk content not visible: {out}"
    );
    let out = c.run("cat /sys/block/vdc/size");
    assert!(
        out.contains("131072"),
        "emptyDisk should be 64 MiB (131072 sectors): {out}"
    );
    assert_stats_of_every_family(&l);
    l.signal(nix::sys::signal::Signal::SIGTERM);
    let (code, err, _) = l.wait(Duration::from_secs(40));
    assert_eq!(code, 0, "{err}");
    assert!(
        std::fs::read(&image_disk).unwrap() == before,
        "the container image was written to"
    );
    l.assert_clean();
}

/// `getStats` of a running guest with disks and a NIC on the pod network: the families
/// KubeVirt's metrics read, devices by the VMI's names. The guest has read its disks and
/// taken its DHCP lease over the tap (both ways) before its prompt.
fn assert_stats_of_every_family(l: &Launcher) {
    let r = cmd(&l.cmd_socket(), r#"{"op":"getStats"}"#);
    assert_eq!(r["kind"], "stats", "{r}");
    let s = &r["stats"];
    assert!(s["cpu"]["timeNs"].as_u64() > Some(0), "vCPU time: {s}");
    assert!(s["memory"]["currentKib"].as_u64() > Some(0), "balloon: {s}");
    let vcpu = &s["vcpus"][0];
    assert_eq!(vcpu["id"], 0, "a per-vCPU entry: {s}");
    assert!(vcpu["timeNs"].as_u64() > Some(0), "vCPU 0's time: {s}");
    let named = |family: &str, alias: &str| {
        s[family]
            .as_array()
            .into_iter()
            .flatten()
            .find(|d| d["alias"] == alias)
            .cloned()
            .unwrap_or_else(|| panic!("no {family} entry named {alias}: {s}"))
    };
    let root = named("blocks", "root");
    assert!(
        root["rdBytes"].as_u64() > Some(0),
        "root disk reads: {root}"
    );
    assert!(root["rdReqs"].as_u64() > Some(0), "root disk reads: {root}");
    let nic = named("nets", "default");
    assert_eq!(nic["name"], "tap0", "{nic}");
    for counter in ["rxBytes", "rxPackets", "txBytes", "txPackets"] {
        assert!(nic[counter].as_u64() > Some(0), "{counter}: {nic}");
    }
    assert_eq!(nic["rxErrors"].as_u64(), Some(0), "{nic}");
    // Unpinned: the vCPU may run on the host's CPUs.
    assert!(s["cpuAffinity"].as_u64() > Some(0), "CPU affinity: {s}");
    // The first read started a dirty-rate measurement (1 s of page sampling); a read
    // after it has the rate.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        std::thread::sleep(Duration::from_millis(1500));
        let r = cmd(&l.cmd_socket(), r#"{"op":"getStats"}"#);
        if r["stats"]["dirtyRateMibPerSecond"].as_u64().is_some() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no dirty rate measured: {r}"
        );
    }
}

#[test]
fn sigterm_shuts_the_guest_down_gracefully() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let images = guest_dir();
    let mut l = Launcher::start(&simple_vmi("graceful"), &images);
    let mut c = l.connect_console(Duration::from_secs(60));
    c.prompt();
    l.signal(nix::sys::signal::Signal::SIGTERM);
    c.expect("power button, shutting down", Duration::from_secs(20));
    let (code, err, took) = l.wait(Duration::from_secs(40));
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("guest shut down"),
        "expected a clean ACPI shutdown: {err}"
    );
    assert!(
        took < Duration::from_secs(30),
        "graceful shutdown took {took:?}"
    );
    l.assert_clean();
}

#[test]
fn guest_ignoring_acpi_is_destroyed_after_the_grace_period() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let images = guest_dir();
    let v = vmi(
        "stubborn",
        3,
        &format!("{KERNEL_ARGS} kubevirt-rs.ignore-acpi"),
        json!([]),
        json!([]),
    );
    let mut l = Launcher::start(&v, &images);
    let mut c = l.connect_console(Duration::from_secs(60));
    c.prompt();
    l.signal(nix::sys::signal::Signal::SIGTERM);
    let (code, err, took) = l.wait(Duration::from_secs(40));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("destroyed"), "expected a forced stop: {err}");
    assert!(
        took >= Duration::from_secs(3),
        "destroyed before the grace period ended ({took:?})"
    );
    l.assert_clean();
}

#[test]
fn pause_and_unpause_over_the_command_socket() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let images = guest_dir();
    let mut l = Launcher::start(&simple_vmi("pausable"), &images);
    let mut c = l.connect_console(Duration::from_secs(60));
    c.prompt();
    assert_eq!(cmd(&l.cmd_socket(), r#"{"op":"ping"}"#)["kind"], "pong");
    assert_eq!(cmd(&l.cmd_socket(), r#"{"op":"pause"}"#)["kind"], "ok");
    let deadline = Instant::now() + Duration::from_secs(5);
    while cmd(&l.cmd_socket(), r#"{"op":"getStatus"}"#)["state"] != "paused" {
        assert!(Instant::now() < deadline, "state never became paused");
        std::thread::sleep(Duration::from_millis(50));
    }
    // A paused guest does not answer.
    c.send("echo $((20+22))");
    c.s.set_read_timeout(Some(Duration::from_millis(1500)))
        .unwrap();
    let mut buf = [0u8; 256];
    let n = c.s.read(&mut buf).unwrap_or(0);
    assert!(
        !String::from_utf8_lossy(&buf[..n]).contains("42"),
        "paused guest answered"
    );
    assert_eq!(cmd(&l.cmd_socket(), r#"{"op":"unpause"}"#)["kind"], "ok");
    c.expect("42", Duration::from_secs(20));
    // freeze needs the guest agent, which this guest lacks: said so, not libvirt's words.
    for op in [
        r#"{"op":"freeze","unfreezeTimeoutSeconds":60}"#,
        r#"{"op":"unfreeze"}"#,
    ] {
        let r = cmd(&l.cmd_socket(), op);
        assert_eq!(r["kind"], "error", "{op}: {r}");
        assert_eq!(
            r["message"], "VMI does not have guest agent connected",
            "{op}"
        );
    }
    assert_eq!(cmd(&l.cmd_socket(), r#"{"op":"shutdown"}"#)["kind"], "ok");
    let (code, err, _) = l.wait(Duration::from_secs(40));
    assert_eq!(code, 0, "{err}");
    l.assert_clean();
}

fn assert_fails_cleanly(v: &Value, image_dir: &Path, expect: &[&str]) {
    let mut l = Launcher::start(v, image_dir);
    let (code, err, _) = l.wait(Duration::from_secs(30));
    assert_eq!(code, 1, "launcher should fail: {err}");
    let last = err
        .lines()
        .filter(|l| l.starts_with("virt-launcher:"))
        .collect::<Vec<_>>()
        .join("\n");
    for e in expect {
        assert!(last.contains(e), "error should mention {e:?}: {last}");
    }
    l.assert_clean();
}

#[test]
fn invalid_memory_quantity_is_a_clear_error() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let mut v = simple_vmi("badmem");
    v["spec"]["domain"]["resources"]["requests"]["memory"] = json!("12XB");
    assert_fails_cleanly(
        &v,
        &guest_dir(),
        &[
            "invalid VMI",
            "spec.domain.resources.requests.memory",
            "12XB",
        ],
    );
}

#[test]
fn disk_without_volume_is_a_clear_error() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let v = vmi(
        "nodisk",
        30,
        KERNEL_ARGS,
        json!([{"name": "data", "disk": {"bus": "virtio"}}]),
        json!([]),
    );
    assert_fails_cleanly(
        &v,
        &guest_dir(),
        &["invalid VMI", "spec.domain.devices.disks[0].name", "data"],
    );
}

#[test]
fn missing_image_file_is_a_clear_error() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let empty = tempfile::tempdir().unwrap();
    let v = vmi(
        "noimage",
        30,
        KERNEL_ARGS,
        json!([{"name": "root", "disk": {}}]),
        json!([{"name": "root", "containerDisk": {"image": "guest:latest", "path": "/disk/missing.qcow2"}}]),
    );
    // The kernel comes from the same (empty) image, so it is the first thing missing.
    let missing = empty.path().join("vmlinuz").display().to_string();
    assert_fails_cleanly(&v, empty.path(), &["kernelBoot", &missing]);
    let v2 = vmi(
        "noimage2",
        30,
        KERNEL_ARGS,
        json!([{"name": "root", "disk": {}}]),
        json!([{"name": "root", "containerDisk": {"image": "guest:latest", "path": "/disk/missing.qcow2"}}]),
    );
    let missing = guest_dir().join("disk/missing.qcow2").display().to_string();
    assert_fails_cleanly(&v2, &guest_dir(), &["volume \"root\"", &missing]);
}

#[test]
fn soft_reboot_restarts_the_guest() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let images = guest_dir();
    let mut l = Launcher::start(&simple_vmi("rebooter"), &images);
    let mut c = l.connect_console(Duration::from_secs(60));
    c.prompt();
    assert_eq!(cmd(&l.cmd_socket(), r#"{"op":"softReboot"}"#)["kind"], "ok");
    c.expect("power button, shutting down", Duration::from_secs(20));
    c.expect(virt_testguest::BANNER, Duration::from_secs(60));
    assert_eq!(
        cmd(&l.cmd_socket(), r#"{"op":"getStatus"}"#)["state"],
        "running"
    );
    l.signal(nix::sys::signal::Signal::SIGTERM);
    let (code, err, _) = l.wait(Duration::from_secs(40));
    assert_eq!(code, 0, "{err}");
    l.assert_clean();
}

/// With a guest agent connected, the status says so (the `AgentConnected` condition) and a
/// soft reboot goes through the agent, as KubeVirt's does: a guest that ignores the power
/// button reboots too. The test guest's stand-in agent (`kubevirt-rs.fake-agent`) answers
/// libvirt's sync and reboots on `guest-shutdown`. Run as an unprivileged user, so the
/// channel's socket is where session-mode libvirt places it.
#[test]
fn soft_reboot_goes_through_a_connected_guest_agent() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let images = guest_dir();
    let copy = tempfile::tempdir().unwrap();
    for f in ["vmlinuz", "initramfs.gz"] {
        std::fs::copy(images.join(f), copy.path().join(f)).unwrap();
    }
    std::fs::set_permissions(
        copy.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    // A long name: libvirt's channel socket path takes the first 20 characters of the
    // domain name, and with them it is longest (103 of a unix socket's 107 bytes).
    let v = vmi(
        "agent-channel-with-a-long-name",
        3,
        &format!("{KERNEL_ARGS} kubevirt-rs.ignore-acpi kubevirt-rs.fake-agent"),
        json!([]),
        json!([]),
    );
    let mut l = Launcher::start_as(&v, copy.path(), Some(65534));
    let mut c = l.connect_console(Duration::from_secs(60));
    c.prompt();
    // libvirt learns of the open port from QEMU's event; the launcher polls it.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = cmd(&l.cmd_socket(), r#"{"op":"getStatus"}"#);
        if st["guestAgentConnected"] == true {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "agent never reported connected: {st}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(cmd(&l.cmd_socket(), r#"{"op":"softReboot"}"#)["kind"], "ok");
    c.expect("guest agent: rebooting", Duration::from_secs(20));
    c.expect(virt_testguest::BANNER, Duration::from_secs(60));
    assert_eq!(
        cmd(&l.cmd_socket(), r#"{"op":"getStatus"}"#)["state"],
        "running"
    );
    // Stopped by force after the grace period (the guest ignores ACPI).
    l.signal(nix::sys::signal::Signal::SIGTERM);
    let (code, err, _) = l.wait(Duration::from_secs(40));
    assert_eq!(code, 0, "{err}");
}

/// Disks `root` (containerDisk) and `scratch` (emptyDisk), interface `default` on the pod
/// network.
fn disks_and_nic_vmi(name: &str) -> Value {
    let mut v = vmi(
        name,
        30,
        KERNEL_ARGS,
        json!([
            {"name": "root", "disk": {"bus": "virtio"}},
            {"name": "scratch", "disk": {"bus": "virtio"}}
        ]),
        json!([
            {"name": "root", "containerDisk": {"image": "guest:latest"}},
            {"name": "scratch", "emptyDisk": {"capacity": "64Mi"}}
        ]),
    );
    v["spec"]["domain"]["devices"]["interfaces"] = json!([{"name": "default", "masquerade": {}}]);
    v["spec"]["networks"] = json!([{"name": "default", "pod": {}}]);
    v
}

/// Not a check: what one `getStats` costs against one running guest (the command socket's
/// whole round trip), printed. No timing is asserted.
/// `cargo test -p virt-launcher --test standalone -- --ignored get_stats_cost --nocapture`
#[test]
#[ignore = "a measurement, run by hand"]
fn get_stats_cost() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let images = guest_dir();
    let v = disks_and_nic_vmi("statscost");
    let pod = PodNet::new();
    let mut l = Launcher::start_in_pod(&v, &images, &pod);
    pod.hand_over(&l, &v);
    let mut c = l.connect_console(Duration::from_secs(60));
    c.prompt();
    let first = cmd(&l.cmd_socket(), r#"{"op":"getStats"}"#);
    println!("getStats: {first}");
    let mut took: Vec<Duration> = (0..50)
        .map(|_| {
            let t = Instant::now();
            let r = cmd(&l.cmd_socket(), r#"{"op":"getStats"}"#);
            let d = t.elapsed();
            assert_eq!(r["kind"], "stats", "{r}");
            d
        })
        .collect();
    took.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "getStats x{}: median {:.2} ms, min {:.2}, p90 {:.2}, max {:.2}",
        took.len(),
        ms(took[took.len() / 2]),
        ms(took[0]),
        ms(took[took.len() * 9 / 10]),
        ms(took[took.len() - 1]),
    );
    l.signal(nix::sys::signal::Signal::SIGTERM);
    let (code, err, _) = l.wait(Duration::from_secs(40));
    assert_eq!(code, 0, "{err}");
    l.assert_clean();
}
