//! The pool controller's decisions under random histories, against a simulated API server:
//! Nodes join and leave, agents report allocations, pods of gone nodes are collected, pools
//! change their BGP settings, time passes, a hand-written NodeConfig sits among the pools'
//! prefixes, and the leader changes (the new one lists everything afresh, as `run` does after
//! it wins the lease; in between, its NodeConfig cache lags and its own writes are overlaid).
//!
//! Properties: a reconcile applied is a fixed point (the next one on the same facts writes
//! nothing), or the one after it when it released a prefix (the pool's status and a waiting
//! node's prefix follow once the delete is seen: a conditional delete may yet fail); the
//! hand-written NodeConfig is never created over, updated or deleted; a prefix is released
//! only when its Node is gone and its NodeConfig reports no allocations, or the release grace
//! has passed since it was marked gone and no pod is bound to the node; no prefix is ever on
//! two nodes, whoever leads.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::time::Duration;

use flock_controller::{
    GONE_SINCE_ANNOTATION, NodeFacts, Observed, Overlay, Reconcile, decide, owned_pool,
};
use flock_k8s_api::{NodeConfig, NodeConfigStatus, NodePool};
use ipnet::IpNet;
use k8s_openapi::jiff::Timestamp;
use proptest::prelude::*;

const GRACE: Duration = Duration::from_secs(600);
const RACKS: [&str; 2] = ["r1", "r2"];
const HAND: &str = "hand";

