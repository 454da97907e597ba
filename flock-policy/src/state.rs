//! The incremental [`Model`]: the cluster's policies, namespaces and pods held between
//! changes, each change answered with the [`Delta`] of chains and set elements it makes.

use std::collections::{BTreeMap, BTreeSet};

use crate::addr::Family;
use crate::allows::{
    KeyedAllow, KeyedChain, KeyedPorts, NsScope, PodsKey, SetKey, SourcedChain, empty_set,
    pod_chain, pod_rules, referenced, selects,
};
use crate::cluster::{CheckedClusterPolicy, ClusterPolicy};
use crate::error::{Error, Result};
use crate::input::{CheckedPolicy, Namespace, Pod, Protocol};
use crate::model::{
    AddrSet, Allow, Chain, Direction, Elements, LogMode, Member, Ports, Ruleset, TierRule,
    family_suffix,
};
use crate::selector::Labels;

/// Builds the rule model of the node whose pods are those with a `host_if`.
///
/// `pods` is every flock pod of the cluster (selectors pick peers anywhere); `namespaces`
/// gives the labels namespace selectors see (a pod's namespace missing from it has only the
/// [`NAMESPACE_NAME_LABEL`](crate::NAMESPACE_NAME_LABEL) label). Fails on the first invalid
/// policy or pod: check policies one by one with [`Policy::validate`](crate::Policy::validate)
/// to leave out only the bad ones. [`Model::new`] builds the same and keeps what it needs to
/// follow pods joining and leaving without a rebuild.
pub fn build(
    policies: &[crate::Policy],
    namespaces: &[Namespace],
    pods: &[Pod],
) -> Result<Ruleset> {
    Model::new(policies, namespaces, pods).map(Model::into_ruleset)
}

/// A local pod's chain of one direction before and after a change (`None`: no policy
/// judged it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainChange {
    /// Which chain.
    pub direction: Direction,
    /// The pod's host veth.
    pub host_if: String,
    /// Its chain before (`None`: no policy judged the pod's traffic of `direction`).
    pub before: Option<Chain>,
    /// Its chain after.
    pub after: Option<Chain>,
}

/// What changed in a [`Model`] since the last [`Model::take_delta`]: sets that came or went
/// (after [`Model::update_policies`]), elements that came (`true`) or went (`false`) in the
/// sets that stayed, and local pods' chains. Pods joining and leaving never add or remove a
/// set: a change that would makes [`Model::add_pod`] or [`Model::remove_pod`] ask for a
/// rebuild.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delta {
    /// `(set, element, added)`, sorted by set and element; none of a set that came or went.
    pub elements: Vec<(String, Member, bool)>,
    /// Chains that differ, sorted by direction and host veth.
    pub chains: Vec<ChainChange>,
    /// Sets that came (with the elements the ruleset holds) or went, sorted by name.
    pub sets: Vec<SetChange>,
}

impl Delta {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.elements.is_empty() && self.chains.is_empty() && self.sets.is_empty()
    }
}

/// A set that came or went in a [`Delta`]. A model never gives a name to a second set, so
/// one name never both comes and goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetChange {
    /// Its name.
    pub name: String,
    /// Its family (for a set that went: what the rules naming it were rendered with).
    pub family: Family,
    /// Whether it came (else it went).
    pub came: bool,
}

/// What a [`Model`] changed since the last delta: each touched set's, element's and chain's
/// state before.
#[derive(Debug, Clone, Default)]
struct Journal {
    /// Off while sets are filled from every pod: a new set comes whole, and recording each
    /// element (a copy of its set's name) would double the memory a build peaks at.
    off: bool,
    /// Sets that came or went: whether each existed before, and its family.
    sets: BTreeMap<String, (bool, Family)>,
    elements: BTreeMap<(String, Member), bool>,
    chains: BTreeMap<(Direction, String), Option<Chain>>,
}

