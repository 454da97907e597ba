//! Why this node passes or drops a new connection: [`Model::explain`] rebuilds the chains the
//! [`Ruleset`](crate::Ruleset) holds for the pods at either end — with the same code, keeping
//! the rule each entry comes from — walks them as [`Ruleset::verdict`](crate::Ruleset::verdict)
//! does, and names the rule that decided each side.

use std::fmt;
use std::net::IpAddr;

use crate::addr::Family;
use crate::allows::{KeyedAllow, Origin};
use crate::cluster::{Action, Tier};
use crate::error::{Error, Result};
use crate::input::Pod;
use crate::model::{Allow, Decider, Direction, Flow, Transport, Verdict, walk};
use crate::state::Model;

/// A policy, as an [`Explanation`] names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PolicyRef {
    /// A `NetworkPolicy`.
    NetworkPolicy {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// A `ClusterNetworkPolicy`.
    ClusterNetworkPolicy {
        /// Its name.
        name: String,
        /// Its tier.
        tier: Tier,
        /// Its priority within the tier.
        priority: u32,
    },
}

/// One rule of a policy, as an [`Explanation`] names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RuleRef {
    /// The policy.
    pub policy: PolicyRef,
    /// The rule's list: `spec.ingress` or `spec.egress`.
    pub direction: Direction,
    /// Its index in that list.
    pub index: usize,
    /// A cluster policy rule's `name`, when it has one (NetworkPolicy rules have none).
    pub name: Option<String>,
    /// What the rule does: Accept, Deny or Pass; a NetworkPolicy rule allows (Accept).
    pub action: Action,
}

/// A pod of this node: one whose traffic this node judges.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LocalPod {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// Its host veth, which keys its chains in the [`Ruleset`](crate::Ruleset).
    pub host_if: String,
}

/// Why one side passes or drops a flow.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Reason {
    /// ICMP that keeps the network working ([`Transport::always_allowed`]): passes before
    /// any policy is looked at.
    AlwaysAllowed,
    /// No pod of this node has the address: this node does not judge this side (the pod's
    /// own node does; an address outside the cluster is judged by nobody).
    NotLocal,
    /// No policy judges the pod's traffic of this direction (no NetworkPolicy isolates it, no
    /// cluster policy selecting it has a rule that can match): passes.
    NotSelected,
    /// A rule matched and decided: an Admin Accept or Deny, a NetworkPolicy rule (it allows;
    /// when several do, the first by namespace, name and index), a Baseline Accept, Deny or
    /// Pass (Pass allows).
    Rule {
        /// The rule.
        rule: RuleRef,
        /// The Admin Pass rule that matched first and handed the decision on, if one did.
        passed_by: Option<RuleRef>,
    },
    /// NetworkPolicies isolate the pod for this direction and no rule of theirs matches:
    /// dropped.
    NotAllowed {
        /// The NetworkPolicies that select the pod for this direction, by namespace and name.
        isolated_by: Vec<PolicyRef>,
        /// The Admin Pass rule that matched first and handed the decision on, if one did.
        passed_by: Option<RuleRef>,
    },
    /// Cluster policy rules judge the pod's traffic of this direction, none matches and no
    /// NetworkPolicy isolates the pod: passes.
    NoRuleMatched {
        /// The Admin Pass rule that matched and skipped the rest of its tier, if one did.
        passed_by: Option<RuleRef>,
    },
}

/// How one side judges a flow: the sender's egress or the receiver's ingress.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Judgement {
    /// Egress (the source's side) or ingress (the destination's side).
    pub direction: Direction,
    /// The side's address: the flow's source for egress, its destination for ingress.
    pub address: IpAddr,
    /// The pod of this node with that address; `None` when no pod of this node has it.
    pub pod: Option<LocalPod>,
    /// Why the side passes or drops the flow.
    pub reason: Reason,
}

impl Judgement {
    /// Whether this side lets the flow pass.
    pub fn passes(&self) -> bool {
        match &self.reason {
            Reason::Rule { rule, .. } => rule.action != Action::Deny,
            Reason::NotAllowed { .. } => false,
            _ => true,
        }
    }
}

/// What this node does with a new connection, and why: see [`Model::explain`]. Its
/// [`Display`](fmt::Display) is one line for a log:
/// `deny: egress of default/a by clusternetworkpolicy deny-all (Admin, rule 0 "deny-egress")`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Explanation {
    /// The flow explained.
    pub flow: Flow,
    /// The verdict: what [`Ruleset::verdict`](crate::Ruleset::verdict) gives the flow's first
    /// packet, entering from the source pod's host veth (or an uplink) and leaving through the
    /// destination pod's (or an uplink).
    pub verdict: Verdict,
    /// The source's side. The kernel judges it first.
    pub egress: Judgement,
    /// The destination's side. The kernel judges it only when egress passes; it is explained
    /// either way.
    pub ingress: Judgement,
}

