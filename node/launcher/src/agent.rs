//! The QEMU guest agent, as KubeVirt uses it: what the VMI status shows (guest OS,
//! interfaces, `AgentVersionNotSupported`), the `guestosinfo`/`userlist`/`filesystemlist`
//! answers, and the access credentials written through it.
//!
//! A poller thread follows the agent while libvirt reports its channel connected (libvirt
//! tracks the channel from QEMU's events; the libvirt thread reads that state every 2 s):
//! at once on connect, then interfaces every [`INTERFACES_EVERY_SETTLED`] (every
//! [`INTERFACES_EVERY_FRESH`] for [`FRESH_FOR`] after the agent connects or the interfaces
//! change: a booting guest takes its addresses then) and the rest every [`SYSTEM_EVERY`].
//! KubeVirt polls interfaces every 120 s; an address the guest takes shows in the VMI status
//! within seconds here. The guest pays for each read (its agent wakes; under TCG that is
//! most of the cost of an idle VM): the settled interval is the longest that keeps the 5 s
//! budget. Every call goes through libvirt (typed calls where
//! the `virt` crate binds one: interface addresses with the agent source, passwords; the
//! others as agent commands, JSON typed on both sides here), never on the libvirt thread,
//! so a slow agent delays nothing else. The answers' parsing and the key
//! synchronisation are pure and unit-tested with a fake agent.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kubevirt_api::guestagent::{
    FileSystem, FileSystemDisk, FileSystemList, GuestAgentCommand, GuestAgentInfo, GuestOsInfo,
    GuestOsUser, GuestOsUserList,
};
use kubevirt_api::vmi::AccessCredential;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::watch;
use virt_domain::protocol::{
    CredentialsStatus, GuestAgentStatus, GuestExecResult, GuestInterface, GuestQuery, Response,
};

use crate::actor::Observed;

/// How often the guest's interfaces are read while its agent is connected and they have
/// not changed for [`FRESH_FOR`]: an address the guest takes reaches the VMI status within
/// this plus a status write (~0.4 s; the budget is 5 s).
pub const INTERFACES_EVERY_SETTLED: Duration = Duration::from_secs(4);
/// How often they are read for [`FRESH_FOR`] after the agent connects or they change.
pub const INTERFACES_EVERY_FRESH: Duration = Duration::from_secs(2);
/// How long the interfaces count as fresh.
pub const FRESH_FOR: Duration = Duration::from_secs(60);

/// How long until the next read of the interfaces, `since_change` after the agent connected
/// or they last changed.
pub fn interfaces_interval(since_change: Duration) -> Duration {
    if since_change < FRESH_FOR {
        INTERFACES_EVERY_FRESH
    } else {
        INTERFACES_EVERY_SETTLED
    }
}
/// How often the OS, host name and time zone are read again (they change rarely; a reboot
/// reconnects the agent, which reads them at once).
pub const SYSTEM_EVERY: Duration = Duration::from_secs(60);
/// How long the guest's file systems, once read, serve the metrics before a scrape has the
/// agent asked again (KubeVirt's launcher asks every 300 s; the guest pays for each read, and
/// used bytes move slowly).
pub const FILESYSTEMS_FRESH: Duration = Duration::from_secs(60);
/// How long after a failed read of the interfaces it is tried again.
const FAILED_READ_BACKOFF: Duration = Duration::from_secs(30);
/// The poller's tick: the agent's connection, a freeze and the credentials' files are looked
/// at this often (no guest round trip).
const TICK: Duration = Duration::from_secs(1);
/// How long after a failed application of the credentials it is tried again.
const CREDENTIALS_RETRY: Duration = Duration::from_secs(30);
/// How long one agent command may take.
const COMMAND_TIMEOUT_SECONDS: i32 = 10;
/// KubeVirt's limit on users and file systems in `guestosinfo`.
const INFO_LIMIT: usize = 10;
/// Appended to every SSH key line written through the agent: the keys carrying it are ours
/// to replace and remove, every other line of `authorized_keys` is the user's and left
/// alone (KubeVirt rewrites the whole file, harvester#7813). It lives in the key's comment,
/// so sshd ignores it, and in the guest, so a new launcher (a restart, a migration) knows
/// its keys without state of its own.
pub const KEY_MARKER: &str = "kubevirt-rs:access-credential";

/// What went wrong talking to the agent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgentError {
    /// No agent answers (KubeVirt's words).
    #[error("VMI does not have guest agent connected")]
    NotConnected,
    /// The agent refused or failed the command.
    #[error("guest agent {command}: {message}")]
    Command {
        /// The command.
        command: String,
        /// libvirt's or the agent's message.
        message: String,
    },
    /// The answer is not what the command returns.
    #[error("guest agent {command}: unexpected answer: {message}")]
    Decode {
        /// The command.
        command: String,
        /// The decoder's message.
        message: String,
    },
}

impl AgentError {
    /// libvirt's error for a command as ours: a missing or silent agent is
    /// [`AgentError::NotConnected`] (what the user can act on).
    pub fn from_libvirt(command: &str, message: &str) -> Self {
        let lower = message.to_ascii_lowercase();
        if lower.contains("not connected") || lower.contains("not configured") {
            return Self::NotConnected;
        }
        Self::Command {
            command: command.to_string(),
            message: message.to_string(),
        }
    }
}

/// The guest agent of one domain. Every call blocks; implementations are shared between
/// the poller and the command socket's requests (libvirt connections are thread-safe).
pub trait Agent: Send + Sync {
    /// Runs `execute` with `arguments`; the agent's `return` value.
    fn command(&self, execute: &str, arguments: Option<Value>) -> Result<Value, AgentError>;
    /// The guest's interfaces and addresses.
    fn interfaces(&self) -> Result<Vec<GuestInterface>, AgentError>;
    /// Sets `user`'s password.
    fn set_password(&self, user: &str, password: &str) -> Result<(), AgentError>;
}

/// The agent through libvirt (`virDomainQemuAgentCommand`, `virDomainInterfaceAddresses`
/// with the agent as source, `virDomainSetUserPassword`).
pub struct LibvirtAgent(pub virt::domain::Domain);

