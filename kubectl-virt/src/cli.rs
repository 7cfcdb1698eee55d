//! Command line, as `kubectl virt …`.

use clap::builder::EnumValueParser;
use clap::error::ErrorKind;
use clap::{Arg, ArgAction, ArgMatches, Parser, Subcommand};
use kubevirt_api::catalogue::{
    self, ActionCommand, FlagValue, FlagValues, VmActionDef, VmCommand, VmiActionDef,
};

use crate::connect::GlobalArgs;
use crate::create::VolumeArg;
use crate::ops::{EvacuateKind, ObjectKind};

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
    /// start, stop, restart, …: one command per VM action of the API catalogue that
    /// creates no migration.
    #[command(flatten)]
    VmAction(VmCommands<false>),
    /// pause, unpause, soft-reboot, reset, …: one command per VMI action of the API
    /// catalogue that upstream virtctl has.
    #[command(flatten)]
    VmiAction(VmiActionCommand),
    /// migrate, …: the VM actions of the catalogue that create a migration, listed with the
    /// other migration commands.
    #[command(flatten)]
    VmMigration(VmCommands<true>),
    /// Cancel the running migration of a VM.
    MigrateCancel {
        /// Name of the VM.
        name: String,
        /// Ask the server to validate the request without changing anything.
        #[arg(long)]
        dry_run: bool,
    },
    /// Cancel the evacuation (node drain, eviction) of a VM, a VMI, or every VMI leaving a
    /// node: their evacuation migrations stop and they stay where they run. A drain still
    /// running evicts again; stop it (or uncordon the node) first.
    EvacuateCancel {
        /// `vm`, `vmi` or `node`.
        kind: EvacuateKind,
        /// Name of the VM, VMI or node.
        name: String,
        /// Ask the server to validate the request without changing anything.
        #[arg(long)]
        dry_run: bool,
    },
    /// Add a volume to a running VM: hotplugged into its VMI, or with --persist into the
    /// VM's spec as well.
    #[command(
        name = "addvolume",
        after_help = "Examples:\n  kubectl virt addvolume fedora-dv --volume-name=example-dv\n  kubectl virt addvolume fedora-dv --volume-name=example-pvc --persist --bus=virtio"
    )]
    AddVolume(crate::volume::AddVolumeArgs),
    /// Remove a hotplugged volume from a running VM: from its VMI, or with --persist from
    /// the VM's spec as well.
    #[command(
        name = "removevolume",
        after_help = "Example:\n  kubectl virt removevolume fedora-dv --volume-name=example-dv"
    )]
    RemoveVolume(crate::volume::RemoveVolumeArgs),
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
    /// Forward local ports to ports of a VM's guest, through the API server (no route to
    /// the pod network needed).
    #[command(
        after_help = "Examples:\n  kubectl virt port-forward vm/web 8080:80\n  kubectl virt port-forward vm/dns udp/5353:53\n  ssh -o ProxyCommand='kubectl virt port-forward --stdio vm/web 22' root@web"
    )]
    PortForward {
        /// vm/NAME, vmi/NAME, or NAME (a VMI).
        target: String,
        /// [tcp/|udp/][LOCAL:]REMOTE ports (tcp by default); LOCAL 0 picks a free port.
        ports: Vec<String>,
        /// Local address to listen on.
        #[arg(long, default_value = "127.0.0.1")]
        address: std::net::IpAddr,
        /// Carry stdin/stdout to the one REMOTE port (for ssh's ProxyCommand).
        #[arg(long)]
        stdio: bool,
    },
    /// Open an SSH session to a VM with the local ssh, carried by port-forward (no route
    /// to the pod network needed).
    #[command(
        after_help = "Examples:\n  kubectl virt ssh -i ~/.ssh/id_ed25519 root@vm/web\n  kubectl virt ssh fedora@vmi/web.prod -c 'uname -a'"
    )]
    Ssh {
        /// [USER@](vm|vmi)/NAME[.NAMESPACE]
        destination: String,
        /// Run this command instead of a login shell; its exit code is ours.
        #[arg(short = 'c', long)]
        command: Option<String>,
        #[command(flatten)]
        ssh: SshArgs,
    },
    /// Copy files between this machine and a VM with the local scp, carried by
    /// port-forward.
    #[command(
        after_help = "Examples:\n  kubectl virt scp ./file root@vm/web:/tmp/\n  kubectl virt scp -r root@vm/web:/etc ./etc"
    )]
    Scp {
        /// Local path, or [USER@](vm|vmi)/NAME[.NAMESPACE]:PATH
        source: String,
        /// Local path, or [USER@](vm|vmi)/NAME[.NAMESPACE]:PATH
        destination: String,
        /// Copy directories recursively.
        #[arg(short = 'r', long)]
        recursive: bool,
        #[command(flatten)]
        ssh: SshArgs,
    },
    /// Create a Service in front of a VM or VMI (it follows the VM across restarts and
    /// migrations).
    #[command(
        after_help = "Examples:\n  kubectl virt expose vm web --name web-http --port 8080 --target-port 80 --type NodePort"
    )]
    Expose {
        /// `vm` or `vmi`.
        kind: ObjectKind,
        /// Name of the VM or VMI.
        name: String,
        /// Name of the Service.
        #[arg(long = "name")]
        service_name: String,
        /// Port of the Service.
        #[arg(long)]
        port: u16,
        /// Port (or port name) of the guest; the Service's port when unset.
        #[arg(long)]
        target_port: Option<String>,
        /// ClusterIP, NodePort or LoadBalancer.
        #[arg(long = "type", default_value = "ClusterIP")]
        type_: String,
        /// TCP or UDP.
        #[arg(long, default_value = "TCP")]
        protocol: String,
    },
    /// Print a manifest for a new object.
    #[command(subcommand)]
    Create(CreateCommand),
    /// Cluster administration: back up and restore every VM, VMI and migration.
    #[command(subcommand)]
    Adm(AdmCommand),
    /// Print client and server versions.
    Version {
        /// Client version only; do not contact the server.
        #[arg(long)]
        client: bool,
    },
    /// Print a shell completion script (for the `kubectl-virt` binary).
    Completion { shell: clap_complete::Shell },
}

