//! Thin typed helpers over rtnetlink requests.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use futures::TryStreamExt;
use ipnet::IpNet;
use netlink_packet_route::AddressFamily;
use netlink_packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage, CacheInfo,
};
use netlink_packet_route::link::{
    AfSpecInet, AfSpecInet6, AfSpecUnspec, In6AddrGenMode, InetDevConf, LinkAttribute, LinkFlags,
    LinkMessage,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteNextHopFlags, RouteScope,
    RouteType,
};
use rtnetlink::{Handle, RouteMessageBuilder, RouteNextHopBuilder};

use crate::error::{Error, Result, nl_errno};

pub(crate) const ENODEV: i32 = 19;
pub(crate) const ENOENT: i32 = 2;
pub(crate) const ESRCH: i32 = 3;
pub(crate) const EADDRNOTAVAIL: i32 = 99;

/// What flock needs to know about a link.
#[derive(Debug, Clone)]
pub(crate) struct Link {
    pub(crate) index: u32,
    pub(crate) name: String,
    pub(crate) mac: String,
    pub(crate) up: bool,
    pub(crate) mtu: u32,
    /// `IFLA_LINK`: for a veth, the peer's index (in the peer's namespace).
    pub(crate) peer_index: Option<u32>,
    pub(crate) kind_veth: bool,
    /// IPv6 `addr_gen_mode` is `none` (the kernel makes no link-local address).
    pub(crate) addr_gen_none: bool,
    /// IPv4 `proxy_arp` is on.
    pub(crate) proxy_arp: bool,
}

