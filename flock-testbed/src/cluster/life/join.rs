//! `cargo xtask cluster life join`: a third node joins the cluster and leaves it again, as a
//! server racked, booted, used and decommissioned; and the pool controller's leader is
//! killed while it assigns prefixes to a wave of new nodes.
//!
//! - **Join.** [`JOINER`] is cabled to the router (a link and a BGP session, as a new rack's
//!   top-of-rack port) and boots: containerd, the kubelet (labelled with its rack, whose
//!   NodePool exists and is empty), kube-proxy. Goal: the pool controller writes its
//!   NodeConfig with the rack's first prefixes, flock's DaemonSets start on it, a pod pinned to
//!   it runs with an address of each family from those prefixes, the router learns the
//!   prefixes through the node and reaches the pod over both families.
//! - **Controller leader.** A wave of 30 Node objects of the same rack is created at once (no
//!   machine behind them: only the controller's work is measured), and the controller that
//!   holds the Lease is taken out as soon as the first of their NodeConfigs appears: killed
//!   (SIGKILL; its container restarts, and under the same identity the Lease is still its
//!   own), then, in a second wave, frozen (SIGSTOP) until the standby has taken the expired
//!   Lease and finished the wave, and woken (SIGCONT) with the plan it made before. Every
//!   version of every NodeConfig is watched throughout. Goal: each wave finished, the woken
//!   leader writes nothing and ends, no prefix is ever seen on two nodes nor a node's prefix
//!   changed. Deleting the Nodes returns their prefixes (none reported an allocation).
//! - **Leave.** The node is drained, its kubelet stopped and its Node deleted (the
//!   decommissioning of a machine). The pods bound to it disappear from the API (the pod
//!   garbage collector), its agent — still running — releases the allocations they held once
//!   they have been gone for the leak grace period, reports none, and the controller deletes
//!   its NodeConfig: the prefixes are free in the pool again. Then it is powered off and
//!   unplugged, and the router has no route through it.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::{LEAK_GRACE, PodView, exec, ms, pods, pool_counts, router_routes};
use crate::cluster::deploy::DEMO_NS;
use crate::cluster::proc::{self, Place};
use crate::cluster::report::HTTP_FN;
use crate::cluster::{JOINER, NODES, ROUTER, images, kube, kubectl, kubectl_stdin, node, site};
use crate::sys;

use super::leave::leave;
use super::wave::{delete_wave, leader_kill};

/// The pod pinned to the joining node.
const PINNED: &str = "joiner";

pub fn join(out: &mut String) -> Result<Vec<String>> {
    join_then(out, false)
}

/// `life leave`: node3 joins (as in [`join`]), then leaves: drained, its kubelet stopped, its
/// Node deleted; its agent releases what its pods held after the leak grace, and the pool
/// controller deletes its NodeConfig.
pub fn leave_after_join(out: &mut String) -> Result<Vec<String>> {
    join_then(out, true)
}

/// node3 joins; then either the controller's leader is killed and frozen in waves of Nodes,
/// or node3 leaves. Whatever happens, nothing of node3 is left behind.
fn join_then(out: &mut String, and_leave: bool) -> Result<Vec<String>> {
    let mut failures = Vec::new();
    ensure_leak_grace()?;
    let kube = kube::ensure_built()?;
    // A joiner of an earlier test (join before leave, on one cluster) left by deletion: its
    // prefixes go back once the controller's release grace is over and the pod garbage
    // collector has removed its pods. The rack starts empty, or the counts after the leave
    // have nothing to be compared with.
    sys::wait_for(Duration::from_secs(240), || {
        pool_counts(JOINER.rack).is_ok_and(|c| c.0 == "0")
    })
    .with_context(|| {
        format!(
            "NodePool {} still counts a node 240 s after the last joiner left",
            JOINER.rack
        )
    })?;
    let pool_before = pool_counts(JOINER.rack)?;
    let result = (|| -> Result<()> {
        joined(out, &kube, &mut failures)?;
        if and_leave {
            leave(out, &pool_before, &mut failures)
        } else {
            leader_kill(out, &mut failures)
        }
    })();
    // Whatever happened: no stand-in Node, no joiner left behind.
    let _ = delete_wave();
    let _ = kubectl(&[
        "-n",
        DEMO_NS,
        "delete",
        "pod",
        PINNED,
        "--ignore-not-found",
        "--wait=false",
    ]);
    if proc::alive(&format!("{}-mounts", JOINER.name)).is_some() {
        let _ = node::power_off(&JOINER);
    }
    let _ = site::unplug();
    let _ = kubectl(&["delete", "node", JOINER.name, "--ignore-not-found"]);
    result?;
    out.push('\n');
    Ok(failures)
}