/// A VMI action's command, built from its catalogue entry (`catalogue::VMI_ACTIONS`):
/// `pause vm|vmi NAME [--dry-run]` when the action takes a VM (its instance) or a VMI,
/// `soft-reboot NAME` when it takes a VMI's name. A catalogued action with a command gets
/// its subcommand, help, completion and confirmation here without an edit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmiActionCommand {
    pub def: &'static VmiActionDef,
    /// What NAME names (`vmi` for the commands that take a VMI's name only).
    pub kind: ObjectKind,
    pub name: String,
    pub dry_run: bool,
}

const DRY_RUN_HELP: &str = "Ask the server to validate the request without changing anything";

/// The entries of `defs` that have a command, with it, in the catalogue's order.
fn with_commands<D, C>(
    defs: &'static [&'static D],
    command: fn(&D) -> Option<C>,
) -> impl Iterator<Item = (&'static D, C)> {
    defs.iter().filter_map(move |d| command(d).map(|c| (*d, c)))
}

/// The catalogued VMI actions that have a command, in the catalogue's order.
pub fn action_commands() -> impl Iterator<Item = (&'static VmiActionDef, ActionCommand)> {
    with_commands(&catalogue::VMI_ACTIONS, |d| d.command)
}

/// The command whose name is `name`.
pub fn action_command(name: &str) -> Option<(&'static VmiActionDef, ActionCommand)> {
    action_commands().find(|(_, c)| c.name == name)
}

fn action_subcommand(c: ActionCommand) -> clap::Command {
    let mut cmd = clap::Command::new(c.name).about(c.about).long_about(None);
    if c.vm_or_vmi {
        cmd = cmd
            .arg(
                Arg::new("kind")
                    .value_name("KIND")
                    .required(true)
                    .help("`vm` or `vmi`")
                    .value_parser(EnumValueParser::<ObjectKind>::new()),
            )
            .arg(Arg::new("name").value_name("NAME").required(true));
    } else {
        cmd = cmd.arg(
            Arg::new("name")
                .value_name("NAME")
                .required(true)
                .help("Name of the VMI"),
        );
    }
    if c.dry_run {
        cmd = cmd.arg(dry_run_flag());
    }
    cmd
}

/// `--dry-run`, as every action command offers it.
fn dry_run_flag() -> Arg {
    Arg::new("dry_run")
        .long("dry-run")
        .action(ArgAction::SetTrue)
        .help(DRY_RUN_HELP)
}

