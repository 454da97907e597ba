//! Unit and property tests of the pools, the CIDR rule and the annotations.

use std::collections::{BTreeMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use flock_embed::{Identity, IpAlgo};
use ipnet::{Ipv4Net, Ipv6Net};
use proptest::prelude::*;
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::SeedableRng;

use crate::*;

fn pod(name: &str) -> Identity<'_> {
    Identity {
        namespace: "shop",
        workload: "web",
        image: Some("registry.example/web:1"),
        pod: name,
        container_id: name,
    }
}

fn net6(s: &str) -> Ipv6Net {
    s.parse().unwrap()
}
fn net4(s: &str) -> Ipv4Net {
    s.parse().unwrap()
}

fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (format!("flock.fritzlab.net/{k}"), (*v).to_owned()))
        .collect()
}

fn request(pairs: &[(&str, &str)]) -> PodRequest {
    PodRequest::from_annotations(&annotations(pairs), &NodeDefaults::for_cidrs(true, true)).unwrap()
}

#[test]
fn every_annotation_parse_error() {
    let node = NodeDefaults::for_cidrs(true, true);
    let cases: &[(&str, &str)] = &[
        ("ipv6", "yes"),
        ("ipv4", "True"),
        ("cidr6", ""),
        ("cidr6", "2001:db8::/64,,2001:db8:1::/64"),
        ("cidr6", "10.0.0.0/8"),
        ("cidr6", "2001:db8::/200"),
        ("cidr6", "2001:db8::1/64"),
        ("cidr6", "2001:db8::/64,2001:db8::/64"),
        ("cidr4", "2001:db8::/64"),
        ("cidr4", "10.0.0.0"),
        ("cidr4", "10.0.0.1/24"),
        ("cidr4", "10.0.0.0/31"),
        ("ip-algo", "ns:16,foo:8"),
        ("ip-algo", "n:8,n:8"),
        ("anycast", "2001:db8::/64"),
        ("anycast", "not-an-ip"),
        ("addresses", "10.1.1.1, 10.1.1.1"),
        ("addresses", " "),
        ("ipaddr", "2001:db8::1"),
    ];
    let mut out = String::new();
    for (k, v) in cases {
        let err = PodRequest::from_annotations(&annotations(&[(k, v)]), &node).unwrap_err();
        out.push_str(&format!("{k}={v:?} => {err}\n"));
    }
    for pairs in [
        &[("addresses", "2001:db8::7"), ("anycast", "2001:db8::7")][..],
        &[("ipv6", "false"), ("ipv4", "false")][..],
    ] {
        let err = PodRequest::from_annotations(&annotations(pairs), &node).unwrap_err();
        out.push_str(&format!("{pairs:?} => {err}\n"));
    }
    insta::assert_snapshot!(out);
}

#[test]
fn annotations_parse_and_ignore_others() {
    let mut map = annotations(&[
        ("cidr6", "2001:db8:9::/48, 2001:db8:0:1:8000::/65"),
        ("cidr4", "10.244.1.128/25"),
        ("anycast", "2001:db8:aa::1,10.9.9.9"),
        ("addresses", "2001:db8:bb::1"),
        ("ipv4", "false"),
    ]);
    map.insert("kubernetes.io/psp".into(), "whatever".into());
    map.insert("flock.fritzlab.net".into(), "no slash: not ours".into());
    let mut node = NodeDefaults::for_cidrs(true, true);
    node.ip_algo = Some(IpAlgo::workload());
    let req = PodRequest::from_annotations(&map, &node).unwrap();
    assert_eq!(req.ipv6, Want::ByDefault);
    assert_eq!(req.ipv4, Want::No);
    assert_eq!(
        req.cidr6,
        vec![net6("2001:db8:9::/48"), net6("2001:db8:0:1:8000::/65")]
    );
    assert_eq!(req.cidr4, vec![net4("10.244.1.128/25")]);
    assert_eq!(req.anycast.len(), 2);
    assert_eq!(req.ip_algo, IpAlgo::workload());
    assert_eq!(req.ip_algo_source, AlgoSource::Node);
    // a node without cidr4 does not want IPv4 by default
    let v6only = PodRequest::defaults(&NodeDefaults::for_cidrs(true, false));
    assert_eq!((v6only.ipv6, v6only.ipv4), (Want::ByDefault, Want::No));
}

