//! What each pod is allowed, before sets are shared: the keys under which equal address sets
//! and port lists are found, and each policy rule turned into keyed allows.

use std::collections::{BTreeMap, BTreeSet};

use crate::addr::{AddrRange, Family, subtract};
use crate::cluster::{Action, CheckedClusterPolicy, Tier};
use crate::input::{CheckedPeer, CheckedPolicy, Pod, Port, PortSpec, Protocol};
use crate::model::{AddrSet, Chain, Direction, Elements, Ports, merge};
use crate::selector::{LabelSelector, Labels};

/// Which pods a `Pods` peer stands for: a namespace selector or one namespace, and a pod
/// selector (`None`: every pod).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct PodsKey {
    pub(crate) namespaces: NsScope,
    pub(crate) pods: Option<LabelSelector>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum NsScope {
    Named(String),
    Selector(LabelSelector),
}

/// A set before it has a name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum SetKey {
    Pods(PodsKey, Family),
    Block(Family, Vec<AddrRange>),
    NamedPort(String, Protocol, Family),
}

/// An [`Allow`] whose sets have no names yet.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct KeyedAllow {
    pub(crate) family: Option<Family>,
    pub(crate) peer: Option<SetKey>,
    pub(crate) ports: KeyedPorts,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum KeyedPorts {
    Any,
    Listed(Protocol, Vec<(u16, u16)>),
    Named(SetKey),
}

pub(crate) enum PeerPart {
    Any,
    Family(Family),
    Set(Family, SetKey),
}

pub(crate) enum PortPart {
    Any,
    Listed(Protocol, Vec<(u16, u16)>),
    Named(String, Protocol),
}

/// A [`Chain`] whose sets have no names yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyedChain {
    pub(crate) admin: Vec<(Action, KeyedAllow)>,
    pub(crate) policy: Option<BTreeSet<KeyedAllow>>,
    pub(crate) baseline: Vec<(Action, KeyedAllow)>,
}

impl KeyedChain {
    /// Every allow of the chain.
    pub(crate) fn allows(&self) -> impl Iterator<Item = &KeyedAllow> {
        self.admin
            .iter()
            .map(|(_, a)| a)
            .chain(self.policy.iter().flatten())
            .chain(self.baseline.iter().map(|(_, a)| a))
    }
}

/// The sets a chain names, each once.
pub(crate) fn referenced(chain: &Chain) -> BTreeSet<&str> {
    let mut out = BTreeSet::new();
    for a in chain.matches() {
        if let Some(p) = &a.peer {
            out.insert(p.as_str());
        }
        if let Ports::Named { set, .. } = &a.ports {
            out.insert(set.as_str());
        }
    }
    out
}

/// Which rule an allow comes from: `policy` indexes the model's NetworkPolicies (for the
/// NetworkPolicy tier) or its cluster policies (for the Admin and Baseline tiers), `rule` that
/// policy's rules of the direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Origin {
    pub(crate) policy: usize,
    pub(crate) rule: usize,
}

/// The NetworkPolicy tier of a pod isolated in a direction: the policies that isolate it
/// (indexes) and the allows of their rules, each with its rule.
#[derive(Debug, Clone)]
pub(crate) struct SourcedPolicies {
    pub(crate) isolating: Vec<usize>,
    pub(crate) allows: Vec<(Origin, KeyedAllow)>,
}

impl SourcedPolicies {
    /// The allows a chain holds: all of them, or when one allows everything, only the ones
    /// that do (the others add nothing, and their sets are not made for the chain).
    pub(crate) fn held(&self) -> impl Iterator<Item = &(Origin, KeyedAllow)> {
        let everything =
            |a: &KeyedAllow| a.family.is_none() && a.peer.is_none() && a.ports == KeyedPorts::Any;
        let any_everything = self.allows.iter().any(|(_, a)| everything(a));
        self.allows
            .iter()
            .filter(move |(_, a)| !any_everything || everything(a))
    }
}

/// A [`KeyedChain`] that still knows which rule each entry comes from: what
/// [`pod_chain`] is made of, and what an explanation walks.
#[derive(Debug, Clone)]
pub(crate) struct SourcedChain {
    pub(crate) admin: Vec<(Origin, Action, KeyedAllow)>,
    pub(crate) policy: Option<SourcedPolicies>,
    pub(crate) baseline: Vec<(Origin, Action, KeyedAllow)>,
}

impl SourcedChain {
    /// The chain without provenance: a NetworkPolicy tier's allows become one set (and
    /// "everything" alone when one allows everything).
    pub(crate) fn keyed(self) -> KeyedChain {
        let tier = |rules: Vec<(Origin, Action, KeyedAllow)>| {
            rules
                .into_iter()
                .map(|(_, action, a)| (action, a))
                .collect()
        };
        KeyedChain {
            admin: tier(self.admin),
            policy: self
                .policy
                .map(|p| p.held().map(|(_, a)| a.clone()).collect()),
            baseline: tier(self.baseline),
        }
    }
}

