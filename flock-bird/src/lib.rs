//! A typed model of what a flock node tells BIRD 2 and a deterministic renderer
//! of the complete configuration.
//!
//! - [`BirdModel`]: the node's BGP setup as the agent assembles it (router ID,
//!   ASN, neighbors — by address or link-local on an interface, with password,
//!   BFD timing, per-neighbor [`GracefulRestart`] — node CIDRs, extra pod
//!   addresses, anycast addresses, communities, graceful shutdown), with values
//!   as they arrive.
//! - [`BirdModel::validate`] checks it into a [`ValidModel`] (sorted,
//!   de-duplicated), or returns an [`Error`] naming the field and the value.
//! - [`render`] writes the BIRD 2 configuration: byte-for-byte stable
//!   whatever the input order, accepted by `bird -p`.
//! - [`Community`] reads and writes `ASN:value` and `a:b:c`.
//! - [`parse_show_protocols`] reads `birdc show protocols` into [`ProtocolRow`]s;
//!   [`parse_show_protocols_all`], [`parse_show_route`] and [`parse_show_bfd_sessions`] read
//!   the detail an operator asks for (`serde` feature: each serialises).
//!
//! Pure: no I/O. Writing the file and calling `birdc configure` is the agent's
//! job. What the configuration announces and accepts is described in
//! `docs/bgp.md`.
//!
//! ```
//! use flock_bird::{BirdModel, NeighborSpec, render};
//!
//! let model = BirdModel {
//!     router_id: "10.0.0.1".into(),
//!     asn: 64512,
//!     neighbors: vec![NeighborSpec {
//!         address: "2001:db8::fe".into(),
//!         asn: 65000,
//!         ..Default::default()
//!     }],
//!     cidrs: vec!["2001:db8:0:1::/64".parse()?],
//!     ..Default::default()
//! };
//! let conf = render(&model.validate()?);
//! assert!(conf.contains("route 2001:db8:0:1::/64 blackhole;"));
//! assert!(conf.contains("neighbor 2001:db8::fe as 65000;"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod birdc;
mod error;
mod model;
mod render;
mod show;
mod validate;

pub use birdc::{ProtocolRow, parse_show_protocols};
pub use error::{Error, Result};
pub use model::{
    BfdTiming, BirdModel, Community, Families, GracefulRestart, Neighbor, NeighborSpec, Timers,
    ValidModel,
};
pub use render::render;
pub use show::{
    BfdSession, ChannelDetail, ProtocolDetail, parse_show_bfd_sessions, parse_show_protocols_all,
    parse_show_route,
};

#[cfg(test)]
mod tests;

/// The README's example, compiled and run as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