impl Explanation {
    /// The side that drops the flow (egress before ingress, as the kernel looks), if one does.
    pub fn dropped_by(&self) -> Option<&Judgement> {
        [&self.egress, &self.ingress]
            .into_iter()
            .find(|j| !j.passes())
    }
}

impl Model {
    /// What this node does with a new connection from `flow.src` to `flow.dst`, and for each
    /// side the rule that decided it.
    ///
    /// A side is judged here when its address is a local pod's (one with a host veth): the
    /// source pod's egress, the destination pod's ingress. An address no local pod has —
    /// a pod of another node, an address outside the cluster, a node's own — is not judged
    /// here ([`Reason::NotLocal`]); traffic between a pod and its own node does not cross
    /// the table at all, which an address cannot tell. `dst` is the address after
    /// kube-proxy's DNAT (a Service's backend). Only a connection's first packet is judged:
    /// replies and related ICMP pass by conntrack.
    ///
    /// The chains are the ones the [`Ruleset`](crate::Ruleset) holds, rebuilt by the code
    /// that built it, entry by entry with the rule it comes from, and walked as
    /// [`Ruleset::verdict`](crate::Ruleset::verdict) walks them, over the same sets; so
    /// [`Explanation::verdict`] is `verdict`'s.
    ///
    /// Fails when the flow cannot be a packet ([`Error::Flow`]): `src` and `dst` of different
    /// families, ICMP of the wrong family, a transport number that has a variant of its own
    /// ([`Transport::Other`]`(6)` is TCP) — or when its answer depends on which of several
    /// local pods sharing an (anycast) address sends or receives it.
    pub fn explain(&self, flow: &Flow) -> Result<Explanation> {
        flow.check()?;
        let src = self.local_pod_at("src", flow.src)?;
        let dst = self.local_pod_at("dst", flow.dst)?;
        let egress = self.judge(Direction::Egress, flow, src);
        let ingress = self.judge(Direction::Ingress, flow, dst);
        let drop = |j: &Judgement| {
            let pod = j.pod.as_ref().filter(|_| !j.passes())?;
            Some(Verdict::Drop {
                direction: j.direction,
                host_if: pod.host_if.clone(),
            })
        };
        let verdict = drop(&egress)
            .or_else(|| drop(&ingress))
            .unwrap_or(Verdict::Accept);
        Ok(Explanation {
            flow: *flow,
            verdict,
            egress,
            ingress,
        })
    }

    /// The local pod with `addr`, if one has it; an error if several do.
    fn local_pod_at(&self, field: &'static str, addr: IpAddr) -> Result<Option<(&str, &Pod)>> {
        let mut with: Vec<(&str, &Pod)> = self
            .local_pods()
            .iter()
            .filter(|(_, p)| p.addresses.contains(&addr))
            .map(|(h, p)| (h.as_str(), p))
            .collect();
        if with.len() > 1 {
            let pods: Vec<String> = with.iter().map(|(_, p)| p.id()).collect();
            return Err(Error::Flow {
                field,
                value: addr.to_string(),
                reason: format!(
                    "is an address of several pods of this node ({}): which one {} decides",
                    pods.join(", "),
                    if field == "src" { "sends" } else { "receives" }
                ),
            });
        }
        Ok(with.pop())
    }

    fn judge(&self, direction: Direction, flow: &Flow, at: Option<(&str, &Pod)>) -> Judgement {
        let address = match direction {
            Direction::Egress => flow.src,
            Direction::Ingress => flow.dst,
        };
        let reason = match at {
            _ if flow.transport.always_allowed() => Reason::AlwaysAllowed,
            None => Reason::NotLocal,
            Some((host_if, pod)) => self.reason(direction, flow, host_if, pod),
        };
        Judgement {
            direction,
            address,
            pod: at.map(|(host_if, p)| LocalPod {
                namespace: p.namespace.clone(),
                name: p.name.clone(),
                host_if: host_if.to_owned(),
            }),
            reason,
        }
    }

