//! `cargo xtask cluster life [upgrade] [reboot] [startup]`: what a real cluster goes
//! through, against the cluster that is up, each with its figures and its goal.
//!
//! - **upgrade**: a rolling update of flock's DaemonSet while a pod on each node pings the
//!   other every 50 ms over both families and GETs the Service every 50 ms, and `web` is
//!   scaled up and down. Goal: no lost ping, no failed GET, no failed pod creation, no pod
//!   whose address changed.
//! - **ready**: flock's CNI STATUS as the node's `Ready` condition (containerd 2 calls it):
//!   the agent crashed, stopped, and its pool exhausted, each timed to the kubelet's condition
//!   and back (see [`ready`]).
//! - **routing**: the BGP session options on the cluster (see [`routing`]): a BIRD killed
//!   under ping (graceful restart: no loss), a BIRD frozen (BFD: routes withdrawn in under a
//!   second), the agent's RBAC on Secrets.
//! - **services**: Service addresses over BGP: a LoadBalancer Service's addresses at the router
//!   through every node, then only through the nodes with an endpoint (see [`services`]).
//! - **reboot**: one node powered off (every process killed at once, `/run` emptied, its
//!   network namespace deleted) and booted again. Goal: its agent releases what it held at
//!   start-up, its pods come back with addresses, the router relearns its routes, and no
//!   allocation or interface is left behind.
//! - **reboot**, again, with the node's Node object deleted while it is off, for longer than
//!   the agents' leak grace period (its pods are gone from the API when it boots). Goal: its
//!   NodeConfig and prefixes are the same after (its status still held allocations, so the
//!   pool controller kept them), nothing of before comes back on it, and its allocations
//!   are exactly the pods it runs now.
//! - **join**: a third node joins a rack of its own, and the pool controller's leader is
//!   killed in the middle of a wave of new nodes (see [`join`]).
//! - **leave**: the third node joins, then leaves: drained, stopped, its Node deleted; its
//!   allocations released past the leak grace and its NodeConfig deleted.
//! - **policy**: NetworkPolicy changes to enforcement in a node's nftables, p50/p99, with 100
//!   isolated pods, and the agents' memory with 10,000 pods and 1,000 policies in the
//!   cluster (see [`policy`]).
//! - **startup**: a Deployment scaled from 0 to 50 pods on one node with flock, then on the
//!   other with the reference `ptp` + `host-local` plugins (a conflist put first for the
//!   run): time to all Ready, and each pod's `RunPodSandbox` from containerd's log.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

mod join;
mod policy;
mod ready;
mod routing;
mod services;
mod uninstall;

pub use uninstall::uninstall;

use super::deploy::DEMO_NS;
use super::proc::{self, Place};
use super::{NODES, Node, ROUTER, RUN_DIR, kube, kubectl, kubectl_stdin, node};
use crate::sys;

/// The ping and GET interval of the upgrade's probes.
const PROBE_INTERVAL: &str = "0.05";
/// Every life test, in the order they run.
pub const ALL: &[&str] = &[
    "upgrade", "ready", "routing", "services", "reboot", "join", "leave", "startup", "policy",
];
/// Pods per node in the start-up run.
const BURST: usize = 50;

/// `cargo xtask cluster life ARGS…`.
pub fn run(args: &[String]) -> Result<()> {
    sys::require_root("cargo xtask cluster life")?;
    if !Path::new(RUN_DIR).exists() {
        bail!("no cluster is up: `cargo xtask cluster up` first");
    }
    let mut which: Vec<&str> = Vec::new();
    for a in args {
        match a.as_str() {
            a if ALL.contains(&a) => which.push(a),
            "uninstall" => {
                let mut out = String::new();
                let failures = uninstall(&mut out, &crate::lab::debug_bins())?;
                print!("{out}");
                if !failures.is_empty() {
                    bail!("uninstall failed:\n  {}", failures.join("\n  "));
                }
                return Ok(());
            }
            other => bail!("unknown life test {other:?} ({})", ALL.join(", ")),
        }
    }
    if which.is_empty() {
        which = ALL.to_vec();
    }
    let mut out = String::new();
    let failures = tests(&which, &mut out);
    print!("{out}");
    if failures.is_empty() {
        Ok(())
    } else {
        bail!("life tests failed:\n  {}", failures.join("\n  "))
    }
}