/// Which member sets a pod may be in, by its namespace: an index over some or all of a
/// model's member sets.
#[derive(Debug, Clone, Default)]
struct SetIndex {
    /// Indices into the model's `member_sets` of the sets of pods of one named namespace.
    scoped: BTreeMap<String, Vec<usize>>,
    /// Indices of the other member sets (namespace selectors, named ports).
    unscoped: Vec<usize>,
    /// Per listed namespace, the indices of [`unscoped`](Self::unscoped) its pods may be in:
    /// the sets whose namespace selector matches it, and the named-port sets. A pod's
    /// memberships then match its namespace against no selector (a hundred namespaces and
    /// hundreds of cluster policy peers made that most of a rebuild).
    ns_unscoped: BTreeMap<String, Vec<usize>>,
}

impl SetIndex {
    /// The index of the member sets `which` (indices into `member_sets`).
    fn new(
        member_sets: &[(String, SetKey)],
        which: impl IntoIterator<Item = usize>,
        ns_labels: &BTreeMap<String, Labels>,
    ) -> SetIndex {
        let mut index = SetIndex::default();
        for i in which {
            match &member_sets[i].1 {
                SetKey::Pods(
                    PodsKey {
                        namespaces: NsScope::Named(ns),
                        ..
                    },
                    _,
                ) => index.scoped.entry(ns.clone()).or_default().push(i),
                _ => index.unscoped.push(i),
            }
        }
        index.ns_unscoped = ns_labels
            .iter()
            .map(|(ns, labels)| {
                let sets = index
                    .unscoped
                    .iter()
                    .copied()
                    .filter(|i| match &member_sets[*i].1 {
                        SetKey::Pods(k, _) => match &k.namespaces {
                            NsScope::Selector(s) => s.matches(labels),
                            NsScope::Named(n) => n == ns,
                        },
                        _ => true,
                    })
                    .collect();
                (ns.clone(), sets)
            })
            .collect();
        index
    }

    fn is_empty(&self) -> bool {
        self.scoped.is_empty() && self.unscoped.is_empty()
    }
}

/// The rule model of a node, kept up to date change by change: [`add_pod`](Model::add_pod)
/// and [`remove_pod`](Model::remove_pod) change set members and local pods' chains in time
/// proportional to the pod (not the cluster); [`update_policies`](Model::update_policies)
/// takes new policies and namespace labels, keeping the sets that stay. Each leaves the
/// model equal to what [`Model::new`] would build from the new inputs, but for the sets'
/// names.
#[derive(Debug, Clone)]
pub struct Model {
    policies: Vec<CheckedPolicy>,
    /// What `policies` were checked from (the same order).
    policy_sources: Vec<crate::Policy>,
    /// In precedence order: Admin before Baseline, then priority, then name.
    cluster: Vec<CheckedClusterPolicy>,
    /// What `cluster` was checked from (the same order).
    cluster_sources: Vec<ClusterPolicy>,
    /// Effective labels of the listed namespaces.
    ns_labels: BTreeMap<String, Labels>,
    /// The namespaces whose pods' decisions are logged.
    ns_log: BTreeMap<String, LogMode>,
    names: BTreeMap<SetKey, String>,
    /// The next number of each kind and family of set: a model never names two sets alike,
    /// so a set that goes and one that comes are never confused in the kernel.
    numbers: BTreeMap<(&'static str, Family), usize>,
    /// Sets whose members are pods: `(name, key)`.
    member_sets: Vec<(String, SetKey)>,
    /// Which of them a pod may be in.
    index: SetIndex,
    /// Per set, how many pods besides the first hold an element (an anycast address may be
    /// several pods'). The set itself says whether one does: no second copy of every element.
    extra: BTreeMap<String, BTreeMap<Member, u32>>,
    /// Per set, how many local chains name it.
    set_users: BTreeMap<String, usize>,
    /// Local pods by host veth (a node's hundred or so: what explanations find by address).
    local: BTreeMap<String, Pod>,
    /// Every pod the model holds, by namespace, name and host veth: what a new set is filled
    /// from when policies change.
    pods: BTreeMap<PodKey, Pod>,
    ruleset: Ruleset,
    journal: Journal,
}

const DIRECTIONS: [Direction; 2] = [Direction::Ingress, Direction::Egress];

/// A policy of new inputs: the same as one the model holds (its index there), or changed
/// (checked anew).
enum Slot<C> {
    Same(usize),
    New(C),
}

/// Each of `new` against `old` (the sources the model holds), by `key`: unchanged ones
/// reuse their checked form, the others are checked; the first error fails it all.
fn recheck<S: PartialEq, C>(
    old: &[S],
    new: &[S],
    key: impl Fn(&S) -> (String, String),
    check: impl Fn(&S) -> Result<C>,
) -> Result<Vec<Slot<C>>> {
    let by_key: BTreeMap<(String, String), usize> =
        old.iter().enumerate().map(|(i, s)| (key(s), i)).collect();
    // two policies of one key (no API server allows it; the model does) reuse one at most
    let mut used = vec![false; old.len()];
    new.iter()
        .map(|s| match by_key.get(&key(s)) {
            Some(&i) if !used[i] && old[i] == *s => {
                used[i] = true;
                Ok(Slot::Same(i))
            }
            _ => check(s).map(Slot::New),
        })
        .collect()
}

/// Policies of one kind, the model's and what changed in them.
struct Rechecked<S, C> {
    /// The new sources and their checked forms, in the order given.
    policies: Vec<(S, C)>,
    /// The checked forms of the policies that came or changed (their new version) and of
    /// those that went or changed (their old one): what decides whose chain may change.
    changed: Vec<C>,
}

/// Assembles [`recheck`]'s slots: unchanged policies move from `old`, changed ones are
/// cloned from `new`.
fn assemble<S: Clone, C>(old: Vec<(S, C)>, new: &[S], slots: Vec<Slot<C>>) -> Rechecked<S, C>
where
    C: Clone,
{
    let mut old: Vec<Option<(S, C)>> = old.into_iter().map(Some).collect();
    let mut policies = Vec::with_capacity(new.len());
    let mut changed = Vec::new();
    for (s, slot) in new.iter().zip(slots) {
        match slot {
            Slot::Same(i) => policies.push(old[i].take().expect("each old policy once")),
            Slot::New(c) => {
                changed.push(c.clone());
                policies.push((s.clone(), c));
            }
        }
    }
    changed.extend(old.into_iter().flatten().map(|(_, c)| c));
    Rechecked { policies, changed }
}

impl Model {
    /// Builds the model (see [`build`]).
    pub fn new(
        policies: &[crate::Policy],
        namespaces: &[Namespace],
        pods: &[Pod],
    ) -> Result<Model> {
        Model::with_cluster_policies(&[], policies, namespaces, pods)
    }

