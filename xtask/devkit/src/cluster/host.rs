//! What the cluster changes on the host outside its work dir, and how `down` undoes it.
//!
//! kubelet and the CNI bridge plugin change sysctls and write a few fixed host paths whatever we
//! configure; `up` records their state before the first start so that `down` restores exactly
//! that and removes only paths that did not exist before.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::json;

use super::Layout;

/// Sysctls changed by kubelet (overcommit, panic) and the bridge plugin (forwarding).
const SYSCTLS: &[&str] = &[
    "/proc/sys/net/ipv4/ip_forward",
    "/proc/sys/vm/overcommit_memory",
    "/proc/sys/kernel/panic",
    "/proc/sys/kernel/panic_on_oops",
    "/proc/sys/net/ipv4/conf/all/route_localnet",
    "/proc/sys/net/bridge/bridge-nf-call-iptables",
];

/// Fixed paths kubelet, containerd's runc shim and CNI create regardless of our settings.
const HOST_PATHS: &[&str] = &[
    "/var/lib/kubelet",
    "/var/lib/cni",
    "/var/log/containers",
    "/var/log/pods",
    "/usr/libexec/kubernetes",
    "/run/containerd",
    // virt-operator's etcd data when the cluster has no default StorageClass (hostPath).
    "/var/lib/kubevirt-rs",
];

fn record_path(layout: &Layout) -> PathBuf {
    layout.state.join("host-before.json")
}

/// The host's state before our first `up`.
#[derive(Debug, Default)]
pub struct Before {
    sysctls: Vec<(String, String)>,
    absent_paths: Vec<String>,
    /// `family name` of each nftables table; `None` without the `nft` tool.
    nft_tables: Option<Vec<String>>,
}

/// nftables tables (`ip nat`, `ip6 mangle`, …): iptables-nft creates them on first use and never
/// removes them.
fn nft_tables() -> Option<Vec<String>> {
    let out = Command::new("nft").args(["list", "tables"]).output().ok()?;
    out.status.success().then(|| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("table "))
            .map(str::to_string)
            .collect()
    })
}

/// Tables that appeared since the record and that hold nothing but empty built-in chains.
fn new_empty_tables(before: &Before) -> Vec<String> {
    let (Some(old), Some(now)) = (&before.nft_tables, nft_tables()) else {
        return Vec::new();
    };
    now.into_iter()
        .filter(|t| !old.contains(t))
        .filter(|t| {
            let Some((family, name)) = t.split_once(' ') else {
                return false;
            };
            let program = match family {
                "ip" => "iptables",
                "ip6" => "ip6tables",
                _ => return false,
            };
            Command::new(program)
                .args(["-w", "-t", name, "-S"])
                .output()
                .is_ok_and(|o| {
                    o.status.success()
                        && String::from_utf8_lossy(&o.stdout)
                            .lines()
                            .all(|l| l.starts_with("-P ") && l.ends_with(" ACCEPT"))
                })
        })
        .collect()
}

/// Records the host's state, once per cluster lifetime (a reused cluster has changed it already).
pub fn record(layout: &Layout) -> anyhow::Result<()> {
    let path = record_path(layout);
    if path.exists() {
        return Ok(());
    }
    let sysctls: serde_json::Map<String, serde_json::Value> = SYSCTLS
        .iter()
        .filter_map(|s| {
            fs::read_to_string(s)
                .ok()
                .map(|v| (s.to_string(), json!(v.trim())))
        })
        .collect();
    let absent: Vec<&str> = HOST_PATHS
        .iter()
        .copied()
        .filter(|p| !Path::new(p).exists())
        .collect();
    fs::write(
        &path,
        serde_json::to_string_pretty(&json!({
            "sysctls": sysctls,
            "absent_paths": absent,
            "nft_tables": nft_tables(),
        }))?,
    )?;
    Ok(())
}

