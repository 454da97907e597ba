//! What the agent knows of Services and their endpoints, reduced to the fields announcing
//! reads ([`flock_ipam::ServiceFacts`], [`flock_ipam::EndpointFacts`]), and this node's
//! Service routes computed from it with `flock-ipam`'s [`service_routes`]. Pure: watch
//! events come in as values (the watches are in [`crate::k8s::services`]).

pub mod guard;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use flock_ipam::{
    Announcement, EndpointFacts, ServiceFacts, ServiceKey, ServiceRanges, ServiceType,
    TrafficPolicy, service_routes,
};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use kube::runtime::watcher::Event;
use tokio::sync::watch;

use crate::cache::Relist;

/// The label kube-proxy skips a Service by (another proxy serves it): flock does not
/// announce such a Service either.
pub const SERVICE_PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";
/// The label that names an EndpointSlice's Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// A Service as announcing reads it; `None` for one kube-proxy does not serve.
pub fn service_facts(svc: &Service) -> Option<ServiceFacts> {
    if svc.labels().contains_key(SERVICE_PROXY_NAME_LABEL) {
        return None;
    }
    let spec = svc.spec.as_ref()?;
    let service_type = match spec.type_.as_deref() {
        Some("LoadBalancer") => ServiceType::LoadBalancer,
        Some("NodePort") => ServiceType::NodePort,
        Some("ExternalName") => ServiceType::ExternalName,
        _ => ServiceType::ClusterIp,
    };
    let policy = |p: Option<&str>| match p {
        Some("Local") => TrafficPolicy::Local,
        _ => TrafficPolicy::Cluster,
    };
    let mut cluster_ips: Vec<String> = spec.cluster_ips.clone().unwrap_or_default();
    if cluster_ips.is_empty() {
        cluster_ips.extend(spec.cluster_ip.clone());
    }
    cluster_ips.retain(|ip| !ip.is_empty() && ip != "None");
    let ingress_ips = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.clone())
        .collect();
    Some(ServiceFacts {
        key: ServiceKey::new(svc.namespace().unwrap_or_default(), svc.name_any()),
        service_type,
        cluster_ips,
        external_ips: spec.external_ips.clone().unwrap_or_default(),
        ingress_ips,
        external_traffic_policy: policy(spec.external_traffic_policy.as_deref()),
        internal_traffic_policy: policy(spec.internal_traffic_policy.as_deref()),
    })
}

/// The endpoints of an EndpointSlice (`discovery.k8s.io/v1`): each one's node and
/// readiness. `None` for a slice that names no Service.
pub fn slice_endpoints(slice: &EndpointSlice) -> Option<Vec<EndpointFacts>> {
    let service = slice.labels().get(SERVICE_NAME_LABEL)?.clone();
    let key = ServiceKey::new(slice.namespace().unwrap_or_default(), service);
    let endpoints = slice
        .endpoints
        .iter()
        .map(|e| EndpointFacts {
            service: key.clone(),
            node: e.node_name.clone(),
            // As kube-proxy reads it: an absent `ready` is ready.
            ready: e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true),
        })
        .collect();
    Some(endpoints)
}

#[derive(Debug, Default)]
struct View {
    services: Relist<ServiceFacts>,
    slices: Relist<Vec<EndpointFacts>>,
}

/// The Services and EndpointSlices of the cluster, as far as announcing needs them.
#[derive(Debug)]
pub struct ServiceState {
    view: Mutex<View>,
    changes: watch::Sender<u64>,
}

impl ServiceState {
    /// An empty state (not synced).
    pub fn new() -> Arc<ServiceState> {
        Arc::new(ServiceState {
            view: Mutex::new(View::default()),
            changes: watch::channel(0).0,
        })
    }

    fn update(&self, f: impl FnOnce(&mut View) -> bool) {
        let changed = f(&mut self.view.lock().unwrap_or_else(|p| p.into_inner()));
        if changed {
            self.changes.send_modify(|n| *n = n.wrapping_add(1));
        }
    }

    /// A watch event of a Service.
    pub fn on_service(&self, event: Event<Service>) {
        self.update(|v| v.services.feed(event, service_facts));
    }

    /// A watch event of an EndpointSlice.
    pub fn on_slice(&self, event: Event<EndpointSlice>) {
        self.update(|v| v.slices.feed(event, slice_endpoints));
    }

    /// Whether both watches finished their first listing.
    pub fn is_synced(&self) -> bool {
        let v = self.view.lock().unwrap_or_else(|p| p.into_inner());
        v.services.is_synced() && v.slices.is_synced()
    }

    /// Changes (a counter that moves when the content changed).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// The Service routes of `node` within `ranges`, and the refused addresses.
    pub fn announcement(&self, node: &str, ranges: &ServiceRanges) -> Announcement {
        let v = self.view.lock().unwrap_or_else(|p| p.into_inner());
        let services: Vec<ServiceFacts> = v.services.items().values().cloned().collect();
        let endpoints: Vec<EndpointFacts> = v.slices.items().values().flatten().cloned().collect();
        service_routes(node, ranges, &services, &endpoints)
    }
}

/// Refusals already reported, so that each is an event once per agent run (and again after
/// it went away and came back).
#[derive(Debug, Default)]
pub struct ReportedRefusals(BTreeMap<(ServiceKey, &'static str, String), String>);

impl ReportedRefusals {
    /// The refusals of `now` not reported yet; forgets those gone.
    pub fn fresh(&mut self, now: &[flock_ipam::Refusal]) -> Vec<flock_ipam::Refusal> {
        let mut next = BTreeMap::new();
        let mut fresh = Vec::new();
        for r in now {
            let k = (r.service.clone(), r.field, r.address.clone());
            if self.0.get(&k) != Some(&r.reason) {
                fresh.push(r.clone());
            }
            next.insert(k, r.reason.clone());
        }
        self.0 = next;
        fresh
    }
}

#[cfg(test)]
mod tests;
