//! The model: [`BirdModel`] as the agent builds it from a NodeConfig and its
//! pods (strings and wide integers, as they arrive), and [`ValidModel`], the
//! checked, sorted and de-duplicated form that [`render`](crate::render) takes.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;

use crate::error::{Error, Result};

/// What a node tells BIRD, as given. Lists may come in any order and with
/// repeats; [`BirdModel::validate`] checks and normalises them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BirdModel {
    /// BGP router ID, an IPv4 address in text form (`bgp.routerId`).
    pub router_id: String,
    /// The node's AS number (`bgp.asn`); wide so that an out-of-range value
    /// is reported rather than truncated.
    pub asn: u64,
    /// BGP neighbors.
    pub neighbors: Vec<NeighborSpec>,
    /// BGP graceful restart: `None` off, `Some(seconds)` on with that
    /// restart time. Also makes the kernel protocol wait for the end of a
    /// recovery before it syncs routes.
    pub graceful_restart: Option<u16>,
    /// The node's pod CIDRs, any family; announced as aggregates.
    pub cidrs: Vec<IpNet>,
    /// Pod addresses (the `addresses` annotation); those outside every node
    /// CIDR are announced individually as /128 or /32, the others are
    /// covered by the aggregate and dropped.
    pub addresses: Vec<IpAddr>,
    /// Anycast addresses hosted by local pods; always announced as /128 or
    /// /32 (even inside a node CIDR, so that traffic spreads over every node
    /// that hosts one) and never accepted back from a peer.
    pub anycast: Vec<IpAddr>,
    /// Service routes (LoadBalancer and external IPs as /128 and /32, cluster-IP ranges as
    /// aggregates), announced by their own `protocol static flock_services6/4` to the same
    /// neighbors as the pod routes, whether or not a node CIDR covers them: each node
    /// announces exactly the Service routes it was given.
    pub services: Vec<IpNet>,
    /// Communities attached to every route flock announces.
    pub communities: Vec<Community>,
    /// Accept a default route (`::/0`, `0.0.0.0/0`) from neighbors.
    pub import_default: bool,
    /// Graceful shutdown (RFC 8326): every announced route carries the
    /// well-known community `GRACEFUL_SHUTDOWN` (65535:0), so that routers
    /// move traffic to other paths before the node withdraws (a drain).
    pub graceful_shutdown: bool,
}

/// One BGP neighbor, as given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NeighborSpec {
    /// BIRD protocol name; derived from the address when `None`
    /// (`peer6_2001_db8__fe`, `peer4_192_168_0_1`).
    pub name: Option<String>,
    /// The neighbor's address in text form. Empty with an [`interface`](Self::interface):
    /// any link-local peer on that interface may connect (BIRD's dynamic
    /// `neighbor range fe80::/10`); empty without one is an error.
    pub address: String,
    /// The interface of a link-local (unnumbered) session: with a link-local
    /// `address` BIRD connects to that address on this interface; with none it
    /// waits for a peer to connect from any link-local address on it.
    pub interface: Option<String>,
    /// The neighbor's AS number; equal to the node's for iBGP.
    pub asn: u64,
    /// TCP MD5 password.
    pub password: Option<String>,
    /// Run BFD with this neighbor.
    pub bfd: bool,
    /// BFD timing of the session; BIRD's defaults (or those of `protocol
    /// bfd`) when `None`. Only meaningful with [`bfd`](Self::bfd).
    pub bfd_timing: Option<BfdTiming>,
    /// Graceful restart of this session; the model's
    /// [`graceful_restart`](BirdModel::graceful_restart) when `None`.
    pub graceful_restart: Option<GracefulRestart>,
    /// `multihop N` for a neighbor that is not on a shared link; `None`
    /// keeps BIRD's default (direct for eBGP, multihop for iBGP).
    pub multihop: Option<u8>,
    /// The local address of the session; required by BIRD for multihop BFD.
    pub source_address: Option<IpAddr>,
    /// BGP timers; BIRD's defaults when `None`.
    pub timers: Option<Timers>,
}

/// BFD timing of one session: packets every `interval_ms` both ways, the
/// session declared down after `multiplier` missed ones (100 ms x 3 = 300 ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BfdTiming {
    /// Desired transmit and required receive interval, in milliseconds (1 to 60000).
    pub interval_ms: u32,
    /// Detection multiplier (1 to 255).
    pub multiplier: u8,
}

