//! `kubectl virt`: the kubevirt-rs kubectl plugin.
//!
//! Lifecycle commands call KubeVirt's `subresources.kubevirt.io` API, so the
//! plugin works against kubevirt-rs and, for the same commands, against
//! upstream KubeVirt. Everything that can be decided without a server
//! (request paths and bodies, manifests, error wording) is pure and
//! unit-tested.

pub mod backup;
pub mod cli;
pub mod complete;
pub mod connect;
pub mod console;
pub mod create;
pub mod error;
pub mod expose;
pub mod migrate;
pub mod ops;
pub mod portforward;
pub mod request;
pub mod ssh;
pub mod vnc;
pub mod volume;
pub mod ws;

use std::io::Write;
use std::time::Duration;

use clap::CommandFactory;

use crate::cli::{Cli, Command, CreateCommand};
pub use crate::error::CliError;
use crate::ops::ObjectKind;
use crate::request::{Action, evacuate_cancel, vm_action};

/// Executable name kubectl discovers plugins by.
pub const BIN_NAME: &str = "kubectl-virt";

/// Runs a parsed command line. Output goes to stdout, diagnostics to stderr.
pub async fn run(cli: Cli) -> Result<(), CliError> {
    let mut stdout = std::io::stdout();
    match cli.command {
        Command::Completion { shell } => {
            // Completion scripts are keyed to the executable's name; the
            // display name "kubectl virt" would produce unusable functions.
            let mut cmd = Cli::command().name(BIN_NAME).bin_name(BIN_NAME);
            // Buffered: clap_complete panics on write errors such as a
            // closed pipe (`| head`).
            let mut buf = Vec::new();
            clap_complete::generate(shell, &mut cmd, BIN_NAME, &mut buf);
            stdout
                .write_all(&buf)
                .map_err(|e| CliError::io("writing output", e))
        }
        Command::Create(CreateCommand::Vm(a)) => {
            let create = create::CreateVm {
                name: a.name.clone(),
                namespace: cli.global.namespace.clone(),
                memory: a.memory,
                run_strategy: a.run_strategy,
                termination_grace_period: a.termination_grace_period,
                container_disks: a.volume_containerdisk,
                pvcs: a.volume_pvc,
                cloud_init: create::CloudInit {
                    user_data_base64: a.cloud_init_user_data,
                    network_data_base64: a.cloud_init_network_data,
                    user: a.user,
                    password: a
                        .password_file
                        .as_deref()
                        .map(read_password_file)
                        .transpose()?,
                    ssh_authorized_keys: a.ssh_key,
                },
            };
            let name = a.name.unwrap_or_else(create::random_vm_name);
            let yaml = create.to_yaml(&name)?;
            stdout
                .write_all(yaml.as_bytes())
                .map_err(|e| CliError::io("writing output", e))
        }
        Command::Version { client: true } => {
            ops::version(None, &mut stdout, &mut std::io::stderr()).await
        }
        Command::Version { client: false } => {
            // The client version is printed even when no cluster is configured.
            let session = cli.global.session().await;
            match &session {
                Ok(s) => ops::version(Some(s), &mut stdout, &mut std::io::stderr()).await,
                Err(e) => {
                    ops::version(None, &mut stdout, &mut std::io::stderr()).await?;
                    eprintln!("Server Version: unavailable: {e}");
                    Ok(())
                }
            }
        }
        Command::Ssh {
            destination,
            command,
            ssh,
        } => {
            let kube = ssh_kube(&cli.global).await?;
            let argv = ssh::ssh_argv(
                &self_exe()?,
                &kube,
                &destination,
                &ssh.options(),
                command.as_deref(),
            )?;
            Err(ssh::exec(&argv))
        }
        Command::Scp {
            source,
            destination,
            recursive,
            ssh,
        } => {
            let kube = ssh_kube(&cli.global).await?;
            let argv = ssh::scp_argv(
                &self_exe()?,
                &kube,
                &source,
                &destination,
                recursive,
                &ssh.options(),
            )?;
            Err(ssh::exec(&argv))
        }
        command => {
            let session = cli.global.session().await?;
            run_with_session(&session, command, &mut stdout).await
        }
    }
}

