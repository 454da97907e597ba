//! The planner's properties (proptest) and its worked examples.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;

fn node(name: &str, rack: &str) -> ClusterNode {
    ClusterNode {
        name: name.to_owned(),
        labels: [("rack".to_owned(), rack.to_owned())].into(),
    }
}

fn pool(
    name: &str,
    cidr6: &str,
    len6: u8,
    v4: Option<(&str, u8)>,
    rack: Option<&str>,
) -> ClusterPool {
    ClusterPool {
        name: name.to_owned(),
        cidr6: cidr6.parse().unwrap(),
        node_prefix6: len6,
        ipv4: v4.map(|(c, l)| PoolCidr4 {
            cidr: c.parse().unwrap(),
            node_prefix: l,
        }),
        selector: rack.map_or_else(NodeSelector::default, |r| {
            NodeSelector::labels([("rack", r)])
        }),
    }
}

fn plan(
    pools: &[ClusterPool],
    nodes: &[ClusterNode],
    kept: &[NodeAssignment],
    reserved: &[ReservedCidr],
) -> ClusterPlan {
    plan_node_prefixes(&ClusterState {
        pools,
        nodes,
        assignments: kept,
        reserved,
    })
}

fn report<'p>(p: &'p ClusterPlan, name: &str) -> &'p PoolReport {
    p.pools.iter().find(|r| r.pool == name).unwrap()
}

