//! flock's test bed: where flock is proven against real components, not mocks.
//!
//! - [`lab`]: two routed nodes, a router and four pods in network namespaces, the standalone
//!   agent and the real shim exec'd as a runtime does.
//! - [`cluster`]: a real Kubernetes cluster in network namespaces (control plane, two nodes
//!   with containerd and the kubelet, a BGP router), flock deployed into it from `deploy/`,
//!   its life tests and the upstream e2e suites.
//! - [`bench`]: `cargo xtask bench`, end-to-end CNI latency and throughput of flock beside the
//!   reference plugins through one runtime stand-in.
//! - [`components`]: Kubernetes, containerd, runc, etcd, CoreDNS and the reference CNI plugins,
//!   each built from its Go module (the wrapper modules under `go/`), cached per version.
//!
//! Everything here runs as root and only inside namespaces it creates; nothing touches the
//! machine's own network namespace. Not published: it is how flock is tested, not part of it.

pub mod bench;
pub mod binaries;
pub mod cluster;
pub mod components;
pub mod fuzz;
pub mod gomod;
pub mod helm;
pub mod lab;
pub mod revision;
pub mod router;
pub mod scenario;
pub mod sys;
pub mod versions;
