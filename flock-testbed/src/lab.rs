//! `cargo xtask lab [up|down|check|faults]`: a small routed site in network namespaces, from one
//! command. `faults` runs the measured failure tests of `flock-bird/tests/faults.rs` (graceful
//! restart, BFD, passwords, unnumbered sessions) and prints their figures.
//!
//! ```text
//!                       flocklab-router (AS65000, BIRD)
//!                  2001:db8:f1:1::1 /      \ fe80::1 (link-local only)
//!                                  /        \
//!   flocklab-node1 (AS64601)  2001:db8:f1:1::2   fe80::2          flocklab-node2 (AS64602)
//!   flock-agent + BIRD                                         flock-agent + BIRD
//!   pods 2001:db8:a1::/64 10.101.1.0/24                  pods 2001:db8:a2::/64 10.101.2.0/24
//!     flocklab-web-1  (ip-algo workload)                   flocklab-web-2 (ip-algo workload)
//!     flocklab-dns-1  (anycast 2001:db8:53::53, 10.53.0.53) flocklab-dns-2 (same anycast)
//! ```
//!
//! Every session is IPv6 and carries both families (IPv4 with extended next hop). node2's is
//! unnumbered: its link has link-local addresses only (`fe80::1` at the router, `fe80::2` at
//! the node), its NodeConfig names the router as `fe80::1` on `uplink`, and its IPv4 routes
//! cross the session with a link-local IPv6 next hop. node1's session has a TCP MD5 password,
//! which its agent reads from a file (`passwordFile`). Each node
//! runs the standalone agent on its own NodeConfig file, and BIRD on the configuration the
//! agent renders; the pods are created by exec'ing the real shim in the node namespace exactly
//! as a runtime does (testkit's libcni-like runtime: conflist, `CNI_*`, pod annotations as the
//! `io.kubernetes.cri.pod-annotations` capability). Everything lives in namespaces named
//! `flocklab-*` and under [`LAB_DIR`]; nothing touches the machine's own namespace. `up` first
//! removes a lab that is already up; `down` removes every namespace, process and file.
//!
//! [`up`] returns an error if any check fails (a session not Established, the anycast route
//! without two next hops, a lost ping), so `cargo xtask test` runs it as a check too
//! ([`ci`]) with the debug binaries.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use flock_testkit::cni::{Attachment, Runtime};
use serde_json::{Value, json};

use crate::sys;

/// Where the lab keeps its configuration, sockets, state and logs.
pub const LAB_DIR: &str = "/run/flocklab";
/// Every namespace of the lab starts with this.
pub const NS_PREFIX: &str = "flocklab-";
/// Debian packages the lab drives.
const PACKAGES: &[&str] = &["bird2", "iproute2", "iputils-ping", "util-linux"];

const ROUTER: &str = "flocklab-router";
const ROUTER_ASN: u32 = 65000;
const ANYCAST6: &str = "2001:db8:53::53";
const ANYCAST4: &str = "10.53.0.53";
/// The router's own addresses (on its loopback, announced to the nodes).
const ROUTER_LO6: &str = "2001:db8:f0::1";
const ROUTER_LO4: &str = "100.64.0.1";
/// How long sessions, routes and pings may take to converge.
const CONVERGE: Duration = Duration::from_secs(30);

/// One node of the lab.
struct Node {
    name: &'static str,
    asn: u32,
    router_id: &'static str,
    cidr6: &'static str,
    cidr4: &'static str,
    /// The link to the router: the router's and the node's address (/64).
    router_addr: &'static str,
    node_addr: &'static str,
    /// The router's end of the link.
    router_if: &'static str,
    /// The session's TCP MD5 password: the router's configuration has it, the node reads it
    /// from a file its NodeConfig names (`passwordFile`, standalone mode).
    password: Option<&'static str>,
    /// The link has link-local addresses only (`router_addr`, `node_addr` are `fe80::`):
    /// the session is unnumbered.
    unnumbered: bool,
}

const NODES: [Node; 2] = [
    Node {
        name: "node1",
        asn: 64601,
        router_id: "100.64.255.11",
        cidr6: "2001:db8:a1::/64",
        cidr4: "10.101.1.0/24",
        router_addr: "2001:db8:f1:1::1",
        node_addr: "2001:db8:f1:1::2",
        router_if: "to-node1",
        password: Some("flocklab-md5"),
        unnumbered: false,
    },
    Node {
        name: "node2",
        asn: 64602,
        router_id: "100.64.255.12",
        cidr6: "2001:db8:a2::/64",
        cidr4: "10.101.2.0/24",
        router_addr: "fe80::1",
        node_addr: "fe80::2",
        router_if: "to-node2",
        password: None,
        unnumbered: true,
    },
];

