use std::collections::BTreeMap;

use super::*;
use crate::IP_ALGO_ANNOTATION;

pub(crate) fn pool_yaml(name: &str, extra: &str) -> NodePool {
    let yaml = format!(
        "apiVersion: flock.fritzlab.net/v1alpha1
kind: NodePool
metadata: {{ name: {name} }}
spec:
  cidr6: 2001:db8:1::/48
  nodePrefix6: 64
{extra}"
    );
    serde_yaml::from_str(&yaml).expect("a NodePool")
}

fn refused(extra: &str) -> (String, String, String) {
    match pool_yaml("rack1", extra).cluster_pool() {
        Err(Error::InvalidNodePool {
            field,
            value,
            reason,
        }) => (field, value, reason),
        other => panic!("expected an invalid NodePool, got {other:?}"),
    }
}

#[test]
fn a_rack_pool_becomes_a_cluster_pool_and_node_configs() {
    let pool = pool_yaml(
        "rack1",
        "  cidr4: 10.244.0.0/16
  nodePrefix4: 24
  nodeSelector:
    matchLabels: { topology.kubernetes.io/zone: rack1 }
    matchExpressions: [ { key: node-role.kubernetes.io/control-plane, operator: DoesNotExist } ]
  defaults: { ipv6: true, ipv4: false }
  ipAlgo: workload
  bgp:
    asn: 64512
    neighbors:
      - { address: \"2001:db8:1::fe\", asn: 65001, bfd: true }
      - { interface: eth1, asn: 65001 }
",
    );
    let p = pool.cluster_pool().expect("valid");
    assert_eq!(p.cidr6.to_string(), "2001:db8:1::/48");
    assert_eq!(p.ipv4.unwrap().node_prefix, 24);
    let worker = BTreeMap::from([("topology.kubernetes.io/zone".to_owned(), "rack1".to_owned())]);
    assert!(p.selector.matches(&worker));
    let mut cp = worker.clone();
    cp.insert(
        "node-role.kubernetes.io/control-plane".into(),
        String::new(),
    );
    assert!(!p.selector.matches(&cp));

    let a = flock_ipam::NodeAssignment {
        node: "host1".into(),
        pool: "rack1".into(),
        cidr6: "2001:db8:1:5::/64".parse().unwrap(),
        cidr4: Some("10.244.5.0/24".parse().unwrap()),
    };
    let spec = pool.node_config_spec(&a, Ipv4Addr::new(192, 0, 2, 10), &[]);
    assert_eq!(spec.cidr6.as_deref(), Some("2001:db8:1:5::/64"));
    assert_eq!(spec.cidr4.as_deref(), Some("10.244.5.0/24"));
    let bgp = spec.bgp.as_ref().unwrap();
    assert_eq!(
        (bgp.peering.asn, bgp.router_id.as_str()),
        (64512, "192.0.2.10")
    );
    assert_eq!(bgp.peering.neighbors.len(), 2);
    assert!(bgp.peering.neighbors[0].bfd);
    assert_eq!(
        pool.node_annotations().unwrap()[IP_ALGO_ANNOTATION],
        "workload"
    );
    // What the node gets is a valid NodeConfig.
    let nc = NodeConfig {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("host1".into()),
            annotations: pool.node_annotations(),
            ..Default::default()
        },
        spec,
        status: None,
    };
    let settings = nc.settings().expect("valid");
    assert!(!settings.default_ipv4 && settings.ip_algo.is_some());
}

#[test]
fn bad_pools_name_the_field_and_the_value() {
    let (field, value, _) = refused("  cidr4: 10.244.0.0/16\n");
    assert_eq!((field.as_str(), value.as_str()), ("spec.nodePrefix4", ""));
    let (field, _, _) = refused("  nodePrefix4: 24\n");
    assert_eq!(field, "spec.cidr4");
    let (field, value, reason) = refused("  cidr4: 10.244.0.0/33\n  nodePrefix4: 24\n");
    assert_eq!(
        (field.as_str(), value.as_str()),
        ("spec.cidr4", "10.244.0.0/33")
    );
    assert!(reason.contains("not an IPv4 CIDR"), "{reason}");
    let (field, value, reason) = refused(
        "  nodeSelector: { matchExpressions: [ { key: rack, operator: Equals, values: [r1] } ] }\n",
    );
    assert_eq!(field, "spec.nodeSelector.matchExpressions[0].operator");
    assert_eq!(value, "Equals");
    assert!(reason.contains("In, NotIn, Exists or DoesNotExist"));
    let (field, _, _) =
        refused("  nodeSelector: { matchExpressions: [ { key: rack, operator: In } ] }\n");
    assert_eq!(field, "spec.nodeSelector.matchExpressions[0].values");
    let (field, value, _) = refused("  ipAlgo: \"ns:99\"\n");
    assert_eq!((field.as_str(), value.as_str()), ("spec.ipAlgo", "ns:99"));
    let (field, _, reason) = refused(
        "  bgp: { asn: 64512, neighbors: [ { address: \"2001:db8::fe\", asn: 65000, password: x } ] }\n",
    );
    assert_eq!(field, "spec.bgp.neighbors[0].password");
    assert!(reason.contains("passwordSecretRef"));
    let (field, _, reason) = refused("  defaults: { ipv4: true }\n");
    assert_eq!(field, "spec.defaults.ipv4");
    assert!(reason.contains("no spec.cidr4"), "{reason}");
}

