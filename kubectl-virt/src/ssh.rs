//! `ssh` and `scp`: the local OpenSSH client, its connection carried by
//! `kubectl virt port-forward --stdio` (a ProxyCommand), as upstream virtctl's
//! `--local-ssh` mode. No route to the pod network and no SSH server of ours are involved.

use std::path::{Path, PathBuf};

use crate::error::CliError;
use crate::portforward::{Forwardee, parse_target};

/// What identifies the cluster to the ProxyCommand: the global flags given to us.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Kube {
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    pub namespace: String,
}

/// Options shared by `ssh` and `scp`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshOptions {
    pub username: Option<String>,
    pub identity_file: Option<PathBuf>,
    pub port: u16,
    pub known_hosts: Option<PathBuf>,
    pub local_ssh_opts: Vec<String>,
}

/// `[USER@](vm|vmi)/NAME[.NAMESPACE]` (virtctl's form): the user, the target and the
/// namespace when the name carries one.
pub fn parse_destination(s: &str) -> Result<(Option<String>, Forwardee, Option<String>), CliError> {
    let (user, rest) = match s.split_once('@') {
        Some((u, r)) if !u.is_empty() => (Some(u.to_owned()), r),
        Some(_) => return Err(CliError::Usage(format!("{s:?}: empty user name"))),
        None => (None, s),
    };
    let (target, namespace) = match rest.split_once('/') {
        Some((kind, name)) => match name.split_once('.') {
            Some((n, ns)) => (format!("{kind}/{n}"), Some(ns.to_owned())),
            None => (rest.to_owned(), None),
        },
        None => (rest.to_owned(), None),
    };
    Ok((user, parse_target(&target)?, namespace))
}

