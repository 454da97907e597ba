//! From policies, namespaces and pods to the per-pod rule model ([`Ruleset`]), and the
//! model's verdict on a packet.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use crate::addr::{AddrRange, Family, subtract};
use crate::error::{Error, Result};
use crate::input::{
    CheckedPeer, CheckedPolicy, CheckedRule, LabelSelector, Labels, Namespace, Pod, Port, Protocol,
};

/// Ingress (traffic to a pod) or egress (traffic from a pod).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Direction {
    /// Traffic to the pod; it leaves the node's namespace through the pod's host veth.
    Ingress,
    /// Traffic from the pod; it enters the node's namespace through the pod's host veth.
    Egress,
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

/// The per-pod rule model of one node, which [`render`](Ruleset::render) writes as one
/// nftables table and [`verdict`](Ruleset::verdict) evaluates exactly as the kernel
/// evaluates that table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ruleset {
    /// Named sets by name.
    pub sets: BTreeMap<String, AddrSet>,
    /// For each local pod isolated for ingress, by host veth: what may reach it.
    pub ingress: BTreeMap<String, Vec<Allow>>,
    /// For each local pod isolated for egress, by host veth: where it may send.
    pub egress: BTreeMap<String, Vec<Allow>>,
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
    fn port(self) -> Option<(Protocol, u16)> {
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
    /// A policy-isolated pod's rules do not allow it.
    Drop {
        /// Which side refused it.
        direction: Direction,
        /// The host veth of the pod that refused it.
        host_if: String,
    },
}

impl Ruleset {
    /// Whether no local pod is isolated: the table is not needed at all.
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
            if let Some(allows) = chains.get(host_if)
                && !allows.iter().any(|a| self.allows(a, direction, packet))
            {
                return Verdict::Drop {
                    direction,
                    host_if: host_if.clone(),
                };
            }
        }
        Verdict::Accept
    }

    fn allows(&self, allow: &Allow, direction: Direction, packet: &Packet) -> bool {
        if allow.family.is_some_and(|f| f != Family::of(&packet.src)) {
            return false;
        }
        let peer = match direction {
            Direction::Ingress => packet.src,
            Direction::Egress => packet.dst,
        };
        if let Some(set) = &allow.peer
            && !self.sets.get(set).is_some_and(|s| s.contains(peer))
        {
            return false;
        }
        match &allow.ports {
            Ports::Any => true,
            Ports::Listed { protocol, ranges } => packet.transport.port().is_some_and(|(p, n)| {
                p == *protocol && ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&n))
            }),
            Ports::Named { protocol, set } => packet.transport.port().is_some_and(|(p, n)| {
                p == *protocol
                    && self.sets.get(set).is_some_and(|s| match &s.elements {
                        Elements::AddrPorts(e) => e.contains(&(packet.dst, n)),
                        _ => false,
                    })
            }),
        }
    }
}

/// Which pods a `Pods` peer stands for: a namespace selector or one namespace, and a pod
/// selector (`None`: every pod).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct PodsKey {
    namespaces: NsScope,
    pods: Option<LabelSelector>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum NsScope {
    Named(String),
    Selector(LabelSelector),
}

/// A set before it has a name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum SetKey {
    Pods(PodsKey, Family),
    Block(Family, Vec<AddrRange>),
    NamedPort(String, Protocol, Family),
}

/// An [`Allow`] whose sets have no names yet.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct KeyedAllow {
    family: Option<Family>,
    peer: Option<SetKey>,
    ports: KeyedPorts,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum KeyedPorts {
    Any,
    Listed(Protocol, Vec<(u16, u16)>),
    Named(SetKey),
}

enum PeerPart {
    Any,
    Family(Family),
    Set(Family, SetKey),
}

enum PortPart {
    Any,
    Listed(Protocol, Vec<(u16, u16)>),
    Named(String, Protocol),
}

