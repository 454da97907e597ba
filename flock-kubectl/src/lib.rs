//! `kubectl flock`: a kubectl plugin that answers an operator's questions about a flock
//! cluster — each node's health (`status`), its BGP sessions and routes (`bgp`), whether
//! every address handed out is accounted for (`ipam check`), why a connection passes or is
//! dropped (`policy explain`), and one archive for a bug report (`sysdump`).
//!
//! It asks the API with the user's kubeconfig, and a node's own state from that node's
//! agent: `flock-agent inspect` through the API's exec into the agent's pod
//! ([`cluster`]). The decisions — what is a problem, what is a leak, what may be
//! released — are pure functions of what was gathered ([`status`], [`ipam`], [`explain`]).

pub mod cluster;
pub mod commands;
pub mod error;
pub mod explain;
#[cfg(test)]
mod fixtures;
pub mod ipam;
pub mod status;
pub mod sysdump;
pub mod table;