/// Graceful restart (RFC 4724) of one session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GracefulRestart {
    /// Not offered: BIRD stays `graceful restart aware` (it keeps a
    /// restarting peer's routes) but a peer drops ours as soon as the
    /// session goes down.
    Off,
    /// Offered: a peer keeps our routes for `restart_time` seconds when
    /// the session drops without a notification (BIRD restarting).
    On {
        /// Restart time in seconds (1 to 4095, the capability's 12 bits).
        restart_time: u16,
        /// Long-lived graceful restart (RFC 9494): after the restart time the
        /// peer keeps our routes as stale (least preferred) this many seconds
        /// more (1 to 16777215).
        long_lived_stale_time: Option<u32>,
    },
}

/// BGP timers of one session, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Timers {
    /// Hold time: 0 (no keepalives) or 3 to 65535.
    pub hold: u16,
    /// Keepalive interval: at least 1, below the hold time.
    pub keepalive: u16,
    /// Delay between connection attempts (BIRD's `connect retry time`).
    pub connect_retry: u16,
    /// Delay before the first connection attempt (`connect delay time`).
    pub connect_delay: u16,
}

impl Timers {
    /// Timers for a lab or a fast fabric: a session comes up in about a
    /// second and a dead peer is noticed in 9.
    pub const FAST: Timers = Timers {
        hold: 9,
        keepalive: 3,
        connect_retry: 1,
        connect_delay: 1,
    };
}

/// A BGP community attached to every announced route.
///
/// Written as `ASN:value` (two numbers 0–65535, RFC 1997) or `a:b:c` (three numbers
/// 0–4294967295, an RFC 8092 large community); [`FromStr`](std::str::FromStr) reads that
/// form and [`Display`](std::fmt::Display) writes it back.
///
/// ```
/// use flock_bird::{Community, Error};
/// assert_eq!("65000:100".parse::<Community>()?, Community::Standard(65000, 100));
/// assert_eq!("4200000000:1:2".parse::<Community>()?, Community::Large(4_200_000_000, 1, 2));
/// assert_eq!(Community::Large(1, 2, 3).to_string(), "1:2:3");
/// assert!(matches!("70000:1".parse::<Community>(), Err(Error::CommunitySyntax { .. })));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Community {
    /// RFC 1997 community `(asn, value)`.
    Standard(u16, u16),
    /// RFC 8092 large community `(global, local1, local2)`.
    Large(u32, u32, u32),
}

impl std::str::FromStr for Community {
    type Err = Error;

    fn from_str(text: &str) -> Result<Community> {
        let refuse = |reason| Error::CommunitySyntax {
            value: text.to_owned(),
            reason,
        };
        let parts: Vec<&str> = text.split(':').collect();
        let numeric = parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
        if !numeric || !(2..=3).contains(&parts.len()) {
            return Err(refuse(
                "is not ASN:value (two numbers 0 to 65535) or a large community a:b:c (three numbers 0 to 4294967295)",
            ));
        }
        if let [a, b] = parts[..] {
            let half = |p: &str| {
                p.parse::<u16>().map_err(|_| {
                    refuse("has a number over 65535; a standard community is two 16-bit numbers (use a:b:c for a large community)")
                })
            };
            return Ok(Community::Standard(half(a)?, half(b)?));
        }
        let word = |p: &str| {
            p.parse::<u32>().map_err(|_| {
                refuse("has a number over 4294967295; a large community is three 32-bit numbers")
            })
        };
        Ok(Community::Large(
            word(parts[0])?,
            word(parts[1])?,
            word(parts[2])?,
        ))
    }
}

impl std::fmt::Display for Community {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Community::Standard(a, b) => write!(f, "{a}:{b}"),
            Community::Large(a, b, c) => write!(f, "{a}:{b}:{c}"),
        }
    }
}

/// Which address families the node routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Families {
    /// IPv6 channels, kernel and static protocols.
    pub ipv6: bool,
    /// IPv4 channels, kernel and static protocols.
    pub ipv4: bool,
}

