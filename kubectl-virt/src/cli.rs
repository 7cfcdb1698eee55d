//! Command line, as `kubectl virt …`.

use clap::{Parser, Subcommand};

use crate::connect::GlobalArgs;
use crate::create::VolumeArg;
use crate::ops::ObjectKind;

#[derive(Debug, Parser)]
#[command(
    name = "kubectl virt",
    bin_name = "kubectl virt",
    version,
    about = "Manage kubevirt-rs virtual machines: lifecycle, console, VNC and manifests",
    long_about = None,
    propagate_version = true,
    after_help = "Installed as `kubectl-virt` on PATH, this runs as `kubectl virt`."
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start a virtual machine.
    Start {
        /// Name of the VM.
        name: String,
        /// Start the VM paused.
        #[arg(long)]
        paused: bool,
        /// Ask the server to validate the request without changing anything.
        #[arg(long)]
        dry_run: bool,
    },
    /// Stop a virtual machine.
    Stop {
        /// Name of the VM.
        name: String,
        /// Seconds the guest gets to shut down (only with --force).
        #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
        grace_period: Option<i64>,
        /// Stop immediately with the given --grace-period, overriding the VM's.
        #[arg(long)]
        force: bool,
        /// Ask the server to validate the request without changing anything.
        #[arg(long)]
        dry_run: bool,
    },
    /// Restart a virtual machine.
    Restart {
        /// Name of the VM.
        name: String,
        /// Only 0 is supported, together with --force.
        #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
        grace_period: Option<i64>,
        /// Restart immediately, without a graceful guest shutdown.
        #[arg(long)]
        force: bool,
        /// Ask the server to validate the request without changing anything.
        #[arg(long)]
        dry_run: bool,
    },
    /// Pause a VM's or VMI's guest.
    Pause {
        /// `vm` or `vmi`.
        kind: ObjectKind,
        name: String,
        /// Ask the server to validate the request without changing anything.
        #[arg(long)]
        dry_run: bool,
    },
    /// Resume a paused VM or VMI.
    Unpause {
        /// `vm` or `vmi`.
        kind: ObjectKind,
        name: String,
        /// Ask the server to validate the request without changing anything.
        #[arg(long)]
        dry_run: bool,
    },
    /// Ask the guest to reboot (ACPI or guest agent).
    SoftReboot {
        /// Name of the VMI.
        name: String,
    },
    /// Live-migrate a VM's instance to another node.
    Migrate {
        /// Name of the VM.
        name: String,
        /// Extra node selector for the target, key=value[,key=value].
        #[arg(
            long = "added-node-selector",
            visible_alias = "addedNodeSelector",
            value_name = "K=V,…"
        )]
        added_node_selector: Vec<String>,
        /// Ask the server to validate the request without changing anything.
        #[arg(long)]
        dry_run: bool,
        /// Follow the migration: progress (phase, percent of memory transferred, rate)
        /// until it ends; exit 1 when it fails.
        #[arg(long)]
        wait: bool,
    },
    /// Cancel the running migration of a VM.
    MigrateCancel {
        /// Name of the VM.
        name: String,
        /// Ask the server to validate the request without changing anything.
        #[arg(long)]
        dry_run: bool,
    },
    /// Connect to the serial console of a VMI (leave with Ctrl+]).
    Console {
        /// Name of the VMI.
        name: String,
        /// Minutes to wait for the VMI to be running.
        #[arg(long, default_value_t = 5, value_name = "MINUTES")]
        timeout: u64,
    },
    /// Open a VNC connection to a VMI.
    Vnc {
        /// Name of the VMI.
        name: String,
        /// Only listen locally and print {"port":N}; do not start a viewer.
        #[arg(long)]
        proxy_only: bool,
        /// Local port on 127.0.0.1 (0: pick a free one).
        #[arg(long, default_value_t = 0)]
        port: u16,
    },
    /// Print a manifest for a new object.
    #[command(subcommand)]
    Create(CreateCommand),
    /// Print client and server versions.
    Version {
        /// Client version only; do not contact the server.
        #[arg(long)]
        client: bool,
    },
    /// Print a shell completion script (for the `kubectl-virt` binary).
    Completion { shell: clap_complete::Shell },
}

#[derive(Debug, Subcommand)]
pub enum CreateCommand {
    /// Print a VirtualMachine manifest (apply it with `kubectl apply -f -`).
    Vm(CreateVmArgs),
}

