//! What one reconcile of the pool controller does, decided over plain data: the NodeConfigs
//! to create, update and release, each pool's status and the events to record. Pure: the
//! clock comes in as an argument, nothing is read or written here.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::time::Duration;

use flock_ipam::{ClusterNode, ClusterState, NodeAssignment, ReservedCidr};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use k8s_openapi::jiff::Timestamp;

use crate::pool_status::{PoolEvent, pool_status};
use crate::{GONE_SINCE_ANNOTATION, MANAGED_BY, MANAGED_BY_LABEL, POOL_LABEL};
use flock_k8s_api::{IP_ALGO_ANNOTATION, NodeConfig};
use flock_k8s_api::{NodePool, NodePoolStatus, router_id};

/// A Node as the controller sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    /// The node's name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its first IPv4 InternalIP (its BGP router ID).
    pub internal_ipv4: Option<Ipv4Addr>,
}

/// Everything a reconcile is decided from (the watch caches, plus the controller's own
/// writes they have not shown yet).
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    /// Every NodePool.
    pub pools: &'a [NodePool],
    /// Every Node.
    pub nodes: &'a [NodeFacts],
    /// Every NodeConfig, hand-written or the controller's.
    pub node_configs: &'a [NodeConfig],
    /// The ranges of every `ServiceCIDR` (networking.k8s.io/v1), for the pools that follow
    /// them ([`service_cidr_ranges`]).
    pub service_cidrs: &'a [String],
    /// How long a gone node's prefixes stay its own while its NodeConfig still reports
    /// allocations, counted from the controller's mark [`GONE_SINCE_ANNOTATION`].
    pub release_grace: Duration,
    /// Gone nodes to which no pod is bound any more (the pod garbage collector deletes the
    /// pods of a deleted Node): a LIST per node [`pod_checks_due`] names.
    pub podless: &'a BTreeSet<String>,
}

/// When the controller first saw a NodeConfig's Node gone: its [`GONE_SINCE_ANNOTATION`].
fn gone_since(nc: &NodeConfig) -> Option<Timestamp> {
    nc.metadata
        .annotations
        .as_ref()?
        .get(GONE_SINCE_ANNOTATION)?
        .parse()
        .ok()
}

fn held(nc: &NodeConfig) -> u64 {
    nc.status
        .as_ref()
        .map_or(0, |s| s.allocated6 + s.allocated4)
}

/// Whether a gone node's grace has run out at `now`.
fn grace_over(since: Timestamp, grace: Duration, now: Timestamp) -> bool {
    let grace = i64::try_from(grace.as_secs()).unwrap_or(i64::MAX);
    now.as_second().saturating_sub(since.as_second()) >= grace
}

/// The gone nodes whose pods the controller must look for before it decides: its own
/// NodeConfigs whose Node is gone, that still report allocations, and whose grace has run out.
/// (Every other node's fate does not depend on its pods, so nothing is listed for it.)
pub fn pod_checks_due(
    node_configs: &[NodeConfig],
    nodes: &[NodeFacts],
    release_grace: Duration,
    now: Timestamp,
) -> Vec<String> {
    node_configs
        .iter()
        .filter(|nc| owned_pool(nc).is_some() && held(nc) > 0)
        .filter(|nc| gone_since(nc).is_some_and(|t| grace_over(t, release_grace, now)))
        .filter_map(|nc| nc.metadata.name.clone())
        .filter(|name| !nodes.iter().any(|n| &n.name == name))
        .collect()
}

/// The ranges of the cluster's `ServiceCIDR` objects, sorted, each once. A ServiceCIDR being
/// deleted counts until it is gone: the apiserver keeps it (a finalizer) while a Service
/// still holds an address in it, so its range must stay routed that long; one not yet Ready
/// costs nothing to announce early.
pub fn service_cidr_ranges<'a>(
    objects: impl IntoIterator<Item = &'a k8s_openapi::api::networking::v1::ServiceCIDR>,
) -> Vec<String> {
    let mut ranges: Vec<String> = objects
        .into_iter()
        .filter_map(|o| o.spec.as_ref())
        .flat_map(|spec| spec.cidrs.iter().flatten().cloned())
        .collect();
    ranges.sort();
    ranges.dedup();
    ranges
}

/// A NodeConfig to delete: its node is gone and its agent reported no allocations, or, past
/// the release grace, no pod is bound to it any more. The delete is conditional on the uid and resource version that were seen, so a status
/// written in between (allocations after all) makes it fail rather than strand pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    /// The NodeConfig (and node) name.
    pub name: String,
    /// Its uid.
    pub uid: Option<String>,
    /// Its resource version.
    pub resource_version: Option<String>,
    /// The pool it came from.
    pub pool: String,
    /// Its prefixes, for the event.
    pub prefixes: String,
}

