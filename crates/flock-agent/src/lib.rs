//! The flock node agent: RPC server, crash-safe allocation store, CNI handlers,
//! Kubernetes watchers, BIRD writer, metrics and health.
//!
//! Does I/O; business rules live in the pure crates it composes.
