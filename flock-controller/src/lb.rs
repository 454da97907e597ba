//! LoadBalancer IPAM: which Services get which address from the NodePools'
//! `spec.services.loadBalancerCIDRs`, decided by `flock-ipam`'s
//! [`assign_lb_addresses`](flock_ipam::assign_lb_addresses) over plain data ([`decide_lb`]),
//! and written to each Service's `status.loadBalancer.ingress` ([`apply_lb`]).
//!
//! - The Service's status is the durable record: a restarted controller reads the addresses
//!   back and keeps them.
//! - A Service is flock's when it is `type: LoadBalancer` and neither `spec.loadBalancerClass`
//!   (Kubernetes 1.24+; absent on 1.20) nor the annotation [`LB_CLASS_ANNOTATION`] names
//!   another class than [`LB_CLASS`]. On 1.20 the annotation is the only way to leave a
//!   Service to another controller.
//! - An address is released when its Service goes (nothing holds it any more) or stops being
//!   a flock LoadBalancer (its status is cleared, if the address is one of the pools').

use std::collections::BTreeSet;
use std::net::IpAddr;

use flock_ipam::{Family, LbRequest, ServiceKey, assign_lb_addresses};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Service;
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::error::{Error, Result};
use flock_k8s_api::NodePool;

/// flock's load balancer class (`spec.loadBalancerClass`, or the annotation on 1.20).
pub const LB_CLASS: &str = "flock.fritzlab.net/load-balancer";
/// The annotation that names a Service's load balancer class where the API has no
/// `spec.loadBalancerClass` (Kubernetes before 1.24): any value but [`LB_CLASS`] leaves the
/// Service to another controller.
pub const LB_CLASS_ANNOTATION: &str = "flock.fritzlab.net/load-balancer-class";
/// The annotation asking for specific addresses: comma-separated, at most one per family
/// (with `spec.loadBalancerIP`, which asks for one).
pub const LB_IPS_ANNOTATION: &str = "flock.fritzlab.net/load-balancer-ips";

/// One Service status to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IngressWrite {
    /// The Service.
    pub service: ServiceKey,
    /// Its new `status.loadBalancer.ingress` IPs (empty: cleared).
    pub ips: Vec<IpAddr>,
}

/// What one LoadBalancer reconcile does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LbDecision {
    /// Statuses that change.
    pub writes: Vec<IngressWrite>,
    /// Problems to report as Warning events on the Service: `(service, note)`.
    pub problems: Vec<(ServiceKey, String)>,
}

/// Whether flock serves this Service's load balancer.
pub fn is_flocks(svc: &Service) -> bool {
    let Some(spec) = svc.spec.as_ref() else {
        return false;
    };
    let class_ok = |c: Option<&String>| c.is_none_or(|c| c == LB_CLASS);
    spec.type_.as_deref() == Some("LoadBalancer")
        && class_ok(spec.load_balancer_class.as_ref())
        && class_ok(svc.annotations().get(LB_CLASS_ANNOTATION))
}

/// Whether another controller owns this Service's load balancer (by class).
fn is_others(svc: &Service) -> bool {
    let other = |c: Option<&String>| c.is_some_and(|c| c != LB_CLASS);
    other(
        svc.spec
            .as_ref()
            .and_then(|s| s.load_balancer_class.as_ref()),
    ) || other(svc.annotations().get(LB_CLASS_ANNOTATION))
}

fn ingress_ips(svc: &Service) -> Vec<IpAddr> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.as_deref().and_then(|t| t.parse().ok()))
        .collect()
}

fn key(svc: &Service) -> ServiceKey {
    ServiceKey::new(svc.namespace().unwrap_or_default(), svc.name_any())
}

/// Every pool's valid `loadBalancerCIDRs`, pools in name order.
pub fn load_balancer_cidrs(pools: &[NodePool]) -> Vec<IpNet> {
    let mut sorted: Vec<&NodePool> = pools.iter().collect();
    sorted.sort_by_key(|p| p.name_any());
    let mut out = Vec::new();
    for pool in sorted {
        if let Some(Ok(ranges)) = pool
            .spec
            .services
            .as_ref()
            .map(|s| s.ranges.ranges("spec.services"))
        {
            for c in ranges.load_balancer {
                if !out.contains(&c) {
                    out.push(c);
                }
            }
        }
    }
    out
}

