//! NetworkPolicy enforcement in the agent, without root: the handlers on the in-memory kernel,
//! the enforcer applying through an in-memory `nft`, fed the watch events its watchers would
//! send. What each ADD, DEL and event makes the agent apply, and when ADD may return.

mod policy_support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use flock_agent::agent::{Agent, AgentParts};
use flock_agent::kernel::memory::MemoryKernel;
use flock_agent::metrics::{Health, Metrics};
use flock_agent::policy::PolicyEnforcer;
use flock_agent::policy::nft::MemoryNft;
use flock_cni_proto::ErrorCode;
use flock_policy::REMOVE_SCRIPT;
use flock_rpc::rpc::{Op, PROTOCOL_VERSION, Request, Response};
use kube::runtime::watcher::Event;
use policy_support::*;
use serde_json::json;

const NODE: &str = "node-a";

struct Node {
    kernel: Arc<MemoryKernel>,
    nft: Arc<MemoryNft>,
    enforcer: Arc<PolicyEnforcer>,
    pods: Arc<Directory>,
    metrics: Arc<Metrics>,
    agent: Arc<Agent>,
    _dir: tempfile::TempDir,
}

async fn node(pod_wait: Duration) -> Node {
    let kernel = Arc::new(MemoryKernel::new("boot"));
    let nft = Arc::new(MemoryNft::default());
    let metrics = Arc::new(Metrics::new());
    let health = Arc::new(Health::default());
    let enforcer = PolicyEnforcer::spawn(nft.clone(), metrics.clone(), health.clone());
    let pods = Arc::new(Directory::default());
    let dir = tempfile::tempdir().unwrap();
    let settings = node_settings(NODE, "2001:db8:7::/64", "10.77.0.0/24");
    let (agent, _) = Agent::start(AgentParts {
        settings: Some(settings),
        pods: Some(pods.clone()),
        pod_wait,
        policy: Some(enforcer.clone()),
        metrics: metrics.clone(),
        health,
        rng_seed: [3; 32],
        ..AgentParts::new(kernel.clone(), dir.path())
    })
    .await
    .expect("agent starts");
    Node {
        kernel,
        nft,
        enforcer,
        pods,
        metrics,
        agent,
        _dir: dir,
    }
}

fn request(op: Op, cid: &str, pod: &str) -> Request {
    Request {
        v: PROTOCOL_VERSION,
        op,
        container_id: cid.into(),
        netns: format!("/run/netns/{cid}"),
        if_name: "eth0".into(),
        args: format!("K8S_POD_NAMESPACE=shop;K8S_POD_NAME={pod};K8S_POD_UID=uid-{pod}"),
        path: "/opt/cni/bin".into(),
        config: json!({ "cniVersion": "1.1.0", "name": "flock", "type": "flock" }),
    }
}

impl Node {
    /// ADD of pod `name` with these labels (the pod watcher knows it).
    async fn add(&self, cid: &str, name: &str, labels: serde_json::Value) -> Response {
        self.pods
            .insert(&pod("shop", name, NODE, labels, &["2001:db8:7::ff"]));
        self.kernel
            .add_netns(PathBuf::from(format!("/run/netns/{cid}")));
        self.agent.handle(request(Op::Add, cid, name)).await
    }

    fn host_if(&self, cid: &str) -> String {
        self.agent
            .records()
            .into_iter()
            .find(|r| r.container_id == cid)
            .expect("record")
            .host_if
    }

    fn last_script(&self) -> String {
        self.nft.scripts().last().cloned().unwrap_or_default()
    }

    /// Waits for everything changed so far to be applied.
    async fn settled(&self) {
        let generation = self.enforcer.update(|_| false);
        self.enforcer
            .wait_applied(generation, Duration::from_secs(10))
            .await
            .expect("applied");
    }
}

