//! `cargo xtask cluster life chaos [--minutes N] [--seed S] [--break stray-veth]`: pods
//! churning while faults land at random, from a printed seed, and flock's invariants checked
//! throughout and after.
//!
//! Churn (all the time, every 1-3 s): the Deployment `chaos-web` scaled between 2 and 10, lone
//! pods created on either node and deleted, a NetworkPolicy (allowing all ingress, so that it
//! changes enforcement without cutting anything) and a Service created and deleted.
//!
//! Faults (one at a time, 15-45 s apart): an agent killed (-9), a BIRD killed (-9), the
//! controller's leader killed (-9), the apiserver restarted (killed, started again), a node's
//! containerd restarted likewise (its pods' containers live on), a node rebooted (power cut,
//! `/run` and its network namespace gone, booted again).
//!
//! Invariants:
//! - throughout (every pass): no address on two live pods;
//! - after each fault, once the cluster settles (nodes Ready, flock's pods Ready, the router's
//!   sessions Established), within 30 s: every Ready pod reachable from the prober on the
//!   other node over each family, and the router's routes through each node what they were
//!   before the run (the nodes' CIDRs and the rest of what they announce);
//! - at the end, churn stopped, within 90 s: no allocation without its pod (and none of a
//!   pod at other addresses), no pod without its allocation, no host veth or pod route
//!   without a record, no DEL left queued, every NodeConfig condition true, and `kubectl
//!   flock ipam check` clean.
//!
//! `--break stray-veth` adds, after the last fault, a veth named like flock's to node1 that no
//! record holds: the run must fail on it (the checks can fail).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::{PodView, pid_in, router_routes, signal};
use crate::cluster::proc::Place;
use crate::cluster::{NODES, Node, control, images, kube, kubectl, kubectl_stdin, node, site};
use crate::sys;

/// The namespace of the run's workloads (deleted after).
const NS: &str = "chaos";

/// How a run goes.
#[derive(Debug, Clone)]
pub struct Options {
    pub minutes: u64,
    pub seed: u64,
    pub breaks: Option<Break>,
}

/// An invariant broken on purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Break {
    /// A veth named like flock's, that no record holds, on node1 after the last fault.
    StrayVeth,
}

impl Options {
    /// `--minutes N`, `--seed S`, `--break stray-veth`; the seed from the clock if not given.
    pub fn parse(args: &[String]) -> Result<Options> {
        let mut o = Options {
            minutes: 10,
            seed: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1),
            breaks: None,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = |flag: &str| {
                it.next()
                    .cloned()
                    .with_context(|| format!("{flag} needs a value"))
            };
            match a.as_str() {
                "--minutes" => {
                    let v = value("--minutes")?;
                    o.minutes = v
                        .parse()
                        .ok()
                        .filter(|m| *m > 0)
                        .with_context(|| format!("--minutes {v:?}: a whole number above 0"))?;
                }
                "--seed" => {
                    let v = value("--seed")?;
                    o.seed = v
                        .parse()
                        .with_context(|| format!("--seed {v:?}: a whole number"))?;
                }
                "--break" => {
                    let v = value("--break")?;
                    o.breaks = Some(match v.as_str() {
                        "stray-veth" => Break::StrayVeth,
                        _ => bail!("--break {v:?}: the one invariant to break is stray-veth"),
                    });
                }
                other => bail!("chaos: unknown option {other:?} (--minutes, --seed, --break)"),
            }
        }
        Ok(o)
    }
}

/// SplitMix64: a seed reproduces every choice of a run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[(self.next() % items.len() as u64) as usize]
    }
}

/// One fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    KillAgent(usize),
    KillBird(usize),
    KillLeader,
    RestartApiserver,
    RestartContainerd(usize),
    Reboot(usize),
}

