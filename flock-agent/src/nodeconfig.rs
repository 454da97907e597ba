//! The `NodeConfig` resource (`flock.fritzlab.net/v1alpha1`, cluster-scoped, named after the
//! node) and its validation into the typed [`NodeSettings`] the agent works with.
//!
//! The same schema is read from a YAML file in standalone mode (DESIGN §8).

use std::collections::BTreeMap;
use std::path::Path;

use ipnet::{Ipv4Net, Ipv6Net};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

mod bgp;

use bgp::bird_model;
pub use bgp::{DEFAULT_BFD_INTERVAL_MS, DEFAULT_BFD_MULTIPLIER, DEFAULT_RESTART_TIME};

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
    #[schemars(pattern(r"^[0-9a-fA-F:.]+/[0-9]{1,3}$"), extend("format" = "cidr"))]
    pub cidr6: Option<String>,
    /// The node's IPv4 pod CIDR.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^([0-9]{1,3}\.){3}[0-9]{1,3}/[0-9]{1,2}$"), extend("format" = "cidr"))]
    pub cidr4: Option<String>,
    /// Which families a pod gets when its annotations do not say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defaults: Option<FamilyDefaults>,
    /// BGP: the node's ASN, router ID and neighbors. Absent: no BIRD configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bgp: Option<BgpSpec>,
    /// Which Service addresses the node may announce (docs/services.md). Absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub services: Option<ServicesSpec>,
}

/// `spec.services` of a NodeConfig or a NodePool: the ranges Service addresses may come
/// from. Each list holds CIDRs of either family.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ServicesSpec {
    /// Where LoadBalancer addresses lie: the controller hands them out from here (IPv6
    /// first), and a node announces `status.loadBalancer.ingress` IPs only inside them.
    #[serde(
        rename = "loadBalancerCIDRs",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub load_balancer_cidrs: Vec<String>,
    /// Where `spec.externalIPs` may lie; others are refused (an event on the Service).
    #[serde(
        rename = "externalIPCIDRs",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub external_ip_cidrs: Vec<String>,
    /// The cluster's Service (cluster IP) ranges to announce, each as one aggregate from
    /// every node; a Service with `internalTrafficPolicy: Local` also gets host routes from
    /// the nodes with a ready endpoint.
    #[serde(
        rename = "clusterIPCIDRs",
        default,
        skip_serializing_if = "Vec::is_empty"
    )]
    pub cluster_ip_cidrs: Vec<String>,
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
    #[schemars(range(min = 1, max = 4294967295u32))]
    pub asn: u32,
    /// The BGP router ID, an IPv4 address.
    #[schemars(extend("format" = "ipv4"))]
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
    /// Graceful shutdown (RFC 8326) before a drain: every announced route carries the
    /// GRACEFUL_SHUTDOWN community (65535:0) so that routers move traffic away before the
    /// node's pods go.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub graceful_shutdown: bool,
}

/// One BGP neighbor (`spec.bgp.neighbors[]`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NeighborSpec {
    /// The neighbor's address (IPv6 or IPv4). A link-local address (`fe80::…`) needs
    /// `interface`; with `interface` and no address, any link-local peer on that interface may
    /// connect (unnumbered peering, the router connects to the node).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(pattern(r"^[0-9a-fA-F:.]*$"))]
    pub address: String,
    /// The interface of an IPv6 link-local (unnumbered) session, e.g. `eth0`. The session
    /// carries IPv6 and IPv4 (extended next hop).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 15), pattern(r"^[A-Za-z0-9_.@-]+$"))]
    pub interface: Option<String>,
    /// The neighbor's ASN (1–4294967295).
    #[schemars(range(min = 1, max = 4294967295u32))]
    pub asn: u32,
    /// Refused: a password is never written in clear into a NodeConfig. Use
    /// `passwordSecretRef` (or `passwordFile` in standalone mode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    /// The TCP MD5 password, read from a Secret (Kubernetes mode). The agent's RBAC must allow
    /// `get` on that one Secret (see deploy/rbac.yaml).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_secret_ref: Option<SecretKeyRef>,
    /// The TCP MD5 password, read from this file (standalone mode; a trailing newline is
    /// dropped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<String>,
    /// Run BFD with the neighbor (100 ms x 3 unless `bfdIntervalMs` / `bfdMultiplier` say
    /// otherwise). The router must run BFD too.
    #[serde(default)]
    pub bfd: bool,
    /// BFD transmit and receive interval in milliseconds (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 60000))]
    pub bfd_interval_ms: Option<u32>,
    /// BFD detection multiplier: missed packets before the session is down (default 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 255))]
    pub bfd_multiplier: Option<u8>,
    /// Graceful restart of the session: on by default with a restart time of 120 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graceful_restart: Option<GracefulRestartSpec>,
    /// eBGP multihop TTL; direct when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 255))]
    pub multihop: Option<u8>,
}

/// A key of a Secret (`passwordSecretRef`).
#[derive(
    Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, JsonSchema,
)]
pub struct SecretKeyRef {
    /// The Secret's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The Secret's namespace.
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    /// The key in the Secret's `data`.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

impl std::fmt::Display for SecretKeyRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Secret {}/{} key {}",
            self.namespace, self.name, self.key
        )
    }
}

/// Graceful restart of one session (`spec.bgp.neighbors[].gracefulRestart`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GracefulRestartSpec {
    /// Offer graceful restart (default true): the router keeps this node's routes while BIRD
    /// restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// How long the router keeps the routes, in seconds (default 120).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 4095))]
    pub restart_time: Option<u16>,
    /// Long-lived graceful restart: after the restart time the router keeps the routes as
    /// least preferred this many seconds more. Off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 16777215))]
    pub long_lived_stale_time: Option<u32>,
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
    /// The neighbor: its address, `fe80::1%eth0`, or `eth0` for any link-local peer on it.
    pub neighbor: String,
    /// BIRD's state of the session (`Established`, `Active`, …).
    pub state: String,
    /// Why a session is not Established: the rest of BIRD's Info column (`Socket: Connection
    /// refused`, `Received: Bad peer AS`), or the agent's reason (the password Secret).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub info: Option<String>,
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
        // The node-CIDR rules (syntax, host bits, sizes) are flock-ipam's.
        let cidrs = flock_ipam::NodeCidrs::parse(spec.cidr6.as_deref(), spec.cidr4.as_deref())
            .map_err(|e| match e {
                flock_ipam::Error::NodeCidr {
                    family,
                    value,
                    problem,
                } => invalid(family.node_cidr_field(), &value, &problem.to_string()),
                other => invalid("spec", "", &other.to_string()),
            })?;
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
        let bgp = spec
            .bgp
            .as_ref()
            .map(|b| bird_model(b, cidr6, cidr4))
            .transpose()?;
        let mut password_secrets = Vec::new();
        let mut password_files = Vec::new();
        for (i, n) in spec.bgp.iter().flat_map(|b| b.neighbors.iter()).enumerate() {
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
        })
    }
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
