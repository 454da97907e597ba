//! The NodeConfig status writer: allocation counts, BGP neighbor states (from `birdc show
//! protocols`) and conditions, merge-PATCHed to the status subresource only when they changed
//! and at most once per interval.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use tracing::{debug, warn};

use crate::agent::Agent;
use crate::metrics::{Component, Health};
use crate::policy::PolicyStatus;
use crate::routing::BirdError;
use crate::routing::bird::BirdTarget;
use crate::store::AllocationRecord;
use crate::{Error, Result};
use flock_k8s_api::{NeighborStatus, NodeConfig, NodeConfigStatus, NodeSettings};

use crate::routing::sessions::established_message;
pub use crate::routing::sessions::{protocol_states, sessions_down, show_protocols};

/// The default shortest time between two status writes.
pub const DEFAULT_STATUS_INTERVAL: Duration = Duration::from_secs(10);

/// Everything the status is computed from, gathered at one instant.
#[derive(Debug, Clone, Default)]
pub struct StatusInputs {
    /// The node's current settings (`None`: no valid NodeConfig yet, or it was deleted).
    pub settings: Option<Arc<NodeSettings>>,
    /// The committed allocations.
    pub records: Vec<AllocationRecord>,
    /// BIRD's protocols and states, or why they could not be read (`None`: no BGP).
    pub protocols: Option<Result<BTreeMap<String, String>, Arc<BirdError>>>,
    /// The agent's problem per component (`nodeconfig`, `bird`, `store`, `kernel`).
    pub problems: BTreeMap<Component, String>,
    /// Whether the RPC server serves.
    pub serving: bool,
    /// NetworkPolicy enforcement (`None`: off).
    pub policy: Option<PolicyStatus>,
}

impl StatusInputs {
    /// Gathers the inputs from the agent (and BIRD, when the node has BGP).
    pub async fn gather(agent: &Agent, bird: &BirdTarget) -> StatusInputs {
        let settings = agent.settings();
        let protocols = match settings.as_ref().and_then(|s| s.bgp.as_ref()) {
            Some(_) => Some(show_protocols(bird).await.map_err(Arc::new)),
            None => None,
        };
        let health: &Health = agent.health();
        let problems = [
            Component::NodeConfig,
            Component::Bird,
            Component::Store,
            Component::Kernel,
        ]
        .into_iter()
        .filter_map(|c| health.problem(c).map(|p| (c, p)))
        .collect();
        StatusInputs {
            settings,
            records: agent.records(),
            protocols,
            problems,
            serving: health.is_serving(),
            policy: agent.policy().map(|p| p.status()),
        }
    }
}

/// Computes the status. `previous` carries each condition's `lastTransitionTime` over while
/// its status does not change; `now` stamps the conditions that do.
pub fn build_status(
    inputs: &StatusInputs,
    previous: Option<&NodeConfigStatus>,
    now: Timestamp,
) -> NodeConfigStatus {
    let allocated6 = inputs
        .records
        .iter()
        .map(|r| r.pooled_addresses().iter().filter(|a| a.is_ipv6()).count() as u64)
        .sum();
    let allocated4 = inputs
        .records
        .iter()
        .map(|r| r.pooled_addresses().iter().filter(|a| a.is_ipv4()).count() as u64)
        .sum();

    let neighbors: Vec<(String, String)> = inputs
        .settings
        .as_ref()
        .and_then(|s| s.bgp.as_ref())
        .and_then(|m| m.validate().ok())
        .map(|valid| {
            valid
                .neighbors()
                .iter()
                .map(|n| (n.name().to_owned(), n.peer()))
                .collect()
        })
        .unwrap_or_default();
    let bgp: Vec<NeighborStatus> = neighbors
        .iter()
        .map(|(name, address)| {
            let full = match &inputs.protocols {
                Some(Ok(p)) => p.get(name).cloned().unwrap_or_else(|| {
                    "NotConfigured not in BIRD's configuration (see the NodeConfigValid condition)"
                        .into()
                }),
                _ => "Unknown".into(),
            };
            let (state, info) = match full.split_once(' ') {
                Some((state, info)) => (state.to_owned(), Some(info.trim().to_owned())),
                None => (full, None),
            };
            NeighborStatus {
                neighbor: address.clone(),
                state,
                info: info.filter(|i| !i.is_empty()),
            }
        })
        .collect();

    let mut conditions = Vec::new();
    let nodeconfig_problem = inputs.problems.get(&Component::NodeConfig);
    conditions.push(match (&inputs.settings, nodeconfig_problem) {
        (_, Some(problem)) => cond("NodeConfigValid", false, "Invalid", problem),
        (None, None) => cond(
            "NodeConfigValid",
            false,
            "NotLoaded",
            "the agent has not loaded this NodeConfig",
        ),
        (Some(_), None) => cond(
            "NodeConfigValid",
            true,
            "Valid",
            "the agent serves this NodeConfig",
        ),
    });
    conditions.push(match &inputs.protocols {
        None => cond("BirdReady", true, "NoBgp", "the NodeConfig has no spec.bgp"),
        Some(Err(e)) => cond(
            "BirdReady",
            false,
            "BirdUnreachable",
            &flock_cni_proto::error::cause_chain(e.as_ref()),
        ),
        Some(Ok(_)) => match inputs.problems.get(&Component::Bird) {
            Some(problem) => cond("BirdReady", false, "ReloadFailed", problem),
            None => cond(
                "BirdReady",
                true,
                "Configured",
                "BIRD runs the rendered configuration",
            ),
        },
    });
    if !neighbors.is_empty() {
        let up = bgp.iter().filter(|n| n.state == "Established").count();
        conditions.push(cond(
            "BgpEstablished",
            up == bgp.len(),
            if up == bgp.len() {
                "AllEstablished"
            } else {
                "NotAllEstablished"
            },
            &established_message(up, &bgp),
        ));
    }
    if let Some(policy) = &inputs.policy {
        conditions.push(policy_condition(policy));
        conditions.push(policies_valid_condition(policy));
    }
    let blocking: Vec<String> = [Component::Store, Component::Kernel]
        .iter()
        .filter_map(|c| inputs.problems.get(c).map(|p| format!("{c}: {p}")))
        .collect();
    conditions.push(if !inputs.serving {
        cond(
            "Ready",
            false,
            "Starting",
            "the agent is not serving CNI requests yet",
        )
    } else if inputs.settings.is_none() {
        cond(
            "Ready",
            false,
            "NoNodeConfig",
            "no valid NodeConfig: new pods on this node cannot get addresses",
        )
    } else if !blocking.is_empty() {
        cond("Ready", false, "Degraded", &blocking.join("; "))
    } else {
        cond("Ready", true, "Serving", "the agent serves CNI requests")
    });
    for c in &mut conditions {
        let kept = previous
            .and_then(|p| p.conditions.iter().find(|o| o.type_ == c.type_))
            .filter(|o| o.status == c.status)
            .map(|o| o.last_transition_time.clone());
        c.last_transition_time = kept.unwrap_or(Time(now));
    }
    NodeConfigStatus {
        allocated6,
        allocated4,
        bgp,
        conditions,
    }
}

