//! From policies, namespaces and pods to the per-pod rule model ([`Ruleset`]), and the
//! model's verdict on a packet.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::addr::{AddrRange, Family};
use crate::cluster::Action;
use crate::input::Protocol;

/// Ingress (traffic to a pod) or egress (traffic from a pod).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Direction {
    /// Traffic to the pod; it leaves the node's namespace through the pod's host veth.
    Ingress,
    /// Traffic from the pod; it enters the node's namespace through the pod's host veth.
    Egress,
}

/// Which decisions of a pod's chains are logged (a namespace's choice, see
/// [`Namespace::log`](crate::Namespace::log)): each is handed to nfnetlink_log group
/// [`LOG_GROUP`] with the prefix [`log_prefix`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LogMode {
    /// The new connections the chain drops.
    Deny,
    /// Every new connection the chain decides, allowed or dropped.
    All,
}

/// The nfnetlink_log group logged decisions go to (`log group 3650`).
pub const LOG_GROUP: u16 = 3650;

/// The `log prefix` of a decision: `flock allow ingress`, `flock deny egress`, …; the side
/// is the pod whose chain decided (the receiver's ingress, the sender's egress).
pub fn log_prefix(allowed: bool, direction: Direction) -> String {
    format!(
        "flock {} {}",
        if allowed { "allow" } else { "deny" },
        direction.as_str()
    )
}

/// The decision a prefix written by [`log_prefix`] stands for; `None` for any other.
pub fn parse_log_prefix(prefix: &str) -> Option<(bool, Direction)> {
    let mut words = prefix.split(' ');
    if words.next()? != "flock" {
        return None;
    }
    let allowed = match words.next()? {
        "allow" => true,
        "deny" => false,
        _ => return None,
    };
    let direction = match words.next()? {
        "ingress" => Direction::Ingress,
        "egress" => Direction::Egress,
        _ => return None,
    };
    words.next().is_none().then_some((allowed, direction))
}

impl Direction {
    /// `ingress` or `egress`.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }
}

/// The elements of a named set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Elements {
    /// Single addresses: the pods of a selector (one element per pod address).
    Addrs(BTreeSet<IpAddr>),
    /// Address ranges, sorted, disjoint and not adjacent: an `ipBlock` minus its excepts.
    Ranges(Vec<AddrRange>),
    /// Address and port: every pod address with the port number a container port name
    /// stands for on that pod (egress named ports).
    AddrPorts(BTreeSet<(IpAddr, u16)>),
}

/// A named nftables set of one address family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddrSet {
    /// Its family (`ipv6_addr` or `ipv4_addr`).
    pub family: Family,
    /// What it stands for, written as a comment above it.
    pub about: String,
    /// Its elements.
    pub elements: Elements,
}

impl AddrSet {
    /// Whether `member` is an element (ranges are never members).
    pub fn has(&self, member: Member) -> bool {
        match (&self.elements, member) {
            (Elements::Addrs(a), Member::Addr(m)) => a.contains(&m),
            (Elements::AddrPorts(a), Member::AddrPort(m, p)) => a.contains(&(m, p)),
            _ => false,
        }
    }

    /// Adds `member`; `false` when it was there already (or is of the other kind).
    pub(crate) fn insert(&mut self, member: Member) -> bool {
        match (&mut self.elements, member) {
            (Elements::Addrs(a), Member::Addr(m)) => a.insert(m),
            (Elements::AddrPorts(a), Member::AddrPort(m, p)) => a.insert((m, p)),
            _ => false,
        }
    }

    pub(crate) fn remove(&mut self, member: Member) {
        match (&mut self.elements, member) {
            (Elements::Addrs(a), Member::Addr(m)) => {
                a.remove(&m);
            }
            (Elements::AddrPorts(a), Member::AddrPort(m, p)) => {
                a.remove(&(m, p));
            }
            _ => {}
        }
    }

