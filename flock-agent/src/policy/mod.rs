//! NetworkPolicy enforcement on the node: the cluster-wide caches (policies, namespaces,
//! pods; kept slim by [`convert`]), the node's own pods (from the allocation records and
//! their ADDs), and one task that turns every change into one atomic `nft -f` transaction
//! on flock's table, `inet flock_policy`, in the node's namespace.
//!
//! Decided purely: what is kept of each object ([`convert`]), the model's inputs
//! ([`view::ClusterView::inputs`]), and whether an apply is nothing, set elements or the
//! whole table ([`plan::next_step`]). Done here: the apply task and waiting for it.
//!
//! Every change bumps a generation and wakes the task; the task applies the newest state
//! (so a burst of changes is one transaction) and publishes the generation it applied. An ADD
//! waits until its pod's generation is applied: the pod's rules are in the kernel before the
//! runtime starts its containers. Nothing is applied before all three caches have finished
//! their first listing (an empty model would remove every rule); the first apply replaces
//! whatever a previous agent left.

pub mod convert;
pub mod nft;
pub mod plan;
pub mod view;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flock_policy::Ruleset;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::ResourceExt;
use kube::runtime::watcher::Event;
use tokio::sync::{Notify, watch};
use tracing::{debug, warn};

use crate::metrics::{Health, Metrics};
use nft::Nft;
use plan::{Step, next_step};
use view::{ClusterView, LocalPod, ObjectKey, Relist};

/// How long the task waits before retrying a failed apply (doubling up to [`MAX_RETRY`]).
pub const FIRST_RETRY: Duration = Duration::from_millis(500);
/// The longest wait between two retries of a failing apply.
pub const MAX_RETRY: Duration = Duration::from_secs(30);

/// Why a pod's rules are not (known to be) in place.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnforceError {
    /// The caches have not finished their first listing.
    #[error(
        "NetworkPolicies, Namespaces and Pods are not all listed yet after {} ms (API server reachable? RBAC list/watch of networkpolicies, namespaces, pods?)",
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
    Failed(String),
}

/// What the task has done so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// The newest generation in the kernel.
    pub applied: u64,
    /// The newest generation whose apply failed, and why.
    pub failed: Option<(u64, String)>,
}

#[derive(Debug, Default)]
struct Shared {
    view: ClusterView,
    generation: u64,
}