/// Runs the named tests, their tables into `out`; returns what missed its goal.
pub fn tests(which: &[&str], out: &mut String) -> Vec<String> {
    let mut failures = Vec::new();
    for name in which {
        let t = Instant::now();
        eprintln!("cluster: life: {name} …");
        let result = match *name {
            "upgrade" => upgrade(out),
            "reboot" => reboot(out, &NODES[1], false).and_then(|mut f| {
                f.extend(reboot(out, &NODES[1], true)?);
                Ok(f)
            }),
            "join" => join::join(out),
            "leave" => join::leave_after_join(out),
            "ready" => ready::ready(out),
            "policy" => policy::policy(out),
            "services" => services::services(out),
            "routing" => routing::routing(out),
            "startup" => startup(out),
            _ => Ok(vec![format!("no life test {name:?}")]),
        };
        match result {
            Ok(f) => failures.extend(f.into_iter().map(|f| format!("{name}: {f}"))),
            Err(e) => failures.push(format!("{name}: {e:#}")),
        }
        eprintln!(
            "cluster: life: {name}: done in {:.1} s",
            t.elapsed().as_secs_f64()
        );
    }
    failures
}

/// One pod of the demo namespace, as the report needs it.
#[derive(Clone, Debug)]
struct PodView {
    name: String,
    node: String,
    ips: Vec<String>,
    ready: bool,
    /// When its containers last started (the earliest of them; RFC 3339, seconds).
    started: Option<String>,
}

fn pods(namespace: &str, selector: &str) -> Result<Vec<PodView>> {
    let v: Value = serde_json::from_str(&kubectl(&[
        "-n", namespace, "get", "pods", "-l", selector, "-o", "json",
    ])?)
    .context("parse kubectl get pods")?;
    Ok(v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| !p["metadata"]["deletionTimestamp"].is_string())
        .map(|p| PodView {
            name: p["metadata"]["name"].as_str().unwrap_or("?").to_owned(),
            node: p["spec"]["nodeName"].as_str().unwrap_or("").to_owned(),
            ips: p["status"]["podIPs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|ip| ip["ip"].as_str().map(str::to_owned))
                .collect(),
            ready: p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True"),
            started: p["status"]["containerStatuses"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| {
                    c["state"]["running"]["startedAt"]
                        .as_str()
                        .map(str::to_owned)
                })
                .collect::<Option<Vec<String>>>()
                .and_then(|t| t.into_iter().min()),
        })
        .collect())
}

fn exec(pod: &str, script: &str) -> Result<String> {
    kubectl(&["-n", DEMO_NS, "exec", pod, "--", "sh", "-c", script])
}

/// `FailedCreatePodSandBox` events newer than the cluster's `since` (RFC 3339, seconds).
fn sandbox_failures_since(since: &str) -> Result<Vec<String>> {
    let v: Value = serde_json::from_str(&kubectl(&[
        "get",
        "events",
        "-A",
        "--field-selector",
        "reason=FailedCreatePodSandBox",
        "-o",
        "json",
    ])?)
    .context("parse events")?;
    Ok(v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| {
            e["lastTimestamp"]
                .as_str()
                .or(e["eventTime"].as_str())
                .is_some_and(|t| t >= since)
        })
        .map(|e| {
            format!(
                "{}: {}",
                e["involvedObject"]["name"].as_str().unwrap_or("?"),
                e["message"].as_str().unwrap_or("")
            )
        })
        .collect())
}

/// The apiserver's clock, RFC 3339 to the second (what events are stamped with).
fn cluster_now() -> Result<String> {
    let out = Place::Net(super::CONTROL.to_owned()).run(&["date", "-u", "+%Y-%m-%dT%H:%M:%SZ"])?;
    Ok(out.trim().to_owned())
}

// ---------------------------------------------------------------------------------------
// upgrade

