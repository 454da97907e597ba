//! `cargo xtask bench cluster`: flock beside the pod networks a user would install instead,
//! each on the same cluster (two nodes, the router, the control plane, kube-proxy, the
//! workloads; only the pod network differs), the same scenarios against each, one table of
//! ratios (peer ÷ flock) into `BENCHMARKS.md`.
//!
//! The setups: flock; kube-router (routes over BGP, NetworkPolicy in iptables); `ptp` +
//! `host-local` with kube-network-policies (NetworkPolicy as a userspace verdict on a
//! connection's first packet). Each round brings every setup up in turn (`cluster up --cni …`,
//! whose checks are each peer's smoke check: a setup whose cluster fails them gives no
//! figure), runs the scenarios and takes it down; the setups' order turns from round to round,
//! so that the machine's drift does not land in one setup. Two clusters do not fit on this
//! machine at once, so a pair interleaves by rounds, not within a scenario. Each figure is the
//! median of the rounds, with their min and max.
//!
//! - **burst**: a Deployment scaled 0 → 50 on node1: time to all Ready, and the sandboxes'
//!   set-up (containerd's `RunPodSandbox`, CNI ADD included) p50 / p99.
//! - **policy**: 100 pods on node1 isolated by a NetworkPolicy, a client pod on node2. A prober
//!   in the client's network namespace begins a TCP connection to a target every 2 ms
//!   ([`probe`]); a change is enforced from the first connection, begun after its request to
//!   the apiserver, of the run of connections with the new outcome that holds (300 ms and
//!   on: a transient refusal while a CNI rewrites its rules is not the change). Each round changes the policy's peer (between the
//!   client's label and one it lacks) and the client's label, each both ways; and times new
//!   connections' set-up with no policy and with one admitting the client (a verdict in
//!   userspace costs there).
//! - **rollout**: the pod network's DaemonSet restarted (`kubectl rollout restart`) while a pod
//!   on each node pings the other every 50 ms over both families and GETs the `web` Service.
//! - **freeze**: node2's BGP speaker (flock's BIRD, kube-router) stopped (SIGSTOP), as a hung
//!   node: the time until the router withdraws node2's pod routes; then thawed. `ptp` has
//!   static routes: nothing to withdraw.
//! - **netpol** (the first round): the upstream `[sig-network] Netpol` suite, dual-stack pods.
//! - **scale**: 10,000 pods in 100 namespaces bound to a Node with no machine and 1,000
//!   NetworkPolicies: the memory (VmRSS) of the pod network's daemons on a node with them, and
//!   the CPU seconds they spent taking them in (until their CPU is quiet).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::cni::{Cni, Policy};
use super::life::{self, percentile, pods};
use super::{NODES, Node, UpOptions, kubectl, kubectl_stdin, site};
use crate::sys;

pub mod probe;

use probe::Prober;

const USAGE: &str = "usage: cargo xtask bench cluster [--rounds R] [--setups flock,kube-router,ptp+kube-network-policies] [--bins DIR] [--no-netpol] [--no-write]
       cargo xtask bench cluster --on-cluster-up [--only burst,policy,rollout,freeze,netpol,scale]
         (the scenarios once against the cluster that is up, printed, nothing written)";

/// The scenarios, in the order a round runs them (`scale` last: its 10,000 pods stay until the
/// cluster goes).
const SCENARIOS: [&str; 6] = ["burst", "policy", "rollout", "freeze", "netpol", "scale"];

/// The section of `BENCHMARKS.md` this writes.
const BEGIN: &str = "<!-- bench-cluster:begin (written by `cargo xtask bench cluster`) -->";
const END: &str = "<!-- bench-cluster:end -->";

/// Policy changes of each kind per round (each both ways: 2 × this samples).
const POLICY_CHANGES: usize = 10;
/// Pods the policy isolates.
const TARGETS: usize = life::policy::TARGETS;
const POLICY_NS: &str = "bench-policy";
/// How long a change may take to be enforced before it counts as never.
const ENFORCE_LIMIT: Duration = Duration::from_secs(10);
/// How long a frozen speaker stays frozen at most (a peer's graceful restart keeps the
/// routes for its restart time after the hold time).
const FREEZE_LIMIT: Duration = Duration::from_secs(150);

/// One pod network under comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Setup {
    cni: Cni,
    policy: Option<Policy>,
}

impl Setup {
    const ALL: [Setup; 3] = [
        Setup {
            cni: Cni::Flock,
            policy: None,
        },
        Setup {
            cni: Cni::KubeRouter,
            policy: None,
        },
        Setup {
            cni: Cni::Ptp,
            policy: Some(Policy::KubeNetworkPolicies),
        },
    ];

