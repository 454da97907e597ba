//! flock chained with the reference `tuning`, `portmap` and `bandwidth` plugins (Debian's
//! containernetworking-plugins), driven per the CNI spec by testkit's libcni-like runtime
//! (`prevResult` injection and caching, reverse-order DEL): the real agent runs standalone in
//! a stand-in node namespace and the real shim is exec'd there, as containerd would.
#![cfg(feature = "root-tests")]

use std::path::PathBuf;

use flock_testkit::Netns;
use flock_testkit::cni::{Attachment, Runtime, result_ip};
use flock_testkit::node::FlockNode;
use serde_json::{Value, json};

const NET: &str = "flockchain";

const NODE: &str = "apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
metadata:
  name: chain-node
spec:
  cidr6: 2001:db8:c4::/64
  cidr4: 10.74.0.0/24
";

/// flock → tuning → (portmap) → bandwidth. cniVersion 1.0.0: the newest the reference
/// plugins 1.1.1 speak (flock speaks 0.4.0, 1.0.0 and 1.1.0).
fn conflist(node: &FlockNode, with_portmap: bool) -> Value {
    let mut plugins = vec![
        // flock's CHECK compares the pod interface with what it programmed, MTU included
        // (DESIGN §7: any difference is an error): a chain whose `tuning` sets the MTU gives
        // flock the same MTU, or flock's CHECK rightly reports the difference.
        json!({
            "type": "flock",
            "agentSocket": node.socket(),
            "delQueueDir": node.del_queue_dir(),
            "mtu": 1400,
        }),
        json!({ "type": "tuning", "mtu": 1400, "sysctl": { "net.ipv4.conf.eth0.arp_notify": "1" } }),
    ];
    if with_portmap {
        plugins.push(json!({ "type": "portmap", "capabilities": { "portMappings": true } }));
    }
    plugins.push(json!({ "type": "bandwidth", "capabilities": { "bandwidth": true } }));
    json!({ "cniVersion": "1.0.0", "name": NET, "plugins": plugins })
}

fn runtime(node: &FlockNode, with_portmap: bool) -> Runtime {
    runtime_of(node, conflist(node, with_portmap))
}

fn runtime_of(node: &FlockNode, conflist: Value) -> Runtime {
    let shim_dir: PathBuf = flock_testkit::shim_bin()
        .parent()
        .expect("shim directory")
        .to_owned();
    Runtime::new(
        conflist,
        [shim_dir, flock_testkit::reference_plugins_dir()],
        node.dir().join("cni-cache"),
    )
    .expect("valid conflist")
    .in_netns(node.ns().path())
}

/// An attachment for the chain: bandwidth limits, and a TCP mapping of `host_port` to the
/// pod's port 80 if given.
fn chain_attachment(id: &str, pod: &Netns, host_port: Option<u16>) -> Attachment {
    let att = Attachment::new(id, pod.path(), "eth0")
        .with_arg("IgnoreUnknown", "1")
        .with_capability(
            "bandwidth",
            json!({
                "ingressRate": 1_000_000, "ingressBurst": 100_000,
                "egressRate": 2_000_000, "egressBurst": 200_000
            }),
        );
    match host_port {
        Some(port) => att.with_capability(
            "portMappings",
            json!([{ "hostPort": port, "containerPort": 80, "protocol": "tcp" }]),
        ),
        None => att,
    }
}

/// After a DEL through the chain: no host interface (veth, ifb), no allocation, no DNAT rule
/// for `host_port` in either family.
fn assert_chain_removed(node: &FlockNode, host_port: u16) {
    assert_eq!(
        node.ns().links_settled(<[String]>::is_empty),
        Vec::<String>::new(),
        "veth and ifb gone"
    );
    assert!(
        node.records().is_empty(),
        "allocation left: {:?}",
        node.records()
    );
    for table in ["iptables", "ip6tables"] {
        let nat = node.ns().ok([table, "-w", "-t", "nat", "-S"]);
        assert!(!nat.contains(&format!("--dport {host_port}")), "{nat}");
    }
}