pub(crate) fn format_mac(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

fn parse_link(msg: &LinkMessage) -> Link {
    let mut link = Link {
        index: msg.header.index,
        name: String::new(),
        mac: String::new(),
        up: msg.header.flags.contains(LinkFlags::Up),
        mtu: 0,
        peer_index: None,
        kind_veth: false,
        addr_gen_none: false,
        proxy_arp: false,
    };
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::IfName(n) => link.name = n.clone(),
            LinkAttribute::Address(a) => link.mac = format_mac(a),
            LinkAttribute::Mtu(m) => link.mtu = *m,
            LinkAttribute::Link(i) => link.peer_index = Some(*i),
            LinkAttribute::LinkInfo(infos) => {
                link.kind_veth = infos.iter().any(|i| {
                    matches!(
                        i,
                        netlink_packet_route::link::LinkInfo::Kind(
                            netlink_packet_route::link::InfoKind::Veth
                        )
                    )
                })
            }
            LinkAttribute::AfSpecUnspec(specs) => {
                for spec in specs {
                    match spec {
                        AfSpecUnspec::Inet6(attrs) => {
                            link.addr_gen_none |=
                                attrs.contains(&AfSpecInet6::AddrGenMode(In6AddrGenMode::None));
                        }
                        AfSpecUnspec::Inet(attrs) => {
                            link.proxy_arp |= attrs
                                .iter()
                                .any(|a| matches!(a, AfSpecInet::DevConf(c) if c.proxy_arp != 0));
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    link
}

/// Looks a link up by name; `Ok(None)` when it does not exist.
pub(crate) async fn link_by_name(h: &Handle, ns: &str, name: &str) -> Result<Option<Link>> {
    let mut stream = h.link().get().match_name(name).execute();
    match stream.try_next().await {
        Ok(Some(msg)) => Ok(Some(parse_link(&msg))),
        Ok(None) => Ok(None),
        Err(e) if nl_errno(&e) == Some(ENODEV) => Ok(None),
        Err(source) => Err(Error::link("look up", name, ns, source)),
    }
}

/// The link with this index, if there is one.
pub(crate) async fn link_by_index(h: &Handle, ns: &str, index: u32) -> Result<Option<Link>> {
    let mut stream = h.link().get().match_index(index).execute();
    match stream.try_next().await {
        Ok(Some(msg)) => Ok(Some(parse_link(&msg))),
        Ok(None) => Ok(None),
        Err(e) if nl_errno(&e) == Some(ENODEV) => Ok(None),
        Err(source) => Err(Error::link("look up", index.to_string(), ns, source)),
    }
}

/// Every link of the namespace.
pub(crate) async fn links(h: &Handle, ns: &str) -> Result<Vec<Link>> {
    h.link()
        .get()
        .execute()
        .map_ok(|m| parse_link(&m))
        .try_collect()
        .await
        .map_err(|source| Error::link("list", "*", ns, source))
}

/// Sets a link up, optionally with an MTU.
pub(crate) async fn link_up(h: &Handle, ns: &str, link: &Link, mtu: Option<u32>) -> Result<()> {
    let mut b = rtnetlink::LinkUnspec::new_with_index(link.index).up();
    if let Some(mtu) = mtu {
        b = b.mtu(mtu);
    }
    h.link()
        .set(b.build())
        .execute()
        .await
        .map_err(|source| Error::link("set up", &link.name, ns, source))
}

/// Sets what a host veth needs before it goes up, over netlink rather than `/proc/sys` (read-only
/// in a container that is not privileged): IPv6 `addr_gen_mode` `none` (no kernel-made
/// link-local address beside `fe80::1`) and IPv4 `proxy_arp` (the pod's ARP for its gateway is
/// answered). Only what differs is sent.
pub(crate) async fn link_host_conf(h: &Handle, ns: &str, link: &Link) -> Result<()> {
    let mut specs = Vec::new();
    if !link.proxy_arp {
        let mut conf = InetDevConf::default();
        conf.proxy_arp = 1;
        specs.push(AfSpecUnspec::Inet(vec![AfSpecInet::DevConfRequest(conf)]));
    }
    if !link.addr_gen_none {
        specs.push(AfSpecUnspec::Inet6(vec![AfSpecInet6::AddrGenMode(
            In6AddrGenMode::None,
        )]));
    }
    if specs.is_empty() {
        return Ok(());
    }
    let msg = rtnetlink::LinkUnspec::new_with_index(link.index)
        .append_extra_attribute(LinkAttribute::AfSpecUnspec(specs))
        .build();
    h.link()
        .set(msg)
        .execute()
        .await
        .map_err(|source| Error::link("set addr_gen_mode and proxy_arp of", &link.name, ns, source))
}

/// Deletes a link; `Ok(false)` when it was already gone.
pub(crate) async fn link_del(h: &Handle, ns: &str, index: u32, name: &str) -> Result<bool> {
    match h.link().del(index).execute().await {
        Ok(()) => Ok(true),
        Err(e) if nl_errno(&e) == Some(ENODEV) => Ok(false),
        Err(source) => Err(Error::link("delete", name, ns, source)),
    }
}

/// An address as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Addr {
    pub(crate) net: IpNet,
    pub(crate) nodad: bool,
}

/// The addresses of link `index`.
pub(crate) async fn addrs(h: &Handle, ns: &str, index: u32, ifname: &str) -> Result<Vec<Addr>> {
    let msgs: Vec<AddressMessage> = h
        .address()
        .get()
        .set_link_index_filter(index)
        .execute()
        .try_collect()
        .await
        .map_err(|source| {
            Error::address("list", IpNet::V6(Default::default()), ifname, ns, source)
        })?;
    let mut out = Vec::new();
    for m in msgs {
        let mut ip = None;
        let mut nodad = m.header.flags.contains(AddressHeaderFlags::Nodad);
        for a in &m.attributes {
            match a {
                AddressAttribute::Local(x) => ip = Some(*x),
                AddressAttribute::Address(x) if ip.is_none() => ip = Some(*x),
                AddressAttribute::Flags(f) => nodad |= f.contains(AddressFlags::Nodad),
                _ => {}
            }
        }
        if let Some(ip) = ip
            && let Ok(net) = IpNet::new(ip, m.header.prefix_len)
        {
            out.push(Addr { net, nodad });
        }
    }
    Ok(out)
}

/// How an address is added.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AddrKind {
    /// A plain address (global scope; IPv6 without DAD).
    Plain,
    /// Link scope (the node's `169.254.1.1` on `lo`).
    LinkScope,
    /// An anycast address on a pod's interface: the pod accepts traffic to it but never
    /// picks it as the source of its own — IPv6 deprecated (preferred lifetime 0, valid
    /// forever), IPv4 host scope (never chosen for a destination beyond the host).
    Anycast,
}

/// Adds (or replaces) an address without DAD.
pub(crate) async fn addr_replace(
    h: &Handle,
    ns: &str,
    index: u32,
    ifname: &str,
    net: IpNet,
) -> Result<()> {
    addr_replace_as(h, ns, index, ifname, net, AddrKind::Plain).await
}

/// Adds (or replaces) an address of `kind`; IPv6 ones never wait for DAD.
pub(crate) async fn addr_replace_as(
    h: &Handle,
    ns: &str,
    index: u32,
    ifname: &str,
    net: IpNet,
    kind: AddrKind,
) -> Result<()> {
    use netlink_packet_route::address::AddressScope;
    let mut req = h
        .address()
        .add(index, net.addr(), net.prefix_len())
        .replace();
    let msg = req.message_mut();
    match (kind, net.addr().is_ipv4()) {
        (AddrKind::LinkScope, _) => msg.header.scope = AddressScope::Link,
        (AddrKind::Anycast, true) => msg.header.scope = AddressScope::Host,
        _ => {}
    }
    if net.addr().is_ipv6() {
        msg.header.flags |= AddressHeaderFlags::Nodad;
        msg.attributes
            .push(AddressAttribute::Flags(AddressFlags::Nodad));
        if kind == AddrKind::Anycast {
            let mut lifetimes = CacheInfo::default();
            lifetimes.ifa_preferred = 0;
            lifetimes.ifa_valid = u32::MAX;
            msg.attributes.push(AddressAttribute::CacheInfo(lifetimes));
        }
    }
    req.execute()
        .await
        .map_err(|source| Error::address("add", net, ifname, ns, source))
}

/// Deletes an address; gone already = done.
pub(crate) async fn addr_del(
    h: &Handle,
    ns: &str,
    index: u32,
    ifname: &str,
    net: IpNet,
) -> Result<()> {
    let msg = match net.addr() {
        IpAddr::V4(a) => rtnetlink::AddressMessageBuilder::<Ipv4Addr>::new()
            .index(index)
            .address(a, net.prefix_len())
            .build(),
        IpAddr::V6(a) => rtnetlink::AddressMessageBuilder::<Ipv6Addr>::new()
            .index(index)
            .address(a, net.prefix_len())
            .build(),
    };
    match h.address().del(msg).execute().await {
        Ok(()) => Ok(()),
        Err(e) if matches!(nl_errno(&e), Some(EADDRNOTAVAIL | ENODEV | ENOENT)) => Ok(()),
        Err(source) => Err(Error::address("delete", net, ifname, ns, source)),
    }
}

/// A route of the main table as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KRoute {
    pub(crate) dst: IpNet,
    /// Installed by the kernel for an address (prefix routes, fe80::/64).
    pub(crate) kernel: bool,
    /// Installed with `proto static`, as flock installs its routes (not, say, BIRD's
    /// `proto bird` routes learned from the fabric).
    pub(crate) static_proto: bool,
    pub(crate) kind: RouteType,
    /// `(ifindex, gateway)` of each nexthop; one entry for a plain route.
    pub(crate) nexthops: Vec<(u32, Option<IpAddr>)>,
}

fn route_addr(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(x) => Some(IpAddr::V4(*x)),
        RouteAddress::Inet6(x) => Some(IpAddr::V6(*x)),
        _ => None,
    }
}

fn parse_route(m: &RouteMessage) -> Option<KRoute> {
    let mut dst = None;
    let mut oif = None;
    let mut gw = None;
    let mut nexthops = Vec::new();
    for a in &m.attributes {
        match a {
            RouteAttribute::Destination(d) => dst = route_addr(d),
            RouteAttribute::Oif(i) => oif = Some(*i),
            RouteAttribute::Gateway(g) => gw = route_addr(g),
            RouteAttribute::MultiPath(hops) => {
                for hop in hops {
                    let hgw = hop.attributes.iter().find_map(|a| match a {
                        RouteAttribute::Gateway(g) => route_addr(g),
                        _ => None,
                    });
                    nexthops.push((hop.interface_index, hgw));
                }
            }
            _ => {}
        }
    }
    let unspecified = match m.header.address_family {
        AddressFamily::Inet => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        AddressFamily::Inet6 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        _ => return None,
    };
    let dst = IpNet::new(
        dst.unwrap_or(unspecified),
        m.header.destination_prefix_length,
    )
    .ok()?;
    if nexthops.is_empty()
        && let Some(oif) = oif
    {
        nexthops.push((oif, gw));
    }
    Some(KRoute {
        dst,
        kernel: m.header.protocol == netlink_packet_route::route::RouteProtocol::Kernel,
        static_proto: m.header.protocol == netlink_packet_route::route::RouteProtocol::Static,
        kind: m.header.kind,
        nexthops,
    })
}

/// The routes of the main table, both families.
pub(crate) async fn main_routes(h: &Handle, ns: &str) -> Result<Vec<KRoute>> {
    let mut out = Vec::new();
    for family in [AddressFamily::Inet, AddressFamily::Inet6] {
        let mut msg = RouteMessage::default();
        msg.header.address_family = family;
        let msgs: Vec<RouteMessage> = h
            .route()
            .get(msg)
            .execute()
            .try_collect()
            .await
            .map_err(|source| Error::route("list", format!("{family:?} main table"), ns, source))?;
        out.extend(
            msgs.iter()
                .filter(|m| m.header.table == RouteHeader::RT_TABLE_MAIN)
                .filter_map(parse_route),
        );
    }
    Ok(out)
}

/// A route flock installs, in the words of `ip route`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RouteSpec {
    /// Destination.
    pub dst: IpNet,
    /// Gateway, if any.
    pub gateway: Option<IpAddr>,
    /// Output interface name.
    pub dev: String,
    /// The gateway is on the link whatever the link's addresses and routes say (`onlink`).
    pub onlink: bool,
}