    /// Local `pod`'s chain of `direction` walked for `flow`.
    fn reason(&self, direction: Direction, flow: &Flow, host_if: &str, pod: &Pod) -> Reason {
        let Some(chain) = self.pod_rules(pod, direction) else {
            return Reason::NotSelected;
        };
        debug_assert_eq!(
            self.name_chain(&chain.clone().keyed(), &pod.namespace)
                .as_ref(),
            self.ruleset().chains(direction).get(host_if),
            "explain walks the chain the ruleset holds"
        );
        let name = |a: &KeyedAllow| {
            self.name_allow(a)
                .expect("a local pod's chain names only sets of the model")
        };
        let tier = |rules: &[(Origin, Action, KeyedAllow)]| -> Vec<(Origin, Action, Allow)> {
            rules
                .iter()
                .map(|(o, act, a)| (*o, *act, name(a)))
                .collect()
        };
        let (admin, baseline) = (tier(&chain.admin), tier(&chain.baseline));
        // the first allow of the first policy by namespace and name: the same whatever the
        // order the policies were given in
        let policy: Option<Vec<(Origin, Allow)>> = chain.policy.as_ref().map(|p| {
            let mut allows: Vec<(Origin, Allow)> = p.held().map(|(o, a)| (*o, name(a))).collect();
            allows.sort_by_key(|(o, _)| self.policy_order(*o));
            allows
        });
        let walked = walk(
            admin.iter().map(|(o, act, a)| ((*o, a), *act)),
            policy.as_ref().map(|v| v.iter().map(|(o, a)| (*o, a))),
            baseline.iter().map(|(o, act, a)| ((*o, a), *act)),
            |(_, a)| self.ruleset().allows(a, direction, flow),
        );
        let passed_by = walked.passed.map(|(o, _)| self.cluster_rule(o, direction));
        match walked.decider {
            Decider::Tier((o, _), _) => Reason::Rule {
                rule: self.cluster_rule(o, direction),
                passed_by,
            },
            Decider::Allowed((o, _)) => Reason::Rule {
                rule: self.network_rule(o, direction),
                passed_by,
            },
            Decider::NotAllowed => {
                let mut isolating = chain.policy.map(|p| p.isolating).unwrap_or_default();
                isolating.sort_by_key(|i| {
                    self.policy_order(Origin {
                        policy: *i,
                        rule: 0,
                    })
                });
                Reason::NotAllowed {
                    isolated_by: isolating
                        .into_iter()
                        .map(|i| self.network_policy(i))
                        .collect(),
                    passed_by,
                }
            }
            Decider::NoMatch => Reason::NoRuleMatched { passed_by },
        }
    }

    /// NetworkPolicy rules by namespace, name and index.
    fn policy_order(&self, o: Origin) -> (&str, &str, usize, usize) {
        let p = &self.policies()[o.policy];
        (&p.namespace, &p.name, o.rule, o.policy)
    }

    fn network_policy(&self, i: usize) -> PolicyRef {
        let p = &self.policies()[i];
        PolicyRef::NetworkPolicy {
            namespace: p.namespace.clone(),
            name: p.name.clone(),
        }
    }

    fn network_rule(&self, o: Origin, direction: Direction) -> RuleRef {
        RuleRef {
            policy: self.network_policy(o.policy),
            direction,
            index: o.rule,
            name: None,
            action: Action::Accept,
        }
    }

    fn cluster_rule(&self, o: Origin, direction: Direction) -> RuleRef {
        let p = &self.cluster_policies()[o.policy];
        let rule = match direction {
            Direction::Ingress => &p.ingress[o.rule],
            Direction::Egress => &p.egress[o.rule],
        };
        RuleRef {
            policy: PolicyRef::ClusterNetworkPolicy {
                name: p.name.clone(),
                tier: p.tier,
                priority: p.priority,
            },
            direction,
            index: o.rule,
            name: (!rule.name.is_empty()).then(|| rule.name.clone()),
            action: rule.action,
        }
    }
}

impl Flow {
    /// Whether a packet could be this: one family, ICMP of that family, a transport number
    /// that has no variant of its own.
    fn check(&self) -> Result<()> {
        let family = Family::of(&self.src);
        let spelled = |f: Family| match f {
            Family::V6 => "IPv6",
            Family::V4 => "IPv4",
        };
        if Family::of(&self.dst) != family {
            return Err(Error::Flow {
                field: "dst",
                value: self.dst.to_string(),
                reason: format!(
                    "is {} but src {} is {}: a packet has one address family",
                    spelled(Family::of(&self.dst)),
                    self.src,
                    spelled(family)
                ),
            });
        }
        let wrong = |reason: String| {
            Err(Error::Flow {
                field: "transport",
                value: self.transport.to_string(),
                reason,
            })
        };
        match (self.transport, family) {
            (Transport::Icmp { .. }, Family::V6) => {
                wrong("is ICMP in an IPv6 flow: IPv6 carries ICMPv6 (Transport::Icmpv6)".into())
            }
            (Transport::Icmpv6 { .. }, Family::V4) => {
                wrong("is ICMPv6 in an IPv4 flow: IPv4 carries ICMP (Transport::Icmp)".into())
            }
            (Transport::Other(n), _) => match n {
                6 => wrong("is TCP: give Transport::Tcp with the destination port".into()),
                17 => wrong("is UDP: give Transport::Udp with the destination port".into()),
                132 => wrong("is SCTP: give Transport::Sctp with the destination port".into()),
                1 | 58 => wrong(
                    "is ICMP: give Transport::Icmp or Transport::Icmpv6 with the type and code"
                        .into(),
                ),
                _ => Ok(()),
            },
            _ => Ok(()),
        }
    }
}

