//! The controller's process: win the lease, then (and only then) start the watches, wait for
//! their first listings, and reconcile on every change and every resync period while the
//! lease is held. Losing the lease ends the process (the Deployment restarts it as a
//! candidate): a leader never runs on stale beliefs.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::Notify;
use tracing::{error, info, warn};

use crate::apply::{Overlay, apply};
use crate::decide::{NodeFacts, Observed, decide, pod_checks_due};
use crate::error::{Error, Result};
use crate::lease::{Leadership, LeaseElector, RETRY_PERIOD};
use flock_k8s_api::NodeConfig;
use flock_k8s_api::NodePool;

/// What the controller needs.
#[derive(Debug, Clone)]
pub struct ControllerOptions {
    /// A kubeconfig file; `None`: in-cluster config or `$KUBECONFIG`.
    pub kubeconfig: Option<PathBuf>,
    /// The namespace of the Lease.
    pub lease_namespace: String,
    /// The Lease's name.
    pub lease_name: String,
    /// This instance's identity in the Lease (its pod name).
    pub identity: String,
    /// How often to reconcile without a change.
    pub resync: Duration,
    /// How long a gone node's prefixes stay its own while its NodeConfig still reports
    /// allocations ([`crate::DEFAULT_RELEASE_GRACE`]).
    pub release_grace: Duration,
}

/// The facts of a Node the controller uses.
pub fn node_facts(node: &Node) -> NodeFacts {
    let internal_ipv4 = node
        .status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .into_iter()
        .flatten()
        .filter(|a| a.type_ == "InternalIP")
        .find_map(|a| a.address.parse::<Ipv4Addr>().ok());
    NodeFacts {
        name: node.metadata.name.clone().unwrap_or_default(),
        labels: node.metadata.labels.clone().unwrap_or_default(),
        internal_ipv4,
    }
}

/// Which of `names` (gone nodes) no pod is bound to any more: one LIST of at most one pod's
/// metadata per node (field selector `spec.nodeName`), so nothing is cached cluster-wide. A
/// node whose LIST fails counts as having pods.
async fn podless(client: &kube::Client, names: Vec<String>) -> BTreeSet<String> {
    let pods = Api::<Pod>::all(client.clone());
    let mut out = BTreeSet::new();
    for name in names {
        let params = kube::api::ListParams::default()
            .fields(&format!("spec.nodeName={name}"))
            .limit(1);
        match pods.list_metadata(&params).await {
            Ok(list) if list.items.is_empty() => {
                out.insert(name);
            }
            Ok(_) => {}
            Err(e) => warn!(node = %name, error = %e, "could not list the pods of a gone node"),
        }
    }
    out
}

/// A reflected watch whose every event wakes `notify`.
fn reflect<K>(api: Api<K>, notify: Arc<Notify>) -> Store<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let stream =
        reflector::reflector(writer, watcher(api, watcher::Config::default())).default_backoff();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(_) => notify.notify_one(),
                Err(e) => warn!(error = %e, "watch failed; retrying"),
            }
        }
    });
    reader
}

