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
    /// Whether `member` is an element (ranges are never members).
    pub fn has(&self, member: Member) -> bool {
        match (&self.elements, member) {
            (Elements::Addrs(a), Member::Addr(m)) => a.contains(&m),
            (Elements::AddrPorts(a), Member::AddrPort(m, p)) => a.contains(&(m, p)),
            _ => false,
        }
    }

    fn insert(&mut self, member: Member) {
        match (&mut self.elements, member) {
            (Elements::Addrs(a), Member::Addr(m)) => {
                a.insert(m);
            }
            (Elements::AddrPorts(a), Member::AddrPort(m, p)) => {
                a.insert((m, p));
            }
            _ => {}
        }
    }

    fn remove(&mut self, member: Member) {
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
    /// The chains of one direction, by host veth.
    pub fn chains(&self, direction: Direction) -> &BTreeMap<String, Vec<Allow>> {
        match direction {
            Direction::Ingress => &self.ingress,
            Direction::Egress => &self.egress,
        }
    }

    fn chains_mut(&mut self, direction: Direction) -> &mut BTreeMap<String, Vec<Allow>> {
        match direction {
            Direction::Ingress => &mut self.ingress,
            Direction::Egress => &mut self.egress,
        }
    }

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
/// to leave out only the bad ones. [`Model::new`] builds the same and keeps what it needs to
/// follow pods joining and leaving without a rebuild.
pub fn build(
    policies: &[crate::Policy],
    namespaces: &[Namespace],
    pods: &[Pod],
) -> Result<Ruleset> {
    Model::new(policies, namespaces, pods).map(Model::into_ruleset)
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

/// A local pod's chain of one direction before and after a change (`None`: not isolated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainChange {
    /// Which chain.
    pub direction: Direction,
    /// The pod's host veth.
    pub host_if: String,
    /// Its allow rules before (`None`: the pod was not isolated for `direction`).
    pub before: Option<Vec<Allow>>,
    /// Its allow rules after.
    pub after: Option<Vec<Allow>>,
}

/// What changed in a [`Model`] since the last [`Model::take_delta`]: set elements that came
/// (`true`) or went (`false`), and local pods' chains. Sets themselves never change in a
/// delta: a change that would add or remove a set makes [`Model::add_pod`] or
/// [`Model::remove_pod`] ask for a rebuild.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delta {
    /// `(set, element, added)`, sorted by set and element.
    pub elements: Vec<(String, Member, bool)>,
    /// Chains that differ, sorted by direction and host veth.
    pub chains: Vec<ChainChange>,
}

impl Delta {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.elements.is_empty() && self.chains.is_empty()
    }
}

/// What a [`Model`] changed since the last delta: each touched element's and chain's state
/// before.
#[derive(Debug, Clone, Default)]
struct Journal {
    /// Off while [`Model::new`] joins every pod: a fresh model has no delta, and recording
    /// each element (a copy of its set's name) would double the memory a build peaks at.
    off: bool,
    elements: BTreeMap<(String, Member), bool>,
    chains: BTreeMap<(Direction, String), Option<Vec<Allow>>>,
}

/// The rule model of a node, kept up to date pod by pod: [`add_pod`](Model::add_pod) and
/// [`remove_pod`](Model::remove_pod) change set members and local pods' chains in time
/// proportional to the pod (not the cluster), and leave the model equal to what
/// [`Model::new`] would build from the new inputs. A change of policies or namespace labels
/// needs a new model.
#[derive(Debug, Clone)]
pub struct Model {
    policies: Vec<CheckedPolicy>,
    /// Effective labels of the listed namespaces.
    ns_labels: BTreeMap<String, Labels>,
    names: BTreeMap<SetKey, String>,
    /// Sets whose members are pods: `(name, key)`.
    member_sets: Vec<(String, SetKey)>,
    /// Indices into `member_sets` of the sets of pods of one named namespace.
    scoped: BTreeMap<String, Vec<usize>>,
    /// Indices of the other member sets (namespace selectors, named ports).
    unscoped: Vec<usize>,
    /// Per set, how many pods besides the first hold an element (an anycast address may be
    /// several pods'). The set itself says whether one does: no second copy of every element.
    extra: BTreeMap<String, BTreeMap<Member, u32>>,
    /// Per set, how many local chains name it.
    set_users: BTreeMap<String, usize>,
    /// Local pods by host veth: their `namespace/name`.
    local: BTreeMap<String, String>,
    ruleset: Ruleset,
    journal: Journal,
}

