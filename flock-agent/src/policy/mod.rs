//! NetworkPolicy enforcement on the node: the cluster-wide caches (policies, namespaces,
//! pods; kept slim by [`convert`]), the node's own pods (from the allocation records and
//! their ADDs), and one task that turns every change into one atomic `nft -f` transaction
//! on flock's table, `inet flock_policy`, in the node's namespace.
//!
//! Decided purely: what is kept of each object ([`convert`]), the model's inputs
//! ([`view::ClusterView::inputs`]), when to apply what and how to retry ([`schedule`]), and
//! whether an apply is nothing, a change in place or the whole table ([`plan`]). Done here:
//! the apply task and waiting for it.
//!
//! Every change bumps a generation and wakes the task; the task applies the newest state
//! (so a burst of changes is one transaction) and publishes the generation it applied. A
//! change of pods only (a pod joins, leaves or changes, here or anywhere in the cluster) is
//! followed incrementally: the [`flock_policy::Model`] of the applied ruleset takes the pods
//! that changed, in time proportional to them, and its delta becomes elements (sent over
//! netlink, [`netlink`]) or a small `nft -f` with the chains that come or go. A change of
//! policies or namespaces is taken by the same model in place (the sets that stay are kept;
//! new ones are filled from the pods; the transaction adds and deletes sets and chains); a
//! relist of pods rebuilds the model from the caches. An ADD
//! waits until its pod's generation is applied: the pod's rules are in the kernel before the
//! runtime starts its containers. Nothing is applied before all three caches have finished
//! their first listing (an empty model would remove every rule); the first apply replaces
//! whatever a previous agent left.

pub mod cluster;
pub mod convert;
pub mod decisions;
pub mod netlink;
pub mod nflog;
pub mod nft;
pub mod plan;
pub mod schedule;
pub mod view;
pub mod watches;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use flock_policy::Ruleset;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::watcher::Event;
use tokio::sync::{Notify, watch};
use tracing::{debug, warn};

use crate::cache::object_key;
use crate::metrics::{Component, Health, Metrics};
use nft::Nft;
use plan::Step;
use schedule::{ApplyError, PlanError, Schedule, Work};
use view::{ClusterView, LocalPod};

pub use schedule::{Applied, FIRST_RETRY, MAX_RETRY, Progress};

/// Why a pod's rules are not (known to be) in place.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EnforceError {
    /// The caches have not finished their first listing.
    #[error(
        "NetworkPolicies, ClusterNetworkPolicies, Namespaces and Pods are not all listed yet after {} ms (API server reachable? RBAC list/watch of networkpolicies, clusternetworkpolicies, namespaces, pods?)",
        .waited.as_millis()
    )]
    NotSynced {
        /// How long the caller waited.
        waited: Duration,
    },
    /// The apply did not finish in time.
    #[error("the ruleset was not applied within {} ms", .waited.as_millis())]
    Timeout {
        /// How long the caller waited.
        waited: Duration,
    },
    /// Building or applying the ruleset failed.
    #[error("applying the NetworkPolicy ruleset failed: {0}")]
    Failed(#[source] ApplyError),
}

/// Where enforcement stands: what was applied last, and the error of a newer apply that
/// failed (it is retried).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyStatus {
    /// The last successful apply.
    pub applied: Applied,
    /// Why the newest apply failed, when it is newer than the last success.
    pub failed: Option<String>,
    /// The policies not enforced as written, as of now: each message names the policy, the
    /// field and the value, and says whether it is left out or enforced fail-closed.
    pub not_as_written: Vec<String>,
}

/// At most this many policies are named in one line about the policies not enforced as
/// written; the agent's log and `flock_policy_invalid` have them all.
pub const NOT_AS_WRITTEN_LISTED: usize = 5;

