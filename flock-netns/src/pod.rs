//! One pod's layout (DESIGN §5): setup, teardown, check.

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::AsRawFd;
use std::path::PathBuf;

use ipnet::IpNet;
use netlink_packet_route::link::{InfoData, InfoKind, InfoVeth};
use rtnetlink::{Handle, LinkMessageBuilder, LinkUnspec, LinkVeth};

use crate::anycast::{member_set, program_anycast};
use crate::error::{Error, Result, TeardownError};
use crate::host::{HOST_IF_PREFIX, remove_host_iface};
use crate::nl::{self, AddrKind, Link, RouteSpec};
use crate::ns::{NlConn, NodeNs, NsTarget, Sysctl, ensure_sysctls, run_in};

const EEXIST: i32 = 17;

/// The host side's IPv6 gateway address (`fe80::1/64` on every host veth).
pub const GATEWAY6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
/// The IPv4 gateway the pod routes through (answered by `proxy_arp`).
pub const GATEWAY4: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);

/// Everything the kernel layout of one pod attachment depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSpec {
    /// The container (sandbox) ID.
    pub container_id: String,
    /// The host veth's name, chosen by the caller — normally
    /// [`host_ifname`](crate::host_ifname)`(container_id, if_name, attempt)` with the first
    /// attempt no other attachment owns — and recorded with the attachment, so that check
    /// and teardown act on exactly this link and never recompute it. It must start with
    /// [`HOST_IF_PREFIX`] (start-up reconciliation lists host veths by it).
    ///
    /// The link of this name belongs to this attachment: [`setup`] replaces a stale one
    /// whose peer is not this pod's interface, [`teardown`] deletes it.
    pub host_if: String,
    /// The pod's network namespace file (`CNI_NETNS`).
    pub netns: PathBuf,
    /// The pod's interface name (`CNI_IFNAME`, normally `eth0`).
    pub if_name: String,
    /// MTU of both veth ends.
    pub mtu: u32,
    /// Addresses on the pod interface: the pod's /128 and /32 and the
    /// `addresses` annotation's entries. Each also gets a host route
    /// (`/128` or `/32`) to the host veth.
    pub addresses: Vec<IpNet>,
    /// Anycast addresses: on the pod's `lo`, routed by one ECMP host route
    /// per address over every local pod carrying it.
    pub anycast: Vec<IpAddr>,
    /// Whether the pod's default routes go through this interface: true for the cluster
    /// network's attachment, false for a secondary network's, which routes only [`routes`]
    /// (two attachments with default routes replace each other's, and the last one wins).
    ///
    /// [`routes`]: PodSpec::routes
    pub default_route: bool,
    /// Destinations routed through this interface besides the default routes: a secondary
    /// network's address space. Each goes via the gateway of its family (`fe80::1`, or
    /// `169.254.1.1` on-link, so no link route to the gateway is needed on this interface:
    /// the cluster network's interface holds that one). Only those of the pod's families
    /// are installed.
    pub routes: Vec<IpNet>,
}

impl PodSpec {
    fn has_v6(&self) -> bool {
        self.addresses.iter().any(|a| a.addr().is_ipv6())
    }

    pub(crate) fn has_v4(&self) -> bool {
        self.addresses.iter().any(|a| a.addr().is_ipv4())
    }

    fn first_v6(&self) -> Option<Ipv6Addr> {
        self.addresses.iter().find_map(|a| match a.addr() {
            IpAddr::V6(x) => Some(x),
            IpAddr::V4(_) => None,
        })
    }

    fn validate(&self) -> Result<()> {
        validate_ifname(&self.if_name)?;
        validate_ifname(&self.host_if)?;
        if !self.host_if.starts_with(HOST_IF_PREFIX) {
            return Err(Error::InvalidIfName {
                ifname: self.host_if.clone(),
                reason: "a host veth name must start with \"flock\"",
            });
        }
        if let Some(addr) = self.anycast.iter().find(|a| a.is_ipv6())
            && !self.has_v6()
        {
            return Err(Error::AnycastNeedsIpv6 {
                addr: *addr,
                host_if: self.host_if.clone(),
            });
        }
        Ok(())
    }

