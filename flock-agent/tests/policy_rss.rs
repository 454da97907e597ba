//! The agent's memory with NetworkPolicy enforcement in a large cluster, without one: the
//! four cluster-wide watches list, page by page, from a mocked API server serving 10 000
//! pods (bound to other nodes) in 100 namespaces, 1 000 NetworkPolicies and 100
//! ClusterNetworkPolicies (50 Admin, 50 Baseline); 100 pods are on this node; once the model
//! is built and applied the process's VmRSS is read. Then, in the same process, 100 policy
//! changes (NetworkPolicies and ClusterNetworkPolicies in turn, each a watch event) are each
//! timed from the event to the ruleset enforced: the model changed, the plan, the
//! transaction applied by real `nft` (and netlink) to the table in a namespace the test
//! makes, as the agent applies it to its node's. Its own test binary, so the figure is this
//! process's alone (`nft` runs as a child process, as in the agent). Root; ignored by default
//! (it takes a while in a debug build):
//!
//! `cargo nextest run --release -p flock-agent --features root-tests --test policy_rss --run-ignored all --no-capture`
//!
//! The agent runs with `MALLOC_ARENA_MAX=1` (`deploy/daemonset.yaml`); glibc reads it at the
//! first allocation, so the test re-runs itself with it set when it is not.
#![cfg(feature = "root-tests")]

use std::sync::Arc;
use std::time::Duration;

use flock_agent::metrics::{Health, Metrics};
use flock_agent::policy::PolicyEnforcer;
use flock_agent::policy::nft::NftCommand;
use flock_agent::policy::view::LocalPod;
use flock_agent::policy::watches::spawn_watches;
use flock_netns::NsTarget;
use flock_testkit::Netns;
use flock_testkit::kube_mock::*;
use serde_json::{Value, json};

const PODS: usize = 10_000;
const NAMESPACES: usize = 100;
const POLICIES: usize = 1_000;
const LOCAL_PODS: usize = 100;
const CLUSTER_POLICIES: usize = 100;
/// Policy changes timed after the first apply.
const CHANGES: usize = 100;
/// Issue 15's budget.
const BUDGET_MIB: u64 = 64;

const TIERS: [&str; 3] = ["web", "db", "cache"];

fn cluster_pod(i: usize) -> Value {
    let tier = TIERS[i % 3];
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "namespace": format!("ns{}", i % NAMESPACES), "name": format!("app{}-7d9f8c6b5-{i:05x}", i % 37),
            "uid": format!("0b5c8a3e-1f2d-4c5b-9a8e-{i:012x}"), "resourceVersion": "7",
            "labels": { "app": format!("app{}", i % 37), "tier": tier,
                        "pod-template-hash": "7d9f8c6b5", "team": format!("t{}", i % 10) },
            "annotations": { "kubectl.kubernetes.io/restartedAt": "2026-01-01T00:00:00Z" },
            "ownerReferences": [{ "apiVersion": "apps/v1", "kind": "ReplicaSet", "controller": true,
                                  "name": format!("app{}-7d9f8c6b5", i % 37), "uid": "x" }]
        },
        "spec": {
            "nodeName": format!("elsewhere{}", i % 100),
            "containers": [{ "name": "app", "image": "registry.example/app:1.2.3",
                             "ports": [{ "name": "http", "containerPort": 8080 },
                                       { "name": "metrics", "containerPort": 9090 }],
                             "env": [{ "name": "A", "value": "some value the agent drops" }] }]
        },
        "status": { "phase": "Running", "podIP": format!("10.{}.{}.{}", 64 + i / 65536, (i / 256) % 256, i % 256),
                    "podIPs": [{ "ip": format!("2001:db8:{:x}::{:x}", i / 65536, i % 65536) },
                               { "ip": format!("10.{}.{}.{}", 64 + i / 65536, (i / 256) % 256, i % 256) }] }
    })
}

fn policy(k: usize) -> Value {
    let ns = k % NAMESPACES;
    let tier = TIERS[k % 3];
    json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": { "namespace": format!("ns{ns}"), "name": format!("pol{k}"), "resourceVersion": "7" },
        "spec": {
            "podSelector": { "matchLabels": { "app": format!("app{}", k % 37) } },
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{ "from": [
                              { "podSelector": { "matchLabels": { "tier": tier } } },
                              { "namespaceSelector": { "matchLabels": { "team": format!("t{}", k % 10) } },
                                "podSelector": { "matchExpressions": [{ "key": "app", "operator": "In",
                                                 "values": [format!("app{}", (k + 1) % 37)] }] } },
                              { "ipBlock": { "cidr": "2001:db8::/32", "except": [format!("2001:db8:{:x}::/48", k % 4096)] } } ],
                          "ports": [{ "port": "http" }, { "port": 443 }, { "protocol": "UDP", "port": 53 }] }],
            "egress": [{ "to": [{ "namespaceSelector": { "matchLabels": { "team": format!("t{}", k % 10) } } }],
                         "ports": [{ "port": "metrics" }] }]
        }
    })
}