/// The probe each pinger pod runs in the background until `/tmp/life.stop` exists: a ping
/// to each address of its peer, and a GET of the Service, every 50 ms.
fn probe_script(peer: &[String], service: &str) -> String {
    let mut s = String::from(
        "rm -f /tmp/life.*; \
         http() { printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 2 \"$1\" 80 2>/dev/null | tail -n 1; }; ",
    );
    for (i, addr) in peer.iter().enumerate() {
        let _ = write!(
            s,
            "ping -i {PROBE_INTERVAL} {addr} > /tmp/life.ping{i} 2>&1 & echo $! >> /tmp/life.pids; "
        );
    }
    let _ = write!(
        s,
        "( ok=0; bad=0; while [ ! -e /tmp/life.stop ]; do \
             b=$(http {service}); if [ -n \"$b\" ]; then ok=$((ok+1)); else bad=$((bad+1)); fi; \
             sleep {PROBE_INTERVAL}; done; echo \"$ok $bad\" > /tmp/life.http ) \
         > /dev/null 2>&1 &"
    );
    s
}

/// What a probe counted: per peer address (pings sent, received), and (GETs ok, failed).
type ProbeCounts = (Vec<(u64, u64)>, (u64, u64));

/// Stops the probe and returns its counts.
fn stop_probe(pod: &str, peers: usize) -> Result<ProbeCounts> {
    exec(
        pod,
        "touch /tmp/life.stop; kill -INT $(cat /tmp/life.pids); \
         for i in 1 2 3 4 5 6 7 8 9 10; do [ -e /tmp/life.http ] && break; sleep 0.5; done",
    )?;
    let mut pings = Vec::new();
    for i in 0..peers {
        let text = exec(pod, &format!("cat /tmp/life.ping{i}"))?;
        pings.push(
            ping_counts(&text)
                .with_context(|| format!("no ping statistics from {pod} (ping {i}): {text:?}"))?,
        );
    }
    let http = exec(pod, "cat /tmp/life.http")?;
    let mut it = http.split_whitespace().map(str::parse::<u64>);
    let (Some(Ok(ok)), Some(Ok(bad))) = (it.next(), it.next()) else {
        bail!("no GET counts from {pod}: {http:?}");
    };
    Ok((pings, (ok, bad)))
}

