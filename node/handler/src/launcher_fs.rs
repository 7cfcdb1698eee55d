//! A launcher's sockets directory, reached from the node without any host path.
//!
//! The launcher pod keeps its sockets in an emptyDir (no hostPath: the pod passes Pod
//! Security `restricted`). virt-handler runs in the host's pid namespace and reaches that
//! directory through `/proc/<pid>/root` of a process of the pod's compute container.
//!
//! Everything in that directory belongs to the launcher, which a user with
//! `kubevirt.io:edit` can `kubectl exec` into: a name there may be a symlink to a host
//! path (`/proc/1/root/run/containerd/containerd.sock`). So nothing here follows a path
//! the way `open(2)` does:
//! - the process is chosen by its pod uid in its cgroup, which the kernel keeps (a
//!   container cannot write its own), and the root is opened relative to the `/proc/<pid>`
//!   directory that was checked, so a pid reused in between fails instead of pointing
//!   elsewhere;
//! - the directory is resolved with `RESOLVE_IN_ROOT` (symlinks stay inside the
//!   container's root, as the container itself sees them) and no magic links;
//! - each entry is opened with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, and a socket is
//!   connected through `/proc/self/fd/<that fd>`: the inode checked is the one connected;
//! - files are opened the same way, non-blocking, and used only when regular (a FIFO
//!   would hang the reader); sockets are bound on a name that must not exist (bind never
//!   follows a symlink).

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustix::fs::{Mode, OFlags, ResolveFlags};

/// The sockets directory inside the launcher container (docs/cluster-flow.md §2).
pub const SOCKETS_DIR: &str = "var/run/kubevirt-rs/sockets";
/// The launcher's command socket in it.
pub const CMD_SOCKET: &str = "cmd.sock";
/// The serial console socket (bound by QEMU).
pub const CONSOLE_SOCKET: &str = "console.sock";
/// The VNC socket (bound by QEMU).
pub const VNC_SOCKET: &str = "vnc.sock";

/// Why a launcher's directory could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum LauncherFsError {
    /// No process of the pod runs on this node (not started yet, or gone).
    #[error("no process of launcher pod {0} runs on this node")]
    NotRunning(String),
    /// A name in the directory is not what it must be.
    #[error("{path}: {reason}")]
    Refused {
        /// The name, relative to the sockets directory.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A system call failed.
    #[error("{path}: {source}")]
    Io {
        /// What was being opened.
        path: String,
        /// The error.
        source: std::io::Error,
    },
}

impl LauncherFsError {
    /// As an I/O error of the same kind (a launcher not running is `NotFound`).
    pub fn into_io(self) -> std::io::Error {
        match self {
            Self::Io { source, .. } => source,
            e @ Self::NotRunning(_) => std::io::Error::new(std::io::ErrorKind::NotFound, e),
            e @ Self::Refused { .. } => std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        }
    }
}

fn io(path: impl Into<String>, source: impl Into<std::io::Error>) -> LauncherFsError {
    LauncherFsError::Io {
        path: path.into(),
        source: source.into(),
    }
}

/// Whether `cgroup` (the text of `/proc/<pid>/cgroup`) places the process in pod `uid`:
/// kubelet names the pod's cgroup `pod<uid>` (cgroupfs driver) or
/// `kubepods-…-pod<uid with _>.slice` (systemd driver).
pub fn in_pod(cgroup: &str, uid: &str) -> bool {
    if uid.is_empty() || !uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
        return false;
    }
    let plain = format!("pod{uid}");
    let systemd = format!("pod{}.slice", uid.replace('-', "_"));
    cgroup.lines().any(|line| {
        let path = line.splitn(3, ':').nth(2).unwrap_or("");
        path.split('/')
            .any(|part| part == plain || part.ends_with(&systemd))
    })
}

/// The processes of each pod of `uids` below `proc` (normally `/proc`), lowest pid
/// first: one pass over the processes for all of them.
fn pods_pids(proc: &Path, uids: &[String]) -> Vec<(String, Vec<u32>)> {
    let mut out: Vec<(String, Vec<u32>)> = uids.iter().map(|u| (u.clone(), Vec::new())).collect();
    let Ok(rd) = std::fs::read_dir(proc) else {
        return out;
    };
    let mut pids: Vec<u32> = rd
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .collect();
    pids.sort_unstable();
    for pid in pids {
        let Ok(cgroup) = std::fs::read_to_string(proc.join(pid.to_string()).join("cgroup")) else {
            continue;
        };
        if let Some((_, list)) = out.iter_mut().find(|(u, _)| in_pod(&cgroup, u)) {
            list.push(pid);
        }
    }
    out
}

