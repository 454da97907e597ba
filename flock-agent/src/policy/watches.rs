//! The cluster-wide watches NetworkPolicy enforcement needs: every NetworkPolicy, every
//! ClusterNetworkPolicy (when the API serves them), every Namespace, every Pod. Their events go straight into the
//! [`PolicyEnforcer`](crate::policy::PolicyEnforcer), which keeps only the fields the model
//! reads (no reflector of whole objects: 10 000 pods must fit in a few MiB).
//!
//! Why a second pod watch rather than widening the node's ([`crate::k8s::pods`]): that one keeps
//! whole Pod objects (annotations, owner references, images) for ADD, which is fine for the
//! hundred pods of a node and far too much for every pod of the cluster; this one keeps
//! labels, addresses and named ports, and asks the API server to leave out finished pods
//! (`status.phase`), whose addresses may already be someone else's.

use std::fmt::Debug;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tracing::warn;

use super::PolicyEnforcer;
use crate::cache::PAGE_SIZE;

/// The server-side field selector of the cluster-wide pod watch: running and pending pods.
pub const LIVE_PODS: &str = "status.phase!=Succeeded,status.phase!=Failed";

/// Starts the three watches on the current runtime; each retries with kube's default backoff.
pub fn spawn_watches(client: Client, enforcer: Arc<PolicyEnforcer>) {
    let page = watcher::Config::default().page_size(PAGE_SIZE);
    spawn_watch(
        Api::<NetworkPolicy>::all(client.clone()),
        page.clone(),
        enforcer.clone(),
        PolicyEnforcer::on_policy,
    );
    spawn_watch(
        Api::<Namespace>::all(client.clone()),
        page.clone(),
        enforcer.clone(),
        PolicyEnforcer::on_namespace,
    );
    spawn_watch(
        Api::<Pod>::all(client.clone()),
        page.clone().fields(LIVE_PODS),
        enforcer.clone(),
        PolicyEnforcer::on_pod,
    );
    spawn_cluster_policy_watch(client, page, enforcer);
}

/// The ClusterNetworkPolicy watch. While the API does not serve the resource (its CRD is not
/// installed) there are none: the enforcer is told so, rather than waiting for them, and the
/// watch keeps retrying, so policies created after the CRD is installed are seen.
fn spawn_cluster_policy_watch(
    client: Client,
    config: watcher::Config,
    enforcer: Arc<PolicyEnforcer>,
) {
    let resource = super::cluster::api_resource();
    let api = Api::<kube::api::DynamicObject>::all_with(client, &resource);
    let stream = watcher(api, config).default_backoff();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut absent = false;
        while let Some(event) = stream.next().await {
            match event {
                Ok(event) => {
                    absent = false;
                    enforcer.on_cluster_policy(event);
                }
                Err(e) if not_served(&e) => {
                    if !absent {
                        warn!(
                            "ClusterNetworkPolicy (policy.networking.k8s.io/v1beta1) is not served: \
                             none are enforced until network-policy-api v0.3.0's CRD is installed \
                             (an older CRD that serves only v1alpha2 is not watched)"
                        );
                        absent = true;
                    }
                    enforcer.no_cluster_policies();
                }
                Err(e) => {
                    warn!(kind = "ClusterNetworkPolicy", error = %e, "cluster-wide watch failed; retrying")
                }
            }
        }
    });
}

/// Whether a watch failed because the API server does not serve the resource.
fn not_served(e: &watcher::Error) -> bool {
    let api = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s)) => s,
        _ => return false,
    };
    api.code == 404
}

fn spawn_watch<K>(
    api: Api<K>,
    config: watcher::Config,
    enforcer: Arc<PolicyEnforcer>,
    on_event: fn(&PolicyEnforcer, watcher::Event<K>),
) where
    K: Resource + Clone + Debug + DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
{
    let kind = K::kind(&K::DynamicType::default()).into_owned();
    let stream = watcher(api, config).default_backoff();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(event) => on_event(&enforcer, event),
                Err(e) => warn!(%kind, error = %e, "cluster-wide watch failed; retrying"),
            }
        }
    });
}