impl clap::FromArgMatches for VmiActionCommand {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let missing = |what: &str| clap::Error::raw(ErrorKind::MissingRequiredArgument, what);
        let (sub, m) = m
            .subcommand()
            .ok_or_else(|| clap::Error::new(ErrorKind::MissingSubcommand))?;
        let (def, c) = action_command(sub).ok_or_else(|| {
            clap::Error::raw(ErrorKind::InvalidSubcommand, format!("no action {sub:?}"))
        })?;
        let kind = if c.vm_or_vmi {
            *m.get_one::<ObjectKind>("kind")
                .ok_or_else(|| missing("KIND"))?
        } else {
            ObjectKind::Vmi
        };
        Ok(Self {
            def,
            kind,
            name: m
                .get_one::<String>("name")
                .cloned()
                .ok_or_else(|| missing("NAME"))?,
            dry_run: c.dry_run && m.get_flag("dry_run"),
        })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl clap::Subcommand for VmiActionCommand {
    fn augment_subcommands(cmd: clap::Command) -> clap::Command {
        action_commands().fold(cmd, |cmd, (_, c)| cmd.subcommand(action_subcommand(c)))
    }

    fn augment_subcommands_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_subcommands(cmd)
    }

    fn has_subcommand(name: &str) -> bool {
        action_command(name).is_some()
    }
}

/// A VM action's command, built from its catalogue entry (`catalogue::VM_ACTIONS`):
/// `stop NAME [--grace-period SECONDS] [--force] [--dry-run]`, with `--wait` when the action
/// creates a migration. A catalogued action with a command gets its subcommand, flags, help
/// and completion here without an edit.
#[derive(Clone, Debug)]
pub struct VmActionCommand {
    pub def: &'static VmActionDef,
    /// Its entry's command.
    pub command: VmCommand,
    /// The VM's name.
    pub name: String,
    /// The values of the command's flags, for [`VmCommand::build`].
    pub flags: FlagValues,
    pub dry_run: bool,
    /// Follow the migration it creates.
    pub wait: bool,
}

/// The commands of the VM actions whose [`VmCommand::migrates`] is `MIGRATES`: the root
/// command lists those that create no migration first and the others with migrate-cancel.
#[derive(Clone, Debug)]
pub struct VmCommands<const MIGRATES: bool>(pub VmActionCommand);

/// The catalogued VM actions that have a command, in the catalogue's order.
pub fn vm_commands() -> impl Iterator<Item = (&'static VmActionDef, VmCommand)> {
    with_commands(&catalogue::VM_ACTIONS, |d| d.command)
}

/// The VM action command whose name is `name`.
pub fn vm_command(name: &str) -> Option<(&'static VmActionDef, VmCommand)> {
    vm_commands().find(|(_, c)| c.name == name)
}

const WAIT_HELP: &str = "Follow the migration: progress (phase, percent of memory transferred, \
                         rate) until it ends; exit 1 when it fails";

fn vm_subcommand(c: VmCommand) -> clap::Command {
    let mut cmd = clap::Command::new(c.name)
        .about(c.about)
        .long_about(None)
        .arg(
            Arg::new("name")
                .value_name("NAME")
                .required(true)
                .help("Name of the VM"),
        );
    for f in c.flags {
        let arg = Arg::new(f.long).long(f.long).help(f.help);
        let arg = match f.value {
            FlagValue::Switch => arg.action(ArgAction::SetTrue),
            FlagValue::Integer { value_name } => arg
                .value_name(value_name)
                .allow_negative_numbers(true)
                .value_parser(clap::value_parser!(i64))
                .action(ArgAction::Set),
            FlagValue::List { value_name } => arg.value_name(value_name).action(ArgAction::Append),
        };
        cmd = cmd.arg(match f.alias {
            Some(a) => arg.visible_alias(a),
            None => arg,
        });
    }
    cmd = cmd.arg(dry_run_flag());
    if c.migrates {
        cmd = cmd.arg(
            Arg::new("wait")
                .long("wait")
                .action(ArgAction::SetTrue)
                .help(WAIT_HELP),
        );
    }
    cmd
}