/// A checked neighbor of a [`ValidModel`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Neighbor {
    pub(crate) name: String,
    /// `None`: a dynamic link-local neighbor on `interface`.
    pub(crate) address: Option<IpAddr>,
    pub(crate) interface: Option<String>,
    pub(crate) asn: u32,
    pub(crate) password: Option<String>,
    pub(crate) bfd: bool,
    pub(crate) bfd_timing: Option<BfdTiming>,
    pub(crate) graceful_restart: GracefulRestart,
    pub(crate) multihop: Option<u8>,
    pub(crate) source_address: Option<IpAddr>,
    pub(crate) timers: Option<Timers>,
}

impl Neighbor {
    /// The BIRD protocol name of this session (what `birdc show protocols`
    /// lists, so the agent can map a state back to the neighbor).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The neighbor's address; `None` for a dynamic link-local neighbor
    /// (any peer on [`interface`](Self::interface)).
    pub fn address(&self) -> Option<IpAddr> {
        self.address
    }
    /// The interface of a link-local session.
    pub fn interface(&self) -> Option<&str> {
        self.interface.as_deref()
    }
    /// How the neighbor is written in messages and status: `2001:db8::fe`,
    /// `fe80::2%eth0`, or `eth0` for any link-local peer on `eth0`.
    pub fn peer(&self) -> String {
        peer_label(self.address, self.interface.as_deref())
    }
    /// The graceful restart this session offers.
    pub fn graceful_restart(&self) -> GracefulRestart {
        self.graceful_restart
    }
    /// Whether BIRD spawns this session per connecting peer (dynamic BGP):
    /// `birdc show protocols` then lists it as `NAME` (the listener) and
    /// `NAME_1`, `NAME_2`, … (one per peer).
    pub fn is_dynamic(&self) -> bool {
        self.address.is_none()
    }
    /// The neighbor's AS number.
    pub fn asn(&self) -> u32 {
        self.asn
    }
}

/// A [`BirdModel`] that passed [`BirdModel::validate`]: every value checked,
/// every list sorted and de-duplicated, so that rendering is byte-for-byte
/// stable whatever the input order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidModel {
    pub(crate) router_id: Ipv4Addr,
    pub(crate) asn: u32,
    pub(crate) neighbors: Vec<Neighbor>,
    pub(crate) graceful_restart: Option<u16>,
    pub(crate) families: Families,
    pub(crate) cidrs: Vec<IpNet>,
    /// Host routes announced individually: addresses outside the CIDRs and
    /// every anycast address, as /128 or /32.
    pub(crate) host_routes: Vec<IpNet>,
    /// Service routes, sorted.
    pub(crate) services: Vec<IpNet>,
    pub(crate) communities: Vec<Community>,
    pub(crate) import_default: bool,
    pub(crate) graceful_shutdown: bool,
}

impl ValidModel {
    /// The router ID.
    pub fn router_id(&self) -> Ipv4Addr {
        self.router_id
    }
    /// The node's AS number.
    pub fn asn(&self) -> u32 {
        self.asn
    }
    /// Neighbors, sorted by address.
    pub fn neighbors(&self) -> &[Neighbor] {
        &self.neighbors
    }
    /// The families the node routes: those of its CIDRs, addresses and
    /// anycast addresses, or both when it announces nothing.
    pub fn families(&self) -> Families {
        self.families
    }
    /// Node CIDRs, sorted, without repeats.
    pub fn cidrs(&self) -> &[IpNet] {
        &self.cidrs
    }
    /// The /128 and /32 routes announced individually, sorted.
    pub fn host_routes(&self) -> &[IpNet] {
        &self.host_routes
    }
    /// The Service routes, sorted.
    pub fn services(&self) -> &[IpNet] {
        &self.services
    }
}