#[test]
fn router_ids_come_from_the_node_and_are_never_zero() {
    let a = |c6: &str, c4: Option<&str>| flock_ipam::NodeAssignment {
        node: "n".into(),
        pool: "p".into(),
        cidr6: c6.parse().unwrap(),
        cidr4: c4.map(|c| c.parse().unwrap()),
    };
    let ip = Ipv4Addr::new(192, 0, 2, 7);
    assert_eq!(router_id("n", Some(ip), &a("2001:db8:1:5::/64", None)), ip);
    assert_eq!(
        router_id("n", None, &a("2001:db8:1:5::/64", Some("10.244.5.0/24"))),
        Ipv4Addr::new(10, 244, 5, 0)
    );
    // The 32 bits above the host part: 0x0001_0005 for 2001:db8:1:5::/64.
    assert_eq!(
        router_id("n", None, &a("2001:db8:1:5::/64", None)),
        Ipv4Addr::new(0, 1, 0, 5)
    );
    let zero = router_id("host7", None, &a("2001:db8::/64", None));
    assert_ne!(zero, Ipv4Addr::UNSPECIFIED);
    assert_eq!(zero, router_id("host7", None, &a("2001:db8::/64", None)));
}

#[test]
fn each_node_of_a_pool_gets_its_part_of_each_network_at_its_own_place() {
    let pool = pool_yaml(
        "rack1",
        "  cidr4: 10.244.0.0/16
  nodePrefix4: 24
  networks:
    - { name: storage, cidr6: \"2001:db8:5::/48\", nodePrefix6: 64,
        cidr4: 10.245.0.0/16, nodePrefix4: 24, routes: [\"2001:db8:55::/48\"] }
    - { name: quiet, cidr6: \"2001:db8:6::/48\", nodePrefix6: 64, announce: false }
",
    );
    pool.cluster_pool().expect("valid");
    let node = |third: u16, v4: u8| flock_ipam::NodeAssignment {
        node: "n".into(),
        pool: "rack1".into(),
        cidr6: format!("2001:db8:1:{third:x}::/64").parse().unwrap(),
        cidr4: Some(format!("10.244.{v4}.0/24").parse().unwrap()),
    };
    let spec = pool.node_config_spec(&node(0x2a, 0x07), Ipv4Addr::new(10, 0, 0, 1), &[]);
    assert_eq!(spec.networks.len(), 2);
    let storage = &spec.networks[0];
    // the node's /64 is the 42nd of the pool and its /24 the 7th: so are its storage ones
    assert_eq!(storage.cidr6.as_deref(), Some("2001:db8:5:2a::/64"));
    assert_eq!(storage.cidr4.as_deref(), Some("10.245.7.0/24"));
    assert_eq!(
        storage.routes,
        ["2001:db8:5::/48", "10.245.0.0/16", "2001:db8:55::/48"]
    );
    assert_eq!(storage.announce, None);
    assert_eq!(spec.networks[1].announce, Some(false));
    assert_eq!(spec.networks[1].cidr4, None);
    // and the NodeConfig it makes validates
    let nc = NodeConfig {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("n".into()),
            ..Default::default()
        },
        spec,
        status: None,
    };
    let settings = nc.settings().expect("valid");
    assert_eq!(settings.network("storage").unwrap().routes.len(), 3);
}

#[test]
fn a_pool_network_too_small_or_overlapping_is_refused_naming_it() {
    for (extra, field, value, reason) in [
        (
            "  networks: [ { name: s, cidr6: \"2001:db8:5::/56\", nodePrefix6: 64 } ]",
            "spec.networks[0].nodePrefix6",
            "64",
            "holds 256 node prefixes of /64, fewer than the 65536 of the pool's spec.cidr6",
        ),
        (
            "  networks: [ { name: s, cidr6: \"2001:db8:1:8000::/49\", nodePrefix6: 64 } ]",
            "spec.networks[0].cidr6",
            "2001:db8:1:8000::/49",
            "overlaps the pool's 2001:db8:1::/48",
        ),
        (
            "  networks: [ { name: s, cidr6: \"2001:db8:5::/48\" } ]",
            "spec.networks[0].nodePrefix6",
            "",
            "required with spec.networks[0].cidr6",
        ),
        (
            "  networks: [ { name: s, cidr6: \"2001:db8:5::/48\", nodePrefix6: 40 } ]",
            "spec.networks[0].nodePrefix6",
            "40",
            "within 2001:db8:5::/48",
        ),
        (
            "  networks: [ { name: S, cidr6: \"2001:db9::/32\", nodePrefix6: 48 } ]",
            "spec.networks[0].name",
            "S",
            "DNS label",
        ),
    ] {
        let (f, v, r) = refused(extra);
        assert_eq!((f.as_str(), v.as_str()), (field, value), "{extra}: {r}");
        assert!(r.contains(reason), "{extra}: {r}");
    }
}