impl Fault {
    fn kind(self) -> &'static str {
        match self {
            Fault::KillAgent(_) => "agent killed (-9)",
            Fault::KillBird(_) => "BIRD killed (-9)",
            Fault::KillLeader => "controller's leader killed (-9)",
            Fault::RestartApiserver => "apiserver restarted",
            Fault::RestartContainerd(_) => "containerd restarted",
            Fault::Reboot(_) => "node rebooted",
        }
    }

    fn draw(rng: &mut Rng) -> Fault {
        let n = (rng.next() % NODES.len() as u64) as usize;
        // reboots are the longest: rarer
        match rng.range(0, 10) {
            0 | 1 => Fault::KillAgent(n),
            2 | 3 => Fault::KillBird(n),
            4 | 5 => Fault::KillLeader,
            6 | 7 => Fault::RestartApiserver,
            8 | 9 => Fault::RestartContainerd(n),
            _ => Fault::Reboot(n),
        }
    }

    fn apply(self, kube: &kube::KubeBuild) -> Result<()> {
        let kill = |n: usize, comm: &str| -> Result<()> {
            let pid = pid_in(&NODES[n], comm)?;
            signal(pid, nix::sys::signal::Signal::SIGKILL)
        };
        match self {
            Fault::KillAgent(n) => kill(n, "flock-agent"),
            Fault::KillBird(n) => kill(n, "bird"),
            Fault::KillLeader => {
                let (_, pid) = super::wave::leader()?;
                signal(pid, nix::sys::signal::Signal::SIGKILL)
            }
            Fault::RestartApiserver => control::restart_apiserver(kube),
            Fault::RestartContainerd(n) => node::restart_containerd(&NODES[n], kube),
            Fault::Reboot(n) => {
                node::power_off(&NODES[n])?;
                std::thread::sleep(Duration::from_secs(2));
                node::boot(&NODES[n], kube)
            }
        }
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::KillAgent(n)
            | Fault::KillBird(n)
            | Fault::RestartContainerd(n)
            | Fault::Reboot(n) => write!(f, "{} on {}", self.kind(), NODES[*n].name),
            _ => f.write_str(self.kind()),
        }
    }
}

/// What the churn did.
#[derive(Default)]
struct Churned {
    created: AtomicU64,
    deleted: AtomicU64,
    policy_changes: AtomicU64,
    service_changes: AtomicU64,
    refused: AtomicU64,
}

const WEB: &str = "chaos-web";

fn manifests() -> String {
    let mut m = format!(
        "apiVersion: apps/v1
kind: Deployment
metadata: {{ name: {WEB}, namespace: {NS} }}
spec:
  replicas: 4
  selector: {{ matchLabels: {{ app: {WEB} }} }}
  template:
    metadata: {{ labels: {{ app: {WEB} }} }}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
        - {{ name: web, image: {image}, imagePullPolicy: Never }}
",
        image = images::NET
    );
    for n in &NODES {
        m.push_str("---\n");
        m.push_str(&super::pinned_pod(
            NS,
            &prober(n),
            "role: prober",
            n.name,
            images::NET,
            "[sleep, infinity]",
            "",
        ));
    }
    m
}

fn prober(n: &Node) -> String {
    format!("chaos-probe-{}", n.name)
}

fn lone_pod(name: &str, n: &Node) -> String {
    super::pinned_pod(NS, name, "app: chaos-lone", n.name, images::NET, "", "")
}

const POLICY: &str = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: { name: chaos-allow-all, namespace: chaos }
spec:
  podSelector: { matchLabels: { app: chaos-web } }
  policyTypes: [Ingress]
  ingress: [{}]
";

const SERVICE: &str = "apiVersion: v1
kind: Service
metadata: { name: chaos-web, namespace: chaos }
spec:
  ipFamilyPolicy: PreferDualStack
  selector: { app: chaos-web }
  ports: [{ port: 80 }]
";

