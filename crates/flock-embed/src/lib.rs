//! The ip-algo language: parse a spec such as `ns:16,app:24,n:8` and derive
//! deterministic IPv6 host bits from a workload's identity.
//!
//! Pure: no I/O, no clock, no global RNG — randomness comes in as a `rand_core::Rng`.
