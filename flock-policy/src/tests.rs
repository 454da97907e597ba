//! Validation, defaulting and the pieces the property test reaches only rarely.

use crate::model::merge;
use crate::*;

fn policy(ingress: Vec<Rule>) -> Policy {
    Policy {
        namespace: "shop".into(),
        name: "p".into(),
        ingress,
        ..Default::default()
    }
}

fn rule(peers: Vec<Peer>, ports: Vec<PortSpec>) -> Rule {
    Rule { peers, ports }
}

fn err(p: &Policy) -> String {
    p.validate().unwrap_err().to_string()
}

#[test]
fn validation_errors_name_the_field_and_the_value() {
    assert_eq!(
        err(&policy(vec![rule(
            vec![Peer::ip_block("10.0.0.0/33", &[])],
            vec![]
        )])),
        "networkpolicy shop/p: spec.ingress[0].from[0].ipBlock.cidr \"10.0.0.0/33\" is not a CIDR (like 10.0.0.0/8 or 2001:db8::/32)"
    );
    assert_eq!(
        err(&policy(vec![rule(
            vec![Peer::ip_block("10.0.0.0/8", &["10.0.0.0/8"])],
            vec![]
        )])),
        "networkpolicy shop/p: spec.ingress[0].from[0].ipBlock.except[0] 10.0.0.0/8 is not strictly inside ipBlock.cidr 10.0.0.0/8"
    );
    assert_eq!(
        err(&policy(vec![rule(
            vec![Peer::ip_block("10.0.0.0/8", &["2001:db8::/64"])],
            vec![]
        )])),
        "networkpolicy shop/p: spec.ingress[0].from[0].ipBlock.except[0] 2001:db8::/64 is not strictly inside ipBlock.cidr 10.0.0.0/8"
    );
    let mut named_range = PortSpec::name(Protocol::Tcp, "http");
    named_range.end_port = Some(90);
    assert_eq!(
        err(&policy(vec![rule(vec![], vec![named_range])])),
        "networkpolicy shop/p: spec.ingress[0].ports[0].endPort 90 needs a numeric port (a named port or no port cannot start a range)"
    );
    assert_eq!(
        err(&policy(vec![rule(
            vec![],
            vec![
                PortSpec::number(Protocol::Udp, 53),
                PortSpec::range(Protocol::Tcp, 90, 80)
            ]
        )])),
        "networkpolicy shop/p: spec.ingress[0].ports[1].endPort 80 is below port 90"
    );
    assert_eq!(
        err(&policy(vec![rule(
            vec![],
            vec![PortSpec::number(Protocol::Tcp, 0)]
        )])),
        "networkpolicy shop/p: spec.ingress[0].ports[0].port 0 is not a port (1 to 65535)"
    );
    assert_eq!(
        err(&policy(vec![rule(
            vec![],
            vec![PortSpec::name(Protocol::Tcp, "HTTP")]
        )])),
        "networkpolicy shop/p: spec.ingress[0].ports[0].port \"HTTP\" is not a port name: may hold only lower-case letters, digits and '-'"
    );
    assert_eq!(
        err(&policy(vec![rule(
            vec![Peer::Pods {
                namespace_selector: None,
                pod_selector: None
            }],
            vec![]
        )])),
        "networkpolicy shop/p: spec.ingress[0].from[0] selects nothing: give podSelector, namespaceSelector or ipBlock"
    );
    let mut p = policy(vec![]);
    p.egress = vec![rule(
        vec![Peer::namespaces(LabelSelector {
            match_expressions: vec![Requirement {
                key: "team".into(),
                operator: Operator::In,
                values: vec![],
            }],
            ..Default::default()
        })],
        vec![],
    )];
    assert_eq!(
        err(&p),
        "networkpolicy shop/p: spec.egress[0].to[0].namespaceSelector.matchExpressions[0] \"team\" In: needs at least one value"
    );
}

#[test]
fn bad_host_interfaces_are_refused() {
    let pod = |name: &str, host_if: &str| Pod {
        namespace: "shop".into(),
        name: name.into(),
        host_if: Some(host_if.into()),
        ..Default::default()
    };
    let e = build(&[], &[], &[pod("a", "flock\"; drop")]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "pod shop/a: host interface \"flock\\\"; drop\" may hold only letters, digits, '_', '-' and '.' (flock's veths are flock<8 hex>)"
    );
    let e = build(
        &[],
        &[],
        &[pod("a", "flock00000001"), pod("b", "flock00000001")],
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "pods shop/a and shop/b both claim host interface \"flock00000001\""
    );
    assert!(build(&[], &[], &[pod("a", "flock0123456789ab")]).is_err());
}