    fn label(self) -> String {
        match self.policy {
            Some(p) => format!("{}+{}", self.cni.as_str(), p.as_str()),
            None => self.cni.as_str().to_owned(),
        }
    }

    fn parse(s: &str) -> Result<Setup> {
        Setup::ALL
            .into_iter()
            .find(|setup| setup.label() == s)
            .with_context(|| {
                format!(
                    "--setups: {s:?} is none of {}",
                    Setup::ALL.map(Setup::label).join(", ")
                )
            })
    }

    /// The processes of its pod network on a node (their `comm`).
    fn daemons(self) -> &'static [&'static str] {
        match (self.cni, self.policy) {
            (Cni::Flock, _) => &["flock-agent", "bird"],
            (Cni::KubeRouter, _) => &["kube-router"],
            (Cni::Ptp, Some(Policy::KubeNetworkPolicies)) => &["netpol"],
            (Cni::Ptp, None) => &[],
        }
    }

    /// Its BGP speaker's `comm`, if it speaks BGP.
    fn speaker(self) -> Option<&'static str> {
        match self.cni {
            Cni::Flock => Some("bird"),
            Cni::KubeRouter => Some("kube-router"),
            Cni::Ptp => None,
        }
    }

    /// The DaemonSet (in kube-system) of its node agent.
    fn daemonset(self) -> Option<&'static str> {
        match (self.cni, self.policy) {
            (Cni::Flock, _) => Some("flock"),
            (Cni::KubeRouter, _) => Some("kube-router"),
            (Cni::Ptp, Some(Policy::KubeNetworkPolicies)) => Some("kube-network-policies"),
            (Cni::Ptp, None) => None,
        }
    }
}

struct Options {
    /// Against the cluster that is up, once (`--on-cluster-up`).
    on_cluster_up: bool,
    /// The scenarios to run (`--only`; every one unless named).
    only: Vec<String>,
    rounds: usize,
    setups: Vec<Setup>,
    bins: Option<PathBuf>,
    netpol: bool,
    write: bool,
}

fn parse_options(args: &[String]) -> Result<Options> {
    let mut opts = Options {
        on_cluster_up: false,
        only: SCENARIOS.map(String::from).to_vec(),
        rounds: 3,
        setups: Setup::ALL.to_vec(),
        bins: None,
        netpol: true,
        write: true,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .with_context(|| format!("{name} needs a value\n{USAGE}"))
        };
        match arg.as_str() {
            "--rounds" => {
                let v = value("--rounds")?;
                opts.rounds =
                    v.parse().ok().filter(|r| *r >= 1).with_context(|| {
                        format!("--rounds {v:?}: a number of rounds, at least 1")
                    })?;
            }
            "--setups" => {
                opts.setups = value("--setups")?
                    .split(',')
                    .map(Setup::parse)
                    .collect::<Result<_>>()?;
            }
            "--bins" => opts.bins = Some(PathBuf::from(value("--bins")?)),
            "--no-netpol" => opts.netpol = false,
            "--on-cluster-up" => opts.on_cluster_up = true,
            "--only" => {
                opts.only = value("--only")?.split(',').map(str::to_owned).collect();
                if let Some(bad) = opts.only.iter().find(|s| !SCENARIOS.contains(&s.as_str())) {
                    bail!("--only: {bad:?} is none of {}", SCENARIOS.join(", "));
                }
            }
            "--no-write" => opts.write = false,
            other => bail!("unknown bench cluster argument {other:?}\n{USAGE}"),
        }
    }
    if !opts.on_cluster_up && opts.only.len() != SCENARIOS.len() {
        bail!("--only goes with --on-cluster-up: a table's rounds run every scenario");
    }
    if !opts.on_cluster_up && !opts.setups.contains(&Setup::ALL[0]) {
        bail!("--setups: the ratios are to flock, which must be among them");
    }
    Ok(opts)
}

/// What one setup gave in each round (a scenario that failed leaves its figure out).
#[derive(Default)]
struct Figures {
    up: Vec<Duration>,
    ready: Vec<Duration>,
    sandbox_p50: Vec<Duration>,
    sandbox_p99: Vec<Duration>,
    policy_p50: Vec<Duration>,
    policy_p99: Vec<Duration>,
    label_p50: Vec<Duration>,
    label_p99: Vec<Duration>,
    connect_open: Vec<Duration>,
    connect_policy: Vec<Duration>,
    withdrawn: Vec<Duration>,
    pings_lost: Vec<f64>,
    gets_failed: Vec<f64>,
    rss_idle_mib: Vec<f64>,
    rss_mib: Vec<f64>,
    cpu_s: Vec<f64>,
    /// Whether an IPv4 connection the policy admits connects (once a round).
    ipv4_admitted: Vec<bool>,
    /// The Netpol suite: (passed, failed).
    netpol: Option<(usize, usize)>,
    failures: Vec<String>,
}

