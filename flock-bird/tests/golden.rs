//! Golden configurations: each rendered file is snapshotted (insta) and must
//! pass real BIRD's parser (`bird -p -c FILE`, Debian's `bird2`).

use std::process::Command;

use flock_bird::{BfdTiming, BirdModel, Community, GracefulRestart, NeighborSpec, Timers, render};

fn neighbor(address: &str, asn: u64) -> NeighborSpec {
    NeighborSpec {
        address: address.into(),
        asn,
        ..Default::default()
    }
}

/// Renders, snapshots and has BIRD parse the configuration.
fn golden(name: &str, model: BirdModel) {
    let conf = render(&model.validate().expect("golden model is valid"));
    bird_parses(&conf);
    insta::assert_snapshot!(name, conf);
}

fn bird_parses(conf: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("bird.conf");
    std::fs::write(&path, conf).expect("write bird.conf");
    let out = Command::new("bird")
        .arg("-p")
        .arg("-c")
        .arg(&path)
        .output()
        .expect("run `bird -p` (install Debian's bird2)");
    assert!(
        out.status.success(),
        "bird -p refused the configuration: {}{}\n{conf}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn one_ipv6_neighbor() {
    golden(
        "one_ipv6_neighbor",
        BirdModel {
            router_id: "10.0.0.1".into(),
            asn: 64512,
            neighbors: vec![neighbor("2001:db8::fe", 65000)],
            cidrs: vec!["2001:db8:0:1::/64".parse().unwrap()],
            ..Default::default()
        },
    );
}

#[test]
fn dual_stack_two_neighbors_password_bfd() {
    golden(
        "dual_stack_two_neighbors_password_bfd",
        BirdModel {
            router_id: "10.0.0.2".into(),
            asn: 64512,
            neighbors: vec![
                NeighborSpec {
                    name: Some("tor_b".into()),
                    password: Some("s3cret tor b".into()),
                    timers: Some(Timers::FAST),
                    ..neighbor("2001:db8:ff::fd", 65000)
                },
                NeighborSpec {
                    bfd: true,
                    password: Some("s3cret".into()),
                    timers: Some(Timers {
                        hold: 90,
                        keepalive: 30,
                        connect_retry: 5,
                        connect_delay: 2,
                    }),
                    ..neighbor("2001:db8:ff::fe", 65000)
                },
            ],
            graceful_restart: Some(120),
            cidrs: vec![
                "2001:db8:0:2::/64".parse().unwrap(),
                "10.244.2.0/24".parse().unwrap(),
            ],
            addresses: vec!["2001:db8:0:2::17".parse().unwrap()],
            communities: vec![
                Community::Standard(64512, 100),
                Community::Large(64512, 1, 2),
            ],
            ..Default::default()
        },
    );
}

#[test]
fn anycast_and_fixed_addresses() {
    golden(
        "anycast_and_fixed_addresses",
        BirdModel {
            router_id: "10.0.0.3".into(),
            asn: 64512,
            neighbors: vec![NeighborSpec {
                multihop: Some(2),
                bfd: true,
                source_address: Some("2001:db8:100::3".parse().unwrap()),
                ..neighbor("2001:db8:100::1", 64512)
            }],
            cidrs: vec![
                "2001:db8:0:3::/64".parse().unwrap(),
                "10.244.3.0/24".parse().unwrap(),
            ],
            // Inside the CIDRs (dropped: the aggregate covers them) and
            // outside (announced on their own).
            addresses: vec![
                "2001:db8:0:3::9".parse().unwrap(),
                "2001:db8:beef::10".parse().unwrap(),
                "10.244.3.9".parse().unwrap(),
                "172.16.5.10".parse().unwrap(),
            ],
            anycast: vec![
                "2001:db8:face::53".parse().unwrap(),
                "2001:db8:0:3::53".parse().unwrap(),
                "100.64.0.53".parse().unwrap(),
            ],
            ..Default::default()
        },
    );
}

#[test]
fn node_with_no_pods() {
    golden(
        "node_with_no_pods",
        BirdModel {
            router_id: "10.0.0.4".into(),
            asn: 4_200_000_004,
            neighbors: vec![
                neighbor("2001:db8:ff::fe", 4_200_000_000),
                neighbor("2001:db8:ff::fd", 4_200_000_000),
            ],
            cidrs: vec![
                "2001:db8:0:4::/64".parse().unwrap(),
                "10.244.4.0/24".parse().unwrap(),
            ],
            import_default: true,
            ..Default::default()
        },
    );
}

#[test]
fn ipv4_only_node() {
    golden(
        "ipv4_only_node",
        BirdModel {
            router_id: "10.0.0.5".into(),
            asn: 64512,
            neighbors: vec![NeighborSpec {
                timers: Some(Timers::FAST),
                ..neighbor("192.168.0.1", 65000)
            }],
            cidrs: vec!["10.244.5.0/24".parse().unwrap()],
            addresses: vec!["172.16.0.5".parse().unwrap()],
            anycast: vec!["100.64.0.1".parse().unwrap()],
            graceful_restart: Some(60),
            ..Default::default()
        },
    );
}

/// A node that announces nothing of its own (no CIDR, no address): empty prefix sets,
/// still learning both families.
#[test]
fn node_that_announces_nothing() {
    golden(
        "node_that_announces_nothing",
        BirdModel {
            router_id: "10.0.0.6".into(),
            asn: 64512,
            neighbors: vec![neighbor("2001:db8:ff::fe", 65000)],
            ..Default::default()
        },
    );
}

/// Graceful restart per neighbor: the node default (on, 120 s), one neighbor
/// with a shorter restart time and long-lived graceful restart, one with it off.
#[test]
fn graceful_restart_per_neighbor_and_long_lived() {
    golden(
        "graceful_restart_per_neighbor_and_long_lived",
        BirdModel {
            router_id: "10.0.0.7".into(),
            asn: 64512,
            neighbors: vec![
                neighbor("2001:db8:ff::fe", 65000),
                NeighborSpec {
                    graceful_restart: Some(GracefulRestart::On {
                        restart_time: 30,
                        long_lived_stale_time: Some(3600),
                    }),
                    ..neighbor("2001:db8:ff::fd", 65000)
                },
                NeighborSpec {
                    graceful_restart: Some(GracefulRestart::Off),
                    ..neighbor("2001:db8:ff::fc", 65000)
                },
            ],
            graceful_restart: Some(120),
            cidrs: vec!["2001:db8:0:7::/64".parse().unwrap()],
            ..Default::default()
        },
    );
}

/// BFD at 100 ms x 3 on one neighbor, BIRD's default timing on another.
#[test]
fn bfd_timing() {
    golden(
        "bfd_timing",
        BirdModel {
            router_id: "10.0.0.8".into(),
            asn: 64512,
            neighbors: vec![
                NeighborSpec {
                    bfd: true,
                    bfd_timing: Some(BfdTiming {
                        interval_ms: 100,
                        multiplier: 3,
                    }),
                    ..neighbor("2001:db8:ff::fe", 65000)
                },
                NeighborSpec {
                    bfd: true,
                    ..neighbor("2001:db8:ff::fd", 65000)
                },
            ],
            graceful_restart: Some(120),
            cidrs: vec!["2001:db8:0:8::/64".parse().unwrap()],
            ..Default::default()
        },
    );
}

/// Link-local (unnumbered) peering, carrying both families: one peer at a
/// known link-local address on eth0, any link-local peer on eth1 (dynamic).
#[test]
fn link_local_neighbors() {
    golden(
        "link_local_neighbors",
        BirdModel {
            router_id: "10.0.0.9".into(),
            asn: 64512,
            neighbors: vec![
                NeighborSpec {
                    interface: Some("eth0".into()),
                    password: Some("s3cret".into()),
                    ..neighbor("fe80::1", 65000)
                },
                NeighborSpec {
                    interface: Some("eth1".into()),
                    bfd: true,
                    ..neighbor("", 65000)
                },
            ],
            graceful_restart: Some(120),
            cidrs: vec![
                "2001:db8:0:9::/64".parse().unwrap(),
                "10.244.9.0/24".parse().unwrap(),
            ],
            ..Default::default()
        },
    );
}

/// A node being drained: every route carries GRACEFUL_SHUTDOWN (65535:0).
#[test]
fn graceful_shutdown() {
    golden(
        "graceful_shutdown",
        BirdModel {
            router_id: "10.0.0.10".into(),
            asn: 64512,
            neighbors: vec![neighbor("2001:db8:ff::fe", 65000)],
            graceful_restart: Some(120),
            graceful_shutdown: true,
            communities: vec![Community::Standard(64512, 100)],
            cidrs: vec!["2001:db8:0:10::/64".parse().unwrap()],
            anycast: vec!["2001:db8:face::53".parse().unwrap()],
            ..Default::default()
        },
    );
}

/// The renderer's largest output, the one the bench measures, also parses.
#[test]
fn ten_thousand_routes_parse() {
    let addresses = (0..10_000u32)
        .map(|i| {
            std::net::Ipv6Addr::from(0x2001_0db8_00ff_0000_0000_0000_0000_0000u128 | u128::from(i))
                .into()
        })
        .collect();
    let model = BirdModel {
        router_id: "10.0.0.6".into(),
        asn: 64512,
        neighbors: vec![neighbor("2001:db8::fe", 65000)],
        cidrs: vec!["2001:db8:0:6::/64".parse().unwrap()],
        addresses,
        ..Default::default()
    };
    bird_parses(&render(&model.validate().unwrap()));
}

#[test]
fn service_routes_lb_external_and_cluster_ip_range() {
    golden(
        "service_routes_lb_external_and_cluster_ip_range",
        BirdModel {
            router_id: "10.0.0.4".into(),
            asn: 64512,
            neighbors: vec![neighbor("2001:db8::fe", 65000)],
            cidrs: vec![
                "2001:db8:0:4::/64".parse().unwrap(),
                "10.244.4.0/24".parse().unwrap(),
            ],
            // In any order, with a repeat: LoadBalancer addresses of both families, an
            // external IP and the cluster-IP range as one aggregate.
            services: vec![
                "203.0.113.1/32".parse().unwrap(),
                "2001:db8:5::1/128".parse().unwrap(),
                "fd97::/108".parse().unwrap(),
                "2001:db8:e::7/128".parse().unwrap(),
                "2001:db8:5::1/128".parse().unwrap(),
            ],
            ..Default::default()
        },
    );
}

#[test]
fn service_routes_only_an_ipv4_service_on_an_ipv6_node() {
    // The node has no IPv4 CIDR; an IPv4 LoadBalancer address brings the IPv4 channel
    // (extended next hop over the IPv6 session).
    golden(
        "service_routes_only_an_ipv4_service_on_an_ipv6_node",
        BirdModel {
            router_id: "10.0.0.5".into(),
            asn: 64512,
            neighbors: vec![neighbor("2001:db8::fe", 65000)],
            cidrs: vec!["2001:db8:0:5::/64".parse().unwrap()],
            services: vec!["203.0.113.9/32".parse().unwrap()],
            ..Default::default()
        },
    );
}
