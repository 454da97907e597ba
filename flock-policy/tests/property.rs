//! The model and its text against the API: for random namespaces, pods, cluster policies,
//! NetworkPolicies and packets, both the verdict of the built ruleset (`Ruleset::verdict`) and
//! the verdict of the rendered nftables script, parsed and run by `nft_eval` as the kernel
//! would, equal a reference evaluator written straight from the Kubernetes NetworkPolicy and
//! network-policy-api ClusterNetworkPolicy documentation over the input types — it shares no
//! code with the crate beyond the input structs. `Model::explain` is checked against it too:
//! its verdict, and the rule it names as deciding each side.

use std::collections::BTreeMap;
use std::net::IpAddr;

use flock_policy::{
    Action, ClusterPeer, ClusterPolicy, ClusterPort, ClusterRule, Direction, Error, Explanation,
    Flow, Hop, LabelSelector, LogMode, Model, NamedPort, Namespace, Operator, Packet, Peer, Pod,
    Policy, PolicyRef, PolicyTypes, Port, PortSpec, Protocol, Reason, Requirement, Rule, RuleRef,
    Tier, Transport, Verdict, log_prefix,
};
use ipnet::IpNet;
use proptest::prelude::*;
use proptest::sample::select;

mod nft_eval;

const NAMESPACES: [&str; 4] = ["a", "b", "c", "unlisted"];
const UPLINK: &str = "eth0";

// ---------- the reference: the API's words, over the input types ----------

fn ns_labels(namespaces: &[Namespace], ns: &str) -> BTreeMap<String, String> {
    // "kubernetes.io/metadata.name" is set on every namespace by the API server
    let mut labels = namespaces
        .iter()
        .find(|n| n.name == ns)
        .map(|n| n.labels.clone())
        .unwrap_or_default();
    labels
        .entry("kubernetes.io/metadata.name".into())
        .or_insert_with(|| ns.to_owned());
    labels
}

/// "A label selector ... The requirements are ANDed. An empty label selector matches all."
fn selects(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    for (k, v) in &sel.match_labels {
        if labels.get(k) != Some(v) {
            return false;
        }
    }
    for r in &sel.match_expressions {
        let ok = match r.operator {
            Operator::In => labels.get(&r.key).is_some_and(|v| r.values.contains(v)),
            Operator::NotIn => labels.get(&r.key).is_none_or(|v| !r.values.contains(v)),
            Operator::Exists => labels.contains_key(&r.key),
            Operator::DoesNotExist => !labels.contains_key(&r.key),
        };
        if !ok {
            return false;
        }
    }
    true
}

/// "If no policyTypes are specified on a NetworkPolicy then by default Ingress will always
/// be set and Egress will be set if the NetworkPolicy has any egress rules."
fn applies(p: &Policy, egress: bool) -> bool {
    match p.policy_types {
        Some(t) if t.ingress || t.egress => {
            if egress {
                t.egress
            } else {
                t.ingress
            }
        }
        _ => !egress || !p.egress.is_empty(),
    }
}

fn in_block(addr: IpAddr, cidr: &str, except: &[String]) -> bool {
    let net: IpNet = cidr.parse::<IpNet>().unwrap().trunc();
    net.contains(&addr)
        && !except
            .iter()
            .any(|e| e.parse::<IpNet>().unwrap().trunc().contains(&addr))
}

/// The peer list admits `addr` (a pod is known by its addresses; an address several pods
/// carry stands for each of them).
fn peers_admit(peers: &[Peer], addr: IpAddr, policy: &Policy, cluster: &Cluster) -> bool {
    if peers.is_empty() {
        return true; // "If this field is empty or missing, this rule matches all sources"
    }
    peers.iter().any(|peer| match peer {
        Peer::IpBlock { cidr, except } => in_block(addr, cidr, except),
        Peer::Pods {
            namespace_selector,
            pod_selector,
        } => cluster
            .pods
            .iter()
            .filter(|q| q.addresses.contains(&addr))
            .any(|q| {
                let ns_ok = match namespace_selector {
                    // "selects particular Pods in the same namespace as the NetworkPolicy"
                    None => q.namespace == policy.namespace,
                    Some(s) => selects(s, &ns_labels(&cluster.namespaces, &q.namespace)),
                };
                ns_ok && pod_selector.as_ref().is_none_or(|s| selects(s, &q.labels))
            }),
    })
}

/// The port list admits the transport; named ports are looked up on `destinations`.
fn ports_admit(ports: &[PortSpec], t: Transport, destinations: &[&Pod]) -> bool {
    if ports.is_empty() {
        return true; // "If this field is empty or missing, this rule matches all ports"
    }
    let (proto, dport) = match t {
        Transport::Tcp(p) => (Protocol::Tcp, p),
        Transport::Udp(p) => (Protocol::Udp, p),
        Transport::Sctp(p) => (Protocol::Sctp, p),
        _ => return false,
    };
    ports.iter().any(|spec| {
        spec.protocol == proto
            && match &spec.port {
                None => true,
                Some(Port::Number(p)) => match spec.end_port {
                    None => dport == *p,
                    Some(e) => *p <= dport && dport <= e,
                },
                Some(Port::Name(n)) => destinations.iter().any(|d| {
                    d.ports
                        .iter()
                        .any(|c| &c.name == n && c.protocol == proto && c.port == dport)
                }),
            }
    })
}

/// A cluster policy's peer (or subject) selects `pod`: "namespaces" selects every pod of the
/// matching namespaces, "pods" the matching pods of the matching namespaces.
fn cluster_selects(peer: &ClusterPeer, pod: &Pod, cluster: &Cluster) -> bool {
    let ns = ns_labels(&cluster.namespaces, &pod.namespace);
    match peer {
        ClusterPeer::Namespaces(n) => selects(n, &ns),
        ClusterPeer::Pods { namespaces, pods } => {
            selects(namespaces, &ns) && selects(pods, &pod.labels)
        }
        ClusterPeer::Networks(_) | ClusterPeer::Everything => false,
    }
}

