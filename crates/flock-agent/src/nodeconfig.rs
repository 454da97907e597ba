//! The `NodeConfig` resource (`flock.fritzlab.net/v1alpha1`, cluster-scoped, named after the
//! node) and its validation into the typed [`NodeSettings`] the agent works with.
//!
//! The same schema is read from a YAML file in standalone mode (DESIGN §8).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use ipnet::{Ipv4Net, Ipv6Net};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// The annotation on a NodeConfig (or a pod) that names the ip-algo spec.
pub const IP_ALGO_ANNOTATION: &str = "flock.fritzlab.net/ip-algo";

/// What a node serves: its pod CIDRs, family defaults and BGP setup.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "flock.fritzlab.net",
    version = "v1alpha1",
    kind = "NodeConfig",
    plural = "nodeconfigs",
    shortname = "nc",
    status = "NodeConfigStatus",
    printcolumn = r#"{"name":"CIDR6","type":"string","jsonPath":".spec.cidr6"}"#,
    printcolumn = r#"{"name":"CIDR4","type":"string","jsonPath":".spec.cidr4"}"#,
    printcolumn = r#"{"name":"Pods6","type":"integer","jsonPath":".status.allocated6"}"#,
    printcolumn = r#"{"name":"Pods4","type":"integer","jsonPath":".status.allocated4"}"#,
    printcolumn = r#"{"name":"BGP","type":"string","jsonPath":".status.bgp[*].state"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NodeConfigSpec {
    /// The node's IPv6 pod CIDR.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cidr6: Option<String>,
    /// The node's IPv4 pod CIDR.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cidr4: Option<String>,
    /// Which families a pod gets when its annotations do not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defaults: Option<FamilyDefaults>,
    /// BGP: the node's ASN, router ID and neighbors. Absent: no BIRD configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bgp: Option<BgpSpec>,
}

/// Family defaults for pods (`spec.defaults`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct FamilyDefaults {
    /// Give pods an IPv6 address (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<bool>,
    /// Give pods an IPv4 address (default true when the node has `cidr4`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<bool>,
}

/// `spec.bgp`.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BgpSpec {
    /// The node's autonomous system number (1–4294967295).
    pub asn: u32,
    /// The BGP router ID, an IPv4 address.
    pub router_id: String,
    /// The BGP neighbors of the node.
    #[serde(default)]
    pub neighbors: Vec<NeighborSpec>,
    /// Communities added to every announced prefix: `ASN:value` or large `a:b:c`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub communities: Vec<String>,
    /// Session timers; BIRD's defaults when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timers: Option<BgpTimers>,
}

/// One BGP neighbor (`spec.bgp.neighbors[]`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct NeighborSpec {
    /// The neighbor's address.
    pub address: String,
    /// The neighbor's ASN.
    pub asn: u32,
    /// TCP MD5 password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// Run BFD with the neighbor.
    #[serde(default)]
    pub bfd: bool,
    /// eBGP multihop TTL; direct when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multihop: Option<u8>,
}

/// BGP session timers in seconds (`spec.bgp.timers`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BgpTimers {
    /// Hold time.
    pub hold: u16,
    /// Keepalive time.
    pub keepalive: u16,
    /// Connect retry time.
    pub connect_retry: u16,
}

/// Written by the agent (`status`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeConfigStatus {
    /// IPv6 addresses allocated to pods.
    pub allocated6: u64,
    /// IPv4 addresses allocated to pods.
    pub allocated4: u64,
    /// The state of each BGP session.
    #[serde(default)]
    pub bgp: Vec<NeighborStatus>,
    /// Standard conditions (`Ready`, `BirdReady`, …).
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// The state of one BGP session (`status.bgp[]`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct NeighborStatus {
    /// The neighbor's address.
    pub neighbor: String,
    /// BIRD's state of the session (`Established`, `Active`, …).
    pub state: String,
}

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
    /// The node's ip-algo annotation, if any (validated when pods use it).
    pub ip_algo: Option<String>,
    /// BGP, if configured.
    pub bgp: Option<BgpSettings>,
}

/// Validated `spec.bgp`.
#[derive(Clone, Debug, PartialEq)]
pub struct BgpSettings {
    /// Local ASN.
    pub asn: u32,
    /// Router ID.
    pub router_id: Ipv4Addr,
    /// Neighbors with parsed addresses.
    pub neighbors: Vec<Neighbor>,
    /// Communities as written.
    pub communities: Vec<String>,
    /// Timers.
    pub timers: Option<BgpTimers>,
}

