//! CNI specification types, `CNI_*` environment parsing and a `skel`-style
//! plugin dispatcher: what a Rust CNI plugin needs, and nothing of flock's own
//! (flock's shim↔agent plumbing is the crate `flock-rpc`).
//!
//! Pure: no async runtime, no netlink; the only I/O is what a caller hands in
//! (a reader, a writer).
//!
//! - [`version`]: `cniVersion` ([`CniVersion`]) and the VERSION reply.
//! - [`netconf`]: [`NetConf`], [`Conflist`].
//! - [`result`]: the CNI [`CniResult`] for 0.4.0, 1.0.0 and 1.1.0.
//! - [`error`]: [`CniError`], [`ErrorCode`] and [`error::cause_chain`].
//! - [`env`](mod@env): [`CniEnv`] and [`CniArgs`].
//! - [`skel`]: the [`Plugin`] trait, [`skel::dispatch`] and [`skel::run`].

pub mod env;
pub mod error;
pub mod netconf;
pub mod prefix;
pub mod result;
pub mod skel;
pub mod version;

pub use env::{CniArgs, CniEnv, Command};
pub use error::{CniError, ErrorCode};
pub use netconf::{Attachment, Conflist, NetConf};
pub use prefix::IpPrefix;
pub use result::{CniResult, Dns, Interface, IpConfig, Route};
pub use skel::{Call, Plugin};
pub use version::{CniVersion, VersionInfo, VersionParseError};

// The README's examples are compiled and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// The JSON library of this crate's API (results and configs are
/// `serde_json::Value`s), re-exported so a plugin needs no own copy.
pub use serde_json;

/// Results of this crate's fallible functions; most fail with a [`CniError`]
/// that a plugin can print as is.
pub type Result<T, E = CniError> = std::result::Result<T, E>;
