//! The Debian 12 test guest's start (issue 39 point 6): a VM of the guest's containerDisk
//! created on the cluster against bare QEMU booting the same disk on this machine, in turns,
//! each to the same answer: an SSH login with the key cloud-init installed. On the cluster
//! also: create → `AgentConnected`, and an address added in the guest → the VMI status.
//!
//! Both sides get the same user data (a user with a fresh key), the same memory and one
//! vCPU under TCG; both boot the disk afresh (the containerDisk's copy; an overlay for bare
//! QEMU) with a new instance id, so cloud-init runs its first boot in both. SSH is tried
//! every second on both: to the launcher pod's IP (masquerade forwards every port; the local
//! cluster's pod network is this machine's bridge) and to QEMU's loopback forward.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use serde_json::{Value, json};

use super::Kube;
use super::steps::{Children, median_range, watch_json};

/// The Debian guest's memory on both sides (its boot test's).
pub const MEMORY_MIB: u32 = 1024;
const USER: &str = "bench";
/// A TCG boot of the guest takes one to two minutes here.
const BOOT_TIMEOUT: Duration = Duration::from_secs(600);

/// What one run of each side measured.
#[derive(Debug, Default, Clone)]
pub struct Figures {
    /// Cluster: create request → VMI `Running` (watch).
    pub running: Vec<Duration>,
    /// Cluster: create request → `AgentConnected` True (watch).
    pub agent: Vec<Duration>,
    /// Cluster: create request → SSH login answered.
    pub ssh: Vec<Duration>,
    /// Cluster: `ip addr add` sent over an open SSH connection → the address in the VMI
    /// status (watch).
    pub address_from_send: Vec<Duration>,
    /// Cluster: the same, from the SSH command's return (the address exists by then).
    pub address_from_return: Vec<Duration>,
    /// Bare QEMU: spawn → the agent answers `guest-sync-delimited`.
    pub bare_agent: Vec<Duration>,
    /// Bare QEMU: spawn → SSH login answered.
    pub bare_ssh: Vec<Duration>,
    /// The idle VM's CPU with its agent and without (the last cluster run's VM).
    pub idle: Option<Idle>,
}

/// CPU seconds of one VM's launcher pod over an idle window with the guest agent connected
/// and then with it stopped in the guest: what following the agent costs.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Idle {
    /// Length of each window.
    pub seconds: f64,
    /// Every process of the pod but QEMU (virt-launcher, its libvirtd, …), agent connected.
    pub launcher_on: f64,
    /// QEMU (the whole guest under TCG), agent connected.
    pub qemu_on: f64,
    /// qemu-ga inside the guest, agent connected (guest CPU, part of QEMU's).
    pub agent_in_guest: f64,
    /// The pod but QEMU, agent stopped.
    pub launcher_off: f64,
    /// QEMU, agent stopped.
    pub qemu_off: f64,
    /// virt-handler of the VM's node (it serves every VM of the node; here only this one
    /// runs), agent connected.
    pub handler_on: f64,
    /// The same, agent stopped.
    pub handler_off: f64,
}

/// CPU seconds (user + system, with waited-for children) of a `/proc/PID/stat` text.
pub fn stat_cpu_seconds(stat: &str) -> Option<f64> {
    // After the command name, which may hold spaces, in parentheses: state is field 3;
    // utime, stime, cutime, cstime are fields 14–17.
    let (_, rest) = stat.rsplit_once(')')?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f
        .get(11..15)?
        .iter()
        .map(|x| x.parse::<u64>().ok())
        .sum::<Option<u64>>()?;
    // USER_HZ: 100 on every Linux /proc reports to user space.
    Some(ticks as f64 / 100.0)
}

