//! Validation and determinism of the model and the renderer.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use proptest::prelude::*;

use crate::{
    BfdTiming, BirdModel, Community, Error, GracefulRestart, NeighborSpec, Timers, render,
};

fn neighbor(address: &str, asn: u64) -> NeighborSpec {
    NeighborSpec {
        address: address.into(),
        asn,
        ..Default::default()
    }
}

fn base() -> BirdModel {
    BirdModel {
        router_id: "10.0.0.1".into(),
        asn: 64512,
        neighbors: vec![neighbor("2001:db8::fe", 65000)],
        cidrs: vec!["2001:db8:0:1::/64".parse().unwrap()],
        ..Default::default()
    }
}

fn err(model: &BirdModel) -> (Error, String) {
    let e = model.validate().expect_err("model should be refused");
    let msg = e.to_string();
    (e, msg)
}

#[test]
fn asn_zero_and_over_32_bits_are_refused_naming_the_field() {
    let mut m = base();
    m.asn = 0;
    let (e, msg) = err(&m);
    assert!(matches!(e, Error::Asn { value: 0, .. }));
    assert_eq!(msg, "bgp.asn 0 is not a valid AS number (1 to 4294967295)");

    let mut m = base();
    m.neighbors[0].asn = 1 << 32;
    let (_, msg) = err(&m);
    assert_eq!(
        msg,
        "bgp.neighbors[0].asn 4294967296 is not a valid AS number (1 to 4294967295)"
    );

    let mut m = base();
    m.asn = u64::from(u32::MAX);
    assert!(m.validate().is_ok(), "the largest 4-byte ASN is valid");
}

#[test]
fn router_id_must_be_a_nonzero_ipv4_address() {
    for bad in ["node1", "2001:db8::1", "", "10.0.0"] {
        let mut m = base();
        m.router_id = bad.into();
        let (e, msg) = err(&m);
        assert!(matches!(e, Error::RouterIdSyntax { .. }), "{bad}: {e:?}");
        assert!(msg.contains(&format!("{bad:?}")), "{msg}");
        assert!(std::error::Error::source(&e).is_some());
    }
    let mut m = base();
    m.router_id = "0.0.0.0".into();
    assert_eq!(err(&m).0, Error::RouterIdZero);
}

#[test]
fn neighbor_address_must_be_present_parse_and_be_unicast() {
    let mut m = base();
    m.neighbors.push(neighbor("  ", 65001));
    let (e, msg) = err(&m);
    assert_eq!(e, Error::NeighborAddressMissing { index: 1 });
    assert_eq!(msg, "bgp.neighbors[1].address is missing");

    let mut m = base();
    m.neighbors[0].address = "router.example".into();
    let (_, msg) = err(&m);
    assert!(
        msg.contains("\"router.example\" is not an IP address"),
        "{msg}"
    );

    for bad in ["fe80::1", "::1", "ff02::2", "::"] {
        let mut m = base();
        m.neighbors[0].address = bad.into();
        let (e, _) = err(&m);
        assert!(matches!(e, Error::NeighborAddressUnusable { .. }), "{bad}");
    }
}

#[test]
fn duplicate_neighbors_are_refused() {
    let mut m = base();
    m.neighbors.push(neighbor("2001:db8:0::fe", 65001));
    let (e, msg) = err(&m);
    assert_eq!(
        e,
        Error::DuplicateNeighbor {
            peer: "2001:db8::fe".into()
        }
    );
    assert!(msg.contains("2001:db8::fe is listed twice"), "{msg}");

    let mut m = base();
    m.neighbors.push(neighbor("2001:db8::fd", 65001));
    m.neighbors[0].name = Some("spine".into());
    m.neighbors[1].name = Some("spine".into());
    assert!(matches!(err(&m).0, Error::DuplicateNeighborName { .. }));
}

#[test]
fn passwords_that_cannot_be_written_are_refused_without_echoing_them() {
    for bad in ["a\"b", "a\\b", "a\nb", ""] {
        let mut m = base();
        m.neighbors[0].password = Some(bad.into());
        let (e, msg) = err(&m);
        assert!(matches!(e, Error::Password { index: 0, .. }), "{bad:?}");
        assert!(msg.contains("2001:db8::fe"), "{msg}");
        if !bad.is_empty() {
            assert!(!msg.contains(bad), "the password leaked into {msg}");
        }
    }
    let mut m = base();
    m.neighbors[0].password = Some("s3cret with spaces".into());
    assert!(m.validate().is_ok());
}

