//! Fixtures of the NetworkPolicy tests: API objects as JSON, watch events fed to the
//! enforcer as its watchers would, and a pod directory that knows each pod's labels.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use flock_agent::pods::{PodDirectory, PodInfo};
use flock_agent::policy::PolicyEnforcer;
use flock_agent::store::PodRef;
use flock_cni_proto::{CniError, ErrorCode};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::watcher::Event;
use serde_json::{Value, json};

/// The settings of node `node` with these pod ranges.
pub fn node_settings(node: &str, cidr6: &str, cidr4: &str) -> flock_k8s_api::NodeSettings {
    serde_json::from_value::<flock_k8s_api::NodeConfig>(json!({
        "apiVersion": "flock.fritzlab.net/v1alpha1", "kind": "NodeConfig",
        "metadata": { "name": node },
        "spec": { "cidr6": cidr6, "cidr4": cidr4 }
    }))
    .expect("NodeConfig fixture")
    .settings()
    .expect("valid settings")
}

/// A NetworkPolicy of namespace `shop`.
pub fn policy(name: &str, spec: Value) -> NetworkPolicy {
    serde_json::from_value(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": { "namespace": "shop", "name": name }, "spec": spec
    }))
    .expect("policy fixture")
}

/// A namespace with labels.
pub fn namespace(name: &str, labels: Value) -> Namespace {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": { "name": name, "labels": labels }
    }))
    .expect("namespace fixture")
}

/// A running pod of namespace `ns` on `node` with these labels and addresses.
pub fn pod(ns: &str, name: &str, node: &str, labels: Value, ips: &[&str]) -> Pod {
    let ips: Vec<Value> = ips.iter().map(|ip| json!({ "ip": ip })).collect();
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "namespace": ns, "name": name, "uid": format!("uid-{name}"), "labels": labels },
        "spec": { "nodeName": node, "containers": [{ "name": "c", "ports": [
            { "name": "http", "containerPort": 8080 } ] }] },
        "status": { "phase": "Running", "podIPs": ips }
    }))
    .expect("pod fixture")
}

/// Feeds a complete first listing of each kind, as the three watchers do.
pub fn list_all(
    enforcer: &PolicyEnforcer,
    policies: Vec<NetworkPolicy>,
    namespaces: Vec<Namespace>,
    pods: Vec<Pod>,
) {
    enforcer.on_policy(Event::Init);
    for p in policies {
        enforcer.on_policy(Event::InitApply(p));
    }
    enforcer.on_policy(Event::InitDone);
    enforcer.on_namespace(Event::Init);
    for n in namespaces {
        enforcer.on_namespace(Event::InitApply(n));
    }
    enforcer.on_namespace(Event::InitDone);
    enforcer.on_pod(Event::Init);
    for p in pods {
        enforcer.on_pod(Event::InitApply(p));
    }
    enforcer.on_pod(Event::InitDone);
    enforcer.on_cluster_policy(Event::Init);
    enforcer.on_cluster_policy(Event::InitDone);
}

/// The pod watcher's stand-in: each pod's labels and named ports, as ADD resolves them.
#[derive(Debug, Default)]
pub struct Directory {
    pods: Mutex<BTreeMap<(String, String), PodInfo>>,
}

impl Directory {
    /// Adds a pod from its API object.
    pub fn insert(&self, pod: &Pod) {
        let info = PodInfo::from_pod(pod);
        self.pods.lock().unwrap().insert(
            (info.pod.namespace.clone(), info.pod.name.clone()),
            PodInfo {
                pod: PodRef {
                    uid: info.pod.uid.clone(),
                    ..info.pod.clone()
                },
                ..info
            },
        );
    }
}

impl PodDirectory for Directory {
    fn lookup<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        _wait: Duration,
    ) -> BoxFuture<'a, Result<PodInfo, CniError>> {
        let found = self
            .pods
            .lock()
            .unwrap()
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned();
        Box::pin(async move {
            found.ok_or_else(|| {
                CniError::new(
                    ErrorCode::TryAgainLater,
                    format!("{namespace}/{name} unknown"),
                )
            })
        })
    }

    fn exists(&self, namespace: &str, name: &str) -> Option<bool> {
        Some(
            self.pods
                .lock()
                .unwrap()
                .contains_key(&(namespace.to_owned(), name.to_owned())),
        )
    }
}

/// A policy isolating `app=server` for ingress: only `role=client` pods of its namespace,
/// TCP to the named port `http`.
pub fn server_policy() -> NetworkPolicy {
    policy(
        "server",
        json!({
            "podSelector": { "matchLabels": { "app": "server" } },
            "ingress": [{
                "from": [{ "podSelector": { "matchLabels": { "role": "client" } } }],
                "ports": [{ "port": "http" }]
            }]
        }),
    )
}