/// Builds the rule model of the node whose pods are those with a `host_if`.
///
/// `pods` is every flock pod of the cluster (selectors pick peers anywhere); `namespaces`
/// gives the labels namespace selectors see (a pod's namespace missing from it has only the
/// [`NAMESPACE_NAME_LABEL`](crate::NAMESPACE_NAME_LABEL) label). Fails on the first invalid
/// policy or pod: check policies one by one with [`Policy::validate`](crate::Policy::validate)
/// to leave out only the bad ones.
pub fn build(
    policies: &[crate::Policy],
    namespaces: &[Namespace],
    pods: &[Pod],
) -> Result<Ruleset> {
    let mut local: BTreeMap<&str, &Pod> = BTreeMap::new();
    for pod in pods {
        pod.validate()?;
        if let Some(h) = &pod.host_if
            && let Some(other) = local.insert(h, pod)
        {
            return Err(Error::DuplicateHostIf {
                host_if: h.clone(),
                first: other.id(),
                second: pod.id(),
            });
        }
    }
    let policies = policies
        .iter()
        .map(crate::Policy::checked)
        .collect::<Result<Vec<_>>>()?;
    let cluster = Cluster::new(namespaces, pods);

    let mut keyed: [BTreeMap<String, BTreeSet<KeyedAllow>>; 2] = Default::default();
    for (host_if, pod) in &local {
        for (d, direction) in [Direction::Ingress, Direction::Egress]
            .into_iter()
            .enumerate()
        {
            let mut isolated = false;
            let mut allows = BTreeSet::new();
            for p in &policies {
                let rules = match direction {
                    Direction::Ingress => &p.ingress,
                    Direction::Egress => &p.egress,
                };
                let Some(rules) = rules else { continue };
                if p.namespace != pod.namespace || !p.pod_selector.matches(&pod.labels) {
                    continue;
                }
                isolated = true;
                for rule in rules {
                    allows.extend(rule_allows(p, rule, direction, pod));
                }
            }
            if isolated {
                let everything = KeyedAllow {
                    family: None,
                    peer: None,
                    ports: KeyedPorts::Any,
                };
                if allows.contains(&everything) {
                    allows = BTreeSet::from([everything]);
                }
                keyed[d].insert((*host_if).to_owned(), allows);
            }
        }
    }

    // name the sets in the order of their keys
    let mut keys = BTreeSet::new();
    for a in keyed.iter().flat_map(|m| m.values()).flatten() {
        keys.extend(a.peer.clone());
        if let KeyedPorts::Named(k) = &a.ports {
            keys.insert(k.clone());
        }
    }
    let mut names: BTreeMap<SetKey, String> = BTreeMap::new();
    let mut ruleset = Ruleset::default();
    let mut counters: BTreeMap<(&str, Family), usize> = BTreeMap::new();
    for key in keys {
        let (kind, family) = match &key {
            SetKey::Pods(_, f) => ("pods", *f),
            SetKey::Block(f, _) => ("block", *f),
            SetKey::NamedPort(_, _, f) => ("port", *f),
        };
        let n = counters.entry((kind, family)).or_default();
        let name = format!("{kind}{n}_{}", family_suffix(family));
        *n += 1;
        ruleset.sets.insert(name.clone(), cluster.set(&key));
        names.insert(key, name);
    }
    let name = |k: &SetKey| names.get(k).cloned().unwrap_or_default();
    let [ingress, egress] = keyed;
    let finish = |m: BTreeMap<String, BTreeSet<KeyedAllow>>| {
        m.into_iter()
            .map(|(h, allows)| {
                let allows = allows
                    .into_iter()
                    .map(|a| Allow {
                        family: a.family,
                        peer: a.peer.as_ref().map(name),
                        ports: match a.ports {
                            KeyedPorts::Any => Ports::Any,
                            KeyedPorts::Listed(protocol, ranges) => {
                                Ports::Listed { protocol, ranges }
                            }
                            KeyedPorts::Named(k) => Ports::Named {
                                protocol: match &k {
                                    SetKey::NamedPort(_, p, _) => *p,
                                    _ => Protocol::Tcp,
                                },
                                set: name(&k),
                            },
                        },
                    })
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect();
                (h, allows)
            })
            .collect()
    };
    ruleset.ingress = finish(ingress);
    ruleset.egress = finish(egress);
    Ok(ruleset)
}

pub(crate) fn family_suffix(f: Family) -> &'static str {
    match f {
        Family::V6 => "v6",
        Family::V4 => "v4",
    }
}

