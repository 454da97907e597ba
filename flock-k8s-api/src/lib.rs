//! flock's Kubernetes API (`flock.fritzlab.net/v1alpha1`): the cluster-scoped custom resources
//! [`NodeConfig`] (what one node serves: its pod CIDRs, family defaults, BGP setup and Service
//! ranges, with the status its agent writes) and [`NodePool`] (a rack's node address space,
//! from which the pool controller writes one NodeConfig per selected Node), their schemas, and
//! the labels and annotations flock puts on them.
//!
//! The types depend on nothing but `kube`'s derive, `k8s-openapi`, `serde` and `schemars`:
//! a tool that reads or writes these resources adds this crate alone. The feature `settings`
//! adds their validation into what flock's agent and controller work with (`flock-ipam`,
//! `flock-bird`, `flock-embed`), every error naming the field and the value.
//!
//! The feature `client` adds [`client::client`], a kube client configured as flock's programs
//! need it.
//!
//! The CustomResourceDefinitions are `NodeConfig::crd()` and `NodePool::crd()`
//! ([`kube::CustomResourceExt`]); `deploy/crds/` holds them as YAML.

#[cfg(feature = "client")]
pub mod client;
pub mod nodeconfig;
pub mod nodepool;
#[cfg(feature = "settings")]
pub mod settings;

pub use nodeconfig::{
    BgpPeering, BgpSpec, BgpTimers, FamilyDefaults, GracefulRestartSpec, IP_ALGO_ANNOTATION,
    NeighborSpec, NeighborStatus, NetworkSpec, NodeConfig, NodeConfigSpec, NodeConfigStatus,
    SecretKeyRef, ServicesSpec,
};
pub use nodepool::{
    NodePool, NodePoolSpec, NodePoolStatus, PoolNetworkSpec, PoolServicesSpec, PrefixCounts,
};
#[cfg(feature = "settings")]
pub use settings::{NodeSettings, SecondaryNetwork, router_id};

/// The label that marks a NodeConfig as written by the pool controller (with [`MANAGED_BY`]).
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// The value of [`MANAGED_BY_LABEL`] on the pool controller's NodeConfigs.
pub const MANAGED_BY: &str = "flock-controller";
/// The label naming the NodePool a controller-written NodeConfig's prefixes came from.
pub const POOL_LABEL: &str = "flock.fritzlab.net/pool";
/// The pool controller's mark on one of its NodeConfigs whose Node is gone: when it first saw
/// it gone (RFC 3339). Its release grace counts from it; removed when the Node is back.
pub const GONE_SINCE_ANNOTATION: &str = "flock.fritzlab.net/node-gone-since";

/// A resource that is not valid: the field, the value and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A NodeConfig field is invalid.
    #[error("invalid NodeConfig: {field} = {value:?}: {reason}")]
    InvalidNodeConfig {
        /// The field path, e.g. `spec.cidr6`.
        field: String,
        /// The bad value.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// A NodePool field is invalid.
    #[error("invalid NodePool: {field} = {value:?}: {reason}")]
    InvalidNodePool {
        /// The field path, e.g. `spec.nodePrefix6`.
        field: String,
        /// The bad value.
        value: String,
        /// What is wrong.
        reason: String,
    },
}

/// This crate's results.
pub type Result<T, E = Error> = std::result::Result<T, E>;
