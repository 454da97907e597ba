//! The model: [`BirdModel`] as the agent builds it from a NodeConfig and its
//! pods (strings and wide integers, as they arrive), and [`ValidModel`], the
//! checked, sorted and de-duplicated form that [`render`](crate::render) takes.

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

pub(crate) fn is_link_local(address: IpAddr) -> bool {
    matches!(address, IpAddr::V6(a) if a.is_unicast_link_local())
}

pub(crate) fn peer_label(address: Option<IpAddr>, interface: Option<&str>) -> String {
    match (address, interface) {
        (Some(a), Some(i)) if is_link_local(a) => format!("{a}%{i}"),
        (Some(a), _) => a.to_string(),
        (None, Some(i)) => i.to_owned(),
        (None, None) => String::new(),
    }
}
