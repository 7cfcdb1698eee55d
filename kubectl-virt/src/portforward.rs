//! `port-forward`: local TCP and UDP ports (or stdin/stdout) carried to ports of a VM's
//! guest, one websocket of the `portforward` subresource per connection (per UDP client
//! address), as upstream virtctl: for UDP one websocket message is one datagram.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};

use kubevirt_api::catalogue::{self, Subresource};
use tokio::net::{TcpListener, UdpSocket};

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

/// A transport of a forwarded port.
pub use kubevirt_api::handler_protocol::ForwardProtocol as Protocol;
use kubevirt_api::handler_protocol::{ForwardTarget, parse_port};

/// One forwarded port: `[PROTOCOL/][LOCAL:]REMOTE` (virtctl's syntax: `udp/5353:53`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ports {
    /// 0 picks a free port.
    pub local: u16,
    pub remote: u16,
    pub protocol: Protocol,
}

/// Parses `[PROTOCOL/][LOCAL:]REMOTE`; PROTOCOL is tcp (the default) or udp, LOCAL 0 picks
/// a free port.
pub fn parse_ports(s: &str) -> Result<Ports, CliError> {
    let (protocol, rest) = match s.split_once('/') {
        None => (Protocol::Tcp, s),
        Some((p, rest)) => match Protocol::parse(p) {
            Some(protocol) => (protocol, rest),
            None => {
                return Err(CliError::Usage(format!(
                    "{s:?}: unknown protocol {p:?}; use tcp/PORTS or udp/PORTS"
                )));
            }
        },
    };
    let (local, remote) = parse_pair(s, rest)?;
    Ok(Ports {
        local,
        remote,
        protocol,
    })
}

