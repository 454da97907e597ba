//! CHECK: a pod's kernel state against what its [`PodSpec`] says it should be. [`check`]
//! reads both namespaces into an [`Observed`] snapshot; [`diff`] decides, over that plain
//! data, every difference as a [`Mismatch`] (so its tests need no root).

use std::net::IpAddr;
use std::path::PathBuf;

use ipnet::IpNet;

use crate::anycast::is_unicast;
use crate::error::Result;
use crate::nl::{self, Addr, KRoute, Link, RouteSpec};
use crate::ns::{NlConn, NodeNs, NsTarget, Sysctl, read_sysctl, run_in};
use crate::pod::{GATEWAY6, PodSpec, gateway4_net, host_sysctls, ns_name};

/// Which namespace a [`Mismatch`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// The node's namespace (host veth, host routes).
    Host,
    /// The pod's namespace.
    Pod,
}

impl std::fmt::Display for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Side::Host => "host",
            Side::Pod => "pod",
        })
    }
}

/// One difference between the kernel and what a pod should have.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mismatch {
    /// The pod's namespace file does not exist.
    NetnsMissing {
        /// The path.
        path: PathBuf,
    },
    /// An interface is missing.
    LinkMissing {
        /// Where.
        side: Side,
        /// Which.
        ifname: String,
    },
    /// An interface is administratively down.
    LinkDown {
        /// Where.
        side: Side,
        /// Which.
        ifname: String,
    },
    /// An interface has the wrong MTU.
    Mtu {
        /// Where.
        side: Side,
        /// Which.
        ifname: String,
        /// Wanted.
        expected: u32,
        /// Found.
        actual: u32,
    },
    /// An address is missing from an interface.
    AddressMissing {
        /// Where.
        side: Side,
        /// Which interface.
        ifname: String,
        /// Which address.
        addr: IpNet,
    },
    /// An interface carries an address it should not.
    AddressExtra {
        /// Where.
        side: Side,
        /// Which interface.
        ifname: String,
        /// Which address.
        addr: IpNet,
    },
    /// A route is missing (or goes elsewhere).
    RouteMissing {
        /// Where.
        side: Side,
        /// The route that should be there.
        route: RouteSpec,
    },
    /// The anycast route lacks this pod's nexthop.
    AnycastNexthopMissing {
        /// The anycast address.
        addr: IpAddr,
        /// The pod's host veth.
        host_if: String,
    },
    /// A sysctl has the wrong value.
    Sysctl {
        /// Where.
        side: Side,
        /// Path under `/proc/sys`.
        path: String,
        /// Wanted.
        expected: String,
        /// Found (or the read error).
        actual: String,
    },
}

impl std::fmt::Display for Mismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mismatch::NetnsMissing { path } => {
                write!(f, "network namespace {} is missing", path.display())
            }
            Mismatch::LinkMissing { side, ifname } => {
                write!(f, "{side} interface {ifname} is missing")
            }
            Mismatch::LinkDown { side, ifname } => write!(f, "{side} interface {ifname} is down"),
            Mismatch::Mtu {
                side,
                ifname,
                expected,
                actual,
            } => write!(
                f,
                "{side} interface {ifname} has mtu {actual}, expected {expected}"
            ),
            Mismatch::AddressMissing { side, ifname, addr } => {
                write!(f, "address {addr} is missing on {side} interface {ifname}")
            }
            Mismatch::AddressExtra { side, ifname, addr } => {
                write!(f, "unexpected address {addr} on {side} interface {ifname}")
            }
            Mismatch::RouteMissing { side, route } => {
                write!(f, "{side} route {route} is missing")
            }
            Mismatch::AnycastNexthopMissing { addr, host_if } => {
                write!(f, "anycast route {addr} has no nexthop via {host_if}")
            }
            Mismatch::Sysctl {
                side,
                path,
                expected,
                actual,
            } => write!(f, "{side} sysctl {path} is {actual}, expected {expected}"),
        }
    }
}

/// What CHECK read of one pod attachment, for [`diff`].
#[derive(Debug, Clone, Default)]
pub(crate) struct Observed {
    /// The host veth; `None`: no such link.
    pub(crate) host: Option<HostObserved>,
    /// The host's `lo` addresses (the IPv4 gateway lives there), read only when the pod has
    /// IPv4; `Some(None)`: no `lo`.
    pub(crate) host_lo: Option<Option<Vec<Addr>>>,
    /// The host's main routing table.
    pub(crate) host_routes: Vec<KRoute>,
    /// The pod's side; `None`: its network namespace is gone.
    pub(crate) pod: Option<PodObserved>,
}