/// The outcome of one reconcile.
#[derive(Debug, Clone, Default)]
pub struct Reconcile {
    /// New controller-owned NodeConfigs (created, never replacing an existing object).
    pub create: Vec<NodeConfig>,
    /// Controller-owned NodeConfigs whose pool settings changed (prefixes never change);
    /// each carries the resource version it was computed from.
    pub update: Vec<NodeConfig>,
    /// NodeConfigs to delete, releasing their prefixes.
    pub release: Vec<Release>,
    /// New status per pool, only where it changed.
    pub pool_status: Vec<(String, NodePoolStatus)>,
    /// Events to record.
    pub events: Vec<PoolEvent>,
}

/// Whether the controller owns a NodeConfig: both labels set. Nothing else is ever touched.
pub fn owned_pool(nc: &NodeConfig) -> Option<&str> {
    let labels = nc.metadata.labels.as_ref()?;
    (labels.get(MANAGED_BY_LABEL).map(String::as_str) == Some(MANAGED_BY))
        .then(|| labels.get(POOL_LABEL).map(String::as_str))
        .flatten()
}

/// The assignment a controller-owned NodeConfig records; `None` if it was edited into
/// something unreadable (it is then left alone, and its node gets nothing new).
fn recorded(nc: &NodeConfig, pool: &str) -> Option<NodeAssignment> {
    let cidr6: Ipv6Net = nc.spec.cidr6.as_deref()?.parse().ok()?;
    let cidr4: Option<Ipv4Net> = match nc.spec.cidr4.as_deref() {
        Some(c) => Some(c.parse().ok()?),
        None => None,
    };
    Some(NodeAssignment {
        node: nc.metadata.name.clone()?,
        pool: pool.to_owned(),
        cidr6,
        cidr4,
    })
}