/// Runs the controller until it loses its lease or the process is stopped.
pub async fn run(options: ControllerOptions) -> Result<()> {
    if options.identity.is_empty() {
        return Err(Error::NoIdentity);
    }
    let client = flock_k8s_api::client::client(options.kubeconfig.as_deref()).await?;
    let start = Instant::now();
    let mut elector = LeaseElector::new(
        client.clone(),
        &options.lease_namespace,
        &options.lease_name,
        &options.identity,
    );
    let leadership = Arc::new(Mutex::new(Leadership::default()));
    info!(identity = %options.identity, lease = %format!("{}/{}", options.lease_namespace, options.lease_name), "waiting for the lease");
    loop {
        let at = start.elapsed();
        match elector.try_acquire_or_renew(at).await {
            Ok(true) => {
                leadership
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .renewed(at);
                break;
            }
            Ok(false) => {}
            Err(e) => warn!(error = %e, "lease"),
        }
        tokio::time::sleep(RETRY_PERIOD).await;
    }
    info!(identity = %options.identity, "leading: starting the watches");
    let leads = {
        let leadership = leadership.clone();
        move || {
            leadership
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .leads(start.elapsed())
        }
    };
    let renewer = {
        let leadership = leadership.clone();
        let leads = leads.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(RETRY_PERIOD).await;
                let at = start.elapsed();
                match elector.try_acquire_or_renew(at).await {
                    Ok(true) => leadership
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .renewed(at),
                    Ok(false) => {
                        error!("the lease was taken over");
                        return;
                    }
                    Err(e) => warn!(error = %e, "could not renew the lease"),
                }
                if !leads() {
                    error!("the lease could not be renewed within the renew deadline");
                    return;
                }
            }
        })
    };

    let changed = Arc::new(Notify::new());
    let nodes = reflect(Api::<Node>::all(client.clone()), changed.clone());
    let pools = reflect(Api::<NodePool>::all(client.clone()), changed.clone());
    let configs = reflect(Api::<NodeConfig>::all(client.clone()), changed.clone());
    let services = reflect(Api::<Service>::all(client.clone()), changed.clone());
    let service_cidrs = reflect(Api::<ServiceCIDR>::all(client.clone()), changed.clone());
    for (what, ready) in [
        ("Nodes", nodes.wait_until_ready().await.is_ok()),
        ("NodePools", pools.wait_until_ready().await.is_ok()),
        ("NodeConfigs", configs.wait_until_ready().await.is_ok()),
        ("Services", services.wait_until_ready().await.is_ok()),
        (
            "ServiceCIDRs",
            service_cidrs.wait_until_ready().await.is_ok(),
        ),
    ] {
        if !ready {
            return Err(Error::WatchStopped { what });
        }
    }
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: crate::MANAGED_BY.into(),
            instance: Some(options.identity.clone()),
        },
    );
    let mut overlay = Overlay::default();
    let mut lb_reported = crate::lb::ReportedProblems::default();
    info!("watches synced: reconciling");
    loop {
        if renewer.is_finished() || !leads() {
            return Err(Error::LostLease {
                then: "exiting so that it restarts as a candidate",
            });
        }
        let node_list: Vec<NodeFacts> = nodes.state().iter().map(|n| node_facts(n)).collect();
        let pool_list: Vec<NodePool> = pools.state().iter().map(|p| (**p).clone()).collect();
        let config_list = overlay.merge(configs.state().iter().map(|c| (**c).clone()).collect());
        let service_cidr_list =
            crate::decide::service_cidr_ranges(service_cidrs.state().iter().map(|c| &**c));
        let now = Timestamp::now();
        let due = pod_checks_due(&config_list, &node_list, options.release_grace, now);
        let podless = podless(&client, due).await;
        let decision = decide(
            &Observed {
                pools: &pool_list,
                nodes: &node_list,
                node_configs: &config_list,
                service_cidrs: &service_cidr_list,
                release_grace: options.release_grace,
                podless: &podless,
            },
            now,
        );
        let failures = apply(
            &client,
            &recorder,
            &pool_list,
            decision,
            &mut overlay,
            &leads,
        )
        .await?;
        for f in failures {
            warn!(error = %f, "reconcile");
        }
        // LoadBalancer addresses: the Services' statuses are the record (read back after a
        // restart), so only changed ones are written, each while the lease is held.
        let service_list: Vec<Service> = services.state().iter().map(|s| (**s).clone()).collect();
        let lb = crate::lb::decide_lb(&pool_list, &service_list);
        for write in &lb.writes {
            if !leads() {
                break;
            }
            match crate::lb::apply_lb(&client, write).await {
                Ok(()) => {
                    info!(service = %write.service, ips = ?write.ips, "LoadBalancer status written")
                }
                Err(e) => warn!(error = %e, "LoadBalancer"),
            }
        }
        for (service, note) in lb_reported.fresh(&lb.problems) {
            warn!(%service, "{note}");
            let event = kube::runtime::events::Event {
                type_: kube::runtime::events::EventType::Warning,
                reason: "LoadBalancerAddress".into(),
                note: Some(note),
                action: "Assign".into(),
                secondary: None,
            };
            let reference = k8s_openapi::api::core::v1::ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Service".into()),
                namespace: Some(service.namespace.clone()),
                name: Some(service.name.clone()),
                ..Default::default()
            };
            if let Err(e) = recorder.publish(&event, &reference).await {
                warn!(%service, error = %e, "could not record event LoadBalancerAddress");
            }
        }
        tokio::select! {
            _ = changed.notified() => {
                // Let a burst of events (a node joining touches several objects) settle.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            _ = tokio::time::sleep(options.resync) => {}
        }
    }
}