/// The first process of pod `uid` below `proc` whose container has the directory `marker`
/// (relative to its root, resolved in it): a container told from the pod's others (the
/// pause container, sidecars) by a path only it has. Blocking (it reads `/proc`).
pub fn container_pid(proc: &Path, uid: &str, marker: &str) -> Option<u32> {
    let (_, pids) = pods_pids(proc, &[uid.to_string()]).pop()?;
    pids.into_iter().find(|pid| {
        Peer::of_pid(proc, *pid, Some(uid))
            .and_then(|p| p.dir(marker))
            .is_ok()
    })
}

/// Where one launcher's sockets directory is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Location {
    /// The compute container of launcher pod `uid` on this node, found below `proc`
    /// (`/proc`): how virt-handler reaches launcher pods.
    Pod {
        /// The procfs root.
        proc: PathBuf,
        /// The pod's uid.
        uid: String,
    },
    /// A directory of this host: a launcher started beside the handler (tests).
    Host(PathBuf),
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Pod { uid, .. } => write!(f, "pod {uid}"),
            Self::Host(p) => write!(f, "{}", p.display()),
        }
    }
}

/// A launcher's sockets directory, opened when first needed and kept: once open it stays
/// readable after the launcher's processes are gone (for the outcome it left), while
/// the pod exists.
#[derive(Clone, Debug)]
pub struct LauncherDir {
    location: Location,
    open: Arc<Mutex<Option<Arc<SocketsDir>>>>,
}

impl LauncherDir {
    /// The directory at `location`, not opened yet.
    pub fn new(location: Location) -> Self {
        Self {
            location,
            open: Arc::default(),
        }
    }

    /// Where it is.
    pub fn location(&self) -> &Location {
        &self.location
    }

    /// The directory, opened now if not yet (off the async threads: it reads /proc).
    pub async fn get(&self) -> Result<Arc<SocketsDir>, LauncherFsError> {
        if let Some(d) = self.open.lock().ok().and_then(|g| g.clone()) {
            return Ok(d);
        }
        self.reopen().await
    }

    async fn reopen(&self) -> Result<Arc<SocketsDir>, LauncherFsError> {
        let location = self.location.clone();
        let d = tokio::task::spawn_blocking(move || match &location {
            Location::Pod { proc, uid } => SocketsDir::open(proc, uid),
            Location::Host(dir) => SocketsDir::at(dir),
        })
        .await
        .map_err(|e| io(self.location.to_string(), std::io::Error::other(e)))??;
        let d = Arc::new(d);
        if let Ok(mut g) = self.open.lock() {
            *g = Some(d.clone());
        }
        Ok(d)
    }

    /// Reads the regular file `name` in it, at most `limit` bytes.
    pub async fn read(&self, name: &str, limit: u64) -> Result<Vec<u8>, LauncherFsError> {
        let d = self.get().await?;
        let name = name.to_string();
        let what = name.clone();
        tokio::task::spawn_blocking(move || d.read(&name, limit))
            .await
            .map_err(|e| io(what, std::io::Error::other(e)))?
    }

    /// Connects to socket `name` in it. When that fails the directory is looked up again
    /// once (the one held may have been another container's of the pod); when nothing is
    /// found, the one held is kept for what the launcher left behind.
    pub async fn connect(&self, name: &str) -> Result<tokio::net::UnixStream, LauncherFsError> {
        let first = self.get().await?.connect(name).await;
        match first {
            Ok(s) => Ok(s),
            Err(e) => match &self.location {
                // A failed lookup leaves the held directory in place.
                Location::Pod { .. } => match self.reopen().await {
                    Ok(d) => d.connect(name).await,
                    Err(_) => Err(e),
                },
                Location::Host(_) => Err(e),
            },
        }
    }
}

/// The sockets directory of a launcher pod, held open.
#[derive(Debug)]
pub struct SocketsDir {
    fd: OwnedFd,
    /// The launcher pod it belongs to (`None`: a host directory, tests): a process at the
    /// other end of one of its sockets must be one of that pod's ([`Self::peer`]).
    pod: Option<Arc<str>>,
}

