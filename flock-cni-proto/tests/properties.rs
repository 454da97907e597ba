//! Property tests: every result version round-trips through JSON, and
//! downgrading 1.1.0 → 1.0.0 → 0.4.0 keeps every field the
//! older version has.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use flock_cni_proto::{CniResult, CniVersion, Dns, Interface, IpConfig, IpPrefix, Route};
use proptest::prelude::*;
use serde_json::json;

fn ip() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<u32>().prop_map(|n| IpAddr::V4(Ipv4Addr::from(n))),
        any::<u128>().prop_map(|n| IpAddr::V6(Ipv6Addr::from(n))),
    ]
}

fn prefix() -> impl Strategy<Value = IpPrefix> {
    (ip(), any::<u8>()).prop_map(|(a, l)| {
        let max = if a.is_ipv4() { 33 } else { 129 };
        IpPrefix::new(a, l % max).expect("length within the family")
    })
}

fn text() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9:./_ \"\\\\\u{e9}-]{0,20}"
}

fn opt<T: std::fmt::Debug + Clone>(
    s: impl Strategy<Value = T>,
) -> impl Strategy<Value = Option<T>> {
    proptest::option::of(s)
}

fn interface() -> impl Strategy<Value = Interface> {
    (
        text(),
        opt(text()),
        opt(any::<u32>()),
        opt(text()),
        opt(text()),
        opt(text()),
    )
        .prop_map(|(name, mac, mtu, sandbox, socket_path, pci_id)| Interface {
            name,
            mac,
            mtu,
            sandbox,
            socket_path,
            pci_id,
        })
}

fn route() -> impl Strategy<Value = Route> {
    (
        prefix(),
        opt(ip()),
        opt(any::<u32>()),
        opt(any::<u32>()),
        opt(any::<u32>()),
        opt(any::<u32>()),
        opt(any::<u8>()),
    )
        .prop_map(|(dst, gw, mtu, advmss, priority, table, scope)| Route {
            dst,
            gw,
            mtu,
            advmss,
            priority,
            table,
            scope,
        })
}

fn result() -> impl Strategy<Value = CniResult> {
    (
        proptest::collection::vec(interface(), 0..3),
        proptest::collection::vec((prefix(), opt(ip()), opt(0u32..4)), 0..4),
        proptest::collection::vec(route(), 0..4),
        (
            proptest::collection::vec(text(), 0..2),
            opt(text()),
            proptest::collection::vec(text(), 0..2),
            proptest::collection::vec(text(), 0..2),
        ),
    )
        .prop_map(
            |(interfaces, ips, routes, (nameservers, domain, search, options))| CniResult {
                interfaces,
                ips: ips
                    .into_iter()
                    .map(|(address, gateway, interface)| IpConfig {
                        address,
                        gateway,
                        interface,
                    })
                    .collect(),
                routes,
                dns: Dns {
                    nameservers,
                    domain,
                    search,
                    options,
                },
            },
        )
}

proptest! {
    #[test]
    fn result_round_trips_in_every_version(r in result()) {
        for v in CniVersion::SUPPORTED {
            let value = r.to_value(v);
            prop_assert_eq!(&value["cniVersion"], &json!(v.to_string()));
            // Through text, as it travels.
            let text = serde_json::to_string(&value).unwrap();
            let back = CniResult::from_value(&serde_json::from_str(&text).unwrap()).unwrap();
            prop_assert_eq!(back, r.restricted_to(v));
        }
        // 1.1.0 is the superset: nothing is lost.
        prop_assert_eq!(CniResult::from_value(&r.to_value(CniVersion::V1_1_0)).unwrap(), r.clone());
    }

    #[test]
    fn downgrade_chain_keeps_what_older_versions_have(r in result()) {
        let v11 = r.to_value(CniVersion::V1_1_0);
        let v10 = CniResult::convert(&v11, CniVersion::V1_0_0).unwrap();
        let v04 = CniResult::convert(&v10, CniVersion::V0_4_0).unwrap();
        // Byte-for-byte what a direct rendering in each version gives.
        prop_assert_eq!(&v10, &r.to_value(CniVersion::V1_0_0));
        prop_assert_eq!(&v04, &r.to_value(CniVersion::V0_4_0));
        // Every 0.4.0 field survives, and each ip carries its family.
        let back = CniResult::from_value(&v04).unwrap();
        prop_assert_eq!(&back, &r.restricted_to(CniVersion::V0_4_0));
        for (ip, parsed) in v04["ips"].as_array().into_iter().flatten().zip(&back.ips) {
            prop_assert_eq!(ip["version"].as_str(), Some(if parsed.address.is_ipv4() { "4" } else { "6" }));
        }
        // 1.0.0 keeps names, macs, sandboxes, addresses, gateways, interface
        // indexes, route dst/gw and dns exactly.
        for (a, b) in back.interfaces.iter().zip(&r.interfaces) {
            prop_assert_eq!((&a.name, &a.mac, &a.sandbox), (&b.name, &b.mac, &b.sandbox));
        }
        prop_assert_eq!(&back.ips, &r.ips);
        prop_assert_eq!(&back.dns, &r.dns);
    }
}
