//! flock's CNI shim: the binary a container runtime execs as `/opt/cni/bin/flock`.
//!
//! It answers `VERSION` itself and forwards every other call to the node agent.

fn main() {
    // Filled by the workspace issue; until then the shim refuses every call.
    std::process::exit(1);
}
