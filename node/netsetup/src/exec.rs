//! The plan realised inside a pod's network namespace. Runs `ip` and `nft` (KubeVirt's
//! virt-handler uses `nft` the same way) forked from a short-lived thread that entered the
//! namespace, so the calling process — virt-handler, or a test — never leaves its own.
//! Needs `CAP_NET_ADMIN` and `CAP_SYS_ADMIN` (setns) on the host: virt-handler's.

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::sched::{CloneFlags, setns};

use crate::dhcp;
use crate::plan::{Cidr, Lease, Mac, NFT_TABLE, NetworkPlan, PodInterface};

/// Why a step of the network set-up failed; each names the step.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// A file or namespace could not be opened or entered.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A command failed.
    #[error("{step} failed: {stderr}")]
    Command {
        /// The step (`ip -batch (create bridge and tap)`).
        step: String,
        /// Its error output.
        stderr: String,
    },
    /// What a command printed could not be understood.
    #[error("{what}: {reason}")]
    Parse {
        /// What was read.
        what: String,
        /// Why it is not understood.
        reason: String,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ExecError {
    move |source| ExecError::Io {
        what: what.into(),
        source,
    }
}

/// An open network namespace.
#[derive(Debug)]
pub struct NetNs {
    fd: OwnedFd,
    /// What it is, for messages: a path, or a description that names no host detail
    /// (virt-handler's errors reach users).
    label: String,
}

impl NetNs {
    /// Opens the namespace at `path` (`/run/netns/<name>`).
    pub fn open(path: &Path) -> Result<Self, ExecError> {
        let f = std::fs::File::open(path).map_err(io_err(format!("open {}", path.display())))?;
        Ok(Self {
            fd: f.into(),
            label: path.display().to_string(),
        })
    }

    /// A namespace already open (`ns/net` opened through a checked `/proc/<pid>`
    /// directory), called `label` in messages.
    pub fn from_fd(fd: OwnedFd, label: impl Into<String>) -> Self {
        Self {
            fd,
            label: label.into(),
        }
    }

    /// What it is called in messages.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Runs `f` on a thread that has entered this namespace (sockets it creates live
    /// there); the calling thread stays where it is.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> Result<T, ExecError> {
        std::thread::scope(|s| {
            s.spawn(|| {
                setns(self.fd.as_fd(), CloneFlags::CLONE_NEWNET)
                    .map_err(|e| io_err(format!("enter {}", self.label))(e.into()))?;
                Ok(f())
            })
            .join()
            .unwrap_or_else(|_| {
                Err(ExecError::Parse {
                    what: format!("a task in {}", self.label),
                    reason: "panicked".into(),
                })
            })
        })
    }

    fn output(
        &self,
        step: &str,
        program: &str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<String, ExecError> {
        // A child process starts in the namespace of the thread that forks it.
        let out = self
            .run(|| -> std::io::Result<std::process::Output> {
                let mut child = Command::new(program)
                    .args(args)
                    .stdin(if stdin.is_some() {
                        Stdio::piped()
                    } else {
                        Stdio::null()
                    })
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()?;
                if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
                    pipe.write_all(text.as_bytes())?;
                }
                child.wait_with_output()
            })?
            .map_err(io_err(format!("{step}: run {program}")))?;
        if !out.status.success() {
            return Err(ExecError::Command {
                step: step.into(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

#[derive(serde::Deserialize)]
struct IpLink {
    ifname: String,
    address: Option<String>,
    mtu: u32,
    #[serde(default)]
    addr_info: Vec<IpAddr>,
}

#[derive(serde::Deserialize)]
struct IpAddr {
    family: String,
    local: String,
    prefixlen: u8,
    #[serde(default)]
    scope: String,
}

#[derive(serde::Deserialize)]
struct IpRoute {
    gateway: Option<String>,
}

/// The pod interface `name` as the CNI plugin left it: MAC, first global IPv4 address,
/// default gateway, MTU.
pub fn read_pod_interface(ns: &NetNs, name: &str) -> Result<PodInterface, ExecError> {
    let step = format!("read {name} in {}", ns.label);
    let links: Vec<IpLink> = parse(
        &step,
        &ns.output(&step, "ip", &["-j", "address", "show", "dev", name], None)?,
    )?;
    let link = links
        .into_iter()
        .find(|l| l.ifname == name)
        .ok_or_else(|| ExecError::Parse {
            what: step.clone(),
            reason: "no such interface".into(),
        })?;
    let address = link
        .addr_info
        .iter()
        .find(|a| a.family == "inet" && a.scope != "link" && a.scope != "host")
        .and_then(|a| {
            Some(Cidr {
                addr: a.local.parse().ok()?,
                prefix: a.prefixlen,
            })
        })
        .ok_or_else(|| ExecError::Parse {
            what: step.clone(),
            reason: "no IPv4 address".into(),
        })?;
    let mac = link
        .address
        .as_deref()
        .and_then(Mac::parse)
        .ok_or_else(|| ExecError::Parse {
            what: step.clone(),
            reason: "no MAC address".into(),
        })?;
    let routes: Vec<IpRoute> = parse(
        &step,
        &ns.output(
            &step,
            "ip",
            &["-j", "-4", "route", "show", "default", "dev", name],
            None,
        )?,
    )?;
    let gateway = routes
        .iter()
        .find_map(|r| r.gateway.as_deref()?.parse::<Ipv4Addr>().ok());
    Ok(PodInterface {
        name: name.to_string(),
        mac,
        address,
        gateway,
        mtu: link.mtu,
    })
}

fn parse<T: serde::de::DeserializeOwned>(what: &str, text: &str) -> Result<T, ExecError> {
    serde_json::from_str(text).map_err(|e| ExecError::Parse {
        what: what.into(),
        reason: e.to_string(),
    })
}

/// Builds what `plan` needs inside `ns`. On failure everything it created is removed again
/// (best effort) before the error is returned, so a failed set-up leaves nothing behind.
pub fn apply(ns: &NetNs, plan: &NetworkPlan) -> Result<(), ExecError> {
    let r = apply_steps(ns, plan);
    if r.is_err()
        && let Err(e) = teardown(ns, plan)
    {
        tracing::warn!(netns = %ns.label, error = %e, "cleanup after a failed network set-up");
    }
    r
}

fn apply_steps(ns: &NetNs, plan: &NetworkPlan) -> Result<(), ExecError> {
    ns.output(
        "ip -batch (bridge and tap)",
        "ip",
        &["-batch", "-"],
        Some(&plan.ip_batch()),
    )?;
    for (key, value) in plan.sysctls() {
        let path = Path::new("/proc/sys").join(&key);
        // /proc/sys/net resolves against the namespace of the thread that opens it.
        ns.run(|| std::fs::write(&path, value))?
            .map_err(io_err(format!("sysctl {key}={value}")))?;
    }
    if let Some(rules) = plan.nft_ruleset() {
        ns.output("nft (masquerade rules)", "nft", &["-f", "-"], Some(&rules))?;
    }
    Ok(())
}

/// Removes what [`apply`] created (and restores the pod interface for the bridge binding).
/// Tolerates parts already gone. The namespace itself goes with its pod.
pub fn teardown(ns: &NetNs, plan: &NetworkPlan) -> Result<(), ExecError> {
    let mut first_error = None;
    if plan.nft_ruleset().is_some() {
        let listed = ns.output("nft list tables", "nft", &["list", "tables"], None);
        let ours = format!("table ip {NFT_TABLE}");
        if listed.is_ok_and(|t| t.lines().any(|l| l.trim() == ours))
            && let Err(e) = ns.output(
                "nft delete table",
                "nft",
                &["delete", "table", "ip", NFT_TABLE],
                None,
            )
        {
            first_error = Some(e);
        }
    }
    // -force: carry on past lines whose object is already gone; errors still exit non-zero.
    if let Err(e) = ns.output(
        "ip -batch (teardown)",
        "ip",
        &["-force", "-batch", "-"],
        Some(&plan.ip_teardown()),
    ) {
        let benign = matches!(&e, ExecError::Command { stderr, .. }
            if stderr.lines().all(|l| l.contains("Cannot find device") || l.contains("File exists") || l.starts_with("Command failed") || l.trim().is_empty()));
        if !benign && first_error.is_none() {
            first_error = Some(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// What [`apply`] left in `ns`, for checks: link names and nftables tables.
pub fn inventory(ns: &NetNs) -> Result<(Vec<String>, Vec<String>), ExecError> {
    #[derive(serde::Deserialize)]
    struct Link {
        ifname: String,
    }
    let links: Vec<Link> = parse(
        "ip link",
        &ns.output("ip link", "ip", &["-j", "link", "show"], None)?,
    )?;
    let tables = ns.output("nft list tables", "nft", &["list", "tables"], None)?;
    Ok((
        links.into_iter().map(|l| l.ifname).collect(),
        tables
            .lines()
            .map(|l| l.trim().to_string())
            .filter(|l| !l.is_empty())
            .collect(),
    ))
}

/// The guest's DHCP server socket: UDP port 67 on `device` inside `ns`. Binding port 67 and
/// to a device takes privileges the launcher does not have, so virt-handler opens it and
/// the launcher only ever holds this one socket.
pub fn dhcp_socket(ns: &NetNs, device: &str) -> Result<UdpSocket, ExecError> {
    let device = device.to_string();
    ns.run(move || -> std::io::Result<UdpSocket> {
        let s = socket2::Socket::new(
            socket2::Domain::IPV4,
            socket2::Type::DGRAM,
            Some(socket2::Protocol::UDP),
        )?;
        s.set_reuse_address(true)?;
        s.set_broadcast(true)?;
        s.bind_device(Some(device.as_bytes()))?;
        s.bind(&SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 67).into())?;
        Ok(s.into())
    })?
    .map_err(io_err("open the DHCP socket"))
}

/// Answers the guest's DHCP requests on `socket` until receiving fails. Blocking; run it on
/// its own thread. An answer that cannot be sent (a request naming an unroutable client
/// address) is logged and the next request served: the guest must not be able to end
/// DHCP for the pod's life with one odd packet.
pub fn serve_dhcp(socket: &UdpSocket, lease: &Lease) -> std::io::Result<()> {
    let mut buf = [0u8; 1500];
    loop {
        let (n, _) = socket.recv_from(&mut buf)?;
        if let Some(reply) = dhcp::answer(&buf[..n], lease) {
            tracing::debug!(kind = ?reply.kind, to = %reply.to, mac = %lease.mac, "DHCP answer");
            if let Err(e) = socket.send_to(&reply.bytes, SocketAddrV4::new(reply.to, 68)) {
                tracing::warn!(to = %reply.to, error = %e, "DHCP answer not sent");
            }
        }
    }
}

/// Major and minor number of the TUN/TAP clone device.
const TUN_DEVICE: (u32, u32) = (10, 200);

/// Makes `/dev/net/tun` exist in the container whose root directory is `root`, so that its
/// QEMU can open the tap built for it. The launcher holds no capability and cannot create a
/// device node itself; the container runtime's device cgroup already admits this one device
/// (runc allows TUN/TAP by default), so a node in the container's own `/dev` tmpfs is all
/// it lacks. `root` is a descriptor (`/proc/<pid>/root` opened through a checked process
/// directory) and `/dev/net` is resolved in it without following any symlink: the
/// container's files are the tenant's, and a link there must not point the device (made
/// as root) anywhere else.
pub fn provide_tun(root: impl AsFd) -> Result<(), ExecError> {
    use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};
    let what = |step: &str| format!("{step} /dev/net/tun in the launcher container");
    let resolve = ResolveFlags::IN_ROOT | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    let dev = rustix::fs::openat2(
        &root,
        "dev",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        resolve,
    )
    .map_err(|e| io_err(what("open /dev for"))(e.into()))?;
    match rustix::fs::mkdirat(&dev, "net", Mode::from_raw_mode(0o755)) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
        Err(e) => return Err(io_err(what("create /dev/net for"))(e.into())),
    }
    // BENEATH, not IN_ROOT: the kernel takes one or the other (EINVAL for both).
    let net = rustix::fs::openat2(
        &dev,
        "net",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|e| io_err(what("open /dev/net for"))(e.into()))?;
    match rustix::fs::statat(&net, "tun", rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::CharacterDevice => {
            return Ok(());
        }
        Ok(_) => {
            return Err(ExecError::Io {
                what: "/dev/net/tun in the launcher container exists and is not a device".into(),
                source: std::io::Error::from(std::io::ErrorKind::AlreadyExists),
            });
        }
        Err(rustix::io::Errno::NOENT) => {}
        Err(e) => return Err(io_err(what("look at"))(e.into())),
    }
    // mknod never follows a symlink at its last component, and `net` is held open.
    rustix::fs::mknodat(
        &net,
        "tun",
        FileType::CharacterDevice,
        Mode::from_raw_mode(0o666),
        rustix::fs::makedev(TUN_DEVICE.0, TUN_DEVICE.1),
    )
    .map_err(|e| io_err(what("mknod"))(e.into()))?;
    // mknod's mode is masked by the umask; the node is set through a descriptor of it.
    let tun = rustix::fs::openat2(
        &net,
        "tun",
        OFlags::PATH | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS,
    )
    .map_err(|e| io_err(what("open"))(e.into()))?;
    let path = PathBuf::from(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&tun)
    ));
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o666))
        .map_err(io_err(what("chmod")))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::os::unix::fs::FileTypeExt as _;

    /// The tun device is made in a container root given as a descriptor (virt-handler runs as
    /// root, so do the tests of this crate), and a symlink there is never followed out.
    #[test]
    fn the_tun_device_is_made_in_the_container_root_and_nowhere_else() {
        assert!(
            nix::unistd::geteuid().is_root(),
            "this test makes a device node: run it as root, as virt-handler runs"
        );
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("dev")).unwrap();
        let fd = std::fs::File::open(root.path()).unwrap();
        provide_tun(&fd).unwrap();
        let tun = std::fs::symlink_metadata(root.path().join("dev/net/tun")).unwrap();
        assert!(tun.file_type().is_char_device());
        // Again: already there, nothing to do.
        provide_tun(&fd).unwrap();

        let other = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir(other.path().join("dev")).unwrap();
        std::os::unix::fs::symlink(outside.path(), other.path().join("dev/net")).unwrap();
        let fd = std::fs::File::open(other.path()).unwrap();
        assert!(provide_tun(&fd).is_err());
        assert!(!outside.path().join("tun").exists());
    }
}