    /// The pod's routes (only for the families it has addresses of): the default routes when
    /// it has them, and [`PodSpec::routes`].
    pub fn pod_routes(&self) -> Vec<RouteSpec> {
        let dev = self.if_name.clone();
        let mut out = Vec::new();
        let via = |dst: IpNet, onlink: bool| RouteSpec {
            dst,
            gateway: Some(match dst {
                IpNet::V6(_) => IpAddr::V6(GATEWAY6),
                IpNet::V4(_) => IpAddr::V4(GATEWAY4),
            }),
            dev: dev.clone(),
            onlink,
        };
        if self.default_route {
            if self.has_v6() {
                out.push(via(IpNet::V6(Default::default()), false));
            }
            if self.has_v4() {
                out.push(RouteSpec {
                    dst: IpNet::from(IpAddr::V4(GATEWAY4)),
                    gateway: None,
                    dev: dev.clone(),
                    onlink: false,
                });
                out.push(via(IpNet::V4(Default::default()), false));
            }
        }
        for dst in &self.routes {
            match dst {
                IpNet::V6(_) if self.has_v6() => out.push(via(*dst, false)),
                IpNet::V4(_) if self.has_v4() => out.push(via(*dst, !self.default_route)),
                _ => {}
            }
        }
        out
    }

    /// The host routes (`<addr>/128|/32 dev flockXXXXXXXX`).
    pub fn host_routes(&self) -> Vec<RouteSpec> {
        let dev = self.host_if.clone();
        self.addresses
            .iter()
            .map(|a| RouteSpec {
                dst: IpNet::from(a.addr()),
                gateway: None,
                dev: dev.clone(),
                onlink: false,
            })
            .collect()
    }
}

/// Whether `name` can be a Linux interface name.
fn validate_ifname(name: &str) -> Result<()> {
    let bad = |reason| {
        Err(Error::InvalidIfName {
            ifname: name.to_owned(),
            reason,
        })
    };
    if name.is_empty() {
        return bad("empty");
    }
    if name.len() > 15 {
        return bad("longer than 15 bytes");
    }
    if name == "." || name == ".." {
        return bad("reserved name");
    }
    if name
        .bytes()
        .any(|b| b == b'/' || b == b':' || b.is_ascii_whitespace())
    {
        return bad("contains '/', ':' or whitespace");
    }
    Ok(())
}

/// What a setup built: what the CNI result reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetupOutcome {
    /// Host veth name.
    pub host_if: String,
    /// Host veth MAC (`aa:bb:cc:dd:ee:ff`).
    pub host_mac: String,
    /// Pod interface name.
    pub pod_if: String,
    /// Pod interface MAC.
    pub pod_mac: String,
    /// The pod's netns path (the CNI result's `sandbox`).
    pub sandbox: PathBuf,
    /// Where the time went.
    pub timing: SetupTiming,
}

/// How long each part of a [`setup`] took. The host and pod sides run concurrently, so
/// `host` and `pod` overlap; `veth` and `anycast` do not.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SetupTiming {
    /// Opening the pod's netlink socket, looking up and creating the veth pair.
    pub veth: std::time::Duration,
    /// The host side: sysctls, link up, `fe80::1`, host routes.
    pub host: std::time::Duration,
    /// The pod side: link up, addresses, routes, anycast addresses.
    pub pod: std::time::Duration,
    /// The anycast next-hop sets in the node's namespace.
    pub anycast: std::time::Duration,
}

/// The node's sysctls flock needs, with the values it wants: forwarding of both families.
/// Written only when they differ, which needs a writable `/proc/sys` (a privileged
/// container or the node itself); the agent's unprivileged container finds them set by the
/// node (docs/install.md, "Privileges").
pub(crate) fn node_sysctls() -> Vec<Sysctl> {
    vec![
        Sysctl {
            path: "net/ipv4/ip_forward".to_owned(),
            want: "1",
        },
        Sysctl {
            path: "net/ipv6/conf/all/forwarding".to_owned(),
            want: "1",
        },
    ]
}

