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
    /// Communities attached to every route flock announces.
    pub communities: Vec<Community>,
    /// Accept a default route (`::/0`, `0.0.0.0/0`) from neighbors.
    pub import_default: bool,
}

/// One BGP neighbor, as given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NeighborSpec {
    /// BIRD protocol name; derived from the address when `None`
    /// (`peer6_2001_db8__fe`, `peer4_192_168_0_1`).
    pub name: Option<String>,
    /// The neighbor's address in text form; empty means missing.
    pub address: String,
    /// The neighbor's AS number; equal to the node's for iBGP.
    pub asn: u64,
    /// TCP MD5 password.
    pub password: Option<String>,
    /// Run BFD with this neighbor.
    pub bfd: bool,
    /// `multihop N` for a neighbor that is not on a shared link; `None`
    /// keeps BIRD's default (direct for eBGP, multihop for iBGP).
    pub multihop: Option<u8>,
    /// The local address of the session; required by BIRD for multihop BFD.
    pub source_address: Option<IpAddr>,
    /// BGP timers; BIRD's defaults when `None`.
    pub timers: Option<Timers>,
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
    pub(crate) address: IpAddr,
    pub(crate) asn: u32,
    pub(crate) password: Option<String>,
    pub(crate) bfd: bool,
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
    /// The neighbor's address.
    pub fn address(&self) -> IpAddr {
        self.address
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
    pub(crate) communities: Vec<Community>,
    pub(crate) import_default: bool,
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
        if self.graceful_restart == Some(0) {
            return Err(Error::GracefulRestartTime);
        }

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
        let announced = cidrs.iter().chain(host_routes.iter());
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
            neighbors.push(check_neighbor(index, spec, families)?);
        }
        neighbors.sort_by_key(|n| n.address);
        for pair in neighbors.windows(2) {
            if pair[0].address == pair[1].address {
                return Err(Error::DuplicateNeighbor {
                    address: pair[0].address,
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
            communities: communities.into_iter().collect(),
            import_default: self.import_default,
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

fn check_neighbor(index: usize, spec: &NeighborSpec, families: Families) -> Result<Neighbor> {
    let text = spec.address.trim();
    if text.is_empty() {
        return Err(Error::NeighborAddressMissing { index });
    }
    let address: IpAddr = text
        .parse()
        .map_err(|source| Error::NeighborAddressSyntax {
            index,
            value: spec.address.clone(),
            source,
        })?;
    if let Some(reason) = unusable(address) {
        return Err(Error::NeighborAddressUnusable {
            index,
            address,
            reason,
        });
    }
    if address.is_ipv4() && !families.ipv4 {
        return Err(Error::NeighborNoFamily { index, address });
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
        None => derived_name(address),
    };
    if let Some(password) = &spec.password {
        check_password(password).map_err(|reason| Error::Password {
            index,
            address,
            reason,
        })?;
    }
    if let Some(hops) = spec.multihop {
        if hops == 0 {
            return Err(Error::Multihop {
                index,
                address,
                value: hops,
            });
        }
        if spec.bfd && spec.source_address.is_none() {
            return Err(Error::MultihopBfdNeedsSource { index, address });
        }
    }
    if let Some(source_address) = spec.source_address
        && source_address.is_ipv4() != address.is_ipv4()
    {
        return Err(Error::SourceFamily {
            index,
            address,
            source_address,
        });
    }
    if let Some(t) = spec.timers {
        check_timers(t).map_err(|reason| Error::Timers {
            index,
            address,
            reason,
        })?;
    }
    Ok(Neighbor {
        name,
        address,
        asn,
        password: spec.password.clone(),
        bfd: spec.bfd,
        multihop: spec.multihop,
        source_address: spec.source_address,
        timers: spec.timers,
    })
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
/// family tag keeps IPv4 and IPv6 names apart.
fn derived_name(address: IpAddr) -> String {
    let tag = if address.is_ipv6() {
        "peer6_"
    } else {
        "peer4_"
    };
    let mut name = String::from(tag);
    name.extend(
        address
            .to_string()
            .chars()
            .map(|c| if c == ':' || c == '.' { '_' } else { c }),
    );
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
