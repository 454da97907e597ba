//! The CNI runtime stand-in against Debian's reference plugins
//! (containernetworking-plugins in `/usr/lib/cni`), dual stack, host side
//! in a stand-in node namespace, one pod namespace per attachment.
#![cfg(feature = "root-tests")]

use std::path::Path;

use flock_testkit::Netns;
use flock_testkit::cni::{Attachment, Runtime, result_ip};
use serde_json::{Value, json};

fn ptp(data_dir: &Path, v4: &str, v6: &str) -> Value {
    json!({
        "type": "ptp",
        "ipMasq": false,
        "ipam": {
            "type": "host-local",
            "dataDir": data_dir,
            "ranges": [[{ "subnet": v4 }], [{ "subnet": v6 }]],
            "routes": [{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }]
        }
    })
}

fn runtime(dir: &Path, node: &Netns, plugins: Value) -> Runtime {
    let list = json!({ "cniVersion": "1.0.0", "name": "refnet", "plugins": plugins });
    Runtime::new(
        list,
        [flock_testkit::reference_plugins_dir()],
        dir.join("cache"),
    )
    .expect("valid conflist")
    .in_netns(node.path())
}

fn gateway(result: &Value, v6: bool) -> String {
    result["ips"]
        .as_array()
        .expect("ips")
        .iter()
        .filter_map(|ip| ip["gateway"].as_str())
        .find(|a| a.contains(':') == v6)
        .expect("gateway")
        .to_owned()
}

fn host_veth(result: &Value) -> String {
    result["interfaces"]
        .as_array()
        .expect("interfaces")
        .iter()
        .find(|i| i.get("sandbox").is_none())
        .and_then(|i| i["name"].as_str())
        .expect("host interface in result")
        .to_owned()
}

