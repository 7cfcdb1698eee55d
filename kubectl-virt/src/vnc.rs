//! `vnc`: a local TCP endpoint that a VNC viewer connects to, bridged to the
//! VMI's RFB stream over KubeVirt's websocket.

use std::io::Write;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

use crate::connect::Session;
use crate::console::connect_when_running;
use crate::error::CliError;

/// Viewers tried, in order, when not in --proxy-only mode.
const VIEWERS: &[&str] = &["remote-viewer", "vncviewer", "tigervnc", "gvncviewer"];

/// How long to wait for a running VMI before giving up on a viewer's
/// connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(60);

/// The line virtctl prints in --proxy-only mode, for scripts.
pub fn port_line(port: u16) -> String {
    serde_json::json!({ "port": port }).to_string()
}

/// `kubectl virt vnc NAME`.
pub async fn run(
    session: &Session,
    name: &str,
    port: u16,
    proxy_only: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    crate::request::validate_name("name", name)?;
    // Loopback only: the RFB stream is unauthenticated once bridged.
    let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
        .await
        .map_err(|e| CliError::io(format!("listening on 127.0.0.1:{port}"), e))?;
    let port = listener
        .local_addr()
        .map_err(|e| CliError::io("reading the listening address", e))?
        .port();

    let mut viewer = None;
    if proxy_only {
        writeln!(out, "{}", port_line(port)).map_err(|e| CliError::io("writing output", e))?;
        out.flush().map_err(|e| CliError::io("writing output", e))?;
    } else {
        viewer = spawn_viewer(port);
        if viewer.is_none() {
            eprintln!(
                "no VNC viewer found (tried {}); connect one to 127.0.0.1:{port}",
                VIEWERS.join(", ")
            );
            writeln!(out, "{}", port_line(port)).map_err(|e| CliError::io("writing output", e))?;
        }
    }

    loop {
        let accepted = match viewer.as_mut() {
            Some(child) => tokio::select! {
                a = listener.accept() => a,
                // The proxy lives as long as the viewer it started.
                _ = child.wait() => return Ok(()),
            },
            None => tokio::select! {
                a = listener.accept() => a,
                _ = tokio::signal::ctrl_c() => return Ok(()),
            },
        };
        let (tcp, peer) = accepted.map_err(|e| CliError::io("accepting a VNC client", e))?;
        let session = session.clone();
        let name = name.to_owned();
        tokio::spawn(async move {
            if let Err(e) = bridge(&session, &name, tcp).await {
                eprintln!("VNC connection from {peer}: {e}");
            }
        });
    }
}

fn spawn_viewer(port: u16) -> Option<tokio::process::Child> {
    VIEWERS.iter().find_map(|v| {
        let arg = if *v == "remote-viewer" {
            format!("vnc://127.0.0.1:{port}")
        } else {
            format!("127.0.0.1::{port}")
        };
        tokio::process::Command::new(v)
            .arg(arg)
            .kill_on_drop(true)
            .spawn()
            .ok()
    })
}

/// Copies bytes both ways between a viewer and the VMI until either closes.
async fn bridge(session: &Session, name: &str, tcp: TcpStream) -> Result<(), CliError> {
    let ws = connect_when_running(
        session,
        name,
        &kubevirt_api::catalogue::VNC,
        CONNECT_TIMEOUT,
    )
    .await?;
    let (rd, wr) = tcp.into_split();
    crate::ws::splice(
        ws,
        rd,
        wr,
        &format!("the VNC of {name}"),
        crate::ws::LocalEof::Close,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_only_prints_port_json() {
        assert_eq!(port_line(5901), r#"{"port":5901}"#);
    }
}