/// One line naming the policies (and log annotations) not enforced as written (the first
/// [`NOT_AS_WRITTEN_LISTED`]); each message starts with its kind.
pub fn not_as_written_summary(messages: &[String]) -> String {
    let mut line = format!(
        "{} not enforced as written: {}",
        messages.len(),
        messages[..messages.len().min(NOT_AS_WRITTEN_LISTED)].join("; ")
    );
    if messages.len() > NOT_AS_WRITTEN_LISTED {
        line.push_str(&format!(
            "; and {} more (the agent's log has them all)",
            messages.len() - NOT_AS_WRITTEN_LISTED
        ));
    }
    line
}

/// The node's NetworkPolicy enforcer: the tokio shell around a [`Schedule`]. Watch events
/// and the node's ADDs and DELs change the schedule's view and wake the apply task; the task
/// plans each work outside the lock, applies it through `nft` and reports back; waiters
/// follow the published [`Progress`].
pub struct PolicyEnforcer {
    schedule: Mutex<Schedule>,
    wake: Notify,
    progress: watch::Sender<Progress>,
    nft: Arc<dyn Nft>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

impl std::fmt::Debug for PolicyEnforcer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyEnforcer")
            .field("progress", &*self.progress.borrow())
            .finish_non_exhaustive()
    }
}

impl PolicyEnforcer {
    /// An enforcer applying through `nft`, with its apply task running on the current runtime.
    pub fn spawn(nft: Arc<dyn Nft>, metrics: Arc<Metrics>, health: Arc<Health>) -> Arc<Self> {
        health.set_problem(
            Component::NetworkPolicy,
            Some(
                "waiting for the first listing of NetworkPolicies, ClusterNetworkPolicies, \
                 Namespaces and Pods"
                    .into(),
            ),
        );
        let this = Arc::new(PolicyEnforcer {
            schedule: Mutex::default(),
            wake: Notify::new(),
            progress: watch::channel(Progress::default()).0,
            nft,
            metrics,
            health,
        });
        tokio::spawn(this.clone().run());
        this
    }

