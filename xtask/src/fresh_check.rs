//! `cargo xtask fresh-check` (being written).
use std::ffi::OsString;
use std::process::ExitCode;

pub fn run(_args: &[OsString]) -> anyhow::Result<ExitCode> {
    anyhow::bail!("fresh-check is not implemented yet")
}
