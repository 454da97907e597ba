//! The pod watcher: a reflector of the Pods scheduled on this node (server-side field
//! selector `spec.nodeName=<node>`), serving [`PodDirectory`] lookups to ADD.
//!
//! ADD can run before the watcher has seen its pod (the kubelet creates the sandbox as soon
//! as the pod is bound; the watch event may come a little later). A lookup therefore waits,
//! woken by every reflector event rather than polling, up to a bound, and then fails with a
//! retryable CNI error 11 that names the pod.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use flock_cni_proto::{CniError, ErrorCode};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use tracing::{debug, warn};

use futures::future::BoxFuture;

use crate::pods::{PodDirectory, PodInfo};
use crate::store::PodRef;

/// The server-side field selector of the pods of `node`.
pub fn node_field_selector(node: &str) -> String {
    format!("spec.nodeName={node}")
}

/// Whether a record's pod is still on this node, as the reflector sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presence {
    /// The watcher has not finished its first listing: nothing can be concluded.
    Unknown,
    /// The pod (with the same UID, when both are known) is on this node.
    Present,
    /// The pod is not on this node, or a pod of the same name with another UID replaced it.
    Absent,
}

/// The reflector of this node's pods.
pub struct PodWatcher {
    node: String,
    store: Store<Pod>,
    synced: AtomicBool,
    changes: watch::Sender<u64>,
}

impl std::fmt::Debug for PodWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodWatcher")
            .field("node", &self.node)
            .field("pods", &self.store.len())
            .field("synced", &self.is_synced())
            .finish()
    }
}

impl PodWatcher {
    /// Starts the reflector of the pods of `node` on the current tokio runtime. Watch errors
    /// are logged and retried with kube's default backoff.
    pub fn spawn(client: Client, node: &str) -> Arc<PodWatcher> {
        let (store, writer) = reflector::store();
        let (changes, _) = watch::channel(0u64);
        let this = Arc::new(PodWatcher {
            node: node.to_owned(),
            store,
            synced: AtomicBool::new(false),
            changes,
        });
        let api: Api<Pod> = Api::all(client);
        let config = watcher::Config::default().fields(&node_field_selector(node));
        // Keep only what a lookup reads: no managed fields, no status.
        let pods = watcher(api, config).modify(|pod| {
            pod.managed_fields_mut().clear();
            pod.status = None;
        });
        let stream = reflector::reflector(writer, pods.default_backoff());
        let weak = Arc::downgrade(&this);
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let Some(this) = weak.upgrade() else {
                    return; // the agent dropped the watcher
                };
                match event {
                    Ok(event) => {
                        if matches!(event, watcher::Event::InitDone) {
                            this.synced.store(true, Ordering::SeqCst);
                            debug!(node = %this.node, pods = this.store.len(), "pod watcher synced");
                        }
                        // The store is updated before the reflector yields the event: wake
                        // every waiting lookup to look again.
                        this.changes.send_modify(|n| *n = n.wrapping_add(1));
                    }
                    Err(e) => warn!(node = %this.node, error = %e, "pod watch failed; retrying"),
                }
            }
        });
        this
    }

    /// The node whose pods this watcher reflects.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Whether the first listing is complete.
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::SeqCst)
    }

    /// The pod `namespace/name` if the reflector holds it now.
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.store.get(&ObjectRef::new(name).within(namespace))
    }

    /// Whether the pod of a record is still here. A record without a UID matches by name.
    pub fn presence(&self, pod: &PodRef) -> Presence {
        if !self.is_synced() {
            return Presence::Unknown;
        }
        match self.get(&pod.namespace, &pod.name) {
            None => Presence::Absent,
            Some(found) => {
                let uid = found.metadata.uid.as_deref().unwrap_or_default();
                if !pod.uid.is_empty() && !uid.is_empty() && uid != pod.uid {
                    Presence::Absent
                } else {
                    Presence::Present
                }
            }
        }
    }

    /// Waits up to `wait` for the pod `namespace/name` to show up.
    pub async fn wait_for(
        &self,
        namespace: &str,
        name: &str,
        wait: Duration,
    ) -> Result<PodInfo, CniError> {
        let deadline = tokio::time::Instant::now() + wait;
        // Subscribe before looking, so an event between the look and the wait is not missed.
        let mut changes = self.changes.subscribe();
        loop {
            if let Some(pod) = self.get(namespace, name) {
                return Ok(PodInfo::from_pod(&pod));
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => continue,
                // Timed out, or the watcher task ended (it never does while the agent runs).
                Ok(Err(_)) | Err(_) => break,
            }
        }
        Err(CniError::new(
            ErrorCode::TryAgainLater,
            format!(
                "pod {namespace}/{name} is not (yet) known to the pod watcher of node {} after {} ms; \
                 is it scheduled on this node? try again",
                self.node,
                wait.as_millis()
            ),
        )
        .with_details(if self.is_synced() {
            "the pod watcher is synced; the pod has not appeared on this node".to_owned()
        } else {
            "the pod watcher has not finished its first listing (API server reachable? RBAC pods list/watch?)"
                .to_owned()
        }))
    }
}

impl PodDirectory for PodWatcher {
    fn lookup<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        wait: Duration,
    ) -> BoxFuture<'a, Result<PodInfo, CniError>> {
        Box::pin(self.wait_for(namespace, name, wait))
    }

    fn exists(&self, namespace: &str, name: &str) -> Option<bool> {
        self.is_synced()
            .then(|| self.get(namespace, name).is_some())
    }
}
