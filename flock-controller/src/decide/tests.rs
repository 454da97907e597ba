//! The controller's decisions over plain data: join, restart, pool changes, release,
//! hand-written NodeConfigs and every problem condition.

use super::*;
use flock_k8s_api::NodeConfigStatus;
use flock_k8s_api::NodePoolSpec;

fn pool(name: &str, cidr6: &str, rack: &str, asn: u32) -> NodePool {
    let yaml = format!(
        "apiVersion: flock.fritzlab.net/v1alpha1
kind: NodePool
metadata: {{ name: {name}, generation: 1 }}
spec:
  cidr6: {cidr6}
  nodePrefix6: 64
  nodeSelector: {{ matchLabels: {{ rack: {rack} }} }}
  ipAlgo: workload
  bgp:
    asn: {asn}
    neighbors: [ {{ address: \"2001:db8:ffff::1\", asn: 65000, bfd: true }} ]
"
    );
    serde_yaml::from_str(&yaml).expect("a NodePool")
}

fn node(name: &str, rack: &str, ip: Option<[u8; 4]>) -> NodeFacts {
    NodeFacts {
        name: name.into(),
        labels: BTreeMap::from([("rack".to_owned(), rack.to_owned())]),
        internal_ipv4: ip.map(Ipv4Addr::from),
    }
}

fn now() -> Timestamp {
    "2026-01-02T03:04:05Z".parse().expect("time")
}

fn run(pools: &[NodePool], nodes: &[NodeFacts], ncs: &[NodeConfig]) -> Reconcile {
    run_with(pools, nodes, ncs, &[])
}

fn run_with(
    pools: &[NodePool],
    nodes: &[NodeFacts],
    ncs: &[NodeConfig],
    service_cidrs: &[String],
) -> Reconcile {
    decide(&observed(pools, nodes, ncs, service_cidrs), now())
}

/// A reconcile at `at`, with the default release grace (10 min) and `podless` the gone nodes
/// no pod is bound to.
fn run_at(
    pools: &[NodePool],
    nodes: &[NodeFacts],
    ncs: &[NodeConfig],
    podless: &[&str],
    at: Timestamp,
) -> Reconcile {
    let podless = podless.iter().map(|n| (*n).to_owned()).collect();
    decide(
        &Observed {
            podless: &podless,
            ..observed(pools, nodes, ncs, &[])
        },
        at,
    )
}

fn observed<'a>(
    pools: &'a [NodePool],
    nodes: &'a [NodeFacts],
    node_configs: &'a [NodeConfig],
    service_cidrs: &'a [String],
) -> Observed<'a> {
    static NONE: BTreeSet<String> = BTreeSet::new();
    Observed {
        pools,
        nodes,
        node_configs,
        service_cidrs,
        release_grace: super::super::DEFAULT_RELEASE_GRACE,
        podless: &NONE,
    }
}

/// What the API server would hold after the creates: uid and version set.
fn stored(mut created: Vec<NodeConfig>) -> Vec<NodeConfig> {
    for (i, nc) in created.iter_mut().enumerate() {
        nc.metadata.uid = Some(format!("uid-{i}"));
        nc.metadata.resource_version = Some(format!("{}", 100 + i));
    }
    created
}

/// The pools with the status the reconcile wrote.
fn with_status(mut pools: Vec<NodePool>, r: &Reconcile) -> Vec<NodePool> {
    for p in &mut pools {
        if let Some((_, s)) = r
            .pool_status
            .iter()
            .find(|(n, _)| Some(n) == p.metadata.name.as_ref())
        {
            p.status = Some(s.clone());
        }
    }
    pools
}

fn cond<'s>(
    s: &'s NodePoolStatus,
    kind: &str,
) -> Option<&'s k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    s.conditions.iter().find(|c| c.type_ == kind)
}

