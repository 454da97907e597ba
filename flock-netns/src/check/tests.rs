//! The CHECK diff over snapshots: no kernel, no root.

use std::net::{IpAddr, Ipv4Addr};

use netlink_packet_route::route::RouteType;

use super::*;
use crate::pod::GATEWAY4;

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn spec() -> PodSpec {
    PodSpec {
        container_id: "c1".into(),
        host_if: "flock0a1b2c3d".into(),
        netns: "/run/netns/test-pod".into(),
        if_name: "eth0".into(),
        mtu: 1500,
        addresses: vec![net("2001:db8:1::5/128"), net("10.1.0.5/32")],
        anycast: vec!["2001:db8:53::53".parse().unwrap()],
        default_route: true,
        routes: vec![],
    }
}

fn link(index: u32, name: &str) -> Link {
    Link {
        index,
        name: name.into(),
        mac: "02:00:00:00:00:01".into(),
        up: true,
        mtu: 1500,
        peer_index: None,
        kind_veth: true,
        addr_gen_none: true,
        proxy_arp: true,
    }
}

fn addr(s: &str) -> Addr {
    Addr {
        net: net(s),
        nodad: true,
    }
}

fn route(dst: &str, nexthops: Vec<(u32, Option<IpAddr>)>) -> KRoute {
    KRoute {
        dst: net(dst),
        kernel: false,
        static_proto: true,
        kind: RouteType::Unicast,
        nexthops,
    }
}

/// A pod exactly as `setup` leaves it: host veth 7, pod interface 2.
fn intact() -> Observed {
    let s = spec();
    let sysctls = host_sysctls(&s.host_if)
        .into_iter()
        .map(|x| {
            let v = x.want.to_owned();
            (x, v)
        })
        .collect();
    Observed {
        host: Some(HostObserved {
            link: link(7, &s.host_if),
            addrs: vec![addr("fe80::1/64")],
            sysctls,
        }),
        host_lo: Some(Some(vec![addr("127.0.0.1/8"), addr("169.254.1.1/32")])),
        host_routes: vec![
            route("2001:db8:1::5/128", vec![(7, None)]),
            route("10.1.0.5/32", vec![(7, None)]),
            route("2001:db8:53::53/128", vec![(7, None), (9, None)]),
        ],
        pod: Some(PodObserved {
            link: Some((
                link(2, "eth0"),
                vec![
                    addr("2001:db8:1::5/128"),
                    addr("10.1.0.5/32"),
                    addr("fe80::42/64"),
                    addr("2001:db8:53::53/128"),
                ],
            )),
            routes: vec![
                route("::/0", vec![(2, Some(IpAddr::V6(GATEWAY6)))]),
                route("169.254.1.1/32", vec![(2, None)]),
                route("0.0.0.0/0", vec![(2, Some(IpAddr::V4(GATEWAY4)))]),
            ],
            lo: Vec::new(),
        }),
    }
}

#[test]
fn an_intact_pod_has_no_mismatch() {
    assert_eq!(diff(&spec(), &intact()), []);
}