/// `tcp/80`, `udp/53`, `sctp/9`, `icmp type 8 code 0`, `icmpv6 type 128 code 0`,
/// `protocol 47`.
impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Transport::Tcp(p) => write!(f, "tcp/{p}"),
            Transport::Udp(p) => write!(f, "udp/{p}"),
            Transport::Sctp(p) => write!(f, "sctp/{p}"),
            Transport::Icmp { kind, code } => write!(f, "icmp type {kind} code {code}"),
            Transport::Icmpv6 { kind, code } => write!(f, "icmpv6 type {kind} code {code}"),
            Transport::Other(n) => write!(f, "protocol {n}"),
        }
    }
}

/// `10.0.0.1 -> 10.0.0.2 tcp/80`.
impl fmt::Display for Flow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} -> {} {}", self.src, self.dst, self.transport)
    }
}

impl PolicyRef {
    /// `shop/web` for a NetworkPolicy (where the kind goes without saying), else as
    /// displayed.
    pub fn short(&self) -> String {
        match self {
            PolicyRef::NetworkPolicy { namespace, name } => format!("{namespace}/{name}"),
            other => other.to_string(),
        }
    }
}

/// `networkpolicy shop/web`, `clusternetworkpolicy deny-all`.
impl fmt::Display for PolicyRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PolicyRef::NetworkPolicy { namespace, name } => {
                write!(f, "networkpolicy {namespace}/{name}")
            }
            PolicyRef::ClusterNetworkPolicy { name, .. } => {
                write!(f, "clusternetworkpolicy {name}")
            }
        }
    }
}

/// `networkpolicy shop/web (rule 1)`, `clusternetworkpolicy deny-all (Admin, rule 0
/// "deny-egress")`; the direction is the side's.
impl fmt::Display for RuleRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (", self.policy)?;
        if let PolicyRef::ClusterNetworkPolicy { tier, .. } = &self.policy {
            write!(f, "{}, ", tier.as_str())?;
        }
        write!(f, "rule {}", self.index)?;
        if let Some(name) = &self.name {
            write!(f, " {name:?}")?;
        }
        f.write_str(")")
    }
}

/// `ingress of shop/web by networkpolicy shop/web (rule 0)`, `egress of 10.0.0.9: no pod of
/// this node has it, not judged here`.
impl fmt::Display for Judgement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let direction = Direction::as_str(self.direction);
        match &self.pod {
            Some(p) => write!(f, "{direction} of {}/{}", p.namespace, p.name)?,
            None => write!(f, "{direction} of {}", self.address)?,
        }
        let passed_by = match &self.reason {
            Reason::AlwaysAllowed => {
                return f.write_str(": ICMP that keeps the network working, never dropped");
            }
            Reason::NotLocal => {
                return f.write_str(": no pod of this node has it, not judged here");
            }
            Reason::NotSelected => return f.write_str(": not selected by any policy"),
            Reason::Rule { rule, passed_by } => {
                write!(f, " by {rule}")?;
                passed_by
            }
            Reason::NotAllowed {
                isolated_by,
                passed_by,
            } => {
                let ids: Vec<String> = isolated_by.iter().map(PolicyRef::short).collect();
                write!(
                    f,
                    ": no NetworkPolicy selecting it allows it ({})",
                    ids.join(", ")
                )?;
                passed_by
            }
            Reason::NoRuleMatched { passed_by } => {
                f.write_str(": no policy rule matches it")?;
                passed_by
            }
        };
        if let Some(pass) = passed_by {
            write!(f, ", after {pass} passed")?;
        }
        Ok(())
    }
}

