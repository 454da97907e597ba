//! The lab's site: the router, the two nodes and the four pods with their names, AS numbers
//! and addresses, and the BIRD and NodeConfig files rendered from them.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::{LAB_DIR, NS_PREFIX};

pub(super) const ROUTER: &str = "flocklab-router";
const ROUTER_ASN: u32 = 65000;
pub(super) const ANYCAST6: &str = "2001:db8:53::53";
pub(super) const ANYCAST4: &str = "10.53.0.53";
/// The router's own addresses (on its loopback, announced to the nodes).
pub(super) const ROUTER_LO6: &str = "2001:db8:f0::1";
pub(super) const ROUTER_LO4: &str = "100.64.0.1";

/// One node of the lab.
pub(super) struct Node {
    pub(super) name: &'static str,
    asn: u32,
    router_id: &'static str,
    pub(super) cidr6: &'static str,
    pub(super) cidr4: &'static str,
    /// The link to the router: the router's and the node's address (/64).
    pub(super) router_addr: &'static str,
    pub(super) node_addr: &'static str,
    /// The router's end of the link.
    pub(super) router_if: &'static str,
    /// The session's TCP MD5 password: the router's configuration has it, the node reads it
    /// from a file its NodeConfig names (`passwordFile`, standalone mode).
    pub(super) password: Option<&'static str>,
    /// The link has link-local addresses only (`router_addr`, `node_addr` are `fe80::`):
    /// the session is unnumbered.
    pub(super) unnumbered: bool,
    /// BFD (100 ms x 3) on the session, at the node and at the router.
    pub(super) bfd: bool,
    /// The node offers graceful restart (`gracefulRestart.enabled`).
    pub(super) graceful_restart: bool,
    /// `spec.bgp.communities`: added to every route the node announces.
    pub(super) communities: &'static [&'static str],
}

pub(super) const NODES: [Node; 2] = [
    Node {
        name: "node1",
        asn: 64601,
        router_id: "100.64.255.11",
        cidr6: "2001:db8:a1::/64",
        cidr4: "10.101.1.0/24",
        router_addr: "2001:db8:f1:1::1",
        node_addr: "2001:db8:f1:1::2",
        router_if: "to-node1",
        password: Some("flocklab-md5"),
        unnumbered: false,
        bfd: true,
        // BFD decides: a BIRD that stops answering takes the node's routes with it at once
        // (graceful restart would keep them for its restart time).
        graceful_restart: false,
        communities: &["64601:100", "64601:7:1"],
    },
    Node {
        name: "node2",
        asn: 64602,
        router_id: "100.64.255.12",
        cidr6: "2001:db8:a2::/64",
        cidr4: "10.101.2.0/24",
        router_addr: "fe80::1",
        node_addr: "fe80::2",
        router_if: "to-node2",
        password: None,
        unnumbered: true,
        bfd: false,
        graceful_restart: true,
        communities: &[],
    },
];

/// One pod of the lab: its name, its node (index into [`NODES`]) and its annotations.
pub(super) struct Pod {
    pub(super) name: &'static str,
    pub(super) node: usize,
    pub(super) annotations: &'static [(&'static str, &'static str)],
}

pub(super) const PODS: [Pod; 4] = [
    Pod {
        name: "web-1",
        node: 0,
        annotations: &[("flock.fritzlab.net/ip-algo", "workload")],
    },
    Pod {
        name: "dns-1",
        node: 0,
        annotations: &[("flock.fritzlab.net/anycast", "2001:db8:53::53,10.53.0.53")],
    },
    Pod {
        name: "web-2",
        node: 1,
        annotations: &[("flock.fritzlab.net/ip-algo", "workload")],
    },
    Pod {
        name: "dns-2",
        node: 1,
        annotations: &[("flock.fritzlab.net/anycast", "2001:db8:53::53,10.53.0.53")],
    },
];

pub(super) fn node_ns(node: &Node) -> String {
    format!("{NS_PREFIX}{}", node.name)
}

