//! Kubernetes mode of `flock-agent run` (DESIGN §3, §7): the pod watcher that ADD asks for a
//! pod's annotations and workload, the watcher of this node's NodeConfig, the status writer,
//! the leak reconcile and the cluster-wide watches of NetworkPolicy enforcement, around the
//! same agent and server as standalone mode.

pub mod leaks;
pub mod node_status;
pub mod nodeconfig;
pub mod pods;
pub mod secrets;
pub mod services;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::Client;
use tracing::info;

use crate::agent::{Agent, AgentParts, DEFAULT_POD_WAIT};
use crate::daemon::RunOptions;
use crate::metrics::{Component, Health, Metrics};
use crate::policy::PolicyEnforcer;
use crate::policy::nft::NftCommand;
use crate::routing::services::guard::ServiceGuard;
use crate::{Error, Result};

pub use leaks::{DEFAULT_LEAK_GRACE, DEFAULT_LEAK_INTERVAL, LeakTracker};
pub use node_status::DEFAULT_STATUS_INTERVAL;
pub use pods::{PodWatcher, Presence};

/// What only Kubernetes mode needs.
#[derive(Clone, Debug)]
pub struct KubeOptions {
    /// A kubeconfig file; `None`: in-cluster config or `$KUBECONFIG` (`kube::Config::infer`).
    pub kubeconfig: Option<PathBuf>,
    /// How long a pod may be gone from this node before its allocation is released.
    pub leak_grace: Duration,
    /// How often the leak reconcile runs.
    pub leak_interval: Duration,
    /// The shortest time between two status writes.
    pub status_interval: Duration,
    /// How long ADD waits for the pod watcher to see a pod (and for its NetworkPolicy rules).
    pub pod_wait: Duration,
    /// Enforce NetworkPolicies (the cluster-wide watches and flock's nftables table).
    pub network_policy: bool,
    /// The `nft` program.
    pub nft: PathBuf,
    /// Where logged policy decisions go, and how many.
    pub policy_log: crate::policy::decisions::LogOptions,
}

impl Default for KubeOptions {
    fn default() -> Self {
        KubeOptions {
            kubeconfig: None,
            leak_grace: DEFAULT_LEAK_GRACE,
            leak_interval: DEFAULT_LEAK_INTERVAL,
            status_interval: DEFAULT_STATUS_INTERVAL,
            pod_wait: DEFAULT_POD_WAIT,
            network_policy: true,
            nft: PathBuf::from("nft"),
            policy_log: crate::policy::decisions::LogOptions::default(),
        }
    }
}

/// A client from `kubeconfig`, or from the in-cluster service account / `$KUBECONFIG`.
pub async fn client(kubeconfig: Option<&std::path::Path>) -> Result<Client> {
    flock_k8s_api::client::client(kubeconfig)
        .await
        .map_err(|e| Error::Kube {
            op: e.op,
            source: e.source,
        })
}

/// Runs the leak reconcile every `interval` until the agent stops.
pub async fn run_leak_reconcile(
    agent: Arc<Agent>,
    pods: Arc<PodWatcher>,
    grace: Duration,
    interval: Duration,
) {
    let mut tracker = LeakTracker::new();
    loop {
        tokio::time::sleep(interval).await;
        leaks::reconcile_once(&agent, &pods, &mut tracker, Instant::now(), grace).await;
    }
}

/// Runs the agent against the Kubernetes API until a termination signal.
pub async fn run(options: RunOptions, kube: KubeOptions) -> Result<()> {
    let node = options
        .node
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| Error::KubeMode {
            reason: "the node name is required: pass --node or set FLOCK_NODE_NAME \
                     (the DaemonSet sets it from spec.nodeName)"
                .into(),
        })?;
    let client = client(kube.kubeconfig.as_deref()).await?;
    info!(%node, "Kubernetes mode");
    let pods = PodWatcher::spawn(client.clone(), &node);
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::default());
    let policy = kube.network_policy.then(|| {
        let nft = NftCommand::new(kube.nft.clone(), flock_netns::NsTarget::Current);
        let enforcer = PolicyEnforcer::spawn(Arc::new(nft), metrics.clone(), health.clone());
        crate::policy::watches::spawn_watches(client.clone(), enforcer.clone());
        enforcer
    });
    if let Some(enforcer) = &policy {
        crate::policy::decisions::start(
            enforcer,
            &kube.policy_log,
            &metrics,
            &health,
            &flock_netns::NsTarget::Current,
        )
        .await;
    }
    let (agent, report) = Agent::start(AgentParts {
        pods: Some(pods.clone()),
        pod_wait: kube.pod_wait,
        policy,
        metrics: metrics.clone(),
        health: health.clone(),
        ..options.agent_parts()?
    })
    .await?;
    // Service announcing: the Services and EndpointSlices of the cluster (docs/services.md).
    {
        let (client, node, agent) = (client.clone(), node.clone(), agent.clone());
        let state = crate::routing::services::ServiceState::new();
        services::spawn_watches(client.clone(), state.clone());
        let nft = NftCommand::new(kube.nft.clone(), flock_netns::NsTarget::Current);
        let guard = ServiceGuard::spawn(Arc::new(nft), health.clone(), Duration::from_secs(5));
        agent.set_services(state.clone(), guard);
        tokio::spawn(services::run_announcer(client, node, agent, state));
    }
    health.set_problem(
        Component::NodeConfig,
        Some(format!("waiting for NodeConfig {node}")),
    );
    tokio::spawn(nodeconfig::follow_node_config(
        client.clone(),
        node.clone(),
        agent.clone(),
    ));
    tokio::spawn(node_status::run_status_writer(
        client.clone(),
        node.clone(),
        agent.clone(),
        options.bird.clone(),
        kube.status_interval,
    ));
    tokio::spawn(run_leak_reconcile(
        agent.clone(),
        pods,
        kube.leak_grace,
        kube.leak_interval,
    ));
    crate::daemon::serve(agent, report, options, metrics, health).await
}
