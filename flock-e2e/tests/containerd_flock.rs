//! containerd's CRI plugin (containerd 2, the test bed's build) with flock as its CNI,
//! installed as a node gets it: `flock-agent install-cni` copies the shim into the CNI bin dir
//! and writes the conflist into the conf dir containerd reads (`cniVersion` 1.0.0 offering
//! 1.1.0, which containerd 2 picks: it then calls flock's STATUS for its NetworkReady).
//! The real agent runs standalone in the node (containerd's network and mount namespaces,
//! entered once containerd is up, so it dies with the node), containerd execs the shim, and a
//! Rust CRI client drives RunPodSandbox, StopPodSandbox and RemovePodSandbox as kubelet does.
//!
//! In the same run, the same five sandboxes with the reference `ptp` + `host-local` give the
//! RunPodSandbox time to compare against (printed).
//!
//! containerd 1.7 (Kubernetes 1.35 and 1.36 still run on it) reads the same installed conflist:
//! it knows CNI 1.0.0 at most, ignores `cniVersions` and runs the list as 1.0.0, portmap
//! chained after flock included.
#![cfg(feature = "root-tests")]

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use flock_e2e::{E2eNode, NodeSetup, PodSandboxSpec, SandboxNetwork};
use flock_testkit::node::AgentLayout;
use serde_json::{Value, json};

const NET_NAME: &str = "e2e-flock";
const CIDR6: &str = "2001:db8:c5::/64";
const CIDR4: &str = "10.75.0.0/24";
/// One pod asks for an extra fixed address through a pod annotation, which only reaches the
/// agent if containerd passes the annotations (capability `io.kubernetes.cri.pod-annotations`).
const EXTRA: &str = "2001:db8:c5ff::42";

/// The agent's files and the node's CNI directories, outside the harness dir (the conflist
/// names them before the harness dir exists).
struct AgentFiles {
    dir: tempfile::TempDir,
}

impl AgentFiles {
    /// Installs flock with `flock-agent install-cni` (and `install_args`) into `bin` and
    /// `net.d`, with the socket and state dir (so the DEL queue, `state/del-queue`) the agent
    /// will use, and writes the NodeConfig.
    fn new(install_args: &[&str]) -> AgentFiles {
        let dir = tempfile::Builder::new()
            .prefix("flock-e2e-agent-")
            .tempdir()
            .expect("agent dir");
        let files = AgentFiles { dir };
        // The node's reference plugins, as their package installs them: containerd's CRI
        // plugin runs `loopback` on every sandbox, and install-cni chains `portmap`.
        std::fs::create_dir_all(files.bin_dir()).expect("bin dir");
        for plugin in ["loopback", "portmap"] {
            std::os::unix::fs::symlink(
                flock_testkit::reference_plugins_dir().join(plugin),
                files.bin_dir().join(plugin),
            )
            .expect("link a reference plugin");
        }
        let out = Command::new(flock_testkit::workspace_bin("flock-agent"))
            .env_clear()
            .arg("install-cni")
            .arg("--shim")
            .arg(flock_testkit::shim_bin())
            .arg("--bin-dir")
            .arg(files.bin_dir())
            .arg("--conf-dir")
            .arg(files.conf_dir())
            .args(["--network", NET_NAME])
            .arg("--agent-socket")
            .arg(files.socket())
            .arg("--state-dir")
            .arg(files.state_dir())
            .args(install_args)
            .output()
            .expect("run flock-agent install-cni");
        assert!(
            out.status.success(),
            "install-cni failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::write(
            files.path("node.yaml"),
            format!(
                "apiVersion: flock.fritzlab.net/v1alpha1\nkind: NodeConfig\nmetadata:\n  name: e2e-node\nspec:\n  cidr6: {CIDR6}\n  cidr4: {CIDR4}\n"
            ),
        )
        .expect("write node.yaml");
        files
    }
    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }
    /// The node's CNI bin dir (`/opt/cni/bin`).
    fn bin_dir(&self) -> PathBuf {
        self.path("bin")
    }
    /// The node's CNI conf dir (`/etc/cni/net.d`).
    fn conf_dir(&self) -> PathBuf {
        self.path("net.d")
    }
    fn socket(&self) -> PathBuf {
        self.path("run/agent.sock")
    }
    fn state_dir(&self) -> PathBuf {
        self.path("state")
    }
    /// What install-cni wrote, parsed.
    fn installed_conflist(&self) -> Value {
        let path = self.conf_dir().join("01-flock.conflist");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        serde_json::from_str(&text).expect("the installed conflist is JSON")
    }
    /// Committed allocation records: (file name, record). The files follow testkit's
    /// [`AgentLayout`] under the agent dir.
    fn records(&self) -> Vec<(String, Value)> {
        let layout = AgentLayout::new(self.dir.path());
        layout
            .records()
            .into_iter()
            .map(|n| {
                let record = layout.record(&n);
                (n, record)
            })
            .collect()
    }
    fn log(&self) -> String {
        std::fs::read_to_string(self.path("agent.log")).unwrap_or_default()
    }
}