#[test]
fn a_rack_pool_hands_out_the_lowest_free_prefixes_of_both_families() {
    let pools = [pool(
        "rack1",
        "2001:db8:1::/48",
        64,
        Some(("10.244.0.0/16", 24)),
        Some("r1"),
    )];
    let nodes = [node("b", "r1"), node("a", "r1"), node("c", "r2")];
    let p = plan(&pools, &nodes, &[], &[]);
    let got: Vec<(String, String, String)> = p
        .new
        .iter()
        .map(|a| {
            (
                a.node.clone(),
                a.cidr6.to_string(),
                a.cidr4.unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("a".into(), "2001:db8:1::/64".into(), "10.244.0.0/24".into()),
            (
                "b".into(),
                "2001:db8:1:1::/64".into(),
                "10.244.1.0/24".into()
            ),
        ]
    );
    assert_eq!(p.unselected, ["c"]);
    let r = report(&p, "rack1");
    assert_eq!(
        r.ipv6,
        PrefixUsage {
            capacity: 65536,
            in_use: 2,
            free: 65534
        }
    );
    assert_eq!(
        r.ipv4,
        Some(PrefixUsage {
            capacity: 256,
            in_use: 2,
            free: 254
        })
    );
    assert_eq!(r.nodes, 2);
    assert!(r.problems.is_empty());
}

#[test]
fn node_prefixes_far_longer_than_the_pool() {
    // Kubernetes' allocator refuses more than 16 bits between cluster and node prefix.
    let pools = [
        pool("wide", "2001:db8::/32", 64, None, Some("r1")),
        pool("huge", "3000::/8", 120, None, Some("r2")),
    ];
    let kept = [NodeAssignment {
        node: "old".into(),
        pool: "wide".into(),
        cidr6: "2001:db8::/64".parse().unwrap(),
        cidr4: None,
    }];
    let p = plan(
        &pools,
        &[node("old", "r1"), node("a", "r1"), node("b", "r2")],
        &kept,
        &[],
    );
    assert_eq!(p.new[0].cidr6.to_string(), "2001:db8:0:1::/64");
    assert_eq!(p.new[1].cidr6.to_string(), "3000::/120");
    assert_eq!(report(&p, "wide").ipv6.capacity, 1 << 32);
    assert_eq!(report(&p, "huge").ipv6.capacity, 1 << 112);
    assert_eq!(report(&p, "huge").ipv6.free, (1 << 112) - 1);
}

#[test]
fn assignments_are_kept_and_gone_nodes_are_orphaned_not_freed() {
    let pools = [pool("rack1", "2001:db8:1::/62", 64, None, Some("r1"))];
    let kept = [
        NodeAssignment {
            node: "gone".into(),
            pool: "rack1".into(),
            cidr6: "2001:db8:1::/64".parse().unwrap(),
            cidr4: None,
        },
        NodeAssignment {
            node: "moved".into(),
            pool: "rack1".into(),
            cidr6: "2001:db8:1:2::/64".parse().unwrap(),
            cidr4: None,
        },
    ];
    // "moved" is now labelled for another rack: its prefix stays.
    let p = plan(
        &pools,
        &[node("moved", "r9"), node("new", "r1")],
        &kept,
        &[],
    );
    assert_eq!(p.kept, kept);
    assert_eq!(p.orphaned, ["gone"]);
    assert_eq!(p.new.len(), 1);
    assert_eq!(p.new[0].cidr6.to_string(), "2001:db8:1:1::/64");
    assert_eq!(
        report(&p, "rack1").ipv6,
        PrefixUsage {
            capacity: 4,
            in_use: 3,
            free: 1
        }
    );
}

#[test]
fn a_hand_written_nodeconfig_is_a_reservation_and_its_node_gets_nothing() {
    let pools = [pool("rack1", "2001:db8:1::/62", 64, None, Some("r1"))];
    let reserved = [ReservedCidr {
        node: "manual".into(),
        cidr: "2001:db8:1::/63".parse().unwrap(),
    }];
    let p = plan(
        &pools,
        &[node("manual", "r1"), node("a", "r1")],
        &[],
        &reserved,
    );
    assert_eq!(p.new.len(), 1);
    assert_eq!(p.new[0].node, "a");
    assert_eq!(p.new[0].cidr6.to_string(), "2001:db8:1:2::/64");
    assert_eq!(report(&p, "rack1").ipv6.in_use, 3);
}

#[test]
fn overlapping_pools_assign_nothing_and_name_each_other() {
    let pools = [
        pool("rack1", "2001:db8:1::/48", 64, None, Some("r1")),
        pool("rack2", "2001:db8:1:8000::/49", 64, None, Some("r2")),
        pool(
            "rack3",
            "2001:db8:3::/48",
            64,
            Some(("10.0.0.0/16", 24)),
            Some("r3"),
        ),
        pool(
            "rack4",
            "2001:db8:4::/48",
            64,
            Some(("10.0.128.0/17", 24)),
            Some("r4"),
        ),
    ];
    let nodes = [
        node("a", "r1"),
        node("b", "r2"),
        node("c", "r3"),
        node("d", "r4"),
    ];
    let p = plan(&pools, &nodes, &[], &[]);
    assert!(p.new.is_empty(), "{:?}", p.new);
    let msg = report(&p, "rack1").problems[0].message("rack1");
    assert_eq!(
        msg,
        "NodePool rack1: IPv6 CIDR 2001:db8:1::/48 overlaps NodePool rack2's 2001:db8:1:8000::/49; \
         neither assigns new prefixes until one is changed"
    );
    assert_eq!(report(&p, "rack2").problems[0].reason(), "OverlappingPools");
    let msg = report(&p, "rack4").problems[0].message("rack4");
    assert!(
        msg.contains("IPv4 CIDR 10.0.128.0/17 overlaps NodePool rack3's 10.0.0.0/16"),
        "{msg}"
    );
}

#[test]
fn a_node_in_two_pools_gets_nothing_and_both_say_so() {
    let pools = [
        pool("all", "2001:db8:1::/48", 64, None, None),
        pool("rack1", "2001:db8:2::/48", 64, None, Some("r1")),
    ];
    let p = plan(&pools, &[node("a", "r1"), node("b", "r2")], &[], &[]);
    assert_eq!(p.new.len(), 1);
    assert_eq!(p.new[0].node, "b");
    for name in ["all", "rack1"] {
        let problems = &report(&p, name).problems;
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(
            problems[0].message(name),
            format!(
                "NodePool {name}: node a is selected by NodePools all, rack1; it gets no prefix until exactly one selects it"
            )
        );
    }
}

#[test]
fn an_exhausted_pool_names_the_nodes_and_never_half_assigns() {
    // IPv6 has room for four, IPv4 for two: the third node gets neither.
    let pools = [pool(
        "rack1",
        "2001:db8:1::/62",
        64,
        Some(("10.0.0.0/23", 24)),
        Some("r1"),
    )];
    let nodes = [
        node("a", "r1"),
        node("b", "r1"),
        node("c", "r1"),
        node("d", "r1"),
    ];
    let p = plan(&pools, &nodes, &[], &[]);
    assert_eq!(
        p.new.iter().map(|a| a.node.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );
    let r = report(&p, "rack1");
    assert_eq!(
        r.ipv6,
        PrefixUsage {
            capacity: 4,
            in_use: 2,
            free: 2
        }
    );
    assert_eq!(
        r.ipv4,
        Some(PrefixUsage {
            capacity: 2,
            in_use: 2,
            free: 0
        })
    );
    assert_eq!(r.problems[0].reason(), "PoolExhausted");
    assert_eq!(
        r.problems[0].message("rack1"),
        "NodePool rack1: no free /24 left in IPv4 CIDR 10.0.0.0/23 (2 in use); node(s) c, d get no prefix"
    );
}

#[test]
fn invalid_pools_name_the_field_and_assign_nothing() {
    let pools = [
        pool("short", "2001:db8:1::/48", 40, None, Some("r1")),
        pool("long", "2001:db8:2::/48", 124, None, Some("r2")),
        pool("bits", "2001:db8:3::1/48", 64, None, Some("r3")),
        pool(
            "v4",
            "2001:db8:4::/48",
            64,
            Some(("10.0.0.0/16", 31)),
            Some("r4"),
        ),
    ];
    let nodes = [
        node("a", "r1"),
        node("b", "r2"),
        node("c", "r3"),
        node("d", "r4"),
    ];
    let p = plan(&pools, &nodes, &[], &[]);
    assert!(p.new.is_empty());
    let messages: Vec<String> = p
        .pools
        .iter()
        .flat_map(|r| r.problems.iter().map(|x| x.message(&r.pool)))
        .collect();
    assert_eq!(
        messages,
        [
            "NodePool bits: spec.cidr6 \"2001:db8:3::1/48\": has host bits set; did you mean 2001:db8:3::/48?",
            "NodePool long: spec.nodePrefix6 \"124\": must be between the pool's /48 and /120",
            "NodePool short: spec.nodePrefix6 \"40\": must be between the pool's /48 and /120",
            "NodePool v4: spec.nodePrefix4 \"31\": must be between /16 and /30",
        ]
    );
}

#[test]
fn claims_that_already_overlap_are_reported_and_kept() {
    let pools = [pool("rack1", "2001:db8:1::/62", 64, None, Some("r1"))];
    let kept = [NodeAssignment {
        node: "a".into(),
        pool: "rack1".into(),
        cidr6: "2001:db8:1::/64".parse().unwrap(),
        cidr4: None,
    }];
    let reserved = [ReservedCidr {
        node: "manual".into(),
        cidr: "2001:db8:1::/63".parse().unwrap(),
    }];
    let p = plan(
        &pools,
        &[node("a", "r1"), node("b", "r1")],
        &kept,
        &reserved,
    );
    assert_eq!(p.conflicts.len(), 1);
    assert_eq!(
        p.conflicts[0].to_string(),
        "IPv6 CIDR 2001:db8:1::/64 of node a (NodePool rack1) overlaps 2001:db8:1::/63 of hand-written NodeConfig manual; one of them must be changed by hand"
    );
    assert_eq!(p.new[0].cidr6.to_string(), "2001:db8:1:2::/64");
}

// ---- properties -------------------------------------------------------------------------

/// A small universe where pools overlap, run out and share nodes often: IPv6 pools of at
/// most 256 node prefixes inside 2001:db8::/104, IPv4 pools inside 10.0.0.0/20.
fn arb_pool(i: usize) -> impl Strategy<Value = ClusterPool> {
    (
        0u128..8,
        112u8..=118,
        0u8..=4,
        prop::option::of((0u32..8, 22u8..=26, 0u8..=4)),
        prop::option::of(0usize..3),
    )
        .prop_map(move |(k, len6, extra6, v4, rack)| {
            let base6 = (0x2001_0db8u128 << 96) | (k << 13);
            let cidr6 = Ipv6Net::new(Ipv6Addr::from(base6), len6).unwrap().trunc();
            ClusterPool {
                name: format!("pool{i}"),
                cidr6,
                node_prefix6: (len6 + extra6).min(120),
                ipv4: v4.map(|(k4, len4, extra4)| PoolCidr4 {
                    cidr: Ipv4Net::new(Ipv4Addr::from(0x0a00_0000u32 | (k4 << 9)), len4)
                        .unwrap()
                        .trunc(),
                    node_prefix: (len4 + extra4).min(30),
                }),
                selector: rack.map_or_else(NodeSelector::default, |r| {
                    NodeSelector::labels([("rack", ["r0", "r1", "r2"][r])])
                }),
            }
        })
}

#[derive(Debug, Clone)]
enum Step {
    Join { node: usize, rack: usize },
    Leave { node: usize },
    Release,
}

fn arb_step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0usize..24, 0usize..3).prop_map(|(node, rack)| Step::Join { node, rack }),
        2 => (0usize..24).prop_map(|node| Step::Leave { node }),
        1 => Just(Step::Release),
    ]
}