#[test]
fn neighbor_names_are_checked_or_derived() {
    for bad in ["", "1spine", "spine-1", "flock_kernel6"] {
        let mut m = base();
        m.neighbors[0].name = Some(bad.into());
        assert!(matches!(err(&m).0, Error::NeighborName { .. }), "{bad:?}");
    }
    let mut m = base();
    m.neighbors.push(neighbor("10.0.0.254", 65001));
    m.cidrs.push("10.244.1.0/24".parse().unwrap());
    let v = m.validate().unwrap();
    let names: Vec<_> = v.neighbors().iter().map(|n| n.name()).collect();
    assert_eq!(names, ["peer4_10_0_0_254", "peer6_2001_db8__fe"]);
}

#[test]
fn timers_multihop_and_sources_are_checked() {
    let mut m = base();
    m.neighbors[0].timers = Some(Timers {
        hold: 2,
        ..Timers::FAST
    });
    assert!(err(&m).1.contains("hold 2 must be 0 or at least 3"));
    m.neighbors[0].timers = Some(Timers {
        keepalive: 9,
        ..Timers::FAST
    });
    assert!(err(&m).1.contains("keepalive 9 must be below hold 9"));

    let mut m = base();
    m.neighbors[0].multihop = Some(0);
    assert!(matches!(err(&m).0, Error::Multihop { value: 0, .. }));
    m.neighbors[0].multihop = Some(2);
    m.neighbors[0].bfd = true;
    assert!(matches!(err(&m).0, Error::MultihopBfdNeedsSource { .. }));
    m.neighbors[0].source_address = Some("10.0.0.1".parse().unwrap());
    assert!(matches!(err(&m).0, Error::SourceFamily { .. }));
    m.neighbors[0].source_address = Some("2001:db8::1".parse().unwrap());
    assert!(m.validate().is_ok());
}

#[test]
fn an_ipv4_neighbor_of_an_ipv6_only_node_is_refused() {
    let mut m = base();
    m.neighbors[0].address = "192.168.0.1".into();
    assert!(matches!(err(&m).0, Error::NeighborNoFamily { .. }));
}

#[test]
fn prefixes_are_checked_and_addresses_inside_cidrs_dropped() {
    let mut m = base();
    m.cidrs.push("10.244.1.7/24".parse().unwrap());
    assert_eq!(
        err(&m).1,
        "node CIDR 10.244.1.7/24 has host bits set; did you mean 10.244.1.0/24?"
    );
    let mut m = base();
    m.cidrs.push("::/0".parse().unwrap());
    assert!(matches!(
        err(&m).0,
        Error::Unannounceable { field: "cidrs", .. }
    ));
    let mut m = base();
    m.anycast.push("fe80::1".parse().unwrap());
    assert!(matches!(
        err(&m).0,
        Error::Unannounceable {
            field: "anycast",
            ..
        }
    ));

    let mut m = base();
    m.services.push("2001:db8:5::1/120".parse().unwrap());
    assert_eq!(
        err(&m).1,
        "service route 2001:db8:5::1/120 has host bits set; did you mean 2001:db8:5::/120?"
    );
    let mut m = base();
    m.services.push("ff02::1/128".parse().unwrap());
    assert!(matches!(
        err(&m).0,
        Error::Unannounceable {
            field: "services",
            ..
        }
    ));

    let mut m = base();
    let inside: IpAddr = "2001:db8:0:1::5".parse().unwrap();
    let outside: IpAddr = "2001:db8:ff::5".parse().unwrap();
    m.addresses = vec![inside, outside, outside];
    m.anycast = vec![inside, outside];
    let v = m.validate().unwrap();
    // The anycast address inside the CIDR is still announced on its own.
    assert_eq!(
        v.host_routes(),
        [IpNet::from(inside), IpNet::from(outside)].as_slice()
    );
    assert!(!v.families().ipv4);
}