/// `NetworkPolicy`: True once a ruleset is applied and no newer apply failed; False naming
/// what `nft` (or the kernel) said when one did, or while nothing is applied yet.
fn policy_condition(policy: &PolicyStatus) -> Condition {
    let a = &policy.applied;
    let invalid = match a.invalid {
        0 => String::new(),
        n => format!(" ({n} not enforced as written: see the PoliciesValid condition)"),
    };
    let summary = format!(
        "{} policies in the cluster{invalid}, {} isolated pods on this node",
        a.policies, a.isolated_pods
    );
    let at =
        a.at.and_then(|t| Timestamp::try_from(t).ok())
            .map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
    match (&policy.failed, at) {
        (Some(why), Some(at)) => cond(
            "NetworkPolicy",
            false,
            "ApplyFailed",
            &format!(
                "applying the ruleset failed (retrying): {why}; in force: {summary}, applied at {at}"
            ),
        ),
        (Some(why), None) => cond(
            "NetworkPolicy",
            false,
            "ApplyFailed",
            &format!("applying the ruleset failed (retrying): {why}; no ruleset applied yet"),
        ),
        (None, None) => cond(
            "NetworkPolicy",
            false,
            "NotApplied",
            "waiting for the first listing of NetworkPolicies, Namespaces and Pods",
        ),
        (None, Some(at)) => cond(
            "NetworkPolicy",
            true,
            "Applied",
            &format!("{summary}, last applied at {at}"),
        ),
    }
}

/// `PoliciesValid`: False naming the policies (up to a few) not enforced as written — their
/// field and value, and whether each is left out or enforced fail-closed.
fn policies_valid_condition(policy: &PolicyStatus) -> Condition {
    match policy.not_as_written.as_slice() {
        [] => cond(
            "PoliciesValid",
            true,
            "AsWritten",
            "every NetworkPolicy and ClusterNetworkPolicy is enforced as written",
        ),
        all => cond(
            "PoliciesValid",
            false,
            "NotAsWritten",
            &crate::policy::not_as_written_summary(all),
        ),
    }
}

fn cond(type_: &str, ok: bool, reason: &str, message: &str) -> Condition {
    Condition {
        type_: type_.to_owned(),
        status: if ok { "True" } else { "False" }.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
        observed_generation: None,
    }
}

/// Decides when the status is written: only when it changed, at most once per `interval`.
#[derive(Debug, Clone)]
pub struct StatusGate {
    interval: Duration,
    last: Option<(NodeConfigStatus, Instant)>,
}

impl StatusGate {
    /// A gate that has written nothing yet.
    pub fn new(interval: Duration) -> StatusGate {
        StatusGate {
            interval,
            last: None,
        }
    }

