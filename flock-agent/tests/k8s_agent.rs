//! Kubernetes mode with a real agent (in a stand-in node namespace, root) fed by a mocked API
//! server: NodeConfig events set, keep or withdraw the node's settings; the leak reconcile
//! releases the allocation of a pod deleted past the grace period and only that one; a CIDR
//! change keeps the old pods announced until they go.
#![cfg(feature = "root-tests")]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flock_agent::agent::{Agent, AgentParts};
use flock_agent::k8s::leaks::{LeakTracker, reconcile_once};
use flock_agent::k8s::nodeconfig::follow_node_config;
use flock_agent::k8s::pods::PodWatcher;
use flock_agent::kernel::NetnsKernel;
use flock_agent::metrics::Component;
use flock_agent::pods::PodDirectory;
use flock_agent::routing::bird::{BirdTarget, Debounce};
use flock_agent::store::AttachmentKey;
use flock_cni_proto::ErrorCode;
use flock_k8s_api::NodeConfig;
use flock_netns::NodeNs;
use flock_rpc::rpc::{Op, PROTOCOL_VERSION, Request};
use flock_testkit::Netns;
use flock_testkit::kube_mock::*;
use flock_testkit::wait::eventually;
use serde_json::{Value, json};

const NODE: &str = "node-a";

fn node_config(cidr6: &str, neighbors: Value) -> Value {
    json!({
        "apiVersion": "flock.fritzlab.net/v1alpha1",
        "kind": "NodeConfig",
        "metadata": { "name": NODE, "resourceVersion": "1", "uid": "nc-uid" },
        "spec": {
            "cidr6": cidr6,
            "cidr4": "10.244.1.0/24",
            "bgp": { "asn": 64512, "routerId": "10.0.0.1", "neighbors": neighbors }
        }
    })
}

async fn start_agent(node: &Netns, state: &Path, pods: Option<Arc<PodWatcher>>) -> Arc<Agent> {
    // The leak test starts with the node's settings, as after a NodeConfig event.
    let settings = pods
        .as_ref()
        .map(|_| settings_of("2001:db8:0:1::/64", json!([])));
    let kernel = Arc::new(NetnsKernel::new(NodeNs::at(node.path())));
    let (agent, _) = Agent::start(AgentParts {
        settings,
        pods: pods.map(|p| p as Arc<dyn PodDirectory>),
        pod_wait: Duration::from_secs(5),
        ..AgentParts::new(kernel, state)
    })
    .await
    .expect("agent starts");
    agent
}