#[test]
fn policy_types_default_as_the_api_server_does() {
    let mut p = policy(vec![]);
    assert_eq!(
        p.effective_types(),
        PolicyTypes {
            ingress: true,
            egress: false
        }
    );
    p.egress = vec![Rule::default()];
    assert_eq!(
        p.effective_types(),
        PolicyTypes {
            ingress: true,
            egress: true
        }
    );
    p.policy_types = Some(PolicyTypes {
        ingress: false,
        egress: true,
    });
    assert_eq!(
        p.effective_types(),
        PolicyTypes {
            ingress: false,
            egress: true
        }
    );
    // an empty list is defaulted too
    p.policy_types = Some(PolicyTypes::default());
    assert_eq!(
        p.effective_types(),
        PolicyTypes {
            ingress: true,
            egress: true
        }
    );
}

#[test]
fn selectors_print_in_kubernetes_syntax() {
    let s = LabelSelector {
        match_labels: [("app".into(), "web".into())].into(),
        match_expressions: vec![
            Requirement {
                key: "tier".into(),
                operator: Operator::In,
                values: vec!["a".into(), "b".into()],
            },
            Requirement {
                key: "legacy".into(),
                operator: Operator::DoesNotExist,
                values: vec![],
            },
            Requirement {
                key: "env".into(),
                operator: Operator::NotIn,
                values: vec!["dev".into()],
            },
            Requirement {
                key: "team".into(),
                operator: Operator::Exists,
                values: vec![],
            },
        ],
    };
    assert_eq!(
        s.to_string(),
        "app=web,tier in (a,b),!legacy,env notin (dev),team"
    );
    assert_eq!(LabelSelector::all().to_string(), "{}");
}

#[test]
fn port_ranges_merge_when_they_touch() {
    assert_eq!(merge(vec![(80, 80), (82, 82)]), [(80, 80), (82, 82)]);
    assert_eq!(merge(vec![(82, 82), (80, 81)]), [(80, 82)]);
    assert_eq!(merge(vec![(1, 65535), (80, 80)]), [(1, 65535)]);
    assert_eq!(merge(vec![(65535, 65535), (0, 65534)]), [(0, 65535)]);
}

fn two_pods() -> Vec<Pod> {
    let pod = |name: &str, app: &str, addrs: &[&str], host_if: Option<&str>| Pod {
        namespace: "shop".into(),
        name: name.into(),
        labels: std::sync::Arc::new([("app".into(), app.into())].into()),
        addresses: addrs.iter().map(|a| a.parse().unwrap()).collect(),
        host_if: host_if.map(str::to_owned),
        ports: vec![],
    };
    vec![
        pod(
            "web",
            "web",
            &["2001:db8::10", "10.0.0.10"],
            Some("flock0000000a"),
        ),
        pod("client", "client", &["2001:db8::20"], None),
    ]
}

#[test]
fn a_pod_joining_a_selector_is_one_element_added() {
    let p = Policy {
        pod_selector: LabelSelector::labels([("app", "web")]),
        ..policy(vec![rule(
            vec![Peer::pods(LabelSelector::labels([("app", "client")]))],
            vec![],
        )])
    };
    let old = build(std::slice::from_ref(&p), &[], &two_pods()).unwrap();
    let mut pods = two_pods();
    pods.push(Pod {
        name: "client-2".into(),
        addresses: vec![
            "2001:db8::21".parse().unwrap(),
            "10.0.0.21".parse().unwrap(),
        ],
        ..pods[1].clone()
    });
    pods.remove(1);
    let new = build(std::slice::from_ref(&p), &[], &pods).unwrap();
    assert_eq!(
        new.update_from(&old).unwrap(),
        "delete element inet flock_policy pods0_v6 { 2001:db8::20 }\n\
         add element inet flock_policy pods0_v4 { 10.0.0.21 }\n\
         add element inet flock_policy pods0_v6 { 2001:db8::21 }\n"
    );
    assert_eq!(new.update_from(&new).unwrap(), "");
    // a policy that keeps the sets as they are: a chain and a map element, not a new table
    let q = Policy {
        name: "q".into(),
        pod_selector: LabelSelector::all(),
        policy_types: Some(PolicyTypes {
            ingress: false,
            egress: true,
        }),
        ..policy(vec![])
    };
    let other = build(&[p.clone(), q], &[], &pods).unwrap();
    let deny_all = "egress_9bbadd4f66311a0c";
    assert_eq!(
        other.update_from(&new).unwrap(),
        format!(
            "table inet flock_policy {{\n\tchain {deny_all} {{\n\t\tdrop\n\t}}\n}}\n\
             add element inet flock_policy egress_pods {{ \"flock0000000a\" : jump {deny_all} }}\n"
        )
    );
    assert_eq!(
        new.update_from(&other).unwrap(),
        format!(
            "delete element inet flock_policy egress_pods {{ \"flock0000000a\" }}\n\
             delete chain inet flock_policy {deny_all}\n"
        )
    );
    // a policy whose peer needs a set the table lacks: a new table
    let r = Policy {
        name: "r".into(),
        ..policy(vec![rule(
            vec![Peer::pods(LabelSelector::labels([("app", "other")]))],
            vec![],
        )])
    };
    assert_eq!(build(&[p, r], &[], &pods).unwrap().update_from(&new), None);
    assert_eq!(Ruleset::default().update_from(&new), None);
}