fn arb_world() -> impl Strategy<Value = (Vec<ClusterPool>, Vec<ReservedCidr>, Vec<Step>)> {
    (
        (1usize..5).prop_flat_map(|n| (0..n).map(arb_pool).collect::<Vec<_>>()),
        prop::collection::vec((0u128..64, 112u8..=124), 0..3),
        prop::collection::vec(arb_step(), 1..40),
    )
        .prop_map(|(pools, reserved, steps)| {
            // Hand-written NodeConfigs that do not overlap each other.
            let mut kept: Vec<ReservedCidr> = Vec::new();
            for (i, (k, len)) in reserved.into_iter().enumerate() {
                let cidr = IpNet::V6(
                    Ipv6Net::new(Ipv6Addr::from((0x2001_0db8u128 << 96) | (k << 10)), len)
                        .unwrap()
                        .trunc(),
                );
                if !kept.iter().any(|r| overlap(&r.cidr, &cidr)) {
                    kept.push(ReservedCidr {
                        node: format!("manual{i}"),
                        cidr,
                    });
                }
            }
            let reserved = kept;
            (pools, reserved, steps)
        })
}

fn claims(p: &ClusterPlan, reserved: &[ReservedCidr]) -> Vec<IpNet> {
    p.kept
        .iter()
        .chain(&p.new)
        .flat_map(|a| std::iter::once(IpNet::V6(a.cidr6)).chain(a.cidr4.map(IpNet::V4)))
        .chain(reserved.iter().map(|r| r.cidr))
        .collect()
}

