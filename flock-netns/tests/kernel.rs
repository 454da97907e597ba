//! Kernel tests: real veths, addresses, routes and pings in namespaces made
//! by the test (a stand-in node namespace and pod namespaces); never the
//! machine's own namespace.
#![cfg(feature = "root-tests")]

use flock_netns::{
    AnycastMember, Mismatch, NodeNs, PodSpec, RouteSpec, Side, Toward, Uplink, check,
    ensure_blackholes, host_ifname, host_routes, list_host_ifaces, remove_blackhole,
    remove_host_iface, setup, sync_anycast, teardown, uplink,
};
use flock_testkit::Netns;
use ipnet::IpNet;
use std::net::IpAddr;

fn spec(pod: &Netns, id: &str, addrs: &[&str], anycast: &[&str]) -> PodSpec {
    PodSpec {
        container_id: id.to_owned(),
        host_if: host_ifname(id, "eth0", 0),
        netns: pod.path(),
        if_name: "eth0".to_owned(),
        mtu: 1500,
        addresses: addrs.iter().map(|a| a.parse().unwrap()).collect(),
        anycast: anycast.iter().map(|a| a.parse().unwrap()).collect(),
        default_route: true,
        routes: vec![],
    }
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

/// `ip` dumps of a namespace with volatile fields removed: address
/// lifetimes, carrier/operational state and the pod's kernel-made link-local
/// address (it appears and finishes DAD on its own time).
fn dump(ns: &Netns) -> String {
    let mut out = String::new();
    for args in [
        &["ip", "-d", "addr"][..],
        &["ip", "route"][..],
        &["ip", "-6", "route"][..],
    ] {
        out.push_str(
            &ns.ok(args)
                .lines()
                // the kernel's link-local address and its route appear when it gets round
                // to the link coming up, not when setup returns
                // (flock's own fe80::1/64 on the host veth stays in the dump)
                .filter(|l| {
                    let kernel_ll = l.contains("inet6 fe80::") && !l.contains("inet6 fe80::1/64");
                    !l.contains("valid_lft") && !kernel_ll && !l.starts_with("fe80::/64")
                })
                .map(|l| {
                    l.replace("NO-CARRIER,", "")
                        .replace("state DOWN", "state UP")
                        .replace("state LOWERLAYERDOWN", "state UP")
                })
                .collect::<Vec<_>>()
                .join("\n"),
        );
        out.push('\n');
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_reach_the_gateway_and_each_other_over_both_families() {
    let node_ns = Netns::new("node");
    let (pa, pb) = (Netns::new("pod"), Netns::new("pod"));
    let node = NodeNs::at(node_ns.path());
    let a = spec(&pa, "ctr-a", &["2001:db8:1::a/128", "10.244.1.10/32"], &[]);
    let b = spec(&pb, "ctr-b", &["2001:db8:1::b/128", "10.244.1.11/32"], &[]);
    let out = setup(&node, &a).await.unwrap();
    assert_eq!(out.host_if, host_ifname("ctr-a", "eth0", 0));
    assert_eq!(out.pod_if, "eth0");
    assert_eq!(out.sandbox, pa.path());
    assert_eq!(out.host_mac.len(), 17);
    assert_ne!(out.host_mac, out.pod_mac);
    setup(&node, &b).await.unwrap();

    assert!(pa.pings("fe80::1%eth0"), "pod a → host gateway over IPv6");
    assert!(pa.pings("169.254.1.1"), "pod a → host gateway over IPv4");
    assert!(pa.pings("2001:db8:1::b"), "pod a → pod b over IPv6");
    assert!(pa.pings("10.244.1.11"), "pod a → pod b over IPv4");
    assert!(pb.pings("2001:db8:1::a"), "pod b → pod a over IPv6");
    assert!(pb.pings("10.244.1.10"), "pod b → pod a over IPv4");

    // the pod side is exactly DESIGN §5
    let routes6 = pa.ok(["ip", "-6", "route", "show", "default"]);
    assert!(
        routes6.contains("default via fe80::1 dev eth0"),
        "{routes6}"
    );
    let routes4 = pa.ok(["ip", "route"]);
    assert!(
        routes4.contains("default via 169.254.1.1 dev eth0"),
        "{routes4}"
    );
    assert!(
        routes4.contains("169.254.1.1 dev eth0 proto static scope link"),
        "{routes4}"
    );
    let addrs = pa.ok(["ip", "-6", "addr", "show", "dev", "eth0"]);
    assert!(addrs.contains("2001:db8:1::a/128"), "{addrs}");
    let global = addrs.lines().find(|l| l.contains("2001:db8:1::a")).unwrap();
    assert!(
        global.contains("nodad") && !global.contains("tentative"),
        "{addrs}"
    );
    let host = node_ns.ok(["ip", "-6", "addr", "show", "dev", &out.host_if]);
    assert!(host.contains("fe80::1/64"), "{host}");
    assert_eq!(host.matches("inet6").count(), 1, "only fe80::1: {host}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn setup_and_teardown_are_idempotent() {
    let node_ns = Netns::new("node");
    let pod = Netns::new("pod");
    let node = NodeNs::at(node_ns.path());
    let s = spec(
        &pod,
        "ctr-idem",
        &["2001:db8:2::5/128", "10.244.2.5/32", "2001:db8:ff::5/128"],
        &["2001:db8:aa::1", "10.100.0.1"],
    );
    let first = setup(&node, &s).await.unwrap();
    let (node1, pod1) = (dump(&node_ns), dump(&pod));
    let second = setup(&node, &s).await.unwrap();
    // The same interfaces and MACs (the timings differ, of course).
    let untimed = |o: flock_netns::SetupOutcome| flock_netns::SetupOutcome {
        timing: Default::default(),
        ..o
    };
    assert_eq!(untimed(first), untimed(second));
    assert_eq!(dump(&node_ns), node1);
    assert_eq!(dump(&pod), pod1);
    assert!(node1.contains("inet6 fe80::1/64"), "{node1}");
    // sysctls are not in the dump: check compares them
    assert_eq!(check(&node, &s).await.unwrap(), vec![]);

    // half-built: routes and an address gone → completed by a new setup
    node_ns.ok(["ip", "route", "del", "10.244.2.5/32"]);
    pod.ok(["ip", "-6", "route", "del", "default"]);
    pod.ok(["ip", "addr", "del", "10.244.2.5/32", "dev", "eth0"]);
    setup(&node, &s).await.unwrap();
    assert_eq!(dump(&node_ns), node1);
    assert_eq!(dump(&pod), pod1);
    assert_eq!(check(&node, &s).await.unwrap(), vec![]);

    teardown(&node, &s).await.unwrap();
    teardown(&node, &s).await.unwrap();
    assert!(list_host_ifaces(&node).await.unwrap().is_empty());
    assert!(host_routes(&node).await.unwrap().is_empty());
    assert!(!node_ns.ok(["ip", "-6", "route"]).contains("2001:db8"));

    // teardown after the pod namespace was deleted
    let gone = Netns::new("pod");
    let s2 = spec(
        &gone,
        "ctr-gone",
        &["2001:db8:2::6/128", "10.244.2.6/32"],
        &[],
    );
    setup(&node, &s2).await.unwrap();
    drop(gone);
    teardown(&node, &s2).await.unwrap();
    let routes = format!(
        "{}{}",
        node_ns.ok(["ip", "route"]),
        node_ns.ok(["ip", "-6", "route"])
    );
    assert!(!routes.contains("10.244.2.6"), "{routes}");
    assert!(!routes.contains("2001:db8:2::6"), "{routes}");
    assert!(host_routes(&node).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_reports_each_difference_precisely() {
    let node_ns = Netns::new("node");
    let pod = Netns::new("pod");
    let node = NodeNs::at(node_ns.path());
    let s = spec(
        &pod,
        "ctr-check",
        &["2001:db8:3::7/128", "10.244.3.7/32"],
        &[],
    );
    let host_if = host_ifname("ctr-check", "eth0", 0);
    setup(&node, &s).await.unwrap();
    assert_eq!(check(&node, &s).await.unwrap(), vec![]);

    pod.ok([
        "ip",
        "-6",
        "addr",
        "del",
        "2001:db8:3::7/128",
        "dev",
        "eth0",
    ]);
    assert_eq!(
        check(&node, &s).await.unwrap(),
        vec![Mismatch::AddressMissing {
            side: Side::Pod,
            ifname: "eth0".into(),
            addr: net("2001:db8:3::7/128"),
        }]
    );
    setup(&node, &s).await.unwrap();

    node_ns.ok(["ip", "route", "del", "10.244.3.7/32"]);
    assert_eq!(
        check(&node, &s).await.unwrap(),
        vec![Mismatch::RouteMissing {
            side: Side::Host,
            route: RouteSpec {
                dst: net("10.244.3.7/32"),
                gateway: None,
                dev: host_if.clone(),
                onlink: false,
            },
        }]
    );
    setup(&node, &s).await.unwrap();

    node_ns.ok([
        "sysctl",
        "-qw",
        &format!("net.ipv4.conf.{host_if}.proxy_arp=0"),
    ]);
    let m = check(&node, &s).await.unwrap();
    assert_eq!(
        m,
        vec![Mismatch::Sysctl {
            side: Side::Host,
            path: format!("net/ipv4/conf/{host_if}/proxy_arp"),
            expected: "1".into(),
            actual: "0".into(),
        }]
    );
    assert_eq!(
        m[0].to_string(),
        format!("host sysctl net/ipv4/conf/{host_if}/proxy_arp is 0, expected 1")
    );
    setup(&node, &s).await.unwrap();
    assert_eq!(check(&node, &s).await.unwrap(), vec![]);

    // a link down on the pod side also drops its IPv6 address and route
    pod.ok(["ip", "link", "set", "eth0", "down"]);
    let m = check(&node, &s).await.unwrap();
    assert!(
        m.contains(&Mismatch::LinkDown {
            side: Side::Pod,
            ifname: "eth0".into()
        }),
        "{m:?}"
    );
    setup(&node, &s).await.unwrap();
    assert_eq!(check(&node, &s).await.unwrap(), vec![]);

    // host link down: reported as such (its fe80::1 goes with it)
    node_ns.ok(["ip", "link", "set", &host_if, "down"]);
    let m = check(&node, &s).await.unwrap();
    assert_eq!(
        m[0],
        Mismatch::LinkDown {
            side: Side::Host,
            ifname: host_if.clone()
        },
        "{m:?}"
    );
    setup(&node, &s).await.unwrap();
    assert_eq!(check(&node, &s).await.unwrap(), vec![]);

    // MTU and missing namespace
    node_ns.ok(["ip", "link", "set", &host_if, "mtu", "1400"]);
    assert_eq!(
        check(&node, &s).await.unwrap(),
        vec![Mismatch::Mtu {
            side: Side::Host,
            ifname: host_if.clone(),
            expected: 1500,
            actual: 1400
        }]
    );
    let path = pod.path();
    drop(pod);
    // the kernel destroys a namespace's links asynchronously, on one work queue for the
    // whole machine (slow while parallel tests drop their namespaces)
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while !list_host_ifaces(&node).await.unwrap().is_empty() && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let m = check(&node, &s).await.unwrap();
    assert!(
        m.contains(&Mismatch::LinkMissing {
            side: Side::Host,
            ifname: host_if.clone()
        }),
        "{m:?}"
    );
    assert!(m.contains(&Mismatch::NetnsMissing { path }), "{m:?}");
}

fn anycast_route(node_ns: &Netns, family: &str, addr: &str) -> String {
    node_ns.ok(["ip", family, "route", "show", addr])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anycast_route_follows_its_pods() {
    let node_ns = Netns::new("node");
    let (pa, pb, pc) = (Netns::new("pod"), Netns::new("pod"), Netns::new("pod"));
    let node = NodeNs::at(node_ns.path());
    // a client pod without the anycast address
    let c = spec(&pc, "any-c", &["2001:db8:4::c/128", "10.244.4.12/32"], &[]);
    setup(&node, &c).await.unwrap();
    let any = ["2001:db8:aa::53", "10.100.0.53"];
    let a = spec(&pa, "any-a", &["2001:db8:4::a/128", "10.244.4.10/32"], &any);
    let b = spec(&pb, "any-b", &["2001:db8:4::b/128", "10.244.4.11/32"], &any);
    let (ha, hb) = (
        host_ifname("any-a", "eth0", 0),
        host_ifname("any-b", "eth0", 0),
    );
    setup(&node, &a).await.unwrap();
    setup(&node, &b).await.unwrap();

    for (fam, addr) in [("-6", any[0]), ("-4", any[1])] {
        let r = anycast_route(&node_ns, fam, addr);
        assert_eq!(r.matches("nexthop").count(), 2, "{r}");
        assert!(r.contains(&ha) && r.contains(&hb), "{r}");
    }
    // The anycast addresses sit on the pod's interface, the IPv6 one deprecated; `lo` keeps
    // only loopback addresses (the runtime's `loopback` plugin refuses anything else, and it
    // may run at the same time as flock).
    let eth0 = pa.ok(["ip", "addr", "show", "dev", "eth0"]);
    assert!(eth0.contains("10.100.0.53/32"), "{eth0}");
    let v6 = eth0
        .lines()
        .find(|l| l.contains("2001:db8:aa::53/128"))
        .unwrap_or_else(|| panic!("{eth0}"));
    assert!(v6.contains("deprecated"), "{v6}");
    let lo = pa.ok(["ip", "addr", "show", "dev", "lo"]);
    assert!(
        !lo.contains("10.100.0.53") && !lo.contains("2001:db8:aa::53"),
        "{lo}"
    );
    // ... and the pod's own traffic keeps its own addresses as source.
    let r6 = pa.ok(["ip", "-6", "route", "get", "2001:db8:4::c"]);
    assert!(r6.contains("src 2001:db8:4::a "), "{r6}");
    let r4 = pa.ok(["ip", "-4", "route", "get", "10.244.4.12"]);
    assert!(r4.contains("src 10.244.4.10 "), "{r4}");
    // a pod of the node reaches the anycast address over both families
    assert!(pc.pings("2001:db8:aa::53"));
    assert!(pc.pings("10.100.0.53"));
    assert_eq!(check(&node, &a).await.unwrap(), vec![]);

    teardown(&node, &a).await.unwrap();
    for (fam, addr) in [("-6", any[0]), ("-4", any[1])] {
        let r = anycast_route(&node_ns, fam, addr);
        assert_eq!(r.lines().count(), 1, "one nexthop left: {r}");
        assert!(r.contains(&hb) && !r.contains(&ha), "{r}");
        assert!(!r.contains("nexthop"), "{r}");
    }
    assert!(pc.pings("10.100.0.53"));
    assert!(pc.pings("2001:db8:aa::53"));

    teardown(&node, &b).await.unwrap();
    for (fam, addr) in [("-6", any[0]), ("-4", any[1])] {
        assert_eq!(anycast_route(&node_ns, fam, addr), "");
    }

    // sync_anycast sets the whole set; empty deletes
    setup(&node, &a).await.unwrap();
    setup(&node, &b).await.unwrap();
    let addr: IpAddr = any[1].parse().unwrap();
    sync_anycast(
        &node,
        addr,
        &[AnycastMember {
            host_if: hb.clone(),
            pod_ip6: None,
        }],
    )
    .await
    .unwrap();
    let r = anycast_route(&node_ns, "-4", any[1]);
    assert!(r.contains(&hb) && !r.contains(&ha), "{r}");
    sync_anycast(&node, addr, &[]).await.unwrap();
    assert_eq!(anycast_route(&node_ns, "-4", any[1]), "");
}

/// A node learns an anycast address from the fabric too (BIRD installs the route other
/// nodes announce, through its uplink). That route is not a member: the node's first local
/// pod with the address gets a route of its own pod alone, and the last one leaving takes
/// only flock's route away. (A cluster run found the uplink taken for a member: part of the
/// anycast traffic reaching the node went back out, for IPv4 to an ARP nobody answered.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_bird_learned_for_an_anycast_address_is_not_a_member() {
    let (node_ns, fabric, pod) = (Netns::new("node"), Netns::new("fab"), Netns::new("pod"));
    let node = NodeNs::at(node_ns.path());
    // The uplink: a veth to a stand-in router, whose address is the gateway of BIRD's routes.
    node_ns.ok([
        "ip",
        "link",
        "add",
        "uplink",
        "type",
        "veth",
        "peer",
        "name",
        "rtr",
        "netns",
        fabric.name(),
    ]);
    node_ns.ok(["ip", "link", "set", "uplink", "up"]);
    node_ns.ok([
        "ip",
        "-6",
        "addr",
        "add",
        "2001:db8:f0::2/64",
        "dev",
        "uplink",
        "nodad",
    ]);
    fabric.ok(["ip", "link", "set", "rtr", "up"]);
    let any = ["2001:db8:ab::53", "10.100.1.53"];
    for (fam, addr) in [("-6", any[0]), ("-4", any[1])] {
        node_ns.ok([
            "ip",
            fam,
            "route",
            "add",
            addr,
            "via",
            "inet6",
            "2001:db8:f0::1",
            "dev",
            "uplink",
            "proto",
            "bird",
            "metric",
            "32",
        ]);
    }
    let a = spec(
        &pod,
        "any-l",
        &["2001:db8:6::a/128", "10.244.6.10/32"],
        &any,
    );
    let ha = host_ifname("any-l", "eth0", 0);
    setup(&node, &a).await.unwrap();
    for (fam, addr) in [("-6", any[0]), ("-4", any[1])] {
        let flock = node_ns.ok(["ip", fam, "route", "show", addr, "proto", "static"]);
        assert!(flock.contains(&ha), "{flock}");
        assert!(
            !flock.contains("uplink") && !flock.contains("nexthop"),
            "{flock}"
        );
    }
    teardown(&node, &a).await.unwrap();
    for (fam, addr) in [("-6", any[0]), ("-4", any[1])] {
        assert_eq!(
            node_ns.ok(["ip", fam, "route", "show", addr, "proto", "static"]),
            ""
        );
        let bird = node_ns.ok(["ip", fam, "route", "show", addr, "proto", "bird"]);
        assert!(bird.contains("uplink"), "BIRD's route stays: {bird:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackholes_and_inventory() {
    let node_ns = Netns::new("node");
    let pod = Netns::new("pod");
    let node = NodeNs::at(node_ns.path());
    let cidrs = [net("2001:db8:5::/64"), net("10.244.5.0/24")];
    ensure_blackholes(&node, &cidrs).await.unwrap();
    ensure_blackholes(&node, &cidrs).await.unwrap();
    assert!(
        node_ns
            .ok(["ip", "-6", "route"])
            .contains("blackhole 2001:db8:5::/64")
    );
    assert_eq!(
        node_ns.ok(["ip", "route"]).trim(),
        "blackhole 10.244.5.0/24 proto static"
    );
    let s = spec(&pod, "inv", &["2001:db8:5::9/128", "10.244.5.9/32"], &[]);
    setup(&node, &s).await.unwrap();
    let ifaces = list_host_ifaces(&node).await.unwrap();
    assert_eq!(ifaces.len(), 1);
    assert_eq!(ifaces[0].name, host_ifname("inv", "eth0", 0));
    assert!(ifaces[0].up);
    let routes = host_routes(&node).await.unwrap();
    let dsts: Vec<String> = routes.iter().map(|r| r.dst.to_string()).collect();
    assert_eq!(dsts, ["10.244.5.9/32", "2001:db8:5::9/128"]);
    // a more specific host route wins over the blackhole
    assert!(pod.pings("10.244.5.9"));
    assert!(remove_host_iface(&node, &ifaces[0].name).await.unwrap());
    assert!(!remove_host_iface(&node, &ifaces[0].name).await.unwrap());
    assert!(host_routes(&node).await.unwrap().is_empty());
    for c in cidrs {
        remove_blackhole(&node, c).await.unwrap();
        remove_blackhole(&node, c).await.unwrap();
    }
    assert_eq!(node_ns.ok(["ip", "route"]), "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_name_the_namespace_and_interface() {
    let node_ns = Netns::new("node");
    let node = NodeNs::at(node_ns.path());
    let pod = Netns::new("pod");
    let mut s = spec(&pod, "err", &["2001:db8:6::1/128"], &[]);
    s.netns = "/run/netns/flock-no-such-netns".into();
    let e = setup(&node, &s).await.unwrap_err();
    assert_eq!(e.errno(), Some(2));
    assert!(
        e.to_string().contains("/run/netns/flock-no-such-netns"),
        "{e}"
    );
    assert_eq!(
        std::error::Error::source(&e)
            .map(|c| c.to_string())
            .as_deref(),
        Some("No such file or directory (os error 2)")
    );
    s.netns = pod.path();
    // the kernel's own refusal keeps its errno in the source chain
    s.mtu = 10;
    let e = setup(&node, &s).await.unwrap_err();
    assert_eq!(e.errno(), Some(22), "{e}");
    assert!(e.to_string().contains(&s.host_if), "{e}");
    assert_eq!(
        std::error::Error::source(&e)
            .map(|c| c.to_string())
            .as_deref(),
        Some("Invalid argument (os error 22)")
    );
    s.mtu = 1500;
    s.if_name = "a-very-long-interface-name".into();
    let e = setup(&node, &s).await.unwrap_err();
    assert!(e.to_string().contains("a-very-long-interface-name"), "{e}");
    // the pod's interface name is taken by something that is not ours
    pod.ok([
        "ip", "link", "add", "eth0", "type", "veth", "peer", "name", "other",
    ]);
    s.if_name = "eth0".into();
    let e = setup(&node, &s).await.unwrap_err();
    assert!(e.to_string().contains("eth0"), "{e}");
    assert!(list_host_ifaces(&node).await.unwrap().is_empty());
}

/// Two attachments of one container (the cluster network and a secondary one, as Multus
/// makes them): `eth0` and `net1` in the same pod namespace get two host veths, only `eth0`
/// carries the default routes, `net1` routes its own space, CHECK of each passes, and tearing
/// one down leaves the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_attachments_of_one_container_coexist_and_tear_down_alone() {
    let node_ns = Netns::new("node");
    let pod = Netns::new("pod");
    let node = NodeNs::at(node_ns.path());
    let eth0 = spec(
        &pod,
        "ctr-multi",
        &["2001:db8:8::1/128", "10.244.8.1/32"],
        &[],
    );
    let net1 = PodSpec {
        if_name: "net1".into(),
        host_if: host_ifname("ctr-multi", "net1", 0),
        addresses: vec![net("2001:db8:5:1::2/128"), net("10.245.1.2/32")],
        default_route: false,
        routes: vec![net("2001:db8:5::/48"), net("10.245.0.0/16")],
        ..eth0.clone()
    };
    assert_ne!(eth0.host_if, net1.host_if);
    let a = setup(&node, &eth0).await.unwrap();
    let b = setup(&node, &net1).await.unwrap();
    assert_eq!(
        (a.host_if.as_str(), b.host_if.as_str()),
        (eth0.host_if.as_str(), net1.host_if.as_str())
    );
    // the second setup did not replace the first one's veth
    let names: Vec<String> = list_host_ifaces(&node)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.name)
        .collect();
    let mut want = vec![eth0.host_if.clone(), net1.host_if.clone()];
    want.sort();
    assert_eq!(names, want);
    // each attachment's CHECK passes: net1 took none of eth0's routes
    assert_eq!(check(&node, &net1).await.unwrap(), vec![]);
    assert_eq!(check(&node, &eth0).await.unwrap(), vec![]);
    for family in ["-6", "-4"] {
        let routes = pod.ok(["ip", family, "route"]);
        let defaults: Vec<&str> = routes
            .lines()
            .filter(|l| l.starts_with("default"))
            .collect();
        assert_eq!(defaults.len(), 1, "one default route: {routes}");
        assert!(defaults[0].contains("dev eth0"), "{routes}");
    }
    let routes4 = pod.ok(["ip", "-4", "route"]);
    assert!(
        routes4
            .lines()
            .any(|l| l.starts_with("10.245.0.0/16 via 169.254.1.1 dev net1 ")
                && l.contains(" onlink")),
        "{routes4}"
    );
    let routes6 = pod.ok(["ip", "-6", "route"]);
    assert!(
        routes6.contains("2001:db8:5::/48 via fe80::1 dev net1"),
        "{routes6}"
    );
    let host6 = node_ns.ok(["ip", "-6", "route"]);
    for (addr, host_if) in [
        ("2001:db8:8::1", &eth0.host_if),
        ("2001:db8:5:1::2", &net1.host_if),
    ] {
        assert!(host6.contains(&format!("{addr} dev {host_if}")), "{host6}");
    }
    assert!(pod.pings("fe80::1%eth0") && pod.pings("fe80::1%net1"));
    // the secondary space leaves through net1 (from its address), the rest through eth0
    let get = pod.ok(["ip", "route", "get", "10.245.2.9"]);
    assert!(
        get.contains("dev net1") && get.contains("src 10.245.1.2"),
        "{get}"
    );
    let get = pod.ok(["ip", "route", "get", "10.99.0.1"]);
    assert!(
        get.contains("dev eth0") && get.contains("src 10.244.8.1"),
        "{get}"
    );

    teardown(&node, &net1).await.unwrap();
    let left = list_host_ifaces(&node).await.unwrap();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].name, eth0.host_if);
    assert!(!pod.ok(["ip", "link"]).contains("net1"));
    // eth0's link, addresses, routes and host routes are untouched
    assert_eq!(check(&node, &eth0).await.unwrap(), vec![]);
    let host6 = node_ns.ok(["ip", "-6", "route"]);
    assert!(!host6.contains("2001:db8:5:1::2"), "{host6}");
    assert!(pod.pings("fe80::1%eth0") && pod.pings("169.254.1.1"));
    // net1 set up again, then eth0 torn down: net1 keeps its routes and passes CHECK
    setup(&node, &net1).await.unwrap();
    teardown(&node, &eth0).await.unwrap();
    assert_eq!(check(&node, &net1).await.unwrap(), vec![]);
    teardown(&node, &net1).await.unwrap();
    assert!(list_host_ifaces(&node).await.unwrap().is_empty());
}

/// An address handed to a new pod while its old pod's veth is still there (the agent deletes
/// a released pod's veth, and its routes with it, after answering): the new pod's set-up
/// takes the host routes over, and deleting the old veth leaves them alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_moves_to_its_new_pod_before_the_old_veth_goes() {
    let node_ns = Netns::new("node");
    let (old_pod, new_pod, peer) = (Netns::new("pod"), Netns::new("pod"), Netns::new("pod"));
    let node = NodeNs::at(node_ns.path());
    let addrs = ["2001:db8:7::5/128", "10.244.7.5/32"];
    let old = spec(&old_pod, "ctr-old", &addrs, &[]);
    let new = spec(&new_pod, "ctr-new", &addrs, &[]);
    let other = spec(
        &peer,
        "ctr-peer",
        &["2001:db8:7::6/128", "10.244.7.6/32"],
        &[],
    );
    setup(&node, &old).await.unwrap();
    setup(&node, &other).await.unwrap();
    setup(&node, &new).await.unwrap();
    // one host route a family, through the new pod's veth
    let routed_to_new_pod = || {
        let mut lines = node_ns.ok(["ip", "-6", "route"]);
        lines.push_str(&node_ns.ok(["ip", "-4", "route"]));
        let routes: Vec<&str> = lines
            .lines()
            .filter(|l| l.starts_with("2001:db8:7::5 ") || l.starts_with("10.244.7.5 "))
            .collect();
        assert_eq!(routes.len(), 2, "{routes:?}");
        for r in &routes {
            assert!(r.contains(&format!("dev {}", new.host_if)), "{routes:?}");
        }
        assert!(peer.pings("2001:db8:7::5") && peer.pings("10.244.7.5"));
    };
    routed_to_new_pod();
    assert_eq!(check(&node, &new).await.unwrap(), vec![]);

    assert!(remove_host_iface(&node, &old.host_if).await.unwrap());
    routed_to_new_pod();
    assert_eq!(check(&node, &new).await.unwrap(), vec![]);
    for s in [&new, &other] {
        teardown(&node, s).await.unwrap();
    }
}

/// The caller's name is used as is: an attachment whose first name is owned by another gets
/// a later attempt, and setup, check and teardown all act on that name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recorded_host_name_is_used_as_given() {
    let node_ns = Netns::new("node");
    let (pa, pb) = (Netns::new("pod"), Netns::new("pod"));
    let node = NodeNs::at(node_ns.path());
    let first = spec(&pa, "ctr-owner", &["2001:db8:9::1/128"], &[]);
    // a second pod whose attempt-0 name is (say, by a collision) the first one's
    let mut second = spec(&pb, "ctr-other", &["2001:db8:9::2/128"], &[]);
    second.host_if = host_ifname("ctr-other", "eth0", 1);
    setup(&node, &first).await.unwrap();
    let out = setup(&node, &second).await.unwrap();
    assert_eq!(out.host_if, host_ifname("ctr-other", "eth0", 1));
    assert_eq!(check(&node, &second).await.unwrap(), vec![]);
    teardown(&node, &second).await.unwrap();
    let left: Vec<String> = list_host_ifaces(&node)
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.name)
        .collect();
    assert_eq!(left, [first.host_if.as_str()]);
    assert_eq!(check(&node, &first).await.unwrap(), vec![]);

    // a host name without flock's prefix is refused before anything is created
    let mut bad = spec(&pb, "ctr-bad", &["2001:db8:9::3/128"], &[]);
    bad.host_if = "veth1234".into();
    let e = setup(&node, &bad).await.unwrap_err();
    assert!(e.to_string().contains("veth1234"), "{e}");
    assert_eq!(list_host_ifaces(&node).await.unwrap().len(), 1);
    teardown(&node, &first).await.unwrap();
}

/// The uplink is the interface of the route to the neighbor, with its MTU: a veth of MTU 1400
/// standing for a bond or a VLAN, found by the route and not by its name; an unnumbered
/// session's interface by name; nothing where no route leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_uplink_is_the_route_to_the_neighbor() {
    let node_ns = Netns::new("node");
    let peer = Netns::new("peer");
    let node = NodeNs::at(node_ns.path());
    node_ns.ok([
        "ip",
        "link",
        "add",
        "bond0.7",
        "mtu",
        "1400",
        "type",
        "veth",
        "peer",
        "name",
        "up0",
        "netns",
        peer.name(),
    ]);
    node_ns.ok(["ip", "link", "set", "bond0.7", "up"]);
    node_ns.ok([
        "ip",
        "addr",
        "add",
        "2001:db8:f9::2/64",
        "dev",
        "bond0.7",
        "nodad",
    ]);
    node_ns.ok(["ip", "addr", "add", "10.250.0.2/30", "dev", "bond0.7"]);
    let found = uplink(&node, Toward::Address("2001:db8:f9::1".parse().unwrap()))
        .await
        .unwrap();
    assert_eq!(
        found,
        Some(Uplink {
            name: "bond0.7".into(),
            mtu: 1400
        })
    );
    let found = uplink(&node, Toward::Address("10.250.0.1".parse().unwrap()))
        .await
        .unwrap();
    assert_eq!(found.map(|u| u.mtu), Some(1400));
    // a neighbor behind a gateway: the interface the route leaves through
    node_ns.ok([
        "ip",
        "route",
        "add",
        "2001:db8:77::/48",
        "via",
        "2001:db8:f9::1",
    ]);
    let found = uplink(&node, Toward::Address("2001:db8:77::5".parse().unwrap()))
        .await
        .unwrap();
    assert_eq!(found.map(|u| u.name), Some("bond0.7".into()));
    // the MTU is read each time: a change shows at once
    node_ns.ok(["ip", "link", "set", "bond0.7", "mtu", "1380"]);
    let found = uplink(&node, Toward::Interface("bond0.7")).await.unwrap();
    assert_eq!(found.map(|u| u.mtu), Some(1380));
    // no route, no such interface
    assert_eq!(
        uplink(&node, Toward::Address("2001:db8:99::1".parse().unwrap()))
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        uplink(&node, Toward::Interface("nothere")).await.unwrap(),
        None
    );
}
