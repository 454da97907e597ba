//! Prometheus metrics and the `/metrics`, `/healthz`, `/readyz` endpoints.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of a CNI request counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// ADD, DEL, CHECK, STATUS, GC.
    pub op: String,
    /// `ok` or the CNI error code.
    pub outcome: String,
}

/// Labels carrying an operation only.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpLabels {
    /// ADD, DEL, CHECK, STATUS, GC.
    pub op: String,
}

/// Labels carrying an address family.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FamilyLabels {
    /// `ipv6` or `ipv4`.
    pub family: String,
}

/// Labels of a BGP session.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SessionLabels {
    /// The neighbor as the NodeConfig status names it.
    pub neighbor: String,
}

/// Labels of a NetworkPolicy apply.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApplyLabels {
    /// `full` (the whole table), `elements` (set members only) or `none` (nothing changed).
    pub kind: String,
}

/// Labels carrying a policy direction.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabels {
    /// `ingress` or `egress`.
    pub direction: String,
}

/// Every metric the agent exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// CNI requests by op and outcome.
    pub requests: Family<RequestLabels, Counter>,
    /// CNI request latency by op.
    pub request_seconds: Family<OpLabels, Histogram>,
    /// Addresses allocated, per family.
    pub allocated: Family<FamilyLabels, Gauge>,
    /// Usable addresses in the node pool, per family (saturates at i64::MAX for IPv6).
    pub pool_size: Family<FamilyLabels, Gauge>,
    /// `birdc configure` calls that succeeded.
    pub bird_reloads: Counter,
    /// `birdc configure` calls (or config writes) that failed.
    pub bird_failures: Counter,
    /// Durable store write latency.
    pub store_write_seconds: Histogram,
    /// 1 for each BGP session that is Established, 0 for one that is not (Kubernetes mode).
    pub bgp_session_established: Family<SessionLabels, Gauge>,
    /// NetworkPolicy rulesets applied, by kind.
    pub policy_applies: Family<ApplyLabels, Counter>,
    /// NetworkPolicy applies that failed (build or `nft -f`).
    pub policy_apply_errors: Counter,
    /// Time to build and apply a NetworkPolicy ruleset.
    pub policy_apply_seconds: Histogram,
    /// Allow rules in the applied ruleset's per-pod chains.
    pub policy_rules: Gauge,
    /// Local pods isolated, per direction, in the applied ruleset.
    pub policy_isolated_pods: Family<DirectionLabels, Gauge>,
    /// Policies of both kinds not enforced as written (left out, or enforced fail-closed).
    pub policy_invalid: Gauge,
    /// Logged policy decisions, per deciding policy and verdict.
    pub policy_decisions: Family<DecisionLabels, Counter>,
    /// Logged packets not written as a line: over a pod's rate, or dropped by the kernel
    /// because the reader fell behind (`reason`).
    pub policy_decisions_unwritten: Family<ReasonLabels, Counter>,
}

/// Labels of a logged policy decision.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    /// The deciding policy (`networkpolicy NS/NAME`, `clusternetworkpolicy NAME`), or `none`
    /// when the connection was dropped because no policy selecting the pod allows it.
    pub policy: String,
    /// `allow` or `deny`.
    pub verdict: String,
}