/// The sysctls of a host veth (set over netlink: [`nl::link_host_conf`]) and of the node,
/// with the values flock wants; what `check` compares.
pub(crate) fn host_sysctls(host_if: &str) -> Vec<Sysctl> {
    let mut all = node_sysctls();
    all.extend([
        Sysctl {
            path: format!("net/ipv6/conf/{host_if}/addr_gen_mode"),
            want: "1",
        },
        Sysctl {
            path: format!("net/ipv4/conf/{host_if}/proxy_arp"),
            want: "1",
        },
    ]);
    all
}

pub(crate) fn ns_name(path: &std::path::Path) -> String {
    path.display().to_string()
}

/// Creates (or completes) the pod's kernel state; idempotent.
pub async fn setup(node: &NodeNs, spec: &PodSpec) -> Result<SetupOutcome> {
    spec.validate()?;
    let started = std::time::Instant::now();
    let mut timing = SetupTiming::default();
    let host_if = spec.host_if.clone();
    let nodename = node.name();
    let podname = ns_name(&spec.netns);
    let h = node.handle().await?;
    // The pod's socket (a namespace thread) and the host lookup overlap.
    let pod_target = NsTarget::Path(spec.netns.clone());
    let (pod, host) = futures::join!(
        NlConn::open(&pod_target),
        nl::link_by_name(&h, &nodename, &host_if)
    );
    let pod = pod?;
    let p = &pod.handle;
    let (host, peer) = ensure_veth(&h, p, spec, host?, &host_if, &nodename, &podname).await?;
    timing.veth = started.elapsed();

    // The two sides are independent: program them concurrently.
    let host_side = async {
        let started = std::time::Instant::now();
        // The node's forwarding, and the link's addr_gen_mode and proxy_arp before it goes
        // up (addr_gen_mode none: no kernel-made link-local), then up, then fe80::1.
        let ns = nodename.clone();
        run_in(&node.target, move || ensure_sysctls(&ns, &node_sysctls())).await?;
        nl::link_host_conf(&h, &nodename, &host).await?;
        if !host.up || host.mtu != spec.mtu {
            nl::link_up(&h, &nodename, &host, Some(spec.mtu)).await?;
        }
        let gw6 = IpNet::new(IpAddr::V6(GATEWAY6), 64).expect("64 is a valid prefix");
        nl::addr_replace(&h, &nodename, host.index, &host_if, gw6).await?;
        if spec.has_v4() {
            ensure_gateway4(&h, &nodename).await?;
        }
        // sent together, answered together: one round trip through the kernel, not one a route
        let routes = spec.host_routes();
        futures::future::try_join_all(
            routes
                .iter()
                .map(|r| nl::route_replace(&h, &nodename, r, host.index)),
        )
        .await?;
        Ok::<_, Error>(started.elapsed())
    };
    let pod_side = async {
        let started = std::time::Instant::now();
        // up, addresses without DAD, routes, then the anycast addresses after the pod's own
        // (on the pod's interface, not `lo`: the runtime's `loopback` plugin, which may run
        // at the same time, refuses a `lo` that holds anything but loopback addresses)
        if !peer.up || peer.mtu != spec.mtu {
            nl::link_up(p, &podname, &peer, Some(spec.mtu)).await?;
        }
        for a in &spec.addresses {
            nl::addr_replace(p, &podname, peer.index, &spec.if_name, *a).await?;
        }
        for r in spec.pod_routes() {
            nl::route_replace(p, &podname, &r, peer.index).await?;
        }
        for a in &spec.anycast {
            let net = IpNet::from(*a);
            nl::addr_replace_as(
                p,
                &podname,
                peer.index,
                &spec.if_name,
                net,
                AddrKind::Anycast,
            )
            .await?;
        }
        Ok::<_, Error>(started.elapsed())
    };
    (timing.host, timing.pod) = futures::try_join!(host_side, pod_side)?;
    drop(pod);

    // The anycast nexthop sets.
    let anycast_started = std::time::Instant::now();
    if !spec.anycast.is_empty() {
        let gw = spec.first_v6();
        let mut registry = node.anycast.lock().await;
        for a in &spec.anycast {
            let members = member_set(&h, &nodename, &mut registry, *a).await?;
            members.insert(host_if.clone(), gw);
            let members = members.clone();
            program_anycast(&h, &nodename, *a, &members).await?;
        }
    }

    timing.anycast = anycast_started.elapsed();
    Ok(SetupOutcome {
        host_if,
        host_mac: host.mac,
        pod_if: spec.if_name.clone(),
        pod_mac: peer.mac,
        sandbox: spec.netns.clone(),
        timing,
    })
}