impl std::fmt::Display for RouteSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.dst.prefix_len() == 0 {
            f.write_str("default")?;
        } else {
            write!(f, "{}", self.dst)?;
        }
        if let Some(gw) = self.gateway {
            write!(f, " via {gw}")?;
        }
        write!(f, " dev {}", self.dev)?;
        if self.onlink {
            f.write_str(" onlink")?;
        }
        Ok(())
    }
}

pub(crate) fn base_message(dst: IpNet) -> RouteMessage {
    let mut m = match dst {
        IpNet::V4(n) => RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(n.addr(), n.prefix_len())
            .build(),
        IpNet::V6(n) => RouteMessageBuilder::<Ipv6Addr>::new()
            .destination_prefix(n.addr(), n.prefix_len())
            .build(),
    };
    if dst.prefix_len() == 0 {
        // a default route carries no RTA_DST
        m.attributes
            .retain(|a| !matches!(a, RouteAttribute::Destination(_)));
    }
    m
}

/// Replaces a unicast route `dst [via gw] dev index`.
pub(crate) async fn route_replace(
    h: &Handle,
    ns: &str,
    spec: &RouteSpec,
    index: u32,
) -> Result<()> {
    let mut m = base_message(spec.dst);
    m.attributes.push(RouteAttribute::Oif(index));
    if spec.onlink {
        m.header.flags |= netlink_packet_route::route::RouteFlags::Onlink;
    }
    match spec.gateway {
        Some(gw) => m.attributes.push(RouteAttribute::Gateway(gw.into())),
        None if spec.dst.addr().is_ipv4() => m.header.scope = RouteScope::Link,
        None => {}
    }
    h.route()
        .add(m)
        .replace()
        .execute()
        .await
        .map_err(|source| Error::route("replace", spec.to_string(), ns, source))
}

