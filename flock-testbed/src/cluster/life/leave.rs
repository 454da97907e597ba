//! `life leave`: the joined node drained, its kubelet stopped and its Node deleted. Its agent,
//! still running, releases past the leak grace what the kubelet did not tear down, but cannot
//! report it (its pod-bound token died with its pod); the pool controller deletes its
//! NodeConfig once the release grace is over and no pod is bound to it, and its prefixes are
//! free again.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::router_routes;
use super::{LEAK_GRACE, holdings, ms, pool_counts};
use crate::cluster::deploy::RELEASE_GRACE;
use crate::cluster::proc;
use crate::cluster::{JOINER, kubectl, node, site};
use crate::sys;

pub(super) fn leave(
    out: &mut String,
    pool_before: &(String, String, String),
    failures: &mut Vec<String>,
) -> Result<()> {
    // The wave's Nodes are gone: the pool counts the joiner alone once its status is written.
    let mut in_pool = pool_counts(JOINER.rack)?;
    let _ = sys::wait_for(Duration::from_secs(30), || {
        in_pool = pool_counts(JOINER.rack).unwrap_or_default();
        in_pool.0 == "1"
    });
    let held = holdings(&JOINER).0;
    let t = Instant::now();
    kubectl(&[
        "drain",
        JOINER.name,
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--force",
        "--timeout=90s",
    ])
    .context("drain the leaving node")?;
    let drained = t.elapsed();
    let held_drained = holdings(&JOINER).0;
    // The machine is being decommissioned: its kubelet stops first (its containers go on).
    let kubelet =
        proc::alive(&format!("{}-kubelet", JOINER.name)).context("the joiner's kubelet")?;
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &kubelet.to_string()])
        .status();
    sys::wait_for(Duration::from_secs(30), || {
        proc::alive(&format!("{}-kubelet", JOINER.name)).is_none()
    })
    .context("the joiner's kubelet did not stop")?;
    kubectl(&["delete", "node", JOINER.name])?;
    let deleted = t.elapsed();
    let pods_gone = super::wait_pods_unbound(JOINER.name);
    let gc = t.elapsed();
    if pods_gone.is_err() {
        failures.push(format!(
            "leave: pods bound to {} outlived its Node by 150 s",
            JOINER.name
        ));
    }
    // The controller marked the node gone at its deletion; the release grace runs from there,
    // then a resync (30 s) at most.
    let freed = sys::wait_for(Duration::from_secs(180), || {
        kubectl(&["get", "nodeconfig", JOINER.name, "-o", "name"]).is_err()
    });
    let free_at = t.elapsed();
    if freed.is_err() {
        failures.push(format!(
            "leave: {}'s NodeConfig is still there 180 s after its pods went (release grace \
             {RELEASE_GRACE}; status {})",
            JOINER.name,
            holdings(&JOINER).0
        ));
    }
    let mut pool_after = pool_counts(JOINER.rack)?;
    let counted = sys::wait_for(Duration::from_secs(60), || {
        pool_after = pool_counts(JOINER.rack).unwrap_or_default();
        &pool_after == pool_before
    });
    if counted.is_err() {
        failures.push(format!(
            "leave: NodePool {} counts {pool_after:?} (nodes, IPv6 free, IPv4 free), before the join {pool_before:?}",
            JOINER.rack
        ));
    }
    // Every pod's attachment on the node is undone: a drained pod's by the kubelet's DEL when
    // it tore the sandbox down before it stopped, else (and a DaemonSet pod's, gone with the
    // Node) by the agent past the leak grace. Either way its host veth is gone.
    let mut veths = usize::MAX;
    let released = sys::wait_for(Duration::from_secs(60), || {
        veths = holdings(&JOINER).1;
        veths == 0
    });
    let released_at = t.elapsed();
    if released.is_err() {
        failures.push(format!(
            "leave: {} still has {veths} host veths flock* 60 s after its NodeConfig went \
             (allocations {held_drained} when drained)",
            JOINER.name
        ));
    }
    // Its agent's pod is gone from the API with the others: its log is on the node's disk.
    let agent_log = agent_log_on_disk();
    let leaked: Vec<&str> = agent_log
        .lines()
        .filter(|l| l.contains("past the grace period"))
        .collect();
    node::power_off(&JOINER)?;
    site::unplug()?;
    let mut routes = router_routes(&JOINER);
    let withdrawn = sys::wait_for(Duration::from_secs(30), || {
        routes = router_routes(&JOINER);
        routes.is_empty()
    });
    if withdrawn.is_err() {
        failures.push(format!(
            "leave: the router still routes {routes:?} through {}",
            JOINER.name
        ));
    }
    let _ = writeln!(
        out,
        "LEAVE ({} drained, its kubelet stopped, its Node deleted; agent's leak grace {LEAK_GRACE}, \
         controller's release grace {RELEASE_GRACE})",
        JOINER.name
    );
    let rows = vec![
        vec![
            format!("NodePool {} (nodes, IPv6 free, IPv4 free)", JOINER.rack),
            format!("before join {pool_before:?}; joined {in_pool:?}; after {pool_after:?}"),
        ],
        vec![
            "allocations IPv6/IPv4 (NodeConfig status)".to_owned(),
            format!("joined {held}; drained {held_drained}"),
        ],
        vec!["drained".to_owned(), ms(drained)],
        vec!["kubelet stopped, Node deleted".to_owned(), ms(deleted)],
        vec!["its pods gone from the API (pod GC)".to_owned(), ms(gc)],
        vec![
            "release grace over, no pod bound: NodeConfig deleted, prefixes free".to_owned(),
            ms(free_at),
        ],
        vec!["no host veth flock* left on it".to_owned(), ms(released_at)],
        vec![
            format!(
                "agent's log: {} allocations released past the grace period, the last",
                leaked.len()
            ),
            leaked
                .last()
                .and_then(|l| {
                    l.find("released")
                        .map(|i| l[i..].chars().take(150).collect())
                })
                .unwrap_or_default(),
        ],
        vec![
            "router's routes through it after power-off".to_owned(),
            format!("{routes:?}"),
        ],
    ];
    sys::table(out, &["since the drain began", ""], &rows);
    Ok(())
}

/// The log of the joiner's flock agent(s), from the node's `/var/log/pods`.
fn agent_log_on_disk() -> String {
    let dir = node::dir(&JOINER).join("host/var-log-pods");
    let mut text = String::new();
    for pod in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let name = pod.file_name().to_string_lossy().into_owned();
        if !name.starts_with("kube-system_flock-") || name.starts_with("kube-system_flock-bird-") {
            continue;
        }
        for log in std::fs::read_dir(pod.path().join("agent"))
            .into_iter()
            .flatten()
            .flatten()
        {
            text.push_str(&std::fs::read_to_string(log.path()).unwrap_or_default());
        }
    }
    text
}