/// The churn, until `stop`.
fn churn(seed: u64, stop: &AtomicBool, c: &Churned) {
    let mut rng = Rng(seed);
    let mut replicas = 4u64;
    let mut lone: Vec<String> = Vec::new();
    let mut next_lone = 0u64;
    let (mut policy, mut service) = (false, false);
    while !stop.load(Ordering::Relaxed) {
        let ok = match rng.range(0, 5) {
            0 | 1 => {
                let want = rng.range(2, 10);
                let r = kubectl(&[
                    "-n",
                    NS,
                    "scale",
                    "deployment",
                    WEB,
                    &format!("--replicas={want}"),
                ]);
                if r.is_ok() {
                    if want > replicas {
                        c.created.fetch_add(want - replicas, Ordering::Relaxed);
                    } else {
                        c.deleted.fetch_add(replicas - want, Ordering::Relaxed);
                    }
                    replicas = want;
                }
                r.is_ok()
            }
            2 if lone.len() < 6 => {
                let name = format!("chaos-lone-{next_lone}");
                next_lone += 1;
                let n = rng.pick(&NODES);
                let r = kubectl_stdin(&["apply", "-f", "-"], &lone_pod(&name, n));
                if r.is_ok() {
                    c.created.fetch_add(1, Ordering::Relaxed);
                    lone.push(name);
                }
                r.is_ok()
            }
            2 | 3 if !lone.is_empty() => {
                let i = (rng.next() % lone.len() as u64) as usize;
                let r = kubectl(&["-n", NS, "delete", "pod", &lone[i], "--wait=false"]);
                if r.is_ok() {
                    c.deleted.fetch_add(1, Ordering::Relaxed);
                    lone.remove(i);
                }
                r.is_ok()
            }
            4 => {
                let r = if policy {
                    kubectl(&["-n", NS, "delete", "networkpolicy", "chaos-allow-all"])
                } else {
                    kubectl_stdin(&["apply", "-f", "-"], POLICY)
                };
                if r.is_ok() {
                    policy = !policy;
                    c.policy_changes.fetch_add(1, Ordering::Relaxed);
                }
                r.is_ok()
            }
            _ => {
                let r = if service {
                    kubectl(&["-n", NS, "delete", "service", WEB])
                } else {
                    kubectl_stdin(&["apply", "-f", "-"], SERVICE)
                };
                if r.is_ok() {
                    service = !service;
                    c.service_changes.fetch_add(1, Ordering::Relaxed);
                }
                r.is_ok()
            }
        };
        if !ok {
            // the apiserver restarting, most likely: counted, tried again later
            c.refused.fetch_add(1, Ordering::Relaxed);
        }
        std::thread::sleep(Duration::from_millis(rng.range(1000, 3000)));
    }
}

/// Every pod of the cluster with its own addresses (not on the host network), not
/// terminating and not finished.
fn live_pods() -> Result<Vec<PodView>> {
    Ok(super::pods_in(None, "")?
        .into_iter()
        .filter(|p| !p.host_network && !p.finished)
        .collect())
}

/// Addresses on two live pods.
fn duplicates(pods: &[PodView]) -> Vec<String> {
    let mut by_ip: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for p in pods {
        for ip in &p.ips {
            by_ip.entry(ip).or_default().push(p.key());
        }
    }
    by_ip
        .into_iter()
        .filter(|(_, owners)| owners.len() > 1)
        .map(|(ip, owners)| format!("{ip} on {}", owners.join(" and ")))
        .collect()
}