/// Makes `169.254.1.1` local to the node's namespace: `169.254.1.1/32 scope
/// link` on its `lo`. `proxy_arp` alone answers a pod's ARP for the gateway
/// only when the node routes `169.254.1.1` elsewhere, and would then forward
/// the pod's packets to it instead of answering them. A link-scope address
/// on `lo` is never picked as the source of traffic leaving by another
/// interface, so the node's own traffic is unchanged.
async fn ensure_gateway4(h: &Handle, nodename: &str) -> Result<()> {
    let lo = nl::link_by_name(h, nodename, "lo")
        .await?
        .ok_or_else(|| Error::LinkNotFound {
            ifname: "lo".to_owned(),
            ns: nodename.to_owned(),
        })?;
    if !lo.up {
        nl::link_up(h, nodename, &lo, None).await?;
    }
    nl::addr_replace_as(
        h,
        nodename,
        lo.index,
        "lo",
        gateway4_net(),
        AddrKind::LinkScope,
    )
    .await
}

/// `169.254.1.1/32`.
pub(crate) fn gateway4_net() -> IpNet {
    IpNet::from(IpAddr::V4(GATEWAY4))
}

/// Finds the veth pair, or (re)creates it with the pod end directly in the
/// pod's namespace under `if_name`.
#[allow(clippy::too_many_arguments)]
async fn ensure_veth(
    h: &Handle,
    p: &Handle,
    spec: &PodSpec,
    host: Option<Link>,
    host_if: &str,
    nodename: &str,
    podname: &str,
) -> Result<(Link, Link)> {
    let taken = |ifname: String| Error::PodIfaceTaken {
        ifname,
        ns: podname.to_owned(),
        host_if: host_if.to_owned(),
    };
    if let Some(host) = host {
        let peer = nl::link_by_name(p, podname, &spec.if_name).await?;
        match peer {
            Some(peer) if host.kind_veth && host.peer_index == Some(peer.index) => {
                return Ok((host, peer));
            }
            _ => {
                // Half-built or stale (its peer is elsewhere): start over.
                nl::link_del(h, nodename, host.index, host_if).await?;
                if let Some(peer) = nl::link_by_name(p, podname, &spec.if_name).await? {
                    return Err(taken(peer.name));
                }
            }
        }
    }
    let netns = File::open(&spec.netns).map_err(|source| Error::OpenNetns {
        path: spec.netns.clone(),
        source,
    })?;
    let peer_msg = LinkUnspec::new_with_name(&spec.if_name)
        .mtu(spec.mtu)
        .setns_by_fd(netns.as_raw_fd())
        .build();
    let msg = LinkMessageBuilder::<LinkVeth>::new_with_info_kind(InfoKind::Veth)
        .name(host_if)
        .mtu(spec.mtu)
        .set_info_data(InfoData::Veth(InfoVeth::Peer(peer_msg)))
        .build();
    h.link()
        .add(msg)
        .execute()
        .await
        .map_err(|source| match crate::error::nl_errno(&source) {
            // the pod end's name exists in the pod (the host end was absent)
            Some(EEXIST) => taken(spec.if_name.clone()),
            _ => Error::link(
                "create veth",
                format!("{host_if} (peer {} in {podname})", spec.if_name),
                nodename,
                source,
            ),
        })?;
    drop(netns);
    let host = nl::link_by_name(h, nodename, host_if)
        .await?
        .ok_or_else(|| Error::LinkNotFound {
            ifname: host_if.to_owned(),
            ns: nodename.to_owned(),
        })?;
    let peer = nl::link_by_name(p, podname, &spec.if_name)
        .await?
        .ok_or_else(|| Error::LinkNotFound {
            ifname: spec.if_name.clone(),
            ns: podname.to_owned(),
        })?;
    Ok((host, peer))
}

