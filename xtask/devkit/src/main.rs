//! xtask-devkit: the subcommands of `cargo xtask`, each in its own module. The launcher
//! (package `xtask`, `xtask/src/main.rs`) installs the Debian packages first, because building
//! this crate already needs some of them (protoc for etcd-client), then runs this binary with
//! the same arguments.

use clap::{Parser, Subcommand};

mod bench;
mod chaos;
mod cluster;
mod deploy;
mod dev_apiserver;
mod fuzz;
mod guest;
mod images;
mod soak;
mod test;
mod up;
mod user_bin;

#[derive(Parser, Debug)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "kubevirt-rs developer tooling"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Start etcd and virt-apiserver on loopback with a kubeconfig for kubectl.
    DevApiserver(dev_apiserver::Args),
    /// Build the tiny test guest (kernel, busybox initramfs, disk) into target/guest.
    Guest(guest::Args),
    /// Manage the local single-node Kubernetes cluster.
    Cluster(cluster::Args),
    /// Run a benchmark and write the figures to docs/benchmarks.md.
    Bench(bench::Args),
    /// Run every check and test (the README's test command; what CI runs).
    Test(test::Args),
    /// Install the Debian packages the project needs.
    Deps,
    /// Fuzz virt-apiserver's API with schemathesis (from its published OpenAPI); figures to
    /// docs/reliability.md.
    Fuzz(fuzz::Args),

    /// Build the container images (virt-apiserver, etcd) and import them into the local cluster.
    Images(images::Args),
    /// Deploy kubevirt-rs into the cluster of the current KUBECONFIG.
    Deploy(deploy::Args),
    /// Cluster up, images, deploy and a demo VM: everything to try kubevirt-rs locally.
    Up(up::Args),
    /// VM churn on the local cluster across etcd compactions; fails when an operation stalls.
    Soak(soak::Args),
    /// Kill each kubevirt-rs component and etcd under VM churn on the local cluster; all must
    /// converge with nothing lost.
    Chaos(chaos::Args),
    /// Write manifests/ from the operator's rendering code (what CI checks is current).
    GenManifests,
}

/// Errors are printed with their causes and without a backtrace: CI sets RUST_BACKTRACE, and
/// a CI log keeps only its tail, which a backtrace of xtask's own frames would fill.
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e}");
            for cause in e.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    close_inherited_fds_on_exec();
    match Cli::parse().command {
        Command::DevApiserver(a) => dev_apiserver::run(a),
        Command::Guest(a) => guest::run(a),
        Command::Cluster(a) => cluster::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Test(a) => test::run(a),
        Command::Deps => xtask::deps::ensure(xtask::Needs::All),
        Command::Fuzz(a) => fuzz::run(a),

        Command::Images(a) => images::run(a),
        Command::Deploy(a) => deploy::run(a),
        Command::Up(a) => up::run(a),
        Command::Soak(a) => soak::run(a),
        Command::Chaos(a) => chaos::run(a),
        Command::GenManifests => {
            for p in virt_operator::install::write_manifests(&workspace_root())? {
                println!("wrote {}", p.display());
            }
            Ok(())
        }
    }
}

/// Descriptors inherited from the caller (e.g. the cluster lock of `flock
/// /tmp/kvrs-cluster.lock cargo xtask …`) must not leak into the daemons `cluster up` starts:
/// they would hold that lock for as long as the cluster runs.
fn close_inherited_fds_on_exec() {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<i32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    for fd in fds {
        let _ = nix::fcntl::fcntl(
            fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        );
    }
}

/// The workspace's target directory (honours CARGO_TARGET_DIR).
pub fn target_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// The workspace root (this crate lives in xtask/devkit, two levels below it).
pub fn workspace_root() -> std::path::PathBuf {
    let manifest = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .nth(2)
        .map(std::path::Path::to_path_buf)
        .unwrap_or(manifest)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// The launcher answers `cargo xtask --help` and picks the packages to install from its own
    /// table, without building this crate: it must know every subcommand defined here (and
    /// `fresh-check`, which it runs itself so that it needs none of the project's packages).
    #[test]
    fn launcher_knows_every_subcommand() {
        let ours: std::collections::BTreeSet<String> = super::Cli::command()
            .get_subcommands()
            .map(|c| c.get_name().to_string())
            .collect();
        let launcher: std::collections::BTreeSet<String> = xtask::SUBCOMMANDS
            .iter()
            .filter(|s| s.name != "fresh-check")
            .map(|s| s.name.to_string())
            .collect();
        assert_eq!(ours, launcher);
    }

    #[test]
    fn workspace_root_holds_the_workspace_manifest() {
        let root = super::workspace_root();
        let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap_or_default();
        assert!(manifest.contains("[workspace]"), "{}", root.display());
    }
}
