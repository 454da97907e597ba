//! A pod's kernel state over rtnetlink: veth pair, addresses, routes, sysctls and
//! blackholes — set up, read back for CHECK, torn down.
//!
//! Does I/O: enters network namespaces (on short-lived dedicated threads) and
//! talks netlink. The layout is DESIGN §5: a veth `flockXXXXXXXX` in the
//! node's namespace with `fe80::1/64`, `proxy_arp` and forwarding, the peer
//! named `ifName` in the pod with its addresses (no DAD) and default routes via
//! `fe80::1` and `169.254.1.1` (or, for a secondary network's attachment, routes for its own
//! space only), `/128` and `/32` host routes, ECMP routes for
//! anycast addresses and blackholes for the node CIDRs.
//!
//! Everything is idempotent: [`setup`] twice yields the same state,
//! [`teardown`] of something already gone succeeds.
//!
#![doc = include_str!("../README.md")]

// Modules, each using only those listed before it: error; nl and ns (netlink requests, the
// one place that enters namespaces); host (veth names, the node's links and blackholes);
// anycast (ECMP routes over pods' host veths); pod (one attachment: setup, check, detach,
// teardown); uplink (the node's interface toward its BGP neighbor).
mod anycast;
mod check;
mod error;
mod host;
mod nl;
mod ns;
mod pod;
mod uplink;

pub use anycast::{AnycastMember, sync_anycast};
pub use check::{Mismatch, Side, check};
pub use error::{Error, Result, TeardownError};
pub use host::{
    HOST_IF_PREFIX, HostIface, HostRoute, ensure_blackholes, host_ifname, host_routes,
    list_host_ifaces, remove_blackhole, remove_host_iface,
};
pub use nl::RouteSpec;
pub use ns::{NodeNs, NsTarget, blocking_in_netns};
pub use pod::{GATEWAY4, GATEWAY6, PodSpec, SetupOutcome, SetupTiming, detach, setup, teardown};
pub use uplink::{Toward, Uplink, uplink};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_ifname_is_flock_and_fnv1a32_of_container_nul_ifname() {
        // FNV-1a 32 (offset basis 0x811c9dc5, prime 0x01000193) of the bytes "\0",
        // "a\0eth0" and "a\0eth0\0\0\0\0\x01"
        assert_eq!(host_ifname("", "", 0), "flock050c5d1f");
        assert_eq!(host_ifname("a", "eth0", 0), "flockfa042165");
        assert_eq!(host_ifname("a", "eth0", 1), "flockfc4b715c");
        assert!(host_ifname(&"x".repeat(200), "eth0", 0).len() <= 15);
    }

    #[test]
    fn two_attachments_of_one_container_get_two_names() {
        let id = "9f8e7d6c5b4a39281706f5e4d3c2b1a0";
        let eth0 = host_ifname(id, "eth0", 0);
        let net1 = host_ifname(id, "net1", 0);
        assert_ne!(eth0, net1);
        // the separator keeps ("ab", "c") and ("a", "bc") apart
        assert_ne!(host_ifname("ab", "c", 0), host_ifname("a", "bc", 0));
        // attempts give further distinct names of the same form
        let names: std::collections::BTreeSet<String> =
            (0..16).map(|n| host_ifname(id, "eth0", n)).collect();
        assert_eq!(names.len(), 16);
        assert!(
            names
                .iter()
                .all(|n| n.len() == 13 && n.starts_with(HOST_IF_PREFIX))
        );
        assert!(!names.contains(&net1));
    }

    #[test]
    fn pod_routes_follow_the_families() {
        let spec = PodSpec {
            container_id: "c".into(),
            host_if: host_ifname("c", "eth0", 0),
            netns: "/run/netns/x".into(),
            if_name: "eth0".into(),
            mtu: 1500,
            addresses: vec!["2001:db8::1/128".parse().unwrap()],
            anycast: vec![],
            default_route: true,
            routes: vec![],
        };
        let routes: Vec<String> = spec.pod_routes().iter().map(|r| r.to_string()).collect();
        assert_eq!(routes, ["default via fe80::1 dev eth0"]);
        let spec = PodSpec {
            addresses: vec!["10.1.0.5/32".parse().unwrap()],
            ..spec
        };
        let routes: Vec<String> = spec.pod_routes().iter().map(|r| r.to_string()).collect();
        assert_eq!(
            routes,
            [
                "169.254.1.1/32 dev eth0",
                "default via 169.254.1.1 dev eth0"
            ]
        );
        assert_eq!(
            spec.host_routes()[0].to_string(),
            format!("10.1.0.5/32 dev {}", host_ifname("c", "eth0", 0))
        );
    }

    #[test]
    fn a_secondary_attachment_routes_only_its_space() {
        let spec = PodSpec {
            container_id: "c".into(),
            host_if: host_ifname("c", "net1", 0),
            netns: "/run/netns/x".into(),
            if_name: "net1".into(),
            mtu: 1500,
            addresses: vec![
                "2001:db8:5::7/128".parse().unwrap(),
                "10.245.1.7/32".parse().unwrap(),
            ],
            anycast: vec![],
            default_route: false,
            routes: vec![
                "2001:db8:5::/48".parse().unwrap(),
                "10.245.0.0/16".parse().unwrap(),
                "10.246.0.0/16".parse().unwrap(),
            ],
        };
        let routes: Vec<String> = spec.pod_routes().iter().map(|r| r.to_string()).collect();
        // no default route, and no link route to 169.254.1.1 (eth0's): the gateway on-link
        assert_eq!(
            routes,
            [
                "2001:db8:5::/48 via fe80::1 dev net1",
                "10.245.0.0/16 via 169.254.1.1 dev net1 onlink",
                "10.246.0.0/16 via 169.254.1.1 dev net1 onlink",
            ]
        );
        // a family the attachment has no address of gets no routes
        let v6_only = PodSpec {
            addresses: vec!["2001:db8:5::7/128".parse().unwrap()],
            ..spec
        };
        assert_eq!(v6_only.pod_routes().len(), 1);
    }
}