/// Labels carrying a reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Why.
    pub reason: String,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("flock");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "cni_requests",
            "CNI requests by operation and outcome",
            requests.clone(),
        );
        let request_seconds = Family::<OpLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0005, 2.0, 16))
        });
        registry.register(
            "cni_request_duration_seconds",
            "CNI request latency by operation",
            request_seconds.clone(),
        );
        let allocated = Family::<FamilyLabels, Gauge>::default();
        registry.register(
            "allocations",
            "Addresses allocated to pods, per family",
            allocated.clone(),
        );
        let pool_size = Family::<FamilyLabels, Gauge>::default();
        registry.register(
            "pool_size",
            "Usable addresses in the node pool, per family",
            pool_size.clone(),
        );
        let bird_reloads = Counter::default();
        registry.register(
            "bird_reloads",
            "Successful BIRD reconfigurations",
            bird_reloads.clone(),
        );
        let bird_failures = Counter::default();
        registry.register(
            "bird_reload_failures",
            "Failed BIRD reconfigurations",
            bird_failures.clone(),
        );
        let store_write_seconds = Histogram::new(exponential_buckets(0.0001, 2.0, 16));
        registry.register(
            "store_write_duration_seconds",
            "Durable allocation store write latency",
            store_write_seconds.clone(),
        );
        let bgp_session_established = Family::<SessionLabels, Gauge>::default();
        registry.register(
            "bgp_session_established",
            "Whether each BGP session of the node is Established (1) or not (0)",
            bgp_session_established.clone(),
        );
        let policy_applies = Family::<ApplyLabels, Counter>::default();
        registry.register(
            "policy_applies",
            "NetworkPolicy rulesets applied, by kind (full table, set elements, none)",
            policy_applies.clone(),
        );
        let policy_apply_errors = Counter::default();
        registry.register(
            "policy_apply_errors",
            "NetworkPolicy rulesets that could not be built or applied",
            policy_apply_errors.clone(),
        );
        let policy_apply_seconds = Histogram::new(exponential_buckets(0.0005, 2.0, 16));
        registry.register(
            "policy_apply_duration_seconds",
            "Time to build and apply a NetworkPolicy ruleset (nft -f included)",
            policy_apply_seconds.clone(),
        );
        let policy_rules = Gauge::default();
        registry.register(
            "policy_rules",
            "Allow rules in the per-pod chains of the applied NetworkPolicy ruleset",
            policy_rules.clone(),
        );
        let policy_isolated_pods = Family::<DirectionLabels, Gauge>::default();
        registry.register(
            "policy_isolated_pods",
            "Local pods isolated by NetworkPolicy, per direction",
            policy_isolated_pods.clone(),
        );
        let policy_invalid = Gauge::default();
        registry.register(
            "policy_invalid",
            "Policies not enforced as written: left out, or enforced fail-closed (see the PoliciesValid condition)",
            policy_invalid.clone(),
        );
        let policy_decisions = Family::<DecisionLabels, Counter>::default();
        registry.register(
            "policy_decisions",
            "Logged policy decisions of new connections, per deciding policy and verdict",
            policy_decisions.clone(),
        );
        let policy_decisions_unwritten = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "policy_decisions_unwritten",
            "Logged packets not written as a line: over the pod's rate (rate), or lost by the kernel while the reader fell behind (lost)",
            policy_decisions_unwritten.clone(),
        );
        Metrics {
            registry,
            requests,
            request_seconds,
            allocated,
            pool_size,
            bird_reloads,
            bird_failures,
            store_write_seconds,
            bgp_session_established,
            policy_applies,
            policy_apply_errors,
            policy_apply_seconds,
            policy_rules,
            policy_isolated_pods,
            policy_invalid,
            policy_decisions,
            policy_decisions_unwritten,
        }
    }

    /// Records one successful NetworkPolicy apply.
    pub fn observe_policy_apply(&self, kind: &str, elapsed: Duration) {
        self.policy_applies
            .get_or_create(&ApplyLabels {
                kind: kind.to_owned(),
            })
            .inc();
        self.policy_apply_seconds.observe(elapsed.as_secs_f64());
    }

    /// Sets the gauges of the applied NetworkPolicy ruleset.
    pub fn set_policy_size(&self, size: PolicySize) {
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.policy_rules.set(gauge(size.rules));
        for (direction, n) in [("ingress", size.ingress_pods), ("egress", size.egress_pods)] {
            self.policy_isolated_pods
                .get_or_create(&DirectionLabels {
                    direction: direction.to_owned(),
                })
                .set(gauge(n));
        }
    }

    /// Sets the session gauges to exactly these sessions (neighbor, established).
    pub fn set_bgp_sessions<'a>(&self, sessions: impl IntoIterator<Item = (&'a str, bool)>) {
        self.bgp_session_established.clear();
        for (neighbor, up) in sessions {
            self.bgp_session_established
                .get_or_create(&SessionLabels {
                    neighbor: neighbor.to_owned(),
                })
                .set(i64::from(up));
        }
    }

    /// Records one finished CNI request.
    pub fn observe_request(&self, op: &str, outcome: &str, elapsed: Duration) {
        self.requests
            .get_or_create(&RequestLabels {
                op: op.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
        self.request_seconds
            .get_or_create(&OpLabels { op: op.to_owned() })
            .observe(elapsed.as_secs_f64());
    }

    /// Sets the allocation and pool gauges of a family.
    pub fn set_family(&self, family: &str, allocated: u64, pool_size: u128) {
        let labels = FamilyLabels {
            family: family.to_owned(),
        };
        self.allocated
            .get_or_create(&labels)
            .set(i64::try_from(allocated).unwrap_or(i64::MAX));
        self.pool_size
            .get_or_create(&labels)
            .set(i64::try_from(pool_size).unwrap_or(i64::MAX));
    }

    /// The metrics in Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("encoding metrics into a String cannot fail");
        out
    }
}

/// A part of the agent whose problem makes it not ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Component {
    /// BGP sessions (a neighbor's password Secret).
    Bgp,
    /// BIRD's configuration and reloads.
    Bird,
    /// Kernel state (blackholes, routes).
    Kernel,
    /// NetworkPolicy enforcement.
    NetworkPolicy,
    /// The node's NodeConfig.
    NodeConfig,
    /// The policy decision log (nfnetlink_log).
    PolicyLog,
    /// The guard of the announced Service ranges (`inet flock_services`).
    Services,
    /// The allocation store.
    Store,
}

impl Component {
    /// How `/readyz` and the NodeConfig status name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Component::Bgp => "bgp",
            Component::Bird => "bird",
            Component::Kernel => "kernel",
            Component::NetworkPolicy => "networkpolicy",
            Component::NodeConfig => "nodeconfig",
            Component::PolicyLog => "policy-log",
            Component::Services => "services",
            Component::Store => "store",
        }
    }
}

