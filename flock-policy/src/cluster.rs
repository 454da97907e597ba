//! `ClusterNetworkPolicy` (SIG Network's `policy.networking.k8s.io`, network-policy-api
//! v0.3.0: `v1beta1`, also served as `v1alpha2`) as plain data, and its validation.
//!
//! A cluster policy has a tier (Admin before NetworkPolicy, Baseline after it), a priority
//! within the tier (lower first), a subject (the pods it applies to), and ordered ingress and
//! egress rules, each with an action: Accept and Deny decide, Pass hands the decision to the
//! next tier. Unlike a NetworkPolicy, selecting a pod does not isolate it: only the rules
//! count.

use ipnet::IpNet;

use crate::error::{Error, Result};
use crate::input::{CheckedPeer, PortSpec, Protocol, port_name_error};
use crate::selector::LabelSelector;

/// The tier of a cluster policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Tier {
    /// Judged before NetworkPolicies.
    Admin,
    /// Judged for what no NetworkPolicy decided.
    Baseline,
}

/// What a matching rule does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Action {
    /// The connection is allowed in this direction (the other side's ingress still judges it).
    Accept,
    /// The connection is dropped.
    Deny,
    /// No further rule of this tier is looked at: the next tier decides (after Admin:
    /// NetworkPolicy, then Baseline; after Baseline: allowed).
    Pass,
}

impl Tier {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Admin => "Admin",
            Tier::Baseline => "Baseline",
        }
    }
}

impl Action {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Accept => "Accept",
            Action::Deny => "Deny",
            Action::Pass => "Pass",
        }
    }
}

/// The pods a subject or peer stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterPeer {
    /// `namespaces`: every pod of the namespaces matching the selector (empty: all).
    Namespaces(LabelSelector),
    /// `pods`: the pods matching `pods` in the namespaces matching `namespaces`.
    Pods {
        /// `namespaceSelector` (empty: every namespace).
        namespaces: LabelSelector,
        /// `podSelector` (empty: every pod).
        pods: LabelSelector,
    },
    /// `networks` (egress only): addresses in these CIDRs, pods' included.
    Networks(Vec<String>),
    /// Every address of both families, in either direction. Not a peer of the API: what a rule
    /// that must "deny all" matches (the API's fail-closed rule for a peer an implementation
    /// does not know).
    Everything,
}

/// One entry of a rule's `protocols`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterPort {
    /// `tcp|udp|sctp: { destinationPort: { number } }`.
    Number(Protocol, u16),
    /// `tcp|udp|sctp: { destinationPort: { range: { start, end } } }`, inclusive.
    Range(Protocol, u16, u16),
    /// `destinationNamedPort`: a container port's name on the destination pod, of whatever
    /// protocol it has there.
    Named(String),
}

/// An ingress or egress rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterRule {
    /// `name` (optional, for people and logs).
    pub name: String,
    /// `action`.
    pub action: Action,
    /// `from` / `to`: the rule matches a connection with any of them (at least one).
    pub peers: Vec<ClusterPeer>,
    /// `protocols`; empty: every protocol and port.
    pub ports: Vec<ClusterPort>,
}

/// A `ClusterNetworkPolicy`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterPolicy {
    /// `metadata.name` (cluster-scoped).
    pub name: String,
    /// `spec.tier`.
    pub tier: Tier,
    /// `spec.priority`, 0 to 1000; lower goes first within the tier.
    pub priority: u32,
    /// `spec.subject`: `Namespaces` or `Pods`.
    pub subject: ClusterPeer,
    /// `spec.ingress`, in order: the first matching rule decides.
    pub ingress: Vec<ClusterRule>,
    /// `spec.egress`, in order.
    pub egress: Vec<ClusterRule>,
}

/// The highest priority number the API accepts.
pub const MAX_PRIORITY: u32 = 1000;

impl ClusterPolicy {
    /// `clusternetworkpolicy NAME`, as errors name it.
    pub fn id(&self) -> String {
        format!("clusternetworkpolicy {}", self.name)
    }

    /// Checks what the API server's schema checks and what matters here (selectors, peers
    /// of each direction, CIDRs in canonical form, ports, port names, the priority).
    pub fn validate(&self) -> Result<()> {
        self.checked().map(|_| ())
    }

    pub(crate) fn checked(&self) -> Result<CheckedClusterPolicy> {
        let id = self.id();
        if self.priority > MAX_PRIORITY {
            return Err(Error::Invalid {
                policy: id,
                field: "spec.priority".into(),
                value: self.priority.to_string(),
                reason: "must be 0 to 1000",
            });
        }
        let subject = match &self.subject {
            peer @ (ClusterPeer::Networks(_) | ClusterPeer::Everything) => {
                return Err(Error::Invalid {
                    policy: id,
                    field: "spec.subject".into(),
                    value: match peer {
                        ClusterPeer::Networks(_) => "networks",
                        _ => "everything",
                    }
                    .into(),
                    reason: "a subject is namespaces or pods",
                });
            }
            peer => {
                let mut peers = checked_peer(&id, "spec.subject", peer)?;
                peers.pop().expect("one peer for namespaces or pods")
            }
        };
        let rules =
            |rules: &[ClusterRule], dir: &str, word: &str| -> Result<Vec<CheckedClusterRule>> {
                rules
                    .iter()
                    .enumerate()
                    .map(|(i, r)| r.checked(&id, &format!("spec.{dir}[{i}]"), word))
                    .collect()
            };
        Ok(CheckedClusterPolicy {
            name: self.name.clone(),
            tier: self.tier,
            priority: self.priority,
            subject,
            ingress: rules(&self.ingress, "ingress", "from")?,
            egress: rules(&self.egress, "egress", "to")?,
        })
    }
}

