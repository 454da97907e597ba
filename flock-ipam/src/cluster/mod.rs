//! Cluster pools: which node gets which pod prefixes ([`plan_node_prefixes`]).
//!
//! A pool (a rack, by node label) is an IPv6 CIDR cut into per-node prefixes of one length,
//! optionally with an IPv4 CIDR cut the same way. The plan keeps every assignment it is
//! given, never hands out a prefix that overlaps an assignment or a hand-written node's
//! CIDR, gives each new node of a pool the lowest free prefix of each family — both or
//! neither — and reports, per pool, the exact number of prefixes in use and free and every
//! problem: an invalid or overlapping pool, a node two pools select, a pool with no room.
//!
//! Per-node IPv6 prefixes may be any length up to a /120 whatever the pool's (a /32 cut into
//! /64s has 2^32 slots; a /8 into /120s, 2^112): slots are counted as merged intervals of
//! indexes, never enumerated.

mod claims;
mod problems;
mod selector;
mod slots;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

pub use problems::{ClaimConflict, ClaimOwner, PoolProblem};
pub use selector::{LabelRequirement, NodeSelector};

use crate::Family;
use crate::node_cidr::{LONGEST_NODE_PREFIX4, LONGEST_NODE_PREFIX6, SHORTEST_NODE_PREFIX4};
use claims::{Claims, Holder};
use slots::{FreeSlots, Range, SlotSpace};

/// A pool of node prefixes (a `NodePool`'s spec, validated by its caller's types only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterPool {
    /// The pool's name.
    pub name: String,
    /// The IPv6 CIDR cut into node prefixes.
    pub cidr6: Ipv6Net,
    /// The length of each node's IPv6 prefix (at least the pool's, at most /120).
    pub node_prefix6: u8,
    /// The IPv4 CIDR and per-node length, if nodes of this pool get IPv4 too.
    pub ipv4: Option<PoolCidr4>,
    /// Which nodes the pool serves.
    pub selector: NodeSelector,
}

/// The IPv4 part of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolCidr4 {
    /// The IPv4 CIDR cut into node prefixes.
    pub cidr: Ipv4Net,
    /// The length of each node's IPv4 prefix (/8 to /30, at least the pool's).
    pub node_prefix: u8,
}

/// A node as the pools see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    /// The node's name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
}

/// The prefixes of one node, from one pool.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeAssignment {
    /// The node's name.
    pub node: String,
    /// The pool it came from.
    pub pool: String,
    /// The node's IPv6 prefix.
    pub cidr6: Ipv6Net,
    /// The node's IPv4 prefix, when the pool has IPv4.
    pub cidr4: Option<Ipv4Net>,
}

/// A CIDR no pool may hand out: a hand-written NodeConfig's.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ReservedCidr {
    /// The node (NodeConfig) that holds it; that node gets nothing from a pool.
    pub node: String,
    /// The CIDR.
    pub cidr: IpNet,
}

/// Everything a plan is computed from; the order of each slice does not matter.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClusterState<'a> {
    /// Every pool.
    pub pools: &'a [ClusterPool],
    /// Every node that exists.
    pub nodes: &'a [ClusterNode],
    /// Every assignment recorded so far (at most one per node), including those of nodes
    /// that are gone: their prefixes stay taken until the caller drops the record.
    pub assignments: &'a [NodeAssignment],
    /// CIDRs of hand-written node configurations.
    pub reserved: &'a [ReservedCidr],
}

/// Prefix counts of one family of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PrefixUsage {
    /// Node prefixes the pool holds: 2^(node prefix length − pool prefix length).
    pub capacity: u128,
    /// Node prefixes that overlap an assignment (of any pool) or a reserved CIDR, after
    /// this plan.
    pub in_use: u128,
    /// `capacity − in_use`.
    pub free: u128,
}

/// What one pool looks like after the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolReport {
    /// The pool's name.
    pub pool: String,
    /// Nodes holding an assignment of this pool (kept or new).
    pub nodes: usize,
    /// IPv6 prefix counts (zero for an invalid pool).
    pub ipv6: PrefixUsage,
    /// IPv4 prefix counts, when the pool has IPv4.
    pub ipv4: Option<PrefixUsage>,
    /// Everything wrong, in a stable order; empty when the pool is healthy.
    pub problems: Vec<PoolProblem>,
}