/// Makes /run/netns a shared mount point of its own, as iproute2's `ip netns add` does when
/// it is not one. Done before the first pod: if `ip netns add` (the netsetup tests, `bench
/// network`) did it later, its bind would hide every pod's namespace file below it, and
/// containerd could no longer remove them ("device or resource busy" on each pod deletion).
pub fn pin_netns_dir() -> anyhow::Result<()> {
    const DIR: &str = "/run/netns";
    if is_mount_point(DIR) {
        return Ok(());
    }
    fs::create_dir_all(DIR).with_context(|| format!("creating {DIR}"))?;
    for args in [&["--bind", DIR, DIR][..], &["--make-shared", DIR]] {
        let out = Command::new("mount").args(args).output()?;
        anyhow::ensure!(
            out.status.success(),
            "mount {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Loads the record (empty if there is none: then nothing is restored or removed).
pub fn load(layout: &Layout) -> Before {
    let Ok(text) = fs::read_to_string(record_path(layout)) else {
        return Before::default();
    };
    let Ok(v) = serde_json::from_str::<serde_json::Value>(&text) else {
        return Before::default();
    };
    Before {
        sysctls: v["sysctls"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                    .collect()
            })
            .unwrap_or_default(),
        absent_paths: v["absent_paths"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|p| p.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default(),
        nft_tables: v["nft_tables"].as_array().map(|a| {
            a.iter()
                .filter_map(|p| p.as_str().map(String::from))
                .collect()
        }),
    }
}

fn ctr(layout: &Layout, args: &[&str]) -> Option<String> {
    let out = Command::new("ctr")
        .arg("--address")
        .arg(&layout.containerd_socket)
        .args(["--namespace", "k8s.io"])
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// IDs of the tasks (running containers) in the cluster's containerd.
pub fn containerd_tasks(layout: &Layout) -> Vec<String> {
    ctr(layout, &["tasks", "ls", "--quiet"])
        .map(|s| {
            s.lines()
                .map(str::to_string)
                .filter(|l| !l.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// Kills and deletes every task and container left in the cluster's containerd, so that the
/// shims exit and release their mounts.
pub fn remove_containerd_workloads(layout: &Layout) {
    let tasks = containerd_tasks(layout);
    for t in &tasks {
        let _ = ctr(layout, &["tasks", "kill", "--signal", "SIGKILL", t]);
    }
    for t in &tasks {
        let _ = ctr(layout, &["tasks", "delete", "--force", t]);
    }
    if let Some(containers) = ctr(layout, &["containers", "ls", "--quiet"]) {
        for c in containers.lines().filter(|l| !l.is_empty()) {
            let _ = ctr(layout, &["containers", "delete", c]);
        }
    }
}

/// Programs the cluster runs; any other process mentioning our work dir (say, a `tail -f` of a
/// log) is the user's business.
const OUR_PROGRAMS: &[&str] = &[
    "etcd",
    "containerd",
    "containerd-shim-runc-v2",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
    "kube-proxy",
];

/// Cluster programs whose command line mentions our work dir: daemons and containerd shims.
fn our_processes(layout: &Layout) -> Vec<(i32, String)> {
    let needle = layout.cluster.display().to_string();
    let me = std::process::id();
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| u32::try_from(*pid).ok() != Some(me))
        .filter(|pid| {
            fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| {
                exe.file_name()
                    .is_some_and(|n| OUR_PROGRAMS.iter().any(|p| n.to_string_lossy() == *p))
            })
        })
        .filter_map(|pid| {
            let cmd = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            cmd.contains(&needle).then(|| (pid, cmd.trim().to_string()))
        })
        .collect()
}

/// SIGKILLs whatever of ours is still running after the orderly stop (shims of tasks that could
/// not be deleted). Selected by PID from command lines naming our work dir, never by name.
pub fn kill_leftover_processes(layout: &Layout) {
    for (pid, _) in our_processes(layout) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

/// Mount points under our work dir, kubelet's fixed dirs, the shims' state and CNI's netns files,
/// deepest first.
fn our_mounts(layout: &Layout) -> Vec<String> {
    let prefixes = [
        format!("{}/", layout.cluster.display()),
        "/run/netns/cni-".to_string(),
        "/var/lib/kubelet/".to_string(),
        "/run/containerd/".to_string(),
    ];
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut mounts: Vec<String> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape_mount)
        .filter(|m| prefixes.iter().any(|p| m.starts_with(p.as_str())))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    mounts.dedup();
    mounts
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape_mount(s: &str) -> String {
    s.replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

fn cni_netns() -> Vec<PathBuf> {
    fs::read_dir("/run/netns")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with("cni-"))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// Unmounts everything of ours and removes CNI's network namespace files.
pub fn unmount_all(layout: &Layout) -> anyhow::Result<()> {
    kill_leftover_processes(layout);
    unmount_ours(layout);
    if cni_netns().iter().any(|ns| fs::remove_file(ns).is_err()) && is_mount_point("/run/netns") {
        // iproute2's `ip netns add` (the netsetup tests, `bench network`) bind-mounts /run/netns
        // onto itself. CNI files mounted before that are hidden below the bind: `umount` by path
        // says "not mounted" while `unlink` says busy. Detaching the bind uncovers them; iproute2
        // makes it again on next use.
        let _ = Command::new("umount").arg("-l").arg("/run/netns").output();
        unmount_ours(layout);
    }
    for ns in cni_netns() {
        fs::remove_file(&ns).with_context(|| format!("removing {}", ns.display()))?;
    }
    Ok(())
}

fn is_mount_point(path: &str) -> bool {
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|m| unescape_mount(m) == path)
}

fn unmount_ours(layout: &Layout) {
    // Mounts can be stacked: repeat until none is left or nothing changes.
    for _ in 0..5 {
        let mounts = our_mounts(layout);
        if mounts.is_empty() {
            break;
        }
        for m in &mounts {
            let ok = Command::new("umount")
                .arg(m)
                .output()
                .is_ok_and(|o| o.status.success());
            if !ok {
                let _ = Command::new("umount").arg("-l").arg(m).output();
            }
        }
    }
}

/// kubelet's `kubepods` cgroup trees in every hierarchy.
fn kubepods_cgroups() -> Vec<PathBuf> {
    let mut roots = vec![PathBuf::from("/sys/fs/cgroup")];
    if let Ok(d) = fs::read_dir("/sys/fs/cgroup") {
        roots.extend(d.filter_map(|e| e.ok()).map(|e| e.path()));
    }
    let mut seen = Vec::new();
    for r in roots {
        let Ok(r) = r.canonicalize() else { continue };
        let k = r.join("kubepods");
        if k.is_dir() && !seen.contains(&k) {
            seen.push(k);
        }
    }
    // The second node's cgroup root (its kubepods below it).
    for d in super::node2::cgroup_dirs() {
        if let Ok(d) = d.canonicalize()
            && d.is_dir()
            && !seen.contains(&d)
        {
            seen.push(d);
        }
    }
    seen
}

/// cgroup directories can only be removed with rmdir, children first.
fn remove_cgroup_tree(dir: &Path) {
    if let Ok(d) = fs::read_dir(dir) {
        for e in d.filter_map(|e| e.ok()) {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let _ = fs::remove_dir(dir);
}

/// Restores sysctls, removes kubelet's cgroups and the fixed host paths we created.
pub fn restore(layout: &Layout) -> anyhow::Result<()> {
    let before = load(layout);
    for (path, value) in &before.sysctls {
        fs::write(path, value).with_context(|| format!("restoring {path}"))?;
    }
    for cg in kubepods_cgroups() {
        remove_cgroup_tree(&cg);
    }
    for t in new_empty_tables(&before) {
        let mut args = vec!["delete", "table"];
        args.extend(t.split(' '));
        let _ = Command::new("nft").args(&args).output();
    }
    for p in &before.absent_paths {
        if Path::new(p).exists() {
            fs::remove_dir_all(p).with_context(|| format!("removing {p}"))?;
        }
    }
    Ok(())
}

/// Everything of ours still on the machine, for `down` to verify and `status` to report.
pub fn leftovers(layout: &Layout, before: &Before) -> Vec<String> {
    let mut left = Vec::new();
    for (pid, cmd) in our_processes(layout) {
        left.push(format!("process {pid}: {cmd}"));
    }
    for m in our_mounts(layout) {
        left.push(format!("mount {m}"));
    }
    for ns in cni_netns() {
        left.push(format!("network namespace {}", ns.display()));
    }
    for cg in kubepods_cgroups() {
        left.push(format!("cgroup {}", cg.display()));
    }
    for p in &before.absent_paths {
        if Path::new(p).exists() {
            left.push(format!("path {p}"));
        }
    }
    for (path, value) in &before.sysctls {
        if fs::read_to_string(path).is_ok_and(|v| v.trim() != value) {
            left.push(format!("sysctl {path} != {value}"));
        }
    }
    for t in new_empty_tables(before) {
        left.push(format!("nftables table {t}"));
    }
    if layout.state.exists() {
        left.push(format!("work dir {}", layout.state.display()));
    }
    left.extend(super::net::leftovers());
    left
}
