//! `life ready`: flock's CNI STATUS as the node's readiness. containerd 2 calls STATUS (the
//! conflist offers CNI 1.1) and the kubelet turns a failure into its node's `Ready=False`,
//! with flock's message. Two transitions on node1, each timed from the action to the kubelet's
//! own node condition, and back (a crash, SIGKILL, fails STATUS at once; the kubelet restarts
//! the container within the seconds of its status loop, so that one is proven at the CRI, by
//! flock-e2e's `containerd_2_reports_flock_status_as_network_ready`):
//!
//! - **stop**: the agent's pod deleted and not replaced (the DaemonSet is deleted with its pods
//!   orphaned for the run, then created again, adopting them). The agent leaves its restart
//!   notice, so STATUS holds for `agentWaitSeconds` (ADDs wait that long), then the node goes
//!   NotReady; the DaemonSet back, Ready.
//! - **pool exhausted**: node1's NodeConfig's IPv4 CIDR shrunk to a /30 whose one address a pod
//!   holds (the pool controller scaled to zero for the run, as it owns the NodeConfig): the
//!   node goes NotReady naming the pool; the CIDR restored, Ready.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::super::deploy::DEMO_NS;
use super::super::report::json;
use super::super::{NODES, Node, kubectl, kubectl_stdin};
use super::{StoppedAgent, rollout_flock};
use crate::sys;

/// How long a transition may take before the scenario gives up on it: the restart notice's
/// `agentWaitSeconds` (30) and the kubelet's status loop, with room.
const LIMIT: Duration = Duration::from_secs(120);

/// The node's `Ready` condition: status and message.
fn ready_condition(n: &Node) -> Result<(String, String)> {
    let v = json(&["get", "node", n.name, "-o", "json"])?;
    let c = v["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
        .with_context(|| format!("{} has no Ready condition", n.name))?;
    Ok((
        c["status"].as_str().unwrap_or("?").to_owned(),
        c["message"].as_str().unwrap_or("").to_owned(),
    ))
}

/// Waits until `n`'s Ready condition is `want`; returns how long it took and its message.
fn wait_ready(n: &Node, want: bool, since: Instant) -> Result<(Duration, String)> {
    let want = if want { "True" } else { "False" };
    let mut last = (String::new(), String::new());
    while since.elapsed() < LIMIT {
        last = ready_condition(n)?;
        if last.0 == want {
            return Ok((since.elapsed(), last.1));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    bail!(
        "{} not Ready={want} within {LIMIT:?} (Ready={}: {})",
        n.name,
        last.0,
        last.1
    )
}

/// One row of the table: the transition, the condition's status and message, the time.
fn row(what: &str, status: &str, took: Duration, message: &str) -> Vec<String> {
    vec![
        what.to_owned(),
        status.to_owned(),
        format!("{:.1} s", took.as_secs_f64()),
        message.chars().take(160).collect(),
    ]
}

/// Runs the transitions on node1; its table into `out`; returns what missed its goal.
pub fn ready(out: &mut String) -> Result<Vec<String>> {
    let n = &NODES[0];
    let mut failures = Vec::new();
    let mut rows = Vec::new();
    // A test before this one may have left the node not ready for a while (the policy test's
    // 10,000 pods keep a debug agent busy enough that the kubelet restarts it): the
    // transitions start from a Ready node.
    wait_ready(n, true, Instant::now())
        .with_context(|| format!("{} Ready before the test", n.name))?;
    stop(n, &mut rows, &mut failures)?;
    exhausted(n, &mut rows, &mut failures)?;
    let _ = writeln!(
        out,
        "NETWORK READY (flock's CNI STATUS as {}'s Ready condition, read from the apiserver every 0.25 s)",
        n.name
    );
    sys::table(
        out,
        &["transition", "Ready", "after", "kubelet's message"],
        &rows,
    );
    out.push('\n');
    Ok(failures)
}

/// flock's message must reach the node's condition: the kubelet quotes the runtime, which
/// quotes the plugin.
fn check_message(what: &str, message: &str, want: &str, failures: &mut Vec<String>) {
    if !message.contains(want) {
        failures.push(format!(
            "{what}: the node's message does not carry flock's {want:?}: {message:?}"
        ));
    }
}

fn stop(n: &Node, rows: &mut Vec<Vec<String>>, failures: &mut Vec<String>) -> Result<()> {
    let (stopped, t) = (StoppedAgent::stop(n)?, Instant::now());
    let result = (|| -> Result<()> {
        let (took, message) = wait_ready(n, false, t)?;
        check_message("stop", &message, "flock agent", failures);
        if took < Duration::from_secs(25) {
            failures.push(format!(
                "stop: NotReady after {took:?}, before the restart notice's agentWaitSeconds (30 s)"
            ));
        }
        rows.push(row("agent stopped (pod deleted)", "False", took, &message));
        Ok(())
    })();
    let t = Instant::now();
    stopped.start_again()?;
    result?;
    let (took, _) = wait_ready(n, true, t)?;
    rows.push(row("  DaemonSet back", "True", took, ""));
    rollout_flock()
}

/// The pod that holds the one address of the shrunk pool.
const HOLDER: &str = "ready-pool-holder";

fn exhausted(n: &Node, rows: &mut Vec<Vec<String>>, failures: &mut Vec<String>) -> Result<()> {
    let nc = json(&["get", "nodeconfig", n.name, "-o", "json"])?;
    let cidr4 = nc["spec"]["cidr4"]
        .as_str()
        .context("the NodeConfig has no cidr4")?
        .to_owned();
    let net: ipnet::Ipv4Net = cidr4.parse().context("the NodeConfig's cidr4")?;
    // The last /30 of the node's range: the pods of the demo sit at its start.
    let last = ipnet::Ipv4Net::new(net.broadcast(), 30)
        .map(|n| n.trunc())
        .context("a /30 at the end of cidr4")?;
    let scale = |replicas: &str| {
        kubectl(&[
            "-n",
            "kube-system",
            "scale",
            "deployment/flock-controller",
            &format!("--replicas={replicas}"),
        ])
    };
    scale("0")?;
    let patch = |cidr: &str| {
        kubectl(&[
            "patch",
            "nodeconfig",
            n.name,
            "--type=merge",
            "-p",
            &format!(r#"{{"spec":{{"cidr4":"{cidr}"}}}}"#),
        ])
    };
    let result = (|| -> Result<()> {
        patch(&last.to_string())?;
        let manifest = format!(
            "apiVersion: v1
kind: Pod
metadata: {{ name: {HOLDER}, namespace: {DEMO_NS} }}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 0
  containers:
    - {{ name: c, image: {image}, command: [sleep, '3600'] }}
",
            node = n.name,
            image = super::super::images::NET,
        );
        let t = Instant::now();
        kubectl_stdin(&["apply", "-f", "-"], &manifest)?;
        let (took, message) = wait_ready(n, false, t)?;
        check_message("pool exhausted", &message, &last.to_string(), failures);
        rows.push(row(
            &format!("IPv4 pool shrunk to {last}, one pod in it"),
            "False",
            took,
            &message,
        ));
        Ok(())
    })();
    let _ = kubectl(&[
        "-n",
        DEMO_NS,
        "delete",
        "pod",
        HOLDER,
        "--ignore-not-found",
        "--wait=false",
    ]);
    let t = Instant::now();
    let restored = patch(&cidr4);
    let scaled = scale("2");
    result?;
    restored?;
    scaled?;
    let (took, _) = wait_ready(n, true, t)?;
    rows.push(row(&format!("  cidr4 back to {cidr4}"), "True", took, ""));
    Ok(())
}
