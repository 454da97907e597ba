//! When the policy task applies what, decided purely in the way of quinn-proto: no clock, no
//! lock, no I/O. The caller feeds the view's changes in, asks for the next [`Work`] with the
//! time it is, plans and applies it, and reports how that went; [`super::PolicyEnforcer`] is
//! the tokio shell around a [`Schedule`].
//!
//! - Every change bumps a generation. A change of pods only keeps the model's pods of each
//!   changed key before and after, to be followed incrementally. A change of policies or
//!   namespaces keeps them too: the model follows the pods, then takes the new policies and
//!   namespaces in place ([`Model::update_policies`]: the sets that stay are kept, not
//!   filled again from every pod). A relist of pods, or more than [`MAX_PENDING_PODS`] pod
//!   changes between two applies, asks for a rebuild from the view.
//! - Nothing is handed out before every cache has finished its first listing (an empty model
//!   would remove every rule), and one work at a time. A work covers every change up to its
//!   generation, so a burst of changes is one transaction.
//! - A generation is applied when [`Schedule::applied`] says so, not before. A failed apply
//!   leaves the kernel's table unknown: the next work rebuilds and replaces it. The same
//!   generation is retried after a back-off that doubles from [`FIRST_RETRY`] to
//!   [`MAX_RETRY`] and starts again after a success; a newer change is tried at once (an ADD
//!   waiting on it learns the outcome rather than its timeout).

#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use flock_policy::{Model, Pod, Ruleset};

use super::convert::ClusterPod;
use super::nft::NftError;
use super::plan::{self, Step};
use super::view::{ClusterView, LocalPod, ModelInputs, RuleInputs};
use crate::cache::ObjectKey;

/// How long the task waits before retrying a failed apply (doubling up to [`MAX_RETRY`]).
pub const FIRST_RETRY: Duration = Duration::from_millis(500);
/// The longest wait between two retries of a failing apply.
pub const MAX_RETRY: Duration = Duration::from_secs(30);
/// More pod changes than this between two applies: rebuild rather than follow them.
pub const MAX_PENDING_PODS: usize = 2_000;

/// The model's pods of one key before and after a change.
pub type PodChange = (Vec<Pod>, Vec<Pod>);

/// Why an apply failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ApplyError {
    /// The model refused its inputs (nothing was sent to the kernel).
    #[error("building the NetworkPolicy model: {0}")]
    Model(#[source] Arc<flock_policy::Error>),
    /// `nft` or nf_tables refused the step; what the kernel holds is unknown.
    #[error("{}", flock_cni_proto::error::cause_chain(.0.as_ref()))]
    Kernel(Arc<NftError>),
}

impl From<flock_policy::Error> for ApplyError {
    fn from(e: flock_policy::Error) -> Self {
        ApplyError::Model(Arc::new(e))
    }
}

impl From<NftError> for ApplyError {
    fn from(e: NftError) -> Self {
        ApplyError::Kernel(Arc::new(e))
    }
}

/// What the applies have done so far.
#[derive(Debug, Clone, Default)]
pub struct Progress {
    /// The newest generation in the kernel.
    pub applied: u64,
    /// The newest generation whose apply failed, and why.
    pub failed: Option<(u64, ApplyError)>,
}

/// What the last successful apply held, as the NodeConfig status reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// Valid policies in the cluster when it was applied.
    pub policies: usize,
    /// Invalid policies left out.
    pub invalid: usize,
    /// Local pods isolated for ingress or egress.
    pub isolated_pods: usize,
    /// When it was applied.
    pub at: Option<SystemTime>,
}

/// Changes not handed out yet.
#[derive(Debug, Default)]
struct Pending {
    /// A rebuild from the view: pod changes are moot.
    rebuild: bool,
    /// Policies or namespaces changed: the model takes them after following `pods`.
    rules: bool,
    pods: Vec<PodChange>,
}

impl Pending {
    /// A rebuild, which makes any other change moot.
    fn rebuild() -> Pending {
        Pending {
            rebuild: true,
            ..Pending::default()
        }
    }
}