    /// Builds the model of cluster policies (Admin and Baseline tiers) and NetworkPolicies;
    /// fails on the first invalid one, as [`build`] does.
    pub fn with_cluster_policies(
        cluster: &[ClusterPolicy],
        policies: &[crate::Policy],
        namespaces: &[Namespace],
        pods: &[Pod],
    ) -> Result<Model> {
        let mut local: BTreeMap<String, Pod> = BTreeMap::new();
        for pod in pods {
            pod.validate()?;
            if let Some(h) = &pod.host_if
                && let Some(first) = local.insert(h.clone(), pod.clone())
            {
                return Err(Error::DuplicateHostIf {
                    host_if: h.clone(),
                    first: first.id(),
                    second: pod.id(),
                });
            }
        }
        let mut held = BTreeMap::new();
        for pod in pods {
            if held.insert(pod_key(pod), pod.clone()).is_some() {
                return Err(Error::DuplicatePod { pod: pod.id() });
            }
        }
        let mut model = Model {
            policies: Vec::new(),
            policy_sources: Vec::new(),
            cluster: Vec::new(),
            cluster_sources: Vec::new(),
            ns_labels: BTreeMap::new(),
            ns_log: BTreeMap::new(),
            names: BTreeMap::new(),
            numbers: BTreeMap::new(),
            member_sets: Vec::new(),
            index: SetIndex::default(),
            extra: BTreeMap::new(),
            set_users: BTreeMap::new(),
            local,
            pods: held,
            ruleset: Ruleset::default(),
            journal: Journal::default(),
        };
        model.update_policies(cluster, policies, namespaces)?;
        model.journal = Journal::default();
        Ok(model)
    }

