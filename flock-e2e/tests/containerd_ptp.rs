//! containerd's CRI plugin driving the reference `ptp` + `host-local`
//! plugins (dual stack) in a stand-in node namespace: the harness works with
//! a real CNI before flock is plugged in.
#![cfg(feature = "root-tests")]

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use flock_e2e::{E2eNode, NodeSetup, PodSandboxSpec, SandboxNetwork};

const NET_NAME: &str = "e2e-ptp";
const V4_SUBNET: &str = "10.88.0.0/24";
const V6_SUBNET: &str = "2001:db8:88::/64";

fn ptp_conflist(ipam_dir: &Path) -> String {
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": NET_NAME,
        "plugins": [{
            "type": "ptp",
            "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "dataDir": ipam_dir,
                "ranges": [[{ "subnet": V4_SUBNET }], [{ "subnet": V6_SUBNET }]],
                "routes": [{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }],
            },
        }],
    })
    .to_string()
}

/// IP files host-local keeps in its data dir for `NET_NAME` (one per
/// allocated address; `lock` and `last_reserved_ip.*` are bookkeeping).
fn allocations(ipam_dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(ipam_dir.join(NET_NAME)) else {
        return Vec::new();
    };
    let mut ips: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.parse::<IpAddr>().is_ok())
        .collect();
    ips.sort();
    ips
}

fn in_subnet(ip: &IpAddr, v4: bool) -> bool {
    match ip {
        IpAddr::V4(a) => v4 && a.octets()[..3] == [10, 88, 0],
        IpAddr::V6(a) => !v4 && a.segments()[..4] == [0x2001, 0xdb8, 0x88, 0],
    }
}

/// ptp's host-side IPv6 address is not usable until its DAD ends (~2 s):
/// retry the ping for up to `limit`, as a probe would.
fn pings_within(node: &E2eNode, ip: IpAddr, limit: Duration) -> bool {
    let started = std::time::Instant::now();
    while started.elapsed() < limit {
        if node.netns().pings(&ip.to_string()) {
            return true;
        }
    }
    false
}

#[tokio::test]
async fn five_ptp_sandboxes_run_answer_and_clean_up() {
    flock_e2e::require_tools();
    let ipam_dir = tempfile::tempdir().expect("ipam tempdir");
    let node = E2eNode::start(NodeSetup::new(
        ptp_conflist(ipam_dir.path()),
        flock_testkit::reference_plugins_dir(),
    ))
    .await
    .expect("node with containerd starts");
    let mut cri = node.cri().await.expect("CRI client connects");

    let mut timings = Vec::new();
    let mut sandboxes: Vec<(String, SandboxNetwork)> = Vec::new();
    for i in 0..5 {
        let pod = PodSandboxSpec::new(
            &format!("pod-{i}"),
            "e2e",
            &format!("00000000-0000-4000-8000-00000000000{i}"),
        );
        let run = cri
            .run_pod_sandbox(&pod)
            .await
            .unwrap_or_else(|e| panic!("{e}\ncontainerd log:\n{}", node.containerd().log_tail(30)));
        timings.push(run.elapsed);
        let net = cri.sandbox_network(&run.id).await.expect("sandbox status");
        assert_eq!(net.state, "SANDBOX_READY");
        assert_eq!(net.ips.len(), 2, "one IPv4 and one IPv6: {:?}", net.ips);
        assert!(
            net.ips.iter().any(|ip| in_subnet(ip, true)),
            "{:?}",
            net.ips
        );
        assert!(
            net.ips.iter().any(|ip| in_subnet(ip, false)),
            "{:?}",
            net.ips
        );
        assert!(node.containerd().is_mounted(&net.netns_path));

        // Visible inside the sandbox's own namespace…
        let addrs = node.ip_in_sandbox(&net.netns_path, &["-o", "addr", "show", "dev", "eth0"]);
        for ip in &net.ips {
            assert!(
                addrs.contains(&format!("{ip}/")),
                "{ip} not on eth0: {addrs}"
            );
        }
        // …and reachable from the node.
        for ip in &net.ips {
            if !pings_within(&node, *ip, Duration::from_secs(6)) {
                let pod = |args: &[&str]| node.ip_in_sandbox(&net.netns_path, args);
                panic!(
                    "node cannot ping {ip}\nnode addrs:\n{}\nnode routes:\n{}\npod addrs:\n{}\npod routes:\n{}",
                    node.netns().ok(["ip", "addr"]),
                    node.netns().ok(["ip", "-6", "route"]),
                    pod(&["addr"]),
                    pod(&["-6", "route"]),
                );
            }
        }
        sandboxes.push((run.id, net));
    }

    assert_eq!(allocations(ipam_dir.path()).len(), 10, "5 × (IPv4 + IPv6)");
    assert_eq!(node.netns().links().len(), 5, "one host veth per sandbox");
    let all_ips: std::collections::HashSet<_> =
        sandboxes.iter().flat_map(|(_, n)| n.ips.clone()).collect();
    assert_eq!(all_ips.len(), 10, "addresses are distinct");

    // StopPodSandbox: DEL with netns and prevResult; RemovePodSandbox: DEL
    // with an empty netns. Either failing fails the call.
    for (id, net) in &sandboxes {
        cri.stop_pod_sandbox(id).await.expect("stop sandbox");
        assert!(
            !node.containerd().is_mounted(&net.netns_path),
            "netns still pinned after stop"
        );
        cri.remove_pod_sandbox(id).await.expect("remove sandbox");
        assert!(
            !net.netns_path.exists(),
            "netns pin file {} left",
            net.netns_path.display()
        );
        assert!(
            !Path::new(&format!("/proc/{}", net.pid)).exists(),
            "pause process {} still alive",
            net.pid
        );
    }

    assert!(cri.list_pod_sandbox_ids().await.expect("list").is_empty());
    assert_eq!(
        allocations(ipam_dir.path()),
        Vec::<String>::new(),
        "host-local released all"
    );
    assert_eq!(
        node.netns().links(),
        Vec::<String>::new(),
        "host veths gone"
    );
    let log = std::fs::read_to_string(node.containerd().log_path()).expect("read log");
    assert!(
        !log.contains("Failed to destroy network") && !log.contains("failed to destroy network"),
        "a CNI DEL failed:\n{}",
        node.containerd().log_tail(40)
    );

    let mut sorted = timings.clone();
    sorted.sort();
    println!(
        "RunPodSandbox with ptp+host-local (dual stack), {} sandboxes: p50 {:?}, max {:?}, all {:?}",
        sorted.len(),
        flock_testkit::percentile(&sorted, 0.5),
        sorted[sorted.len() - 1],
        timings
    );
}

