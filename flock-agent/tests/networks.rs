//! Secondary networks (a NodeConfig's `spec.networks`, attached by a network configuration
//! with `"network": NAME`, as Multus attaches a NetworkAttachmentDefinition) and the MTU taken
//! from the node's uplink: on the in-memory kernel, and on a real one (root).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use flock_agent::agent::{Agent, AgentParts};
use flock_agent::kernel::Kernel;
use flock_agent::kernel::memory::MemoryKernel;
use flock_k8s_api::{NodeConfig, NodeSettings};
use flock_rpc::rpc::{Op, PROTOCOL_VERSION, Request, Response};
use serde_json::{Value, json};

const BOOT: &str = "boot-1";

fn settings() -> NodeSettings {
    serde_json::from_value::<NodeConfig>(json!({
        "apiVersion": "flock.fritzlab.net/v1alpha1",
        "kind": "NodeConfig",
        "metadata": { "name": "node-a" },
        "spec": {
            "cidr6": "2001:db8:7::/64", "cidr4": "10.77.0.0/24",
            "bgp": { "asn": 64512, "routerId": "10.0.0.1",
                     "neighbors": [ { "address": "2001:db8:f9::1", "asn": 65000 } ] },
            "networks": [
                { "name": "storage", "cidr6": "2001:db8:5:1::/64", "cidr4": "10.245.1.0/24",
                  "routes": ["2001:db8:5::/48", "10.245.0.0/16"] },
                { "name": "quiet", "cidr6": "2001:db8:6:1::/64", "announce": false }
            ]
        }
    }))
    .expect("fixture")
    .settings()
    .expect("valid")
}

async fn start(kernel: Arc<dyn Kernel>, dir: &Path) -> Arc<Agent> {
    let (agent, _) = Agent::start(AgentParts {
        settings: Some(settings()),
        rng_seed: [7; 32],
        ..AgentParts::new(kernel, dir)
    })
    .await
    .expect("agent starts");
    agent
}

fn request(op: Op, cid: &str, netns: &Path, if_name: &str, config: Value) -> Request {
    Request {
        v: PROTOCOL_VERSION,
        op,
        container_id: cid.into(),
        netns: netns.to_string_lossy().into_owned(),
        if_name: if_name.into(),
        args: format!("K8S_POD_NAMESPACE=shop;K8S_POD_NAME=pod-{cid}"),
        path: "/opt/cni/bin".into(),
        config,
    }
}

fn cluster() -> Value {
    json!({ "cniVersion": "1.1.0", "name": "flock", "type": "flock" })
}

fn storage(extra: Value) -> Value {
    let mut conf = json!({ "cniVersion": "1.1.0", "name": "storage-net", "type": "flock",
                           "network": "storage" });
    for (k, v) in extra.as_object().unwrap() {
        conf[k] = v.clone();
    }
    conf
}

fn result(r: Response) -> Value {
    match r.result {
        Some(v) => v,
        None => panic!("expected a result, got {:?}", r.error),
    }
}

fn error(r: Response) -> (u32, String) {
    let e = r.error.expect("expected an error");
    (e.code.into(), e.msg)
}

fn netns_of(cid: &str) -> PathBuf {
    PathBuf::from(format!("/run/netns/{cid}"))
}