#[test]
fn every_allocation_error() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut out = String::new();
    let mut line = |what: &str, err: Error| out.push_str(&format!("{what} => {err}\n"));

    let mut v6only = Pools::new(Some(net6("2001:db8:0:1::/64")), None).unwrap();
    line(
        "ipv4=true on a node without cidr4",
        v6only
            .allocate(&request(&[("ipv4", "true")]), &pod("a"), &mut rng)
            .unwrap_err(),
    );
    line(
        "ipv4 by default on a node without cidr4",
        v6only
            .allocate(&request(&[]), &pod("a"), &mut rng)
            .unwrap_err(),
    );
    let mut v4only = Pools::new(None, Some(net4("10.244.1.0/24"))).unwrap();
    line(
        "ipv6 by default on a node without cidr6",
        v4only
            .allocate(&request(&[("ipv4", "true")]), &pod("a"), &mut rng)
            .unwrap_err(),
    );

    let mut pools =
        Pools::new(Some(net6("2001:db8:0:1::/64")), Some(net4("10.244.1.0/24"))).unwrap();
    line(
        "cidr6 disjoint",
        pools
            .allocate(
                &request(&[("cidr6", "2001:db8:9::/48,2001:db8:8::/48")]),
                &pod("a"),
                &mut rng,
            )
            .unwrap_err(),
    );
    line(
        "cidr4 disjoint",
        pools
            .allocate(&request(&[("cidr4", "10.9.0.0/16")]), &pod("a"), &mut rng)
            .unwrap_err(),
    );
    line(
        "ip-algo too wide",
        pools
            .allocate(&request(&[("ip-algo", "ns:64,app:8")]), &pod("a"), &mut rng)
            .unwrap_err(),
    );
    let mut node = NodeDefaults::for_cidrs(true, true);
    node.ip_algo = Some("pod:64,n:8".parse().unwrap());
    let from_node = PodRequest::from_annotations(&BTreeMap::new(), &node).unwrap();
    line(
        "node ip-algo too wide",
        pools.allocate(&from_node, &pod("a"), &mut rng).unwrap_err(),
    );

    let fixed = request(&[("ip-algo", "ns:16,app:24,pod:24")]);
    pools.allocate(&fixed, &pod("a"), &mut rng).unwrap();
    line(
        "deterministic spec collides",
        pools.allocate(&fixed, &pod("a"), &mut rng).unwrap_err(),
    );
    let counted = request(&[("ip-algo", "ns:16,app:24,pod:23,n:1")]);
    pools.allocate(&counted, &pod("b"), &mut rng).unwrap();
    pools.allocate(&counted, &pod("b"), &mut rng).unwrap();
    line(
        "counter exhausted",
        pools.allocate(&counted, &pod("b"), &mut rng).unwrap_err(),
    );
    pools.reserve("2001:db8:77::1".parse().unwrap()).unwrap();
    line(
        "fixed address in use",
        pools
            .allocate(
                &request(&[("addresses", "10.0.0.9,2001:db8:77::1")]),
                &pod("c"),
                &mut rng,
            )
            .unwrap_err(),
    );
    line(
        "reserve twice",
        pools
            .reserve("2001:db8:77::1".parse().unwrap())
            .unwrap_err(),
    );
    let none = PodRequest {
        ipv6: Want::No,
        ipv4: Want::No,
        ..request(&[])
    };
    line(
        "no family",
        pools.allocate(&none, &pod("c"), &mut rng).unwrap_err(),
    );

    let mut tiny = Pools::new(Some(net6("2001:db8::/127")), Some(net4("10.0.0.0/30"))).unwrap();
    tiny.allocate(&request(&[]), &pod("a"), &mut rng).unwrap();
    line(
        "IPv6 exhausted",
        tiny.allocate(&request(&[("ipv4", "false")]), &pod("b"), &mut rng)
            .unwrap_err(),
    );
    line(
        "IPv4 exhausted",
        tiny.allocate(&request(&[("ipv6", "false")]), &pod("b"), &mut rng)
            .unwrap_err(),
    );
    let mut one6 = Pools::new(Some(net6("2001:db8::5/128")), None).unwrap();
    line(
        "IPv6 node CIDR /128",
        one6.allocate(&request(&[]), &pod("a"), &mut rng)
            .unwrap_err(),
    );
    let mut small4 = Pools::new(None, Some(net4("10.0.0.0/31"))).unwrap();
    line(
        "IPv4 node CIDR /31",
        small4
            .allocate(&request(&[("ipv6", "false")]), &pod("a"), &mut rng)
            .unwrap_err(),
    );
    line(
        "IPv4 node CIDR /7",
        Pools::new(None, Some(net4("10.0.0.0/7"))).unwrap_err(),
    );
    insta::assert_snapshot!(out);
    // failed allocations left nothing held
    assert!(!pools.is_allocated("10.0.0.9".parse().unwrap()));
}

