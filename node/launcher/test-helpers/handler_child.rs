//! A virt-handler as a separate process for the launcher crate's integration tests
//! (`tests/cluster.rs`, `tests/handler.rs`), so that a test can SIGKILL a real handler
//! process and start another. Not shipped: built only with the `test-helpers` feature,
//! which the crate's own dev-dependency on itself turns on for its tests.
//!
//! - `test-handler-child node`: a cluster-mode handler (what `virt-handler --node-name …`
//!   runs), configured by `HANDLER_NODE_ROOT`, `HANDLER_KUBECONFIG`, `HANDLER_TLS_CERT`,
//!   `HANDLER_TLS_KEY`, `HANDLER_CLIENT_CA`, `HANDLER_LISTEN`, `HANDLER_PING`,
//!   `HANDLER_METRICS` and `HANDLER_NODE_NAME`.
//! - `test-handler-child standalone`: a standalone handler on `HANDLER_CHILD_STATE` that
//!   re-adopts what runs there and starts the VMI in `HANDLER_CHILD_VMI` if set; the
//!   launcher binary and its arguments come from `HANDLER_LAUNCHER` and
//!   `HANDLER_LAUNCHER_ARGS` (one argument per line).

use std::time::Duration;

use anyhow::{Context, bail};

fn env(k: &str) -> anyhow::Result<String> {
    std::env::var(k).with_context(|| format!("{k} not set"))
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let mode = std::env::args().nth(1).unwrap_or_default();
    let rt = tokio::runtime::Runtime::new()?;
    match mode.as_str() {
        "node" => rt.block_on(node()),
        "standalone" => rt.block_on(standalone()),
        other => bail!("usage: test-handler-child node|standalone (got {other:?})"),
    }
}

async fn node() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let kc = kube::config::Kubeconfig::read_from(env("HANDLER_KUBECONFIG")?)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    let tls = virt_handler::tls::TlsSource::from_files(virt_handler::tls::TlsFiles {
        cert: env("HANDLER_TLS_CERT")?.into(),
        key: env("HANDLER_TLS_KEY")?.into(),
        client_ca: env("HANDLER_CLIENT_CA")?.into(),
    })?;
    let listener = tokio::net::TcpListener::bind(env("HANDLER_LISTEN")?).await?;
    let opts = virt_handler::NodeOptions {
        client: kube::Client::try_from(cfg)?,
        cluster: virt_handler::cluster::ClusterConfig {
            node_name: env("HANDLER_NODE_NAME")?,
            paths: virt_handler::vmis::Paths::Host {
                run_root: env("HANDLER_NODE_ROOT")?.into(),
            },
            capabilities: None,
            migration: None,
        },
        listener,
        tls,
        ping_every: Duration::from_secs(env("HANDLER_PING")?.parse()?),
        metrics_listener: Some(tokio::net::TcpListener::bind(env("HANDLER_METRICS")?).await?),
    };
    virt_handler::run_node(opts, Default::default()).await?;
    Ok(())
}

async fn standalone() -> anyhow::Result<()> {
    let h = virt_handler::Handler::new(virt_handler::HandlerConfig {
        state_dir: env("HANDLER_CHILD_STATE")?.into(),
        launcher_bin: env("HANDLER_LAUNCHER")?.into(),
        launcher_args: env("HANDLER_LAUNCHER_ARGS")?
            .lines()
            .map(String::from)
            .collect(),
    });
    h.adopt().await?;
    if let Ok(file) = std::env::var("HANDLER_CHILD_VMI") {
        let vmi: kubevirt_api::VirtualMachineInstance =
            serde_json::from_slice(&std::fs::read(file)?)?;
        h.start(&vmi).await?;
    }
    // Runs until the test kills it: the point is a handler process to SIGKILL.
    std::future::pending::<()>().await;
    Ok(())
}
