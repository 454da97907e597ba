//! The `NodeConfig` resource (`flock.fritzlab.net/v1alpha1`, cluster-scoped, named after the
//! node): what a node serves. The same schema is read from a YAML file in standalone mode.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

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
    /// Secondary networks (docs/multus.md): address spaces of their own, which a network
    /// configuration with `"network": NAME` (a NetworkAttachmentDefinition's) attaches a pod
    /// to beside the cluster network.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub networks: Vec<NetworkSpec>,
}

/// One secondary network of a node (`spec.networks[]`).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct NetworkSpec {
    /// Its name, as the network configuration's `network` names it (a DNS label).
    #[schemars(length(min = 1, max = 63), pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
    /// This node's IPv6 part of the network's space; either CIDR may be absent, not both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^[0-9a-fA-F:.]+/[0-9]{1,3}$"), extend("format" = "cidr"))]
    pub cidr6: Option<String>,
    /// This node's IPv4 part of the network's space.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^([0-9]{1,3}\.){3}[0-9]{1,3}/[0-9]{1,2}$"), extend("format" = "cidr"))]
    pub cidr4: Option<String>,
    /// What a pod routes through its interface on this network: the whole space (every
    /// node's CIDRs), and whatever else the network reaches. Absent: this node's CIDRs only.
    /// A pod's default routes stay the cluster network's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<String>,
    /// Whether the node announces the network's CIDRs over BGP (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub announce: Option<bool>,
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

/// `spec.bgp`: the node's router ID and its peering.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BgpSpec {
    /// The BGP router ID, an IPv4 address.
    #[schemars(extend("format" = "ipv4"))]
    pub router_id: String,
    /// The AS, neighbors, communities, timers and graceful shutdown: the fields of `spec.bgp`
    /// beside `routerID`, which a NodePool hands to every node it serves.
    #[serde(flatten)]
    pub peering: BgpPeering,
}

/// The fields of `spec.bgp` that do not name the node, so that a NodePool's `spec.bgp` is this
/// same type (each node adds its own router ID).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BgpPeering {
    /// The node's autonomous system number (1–4294967295).
    #[schemars(range(min = 1, max = 4294967295u32))]
    pub asn: u32,
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

/// Graceful restart's restart time when a neighbor does not set one.
pub const DEFAULT_RESTART_TIME: u16 = 120;
/// BFD's interval when a neighbor does not set one (100 ms x 3: down in 300 ms).
pub const DEFAULT_BFD_INTERVAL_MS: u32 = 100;
/// BFD's multiplier when a neighbor does not set one.
pub const DEFAULT_BFD_MULTIPLIER: u8 = 3;
