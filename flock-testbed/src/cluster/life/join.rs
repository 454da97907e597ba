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

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::BufRead as _;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::{PodView, exec, pods, router_routes};
use crate::cluster::deploy::{DEMO_NS, RACK_LABEL};
use crate::cluster::proc::{self, Place};
use crate::cluster::report::HTTP_FN;
use crate::cluster::{JOINER, NODES, ROUTER, images, kube, kubectl, kubectl_stdin, node, site};
use crate::sys;

/// The leak grace period the agents run with for this test (the shipped default is 5 min: a
/// pod gone from the API for that long has its allocation released).
pub const LEAK_GRACE: &str = "20s";
/// Node objects created at once in each wave of the leader test.
const WAVE: usize = 30;
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
    // prefixes go back once the pod garbage collector has removed its pods. The rack starts
    // empty, or the counts after the leave have nothing to be compared with.
    sys::wait_for(Duration::from_secs(180), || {
        pool_counts(JOINER.rack).is_ok_and(|c| c.0 == "0")
    })
    .with_context(|| {
        format!(
            "NodePool {} still counts a node 180 s after the last joiner left",
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

/// The rack pool's status: (nodes, IPv6 free, IPv4 free).
fn pool_counts(pool: &str) -> Result<(String, String, String)> {
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

fn ms(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
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

/// One version of a NodeConfig, as the watch saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    name: String,
    cidr6: String,
    cidr4: String,
}

/// `kubectl get nodeconfigs --watch`, every version of every NodeConfig.
struct Watch {
    child: Child,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Watch {
    fn start() -> Result<Watch> {
        let mut cmd = crate::cluster::kubectl_command();
        cmd.args([
            "get",
            "nodeconfigs",
            "--watch",
            "--no-headers",
            "-o",
            "custom-columns=N:.metadata.name,V6:.spec.cidr6,V4:.spec.cidr4",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
        let mut child = cmd
            .spawn()
            .context("spawn kubectl get nodeconfigs --watch")?;
        let stdout = child.stdout.take().context("the watch's stdout")?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&seen);
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                let f: Vec<&str> = line.split_whitespace().collect();
                if let [name, cidr6, cidr4] = f.as_slice() {
                    sink.lock().expect("watch lock").push(Seen {
                        name: (*name).to_owned(),
                        cidr6: (*cidr6).to_owned(),
                        cidr4: (*cidr4).to_owned(),
                    });
                }
            }
        });
        Ok(Watch { child, seen })
    }

    fn names(&self, prefix: &str) -> BTreeSet<String> {
        self.seen
            .lock()
            .expect("watch lock")
            .iter()
            .filter(|s| s.name.starts_with(prefix))
            .map(|s| s.name.clone())
            .collect()
    }

    fn stop(mut self) -> Vec<Seen> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::mem::take(&mut *self.seen.lock().expect("watch lock"))
    }
}

/// What the watch saw that must never be: a prefix on two nodes, a node whose prefix
/// changed.
fn double_assignments(seen: &[Seen]) -> Vec<String> {
    let mut by_prefix: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut by_node: BTreeMap<&str, BTreeSet<(&str, &str)>> = BTreeMap::new();
    for s in seen {
        for p in [&s.cidr6, &s.cidr4] {
            if p != "<none>" {
                by_prefix.entry(p).or_default().insert(&s.name);
            }
        }
        by_node
            .entry(&s.name)
            .or_default()
            .insert((&s.cidr6, &s.cidr4));
    }
    let mut bad: Vec<String> = by_prefix
        .into_iter()
        .filter(|(_, names)| names.len() > 1)
        .map(|(p, names)| format!("{p} seen on {names:?}"))
        .collect();
    bad.extend(
        by_node
            .into_iter()
            .filter(|(_, prefixes)| prefixes.len() > 1)
            .map(|(n, prefixes)| format!("{n} seen with {prefixes:?}")),
    );
    bad
}

/// How the leader is taken out in a wave.
#[derive(Clone, Copy)]
enum Blow {
    /// SIGKILL: no chance to release the Lease; its container restarts.
    Kill,
    /// SIGSTOP until the wave is done (by the standby, once the Lease expired), then
    /// SIGCONT: a leader that hung, woken up with a plan it made before — it must not write.
    Freeze,
}

impl Blow {
    fn name(self) -> &'static str {
        match self {
            Blow::Kill => "kill",
            Blow::Freeze => "freeze",
        }
    }
}

/// The Nodes of one wave: `WAVE` of the joiner's rack, tainted so nothing runs on them.
fn wave_nodes(wave: &str) -> String {
    (0..WAVE)
        .map(|i| {
            format!(
                "apiVersion: v1
kind: Node
metadata:
  name: wave-{wave}-{i:02}
  labels: {{ {RACK_LABEL}: {rack}, flock.fritzlab.net/life-test: wave }}
spec:
  taints: [{{ key: flock.fritzlab.net/no-machine, effect: NoSchedule }}]
",
                rack = JOINER.rack
            )
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

fn delete_wave() -> Result<String> {
    kubectl(&[
        "delete",
        "nodes",
        "-l",
        "flock.fritzlab.net/life-test=wave",
        "--wait=false",
    ])
}

/// The controller holding the Lease: its pod's name and its process.
fn leader() -> Result<(String, u32)> {
    let holder = kubectl(&[
        "-n",
        "kube-system",
        "get",
        "lease",
        "flock-controller",
        "-o",
        "jsonpath={.spec.holderIdentity}",
    ])?
    .trim()
    .to_owned();
    if holder.is_empty() {
        bail!("nobody holds the Lease kube-system/flock-controller");
    }
    let wanted = format!("FLOCK_POD_NAME={holder}");
    for p in std::fs::read_dir("/proc").context("read /proc")?.flatten() {
        let Ok(pid) = p.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(p.path().join("cmdline")).unwrap_or_default();
        if !cmdline.split(|b| *b == 0).any(|a| a == b"controller") {
            continue;
        }
        let environ = std::fs::read(p.path().join("environ")).unwrap_or_default();
        if environ.split(|b| *b == 0).any(|e| e == wanted.as_bytes()) {
            return Ok((holder, pid));
        }
    }
    bail!("no process of the leading controller {holder} on this machine")
}

fn signal(pid: u32, sig: &str) {
    let _ = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status();
}

fn leader_kill(out: &mut String, failures: &mut Vec<String>) -> Result<()> {
    let watch = Watch::start()?;
    // The watch lists what exists first.
    sys::wait_for(Duration::from_secs(10), || !watch.names("").is_empty())
        .context("the NodeConfig watch printed nothing")?;
    let mut rows = Vec::new();
    for blow in [Blow::Kill, Blow::Freeze] {
        wave(blow, &watch, &mut rows, failures)?;
    }
    // Deleting the Nodes returns their prefixes: none of them ever reported an allocation.
    let t_release = Instant::now();
    delete_wave()?;
    let released = sys::wait_for(Duration::from_secs(120), || {
        kubectl(&["get", "nodeconfigs", "-o", "name"]).is_ok_and(|names| !names.contains("/wave-"))
    });
    let release_time = t_release.elapsed();
    if released.is_err() {
        failures.push("leader: the waves' NodeConfigs outlived their Nodes by 120 s".into());
    }
    let seen = watch.stop();
    let bad = double_assignments(&seen);
    for b in &bad {
        failures.push(format!("leader: {b}"));
    }
    rows.push(vec![
        "versions of NodeConfigs watched; prefixes seen on two nodes or moved".to_owned(),
        format!("{}; {}", seen.len(), bad.len()),
    ]);
    rows.push(vec![
        format!(
            "all {} Nodes deleted → their NodeConfigs gone, prefixes free",
            2 * WAVE
        ),
        ms(release_time),
    ]);
    let _ = writeln!(
        out,
        "CONTROLLER LEADER ({WAVE} Nodes of rack {} created at once, twice; the leading controller \
         killed (SIGKILL), then frozen (SIGSTOP, SIGCONT once the wave is done), at its first NodeConfig of the wave)",
        JOINER.rack
    );
    sys::table(out, &["", ""], &rows);
    Ok(())
}

fn wave(
    blow: Blow,
    watch: &Watch,
    rows: &mut Vec<Vec<String>>,
    failures: &mut Vec<String>,
) -> Result<()> {
    let name = blow.name();
    let prefix = format!("wave-{name}-");
    let (leader_pod, pid) = leader()?;
    let t = Instant::now();
    kubectl_stdin(&["apply", "-f", "-"], &wave_nodes(name))?;
    let first = sys::wait_for(Duration::from_secs(60), || !watch.names(&prefix).is_empty());
    let at_blow = watch.names(&prefix).len();
    let blown_after = t.elapsed();
    signal(
        pid,
        if matches!(blow, Blow::Kill) {
            "-KILL"
        } else {
            "-STOP"
        },
    );
    if first.is_err() {
        failures.push(format!(
            "leader {name}: no NodeConfig for the wave's Nodes in 60 s"
        ));
    }
    let done = sys::wait_for(Duration::from_secs(120), || {
        watch.names(&prefix).len() == WAVE
    });
    let completed = t.elapsed();
    if done.is_err() {
        failures.push(format!(
            "leader {name}: {} of {WAVE} NodeConfigs 120 s after the leader was taken out",
            watch.names(&prefix).len()
        ));
    }
    let successor = leader()
        .map(|(p, _)| p)
        .unwrap_or_else(|e| format!("? ({e:#})"));
    let mut woken = String::new();
    if let Blow::Freeze = blow {
        signal(pid, "-CONT");
        // Woken past its renew deadline it must find it no longer leads, write nothing, and
        // end (its container restarts as a candidate); the watch sees any write it makes.
        let ended = sys::wait_for(Duration::from_secs(20), || {
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
        });
        woken = if ended.is_ok() {
            "ended".into()
        } else {
            "still running".into()
        };
        if ended.is_err() {
            failures.push(format!(
                "leader freeze: {leader_pod}, woken, still runs after 20 s"
            ));
        }
        if successor == leader_pod {
            failures.push(format!(
                "leader freeze: the frozen {leader_pod} still holds the Lease"
            ));
        }
    }
    rows.push(vec![
        format!("{name}: leader {leader_pod}; NodeConfigs of the wave by then"),
        format!("{at_blow} at {}", ms(blown_after)),
    ]);
    rows.push(vec![
        format!(
            "{name}: all {WAVE} written, Lease held by {successor}{}",
            if woken.is_empty() {
                String::new()
            } else {
                format!("; the woken leader {woken}")
            }
        ),
        ms(completed),
    ]);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// leave

fn leave(
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
    let held = holdings();
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
    let held_drained = holdings();
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
    let freed = sys::wait_for(Duration::from_secs(150), || {
        kubectl(&["get", "nodeconfig", JOINER.name, "-o", "name"]).is_err()
    });
    let free_at = t.elapsed();
    if freed.is_err() {
        failures.push(format!(
            "leave: {}'s NodeConfig is still there 150 s after its pods went (status {})",
            JOINER.name,
            holdings()
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
    // Its agent's pod is gone from the API with the others: its log is on the node's disk.
    let agent_log = agent_log_on_disk();
    let leaked: Vec<&str> = agent_log
        .lines()
        .filter(|l| l.contains("past the grace period"))
        .collect();
    let drained6: usize = held_drained
        .split('/')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    if leaked.len() != drained6 {
        failures.push(format!(
            "leave: the agent released {} allocations past the grace period, its pods held {drained6}",
            leaked.len()
        ));
    }
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
        "LEAVE ({} drained, its kubelet stopped, its Node deleted; agent's leak grace {LEAK_GRACE})",
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
            "its agent released them, reported none; NodeConfig deleted, prefixes free".to_owned(),
            ms(free_at),
        ],
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

/// The joiner's NodeConfig's allocation counts.
fn holdings() -> String {
    kubectl(&[
        "get",
        "nodeconfig",
        JOINER.name,
        "-o",
        "jsonpath={.status.allocated6}/{.status.allocated4}",
    ])
    .map(|s| s.trim().to_owned())
    .unwrap_or_else(|e| format!("? ({e:#})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(name: &str, cidr6: &str, cidr4: &str) -> Seen {
        Seen {
            name: name.into(),
            cidr6: cidr6.into(),
            cidr4: cidr4.into(),
        }
    }

    #[test]
    fn a_prefix_on_two_nodes_or_a_moved_prefix_is_reported() {
        let fine = [
            seen("a", "2001:db8:c7::/64", "10.202.0.0/24"),
            seen("a", "2001:db8:c7::/64", "10.202.0.0/24"),
            seen("b", "2001:db8:c7:1::/64", "<none>"),
        ];
        assert!(double_assignments(&fine).is_empty());
        let twice = [
            seen("a", "2001:db8:c7::/64", "10.202.0.0/24"),
            seen("b", "2001:db8:c7:1::/64", "10.202.0.0/24"),
        ];
        assert_eq!(double_assignments(&twice).len(), 1);
        let moved = [
            seen("a", "2001:db8:c7::/64", "10.202.0.0/24"),
            seen("a", "2001:db8:c7:1::/64", "10.202.0.0/24"),
        ];
        assert_eq!(double_assignments(&moved).len(), 1);
    }

    #[test]
    fn the_wave_is_of_the_joiners_rack_and_runs_nothing() {
        let text = wave_nodes("kill");
        assert_eq!(text.matches("kind: Node").count(), WAVE);
        assert!(text.contains(&format!("{RACK_LABEL}: {}", JOINER.rack)));
        assert!(text.contains("effect: NoSchedule"));
    }
}