/// Interfaces of the result without a sandbox: flock's host veth and bandwidth's ifb.
fn host_interfaces(result: &Value) -> Vec<String> {
    result["interfaces"]
        .as_array()
        .expect("interfaces")
        .iter()
        .filter(|i| {
            i.get("sandbox")
                .and_then(Value::as_str)
                .unwrap_or("")
                .is_empty()
        })
        .filter_map(|i| i["name"].as_str().map(str::to_owned))
        .collect()
}

/// ADD through the chain: each reference plugin accepts flock's result as its `prevResult`
/// and does its job on it. CHECK passes through the whole chain (the reference plugins v1.10;
/// Debian's portmap 1.1.1 could not CHECK dual stack), and flock's CHECK sees a route removed
/// behind its back. DEL removes everything; a second DEL and a DEL without netns succeed.
#[test]
fn flock_tuning_portmap_bandwidth_chain() {
    flock_testkit::require_root();
    let node = FlockNode::start("chn", NODE);
    // A node has an address of its own (portmap's and our pings' source).
    node.ns()
        .ok(["ip", "addr", "add", "10.99.0.1/32", "dev", "lo"]);
    let rt = runtime(&node, true);
    let pod = Netns::new("cpod");
    let att = chain_attachment("chain-flock-1", &pod, Some(8080))
        .with_arg("K8S_POD_NAMESPACE", "e2e")
        .with_arg("K8S_POD_NAME", "chained");

    let result = rt.add(&att).expect("ADD through the chain");
    let ip4 = result_ip(&result, false);
    let ip6 = result_ip(&result, true);
    assert!(ip6.starts_with("2001:db8:c4:"), "{result}");
    assert!(ip4.starts_with("10.74.0."), "{result}");
    let hosts = host_interfaces(&result);
    let veth = hosts
        .iter()
        .find(|n| n.starts_with("flock"))
        .unwrap_or_else(|| panic!("flock's host veth in the final result: {result}"))
        .clone();
    let ifb = hosts
        .iter()
        .find(|n| n.starts_with("bwp"))
        .unwrap_or_else(|| panic!("bandwidth adds its ifb to the result: {result}"))
        .clone();

    // flock: addresses in the pod, reachable from the node.
    let addrs = pod.ok(["ip", "addr", "show", "eth0"]);
    for ip in [&ip4, &ip6] {
        assert!(
            addrs.contains(&format!("{ip}/")),
            "{ip} not on eth0: {addrs}"
        );
        assert!(node.ns().pings(ip), "node cannot ping the pod at {ip}");
    }
    // tuning, in the pod.
    let link = pod.ok(["ip", "-o", "link", "show", "eth0"]);
    assert!(link.contains("mtu 1400"), "{link}");
    let arp_notify = pod.ok(["cat", "/proc/sys/net/ipv4/conf/eth0/arp_notify"]);
    assert_eq!(arp_notify.trim(), "1");
    // portmap, in the node: DNAT of 8080 to the pod, per family.
    let nat4 = node.ns().ok(["iptables", "-w", "-t", "nat", "-S"]);
    assert!(
        nat4.contains(&format!("--to-destination {ip4}:80")),
        "{nat4}"
    );
    let nat6 = node.ns().ok(["ip6tables", "-w", "-t", "nat", "-S"]);
    assert!(
        nat6.contains(&format!("--to-destination [{ip6}]:80")),
        "{nat6}"
    );
    // bandwidth, in the node: tbf on flock's host veth, an ifb with tbf for pod egress.
    let veth_qdisc = node.ns().ok(["tc", "qdisc", "show", "dev", &veth]);
    assert!(veth_qdisc.contains("tbf"), "{veth_qdisc}");
    let ifb_qdisc = node.ns().ok(["tc", "qdisc", "show", "dev", &ifb]);
    assert!(ifb_qdisc.contains("tbf"), "{ifb_qdisc}");

    // CHECK through the whole chain, portmap's dual-stack mapping included (Debian's portmap
    // 1.1.1 looked for the IPv4 DNAT rule in ip6tables; the reference plugins v1.10 do not).
    rt.check(&att)
        .expect("CHECK through flock, tuning, portmap and bandwidth, dual stack, with a mapping");
    // And flock's CHECK is real: it sees a route removed behind its back.
    pod.ok(["ip", "route", "del", "default", "via", "169.254.1.1"]);
    let err = runtime(&node, false)
        .check(&att)
        .expect_err("CHECK must see the missing route");
    assert!(
        matches!(&err, flock_testkit::cni::Error::Plugin { plugin, .. } if plugin == "flock"),
        "{err}"
    );

    rt.del(&att).expect("DEL through the chain");
    assert_chain_removed(&node, 8080);
    assert!(
        !pod.ok(["ip", "link"]).contains("eth0"),
        "pod interface left"
    );
    assert_eq!(
        rt.cached_result(&att).expect("cache"),
        None,
        "cache entry left"
    );
    rt.del(&att).expect("second DEL");
    rt.del(&att.clone().without_netns())
        .expect("DEL with an empty CNI_NETNS");
}