impl ClusterRule {
    fn checked(&self, policy: &str, field: &str, word: &str) -> Result<CheckedClusterRule> {
        if self.peers.is_empty() {
            return Err(Error::Invalid {
                policy: policy.to_owned(),
                field: format!("{field}.{word}"),
                value: "[]".into(),
                reason: "needs at least one peer",
            });
        }
        let mut peers = Vec::new();
        for (j, peer) in self.peers.iter().enumerate() {
            let at = format!("{field}.{word}[{j}]");
            if word == "from" && matches!(peer, ClusterPeer::Networks(_)) {
                return Err(Error::Invalid {
                    policy: policy.to_owned(),
                    field: at,
                    value: "networks".into(),
                    reason: "an ingress peer is namespaces or pods",
                });
            }
            peers.extend(checked_peer(policy, &at, peer)?);
        }
        let mut ports = Vec::new();
        for (k, port) in self.ports.iter().enumerate() {
            let at = format!("{field}.protocols[{k}]");
            let invalid = |value: String, reason| Error::Invalid {
                policy: policy.to_owned(),
                field: at.clone(),
                value,
                reason,
            };
            match port {
                ClusterPort::Number(_, 0) => {
                    return Err(invalid("0".into(), "a port is 1 to 65535"));
                }
                ClusterPort::Number(p, n) => ports.push(PortSpec::number(*p, *n)),
                ClusterPort::Range(_, start, end) if *start == 0 || start >= end => {
                    return Err(invalid(
                        format!("{start}-{end}"),
                        "a range's start must be at least 1 and below its end",
                    ));
                }
                ClusterPort::Range(p, start, end) => ports.push(PortSpec::range(*p, *start, *end)),
                ClusterPort::Named(name) => {
                    if let Some(reason) = port_name_error(name) {
                        return Err(Error::PortName {
                            policy: policy.to_owned(),
                            field: format!("{at}.destinationNamedPort"),
                            value: name.clone(),
                            reason,
                        });
                    }
                    // A pod's port names are unique across protocols: one per protocol
                    // matches exactly the port that has the name.
                    for p in [Protocol::Tcp, Protocol::Udp, Protocol::Sctp] {
                        ports.push(PortSpec::name(p, name));
                    }
                }
            }
        }
        Ok(CheckedClusterRule {
            name: self.name.clone(),
            action: self.action,
            peers,
            ports,
        })
    }
}

/// A subject or peer as the model reads it: pods by two selectors, or address blocks.
fn checked_peer(policy: &str, field: &str, peer: &ClusterPeer) -> Result<Vec<CheckedPeer>> {
    match peer {
        ClusterPeer::Namespaces(namespaces) => {
            namespaces.validate(policy, &format!("{field}.namespaces"))?;
            Ok(vec![CheckedPeer::Pods {
                namespace_selector: Some(namespaces.canonical()),
                pod_selector: None,
            }])
        }
        ClusterPeer::Pods { namespaces, pods } => {
            namespaces.validate(policy, &format!("{field}.pods.namespaceSelector"))?;
            pods.validate(policy, &format!("{field}.pods.podSelector"))?;
            Ok(vec![CheckedPeer::Pods {
                namespace_selector: Some(namespaces.canonical()),
                pod_selector: Some(pods.canonical()),
            }])
        }
        ClusterPeer::Everything => Ok(["::/0", "0.0.0.0/0"]
            .map(|net| CheckedPeer::Block {
                net: net.parse().expect("a CIDR"),
                excepts: Vec::new(),
            })
            .to_vec()),
        ClusterPeer::Networks(cidrs) => {
            if cidrs.is_empty() {
                return Err(Error::Invalid {
                    policy: policy.to_owned(),
                    field: format!("{field}.networks"),
                    value: "[]".into(),
                    reason: "needs at least one CIDR",
                });
            }
            cidrs
                .iter()
                .enumerate()
                .map(|(k, cidr)| {
                    let at = format!("{field}.networks[{k}]");
                    let net = cidr.trim().parse::<IpNet>().map_err(|source| Error::Cidr {
                        policy: policy.to_owned(),
                        field: at.clone(),
                        value: cidr.clone(),
                        source,
                    })?;
                    if net.trunc() != net {
                        return Err(Error::Invalid {
                            policy: policy.to_owned(),
                            field: at,
                            value: cidr.clone(),
                            reason: "host bits are set (the API wants the network's own address)",
                        });
                    }
                    Ok(CheckedPeer::Block {
                        net,
                        excepts: Vec::new(),
                    })
                })
                .collect()
        }
    }
}

/// A validated cluster policy: the subject and peers in the form NetworkPolicy peers take.
#[derive(Debug, Clone)]
pub(crate) struct CheckedClusterPolicy {
    pub name: String,
    pub tier: Tier,
    pub priority: u32,
    pub subject: CheckedPeer,
    pub ingress: Vec<CheckedClusterRule>,
    pub egress: Vec<CheckedClusterRule>,
}

#[derive(Debug, Clone)]
pub(crate) struct CheckedClusterRule {
    /// Only for explanations: the rules never depend on it.
    pub name: String,
    pub action: Action,
    pub peers: Vec<CheckedPeer>,
    pub ports: Vec<PortSpec>,
}