/// One pod of the lab: its name, its node (index into [`NODES`]) and its annotations.
struct Pod {
    name: &'static str,
    node: usize,
    annotations: &'static [(&'static str, &'static str)],
}

const PODS: [Pod; 4] = [
    Pod {
        name: "web-1",
        node: 0,
        annotations: &[("flock.fritzlab.net/ip-algo", "workload")],
    },
    Pod {
        name: "dns-1",
        node: 0,
        annotations: &[("flock.fritzlab.net/anycast", "2001:db8:53::53,10.53.0.53")],
    },
    Pod {
        name: "web-2",
        node: 1,
        annotations: &[("flock.fritzlab.net/ip-algo", "workload")],
    },
    Pod {
        name: "dns-2",
        node: 1,
        annotations: &[("flock.fritzlab.net/anycast", "2001:db8:53::53,10.53.0.53")],
    },
];

fn node_ns(node: &Node) -> String {
    format!("{NS_PREFIX}{}", node.name)
}

fn pod_ns(pod: &Pod) -> String {
    format!("{NS_PREFIX}{}", pod.name)
}

fn node_dir(node: &Node) -> PathBuf {
    Path::new(LAB_DIR).join(node.name)
}

/// `cargo xtask lab [up|down|check]` (`check`: up on the debug binaries, then down).
pub fn lab(args: &[String]) -> Result<()> {
    match args.first().map(String::as_str) {
        None | Some("up") => {
            sys::require_root("cargo xtask lab")?;
            sys::ensure_packages(PACKAGES)?;
            let bins = crate::binaries::build(crate::binaries::FLOCK, true)?;
            let started = Instant::now();
            let report = match up(&bins) {
                Ok(report) => report,
                Err(e) => bail!(
                    "{e:#}\n(the lab is left up for inspection: logs under {LAB_DIR}; \
                     `cargo xtask lab down` removes it)"
                ),
            };
            print!("{report}");
            println!(
                "lab up in {:.1} s (after the build); `cargo xtask lab down` removes it",
                started.elapsed().as_secs_f64()
            );
            Ok(())
        }
        Some("check") => {
            // What `cargo xtask test` runs: the debug binaries, up, checks, down.
            sys::require_root("cargo xtask lab check")?;
            sys::ensure_packages(PACKAGES)?;
            ci(&crate::binaries::build(crate::binaries::FLOCK, false)?)
        }
        Some("down") => {
            sys::require_root("cargo xtask lab down")?;
            down()
        }
        Some("faults") => {
            // Graceful restart, BFD, passwords and unnumbered sessions measured with real BIRD
            // (flock-bird/tests/faults.rs; `cargo xtask test` runs it too).
            sys::require_root("cargo xtask lab faults")?;
            sys::ensure_packages(PACKAGES)?;
            sys::cargo([
                "nextest",
                "run",
                "-p",
                "flock-bird",
                "--features",
                "root-tests",
                "--test",
                "faults",
                "--no-capture",
            ])
        }
        Some(other) => {
            bail!("unknown lab command {other:?}: use `cargo xtask lab [up|down|check|faults]`")
        }
    }
}

/// `target/debug`, where `cargo build --workspace --bins` puts the binaries.
pub fn debug_bins() -> PathBuf {
    crate::binaries::target_dir().join("debug")
}

/// The lab as a check of `cargo xtask test`: up with the binaries in `bins` (the debug
/// build), the report printed, then down whatever happened.
pub fn ci(bins: &Path) -> Result<()> {
    let result = up(bins);
    let cleanup = down();
    let report = result?;
    print!("{report}");
    cleanup
}

/// Builds the lab with `flock-agent` and `flock` from `bins` (after removing any lab already
/// up), checks it and returns the printed report. Fails (with the report in the error) when a
/// check fails; the lab stays up until [`down`] (`lab up` leaves it for inspection, the
/// test run removes it).
pub fn up(bins: &Path) -> Result<String> {
    for bin in ["flock-agent", "flock"] {
        if !bins.join(bin).exists() {
            bail!("{} is not built", bins.join(bin).display());
        }
    }
    down().context("remove the previous lab")?;
    std::fs::create_dir_all(LAB_DIR).with_context(|| format!("create {LAB_DIR}"))?;
    build_network()?;
    start_router()?;
    for node in &NODES {
        start_node(node, bins)?;
    }
    let mut pods = Vec::new();
    for pod in &PODS {
        pods.push(add_pod(pod, bins)?);
    }
    let mut failures = Vec::new();
    let mut report = String::new();
    report_pods(&mut report, &pods);
    wait_converged(&mut failures);
    report_sessions(&mut report, &mut failures)?;
    report_router_routes(&mut report, &mut failures)?;
    report_pings(&mut report, &pods, &mut failures);
    report_anycast(&mut report, &mut failures);
    report_agent_restart(&mut report, &pods, bins, &mut failures)?;
    if failures.is_empty() {
        Ok(report)
    } else {
        bail!("{report}\nlab checks failed:\n  {}", failures.join("\n  "))
    }
}