#[test]
fn every_node_cidr_error() {
    let mut out = String::new();
    for (cidr6, cidr4) in [
        (Some("2001:db8::/200"), None),
        (Some("10.244.0.0/16"), None),
        (Some("2001:db8::1/64"), None),
        (Some("2001:db8::/121"), None),
        (None, Some("2001:db8::/64")),
        (None, Some("10.244.1.7/24")),
        (None, Some("10.244.1.0/31")),
        (None, Some("10.0.0.0/7")),
        // the IPv6 field is checked first
        (Some("2001:db8::/128"), Some("10.0.0.0/32")),
    ] {
        let err = NodeCidrs::parse(cidr6, cidr4).unwrap_err();
        let Error::NodeCidr { family, value, .. } = &err else {
            panic!("{err:?}")
        };
        assert_eq!(
            Some(value.as_str()),
            if *family == Family::V6 { cidr6 } else { cidr4 }
        );
        out.push_str(&format!("{cidr6:?} {cidr4:?} => {err}\n"));
    }
    insta::assert_snapshot!(out);
    // the limits themselves are fine, and every valid pair makes pools
    for (cidr6, cidr4) in [
        (Some("2001:db8::/120"), Some("10.0.0.0/30")),
        (Some("::/0"), Some("10.0.0.0/8")),
        (None, None),
    ] {
        let node = NodeCidrs::parse(cidr6, cidr4).unwrap();
        Pools::new(node.cidr6(), node.cidr4()).unwrap();
    }
}

#[test]
fn ipv4_skips_network_first_and_broadcast_and_round_robins() {
    let mut pools = Pools::new(None, Some(net4("10.0.0.0/29"))).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let req = request(&[("ipv6", "false")]);
    let got: Vec<Ipv4Addr> = (0..5)
        .map(|i| {
            pools
                .allocate(&req, &pod(&i.to_string()), &mut rng)
                .unwrap()
                .ipv4
                .unwrap()
        })
        .collect();
    let want: Vec<Ipv4Addr> = (2..=6).map(|h| Ipv4Addr::new(10, 0, 0, h)).collect();
    assert_eq!(got, want);
    assert!(pools.allocate(&req, &pod("x"), &mut rng).is_err());
    pools.release("10.0.0.3".parse().unwrap());
    assert_eq!(
        pools.allocate(&req, &pod("y"), &mut rng).unwrap().ipv4,
        Some(Ipv4Addr::new(10, 0, 0, 3))
    );
    let stats = pools.stats();
    assert_eq!((stats.allocated4, stats.capacity4), (5, 5));
}

#[test]
fn subnet_annotation_allocates_inside_the_subnet() {
    let mut pools =
        Pools::new(Some(net6("2001:db8:0:1::/64")), Some(net4("10.244.1.0/24"))).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let req = request(&[
        ("cidr4", "10.244.1.64/26"),
        ("cidr6", "2001:db8:0:1:ff00::/72"),
    ]);
    let a = pools.allocate(&req, &pod("a"), &mut rng).unwrap();
    assert_eq!(a.ipv4, Some("10.244.1.66".parse().unwrap()));
    assert_eq!(a.cidr4, Some(net4("10.244.1.64/26")));
    assert!(net6("2001:db8:0:1:ff00::/72").contains(&a.ipv6.unwrap()));
}