#[derive(Debug, clap::Args)]
pub struct CreateVmArgs {
    /// Name of the VM (default: vm-<random>).
    #[arg(long)]
    pub name: Option<String>,
    /// Guest memory, e.g. 1Gi (default 512Mi).
    #[arg(long, value_name = "QUANTITY")]
    pub memory: Option<String>,
    /// Always, RerunOnFailure, Manual, Halted or Once.
    #[arg(long, default_value = "Always", value_parser = parse_run_strategy)]
    pub run_strategy: kubevirt_api::RunStrategy,
    /// Seconds the guest gets to shut down (default 180).
    #[arg(long, value_name = "SECONDS", allow_negative_numbers = true)]
    pub termination_grace_period: Option<i64>,
    /// A containerDisk volume: src:IMAGE[,name:NAME][,bootorder:N]. Repeatable.
    #[arg(
        long = "volume-containerdisk",
        value_name = "src:IMAGE[,name:NAME][,bootorder:N]"
    )]
    pub volume_containerdisk: Vec<VolumeArg>,
    /// A PersistentVolumeClaim volume: src:CLAIM[,name:NAME][,bootorder:N]. Repeatable.
    #[arg(
        long = "volume-pvc",
        value_name = "src:CLAIM[,name:NAME][,bootorder:N]"
    )]
    pub volume_pvc: Vec<VolumeArg>,
    /// Base64-encoded cloud-init user data (NoCloud).
    #[arg(long, value_name = "BASE64")]
    pub cloud_init_user_data: Option<String>,
    /// Base64-encoded cloud-init network data (NoCloud).
    #[arg(long, value_name = "BASE64")]
    pub cloud_init_network_data: Option<String>,
    /// Guest user created by a generated cloud-config.
    #[arg(long)]
    pub user: Option<String>,
    /// File holding the guest user's password (generated cloud-config).
    #[arg(long, value_name = "PATH")]
    pub password_file: Option<std::path::PathBuf>,
    /// SSH public key authorised for the guest user. Repeatable.
    #[arg(long, value_name = "KEY")]
    pub ssh_key: Vec<String>,
}

fn parse_run_strategy(s: &str) -> Result<kubevirt_api::RunStrategy, String> {
    use kubevirt_api::RunStrategy as R;
    [R::Always, R::RerunOnFailure, R::Manual, R::Halted, R::Once]
        .into_iter()
        .find(|r| r.as_str().eq_ignore_ascii_case(s))
        .ok_or_else(|| format!("{s:?} is not one of Always, RerunOnFailure, Manual, Halted, Once"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Cli {
        let mut v = vec!["kubectl-virt"];
        v.extend_from_slice(args);
        Cli::try_parse_from(v).unwrap()
    }

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn help_reads_kubectl_virt() {
        let help = Cli::command().render_help().to_string();
        assert!(help.contains("Usage: kubectl virt"), "{help}");
    }

    #[test]
    fn global_flags_anywhere() {
        let c = parse(&[
            "start",
            "vm1",
            "-n",
            "prod",
            "--context",
            "c",
            "--kubeconfig",
            "/k",
        ]);
        assert_eq!(c.global.namespace.as_deref(), Some("prod"));
        assert_eq!(c.global.context.as_deref(), Some("c"));
        assert!(
            matches!(c.command, Command::Start { ref name, paused: false, dry_run: false } if name == "vm1")
        );
        let c = parse(&[
            "--namespace",
            "x",
            "stop",
            "vm1",
            "--force",
            "--grace-period",
            "0",
        ]);
        assert_eq!(c.global.namespace.as_deref(), Some("x"));
        assert!(matches!(
            c.command,
            Command::Stop {
                grace_period: Some(0),
                force: true,
                ..
            }
        ));
        let c = parse(&["console", "vm1", "--as", "jane", "--as-group", "devs"]);
        assert_eq!(c.global.as_user.as_deref(), Some("jane"));
        assert_eq!(c.global.as_group, ["devs"]);
    }

    #[test]
    fn pause_kinds() {
        let c = parse(&["pause", "vmi", "a", "--dry-run"]);
        assert!(matches!(
            c.command,
            Command::Pause {
                kind: ObjectKind::Vmi,
                dry_run: true,
                ..
            }
        ));
        let c = parse(&["unpause", "vm", "a"]);
        assert!(matches!(
            c.command,
            Command::Unpause {
                kind: ObjectKind::Vm,
                ..
            }
        ));
        assert!(Cli::try_parse_from(["kubectl-virt", "pause", "pod", "a"]).is_err());
    }

    #[test]
    fn create_vm_flags() {
        let c = parse(&[
            "create",
            "vm",
            "--name",
            "a",
            "--memory",
            "1Gi",
            "--run-strategy",
            "manual",
            "--volume-containerdisk",
            "src:img:1,name:root",
        ]);
        let Command::Create(CreateCommand::Vm(a)) = c.command else {
            panic!("not create vm");
        };
        assert_eq!(a.run_strategy, kubevirt_api::RunStrategy::Manual);
        assert_eq!(a.volume_containerdisk[0].source, "img:1");
        assert_eq!(a.volume_containerdisk[0].name.as_deref(), Some("root"));
        assert!(
            Cli::try_parse_from([
                "kubectl-virt",
                "create",
                "vm",
                "--run-strategy",
                "Sometimes"
            ])
            .is_err()
        );
    }

    #[test]
    fn console_and_vnc_defaults() {
        let c = parse(&["console", "a"]);
        assert!(matches!(c.command, Command::Console { timeout: 5, .. }));
        let c = parse(&["vnc", "a", "--proxy-only", "--port", "5901"]);
        assert!(matches!(
            c.command,
            Command::Vnc {
                proxy_only: true,
                port: 5901,
                ..
            }
        ));
    }
}