/// The host veth as CHECK read it.
#[derive(Debug, Clone)]
pub(crate) struct HostObserved {
    /// The link.
    pub(crate) link: Link,
    /// Its addresses.
    pub(crate) addrs: Vec<Addr>,
    /// Each sysctl it needs, with the value read (or why it could not be).
    pub(crate) sysctls: Vec<(Sysctl, String)>,
}

/// The pod's side of what CHECK read.
#[derive(Debug, Clone, Default)]
pub(crate) struct PodObserved {
    /// The pod's interface and its addresses; `None`: no such link.
    pub(crate) link: Option<(Link, Vec<Addr>)>,
    /// The pod's main routing table.
    pub(crate) routes: Vec<KRoute>,
    /// The pod's `lo` addresses, read only when an anycast address is missing from its
    /// interface ([`lo_needed`]).
    pub(crate) lo: Vec<Addr>,
}

/// Compares both namespaces with what `spec` should have; an empty list
/// means the pod is intact. `Err` only when the kernel could not be read.
pub async fn check(node: &NodeNs, spec: &PodSpec) -> Result<Vec<Mismatch>> {
    Ok(diff(spec, &observe(node, spec).await?))
}

/// Reads what [`diff`] compares.
async fn observe(node: &NodeNs, spec: &PodSpec) -> Result<Observed> {
    let host_if = spec.host_if.clone();
    let nodename = node.name();
    let h = node.handle().await?;
    let mut seen = Observed {
        host_routes: nl::main_routes(&h, &nodename).await?,
        ..Observed::default()
    };
    if let Some(link) = nl::link_by_name(&h, &nodename, &host_if).await? {
        let addrs = nl::addrs(&h, &nodename, link.index, &host_if).await?;
        let sysctls = host_sysctls(&host_if);
        let ns = nodename.clone();
        let values = run_in(&node.target, move || {
            Ok(sysctls
                .into_iter()
                .map(|s| {
                    let v = read_sysctl(&ns, &s.path).unwrap_or_else(|e| e.to_string());
                    (s, v)
                })
                .collect::<Vec<_>>())
        })
        .await?;
        seen.host = Some(HostObserved {
            link,
            addrs,
            sysctls: values,
        });
    }
    if spec.has_v4() {
        seen.host_lo = Some(match nl::link_by_name(&h, &nodename, "lo").await? {
            Some(lo) => Some(nl::addrs(&h, &nodename, lo.index, "lo").await?),
            None => None,
        });
    }
    if !spec.netns.exists() {
        return Ok(seen);
    }
    let podname = ns_name(&spec.netns);
    let pod = NlConn::open(&NsTarget::Path(spec.netns.clone())).await?;
    let p = &pod.handle;
    let mut pod_seen = PodObserved::default();
    if let Some(link) = nl::link_by_name(p, &podname, &spec.if_name).await? {
        let addrs = nl::addrs(p, &podname, link.index, &spec.if_name).await?;
        pod_seen.routes = nl::main_routes(p, &podname).await?;
        if lo_needed(spec, &addrs)
            && let Some(lo) = nl::link_by_name(p, &podname, "lo").await?
        {
            pod_seen.lo = nl::addrs(p, &podname, lo.index, "lo").await?;
        }
        pod_seen.link = Some((link, addrs));
    }
    seen.pod = Some(pod_seen);
    Ok(seen)
}

/// Whether an anycast address of `spec` is missing from the pod's interface (`addrs`), so
/// that CHECK looks for it on `lo`, where agents before 0.2 put them.
fn lo_needed(spec: &PodSpec, addrs: &[Addr]) -> bool {
    spec.anycast
        .iter()
        .any(|a| !addrs.iter().any(|x| x.net == IpNet::from(*a)))
}