#[tokio::test]
async fn a_secondary_attachment_gets_its_own_space_and_no_default_route() {
    let kernel = Arc::new(MemoryKernel::new(BOOT));
    let dir = tempfile::tempdir().unwrap();
    let agent = start(kernel.clone(), dir.path()).await;
    kernel.add_netns(netns_of("c1"));
    let eth0 = result(
        agent
            .handle(request(Op::Add, "c1", &netns_of("c1"), "eth0", cluster()))
            .await,
    );
    let net1 = result(
        agent
            .handle(request(
                Op::Add,
                "c1",
                &netns_of("c1"),
                "net1",
                storage(json!({ "routes": ["10.246.0.0/16"] })),
            ))
            .await,
    );
    let ips = |r: &Value| -> Vec<String> {
        r["ips"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["address"].as_str().unwrap().to_owned())
            .collect()
    };
    assert!(ips(&eth0)[0].starts_with("2001:db8:7:"), "{eth0}");
    assert!(ips(&net1)[0].starts_with("2001:db8:5:1:"), "{net1}");
    assert!(ips(&net1)[1].starts_with("10.245.1."), "{net1}");
    // the cluster network's default routes; the secondary's own space (network's routes,
    // then the configuration's)
    assert_eq!(eth0["routes"][0]["dst"], "::/0");
    assert_eq!(
        net1["routes"],
        json!([
            { "dst": "2001:db8:5::/48", "gw": "fe80::1" },
            { "dst": "10.245.0.0/16", "gw": "169.254.1.1" },
            { "dst": "10.246.0.0/16", "gw": "169.254.1.1" }
        ])
    );
    let records = agent.records();
    let r = records.iter().find(|r| r.if_name == "net1").unwrap();
    assert_eq!(r.flock_network.as_deref(), Some("storage"));
    assert_eq!(r.network, "storage-net");
    assert!(!r.default_route);
    // the MTU of the uplink: none known here, so the default
    assert_eq!(r.mtu, 1500);
    // each attachment's CHECK passes
    for (if_name, conf) in [("eth0", cluster()), ("net1", storage(json!({})))] {
        let mut conf = conf;
        conf["prevResult"] = if if_name == "eth0" {
            eth0.clone()
        } else {
            net1.clone()
        };
        let r = agent
            .handle(request(Op::Check, "c1", &netns_of("c1"), if_name, conf))
            .await;
        assert!(r.error.is_none(), "CHECK {if_name}: {:?}", r.error);
    }
    // BIRD announces the storage network as an aggregate, never its pods one by one
    let bird = agent.render_bird().unwrap().unwrap();
    assert!(
        bird.contains("2001:db8:5:1::/64") && bird.contains("10.245.1.0/24"),
        "{bird}"
    );
    assert!(
        !bird.contains("2001:db8:6:1::/64"),
        "quiet is not announced: {bird}"
    );
    // DEL of net1 leaves eth0, and frees net1's addresses
    let r = agent
        .handle(request(
            Op::Del,
            "c1",
            &netns_of("c1"),
            "net1",
            storage(json!({})),
        ))
        .await;
    assert!(r.error.is_none(), "{:?}", r.error);
    let left: Vec<String> = agent.records().iter().map(|r| r.if_name.clone()).collect();
    assert_eq!(left, ["eth0"]);
    // the same pod attached again gets an address of storage again
    let again = result(
        agent
            .handle(request(
                Op::Add,
                "c1",
                &netns_of("c1"),
                "net1",
                storage(json!({})),
            ))
            .await,
    );
    assert!(ips(&again)[0].starts_with("2001:db8:5:1:"), "{again}");
}

#[tokio::test]
async fn a_wrong_secondary_configuration_fails_naming_it_and_allocates_nothing() {
    let kernel = Arc::new(MemoryKernel::new(BOOT));
    let dir = tempfile::tempdir().unwrap();
    let agent = start(kernel.clone(), dir.path()).await;
    kernel.add_netns(netns_of("c2"));
    for (extra, words) in [
        (
            json!({ "network": "nosuch" }),
            &["network \"nosuch\"", "node-a", "storage, quiet"][..],
        ),
        (
            json!({ "routes": ["2001:db8:7::/48"] }),
            &[
                "routes[0]",
                "2001:db8:7::/48",
                "overlaps the cluster network",
            ][..],
        ),
        (
            json!({ "routes": ["0.0.0.0/0"] }),
            &["routes[0]", "default route"][..],
        ),
        (
            json!({ "routes": ["10.245.0.1/16"] }),
            &["routes[0]", "host bits"][..],
        ),
        (json!({ "mtu": 40 }), &["mtu 40"][..]),
        (json!({ "network": 7 }), &["invalid network 7"][..]),
    ] {
        let (code, msg) = error(
            agent
                .handle(request(
                    Op::Add,
                    "c2",
                    &netns_of("c2"),
                    "net1",
                    storage(extra.clone()),
                ))
                .await,
        );
        assert_eq!(code, 7, "{extra}: {msg}");
        for w in words {
            assert!(msg.contains(w), "{extra}: {msg} lacks {w}");
        }
    }
    assert!(agent.records().is_empty());
    assert!(kernel.state().veths.is_empty());
    // the cluster network's configuration takes no routes
    let mut conf = cluster();
    conf["routes"] = json!(["10.246.0.0/16"]);
    let (code, msg) = error(
        agent
            .handle(request(Op::Add, "c2", &netns_of("c2"), "eth0", conf))
            .await,
    );
    assert_eq!(code, 7, "{msg}");
    assert!(msg.contains("routes"), "{msg}");
}

