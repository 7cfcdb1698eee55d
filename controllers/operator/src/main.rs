//! virt-operator binary.

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "virt-operator",
    about = "Installs, upgrades and uninstalls kubevirt-rs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the cluster-independent manifests (default images) to stdout.
    Render,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Render => {
            print!("{}", virt_operator::render::committed_manifest()?);
            Ok(())
        }
    }
}
