//! Kernel tests: rendered rulesets applied with real `nft -f` in a stand-in node namespace
//! whose pods are built by `flock-netns` exactly as the agent builds them, checked with real
//! traffic over both families. Every `nft` runs inside a namespace this test made.
#![cfg(feature = "root-tests")]

use std::net::{IpAddr, SocketAddr, TcpListener, UdpSocket};
use std::time::Duration;

use flock_netns::{NodeNs, PodSpec, host_ifname, setup};
use flock_policy::{
    Action, ClusterPeer, ClusterPolicy, ClusterPort, ClusterRule, LabelSelector, Model, NamedPort,
    Namespace, Operator, Peer, Pod, Policy, PolicyTypes, PortSpec, Protocol, REMOVE_SCRIPT,
    Requirement, Rule, Tier, build,
};
use flock_testkit::Netns;

/// Sends one datagram from `from` to `to:port` and reports whether `receiver` got it.
fn udp_passes(from: &Netns, receiver: &UdpSocket, to: IpAddr, port: u16) -> bool {
    from.run(|| {
        let bind = if to.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" };
        let s = UdpSocket::bind(bind).expect("bind udp");
        s.send_to(b"q", SocketAddr::new(to, port))
            .expect("send udp");
    });
    let mut buf = [0u8; 8];
    receiver.recv_from(&mut buf).is_ok()
}

fn apply(node: &Netns, script: &str) {
    assert!(
        std::process::Command::new("nft")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success()),
        "nft is not installed: apt-get install -y nftables"
    );
    let path = std::env::temp_dir().join(format!("{}.nft", node.name()));
    std::fs::write(&path, script).expect("write script");
    let out = node.exec(["nft", "-f", path.to_str().expect("utf-8 path")]);
    let _ = std::fs::remove_file(&path);
    assert!(
        out.status.success(),
        "nft -f failed: {}\n{script}",
        String::from_utf8_lossy(&out.stderr)
    );
}

struct TestPod {
    ns: Netns,
    v6: IpAddr,
    v4: IpAddr,
    pod: Pod,
}