/// The outcome of [`plan_node_prefixes`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClusterPlan {
    /// The assignments given, unchanged, sorted by node.
    pub kept: Vec<NodeAssignment>,
    /// New assignments, sorted by node; none overlaps another or anything kept or reserved.
    pub new: Vec<NodeAssignment>,
    /// Nodes with an assignment that no longer exist (sorted): the caller releases their
    /// prefixes when it is safe, by dropping the assignment.
    pub orphaned: Vec<String>,
    /// Existing nodes without an assignment that no pool selects (sorted).
    pub unselected: Vec<String>,
    /// One report per pool, sorted by name.
    pub pools: Vec<PoolReport>,
    /// Claims given that already overlap (kept as they are; they need an operator).
    pub conflicts: Vec<ClaimConflict>,
}

/// Plans which nodes get which prefixes. Pure and deterministic: the same state (in any
/// order) gives the same plan.
pub fn plan_node_prefixes(state: &ClusterState<'_>) -> ClusterPlan {
    let mut pools: Vec<&ClusterPool> = state.pools.iter().collect();
    pools.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    let mut kept: Vec<NodeAssignment> = state.assignments.to_vec();
    kept.sort_unstable();

    let mut reports: Vec<PoolReport> = pools
        .iter()
        .map(|p| PoolReport {
            pool: p.name.clone(),
            nodes: 0,
            ipv6: PrefixUsage::default(),
            ipv4: None,
            problems: validate(p),
        })
        .collect();
    let mut usable: Vec<bool> = reports.iter().map(|r| r.problems.is_empty()).collect();
    overlaps(&pools, &mut reports, &mut usable);

    // Claims per family: every kept assignment and reservation, by index (no copies).
    let mut claims6: Vec<(Range, Holder)> = Vec::with_capacity(kept.len());
    let mut claims4: Vec<(Range, Holder)> = Vec::new();
    for (i, a) in kept.iter().enumerate() {
        claims6.push((range6(a.cidr6), Holder::Kept(i)));
        if let Some(c) = a.cidr4 {
            claims4.push((range4(c), Holder::Kept(i)));
        }
    }
    for (i, r) in state.reserved.iter().enumerate() {
        match r.cidr {
            IpNet::V6(c) => claims6.push((range6(c), Holder::Reserved(i))),
            IpNet::V4(c) => claims4.push((range4(c), Holder::Reserved(i))),
        }
    }
    let claims6 = Claims::new(claims6);
    let claims4 = Claims::new(claims4);
    let owner = |h: Holder| match h {
        Holder::Kept(i) => ClaimOwner::Node {
            node: kept[i].node.clone(),
            pool: kept[i].pool.clone(),
        },
        Holder::Reserved(i) => ClaimOwner::HandWritten {
            node: state.reserved[i].node.clone(),
        },
    };
    let mut conflicts = claims6.conflicts(Family::V6, owner);
    conflicts.extend(claims4.conflicts(Family::V4, owner));

    // Which pool each waiting node goes to.
    let mut nodes: Vec<&ClusterNode> = state.nodes.iter().collect();
    nodes.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    nodes.dedup_by(|b, a| a.name == b.name);
    let mut reserved_nodes: Vec<&str> = state.reserved.iter().map(|r| r.node.as_str()).collect();
    reserved_nodes.sort_unstable();
    let has_record = |name: &str| {
        kept.binary_search_by(|a| a.node.as_str().cmp(name)).is_ok()
            || reserved_nodes.binary_search(&name).is_ok()
    };
    let mut queues: Vec<Vec<&str>> = vec![Vec::new(); pools.len()];
    let mut unselected = Vec::new();
    let mut matching: Vec<usize> = Vec::new();
    for node in &nodes {
        if has_record(&node.name) {
            continue;
        }
        matching.clear();
        matching.extend(
            pools
                .iter()
                .enumerate()
                .filter(|(_, p)| p.selector.matches(&node.labels))
                .map(|(i, _)| i),
        );
        match matching.as_slice() {
            [] => unselected.push(node.name.clone()),
            [one] => queues[*one].push(&node.name),
            several => {
                let names: Vec<String> = several.iter().map(|&i| pools[i].name.clone()).collect();
                for &i in several {
                    reports[i].problems.push(PoolProblem::NodeInSeveralPools {
                        node: node.name.clone(),
                        pools: names.clone(),
                    });
                }
            }
        }
    }

    let mut new = Vec::new();
    for (i, pool) in pools.iter().enumerate() {
        if !usable[i] {
            continue;
        }
        let space6 = space6(pool);
        let occupied6 = space6.occupied(claims6.within(space6.range()));
        let space4 = pool.ipv4.map(space4);
        let occupied4 = space4
            .map(|s| s.occupied(claims4.within(s.range())))
            .unwrap_or_default();
        let mut free6 = FreeSlots::new(&occupied6, space6.capacity());
        let mut free4 = space4.map(|s| FreeSlots::new(&occupied4, s.capacity()));
        let mut given = 0u128;
        let queue = &queues[i];
        for (k, node) in queue.iter().enumerate() {
            let slot6 = free6.take();
            let slot4 = free4.as_mut().map(FreeSlots::take);
            let (Some(slot6), None | Some(Some(_))) = (slot6, slot4) else {
                let (family, cidr, node_prefix, used) = match slot6 {
                    None => (
                        Family::V6,
                        IpNet::V6(pool.cidr6),
                        pool.node_prefix6,
                        slots::count(&occupied6) + given,
                    ),
                    Some(_) => {
                        let v4 = pool.ipv4.expect("slot4 exists only with ipv4");
                        (
                            Family::V4,
                            IpNet::V4(v4.cidr),
                            v4.node_prefix,
                            slots::count(&occupied4) + given,
                        )
                    }
                };
                reports[i].problems.push(PoolProblem::Exhausted {
                    family,
                    cidr,
                    node_prefix,
                    in_use: used,
                    waiting: queue[k..].iter().map(|n| (*n).to_owned()).collect(),
                });
                break;
            };
            given += 1;
            let cidr6 = Ipv6Net::new(
                Ipv6Addr::from(space6.slot_address(slot6)),
                pool.node_prefix6,
            )
            .expect("a valid pool's node prefix is at most /128");
            let cidr4 = match (space4, slot4.flatten(), pool.ipv4) {
                (Some(s), Some(slot), Some(v4)) => Some(
                    Ipv4Net::new(
                        Ipv4Addr::from(u32::try_from(s.slot_address(slot)).unwrap_or(0)),
                        v4.node_prefix,
                    )
                    .expect("a valid pool's node prefix is at most /32"),
                ),
                _ => None,
            };
            new.push(NodeAssignment {
                node: (*node).to_owned(),
                pool: pool.name.clone(),
                cidr6,
                cidr4,
            });
        }
        reports[i].ipv6 = usage(space6.capacity(), slots::count(&occupied6) + given);
        reports[i].ipv4 = space4.map(|s| usage(s.capacity(), slots::count(&occupied4) + given));
    }
    // Counts of pools blocked by an overlap (valid, so they have a size).
    for (i, pool) in pools.iter().enumerate() {
        if usable[i] || !validate(pool).is_empty() {
            continue;
        }
        let s6 = space6(pool);
        reports[i].ipv6 = usage(
            s6.capacity(),
            slots::count(&s6.occupied(claims6.within(s6.range()))),
        );
        reports[i].ipv4 = pool.ipv4.map(space4).map(|s4| {
            usage(
                s4.capacity(),
                slots::count(&s4.occupied(claims4.within(s4.range()))),
            )
        });
    }

    new.sort_unstable();
    for a in kept.iter().chain(new.iter()) {
        if let Ok(i) = pools.binary_search_by(|p| p.name.as_str().cmp(&a.pool)) {
            reports[i].nodes += 1;
        }
    }
    let orphaned = kept
        .iter()
        .filter(|a| {
            nodes
                .binary_search_by(|n| n.name.as_str().cmp(&a.node))
                .is_err()
        })
        .map(|a| a.node.clone())
        .collect();
    ClusterPlan {
        kept,
        new,
        orphaned,
        unselected,
        pools: reports,
        conflicts,
    }
}

