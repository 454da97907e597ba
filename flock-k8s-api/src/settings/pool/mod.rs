//! A NodePool validated into `flock-ipam`'s [`ClusterPool`], and what a node of the pool gets
//! from it.

use std::net::Ipv4Addr;

use flock_ipam::{ClusterPool, LabelRequirement, NodeSelector, PoolCidr4};
use ipnet::{Ipv4Net, Ipv6Net};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::networks::overlap;
use crate::nodeconfig::{BgpSpec, IP_ALGO_ANNOTATION, NodeConfig, NodeConfigSpec, ServicesSpec};
use crate::nodepool::{NodePool, PoolServicesSpec, PrefixCounts};
use crate::{Error, Result};

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
        let networks = self.pool_networks()?;
        let cluster: Vec<ipnet::IpNet> = std::iter::once(ipnet::IpNet::V6(cidr6))
            .chain(ipv4.map(|v| ipnet::IpNet::V4(v.cidr)))
            .collect();
        // node prefixes a space of /space holds of /node (None: more than u128 counts)
        let nodes = |space: u8, node: u8| 1u128.checked_shl(u32::from(node.saturating_sub(space)));
        let pool_nodes6 = nodes(cidr6.prefix_len(), spec.node_prefix6);
        // a network's IPv4 part follows the node's IPv4 prefix when the pool has IPv4,
        // its IPv6 prefix otherwise
        let (pool_nodes4, from4) = match ipv4 {
            Some(v) => (nodes(v.cidr.prefix_len(), v.node_prefix), "spec.cidr4"),
            None => (pool_nodes6, "spec.cidr6"),
        };
        for (i, n) in networks.iter().enumerate() {
            for (family, net, node_prefix, room, need, from) in [
                n.v6.map(|(c, p)| {
                    let room = nodes(c.prefix_len(), p);
                    ("6", ipnet::IpNet::V6(c), p, room, pool_nodes6, "spec.cidr6")
                }),
                n.v4.map(|(c, p)| {
                    let room = nodes(c.prefix_len(), p);
                    ("4", ipnet::IpNet::V4(c), p, room, pool_nodes4, from4)
                }),
            ]
            .into_iter()
            .flatten()
            {
                if let Some(c) = cluster.iter().find(|c| overlap(c, &net)) {
                    let written = if family == "6" {
                        &n.spec.cidr6
                    } else {
                        &n.spec.cidr4
                    };
                    return Err(invalid(
                        &format!("spec.networks[{i}].cidr{family}"),
                        written.as_deref().unwrap_or_default(),
                        &format!("overlaps the pool's {c}"),
                    ));
                }
                if let (Some(room), Some(need)) = (room, need)
                    && room < need
                {
                    return Err(invalid(
                        &format!("spec.networks[{i}].nodePrefix{family}"),
                        &node_prefix.to_string(),
                        &format!(
                            "{net} holds {room} node prefixes of /{node_prefix}, fewer than \
                             the {need} of the pool's {from}: each node needs one, at the \
                             same place"
                        ),
                    ));
                }
            }
        }
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
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
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
            bgp: self.spec.bgp.as_ref().map(|peering| BgpSpec {
                router_id: router_id.to_string(),
                peering: peering.clone(),
            }),
            services: self
                .spec
                .services
                .as_ref()
                .map(|s| s.for_node(service_cidrs)),
            // cluster_pool() refuses a pool whose networks do not validate, and nothing is
            // assigned from such a pool
            networks: self
                .pool_networks()
                .unwrap_or_default()
                .iter()
                .map(|n| n.for_node(self.node_places(assignment)))
                .collect(),
        }
    }

    /// Where the node's prefixes are in the pool (0 for the first): of `cidr6`, and of
    /// `cidr4` when the pool and the node have one (else the same as of `cidr6`).
    fn node_places(&self, assignment: &flock_ipam::NodeAssignment) -> (u128, u128) {
        let place = |base: u128, net: u128, host_bits: u8| {
            net.wrapping_sub(base)
                .checked_shr(u32::from(host_bits))
                .unwrap_or(0)
        };
        let base6 = self
            .spec
            .cidr6
            .parse::<Ipv6Net>()
            .map_or(0, |c| u128::from(c.network()));
        let at6 = place(
            base6,
            u128::from(assignment.cidr6.network()),
            128 - assignment.cidr6.prefix_len(),
        );
        let pool4 = self
            .spec
            .cidr4
            .as_deref()
            .and_then(|c| c.parse::<Ipv4Net>().ok());
        let at4 = match (pool4, assignment.cidr4) {
            (Some(pool), Some(node)) => place(
                u128::from(u32::from(pool.network())),
                u128::from(u32::from(node.network())),
                32 - node.prefix_len(),
            ),
            _ => at6,
        };
        (at6, at4)
    }

    /// `spec.networks`, parsed; every error names the field and the value.
    fn pool_networks(&self) -> Result<Vec<PoolNetwork>> {
        self.spec
            .networks
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let at = format!("spec.networks[{i}]");
                let pair = |family: &str, cidr: &Option<String>, prefix: Option<u8>| match (
                    cidr, prefix,
                ) {
                    (None, None) => Ok(None),
                    (Some(c), Some(p)) => Ok(Some((c.clone(), p))),
                    (Some(c), None) => Err(invalid(
                        &format!("{at}.nodePrefix{family}"),
                        "",
                        &format!("required with {at}.cidr{family} {c}"),
                    )),
                    (None, Some(p)) => Err(invalid(
                        &format!("{at}.cidr{family}"),
                        "",
                        &format!("required with {at}.nodePrefix{family} {p}"),
                    )),
                };
                let v6 = pair("6", &n.cidr6, n.node_prefix6)?
                    .map(|(c, p)| {
                        let net = c.parse::<Ipv6Net>().map_err(|_| {
                            invalid(
                                &format!("{at}.cidr6"),
                                &c,
                                "not an IPv6 CIDR such as 2001:db8:5::/48",
                            )
                        })?;
                        if p < net.prefix_len() || p > 128 {
                            return Err(invalid(
                                &format!("{at}.nodePrefix6"),
                                &p.to_string(),
                                &format!("not a prefix length within {net}"),
                            ));
                        }
                        Ok((net.trunc(), p))
                    })
                    .transpose()?;
                let v4 = pair("4", &n.cidr4, n.node_prefix4)?
                    .map(|(c, p)| {
                        let net = c.parse::<Ipv4Net>().map_err(|_| {
                            invalid(
                                &format!("{at}.cidr4"),
                                &c,
                                "not an IPv4 CIDR such as 10.245.0.0/16",
                            )
                        })?;
                        if p < net.prefix_len() || p > 32 {
                            return Err(invalid(
                                &format!("{at}.nodePrefix4"),
                                &p.to_string(),
                                &format!("not a prefix length within {net}"),
                            ));
                        }
                        Ok((net.trunc(), p))
                    })
                    .transpose()?;
                Ok(PoolNetwork {
                    spec: n.clone(),
                    v6,
                    v4,
                })
            })
            .collect()
    }
}

