//! The `NodePool` resource (`flock.fritzlab.net/v1alpha1`, cluster-scoped): a rack's node
//! address space and BGP setup, from which `flock-agent controller` writes one NodeConfig per
//! selected Node; and its validation into `flock-ipam`'s [`ClusterPool`] plus the NodeConfig
//! a node of the pool gets.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use flock_ipam::{ClusterPool, LabelRequirement, NodeSelector, PoolCidr4};
use ipnet::{Ipv4Net, Ipv6Net};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::nodeconfig::{
    BgpSpec, BgpTimers, FamilyDefaults, IP_ALGO_ANNOTATION, NeighborSpec, NodeConfig,
    NodeConfigSpec, ServicesSpec,
};
use crate::{Error, Result};

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
    pub bgp: Option<PoolBgpSpec>,
    /// Service addresses (docs/services.md): the LoadBalancer addresses the controller hands
    /// out, and what the pool's nodes may announce; copied into each NodeConfig.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services: Option<PoolServicesSpec>,
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

impl PoolServicesSpec {
    /// The NodeConfig `spec.services` of a node of the pool, given the ranges of the cluster's
    /// `ServiceCIDR`s: the pool's own ranges, then (when it follows them) every ServiceCIDR
    /// range it does not list already.
    pub fn for_node(&self, service_cidrs: &[String]) -> ServicesSpec {
        let mut spec = self.ranges.clone();
        if self.follow_service_cidrs {
            for cidr in service_cidrs {
                // The same range however written (`FD97::/108` is the apiserver's `fd97::/108`):
                // listed twice, BIRD would get the route twice.
                let same = |c: &String| {
                    c.trim() == cidr
                        || matches!(
                            (c.trim().parse::<ipnet::IpNet>(), cidr.parse::<ipnet::IpNet>()),
                            (Ok(a), Ok(b)) if a == b
                        )
                };
                if !spec.cluster_ip_cidrs.iter().any(same) {
                    spec.cluster_ip_cidrs.push(cidr.clone());
                }
            }
        }
        spec
    }
}

/// `spec.bgp` of a pool: NodeConfig's BGP settings but the router ID, which each node gets
/// from its own addresses ([`router_id`]).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolBgpSpec {
    /// The nodes' autonomous system number (1–4294967295).
    #[schemars(range(min = 1, max = 4294967295u32))]
    pub asn: u32,
    /// The neighbors of each node, e.g. the rack's top-of-rack routers.
    #[serde(default)]
    pub neighbors: Vec<NeighborSpec>,
    /// Communities added to every announced prefix.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub communities: Vec<String>,
    /// Session timers; BIRD's defaults when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timers: Option<BgpTimers>,
    /// Graceful shutdown of every node of the pool (RFC 8326).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub graceful_shutdown: bool,
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

impl From<flock_ipam::PrefixUsage> for PrefixCounts {
    fn from(u: flock_ipam::PrefixUsage) -> Self {
        PrefixCounts {
            capacity: u.capacity.to_string(),
            in_use: u.in_use.to_string(),
            free: u.free.to_string(),
        }
    }
}

fn invalid(field: &str, value: &str, reason: &str) -> Error {
    Error::InvalidNodePool {
        field: field.to_owned(),
        value: value.to_owned(),
        reason: reason.to_owned(),
    }
}

impl NodePool {
    /// The pool as the planner sees it; every error names the field and the value. The
    /// whole pool is checked — BGP settings and ip-algo too — so that a pool that cannot
    /// produce a valid NodeConfig assigns nothing.
    pub fn cluster_pool(&self) -> Result<ClusterPool> {
        let name = self.metadata.name.clone().unwrap_or_default();
        let spec = &self.spec;
        let cidr6: Ipv6Net = spec.cidr6.parse().map_err(|_| {
            invalid(
                "spec.cidr6",
                &spec.cidr6,
                "not an IPv6 CIDR such as 2001:db8:1::/48",
            )
        })?;
        let ipv4 = match (&spec.cidr4, spec.node_prefix4) {
            (None, None) => None,
            (Some(c), Some(node_prefix)) => Some(PoolCidr4 {
                cidr: c.parse::<Ipv4Net>().map_err(|_| {
                    invalid("spec.cidr4", c, "not an IPv4 CIDR such as 10.244.0.0/16")
                })?,
                node_prefix,
            }),
            (Some(c), None) => {
                return Err(invalid(
                    "spec.nodePrefix4",
                    "",
                    &format!("required with spec.cidr4 {c}"),
                ));
            }
            (None, Some(l)) => {
                return Err(invalid(
                    "spec.cidr4",
                    "",
                    &format!("required with spec.nodePrefix4 {l}"),
                ));
            }
        };
        let pool = ClusterPool {
            name,
            cidr6,
            node_prefix6: spec.node_prefix6,
            ipv4,
            selector: node_selector(&spec.node_selector)?,
        };
        // The NodeConfig its first node would get must validate: BGP, ip-algo, defaults.
        let sample = flock_ipam::NodeAssignment {
            node: "sample".into(),
            pool: pool.name.clone(),
            cidr6: Ipv6Net::new(cidr6.network(), spec.node_prefix6.min(128)).map_err(|_| {
                invalid(
                    "spec.nodePrefix6",
                    &spec.node_prefix6.to_string(),
                    "not a prefix length",
                )
            })?,
            cidr4: ipv4.and_then(|v| Ipv4Net::new(v.cidr.network(), v.node_prefix.min(32)).ok()),
        };
        let nc = NodeConfig {
            metadata: kube::api::ObjectMeta {
                name: Some("sample".into()),
                annotations: self.node_annotations(),
                ..Default::default()
            },
            // The pool's own ranges are checked; ServiceCIDRs are valid by the apiserver's checks.
            spec: self.node_config_spec(&sample, Ipv4Addr::new(192, 0, 2, 1), &[]),
            status: None,
        };
        nc.settings().map_err(|e| match e {
            Error::InvalidNodeConfig {
                field,
                value,
                reason,
            } => {
                let field = field
                    .replace(
                        &format!("metadata.annotations[{IP_ALGO_ANNOTATION}]"),
                        "spec.ipAlgo",
                    )
                    .replace("spec.cidr6", "spec.nodePrefix6")
                    .replace("spec.cidr4", "spec.nodePrefix4");
                invalid(&field, &value, &reason)
            }
            other => other,
        })?;
        Ok(pool)
    }