impl BirdModel {
    /// Checks every value and normalises every list (sorted, without
    /// repeats). The first problem found is returned, naming the field and
    /// the value.
    pub fn validate(&self) -> Result<ValidModel> {
        let router_id: Ipv4Addr =
            self.router_id
                .trim()
                .parse()
                .map_err(|source| Error::RouterIdSyntax {
                    value: self.router_id.clone(),
                    source,
                })?;
        if router_id.is_unspecified() {
            return Err(Error::RouterIdZero);
        }
        let asn = check_asn("bgp.asn", self.asn)?;
        if let Some(time) = self.graceful_restart {
            check_restart_time(time).map_err(|reason| Error::GracefulRestart {
                field: "bgp.gracefulRestart".to_owned(),
                reason,
            })?;
        }
        let default_gr = match self.graceful_restart {
            Some(restart_time) => GracefulRestart::On {
                restart_time,
                long_lived_stale_time: None,
            },
            None => GracefulRestart::Off,
        };

        let mut cidrs = BTreeSet::new();
        for &cidr in &self.cidrs {
            if cidr.trunc() != cidr {
                return Err(Error::CidrHostBits {
                    value: cidr,
                    truncated: cidr.trunc(),
                });
            }
            check_announceable("cidrs", cidr)?;
            cidrs.insert(cidr);
        }
        let mut host_routes = BTreeSet::new();
        for &addr in &self.addresses {
            let net = IpNet::from(addr);
            check_announceable("addresses", net)?;
            if !cidrs.iter().any(|c| c.contains(&addr)) {
                host_routes.insert(net);
            }
        }
        for &addr in &self.anycast {
            let net = IpNet::from(addr);
            check_announceable("anycast", net)?;
            host_routes.insert(net);
        }
        let mut services = BTreeSet::new();
        for &net in &self.services {
            if net.trunc() != net {
                return Err(Error::ServiceRouteHostBits {
                    value: net,
                    truncated: net.trunc(),
                });
            }
            check_announceable("services", net)?;
            services.insert(net);
        }
        let announced = cidrs
            .iter()
            .chain(host_routes.iter())
            .chain(services.iter());
        let (mut ipv6, mut ipv4) = (false, false);
        for net in announced {
            match net {
                IpNet::V6(_) => ipv6 = true,
                IpNet::V4(_) => ipv4 = true,
            }
        }
        let families = if ipv6 || ipv4 {
            Families { ipv6, ipv4 }
        } else {
            Families {
                ipv6: true,
                ipv4: true,
            }
        };

        let mut neighbors = Vec::with_capacity(self.neighbors.len());
        for (index, spec) in self.neighbors.iter().enumerate() {
            neighbors.push(check_neighbor(index, spec, families, default_gr)?);
        }
        neighbors.sort_by(|a, b| (a.address, &a.interface).cmp(&(b.address, &b.interface)));
        for pair in neighbors.windows(2) {
            let same_address = pair[0].address.is_some() && pair[0].address == pair[1].address;
            // A link-local address is unique only on its link; a dynamic
            // neighbor may be given once per interface.
            let same_link = pair[0].interface == pair[1].interface;
            let ll = pair[0].address.is_none_or(is_link_local);
            if (same_address && (!ll || same_link))
                || (pair[0].address.is_none() && pair[1].address.is_none() && same_link)
            {
                return Err(Error::DuplicateNeighbor {
                    peer: pair[0].peer(),
                });
            }
        }
        let mut names = BTreeSet::new();
        for n in &neighbors {
            if !names.insert(n.name.as_str()) {
                return Err(Error::DuplicateNeighborName {
                    name: n.name.clone(),
                });
            }
        }

        let communities: BTreeSet<Community> = self.communities.iter().copied().collect();
        Ok(ValidModel {
            router_id,
            asn,
            neighbors,
            graceful_restart: self.graceful_restart,
            families,
            cidrs: cidrs.into_iter().collect(),
            host_routes: host_routes.into_iter().collect(),
            services: services.into_iter().collect(),
            communities: communities.into_iter().collect(),
            import_default: self.import_default,
            graceful_shutdown: self.graceful_shutdown,
        })
    }
}

fn check_asn(field: &str, value: u64) -> Result<u32> {
    match u32::try_from(value) {
        Ok(asn) if asn != 0 => Ok(asn),
        _ => Err(Error::Asn {
            field: field.to_owned(),
            value,
        }),
    }
}

fn check_announceable(field: &'static str, net: IpNet) -> Result<()> {
    let reason = if net.prefix_len() == 0 {
        Some("a default route is not a pod prefix")
    } else {
        unusable(net.network())
    };
    match reason {
        Some(reason) => Err(Error::Unannounceable {
            field,
            value: net,
            reason,
        }),
        None => Ok(()),
    }
}

/// Why an address can neither be announced nor peered with, if it cannot.
fn unusable(addr: IpAddr) -> Option<&'static str> {
    match addr {
        IpAddr::V6(a) if a.is_unspecified() => Some("unspecified address"),
        IpAddr::V6(a) if a.is_loopback() => Some("loopback address"),
        IpAddr::V6(a) if a.is_multicast() => Some("multicast address"),
        IpAddr::V6(a) if a.is_unicast_link_local() => Some("link-local address"),
        IpAddr::V4(a) if a.is_unspecified() => Some("unspecified address"),
        IpAddr::V4(a) if a.is_loopback() => Some("loopback address"),
        IpAddr::V4(a) if a.is_multicast() => Some("multicast address"),
        IpAddr::V4(a) if a.is_link_local() => Some("link-local address"),
        IpAddr::V4(a) if a.is_broadcast() => Some("broadcast address"),
        _ => None,
    }
}