#[test]
fn a_node_that_announces_nothing_learns_both_families() {
    let mut m = base();
    m.cidrs.clear();
    let v = m.validate().unwrap();
    assert!(v.families().ipv4 && v.families().ipv6);
    let conf = render(&v);
    assert!(conf.contains("define FLOCK_OWN6 = [];"), "{conf}");
    assert!(conf.contains("extended next hop on;"));
}

#[test]
fn ipv6_sessions_carry_ipv4_with_extended_next_hop_and_ipv4_sessions_only_ipv4() {
    let mut m = base();
    m.cidrs.push("10.244.1.0/24".parse().unwrap());
    m.neighbors.push(neighbor("10.0.0.254", 65001));
    let conf = render(&m.validate().unwrap());
    let v4_session = conf
        .split("protocol bgp peer4_10_0_0_254 {")
        .nth(1)
        .and_then(|s| s.split("\n}\n").next())
        .unwrap();
    assert!(v4_session.contains("ipv4 {") && !v4_session.contains("ipv6 {"));
    assert!(!v4_session.contains("extended next hop"));
    let v6_session = conf
        .split("protocol bgp peer6_2001_db8__fe {")
        .nth(1)
        .and_then(|s| s.split("\n}\n").next())
        .unwrap();
    assert!(v6_session.contains("ipv6 {") && v6_session.contains("ipv4 {"));
    assert!(v6_session.contains("extended next hop on;"));
}

#[test]
fn import_default_is_opt_in() {
    let mut m = base();
    assert!(!render(&m.validate().unwrap()).contains("if net.len = 0 then accept;"));
    m.import_default = true;
    assert!(render(&m.validate().unwrap()).contains("if net.len = 0 then accept;"));
}

#[test]
fn link_local_neighbors_need_an_interface_and_an_interface_needs_link_local() {
    let mut m = base();
    m.neighbors[0].address = "fe80::1".into();
    let (e, msg) = err(&m);
    assert!(matches!(e, Error::NeighborAddressUnusable { .. }), "{e:?}");
    assert!(msg.contains("set interface too"), "{msg}");

    m.neighbors[0].interface = Some("eth0".into());
    let v = m.validate().unwrap();
    assert_eq!(v.neighbors()[0].name(), "peer6_fe80__1_eth0");
    assert_eq!(v.neighbors()[0].peer(), "fe80::1%eth0");

    let mut m = base();
    m.neighbors[0].interface = Some("eth0".into());
    assert_eq!(
        err(&m).1,
        "bgp.neighbors[0].interface \"eth0\" is for link-local peering, but address 2001:db8::fe is not link-local (fe80::/10); leave interface out or give the peer's link-local address"
    );

    // Without an address: any link-local peer on the interface (dynamic BGP).
    let mut m = base();
    m.neighbors[0].address = String::new();
    m.neighbors[0].interface = Some("uplink-1".into());
    let v = m.validate().unwrap();
    let n = &v.neighbors()[0];
    assert!(n.is_dynamic() && n.address().is_none());
    assert_eq!(
        (n.name(), n.peer().as_str()),
        ("peer6_uplink_1", "uplink-1")
    );
    let conf = render(&v);
    assert!(conf.contains("  interface \"uplink-1\";\n  neighbor range fe80::/10 as 65000;\n  dynamic name \"peer6_uplink_1_\";\n"), "{conf}");
    // Twice on one interface is refused; the same link-local address on two
    // interfaces is two neighbors.
    m.neighbors.push(m.neighbors[0].clone());
    assert!(matches!(err(&m).0, Error::DuplicateNeighbor { .. }));
    let mut m = base();
    for ifname in ["eth0", "eth1"] {
        m.neighbors.push(NeighborSpec {
            interface: Some(ifname.into()),
            ..neighbor("fe80::1", 65000)
        });
    }
    assert_eq!(m.validate().unwrap().neighbors().len(), 3);

    for bad in ["", "eth0\"", "a very long interface", "eth 0"] {
        let mut m = base();
        m.neighbors[0].address = String::new();
        m.neighbors[0].interface = Some(bad.into());
        assert!(
            matches!(err(&m).0, Error::NeighborInterface { .. }),
            "{bad:?}"
        );
    }
    let mut m = base();
    m.neighbors[0].address = "fe80::1".into();
    m.neighbors[0].interface = Some("eth0".into());
    m.neighbors[0].multihop = Some(2);
    assert!(matches!(err(&m).0, Error::InterfaceMultihop { .. }));
}