/// CPU seconds now of the launcher pod with uid `pod_uid` (without QEMU, QEMU) and of the
/// pod with uid `handler_uid` (virt-handler): (launcher, QEMU, handler).
fn pod_cpu(pod_uid: &str, handler_uid: &str) -> (f64, f64, f64) {
    let mut out = (0.0, 0.0, 0.0);
    for p in virt_devenv::procs::in_containers() {
        let cpu = || {
            std::fs::read_to_string(format!("/proc/{}/stat", p.pid))
                .ok()
                .and_then(|s| stat_cpu_seconds(&s))
                .unwrap_or(0.0)
        };
        match p.pod_uid.as_deref() {
            Some(u) if u == pod_uid && p.comm.starts_with("qemu") => out.1 += cpu(),
            Some(u) if u == pod_uid => out.0 += cpu(),
            Some(u) if u == handler_uid => out.2 += cpu(),
            _ => {}
        }
    }
    out
}

/// Whether a VMI (as JSON) has `AgentConnected` True.
pub fn agent_connected(vmi: &Value) -> bool {
    vmi.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "AgentConnected" && c["status"] == "True")
        })
}

/// Whether any interface of a VMI's status lists `addr`.
pub fn has_address(vmi: &Value, addr: &str) -> bool {
    vmi.pointer("/status/interfaces")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .flat_map(|i| i["ipAddresses"].as_array().cloned().unwrap_or_default())
        .any(|a| a == addr)
}

/// The pod network's address of a VMI (its first interface's `ipAddress`).
pub fn pod_ip(vmi: &Value) -> Option<String> {
    vmi.pointer("/status/interfaces/0/ipAddress")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// cloud-init's user data of both sides: one user with `key`, allowed to sudo.
pub fn user_data(key: &str) -> String {
    format!(
        "#cloud-config\nusers:\n  - name: {USER}\n    shell: /bin/bash\n    sudo: ALL=(ALL) NOPASSWD:ALL\n    lock_passwd: true\n    ssh_authorized_keys:\n      - {key}\n"
    )
}

/// The cluster side's VM: the containerDisk, a NoCloud seed, the pod network (masquerade).
pub fn manifest(name: &str, ns: &str, image: &str, user_data: &str, cpu: &str) -> String {
    json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachine",
        "metadata": {"name": name, "namespace": ns, "labels": {"bench": "start-debian"}},
        "spec": {
            "runStrategy": "Always",
            "template": {"spec": {
                "terminationGracePeriodSeconds": 0,
                "domain": {
                    "memory": {"guest": format!("{MEMORY_MIB}Mi")},
                    "resources": {"requests": {"cpu": cpu}},
                    "devices": {
                        "disks": [
                            {"name": "root", "disk": {"bus": "virtio"}},
                            {"name": "cloudinit", "disk": {"bus": "virtio"}}
                        ],
                        "interfaces": [{"name": "default", "masquerade": {}}]
                    }
                },
                "networks": [{"name": "default", "pod": {}}],
                "volumes": [
                    {"name": "root", "containerDisk": {"image": image, "imagePullPolicy": "IfNotPresent"}},
                    {"name": "cloudinit", "cloudInitNoCloud": {"userData": user_data}}
                ]
            }}
        }
    })
    .to_string()
}