/// `[LOCAL:]REMOTE` of `whole`.
fn parse_pair(whole: &str, s: &str) -> Result<(u16, u16), CliError> {
    let bad = || {
        CliError::Usage(format!(
            "{whole:?}: expected [tcp/|udp/][LOCAL:]REMOTE with ports 1-65535 (LOCAL 0 picks a \
             free one)"
        ))
    };
    let (local, remote) = match s.split_once(':') {
        Some((l, r)) => (l.parse::<u16>().map_err(|_| bad())?, r),
        None => (u16::MAX, s),
    };
    let remote = parse_port(remote).ok_or_else(bad)?;
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
pub async fn open(
    session: &Session,
    f: &Forwardee,
    port: u16,
    protocol: Protocol,
) -> Result<ws::Stream, CliError> {
    let path = format!(
        "{}/{}",
        f.sub.path(&session.namespace, &f.name),
        ForwardTarget { port, protocol }.params()
    );
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
        let p = parse_ports(remote)?;
        if p.protocol == Protocol::Udp {
            return Err(CliError::Usage(
                "--stdio carries a byte stream: it forwards tcp ports only".into(),
            ));
        }
        let ws = open(session, &f, p.remote, Protocol::Tcp).await?;
        return splice(ws, tokio::io::stdin(), tokio::io::stdout(), &f.name).await;
    }
    if ports.is_empty() {
        return Err(CliError::Usage(
            "name at least one port: port-forward TARGET [LOCAL:]REMOTE…".into(),
        ));
    }
    let mut listeners = Vec::new();
    let mut datagrams = Vec::new();
    for p in ports {
        let p = parse_ports(p)?;
        let what = format!("listening on {address}:{}/{}", p.local, p.protocol.as_str());
        let bound = match p.protocol {
            Protocol::Tcp => {
                let l = TcpListener::bind(SocketAddr::from((address, p.local)))
                    .await
                    .map_err(|e| CliError::io(what, e))?;
                let bound = l.local_addr();
                listeners.push((l, p.remote));
                bound
            }
            Protocol::Udp => {
                let u = UdpSocket::bind(SocketAddr::from((address, p.local)))
                    .await
                    .map_err(|e| CliError::io(what, e))?;
                let bound = u.local_addr();
                datagrams.push((u, p.remote));
                bound
            }
        }
        .map_err(|e| CliError::io("reading the listening address", e))?;
        writeln!(
            out,
            "Forwarding from {bound} -> {}{}",
            p.remote,
            if p.protocol == Protocol::Udp {
                "/udp"
            } else {
                ""
            }
        )
        .and_then(|()| out.flush())
        .map_err(|e| CliError::io("writing output", e))?;
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (u, remote) in datagrams {
        let (session, f) = (session.clone(), f.clone());
        tasks.spawn(relay_datagrams(session, f, u, remote));
    }
    for (l, remote) in listeners {
        let (session, f) = (session.clone(), f.clone());
        tasks.spawn(async move {
            loop {
                let Ok((tcp, peer)) = l.accept().await else {
                    continue;
                };
                let (session, f) = (session.clone(), f.clone());
                tokio::spawn(async move {
                    let r = match open(&session, &f, remote, Protocol::Tcp).await {
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

/// Relays the datagrams arriving on `local` to port `remote`/udp of the guest: each client
/// address gets its own websocket (the guest sees one source port per client, as with
/// upstream virtctl) opened at its first datagram, and the guest's answers go back to it.
/// A client's forward that ends (its guest closed the port, or left the node) is reported
/// and the next datagram from that client opens a new one.
async fn relay_datagrams(session: Session, f: Forwardee, local: UdpSocket, remote: u16) {
    use futures::{SinkExt, StreamExt};
    use std::collections::HashMap;
    use tokio::sync::mpsc;
    use tokio_tungstenite::tungstenite::Message;
    let local = std::sync::Arc::new(local);
    // Per client: where its datagrams go (towards its websocket).
    let mut clients: HashMap<SocketAddr, mpsc::Sender<Vec<u8>>> = HashMap::new();
    let (ended_tx, mut ended_rx) = mpsc::unbounded_channel::<SocketAddr>();
    let mut buf = vec![0u8; 65_535];
    loop {
        let (n, peer) = tokio::select! {
            r = local.recv_from(&mut buf) => match r {
                Ok(x) => x,
                Err(_) => continue,
            },
            Some(peer) = ended_rx.recv() => {
                clients.remove(&peer);
                continue;
            }
        };
        let datagram = buf[..n].to_vec();
        if let Some(tx) = clients.get(&peer)
            && tx.try_send(datagram.clone()).is_ok()
        {
            continue;
        }
        let (tx, mut rx) = mpsc::channel::<Vec<u8>>(64);
        let _ = tx.try_send(datagram);
        clients.insert(peer, tx);
        let (session, f, local, ended) =
            (session.clone(), f.clone(), local.clone(), ended_tx.clone());
        tokio::spawn(async move {
            let r = async {
                let ws = open(&session, &f, remote, Protocol::Udp).await?;
                let (mut sink, mut source) = ws.split();
                let what = format!("the port-forward to {}", f.name);
                let ws_err = |e: tokio_tungstenite::tungstenite::Error| CliError::WebSocket {
                    what: what.clone(),
                    detail: e.to_string(),
                };
                let up = async {
                    while let Some(d) = rx.recv().await {
                        sink.send(Message::Binary(d.into())).await.map_err(ws_err)?;
                    }
                    Ok::<(), CliError>(())
                };
                let down = async {
                    while let Some(msg) = source.next().await {
                        match msg.map_err(ws_err)? {
                            Message::Binary(b) => {
                                let _ = local.send_to(&b, peer).await;
                            }
                            Message::Close(Some(c)) if !c.reason.is_empty() => {
                                return Err(CliError::WebSocket {
                                    what: what.clone(),
                                    detail: c.reason.to_string(),
                                });
                            }
                            Message::Close(_) => break,
                            _ => {}
                        }
                    }
                    Ok(())
                };
                tokio::select! {
                    r = up => r,
                    r = down => r,
                }
            }
            .await;
            if let Err(e) = r {
                eprintln!("datagrams from {peer} to port {remote}/udp: {e}");
            }
            let _ = ended.send(peer);
        });
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

        let pair = |s| {
            let p = parse_ports(s).unwrap();
            (p.local, p.remote, p.protocol)
        };
        assert_eq!(pair("22"), (22, 22, Protocol::Tcp));
        assert_eq!(pair("2222:22"), (2222, 22, Protocol::Tcp));
        assert_eq!(pair("0:80"), (0, 80, Protocol::Tcp));
        assert_eq!(pair("tcp/8080:80"), (8080, 80, Protocol::Tcp));
        assert_eq!(pair("udp/5353:53"), (5353, 53, Protocol::Udp));
        assert_eq!(pair("udp/7"), (7, 7, Protocol::Udp));
        assert!(
            parse_ports("sctp/22")
                .unwrap_err()
                .to_string()
                .contains("udp/PORTS")
        );
        for bad in ["0", "70000", "ssh", "1:0", "x:22", "", "udp/", "udp/0"] {
            assert!(parse_ports(bad).is_err(), "{bad}");
        }
    }
}
