//! A pod's kernel state over rtnetlink: veth pair, addresses, routes, sysctls and
//! blackholes — set up, read back for CHECK, torn down.
//!
//! Does I/O: enters network namespaces (on short-lived dedicated threads) and
//! talks netlink. The layout is DESIGN §5: a veth `flockXXXXXXXX` in the
//! node's namespace with `fe80::1/64`, `proxy_arp` and forwarding, the peer
//! named `ifName` in the pod with its addresses (no DAD) and default routes via
//! `fe80::1` and `169.254.1.1`, `/128` and `/32` host routes, ECMP routes for
//! anycast addresses and blackholes for the node CIDRs.
//!
//! Everything is idempotent: [`setup`] twice yields the same state,
//! [`teardown`] of something already gone succeeds.
//!
#![doc = include_str!("../README.md")]

mod error;
mod host;
mod nl;
mod ns;
mod pod;

pub use error::{Error, Result, TeardownError};
pub use host::{
    AnycastMember, HostIface, HostRoute, ensure_blackholes, host_routes, list_host_ifaces,
    remove_blackhole, remove_host_iface, sync_anycast,
};
pub use nl::RouteSpec;
pub use ns::{NodeNs, NsTarget};
pub use pod::{
    GATEWAY4, GATEWAY6, HOST_IF_PREFIX, Mismatch, PodSpec, SetupOutcome, Side, check, detach,
    host_ifname, setup, teardown,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_ifname_is_flock_and_fnv1a32() {
        // FNV-1a 32 of "" is the offset basis, of "a" is 0xe40c292c.
        assert_eq!(host_ifname(""), "flock811c9dc5");
        assert_eq!(host_ifname("a"), "flocke40c292c");
        assert_eq!(host_ifname("foobar"), "flockbf9cf968");
        assert!(host_ifname(&"x".repeat(200)).len() <= 15);
    }

    #[test]
    fn pod_routes_follow_the_families() {
        let spec = PodSpec {
            container_id: "c".into(),
            netns: "/run/netns/x".into(),
            if_name: "eth0".into(),
            mtu: 1500,
            addresses: vec!["2001:db8::1/128".parse().unwrap()],
            anycast: vec![],
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
            format!("10.1.0.5/32 dev {}", host_ifname("c"))
        );
    }
}