/// Pool `rack`: 4 IPv6 /64s of a /62 and 4 IPv4 /26s of a /24, for the nodes of the rack.
fn pool(rack: usize, asn: u32) -> NodePool {
    let yaml = format!(
        "apiVersion: flock.fritzlab.net/v1alpha1
kind: NodePool
metadata: {{ name: pool{rack}, generation: 1 }}
spec:
  cidr6: 2001:db8:{rack}::/62
  nodePrefix6: 64
  cidr4: 10.9.{rack}.0/24
  nodePrefix4: 26
  nodeSelector: {{ matchLabels: {{ rack: {} }} }}
  bgp:
    asn: {asn}
    neighbors: [ {{ address: \"2001:db8:ffff::1\", asn: 65000 }} ]
",
        RACKS[rack]
    );
    serde_yaml::from_str(&yaml).expect("a NodePool")
}

/// A hand-written NodeConfig holding the first prefixes of pool 0.
fn hand_written() -> NodeConfig {
    serde_yaml::from_str(
        "apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
metadata: { name: hand, uid: uid-hand, resourceVersion: \"1\" }
spec: { cidr6: \"2001:db8:0::/64\", cidr4: 10.9.0.0/26 }
",
    )
    .expect("a NodeConfig")
}

/// One thing that happens to the cluster.
#[derive(Debug, Clone)]
enum Op {
    /// Node `i` (of rack `i % 2`, or of no rack when `i` is 7) is created.
    Join(u8),
    /// Node `i` is deleted.
    Leave(u8),
    /// Node `i`'s agent reports `n` allocations in its NodeConfig's status.
    Report(u8, u64),
    /// The pods bound to node `i` are gone (the pod garbage collector, for a deleted Node).
    PodsGone(u8),
    /// Time passes.
    Wait(u64),
    /// Pool `p` gets another ASN.
    Asn(u8, u32),
    /// The leader reconciles on its caches.
    Reconcile,
    /// The leader's NodeConfig cache catches up with the API server.
    Catch,
    /// Another instance wins the lease: it lists everything afresh.
    NewLeader,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u8..8).prop_map(Op::Join),
        2 => (0u8..8).prop_map(Op::Leave),
        2 => (0u8..8, 0u64..3).prop_map(|(i, n)| Op::Report(i, n)),
        1 => (0u8..8).prop_map(Op::PodsGone),
        2 => (1u64..400).prop_map(Op::Wait),
        1 => (0u8..2, 65001u32..65004).prop_map(|(p, a)| Op::Asn(p, a)),
        6 => Just(Op::Reconcile),
        2 => Just(Op::Catch),
        1 => Just(Op::NewLeader),
    ]
}

fn node_name(i: u8) -> String {
    format!("node{i}")
}

/// The API server, the nodes and their pods, and the leader's caches.
#[derive(Clone)]
struct World {
    pools: Vec<NodePool>,
    nodes: BTreeMap<String, NodeFacts>,
    /// Nodes to which a pod is bound.
    with_pods: BTreeSet<String>,
    configs: BTreeMap<String, NodeConfig>,
    version: u64,
    now: Timestamp,
    /// The leader's NodeConfig cache (the other caches are taken as fresh) and its overlay.
    cache: Vec<NodeConfig>,
    overlay: Overlay,
}

impl World {
    fn new() -> World {
        let hand = hand_written();
        World {
            pools: vec![pool(0, 65001), pool(1, 65001)],
            nodes: BTreeMap::new(),
            with_pods: BTreeSet::new(),
            configs: BTreeMap::from([(HAND.to_owned(), hand.clone())]),
            version: 10,
            now: "2026-01-02T03:04:05Z".parse().expect("time"),
            cache: vec![hand],
            overlay: Overlay::default(),
        }
    }

    fn bump(&mut self) -> String {
        self.version += 1;
        self.version.to_string()
    }

    fn decide(&mut self) -> Reconcile {
        let podless: BTreeSet<String> = self
            .configs
            .keys()
            .filter(|n| !self.nodes.contains_key(*n) && !self.with_pods.contains(*n))
            .cloned()
            .collect();
        let nodes: Vec<NodeFacts> = self.nodes.values().cloned().collect();
        let node_configs = self.overlay.merge(self.cache.clone());
        decide(
            &Observed {
                pools: &self.pools,
                nodes: &nodes,
                node_configs: &node_configs,
                service_cidrs: &[],
                release_grace: GRACE,
                podless: &podless,
            },
            self.now,
        )
    }

    /// Writes `r` as the API server would take it (creates never replace, updates and
    /// deletes need the version they were computed from), checking every property on the way.
    fn apply(&mut self, r: &Reconcile) -> Result<(), TestCaseError> {
        for nc in &r.create {
            let name = nc.metadata.name.clone().expect("name");
            prop_assert_ne!(&name, HAND, "a create over the hand-written NodeConfig");
            if self.configs.contains_key(&name) {
                continue; // 409
            }
            let mut stored = nc.clone();
            stored.metadata.uid = Some(format!("uid-{}", self.version));
            stored.metadata.resource_version = Some(self.bump());
            self.configs.insert(name, stored.clone());
            self.overlay.created(stored);
        }
        for nc in &r.update {
            let name = nc.metadata.name.clone().expect("name");
            prop_assert_ne!(&name, HAND, "an update of the hand-written NodeConfig");
            let Some(current) = self.configs.get(&name) else {
                continue; // 404
            };
            if current.metadata.resource_version != nc.metadata.resource_version {
                continue; // 409
            }
            prop_assert_eq!(&current.spec.cidr6, &nc.spec.cidr6, "prefixes never change");
            prop_assert_eq!(&current.spec.cidr4, &nc.spec.cidr4, "prefixes never change");
            let mut stored = nc.clone();
            stored.status = current.status.clone();
            stored.metadata.resource_version = Some(self.bump());
            self.configs.insert(name, stored);
        }
        for release in &r.release {
            prop_assert_ne!(
                &release.name,
                HAND,
                "a release of the hand-written NodeConfig"
            );
            let Some(current) = self.configs.get(&release.name) else {
                continue;
            };
            if current.metadata.uid != release.uid
                || current.metadata.resource_version != release.resource_version
            {
                continue; // 409: the precondition failed
            }
            prop_assert!(
                !self.nodes.contains_key(&release.name),
                "{} released while its Node exists",
                release.name
            );
            let held = current
                .status
                .as_ref()
                .map_or(0, |s| s.allocated6 + s.allocated4);
            if held > 0 {
                let since: Option<Timestamp> = current
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(GONE_SINCE_ANNOTATION))
                    .and_then(|t| t.parse().ok());
                let over = since.is_some_and(|t| {
                    self.now.as_second() - t.as_second() >= GRACE.as_secs() as i64
                });
                prop_assert!(
                    over && !self.with_pods.contains(&release.name),
                    "{} released with {held} allocations reported (gone since {since:?}, \
                     pods bound: {})",
                    release.name,
                    self.with_pods.contains(&release.name)
                );
            }
            self.configs.remove(&release.name);
            self.overlay.deleted(&release.name, release.uid.clone());
        }
        for (name, status) in &r.pool_status {
            if let Some(p) = self
                .pools
                .iter_mut()
                .find(|p| p.metadata.name.as_ref() == Some(name))
            {
                p.status = Some(status.clone());
            }
        }
        self.no_prefix_on_two_nodes()
    }

    fn no_prefix_on_two_nodes(&self) -> Result<(), TestCaseError> {
        let mut seen: Vec<(IpNet, &str)> = Vec::new();
        for (name, nc) in &self.configs {
            for cidr in [&nc.spec.cidr6, &nc.spec.cidr4].into_iter().flatten() {
                let cidr: IpNet = cidr.parse().expect("a CIDR");
                if let Some((other, owner)) = seen
                    .iter()
                    .find(|(c, _)| c.contains(&cidr.network()) || cidr.contains(&c.network()))
                {
                    prop_assert!(false, "{cidr} of {name} overlaps {other} of {owner}");
                }
                seen.push((cidr, name));
            }
        }
        Ok(())
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Join(i) => {
                let name = node_name(i);
                let labels = if i == 7 {
                    BTreeMap::new()
                } else {
                    BTreeMap::from([("rack".to_owned(), RACKS[usize::from(i % 2)].to_owned())])
                };
                self.nodes.insert(
                    name.clone(),
                    NodeFacts {
                        name: name.clone(),
                        labels,
                        internal_ipv4: Some(Ipv4Addr::new(192, 168, 0, i + 1)),
                    },
                );
                self.with_pods.insert(name);
            }
            Op::Leave(i) => {
                self.nodes.remove(&node_name(i));
            }
            Op::Report(i, n) => {
                let name = node_name(i);
                // Only a running agent reports; one whose Node is gone lost its token.
                if self.nodes.contains_key(&name) && self.configs.contains_key(&name) {
                    let version = self.bump();
                    let nc = self.configs.get_mut(&name).expect("present");
                    nc.status = Some(NodeConfigStatus {
                        allocated6: n,
                        allocated4: n,
                        ..NodeConfigStatus::default()
                    });
                    nc.metadata.resource_version = Some(version);
                }
            }
            Op::PodsGone(i) => {
                let name = node_name(i);
                if !self.nodes.contains_key(&name) {
                    self.with_pods.remove(&name);
                }
            }
            Op::Wait(s) => {
                self.now = Timestamp::from_second(self.now.as_second() + s as i64).expect("time");
            }
            Op::Asn(p, asn) => {
                let pool = &mut self.pools[usize::from(p)];
                pool.spec.bgp.as_mut().expect("bgp").asn = asn;
            }
            Op::Reconcile => {
                let r = self.decide();
                self.apply(&r)?;
            }
            Op::Catch => self.cache = self.configs.values().cloned().collect(),
            Op::NewLeader => {
                self.cache = self.configs.values().cloned().collect();
                self.overlay = Overlay::default();
            }
        }
        Ok(())
    }
}

fn is_empty(r: &Reconcile) -> bool {
    r.create.is_empty() && r.update.is_empty() && r.release.is_empty() && r.pool_status.is_empty()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_controller_keeps_its_promises_whoever_leads(
        ops in proptest::collection::vec(op(), 1..80)
    ) {
        let mut world = World::new();
        for op in &ops {
            world.step(op)?;
            // Reconciles on fresh caches (a copy of the world: the leader's cache keeps its
            // lag), applied, reach a fixed point at once, or one reconcile later when one
            // released a prefix (counted free and handed out again only once its delete is
            // seen).
            if matches!(op, Op::Reconcile) {
                let mut fresh = world.clone();
                let mut rounds = Vec::new();
                loop {
                    fresh.step(&Op::NewLeader)?;
                    let r = fresh.decide();
                    if is_empty(&r) {
                        break;
                    }
                    let allowed = 1 + usize::from(rounds.iter().any(|r: &Reconcile| !r.release.is_empty()));
                    prop_assert!(
                        rounds.len() < allowed,
                        "no fixed point after {} reconciles: {rounds:?}, then {r:?}",
                        rounds.len()
                    );
                    fresh.apply(&r)?;
                    rounds.push(r);
                }
            }
        }
        let json = |nc: &NodeConfig| serde_json::to_value(nc).expect("json");
        prop_assert_eq!(
            json(&world.configs[HAND]),
            json(&hand_written()),
            "the hand-written NodeConfig changed"
        );
        prop_assert!(
            world.configs.values().all(|nc| nc.metadata.name.as_deref() == Some(HAND)
                || owned_pool(nc).is_some()),
            "only the controller's own and the hand-written NodeConfig exist"
        );
    }
}