#[test]
fn each_difference_is_named_with_its_side() {
    let mut seen = intact();
    // Host: the veth down with the wrong MTU, forwarding off.
    let host = seen.host.as_mut().unwrap();
    host.link.up = false;
    host.link.mtu = 9000;
    host.sysctls[0].1 = "0".into();
    // Pod: an address gone, a stray one, the default route of IPv4 gone.
    let pod = seen.pod.as_mut().unwrap();
    let (_, addrs) = pod.link.as_mut().unwrap();
    addrs.retain(|a| a.net != net("10.1.0.5/32"));
    addrs.push(addr("2001:db8:1::99/128"));
    pod.routes.retain(|r| r.dst != net("0.0.0.0/0"));
    let got = diff(&spec(), &seen);
    let sysctl_path = host_sysctls("flock0a1b2c3d")[0].path.clone();
    assert_eq!(
        got,
        [
            Mismatch::LinkDown {
                side: Side::Host,
                ifname: "flock0a1b2c3d".into()
            },
            Mismatch::Mtu {
                side: Side::Host,
                ifname: "flock0a1b2c3d".into(),
                expected: 1500,
                actual: 9000
            },
            Mismatch::Sysctl {
                side: Side::Host,
                path: sysctl_path,
                expected: "1".into(),
                actual: "0".into()
            },
            Mismatch::AddressMissing {
                side: Side::Pod,
                ifname: "eth0".into(),
                addr: net("10.1.0.5/32")
            },
            Mismatch::AddressExtra {
                side: Side::Pod,
                ifname: "eth0".into(),
                addr: net("2001:db8:1::99/128")
            },
            Mismatch::RouteMissing {
                side: Side::Pod,
                route: RouteSpec {
                    dst: net("0.0.0.0/0"),
                    gateway: Some(IpAddr::V4(Ipv4Addr::new(169, 254, 1, 1))),
                    dev: "eth0".into(),
                    onlink: false,
                }
            },
        ]
    );
}

#[test]
fn a_missing_host_veth_misses_its_routes_too() {
    let mut seen = intact();
    seen.host = None;
    let got = diff(&spec(), &seen);
    assert!(got.contains(&Mismatch::LinkMissing {
        side: Side::Host,
        ifname: "flock0a1b2c3d".into()
    }));
    // Routes through a veth that is gone count as missing, the anycast next hop too.
    assert_eq!(
        got.iter()
            .filter(|m| matches!(
                m,
                Mismatch::RouteMissing {
                    side: Side::Host,
                    ..
                }
            ))
            .count(),
        2
    );
    assert!(
        got.iter()
            .any(|m| matches!(m, Mismatch::AnycastNexthopMissing { .. }))
    );
}

#[test]
fn a_gone_namespace_or_interface_ends_the_pod_side() {
    let mut seen = intact();
    seen.pod = None;
    assert_eq!(
        diff(&spec(), &seen),
        [Mismatch::NetnsMissing {
            path: "/run/netns/test-pod".into()
        }]
    );
    let mut seen = intact();
    seen.pod.as_mut().unwrap().link = None;
    assert_eq!(
        diff(&spec(), &seen),
        [Mismatch::LinkMissing {
            side: Side::Pod,
            ifname: "eth0".into()
        }]
    );
}

#[test]
fn an_anycast_address_on_lo_still_counts_and_one_nowhere_is_missing() {
    let mut seen = intact();
    let pod = seen.pod.as_mut().unwrap();
    let (_, addrs) = pod.link.as_mut().unwrap();
    addrs.retain(|a| a.net != net("2001:db8:53::53/128"));
    assert!(lo_needed(&spec(), addrs));
    assert_eq!(
        diff(&spec(), &seen),
        [Mismatch::AddressMissing {
            side: Side::Pod,
            ifname: "eth0".into(),
            addr: net("2001:db8:53::53/128")
        }]
    );
    // Where agents before 0.2 put it.
    seen.pod.as_mut().unwrap().lo = vec![addr("2001:db8:53::53/128")];
    assert_eq!(diff(&spec(), &seen), []);
    // On its interface, lo is not even read.
    assert!(!lo_needed(&spec(), &intact().pod.unwrap().link.unwrap().1));
}

#[test]
fn the_ipv4_gateway_must_be_on_the_hosts_lo() {
    let mut seen = intact();
    seen.host_lo = Some(Some(vec![addr("127.0.0.1/8")]));
    assert_eq!(
        diff(&spec(), &seen),
        [Mismatch::AddressMissing {
            side: Side::Host,
            ifname: "lo".into(),
            addr: net("169.254.1.1/32")
        }]
    );
    seen.host_lo = Some(None);
    assert_eq!(
        diff(&spec(), &seen),
        [Mismatch::LinkMissing {
            side: Side::Host,
            ifname: "lo".into()
        }]
    );
}
