//! Per-node address pools: effective-CIDR resolution, allocation, release and
//! reservation, and the parser of flock's pod annotations (DESIGN §3, §4).
//!
//! - [`PodRequest::from_annotations`] turns a pod's annotation map and the
//!   node's [`NodeDefaults`] into a typed request, or an [`Error::Annotation`]
//!   naming the key, the value and what is wrong.
//! - [`Pools`] holds the node's IPv6/IPv4 CIDRs and every address in use;
//!   [`Pools::allocate`] serves a request, [`Pools::release`] and
//!   [`Pools::reserve`] keep it in step with the store.
//! - [`effective_cidr6`] / [`effective_cidr4`]: the rule matrix of DESIGN §3.
//! - [`plan_node_prefixes`]: cluster pools — which node gets which pod prefixes, by rack
//!   (pools, nodes with labels, current assignments in; assignments, exact per-pool
//!   capacity and problems out).
//! - [`NodeCidrs`] ([`validate_node_cidr6`], [`validate_node_cidr4`]): which pod CIDRs a
//!   node may have; [`Pools::stats`] and [`Pools::exhausted`]: how full its pools are.
//!
//! - [`assign_lb_addresses`] and [`service_routes`]: Service addresses — which
//!   LoadBalancer address each Service gets, and which Service routes a node announces.
//!
//! Pure: no I/O, no clock, no global RNG — randomness comes in as a `rand_core::Rng`.

mod annotations;
mod bitmap;
mod cidr;
mod cluster;
mod node_cidr;
mod pools;
mod reserved;
mod services;

pub use annotations::{
    ANNOTATION_PREFIX, AlgoSource, KEY_ADDRESSES, KEY_ANYCAST, KEY_CIDR4, KEY_CIDR6, KEY_IP_ALGO,
    KEY_IPV4, KEY_IPV6, NodeDefaults, PodRequest, Want,
};
pub use cidr::{effective_cidr4, effective_cidr6};
pub use cluster::{
    ClaimConflict, ClaimOwner, ClusterNode, ClusterPlan, ClusterPool, ClusterState,
    LabelRequirement, NodeAssignment, NodeSelector, PoolCidr4, PoolProblem, PoolReport,
    PrefixUsage, ReservedCidr, plan_node_prefixes,
};
pub use node_cidr::{
    LONGEST_NODE_PREFIX4, LONGEST_NODE_PREFIX6, NodeCidrProblem, NodeCidrs, SHORTEST_NODE_PREFIX4,
    validate_node_cidr4, validate_node_cidr6,
};
pub use pools::{Allocation, MAX_RANDOM_TRIES, MIN_PREFIX4, PoolStats, Pools};
pub use reserved::{is_forbidden4, is_forbidden6};
pub use services::{
    Announcement, EndpointFacts, LbPlan, LbProblem, LbRequest, Refusal, ServiceFacts, ServiceKey,
    ServiceRanges, ServiceType, TrafficPolicy, assign_lb_addresses, service_routes, unroutable,
};

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

/// An address family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// IPv6.
    V6,
    /// IPv4.
    V4,
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V6 => "IPv6",
            Family::V4 => "IPv4",
        })
    }
}

/// Everything that can go wrong in this crate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A pod annotation (or the node's ip-algo annotation) is wrong.
    #[error("annotation {key}={value:?}: {reason}")]
    Annotation {
        /// The annotation key, e.g. `flock.fritzlab.net/cidr6`.
        key: String,
        /// The value as written.
        value: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// None of the requested CIDRs overlaps the node's CIDR.
    #[error("none of the requested {family} CIDRs {requested} overlaps the node's pod CIDR {node}")]
    NoEffectiveCidr {
        /// The family.
        family: Family,
        /// The requested CIDRs, comma-separated.
        requested: String,
        /// The node's CIDR.
        node: IpNet,
    },
    /// The node has no pod CIDR of this family.
    #[error("the node has no {family} pod CIDR (NodeConfig spec.cidr{})", if matches!(family, Family::V6) { "6" } else { "4" })]
    NoNodeCidr {
        /// The family.
        family: Family,
    },
    /// The request asks for no address at all.
    #[error("the pod asks for neither an IPv6 nor an IPv4 address")]
    NoFamily,
    /// No free address is left.
    #[error("no free {family} address left in {cidr} ({allocated} in use)")]
    Exhausted {
        /// The family.
        family: Family,
        /// The effective CIDR searched.
        cidr: IpNet,
        /// How many addresses of the node's pool of this family are in use
        /// ([`PoolStats::allocated6`] / [`PoolStats::allocated4`]).
        allocated: usize,
    },
    /// A CIDR too small to hold a pod: IPv4 longer than /30 (network, `.1`
    /// and broadcast are never used), IPv6 /128 (the all-zero host is never used).
    #[error(
        "{cidr} is too small to hold a pod address: an IPv4 CIDR needs at least a /30 (network, .1 and broadcast are never handed out), an IPv6 CIDR at least a /127"
    )]
    CidrTooSmall {
        /// The CIDR.
        cidr: IpNet,
    },
    /// An IPv4 node CIDR too large for the allocation bitmap.
    #[error("IPv4 node CIDR {cidr} is too large: at most a /8 per node")]
    CidrTooLarge {
        /// The CIDR.
        cidr: IpNet,
    },
    /// The address is already held.
    #[error("address {addr} is already in use")]
    InUse {
        /// The address.
        addr: IpAddr,
    },
    /// A node pod CIDR (NodeConfig `spec.cidr6` / `spec.cidr4`) the node cannot serve.
    #[error("NodeConfig {} {value:?}: {problem}", family.node_cidr_field())]
    NodeCidr {
        /// The family; [`Family::node_cidr_field`] names the field.
        family: Family,
        /// The value as written.
        value: String,
        /// What is wrong with it.
        problem: NodeCidrProblem,
    },
}

/// `Result` of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests;

/// The README's example, compiled and run as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