/// Deletes the unicast route `dst dev index`; gone already = done.
pub(crate) async fn route_del(h: &Handle, ns: &str, spec: &RouteSpec, index: u32) -> Result<()> {
    let mut m = base_message(spec.dst);
    m.attributes.push(RouteAttribute::Oif(index));
    m.header.scope = RouteScope::NoWhere;
    del(h, ns, m, spec.to_string()).await
}

async fn del(h: &Handle, ns: &str, mut m: RouteMessage, what: String) -> Result<()> {
    // match whoever installed it
    m.header.protocol = netlink_packet_route::route::RouteProtocol::Unspec;
    del_matching(h, ns, m, what).await
}

/// Deletes the route `m` describes, its protocol included; gone already = done.
async fn del_matching(h: &Handle, ns: &str, m: RouteMessage, what: String) -> Result<()> {
    match h.route().del(m).execute().await {
        Ok(()) => Ok(()),
        Err(e) if matches!(nl_errno(&e), Some(ESRCH | ENOENT | ENODEV)) => Ok(()),
        Err(source) => Err(Error::route("delete", what, ns, source)),
    }
}

/// Replaces a route to `dst` whose nexthops are `hops` (`(ifindex, ifname,
/// gateway)`); IPv6 hops need a gateway (set `onlink`). Empty = delete.
pub(crate) async fn multipath_replace(
    h: &Handle,
    ns: &str,
    dst: IpNet,
    hops: &[(u32, String, Option<IpAddr>)],
) -> Result<()> {
    let describe = || {
        let mut s = dst.to_string();
        for (_, name, gw) in hops {
            match gw {
                Some(gw) => s.push_str(&format!(" nexthop via {gw} dev {name}")),
                None => s.push_str(&format!(" nexthop dev {name}")),
            }
        }
        s
    };
    let mut m = base_message(dst);
    if hops.is_empty() {
        m.header.scope = RouteScope::NoWhere;
        // flock's route only: BIRD may hold one to the same address, learned from the fabric
        // (another node's pods announce it too).
        return del_matching(h, ns, m, describe()).await;
    }
    let family = if dst.addr().is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let all_devonly = hops.iter().all(|(_, _, gw)| gw.is_none());
    if hops.len() == 1 {
        let (idx, _, gw) = &hops[0];
        m.attributes.push(RouteAttribute::Oif(*idx));
        if let Some(gw) = gw {
            m.attributes.push(RouteAttribute::Gateway((*gw).into()));
            m.header.flags |= netlink_packet_route::route::RouteFlags::Onlink;
        }
    } else {
        let mut nh = Vec::new();
        for (idx, _, gw) in hops {
            let mut b = RouteNextHopBuilder::new(family).interface(*idx);
            if let Some(gw) = gw {
                b = b
                    .via(*gw)
                    .map_err(|e| {
                        Error::route(
                            "replace",
                            describe(),
                            ns,
                            rtnetlink::Error::InvalidNla(e.to_string()),
                        )
                    })?
                    .flags(RouteNextHopFlags::Onlink);
            }
            nh.push(b.build());
        }
        m.attributes.push(RouteAttribute::MultiPath(nh));
    }
    if all_devonly && family == AddressFamily::Inet {
        m.header.scope = RouteScope::Link;
    }
    h.route()
        .add(m)
        .replace()
        .execute()
        .await
        .map_err(|source| Error::route("replace", describe(), ns, source))
}

/// Replaces a blackhole route.
pub(crate) async fn blackhole_replace(h: &Handle, ns: &str, dst: IpNet) -> Result<()> {
    let mut m = base_message(dst);
    m.header.kind = RouteType::BlackHole;
    h.route()
        .add(m)
        .replace()
        .execute()
        .await
        .map_err(|source| Error::route("replace", format!("blackhole {dst}"), ns, source))
}

/// Deletes a blackhole route; gone already = done.
pub(crate) async fn blackhole_del(h: &Handle, ns: &str, dst: IpNet) -> Result<()> {
    let mut m = base_message(dst);
    m.header.kind = RouteType::BlackHole;
    m.header.scope = RouteScope::NoWhere;
    del(h, ns, m, format!("blackhole {dst}")).await
}