/// Cluster policy `k`: the first half Admin, the rest Baseline; subjects by team, peers by
/// namespace labels, pods and networks, ports by number and range.
fn cluster_policy(k: usize) -> Value {
    let tier = if k < CLUSTER_POLICIES / 2 {
        "Admin"
    } else {
        "Baseline"
    };
    json!({
        "apiVersion": "policy.networking.k8s.io/v1beta1", "kind": "ClusterNetworkPolicy",
        "metadata": { "name": format!("cnp{k}"), "resourceVersion": "7" },
        "spec": {
            "tier": tier, "priority": k % 1000,
            "subject": { "namespaces": { "matchLabels": { "team": format!("t{}", k % 10) } } },
            "ingress": [
                { "name": "from-ops", "action": if k.is_multiple_of(3) { "Pass" } else { "Accept" },
                  "from": [{ "namespaces": { "matchLabels": { "team": format!("t{}", (k + 1) % 10) } } }],
                  "protocols": [{ "tcp": { "destinationPort": { "number": 9090 } } }] },
                { "name": "deny-app", "action": "Deny",
                  "from": [{ "pods": { "namespaceSelector": {},
                                       "podSelector": { "matchLabels": { "app": format!("app{}", k % 37) } } } }],
                  "protocols": [{ "tcp": { "destinationPort": { "range": { "start": 8000, "end": 8999 } } } }] }
            ],
            "egress": [
                { "name": "deny-range", "action": "Deny",
                  "to": [{ "networks": [format!("2001:db8:{:x}::/48", 0x8000 + k)] }] },
                { "name": "dns", "action": "Accept",
                  "to": [{ "namespaces": { "matchLabels": { "team": "t0" } } }],
                  "protocols": [{ "udp": { "destinationPort": { "number": 53 } } }] }
            ]
        }
    })
}

fn namespace(n: usize) -> Value {
    json!({ "apiVersion": "v1", "kind": "Namespace",
            "metadata": { "name": format!("ns{n}"), "resourceVersion": "7",
                          "labels": { "team": format!("t{}", n % 10), "kubernetes.io/metadata.name": format!("ns{n}") } } })
}

