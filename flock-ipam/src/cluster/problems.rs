//! What can be wrong with a pool, and with the claims given to the planner; each says which
//! pool, node and CIDR it is about and what to do.

use std::fmt;

use ipnet::IpNet;

use crate::Family;

/// At most this many waiting nodes are named in a message.
const NAMED_NODES: usize = 5;

/// Something wrong with one pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolProblem {
    /// A field of the pool is invalid; the pool assigns nothing.
    Invalid {
        /// The field, e.g. `spec.nodePrefix6`.
        field: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// The pool's CIDR overlaps another pool's; neither assigns anything new.
    Overlaps {
        /// The family.
        family: Family,
        /// This pool's CIDR.
        cidr: IpNet,
        /// The other pool.
        other_pool: String,
        /// The other pool's CIDR.
        other_cidr: IpNet,
    },
    /// A node without prefixes is selected by several pools; it gets none.
    NodeInSeveralPools {
        /// The node.
        node: String,
        /// Every pool that selects it, sorted.
        pools: Vec<String>,
    },
    /// No free node prefix is left for the waiting nodes; they get none (of either family).
    Exhausted {
        /// The family that ran out.
        family: Family,
        /// The pool's CIDR of that family.
        cidr: IpNet,
        /// The node prefix length.
        node_prefix: u8,
        /// Prefixes in use.
        in_use: u128,
        /// The nodes that got nothing, sorted.
        waiting: Vec<String>,
    },
}

impl PoolProblem {
    /// The condition reason (`PascalCase`), for status conditions and events.
    pub fn reason(&self) -> &'static str {
        match self {
            PoolProblem::Invalid { .. } => "InvalidSpec",
            PoolProblem::Overlaps { .. } => "OverlappingPools",
            PoolProblem::NodeInSeveralPools { .. } => "NodeInSeveralPools",
            PoolProblem::Exhausted { .. } => "PoolExhausted",
        }
    }

    /// A message naming the pool, the node and the CIDR.
    pub fn message(&self, pool: &str) -> String {
        match self {
            PoolProblem::Invalid {
                field,
                value,
                reason,
            } => format!("NodePool {pool}: {field} {value:?}: {reason}"),
            PoolProblem::Overlaps {
                family,
                cidr,
                other_pool,
                other_cidr,
            } => format!(
                "NodePool {pool}: {family} CIDR {cidr} overlaps NodePool {other_pool}'s \
                 {other_cidr}; neither assigns new prefixes until one is changed"
            ),
            PoolProblem::NodeInSeveralPools { node, pools } => format!(
                "NodePool {pool}: node {node} is selected by NodePools {}; it gets no prefix \
                 until exactly one selects it",
                pools.join(", ")
            ),
            PoolProblem::Exhausted {
                family,
                cidr,
                node_prefix,
                in_use,
                waiting,
            } => {
                let mut named = waiting
                    .iter()
                    .take(NAMED_NODES)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ");
                if waiting.len() > NAMED_NODES {
                    named.push_str(&format!(" and {} more", waiting.len() - NAMED_NODES));
                }
                format!(
                    "NodePool {pool}: no free /{node_prefix} left in {family} CIDR {cidr} \
                     ({in_use} in use); node(s) {named} get no prefix"
                )
            }
        }
    }
}

/// Who holds a claimed CIDR.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum ClaimOwner {
    /// A node's assignment from a pool.
    Node {
        /// The node.
        node: String,
        /// The pool recorded with it.
        pool: String,
    },
    /// A hand-written NodeConfig.
    HandWritten {
        /// The node.
        node: String,
    },
}

impl fmt::Display for ClaimOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClaimOwner::Node { node, pool } => write!(f, "node {node} (NodePool {pool})"),
            ClaimOwner::HandWritten { node } => write!(f, "hand-written NodeConfig {node}"),
        }
    }
}

/// Two claims that already overlap: the planner keeps both (it never moves a prefix) and
/// hands out nothing that overlaps either.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimConflict {
    /// The family.
    pub family: Family,
    /// One holder.
    pub first: ClaimOwner,
    /// Its CIDR.
    pub first_cidr: IpNet,
    /// The other holder.
    pub second: ClaimOwner,
    /// Its CIDR.
    pub second_cidr: IpNet,
}

impl fmt::Display for ClaimConflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} CIDR {} of {} overlaps {} of {}; one of them must be changed by hand",
            self.family, self.first_cidr, self.first, self.second_cidr, self.second
        )
    }
}