#[test]
fn joining_nodes_get_owned_node_configs_and_a_restart_reassigns_nothing() {
    let pools = vec![pool("rack1", "2001:db8:1::/48", "r1", 64512)];
    let nodes = [
        node("b", "r1", None),
        node("a", "r1", Some([192, 0, 2, 10])),
        node("x", "r9", None),
    ];
    let r = run(&pools, &nodes, &[]);
    assert_eq!(r.create.len(), 2);
    let a = &r.create[0];
    assert_eq!(a.metadata.name.as_deref(), Some("a"));
    assert_eq!(owned_pool(a), Some("rack1"));
    assert_eq!(a.spec.cidr6.as_deref(), Some("2001:db8:1::/64"));
    assert_eq!(a.spec.bgp.as_ref().unwrap().router_id, "192.0.2.10");
    assert_eq!(
        a.metadata.annotations.as_ref().unwrap()[IP_ALGO_ANNOTATION],
        "workload"
    );
    assert_eq!(r.create[1].spec.cidr6.as_deref(), Some("2001:db8:1:1::/64"));
    // Router ID from the prefix when the node has no IPv4: 0.1.0.1 for 2001:db8:1:1::/64.
    assert_eq!(r.create[1].spec.bgp.as_ref().unwrap().router_id, "0.1.0.1");
    for nc in &r.create {
        nc.settings().expect("every NodeConfig written is valid");
    }
    assert_eq!(
        r.events.iter().map(|e| e.note.as_str()).collect::<Vec<_>>(),
        [
            "NodePool rack1: node a gets 2001:db8:1::/64",
            "NodePool rack1: node b gets 2001:db8:1:1::/64"
        ]
    );
    let (_, status) = &r.pool_status[0];
    assert_eq!(status.nodes, 2);
    let ipv6 = status.ipv6.as_ref().expect("IPv6 counts");
    assert_eq!(ipv6.in_use, "2");
    assert_eq!(ipv6.free, "65534");
    let ready = cond(status, "Ready").unwrap();
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("True", "PoolReady")
    );

    // A restarted controller (or a new leader) reads the NodeConfigs: nothing to do.
    let pools = with_status(pools, &r);
    let again = run(&pools, &nodes, &stored(r.create));
    assert!(again.create.is_empty() && again.update.is_empty() && again.release.is_empty());
    assert!(again.pool_status.is_empty(), "{:?}", again.pool_status);
    assert!(again.events.is_empty());
}

#[test]
fn a_hand_written_node_config_is_never_touched_and_its_cidr_never_handed_out() {
    let pools = vec![pool("rack1", "2001:db8:1::/48", "r1", 64512)];
    let mut manual = NodeConfig::new("manual", Default::default());
    manual.spec.cidr6 = Some("2001:db8:1::/63".into());
    let nodes = [node("manual", "r1", None), node("a", "r1", None)];
    let r = run(&pools, &nodes, std::slice::from_ref(&manual));
    assert_eq!(r.create.len(), 1);
    assert_eq!(r.create[0].metadata.name.as_deref(), Some("a"));
    assert_eq!(r.create[0].spec.cidr6.as_deref(), Some("2001:db8:1:2::/64"));
    // Its node gone, its status empty: still never released or updated.
    let r = run(&pools, &[], std::slice::from_ref(&manual));
    assert!(r.release.is_empty() && r.update.is_empty() && r.create.is_empty());
    // A label alone does not make it the controller's.
    manual.metadata.labels = Some(BTreeMap::from([(
        POOL_LABEL.to_owned(),
        "rack1".to_owned(),
    )]));
    assert_eq!(owned_pool(&manual), None);
}

