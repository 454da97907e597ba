//! NetworkPolicy enforcement in the agent: the cost an ADD adds when its namespace has 50
//! policies selecting it, and the time from a policy change to an applied ruleset, in a
//! cluster of 100 or 10 000 pods in 100 namespaces, with 100 pods already on this node.
//! `memory_nft`: planning only (`nft` in memory); `kernel`: the real thing, in a network
//! namespace of the bench's own (root; left out when it cannot be made): element updates
//! over netlink, chains and tables by `nft -f`.
//!
//! `cargo bench -p flock-agent --bench policy`

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use flock_agent::metrics::{Health, Metrics};
use flock_agent::policy::PolicyEnforcer;
use flock_agent::policy::nft::{MemoryNft, Nft, NftCommand};
use flock_agent::policy::view::LocalPod;
use flock_netns::NsTarget;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::runtime::watcher::Event;
use serde_json::json;

const NAMESPACES: usize = 100;
/// Cluster sizes: a small cluster, and the 10 000 pods.
const PODS: [usize; 2] = [100, 10_000];
const POLICIES_IN_NS: usize = 50;

fn policy(ns: usize, k: usize, port: usize) -> NetworkPolicy {
    serde_json::from_value(json!({
        "metadata": { "namespace": format!("ns{ns}"), "name": format!("pol{k}") },
        "spec": {
            "podSelector": { "matchLabels": { "app": "web" } },
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{ "from": [{ "podSelector": { "matchLabels": { "role": format!("r{}", k % 5) } } }],
                          "ports": [{ "port": "http" }, { "port": 443 + port }] }],
            "egress": [{ "to": [{ "namespaceSelector": { "matchLabels": { "team": format!("t{}", k % 10) } } }] }]
        }
    }))
    .expect("policy")
}

fn pod(i: usize) -> Pod {
    serde_json::from_value(json!({
        "metadata": { "namespace": format!("ns{}", i % NAMESPACES), "name": format!("pod{i}"),
                      "uid": format!("u{i}"),
                      "labels": { "app": if i.is_multiple_of(3) { "web" } else { "db" }, "role": format!("r{}", i % 5) } },
        "spec": { "nodeName": format!("node{}", i % 100),
                  "containers": [{ "name": "c", "ports": [{ "name": "http", "containerPort": 8080 }] }] },
        "status": { "phase": "Running", "podIPs": [
            { "ip": format!("2001:db8:{:x}::{:x}", i / 65536, i % 65536) },
            { "ip": format!("10.{}.{}.{}", 64 + i / 65536, (i / 256) % 256, i % 256) } ] }
    }))
    .expect("pod")
}

/// Pods already on this node: replicas of the workloads the cluster has.
const LOCAL_PODS: usize = 100;

fn local_pod(ns: usize, name: String, n: usize, app: &str) -> LocalPod {
    LocalPod {
        key: (format!("ns{ns}"), name),
        uid: String::new(),
        addresses: vec![
            format!("2001:db8:ff::{:x}", n % 65536).parse().unwrap(),
            format!("10.255.{}.{}", (n / 256) % 256, n % 256)
                .parse()
                .unwrap(),
        ],
        labels: [("app".into(), app.into())].into(),
        ports: vec![flock_policy::NamedPort {
            name: "http".into(),
            protocol: flock_policy::Protocol::Tcp,
            port: 8080,
        }],
    }
}

fn cluster(rt: &tokio::runtime::Runtime, pods: usize, nft: Arc<dyn Nft>) -> Arc<PolicyEnforcer> {
    let _guard = rt.enter();
    let enforcer =
        PolicyEnforcer::spawn(nft, Arc::new(Metrics::new()), Arc::new(Health::default()));
    enforcer.on_policy(Event::Init);
    for k in 0..POLICIES_IN_NS {
        enforcer.on_policy(Event::InitApply(policy(0, k, k)));
    }
    enforcer.on_policy(Event::InitDone);
    enforcer.on_namespace(Event::Init);
    for n in 0..NAMESPACES {
        let ns: Namespace = serde_json::from_value(json!({
            "metadata": { "name": format!("ns{n}"), "labels": { "team": format!("t{}", n % 10) } }
        }))
        .expect("ns");
        enforcer.on_namespace(Event::InitApply(ns));
    }
    enforcer.on_namespace(Event::InitDone);
    enforcer.on_pod(Event::Init);
    for i in 0..pods {
        enforcer.on_pod(Event::InitApply(pod(i)));
    }
    enforcer.on_pod(Event::InitDone);
    enforcer.on_cluster_policy(Event::Init);
    enforcer.on_cluster_policy(Event::InitDone);
    for i in 0..LOCAL_PODS {
        let app = if i.is_multiple_of(3) { "web" } else { "db" };
        enforcer.restore(
            format!("flockhere{i:03}"),
            local_pod(i % 4, format!("here{i}"), 60_000 + i, app),
        );
    }
    enforcer
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    // a namespace of the bench's own; never the machine's
    let netns = std::panic::catch_unwind(|| flock_testkit::Netns::new("pbench")).ok();
    let mut subjects: Vec<(&str, usize, Arc<dyn Nft>)> = Vec::new();
    for pods in PODS {
        subjects.push(("memory_nft", pods, Arc::new(MemoryNft::default())));
    }
    match &netns {
        Some(ns) => subjects.push((
            "kernel",
            10_000,
            Arc::new(NftCommand::new("nft", NsTarget::Path(ns.path()))),
        )),
        None => eprintln!("no network namespace (not root?): the kernel subject is left out"),
    }
    for (subject, pods, nft) in subjects {
        let enforcer = cluster(&rt, pods, nft);
        let wait = Duration::from_secs(30);
        rt.block_on(async {
            let g = enforcer.update(|_| false);
            enforcer.wait_applied(g, wait).await.expect("first apply");
        });
        let mut n = 0usize;
        c.bench_function(
            &format!("add_wait_50_policies_in_namespace/{subject}/{pods}_pods"),
            |b| {
                b.iter(|| {
                    n += 1;
                    let host_if = format!("flockbench{:03}", n % 1000);
                    // a replica of a workload the node already runs (ns0's web pods)
                    let pod = local_pod(0, format!("new{n}"), n, "web");
                    rt.block_on(enforcer.admit(host_if.clone(), pod, wait))
                        .expect("admitted");
                    enforcer.forget(&host_if);
                    black_box(());
                });
            },
        );
        let mut k = 0;
        c.bench_function(
            &format!("policy_change_to_applied/{subject}/{pods}_pods"),
            |b| {
                b.iter(|| {
                    k += 1;
                    // a new port in one of the 50 policies: a real change every time
                    enforcer.on_policy(Event::Apply(policy(0, k % POLICIES_IN_NS, 1000 + k)));
                    let g = enforcer.update(|_| false);
                    rt.block_on(enforcer.wait_applied(g, wait))
                        .expect("applied");
                });
            },
        );
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(8));
    targets = bench
}
criterion_main!(benches);
