//! A NodePool's status from the plan: counts, `Ready` and one condition per kind of problem,
//! each condition's transition time carried over while it holds, and a Warning event for
//! each problem that appears or changes (not on every reconcile).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

use flock_k8s_api::{NodePool, NodePoolStatus};

/// An event about a pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolEvent {
    /// The pool.
    pub pool: String,
    /// Warning (a problem) or Normal.
    pub warning: bool,
    /// `PascalCase` reason.
    pub reason: String,
    /// What happened, naming pool, node and CIDR.
    pub note: String,
}

/// A condition message is cut after this many bytes (a pool with thousands of waiting nodes).
const MAX_MESSAGE: usize = 2048;

/// The condition types a pool may carry besides `Ready`.
pub const PROBLEM_TYPES: [&str; 6] = [
    "InvalidSpec",
    "OverlappingPools",
    "NodeInSeveralPools",
    "PoolExhausted",
    "PrefixConflict",
    "ReleasePending",
];

fn cut(mut text: String) -> String {
    if text.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

/// The status of `pool` and the events its changes call for. `report` is the plan's
/// (`None` for an invalid pool, whose error is `invalid`).
pub fn pool_status(
    pool: &NodePool,
    report: Option<&flock_ipam::PoolReport>,
    invalid: Option<&str>,
    conflicts: &[String],
    release_pending: &[String],
    now: Timestamp,
) -> (NodePoolStatus, Vec<PoolEvent>) {
    let name = pool.metadata.name.clone().unwrap_or_default();
    // (type, messages) of every problem, in PROBLEM_TYPES order.
    let mut problems: Vec<(&str, Vec<String>)> = Vec::new();
    let mut add =
        |kind: &'static str, message: String| match problems.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, m)) => m.push(message),
            None => problems.push((kind, vec![message])),
        };
    if let Some(e) = invalid {
        add("InvalidSpec", e.to_owned());
    }
    for p in report.map(|r| r.problems.as_slice()).unwrap_or_default() {
        add(p.reason(), p.message(&name));
    }
    for c in conflicts {
        add("PrefixConflict", format!("NodePool {name}: {c}"));
    }
    let pending = (!release_pending.is_empty()).then(|| {
        format!(
            "NodePool {name}: node(s) gone, prefixes kept until their NodeConfig reports no \
             allocations: {}",
            release_pending.join(", ")
        )
    });
    problems.sort_by_key(|(k, _)| PROBLEM_TYPES.iter().position(|t| t == k));

    let previous = pool.status.as_ref();
    let generation = pool.metadata.generation;
    let condition = |kind: &str, status: &str, reason: &str, message: String| {
        let message = cut(message);
        let since = previous
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == kind))
            .filter(|c| c.status == status)
            .map(|c| c.last_transition_time.clone())
            .unwrap_or(Time(now));
        Condition {
            type_: kind.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message,
            last_transition_time: since,
            observed_generation: generation,
        }
    };
    let mut conditions = Vec::new();
    let ready = match problems.first() {
        None => {
            let free = report.map(|r| r.ipv6.free.to_string()).unwrap_or_default();
            let prefix = pool.spec.node_prefix6;
            condition(
                "Ready",
                "True",
                "PoolReady",
                format!("NodePool {name}: {free} /{prefix} node prefixes free"),
            )
        }
        Some((kind, _)) => {
            let all: Vec<String> = problems
                .iter()
                .flat_map(|(_, m)| m.iter().cloned())
                .collect();
            condition("Ready", "False", kind, all.join("; "))
        }
    };
    conditions.push(ready);
    let mut events = Vec::new();
    for (kind, messages) in &problems {
        let c = condition(kind, "True", kind, messages.join("; "));
        let before = previous.and_then(|s| s.conditions.iter().find(|p| p.type_ == *kind));
        if before.map(|b| (&b.status, &b.message)) != Some((&c.status, &c.message)) {
            events.push(PoolEvent {
                pool: name.clone(),
                warning: true,
                reason: (*kind).to_owned(),
                note: c.message.clone(),
            });
        }
        conditions.push(c);
    }
    if let Some(message) = pending {
        conditions.push(condition("ReleasePending", "True", "NodeDeleted", message));
    }
    let status = NodePoolStatus {
        nodes: report.map_or(0, |r| r.nodes as u64),
        ipv6: Some(report.map(|r| r.ipv6.into()).unwrap_or_default()),
        ipv4: report.and_then(|r| r.ipv4).map(Into::into),
        observed_generation: generation,
        conditions,
    };
    (status, events)
}