const DIRECTIONS: [Direction; 2] = [Direction::Ingress, Direction::Egress];

impl Model {
    /// Builds the model (see [`build`]).
    pub fn new(
        policies: &[crate::Policy],
        namespaces: &[Namespace],
        pods: &[Pod],
    ) -> Result<Model> {
        let mut local: BTreeMap<String, String> = BTreeMap::new();
        for pod in pods {
            pod.validate()?;
            if let Some(h) = &pod.host_if
                && let Some(first) = local.insert(h.clone(), pod.id())
            {
                return Err(Error::DuplicateHostIf {
                    host_if: h.clone(),
                    first,
                    second: pod.id(),
                });
            }
        }
        let policies = policies
            .iter()
            .map(crate::Policy::checked)
            .collect::<Result<Vec<_>>>()?;
        let mut keyed: Vec<(Direction, &str, BTreeSet<KeyedAllow>)> = Vec::new();
        for pod in pods {
            let Some(h) = &pod.host_if else { continue };
            for direction in DIRECTIONS {
                if let Some(allows) = pod_allows(&policies, pod, direction) {
                    keyed.push((direction, h, allows));
                }
            }
        }
        let mut model = Model {
            policies,
            ns_labels: namespaces
                .iter()
                .map(|n| (n.name.clone(), n.effective_labels()))
                .collect(),
            names: BTreeMap::new(),
            member_sets: Vec::new(),
            scoped: BTreeMap::new(),
            unscoped: Vec::new(),
            extra: BTreeMap::new(),
            set_users: BTreeMap::new(),
            local,
            ruleset: Ruleset::default(),
            journal: Journal::default(),
        };

        // name the sets in the order of their keys
        let mut keys = BTreeSet::new();
        for (_, _, allows) in &keyed {
            for a in allows {
                keys.extend(a.peer.clone());
                if let KeyedPorts::Named(k) = &a.ports {
                    keys.insert(k.clone());
                }
            }
        }
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
            model.ruleset.sets.insert(name.clone(), empty_set(&key));
            match &key {
                SetKey::Pods(
                    PodsKey {
                        namespaces: NsScope::Named(ns),
                        ..
                    },
                    _,
                ) => model
                    .scoped
                    .entry(ns.clone())
                    .or_default()
                    .push(model.member_sets.len()),
                SetKey::Block(..) => {}
                _ => model.unscoped.push(model.member_sets.len()),
            }
            if !matches!(key, SetKey::Block(..)) {
                model.member_sets.push((name.clone(), key.clone()));
            }
            model.names.insert(key, name);
        }
        for (direction, host_if, allows) in keyed {
            let allows = model.name_allows(&allows).unwrap_or_default();
            for set in referenced(&allows) {
                *model.set_users.entry(set.to_owned()).or_default() += 1;
            }
            model
                .ruleset
                .chains_mut(direction)
                .insert(host_if.to_owned(), allows);
        }
        model.journal.off = true;
        for pod in pods {
            model.join(pod);
        }
        model.journal = Journal::default();
        Ok(model)
    }

    /// The model as a ruleset.
    pub fn ruleset(&self) -> &Ruleset {
        &self.ruleset
    }

    /// The ruleset, without what the model keeps to follow changes.
    pub fn into_ruleset(self) -> Ruleset {
        self.ruleset
    }

    /// A pod joins (a local one with its `host_if`). `Ok(false)`: the model cannot follow
    /// without a set it lacks (a local pod selected by a policy that no other local pod is);
    /// build a new one — this one is unchanged. An invalid pod, or a second pod of the same
    /// host veth, is an error, as for [`build`].
    pub fn add_pod(&mut self, pod: &Pod) -> Result<bool> {
        pod.validate()?;
        if let Some(h) = &pod.host_if {
            if let Some(first) = self.local.get(h) {
                return Err(Error::DuplicateHostIf {
                    host_if: h.clone(),
                    first: first.clone(),
                    second: pod.id(),
                });
            }
            let mut chains = Vec::new();
            for direction in DIRECTIONS {
                if let Some(allows) = pod_allows(&self.policies, pod, direction) {
                    match self.name_allows(&allows) {
                        Some(named) => chains.push((direction, named)),
                        None => return Ok(false),
                    }
                }
            }
            self.local.insert(h.clone(), pod.id());
            for (direction, allows) in chains {
                for set in referenced(&allows) {
                    *self.set_users.entry(set.to_owned()).or_default() += 1;
                }
                self.note_chain(direction, h);
                self.ruleset.chains_mut(direction).insert(h.clone(), allows);
            }
        }
        self.join(pod);
        Ok(true)
    }

    /// A pod leaves; `pod` must be the value it joined with. `false`: the model cannot
    /// follow (a set would go unused, or `pod` is not what joined); build a new one — this
    /// one is then in no defined state.
    pub fn remove_pod(&mut self, pod: &Pod) -> bool {
        if let Some(h) = &pod.host_if {
            if self.local.get(h) != Some(&pod.id()) {
                return false;
            }
            self.local.remove(h);
            for direction in DIRECTIONS {
                self.note_chain(direction, h);
                let Some(allows) = self.ruleset.chains_mut(direction).remove(h) else {
                    continue;
                };
                for set in referenced(&allows) {
                    match self.set_users.get_mut(set) {
                        Some(n) if *n > 1 => *n -= 1,
                        _ => return false,
                    }
                }
            }
        }
        self.leave(pod)
    }

    /// What changed since the last call (or since the model was built).
    pub fn take_delta(&mut self) -> Delta {
        let journal = std::mem::take(&mut self.journal);
        let elements = journal
            .elements
            .into_iter()
            .filter_map(|((set, member), before)| {
                let now = self.ruleset.sets.get(&set).is_some_and(|s| s.has(member));
                (now != before).then_some((set, member, now))
            })
            .collect();
        let chains = journal
            .chains
            .into_iter()
            .filter_map(|((direction, host_if), before)| {
                let after = self.ruleset.chains(direction).get(&host_if).cloned();
                (after != before).then_some(ChainChange {
                    direction,
                    host_if,
                    before,
                    after,
                })
            })
            .collect();
        Delta { elements, chains }
    }

    fn note_chain(&mut self, direction: Direction, host_if: &str) {
        if !self
            .journal
            .chains
            .contains_key(&(direction, host_if.to_owned()))
        {
            let before = self.ruleset.chains(direction).get(host_if).cloned();
            self.journal
                .chains
                .insert((direction, host_if.to_owned()), before);
        }
    }

    /// The allow rules with their sets named; `None` when a set is not in the model.
    fn name_allows(&self, allows: &BTreeSet<KeyedAllow>) -> Option<Vec<Allow>> {
        let name = |k: &SetKey| self.names.get(k).cloned();
        let mut out = BTreeSet::new();
        for a in allows {
            out.insert(Allow {
                family: a.family,
                peer: match &a.peer {
                    Some(k) => Some(name(k)?),
                    None => None,
                },
                ports: match &a.ports {
                    KeyedPorts::Any => Ports::Any,
                    KeyedPorts::Listed(protocol, ranges) => Ports::Listed {
                        protocol: *protocol,
                        ranges: ranges.clone(),
                    },
                    KeyedPorts::Named(k) => Ports::Named {
                        protocol: match k {
                            SetKey::NamedPort(_, p, _) => *p,
                            _ => Protocol::Tcp,
                        },
                        set: name(k)?,
                    },
                },
            });
        }
        Some(out.into_iter().collect())
    }

    /// The member sets `pod` is in, and the elements it gives each.
    fn memberships(&self, pod: &Pod) -> Vec<(String, Vec<Member>)> {
        let unlisted;
        let ns_labels = match self.ns_labels.get(&pod.namespace) {
            Some(l) => l,
            None => {
                unlisted = Namespace {
                    name: pod.namespace.clone(),
                    labels: Labels::new(),
                }
                .effective_labels();
                &unlisted
            }
        };
        let mut addresses = pod.addresses.clone();
        addresses.sort();
        addresses.dedup();
        let of = |f: Family| addresses.iter().filter(move |a| Family::of(a) == f);
        let mut out = Vec::new();
        let scoped = self.scoped.get(&pod.namespace).into_iter().flatten();
        for i in scoped.chain(&self.unscoped) {
            let (name, key) = &self.member_sets[*i];
            let members: Vec<Member> = match key {
                SetKey::Pods(k, f) => {
                    let in_scope = match &k.namespaces {
                        NsScope::Named(n) => *n == pod.namespace,
                        NsScope::Selector(s) => s.matches(ns_labels),
                    };
                    if !in_scope || !k.pods.as_ref().is_none_or(|s| s.matches(&pod.labels)) {
                        continue;
                    }
                    of(*f).map(|a| Member::Addr(*a)).collect()
                }
                SetKey::NamedPort(port, protocol, f) => match pod.named_port(port, *protocol) {
                    Some(n) => of(*f).map(|a| Member::AddrPort(*a, n)).collect(),
                    None => continue,
                },
                SetKey::Block(..) => continue,
            };
            if !members.is_empty() {
                out.push((name.clone(), members));
            }
        }
        out
    }

    /// Adds `pod`'s elements to the sets it is in.
    fn join(&mut self, pod: &Pod) {
        for (set, members) in self.memberships(pod) {
            let Some(s) = self.ruleset.sets.get_mut(&set) else {
                continue;
            };
            for m in members {
                if s.has(m) {
                    *self
                        .extra
                        .entry(set.clone())
                        .or_default()
                        .entry(m)
                        .or_default() += 1;
                } else {
                    s.insert(m);
                    if !self.journal.off {
                        self.journal
                            .elements
                            .entry((set.clone(), m))
                            .or_insert(false);
                    }
                }
            }
        }
    }

    /// Takes `pod`'s elements out of the sets it is in; `false` when one is not there.
    fn leave(&mut self, pod: &Pod) -> bool {
        for (set, members) in self.memberships(pod) {
            let Some(s) = self.ruleset.sets.get_mut(&set) else {
                return false;
            };
            for m in members {
                if let Some(extra) = self.extra.get_mut(&set)
                    && let Some(n) = extra.get_mut(&m)
                {
                    *n -= 1;
                    if *n == 0 {
                        extra.remove(&m);
                        if extra.is_empty() {
                            self.extra.remove(&set);
                        }
                    }
                } else if s.has(m) {
                    s.remove(m);
                    self.journal
                        .elements
                        .entry((set.clone(), m))
                        .or_insert(true);
                } else {
                    return false;
                }
            }
        }
        true
    }
}

