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
//! - **leave**: the third node joins, then leaves: drained, stopped, its Node deleted; every
//!   attachment on it undone (by the kubelet's DEL, or by its agent past the leak grace) and
//!   its NodeConfig deleted.
//! - **policy**: NetworkPolicy changes to enforcement in a node's nftables, p50/p99, with 100
//!   isolated pods, and the agents' memory with 10,000 pods and 1,000 policies in the
//!   cluster (see [`policy`]).
//! - **operate**: `kubectl flock` against the cluster — status healthy, with a BIRD and an
//!   agent frozen; bgp; a leak made on purpose found and released by `ipam check`; `policy
//!   explain` confirmed by real connections; sysdump; bad input (see [`operate`]).
//! - **multus**: flock under Multus (thick), as the cluster network and as a secondary
//!   network: two networks per pod, one default route, traffic over each, the router
//!   learning both spaces, MTU from the uplink, a wrong NetworkAttachmentDefinition, and the
//!   agent killed during a burst (see [`multus`]).
//! - **security**: least privilege: flock's processes with the capabilities they need and no
//!   more, under seccomp, on read-only root filesystems; an ordinary pod unable to reach the
//!   agent's socket or port or to open a BGP session that installs a route; rogue routes
//!   from the router filtered (see [`security`]).
//! - **chaos** (not in [`ALL`]: `life chaos [--minutes N] [--seed S]`): pod churn while
//!   agents, BIRDs, the controller's leader, the apiserver, containerd and whole nodes fail at
//!   random from a printed seed, with flock's invariants checked throughout (see [`chaos`]).
//! - **startup**: a Deployment scaled from 0 to 50 pods on one node with flock, then on the
//!   other with the reference `ptp` + `host-local` plugins (a conflist put first for the
//!   run): time to all Ready, and each pod's `RunPodSandbox` from containerd's log.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

mod chaos;
mod join;
mod leave;
mod multus;
mod operate;
pub(crate) mod policy;
mod ready;
mod reboot;
mod routing;
mod security;
mod services;
pub(crate) mod startup;
mod uninstall;
pub(crate) mod upgrade;
mod wave;

use reboot::reboot;
use startup::startup;
use upgrade::upgrade;

pub use uninstall::uninstall;

use super::deploy::DEMO_NS;
use super::proc::Place;
use super::{NODES, Node, ROUTER, RUN_DIR, kubectl, site};
use crate::sys;

/// The package of the operator's tools `operate` runs (`kubectl flock`).
pub const OPERATOR_TOOLS: &str = "flock-kubectl";

/// Every life test, in the order they run.
pub const ALL: &[&str] = &[
    "upgrade", "ready", "routing", "services", "reboot", "join", "leave", "startup", "policy",
    "operate", "multus", "security",
];

