//! Compiles the guest's UDP echo service (guest/udp_echo.rs) with the same rustc: a plain
//! host binary, linked against the glibc the guest already carries for dropbear.

use std::path::PathBuf;
use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let src = "guest/udp_echo.rs";
    println!("cargo::rerun-if-changed={src}");
    let Some(out) = std::env::var_os("OUT_DIR").map(PathBuf::from) else {
        eprintln!("OUT_DIR is not set: run through cargo");
        return ExitCode::FAILURE;
    };
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
        .arg(out.join("udp-echo"))
        .status();
    match status {
        Ok(s) if s.success() => ExitCode::SUCCESS,
        Ok(s) => {
            eprintln!("rustc failed on {src}: {s}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("running rustc for {src}: {e}");
            ExitCode::FAILURE
        }
    }
}