/// Whether the cluster is settled: every Node Ready, flock's pods Ready on every node, a
/// controller holding the Lease, the router's sessions Established.
fn settled() -> bool {
    let nodes_ready =
        crate::cluster::report::json(&["get", "nodes", "-o", "json"]).is_ok_and(|v| {
            v["items"].as_array().is_some_and(|items| {
                items.len() >= NODES.len()
                    && items.iter().all(|n| {
                        n["status"]["conditions"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    })
            })
        });
    let flock_ready = ["flock", "flock-bird"].iter().all(|app| {
        crate::cluster::report::json(&["-n", "kube-system", "get", "daemonset", app, "-o", "json"])
            .is_ok_and(|d| {
                let s = &d["status"];
                s["numberReady"] == s["desiredNumberScheduled"]
                    && s["updatedNumberScheduled"] == s["desiredNumberScheduled"]
                    && s["numberReady"].as_u64().unwrap_or(0) >= NODES.len() as u64
            })
    });
    nodes_ready
        && flock_ready
        && super::wave::leader().is_ok()
        && NODES.iter().all(|n| {
            site::router_sessions()
                .iter()
                .any(|s| s.name == n.name && s.established())
        })
}

/// Ready pods on the other node that the prober on `from` cannot ping, per family.
fn unreachable_from(from: &Node, pods: &[PodView]) -> Result<Vec<String>> {
    // the run's own pods: another test's NetworkPolicies may isolate its pods
    let targets: Vec<&str> = pods
        .iter()
        .filter(|p| p.namespace == NS)
        .filter(|p| p.ready && p.running && p.node != from.name && !p.ips.is_empty())
        .flat_map(|p| p.ips.iter().map(String::as_str))
        .collect();
    if targets.is_empty() {
        return Ok(Vec::new());
    }
    let script = format!(
        "for ip in {}; do ping -c 1 -W 2 $ip >/dev/null 2>&1 || echo $ip; done",
        targets.join(" ")
    );
    let out = kubectl(&["-n", NS, "exec", &prober(from), "--", "sh", "-c", &script])?;
    let failed: BTreeSet<&str> = out.split_whitespace().collect();
    Ok(pods
        .iter()
        .filter(|p| p.namespace == NS)
        .filter(|p| p.ips.iter().any(|ip| failed.contains(ip.as_str())))
        .map(|p| format!("{} ({}) from {}", p.key(), p.ips.join(" "), prober(from)))
        .collect())
}

/// After a fault: waits for the cluster to settle (up to 240 s), then up to 30 s for
/// reachability and the router's routes; what is still wrong then.
fn after_fault(baseline: &BTreeMap<&str, Vec<String>>) -> Result<(Duration, Vec<String>)> {
    let t = Instant::now();
    if sys::wait_for(Duration::from_secs(240), settled).is_err() {
        return Ok((
            t.elapsed(),
            vec!["the cluster did not settle within 240 s".to_owned()],
        ));
    }
    let settle = t.elapsed();
    let mut wrong = Vec::new();
    let _ = sys::wait_for(Duration::from_secs(30), || {
        wrong.clear();
        for n in &NODES {
            let routes = router_routes(n);
            if routes != baseline[n.name] {
                wrong.push(format!(
                    "the router's routes through {} are {routes:?}, were {:?}",
                    n.name, baseline[n.name]
                ));
            }
        }
        match live_pods() {
            Ok(pods) => {
                for n in &NODES {
                    match unreachable_from(n, &pods) {
                        Ok(u) => wrong.extend(u.into_iter().map(|u| format!("unreachable: {u}"))),
                        Err(e) => wrong.push(format!("probe from {}: {e:#}", n.name)),
                    }
                }
            }
            Err(e) => wrong.push(format!("list pods: {e:#}")),
        }
        wrong.is_empty()
    });
    Ok((settle, wrong))
}

/// The end state's violations on every node.
fn end_state() -> Result<Vec<String>> {
    let mut wrong = Vec::new();
    let pods = live_pods()?;
    for n in &NODES {
        let mut held: BTreeSet<String> = BTreeSet::new();
        let mut pod_addrs: BTreeSet<String> = BTreeSet::new();
        let mut allocated: BTreeSet<String> = BTreeSet::new();
        for r in &super::agent_records(n)? {
            let key = format!(
                "{}/{}",
                r["pod"]["namespace"].as_str().unwrap_or("?"),
                r["pod"]["name"].as_str().unwrap_or("?")
            );
            allocated.insert(key.clone());
            let ips: Vec<String> = ["ipv6", "ipv4"]
                .iter()
                .filter_map(|f| r[*f].as_str().map(str::to_owned))
                .collect();
            pod_addrs.extend(ips.iter().cloned());
            for extra in ["addresses", "anycast"] {
                pod_addrs.extend(
                    r[extra]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|a| a.as_str().map(str::to_owned)),
                );
            }
            held.insert(r["hostIf"].as_str().unwrap_or("").to_owned());
            // a secondary network's attachment has addresses of its own, not the pod's
            let secondary = r["flockNetwork"].is_string();
            match pods.iter().find(|p| p.key() == key && p.node == n.name) {
                None => wrong.push(format!(
                    "{}: an allocation of {key} ({}) without its pod",
                    n.name,
                    ips.join(" ")
                )),
                Some(p) if !secondary && !p.ips.is_empty() && p.ips != ips => wrong.push(format!(
                    "{}: {key} has {:?}, its allocation {:?}",
                    n.name, p.ips, ips
                )),
                Some(_) => {}
            }
        }
        for p in pods.iter().filter(|p| p.node == n.name && p.running) {
            if !allocated.contains(&p.key()) {
                wrong.push(format!(
                    "{}: running pod {} has no allocation",
                    n.name,
                    p.key()
                ));
            }
        }
        for name in super::flock_veths(n)? {
            if !held.contains(&name) {
                wrong.push(format!("{}: veth {name} without a record", n.name));
            }
        }
        let net = Place::Net(n.ns());
        for family in ["-6", "-4"] {
            let routes = net.run(&["ip", family, "route", "show"])?;
            for l in routes.lines() {
                let f: Vec<&str> = l.split_whitespace().collect();
                let dev = f
                    .iter()
                    .position(|w| *w == "dev")
                    .and_then(|i| f.get(i + 1))
                    .copied()
                    .unwrap_or("");
                if !dev.starts_with("flock") {
                    continue;
                }
                let dest = f.first().copied().unwrap_or("");
                let (addr, host_route) = match dest.split_once('/') {
                    Some((a, len)) => (a, len == "128" || len == "32"),
                    None => (dest, true),
                };
                if !held.contains(dev) || (host_route && !pod_addrs.contains(addr)) {
                    wrong.push(format!("{}: route {} without a record", n.name, l.trim()));
                }
            }
        }
        let queue = node::host_path(n, "/var/lib/flock")
            .context("the node's store")?
            .join("del-queue");
        let queued = std::fs::read_dir(&queue)
            .map(|d| d.flatten().count())
            .unwrap_or(0);
        if queued > 0 {
            wrong.push(format!("{}: {queued} DEL(s) still queued", n.name));
        }
        let conditions = kubectl(&[
            "get",
            "nodeconfig",
            n.name,
            "-o",
            "jsonpath={range .status.conditions[*]}{.type}={.status}{\"\\n\"}{end}",
        ])?;
        for c in conditions.lines().filter(|c| !c.ends_with("=True")) {
            wrong.push(format!("{}: NodeConfig condition {c}", n.name));
        }
    }
    Ok(wrong)
}