    /// Takes new policies and namespaces (their labels, their logging). Policies are told
    /// apart by namespace and name: one equal to what the model holds is not checked again,
    /// and only the local pods a policy that came, went or changed selects (every local pod,
    /// when a namespace changed) have their chains judged anew. A set no chain names any more
    /// goes, a new one comes filled from the pods the model holds, and a set that stays keeps
    /// its name and elements (those of namespace selectors are filled again when a
    /// namespace's labels changed, and differ by elements). [`take_delta`](Self::take_delta)
    /// then has the change. An invalid policy is an error, as for [`build`], and leaves the
    /// model as it was.
    pub fn update_policies(
        &mut self,
        cluster: &[ClusterPolicy],
        policies: &[crate::Policy],
        namespaces: &[Namespace],
    ) -> Result<()> {
        let policy_slots = recheck(
            &self.policy_sources,
            policies,
            |p| (p.namespace.clone(), p.name.clone()),
            crate::Policy::checked,
        )?;
        let cluster_slots = recheck(
            &self.cluster_sources,
            cluster,
            |c| (String::new(), c.name.clone()),
            ClusterPolicy::checked,
        )?;
        let old_policies = std::mem::take(&mut self.policy_sources)
            .into_iter()
            .zip(std::mem::take(&mut self.policies))
            .collect();
        let policies = assemble(old_policies, policies, policy_slots);
        let old_cluster = std::mem::take(&mut self.cluster_sources)
            .into_iter()
            .zip(std::mem::take(&mut self.cluster))
            .collect();
        let mut cluster = assemble(old_cluster, cluster, cluster_slots);
        cluster.policies.sort_by(|(_, a), (_, b)| {
            (a.tier, a.priority, &a.name).cmp(&(b.tier, b.priority, &b.name))
        });
        self.install(cluster, policies, namespaces);
        Ok(())
    }