/// `cargo xtask cluster life ARGS…`.
pub fn run(args: &[String]) -> Result<()> {
    sys::require_root("cargo xtask cluster life")?;
    if !Path::new(RUN_DIR).exists() {
        bail!("no cluster is up: `cargo xtask cluster up` first");
    }
    if args.first().map(String::as_str) == Some("chaos") {
        let options = chaos::Options::parse(&args[1..])?;
        crate::binaries::build(&[OPERATOR_TOOLS], false)?;
        let failures = alone("chaos", |out| chaos::chaos(out, &options))?;
        if failures.is_empty() {
            return Ok(());
        }
        bail!(
            "chaos: {} violation(s):\n  {}",
            failures.len(),
            failures.join("\n  ")
        );
    }
    if args.first().map(String::as_str) == Some("upgrade")
        && args.get(1).map(String::as_str) == Some("--from")
    {
        let rev = match args.get(2) {
            None => crate::revision::DEFAULT_FROM.to_owned(),
            Some(rev) if args.len() == 3 => rev.clone(),
            _ => bail!(
                "usage: cargo xtask cluster life upgrade --from REV (default {})",
                crate::revision::DEFAULT_FROM
            ),
        };
        let failures = alone(&format!("upgrade --from {rev}"), |out| {
            upgrade::upgrade_from(out, &rev)
        })?;
        if failures.is_empty() {
            return Ok(());
        }
        bail!("upgrade --from {rev}:\n  {}", failures.join("\n  "));
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
    if which.contains(&"operate") || which.contains(&"multus") {
        crate::binaries::build(&[OPERATOR_TOOLS], false)?;
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

/// Runs one test that takes options of its own (`chaos`, `upgrade --from`): prints its report
/// and how long it took; returns what missed its goal.
fn alone(name: &str, test: impl FnOnce(&mut String) -> Result<Vec<String>>) -> Result<Vec<String>> {
    let mut out = String::new();
    let t = Instant::now();
    let result = test(&mut out);
    print!("{out}");
    eprintln!(
        "cluster: life: {name}: done in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    result
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
            "operate" => operate::operate(out),
            "multus" => multus::multus(out),
            "security" => security::security(out),
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

/// One pod, as the reports need it.
#[derive(Clone, Debug)]
pub(crate) struct PodView {
    namespace: String,
    pub(crate) name: String,
    pub(crate) node: String,
    pub(crate) ips: Vec<String>,
    pub(crate) ready: bool,
    /// `status.phase` is `Running`.
    running: bool,
    /// `status.phase` is `Succeeded` or `Failed`: its sandbox and addresses are gone.
    finished: bool,
    /// `spec.hostNetwork`: the node's addresses, none of flock's.
    host_network: bool,
    /// When its containers last started (the earliest of them; RFC 3339, seconds).
    started: Option<String>,
}

impl PodView {
    fn of(p: &Value) -> PodView {
        PodView {
            namespace: p["metadata"]["namespace"]
                .as_str()
                .unwrap_or("?")
                .to_owned(),
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
            running: p["status"]["phase"] == "Running",
            finished: matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed")),
            host_network: p["spec"]["hostNetwork"] == true,
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
        }
    }

    /// `namespace/name`.
    fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The pods of `namespace` (every namespace: `None`) that `selector` picks, not terminating.
fn pods_in(namespace: Option<&str>, selector: &str) -> Result<Vec<PodView>> {
    let mut args = vec!["get", "pods", "-o", "json"];
    match namespace {
        Some(ns) => args.extend(["-n", ns]),
        None => args.push("-A"),
    }
    if !selector.is_empty() {
        args.extend(["-l", selector]);
    }
    let v: Value = serde_json::from_str(&kubectl(&args)?).context("parse kubectl get pods")?;
    Ok(v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| !p["metadata"]["deletionTimestamp"].is_string())
        .map(PodView::of)
        .collect())
}

pub(crate) fn pods(namespace: &str, selector: &str) -> Result<Vec<PodView>> {
    pods_in(Some(namespace), selector)
}

/// A pod of one container `c` bound to node `node` (no scheduler), gone within a second of its
/// deletion: `labels` as YAML flow mapping entries (`app: x`, or empty), `command` a YAML
/// flow sequence (`[sleep, infinity]`, or empty for the image's own), and `extra` appended
/// to the container (more of its fields, then the pod's `volumes`, indented to match).
fn pinned_pod(
    namespace: &str,
    name: &str,
    labels: &str,
    node: &str,
    image: &str,
    command: &str,
    extra: &str,
) -> String {
    let labels = if labels.is_empty() {
        String::new()
    } else {
        format!(", labels: {{ {labels} }}")
    };
    let command = if command.is_empty() {
        String::new()
    } else {
        format!("\n      command: {command}")
    };
    format!(
        "apiVersion: v1
kind: Pod
metadata: {{ name: {name}, namespace: {namespace}{labels} }}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  containers:
    - name: c
      image: {image}
      imagePullPolicy: Never{command}
{extra}"
    )
}

/// Deletes `ns` if it is there (waiting until it is gone) and creates it afresh.
fn fresh_namespace(ns: &str) -> Result<()> {
    let _ = kubectl(&[
        "delete",
        "namespace",
        ns,
        "--ignore-not-found",
        "--wait=true",
    ]);
    kubectl(&["create", "namespace", ns])?;
    Ok(())
}

/// The agent pod on `n`.
fn agent_pod(n: &Node) -> Result<Value> {
    let v = super::report::json(&[
        "-n",
        "kube-system",
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=flock",
        "--field-selector",
        &format!("spec.nodeName={}", n.name),
        "-o",
        "json",
    ])?;
    v["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| !p["metadata"]["deletionTimestamp"].is_string())
        .cloned()
        .with_context(|| format!("no flock agent pod on {}", n.name))
}

/// A node's agent stopped and not replaced: flock's DaemonSet deleted with its pods orphaned
/// (the other nodes' agents keep running), the node's agent pod deleted. [`start_again`]
/// creates the DaemonSet as it was, which adopts the orphans and starts the stopped one.
///
/// [`start_again`]: StoppedAgent::start_again
pub(super) struct StoppedAgent {
    daemonset: Value,
}

impl StoppedAgent {
    /// Stops `n`'s agent (the pod's deletion is asked for, not waited for).
    pub(super) fn stop(n: &Node) -> Result<StoppedAgent> {
        let mut daemonset = super::report::json(&[
            "-n",
            "kube-system",
            "get",
            "daemonset",
            "flock",
            "-o",
            "json",
        ])?;
        if let Some(meta) = daemonset["metadata"].as_object_mut() {
            for k in [
                "resourceVersion",
                "uid",
                "creationTimestamp",
                "generation",
                "managedFields",
            ] {
                meta.remove(k);
            }
        }
        if let Some(o) = daemonset.as_object_mut() {
            o.remove("status");
        }
        let pod = agent_pod(n)?;
        let pod_name = pod["metadata"]["name"].as_str().unwrap_or("?").to_owned();
        kubectl(&[
            "-n",
            "kube-system",
            "delete",
            "daemonset",
            "flock",
            "--cascade=orphan",
        ])?;
        let stopped = StoppedAgent { daemonset };
        if let Err(e) = kubectl(&[
            "-n",
            "kube-system",
            "delete",
            "pod",
            &pod_name,
            "--wait=false",
        ]) {
            stopped.start_again()?;
            return Err(e);
        }
        Ok(stopped)
    }

    /// Creates the DaemonSet again.
    pub(super) fn start_again(self) -> Result<()> {
        super::kubectl_stdin(&["apply", "-f", "-"], &self.daemonset.to_string())
            .context("create flock's DaemonSet again")?;
        Ok(())
    }
}

/// The pid of a process named `comm` in `n`'s network namespace (BIRD, the agent).
pub(crate) fn pid_in(n: &Node, comm: &str) -> Result<u32> {
    let out = sys::output(std::process::Command::new("ip").args(["netns", "pids", &n.ns()]))?;
    out.split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == comm)
        })
        .with_context(|| format!("no {comm} runs in {}", n.ns()))
}

/// The long-running processes named `comm` in `n`'s network namespace: a daemon of the pod
/// network (flock's agent, BIRD, a peer's), not its init container (`install-cni`) or flock's
/// controller, which run the agent's binary too.
pub(crate) fn daemons_in(n: &Node, comm: &str) -> Vec<u32> {
    let Ok(net) = std::fs::metadata(format!("/run/netns/{}", n.ns())) else {
        return Vec::new();
    };
    let wanted = format!("net:[{}]", std::os::unix::fs::MetadataExt::ino(&net));
    let mut found = Vec::new();
    for p in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = p.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let path = p.path();
        if std::fs::read_to_string(path.join("comm")).map_or(true, |c| c.trim() != comm) {
            continue;
        }
        let cmdline = std::fs::read(path.join("cmdline")).unwrap_or_default();
        if cmdline
            .split(|b| *b == 0)
            .skip(1)
            .any(|a| a == b"controller" || a == b"install-cni")
        {
            continue;
        }
        if std::fs::read_link(path.join("ns/net")).is_ok_and(|l| l.to_string_lossy() == wanted) {
            found.push(pid);
        }
    }
    found
}

/// What a process uses: resident memory and CPU time so far.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Usage {
    /// VmRSS, KiB.
    pub(crate) rss_kib: u64,
    /// User and system time of all its threads, seconds (10 ms ticks).
    pub(crate) cpu_s: f64,
}

/// `pid`'s [`Usage`], from `/proc/PID/status` and `/proc/PID/stat`; `None` once it is gone.
pub(crate) fn daemon_usage(pid: u32) -> Option<Usage> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's closing parenthesis: state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let per_s = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    Some(Usage {
        rss_kib,
        cpu_s: ticks as f64 / per_s,
    })
}