impl SocketsDir {
    /// Finds pod `pod_uid`'s compute container below `proc` (`/proc`) and opens its
    /// sockets directory. Blocking (it reads `/proc`): call it off the async threads.
    pub fn open(proc: &Path, pod_uid: &str) -> Result<Self, LauncherFsError> {
        Self::open_pods(proc, &[pod_uid.to_string()])
            .pop()
            .map(|(_, d)| d)
            .ok_or_else(|| LauncherFsError::NotRunning(pod_uid.to_string()))
    }

    /// [`Self::open`] for each pod of `uids` (one pass over /proc); those not found are
    /// left out.
    pub fn open_pods(proc: &Path, uids: &[String]) -> Vec<(String, Self)> {
        pods_pids(proc, uids)
            .into_iter()
            .filter_map(|(uid, pids)| {
                // Only the compute container has sockets there: the pause container has
                // no such directory, and an init container (running a user's image, whose
                // files could hold the path) cannot have sockets — images carry none.
                let dir = pids.into_iter().find_map(|pid| {
                    Self::open_pid(proc, pid, &uid)
                        .ok()
                        .filter(|d| d.has_any_socket())
                })?;
                Some((uid, dir))
            })
            .collect()
    }

    /// Whether a launcher socket is in it (the command socket, or the network one a
    /// launcher opens before anything else).
    fn has_any_socket(&self) -> bool {
        [CMD_SOCKET, virt_netsetup::handoff::SOCKET]
            .iter()
            .any(|s| self.has_socket(s))
    }

    fn open_pid(proc: &Path, pid: u32, pod_uid: &str) -> Result<Self, LauncherFsError> {
        let what = format!("/proc/{pid}");
        let proc_dir = rustix::fs::open(
            proc.join(pid.to_string()),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io(&what, e))?;
        let root = rustix::fs::openat(
            &proc_dir,
            "root",
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io(&what, e))?;
        // Checked after the root is open, through the same /proc/<pid> directory: a pid
        // that died and was reused in between reads ESRCH here, never another pod's file.
        let cgroup = rustix::fs::openat(
            &proc_dir,
            "cgroup",
            OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io(&what, e))?;
        let text =
            std::io::read_to_string(std::fs::File::from(cgroup)).map_err(|e| io(&what, e))?;
        if !in_pod(&text, pod_uid) {
            return Err(LauncherFsError::NotRunning(pod_uid.to_string()));
        }
        let mut dir = Self::dir_in(&root, SOCKETS_DIR)?;
        dir.pod = Some(pod_uid.into());
        Ok(dir)
    }