/// (transmitted, received) from ping's statistics line.
fn ping_counts(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().find(|l| l.contains("packets transmitted"))?;
    let mut numbers = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .map(str::parse::<u64>);
    let transmitted = numbers.next()?.ok()?;
    let received = numbers.next()?.ok()?;
    // The probe ends ping with SIGINT, and ping counts a request still in flight then as
    // lost. One request after the last reply is that one, not a loss; more are losses.
    let replies: std::collections::BTreeSet<u64> = text
        .lines()
        .filter(|l| !l.contains("DUP!"))
        .filter_map(|l| l.split("seq=").nth(1))
        .filter_map(|rest| {
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect();
    let Some(last) = replies.last() else {
        // Quiet (`-q`) or no reply at all: the statistics line is all there is.
        return Some((transmitted, received));
    };
    let sent = if transmitted == last + 2 {
        last + 1
    } else {
        transmitted
    };
    Some((sent, replies.len() as u64))
}

fn upgrade(out: &mut String) -> Result<Vec<String>> {
    let mut failures = Vec::new();
    let pingers = pods(DEMO_NS, "app=anycast")?;
    let [a, b] = pingers.as_slice() else {
        bail!("want one anycast pod per node, found {}", pingers.len());
    };
    let service = kubectl(&[
        "-n",
        DEMO_NS,
        "get",
        "service",
        "web",
        "-o",
        "jsonpath={.spec.clusterIP}",
    ])?
    .trim()
    .to_owned();
    let before: BTreeMap<String, Vec<String>> = pods(DEMO_NS, "app in (web, anycast)")?
        .into_iter()
        .map(|p| (p.name, p.ips))
        .collect();
    let agents_before: Vec<String> = pods("kube-system", "app.kubernetes.io/name=flock")?
        .into_iter()
        .map(|p| p.name)
        .collect();
    let since = cluster_now()?;
    for (from, to) in [(a, b), (b, a)] {
        exec(&from.name, &probe_script(&to.ips, &service))
            .with_context(|| format!("start the probe in {}", from.name))?;
    }
    // Let the probes run before the update starts, so a loss at its start would show.
    std::thread::sleep(Duration::from_secs(2));

    let t = Instant::now();
    kubectl(&[
        "-n",
        "kube-system",
        "set",
        "env",
        "daemonset/flock",
        "-c",
        "agent",
        &format!("FLOCK_ROLLOUT_MARK={}", since.replace(':', "")),
    ])?;
    // Pods come and go while the agents are replaced, one node after the other.
    let scaling = std::thread::spawn(|| -> Result<()> {
        super::deploy::scale_web(super::deploy::WEB_REPLICAS * 2, Duration::from_secs(180))?;
        super::deploy::scale_web(super::deploy::WEB_REPLICAS, Duration::from_secs(180))?;
        Ok(())
    });
    let rollout = kubectl(&[
        "-n",
        "kube-system",
        "rollout",
        "status",
        "daemonset/flock",
        "--timeout=300s",
    ]);
    let rollout_took = t.elapsed();
    let scaled = scaling
        .join()
        .unwrap_or_else(|_| Err(anyhow::anyhow!("the scaling thread panicked")));
    let scale_up_down = t.elapsed();
    std::thread::sleep(Duration::from_secs(2));
    let mut rows = Vec::new();
    for (from, to) in [(a, b), (b, a)] {
        let (pings, (ok, bad)) = stop_probe(&from.name, to.ips.len())?;
        for (addr, (sent, got)) in to.ips.iter().zip(&pings) {
            let lost = sent.saturating_sub(*got);
            if lost > 0 {
                failures.push(format!(
                    "{} -> {addr}: {lost} of {sent} pings lost",
                    from.name
                ));
            }
            rows.push(vec![
                format!("{} ({})", from.name, from.node),
                format!("ping {addr}"),
                sent.to_string(),
                lost.to_string(),
            ]);
        }
        if bad > 0 {
            failures.push(format!(
                "{} -> Service {service}: {bad} of {} GETs failed",
                from.name,
                ok + bad
            ));
        }
        rows.push(vec![
            format!("{} ({})", from.name, from.node),
            format!("GET Service {service}"),
            (ok + bad).to_string(),
            bad.to_string(),
        ]);
    }
    rollout.context("the DaemonSet's rollout did not complete")?;
    scaled.context("web's scaling during the rollout")?;
    let agents_after: Vec<String> = pods("kube-system", "app.kubernetes.io/name=flock")?
        .into_iter()
        .map(|p| p.name)
        .collect();
    if agents_after.iter().any(|n| agents_before.contains(n)) {
        failures.push(format!(
            "the rollout replaced no agent pod: before {agents_before:?}, after {agents_after:?}"
        ));
    }
    let after = pods(DEMO_NS, "app in (web, anycast)")?;
    let changed: Vec<String> = after
        .iter()
        .filter_map(|p| {
            let was = before.get(&p.name)?;
            (was != &p.ips).then(|| format!("{}: {was:?} -> {:?}", p.name, p.ips))
        })
        .collect();
    let kept = after
        .iter()
        .filter(|p| before.contains_key(&p.name))
        .count();
    let creations = sandbox_failures_since(&since)?;
    if !changed.is_empty() {
        failures.push(format!("addresses changed: {}", changed.join("; ")));
    }
    if !creations.is_empty() {
        failures.push(format!("failed pod creations: {}", creations.join("; ")));
    }

    let _ = writeln!(
        out,
        "UPGRADE (rolling update of daemonset/flock: agents {} -> {}; web scaled {} -> {} -> {} meanwhile; probes every {PROBE_INTERVAL} s)",
        agents_before.join(" "),
        agents_after.join(" "),
        super::deploy::WEB_REPLICAS,
        super::deploy::WEB_REPLICAS * 2,
        super::deploy::WEB_REPLICAS
    );
    sys::table(out, &["from", "probe", "sent", "lost"], &rows);
    let summary = vec![
        vec![
            "rollout complete after".to_owned(),
            format!("{:.1} s", rollout_took.as_secs_f64()),
        ],
        vec![
            "scale up and down done after".to_owned(),
            format!("{:.1} s", scale_up_down.as_secs_f64()),
        ],
        vec![
            "failed pod creations (FailedCreatePodSandBox)".to_owned(),
            creations.len().to_string(),
        ],
        vec![
            "pods whose address changed".to_owned(),
            format!("{} of {kept} that lived through it", changed.len()),
        ],
    ];
    sys::table(out, &["", ""], &summary);
    out.push('\n');
    Ok(failures)
}

// ---------------------------------------------------------------------------------------
// reboot

/// What flock holds on a node: its NodeConfig's allocation counts and its host veths.
fn holdings(n: &Node) -> (String, usize) {
    let counts = kubectl(&[
        "get",
        "nodeconfig",
        n.name,
        "-o",
        "jsonpath={.status.allocated6}/{.status.allocated4}",
    ])
    .map(|s| s.trim().to_owned())
    .unwrap_or_else(|e| format!("? ({e:#})"));
    let veths = Place::Net(n.ns())
        .run(&["ip", "-o", "link", "show", "type", "veth"])
        .map(|o| o.lines().filter(|l| l.contains(": flock")).count())
        .unwrap_or(0);
    (counts, veths)
}

/// The router's BGP routes through `n`.
fn router_routes(n: &Node) -> Vec<String> {
    let router = Place::Net(ROUTER.to_owned());
    let mut routes = Vec::new();
    for family in ["-6", "-4"] {
        let text = router
            .run(&["ip", family, "route", "show", "proto", "bird"])
            .unwrap_or_default();
        // A multipath route spans lines: a prefix line, then its "nexthop" lines.
        let mut current = String::new();
        for line in text.lines() {
            if !line.starts_with([' ', '\t']) {
                current = line.split_whitespace().next().unwrap_or("").to_owned();
            }
            if line.contains(n.addr) {
                routes.push(current.clone());
            }
        }
    }
    routes.dedup();
    routes
}

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
fn reboot(out: &mut String, n: &Node, forgotten: bool) -> Result<Vec<String>> {
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
        let grace = parse_seconds(join::LEAK_GRACE);
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
                join::LEAK_GRACE
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

/// Waits (up to 150 s) until the API has no pod bound to node `name`: after its Node is
/// deleted, the pod garbage collector removes them.
fn wait_pods_unbound(name: &str) -> Result<()> {
    sys::wait_for(Duration::from_secs(150), || {
        kubectl(&[
            "get",
            "pods",
            "-A",
            "--field-selector",
            &format!("spec.nodeName={name}"),
            "-o",
            "name",
        ])
        .is_ok_and(|p| p.trim().is_empty())
    })
}

/// `n`'s NodeConfig's CIDRs.
fn node_config(n: &Node) -> String {
    kubectl(&[
        "get",
        "nodeconfig",
        n.name,
        "-o",
        "jsonpath={.spec.cidr6} {.spec.cidr4}",
    ])
    .map(|s| s.trim().to_owned())
    .unwrap_or_else(|e| format!("? ({e:#})"))
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

/// The reference plugins' conflist for the comparison: `ptp` with `host-local`, both
/// families, addresses from a corner of the node's own CIDRs (so the router's routes to the
/// node reach them). Named to sort before flock's, so containerd takes it while it is there.
fn ptp_conflist(n: &Node) -> String {
    let (v6, v4) = ptp_ranges(n);
    format!(
        r#"{{"cniVersion":"1.0.0","name":"ptp-comparison","plugins":[{{"type":"ptp","ipMasq":false,
"ipam":{{"type":"host-local","ranges":[[{{"subnet":"{v6}"}}],[{{"subnet":"{v4}"}}]],
"routes":[{{"dst":"::/0"}},{{"dst":"0.0.0.0/0"}}]}}}}]}}"#
    )
}