/// One pod through the whole chain (flock → tuning → portmap → bandwidth): ADD, each
/// plugin's effect, CHECK, DEL (everything gone), a second DEL. `only` restricts the pod to
/// one family (`"ipv6"` or `"ipv4"`); `ports` gives it a port mapping. Returns the CHECK.
fn chain_case(tag: &str, only: Option<&str>, ports: bool) -> Result<(), flock_testkit::cni::Error> {
    let node = FlockNode::start(tag, NODE);
    node.ns()
        .ok(["ip", "addr", "add", "10.99.0.1/32", "dev", "lo"]);
    let mut list = conflist(&node, true);
    if let Some(family) = only {
        let off = if family == "ipv6" { "ipv4" } else { "ipv6" };
        list["plugins"][0]["args"] = json!({
            "flock": { "annotations": { format!("flock.fritzlab.net/{off}"): "false" } }
        });
    }
    let rt = runtime_of(&node, list);
    let pod = Netns::new("cpod1");
    let att = chain_attachment("chain-flock-1f", &pod, ports.then_some(8081));
    let result = rt.add(&att).expect("ADD through the chain");
    let families: Vec<bool> = match only {
        Some("ipv6") => vec![true],
        Some(_) => vec![false],
        None => vec![true, false],
    };
    assert_eq!(
        result["ips"].as_array().expect("ips").len(),
        families.len(),
        "{result}"
    );
    for &v6 in &families {
        let ip = result_ip(&result, v6);
        assert!(node.ns().pings(&ip), "node cannot ping the pod at {ip}");
        let (table, dest) = if v6 {
            ("ip6tables", format!("[{ip}]:80"))
        } else {
            ("iptables", format!("{ip}:80"))
        };
        let nat = node.ns().ok([table, "-w", "-t", "nat", "-S"]);
        assert_eq!(
            nat.contains(&format!("--to-destination {dest}")),
            ports,
            "{nat}"
        );
    }
    let hosts = host_interfaces(&result);
    assert!(hosts.iter().any(|n| n.starts_with("bwp")), "{result}");
    assert!(
        pod.ok(["ip", "-o", "link", "show", "eth0"])
            .contains("mtu 1400")
    );

    let checked = rt.check(&att);

    rt.del(&att).expect("DEL through the chain");
    assert_chain_removed(&node, 8081);
    rt.del(&att).expect("second DEL");
    checked
}

/// Must show 3's CHECK through the whole chain, portmap included: for a dual-stack pod
/// without port mappings and for single-family pods with one (the reference plugins v1.10;
/// Debian's portmap 1.1.1 failed every CHECK of a mapping).
#[test]
fn check_passes_through_the_whole_chain() {
    flock_testkit::require_root();
    chain_case("chn0", None, false)
        .expect("CHECK through flock, tuning, portmap and bandwidth, dual stack, no mapping");
    for (tag, only) in [("chn6", "ipv6"), ("chn4", "ipv4")] {
        chain_case(tag, Some(only), true).unwrap_or_else(|e| {
            panic!("CHECK through the chain, {only} only, with a mapping: {e}")
        });
    }
}