fn add_request(container_id: &str, pod_ns: &Netns, pod: &str) -> Request {
    Request {
        v: PROTOCOL_VERSION,
        op: Op::Add,
        container_id: container_id.into(),
        netns: pod_ns.path().to_string_lossy().into_owned(),
        if_name: "eth0".into(),
        args: format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=shop;K8S_POD_NAME={pod};K8S_POD_UID=uid-{pod}"
        ),
        path: "/opt/cni/bin".into(),
        config: json!({ "cniVersion": "1.1.0", "name": "flock", "type": "flock" }),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodeconfig_events_set_keep_and_withdraw_the_settings() {
    let node = Netns::new("node");
    let pod = Netns::new("pod");
    let state = tempfile::tempdir().expect("tmp");
    let agent = start_agent(&node, state.path(), None).await;
    assert!(agent.settings().is_none());
    let mut status = add_request("-", &pod, "-");
    status.op = Op::Status;
    status.container_id = String::new();
    status.netns = String::new();
    status.if_name = String::new();
    let error = agent
        .handle(status)
        .await
        .error
        .expect("STATUS without a NodeConfig");
    assert_eq!(error.code, ErrorCode::PluginNotAvailable);
    assert!(error.msg.contains("no NodeConfig"), "{}", error.msg);
    let (client, mut api) = mock_client();
    tokio::spawn(follow_node_config(client, NODE.into(), agent.clone()));

    let (req, reply) = next_request(&mut api).await;
    assert_eq!(
        req.uri().path(),
        "/apis/flock.fritzlab.net/v1alpha1/nodeconfigs"
    );
    assert_eq!(
        query_param(&req, "fieldSelector").as_deref(),
        Some("metadata.name=node-a"),
        "only this node's NodeConfig, selected server-side"
    );
    reply_json(
        reply,
        &list(
            "NodeConfigList",
            "flock.fritzlab.net/v1alpha1",
            "5",
            vec![node_config("2001:db8:0:1::/64", json!([]))],
        ),
    );
    eventually("the listed NodeConfig is applied", || {
        agent.settings().is_some()
    })
    .await;
    let settings = agent.settings().expect("settings");
    assert_eq!(
        settings.cidr6,
        Some("2001:db8:0:1::/64".parse().expect("net"))
    );
    assert_eq!(settings.cidr4, Some("10.244.1.0/24".parse().expect("net")));
    assert_eq!(agent.health().problem(Component::NodeConfig), None);
    // The settings are published before the blackholes are installed.
    eventually("the pool blackhole is installed", || {
        node.ok(["ip", "-6", "route", "show", "type", "blackhole"])
            .contains("2001:db8:0:1::/64")
    })
    .await;

    // An invalid update is reported and the previous settings stay.
    let (req, reply) = next_request(&mut api).await;
    assert_eq!(query_param(&req, "watch").as_deref(), Some("true"));
    assert_eq!(
        query_param(&req, "fieldSelector").as_deref(),
        Some("metadata.name=node-a")
    );
    reply_events(
        reply,
        &[event(
            "MODIFIED",
            node_config("2001:db8:0:1::1/64", json!([])),
        )],
    );
    eventually("the invalid NodeConfig is reported", || {
        agent.health().problem(Component::NodeConfig).is_some()
    })
    .await;
    let problem = agent
        .health()
        .problem(Component::NodeConfig)
        .expect("problem");
    assert!(
        problem.contains("spec.cidr6") && problem.contains("host bits"),
        "{problem}"
    );
    assert!(problem.contains("previous settings stay"), "{problem}");
    assert_eq!(agent.settings().as_deref(), Some(&*settings));

    // Reverting to the settings in force clears the problem.
    let (_req, reply) = next_request(&mut api).await;
    reply_events(
        reply,
        &[event(
            "MODIFIED",
            node_config("2001:db8:0:1::/64", json!([])),
        )],
    );
    eventually("the revert clears the problem", || {
        agent.health().problem(Component::NodeConfig).is_none()
    })
    .await;
    assert_eq!(agent.settings().as_deref(), Some(&*settings));

    // A valid update with a new neighbor replaces the settings and clears the problem.
    let (_req, reply) = next_request(&mut api).await;
    reply_events(
        reply,
        &[event(
            "MODIFIED",
            node_config(
                "2001:db8:0:1::/64",
                json!([{ "address": "2001:db8::fe", "asn": 65000 }]),
            ),
        )],
    );
    eventually("the new neighbor is applied", || {
        agent
            .settings()
            .and_then(|s| s.bgp.as_ref().map(|b| b.neighbors.len()))
            == Some(1)
    })
    .await;
    assert_eq!(agent.health().problem(Component::NodeConfig), None);
    let bird = agent.render_bird().expect("renders").expect("bgp");
    assert!(
        bird.contains("2001:db8::fe"),
        "the new neighbor is rendered"
    );

    // Deleted: new ADDs fail with a clear, retryable error.
    let (_req, reply) = next_request(&mut api).await;
    reply_events(
        reply,
        &[event(
            "DELETED",
            node_config("2001:db8:0:1::/64", json!([])),
        )],
    );
    eventually("the deletion withdraws the settings", || {
        agent.settings().is_none()
    })
    .await;
    assert!(agent.health().problem(Component::NodeConfig).is_some());
    let response = agent.handle(add_request("c-after-delete", &pod, "p")).await;
    let error = response.error.expect("ADD must fail without a NodeConfig");
    assert_eq!(error.code, ErrorCode::TryAgainLater);
    assert!(error.msg.contains("no NodeConfig"), "{}", error.msg);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_deleted_past_the_grace_period_is_released_one_within_it_is_not() {
    let node = Netns::new("node");
    let (pod1, pod2) = (Netns::new("pod"), Netns::new("pod"));
    let state = tempfile::tempdir().expect("tmp");
    let (client, mut api) = mock_client();
    let pods = PodWatcher::spawn(client, NODE);
    let (_req, reply) = next_request(&mut api).await;
    reply_json(
        reply,
        &list(
            "PodList",
            "v1",
            "10",
            vec![
                deployment_pod("shop", "p1", NODE, "8"),
                deployment_pod("shop", "p2", NODE, "9"),
            ],
        ),
    );
    let (_req, watch) = next_request(&mut api).await;
    let agent = start_agent(&node, state.path(), Some(pods.clone())).await;

    for (id, ns, name) in [("c1", &pod1, "p1"), ("c2", &pod2, "p2")] {
        let response = agent.handle(add_request(id, ns, name)).await;
        assert!(response.error.is_none(), "ADD {id}: {:?}", response.error);
    }
    // A runtime that names no pod (no K8S_POD_NAME): the record has no pod, so the leak
    // reconcile can never take it for a deleted one.
    let pod3 = Netns::new("pod");
    let mut anonymous = add_request("c3", &pod3, "unused");
    anonymous.args = "IgnoreUnknown=1".into();
    let response = agent.handle(anonymous).await;
    assert!(response.error.is_none(), "ADD c3: {:?}", response.error);
    let records = agent.records();
    assert_eq!(records.len(), 3);
    assert!(
        records
            .iter()
            .filter(|r| r.container_id != "c3")
            .all(|r| r.pod.as_ref().is_some_and(|p| p.uid.starts_with("uid-")))
    );
    assert!(
        records
            .iter()
            .any(|r| r.container_id == "c3" && r.pod.is_none()),
        "{records:?}"
    );
    let host_if = |id: &str| {
        records
            .iter()
            .find(|r| r.container_id == id)
            .expect("record")
            .host_if
            .clone()
    };
    let (if1, if2) = (host_if("c1"), host_if("c2"));
    assert!(node.links().contains(&if1) && node.links().contains(&if2));

    // p1 is deleted; the watcher's next WATCH shows it has processed the event.
    reply_events(
        watch,
        &[event("DELETED", deployment_pod("shop", "p1", NODE, "11"))],
    );
    let (_req, _hold) = next_request(&mut api).await;
    assert_eq!(pods.exists("shop", "p1"), Some(false));

    let grace = Duration::from_secs(300);
    let mut tracker = LeakTracker::new();
    let t0 = Instant::now();
    let report = reconcile_once(&agent, &pods, &mut tracker, t0, grace).await;
    assert!(
        report.released.is_empty(),
        "within the grace period: {report:?}"
    );
    let report = reconcile_once(
        &agent,
        &pods,
        &mut tracker,
        t0 + Duration::from_secs(200),
        grace,
    )
    .await;
    assert!(report.released.is_empty(), "still within: {report:?}");
    assert_eq!(agent.records().len(), 3);

    let report = reconcile_once(
        &agent,
        &pods,
        &mut tracker,
        t0 + Duration::from_secs(301),
        grace,
    )
    .await;
    assert_eq!(
        report.released,
        vec![AttachmentKey {
            container_id: "c1".into(),
            if_name: "eth0".into()
        }]
    );
    assert!(report.failed.is_empty(), "{report:?}");
    let left: Vec<String> = agent
        .records()
        .iter()
        .map(|r| r.container_id.clone())
        .collect();
    assert_eq!(left, ["c2", "c3"]);
    let links = node.links();
    assert!(!links.contains(&if1), "the leaked veth is gone: {links:?}");
    assert!(
        links.contains(&if2),
        "the live pod keeps its veth: {links:?}"
    );
    let v6 = agent.records()[0].ipv6.expect("ipv6").to_string();
    assert_eq!(agent.records()[0].container_id, "c2");
    let addrs = pod2.ok(["ip", "-6", "addr", "show", "dev", "eth0"]);
    assert!(addrs.contains(&v6), "the live pod keeps {v6}: {addrs}");
}

fn settings_of(cidr6: &str, neighbors: Value) -> flock_k8s_api::NodeSettings {
    serde_json::from_value::<NodeConfig>(node_config(cidr6, neighbors))
        .expect("fixture")
        .settings()
        .expect("valid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_cidr_keeps_old_pods_announced_until_they_go() {
    let node = Netns::new("node");
    let pod = Netns::new("pod");
    let state = tempfile::tempdir().expect("tmp");
    let agent = start_agent(&node, state.path(), None).await;
    // The real BIRD writer, on a file; `false` stands in for birdc (its reloads fail, which
    // the writer reports and retries; the file is written before the reload).
    let config = state.path().join("bird.conf");
    let renderer = {
        let agent = agent.clone();
        Arc::new(move || agent.render_bird()) as flock_agent::routing::bird::Renderer
    };
    agent.set_bird(flock_agent::routing::bird::spawn(
        BirdTarget {
            config_path: config.clone(),
            socket: state.path().join("bird.ctl"),
            birdc: "false".into(),
        },
        renderer,
        Debounce {
            quiet: Duration::from_millis(10),
            max_delay: Duration::from_millis(100),
            retry: Duration::from_secs(60),
        },
        Arc::new(flock_agent::metrics::Metrics::new()),
        agent.health().clone(),
    ));
    let routes =
        || flock_testkit::bird_routes(&std::fs::read_to_string(&config).unwrap_or_default());
    let blackholes = || node.ok(["ip", "-6", "route", "show", "type", "blackhole"]);

    agent
        .set_settings(Some(settings_of("2001:db8:0:1::/64", json!([]))))
        .await;
    eventually("the first CIDR is announced", || {
        routes() == ["2001:db8:0:1::/64", "10.244.1.0/24"]
    })
    .await;
    let response = agent.handle(add_request("c-old", &pod, "old")).await;
    assert!(response.error.is_none(), "ADD: {:?}", response.error);
    let old = agent.records()[0].ipv6.expect("ipv6");
    assert!(
        "2001:db8:0:1::/64"
            .parse::<ipnet::Ipv6Net>()
            .expect("net")
            .contains(&old)
    );

    // A new CIDR: it is announced and blackholed, the old one is neither, and the live pod
    // from the old CIDR is announced on its own.
    agent
        .set_settings(Some(settings_of(
            "2001:db8:0:2::/64",
            json!([{ "address": "2001:db8::fe", "asn": 65000 }]),
        )))
        .await;
    let old128 = format!("{old}/128");
    eventually("the new CIDR and the old pod are announced", || {
        let r = routes();
        r.contains(&"2001:db8:0:2::/64".to_owned())
            && r.contains(&old128)
            && !r.contains(&"2001:db8:0:1::/64".to_owned())
    })
    .await;
    assert!(
        std::fs::read_to_string(&config)
            .expect("config")
            .contains("2001:db8::fe"),
        "the new neighbor is rendered by the writer"
    );
    let bh = blackholes();
    assert!(
        bh.contains("2001:db8:0:2::/64") && !bh.contains("2001:db8:0:1::/64"),
        "{bh}"
    );
    let addrs = pod.ok(["ip", "-6", "addr", "show", "dev", "eth0"]);
    assert!(
        addrs.contains(&old.to_string()),
        "the pod keeps {old}: {addrs}"
    );

    // Its DEL withdraws its /128.
    let mut del = add_request("c-old", &pod, "old");
    del.op = Op::Del;
    let response = agent.handle(del).await;
    assert!(response.error.is_none(), "DEL: {:?}", response.error);
    eventually("the old pod's /128 is withdrawn", || {
        !routes().contains(&old128)
    })
    .await;
    assert_eq!(routes(), ["2001:db8:0:2::/64", "10.244.1.0/24"]);
}