    /// The directory `path` (relative) below the container root `root`, resolved as the
    /// container sees it and never out of it.
    fn dir_in(root: &OwnedFd, path: &str) -> Result<Self, LauncherFsError> {
        let fd = rustix::fs::openat2(
            root,
            path,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(|e| io(path, e))?;
        Ok(Self { fd, pod: None })
    }

    /// Creates the regular file `name` holding `data`, owned by `owner` (uid and gid);
    /// `false` when something is there already (left as it is).
    pub fn create_owned(
        &self,
        name: &str,
        data: &[u8],
        owner: u32,
    ) -> Result<bool, LauncherFsError> {
        use std::io::Write as _;
        let fd = match self.entry(
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NONBLOCK,
            Mode::from_raw_mode(0o644),
        ) {
            Ok(fd) => fd,
            Err(LauncherFsError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::AlreadyExists =>
            {
                return Ok(false);
            }
            Err(e) => return Err(e),
        };
        let id = Some(rustix::fs::Uid::from_raw(owner));
        let gid = Some(rustix::fs::Gid::from_raw(owner));
        rustix::fs::fchown(&fd, id, gid).map_err(|e| io(name, e))?;
        std::fs::File::from(fd)
            .write_all(data)
            .map_err(|e| io(name, e))?;
        Ok(true)
    }

    /// [`Self::make_subdir`], the directory owned by `owner` (uid and gid).
    pub fn make_subdir_owned(&self, name: &str, owner: u32) -> Result<Self, LauncherFsError> {
        let sub = self.make_subdir(name)?;
        let id = Some(rustix::fs::Uid::from_raw(owner));
        let gid = Some(rustix::fs::Gid::from_raw(owner));
        // Not following: whatever is under the name now is changed, never a link's target.
        rustix::fs::chownat(
            &self.fd,
            name,
            id,
            gid,
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        )
        .map_err(|e| io(name, e))?;
        Ok(sub)
    }

    /// A directory opened directly (tests, and a launcher run beside the handler).
    pub fn at(dir: &Path) -> Result<Self, LauncherFsError> {
        let fd = rustix::fs::open(
            dir,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io(dir.display().to_string(), e))?;
        Ok(Self { fd, pod: None })
    }

    /// Opens `name` (relative, no `..`, no symlink anywhere) with `flags`.
    fn entry(&self, name: &str, flags: OFlags, mode: Mode) -> Result<OwnedFd, LauncherFsError> {
        rustix::fs::openat2(
            &self.fd,
            name,
            flags | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            mode,
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(|e| io(name, e))
    }

    /// Opens `name` as [`Self::entry`] does and checks it is a regular file.
    fn regular(&self, name: &str, flags: OFlags, mode: Mode) -> Result<OwnedFd, LauncherFsError> {
        let fd = self.entry(name, flags, mode)?;
        let stat = rustix::fs::fstat(&fd).map_err(|e| io(name, e))?;
        if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
            return Err(LauncherFsError::Refused {
                path: name.into(),
                reason: "not a regular file".into(),
            });
        }
        Ok(fd)
    }

    /// The subdirectory `name` (the migration directory).
    pub fn subdir(&self, name: &str) -> Result<Self, LauncherFsError> {
        let fd = self.entry(name, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())?;
        Ok(Self {
            fd,
            pod: self.pod.clone(),
        })
    }

    /// Creates the subdirectory `name` if it is not there (mode 0755, the handler's) and
    /// opens it.
    pub fn make_subdir(&self, name: &str) -> Result<Self, LauncherFsError> {
        match rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => self.subdir(name),
            Err(e) => Err(io(name, e)),
        }
    }

    /// Sets the mode of the socket `name` (checked to be one, never through a symlink).
    pub fn chmod_socket(&self, name: &str, mode: u32) -> Result<(), LauncherFsError> {
        let (_fd, path) = self.socket_path(name)?;
        // An O_PATH descriptor cannot be fchmod'ed; its /proc/self/fd link can be chmod'ed
        // and names exactly the checked inode.
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(mode))
            .map_err(|e| io(name, e))
    }

    /// Whether `name` exists as a socket.
    pub fn has_socket(&self, name: &str) -> bool {
        self.socket_path(name).is_ok()
    }

    /// A path that connects to the socket `name` itself: `/proc/self/fd/N` of an `O_PATH`
    /// descriptor of the checked inode. Valid while the returned descriptor is held.
    fn socket_path(&self, name: &str) -> Result<(OwnedFd, PathBuf), LauncherFsError> {
        let fd = self.entry(name, OFlags::PATH, Mode::empty())?;
        let stat = rustix::fs::fstat(&fd).map_err(|e| io(name, e))?;
        if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::Socket {
            return Err(LauncherFsError::Refused {
                path: name.into(),
                reason: "not a socket".into(),
            });
        }
        let path = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        Ok((fd, path))
    }

    /// Connects to the socket `name`.
    pub async fn connect(&self, name: &str) -> Result<tokio::net::UnixStream, LauncherFsError> {
        let (_fd, path) = self.socket_path(name)?;
        tokio::net::UnixStream::connect(&path)
            .await
            .map_err(|e| io(name, e))
    }

    /// Connects to the socket `name`, blocking.
    pub fn connect_blocking(
        &self,
        name: &str,
    ) -> Result<std::os::unix::net::UnixStream, LauncherFsError> {
        let (_fd, path) = self.socket_path(name)?;
        std::os::unix::net::UnixStream::connect(&path).map_err(|e| io(name, e))
    }

    /// The path through which a new socket `name` is bound in this directory (bind
    /// creates the name and fails on anything already there, a symlink included).
    /// Valid while `self` lives.
    pub fn bind_path(&self, name: &str) -> Result<PathBuf, LauncherFsError> {
        if name.contains('/') || name == ".." || name == "." || name.is_empty() {
            return Err(LauncherFsError::Refused {
                path: name.into(),
                reason: "not a plain name".into(),
            });
        }
        Ok(PathBuf::from(format!(
            "/proc/self/fd/{}/{name}",
            self.fd.as_fd().as_raw_fd()
        )))
    }

