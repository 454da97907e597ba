//! Golden rulesets: insta snapshots of rendered scripts for the cases the issue lists; with
//! feature `root-tests`, each is also fed to real `nft -c -f` (a syntax and kernel check that
//! applies nothing) inside a namespace made for it.

use flock_policy::{
    Action, ClusterPeer, ClusterPolicy, ClusterPort, ClusterRule, LabelSelector, LogMode, Model,
    NamedPort, Namespace, Operator, Peer, Pod, Policy, PolicyTypes, PortSpec, Protocol,
    REMOVE_SCRIPT, Requirement, Rule, Tier, build,
};

fn pod(
    ns: &str,
    name: &str,
    labels: &[(&str, &str)],
    addrs: &[&str],
    host_if: Option<&str>,
) -> Pod {
    Pod {
        namespace: ns.into(),
        name: name.into(),
        labels: labels
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect::<flock_policy::Labels>()
            .into(),
        addresses: addrs.iter().map(|a| a.parse().unwrap()).collect(),
        host_if: host_if.map(str::to_owned),
        ports: Vec::new(),
    }
}

fn namespaces() -> Vec<Namespace> {
    vec![
        Namespace {
            name: "shop".into(),
            labels: [("team".into(), "shop".into())].into(),
            log: None,
        },
        Namespace {
            name: "monitoring".into(),
            labels: [("team".into(), "ops".into())].into(),
            log: None,
        },
    ]
}

/// Two local pods in `shop` (web, db), one remote pod in `shop` (client) and one remote
/// pod in `monitoring` (prometheus), dual-stack.
fn pods() -> Vec<Pod> {
    let mut web = pod(
        "shop",
        "web-0",
        &[("app", "web")],
        &["2001:db8:0:1::10", "10.244.1.10"],
        Some("flock0000000a"),
    );
    web.ports = vec![
        NamedPort {
            name: "http".into(),
            protocol: Protocol::Tcp,
            port: 8080,
        },
        NamedPort {
            name: "metrics".into(),
            protocol: Protocol::Tcp,
            port: 9090,
        },
    ];
    let mut db = pod(
        "shop",
        "db-0",
        &[("app", "db")],
        &["2001:db8:0:1::20", "10.244.1.20"],
        Some("flock0000000b"),
    );
    db.ports = vec![NamedPort {
        name: "pg".into(),
        protocol: Protocol::Tcp,
        port: 5432,
    }];
    vec![
        web,
        db,
        pod(
            "shop",
            "client",
            &[("role", "client")],
            &["2001:db8:0:2::30", "10.244.2.30"],
            None,
        ),
        pod(
            "monitoring",
            "prometheus",
            &[("app", "prometheus")],
            &["2001:db8:0:2::40"],
            None,
        ),
    ]
}

fn policy(name: &str, selector: LabelSelector) -> Policy {
    Policy {
        namespace: "shop".into(),
        name: name.into(),
        pod_selector: selector,
        ..Default::default()
    }
}

fn render(policies: &[Policy], pods: &[Pod]) -> String {
    let script = build(policies, &namespaces(), pods).unwrap().render();
    check_with_nft(&script);
    script
}

fn render_cluster(cluster: &[ClusterPolicy], policies: &[Policy], pods: &[Pod]) -> String {
    render_logged(cluster, policies, pods, None)
}

/// [`render_cluster`] with `shop` logging its pods' decisions as `log` says.
fn render_logged(
    cluster: &[ClusterPolicy],
    policies: &[Policy],
    pods: &[Pod],
    log: Option<LogMode>,
) -> String {
    let mut namespaces = namespaces();
    namespaces[0].log = log;
    let script = Model::with_cluster_policies(cluster, policies, &namespaces, pods)
        .unwrap()
        .into_ruleset()
        .render();
    check_with_nft(&script);
    script
}

fn cluster_policy(name: &str, tier: Tier, priority: u32, subject: ClusterPeer) -> ClusterPolicy {
    ClusterPolicy {
        name: name.into(),
        tier,
        priority,
        subject,
        ingress: vec![],
        egress: vec![],
    }
}

