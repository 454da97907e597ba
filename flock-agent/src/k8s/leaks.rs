//! Leak reconcile: an allocation whose pod is gone from this node for longer than a grace
//! period is torn down and released, as its DEL would have done (a DEL lost with a node
//! that was down, a runtime that forgot its sandbox, …).
//!
//! The decision is a pure function of the records, what the pod watcher sees and the time
//! ([`LeakTracker::decide`]); [`reconcile_once`] applies it to the agent.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::pods::{PodWatcher, Presence};
use crate::agent::Agent;
use crate::store::{AllocationRecord, AttachmentKey, PodRef};

/// The default grace period (`--leak-grace`).
pub const DEFAULT_LEAK_GRACE: Duration = Duration::from_secs(300);
/// How often the reconcile runs.
pub const DEFAULT_LEAK_INTERVAL: Duration = Duration::from_secs(30);

/// Remembers since when each record's pod has been absent.
#[derive(Debug, Default, Clone)]
pub struct LeakTracker {
    absent_since: BTreeMap<AttachmentKey, Instant>,
}

impl LeakTracker {
    /// A tracker that has seen nothing yet.
    pub fn new() -> LeakTracker {
        LeakTracker::default()
    }

    /// Decides which records to release at `now`: those whose pod has been [`Presence::Absent`]
    /// at every call for longer than `grace` since it was first seen absent. A pod that is
    /// present again resets its timer; while the watcher is not synced ([`Presence::Unknown`])
    /// nothing is released and timers neither start nor reset. Records without a pod (not
    /// made through Kubernetes) are never released here. Forgets records that are gone.
    pub fn decide<'a>(
        &mut self,
        records: impl IntoIterator<Item = (AttachmentKey, Option<&'a PodRef>)>,
        presence: impl Fn(&PodRef) -> Presence,
        now: Instant,
        grace: Duration,
    ) -> Vec<AttachmentKey> {
        let mut seen = BTreeMap::new();
        let mut release = Vec::new();
        for (key, pod) in records {
            let Some(pod) = pod else { continue };
            match presence(pod) {
                Presence::Present => {}
                Presence::Unknown => {
                    if let Some(since) = self.absent_since.get(&key) {
                        seen.insert(key, *since);
                    }
                }
                Presence::Absent => {
                    let since = *self.absent_since.get(&key).unwrap_or(&now);
                    if now.saturating_duration_since(since) > grace {
                        release.push(key.clone());
                    }
                    seen.insert(key, since);
                }
            }
        }
        self.absent_since = seen;
        release
    }

    /// How many records are currently timed as absent.
    pub fn absent(&self) -> usize {
        self.absent_since.len()
    }
}

/// What one pass released.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LeakReport {
    /// Attachments torn down and released.
    pub released: Vec<AttachmentKey>,
    /// Attachments whose release failed (kept, retried next pass).
    pub failed: Vec<(AttachmentKey, String)>,
}