/// What the policies that select `pod` allow it in `direction`, rule by rule; `None` when
/// none does (the pod is not isolated for it).
fn pod_allows(
    policies: &[CheckedPolicy],
    pod: &Pod,
    direction: Direction,
) -> Option<SourcedPolicies> {
    let mut isolating = Vec::new();
    let mut allows = Vec::new();
    for (i, p) in policies.iter().enumerate() {
        let rules = match direction {
            Direction::Ingress => &p.ingress,
            Direction::Egress => &p.egress,
        };
        let Some(rules) = rules else { continue };
        if p.namespace != pod.namespace || !p.pod_selector.matches(&pod.labels) {
            continue;
        }
        isolating.push(i);
        for (j, rule) in rules.iter().enumerate() {
            let origin = Origin { policy: i, rule: j };
            allows.extend(
                rule_allows(&p.namespace, &rule.peers, &rule.ports, direction, pod)
                    .into_iter()
                    .map(|a| (origin, a)),
            );
        }
    }
    (!isolating.is_empty()).then_some(SourcedPolicies { isolating, allows })
}

/// A set before any pod joined it.
pub(crate) fn empty_set(key: &SetKey) -> AddrSet {
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

/// Whether `peer` (pods by selectors) selects `pod`, whose namespace has `ns_labels`.
pub(crate) fn selects(peer: &CheckedPeer, ns_labels: &Labels, pod: &Pod) -> bool {
    match peer {
        CheckedPeer::Pods {
            namespace_selector,
            pod_selector,
        } => {
            namespace_selector
                .as_ref()
                .is_none_or(|s| s.matches(ns_labels))
                && pod_selector.as_ref().is_none_or(|s| s.matches(&pod.labels))
        }
        CheckedPeer::Block { .. } => false,
    }
}

/// Everything the policies judge `pod`'s traffic of `direction` by; `None` when nothing
/// does. `cluster` is in precedence order (tier, priority, name).
pub(crate) fn pod_chain(
    policies: &[CheckedPolicy],
    cluster: &[CheckedClusterPolicy],
    ns_labels: &Labels,
    pod: &Pod,
    direction: Direction,
) -> Option<KeyedChain> {
    pod_rules(policies, cluster, ns_labels, pod, direction).map(SourcedChain::keyed)
}

/// [`pod_chain`] with each entry's rule: the one place that decides what judges a pod.
pub(crate) fn pod_rules(
    policies: &[CheckedPolicy],
    cluster: &[CheckedClusterPolicy],
    ns_labels: &Labels,
    pod: &Pod,
    direction: Direction,
) -> Option<SourcedChain> {
    let mut chain = SourcedChain {
        admin: Vec::new(),
        policy: pod_allows(policies, pod, direction),
        baseline: Vec::new(),
    };
    for (i, p) in cluster.iter().enumerate() {
        if p.tier == Tier::Baseline && chain.policy.is_some() {
            break; // a NetworkPolicy decides: Baseline is never reached
        }
        if !selects(&p.subject, ns_labels, pod) {
            continue;
        }
        let rules = match direction {
            Direction::Ingress => &p.ingress,
            Direction::Egress => &p.egress,
        };
        let tier = match p.tier {
            Tier::Admin => &mut chain.admin,
            Tier::Baseline => &mut chain.baseline,
        };
        for (j, rule) in rules.iter().enumerate() {
            // the namespace only matters to a peer without a namespace selector: none here;
            // one rule's matches have no order among themselves (the same action)
            let allows: BTreeSet<KeyedAllow> =
                rule_allows("", &rule.peers, &rule.ports, direction, pod)
                    .into_iter()
                    .collect();
            let origin = Origin { policy: i, rule: j };
            tier.extend(allows.into_iter().map(|a| (origin, rule.action, a)));
        }
    }
    let judged = !chain.admin.is_empty() || chain.policy.is_some() || !chain.baseline.is_empty();
    judged.then_some(chain)
}

/// The allow rules one policy rule (its peers and ports) gives `pod` in `direction`;
/// `namespace` is the policy's, for peers without a namespace selector.
pub(crate) fn rule_allows(
    namespace: &str,
    rule_peers: &[CheckedPeer],
    rule_ports: &[PortSpec],
    direction: Direction,
    pod: &Pod,
) -> Vec<KeyedAllow> {
    // ports: merged per protocol; a rule whose ports all name nothing allows nothing
    let mut ports = Vec::new();
    if rule_ports.is_empty() {
        ports.push(PortPart::Any);
    } else {
        let mut listed: BTreeMap<Protocol, Vec<(u16, u16)>> = BTreeMap::new();
        let mut named = BTreeSet::new();
        for spec in rule_ports {
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
    if rule_peers.is_empty() {
        peers.push(PeerPart::Any);
    }
    for peer in rule_peers {
        match peer {
            CheckedPeer::Pods {
                namespace_selector,
                pod_selector,
            } => {
                let key = PodsKey {
                    namespaces: match namespace_selector {
                        Some(s) => NsScope::Selector(s.clone()),
                        None => NsScope::Named(namespace.to_owned()),
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