#[test]
fn workload_pods_share_prefix_and_same_identity_gets_same_address_back() {
    let mut pools = Pools::new(Some(net6("2001:db8:0:1::/64")), None).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    // no random bits: the second pod of the same identity collides and takes n = 1
    let req = request(&[("ip-algo", "ns:16,app:24,pod:16,n:8"), ("ipv4", "false")]);
    let id = Identity {
        image: None,
        ..pod("x")
    };
    let first = pools.allocate(&req, &id, &mut rng).unwrap();
    let second = pools.allocate(&req, &id, &mut rng).unwrap();
    let (a, b) = (
        u128::from(first.ipv6.unwrap()),
        u128::from(second.ipv6.unwrap()),
    );
    assert_eq!((first.counter, second.counter), (Some(0), Some(1)));
    assert_eq!(a >> 8, b >> 8, "ns, app and pod bits equal");
    assert_eq!((a & 0xff, b & 0xff), (0, 1), "n in the low 8 bits");
    let other = pools
        .allocate(&req, &pod("y"), &mut rng)
        .unwrap()
        .ipv6
        .unwrap();
    assert_eq!(
        u128::from(other) >> 24,
        a >> 24,
        "another pod of the workload shares ns and app"
    );
    let ns = u128::from(flock_embed::fnv1a64("shop") & 0xffff);
    assert_eq!((a >> 48) & 0xffff, ns);
    pools.release_allocation(&first);
    let again = pools.allocate(&req, &id, &mut rng).unwrap();
    assert_eq!(again.counter, Some(0));
    assert_eq!(
        again.ipv6, first.ipv6,
        "the same identity at n = 0 gets the same address"
    );
}

#[test]
fn cidr_change_keeps_live_addresses() {
    let mut pools =
        Pools::new(Some(net6("2001:db8:0:1::/64")), Some(net4("10.244.1.0/24"))).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let a = pools.allocate(&request(&[]), &pod("a"), &mut rng).unwrap();
    pools.reserve("10.244.2.9".parse().unwrap()).unwrap();
    pools
        .set_node_cidrs(Some(net6("2001:db8:0:2::/64")), Some(net4("10.244.2.0/24")))
        .unwrap();
    for addr in a.held() {
        assert!(pools.is_allocated(addr), "{addr} stranded");
    }
    assert!(pools.is_allocated("10.244.2.9".parse().unwrap()));
    let s = pools.stats();
    assert_eq!(
        (s.held4, s.allocated4),
        (2, 1),
        "the old pod's address is no pool usage"
    );
    // the old addresses cannot be handed out again, and release still works
    assert!(pools.reserve(a.ipv4.unwrap().into()).is_err());
    pools.release_allocation(&a);
    assert_eq!(
        pools.snapshot(),
        vec!["10.244.2.9".parse::<IpAddr>().unwrap()]
    );
    // a failing change changes nothing
    assert!(
        pools
            .set_node_cidrs(None, Some(net4("10.0.0.0/7")))
            .is_err()
    );
    assert_eq!(pools.cidr4(), Some(net4("10.244.2.0/24")));
}

#[test]
fn capacities() {
    let pools = Pools::new(Some(net6("2001:db8::/120")), Some(net4("10.0.0.0/16"))).unwrap();
    let s = pools.stats();
    assert_eq!((s.capacity6, s.capacity4), (255, 65533));
    let pools = Pools::new(Some(net6("2001:db8::/64")), None).unwrap();
    assert_eq!(pools.stats().capacity6, (1u128 << 64) - 1 - 128 - (1 << 24));
}