/// `cargo xtask bench cluster ARGS…`.
pub fn run(args: &[String]) -> Result<()> {
    sys::require_root("cargo xtask bench cluster")?;
    let opts = parse_options(args)?;
    if opts.on_cluster_up {
        return on_cluster_up(&opts);
    }
    let started = Instant::now();
    let commit = head_commit();
    let bins = match &opts.bins {
        Some(dir) => dir.clone(),
        None => crate::binaries::build(crate::binaries::FLOCK, true)?,
    };
    let mut figures: Vec<(Setup, Figures)> = opts
        .setups
        .iter()
        .map(|s| (*s, Figures::default()))
        .collect();
    for round in 0..opts.rounds {
        let n = figures.len();
        for i in 0..n {
            let (setup, f) = &mut figures[(i + round) % n];
            eprintln!(
                "bench cluster: round {} of {}: {} …",
                round + 1,
                opts.rounds,
                setup.label()
            );
            let t = Instant::now();
            let result = one_round(*setup, &bins, round == 0 && opts.netpol, f);
            if let Err(e) = result {
                f.failures.push(format!("round {}: {e:#}", round + 1));
            }
            let down = super::down();
            if let Err(e) = down {
                f.failures
                    .push(format!("round {}: cluster down: {e:#}", round + 1));
            }
            eprintln!(
                "bench cluster: round {} of {}: {}: done in {:.0} s",
                round + 1,
                opts.rounds,
                setup.label(),
                t.elapsed().as_secs_f64()
            );
        }
    }
    let section = render(&figures, &opts, &commit, started.elapsed());
    print!("{section}");
    if opts.write {
        let path = super::repo_root().join("BENCHMARKS.md");
        crate::bench::report::write_between(&path, BEGIN, END, &section)?;
        eprintln!("bench cluster: written into {}", path.display());
    }
    let failures: Vec<String> = figures
        .iter()
        .flat_map(|(s, f)| {
            f.failures
                .iter()
                .map(move |e| format!("{}: {e}", s.label()))
        })
        .collect();
    if !failures.is_empty() {
        bail!(
            "bench cluster: {} scenario(s) failed:\n  {}",
            failures.len(),
            failures.join("\n  ")
        );
    }
    Ok(())
}

/// One setup's round: its cluster up (and checked), every scenario, a failed one noted and
/// the next run. Fails only when the cluster does not come up.
fn one_round(setup: Setup, bins: &std::path::Path, netpol: bool, f: &mut Figures) -> Result<()> {
    let options = UpOptions {
        bins: Some(bins.to_owned()),
        cni: setup.cni,
        policy: setup.policy,
        ..UpOptions::default()
    };
    let t = Instant::now();
    super::up(bins, &options, t).context("cluster up (its checks are the smoke check)")?;
    f.up.push(t.elapsed());
    let names: Vec<&str> = SCENARIOS
        .into_iter()
        .filter(|s| netpol || *s != "netpol")
        .collect();
    scenarios(setup, &names, f);
    Ok(())
}

/// Runs the scenarios `names` on the cluster that is up, a failed one noted in `f` and the
/// next run.
fn scenarios(setup: Setup, names: &[&str], f: &mut Figures) {
    for what in names {
        let t = Instant::now();
        let result = match *what {
            "burst" => burst(f),
            "policy" => policy(f),
            "rollout" => rollout(setup, f),
            "freeze" => freeze(setup, f),
            "netpol" => netpol_suite(f),
            "scale" => scale(setup, f),
            other => Err(anyhow::anyhow!("no scenario {other:?}")),
        };
        if let Err(e) = result {
            f.failures.push(format!("{what}: {e:#}"));
        }
        eprintln!(
            "bench cluster: {}: {what}: done in {:.1} s",
            setup.label(),
            t.elapsed().as_secs_f64()
        );
    }
}

/// `--on-cluster-up`: the scenarios once against the cluster that is up, printed.
fn on_cluster_up(opts: &Options) -> Result<()> {
    if !std::path::Path::new(super::RUN_DIR).exists() {
        bail!("no cluster is up: `cargo xtask cluster up` first");
    }
    let setup = Setup {
        cni: Cni::current(),
        policy: Policy::current(),
    };
    let mut f = Figures::default();
    let names: Vec<&str> = opts.only.iter().map(String::as_str).collect();
    scenarios(setup, &names, &mut f);
    let one = Options {
        rounds: 1,
        ..parse_options(&[]).expect("the defaults parse")
    };
    // The table's first column is flock's: a peer's figures go beside an empty one.
    let figures = if setup.cni == Cni::Flock {
        vec![(setup, f)]
    } else {
        vec![(Setup::ALL[0], Figures::default()), (setup, f)]
    };
    print!("{}", render(&figures, &one, &head_commit(), Duration::ZERO));
    Ok(())
}