#[test]
fn a_rule_whose_named_ports_resolve_nowhere_allows_nothing() {
    let p = policy(vec![rule(
        vec![],
        vec![PortSpec::name(Protocol::Tcp, "http")],
    )]);
    let r = build(&[p], &[], &two_pods()).unwrap();
    assert_eq!(r.ingress["flock0000000a"], Chain::policy(vec![]));
    // and a port list resolving to something keeps only that
    let mut pods = two_pods();
    pods[0].ports.push(NamedPort {
        name: "http".into(),
        protocol: Protocol::Udp,
        port: 8080,
    });
    let p = policy(vec![rule(
        vec![],
        vec![
            PortSpec::name(Protocol::Tcp, "http"),
            PortSpec::name(Protocol::Udp, "http"),
        ],
    )]);
    let r = build(&[p], &[], &pods).unwrap();
    assert_eq!(
        r.ingress["flock0000000a"],
        Chain::policy(vec![Allow {
            family: None,
            peer: None,
            ports: Ports::Listed {
                protocol: Protocol::Udp,
                ranges: vec![(8080, 8080)]
            }
        }])
    );
}

#[test]
fn node_traffic_and_ndp_always_pass() {
    let r = build(&[policy(vec![])], &[], &two_pods()).unwrap();
    let web: std::net::IpAddr = "2001:db8::10".parse().unwrap();
    let pkt = |from: Hop, transport| Packet {
        src: "2001:db8::20".parse().unwrap(),
        dst: web,
        transport,
        from,
        to: Hop::Link("flock0000000a".into()),
    };
    let uplink = || Hop::Link("eth0".into());
    assert_eq!(
        r.verdict(&pkt(Hop::Node, Transport::Tcp(80))),
        Verdict::Accept
    );
    assert_eq!(
        r.verdict(&pkt(uplink(), Transport::Tcp(80))),
        Verdict::Drop {
            direction: Direction::Ingress,
            host_if: "flock0000000a".into()
        }
    );
    assert_eq!(
        r.verdict(&pkt(uplink(), Transport::Icmpv6 { kind: 135, code: 0 })),
        Verdict::Accept
    );
    assert_eq!(
        r.verdict(&pkt(uplink(), Transport::Icmpv6 { kind: 2, code: 0 })),
        Verdict::Accept
    );
    assert_ne!(
        r.verdict(&pkt(uplink(), Transport::Icmpv6 { kind: 128, code: 0 })),
        Verdict::Accept
    );
}

#[test]
fn hand_built_rulesets_render_what_verdict_evaluates() {
    use std::collections::{BTreeMap, BTreeSet};
    let set = AddrSet {
        family: Family::V4,
        about: "x".into(),
        elements: Elements::Addrs(BTreeSet::from(["10.0.0.1".parse().unwrap()])),
    };
    let allow = |family, peer: &str| Allow {
        family,
        peer: Some(peer.into()),
        ports: Ports::Any,
    };
    let r = Ruleset {
        sets: BTreeMap::from([("s_v4".to_owned(), set)]),
        ingress: BTreeMap::from([(
            "flock0000000a".to_owned(),
            Chain::policy(vec![
                // no family: the set's own
                allow(None, "s_v4"),
                // a family the set does not have: matches nothing, so no rule
                allow(Some(Family::V6), "s_v4"),
                // a set the model lacks is still named: nft refuses rather than allowing more
                allow(None, "missing"),
            ]),
        )]),
        egress: BTreeMap::new(),
    };
    let script = r.render();
    let chain: Vec<&str> = script
        .lines()
        .skip_while(|l| !l.contains("chain ingress_") || l.contains("ingress_pods"))
        .skip(1)
        .take(3)
        .map(str::trim)
        .collect();
    assert_eq!(
        chain,
        ["ip saddr @s_v4 accept", "ip6 saddr @missing accept", "drop"]
    );
}

