//! The incremental [`Model`]: the cluster's policies, namespaces and pods held between
//! changes, each change answered with the [`Delta`] of chains and set elements it makes.

use std::collections::{BTreeMap, BTreeSet};

use crate::addr::Family;
use crate::allows::{
    KeyedAllow, KeyedChain, KeyedPorts, NsScope, PodsKey, SetKey, SourcedChain, empty_set,
    pod_chain, pod_rules, referenced,
};
use crate::cluster::{CheckedClusterPolicy, ClusterPolicy};
use crate::error::{Error, Result};
use crate::input::{CheckedPolicy, Namespace, Pod, Protocol};
use crate::model::{
    Allow, Chain, Direction, LogMode, Member, Ports, Ruleset, TierRule, family_suffix,
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

/// What changed in a [`Model`] since the last [`Model::take_delta`]: set elements that came
/// (`true`) or went (`false`), and local pods' chains. Sets themselves never change in a
/// delta: a change that would add or remove a set makes [`Model::add_pod`] or
/// [`Model::remove_pod`] ask for a rebuild.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delta {
    /// `(set, element, added)`, sorted by set and element.
    pub elements: Vec<(String, Member, bool)>,
    /// Chains that differ, sorted by direction and host veth.
    pub chains: Vec<ChainChange>,
}

impl Delta {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.elements.is_empty() && self.chains.is_empty()
    }
}

/// What a [`Model`] changed since the last delta: each touched element's and chain's state
/// before.
#[derive(Debug, Clone, Default)]
struct Journal {
    /// Off while [`Model::new`] joins every pod: a fresh model has no delta, and recording
    /// each element (a copy of its set's name) would double the memory a build peaks at.
    off: bool,
    elements: BTreeMap<(String, Member), bool>,
    chains: BTreeMap<(Direction, String), Option<Chain>>,
}

/// The rule model of a node, kept up to date pod by pod: [`add_pod`](Model::add_pod) and
/// [`remove_pod`](Model::remove_pod) change set members and local pods' chains in time
/// proportional to the pod (not the cluster), and leave the model equal to what
/// [`Model::new`] would build from the new inputs. A change of policies or namespace labels
/// needs a new model.
#[derive(Debug, Clone)]
pub struct Model {
    policies: Vec<CheckedPolicy>,
    /// In precedence order: Admin before Baseline, then priority, then name.
    cluster: Vec<CheckedClusterPolicy>,
    /// Effective labels of the listed namespaces.
    ns_labels: BTreeMap<String, Labels>,
    /// The namespaces whose pods' decisions are logged.
    ns_log: BTreeMap<String, LogMode>,
    names: BTreeMap<SetKey, String>,
    /// Sets whose members are pods: `(name, key)`.
    member_sets: Vec<(String, SetKey)>,
    /// Indices into `member_sets` of the sets of pods of one named namespace.
    scoped: BTreeMap<String, Vec<usize>>,
    /// Indices of the other member sets (namespace selectors, named ports).
    unscoped: Vec<usize>,
    /// Per listed namespace, the indices of [`unscoped`](Self::unscoped) its pods may be in:
    /// the sets whose namespace selector matches it, and the named-port sets. A pod's
    /// memberships then match its namespace against no selector (a hundred namespaces and
    /// hundreds of cluster policy peers made that most of a rebuild).
    ns_unscoped: BTreeMap<String, Vec<usize>>,
    /// Per set, how many pods besides the first hold an element (an anycast address may be
    /// several pods'). The set itself says whether one does: no second copy of every element.
    extra: BTreeMap<String, BTreeMap<Member, u32>>,
    /// Per set, how many local chains name it.
    set_users: BTreeMap<String, usize>,
    /// Local pods by host veth (a node's hundred or so: what explanations find by address).
    local: BTreeMap<String, Pod>,
    ruleset: Ruleset,
    journal: Journal,
}