/// "The rule matches if any of the peers match": pods by their addresses, networks by CIDR.
fn cluster_peers_admit(peers: &[ClusterPeer], addr: IpAddr, cluster: &Cluster) -> bool {
    peers.iter().any(|peer| match peer {
        ClusterPeer::Everything => true,
        ClusterPeer::Networks(cidrs) => cidrs
            .iter()
            .any(|c| c.parse::<IpNet>().unwrap().contains(&addr)),
        _ => cluster
            .pods
            .iter()
            .filter(|q| q.addresses.contains(&addr))
            .any(|q| cluster_selects(peer, q, cluster)),
    })
}

/// "If unspecified, protocol-specific attributes will not be used to match traffic"; a
/// named port is the destination pod's container port of that name.
fn cluster_ports_admit(ports: &[ClusterPort], t: Transport, destinations: &[&Pod]) -> bool {
    if ports.is_empty() {
        return true;
    }
    let (proto, dport) = match t {
        Transport::Tcp(p) => (Protocol::Tcp, p),
        Transport::Udp(p) => (Protocol::Udp, p),
        Transport::Sctp(p) => (Protocol::Sctp, p),
        _ => return false,
    };
    ports.iter().any(|port| match port {
        ClusterPort::Number(p, n) => *p == proto && *n == dport,
        ClusterPort::Range(p, start, end) => *p == proto && (*start..=*end).contains(&dport),
        ClusterPort::Named(name) => destinations.iter().any(|d| {
            d.ports
                .iter()
                .any(|c| &c.name == name && c.protocol == proto && c.port == dport)
        }),
    })
}

/// What decided one side in the reference, and the Admin Pass rule (policy, index) that
/// handed the decision on, if one did.
#[derive(Debug)]
struct Decided {
    by: By,
    passed: Option<(String, usize)>,
}

#[derive(Debug, PartialEq, Eq)]
enum By {
    /// A cluster policy's rule.
    Cluster {
        policy: String,
        tier: Tier,
        rule: usize,
        action: Action,
    },
    /// The NetworkPolicies selecting the pod (`namespace/name`, sorted).
    NetworkPolicies {
        allowed: bool,
        selecting: Vec<String>,
    },
    /// Nothing: allowed.
    Default,
}

impl Decided {
    fn allows(&self) -> bool {
        match &self.by {
            By::Cluster { action, .. } => *action != Action::Deny,
            By::NetworkPolicies { allowed, .. } => *allowed,
            By::Default => true,
        }
    }
}

struct Cluster {
    namespaces: Vec<Namespace>,
    pods: Vec<Pod>,
    policies: Vec<Policy>,
    cluster_policies: Vec<ClusterPolicy>,
}

impl Cluster {
    fn local(&self, hop: &Hop) -> Option<&Pod> {
        match hop {
            Hop::Link(l) => self.pods.iter().find(|p| p.host_if.as_deref() == Some(l)),
            Hop::Node => None,
        }
    }

    /// What the table logs for a packet whose verdict is `verdict`: each side whose pod a
    /// policy judges (it has a chain) logs once when its namespace logs that decision — the
    /// sender's egress first; a side after a drop is never reached.
    fn logs(
        &self,
        ruleset: &flock_policy::Ruleset,
        pkt: &Packet,
        verdict: &Verdict,
    ) -> Vec<String> {
        let (Hop::Link(iif), Hop::Link(oif)) = (&pkt.from, &pkt.to) else {
            return Vec::new();
        };
        if pkt.transport.always_allowed() {
            return Vec::new();
        }
        let mut out = Vec::new();
        for (direction, host_if) in [(Direction::Egress, iif), (Direction::Ingress, oif)] {
            if !ruleset.chains(direction).contains_key(host_if) {
                continue;
            }
            let pod = self
                .local(&Hop::Link(host_if.clone()))
                .expect("a chain is a local pod's");
            let log = self
                .namespaces
                .iter()
                .find(|n| n.name == pod.namespace)
                .and_then(|n| n.log);
            let dropped = matches!(verdict, Verdict::Drop { direction: d, .. } if *d == direction);
            match (log, dropped) {
                (Some(_), true) => out.push(log_prefix(false, direction)),
                (Some(LogMode::All), false) => out.push(log_prefix(true, direction)),
                _ => {}
            }
            if dropped {
                break;
            }
        }
        out
    }

    /// The first rule of `tier` that matches — its policy, its index and its action — the
    /// tier's policies taken by priority ("lower value means higher precedence"; flock breaks
    /// ties by name), each one's rules in order.
    fn tier_rule(
        &self,
        tier: Tier,
        pod: &Pod,
        egress: bool,
        pkt: &Packet,
    ) -> Option<(&ClusterPolicy, usize, Action)> {
        let mut policies: Vec<&ClusterPolicy> = self
            .cluster_policies
            .iter()
            .filter(|p| p.tier == tier && cluster_selects(&p.subject, pod, self))
            .collect();
        policies.sort_by(|a, b| (a.priority, &a.name).cmp(&(b.priority, &b.name)));
        let dst_pods: Vec<&Pod> = self
            .pods
            .iter()
            .filter(|q| q.addresses.contains(&pkt.dst))
            .collect();
        for p in policies {
            let rules = if egress { &p.egress } else { &p.ingress };
            for (i, r) in rules.iter().enumerate() {
                let (peer, destinations) = if egress {
                    (pkt.dst, dst_pods.clone())
                } else {
                    (pkt.src, vec![pod])
                };
                if cluster_peers_admit(&r.peers, peer, self)
                    && cluster_ports_admit(&r.ports, pkt.transport, &destinations)
                {
                    return Some((p, i, r.action));
                }
            }
        }
        None
    }

