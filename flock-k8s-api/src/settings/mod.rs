//! Validation of the resources into what the agent and the controller work with: a
//! NodeConfig into [`NodeSettings`] (its BGP setup into a `flock-bird` model), the Service
//! ranges into `flock-ipam`'s, a NodePool into `flock-ipam`'s cluster pool. Every error names
//! the field and the value. Behind the `settings` feature: it needs flock's pure crates.

use std::collections::BTreeMap;

use ipnet::{Ipv4Net, Ipv6Net};

use crate::nodeconfig::{IP_ALGO_ANNOTATION, NodeConfig, SecretKeyRef, ServicesSpec};
use crate::{Error, Result};

mod bgp;
mod networks;
mod pool;

pub use networks::{SecondaryNetwork, route as secondary_route};
pub use pool::router_id;

use bgp::bird_model;

/// A validated NodeConfig: what the agent serves.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeSettings {
    /// The node's name.
    pub node: String,
    /// IPv6 pod CIDR.
    pub cidr6: Option<Ipv6Net>,
    /// IPv4 pod CIDR.
    pub cidr4: Option<Ipv4Net>,
    /// Pods get IPv6 unless annotated otherwise.
    pub default_ipv6: bool,
    /// Pods get IPv4 unless annotated otherwise.
    pub default_ipv4: bool,
    /// The node's ip-algo annotation, if any.
    pub ip_algo: Option<flock_embed::IpAlgo>,
    /// BGP, validated by `flock-bird` (router ID, ASN, neighbors, communities, the node
    /// CIDRs); the agent adds the pods' individually announced addresses when rendering.
    /// Passwords from files are already in it (standalone); those from Secrets are filled in
    /// by the Kubernetes watcher from [`password_secrets`](Self::password_secrets).
    pub bgp: Option<flock_bird::BirdModel>,
    /// The Service ranges the node may announce (`spec.services`; empty when absent).
    pub services: flock_ipam::ServiceRanges,
    /// The neighbors (index in `bgp.neighbors`) whose password is in a Secret.
    pub password_secrets: Vec<(usize, SecretKeyRef)>,
    /// The neighbors (index in `bgp.neighbors`) whose password is in a file (standalone).
    pub password_files: Vec<(usize, std::path::PathBuf)>,
    /// Secondary networks (`spec.networks`), by name.
    pub networks: Vec<SecondaryNetwork>,
}

impl NodeSettings {
    /// The cluster network's node CIDRs.
    pub fn cluster_cidrs(&self) -> Vec<ipnet::IpNet> {
        let mut v = Vec::new();
        v.extend(self.cidr6.map(ipnet::IpNet::V6));
        v.extend(self.cidr4.map(ipnet::IpNet::V4));
        v
    }

    /// The secondary network of this name.
    pub fn network(&self, name: &str) -> Option<&SecondaryNetwork> {
        self.networks.iter().find(|n| n.name == name)
    }
}

