//! The ip-algo language: parse a spec such as `ns:16,app:24,n:8` and derive
//! deterministic IPv6 host bits from a workload's identity (DESIGN §4).
//!
//! - [`IpAlgo`]: a parsed spec (`random`, `workload` or a field list), with
//!   [`IpAlgo::layout`] checking it against the host bits of a CIDR.
//! - [`Layout`]: a spec placed in a host part; [`Layout::host_bits`] derives
//!   the bits for an [`Identity`] and a counter, [`Layout::explain`] shows
//!   which bits hold what.
//! - [`workload_name`]: the workload-name rule (Deployment from ReplicaSet, …).
//!
//! Pure: no I/O, no clock, no global RNG — randomness comes in as a `rand_core::Rng`.

mod layout;
mod spec;
mod workload;

pub use layout::{Identity, Layout, Segment, fnv1a64};
pub use spec::{Field, FieldWidth, IpAlgo, MAX_FIELD_BITS, Preset};
pub use workload::workload_name;

/// Everything that can go wrong with an ip-algo spec.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The spec is empty or only whitespace.
    #[error(
        "ip-algo spec is empty: use \"random\", \"workload\" or fields such as \"ns:16,app:24,n:8\""
    )]
    Empty,
    /// An item between two commas is empty.
    #[error("ip-algo {spec:?}: empty item at position {position} (two commas in a row?)")]
    EmptyItem {
        /// The whole spec as written.
        spec: String,
        /// 1-based position of the empty item.
        position: usize,
    },
    /// A field name that is not one of `ns`, `app`, `image`, `pod`, `n`, `rand`.
    #[error(
        "ip-algo {spec:?}: unknown field {field:?} (known: ns, app, image, pod, n, rand; presets: random, workload)"
    )]
    UnknownField {
        /// The whole spec as written.
        spec: String,
        /// The unknown name.
        field: String,
    },
    /// `field` without `:bits`.
    #[error("ip-algo {spec:?}: field {item:?} has no width (write it as {item}:BITS)")]
    MissingWidth {
        /// The whole spec as written.
        spec: String,
        /// The item as written.
        item: String,
    },
    /// The width is not a decimal number.
    #[error("ip-algo {spec:?}: width {width:?} of field {field:?} is not a number of bits")]
    BadWidth {
        /// The whole spec as written.
        spec: String,
        /// The field name.
        field: String,
        /// The width as written.
        width: String,
    },
    /// A width of zero.
    #[error("ip-algo {spec:?}: field {field:?} has width 0; every field needs at least 1 bit")]
    ZeroWidth {
        /// The whole spec as written.
        spec: String,
        /// The field name.
        field: String,
    },
    /// A width over [`MAX_FIELD_BITS`].
    #[error("ip-algo {spec:?}: field {field:?} is {bits} bits wide; at most 64 bits per field")]
    WidthTooLarge {
        /// The whole spec as written.
        spec: String,
        /// The field name.
        field: String,
        /// The width asked for.
        bits: u32,
    },
    /// The counter `n` appears more than once.
    #[error("ip-algo {spec:?}: the counter n appears twice; a spec has at most one n field")]
    CounterTwice {
        /// The whole spec as written.
        spec: String,
    },
    /// The fields need more bits than the CIDR leaves for hosts.
    #[error(
        "ip-algo {spec:?} needs {needed} host bits but a /{prefix_len} leaves only {host_bits}; use a shorter prefix or narrower fields"
    )]
    Overflow {
        /// The spec in canonical form.
        spec: String,
        /// The sum of the field widths.
        needed: u32,
        /// Host bits of the CIDR.
        host_bits: u8,
        /// Prefix length of the CIDR.
        prefix_len: u8,
    },
    /// A host length over 128.
    #[error("host length {host_bits} is impossible for IPv6 (at most 128 bits)")]
    HostBits {
        /// The host length given.
        host_bits: u8,
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