    /// Whether the pod's side allows the packet in one direction.
    fn side(&self, pod: &Pod, egress: bool, pkt: &Packet) -> bool {
        self.decide(pod, egress, pkt).allows()
    }

    /// What decides the pod's side in one direction: "Admin → NetworkPolicy → Baseline →
    /// default allow"; Accept and Deny decide, Pass goes to the next tier, and "a
    /// v1.NetworkPolicy always makes a final decision for selected pods".
    fn decide(&self, pod: &Pod, egress: bool, pkt: &Packet) -> Decided {
        let cluster = |p: &ClusterPolicy, rule, action| By::Cluster {
            policy: p.name.clone(),
            tier: p.tier,
            rule,
            action,
        };
        let mut passed = None;
        match self.tier_rule(Tier::Admin, pod, egress, pkt) {
            Some((p, i, Action::Pass)) => passed = Some((p.name.clone(), i)),
            Some((p, i, action)) => {
                return Decided {
                    by: cluster(p, i, action),
                    passed,
                };
            }
            None => {}
        }
        let selecting = self.selecting(pod, egress);
        if !selecting.is_empty() {
            let allowed = selecting.iter().any(|p| {
                let rules = if egress { &p.egress } else { &p.ingress };
                rules
                    .iter()
                    .any(|r| self.rule_admits(p, r, pod, egress, pkt))
            });
            let mut selecting: Vec<String> = selecting.iter().map(|p| p.id()).collect();
            selecting.sort();
            return Decided {
                by: By::NetworkPolicies { allowed, selecting },
                passed,
            };
        }
        let by = match self.tier_rule(Tier::Baseline, pod, egress, pkt) {
            Some((p, i, action)) => cluster(p, i, action),
            None => By::Default,
        };
        Decided { by, passed }
    }

    /// The NetworkPolicies that select the pod for one direction.
    fn selecting(&self, pod: &Pod, egress: bool) -> Vec<&Policy> {
        self.policies
            .iter()
            .filter(|p| p.namespace == pod.namespace && selects(&p.pod_selector, &pod.labels))
            .filter(|p| applies(p, egress))
            .collect()
    }

    /// Whether rule `r` of NetworkPolicy `p`, which selects `pod`, admits the packet.
    fn rule_admits(&self, p: &Policy, r: &Rule, pod: &Pod, egress: bool, pkt: &Packet) -> bool {
        if egress {
            let dst_pods: Vec<&Pod> = self
                .pods
                .iter()
                .filter(|q| q.addresses.contains(&pkt.dst))
                .collect();
            peers_admit(&r.peers, pkt.dst, p, self)
                && ports_admit(&r.ports, pkt.transport, &dst_pods)
        } else {
            peers_admit(&r.peers, pkt.src, p, self) && ports_admit(&r.ports, pkt.transport, &[pod])
        }
    }

    /// Whether the API calls `t` ICMP that must pass whatever the policies.
    fn always_allowed(t: Transport) -> bool {
        match t {
            Transport::Icmpv6 { kind, .. } => [2, 133, 134, 135, 136].contains(&kind),
            Transport::Icmp { kind: 3, code: 4 } => true,
            _ => false,
        }
    }

    fn reference(&self, pkt: &Packet) -> bool {
        if pkt.from == Hop::Node || pkt.to == Hop::Node {
            return true; // a pod and its own node
        }
        if Cluster::always_allowed(pkt.transport) {
            return true;
        }
        self.local(&pkt.from)
            .is_none_or(|s| self.side(s, true, pkt))
            && self.local(&pkt.to).is_none_or(|r| self.side(r, false, pkt))
    }
}

fn build(
    cluster: &[ClusterPolicy],
    policies: &[Policy],
    namespaces: &[Namespace],
    pods: &[Pod],
) -> flock_policy::Ruleset {
    Model::with_cluster_policies(cluster, policies, namespaces, pods)
        .unwrap()
        .into_ruleset()
}

/// The update from `old` to `new`, applied to `old`'s table as the kernel applies it, leaves
/// the table `new`'s full render makes.
fn applies_as_a_full_render(
    old: &flock_policy::Ruleset,
    new: &flock_policy::Ruleset,
    delta: &flock_policy::Delta,
) {
    let script = new.update(delta).script();
    let mut table = nft_eval::Nft::parse(&old.render());
    table.apply_update(&script);
    assert!(
        table.same_as(&nft_eval::Nft::parse(&new.render())),
        "the update leaves another table than the full render:\n{script}\nold:\n{}\nnew:\n{}",
        old.render(),
        new.render()
    );
}

/// The packet a flow from `src` to `dst` is on this node: it enters from the veth of the
/// local pod with `src` (else an uplink) and leaves through that of the local pod with `dst`;
/// `None` when several local pods share an address (`explain` refuses those).
fn as_this_node_sees_it(cluster: &Cluster, pkt: &Packet) -> Option<Packet> {
    let hop = |a: IpAddr| -> Option<Hop> {
        let local: Vec<&Pod> = cluster
            .pods
            .iter()
            .filter(|p| p.host_if.is_some() && p.addresses.contains(&a))
            .collect();
        match local.as_slice() {
            [] => Some(Hop::Link(UPLINK.into())),
            [one] => one.host_if.clone().map(Hop::Link),
            _ => None,
        }
    };
    Some(Packet {
        from: hop(pkt.src)?,
        to: hop(pkt.dst)?,
        ..pkt.clone()
    })
}