impl NodeConfig {
    /// Validates the resource into [`NodeSettings`]; every error names the field and the value.
    pub fn settings(&self) -> Result<NodeSettings> {
        let node = self.metadata.name.clone().unwrap_or_default();
        if node.is_empty() {
            return Err(invalid("metadata.name", "", "the node's name is required"));
        }
        let spec = &self.spec;
        let cidrs = node_cidrs("spec", spec.cidr6.as_deref(), spec.cidr4.as_deref())?;
        let (cidr6, cidr4) = (cidrs.cidr6(), cidrs.cidr4());
        let defaults = spec.defaults.clone().unwrap_or_default();
        let default_ipv6 = defaults.ipv6.unwrap_or(true);
        let default_ipv4 = defaults.ipv4.unwrap_or(cidr4.is_some());
        if default_ipv6
            && cidr6.is_none()
            && spec.defaults.as_ref().and_then(|d| d.ipv6) == Some(true)
        {
            return Err(invalid(
                "spec.defaults.ipv6",
                "true",
                "the node has no spec.cidr6",
            ));
        }
        if default_ipv4 && cidr4.is_none() {
            return Err(invalid(
                "spec.defaults.ipv4",
                "true",
                "the node has no spec.cidr4",
            ));
        }
        let cluster: Vec<ipnet::IpNet> = cidr6
            .map(ipnet::IpNet::V6)
            .into_iter()
            .chain(cidr4.map(ipnet::IpNet::V4))
            .collect();
        let networks = networks::networks(&spec.networks, &cluster)?;
        let bgp = spec
            .bgp
            .as_ref()
            .map(|b| {
                let mut model = bird_model(b, cidr6, cidr4)?;
                // secondary networks announced as aggregates too, like the node CIDRs
                model.cidrs.extend(
                    networks
                        .iter()
                        .filter(|n| n.announce)
                        .flat_map(SecondaryNetwork::cidrs),
                );
                Ok::<_, Error>(model)
            })
            .transpose()?;
        let mut password_secrets = Vec::new();
        let mut password_files = Vec::new();
        for (i, n) in spec
            .bgp
            .iter()
            .flat_map(|b| b.peering.neighbors.iter())
            .enumerate()
        {
            if let Some(r) = &n.password_secret_ref {
                password_secrets.push((i, r.clone()));
            }
            if let Some(f) = &n.password_file {
                password_files.push((i, std::path::PathBuf::from(f)));
            }
        }
        let ip_algo = self
            .metadata
            .annotations
            .as_ref()
            .and_then(|a: &BTreeMap<String, String>| a.get(IP_ALGO_ANNOTATION))
            .map(|spec| {
                let algo = flock_embed::IpAlgo::parse(spec).map_err(|e| {
                    invalid(
                        &format!("metadata.annotations[{IP_ALGO_ANNOTATION}]"),
                        spec,
                        &e.to_string(),
                    )
                })?;
                if let Some(c) = cidr6 {
                    algo.validate_for(128 - c.prefix_len()).map_err(|e| {
                        invalid(
                            &format!("metadata.annotations[{IP_ALGO_ANNOTATION}]"),
                            spec,
                            &e.to_string(),
                        )
                    })?;
                }
                Ok::<_, Error>(algo)
            })
            .transpose()?;
        let services = spec
            .services
            .as_ref()
            .map(|s| s.ranges("spec.services"))
            .transpose()?
            .unwrap_or_default();
        Ok(NodeSettings {
            services,
            node,
            cidr6,
            cidr4,
            default_ipv6: default_ipv6 && cidr6.is_some(),
            default_ipv4,
            ip_algo,
            bgp,
            password_secrets,
            password_files,
            networks,
        })
    }
}

impl ServicesSpec {
    /// The ranges as `flock-ipam` reads them; every error names the field (under `at`,
    /// e.g. `spec.services`) and the value.
    pub fn ranges(&self, at: &str) -> Result<flock_ipam::ServiceRanges> {
        let parse = |field: &str, list: &[String]| {
            list.iter()
                .enumerate()
                .map(|(i, text)| {
                    let field = format!("{at}.{field}[{i}]");
                    let net: ipnet::IpNet = text.trim().parse().map_err(|_| {
                        invalid(
                            &field,
                            text,
                            "not a CIDR such as 2001:db8:5::/112 or 203.0.113.0/28",
                        )
                    })?;
                    if net.trunc() != net {
                        return Err(invalid(
                            &field,
                            text,
                            &format!("host bits set; did you mean {}?", net.trunc()),
                        ));
                    }
                    if net.prefix_len() == 0 {
                        return Err(invalid(
                            &field,
                            text,
                            "a default route is not a Service range",
                        ));
                    }
                    if let Some(reason) = flock_ipam::unroutable(net.network()) {
                        return Err(invalid(&field, text, &format!("{reason} is never routed")));
                    }
                    Ok(net)
                })
                .collect::<Result<Vec<_>>>()
        };
        Ok(flock_ipam::ServiceRanges {
            load_balancer: parse("loadBalancerCIDRs", &self.load_balancer_cidrs)?,
            external_ips: parse("externalIPCIDRs", &self.external_ip_cidrs)?,
            cluster_ips: parse("clusterIPCIDRs", &self.cluster_ip_cidrs)?,
        })
    }
}

/// A pair of node CIDRs under `at` (`spec`, `spec.networks[0]`): the rules (syntax, host
/// bits, sizes) are flock-ipam's; an error names `{at}.cidr6` or `{at}.cidr4`.
pub(crate) fn node_cidrs(
    at: &str,
    cidr6: Option<&str>,
    cidr4: Option<&str>,
) -> Result<flock_ipam::NodeCidrs> {
    flock_ipam::NodeCidrs::parse(cidr6, cidr4).map_err(|e| match e {
        flock_ipam::Error::NodeCidr {
            family,
            value,
            problem,
        } => {
            let field = match family {
                flock_ipam::Family::V6 => "cidr6",
                flock_ipam::Family::V4 => "cidr4",
            };
            invalid(&format!("{at}.{field}"), &value, &problem.to_string())
        }
        other => invalid(at, "", &other.to_string()),
    })
}

pub(crate) fn invalid(field: &str, value: &str, reason: &str) -> Error {
    Error::InvalidNodeConfig {
        field: field.to_owned(),
        value: value.to_owned(),
        reason: reason.to_owned(),
    }
}