/// Sends `sig` to `pid`.
pub(crate) fn signal(pid: u32, sig: nix::sys::signal::Signal) -> Result<()> {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig)
        .with_context(|| format!("send {sig} to {pid}"))
}

/// Waits for flock's DaemonSet to be rolled out (every agent ready).
fn rollout_flock() -> Result<()> {
    kubectl(&[
        "-n",
        "kube-system",
        "rollout",
        "status",
        "daemonset/flock",
        "--timeout=120s",
    ])?;
    Ok(())
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
    let veths = flock_veths(n).map_or(0, |v| v.len());
    (counts, veths)
}

/// The names of flock's host veths (`flock…`) in `n`'s network namespace.
fn flock_veths(n: &Node) -> Result<Vec<String>> {
    let links = Place::Net(n.ns()).run(&["ip", "-o", "link", "show", "type", "veth"])?;
    Ok(links
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|name| name.split('@').next().unwrap_or(name))
        .filter(|name| name.starts_with("flock"))
        .map(str::to_owned)
        .collect())
}

/// The records of `n`'s agent: `flock-agent allocations --json` on the node's store.
fn agent_records(n: &Node) -> Result<Vec<Value>> {
    let store = super::node::host_path(n, "/var/lib/flock").context("the node's /var/lib/flock")?;
    let records: Value = serde_json::from_str(&sys::output(
        std::process::Command::new(crate::lab::debug_bins().join("flock-agent"))
            .args(["allocations", "--json", "--state-dir"])
            .arg(&store),
    )?)
    .context("parse flock-agent allocations --json")?;
    Ok(records.as_array().cloned().unwrap_or_default())
}

