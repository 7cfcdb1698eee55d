//! `virt-handler` binary (standalone mode): starts or re-adopts launchers for the VMIs
//! in a state directory and logs their status. Cluster mode (watching the API server,
//! console websockets) comes with the controller issue.

use std::path::PathBuf;

use clap::Parser;
use virt_handler::{Handler, HandlerConfig};

/// Per-node agent that drives virt-launchers.
#[derive(Parser, Debug)]
#[command(name = "virt-handler", version)]
struct Args {
    /// Directory holding one subdirectory per VMI.
    #[arg(
        long,
        env = "VIRT_HANDLER_STATE_DIR",
        default_value = "/var/run/kubevirt-rs/handler"
    )]
    state_dir: PathBuf,
    /// virt-launcher binary.
    #[arg(long, env = "VIRT_HANDLER_LAUNCHER", default_value = "virt-launcher")]
    launcher: PathBuf,
    /// Passed to every launcher: IMAGE=DIR.
    #[arg(long = "image-dir", value_name = "IMAGE=DIR")]
    image_dirs: Vec<String>,
    /// VMI JSON files to start (VMIs already running are re-adopted).
    #[arg(long = "vmi")]
    vmis: Vec<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    rt.block_on(async move {
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
        tokio::signal::ctrl_c().await?;
        handler.detach();
        anyhow::Ok(())
    })
}