impl std::fmt::Debug for LibvirtAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LibvirtAgent")
    }
}

impl Agent for LibvirtAgent {
    fn command(&self, execute: &str, arguments: Option<Value>) -> Result<Value, AgentError> {
        let mut cmd = json!({ "execute": execute });
        if let Some(a) = arguments {
            cmd["arguments"] = a;
        }
        let out = self
            .0
            .qemu_agent_command(&cmd.to_string(), COMMAND_TIMEOUT_SECONDS, 0)
            .map_err(|e| AgentError::from_libvirt(execute, e.message()))?;
        returned(execute, &out)
    }

    fn interfaces(&self) -> Result<Vec<GuestInterface>, AgentError> {
        let ifs = self
            .0
            .interface_addresses(virt::sys::VIR_DOMAIN_INTERFACE_ADDRESSES_SRC_AGENT, 0)
            .map_err(|e| AgentError::from_libvirt("interface addresses", e.message()))?;
        Ok(guest_interfaces(ifs.into_iter().map(|i| {
            (
                i.name,
                i.hwaddr,
                i.addrs.into_iter().map(|a| a.addr).collect(),
            )
        })))
    }

    fn set_password(&self, user: &str, password: &str) -> Result<(), AgentError> {
        self.0
            .set_user_password(user, password, 0)
            .map_err(|e| AgentError::from_libvirt("guest-set-user-password", e.message()))
    }
}

/// The `return` of an agent's answer.
fn returned(command: &str, answer: &str) -> Result<Value, AgentError> {
    let mut v: Value = serde_json::from_str(answer).map_err(|e| AgentError::Decode {
        command: command.into(),
        message: e.to_string(),
    })?;
    match v.get_mut("return") {
        Some(r) => Ok(r.take()),
        None => Err(AgentError::Decode {
            command: command.into(),
            message: format!("no return in {answer:.200}"),
        }),
    }
}

fn decode<T: serde::de::DeserializeOwned>(command: &str, v: Value) -> Result<T, AgentError> {
    serde_json::from_value(v).map_err(|e| AgentError::Decode {
        command: command.into(),
        message: e.to_string(),
    })
}

/// The interfaces as the status shows them: loopback left out (KubeVirt shows only the
/// guest's NICs), MACs lower case, addresses without prefix.
pub fn guest_interfaces(
    ifs: impl IntoIterator<Item = (String, Option<String>, Vec<String>)>,
) -> Vec<GuestInterface> {
    ifs.into_iter()
        .filter(|(name, mac, _)| {
            name != "lo" && mac.as_deref().is_none_or(|m| m != "00:00:00:00:00:00")
        })
        .map(|(name, mac, ips)| GuestInterface {
            name,
            mac: mac.map(|m| m.to_ascii_lowercase()),
            ip_addresses: ips,
        })
        .collect()
}

#[derive(Deserialize)]
struct InfoAnswer {
    #[serde(default)]
    version: String,
    #[serde(default)]
    supported_commands: Vec<CommandAnswer>,
}

