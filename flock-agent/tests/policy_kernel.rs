//! NetworkPolicy enforcement by the agent on a real kernel (root): a stand-in node namespace,
//! pods set up by the agent's own ADDs, the enforcer applying with real `nft -f` in that
//! namespace, and real TCP over both families. Beside it, a kube-proxy stand-in table keeps
//! working; `flock-agent cleanup` leaves no flock rule and nothing else touched.
#![cfg(feature = "root-tests")]

mod policy_support;

use std::net::{IpAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use flock_agent::agent::{Agent, AgentParts};
use flock_agent::kernel::NetnsKernel;
use flock_agent::metrics::{Health, Metrics};
use flock_agent::policy::PolicyEnforcer;
use flock_agent::policy::nft::{Nft, NftCommand};
use flock_netns::{NodeNs, NsTarget};
use flock_rpc::rpc::{Op, PROTOCOL_VERSION, Request};
use flock_testkit::Netns;
use kube::runtime::watcher::Event;
use policy_support::*;
use serde_json::json;

const NODE: &str = "node-a";

/// An agent whose kernel is a stand-in node namespace, enforcing with real `nft` there.
struct KernelNode {
    state: tempfile::TempDir,
    agent: Arc<Agent>,
    enforcer: Arc<PolicyEnforcer>,
    pods: Arc<Directory>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

impl KernelNode {
    async fn start(node_ns: &Netns, cidr6: &str, cidr4: &str) -> KernelNode {
        let state = tempfile::tempdir().expect("tmp");
        let nft = NftCommand::new("nft", NsTarget::Path(node_ns.path()));
        let metrics = Arc::new(Metrics::new());
        let health = Arc::new(Health::default());
        let enforcer = PolicyEnforcer::spawn(Arc::new(nft), metrics.clone(), health.clone());
        let pods = Arc::new(Directory::default());
        let (agent, _) = Agent::start(AgentParts {
            settings: Some(node_settings(NODE, cidr6, cidr4)),
            pods: Some(pods.clone()),
            pod_wait: Duration::from_secs(10),
            policy: Some(enforcer.clone()),
            metrics: metrics.clone(),
            health: health.clone(),
            ..AgentParts::new(
                Arc::new(NetnsKernel::new(NodeNs::at(node_ns.path()))),
                state.path(),
            )
        })
        .await
        .expect("agent starts");
        KernelNode {
            state,
            agent,
            enforcer,
            pods,
            metrics,
            health,
        }
    }
}

struct TestPod {
    ns: Netns,
    v6: IpAddr,
    v4: IpAddr,
}

async fn add(
    agent: &Agent,
    pods: &Directory,
    cid: &str,
    name: &str,
    labels: serde_json::Value,
) -> TestPod {
    pods.insert(&pod("shop", name, NODE, labels, &[]));
    let ns = Netns::new("pod");
    let response = agent
        .handle(Request {
            v: PROTOCOL_VERSION,
            op: Op::Add,
            container_id: cid.into(),
            netns: ns.path().to_string_lossy().into_owned(),
            if_name: "eth0".into(),
            args: format!("K8S_POD_NAMESPACE=shop;K8S_POD_NAME={name};K8S_POD_UID=uid-{name}"),
            path: "/opt/cni/bin".into(),
            config: json!({ "cniVersion": "1.1.0", "name": "flock", "type": "flock" }),
        })
        .await;
    assert!(response.error.is_none(), "ADD {name}: {:?}", response.error);
    let record = agent
        .records()
        .into_iter()
        .find(|r| r.container_id == cid)
        .expect("record");
    TestPod {
        ns,
        v6: IpAddr::V6(record.ipv6.expect("v6")),
        v4: IpAddr::V4(record.ipv4.expect("v4")),
    }
}

/// kube-proxy's stand-in: its own table, with a rule counting forwarded packets.
const KUBE_PROXY_STANDIN: &str = "table inet kube_proxy_standin {
	chain forward {
		type filter hook forward priority filter - 1; policy accept;
		counter
	}
}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agent_enforces_policies_over_both_families_and_cleanup_leaves_no_rule() {
    let node_ns = Netns::new("node");
    // Every nft of this test runs in the node's namespace, never the machine's.
    NftCommand::new("nft", NsTarget::Path(node_ns.path()))
        .apply(KUBE_PROXY_STANDIN.to_owned())
        .await
        .expect("the stand-in table");
    let KernelNode {
        state: _state,
        agent,
        enforcer,
        pods,
        metrics,
        ..
    } = KernelNode::start(&node_ns, "2001:db8:51::/64", "10.251.0.0/24").await;
    list_all(
        &enforcer,
        vec![server_policy()],
        vec![namespace("shop", json!({}))],
        vec![],
    );

    let server = add(&agent, &pods, "srv", "server", json!({ "app": "server" })).await;
    let client = add(&agent, &pods, "cli", "client", json!({ "role": "client" })).await;
    let other = add(&agent, &pods, "oth", "other", json!({ "role": "other" })).await;
    let _http = server.ns.run(|| TcpListener::bind("[::]:8080").unwrap());
    let _admin = server.ns.run(|| TcpListener::bind("[::]:9090").unwrap());
    let _client_http = client.ns.run(|| TcpListener::bind("[::]:8080").unwrap());

    // Every ADD returned with its rules in place: no waiting here.
    for (family, to) in [("IPv6", server.v6), ("IPv4", server.v4)] {
        assert!(
            client.ns.tcp_connects(to, 8080),
            "{family}: client → server:http is allowed"
        );
        assert!(
            !client.ns.tcp_connects(to, 9090),
            "{family}: client → server:9090 is not in the rule"
        );
        assert!(
            !other.ns.tcp_connects(to, 8080),
            "{family}: other → server:http is not a client"
        );
    }
    for to in [client.v6, client.v4] {
        assert!(
            other.ns.tcp_connects(to, 8080),
            "{to}: the client is not isolated"
        );
        assert!(
            server.ns.tcp_connects(to, 8080),
            "{to}: the server's egress is not isolated"
        );
    }

    // "other" is relabelled into the selector: one element update, and it may connect.
    enforcer.on_pod(Event::Apply(pod(
        "shop",
        "other",
        NODE,
        json!({ "role": "client" }),
        &[&other.v6.to_string(), &other.v4.to_string()],
    )));
    applied(&enforcer).await;
    for to in [server.v6, server.v4] {
        assert!(
            other.ns.tcp_connects(to, 8080),
            "{to}: other is a client now"
        );
    }
    assert!(
        metrics
            .encode()
            // the client's ADD and this relabelling: set elements only
            .contains("flock_policy_applies_total{kind=\"elements\"} 2"),
        "{}",
        metrics.encode()
    );

    // The last policy goes: no flock rule is left, kube-proxy's table stays.
    enforcer.on_policy(Event::Delete(server_policy()));
    applied(&enforcer).await;
    let listing = node_ns.ok(["nft", "list", "ruleset"]);
    assert!(!listing.contains("flock_policy"), "{listing}");
    assert!(listing.contains("kube_proxy_standin"), "{listing}");
    for to in [server.v6, server.v4] {
        assert!(
            client.ns.tcp_connects(to, 9090),
            "{to}: everything flows again"
        );
    }

    // A policy again, then the uninstall path: `flock-agent cleanup` on the node.
    enforcer.on_policy(Event::Apply(server_policy()));
    applied(&enforcer).await;
    assert!(
        node_ns
            .ok(["nft", "list", "ruleset"])
            .contains("flock_policy")
    );
    assert!(!client.ns.tcp_connects(server.v6, 9090));
    for _ in 0..2 {
        node_ns.ok([env!("CARGO_BIN_EXE_flock-agent"), "cleanup"]);
    }
    let listing = node_ns.ok(["nft", "list", "ruleset"]);
    assert!(
        !listing.contains("flock_policy") && listing.contains("kube_proxy_standin"),
        "cleanup removes flock's table only: {listing}"
    );
    assert!(client.ns.tcp_connects(server.v6, 9090));
}

/// A local pod of this node for the enforcer (no kernel pod: the table only names its veth).
fn local(name: &str, last: u16, labels: &[(&str, &str)]) -> flock_agent::policy::view::LocalPod {
    flock_agent::policy::view::LocalPod {
        key: ("shop".into(), name.into()),
        uid: format!("uid-{name}"),
        addresses: vec![
            format!("2001:db8:52::{last:x}").parse().unwrap(),
            format!("10.252.0.{last}").parse().unwrap(),
        ],
        labels: labels
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect(),
        ports: vec![flock_policy::NamedPort {
            name: "http".into(),
            protocol: flock_policy::Protocol::Tcp,
            port: 8080,
        }],
    }
}

async fn applied(enforcer: &PolicyEnforcer) {
    let generation = enforcer.update(|_| false);
    enforcer
        .wait_applied(generation, Duration::from_secs(10))
        .await
        .expect("applied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incremental_applies_leave_the_table_a_full_apply_of_the_same_model_leaves() {
    let node_ns = Netns::new("incr");
    let fresh_ns = Netns::new("full");
    let metrics = Arc::new(Metrics::new());
    let nft = NftCommand::new("nft", NsTarget::Path(node_ns.path()));
    let enforcer =
        PolicyEnforcer::spawn(Arc::new(nft), metrics.clone(), Arc::new(Health::default()));
    let egress = policy(
        "clients-egress",
        json!({
            "podSelector": { "matchLabels": { "role": "client" } },
            "policyTypes": ["Egress"],
            "egress": [{ "to": [{ "podSelector": { "matchLabels": { "app": "server" } } }],
                         "ports": [{ "port": "http" }] }]
        }),
    );
    list_all(
        &enforcer,
        vec![server_policy(), egress],
        vec![namespace("shop", json!({}))],
        vec![pod(
            "shop",
            "far-client",
            "node-b",
            json!({ "role": "client" }),
            &["2001:db8:53::1"],
        )],
    );
    applied(&enforcer).await;
    // Every kind of change a node sees, each applied on its own: the first isolated pod
    // (the whole table), a replica (map elements), pods joining and leaving selectors here
    // and elsewhere, a relabelling, a DEL.
    type Change = Box<dyn Fn(&PolicyEnforcer)>;
    let steps: Vec<Change> = vec![
        Box::new(|e| {
            e.restore(
                "flock00000001".into(),
                local("server-1", 1, &[("app", "server")]),
            );
        }),
        Box::new(|e| {
            e.restore(
                "flock00000002".into(),
                local("server-2", 2, &[("app", "server")]),
            );
        }),
        Box::new(|e| {
            e.restore(
                "flock00000003".into(),
                local("client-1", 3, &[("role", "client")]),
            );
        }),
        Box::new(|e| {
            e.on_pod(Event::Apply(pod(
                "shop",
                "far-server",
                "node-b",
                json!({ "app": "server" }),
                &["2001:db8:53::2", "10.253.0.2"],
            )))
        }),
        Box::new(|e| {
            e.on_pod(Event::Apply(pod(
                "shop",
                "far-client-2",
                "node-c",
                json!({ "role": "client" }),
                &["2001:db8:53::3"],
            )))
        }),
        Box::new(|e| {
            e.on_pod(Event::Apply(pod(
                "shop",
                "far-client",
                "node-b",
                json!({ "role": "former" }),
                &["2001:db8:53::1"],
            )))
        }),
        Box::new(|e| {
            e.on_pod(Event::Delete(pod(
                "shop",
                "far-server",
                "node-b",
                json!({}),
                &[],
            )))
        }),
        Box::new(|e| e.forget("flock00000002")),
        Box::new(|e| {
            e.restore(
                "flock00000004".into(),
                local("client-2", 4, &[("role", "client")]),
            );
        }),
        Box::new(|e| e.forget("flock00000003")),
        // policy changes taken in place (a set comes and one goes), each followed by a
        // remote pod joining or leaving the selector that stays
        Box::new(|e| e.on_policy(Event::Apply(server_with_block("2001:db8:c9:1::1/128")))),
        Box::new(|e| e.on_pod(Event::Apply(dual_far_client("client")))),
        Box::new(|e| e.on_policy(Event::Apply(server_with_block("2001:db8:c9:2::1/128")))),
        Box::new(|e| e.on_pod(Event::Apply(dual_far_client("former")))),
    ];
    for (i, step) in steps.iter().enumerate() {
        step(&enforcer);
        applied(&enforcer).await;
        let ruleset = enforcer.applied_ruleset().expect("known");
        fresh_ns.ok(["nft", "flush", "ruleset"]);
        NftCommand::new("nft", NsTarget::Path(fresh_ns.path()))
            .apply(ruleset.render())
            .await
            .expect("full apply");
        // the same sets, maps and chains (in place, what came later is listed later)
        let list = |ns: &Netns| {
            let listing = ns.ok(["nft", "list", "table", "inet", "flock_policy"]);
            let mut blocks: Vec<String> = listing
                .trim()
                .trim_start_matches("table inet flock_policy {")
                .trim_end_matches('}')
                .split("\n\n")
                .map(|b| b.trim().to_owned())
                .collect();
            blocks.sort();
            blocks
        };
        assert_eq!(list(&node_ns), list(&fresh_ns), "after step {i}");
    }
    let encoded = metrics.encode();
    assert!(
        encoded.contains("flock_policy_applies_total{kind=\"elements\"}"),
        "the element path over netlink ran: {encoded}"
    );
}

/// The remote client, now with an address of each family, labelled `role`.
fn dual_far_client(role: &str) -> k8s_openapi::api::core::v1::Pod {
    pod(
        "shop",
        "far-client",
        "node-b",
        json!({ "role": role }),
        &["2001:db8:53::1", "10.253.0.1"],
    )
}

/// The server policy admitting `block` besides the clients.
fn server_with_block(block: &str) -> k8s_openapi::api::networking::v1::NetworkPolicy {
    policy(
        "server",
        json!({
            "podSelector": { "matchLabels": { "app": "server" } },
            "ingress": [{
                "from": [{ "ipBlock": { "cidr": block } },
                         { "podSelector": { "matchLabels": { "role": "client" } } }],
                "ports": [{ "port": "http" }]
            }]
        }),
    )
}

/// The lines of the policy log at `path` once there are `want` (up to 5 s).
async fn log_lines(path: &std::path::Path, want: usize) -> Vec<serde_json::Value> {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("a JSON line"))
            .collect();
        if lines.len() >= want || std::time::Instant::now() > deadline {
            return lines;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn annotated(log: &str) -> k8s_openapi::api::core::v1::Namespace {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": { "name": "shop", "annotations": { "flock.fritzlab.net/policy-log": log } }
    }))
    .expect("namespace fixture")
}