/// The sets an allow list names, each once.
fn referenced(allows: &[Allow]) -> BTreeSet<&str> {
    let mut out = BTreeSet::new();
    for a in allows {
        if let Some(p) = &a.peer {
            out.insert(p.as_str());
        }
        if let Ports::Named { set, .. } = &a.ports {
            out.insert(set.as_str());
        }
    }
    out
}

/// What the policies that select `pod` allow it in `direction`; `None` when none does (the
/// pod is not isolated for it).
fn pod_allows(
    policies: &[CheckedPolicy],
    pod: &Pod,
    direction: Direction,
) -> Option<BTreeSet<KeyedAllow>> {
    let mut isolated = false;
    let mut allows = BTreeSet::new();
    for p in policies {
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
    if !isolated {
        return None;
    }
    let everything = KeyedAllow {
        family: None,
        peer: None,
        ports: KeyedPorts::Any,
    };
    if allows.contains(&everything) {
        allows = BTreeSet::from([everything]);
    }
    Some(allows)
}

/// A set before any pod joined it.
fn empty_set(key: &SetKey) -> AddrSet {
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
            elements: Elements::Addrs(BTreeSet::new()),
        },
        SetKey::Block(f, ranges) => AddrSet {
            family: *f,
            about: "ipBlock minus its excepts".to_owned(),
            elements: Elements::Ranges(ranges.clone()),
        },
        SetKey::NamedPort(name, protocol, f) => AddrSet {
            family: *f,
            about: format!("pods with a {} port named {name}", protocol.as_str()),
            elements: Elements::AddrPorts(BTreeSet::new()),
        },
    }
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
