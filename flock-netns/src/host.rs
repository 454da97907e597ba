//! Node-wide state: anycast nexthop sets, blackholes, and the inventory of
//! `flock*` links and routes for start-up reconciliation.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv6Addr};

use ipnet::IpNet;

use crate::error::Result;
use crate::nl;
use std::path::PathBuf;

use crate::Error;
use crate::ns::{NlConn, NodeNs};
use crate::pod::{HOST_IF_PREFIX, program_anycast};

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
    let set: BTreeMap<String, Option<Ipv6Addr>> = members
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

/// Installs a blackhole route for each CIDR (replace: idempotent).
pub async fn ensure_blackholes(node: &NodeNs, cidrs: &[IpNet]) -> Result<()> {
    let h = node.handle().await?;
    let ns = node.name();
    for c in cidrs {
        nl::blackhole_replace(&h, &ns, c.trunc()).await?;
    }
    Ok(())
}

/// Removes the blackhole route for `cidr`; absent = done.
pub async fn remove_blackhole(node: &NodeNs, cidr: IpNet) -> Result<()> {
    let h = node.handle().await?;
    nl::blackhole_del(&h, &node.name(), cidr.trunc()).await
}

/// A `flock*` link of the node's namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostIface {
    /// `flockXXXXXXXX`.
    pub name: String,
    /// Interface index.
    pub index: u32,
    /// MAC address.
    pub mac: String,
    /// Administratively up.
    pub up: bool,
    /// MTU.
    pub mtu: u32,
}

/// Every `flock*` link of the node's namespace.
pub async fn list_host_ifaces(node: &NodeNs) -> Result<Vec<HostIface>> {
    let h = node.handle().await?;
    let mut out: Vec<HostIface> = nl::links(&h, &node.name())
        .await?
        .into_iter()
        .filter(|l| l.name.starts_with(HOST_IF_PREFIX))
        .map(|l| HostIface {
            name: l.name,
            index: l.index,
            mac: l.mac,
            up: l.up,
            mtu: l.mtu,
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// A main-table route of the node whose nexthops include a `flock*` link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRoute {
    /// Destination.
    pub dst: IpNet,
    /// The `flock*` links among its nexthops.
    pub host_ifs: Vec<String>,
    /// Total number of nexthops (ECMP routes have more than one).
    pub nexthops: usize,
}

/// Every route whose nexthops include a `flock*` link (except the ones the
/// kernel derives from addresses, such as `fe80::/64`).
pub async fn host_routes(node: &NodeNs) -> Result<Vec<HostRoute>> {
    let h = node.handle().await?;
    let ns = node.name();
    let links = nl::links(&h, &ns).await?;
    let routes = nl::main_routes(&h, &ns).await?;
    let mut out = Vec::new();
    for r in routes.into_iter().filter(|r| !r.kernel) {
        let mut host_ifs: Vec<String> = r
            .nexthops
            .iter()
            .filter_map(|(idx, _)| links.iter().find(|l| l.index == *idx))
            .filter(|l| l.name.starts_with(HOST_IF_PREFIX))
            .map(|l| l.name.clone())
            .collect();
        if host_ifs.is_empty() {
            continue;
        }
        host_ifs.sort();
        out.push(HostRoute {
            dst: r.dst,
            host_ifs,
            nexthops: r.nexthops.len(),
        });
    }
    out.sort_by_key(|r| r.dst);
    Ok(out)
}

/// Deletes a host link by name (its pod end and its routes go with it);
/// absent = done. Returns whether it existed.
pub async fn remove_host_iface(node: &NodeNs, name: &str) -> Result<bool> {
    // The kernel answers a veth deletion only after an RCU grace period (tens of
    // milliseconds), inside the `sendmsg` of the netlink socket: whichever thread drives that
    // socket is stuck for as long. So the deletion gets a socket and a thread of its own, and
    // neither the node's shared connection nor the caller's runtime workers wait for it.
    let target = node.target().clone();
    let ns = node.name();
    let name = name.to_owned();
    let path = PathBuf::from(target.describe());
    let thread_error = move |source| Error::NetnsThread {
        path: path.clone(),
        source,
    };
    let in_thread_error = thread_error.clone();
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("flock-linkdel".to_owned())
        .spawn(move || {
            let result = tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .build()
                .map_err(in_thread_error)
                .and_then(|rt| {
                    rt.block_on(async {
                        let conn = NlConn::open(&target).await?;
                        match nl::link_by_name(&conn.handle, &ns, &name).await? {
                            Some(l) => nl::link_del(&conn.handle, &ns, l.index, &name).await,
                            None => Ok(false),
                        }
                    })
                });
            let _ = tx.send(result);
        })
        .map_err(&thread_error)?;
    rx.await.unwrap_or_else(|_| {
        Err(thread_error(std::io::Error::other(
            "the link deletion thread ended without an answer",
        )))
    })
}