/// The ranges `host-local` gives out in the comparison: the last /80 of the node's IPv6 /64
/// and the last /26 of its IPv4 /24.
fn ptp_ranges(n: &Node) -> (String, String) {
    let v6: ipnet::Ipv6Net = n.cidr6.parse().expect("node cidr6");
    let v4: ipnet::Ipv4Net = n.cidr4.parse().expect("node cidr4");
    let v6 = v6
        .subnets(80)
        .expect("a /64 has /80s")
        .last()
        .expect("at least one /80");
    let v4 = v4
        .subnets(26)
        .expect("a /24 has /26s")
        .last()
        .expect("at least one /26");
    (v6.to_string(), v4.to_string())
}

const PTP_CONFLIST: &str = "00-ptp-comparison.conflist";

fn burst_manifest(name: &str, n: &Node) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata: {{ name: {name}, namespace: {DEMO_NS} }}
spec:
  replicas: 0
  selector: {{ matchLabels: {{ app: {name} }} }}
  template:
    metadata:
      labels: {{ app: {name} }}
    spec:
      nodeName: {node}
      terminationGracePeriodSeconds: 0
      dnsPolicy: Default
      enableServiceLinks: false
      automountServiceAccountToken: false
      containers:
        - name: net
          image: {image}
          imagePullPolicy: Never
