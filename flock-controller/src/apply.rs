//! Writes a [`Reconcile`] through the API, and remembers the controller's own writes until
//! the watch caches show them ([`Overlay`]), so that the next reconcile never plans over a
//! prefix it has just handed out.

use std::collections::BTreeMap;

use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Api, Client, Resource};
use tracing::{info, warn};

use crate::FIELD_MANAGER;
use crate::decide::Reconcile;
use crate::error::{Error, Result, kube_err};
use flock_k8s_api::NodeConfig;
use flock_k8s_api::NodePool;

/// The controller's writes the NodeConfig cache may not show yet.
#[derive(Debug, Clone, Default)]
pub struct Overlay {
    created: BTreeMap<String, NodeConfig>,
    deleted: BTreeMap<String, Option<String>>,
}

impl Overlay {
    /// Whether every write is in the cache already.
    pub fn is_empty(&self) -> bool {
        self.created.is_empty() && self.deleted.is_empty()
    }

    /// A NodeConfig was created. A delete of the same name before it stays known: the cache
    /// may still show the NodeConfig that delete removed.
    pub fn created(&mut self, nc: NodeConfig) {
        if let Some(name) = nc.metadata.name.clone() {
            self.created.insert(name, nc);
        }
    }

    /// A NodeConfig with this uid was deleted.
    pub fn deleted(&mut self, name: &str, uid: Option<String>) {
        self.created.remove(name);
        self.deleted.insert(name.to_owned(), uid);
    }

    /// The cached NodeConfigs with the controller's own writes applied; entries the cache
    /// now reflects are forgotten. Writes are matched by uid as well as by name:
    /// - a created NodeConfig is seen once the cache holds its uid; while the cache still holds
    ///   the one of that name the controller deleted before, the created one stands in its
    ///   place; a cached one of any other uid was written by someone else since, and wins;
    /// - a deleted one is gone once the cache no longer holds that uid.
    pub fn merge(&mut self, mut cached: Vec<NodeConfig>) -> Vec<NodeConfig> {
        let name_of = |nc: &NodeConfig| nc.metadata.name.clone().unwrap_or_default();
        let uid_of = |name: &str| {
            cached
                .iter()
                .find(|nc| name_of(nc) == name)
                .map(|nc| nc.metadata.uid.clone())
        };
        let deleted = &self.deleted;
        self.created.retain(|name, created| match uid_of(name) {
            None => true,
            Some(uid) if created.metadata.uid.is_some() && uid == created.metadata.uid => false,
            Some(uid) => deleted
                .get(name)
                .is_some_and(|old| old.is_some() && *old == uid),
        });
        self.deleted
            .retain(|name, old| uid_of(name).is_some_and(|uid| old.is_none() || *old == uid));
        cached.retain(|nc| {
            let name = name_of(nc);
            !self.deleted.contains_key(&name) && !self.created.contains_key(&name)
        });
        cached.extend(self.created.values().cloned());
        cached.sort_by_key(name_of);
        cached
    }
}

