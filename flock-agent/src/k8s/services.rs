//! The cluster-wide watches of Services and EndpointSlices behind Service announcing, and
//! the task that turns their changes into a BIRD refresh and a Warning event per refused
//! address. EndpointSlices are `discovery.k8s.io/v1`; of each only its endpoints' node and
//! readiness are kept.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tracing::warn;

use crate::agent::Agent;
use crate::cache::PAGE_SIZE;
use crate::routing::services::{ReportedRefusals, ServiceState};

/// Starts the two watches; each retries with kube's default backoff.
pub fn spawn_watches(client: Client, state: Arc<ServiceState>) {
    let page = watcher::Config::default().page_size(PAGE_SIZE);
    {
        let state = state.clone();
        let stream = watcher(Api::<Service>::all(client.clone()), page.clone()).default_backoff();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                match event {
                    Ok(event) => state.on_service(event),
                    Err(e) => warn!(error = %e, "Service watch failed; retrying"),
                }
            }
        });
    }
    let stream = watcher(Api::<EndpointSlice>::all(client), page).default_backoff();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            match event {
                Ok(event) => state.on_slice(event),
                Err(e) => warn!(error = %e, "EndpointSlice watch failed; retrying"),
            }
        }
    });
}

/// On every change of the Services, their endpoints or (through the BIRD writer's own
/// refresh) the NodeConfig: refresh BIRD and record a Warning event `AddressRefused` on each
/// Service whose address the node's pool does not allow.
pub async fn run_announcer(
    client: Client,
    node: String,
    agent: Arc<Agent>,
    state: Arc<ServiceState>,
) {
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: "flock-agent".into(),
            instance: Some(node.clone()),
        },
    );
    let mut changes = state.subscribe();
    let mut reported = ReportedRefusals::default();
    loop {
        if state.is_synced() {
            agent.announcements_changed();
            if let Some(settings) = agent.settings() {
                let refused = state.announcement(&node, &settings.services).refused;
                for r in reported.fresh(&refused) {
                    let note = format!(
                        "{} {} {} is not announced by node {node}: {}",
                        r.service, r.field, r.address, r.reason
                    );
                    warn!(service = %r.service, address = %r.address, "{note}");
                    let reference = ObjectReference {
                        api_version: Some("v1".into()),
                        kind: Some("Service".into()),
                        namespace: Some(r.service.namespace.clone()),
                        name: Some(r.service.name.clone()),
                        ..ObjectReference::default()
                    };
                    let event = Event {
                        type_: EventType::Warning,
                        reason: "AddressRefused".into(),
                        note: Some(note),
                        action: "Announce".into(),
                        secondary: None,
                    };
                    if let Err(e) = recorder.publish(&event, &reference).await {
                        warn!(service = %r.service, error = %e, "could not record event AddressRefused");
                    }
                }
            }
        }
        if changes.changed().await.is_err() {
            return;
        }
        // Let a burst (a rollout touches many slices) settle; BIRD's writer debounces too.
        tokio::time::sleep(Duration::from_millis(50)).await;
        changes.mark_unchanged();
    }
}