    /// The last status written.
    pub fn last_written(&self) -> Option<&NodeConfigStatus> {
        self.last.as_ref().map(|(s, _)| s)
    }

    /// Whether `status` should be written at `now`.
    pub fn should_write(&self, status: &NodeConfigStatus, now: Instant) -> bool {
        match &self.last {
            None => true,
            Some((last, at)) => {
                last != status && now.saturating_duration_since(*at) >= self.interval
            }
        }
    }

    /// Records a successful write.
    pub fn written(&mut self, status: NodeConfigStatus, now: Instant) {
        self.last = Some((status, now));
    }

    /// Forgets what was written (the resource was re-created: write again).
    pub fn reset(&mut self) {
        self.last = None;
    }
}

/// The merge patch body of a status write.
pub fn status_patch(status: &NodeConfigStatus) -> serde_json::Value {
    serde_json::json!({ "status": status })
}

/// Merge-PATCHes `nodeconfigs/<node>/status`.
pub async fn write_status(client: &Client, node: &str, status: &NodeConfigStatus) -> Result<()> {
    let api: Api<NodeConfig> = Api::all(client.clone());
    api.patch_status(
        node,
        &PatchParams::default(),
        &Patch::Merge(status_patch(status)),
    )
    .await
    .map(|_| ())
    .map_err(|e| Error::Kube {
        op: format!("patch nodeconfigs/{node}/status"),
        source: Box::new(e),
    })
}

/// The status writer's loop: every `tick` it recomputes the status and writes it when the
/// [`StatusGate`] says so.
pub async fn run_status_writer(
    client: Client,
    node: String,
    agent: Arc<Agent>,
    bird: BirdTarget,
    interval: Duration,
) {
    let mut gate = StatusGate::new(interval);
    let tick = interval
        .min(Duration::from_secs(2))
        .max(Duration::from_millis(100));
    loop {
        let inputs = StatusInputs::gather(&agent, &bird).await;
        let status = build_status(&inputs, gate.last_written(), Timestamp::now());
        // /readyz names every BGP session that is not Established, and why.
        agent
            .health()
            .set_problem(Component::Bgp, sessions_down(&status));
        agent.metrics().set_bgp_sessions(
            status
                .bgp
                .iter()
                .map(|n| (n.neighbor.as_str(), n.state == "Established")),
        );
        let now = Instant::now();
        if gate.should_write(&status, now) {
            match write_status(&client, &node, &status).await {
                Ok(()) => {
                    debug!(%node, "NodeConfig status written");
                    gate.written(status, now);
                }
                Err(Error::Kube { source, .. })
                    if matches!(source.downcast_ref::<kube::Error>(),
                        Some(kube::Error::Api(s)) if s.code == 404) =>
                {
                    debug!(%node, "no NodeConfig to write the status of");
                    gate.reset();
                }
                Err(e) => warn!(%node, error = %e, "writing the NodeConfig status failed"),
            }
        }
        tokio::time::sleep(tick).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(allocated6: u64) -> NodeConfigStatus {
        NodeConfigStatus {
            allocated6,
            ..NodeConfigStatus::default()
        }
    }

    #[test]
    fn gate_writes_changes_at_most_once_per_interval() {
        let t0 = Instant::now();
        let mut gate = StatusGate::new(Duration::from_secs(10));
        assert!(gate.should_write(&status(1), t0));
        gate.written(status(1), t0);
        assert!(
            !gate.should_write(&status(1), t0 + Duration::from_secs(60)),
            "unchanged"
        );
        assert!(
            !gate.should_write(&status(2), t0 + Duration::from_secs(5)),
            "too soon"
        );
        assert!(gate.should_write(&status(2), t0 + Duration::from_secs(10)));
        gate.reset();
        assert!(gate.should_write(&status(1), t0));
    }

    #[test]
    fn transition_times_survive_an_unchanged_condition() {
        let t1 = Timestamp::from_second(1_800_000_000).expect("time");
        let t2 = Timestamp::from_second(1_800_000_100).expect("time");
        let mut inputs = StatusInputs {
            serving: true,
            ..StatusInputs::default()
        };
        let first = build_status(&inputs, None, t1);
        let ready = |s: &NodeConfigStatus| {
            s.conditions
                .iter()
                .find(|c| c.type_ == "Ready")
                .cloned()
                .expect("Ready")
        };
        assert_eq!(ready(&first).status, "False");
        let second = build_status(&inputs, Some(&first), t2);
        assert_eq!(first, second, "nothing changed: same status, same times");
        inputs
            .problems
            .insert(Component::Store, "read-only file system".into());
        inputs.serving = true;
        let third = build_status(&inputs, Some(&second), t2);
        assert_eq!(ready(&third).last_transition_time, Time(t1), "still False");
        assert_eq!(ready(&third).reason, "NoNodeConfig");
    }
}