fn usage(capacity: u128, in_use: u128) -> PrefixUsage {
    PrefixUsage {
        capacity,
        in_use,
        free: capacity - in_use,
    }
}

fn range6(c: Ipv6Net) -> Range {
    let c = c.trunc();
    Range::of_prefix(u128::from(c.network()), c.prefix_len(), 128)
}

fn range4(c: Ipv4Net) -> Range {
    let c = c.trunc();
    Range::of_prefix(u128::from(u32::from(c.network())), c.prefix_len(), 32)
}

fn space6(p: &ClusterPool) -> SlotSpace {
    SlotSpace {
        base: u128::from(p.cidr6.network()),
        len: p.cidr6.prefix_len(),
        slot: p.node_prefix6,
        width: 128,
    }
}

fn space4(p: PoolCidr4) -> SlotSpace {
    SlotSpace {
        base: u128::from(u32::from(p.cidr.network())),
        len: p.cidr.prefix_len(),
        slot: p.node_prefix,
        width: 32,
    }
}

/// The pool's own problems: host bits, node prefix lengths.
fn validate(p: &ClusterPool) -> Vec<PoolProblem> {
    let mut problems = Vec::new();
    let mut invalid = |field: &'static str, value: String, reason: String| {
        problems.push(PoolProblem::Invalid {
            field,
            value,
            reason,
        });
    };
    if p.cidr6.trunc() != p.cidr6 {
        invalid(
            "spec.cidr6",
            p.cidr6.to_string(),
            format!("has host bits set; did you mean {}?", p.cidr6.trunc()),
        );
    }
    let len6 = p.cidr6.prefix_len();
    if p.node_prefix6 < len6 || p.node_prefix6 > LONGEST_NODE_PREFIX6 {
        invalid(
            "spec.nodePrefix6",
            p.node_prefix6.to_string(),
            format!("must be between the pool's /{len6} and /{LONGEST_NODE_PREFIX6}"),
        );
    }
    if let Some(v4) = p.ipv4 {
        if v4.cidr.trunc() != v4.cidr {
            invalid(
                "spec.cidr4",
                v4.cidr.to_string(),
                format!("has host bits set; did you mean {}?", v4.cidr.trunc()),
            );
        }
        let len4 = v4.cidr.prefix_len();
        let shortest = len4.max(SHORTEST_NODE_PREFIX4);
        if v4.node_prefix < shortest || v4.node_prefix > LONGEST_NODE_PREFIX4 {
            invalid(
                "spec.nodePrefix4",
                v4.node_prefix.to_string(),
                format!("must be between /{shortest} and /{LONGEST_NODE_PREFIX4}"),
            );
        }
    }
    problems
}

/// Marks every pair of pools whose CIDRs overlap: both report it, neither assigns.
fn overlaps(pools: &[&ClusterPool], reports: &mut [PoolReport], usable: &mut [bool]) {
    for i in 0..pools.len() {
        for j in i + 1..pools.len() {
            let (a, b) = (pools[i], pools[j]);
            let mut pairs = vec![(
                Family::V6,
                IpNet::V6(a.cidr6.trunc()),
                IpNet::V6(b.cidr6.trunc()),
            )];
            if let (Some(x), Some(y)) = (a.ipv4, b.ipv4) {
                pairs.push((
                    Family::V4,
                    IpNet::V4(x.cidr.trunc()),
                    IpNet::V4(y.cidr.trunc()),
                ));
            }
            for (family, ca, cb) in pairs {
                if ca.contains(&cb) || cb.contains(&ca) {
                    for (k, cidr, other, other_cidr) in [(i, ca, b, cb), (j, cb, a, ca)] {
                        reports[k].problems.push(PoolProblem::Overlaps {
                            family,
                            cidr,
                            other_pool: other.name.clone(),
                            other_cidr,
                        });
                        usable[k] = false;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