/// One pass of the leak reconcile at `now`.
pub async fn reconcile_once(
    agent: &Agent,
    pods: &PodWatcher,
    tracker: &mut LeakTracker,
    now: Instant,
    grace: Duration,
) -> LeakReport {
    let records: Vec<AllocationRecord> = agent.records();
    let decided = tracker.decide(
        records.iter().map(|r| (r.key(), r.pod.as_ref())),
        |pod| pods.presence(pod),
        now,
        grace,
    );
    let mut report = LeakReport::default();
    for key in decided {
        let pod = records
            .iter()
            .find(|r| r.key() == key)
            .and_then(|r| r.pod.as_ref())
            .map(|p| format!("{}/{}", p.namespace, p.name))
            .unwrap_or_default();
        match agent.release_attachment(&key).await {
            Ok(()) => {
                info!(container_id = %key.container_id, if_name = %key.if_name, %pod,
                    grace_s = grace.as_secs(),
                    "released the allocation of a pod gone from this node past the grace period");
                report.released.push(key);
            }
            Err(e) => {
                let error = flock_cni_proto::error::cause_chain(&e);
                warn!(container_id = %key.container_id, if_name = %key.if_name, %pod,
                    %error, "releasing a leaked allocation failed; retrying next pass");
                report.failed.push((key, error));
            }
        }
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> AttachmentKey {
        AttachmentKey {
            container_id: id.into(),
            if_name: "eth0".into(),
        }
    }

    fn pod(name: &str) -> PodRef {
        PodRef {
            namespace: "default".into(),
            name: name.into(),
            uid: String::new(),
        }
    }

    #[test]
    fn releases_only_past_the_grace_period_and_a_returning_pod_resets_the_timer() {
        let grace = Duration::from_secs(300);
        let t0 = Instant::now();
        let (gone, back, here) = (pod("gone"), pod("back"), pod("here"));
        let records = |with_here: bool| {
            let mut v = vec![(key("a"), Some(&gone)), (key("b"), Some(&back))];
            if with_here {
                v.push((key("c"), Some(&here)));
            }
            v.push((key("d"), None));
            v
        };
        let mut t = LeakTracker::new();
        let absent = |p: &PodRef| {
            if p.name == "here" {
                Presence::Present
            } else {
                Presence::Absent
            }
        };
        assert!(t.decide(records(true), absent, t0, grace).is_empty());
        assert_eq!(t.absent(), 2);
        // Within the grace period: nothing.
        let t1 = t0 + Duration::from_secs(200);
        assert!(t.decide(records(true), absent, t1, grace).is_empty());
        // "back" reappears: its timer resets.
        let t2 = t0 + Duration::from_secs(250);
        let back_here = |p: &PodRef| {
            if p.name == "gone" {
                Presence::Absent
            } else {
                Presence::Present
            }
        };
        assert!(t.decide(records(true), back_here, t2, grace).is_empty());
        // Past the grace for "gone", but "back" was absent again only since t3.
        let t3 = t0 + Duration::from_secs(301);
        assert_eq!(t.decide(records(true), absent, t3, grace), vec![key("a")]);
        let t4 = t3 + Duration::from_secs(300);
        assert!(
            !t.decide(records(true), absent, t4, grace)
                .contains(&key("b"))
        );
        let t5 = t3 + Duration::from_secs(301);
        assert!(
            t.decide(records(true), absent, t5, grace)
                .contains(&key("b"))
        );
    }

    #[test]
    fn unsynced_watcher_neither_releases_nor_resets() {
        let grace = Duration::from_secs(60);
        let t0 = Instant::now();
        let p = pod("p");
        let mut t = LeakTracker::new();
        let recs = || vec![(key("a"), Some(&p))];
        assert!(
            t.decide(recs(), |_| Presence::Unknown, t0, grace)
                .is_empty()
        );
        assert_eq!(t.absent(), 0, "unknown must not start a timer");
        t.decide(recs(), |_| Presence::Absent, t0, grace);
        let later = t0 + Duration::from_secs(120);
        assert!(
            t.decide(recs(), |_| Presence::Unknown, later, grace)
                .is_empty()
        );
        assert_eq!(t.absent(), 1, "unknown must not reset a timer");
        assert_eq!(
            t.decide(recs(), |_| Presence::Absent, later, grace),
            vec![key("a")]
        );
    }

    #[test]
    fn forgets_records_that_are_gone() {
        let p = pod("p");
        let mut t = LeakTracker::new();
        let t0 = Instant::now();
        t.decide(
            vec![(key("a"), Some(&p))],
            |_| Presence::Absent,
            t0,
            DEFAULT_LEAK_GRACE,
        );
        assert_eq!(t.absent(), 1);
        t.decide(
            Vec::<(AttachmentKey, Option<&PodRef>)>::new(),
            |_| Presence::Absent,
            t0,
            DEFAULT_LEAK_GRACE,
        );
        assert_eq!(t.absent(), 0);
    }
}
