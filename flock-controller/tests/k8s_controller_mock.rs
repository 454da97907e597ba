//! The pool controller's writes against a mocked API server: the Lease elector's requests
//! (create, wait, conditional take-over, a lost race), and `apply` (create, conditional
//! release, status, nothing at all once the lease is lost).

use std::time::Duration;

use flock_controller::apply::{Overlay, apply};
use flock_controller::lease::{LEASE_DURATION, LeaseElector};
use flock_controller::{NodeFacts, Observed, decide};
use flock_k8s_api::NodePool;
use flock_k8s_api::{NodeConfig, NodeConfigStatus};
use flock_testkit::kube_mock::*;
use kube::runtime::events::{Recorder, Reporter};
use serde_json::json;

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases";

fn lease(holder: &str, rv: &str, transitions: i32) -> serde_json::Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": { "name": "flock-controller", "namespace": "kube-system", "resourceVersion": rv },
        "spec": { "holderIdentity": holder, "leaseDurationSeconds": 15, "leaseTransitions": transitions }
    })
}

#[tokio::test]
async fn the_elector_creates_waits_and_takes_over_only_conditionally() {
    let (client, mut api) = mock_client();
    let mut me = LeaseElector::new(client, "kube-system", "flock-controller", "pod-b");

    // No lease: create it, holding it.
    let round = tokio::spawn(async move {
        let won = me.try_acquire_or_renew(Duration::ZERO).await;
        (me, won)
    });
    let (req, reply) = next_request(&mut api).await;
    assert_eq!(
        (req.method().as_str(), req.uri().path()),
        ("GET", format!("{LEASES}/flock-controller").as_str())
    );
    reply_error(reply, 404, "NotFound");
    let (req, reply) = next_request(&mut api).await;
    assert_eq!((req.method().as_str(), req.uri().path()), ("POST", LEASES));
    let body = body_json(req).await;
    assert_eq!(body["spec"]["holderIdentity"], "pod-b");
    assert_eq!(body["spec"]["leaseDurationSeconds"], 15);
    // Another candidate created it first.
    reply_error(reply, 409, "AlreadyExists");
    let (mut me, won) = round.await.expect("task");
    assert!(!won.expect("a lost race is no error"));

    // Held by pod-a: first sight, then still the same version a full duration later.
    for (at, expect_write) in [
        (Duration::from_secs(1), false),
        (Duration::from_secs(1) + LEASE_DURATION, true),
    ] {
        let round = tokio::spawn(async move {
            let won = me.try_acquire_or_renew(at).await;
            (me, won)
        });
        let (_req, reply) = next_request(&mut api).await;
        reply_json(reply, &lease("pod-a", "41", 3));
        if expect_write {
            let (req, reply) = next_request(&mut api).await;
            assert_eq!(
                (req.method().as_str(), req.uri().path()),
                ("PUT", format!("{LEASES}/flock-controller").as_str())
            );
            let body = body_json(req).await;
            assert_eq!(
                body["metadata"]["resourceVersion"], "41",
                "conditional on the version read"
            );
            assert_eq!(body["spec"]["holderIdentity"], "pod-b");
            assert_eq!(body["spec"]["leaseTransitions"], 4);
            // pod-a renewed just before: the take-over loses, nobody holds it twice.
            reply_error(reply, 409, "Conflict");
        }
        let (back, won) = round.await.expect("task");
        me = back;
        assert!(!won.expect("no error"), "at {at:?}");
    }
}