/// The section's Debian part, from the runs' figures.
pub fn markdown(f: &Figures, runs: usize) -> String {
    use crate::bench::section::Runs;
    let gap = Runs::secs(&f.ssh).median().unwrap_or(f64::NAN)
        - Runs::secs(&f.bare_ssh).median().unwrap_or(f64::NAN);
    let addr = Runs::secs(&f.address_from_send)
        .median()
        .unwrap_or(f64::NAN);
    let met = |ok: bool| if ok { "met" } else { "not met" };
    let idle = match f.idle {
        Some(i) => {
            let pct = |cpu: f64| cpu / i.seconds * 100.0;
            format!(
                "What following the agent costs, one idle VM over {:.0} s with qemu-guest-agent \
                 running and then {:.0} s with it stopped in the guest (`systemctl stop`; \
                 `AgentConnected` gone): CPU seconds from /proc of the launcher pod's processes and \
                 of the node's virt-handler (the pods run on this machine). kubevirt-rs follows \
                 the agent more often than KubeVirt (interfaces every 2 s for a minute after a change, \
                 then every 4 s, not every 120 s: docs/node.md, \"Guest agent\"), so this is the \
                 price of a new address in the status within seconds. The window starts 120 s \
                 after the address step, past the first boot's own work.\n\n\
                 | idle VM | agent connected | agent stopped | difference |\n|---|---|---|---|\n\
                 | virt-launcher, its libvirtd and the pod's other processes (not QEMU) | {:.2} s ({:.2} % of a CPU) | {:.2} s ({:.2} %) | {:+.2} s ({:+.3} %) |\n\
                 | virt-handler of the VM's node | {:.2} s ({:.2} %) | {:.2} s ({:.2} %) | {:+.2} s ({:+.3} %) |\n\
                 | QEMU (the whole guest, TCG) | {:.2} s ({:.2} %) | {:.2} s ({:.2} %) | {:+.2} s |\n\
                 | of which qemu-ga inside the guest (the guest's own count) | {:.2} s | | |\n\n",
                i.seconds,
                i.seconds,
                i.launcher_on,
                pct(i.launcher_on),
                i.launcher_off,
                pct(i.launcher_off),
                i.launcher_on - i.launcher_off,
                pct(i.launcher_on - i.launcher_off),
                i.handler_on,
                pct(i.handler_on),
                i.handler_off,
                pct(i.handler_off),
                i.handler_on - i.handler_off,
                pct(i.handler_on - i.handler_off),
                i.qemu_on,
                pct(i.qemu_on),
                i.qemu_off,
                pct(i.qemu_off),
                i.qemu_on - i.qemu_off,
                i.agent_in_guest,
            )
        }
        None => String::new(),
    };
    format!(
        "### The Debian 12 guest: create → SSH against bare QEMU ({runs} runs each, alternating)\n\n\
         The Debian test guest (docs/test-guests.md: systemd, cloud-init, qemu-guest-agent, \
         OpenSSH) as a containerDisk, {MEMORY_MIB} MiB, one vCPU, TCG; bare QEMU boots the same \
         qcow2 (an overlay) with a NoCloud seed of the same user data. The answer on both sides: \
         an SSH login with the key cloud-init installed (tried every second; to the launcher \
         pod's IP, and to QEMU's loopback forward).\n\n\
         | from the create request (cluster) or the spawn (bare QEMU) to | kubevirt-rs, median (min–max) | bare QEMU |\n\
         |---|---|---|\n\
         | VMI `Running` (watch) | {} | |\n\
         | the guest agent: `AgentConnected` (watch) / answers on its socket | {} | {} |\n\
         | SSH login answered | {} | {} |\n\n\
         | an address added in the guest (`sudo ip addr add` over an SSH connection opened beforehand) → the VMI status (watch) | median (min–max) |\n\
         |---|---|\n\
         | from the SSH command's start (an upper bound) | {} |\n\
         | from its return (the address exists by then) | {} |\n\n\
         Goals: create → SSH within 1.5 s of bare QEMU: gap {gap:+.2} s, {}; agent facts (an \
         address) in the status within 5 s: {addr:.2} s, {}.\n\n{idle}",
        median_range(&f.running),
        median_range(&f.agent),
        median_range(&f.bare_agent),
        median_range(&f.ssh),
        median_range(&f.bare_ssh),
        median_range(&f.address_from_send),
        median_range(&f.address_from_return),
        met(gap <= 1.5),
        met(addr <= 5.0),
    )
}

