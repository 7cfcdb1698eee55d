//! The thin part of `cargo xtask`, shared by the launcher binary (`xtask/src/main.rs`) and
//! xtask-devkit: the Debian packages the project needs and the table of subcommands.
//!
//! This crate compiles with nothing but a Rust toolchain, so that on a fresh machine
//! `cargo xtask …` can install protoc, libvirt-dev and the rest before anything that needs
//! them is built.

pub mod deps;

/// What a subcommand needs installed before xtask-devkit is built and run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Needs {
    /// Only what building the workspace needs (protoc, libvirt-dev, pkg-config, a C toolchain).
    Build,
    /// Everything: the local cluster, libvirt/QEMU, etcd, buildah, the test guest's parts.
    All,
}

/// A subcommand of `cargo xtask`.
#[derive(Debug, Clone, Copy)]
pub struct Subcommand {
    pub name: &'static str,
    pub about: &'static str,
    pub needs: Needs,
}

/// Every subcommand, in the order `cargo xtask --help` lists them. xtask-devkit's test
/// `launcher_knows_every_subcommand` keeps this in step with its clap definition.
pub const SUBCOMMANDS: &[Subcommand] = &[
    Subcommand {
        name: "up",
        about: "Cluster up, images, deploy and a demo VM: everything to try kubevirt-rs locally",
        needs: Needs::All,
    },
    Subcommand {
        name: "test",
        about: "Run every check and test (the README's test command; what CI runs)",
        needs: Needs::All,
    },
    Subcommand {
        name: "deps",
        about: "Install the Debian packages the project needs",
        needs: Needs::All,
    },
    Subcommand {
        name: "cluster",
        about: "Manage the local Kubernetes cluster (up [--nodes 2], down, status, import)",
        needs: Needs::All,
    },
    Subcommand {
        name: "images",
        about: "Build the container images and import them into the local cluster",
        needs: Needs::All,
    },
    Subcommand {
        name: "deploy",
        about: "Deploy kubevirt-rs into the cluster of the current KUBECONFIG",
        needs: Needs::All,
    },
    Subcommand {
        name: "dev-apiserver",
        about: "Start etcd and virt-apiserver on loopback with a kubeconfig for kubectl",
        needs: Needs::All,
    },
    Subcommand {
        name: "fuzz",
        about: "Fuzz virt-apiserver's API with schemathesis (from its published OpenAPI); figures to docs/reliability.md",
        needs: Needs::All,
    },
    Subcommand {
        name: "guest",
        about: "Build the tiny test guest (kernel, busybox initramfs, disk) into target/guest",
        needs: Needs::All,
    },
    Subcommand {
        name: "bench",
        about: "Run a benchmark (`bench all`: every one) and write its figures to docs/benchmarks.md",
        needs: Needs::All,
    },
    Subcommand {
        name: "soak",
        about: "VM churn on the local cluster across etcd compactions; fails when an operation stalls",
        needs: Needs::All,
    },
    Subcommand {
        name: "chaos",
        about: "Kill each kubevirt-rs component and etcd under VM churn on the local cluster; all must converge with nothing lost",
        needs: Needs::All,
    },
    Subcommand {
        name: "gen-manifests",
        about: "Write manifests/ from the operator's rendering code (what CI checks is current)",
        needs: Needs::Build,
    },
    Subcommand {
        name: "fresh-check",
        about: "Prove the README on a clean Debian 12 root filesystem (debootstrap + chroot)",
        needs: Needs::Build,
    },
];

/// The subcommand called `name`, if there is one.
pub fn subcommand(name: &str) -> Option<&'static Subcommand> {
    SUBCOMMANDS.iter().find(|s| s.name == name)
}

/// The workspace root (this crate lives in `xtask/`, one level below it).
/// `cargo`, for a build run from inside a cargo-run process (this tool, a test). Cargo
/// gives such a process its package's variables (CARGO_PKG_NAME, CARGO_MANIFEST_DIR, …); a
/// build script that watches one (ring's does) would then see another value in every build
/// started from another program, and each rebuilds what the other just built.
pub fn cargo() -> std::process::Command {
    let mut cmd =
        std::process::Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    for (key, _) in std::env::vars_os() {
        if key.to_str().is_some_and(is_package_variable) {
            cmd.env_remove(&key);
        }
    }
    cmd
}

/// A variable cargo sets for the program it runs, not for cargo itself.
pub fn is_package_variable(key: &str) -> bool {
    key.starts_with("CARGO_PKG_")
        || key.starts_with("CARGO_BIN_EXE_")
        || matches!(
            key,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_MANIFEST_LINKS"
                | "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
                | "CARGO_TARGET_TMPDIR"
                | "CARGO_RUSTC_CURRENT_DIR"
                | "OUT_DIR"
        )
}

pub fn workspace_root() -> std::path::PathBuf {
    let manifest = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or(manifest)
}

/// The workspace's target directory (honours CARGO_TARGET_DIR, relative to the workspace).
pub fn target_dir() -> std::path::PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(t) => workspace_root().join(t),
        None => workspace_root().join("target"),
    }
}