/// The retry delay of a failing apply: doubling, bounded, reset by a success.
#[derive(Debug, Default, Clone, Copy)]
struct Backoff {
    delay: Option<Duration>,
    until: Option<Instant>,
}

impl Backoff {
    fn failed(&mut self, now: Instant) -> Duration {
        let delay = self.delay.map_or(FIRST_RETRY, |d| (d * 2).min(MAX_RETRY));
        self.delay = Some(delay);
        self.until = Some(now + delay);
        delay
    }
}

/// The policy task's state: the view, the generations, the model in the kernel.
#[derive(Debug, Default)]
pub struct Schedule {
    view: ClusterView,
    generation: u64,
    pending: Pending,
    /// The model whose ruleset is in the kernel; `None` when unknown (at start, after a
    /// failure) or lent to the work in flight.
    model: Option<Model>,
    in_flight: Option<u64>,
    progress: Progress,
    last: Applied,
    backoff: Backoff,
}

/// One apply to plan and do: everything up to its generation.
#[derive(Debug)]
pub struct Work {
    generation: u64,
    kind: WorkKind,
    /// Valid and invalid policies the work holds.
    counts: (usize, usize),
}

#[derive(Debug)]
enum WorkKind {
    /// A new model from the inputs; `old` is the one in the kernel, if known.
    Rebuild {
        inputs: ModelInputs,
        old: Option<Model>,
    },
    /// The model in the kernel, to take the pod changes.
    Follow {
        model: Model,
        changes: Vec<PodChange>,
    },
    /// The model in the kernel, to take the pod changes, then the policies and namespaces
    /// of `rules`.
    Rules {
        model: Model,
        changes: Vec<PodChange>,
        rules: RuleInputs,
    },
}

/// Why a work has no step to apply.
#[derive(Debug)]
pub enum PlanError {
    /// The model could not follow the pod changes and is in no defined state: tell
    /// [`Schedule::cannot_follow`], and the next work rebuilds.
    CannotFollow,
    /// The model refused the inputs: tell [`Schedule::failed`].
    Failed(ApplyError),
}

/// A planned work: the model it leads to and the one transaction (or none) that brings the
/// kernel there.
#[derive(Debug)]
pub struct Planned {
    generation: u64,
    step: Step,
    model: Model,
    counts: (usize, usize),
}

impl Work {
    /// The generation this work brings the kernel to.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The new model and the step to it: a rebuild diffs it against the old one (the whole
    /// table when that is unknown); a follow feeds the pod changes to the model and takes its
    /// delta. Pure, and for a rebuild the costly part: call it outside any lock.
    pub fn plan(self) -> Result<Planned, PlanError> {
        let (model, step) = match self.kind {
            WorkKind::Rebuild { inputs, old } => {
                let model = Model::with_cluster_policies(
                    &inputs.cluster_policies,
                    &inputs.policies,
                    &inputs.namespaces,
                    &inputs.pods,
                )
                .map_err(|e| PlanError::Failed(e.into()))?;
                let step = plan::next_step(old.as_ref().map(Model::ruleset), model.ruleset());
                (model, step)
            }
            WorkKind::Follow { mut model, changes } => {
                let was_empty = model.ruleset().is_empty();
                if !follow(&mut model, &changes).map_err(|e| PlanError::Failed(e.into()))? {
                    return Err(PlanError::CannotFollow);
                }
                let delta = model.take_delta();
                let step = plan::delta_step(was_empty, model.ruleset(), &delta);
                (model, step)
            }
            WorkKind::Rules {
                mut model,
                changes,
                rules,
            } => {
                let was_empty = model.ruleset().is_empty();
                let failed = |e: flock_policy::Error| PlanError::Failed(e.into());
                if !follow(&mut model, &changes).map_err(failed)? {
                    return Err(PlanError::CannotFollow);
                }
                model
                    .update_policies(&rules.cluster_policies, &rules.policies, &rules.namespaces)
                    .map_err(failed)?;
                let delta = model.take_delta();
                let step = plan::delta_step(was_empty, model.ruleset(), &delta);
                (model, step)
            }
        };
        Ok(Planned {
            generation: self.generation,
            step,
            model,
            counts: self.counts,
        })
    }
}

