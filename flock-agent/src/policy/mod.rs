//! NetworkPolicy enforcement on the node: the cluster-wide caches (policies, namespaces,
//! pods; kept slim by [`convert`]), the node's own pods (from the allocation records and
//! their ADDs), and one task that turns every change into one atomic `nft -f` transaction
//! on flock's table, `inet flock_policy`, in the node's namespace.
//!
//! Decided purely: what is kept of each object ([`convert`]), the model's inputs
//! ([`view::ClusterView::inputs`]), and whether an apply is nothing, a change in place or the
//! whole table ([`plan`]). Done here: the apply task and waiting for it.
//!
//! Every change bumps a generation and wakes the task; the task applies the newest state
//! (so a burst of changes is one transaction) and publishes the generation it applied. A
//! change of pods only (a pod joins, leaves or changes, here or anywhere in the cluster) is
//! followed incrementally: the [`flock_policy::Model`] of the applied ruleset takes the pods
//! that changed, in time proportional to them, and its delta becomes elements (sent over
//! netlink, [`netlink`]) or a small `nft -f` with the chains that come or go. A change of
//! policies or namespaces, or a relist, rebuilds the model from the caches. An ADD
//! waits until its pod's generation is applied: the pod's rules are in the kernel before the
//! runtime starts its containers. Nothing is applied before all three caches have finished
//! their first listing (an empty model would remove every rule); the first apply replaces
//! whatever a previous agent left.

pub mod convert;
pub mod netlink;
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

/// What the task has done so far, as the NodeConfig status reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// Valid policies in the cluster when it was applied.
    pub policies: usize,
    /// Invalid policies left out.
    pub invalid: usize,
    /// Local pods isolated for ingress or egress.
    pub isolated_pods: usize,
    /// When it was applied.
    pub at: Option<std::time::SystemTime>,
}

/// Where enforcement stands: what was applied last, and the error of a newer apply that
/// failed (it is retried).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyStatus {
    /// The last successful apply.
    pub applied: Applied,
    /// Why the newest apply failed, when it is newer than the last success.
    pub failed: Option<String>,
}

/// Pod changes not applied yet: each the model's pods of one key before and after.
#[derive(Debug, Default)]
struct Pending {
    rebuild: bool,
    pods: Vec<(Vec<flock_policy::Pod>, Vec<flock_policy::Pod>)>,
}

/// More pod changes than this between two applies: rebuild rather than follow them.
const MAX_PENDING_PODS: usize = 2_000;

#[derive(Debug, Default)]
struct Shared {
    view: ClusterView,
    generation: u64,
    pending: Pending,
}

/// What one apply starts from.
enum Work {
    Rebuild(view::ModelInputs, usize, usize),
    Pods(Vec<(Vec<flock_policy::Pod>, Vec<flock_policy::Pod>)>),
}

/// The node's NetworkPolicy enforcer.
pub struct PolicyEnforcer {
    shared: Mutex<Shared>,
    wake: Notify,
    progress: watch::Sender<Progress>,
    /// The model whose ruleset is in the kernel (`None`: unknown; taken while applying).
    model: Mutex<Option<flock_policy::Model>>,
    applied: Mutex<Applied>,
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
            model: Mutex::new(None),
            applied: Mutex::default(),
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
    /// wakes the task, which rebuilds the model. Returns the generation that holds the change.
    pub fn update(&self, change: impl FnOnce(&mut ClusterView) -> bool) -> u64 {
        let mut shared = self.shared();
        if change(&mut shared.view) {
            shared.pending.rebuild = true;
            shared.pending.pods.clear();
            shared.generation += 1;
            self.wake.notify_one();
        }
        shared.generation
    }