/// The allow rules one policy rule gives `pod` in `direction`.
fn rule_allows(
    policy: &CheckedPolicy,
    rule: &CheckedRule,
    direction: Direction,
    pod: &Pod,
) -> Vec<KeyedAllow> {
    // ports: merged per protocol; a rule whose ports all name nothing allows nothing
    let mut ports = Vec::new();
    if rule.ports.is_empty() {
        ports.push(PortPart::Any);
    } else {
        let mut listed: BTreeMap<Protocol, Vec<(u16, u16)>> = BTreeMap::new();
        let mut named = BTreeSet::new();
        for spec in &rule.ports {
            let range = match &spec.port {
                None => Some((0, u16::MAX)),
                Some(Port::Number(n)) => Some((*n, spec.end_port.unwrap_or(*n))),
                Some(Port::Name(name)) => match direction {
                    Direction::Ingress => pod.named_port(name, spec.protocol).map(|n| (n, n)),
                    Direction::Egress => {
                        named.insert((name.clone(), spec.protocol));
                        None
                    }
                },
            };
            if let Some(r) = range {
                listed.entry(spec.protocol).or_default().push(r);
            }
        }
        for (protocol, ranges) in listed {
            ports.push(PortPart::Listed(protocol, merge(ranges)));
        }
        for (name, protocol) in named {
            ports.push(PortPart::Named(name, protocol));
        }
    }
    let mut peers = Vec::new();
    if rule.peers.is_empty() {
        peers.push(PeerPart::Any);
    }
    for peer in &rule.peers {
        match peer {
            CheckedPeer::Pods {
                namespace_selector,
                pod_selector,
            } => {
                let key = PodsKey {
                    namespaces: match namespace_selector {
                        Some(s) => NsScope::Selector(s.clone()),
                        None => NsScope::Named(policy.namespace.clone()),
                    },
                    pods: pod_selector.clone(),
                };
                for f in [Family::V6, Family::V4] {
                    peers.push(PeerPart::Set(f, SetKey::Pods(key.clone(), f)));
                }
            }
            CheckedPeer::Block { net, excepts } => {
                let f = Family::of_net(net);
                if net.prefix_len() == 0 && excepts.is_empty() {
                    peers.push(PeerPart::Family(f));
                } else {
                    peers.push(PeerPart::Set(f, SetKey::Block(f, subtract(*net, excepts))));
                }
            }
        }
    }
    let mut out = Vec::new();
    for peer in &peers {
        for port in &ports {
            let (family, peer_key) = match peer {
                PeerPart::Any => (None, None),
                PeerPart::Family(f) => (Some(*f), None),
                PeerPart::Set(f, k) => (Some(*f), Some(k.clone())),
            };
            match port {
                PortPart::Any => out.push(KeyedAllow {
                    family,
                    peer: peer_key,
                    ports: KeyedPorts::Any,
                }),
                PortPart::Listed(p, r) => out.push(KeyedAllow {
                    family,
                    peer: peer_key,
                    ports: KeyedPorts::Listed(*p, r.clone()),
                }),
                PortPart::Named(name, p) => {
                    let families = match family {
                        Some(f) => vec![f],
                        None => vec![Family::V6, Family::V4],
                    };
                    for f in families {
                        out.push(KeyedAllow {
                            family: Some(f),
                            peer: peer_key.clone(),
                            ports: KeyedPorts::Named(SetKey::NamedPort(name.clone(), *p, f)),
                        });
                    }
                }
            }
        }
    }
    out
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

struct Cluster<'a> {
    /// Every namespace's effective labels: the listed ones and those only pods name.
    ns_labels: BTreeMap<&'a str, Labels>,
    /// Pods by namespace.
    by_ns: BTreeMap<&'a str, Vec<&'a Pod>>,
    pods: &'a [Pod],
}

impl<'a> Cluster<'a> {
    fn new(namespaces: &'a [Namespace], pods: &'a [Pod]) -> Cluster<'a> {
        let mut ns_labels: BTreeMap<&str, Labels> = namespaces
            .iter()
            .map(|n| (n.name.as_str(), n.effective_labels()))
            .collect();
        let mut by_ns: BTreeMap<&str, Vec<&Pod>> = BTreeMap::new();
        for pod in pods {
            by_ns.entry(&pod.namespace).or_default().push(pod);
            ns_labels.entry(&pod.namespace).or_insert_with(|| {
                Namespace {
                    name: pod.namespace.clone(),
                    labels: Labels::new(),
                }
                .effective_labels()
            });
        }
        Cluster {
            ns_labels,
            by_ns,
            pods,
        }
    }

    /// The pods a `Pods` peer stands for.
    fn members<'s>(&'s self, key: &'s PodsKey) -> impl Iterator<Item = &'a Pod> + 's {
        self.by_ns
            .iter()
            .filter(move |(ns, _)| match &key.namespaces {
                NsScope::Named(n) => n == *ns,
                NsScope::Selector(s) => self.ns_labels.get(*ns).is_some_and(|l| s.matches(l)),
            })
            .flat_map(|(_, pods)| pods.iter().copied())
            .filter(move |p| key.pods.as_ref().is_none_or(|s| s.matches(&p.labels)))
    }

    fn set(&self, key: &SetKey) -> AddrSet {
        let of_family = |f: Family| move |a: &&IpAddr| Family::of(a) == f;
        match key {
            SetKey::Pods(k, f) => AddrSet {
                family: *f,
                about: format!(
                    "pods of {} matching {}",
                    match &k.namespaces {
                        NsScope::Named(n) => format!("namespace {n}"),
                        NsScope::Selector(s) => format!("namespaces matching {s}"),
                    },
                    k.pods.clone().unwrap_or_default()
                ),
                elements: Elements::Addrs(
                    self.members(k)
                        .flat_map(|p| p.addresses.iter().filter(of_family(*f)).copied())
                        .collect(),
                ),
            },
            SetKey::Block(f, ranges) => AddrSet {
                family: *f,
                about: "ipBlock minus its excepts".to_owned(),
                elements: Elements::Ranges(ranges.clone()),
            },
            SetKey::NamedPort(name, protocol, f) => AddrSet {
                family: *f,
                about: format!("pods with a {} port named {name}", protocol.as_str()),
                elements: Elements::AddrPorts(
                    self.pods
                        .iter()
                        .filter_map(|p| p.named_port(name, *protocol).map(|n| (p, n)))
                        .flat_map(|(p, n)| {
                            p.addresses
                                .iter()
                                .filter(of_family(*f))
                                .map(move |a| (*a, n))
                        })
                        .collect(),
                ),
            },
        }
    }
}
