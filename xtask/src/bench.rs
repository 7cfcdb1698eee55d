//! `cargo xtask bench …`: benchmarks that print a summary and record their figures in
//! their own section of docs/benchmarks.md.

use std::path::PathBuf;

use anyhow::Context;

mod apiserver;
mod report;

/// Arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Which benchmark to run.
    #[command(subcommand)]
    pub bench: Bench,
}

/// The benchmarks. Each owns one section of docs/benchmarks.md.
#[derive(clap::Subcommand, Debug)]
pub enum Bench {
    /// virt-apiserver on etcd: create throughput, LIST, watch fan-out latency, memory.
    Apiserver(apiserver::ApiserverArgs),
}

/// Runs the command.
pub fn run(args: Args) -> anyhow::Result<()> {
    match args.bench {
        Bench::Apiserver(a) => apiserver::run(a),
    }
}

/// docs/benchmarks.md of the workspace.
fn docs_path() -> PathBuf {
    crate::workspace_root().join("docs").join("benchmarks.md")
}

/// Replaces (or appends) the section under `heading` in docs/benchmarks.md.
fn write_section(heading: &str, section: &str) -> anyhow::Result<PathBuf> {
    let path = docs_path();
    // Read right before writing: other benchmarks may have updated their sections
    // while this one ran, and those must survive.
    let doc = match std::fs::read_to_string(&path) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let out = report::replace_section(&doc, heading, section);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = path.with_extension("md.tmp");
    std::fs::write(&tmp, out).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("replacing {}", path.display()))?;
    Ok(path)
}