    fn contains(&self, addr: IpAddr) -> bool {
        match &self.elements {
            Elements::Addrs(a) => a.contains(&addr),
            Elements::Ranges(r) => r.iter().any(|r| r.contains(&addr)),
            Elements::AddrPorts(_) => false,
        }
    }
}

/// Which transport traffic an [`Allow`] admits.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Ports {
    /// Every protocol, ICMP included.
    Any,
    /// One protocol, destination ports in these inclusive ranges (sorted, disjoint);
    /// `[(0, 65535)]` is every port of the protocol.
    Listed {
        /// The protocol.
        protocol: Protocol,
        /// The port ranges.
        ranges: Vec<(u16, u16)>,
    },
    /// One protocol, the destination (address, port) pair in an
    /// [`AddrPorts`](Elements::AddrPorts) set: an egress rule's named port, resolved per
    /// destination pod.
    Named {
        /// The protocol.
        protocol: Protocol,
        /// The set's name.
        set: String,
    },
}

/// One allow rule of a pod's chain. Every field must match.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Allow {
    /// The address family; `None` is both.
    pub family: Option<Family>,
    /// The set the peer's address (source for ingress, destination for egress) must be in;
    /// `None` is every address.
    pub peer: Option<String>,
    /// The transport.
    pub ports: Ports,
}

/// A rule of a cluster policy tier: what its match admits gets its action.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TierRule {
    /// Accept, Deny or Pass.
    pub action: Action,
    /// What it matches (an [`Allow`]'s fields: family, peer set, ports).
    pub matches: Allow,
}

/// Everything one direction of a local pod's traffic is judged by, in order: the Admin
/// tier's rules (the first that matches decides; Pass skips to the NetworkPolicy tier), the
/// NetworkPolicy allows when a NetworkPolicy isolates the pod (one must match, or the
/// connection is dropped), else the Baseline tier's rules; what nothing decided passes.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Chain {
    /// Admin tier rules, by priority, then policy name, then rule order.
    pub admin: Vec<TierRule>,
    /// `Some` when a NetworkPolicy isolates the pod: the union of what they allow. Then the
    /// Baseline tier is never reached.
    pub policy: Option<Vec<Allow>>,
    /// Baseline tier rules (empty when [`policy`](Self::policy) is `Some`).
    pub baseline: Vec<TierRule>,
    /// Which of the chain's decisions are logged (the pod's namespace's choice).
    pub log: Option<LogMode>,
}

impl Chain {
    /// A chain of NetworkPolicy allows only (no cluster policy selects the pod).
    pub fn policy(allows: Vec<Allow>) -> Chain {
        Chain {
            policy: Some(allows),
            ..Chain::default()
        }
    }

    /// Every match of the chain, in order.
    pub fn matches(&self) -> impl Iterator<Item = &Allow> {
        self.admin
            .iter()
            .map(|r| &r.matches)
            .chain(self.policy.iter().flatten())
            .chain(self.baseline.iter().map(|r| &r.matches))
    }
}

/// The per-pod rule model of one node, which [`render`](Ruleset::render) writes as one
/// nftables table and [`verdict`](Ruleset::verdict) evaluates exactly as the kernel
/// evaluates that table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ruleset {
    /// Named sets by name.
    pub sets: BTreeMap<String, AddrSet>,
    /// For each local pod whose ingress a policy judges, by host veth: what may reach it.
    pub ingress: BTreeMap<String, Chain>,
    /// For each local pod whose egress a policy judges, by host veth: where it may send.
    pub egress: BTreeMap<String, Chain>,
}

/// Where a packet enters or leaves the node's forwarding path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Hop {
    /// The node itself (a local process, kubelet): such traffic is never forwarded.
    Node,
    /// An interface of the node's namespace: a pod's host veth, or an uplink.
    Link(String),
}