fn pool() -> NodePool {
    serde_yaml::from_str(
        "apiVersion: flock.fritzlab.net/v1alpha1
kind: NodePool
metadata: { name: rack1, uid: pool-uid }
spec: { cidr6: \"2001:db8:1::/48\", nodePrefix6: 64, nodeSelector: { matchLabels: { rack: r1 } } }
",
    )
    .expect("pool")
}

#[tokio::test]
async fn apply_creates_owned_node_configs_and_releases_conditionally() {
    let pools = vec![pool()];
    let mut gone = NodeConfig::new("old", Default::default());
    gone.metadata.uid = Some("uid-old".into());
    gone.metadata.resource_version = Some("77".into());
    gone.metadata.labels = Some(
        [
            (
                "app.kubernetes.io/managed-by".to_owned(),
                "flock-controller".to_owned(),
            ),
            ("flock.fritzlab.net/pool".to_owned(), "rack1".to_owned()),
        ]
        .into(),
    );
    gone.spec.cidr6 = Some("2001:db8:1::/64".into());
    gone.status = Some(NodeConfigStatus::default());
    let nodes = [NodeFacts {
        name: "new".into(),
        labels: [("rack".to_owned(), "r1".to_owned())].into(),
        internal_ipv4: None,
    }];
    let configs = [gone];
    let decision = decide(
        &Observed {
            pools: &pools,
            nodes: &nodes,
            node_configs: &configs,
            service_cidrs: &[],
            release_grace: flock_controller::DEFAULT_RELEASE_GRACE,
            podless: &Default::default(),
        },
        "2026-01-01T00:00:00Z".parse().expect("time"),
    );
    assert_eq!((decision.create.len(), decision.release.len()), (1, 1));

    let (client, mut api) = mock_client();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "flock-controller".into(),
            instance: None,
        },
    );
    let task = tokio::spawn(async move {
        let mut overlay = Overlay::default();
        let result = apply(&client, &recorder, &pools, decision, &mut overlay, &|| true).await;
        (result, overlay)
    });
    let nodeconfigs = "/apis/flock.fritzlab.net/v1alpha1/nodeconfigs";
    let (req, reply) = next_request(&mut api).await;
    assert_eq!(
        (req.method().as_str(), req.uri().path()),
        ("POST", nodeconfigs)
    );
    assert_eq!(
        query_param(&req, "fieldManager").as_deref(),
        Some("flock-controller")
    );
    let body = body_json(req).await;
    assert_eq!(body["metadata"]["name"], "new");
    assert_eq!(
        body["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "flock-controller"
    );
    // The released prefix is not handed out again in the same reconcile.
    assert_eq!(body["spec"]["cidr6"], "2001:db8:1:1::/64");
    let mut created = body.clone();
    created["metadata"]["uid"] = json!("uid-new");
    reply_json(reply, &created);

    let (req, reply) = next_request(&mut api).await;
    assert_eq!(
        (req.method().as_str(), req.uri().path()),
        ("DELETE", format!("{nodeconfigs}/old").as_str())
    );
    let body = body_json(req).await;
    assert_eq!(
        body["preconditions"],
        json!({ "uid": "uid-old", "resourceVersion": "77" })
    );
    reply_json(
        reply,
        &json!({ "apiVersion": "v1", "kind": "Status", "status": "Success" }),
    );

    let (req, reply) = next_request(&mut api).await;
    assert_eq!(
        (req.method().as_str(), req.uri().path()),
        (
            "PATCH",
            "/apis/flock.fritzlab.net/v1alpha1/nodepools/rack1/status"
        )
    );
    let body = body_json(req).await;
    // Counted before the release takes effect (it may yet fail); the next reconcile, woken
    // by the delete, counts one.
    assert_eq!(body["status"]["nodes"], 2);
    assert_eq!(body["status"]["ipv6"]["inUse"], "2");
    reply_json(
        reply,
        &json!({ "apiVersion": "flock.fritzlab.net/v1alpha1", "kind": "NodePool", "metadata": { "name": "rack1" }, "spec": { "cidr6": "2001:db8:1::/48", "nodePrefix6": 64 } }),
    );

    // Two events (assigned, released), recorded against the pool.
    for reason in ["PrefixAssigned", "PrefixReleased"] {
        let (req, reply) = next_request(&mut api).await;
        assert_eq!(
            (req.method().as_str(), req.uri().path()),
            ("POST", "/apis/events.k8s.io/v1/namespaces/default/events")
        );
        let body = body_json(req).await;
        assert_eq!(body["reason"], reason);
        assert_eq!(body["regarding"]["kind"], "NodePool");
        assert_eq!(body["regarding"]["name"], "rack1");
        reply_json(reply, &body);
    }
    let (result, mut overlay) = task.await.expect("task");
    assert!(result.expect("led throughout").is_empty());
    // Until the cache shows them: "new" exists, "old" does not.
    let merged = overlay.merge(configs_named(&["old"]));
    let names: Vec<_> = merged
        .iter()
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    assert_eq!(names, ["new"]);
}

fn configs_named(names: &[&str]) -> Vec<NodeConfig> {
    names
        .iter()
        .map(|n| {
            let mut nc = NodeConfig::new(n, Default::default());
            nc.metadata.uid = Some(format!("uid-{n}"));
            nc
        })
        .collect()
}

#[tokio::test]
async fn apply_writes_nothing_once_the_lease_is_lost() {
    let pools = vec![pool()];
    let nodes = [NodeFacts {
        name: "new".into(),
        labels: [("rack".to_owned(), "r1".to_owned())].into(),
        internal_ipv4: None,
    }];
    let decision = decide(
        &Observed {
            pools: &pools,
            nodes: &nodes,
            node_configs: &[],
            service_cidrs: &[],
            release_grace: flock_controller::DEFAULT_RELEASE_GRACE,
            podless: &Default::default(),
        },
        "2026-01-01T00:00:00Z".parse().expect("time"),
    );
    assert_eq!(decision.create.len(), 1);
    let (client, mut api) = mock_client();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "flock-controller".into(),
            instance: None,
        },
    );
    let mut overlay = Overlay::default();
    let err = apply(&client, &recorder, &pools, decision, &mut overlay, &|| {
        false
    })
    .await
    .expect_err("not leading");
    assert!(err.to_string().contains("lost its lease"), "{err}");
    assert!(
        tokio::time::timeout(Duration::from_millis(200), api.next_request())
            .await
            .is_err(),
        "no request at all"
    );
    assert!(overlay.is_empty());
}