/// Rotates by `seed` and reverses: another order of the same items.
fn reorder<T>(v: &mut [T], seed: u64) {
    if !v.is_empty() {
        let k = (seed % v.len() as u64) as usize;
        v.rotate_left(k);
        v.reverse();
    }
}

fn overlap(a: &IpNet, b: &IpNet) -> bool {
    a.contains(b) || b.contains(a)
}

/// The usage of one family counted the slow way: every slot against every claim.
fn brute_usage(cidr: IpNet, node_prefix: u8, claims: &[IpNet]) -> PrefixUsage {
    let slots: Vec<IpNet> = cidr.subnets(node_prefix).unwrap().collect();
    let in_use = slots
        .iter()
        .filter(|s| claims.iter().any(|c| overlap(s, c)))
        .count() as u128;
    PrefixUsage {
        capacity: slots.len() as u128,
        in_use,
        free: slots.len() as u128 - in_use,
    }
}

fn check_plan(
    pools: &[ClusterPool],
    nodes: &[ClusterNode],
    kept: &[NodeAssignment],
    reserved: &[ReservedCidr],
    p: &ClusterPlan,
) -> Result<(), TestCaseError> {
    // no prefix on two nodes: new ones overlap nothing (the given claims are disjoint here)
    let all = claims(p, reserved);
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            prop_assert!(!overlap(a, b), "{a} and {b} overlap in {p:#?}");
        }
    }
    prop_assert!(p.conflicts.is_empty());
    // an assignment never moves
    let mut sorted_kept = kept.to_vec();
    sorted_kept.sort();
    prop_assert_eq!(&p.kept, &sorted_kept);
    let by_name: BTreeMap<&str, &ClusterPool> =
        pools.iter().map(|p| (p.name.as_str(), p)).collect();
    let mut seen = BTreeSet::new();
    for a in &p.new {
        prop_assert!(seen.insert(a.node.clone()), "{} assigned twice", a.node);
        prop_assert!(!kept.iter().any(|k| k.node == a.node));
        prop_assert!(!reserved.iter().any(|r| r.node == a.node));
        let pool = by_name[a.pool.as_str()];
        let n = nodes.iter().find(|n| n.name == a.node).unwrap();
        // only the one pool that selects the node, whole and never half
        prop_assert_eq!(
            pools
                .iter()
                .filter(|p| p.selector.matches(&n.labels))
                .count(),
            1
        );
        prop_assert!(pool.cidr6.contains(&a.cidr6) && a.cidr6.prefix_len() == pool.node_prefix6);
        match (pool.ipv4, a.cidr4) {
            (Some(v4), Some(c)) => {
                prop_assert!(v4.cidr.contains(&c) && c.prefix_len() == v4.node_prefix)
            }
            (None, None) => {}
            other => prop_assert!(false, "half-assigned: {other:?}"),
        }
        let r = report(p, &a.pool);
        let blocked = r.problems.iter().any(|x| {
            matches!(
                x,
                PoolProblem::Overlaps { .. } | PoolProblem::Invalid { .. }
            )
        });
        prop_assert!(!blocked, "pool {} assigned while blocked", a.pool);
    }
    // capacity reported exactly
    for r in &p.pools {
        let pool = by_name[r.pool.as_str()];
        if r.problems
            .iter()
            .any(|x| matches!(x, PoolProblem::Invalid { .. }))
        {
            continue;
        }
        prop_assert_eq!(
            r.ipv6,
            brute_usage(IpNet::V6(pool.cidr6), pool.node_prefix6, &all)
        );
        prop_assert_eq!(
            r.ipv4,
            pool.ipv4
                .map(|v4| brute_usage(IpNet::V4(v4.cidr), v4.node_prefix, &all))
        );
        prop_assert_eq!(
            r.nodes,
            p.kept
                .iter()
                .chain(&p.new)
                .filter(|a| a.pool == r.pool)
                .count()
        );
    }
    // every node left waiting is explained
    for n in nodes {
        if p.kept.iter().chain(&p.new).any(|a| a.node == n.name)
            || reserved.iter().any(|r| r.node == n.name)
        {
            continue;
        }
        let selecting: Vec<&ClusterPool> = pools
            .iter()
            .filter(|p| p.selector.matches(&n.labels))
            .collect();
        match selecting.as_slice() {
            [] => prop_assert!(p.unselected.contains(&n.name)),
            [one] => {
                let problems = &report(p, &one.name).problems;
                let explained = problems.iter().any(|x| match x {
                    PoolProblem::Exhausted { waiting, .. } => waiting.contains(&n.name),
                    PoolProblem::Invalid { .. } | PoolProblem::Overlaps { .. } => true,
                    PoolProblem::NodeInSeveralPools { .. } => false,
                });
                prop_assert!(explained, "{} waits unexplained: {problems:?}", n.name);
            }
            several => {
                for pool in several {
                    let said = report(p, &pool.name).problems.iter().any(
                        |x| matches!(x, PoolProblem::NodeInSeveralPools { node, .. } if *node == n.name)
                    );
                    prop_assert!(said, "pool {} does not name {}", pool.name, n.name);
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Nodes join, leave and are released in any order; at every step: no prefix on two
    /// nodes, no assignment moves while its node exists, capacity is exact, every waiting
    /// node is explained, nothing is half-assigned, and the plan is a fixed point.
    #[test]
    fn prefixes_are_unique_stable_counted_and_explained((pools, reserved, steps) in arb_world()) {
        let mut nodes: BTreeMap<usize, ClusterNode> = BTreeMap::new();
        let mut held: Vec<NodeAssignment> = Vec::new();
        for step in steps {
            match step {
                Step::Join { node: n, rack } => {
                    nodes.entry(n).or_insert_with(|| node(&format!("n{n:02}"), ["r0", "r1", "r2"][rack]));
                }
                Step::Leave { node } => { nodes.remove(&node); }
                Step::Release => {}
            }
            let list: Vec<ClusterNode> = nodes.values().cloned().collect();
            let p = plan(&pools, &list, &held, &reserved);
            check_plan(&pools, &list, &held, &reserved, &p)?;
            let before: BTreeMap<String, NodeAssignment> = held.iter().map(|a| (a.node.clone(), a.clone())).collect();
            held = p.kept.iter().chain(&p.new).cloned().collect();
            if matches!(step, Step::Release) {
                held.retain(|a| !p.orphaned.contains(&a.node));
            }
            // never moves while its node exists
            for a in &held {
                if let Some(b) = before.get(&a.node) {
                    prop_assert_eq!(a, b);
                }
            }
            // a second plan over the result assigns nothing more
            let again = plan(&pools, &list, &held, &reserved);
            prop_assert!(again.new.is_empty() || again.new.iter().all(|a| !held.iter().any(|h| h.node == a.node)));
            let settled = plan(&pools, &list, &again.kept.iter().chain(&again.new).cloned().collect::<Vec<_>>(), &reserved);
            prop_assert!(settled.new.is_empty(), "not a fixed point: {:?}", settled.new);
        }
    }

    /// The same state in any order gives the same plan.
    #[test]
    fn the_plan_is_deterministic((pools, reserved, steps) in arb_world(), seed in any::<u64>()) {
        let nodes: Vec<ClusterNode> = steps.iter().filter_map(|s| match s {
            Step::Join { node: n, rack } => Some(node(&format!("n{n:02}"), ["r0", "r1", "r2"][*rack])),
            _ => None,
        }).fold(Vec::new(), |mut v, n| { if !v.iter().any(|m: &ClusterNode| m.name == n.name) { v.push(n) } v });
        let first = plan(&pools, &nodes, &[], &reserved);
        let held: Vec<NodeAssignment> = first.new.iter().take(first.new.len() / 2).cloned().collect();
        let a = plan(&pools, &nodes, &held, &reserved);
        let (mut p2, mut n2, mut h2, mut r2) = (pools.clone(), nodes.clone(), held.clone(), reserved.clone());
        reorder(&mut p2, seed); reorder(&mut n2, seed); reorder(&mut h2, seed); reorder(&mut r2, seed);
        let b = plan(&p2, &n2, &h2, &r2);
        prop_assert_eq!(a, b);
    }
}
