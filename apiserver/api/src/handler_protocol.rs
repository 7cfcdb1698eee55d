//! The virt-apiserver ↔ virt-handler protocol, declared once for both sides (and for the
//! plugin, which speaks the same websocket subprotocol and port-forward path): the port
//! virt-handler listens on, the websocket subprotocol of its streams, the paths it serves
//! below a VMI and the port-forward target in such a path. Pure data: no transport.

use std::fmt;

/// KubeVirt's websocket subprotocol of the console, VNC and port-forward streams (offered by
/// clients, echoed by servers).
pub const PLAIN_SUBPROTOCOL: &str = "plain.kubevirt.io";

/// virt-handler's mTLS port (KubeVirt's `defaultConsoleServerPort`).
pub const HANDLER_PORT: u16 = 8186;

/// The path of a VMI at virt-handler, with `{ns}` and `{name}` as axum captures them.
const VMI_ROUTE: &str = "/v1/namespaces/{ns}/virtualmachineinstances/{name}";

/// A VMI's action (`PUT`) or guest-agent read (`GET`): the catalogue's subresource name.
pub const ROUTE_SUBRESOURCE: &str = "{action}";
/// The serial console stream.
pub const ROUTE_CONSOLE: &str = "console";
/// The VNC stream.
pub const ROUTE_VNC: &str = "vnc";
/// One forwarded guest connection ([`ForwardTarget::path`]).
pub const ROUTE_PORTFORWARD: &str = "portforward/{port}/{protocol}";

/// Every route virt-handler serves below a VMI, as the tails [`route`] takes.
pub const VMI_ROUTES: [&str; 4] = [
    ROUTE_SUBRESOURCE,
    ROUTE_CONSOLE,
    ROUTE_VNC,
    ROUTE_PORTFORWARD,
];

/// The route virt-handler serves for `tail` (one of [`VMI_ROUTES`]), in axum's syntax.
pub fn route(tail: &str) -> String {
    format!("{VMI_ROUTE}/{tail}")
}

/// The path of a call on the VMI `name` in `ns` at virt-handler: `tail` is a subresource's
/// name (`pause`, `console`) or a [`ForwardTarget::path`]; `query` is passed on as given.
/// Names and namespaces are DNS labels or subdomains, so nothing needs escaping.
pub fn vmi_path(ns: &str, name: &str, tail: &str, query: Option<&str>) -> String {
    let mut p = format!("/v1/namespaces/{ns}/virtualmachineinstances/{name}/{tail}");
    if let Some(q) = query.filter(|q| !q.is_empty()) {
        p.push('?');
        p.push_str(q);
    }
    p
}

/// The transport of a forwarded port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForwardProtocol {
    Tcp,
    Udp,
}

impl ForwardProtocol {
    /// As in a path (`tcp`, `udp`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tcp => "tcp",
            Self::Udp => "udp",
        }
    }

    /// `tcp` or `udp` (lower case only, as KubeVirt's paths).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "tcp" => Some(Self::Tcp),
            "udp" => Some(Self::Udp),
            _ => None,
        }
    }
}

impl fmt::Display for ForwardProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A guest port number: 1-65535.
pub fn parse_port(s: &str) -> Option<u16> {
    s.parse::<u16>().ok().filter(|p| *p > 0)
}

/// Why a port-forward path's port or protocol was refused (a 400), in the words both
/// virt-apiserver and virt-handler answer with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ForwardTargetError {
    Port(String),
    Protocol(String),
}

impl fmt::Display for ForwardTargetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Port(p) => write!(f, "invalid port {p:?}: 1-65535"),
            Self::Protocol(p) => write!(f, "invalid protocol {p:?}: tcp or udp"),
        }
    }
}

impl std::error::Error for ForwardTargetError {}

/// The guest port a port-forward stream goes to: `portforward/{port}[/{protocol}]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForwardTarget {
    pub port: u16,
    pub protocol: ForwardProtocol,
}

impl ForwardTarget {
    /// Checks a path's port and protocol (tcp when absent).
    pub fn parse(port: &str, protocol: Option<&str>) -> Result<Self, ForwardTargetError> {
        let port = parse_port(port).ok_or_else(|| ForwardTargetError::Port(port.into()))?;
        let protocol = match protocol {
            None => ForwardProtocol::Tcp,
            Some(p) => {
                ForwardProtocol::parse(p).ok_or_else(|| ForwardTargetError::Protocol(p.into()))?
            }
        };
        Ok(Self { port, protocol })
    }

