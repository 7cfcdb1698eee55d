//! `virt-handler` binary.
//!
//! - Cluster mode (`--node-name`, or `NODE_NAME`): watch the VMIs of this node, follow
//!   their launchers' sockets under `--run-root`, write VMI status, serve the mTLS API.
//! - Standalone mode (no node name): start or re-adopt launchers for the VMIs in a state
//!   directory and log their status.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use kubevirt_api::handler_protocol::HANDLER_PORT;
use tokio_util::sync::CancellationToken;
use virt_handler::cluster::ClusterConfig;
use virt_handler::cluster_migration::MigrationConfig;
use virt_handler::identity::{self, Identity};
use virt_handler::tls::{TlsFiles, TlsSource};
use virt_handler::vmis::Paths;
use virt_handler::{Handler, HandlerConfig, NodeOptions};

/// Per-node agent that drives virt-launchers.
#[derive(Parser, Debug)]
#[command(name = "virt-handler", version)]
struct Args {
    /// Cluster mode: the node this handler serves (downward API `spec.nodeName`).
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// Kubeconfig for the API server; in-cluster configuration when unset.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Launchers started beside this handler keep their sockets in
    /// `<DIR>/sockets/<vmi-uid>/` of this host. Unset (the DaemonSet): launcher pods are
    /// reached through `/proc/<pid>/root` of their compute container, found by the pod
    /// uid their VMI names.
    #[arg(long, env = "VIRT_HANDLER_RUN_ROOT")]
    run_root: Option<PathBuf>,
    /// This node's QEMU capabilities (probed by the DaemonSet's init container with
    /// `virt-launcher probe-capabilities`), copied into each launcher pod's own cache
    /// before it starts libvirt. Unset: every launcher probes QEMU itself.
    #[arg(long, env = "VIRT_HANDLER_QEMU_CAPABILITIES")]
    qemu_capabilities: Option<PathBuf>,
    /// Address of the mTLS server (console, vnc, pause, unpause, softreboot).
    #[arg(long, env = "VIRT_HANDLER_LISTEN", default_value_t = SocketAddr::from(([0, 0, 0, 0], HANDLER_PORT)))]
    listen: SocketAddr,
    /// Cluster mode: ask the cluster for this node's own certificate (a
    /// CertificateSigningRequest to `kubevirt.io/virt-handler`) and keep it and its key in
    /// this directory (memory-backed in the DaemonSet). Instead of --tls-cert/--tls-key.
    #[arg(long, env = "VIRT_HANDLER_CERTIFICATE_DIR", conflicts_with_all = ["tls_cert", "tls_key"])]
    certificate_dir: Option<PathBuf>,
    /// Certificate (PEM) naming this node (CN `virt-handler:<node>`, SAN the node name), for
    /// serving and for dialling other handlers.
    #[arg(long, env = "VIRT_HANDLER_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, env = "VIRT_HANDLER_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// CA bundle client certificates must chain to (PEM).
    #[arg(long, env = "VIRT_HANDLER_CLIENT_CA")]
    client_ca: Option<PathBuf>,
    /// This handler's address for other handlers (its pod IP, downward API
    /// `status.podIP`): migration targets listen there. No migrations without it.
    #[arg(long, env = "POD_IP")]
    pod_ip: Option<std::net::IpAddr>,
    /// Serve Prometheus /metrics (plain HTTP) here, e.g. 0.0.0.0:8187; off when unset.
    #[arg(long, env = "VIRT_HANDLER_METRICS_ADDR")]
    metrics_addr: Option<SocketAddr>,
    /// Seconds between websocket pings (a ping unanswered until the next closes the session).
    #[arg(long, env = "VIRT_HANDLER_WS_PING_SECONDS", default_value_t = 15)]
    ws_ping_seconds: u64,
    /// Standalone mode: directory holding one subdirectory per VMI.
    #[arg(
        long,
        env = "VIRT_HANDLER_STATE_DIR",
        default_value = "/var/run/kubevirt-rs/handler"
    )]
    state_dir: PathBuf,
    /// Standalone mode: virt-launcher binary.
    #[arg(long, env = "VIRT_HANDLER_LAUNCHER", default_value = "virt-launcher")]
    launcher: PathBuf,
    /// Standalone mode: passed to every launcher: IMAGE=DIR.
    #[arg(long = "image-dir", value_name = "IMAGE=DIR")]
    image_dirs: Vec<String>,
    /// Standalone mode: VMI JSON files to start (VMIs already running are re-adopted).
    #[arg(long = "vmi")]
    vmis: Vec<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    // Release builds unwind (Cargo.toml [profile.release]); a panic must still end the
    // process, so that kubelet restarts it rather than one task dying silently.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |p| {
        hook(p);
        std::process::abort()
    }));
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colours only on a terminal: `kubectl logs` shows escape codes as text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // The hotplug mount helper: one mount or unmount, in this fresh single-threaded
    // process (it enters mount namespaces), then exit.
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some(virt_handler::hotplug::HELPER_SUBCOMMAND) {
        let op: virt_handler::hotplug::HelperOp =
            serde_json::from_str(argv.get(2).map(String::as_str).unwrap_or_default())
                .context("the hotplug helper's argument")?;
        if let Err(e) = virt_handler::hotplug::helper_main(&op) {
            // One line: virt-handler reports the helper's last line in the volume's status.
            eprintln!("{e}");
            std::process::exit(1);
        }
        return Ok(());
    }
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        match args.node_name.clone() {
            Some(node) => cluster_main(node, args).await,
            None => standalone_main(args).await,
        }
    })
}

