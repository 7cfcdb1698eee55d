//! `cargo xtask cluster up|down|status`: a real single-node Kubernetes on this machine, built from
//! parts (no Docker, no registry). See docs/local-cluster.md.
//!
//! Everything lives under `target/cluster/` (state, logs, cache); the processes are tracked by PID
//! files there, which makes `up` idempotent and lets `down` remove exactly what `up` made.

use std::cell::Cell;
use std::fs;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Subcommand;

mod config;
mod daemon;
mod host;
mod images;
mod kube_build;
mod kwok;
mod net;
mod node2;
mod pki;
mod prometheus;
mod storage;

pub use images::{ImageFile, ImageSpec, PAUSE_IMAGE};
pub(crate) use storage::HELPER_IMAGE;

use daemon::Daemon;

/// Our bridge: pod network and node IP.
const BRIDGE: &str = "k8slab0";
const BRIDGE_IP: &str = "10.213.0.1";
const BRIDGE_CIDR_LEN: u8 = 24;
const BRIDGE_SUBNET: &str = "10.213.0.0/24";
const POD_RANGE: (&str, &str) = ("10.213.0.10", "10.213.0.250");
/// Service range, blackholed on the host; its first IP is DNATed to the apiserver.
const SERVICE_CIDR: &str = "10.213.128.0/20";
/// How long pods stay bound to a NotReady or unreachable node before they are evicted
/// (Kubernetes' default: 300 s).
const NOT_READY_TOLERATION_S: u32 = 1800;
const FIRST_SERVICE_IP: &str = "10.213.128.1";
const APISERVER_PORT: u16 = 6443;
/// Not etcd's default ports: `cargo xtask dev-apiserver` runs its own etcd on those.
const ETCD_CLIENT_PORT: u16 = 12379;
const ETCD_PEER_PORT: u16 = 12380;
const CONTROLLER_MANAGER_PORT: u16 = 10257;
const SCHEDULER_PORT: u16 = 10259;
const KUBELET_PORT: u16 = 10250;
const KUBELET_HEALTHZ_PORT: u16 = 10248;
const KUBE_PROXY_HEALTHZ_PORT: u16 = 10256;
const KUBE_PROXY_METRICS_PORT: u16 = 10249;

/// Arguments of `cargo xtask cluster`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Build (first time) and start the cluster; reuses a running one.
    Up {
        /// Where to write the admin kubeconfig [default: target/cluster/kubeconfig].
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// Number of nodes: 1, or 2 (a second kubelet on this machine; see
        /// docs/local-cluster.md). A running second node is kept either way.
        #[arg(long, default_value_t = 1)]
        nodes: u32,
        /// Also run Prometheus (built from its Go module), scraping kubevirt-rs through
        /// virt-operator's ServiceMonitor and evaluating its PrometheusRule; on
        /// http://127.0.0.1:9090. Run it again after a deploy to pick those up.
        #[arg(long)]
        prometheus: bool,
    },
    /// Stop the cluster and remove everything it created on this machine.
    Down,
    /// Show what is running and what is left on the machine.
    Status,
    /// Import an OCI archive (`buildah push IMG oci-archive:FILE:IMG`) into the cluster's containerd.
    Import {
        /// The archive.
        archive: PathBuf,
    },
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    let layout = Layout::discover()?;
    match args.command {
        Cmd::Up {
            kubeconfig,
            nodes,
            prometheus,
        } => {
            let lock = layout.lock()?;
            up(&layout, kubeconfig, nodes)?;
            if prometheus {
                prometheus_up_locked(&layout)?;
            }
            drop(lock);
            // kubectl for this cluster and our plugin, on one PATH entry: a fresh machine has
            // no kubectl at all.
            crate::user_bin::build_plugin_if_missing()?;
            crate::user_bin::link(&kubernetes_bin_dir()?)?;
            println!(
                "kubectl ({} client) and kubectl-virt:\n{}",
                kube_build::pinned_version(&layout)?,
                crate::user_bin::path_line()
            );
            Ok(())
        }
        Cmd::Down => {
            let _lock = layout.lock()?;
            down(&layout)
        }
        Cmd::Status => status(&layout),
        Cmd::Import { archive } => {
            import_image(&archive)?;
            println!("imported {}", archive.display());
            Ok(())
        }
    }
}

/// Imports an OCI archive (e.g. from `buildah push IMG oci-archive:FILE:IMG`) into the running
/// cluster's containerd, so that pods can use the image with `imagePullPolicy: Never` or
/// `IfNotPresent`. Name images fully (`localhost/…:tag`).
pub fn import_image(archive: &Path) -> anyhow::Result<()> {
    images::import_all(&Layout::discover()?, archive)
}

// Library API for other xtask commands (images, e2e helpers); not every one is called yet.
#[allow(dead_code)]
/// Builds an image FROM scratch (static binaries and files only) and writes it as an OCI archive,
/// ready for [`import_image`].
pub fn build_scratch_image(
    name: &str,
    files: &[ImageFile],
    entrypoint: &[&str],
    archive: &Path,
) -> anyhow::Result<()> {
    images::build_scratch_image(&Layout::discover()?, name, files, entrypoint, archive)
}