    /// Installs policies and namespaces: the chains of the local pods they may change judged
    /// anew, sets named (old names kept, new ones numbered on), sets no chain names dropped,
    /// new ones filled, all journalled.
    fn install(
        &mut self,
        cluster: Rechecked<ClusterPolicy, CheckedClusterPolicy>,
        policies: Rechecked<crate::Policy, CheckedPolicy>,
        namespaces: &[Namespace],
    ) {
        let ns_labels: BTreeMap<String, Labels> = namespaces
            .iter()
            .map(|n| (n.name.clone(), n.effective_labels()))
            .collect();
        let ns_log: BTreeMap<String, LogMode> = namespaces
            .iter()
            .filter_map(|n| Some((n.name.clone(), n.log?)))
            .collect();
        // the namespaces whose effective labels change: (before, after)
        let relabelled: Vec<(Labels, Labels)> = self
            .ns_labels
            .keys()
            .chain(ns_labels.keys())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .filter_map(|ns| {
                let before = self.ns_labels(ns).into_owned();
                let after = match ns_labels.get(ns) {
                    Some(l) => l.clone(),
                    None => unlisted_labels(ns),
                };
                (before != after).then_some((before, after))
            })
            .collect();
        // whose chains may change: every local pod when a namespace changed, else the pods a
        // policy that came, went or changed selects (in either version)
        let ns_changed = self.ns_labels != ns_labels || self.ns_log != ns_log;
        self.ns_labels = ns_labels;
        self.ns_log = ns_log;
        let affected: Vec<String> = self
            .local
            .iter()
            .filter(|(_, pod)| {
                let ns_labels = self.ns_labels(&pod.namespace);
                ns_changed
                    || policies.changed.iter().any(|p| {
                        p.namespace == pod.namespace && p.pod_selector.matches(&pod.labels)
                    })
                    || cluster
                        .changed
                        .iter()
                        .any(|c| selects(&c.subject, &ns_labels, pod))
            })
            .map(|(h, _)| h.clone())
            .collect();
        (self.policy_sources, self.policies) = policies.policies.into_iter().unzip();
        (self.cluster_sources, self.cluster) = cluster.policies.into_iter().unzip();

        let mut keyed: Vec<(Direction, String, Option<KeyedChain>)> = Vec::new();
        for h in affected {
            for direction in DIRECTIONS {
                let chain = self.pod_chain(&self.local[&h], direction);
                keyed.push((direction, h.clone(), chain));
            }
        }
        // new sets: numbered on in the order of their keys, filled below
        let mut keys = BTreeSet::new();
        for (_, _, chain) in &keyed {
            for a in chain.iter().flat_map(KeyedChain::allows) {
                keys.extend(a.peer.as_ref().filter(|k| !self.names.contains_key(*k)));
                if let KeyedPorts::Named(k) = &a.ports
                    && !self.names.contains_key(k)
                {
                    keys.insert(k);
                }
            }
        }
        let mut fill: BTreeSet<String> = BTreeSet::new();
        for key in keys.into_iter().cloned().collect::<Vec<_>>() {
            let (kind, family) = kind(&key);
            let n = self.numbers.entry((kind, family)).or_default();
            let name = format!("{kind}{n}_{}", family_suffix(family));
            *n += 1;
            let set = empty_set(&key);
            self.note_set(&name, false, set.family);
            self.ruleset.sets.insert(name.clone(), set);
            fill.insert(name.clone());
            self.names.insert(key, name);
        }

        // chains
        for (direction, host_if, chain) in keyed {
            self.note_chain(direction, &host_if);
            let named = chain.map(|chain| {
                let namespace = &self.local[&host_if].namespace;
                self.name_chain(&chain, namespace)
                    .expect("every set of the model is named above")
            });
            let chains = self.ruleset.chains_mut(direction);
            match named {
                Some(chain) => chains.insert(host_if, chain),
                None => chains.remove(&host_if),
            };
        }
        self.set_users.clear();
        for chain in self
            .ruleset
            .ingress
            .values()
            .chain(self.ruleset.egress.values())
        {
            for set in referenced(chain) {
                *self.set_users.entry(set.to_owned()).or_default() += 1;
            }
        }

        // sets no chain names any more go; those of relabelled namespaces are filled again
        let mut refill: Vec<(String, AddrSet)> = Vec::new();
        let mut gone = Vec::new();
        for (key, name) in &self.names {
            if !self.set_users.contains_key(name) {
                gone.push(key.clone());
            } else if !fill.contains(name) && relabelled.iter().any(|(b, a)| depends_on(key, b, a))
            {
                let was = self.ruleset.sets.insert(name.clone(), empty_set(key));
                refill.extend(was.map(|was| (name.clone(), was)));
                self.extra.remove(name);
                fill.insert(name.clone());
            }
        }
        for key in gone {
            let name = self.names.remove(&key).expect("listed above");
            if let Some(set) = self.ruleset.sets.remove(&name) {
                self.note_set(&name, true, set.family);
            }
            self.extra.remove(&name);
        }
        let member_sets: Vec<(String, SetKey)> = self
            .names
            .iter()
            .filter(|(key, _)| !matches!(key, SetKey::Block(..)))
            .map(|(key, name)| (name.clone(), key.clone()))
            .collect();
        // the index matches every namespace against every selector: only when either changed
        if member_sets != self.member_sets || ns_changed {
            self.index = SetIndex::new(&member_sets, 0..member_sets.len(), &self.ns_labels);
        }
        self.member_sets = member_sets;

        // fill the new sets and those of relabelled namespaces from every pod
        let which = self
            .member_sets
            .iter()
            .enumerate()
            .filter(|(_, (name, _))| fill.contains(name))
            .map(|(i, _)| i);
        let index = SetIndex::new(&self.member_sets, which, &self.ns_labels);
        if !index.is_empty() {
            let off = std::mem::replace(&mut self.journal.off, true);
            let pods = std::mem::take(&mut self.pods);
            for pod in pods.values() {
                self.join(&index, pod);
            }
            self.pods = pods;
            self.journal.off = off;
        }
        for (name, was) in refill {
            let now = &self.ruleset.sets[&name];
            let members = |s: &AddrSet| -> BTreeSet<Member> {
                match &s.elements {
                    Elements::Addrs(a) => a.iter().map(|a| Member::Addr(*a)).collect(),
                    Elements::AddrPorts(a) => {
                        a.iter().map(|(a, p)| Member::AddrPort(*a, *p)).collect()
                    }
                    Elements::Ranges(_) => BTreeSet::new(),
                }
            };
            let (before, after) = (members(&was), members(now));
            for m in before.symmetric_difference(&after) {
                self.journal
                    .elements
                    .entry((name.clone(), *m))
                    .or_insert(before.contains(m));
            }
        }
    }

    /// The model as a ruleset.
    pub fn ruleset(&self) -> &Ruleset {
        &self.ruleset
    }