#[derive(Deserialize)]
struct CommandAnswer {
    name: String,
    #[serde(default)]
    enabled: bool,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
struct OsAnswer {
    #[serde(default)]
    name: String,
    #[serde(default)]
    kernel_release: String,
    #[serde(default)]
    version: String,
    #[serde(default)]
    pretty_name: String,
    #[serde(default)]
    version_id: String,
    #[serde(default)]
    kernel_version: String,
    #[serde(default)]
    machine: String,
    #[serde(default)]
    id: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct UserAnswer {
    user: String,
    #[serde(default)]
    domain: String,
    #[serde(default)]
    login_time: f64,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct FsAnswer {
    #[serde(default)]
    name: String,
    #[serde(default)]
    mountpoint: String,
    #[serde(default, rename = "type")]
    fs_type: String,
    #[serde(default)]
    used_bytes: u64,
    #[serde(default)]
    total_bytes: u64,
    #[serde(default)]
    disk: Vec<FsDiskAnswer>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
struct FsDiskAnswer {
    #[serde(default)]
    serial: String,
    #[serde(default)]
    bus_type: String,
}

/// The agent's version and commands (`guest-info`).
pub fn parse_info(v: Value) -> Result<(String, Vec<GuestAgentCommand>), AgentError> {
    let a: InfoAnswer = decode("guest-info", v)?;
    let mut commands: Vec<GuestAgentCommand> = a
        .supported_commands
        .into_iter()
        .map(|c| GuestAgentCommand {
            name: c.name,
            enabled: c.enabled,
        })
        .collect();
    commands.sort_by(|a, b| a.name.cmp(&b.name));
    Ok((a.version, commands))
}

/// `guest-get-osinfo` as KubeVirt's `GuestOSInfo`.
pub fn parse_os(v: Value) -> Result<GuestOsInfo, AgentError> {
    let a: OsAnswer = decode("guest-get-osinfo", v)?;
    Ok(GuestOsInfo {
        name: a.name,
        kernel_release: a.kernel_release,
        version: a.version,
        pretty_name: a.pretty_name,
        version_id: a.version_id,
        kernel_version: a.kernel_version,
        machine: a.machine,
        id: a.id,
    })
}

/// `guest-get-users` as KubeVirt's users.
pub fn parse_users(v: Value) -> Result<Vec<GuestOsUser>, AgentError> {
    let a: Vec<UserAnswer> = decode("guest-get-users", v)?;
    Ok(a.into_iter()
        .map(|u| GuestOsUser {
            user_name: u.user,
            domain: u.domain,
            login_time: u.login_time,
        })
        .collect())
}

/// `guest-get-fsinfo` as KubeVirt's file systems.
pub fn parse_filesystems(v: Value) -> Result<Vec<FileSystem>, AgentError> {
    let a: Vec<FsAnswer> = decode("guest-get-fsinfo", v)?;
    Ok(a.into_iter()
        .map(|f| FileSystem {
            disk_name: f.name,
            mount_point: f.mountpoint,
            file_system_type: f.fs_type,
            used_bytes: f.used_bytes,
            total_bytes: f.total_bytes,
            disk: f
                .disk
                .into_iter()
                .map(|d| FileSystemDisk {
                    serial: d.serial,
                    bus_type: d.bus_type,
                })
                .collect(),
        })
        .collect())
}

/// `guest-get-timezone` as KubeVirt shows it: `zone, offset` (`UTC, 0`).
pub fn parse_timezone(v: &Value) -> String {
    let zone = v.get("zone").and_then(Value::as_str).unwrap_or_default();
    let offset = v.get("offset").and_then(Value::as_i64).unwrap_or_default();
    format!("{zone}, {offset}")
}

/// What the slow part of the poll read: the agent and the system.
#[derive(Clone, Debug, Default, PartialEq)]
struct System {
    version: String,
    commands: Vec<GuestAgentCommand>,
    os: GuestOsInfo,
    hostname: String,
    timezone: String,
}

fn read_system(a: &dyn Agent) -> Result<System, AgentError> {
    let (version, commands) = parse_info(a.command("guest-info", None)?)?;
    let os = parse_os(a.command("guest-get-osinfo", None)?)?;
    let hostname = a
        .command("guest-get-host-name", None)?
        .get("host-name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    // Older agents lack the time zone; it is not worth failing the rest for.
    let timezone = a
        .command("guest-get-timezone", None)
        .map(|v| parse_timezone(&v))
        .unwrap_or_default();
    Ok(System {
        version,
        commands,
        os,
        hostname,
        timezone,
    })
}

/// What the launcher shares about its guest agent: the VMI-status part (published on a
/// watch, so the command socket sends `guestInfo` events), the agent itself once the domain
/// exists, whether a freeze holds, and the last answers (served while the agent cannot
/// answer, as a frozen guest's agent cannot).
#[derive(Debug)]
pub struct GuestShared {
    state: watch::Sender<GuestState>,
    agent: Mutex<Option<Arc<dyn Agent>>>,
    frozen: AtomicBool,
    cache: Mutex<Cache>,
    stop: AtomicBool,
}

impl std::fmt::Debug for dyn Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Agent")
    }
}

#[derive(Debug, Default)]
struct Cache {
    system: Option<System>,
    users: Vec<GuestOsUser>,
    filesystems: Vec<FileSystem>,
    /// When the agent last answered `filesystems` since it connected; until then the
    /// metrics show none (what an earlier agent said may be another boot's).
    filesystems_read: Option<Instant>,
    /// When the metrics last had them read, answered or not: a failing agent is asked
    /// once per [`FILESYSTEMS_FRESH`], not at every scrape.
    filesystems_asked: Option<Instant>,
    /// A read for the metrics is under way: one at a time, however many scrapes come.
    filesystems_reading: bool,
}

/// The agent's part of the launcher's status.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GuestState {
    /// What the connected agent reports (none without one).
    pub status: Option<GuestAgentStatus>,
    /// The agent-propagated credentials (none when the VMI has none).
    pub credentials: Option<CredentialsStatus>,
}

impl Default for GuestShared {
    fn default() -> Self {
        Self {
            state: watch::channel(GuestState::default()).0,
            agent: Mutex::new(None),
            frozen: AtomicBool::new(false),
            cache: Mutex::new(Cache::default()),
            stop: AtomicBool::new(false),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl GuestShared {
    /// The agent of the domain now run (set when it is defined or arrives by migration).
    pub fn set_agent(&self, agent: Arc<dyn Agent>) {
        *lock(&self.agent) = Some(agent);
    }

    fn agent(&self) -> Option<Arc<dyn Agent>> {
        lock(&self.agent).clone()
    }

    /// Records a freeze or thaw (`status.fsFreezeStatus`).
    pub fn set_frozen(&self, frozen: bool) {
        self.frozen.store(frozen, Ordering::SeqCst);
        self.state.send_if_modified(|s| match s.status.as_mut() {
            Some(st) if st.frozen != frozen => {
                st.frozen = frozen;
                true
            }
            _ => false,
        });
    }

    /// Whether a freeze holds.
    pub fn frozen(&self) -> bool {
        self.frozen.load(Ordering::SeqCst)
    }

    /// Watches the status part.
    pub fn subscribe(&self) -> watch::Receiver<GuestState> {
        self.state.subscribe()
    }

    /// The status part now.
    pub fn state(&self) -> GuestState {
        self.state.borrow().clone()
    }

    /// Ends the poller.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// Pings the agent, or runs a command through it (the probes). Blocks.
    pub fn probe(
        &self,
        exec_command: Option<(&[String], Duration)>,
        connected: bool,
    ) -> Result<Option<GuestExecResult>, AgentError> {
        let agent = self
            .agent()
            .filter(|_| connected)
            .ok_or(AgentError::NotConnected)?;
        match exec_command {
            None => agent.command("guest-ping", None).map(|_| None),
            Some((cmd, timeout)) => exec(&*agent, cmd, timeout).map(Some),
        }
    }

    /// Answers a guest-agent read: users and file systems read now (the last answer when
    /// the agent cannot, e.g. frozen), the rest from the last poll. Blocks.
    pub fn answer(&self, q: GuestQuery, connected: bool) -> Result<Response, AgentError> {
        let agent = self
            .agent()
            .filter(|_| connected)
            .ok_or(AgentError::NotConnected)?;
        let users = || match a_users(&*agent) {
            Ok(u) => {
                lock(&self.cache).users = u.clone();
                u
            }
            Err(e) => {
                tracing::debug!(error = %e, "guest users; answering the last known");
                lock(&self.cache).users.clone()
            }
        };
        let filesystems = || match a_filesystems(&*agent) {
            Ok(f) => {
                let mut c = lock(&self.cache);
                c.filesystems = f.clone();
                c.filesystems_read = Some(Instant::now());
                f
            }
            Err(e) => {
                tracing::debug!(error = %e, "guest file systems; answering the last known");
                lock(&self.cache).filesystems.clone()
            }
        };
        Ok(match q {
            GuestQuery::UserList => Response::UserList {
                list: GuestOsUserList::of(users()),
            },
            GuestQuery::FilesystemList => Response::FilesystemList {
                list: FileSystemList::of(filesystems()),
            },
            GuestQuery::GuestOsInfo => {
                let system = match lock(&self.cache).system.clone() {
                    Some(s) => s,
                    None => read_system(&*agent)?,
                };
                let mut user_list = users();
                user_list.truncate(INFO_LIMIT);
                let mut fs = filesystems();
                fs.truncate(INFO_LIMIT);
                Response::GuestOsInfo {
                    info: Box::new(GuestAgentInfo {
                        kind: kubevirt_api::guestagent::GUEST_AGENT_INFO_KIND.into(),
                        api_version: kubevirt_api::API_VERSION.into(),
                        guest_agent_version: system.version,
                        supported_commands: system.commands,
                        hostname: system.hostname,
                        os: system.os,
                        timezone: system.timezone,
                        user_list,
                        fs_info: kubevirt_api::guestagent::FileSystemInfo { filesystems: fs },
                        fs_freeze_status: if self.frozen() {
                            "frozen".into()
                        } else {
                            String::new()
                        },
                    }),
                }
            }
        })
    }
}

impl GuestShared {
    /// The guest's file systems for the metrics: the last list the connected agent gave
    /// (none before its first answer, none without an agent). Never asks the agent, so a
    /// hung one cannot hold a scrape.
    pub fn filesystems_for_metrics(&self, connected: bool) -> Vec<FileSystem> {
        let c = lock(&self.cache);
        if connected && c.filesystems_read.is_some() {
            c.filesystems.clone()
        } else {
            Vec::new()
        }
    }

    /// Whether the metrics should have the file systems read again now: the list is older
    /// than [`FILESYSTEMS_FRESH`] (or was never read), the agent is connected and not
    /// frozen (a frozen agent refuses; the last list stands), and no read is under way. A
    /// `true` is a promise to call [`Self::refresh_filesystems`], which blocks: off the
    /// async threads, and without waiting for it.
    pub fn claim_filesystems_refresh(&self, connected: bool) -> bool {
        if !connected || self.frozen() {
            return false;
        }
        let mut c = lock(&self.cache);
        let stale = |t: Option<Instant>| t.is_none_or(|t| t.elapsed() >= FILESYSTEMS_FRESH);
        if c.filesystems_reading || !stale(c.filesystems_read) || !stale(c.filesystems_asked) {
            return false;
        }
        c.filesystems_reading = true;
        c.filesystems_asked = Some(Instant::now());
        true
    }

    /// Reads the file systems from the agent into the cache (blocks up to the agent
    /// command's timeout); a failure keeps the last list.
    pub fn refresh_filesystems(&self) {
        let read = self.agent().map(|a| a_filesystems(&*a));
        let mut c = lock(&self.cache);
        c.filesystems_reading = false;
        match read {
            Some(Ok(f)) => {
                c.filesystems = f;
                c.filesystems_read = Some(Instant::now());
            }
            Some(Err(e)) => {
                tracing::debug!(error = %e, "guest file systems for the metrics; keeping the last known")
            }
            None => {}
        }
    }

    /// The agent went away: its file systems are not shown until it answers again.
    fn forget_filesystems(&self) {
        let mut c = lock(&self.cache);
        c.filesystems_read = None;
        c.filesystems_asked = None;
    }
}

/// Runs `command` in the guest (`guest-exec`, then `guest-exec-status` until it exits or
/// `timeout` passes), with its output captured.
pub fn exec(
    a: &dyn Agent,
    command: &[String],
    timeout: Duration,
) -> Result<GuestExecResult, AgentError> {
    use base64::Engine;
    let (path, args) = command.split_first().ok_or_else(|| AgentError::Command {
        command: "guest-exec".into(),
        message: "no command given".into(),
    })?;
    let started = a.command(
        "guest-exec",
        Some(json!({ "path": path, "arg": args, "capture-output": true })),
    )?;
    let pid = started
        .get("pid")
        .and_then(Value::as_i64)
        .ok_or_else(|| AgentError::Decode {
            command: "guest-exec".into(),
            message: format!("no pid in {started}"),
        })?;
    let deadline = Instant::now() + timeout;
    let text = |v: &Value, key: &str| {
        v.get(key)
            .and_then(Value::as_str)
            .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    };
    loop {
        let st = a.command("guest-exec-status", Some(json!({ "pid": pid })))?;
        if st.get("exited").and_then(Value::as_bool) == Some(true) {
            let code = match (
                st.get("exitcode").and_then(Value::as_i64),
                st.get("signal").and_then(Value::as_i64),
            ) {
                (Some(c), _) => c as i32,
                (None, Some(sig)) => 128 + sig as i32,
                (None, None) => -1,
            };
            return Ok(GuestExecResult {
                exit_code: code,
                stdout: text(&st, "out-data"),
                stderr: text(&st, "err-data"),
            });
        }
        if Instant::now() >= deadline {
            return Err(AgentError::Command {
                command: "guest-exec".into(),
                message: format!("{path} did not exit within {timeout:?}"),
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn a_users(a: &dyn Agent) -> Result<Vec<GuestOsUser>, AgentError> {
    parse_users(a.command("guest-get-users", None)?)
}

fn a_filesystems(a: &dyn Agent) -> Result<Vec<FileSystem>, AgentError> {
    parse_filesystems(a.command("guest-get-fsinfo", None)?)
}

/// The credentials the agent propagates, as read from the Secrets' files.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Desired {
    /// Per user, the key lines to be in `authorized_keys` (without [`KEY_MARKER`]).
    pub ssh: BTreeMap<String, BTreeSet<String>>,
    /// Per user, the password.
    pub passwords: BTreeMap<String, String>,
    /// Secrets whose files are missing or empty.
    pub missing: Vec<String>,
}

/// Reads a mounted Secret: its keys (files) and values, without kubelet's `..data` links.
/// `None` when the directory is missing or holds no key.
pub fn read_secret(dir: &Path) -> Option<BTreeMap<String, String>> {
    let entries = std::fs::read_dir(dir).ok()?;
    let mut out = BTreeMap::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("..") {
            continue;
        }
        let path = e.path();
        if path.is_dir() {
            continue;
        }
        if let Ok(v) = std::fs::read_to_string(&path) {
            out.insert(name, v);
        }
    }
    (!out.is_empty()).then_some(out)
}

/// The SSH keys of a Secret's values: one per non-empty, non-comment line.
pub fn key_lines<'a>(values: impl IntoIterator<Item = &'a String>) -> Vec<String> {
    values
        .into_iter()
        .flat_map(|v| v.lines())
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// What the VMI's guest-agent credentials ask for, from the Secrets `secret(name)` reads.
pub fn desired(
    creds: &[AccessCredential],
    secret: impl Fn(&str) -> Option<BTreeMap<String, String>>,
) -> Desired {
    let mut d = Desired::default();
    for c in creds {
        let Some(name) = c.secret_name() else {
            continue;
        };
        let agent_keys = c
            .ssh_public_key
            .as_ref()
            .and_then(|k| k.propagation_method.qemu_guest_agent.as_ref());
        let agent_password = c
            .user_password
            .as_ref()
            .is_some_and(|p| p.propagation_method.qemu_guest_agent.is_some());
        let Some(data) = secret(name) else {
            d.missing.push(name.to_string());
            continue;
        };
        if let Some(q) = agent_keys {
            let keys = key_lines(data.values());
            for user in &q.users {
                d.ssh
                    .entry(user.clone())
                    .or_default()
                    .extend(keys.iter().cloned());
            }
        }
        if agent_password {
            for (user, pw) in data {
                d.passwords
                    .insert(user, pw.trim_end_matches('\n').to_string());
            }
        }
    }
    d
}

/// A key line as written through the agent.
fn marked(key: &str) -> String {
    format!("{key} {KEY_MARKER}")
}

/// The key changes for one user: `(add, remove)` given what the guest has. Only lines
/// carrying [`KEY_MARKER`] are ever removed.
pub fn key_changes(present: &[String], want: &BTreeSet<String>) -> (Vec<String>, Vec<String>) {
    let want: BTreeSet<String> = want.iter().map(|k| marked(k)).collect();
    let present_set: BTreeSet<&String> = present.iter().collect();
    let add = want
        .iter()
        .filter(|k| !present_set.contains(k))
        .cloned()
        .collect();
    let remove = present
        .iter()
        .filter(|l| l.trim_end().ends_with(KEY_MARKER) && !want.contains(l.trim_end()))
        .cloned()
        .collect();
    (add, remove)
}

/// Brings one user's `authorized_keys` to `want` through the agent: adds the missing keys,
/// removes the keys we wrote that are no longer wanted, leaves every other line alone.
pub fn sync_user_keys(
    a: &dyn Agent,
    user: &str,
    want: &BTreeSet<String>,
) -> Result<(usize, usize), AgentError> {
    let present = a
        .command(
            "guest-ssh-get-authorized-keys",
            Some(json!({ "username": user })),
        )?
        .get("keys")
        .and_then(Value::as_array)
        .map(|ks| {
            ks.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let (add, remove) = key_changes(&present, want);
    if !add.is_empty() {
        a.command(
            "guest-ssh-add-authorized-keys",
            Some(json!({ "username": user, "keys": add, "reset": false })),
        )?;
    }
    if !remove.is_empty() {
        a.command(
            "guest-ssh-remove-authorized-keys",
            Some(json!({ "username": user, "keys": remove })),
        )?;
    }
    Ok((add.len(), remove.len()))
}

/// Where the credentials come from.
#[derive(Clone, Debug, Default)]
pub struct CredentialSource {
    /// The VMI's `accessCredentials`.
    pub credentials: Vec<AccessCredential>,
    /// Where the pod mounts their Secrets (`<secret>-access-cred` below it).
    pub dir: Option<PathBuf>,
}

impl CredentialSource {
    /// Some credential propagates through the agent.
    fn uses_agent(&self) -> bool {
        self.credentials.iter().any(|c| {
            c.ssh_public_key
                .as_ref()
                .is_some_and(|k| k.propagation_method.qemu_guest_agent.is_some())
                || c.user_password
                    .as_ref()
                    .is_some_and(|p| p.propagation_method.qemu_guest_agent.is_some())
        })
    }

    fn read(&self) -> Desired {
        desired(&self.credentials, |name| {
            let dir = self.dir.as_ref()?;
            read_secret(&dir.join(kubevirt_api::cloudinit::access_credential_dir(name)))
        })
    }
}

/// What the credentials' last application achieved, to redo only what changed.
#[derive(Debug, Default)]
struct Applied {
    /// The key sets last written (users dropped from the spec's list lose our keys).
    ssh: BTreeMap<String, BTreeSet<String>>,
    passwords: BTreeMap<String, String>,
}

/// Applies `want` over `applied`: every user's keys (those whose set changed, or all after
/// the agent (re)connected), and passwords that changed — never a password again that did
/// not change, so one the user set in the guest stays (harvester#7813).
fn apply_credentials(
    a: &dyn Agent,
    want: &Desired,
    applied: &mut Applied,
    all: bool,
) -> CredentialsStatus {
    let mut errors = Vec::new();
    let users: BTreeSet<String> = want.ssh.keys().chain(applied.ssh.keys()).cloned().collect();
    let empty = BTreeSet::new();
    for user in users {
        let keys = want.ssh.get(&user).unwrap_or(&empty);
        if !all && applied.ssh.get(&user) == Some(keys) {
            continue;
        }
        match sync_user_keys(a, &user, keys) {
            Ok((added, removed)) => {
                if added + removed > 0 {
                    tracing::info!(%user, added, removed, "SSH keys synchronised through the guest agent");
                }
                if keys.is_empty() {
                    applied.ssh.remove(&user);
                } else {
                    applied.ssh.insert(user, keys.clone());
                }
            }
            Err(e) => errors.push(format!("user {user}: {e}")),
        }
    }
    for (user, pw) in &want.passwords {
        if applied.passwords.get(user) == Some(pw) {
            continue;
        }
        match a.set_password(user, pw) {
            Ok(()) => {
                tracing::info!(%user, "password set through the guest agent");
                applied.passwords.insert(user.clone(), pw.clone());
            }
            Err(e) => errors.push(format!("user {user}: {e}")),
        }
    }
    for name in &want.missing {
        errors.push(format!("Secret {name:?} is missing or empty"));
    }
    CredentialsStatus {
        synchronized: errors.is_empty(),
        message: errors.join("; "),
    }
}

/// Starts the poller thread; it ends when [`GuestShared::stop`] is called or the domain's
/// state channel closes.
pub fn spawn_poller(
    shared: Arc<GuestShared>,
    state: watch::Receiver<Observed>,
    creds: CredentialSource,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("guest-agent".into())
        .spawn(move || poll(&shared, state, &creds))
        .map(drop)
}

fn poll(shared: &GuestShared, state: watch::Receiver<Observed>, creds: &CredentialSource) {
    let mut was_connected = false;
    // When each read is due next (none: at once).
    let mut interfaces_due: Option<Instant> = None;
    let mut interfaces_changed = Instant::now();
    let mut system_due: Option<Instant> = None;
    let mut applied = Applied::default();
    let mut last_wanted: Option<Desired> = None;
    // A failed application is tried again after a while, not every tick: a guest whose
    // agent refuses must not be asked every second.
    let mut retry_at: Option<Instant> = None;
    let uses_agent = creds.uses_agent();
    let has_credentials = !creds.credentials.is_empty();
    while !shared.stop.load(Ordering::SeqCst) {
        if state.has_changed().is_err() {
            return;
        }
        let connected = state.borrow().agent_connected;
        let agent = shared.agent().filter(|_| connected);
        let frozen = shared.frozen();
        let Some(agent) = agent else {
            if was_connected {
                tracing::info!("guest agent disconnected");
                lock(&shared.cache).system = None;
                shared.forget_filesystems();
                shared.state.send_if_modified(|s| s.status.take().is_some());
            }
            was_connected = false;
            interfaces_due = None;
            system_due = None;
            if has_credentials {
                // Missing Secrets are named even before an agent connects; boot-time
                // credentials need no agent.
                let want = creds.read();
                let status = if !want.missing.is_empty() {
                    CredentialsStatus {
                        synchronized: false,
                        message: want
                            .missing
                            .iter()
                            .map(|n| format!("Secret {n:?} is missing or empty"))
                            .collect::<Vec<_>>()
                            .join("; "),
                    }
                } else if uses_agent {
                    CredentialsStatus {
                        synchronized: false,
                        message: "waiting for the guest agent to connect".into(),
                    }
                } else {
                    CredentialsStatus {
                        synchronized: true,
                        message: String::new(),
                    }
                };
                shared
                    .state
                    .send_if_modified(|s| replace(&mut s.credentials, Some(status)));
            }
            std::thread::sleep(TICK);
            continue;
        };
        let fresh = !was_connected;
        if fresh {
            tracing::info!("guest agent connected");
            interfaces_changed = Instant::now();
        }
        was_connected = true;
        // A frozen guest's agent refuses all but a few commands: keep what was read.
        if !frozen {
            let mut status = shared.state.borrow().status.clone().unwrap_or_default();
            let mut changed = fresh;
            let now = Instant::now();
            if system_due.is_none_or(|t| now >= t) {
                system_due = Some(now + SYSTEM_EVERY);
                match read_system(&*agent) {
                    Ok(sys) => {
                        status.version = sys.version.clone();
                        status.supported_commands = sys.commands.clone();
                        status.os = sys.os.clone();
                        lock(&shared.cache).system = Some(sys);
                        changed = true;
                    }
                    Err(e) => tracing::debug!(error = %e, "reading the guest's system"),
                }
            }
            if interfaces_due.is_none_or(|t| now >= t) {
                match agent.interfaces() {
                    Ok(ifs) => {
                        if ifs != status.interfaces {
                            interfaces_changed = now;
                            status.interfaces = ifs;
                            changed = true;
                        }
                        interfaces_due = Some(now + interfaces_interval(now - interfaces_changed));
                    }
                    Err(e) => {
                        // An agent that fails (or hangs until the command's timeout) is
                        // asked less often: every call holds libvirt's agent job, which a
                        // freeze or a soft reboot waits for.
                        interfaces_due = Some(now + FAILED_READ_BACKOFF);
                        tracing::debug!(error = %e, "reading the guest's interfaces");
                    }
                }
            }
            status.frozen = shared.frozen();
            if changed {
                shared
                    .state
                    .send_if_modified(|s| replace(&mut s.status, Some(status)));
            }
            if has_credentials {
                let want = creds.read();
                let retry = retry_at.is_some_and(|t| Instant::now() >= t);
                if fresh || retry || last_wanted.as_ref() != Some(&want) {
                    let st = apply_credentials(&*agent, &want, &mut applied, fresh || retry);
                    // A missing Secret is not retried: its files appearing is a change.
                    retry_at = (!st.synchronized && want.missing.is_empty())
                        .then(|| Instant::now() + CREDENTIALS_RETRY);
                    if !st.synchronized {
                        tracing::warn!(message = %st.message, "access credentials not synchronised");
                    }
                    last_wanted = Some(want);
                    shared
                        .state
                        .send_if_modified(|s| replace(&mut s.credentials, Some(st)));
                }
            }
        }
        std::thread::sleep(TICK);
    }
}

/// Sets `slot` to `new`; whether it changed.
fn replace<T: PartialEq>(slot: &mut T, new: T) -> bool {
    if *slot == new {
        return false;
    }
    *slot = new;
    true
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// An agent over an in-memory `authorized_keys` per user, recording calls.
    #[derive(Default)]
    struct FakeAgent {
        keys: Mutex<BTreeMap<String, Vec<String>>>,
        calls: Mutex<Vec<String>>,
        passwords: Mutex<Vec<(String, String)>>,
    }

    impl Agent for FakeAgent {
        fn command(&self, execute: &str, args: Option<Value>) -> Result<Value, AgentError> {
            lock(&self.calls).push(execute.to_string());
            let args = args.unwrap_or_default();
            let user = args["username"].as_str().unwrap_or_default().to_string();
            let list = |v: &Value| -> Vec<String> {
                v.as_array()
                    .unwrap()
                    .iter()
                    .map(|k| k.as_str().unwrap().to_string())
                    .collect()
            };
            let mut keys = lock(&self.keys);
            let file = keys.entry(user).or_default();
            match execute {
                "guest-ssh-get-authorized-keys" => Ok(json!({ "keys": file.clone() })),
                "guest-ssh-add-authorized-keys" => {
                    for k in list(&args["keys"]) {
                        if !file.contains(&k) {
                            file.push(k);
                        }
                    }
                    Ok(json!({}))
                }
                "guest-ssh-remove-authorized-keys" => {
                    let gone = list(&args["keys"]);
                    file.retain(|k| !gone.contains(k));
                    Ok(json!({}))
                }
                other => Err(AgentError::Command {
                    command: other.into(),
                    message: "not faked".into(),
                }),
            }
        }
        fn interfaces(&self) -> Result<Vec<GuestInterface>, AgentError> {
            Ok(Vec::new())
        }
        fn set_password(&self, user: &str, password: &str) -> Result<(), AgentError> {
            lock(&self.passwords).push((user.into(), password.into()));
            Ok(())
        }
    }

    /// An agent whose file systems answer is set by the test (none: it fails).
    #[derive(Default)]
    struct FsAgent {
        answer: Mutex<Option<Value>>,
        asked: Mutex<u32>,
    }

    impl Agent for FsAgent {
        fn command(&self, execute: &str, _args: Option<Value>) -> Result<Value, AgentError> {
            *lock(&self.asked) += 1;
            lock(&self.answer).clone().ok_or(AgentError::Command {
                command: execute.into(),
                message: "refused".into(),
            })
        }
        fn interfaces(&self) -> Result<Vec<GuestInterface>, AgentError> {
            Ok(Vec::new())
        }
        fn set_password(&self, _: &str, _: &str) -> Result<(), AgentError> {
            Ok(())
        }
    }

    #[test]
    fn the_metrics_file_systems_are_read_once_per_period_and_never_waited_for() {
        let shared = GuestShared::default();
        let agent = Arc::new(FsAgent::default());
        shared.set_agent(agent.clone());
        *lock(&agent.answer) = Some(json!([{
            "name": "vda1", "mountpoint": "/", "type": "ext4",
            "used-bytes": 10, "total-bytes": 20, "disk": []
        }]));
        // Nothing before the agent's first answer; no read without an agent.
        assert!(shared.filesystems_for_metrics(true).is_empty());
        assert!(!shared.claim_filesystems_refresh(false));
        // One read at a time, however many scrapes ask.
        assert!(shared.claim_filesystems_refresh(true));
        assert!(!shared.claim_filesystems_refresh(true));
        shared.refresh_filesystems();
        let fs = shared.filesystems_for_metrics(true);
        assert_eq!(fs.len(), 1);
        assert_eq!((fs[0].mount_point.as_str(), fs[0].total_bytes), ("/", 20));
        assert!(shared.filesystems_for_metrics(false).is_empty());
        // Fresh: served from the cache, the agent not asked again.
        assert!(!shared.claim_filesystems_refresh(true));
        assert_eq!(*lock(&agent.asked), 1);
        // Stale and failing: the last list stands, and the agent is not asked at each
        // scrape.
        {
            let mut c = lock(&shared.cache);
            let old = Instant::now().checked_sub(FILESYSTEMS_FRESH);
            c.filesystems_read = old;
            c.filesystems_asked = old;
        }
        *lock(&agent.answer) = None;
        assert!(shared.claim_filesystems_refresh(true));
        shared.refresh_filesystems();
        assert_eq!(shared.filesystems_for_metrics(true), fs);
        assert!(!shared.claim_filesystems_refresh(true));
        // A frozen guest's agent is not asked.
        lock(&shared.cache).filesystems_asked = Instant::now().checked_sub(FILESYSTEMS_FRESH);
        shared.set_frozen(true);
        assert!(!shared.claim_filesystems_refresh(true));
        // An agent that went away shows nothing until it answers again.
        shared.forget_filesystems();
        assert!(shared.filesystems_for_metrics(true).is_empty());
    }

    fn set(keys: &[&str]) -> BTreeSet<String> {
        keys.iter().map(|k| (*k).to_string()).collect()
    }

    #[test]
    fn interfaces_are_read_often_while_fresh_and_within_the_budget_when_settled() {
        assert_eq!(interfaces_interval(Duration::ZERO), INTERFACES_EVERY_FRESH);
        assert_eq!(
            interfaces_interval(FRESH_FOR - Duration::from_millis(1)),
            INTERFACES_EVERY_FRESH
        );
        assert_eq!(interfaces_interval(FRESH_FOR), INTERFACES_EVERY_SETTLED);
        // An address reaches the status within the interval and a status write (~0.4 s
        // measured): inside the 5 s budget.
        assert!(INTERFACES_EVERY_SETTLED + Duration::from_millis(500) <= Duration::from_secs(5));
    }

    #[test]
    fn keys_are_added_replaced_and_removed_and_the_users_own_stay() {
        let a = FakeAgent::default();
        let own = "ssh-ed25519 OWN me@laptop".to_string();
        lock(&a.keys).insert("tester".into(), vec![own.clone()]);
        assert_eq!(
            sync_user_keys(&a, "tester", &set(&["ssh-ed25519 K1 a"])).unwrap(),
            (1, 0)
        );
        let file = |a: &FakeAgent| lock(&a.keys)["tester"].clone();
        assert_eq!(file(&a), [own.clone(), marked("ssh-ed25519 K1 a")]);
        // Nothing to do a second time: no add, no remove.
        lock(&a.calls).clear();
        assert_eq!(
            sync_user_keys(&a, "tester", &set(&["ssh-ed25519 K1 a"])).unwrap(),
            (0, 0)
        );
        assert_eq!(*lock(&a.calls), ["guest-ssh-get-authorized-keys"]);
        // Replaced.
        assert_eq!(
            sync_user_keys(&a, "tester", &set(&["ssh-ed25519 K2 b"])).unwrap(),
            (1, 1)
        );
        assert_eq!(file(&a), [own.clone(), marked("ssh-ed25519 K2 b")]);
        // Removed: the user's own key stays, even when it is the same key as ours was.
        lock(&a.keys)
            .get_mut("tester")
            .unwrap()
            .push("ssh-ed25519 K2 b".into());
        assert_eq!(sync_user_keys(&a, "tester", &set(&[])).unwrap(), (0, 1));
        assert_eq!(file(&a), [own, "ssh-ed25519 K2 b".to_string()]);
    }

    #[test]
    fn credentials_come_from_the_secrets_and_missing_ones_are_named() {
        let creds: Vec<AccessCredential> = serde_json::from_value(json!([
            {"sshPublicKey": {"source": {"secret": {"secretName": "keys"}},
                              "propagationMethod": {"qemuGuestAgent": {"users": ["root", "tester"]}}}},
            {"sshPublicKey": {"source": {"secret": {"secretName": "boot"}},
                              "propagationMethod": {"noCloud": {}}}},
            {"userPassword": {"source": {"secret": {"secretName": "pw"}},
                              "propagationMethod": {"qemuGuestAgent": {}}}},
            {"sshPublicKey": {"source": {"secret": {"secretName": "gone"}},
                              "propagationMethod": {"qemuGuestAgent": {"users": ["root"]}}}}
        ]))
        .unwrap();
        let d = desired(&creds, |name| match name {
            "keys" => Some(BTreeMap::from([
                (
                    "a".into(),
                    "ssh-rsa A x\n\n# comment\nssh-ed25519 B y\n".into(),
                ),
                ("b".into(), "ssh-ed25519 C z".into()),
            ])),
            "pw" => Some(BTreeMap::from([("tester".into(), "s3cret\n".into())])),
            "boot" => Some(BTreeMap::from([(
                "k".into(),
                "ssh-rsa BOOT only-at-boot".into(),
            )])),
            _ => None,
        });
        // noCloud keys are cloud-init's (BootKeys), not the agent's.
        let keys = set(&["ssh-rsa A x", "ssh-ed25519 B y", "ssh-ed25519 C z"]);
        assert_eq!(d.ssh["root"], keys);
        assert_eq!(d.ssh["tester"], keys);
        assert_eq!(d.passwords["tester"], "s3cret");
        assert_eq!(d.missing, ["gone"]);

        let a = FakeAgent::default();
        let mut applied = Applied::default();
        let st = apply_credentials(&a, &d, &mut applied, true);
        assert!(!st.synchronized);
        assert_eq!(st.message, "Secret \"gone\" is missing or empty");
        assert_eq!(lock(&a.passwords).len(), 1);
        // The password is not set again unless it changes; a user dropped from the list
        // loses our keys.
        let mut fewer = d.clone();
        fewer.ssh.remove("root");
        fewer.missing.clear();
        let st = apply_credentials(&a, &fewer, &mut applied, false);
        assert!(st.synchronized, "{}", st.message);
        assert_eq!(lock(&a.passwords).len(), 1);
        assert!(lock(&a.keys)["root"].is_empty());
        assert_eq!(lock(&a.keys)["tester"].len(), 3);
    }

    #[test]
    fn agent_answers_parse_into_kubevirts_shapes() {
        let (version, cmds) = parse_info(json!({
            "version": "7.2.0",
            "supported_commands": [
                {"enabled": true, "name": "guest-ping", "success-response": true},
                {"enabled": false, "name": "guest-exec", "success-response": true}
            ]
        }))
        .unwrap();
        assert_eq!(version, "7.2.0");
        assert_eq!(cmds[0].name, "guest-exec");
        assert!(!cmds[0].enabled && cmds[1].enabled);
        let os = parse_os(json!({
            "name": "Debian GNU/Linux", "kernel-release": "6.1.0-18-cloud-amd64",
            "version": "12 (bookworm)", "pretty-name": "Debian GNU/Linux 12 (bookworm)",
            "version-id": "12", "kernel-version": "#1 SMP", "machine": "x86_64", "id": "debian"
        }))
        .unwrap();
        assert_eq!((os.id.as_str(), os.version_id.as_str()), ("debian", "12"));
        assert_eq!(os.kernel_release, "6.1.0-18-cloud-amd64");
        let users = parse_users(json!([{"user": "tester", "login-time": 1700000000.25}])).unwrap();
        assert_eq!(users[0].user_name, "tester");
        assert_eq!(users[0].login_time, 1700000000.25);
        let fs = parse_filesystems(json!([{
            "name": "vda1", "mountpoint": "/", "type": "ext4",
            "used-bytes": 10, "total-bytes": 20,
            "disk": [{"bus-type": "virtio", "bus": 0, "unit": 0, "target": 0, "dev": "/dev/vda1"}]
        }, {"name": "sysfs", "mountpoint": "/sys", "type": "sysfs", "disk": []}]))
        .unwrap();
        assert_eq!(fs[0].mount_point, "/");
        assert_eq!(fs[0].disk[0].bus_type, "virtio");
        assert_eq!(fs[1].total_bytes, 0);
        assert_eq!(
            parse_timezone(&json!({"zone": "UTC", "offset": 0})),
            "UTC, 0"
        );
        assert_eq!(
            returned("guest-ping", r#"{"return":{}}"#).unwrap(),
            json!({})
        );
        assert!(returned("guest-ping", r#"{"error":{}}"#).is_err());
        let ifs = guest_interfaces([
            (
                "lo".into(),
                Some("00:00:00:00:00:00".into()),
                vec!["127.0.0.1".into()],
            ),
            (
                "enp1s0".into(),
                Some("52:54:00:AB:CD:EF".into()),
                vec!["10.0.2.15".into(), "fe80::1".into()],
            ),
        ]);
        assert_eq!(ifs.len(), 1);
        assert_eq!(ifs[0].mac.as_deref(), Some("52:54:00:ab:cd:ef"));
        assert_eq!(
            AgentError::from_libvirt(
                "x",
                "Guest agent is not responding: QEMU guest agent is not connected"
            ),
            AgentError::NotConnected
        );
    }
}
