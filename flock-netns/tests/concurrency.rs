//! Many pods at once from one runtime, and no leaked fds or threads.
#![cfg(feature = "root-tests")]

use std::sync::Arc;

use flock_netns::{NodeNs, PodSpec, check, host_ifname, list_host_ifaces, setup, teardown};
use flock_testkit::Netns;

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

fn spec(pod: &Netns, i: usize) -> PodSpec {
    PodSpec {
        container_id: format!("conc-{i}"),
        host_if: host_ifname(&format!("conc-{i}"), "eth0", 0),
        netns: pod.path(),
        if_name: "eth0".into(),
        mtu: 1500,
        addresses: vec![
            format!("2001:db8:7::{:x}/128", i + 1).parse().unwrap(),
            format!("10.244.{}.{}/32", 7 + i / 200, 1 + i % 200)
                .parse()
                .unwrap(),
        ],
        anycast: vec!["10.100.7.1".parse().unwrap()],
        default_route: true,
        routes: vec![],
    }
}

#[test]
fn fifty_concurrent_pods_and_no_leaks_after_200_cycles() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let node_ns = Netns::new("node");
    let node = Arc::new(NodeNs::at(node_ns.path()));
    let pods: Vec<Netns> = (0..50).map(|_| Netns::new("pod")).collect();
    let specs: Vec<PodSpec> = pods.iter().enumerate().map(|(i, p)| spec(p, i)).collect();

    rt.block_on(async {
        let tasks: Vec<_> = specs
            .iter()
            .cloned()
            .map(|s| {
                let node = node.clone();
                tokio::spawn(async move { setup(&node, &s).await })
            })
            .collect();
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        assert_eq!(list_host_ifaces(&node).await.unwrap().len(), 50);
        for s in &specs {
            assert_eq!(check(&node, s).await.unwrap(), vec![], "{}", s.container_id);
        }
        // one route, fifty nexthops: no concurrent setup lost one
        let r = node_ns.ok(["ip", "route", "show", "10.100.7.1"]);
        assert_eq!(r.matches("nexthop").count(), 50, "{r}");
        for s in &specs {
            teardown(&node, s).await.unwrap();
        }
        assert!(list_host_ifaces(&node).await.unwrap().is_empty());
        assert_eq!(node_ns.ok(["ip", "route", "show", "10.100.7.1"]), "");
    });

    // warm-up done: the runtime's workers and the node connection exist
    std::thread::sleep(std::time::Duration::from_millis(200));
    let (fds, threads) = (count("/proc/self/fd"), count("/proc/self/task"));
    rt.block_on(async {
        for cycle in 0..200 {
            let s = &specs[cycle % specs.len()];
            setup(&node, s).await.unwrap();
            teardown(&node, s).await.unwrap();
        }
    });
    // Detached helper threads (veth deletion, namespace entry) finish on their own time.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let (fds_after, threads_after) = loop {
        let now = (count("/proc/self/fd"), count("/proc/self/task"));
        if (now.0 <= fds && now.1 <= threads) || std::time::Instant::now() > deadline {
            break now;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(fds_after <= fds, "fds {fds} → {fds_after}");
    assert!(
        threads_after <= threads,
        "threads {threads} → {threads_after}"
    );
}

#[test]
fn node_connection_survives_its_runtime() {
    let node_ns = Netns::new("node");
    let pod = Netns::new("pod");
    let node = NodeNs::at(node_ns.path());
    let s = spec(&pod, 0);
    for _ in 0..2 {
        // each runtime ends with the node connection it opened
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            setup(&node, &s).await.unwrap();
            assert_eq!(check(&node, &s).await.unwrap(), vec![]);
            teardown(&node, &s).await.unwrap();
        });
    }
}
