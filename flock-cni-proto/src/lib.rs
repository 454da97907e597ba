//! CNI specification types, `CNI_*` environment parsing, a `skel`-style
//! plugin dispatcher, and flock's shim↔agent RPC.
//!
//! Pure: no async runtime, no netlink; the only I/O is what a caller hands in
//! (a reader, a writer, a Unix socket path for the blocking RPC client, a
//! directory for the DEL queue).
//!
//! - [`defaults`]: the socket, state and DEL-queue paths and the MTU the shim,
//!   the agent and `install-cni` share.
//! - [`version`]: `cniVersion` ([`CniVersion`]) and the VERSION reply.
//! - [`netconf`]: [`NetConf`], [`Conflist`], flock's [`FlockNetConf`].
//! - [`result`]: the CNI [`CniResult`] for 0.4.0, 1.0.0 and 1.1.0.
//! - [`error`]: [`CniError`], [`ErrorCode`] and [`error::cause_chain`].
//! - [`env`](mod@env): [`CniEnv`] and [`CniArgs`].
//! - [`skel`]: the [`Plugin`] trait, [`skel::dispatch`] and [`skel::run`].
//! - [`rpc`]: requests, responses, framing and the blocking [`rpc::Client`].
//! - [`delqueue`]: the durable queue of DELs the agent may not have completed.

pub mod defaults;
pub mod delqueue;
pub mod durable;
pub mod env;
pub mod error;
pub mod netconf;
pub mod prefix;
pub mod result;
pub mod rpc;
pub mod skel;
pub mod version;

pub use delqueue::{DelQueue, PendingDel, QueueError};
pub use env::{CniArgs, CniEnv, Command};
pub use error::{CniError, ErrorCode};
pub use netconf::{Attachment, Conflist, FlockNetConf, NetConf};
pub use prefix::IpPrefix;
pub use result::{CniResult, Dns, Interface, IpConfig, Route};
pub use skel::{Call, Plugin};
pub use version::{CniVersion, VersionInfo, VersionParseError};

// The README's examples are compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The JSON library of this crate's API (results, configs and RPC payloads
/// are `serde_json::Value`s), re-exported so a plugin needs no own copy.
pub use serde_json;

/// Results of this crate's fallible functions; most fail with a [`CniError`]
/// that a plugin can print as is.
pub type Result<T, E = CniError> = std::result::Result<T, E>;