#[tokio::test]
async fn add_returns_only_once_its_pods_rules_are_applied() {
    let n = node(Duration::from_secs(10)).await;
    let client = pod(
        "shop",
        "client",
        "node-b",
        json!({ "role": "client" }),
        &["2001:db8:8::1", "10.88.0.1"],
    );
    list_all(
        &n.enforcer,
        vec![server_policy()],
        vec![namespace("shop", json!({}))],
        vec![client],
    );
    n.settled().await;
    assert_eq!(
        n.nft.scripts(),
        [REMOVE_SCRIPT],
        "no local pod is isolated yet: the first apply removes any table a previous agent left"
    );

    let response = n.add("c1", "server", json!({ "app": "server" })).await;
    assert!(response.error.is_none(), "{:?}", response.error);
    let veth = n.host_if("c1");
    let script = n.last_script();
    assert!(
        script.contains(&format!("\"{veth}\" : jump ingress_")),
        "the pod's chain is in the kernel when ADD returns:\n{script}"
    );
    for addr in ["2001:db8:8::1", "10.88.0.1"] {
        assert!(script.contains(addr), "the client's {addr} in\n{script}");
    }
    assert!(script.contains("tcp dport 8080 accept"), "named port http");

    // A pod no policy selects needs no change of the table, and ADD does not wait on nft.
    let before = n.nft.scripts().len();
    let response = n.add("c2", "plain", json!({ "app": "other" })).await;
    assert!(response.error.is_none(), "{:?}", response.error);
    assert_eq!(n.nft.scripts().len(), before, "{:?}", n.nft.scripts());

    // A local pod joining the client selector is one element added.
    let response = n
        .add("c3", "local-client", json!({ "role": "client" }))
        .await;
    assert!(response.error.is_none(), "{:?}", response.error);
    let c3 = n
        .agent
        .records()
        .into_iter()
        .find(|r| r.container_id == "c3")
        .unwrap();
    assert_eq!(
        n.last_script(),
        format!(
            "add element inet flock_policy pods0_v4 {{ {} }}\n\
             add element inet flock_policy pods0_v6 {{ {} }}\n",
            c3.ipv4.unwrap(),
            c3.ipv6.unwrap()
        )
    );
    let metrics = n.metrics.encode();
    assert!(
        metrics.contains("flock_policy_applies_total{kind=\"elements\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("flock_policy_isolated_pods{direction=\"ingress\"} 1"),
        "{metrics}"
    );

    // DEL of the server: its chain goes; no isolated pod is left, so no table either.
    let response = n.agent.handle(request(Op::Del, "c1", "server")).await;
    assert!(response.error.is_none(), "{:?}", response.error);
    n.settled().await;
    assert_eq!(n.last_script(), REMOVE_SCRIPT, "{:#?}", n.nft.scripts());
}

#[tokio::test]
async fn add_before_the_caches_are_listed_fails_retryably_and_leaves_nothing() {
    let n = node(Duration::from_millis(300)).await;
    // policies, cluster policies and namespaces listed, pods not yet
    n.enforcer.on_policy(Event::InitDone);
    n.enforcer.on_cluster_policy(Event::InitDone);
    n.enforcer.on_namespace(Event::InitDone);
    let error = n
        .add("c1", "server", json!({ "app": "server" }))
        .await
        .error
        .expect("ADD must not return before the model is known");
    assert_eq!(error.code, ErrorCode::TryAgainLater, "{error:?}");
    assert!(
        error.msg.contains("NetworkPolicy rules of pod shop/server"),
        "{}",
        error.msg
    );
    assert!(error.details.contains("not all listed yet"), "{error:?}");
    assert!(n.agent.records().is_empty(), "the ADD was undone");
    assert!(n.kernel.state().veths.is_empty(), "its veth is gone");
    assert!(
        n.nft.scripts().is_empty(),
        "nothing applied before the listing"
    );

    // once listed, the retry succeeds
    n.enforcer.on_pod(Event::InitDone);
    let response = n.add("c1", "server", json!({ "app": "server" })).await;
    assert!(response.error.is_none(), "{:?}", response.error);
}

#[tokio::test]
async fn a_refused_ruleset_fails_the_add_and_undoes_it() {
    let n = node(Duration::from_secs(10)).await;
    list_all(
        &n.enforcer,
        vec![server_policy()],
        vec![namespace("shop", json!({}))],
        vec![],
    );
    n.settled().await;
    n.nft.fail_next(1);
    let error = n
        .add("c1", "server", json!({ "app": "server" }))
        .await
        .error
        .expect("nft refused the pod's rules");
    assert_eq!(error.code, ErrorCode::Plugin(106), "{error:?}");
    assert!(
        error.details.contains("nft refused the script"),
        "{error:?}"
    );
    assert!(n.agent.records().is_empty());
    assert!(n.kernel.state().veths.is_empty());
    assert!(
        n.metrics
            .encode()
            .contains("flock_policy_apply_errors_total 1")
    );
    // the retry of the kubelet works, and replaces the whole table (its state is unknown)
    let response = n.add("c1", "server", json!({ "app": "server" })).await;
    assert!(response.error.is_none(), "{:?}", response.error);
    assert!(n.last_script().starts_with("# flock NetworkPolicy"));
}

#[tokio::test]
async fn policy_events_change_the_table_and_the_last_policy_removes_it() {
    let n = node(Duration::from_secs(10)).await;
    list_all(
        &n.enforcer,
        vec![],
        vec![namespace("shop", json!({}))],
        vec![],
    );
    let response = n.add("c1", "server", json!({ "app": "server" })).await;
    assert!(response.error.is_none(), "{:?}", response.error);
    let veth = n.host_if("c1");

    n.enforcer.on_policy(Event::Apply(server_policy()));
    n.settled().await;
    assert!(
        n.last_script()
            .contains(&format!("\"{veth}\" : jump ingress_")),
        "{}",
        n.last_script()
    );

    // a remote client appears: one element, both families
    n.enforcer.on_pod(Event::Apply(pod(
        "shop",
        "client",
        "node-b",
        json!({ "role": "client" }),
        &["2001:db8:8::1", "10.88.0.1"],
    )));
    n.settled().await;
    assert_eq!(
        n.last_script(),
        "add element inet flock_policy pods0_v4 { 10.88.0.1 }\n\
         add element inet flock_policy pods0_v6 { 2001:db8:8::1 }\n"
    );
    // relabelled out of the selector: deleted
    n.enforcer.on_pod(Event::Apply(pod(
        "shop",
        "client",
        "node-b",
        json!({ "role": "former" }),
        &["2001:db8:8::1", "10.88.0.1"],
    )));
    n.settled().await;
    assert!(
        n.last_script().starts_with("delete element"),
        "{}",
        n.last_script()
    );

    // an invalid policy is left out and counted; the valid one stays in force
    let bad = policy(
        "bad",
        json!({ "ingress": [{ "ports": [{ "protocol": "ICMP" }] }] }),
    );
    n.enforcer.on_policy(Event::Apply(bad.clone()));
    n.settled().await;
    assert!(n.metrics.encode().contains("flock_policy_invalid 1"));
    assert!(
        n.enforcer.inputs().policies.len() == 1,
        "only the valid policy is in the model"
    );
    n.enforcer.on_policy(Event::Delete(bad));
    assert!(n.metrics.encode().contains("flock_policy_invalid 0"));

    // the last policy goes: no rule is left
    n.enforcer.on_policy(Event::Delete(server_policy()));
    n.settled().await;
    assert_eq!(n.last_script(), REMOVE_SCRIPT);
    assert!(n.enforcer.applied_ruleset().expect("known").is_empty());
}

#[tokio::test]
async fn a_restarted_agent_keeps_its_pods_in_the_model_with_labels_from_the_cluster() {
    let n = node(Duration::from_secs(10)).await;
    list_all(
        &n.enforcer,
        vec![server_policy()],
        vec![namespace("shop", json!({}))],
        vec![],
    );
    let response = n.add("c1", "server", json!({ "app": "server" })).await;
    assert!(response.error.is_none(), "{:?}", response.error);
    let veth = n.host_if("c1");

    // a new agent on the same store: the pod is known from its record, its labels from the
    // cluster cache; nothing is applied until every cache is listed
    let nft = Arc::new(MemoryNft::default());
    let enforcer = PolicyEnforcer::spawn(
        nft.clone(),
        Arc::new(Metrics::new()),
        Arc::new(Health::default()),
    );
    let (agent, report) = Agent::start(AgentParts {
        pods: Some(n.pods.clone()),
        policy: Some(enforcer.clone()),
        ..AgentParts::new(n.kernel.clone(), n._dir.path())
    })
    .await
    .expect("restart");
    assert_eq!(report.kept, 1);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(nft.scripts().is_empty());
    let record = agent.records()[0].clone();
    list_all(
        &enforcer,
        vec![server_policy()],
        vec![namespace("shop", json!({}))],
        vec![pod(
            "shop",
            "server",
            NODE,
            json!({ "app": "server" }),
            &[&record.ipv6.unwrap().to_string()],
        )],
    );
    let generation = enforcer.update(|_| false);
    enforcer
        .wait_applied(generation, Duration::from_secs(10))
        .await
        .expect("applied");
    let script = nft.scripts().concat();
    assert!(
        script.contains(&format!("\"{veth}\" : jump ingress_")),
        "the restarted agent isolates its old pod again:\n{script}"
    );
}

/// The four cluster-wide watches against a mocked API server: each kind is listed and
/// watched cluster-wide (pods without the finished ones), in pages; their objects reach the
/// model, and a watch event changes it.
#[tokio::test]
async fn the_cluster_watches_list_and_watch_every_kind_and_feed_the_model() {
    use flock_agent::cache::PAGE_SIZE;
    use flock_agent::policy::watches::{LIVE_PODS, spawn_watches};
    use flock_testkit::kube_mock::*;

    let (client, mut api) = mock_client();
    let enforcer = PolicyEnforcer::spawn(
        Arc::new(MemoryNft::default()),
        Arc::new(Metrics::new()),
        Arc::new(Health::default()),
    );
    spawn_watches(client, enforcer.clone());
    let mut watches = std::collections::BTreeMap::new();
    for _ in 0..8 {
        let (req, reply) = next_request(&mut api).await;
        let path = req.uri().path().to_owned();
        let watching = query_param(&req, "watch").as_deref() == Some("true");
        if path == "/api/v1/pods" {
            assert_eq!(
                query_param(&req, "fieldSelector").as_deref(),
                Some(LIVE_PODS),
                "finished pods are left out server-side"
            );
        } else {
            assert_eq!(query_param(&req, "fieldSelector"), None, "{path}");
        }
        if watching {
            watches.insert(path, reply);
            continue;
        }
        assert_eq!(
            query_param(&req, "limit"),
            Some(PAGE_SIZE.to_string()),
            "{path} is listed in pages"
        );
        let body = match path.as_str() {
            "/apis/networking.k8s.io/v1/networkpolicies" => list(
                "NetworkPolicyList",
                "networking.k8s.io/v1",
                "7",
                vec![serde_json::to_value(server_policy()).unwrap()],
            ),
            "/api/v1/namespaces" => list(
                "NamespaceList",
                "v1",
                "7",
                vec![serde_json::to_value(namespace("shop", json!({ "team": "a" }))).unwrap()],
            ),
            "/api/v1/pods" => list(
                "PodList",
                "v1",
                "7",
                vec![
                    serde_json::to_value(pod(
                        "shop",
                        "client",
                        "node-b",
                        json!({ "role": "client" }),
                        &["2001:db8:8::1"],
                    ))
                    .unwrap(),
                ],
            ),
            CLUSTER_POLICIES => list(
                "ClusterNetworkPolicyList",
                "policy.networking.k8s.io/v1beta1",
                "7",
                vec![json!({
                    "apiVersion": "policy.networking.k8s.io/v1beta1",
                    "kind": "ClusterNetworkPolicy",
                    "metadata": { "name": "deny-ops", "resourceVersion": "5" },
                    "spec": {
                        "tier": "Admin", "priority": 10,
                        "subject": { "namespaces": {} },
                        "ingress": [{ "action": "Deny", "from": [{ "namespaces": {
                            "matchLabels": { "team": "ops" } } }] }]
                    }
                })],
            ),
            other => panic!("unexpected request to {other}"),
        };
        reply_json(reply, &body);
    }
    assert_eq!(watches.len(), 4, "each kind is watched after its listing");
    let generation = enforcer.update(|_| false);
    enforcer
        .wait_applied(generation, Duration::from_secs(10))
        .await
        .expect("the model is listed and applied");
    let inputs = enforcer.inputs();
    assert_eq!(inputs.policies.len(), 1);
    assert_eq!(inputs.cluster_policies.len(), 1);
    assert_eq!(inputs.cluster_policies[0].name, "deny-ops");
    assert_eq!(inputs.namespaces[0].labels["team"], "a");
    assert_eq!(inputs.pods[0].labels["role"], "client");

    let reply = watches.remove("/api/v1/pods").expect("pod watch");
    let mut deleted = serde_json::to_value(pod(
        "shop",
        "client",
        "node-b",
        json!({ "role": "client" }),
        &["2001:db8:8::1"],
    ))
    .unwrap();
    deleted["metadata"]["resourceVersion"] = json!("8");
    reply_events(reply, &[event("DELETED", deleted)]);
    for _ in 0..500 {
        if enforcer.inputs().pods.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the DELETED event never reached the model");
}

const CLUSTER_POLICIES: &str = "/apis/policy.networking.k8s.io/v1beta1/clusternetworkpolicies";

/// Without the ClusterNetworkPolicy CRD the API answers 404: there are none, and enforcement
/// does not wait for them.
#[tokio::test]
async fn without_the_cluster_policy_crd_enforcement_goes_on() {
    use flock_agent::policy::watches::spawn_watches;
    use flock_testkit::kube_mock::*;

    let (client, mut api) = mock_client();
    let enforcer = PolicyEnforcer::spawn(
        Arc::new(MemoryNft::default()),
        Arc::new(Metrics::new()),
        Arc::new(Health::default()),
    );
    spawn_watches(client, enforcer.clone());
    // the API server: empty lists, watches held open, 404 for the cluster policies
    let server = tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let (req, reply) = next_request(&mut api).await;
            let path = req.uri().path().to_owned();
            if path == CLUSTER_POLICIES {
                reply_error(reply, 404, "NotFound");
            } else if query_param(&req, "watch").as_deref() == Some("true") {
                held.push(reply);
            } else {
                let (kind, version) = match path.as_str() {
                    "/apis/networking.k8s.io/v1/networkpolicies" => {
                        ("NetworkPolicyList", "networking.k8s.io/v1")
                    }
                    "/api/v1/namespaces" => ("NamespaceList", "v1"),
                    "/api/v1/pods" => ("PodList", "v1"),
                    other => panic!("unexpected request to {other}"),
                };
                reply_json(reply, &list(kind, version, "7", vec![]));
            }
        }
    });
    let generation = enforcer.update(|_| false);
    enforcer
        .wait_applied(generation, Duration::from_secs(10))
        .await
        .expect("applied without cluster policies");
    assert!(enforcer.inputs().cluster_policies.is_empty());
    server.abort();
}

