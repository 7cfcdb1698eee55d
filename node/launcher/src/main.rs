//! `virt-launcher` binary.

mod cli;

use clap::Parser;
use tokio_util::sync::CancellationToken;
use virt_launcher::Outcome;

fn main() -> anyhow::Result<()> {
    let argv: Vec<String> = std::env::args().collect();
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
    if argv.get(1).map(String::as_str) == Some(virt_launcher::launcher::PROBE_CAPABILITIES_ARG) {
        let Some(dir) = argv.get(2) else {
            anyhow::bail!(
                "usage: virt-launcher {} DIR",
                virt_launcher::launcher::PROBE_CAPABILITIES_ARG
            );
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        rt.block_on(virt_launcher::launcher::probe_capabilities(
            std::path::Path::new(dir),
        ))?;
        return Ok(());
    }
    // Before anything can fail: the pod's sidecars (image copiers, console-log tail) end
    // with this process, however it ends (virt_launcher::lifeline).
    let lifeline = virt_launcher::lifeline::hold_from_env()?;
    let cfg = cli::Args::parse().into_config()?;
    // The first line of the compute container's log: where `bench start` sees the process.
    tracing::info!(version = env!("CARGO_PKG_VERSION"), "virt-launcher started");
    // The launcher is mostly waiting; a small runtime keeps its memory low.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let code = rt.block_on(async_main(cfg))?;
    // `exit` runs no destructors.
    drop(lifeline);
    std::process::exit(code)
}

async fn async_main(cfg: virt_launcher::Config) -> anyhow::Result<i32> {
    let shutdown = CancellationToken::new();
    let signals = shutdown.clone();
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
        signals.cancel();
    });
    let stop_server = CancellationToken::new();
    let cmd_socket = cfg.cmd_socket.clone();
    let cmd_socket_file = cfg.cmd_socket.clone();
    let cmd_dir = cfg
        .cmd_socket
        .as_ref()
        .and_then(|p| p.parent())
        .map(std::path::Path::to_path_buf);
    let (server_shutdown, server_stop) = (shutdown.clone(), stop_server.clone());
    let outcome = virt_launcher::run(cfg, shutdown, move |running| {
        tracing::info!(status = ?running.status(), "running");
        if let Some(path) = cmd_socket {
            tokio::spawn(async move {
                if let Err(e) =
                    virt_launcher::cmd_server::serve(path, running, server_shutdown, server_stop)
                        .await
                {
                    tracing::error!(error = %e, "command socket failed");
                }
            });
        }
    })
    .await;
    // Next to the command socket, in the directory virt-handler watches, and before the
    // socket goes: a handler that missed the final event still reports the VM's real end
    // (cluster-flow.md §1).
    if let Some(dir) = cmd_dir {
        use virt_domain::protocol::{LauncherOutcome, OUTCOME_FILE};
        let record = match &outcome {
            Ok(Outcome::ShutDown | Outcome::ForcedStop) => LauncherOutcome::ShutDown,
            Ok(Outcome::Migrated) => LauncherOutcome::Migrated,
            Ok(Outcome::Crashed(reason)) => LauncherOutcome::Crashed {
                reason: reason.clone(),
            },
            Err(e) => LauncherOutcome::Failed {
                message: e.to_string(),
            },
        };
        let file = dir.join(OUTCOME_FILE);
        if let Err(e) = serde_json::to_vec(&record)
            .map_err(std::io::Error::other)
            .and_then(|b| std::fs::write(&file, b))
        {
            tracing::warn!(file = %file.display(), error = %e, "writing the outcome file");
        }
    }
    stop_server.cancel();
    // The server task may not get to run its cleanup before the process exits.
    if let Some(p) = cmd_socket_file {
        let _ = std::fs::remove_file(p);
    }
    match outcome {
        Ok(Outcome::ShutDown) => {
            tracing::info!("guest shut down");
            Ok(0)
        }
        Ok(Outcome::Migrated) => {
            tracing::info!("guest migrated away");
            Ok(0)
        }
        Ok(Outcome::ForcedStop) => {
            tracing::warn!("guest did not shut down within its grace period; destroyed");
            Ok(0)
        }
        Ok(Outcome::Crashed(reason)) => {
            tracing::error!(%reason, "guest crashed");
            Ok(2)
        }
        Err(e) => {
            tracing::error!(error = %e, "launcher failed");
            eprintln!("virt-launcher: {e}");
            Ok(1)
        }
    }
}