",
        node = n.name,
        image = super::images::NET
    )
}

/// One run: `name` scaled 0 -> [`BURST`] on `n`; (time to all Ready, per-pod RunPodSandbox
/// durations from containerd's log, the pods' addresses).
fn burst(name: &str, n: &Node) -> Result<(Duration, Vec<Duration>, Vec<PodView>)> {
    kubectl_stdin(&["apply", "-f", "-"], &burst_manifest(name, n))?;
    let t = Instant::now();
    kubectl(&[
        "-n",
        DEMO_NS,
        "scale",
        &format!("deployment/{name}"),
        &format!("--replicas={BURST}"),
    ])?;
    let mut last = Vec::new();
    sys::wait_for(Duration::from_secs(300), || {
        last = pods(DEMO_NS, &format!("app={name}")).unwrap_or_default();
        last.len() == BURST && last.iter().all(|p| p.ready)
    })
    .with_context(|| {
        format!(
            "{name}: {} of {BURST} pods Ready after 300 s",
            last.iter().filter(|p| p.ready).count()
        )
    })?;
    let took = t.elapsed();
    let log = std::fs::read_to_string(proc::log_path(&format!("{}-containerd", n.name)))
        .context("read containerd's log")?;
    let sandboxes = run_pod_sandbox_durations(&log, &format!("{name}-"));
    // Gone again (the DELs through the same plugin), before anything else changes.
    kubectl(&["-n", DEMO_NS, "delete", "deployment", name, "--wait=true"])?;
    sys::wait_for(Duration::from_secs(120), || {
        pods(DEMO_NS, &format!("app={name}")).is_ok_and(|p| p.is_empty())
    })
    .with_context(|| format!("{name}'s pods are not gone"))?;
    Ok((took, sandboxes, last))
}

/// Per pod whose name starts with `prefix`: the time from containerd's "RunPodSandbox for"
/// to its "returns sandbox id" (the sandbox's creation, CNI ADD included).
fn run_pod_sandbox_durations(log: &str, prefix: &str) -> Vec<Duration> {
    let mut started: BTreeMap<String, f64> = BTreeMap::new();
    let mut out = Vec::new();
    for line in log.lines() {
        // containerd 2: `RunPodSandbox for name:\"POD\"  uid:…`; 1.x:
        // `RunPodSandbox for &PodSandboxMetadata{Name:POD,…`.
        let pod = if let Some(rest) = line.split("RunPodSandbox for name:\\\"").nth(1) {
            rest.split("\\\"").next()
        } else if let Some(rest) = line
            .split("RunPodSandbox for &PodSandboxMetadata{Name:")
            .nth(1)
        {
            rest.split(',').next()
        } else {
            continue;
        };
        let Some(pod) = pod else {
            continue;
        };
        if !pod.starts_with(prefix) {
            continue;
        }
        let Some(at) = log_time(line) else {
            continue;
        };
        if line.contains("returns sandbox id") {
            if let Some(from) = started.remove(pod) {
                out.push(Duration::from_secs_f64((at - from).max(0.0)));
            }
        } else {
            started.insert(pod.to_owned(), at);
        }
    }
    out.sort();
    out
}