fn vm(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("a VmRSS line")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a memory figure: run explicitly (see the module doc)"]
async fn agent_rss_with_10000_cluster_pods_and_1000_policies() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        let status = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                "agent_rss_with_10000_cluster_pods_and_1000_policies",
                "--ignored",
                "--nocapture",
            ])
            .env("MALLOC_ARENA_MAX", "1")
            .status()
            .expect("re-running the test");
        assert!(status.success(), "the run with MALLOC_ARENA_MAX=1 failed");
        return;
    }
    let (client, mut api) = mock_client();
    let node = Netns::new("rss");
    let metrics = Arc::new(Metrics::new());
    let enforcer = PolicyEnforcer::spawn(
        Arc::new(NftCommand::new("nft", NsTarget::Path(node.path()))),
        metrics.clone(),
        Arc::new(Health::default()),
    );
    for i in 0..LOCAL_PODS {
        enforcer.restore(
            format!("flock{i:08x}"),
            LocalPod {
                key: (format!("ns{}", i % NAMESPACES), format!("here{i}")),
                uid: String::new(),
                addresses: vec![format!("2001:db8:ff::{i:x}").parse().unwrap()],
                labels: [("app".into(), format!("app{}", i % 37))].into(),
                ports: vec![],
            },
        );
    }
    spawn_watches(client, enforcer.clone());
    let mut watches = Vec::new();
    let applied = async {
        loop {
            let g = enforcer.update(|_| false);
            if g > 0
                && enforcer
                    .wait_applied(g, Duration::from_millis(200))
                    .await
                    .is_ok()
            {
                return;
            }
        }
    };
    let serve = async {
        loop {
            let (req, reply) = next_request(&mut api).await;
            if query_param(&req, "watch").as_deref() == Some("true") {
                watches.push(reply); // held open: no events
                continue;
            }
            let page: usize = query_param(&req, "continue")
                .and_then(|c| c.parse().ok())
                .unwrap_or(0);
            let limit: usize = query_param(&req, "limit")
                .and_then(|l| l.parse().ok())
                .unwrap_or(usize::MAX);
            let (kind, api_version, total, item): (&str, &str, usize, fn(usize) -> Value) =
                match req.uri().path() {
                    "/api/v1/pods" => ("PodList", "v1", PODS, cluster_pod),
                    "/api/v1/namespaces" => ("NamespaceList", "v1", NAMESPACES, namespace),
                    "/apis/policy.networking.k8s.io/v1beta1/clusternetworkpolicies" => (
                        "ClusterNetworkPolicyList",
                        "policy.networking.k8s.io/v1beta1",
                        CLUSTER_POLICIES,
                        cluster_policy,
                    ),
                    _ => (
                        "NetworkPolicyList",
                        "networking.k8s.io/v1",
                        POLICIES,
                        policy,
                    ),
                };
            let start = page * limit.min(total);
            let end = (start + limit).min(total);
            let mut body = list(kind, api_version, "7", (start..end).map(item).collect());
            if end < total {
                body["metadata"]["continue"] = json!((page + 1).to_string());
            }
            reply_json(reply, &body);
        }
    };
    tokio::select! {
        () = applied => {}
        () = serve => {}
    }
    // before the test's own copies of the inputs and the ruleset below
    let (rss, hwm) = (vm("VmRSS:"), vm("VmHWM:"));
    let inputs = enforcer.inputs();
    assert_eq!(
        (
            inputs.pods.len(),
            inputs.policies.len(),
            inputs.cluster_policies.len()
        ),
        (PODS + LOCAL_PODS, POLICIES, CLUSTER_POLICIES)
    );
    assert_eq!(
        enforcer.status().not_as_written,
        Vec::<String>::new(),
        "every policy is enforced as written"
    );
    let ruleset = enforcer.applied_ruleset().expect("applied");
    let elements: usize = ruleset
        .sets
        .values()
        .map(|s| match &s.elements {
            flock_policy::Elements::Addrs(a) => a.len(),
            flock_policy::Elements::Ranges(r) => r.len(),
            flock_policy::Elements::AddrPorts(a) => a.len(),
        })
        .sum();
    drop(inputs);
    println!(
        "agent RSS with {PODS} cluster pods, {POLICIES} NetworkPolicies, {CLUSTER_POLICIES} \
         ClusterNetworkPolicies, {LOCAL_PODS} local pods ({} judged for ingress, {} sets, \
         {elements} elements): VmRSS {:.1} MiB, VmHWM {:.1} MiB",
        ruleset.ingress.len(),
        ruleset.sets.len(),
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
    drop(ruleset);
    assert!(
        rss <= BUDGET_MIB * 1024,
        "VmRSS {rss} kB is over {BUDGET_MIB} MiB"
    );

    // Policy changes, each from its watch event to the ruleset applied: NetworkPolicies and
    // ClusterNetworkPolicies in turn, each a new port (its rules change, its sets do not) or,
    // every fourth, a new ipBlock except (a set changes: the whole table again).
    let mut took = Vec::with_capacity(CHANGES);
    for i in 0..CHANGES {
        let k = i * 7 % POLICIES;
        let started = std::time::Instant::now();
        if i % 2 == 0 {
            let mut p = policy(k);
            p["metadata"]["resourceVersion"] = json!(format!("{}", 100 + i));
            p["spec"]["ingress"][0]["ports"][1]["port"] = json!(1000 + i);
            if i % 4 == 0 {
                p["spec"]["ingress"][0]["from"][2]["ipBlock"]["except"] =
                    json!([format!("2001:db8:{:x}::/48", 0x4000 + i)]);
            }
            enforcer.on_policy(kube::runtime::watcher::Event::Apply(
                serde_json::from_value(p).expect("a NetworkPolicy"),
            ));
        } else {
            let mut c = cluster_policy(k % CLUSTER_POLICIES);
            c["metadata"]["resourceVersion"] = json!(format!("{}", 100 + i));
            c["spec"]["ingress"][0]["protocols"][0]["tcp"]["destinationPort"]["number"] =
                json!(2000 + i);
            if i % 4 == 1 {
                c["spec"]["egress"][0]["to"][0]["networks"] =
                    json!([format!("2001:db8:{:x}::/48", 0x6000 + i)]);
            }
            enforcer.on_cluster_policy(kube::runtime::watcher::Event::Apply(
                serde_json::from_value(c).expect("a ClusterNetworkPolicy"),
            ));
        }
        let generation = enforcer.update(|_| false);
        enforcer
            .wait_applied(generation, Duration::from_secs(30))
            .await
            .expect("the change is applied");
        took.push(started.elapsed());
    }
    took.sort();
    let at = |q: f64| took[((took.len() as f64 * q).ceil() as usize).saturating_sub(1)];
    println!(
        "{CHANGES} policy changes, watch event → ruleset in the kernel: p50 {:.1} ms, \
         p99 {:.1} ms, max {:.1} ms; VmRSS after them {:.1} MiB, VmHWM {:.1} MiB; \
         transactions by kind: {}",
        at(0.50).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3,
        took[took.len() - 1].as_secs_f64() * 1e3,
        vm("VmRSS:") as f64 / 1024.0,
        vm("VmHWM:") as f64 / 1024.0,
        metrics
            .encode()
            .lines()
            .filter(|l| l.starts_with("flock_policy_applies_total{"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let rss = vm("VmRSS:");
    assert!(
        rss <= BUDGET_MIB * 1024,
        "VmRSS {rss} kB after the changes is over {BUDGET_MIB} MiB"
    );
    let listing = node.ok(["nft", "list", "table", "inet", "flock_policy"]);
    assert!(
        listing.contains("chain forward"),
        "the table is in the kernel"
    );
}
