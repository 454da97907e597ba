//! What `cluster up` checks and prints, section by section. Each section appends a table to
//! the report and a line to the failures for every check that does not hold.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::Value;

use super::cni::{Cni, Policy};
use super::deploy::WEB_REPLICAS;
use super::{ANYCAST4, ANYCAST6, NODES, deploy, kubectl, site};
use crate::sys;

mod apiserver;
mod cni_path;
mod pods;
mod routing;

use apiserver::{apiserver, kubectl_exec};
use cni_path::{annotations_path, sandbox_failures};
pub(crate) use pods::{HTTP_FN, in_prefix};
use pods::{pods_and_matrix, policy_enforced};
use routing::{anycast, router_routes};

/// The printed report and the checks that failed.
pub struct Report {
    /// Tables, as printed.
    pub text: String,
    /// One line per failed check.
    pub failures: Vec<String>,
}

/// How long routes, sessions and statuses may take to settle.
const CONVERGE: Duration = Duration::from_secs(60);
/// The replicas `web` is scaled to for the timing.
const SCALE_TO: usize = 30;

/// One section of the report: its checks and its table.
type Section = fn(&mut Report) -> Result<()>;

/// Runs every check and builds the report: flock's, or a peer CNI's (what holds for any
/// routed pod network: its pods on every node, the router's routes to each node's CIDRs, the
/// matrix, the Service, sandboxes, exec and scaling).
pub fn run() -> Report {
    let mut r = Report {
        text: String::new(),
        failures: Vec::new(),
    };
    let sections: Vec<(&str, Section)> = if Cni::current() == Cni::Flock {
        vec![
            ("nodes", nodes),
            ("flock's pods", flock_pods),
            ("convergence", wait_converged),
            ("NodeConfigs", nodeconfigs),
            ("pods and matrix", pods_and_matrix),
            ("router routes", router_routes),
            ("anycast", anycast),
            ("annotations path", annotations_path),
            ("sandbox failures", sandbox_failures),
            ("flock and the apiserver", apiserver),
            ("kubectl exec", kubectl_exec),
            ("scale", scale),
        ]
    } else {
        let mut peer: Vec<(&str, Section)> = vec![
            ("nodes", nodes),
            ("the peer's pods", peer_pods),
            ("convergence", wait_converged),
            ("pods and matrix", pods_and_matrix),
        ];
        if Cni::current() == Cni::KubeRouter || Policy::current().is_some() {
            peer.push(("NetworkPolicy smoke", policy_enforced));
        }
        peer.extend([
            ("router routes", router_routes as Section),
            ("sandbox failures", sandbox_failures),
            ("kubectl exec", kubectl_exec),
            ("scale", scale),
        ]);
        peer
    };
    for (name, section) in sections {
        if let Err(e) = section(&mut r) {
            r.failures.push(format!("{name}: {e:#}"));
        }
    }
    r
}

/// Appends the timings of `up`.
pub fn timings(out: &mut String, steps: &[(&str, Duration)]) {
    out.push_str("TIMINGS (cluster up)\n");
    let rows: Vec<Vec<String>> = steps
        .iter()
        .map(|(what, d)| vec![(*what).to_owned(), format!("{:.1} s", d.as_secs_f64())])
        .collect();
    sys::table(out, &["step", "took"], &rows);
}

fn raw(r: &mut Report, title: &str, text: &str) {
    let _ = writeln!(r.text, "{title}");
    for line in text.lines() {
        let _ = writeln!(r.text, "{}", line.trim_end());
    }
    r.text.push('\n');
}

/// `kubectl ARGS…` (with `-o json` among them), parsed.
pub(crate) fn json(args: &[&str]) -> Result<Value> {
    let text = kubectl(args)?;
    serde_json::from_str(&text).with_context(|| format!("parse kubectl {}", args.join(" ")))
}

fn nodes(r: &mut Report) -> Result<()> {
    let out = kubectl(&[
        "wait",
        "--for=condition=Ready",
        "node",
        "--all",
        "--timeout=120s",
    ]);
    if let Err(e) = out {
        r.failures.push(format!("nodes not all Ready: {e:#}"));
    }
    raw(
        r,
        "NODES (kubectl get nodes -o wide)",
        &kubectl(&["get", "nodes", "-o", "wide"])?,
    );
    Ok(())
}

fn flock_pods(r: &mut Report) -> Result<()> {
    let pods = json(&[
        "-n",
        "kube-system",
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=flock",
        "-o",
        "json",
    ])?;
    let items = pods["items"].as_array().cloned().unwrap_or_default();
    if items.len() != NODES.len() {
        r.failures.push(format!(
            "{} flock pods, not one per node ({})",
            items.len(),
            NODES.len()
        ));
    }
    for pod in &items {
        let name = pod["metadata"]["name"].as_str().unwrap_or("?");
        let phase = pod["status"]["phase"].as_str().unwrap_or("?");
        let ready = pod["status"]["containerStatuses"]
            .as_array()
            .is_some_and(|cs| !cs.is_empty() && cs.iter().all(|c| c["ready"] == true));
        if phase != "Running" || !ready {
            r.failures.push(format!(
                "flock pod {name} is {phase}, containers ready: {ready}"
            ));
        }
    }
    system_pods(r, "FLOCK'S PODS", "app.kubernetes.io/name=flock")
}