/// `explain`'s account of each side against the reference's: the same pod, and the rule it
/// names is the one the reference finds deciding (a cluster policy's, exactly; a
/// NetworkPolicy's, one that selects the pod and admits the packet), the same Admin Pass on
/// the way, the same isolating policies.
fn explanation_agrees(
    cluster: &Cluster,
    e: &Explanation,
    pkt: &Packet,
) -> Result<(), TestCaseError> {
    for (side, hop, egress) in [(&e.egress, &pkt.from, true), (&e.ingress, &pkt.to, false)] {
        let pod = cluster.local(hop);
        prop_assert_eq!(
            side.pod.as_ref().map(|p| &p.host_if),
            pod.and_then(|p| p.host_if.as_ref()),
            "the side's pod"
        );
        prop_assert_eq!(side.address, if egress { pkt.src } else { pkt.dst });
        let Some(pod) = pod else {
            prop_assert!(matches!(
                side.reason,
                Reason::NotLocal | Reason::AlwaysAllowed
            ));
            continue;
        };
        if Cluster::always_allowed(pkt.transport) {
            prop_assert_eq!(&side.reason, &Reason::AlwaysAllowed);
            continue;
        }
        let want = cluster.decide(pod, egress, pkt);
        let cluster_rule = |r: &RuleRef| -> Result<(), TestCaseError> {
            let PolicyRef::ClusterNetworkPolicy { name, tier, .. } = &r.policy else {
                return Err(TestCaseError::fail(format!("{r} is no cluster policy's")));
            };
            prop_assert_eq!(
                &want.by,
                &By::Cluster {
                    policy: name.clone(),
                    tier: *tier,
                    rule: r.index,
                    action: r.action
                },
                "{}",
                e
            );
            let input = cluster
                .cluster_policies
                .iter()
                .find(|p| &p.name == name)
                .unwrap();
            let rules = if egress {
                &input.egress
            } else {
                &input.ingress
            };
            prop_assert_eq!(
                r.name.clone().unwrap_or_default(),
                rules[r.index].name.clone()
            );
            Ok(())
        };
        let passed_by = match &side.reason {
            Reason::NotSelected | Reason::NoRuleMatched { .. } => {
                prop_assert_eq!(&want.by, &By::Default, "{}", e);
                match &side.reason {
                    Reason::NoRuleMatched { passed_by } => passed_by,
                    _ => &None,
                }
            }
            Reason::Rule { rule, passed_by } => {
                match &rule.policy {
                    PolicyRef::ClusterNetworkPolicy { .. } => cluster_rule(rule)?,
                    PolicyRef::NetworkPolicy { namespace, name } => {
                        prop_assert!(
                            matches!(want.by, By::NetworkPolicies { allowed: true, .. }),
                            "{} but the reference: {:?}",
                            e,
                            want
                        );
                        let p = cluster
                            .policies
                            .iter()
                            .find(|p| &p.namespace == namespace && &p.name == name)
                            .unwrap();
                        prop_assert!(
                            cluster
                                .selecting(pod, egress)
                                .iter()
                                .any(|s| s.id() == p.id())
                        );
                        let rules = if egress { &p.egress } else { &p.ingress };
                        prop_assert!(
                            cluster.rule_admits(p, &rules[rule.index], pod, egress, pkt),
                            "{} names a rule that does not admit {:?}",
                            e,
                            pkt
                        );
                        prop_assert_eq!(rule.action, Action::Accept);
                    }
                }
                prop_assert_eq!(rule.direction, side.direction);
                passed_by
            }
            Reason::NotAllowed {
                isolated_by,
                passed_by,
            } => {
                let names: Vec<String> = isolated_by.iter().map(PolicyRef::short).collect();
                prop_assert_eq!(
                    &want.by,
                    &By::NetworkPolicies {
                        allowed: false,
                        selecting: names
                    },
                    "{}",
                    e
                );
                passed_by
            }
            Reason::NotLocal | Reason::AlwaysAllowed => {
                return Err(TestCaseError::fail(format!(
                    "{e}: a local pod's side, judged"
                )));
            }
        };
        prop_assert_eq!(
            passed_by.as_ref().map(|r| {
                let PolicyRef::ClusterNetworkPolicy { name, .. } = &r.policy else {
                    return (String::new(), usize::MAX);
                };
                (name.clone(), r.index)
            }),
            want.passed.clone(),
            "{}",
            e
        );
    }
    Ok(())
}

// ---------- generators ----------

fn labels(
    keys: &'static [(&'static str, &'static [&'static str])],
) -> impl Strategy<Value = BTreeMap<String, String>> {
    proptest::collection::vec((0..keys.len(), 0..2usize), 0..=keys.len()).prop_map(move |v| {
        v.into_iter()
            .map(|(k, i)| {
                let (key, values) = keys[k];
                (key.to_owned(), values[i % values.len()].to_owned())
            })
            .collect()
    })
}

const POD_LABELS: &[(&str, &[&str])] = &[("app", &["web", "db"]), ("role", &["client", "server"])];
const NS_LABELS: &[(&str, &[&str])] = &[("team", &["x", "y"]), ("env", &["prod", "dev"])];
const ALL_KEYS: [&str; 5] = ["app", "role", "team", "env", "kubernetes.io/metadata.name"];
const ALL_VALUES: [&str; 7] = ["web", "db", "client", "x", "prod", "a", "b"];

fn selector() -> impl Strategy<Value = LabelSelector> {
    let requirement = (
        select(&ALL_KEYS[..]),
        0..4u8,
        proptest::collection::vec(select(&ALL_VALUES[..]), 1..3),
    )
        .prop_map(|(key, op, values)| {
            let operator = [
                Operator::In,
                Operator::NotIn,
                Operator::Exists,
                Operator::DoesNotExist,
            ][usize::from(op)];
            Requirement {
                key: key.to_owned(),
                operator,
                values: match operator {
                    Operator::In | Operator::NotIn => {
                        values.into_iter().map(str::to_owned).collect()
                    }
                    _ => Vec::new(),
                },
            }
        });
    prop_oneof![
        2 => Just(LabelSelector::all()),
        3 => (labels(POD_LABELS), proptest::collection::vec(requirement.clone(), 0..2))
            .prop_map(|(match_labels, match_expressions)| LabelSelector { match_labels, match_expressions }),
        1 => (labels(NS_LABELS), proptest::collection::vec(requirement, 0..2))
            .prop_map(|(match_labels, match_expressions)| LabelSelector { match_labels, match_expressions }),
    ]
}

