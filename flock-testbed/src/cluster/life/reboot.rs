//! `life reboot`: a node powered off and booted again, once with its Node object kept and
//! once with it deleted while the node is off.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::super::deploy::DEMO_NS;
use super::super::{Node, kube, kubectl, node};
use super::{PodView, cluster_now, holdings, node_config, pods, router_routes, wait_pods_unbound};
use crate::sys;

/// Waits until every demo pod on `n` is Ready with both addresses, its containers started
/// at or after `since` (the cluster's clock; after a reboot the apiserver shows the pods of
/// before as Ready until the kubelet reports again).
fn wait_node_pods(n: &Node, since: &str, limit: Duration) -> Result<Vec<PodView>> {
    let mut last = Vec::new();
    let done = sys::wait_for(limit, || {
        last = pods(DEMO_NS, "app in (web, anycast)")
            .unwrap_or_default()
            .into_iter()
            .filter(|p| p.node == n.name)
            .collect();
        !last.is_empty()
            && last.iter().all(|p| {
                p.ready && p.ips.len() == 2 && p.started.as_deref().is_some_and(|t| t >= since)
            })
    });
    done.with_context(|| {
        format!(
            "{}'s pods are not all Ready with two addresses, started since {since}: {:?}",
            n.name,
            last.iter()
                .map(|p| format!(
                    "{} ready={} {:?} started {:?}",
                    p.name, p.ready, p.ips, p.started
                ))
                .collect::<Vec<_>>()
        )
    })?;
    Ok(last)
}

