//! flock's own plumbing between the CNI shim (`/opt/cni/bin/flock`) and the node agent,
//! which both link: the RPC over the agent's Unix socket, the durable queue of DELs the agent
//! may not have completed, the crash-safe file writes, the paths and limits they share, and
//! flock's reading of its network configuration. The generic CNI part (spec types, versions,
//! results, errors, the `CNI_*` environment, the skel dispatcher) is `flock-cni-proto`, which a
//! CNI author adds alone.
//!
//! Pure in the same way: no async runtime, no netlink; the only I/O is what a caller hands in
//! (a Unix socket path for the blocking RPC client, a directory for the DEL queue, a file to
//! write).
//!
//! - [`defaults`]: the socket, state and DEL-queue paths and the MTU the shim, the agent and
//!   `install-cni` share.
//! - [`netconf`]: [`FlockNetConf`], flock's keys of its network configuration.
//! - [`rpc`]: requests, responses, framing and the blocking [`rpc::Client`].
//! - [`delqueue`]: the durable queue of DELs the agent may not have completed.
//! - [`durable`]: writes that survive a crash (temporary file, fsync, rename).

pub mod defaults;
pub mod delqueue;
pub mod durable;
pub mod netconf;
pub mod rpc;

pub use delqueue::{DelQueue, PendingDel, QueueError};
pub use netconf::{FLOCK_TYPE, FlockNetConf, POD_ANNOTATIONS_KEY};
