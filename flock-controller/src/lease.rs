//! Leader election through a `coordination.k8s.io/v1` Lease, the way client-go does it: the
//! holder renews every retry period; a candidate takes the lease over only after it has seen
//! the same lease unchanged for a whole lease duration on its own clock (no clock is compared
//! across machines); a holder that could not renew within the renew deadline — shorter than
//! the lease duration — stops writing before anyone may take over. Every write is
//! conditional on the resource version read, so two candidates never both win.
//!
//! The decision ([`next_step`], [`Leadership`]) is pure; [`LeaseElector`] applies it.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

use crate::error::{Result, kube_err};

/// How long a lease holds without renewal.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);
/// How long a holder keeps writing without a successful renewal (< [`LEASE_DURATION`]).
pub const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// How often the holder renews and a candidate retries.
pub const RETRY_PERIOD: Duration = Duration::from_secs(2);

/// The lease as read from the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    /// Who holds it (`None` or empty: released).
    pub holder: Option<String>,
    /// Its duration in seconds, as the holder wrote it.
    pub duration_seconds: Option<i32>,
    /// The resource version: any change (a renewal) gives a new one.
    pub resource_version: String,
}

/// When a candidate first saw the lease in its current version, on the candidate's clock
/// (time since the elector started).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    /// The version seen.
    pub resource_version: String,
    /// When it was first seen.
    pub since: Duration,
}

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseStep {
    /// No lease exists: create it, holding it.
    Create,
    /// We hold it: renew it.
    Renew,
    /// It is released or expired: take it over (conditional on its version).
    TakeOver,
    /// Another holder's lease is live.
    Wait {
        /// The holder.
        holder: String,
        /// When it expires unless renewed, from now.
        expires_in: Duration,
    },
}

/// Decides the next step from the lease read at `now`, and returns the observation to keep.
pub fn next_step(
    lease: Option<&LeaseView>,
    me: &str,
    last: Option<&Observation>,
    now: Duration,
) -> (LeaseStep, Option<Observation>) {
    let Some(lease) = lease else {
        return (LeaseStep::Create, None);
    };
    let holder = lease.holder.as_deref().filter(|h| !h.is_empty());
    match holder {
        Some(h) if h == me => (LeaseStep::Renew, None),
        None => (LeaseStep::TakeOver, None),
        Some(h) => {
            let since = match last {
                Some(o) if o.resource_version == lease.resource_version => o.since,
                _ => now,
            };
            let duration = lease
                .duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .filter(|s| *s > 0)
                .map_or(LEASE_DURATION, Duration::from_secs);
            let observation = Observation {
                resource_version: lease.resource_version.clone(),
                since,
            };
            let expiry = since + duration;
            if now >= expiry {
                (LeaseStep::TakeOver, Some(observation))
            } else {
                (
                    LeaseStep::Wait {
                        holder: h.to_owned(),
                        expires_in: expiry - now,
                    },
                    Some(observation),
                )
            }
        }
    }
}

/// Whether this instance may write: it renewed (or acquired) the lease less than the renew
/// deadline ago.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Leadership {
    last_renewed: Option<Duration>,
}

impl Leadership {
    /// The lease was acquired or renewed at `at` (read before the write was sent).
    pub fn renewed(&mut self, at: Duration) {
        self.last_renewed = Some(at);
    }

    /// Whether this instance leads at `now`.
    pub fn leads(&self, now: Duration) -> bool {
        self.last_renewed
            .is_some_and(|at| now < at + RENEW_DEADLINE)
    }

    /// Whether it ever led (and so, if it no longer does, lost the lease).
    pub fn ever_led(&self) -> bool {
        self.last_renewed.is_some()
    }
}

/// Applies [`next_step`] against the API.
pub struct LeaseElector {
    api: Api<Lease>,
    name: String,
    identity: String,
    observation: Option<Observation>,
}

impl LeaseElector {
    /// An elector for the Lease `namespace/name`, as `identity` (the pod's name).
    pub fn new(client: Client, namespace: &str, name: &str, identity: &str) -> LeaseElector {
        LeaseElector {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            identity: identity.to_owned(),
            observation: None,
        }
    }