#[test]
fn pool_bgp_changes_reach_every_node_and_prefixes_stay() {
    let pools = vec![pool("rack1", "2001:db8:1::/48", "r1", 64512)];
    let nodes = [node("a", "r1", None), node("b", "r1", None)];
    let ncs = stored(run(&pools, &nodes, &[]).create);
    let changed = vec![pool("rack1", "2001:db8:1::/48", "r1", 64999)];
    let r = run(&changed, &nodes, &ncs);
    assert!(r.create.is_empty() && r.release.is_empty());
    assert_eq!(r.update.len(), 2);
    for (u, before) in r.update.iter().zip(&ncs) {
        assert_eq!(u.spec.bgp.as_ref().unwrap().peering.asn, 64999);
        assert_eq!(u.spec.cidr6, before.spec.cidr6, "the prefix never moves");
        assert_eq!(
            u.metadata.resource_version, before.metadata.resource_version,
            "conditional on what was read"
        );
        assert_eq!(u.metadata.uid, before.metadata.uid);
    }
    // The pool drops its ip-algo: the annotation goes, other annotations stay.
    let mut ncs = ncs;
    ncs[0]
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("keep".into(), "me".into());
    let mut plain = pool("rack1", "2001:db8:1::/48", "r1", 64512);
    plain.spec.ip_algo = None;
    let r = run(&[plain], &nodes, &ncs);
    assert_eq!(r.update.len(), 2);
    assert_eq!(
        r.update[0].metadata.annotations,
        Some(BTreeMap::from([("keep".to_owned(), "me".to_owned())]))
    );
    assert_eq!(r.update[1].metadata.annotations, None);
}

/// A pool that follows the cluster's ServiceCIDRs gives each node its own `clusterIPCIDRs`
/// and every ServiceCIDR range besides; a ServiceCIDR created or deleted updates each node,
/// and a pool that does not follow them never sees them.
#[test]
fn a_pool_following_service_cidrs_gives_their_ranges_to_every_node() {
    let mut following = pool("rack1", "2001:db8:1::/48", "r1", 64512);
    following.spec.services = Some(
        serde_yaml::from_str(
            "{ loadBalancerCIDRs: [\"2001:db8:5::/112\"], clusterIPCIDRs: [\"fd97::/108\"], \
             followServiceCIDRs: true }",
        )
        .expect("services"),
    );
    let nodes = [node("a", "r1", None), node("b", "r1", None)];
    let default_cidrs = vec!["10.96.0.0/16".to_owned(), "fd97::/108".to_owned()];
    let first = run_with(
        std::slice::from_ref(&following),
        &nodes,
        &[],
        &default_cidrs,
    );
    assert_eq!(first.create.len(), 2);
    for nc in &first.create {
        let services = nc.spec.services.as_ref().expect("services");
        // The pool's own range first; the ServiceCIDR's fd97::/108 is not repeated.
        assert_eq!(services.cluster_ip_cidrs, ["fd97::/108", "10.96.0.0/16"]);
        assert_eq!(services.load_balancer_cidrs, ["2001:db8:5::/112"]);
        let ranges = nc.settings().expect("a valid NodeConfig").services;
        assert_eq!(ranges.cluster_ips.len(), 2);
    }
    let ncs = stored(first.create);
    let same = run_with(
        std::slice::from_ref(&following),
        &nodes,
        &ncs,
        &default_cidrs,
    );
    assert!(same.update.is_empty(), "{:?}", same.update);

    // A second ServiceCIDR: every node announces it too.
    let mut more = default_cidrs.clone();
    more.push("2001:db8:c6::/112".to_owned());
    let grown = run_with(std::slice::from_ref(&following), &nodes, &ncs, &more);
    assert_eq!(grown.update.len(), 2);
    for nc in &grown.update {
        assert_eq!(
            nc.spec.services.as_ref().unwrap().cluster_ip_cidrs,
            ["fd97::/108", "10.96.0.0/16", "2001:db8:c6::/112"]
        );
        let before = ncs
            .iter()
            .find(|b| b.metadata.name == nc.metadata.name)
            .expect("the same node");
        assert_eq!(nc.spec.cidr6, before.spec.cidr6, "the prefix never moves");
    }
    // Deleted again: back to the first.
    let shrunk = run_with(
        std::slice::from_ref(&following),
        &nodes,
        &stored(grown.update),
        &default_cidrs,
    );
    assert_eq!(shrunk.update.len(), 2);
    assert_eq!(
        shrunk.update[0]
            .spec
            .services
            .as_ref()
            .unwrap()
            .cluster_ip_cidrs,
        ["fd97::/108", "10.96.0.0/16"]
    );

    // Without followServiceCIDRs the ServiceCIDRs change nothing.
    let mut fixed = following.clone();
    fixed.spec.services.as_mut().unwrap().follow_service_cidrs = false;
    let r = run_with(std::slice::from_ref(&fixed), &nodes, &[], &more);
    for nc in &r.create {
        assert_eq!(
            nc.spec.services.as_ref().unwrap().cluster_ip_cidrs,
            ["fd97::/108"]
        );
    }
}