fn cluster_rule(action: Action, peers: Vec<ClusterPeer>, ports: Vec<ClusterPort>) -> ClusterRule {
    ClusterRule {
        name: String::new(),
        action,
        peers,
        ports,
    }
}

fn team(t: &str) -> ClusterPeer {
    ClusterPeer::Namespaces(LabelSelector::labels([("team", t)]))
}

#[cfg(feature = "root-tests")]
fn check_with_nft(script: &str) {
    assert!(
        std::process::Command::new("nft")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "nft is not installed: apt-get install -y nftables"
    );
    let ns = flock_testkit::Netns::new("nftc");
    let dir = std::env::temp_dir().join(format!("{}.nft", ns.name()));
    std::fs::write(&dir, script).unwrap();
    let out = ns.exec(["nft", "-c", "-f", dir.to_str().unwrap()]);
    let _ = std::fs::remove_file(&dir);
    assert!(
        out.status.success(),
        "nft -c refused the script: {}\n{script}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[cfg(not(feature = "root-tests"))]
fn check_with_nft(_: &str) {}

#[test]
fn default_deny_ingress() {
    let p = policy("default-deny", LabelSelector::all());
    insta::assert_snapshot!(render(&[p], &pods()));
}

#[test]
fn allow_from_namespace_selector() {
    let mut p = policy("from-ops", LabelSelector::labels([("app", "web")]));
    p.ingress = vec![Rule {
        peers: vec![
            Peer::namespaces(LabelSelector::labels([("team", "ops")])),
            Peer::Pods {
                namespace_selector: Some(LabelSelector {
                    match_expressions: vec![Requirement {
                        key: "team".into(),
                        operator: Operator::In,
                        values: vec!["shop".into(), "ops".into()],
                    }],
                    ..Default::default()
                }),
                pod_selector: Some(LabelSelector::labels([("role", "client")])),
            },
        ],
        ports: vec![],
    }];
    insta::assert_snapshot!(render(&[p], &pods()));
}

#[test]
fn named_port() {
    // ingress: resolved on each selected pod (web has http=8080, db has none: nothing);
    // egress: resolved per destination pod through an address . port set
    let mut p = policy("http-by-name", LabelSelector::all());
    p.policy_types = Some(PolicyTypes {
        ingress: true,
        egress: true,
    });
    p.ingress = vec![Rule {
        peers: vec![],
        ports: vec![PortSpec::name(Protocol::Tcp, "http")],
    }];
    p.egress = vec![Rule {
        peers: vec![Peer::pods(LabelSelector::labels([("app", "db")]))],
        ports: vec![PortSpec::name(Protocol::Tcp, "pg")],
    }];
    insta::assert_snapshot!(render(&[p], &pods()));
}

#[test]
fn end_port_range() {
    let mut p = policy("range", LabelSelector::labels([("app", "web")]));
    p.ingress = vec![Rule {
        peers: vec![Peer::pods(LabelSelector::labels([("role", "client")]))],
        ports: vec![
            PortSpec::range(Protocol::Tcp, 30000, 32767),
            PortSpec::number(Protocol::Tcp, 443),
            PortSpec::range(Protocol::Udp, 5000, 5010),
        ],
    }];
    insta::assert_snapshot!(render(&[p], &pods()));
}

#[test]
fn ip_block_with_except_both_families() {
    let mut p = policy("blocks", LabelSelector::labels([("app", "web")]));
    p.ingress = vec![Rule {
        peers: vec![
            Peer::ip_block("10.0.0.0/8", &["10.244.0.0/16", "10.1.2.3/32"]),
            Peer::ip_block("2001:db8::/32", &["2001:db8:0:2::/64"]),
            Peer::ip_block("0.0.0.0/0", &[]),
        ],
        ports: vec![PortSpec::number(Protocol::Tcp, 443)],
    }];
    p.egress = vec![Rule {
        peers: vec![Peer::ip_block("::/0", &["2001:db8::/32"])],
        ports: vec![],
    }];
    insta::assert_snapshot!(render(&[p], &pods()));
}

#[test]
fn egress_deny_all_but_dns() {
    let mut p = policy("only-dns", LabelSelector::all());
    p.policy_types = Some(PolicyTypes {
        ingress: false,
        egress: true,
    });
    p.egress = vec![Rule {
        peers: vec![Peer::Pods {
            namespace_selector: Some(LabelSelector::labels([(
                "kubernetes.io/metadata.name",
                "kube-system",
            )])),
            pod_selector: Some(LabelSelector::labels([("k8s-app", "kube-dns")])),
        }],
        ports: vec![
            PortSpec::number(Protocol::Udp, 53),
            PortSpec::number(Protocol::Tcp, 53),
        ],
    }];
    let mut pods = pods();
    pods.push(pod(
        "kube-system",
        "coredns",
        &[("k8s-app", "kube-dns")],
        &["2001:db8:0:3::53", "10.244.3.53"],
        None,
    ));
    insta::assert_snapshot!(render(&[p], &pods));
}

#[test]
fn sctp() {
    let mut p = policy("sctp", LabelSelector::labels([("app", "db")]));
    p.ingress = vec![Rule {
        peers: vec![Peer::pods(LabelSelector::all())],
        ports: vec![
            PortSpec::number(Protocol::Sctp, 38412),
            PortSpec {
                protocol: Protocol::Sctp,
                port: None,
                end_port: None,
            },
        ],
    }];
    let mut q = policy("sctp-only", LabelSelector::labels([("app", "web")]));
    q.ingress = vec![Rule {
        peers: vec![],
        ports: vec![PortSpec::number(Protocol::Sctp, 38412)],
    }];
    insta::assert_snapshot!(render(&[p, q], &pods()));
}

#[test]
fn pod_with_128_32_fixed_and_anycast() {
    let mut pods = pods();
    pods[1].addresses.extend(
        ["2001:db8:ff::5", "2001:db8:face::53", "10.96.100.53"]
            .iter()
            .map(|a| a.parse::<std::net::IpAddr>().unwrap()),
    );
    pods[2].addresses.push("2001:db8:face::53".parse().unwrap());
    let mut p = policy("web-to-db", LabelSelector::labels([("app", "web")]));
    p.policy_types = Some(PolicyTypes {
        ingress: false,
        egress: true,
    });
    p.egress = vec![Rule {
        peers: vec![Peer::pods(LabelSelector::labels([("app", "db")]))],
        ports: vec![],
    }];
    let mut q = policy("db-from-web", LabelSelector::labels([("app", "db")]));
    q.ingress = vec![Rule {
        peers: vec![Peer::pods(LabelSelector::labels([("app", "web")]))],
        ports: vec![],
    }];
    insta::assert_snapshot!(render(&[p, q], &pods));
}

#[test]
fn no_policies_removes_the_table() {
    let script = render(&[], &pods());
    assert_eq!(script, REMOVE_SCRIPT);
    // policies that isolate no pod of this node: no table either
    let p = policy(
        "elsewhere",
        LabelSelector::labels([("app", "nothing-here")]),
    );
    assert_eq!(render(&[p], &pods()), REMOVE_SCRIPT);
}

/// Admin tier before NetworkPolicy: ops may reach web's metrics whatever shop's own policy
/// says, and nobody else may reach 9090; the NetworkPolicy decides the rest.
#[test]
fn cluster_admin_tier_over_a_networkpolicy() {
    let mut admin = cluster_policy("metrics", Tier::Admin, 10, team("shop"));
    admin.ingress = vec![
        cluster_rule(
            Action::Accept,
            vec![team("ops")],
            vec![ClusterPort::Number(Protocol::Tcp, 9090)],
        ),
        cluster_rule(
            Action::Deny,
            vec![ClusterPeer::Namespaces(LabelSelector::all())],
            vec![ClusterPort::Number(Protocol::Tcp, 9090)],
        ),
    ];
    let mut np = policy("web-from-clients", LabelSelector::labels([("app", "web")]));
    np.ingress = vec![Rule {
        peers: vec![Peer::pods(LabelSelector::labels([("role", "client")]))],
        ports: vec![PortSpec::number(Protocol::Tcp, 8080)],
    }];
    insta::assert_snapshot!(render_cluster(&[admin], &[np], &pods()));
}

/// Pass hands the decision to the next tier: web's NetworkPolicy, or for db (no
/// NetworkPolicy) the Baseline tier, which denies egress but DNS and the pod range.
#[test]
fn cluster_pass_then_networkpolicy_or_baseline() {
    let mut admin = cluster_policy("pass-shop", Tier::Admin, 5, team("shop"));
    admin.egress = vec![
        cluster_rule(Action::Pass, vec![team("shop")], vec![]),
        cluster_rule(
            Action::Deny,
            vec![ClusterPeer::Networks(vec!["2001:db8:bad::/48".into()])],
            vec![],
        ),
    ];
    let mut baseline = cluster_policy(
        "default-deny",
        Tier::Baseline,
        100,
        ClusterPeer::Pods {
            namespaces: LabelSelector::all(),
            pods: LabelSelector::all(),
        },
    );
    baseline.egress = vec![
        cluster_rule(
            Action::Accept,
            vec![ClusterPeer::Networks(vec![
                "2001:db8::/48".into(),
                "10.244.0.0/16".into(),
            ])],
            vec![
                ClusterPort::Number(Protocol::Udp, 53),
                ClusterPort::Range(Protocol::Tcp, 8000, 8999),
            ],
        ),
        cluster_rule(
            Action::Deny,
            vec![ClusterPeer::Networks(vec![
                "::/0".into(),
                "0.0.0.0/0".into(),
            ])],
            vec![],
        ),
    ];
    let mut np = policy("web-egress", LabelSelector::labels([("app", "web")]));
    np.policy_types = Some(PolicyTypes {
        ingress: false,
        egress: true,
    });
    np.egress = vec![Rule {
        peers: vec![Peer::namespaces(LabelSelector::labels([("team", "ops")]))],
        ports: vec![],
    }];
    insta::assert_snapshot!(render_cluster(&[baseline, admin], &[np], &pods()));
}

/// A named port resolves on the destination pod, of whatever protocol it has there.
#[test]
fn cluster_named_port() {
    let mut admin = cluster_policy("named", Tier::Admin, 1, team("shop"));
    admin.ingress = vec![cluster_rule(
        Action::Accept,
        vec![team("ops")],
        vec![ClusterPort::Named("metrics".into())],
    )];
    admin.egress = vec![cluster_rule(
        Action::Deny,
        vec![team("shop")],
        vec![ClusterPort::Named("pg".into())],
    )];
    insta::assert_snapshot!(render_cluster(&[admin], &[], &pods()));
}

/// A namespace that logs what its pods' policies deny: the Admin tier's Deny and the
/// NetworkPolicy's final drop log to flock's group, the accepts do not.
#[test]
fn logging_denied_connections() {
    let mut admin = cluster_policy("metrics", Tier::Admin, 10, team("shop"));
    admin.ingress = vec![cluster_rule(
        Action::Deny,
        vec![ClusterPeer::Namespaces(LabelSelector::all())],
        vec![ClusterPort::Number(Protocol::Tcp, 9090)],
    )];
    let mut np = policy("web-from-clients", LabelSelector::labels([("app", "web")]));
    np.ingress = vec![Rule {
        peers: vec![Peer::pods(LabelSelector::labels([("role", "client")]))],
        ports: vec![PortSpec::number(Protocol::Tcp, 8080)],
    }];
    insta::assert_snapshot!(render_logged(&[admin], &[np], &pods(), Some(LogMode::Deny)));
}

/// A namespace that logs every decision: each verdict of a judged pod's chain logs, the
/// Pass target's too, and what no tier decides ends in a logged accept.
#[test]
fn logging_every_decision() {
    let mut admin = cluster_policy("pass-shop", Tier::Admin, 5, team("shop"));
    admin.egress = vec![cluster_rule(Action::Pass, vec![team("shop")], vec![])];
    let mut baseline = cluster_policy("dns-only", Tier::Baseline, 100, team("shop"));
    baseline.egress = vec![cluster_rule(
        Action::Deny,
        vec![ClusterPeer::Networks(vec!["2001:db8:bad::/48".into()])],
        vec![],
    )];
    insta::assert_snapshot!(render_logged(
        &[admin, baseline],
        &[],
        &pods(),
        Some(LogMode::All)
    ));
}