pub(super) fn pod_ns(pod: &Pod) -> String {
    format!("{NS_PREFIX}{}", pod.name)
}

/// The router's configuration, sockets, logs.
pub(super) fn router_dir() -> PathBuf {
    Path::new(LAB_DIR).join("router")
}

pub(super) fn node_dir(node: &Node) -> PathBuf {
    Path::new(LAB_DIR).join(node.name)
}

/// The router's description, rendered for BIRD or FRR.
pub(super) fn router() -> crate::router::Router<'static> {
    crate::router::Router {
        of: "the lab",
        router_id: "100.64.255.1",
        asn: ROUTER_ASN,
        own6: ROUTER_LO6,
        own4: ROUTER_LO4,
        peers: NODES
            .iter()
            .map(|node| crate::router::Peer {
                name: node.name,
                addr: node.node_addr,
                asn: node.asn,
                interface: node.unnumbered.then_some(node.router_if),
                password: node.password,
                bfd: node.bfd,
            })
            .collect(),
        announce: Vec::new(),
        bfd_graceful: false,
    }
}

/// The node's NodeConfig; `graceful_shutdown`: with `spec.bgp.gracefulShutdown` (a drain).
pub(super) fn node_yaml(node: &Node, graceful_shutdown: bool) -> String {
    let mut options = String::new();
    if node.unnumbered {
        options.push_str(" interface: uplink,");
    }
    if node.password.is_some() {
        let _ = write!(options, " passwordFile: {},", password_file(node).display());
    }
    if node.bfd {
        options.push_str(" bfd: true,");
    }
    if !node.graceful_restart {
        options.push_str(" gracefulRestart: { enabled: false },");
    }
    let mut bgp = String::new();
    if !node.communities.is_empty() {
        let _ = writeln!(bgp, "    communities: [{}]", node.communities.join(", "));
    }
    if graceful_shutdown {
        bgp.push_str("    gracefulShutdown: true\n");
    }
    format!(
        "apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
metadata:
  name: {name}
spec:
  cidr6: {cidr6}
  cidr4: {cidr4}
  bgp:
    asn: {asn}
    routerId: {router_id}
    neighbors:
      - {{ address: \"{router}\",{options} asn: {ROUTER_ASN} }}
    timers: {{ hold: 6, keepalive: 2, connectRetry: 1 }}
{bgp}",
        name = node.name,
        cidr6 = node.cidr6,
        cidr4 = node.cidr4,
        asn = node.asn,
        router_id = node.router_id,
        router = node.router_addr,
    )
}

/// Where the node's BGP password is (standalone mode reads it from a file).
pub(super) fn password_file(node: &Node) -> PathBuf {
    node_dir(node).join("bgp.password")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lab_addresses_stay_in_documentation_and_private_ranges() {
        let conf = router().bird_conf();
        let frr = router().frr_conf().integrated();
        for node in &NODES {
            let yaml = node_yaml(node, true);
            assert!(
                yaml.contains("gracefulShutdown: true")
                    && !node_yaml(node, false).contains("gracefulShutdown")
            );
            for text in [&yaml, &conf, &frr] {
                assert!(!text.contains("fd00:"), "{text}");
                assert!(!text.contains("192.0.2."), "{text}");
            }
            assert!(node.cidr6.starts_with("2001:db8:"));
            assert!(node.cidr4.starts_with("10."));
            assert!(conf.contains(&format!("neighbor {} as {}", node.node_addr, node.asn)));
            // A link-local address is only usable with its interface.
            assert_eq!(node.node_addr.starts_with("fe80:"), node.unnumbered);
            assert_eq!(yaml.contains("interface: uplink"), node.unnumbered);
            // A password is in the router's configuration and in a file, never in the NodeConfig.
            if let Some(password) = node.password {
                assert!(conf.contains(&format!("password \"{password}\";")));
                assert!(!yaml.contains(password) && yaml.contains("passwordFile: "));
            }
        }
        assert!(ANYCAST6.starts_with("2001:db8:") && ANYCAST4.starts_with("10."));
    }
}