impl std::fmt::Display for Component {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What `/readyz` reports: each component's problem, if any, and notes that do not make the
/// agent unready (a policy enforced other than written).
#[derive(Debug, Default)]
pub struct Health {
    serving: AtomicBool,
    problems: Mutex<std::collections::BTreeMap<Component, String>>,
    notes: Mutex<std::collections::BTreeMap<Component, String>>,
}

impl Health {
    /// Marks the RPC server as serving (after start-up reconcile).
    pub fn set_serving(&self) {
        self.serving.store(true, Ordering::SeqCst);
    }

    /// Whether the RPC server serves.
    pub fn is_serving(&self) -> bool {
        self.serving.load(Ordering::SeqCst)
    }

    /// Sets or clears (`None`) the problem of a component.
    pub fn set_problem(&self, component: Component, problem: Option<String>) {
        set_or_clear(&self.problems, component, problem);
    }

    /// Sets or clears (`None`) the note of a component: shown by `/readyz`, ready or not.
    pub fn set_note(&self, component: Component, note: Option<String>) {
        set_or_clear(&self.notes, component, note);
    }

    /// Every note, one line each (`component: note`).
    pub fn notes(&self) -> Vec<String> {
        self.notes
            .lock()
            .expect("health lock")
            .iter()
            .map(|(c, n)| format!("{c}: {n}"))
            .collect()
    }

    /// The current problem of a component.
    pub fn problem(&self, component: Component) -> Option<String> {
        self.problems
            .lock()
            .expect("health lock")
            .get(&component)
            .cloned()
    }

    /// `Ok` when ready, else every problem, one per line.
    pub fn readiness(&self) -> Result<(), String> {
        let mut lines = Vec::new();
        if !self.is_serving() {
            lines.push("rpc: not serving yet (start-up reconcile)".to_owned());
        }
        for (component, problem) in self.problems.lock().expect("health lock").iter() {
            lines.push(format!("{component}: {problem}"));
        }
        if lines.is_empty() {
            Ok(())
        } else {
            Err(lines.join("\n"))
        }
    }
}

fn set_or_clear(
    map: &Mutex<std::collections::BTreeMap<Component, String>>,
    component: Component,
    text: Option<String>,
) {
    let mut m = map.lock().expect("health lock");
    match text {
        Some(text) => m.insert(component, text),
        None => m.remove(&component),
    };
}

#[derive(Clone)]
struct HttpState {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

/// The HTTP router of `/metrics`, `/healthz` and `/readyz`.
pub fn router(metrics: Arc<Metrics>, health: Arc<Health>) -> Router {
    Router::new()
        .route("/metrics", get(serve_metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(serve_readyz))
        .with_state(HttpState { metrics, health })
}

async fn serve_metrics(State(s): State<HttpState>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
}

async fn serve_readyz(State(s): State<HttpState>) -> impl IntoResponse {
    let (code, mut body) = match s.health.readiness() {
        Ok(()) => (StatusCode::OK, "ok\n".to_owned()),
        Err(problems) => (StatusCode::SERVICE_UNAVAILABLE, format!("{problems}\n")),
    };
    for note in s.health.notes() {
        body.push_str(&format!("note: {note}\n"));
    }
    (code, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_requests_and_families() {
        let m = Metrics::new();
        m.observe_request("ADD", "ok", Duration::from_millis(2));
        m.set_family("ipv4", 3, 253);
        m.bird_reloads.inc();
        let text = m.encode();
        assert!(
            text.contains("flock_cni_requests_total{op=\"ADD\",outcome=\"ok\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("flock_allocations{family=\"ipv4\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("flock_pool_size{family=\"ipv4\"} 253"),
            "{text}"
        );
        assert!(text.contains("flock_bird_reloads_total 1"), "{text}");
        m.set_bgp_sessions([("2001:db8::fe", true), ("10.0.0.254", false)]);
        let text = m.encode();
        assert!(
            text.contains("flock_bgp_session_established{neighbor=\"2001:db8::fe\"} 1")
                && text.contains("flock_bgp_session_established{neighbor=\"10.0.0.254\"} 0"),
            "{text}"
        );
        // A neighbor removed from the NodeConfig leaves no gauge behind.
        m.set_bgp_sessions([("2001:db8::fe", true)]);
        assert!(!m.encode().contains("10.0.0.254"));
    }

    #[test]
    fn readiness_lists_every_problem() {
        let h = Health::default();
        assert!(h.readiness().is_err());
        h.set_serving();
        assert_eq!(h.readiness(), Ok(()));
        h.set_problem(Component::Bird, Some("birdc: connection refused".into()));
        assert_eq!(h.readiness(), Err("bird: birdc: connection refused".into()));
        h.set_problem(Component::Bird, None);
        assert_eq!(h.readiness(), Ok(()));
    }
}

/// The size of the applied NetworkPolicy ruleset, as the metrics show it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PolicySize {
    /// Pods isolated for ingress.
    pub ingress_pods: usize,
    /// Pods isolated for egress.
    pub egress_pods: usize,
    /// Allow rules over every per-pod chain.
    pub rules: usize,
    /// Named sets.
    pub sets: usize,
}