const BLOCKS: [(&str, &[&str]); 6] = [
    ("2001:db8::/120", &["2001:db8::/126"]),
    ("10.0.0.0/28", &["10.0.0.4/30"]),
    ("0.0.0.0/0", &[]),
    ("::/0", &["2001:db8::8/125"]),
    ("10.0.0.9/29", &[]), // host bits set: the network is meant
    ("2001:db8::100/120", &[]),
];

fn peer() -> impl Strategy<Value = Peer> {
    prop_oneof![
        (proptest::option::of(selector()), selector()).prop_map(|(n, p)| Peer::Pods {
            namespace_selector: n,
            pod_selector: Some(p),
        }),
        selector().prop_map(Peer::namespaces),
        (0..BLOCKS.len()).prop_map(|i| Peer::ip_block(BLOCKS[i].0, BLOCKS[i].1)),
    ]
}

const PROTOCOLS: [Protocol; 3] = [Protocol::Tcp, Protocol::Udp, Protocol::Sctp];
const PORTS: [u16; 7] = [9, 53, 80, 81, 82, 8080, 1000];
const NAMES: [&str; 3] = ["http", "dns", "x"];

fn port_spec() -> impl Strategy<Value = PortSpec> {
    (
        select(&PROTOCOLS[..]),
        0..4u8,
        select(&PORTS[..]),
        select(&NAMES[..]),
        prop_oneof![0..3u16, 0..2000u16],
    )
        .prop_map(|(protocol, kind, n, name, span)| match kind {
            0 => PortSpec {
                protocol,
                port: None,
                end_port: None,
            },
            1 => PortSpec::number(protocol, n),
            2 => PortSpec::range(protocol, n, n.saturating_add(span)),
            _ => PortSpec::name(protocol, name),
        })
}

fn rule() -> impl Strategy<Value = Rule> {
    (
        proptest::collection::vec(peer(), 0..3),
        proptest::collection::vec(port_spec(), 0..3),
    )
        .prop_map(|(peers, ports)| Rule { peers, ports })
}

fn policy() -> impl Strategy<Value = Policy> {
    (
        0..3usize,
        prop_oneof![Just(LabelSelector::all()), selector()],
        proptest::option::of((any::<bool>(), any::<bool>())),
        proptest::collection::vec(rule(), 0..3),
        proptest::collection::vec(rule(), 0..3),
    )
        .prop_map(|(ns, pod_selector, types, ingress, egress)| Policy {
            namespace: NAMESPACES[ns].into(),
            name: "p".into(),
            pod_selector,
            policy_types: types.map(|(ingress, egress)| PolicyTypes { ingress, egress }),
            ingress,
            egress,
        })
}

const NETWORKS: [&str; 5] = [
    "2001:db8::/120",
    "::/0",
    "0.0.0.0/0",
    "10.0.0.0/29",
    "2001:db8::100/120",
];

fn cluster_peer(egress: bool) -> impl Strategy<Value = ClusterPeer> {
    let pods = (selector(), selector())
        .prop_map(|(namespaces, pods)| ClusterPeer::Pods { namespaces, pods });
    let networks = proptest::collection::vec(select(&NETWORKS[..]), 1..3)
        .prop_map(|n| ClusterPeer::Networks(n.into_iter().map(str::to_owned).collect()));
    let everything = Just(ClusterPeer::Everything);
    if egress {
        prop_oneof![
            4 => selector().prop_map(ClusterPeer::Namespaces),
            4 => pods,
            4 => networks,
            1 => everything
        ]
        .boxed()
    } else {
        prop_oneof![4 => selector().prop_map(ClusterPeer::Namespaces), 4 => pods, 1 => everything]
            .boxed()
    }
}

fn cluster_port() -> impl Strategy<Value = ClusterPort> {
    (
        select(&PROTOCOLS[..]),
        0..3u8,
        select(&PORTS[..]),
        select(&NAMES[..]),
        1..2000u16,
    )
        .prop_map(|(protocol, kind, n, name, span)| match kind {
            0 => ClusterPort::Number(protocol, n),
            1 => ClusterPort::Range(protocol, n, n.saturating_add(span).max(n + 1)),
            _ => ClusterPort::Named(name.into()),
        })
}

fn cluster_rules(egress: bool) -> impl Strategy<Value = Vec<ClusterRule>> {
    proptest::collection::vec(
        (
            select(vec![Action::Accept, Action::Deny, Action::Pass]),
            proptest::collection::vec(cluster_peer(egress), 1..3),
            proptest::collection::vec(cluster_port(), 0..3),
        )
            .prop_map(|(action, peers, ports)| ClusterRule {
                name: String::new(),
                action,
                peers,
                ports,
            }),
        0..3,
    )
}

fn cluster_policies() -> impl Strategy<Value = Vec<ClusterPolicy>> {
    proptest::collection::vec(
        (
            select(vec![Tier::Admin, Tier::Baseline]),
            0..3u32,
            prop_oneof![
                selector().prop_map(ClusterPeer::Namespaces),
                (selector(), selector())
                    .prop_map(|(namespaces, pods)| ClusterPeer::Pods { namespaces, pods }),
            ],
            cluster_rules(false),
            cluster_rules(true),
        ),
        0..4,
    )
    .prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(
                |(i, (tier, priority, subject, ingress, egress))| ClusterPolicy {
                    name: format!("cnp{i}"),
                    tier,
                    priority,
                    subject,
                    ingress,
                    egress,
                },
            )
            .collect()
    })
}