/// The agents' leak grace set to [`LEAK_GRACE`] (a rolling update unless it already is).
fn ensure_leak_grace() -> Result<()> {
    let env = kubectl(&[
        "-n",
        "kube-system",
        "get",
        "daemonset/flock",
        "-o",
        "jsonpath={.spec.template.spec.containers[?(@.name==\"agent\")].env[?(@.name==\"FLOCK_LEAK_GRACE\")].value}",
    ])?;
    if env.trim() == LEAK_GRACE {
        return Ok(());
    }
    kubectl(&[
        "-n",
        "kube-system",
        "set",
        "env",
        "daemonset/flock",
        "-c",
        "agent",
        &format!("FLOCK_LEAK_GRACE={LEAK_GRACE}"),
    ])?;
    kubectl(&[
        "-n",
        "kube-system",
        "rollout",
        "status",
        "daemonset/flock",
        "--timeout=180s",
    ])
    .context("roll out the agents with a short leak grace")?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// join

fn joined(out: &mut String, kube: &kube::KubeBuild, failures: &mut Vec<String>) -> Result<()> {
    // A new machine: nothing on its disk from an earlier run.
    let disk = node::dir(&JOINER);
    if disk.exists() {
        std::fs::remove_dir_all(&disk).with_context(|| format!("remove {}", disk.display()))?;
    }
    let t = Instant::now();
    site::join()?;
    node::start(&JOINER, kube, &images::built()?).context("boot the joining node")?;
    let registered = t.elapsed();
    let want = format!("{} {}", JOINER.cidr6, JOINER.cidr4);
    let mut got = String::new();
    sys::wait_for(Duration::from_secs(60), || {
        got = super::node_config(&JOINER);
        got == want
    })
    .with_context(|| format!("{}'s NodeConfig: want {want}, have {got:?}", JOINER.name))?;
    let configured = t.elapsed();
    for ds in ["flock", "flock-bird"] {
        sys::wait_for(Duration::from_secs(120), || {
            pods("kube-system", &format!("app.kubernetes.io/name={ds}"))
                .is_ok_and(|p| p.iter().any(|p| p.node == JOINER.name && p.ready))
        })
        .with_context(|| format!("{ds}'s pod on {} is not ready", JOINER.name))?;
    }
    let agent_ready = t.elapsed();
    kubectl_stdin(&["apply", "-f", "-"], &pinned_pod())?;
    let mut pod: Option<PodView> = None;
    sys::wait_for(Duration::from_secs(90), || {
        pod = pods(DEMO_NS, &format!("app={PINNED}"))
            .ok()
            .and_then(|p| p.into_iter().next())
            .filter(|p| p.ready && p.ips.len() == 2);
        pod.is_some()
    })
    .with_context(|| {
        format!(
            "pod {PINNED} on {} is not Ready with two addresses",
            JOINER.name
        )
    })?;
    let running = t.elapsed();
    let pod = pod.expect("waited for");
    for ip in &pod.ips {
        let prefix = if ip.contains(':') {
            JOINER.cidr6
        } else {
            JOINER.cidr4
        };
        if !super::super::report::in_prefix(ip, prefix) {
            failures.push(format!("join: {PINNED}'s address {ip} is outside {prefix}"));
        }
    }
    let mut routes = Vec::new();
    let routed = sys::wait_for(Duration::from_secs(60), || {
        routes = router_routes(&JOINER);
        [JOINER.cidr6, JOINER.cidr4]
            .iter()
            .all(|p| routes.iter().any(|r| r == p))
    });
    let at_router = t.elapsed();
    if routed.is_err() {
        failures.push(format!(
            "join: the router has no route to {} and {} through {}: {routes:?}",
            JOINER.cidr6, JOINER.cidr4, JOINER.name
        ));
    }
    // From the router (a client outside the cluster) and from a pod on another node.
    let mut reach = Vec::new();
    let router = Place::Net(ROUTER.to_owned());
    let other = pods(DEMO_NS, "app=anycast")?
        .into_iter()
        .find(|p| p.node == NODES[0].name)
        .context("no anycast pod on node1")?;
    for ip in &pod.ips {
        let url = if ip.contains(':') {
            format!("http://[{ip}]/")
        } else {
            format!("http://{ip}/")
        };
        let from_router = router
            .run(&["curl", "-sS", "--max-time", "5", &url])
            .map(|b| b.trim().to_owned());
        let from_pod =
            exec(&other.name, &format!("{HTTP_FN}http {ip}")).map(|b| b.trim().to_owned());
        for (from, got) in [("router", from_router), (other.name.as_str(), from_pod)] {
            match got {
                Ok(body) if body == PINNED => reach.push(format!("{from} → {ip}: ok")),
                Ok(body) => failures.push(format!("join: {from} → {url} answered {body:?}")),
                Err(e) => failures.push(format!("join: {from} → {url}: {e:#}")),
            }
        }
    }
    let _ = writeln!(
        out,
        "JOIN ({} boots into rack {}, whose NodePool had no node)",
        JOINER.name, JOINER.rack
    );
    let rows = vec![
        vec![
            "node registered (containerd, kubelet, kube-proxy up)".to_owned(),
            ms(registered),
        ],
        vec![
            format!("NodeConfig written by the pool controller: {want}"),
            ms(configured),
        ],
        vec![
            "flock and flock-bird ready on it".to_owned(),
            ms(agent_ready),
        ],
        vec![
            format!("pod {PINNED} Running: {}", pod.ips.join(" ")),
            ms(running),
        ],
        vec![
            format!("router's routes through it: {}", routes.join(" ")),
            ms(at_router),
        ],
        vec![
            format!("HTTP to the pod: {}", reach.join("; ")),
            String::new(),
        ],
    ];
    sys::table(out, &["since it was cabled", ""], &rows);
    Ok(())
}

/// A pod of the demo's net image pinned to the joining node; its page is its hostname.
fn pinned_pod() -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata: {{ name: {PINNED}, namespace: {DEMO_NS}, labels: {{ app: {PINNED} }} }}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  containers:
    - name: web
      image: {image}
      imagePullPolicy: Never
",
        node = JOINER.name,
        image = images::NET,
    )
}

// ---------------------------------------------------------------------------------------
// leader kill
