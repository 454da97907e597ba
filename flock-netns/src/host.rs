//! The node's side of pods: host veth names, the inventory of `flock*` links and
//! routes for start-up reconciliation, link removal, and the node CIDRs' blackholes.

use std::path::PathBuf;

use ipnet::IpNet;

use crate::error::{Error, Result};
use crate::nl;
use crate::ns::{NlConn, NodeNs};

/// Every host veth's name starts with this.
pub const HOST_IF_PREFIX: &str = "flock";

/// A host veth name for the attachment (`container_id`, `if_name`): `flock` + 8 hex digits
/// (13 characters, within the kernel's 15) of FNV-1a 32 over the container ID's bytes, a 0
/// byte, and the interface name's bytes (DESIGN §5) — so two attachments of one container
/// (two networks, Multus) get two veths.
///
/// `attempt` 0 is that name. When it is taken by another attachment (a hash collision), the
/// caller asks for attempt 1, 2, …: each mixes a further 0 byte and the attempt's four
/// big-endian bytes into the hash, giving another name of the same form. The caller records
/// the name it chose and passes it in [`PodSpec::host_if`](crate::PodSpec::host_if); nothing
/// recomputes it.
///
/// ```
/// use flock_netns::host_ifname;
/// let eth0 = host_ifname("0123abcd", "eth0", 0);
/// assert_eq!(eth0.len(), 13);
/// assert!(eth0.starts_with("flock"));
/// assert_ne!(eth0, host_ifname("0123abcd", "net1", 0));
/// assert_ne!(eth0, host_ifname("0123abcd", "eth0", 1));
/// ```
pub fn host_ifname(container_id: &str, if_name: &str, attempt: u32) -> String {
    let mut bytes: Vec<u8> = Vec::with_capacity(container_id.len() + if_name.len() + 6);
    bytes.extend_from_slice(container_id.as_bytes());
    bytes.push(0);
    bytes.extend_from_slice(if_name.as_bytes());
    if attempt > 0 {
        bytes.push(0);
        bytes.extend_from_slice(&attempt.to_be_bytes());
    }
    format!("{HOST_IF_PREFIX}{:08x}", fnv1a32(&bytes))
}

/// FNV-1a 32.
fn fnv1a32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(0x811c_9dc5, |hash: u32, b| {
        (hash ^ u32::from(*b)).wrapping_mul(0x0100_0193)
    })
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
