//! The defaults the shim, the agent and `install-cni` must agree on (DESIGN §2, §9), defined
//! once: a shim reading a conflist without `agentSocket` must dial the socket the agent
//! listens on, and a DEL the shim queues must land where the agent drains.

use std::path::{Path, PathBuf};

/// The agent's RPC socket (`agentSocket`, `flock-agent run --socket`).
pub const DEFAULT_AGENT_SOCKET: &str = "/run/flock/agent.sock";
/// The agent's state directory (`flock-agent run --state-dir`).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/flock";
/// The DEL queue's directory inside a state directory.
pub const DEL_QUEUE_SUBDIR: &str = "del-queue";
/// The DEL queue (`delQueueDir`): [`DEL_QUEUE_SUBDIR`] of [`DEFAULT_STATE_DIR`].
pub const DEFAULT_DEL_QUEUE_DIR: &str = "/var/lib/flock/del-queue";
/// The pod interfaces' MTU when the network configuration has no `mtu` and the node's uplink
/// cannot be found.
pub const DEFAULT_MTU: u32 = 1500;
/// How long ADD and CHECK wait for an agent that is not listening (`agentWaitSeconds`): an
/// agent being upgraded or restarted is back within seconds, and a sandbox that waits for it
/// is better than one the kubelet must tear down and create again.
pub const DEFAULT_AGENT_WAIT_SECONDS: u64 = 30;
/// The longest `agentWaitSeconds` accepted: below the kubelet's runtime request timeout
/// (2 minutes).
pub const MAX_AGENT_WAIT_SECONDS: u64 = 100;

/// The DEL queue of an agent whose state directory is `state_dir`.
pub fn del_queue_dir(state_dir: &Path) -> PathBuf {
    state_dir.join(DEL_QUEUE_SUBDIR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_queue_is_in_the_default_state_dir() {
        assert_eq!(
            del_queue_dir(Path::new(DEFAULT_STATE_DIR)),
            Path::new(DEFAULT_DEL_QUEUE_DIR)
        );
        assert_eq!(
            del_queue_dir(Path::new("/srv/flock")),
            Path::new("/srv/flock/del-queue")
        );
    }
}
