//! The watcher of this node's NodeConfig (server-side field selector `metadata.name=<node>`):
//! a valid NodeConfig becomes the agent's settings, a deleted one (or none at all) stops new
//! ADDs with a clear error while existing pods keep working, and an invalid one is logged and
//! reported in `/readyz` and the status while the previous settings stay in force.

use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tracing::{info, warn};

use crate::agent::Agent;
use crate::k8s::secrets::{SecretReader, fill_passwords};
use crate::metrics::Component;
use flock_k8s_api::NodeConfig;

/// How often the NodeConfig is applied again without an event, so that a rotated password
/// Secret reaches BIRD (the agent reads the named Secret, it does not watch Secrets).
pub const SECRET_REFRESH: std::time::Duration = std::time::Duration::from_secs(60);

/// The server-side field selector of the NodeConfig of `node`.
pub fn name_field_selector(node: &str) -> String {
    format!("metadata.name={node}")
}

/// Applies NodeConfig watch events to the agent; kept apart from the stream so it can be
/// driven by a test.
pub struct NodeConfigFollower {
    node: String,
    agent: Arc<Agent>,
    seen_in_listing: bool,
    secrets: Option<SecretReader>,
    last: Option<NodeConfig>,
}

impl NodeConfigFollower {
    /// Follows the NodeConfig of `node` into `agent`.
    pub fn new(node: &str, agent: Arc<Agent>) -> NodeConfigFollower {
        NodeConfigFollower {
            node: node.to_owned(),
            agent,
            seen_in_listing: false,
            secrets: None,
            last: None,
        }
    }

    /// Reads the passwords named by `passwordSecretRef` with `reader`.
    pub fn with_secrets(mut self, reader: SecretReader) -> NodeConfigFollower {
        self.secrets = Some(reader);
        self
    }

    /// Applies the last NodeConfig seen again (a rotated password Secret).
    pub async fn reapply(&mut self) {
        if let Some(nc) = self.last.clone() {
            self.applied(&nc).await;
        }
    }

    /// Applies one watch event.
    pub async fn apply(&mut self, event: watcher::Event<NodeConfig>) {
        match event {
            watcher::Event::Init => self.seen_in_listing = false,
            watcher::Event::InitApply(nc) => {
                self.seen_in_listing = true;
                self.applied(&nc).await;
                self.last = Some(nc);
            }
            watcher::Event::Apply(nc) => {
                self.applied(&nc).await;
                self.last = Some(nc);
            }
            watcher::Event::InitDone => {
                if !self.seen_in_listing {
                    self.deleted("no NodeConfig exists for this node").await;
                }
            }
            watcher::Event::Delete(_) => {
                self.last = None;
                self.deleted("the NodeConfig was deleted").await;
            }
        }
    }

    async fn applied(&self, nc: &NodeConfig) {
        if nc.metadata.name.as_deref() != Some(self.node.as_str()) {
            // The field selector makes this impossible; never serve another node's CIDRs.
            warn!(node = %self.node, other = ?nc.metadata.name, "ignoring another node's NodeConfig");
            return;
        }
        match nc.settings() {
            Ok(mut settings) => {
                let problems = match &self.secrets {
                    Some(reader) => {
                        let previous = self.agent.settings();
                        fill_passwords(&mut settings, reader, previous.as_deref()).await
                    }
                    None => Vec::new(),
                };
                let problem = (!problems.is_empty()).then(|| problems.join("; "));
                if problem.is_some()
                    && self.agent.health().problem(Component::NodeConfig) != problem
                {
                    warn!(node = %self.node, problem = ?problem, "BGP password unavailable");
                }
                if self.agent.settings().as_deref() == Some(&settings) {
                    // A status write, a resync, or a return to the settings in force after an
                    // invalid edit: nothing to apply, but no problem either (other than a
                    // password that still cannot be read).
                    self.agent
                        .health()
                        .set_problem(Component::NodeConfig, problem);
                    return;
                }
                info!(node = %self.node, cidr6 = ?settings.cidr6, cidr4 = ?settings.cidr4,
                    bgp = settings.bgp.is_some(), "NodeConfig applied");
                self.agent.set_settings(Some(settings)).await;
                if problem.is_some() {
                    self.agent
                        .health()
                        .set_problem(Component::NodeConfig, problem);
                }
            }
            Err(e) => {
                let kept = if self.agent.settings().is_some() {
                    "the previous settings stay in force"
                } else {
                    "new pods cannot be served"
                };
                let problem = format!("{e}; {kept}");
                // Every status write echoes the resource back: say it once per problem.
                if self
                    .agent
                    .health()
                    .problem(Component::NodeConfig)
                    .as_deref()
                    != Some(&problem)
                {
                    warn!(node = %self.node, error = %e, kept, "invalid NodeConfig");
                    self.agent
                        .health()
                        .set_problem(Component::NodeConfig, Some(problem));
                }
            }
        }
    }

    async fn deleted(&self, why: &str) {
        info!(node = %self.node, why, "no NodeConfig: new pods cannot be served, existing pods keep working");
        self.agent.set_settings(None).await;
    }
}

/// Watches the NodeConfig of `node` until the agent stops; errors are logged and retried with
/// kube's default backoff.
pub async fn follow_node_config(client: Client, node: String, agent: Arc<Agent>) {
    let api: Api<NodeConfig> = Api::all(client.clone());
    let config = watcher::Config::default().fields(&name_field_selector(&node));
    let mut follower =
        NodeConfigFollower::new(&node, agent).with_secrets(SecretReader::new(client.clone()));
    let stream = watcher(api, config).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut refresh = tokio::time::interval(SECRET_REFRESH);
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            event = stream.next() => match event {
                Some(Ok(event)) => follower.apply(event).await,
                Some(Err(e)) => warn!(%node, error = %e, "NodeConfig watch failed; retrying"),
                None => return,
            },
            _ = refresh.tick() => follower.reapply().await,
        }
    }
}