/// A named container port: (name, protocol, number).
fn named_port() -> impl Strategy<Value = NamedPort> {
    (
        select(&NAMES[..]),
        select(&PROTOCOLS[..]),
        select(&PORTS[..]),
    )
        .prop_map(|(name, protocol, port)| NamedPort {
            name: name.into(),
            protocol,
            port,
        })
}

fn pods() -> impl Strategy<Value = Vec<Pod>> {
    proptest::collection::vec(
        (
            prop_oneof![3 => 0..3usize, 1 => Just(3usize)],
            labels(POD_LABELS),
            proptest::bool::weighted(0.7), // local?
            0..3u8,                        // families: 0 both, 1 v6, 2 v4
            any::<bool>(),                 // carries the shared anycast address
            proptest::collection::vec(named_port(), 0..3),
        ),
        1..7,
    )
    .prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (ns, labels, local, fam, anycast, mut ports))| {
                // a pod's port names are unique per protocol
                ports.sort_by(|a, b| (&a.name, a.protocol).cmp(&(&b.name, b.protocol)));
                ports.dedup_by(|a, b| a.name == b.name && a.protocol == b.protocol);
                let mut addresses: Vec<IpAddr> = Vec::new();
                // addresses inside and outside the ipBlocks above
                let host = if i % 2 == 0 { i + 1 } else { 0x100 + i };
                if fam != 2 {
                    addresses.push(format!("2001:db8::{host:x}").parse().unwrap());
                }
                if fam != 1 {
                    addresses.push(format!("10.0.0.{}", 1 + 3 * i).parse().unwrap());
                }
                if anycast {
                    addresses.push("2001:db8::aa".parse().unwrap());
                }
                Pod {
                    namespace: NAMESPACES[ns].into(),
                    name: format!("pod{i}"),
                    labels: labels.into(),
                    addresses,
                    host_if: local.then(|| format!("flock{i:08x}")),
                    ports,
                }
            })
            .collect()
    })
}

fn namespaces() -> impl Strategy<Value = Vec<Namespace>> {
    let log = || select(vec![None, Some(LogMode::Deny), Some(LogMode::All)]);
    (
        (labels(NS_LABELS), log()),
        (labels(NS_LABELS), log()),
        (labels(NS_LABELS), log()),
    )
        .prop_map(|(a, b, c)| {
            [("a", a), ("b", b), ("c", c)]
                .into_iter()
                .map(|(name, (labels, log))| Namespace {
                    name: name.into(),
                    labels,
                    log,
                })
                .collect()
        })
}

/// Where a packet comes from or goes to: a pod (by index), the node, or an outside address.
#[derive(Debug, Clone)]
enum End {
    Pod(usize),
    Node,
    Outside(IpAddr),
}

fn end() -> impl Strategy<Value = End> {
    prop_oneof![
        6 => (0..7usize).prop_map(End::Pod),
        1 => Just(End::Node),
        2 => select(vec!["2001:db8::3", "2001:db8::9", "2001:db8::ff0", "2001:db8:1::1", "10.0.0.5", "192.168.7.7", "10.0.0.14"])
            .prop_map(|a| End::Outside(a.parse().unwrap())),
    ]
}

fn transport() -> impl Strategy<Value = (u8, u16, u8)> {
    (
        0..7u8,
        select(&PORTS[..]),
        select(vec![0u8, 2, 4, 128, 133, 135, 136]),
    )
}

/// A packet to be: ends, IPv6?, (transport kind, port, ICMP type), address indexes.
type PacketSeed = (End, End, bool, (u8, u16, u8), usize, usize);

fn packets() -> impl Strategy<Value = Vec<PacketSeed>> {
    proptest::collection::vec(
        (
            end(),
            end(),
            any::<bool>(),
            transport(),
            0..4usize,
            0..4usize,
        ),
        24,
    )
}