    /// The ruleset, without what the model keeps to follow changes.
    pub fn into_ruleset(self) -> Ruleset {
        self.ruleset
    }

    /// A pod joins (a local one with its `host_if`). `Ok(false)`: the model cannot follow
    /// without a set it lacks (a local pod selected by a policy that no other local pod is);
    /// build a new one — this one is unchanged. An invalid pod, or a second pod of the same
    /// host veth, is an error, as for [`build`].
    pub fn add_pod(&mut self, pod: &Pod) -> Result<bool> {
        pod.validate()?;
        if self.pods.contains_key(&pod_key(pod)) {
            return Err(Error::DuplicatePod { pod: pod.id() });
        }
        if let Some(h) = &pod.host_if {
            if let Some(first) = self.local.get(h) {
                return Err(Error::DuplicateHostIf {
                    host_if: h.clone(),
                    first: first.id(),
                    second: pod.id(),
                });
            }
            let mut chains = Vec::new();
            for direction in DIRECTIONS {
                if let Some(chain) = self.pod_chain(pod, direction) {
                    match self.name_chain(&chain, &pod.namespace) {
                        Some(named) => chains.push((direction, named)),
                        None => return Ok(false),
                    }
                }
            }
            self.local.insert(h.clone(), pod.clone());
            for (direction, chain) in chains {
                for set in referenced(&chain) {
                    *self.set_users.entry(set.to_owned()).or_default() += 1;
                }
                self.note_chain(direction, h);
                self.ruleset.chains_mut(direction).insert(h.clone(), chain);
            }
        }
        let index = std::mem::take(&mut self.index);
        self.join(&index, pod);
        self.index = index;
        self.pods.insert(pod_key(pod), pod.clone());
        Ok(true)
    }

    /// A pod leaves; `pod` must be the value it joined with. `false`: the model cannot
    /// follow (a set would go unused, or `pod` is not what joined); build a new one — this
    /// one is then in no defined state.
    pub fn remove_pod(&mut self, pod: &Pod) -> bool {
        let key = pod_key(pod);
        if self.pods.get(&key) != Some(pod) {
            return false;
        }
        self.pods.remove(&key);
        if let Some(h) = &pod.host_if {
            if self.local.get(h).map(Pod::id) != Some(pod.id()) {
                return false;
            }
            self.local.remove(h);
            for direction in DIRECTIONS {
                self.note_chain(direction, h);
                let Some(chain) = self.ruleset.chains_mut(direction).remove(h) else {
                    continue;
                };
                for set in referenced(&chain) {
                    match self.set_users.get_mut(set) {
                        Some(n) if *n > 1 => *n -= 1,
                        _ => return false,
                    }
                }
            }
        }
        self.leave(pod)
    }

    /// What changed since the last call (or since the model was built).
    pub fn take_delta(&mut self) -> Delta {
        let journal = std::mem::take(&mut self.journal);
        let sets: Vec<SetChange> = journal
            .sets
            .into_iter()
            .filter_map(|(name, (before, family))| {
                let now = self.ruleset.sets.contains_key(&name);
                (now != before).then_some(SetChange {
                    name,
                    family,
                    came: now,
                })
            })
            .collect();
        let whole: BTreeSet<&str> = sets.iter().map(|s| s.name.as_str()).collect();
        let elements = journal
            .elements
            .into_iter()
            .filter(|((set, _), _)| !whole.contains(set.as_str()))
            .filter_map(|((set, member), before)| {
                let now = self.ruleset.sets.get(&set).is_some_and(|s| s.has(member));
                (now != before).then_some((set, member, now))
            })
            .collect();
        let chains = journal
            .chains
            .into_iter()
            .filter_map(|((direction, host_if), before)| {
                let after = self.ruleset.chains(direction).get(&host_if).cloned();
                (after != before).then_some(ChainChange {
                    direction,
                    host_if,
                    before,
                    after,
                })
            })
            .collect();
        Delta {
            elements,
            chains,
            sets,
        }
    }

    fn note_chain(&mut self, direction: Direction, host_if: &str) {
        if !self
            .journal
            .chains
            .contains_key(&(direction, host_if.to_owned()))
        {
            let before = self.ruleset.chains(direction).get(host_if).cloned();
            self.journal
                .chains
                .insert((direction, host_if.to_owned()), before);
        }
    }

