//! `cargo xtask cluster life policy`: how fast a NetworkPolicy change reaches a node's
//! nftables, and what the agents' memory costs with a cluster of 10,000 pods and 1,000
//! policies.
//!
//! - **Enforcement latency.** 100 pods on node1, isolated by a policy that admits an
//!   `ipBlock` and the pods labelled `role=client`; a client pod on node2. Each round changes
//!   either the policy (its `ipBlock`: a new set and the pods' chains, changed in place)
//!   or the client's label (its address joins or leaves a selector's set: set elements
//!   only), by one request to the apiserver (`curl`, so no `kubectl` start-up is
//!   counted). `nft monitor`, running in node1's network namespace, prints the kernel's
//!   change as it is committed (for a label change, the commit's generation line: the
//!   monitor cannot print elements of sets created after it started); the time from
//!   sending the request to that line is the round's latency. Goal (issue 15): p50 and p99 ≤ 100 ms. A change never seen within
//!   5 s fails the test.
//! - **Memory at scale.** A Node with no machine behind it (tainted, nothing runs) gets
//!   10,000 pods in 100 namespaces, and those namespaces get 1,000 policies; every agent
//!   watches all of them. Each agent's resident memory (VmRSS of its process) before and
//!   after. Goal: ≤ 64 MiB. Everything is deleted again.

use std::fmt::Write as _;
use std::io::BufRead as _;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::{percentile, pods};
use crate::cluster::proc::Place;
use crate::cluster::{CONTROL, CONTROL_ADDR, NODES, Node, images, kubectl, kubectl_stdin, pki};
use crate::sys;

const NS: &str = "policy-bench";
/// Pods of the enforcement run, all on node1.
pub(crate) const TARGETS: usize = 100;
/// Rounds of each kind.
const ROUNDS: usize = 40;
/// The memory run: namespaces, pods per namespace, policies per namespace.
const SCALE_NAMESPACES: usize = 100;
const SCALE_PODS: usize = 100;
const SCALE_POLICIES: usize = 10;
const SCALE_NODE: &str = "policy-scale";

pub fn policy(out: &mut String) -> Result<Vec<String>> {
    let mut failures = Vec::new();
    let result = (|| -> Result<()> {
        latency(out, &mut failures)?;
        memory(out, &mut failures)
    })();
    let cleaned = clean_up();
    result?;
    match cleaned {
        Ok([pods, namespaces, counted]) => {
            let _ = writeln!(
                out,
                "deleted again: the scale run's pods force-deleted after {:.1} s, the namespaces \
                 gone after {:.1} s, the agents' counts of cluster pods back down after {:.1} s",
                pods.as_secs_f64(),
                namespaces.as_secs_f64(),
                counted.as_secs_f64()
            );
        }
        Err(e) => failures.push(format!("policy: clean-up: {e:#}")),
    }
    out.push('\n');
    Ok(failures)
}