/// A fresh ed25519 key pair in `dir`: the private key's path and the public line.
fn keygen(dir: &Path) -> anyhow::Result<(PathBuf, String)> {
    let key = dir.join("id");
    let out = Command::new("ssh-keygen")
        .args([
            "-q",
            "-t",
            "ed25519",
            "-N",
            "",
            "-C",
            "bench@kubevirt-rs",
            "-f",
        ])
        .arg(&key)
        .output()
        .context("ssh-keygen (apt-get install openssh-client)")?;
    if !out.status.success() {
        bail!("ssh-keygen: {}", String::from_utf8_lossy(&out.stderr));
    }
    let public = std::fs::read_to_string(key.with_extension("pub"))?;
    Ok((key, public.trim().to_string()))
}

/// Runs `command` as the user over SSH; its stdout when it succeeded.
fn ssh(key: &Path, host: &str, port: u16, command: &str) -> Option<String> {
    ssh_with(key, host, port, &[], command)
}

/// An SSH connection kept open (OpenSSH's connection sharing): a command sent through it
/// skips the key exchange and login, which under TCG take seconds, so its start is close to
/// when it runs in the guest.
struct Master {
    socket: PathBuf,
}

impl Master {
    fn open(key: &Path, host: &str, port: u16, n: usize) -> anyhow::Result<Self> {
        let socket = key.with_file_name(format!("cm-{n}"));
        let mut cmd = ssh_command(key, port);
        // `-f`: ssh goes to the background once logged in; its output goes nowhere, so that
        // waiting for it ends then.
        cmd.arg("-M")
            .arg("-S")
            .arg(&socket)
            .args(["-o", "ControlPersist=300", "-f", "-N"])
            .arg(format!("{USER}@{host}"));
        let ok = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            bail!("opening a shared SSH connection to {host}");
        }
        Ok(Self { socket })
    }

    fn run(&self, key: &Path, host: &str, port: u16, command: &str) -> Option<String> {
        let opts = [
            "-S".to_string(),
            self.socket.display().to_string(),
            "-o".to_string(),
            "ControlMaster=no".to_string(),
        ];
        ssh_with(key, host, port, &opts, command)
    }

    fn close(&self, key: &Path, host: &str, port: u16) {
        let opts = [
            "-S".to_string(),
            self.socket.display().to_string(),
            "-O".to_string(),
            "exit".to_string(),
        ];
        let _ = ssh_with(key, host, port, &opts, "");
    }
}

/// [`ssh`] with extra options before the destination; `command` empty for none.
fn ssh_with(key: &Path, host: &str, port: u16, extra: &[String], command: &str) -> Option<String> {
    let mut cmd = ssh_command(key, port);
    cmd.args(extra).arg(format!("{USER}@{host}"));
    if !command.is_empty() {
        cmd.arg(command);
    }
    let out = cmd.stdin(Stdio::null()).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// ssh with the bench's key and options, up to the destination.
fn ssh_command(key: &Path, port: u16) -> Command {
    let mut cmd = Command::new("ssh");
    cmd.arg("-i")
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
            "ConnectTimeout=5",
            "-o",
            "LogLevel=ERROR",
        ]);
    cmd
}