    /// The NodeConfig spec of a node of this pool with these prefixes and router ID, given the
    /// ranges of the cluster's `ServiceCIDR`s (see [`PoolServicesSpec::for_node`]).
    pub fn node_config_spec(
        &self,
        assignment: &flock_ipam::NodeAssignment,
        router_id: Ipv4Addr,
        service_cidrs: &[String],
    ) -> NodeConfigSpec {
        NodeConfigSpec {
            cidr6: Some(assignment.cidr6.to_string()),
            cidr4: assignment.cidr4.map(|c| c.to_string()),
            defaults: self.spec.defaults.clone(),
            bgp: self.spec.bgp.as_ref().map(|b| BgpSpec {
                asn: b.asn,
                router_id: router_id.to_string(),
                neighbors: b.neighbors.clone(),
                communities: b.communities.clone(),
                timers: b.timers.clone(),
                graceful_shutdown: b.graceful_shutdown,
            }),
            services: self
                .spec
                .services
                .as_ref()
                .map(|s| s.for_node(service_cidrs)),
        }
    }

    /// The annotations a node's NodeConfig gets from the pool (its ip-algo).
    pub fn node_annotations(&self) -> Option<BTreeMap<String, String>> {
        self.spec
            .ip_algo
            .as_ref()
            .map(|a| BTreeMap::from([(IP_ALGO_ANNOTATION.to_owned(), a.clone())]))
    }
}

/// A Kubernetes label selector as `flock-ipam`'s.
fn node_selector(s: &LabelSelector) -> Result<NodeSelector> {
    let match_expressions = s
        .match_expressions
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, e)| {
            let key = e.key.clone();
            let values = e.values.clone().unwrap_or_default();
            let field = format!("spec.nodeSelector.matchExpressions[{i}]");
            let with_values = |r: LabelRequirement| {
                if values.is_empty() {
                    Err(invalid(
                        &format!("{field}.values"),
                        "",
                        &format!("{} needs values", e.operator),
                    ))
                } else {
                    Ok(r)
                }
            };
            let without_values = |r: LabelRequirement| {
                if values.is_empty() {
                    Ok(r)
                } else {
                    Err(invalid(
                        &format!("{field}.values"),
                        &values.join(","),
                        &format!("{} takes no values", e.operator),
                    ))
                }
            };
            match e.operator.as_str() {
                "In" => with_values(LabelRequirement::In {
                    key,
                    values: values.clone(),
                }),
                "NotIn" => with_values(LabelRequirement::NotIn {
                    key,
                    values: values.clone(),
                }),
                "Exists" => without_values(LabelRequirement::Exists { key }),
                "DoesNotExist" => without_values(LabelRequirement::DoesNotExist { key }),
                other => Err(invalid(
                    &format!("{field}.operator"),
                    other,
                    "must be In, NotIn, Exists or DoesNotExist",
                )),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(NodeSelector {
        match_labels: s.match_labels.clone().unwrap_or_default(),
        match_expressions,
    })
}

/// The router ID of a node: its first IPv4 InternalIP; else the first address of its IPv4
/// prefix; else the 32 bits just above the host part of its IPv6 prefix (unique within a
/// pool of up to 2^32 node prefixes), or, when those are all zero, the FNV-1a 32 hash of the
/// node's name. Never 0.0.0.0.
pub fn router_id(
    node: &str,
    internal_ipv4: Option<Ipv4Addr>,
    assignment: &flock_ipam::NodeAssignment,
) -> Ipv4Addr {
    if let Some(ip) = internal_ipv4.filter(|ip| !ip.is_unspecified()) {
        return ip;
    }
    if let Some(c) = assignment.cidr4 {
        return c.network();
    }
    let host = 128 - u32::from(assignment.cidr6.prefix_len());
    let bits = u128::from(assignment.cidr6.network())
        .checked_shr(host)
        .unwrap_or(0) as u32;
    if bits != 0 {
        return Ipv4Addr::from(bits);
    }
    let hash = node.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    Ipv4Addr::from(hash.max(1))
}

/// The NodePool CustomResourceDefinition as YAML (`flock-agent crd`).
pub fn crd_yaml() -> String {
    use kube::CustomResourceExt;
    serde_yaml::to_string(&NodePool::crd()).expect("the CRD serializes to YAML")
}

#[cfg(test)]
mod tests;
