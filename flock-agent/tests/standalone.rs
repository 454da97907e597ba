//! End to end, standalone: the real agent in a stand-in node namespace, the real shim exec'd
//! as a runtime does (through testkit's libcni-like runtime), real pod namespaces and `ping`.
#![cfg(feature = "root-tests")]

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use flock_testkit::Netns;
use flock_testkit::cni::{Attachment, GcAttachment};
use flock_testkit::node::FlockNode;
use serde_json::{Value, json};

const NODE: &str = "apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
metadata:
  name: node-a
spec:
  cidr6: 2001:db8:a1::/64
  cidr4: 10.71.0.0/24
";

fn attach(id: &str, pod: &Netns) -> Attachment {
    Attachment::new(id, pod.path(), "eth0")
        .with_arg("K8S_POD_NAMESPACE", "default")
        .with_arg("K8S_POD_NAME", id)
}

fn pod_ips(result: &Value) -> Vec<String> {
    result["ips"]
        .as_array()
        .expect("ips")
        .iter()
        .map(|ip| ip["address"].as_str().expect("address").to_owned())
        .collect()
}

/// The node's host veths (links named `flock…`).
fn host_links(node: &FlockNode) -> Vec<String> {
    let mut links = node.ns().links();
    links.retain(|n| n.starts_with("flock"));
    links
}

/// The host veths once `want` of them are left (see `Netns::links_settled`).
fn host_links_settled(node: &FlockNode, want: usize) -> Vec<String> {
    let is_host = |n: &String| n.starts_with("flock");
    let mut links = node
        .ns()
        .links_settled(|l| l.iter().filter(|n| is_host(n)).count() == want);
    links.retain(is_host);
    links
}