/// Deletes what the test created and waits until it is gone, so that the tests after this
/// one (the e2e suite in `cluster check`) meet a quiet cluster. The scale run's pods are bound
/// to a Node without a kubelet: left to the namespace controller they would wait for the pod
/// garbage collector, which force-deletes them at the controller manager's 20 requests a
/// second, minutes of churn. They are force-deleted here, one collection per namespace.
/// Returns when the pods were deleted, the namespaces gone and the agents' counts down.
fn clean_up() -> Result<[Duration; 3]> {
    let t = Instant::now();
    let scale: Vec<String> = kubectl(&[
        "get",
        "namespaces",
        "-l",
        "flock.fritzlab.net/life-test=policy-scale",
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ])?
    .split_whitespace()
    .map(str::to_owned)
    .collect();
    on_four_workers(&scale, |ns| {
        api(
            "DELETE",
            &format!("/api/v1/namespaces/{ns}/pods"),
            "application/json",
            r#"{"kind":"DeleteOptions","apiVersion":"v1","gracePeriodSeconds":0}"#,
        )
        .with_context(|| format!("force-delete the pods of {ns}"))
        .map(drop)
    })?;
    let pods = t.elapsed();
    kubectl(&[
        "delete",
        "namespace",
        NS,
        "--ignore-not-found",
        "--wait=false",
    ])?;
    kubectl(&[
        "delete",
        "namespaces",
        "-l",
        "flock.fritzlab.net/life-test=policy-scale",
        "--wait=false",
    ])?;
    kubectl(&[
        "delete",
        "node",
        SCALE_NODE,
        "--ignore-not-found",
        "--wait=false",
    ])?;
    let mut left = String::new();
    sys::wait_for(Duration::from_secs(300), || {
        left = kubectl(&[
            "get",
            "namespaces",
            "-l",
            "flock.fritzlab.net/life-test=policy-scale",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ])
        .unwrap_or_else(|e| format!("({e:#})"));
        let bench = kubectl(&["get", "namespace", NS, "--ignore-not-found", "-o", "name"])
            .unwrap_or_else(|e| format!("({e:#})"));
        left.push(' ');
        left.push_str(bench.trim());
        left.trim().is_empty()
    })
    .with_context(|| format!("namespaces still there: {}", left.trim()))?;
    let namespaces = t.elapsed();
    let mut counts = Vec::new();
    sys::wait_for(Duration::from_secs(120), || {
        counts = NODES.iter().map(cluster_pods_seen).collect();
        counts
            .iter()
            .all(|c| c.is_none_or(|c| (c as usize) < SCALE_PODS))
    })
    .with_context(|| format!("the agents still count cluster pods: {counts:?}"))?;
    Ok([pods, namespaces, t.elapsed()])
}

// ---------------------------------------------------------------------------------------
// enforcement latency

/// Namespace `ns` with [`TARGETS`] pods (`app=target`, a Deployment on node1) and a client
/// pod (`app=client`) on node2: what a policy's enforcement is timed on (here and in `cargo
/// xtask bench cluster`).
pub(crate) fn targets_and_client(ns: &str) -> String {
    format!(
        "apiVersion: v1
kind: Namespace
metadata: {{ name: {ns} }}
---
apiVersion: apps/v1
kind: Deployment
metadata: {{ name: target, namespace: {ns} }}
spec:
  replicas: {TARGETS}
  selector: {{ matchLabels: {{ app: target }} }}
  template:
    metadata: {{ labels: {{ app: target }} }}
    spec:
      nodeSelector: {{ kubernetes.io/hostname: {node1} }}
      terminationGracePeriodSeconds: 1
      containers:
        - {{ name: web, image: {image}, imagePullPolicy: Never }}
---
apiVersion: v1
kind: Pod
metadata: {{ name: client, namespace: {ns}, labels: {{ app: client }} }}
spec:
  nodeName: {node2}
  terminationGracePeriodSeconds: 1
  containers:
    - {{ name: web, image: {image}, imagePullPolicy: Never }}
",
        node1 = NODES[0].name,
        node2 = NODES[1].name,
        image = images::NET,
    )
}

fn targets_manifest() -> String {
    format!(
        "{}---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {{ name: bench, namespace: {NS} }}
spec:
  podSelector: {{ matchLabels: {{ app: target }} }}
  policyTypes: [Ingress]
  ingress:
    - from:
        - ipBlock: {{ cidr: \"{block}\" }}
        - podSelector: {{ matchLabels: {{ role: client }} }}
",
        targets_and_client(NS),
        block = block(0),
    )
}

/// The `ipBlock` of round `i`: an address no other round uses, printed by `nft` as written.
fn block(i: usize) -> String {
    format!("2001:db8:c9:{i:x}::1/128")
}

/// What `nft monitor` prints for the block of round `i` (no prefix length for a /128).
fn block_seen(i: usize) -> String {
    format!(":c9:{i:x}::1 ")
}

/// `nft monitor` in a node's network namespace: every line, stamped as it arrives.
struct Monitor {
    child: Child,
    /// The node's network namespace.
    ns: String,
    lines: Arc<Mutex<Vec<(Instant, String)>>>,
}

impl Monitor {
    fn start(n: &Node) -> Result<Monitor> {
        let mut cmd = Place::Net(n.ns()).command("nft");
        cmd.arg("monitor")
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().context("spawn nft monitor")?;
        let stdout = child.stdout.take().context("nft monitor's stdout")?;
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                sink.lock()
                    .expect("monitor lock")
                    .push((Instant::now(), line + " "));
            }
        });
        Ok(Monitor {
            child,
            ns: n.ns(),
            lines,
        })
    }

    /// How many lines have come so far: where a search for what comes next starts.
    fn mark(&self) -> usize {
        self.lines.lock().expect("monitor lock").len()
    }

    /// The first line from position `from` on containing `needle`: its position and when it
    /// came.
    fn wait(&self, from: usize, needle: &str, limit: Duration) -> Option<(usize, Instant)> {
        let mut found = None;
        let _ = sys::wait_for(limit, || {
            let lines = self.lines.lock().expect("monitor lock");
            found = lines[from..]
                .iter()
                .enumerate()
                .find(|(_, (_, l))| l.contains(needle))
                .map(|(i, (t, _))| (from + i, *t));
            found.is_some()
        });
        found
    }
}