impl<const MIGRATES: bool> VmCommands<MIGRATES> {
    fn commands() -> impl Iterator<Item = (&'static VmActionDef, VmCommand)> {
        vm_commands().filter(|(_, c)| c.migrates == MIGRATES)
    }
}

impl<const MIGRATES: bool> clap::FromArgMatches for VmCommands<MIGRATES> {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let (sub, m) = m
            .subcommand()
            .ok_or_else(|| clap::Error::new(ErrorKind::MissingSubcommand))?;
        let (def, command) = Self::commands()
            .find(|(_, c)| c.name == sub)
            .ok_or_else(|| {
                clap::Error::raw(ErrorKind::InvalidSubcommand, format!("no action {sub:?}"))
            })?;
        let mut flags = FlagValues::default();
        for f in command.flags {
            match f.value {
                FlagValue::Switch => {
                    if m.get_flag(f.long) {
                        flags.switches.push(f.long);
                    }
                }
                FlagValue::Integer { .. } => {
                    if let Some(v) = m.get_one::<i64>(f.long) {
                        flags.integers.push((f.long, *v));
                    }
                }
                FlagValue::List { .. } => {
                    let v: Vec<String> = m
                        .get_many::<String>(f.long)
                        .into_iter()
                        .flatten()
                        .cloned()
                        .collect();
                    flags.lists.push((f.long, v));
                }
            }
        }
        Ok(Self(VmActionCommand {
            def,
            command,
            name: m
                .get_one::<String>("name")
                .cloned()
                .ok_or_else(|| clap::Error::raw(ErrorKind::MissingRequiredArgument, "NAME"))?,
            flags,
            dry_run: m.get_flag("dry_run"),
            wait: command.migrates && m.get_flag("wait"),
        }))
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}

impl<const MIGRATES: bool> clap::Subcommand for VmCommands<MIGRATES> {
    fn augment_subcommands(cmd: clap::Command) -> clap::Command {
        Self::commands().fold(cmd, |cmd, (_, c)| cmd.subcommand(vm_subcommand(c)))
    }

    fn augment_subcommands_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_subcommands(cmd)
    }

    fn has_subcommand(name: &str) -> bool {
        Self::commands().any(|(_, c)| c.name == name)
    }
}

/// Options of `ssh` and `scp`, as upstream virtctl names them.
#[derive(Debug, clap::Args)]
pub struct SshArgs {
    /// User to log in as (also USER@ in the destination).
    #[arg(short = 'l', long)]
    pub username: Option<String>,
    /// Private key file.
    #[arg(short = 'i', long, value_name = "FILE")]
    pub identity_file: Option<std::path::PathBuf>,
    /// The guest's SSH port.
    #[arg(short = 'p', long, default_value_t = 22)]
    pub port: u16,
    /// Known-hosts file (default: ssh's own).
    #[arg(long, value_name = "FILE")]
    pub known_hosts: Option<std::path::PathBuf>,
    /// Extra options for the local ssh/scp, e.g. --local-ssh-opts="-o StrictHostKeyChecking=no".
    #[arg(short = 't', long = "local-ssh-opts", allow_hyphen_values = true)]
    pub local_ssh_opts: Vec<String>,
}