/// Seconds since the epoch of a containerd log line's `time="2026-11-23T12:00:00.123456789Z"`.
fn log_time(line: &str) -> Option<f64> {
    let t = line.split("time=\"").nth(1)?.split('"').next()?;
    let (date, clock) = t.trim_end_matches('Z').split_once('T')?;
    let mut d = date.split('-').map(str::parse::<i64>);
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let mut c = clock.splitn(3, ':');
    let (h, min) = (
        c.next()?.parse::<f64>().ok()?,
        c.next()?.parse::<f64>().ok()?,
    );
    let s: f64 = c.next()?.parse().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days as f64 * 86_400.0 + h * 3600.0 + min * 60.0 + s)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn startup(out: &mut String) -> Result<Vec<String>> {
    let mut failures = Vec::new();
    let (flock_node, ptp_node) = (&NODES[0], &NODES[1]);
    let (took_flock, sb_flock, pods_flock) = burst("burst-flock", flock_node)?;

    // The reference plugins, put first on the other node for the run.
    let host = node::dir(ptp_node).join("host");
    let kube = kube::ensure_built()?;
    for plugin in ["ptp", "host-local"] {
        let to = host.join("opt-cni-bin").join(plugin);
        std::fs::copy(kube.cni_plugin(plugin), &to)
            .with_context(|| format!("copy {plugin} to {}", to.display()))?;
    }
    let conflist = host.join("etc-cni-net.d").join(PTP_CONFLIST);
    std::fs::write(&conflist, ptp_conflist(ptp_node))
        .with_context(|| format!("write {}", conflist.display()))?;
    // containerd watches its CNI directory; give it a moment to load the new first file.
    std::thread::sleep(Duration::from_secs(2));
    let ptp = burst("burst-ptp", ptp_node);
    let removed = std::fs::remove_file(&conflist);
    let (took_ptp, sb_ptp, pods_ptp) = ptp?;
    removed.with_context(|| format!("remove {}", conflist.display()))?;

    let (v6, _) = ptp_ranges(ptp_node);
    let v6: ipnet::Ipv6Net = v6.parse().expect("the range just made");
    let ptp_addressed = pods_ptp
        .iter()
        .filter(|p| {
            p.ips.iter().any(|ip| {
                ip.parse()
                    .is_ok_and(|a: std::net::Ipv6Addr| v6.contains(&a))
            })
        })
        .count();
    if ptp_addressed != pods_ptp.len() {
        failures.push(format!(
            "{} of {} ptp pods have an address from host-local's range {v6}: containerd did \
             not take the ptp conflist",
            ptp_addressed,
            pods_ptp.len()
        ));
    }
    if pods_flock.iter().any(|p| p.ips.len() != 2) {
        failures.push("a flock pod of the burst lacks an address".to_owned());
    }
    for (what, sb) in [("flock", &sb_flock), ("ptp", &sb_ptp)] {
        if sb.len() != BURST {
            failures.push(format!(
                "{what}: {} RunPodSandbox pairs in containerd's log for {BURST} pods",
                sb.len()
            ));
        }
    }
    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1000.0);
    let _ = writeln!(
        out,
        "POD START-UP AT SCALE (a Deployment scaled 0 -> {BURST} on one node; RunPodSandbox from containerd's log)"
    );
    let rows: Vec<Vec<String>> = [
        ("flock", flock_node, took_flock, &sb_flock),
        ("ptp + host-local", ptp_node, took_ptp, &sb_ptp),
    ]
    .into_iter()
    .map(|(what, n, took, sb)| {
        vec![
            what.to_owned(),
            n.name.to_owned(),
            format!("{:.1} s", took.as_secs_f64()),
            ms(percentile(sb, 0.5)),
            ms(percentile(sb, 0.99)),
        ]
    })
    .collect();
    sys::table(
        out,
        &[
            "plugin",
            "node",
            "all Ready after",
            "sandbox p50",
            "sandbox p99",
        ],
        &rows,
    );
    out.push('\n');
    Ok(failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ping_statistics() {
        let reply = |seq: u64| format!("64 bytes from x: seq={seq} ttl=62 time=0.1 ms\n");
        let stats = |sent: u64, got: u64| {
            format!(
                "--- x ping statistics ---\n{sent} packets transmitted, {got} packets received\n"
            )
        };
        // seq 2 lost, seq 5 in flight when ping was stopped: not a loss.
        let text: String = [0, 1, 3, 4].map(reply).concat() + &stats(6, 4);
        assert_eq!(ping_counts(&text), Some((5, 4)));
        // Two after the last reply: the path was gone at the end, both lost.
        let text: String = [0, 1].map(reply).concat() + &stats(4, 2);
        assert_eq!(ping_counts(&text), Some((4, 2)));
        // A duplicate counts once; no reply at all is every request lost.
        let text = reply(0) + &reply(0).replace("ms", "ms (DUP!)") + &stats(1, 1);
        assert_eq!(ping_counts(&text), Some((1, 1)));
        assert_eq!(ping_counts(&stats(3, 0)), Some((3, 0)));
        // Quiet: the statistics line.
        assert_eq!(ping_counts(&stats(120, 118)), Some((120, 118)));
        assert_eq!(ping_counts("ping: sendto: Network unreachable"), None);
    }

    #[test]
    fn sandbox_durations_pair_start_and_return_per_pod() {
        let log = r#"time="2026-11-23T12:00:00.100000000Z" level=info msg="RunPodSandbox for &PodSandboxMetadata{Name:burst-flock-a,Uid:1,Namespace:demo,Attempt:0,}"
time="2026-11-23T12:00:00.200000000Z" level=info msg="RunPodSandbox for &PodSandboxMetadata{Name:other-b,Uid:2,Namespace:demo,Attempt:0,}"
time="2026-11-23T12:00:00.350000000Z" level=info msg="RunPodSandbox for &PodSandboxMetadata{Name:burst-flock-a,Uid:1,Namespace:demo,Attempt:0,} returns sandbox id \"abc\""
time="2026-11-23T12:00:01.000000000Z" level=info msg="RunPodSandbox for &PodSandboxMetadata{Name:other-b,Uid:2,Namespace:demo,Attempt:0,} returns sandbox id \"def\""
"#;
        let d = run_pod_sandbox_durations(log, "burst-flock-");
        assert_eq!(d.len(), 1);
        assert!((d[0].as_secs_f64() - 0.25).abs() < 1e-6, "{d:?}");
    }

    #[test]
    fn sandbox_durations_read_containerd_2s_log() {
        let log = r#"time="2026-11-25T19:52:14.457339038Z" level=info msg="RunPodSandbox for name:\"burst-flock-a\"  uid:\"7475\"  namespace:\"demo\""
time="2026-11-25T19:52:14.500000000Z" level=info msg="RunPodSandbox for name:\"other-b\"  uid:\"1\"  namespace:\"demo\""
time="2026-11-25T19:52:15.000000000Z" level=info msg="RunPodSandbox for name:\"burst-flock-a\"  uid:\"7475\"  namespace:\"demo\" returns sandbox id \"b83c\""
"#;
        let d = run_pod_sandbox_durations(log, "burst-flock-");
        assert_eq!(d.len(), 1, "{d:?}");
        assert!((d[0].as_secs_f64() - 0.542660962).abs() < 1e-6, "{d:?}");
    }

    #[test]
    fn log_time_is_seconds_since_the_epoch() {
        let t = log_time(r#"time="1970-01-02T00:00:01.5Z" level=info"#).unwrap();
        assert!((t - 86_401.5).abs() < 1e-6);
        let t = log_time(r#"time="2000-03-01T00:00:00Z""#).unwrap();
        assert!((t - 951_868_800.0).abs() < 1e-6);
    }

    #[test]
    fn ptp_ranges_are_corners_of_the_node_cidrs() {
        let (v6, v4) = ptp_ranges(&NODES[1]);
        assert_eq!(v6, "2001:db8:c2:0:ffff::/80");
        assert_eq!(v4, "10.201.2.192/26");
    }
}