/// How the client's label change reached the node's table.
#[derive(Debug, PartialEq, Eq)]
enum Member {
    /// The agent's own netlink element batch committed it, at this time.
    Element(Instant),
    /// flock's table was changed by `nft -f` (a whole table or a script), committed at this
    /// time; the first line of the change.
    WholeTable(Instant, String),
    /// Not within the limit.
    Never,
}

/// Whether an `nft monitor` line changes flock's table other than by its elements: a table,
/// chain, rule or set. kube-proxy's `nft -f` commits (its own tables) are not.
fn flock_structure(line: &str) -> bool {
    line.contains(" inet flock_policy ") && !line.contains(" element ")
}

impl Monitor {
    /// When the client's address `addr` came into (`joins`) or went from flock's sets, as
    /// committed after position `from`. `nft monitor` cannot print the elements of a set
    /// created after it started (the agent's in-place policy changes create sets: "Unable to
    /// cache set_elem. Set not found."), so the membership is found by listing the table, and
    /// the commit by its generation line: the agent's netlink batch (`by process …
    /// (flock-agent)`), or one by `nft -f` (`(nft)`) that changed flock's table. kube-proxy
    /// commits by `nft -f` too, in its own tables: such a commit is neither.
    fn wait_member(&self, from: usize, addr: &str, joins: bool, limit: Duration) -> Member {
        let mut outcome = Member::Never;
        let _ = sys::wait_for(limit, || {
            let listing = Place::Net(self.ns.clone())
                .run(&["nft", "list", "table", "inet", "flock_policy"])
                .unwrap_or_default();
            let present = [",", " ", "\n"]
                .iter()
                .any(|end| listing.contains(&format!("{addr}{end}")));
            if present != joins {
                return false;
            }
            match commit_of(&self.lines.lock().expect("monitor lock")[from..]) {
                Some(commit) => {
                    outcome = commit;
                    true
                }
                None => false,
            }
        });
        outcome
    }
}