/// STATUS asks "can this node still serve an ADD from its pool?": the answer must count only
/// the addresses of the current node CIDR a pod could get, not fixed `addresses` elsewhere,
/// anycast addresses or pods left in an old CIDR.
#[test]
fn usage_counts_only_the_node_cidr() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let v6_only = request(&[("ipv4", "false")]);
    let v4_only = request(&[("ipv6", "false")]);
    // a /126 holds three pod addresses (::1, ::2, ::3); a /30 holds one (.2)
    let mut pools = Pools::new(Some(net6("2001:db8::/126")), Some(net4("10.0.0.0/30"))).unwrap();
    pools.allocate(&v6_only, &pod("a"), &mut rng).unwrap();
    // fixed addresses outside both node CIDRs
    for fixed in [
        "2001:db8:77::1",
        "2001:db8:77::2",
        "2001:db8:77::3",
        "10.9.9.9",
    ] {
        pools.reserve(fixed.parse().unwrap()).unwrap();
    }
    let s = pools.stats();
    assert!(
        (s.allocated6 as u128) < s.capacity6,
        "one of three IPv6 pod addresses in use, not exhausted: {s:?}"
    );
    assert!(
        (s.allocated4 as u64) < s.capacity4,
        "no IPv4 pod yet: {s:?}"
    );
    assert_eq!((s.allocated6, s.allocated4), (1, 0));
    assert_eq!((s.held6, s.held4), (4, 1));
    assert_eq!(
        (pools.exhausted(Family::V6), pools.exhausted(Family::V4)),
        (None, None)
    );
    pools.allocate(&v6_only, &pod("b"), &mut rng).unwrap();
    pools.allocate(&v6_only, &pod("c"), &mut rng).unwrap();
    pools.allocate(&v4_only, &pod("d"), &mut rng).unwrap();
    let s = pools.stats();
    assert_eq!(
        (s.allocated6 as u128, s.allocated4 as u64),
        (s.capacity6, s.capacity4)
    );
    assert_eq!(
        pools
            .exhausted(Family::V6)
            .map(|e| e.to_string())
            .as_deref(),
        Some("no free IPv6 address left in 2001:db8::/126 (3 in use)")
    );
    assert!(matches!(
        pools.exhausted(Family::V4),
        Some(Error::Exhausted {
            family: Family::V4,
            allocated: 1,
            ..
        })
    ));

    // a CIDR change strands nothing, and the pods of the old CIDR do not fill the new one
    pools
        .set_node_cidrs(Some(net6("2001:db8:1::/126")), Some(net4("10.0.1.0/30")))
        .unwrap();
    let s = pools.stats();
    assert_eq!((s.allocated6, s.allocated4), (0, 0), "{s:?}");
    assert_eq!((s.held6, s.held4), (6, 2), "{s:?}");
    assert_eq!(
        (pools.exhausted(Family::V6), pools.exhausted(Family::V4)),
        (None, None)
    );
    pools.allocate(&v6_only, &pod("e"), &mut rng).unwrap();
    pools.allocate(&v4_only, &pod("f"), &mut rng).unwrap();
    let s = pools.stats();
    assert_eq!((s.allocated6, s.allocated4), (1, 1), "{s:?}");
    assert!(pools.exhausted(Family::V4).is_some(), "a /30 holds one pod");

    // addresses a pod is never given do not count even inside the CIDR
    let mut pools = Pools::new(Some(net6("2001:db8::/126")), Some(net4("10.0.0.0/30"))).unwrap();
    for never in ["2001:db8::", "10.0.0.0", "10.0.0.1", "10.0.0.3"] {
        pools.reserve(never.parse().unwrap()).unwrap();
    }
    let s = pools.stats();
    assert_eq!((s.allocated6, s.allocated4, s.held6, s.held4), (0, 0, 1, 3));
    // and a family without a CIDR is absent, not exhausted
    let v6only = Pools::new(Some(net6("2001:db8::/126")), None).unwrap();
    assert_eq!(v6only.exhausted(Family::V4), None);
}

// ---- properties ------------------------------------------------------------

