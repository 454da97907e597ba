//! `flock-controller`: flock's cluster-pool controller (a library, and the binary
//! `deploy/controller.yaml` runs; `flock-agent controller` runs it too, for one release). One
//! active instance (a
//! `coordination.k8s.io` Lease, [`lease`]) watches Nodes, NodePools and NodeConfigs, plans
//! node prefixes with `flock-ipam`'s [`plan_node_prefixes`](flock_ipam::plan_node_prefixes)
//! and writes one NodeConfig per selected Node.
//!
//! - The NodeConfig is the durable record of an assignment: a restarted (or new) leader
//!   reads the NodeConfigs and reassigns nothing. It is marked as the controller's by two
//!   labels ([`MANAGED_BY_LABEL`] = [`MANAGED_BY`] and [`POOL_LABEL`] = the pool); a
//!   NodeConfig without them is hand-written, never touched, and its CIDRs are never handed
//!   out.
//! - A prefix is released (its NodeConfig deleted, conditional on the uid and version read)
//!   only once its Node is deleted and either its NodeConfig's status reports no allocations,
//!   or the release grace has passed since the controller marked it gone
//!   ([`GONE_SINCE_ANNOTATION`]) and no pod is bound to the node any more: a deleted Node's
//!   pods are deleted by the pod garbage collector, and its agent, whose pod-bound token died
//!   with its own pod, cannot report their release.
//! - What a reconcile does is decided by [`decide::decide`] over plain data; [`apply`] writes
//!   it, checking before each write that the lease is still held.
//!
//! - LoadBalancer addresses ([`lb`]): from the pools' `spec.services.loadBalancerCIDRs` to
//!   each flock LoadBalancer Service's status.
//!
//! Runs as its own Deployment (`deploy/controller.yaml`) with its own ServiceAccount: the
//! per-node agents keep read-only access to NodeConfigs.

pub mod apply;
pub mod decide;
pub mod error;
pub mod lb;
pub mod lease;
pub mod pool_status;
pub mod run;

pub use apply::Overlay;
pub use decide::{NodeFacts, Observed, Reconcile, Release, decide, owned_pool, pod_checks_due};
pub use error::{Error, Result};
pub use flock_k8s_api::{GONE_SINCE_ANNOTATION, MANAGED_BY, MANAGED_BY_LABEL, POOL_LABEL};
pub use pool_status::PoolEvent;
pub use run::{ControllerOptions, run};

/// How long a gone node's prefixes stay its own while its NodeConfig still reports
/// allocations (`--release-grace`).
pub const DEFAULT_RELEASE_GRACE: std::time::Duration = std::time::Duration::from_secs(600);
/// The field manager of the controller's writes.
pub const FIELD_MANAGER: &str = "flock-controller";