/// A concrete packet, or `None` when an end has no address of the chosen family.
fn packet(
    cluster: &Cluster,
    (from, to, v6, (t, port, icmp), si, di): &PacketSeed,
) -> Option<Packet> {
    let node_addr: IpAddr = if *v6 {
        "2001:db8:ffff::1".parse().unwrap()
    } else {
        "10.255.0.1".parse().unwrap()
    };
    let pick = |e: &End, i: usize| -> Option<(IpAddr, Hop)> {
        let want_v6 = *v6;
        match e {
            End::Node => Some((node_addr, Hop::Node)),
            End::Outside(a) => (a.is_ipv6() == want_v6).then(|| (*a, Hop::Link(UPLINK.into()))),
            End::Pod(p) => {
                let pod = &cluster.pods[*p % cluster.pods.len()];
                let addrs: Vec<IpAddr> = pod
                    .addresses
                    .iter()
                    .copied()
                    .filter(|a| a.is_ipv6() == want_v6)
                    .collect();
                let a = *addrs.get(i % addrs.len().max(1))?;
                let hop = match &pod.host_if {
                    Some(h) => Hop::Link(h.clone()),
                    None => Hop::Link(UPLINK.into()),
                };
                Some((a, hop))
            }
        }
    };
    let (src, from) = pick(from, *si)?;
    let (dst, to) = pick(to, *di)?;
    let transport = match t {
        0 | 1 => Transport::Tcp(*port),
        2 => Transport::Udp(*port),
        3 => Transport::Sctp(*port),
        4 if *v6 => Transport::Icmpv6 {
            kind: *icmp,
            code: 0,
        },
        4 => Transport::Icmp {
            kind: icmp % 9,
            code: 4,
        },
        5 if *v6 => Transport::Icmpv6 { kind: 128, code: 0 },
        5 => Transport::Icmp { kind: 8, code: 0 },
        _ => Transport::Other(47),
    };
    Some(Packet {
        src,
        dst,
        transport,
        from,
        to,
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    /// ... and `Model::explain` of the flow each packet's addresses make (from and to the local
    /// pods with those addresses) gives the ruleset's verdict for the packet the flow is, and
    /// names the rule the reference finds deciding each side.
    #[test]
    fn ruleset_verdict_equals_the_api_semantics(
        namespaces in namespaces(),
        pods in pods(),
        cluster_policies in cluster_policies(),
        policies in proptest::collection::vec(policy(), 0..5),
        packets in packets(),
    ) {
        // names an explanation can be checked by: each policy's own, some rules named
        let mut policies = policies;
        for (i, p) in policies.iter_mut().enumerate() {
            p.name = format!("p{i}");
        }
        let mut cluster_policies = cluster_policies;
        for p in &mut cluster_policies {
            for (j, r) in p.ingress.iter_mut().chain(p.egress.iter_mut()).enumerate() {
                if j % 2 == 0 {
                    r.name = format!("rule-{j}");
                }
            }
        }
        let model =
            Model::with_cluster_policies(&cluster_policies, &policies, &namespaces, &pods).unwrap();
        let ruleset = model.ruleset();
        let script = ruleset.render();
        let text = nft_eval::Nft::parse(&script);
        let cluster = Cluster { namespaces, pods, policies, cluster_policies };
        for p in &packets {
            let Some(pkt) = packet(&cluster, p) else { continue };
            let want = cluster.reference(&pkt);
            prop_assert_eq!(
                text.accepts(&pkt),
                want,
                "the rendered text disagrees: packet {:?}\n{}",
                pkt,
                script
            );
            let got = ruleset.verdict(&pkt);
            prop_assert_eq!(
                got == Verdict::Accept,
                want,
                "packet {:?}\nverdict {:?}\nruleset:\n{}",
                pkt,
                got,
                ruleset.render()
            );
            // the decisions the pods' namespaces log, and only those, are logged once each
            prop_assert_eq!(
                text.logged(),
                cluster.logs(ruleset, &pkt, &got),
                "the logged decisions: packet {:?}, verdict {:?}\n{}",
                pkt,
                got,
                script
            );

            let flow = Flow { src: pkt.src, dst: pkt.dst, transport: pkt.transport };
            let explained = model.explain(&flow);
            let Some(seen) = as_this_node_sees_it(&cluster, &pkt) else {
                let err = explained.expect_err("an address of several local pods is refused");
                prop_assert!(
                    matches!(&err, Error::Flow { field: "src" | "dst", .. }),
                    "{}",
                    err
                );
                continue;
            };
            let e = explained.unwrap();
            let verdict = ruleset.verdict(&seen);
            prop_assert_eq!(&e.verdict, &verdict, "{}\npacket {:?}\n{}", e, seen, script);
            prop_assert_eq!(e.verdict == Verdict::Accept, cluster.reference(&seen), "{}", e);
            prop_assert_eq!(text.accepts(&seen), cluster.reference(&seen));
            explanation_agrees(&cluster, &e, &seen)?;
        }
    }

    #[test]
    fn rendering_ignores_input_order(
        namespaces in namespaces(),
        pods in pods(),
        cluster_policies in cluster_policies(),
        policies in proptest::collection::vec(policy(), 0..4),
    ) {
        let one = build(&cluster_policies, &policies, &namespaces, &pods).render();
        let (mut cluster_policies, mut policies, mut namespaces, mut pods) =
            (cluster_policies, policies, namespaces, pods);
        cluster_policies.reverse();
        policies.reverse();
        namespaces.reverse();
        pods.reverse();
        for p in &mut policies {
            for r in p.ingress.iter_mut().chain(p.egress.iter_mut()) {
                r.peers.reverse();
                r.ports.reverse();
            }
        }
        // a cluster policy's rules keep their order (the first that matches decides); the
        // peers and ports of one rule have none
        for p in &mut cluster_policies {
            for r in p.ingress.iter_mut().chain(p.egress.iter_mut()) {
                r.peers.reverse();
                r.ports.reverse();
            }
        }
        prop_assert_eq!(one, build(&cluster_policies, &policies, &namespaces, &pods).render());
    }

    /// The incremental path: a model that a pod joins or leaves equals the model built
    /// with or without it, and the delta it kept is the one a diff of the two finds.
    #[test]
    fn a_model_follows_a_pod_joining_and_leaving_as_a_rebuild_would(
        namespaces in namespaces(),
        pods in pods(),
        cluster_policies in cluster_policies(),
        policies in proptest::collection::vec(policy(), 0..4),
        which in any::<proptest::sample::Index>(),
    ) {
        prop_assume!(!pods.is_empty());
        let mut rest = pods.clone();
        let pod = rest.remove(which.index(pods.len()));
        let model = |pods: &[Pod]| {
            Model::with_cluster_policies(&cluster_policies, &policies, &namespaces, pods).unwrap()
        };
        let with = model(&pods);
        let without = model(&rest);

        let mut joined = without.clone();
        if joined.add_pod(&pod).unwrap() {
            prop_assert_eq!(joined.ruleset(), with.ruleset());
            let delta = joined.take_delta();
            if let Some(diff) = with.ruleset().delta_from(without.ruleset()) {
                prop_assert_eq!(&delta, &diff);
                applies_as_a_full_render(without.ruleset(), with.ruleset(), &diff);
            }
            prop_assert!(joined.take_delta().is_empty(), "a delta is taken once");
        } else {
            prop_assert!(pod.host_if.is_some(), "only a local pod can need a new set");
            prop_assert_eq!(joined.ruleset(), without.ruleset(), "refused: unchanged");
        }

        let mut left = with.clone();
        if left.remove_pod(&pod) {
            prop_assert_eq!(left.ruleset(), without.ruleset());
            let delta = left.take_delta();
            if let Some(diff) = without.ruleset().delta_from(with.ruleset()) {
                prop_assert_eq!(&delta, &diff);
                applies_as_a_full_render(with.ruleset(), without.ruleset(), &diff);
            }
        } else {
            prop_assert!(pod.host_if.is_some(), "only a local pod's chain can free a set");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// The policy path: a model that takes other policies and namespaces equals the model
    /// built from them but for its sets' names (a set that stays keeps its name); its delta,
    /// applied to the old table as the kernel would (sets and chains created before they are
    /// used, deleted after), leaves the table its full render makes; and it follows pods
    /// joining and leaving afterwards as a rebuild would.
    #[test]
    fn a_model_takes_new_policies_and_namespaces_as_a_rebuild_would(
        pods in pods(),
        before in (namespaces(), cluster_policies(), proptest::collection::vec(policy(), 0..4)),
        after in (namespaces(), cluster_policies(), proptest::collection::vec(policy(), 0..4)),
        keep in (any::<bool>(), any::<bool>(), any::<bool>()),
        which in any::<proptest::sample::Index>(),
    ) {
        // often keep a part as it was, so that sets stay as well as come and go
        let (namespaces, cluster_policies, mut policies) = after;
        let namespaces = if keep.0 { before.0.clone() } else { namespaces };
        let cluster_policies = if keep.1 { before.1.clone() } else { cluster_policies };
        if keep.2 {
            policies.extend(before.2.iter().cloned());
        }
        let mut model =
            Model::with_cluster_policies(&before.1, &before.2, &before.0, &pods).unwrap();
        let old = model.ruleset().clone();
        model
            .update_policies(&cluster_policies, &policies, &namespaces)
            .unwrap();
        let fresh = build(&cluster_policies, &policies, &namespaces, &pods);
        prop_assert_eq!(model.ruleset().canonical(), fresh.canonical());
        for (name, set) in &model.ruleset().sets {
            if let Some(was) = old.sets.get(name) {
                prop_assert_eq!(
                    (&was.about, was.family),
                    (&set.about, set.family),
                    "a name stands for one set"
                );
            }
        }
        let delta = model.take_delta();
        if !old.is_empty() && !model.ruleset().is_empty() {
            applies_as_a_full_render(&old, model.ruleset(), &delta);
        }
        prop_assert!(model.take_delta().is_empty(), "a delta is taken once");

        // pods still come and go as in a rebuild
        prop_assume!(!pods.is_empty());
        let pod = &pods[which.index(pods.len())];
        let mut left = model.clone();
        if left.remove_pod(pod) {
            let rest: Vec<Pod> = pods.iter().filter(|p| *p != pod).cloned().collect();
            prop_assert_eq!(
                left.ruleset().canonical(),
                build(&cluster_policies, &policies, &namespaces, &rest).canonical()
            );
            let delta = left.take_delta();
            if !left.ruleset().is_empty() {
                applies_as_a_full_render(model.ruleset(), left.ruleset(), &delta);
            }
        }
    }
}

/// Two different chains that render alike share one kernel chain: an Admin Accept before a
/// default deny, and a NetworkPolicy allowing the same peers. When one of their pods goes,
/// the chain stays for the other (it was deleted while in use, and nft refused the update).
#[test]
fn chains_that_render_alike_are_one_kernel_chain_until_the_last_goes() {
    let ops = LabelSelector::labels([("team", "x")]);
    let namespaces = vec![
        Namespace {
            name: "a".into(),
            labels: Default::default(),
            log: None,
        },
        Namespace {
            name: "b".into(),
            labels: Default::default(),
            log: None,
        },
        Namespace {
            name: "c".into(),
            labels: [("team".to_owned(), "x".to_owned())].into(),
            log: None,
        },
    ];
    let pod = |ns: &str, name: &str, last: u8, local: bool| Pod {
        namespace: ns.into(),
        name: name.into(),
        labels: Default::default(),
        addresses: vec![
            format!("2001:db8::{last:x}").parse().unwrap(),
            format!("10.0.0.{last}").parse().unwrap(),
        ],
        host_if: local.then(|| format!("flock000000{last:02x}")),
        ports: vec![],
    };
    let (pa, pb, client) = (
        pod("a", "pa", 1, true),
        pod("b", "pb", 2, true),
        pod("c", "ops", 3, false),
    );
    let deny_a = Policy {
        namespace: "a".into(),
        name: "deny".into(),
        pod_selector: LabelSelector::all(),
        ..Default::default()
    };
    let allow_b = Policy {
        namespace: "b".into(),
        name: "from-ops".into(),
        pod_selector: LabelSelector::all(),
        ingress: vec![Rule {
            peers: vec![Peer::namespaces(ops.clone())],
            ports: vec![],
        }],
        ..Default::default()
    };
    let admin = ClusterPolicy {
        name: "ops-to-a".into(),
        tier: Tier::Admin,
        priority: 1,
        subject: ClusterPeer::Namespaces(LabelSelector::labels([(
            "kubernetes.io/metadata.name",
            "a",
        )])),
        ingress: vec![ClusterRule {
            name: String::new(),
            action: Action::Accept,
            peers: vec![ClusterPeer::Namespaces(ops)],
            ports: vec![],
        }],
        egress: vec![],
    };
    let (cluster, policies) = ([admin], [deny_a, allow_b]);
    let model = |pods: &[Pod]| {
        Model::with_cluster_policies(&cluster, &policies, &namespaces, pods)
            .unwrap()
            .into_ruleset()
    };
    let both = model(&[pa.clone(), pb.clone(), client.clone()]);
    let script = both.render();
    assert_eq!(
        script.matches("\tchain ingress_").count(),
        1,
        "one shared chain:\n{script}"
    );
    for gone in [&pb, &pa] {
        let rest: Vec<Pod> = [&pa, &pb, &client]
            .into_iter()
            .filter(|p| p.name != gone.name)
            .cloned()
            .collect();
        let one = model(&rest);
        let delta = one.delta_from(&both).expect("the same sets");
        applies_as_a_full_render(&both, &one, &delta);
        let delta = both.delta_from(&one).expect("the same sets");
        applies_as_a_full_render(&one, &both, &delta);
    }
}
