//! `cargo xtask guest`.

/// Arguments.
#[derive(clap::Args, Debug)]
pub struct Args {}

/// Runs the command.
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("not implemented yet")
}
