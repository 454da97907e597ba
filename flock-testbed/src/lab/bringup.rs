//! Bringing the lab up: the namespaces and their links, BIRD on the router and the nodes,
//! each node's agent, and the pods ADDed through the real shim.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result};
use flock_testkit::cni::{Attachment, Runtime};
use serde_json::{Value, json};

use crate::sys;

use super::topology::{
    NODES, Node, Pod, ROUTER, ROUTER_LO4, ROUTER_LO6, node_dir, node_ns, node_yaml, password_file,
    pod_ns, router, router_dir,
};
use crate::router::Kind;

/// Runs `args` inside namespace `ns`.
pub(super) fn in_ns(ns: &str, args: &[&str]) -> Result<String> {
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
pub(super) fn build_network() -> Result<()> {
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

/// Starts BIRD (daemonised, inside `ns`) on `conf` with control socket `ctl`; `recovery`:
/// with `-R` (graceful restart recovery, after a crash).
fn start_bird(ns: &str, conf: &Path, ctl: &Path, pid: &Path, recovery: bool) -> Result<()> {
    let conf_s = conf.to_string_lossy();
    in_ns(ns, &["bird", "-p", "-c", &conf_s]).with_context(|| format!("check {conf_s}"))?;
    let (ctl_s, pid_s) = (ctl.to_string_lossy(), pid.to_string_lossy());
    let mut argv = vec!["bird", "-c", &conf_s, "-s", &ctl_s, "-P", &pid_s];
    if recovery {
        argv.push("-R");
    }
    in_ns(ns, &argv)?;
    sys::wait_for(Duration::from_secs(5), || ctl.exists())
        .with_context(|| format!("BIRD in {ns} did not open {}", ctl.display()))
}

/// Starts the router (BIRD or FRR's zebra, bfdd and bgpd), detached in its namespace, on the
/// configuration rendered from the lab's description, and waits until it serves.
pub(super) fn start_router(kind: Kind) -> Result<()> {
    let dir = router_dir();
    router().write(kind, &dir)?;
    for daemon in kind.start_commands(&dir) {
        let out = dir.join(format!("{}.out", daemon.name));
        // a socket left by an earlier router would pass the wait below at once
        let _ = std::fs::remove_file(&daemon.ready);
        let log =
            std::fs::File::create(&out).with_context(|| format!("create {}", out.display()))?;
        // setsid: the router outlives `cargo xtask lab up`, as the agents do.
        Command::new("setsid")
            .args(["ip", "netns", "exec", ROUTER])
            .args(&daemon.argv)
            .stdin(Stdio::null())
            .stdout(log.try_clone().context("log file")?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("spawn {:?}", daemon.argv))?;
        sys::wait_for(Duration::from_secs(10), || daemon.ready.exists()).with_context(|| {
            format!(
                "the router's {} did not open {}",
                daemon.name,
                daemon.ready.display()
            )
        })?;
    }
    Ok(())
}

/// Starts the node's BIRD again on the configuration its agent rendered, with `-R`: what a
/// BIRD container does after a crash.
pub(super) fn restart_node_bird(node: &Node) -> Result<()> {
    let dir = node_dir(node);
    start_bird(
        &node_ns(node),
        &dir.join("bird/bird.conf"),
        &dir.join("run/bird.ctl"),
        &dir.join("run/bird.pid"),
        true,
    )
}

/// Writes the node's NodeConfig, starts its agent (detached, in the node namespace), waits
/// for its socket and its rendered BIRD configuration, then starts BIRD on it.
pub(super) fn start_node(node: &Node, bins: &Path) -> Result<()> {
    let dir = node_dir(node);
    for sub in ["run", "state", "del-queue", "bird"] {
        std::fs::create_dir_all(dir.join(sub))
            .with_context(|| format!("create {}", dir.join(sub).display()))?;
    }
    if let Some(password) = node.password {
        std::fs::write(password_file(node), format!("{password}\n"))
            .with_context(|| format!("write {}", password_file(node).display()))?;
    }
    write_node_yaml(node, false)?;
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
        false,
    )
}

/// Writes the node's NodeConfig file (`graceful_shutdown`: with `gracefulShutdown: true`).
pub(super) fn write_node_yaml(node: &Node, graceful_shutdown: bool) -> Result<()> {
    let path = node_dir(node).join("node.yaml");
    std::fs::write(&path, node_yaml(node, graceful_shutdown))
        .with_context(|| format!("write {}", path.display()))
}

/// Starts the node's agent (detached, in the node namespace, on the files [`start_node`]
/// wrote) and waits until it serves.
pub(super) fn spawn_agent(node: &Node, bins: &Path) -> Result<()> {
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
pub(super) struct PodUp {
    pub(super) name: &'static str,
    pub(super) node: &'static str,
    pub(super) ns: String,
    pub(super) ipv6: String,
    pub(super) ipv4: String,
    pub(super) note: String,
}

/// Creates the pod's namespace and runs ADD through the real shim in its node, as a runtime
/// does.
pub(super) fn add_pod(pod: &Pod, bins: &Path) -> Result<PodUp> {
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
