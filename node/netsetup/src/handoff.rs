//! virt-handler → launcher: "your pod network is ready". The launcher listens on
//! [`SOCKET`] in its socket directory before it starts the guest; virt-handler connects,
//! learns the launcher's process from the socket's peer credentials (so it enters the
//! namespace of the process that is really there, not one named in a message), builds the
//! plan's devices in that process's network namespace, and answers with one line of JSON
//! — the plan, or why it failed — with the DHCP socket attached (`SCM_RIGHTS`).
//!
//! The launcher gets exactly two capabilities from this: a tap its uid owns and a UDP
//! socket on port 67 of the bridge. It needs no privilege of its own.

use std::io::{BufRead, BufReader, IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::net::UdpSocket;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use crate::plan::NetworkPlan;

/// File name of the launcher's network socket, next to its command socket.
pub const SOCKET: &str = "net.sock";

/// Largest message accepted (a plan is well under 2 KiB).
const MAX_MESSAGE: usize = 64 * 1024;

/// The one message virt-handler sends.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(tag = "result", rename_all = "camelCase")]
enum Message {
    /// The devices exist; the DHCP socket is attached.
    Ready {
        /// What was built, and the guest's lease.
        plan: Box<NetworkPlan>,
    },
    /// The set-up failed and was undone.
    Failed {
        /// Why, naming the step.
        message: String,
    },
}

/// Why the hand-off failed, on either side.
#[derive(Debug, thiserror::Error)]
pub enum HandoffError {
    /// The socket failed.
    #[error("network hand-off: {0}")]
    Io(#[from] std::io::Error),
    /// The message was not understood.
    #[error("network hand-off: bad message: {0}")]
    Protocol(String),
    /// virt-handler could not set the network up.
    #[error("virt-handler could not set up the pod network: {0}")]
    SetupFailed(String),
}

/// The process at the other end of `stream` (host PID, as seen from a process in the host's
/// PID namespace).
pub fn peer_pid(stream: &UnixStream) -> Result<u32, HandoffError> {
    let cred =
        rustix::net::sockopt::socket_peercred(stream.as_fd()).map_err(std::io::Error::from)?;
    u32::try_from(cred.pid.as_raw_nonzero().get())
        .map_err(|_| HandoffError::Protocol("negative peer pid".into()))
}

/// virt-handler: the network is ready; `dhcp` goes to the launcher with it.
pub fn send_ready(
    stream: &UnixStream,
    plan: &NetworkPlan,
    dhcp: &UdpSocket,
) -> Result<(), HandoffError> {
    let mut line = serde_json::to_vec(&Message::Ready {
        plan: Box::new(plan.clone()),
    })
    .map_err(|e| HandoffError::Protocol(e.to_string()))?;
    line.push(b'\n');
    let fds = [dhcp.as_fd()];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(HandoffError::Protocol("no room for the DHCP socket".into()));
    }
    // The descriptor travels with the first byte; the rest may follow in later writes.
    let sent = rustix::net::sendmsg(
        stream,
        &[IoSlice::new(&line)],
        &mut control,
        SendFlags::empty(),
    )
    .map_err(std::io::Error::from)?;
    (&*stream).write_all(&line[sent..])?;
    Ok(())
}

/// virt-handler: the set-up failed (and was undone); the launcher fails the VMI with this.
pub fn send_failed(stream: &UnixStream, message: &str) -> Result<(), HandoffError> {
    let mut line = serde_json::to_vec(&Message::Failed {
        message: message.to_string(),
    })
    .map_err(|e| HandoffError::Protocol(e.to_string()))?;
    line.push(b'\n');
    (&*stream).write_all(&line)?;
    Ok(())
}

/// Launcher: waits on an accepted connection for virt-handler's answer.
pub fn receive(stream: &UnixStream) -> Result<(NetworkPlan, UdpSocket), HandoffError> {
    let mut first = [0u8; 4096];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        stream,
        &mut [IoSliceMut::new(&mut first)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )
    .map_err(std::io::Error::from)?;
    let mut fd: Option<OwnedFd> = None;
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = msg {
            for f in fds {
                // One descriptor is expected; any extra is closed when dropped.
                fd.get_or_insert(f);
            }
        }
    }
    let mut line = first[..got.bytes].to_vec();
    if !line.contains(&b'\n') {
        let mut rest = BufReader::new(stream.take(MAX_MESSAGE as u64));
        rest.read_until(b'\n', &mut line)?;
    }
    if line.last() != Some(&b'\n') {
        return Err(HandoffError::Protocol(
            "connection closed before the message ended".into(),
        ));
    }
    match serde_json::from_slice::<Message>(&line)
        .map_err(|e| HandoffError::Protocol(e.to_string()))?
    {
        Message::Ready { plan } => {
            let fd = fd.ok_or_else(|| HandoffError::Protocol("no DHCP socket attached".into()))?;
            Ok((*plan, UdpSocket::from(fd)))
        }
        Message::Failed { message } => Err(HandoffError::SetupFailed(message)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Binding, Cidr, Dns, Lease, Mac, PodInterface};

    fn plan() -> NetworkPlan {
        let pod = PodInterface {
            name: "eth0".into(),
            mac: Mac([2, 0, 0, 0, 0, 1]),
            address: Cidr::parse("10.244.0.9/24").unwrap(),
            gateway: None,
            mtu: 1500,
        };
        NetworkPlan {
            interface: "default".into(),
            binding: Binding::Masquerade {
                vm_cidr: Cidr::parse("10.0.2.0/24").unwrap(),
                ports: vec![],
            },
            pod,
            pod_new_mac: None,
            bridge_address: Cidr::parse("10.0.2.1/24").unwrap(),
            lease: Lease {
                mac: Mac([2, 0, 0, 0, 0, 2]),
                address: Cidr::parse("10.0.2.2/24").unwrap(),
                gateway: None,
                server: "10.0.2.1".parse().unwrap(),
                dns: Dns::default(),
                mtu: 1500,
                hostname: None,
                lease_secs: 1,
            },
        }
    }

    #[test]
    fn ready_carries_the_plan_and_a_working_socket() {
        let (a, b) = UnixStream::pair().unwrap();
        let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
        let addr = udp.local_addr().unwrap();
        send_ready(&a, &plan(), &udp).unwrap();
        drop(udp);
        let (got, sock) = receive(&b).unwrap();
        assert_eq!(got, plan());
        // The received descriptor is the same socket: it still receives on that port.
        assert_eq!(sock.local_addr().unwrap(), addr);
        UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .send_to(b"hi", addr)
            .unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(sock.recv(&mut buf).unwrap(), 2);
        assert_eq!(peer_pid(&a).unwrap(), std::process::id());
    }

    #[test]
    fn failure_and_garbage_are_errors() {
        let (a, b) = UnixStream::pair().unwrap();
        send_failed(&a, "nft (masquerade rules) failed: boom").unwrap();
        let e = receive(&b).unwrap_err();
        assert!(
            e.to_string()
                .contains("virt-handler could not set up the pod network: nft"),
            "{e}"
        );
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(b"{\"result\":\"ready\"").unwrap();
        drop(a);
        assert!(matches!(receive(&b), Err(HandoffError::Protocol(_))));
    }
}
