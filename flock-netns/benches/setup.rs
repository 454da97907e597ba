//! The kernel floor of an ADD: one dual-stack [`setup`] and one [`teardown`]
//! of a pod in a stand-in node namespace (root only: it creates namespaces).
//!
//! `cargo bench -p flock-netns --bench setup` prints criterion's estimates and
//! then p50/p99 of a plain loop of `FLOCK_BENCH_N` (default 500) cycles.
//! The pod namespace is reused: after a teardown it is empty again (the veth
//! is gone), which is exactly the state of a fresh one.

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use flock_netns::{NodeNs, PodSpec, host_ifname, setup, teardown};
use flock_testkit::{Netns, require_root};

struct Bed {
    _node: Netns,
    _pod: Netns,
    node: NodeNs,
    spec: PodSpec,
    rt: tokio::runtime::Runtime,
}

fn bed() -> Bed {
    require_root();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let node_ns = Netns::new("bnode");
    let pod = Netns::new("bpod");
    let spec = PodSpec {
        container_id: "bench-container".into(),
        host_if: host_ifname("bench-container", "eth0", 0),
        netns: pod.path(),
        if_name: "eth0".into(),
        mtu: 1500,
        addresses: vec![
            "2001:db8:b::1/128".parse().expect("v6"),
            "10.244.99.1/32".parse().expect("v4"),
        ],
        anycast: vec![],
        default_route: true,
        routes: vec![],
    };
    let node = NodeNs::at(node_ns.path());
    // open the cached node connection and set the node-wide sysctls once
    rt.block_on(async {
        setup(&node, &spec).await.expect("warm-up setup");
        teardown(&node, &spec).await.expect("warm-up teardown");
    });
    Bed {
        _node: node_ns,
        _pod: pod,
        node,
        spec,
        rt,
    }
}

fn cycle(b: &Bed) -> (Duration, Duration) {
    b.rt.block_on(async {
        let t0 = Instant::now();
        setup(&b.node, &b.spec).await.expect("setup");
        let t1 = Instant::now();
        teardown(&b.node, &b.spec).await.expect("teardown");
        (t1 - t0, t1.elapsed())
    })
}

fn bench(c: &mut Criterion) {
    let b = bed();
    let mut group = c.benchmark_group("pod");
    group.sample_size(50);
    group.measurement_time(Duration::from_secs(5));
    group.bench_function("setup_dual_stack", |bench| {
        bench.iter_custom(|iters| (0..iters).map(|_| cycle(&b).0).sum())
    });
    group.bench_function("teardown_dual_stack", |bench| {
        bench.iter_custom(|iters| (0..iters).map(|_| cycle(&b).1).sum())
    });
    group.finish();
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn percentiles() {
    let b = bed();
    let n: usize = std::env::var("FLOCK_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    let (mut setups, mut teardowns): (Vec<_>, Vec<_>) = (0..n).map(|_| cycle(&b)).unzip();
    setups.sort();
    teardowns.sort();
    for (name, v) in [("setup", &setups), ("teardown", &teardowns)] {
        println!(
            "flock-netns {name} dual-stack, n={n}: p50 {:.3} ms, p99 {:.3} ms",
            percentile(v, 0.50).as_secs_f64() * 1e3,
            percentile(v, 0.99).as_secs_f64() * 1e3
        );
    }
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    percentiles();
}
