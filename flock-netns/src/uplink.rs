//! The node's uplink toward its BGP neighbor and its MTU: what a pod's interfaces take as
//! their MTU when the network configuration sets none. Found from the kernel's route to the
//! neighbor, never from an interface name pattern (a bond, a VLAN or a renamed link is
//! found the same way).

use std::net::IpAddr;

use futures::TryStreamExt;
use ipnet::IpNet;
use netlink_packet_route::route::RouteAttribute;

use crate::error::{Error, Result};
use crate::nl;
use crate::ns::NodeNs;

/// What the uplink is looked up by: the neighbor's address (the interface of the route to
/// it), or the interface of an unnumbered session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Toward<'a> {
    /// A neighbor's address.
    Address(IpAddr),
    /// An interface by name.
    Interface(&'a str),
}

/// The node's interface toward a neighbor, and its MTU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uplink {
    /// Its name.
    pub name: String,
    /// Its MTU.
    pub mtu: u32,
}

/// The uplink toward `toward` in the node's namespace; `None` when no route leads there (or
/// the interface does not exist).
pub async fn uplink(node: &NodeNs, toward: Toward<'_>) -> Result<Option<Uplink>> {
    let ns = node.name();
    let h = node.handle().await?;
    let link = match toward {
        Toward::Interface(name) => nl::link_by_name(&h, &ns, name).await?,
        Toward::Address(addr) => {
            let mut m = nl::base_message(IpNet::from(addr));
            // a lookup, not a listing: the kernel answers with the route it would take
            m.header.table = 0;
            let found: Option<_> = match h.route().get(m).execute().try_next().await {
                Ok(found) => found,
                // no route to it: ENETUNREACH / EHOSTUNREACH
                Err(e) if matches!(crate::error::nl_errno(&e), Some(101 | 113)) => None,
                Err(source) => return Err(Error::route("look up", addr.to_string(), &ns, source)),
            };
            let oif = found.and_then(|m| {
                m.attributes.iter().find_map(|a| match a {
                    RouteAttribute::Oif(i) => Some(*i),
                    _ => None,
                })
            });
            match oif {
                Some(index) => nl::link_by_index(&h, &ns, index).await?,
                None => None,
            }
        }
    };
    Ok(link.map(|l| Uplink {
        name: l.name,
        mtu: l.mtu,
    }))
}
