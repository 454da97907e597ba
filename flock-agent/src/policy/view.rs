//! What the agent knows of the cluster for policy (the three cluster-wide caches and the
//! node's own pods) and the model inputs it derives from it. Pure: watch events come in as
//! plain values, `flock-policy` inputs go out.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use flock_policy::{ClusterPolicy, Labels, NamedPort, Namespace, Pod, Policy};

use super::convert::{ClusterPod, NamespaceInfo};
use crate::cache::{ObjectKey, Relist};

/// A pod of this node as the agent's allocation record and its ADD know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalPod {
    /// Namespace and name.
    pub key: ObjectKey,
    /// `metadata.uid` when known.
    pub uid: String,
    /// Every address the record gives it (its /128, /32, `addresses`, anycast).
    pub addresses: Vec<IpAddr>,
    /// Labels as ADD saw them; the cluster cache's, when it holds the pod, win (fresher).
    pub labels: Labels,
    /// Named ports as ADD saw them (same rule).
    pub ports: Vec<NamedPort>,
}

/// Everything the model is built from.
#[derive(Debug, Clone, Default)]
pub struct ClusterView {
    /// NetworkPolicies, converted and validated.
    pub policies: Relist<Policy>,
    /// ClusterNetworkPolicies, converted and validated (synced empty while the API lacks
    /// the resource).
    pub cluster_policies: Relist<ClusterPolicy>,
    /// Namespaces' labels.
    pub namespaces: Relist<NamespaceInfo>,
    /// Pods of the cluster.
    pub pods: Relist<ClusterPod>,
    /// NetworkPolicies left out, with why (the message names the field and value).
    pub invalid: BTreeMap<ObjectKey, String>,
    /// ClusterNetworkPolicies left out, or enforced other than written (an unsupported
    /// field, enforced fail-closed), with why.
    pub cluster_invalid: BTreeMap<ObjectKey, String>,
    /// This node's pods by host veth.
    pub local: BTreeMap<String, LocalPod>,
    /// The distinct label sets of the cached pods: the pods of one ReplicaSet share one.
    labels: LabelInterner,
}

/// Distinct label sets, each kept once; pruned of the sets no pod holds any more when it
/// has doubled since the last pruning (amortised O(log n) a pod).
#[derive(Debug, Clone, Default)]
struct LabelInterner {
    sets: BTreeSet<Arc<Labels>>,
    prune_at: usize,
}

impl LabelInterner {
    fn intern(&mut self, labels: Arc<Labels>) -> Arc<Labels> {
        if let Some(known) = self.sets.get(&labels) {
            return known.clone();
        }
        if self.sets.len() >= self.prune_at {
            self.sets.retain(|l| Arc::strong_count(l) > 1);
            self.prune_at = (2 * self.sets.len()).max(64);
        }
        self.sets.insert(labels.clone());
        labels
    }
}

/// The policies and namespaces of [`ModelInputs`]: what a model that holds its pods takes
/// when they change ([`flock_policy::Model::update_policies`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RuleInputs {
    /// ClusterNetworkPolicies.
    pub cluster_policies: Vec<ClusterPolicy>,
    /// Policies.
    pub policies: Vec<Policy>,
    /// Namespaces.
    pub namespaces: Vec<Namespace>,
}

/// `flock-policy`'s inputs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelInputs {
    /// ClusterNetworkPolicies.
    pub cluster_policies: Vec<ClusterPolicy>,
    /// Policies.
    pub policies: Vec<Policy>,
    /// Namespaces.
    pub namespaces: Vec<Namespace>,
    /// Pods, the local ones with their host veth.
    pub pods: Vec<Pod>,
}

impl ClusterView {
    /// The messages of the policies of both kinds not enforced as written, NetworkPolicies
    /// first, each kind in key order.
    pub fn not_as_written(&self) -> Vec<String> {
        let namespaces = self
            .namespaces
            .items()
            .values()
            .filter_map(|n| n.log.as_ref().err());
        self.invalid
            .values()
            .chain(self.cluster_invalid.values())
            .chain(namespaces)
            .cloned()
            .collect()
    }

    /// The pod with `addr`, `namespace/name`: a pod of this node first, then the cache's.
    pub fn pod_at(&self, addr: IpAddr) -> Option<String> {
        let local = self.local.values().find(|l| l.addresses.contains(&addr));
        let key = match local {
            Some(l) => &l.key,
            None => {
                self.pods
                    .items()
                    .iter()
                    .find(|(_, p)| p.addresses.contains(&addr))?
                    .0
            }
        };
        Some(format!("{}/{}", key.0, key.1))
    }

    /// `pod` with its labels replaced by the equal set already cached, if there is one: 10 000
    /// pods of a few hundred Deployments hold a few hundred label maps (issue 15).
    pub fn intern_labels(&mut self, pod: Option<ClusterPod>) -> Option<ClusterPod> {
        pod.map(|mut p| {
            p.labels = self.labels.intern(p.labels);
            p
        })
    }

    /// Whether every cache has finished its first listing: before that, the model is not
    /// known and nothing may be applied (an empty model would remove every rule).
    pub fn is_synced(&self) -> bool {
        self.policies.is_synced()
            && self.cluster_policies.is_synced()
            && self.namespaces.is_synced()
            && self.pods.is_synced()
    }