fn is_link_local(address: IpAddr) -> bool {
    matches!(address, IpAddr::V6(a) if a.is_unicast_link_local())
}

fn peer_label(address: Option<IpAddr>, interface: Option<&str>) -> String {
    match (address, interface) {
        (Some(a), Some(i)) if is_link_local(a) => format!("{a}%{i}"),
        (Some(a), _) => a.to_string(),
        (None, Some(i)) => i.to_owned(),
        (None, None) => String::new(),
    }
}

fn check_neighbor(
    index: usize,
    spec: &NeighborSpec,
    families: Families,
    default_gr: GracefulRestart,
) -> Result<Neighbor> {
    let interface = match &spec.interface {
        Some(ifname) => {
            check_interface(ifname).map_err(|reason| Error::NeighborInterface {
                index,
                value: ifname.clone(),
                reason,
            })?;
            Some(ifname.clone())
        }
        None => None,
    };
    let text = spec.address.trim();
    let address = if text.is_empty() {
        if interface.is_none() {
            return Err(Error::NeighborAddressMissing { index });
        }
        None
    } else {
        let address: IpAddr = text
            .parse()
            .map_err(|source| Error::NeighborAddressSyntax {
                index,
                value: spec.address.clone(),
                source,
            })?;
        match (is_link_local(address), &interface) {
            (true, None) => {
                return Err(Error::NeighborAddressUnusable {
                    index,
                    address,
                    reason: "link-local address without an interface; set interface too",
                });
            }
            (false, Some(ifname)) => {
                return Err(Error::InterfaceNeedsLinkLocal {
                    index,
                    address,
                    interface: ifname.clone(),
                });
            }
            (true, Some(_)) => {}
            (false, None) => {
                if let Some(reason) = unusable(address) {
                    return Err(Error::NeighborAddressUnusable {
                        index,
                        address,
                        reason,
                    });
                }
            }
        }
        Some(address)
    };
    let peer = peer_label(address, interface.as_deref());
    let ipv4_session = address.is_some_and(|a| a.is_ipv4());
    if ipv4_session && !families.ipv4 {
        return Err(Error::NeighborNoFamily { index, peer });
    }
    let asn = check_asn(&format!("bgp.neighbors[{index}].asn"), spec.asn)?;
    let name = match &spec.name {
        Some(name) => {
            check_name(name).map_err(|reason| Error::NeighborName {
                index,
                value: name.clone(),
                reason,
            })?;
            name.clone()
        }
        None => derived_name(address, interface.as_deref()),
    };
    if let Some(password) = &spec.password {
        check_password(password).map_err(|reason| Error::Password {
            index,
            peer: peer.clone(),
            reason,
        })?;
    }
    if let Some(hops) = spec.multihop {
        if interface.is_some() {
            return Err(Error::InterfaceMultihop { index, peer });
        }
        if hops == 0 {
            return Err(Error::Multihop {
                index,
                peer,
                value: hops,
            });
        }
        if spec.bfd && spec.source_address.is_none() {
            return Err(Error::MultihopBfdNeedsSource { index, peer });
        }
    }
    if let Some(source_address) = spec.source_address
        && source_address.is_ipv4() != ipv4_session
    {
        return Err(Error::SourceFamily {
            index,
            peer,
            source_address,
        });
    }
    if let Some(t) = spec.timers {
        check_timers(t).map_err(|reason| Error::Timers {
            index,
            peer: peer.clone(),
            reason,
        })?;
    }
    if let Some(b) = spec.bfd_timing {
        let reason = if !(1..=60_000).contains(&b.interval_ms) {
            Some(format!(
                "interval {} ms is out of range (1 to 60000 ms)",
                b.interval_ms
            ))
        } else if b.multiplier == 0 {
            Some("multiplier 0 is out of range (1 to 255)".to_owned())
        } else if !spec.bfd {
            Some("BFD timing is set but BFD is off".to_owned())
        } else {
            None
        };
        if let Some(reason) = reason {
            return Err(Error::Bfd {
                index,
                peer,
                reason,
            });
        }
    }
    let graceful_restart = spec.graceful_restart.unwrap_or(default_gr);
    if let GracefulRestart::On {
        restart_time,
        long_lived_stale_time,
    } = graceful_restart
    {
        let field = format!("bgp.neighbors[{index}].gracefulRestart");
        check_restart_time(restart_time).map_err(|reason| Error::GracefulRestart {
            field: field.clone(),
            reason,
        })?;
        if let Some(stale) = long_lived_stale_time
            && !(1..=0xff_ffff).contains(&stale)
        {
            return Err(Error::GracefulRestart {
                field,
                reason: format!(
                    "long-lived stale time {stale} is out of range (1 to 16777215 seconds)"
                ),
            });
        }
    }
    Ok(Neighbor {
        name,
        address,
        interface,
        asn,
        password: spec.password.clone(),
        bfd: spec.bfd,
        bfd_timing: spec.bfd_timing,
        graceful_restart,
        multihop: spec.multihop,
        source_address: spec.source_address,
        timers: spec.timers,
    })
}

