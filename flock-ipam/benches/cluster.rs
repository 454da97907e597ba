//! Cluster pools: one plan over 5,000 nodes in 50 rack pools (each a /48 cut into /64s and
//! a /18 into /26s): all new (a cluster's first reconcile), all assigned but 10 (a steady
//! reconcile: nodes joining), and 5,000 nodes in one /32 cut into /64s. Goal: a few ms.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::net::{Ipv4Addr, Ipv6Addr};

use criterion::{Criterion, criterion_group, criterion_main};
use flock_ipam::{
    ClusterNode, ClusterPool, ClusterState, NodeAssignment, NodeSelector, PoolCidr4,
    plan_node_prefixes,
};
use ipnet::{Ipv4Net, Ipv6Net};

const RACKS: u32 = 50;
const NODES: u32 = 5_000;

fn racks() -> Vec<ClusterPool> {
    (0..RACKS)
        .map(|r| ClusterPool {
            name: format!("rack{r:02}"),
            cidr6: Ipv6Net::new(Ipv6Addr::new(0x2001, 0xdb8, r as u16, 0, 0, 0, 0, 0), 48).unwrap(),
            node_prefix6: 64,
            ipv4: Some(PoolCidr4 {
                cidr: Ipv4Net::new(Ipv4Addr::from(0x0a00_0000u32 | (r << 14)), 18).unwrap(),
                node_prefix: 26,
            }),
            selector: NodeSelector::labels([("rack", format!("r{r:02}").as_str())]),
        })
        .collect()
}

fn nodes(racks: u32) -> Vec<ClusterNode> {
    (0..NODES)
        .map(|n| ClusterNode {
            name: format!("node{n:05}"),
            labels: BTreeMap::from([("rack".to_owned(), format!("r{:02}", n % racks))]),
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("plan_node_prefixes");
    let pools = racks();
    let all = nodes(RACKS);
    group.bench_function("5000 nodes, 50 racks, all new", |b| {
        b.iter(|| {
            let plan = plan_node_prefixes(black_box(&ClusterState {
                pools: &pools,
                nodes: &all,
                ..ClusterState::default()
            }));
            assert_eq!(plan.new.len(), NODES as usize);
        })
    });
    let first = plan_node_prefixes(&ClusterState {
        pools: &pools,
        nodes: &all,
        ..ClusterState::default()
    });
    let held: Vec<NodeAssignment> = first.new[10..].to_vec();
    group.bench_function("5000 nodes, 50 racks, 10 joining", |b| {
        b.iter(|| {
            let plan = plan_node_prefixes(black_box(&ClusterState {
                pools: &pools,
                nodes: &all,
                assignments: &held,
                ..ClusterState::default()
            }));
            assert_eq!(plan.new.len(), 10);
        })
    });
    let one = [ClusterPool {
        name: "cluster".into(),
        cidr6: "2001:db8::/32".parse().unwrap(),
        node_prefix6: 64,
        ipv4: None,
        selector: NodeSelector::default(),
    }];
    group.bench_function("5000 nodes, one /32 into /64s", |b| {
        b.iter(|| {
            let plan = plan_node_prefixes(black_box(&ClusterState {
                pools: &one,
                nodes: &all,
                ..ClusterState::default()
            }));
            assert_eq!(plan.pools[0].ipv6.capacity, 1 << 32);
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