/// The first commit among `lines` (of `nft monitor`, stamped) that is the agent's netlink
/// batch ([`Member::Element`]) or an `nft -f` that changed flock's table other than by its
/// elements ([`Member::WholeTable`]); `None` while there is neither (other commits, such as
/// kube-proxy's, are passed over).
fn commit_of(lines: &[(Instant, String)]) -> Option<Member> {
    // The first line of the commit under way that changed flock's structure.
    let mut flock_script: Option<&String> = None;
    for (t, line) in lines {
        if line.starts_with("# new generation") {
            if line.contains("(flock-agent)") {
                return Some(Member::Element(*t));
            }
            if let Some(first) = flock_script
                && line.contains("(nft)")
            {
                return Some(Member::WholeTable(*t, first.trim_end().to_owned()));
            }
            flock_script = None;
        } else if flock_script.is_none() && flock_structure(line) {
            flock_script = Some(line);
        }
    }
    None
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request to the apiserver as admin, with `curl` from the control plane's namespace.
pub(crate) fn api(method: &str, path: &str, content_type: &str, body: &str) -> Result<String> {
    Place::Net(CONTROL.to_owned()).run(&[
        "curl",
        "-sS",
        "--fail",
        "--cacert",
        &pki::file("ca.crt"),
        "--cert",
        &pki::file("admin.crt"),
        "--key",
        &pki::file("admin.key"),
        "-X",
        method,
        "-H",
        &format!("Content-Type: {content_type}"),
        "--data",
        body,
        &format!("https://[{CONTROL_ADDR}]:6443{path}"),
    ])
}

fn latency(out: &mut String, failures: &mut Vec<String>) -> Result<()> {
    kubectl_stdin(&["apply", "-f", "-"], &targets_manifest())?;
    let ready = sys::wait_for(Duration::from_secs(300), || {
        pods(NS, "app in (target, client)")
            .is_ok_and(|p| p.len() == TARGETS + 1 && p.iter().all(|p| p.ready && p.ips.len() == 2))
    });
    ready.with_context(|| format!("{TARGETS} target pods and the client Ready in {NS}"))?;
    let client = pods(NS, "app=client")?
        .into_iter()
        .next()
        .context("the client pod")?;
    let client6 = client
        .ips
        .iter()
        .find(|ip| ip.contains(':'))
        .context("the client's IPv6 address")?
        .clone();
    let monitor = Monitor::start(&NODES[0])?;
    // Let the monitor attach before the first round.
    std::thread::sleep(Duration::from_millis(500));
    let (rule, member) = rounds(&monitor, &client6, 1, failures)?;
    // The same rounds with the namespace logging every decision of its pods: the chains carry
    // a log statement before each verdict (docs/networkpolicy.md, "Seeing decisions").
    kubectl(&[
        "annotate",
        "namespace",
        NS,
        "--overwrite",
        "flock.fritzlab.net/policy-log=all",
    ])?;
    sys::wait_for(Duration::from_secs(30), || {
        Place::Net(NODES[0].ns())
            .run(&["nft", "list", "table", "inet", "flock_policy"])
            .is_ok_and(|t| t.contains("log prefix"))
    })
    .context("the targets' chains log after the namespace is annotated")?;
    let (rule_logged, member_logged) = rounds(&monitor, &client6, ROUNDS + 1, failures)?;
    drop(monitor);
    let mut rows = Vec::new();
    for (what, mut samples) in [
        (
            "policy changed (ipBlock: a set and the chains, in place)",
            rule,
        ),
        (
            "pod label changed (selector membership: set elements)",
            member,
        ),
        (
            "policy changed, the namespace logging all decisions",
            rule_logged,
        ),
        (
            "pod label changed, the namespace logging all decisions",
            member_logged,
        ),
    ] {
        samples.sort();
        rows.push(vec![
            what.to_owned(),
            samples.len().to_string(),
            fmt_ms(percentile(&samples, 0.5)),
            fmt_ms(percentile(&samples, 0.99)),
            fmt_ms(samples.last().copied().unwrap_or_default()),
        ]);
    }
    let _ = writeln!(
        out,
        "POLICY → ENFORCEMENT ({TARGETS} isolated pods on {}; from the request to the apiserver to \
         `nft monitor` in the node's namespace printing the change)",
        NODES[0].name
    );
    sys::table(out, &["change", "rounds", "p50", "p99", "max"], &rows);
    Ok(())
}

/// `ROUNDS` rounds from round `first` on: each changes the policy's ipBlock, then the
/// client's label; returns the latencies of each kind.
fn rounds(
    monitor: &Monitor,
    client6: &str,
    first: usize,
    failures: &mut Vec<String>,
) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let mut rule = Vec::new();
    let mut member = Vec::new();
    for i in first..first + ROUNDS {
        // The policy: its ipBlock replaced (a rule of every target's chain).
        let patch = format!(
            r#"{{"spec":{{"ingress":[{{"from":[{{"ipBlock":{{"cidr":"{}"}}}},{{"podSelector":{{"matchLabels":{{"role":"client"}}}}}}]}}]}}}}"#,
            block(i)
        );
        let mark = monitor.mark();
        let t = Instant::now();
        api(
            "PATCH",
            &format!("/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies/bench"),
            "application/merge-patch+json",
            &patch,
        )?;
        let limit = Duration::from_secs(5);
        // The label change's commit is looked for after this one's generation line: the lines
        // of one commit come together, but not necessarily in one read.
        let after_rule = match monitor.wait(mark, &block_seen(i), limit) {
            Some((at, seen)) => {
                rule.push(seen - t);
                monitor
                    .wait(at, "# new generation", limit)
                    .map(|(g, _)| g + 1)
            }
            None => {
                failures.push(format!(
                    "policy: round {i}: {} not enforced in 5 s",
                    block(i)
                ));
                None
            }
        };
        // The client's label: its address joins (odd rounds) or leaves the selector's set.
        let joins = i % 2 == 1;
        let label = if joins { r#""client""# } else { "null" };
        let mark = after_rule.unwrap_or_else(|| monitor.mark());
        let t = Instant::now();
        api(
            "PATCH",
            &format!("/api/v1/namespaces/{NS}/pods/client"),
            "application/merge-patch+json",
            &format!(r#"{{"metadata":{{"labels":{{"role":{label}}}}}}}"#),
        )?;
        let verb = if joins { "add" } else { "delete" };
        match monitor.wait_member(mark, client6, joins, limit) {
            Member::Element(seen) => member.push(seen - t),
            Member::WholeTable(seen, first) => {
                member.push(seen - t);
                failures.push(format!(
                    "policy: round {i}: the client's label change was applied to flock's table by `nft -f` (a whole table or a script, starting `{first}`), not as a set element ({verb})"
                ));
            }
            Member::Never => failures.push(format!(
                "policy: round {i}: the client's {client6} not {verb}ed in 5 s"
            )),
        }
    }
    Ok((rule, member))
}

fn fmt_ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

// ---------------------------------------------------------------------------------------
// memory at scale

/// Runs `op` on every item from four threads at once; the first error, if any, after all
/// items were tried.
fn on_four_workers<T: Sync>(items: &[T], op: impl Fn(&T) -> Result<()> + Sync) -> Result<()> {
    let next = Mutex::new(items.iter());
    let errors: Vec<anyhow::Error> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let mut errors = Vec::new();
                    while let Some(item) = {
                        let mut n = next.lock().expect("next");
                        n.next()
                    } {
                        if let Err(e) = op(item) {
                            errors.push(e);
                        }
                    }
                    errors
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap_or_default())
            .collect()
    });
    errors.into_iter().next().map_or(Ok(()), Err)
}

