//! `cargo xtask guest`: builds the tiny test guest into target/guest (see `virt-testguest`).

use std::path::PathBuf;
use std::time::Duration;

/// Arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Output directory (default: target/guest).
    #[arg(long)]
    out: Option<PathBuf>,
    /// After building, boot it with bare QEMU (TCG) and print the time to the banner.
    #[arg(long)]
    measure: bool,
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    let dir = args.out.unwrap_or_else(virt_testguest::default_dir);
    let g = virt_testguest::build(&dir)?;
    println!(
        "guest built in {}: vmlinuz, initramfs.gz, disk.qcow2",
        g.dir.display()
    );
    if args.measure {
        let t = virt_testguest::bare_qemu_boot_time(&g, Duration::from_secs(60))?;
        println!(
            "bare qemu-system-x86_64 -accel tcg: banner after {:.2} s",
            t.as_secs_f64()
        );
    }
    Ok(())
}