impl SshArgs {
    pub fn options(&self) -> crate::ssh::SshOptions {
        crate::ssh::SshOptions {
            username: self.username.clone(),
            identity_file: self.identity_file.clone(),
            port: self.port,
            known_hosts: self.known_hosts.clone(),
            local_ssh_opts: self.local_ssh_opts.clone(),
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum AdmCommand {
    /// Write every stored VirtualMachine, VirtualMachineInstance and migration, read at one
    /// revision, to FILE (written whole or not at all).
    Backup {
        /// The file to write.
        #[arg(long, value_name = "FILE")]
        to: std::path::PathBuf,
    },
    /// Set the stored objects back to a backup: objects created since are deleted, deleted
    /// ones come back with their uid, changed ones are set back; running guests keep running.
    Restore {
        /// A file written by `adm backup`.
        #[arg(long, value_name = "FILE")]
        from: std::path::PathBuf,
    },
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
        let Command::VmAction(VmCommands(a)) = c.command else {
            panic!("not a VM action");
        };
        assert_eq!(
            (a.def, a.name.as_str(), a.dry_run),
            (&catalogue::START_ACTION, "vm1", false)
        );
        assert_eq!(a.flags, FlagValues::default());
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
        let Command::VmAction(VmCommands(a)) = c.command else {
            panic!("not a VM action");
        };
        assert_eq!(a.def, &catalogue::STOP_ACTION);
        assert_eq!(
            a.flags,
            FlagValues {
                switches: vec!["force"],
                integers: vec![("grace-period", 0)],
                lists: vec![],
            }
        );
        let c = parse(&["console", "vm1", "--as", "jane", "--as-group", "devs"]);
        assert_eq!(c.global.as_user.as_deref(), Some("jane"));
        assert_eq!(c.global.as_group, ["devs"]);
    }

    #[test]
    fn pause_kinds() {
        let c = parse(&["pause", "vmi", "a", "--dry-run"]);
        assert!(matches!(
            c.command,
            Command::VmiAction(VmiActionCommand {
                def,
                kind: ObjectKind::Vmi,
                dry_run: true,
                ..
            }) if *def == catalogue::PAUSE_ACTION
        ));
        let c = parse(&["unpause", "vm", "a"]);
        assert!(matches!(
            c.command,
            Command::VmiAction(VmiActionCommand {
                def,
                kind: ObjectKind::Vm,
                ..
            }) if *def == catalogue::UNPAUSE_ACTION
        ));
        assert!(Cli::try_parse_from(["kubectl-virt", "pause", "pod", "a"]).is_err());
    }

    #[test]
    fn vmi_action_commands_come_from_the_catalogue() {
        let Command::VmiAction(c) = parse(&["soft-reboot", "a"]).command else {
            panic!("not a VMI action");
        };
        assert_eq!(
            c,
            VmiActionCommand {
                def: &catalogue::SOFTREBOOT_ACTION,
                kind: ObjectKind::Vmi,
                name: "a".into(),
                dry_run: false,
            }
        );
        // Only the commands with --dry-run take it, and each needs its NAME.
        assert!(Cli::try_parse_from(["kubectl-virt", "reset", "a", "--dry-run"]).is_err());
        assert!(Cli::try_parse_from(["kubectl-virt", "reset"]).is_err());
        assert!(Cli::try_parse_from(["kubectl-virt", "pause", "vm"]).is_err());
        let root = Cli::command();
        for (def, c) in action_commands() {
            let sub = root
                .find_subcommand(c.name)
                .unwrap_or_else(|| panic!("no {} command", c.name));
            assert_eq!(
                sub.get_about().map(ToString::to_string).as_deref(),
                Some(c.about)
            );
            assert_eq!(def.command, Some(c));
        }
    }

    #[test]
    fn vm_action_commands_come_from_the_catalogue() {
        let Command::VmMigration(VmCommands(c)) = parse(&[
            "migrate",
            "a",
            "--addedNodeSelector",
            "x=1",
            "--added-node-selector",
            "y=2,z=3",
            "--wait",
        ])
        .command
        else {
            panic!("not a migration command");
        };
        assert_eq!(c.def, &catalogue::MIGRATE_ACTION);
        assert!(c.wait && !c.dry_run);
        assert_eq!(
            c.flags.list("added-node-selector"),
            ["x=1".to_string(), "y=2,z=3".into()]
        );
        // Negative grace periods reach the action's checks, which word the refusal.
        let Command::VmAction(VmCommands(c)) =
            parse(&["stop", "a", "--force", "--grace-period", "-1"]).command
        else {
            panic!("not a VM action");
        };
        assert_eq!(
            crate::request::vm_action(&c).err().map(|e| e.to_string()),
            Some("--grace-period must be 0 or more, got -1".into())
        );
        // --wait only where the action migrates.
        assert!(Cli::try_parse_from(["kubectl-virt", "start", "a", "--wait"]).is_err());
        let root = Cli::command();
        for (def, c) in vm_commands() {
            let sub = root
                .find_subcommand(c.name)
                .unwrap_or_else(|| panic!("no {} command", c.name));
            assert_eq!(
                sub.get_about().map(ToString::to_string).as_deref(),
                Some(c.about)
            );
            for f in c.flags {
                assert!(sub.get_arguments().any(|a| a.get_long() == Some(f.long)));
            }
            assert!(sub.get_arguments().any(|a| a.get_long() == Some("dry-run")));
            assert_eq!(def.command.map(|c| c.name), Some(c.name));
        }
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
