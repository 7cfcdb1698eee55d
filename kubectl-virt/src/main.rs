use std::process::ExitCode;

use clap::Parser;
use kubectl_virt::cli::Cli;

fn main() -> ExitCode {
    // kubectl's convention (and the plugin's contract) is exit 1 for every
    // error, usage errors included; clap would use 2.
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    kubectl_virt::console::install_panic_hook();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!(
                "error: {:#}",
                anyhow::Error::new(e).context("starting the runtime")
            );
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(kubectl_virt::run(cli));
    // A console's stdin reader may still be blocked in read(); do not wait
    // for it.
    rt.shutdown_background();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