/// A namespace annotated `deny` has its pods' denied connections logged from the kernel
/// (nfnetlink_log, in the node's namespace) as lines naming both pods and why; `all` adds
/// the allowed ones with the rule that allowed them; a value flock does not know logs nothing
/// and is shown with the policies not enforced as written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_annotated_namespace_has_its_decisions_logged_with_the_rule_that_decided() {
    let node_ns = Netns::new("node");
    let KernelNode {
        state,
        agent,
        enforcer,
        pods,
        metrics,
        health,
    } = KernelNode::start(&node_ns, "2001:db8:52::/64", "10.252.0.0/24").await;
    let options = flock_agent::policy::decisions::LogOptions {
        path: state.path().join("log/policy.log"),
        ..Default::default()
    };
    flock_agent::policy::decisions::start(
        &enforcer,
        &options,
        &metrics,
        &health,
        &NsTarget::Path(node_ns.path()),
    )
    .await;
    assert_eq!(health.notes(), Vec::<String>::new(), "the group is bound");
    list_all(
        &enforcer,
        vec![server_policy()],
        vec![annotated("deny")],
        vec![],
    );
    let server = add(&agent, &pods, "srv", "server", json!({ "app": "server" })).await;
    let client = add(&agent, &pods, "cli", "client", json!({ "role": "client" })).await;
    let other = add(&agent, &pods, "oth", "other", json!({ "role": "other" })).await;
    let _http = server.ns.run(|| TcpListener::bind("[::]:8080").unwrap());

    assert!(
        client.ns.tcp_connects(server.v6, 8080),
        "allowed, not logged"
    );
    assert!(!other.ns.tcp_connects(server.v6, 8080), "denied, logged");
    let lines = log_lines(&options.path, 1).await;
    assert_eq!(lines.len(), 1, "only the denied connection: {lines:#?}");
    let line = &lines[0];
    assert_eq!(line["verdict"], "deny");
    assert_eq!(line["direction"], "ingress");
    assert_eq!(line["srcPod"], "shop/other");
    assert_eq!(line["src"], other.v6.to_string());
    assert_eq!(line["dstPod"], "shop/server");
    assert_eq!(
        (line["protocol"].as_str(), line["port"].as_u64()),
        (Some("tcp"), Some(8080))
    );
    assert_eq!(line["policy"], "none");
    assert_eq!(
        line["decidedBy"],
        "ingress of shop/server: no NetworkPolicy selecting it allows it (shop/server)",
        "{line}"
    );
    // (a SYN retransmitted within the second is one more line, or none over the rate)

    // `all`: the allowed connection is logged too, with the rule that allowed it
    enforcer.on_namespace(Event::Apply(annotated("all")));
    applied(&enforcer).await;
    let before = log_lines(&options.path, 0).await.len();
    assert!(client.ns.tcp_connects(server.v4, 8080));
    let lines = log_lines(&options.path, before + 1).await;
    let allowed: Vec<_> = lines[before..]
        .iter()
        .filter(|l| l["verdict"] == "allow" && l["direction"] == "ingress")
        .collect();
    assert_eq!(allowed.len(), 1, "{lines:#?}");
    assert_eq!(allowed[0]["src"], client.v4.to_string());
    assert_eq!(allowed[0]["policy"], "networkpolicy shop/server");
    assert_eq!(
        allowed[0]["decidedBy"],
        "ingress of shop/server by networkpolicy shop/server (rule 0)"
    );
    let text = metrics.encode();
    assert!(
        text.contains(
            "flock_policy_decisions_total{policy=\"networkpolicy shop/server\",verdict=\"allow\"} 1"
        ),
        "{text}"
    );

    // a value flock does not know: nothing logged, and said where the policies are
    enforcer.on_namespace(Event::Apply(annotated("verbose")));
    applied(&enforcer).await;
    assert_eq!(
        health.notes(),
        [
            "networkpolicy: 1 not enforced as written: namespace shop: annotation flock.fritzlab.net/policy-log: \"verbose\" is neither \"deny\" nor \"all\" (nothing logged)"
        ]
    );
    let before = log_lines(&options.path, 0).await.len();
    assert!(!other.ns.tcp_connects(server.v4, 8080));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        log_lines(&options.path, 0).await.len(),
        before,
        "logging is off"
    );
    assert!(
        !node_ns
            .ok(["nft", "list", "ruleset"])
            .contains("log prefix"),
        "no log statement is left"
    );
}