/// Builds an image FROM scratch from a root filesystem tar and/or files, as [`ImageSpec`] says.
pub fn build_image(name: &str, spec: &ImageSpec<'_>, archive: &Path) -> anyhow::Result<()> {
    images::build_image(&Layout::discover()?, name, spec, archive)
}

/// Gives an image of the running cluster's containerd another name.
pub fn tag_image(from: &str, to: &str) -> anyhow::Result<()> {
    images::tag_all(&Layout::discover()?, from, to)
}

/// Builds the pinned Kubernetes binaries unless they are cached, and returns their
/// directory. Integration tests outside e2e (controllers/tests) start their own
/// kube-apiserver from there, so `cargo xtask test` needs them before `cargo test`.
pub fn ensure_kubernetes_binaries() -> anyhow::Result<PathBuf> {
    let layout = Layout::discover()?;
    let _lock = layout.lock()?;
    kube_build::ensure(&layout, &Progress::new())
}

/// Builds the pinned KWOK controller unless it is cached, and returns the binary
/// (`cargo xtask bench scale`'s fake nodes).
pub fn ensure_kwok() -> anyhow::Result<PathBuf> {
    let layout = Layout::discover()?;
    kwok::ensure(&layout, &Progress::new())
}

/// The KWOK version `e2e/kwok/go.mod` pins.
pub fn kwok_version() -> anyhow::Result<String> {
    kwok::pinned_version(&Layout::discover()?.root)
}

/// Where the pinned Kubernetes binaries are (built by [`ensure_kubernetes_binaries`]).
pub fn kubernetes_bin_dir() -> anyhow::Result<PathBuf> {
    let layout = Layout::discover()?;
    Ok(kube_build::bin_dir(
        &layout,
        &kube_build::pinned_version(&layout)?,
    ))
}

/// kube-apiserver's aggregation layer as this cluster runs it: the front-proxy CA that it
/// and extension API servers trust for X-Remote-* headers, the client certificate it proxies
/// with, and APIService traffic sent to endpoint (pod) IPs, so no kube-proxy is needed.
/// `cargo xtask bench crd` registers virt-apiserver behind a kube-apiserver of its own with
/// the same flags.
pub fn aggregation_flags(
    front_proxy_ca: &Path,
    proxy_cert: &Path,
    proxy_key: &Path,
) -> Vec<String> {
    vec![
        format!(
            "--requestheader-client-ca-file={}",
            front_proxy_ca.display()
        ),
        "--requestheader-allowed-names=front-proxy-client".into(),
        "--requestheader-username-headers=X-Remote-User".into(),
        "--requestheader-group-headers=X-Remote-Group".into(),
        "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
        format!("--proxy-client-cert-file={}", proxy_cert.display()),
        format!("--proxy-client-key-file={}", proxy_key.display()),
        "--enable-aggregator-routing=true".into(),
    ]
}

#[allow(dead_code)]
/// Brings the cluster up (or reuses it) and returns the path of the admin kubeconfig.
pub fn ensure_up(kubeconfig: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    ensure_up_nodes(kubeconfig, 1)
}

/// [`ensure_up`] with `nodes` nodes (1 or 2).
pub fn ensure_up_nodes(kubeconfig: Option<PathBuf>, nodes: u32) -> anyhow::Result<PathBuf> {
    let layout = Layout::discover()?;
    let _lock = layout.lock()?;
    up(&layout, kubeconfig, nodes)
}

/// Starts (or reconfigures) Prometheus on the running cluster: `cluster up --prometheus`.
pub fn prometheus_up() -> anyhow::Result<()> {
    let layout = Layout::discover()?;
    let _lock = layout.lock()?;
    prometheus_up_locked(&layout)
}

fn prometheus_up_locked(layout: &Layout) -> anyhow::Result<()> {
    let progress = Progress::new();
    let bin = kube_build::bin_dir(layout, &kube_build::pinned_version(layout)?);
    prometheus::up(layout, &progress, &bin)
}

/// Paths of everything we own.
#[derive(Debug, Clone)]
pub struct Layout {
    /// Workspace root.
    root: PathBuf,
    /// Cargo target dir.
    target: PathBuf,
    /// `target/cluster`.
    cluster: PathBuf,
    /// Removed by `down`.
    state: PathBuf,
    /// Kept by `down` for post-mortems; truncated by the next cold `up`.
    logs: PathBuf,
    /// PID files and sockets.
    run: PathBuf,
    /// Survives `down`: the pause image.
    cache: PathBuf,
    /// e2e/k8s, the Go module pinning Kubernetes.
    k8s_module: PathBuf,
    containerd_socket: PathBuf,
    /// Kubeconfigs of the components.
    kubeconfigs: PathBuf,
}