/// Starts the agent in the node: in containerd's network namespace (the node's) *and* its
/// mount namespace, and waits until it serves its socket.
///
/// The harness runs containerd in a private mount namespace (slave of the machine's), so the
/// sandbox netns pins containerd makes under its state dir exist only there; on a real node
/// containerd and the agent see the same mounts, which is what entering containerd's mount
/// namespace reproduces. The agent is a process of the node namespace: dropping the node
/// kills it.
fn start_agent(files: &AgentFiles, containerd_pid: u32) -> Child {
    let log = std::fs::File::create(files.path("agent.log")).expect("create agent log");
    let agent = Command::new("nsenter")
        .args(["-t", &containerd_pid.to_string(), "-m", "-n", "--"])
        .arg(flock_testkit::workspace_bin("flock-agent"))
        .args(["run", "--standalone", "--node-config"])
        .arg(files.path("node.yaml"))
        .arg("--socket")
        .arg(files.socket())
        // No --del-queue-dir: the agent drains `<state-dir>/del-queue`, where install-cni
        // told the shim to queue.
        .arg("--state-dir")
        .arg(files.state_dir())
        .arg("--bird-config")
        .arg(files.path("bird/bird.conf"))
        .arg("--bird-socket")
        .arg(files.path("run/bird.ctl"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn flock-agent");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(files.socket()).is_err() {
        assert!(
            Instant::now() < deadline,
            "flock-agent did not serve within 10 s:\n{}",
            files.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    agent
}

fn in_node_cidr(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.octets()[..3] == [10, 75, 0],
        IpAddr::V6(a) => a.segments()[..4] == [0x2001, 0xdb8, 0xc5, 0],
    }
}

fn pod(i: usize) -> PodSandboxSpec {
    PodSandboxSpec::new(
        &format!("pod-{i}"),
        "e2e",
        &format!("00000000-0000-4000-8000-00000000010{i}"),
    )
}

/// Five sandboxes under ptp + host-local (dual stack), timed; torn down.
async fn ptp_run_times() -> Vec<Duration> {
    let ipam = tempfile::tempdir().expect("ipam dir");
    let conflist = json!({
        "cniVersion": "1.0.0",
        "name": "e2e-ptp",
        "plugins": [{
            "type": "ptp",
            "ipMasq": false,
            "ipam": {
                "type": "host-local",
                "dataDir": ipam.path(),
                "ranges": [[{ "subnet": "10.76.0.0/24" }], [{ "subnet": "2001:db8:c6::/64" }]],
                "routes": [{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }],
            },
        }],
    });
    let node = E2eNode::start(NodeSetup::new(
        conflist.to_string(),
        flock_testkit::reference_plugins_dir(),
    ))
    .await
    .expect("ptp node starts");
    let mut cri = node.cri().await.expect("CRI client");
    let mut times = Vec::new();
    for i in 0..5 {
        let run = cri
            .run_pod_sandbox(&pod(i))
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", node.containerd().log_tail(30)));
        times.push(run.elapsed);
        cri.stop_pod_sandbox(&run.id).await.expect("stop");
        cri.remove_pod_sandbox(&run.id).await.expect("remove");
    }
    times
}

#[tokio::test]
async fn five_flock_sandboxes_run_answer_and_clean_up() {
    flock_e2e::require_tools();
    let files = AgentFiles::new(&[]);
    let conflist = files.installed_conflist();
    assert_eq!(
        (
            &conflist["cniVersion"],
            &conflist["plugins"][0]["delQueueDir"]
        ),
        (&json!("1.0.0"), &json!(files.state_dir().join("del-queue"))),
        "a 1.0.0 list offering 1.1.0, and the shim queues where the agent drains: {conflist}"
    );
    let setup =
        NodeSetup::installed(files.conf_dir(), files.bin_dir()).before_start(|netns, _dir| {
            // A node has an address of its own (the source of the node's IPv4 pings).
            netns.ok(["ip", "addr", "add", "10.99.0.1/32", "dev", "lo"]);
            Ok(())
        });
    let node = E2eNode::start(setup)
        .await
        .expect("node with containerd starts");
    // Before any sandbox: NetworkReady only needs the conflist, ADD needs the agent.
    let mut agent = start_agent(&files, node.containerd().pid());
    let mut cri = node.cri().await.expect("CRI client connects");

    let mut timings = Vec::new();
    let mut sandboxes: Vec<(String, SandboxNetwork)> = Vec::new();
    for i in 0..5 {
        let mut spec = pod(i);
        if i == 4 {
            spec.annotations
                .insert("flock.fritzlab.net/addresses".into(), EXTRA.into());
        }
        let run = cri.run_pod_sandbox(&spec).await.unwrap_or_else(|e| {
            panic!(
                "{e}\ncontainerd log:\n{}\nagent log:\n{}",
                node.containerd().log_tail(30),
                files.log()
            )
        });
        timings.push(run.elapsed);
        let net = cri.sandbox_network(&run.id).await.expect("sandbox status");
        assert_eq!(net.state, "SANDBOX_READY");
        let flock_ips: Vec<IpAddr> = net.ips.iter().copied().filter(in_node_cidr).collect();
        assert_eq!(
            (
                flock_ips.iter().filter(|ip| ip.is_ipv6()).count(),
                flock_ips.iter().filter(|ip| ip.is_ipv4()).count()
            ),
            (1, 1),
            "one IPv6 and one IPv4 address from the node's CIDRs: {:?}",
            net.ips
        );
        // (containerd's CRI makes the first IPv4 the primary pod IP unless its `ip_pref` says
        // otherwise; the kubelet orders a pod's IPs by its node IP's family.)

        // Visible inside the sandbox's own namespace…
        let addrs = node.ip_in_sandbox(&net.netns_path, &["-o", "addr", "show", "dev", "eth0"]);
        for ip in &flock_ips {
            assert!(
                addrs.contains(&format!("{ip}/")),
                "{ip} not on eth0: {addrs}"
            );
        }
        if i == 4 {
            assert!(
                addrs.contains(&format!("{EXTRA}/128")),
                "the pod annotation passed by containerd reached the agent: {addrs}"
            );
        }
        // …and reachable from the node, at once (no DAD wait with flock).
        for ip in &flock_ips {
            assert!(
                node.netns().pings(&ip.to_string()),
                "node cannot ping {ip}\nnode routes:\n{}{}\npod routes:\n{}",
                node.netns().ok(["ip", "route"]),
                node.netns().ok(["ip", "-6", "route"]),
                node.ip_in_sandbox(&net.netns_path, &["-6", "route"]),
            );
        }
        sandboxes.push((run.id, net));
    }

    // The agent's records: one per sandbox, for containerd's sandbox id and eth0, holding the
    // pod identity containerd passed in CNI_ARGS.
    let records = files.records();
    assert_eq!(records.len(), 5, "{records:?}");
    for (i, (id, _)) in sandboxes.iter().enumerate() {
        let (_, record) = records
            .iter()
            .find(|(_, r)| r["containerId"] == id.as_str() && r["ifName"] == "eth0")
            .unwrap_or_else(|| panic!("no record for sandbox {id}: {records:?}"));
        assert_eq!(record["network"], NET_NAME);
        assert_eq!(
            record["pod"],
            json!({
                "namespace": "e2e",
                "name": format!("pod-{i}"),
                "uid": format!("00000000-0000-4000-8000-00000000010{i}")
            }),
            "CNI_ARGS K8S_POD_NAMESPACE/NAME/UID reach the agent"
        );
    }
    let veths = node.netns().links();
    assert_eq!(veths.len(), 5, "one host veth per sandbox: {veths:?}");
    assert!(veths.iter().all(|n| n.starts_with("flock")), "{veths:?}");

    // StopPodSandbox: DEL with the netns and prevResult; RemovePodSandbox: DEL with an empty
    // netns. Either failing fails the call.
    for (id, net) in &sandboxes {
        cri.stop_pod_sandbox(id).await.unwrap_or_else(|e| {
            panic!(
                "stop sandbox: {e}\n{}\n{}",
                node.containerd().log_tail(30),
                files.log()
            )
        });
        assert!(!node.containerd().is_mounted(&net.netns_path));
        cri.remove_pod_sandbox(id).await.unwrap_or_else(|e| {
            panic!(
                "remove sandbox: {e}\n{}\n{}",
                node.containerd().log_tail(30),
                files.log()
            )
        });
        assert!(!net.netns_path.exists(), "netns pin file left");
    }
    assert!(cri.list_pod_sandbox_ids().await.expect("list").is_empty());
    assert_eq!(
        files.records(),
        Vec::new(),
        "the agent released every allocation"
    );
    assert_eq!(
        node.netns().links_settled(<[String]>::is_empty),
        Vec::<String>::new(),
        "host veths gone"
    );
    let routes = format!(
        "{}{}",
        node.netns().ok(["ip", "route"]),
        node.netns().ok(["ip", "-6", "route"])
    );
    assert!(!routes.contains("flock"), "routes left: {routes}");
    let log = std::fs::read_to_string(node.containerd().log_path()).expect("read log");
    assert!(
        !log.to_lowercase().contains("failed to destroy network"),
        "a CNI DEL failed:\n{}",
        node.containerd().log_tail(40)
    );
    // Both DELs of every sandbox reached the agent (the one at stop with the netns, the one
    // at remove without) and succeeded; none had to be queued.
    let metrics = node
        .netns()
        .ok(["curl", "-s", "http://127.0.0.1:9641/metrics"]);
    let del_ok = metrics
        .lines()
        .find_map(|l| l.strip_prefix("flock_cni_requests_total{op=\"DEL\",outcome=\"ok\"} "))
        .and_then(|v| v.trim().parse::<f64>().ok());
    assert_eq!(del_ok, Some(10.0), "5 × (stop + remove) DELs:\n{metrics}");
    assert!(
        !metrics.contains("op=\"DEL\",outcome=\"error\""),
        "a DEL failed:\n{metrics}"
    );
    let queued = std::fs::read_dir(files.state_dir().join("del-queue"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(queued, 0, "no DEL was queued: the agent answered every one");
    drop(cri);
    // The agent is a process of the node namespace: it goes with the node.
    drop(node);
    let status = agent.wait().expect("reap the agent");
    assert!(
        !status.success(),
        "the agent was killed with the node: {status}"
    );

    let ptp = ptp_run_times().await;
    let mut f = timings.clone();
    f.sort();
    let mut p = ptp.clone();
    p.sort();
    println!(
        "RunPodSandbox, 5 sandboxes each, same run:\n  flock (dual stack):            p50 {:?}  max {:?}  all {:?}\n  ptp+host-local (dual stack):   p50 {:?}  max {:?}  all {:?}",
        flock_testkit::percentile(&f, 0.5),
        f[f.len() - 1],
        timings,
        flock_testkit::percentile(&p, 0.5),
        p[p.len() - 1],
        ptp
    );
}

/// containerd 2 picks CNI 1.1.0 from the installed conflist's `cniVersions` and calls flock's
/// STATUS for its `NetworkReady`: ready while the agent serves; not ready, with flock's own
/// message, once it is killed (SIGKILL: no restart notice); ready again when it is back.
#[tokio::test]
async fn containerd_2_reports_flock_status_as_network_ready() {
    flock_e2e::require_tools();
    let files = AgentFiles::new(&[]);
    let node = E2eNode::start(NodeSetup::installed(files.conf_dir(), files.bin_dir()))
        .await
        .expect("node with containerd starts");
    let mut cri = node.cri().await.expect("CRI client connects");
    let down = cri.status().await.expect("CRI Status");
    assert!(
        !down.network_ready && down.not_ready.join(" ").contains("flock agent unreachable"),
        "no agent yet: STATUS fails with flock's message: {down:?}"
    );
    let mut agent = start_agent(&files, node.containerd().pid());
    let up = cri.status().await.expect("CRI Status");
    assert!(up.network_ready, "the agent serves: {up:?}");
    agent.kill().expect("SIGKILL the agent");
    agent.wait().expect("reap the agent");
    let crashed = cri.status().await.expect("CRI Status");
    assert!(
        !crashed.network_ready
            && crashed
                .not_ready
                .join(" ")
                .contains("flock agent unreachable"),
        "a crashed agent leaves no restart notice: {crashed:?}"
    );
    let mut agent = start_agent(&files, node.containerd().pid());
    assert!(cri.status().await.expect("CRI Status").network_ready);
    drop(cri);
    drop(node);
    let _ = agent.kill();
    agent.wait().expect("reap the agent");
}

/// containerd 1.7 runs pods through the conflist `install-cni` writes by default: it takes the
/// list's `cniVersion` 1.0.0 (it ignores `cniVersions` and would fail every pod on a 1.1.0
/// result), runs flock and the chained portmap, and both DELs of a sandbox succeed.
#[tokio::test]
async fn containerd_1_7_runs_pods_through_the_installed_conflist() {
    flock_e2e::require_tools();
    let containerd_1_7 = flock_e2e::containerd_1_7_dir();
    let files = AgentFiles::new(&[]);
    let conflist = files.installed_conflist();
    let chain: Vec<&Value> = conflist["plugins"]
        .as_array()
        .expect("plugins")
        .iter()
        .map(|p| &p["type"])
        .collect();
    assert_eq!(chain, [&json!("flock"), &json!("portmap")], "{conflist}");
    let node = E2eNode::start(
        NodeSetup::installed(files.conf_dir(), files.bin_dir()).containerd_dir(&containerd_1_7),
    )
    .await
    .expect("node with containerd 1.7 starts");
    let version = node.containerd().version().expect("containerd --version");
    assert!(version.contains(" v1.7."), "{version}");
    let mut agent = start_agent(&files, node.containerd().pid());
    let mut cri = node.cri().await.expect("CRI client connects");
    let mut spec = pod(0);
    spec.host_ports = vec![(8080, 80)];
    let run = cri.run_pod_sandbox(&spec).await.unwrap_or_else(|e| {
        panic!(
            "{e}\ncontainerd log:\n{}\nagent log:\n{}",
            node.containerd().log_tail(30),
            files.log()
        )
    });
    let net = cri.sandbox_network(&run.id).await.expect("sandbox status");
    assert_eq!(net.state, "SANDBOX_READY");
    let flock_ips: Vec<IpAddr> = net.ips.iter().copied().filter(in_node_cidr).collect();
    assert_eq!(
        flock_ips.len(),
        2,
        "an address of each family: {:?}",
        net.ips
    );
    // (A 1.1.0 result would have failed the sandbox: `unsupported CNI result version`.)
    let records = files.records();
    assert_eq!(records.len(), 1, "{records:?}");
    // portmap ran after flock, with flock's result: its DNAT of the host port is there.
    let ruleset = node.netns().ok(["nft", "list", "ruleset"]);
    let iptables = node.netns().ok(["iptables-save"]);
    assert!(
        ruleset.contains("8080") || iptables.contains("8080"),
        "no DNAT of host port 8080 after portmap:\n{ruleset}\n{iptables}"
    );
    cri.stop_pod_sandbox(&run.id).await.expect("stop");
    cri.remove_pod_sandbox(&run.id).await.expect("remove");
    assert_eq!(files.records(), Vec::new(), "the agent released the pod");
    let log = std::fs::read_to_string(node.containerd().log_path()).expect("read log");
    assert!(
        !log.to_lowercase().contains("failed to destroy network"),
        "a CNI DEL failed:\n{}",
        node.containerd().log_tail(40)
    );
    drop(cri);
    drop(node);
    let _ = agent.kill();
    agent.wait().expect("reap the agent");
}