async fn make_pod(node: &NodeNs, id: &str, last: u8, labels: &[(&str, &str)]) -> TestPod {
    let ns = Netns::new("pod");
    let v6: IpAddr = format!("2001:db8:1::{last}").parse().unwrap();
    let v4: IpAddr = format!("10.244.1.{last}").parse().unwrap();
    let host_if = host_ifname(id, "eth0", 0);
    setup(
        node,
        &PodSpec {
            container_id: id.to_owned(),
            host_if: host_if.clone(),
            netns: ns.path(),
            if_name: "eth0".to_owned(),
            mtu: 1500,
            addresses: vec![
                format!("{v6}/128").parse().unwrap(),
                format!("{v4}/32").parse().unwrap(),
            ],
            anycast: vec![],
            default_route: true,
            routes: vec![],
        },
    )
    .await
    .expect("setup pod");
    TestPod {
        ns,
        v6,
        v4,
        pod: Pod {
            namespace: "shop".into(),
            name: id.into(),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect::<flock_policy::Labels>()
                .into(),
            addresses: vec![v6, v4],
            host_if: Some(host_if),
            ports: vec![],
        },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_flows_pass_and_denied_ones_do_not_over_both_families() {
    let node_ns = Netns::new("node");
    let node = NodeNs::at(node_ns.path());
    // the node's own addresses (a real node has them on its uplink; `lo` serves here)
    for addr in [NODE_V6, NODE_V4] {
        node_ns.ok(["ip", "addr", "add", addr, "dev", "lo"]);
    }
    let a = make_pod(&node, "pol-a", 10, &[("role", "client")]).await;
    let mut b = make_pod(&node, "pol-b", 11, &[("app", "server")]).await;
    b.pod.ports.push(NamedPort {
        name: "http".into(),
        protocol: Protocol::Tcp,
        port: 8080,
    });
    let c = make_pod(&node, "pol-c", 12, &[("role", "other")]).await;

    // listeners: b on 8080 (allowed by name) and 9090 (not allowed); a on UDP and TCP 53
    let _b8080 = b.ns.run(|| TcpListener::bind("[::]:8080").unwrap());
    let _b9090 = b.ns.run(|| TcpListener::bind("[::]:9090").unwrap());
    let _a53 = a.ns.run(|| TcpListener::bind("[::]:53").unwrap());
    let a_udp = a.ns.run(|| UdpSocket::bind("[::]:53").unwrap());
    a_udp
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();

    // before any policy, everything flows
    assert!(c.ns.tcp_connects(b.v6, 9090) && c.ns.tcp_connects(b.v4, 9090));

    let namespaces = [Namespace {
        name: "shop".into(),
        ..Default::default()
    }];
    let server = Policy {
        namespace: "shop".into(),
        name: "server".into(),
        pod_selector: LabelSelector::labels([("app", "server")]),
        // egress with no rules: b may start nothing; replies still pass
        policy_types: Some(PolicyTypes {
            ingress: true,
            egress: true,
        }),
        ingress: vec![Rule {
            peers: vec![Peer::pods(LabelSelector::labels([("role", "client")]))],
            ports: vec![PortSpec::name(Protocol::Tcp, "http")],
        }],
        egress: vec![],
    };
    let other = Policy {
        namespace: "shop".into(),
        name: "other-only-dns".into(),
        pod_selector: LabelSelector::labels([("role", "other")]),
        policy_types: Some(PolicyTypes {
            ingress: false,
            egress: true,
        }),
        ingress: vec![],
        egress: vec![Rule {
            peers: vec![Peer::pods(LabelSelector::labels([("role", "client")]))],
            ports: vec![PortSpec::number(Protocol::Udp, 53)],
        }],
    };
    let policies = [server, other];
    let pods = [a.pod.clone(), b.pod.clone(), c.pod.clone()];
    let ruleset = build(&policies, &namespaces, &pods).unwrap();
    let script = ruleset.render();
    apply(&node_ns, &script);
    // applying the same script again is a no-op replacement
    apply(&node_ns, &script);

    for (fam, av, bv) in [("IPv6", a.v6, b.v6), ("IPv4", a.v4, b.v4)] {
        assert!(
            a.ns.tcp_connects(bv, 8080),
            "{fam}: client → server:http (named port) passes, and its replies despite b's deny-all egress"
        );
        assert!(
            !a.ns.tcp_connects(bv, 9090),
            "{fam}: client → server:9090 is not in the rule"
        );
        assert!(
            !a.ns.pings(&bv.to_string()),
            "{fam}: a TCP-only rule opens no ICMP"
        );
        assert!(
            !c.ns.tcp_connects(bv, 8080),
            "{fam}: other → server:http is not a client"
        );
        assert!(
            !b.ns.pings(&av.to_string()),
            "{fam}: server starts nothing (egress deny-all)"
        );
        assert!(
            node_ns.pings(&bv.to_string()),
            "{fam}: the node reaches an isolated pod"
        );
        assert!(
            b.ns.pings(node_addr(bv)),
            "{fam}: an egress-isolated pod reaches its node"
        );
        assert!(
            udp_passes(&c.ns, &a_udp, av, 53),
            "{fam}: other → client UDP 53 passes"
        );
        assert!(
            !c.ns.tcp_connects(av, 53),
            "{fam}: other → client TCP 53: a UDP rule opens no TCP"
        );
        assert!(
            !c.ns.pings(&av.to_string()),
            "{fam}: other's egress has no ICMP"
        );
        assert!(
            a.ns.pings(&c.v6.to_string()) && a.ns.pings(&c.v4.to_string()),
            "{fam}: a → c passes and c's echo replies pass its egress (conntrack)"
        );
    }

    // a leaves the selector: only set elements change, applied as one small transaction
    let mut a_moved = a.pod.clone();
    std::sync::Arc::make_mut(&mut a_moved.labels).insert("role".into(), "former".into());
    let moved = build(
        &policies,
        &namespaces,
        &[a_moved.clone(), b.pod.clone(), c.pod.clone()],
    )
    .unwrap();
    let update = moved.update_from(&ruleset).expect("only elements changed");
    assert!(
        update.starts_with("delete element inet flock_policy pods"),
        "{update}"
    );
    apply(&node_ns, &update);
    assert!(
        !a.ns.tcp_connects(b.v6, 8080) && !a.ns.tcp_connects(b.v4, 8080),
        "a is no client any more"
    );

    // the server's policy changes its peer: a set comes, one goes, the chain is replaced, in
    // one transaction on the table in place
    let moved_pods = [a_moved, b.pod.clone(), c.pod.clone()];
    let mut model = Model::new(&policies, &namespaces, &moved_pods).unwrap();
    let mut server = policies[0].clone();
    server.ingress[0].peers = vec![Peer::pods(LabelSelector::labels([("role", "former")]))];
    let mut other = policies[1].clone();
    other.egress[0].peers = server.ingress[0].peers.clone();
    let changed = [server, other];
    let before = model.ruleset().clone();
    model.update_policies(&[], &changed, &namespaces).unwrap();
    let delta = model.take_delta();
    assert_eq!(
        delta.sets.iter().map(|s| s.came).collect::<Vec<_>>(),
        [false, false, true, true],
        "role=client's sets go, role=former's come: {delta:?}"
    );
    let update = model.ruleset().update(&delta);
    assert!(
        !update.elements_only() && !update.gone_sets.is_empty(),
        "{update:?}"
    );
    apply(&node_ns, &before.render());
    apply(&node_ns, &update.script());
    assert!(
        a.ns.tcp_connects(b.v6, 8080) && a.ns.tcp_connects(b.v4, 8080),
        "a, role=former now, is the server's peer"
    );
    assert!(
        !c.ns.tcp_connects(b.v6, 8080),
        "other is not, and the old set's rule is gone"
    );
    assert!(
        udp_passes(&c.ns, &a_udp, a.v6, 53),
        "other's egress follows a to its new set"
    );
    let listing = node_ns.ok(["nft", "list", "table", "inet", "flock_policy"]);
    for gone in &update.gone_sets {
        assert!(!listing.contains(&format!("set {gone} ")), "{listing}");
    }

    // removing the last policy leaves no rule behind
    let empty = build(&[], &namespaces, &pods).unwrap();
    assert_eq!(empty.render(), REMOVE_SCRIPT);
    apply(&node_ns, &empty.render());
    let listing = node_ns.ok(["nft", "list", "ruleset"]);
    assert!(!listing.contains("flock_policy"), "{listing}");
    // and removing it twice is fine
    apply(&node_ns, REMOVE_SCRIPT);
    for bv in [b.v6, b.v4] {
        assert!(c.ns.tcp_connects(bv, 9090), "everything flows again");
    }
    assert!(b.ns.pings(&a.v6.to_string()) && b.ns.pings(&a.v4.to_string()));
}

const NODE_V6: &str = "2001:db8:ff::1/128";
const NODE_V4: &str = "10.255.0.1/32";

/// The node's own address of `of`'s family.
fn node_addr(of: IpAddr) -> &'static str {
    if of.is_ipv6() {
        "2001:db8:ff::1"
    } else {
        "10.255.0.1"
    }
}

/// kube-proxy's stand-in: a table of its own that DNATs a Service address to b:8080 in
/// prerouting, as kube-proxy's nftables mode does.
const KUBE_PROXY_STANDIN: &str = "table inet kube_proxy_standin {
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		ip daddr 10.96.0.10 tcp dport 80 dnat ip to 10.244.1.21:8080
		ip6 daddr 2001:db8:96::10 tcp dport 80 dnat ip6 to [2001:db8:1::21]:8080
	}
}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_beside_the_table_is_judged_on_its_backend() {
    let node_ns = Netns::new("node");
    let node = NodeNs::at(node_ns.path());
    let a = make_pod(&node, "svc-a", 20, &[("role", "client")]).await;
    let mut b = make_pod(&node, "svc-b", 21, &[("app", "server")]).await;
    b.pod.ports.push(NamedPort {
        name: "http".into(),
        protocol: Protocol::Tcp,
        port: 8080,
    });
    let c = make_pod(&node, "svc-c", 22, &[("role", "other")]).await;
    let _b8080 = b.ns.run(|| TcpListener::bind("[::]:8080").unwrap());
    apply(&node_ns, KUBE_PROXY_STANDIN);
    let vips: [IpAddr; 2] = [
        "2001:db8:96::10".parse().unwrap(),
        "10.96.0.10".parse().unwrap(),
    ];
    for vip in vips {
        assert!(
            c.ns.tcp_connects(vip, 80),
            "{vip}: the Service works before any policy"
        );
    }

    let policy = Policy {
        namespace: "shop".into(),
        name: "server".into(),
        pod_selector: LabelSelector::labels([("app", "server")]),
        ingress: vec![Rule {
            peers: vec![Peer::pods(LabelSelector::labels([("role", "client")]))],
            ports: vec![PortSpec::name(Protocol::Tcp, "http")],
        }],
        ..Default::default()
    };
    let pods = [a.pod.clone(), b.pod.clone(), c.pod.clone()];
    apply(&node_ns, &build(&[policy], &[], &pods).unwrap().render());
    for vip in vips {
        assert!(
            a.ns.tcp_connects(vip, 80),
            "{vip}: a client reaches the Service (its backend's port 8080 is http)"
        );
        assert!(!c.ns.tcp_connects(vip, 80), "{vip}: a non-client does not");
    }

    apply(&node_ns, REMOVE_SCRIPT);
    let listing = node_ns.ok(["nft", "list", "ruleset"]);
    assert!(
        !listing.contains("flock_policy") && listing.contains("kube_proxy_standin"),
        "only flock's table goes: {listing}"
    );
    for vip in vips {
        assert!(
            c.ns.tcp_connects(vip, 80),
            "{vip}: the Service works for all again"
        );
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

fn pods_with(key: &str, value: &str) -> ClusterPeer {
    ClusterPeer::Pods {
        namespaces: LabelSelector::all(),
        pods: LabelSelector::labels([(key, value)]),
    }
}

/// The tiers on a real kernel: an Admin Deny beats a NetworkPolicy's allow, an Admin Pass
/// leaves the decision to it, and the Baseline tier judges a pod no NetworkPolicy isolates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_tiers_decide_in_order_around_networkpolicy() {
    let node_ns = Netns::new("node");
    let node = NodeNs::at(node_ns.path());
    let a = make_pod(&node, "cnp-a", 30, &[("role", "client")]).await;
    let b = make_pod(&node, "cnp-b", 31, &[("app", "server")]).await;
    let c = make_pod(&node, "cnp-c", 32, &[("role", "other")]).await;
    let _listeners: Vec<TcpListener> = [7070, 8080, 9090]
        .into_iter()
        .map(|port| b.ns.run(move || TcpListener::bind(("::", port)).unwrap()))
        .collect();

    // the server's own policy admits clients and others on every port
    let np = Policy {
        namespace: "shop".into(),
        name: "server".into(),
        pod_selector: LabelSelector::labels([("app", "server")]),
        ingress: vec![Rule {
            peers: vec![Peer::pods(LabelSelector {
                match_expressions: vec![Requirement {
                    key: "role".into(),
                    operator: Operator::In,
                    values: vec!["client".into(), "other".into()],
                }],
                ..Default::default()
            })],
            ports: vec![],
        }],
        ..Default::default()
    };
    let admin = ClusterPolicy {
        name: "protect-server".into(),
        tier: Tier::Admin,
        priority: 1,
        subject: pods_with("app", "server"),
        ingress: vec![
            cluster_rule(
                Action::Deny,
                vec![pods_with("role", "other")],
                vec![ClusterPort::Number(Protocol::Tcp, 9090)],
            ),
            cluster_rule(
                Action::Pass,
                vec![ClusterPeer::Namespaces(LabelSelector::all())],
                vec![ClusterPort::Range(Protocol::Tcp, 8000, 9999)],
            ),
            cluster_rule(
                Action::Accept,
                vec![ClusterPeer::Namespaces(LabelSelector::all())],
                vec![],
            ),
        ],
        egress: vec![],
    };
    let baseline = ClusterPolicy {
        name: "clients-no-7070".into(),
        tier: Tier::Baseline,
        priority: 1,
        subject: pods_with("role", "client"),
        ingress: vec![],
        egress: vec![cluster_rule(
            Action::Deny,
            vec![ClusterPeer::Networks(vec![
                format!("{}/128", b.v6),
                format!("{}/32", b.v4),
            ])],
            vec![ClusterPort::Number(Protocol::Tcp, 7070)],
        )],
    };
    let pods = [a.pod.clone(), b.pod.clone(), c.pod.clone()];
    let script = Model::with_cluster_policies(&[admin, baseline], &[np], &[], &pods)
        .unwrap()
        .into_ruleset()
        .render();
    apply(&node_ns, &script);
    for to in [b.v6, b.v4] {
        assert!(
            !c.ns.tcp_connects(to, 9090),
            "{to}: Admin Deny beats the NetworkPolicy"
        );
        assert!(
            c.ns.tcp_connects(to, 8080),
            "{to}: Admin Pass, the NetworkPolicy allows"
        );
        assert!(
            a.ns.tcp_connects(to, 9090),
            "{to}: Admin Pass for a client too"
        );
        assert!(
            !a.ns.tcp_connects(to, 7070),
            "{to}: Admin Accept at the server, but the client's Baseline denies its egress"
        );
        assert!(
            c.ns.tcp_connects(to, 7070),
            "{to}: Admin Accept, and c has no Baseline"
        );
    }
    apply(&node_ns, REMOVE_SCRIPT);
}