/// A small node: an IPv6 /120–/126 and an IPv4 /26–/30, so that
/// collisions and exhaustion happen often.
fn small_node() -> impl Strategy<Value = (Ipv6Net, Ipv4Net)> {
    (120u8..=126, 26u8..=30, any::<u16>(), any::<u8>()).prop_map(|(p6, p4, a, b)| {
        let v6 = Ipv6Net::new(Ipv6Addr::new(0x2001, 0xdb8, a, 0, 0, 0, 0, 0), p6)
            .unwrap()
            .trunc();
        let v4 = Ipv4Net::new(Ipv4Addr::new(10, b, 0, 0), p4)
            .unwrap()
            .trunc();
        (v6, v4)
    })
}

fn algo() -> impl Strategy<Value = IpAlgo> {
    prop_oneof![
        Just(IpAlgo::random()),
        Just("ns:1,n:3".parse().unwrap()),
        Just("pod:2,rand:2".parse().unwrap()),
        Just("n:2".parse().unwrap()),
    ]
}

#[derive(Debug, Clone)]
enum Op {
    Alloc { pod: u8, algo: IpAlgo },
    Release(prop::sample::Index),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            3 => (any::<u8>(), algo()).prop_map(|(pod, algo)| Op::Alloc { pod, algo }),
            1 => any::<prop::sample::Index>().prop_map(Op::Release),
        ],
        1..120,
    )
}