#[test]
fn a_prefix_is_released_only_after_the_node_is_gone_and_reports_no_allocations() {
    let pools = vec![pool("rack1", "2001:db8:1::/48", "r1", 64512)];
    let mut ncs = stored(run(&pools, &[node("a", "r1", None)], &[]).create);
    ncs[0].status = Some(NodeConfigStatus {
        allocated6: 3,
        ..Default::default()
    });
    // Node present: nothing, whatever the status.
    assert!(
        run(&pools, &[node("a", "r1", None)], &ncs)
            .release
            .is_empty()
    );
    // Node gone, pods still reported: kept, and the pool says why.
    let r = run(&pools, &[], &ncs);
    assert!(r.release.is_empty());
    let pending = cond(&r.pool_status[0].1, "ReleasePending").unwrap();
    assert!(
        pending
            .message
            .contains("a (2001:db8:1::/64: 3 pod address(es) still reported; gone since"),
        "{}",
        pending.message
    );
    // A new node does not get that prefix meanwhile.
    let r = run(&pools, &[node("b", "r1", None)], &ncs);
    assert_eq!(r.create[0].spec.cidr6.as_deref(), Some("2001:db8:1:1::/64"));
    // Drained: released, conditional on what was read.
    ncs[0].status = Some(NodeConfigStatus::default());
    let r = run(&pools, &[], &ncs);
    assert_eq!(
        r.release,
        [Release {
            name: "a".into(),
            uid: Some("uid-0".into()),
            resource_version: Some("100".into()),
            pool: "rack1".into(),
            prefixes: "2001:db8:1::/64".into(),
        }]
    );
    assert_eq!(r.events[0].reason, "PrefixReleased");
}

#[test]
fn a_gone_node_that_still_reports_pods_is_released_after_the_grace_once_none_is_bound() {
    let pools = vec![pool("rack1", "2001:db8:1::/48", "r1", 64512)];
    let mut ncs = stored(run(&pools, &[node("a", "r1", None)], &[]).create);
    ncs[0].status = Some(NodeConfigStatus {
        allocated6: 3,
        ..Default::default()
    });
    // Gone: marked with the time it was first seen gone, kept.
    let r = run_at(&pools, &[], &ncs, &["a"], now());
    assert!(r.release.is_empty());
    let [marked] = r.update.as_slice() else {
        panic!("one update, the mark: {:?}", r.update);
    };
    let mark = marked.metadata.annotations.as_ref().unwrap();
    assert_eq!(mark[GONE_SINCE_ANNOTATION], now().to_string());
    assert_eq!(marked.spec, ncs[0].spec);
    ncs[0].metadata.annotations = marked.metadata.annotations.clone();
    let later = |s: i64| now() + k8s_openapi::jiff::SignedDuration::from_secs(s);
    // Within the grace: kept, even with no pod bound (a node off for a reboot), and the mark
    // is not rewritten.
    let r = run_at(&pools, &[], &ncs, &["a"], later(599));
    assert!(r.release.is_empty() && r.update.is_empty(), "{r:?}");
    assert_eq!(
        pod_checks_due(&ncs, &[], Duration::from_secs(600), later(599)),
        Vec::<String>::new()
    );
    // Past it: the pods are looked for, and while one is bound the prefix stays.
    assert_eq!(
        pod_checks_due(&ncs, &[], Duration::from_secs(600), later(600)),
        ["a"]
    );
    assert!(
        run_at(&pools, &[], &ncs, &[], later(600))
            .release
            .is_empty()
    );
    // None bound: released, conditional on what was read, and the event says why.
    let r = run_at(&pools, &[], &ncs, &["a"], later(600));
    assert_eq!(r.release.len(), 1);
    assert_eq!(r.release[0].resource_version.as_deref(), Some("100"));
    assert!(
        r.events[0]
            .note
            .contains("no pod has been bound to it for the release grace (10m"),
        "{}",
        r.events[0].note
    );
    // The node is back before that: the mark goes, nothing else changes, nothing is listed.
    let r = run_at(&pools, &[node("a", "r1", None)], &ncs, &[], later(30));
    let [back] = r.update.as_slice() else {
        panic!("one update, the mark removed: {:?}", r.update);
    };
    assert!(
        back.metadata
            .annotations
            .as_ref()
            .is_none_or(|a| !a.contains_key(GONE_SINCE_ANNOTATION))
    );
    assert_eq!(back.spec, ncs[0].spec);
    assert!(r.release.is_empty());
    assert!(pod_checks_due(&ncs, &[node("a", "r1", None)], Duration::ZERO, later(30)).is_empty());
}

