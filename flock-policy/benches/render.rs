//! A node of a big cluster: 10 000 pods in 100 namespaces (100 of them on this node),
//! 1 000 policies. Times `build` (resolving selectors into sets and per-pod chains) and
//! `render`, and prints the ruleset's size.
//!
//! `cargo bench -p flock-policy --bench render`

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use criterion::{Criterion, criterion_group, criterion_main};
use flock_policy::{
    LabelSelector, NamedPort, Namespace, Peer, Pod, Policy, PolicyTypes, PortSpec, Protocol, Rule,
    build,
};

const NAMESPACES: usize = 100;
const PODS: usize = 10_000;
/// One pod in this many runs on this node (one per namespace).
const LOCAL_EVERY: usize = 100;
const POLICIES: usize = 1_000;

fn cluster() -> (Vec<Policy>, Vec<Namespace>, Vec<Pod>) {
    let namespaces = (0..NAMESPACES)
        .map(|n| Namespace {
            name: format!("ns{n}"),
            labels: [("team".into(), format!("t{}", n % 10))].into(),
            log: None,
        })
        .collect();
    let pods = (0..PODS)
        .map(|i| {
            let i32_ = u32::try_from(i).unwrap();
            Pod {
                namespace: format!("ns{}", i % NAMESPACES),
                name: format!("pod{i}"),
                labels: [
                    ("app".into(), format!("app{}", (i / NAMESPACES) % 10)),
                    ("role".into(), format!("r{}", i % 5)),
                ]
                .into_iter()
                .collect::<flock_policy::Labels>()
                .into(),
                addresses: vec![
                    IpAddr::V6(Ipv6Addr::from(
                        0x2001_0db8_0000_0000_0000_0000_0000_0000u128 | u128::from(i32_),
                    )),
                    IpAddr::V4(Ipv4Addr::from(0x0af4_0000 | i32_)),
                ],
                host_if: ((i / NAMESPACES) % LOCAL_EVERY == i % NAMESPACES)
                    .then(|| format!("flock{i:08x}")),
                ports: vec![NamedPort {
                    name: "http".into(),
                    protocol: Protocol::Tcp,
                    port: 8080,
                }],
            }
        })
        .collect();
    let policies = (0..POLICIES)
        .map(|k| Policy {
            namespace: format!("ns{}", k % NAMESPACES),
            name: format!("pol{k}"),
            pod_selector: LabelSelector::labels([(
                "app",
                format!("app{}", (k / NAMESPACES) % 10).as_str(),
            )]),
            policy_types: Some(PolicyTypes {
                ingress: true,
                egress: k % 4 == 0,
            }),
            ingress: vec![
                Rule {
                    peers: vec![Peer::pods(LabelSelector::labels([(
                        "role",
                        format!("r{}", k % 5).as_str(),
                    )]))],
                    ports: vec![
                        PortSpec::name(Protocol::Tcp, "http"),
                        PortSpec::number(Protocol::Tcp, 443),
                    ],
                },
                Rule {
                    peers: vec![
                        Peer::namespaces(LabelSelector::labels([(
                            "team",
                            format!("t{}", k % 10).as_str(),
                        )])),
                        Peer::ip_block("10.0.0.0/8", &["10.244.0.0/16"]),
                    ],
                    ports: vec![PortSpec::range(Protocol::Tcp, 9000, 9100)],
                },
            ],
            egress: vec![Rule {
                peers: vec![Peer::Pods {
                    namespace_selector: Some(LabelSelector::all()),
                    pod_selector: Some(LabelSelector::labels([("app", "app0")])),
                }],
                ports: vec![
                    PortSpec::number(Protocol::Udp, 53),
                    PortSpec::name(Protocol::Tcp, "http"),
                ],
            }],
        })
        .collect();
    (policies, namespaces, pods)
}

fn bench(c: &mut Criterion) {
    let (policies, namespaces, pods) = cluster();
    let ruleset = build(&policies, &namespaces, &pods).expect("valid");
    let script = ruleset.render();
    let elements: usize = ruleset
        .sets
        .values()
        .map(|s| match &s.elements {
            flock_policy::Elements::Addrs(a) => a.len(),
            flock_policy::Elements::Ranges(r) => r.len(),
            flock_policy::Elements::AddrPorts(a) => a.len(),
        })
        .sum();
    eprintln!(
        "ruleset: {} bytes, {} lines, {} sets with {elements} elements, {} ingress and {} egress chains",
        script.len(),
        script.lines().count(),
        ruleset.sets.len(),
        ruleset.ingress.len(),
        ruleset.egress.len(),
    );
    // to time the kernel's side: `FLOCK_POLICY_SCRIPT=/tmp/big.nft cargo bench …`, then
    // `ip netns exec NS nft -f /tmp/big.nft` in a namespace of your own
    if let Some(path) = std::env::var_os("FLOCK_POLICY_SCRIPT") {
        std::fs::write(path, &script).expect("write the script");
    }
    let mut g = c.benchmark_group("10k pods, 1k policies");
    g.sample_size(10);
    g.bench_function("build", |b| {
        b.iter(|| {
            build(
                black_box(&policies),
                black_box(&namespaces),
                black_box(&pods),
            )
        })
    });
    g.bench_function("render", |b| b.iter(|| black_box(&ruleset).render()));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