#[test]
fn graceful_restart_is_per_neighbor_with_the_model_default() {
    let mut m = base();
    m.graceful_restart = Some(120);
    m.neighbors.push(NeighborSpec {
        graceful_restart: Some(GracefulRestart::On {
            restart_time: 30,
            long_lived_stale_time: Some(3600),
        }),
        ..neighbor("2001:db8::fd", 65000)
    });
    m.neighbors.push(NeighborSpec {
        graceful_restart: Some(GracefulRestart::Off),
        ..neighbor("2001:db8::fc", 65000)
    });
    let v = m.validate().unwrap();
    let gr: Vec<_> = v.neighbors().iter().map(|n| n.graceful_restart()).collect();
    assert_eq!(
        gr,
        [
            GracefulRestart::Off,
            GracefulRestart::On {
                restart_time: 30,
                long_lived_stale_time: Some(3600)
            },
            GracefulRestart::On {
                restart_time: 120,
                long_lived_stale_time: None
            },
        ]
    );
    let conf = render(&v);
    assert!(conf.contains("long lived stale time 3600;"));
    assert!(conf.contains("graceful restart aware;"));

    for (time, stale, needle) in [
        (0, None, "restart time 0 is out of range"),
        (4096, None, "restart time 4096 is out of range"),
        (30, Some(0), "long-lived stale time 0 is out of range"),
        (
            30,
            Some(1 << 24),
            "long-lived stale time 16777216 is out of range",
        ),
    ] {
        let mut m = base();
        m.neighbors[0].graceful_restart = Some(GracefulRestart::On {
            restart_time: time,
            long_lived_stale_time: stale,
        });
        let (e, msg) = err(&m);
        assert!(matches!(e, Error::GracefulRestart { .. }), "{msg}");
        assert!(
            msg.starts_with("bgp.neighbors[0].gracefulRestart: "),
            "{msg}"
        );
        assert!(msg.contains(needle), "{msg}");
    }
    let mut m = base();
    m.graceful_restart = Some(0);
    assert!(err(&m).1.starts_with("bgp.gracefulRestart: restart time 0"));
    // Without any neighbor offering it, the kernel protocols do not wait for a recovery.
    let conf = render(&base().validate().unwrap());
    assert!(!conf.contains("  graceful restart on;"), "{conf}");
}

#[test]
fn bfd_timing_is_checked_and_rendered() {
    let mut m = base();
    m.neighbors[0].bfd = true;
    m.neighbors[0].bfd_timing = Some(BfdTiming {
        interval_ms: 100,
        multiplier: 3,
    });
    let conf = render(&m.validate().unwrap());
    assert!(conf.contains("protocol bfd flock_bfd {"));
    assert!(
        conf.contains("  bfd { min rx interval 100 ms; min tx interval 100 ms; multiplier 3; };\n")
    );
    for (interval_ms, multiplier, needle) in [
        (0, 3, "interval 0 ms is out of range"),
        (60_001, 3, "interval 60001 ms is out of range"),
        (100, 0, "multiplier 0 is out of range"),
    ] {
        m.neighbors[0].bfd_timing = Some(BfdTiming {
            interval_ms,
            multiplier,
        });
        let msg = err(&m).1;
        assert!(
            msg.starts_with("bgp.neighbors[0].bfd for 2001:db8::fe: "),
            "{msg}"
        );
        assert!(msg.contains(needle), "{msg}");
    }
    m.neighbors[0].bfd = false;
    m.neighbors[0].bfd_timing = Some(BfdTiming {
        interval_ms: 100,
        multiplier: 3,
    });
    assert!(err(&m).1.contains("BFD timing is set but BFD is off"));
}

#[test]
fn the_export_filter_names_exactly_what_is_announced_and_draining_marks_it() {
    let mut m = base();
    let inside: IpAddr = "2001:db8:0:1::5".parse().unwrap();
    let outside: IpAddr = "2001:db8:ff::5".parse().unwrap();
    m.addresses = vec![inside, outside];
    let conf = render(&m.validate().unwrap());
    let set = conf
        .split("define FLOCK_EXPORT6 = [")
        .nth(1)
        .and_then(|s| s.split("];").next())
        .unwrap();
    // The node CIDR exactly (no `+`: nothing longer inside it), the outside address;
    // never the pod's /128 inside the CIDR.
    assert_eq!(set, "\n  2001:db8:0:1::/64,\n  2001:db8:ff::5/128\n");
    assert!(conf.contains("  if ! (net ~ FLOCK_EXPORT6) then reject;\n"));
    assert!(!conf.contains("65535, 0"));
    m.graceful_shutdown = true;
    assert!(render(&m.validate().unwrap()).contains("  bgp_community.add((65535, 0));\n"));
}

