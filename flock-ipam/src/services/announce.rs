//! Which Service routes one node announces.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;

use super::{EndpointFacts, ServiceFacts, ServiceKey, ServiceRanges, ServiceType, TrafficPolicy};

/// The Service routes of one node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Announcement {
    /// Routes to announce: the cluster-IP aggregates and /128 and /32 host routes, sorted.
    pub routes: BTreeSet<IpNet>,
    /// Addresses refused, sorted by Service, field and address.
    pub refused: Vec<Refusal>,
}

/// An address a Service asks for that no node announces.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Refusal {
    /// The Service.
    pub service: ServiceKey,
    /// The field it came from: `spec.externalIPs` or `status.loadBalancer.ingress`.
    pub field: &'static str,
    /// The address as written.
    pub address: String,
    /// Why it is refused, saying what to change.
    pub reason: String,
}

/// The Service routes `node` announces, and every address refused.
///
/// - The pool's cluster-IP ranges ([`ServiceRanges::cluster_ips`]) as aggregates, always.
/// - `spec.externalIPs` (any type but ExternalName) inside
///   [`ServiceRanges::external_ips`], and, for a LoadBalancer Service,
///   `status.loadBalancer.ingress` IPs inside [`ServiceRanges::load_balancer`], as host
///   routes: with `externalTrafficPolicy: Local` only when the node has a ready endpoint of
///   the Service, otherwise always (every node: ECMP at the router).
/// - With `internalTrafficPolicy: Local`, the Service's cluster IPs inside an announced
///   cluster-IP range as host routes from the nodes with a ready endpoint: more specific
///   than the aggregate, they draw the traffic to those nodes only.
///
/// An address outside the allowed ranges, malformed or never routable is refused, from
/// every node alike (the decision does not depend on the node), so one event per Service
/// and address is enough. The result does not depend on the order of the inputs.
pub fn service_routes(
    node: &str,
    ranges: &ServiceRanges,
    services: &[ServiceFacts],
    endpoints: &[EndpointFacts],
) -> Announcement {
    let mut local: BTreeMap<&ServiceKey, bool> = BTreeMap::new();
    for e in endpoints {
        if e.ready && e.node.as_deref() == Some(node) {
            local.insert(&e.service, true);
        }
    }
    let mut out = Announcement::default();
    out.routes
        .extend(ranges.cluster_ips.iter().map(IpNet::trunc));
    let mut refused = BTreeSet::new();
    for svc in services {
        if svc.service_type == ServiceType::ExternalName {
            continue;
        }
        let has_local = local.contains_key(&svc.key);
        let external_ok = svc.external_traffic_policy == TrafficPolicy::Cluster || has_local;
        let mut external =
            |field: &'static str, text: &String, allowed: &[IpNet], what: &str| match check(
                text, allowed, what,
            ) {
                Ok(addr) => {
                    if external_ok {
                        out.routes.insert(IpNet::from(addr));
                    }
                }
                Err(reason) => {
                    refused.insert(Refusal {
                        service: svc.key.clone(),
                        field,
                        address: text.clone(),
                        reason,
                    });
                }
            };
        for text in &svc.external_ips {
            external(
                "spec.externalIPs",
                text,
                &ranges.external_ips,
                "externalIPCIDRs",
            );
        }
        if svc.service_type == ServiceType::LoadBalancer {
            for text in &svc.ingress_ips {
                external(
                    "status.loadBalancer.ingress",
                    text,
                    &ranges.load_balancer,
                    "loadBalancerCIDRs",
                );
            }
        }
        if svc.internal_traffic_policy == TrafficPolicy::Local && has_local {
            for text in &svc.cluster_ips {
                if let Ok(addr) = text.trim().parse::<IpAddr>()
                    && unroutable_or_none(addr)
                    && ranges.cluster_ips.iter().any(|c| c.contains(&addr))
                {
                    out.routes.insert(IpNet::from(addr));
                }
            }
        }
    }
    out.refused = refused.into_iter().collect();
    out
}

fn unroutable_or_none(addr: IpAddr) -> bool {
    super::unroutable(addr).is_none()
}

/// The address, or why it may not be announced.
fn check(text: &str, allowed: &[IpNet], field: &str) -> Result<IpAddr, String> {
    let addr: IpAddr = text
        .trim()
        .parse()
        .map_err(|_| "not an IP address".to_owned())?;
    if let Some(reason) = super::unroutable(addr) {
        return Err(format!("{reason} is never routed to a node"));
    }
    if allowed.iter().any(|c| c.contains(&addr)) {
        return Ok(addr);
    }
    let family: Vec<String> = allowed
        .iter()
        .filter(|c| c.network().is_ipv6() == addr.is_ipv6())
        .map(ToString::to_string)
        .collect();
    Err(if family.is_empty() {
        format!(
            "the node's NodePool allows no {} {field}; add one to spec.services.{field}",
            if addr.is_ipv6() { "IPv6" } else { "IPv4" }
        )
    } else {
        format!(
            "outside the NodePool's spec.services.{field} ({})",
            family.join(", ")
        )
    })
}