/// The node's NetworkPolicy enforcer.
pub struct PolicyEnforcer {
    shared: Mutex<Shared>,
    wake: Notify,
    progress: watch::Sender<Progress>,
    applied: Mutex<Option<Ruleset>>,
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
            "networkpolicy",
            Some("waiting for the first listing of NetworkPolicies, Namespaces and Pods".into()),
        );
        let this = Arc::new(PolicyEnforcer {
            shared: Mutex::default(),
            wake: Notify::new(),
            progress: watch::channel(Progress::default()).0,
            applied: Mutex::new(None),
            nft,
            metrics,
            health,
        });
        tokio::spawn(this.clone().run());
        this
    }

    fn shared(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.lock().expect("policy view lock")
    }

    /// Changes the view; when `change` says it changed something, bumps the generation and
    /// wakes the task. Returns the generation that holds the change.
    pub fn update(&self, change: impl FnOnce(&mut ClusterView) -> bool) -> u64 {
        let mut shared = self.shared();
        if change(&mut shared.view) {
            shared.generation += 1;
            self.wake.notify_one();
        }
        shared.generation
    }

    /// A NetworkPolicy watch event. An invalid policy is left out, logged with the field and
    /// value at fault, and counted (`flock_policy_invalid`).
    pub fn on_policy(&self, event: Event<NetworkPolicy>) {
        let convert = |np: &NetworkPolicy| {
            let key = object_key(np);
            match convert::policy(np) {
                Ok(p) => (key, Ok(p)),
                Err(e) => {
                    warn!(error = %e, "NetworkPolicy left out");
                    (key, Err(e.to_string()))
                }
            }
        };
        self.update(|view| {
            let mut note =
                |key: &ObjectKey, result: Result<flock_policy::Policy, String>| match result {
                    Ok(p) => {
                        view.invalid.remove(key);
                        Some(p)
                    }
                    Err(e) => {
                        view.invalid.insert(key.clone(), e);
                        None
                    }
                };
            let changed = match event {
                Event::Apply(np) => {
                    let (key, result) = convert(&np);
                    let p = note(&key, result);
                    view.policies.set(key, p)
                }
                Event::Delete(np) => {
                    let key = object_key(&np);
                    view.invalid.remove(&key);
                    view.policies.set(key, None)
                }
                Event::Init => {
                    view.invalid.clear();
                    view.policies.init();
                    false
                }
                Event::InitApply(np) => {
                    let (key, result) = convert(&np);
                    let p = note(&key, result);
                    view.policies.init_apply(key, p);
                    false
                }
                Event::InitDone => view.policies.init_done(),
            };
            self.metrics.policy_invalid.set(view.invalid.len() as i64);
            changed
        });
    }

    /// A Namespace watch event.
    pub fn on_namespace(&self, event: Event<Namespace>) {
        self.update(|view| {
            relist_event(&mut view.namespaces, event, |ns| {
                (
                    (String::new(), ns.name_any()),
                    Some(convert::namespace_labels(ns)),
                )
            })
        });
    }

    /// A Pod watch event.
    pub fn on_pod(&self, event: Event<Pod>) {
        self.update(|view| {
            relist_event(&mut view.pods, event, |pod| {
                (object_key(pod), convert::cluster_pod(pod))
            })
        });
    }

    /// Takes a pod of this node (at start-up, from its record) without waiting for it to be
    /// applied.
    pub fn restore(&self, host_if: String, pod: LocalPod) -> u64 {
        self.update(|view| view.local.insert(host_if, pod.clone()).as_ref() != Some(&pod))
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
        self.update(|view| view.local.remove(host_if).is_some());
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
                return Err(if self.shared().view.is_synced() {
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

    /// The ruleset in the kernel, when known.
    pub fn applied_ruleset(&self) -> Option<Ruleset> {
        self.applied.lock().expect("applied lock").clone()
    }

    /// The model's inputs as of now (for tests and debugging).
    pub fn inputs(&self) -> view::ModelInputs {
        self.shared().view.inputs()
    }

    /// The apply task: one transaction per wake-up, for the newest generation.
    async fn run(self: Arc<Self>) {
        let mut retry: Option<Duration> = None;
        loop {
            match retry {
                None => self.wake.notified().await,
                Some(delay) => {
                    tokio::select! {
                        () = self.wake.notified() => {}
                        () = tokio::time::sleep(delay) => {}
                    }
                }
            }
            let (generation, inputs) = {
                let shared = self.shared();
                if !shared.view.is_synced() {
                    continue;
                }
                (shared.generation, shared.view.inputs())
            };
            let started = Instant::now();
            match self.apply(&inputs).await {
                Ok(step) => {
                    retry = None;
                    self.metrics
                        .observe_policy_apply(step.kind(), started.elapsed());
                    self.health.set_problem("networkpolicy", None);
                    self.progress.send_modify(|p| p.applied = generation);
                    debug!(
                        generation,
                        kind = step.kind(),
                        "NetworkPolicy ruleset applied"
                    );
                }
                Err(why) => {
                    retry = Some(retry.map_or(FIRST_RETRY, |d| (d * 2).min(MAX_RETRY)));
                    self.metrics.policy_apply_errors.inc();
                    warn!(generation, error = %why, "applying the NetworkPolicy ruleset failed; retrying");
                    self.health.set_problem("networkpolicy", Some(why.clone()));
                    self.progress
                        .send_modify(|p| p.failed = Some((generation, why)));
                }
            }
        }
    }

    async fn apply(&self, inputs: &view::ModelInputs) -> Result<Step, String> {
        let ruleset = flock_policy::build(&inputs.policies, &inputs.namespaces, &inputs.pods)
            .map_err(|e| e.to_string())?;
        let step = next_step(self.applied_ruleset().as_ref(), &ruleset);
        if let Some(script) = step.script()
            && let Err(e) = self.nft.apply(script.to_owned()).await
        {
            // What the kernel holds is unknown now: the next apply replaces the table.
            *self.applied.lock().expect("applied lock") = None;
            return Err(crate::agent::error::cause_chain(&e));
        }
        self.metrics.set_policy_size(plan::size(&ruleset));
        *self.applied.lock().expect("applied lock") = Some(ruleset);
        Ok(step)
    }
}

fn object_key<K: kube::Resource>(object: &K) -> ObjectKey {
    (object.namespace().unwrap_or_default(), object.name_any())
}

/// Feeds one watch event into a cache; returns whether its content changed.
fn relist_event<K, V: PartialEq>(
    relist: &mut Relist<V>,
    event: Event<K>,
    convert: impl Fn(&K) -> (ObjectKey, Option<V>),
) -> bool {
    match event {
        Event::Apply(k) => {
            let (key, v) = convert(&k);
            relist.set(key, v)
        }
        Event::Delete(k) => relist.set(convert(&k).0, None),
        Event::Init => {
            relist.init();
            false
        }
        Event::InitApply(k) => {
            let (key, v) = convert(&k);
            relist.init_apply(key, v);
            false
        }
        Event::InitDone => relist.init_done(),
    }
}