#[tokio::test]
async fn drop_kills_containerd_shims_sandboxes_and_hooked_processes() {
    flock_e2e::require_tools();
    let ipam_dir = tempfile::tempdir().expect("ipam tempdir");
    let setup = NodeSetup::new(
        ptp_conflist(ipam_dir.path()),
        flock_testkit::reference_plugins_dir(),
    )
    .before_start(|netns, dir| {
        // Stands in for flock's agent: a process in the node namespace.
        std::fs::write(dir.join("hook-ran"), netns.name())?;
        std::process::Command::new("ip")
            .args(["netns", "exec", netns.name(), "sleep", "600"])
            .spawn()?;
        Ok(())
    });
    let node = E2eNode::start(setup).await.expect("node starts");
    assert_eq!(
        std::fs::read_to_string(node.dir().join("hook-ran")).expect("hook wrote its marker"),
        node.netns().name()
    );
    let mut cri = node.cri().await.expect("CRI client");
    let run = cri
        .run_pod_sandbox(&PodSandboxSpec::new(
            "leftover",
            "e2e",
            "11111111-0000-4000-8000-000000000000",
        ))
        .await
        .expect("run sandbox");
    let net = cri.sandbox_network(&run.id).await.expect("status");
    let containerd_pid = node.containerd().pid();
    let netns_name = node.netns().name().to_owned();
    let dir = node.dir().to_owned();
    let shim_socket = flock_e2e::shim_socket(&node.containerd().bundle(&run.id))
        .expect("the sandbox's shim socket, recorded in its bundle")
        .display()
        .to_string();
    assert!(Path::new(&shim_socket).exists(), "{shim_socket}");
    drop(cri);

    // Dropped with a sandbox still running, as when a test panics.
    drop(node);
    for pid in [containerd_pid, net.pid] {
        assert!(
            !flock_testkit::is_alive(pid),
            "process {pid} survived the drop"
        );
    }
    assert!(!Path::new("/run/netns").join(&netns_name).exists());
    assert!(!dir.exists(), "harness directory left");
    assert!(
        !Path::new(&shim_socket).exists(),
        "shim socket {shim_socket} left"
    );
    for h in std::fs::read_dir("/sys/fs/cgroup")
        .expect("cgroup fs")
        .flatten()
    {
        let cg = h.path().join("k8s.io").join(&run.id);
        assert!(!cg.exists(), "cgroup {} left", cg.display());
    }
    let shims = std::process::Command::new("pgrep")
        .args(["-f", &dir.display().to_string()])
        .output()
        .expect("pgrep");
    assert!(
        String::from_utf8_lossy(&shims.stdout).trim().is_empty(),
        "processes naming the harness dir survived: {}",
        String::from_utf8_lossy(&shims.stdout)
    );
}
