//! Allocation speed: allocate + release of one pod in an IPv6 /64 (random and
//! ip-algo) and in an IPv4 /16 (empty and 99 % full). Goal ≤ 1 µs each.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};

use criterion::{Criterion, criterion_group, criterion_main};
use flock_embed::{Identity, IpAlgo};
use flock_ipam::{NodeDefaults, PodRequest, Pools, Want};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};

fn identity() -> Identity<'static> {
    Identity {
        namespace: "shop",
        workload: "checkout",
        image: Some("registry.example/checkout:2.4.1"),
        pod: "checkout-7d4b9c-x2x1q",
        container_id: "4f1c2e",
    }
}

fn bench(c: &mut Criterion) {
    let defaults = NodeDefaults::for_cidrs(true, true);
    let v6 = |algo: IpAlgo| PodRequest {
        ipv4: Want::No,
        ip_algo: algo,
        ..PodRequest::defaults(&defaults)
    };
    let v4 = PodRequest {
        ipv6: Want::No,
        ..PodRequest::defaults(&defaults)
    };
    let id = identity();
    let mut rng = ChaCha8Rng::seed_from_u64(42);

    let mut group = c.benchmark_group("allocate+release");
    for (name, algo) in [
        ("ipv6 /64 random", IpAlgo::random()),
        ("ipv6 /64 ip-algo workload", IpAlgo::workload()),
    ] {
        let mut pools = Pools::new(Some("2001:db8:0:1::/64".parse().unwrap()), None).unwrap();
        // a realistic node: a few hundred pods already there
        let req = v6(algo);
        for _ in 0..500 {
            pools.allocate(&req, &id, &mut rng).unwrap();
        }
        group.bench_function(name, |b| {
            b.iter(|| {
                let a = pools.allocate(black_box(&req), &id, &mut rng).unwrap();
                pools.release_allocation(&a);
            })
        });
    }

    let mut empty = Pools::new(None, Some("10.244.0.0/16".parse().unwrap())).unwrap();
    group.bench_function("ipv4 /16 empty", |b| {
        b.iter(|| {
            let a = empty.allocate(black_box(&v4), &id, &mut rng).unwrap();
            empty.release_allocation(&a);
        })
    });

    let mut full = Pools::new(None, Some("10.244.0.0/16".parse().unwrap())).unwrap();
    let capacity = full.stats().capacity4;
    while full.allocate(&v4, &id, &mut rng).is_ok() {}
    // free 1 % at scattered places
    let mut freed = 0;
    while freed < capacity / 100 {
        let host = 2 + (rng.next_u32() % (capacity as u32));
        if full.release(IpAddr::V4(Ipv4Addr::from(
            u32::from(Ipv4Addr::new(10, 244, 0, 0)) + host,
        ))) {
            freed += 1;
        }
    }
    assert_eq!(full.stats().allocated4 as u64, capacity - freed);
    group.bench_function("ipv4 /16 99% full", |b| {
        b.iter(|| {
            let a = full.allocate(black_box(&v4), &id, &mut rng).unwrap();
            full.release_allocation(&a);
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
