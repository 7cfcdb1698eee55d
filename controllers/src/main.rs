//! virt-controller: runs the VirtualMachine, VirtualMachineInstance,
//! VirtualMachineInstanceMigration and DataVolume controllers, all behind one leader
//! election.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use tokio_util::sync::CancellationToken;
use virt_controllers::events::Recorder;
use virt_controllers::leader::{Elector, LeaseConfig};
use virt_controllers::migration::MigrationConfig;
use virt_controllers::vm::decide::BackoffConfig;
use virt_controllers::vmi::render::LauncherConfig;
use virt_controllers::{Config, Context};

/// Command line, each flag also readable from the environment.
#[derive(Debug, Parser)]
#[command(name = "virt-controller", version, about)]
struct Args {
    /// Kubeconfig to use; in-cluster configuration when absent.
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<std::path::PathBuf>,
    /// Only one replica acts, chosen with a coordination.k8s.io Lease.
    #[arg(long, env = "VIRT_CONTROLLER_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// Namespace of the leader Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "kubevirt")]
    lease_namespace: String,
    /// Name of the leader Lease.
    #[arg(
        long,
        env = "VIRT_CONTROLLER_LEASE_NAME",
        default_value = "virt-controller"
    )]
    lease_name: String,
    /// This replica's identity; the pod name in a cluster.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Publish Kubernetes Events (needs the core API of kube-apiserver).
    #[arg(long, env = "VIRT_CONTROLLER_EVENTS", default_value_t = true, action = clap::ArgAction::Set)]
    events: bool,
    /// Concurrent reconciles of each controller (VM, VMI).
    #[arg(long, env = "VIRT_CONTROLLER_WORKERS", default_value_t = virt_controllers::context::DEFAULT_WORKERS)]
    workers: u16,
    /// Restart delay after the first failed start (grows with failures²).
    #[arg(
        long,
        env = "VIRT_CONTROLLER_CRASHLOOP_BASE_SECONDS",
        default_value_t = 10
    )]
    crashloop_base_seconds: u64,
    /// Longest restart delay of a crash-looping VM.
    #[arg(
        long,
        env = "VIRT_CONTROLLER_CRASHLOOP_MAX_SECONDS",
        default_value_t = 300
    )]
    crashloop_max_seconds: u64,
    /// Watch only this namespace (all namespaces when absent).
    #[arg(long, env = "VIRT_CONTROLLER_WATCH_NAMESPACE")]
    watch_namespace: Option<String>,
    /// Serve /metrics and /healthz here; empty disables.
    #[arg(
        long,
        env = "VIRT_CONTROLLER_METRICS_ADDR",
        default_value = "0.0.0.0:8080"
    )]
    metrics_addr: String,
    /// Image of the virt-launcher pods (also the source of their static busybox).
    #[arg(
        long,
        env = "VIRT_CONTROLLER_LAUNCHER_IMAGE",
        default_value = "localhost/kubevirt-rs/virt-launcher:latest"
    )]
    launcher_image: String,
    /// Pull policy of the launcher image.
    #[arg(
        long,
        env = "VIRT_CONTROLLER_LAUNCHER_PULL_POLICY",
        default_value = "IfNotPresent",
        value_parser = ["Always", "IfNotPresent", "Never"]
    )]
    launcher_pull_policy: String,
    /// Allow software emulation (TCG): launcher pods do not request
    /// devices.kubevirt.io/kvm and the launcher may fall back when KVM does not work.
    #[arg(long, env = "VIRT_CONTROLLER_ALLOW_EMULATION", default_value_t = false, action = clap::ArgAction::Set)]
    allow_emulation: bool,
    /// Launcher pods log the guest's serial console (a `guest-console-log` container)
    /// unless the VMI sets `domain.devices.logSerialConsole: false`; with `false`, only
    /// VMIs that set it to true (virt-operator passes `false` when the KubeVirt resource
    /// has `configuration.virtualMachineOptions.disableSerialConsoleLog`).
    #[arg(long, env = "VIRT_CONTROLLER_SERIAL_CONSOLE_LOG", default_value_t = true, action = clap::ArgAction::Set)]
    serial_console_log: bool,
    /// evictionStrategy of VMIs that set none (virt-operator passes the KubeVirt resource's
    /// `configuration.evictionStrategy`): None, LiveMigrate, LiveMigrateIfPossible, External.
    #[arg(long, env = "VIRT_CONTROLLER_EVICTION_STRATEGY", default_value = "None", value_parser = parse_eviction_strategy)]
    eviction_strategy: kubevirt_api::eviction::EvictionStrategy,
    /// workloadUpdateMethods of the KubeVirt resource: LiveMigrate, Evict (none: VMIs stay on
    /// the launcher they started with after an upgrade).
    #[arg(long, value_delimiter = ',', value_parser = ["LiveMigrate", "Evict"])]
    workload_update_methods: Vec<String>,
    /// VMIs evicted per batch by the workload updater (batchEvictionSize).
    #[arg(long, default_value_t = 10)]
    workload_update_batch_size: usize,
    /// Seconds between eviction batches (batchEvictionInterval).
    #[arg(long, default_value_t = 60)]
    workload_update_batch_interval_seconds: u64,
    /// Migrations past Pending in the whole cluster (KubeVirt's parallelMigrationsPerCluster).
    #[arg(
        long,
        env = "VIRT_CONTROLLER_MIGRATIONS_PER_CLUSTER",
        default_value_t = 5
    )]
    parallel_migrations_per_cluster: usize,
    /// Migrations leaving one node at once (KubeVirt's parallelOutboundMigrationsPerNode).
    #[arg(
        long,
        env = "VIRT_CONTROLLER_OUTBOUND_MIGRATIONS_PER_NODE",
        default_value_t = 2
    )]
    parallel_outbound_migrations_per_node: usize,
    /// Abort a migration whose progress does not move for this long.
    #[arg(
        long,
        env = "VIRT_CONTROLLER_MIGRATION_PROGRESS_TIMEOUT_SECONDS",
        default_value_t = 150
    )]
    migration_progress_timeout_seconds: u64,
    /// Abort a migration that runs longer than this per GiB of guest memory.
    #[arg(
        long,
        env = "VIRT_CONTROLLER_MIGRATION_COMPLETION_TIMEOUT_PER_GIB_SECONDS",
        default_value_t = 150
    )]
    migration_completion_timeout_per_gib_seconds: u64,
    /// How VMs keep their instance type and preference (virt-operator passes the KubeVirt
    /// resource's `configuration.instancetype.referencePolicy`): reference, expand, expandAll.
    #[arg(long, env = "VIRT_CONTROLLER_INSTANCETYPE_REFERENCE_POLICY", default_value = "reference", value_parser = parse_reference_policy)]
    instancetype_reference_policy: kubevirt_api::instancetype::vm::ReferencePolicy,
    /// What of a running VM's changed template reaches it live (virt-operator passes the
    /// KubeVirt resource's `configuration.vmRolloutStrategy`): Stage (at the next restart,
    /// the VM saying RestartRequired) or LiveUpdate (node selector, affinity, tolerations
    /// and CPU sockets live).
    #[arg(long, env = "VIRT_CONTROLLER_VM_ROLLOUT_STRATEGY", default_value = "Stage", value_parser = parse_rollout_strategy)]
    vm_rollout_strategy: kubevirt_api::kubevirt::VmRolloutStrategy,
    /// `liveUpdateConfiguration.maxHotplugRatio`: maxSockets of a VM that sets none is its
    /// sockets times this.
    #[arg(long, env = "VIRT_CONTROLLER_MAX_HOTPLUG_RATIO", default_value_t = virt_controllers::vm::live::DEFAULT_MAX_HOTPLUG_RATIO, value_parser = clap::value_parser!(u32).range(1..))]
    max_hotplug_ratio: u32,
    /// `liveUpdateConfiguration.maxCpuSockets`: maxSockets of every VM that sets none.
    #[arg(long, env = "VIRT_CONTROLLER_MAX_CPU_SOCKETS")]
    max_cpu_sockets: Option<u32>,
    /// `liveUpdateConfiguration.maxGuest` (kept for memory hotplug).
    #[arg(long, env = "VIRT_CONTROLLER_MAX_GUEST")]
    max_guest: Option<String>,
    /// Run the DataVolume controller (claims and importer pods for DataVolumes). virt-operator
    /// passes `false` where a real CDI is installed (its CRD datavolumes.cdi.kubevirt.io
    /// exists): CDI fills its DataVolumes, and the VM and VMI controllers use them as they
    /// use virt-apiserver's.
    #[arg(long, env = "VIRT_CONTROLLER_DATAVOLUMES", default_value_t = true, action = clap::ArgAction::Set)]
    datavolumes: bool,
    /// Log as JSON.
    #[arg(long, env = "VIRT_CONTROLLER_LOG_JSON")]
    log_json: bool,
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
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    if args.log_json {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init();
    } else {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            // Colours only on a terminal: `kubectl logs` shows escape codes as text.
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
            .init();
    }
    // kube and reqwest agree on ring; installing it up front avoids a panic on the
    // first handshake if another provider is ever linked in.
    let _ = rustls::crypto::ring::default_provider().install_default();

    let client = virt_controllers::client::client(args.kubeconfig.as_deref()).await?;
    let identity = match args.identity.clone() {
        Some(id) => id,
        None => format!("virt-controller-{}", std::process::id()),
    };
    let recorder = args
        .events
        .then(|| Recorder::new(client.clone(), "virt-controller", &identity));
    let config = Config {
        workers: args.workers,
        crash_loop: BackoffConfig {
            min_interval: Duration::from_secs(args.crashloop_base_seconds),
            max_delay: Duration::from_secs(args.crashloop_max_seconds),
        },
        namespace: args.watch_namespace.clone(),
        launcher: LauncherConfig {
            image: args.launcher_image.clone(),
            image_pull_policy: Some(args.launcher_pull_policy.clone()),
            allow_emulation: args.allow_emulation,
            serial_console_log: args.serial_console_log,
            ..LauncherConfig::default()
        },
        eviction_strategy: args.eviction_strategy,
        workload_update: virt_controllers::workload::WorkloadUpdateConfig {
            live_migrate: args
                .workload_update_methods
                .iter()
                .any(|m| m == "LiveMigrate"),
            evict: args.workload_update_methods.iter().any(|m| m == "Evict"),
            batch_size: args.workload_update_batch_size,
            batch_interval: Duration::from_secs(args.workload_update_batch_interval_seconds),
        },
        reference_policy: args.instancetype_reference_policy,
        live_update: virt_controllers::vm::live::LiveUpdateConfig {
            strategy: args.vm_rollout_strategy,
            max_hotplug_ratio: args.max_hotplug_ratio,
            max_cpu_sockets: args.max_cpu_sockets,
            max_guest: args
                .max_guest
                .clone()
                .map(k8s_openapi::apimachinery::pkg::api::resource::Quantity),
        },
        ..Config::default()
    };
    let ctx = Arc::new(Context::new(client.clone(), recorder, config));
    let migrations = MigrationConfig {
        parallel_migrations_per_cluster: args.parallel_migrations_per_cluster,
        parallel_outbound_migrations_per_node: args.parallel_outbound_migrations_per_node,
        progress_timeout: Duration::from_secs(args.migration_progress_timeout_seconds),
        completion_timeout_per_gib: Duration::from_secs(
            args.migration_completion_timeout_per_gib_seconds,
        ),
        ..MigrationConfig::default()
    };

    let shutdown = CancellationToken::new();
    if !args.metrics_addr.is_empty() {
        let listener = tokio::net::TcpListener::bind(&args.metrics_addr)
            .await
            .with_context(|| format!("binding {}", args.metrics_addr))?;
        let metrics_ctx = ctx.clone();
        let watches = ctx.metrics.watches.clone();
        let app = axum::Router::new()
            .route(
                "/metrics",
                axum::routing::get(move || {
                    let ctx = metrics_ctx.clone();
                    // The Prometheus text format (as KubeVirt's virt-controller serves):
                    // KubeVirt's timestamp counters are named without `_total`, which only
                    // that format allows (OpenMetrics would rename their series).
                    async move {
                        (
                            [(
                                axum::http::header::CONTENT_TYPE,
                                "text/plain; version=0.0.4; charset=utf-8",
                            )],
                            ctx.metrics.encode(),
                        )
                    }
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

    // KubeVirt's ready_status: 1 while this replica can take the lead, i.e. while it
    // takes part in the election (or, without election, runs).
    let metrics_ctx = ctx.clone();
    metrics_ctx.metrics.ready.set(1);
    let datavolumes = args.datavolumes;
    let result = if args.leader_elect {
        let elector = Elector::new(
            client,
            LeaseConfig::new(&args.lease_namespace, &args.lease_name, &identity),
        );
        elector
            .run(shutdown, move |leading| {
                run_controllers(ctx, migrations, datavolumes, leading)
            })
            .await
    } else {
        run_controllers(ctx, migrations, datavolumes, shutdown).await;
        Ok(())
    };
    metrics_ctx.metrics.ready.set(0);
    result?;
    Ok(())
}

/// The controllers and the workload updater, until `stop` is cancelled; the DataVolume
/// controller only with `datavolumes` (the VM controller reads DataVolumes either way).
async fn run_controllers(
    ctx: Arc<Context>,
    migrations: MigrationConfig,
    datavolumes: bool,
    stop: CancellationToken,
) {
    let parallel = migrations.parallel_migrations_per_cluster;
    // One watch and one store of the VMIs for every controller that reads them.
    let vmis = virt_controllers::vmi::shared(&ctx, stop.clone());
    // KubeVirt's inventory metrics come from the leader's caches only: registered here
    // (and by each controller for its own cache), cleared when leadership ends.
    ctx.metrics
        .sources
        .set_vmis(vmis.reader(), vmis.ready(), ctx.config.eviction_strategy);
    // Only kubevirt_vm_disk_allocated_size_bytes reads every claim (the DataVolume
    // controller watches its own claims only), as KubeVirt's PVC informer feeds it.
    let claims =
        virt_controllers::watch::Shared::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::spawn(
            ctx.watched(),
            "claims",
            &ctx.metrics.watches,
            stop.clone(),
        );
    ctx.metrics
        .sources
        .set_claims(claims.reader(), claims.ready());
    ctx.metrics
        .sources
        .set_launcher(ctx.config.launcher.clone());
    let leading = {
        let (ctx, vmis, stop) = (ctx.clone(), vmis.clone(), stop.clone());
        // KubeVirt's leading_status: 1 once the leader's caches are filled. When the
        // lead ends, the inventory goes at once, not after the controllers have drained.
        async move {
            if vmis.wait_ready(&stop).await {
                ctx.metrics.leading.set(1);
            }
            stop.cancelled().await;
            ctx.metrics.leading.set(0);
            ctx.metrics.sources.clear();
        }
    };
    // One watch and one store of the DataVolumes for the VM and DataVolume controllers.
    let dvs = virt_controllers::datavolume::shared(&ctx, stop.clone());
    let metrics_ctx = ctx.clone();
    let datavolume_controller = {
        let (ctx, dvs, stop) = (ctx.clone(), dvs.clone(), stop.clone());
        async move {
            if datavolumes {
                virt_controllers::datavolume::run(ctx, dvs, stop).await;
            } else {
                tracing::info!(
                    "DataVolume controller off (--datavolumes=false): CDI fills DataVolumes"
                );
            }
        }
    };
    tokio::join!(
        leading,
        virt_controllers::vm::run(ctx.clone(), vmis.clone(), dvs, stop.clone()),
        datavolume_controller,
        virt_controllers::vmi::run(ctx.clone(), vmis.clone(), stop.clone()),
        virt_controllers::replicaset::run(ctx.clone(), vmis.clone(), stop.clone()),
        virt_controllers::pool::run(ctx.clone(), vmis.clone(), stop.clone()),
        virt_controllers::evacuation::run(ctx.clone(), vmis.clone(), stop.clone()),
        virt_controllers::workload::run(ctx.clone(), vmis, parallel, stop.clone()),
        virt_controllers::migration::run(ctx, migrations, stop),
    );
    // Again after every controller stopped: one that started late may have registered
    // its cache after the stop.
    metrics_ctx.metrics.leading.set(0);
    metrics_ctx.metrics.sources.clear();
}

fn parse_eviction_strategy(s: &str) -> Result<kubevirt_api::eviction::EvictionStrategy, String> {
    kubevirt_api::eviction::EvictionStrategy::parse(s)
        .ok_or_else(|| "expected None, LiveMigrate, LiveMigrateIfPossible or External".to_string())
}

fn parse_reference_policy(
    s: &str,
) -> Result<kubevirt_api::instancetype::vm::ReferencePolicy, String> {
    kubevirt_api::instancetype::vm::ReferencePolicy::parse(s)
        .ok_or_else(|| "expected reference, expand or expandAll".to_string())
}

fn parse_rollout_strategy(s: &str) -> Result<kubevirt_api::kubevirt::VmRolloutStrategy, String> {
    kubevirt_api::kubevirt::VmRolloutStrategy::parse(s)
        .ok_or_else(|| "expected Stage or LiveUpdate".to_string())
}
