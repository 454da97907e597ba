//! Where a pod's identity and annotations come from: the CNI arguments (standalone) or the
//! Kubernetes pod watcher.

use std::collections::BTreeMap;
use std::time::Duration;

use flock_cni_proto::CniError;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;

use crate::store::PodRef;

/// What the agent needs to know about a pod to allocate for it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct PodInfo {
    /// Namespace, name, UID.
    pub pod: PodRef,
    /// The pod's annotations.
    pub annotations: BTreeMap<String, String>,
    /// The workload name (DESIGN §4): the Deployment, StatefulSet, … or the pod itself.
    pub workload: String,
    /// The first container's image reference.
    pub image: Option<String>,
    /// The pod's labels (NetworkPolicy selectors; empty in standalone mode).
    pub labels: BTreeMap<String, String>,
    /// Its named container ports (NetworkPolicy named ports; empty in standalone mode).
    pub ports: Vec<flock_policy::NamedPort>,
}

impl PodInfo {
    /// A pod known only from `CNI_ARGS` (standalone mode): no controller, so the workload is
    /// the pod itself; annotations from the network config.
    pub fn standalone(
        namespace: String,
        name: String,
        uid: String,
        annotations: BTreeMap<String, String>,
    ) -> PodInfo {
        PodInfo {
            workload: name.clone(),
            pod: PodRef {
                namespace,
                name,
                uid,
            },
            annotations,
            image: None,
            labels: BTreeMap::new(),
            ports: Vec::new(),
        }
    }

    /// Reads a Kubernetes pod: its controller owner and `pod-template-hash` label give the
    /// workload name through `flock-embed`'s rule.
    pub fn from_pod(pod: &Pod) -> PodInfo {
        let meta = &pod.metadata;
        let name = meta.name.clone().unwrap_or_default();
        let owner = meta
            .owner_references
            .as_deref()
            .unwrap_or_default()
            .iter()
            .find(|o| o.controller == Some(true));
        let hash = meta
            .labels
            .as_ref()
            .and_then(|l| l.get("pod-template-hash"))
            .map(String::as_str);
        let workload = flock_embed::workload_name(
            owner.map(|o| (o.kind.as_str(), o.name.as_str())),
            hash,
            &name,
        );
        let image = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.first())
            .and_then(|c| c.image.clone());
        PodInfo {
            pod: PodRef {
                namespace: meta.namespace.clone().unwrap_or_default(),
                name,
                uid: meta.uid.clone().unwrap_or_default(),
            },
            annotations: meta.annotations.clone().unwrap_or_default(),
            workload,
            image,
            labels: meta.labels.clone().unwrap_or_default(),
            ports: pod
                .spec
                .as_ref()
                .map(crate::policy::convert::named_ports)
                .unwrap_or_default(),
        }
    }
}

/// Looks pods up (the Kubernetes pod watcher implements it).
pub trait PodDirectory: Send + Sync {
    /// The pod `namespace/name`, waiting up to `wait` for the watcher to see it; a pod that
    /// does not appear is a retryable error (CNI code 11) that says so.
    fn lookup<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        wait: Duration,
    ) -> BoxFuture<'a, Result<PodInfo, CniError>>;

    /// Whether the pod `namespace/name` exists on this node now (`None` while the watcher
    /// has not synced yet).
    fn exists(&self, namespace: &str, name: &str) -> Option<bool>;
}
