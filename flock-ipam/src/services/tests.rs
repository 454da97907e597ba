//! Properties (proptest) and worked examples of Service announcing and LoadBalancer
//! assignment.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proptest::prelude::*;

use super::*;
use crate::Family;

fn key(name: &str) -> ServiceKey {
    ServiceKey::new("default", name)
}

fn net(text: &str) -> IpNet {
    text.parse().unwrap()
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn ranges() -> ServiceRanges {
    ServiceRanges {
        load_balancer: vec![net("2001:db8:5::/120"), net("203.0.113.0/28")],
        external_ips: vec![net("2001:db8:e::/64")],
        cluster_ips: vec![],
    }
}

fn lb(name: &str, ingress: &[&str], policy: TrafficPolicy) -> ServiceFacts {
    ServiceFacts {
        key: key(name),
        service_type: ServiceType::LoadBalancer,
        ingress_ips: ingress.iter().map(|s| (*s).to_owned()).collect(),
        external_traffic_policy: policy,
        ..ServiceFacts::default()
    }
}

fn endpoint(name: &str, node: &str, ready: bool) -> EndpointFacts {
    EndpointFacts {
        service: key(name),
        node: Some(node.to_owned()),
        ready,
    }
}

#[test]
fn cluster_policy_addresses_are_announced_from_every_node() {
    let svc = [lb(
        "web",
        &["2001:db8:5::1", "203.0.113.1"],
        TrafficPolicy::Cluster,
    )];
    for node in ["a", "b"] {
        let out = service_routes(node, &ranges(), &svc, &[]);
        assert_eq!(
            out.routes,
            BTreeSet::from([net("2001:db8:5::1/128"), net("203.0.113.1/32")])
        );
        assert!(out.refused.is_empty());
    }
}

#[test]
fn local_policy_addresses_follow_ready_endpoints() {
    let svc = [lb("web", &["2001:db8:5::1"], TrafficPolicy::Local)];
    let eps = [endpoint("web", "a", true), endpoint("web", "b", false)];
    let a = service_routes("a", &ranges(), &svc, &eps);
    let b = service_routes("b", &ranges(), &svc, &eps);
    assert_eq!(a.routes, BTreeSet::from([net("2001:db8:5::1/128")]));
    assert!(b.routes.is_empty(), "b's only endpoint is not ready");
    // The last ready endpoint goes: the route is withdrawn.
    let gone = service_routes("a", &ranges(), &svc, &eps[1..]);
    assert!(gone.routes.is_empty());
}

#[test]
fn addresses_outside_the_pool_are_refused_by_service_and_address() {
    let mut svc = lb(
        "web",
        &["2001:db8:99::1", "::1", "bogus"],
        TrafficPolicy::Cluster,
    );
    svc.external_ips = vec!["198.51.100.7".into(), "2001:db8:e::7".into()];
    let out = service_routes("a", &ranges(), &[svc], &[]);
    assert_eq!(out.routes, BTreeSet::from([net("2001:db8:e::7/128")]));
    let lines: Vec<String> = out
        .refused
        .iter()
        .map(|r| format!("{} {} {}: {}", r.service, r.field, r.address, r.reason))
        .collect();
    insta::assert_debug_snapshot!(lines);
}

#[test]
fn ingress_of_a_service_that_is_no_longer_a_load_balancer_is_not_announced() {
    let mut svc = lb("web", &["2001:db8:5::1"], TrafficPolicy::Cluster);
    svc.service_type = ServiceType::NodePort;
    let out = service_routes("a", &ranges(), &[svc], &[]);
    assert!(out.routes.is_empty() && out.refused.is_empty());
}

#[test]
fn cluster_ip_range_is_one_aggregate_and_internal_local_adds_host_routes() {
    let r = ServiceRanges {
        cluster_ips: vec![net("fd97::/108")],
        ..ranges()
    };
    let svc = ServiceFacts {
        key: key("dns"),
        cluster_ips: vec!["fd97::a".into()],
        internal_traffic_policy: TrafficPolicy::Local,
        ..ServiceFacts::default()
    };
    let eps = [endpoint("dns", "a", true)];
    let a = service_routes("a", &r, std::slice::from_ref(&svc), &eps);
    let b = service_routes("b", &r, std::slice::from_ref(&svc), &eps);
    assert_eq!(
        a.routes,
        BTreeSet::from([net("fd97::/108"), net("fd97::a/128")])
    );
    assert_eq!(b.routes, BTreeSet::from([net("fd97::/108")]));
}

fn request(name: &str, families: &[Family], requested: &[&str], current: &[&str]) -> LbRequest {
    LbRequest {
        key: key(name),
        families: families.to_vec(),
        requested: requested.iter().map(|s| ip(s)).collect(),
        current: current.iter().map(|s| ip(s)).collect(),
    }
}

#[test]
fn dual_stack_services_get_the_lowest_free_address_of_each_family_ipv6_first() {
    let cidrs = [net("203.0.113.0/30"), net("2001:db8:5::/126")];
    let plan = assign_lb_addresses(
        &cidrs,
        &[
            request("a", &[Family::V6, Family::V4], &[], &[]),
            request("b", &[Family::V4, Family::V6], &[], &[]),
            request("c", &[], &[], &[]),
        ],
    );
    assert_eq!(
        plan.addresses[&key("a")],
        vec![ip("2001:db8:5::1"), ip("203.0.113.1")]
    );
    assert_eq!(
        plan.addresses[&key("b")],
        vec![ip("203.0.113.2"), ip("2001:db8:5::2")]
    );
    assert_eq!(plan.addresses[&key("c")], vec![ip("2001:db8:5::3")]);
    assert!(plan.problems.is_empty(), "{:?}", plan.problems);
    // A fourth IPv6 Service finds the /126 full (its zero host is never handed out).
    let full = assign_lb_addresses(
        &cidrs,
        &[
            request("a", &[Family::V6, Family::V4], &[], &[]),
            request("b", &[Family::V4, Family::V6], &[], &[]),
            request("c", &[], &[], &[]),
            request("d", &[Family::V6], &[], &[]),
        ],
    );
    assert_eq!(full.addresses[&key("d")], Vec::<IpAddr>::new());
    insta::assert_debug_snapshot!(full.problems);
}

#[test]
fn requested_addresses_are_honoured_or_refused_with_a_reason() {
    let cidrs = [net("2001:db8:5::/120"), net("203.0.113.0/28")];
    let plan = assign_lb_addresses(
        &cidrs,
        &[
            request("a", &[Family::V6], &["2001:db8:5::42"], &[]),
            request("b", &[Family::V6], &["2001:db8:5::42"], &[]),
            request("c", &[Family::V6], &["2001:db8:99::1"], &[]),
            request("d", &[Family::V6], &["203.0.113.5"], &[]),
            request("e", &[Family::V6], &["2001:db8:5::7", "2001:db8:5::8"], &[]),
        ],
    );
    assert_eq!(plan.addresses[&key("a")], vec![ip("2001:db8:5::42")]);
    assert_eq!(plan.addresses[&key("b")], Vec::<IpAddr>::new());
    insta::assert_debug_snapshot!(plan.problems);
}

#[test]
fn a_held_address_survives_a_restart_and_a_gone_service_frees_its_address() {
    let cidrs = [net("2001:db8:5::/120")];
    // Restart: the status says b holds ::1 even though a sorts first.
    let plan = assign_lb_addresses(
        &cidrs,
        &[
            request("a", &[], &[], &[]),
            request("b", &[], &[], &["2001:db8:5::1"]),
        ],
    );
    assert_eq!(plan.addresses[&key("b")], vec![ip("2001:db8:5::1")]);
    assert_eq!(plan.addresses[&key("a")], vec![ip("2001:db8:5::2")]);
    // b goes: its address is free for the next Service.
    let after = assign_lb_addresses(
        &cidrs,
        &[
            request("a", &[], &[], &["2001:db8:5::2"]),
            request("c", &[], &[], &[]),
        ],
    );
    assert_eq!(after.addresses[&key("c")], vec![ip("2001:db8:5::1")]);
}

// ---- properties ----

fn arb_policy() -> impl Strategy<Value = TrafficPolicy> {
    prop_oneof![Just(TrafficPolicy::Cluster), Just(TrafficPolicy::Local)]
}

/// Addresses around two small ranges of each family, some outside, some not addresses.
fn arb_address_text() -> impl Strategy<Value = String> {
    prop_oneof![
        (0u16..40).prop_map(|i| format!("2001:db8:5::{i:x}")),
        (0u16..40).prop_map(|i| format!("2001:db8:e::{i:x}")),
        (0u8..40).prop_map(|i| format!("203.0.113.{i}")),
        (0u8..4).prop_map(|i| format!("198.51.100.{i}")),
        Just("fe80::1".to_owned()),
        Just("not-an-ip".to_owned()),
    ]
}

fn arb_services() -> impl Strategy<Value = Vec<ServiceFacts>> {
    prop::collection::vec(
        (
            0usize..6,
            prop_oneof![
                Just(ServiceType::ClusterIp),
                Just(ServiceType::NodePort),
                Just(ServiceType::LoadBalancer),
                Just(ServiceType::ExternalName)
            ],
            prop::collection::vec(arb_address_text(), 0..3),
            prop::collection::vec(arb_address_text(), 0..3),
            arb_policy(),
        ),
        0..8,
    )
    .prop_map(|v| {
        let mut seen = BTreeSet::new();
        v.into_iter()
            .filter(|(n, ..)| seen.insert(*n))
            .map(|(n, t, ext, ing, p)| ServiceFacts {
                key: key(&format!("s{n}")),
                service_type: t,
                external_ips: ext,
                ingress_ips: ing,
                external_traffic_policy: p,
                ..ServiceFacts::default()
            })
            .collect()
    })
}

fn arb_endpoints() -> impl Strategy<Value = Vec<EndpointFacts>> {
    prop::collection::vec((0usize..6, 0usize..3, any::<bool>()), 0..12).prop_map(|v| {
        v.into_iter()
            .map(|(s, n, ready)| EndpointFacts {
                service: key(&format!("s{s}")),
                node: Some(format!("n{n}")),
                ready,
            })
            .collect()
    })
}

fn arb_lb_requests() -> impl Strategy<Value = Vec<LbRequest>> {
    let fam = prop_oneof![
        Just(vec![]),
        Just(vec![Family::V6]),
        Just(vec![Family::V4]),
        Just(vec![Family::V6, Family::V4]),
        Just(vec![Family::V4, Family::V6]),
    ];
    let addr = prop_oneof![
        (0u128..20).prop_map(|i| IpAddr::V6(Ipv6Addr::from(0x2001_0db8_0005_u128 << 80 | i))),
        (0u32..20).prop_map(|i| IpAddr::V4(Ipv4Addr::from(0xcb00_7100 | i))),
    ];
    prop::collection::vec(
        (
            0usize..10,
            fam,
            prop::collection::vec(addr.clone(), 0..2),
            prop::collection::vec(addr, 0..3),
        ),
        0..10,
    )
    .prop_map(|v| {
        let mut seen = BTreeSet::new();
        v.into_iter()
            .filter(|(n, ..)| seen.insert(*n))
            .map(|(n, families, requested, current)| LbRequest {
                key: key(&format!("s{n}")),
                families,
                requested,
                current,
            })
            .collect()
    })
}

fn lb_cidrs() -> Vec<IpNet> {
    vec![net("2001:db8:5::/124"), net("203.0.113.0/29")]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Every announced route is an allowed aggregate or a host route inside the allowed
    /// ranges; every address given is announced, refused, or held back by a Local policy
    /// on a node without a ready endpoint — and the outcome ignores input order.
    #[test]
    fn announced_routes_are_allowed_accounted_for_and_order_free(
        services in arb_services(),
        endpoints in arb_endpoints(),
        node in 0usize..3,
        shuffle in any::<u64>(),
    ) {
        let node = format!("n{node}");
        let r = ranges();
        let out = service_routes(&node, &r, &services, &endpoints);
        for route in &out.routes {
            prop_assert!(matches!(route, IpNet::V6(n) if n.prefix_len() == 128)
                || matches!(route, IpNet::V4(n) if n.prefix_len() == 32));
            let a = route.network();
            prop_assert!(r.load_balancer.iter().chain(&r.external_ips).any(|c| c.contains(&a)));
        }
        for s in &services {
            let local = endpoints.iter().any(|e| e.service == s.key && e.ready && e.node.as_deref() == Some(node.as_str()));
            let mut given: Vec<(&'static str, &String)> = Vec::new();
            if s.service_type != ServiceType::ExternalName {
                given.extend(s.external_ips.iter().map(|a| ("spec.externalIPs", a)));
                if s.service_type == ServiceType::LoadBalancer {
                    given.extend(s.ingress_ips.iter().map(|a| ("status.loadBalancer.ingress", a)));
                }
            }
            for (field, text) in given {
                let refused = out.refused.iter().any(|f| f.service == s.key && f.field == field && &f.address == text);
                let announced = text.parse::<IpAddr>().is_ok_and(|a| out.routes.contains(&IpNet::from(a)));
                let held_back = s.external_traffic_policy == TrafficPolicy::Local && !local;
                prop_assert!(refused || announced || held_back, "{} {field} {text} lost", s.key);
                if s.external_traffic_policy == TrafficPolicy::Local && !local && !refused {
                    // Another Service may announce the same address; none of this one's own.
                    let shared = services.iter().any(|o| o.key != s.key && (o.external_ips.contains(text) || o.ingress_ips.contains(text)));
                    prop_assert!(shared || !announced, "{} announced {text} without a local endpoint", s.key);
                }
            }
        }
        // Refusals do not depend on the node: one event per address is enough.
        let other = service_routes("elsewhere", &r, &services, &endpoints);
        prop_assert_eq!(&other.refused, &out.refused);
        // Order free.
        let mut s2 = services.clone();
        let mut e2 = endpoints.clone();
        let k = (shuffle as usize) % (s2.len().max(1));
        s2.rotate_left(k);
        e2.reverse();
        prop_assert_eq!(service_routes(&node, &r, &s2, &e2), out);
    }

    /// No address on two Services, every address usable and inside the CIDRs, one per
    /// wanted family at most; the plan is a fixed point (fed back as the current addresses
    /// it changes nothing) and a new Service never moves another's address.
    #[test]
    fn lb_addresses_are_unique_inside_stable_and_order_free(
        requests in arb_lb_requests(),
        newcomer in arb_lb_requests(),
        shuffle in any::<u64>(),
    ) {
        let cidrs = lb_cidrs();
        let plan = assign_lb_addresses(&cidrs, &requests);
        let mut seen = BTreeSet::new();
        for (k, addrs) in &plan.addresses {
            let req = requests.iter().find(|r| &r.key == k).unwrap();
            let fams = if req.families.is_empty() { vec![Family::V6] } else { req.families.clone() };
            let mut fam_seen = BTreeSet::new();
            for a in addrs {
                prop_assert!(seen.insert(*a), "{a} given twice");
                prop_assert!(cidrs.iter().any(|c| c.contains(a) && c.network() != *a));
                let f = if a.is_ipv6() { Family::V6 } else { Family::V4 };
                prop_assert!(fams.contains(&f));
                prop_assert!(fam_seen.insert(a.is_ipv6()));
                if let Some(r) = req.requested.iter().find(|r| r.is_ipv6() == a.is_ipv6()) {
                    prop_assert_eq!(r, a, "a requested address is given or nothing");
                }
            }
            // Families left out are explained.
            if addrs.len() < fams.len() {
                prop_assert!(plan.problems.iter().any(|p| &p.service == k));
            }
        }
        // Fixed point.
        let again: Vec<LbRequest> = requests.iter().map(|r| LbRequest {
            current: plan.addresses[&r.key].clone(),
            ..r.clone()
        }).collect();
        prop_assert_eq!(&assign_lb_addresses(&cidrs, &again).addresses, &plan.addresses);
        // Newcomers never move a held address.
        let mut more = again.clone();
        more.extend(newcomer.into_iter()
            .filter(|n| !again.iter().any(|r| r.key == n.key))
            .map(|n| LbRequest { key: ServiceKey::new("other", n.key.name.clone()), current: vec![], ..n }));
        let grown = assign_lb_addresses(&cidrs, &more);
        for (k, addrs) in &plan.addresses {
            prop_assert_eq!(&grown.addresses[k], addrs);
        }
        // Order free.
        let mut shuffled = requests.clone();
        let k = (shuffle as usize) % shuffled.len().max(1);
        shuffled.rotate_left(k);
        prop_assert_eq!(assign_lb_addresses(&cidrs, &shuffled), plan);
    }
}