/// The transport header of a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// TCP to a destination port.
    Tcp(u16),
    /// UDP to a destination port.
    Udp(u16),
    /// SCTP to a destination port.
    Sctp(u16),
    /// ICMP (IPv4) of a type and code.
    Icmp {
        /// ICMP type.
        kind: u8,
        /// ICMP code.
        code: u8,
    },
    /// ICMPv6 of a type and code.
    Icmpv6 {
        /// ICMPv6 type.
        kind: u8,
        /// ICMPv6 code.
        code: u8,
    },
    /// Any other IP protocol, by number.
    Other(u8),
}

impl Transport {
    pub(crate) fn port(self) -> Option<(Protocol, u16)> {
        match self {
            Transport::Tcp(p) => Some((Protocol::Tcp, p)),
            Transport::Udp(p) => Some((Protocol::Udp, p)),
            Transport::Sctp(p) => Some((Protocol::Sctp, p)),
            _ => None,
        }
    }

    /// ICMP that is never dropped: neighbour discovery, router solicitation and
    /// advertisement, packet-too-big; ICMPv4 fragmentation-needed.
    pub fn always_allowed(self) -> bool {
        match self {
            Transport::Icmpv6 { kind, .. } => ALWAYS_ICMPV6.iter().any(|(t, _)| *t == kind),
            Transport::Icmp { kind: 3, code: 4 } => true,
            _ => false,
        }
    }
}

/// ICMPv6 types accepted whatever the policies: (type, nft name).
pub(crate) const ALWAYS_ICMPV6: [(u8, &str); 5] = [
    (2, "packet-too-big"),
    (133, "nd-router-solicit"),
    (134, "nd-router-advert"),
    (135, "nd-neighbor-solicit"),
    (136, "nd-neighbor-advert"),
];

/// A new connection by its addresses and transport, as [`Model::explain`](crate::Model::explain)
/// takes it: which pods send and receive it is found from the addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Flow {
    /// Source address.
    pub src: IpAddr,
    /// Destination address (after kube-proxy's DNAT: a Service's backend, not the Service).
    pub dst: IpAddr,
    /// Transport (its protocol and destination port, or ICMP type and code).
    pub transport: Transport,
}

/// The first packet of a connection (later ones and replies are conntrack's:
/// `established,related` is accepted before any policy is looked at).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Packet {
    /// Source address.
    pub src: IpAddr,
    /// Destination address (after kube-proxy's DNAT: a Service's backend).
    pub dst: IpAddr,
    /// Transport.
    pub transport: Transport,
    /// Where it enters (a pod's host veth: that pod sends it).
    pub from: Hop,
    /// Where it leaves (a pod's host veth: that pod receives it).
    pub to: Hop,
}

/// What the ruleset does with a packet.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// It passes.
    Accept,
    /// The rules that judge a pod's traffic drop it.
    Drop {
        /// Which side refused it.
        direction: Direction,
        /// The host veth of the pod that refused it.
        host_if: String,
    },
}

impl Ruleset {
    /// The chains of one direction, by host veth.
    pub fn chains(&self, direction: Direction) -> &BTreeMap<String, Chain> {
        match direction {
            Direction::Ingress => &self.ingress,
            Direction::Egress => &self.egress,
        }
    }

    pub(crate) fn chains_mut(&mut self, direction: Direction) -> &mut BTreeMap<String, Chain> {
        match direction {
            Direction::Ingress => &mut self.ingress,
            Direction::Egress => &mut self.egress,
        }
    }

