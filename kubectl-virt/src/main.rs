use std::process::ExitCode;

use clap::Parser;
use kubectl_virt::cli::Cli;
use kubectl_virt::complete::{COMPLETE_ARG, COMPLETE_BIN};

/// The words to complete when run for kubectl's plugin completion: as
/// `kubectl_complete-virt ARGS…` (what kubectl runs) or as
/// `kubectl-virt __complete ARGS…` (cobra's convention).
fn completion_words() -> Option<Vec<String>> {
    let mut args = std::env::args();
    let argv0 = args.next().unwrap_or_default();
    let as_completer = std::path::Path::new(&argv0)
        .file_name()
        .is_some_and(|n| n == COMPLETE_BIN);
    let rest: Vec<String> = args.collect();
    match rest.split_first() {
        Some((first, tail)) if first == COMPLETE_ARG => Some(tail.to_vec()),
        _ if as_completer => Some(rest),
        _ => None,
    }
}

fn complete(words: Vec<String>) -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(_) => return ExitCode::SUCCESS,
    };
    let out = rt.block_on(kubectl_virt::complete::run(&words));
    print!("{out}");
    ExitCode::SUCCESS
}

fn main() -> ExitCode {
    if let Some(words) = completion_words() {
        return complete(words);
    }
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