fn cluster(ingress: Vec<ClusterRule>, egress: Vec<ClusterRule>) -> ClusterPolicy {
    ClusterPolicy {
        name: "guard".into(),
        tier: Tier::Admin,
        priority: 10,
        subject: ClusterPeer::Namespaces(LabelSelector::all()),
        ingress,
        egress,
    }
}

fn crule(peers: Vec<ClusterPeer>, ports: Vec<ClusterPort>) -> ClusterRule {
    ClusterRule {
        name: String::new(),
        action: Action::Deny,
        peers,
        ports,
    }
}

fn cerr(p: &ClusterPolicy) -> String {
    p.validate().unwrap_err().to_string()
}

#[test]
fn cluster_policy_errors_name_the_field_and_the_value() {
    let all = || ClusterPeer::Namespaces(LabelSelector::all());
    let mut p = cluster(vec![], vec![]);
    p.priority = 1001;
    assert_eq!(
        cerr(&p),
        "clusternetworkpolicy guard: spec.priority \"1001\": must be 0 to 1000"
    );
    assert_eq!(
        cerr(&cluster(
            vec![],
            vec![crule(
                vec![all(), ClusterPeer::Networks(vec!["10.0.0.1/8".into()])],
                vec![]
            )]
        )),
        "clusternetworkpolicy guard: spec.egress[0].to[1].networks[0] \"10.0.0.1/8\": host bits are set (the API wants the network's own address)"
    );
    assert_eq!(
        cerr(&cluster(
            vec![],
            vec![crule(
                vec![ClusterPeer::Networks(vec!["10.0.0.0/33".into()])],
                vec![]
            )]
        )),
        "clusternetworkpolicy guard: spec.egress[0].to[0].networks[0] \"10.0.0.0/33\" is not a CIDR (like 10.0.0.0/8 or 2001:db8::/32)"
    );
    assert_eq!(
        cerr(&cluster(
            vec![crule(
                vec![ClusterPeer::Networks(vec!["::/0".into()])],
                vec![]
            )],
            vec![]
        )),
        "clusternetworkpolicy guard: spec.ingress[0].from[0] \"networks\": an ingress peer is namespaces or pods"
    );
    assert_eq!(
        cerr(&cluster(vec![crule(vec![], vec![])], vec![])),
        "clusternetworkpolicy guard: spec.ingress[0].from \"[]\": needs at least one peer"
    );
    assert_eq!(
        cerr(&cluster(
            vec![crule(
                vec![all()],
                vec![ClusterPort::Range(Protocol::Tcp, 80, 80)]
            )],
            vec![]
        )),
        "clusternetworkpolicy guard: spec.ingress[0].protocols[0] \"80-80\": a range's start must be at least 1 and below its end"
    );
    assert_eq!(
        cerr(&cluster(
            vec![crule(vec![all()], vec![ClusterPort::Named("Web".into())])],
            vec![]
        )),
        "clusternetworkpolicy guard: spec.ingress[0].protocols[0].destinationNamedPort \"Web\" is not a port name: may hold only lower-case letters, digits and '-'"
    );
    let mut p = cluster(vec![], vec![]);
    p.subject = ClusterPeer::Networks(vec!["::/0".into()]);
    assert_eq!(
        cerr(&p),
        "clusternetworkpolicy guard: spec.subject \"networks\": a subject is namespaces or pods"
    );
}

/// A cluster policy selecting a pod does not isolate it: rules only, and a direction
/// without rules is untouched.
#[test]
fn a_cluster_policy_does_not_isolate_what_it_selects() {
    let mut p = cluster(
        vec![ClusterRule {
            action: Action::Accept,
            ..crule(vec![ClusterPeer::Namespaces(LabelSelector::all())], vec![])
        }],
        vec![],
    );
    let pods = two_pods();
    let r = Model::with_cluster_policies(&[p.clone()], &[], &[], &pods)
        .unwrap()
        .into_ruleset();
    assert!(r.egress.is_empty(), "no egress rule: egress not judged");
    let chain = &r.ingress["flock0000000a"];
    assert_eq!((chain.admin.len(), chain.policy.clone()), (2, None));
    // a rule that cannot match anything (a named port no pod has) leaves nothing to judge
    p.ingress[0].ports = vec![ClusterPort::Named("nothing".into())];
    let r = Model::with_cluster_policies(&[p], &[], &[], &pods)
        .unwrap()
        .into_ruleset();
    assert!(r.is_empty(), "{r:?}");
}
