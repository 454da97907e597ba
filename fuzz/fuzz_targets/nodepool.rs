//! A NodePool: validated; a valid pool gives its first node a NodeConfig that validates too
//! (the controller writes only such NodeConfigs).
#![no_main]

use std::net::Ipv4Addr;

use flock_k8s_api::{NodeConfig, NodePool};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(pool) = serde_yaml::from_slice::<NodePool>(data) else {
        return;
    };
    let Ok(cluster) = pool.cluster_pool() else {
        return;
    };
    let Ok(cidr6) = ipnet::Ipv6Net::new(cluster.cidr6.network(), cluster.node_prefix6) else {
        return;
    };
    let assignment = flock_ipam::NodeAssignment {
        node: "n1".into(),
        pool: cluster.name.clone(),
        cidr6,
        cidr4: cluster
            .ipv4
            .and_then(|v| ipnet::Ipv4Net::new(v.cidr.network(), v.node_prefix).ok()),
    };
    let nc = NodeConfig {
        metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
            name: Some("n1".into()),
            annotations: pool.node_annotations(),
            ..Default::default()
        },
        spec: pool.node_config_spec(&assignment, Ipv4Addr::new(10, 0, 0, 1), &[]),
        status: None,
    };
    if let Err(e) = nc.settings() {
        panic!("a valid pool made an invalid NodeConfig: {e}");
    }
});
