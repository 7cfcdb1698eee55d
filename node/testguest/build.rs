//! Compiles the guest's own programs (guest/udp_echo.rs, guest/disk_bench.rs) with the
//! same rustc: plain host binaries, linked against the glibc the guest already carries for
//! dropbear.

use std::path::PathBuf;
use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let Some(out) = std::env::var_os("OUT_DIR").map(PathBuf::from) else {
        eprintln!("OUT_DIR is not set: run through cargo");
        return ExitCode::FAILURE;
    };
    for (src, name) in [
        ("guest/udp_echo.rs", "udp-echo"),
        ("guest/disk_bench.rs", "disk-bench"),
    ] {
        println!("cargo::rerun-if-changed={src}");
        if let Err(e) = compile(src, &out.join(name)) {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

fn compile(src: &str, out: &std::path::Path) -> Result<(), String> {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let status = Command::new(rustc)
        .args([
            "--edition",
            "2021",
            "-O",
            "-C",
            "strip=symbols",
            "-C",
            "panic=abort",
        ])
        .arg(src)
        .arg("-o")
        .arg(out)
        .status();
    match status {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => Err(format!("rustc failed on {src}: {s}")),
        Err(e) => Err(format!("running rustc for {src}: {e}")),
    }
}