const DIRECTIONS: [Direction; 2] = [Direction::Ingress, Direction::Egress];

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
        let policies = policies
            .iter()
            .map(crate::Policy::checked)
            .collect::<Result<Vec<_>>>()?;
        let mut cluster = cluster
            .iter()
            .map(ClusterPolicy::checked)
            .collect::<Result<Vec<_>>>()?;
        cluster.sort_by(|a, b| (a.tier, a.priority, &a.name).cmp(&(b.tier, b.priority, &b.name)));
        let mut model = Model {
            policies,
            cluster,
            ns_labels: namespaces
                .iter()
                .map(|n| (n.name.clone(), n.effective_labels()))
                .collect(),
            ns_log: namespaces
                .iter()
                .filter_map(|n| Some((n.name.clone(), n.log?)))
                .collect(),
            names: BTreeMap::new(),
            member_sets: Vec::new(),
            scoped: BTreeMap::new(),
            unscoped: Vec::new(),
            ns_unscoped: BTreeMap::new(),
            extra: BTreeMap::new(),
            set_users: BTreeMap::new(),
            local,
            ruleset: Ruleset::default(),
            journal: Journal::default(),
        };

        let mut keyed: Vec<(Direction, &str, &str, KeyedChain)> = Vec::new();
        for pod in pods {
            let Some(h) = &pod.host_if else { continue };
            for direction in DIRECTIONS {
                if let Some(chain) = model.pod_chain(pod, direction) {
                    keyed.push((direction, h, &pod.namespace, chain));
                }
            }
        }
        // name the sets in the order of their keys
        let mut keys = BTreeSet::new();
        for (_, _, _, chain) in &keyed {
            for a in chain.allows() {
                keys.extend(a.peer.clone());
                if let KeyedPorts::Named(k) = &a.ports {
                    keys.insert(k.clone());
                }
            }
        }
        let mut counters: BTreeMap<(&str, Family), usize> = BTreeMap::new();
        for key in keys {
            let (kind, family) = match &key {
                SetKey::Pods(_, f) => ("pods", *f),
                SetKey::Block(f, _) => ("block", *f),
                SetKey::NamedPort(_, _, f) => ("port", *f),
            };
            let n = counters.entry((kind, family)).or_default();
            let name = format!("{kind}{n}_{}", family_suffix(family));
            *n += 1;
            model.ruleset.sets.insert(name.clone(), empty_set(&key));
            match &key {
                SetKey::Pods(
                    PodsKey {
                        namespaces: NsScope::Named(ns),
                        ..
                    },
                    _,
                ) => model
                    .scoped
                    .entry(ns.clone())
                    .or_default()
                    .push(model.member_sets.len()),
                SetKey::Block(..) => {}
                _ => model.unscoped.push(model.member_sets.len()),
            }
            if !matches!(key, SetKey::Block(..)) {
                model.member_sets.push((name.clone(), key.clone()));
            }
            model.names.insert(key, name);
        }
        model.ns_unscoped = model
            .ns_labels
            .iter()
            .map(|(ns, labels)| {
                let sets = model
                    .unscoped
                    .iter()
                    .copied()
                    .filter(|i| match &model.member_sets[*i].1 {
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
        for (direction, host_if, namespace, chain) in keyed {
            let chain = model
                .name_chain(&chain, namespace)
                .expect("every set of the model is named above");
            for set in referenced(&chain) {
                *model.set_users.entry(set.to_owned()).or_default() += 1;
            }
            model
                .ruleset
                .chains_mut(direction)
                .insert(host_if.to_owned(), chain);
        }
        model.journal.off = true;
        for pod in pods {
            model.join(pod);
        }
        model.journal = Journal::default();
        Ok(model)
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
        self.join(pod);
        Ok(true)
    }

    /// A pod leaves; `pod` must be the value it joined with. `false`: the model cannot
    /// follow (a set would go unused, or `pod` is not what joined); build a new one — this
    /// one is then in no defined state.
    pub fn remove_pod(&mut self, pod: &Pod) -> bool {
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
        let elements = journal
            .elements
            .into_iter()
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
        Delta { elements, chains }
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
            None => std::borrow::Cow::Owned(
                Namespace {
                    name: ns.to_owned(),
                    labels: Labels::new(),
                    log: None,
                }
                .effective_labels(),
            ),
        }
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

    /// The member sets `pod` is in, and the elements it gives each.
    fn memberships(&self, pod: &Pod) -> Vec<(usize, Vec<Member>)> {
        // a listed namespace's sets are known; an unlisted one's are matched here
        let (unscoped, ns_labels) = match self.ns_unscoped.get(&pod.namespace) {
            Some(sets) => (sets, None),
            None => (&self.unscoped, Some(self.ns_labels(&pod.namespace))),
        };
        let mut addresses = pod.addresses.clone();
        addresses.sort();
        addresses.dedup();
        let of = |f: Family| addresses.iter().filter(move |a| Family::of(a) == f);
        let mut out = Vec::new();
        let scoped = self.scoped.get(&pod.namespace).into_iter().flatten();
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

    /// Adds `pod`'s elements to the sets it is in.
    fn join(&mut self, pod: &Pod) {
        for (i, members) in self.memberships(pod) {
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
        for (i, members) in self.memberships(pod) {
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
