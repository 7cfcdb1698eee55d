//! The local cluster's processes as this host sees them. Its nodes are network namespaces
//! of this machine, so every container's process is in this host's `/proc`, in another PID
//! namespace than the tools' own, with its pod's uid in its cgroup path. Tools that inject
//! faults (the chaos suite, the soak, e2e tests) find their victims here, and the chaos
//! suite counts QEMU processes against VMIs from here.

use std::path::Path;
use std::process::Command;

/// A process running in one of the local cluster's containers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proc {
    pub pid: i32,
    /// `/proc/PID/comm`: the executable's name, at most 15 bytes.
    pub comm: String,
    pub cmdline: Vec<String>,
    /// The uid of the pod whose cgroup holds the process.
    pub pod_uid: Option<String>,
}

impl Proc {
    /// The libvirt domain a QEMU process runs (`-name guest=NS_NAME,…`).
    pub fn qemu_domain(&self) -> Option<&str> {
        qemu_domain(&self.cmdline)
    }
}

/// Every process of the cluster's containers: in a pod's cgroup (virt-handler shares the
/// host's PID namespace) or in another PID namespace than this one. Not the virt-apiserver
/// processes tests running beside the cluster start themselves, which are no victims.
/// Processes that end while being read are skipped.
pub fn in_containers() -> Vec<Proc> {
    let ours = std::fs::read_link("/proc/self/ns/pid").ok();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.parse::<i32>().ok()?;
            let path = e.path();
            let foreign = std::fs::read_link(path.join("ns/pid")).ok() != ours;
            read(pid, &path).filter(|p| foreign || p.pod_uid.is_some())
        })
        .collect()
}

fn read(pid: i32, path: &Path) -> Option<Proc> {
    let comm = std::fs::read_to_string(path.join("comm")).ok()?;
    let cmdline = std::fs::read(path.join("cmdline")).ok()?;
    let cgroup = std::fs::read_to_string(path.join("cgroup")).unwrap_or_default();
    Some(Proc {
        pid,
        comm: comm.trim().to_string(),
        cmdline: cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect(),
        pod_uid: pod_uid_of_cgroup(&cgroup),
    })
}

/// The pod uid in a `/proc/PID/cgroup` text: `…/kubepods/burstable/pod<uid>/…` with the
/// cgroupfs driver, `…kubepods-burstable-pod<uid with _>.slice…` with systemd's.
pub fn pod_uid_of_cgroup(cgroup: &str) -> Option<String> {
    const UID_LEN: usize = 36;
    cgroup.lines().find_map(|line| {
        line.match_indices("pod").find_map(|(i, _)| {
            let rest = line.get(i + 3..i + 3 + UID_LEN)?;
            let uid = rest.replace('_', "-");
            let ok = uid.bytes().enumerate().all(|(j, b)| match j {
                8 | 13 | 18 | 23 => b == b'-',
                _ => b.is_ascii_hexdigit(),
            });
            ok.then_some(uid)
        })
    })
}

/// The domain name in a QEMU command line, from libvirt's `-name guest=NAME,debug-threads=on`.
pub fn qemu_domain(cmdline: &[String]) -> Option<&str> {
    let i = cmdline.iter().position(|a| a == "-name")?;
    let value = cmdline.get(i + 1)?;
    let first = value.split(',').next()?;
    Some(first.strip_prefix("guest=").unwrap_or(first))
}

/// SIGKILLs `pid`; false when it is already gone or may not be signalled.
pub fn kill9(pid: i32) -> bool {
    Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

/// SIGKILLs every container process named `comm` and returns how many.
pub fn kill_in_containers(comm: &str) -> usize {
    in_containers()
        .into_iter()
        .filter(|p| p.comm == comm)
        .filter(|p| kill9(p.pid))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_uid_from_either_cgroup_driver() {
        let cgroupfs = "1:cpu:/kubepods/burstable/pod475ca4b3-e099-4a80-8eb8-0e24835c23d2/fea1aa\n\
                        0::/kubepods/burstable/pod475ca4b3-e099-4a80-8eb8-0e24835c23d2/fea1aa\n";
        assert_eq!(
            pod_uid_of_cgroup(cgroupfs).as_deref(),
            Some("475ca4b3-e099-4a80-8eb8-0e24835c23d2")
        );
        let systemd = "0::/kubepods.slice/kubepods-besteffort.slice/\
                       kubepods-besteffort-pod475ca4b3_e099_4a80_8eb8_0e24835c23d2.slice/cri-x.scope\n";
        assert_eq!(
            pod_uid_of_cgroup(systemd).as_deref(),
            Some("475ca4b3-e099-4a80-8eb8-0e24835c23d2")
        );
        assert_eq!(pod_uid_of_cgroup("0::/user.slice/session-1.scope\n"), None);
        assert_eq!(pod_uid_of_cgroup("0::/kubepods/podnot-a-uid\n"), None);
    }

    #[test]
    fn domain_from_a_libvirt_qemu_command_line() {
        let args: Vec<String> = [
            "/usr/bin/qemu-system-x86_64",
            "-name",
            "guest=probe_p1,debug-threads=on",
            "-S",
        ]
        .map(String::from)
        .into();
        assert_eq!(qemu_domain(&args), Some("probe_p1"));
        assert_eq!(qemu_domain(&["qemu".to_string()]), None);
    }
}