fn check_restart_time(time: u16) -> Result<(), String> {
    if (1..=4095).contains(&time) {
        Ok(())
    } else {
        Err(format!(
            "restart time {time} is out of range (1 to 4095 seconds); turn graceful restart off instead of 0"
        ))
    }
}

/// A Linux interface name BIRD can be given in quotes.
fn check_interface(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("it is empty");
    }
    if name.len() > 15 {
        return Err("it is longer than 15 bytes, the Linux limit");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@'))
    {
        return Err("it has a character other than a letter, a digit, '-', '_', '.' or '@'");
    }
    Ok(())
}

fn check_name(name: &str) -> Result<(), &'static str> {
    let mut chars = name.chars();
    match chars.next() {
        None => return Err("it is empty"),
        Some(c) if !c.is_ascii_alphabetic() => return Err("it does not start with a letter"),
        Some(_) => {}
    }
    if !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err("it has a character other than a letter, a digit or '_'");
    }
    if name.len() > 64 {
        return Err("it is longer than 64 characters");
    }
    if name.starts_with("flock_") {
        return Err("names starting with \"flock_\" are flock's own protocols");
    }
    Ok(())
}

/// `peer6_2001_db8__fe`: the address in its canonical text form with
/// separators turned into `_`. Canonical text is unique per address and the
/// family tag keeps IPv4 and IPv6 names apart. A link-local session adds its
/// interface (`peer6_fe80__2_eth0`); a dynamic one is named after the
/// interface alone (`peer6_eth0`).
fn derived_name(address: Option<IpAddr>, interface: Option<&str>) -> String {
    let tag = if address.is_some_and(|a| a.is_ipv4()) {
        "peer4"
    } else {
        "peer6"
    };
    let mut name = String::from(tag);
    for part in [address.map(|a| a.to_string()), interface.map(str::to_owned)]
        .into_iter()
        .flatten()
    {
        name.push('_');
        name.extend(
            part.chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }),
        );
    }
    name
}

fn check_password(password: &str) -> Result<(), &'static str> {
    if password.is_empty() {
        return Err("is empty; leave it out for no password");
    }
    if password.contains('"') {
        return Err("contains '\"', which cannot be written into the BIRD configuration");
    }
    if password.contains('\\') {
        return Err("contains '\\', which cannot be written into the BIRD configuration");
    }
    if password.chars().any(|c| c.is_control()) {
        return Err("contains a control character (a newline?)");
    }
    if password.len() > 80 {
        return Err("is longer than 80 bytes, the TCP MD5 key limit");
    }
    Ok(())
}

fn check_timers(t: Timers) -> Result<(), String> {
    if t.hold != 0 && t.hold < 3 {
        return Err(format!("hold {} must be 0 or at least 3 seconds", t.hold));
    }
    if t.keepalive == 0 {
        return Err("keepalive 0 is not allowed".to_owned());
    }
    if t.hold != 0 && t.keepalive >= t.hold {
        return Err(format!(
            "keepalive {} must be below hold {} (a third of it is usual)",
            t.keepalive, t.hold
        ));
    }
    if t.connect_retry == 0 {
        return Err("connect_retry 0 is not allowed".to_owned());
    }
    Ok(())
}
