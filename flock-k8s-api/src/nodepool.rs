//! The `NodePool` resource (`flock.fritzlab.net/v1alpha1`, cluster-scoped): a rack's node
//! address space and BGP setup, from which the pool controller writes one NodeConfig per
//! selected Node.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::nodeconfig::{BgpPeering, FamilyDefaults, IP_ALGO_ANNOTATION, ServicesSpec};

/// A pool of node prefixes: every Node its selector matches gets a NodeConfig with the next
/// free prefix of each family and this pool's BGP settings.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "flock.fritzlab.net",
    version = "v1alpha1",
    kind = "NodePool",
    plural = "nodepools",
    shortname = "np",
    status = "NodePoolStatus",
    printcolumn = r#"{"name":"CIDR6","type":"string","jsonPath":".spec.cidr6"}"#,
    printcolumn = r#"{"name":"Per-node6","type":"integer","jsonPath":".spec.nodePrefix6"}"#,
    printcolumn = r#"{"name":"CIDR4","type":"string","jsonPath":".spec.cidr4"}"#,
    printcolumn = r#"{"name":"Nodes","type":"integer","jsonPath":".status.nodes"}"#,
    printcolumn = r#"{"name":"Free6","type":"string","jsonPath":".status.ipv6.free"}"#,
    printcolumn = r#"{"name":"Free4","type":"string","jsonPath":".status.ipv4.free"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NodePoolSpec {
    /// The IPv6 CIDR cut into node prefixes, e.g. `2001:db8:1::/48`.
    #[schemars(pattern(r"^[0-9a-fA-F:.]+/[0-9]{1,3}$"), extend("format" = "cidr"))]
    pub cidr6: String,
    /// The length of each node's IPv6 prefix, e.g. 64 (at least the pool's, at most 120; any
    /// distance from the pool's length).
    #[schemars(range(min = 1, max = 120))]
    pub node_prefix6: u8,
    /// An IPv4 CIDR cut into node prefixes, if nodes of this pool get IPv4 too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^([0-9]{1,3}\.){3}[0-9]{1,3}/[0-9]{1,2}$"), extend("format" = "cidr"))]
    pub cidr4: Option<String>,
    /// The length of each node's IPv4 prefix (8 to 30); required with `cidr4`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 8, max = 30))]
    pub node_prefix4: Option<u8>,
    /// Which Nodes the pool serves, by label (a rack: `topology.kubernetes.io/zone: rack1`).
    /// Empty: every Node. A Node two pools select gets nothing until one lets go of it.
    #[serde(default)]
    pub node_selector: LabelSelector,
    /// Family defaults for pods, copied into each NodeConfig.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defaults: Option<FamilyDefaults>,
    /// The nodes' ip-algo (the NodeConfig annotation `flock.fritzlab.net/ip-algo`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_algo: Option<String>,
    /// The BGP settings each node of the pool gets (NodeConfig `spec.bgp` without the router
    /// ID, which is the node's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bgp: Option<BgpPeering>,
    /// Service addresses (docs/services.md): the LoadBalancer addresses the controller hands
    /// out, and what the pool's nodes may announce; copied into each NodeConfig.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services: Option<PoolServicesSpec>,
    /// Secondary networks (docs/multus.md): each node of the pool gets a prefix of each
    /// network's space, the one at the same place in it as the node's prefix of `cidr6` in
    /// the pool (so a network needs room for as many nodes as the pool has), in its
    /// NodeConfig's `spec.networks`, with the network's whole space among its routes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub networks: Vec<PoolNetworkSpec>,
}

/// One secondary network of a pool (`spec.networks[]`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolNetworkSpec {
    /// Its name, as the network configuration's `network` names it (a DNS label).
    #[schemars(length(min = 1, max = 63), pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
    /// The network's IPv6 space.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^[0-9a-fA-F:.]+/[0-9]{1,3}$"), extend("format" = "cidr"))]
    pub cidr6: Option<String>,
    /// The prefix length of each node's part of `cidr6`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 120))]
    pub node_prefix6: Option<u8>,
    /// The network's IPv4 space.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^([0-9]{1,3}\.){3}[0-9]{1,3}/[0-9]{1,2}$"), extend("format" = "cidr"))]
    pub cidr4: Option<String>,
    /// The prefix length of each node's part of `cidr4`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 8, max = 30))]
    pub node_prefix4: Option<u8>,
    /// More destinations pods route through the network (its own space always is).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<String>,
    /// Whether nodes announce their part of it over BGP (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub announce: Option<bool>,
}

/// `spec.services` of a pool: a NodeConfig's `spec.services`, which each node of the pool
/// gets, and whether its cluster IP ranges also follow the cluster's `ServiceCIDR` objects.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct PoolServicesSpec {
    /// The ranges, as a NodeConfig has them.
    #[serde(flatten)]
    pub ranges: ServicesSpec,
    /// Announce, besides `clusterIPCIDRs`, the ranges of every `ServiceCIDR`
    /// (networking.k8s.io/v1) in the cluster, each as one aggregate: the controller adds
    /// them to each node's `clusterIPCIDRs` and follows as they are created and deleted.
    #[serde(
        rename = "followServiceCIDRs",
        default,
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub follow_service_cidrs: bool,
}

/// Written by the controller.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodePoolStatus {
    /// Nodes holding prefixes of this pool.
    pub nodes: u64,
    /// IPv6 node prefixes (absent until the controller has counted them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<PrefixCounts>,
    /// IPv4 node prefixes, when the pool has IPv4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<PrefixCounts>,
    /// The spec generation these counts are for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`, and one condition per problem (`OverlappingPools`, `PoolExhausted`,
    /// `NodeInSeveralPools`, `InvalidSpec`).
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// Node prefix counts, as decimal strings: an IPv6 pool may hold up to 2^120 of them.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PrefixCounts {
    /// Node prefixes the pool holds.
    pub capacity: String,
    /// Node prefixes in use (by a node of any pool or a hand-written NodeConfig).
    pub in_use: String,
    /// Node prefixes free.
    pub free: String,
}

impl NodePool {
    /// The annotations a node's NodeConfig gets from the pool (its ip-algo).
    pub fn node_annotations(&self) -> Option<BTreeMap<String, String>> {
        self.spec
            .ip_algo
            .as_ref()
            .map(|a| BTreeMap::from([(IP_ALGO_ANNOTATION.to_owned(), a.clone())]))
    }
}
