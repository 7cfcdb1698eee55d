//! `virt-tail`: the launcher pod's `guest-console-log` container (virt_launcher::console_log).
//! A binary of its own so that it maps no libvirt.

use std::path::PathBuf;

use clap::Parser;

/// Copies the guest's serial console log to stdout until the launcher ends.
#[derive(Parser)]
#[command(name = "virt-tail", version)]
struct Args {
    /// The launcher's lifeline FIFO: the tail ends when it hangs up.
    #[arg(long, env = kubevirt_api::LAUNCHER_LIFELINE_ENV)]
    lifeline: PathBuf,
    /// The file QEMU logs the serial console to.
    file: PathBuf,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    virt_launcher::console_log::tail(
        &args.file,
        &args.lifeline,
        &mut std::io::stdout().lock(),
        virt_launcher::console_log::TRUNCATE_AT,
    )?;
    Ok(())
}