fn host_routes(node: &FlockNode) -> String {
    let mut out = node.ns().ok(["ip", "route", "show"]);
    out.push_str(&node.ns().ok(["ip", "-6", "route", "show"]));
    out.lines()
        .filter(|l| l.contains("dev flock"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Polls `busy` every `every` while it holds, for at most `limit`; the caller asserts what
/// it was waiting for.
fn wait_while(limit: Duration, every: Duration, mut busy: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while busy() && Instant::now() < deadline {
        std::thread::sleep(every);
    }
}

#[test]
fn add_check_del_lifecycle() {
    let node = FlockNode::start("node", NODE);
    let rt = node.runtime("flock");
    let pod = Netns::new("pod");
    let att = attach("lifecycle1", &pod);

    let result = rt.add(&att).expect("ADD");
    let ips = pod_ips(&result);
    assert_eq!(ips.len(), 2, "{result}");
    assert!(
        ips[0].starts_with("2001:db8:a1:") && ips[0].ends_with("/128"),
        "{ips:?}"
    );
    assert!(
        ips[1].starts_with("10.71.0.") && ips[1].ends_with("/32"),
        "{ips:?}"
    );
    let addrs = pod.ok(["ip", "addr", "show", "eth0"]);
    for ip in &ips {
        assert!(addrs.contains(ip.as_str()), "{ip} not on eth0: {addrs}");
    }
    assert!(pod.pings("169.254.1.1"), "pod cannot ping its IPv4 gateway");
    assert!(
        pod.pings("fe80::1%eth0"),
        "pod cannot ping its IPv6 gateway"
    );
    // The node (with an address of its own, as a real node has) reaches the pod on its routed
    // addresses.
    node.ns()
        .ok(["ip", "addr", "add", "10.99.0.1/32", "dev", "lo"]);
    for ip in &ips {
        let addr = ip.split('/').next().unwrap();
        assert!(node.ns().pings(addr), "node cannot ping pod address {addr}");
    }

    // kubelet retries ADD: the same attachment gets the same result.
    let again = rt.add(&att).expect("second ADD");
    assert_eq!(again, result);

    rt.check(&att).expect("CHECK after ADD");
    pod.ok(["ip", "route", "del", "default", "via", "169.254.1.1"]);
    let err = rt
        .check(&att)
        .expect_err("CHECK must see the missing route");
    let cni = err.cni_error().expect("a CNI error");
    assert!(
        cni.msg.contains("default via 169.254.1.1"),
        "the error names the route: {cni:?}"
    );

    rt.del(&att).expect("DEL");
    let links = host_links_settled(&node, 0);
    assert!(links.is_empty(), "veth left: {links:?}");
    assert_eq!(host_routes(&node), "", "routes left");
    assert!(
        node.records().is_empty(),
        "records left: {:?}",
        node.records()
    );
    assert!(
        !pod.ok(["ip", "link"]).contains("eth0"),
        "pod interface left"
    );
    rt.del(&att).expect("second DEL");
    rt.del(&att.clone().without_netns())
        .expect("DEL with empty CNI_NETNS");
}

#[test]
fn pods_on_one_node_reach_each_other() {
    let node = FlockNode::start("node", NODE);
    let rt = node.runtime("flock");
    let (p1, p2) = (Netns::new("pod"), Netns::new("pod"));
    let r1 = rt.add(&attach("peer1", &p1)).expect("ADD 1");
    let r2 = rt.add(&attach("peer2", &p2)).expect("ADD 2");
    for ip in pod_ips(&r2) {
        let addr = ip.split('/').next().unwrap().to_owned();
        assert!(p1.pings(&addr), "pod 1 cannot reach pod 2 at {addr}");
    }
    for ip in pod_ips(&r1) {
        let addr = ip.split('/').next().unwrap().to_owned();
        assert!(p2.pings(&addr), "pod 2 cannot reach pod 1 at {addr}");
    }
}

/// A GC request straight to the agent (as the shim forwards it), with the list under `key`.
fn raw_gc(node: &FlockNode, network: &str, key: &str, valid: &[&str]) {
    let list: Vec<Value> = valid
        .iter()
        .map(|id| json!({"containerID": id, "ifname": "eth0"}))
        .collect();
    let config = json!({
        "cniVersion": "1.1.0",
        "name": network,
        "type": "flock",
        "agentSocket": node.socket(),
        key: list,
    });
    let out = node
        .raw_rpc(
            format!(
                "{}\n",
                json!({"v":1,"op":"GC","containerId":"","netns":"","ifName":"","args":"","path":"","config":config})
            )
            .as_bytes(),
            Duration::from_secs(10),
        )
        .expect("GC over the socket");
    assert!(!out.contains("\"error\""), "GC with {key} failed: {out}");
}

#[test]
fn gc_removes_exactly_the_stale_attachments_of_its_network() {
    let node = FlockNode::start("node", NODE);
    let flock = node.runtime("flock");
    let other = node.runtime("other");
    let pods: Vec<Netns> = (0..5).map(|_| Netns::new("pod")).collect();
    let a: Vec<Attachment> = ["gckeep", "gcdrop1", "gcdrop2", "gcdrop3"]
        .iter()
        .zip(&pods)
        .map(|(id, p)| attach(id, p))
        .collect();
    for att in &a {
        flock.add(att).expect("ADD flock");
    }
    let foreign = attach("gcother", &pods[4]);
    other.add(&foreign).expect("ADD other");
    assert_eq!(node.records().len(), 5);

    // The agent's own GC, with each of the two keys: `cni.dev/valid-attachments` (CNI 1.1),
    // then `cni.dev/attachments` (as runtimes before 1.1 final passed it). `gcother` is of
    // another network and is never in the list.
    raw_gc(
        &node,
        "flock",
        "cni.dev/valid-attachments",
        &["gckeep", "gcdrop2", "gcdrop3"],
    );
    assert_eq!(
        node.records(),
        [
            "gcdrop2:eth0.json",
            "gcdrop3:eth0.json",
            "gckeep:eth0.json",
            "gcother:eth0.json"
        ],
        "valid-attachments: exactly gcdrop1 goes"
    );
    assert_eq!(host_links_settled(&node, 4).len(), 4);
    raw_gc(
        &node,
        "flock",
        "cni.dev/attachments",
        &["gckeep", "gcdrop3"],
    );
    assert_eq!(
        node.records(),
        ["gcdrop3:eth0.json", "gckeep:eth0.json", "gcother:eth0.json"],
        "attachments: exactly gcdrop2 goes"
    );
    assert_eq!(host_links_settled(&node, 3).len(), 3);

    // GC as libcni runs it (DEL of the cached stale attachments, then GC with the list).
    flock
        .gc(&[GcAttachment {
            container_id: "gckeep".into(),
            if_name: "eth0".into(),
        }])
        .expect("GC");
    assert_eq!(
        node.records(),
        ["gckeep:eth0.json", "gcother:eth0.json"],
        "GC must remove exactly the stale attachments of its own network"
    );
    // And the other network's GC takes its own stale attachment, not flock's.
    raw_gc(&node, "other", "cni.dev/valid-attachments", &[]);
    assert_eq!(node.records(), ["gckeep:eth0.json"]);
    let links = host_links_settled(&node, 1);
    assert_eq!(links.len(), 1, "{links:?}");
}

#[test]
fn del_queued_while_the_agent_is_down_runs_at_its_start() {
    let mut node = FlockNode::start("node", NODE);
    let rt = node.runtime("flock");
    let pod = Netns::new("pod");
    let att = attach("queued1", &pod);
    rt.add(&att).expect("ADD");
    node.stop_agent();
    rt.del(&att)
        .expect("a DEL the shim cannot deliver still succeeds");
    let queued: Vec<_> = std::fs::read_dir(node.del_queue_dir())
        .expect("queue dir")
        .flatten()
        .collect();
    assert_eq!(queued.len(), 1, "the DEL waits in the queue");
    assert_eq!(host_links(&node).len(), 1, "nothing torn down yet");
    node.start_agent();
    let links = host_links_settled(&node, 0);
    assert!(links.is_empty(), "veth left after drain: {links:?}");
    assert_eq!(host_routes(&node), "");
    assert!(node.records().is_empty());
    let left: Vec<_> = std::fs::read_dir(node.del_queue_dir())
        .expect("queue dir")
        .flatten()
        .collect();
    assert!(left.is_empty(), "queue not drained: {left:?}");
}

#[test]
fn status_holds_through_a_restart_and_fails_after_a_crash() {
    let mut node = FlockNode::start("node", NODE);
    let rt = node.runtime("flock");
    let notice = flock_rpc::rpc::restart_notice(&node.socket());
    rt.status().expect("STATUS of a serving agent");
    // SIGTERM (a rolling update): the agent leaves its notice, and STATUS answers ready.
    node.stop_agent();
    assert!(notice.exists(), "no restart notice after SIGTERM");
    rt.status()
        .expect("STATUS while the agent is being replaced");
    // Its successor serves and takes the notice away: just after it binds its socket (so
    // that a STATUS finds one or the other), which is when `start_agent` returns.
    node.start_agent();
    wait_while(Duration::from_secs(10), Duration::from_millis(10), || {
        notice.exists()
    });
    assert!(!notice.exists(), "the successor left the restart notice");
    rt.status().expect("STATUS of the successor");
    // kill -9: no notice, STATUS says at once that nothing serves.
    node.kill_agent();
    assert!(!notice.exists());
    let err = status_error(&rt);
    assert_eq!(err.code, 50, "{err:?}");
}

const TINY: &str = "apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
metadata:
  name: node-t
spec:
  cidr4: 10.72.0.0/30
";

/// A /30 has exactly one address a pod may get: if a crashed ADD leaked it, the next ADD fails.
fn crash_at(point: &str) {
    let mut node = FlockNode::start("node", TINY);
    node.stop_agent();
    node.set_env("FLOCK_FAILPOINT", point);
    node.start_agent();
    let rt = node.runtime("flock");
    let pod = Netns::new("pod");
    let err = rt
        .add(&attach("crash1", &pod))
        .expect_err("the agent dies mid-ADD");
    let status = node.wait_agent_exit(Duration::from_secs(30));
    assert!(!status.success(), "{status}");
    drop(err);
    node.unset_env("FLOCK_FAILPOINT");
    node.start_agent();
    assert!(
        host_links(&node).is_empty(),
        "{point}: veth leaked: {:?}",
        host_links(&node)
    );
    assert_eq!(host_routes(&node), "", "{point}: routes leaked");
    assert!(node.records().is_empty(), "{point}: record leaked");
    assert!(
        !pod.ok(["ip", "-o", "addr"]).contains("10.72.0."),
        "{point}: address left in the pod"
    );
    let pod2 = Netns::new("pod");
    let result = rt
        .add(&attach("crash2", &pod2))
        .expect("the only address is allocatable again");
    assert_eq!(pod_ips(&result), ["10.72.0.2/32"]);
}

#[test]
fn crash_after_pending_leaks_nothing() {
    crash_at("after-pending");
}

#[test]
fn crash_after_kernel_before_commit_leaks_nothing() {
    crash_at("after-kernel");
}

/// Killed after the commit, before the answer: the runtime sees a failed ADD, the record
/// survives the restart, and the runtime's retry gets the same addresses, which CHECK passes.
#[test]
fn crash_after_commit_keeps_the_allocation_for_the_retry() {
    let mut node = FlockNode::start("node", TINY);
    node.stop_agent();
    node.set_env("FLOCK_FAILPOINT", "after-commit");
    node.start_agent();
    let rt = node.runtime("flock");
    let pod = Netns::new("pod");
    let att = attach("commit1", &pod);
    rt.add(&att).expect_err("the agent dies before answering");
    assert!(!node.wait_agent_exit(Duration::from_secs(30)).success());
    node.unset_env("FLOCK_FAILPOINT");
    node.start_agent();
    assert_eq!(node.records(), ["commit1:eth0.json"]);
    let result = rt.add(&att).expect("the retried ADD");
    assert_eq!(pod_ips(&result), ["10.72.0.2/32"]);
    rt.check(&att).expect("CHECK of the kept allocation");
}

/// Killed in the middle of a DEL: the shim queues it and reports success; the restarted
/// agent runs it from the queue, and nothing of the pod is left.
fn crash_in_del_at(point: &str) {
    let mut node = FlockNode::start("node", TINY);
    let rt = node.runtime("flock");
    let pod = Netns::new("pod");
    let att = attach("delcrash", &pod);
    rt.add(&att).expect("ADD");
    node.stop_agent();
    node.set_env("FLOCK_FAILPOINT", point);
    node.start_agent();
    rt.del(&att)
        .expect("a DEL the agent dies on is queued and succeeds");
    assert!(!node.wait_agent_exit(Duration::from_secs(30)).success());
    node.unset_env("FLOCK_FAILPOINT");
    node.start_agent();
    assert!(node.records().is_empty(), "{point}: record left");
    assert_eq!(host_routes(&node), "", "{point}: routes left");
    assert!(
        host_links_settled(&node, 0).is_empty(),
        "{point}: veth left"
    );
    let pod2 = Netns::new("pod");
    let result = rt
        .add(&attach("delcrash2", &pod2))
        .expect("the only address is allocatable again");
    assert_eq!(pod_ips(&result), ["10.72.0.2/32"]);
}

#[test]
fn crash_in_del_after_detach_leaks_nothing() {
    crash_in_del_at("del-after-detach");
}

#[test]
fn crash_in_del_after_the_record_is_deleted_leaks_nothing() {
    crash_in_del_at("del-after-delete");
}

#[test]
fn concurrent_adds_get_distinct_addresses_and_survive_kill_9() {
    let mut node = FlockNode::start("node", NODE);
    let rt = node.runtime("flock");
    let pods: Vec<Netns> = (0..100).map(|_| Netns::new("p")).collect();
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .enumerate()
            .map(|(i, pod)| {
                let rt = &rt;
                s.spawn(move || rt.add(&attach(&format!("conc{i}"), pod)))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    let mut all = BTreeSet::new();
    for r in &results {
        let r = r.as_ref().expect("every concurrent ADD succeeds");
        for ip in pod_ips(r) {
            assert!(all.insert(ip.clone()), "{ip} handed out twice");
        }
    }
    assert_eq!(all.len(), 200);

    // Now kill -9 in the middle of a second burst, restart, and compare kernel and store.
    let more: Vec<Netns> = (0..40).map(|_| Netns::new("q")).collect();
    std::thread::scope(|s| {
        for (i, pod) in more.iter().enumerate() {
            let rt = &rt;
            s.spawn(move || {
                let _ = rt.add(&attach(&format!("burst{i}"), pod));
            });
        }
        // Kill once the burst is under way (its first record is written), not before.
        wait_while(Duration::from_secs(20), Duration::from_millis(2), || {
            node.records().len() <= 100
        });
        node.kill_agent();
    });
    node.start_agent();
    let links: BTreeSet<String> = host_links(&node).into_iter().collect();
    let recs = node.records();
    assert_eq!(
        links.len(),
        recs.len(),
        "every veth has a record and vice versa"
    );
    for rec in &recs {
        let v = node.record(rec);
        assert_eq!(
            v["state"], "committed",
            "{rec} survived start-up as pending"
        );
        let host_if = v["hostIf"].as_str().expect("hostIf");
        assert!(
            links.contains(host_if),
            "{rec}: its veth {host_if} is missing"
        );
        for key in ["ipv6", "ipv4"] {
            let addr = v[key].as_str().expect("address");
            assert!(
                host_routes(&node).contains(&format!("{addr} dev {host_if}")),
                "{rec}: route for {addr} missing"
            );
        }
    }
    assert!(
        recs.len() >= 100,
        "the first 100 committed pods survive a crash"
    );
}

#[test]
fn bad_input_gets_errors_and_the_agent_keeps_serving() {
    let node = FlockNode::start("node", NODE);
    let t = Duration::from_secs(15);
    // A client that sends half a line and hangs must not hold up the others.
    let hanging = std::os::unix::net::UnixStream::connect(node.socket()).expect("connect");
    {
        use std::io::Write;
        (&hanging)
            .write_all(b"{\"v\":1,\"op\":")
            .expect("write half");
    }
    let cases: [(&[u8], &str); 5] = [
        (b"this is not json\n", "JSON"),
        (b"{\"v\":1,\"op\":\"FROB\",\"containerId\":\"x\",\"netns\":\"\",\"ifName\":\"eth0\",\"args\":\"\",\"path\":\"\",\"config\":{}}\n", "FROB"),
        (b"{\"v\":1,\"op\":\"ADD\"}\n", "missing field"),
        (b"\xff\xfe\n", "UTF-8"),
        (b"{\"v\":1}", "without a newline"),
    ];
    for (bytes, expect) in cases {
        let out = node.raw_rpc(bytes, t).expect("an answer");
        assert!(out.contains("\"error\""), "{expect}: {out}");
        assert!(out.contains(expect), "error for {expect:?} says so: {out}");
    }
    let mut big = vec![b'x'; (1 << 20) + 10];
    big.push(b'\n');
    let out = node.raw_rpc(&big, t).unwrap_or_default();
    assert!(
        out.is_empty() || out.contains("longer than"),
        "an oversize line is refused: {out}"
    );

    // Bad network configuration and bad annotations name the field.
    let rt = node.runtime("flock");
    let pod = Netns::new("pod");
    let mut conf = node.conflist("flock");
    conf["plugins"][0]["mtu"] = json!(20);
    let bad_mtu = flock_testkit::cni::Runtime::new(
        conf,
        [flock_testkit::shim_bin().parent().unwrap().to_owned()],
        node.dir().join("cache-mtu"),
    )
    .unwrap()
    .in_netns(node.ns().path());
    let err = bad_mtu.add(&attach("badmtu", &pod)).expect_err("mtu 20");
    let cni = err.cni_error().expect("CNI error");
    assert_eq!(cni.code, 7);
    assert!(cni.msg.contains("mtu") && cni.msg.contains("20"), "{cni:?}");

    let annotated = attach("badann", &pod).with_capability(
        "io.kubernetes.cri.pod-annotations",
        json!({"flock.fritzlab.net/ipv6": "maybe"}),
    );
    let err = rt.add(&annotated).expect_err("bad annotation");
    let cni = err.cni_error().expect("CNI error");
    assert!(
        cni.msg.contains("flock.fritzlab.net/ipv6") && cni.msg.contains("maybe"),
        "{cni:?}"
    );

    // Still serving, while the hanging client waits for its timeout.
    rt.add(&attach("afterbad", &pod))
        .expect("ADD after bad input");
    let mut rest = String::new();
    {
        use std::io::Read;
        hanging
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        (&hanging)
            .read_to_string(&mut rest)
            .expect("timeout answer");
    }
    assert!(
        rest.contains("within"),
        "the silent client is timed out: {rest}"
    );
}

const BGP_NODE: &str = "apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
metadata:
  name: node-b
spec:
  cidr6: 2001:db8:b1::/64
  cidr4: 10.73.0.0/24
  bgp:
    asn: 64512
    routerId: 10.73.255.1
    neighbors:
      - { address: \"2001:db8:b1ff::fe\", asn: 65000 }
";

/// The debounce coalesces a burst into one reload, two at most (Must show: at most 3). The
/// debounce's 1 s cap makes a sustained stream of changes one reload per second, so only a
/// burst that itself took longer than 2 s (a badly overloaded machine) may exceed 3.
#[test]
fn a_burst_of_adds_is_at_most_three_bird_reloads() {
    let mut node = FlockNode::start("node", BGP_NODE);
    node.start_bird();
    let rt = node.runtime("flock");
    let pods: Vec<Netns> = (0..100).map(|_| Netns::new("b")).collect();
    let base = node.metric("flock_bird_reloads_total");
    // The agent's first render happened before BIRD ran: that reload failed, and is retried.
    let failures = node.metric("flock_bird_reload_failures_total");
    let started = std::time::Instant::now();
    std::thread::scope(|s| {
        for (i, pod) in pods.iter().enumerate() {
            let rt = &rt;
            s.spawn(move || {
                let att = attach(&format!("bird{i}"), pod).with_capability(
                    "io.kubernetes.cri.pod-annotations",
                    json!({"flock.fritzlab.net/addresses": format!("2001:db8:ff00::{:x}", i + 1)}),
                );
                rt.add(&att).expect("ADD with a fixed address");
            });
        }
    });
    let burst = started.elapsed();
    let mut expected: BTreeSet<String> = (1..=100)
        .map(|i| format!("2001:db8:ff00::{i:x}/128"))
        .collect();
    expected.extend(["2001:db8:b1::/64".to_owned(), "10.73.0.0/24".to_owned()]);
    let announced = |config: &str| -> BTreeSet<String> {
        flock_testkit::bird_routes(config).into_iter().collect()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while announced(&std::fs::read_to_string(node.bird_config()).unwrap_or_default()) != expected
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    // Count every reload the burst caused: wait until the counter has been still for 2 s
    // (longer than the debounce's quiet time and its cap).
    let mut reloads = node.metric("flock_bird_reloads_total");
    let mut still_since = std::time::Instant::now();
    while still_since.elapsed() < Duration::from_secs(2) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        let now = node.metric("flock_bird_reloads_total");
        if now != reloads {
            reloads = now;
            still_since = std::time::Instant::now();
        }
    }
    let reloads = reloads - base;
    eprintln!("100 ADDs took {burst:?} and made {reloads} reloads");
    let bound = 3f64.max(2.0 + burst.as_secs_f64().ceil());
    assert!(
        reloads >= 1.0 && reloads <= bound,
        "100 ADDs in a {burst:?} burst made {reloads} reloads (at most {bound} expected)"
    );
    // Exactly the node CIDRs and the 100 fixed addresses, nothing else.
    let config = std::fs::read_to_string(node.bird_config()).expect("bird.conf");
    assert_eq!(announced(&config), expected);
    assert_eq!(node.metric("flock_bird_reload_failures_total"), failures);
    assert!(
        node.http_get("/readyz").starts_with("ok"),
        "{}",
        node.http_get("/readyz")
    );
}

/// BIRD down does not stop ADDs (STATUS is about serving ADDs): it shows in `/readyz` and
/// the failure counter, and clears once BIRD runs.
#[test]
fn absent_bird_shows_in_readyz_and_pods_are_still_served() {
    let mut node = FlockNode::start("node", BGP_NODE);
    node.wait_metric_at_least("flock_bird_reload_failures_total", 1.0);
    let readyz = node.http_get("/readyz");
    assert!(
        !readyz.starts_with("ok") && readyz.contains("bird"),
        "/readyz must name BIRD: {readyz}"
    );
    let rt = node.runtime("flock");
    rt.status().expect("STATUS succeeds with BIRD down");
    let pod = Netns::new("p");
    let att = attach("nobird", &pod).with_capability(
        "io.kubernetes.cri.pod-annotations",
        json!({"flock.fritzlab.net/addresses": "2001:db8:ff00::99"}),
    );
    let result = rt.add(&att).expect("ADD is served with BIRD down");
    assert!(pod_ips(&result).len() >= 2, "{result}");
    assert!(pod.pings("fe80::1%eth0"), "the pod reaches its gateway");

    node.start_bird();
    // The writer retries on its own (every 5 s after a failure); a DEL also triggers it.
    rt.del(&att).expect("DEL");
    node.wait_ready();
    assert!(node.metric("flock_bird_reloads_total") >= 1.0);
}

const TINY_NODE: &str = "apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
metadata:
  name: node-t
spec:
  cidr4: 10.74.0.0/30
  bgp:
    asn: 64512
    routerId: 10.74.255.1
    neighbors:
      - { address: \"10.74.255.254\", asn: 65000 }
";

/// The CNI error of a STATUS that must fail.
fn status_error(rt: &flock_testkit::cni::Runtime) -> flock_testkit::cni::CniError {
    let err = rt.status().expect_err("STATUS must fail");
    err.cni_error().expect("a CNI error").clone()
}

/// STATUS answers whether an ADD can be served (DESIGN §7): 50 naming each reason, 51 when
/// BIRD is failing on top of it, success again once the reason is gone.
#[test]
fn status_says_why_adds_cannot_be_served() {
    let mut node = FlockNode::start("node", TINY_NODE);
    let rt = node.runtime("flock");
    rt.status()
        .expect("a free pool: STATUS succeeds (BIRD down alone does not matter)");

    // A /30 has one usable address: one pod fills it.
    let pod = Netns::new("p");
    let att = attach("only", &pod);
    rt.add(&att).expect("ADD");
    node.wait_metric_at_least("flock_bird_reload_failures_total", 1.0);
    let e = status_error(&rt);
    assert_eq!(e.code, 51, "{e:?}");
    assert!(
        e.msg
            .contains("no free IPv4 address left in 10.74.0.0/30 (1 in use)")
            && e.msg.contains("BIRD"),
        "{e:?}"
    );

    // BIRD up: the pool is still full, existing pods are announced: 50.
    node.start_bird();
    node.wait_ready();
    let e = status_error(&rt);
    assert_eq!(e.code, 50, "{e:?}");
    assert!(!e.msg.contains("BIRD"), "{e:?}");

    rt.del(&att).expect("DEL");
    rt.status().expect("the address is free again");

    // A store that cannot be written: the records' directory replaced by a file.
    let records = node.state_dir().join("allocations");
    let moved = node.state_dir().join("allocations.moved");
    std::fs::rename(&records, &moved).expect("move the records away");
    std::fs::write(&records, b"").expect("a file in their place");
    let e = status_error(&rt);
    std::fs::remove_file(&records).expect("remove the file");
    std::fs::rename(&moved, &records).expect("restore the records");
    assert_eq!(e.code, 50, "{e:?}");
    assert!(
        e.msg.contains("store is not writable") && e.msg.contains("allocations"),
        "{e:?}"
    );
    rt.status().expect("the store is writable again");
}

/// Start-up, before serving (DESIGN §7): a record of another boot and one whose netns is
/// gone are released with their veths and routes; a `flock*` veth no record owns is removed;
/// a record of this boot with its netns in place is kept untouched.
#[test]
fn start_up_releases_stale_records_and_removes_stray_veths() {
    let mut node = FlockNode::start("node", NODE);
    let rt = node.runtime("flock");
    let (old_boot, gone, live) = (Netns::new("p"), Netns::new("p"), Netns::new("p"));
    let mut addresses = Vec::new();
    for (id, pod) in [("oldboot", &old_boot), ("gone", &gone), ("live", &live)] {
        let result = rt.add(&attach(id, pod)).expect("ADD");
        addresses.push(pod_ips(&result));
    }
    let file_of = |node: &FlockNode, id: &str| {
        node.records()
            .into_iter()
            .find(|n| node.record(n)["containerId"] == id)
            .expect("record")
    };
    let host_if_of = |id: &str| {
        node.record(&file_of(&node, id))["hostIf"]
            .as_str()
            .expect("hostIf")
            .to_owned()
    };
    let (if_old, if_gone, if_live) = (
        host_if_of("oldboot"),
        host_if_of("gone"),
        host_if_of("live"),
    );
    let old_file = file_of(&node, "oldboot");
    node.stop_agent();

    // A reboot for one record (its boot ID differs), a vanished namespace for another, and a
    // veth no record owns.
    let path = node.state_dir().join("allocations").join(&old_file);
    let mut record = node.record(&old_file);
    record["bootId"] = json!("00000000-0000-0000-0000-000000000000");
    std::fs::write(&path, serde_json::to_vec(&record).expect("json")).expect("rewrite record");
    drop(gone);
    node.ns().ok([
        "ip",
        "link",
        "add",
        "flockdeadbeef",
        "type",
        "veth",
        "peer",
        "name",
        "strayp",
    ]);
    node.start_agent();

    let records: Vec<String> = node
        .records()
        .iter()
        .map(|n| {
            node.record(n)["containerId"]
                .as_str()
                .expect("id")
                .to_owned()
        })
        .collect();
    assert_eq!(records, ["live"], "only the live pod keeps its record");
    let links = host_links(&node);
    assert_eq!(
        links.as_slice(),
        std::slice::from_ref(&if_live),
        "stale and stray veths removed"
    );
    assert!(!links.contains(&if_old) && !links.contains(&if_gone));
    let routes = host_routes(&node);
    assert!(
        routes.lines().all(|l| l.contains(&if_live)),
        "only the live pod's routes are left: {routes}"
    );
    for addr in &addresses[2] {
        let bare = addr.split('/').next().expect("addr");
        assert!(routes.contains(bare), "{bare} still routed: {routes}");
    }
    let check = rt.check(&attach("live", &live));
    assert!(check.is_ok(), "the live pod is untouched: {check:?}");
    assert!(
        node.log().contains("oldboot") && node.log().contains("gone"),
        "the releases are logged:\n{}",
        node.log()
    );
}

/// A kernel failure reaches the runtime with its whole cause chain, down to the errno: here
/// `CNI_NETNS` names a file that is not a network namespace, so `setns` fails with EINVAL.
#[test]
fn a_kernel_failure_reaches_the_runtime_with_the_errno() {
    let node = FlockNode::start("node", NODE);
    let rt = node.runtime("flock");
    let not_a_netns = node.dir().join("not-a-netns");
    std::fs::write(&not_a_netns, b"").expect("a plain file");
    let att = Attachment::new("kernelfail", &not_a_netns, "eth0")
        .with_arg("K8S_POD_NAMESPACE", "default")
        .with_arg("K8S_POD_NAME", "kernelfail");
    let err = rt.add(&att).expect_err("setns into a plain file fails");
    let e = err.cni_error().expect("a CNI error");
    assert_eq!(e.code, 103, "{e:?}");
    assert_eq!(
        e.msg, "set up of container kernelfail interface eth0",
        "{e:?}"
    );
    assert!(
        e.details.contains(&not_a_netns.display().to_string())
            && e.details.contains("Invalid argument"),
        "{e:?}"
    );
    eprintln!("the runtime sees: {err}");
    assert!(node.records().is_empty(), "the failed ADD left its record");
}

/// The kernel and the store agree after a start-up, and no address is on two attachments:
/// every veth has a committed record and every record its veth and host routes.
fn assert_consistent(node: &FlockNode, round: usize) {
    let links: BTreeSet<String> = host_links(node).into_iter().collect();
    let routes = host_routes(node);
    let recs = node.records();
    let mut addresses = BTreeSet::new();
    let mut owned = BTreeSet::new();
    for rec in &recs {
        let v = node.record(rec);
        assert_eq!(v["state"], "committed", "round {round}: {rec} left pending");
        let host_if = v["hostIf"].as_str().expect("hostIf").to_owned();
        assert!(
            links.contains(&host_if),
            "round {round}: {rec}: veth {host_if} missing"
        );
        for key in ["ipv6", "ipv4"] {
            let addr = v[key].as_str().expect("address").to_owned();
            assert!(
                routes.contains(&format!("{addr} dev {host_if}")),
                "round {round}: {rec}: route for {addr} missing"
            );
            assert!(
                addresses.insert(addr.clone()),
                "round {round}: {addr} on two attachments"
            );
        }
        owned.insert(host_if);
    }
    assert_eq!(
        links, owned,
        "round {round}: a veth without a record leaked"
    );
}

/// kill -9 at random points of concurrent bursts of ADDs and DELs, five rounds: after each
/// restart nothing is duplicated or leaked, and every DEL the runtime saw succeed stays done.
/// The seed is printed; `FLOCK_TEST_SEED` replays a run.
#[test]
fn random_kills_during_bursts_leave_no_duplicate_and_no_leak() {
    let seed: u64 = std::env::var("FLOCK_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    eprintln!("FLOCK_TEST_SEED={seed}");
    let mut state = seed | 1;
    let mut next = move |bound: u64| {
        // xorshift64
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % bound
    };
    let mut node = FlockNode::start("node", NODE);
    let rt = node.runtime("flock");
    let pods: Vec<Netns> = (0..24).map(|_| Netns::new("k")).collect();
    // The pods that are up at the start of a round; a round DELs some and ADDs the others.
    let mut up: BTreeSet<usize> = BTreeSet::new();
    for round in 0..5 {
        let kill_after = Duration::from_micros(next(40_000));
        let dels: BTreeSet<usize> = up.iter().copied().filter(|_| next(2) == 0).collect();
        let adds: Vec<usize> = (0..pods.len()).filter(|i| !up.contains(i)).collect();
        let deleted: Vec<usize> = std::thread::scope(|s| {
            let mut handles = Vec::new();
            for &i in adds.iter().chain(&dels) {
                let (rt, pod, is_del) = (&rt, &pods[i], dels.contains(&i));
                handles.push(s.spawn(move || {
                    let att = attach(&format!("kill{i}"), pod);
                    let ok = if is_del {
                        rt.del(&att).is_ok()
                    } else {
                        rt.add(&att).is_ok()
                    };
                    (i, is_del, ok)
                }));
            }
            std::thread::sleep(kill_after);
            node.kill_agent();
            handles
                .into_iter()
                .map(|h| h.join().expect("thread"))
                .filter(|(_, is_del, ok)| *is_del && *ok)
                .map(|(i, _, _)| i)
                .collect()
        });
        node.start_agent();
        assert_consistent(&node, round);
        let recorded: BTreeSet<usize> = node
            .records()
            .iter()
            .filter_map(|r| r.strip_prefix("kill")?.split(':').next()?.parse().ok())
            .collect();
        for i in &deleted {
            assert!(
                !recorded.contains(i),
                "round {round} (kill after {kill_after:?}): kill{i}'s DEL succeeded but its record is back"
            );
        }
        up = recorded;
    }
    // The survivors still work: a repeated ADD returns their allocation (an ADD whose
    // answer the kill swallowed), and CHECK passes.
    for &i in &up {
        let att = attach(&format!("kill{i}"), &pods[i]);
        rt.add(&att)
            .unwrap_or_else(|e| panic!("ADD kill{i} again after the rounds: {e}"));
        rt.check(&att)
            .unwrap_or_else(|e| panic!("CHECK kill{i} after the rounds: {e}"));
    }
}