/// Every difference between `spec` and what was `seen`, host side first.
pub(crate) fn diff(spec: &PodSpec, seen: &Observed) -> Vec<Mismatch> {
    let mut out = Vec::new();
    let host_if = &spec.host_if;
    match &seen.host {
        None => out.push(Mismatch::LinkMissing {
            side: Side::Host,
            ifname: host_if.clone(),
        }),
        Some(HostObserved {
            link,
            addrs,
            sysctls,
        }) => {
            link_state(&mut out, Side::Host, link, spec.mtu);
            let gw6 = IpNet::new(IpAddr::V6(GATEWAY6), 64).expect("64 is a valid prefix");
            addr_diff(&mut out, Side::Host, host_if, &[gw6], addrs, false);
            for (s, v) in sysctls {
                if *v != s.want {
                    out.push(Mismatch::Sysctl {
                        side: Side::Host,
                        path: s.path.clone(),
                        expected: s.want.to_owned(),
                        actual: v.clone(),
                    });
                }
            }
        }
    }
    match &seen.host_lo {
        Some(Some(addrs)) if !addrs.iter().any(|a| a.net == gateway4_net()) => {
            out.push(Mismatch::AddressMissing {
                side: Side::Host,
                ifname: "lo".to_owned(),
                addr: gateway4_net(),
            });
        }
        Some(None) => out.push(Mismatch::LinkMissing {
            side: Side::Host,
            ifname: "lo".to_owned(),
        }),
        _ => {}
    }
    let host_index = seen.host.as_ref().map(|h| h.link.index);
    for r in spec.host_routes() {
        let ok = host_index.is_some_and(|idx| {
            seen.host_routes
                .iter()
                .any(|k| k.dst == r.dst && is_unicast(k) && k.nexthops == vec![(idx, None)])
        });
        if !ok {
            out.push(Mismatch::RouteMissing {
                side: Side::Host,
                route: r,
            });
        }
    }
    for a in &spec.anycast {
        let dst = IpNet::from(*a);
        let ok = host_index.is_some_and(|idx| {
            seen.host_routes
                .iter()
                .any(|k| k.dst == dst && k.nexthops.iter().any(|(i, _)| *i == idx))
        });
        if !ok {
            out.push(Mismatch::AnycastNexthopMissing {
                addr: *a,
                host_if: host_if.clone(),
            });
        }
    }

    let Some(pod) = &seen.pod else {
        out.push(Mismatch::NetnsMissing {
            path: spec.netns.clone(),
        });
        return out;
    };
    let Some((peer, have)) = &pod.link else {
        out.push(Mismatch::LinkMissing {
            side: Side::Pod,
            ifname: spec.if_name.clone(),
        });
        return out;
    };
    link_state(&mut out, Side::Pod, peer, spec.mtu);
    // Anycast addresses are checked on their own below.
    let anycast: Vec<IpNet> = spec.anycast.iter().map(|a| IpNet::from(*a)).collect();
    let (anycast_here, have): (Vec<Addr>, Vec<Addr>) =
        have.iter().cloned().partition(|a| anycast.contains(&a.net));
    addr_diff(
        &mut out,
        Side::Pod,
        &spec.if_name,
        &spec.addresses,
        &have,
        true,
    );
    for r in spec.pod_routes() {
        let ok = pod.routes.iter().any(|k| {
            k.dst == r.dst && is_unicast(k) && k.nexthops == vec![(peer.index, r.gateway)]
        });
        if !ok {
            out.push(Mismatch::RouteMissing {
                side: Side::Pod,
                route: r,
            });
        }
    }
    // Anycast addresses belong on the pod's interface; one on `lo` (where agents before 0.2
    // put them) still counts, so a pod set up by an older agent passes CHECK.
    for net in anycast {
        if !anycast_here.iter().any(|a| a.net == net) && !pod.lo.iter().any(|a| a.net == net) {
            out.push(Mismatch::AddressMissing {
                side: Side::Pod,
                ifname: spec.if_name.clone(),
                addr: net,
            });
        }
    }
    out
}

fn link_state(out: &mut Vec<Mismatch>, side: Side, link: &Link, mtu: u32) {
    if !link.up {
        out.push(Mismatch::LinkDown {
            side,
            ifname: link.name.clone(),
        });
    }
    if link.mtu != mtu {
        out.push(Mismatch::Mtu {
            side,
            ifname: link.name.clone(),
            expected: mtu,
            actual: link.mtu,
        });
    }
}

fn addr_diff(
    out: &mut Vec<Mismatch>,
    side: Side,
    ifname: &str,
    want: &[IpNet],
    have: &[Addr],
    ignore_link_local: bool,
) {
    for w in want {
        if !have.iter().any(|h| h.net == *w) {
            out.push(Mismatch::AddressMissing {
                side,
                ifname: ifname.to_owned(),
                addr: *w,
            });
        }
    }
    for h in have {
        let link_local = matches!(h.net.addr(), IpAddr::V6(a) if a.is_unicast_link_local());
        if ignore_link_local && link_local {
            continue;
        }
        if !want.contains(&h.net) {
            out.push(Mismatch::AddressExtra {
                side,
                ifname: ifname.to_owned(),
                addr: h.net,
            });
        }
    }
}

#[cfg(test)]
mod tests;
