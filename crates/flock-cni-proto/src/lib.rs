//! CNI specification types, `CNI_*` environment parsing, a `skel`-style plugin
//! dispatcher, and flock's shim↔agent RPC.
//!
//! Pure: no async runtime, no netlink; the only I/O is what a caller hands in
//! (a reader, a writer, a Unix socket path for the blocking RPC client).