/// Tries SSH every second from `start` until it answers; the time since `start`.
fn ssh_answers(
    key: &Path,
    host: impl Fn() -> Option<String>,
    port: u16,
    start: Instant,
) -> anyhow::Result<Duration> {
    loop {
        let tried = Instant::now();
        if let Some(h) = host()
            && ssh(key, &h, port, "true").is_some()
        {
            return Ok(start.elapsed());
        }
        if start.elapsed() > BOOT_TIMEOUT {
            bail!("no SSH login within {BOOT_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_secs(1).saturating_sub(tried.elapsed()));
    }
}

/// What the VMI watch saw of one VM, on this machine's clock.
#[derive(Default)]
struct Seen {
    running: Option<SystemTime>,
    agent: Option<SystemTime>,
    /// The last event's `AgentConnected`.
    agent_now: bool,
    pod_ip: Option<String>,
    /// The address asked for, and when it showed.
    address: Option<(String, Option<SystemTime>)>,
}

/// The lock of what the watch saw; a panicked watch thread's data is still good to read.
fn lock(s: &Mutex<Seen>) -> std::sync::MutexGuard<'_, Seen> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

fn since(created: SystemTime, t: SystemTime) -> Duration {
    t.duration_since(created).unwrap_or_default()
}

/// One cluster run: create, the watch's steps, SSH, an address; then delete.
#[allow(clippy::too_many_arguments)]
fn cluster_once(
    kube: &Kube,
    ns: &str,
    name: &str,
    image: &str,
    user_data: &str,
    cpu: &str,
    key: &Path,
    n: usize,
    idle: Option<Duration>,
    out: &mut Figures,
) -> anyhow::Result<()> {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let sink = seen.clone();
    let mut watch = kube.cmd();
    // The namespace's VMIs (a watch of one name ends when it does not exist yet).
    watch.args(["-n", ns, "get", "vmi", "-w", "-o", "json"]);
    let me = name.to_string();
    let _children = Children(vec![watch_json(watch, move |v, t| {
        if v.pointer("/metadata/name").and_then(Value::as_str) != Some(me.as_str()) {
            return;
        }
        let mut s = sink.lock().unwrap_or_else(|e| e.into_inner());
        if v.pointer("/status/phase").and_then(Value::as_str) == Some("Running") {
            s.running.get_or_insert(t);
        }
        s.agent_now = agent_connected(v);
        if s.agent_now {
            s.agent.get_or_insert(t);
        }
        if let Some(ip) = pod_ip(v) {
            s.pod_ip = Some(ip);
        }
        if let Some((addr, at)) = s.address.as_mut()
            && at.is_none()
            && has_address(v, addr)
        {
            *at = Some(t);
        }
    })?]);
    // The watch waits for the VMI: it starts before the create.
    std::thread::sleep(Duration::from_millis(500));
    let created = SystemTime::now();
    let start = Instant::now();
    kube.create(&manifest(name, ns, image, user_data, cpu))?;
    let ssh_at = ssh_answers(key, || lock(&seen).pod_ip.clone(), 22, start)?;
    let wait = |what: &str, f: &dyn Fn(&Seen) -> bool| -> anyhow::Result<()> {
        let deadline = Instant::now() + BOOT_TIMEOUT;
        while !f(&lock(&seen)) {
            if Instant::now() > deadline {
                bail!("{name}: no {what} within {BOOT_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    };
    wait("AgentConnected", &|s| s.agent.is_some())?;
    let (running, agent, ip) = {
        let s = lock(&seen);
        (s.running, s.agent, s.pod_ip.clone().unwrap_or_default())
    };
    out.ssh.push(ssh_at);
    out.running.extend(running.map(|t| since(created, t)));
    out.agent.extend(agent.map(|t| since(created, t)));
    // The guest's interface takes an address of a family the pod lacks (IPv6), which the
    // status shows beside the pod's IP.
    let addr = format!("fd00:b:e::{}", n + 1);
    // Over a connection opened beforehand, with the device looked up first: from the
    // command's start to the address existing is then an exec and `sudo ip`, not a login.
    let master = Master::open(key, &ip, 22, n)?;
    let dev = master
        .run(key, &ip, 22, "ip -o route show default | awk '{print $5}'")
        .map(|d| d.trim().to_string())
        .filter(|d| !d.is_empty())
        .context("the guest's default route device over SSH")?;
    lock(&seen).address = Some((addr.clone(), None));
    let sent = SystemTime::now();
    let added = master.run(
        key,
        &ip,
        22,
        &format!("sudo ip -6 addr add {addr}/64 dev {dev}"),
    );
    master.close(key, &ip, 22);
    added.context("ip addr add over SSH")?;
    let returned = SystemTime::now();
    wait("address in the status", &|s| {
        s.address.as_ref().is_some_and(|(_, at)| at.is_some())
    })?;
    if let Some((_, Some(at))) = lock(&seen).address.as_ref() {
        out.address_from_send.push(since(sent, *at));
        out.address_from_return.push(since(returned, *at));
    }
    eprintln!(
        "debian {n}: Running {:.1} s, AgentConnected {:.1} s, SSH {:.1} s after the create; address → status {:.2} s",
        out.running.last().map_or(0.0, Duration::as_secs_f64),
        out.agent.last().map_or(0.0, Duration::as_secs_f64),
        ssh_at.as_secs_f64(),
        out.address_from_send
            .last()
            .map_or(0.0, Duration::as_secs_f64)
    );
    if let Some(window) = idle {
        let uid = kube.run(&[
            "-n",
            ns,
            "get",
            "pods",
            "-l",
            &format!("kubevirt.io=virt-launcher,vm.kubevirt.io/name={name}"),
            "-o",
            "jsonpath={.items[0].metadata.uid}",
        ])?;
        let node = kube.run(&[
            "-n",
            ns,
            "get",
            "vmi",
            name,
            "-o",
            "jsonpath={.status.nodeName}",
        ])?;
        let handler = kube.run(&[
            "-n",
            "kubevirt",
            "get",
            "pods",
            "-l",
            "kubevirt.io=virt-handler",
            "--field-selector",
            &format!("spec.nodeName={}", node.trim()),
            "-o",
            "jsonpath={.items[0].metadata.uid}",
        ])?;
        let agent_cpu = || -> f64 {
            ssh(key, &ip, 22, "cat /proc/$(pidof qemu-ga)/stat")
                .and_then(|s| stat_cpu_seconds(&s))
                .unwrap_or(f64::NAN)
        };
        // Past the first boot's last work (cloud-init's final stage, timers) and the
        // launcher's fresh minute after the address change (interfaces read every 2 s, then
        // every 4 s): the window sees the settled cost. With 30 s here QEMU used 9.85 % of a
        // CPU with the agent, where bare QEMU, polled every 2 s 120 s after its agent came,
        // used 0.97 % against 0.45 % unpolled: the short wait likely measured boot work.
        std::thread::sleep(Duration::from_secs(120));
        eprintln!(
            "debian {n}: {}-s idle window with the agent…",
            window.as_secs()
        );
        let (l0, g0) = (pod_cpu(&uid, &handler), agent_cpu());
        std::thread::sleep(window);
        let (l1, g1) = (pod_cpu(&uid, &handler), agent_cpu());
        ssh(key, &ip, 22, "sudo systemctl stop qemu-guest-agent")
            .context("stopping qemu-guest-agent")?;
        wait("the agent gone", &|s| !s.agent_now)?;
        std::thread::sleep(Duration::from_secs(10));
        eprintln!(
            "debian {n}: {}-s idle window without the agent…",
            window.as_secs()
        );
        let l2 = pod_cpu(&uid, &handler);
        std::thread::sleep(window);
        let l3 = pod_cpu(&uid, &handler);
        let i = Idle {
            seconds: window.as_secs_f64(),
            launcher_on: l1.0 - l0.0,
            qemu_on: l1.1 - l0.1,
            agent_in_guest: g1 - g0,
            launcher_off: l3.0 - l2.0,
            qemu_off: l3.1 - l2.1,
            handler_on: l1.2 - l0.2,
            handler_off: l3.2 - l2.2,
        };
        eprintln!("debian {n}: idle CPU {i:?}");
        out.idle = Some(i);
    }
    Ok(())
}

/// One bare QEMU run: the same disk (an overlay), a seed with the same user data.
fn bare_once(
    guest: &virt_testguest::debian::DebianGuest,
    dir: &Path,
    user_data: &str,
    key: &Path,
    n: usize,
    out: &mut Figures,
) -> anyhow::Result<()> {
    use virt_testguest::debian::{Agent, Firmware, Vm, VmConfig, nocloud_iso};
    let overlay = dir.join(format!("bare-{n}.qcow2"));
    let _ = std::fs::remove_file(&overlay);
    let made = Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2", "-F", "qcow2", "-b"])
        .arg(&guest.disk)
        .arg(&overlay)
        .output()
        .context("qemu-img (apt-get install qemu-utils)")?;
    if !made.status.success() {
        bail!("qemu-img create: {}", String::from_utf8_lossy(&made.stderr));
    }
    let seed = dir.join(format!("seed-{n}.iso"));
    let meta = format!(
        "{{\"instance-id\": \"bench-{n}-{}\", \"local-hostname\": \"bare-{n}\"}}\n",
        std::process::id()
    );
    nocloud_iso(&seed, &meta, user_data)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let agent_socket = dir.join(format!("qga-{n}.sock"));
    let vm = Vm::start(&VmConfig {
        disk: &overlay,
        seed: Some(&seed),
        ssh_port: port,
        agent_socket: &agent_socket,
        memory_mib: MEMORY_MIB,
        // The cluster's VM boots with KubeVirt's default firmware: BIOS.
        firmware: Firmware::Bios,
    })?;
    let start = vm.started();
    let agent_at = {
        let socket = agent_socket.clone();
        std::thread::spawn(move || Agent::connect(&socket, BOOT_TIMEOUT).map(|_| start.elapsed()))
    };
    let ssh_at = ssh_answers(key, || Some("127.0.0.1".to_string()), port, start)
        .map_err(|e| anyhow::anyhow!("bare QEMU: {e}; console:\n{}", vm.console_tail(20)))?;
    let agent_at = agent_at
        .join()
        .map_err(|_| anyhow::anyhow!("the agent thread panicked"))??;
    eprintln!(
        "bare {n}: agent {:.1} s, SSH {:.1} s after the spawn",
        agent_at.as_secs_f64(),
        ssh_at.as_secs_f64()
    );
    out.bare_agent.push(agent_at);
    out.bare_ssh.push(ssh_at);
    drop(vm);
    let _ = std::fs::remove_file(&overlay);
    let _ = std::fs::remove_file(&seed);
    Ok(())
}

/// `runs` turns of each side, alternating which goes first; the section's Debian part.
pub(super) fn run(
    kube: &Kube,
    ns: &str,
    runs: usize,
    idle: Duration,
    cpu: &str,
    delete: impl Fn(&str) -> anyhow::Result<()>,
) -> anyhow::Result<String> {
    let guest = virt_testguest::debian::ensure(&virt_testguest::debian::default_dir())
        .context("the Debian test guest (cargo xtask guest --debian)")?;
    let (image, _) = crate::images::debian_guest_image(&crate::images::Load::Local)?;
    // Short: QEMU's agent socket lives here (unix socket paths are at most 107 bytes).
    let dir = std::env::temp_dir().join(format!("kvrs-bench-deb-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let result = (|| -> anyhow::Result<Figures> {
        let (key, public) = keygen(&dir)?;
        let data = user_data(&public);
        let mut f = Figures::default();
        for i in 0..runs {
            for side in if i % 2 == 0 { [0, 1] } else { [1, 0] } {
                if side == 0 {
                    let name = format!("debian-{i}");
                    // The last VM also measures what following its agent costs.
                    let idle = (i + 1 == runs && !idle.is_zero()).then_some(idle);
                    let r =
                        cluster_once(kube, ns, &name, &image, &data, cpu, &key, i, idle, &mut f);
                    delete(&name)?;
                    r?;
                } else {
                    bare_once(&guest, &dir, &data, &key, i, &mut f)?;
                }
            }
        }
        Ok(f)
    })();
    let _ = std::fs::remove_dir_all(&dir);
    Ok(markdown(&result?, runs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vmi_watch_reads_agent_addresses_and_pod_ip() {
        let vmi = json!({"status": {
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "AgentConnected", "status": "True"}],
            "interfaces": [{"name": "default", "ipAddress": "10.213.0.7",
                            "ipAddresses": ["10.213.0.7", "fe80::1", "fd00:b:e::1"]}]
        }});
        assert!(agent_connected(&vmi));
        assert!(has_address(&vmi, "fd00:b:e::1"));
        assert!(!has_address(&vmi, "fd00:b:e::2"));
        assert_eq!(pod_ip(&vmi).as_deref(), Some("10.213.0.7"));
        let bare =
            json!({"status": {"conditions": [{"type": "AgentConnected", "status": "False"}]}});
        assert!(!agent_connected(&bare));
        assert_eq!(pod_ip(&bare), None);
    }

    #[test]
    fn the_manifest_is_a_containerdisk_vm_with_the_user_data() {
        let data = user_data("ssh-ed25519 AAAA k");
        assert!(data.starts_with("#cloud-config\n"), "{data}");
        assert!(data.contains("      - ssh-ed25519 AAAA k\n"), "{data}");
        let m: Value =
            serde_json::from_str(&manifest("d0", "ns", "img:latest", &data, "10m")).unwrap();
        let spec = &m["spec"]["template"]["spec"];
        assert_eq!(spec["volumes"][0]["containerDisk"]["image"], "img:latest");
        assert_eq!(
            spec["volumes"][1]["cloudInitNoCloud"]["userData"],
            data.as_str()
        );
        assert_eq!(spec["domain"]["memory"]["guest"], "1024Mi");
        assert!(spec["domain"]["devices"]["interfaces"][0]["masquerade"].is_object());
    }

    #[test]
    fn the_table_has_both_sides_and_the_goals() {
        let s = Duration::from_secs_f64;
        let f = Figures {
            running: vec![s(3.0), s(4.0)],
            agent: vec![s(80.0), s(90.0)],
            ssh: vec![s(95.0), s(99.0)],
            address_from_send: vec![s(2.0), s(3.0)],
            address_from_return: vec![s(1.0), s(2.0)],
            bare_agent: vec![s(70.0), s(75.0)],
            bare_ssh: vec![s(94.0), s(96.0)],
            idle: Some(Idle {
                seconds: 300.0,
                launcher_on: 3.0,
                qemu_on: 60.0,
                agent_in_guest: 1.5,
                launcher_off: 1.5,
                qemu_off: 58.0,
                handler_on: 0.6,
                handler_off: 0.3,
            }),
        };
        let t = markdown(&f, 2);
        assert!(t.contains("(2 runs each, alternating)"), "{t}");
        assert!(
            t.contains("| SSH login answered | 95.00 s (95.00–99.00) | 94.00 s (94.00–96.00) |"),
            "{t}"
        );
        assert!(t.contains("gap +1.00 s, met"), "{t}");
        assert!(t.contains("within 5 s: 2.00 s, met"), "{t}");
        assert!(
            t.contains("| 3.00 s (1.00 % of a CPU) | 1.50 s (0.50 %) | +1.50 s (+0.500 %) |"),
            "{t}"
        );
        assert!(
            t.contains("| virt-handler of the VM's node | 0.60 s (0.20 %) | 0.30 s (0.10 %) | +0.30 s (+0.100 %) |"),
            "{t}"
        );
    }

    #[test]
    fn cpu_seconds_come_from_utime_stime_and_the_children() {
        // pid (comm with spaces) state ppid … utime=250 stime=50 cutime=10 cstime=0 …
        let stat = "42 (qemu ga x) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 10 0 20 0 1 0 100 0 0";
        assert_eq!(stat_cpu_seconds(stat), Some(3.1));
        assert_eq!(stat_cpu_seconds("garbage"), None);
    }
}