    /// The path tail after the VMI (`portforward/22/tcp`), for virt-handler's
    /// [`ROUTE_PORTFORWARD`] and the `portforward` subresource (`sub` is its name).
    pub fn path(&self, sub: &str) -> String {
        format!("{sub}/{}", self.params())
    }

    /// The path segments after the subresource's name: `22/tcp`.
    pub fn params(&self) -> String {
        format!("{}/{}", self.port, self.protocol)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalogue;

    /// Whether `path` matches axum route `pattern` (a `{capture}` is one segment).
    fn matches(pattern: &str, path: &str) -> bool {
        let (p, s): (Vec<&str>, Vec<&str>) =
            (pattern.split('/').collect(), path.split('/').collect());
        p.len() == s.len()
            && p.iter()
                .zip(&s)
                .all(|(p, s)| p == s || (p.starts_with('{') && p.ends_with('}') && !s.is_empty()))
    }

    /// Every path virt-apiserver builds for a catalogued VMI subresource is served by
    /// exactly the route virt-handler has for it.
    #[test]
    fn apiserver_paths_hit_the_handlers_routes() {
        let served = |path: &str| -> Vec<&str> {
            let path = path.split('?').next().unwrap_or_default();
            VMI_ROUTES
                .into_iter()
                .filter(|t| matches(&route(t), path))
                .collect()
        };
        for a in catalogue::VMI_ACTIONS {
            let p = vmi_path("ns", "a", a.subresource.name, None);
            assert_eq!(served(&p), [ROUTE_SUBRESOURCE], "{p}");
        }
        for r in catalogue::VMI_READS {
            let p = vmi_path("ns", "a", r.subresource.name, None);
            assert_eq!(served(&p), [ROUTE_SUBRESOURCE], "{p}");
        }
        let console = vmi_path("ns", "a", catalogue::CONSOLE.name, Some("x=1"));
        assert_eq!(
            console,
            "/v1/namespaces/ns/virtualmachineinstances/a/console?x=1"
        );
        assert!(served(&console).contains(&ROUTE_CONSOLE));
        let vnc = vmi_path("ns", "a", catalogue::VNC.name, Some(""));
        assert!(served(&vnc).contains(&ROUTE_VNC));
        let t = ForwardTarget::parse("53", Some("udp")).expect("valid");
        let pf = vmi_path("ns", "a", &t.path(catalogue::PORTFORWARD_VMI.name), None);
        assert_eq!(
            pf,
            "/v1/namespaces/ns/virtualmachineinstances/a/portforward/53/udp"
        );
        assert_eq!(served(&pf), [ROUTE_PORTFORWARD]);
    }

    #[test]
    fn forward_targets_name_a_port_and_a_protocol() {
        let ok =
            |port, protocol| ForwardTarget::parse(port, protocol).map(|t| t.path("portforward"));
        assert_eq!(ok("22", None).as_deref(), Ok("portforward/22/tcp"));
        assert_eq!(
            ok("8080", Some("tcp")).as_deref(),
            Ok("portforward/8080/tcp")
        );
        assert_eq!(
            ok("65535", Some("udp")).as_deref(),
            Ok("portforward/65535/udp")
        );
        let err = |port, protocol| {
            ForwardTarget::parse(port, protocol)
                .err()
                .map(|e| e.to_string())
        };
        for bad in ["0", "65536", "ssh", "", "-1"] {
            assert_eq!(
                err(bad, None),
                Some(format!("invalid port {bad:?}: 1-65535"))
            );
        }
        for bad in ["sctp", "UDP", ""] {
            assert_eq!(
                err("22", Some(bad)),
                Some(format!("invalid protocol {bad:?}: tcp or udp"))
            );
        }
        // The port is checked first, as both servers always did.
        assert!(matches!(
            ForwardTarget::parse("0", Some("sctp")),
            Err(ForwardTargetError::Port(_))
        ));
        assert_eq!(parse_port("1"), Some(1));
        assert_eq!(ForwardProtocol::parse("udp"), Some(ForwardProtocol::Udp));
    }
}