    /// The model's inputs. A local pod's addresses are its record's; its labels and ports
    /// the cluster cache's when that holds the same pod (same UID, or either unknown), else
    /// ADD's. A cache pod that no local record claims is a peer only.
    pub fn inputs(&self) -> ModelInputs {
        let claimed: BTreeSet<&ObjectKey> = self.local.values().map(|l| &l.key).collect();
        let mut pods: Vec<Pod> = Vec::with_capacity(self.pods.len() + self.local.len());
        for (key, p) in self.pods.items() {
            if !claimed.contains(key) {
                pods.push(cluster_pod(key, p));
            }
        }
        for (host_if, local) in &self.local {
            pods.push(self.local_pod(host_if, local));
        }
        let RuleInputs {
            cluster_policies,
            policies,
            namespaces,
        } = self.rules();
        ModelInputs {
            cluster_policies,
            policies,
            namespaces,
            pods,
        }
    }

    /// The model's policies and namespaces (the inputs but the pods).
    pub fn rules(&self) -> RuleInputs {
        RuleInputs {
            cluster_policies: self.cluster_policies.items().values().cloned().collect(),
            policies: self.policies.items().values().cloned().collect(),
            namespaces: self
                .namespaces
                .items()
                .iter()
                .map(|((_, name), ns)| Namespace {
                    name: name.clone(),
                    labels: ns.labels.clone(),
                    log: ns.log.clone().ok().flatten(),
                })
                .collect(),
        }
    }

    /// The pods of [`inputs`](Self::inputs) that `key` stands for: its local pods (one per
    /// host veth), else the cache's pod, else none. A change of the view that touches only
    /// `key` changes the model's pods from this before it to this after it.
    pub fn model_pods(&self, key: &ObjectKey) -> Vec<Pod> {
        let local: Vec<Pod> = self
            .local
            .iter()
            .filter(|(_, l)| &l.key == key)
            .map(|(h, l)| self.local_pod(h, l))
            .collect();
        if !local.is_empty() {
            return local;
        }
        self.pods
            .get(key)
            .map(|p| vec![cluster_pod(key, p)])
            .unwrap_or_default()
    }

    fn local_pod(&self, host_if: &str, local: &LocalPod) -> Pod {
        let cached = self
            .pods
            .get(&local.key)
            .filter(|c| c.uid.is_empty() || local.uid.is_empty() || c.uid == local.uid);
        let (labels, ports) = match cached {
            Some(c) => (c.labels.clone(), c.ports.clone()),
            None => (Arc::new(local.labels.clone()), local.ports.clone()),
        };
        Pod {
            namespace: local.key.0.clone(),
            name: local.key.1.clone(),
            labels,
            addresses: local.addresses.clone(),
            host_if: Some(host_if.to_owned()),
            ports,
        }
    }
}

fn cluster_pod((namespace, name): &ObjectKey, p: &ClusterPod) -> Pod {
    Pod {
        namespace: namespace.clone(),
        name: name.clone(),
        labels: p.labels.clone(),
        addresses: p.addresses.clone(),
        host_if: None,
        ports: p.ports.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ns: &str, name: &str) -> ObjectKey {
        (ns.into(), name.into())
    }

    fn local(ns: &str, name: &str, uid: &str, labels: &[(&str, &str)]) -> LocalPod {
        LocalPod {
            key: key(ns, name),
            uid: uid.into(),
            addresses: vec!["2001:db8:1::5".parse().unwrap()],
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            ports: vec![],
        }
    }

    #[test]
    fn local_pods_take_record_addresses_and_the_freshest_labels() {
        let mut v = ClusterView::default();
        v.local.insert(
            "flock00000001".into(),
            local("shop", "web", "u1", &[("app", "old")]),
        );
        v.local.insert(
            "flock00000002".into(),
            local("shop", "new", "u2", &[("app", "add-time")]),
        );
        v.pods.set(
            key("shop", "web"),
            Some(ClusterPod {
                uid: "u1".into(),
                node: "node-a".into(),
                labels: Arc::new([("app".into(), "relabelled".into())].into()),
                addresses: vec!["2001:db8:1::99".parse().unwrap()],
                ports: vec![],
            }),
        );
        // a pod of the same name but another UID (the old one, not yet gone from the cache)
        v.pods.set(
            key("shop", "new"),
            Some(ClusterPod {
                uid: "older".into(),
                labels: Arc::new([("app".into(), "stale".into())].into()),
                ..ClusterPod::default()
            }),
        );
        v.pods.set(
            key("ops", "probe"),
            Some(ClusterPod {
                addresses: vec!["2001:db8:2::7".parse().unwrap()],
                ..ClusterPod::default()
            }),
        );
        let inputs = v.inputs();
        let by_name = |n: &str| {
            inputs
                .pods
                .iter()
                .find(|p| p.name == n)
                .cloned()
                .expect("pod")
        };
        assert_eq!(inputs.pods.len(), 3, "{:?}", inputs.pods);
        let web = by_name("web");
        assert_eq!(web.host_if.as_deref(), Some("flock00000001"));
        assert_eq!(web.labels["app"], "relabelled");
        assert_eq!(
            web.addresses,
            ["2001:db8:1::5".parse::<IpAddr>().unwrap()],
            "the record's addresses"
        );
        assert_eq!(by_name("new").labels["app"], "add-time");
        assert_eq!(by_name("probe").host_if, None);
    }

    #[test]
    fn the_view_is_synced_only_when_every_cache_is() {
        let mut v = ClusterView::default();
        v.policies.init_done();
        v.namespaces.init_done();
        assert!(!v.is_synced());
        v.pods.init_done();
        assert!(!v.is_synced());
        v.cluster_policies.init_done();
        assert!(v.is_synced());
    }
}
