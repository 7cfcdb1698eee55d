//! `cargo xtask …`: the launcher. It compiles with only a Rust toolchain, installs the Debian
//! packages a subcommand needs (protoc, libvirt-dev, … — which building the real tooling
//! needs), then replaces itself with `cargo run -p xtask-devkit -- <the same arguments>`, where
//! every subcommand lives. `fresh-check` runs here because it must not depend on the host
//! having the project's packages.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::ExitCode;

use xtask::{Needs, SUBCOMMANDS, deps, subcommand};

mod fresh_check;

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("Error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: Vec<OsString>) -> anyhow::Result<ExitCode> {
    let first = args.first().and_then(|a| a.to_str());
    if first.is_none() && !args.is_empty() {
        // Not UTF-8: let clap in the devkit say what is wrong with it.
        deps::ensure(Needs::Build)?;
        return Err(exec_devkit(&args));
    }
    match first {
        None | Some("-h" | "--help") => {
            print_help();
            Ok(if first.is_some() {
                ExitCode::SUCCESS
            } else {
                // Like clap without a subcommand: usage, then failure.
                ExitCode::from(2)
            })
        }
        Some("help") if args.len() == 1 => {
            print_help();
            Ok(ExitCode::SUCCESS)
        }
        Some("deps") => {
            deps::ensure(Needs::All)?;
            println!("all Debian packages kubevirt-rs needs are installed");
            Ok(ExitCode::SUCCESS)
        }
        Some("fresh-check") => fresh_check::run(&args[1..]),
        Some(name) => {
            // Unknown names and `help <cmd>` go to the devkit too: its clap answers them.
            let needs = subcommand(name).map_or(Needs::Build, |s| s.needs);
            deps::ensure(needs)?;
            Err(exec_devkit(&args))
        }
    }
}

/// Replaces this process with `cargo run -p xtask-devkit -- ARGS`: same PID, stdin and
/// terminal (`dev-apiserver` and the console commands are interactive), and its exit code is
/// the devkit's (cargo run execs the program in turn). Returns only when exec failed.
fn exec_devkit(args: &[OsString]) -> anyhow::Error {
    let root = xtask::workspace_root();
    let mut cmd = xtask::cargo();
    cmd.arg("run");
    let built = xtask::target_dir().join("debug/xtask-devkit").exists();
    if built {
        // As before the split: a rebuild after an edit says nothing, only the tool speaks.
        cmd.arg("--quiet");
    } else {
        // The first build takes minutes: show cargo's progress rather than a silent wait.
        eprintln!(
            "==> building xtask-devkit, the workspace's tooling (first time: about 4 min on 2 cores)"
        );
    }
    cmd.args(["--package", "xtask-devkit", "--manifest-path"])
        .arg(root.join("Cargo.toml"))
        .arg("--")
        .args(args);
    let err = cmd.exec();
    anyhow::anyhow!(
        "running {} run -p xtask-devkit: {err}",
        cmd.get_program().to_string_lossy()
    )
}

fn print_help() {
    println!("kubevirt-rs developer tooling\n\nUsage: cargo xtask <COMMAND>\n\nCommands:");
    let width = SUBCOMMANDS.iter().map(|s| s.name.len()).max().unwrap_or(0);
    for s in SUBCOMMANDS {
        println!("  {:width$}  {}", s.name, s.about);
    }
    println!(
        "\n`cargo xtask <COMMAND> --help` shows a command's options. Every command except \
         fresh-check first installs\nthe Debian packages it needs (as root, with apt-get; \
         `cargo xtask deps` installs all of them), then\nruns xtask-devkit (xtask/devkit), \
         which it builds on first use."
    );
}