/// The router's BGP routes through `n`.
fn router_routes(n: &Node) -> Vec<String> {
    let router = Place::Net(ROUTER.to_owned());
    let mut routes = Vec::new();
    for family in ["-6", "-4"] {
        let text = router
            .run(&["ip", family, "route", "show", "proto", site::router_proto()])
            .unwrap_or_default();
        // A multipath route spans lines: a prefix line, then its "nexthop" lines.
        let mut current = String::new();
        for line in text.lines() {
            if !line.starts_with([' ', '\t']) {
                current = line.split_whitespace().next().unwrap_or("").to_owned();
            }
            if n.is_next_hop_in(line) {
                routes.push(current.clone());
            }
        }
    }
    routes.dedup();
    routes
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

pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The leak grace period the agents run with for this test (the shipped default is 5 min: a
/// pod gone from the API for that long has its allocation released).
pub const LEAK_GRACE: &str = "20s";

/// The rack pool's status: (nodes, IPv6 free, IPv4 free).
pub(super) fn pool_counts(pool: &str) -> Result<(String, String, String)> {
    let got = kubectl(&[
        "get",
        "nodepool",
        pool,
        "-o",
        "jsonpath={.status.nodes} {.status.ipv6.free} {.status.ipv4.free}",
    ])?;
    let f: Vec<&str> = got.split_whitespace().collect();
    match f.as_slice() {
        [n, six, four] => Ok(((*n).to_owned(), (*six).to_owned(), (*four).to_owned())),
        _ => bail!("NodePool {pool} has no counts in its status: {got:?}"),
    }
}

pub(super) fn ms(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::pinned_pod;

    #[test]
    fn a_pinned_pod_is_the_pod_it_says() {
        let pod: serde_yaml::Value = serde_yaml::from_str(&pinned_pod(
            "ns",
            "p",
            "app: x",
            "node1",
            "img",
            "[sleep, infinity]",
            "      securityContext:\n        capabilities: { add: [NET_ADMIN] }\n  volumes: []\n",
        ))
        .unwrap();
        assert_eq!(pod["metadata"]["labels"]["app"], "x");
        assert_eq!(pod["spec"]["nodeName"], "node1");
        let c = &pod["spec"]["containers"][0];
        assert_eq!(
            (c["name"].as_str(), c["image"].as_str()),
            (Some("c"), Some("img"))
        );
        assert_eq!(c["command"][1], "infinity");
        assert_eq!(c["securityContext"]["capabilities"]["add"][0], "NET_ADMIN");
        assert!(pod["spec"]["volumes"].is_sequence());
        let bare: serde_yaml::Value =
            serde_yaml::from_str(&pinned_pod("ns", "p", "", "n", "img", "", "")).unwrap();
        assert!(bare["metadata"]["labels"].is_null());
        assert!(bare["spec"]["containers"][0]["command"].is_null());
    }
}