impl Layout {
    fn discover() -> anyhow::Result<Self> {
        let root = crate::workspace_root();
        let target = match std::env::var_os("CARGO_TARGET_DIR") {
            Some(t) => root.join(t),
            None => root.join("target"),
        };
        let cluster = target.join("cluster");
        let state = cluster.join("state");
        let run = state.join("run");
        Ok(Self {
            k8s_module: root.join("e2e/k8s"),
            logs: cluster.join("logs"),
            cache: cluster.join("cache"),
            containerd_socket: run.join("containerd.sock"),
            kubeconfigs: state.join("kubeconfigs"),
            run,
            state,
            cluster,
            target,
            root,
        })
    }

    /// Serialises `up` and `down` (e.g. two test binaries bringing the cluster up at once).
    fn lock(&self) -> anyhow::Result<nix::fcntl::Flock<fs::File>> {
        use nix::fcntl::{Flock, FlockArg};
        fs::create_dir_all(&self.cluster)?;
        let path = self.cluster.join(".lock");
        let open =
            || fs::File::create(&path).with_context(|| format!("opening {}", path.display()));
        match Flock::lock(open()?, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => Ok(lock),
            Err(_) => {
                println!("waiting for another `cargo xtask cluster up/down` to finish…");
                Flock::lock(open()?, FlockArg::LockExclusive)
                    .map_err(|(_, e)| anyhow::anyhow!("locking {}: {e}", path.display()))
            }
        }
    }

    fn admin_kubeconfig(&self) -> PathBuf {
        self.kubeconfigs.join("admin.kubeconfig")
    }

    fn default_kubeconfig(&self) -> PathBuf {
        self.cluster.join("kubeconfig")
    }

    /// Whether the Go module cache already holds the pinned release (then the build is minutes
    /// shorter, which is worth telling the user).
    fn go_cache_warm(&self) -> bool {
        let Ok(version) = kube_build::pinned_version(self) else {
            return false;
        };
        let Some(go) = kube_build::go_binary() else {
            return false;
        };
        Command::new(go)
            .args(["env", "GOMODCACHE"])
            .output()
            .ok()
            .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
            .is_some_and(|m| m.join(format!("k8s.io/kubernetes@{version}")).exists())
    }
}

/// One line per step with the time it took.
#[derive(Debug)]
pub struct Progress {
    start: Instant,
    last: Cell<Instant>,
}

impl Progress {
    fn new() -> Self {
        let now = Instant::now();
        Self {
            start: now,
            last: Cell::new(now),
        }
    }

    /// Reports a finished step with its duration.
    fn step(&self, msg: &str) {
        let now = Instant::now();
        println!(
            "[{:6.1} s] {msg} ({:.1} s)",
            now.duration_since(self.start).as_secs_f64(),
            now.duration_since(self.last.get()).as_secs_f64()
        );
        self.last.set(now);
    }

    /// Reports something without closing a step.
    fn note(&self, msg: &str) {
        println!("[{:6.1} s] {msg}", self.start.elapsed().as_secs_f64());
    }
}

/// Finds a program in PATH.
fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

/// Everything `up` needs from the machine, with the Debian package that provides it.
fn check_prerequisites() -> anyhow::Result<()> {
    let mut missing: Vec<String> = Vec::new();
    if !nix::unistd::geteuid().is_root() {
        bail!(
            "`cargo xtask cluster` must run as root (it starts kubelet and containerd and creates a bridge)"
        );
    }
    for (program, package) in [
        ("etcd", "etcd-server"),
        ("containerd", "containerd"),
        ("ctr", "containerd"),
        ("runc", "runc"),
        ("buildah", "buildah"),
        ("iptables", "iptables"),
        ("ip6tables", "iptables"),
        ("ip", "iproute2"),
        ("umount", "mount"),
        ("gcc", "gcc"),
        ("nice", "coreutils"),
    ] {
        if which(program).is_none() && !Path::new("/usr/sbin").join(program).exists() {
            missing.push(format!("`{program}` (apt-get install {package})"));
        }
    }
    if !Path::new("/usr/sbin/runc").exists() && which("runc").is_some() {
        missing.push(
            "runc at /usr/sbin/runc (the containerd config names it there; apt-get install runc)"
                .into(),
        );
    }
    for plugin in ["bridge", "host-local", "portmap"] {
        if !Path::new("/usr/lib/cni").join(plugin).exists() {
            missing.push(format!(
                "CNI plugin /usr/lib/cni/{plugin} (apt-get install containernetworking-plugins)"
            ));
        }
    }
    if !Path::new("/usr/lib/x86_64-linux-gnu/libc.a").exists()
        && !Path::new("/usr/lib/libc.a").exists()
    {
        missing.push("static libc for the pause image (apt-get install libc6-dev)".into());
    }
    let filesystems = fs::read_to_string("/proc/filesystems").unwrap_or_default();
    if !filesystems.contains("overlay") {
        missing.push("the overlay filesystem (modprobe overlay)".into());
    }
    if !Path::new("/proc/sys/net/bridge/bridge-nf-call-iptables").exists() {
        missing.push("bridge netfilter (modprobe br_netfilter)".into());
    }
    if !Path::new("/sys/fs/cgroup/memory").exists()
        && !Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
    {
        missing.push("a memory cgroup (cgroup v1 memory controller or cgroup v2)".into());
    }
    if !missing.is_empty() {
        bail!(
            "cannot bring the cluster up, missing:\n  - {}",
            missing.join("\n  - ")
        );
    }
    Ok(())
}