/// Quotes `s` for the shell ssh runs the ProxyCommand with.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The ProxyCommand: this very plugin, forwarding stdin/stdout to the guest's port.
pub fn proxy_command(exe: &Path, kube: &Kube, f: &Forwardee, port: u16) -> String {
    let kind = if f.sub.kind == &kubevirt_api::catalogue::VIRTUAL_MACHINE {
        "vm"
    } else {
        "vmi"
    };
    let mut args = vec![
        exe.display().to_string(),
        "port-forward".into(),
        "--stdio".into(),
        format!("{kind}/{}", f.name),
        port.to_string(),
        "--namespace".into(),
        kube.namespace.clone(),
    ];
    if let Some(k) = &kube.kubeconfig {
        args.extend(["--kubeconfig".into(), k.display().to_string()]);
    }
    if let Some(c) = &kube.context {
        args.extend(["--context".into(), c.clone()]);
    }
    args.iter()
        .map(|a| sh_quote(a))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The host name ssh sees (and records in known_hosts): one per VM and namespace.
pub fn host_alias(f: &Forwardee, namespace: &str) -> String {
    let kind = if f.sub.kind == &kubevirt_api::catalogue::VIRTUAL_MACHINE {
        "vm"
    } else {
        "vmi"
    };
    format!("{kind}.{}.{namespace}", f.name)
}

/// Options before the destination, common to ssh and scp.
fn common_args(exe: &Path, kube: &Kube, f: &Forwardee, o: &SshOptions) -> Vec<String> {
    let mut args = vec![
        "-o".to_owned(),
        format!("ProxyCommand={}", proxy_command(exe, kube, f, o.port)),
    ];
    if let Some(k) = &o.known_hosts {
        args.extend(["-o".into(), format!("UserKnownHostsFile={}", k.display())]);
    }
    if let Some(i) = &o.identity_file {
        args.extend(["-i".into(), i.display().to_string()]);
    }
    args.extend(o.local_ssh_opts.iter().cloned());
    args
}

/// The `ssh` command line: `ssh OPTIONS [USER@]ALIAS [COMMAND]`.
pub fn ssh_argv(
    exe: &Path,
    kube: &Kube,
    destination: &str,
    o: &SshOptions,
    command: Option<&str>,
) -> Result<Vec<String>, CliError> {
    let (user, f, ns) = parse_destination(destination)?;
    let kube = Kube {
        namespace: ns.unwrap_or_else(|| kube.namespace.clone()),
        ..kube.clone()
    };
    let mut argv = vec!["ssh".to_owned()];
    argv.extend(common_args(exe, &kube, &f, o));
    let host = host_alias(&f, &kube.namespace);
    argv.push(match user.or_else(|| o.username.clone()) {
        Some(u) => format!("{u}@{host}"),
        None => host,
    });
    if let Some(c) = command {
        argv.push(c.to_owned());
    }
    Ok(argv)
}

/// The `scp` command line. Exactly one of `from`/`to` names the VM
/// (`[USER@](vm|vmi)/NAME[.NS]:PATH`). The classic SCP protocol (`-O`): guests need no
/// SFTP server for it.
pub fn scp_argv(
    exe: &Path,
    kube: &Kube,
    from: &str,
    to: &str,
    recursive: bool,
    o: &SshOptions,
) -> Result<Vec<String>, CliError> {
    let remote = |s: &str| -> Option<(String, String)> {
        let (dest, path) = s.split_once(':')?;
        dest.contains('/')
            .then(|| (dest.to_owned(), path.to_owned()))
    };
    let (vm_side, local, upload) = match (remote(from), remote(to)) {
        (Some(r), None) => (r, to, false),
        (None, Some(r)) => (r, from, true),
        _ => {
            return Err(CliError::Usage(
                "scp copies between this machine and one VM: exactly one of SOURCE and \
                 DESTINATION is [USER@]vm/NAME:PATH"
                    .into(),
            ));
        }
    };
    let (user, f, ns) = parse_destination(&vm_side.0)?;
    let kube = Kube {
        namespace: ns.unwrap_or_else(|| kube.namespace.clone()),
        ..kube.clone()
    };
    let mut argv = vec!["scp".to_owned(), "-O".to_owned()];
    if recursive {
        argv.push("-r".into());
    }
    argv.extend(common_args(exe, &kube, &f, o));
    let host = host_alias(&f, &kube.namespace);
    let remote = match user.or_else(|| o.username.clone()) {
        Some(u) => format!("{u}@{host}:{}", vm_side.1),
        None => format!("{host}:{}", vm_side.1),
    };
    if upload {
        argv.extend([local.to_owned(), remote]);
    } else {
        argv.extend([remote, local.to_owned()]);
    }
    Ok(argv)
}

/// Runs `argv` (ssh or scp) in place of this process, so that its exit code, terminal
/// and signals are the user's own.
pub fn exec(argv: &[String]) -> CliError {
    use std::os::unix::process::CommandExt as _;
    let Some((program, args)) = argv.split_first() else {
        return CliError::Usage("nothing to run".into());
    };
    let e = std::process::Command::new(program).args(args).exec();
    CliError::io(
        format!("running {program} (is OpenSSH's client installed?)"),
        e,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> SshOptions {
        SshOptions {
            username: None,
            identity_file: Some("/k/id".into()),
            port: 22,
            known_hosts: None,
            local_ssh_opts: vec!["-o".into(), "StrictHostKeyChecking=no".into()],
        }
    }

    fn kube() -> Kube {
        Kube {
            kubeconfig: Some("/c/kube config".into()),
            context: None,
            namespace: "dev".into(),
        }
    }

    #[test]
    fn ssh_goes_through_port_forward_stdio() {
        let argv = ssh_argv(
            Path::new("/bin/kubectl-virt"),
            &kube(),
            "root@vm/web",
            &opts(),
            Some("uname -a"),
        )
        .unwrap();
        assert_eq!(
            argv,
            [
                "ssh",
                "-o",
                "ProxyCommand='/bin/kubectl-virt' 'port-forward' '--stdio' 'vm/web' '22' \
                 '--namespace' 'dev' '--kubeconfig' '/c/kube config'",
                "-i",
                "/k/id",
                "-o",
                "StrictHostKeyChecking=no",
                "root@vm.web.dev",
                "uname -a",
            ]
        );
        // virtctl's NAME.NAMESPACE form, and the user from -l.
        let o = SshOptions {
            username: Some("fedora".into()),
            ..opts()
        };
        let argv = ssh_argv(Path::new("k"), &kube(), "vmi/db.prod", &o, None).unwrap();
        assert!(
            argv[2].contains("'vmi/db' '22' '--namespace' 'prod'"),
            "{argv:?}"
        );
        assert_eq!(argv.last().unwrap(), "fedora@vmi.db.prod");
        assert!(ssh_argv(Path::new("k"), &kube(), "@vm/x", &o, None).is_err());
    }

    #[test]
    fn scp_names_the_vm_on_exactly_one_side() {
        let k = Path::new("k");
        let up = scp_argv(k, &kube(), "./a b", "root@vm/web:/tmp/x", false, &opts()).unwrap();
        assert_eq!(&up[..2], ["scp", "-O"]);
        assert_eq!(&up[up.len() - 2..], ["./a b", "root@vm.web.dev:/tmp/x"]);
        let down = scp_argv(k, &kube(), "vm/web:/etc/hostname", ".", true, &opts()).unwrap();
        assert_eq!(down[2], "-r");
        assert_eq!(&down[down.len() - 2..], ["vm.web.dev:/etc/hostname", "."]);
        for (a, b) in [("a", "b"), ("vm/x:/a", "vm/y:/b")] {
            assert!(scp_argv(k, &kube(), a, b, false, &opts()).is_err());
        }
    }
}