// ---------------------------------------------------------------------------------------
// burst

fn burst(f: &mut Figures) -> Result<()> {
    let (ready, mut sandboxes, _) = life::startup::burst("bench-burst", &NODES[0])?;
    if sandboxes.len() != life::startup::BURST {
        bail!(
            "{} RunPodSandbox pairs in containerd's log for {} pods",
            sandboxes.len(),
            life::startup::BURST
        );
    }
    sandboxes.sort();
    f.ready.push(ready);
    f.sandbox_p50.push(percentile(&sandboxes, 0.5));
    f.sandbox_p99.push(percentile(&sandboxes, 0.99));
    Ok(())
}

// ---------------------------------------------------------------------------------------
// policy

/// The policy isolating the targets, admitting the pods labelled `key=client`: `app` is the
/// client's own label (open), `role` one it has only while a round gives it (closed then).
fn policy_object(key: &str) -> String {
    format!(
        "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {{ name: bench, namespace: {POLICY_NS} }}
spec:
  podSelector: {{ matchLabels: {{ app: target }} }}
  policyTypes: [Ingress]
  ingress:
    - from:
        - podSelector: {{ matchLabels: {{ {key}: client }} }}
"
    )
}

/// One change, timed: `change` sends it (one request to the apiserver), then the time until
/// the first connection begun after it has outcome `open`.
fn enforced(prober: &Prober, open: bool, change: impl FnOnce() -> Result<()>) -> Result<Duration> {
    prober.active(true);
    let was = prober.state(10);
    let result = (|| {
        if was? == open {
            bail!(
                "the client's connections are {} before the change",
                if open { "open" } else { "closed" }
            );
        }
        let t = Instant::now();
        change()?;
        let at = prober.settled(t, open, ENFORCE_LIMIT).with_context(|| {
            format!(
                "not {} within {} s",
                if open { "opened" } else { "closed" },
                ENFORCE_LIMIT.as_secs()
            )
        })?;
        Ok(at.saturating_duration_since(t))
    })();
    prober.active(false);
    prober.clear();
    result
}

/// Connect times of new connections over `window`.
fn connect_times(prober: &Prober, window: Duration) -> Result<Vec<Duration>> {
    prober.active(true);
    let from = Instant::now();
    std::thread::sleep(window);
    let to = Instant::now();
    prober.active(false);
    std::thread::sleep(probe::TIMEOUT * 2);
    let attempts = prober.attempts(from, to);
    prober.clear();
    let mut times: Vec<Duration> = attempts.iter().filter_map(|a| a.connected).collect();
    if times.len() * 10 < attempts.len() * 9 {
        bail!(
            "{} of {} connections to an open target failed",
            attempts.len() - times.len(),
            attempts.len()
        );
    }
    times.sort();
    Ok(times)
}

fn merge_patch(path: &str, body: &str) -> Result<()> {
    life::policy::api("PATCH", path, "application/merge-patch+json", body).map(drop)
}