    /// Writes `data` to the regular file `name`, replacing what it held.
    pub fn write(&self, name: &str, data: &[u8]) -> Result<(), LauncherFsError> {
        use std::io::Write as _;
        let fd = self.regular(
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::NONBLOCK,
            Mode::from_raw_mode(0o644),
        )?;
        rustix::fs::ftruncate(&fd, 0).map_err(|e| io(name, e))?;
        let mut f = std::fs::File::from(fd);
        f.write_all(data).map_err(|e| io(name, e))
    }

    /// Reads the regular file `name`, at most `limit` bytes.
    pub fn read(&self, name: &str, limit: u64) -> Result<Vec<u8>, LauncherFsError> {
        // Non-blocking: a FIFO planted under the name must not hang the reader.
        let fd = self.entry(name, OFlags::RDONLY | OFlags::NONBLOCK, Mode::empty())?;
        read_regular(fd, name, limit)
    }

    /// The process at the other end of `stream`, a connection to one of this directory's
    /// sockets, checked to be a process of this launcher's pod (see [`Peer`]).
    pub fn peer(&self, stream: &std::os::unix::net::UnixStream) -> Result<Peer, LauncherFsError> {
        Peer::of(Path::new("/proc"), stream, self.pod.as_deref())
    }

    /// Removes `name` (never what a symlink there points to).
    pub fn remove(&self, name: &str) -> Result<(), LauncherFsError> {
        match rustix::fs::unlinkat(&self.fd, name, rustix::fs::AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(io(name, e)),
        }
    }
}

/// Reads the open file `fd` if it is a regular file, at most `limit` bytes.
fn read_regular(fd: OwnedFd, name: &str, limit: u64) -> Result<Vec<u8>, LauncherFsError> {
    use std::io::Read as _;
    let stat = rustix::fs::fstat(&fd).map_err(|e| io(name, e))?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(LauncherFsError::Refused {
            path: name.into(),
            reason: "not a regular file".into(),
        });
    }
    let mut out = Vec::new();
    std::fs::File::from(fd)
        .take(limit)
        .read_to_end(&mut out)
        .map_err(|e| io(name, e))?;
    Ok(out)
}

/// What messages call the peer (never its pid or a /proc path: virt-handler's errors reach
/// users, and a host pid is a map of the node for whoever plans a pid reuse).
const PEER: &str = "the launcher's process";

/// The process at the other end of a launcher socket, checked to be a process of the
/// launcher's pod and held by its `/proc/<pid>` directory.
///
/// The socket's peer credentials name a pid, and a pid is only a number: the process that
/// listened may have exited (a child keeping the socket) and its number been taken by any
/// process of the node, another tenant's or the host's. So the number is used once, to
/// open `/proc/<pid>`; the kernel ties that directory to the process it named at that
/// moment (lookups through it fail once that process is gone, whatever takes the number
/// later), and everything else — the cgroup checked against the pod's uid, the network
/// namespace entered, the root a device is made in, the files read — is opened through
/// it. A process of the pod that took the number passes the check, and can only be served
/// what its own pod would be.
#[derive(Debug)]
pub struct Peer {
    dir: OwnedFd,
}

impl Peer {
    /// The peer of `stream`, looked up below `proc`; checked to be in pod `pod` when given
    /// (`None`: a launcher in a host directory, tests).
    pub fn of(
        proc: &Path,
        stream: &std::os::unix::net::UnixStream,
        pod: Option<&str>,
    ) -> Result<Self, LauncherFsError> {
        let pid =
            virt_netsetup::handoff::peer_pid(stream).map_err(|e| LauncherFsError::Refused {
                path: PEER.into(),
                reason: e.to_string(),
            })?;
        Self::of_pid(proc, pid, pod)
    }

    /// Process `pid` below `proc`, checked to be in pod `pod` when given.
    pub fn of_pid(proc: &Path, pid: u32, pod: Option<&str>) -> Result<Self, LauncherFsError> {
        let dir = rustix::fs::open(
            proc.join(pid.to_string()),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io(PEER, e))?;
        let peer = Self { dir };
        if let Some(uid) = pod {
            let cgroup = peer.open("cgroup", OFlags::RDONLY)?;
            let text =
                std::io::read_to_string(std::fs::File::from(cgroup)).map_err(|e| io(PEER, e))?;
            if !in_pod(&text, uid) {
                return Err(LauncherFsError::Refused {
                    path: PEER.into(),
                    reason: format!("not a process of launcher pod {uid}"),
                });
            }
        }
        Ok(peer)
    }

