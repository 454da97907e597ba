//! The Service guard on a real kernel (root): a stand-in node namespace whose default route
//! leads to a router namespace, a client and a backend pod set up by `flock-netns` as the agent sets them up, and a
//! kube-proxy stand-in that translates one Service address. Without the guard a connection to
//! an address of the announced range that nothing translated leaves the node for the router
//! (which stands in for the other node that would translate it); with it, the node ends it,
//! while the translated Service and the node's own connections work as before.
#![cfg(feature = "root-tests")]

use std::net::{IpAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use flock_agent::metrics::{Component, Health};
use flock_agent::policy::nft::NftCommand;
use flock_agent::routing::services::guard::{ServiceGuard, TABLE};
use flock_netns::{NodeNs, NsTarget, PodSpec, host_ifname, setup};
use flock_testkit::Netns;
use flock_testkit::wait::eventually;

/// kube-proxy's stand-in: it has programmed one Service per family, to the backend pod's
/// port 8080, and one without endpoints, which it rejects untranslated in forward (as both
/// its modes do, at priority filter).
const KUBE_PROXY_STANDIN: &str = "table inet kube_proxy_standin {
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		ip6 daddr 2001:db8:c6::10 tcp dport 80 dnat ip6 to [2001:db8:56::2]:8080
		ip daddr 10.97.0.10 tcp dport 80 dnat ip to 10.56.0.2:8080
	}
	chain forward {
		type filter hook forward priority filter; policy accept;
		ip6 daddr 2001:db8:c6::20 tcp dport 80 counter reject with icmpv6 type port-unreachable
		ip daddr 10.97.0.20 tcp dport 80 counter reject with icmp type port-unreachable
	}
}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_announced_range_that_nothing_translated_ends_at_the_node() {
    let node_ns = Netns::new("node");
    let router = Netns::new("rtr");
    let pod_ns = Netns::new("pod");
    let backend_ns = Netns::new("pod");
    let node = NodeNs::at(node_ns.path());
    for (id, ns, last) in [("client", &pod_ns, 1), ("backend", &backend_ns, 2)] {
        setup(
            &node,
            &PodSpec {
                container_id: id.into(),
                host_if: host_ifname(id, "eth0", 0),
                netns: ns.path(),
                if_name: "eth0".into(),
                mtu: 1500,
                addresses: vec![
                    format!("2001:db8:56::{last}/128").parse().unwrap(),
                    format!("10.56.0.{last}/32").parse().unwrap(),
                ],
                anycast: vec![],
                default_route: true,
                routes: vec![],
            },
        )
        .await
        .expect("set up the pod");
    }
    // The uplink: the node's default routes lead to the router, which routes the pod back.
    node_ns.ok([
        "ip",
        "link",
        "add",
        "up0",
        "type",
        "veth",
        "peer",
        "name",
        "down0",
        "netns",
        router.name(),
    ]);
    for (ns, link, v6, v4) in [
        (&node_ns, "up0", "2001:db8:e5::1/64", "10.255.5.1/30"),
        (&router, "down0", "2001:db8:e5::2/64", "10.255.5.2/30"),
    ] {
        ns.ok(["ip", "addr", "add", v6, "dev", link, "nodad"]);
        ns.ok(["ip", "addr", "add", v4, "dev", link]);
        ns.ok(["ip", "link", "set", link, "up"]);
    }
    node_ns.ok([
        "ip",
        "-6",
        "route",
        "add",
        "default",
        "via",
        "2001:db8:e5::2",
    ]);
    node_ns.ok(["ip", "route", "add", "default", "via", "10.255.5.2"]);
    router.ok([
        "ip",
        "-6",
        "route",
        "add",
        "2001:db8:56::/64",
        "via",
        "2001:db8:e5::1",
    ]);
    router.ok(["ip", "route", "add", "10.56.0.0/24", "via", "10.255.5.1"]);
    // The router stands in for the other node that would translate an address this node did
    // not: it holds one address of each range and listens on it.
    let (far6, far4): (IpAddr, IpAddr) = (
        "2001:db8:c6::fff0".parse().unwrap(),
        "10.97.255.240".parse().unwrap(),
    );
    router.ok(["ip", "addr", "add", "2001:db8:c6::fff0/128", "dev", "lo"]);
    router.ok(["ip", "addr", "add", "10.97.255.240/32", "dev", "lo"]);
    let _far = router.run(|| TcpListener::bind("[::]:80").unwrap());
    let _backend = backend_ns.run(|| TcpListener::bind("[::]:8080").unwrap());
    let apply = |script: &str| {
        let path = std::env::temp_dir().join(format!("{}.nft", node_ns.name()));
        std::fs::write(&path, script).unwrap();
        node_ns.ok(["nft", "-f", path.to_str().unwrap()]);
        let _ = std::fs::remove_file(&path);
    };
    apply(KUBE_PROXY_STANDIN);
    let (svc6, svc4): (IpAddr, IpAddr) = (
        "2001:db8:c6::10".parse().unwrap(),
        "10.97.0.10".parse().unwrap(),
    );
    // Links just up finish duplicate address detection first.
    for far in [far6, far4] {
        eventually(
            &format!("{far}: without the guard, the untranslated address leaves the node"),
            || pod_ns.tcp_connects(far, 80),
        )
        .await;
    }

    let health = Arc::new(Health::default());
    let nft = NftCommand::new("nft", NsTarget::Path(node_ns.path()));
    let guard = ServiceGuard::spawn(Arc::new(nft), health.clone(), Duration::from_secs(1));
    guard.set(vec![
        "2001:db8:c6::/108".parse().unwrap(),
        "10.97.0.0/16".parse().unwrap(),
    ]);
    eventually("the guard's table is in place", || {
        node_ns
            .exec(["nft", "list", "table", "inet", TABLE])
            .status
            .success()
    })
    .await;
    assert_eq!(health.problem(Component::Services), None);
    for (far, svc) in [(far6, svc6), (far4, svc4)] {
        assert!(
            !pod_ns.tcp_connects(far, 80),
            "{far}: with the guard, the node ends the untranslated address"
        );
        assert!(
            pod_ns.tcp_connects(svc, 80),
            "{svc}: the Service kube-proxy translated still works"
        );
        assert!(
            node_ns.tcp_connects(far, 80),
            "{far}: the node's own connections are not the guard's"
        );
    }
    // kube-proxy's verdict on a Service without endpoints comes first: its reject sees the
    // connection, the guard does not (the guard's counters stay where the checks above left
    // them: one SYN per family)
    for empty in ["2001:db8:c6::20", "10.97.0.20"] {
        let _ = pod_ns.tcp_connects(empty.parse().unwrap(), 80);
    }
    let standin = node_ns.ok([
        "nft",
        "list",
        "chain",
        "inet",
        "kube_proxy_standin",
        "forward",
    ]);
    assert_eq!(
        standin.matches("counter packets 1 ").count(),
        2,
        "kube-proxy's stand-in rejected each family's SYN: {standin}"
    );
    let listing = node_ns.ok(["nft", "list", "table", "inet", TABLE]);
    assert_eq!(
        listing.matches("counter packets 1 ").count(),
        2,
        "each family's dropped SYN is counted, and only those: {listing}"
    );

    // No range announced any more: the table goes, and the address leaves the node again.
    guard.set(vec![]);
    eventually("the guard's table is gone", || {
        !node_ns
            .exec(["nft", "list", "table", "inet", TABLE])
            .status
            .success()
    })
    .await;
    eventually("the untranslated address leaves the node again", || {
        pod_ns.tcp_connects(far6, 80)
    })
    .await;

    // The uninstall path removes it, and leaves kube-proxy's table.
    guard.set(vec!["2001:db8:c6::/108".parse().unwrap()]);
    eventually("the guard's table is back", || {
        node_ns
            .exec(["nft", "list", "table", "inet", TABLE])
            .status
            .success()
    })
    .await;
    for _ in 0..2 {
        node_ns.ok([env!("CARGO_BIN_EXE_flock-agent"), "cleanup"]);
    }
    let listing = node_ns.ok(["nft", "list", "ruleset"]);
    assert!(
        !listing.contains("flock") && listing.contains("kube_proxy_standin"),
        "cleanup removes flock's tables only: {listing}"
    );
}