/// A list and a permutation of it.
fn permuted<T: Clone + std::fmt::Debug>(
    list: impl Strategy<Value = Vec<T>>,
) -> impl Strategy<Value = (Vec<T>, Vec<T>)> {
    list.prop_flat_map(|v| (Just(v.clone()), Just(v).prop_shuffle()))
}

fn v6_in(prefix: u16) -> impl Strategy<Value = IpAddr> {
    (any::<u16>(), any::<u64>()).prop_map(move |(site, host)| {
        IpAddr::V6(Ipv6Addr::new(
            0x2001,
            0xdb8,
            prefix,
            site,
            (host >> 48) as u16,
            (host >> 32) as u16,
            (host >> 16) as u16,
            host as u16,
        ))
    })
}

fn v4() -> impl Strategy<Value = IpAddr> {
    (1u8..=254, any::<u8>(), 1u8..=254).prop_map(|(b, c, d)| IpAddr::V4(Ipv4Addr::new(10, b, c, d)))
}

fn cidr() -> impl Strategy<Value = IpNet> {
    prop_oneof![
        (any::<u16>(), 48u8..=64).prop_map(|(x, len)| {
            let a = Ipv6Addr::new(0x2001, 0xdb8, 0, x, 0, 0, 0, 0);
            IpNet::V6(Ipv6Net::new(a, len).unwrap().trunc())
        }),
        (any::<u8>(), 16u8..=28).prop_map(|(x, len)| {
            IpNet::V4(
                Ipv4Net::new(Ipv4Addr::new(10, x, 0, 0), len)
                    .unwrap()
                    .trunc(),
            )
        }),
    ]
}

#[test]
fn communities_parse_and_every_bad_one_is_named() {
    assert_eq!(
        "65000:100".parse::<Community>().unwrap(),
        Community::Standard(65000, 100)
    );
    assert_eq!(
        "0:0:4294967295".parse::<Community>().unwrap(),
        Community::Large(0, 0, u32::MAX)
    );
    let mut out = String::new();
    for bad in [
        "",
        "65000",
        "65000:",
        ":1",
        "a:b",
        "65000:100:1:2",
        "65536:1",
        "1:-1",
        "1: 2",
        "4294967296:1:1",
        "+1:2",
    ] {
        let e = bad.parse::<Community>().unwrap_err();
        assert!(
            matches!(&e, Error::CommunitySyntax { value, .. } if value == bad),
            "{e:?}"
        );
        out.push_str(&format!("{bad:?} => {e}\n"));
    }
    insta::assert_snapshot!(out);
}

fn community() -> impl Strategy<Value = Community> {
    prop_oneof![
        any::<(u16, u16)>().prop_map(|(a, b)| Community::Standard(a, b)),
        any::<(u32, u32, u32)>().prop_map(|(a, b, c)| Community::Large(a, b, c)),
    ]
}

fn neighbors() -> impl Strategy<Value = Vec<NeighborSpec>> {
    let one = (
        1u64..=u64::from(u32::MAX),
        any::<bool>(),
        proptest::option::of("[a-z0-9]{1,12}"),
        proptest::option::of(1u8..=8),
    );
    (
        proptest::collection::btree_set(prop_oneof![v6_in(0), v4()], 0..6),
        proptest::collection::vec(one, 6),
    )
        .prop_map(|(addrs, params)| {
            addrs
                .into_iter()
                .zip(params)
                .map(|(addr, (asn, bfd, password, multihop))| NeighborSpec {
                    address: addr.to_string(),
                    asn,
                    bfd,
                    password,
                    multihop,
                    source_address: multihop.map(|_| match addr {
                        IpAddr::V6(_) => "2001:db8::1".parse().unwrap(),
                        IpAddr::V4(_) => "10.0.0.1".parse().unwrap(),
                    }),
                    timers: bfd.then_some(Timers::FAST),
                    bfd_timing: bfd.then_some(BfdTiming {
                        interval_ms: 100,
                        multiplier: 3,
                    }),
                    graceful_restart: (asn % 3 == 0).then_some(GracefulRestart::Off),
                    interface: None,
                    name: None,
                })
                .collect()
        })
}

