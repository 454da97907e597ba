//! Rendering a node with 10 000 routes (goal: at most 5 ms), and validating
//! its model, which the agent does before every render.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use criterion::{Criterion, criterion_group, criterion_main};
use flock_bird::{BirdModel, NeighborSpec, Timers, render};

/// A dual-stack node with two neighbors, 2 CIDRs and 10 000 individually
/// announced routes (7 500 IPv6, 2 500 IPv4), given in reverse order.
fn big_model() -> BirdModel {
    let mut addresses: Vec<IpAddr> = (0..7_500u32)
        .map(|i| {
            Ipv6Addr::from(0x2001_0db8_00ff_0000_0000_0000_0000_0000u128 | u128::from(i * 7919))
                .into()
        })
        .collect();
    addresses.extend((0..2_500u32).map(|i| IpAddr::V4(Ipv4Addr::from(0xac10_0000 | i))));
    addresses.reverse();
    BirdModel {
        router_id: "10.0.0.1".into(),
        asn: 64512,
        neighbors: ["2001:db8::fe", "2001:db8::fd"]
            .into_iter()
            .map(|a| NeighborSpec {
                address: a.into(),
                asn: 65000,
                bfd: true,
                timers: Some(Timers::FAST),
                ..Default::default()
            })
            .collect(),
        graceful_restart: Some(120),
        cidrs: vec![
            "2001:db8:0:1::/64".parse().unwrap(),
            "10.244.1.0/24".parse().unwrap(),
        ],
        addresses,
        ..Default::default()
    }
}

fn bench(c: &mut Criterion) {
    let model = big_model();
    let valid = model.validate().expect("valid");
    assert_eq!(valid.host_routes().len(), 10_000);
    c.bench_function("render 10k routes", |b| {
        b.iter(|| render(black_box(&valid)))
    });
    c.bench_function("validate 10k routes", |b| {
        b.iter(|| black_box(&model).validate())
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