    /// The effective labels of namespace `ns` (only its name label when it is not listed).
    fn ns_labels(&self, ns: &str) -> std::borrow::Cow<'_, Labels> {
        match self.ns_labels.get(ns) {
            Some(l) => std::borrow::Cow::Borrowed(l),
            None => std::borrow::Cow::Owned(unlisted_labels(ns)),
        }
    }

    /// Notes that set `name` (of `family`) existed (`true`) or not before the change.
    fn note_set(&mut self, name: &str, existed: bool, family: Family) {
        self.journal
            .sets
            .entry(name.to_owned())
            .or_insert((existed, family));
    }

    /// What judges local `pod`'s traffic of `direction`, before its sets are named.
    fn pod_chain(&self, pod: &Pod, direction: Direction) -> Option<KeyedChain> {
        let ns_labels = self.ns_labels(&pod.namespace);
        pod_chain(&self.policies, &self.cluster, &ns_labels, pod, direction)
    }

    /// [`pod_chain`](Self::pod_chain) with each entry's rule (indexes into
    /// [`policies`](Self::policies) and [`cluster_policies`](Self::cluster_policies)).
    pub(crate) fn pod_rules(&self, pod: &Pod, direction: Direction) -> Option<SourcedChain> {
        let ns_labels = self.ns_labels(&pod.namespace);
        pod_rules(&self.policies, &self.cluster, &ns_labels, pod, direction)
    }

    /// The local pods by host veth.
    pub(crate) fn local_pods(&self) -> &BTreeMap<String, Pod> {
        &self.local
    }

    /// The NetworkPolicies, in the order given.
    pub(crate) fn policies(&self) -> &[CheckedPolicy] {
        &self.policies
    }

    /// The cluster policies in precedence order.
    pub(crate) fn cluster_policies(&self) -> &[CheckedClusterPolicy] {
        &self.cluster
    }

    /// A local pod's chain with its sets named, logging as its `namespace` asks; `None` when
    /// a set is not in the model.
    pub(crate) fn name_chain(&self, chain: &KeyedChain, namespace: &str) -> Option<Chain> {
        let tier = |rules: &[(crate::Action, KeyedAllow)]| -> Option<Vec<TierRule>> {
            rules
                .iter()
                .map(|(action, a)| {
                    Some(TierRule {
                        action: *action,
                        matches: self.name_allow(a)?,
                    })
                })
                .collect()
        };
        let policy = match &chain.policy {
            Some(allows) => {
                let named: BTreeSet<Allow> = allows
                    .iter()
                    .map(|a| self.name_allow(a))
                    .collect::<Option<_>>()?;
                Some(named.into_iter().collect())
            }
            None => None,
        };
        Some(Chain {
            admin: tier(&chain.admin)?,
            policy,
            baseline: tier(&chain.baseline)?,
            log: self.ns_log.get(namespace).copied(),
        })
    }

    /// An allow with its sets named; `None` when a set is not in the model.
    pub(crate) fn name_allow(&self, a: &KeyedAllow) -> Option<Allow> {
        let name = |k: &SetKey| self.names.get(k).cloned();
        Some(Allow {
            family: a.family,
            peer: match &a.peer {
                Some(k) => Some(name(k)?),
                None => None,
            },
            ports: match &a.ports {
                KeyedPorts::Any => Ports::Any,
                KeyedPorts::Listed(protocol, ranges) => Ports::Listed {
                    protocol: *protocol,
                    ranges: ranges.clone(),
                },
                KeyedPorts::Named(k) => Ports::Named {
                    protocol: match k {
                        SetKey::NamedPort(_, p, _) => *p,
                        _ => Protocol::Tcp,
                    },
                    set: name(k)?,
                },
            },
        })
    }