pub(super) fn chaos(out: &mut String, o: &Options) -> Result<Vec<String>> {
    let mut failures = Vec::new();
    let kube = kube::ensure_built()?;
    eprintln!(
        "cluster: life: chaos: seed {} for {} min{} (again: cargo xtask cluster life chaos --minutes {} --seed {})",
        o.seed,
        o.minutes,
        if o.breaks.is_some() {
            ", one invariant broken on purpose"
        } else {
            ""
        },
        o.minutes,
        o.seed
    );
    super::fresh_namespace(NS)?;
    kubectl_stdin(&["apply", "-f", "-"], &manifests())?;
    kubectl(&[
        "-n",
        NS,
        "wait",
        "--for=condition=Ready",
        "pods",
        "--all",
        "--timeout=120s",
    ])?;
    sys::wait_for(Duration::from_secs(120), settled).context("the cluster is not settled")?;
    let baseline: BTreeMap<&str, Vec<String>> =
        NODES.iter().map(|n| (n.name, router_routes(n))).collect();
    for n in &NODES {
        let routes = &baseline[n.name];
        for cidr in [n.cidr6, n.cidr4] {
            if !routes.iter().any(|r| r == cidr) {
                bail!(
                    "before the run the router has no route to {cidr} through {}: {routes:?}",
                    n.name
                );
            }
        }
    }

    let stop = Arc::new(AtomicBool::new(false));
    let churned = Arc::new(Churned::default());
    let churner = {
        let (stop, churned, seed) = (stop.clone(), churned.clone(), o.seed ^ 0x5eed);
        std::thread::spawn(move || churn(seed, &stop, &churned))
    };
    let mut rng = Rng(o.seed);
    let deadline = Instant::now() + Duration::from_secs(o.minutes * 60);
    let mut faults: BTreeMap<&str, u64> = BTreeMap::new();
    let mut settles = Vec::new();
    let mut passes = 0u64;
    let mut log = Vec::new();
    let started = Instant::now();
    let run = (|| -> Result<()> {
        while Instant::now() < deadline {
            let wait = Duration::from_secs(rng.range(15, 45));
            let until = Instant::now() + wait;
            while Instant::now() < until {
                passes += 1;
                if let Ok(pods) = live_pods() {
                    for d in duplicates(&pods) {
                        failures.push(format!(
                            "at {:.0} s: an address on two pods: {d}",
                            started.elapsed().as_secs_f64()
                        ));
                    }
                }
                std::thread::sleep(Duration::from_secs(5));
            }
            let fault = Fault::draw(&mut rng);
            let at = started.elapsed();
            eprintln!("cluster: life: chaos: {:>6.0} s: {fault}", at.as_secs_f64());
            if let Err(e) = fault.apply(&kube) {
                failures.push(format!("{fault} at {:.0} s: {e:#}", at.as_secs_f64()));
            }
            *faults.entry(fault.kind()).or_default() += 1;
            let (settle, wrong) = after_fault(&baseline)?;
            settles.push(settle);
            log.push(format!(
                "{:>6.0} s  {fault}: settled in {:.1} s{}",
                at.as_secs_f64(),
                settle.as_secs_f64(),
                if wrong.is_empty() {
                    String::new()
                } else {
                    format!("; {} violation(s)", wrong.len())
                }
            ));
            failures.extend(
                wrong
                    .into_iter()
                    .map(|w| format!("after {fault} at {:.0} s: {w}", at.as_secs_f64())),
            );
        }
        Ok(())
    })();
    stop.store(true, Ordering::Relaxed);
    let _ = churner.join();
    run?;

    if o.breaks == Some(Break::StrayVeth) {
        Place::Net(NODES[0].ns()).run(&[
            "ip",
            "link",
            "add",
            "flockdeadbeef",
            "type",
            "veth",
            "peer",
            "name",
            "chaosstray",
        ])?;
    }
    // the end: churn stopped; the agents' leak grace and the kubelet's retries run their course
    sys::wait_for(Duration::from_secs(240), settled).ok();
    let mut end = Vec::new();
    let t = Instant::now();
    let clean = sys::wait_for(Duration::from_secs(90), || {
        end = end_state().unwrap_or_else(|e| vec![format!("end state: {e:#}")]);
        end.is_empty()
    });
    let end_took = t.elapsed();
    if clean.is_err() {
        failures.extend(end.iter().map(|e| format!("at the end: {e}")));
    }
    let ipam = super::operate::flock(&crate::lab::debug_bins(), &["ipam", "check"])?;
    if ipam.code != 0 {
        failures.push(format!(
            "at the end: kubectl flock ipam check exited {}: {}",
            ipam.code,
            ipam.stdout.trim()
        ));
    }
    if o.breaks == Some(Break::StrayVeth) {
        let _ = Place::Net(NODES[0].ns()).run(&["ip", "link", "del", "flockdeadbeef"]);
    }

    let _ = writeln!(
        out,
        "\nCHAOS: seed {}, {} min (cargo xtask cluster life chaos --minutes {} --seed {}){}",
        o.seed,
        o.minutes,
        o.minutes,
        o.seed,
        if o.breaks.is_some() {
            ", stray-veth broken on purpose"
        } else {
            ""
        }
    );
    let mut rows: Vec<Vec<String>> = faults
        .iter()
        .map(|(k, v)| vec![(*k).to_owned(), v.to_string()])
        .collect();
    let c = &churned;
    rows.extend([
        vec![
            "pods created".to_owned(),
            c.created.load(Ordering::Relaxed).to_string(),
        ],
        vec![
            "pods deleted".to_owned(),
            c.deleted.load(Ordering::Relaxed).to_string(),
        ],
        vec![
            "NetworkPolicy changes".to_owned(),
            c.policy_changes.load(Ordering::Relaxed).to_string(),
        ],
        vec![
            "Service changes".to_owned(),
            c.service_changes.load(Ordering::Relaxed).to_string(),
        ],
        vec![
            "churn requests refused (apiserver away)".to_owned(),
            c.refused.load(Ordering::Relaxed).to_string(),
        ],
        vec!["duplicate-address passes".to_owned(), passes.to_string()],
        vec![
            "settling after a fault, max".to_owned(),
            settles
                .iter()
                .max()
                .map_or("-".to_owned(), |d| format!("{:.1} s", d.as_secs_f64())),
        ],
        vec![
            "end state clean after".to_owned(),
            if clean.is_ok() {
                format!("{:.1} s", end_took.as_secs_f64())
            } else {
                "never (90 s)".to_owned()
            },
        ],
        vec![
            "kubectl flock ipam check".to_owned(),
            format!("exit {}", ipam.code),
        ],
        vec!["violations".to_owned(), failures.len().to_string()],
    ]);
    sys::table(out, &["", "count"], &rows);
    for l in &log {
        let _ = writeln!(out, "  {l}");
    }
    let _ = kubectl(&["delete", "namespace", NS, "--wait=true", "--timeout=120s"]);
    Ok(failures)
}