/// Whether `ip link show NAME` succeeds in the machine's own namespace.
fn in_machine_namespace(name: &str) -> bool {
    std::process::Command::new("ip")
        .args(["link", "show", name])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

#[test]
fn ptp_host_local_dual_stack_add_check_del() {
    flock_testkit::require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let node = Netns::new("node");
    let pod = Netns::new("pod");
    let ipam_dir = dir.path().join("ipam");
    let rt = runtime(
        dir.path(),
        &node,
        json!([ptp(&ipam_dir, "10.81.0.0/24", "2001:db8:81::/64")]),
    );
    let att = Attachment::new("ptp-dual-1", pod.path(), "eth0")
        .with_arg("IgnoreUnknown", "1")
        .with_arg("K8S_POD_NAME", "web-0");

    let result = rt.add(&att).expect("ADD");
    let (ip4, ip6) = (result_ip(&result, false), result_ip(&result, true));
    assert!(ip4.starts_with("10.81.0."), "{result}");
    assert!(ip6.starts_with("2001:db8:81::"), "{result}");
    let addrs = pod.ok(["ip", "-o", "addr", "show", "dev", "eth0"]);
    assert!(addrs.contains(&format!("{ip4}/")), "{addrs}");
    assert!(addrs.contains(&format!("{ip6}/")), "{addrs}");
    let veth = host_veth(&result);
    node.ok(["ip", "link", "show", &veth]);
    assert!(
        !in_machine_namespace(&veth),
        "the host veth {veth} must live in the node namespace only"
    );
    assert!(pod.pings(&gateway(&result, false)), "pod → IPv4 gateway");
    assert!(
        // ptp waits for DAD in the pod only; the host side's address may
        // still be tentative for a moment.
        (0..3).any(|_| pod.pings(&gateway(&result, true))),
        "pod → IPv6 gateway: {result}\npod: {}{}\nnode: {}{}",
        pod.ok(["ip", "-6", "addr"]),
        pod.ok(["ip", "-6", "route"]),
        node.ok(["ip", "-6", "addr"]),
        node.ok(["ip", "-6", "route"]),
    );
    assert_eq!(rt.cached_result(&att).expect("cache"), Some(result.clone()));
    assert!(
        ipam_dir.join("refnet").join(&ip4).exists(),
        "host-local record"
    );

    rt.check(&att).expect("CHECK");

    rt.del(&att).expect("DEL");
    assert!(
        !pod.exec(["ip", "link", "show", "eth0"]).status.success(),
        "eth0 removed from the pod"
    );
    assert!(
        !node.exec(["ip", "link", "show", &veth]).status.success(),
        "host veth removed"
    );
    assert!(
        !ipam_dir.join("refnet").join(&ip4).exists(),
        "address released"
    );
    assert_eq!(rt.cached_result(&att).expect("cache"), None);

    rt.del(&att).expect("second DEL");
    rt.del(&att.clone().without_netns())
        .expect("DEL with an empty CNI_NETNS");
}

#[test]
fn check_reports_a_missing_address() {
    flock_testkit::require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let node = Netns::new("node");
    let pod = Netns::new("pod");
    let rt = runtime(
        dir.path(),
        &node,
        json!([ptp(
            &dir.path().join("ipam"),
            "10.82.0.0/24",
            "2001:db8:82::/64"
        )]),
    );
    let att = Attachment::new("ptp-check-1", pod.path(), "eth0");
    let result = rt.add(&att).expect("ADD");
    let ip4 = result_ip(&result, false);
    pod.ok(["ip", "addr", "del", &format!("{ip4}/24"), "dev", "eth0"]);
    let err = rt
        .check(&att)
        .expect_err("CHECK must notice the missing address");
    let cni = err
        .cni_error()
        .unwrap_or_else(|| panic!("no CNI error object: {err}"));
    assert!(cni.msg.contains(&ip4), "{err}");
    rt.del(&att).expect("DEL");
}

fn chain_plugins(ipam_dir: &Path, with_portmap: bool) -> Value {
    let mut plugins = vec![
        ptp(ipam_dir, "10.83.0.0/24", "2001:db8:83::/64"),
        json!({ "type": "tuning", "mtu": 1400, "sysctl": { "net.ipv4.conf.eth0.arp_notify": "1" } }),
    ];
    if with_portmap {
        plugins.push(json!({ "type": "portmap", "capabilities": { "portMappings": true } }));
    }
    plugins.push(json!({ "type": "bandwidth", "capabilities": { "bandwidth": true } }));
    Value::Array(plugins)
}

/// ptp → tuning → portmap → bandwidth, dual stack. ADD, CHECK and DEL work
/// through the whole chain with the reference plugins v1.10 (Debian's portmap
/// 1.1.1 failed the dual-stack CHECK, upstream containernetworking/plugins#819).
#[test]
fn ptp_tuning_portmap_bandwidth_chain() {
    flock_testkit::require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let node = Netns::new("node");
    let pod = Netns::new("pod");
    let ipam_dir = dir.path().join("ipam");
    let rt = runtime(dir.path(), &node, chain_plugins(&ipam_dir, true));
    let att = Attachment::new("chain-1", pod.path(), "eth0")
        .with_arg("IgnoreUnknown", "1")
        .with_capability(
            "portMappings",
            json!([{ "hostPort": 8080, "containerPort": 80, "protocol": "tcp" }]),
        )
        .with_capability(
            "bandwidth",
            json!({
                "ingressRate": 1_000_000, "ingressBurst": 100_000,
                "egressRate": 2_000_000, "egressBurst": 200_000
            }),
        );

    let result = rt.add(&att).expect("ADD through the chain");
    let veth = host_veth(&result);
    let ip4 = result_ip(&result, false);
    let ip6 = result_ip(&result, true);
    // tuning, in the pod.
    let link = pod.ok(["ip", "-o", "link", "show", "eth0"]);
    assert!(link.contains("mtu 1400"), "{link}");
    let arp_notify = pod.ok(["cat", "/proc/sys/net/ipv4/conf/eth0/arp_notify"]);
    assert_eq!(arp_notify.trim(), "1");
    // portmap, in the node: DNAT of 8080 to the pod, per family.
    let nat4 = node.ok(["iptables", "-w", "-t", "nat", "-S"]);
    assert!(
        nat4.contains(&format!("--to-destination {ip4}:80")),
        "{nat4}"
    );
    let nat6 = node.ok(["ip6tables", "-w", "-t", "nat", "-S"]);
    assert!(
        nat6.contains(&format!("--to-destination [{ip6}]:80")),
        "{nat6}"
    );
    // bandwidth, in the node: tbf on the host veth (pod ingress), an ifb
    // with tbf fed from the veth (pod egress).
    let veth_qdisc = node.ok(["tc", "qdisc", "show", "dev", &veth]);
    assert!(veth_qdisc.contains("tbf"), "{veth_qdisc}");
    let ifb = result["interfaces"]
        .as_array()
        .expect("interfaces")
        .iter()
        .filter_map(|i| i["name"].as_str())
        .find(|n| n.starts_with("bwp"))
        .unwrap_or_else(|| panic!("bandwidth adds its ifb to the result: {result}"))
        .to_owned();
    let ifb_link = node.ok(["ip", "-d", "link", "show", &ifb]);
    assert!(ifb_link.contains("ifb"), "{ifb_link}");
    let ifb_qdisc = node.ok(["tc", "qdisc", "show", "dev", &ifb]);
    assert!(ifb_qdisc.contains("tbf"), "{ifb_qdisc}");
    assert!(
        !in_machine_namespace(&ifb),
        "the ifb lives in the node namespace only"
    );

    // CHECK through the whole chain, portmap's dual-stack mapping included (v1.10; Debian's
    // portmap 1.1.1 checked the IPv4 DNAT rule in ip6tables too, upstream #819).
    rt.check(&att)
        .expect("CHECK of ptp, tuning, portmap and bandwidth, dual stack");

    rt.del(&att).expect("DEL through the chain");
    assert!(!node.exec(["ip", "link", "show", &veth]).status.success());
    assert!(!node.exec(["ip", "link", "show", &ifb]).status.success());
    let nat4 = node.ok(["iptables", "-w", "-t", "nat", "-S"]);
    assert!(!nat4.contains("--dport 8080"), "{nat4}");
    let nat6 = node.ok(["ip6tables", "-w", "-t", "nat", "-S"]);
    assert!(!nat6.contains("--dport 8080"), "{nat6}");
    assert!(
        !ipam_dir.join("refnet").join(&ip4).exists(),
        "address released"
    );
    rt.del(&att).expect("second DEL");
    rt.del(&att.clone().without_netns())
        .expect("DEL with an empty CNI_NETNS");
}

#[test]
fn version_of_every_chained_plugin() {
    flock_testkit::require_root();
    let dir = tempfile::tempdir().expect("tempdir");
    let node = Netns::new("node");
    let rt = runtime(dir.path(), &node, json!([{ "type": "ptp" }]));
    for plugin in ["ptp", "host-local", "tuning", "portmap", "bandwidth"] {
        let v = rt.version(plugin).expect("VERSION");
        let versions = v["supportedVersions"]
            .as_array()
            .expect("supportedVersions");
        assert!(versions.contains(&json!("1.0.0")), "{plugin}: {v}");
    }
}
