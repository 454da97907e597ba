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

/// What the policies that select `pod` allow it in `direction`; `None` when none does (the
/// pod is not isolated for it).
pub(crate) fn pod_allows(
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
            allows.extend(rule_allows(
                &p.namespace,
                &rule.peers,
                &rule.ports,
                direction,
                pod,
            ));
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
    let mut chain = KeyedChain {
        admin: Vec::new(),
        policy: pod_allows(policies, pod, direction),
        baseline: Vec::new(),
    };
    for p in cluster {
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
        for rule in rules {
            // the namespace only matters to a peer without a namespace selector: none here;
            // one rule's matches have no order among themselves (the same action)
            let allows: BTreeSet<KeyedAllow> =
                rule_allows("", &rule.peers, &rule.ports, direction, pod)
                    .into_iter()
                    .collect();
            tier.extend(allows.into_iter().map(|a| (rule.action, a)));
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