fn shutdown_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            return;
        };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM"),
            _ = int.recv() => tracing::info!("SIGINT"),
        }
        t.cancel();
    });
    token
}

async fn cluster_main(node_name: String, args: Args) -> anyhow::Result<()> {
    // kube and our server both use rustls; one process-wide provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let need = |p: &Option<PathBuf>, flag: &str| -> anyhow::Result<PathBuf> {
        p.clone()
            .with_context(|| format!("cluster mode needs {flag}"))
    };
    let client_ca = need(&args.client_ca, "--client-ca")?;
    // Flags first: a wrong command line fails before any connection is tried.
    let given = match &args.certificate_dir {
        Some(_) => None,
        None => Some((
            need(&args.tls_cert, "--tls-cert or --certificate-dir")?,
            need(&args.tls_key, "--tls-key")?,
        )),
    };
    let config = match &args.kubeconfig {
        Some(f) => {
            let kc = kube::config::Kubeconfig::read_from(f)
                .with_context(|| format!("--kubeconfig {}", f.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    let client = kube_client_metrics::client(config)?;
    let shutdown = shutdown_on_signal();
    let files = match &args.certificate_dir {
        Some(dir) => {
            let identity = Identity {
                node: node_name.clone(),
                dir: dir.clone(),
                ca: client_ca.clone(),
            };
            identity::prepare_dir(dir)
                .with_context(|| format!("--certificate-dir {}", dir.display()))?;
            // Nothing is served before this node has its own certificate.
            let due = loop {
                match identity.ensure(&client).await {
                    Ok(due) => break due,
                    Err(e) => {
                        tracing::warn!(error = %e, "no certificate for this handler yet; asking again in 10s");
                        tokio::select! {
                            _ = shutdown.cancelled() => return Ok(()),
                            _ = tokio::time::sleep(Duration::from_secs(10)) => {}
                        }
                    }
                }
            };
            let files = TlsFiles {
                cert: identity.cert(),
                key: identity.key(),
                client_ca,
            };
            tokio::spawn(identity.renew(client.clone(), due, shutdown.clone()));
            files
        }
        None => {
            let (cert, key) = given.context("--tls-cert or --certificate-dir")?;
            TlsFiles {
                cert,
                key,
                client_ca,
            }
        }
    };
    let tls = TlsSource::from_files(files.clone())?;
    let migration = match args.pod_ip {
        Some(address) => Some(MigrationConfig {
            address,
            tls: files,
        }),
        None => {
            tracing::warn!(
                "no --pod-ip (POD_IP): this node neither sends nor receives live migrations"
            );
            None
        }
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("--listen {}", args.listen))?;
    let metrics_listener = match args.metrics_addr {
        Some(a) => Some(
            tokio::net::TcpListener::bind(a)
                .await
                .with_context(|| format!("--metrics-addr {a}"))?,
        ),
        None => None,
    };
    let opts = NodeOptions {
        metrics_listener,
        client,
        cluster: ClusterConfig {
            node_name,
            paths: match args.run_root {
                Some(run_root) => Paths::Host { run_root },
                None => Paths::Pods {
                    proc: PathBuf::from("/proc"),
                },
            },
            capabilities: args.qemu_capabilities,
            migration,
        },
        listener,
        tls,
        ping_every: Duration::from_secs(args.ws_ping_seconds.max(1)),
    };
    virt_handler::run_node(opts, shutdown).await?;
    // Launchers keep running when the handler stops: the next one re-adopts them.
    Ok(())
}

async fn standalone_main(args: Args) -> anyhow::Result<()> {
    let mut launcher_args = Vec::new();
    for m in &args.image_dirs {
        launcher_args.push("--image-dir".to_string());
        launcher_args.push(m.clone());
    }
    let handler = Handler::new(HandlerConfig {
        state_dir: args.state_dir,
        launcher_bin: args.launcher,
        launcher_args,
    });
    let adopted = handler.adopt().await?;
    tracing::info!(?adopted, "re-adopted running launchers");
    for f in &args.vmis {
        let vmi = serde_json::from_slice(&std::fs::read(f)?)?;
        handler.start(&vmi).await?;
    }
    // Launchers keep running when the handler stops: a restart re-adopts them.
    shutdown_on_signal().cancelled().await;
    handler.detach();
    Ok(())
}