    /// The member sets of `index` that `pod` is in, and the elements it gives each.
    fn memberships(&self, index: &SetIndex, pod: &Pod) -> Vec<(usize, Vec<Member>)> {
        // a listed namespace's sets are known; an unlisted one's are matched here
        let (unscoped, ns_labels) = match index.ns_unscoped.get(&pod.namespace) {
            Some(sets) => (sets, None),
            None => (&index.unscoped, Some(self.ns_labels(&pod.namespace))),
        };
        let mut addresses = pod.addresses.clone();
        addresses.sort();
        addresses.dedup();
        let of = |f: Family| addresses.iter().filter(move |a| Family::of(a) == f);
        let mut out = Vec::new();
        let scoped = index.scoped.get(&pod.namespace).into_iter().flatten();
        for i in scoped.chain(unscoped) {
            let (_, key) = &self.member_sets[*i];
            let members: Vec<Member> = match key {
                SetKey::Pods(k, f) => {
                    let in_scope = match (&k.namespaces, &ns_labels) {
                        (NsScope::Named(n), _) => *n == pod.namespace,
                        (NsScope::Selector(s), Some(labels)) => s.matches(labels),
                        (NsScope::Selector(_), None) => true, // ns_unscoped matched it
                    };
                    if !in_scope || !k.pods.as_ref().is_none_or(|s| s.matches(&pod.labels)) {
                        continue;
                    }
                    of(*f).map(|a| Member::Addr(*a)).collect()
                }
                SetKey::NamedPort(port, protocol, f) => match pod.named_port(port, *protocol) {
                    Some(n) => of(*f).map(|a| Member::AddrPort(*a, n)).collect(),
                    None => continue,
                },
                SetKey::Block(..) => continue,
            };
            if !members.is_empty() {
                out.push((*i, members));
            }
        }
        out
    }

    /// Adds `pod`'s elements to the sets of `index` it is in.
    fn join(&mut self, index: &SetIndex, pod: &Pod) {
        for (i, members) in self.memberships(index, pod) {
            let set = &self.member_sets[i].0;
            let Some(s) = self.ruleset.sets.get_mut(set) else {
                continue;
            };
            for m in members {
                if !s.insert(m) {
                    *self
                        .extra
                        .entry(set.clone())
                        .or_default()
                        .entry(m)
                        .or_default() += 1;
                } else if !self.journal.off {
                    self.journal
                        .elements
                        .entry((set.clone(), m))
                        .or_insert(false);
                }
            }
        }
    }

    /// Takes `pod`'s elements out of the sets it is in; `false` when one is not there.
    fn leave(&mut self, pod: &Pod) -> bool {
        for (i, members) in self.memberships(&self.index, pod) {
            let set = &self.member_sets[i].0;
            let Some(s) = self.ruleset.sets.get_mut(set) else {
                return false;
            };
            for m in members {
                if let Some(extra) = self.extra.get_mut(set)
                    && let Some(n) = extra.get_mut(&m)
                {
                    *n -= 1;
                    if *n == 0 {
                        extra.remove(&m);
                        if extra.is_empty() {
                            self.extra.remove(set);
                        }
                    }
                } else if s.has(m) {
                    s.remove(m);
                    self.journal
                        .elements
                        .entry((set.clone(), m))
                        .or_insert(true);
                } else {
                    return false;
                }
            }
        }
        true
    }
}

/// The effective labels of a namespace the model is not told of: its name label only.
fn unlisted_labels(ns: &str) -> Labels {
    Namespace {
        name: ns.to_owned(),
        labels: Labels::new(),
        log: None,
    }
    .effective_labels()
}

/// Whether the members of `key`'s set change when a namespace's labels go from `before` to
/// `after`: a namespace selector that matches one and not the other.
fn depends_on(key: &SetKey, before: &Labels, after: &Labels) -> bool {
    match key {
        SetKey::Pods(
            PodsKey {
                namespaces: NsScope::Selector(s),
                ..
            },
            _,
        ) => s.matches(before) != s.matches(after),
        _ => false,
    }
}

/// The kind of a set's name (`pods`, `block`, `port`) and its family.
fn kind(key: &SetKey) -> (&'static str, Family) {
    match key {
        SetKey::Pods(_, f) => ("pods", *f),
        SetKey::Block(f, _) => ("block", *f),
        SetKey::NamedPort(_, _, f) => ("port", *f),
    }
}

/// A pod's place in a model: namespace, name and host veth (a local pod's veth is its own;
/// a pod of another node has none).
type PodKey = (String, String, Option<String>);

fn pod_key(pod: &Pod) -> PodKey {
    (pod.namespace.clone(), pod.name.clone(), pod.host_if.clone())
}
