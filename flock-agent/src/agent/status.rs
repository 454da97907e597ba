//! STATUS (DESIGN §7.4): success when an ADD can be served. Otherwise 50, naming every
//! reason (no NodeConfig, a default family's pool exhausted, the store unwritable); 51 when,
//! on top of that, BIRD is failing, so the routes of existing pods may not be announced
//! either. BIRD failing alone does not stop ADDs: `/readyz` reports it.
//!
//! Decided here, purely: [`verdict`] over [`StatusFacts`].

use flock_rpc::rpc::Request;

use super::{Agent, HandlerError, Outcome, error, parse_conf};
use crate::metrics::Component;
use flock_k8s_api::NodeSettings;

/// What STATUS looks at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatusFacts {
    /// Whether the node has its NodeConfig.
    pub node_config: bool,
    /// Why a default family's pool cannot serve another pod (one line each).
    pub pools_full: Vec<String>,
    /// Why the store cannot be written, if it cannot.
    pub store_problem: Option<String>,
    /// Why BIRD is failing, if it is.
    pub bird_problem: Option<String>,
}

/// The answer STATUS gives for these facts.
pub fn verdict(facts: StatusFacts) -> Outcome {
    let mut reasons = Vec::new();
    if !facts.node_config {
        reasons.push("no NodeConfig for this node".to_owned());
    }
    reasons.extend(facts.pools_full);
    if let Some(store) = facts.store_problem {
        reasons.push(format!("the allocation store is not writable: {store}"));
    }
    if reasons.is_empty() {
        return Ok(());
    }
    Err(HandlerError::NotServing {
        reasons,
        bird: facts.bird_problem,
    })
}

/// Why the pools of the families a pod gets by default cannot serve another pod. Only
/// addresses inside the node CIDR count: fixed `addresses`, anycast and pods left in an old
/// CIDR do not use the pool up.
pub fn pools_full(settings: &NodeSettings, pools: &flock_ipam::Pools) -> Vec<String> {
    let mut out = Vec::new();
    let families = [
        (settings.default_ipv6, flock_ipam::Family::V6),
        (settings.default_ipv4, flock_ipam::Family::V4),
    ];
    for (default, family) in families {
        if default && let Some(full) = pools.exhausted(family) {
            out.push(full.to_string());
        }
    }
    out
}

impl Agent {
    pub(super) async fn status(&self, req: &Request) -> Outcome {
        parse_conf(req)?;
        let settings = self.settings();
        let pools_full = match settings.as_deref() {
            Some(s) => pools_full(s, self.state().pools()),
            None => Vec::new(),
        };
        let probe = self.store.probe_writable();
        let store_problem = match probe {
            Ok(()) => {
                self.health.set_problem(Component::Store, None);
                None
            }
            Err(e) => {
                let chain = error::cause_chain(&e);
                self.health
                    .set_problem(Component::Store, Some(chain.clone()));
                Some(chain)
            }
        };
        verdict(StatusFacts {
            node_config: settings.is_some(),
            pools_full,
            store_problem,
            bird_problem: self.health.problem(Component::Bird),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flock_cni_proto::ErrorCode;

    #[test]
    fn serving_node_answers_success() {
        let facts = StatusFacts {
            node_config: true,
            bird_problem: Some("birdc: connection refused".into()),
            ..StatusFacts::default()
        };
        assert!(verdict(facts).is_ok(), "BIRD alone does not stop ADDs");
    }

    #[test]
    fn every_reason_is_named_and_bird_makes_it_51() {
        let facts = StatusFacts {
            node_config: false,
            pools_full: vec!["no free IPv4 address left in 10.0.0.0/30 (1 in use)".into()],
            store_problem: Some(
                "write /var/lib/flock/allocations/.probe-0: Read-only file system (os error 30)"
                    .into(),
            ),
            bird_problem: None,
        };
        let e = verdict(facts.clone()).unwrap_err();
        assert_eq!(e.code(), ErrorCode::PluginNotAvailable);
        let msg = e.to_string();
        for part in ["no NodeConfig", "10.0.0.0/30", "os error 30"] {
            assert!(msg.contains(part), "{msg}");
        }
        let e = verdict(StatusFacts {
            bird_problem: Some("bird down".into()),
            ..facts
        })
        .unwrap_err();
        assert_eq!(e.code(), ErrorCode::PluginNotAvailableLimitedConnectivity);
        assert!(e.to_string().ends_with("bird down"), "{e}");
    }
}
