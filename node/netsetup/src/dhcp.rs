//! DHCP for one guest: a request in, the answer for its lease out. Pure (no sockets), so
//! every exchange is unit-tested; [`crate::exec::DhcpServer`] moves the bytes.
//!
//! The server answers only the guest's MAC and only ever offers the one planned address:
//! nothing else is on the bridge, and another client must not take the guest's address.

use std::net::Ipv4Addr;

use dhcproto::v4::{DhcpOption, Message, MessageType, Opcode, OptionCode};
use dhcproto::{Decodable, Decoder, Encodable, Name};

use crate::plan::Lease;

/// An answer to send, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    /// The encoded message.
    pub bytes: Vec<u8>,
    /// The kind of answer (Offer, Ack, Nak).
    pub kind: MessageType,
    /// Where to send it: the client's address when it already has one (renewals), else
    /// broadcast, since a client without an address cannot take unicast reliably.
    pub to: Ipv4Addr,
}

/// The answer to `request` for `lease`, or `None` when it is not for us (another MAC, not a
/// request, garbage, a message type a server ignores).
pub fn answer(request: &[u8], lease: &Lease) -> Option<Reply> {
    let msg = Message::decode(&mut Decoder::new(request)).ok()?;
    if msg.opcode() != Opcode::BootRequest || msg.chaddr().get(..6) != Some(&lease.mac.0[..]) {
        return None;
    }
    let kind = match msg.opts().msg_type()? {
        MessageType::Discover => MessageType::Offer,
        MessageType::Request => {
            // A request names the address it wants (selecting or init-reboot) or carries
            // it in ciaddr (renewing/rebinding). Anything but ours is refused, so a guest
            // moved from another network asks again instead of keeping a stale address.
            let wanted = match msg.opts().get(OptionCode::RequestedIpAddress) {
                Some(DhcpOption::RequestedIpAddress(ip)) => *ip,
                _ => msg.ciaddr(),
            };
            let to_other_server = matches!(
                msg.opts().get(OptionCode::ServerIdentifier),
                Some(DhcpOption::ServerIdentifier(s)) if *s != lease.server
            );
            if to_other_server {
                return None;
            }
            if wanted == lease.address.addr {
                MessageType::Ack
            } else {
                MessageType::Nak
            }
        }
        // Decline, Release, Inform and server messages need no answer here.
        _ => return None,
    };
    let mut reply = Message::default();
    reply
        .set_opcode(Opcode::BootReply)
        .set_xid(msg.xid())
        .set_flags(msg.flags())
        .set_giaddr(msg.giaddr())
        .set_ciaddr(msg.ciaddr())
        .set_chaddr(&lease.mac.0);
    let opts = reply.opts_mut();
    opts.insert(DhcpOption::MessageType(kind));
    opts.insert(DhcpOption::ServerIdentifier(lease.server));
    if kind != MessageType::Nak {
        reply
            .set_yiaddr(lease.address.addr)
            .set_siaddr(lease.server);
        let opts = reply.opts_mut();
        opts.insert(DhcpOption::AddressLeaseTime(lease.lease_secs));
        opts.insert(DhcpOption::SubnetMask(lease.address.netmask()));
        if lease.address.prefix < 31 {
            let broadcast =
                u32::from(lease.address.network()) | !u32::from(lease.address.netmask());
            opts.insert(DhcpOption::BroadcastAddr(Ipv4Addr::from(broadcast)));
        }
        if let Some(gw) = lease.gateway {
            opts.insert(DhcpOption::Router(vec![gw]));
        }
        if !lease.dns.servers.is_empty() {
            opts.insert(DhcpOption::DomainNameServer(lease.dns.servers.clone()));
        }
        if let Some(first) = lease.dns.search.first() {
            opts.insert(DhcpOption::DomainName(first.clone()));
        }
        let search: Vec<Name> = lease
            .dns
            .search
            .iter()
            .filter_map(|d| Name::from_utf8(d).ok())
            .collect();
        if !search.is_empty() {
            opts.insert(DhcpOption::DomainSearch(search));
        }
        if let Ok(mtu) = u16::try_from(lease.mtu) {
            opts.insert(DhcpOption::InterfaceMtu(mtu));
        }
        if let Some(h) = &lease.hostname {
            opts.insert(DhcpOption::Hostname(h.clone()));
        }
    }
    let to = if kind != MessageType::Nak && !msg.ciaddr().is_unspecified() {
        msg.ciaddr()
    } else {
        Ipv4Addr::BROADCAST
    };
    Some(Reply {
        bytes: reply.to_vec().ok()?,
        kind,
        to,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{Cidr, Dns, Mac};

    fn lease() -> Lease {
        Lease {
            mac: Mac::parse("02:11:22:33:44:55").unwrap(),
            address: Cidr::parse("10.0.2.2/24").unwrap(),
            gateway: Some("10.0.2.1".parse().unwrap()),
            server: "10.0.2.1".parse().unwrap(),
            dns: Dns {
                servers: vec!["10.96.0.10".parse().unwrap()],
                search: vec!["ns1.svc.cluster.local".into(), "cluster.local".into()],
            },
            mtu: 1450,
            hostname: Some("vm1".into()),
            lease_secs: u32::MAX,
        }
    }

    fn request(
        mac: [u8; 6],
        kind: MessageType,
        opts: Vec<DhcpOption>,
        ciaddr: Ipv4Addr,
    ) -> Vec<u8> {
        let mut m = Message::new_with_id(
            0x1234_5678,
            ciaddr,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::UNSPECIFIED,
            &mac,
        );
        m.opts_mut().insert(DhcpOption::MessageType(kind));
        for o in opts {
            m.opts_mut().insert(o);
        }
        m.to_vec().unwrap()
    }

    fn decode(r: &Reply) -> Message {
        Message::decode(&mut Decoder::new(&r.bytes)).unwrap()
    }

    /// A guest's request whose answer cannot be sent (here: to the broadcast address on a
    /// socket without SO_BROADCAST; in a pod, a REQUEST naming an unroutable `ciaddr`) must
    /// not end the server: the next request is still answered.
    #[test]
    fn an_answer_that_cannot_be_sent_does_not_stop_the_server() {
        let server = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = server.local_addr().unwrap();
        let l = lease();
        let serving = std::thread::spawn(move || crate::exec::serve_dhcp(&server, &l));
        let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let discover = request(
            lease().mac.0,
            MessageType::Discover,
            vec![],
            Ipv4Addr::UNSPECIFIED,
        );
        for _ in 0..3 {
            client.send_to(&discover, to).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        assert!(
            !serving.is_finished(),
            "the DHCP server ended after an answer it could not send: {:?}",
            serving.join()
        );
    }

    #[test]
    fn discover_gets_an_offer_of_the_planned_lease() {
        let l = lease();
        let r = answer(
            &request(
                l.mac.0,
                MessageType::Discover,
                vec![],
                Ipv4Addr::UNSPECIFIED,
            ),
            &l,
        )
        .unwrap();
        assert_eq!(r.kind, MessageType::Offer);
        assert_eq!(r.to, Ipv4Addr::BROADCAST);
        let m = decode(&r);
        assert_eq!(m.opcode(), Opcode::BootReply);
        assert_eq!(m.xid(), 0x1234_5678);
        assert_eq!(m.yiaddr().to_string(), "10.0.2.2");
        let o = m.opts();
        assert_eq!(
            o.get(OptionCode::SubnetMask),
            Some(&DhcpOption::SubnetMask("255.255.255.0".parse().unwrap()))
        );
        assert_eq!(
            o.get(OptionCode::Router),
            Some(&DhcpOption::Router(vec!["10.0.2.1".parse().unwrap()]))
        );
        assert_eq!(
            o.get(OptionCode::DomainNameServer),
            Some(&DhcpOption::DomainNameServer(vec![
                "10.96.0.10".parse().unwrap()
            ]))
        );
        assert_eq!(
            o.get(OptionCode::InterfaceMtu),
            Some(&DhcpOption::InterfaceMtu(1450))
        );
        assert_eq!(
            o.get(OptionCode::Hostname),
            Some(&DhcpOption::Hostname("vm1".into()))
        );
        assert_eq!(
            o.get(OptionCode::AddressLeaseTime),
            Some(&DhcpOption::AddressLeaseTime(u32::MAX))
        );
        assert!(o.get(OptionCode::DomainSearch).is_some());
    }

    #[test]
    fn request_for_our_address_is_acked_and_any_other_naked() {
        let l = lease();
        let ok = request(
            l.mac.0,
            MessageType::Request,
            vec![
                DhcpOption::RequestedIpAddress("10.0.2.2".parse().unwrap()),
                DhcpOption::ServerIdentifier(l.server),
            ],
            Ipv4Addr::UNSPECIFIED,
        );
        assert_eq!(answer(&ok, &l).unwrap().kind, MessageType::Ack);
        let stale = request(
            l.mac.0,
            MessageType::Request,
            vec![DhcpOption::RequestedIpAddress(
                "192.168.1.9".parse().unwrap(),
            )],
            Ipv4Addr::UNSPECIFIED,
        );
        let nak = answer(&stale, &l).unwrap();
        assert_eq!(nak.kind, MessageType::Nak);
        assert_eq!(decode(&nak).yiaddr(), Ipv4Addr::UNSPECIFIED);
        // Renewal: unicast back to the address it holds.
        let renew = request(
            l.mac.0,
            MessageType::Request,
            vec![],
            "10.0.2.2".parse().unwrap(),
        );
        let r = answer(&renew, &l).unwrap();
        assert_eq!(
            (r.kind, r.to.to_string().as_str()),
            (MessageType::Ack, "10.0.2.2")
        );
    }

    #[test]
    fn others_are_ignored() {
        let l = lease();
        let stranger = request(
            [2, 0, 0, 0, 0, 9],
            MessageType::Discover,
            vec![],
            Ipv4Addr::UNSPECIFIED,
        );
        assert_eq!(answer(&stranger, &l), None);
        let to_other = request(
            l.mac.0,
            MessageType::Request,
            vec![
                DhcpOption::RequestedIpAddress("10.0.2.2".parse().unwrap()),
                DhcpOption::ServerIdentifier("10.0.2.99".parse().unwrap()),
            ],
            Ipv4Addr::UNSPECIFIED,
        );
        assert_eq!(answer(&to_other, &l), None);
        let release = request(
            l.mac.0,
            MessageType::Release,
            vec![],
            "10.0.2.2".parse().unwrap(),
        );
        assert_eq!(answer(&release, &l), None);
        assert_eq!(answer(b"not dhcp", &l), None);
        assert_eq!(answer(&[], &l), None);
    }
}