/// The table of the kube-system pods `selector` picks, titled `title` and the command.
fn system_pods(r: &mut Report, title: &str, selector: &str) -> Result<()> {
    let args = [
        "-n",
        "kube-system",
        "get",
        "pods",
        "-l",
        selector,
        "-o",
        "wide",
    ];
    raw(
        r,
        &format!("{title} (kubectl {})", args.join(" ")),
        &kubectl(&args)?,
    );
    Ok(())
}

/// The DaemonSets of a peer's cluster: each with a ready pod on every node.
fn peer_pods(r: &mut Report) -> Result<()> {
    let mut sets = Vec::new();
    if Cni::current() == Cni::KubeRouter {
        sets.push("kube-router");
    }
    if let Some(p) = Policy::current() {
        sets.push(p.as_str());
    }
    for ds in sets {
        let v = json(&["-n", "kube-system", "get", "ds", ds, "-o", "json"])?;
        let ready = v["status"]["numberReady"].as_u64().unwrap_or(0);
        if ready != NODES.len() as u64 {
            r.failures.push(format!(
                "{ds}: {ready} pods ready, not one per node ({})",
                NODES.len()
            ));
        }
        system_pods(r, &ds.to_uppercase(), &format!("k8s-app={ds}"))?;
    }
    Ok(())
}

/// Waits until the router has a session with every node (when the pod network speaks BGP),
/// each node's prefixes, and (flock's) the anycast addresses with one next hop per node.
fn wait_converged(r: &mut Report) -> Result<()> {
    let cni = Cni::current();
    let established = || {
        let s = site::router_sessions();
        s.len() == NODES.len() && s.iter().all(|s| s.info == "Established")
    };
    if cni.speaks_bgp() && sys::wait_for(CONVERGE, established).is_err() {
        r.failures.push(format!(
            "the router's BGP sessions are not all Established: {:?}",
            site::router_sessions()
        ));
    }
    let routes = || {
        NODES
            .iter()
            .all(|n| site::router_paths(n.cidr6) == 1 && site::router_paths(n.cidr4) == 1)
            && (cni != Cni::Flock
                || site::router_paths(&format!("{ANYCAST6}/128")) == NODES.len()
                    && site::router_paths(&format!("{ANYCAST4}/32")) == NODES.len())
    };
    if sys::wait_for(CONVERGE, routes).is_err() {
        r.failures.push(
            "the router lacks a node's pod prefixes or the anycast next hops (see ROUTER ROUTES)"
                .into(),
        );
    }
    Ok(())
}

fn nodeconfigs(r: &mut Report) -> Result<()> {
    // The agent writes the status at most every --status-interval (10 s).
    let settled = || {
        json(&["get", "nodeconfigs", "-o", "json"]).is_ok_and(|v| {
            v["items"].as_array().is_some_and(|items| {
                items.len() == NODES.len()
                    && items.iter().all(|nc| {
                        let s = &nc["status"];
                        s["allocated6"].as_u64().unwrap_or(0) > 0
                            && s["bgp"].as_array().is_some_and(|b| {
                                !b.is_empty() && b.iter().all(|p| p["state"] == "Established")
                            })
                    })
            })
        })
    };
    if sys::wait_for(CONVERGE, settled).is_err() {
        r.failures
            .push("a NodeConfig's status lacks allocations or an Established BGP session".into());
    }
    raw(
        r,
        "NODECONFIGS (kubectl get nodeconfigs -o wide; allocations and BGP state are the agent's status)",
        &kubectl(&["get", "nodeconfigs", "-o", "wide"])?,
    );
    Ok(())
}

fn scale(r: &mut Report) -> Result<()> {
    let up = deploy::scale_web(SCALE_TO, Duration::from_secs(300));
    let back = deploy::scale_web(WEB_REPLICAS, Duration::from_secs(120));
    r.text
        .push_str("SCALE (kubectl scale deployment/web, until every replica is Ready)\n");
    let mut rows = Vec::new();
    match &up {
        Ok(d) => rows.push(vec![
            format!("{WEB_REPLICAS} -> {SCALE_TO}"),
            format!("{:.1} s", d.as_secs_f64()),
        ]),
        Err(e) => {
            r.failures.push(format!("scale to {SCALE_TO}: {e:#}"));
            rows.push(vec![
                format!("{WEB_REPLICAS} -> {SCALE_TO}"),
                "FAILED".into(),
            ]);
        }
    }
    if let Err(e) = &back {
        r.failures
            .push(format!("scale back to {WEB_REPLICAS}: {e:#}"));
    }
    sys::table(&mut r.text, &["replicas", "all Ready after"], &rows);
    Ok(())
}
