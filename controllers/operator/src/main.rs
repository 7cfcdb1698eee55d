//! virt-operator: `run` reconciles KubeVirt resources; `gen-manifests` writes manifests/.

use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use kube::runtime::events::{Recorder, Reporter};
use tokio_util::sync::CancellationToken;
use virt_controllers::leader::{Elector, LeaseConfig};
use virt_operator::install;
use virt_operator::metrics::Metrics;
use virt_operator::reconcile::{self, Ctx};
use virt_operator::signer;
use virt_operator::status::Defaults;

#[derive(Parser, Debug)]
#[command(
    name = "virt-operator",
    version,
    about = "Installs, upgrades and uninstalls kubevirt-rs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Reconcile KubeVirt resources (in a cluster: the operator Deployment).
    Run(RunArgs),
    /// Write manifests/ (operator install, example KubeVirt, reference of what it deploys).
    GenManifests {
        /// Workspace root to write manifests/ under.
        #[arg(long, default_value = ".")]
        root: std::path::PathBuf,
    },
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// Kubeconfig; in-cluster configuration when absent.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<std::path::PathBuf>,
    /// Registry of the component images unless the KubeVirt resource names one.
    #[arg(long, env = "VIRT_OPERATOR_IMAGE_REGISTRY", default_value = install::DEFAULT_REGISTRY)]
    image_registry: String,
    /// Tag of the component images unless the KubeVirt resource names one.
    #[arg(long, env = "VIRT_OPERATOR_IMAGE_TAG", default_value = install::DEFAULT_TAG)]
    image_tag: String,
    /// Version reported for the default tag.
    #[arg(long, env = "VIRT_OPERATOR_VERSION", default_value = env!("CARGO_PKG_VERSION"))]
    kubevirt_version: String,
    /// Size of etcd's PVC where a default StorageClass exists.
    #[arg(long, env = "VIRT_OPERATOR_ETCD_VOLUME_SIZE", default_value = "1Gi")]
    etcd_volume_size: String,
    /// Without a default StorageClass: the directory (on the node etcd is pinned to) under
    /// which etcd keeps each installation's data.
    #[arg(
        long,
        env = "VIRT_OPERATOR_ETCD_HOST_DIR",
        default_value = "/var/lib/kubevirt-rs"
    )]
    etcd_host_dir: String,
    /// Only one replica acts, chosen with a coordination.k8s.io Lease.
    #[arg(long, env = "VIRT_OPERATOR_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// Namespace of the leader Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "kubevirt")]
    lease_namespace: String,
    /// This replica's identity; the pod name in a cluster.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Serve /metrics and /healthz here; empty disables.
    #[arg(
        long,
        env = "VIRT_OPERATOR_METRICS_ADDR",
        default_value = "0.0.0.0:8080"
    )]
    metrics_addr: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Release builds unwind (Cargo.toml [profile.release]); a panic must still end the
    // process, so that kubelet restarts it rather than one task dying silently.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |p| {
        hook(p);
        std::process::abort()
    }));
    match Cli::parse().command {
        Command::GenManifests { root } => {
            for p in install::write_manifests(&root).context("writing manifests")? {
                println!("wrote {}", p.display());
            }
            Ok(())
        }
        Command::Run(args) => run(args).await,
    }
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colours only on a terminal: `kubectl logs` shows escape codes as text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = virt_controllers::client::client(args.kubeconfig.as_deref()).await?;
    let identity = args
        .identity
        .clone()
        .unwrap_or_else(|| format!("virt-operator-{}", std::process::id()));
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "virt-operator".into(),
            instance: Some(identity.clone()),
        },
    );
    let metrics = Arc::new(Metrics::default());
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        recorder: Some(recorder),
        defaults: Defaults {
            registry: args.image_registry.clone(),
            tag: args.image_tag.clone(),
            version: args.kubevirt_version.clone(),
        },
        metrics: metrics.clone(),
        etcd_volume_size: args.etcd_volume_size.clone(),
        etcd_host_dir: args.etcd_host_dir.clone(),
    });
    let shutdown = CancellationToken::new();
    if !args.metrics_addr.is_empty() {
        let listener = tokio::net::TcpListener::bind(&args.metrics_addr)
            .await
            .with_context(|| format!("binding {}", args.metrics_addr))?;
        let watches = metrics.watches.clone();
        let app = axum::Router::new()
            .route(
                "/metrics",
                axum::routing::get(move || {
                    let m = metrics.clone();
                    async move { m.encode() }
                }),
            )
            .route(
                "/readyz",
                axum::routing::get(move || {
                    let w = watches.clone();
                    async move { virt_watch::readyz(&w) }
                }),
            )
            .route("/healthz", axum::routing::get(|| async { "ok" }));
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async move { stop.cancelled().await })
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "metrics server failed");
            }
        });
    }
    virt_controllers::signal::cancel_on_termination(shutdown.clone());
    // KubeVirt's ready_status: 1 while this replica takes part in the election;
    // leading_status: 1 while it leads.
    let metrics_ctx = ctx.clone();
    metrics_ctx.metrics.ready.set(1);
    let lead = |ctx: Arc<Ctx>, stop: CancellationToken| async move {
        ctx.metrics.leading.set(1);
        tokio::join!(
            reconcile::run(ctx.clone(), stop.clone()),
            signer::run(ctx.clone(), stop)
        );
        ctx.metrics.leading.set(0);
    };
    let result = if args.leader_elect {
        Elector::new(
            client,
            LeaseConfig::new(&args.lease_namespace, "virt-operator", &identity),
        )
        .run(shutdown, move |leading| lead(ctx.clone(), leading))
        .await
    } else {
        lead(ctx, shutdown).await;
        Ok(())
    };
    metrics_ctx.metrics.ready.set(0);
    metrics_ctx.metrics.leading.set(0);
    result?;
    Ok(())
}