    /// The ruleset with its sets named by what they hold (`set0`, `set1`, … in the order of
    /// family, description and elements; two sets alike get one name): two rulesets whose
    /// canonical forms are equal make the same table but for the sets' names. A model that
    /// took new policies in place ([`Model::update_policies`](crate::Model::update_policies))
    /// keeps the names its sets had; one built afresh numbers them anew.
    pub fn canonical(&self) -> Ruleset {
        let content = |s: &AddrSet| (s.family, s.about.clone(), format!("{:?}", s.elements));
        let distinct: Vec<_> = self
            .sets
            .values()
            .map(content)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let rename: BTreeMap<&str, String> = self
            .sets
            .iter()
            .map(|(name, s)| {
                let i = distinct.binary_search(&content(s)).unwrap_or_default();
                (name.as_str(), format!("set{i}"))
            })
            .collect();
        let name = |n: &String| rename.get(n.as_str()).cloned().unwrap_or_else(|| n.clone());
        let allow = |a: &Allow| Allow {
            family: a.family,
            peer: a.peer.as_ref().map(name),
            ports: match &a.ports {
                Ports::Named { protocol, set } => Ports::Named {
                    protocol: *protocol,
                    set: name(set),
                },
                other => other.clone(),
            },
        };
        let tier = |rules: &[TierRule]| -> Vec<TierRule> {
            rules
                .iter()
                .map(|r| TierRule {
                    action: r.action,
                    matches: allow(&r.matches),
                })
                .collect()
        };
        let chains = |chains: &BTreeMap<String, Chain>| -> BTreeMap<String, Chain> {
            chains
                .iter()
                .map(|(h, c)| {
                    // the NetworkPolicy tier is a set of allows, in the order of their names
                    let policy = c.policy.as_ref().map(|p| {
                        let mut p: Vec<Allow> = p.iter().map(allow).collect();
                        p.sort();
                        p.dedup();
                        p
                    });
                    let chain = Chain {
                        admin: tier(&c.admin),
                        policy,
                        baseline: tier(&c.baseline),
                        log: c.log,
                    };
                    (h.clone(), chain)
                })
                .collect()
        };
        Ruleset {
            sets: self
                .sets
                .iter()
                .map(|(n, s)| (name(n), s.clone()))
                .collect(),
            ingress: chains(&self.ingress),
            egress: chains(&self.egress),
        }
    }

    /// Whether no policy judges a local pod: the table is not needed at all.
    pub fn is_empty(&self) -> bool {
        self.ingress.is_empty() && self.egress.is_empty()
    }

    /// What the rendered table does with `packet`, rule for rule as nftables evaluates it.
    pub fn verdict(&self, packet: &Packet) -> Verdict {
        // pod <-> own node goes through input/output, never forward
        let (Hop::Link(iif), Hop::Link(oif)) = (&packet.from, &packet.to) else {
            return Verdict::Accept;
        };
        if packet.transport.always_allowed() {
            return Verdict::Accept;
        }
        for (direction, chains, host_if) in [
            (Direction::Egress, &self.egress, iif),
            (Direction::Ingress, &self.ingress, oif),
        ] {
            if let Some(chain) = chains.get(host_if)
                && !self.passes(chain, direction, packet)
            {
                return Verdict::Drop {
                    direction,
                    host_if: host_if.clone(),
                };
            }
        }
        Verdict::Accept
    }

    /// Whether `chain` lets `packet` pass, as its rendered chain does.
    fn passes(&self, chain: &Chain, direction: Direction, packet: &Packet) -> bool {
        let flow = Flow {
            src: packet.src,
            dst: packet.dst,
            transport: packet.transport,
        };
        walk(
            chain.admin.iter().map(|r| (&r.matches, r.action)),
            chain.policy.as_ref(),
            chain.baseline.iter().map(|r| (&r.matches, r.action)),
            |a| self.allows(a, direction, &flow),
        )
        .passes()
    }

