//! Anycast routes: one route per anycast address whose nexthops are every local pod that
//! carries it (DESIGN §5), and the per-node registry of those nexthop sets.

use std::collections::{BTreeMap, HashMap, hash_map::Entry};
use std::net::{IpAddr, Ipv6Addr};

use ipnet::IpNet;
use rtnetlink::Handle;

use crate::error::{Error, Result};
use crate::host::HOST_IF_PREFIX;
use crate::nl::{self, KRoute};
use crate::ns::NodeNs;

/// Host veth → the pod's IPv6 address (the gateway of its IPv6 nexthop).
pub(crate) type Members = BTreeMap<String, Option<Ipv6Addr>>;

/// One local pod carrying an anycast address.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AnycastMember {
    /// The pod's host veth (`flockXXXXXXXX`).
    pub host_if: String,
    /// The pod's IPv6 address: the gateway of its IPv6 nexthop (the kernel
    /// refuses device-only IPv6 multipath nexthops). Needed for an IPv6
    /// anycast address, ignored for IPv4.
    pub pod_ip6: Option<Ipv6Addr>,
}

/// Sets the whole nexthop set of anycast address `addr` to `members`
/// (members whose veth does not exist are skipped); an empty set deletes
/// the route. Serialised with setup and teardown of this [`NodeNs`].
pub async fn sync_anycast(node: &NodeNs, addr: IpAddr, members: &[AnycastMember]) -> Result<()> {
    let h = node.handle().await?;
    let ns = node.name();
    let mut registry = node.anycast.lock().await;
    let set: Members = members
        .iter()
        .map(|m| (m.host_if.clone(), m.pod_ip6))
        .collect();
    program_anycast(&h, &ns, addr, &set).await?;
    if set.is_empty() {
        registry.remove(&addr);
    } else {
        registry.insert(addr, set);
    }
    Ok(())
}

/// The registry entry for `addr`, seeded from the kernel's current route on
/// first use (so an agent restart picks up what is installed): flock's own route
/// (`proto static`), and of it only the nexthops on pods' host veths. A node also learns
/// the address from the fabric, where other nodes' pods announce it: BIRD's route to it
/// through the uplink is not a member, and taken for one it became a nexthop that sent
/// part of the anycast traffic arriving at the node back out (for IPv4, to an ARP on the
/// uplink that nobody answers).
pub(crate) async fn member_set<'a>(
    h: &Handle,
    ns: &str,
    registry: &'a mut HashMap<IpAddr, Members>,
    addr: IpAddr,
) -> Result<&'a mut Members> {
    let vacant = match registry.entry(addr) {
        Entry::Occupied(o) => return Ok(o.into_mut()),
        Entry::Vacant(v) => v,
    };
    let dst = IpNet::from(addr);
    let routes = nl::main_routes(h, ns).await?;
    let links = nl::links(h, ns).await?;
    let mut seeded = BTreeMap::new();
    if let Some(r) = routes
        .iter()
        .find(|r| r.dst == dst && r.static_proto && is_unicast(r))
    {
        for (idx, gw) in &r.nexthops {
            if let Some(l) = links
                .iter()
                .find(|l| l.index == *idx && l.name.starts_with(HOST_IF_PREFIX))
            {
                let gw6 = match gw {
                    Some(IpAddr::V6(g)) => Some(*g),
                    _ => None,
                };
                seeded.insert(l.name.clone(), gw6);
            }
        }
    }
    Ok(vacant.insert(seeded))
}

/// Whether a kernel route is an ordinary unicast route (not a blackhole, local, …).
pub(crate) fn is_unicast(r: &KRoute) -> bool {
    r.kind == netlink_packet_route::route::RouteType::Unicast
}

/// Installs the route for `addr` over `members` (skipping links that no
/// longer exist); no member left = no route.
pub(crate) async fn program_anycast(
    h: &Handle,
    ns: &str,
    addr: IpAddr,
    members: &Members,
) -> Result<()> {
    let links = nl::links(h, ns).await?;
    let mut hops = Vec::new();
    for (name, gw6) in members {
        let Some(l) = links.iter().find(|l| &l.name == name) else {
            continue;
        };
        let gw = match addr {
            IpAddr::V4(_) => None,
            IpAddr::V6(_) => match gw6 {
                Some(g) => Some(IpAddr::V6(*g)),
                None => {
                    return Err(Error::AnycastNeedsIpv6 {
                        addr,
                        host_if: name.clone(),
                    });
                }
            },
        };
        hops.push((l.index, name.clone(), gw));
    }
    nl::multipath_replace(h, ns, IpNet::from(addr), &hops).await
}