#[test]
fn problems_become_conditions_and_one_warning_each_until_they_change() {
    let pools = vec![
        pool("rack1", "2001:db8:1::/48", "r1", 64512),
        pool("rack1b", "2001:db8:1:8000::/49", "r1b", 64512),
        pool("all", "2001:db8:2::/63", "r2", 64512),
        pool("twin", "2001:db8:3::/48", "r2", 64512),
    ];
    let mut small = pool("small", "2001:db8:4::/63", "r3", 64512);
    small.spec.node_prefix6 = 64;
    let mut broken = pool("broken", "2001:db8:5::/48", "r4", 64512);
    broken.spec = NodePoolSpec {
        node_prefix4: Some(24),
        ..broken.spec
    };
    let pools: Vec<NodePool> = pools.into_iter().chain([small, broken]).collect();
    let nodes = [
        node("a", "r1", None),
        node("c", "r2", None),
        node("d", "r3", None),
        node("e", "r3", None),
        node("f", "r3", None),
        node("g", "r4", None),
    ];
    let r = run(&pools, &nodes, &[]);
    let created: Vec<&str> = r
        .create
        .iter()
        .filter_map(|n| n.metadata.name.as_deref())
        .collect();
    assert_eq!(
        created,
        ["d", "e"],
        "nothing from overlapping, ambiguous or invalid pools"
    );
    let status = |name: &str| &r.pool_status.iter().find(|(n, _)| n == name).unwrap().1;
    let expect = [
        (
            "rack1",
            "OverlappingPools",
            "NodePool rack1: IPv6 CIDR 2001:db8:1::/48 overlaps NodePool rack1b's 2001:db8:1:8000::/49",
        ),
        (
            "all",
            "NodeInSeveralPools",
            "NodePool all: node c is selected by NodePools all, twin",
        ),
        (
            "small",
            "PoolExhausted",
            "NodePool small: no free /64 left in IPv6 CIDR 2001:db8:4::/63 (2 in use); node(s) f get no prefix",
        ),
        (
            "broken",
            "InvalidSpec",
            "NodePool broken: invalid NodePool: spec.cidr4 = \"\": required with spec.nodePrefix4 24",
        ),
    ];
    for (pool, kind, message) in expect {
        let s = status(pool);
        let ready = cond(s, "Ready").unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", kind),
            "{pool}"
        );
        let c = cond(s, kind).unwrap();
        assert!(c.message.starts_with(message), "{pool}: {}", c.message);
        assert_eq!(c.last_transition_time.0, now());
        let warnings: Vec<&PoolEvent> = r
            .events
            .iter()
            .filter(|e| e.pool == pool && e.warning)
            .collect();
        assert_eq!(warnings.len(), 1, "{pool}: {warnings:?}");
        assert_eq!(warnings[0].reason, kind);
    }
    // Next reconcile, same world: no new warning, no status write.
    let pools = with_status(pools, &r);
    let again = run(&pools, &nodes, &stored(r.create));
    assert!(
        again.events.iter().all(|e| !e.warning),
        "{:?}",
        again.events
    );
    assert!(again.pool_status.is_empty(), "{:?}", again.pool_status);
}