/// As `cargo xtask cluster life policy` drives it: the policy's ipBlock changes (taken in
/// place), then a remote client's label moves it in and out of the policy's selector —
/// each time one element, never a rebuild.
#[tokio::test]
async fn after_policy_changes_in_place_a_relabelled_client_is_an_element() {
    let n = node(Duration::from_secs(10)).await;
    let client = |role: Option<&str>| {
        let labels = match role {
            Some(r) => json!({ "app": "client", "role": r }),
            None => json!({ "app": "client" }),
        };
        pod("shop", "client", "node-b", labels, &["2001:db8:8::1"])
    };
    list_all(
        &n.enforcer,
        vec![],
        vec![namespace("shop", json!({}))],
        vec![client(None)],
    );
    let response = n.add("c1", "server", json!({ "app": "server" })).await;
    assert!(response.error.is_none(), "{:?}", response.error);
    for round in 1..=4 {
        let bench = policy(
            "server",
            json!({
                "podSelector": { "matchLabels": { "app": "server" } },
                "ingress": [{ "from": [
                    { "ipBlock": { "cidr": format!("2001:db8:{round:x}::/48") } },
                    { "podSelector": { "matchLabels": { "role": "client" } } }
                ] }]
            }),
        );
        n.enforcer.on_policy(Event::Apply(bench));
        n.settled().await;
        assert!(
            n.last_script()
                .contains(&format!("2001:db8:{round:x}::/48")),
            "round {round}: {}",
            n.last_script()
        );
        let joins = round % 2 == 1;
        n.enforcer
            .on_pod(Event::Apply(client(joins.then_some("client"))));
        n.settled().await;
        let verb = if joins {
            "add element"
        } else {
            "delete element"
        };
        assert!(
            n.last_script().starts_with(verb) && n.last_script().contains("2001:db8:8::1 "),
            "round {round}: {}",
            n.last_script()
        );
    }
}