impl Planned {
    /// The generation it brings the kernel to.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The transaction to apply.
    pub fn step(&self) -> &Step {
        &self.step
    }

    /// The ruleset the kernel holds once the step is applied.
    pub fn ruleset(&self) -> &Ruleset {
        self.model.ruleset()
    }
}

impl Schedule {
    /// What the agent knows of the cluster and its own pods.
    pub fn view(&self) -> &ClusterView {
        &self.view
    }

    /// The newest generation.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Changes the view; when `change` says it changed something, bumps the generation and
    /// asks for a rebuild. Returns the generation that holds the change.
    pub fn change(&mut self, change: impl FnOnce(&mut ClusterView) -> bool) -> u64 {
        if change(&mut self.view) {
            self.pending = Pending::rebuild();
            self.generation += 1;
        }
        self.generation
    }

    /// Changes policies or namespaces in the view (not pods); when `change` says it changed
    /// something, bumps the generation: the next work has the model take them in place.
    /// Returns the generation that holds the change.
    pub fn change_rules(&mut self, change: impl FnOnce(&mut ClusterView) -> bool) -> u64 {
        if change(&mut self.view) {
            self.pending.rules = true;
            self.generation += 1;
        }
        self.generation
    }

    /// Changes the view where only the pods of `keys` change (the keys are read from the view
    /// before the change); the next work follows them without a rebuild.
    fn change_pods(
        &mut self,
        keys: impl FnOnce(&ClusterView) -> Vec<ObjectKey>,
        change: impl FnOnce(&mut ClusterView) -> bool,
    ) -> u64 {
        let keys = keys(&self.view);
        let before: Vec<Vec<Pod>> = keys.iter().map(|k| self.view.model_pods(k)).collect();
        if change(&mut self.view) {
            if !self.pending.rebuild {
                for (key, before) in keys.iter().zip(before) {
                    let after = self.view.model_pods(key);
                    if after != before {
                        self.pending.pods.push((before, after));
                    }
                }
                if self.pending.pods.len() > MAX_PENDING_PODS {
                    self.pending = Pending::rebuild();
                }
            }
            self.generation += 1;
        }
        self.generation
    }

    /// A pod of the cluster appears or changes (`Some`) or goes (`None`): followed, no
    /// rebuild.
    pub fn set_cluster_pod(&mut self, key: ObjectKey, pod: Option<ClusterPod>) -> u64 {
        let keys = vec![key.clone()];
        self.change_pods(
            |_| keys,
            |view| {
                let pod = view.intern_labels(pod);
                view.pods.set(key, pod)
            },
        )
    }

    /// A pod of this node on host veth `host_if` (its ADD, or its record at start-up); the
    /// pod that veth held before, if another, changes too.
    pub fn set_local(&mut self, host_if: String, pod: LocalPod) -> u64 {
        self.change_pods(
            |view| {
                let mut keys = vec![pod.key.clone()];
                keys.extend(view.local.get(&host_if).map(|old| old.key.clone()));
                keys.dedup();
                keys
            },
            |view| view.local.insert(host_if.clone(), pod.clone()).as_ref() != Some(&pod),
        )
    }

    /// The pod of this node on host veth `host_if` goes (its DEL).
    pub fn remove_local(&mut self, host_if: &str) -> u64 {
        self.change_pods(
            |view| {
                view.local
                    .get(host_if)
                    .map(|l| l.key.clone())
                    .into_iter()
                    .collect()
            },
            |view| view.local.remove(host_if).is_some(),
        )
    }