    /// Changes the view where only the pods of `keys` change (the keys are read from the
    /// view before the change); the task follows them without a rebuild.
    fn update_pods(
        &self,
        keys: impl FnOnce(&ClusterView) -> Vec<ObjectKey>,
        change: impl FnOnce(&mut ClusterView) -> bool,
    ) -> u64 {
        let mut shared = self.shared();
        let keys = keys(&shared.view);
        let before: Vec<Vec<flock_policy::Pod>> =
            keys.iter().map(|k| shared.view.model_pods(k)).collect();
        if change(&mut shared.view) {
            if !shared.pending.rebuild {
                for (key, before) in keys.iter().zip(before) {
                    let after = shared.view.model_pods(key);
                    if after != before {
                        shared.pending.pods.push((before, after));
                    }
                }
                if shared.pending.pods.len() > MAX_PENDING_PODS {
                    shared.pending.rebuild = true;
                    shared.pending.pods.clear();
                }
            }
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
        match event {
            Event::Apply(pod) => {
                let key = object_key(&pod);
                let value = convert::cluster_pod(&pod);
                let keys = vec![key.clone()];
                self.update_pods(
                    |_| keys,
                    |view| {
                        let value = view.intern_labels(value);
                        view.pods.set(key, value)
                    },
                );
            }
            Event::Delete(pod) => {
                let key = object_key(&pod);
                let keys = vec![key.clone()];
                self.update_pods(|_| keys, |view| view.pods.set(key, None));
            }
            relist => {
                self.update(|view| {
                    let mut pods = std::mem::take(&mut view.pods);
                    let changed = relist_event(&mut pods, relist, |pod| {
                        (
                            object_key(pod),
                            view.intern_labels(convert::cluster_pod(pod)),
                        )
                    });
                    view.pods = pods;
                    changed
                });
            }
        }
    }

    /// Takes a pod of this node (at start-up, from its record) without waiting for it to be
    /// applied.
    pub fn restore(&self, host_if: String, pod: LocalPod) -> u64 {
        self.update_pods(
            |view| {
                let mut keys = vec![pod.key.clone()];
                keys.extend(view.local.get(&host_if).map(|old| old.key.clone()));
                keys.dedup();
                keys
            },
            |view| view.local.insert(host_if.clone(), pod.clone()).as_ref() != Some(&pod),
        )
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
        self.update_pods(
            |view| {
                view.local
                    .get(host_if)
                    .map(|l| l.key.clone())
                    .into_iter()
                    .collect()
            },
            |view| view.local.remove(host_if).is_some(),
        );
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

    /// The ruleset in the kernel, when known (`None` while an apply is under way too).
    pub fn applied_ruleset(&self) -> Option<Ruleset> {
        self.model
            .lock()
            .expect("model lock")
            .as_ref()
            .map(|m| m.ruleset().clone())
    }

    /// What the last successful apply held, and when it was.
    pub fn applied(&self) -> Applied {
        self.applied.lock().expect("applied lock").clone()
    }

    /// Where enforcement stands, for the NodeConfig status.
    pub fn status(&self) -> PolicyStatus {
        let progress = self.progress();
        PolicyStatus {
            applied: self.applied(),
            failed: progress
                .failed
                .filter(|(generation, _)| *generation > progress.applied)
                .map(|(_, why)| why),
        }
    }

    /// The model's inputs as of now (for tests and debugging).
    pub fn inputs(&self) -> view::ModelInputs {
        self.shared().view.inputs()
    }

    /// Everything since the last apply, as a rebuild: the inputs and the generation they are.
    fn rebuild_work(&self) -> (u64, Work) {
        let mut shared = self.shared();
        shared.pending = Pending::default();
        let work = Work::Rebuild(
            shared.view.inputs(),
            shared.view.policies.len(),
            shared.view.invalid.len(),
        );
        (shared.generation, work)
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
            let (generation, work) = {
                let mut shared = self.shared();
                if !shared.view.is_synced() {
                    continue;
                }
                let known = self.model.lock().expect("model lock").is_some();
                if shared.pending.rebuild || !known {
                    drop(shared);
                    self.rebuild_work()
                } else {
                    let pods = std::mem::take(&mut shared.pending.pods);
                    (shared.generation, Work::Pods(pods))
                }
            };
            let started = Instant::now();
            match self.apply(generation, work).await {
                Ok((generation, step)) => {
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
                Err((generation, why)) => {
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

    /// Applies `work`; returns the generation applied (a fallback to a rebuild applies a
    /// newer one) and the step, or the generation and why it failed.
    async fn apply(&self, generation: u64, work: Work) -> Result<(u64, Step), (u64, String)> {
        let old = self.model.lock().expect("model lock").take();
        let (generation, model, step, counts) = match (work, old) {
            (Work::Pods(changes), Some(mut model)) => {
                let was_empty = model.ruleset().is_empty();
                match follow(&mut model, &changes) {
                    Ok(true) => {
                        let delta = model.take_delta();
                        let step = plan::delta_step(was_empty, model.ruleset(), &delta);
                        let counts = {
                            let a = self.applied.lock().expect("applied lock");
                            (a.policies, a.invalid)
                        };
                        (generation, model, step, counts)
                    }
                    // the model is in no defined state now, nor known to match the kernel
                    Ok(false) => self.rebuild(None)?,
                    Err(e) => return Err((generation, e)),
                }
            }
            (Work::Rebuild(inputs, policies, invalid), old) => {
                let model =
                    flock_policy::Model::new(&inputs.policies, &inputs.namespaces, &inputs.pods)
                        .map_err(|e| (generation, e.to_string()))?;
                let step = next_step(old.as_ref().map(|m| m.ruleset()), model.ruleset());
                (generation, model, step, (policies, invalid))
            }
            (Work::Pods(_), None) => self.rebuild(None)?,
        };
        let result = match &step {
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
            // What the kernel holds is unknown now: the next apply replaces the table.
            return Err((generation, flock_cni_proto::error::cause_chain(&e)));
        }
        let ruleset = model.ruleset();
        self.metrics.set_policy_size(plan::size(ruleset));
        let isolated: std::collections::BTreeSet<&String> = ruleset
            .ingress
            .keys()
            .chain(ruleset.egress.keys())
            .collect();
        *self.applied.lock().expect("applied lock") = Applied {
            policies: counts.0,
            invalid: counts.1,
            isolated_pods: isolated.len(),
            at: Some(std::time::SystemTime::now()),
        };
        *self.model.lock().expect("model lock") = Some(model);
        Ok((generation, step))
    }

    /// A new model from the caches as they are now, and the step to it from `old`.
    #[allow(clippy::type_complexity)]
    fn rebuild(
        &self,
        old: Option<&Ruleset>,
    ) -> Result<(u64, flock_policy::Model, Step, (usize, usize)), (u64, String)> {
        let (generation, work) = self.rebuild_work();
        let Work::Rebuild(inputs, policies, invalid) = work else {
            return Err((generation, "no inputs to rebuild from".into()));
        };
        let model = flock_policy::Model::new(&inputs.policies, &inputs.namespaces, &inputs.pods)
            .map_err(|e| (generation, e.to_string()))?;
        let step = next_step(old, model.ruleset());
        Ok((generation, model, step, (policies, invalid)))
    }
}

/// Feeds pod changes to the model; `Ok(false)` when it cannot follow them (rebuild).
fn follow(
    model: &mut flock_policy::Model,
    changes: &[(Vec<flock_policy::Pod>, Vec<flock_policy::Pod>)],
) -> Result<bool, String> {
    for (before, after) in changes {
        for pod in before {
            if !model.remove_pod(pod) {
                return Ok(false);
            }
        }
        for pod in after {
            if !model.add_pod(pod).map_err(|e| e.to_string())? {
                return Ok(false);
            }
        }
    }
    Ok(true)
}

fn object_key<K: kube::Resource>(object: &K) -> ObjectKey {
    (object.namespace().unwrap_or_default(), object.name_any())
}

/// Feeds one watch event into a cache; returns whether its content changed.
fn relist_event<K, V: PartialEq>(
    relist: &mut Relist<V>,
    event: Event<K>,
    mut convert: impl FnMut(&K) -> (ObjectKey, Option<V>),
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