proptest! {
    #[test]
    fn a_community_reads_back_what_it_writes(c in community()) {
        prop_assert_eq!(c.to_string().parse::<Community>().unwrap(), c);
    }

    #[test]
    fn any_permutation_of_the_lists_renders_the_same_bytes(
        cidrs in permuted(proptest::collection::vec(cidr(), 1..6)),
        addresses in permuted(proptest::collection::vec(prop_oneof![v6_in(0xff), v4()], 0..20)),
        anycast in permuted(proptest::collection::vec(prop_oneof![v6_in(0xaa), v4()], 0..8)),
        communities in permuted(proptest::collection::vec(community(), 0..4)),
        neighbors in permuted(neighbors()),
        repeat in 0usize..3,
        graceful_restart in proptest::option::of(1u16..300),
        import_default in any::<bool>(),
    ) {
        let model = |c: &Vec<IpNet>, a: &Vec<IpAddr>, y: &Vec<IpAddr>, m: &Vec<Community>, n: &Vec<NeighborSpec>| {
            // An IPv4 CIDR so that IPv4 neighbors always have a family.
            let mut c = c.clone();
            c.push("10.255.0.0/16".parse().unwrap());
            BirdModel {
                router_id: "10.0.0.1".into(),
                asn: 64512,
                neighbors: n.clone(),
                graceful_restart,
                cidrs: c.clone(),
                addresses: a.clone(),
                anycast: y.clone(),
                communities: m.clone(),
                services: a.iter().map(|&x| IpNet::from(x)).chain(c.iter().copied()).collect(),
                import_default,
                graceful_shutdown: import_default,
            }
        };
        let original = model(&cidrs.0, &addresses.0, &anycast.0, &communities.0, &neighbors.0);
        // The permuted copy also repeats some entries: repeats are dropped.
        let mut extra = addresses.1.clone();
        extra.extend(addresses.1.iter().take(repeat).copied());
        let mut cidrs_rep = cidrs.1.clone();
        cidrs_rep.extend(cidrs.1.iter().take(repeat).copied());
        let permuted = model(&cidrs_rep, &extra, &anycast.1, &communities.1, &neighbors.1);
        let a = render(&original.validate().unwrap());
        let b = render(&permuted.validate().unwrap());
        prop_assert_eq!(a, b);
    }
}

/// Router advertisements go on the links of unnumbered neighbors only, one block per link
/// whatever the neighbors on it, never making the node a default router or announcing a
/// prefix.
#[test]
fn unnumbered_links_get_router_advertisements_and_numbered_ones_none() {
    let numbered = render(&base().validate().unwrap());
    assert!(!numbered.contains("protocol radv"), "{numbered}");

    let mut m = base();
    m.neighbors = vec![
        NeighborSpec {
            interface: Some("eth1".into()),
            ..neighbor("fe80::1", 65000)
        },
        NeighborSpec {
            interface: Some("eth0".into()),
            ..neighbor("", 65000)
        },
        NeighborSpec {
            interface: Some("eth1".into()),
            ..neighbor("fe80::2", 65001)
        },
        neighbor("2001:db8::fe", 65000),
    ];
    let conf = render(&m.validate().unwrap());
    let radv = conf
        .split("protocol radv flock_radv {\n")
        .nth(1)
        .and_then(|r| r.split("\n}\n").next())
        .expect("a radv protocol");
    let links: Vec<&str> = radv
        .lines()
        .filter_map(|l| l.trim().strip_prefix("interface \""))
        .collect();
    assert_eq!(
        links,
        ["eth0\" {", "eth1\" {"],
        "each link once, sorted:\n{radv}"
    );
    assert_eq!(radv.matches("default lifetime 0;").count(), 2, "{radv}");
    assert_eq!(
        radv.matches("prefix ::/0 { skip yes; };").count(),
        2,
        "{radv}"
    );
}