    fn open(&self, name: &str, flags: OFlags) -> Result<OwnedFd, LauncherFsError> {
        rustix::fs::openat(&self.dir, name, flags | OFlags::CLOEXEC, Mode::empty())
            .map_err(|e| io(PEER, e))
    }

    /// Its network namespace.
    pub fn net_ns(&self) -> Result<OwnedFd, LauncherFsError> {
        self.open("ns/net", OFlags::RDONLY)
    }

    /// Its mount namespace.
    pub fn mnt_ns(&self) -> Result<OwnedFd, LauncherFsError> {
        self.open("ns/mnt", OFlags::RDONLY)
    }

    /// The mount points it sees (`mountinfo`'s fifth field, as its root shows them).
    pub fn mount_points(&self) -> Result<Vec<String>, LauncherFsError> {
        let f = self.open("mountinfo", OFlags::RDONLY)?;
        let text = std::io::read_to_string(std::fs::File::from(f)).map_err(|e| io(PEER, e))?;
        Ok(text
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            // mountinfo escapes space, tab, newline and backslash as octal.
            .map(|m| {
                m.replace("\\040", " ")
                    .replace("\\011", "\t")
                    .replace("\\012", "\n")
                    .replace("\\134", "\\")
            })
            .collect())
    }

    /// Its root directory, as its container sees it.
    pub fn root(&self) -> Result<OwnedFd, LauncherFsError> {
        self.open("root", OFlags::PATH | OFlags::DIRECTORY)
    }

    /// The directory `path` (relative) as it sees it: resolved in its root, never out of it.
    pub fn dir(&self, path: &str) -> Result<SocketsDir, LauncherFsError> {
        SocketsDir::dir_in(&self.root()?, path)
    }

    /// Reads the regular file `path` (relative) as it sees it, at most `limit` bytes.
    pub fn read(&self, path: &str, limit: u64) -> Result<Vec<u8>, LauncherFsError> {
        let (dir, name) = match path.rsplit_once('/') {
            Some((d, n)) => (d, n),
            None => (".", path),
        };
        self.dir(dir)?.read(name, limit)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const UID: &str = "0f3c5a1e-7d2b-4c6e-9a8f-1b2c3d4e5f60";

    #[test]
    fn a_pod_is_recognised_by_its_cgroup_under_both_drivers() {
        let cgroupfs = format!("12:memory:/kubepods/besteffort/pod{UID}/abc\n0::/\n");
        assert!(in_pod(&cgroupfs, UID));
        let systemd = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-1.scope\n",
            UID.replace('-', "_")
        );
        assert!(in_pod(&systemd, UID));
        // Another pod, a uid that is a prefix of the real one, a name merely containing it.
        assert!(!in_pod(&cgroupfs, "0f3c5a1e-7d2b-4c6e-9a8f-1b2c3d4e5f61"));
        assert!(!in_pod(&cgroupfs, "0f3c5a1e"));
        assert!(!in_pod(&format!("1:cpu:/x/mypod{UID}/y\n"), UID));
        assert!(!in_pod(&cgroupfs, ""));
        assert!(!in_pod(&cgroupfs, "../x"));
    }