/// A pool's secondary network, parsed: its spaces with their node prefix lengths.
#[derive(Debug, Clone)]
struct PoolNetwork {
    spec: crate::nodepool::PoolNetworkSpec,
    v6: Option<(Ipv6Net, u8)>,
    v4: Option<(Ipv4Net, u8)>,
}

impl PoolNetwork {
    /// The NodeConfig network of the node at these places in the pool (of its IPv6 and IPv4
    /// prefixes): the node prefix at the same place of each space, the whole spaces and the pool's extra routes as its routes.
    fn for_node(&self, (at6, at4): (u128, u128)) -> crate::nodeconfig::NetworkSpec {
        let cidr6 = self.v6.and_then(|(net, p)| {
            let step = at6.checked_shl(128 - u32::from(p))?;
            Ipv6Net::new(u128::from(net.network()).checked_add(step)?.into(), p).ok()
        });
        let cidr4 = self.v4.and_then(|(net, p)| {
            let step = u32::try_from(at4).ok()?.checked_shl(32 - u32::from(p))?;
            Ipv4Net::new(u32::from(net.network()).checked_add(step)?.into(), p).ok()
        });
        let mut routes: Vec<String> = self
            .v6
            .map(|(n, _)| n.to_string())
            .into_iter()
            .chain(self.v4.map(|(n, _)| n.to_string()))
            .collect();
        routes.extend(self.spec.routes.iter().cloned());
        crate::nodeconfig::NetworkSpec {
            name: self.spec.name.clone(),
            cidr6: cidr6.map(|c| c.to_string()),
            cidr4: cidr4.map(|c| c.to_string()),
            routes,
            announce: self.spec.announce,
        }
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

#[cfg(test)]
mod tests;