    fn schedule(&self) -> MutexGuard<'_, Schedule> {
        self.schedule.lock().expect("policy schedule lock")
    }

    /// Wakes the task when `generation` is newer than `before`; returns it.
    fn woken(&self, before: u64, generation: u64) -> u64 {
        if generation != before {
            self.wake.notify_one();
        }
        generation
    }

    /// Changes the view; when `change` says it changed something, bumps the generation and
    /// wakes the task, which rebuilds the model. Returns the generation that holds the change.
    pub fn update(&self, change: impl FnOnce(&mut ClusterView) -> bool) -> u64 {
        let mut schedule = self.schedule();
        let before = schedule.generation();
        let generation = schedule.change(change);
        self.woken(before, generation)
    }

    /// [`update`](Self::update) for a change of policies or namespaces only: the model takes
    /// it in place, keeping its sets.
    fn update_rules(&self, change: impl FnOnce(&mut ClusterView) -> bool) -> u64 {
        let mut schedule = self.schedule();
        let before = schedule.generation();
        let generation = schedule.change_rules(change);
        self.woken(before, generation)
    }

    /// Changes the schedule's view through `change` (which returns the generation that holds
    /// it); wakes the task when that is a new one.
    fn update_pods(&self, change: impl FnOnce(&mut Schedule) -> u64) -> u64 {
        let mut schedule = self.schedule();
        let before = schedule.generation();
        let generation = change(&mut schedule);
        self.woken(before, generation)
    }

    /// A NetworkPolicy watch event. An invalid policy is left out, logged with the field and
    /// value at fault, and counted (`flock_policy_invalid`).
    pub fn on_policy(&self, event: Event<NetworkPolicy>) {
        self.update_rules(|view| {
            let changed = feed_policies(&mut view.policies, &mut view.invalid, event, |np| {
                match convert::policy(np) {
                    Ok(p) => (Some(p), None),
                    Err(e) => {
                        warn!(error = %e, "NetworkPolicy left out");
                        (None, Some(format!("{e} (left out)")))
                    }
                }
            });
            self.count_invalid(view);
            changed
        });
    }

    /// A ClusterNetworkPolicy watch event. An invalid policy is left out; one with a field
    /// flock does not support is enforced fail-closed ([`cluster`]); both are logged with the
    /// field and value and counted (`flock_policy_invalid`).
    pub fn on_cluster_policy(&self, event: Event<kube::api::DynamicObject>) {
        self.update_rules(|view| {
            let changed = feed_policies(
                &mut view.cluster_policies,
                &mut view.cluster_invalid,
                event,
                |cnp| match cluster::cluster_policy(cnp) {
                    Ok(c) if c.unsupported.is_empty() => (Some(c.policy), None),
                    Ok(c) => {
                        let note = format!(
                            "clusternetworkpolicy {}: {} (enforced fail-closed)",
                            c.policy.name,
                            c.unsupported.join("; ")
                        );
                        warn!(%note, "ClusterNetworkPolicy enforced fail-closed");
                        (Some(c.policy), Some(note))
                    }
                    Err(e) => {
                        warn!(error = %e, "ClusterNetworkPolicy left out");
                        (None, Some(format!("{e} (left out)")))
                    }
                },
            );
            self.count_invalid(view);
            changed
        });
    }

    /// The ClusterNetworkPolicy resource is not served (its CRD is not installed): none
    /// exist, and enforcement need not wait for them — an empty listing.
    pub fn no_cluster_policies(&self) {
        self.on_cluster_policy(Event::Init);
        self.on_cluster_policy(Event::InitDone);
    }

    /// `flock_policy_invalid` and the note `/readyz` shows: the policies of both kinds left
    /// out or enforced otherwise. A note, not a problem: another user's policy does not make
    /// the node unready.
    fn count_invalid(&self, view: &ClusterView) {
        let invalid = view.not_as_written();
        self.metrics.policy_invalid.set(invalid.len() as i64);
        self.health.set_note(
            Component::NetworkPolicy,
            (!invalid.is_empty()).then(|| not_as_written_summary(&invalid)),
        );
    }

    /// A Namespace watch event. An annotation asking for logging in a way flock does not
    /// know is left out (nothing is logged) and shown with the policies not enforced as
    /// written.
    pub fn on_namespace(&self, event: Event<Namespace>) {
        self.update_rules(|view| {
            let changed = view
                .namespaces
                .feed(event, |ns| Some(convert::namespace(ns)));
            self.count_invalid(view);
            changed
        });
    }

    /// A Pod watch event.
    pub fn on_pod(&self, event: Event<Pod>) {
        match event {
            Event::Apply(pod) => {
                let value = convert::cluster_pod(&pod);
                self.update_pods(|s| s.set_cluster_pod(object_key(&pod), value));
            }
            Event::Delete(pod) => {
                self.update_pods(|s| s.set_cluster_pod(object_key(&pod), None));
            }
            relist => {
                self.update(|view| {
                    let mut pods = std::mem::take(&mut view.pods);
                    let changed =
                        pods.feed(relist, |pod| view.intern_labels(convert::cluster_pod(pod)));
                    view.pods = pods;
                    changed
                });
            }
        }
    }

    /// Takes a pod of this node (at start-up, from its record) without waiting for it to be
    /// applied.
    pub fn restore(&self, host_if: String, pod: LocalPod) -> u64 {
        self.update_pods(|s| s.set_local(host_if, pod))
    }

    /// Takes a new pod of this node and waits, up to `wait`, until a ruleset that holds it is
    /// in the kernel (ADD).
    pub async fn admit(
        &self,
        host_if: String,
        pod: LocalPod,
        wait: Duration,
    ) -> Result<(), EnforceError> {
        let generation = self.restore(host_if, pod);
        self.wait_applied(generation, wait).await
    }

    /// Forgets a pod of this node (DEL): its chain and set elements go with the next apply.
    pub fn forget(&self, host_if: &str) {
        self.update_pods(|s| s.remove_local(host_if));
    }

    /// Waits until `generation` (or a newer one) is applied; fails when its apply failed or
    /// nothing was applied within `wait`.
    pub async fn wait_applied(&self, generation: u64, wait: Duration) -> Result<(), EnforceError> {
        let deadline = tokio::time::Instant::now() + wait;
        let mut progress = self.progress.subscribe();
        loop {
            {
                let p = progress.borrow_and_update();
                if p.applied >= generation {
                    return Ok(());
                }
                if let Some((failed, why)) = &p.failed
                    && *failed >= generation
                {
                    return Err(EnforceError::Failed(why.clone()));
                }
            }
            if tokio::time::timeout_at(deadline, progress.changed())
                .await
                .is_err()
            {
                return Err(if self.schedule().view().is_synced() {
                    EnforceError::Timeout { waited: wait }
                } else {
                    EnforceError::NotSynced { waited: wait }
                });
            }
        }
    }

    /// What the task has done so far.
    pub fn progress(&self) -> Progress {
        self.progress.borrow().clone()
    }

    /// The ruleset in the kernel, when known (`None` while an apply is under way too).
    pub fn applied_ruleset(&self) -> Option<Ruleset> {
        self.schedule().ruleset().cloned()
    }

    /// What the last successful apply held, and when it was.
    pub fn applied(&self) -> Applied {
        self.schedule().last_applied().clone()
    }

    /// Where enforcement stands, for the NodeConfig status.
    pub fn status(&self) -> PolicyStatus {
        let schedule = self.schedule();
        let progress = schedule.progress();
        PolicyStatus {
            not_as_written: schedule.view().not_as_written(),
            applied: schedule.last_applied().clone(),
            failed: progress
                .failed
                .as_ref()
                .filter(|(generation, _)| *generation > progress.applied)
                .map(|(_, why)| why.to_string()),
        }
    }

    /// The model's inputs as of now (for tests and debugging).
    pub fn inputs(&self) -> view::ModelInputs {
        self.schedule().view().inputs()
    }

    /// The apply task: asks the schedule for work, does it, reports back; sleeps until a
    /// change or the retry of a failed apply.
    async fn run(self: Arc<Self>) {
        loop {
            let (work, retry_at) = {
                let mut schedule = self.schedule();
                let work = schedule.next_work(Instant::now());
                (work, schedule.retry_at())
            };
            match (work, retry_at) {
                (Some(work), _) => self.apply(work).await,
                (None, None) => self.wake.notified().await,
                (None, Some(at)) => {
                    tokio::select! {
                        () = self.wake.notified() => {}
                        () = tokio::time::sleep_until(at.into()) => {}
                    }
                }
            }
        }
    }

    /// Plans `work` and applies its step, then tells the schedule and the waiters.
    async fn apply(&self, work: Work) {
        let started = Instant::now();
        let generation = work.generation();
        let planned = match work.plan() {
            Ok(planned) => planned,
            Err(PlanError::CannotFollow) => {
                debug!(
                    generation,
                    "the model cannot follow the pod changes; rebuilding"
                );
                self.schedule().cannot_follow(generation);
                return;
            }
            Err(PlanError::Failed(e)) => return self.failed(generation, e),
        };
        let result = match planned.step() {
            Step::Nothing => Ok(()),
            Step::Update(u) if u.elements_only() => {
                self.nft.apply_elements(u.elements.clone()).await
            }
            step => match step.script() {
                Some(script) => self.nft.apply(script).await,
                None => Ok(()),
            },
        };
        if let Err(e) = result {
            return self.failed(generation, e.into());
        }
        let kind = planned.step().kind();
        self.metrics.observe_policy_apply(kind, started.elapsed());
        self.metrics.set_policy_size(plan::size(planned.ruleset()));
        self.health.set_problem(Component::NetworkPolicy, None);
        let progress = {
            let mut schedule = self.schedule();
            schedule.applied(planned, SystemTime::now());
            schedule.progress().clone()
        };
        self.progress.send_replace(progress);
        debug!(generation, kind, "NetworkPolicy ruleset applied");
    }

    fn failed(&self, generation: u64, error: ApplyError) {
        self.metrics.policy_apply_errors.inc();
        self.health
            .set_problem(Component::NetworkPolicy, Some(error.to_string()));
        let (progress, retry) = {
            let mut schedule = self.schedule();
            let retry = schedule.failed(generation, error.clone(), Instant::now());
            (schedule.progress().clone(), retry)
        };
        warn!(generation, %error, retry_ms = retry.as_millis() as u64,
            "applying the NetworkPolicy ruleset failed; retrying");
        self.progress.send_replace(progress);
    }
}

