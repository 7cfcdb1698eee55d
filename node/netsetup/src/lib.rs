//! The guest's network on the pod network (issue 16), in three parts:
//!
//! - [`plan`]: pure — the VMI's pod interface and the pod's addresses in, the bridge, tap,
//!   nftables rules and DHCP lease out;
//! - [`dhcp`]: pure — a DHCP request in, the answer for the guest's lease out;
//! - [`exec`]: the side effects — the plan realised inside a pod's network namespace (with
//!   `ip` and `nft`, run in that namespace), undone on failure and on teardown, and the
//!   DHCP socket opened there;
//! - [`handoff`]: the ready plan and the DHCP socket passed from virt-handler to the
//!   launcher.
//!
//! virt-handler, the only privileged component on a node, runs [`exec`]; the launcher only
//! ever receives the tap (owned by QEMU's uid) and the DHCP socket.

pub mod dhcp;
pub mod exec;
pub mod handoff;
pub mod plan;

pub use plan::{
    Binding, Cidr, Dns, Lease, Mac, NetworkPlan, PlanError, PlanInput, PodInterface, plan,
};