/// The scale run's namespaces, one manifest.
fn scale_namespaces() -> String {
    (0..SCALE_NAMESPACES)
        .map(|ns| {
            format!(
                "apiVersion: v1
kind: Namespace
metadata: {{ name: scale-{ns:03}, labels: {{ flock.fritzlab.net/life-test: policy-scale, team: t{team} }} }}
",
                team = ns % 10
            )
        })
        .collect::<Vec<_>>()
        .join("---\n")
}

/// One scale namespace's pods and policies.
fn scale_manifests(ns: usize) -> String {
    let name = format!("scale-{ns:03}");
    let mut m = String::new();
    for p in 0..SCALE_PODS {
        let _ = write!(
            m,
            "---
apiVersion: v1
kind: Pod
metadata:
  name: p{p:03}
  namespace: {name}
  labels: {{ app: a{app}, tier: t{tier}, shard: s{p} }}
spec:
  nodeName: {SCALE_NODE}
  tolerations: [{{ operator: Exists }}]
  containers:
    - {{ name: c, image: {image}, ports: [{{ name: http, containerPort: 80 }}] }}
",
            app = p % 10,
            tier = p % 3,
            image = images::NET,
        );
    }
    for q in 0..SCALE_POLICIES {
        let _ = write!(
            m,
            "---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {{ name: np{q}, namespace: {name} }}
spec:
  podSelector: {{ matchLabels: {{ app: a{q} }} }}
  policyTypes: [Ingress, Egress]
  ingress:
    - from:
        - podSelector: {{ matchLabels: {{ tier: t{tier} }} }}
        - namespaceSelector: {{ matchLabels: {{ team: t{q} }} }}
          podSelector: {{ matchLabels: {{ app: a{q} }} }}
        - ipBlock: {{ cidr: 2001:db8:ca::/48, except: [\"2001:db8:ca:{q:x}::/64\"] }}
      ports: [{{ port: http, protocol: TCP }}, {{ port: 53, protocol: UDP }}]
  egress:
    - to:
        - namespaceSelector: {{}}
      ports: [{{ port: 443, protocol: TCP }}]
",
            tier = q % 3,
        );
    }
    m
}

/// Each node's agent: its resident memory (KiB), read from its process.
fn agent_rss() -> Vec<(String, u64)> {
    NODES
        .iter()
        .flat_map(|n| {
            super::daemons_in(n, "flock-agent")
                .into_iter()
                .filter_map(|pid| Some((n.name.to_owned(), super::daemon_usage(pid)?.rss_kib)))
        })
        .collect()
}

/// The agent's count of pods it knows cluster-wide, from its metrics, if it exports one.
fn cluster_pods_seen(n: &Node) -> Option<u64> {
    let metrics = Place::Net(n.ns())
        .run(&[
            "curl",
            "-sS",
            "--max-time",
            "2",
            "http://127.0.0.1:9641/metrics",
        ])
        .ok()?;
    metrics
        .lines()
        .find(|l| l.starts_with("flock_policy_cluster_pods "))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<f64>().ok())
        .map(|v| v as u64)
}

/// Creates the scale run's objects: a Node with no machine behind it (tainted, nothing runs),
/// 10,000 pods bound to it in 100 namespaces and 1,000 NetworkPolicies in them. Returns how
/// long the creation took. `clean_up` (or the cluster's removal) takes them away again.
pub(crate) fn load_scale() -> Result<Duration> {
    kubectl_stdin(
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1
kind: Node
metadata: {{ name: {SCALE_NODE}, labels: {{ flock.fritzlab.net/life-test: policy-scale }} }}
spec:
  taints: [{{ key: flock.fritzlab.net/no-machine, effect: NoSchedule }}]
"
        ),
    )?;
    let t = Instant::now();
    // The namespaces first, and their `default` ServiceAccounts awaited: the apiserver refuses
    // a pod whose ServiceAccount the controller manager has not made yet (a CI run had all of
    // one namespace's pods refused, created in the same apply as the namespace).
    kubectl_stdin(&["apply", "-f", "-"], &scale_namespaces())?;
    let mut accounts = 0;
    sys::wait_for(Duration::from_secs(120), || {
        accounts = kubectl(&[
            "get",
            "serviceaccounts",
            "-A",
            "--field-selector",
            "metadata.name=default",
            "-o",
            "jsonpath={.items[*].metadata.namespace}",
        ])
        .map(|o| {
            o.split_whitespace()
                .filter(|n| n.starts_with("scale-"))
                .count()
        })
        .unwrap_or(0);
        accounts >= SCALE_NAMESPACES
    })
    .with_context(|| {
        format!("{accounts} of the {SCALE_NAMESPACES} scale namespaces have their default ServiceAccount")
    })?;
    // Four writers at once; each namespace is one `kubectl apply` of its 110 objects.
    let namespaces: Vec<usize> = (0..SCALE_NAMESPACES).collect();
    on_four_workers(&namespaces, |ns| {
        kubectl_stdin(&["apply", "-f", "-"], &scale_manifests(*ns)).map(drop)
    })
    .context("creating the scale run's objects")?;
    Ok(t.elapsed())
}

fn memory(out: &mut String, failures: &mut Vec<String>) -> Result<()> {
    let before = agent_rss();
    if before.len() != NODES.len() {
        bail!(
            "found {} flock agents' processes, want {}",
            before.len(),
            NODES.len()
        );
    }
    let created = load_scale()?;
    let total = SCALE_NAMESPACES * SCALE_PODS;
    // The agents have them when their count says so (or, without that metric, after a
    // settling pause); then their memory is read.
    let counted = sys::wait_for(Duration::from_secs(120), || {
        NODES
            .iter()
            .all(|n| cluster_pods_seen(n).is_none_or(|c| c as usize >= total))
    });
    if counted.is_err() {
        failures.push(format!(
            "policy: the agents did not count {total} cluster pods in 120 s: {:?}",
            NODES.iter().map(cluster_pods_seen).collect::<Vec<_>>()
        ));
    }
    std::thread::sleep(Duration::from_secs(10));
    let after = agent_rss();
    let mut rows = Vec::new();
    for (node, kib) in &after {
        let was = before
            .iter()
            .find(|(n, _)| n == node)
            .map_or(0, |(_, k)| *k);
        rows.push(vec![
            node.clone(),
            format!("{:.1} MiB", was as f64 / 1024.0),
            format!("{:.1} MiB", *kib as f64 / 1024.0),
        ]);
    }
    let _ = writeln!(
        out,
        "AGENT MEMORY ({total} pods in {SCALE_NAMESPACES} namespaces bound to a Node with no machine, \
         {} NetworkPolicies; created in {:.0} s; VmRSS of each agent)",
        SCALE_NAMESPACES * SCALE_POLICIES,
        created.as_secs_f64()
    );
    sys::table(out, &["agent", "before", "with them"], &rows);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_round_has_an_address_of_its_own() {
        let seen: Vec<String> = (0..=2 * ROUNDS).map(block_seen).collect();
        for (i, s) in seen.iter().enumerate() {
            for (j, t) in seen.iter().enumerate() {
                assert!(
                    i == j || !format!("2001:db8{t}").contains(s.as_str()),
                    "{s} in {t}"
                );
            }
        }
        assert_eq!(block(10), "2001:db8:c9:a::1/128");
    }

    /// Lines as the monitor stamps them (with the space it appends), one second apart.
    fn stamped(lines: &[&str]) -> (Instant, Vec<(Instant, String)>) {
        let start = Instant::now();
        let stamped = lines
            .iter()
            .enumerate()
            .map(|(i, l)| (start + Duration::from_secs(i as u64), format!("{l} ")))
            .collect();
        (start, stamped)
    }

    #[test]
    fn a_kube_proxy_commit_is_not_flock_s_whole_table() {
        let kube_proxy = [
            "add rule ip kube-proxy services ip daddr 10.96.0.10 tcp dport 53 goto service-ULMVA6XW-kube-system/kube-dns/tcp/dns-tcp",
            "add element ip kube-proxy cluster-ips { 10.96.0.10 }",
            "# new generation 41 by process 5120 (nft)",
        ];
        // kube-proxy's commit, then the agent's batch whose line came late: the agent's.
        let (start, lines) = stamped(
            &[
                &kube_proxy[..],
                &[
                    "W: Unable to cache set_elem. Set not found.",
                    "# new generation 42 by process 700 (flock-agent)",
                ],
            ]
            .concat(),
        );
        assert_eq!(
            commit_of(&lines),
            Some(Member::Element(start + Duration::from_secs(4)))
        );
        // Until that line comes, neither.
        assert_eq!(commit_of(&lines[..3]), None);
        // The agent's table replaced by `nft -f`.
        let (start, lines) = stamped(
            &[
                &kube_proxy[..],
                &[
                    "delete table inet flock_policy",
                    "add table inet flock_policy",
                    "add element inet flock_policy pods0_v6 { 2001:db8:1::2 }",
                    "# new generation 42 by process 701 (nft)",
                ],
            ]
            .concat(),
        );
        assert_eq!(
            commit_of(&lines),
            Some(Member::WholeTable(
                start + Duration::from_secs(6),
                "delete table inet flock_policy".to_owned()
            ))
        );
    }

    #[test]
    fn a_scale_namespace_has_its_pods_and_policies() {
        let m = scale_manifests(7);
        assert_eq!(m.matches("kind: Pod\n").count(), SCALE_PODS);
        assert_eq!(m.matches("kind: NetworkPolicy").count(), SCALE_POLICIES);
        assert!(
            m.contains("namespace: scale-007") && m.contains(&format!("nodeName: {SCALE_NODE}"))
        );
        let n = scale_namespaces();
        assert_eq!(n.matches("kind: Namespace\n").count(), SCALE_NAMESPACES);
        assert!(n.contains(
            "name: scale-007, labels: { flock.fritzlab.net/life-test: policy-scale, team: t7 }"
        ));
    }
}