/// A validated neighbor.
#[derive(Clone, Debug, PartialEq)]
pub struct Neighbor {
    /// Address.
    pub address: IpAddr,
    /// ASN.
    pub asn: u32,
    /// MD5 password.
    pub password: Option<String>,
    /// BFD on.
    pub bfd: bool,
    /// Multihop TTL.
    pub multihop: Option<u8>,
}

impl NodeConfig {
    /// Reads a NodeConfig from a YAML file (standalone mode).
    pub fn from_yaml_file(path: &Path) -> Result<NodeConfig> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::ReadFile {
            path: path.to_owned(),
            source,
        })?;
        serde_yaml::from_str(&text).map_err(|e| Error::NodeConfigFile {
            path: path.to_owned(),
            reason: e.to_string(),
        })
    }

    /// Validates the resource into [`NodeSettings`]; every error names the field and the value.
    pub fn settings(&self) -> Result<NodeSettings> {
        let node = self.metadata.name.clone().unwrap_or_default();
        if node.is_empty() {
            return Err(invalid("metadata.name", "", "the node's name is required"));
        }
        let spec = &self.spec;
        let cidr6 = spec
            .cidr6
            .as_deref()
            .map(|v| parse_net::<Ipv6Net>("spec.cidr6", v, "an IPv6 CIDR"))
            .transpose()?;
        let cidr4 = spec
            .cidr4
            .as_deref()
            .map(|v| parse_net::<Ipv4Net>("spec.cidr4", v, "an IPv4 CIDR"))
            .transpose()?;
        if let Some(c) = cidr6 {
            if c.prefix_len() > 120 {
                return Err(invalid(
                    "spec.cidr6",
                    &c.to_string(),
                    "a pod CIDR must be /120 or larger",
                ));
            }
        }
        if let Some(c) = cidr4 {
            if c.prefix_len() > 30 {
                return Err(invalid(
                    "spec.cidr4",
                    &c.to_string(),
                    "a pod CIDR must be /30 or larger",
                ));
            }
        }
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
        let bgp = spec.bgp.as_ref().map(validate_bgp).transpose()?;
        let ip_algo = self
            .metadata
            .annotations
            .as_ref()
            .and_then(|a: &BTreeMap<String, String>| a.get(IP_ALGO_ANNOTATION).cloned());
        Ok(NodeSettings {
            node,
            cidr6,
            cidr4,
            default_ipv6: default_ipv6 && cidr6.is_some(),
            default_ipv4,
            ip_algo,
            bgp,
        })
    }
}

fn validate_bgp(bgp: &BgpSpec) -> Result<BgpSettings> {
    if bgp.asn == 0 {
        return Err(invalid("spec.bgp.asn", "0", "an ASN is 1 to 4294967295"));
    }
    let router_id = bgp.router_id.parse::<Ipv4Addr>().map_err(|_| {
        invalid(
            "spec.bgp.routerId",
            &bgp.router_id,
            "a router ID is an IPv4 address",
        )
    })?;
    let mut neighbors = Vec::with_capacity(bgp.neighbors.len());
    for (i, n) in bgp.neighbors.iter().enumerate() {
        let field = format!("spec.bgp.neighbors[{i}].address");
        let address = n
            .address
            .parse::<IpAddr>()
            .map_err(|_| invalid(&field, &n.address, "not an IP address"))?;
        if n.asn == 0 {
            return Err(invalid(
                &format!("spec.bgp.neighbors[{i}].asn"),
                "0",
                "an ASN is 1 to 4294967295",
            ));
        }
        neighbors.push(Neighbor {
            address,
            asn: n.asn,
            password: n.password.clone(),
            bfd: n.bfd,
            multihop: n.multihop,
        });
    }
    Ok(BgpSettings {
        asn: bgp.asn,
        router_id,
        neighbors,
        communities: bgp.communities.clone(),
        timers: bgp.timers.clone(),
    })
}

fn parse_net<T: std::str::FromStr>(field: &str, value: &str, what: &str) -> Result<T> {
    value
        .parse::<T>()
        .map_err(|_| invalid(field, value, &format!("not {what}")))
}

fn invalid(field: &str, value: &str, reason: &str) -> Error {
    Error::InvalidNodeConfig {
        field: field.to_owned(),
        value: value.to_owned(),
        reason: reason.to_owned(),
    }
}

/// The NodeConfig CustomResourceDefinition as YAML (`flock-agent crd`).
pub fn crd_yaml() -> String {
    use kube::CustomResourceExt;
    serde_yaml::to_string(&NodeConfig::crd()).expect("the CRD serializes to YAML")
}