/// Decides every flock LoadBalancer Service's addresses. Pure.
pub fn decide_lb(pools: &[NodePool], services: &[Service]) -> LbDecision {
    let cidrs = load_balancer_cidrs(pools);
    let mut decision = LbDecision::default();
    let mut requests = Vec::new();
    let mut current = std::collections::BTreeMap::new();
    for svc in services {
        let k = key(svc);
        let held = ingress_ips(svc);
        if !is_flocks(svc) {
            // No longer (or never) flock's: release what it holds of the pools' addresses,
            // unless another controller owns it.
            if !is_others(svc) && held.iter().any(|a| cidrs.iter().any(|c| c.contains(a))) {
                decision.writes.push(IngressWrite {
                    service: k,
                    ips: Vec::new(),
                });
            }
            continue;
        }
        let spec = svc.spec.as_ref();
        let families = spec
            .and_then(|s| s.ip_families.as_ref())
            .into_iter()
            .flatten()
            .filter_map(|f| match f.as_str() {
                "IPv6" => Some(Family::V6),
                "IPv4" => Some(Family::V4),
                _ => None,
            })
            .collect();
        let mut requested = Vec::new();
        let asked = spec
            .and_then(|s| s.load_balancer_ip.clone())
            .filter(|t| !t.is_empty())
            .map(|t| ("spec.loadBalancerIP".to_owned(), t));
        let annotated = svc
            .annotations()
            .get(LB_IPS_ANNOTATION)
            .into_iter()
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(|t| {
                (
                    format!("metadata.annotations[{LB_IPS_ANNOTATION}]"),
                    t.to_owned(),
                )
            });
        for (field, text) in asked.into_iter().chain(annotated) {
            match text.parse::<IpAddr>() {
                Ok(a) if !requested.contains(&a) => requested.push(a),
                Ok(_) => {}
                Err(_) => decision
                    .problems
                    .push((k.clone(), format!("{field} {text:?} is not an IP address"))),
            }
        }
        current.insert(k.clone(), held.clone());
        requests.push(LbRequest {
            key: k,
            families,
            requested,
            current: held,
        });
    }
    let plan = assign_lb_addresses(&cidrs, &requests);
    for (k, ips) in plan.addresses {
        if current.get(&k) != Some(&ips) {
            decision.writes.push(IngressWrite { service: k, ips });
        }
    }
    decision
        .problems
        .extend(plan.problems.into_iter().map(|p| (p.service, p.reason)));
    decision.writes.sort_by(|a, b| a.service.cmp(&b.service));
    decision
}

/// Writes one Service's `status.loadBalancer.ingress` (a merge patch: the list is replaced).
pub async fn apply_lb(client: &Client, write: &IngressWrite) -> Result<()> {
    let api: Api<Service> = Api::namespaced(client.clone(), &write.service.namespace);
    let ingress: Vec<_> = write
        .ips
        .iter()
        .map(|ip| json!({"ip": ip.to_string()}))
        .collect();
    let patch = json!({"status": {"loadBalancer": {"ingress": ingress}}});
    api.patch_status(
        &write.service.name,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .map(drop)
    .map_err(|e| Error::Kube {
        op: format!(
            "write status.loadBalancer.ingress of Service {} ({})",
            write.service,
            if write.ips.is_empty() {
                "release".to_owned()
            } else {
                write
                    .ips
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        ),
        source: Box::new(e),
    })
}

/// Problems already reported, so each becomes one event per leader term.
#[derive(Debug, Default)]
pub struct ReportedProblems(BTreeSet<(ServiceKey, String)>);

impl ReportedProblems {
    /// The problems of `now` not reported yet; forgets those gone.
    pub fn fresh(&mut self, now: &[(ServiceKey, String)]) -> Vec<(ServiceKey, String)> {
        let next: BTreeSet<_> = now.iter().cloned().collect();
        let fresh = next.difference(&self.0).cloned().collect();
        self.0 = next;
        fresh
    }
}

#[cfg(test)]
mod tests;