    /// The work to do now, if any: none before the caches are synced, while a work is in
    /// flight, when the kernel holds the newest generation, or while a failed generation
    /// waits for its retry.
    pub fn next_work(&mut self, now: Instant) -> Option<Work> {
        if self.in_flight.is_some()
            || !self.view.is_synced()
            || self.generation <= self.progress.applied
            || self.retry_at().is_some_and(|at| now < at)
        {
            return None;
        }
        let (kind, counts) = match self.model.take() {
            Some(model) if !self.pending.rebuild && self.pending.rules => {
                let changes = std::mem::take(&mut self.pending).pods;
                let rules = self.view.rules();
                (
                    WorkKind::Rules {
                        model,
                        changes,
                        rules,
                    },
                    (self.view.policies.len(), self.view.invalid.len()),
                )
            }
            Some(model) if !self.pending.rebuild => (
                WorkKind::Follow {
                    model,
                    changes: std::mem::take(&mut self.pending.pods),
                },
                (self.last.policies, self.last.invalid),
            ),
            old => {
                self.pending = Pending::default();
                (
                    WorkKind::Rebuild {
                        inputs: self.view.inputs(),
                        old,
                    },
                    (self.view.policies.len(), self.view.invalid.len()),
                )
            }
        };
        self.in_flight = Some(self.generation);
        Some(Work {
            generation: self.generation,
            kind,
            counts,
        })
    }

    /// When the failed newest generation is retried, if that is what is waited for (a
    /// newer change is due at once; see [`Schedule::next_work`]).
    pub fn retry_at(&self) -> Option<Instant> {
        match &self.progress.failed {
            Some((failed, _)) if *failed >= self.generation && self.in_flight.is_none() => {
                self.backoff.until
            }
            _ => None,
        }
    }

    /// The work of `planned` is in the kernel (as of `at`): its generation is applied, and its
    /// model is the kernel's.
    pub fn applied(&mut self, planned: Planned, at: SystemTime) {
        debug_assert_eq!(
            self.in_flight,
            Some(planned.generation),
            "not the work in flight"
        );
        self.in_flight = None;
        self.backoff = Backoff::default();
        self.progress.applied = self.progress.applied.max(planned.generation);
        let ruleset = planned.model.ruleset();
        let isolated: BTreeSet<&String> = ruleset
            .ingress
            .keys()
            .chain(ruleset.egress.keys())
            .collect();
        self.last = Applied {
            policies: planned.counts.0,
            invalid: planned.counts.1,
            isolated_pods: isolated.len(),
            at: Some(at),
        };
        self.model = Some(planned.model);
    }

    /// The work of `generation` failed (at `now`): the kernel's table is unknown, the next
    /// work rebuilds. Returns how long the retry waits.
    pub fn failed(&mut self, generation: u64, error: ApplyError, now: Instant) -> Duration {
        self.cannot_follow(generation);
        self.progress.failed = Some((generation, error));
        self.backoff.failed(now)
    }

    /// The work of `generation` could not follow its pod changes: the next work (due at once)
    /// rebuilds from the view and replaces the whole table.
    pub fn cannot_follow(&mut self, generation: u64) {
        debug_assert_eq!(self.in_flight, Some(generation), "not the work in flight");
        self.in_flight = None;
        self.model = None;
        self.pending = Pending::rebuild();
    }

    /// What the applies have done so far.
    pub fn progress(&self) -> &Progress {
        &self.progress
    }

    /// What the last successful apply held, and when it was.
    pub fn last_applied(&self) -> &Applied {
        &self.last
    }

    /// The ruleset in the kernel, when known (`None` while a work is in flight too).
    pub fn ruleset(&self) -> Option<&Ruleset> {
        self.model.as_ref().map(Model::ruleset)
    }

    /// The model of the ruleset in the kernel, when known (`None` while a work is in flight).
    pub fn model(&self) -> Option<&Model> {
        self.model.as_ref()
    }
}

/// Feeds pod changes to the model; `Ok(false)` when it cannot follow them (rebuild).
fn follow(model: &mut Model, changes: &[PodChange]) -> Result<bool, flock_policy::Error> {
    for (before, after) in changes {
        for pod in before {
            if !model.remove_pod(pod) {
                return Ok(false);
            }
        }
        for pod in after {
            if !model.add_pod(pod)? {
                return Ok(false);
            }
        }
    }
    Ok(true)
}
