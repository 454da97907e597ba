//! Per-node address pools: effective-CIDR resolution, allocation, release and
//! reservation, and the parser of flock's pod annotations.
//!
//! Pure: no I/O, no clock, no global RNG — randomness comes in as a `rand_core::Rng`.