    /// Whether `allow` matches `flow` in a chain of `direction`, as its rendered rule does.
    pub(crate) fn allows(&self, allow: &Allow, direction: Direction, flow: &Flow) -> bool {
        if allow.family.is_some_and(|f| f != Family::of(&flow.src)) {
            return false;
        }
        let peer = match direction {
            Direction::Ingress => flow.src,
            Direction::Egress => flow.dst,
        };
        if let Some(set) = &allow.peer
            && !self.sets.get(set).is_some_and(|s| s.contains(peer))
        {
            return false;
        }
        match &allow.ports {
            Ports::Any => true,
            Ports::Listed { protocol, ranges } => flow.transport.port().is_some_and(|(p, n)| {
                p == *protocol && ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&n))
            }),
            Ports::Named { protocol, set } => flow.transport.port().is_some_and(|(p, n)| {
                p == *protocol
                    && self.sets.get(set).is_some_and(|s| match &s.elements {
                        Elements::AddrPorts(e) => e.contains(&(flow.dst, n)),
                        _ => false,
                    })
            }),
        }
    }
}

/// What decided a chain's verdict on a packet (`T`: a chain entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decider<T> {
    /// An Admin Accept or Deny, or a Baseline Accept, Deny or Pass, matched first.
    Tier(T, Action),
    /// A NetworkPolicy isolates the pod and this allow matches.
    Allowed(T),
    /// A NetworkPolicy isolates the pod and no allow matches: dropped.
    NotAllowed,
    /// No rule matched and no NetworkPolicy isolates the pod: passes.
    NoMatch,
}

/// A chain walked for one packet: what decided, and the Admin Pass that skipped to the
/// NetworkPolicy tier on the way, if one did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Walk<T> {
    pub(crate) decider: Decider<T>,
    pub(crate) passed: Option<T>,
}

impl<T> Walk<T> {
    /// Whether the chain lets the packet pass.
    pub(crate) fn passes(&self) -> bool {
        match self.decider {
            Decider::Tier(_, action) => action != Action::Deny,
            Decider::Allowed(_) | Decider::NoMatch => true,
            Decider::NotAllowed => false,
        }
    }
}

/// Walks a chain as the rendered one runs: the Admin rules in order (the first match
/// decides; Pass skips to the next tier), then the NetworkPolicy allows when `policy` is
/// `Some` (one must match), else the Baseline rules in order (the first match decides; Pass
/// allows); what nothing matched passes. [`Ruleset::verdict`] and
/// [`Model::explain`](crate::Model::explain) both walk chains with it.
pub(crate) fn walk<T: Copy>(
    admin: impl IntoIterator<Item = (T, Action)>,
    policy: Option<impl IntoIterator<Item = T>>,
    baseline: impl IntoIterator<Item = (T, Action)>,
    matches: impl Fn(T) -> bool,
) -> Walk<T> {
    let mut passed = None;
    for (entry, action) in admin {
        if matches(entry) {
            if action == Action::Pass {
                passed = Some(entry);
                break;
            }
            return Walk {
                decider: Decider::Tier(entry, action),
                passed,
            };
        }
    }
    let decider = match policy {
        Some(allows) => match allows.into_iter().find(|a| matches(*a)) {
            Some(a) => Decider::Allowed(a),
            None => Decider::NotAllowed,
        },
        None => match baseline.into_iter().find(|(entry, _)| matches(*entry)) {
            Some((entry, action)) => Decider::Tier(entry, action),
            None => Decider::NoMatch,
        },
    };
    Walk { decider, passed }
}

pub(crate) fn family_suffix(f: Family) -> &'static str {
    match f {
        Family::V6 => "v6",
        Family::V4 => "v4",
    }
}

/// Sorted, overlapping or adjacent ranges joined.
pub(crate) fn merge(mut ranges: Vec<(u16, u16)>) -> Vec<(u16, u16)> {
    ranges.sort();
    let mut out: Vec<(u16, u16)> = Vec::new();
    for (lo, hi) in ranges {
        match out.last_mut() {
            Some(last) if u32::from(lo) <= u32::from(last.1) + 1 => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    }
    out
}

/// One element of a selector set: a pod address, or (egress named ports) a pod address and
/// the number its port name has on that pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Member {
    /// An address (sets of [`Elements::Addrs`]).
    Addr(IpAddr),
    /// An address and a port (sets of [`Elements::AddrPorts`]).
    AddrPort(IpAddr, u16),
}
