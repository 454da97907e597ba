//! Service addresses: which LoadBalancer addresses the controller hands out
//! ([`assign_lb_addresses`]) and which Service routes a node announces over BGP
//! ([`service_routes`]).
//!
//! Both are pure decisions over plain data — a Service reduced to the fields they read
//! ([`ServiceFacts`], [`LbRequest`]), a node's ready endpoints ([`EndpointFacts`]) and what
//! the node's pool allows ([`ServiceRanges`]) — so the controller and the agent only apply
//! them to the API server and to BIRD.

mod announce;
mod assign;

#[cfg(test)]
mod tests;

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

pub use announce::{Announcement, Refusal, service_routes};
pub use assign::{LbPlan, LbProblem, LbRequest, assign_lb_addresses};

/// A Service's `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ServiceKey {
    /// The namespace.
    pub namespace: String,
    /// The name.
    pub name: String,
}

impl ServiceKey {
    /// `namespace/name`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> ServiceKey {
        ServiceKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// `spec.type` of a Service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ServiceType {
    /// `ClusterIP` (the default).
    #[default]
    ClusterIp,
    /// `NodePort`.
    NodePort,
    /// `LoadBalancer`.
    LoadBalancer,
    /// `ExternalName`: a DNS alias, no address of its own.
    ExternalName,
}

/// `externalTrafficPolicy` / `internalTrafficPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TrafficPolicy {
    /// Any endpoint in the cluster (the default): every node announces.
    #[default]
    Cluster,
    /// Only endpoints on the receiving node: only nodes with a ready endpoint announce.
    Local,
}

/// A Service as announcing reads it. Addresses stay text as they came from the API server,
/// so that a malformed one is refused by name rather than lost.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServiceFacts {
    /// `namespace/name`.
    pub key: ServiceKey,
    /// `spec.type`.
    pub service_type: ServiceType,
    /// `spec.clusterIPs` (or `spec.clusterIP`); `None`/headless entries left out.
    pub cluster_ips: Vec<String>,
    /// `spec.externalIPs`.
    pub external_ips: Vec<String>,
    /// `status.loadBalancer.ingress[].ip`.
    pub ingress_ips: Vec<String>,
    /// `spec.externalTrafficPolicy`: for external IPs and LoadBalancer addresses.
    pub external_traffic_policy: TrafficPolicy,
    /// `spec.internalTrafficPolicy`: for cluster IPs (announced one by one only when
    /// `Local`, and only inside the pool's announced cluster-IP range).
    pub internal_traffic_policy: TrafficPolicy,
}

/// One endpoint of a Service (from its EndpointSlices).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointFacts {
    /// The Service it belongs to (the slice's `kubernetes.io/service-name` label).
    pub service: ServiceKey,
    /// The node it runs on, if known.
    pub node: Option<String>,
    /// `conditions.ready` (absent counts as ready, as kube-proxy reads it).
    pub ready: bool,
}

/// What a node's pool allows it to announce.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServiceRanges {
    /// `loadBalancerCIDRs`: where LoadBalancer ingress addresses may lie.
    pub load_balancer: Vec<IpNet>,
    /// `externalIPCIDRs`: where `spec.externalIPs` may lie.
    pub external_ips: Vec<IpNet>,
    /// `clusterIPCIDRs`: the Service (cluster IP) ranges announced as aggregates.
    pub cluster_ips: Vec<IpNet>,
}

/// Why an address can never be routed to a node, if it cannot.
pub fn unroutable(addr: IpAddr) -> Option<&'static str> {
    match addr {
        IpAddr::V6(a) if a.is_unspecified() => Some("the unspecified address"),
        IpAddr::V6(a) if a.is_loopback() => Some("a loopback address"),
        IpAddr::V6(a) if a.is_multicast() => Some("a multicast address"),
        IpAddr::V6(a) if a.is_unicast_link_local() => Some("a link-local address"),
        IpAddr::V4(a) if a.is_unspecified() => Some("the unspecified address"),
        IpAddr::V4(a) if a.is_loopback() => Some("a loopback address"),
        IpAddr::V4(a) if a.is_multicast() => Some("a multicast address"),
        IpAddr::V4(a) if a.is_link_local() => Some("a link-local address"),
        IpAddr::V4(a) if a.is_broadcast() => Some("the broadcast address"),
        _ => None,
    }
}