/// Removes the pod's veth `spec.host_if` (which takes the pod end with it), its host
/// routes and its anycast nexthops, and its anycast addresses from the pod's
/// `lo` if the namespace still exists. Already gone = done; keeps going past
/// errors and reports all of them. Only the link named `spec.host_if` is deleted: another
/// attachment of the same container keeps its own.
pub async fn teardown(node: &NodeNs, spec: &PodSpec) -> Result<(), TeardownError> {
    let detached = detach(node, spec).await;
    let removed = remove_host_iface(node, &spec.host_if).await;
    match (detached, removed) {
        (Ok(()), Ok(_)) => Ok(()),
        (Ok(()), Err(e)) => Err(TeardownError { errors: vec![e] }),
        (Err(t), Ok(_)) => Err(t),
        (Err(mut t), Err(e)) => {
            t.errors.push(e);
            Err(t)
        }
    }
}

/// Everything [`teardown`] does except deleting the veth itself: anycast nexthops, the pod's
/// host routes and its anycast addresses go now; the host veth stays, unrouted, for
/// [`remove_host_iface`] to delete later.
///
/// Deleting a veth costs the kernel tens of milliseconds (its netlink request returns only
/// after an RCU grace period); a caller that must answer quickly detaches synchronously and
/// deletes the link off its critical path. Nothing routes to a detached veth, so a new pod may reuse the
/// addresses at once.
pub async fn detach(node: &NodeNs, spec: &PodSpec) -> Result<(), TeardownError> {
    let mut errors = Vec::new();
    let host_if = spec.host_if.clone();
    let nodename = node.name();
    let h = match node.handle().await {
        Ok(h) => h,
        Err(e) => return Err(TeardownError { errors: vec![e] }),
    };

    // Anycast first: IPv4 drops a whole multipath route when one nexthop's
    // device disappears, so the new set goes in before the veth goes away.
    if !spec.anycast.is_empty() {
        let mut registry = node.anycast.lock().await;
        for a in &spec.anycast {
            let result = async {
                let members = member_set(&h, &nodename, &mut registry, *a).await?;
                members.remove(&host_if);
                let members = members.clone();
                program_anycast(&h, &nodename, *a, &members).await
            }
            .await;
            if let Err(e) = result {
                errors.push(e);
            }
        }
    }

    match nl::link_by_name(&h, &nodename, &host_if).await {
        Ok(Some(host)) => {
            // together, as setup adds them
            let routes = spec.host_routes();
            let deleted = futures::future::join_all(
                routes
                    .iter()
                    .map(|r| nl::route_del(&h, &nodename, r, host.index)),
            )
            .await;
            errors.extend(deleted.into_iter().filter_map(Result::err));
        }
        // no veth: the kernel removed its routes with it
        Ok(None) => {}
        Err(e) => errors.push(e),
    }

    if !spec.anycast.is_empty() && spec.netns.exists() {
        let podname = ns_name(&spec.netns);
        match NlConn::open(&NsTarget::Path(spec.netns.clone())).await {
            // On the pod's interface (and on `lo`, where agents before 0.2 put them).
            Ok(pod) => {
                for ifname in [spec.if_name.as_str(), "lo"] {
                    match nl::link_by_name(&pod.handle, &podname, ifname).await {
                        Ok(Some(link)) => {
                            let have =
                                match nl::addrs(&pod.handle, &podname, link.index, ifname).await {
                                    Ok(have) => have,
                                    Err(e) => {
                                        errors.push(e);
                                        continue;
                                    }
                                };
                            for a in &spec.anycast {
                                let net = IpNet::from(*a);
                                if !have.iter().any(|h| h.net == net) {
                                    continue;
                                }
                                if let Err(e) =
                                    nl::addr_del(&pod.handle, &podname, link.index, ifname, net)
                                        .await
                                {
                                    errors.push(e);
                                }
                            }
                        }
                        Ok(None) => {}
                        Err(e) => errors.push(e),
                    }
                }
            }
            // the namespace vanished in between: nothing left to clean
            Err(e) if matches!(e.errno(), Some(nl::ENOENT)) => {}
            Err(e) => errors.push(e),
        }
    }

    if errors.is_empty() {
        Ok(())
    } else {
        Err(TeardownError { errors })
    }
}