    #[tokio::test]
    async fn a_symlink_in_the_directory_is_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("host.sock");
        let _host = std::os::unix::net::UnixListener::bind(&target).unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join("cmd.sock")).unwrap();
        std::fs::write(outside.path().join("secret"), "x").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), dir.path().join("facts"))
            .unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("migration")).unwrap();

        let d = SocketsDir::at(dir.path()).unwrap();
        assert!(d.connect("cmd.sock").await.is_err());
        assert!(!d.has_socket("cmd.sock"));
        assert!(d.write("facts", b"overwritten").is_err());
        assert_eq!(
            std::fs::read_to_string(outside.path().join("secret")).unwrap(),
            "x"
        );
        assert!(d.subdir("migration").is_err());
        assert!(d.connect("../host.sock").await.is_err());
        // Binding on the symlink's name fails rather than creating the socket elsewhere.
        assert!(std::os::unix::net::UnixListener::bind(d.bind_path("cmd.sock").unwrap()).is_err());
        d.remove("cmd.sock").unwrap();
        assert!(target.exists());
    }

    #[tokio::test]
    async fn sockets_files_and_subdirectories_work_through_the_descriptors() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("migration")).unwrap();
        let d = SocketsDir::at(dir.path()).unwrap();
        let l = tokio::net::UnixListener::bind(d.bind_path("cmd.sock").unwrap()).unwrap();
        assert!(dir.path().join("cmd.sock").exists());
        let accept = tokio::spawn(async move { l.accept().await.map(|_| ()) });
        d.connect("cmd.sock").await.unwrap();
        accept.await.unwrap().unwrap();
        assert!(d.has_socket("cmd.sock"));
        let m = d.subdir("migration").unwrap();
        m.write("facts", b"a").unwrap();
        m.write("facts", b"b").unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("migration/facts")).unwrap(),
            "b"
        );
        assert!(!m.has_socket("facts"));
        d.remove("cmd.sock").unwrap();
        d.remove("cmd.sock").unwrap();
        assert!(!d.has_socket("cmd.sock"));
    }

    #[test]
    fn a_fifo_under_a_file_name_is_refused_without_hanging() {
        let dir = tempfile::tempdir().unwrap();
        nix::unistd::mkfifo(
            &dir.path().join("outcome.json"),
            nix::sys::stat::Mode::S_IRWXU,
        )
        .unwrap();
        let d = SocketsDir::at(dir.path()).unwrap();
        assert!(matches!(
            d.read("outcome.json", 10),
            Err(LauncherFsError::Refused { .. })
        ));
        assert!(d.write("outcome.json", b"x").is_err());
    }

    /// N1 of the security review at bd37f96: the pid behind a launcher socket is checked
    /// against the pod before anything is done in its namespaces. Here the peer is this
    /// test process, which is in no pod: refused, with a message that names no pid.
    #[test]
    fn a_socket_peer_outside_the_pod_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("net.sock");
        let _l = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let s = std::os::unix::net::UnixStream::connect(&path).unwrap();
        match Peer::of(Path::new("/proc"), &s, Some(UID)) {
            Err(LauncherFsError::Refused { path, reason }) => {
                let msg = format!("{path}: {reason}");
                assert!(msg.contains(UID), "{msg}");
                assert!(!msg.contains(&std::process::id().to_string()), "{msg}");
            }
            other => panic!("a peer outside the pod was taken: {other:?}"),
        }
        // A directory opened from a host path carries no pod: no check (tests only).
        let d = SocketsDir::at(dir.path()).unwrap();
        let peer = d.peer(&s).unwrap();
        peer.net_ns().unwrap();
    }

    /// The pid is used once: everything after goes through the process directory opened
    /// then, so a process that is gone (its number free for anyone) yields nothing.
    #[test]
    fn a_peer_that_exits_yields_nothing_through_its_number() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let peer = Peer::of_pid(Path::new("/proc"), child.id(), None).unwrap();
        peer.net_ns().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(peer.net_ns().is_err(), "the namespace of a reaped process");
        assert!(peer.root().is_err(), "the root of a reaped process");
    }

    /// The cgroup checked is read through the same process directory: a pod process passes.
    #[test]
    fn a_peer_in_the_pod_passes_the_check() {
        let proc = tempfile::tempdir().unwrap();
        let pid = proc.path().join("4242");
        std::fs::create_dir(&pid).unwrap();
        std::fs::write(
            pid.join("cgroup"),
            format!("0::/kubepods/besteffort/pod{UID}/c1\n"),
        )
        .unwrap();
        Peer::of_pid(proc.path(), 4242, Some(UID)).unwrap();
        assert!(matches!(
            Peer::of_pid(
                proc.path(),
                4242,
                Some("0f3c5a1e-7d2b-4c6e-9a8f-1b2c3d4e5f61")
            ),
            Err(LauncherFsError::Refused { .. })
        ));
    }

    #[test]
    fn this_process_is_found_by_its_own_cgroup_only_when_it_is_the_pod() {
        // Nothing on a test machine is in pod UID.
        assert!(matches!(
            SocketsDir::open(Path::new("/proc"), UID),
            Err(LauncherFsError::NotRunning(_))
        ));
    }
}