#[tokio::test]
async fn without_an_mtu_a_new_pod_takes_the_uplinks_and_an_explicit_one_wins() {
    let kernel = Arc::new(MemoryKernel::new(BOOT));
    kernel.set_uplink_mtu(Some(1400));
    let dir = tempfile::tempdir().unwrap();
    let agent = start(kernel.clone(), dir.path()).await;
    for (cid, conf, want) in [
        ("m1", cluster(), 1400),
        ("m2", storage(json!({})), 1400),
        (
            "m3",
            {
                let mut c = cluster();
                c["mtu"] = json!(9000);
                c
            },
            9000,
        ),
    ] {
        kernel.add_netns(netns_of(cid));
        let r = result(
            agent
                .handle(request(Op::Add, cid, &netns_of(cid), "eth0", conf))
                .await,
        );
        assert_eq!(r["interfaces"][1]["mtu"], want, "{cid}: {r}");
    }
}

/// The real kernel: two attachments in one pod through the agent's own ADDs. Before
/// secondary networks, `net1` took the pod's default routes from `eth0` and CHECK of `eth0`
/// failed; now exactly one default route per family, each CHECK passes, DEL of one leaves the
/// other, and the MTU is the uplink's.
#[cfg(feature = "root-tests")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_attachments_in_one_pod_on_the_real_kernel() {
    use flock_agent::kernel::NetnsKernel;
    use flock_netns::NodeNs;
    use flock_testkit::Netns;

    let node_ns = Netns::new("node");
    let router = Netns::new("rtr");
    let pod = Netns::new("pod");
    // the uplink toward the BGP neighbor 2001:db8:f9::1, MTU 1400 (a bond or VLAN stand-in)
    node_ns.ok([
        "ip",
        "link",
        "add",
        "uplink",
        "mtu",
        "1400",
        "type",
        "veth",
        "peer",
        "name",
        "down0",
        "netns",
        router.name(),
    ]);
    node_ns.ok(["ip", "link", "set", "uplink", "up"]);
    node_ns.ok([
        "ip",
        "addr",
        "add",
        "2001:db8:f9::2/64",
        "dev",
        "uplink",
        "nodad",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let agent = start(
        Arc::new(NetnsKernel::new(NodeNs::at(node_ns.path()))),
        dir.path(),
    )
    .await;
    let netns = pod.path();
    let eth0 = result(
        agent
            .handle(request(Op::Add, "k1", &netns, "eth0", cluster()))
            .await,
    );
    let net1 = result(
        agent
            .handle(request(Op::Add, "k1", &netns, "net1", storage(json!({}))))
            .await,
    );
    for family in ["-6", "-4"] {
        let routes = pod.ok(["ip", family, "route"]);
        let defaults: Vec<&str> = routes
            .lines()
            .filter(|l| l.starts_with("default"))
            .collect();
        assert_eq!(defaults.len(), 1, "{routes}");
        assert!(defaults[0].contains("dev eth0"), "{routes}");
    }
    assert!(
        pod.ok(["ip", "-6", "route"])
            .contains("2001:db8:5::/48 via fe80::1 dev net1")
    );
    for (if_name, conf, prev) in [
        ("eth0", cluster(), &eth0),
        ("net1", storage(json!({})), &net1),
    ] {
        let mut conf = conf;
        conf["prevResult"] = prev.clone();
        let r = agent
            .handle(request(Op::Check, "k1", &netns, if_name, conf))
            .await;
        assert!(r.error.is_none(), "CHECK {if_name}: {:?}", r.error);
    }
    let link = pod.ok(["ip", "link", "show", "net1"]);
    assert!(link.contains("mtu 1400"), "the uplink's MTU: {link}");
    let r = agent
        .handle(request(Op::Del, "k1", &netns, "net1", storage(json!({}))))
        .await;
    assert!(r.error.is_none(), "{:?}", r.error);
    let mut conf = cluster();
    conf["prevResult"] = eth0.clone();
    let r = agent
        .handle(request(Op::Check, "k1", &netns, "eth0", conf))
        .await;
    assert!(
        r.error.is_none(),
        "CHECK eth0 after DEL net1: {:?}",
        r.error
    );
    let r = agent
        .handle(request(Op::Del, "k1", &netns, "eth0", cluster()))
        .await;
    assert!(r.error.is_none(), "{:?}", r.error);
    assert!(agent.records().is_empty());
}