fn conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// Writes `decision`. `leads` is asked before every write; when it says no, nothing more is
/// written and the error says the lease was lost. Conflicts (409: someone wrote first) are
/// skipped — the next reconcile sees the newer state; other failures are collected.
pub async fn apply(
    client: &Client,
    recorder: &Recorder,
    pools: &[NodePool],
    decision: Reconcile,
    overlay: &mut Overlay,
    leads: &(dyn Fn() -> bool + Sync),
) -> Result<Vec<Error>> {
    let lost = || Error::LostLease {
        then: "stopping before another write",
    };
    let configs: Api<NodeConfig> = Api::all(client.clone());
    let post = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    let mut failures = Vec::new();
    for nc in decision.create {
        let name = nc.metadata.name.clone().unwrap_or_default();
        if !leads() {
            return Err(lost());
        }
        match configs.create(&post, &nc).await {
            Ok(created) => {
                info!(node = %name, cidr6 = ?nc.spec.cidr6, cidr4 = ?nc.spec.cidr4, "NodeConfig created");
                overlay.created(created);
            }
            Err(e) if conflict(&e) => {
                info!(node = %name, "NodeConfig exists already; next reconcile sees it")
            }
            Err(e) => failures.push(kube_err(format!("create nodeconfigs/{name}"))(e)),
        }
    }
    for nc in decision.update {
        let name = nc.metadata.name.clone().unwrap_or_default();
        if !leads() {
            return Err(lost());
        }
        match configs.replace(&name, &post, &nc).await {
            Ok(_) => info!(node = %name, "NodeConfig updated from its pool"),
            Err(e) if conflict(&e) => {
                info!(node = %name, "NodeConfig changed meanwhile; next reconcile retries")
            }
            Err(e) => failures.push(kube_err(format!("update nodeconfigs/{name}"))(e)),
        }
    }
    for r in decision.release {
        if !leads() {
            return Err(lost());
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: r.uid.clone(),
                resource_version: r.resource_version.clone(),
            }),
            ..DeleteParams::default()
        };
        match configs.delete(&r.name, &params).await {
            Ok(_) => {
                info!(node = %r.name, prefixes = %r.prefixes, "prefixes released");
                overlay.deleted(&r.name, r.uid);
            }
            Err(e) if conflict(&e) => {
                info!(node = %r.name, "NodeConfig changed meanwhile; release retried next reconcile")
            }
            Err(kube::Error::Api(s)) if s.code == 404 => overlay.deleted(&r.name, r.uid),
            Err(e) => failures.push(kube_err(format!("delete nodeconfigs/{}", r.name))(e)),
        }
    }
    let pool_api: Api<NodePool> = Api::all(client.clone());
    let patch = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    for (name, status) in decision.pool_status {
        if !leads() {
            return Err(lost());
        }
        let body = serde_json::json!({ "status": status });
        if let Err(e) = pool_api
            .patch_status(&name, &patch, &Patch::Merge(&body))
            .await
        {
            failures.push(kube_err(format!("patch nodepools/{name}/status"))(e));
        }
    }
    for ev in decision.events {
        let Some(pool) = pools
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(ev.pool.as_str()))
        else {
            continue;
        };
        let event = Event {
            type_: if ev.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: ev.reason.clone(),
            note: Some(ev.note.clone()),
            action: "Reconcile".into(),
            secondary: None,
        };
        if ev.warning {
            warn!(pool = %ev.pool, reason = %ev.reason, "{}", ev.note);
        }
        if let Err(e) = recorder.publish(&event, &pool.object_ref(&())).await {
            failures.push(kube_err(format!(
                "record event {} for nodepools/{}",
                ev.reason, ev.pool
            ))(e));
        }
    }
    Ok(failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nc(name: &str, uid: &str) -> NodeConfig {
        let mut nc = NodeConfig::new(name, Default::default());
        nc.metadata.uid = Some(uid.into());
        nc
    }

    fn names(v: &[NodeConfig]) -> Vec<String> {
        v.iter().map(|n| n.metadata.name.clone().unwrap()).collect()
    }

    #[test]
    fn own_writes_count_until_the_cache_shows_them() {
        let mut o = Overlay::default();
        o.created(nc("b", "u-b"));
        o.deleted("c", Some("u-c".into()));
        // The cache has neither write yet.
        let merged = o.merge(vec![nc("a", "u-a"), nc("c", "u-c")]);
        assert_eq!(names(&merged), ["a", "b"]);
        // Now it has both: the overlay forgets them.
        let merged = o.merge(vec![nc("a", "u-a"), nc("b", "u-b")]);
        assert_eq!(names(&merged), ["a", "b"]);
        assert!(o.is_empty());
        // A NodeConfig re-created under the same name (new uid) is not hidden.
        o.deleted("c", Some("u-c".into()));
        assert_eq!(names(&o.merge(vec![nc("c", "u-c2")])), ["c"]);
        assert!(o.is_empty());
        // Released and created again under the same name before the cache saw either: the
        // cached one is the old NodeConfig, and the new one stands in its place until the
        // cache holds it (found by tests/decide_props.rs: the old one's prefix was shown, the
        // new one's was handed out a second time).
        o.deleted("d", Some("u-d".into()));
        o.created(nc("d", "u-d2"));
        let merged = o.merge(vec![nc("d", "u-d")]);
        assert_eq!(merged.len(), 1);
        assert_eq!(merged[0].metadata.uid.as_deref(), Some("u-d2"));
        assert!(!o.is_empty());
        assert_eq!(names(&o.merge(vec![nc("d", "u-d2")])), ["d"]);
        assert!(o.is_empty());
        // Created, then deleted and written again by someone else before the cache saw the
        // creation: the cache's NodeConfig (another uid) wins and the overlay forgets its own.
        o.created(nc("e", "u-e"));
        let merged = o.merge(vec![nc("e", "u-someone")]);
        assert_eq!(merged[0].metadata.uid.as_deref(), Some("u-someone"));
        assert!(o.is_empty());
    }
}
