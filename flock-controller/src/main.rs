//! `flock-controller`: the cluster-pool controller's process (`deploy/controller.yaml`).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use flock_k8s_api::client::duration_flag;

/// flock's cluster-pool controller: one NodeConfig per Node a NodePool selects, prefixes
/// released once their node is gone, LoadBalancer addresses from the pools.
#[derive(Parser, Debug)]
#[command(name = "flock-controller", version)]
struct Args {
    /// A kubeconfig file (default: in-cluster service account, or $KUBECONFIG).
    #[arg(long, env = "FLOCK_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// The namespace of the leader-election Lease (the Deployment's own).
    #[arg(long, env = "FLOCK_LEASE_NAMESPACE", default_value = "kube-system")]
    lease_namespace: String,
    /// The leader-election Lease's name.
    #[arg(long, env = "FLOCK_LEASE_NAME", default_value = "flock-controller")]
    lease_name: String,
    /// This instance's identity in the Lease (the Deployment sets it from the pod's name).
    #[arg(long, env = "FLOCK_POD_NAME")]
    identity: String,
    /// How often to reconcile without a change (`30s`, `5m`).
    #[arg(long, env = "FLOCK_RESYNC", default_value = "30s", value_parser = duration_flag)]
    resync: Duration,
    /// How long a deleted Node's prefixes stay its own while its NodeConfig still reports
    /// allocations; after it, they return to the pool once no pod is bound to the node
    /// (`90s`, `10m`, `1h`).
    #[arg(long, env = "FLOCK_RELEASE_GRACE", default_value = "10m", value_parser = duration_flag)]
    release_grace: Duration,
}

fn main() -> Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("FLOCK_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal: a container's log gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let options = flock_controller::ControllerOptions {
        kubeconfig: args.kubeconfig,
        lease_namespace: args.lease_namespace,
        lease_name: args.lease_name,
        identity: args.identity,
        resync: args.resync,
        release_grace: args.release_grace,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    runtime.block_on(flock_controller::run(options))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flags_default_grace_is_the_librarys() {
        let args = Args::parse_from(["flock-controller", "--identity", "c-0"]);
        assert_eq!(args.release_grace, flock_controller::DEFAULT_RELEASE_GRACE);
    }
}