    /// One round: read the lease, decide, write. `Ok(true)` when this instance holds the
    /// lease afterwards; a write lost to another candidate (409) is `Ok(false)`.
    pub async fn try_acquire_or_renew(&mut self, now: Duration) -> Result<bool> {
        let current = self
            .api
            .get_opt(&self.name)
            .await
            .map_err(kube_err(format!("get lease {}", self.name)))?;
        let view = current.as_ref().map(|l| LeaseView {
            holder: l.spec.as_ref().and_then(|s| s.holder_identity.clone()),
            duration_seconds: l.spec.as_ref().and_then(|s| s.lease_duration_seconds),
            resource_version: l.metadata.resource_version.clone().unwrap_or_default(),
        });
        let (step, observation) = next_step(
            view.as_ref(),
            &self.identity,
            self.observation.as_ref(),
            now,
        );
        self.observation = observation;
        let stamp = MicroTime(Timestamp::now());
        let duration = i32::try_from(LEASE_DURATION.as_secs()).unwrap_or(15);
        let result = match (step, current) {
            (LeaseStep::Wait { .. }, _) => return Ok(false),
            (LeaseStep::Create, _) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..Default::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.identity.clone()),
                        lease_duration_seconds: Some(duration),
                        acquire_time: Some(stamp.clone()),
                        renew_time: Some(stamp),
                        lease_transitions: Some(0),
                        ..Default::default()
                    }),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            (step, Some(mut lease)) => {
                let spec = lease.spec.get_or_insert_with(Default::default);
                if step == LeaseStep::TakeOver {
                    spec.holder_identity = Some(self.identity.clone());
                    spec.acquire_time = Some(stamp.clone());
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                }
                spec.lease_duration_seconds = Some(duration);
                spec.renew_time = Some(stamp);
                // metadata.resourceVersion is kept: the replace is conditional on it.
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
            }
            (_, None) => return Ok(false),
        };
        match result {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(kube_err(format!("write lease {}", self.name))(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(by: &str, rv: &str) -> LeaseView {
        LeaseView {
            holder: Some(by.into()),
            duration_seconds: Some(15),
            resource_version: rv.into(),
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn a_candidate_takes_over_only_after_a_full_duration_of_silence_on_its_own_clock() {
        assert_eq!(next_step(None, "b", None, secs(0)).0, LeaseStep::Create);
        assert_eq!(
            next_step(Some(&held("b", "1")), "b", None, secs(0)).0,
            LeaseStep::Renew
        );
        let released = LeaseView {
            holder: Some(String::new()),
            ..held("", "1")
        };
        assert_eq!(
            next_step(Some(&released), "b", None, secs(0)).0,
            LeaseStep::TakeOver
        );

        // First sight at t=100: wait the whole duration, whatever renewTime says.
        let (step, seen) = next_step(Some(&held("a", "7")), "b", None, secs(100));
        assert_eq!(
            step,
            LeaseStep::Wait {
                holder: "a".into(),
                expires_in: secs(15)
            }
        );
        let (step, seen) = next_step(Some(&held("a", "7")), "b", seen.as_ref(), secs(114));
        assert_eq!(
            step,
            LeaseStep::Wait {
                holder: "a".into(),
                expires_in: secs(1)
            }
        );
        // A renewal (new version) restarts the wait.
        let (step, seen) = next_step(Some(&held("a", "8")), "b", seen.as_ref(), secs(114));
        assert_eq!(
            step,
            LeaseStep::Wait {
                holder: "a".into(),
                expires_in: secs(15)
            }
        );
        let (step, _) = next_step(Some(&held("a", "8")), "b", seen.as_ref(), secs(129));
        assert_eq!(step, LeaseStep::TakeOver);
    }

    #[test]
    fn a_holder_stops_writing_before_anyone_may_take_over() {
        let mut me = Leadership::default();
        assert!(!me.leads(secs(0)) && !me.ever_led());
        me.renewed(secs(50));
        assert!(me.leads(secs(59)));
        assert!(!me.leads(secs(60)), "the renew deadline passed");
        // A candidate that saw the last renewal no earlier than it was written can take over
        // at the earliest a lease duration later: after the holder stopped.
        let (_, seen) = next_step(Some(&held("a", "9")), "b", None, secs(50));
        let takeover_at = seen.unwrap().since + LEASE_DURATION;
        assert!(takeover_at > secs(50) + RENEW_DEADLINE);
        const { assert!(RENEW_DEADLINE.as_secs() + RETRY_PERIOD.as_secs() < LEASE_DURATION.as_secs()) };
    }
}
