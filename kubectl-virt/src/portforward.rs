//! `port-forward`: local TCP ports (or stdin/stdout) carried to ports of a VM's guest,
//! one websocket of the `portforward` subresource per connection, as upstream virtctl.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};

use kubevirt_api::catalogue::{self, Subresource};
use tokio::net::TcpListener;

use crate::connect::Session;
use crate::error::{CliError, Target};
use crate::ws::{self, UpgradeError};

/// What to forward to: `vm/NAME`, `vmi/NAME`, or a bare `NAME` (a VMI, as virtctl).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forwardee {
    pub sub: &'static Subresource,
    pub name: String,
}

/// Parses `vm/NAME`, `vmi/NAME` (also the long kind names) or `NAME`.
pub fn parse_target(s: &str) -> Result<Forwardee, CliError> {
    let (sub, name) = match s.split_once('/') {
        None => (&catalogue::PORTFORWARD_VMI, s),
        Some(("vm" | "vms" | "virtualmachine" | "virtualmachines", n)) => {
            (&catalogue::PORTFORWARD_VM, n)
        }
        Some(("vmi" | "vmis" | "virtualmachineinstance" | "virtualmachineinstances", n)) => {
            (&catalogue::PORTFORWARD_VMI, n)
        }
        Some((kind, _)) => {
            return Err(CliError::Usage(format!(
                "{s:?}: unknown kind {kind:?}; use vm/NAME or vmi/NAME"
            )));
        }
    };
    crate::request::validate_name("name", name)?;
    Ok(Forwardee {
        sub,
        name: name.to_owned(),
    })
}

/// Parses `[LOCAL:]REMOTE`; LOCAL 0 picks a free port.
pub fn parse_ports(s: &str) -> Result<(u16, u16), CliError> {
    let bad = || {
        CliError::Usage(format!(
            "{s:?}: expected [LOCAL:]REMOTE with ports 1-65535 (LOCAL 0 picks a free one)"
        ))
    };
    let (local, remote) = match s.split_once(':') {
        Some((l, r)) => (l.parse::<u16>().map_err(|_| bad())?, r),
        None => (u16::MAX, s),
    };
    let remote = remote
        .parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(bad)?;
    Ok((if local == u16::MAX { remote } else { local }, remote))
}

fn target_of(session: &Session, f: &Forwardee) -> Target {
    Target {
        kind: if f.sub.kind == &catalogue::VIRTUAL_MACHINE {
            "VM"
        } else {
            "VMI"
        },
        group: crate::request::SUBRESOURCES_GROUP,
        resource: f.sub.kind.plural,
        subresource: Some(f.sub.name),
        verb: f.sub.rbac_verb(),
        action: "port-forward to",
        name: f.name.clone(),
        namespace: session.namespace.clone(),
    }
}

/// Opens one forwarded connection to `port` of the guest.
pub async fn open(session: &Session, f: &Forwardee, port: u16) -> Result<ws::Stream, CliError> {
    let path = format!("{}/{port}/tcp", f.sub.path(&session.namespace, &f.name));
    let target = target_of(session, f);
    ws::connect(session, &path, &target)
        .await
        .map_err(|e| match e {
            UpgradeError::Other(e) => e,
            UpgradeError::NotRunning(st) => CliError::Server {
                action: "port-forward to",
                kind: target.kind,
                name: f.name.clone(),
                namespace: session.namespace.clone(),
                code: st.code,
                message: st.message,
            },
            UpgradeError::NotFound => CliError::NotFound {
                kind: target.kind,
                name: f.name.clone(),
                namespace: session.namespace.clone(),
            },
        })
}

/// `kubectl virt port-forward TARGET [LOCAL:]REMOTE…`: listens on `address` for each
/// pair until interrupted.
pub async fn run(
    session: &Session,
    target: &str,
    ports: &[String],
    address: IpAddr,
    stdio: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let f = parse_target(target)?;
    if stdio {
        let [remote] = ports else {
            return Err(CliError::Usage(
                "--stdio forwards exactly one port: port-forward --stdio TARGET PORT".into(),
            ));
        };
        let (_, remote) = parse_ports(remote)?;
        let ws = open(session, &f, remote).await?;
        return splice(ws, tokio::io::stdin(), tokio::io::stdout(), &f.name).await;
    }
    if ports.is_empty() {
        return Err(CliError::Usage(
            "name at least one port: port-forward TARGET [LOCAL:]REMOTE…".into(),
        ));
    }
    let mut listeners = Vec::new();
    for p in ports {
        let (local, remote) = parse_ports(p)?;
        let l = TcpListener::bind(SocketAddr::from((address, local)))
            .await
            .map_err(|e| CliError::io(format!("listening on {address}:{local}"), e))?;
        let bound = l
            .local_addr()
            .map_err(|e| CliError::io("reading the listening address", e))?;
        writeln!(out, "Forwarding from {bound} -> {remote}")
            .and_then(|()| out.flush())
            .map_err(|e| CliError::io("writing output", e))?;
        listeners.push((l, remote));
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (l, remote) in listeners {
        let (session, f) = (session.clone(), f.clone());
        tasks.spawn(async move {
            loop {
                let Ok((tcp, peer)) = l.accept().await else {
                    continue;
                };
                let (session, f) = (session.clone(), f.clone());
                tokio::spawn(async move {
                    let r = match open(&session, &f, remote).await {
                        Ok(ws) => {
                            let (rd, wr) = tcp.into_split();
                            splice(ws, rd, wr, &f.name).await
                        }
                        Err(e) => Err(e),
                    };
                    if let Err(e) = r {
                        eprintln!("connection from {peer} to port {remote}: {e}");
                    }
                });
            }
        });
    }
    tokio::select! {
        _ = tokio::signal::ctrl_c() => Ok(()),
        _ = tasks.join_next() => Ok(()),
    }
}

/// Copies bytes both ways between a local stream and the forwarded connection until the
/// guest closes it (the local side may be done sending while the answer still comes).
pub async fn splice<R, W>(ws: ws::Stream, rd: R, wr: W, name: &str) -> Result<(), CliError>
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    ws::splice(
        ws,
        rd,
        wr,
        &format!("the port-forward to {name}"),
        ws::LocalEof::Wait,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_and_ports_parse_like_virtctls() {
        assert_eq!(
            parse_target("vm/web").unwrap(),
            Forwardee {
                sub: &catalogue::PORTFORWARD_VM,
                name: "web".into()
            }
        );
        assert_eq!(
            parse_target("vmi/web").unwrap().sub,
            &catalogue::PORTFORWARD_VMI
        );
        assert_eq!(
            parse_target("web").unwrap().sub,
            &catalogue::PORTFORWARD_VMI
        );
        assert!(
            parse_target("pod/web")
                .unwrap_err()
                .to_string()
                .contains("vm/NAME")
        );
        assert!(parse_target("vm/Bad_Name").is_err());

        assert_eq!(parse_ports("22").unwrap(), (22, 22));
        assert_eq!(parse_ports("2222:22").unwrap(), (2222, 22));
        assert_eq!(parse_ports("0:80").unwrap(), (0, 80));
        for bad in ["0", "70000", "ssh", "1:0", "x:22", ""] {
            assert!(parse_ports(bad).is_err(), "{bad}");
        }
    }
}