fn policy(f: &mut Figures) -> Result<()> {
    // A namespace left by a round that failed goes first.
    kubectl(&[
        "delete",
        "namespace",
        POLICY_NS,
        "--ignore-not-found",
        "--wait=true",
    ])?;
    kubectl_stdin(
        &["apply", "-f", "-"],
        &life::policy::targets_and_client(POLICY_NS),
    )?;
    sys::wait_for(Duration::from_secs(300), || {
        pods(POLICY_NS, "app in (target, client)")
            .is_ok_and(|p| p.len() == TARGETS + 1 && p.iter().all(|p| p.ready && !p.ips.is_empty()))
    })
    .with_context(|| format!("{TARGETS} target pods and the client Ready in {POLICY_NS}"))?;
    let target = pods(POLICY_NS, "app=target")?
        .into_iter()
        .next()
        .context("a target pod")?;
    // IPv6, the cluster's first family; that the other is admitted too is a row of its own.
    let address = |v6: bool| -> Result<std::net::IpAddr> {
        target
            .ips
            .iter()
            .filter_map(|ip| ip.parse::<std::net::IpAddr>().ok())
            .find(|ip| ip.is_ipv6() == v6)
            .with_context(|| {
                format!(
                    "{} has no IPv{} address: {:?}",
                    target.name,
                    if v6 { 6 } else { 4 },
                    target.ips
                )
            })
    };
    let (target4, target6) = (address(false)?, address(true)?);
    let container = kubectl(&[
        "-n",
        POLICY_NS,
        "get",
        "pod",
        "client",
        "-o",
        "jsonpath={.status.containerStatuses[0].containerID}",
    ])?;
    let id = container
        .trim()
        .strip_prefix("containerd://")
        .with_context(|| format!("the client's container ID {container:?}"))?;
    let pid = probe::container_pid(id)?;
    let prober = Prober::start(pid, (target6, 80).into())?;
    let prober4 = Prober::start(pid, (target4, 80).into())?;

    let open = connect_times(&prober, Duration::from_secs(1)).context("no policy")?;
    kubectl_stdin(&["apply", "-f", "-"], &policy_object("role"))?;
    prober.active(true);
    sys::wait_for(Duration::from_secs(30), || {
        prober.state(10).is_ok_and(|open| !open)
    })
    .context("the target is not isolated 30 s after the policy's creation")?;
    prober.active(false);
    prober.clear();

    let policy_path =
        format!("/apis/networking.k8s.io/v1/namespaces/{POLICY_NS}/networkpolicies/bench");
    let peer = |key: &str| {
        format!(
            r#"{{"spec":{{"ingress":[{{"from":[{{"podSelector":{{"matchLabels":{{"{key}":"client"}}}}}}]}}]}}}}"#
        )
    };
    let client_path = format!("/api/v1/namespaces/{POLICY_NS}/pods/client");
    let label = |v: &str| format!(r#"{{"metadata":{{"labels":{{"role":{v}}}}}}}"#);
    let (mut by_policy, mut by_label, mut with_policy) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..POLICY_CHANGES {
        // The policy's peer: the client's own label (open), then one it lacks (closed).
        by_policy.push(
            enforced(&prober, true, || merge_patch(&policy_path, &peer("app")))
                .context("policy change, opening")?,
        );
        with_policy.extend(connect_times(&prober, Duration::from_millis(300))?);
        if by_policy.len() == 1 {
            prober4.active(true);
            let open4 = prober4.state(10);
            prober4.active(false);
            f.ipv4_admitted.push(matches!(open4, Ok(true)));
        }
        by_policy.push(
            enforced(&prober, false, || merge_patch(&policy_path, &peer("role")))
                .context("policy change, closing")?,
        );
        // The client's label: given (open), then taken away (closed).
        by_label.push(
            enforced(&prober, true, || {
                merge_patch(&client_path, &label(r#""client""#))
            })
            .context("label change, opening")?,
        );
        by_label.push(
            enforced(&prober, false, || merge_patch(&client_path, &label("null")))
                .context("label change, closing")?,
        );
    }
    drop((prober, prober4));
    for v in [&mut by_policy, &mut by_label, &mut with_policy] {
        v.sort();
    }
    f.policy_p50.push(percentile(&by_policy, 0.5));
    f.policy_p99.push(percentile(&by_policy, 0.99));
    f.label_p50.push(percentile(&by_label, 0.5));
    f.label_p99.push(percentile(&by_label, 0.99));
    f.connect_open.push(percentile(&open, 0.5));
    f.connect_policy.push(percentile(&with_policy, 0.5));
    kubectl(&["delete", "namespace", POLICY_NS, "--wait=false"])?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// rollout

fn rollout(setup: Setup, f: &mut Figures) -> Result<()> {
    let Some(ds) = setup.daemonset() else {
        return Ok(());
    };
    let (a, b, service) = life::upgrade::probers()?;
    let (a, b) = (&a, &b);
    for (from, to) in [(a, b), (b, a)] {
        life::upgrade::start_probe(&from.name, &to.ips, &service)?;
    }
    std::thread::sleep(Duration::from_secs(2));
    kubectl(&[
        "-n",
        "kube-system",
        "rollout",
        "restart",
        &format!("ds/{ds}"),
    ])?;
    let rolled = kubectl(&[
        "-n",
        "kube-system",
        "rollout",
        "status",
        &format!("ds/{ds}"),
        "--timeout=300s",
    ]);
    std::thread::sleep(Duration::from_secs(2));
    let (mut lost, mut failed) = (0, 0);
    for (from, to) in [(a, b), (b, a)] {
        let (pings, (_, bad)) = life::upgrade::stop_probe(&from.name, to.ips.len())?;
        lost += pings
            .iter()
            .map(|(sent, got)| sent.saturating_sub(*got))
            .sum::<u64>();
        failed += bad;
    }
    rolled.with_context(|| format!("ds/{ds} not rolled out in 300 s"))?;
    f.pings_lost.push(lost as f64);
    f.gets_failed.push(failed as f64);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// freeze

fn freeze(setup: Setup, f: &mut Figures) -> Result<()> {
    let Some(speaker) = setup.speaker() else {
        return Ok(());
    };
    let n = &NODES[1];
    sys::wait_for(Duration::from_secs(60), || site::router_paths(n.cidr6) > 0)
        .with_context(|| format!("the router has no route to {}", n.cidr6))?;
    let pid = life::pid_in(n, speaker)?;
    life::signal(pid, nix::sys::signal::Signal::SIGSTOP)?;
    let withdrawn = sys::time_until(FREEZE_LIMIT, || site::router_paths(n.cidr6) == 0);
    life::signal(pid, nix::sys::signal::Signal::SIGCONT)?;
    let back = sys::wait_for(Duration::from_secs(180), || site::router_paths(n.cidr6) > 0);
    let withdrawn = withdrawn.with_context(|| {
        format!(
            "the router still routes {} {} s after {speaker} froze",
            n.cidr6,
            FREEZE_LIMIT.as_secs()
        )
    })?;
    back.with_context(|| format!("{}'s routes not back 180 s after the thaw", n.name))?;
    f.withdrawn.push(withdrawn);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// netpol

fn netpol_suite(f: &mut Figures) -> Result<()> {
    let args = ["--suite", "networkpolicy", "--pods", "dual"].map(String::from);
    // A failed spec fails the run; the counts are what the table wants.
    let run = super::e2e::run(&args);
    let counts = super::e2e::last_run_counts()?;
    if counts.0 + counts.1 == 0 {
        run?;
        bail!("the Netpol suite ran no spec");
    }
    f.netpol = Some(counts);
    Ok(())
}

// ---------------------------------------------------------------------------------------
// scale

/// The pod network's daemons on node `n`: their summed usage.
fn usage(setup: Setup, n: &Node) -> Result<life::Usage> {
    let mut sum = life::Usage {
        rss_kib: 0,
        cpu_s: 0.0,
    };
    for comm in setup.daemons() {
        let pids = life::daemons_in(n, comm);
        let [pid] = pids.as_slice() else {
            bail!("{} processes {comm} on {}: {pids:?}", pids.len(), n.name);
        };
        let u = life::daemon_usage(*pid).with_context(|| format!("{comm} ({pid}) is gone"))?;
        sum.rss_kib += u.rss_kib;
        sum.cpu_s += u.cpu_s;
    }
    Ok(sum)
}

fn scale(setup: Setup, f: &mut Figures) -> Result<()> {
    if setup.daemons().is_empty() {
        return Ok(());
    }
    let per_node =
        || -> Result<Vec<life::Usage>> { NODES.iter().map(|n| usage(setup, n)).collect() };
    let before = per_node()?;
    life::policy::load_scale()?;
    // Taken in when the daemons' CPU is quiet: under 2 % of a core over 5 s.
    let mut last = per_node()?;
    let quiet = sys::wait_for(Duration::from_secs(300), || {
        std::thread::sleep(Duration::from_secs(5));
        let now = per_node().unwrap_or_default();
        let busy = now.iter().zip(&last).any(|(n, l)| n.cpu_s - l.cpu_s > 0.1);
        last = now;
        !busy && last.len() == NODES.len()
    });
    quiet.context("the daemons' CPU not quiet 300 s after the objects were created")?;
    let mean = |v: &[life::Usage], g: fn(&life::Usage) -> f64| {
        v.iter().map(g).sum::<f64>() / v.len() as f64
    };
    f.rss_idle_mib
        .push(mean(&before, |u| u.rss_kib as f64 / 1024.0));
    f.rss_mib.push(mean(&last, |u| u.rss_kib as f64 / 1024.0));
    f.cpu_s
        .push(mean(&last, |u| u.cpu_s) - mean(&before, |u| u.cpu_s));
    Ok(())
}

// ---------------------------------------------------------------------------------------
// the table

/// The checkout's commit (short), `-dirty` when it has changes.
fn head_commit() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(super::repo_root())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let head = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    match git(&["status", "--porcelain", "--untracked-files=no"]) {
        Some(s) if !s.is_empty() => format!("{head}-dirty"),
        _ => head,
    }
}

/// median (min–max) of a row's rounds.
fn summary(v: &[f64]) -> Option<(f64, f64, f64)> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    Some((s[s.len() / 2], s[0], s[s.len() - 1]))
}

fn fmt_value(v: f64, unit: &str) -> String {
    let digits = if v.abs() >= 100.0 {
        0
    } else if v.abs() >= 10.0 {
        1
    } else {
        2
    };
    format!("{v:.digits$}{unit}")
}

fn cell(v: &[f64], unit: &str) -> String {
    match summary(v) {
        None => "—".to_owned(),
        Some((m, lo, hi)) if v.len() > 1 => format!(
            "{} ({}–{})",
            fmt_value(m, unit),
            fmt_value(lo, ""),
            fmt_value(hi, "")
        ),
        Some((m, _, _)) => fmt_value(m, unit),
    }
}

fn ratio(peer: &[f64], flock: &[f64]) -> String {
    match (summary(peer), summary(flock)) {
        (Some((p, _, _)), Some((f, _, _))) if f > 0.0 => format!("{:.2}", p / f),
        (Some((p, _, _)), Some((f, _, _))) if f == 0.0 && p == 0.0 => "1 (both 0)".to_owned(),
        (Some(_), Some(_)) => "∞ (flock 0)".to_owned(),
        _ => "—".to_owned(),
    }
}

fn ms(v: &[Duration]) -> Vec<f64> {
    v.iter().map(|d| d.as_secs_f64() * 1000.0).collect()
}

fn secs(v: &[Duration]) -> Vec<f64> {
    v.iter().map(Duration::as_secs_f64).collect()
}

/// The section: what ran, then the table (`commit`: flock's, as the run began).
fn render(figures: &[(Setup, Figures)], opts: &Options, commit: &str, took: Duration) -> String {
    let mut out = String::new();
    let kube = crate::versions::Kubernetes::newest();
    let _ = writeln!(
        out,
        "Run of {} ({} round(s), {:.0} min; every figure the median of the rounds, min–max in \
         brackets; ratio = peer ÷ flock, above 1 flock is ahead on every row but the Netpol \
         suite's passes).\n\nMachine: {}. Kubernetes {kube}, containerd {}, flock {} (release \
         build), kube-router {}, kube-network-policies {} over ptp + host-local {}.\n",
        crate::bench::report::utc_now(),
        opts.rounds,
        took.as_secs_f64() / 60.0,
        crate::bench::report::machine_line(),
        crate::versions::CONTAINERD,
        commit,
        crate::versions::KUBE_ROUTER,
        crate::versions::KUBE_NETWORK_POLICIES,
        crate::versions::CNI_PLUGINS,
    );
    type Row = (&'static str, fn(&Figures) -> Vec<f64>, &'static str);
    let rows: [Row; 16] = [
        ("cluster up, checks passed", |f| secs(&f.up), " s"),
        (
            "50 pods on one node: all Ready after",
            |f| secs(&f.ready),
            " s",
        ),
        (
            "50 pods: sandbox set-up p50 (containerd)",
            |f| ms(&f.sandbox_p50),
            " ms",
        ),
        ("50 pods: sandbox set-up p99", |f| ms(&f.sandbox_p99), " ms"),
        (
            "policy change → enforced, 100 pods, p50",
            |f| ms(&f.policy_p50),
            " ms",
        ),
        (
            "policy change → enforced, p99",
            |f| ms(&f.policy_p99),
            " ms",
        ),
        (
            "pod label change → enforced, p50",
            |f| ms(&f.label_p50),
            " ms",
        ),
        (
            "pod label change → enforced, p99",
            |f| ms(&f.label_p99),
            " ms",
        ),
        (
            "new connection's set-up, no policy (median)",
            |f| ms(&f.connect_open),
            " ms",
        ),
        (
            "new connection's set-up, admitted by a policy (median)",
            |f| ms(&f.connect_policy),
            " ms",
        ),
        (
            "daemons' RSS per node, idle",
            |f| f.rss_idle_mib.clone(),
            " MiB",
        ),
        (
            "daemons' RSS per node, 10,000 pods and 1,000 policies",
            |f| f.rss_mib.clone(),
            " MiB",
        ),
        (
            "daemons' CPU per node taking them in",
            |f| f.cpu_s.clone(),
            " s",
        ),
        (
            "BGP speaker frozen → router withdraws the node's routes",
            |f| ms(&f.withdrawn),
            " ms",
        ),
        (
            "agent rolled under 50 ms pings: pings lost",
            |f| f.pings_lost.clone(),
            "",
        ),
        (
            "agent rolled: Service GETs failed",
            |f| f.gets_failed.clone(),
            "",
        ),
    ];
    let flock = &figures[0].1;
    let peers = &figures[1..];
    let mut header = vec!["".to_owned(), figures[0].0.label()];
    for (s, _) in peers {
        header.push(s.label());
    }
    for (s, _) in peers {
        header.push(format!("{} ÷ flock", s.label()));
    }
    let _ = writeln!(out, "| {} |", header.join(" | "));
    let _ = writeln!(out, "|{}", "---|".repeat(header.len()));
    for (what, get, unit) in rows {
        let mut cells = vec![what.to_owned(), cell(&get(flock), unit)];
        for (_, f) in peers {
            cells.push(cell(&get(f), unit));
        }
        for (_, f) in peers {
            cells.push(ratio(&get(f), &get(flock)));
        }
        let _ = writeln!(out, "| {} |", cells.join(" | "));
    }
    let netpol = |f: &Figures| {
        f.netpol
            .map_or("—".to_owned(), |(p, x)| format!("{p} passed, {x} failed"))
    };
    let mut cells = vec![
        "upstream `[sig-network] Netpol` suite (first round)".to_owned(),
        netpol(flock),
    ];
    for (_, f) in peers {
        cells.push(netpol(f));
    }
    for (_, f) in peers {
        cells.push(match (f.netpol, flock.netpol) {
            (Some((p, _)), Some((q, _))) if q > 0 => format!("{:.2}", p as f64 / q as f64),
            _ => "—".to_owned(),
        });
    }
    let _ = writeln!(out, "| {} |", cells.join(" | "));
    let admitted = |f: &Figures| {
        let yes = f.ipv4_admitted.iter().filter(|a| **a).count();
        match f.ipv4_admitted.len() {
            0 => "—".to_owned(),
            n if yes == n => "yes".to_owned(),
            n => format!("**no** ({} of {n} rounds)", n - yes),
        }
    };
    let mut cells = vec![
        "IPv4 connection admitted by the policy connects (the rows above probe IPv6)".to_owned(),
        admitted(flock),
    ];
    for (_, f) in peers {
        cells.push(admitted(f));
    }
    for _ in peers {
        cells.push("—".to_owned());
    }
    let _ = writeln!(out, "| {} |", cells.join(" | "));
    out.push('\n');
    let failures: Vec<String> = figures
        .iter()
        .flat_map(|(s, f)| {
            f.failures
                .iter()
                .map(move |e| format!("{}: {e}", s.label()))
        })
        .collect();
    if !failures.is_empty() {
        let _ = writeln!(out, "Scenarios that failed (their figures are left out):\n");
        for e in failures {
            let _ = writeln!(out, "- {}", e.lines().next().unwrap_or(""));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn setups_parse_by_label_and_flock_is_required() {
        let o =
            parse_options(&["--setups".into(), "flock,ptp+kube-network-policies".into()]).unwrap();
        assert_eq!(o.setups, vec![Setup::ALL[0], Setup::ALL[2]]);
        let err = parse_options(&["--setups".into(), "kube-router".into()])
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("must be among them"), "{err}");
        let err = parse_options(&["--setups".into(), "calico".into()])
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("\"calico\""), "{err}");
        let err = parse_options(&["--rounds".into(), "0".into()])
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("--rounds \"0\""), "{err}");
    }

    #[test]
    fn a_cell_is_the_median_with_min_and_max() {
        assert_eq!(cell(&[3.0, 1.0, 2.0], " ms"), "2.00 ms (1.00–3.00)");
        assert_eq!(cell(&[], " ms"), "—");
        assert_eq!(cell(&[150.0], " s"), "150 s");
        assert_eq!(ratio(&[4.0, 6.0, 5.0], &[2.0, 2.5, 3.0]), "2.00");
        assert_eq!(ratio(&[0.0], &[0.0]), "1 (both 0)");
        assert_eq!(ratio(&[1.0], &[0.0]), "∞ (flock 0)");
    }

    #[test]
    fn the_table_has_a_ratio_per_peer_and_lists_failures() {
        let flock = Figures {
            policy_p50: vec![Duration::from_millis(20); 3],
            netpol: Some((40, 0)),
            ..Figures::default()
        };
        let kr = Figures {
            policy_p50: vec![Duration::from_millis(60); 3],
            netpol: Some((30, 10)),
            failures: vec!["round 2: freeze: no".into()],
            ..Figures::default()
        };
        let opts = parse_options(&[]).unwrap();
        let text = render(
            &[(Setup::ALL[0], flock), (Setup::ALL[1], kr)],
            &opts,
            "abc1234",
            Duration::from_secs(60),
        );
        assert!(text.contains("flock abc1234 (release build)"), "{text}");
        assert!(
            text.contains("| flock | kube-router | kube-router ÷ flock |"),
            "{text}"
        );
        assert!(
            text.contains("| policy change → enforced, 100 pods, p50 | 20.0 ms (20.0–20.0) | 60.0 ms (60.0–60.0) | 3.00 |"),
            "{text}"
        );
        assert!(
            text.contains("40 passed, 0 failed | 30 passed, 10 failed | 0.75 |"),
            "{text}"
        );
        assert!(
            text.contains("- kube-router: round 2: freeze: no"),
            "{text}"
        );
    }
}