/// Reboots `n`; `forgotten`: its Node is deleted while it is off, and stays deleted for longer
/// than the agents' leak grace period.
pub(super) fn reboot(out: &mut String, n: &Node, forgotten: bool) -> Result<Vec<String>> {
    let mut failures = Vec::new();
    let kube = kube::ensure_built()?;
    let pods_before = wait_node_pods(n, "", Duration::from_secs(60))?;
    // The agent writes its status at most every 10 s: after the churn of an earlier test the
    // counts catch up with the node's veths (one allocation of each family per pod) first.
    let (mut held_before, mut veths_before) = holdings(n);
    let _ = sys::wait_for(Duration::from_secs(30), || {
        (held_before, veths_before) = holdings(n);
        held_before == format!("{veths_before}/{veths_before}")
    });
    let routes_before = router_routes(n);
    let config_before = node_config(n);

    let off_at = cluster_now()?;
    let t = Instant::now();
    let killed = node::power_off(n)?;
    // The router notices the session (and the link) gone.
    std::thread::sleep(Duration::from_secs(2));
    let routes_off = router_routes(n);
    let mut forgotten_for = Duration::ZERO;
    if forgotten {
        kubectl(&["delete", "node", n.name])?;
        let deleted = Instant::now();
        // The pod garbage collector deletes the pods bound to a Node that is gone.
        wait_pods_unbound(n.name)
            .with_context(|| format!("the pods bound to {} outlived its Node", n.name))?;
        let grace = parse_seconds(super::LEAK_GRACE);
        std::thread::sleep(grace.saturating_sub(deleted.elapsed()) + Duration::from_secs(5));
        forgotten_for = deleted.elapsed();
        // The pool controller kept its NodeConfig: its status still holds the allocations.
        if node_config(n) != config_before {
            failures.push(format!(
                "{}'s NodeConfig changed while its Node was deleted: {:?}, was {config_before:?}",
                n.name,
                node_config(n)
            ));
        }
    }
    node::boot(n, &kube).with_context(|| format!("boot {} again", n.name))?;
    let booted = t.elapsed();
    let pods_after = wait_node_pods(n, &off_at, Duration::from_secs(180))?;
    let all_back = t.elapsed();
    if forgotten && node_config(n) != config_before {
        failures.push(format!(
            "{} came back with NodeConfig {:?}, had {config_before:?}",
            n.name,
            node_config(n)
        ));
    }
    let mut routes_after = Vec::new();
    let relearned = sys::wait_for(Duration::from_secs(60), || {
        routes_after = router_routes(n);
        routes_after == routes_before
    });
    let routes_back = t.elapsed();
    if relearned.is_err() {
        failures.push(format!(
            "the router's routes through {} are {routes_after:?}, were {routes_before:?}",
            n.name
        ));
    }
    // The agent writes its status at most every 10 s; the counts settle after that. A node
    // that was forgotten comes back with its DaemonSets' pods only (the Deployment's went to
    // the other node): one allocation of each family and one veth per pod.
    let (held_want, veths_want) = if forgotten {
        (format!("{0}/{0}", pods_after.len()), pods_after.len())
    } else {
        (held_before.clone(), veths_before)
    };
    let mut held_after = String::new();
    let mut veths_after = 0;
    let settled = sys::wait_for(Duration::from_secs(30), || {
        (held_after, veths_after) = holdings(n);
        held_after == held_want && veths_after == veths_want
    });
    if settled.is_err() {
        failures.push(format!(
            "after the reboot {} holds {held_after} allocations and {veths_after} veths for {} pods, \
             want {held_want} and {veths_want}",
            n.name,
            pods_after.len()
        ));
    }
    let agent_log = agent_log_since_boot(n);
    let released = agent_log
        .lines()
        .find(|l| l.contains("start-up reconcile done"))
        .and_then(|l| l.find("StartupReport").map(|i| l[i..].trim().to_owned()))
        .unwrap_or_else(|| "(no start-up report in the agent's log)".to_owned());
    // Every allocation of the node was a pod's that died with it (each has an IPv6 address).
    let held6 = held_before.split('/').next().unwrap_or("?");
    if !released.contains(&format!("released_stale: {held6},")) {
        failures.push(format!(
            "the agent did not release the {held6} allocations of the pods that died: {released}"
        ));
    }

    let _ = writeln!(
        out,
        "REBOOT ({}: {killed} processes killed at once, /run emptied, its network namespace deleted; {}then booted)",
        n.name,
        if forgotten {
            format!(
                "its Node deleted for {:.0} s (leak grace {}), its pods gone from the API; ",
                forgotten_for.as_secs_f64(),
                super::LEAK_GRACE
            )
        } else {
            String::new()
        }
    );
    let rows = vec![
        vec![
            "pods (web, anycast) Ready".to_owned(),
            pods_before.len().to_string(),
            "-".to_owned(),
            pods_after.len().to_string(),
        ],
        vec![
            "allocations IPv6/IPv4 (NodeConfig status)".to_owned(),
            held_before.clone(),
            "-".to_owned(),
            held_after,
        ],
        vec![
            "host veths flock*".to_owned(),
            veths_before.to_string(),
            "0".to_owned(),
            veths_after.to_string(),
        ],
        vec![
            "router's routes via the node".to_owned(),
            routes_before.join(" "),
            if routes_off.is_empty() {
                "none".to_owned()
            } else {
                routes_off.join(" ")
            },
            routes_after.join(" "),
        ],
    ];
    sys::table(out, &["", "before", "powered off", "after"], &rows);
    let timing = vec![
        vec![
            "node booted (containerd, kubelet, kube-proxy up)".to_owned(),
            format!("{:.1} s", booted.as_secs_f64()),
        ],
        vec![
            "every pod Ready again".to_owned(),
            format!("{:.1} s", all_back.as_secs_f64()),
        ],
        vec![
            "router's routes back".to_owned(),
            format!("{:.1} s", routes_back.as_secs_f64()),
        ],
        vec!["agent at start-up".to_owned(), released],
        vec![
            "NodeConfig before and after".to_owned(),
            format!("{config_before} / {}", node_config(n)),
        ],
    ];
    sys::table(out, &["since power off", ""], &timing);
    out.push('\n');
    Ok(failures)
}

/// `20s` → 20 s (the test's own constants).
fn parse_seconds(s: &str) -> Duration {
    Duration::from_secs(s.trim_end_matches('s').parse().unwrap_or(0))
}

/// The log of `n`'s flock agent since it started (the container running now).
fn agent_log_since_boot(n: &Node) -> String {
    let agent = pods("kube-system", "app.kubernetes.io/name=flock")
        .unwrap_or_default()
        .into_iter()
        .find(|p| p.node == n.name);
    agent
        .and_then(|p| kubectl(&["-n", "kube-system", "logs", &p.name, "-c", "agent"]).ok())
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------
// startup