proptest! {
    #[test]
    fn no_address_is_ever_held_twice((v6, v4) in small_node(), ops in ops(), seed in any::<u64>()) {
        let mut pools = Pools::new(Some(v6), Some(v4)).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut live: Vec<Allocation> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc { pod: p, algo } => {
                    let req = PodRequest { ip_algo: algo, ..request(&[]) };
                    let name = p.to_string();
                    if let Ok(a) = pools.allocate(&req, &pod(&name), &mut rng) {
                        live.push(a);
                    }
                }
                Op::Release(i) if !live.is_empty() => {
                    let a = live.swap_remove(i.index(live.len()));
                    pools.release_allocation(&a);
                }
                Op::Release(_) => {}
            }
            let mut seen = HashSet::new();
            for addr in live.iter().flat_map(Allocation::held) {
                prop_assert!(seen.insert(addr), "{} held twice", addr);
                prop_assert!(pools.is_allocated(addr));
            }
            prop_assert_eq!(pools.snapshot().len(), seen.len());
        }
    }

    #[test]
    fn usage_is_the_held_addresses_a_pod_of_the_node_cidr_may_get(
        (v6, v4) in small_node(),
        picks in prop::collection::vec((any::<u16>(), any::<bool>(), any::<bool>()), 1..60),
        (new6, new4) in small_node(),
    ) {
        let mut pools = Pools::new(Some(v6), Some(v4)).unwrap();
        // addresses near the node CIDRs: half inside, half in the next block
        let addr6 = |n: u16| Ipv6Addr::from(u128::from(v6.network()) + u128::from(n % 512));
        let addr4 = |n: u16| Ipv4Addr::from(u32::from(v4.network()).wrapping_add(u32::from(n % 128)));
        let model = |pools: &Pools| {
            let (c6, c4) = (pools.cidr6().unwrap(), pools.cidr4().unwrap());
            let all = pools.snapshot();
            let in6 = all.iter().filter(|a| matches!(a, IpAddr::V6(a) if c6.contains(a) && !is_forbidden6(*a, c6))).count();
            let in4 = all.iter().filter(|a| matches!(a, IpAddr::V4(a) if c4.contains(a) && !is_forbidden4(*a, c4))).count();
            (in6, in4, all.iter().filter(|a| a.is_ipv6()).count(), all.iter().filter(|a| a.is_ipv4()).count())
        };
        for (n, v6_pick, release) in picks {
            let a = if v6_pick { IpAddr::V6(addr6(n)) } else { IpAddr::V4(addr4(n)) };
            if release { pools.release(a); } else { let _ = pools.reserve(a); }
            let s = pools.stats();
            prop_assert_eq!((s.allocated6, s.allocated4, s.held6, s.held4), model(&pools));
            prop_assert!(s.allocated6 as u128 <= s.capacity6 && s.allocated4 as u64 <= s.capacity4);
        }
        pools.set_node_cidrs(Some(new6), Some(new4)).unwrap();
        let s = pools.stats();
        prop_assert_eq!((s.allocated6, s.allocated4, s.held6, s.held4), model(&pools));
    }

    #[test]
    fn addresses_lie_in_the_effective_cidr_and_are_never_forbidden(
        (v6, v4) in small_node(), sub6 in 0u8..=2, sub4 in 0u8..=2, algo in algo(), seed in any::<u64>(),
    ) {
        let mut pools = Pools::new(Some(v6), Some(v4)).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        // a subnet annotation (possibly the node CIDR itself) for both families
        let p6 = (v6.prefix_len() + sub6).min(126);
        let p4 = (v4.prefix_len() + sub4).min(30);
        let eff6 = Ipv6Net::new(v6.network(), p6).unwrap();
        let eff4 = Ipv4Net::new(v4.network(), p4).unwrap();
        let req = PodRequest { cidr6: vec![eff6], cidr4: vec![eff4], ip_algo: algo, ..request(&[]) };
        for i in 0..80u32 {
            let name = i.to_string();
            match pools.allocate(&req, &pod(&name), &mut rng) {
                Ok(a) => {
                    let (ip6, ip4) = (a.ipv6.unwrap(), a.ipv4.unwrap());
                    prop_assert!(eff6.contains(&ip6) && !is_forbidden6(ip6, eff6), "{}", ip6);
                    prop_assert!(eff4.contains(&ip4) && !is_forbidden4(ip4, eff4), "{}", ip4);
                    prop_assert_eq!((a.cidr6, a.cidr4), (Some(eff6), Some(eff4)));
                }
                Err(_) => break,
            }
        }
    }

    #[test]
    fn release_then_allocate_can_give_the_address_back(
        (v6, v4) in small_node(), victim in any::<prop::sample::Index>(), seed in any::<u64>(),
    ) {
        let mut pools = Pools::new(Some(v6), Some(v4)).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let v4_only = request(&[("ipv6", "false")]);
        let v6_only = request(&[("ipv4", "false")]);
        // fill both pools completely (random IPv6: the small-space fallback guarantees it)
        let mut got4 = Vec::new();
        while let Ok(a) = pools.allocate(&v4_only, &pod("p"), &mut rng) { got4.push(a.ipv4.unwrap()); }
        let mut got6 = Vec::new();
        while let Ok(a) = pools.allocate(&v6_only, &pod("p"), &mut rng) { got6.push(a.ipv6.unwrap()); }
        let s = pools.stats();
        prop_assert_eq!(got4.len() as u64, s.capacity4);
        prop_assert_eq!(got6.len() as u128, s.capacity6);
        let a4 = got4[victim.index(got4.len())];
        let a6 = got6[victim.index(got6.len())];
        prop_assert!(pools.release(a4.into()) && pools.release(a6.into()));
        prop_assert_eq!(pools.allocate(&v4_only, &pod("q"), &mut rng).unwrap().ipv4, Some(a4));
        prop_assert_eq!(pools.allocate(&v6_only, &pod("q"), &mut rng).unwrap().ipv6, Some(a6));
    }

    #[test]
    fn a_reserved_address_is_never_allocated(
        (v6, v4) in small_node(),
        picks in prop::collection::vec(any::<prop::sample::Index>(), 1..20),
        algo in algo(), seed in any::<u64>(),
    ) {
        let mut pools = Pools::new(Some(v6), Some(v4)).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let size6 = 1usize << (128 - v6.prefix_len());
        let size4 = 1usize << (32 - v4.prefix_len());
        let mut reserved = HashSet::new();
        for p in &picks {
            let a6 = IpAddr::V6(Ipv6Addr::from(u128::from(v6.network()) + p.index(size6) as u128));
            let a4 = IpAddr::V4(Ipv4Addr::from(u32::from(v4.network()) + p.index(size4) as u32));
            for a in [a6, a4] {
                if reserved.insert(a) { pools.reserve(a).unwrap(); } else { prop_assert!(pools.reserve(a).is_err()); }
            }
        }
        let req = PodRequest { ip_algo: algo, ..request(&[]) };
        for i in 0..70u32 {
            let name = (i % 7).to_string();
            let Ok(a) = pools.allocate(&req, &pod(&name), &mut rng) else { continue };
            for addr in a.held() {
                prop_assert!(!reserved.contains(&addr), "reserved {} handed out", addr);
            }
        }
    }

    #[test]
    fn exhaustion_is_an_error_not_a_panic_or_a_loop(
        (v6, v4) in small_node(), algo in algo(), seed in any::<u64>(),
    ) {
        let mut pools = Pools::new(Some(v6), Some(v4)).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let v4_only = request(&[("ipv6", "false")]);
        let v6_only = PodRequest { ip_algo: algo, ..request(&[("ipv4", "false")]) };
        let cap4 = pools.stats().capacity4;
        let mut ok4 = 0u64;
        let mut errors = 0;
        for _ in 0..cap4 + 5 {
            match pools.allocate(&v4_only, &pod("p"), &mut rng) {
                Ok(_) => ok4 += 1,
                Err(e) => { prop_assert!(matches!(e, Error::Exhausted { family: Family::V4, .. }), "{}", e); errors += 1; }
            }
        }
        prop_assert_eq!((ok4, errors), (cap4, 5));
        let cap6 = pools.stats().capacity6;
        let mut ok6 = 0u128;
        for i in 0..cap6 + 5 {
            let name = (i % 3).to_string();
            match pools.allocate(&v6_only, &pod(&name), &mut rng) {
                Ok(_) => ok6 += 1,
                Err(e) => prop_assert!(
                    matches!(e, Error::Exhausted { family: Family::V6, .. } | Error::Annotation { .. }),
                    "unexpected error {}", e
                ),
            }
        }
        prop_assert!(ok6 <= cap6);
        // a purely random spec fills the whole small pool
        if v6_only.ip_algo == IpAlgo::random() {
            prop_assert_eq!(ok6, cap6);
        }
    }

    #[test]
    fn effective_cidr_rule_matrix(
        node_bits in any::<u128>(), node_len in 0u8..=128,
        ann in prop::collection::vec((any::<u128>(), 0u8..=128, any::<bool>()), 0..4),
    ) {
        let node = Ipv6Net::new(Ipv6Addr::from(node_bits), node_len).unwrap().trunc();
        // half of the annotation CIDRs are derived from the node's bits so they overlap
        let ann: Vec<Ipv6Net> = ann.into_iter().map(|(bits, len, near)| {
            let base = if near { node_bits ^ (bits >> 100) } else { bits };
            Ipv6Net::new(Ipv6Addr::from(base), len).unwrap().trunc()
        }).collect();
        let model = if ann.is_empty() { Some(node) } else {
            ann.iter().find_map(|a| {
                let (a_lo, a_hi) = (u128::from(a.network()), u128::from(a.broadcast()));
                let (n_lo, n_hi) = (u128::from(node.network()), u128::from(node.broadcast()));
                if a_lo <= n_lo && n_hi <= a_hi { Some(node) }        // equal or supernet
                else if n_lo <= a_lo && a_hi <= n_hi { Some(*a) }     // subnet
                else { None }                                          // disjoint
            })
        };
        match effective_cidr6(&ann, node) {
            Ok(got) => prop_assert_eq!(Some(got), model),
            Err(e) => {
                prop_assert_eq!(model, None);
                prop_assert!(matches!(e, Error::NoEffectiveCidr { family: Family::V6, .. }), "unexpected error {}", e);
            }
        }
        // the IPv4 rule is the same function
        let node4 = Ipv4Net::new(Ipv4Addr::from((node_bits >> 96) as u32), node_len.min(32)).unwrap().trunc();
        let ann4: Vec<Ipv4Net> = ann.iter().map(|a| Ipv4Net::new(Ipv4Addr::from((u128::from(a.network()) >> 96) as u32), a.prefix_len().min(32)).unwrap().trunc()).collect();
        if let Ok(got) = effective_cidr4(&ann4, node4) {
            prop_assert!(got == node4 || node4.contains(&got));
        }
    }
}