fn node_name() -> anyhow::Result<String> {
    Ok(fs::read_to_string("/proc/sys/kernel/hostname")?
        .trim()
        .to_lowercase())
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Fails if a port we are about to bind is taken by someone else.
fn ensure_port_free(port: u16, who: &str) -> anyhow::Result<()> {
    if daemon::port_open(loopback(port)) {
        bail!("port 127.0.0.1:{port} needed by {who} is in use by another process (not ours)");
    }
    Ok(())
}

/// Runs our kubectl (same version as the cluster) with the admin kubeconfig.
fn kubectl(layout: &Layout, bin: &Path, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(bin.join("kubectl"))
        .arg("--kubeconfig")
        .arg(layout.admin_kubeconfig())
        .arg("--request-timeout=5s")
        .args(args)
        .output()
        .context("running kubectl")?;
    if !out.status.success() {
        bail!(
            "kubectl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Starts (or finds running) one daemon and waits until `ready` says so.
fn start(
    layout: &Layout,
    progress: &Progress,
    d: Daemon,
    ports: &[u16],
    what: &str,
    timeout: Duration,
    ready: impl FnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<()> {
    let name = d.name;
    if daemon::running_pid(layout, name).is_none() {
        for port in ports {
            ensure_port_free(*port, name)?;
        }
    }
    let (pid, reused) = d.ensure(layout)?;
    daemon::wait_for(layout, name, what, timeout, ready)?;
    if reused {
        progress.step(&format!("{name} already running (pid {pid})"));
    } else {
        progress.step(&format!("{name} {what} (pid {pid})"));
    }
    Ok(())
}

fn up(layout: &Layout, kubeconfig: Option<PathBuf>, nodes: u32) -> anyhow::Result<PathBuf> {
    if !(1..=2).contains(&nodes) {
        bail!("--nodes {nodes}: 1 or 2 nodes are supported");
    }
    let progress = Progress::new();
    check_prerequisites()?;
    let bin = kube_build::ensure(layout, &progress)?;
    let result = start_all(layout, &progress, &bin, kubeconfig).and_then(|kc| {
        let first = node_name()?;
        let mut names = vec![first.clone()];
        if nodes == 2 {
            node2::up(layout, &progress, &bin, &first)?;
            names.push(node2::name(&first));
        }
        // PersistentVolumeClaims bind as on kind: a default StorageClass with a real
        // dynamic provisioner.
        storage::up(layout, &progress, &bin, &names)?;
        Ok(kc)
    });
    if result.is_err() {
        eprintln!(
            "cluster up failed; logs are in {}. `cargo xtask cluster down` removes what was started.",
            layout.logs.display()
        );
    }
    result
}

fn start_all(
    layout: &Layout,
    progress: &Progress,
    bin: &Path,
    kubeconfig: Option<PathBuf>,
) -> anyhow::Result<PathBuf> {
    let node = node_name()?;
    let bridge_ip: IpAddr = BRIDGE_IP.parse()?;
    let first_service_ip: IpAddr = FIRST_SERVICE_IP.parse()?;
    let cold = daemon::running_pid(layout, "kube-apiserver").is_none();
    if cold && daemon::running_pid(layout, "etcd").is_none() && layout.logs.exists() {
        // A fresh start: keep the previous run's logs apart rather than mixing them in.
        let previous = layout.cluster.join("logs.previous");
        let _ = fs::remove_dir_all(&previous);
        let _ = fs::rename(&layout.logs, &previous);
    }
    for d in [
        &layout.state,
        &layout.logs,
        &layout.run,
        &layout.kubeconfigs,
        &layout.cache,
    ] {
        fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    host::record(layout)?;
    host::pin_netns_dir()?;

    let pki = pki::Pki::new(layout);
    if pki.exists() {
        progress.step("certificates reused");
    } else {
        pki.generate(&node, bridge_ip, first_service_ip)?;
        progress.step("certificates generated (cluster CA, front-proxy CA, service-account key)");
    }
    let server = format!("https://127.0.0.1:{APISERVER_PORT}");
    for name in [
        "admin",
        "controller-manager",
        "scheduler",
        "kube-proxy",
        "kubelet-client",
    ] {
        pki.write_kubeconfig(
            name,
            &server,
            &layout.kubeconfigs.join(format!("{name}.kubeconfig")),
        )?;
    }
    let user_kubeconfig = kubeconfig.unwrap_or_else(|| layout.default_kubeconfig());
    let user_kubeconfig = std::path::absolute(&user_kubeconfig)?;
    pki.write_kubeconfig("admin", &server, &user_kubeconfig)?;
    fs::write(
        layout.state.join("user-kubeconfig-path"),
        user_kubeconfig.as_os_str().as_encoded_bytes(),
    )?;

    net::up()?;
    progress.step(&format!(
        "network ready (bridge {BRIDGE} {BRIDGE_IP}/{BRIDGE_CIDR_LEN}, services {SERVICE_CIDR})"
    ));

    let etcd_addr = loopback(ETCD_CLIENT_PORT);
    start(
        layout,
        progress,
        Daemon::new("etcd", "etcd")
            .arg("--name=kubevirt-rs")
            .arg(format!(
                "--data-dir={}",
                layout.state.join("etcd").display()
            ))
            .arg(format!(
                "--listen-client-urls=http://127.0.0.1:{ETCD_CLIENT_PORT}"
            ))
            .arg(format!(
                "--advertise-client-urls=http://127.0.0.1:{ETCD_CLIENT_PORT}"
            ))
            .arg(format!(
                "--listen-peer-urls=http://127.0.0.1:{ETCD_PEER_PORT}"
            ))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{ETCD_PEER_PORT}"
            ))
            .arg(format!(
                "--initial-cluster=kubevirt-rs=http://127.0.0.1:{ETCD_PEER_PORT}"
            )),
        &[ETCD_CLIENT_PORT, ETCD_PEER_PORT],
        "healthy",
        Duration::from_secs(30),
        || Ok(daemon::http_status(etcd_addr, "/health")? == 200),
    )?;

    let p = |f: &str| layout.state.join("pki").join(f).display().to_string();
    let k = |f: &str| {
        layout
            .kubeconfigs
            .join(format!("{f}.kubeconfig"))
            .display()
            .to_string()
    };
    let apiserver = Daemon::new("kube-apiserver", bin.join("kube-apiserver"))
        .arg("--bind-address=127.0.0.1")
        .arg(format!("--secure-port={APISERVER_PORT}"))
        .arg(format!("--advertise-address={BRIDGE_IP}"))
        .arg(format!(
            "--etcd-servers=http://127.0.0.1:{ETCD_CLIENT_PORT}"
        ))
        .arg(format!("--service-cluster-ip-range={SERVICE_CIDR}"))
        .arg(format!("--client-ca-file={}", p("ca.crt")))
        .arg(format!("--tls-cert-file={}", p("apiserver.crt")))
        .arg(format!("--tls-private-key-file={}", p("apiserver.key")))
        .arg(format!(
            "--kubelet-client-certificate={}",
            p("apiserver-kubelet-client.crt")
        ))
        .arg(format!(
            "--kubelet-client-key={}",
            p("apiserver-kubelet-client.key")
        ))
        .arg(format!("--kubelet-certificate-authority={}", p("ca.crt")))
        // Each kubelet serves its API on its node IP on our bridge (two kubelets on one
        // machine cannot both own a hostname that resolves to loopback).
        .arg("--kubelet-preferred-address-types=InternalIP")
        .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
        .arg(format!("--service-account-key-file={}", p("sa.pub")))
        .arg(format!(
            "--service-account-signing-key-file={}",
            p("sa.key")
        ))
        .arg("--authorization-mode=Node,RBAC")
        .arg("--enable-admission-plugins=NodeRestriction")
        .arg("--allow-privileged=true")
        // Both nodes are kubelets on this one machine: a node NotReady here is a kubelet
        // starved by a loaded 2-CPU host for a while, not a lost machine, and evicting its
        // pods after the default 300 s (etcd's member with its node-local volume, every
        // VM's launcher) turns a slow minute into a lost API and lost VMs.
        .arg(format!(
            "--default-not-ready-toleration-seconds={NOT_READY_TOLERATION_S}"
        ))
        .arg(format!(
            "--default-unreachable-toleration-seconds={NOT_READY_TOLERATION_S}"
        ));
    let apiserver = aggregation_flags(
        &layout.state.join("pki/front-proxy-ca.crt"),
        &layout.state.join("pki/front-proxy-client.crt"),
        &layout.state.join("pki/front-proxy-client.key"),
    )
    .into_iter()
    .fold(apiserver, Daemon::arg);
    start(
        layout,
        progress,
        apiserver,
        &[APISERVER_PORT],
        "ready",
        Duration::from_secs(90),
        || Ok(kubectl(layout, bin, &["get", "--raw", "/readyz"])?.trim() == "ok"),
    )?;

    let cm = Daemon::new(
        "kube-controller-manager",
        bin.join("kube-controller-manager"),
    )
    .arg(format!("--kubeconfig={}", k("controller-manager")))
    .arg(format!(
        "--authentication-kubeconfig={}",
        k("controller-manager")
    ))
    .arg(format!(
        "--authorization-kubeconfig={}",
        k("controller-manager")
    ))
    .arg("--bind-address=127.0.0.1")
    .arg(format!("--secure-port={CONTROLLER_MANAGER_PORT}"))
    .arg(format!("--client-ca-file={}", p("ca.crt")))
    .arg(format!(
        "--requestheader-client-ca-file={}",
        p("front-proxy-ca.crt")
    ))
    .arg(format!("--cluster-signing-cert-file={}", p("ca.crt")))
    .arg(format!("--cluster-signing-key-file={}", p("ca.key")))
    .arg(format!("--root-ca-file={}", p("ca.crt")))
    .arg(format!(
        "--service-account-private-key-file={}",
        p("sa.key")
    ))
    .arg("--use-service-account-credentials=true")
    .arg(format!("--service-cluster-ip-range={SERVICE_CIDR}"))
    .arg("--allocate-node-cidrs=false")
    .arg("--controllers=*,bootstrapsigner,tokencleaner")
    // A kubelet that misses its lease renewals for a minute on a loaded host is still there.
    .arg("--node-monitor-grace-period=2m")
    // A single instance: leader election only adds a wait after restarts.
    .arg("--leader-elect=false");
    start(
        layout,
        progress,
        cm,
        &[CONTROLLER_MANAGER_PORT],
        "serving",
        Duration::from_secs(60),
        || Ok(daemon::port_open(loopback(CONTROLLER_MANAGER_PORT))),
    )?;
    let scheduler = Daemon::new("kube-scheduler", bin.join("kube-scheduler"))
        .arg(format!("--kubeconfig={}", k("scheduler")))
        .arg(format!("--authentication-kubeconfig={}", k("scheduler")))
        .arg(format!("--authorization-kubeconfig={}", k("scheduler")))
        .arg("--bind-address=127.0.0.1")
        .arg(format!("--secure-port={SCHEDULER_PORT}"))
        .arg("--leader-elect=false");
    start(
        layout,
        progress,
        scheduler,
        &[SCHEDULER_PORT],
        "serving",
        Duration::from_secs(60),
        || Ok(daemon::port_open(loopback(SCHEDULER_PORT))),
    )?;

    let containerd_config = layout.state.join("containerd.toml");
    fs::write(&containerd_config, config::containerd(layout))?;
    fs::create_dir_all(layout.state.join("cni/net.d"))?;
    fs::write(
        layout.state.join("cni/net.d/10-kubevirt-rs.conflist"),
        config::cni(layout),
    )?;
    let sock = layout.containerd_socket.clone();
    start(
        layout,
        progress,
        Daemon::new("containerd", "containerd")
            .arg(format!("--config={}", containerd_config.display())),
        &[],
        "serving",
        Duration::from_secs(30),
        || {
            Ok(Command::new("ctr")
                .arg("--address")
                .arg(&sock)
                .arg("version")
                .output()?
                .status
                .success())
        },
    )?;

    if !images::has_image(layout, PAUSE_IMAGE) {
        let archive = images::pause_archive(layout)?;
        images::import(layout, &archive)?;
        progress.step(&format!("pause image {PAUSE_IMAGE} built and imported"));
    }

    let kubelet_config = layout.state.join("kubelet.yaml");
    fs::write(&kubelet_config, config::kubelet(layout))?;
    // No cluster DNS here: pods get a resolver that answers nothing rather than the host's.
    fs::write(layout.state.join("resolv.conf"), "nameserver 127.0.0.1\n")?;
    start(
        layout,
        progress,
        Daemon::new("kubelet", bin.join("kubelet"))
            .arg(format!("--config={}", kubelet_config.display()))
            .arg(format!("--kubeconfig={}", k("kubelet-client")))
            .arg(format!(
                "--root-dir={}",
                layout.state.join("kubelet").display()
            ))
            .arg(format!("--node-ip={BRIDGE_IP}")),
        &[KUBELET_PORT, KUBELET_HEALTHZ_PORT],
        "healthy",
        Duration::from_secs(60),
        || Ok(daemon::http_status(loopback(KUBELET_HEALTHZ_PORT), "/healthz")? == 200),
    )?;
    let jsonpath = r#"jsonpath={.status.conditions[?(@.type=="Ready")].status}"#;
    daemon::wait_for(
        layout,
        "kubelet",
        "node Ready",
        Duration::from_secs(90),
        || Ok(kubectl(layout, bin, &["get", "node", &node, "-o", jsonpath])?.trim() == "True"),
    )?;
    progress.step(&format!("node {node} Ready"));
    daemon::wait_for(
        layout,
        "kube-controller-manager",
        "default service account",
        Duration::from_secs(60),
        || {
            Ok(kubectl(
                layout,
                bin,
                &["get", "serviceaccount", "default", "-o", "name"],
            )
            .is_ok()
                && kubectl(
                    layout,
                    bin,
                    &["get", "configmap", "kube-root-ca.crt", "-o", "name"],
                )
                .is_ok())
        },
    )?;
    progress.step("default service account and root CA published");

    // kube-proxy would DNAT the kubernetes Service to the apiserver's advertised (bridge) address,
    // where nothing listens: our own DNAT to loopback must keep that Service.
    kubectl(
        layout,
        bin,
        &[
            "label",
            "service",
            "kubernetes",
            "service.kubernetes.io/service-proxy-name=none",
            "--overwrite",
        ],
    )?;
    start(
        layout,
        progress,
        Daemon::new("kube-proxy", bin.join("kube-proxy"))
            .arg(format!("--kubeconfig={}", k("kube-proxy")))
            .arg(format!("--hostname-override={node}"))
            .arg("--proxy-mode=iptables")
            .arg(format!("--cluster-cidr={BRIDGE_SUBNET}"))
            .arg("--bind-address=127.0.0.1")
            .arg(format!(
                "--healthz-bind-address=127.0.0.1:{KUBE_PROXY_HEALTHZ_PORT}"
            ))
            .arg(format!(
                "--metrics-bind-address=127.0.0.1:{KUBE_PROXY_METRICS_PORT}"
            ))
            // NodePorts only on the bridge, never on the host's real interfaces or loopback (which
            // would make kube-proxy set route_localnet on every interface).
            .arg(format!("--nodeport-addresses={BRIDGE_IP}/32"))
            .arg("--iptables-localhost-nodeports=false")
            // Zero: leave the host's conntrack sysctls alone.
            .arg("--conntrack-max-per-core=0")
            .arg("--conntrack-tcp-timeout-established=0")
            .arg("--conntrack-tcp-timeout-close-wait=0"),
        &[KUBE_PROXY_HEALTHZ_PORT, KUBE_PROXY_METRICS_PORT],
        "healthy",
        Duration::from_secs(60),
        || Ok(daemon::http_status(loopback(KUBE_PROXY_HEALTHZ_PORT), "/healthz")? == 200),
    )?;
    println!(
        "cluster up in {:.1} s. kubeconfig: {}\n  export KUBECONFIG={}\n  kubectl get nodes   (a matching kubectl: {})",
        progress.start.elapsed().as_secs_f64(),
        user_kubeconfig.display(),
        user_kubeconfig.display(),
        bin.join("kubectl").display()
    );
    Ok(user_kubeconfig)
}

/// Names of our daemons in stop order.
const STOP_ORDER: &[&str] = &[
    prometheus::DAEMON_NAME,
    storage::DAEMON_NAME,
    "kube-proxy",
    node2::KUBELET,
    "kubelet",
    node2::CONTAINERD,
    "containerd",
    "kube-scheduler",
    "kube-controller-manager",
    "kube-apiserver",
    "etcd",
];

fn down(layout: &Layout) -> anyhow::Result<()> {
    let progress = Progress::new();
    if !nix::unistd::geteuid().is_root() {
        bail!("`cargo xtask cluster down` must run as root");
    }
    let bin = kube_build::pinned_version(layout)
        .map(|v| kube_build::bin_dir(layout, &v))
        .ok();
    let apiserver_up = daemon::running_pid(layout, "kube-apiserver").is_some();
    let kubelet_up = daemon::running_pid(layout, "kubelet").is_some();
    let l2 = node2::node_layout(layout);
    if let (Some(bin), true, true) = (&bin, apiserver_up, kubelet_up) {
        // Let kubelet tear the pods down itself (CNI DEL, volume unmounts); stop the controllers
        // first so that nothing recreates them.
        for name in ["kube-controller-manager", "kube-scheduler"] {
            daemon::stop(layout, name, Duration::from_secs(10))?;
        }
        let _ = kubectl(
            layout,
            bin,
            &[
                "delete",
                "pods",
                "--all",
                "--all-namespaces",
                "--grace-period=0",
                "--force",
                "--wait=false",
            ],
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline
            && !(host::containerd_tasks(layout).is_empty()
                && host::containerd_tasks(&l2).is_empty())
        {
            std::thread::sleep(Duration::from_millis(300));
        }
        progress.step("pods deleted");
    }
    for name in ["kube-proxy", node2::KUBELET, "kubelet"] {
        if daemon::stop(layout, name, Duration::from_secs(15))? {
            progress.step(&format!("{name} stopped"));
        }
    }
    if let Some(bin) = &bin {
        // Its own cleanup first (it knows its rules); net::down removes what is left.
        let _ = Command::new(bin.join("kube-proxy"))
            .arg("--cleanup")
            .output();
    }
    if daemon::running_pid(layout, "containerd").is_some() {
        host::remove_containerd_workloads(layout);
        progress.step("containerd tasks and containers removed");
    }
    if node2::running(layout) {
        host::remove_containerd_workloads(&l2);
        progress.step("node 2: containerd tasks and containers removed");
    }
    for name in STOP_ORDER {
        if daemon::stop(layout, name, Duration::from_secs(15))? {
            progress.step(&format!("{name} stopped"));
        }
    }
    let before = host::load(layout);
    host::unmount_all(layout)?;
    progress.step("mounts and network namespaces removed");
    net::down()?;
    progress.step("bridge, firewall rules and routes removed");
    host::restore(layout)?;
    progress.step("sysctls, cgroups and host paths restored");
    if let Ok(p) = fs::read_to_string(layout.state.join("user-kubeconfig-path")) {
        let _ = fs::remove_file(p.trim());
    }
    let _ = fs::remove_file(layout.default_kubeconfig());
    if layout.state.exists() {
        fs::remove_dir_all(&layout.state)
            .with_context(|| format!("removing {}", layout.state.display()))?;
    }
    let left = host::leftovers(layout, &before);
    if left.is_empty() {
        progress.step("cluster removed; nothing left on the machine");
    } else {
        bail!("cluster down left:\n  - {}", left.join("\n  - "));
    }
    Ok(())
}

fn status(layout: &Layout) -> anyhow::Result<()> {
    let mut any = false;
    for name in STOP_ORDER.iter().rev() {
        match daemon::running_pid(layout, name) {
            Some(pid) => {
                any = true;
                println!("{name:<24} running (pid {pid})");
            }
            None => println!("{name:<24} stopped"),
        }
    }
    println!("{}", net::describe());
    let version = kube_build::pinned_version(layout)?;
    let bin = kube_build::bin_dir(layout, &version);
    println!(
        "Kubernetes {version} binaries: {}",
        if kube_build::has_binaries(&bin) {
            "built"
        } else {
            "not built yet"
        }
    );
    if daemon::running_pid(layout, "kube-apiserver").is_some() {
        match kubectl(layout, &bin, &["get", "nodes", "-o", "wide"]) {
            Ok(out) => print!("{out}"),
            Err(e) => println!("kube-apiserver not answering: {e:#}"),
        }
        println!("kubeconfig: {}", layout.default_kubeconfig().display());
    }
    if !any {
        let left = host::leftovers(layout, &host::load(layout));
        if !left.is_empty() {
            println!(
                "left on the machine (run `cargo xtask cluster down`):\n  - {}",
                left.join("\n  - ")
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A layout rooted in a scratch directory, the Go module taken from the real workspace.
    pub(super) fn scratch_layout(name: &str) -> Layout {
        let real = Layout::discover().expect("layout");
        let dir = std::env::temp_dir().join(format!("xtask-cluster-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let state = dir.join("state");
        Layout {
            cluster: dir.clone(),
            logs: dir.join("logs"),
            cache: dir.join("cache"),
            run: state.join("run"),
            containerd_socket: state.join("run/containerd.sock"),
            kubeconfigs: state.join("kubeconfigs"),
            state,
            ..real
        }
    }

    #[test]
    fn pinned_version_is_read_from_go_mod() {
        let layout = Layout::discover().expect("layout");
        let v = kube_build::pinned_version(&layout).expect("version");
        assert!(v.starts_with("v1."), "{v}");
    }

    #[test]
    fn certificates_carry_the_addresses_clients_use() {
        let layout = scratch_layout("pki");
        let pki = pki::Pki::new(&layout);
        assert!(!pki.exists());
        pki.generate(
            "node-a",
            BRIDGE_IP.parse().expect("ip"),
            FIRST_SERVICE_IP.parse().expect("ip"),
        )
        .expect("generate");
        assert!(pki.exists());
        let pem = fs::read_to_string(pki.path("apiserver.crt")).expect("read");
        let params = rcgen::CertificateParams::from_ca_cert_pem(&pem).expect("parse");
        let sans: Vec<String> = params
            .subject_alt_names
            .iter()
            .map(|s| match s {
                rcgen::SanType::IpAddress(ip) => ip.to_string(),
                rcgen::SanType::DnsName(n) => n.to_string(),
                other => format!("{other:?}"),
            })
            .collect();
        for want in [
            "127.0.0.1",
            FIRST_SERVICE_IP,
            BRIDGE_IP,
            "kubernetes.default.svc",
            "node-a",
        ] {
            assert!(
                sans.iter().any(|s| s == want),
                "{want} missing from {sans:?}"
            );
        }
        let kc = layout.kubeconfigs.join("admin.kubeconfig");
        pki.write_kubeconfig("admin", "https://127.0.0.1:6443", &kc)
            .expect("kubeconfig");
        let text = fs::read_to_string(&kc).expect("read kubeconfig");
        assert!(
            text.contains("client-certificate-data: ")
                && text.contains("server: https://127.0.0.1:6443")
        );
        let _ = fs::remove_dir_all(&layout.cluster);
    }

    #[test]
    fn configs_carry_the_settings_this_machine_needs() {
        let layout = scratch_layout("config");
        let containerd = config::containerd(&layout);
        assert!(containerd.contains("restrict_oom_score_adj = true"));
        assert!(containerd.contains(&format!("sandbox_image = \"{PAUSE_IMAGE}\"")));
        let kubelet = config::kubelet(&layout);
        assert!(
            kubelet.contains("cgroupDriver: cgroupfs") && kubelet.contains("failCgroupV1: false")
        );
        let cni: serde_json::Value = serde_json::from_str(&config::cni(&layout)).expect("json");
        let bridge = &cni["plugins"][0];
        assert_eq!(bridge["bridge"], BRIDGE);
        assert_eq!(bridge["isDefaultGateway"], false);
        assert_eq!(bridge["ipMasq"], false);
        assert_eq!(bridge["ipam"]["routes"][0]["dst"], SERVICE_CIDR);
    }
}