/// `90s`, `10m`, `2h`: a grace as its flag takes it.
fn humantime(d: Duration) -> String {
    match d.as_secs() {
        s if s % 3600 == 0 && s > 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 && s > 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

fn prefixes(a: &NodeAssignment) -> String {
    match a.cidr4 {
        Some(c4) => format!("{}, {c4}", a.cidr6),
        None => a.cidr6.to_string(),
    }
}

/// Decides one reconcile.
pub fn decide(observed: &Observed<'_>, now: Timestamp) -> Reconcile {
    let mut out = Reconcile::default();
    // NodeConfigs: the controller's own are the assignment records; hand-written ones
    // reserve their CIDRs and keep their node out of every pool.
    let mut kept = Vec::new();
    let mut owned: BTreeMap<&str, &NodeConfig> = BTreeMap::new();
    let mut reserved = Vec::new();
    let mut configured: BTreeSet<&str> = BTreeSet::new();
    for nc in observed.node_configs {
        let Some(name) = nc.metadata.name.as_deref() else {
            continue;
        };
        configured.insert(name);
        match owned_pool(nc) {
            Some(pool) => {
                if let Some(a) = recorded(nc, pool) {
                    kept.push(a);
                    owned.insert(name, nc);
                }
            }
            None => {
                let cidrs = [
                    nc.spec
                        .cidr6
                        .as_deref()
                        .and_then(|c| c.parse::<IpNet>().ok()),
                    nc.spec
                        .cidr4
                        .as_deref()
                        .and_then(|c| c.parse::<IpNet>().ok()),
                ];
                for cidr in cidrs.into_iter().flatten() {
                    reserved.push(ReservedCidr {
                        node: name.to_owned(),
                        cidr,
                    });
                }
            }
        }
    }

    let mut valid: BTreeMap<&str, &NodePool> = BTreeMap::new();
    let mut cluster_pools = Vec::new();
    let mut invalid: BTreeMap<&str, String> = BTreeMap::new();
    for pool in observed.pools {
        let Some(name) = pool.metadata.name.as_deref() else {
            continue;
        };
        match pool.cluster_pool() {
            Ok(p) => {
                valid.insert(name, pool);
                cluster_pools.push(p);
            }
            Err(e) => {
                invalid.insert(name, format!("NodePool {name}: {e}"));
            }
        }
    }

    let facts: BTreeMap<&str, &NodeFacts> = observed
        .nodes
        .iter()
        .map(|n| (n.name.as_str(), n))
        .collect();
    // A node with a NodeConfig the plan does not hold (hand-written, or unreadable) is
    // left out: it is configured already.
    let nodes: Vec<ClusterNode> = observed
        .nodes
        .iter()
        .filter(|n| !configured.contains(n.name.as_str()) || owned.contains_key(n.name.as_str()))
        .map(|n| ClusterNode {
            name: n.name.clone(),
            labels: n.labels.clone(),
        })
        .collect();
    let plan = flock_ipam::plan_node_prefixes(&ClusterState {
        pools: &cluster_pools,
        nodes: &nodes,
        assignments: &kept,
        reserved: &reserved,
    });

    let ipv4_of = |node: &str| facts.get(node).and_then(|f| f.internal_ipv4);
    for a in &plan.new {
        let Some(pool) = valid.get(a.pool.as_str()) else {
            continue;
        };
        let rid = router_id(&a.node, ipv4_of(&a.node), a);
        out.create.push(NodeConfig {
            metadata: kube::api::ObjectMeta {
                name: Some(a.node.clone()),
                labels: Some(BTreeMap::from([
                    (MANAGED_BY_LABEL.to_owned(), MANAGED_BY.to_owned()),
                    (POOL_LABEL.to_owned(), a.pool.clone()),
                ])),
                annotations: pool.node_annotations(),
                ..Default::default()
            },
            spec: pool.node_config_spec(a, rid, observed.service_cidrs),
            status: None,
        });
        out.events.push(PoolEvent {
            pool: a.pool.clone(),
            warning: false,
            reason: "PrefixAssigned".into(),
            note: format!("NodePool {}: node {} gets {}", a.pool, a.node, prefixes(a)),
        });
    }

    let mut release_pending: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for a in &plan.kept {
        let Some(nc) = owned.get(a.node.as_str()) else {
            continue;
        };
        if plan.orphaned.binary_search(&a.node).is_ok() {
            let held = held(nc);
            let since = gone_since(nc);
            let why = if held == 0 {
                Some("reported no allocations".to_owned())
            } else if since.is_some_and(|t| grace_over(t, observed.release_grace, now))
                && observed.podless.contains(&a.node)
            {
                // Its agent cannot report any more: its pod went with the Node, and since
                // Kubernetes 1.32 its pod-bound token with it.
                Some(format!(
                    "no pod has been bound to it for the release grace ({}; its agent last \
                     reported {held} pod address(es))",
                    humantime(observed.release_grace)
                ))
            } else {
                None
            };
            if let Some(why) = why {
                out.release.push(Release {
                    name: a.node.clone(),
                    uid: nc.metadata.uid.clone(),
                    resource_version: nc.metadata.resource_version.clone(),
                    pool: a.pool.clone(),
                    prefixes: prefixes(a),
                });
                out.events.push(PoolEvent {
                    pool: a.pool.clone(),
                    warning: false,
                    reason: "PrefixReleased".into(),
                    note: format!(
                        "NodePool {}: node {} is gone and {why}; {} returns to the pool",
                        a.pool,
                        a.node,
                        prefixes(a)
                    ),
                });
                continue;
            }
            let since = match since {
                Some(t) => t,
                None => {
                    // The durable start of its grace, whichever instance leads later.
                    let mut marked = (*nc).clone();
                    marked
                        .metadata
                        .annotations
                        .get_or_insert_with(BTreeMap::new)
                        .insert(GONE_SINCE_ANNOTATION.to_owned(), now.to_string());
                    marked.status = None;
                    out.update.push(marked);
                    now
                }
            };
            release_pending
                .entry(a.pool.as_str())
                .or_default()
                .push(format!(
                    "{} ({}: {held} pod address(es) still reported; gone since {since}, \
                     released once no pod is bound to it after {})",
                    a.node,
                    prefixes(a),
                    humantime(observed.release_grace)
                ));
            continue;
        }
        // The pool's settings may have changed: BGP, defaults, ip-algo, the router ID.
        let Some(pool) = valid.get(a.pool.as_str()) else {
            continue;
        };
        let spec = pool.node_config_spec(
            a,
            router_id(&a.node, ipv4_of(&a.node), a),
            observed.service_cidrs,
        );
        let mut annotations = nc.metadata.annotations.clone().unwrap_or_default();
        match &pool.spec.ip_algo {
            Some(algo) => annotations.insert(IP_ALGO_ANNOTATION.to_owned(), algo.clone()),
            None => annotations.remove(IP_ALGO_ANNOTATION),
        };
        // Its Node is back: its grace no longer runs.
        annotations.remove(GONE_SINCE_ANNOTATION);
        let same_annotations = annotations == nc.metadata.annotations.clone().unwrap_or_default();
        if spec != nc.spec || !same_annotations {
            let mut updated = (*nc).clone();
            updated.spec = spec;
            updated.metadata.annotations = (!annotations.is_empty()).then_some(annotations);
            updated.status = None;
            out.update.push(updated);
        }
    }

    let conflicts: BTreeMap<&str, Vec<String>> =
        plan.conflicts.iter().fold(BTreeMap::new(), |mut m, c| {
            for owner in [&c.first, &c.second] {
                if let flock_ipam::ClaimOwner::Node { pool, .. } = owner {
                    m.entry(pool.as_str()).or_default().push(c.to_string());
                }
            }
            m
        });
    for pool in observed.pools {
        let Some(name) = pool.metadata.name.as_deref() else {
            continue;
        };
        let report = plan.pools.iter().find(|r| r.pool == name);
        let (status, events) = pool_status(
            pool,
            report,
            invalid.get(name).map(String::as_str),
            conflicts.get(name).map(Vec::as_slice).unwrap_or_default(),
            release_pending
                .get(name)
                .map(Vec::as_slice)
                .unwrap_or_default(),
            now,
        );
        out.events.extend(events);
        if pool.status.as_ref() != Some(&status) {
            out.pool_status.push((name.to_owned(), status));
        }
    }
    out
}

#[cfg(test)]
mod tests;