/// `deny: egress of default/a by clusternetworkpolicy deny-all (Admin, rule 0
/// "deny-egress")`, `drop: ingress of ns/b: no NetworkPolicy selecting it allows it
/// (ns/default-deny)`, `accept: egress of a/x: not selected by any policy; ingress of b/y by
/// networkpolicy b/web (rule 0)`. A drop names the side that drops (`deny` when a Deny rule
/// does); an accept names both.
impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.dropped_by() {
            Some(side) => {
                let word = match &side.reason {
                    Reason::Rule { rule, .. } if rule.action == Action::Deny => "deny",
                    _ => "drop",
                };
                write!(f, "{word}: {side}")
            }
            None if self.egress.reason == Reason::AlwaysAllowed => write!(
                f,
                "accept: {} keeps the network working, never dropped",
                self.flow.transport
            ),
            None => write!(f, "accept: {}; {}", self.egress, self.ingress),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use crate::*;

    fn pod(ns: &str, name: &str, labels: &[(&str, &str)], addrs: &[&str], local: bool) -> Pod {
        Pod {
            namespace: ns.into(),
            name: name.into(),
            labels: std::sync::Arc::new(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            addresses: addrs.iter().map(|a| a.parse().unwrap()).collect(),
            host_if: local.then(|| format!("flock-{name}")),
            ports: vec![],
        }
    }

    fn port(name: &str, number: u16) -> NamedPort {
        NamedPort {
            name: name.into(),
            protocol: Protocol::Tcp,
            port: number,
        }
    }

    /// shop/web-0 (local; ingress isolated, `http` is 8080), ops/client (local; egress
    /// isolated), shop/db-0 and ops/probe (remote; `pg` is 5432 on db-0).
    fn pods() -> Vec<Pod> {
        let mut web = pod(
            "shop",
            "web-0",
            &[("app", "web")],
            &["2001:db8::10", "10.0.0.10"],
            true,
        );
        web.ports = vec![port("http", 8080)];
        let mut db = pod(
            "shop",
            "db-0",
            &[("app", "db")],
            &["2001:db8::30", "10.0.0.30"],
            false,
        );
        db.ports = vec![port("pg", 5432)];
        vec![
            web,
            pod(
                "ops",
                "client",
                &[("role", "client")],
                &["2001:db8::20", "10.0.0.20"],
                true,
            ),
            db,
            pod("ops", "probe", &[], &["2001:db8::40", "10.0.0.40"], false),
        ]
    }

    fn namespaces() -> Vec<Namespace> {
        ["shop", "ops"]
            .map(|n| Namespace {
                name: n.into(),
                labels: [("team".to_owned(), n.to_owned())].into(),
                log: None,
            })
            .to_vec()
    }

    fn team(t: &str) -> LabelSelector {
        LabelSelector::labels([("team", t)])
    }

    fn policies() -> Vec<Policy> {
        vec![
            Policy {
                namespace: "shop".into(),
                name: "web-ingress".into(),
                pod_selector: LabelSelector::labels([("app", "web")]),
                ingress: vec![
                    Rule {
                        peers: vec![Peer::namespaces(team("ops"))],
                        ports: vec![PortSpec::name(Protocol::Tcp, "http")],
                    },
                    Rule {
                        peers: vec![Peer::ip_block("10.0.0.0/24", &["10.0.0.30/32"])],
                        ports: vec![PortSpec::number(Protocol::Tcp, 443)],
                    },
                ],
                ..Default::default()
            },
            Policy {
                namespace: "ops".into(),
                name: "client-egress".into(),
                pod_selector: LabelSelector::labels([("role", "client")]),
                policy_types: Some(PolicyTypes {
                    ingress: false,
                    egress: true,
                }),
                egress: vec![
                    Rule {
                        peers: vec![Peer::Pods {
                            namespace_selector: Some(team("shop")),
                            pod_selector: Some(LabelSelector::labels([("app", "db")])),
                        }],
                        ports: vec![PortSpec::name(Protocol::Tcp, "pg")],
                    },
                    Rule {
                        peers: vec![Peer::ip_block("2001:db8::/64", &[])],
                        ports: vec![PortSpec::number(Protocol::Udp, 53)],
                    },
                    Rule {
                        peers: vec![Peer::namespaces(team("shop"))],
                        ports: vec![PortSpec::name(Protocol::Tcp, "http")],
                    },
                ],
                ..Default::default()
            },
        ]
    }

    fn model(cluster: &[ClusterPolicy], pods: &[Pod]) -> Model {
        Model::with_cluster_policies(cluster, &policies(), &namespaces(), pods).unwrap()
    }

    /// `model`'s explanation of the flow, whose verdict must be the ruleset's for the packet
    /// the flow is (from and to the local pods' veths, else an uplink).
    fn explain(model: &Model, src: &str, dst: &str, transport: Transport) -> Explanation {
        let flow = Flow {
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            transport,
        };
        let explanation = model.explain(&flow).unwrap();
        let hop = |a: IpAddr| {
            let local = model.local_pods().iter();
            let mut on = local.filter(|(_, p)| p.addresses.contains(&a));
            Hop::Link(on.next().map_or("eth0".into(), |(h, _)| h.clone()))
        };
        let packet = Packet {
            src: flow.src,
            dst: flow.dst,
            transport,
            from: hop(flow.src),
            to: hop(flow.dst),
        };
        assert_eq!(
            explanation.verdict,
            model.ruleset().verdict(&packet),
            "{explanation}"
        );
        explanation
    }

    /// Its one line.
    fn line(model: &Model, src: &str, dst: &str, transport: Transport) -> String {
        explain(model, src, dst, transport).to_string()
    }

    fn cnp(name: &str, tier: Tier, priority: u32, subject: ClusterPeer) -> ClusterPolicy {
        ClusterPolicy {
            name: name.into(),
            tier,
            priority,
            subject,
            ingress: vec![],
            egress: vec![],
        }
    }

    fn crule(
        name: &str,
        action: Action,
        peer: ClusterPeer,
        ports: Vec<ClusterPort>,
    ) -> ClusterRule {
        ClusterRule {
            name: name.into(),
            action,
            peers: vec![peer],
            ports,
        }
    }

    #[test]
    fn networkpolicy_rules_that_allow_are_named_on_both_sides() {
        let m = model(&[], &pods());
        // named ports: egress resolved on the destination pod, ingress on the selected pod
        let e = explain(&m, "2001:db8::20", "2001:db8::10", Transport::Tcp(8080));
        assert_eq!(e.verdict, Verdict::Accept);
        assert_eq!(
            e.egress.reason,
            Reason::Rule {
                rule: RuleRef {
                    policy: PolicyRef::NetworkPolicy {
                        namespace: "ops".into(),
                        name: "client-egress".into()
                    },
                    direction: Direction::Egress,
                    index: 2,
                    name: None,
                    action: Action::Accept,
                },
                passed_by: None,
            }
        );
        assert_eq!(
            e.to_string(),
            "accept: egress of ops/client by networkpolicy ops/client-egress (rule 2); \
             ingress of shop/web-0 by networkpolicy shop/web-ingress (rule 0)"
        );
        // the same over IPv4
        assert_eq!(
            explain(&m, "10.0.0.20", "10.0.0.10", Transport::Tcp(8080)).verdict,
            Verdict::Accept
        );
        // an egress named port to a pod of another node
        assert_eq!(
            line(&m, "10.0.0.20", "10.0.0.30", Transport::Tcp(5432)),
            "accept: egress of ops/client by networkpolicy ops/client-egress (rule 0); \
             ingress of 10.0.0.30: no pod of this node has it, not judged here"
        );
    }

    #[test]
    fn isolated_and_nothing_matches_is_a_drop_naming_the_isolating_policies() {
        let m = model(&[], &pods());
        let e = explain(&m, "2001:db8::20", "2001:db8::10", Transport::Tcp(80));
        assert_eq!(
            e.verdict,
            Verdict::Drop {
                direction: Direction::Egress,
                host_if: "flock-client".into()
            }
        );
        assert_eq!(
            e.to_string(),
            "drop: egress of ops/client: no NetworkPolicy selecting it allows it (ops/client-egress)"
        );
        // the ingress side is explained too, though the kernel never gets to it
        assert!(matches!(e.ingress.reason, Reason::NotAllowed { .. }));
        // a named port that the destination has under another number
        assert!(
            !explain(&m, "10.0.0.20", "10.0.0.30", Transport::Tcp(8080))
                .egress
                .passes()
        );
    }

    #[test]
    fn ip_block_excepts_and_families() {
        let m = model(&[], &pods());
        // inside the block
        assert_eq!(
            line(&m, "10.0.0.99", "10.0.0.10", Transport::Tcp(443)),
            "accept: egress of 10.0.0.99: no pod of this node has it, not judged here; \
             ingress of shop/web-0 by networkpolicy shop/web-ingress (rule 1)"
        );
        // in its except
        assert_eq!(
            line(&m, "10.0.0.30", "10.0.0.10", Transport::Tcp(443)),
            "drop: ingress of shop/web-0: no NetworkPolicy selecting it allows it (shop/web-ingress)"
        );
        // an IPv4 block does not admit IPv6
        assert!(
            !explain(&m, "2001:db8:1::1", "2001:db8::10", Transport::Tcp(443))
                .ingress
                .passes()
        );
        // an IPv6 block, UDP only
        let dns = explain(&m, "2001:db8::20", "2001:db8::53", Transport::Udp(53));
        assert_eq!(dns.verdict, Verdict::Accept);
        assert!(
            !explain(&m, "2001:db8::20", "2001:db8::53", Transport::Tcp(53))
                .egress
                .passes()
        );
    }

    #[test]
    fn not_selected_by_any_policy_passes() {
        let m = model(&[], &pods());
        assert_eq!(
            line(&m, "2001:db8::10", "2001:db8::20", Transport::Sctp(9)),
            "accept: egress of shop/web-0: not selected by any policy; \
             ingress of ops/client: not selected by any policy"
        );
        let none = Model::new(&[], &[], &pods()).unwrap();
        assert_eq!(
            explain(&none, "2001:db8::10", "2001:db8::20", Transport::Other(47)).verdict,
            Verdict::Accept
        );
    }

    #[test]
    fn essential_icmp_always_passes_and_echo_does_not() {
        let m = model(&[], &pods());
        let ns = Transport::Icmpv6 { kind: 135, code: 0 };
        let e = explain(&m, "2001:db8::20", "2001:db8::10", ns);
        assert_eq!(e.egress.reason, Reason::AlwaysAllowed);
        assert_eq!(e.ingress.reason, Reason::AlwaysAllowed);
        assert_eq!(
            e.to_string(),
            "accept: icmpv6 type 135 code 0 keeps the network working, never dropped"
        );
        let frag = Transport::Icmp { kind: 3, code: 4 };
        assert_eq!(
            explain(&m, "10.0.0.99", "10.0.0.10", frag).verdict,
            Verdict::Accept
        );
        // echo is policy-controlled: a rule with ports admits only those protocols
        let echo = Transport::Icmpv6 { kind: 128, code: 0 };
        assert_eq!(
            line(&m, "2001:db8::40", "2001:db8::10", echo),
            "drop: ingress of shop/web-0: no NetworkPolicy selecting it allows it (shop/web-ingress)"
        );
    }

    #[test]
    fn cluster_policy_rules_decide_by_tier_with_their_names() {
        let mut deny_all = cnp(
            "deny-all",
            Tier::Admin,
            10,
            ClusterPeer::Namespaces(LabelSelector::all()),
        );
        deny_all.egress = vec![crule(
            "deny-egress",
            Action::Deny,
            ClusterPeer::Networks(vec!["192.168.0.0/16".into()]),
            vec![],
        )];
        let mut ops_pass = cnp(
            "ops-pass",
            Tier::Admin,
            5,
            ClusterPeer::Namespaces(team("ops")),
        );
        ops_pass.egress = vec![crule(
            "",
            Action::Pass,
            ClusterPeer::Namespaces(team("shop")),
            vec![],
        )];
        let mut probe = cnp(
            "accept-probe",
            Tier::Admin,
            1,
            ClusterPeer::Pods {
                namespaces: LabelSelector::all(),
                pods: LabelSelector::labels([("app", "web")]),
            },
        );
        probe.ingress = vec![crule(
            "probe",
            Action::Accept,
            ClusterPeer::Namespaces(team("ops")),
            vec![ClusterPort::Number(Protocol::Tcp, 9000)],
        )];
        let mut ops_baseline = cnp(
            "ops-baseline",
            Tier::Baseline,
            0,
            ClusterPeer::Namespaces(team("ops")),
        );
        ops_baseline.ingress = vec![
            crule(
                "no-dns",
                Action::Deny,
                ClusterPeer::Everything,
                vec![ClusterPort::Number(Protocol::Udp, 53)],
            ),
            crule(
                "",
                Action::Pass,
                ClusterPeer::Everything,
                vec![ClusterPort::Number(Protocol::Tcp, 22)],
            ),
        ];
        let mut shop_baseline = cnp(
            "shop-baseline",
            Tier::Baseline,
            0,
            ClusterPeer::Namespaces(team("shop")),
        );
        shop_baseline.ingress = vec![crule(
            "deny-all",
            Action::Deny,
            ClusterPeer::Everything,
            vec![],
        )];
        let m = model(
            &[deny_all, ops_pass, probe, ops_baseline, shop_baseline],
            &pods(),
        );

        // Admin Deny, a networks peer, the rule's name
        assert_eq!(
            line(&m, "10.0.0.20", "192.168.1.1", Transport::Tcp(80)),
            "deny: egress of ops/client by clusternetworkpolicy deny-all (Admin, rule 0 \"deny-egress\")"
        );
        // Admin Pass, then the NetworkPolicy decides
        let e = explain(&m, "2001:db8::20", "2001:db8::10", Transport::Tcp(8080));
        assert_eq!(
            e.to_string(),
            "accept: egress of ops/client by networkpolicy ops/client-egress (rule 2), \
             after clusternetworkpolicy ops-pass (Admin, rule 0) passed; \
             ingress of shop/web-0 by networkpolicy shop/web-ingress (rule 0)"
        );
        let Reason::Rule {
            passed_by: Some(pass),
            ..
        } = &e.egress.reason
        else {
            panic!("{e:?}");
        };
        assert_eq!(
            (pass.action, pass.index, pass.name.as_deref()),
            (Action::Pass, 0, None)
        );
        assert_eq!(
            line(&m, "2001:db8::20", "2001:db8::10", Transport::Tcp(80)),
            "drop: egress of ops/client: no NetworkPolicy selecting it allows it \
             (ops/client-egress), after clusternetworkpolicy ops-pass (Admin, rule 0) passed"
        );
        // Admin Accept over a NetworkPolicy that would drop it
        assert_eq!(
            line(&m, "2001:db8::40", "2001:db8::10", Transport::Tcp(9000)),
            "accept: egress of 2001:db8::40: no pod of this node has it, not judged here; \
             ingress of shop/web-0 by clusternetworkpolicy accept-probe (Admin, rule 0 \"probe\")"
        );
        // Baseline Deny, Baseline Pass (allows), no rule matching (allows)
        assert_eq!(
            line(&m, "10.0.0.40", "10.0.0.20", Transport::Udp(53)),
            "deny: ingress of ops/client by clusternetworkpolicy ops-baseline (Baseline, rule 0 \"no-dns\")"
        );
        let pass = explain(&m, "10.0.0.40", "10.0.0.20", Transport::Tcp(22));
        assert!(
            matches!(&pass.ingress.reason, Reason::Rule { rule, .. } if rule.action == Action::Pass && rule.index == 1),
            "{pass:?}"
        );
        assert_eq!(pass.verdict, Verdict::Accept);
        assert_eq!(
            line(&m, "10.0.0.40", "10.0.0.20", Transport::Tcp(23)),
            "accept: egress of 10.0.0.40: no pod of this node has it, not judged here; \
             ingress of ops/client: no policy rule matches it"
        );
        // a NetworkPolicy isolating the pod: Baseline is never reached
        let e = explain(&m, "10.0.0.99", "10.0.0.10", Transport::Tcp(443));
        assert!(
            matches!(&e.ingress.reason, Reason::Rule { rule, .. } if matches!(rule.policy, PolicyRef::NetworkPolicy { .. })),
            "{e}"
        );
    }

    #[test]
    fn a_shared_address_is_its_local_pod_or_an_error() {
        let mut pods = pods();
        for p in &mut pods {
            p.addresses.push("2001:db8::aa".parse().unwrap());
        }
        let m = model(&[], &pods);
        let flow = Flow {
            src: "2001:db8::40".parse().unwrap(),
            dst: "2001:db8::aa".parse().unwrap(),
            transport: Transport::Tcp(8080),
        };
        assert_eq!(
            m.explain(&flow).unwrap_err().to_string(),
            "cannot explain the flow: dst 2001:db8::aa is an address of several pods of this \
             node (ops/client, shop/web-0): which one receives decides"
        );
        // one local pod and remote ones: the local one (where this node delivers it)
        pods[1].addresses.pop();
        let m = model(&[], &pods);
        let e = explain(&m, "2001:db8::40", "2001:db8::aa", Transport::Tcp(8080));
        assert_eq!(e.ingress.pod.unwrap().name, "web-0");
    }

    #[test]
    fn flows_no_packet_could_be_are_refused_naming_the_field() {
        let m = model(&[], &pods());
        let err = |src: &str, dst: &str, transport| {
            m.explain(&Flow {
                src: src.parse().unwrap(),
                dst: dst.parse().unwrap(),
                transport,
            })
            .unwrap_err()
            .to_string()
        };
        assert_eq!(
            err("2001:db8::20", "10.0.0.10", Transport::Tcp(80)),
            "cannot explain the flow: dst 10.0.0.10 is IPv4 but src 2001:db8::20 is IPv6: \
             a packet has one address family"
        );
        assert_eq!(
            err(
                "2001:db8::20",
                "2001:db8::10",
                Transport::Icmp { kind: 8, code: 0 }
            ),
            "cannot explain the flow: transport icmp type 8 code 0 is ICMP in an IPv6 flow: \
             IPv6 carries ICMPv6 (Transport::Icmpv6)"
        );
        assert_eq!(
            err(
                "10.0.0.20",
                "10.0.0.10",
                Transport::Icmpv6 { kind: 128, code: 0 }
            ),
            "cannot explain the flow: transport icmpv6 type 128 code 0 is ICMPv6 in an IPv4 \
             flow: IPv4 carries ICMP (Transport::Icmp)"
        );
        assert_eq!(
            err("10.0.0.20", "10.0.0.10", Transport::Other(6)),
            "cannot explain the flow: transport protocol 6 is TCP: give Transport::Tcp with \
             the destination port"
        );
    }
}
