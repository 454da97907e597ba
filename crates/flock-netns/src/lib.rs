//! A pod's kernel state over rtnetlink: veth pair, addresses, routes, sysctls and
//! blackholes — set up, read back for CHECK, torn down.
//!
//! Does I/O: enters network namespaces (on short-lived dedicated threads) and
//! talks netlink.