/// The cluster as the ProxyCommand must see it: the flags we were given and the namespace
/// they resolve to.
async fn ssh_kube(global: &connect::GlobalArgs) -> Result<ssh::Kube, CliError> {
    let session = global.session().await?;
    Ok(ssh::Kube {
        kubeconfig: global.kubeconfig.clone(),
        context: global.context.clone(),
        namespace: session.namespace.clone(),
    })
}

fn self_exe() -> Result<std::path::PathBuf, CliError> {
    std::env::current_exe().map_err(|e| CliError::io("finding the kubectl-virt executable", e))
}

/// The first line of a password file: editors and `echo` add a trailing
/// newline that must not become part of the password.
fn read_password_file(path: &std::path::Path) -> Result<String, CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::io(format!("reading {}", path.display()), e))?;
    let pw = text.lines().next().unwrap_or_default().to_owned();
    if pw.is_empty() {
        return Err(CliError::Usage(format!(
            "{} holds no password",
            path.display()
        )));
    }
    Ok(pw)
}

async fn run_with_session(
    session: &connect::Session,
    command: Command,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    match command {
        Command::Adm(cli::AdmCommand::Backup { to }) => backup::backup(session, &to, out).await,
        Command::Adm(cli::AdmCommand::Restore { from }) => {
            backup::restore(session, &from, out).await
        }
        Command::VmAction(cli::VmCommands(c)) | Command::VmMigration(cli::VmCommands(c)) => {
            let action = vm_action(&c)?;
            let started = std::time::Instant::now();
            ops::run_action(session, &action, ObjectKind::Vm, &c.name, out).await?;
            if c.wait && !c.dry_run {
                migrate::wait(session, &c.name, started, out).await?;
            }
            Ok(())
        }
        Command::VmiAction(c) => {
            let action = Action::Vmi {
                def: c.def,
                dry_run: c.dry_run,
            };
            ops::run_action(session, &action, c.kind, &c.name, out).await
        }
        Command::MigrateCancel { name, dry_run } => {
            ops::migrate_cancel(session, &name, dry_run, out).await
        }
        Command::EvacuateCancel {
            kind,
            name,
            dry_run,
        } => match kind {
            ops::EvacuateKind::Node => {
                ops::evacuate_cancel_node(session, &name, dry_run, out).await
            }
            ops::EvacuateKind::Vm | ops::EvacuateKind::Vmi => {
                let vmi = kind == ops::EvacuateKind::Vmi;
                let object = if vmi { ObjectKind::Vmi } else { ObjectKind::Vm };
                let action = evacuate_cancel(vmi, dry_run);
                ops::run_action(session, &action, object, &name, out).await
            }
        },
        Command::AddVolume(a) => volume::add(session, &a, out).await,
        Command::RemoveVolume(a) => volume::remove(session, &a, out).await,
        Command::Console { name, timeout } => {
            let timeout = Duration::from_secs(timeout.saturating_mul(60));
            console::run(session, &name, timeout).await.map(drop)
        }
        Command::Vnc {
            name,
            proxy_only,
            port,
        } => vnc::run(session, &name, port, proxy_only, out).await,
        Command::Expose {
            kind,
            name,
            service_name,
            port,
            target_port,
            type_,
            protocol,
        } => {
            let e = expose::Expose {
                kind,
                name,
                service_name,
                port,
                target_port,
                type_,
                protocol,
            };
            expose::run(session, &e, out).await
        }
        Command::PortForward {
            target,
            ports,
            address,
            stdio,
        } => portforward::run(session, &target, &ports, address, stdio, out).await,
        Command::Create(_)
        | Command::Version { .. }
        | Command::Completion { .. }
        | Command::Ssh { .. }
        | Command::Scp { .. } => Ok(()),
    }
}
