//! The one error type of this crate.

use std::net::IpAddr;

use ipnet::IpNet;

/// What is wrong with a [`BirdModel`](crate::BirdModel), a [`Community`](crate::Community)
/// or `birdc` output; every variant names the field and the value so the message alone says
/// what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The router ID is not an IPv4 address.
    #[error("bgp.routerId {value:?} is not an IPv4 address (BIRD router IDs look like 10.0.0.1)")]
    RouterIdSyntax {
        /// The value as given.
        value: String,
        /// Why it did not parse.
        #[source]
        source: std::net::AddrParseError,
    },
    /// The router ID is 0.0.0.0, which BGP forbids.
    #[error("bgp.routerId 0.0.0.0 is not allowed; use a unique non-zero IPv4 address")]
    RouterIdZero,
    /// An AS number is 0 or does not fit in 32 bits.
    #[error("{field} {value} is not a valid AS number (1 to 4294967295)")]
    Asn {
        /// Which field (`bgp.asn`, `bgp.neighbors[2].asn`).
        field: String,
        /// The value as given.
        value: u64,
    },
    /// A neighbor has no address.
    #[error("bgp.neighbors[{index}].address is missing")]
    NeighborAddressMissing {
        /// Position of the neighbor in the input list.
        index: usize,
    },
    /// A neighbor address does not parse.
    #[error("bgp.neighbors[{index}].address {value:?} is not an IP address")]
    NeighborAddressSyntax {
        /// Position of the neighbor in the input list.
        index: usize,
        /// The value as given.
        value: String,
        /// Why it did not parse.
        #[source]
        source: std::net::AddrParseError,
    },
    /// A neighbor address cannot be peered with (unspecified, loopback,
    /// multicast, link-local, broadcast).
    #[error(
        "bgp.neighbors[{index}].address {address} cannot be a BGP neighbor ({reason}); use the peer's unicast address"
    )]
    NeighborAddressUnusable {
        /// Position of the neighbor in the input list.
        index: usize,
        /// The address.
        address: IpAddr,
        /// What kind of address it is.
        reason: &'static str,
    },
    /// Two neighbors have the same address.
    #[error("bgp.neighbors: {peer} is listed twice; each neighbor address may appear once")]
    DuplicateNeighbor {
        /// The repeated neighbor (`2001:db8::fe`, `fe80::2%eth0`, `eth0`).
        peer: String,
    },
    /// Two neighbors end up with the same BIRD protocol name.
    #[error(
        "bgp.neighbors: protocol name {name:?} is used by two neighbors; give them distinct names"
    )]
    DuplicateNeighborName {
        /// The repeated name.
        name: String,
    },
    /// A neighbor name is not a usable BIRD protocol name.
    #[error(
        "bgp.neighbors[{index}].name {value:?} is not usable: {reason} (letters, digits and '_', starting with a letter, at most 64 characters, not starting with \"flock_\")"
    )]
    NeighborName {
        /// Position of the neighbor in the input list.
        index: usize,
        /// The value as given.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A neighbor password cannot be written into the configuration.
    #[error("bgp.neighbors[{index}].password for {peer} {reason}")]
    Password {
        /// Position of the neighbor in the input list.
        index: usize,
        /// The neighbor it belongs to (the password itself is never printed).
        peer: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// BGP timers BIRD would refuse.
    #[error("bgp.neighbors[{index}].timers for {peer}: {reason}")]
    Timers {
        /// Position of the neighbor in the input list.
        index: usize,
        /// The neighbor they belong to.
        peer: String,
        /// What is wrong with them.
        reason: String,
    },
    /// A multihop value of 0, or over 255 hops.
    #[error("bgp.neighbors[{index}].multihop {value} for {peer} is not a hop count (1 to 255)")]
    Multihop {
        /// Position of the neighbor in the input list.
        index: usize,
        /// The neighbor it belongs to.
        peer: String,
        /// The value as given.
        value: u8,
    },
    /// BIRD requires a source address for a multihop session with BFD.
    #[error(
        "bgp.neighbors[{index}] {peer}: multihop with BFD needs sourceAddress (BIRD requires a fixed local address)"
    )]
    MultihopBfdNeedsSource {
        /// Position of the neighbor in the input list.
        index: usize,
        /// The neighbor.
        peer: String,
    },
    /// The source address is not of the neighbor's family.
    #[error(
        "bgp.neighbors[{index}].sourceAddress {source_address} is not of the same family as the neighbor {peer}"
    )]
    SourceFamily {
        /// Position of the neighbor in the input list.
        index: usize,
        /// The neighbor.
        peer: String,
        /// The source address as given.
        source_address: IpAddr,
    },
    /// A neighbor would carry no address family: an IPv4 session carries only
    /// IPv4, and this node announces and learns no IPv4.
    #[error(
        "bgp.neighbors[{index}] {peer} is an IPv4 neighbor but the node has no IPv4 prefixes; IPv6 routes need an IPv6 neighbor"
    )]
    NeighborNoFamily {
        /// Position of the neighbor in the input list.
        index: usize,
        /// The neighbor.
        peer: String,
    },
    /// A node CIDR with host bits set.
    #[error("node CIDR {value} has host bits set; did you mean {truncated}?")]
    CidrHostBits {
        /// The CIDR as given.
        value: IpNet,
        /// The network it probably meant.
        truncated: IpNet,
    },
    /// A Service route with host bits set.
    #[error("service route {value} has host bits set; did you mean {truncated}?")]
    ServiceRouteHostBits {
        /// The route as given.
        value: IpNet,
        /// The network it probably meant.
        truncated: IpNet,
    },
    /// A node CIDR or an announced address BGP must never carry.
    #[error("{field} {value} cannot be announced: {reason}")]
    Unannounceable {
        /// Which list it came from (`cidrs`, `addresses`, `anycast`).
        field: &'static str,
        /// The value.
        value: IpNet,
        /// Why not.
        reason: &'static str,
    },
    /// A BGP community that does not parse.
    #[error("community {value:?} {reason}")]
    CommunitySyntax {
        /// The text as given.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// `birdc show protocols` printed something that is not its table.
    #[error("birdc show protocols: {reason}: {line:?}")]
    ShowProtocols {
        /// What is missing.
        reason: &'static str,
        /// The offending line (the whole output when the table is missing).
        line: String,
    },
    /// `birdc show route` or `show bfd sessions` printed something that is not its answer.
    #[error("birdc {command}: {reason}: {line:?}")]
    Show {
        /// The command (`show route`, `show bfd sessions`).
        command: &'static str,
        /// What is wrong.
        reason: &'static str,
        /// The offending line (the whole output when nothing is recognised).
        line: String,
    },
    /// A graceful-restart setting BGP cannot carry.
    #[error("{field}: {reason}")]
    GracefulRestart {
        /// Which field (`bgp.gracefulRestart`, `bgp.neighbors[0].gracefulRestart`).
        field: String,
        /// What is wrong, with the value.
        reason: String,
    },
    /// An interface name BIRD or Linux would refuse.
    #[error("bgp.neighbors[{index}].interface {value:?} is not an interface name: {reason}")]
    NeighborInterface {
        /// Position of the neighbor in the input list.
        index: usize,
        /// The value as given.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An interface was given with an address that is not link-local.
    #[error(
        "bgp.neighbors[{index}].interface {interface:?} is for link-local peering, but address {address} is not link-local (fe80::/10); leave interface out or give the peer's link-local address"
    )]
    InterfaceNeedsLinkLocal {
        /// Position of the neighbor in the input list.
        index: usize,
        /// The address.
        address: IpAddr,
        /// The interface.
        interface: String,
    },
    /// Multihop makes no sense for a session over one link.
    #[error(
        "bgp.neighbors[{index}] {peer}: multihop cannot be combined with interface (a link-local session is one hop)"
    )]
    InterfaceMultihop {
        /// Position of the neighbor in the input list.
        index: usize,
        /// The neighbor.
        peer: String,
    },
    /// BFD timing BIRD would refuse.
    #[error("bgp.neighbors[{index}].bfd for {peer}: {reason}")]
    Bfd {
        /// Position of the neighbor in the input list.
        index: usize,
        /// The neighbor.
        peer: String,
        /// What is wrong, with the value.
        reason: String,
    },
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