/// The policy log's questions, answered from the model of the ruleset in force.
impl decisions::Describe for PolicyEnforcer {
    fn pod_at(&self, addr: std::net::IpAddr) -> Option<String> {
        self.schedule().view().pod_at(addr)
    }

    fn decided_by(
        &self,
        src: std::net::IpAddr,
        dst: std::net::IpAddr,
        transport: flock_policy::Transport,
        direction: flock_policy::Direction,
    ) -> (String, String) {
        let schedule = self.schedule();
        let Some(model) = schedule.model() else {
            return (
                "not explained: the ruleset in force was being replaced".to_owned(),
                "none".to_owned(),
            );
        };
        match model.explain(&flock_policy::Flow {
            src,
            dst,
            transport,
        }) {
            Err(e) => (format!("not explained: {e}"), "none".to_owned()),
            Ok(e) => {
                let side = match direction {
                    flock_policy::Direction::Egress => &e.egress,
                    flock_policy::Direction::Ingress => &e.ingress,
                };
                let policy = match &side.reason {
                    flock_policy::Reason::Rule { rule, .. } => rule.policy.to_string(),
                    _ => "none".to_owned(),
                };
                (side.to_string(), policy)
            }
        }
    }
}

/// Feeds a policy watch event into `policies`, keeping `problems` (what is wrong with each
/// object, by key) in step: `judge` says what of an object is kept and what is wrong with it.
/// Returns whether the kept content changed.
fn feed_policies<K: kube::Resource, V: PartialEq>(
    policies: &mut crate::cache::Relist<V>,
    problems: &mut std::collections::BTreeMap<crate::cache::ObjectKey, String>,
    event: Event<K>,
    mut judge: impl FnMut(&K) -> (Option<V>, Option<String>),
) -> bool {
    match &event {
        Event::Delete(k) => {
            problems.remove(&object_key(k));
        }
        Event::Init => problems.clear(),
        _ => {}
    }
    policies.feed(event, |k| {
        let (kept, problem) = judge(k);
        match problem {
            Some(p) => problems.insert(object_key(k), p),
            None => problems.remove(&object_key(k)),
        };
        kept
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_names_a_few_policies_and_counts_the_rest() {
        let one = vec![
            "networkpolicy a/b: spec.ingress[0].ports[0].port: \"x y\" is not a port (left out)"
                .to_owned(),
        ];
        assert_eq!(
            not_as_written_summary(&one),
            format!("1 not enforced as written: {}", one[0])
        );
        let many: Vec<String> = (0..8)
            .map(|i| format!("networkpolicy ns/p{i}: … (left out)"))
            .collect();
        let line = not_as_written_summary(&many);
        assert!(
            line.starts_with("8 not enforced as written: networkpolicy ns/p0"),
            "{line}"
        );
        assert!(line.contains("ns/p4: … (left out); and 3 more"), "{line}");
        assert!(!line.contains("ns/p5"), "{line}");
    }
}