/// Removes every `flocklab-*` namespace (killing what runs inside: agents, BIRD) and
/// [`LAB_DIR`]. Does nothing when no lab is up.
pub fn down() -> Result<()> {
    let namespaces: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(NS_PREFIX))
                .collect()
        })
        .unwrap_or_default();
    let mut killed = Vec::new();
    for ns in &namespaces {
        let pids = sys::output(Command::new("ip").args(["netns", "pids", ns])).unwrap_or_default();
        for pid in pids.split_whitespace() {
            let _ = Command::new("kill").args(["-9", pid]).status();
            killed.push(pid.to_owned());
        }
    }
    // Dead means gone or a zombie waiting for init (BIRD and the agents are not our children).
    let dead = |pid: &String| !pid.parse().is_ok_and(flock_testkit::is_alive);
    sys::wait_for(Duration::from_secs(5), || killed.iter().all(dead))
        .with_context(|| format!("lab processes {killed:?} did not die"))?;
    for ns in &namespaces {
        // A process just killed may still hold the namespace for a moment.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let deleted = Command::new("ip")
                .args(["netns", "del", ns])
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if deleted || !Path::new("/run/netns").join(ns).exists() {
                break;
            }
            if Instant::now() > deadline {
                bail!("cannot delete namespace {ns}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    if Path::new(LAB_DIR).exists() {
        std::fs::remove_dir_all(LAB_DIR).with_context(|| format!("remove {LAB_DIR}"))?;
    }
    if !namespaces.is_empty() {
        eprintln!("lab: removed {}", namespaces.join(" "));
    }
    Ok(())
}

/// Runs `args` inside namespace `ns`.
fn in_ns(ns: &str, args: &[&str]) -> Result<String> {
    sys::output(Command::new("ip").args(["netns", "exec", ns]).args(args))
}

fn add_ns(ns: &str) -> Result<()> {
    sys::output(Command::new("ip").args(["netns", "add", ns]))?;
    in_ns(ns, &["ip", "link", "set", "lo", "up"])?;
    Ok(())
}

fn forwarding(ns: &str) -> Result<()> {
    in_ns(
        ns,
        &[
            "sysctl",
            "-q",
            "-w",
            "net.ipv4.ip_forward=1",
            "net.ipv6.conf.all.forwarding=1",
        ],
    )?;
    Ok(())
}

/// The router, the nodes and a veth link from the router to each node.
fn build_network() -> Result<()> {
    add_ns(ROUTER)?;
    forwarding(ROUTER)?;
    let (lo6, lo4) = (format!("{ROUTER_LO6}/128"), format!("{ROUTER_LO4}/32"));
    in_ns(ROUTER, &["ip", "addr", "add", &lo6, "dev", "lo", "nodad"])?;
    in_ns(ROUTER, &["ip", "addr", "add", &lo4, "dev", "lo"])?;
    for node in &NODES {
        let ns = node_ns(node);
        add_ns(&ns)?;
        forwarding(&ns)?;
        // Created in the router namespace, the node's end moved into the node.
        in_ns(
            ROUTER,
            &[
                "ip",
                "link",
                "add",
                node.router_if,
                "type",
                "veth",
                "peer",
                "name",
                "uplink",
                "netns",
                &ns,
            ],
        )?;
        if node.unnumbered {
            // Only the link-local addresses the two BIRDs are told about.
            in_ns(
                ROUTER,
                &["ip", "link", "set", node.router_if, "addrgenmode", "none"],
            )?;
            in_ns(&ns, &["ip", "link", "set", "uplink", "addrgenmode", "none"])?;
        }
        let router_addr = format!("{}/64", node.router_addr);
        let node_addr = format!("{}/64", node.node_addr);
        in_ns(
            ROUTER,
            &[
                "ip",
                "addr",
                "add",
                &router_addr,
                "dev",
                node.router_if,
                "nodad",
            ],
        )?;
        in_ns(ROUTER, &["ip", "link", "set", node.router_if, "up"])?;
        in_ns(
            &ns,
            &["ip", "addr", "add", &node_addr, "dev", "uplink", "nodad"],
        )?;
        in_ns(&ns, &["ip", "link", "set", "uplink", "up"])?;
    }
    Ok(())
}

fn router_bird_conf() -> String {
    crate::router::Router {
        of: "the lab",
        router_id: "100.64.255.1",
        asn: ROUTER_ASN,
        own6: ROUTER_LO6,
        own4: ROUTER_LO4,
        peers: NODES
            .iter()
            .map(|node| crate::router::Peer {
                name: node.name,
                addr: node.node_addr,
                asn: node.asn,
                interface: node.unnumbered.then_some(node.router_if),
                password: node.password,
                bfd: false,
            })
            .collect(),
    }
    .bird_conf()
}

/// Starts BIRD (daemonised, inside `ns`) on `conf` with control socket `ctl`.
fn start_bird(ns: &str, conf: &Path, ctl: &Path, pid: &Path) -> Result<()> {
    let conf_s = conf.to_string_lossy();
    in_ns(ns, &["bird", "-p", "-c", &conf_s]).with_context(|| format!("check {conf_s}"))?;
    in_ns(
        ns,
        &[
            "bird",
            "-c",
            &conf_s,
            "-s",
            &ctl.to_string_lossy(),
            "-P",
            &pid.to_string_lossy(),
        ],
    )?;
    sys::wait_for(Duration::from_secs(5), || ctl.exists())
        .with_context(|| format!("BIRD in {ns} did not open {}", ctl.display()))
}

fn start_router() -> Result<()> {
    let dir = Path::new(LAB_DIR).join("router");
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let conf = dir.join("bird.conf");
    std::fs::write(&conf, router_bird_conf())
        .with_context(|| format!("write {}", conf.display()))?;
    start_bird(ROUTER, &conf, &dir.join("bird.ctl"), &dir.join("bird.pid"))
}

fn node_yaml(node: &Node) -> String {
    format!(
        "apiVersion: flock.fritzlab.net/v1alpha1
kind: NodeConfig
metadata:
  name: {name}
spec:
  cidr6: {cidr6}
  cidr4: {cidr4}
  bgp:
    asn: {asn}
    routerId: {router_id}
    neighbors:
      - {{ address: \"{router}\",{interface}{password} asn: {ROUTER_ASN} }}
    timers: {{ hold: 6, keepalive: 2, connectRetry: 1 }}
",
        name = node.name,
        cidr6 = node.cidr6,
        cidr4 = node.cidr4,
        asn = node.asn,
        router_id = node.router_id,
        router = node.router_addr,
        interface = if node.unnumbered {
            " interface: uplink,"
        } else {
            ""
        },
        password = if node.password.is_some() {
            format!(" passwordFile: {},", password_file(node).display())
        } else {
            String::new()
        },
    )
}

/// Where the node's BGP password is (standalone mode reads it from a file).
fn password_file(node: &Node) -> PathBuf {
    node_dir(node).join("bgp.password")
}

/// Writes the node's NodeConfig, starts its agent (detached, in the node namespace), waits
/// for its socket and its rendered BIRD configuration, then starts BIRD on it.
fn start_node(node: &Node, bins: &Path) -> Result<()> {
    let dir = node_dir(node);
    for sub in ["run", "state", "del-queue", "bird"] {
        std::fs::create_dir_all(dir.join(sub))
            .with_context(|| format!("create {}", dir.join(sub).display()))?;
    }
    if let Some(password) = node.password {
        std::fs::write(password_file(node), format!("{password}\n"))
            .with_context(|| format!("write {}", password_file(node).display()))?;
    }
    std::fs::write(dir.join("node.yaml"), node_yaml(node))
        .with_context(|| format!("write {}", dir.join("node.yaml").display()))?;
    spawn_agent(node, bins)?;
    let bird_conf = dir.join("bird/bird.conf");
    let ns = node_ns(node);
    let agent_log = || std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    sys::wait_for(Duration::from_secs(10), || bird_conf.exists()).with_context(|| {
        format!(
            "flock-agent on {} wrote no BIRD configuration:\n{}",
            node.name,
            agent_log()
        )
    })?;
    start_bird(
        &ns,
        &bird_conf,
        &dir.join("run/bird.ctl"),
        &dir.join("run/bird.pid"),
    )
}

/// Starts the node's agent (detached, in the node namespace, on the files [`start_node`]
/// wrote) and waits until it serves.
fn spawn_agent(node: &Node, bins: &Path) -> Result<()> {
    let dir = node_dir(node);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("agent.log"))
        .with_context(|| format!("open {}", dir.join("agent.log").display()))?;
    let socket = dir.join("run/agent.sock");
    let bird_conf = dir.join("bird/bird.conf");
    let ns = node_ns(node);
    // setsid: the agent outlives `cargo xtask lab up` and its terminal.
    Command::new("setsid")
        .args(["ip", "netns", "exec", &ns])
        .arg(bins.join("flock-agent"))
        .args(["run", "--standalone", "--node-config"])
        .arg(dir.join("node.yaml"))
        .arg("--socket")
        .arg(&socket)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .arg("--del-queue-dir")
        .arg(dir.join("del-queue"))
        .arg("--bird-config")
        .arg(&bird_conf)
        .arg("--bird-socket")
        .arg(dir.join("run/bird.ctl"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .context("spawn flock-agent")?;
    let agent_log = || std::fs::read_to_string(dir.join("agent.log")).unwrap_or_default();
    sys::wait_for(Duration::from_secs(10), || {
        std::os::unix::net::UnixStream::connect(&socket).is_ok()
    })
    .with_context(|| {
        format!(
            "flock-agent on {} did not serve:\n{}",
            node.name,
            agent_log()
        )
    })
}

/// A pod as ADD created it.
struct PodUp {
    name: &'static str,
    node: &'static str,
    ns: String,
    ipv6: String,
    ipv4: String,
    note: String,
}

/// Creates the pod's namespace and runs ADD through the real shim in its node, as a runtime
/// does.
fn add_pod(pod: &Pod, bins: &Path) -> Result<PodUp> {
    let node = &NODES[pod.node];
    let dir = node_dir(node);
    let ns = pod_ns(pod);
    add_ns(&ns)?;
    let conflist = json!({
        "cniVersion": "1.1.0",
        "name": "flocklab",
        "plugins": [{
            "type": "flock",
            "agentSocket": dir.join("run/agent.sock"),
            "delQueueDir": dir.join("del-queue"),
            "capabilities": { "io.kubernetes.cri.pod-annotations": true }
        }]
    });
    let runtime = Runtime::new(conflist, [bins], dir.join("cni-cache"))
        .context("flock conflist")?
        .in_netns(Path::new("/run/netns").join(node_ns(node)));
    let annotations: serde_json::Map<String, Value> = pod
        .annotations
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(v)))
        .collect();
    let att = Attachment::new(
        format!("flocklab-{}", pod.name),
        Path::new("/run/netns").join(&ns),
        "eth0",
    )
    .with_arg("K8S_POD_NAMESPACE", "lab")
    .with_arg("K8S_POD_NAME", pod.name)
    .with_capability(
        "io.kubernetes.cri.pod-annotations",
        Value::Object(annotations),
    );
    let result = runtime
        .add(&att)
        .with_context(|| format!("CNI ADD of pod {} on {}", pod.name, node.name))?;
    let ip = |v6: bool| {
        result["ips"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|ip| ip["address"].as_str())
            .find(|a| a.contains(':') == v6)
            .and_then(|a| a.split('/').next())
            .map(str::to_owned)
            .with_context(|| {
                format!(
                    "no IPv{} address for {} in {result}",
                    if v6 { 6 } else { 4 },
                    pod.name
                )
            })
    };
    let note = pod
        .annotations
        .iter()
        .map(|(k, v)| format!("{}={v}", k.trim_start_matches("flock.fritzlab.net/")))
        .collect::<Vec<_>>()
        .join(" ");
    Ok(PodUp {
        name: pod.name,
        node: node.name,
        ns,
        ipv6: ip(true)?,
        ipv4: ip(false)?,
        note,
    })
}

fn birdc(ns: &str, ctl: &Path, args: &[&str]) -> Result<String> {
    let ctl = ctl.to_string_lossy();
    let mut all = vec!["birdc", "-s", &ctl];
    all.extend_from_slice(args);
    in_ns(ns, &all)
}

fn router_ctl() -> PathBuf {
    Path::new(LAB_DIR).join("router/bird.ctl")
}

/// The BGP sessions of `birdc show protocols` (read by flock-bird's parser): (name, state,
/// info). None when birdc fails or prints no protocol table.
fn bgp_sessions(ns: &str, ctl: &Path) -> Vec<(String, String, String)> {
    let text = birdc(ns, ctl, &["show", "protocols"]).unwrap_or_default();
    flock_bird::parse_show_protocols(&text)
        .unwrap_or_default()
        .into_iter()
        .filter(|row| row.is_bgp())
        .map(|row| (row.name, row.state, row.info))
        .collect()
}

fn route_paths(prefix: &str) -> usize {
    let family = if prefix.contains(':') { "-6" } else { "-4" };
    in_ns(ROUTER, &["ip", family, "route", "show", prefix])
        .map(|out| out.lines().filter(|l| l.contains("nexthop")).count())
        .unwrap_or(0)
}

/// Waits until every session is Established, the anycast addresses have two paths at the
/// router and each node has the other's pod prefixes; records what did not happen.
fn wait_converged(failures: &mut Vec<String>) {
    let all_established = || {
        let mut sessions = bgp_sessions(ROUTER, &router_ctl());
        for node in &NODES {
            sessions.extend(bgp_sessions(
                &node_ns(node),
                &node_dir(node).join("run/bird.ctl"),
            ));
        }
        sessions.len() == 2 * NODES.len()
            && sessions.iter().all(|(_, _, info)| info == "Established")
    };
    if sys::wait_for(CONVERGE, all_established).is_err() {
        failures.push("BGP sessions not all Established".into());
    }
    if sys::wait_for(CONVERGE, || {
        route_paths(&format!("{ANYCAST6}/128")) == 2 && route_paths(&format!("{ANYCAST4}/32")) == 2
    })
    .is_err()
    {
        failures.push("the anycast addresses do not have two next hops at the router".into());
    }
    for (i, node) in NODES.iter().enumerate() {
        let other = &NODES[1 - i];
        let ns = node_ns(node);
        let learned = || {
            [other.cidr6, other.cidr4].iter().all(|cidr| {
                let family = if cidr.contains(':') { "-6" } else { "-4" };
                in_ns(&ns, &["ip", family, "route", "show", cidr])
                    .map(|o| o.contains("proto bird"))
                    .unwrap_or(false)
            })
        };
        if sys::wait_for(CONVERGE, learned).is_err() {
            failures.push(format!(
                "{} did not learn {}'s pod prefixes",
                node.name, other.name
            ));
        }
    }
}

fn report_pods(out: &mut String, pods: &[PodUp]) {
    out.push_str("PODS\n");
    let rows: Vec<Vec<String>> = pods
        .iter()
        .map(|p| {
            vec![
                p.name.to_owned(),
                p.node.to_owned(),
                p.ipv6.clone(),
                p.ipv4.clone(),
                p.note.clone(),
            ]
        })
        .collect();
    sys::table(out, &["pod", "node", "ipv6", "ipv4", "annotations"], &rows);
}

fn report_sessions(out: &mut String, failures: &mut Vec<String>) -> Result<()> {
    out.push_str("BGP SESSIONS (birdc show protocols)\n");
    let mut rows = Vec::new();
    let mut speakers = vec![(
        ROUTER.trim_start_matches(NS_PREFIX).to_owned(),
        ROUTER.to_owned(),
        router_ctl(),
    )];
    for node in &NODES {
        speakers.push((
            node.name.to_owned(),
            node_ns(node),
            node_dir(node).join("run/bird.ctl"),
        ));
    }
    for (who, ns, ctl) in &speakers {
        for (name, state, info) in bgp_sessions(ns, ctl) {
            if info != "Established" {
                failures.push(format!("{who}: session {name} is {info}"));
            }
            rows.push(vec![who.clone(), name, state, info]);
        }
    }
    sys::table(out, &["speaker", "protocol", "state", "info"], &rows);
    Ok(())
}

fn report_router_routes(out: &mut String, failures: &mut Vec<String>) -> Result<()> {
    out.push_str("ROUTER ROUTES (ip route, learned over BGP)\n");
    for family in ["-6", "-4"] {
        let routes = in_ns(ROUTER, &["ip", family, "route", "show", "proto", "bird"])?;
        for line in routes.lines() {
            let _ = writeln!(out, "  {}", line.trim_end().replace('\t', "    "));
        }
    }
    out.push('\n');
    // The unnumbered session carries both families: the node's CIDRs with its link-local
    // address as next hop, IPv4 included.
    for node in NODES.iter().filter(|n| n.unnumbered) {
        for cidr in [node.cidr6, node.cidr4] {
            let family = if cidr.contains(':') { "-6" } else { "-4" };
            let route = in_ns(ROUTER, &["ip", family, "route", "show", cidr])?;
            let via = format!("{} dev {}", node.node_addr, node.router_if);
            if !route.contains(&via) {
                failures.push(format!(
                    "{cidr} of {} (unnumbered) is not routed via {via}: {route:?}",
                    node.name
                ));
            }
        }
    }
    for anycast in [format!("{ANYCAST6}/128"), format!("{ANYCAST4}/32")] {
        let paths = route_paths(&anycast);
        if paths != 2 {
            failures.push(format!(
                "anycast {anycast} has {paths} next hops at the router, not 2"
            ));
        }
    }
    Ok(())
}

/// Every pod pings every other pod's IPv6 and IPv4 address (3 echo requests each, all in
/// parallel); a cell is `v6/v4` with `ok` for no loss.
fn report_pings(out: &mut String, pods: &[PodUp], failures: &mut Vec<String>) {
    let results: Vec<Vec<(bool, bool)>> = std::thread::scope(|s| {
        let handles: Vec<Vec<_>> = pods
            .iter()
            .map(|src| {
                pods.iter()
                    .map(|dst| {
                        let same = std::ptr::eq(src, dst);
                        let ping = move |addr: &str| {
                            same || Command::new("ip")
                                .args([
                                    "netns", "exec", &src.ns, "ping", "-q", "-c", "3", "-i", "0.2",
                                    "-W", "2", addr,
                                ])
                                .stderr(Stdio::null())
                                .output()
                                .map(|o| {
                                    String::from_utf8_lossy(&o.stdout).contains(" 0% packet loss")
                                })
                                .unwrap_or(false)
                        };
                        let (v6, v4) = (dst.ipv6.clone(), dst.ipv4.clone());
                        s.spawn(move || (ping(&v6), ping(&v4)))
                    })
                    .collect()
            })
            .collect();
        handles
            .into_iter()
            .map(|row| {
                row.into_iter()
                    .map(|h| h.join().unwrap_or((false, false)))
                    .collect()
            })
            .collect()
    });
    out.push_str("PING MATRIX (row pings column; IPv6/IPv4, 3 echoes each, ok = no loss)\n");
    let mut header = vec!["from \\ to".to_owned()];
    header.extend(pods.iter().map(|p| format!("{} ({})", p.name, p.node)));
    let mut rows = Vec::new();
    for (src, row) in pods.iter().zip(&results) {
        let mut cells = vec![format!("{} ({})", src.name, src.node)];
        for (dst, (v6, v4)) in pods.iter().zip(row) {
            if std::ptr::eq(src, dst) {
                cells.push("-".into());
                continue;
            }
            let mark = |ok: &bool| if *ok { "ok" } else { "LOSS" };
            cells.push(format!("{}/{}", mark(v6), mark(v4)));
            if !v6 || !v4 {
                failures.push(format!(
                    "{} -> {}: IPv6 {}, IPv4 {}",
                    src.name,
                    dst.name,
                    mark(v6),
                    mark(v4)
                ));
            }
        }
        rows.push(cells);
    }
    let header_refs: Vec<&str> = header.iter().map(String::as_str).collect();
    sys::table(out, &header_refs, &rows);
}

/// The router pings the anycast addresses from its own address, and `ip route get` shows
/// the path each flow takes (the kernel hashes flows over the two next hops).
fn report_anycast(out: &mut String, failures: &mut Vec<String>) {
    out.push_str("ANYCAST FROM THE ROUTER (3 echoes each, ok = no loss)\n");
    let mut rows = Vec::new();
    for (addr, src) in [(ANYCAST6, ROUTER_LO6), (ANYCAST4, ROUTER_LO4)] {
        let ok = in_ns(
            ROUTER,
            &[
                "ping", "-q", "-c", "3", "-i", "0.2", "-W", "2", "-I", src, addr,
            ],
        )
        .map(|o| o.contains(" 0% packet loss"))
        .unwrap_or(false);
        if !ok {
            failures.push(format!("router -> anycast {addr}: loss"));
        }
        rows.push(vec![
            format!("{src} -> {addr}"),
            (if ok { "ok" } else { "LOSS" }).to_owned(),
            format!(
                "{} next hops",
                route_paths(&format!(
                    "{addr}/{}",
                    if addr.contains(':') { 128 } else { 32 }
                ))
            ),
        ]);
    }
    sys::table(out, &["flow", "ping", "route"], &rows);
}

/// The agent on node1 stops (SIGTERM) and starts again while a pod on node2 pings a pod on
/// node1 every 20 ms: nothing of the data plane or of BGP may notice (no ping lost, BIRD the
/// same process with the same configuration, the router's session Established).
fn report_agent_restart(
    out: &mut String,
    pods: &[PodUp],
    bins: &Path,
    failures: &mut Vec<String>,
) -> Result<()> {
    let node = &NODES[0];
    let ns = node_ns(node);
    let dir = node_dir(node);
    let (Some(src), Some(dst)) = (
        pods.iter().find(|p| p.node != node.name),
        pods.iter().find(|p| p.node == node.name),
    ) else {
        bail!("the lab has no pod on each node");
    };
    let conf_before = std::fs::read(dir.join("bird/bird.conf")).context("read bird.conf")?;
    let bird_pid = std::fs::read_to_string(dir.join("run/bird.pid"))
        .context("read bird.pid")?
        .trim()
        .parse::<u32>()
        .context("bird.pid")?;
    let agents: Vec<u32> = sys::output(Command::new("ip").args(["netns", "pids", &ns]))?
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains("flock-agent"))
        })
        .collect();
    if agents.is_empty() {
        bail!("no flock-agent runs in {ns}");
    }
    let count = 150;
    let ping = Command::new("ip")
        .args([
            "netns", "exec", &src.ns, "ping", "-n", "-q", "-i", "0.02", "-W", "1",
        ])
        .args(["-c", &count.to_string(), &dst.ipv6])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("spawn ping")?;
    std::thread::sleep(Duration::from_millis(300));
    let stopped = Instant::now();
    for pid in &agents {
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
    }
    sys::wait_for(Duration::from_secs(10), || {
        agents.iter().all(|pid| !flock_testkit::is_alive(*pid))
    })
    .context("the agent did not stop on SIGTERM")?;
    std::thread::sleep(Duration::from_millis(500));
    spawn_agent(node, bins)?;
    let down_for = stopped.elapsed();
    let output = ping.wait_with_output().context("wait for ping")?;
    let text = String::from_utf8_lossy(&output.stdout);
    let received = text
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .and_then(|l| l.split(", ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse::<u32>().ok())
        .unwrap_or(0);
    let lost = count - received.min(count);
    // The restarted agent renders again: give its debounced writer a moment.
    std::thread::sleep(Duration::from_secs(1));
    let conf_same = std::fs::read(dir.join("bird/bird.conf")).ok().as_ref() == Some(&conf_before);
    let bird_alive = flock_testkit::is_alive(bird_pid);
    let session = bgp_sessions(ROUTER, &router_ctl())
        .into_iter()
        .find(|(name, _, _)| name == node.name)
        .map(|(_, _, info)| info)
        .unwrap_or_default();
    out.push_str("AGENT RESTART (node1's agent stopped with SIGTERM and started again)\n");
    let rows = vec![
        vec![
            format!("{} -> {} every 20 ms", src.name, dst.name),
            format!("{lost} lost of {count}"),
        ],
        vec![
            "agent down for".into(),
            format!("{} ms", down_for.as_millis()),
        ],
        vec![
            "BIRD".into(),
            if bird_alive {
                format!("same process ({bird_pid})")
            } else {
                "gone".into()
            },
        ],
        vec![
            "bird.conf".into(),
            if conf_same { "unchanged" } else { "changed" }.into(),
        ],
        vec!["router's session".into(), session.clone()],
    ];
    sys::table(out, &["check", "result"], &rows);
    if lost > 0 {
        failures.push(format!("agent restart: {lost} of {count} pings lost"));
    }
    if !bird_alive || !conf_same || session != "Established" {
        failures.push(format!(
            "agent restart touched BGP: BIRD alive {bird_alive}, bird.conf unchanged {conf_same}, session {session:?}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lab_addresses_stay_in_documentation_and_private_ranges() {
        let conf = router_bird_conf();
        for node in &NODES {
            let yaml = node_yaml(node);
            for text in [&yaml, &conf] {
                assert!(!text.contains("fd00:"), "{text}");
                assert!(!text.contains("192.0.2."), "{text}");
            }
            assert!(node.cidr6.starts_with("2001:db8:"));
            assert!(node.cidr4.starts_with("10."));
            assert!(conf.contains(&format!("neighbor {} as {}", node.node_addr, node.asn)));
            // A link-local address is only usable with its interface.
            assert_eq!(node.node_addr.starts_with("fe80:"), node.unnumbered);
            assert_eq!(yaml.contains("interface: uplink"), node.unnumbered);
            // A password is in the router's configuration and in a file, never in the NodeConfig.
            if let Some(password) = node.password {
                assert!(conf.contains(&format!("password \"{password}\";")));
                assert!(!yaml.contains(password) && yaml.contains("passwordFile: "));
            }
        }
        assert!(ANYCAST6.starts_with("2001:db8:") && ANYCAST4.starts_with("10."));
    }
}
