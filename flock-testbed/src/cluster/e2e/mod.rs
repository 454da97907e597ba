//! `cargo xtask cluster e2e [--focus REGEX] [--skip REGEX]`: Kubernetes' own e2e suite
//! (`e2e.test`, built from the same Kubernetes release as the cluster) against the cluster that
//! is up; with `--suite cluster-network-policy`, SIG Network's ClusterNetworkPolicy conformance
//! suite instead ([`cnp`]).
//!
//! The images the suite's specs run are made here under the exact names that release expects
//! ([`images::build_e2e`]) and imported into both nodes' containerd. `e2e.test` runs in the
//! control plane's namespace with the admin kubeconfig. Specs carrying a tag of [`SKIP_TAGS`]
//! are never run; the specs listed in `e2e/exclusions.txt` (each with its reason) are skipped
//! too. The per-spec result comes from the suite's JUnit report.
//!
//! No internet here: every `[sig-network] Networking` spec first GETs `http://google.com` from
//! the test runner ("basic external connectivity", a pre-test assertion, not a check of the
//! cluster). `e2e.test` gets `HTTP_PROXY` pointing at a stub in the control plane's namespace
//! (agnhost `netexec`, answering 200) and `NO_PROXY` covering every address of the cluster, so
//! only that plain-HTTP request to a name outside the cluster goes to the stub.

use std::io::{BufRead as _, BufReader, Write as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::{CONTROL, NODES, RUN_DIR, images, kube, node, pki, proc};
use crate::sys;

pub mod cnp;
mod families;
mod gotest;
mod junit;

use families::PodFamilies;
pub use families::Pods;
use junit::{EXCLUSIONS, read_junit, regex_escape};
pub use junit::{Exclusion, Outcome, Spec, exclusions, parse_junit};

/// `--suite network` (the default): every sig-network Conformance spec, and the Networking
/// (pod to pod, node to pod, Services' granular checks) and Services specs.
pub const DEFAULT_FOCUS: &str =
    r"\[sig-network\] (Networking|Services) |\[sig-network\].*\[Conformance\]";
/// Tags never run here: slow, serial, disruptive, flaky and feature-gated specs.
pub const SKIP_TAGS: &str = r"\[Slow\]|\[Serial\]|\[Disruptive\]|\[Flaky\]|\[Feature:";
/// `--suite dns`: the DNS specs (CoreDNS answering through the cluster's Service).
pub const DNS_FOCUS: &str = r"\[sig-network\] DNS ";
/// `--suite networkpolicy`: the `Netpol` matrix (3 namespaces × 3 pods, probed through
/// Services with `agnhost connect`), tagged `[Feature:NetworkPolicy]`: a CNI without policy
/// fails them, so that tag is allowed. SCTP is another feature, still skipped.
pub const NETWORKPOLICY_FOCUS: &str = r"\[sig-network\] Netpol ";
const NETWORKPOLICY_SKIP_TAGS: &str =
    r"\[Slow\]|\[Serial\]|\[Disruptive\]|\[Flaky\]|\[Feature:SCTPConnectivity\]";
/// `--suite dualstack`: the dual-stack specs (`[Feature:IPv6DualStack]`, the feature of the
/// whole describe), with dual-stack pods; SCTP still skipped.
pub const DUALSTACK_FOCUS: &str = r"\[Feature:IPv6DualStack\]";
/// The stub "internet" (see the module's docs): agnhost netexec in the control plane's
/// namespace, on the apiserver's address.
const STUB_HTTP_PORT: u16 = 18080;
const STUB_UDP_PORT: u16 = 18081;
/// Every address of the cluster (nodes, pods, services, control plane): never proxied.
const NO_PROXY: &str = "2001:db8::/32,10.0.0.0/8,127.0.0.0/8,::1,localhost";
/// How many `e2e.test` processes share the specs by default: most of a spec is waiting (for
/// pods, for polls), so more processes than cores pay off.
const DEFAULT_PARALLEL: usize = 4;
/// How long the whole suite may run before it is killed.
const LIMIT: Duration = Duration::from_secs(40 * 60);

/// The suite `--suite cluster-network-policy` names: network-policy-api's conformance suite.
pub const CNP_SUITE: &str = "cluster-network-policy";

/// `cargo xtask cluster e2e ARGS…`.
pub fn run(args: &[String]) -> Result<()> {
    sys::require_root("cargo xtask cluster e2e")?;
    let mut suite = "network".to_owned();
    let mut given_focus = None;
    let mut extra_skip = None;
    let mut given_pods = None;
    let mut given_parallel = None;
    let mut features = None;
    let mut cluster_policies = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--focus" => given_focus = Some(it.next().context("--focus needs a regex")?.clone()),
            "--suite" => suite = it.next().context("--suite needs a name")?.clone(),
            "--skip" => extra_skip = Some(it.next().context("--skip needs a regex")?.clone()),
            "--pods" => given_pods = Some(Pods::parse(it.next().map_or("", String::as_str))?),
            "--parallel" => {
                let v = it.next().map_or("", String::as_str);
                given_parallel = Some(
                    v.parse()
                        .ok()
                        .filter(|n| (1..=16).contains(n))
                        .with_context(|| {
                            format!("--parallel {v:?}: a number of processes, 1 to 16")
                        })?,
                );
            }
            "--features" => features = Some(it.next().context("--features needs a value")?.clone()),
            "--cluster-policies" => cluster_policies = true,
            other => bail!(
                "unknown e2e argument {other:?} (--suite network|dns|networkpolicy|dualstack|\
                 {CNP_SUITE}, --focus REGEX, --skip REGEX, --pods ipv6|dual, --parallel N, \
                 --features standard|all|F1,F2 with {CNP_SUITE}, --cluster-policies)"
            ),
        }
    }
    if !Path::new(RUN_DIR).exists() {
        bail!("no cluster is up: `cargo xtask cluster up` first");
    }
    let (default_focus, skip_tags, default_pods) = match suite.as_str() {
        "network" => (DEFAULT_FOCUS, SKIP_TAGS, Pods::Ipv6),
        "dns" => (DNS_FOCUS, SKIP_TAGS, Pods::Ipv6),
        "networkpolicy" => (NETWORKPOLICY_FOCUS, NETWORKPOLICY_SKIP_TAGS, Pods::Ipv6),
        "dualstack" => (DUALSTACK_FOCUS, NETWORKPOLICY_SKIP_TAGS, Pods::Dual),
        CNP_SUITE => {
            if given_parallel.is_some() {
                bail!("--parallel: the {CNP_SUITE} suite runs its tests one after the other");
            }
            let features = match features {
                Some(f) => cnp::Features::parse(&f)?,
                None => cnp::Features::of_channel(super::deploy::CNP_CHANNEL),
            };
            return cnp::run(&cnp::Options {
                focus: given_focus,
                skip: extra_skip,
                pods: given_pods.unwrap_or(Pods::Ipv6),
                features,
            });
        }
        other => bail!("--suite {other:?}: network, dns, networkpolicy, dualstack or {CNP_SUITE}"),
    };
    if features.is_some() {
        bail!("--features is for --suite {CNP_SUITE}");
    }
    if cluster_policies && suite != "networkpolicy" {
        bail!("--cluster-policies is for --suite networkpolicy");
    }
    let focus = given_focus.unwrap_or_else(|| default_focus.to_owned());
    // A peer's pods are dual-stack as its own configuration makes them: only flock's pools
    // switch IPv4 off for a run.
    let flock = super::cni::Cni::current() == super::cni::Cni::Flock;
    let pods = match given_pods {
        Some(Pods::Ipv6) if !flock => bail!(
            "--pods ipv6: the cluster runs {}, whose pods are dual-stack (--pods dual)",
            super::cni::Cni::current().as_str()
        ),
        Some(p) => p,
        None if flock => default_pods,
        None => Pods::Dual,
    };
    let parallel = given_parallel.unwrap_or(DEFAULT_PARALLEL);
    let excluded = exclusions(EXCLUSIONS)?;
    let kube = kube::ensure_built()?.with_e2e()?;
    super::kubectl(&["get", "nodes"]).context("the cluster does not answer")?;

    let started = Instant::now();
    let archives = super::step("e2e images", || images::build_e2e(&kube))?;
    for n in &NODES {
        for archive in &archives {
            images::import(&kube, &node::containerd_socket(n), archive)
                .with_context(|| format!("import {} on {}", archive.display(), n.name))?;
        }
    }
    let images_took = started.elapsed();

    let mut skip = skip_tags.to_owned();
    for e in &excluded {
        skip.push('|');
        skip.push_str(&regex_escape(&e.spec));
    }
    if let Some(extra) = &extra_skip {
        skip.push('|');
        skip.push_str(extra);
    }
    let report_dir = fresh_report_dir()?;
    // What the focus selects before the exclusion file (a dry run takes no time).
    let dry_dir = report_dir.join("dry-run");
    std::fs::create_dir_all(&dry_dir).with_context(|| format!("create {}", dry_dir.display()))?;
    sys::output(
        e2e_command(&kube, &dry_dir)
            .arg("--ginkgo.dryRun")
            .arg(format!("--ginkgo.focus={focus}"))
            .arg(format!("--ginkgo.skip={skip_tags}")),
    )?;
    // Specs only (`[It] …`): the report also lists the suite's set-up and tear-down nodes
    // (`[SynchronizedBeforeSuite]`, once per process), which are no spec; a failed one fails
    // e2e.test, and with it the run.
    let in_focus: Vec<String> = read_junit(&dry_dir)?
        .into_iter()
        .filter(|s| s.outcome != Outcome::Skipped && s.name.starts_with("[It]"))
        .map(|s| s.name)
        .collect();
    let unused: Vec<&Exclusion> = excluded
        .iter()
        .filter(|e| !in_focus.iter().any(|n| n.contains(&e.spec)))
        .collect();

    let log_path = report_dir.join("e2e.log");
    eprintln!(
        "cluster: e2e: {} specs in focus, {} excluded; running e2e.test (log: {})",
        in_focus.len(),
        in_focus
            .iter()
            .filter(|n| excluded.iter().any(|e| n.contains(&e.spec)))
            .count(),
        log_path.display()
    );
    let t = Instant::now();
    // The suite's traffic crosses the router: a BGP session that drops during it withdraws a
    // node's pods, and specs then fail for that rather than for what they check.
    let sessions_before = crate::cluster::site::router_sessions();
    let stub = Stub::start(&kube, &report_dir)?;
    let families = flock.then(|| PodFamilies::set(pods)).transpose()?;
    let background = cluster_policies
        .then(BackgroundPolicies::apply)
        .transpose()?;
    let status = run_suite(&kube, &report_dir, &log_path, &focus, &skip, parallel);
    drop(background);
    drop(families);
    drop(stub);
    let status = status?;
    let suite_took = t.elapsed();
    let restarted = sessions_restarted(&sessions_before);
    let specs = read_junit(&report_dir)?;

    let mut out = String::new();
    out.push_str(&format!(
        "KUBERNETES E2E ({} e2e.test, --provider=local, from {CONTROL}, {parallel} processes; \
         {} pods; Services IPv6 unless they ask; focus {focus:?}; skipped tags {skip_tags:?}{})\n",
        kube.kubernetes,
        pods.describe(),
        if cluster_policies {
            "; with the ClusterNetworkPolicies of flock-testbed/src/cluster/e2e/background-cnps.yaml"
        } else {
            ""
        },
    ));
    let ran: Vec<&Spec> = specs
        .iter()
        .filter(|s| in_focus.contains(&s.name))
        .collect();
    let mut rows: Vec<Vec<String>> = Vec::new();
    for s in &ran {
        let exclusion = excluded.iter().find(|e| s.name.contains(&e.spec));
        let result = match (s.outcome, exclusion) {
            (Outcome::Skipped, Some(_)) => "excluded".to_owned(),
            (Outcome::Skipped, None) => "skipped".to_owned(),
            (Outcome::Passed, _) => "passed".to_owned(),
            (Outcome::Failed, _) => "FAILED".to_owned(),
        };
        rows.push(vec![
            result,
            format!("{:.1} s", s.seconds),
            s.name.trim_start_matches("[sig-network] ").to_owned(),
        ]);
    }
    rows.sort();
    sys::table(
        &mut out,
        &["result", "took", "spec ([sig-network] …)"],
        &rows,
    );
    let count = |o: Outcome| {
        ran.iter()
            .filter(|s| s.outcome == o)
            .filter(|s| o != Outcome::Skipped || !excluded.iter().any(|e| s.name.contains(&e.spec)))
            .count()
    };
    let excluded_count = ran
        .iter()
        .filter(|s| {
            s.outcome == Outcome::Skipped && excluded.iter().any(|e| s.name.contains(&e.spec))
        })
        .count();
    let (passed, failed, skipped) = (
        count(Outcome::Passed),
        count(Outcome::Failed),
        count(Outcome::Skipped),
    );
    out.push_str(&format!(
        "\n{} specs in focus: {} run, {passed} passed, {failed} failed, {skipped} skipped by the \
         suite itself, {excluded_count} excluded (flock-testbed/src/cluster/e2e/exclusions.txt)\n",
        ran.len(),
        passed + failed,
    ));
    // With another focus most entries match nothing: only the default focus checks them.
    if !unused.is_empty() && focus == DEFAULT_FOCUS {
        out.push_str("exclusions matching no spec of this focus:\n");
        for e in unused {
            out.push_str(&format!("  {}\n", e.spec));
        }
    }
    finish_report(
        &mut out,
        &restarted,
        (images_took, suite_took),
        &format!("e2e.test's log: {}", log_path.display()),
        &report_dir,
    )?;
    if passed == 0 {
        bail!(
            "no e2e spec ran and passed: the focus {focus:?} matched nothing this suite runs \
             (the log: {})",
            log_path.display()
        );
    }
    if failed > 0 || !status {
        // The log goes with the cluster's run directory: the error carries what each failure
        // said, so that a CI run's output alone tells which check missed.
        let mut why = String::new();
        for s in ran.iter().filter(|s| s.outcome == Outcome::Failed) {
            let message = s.failure.as_deref().unwrap_or("(no message)");
            let message: String = message
                .lines()
                .take(12)
                .collect::<Vec<_>>()
                .join("\n      ");
            why.push_str(&format!("\n  {}\n      {message}", s.name));
        }
        if !restarted.is_empty() {
            why.push_str(&format!(
                "\n  and the router's BGP sessions restarted during the suite: {}",
                restarted.join("; ")
            ));
        }
        bail!(
            "{failed} e2e specs failed (e2e.test {}); the failures are in {}{why}",
            if status { "exited 0" } else { "failed" },
            log_path.display()
        );
    }
    if !restarted.is_empty() {
        bail!(
            "the router's BGP sessions restarted during the suite ({}): its routes to a node's \
             pods went with them",
            restarted.join("; ")
        );
    }
    Ok(())
}

/// `RUN_DIR/e2e`, where a suite's log, report and summary go: emptied for each run.
/// The last run's specs (`[It]` nodes of its JUnit report): (passed, failed).
pub fn last_run_counts() -> Result<(usize, usize)> {
    let specs = read_junit(&Path::new(RUN_DIR).join("e2e"))?;
    let count = |o: Outcome| {
        specs
            .iter()
            .filter(|s| s.name.starts_with("[It]") && s.outcome == o)
            .count()
    };
    Ok((count(Outcome::Passed), count(Outcome::Failed)))
}

fn fresh_report_dir() -> Result<PathBuf> {
    let report_dir = Path::new(RUN_DIR).join("e2e");
    if report_dir.exists() {
        std::fs::remove_dir_all(&report_dir)
            .with_context(|| format!("remove {}", report_dir.display()))?;
    }
    std::fs::create_dir_all(&report_dir)
        .with_context(|| format!("create {}", report_dir.display()))?;
    Ok(report_dir)
}

/// The router's BGP sessions that went down (or away) since `before` was taken, each said in
/// a line: the suite's traffic crosses the router, and a session that drops during it
/// withdraws a node's pods, so that specs fail for that rather than for what they check.
fn sessions_restarted(before: &[crate::cluster::site::RouterSession]) -> Vec<String> {
    crate::cluster::site::router_sessions()
        .iter()
        .filter(|s| {
            !before
                .iter()
                .any(|b| b.name == s.name && b.state == s.state && same_time(&b.since, &s.since))
        })
        .map(|s| {
            let was = before
                .iter()
                .find(|b| b.name == s.name)
                .map_or("absent".to_owned(), |b| {
                    format!("{} since {}", b.state, b.since)
                });
            format!(
                "{}: {was} before the suite, {} since {} after",
                s.name, s.state, s.since
            )
        })
        .collect()
}

/// The stub answering the suite's `GET http://google.com`; killed when dropped.
struct Stub(std::process::Child);

impl Stub {
    fn start(kube: &kube::KubeBuild, report_dir: &Path) -> Result<Stub> {
        let log = std::fs::File::create(report_dir.join("internet-stub.log"))
            .context("create the stub's log")?;
        let child = proc::Place::Net(CONTROL.to_owned())
            .command(kube.tool("agnhost"))
            .args([
                "netexec".to_owned(),
                format!("--http-port={STUB_HTTP_PORT}"),
                format!("--udp-port={STUB_UDP_PORT}"),
            ])
            .stdout(log.try_clone().context("the stub's log")?)
            .stderr(log)
            .spawn()
            .context("spawn agnhost netexec (the internet stub)")?;
        let stub = Stub(child);
        let url = format!("http://[{}]:{STUB_HTTP_PORT}/", super::CONTROL_ADDR);
        sys::wait_for(Duration::from_secs(10), || {
            proc::Place::Net(CONTROL.to_owned())
                .run(&["curl", "-sf", "-m", "1", "-o", "/dev/null", &url])
                .is_ok()
        })
        .context("the internet stub does not answer")?;
        Ok(stub)
    }
}

impl Drop for Stub {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The flags every run of `e2e.test` takes.
fn e2e_flags(kube: &kube::KubeBuild, report_dir: &Path) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", pki::kubeconfig("admin")),
        "--provider=local".to_owned(),
        format!("--kubectl-path={}", kube.tool("kubectl").display()),
        format!("--num-nodes={}", NODES.len()),
        "--node-os-distro=debian".to_owned(),
        "--allowed-not-ready-nodes=0".to_owned(),
        "--disable-log-dump".to_owned(),
        format!("--report-dir={}", report_dir.display()),
    ]
}

/// `program` in the control plane's namespace with the suite's environment: the stub as the
/// HTTP proxy for everything outside the cluster, nothing else proxied.
fn suite_command(program: &Path, report_dir: &Path) -> std::process::Command {
    let mut cmd = proc::Place::Net(CONTROL.to_owned()).command(program);
    cmd.env("HOME", report_dir)
        .env(
            "HTTP_PROXY",
            format!("http://[{}]:{STUB_HTTP_PORT}", super::CONTROL_ADDR),
        )
        .env("NO_PROXY", NO_PROXY)
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .env_remove("http_proxy")
        .env_remove("no_proxy");
    cmd
}

/// `e2e.test` itself (no ginkgo in between), with the flags every run takes.
fn e2e_command(kube: &kube::KubeBuild, report_dir: &Path) -> std::process::Command {
    let mut cmd = suite_command(&kube.tool("e2e.test"), report_dir);
    cmd.args(e2e_flags(kube, report_dir));
    cmd
}

/// Whether two of BIRD's `HH:MM:SS.mmm` times are the same moment: BIRD derives the wall time
/// it shows from its monotonic clock, and the same moment shows a millisecond apart from one
/// `show protocols` to the next.
fn same_time(a: &str, b: &str) -> bool {
    let ms = |t: &str| -> Option<i64> {
        let (hms, frac) = t.split_once('.').unwrap_or((t, "0"));
        let mut parts = hms.split(':').map(|p| p.parse::<i64>().ok());
        let (h, m, s) = (parts.next()??, parts.next()??, parts.next()??);
        Some(((h * 60 + m) * 60 + s) * 1000 + frac.parse::<i64>().ok()?)
    };
    match (ms(a), ms(b)) {
        (Some(a), Some(b)) => (a - b).abs() <= 5,
        _ => a == b,
    }
}

/// The CPU weight of the test client's processes together (an ordinary process has 1024).
const E2E_CPU_SHARES: u32 = 512;

/// Runs the suite, its output into `log`; echoes the suite's progress lines. Returns whether
/// `e2e.test` exited 0.
fn run_suite(
    kube: &kube::KubeBuild,
    report_dir: &Path,
    log: &Path,
    focus: &str,
    skip: &str,
    parallel: usize,
) -> Result<bool> {
    // ginkgo (v2) runs `parallel` e2e.test processes, each a share of the specs, one
    // BeforeSuite for all; `-v` prints each spec as it ends, which is echoed as progress.
    let mut cmd = in_client_cgroup(
        suite_command(Path::new("sh"), report_dir),
        &kube.tool("ginkgo"),
    )?;
    cmd.arg(format!("--nodes={parallel}"))
        .args(["--no-color", "-v", "--silence-skips"])
        .arg(format!("--timeout={}s", LIMIT.as_secs()))
        .arg(format!("--focus={focus}"))
        .arg(format!("--skip={skip}"))
        .arg(kube.tool("e2e.test"))
        .arg("--")
        .args(e2e_flags(kube, report_dir));
    stream_suite(
        cmd,
        "e2e.test",
        log,
        &report_dir.join("e2e.stderr.log"),
        |line| {
            // ginkgo's verdict line of each spec that ran: "• [12.345 seconds]", or with
            // "[FAILED]" / "[PANICKED]" / "[TIMEDOUT]" before the time.
            if line.starts_with("\u{2022} [") {
                eprintln!("cluster: e2e: {}", line.trim_end());
            }
        },
    )
}

/// `sh`, a command made for some place with the suite's environment, told to move itself into
/// the test client's CPU cgroup and exec `program`; the caller adds the program's arguments.
/// The test client runs off the cluster in a real one; here it shares the 2 cores with the
/// nodes: its processes together weigh as half an ordinary process, so that a burst of specs
/// cannot starve the nodes it tests.
fn in_client_cgroup(
    mut sh: std::process::Command,
    program: &Path,
) -> Result<std::process::Command> {
    let procs = proc::cpu_weight(&format!("{}/e2e", proc::CGROUP), E2E_CPU_SHARES)?;
    sh.args(["-c", "echo $$ > \"$0\" && exec \"$@\""])
        .arg(&procs)
        .arg(program);
    Ok(sh)
}

/// Runs the suite `cmd` (`what`, in the errors) as a process group of its own, killed with
/// everything it started after [`LIMIT`]: its stdout into `log`, each line of it also handed
/// to `on_line` (for progress), its stderr into `stderr_log`. Returns whether it exited 0.
fn stream_suite(
    mut cmd: std::process::Command,
    what: &str,
    log: &Path,
    stderr_log: &Path,
    mut on_line: impl FnMut(&str),
) -> Result<bool> {
    let mut file =
        std::fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
    cmd.process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().with_context(|| format!("spawn {what}"))?;
    let stderr = child
        .stderr
        .take()
        .with_context(|| format!("{what}'s stderr"))?;
    let copier = {
        let path: PathBuf = stderr_log.to_owned();
        std::thread::spawn(move || -> std::io::Result<()> {
            let mut f = std::fs::File::create(path)?;
            std::io::copy(&mut BufReader::new(stderr), &mut f)?;
            Ok(())
        })
    };
    let pid = child.id();
    let watchdog = std::thread::spawn(move || {
        let deadline = Instant::now() + LIMIT;
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_secs(5));
            if !Path::new(&format!("/proc/{pid}")).exists() {
                return;
            }
        }
        eprintln!(
            "cluster: e2e: the suite ran over {} s, killing it",
            LIMIT.as_secs()
        );
        // The suite and every process it started: one process group.
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    });
    let mut stdout = BufReader::new(
        child
            .stdout
            .take()
            .with_context(|| format!("{what}'s stdout"))?,
    );
    // Bytes, not UTF-8 lines: specs log what servers answered, binary included.
    let mut raw = Vec::new();
    loop {
        raw.clear();
        if stdout
            .read_until(b'\n', &mut raw)
            .with_context(|| format!("read {what}'s output"))?
            == 0
        {
            break;
        }
        file.write_all(&raw)
            .with_context(|| format!("write {}", log.display()))?;
        on_line(&String::from_utf8_lossy(&raw));
    }
    let status = child.wait().with_context(|| format!("wait for {what}"))?;
    let _ = copier.join();
    drop(watchdog);
    Ok(status.success())
}

/// Ends a suite's report: whether the router's BGP sessions held, how long the images and the
/// suite took, where its log is; prints it and writes it to `summary.txt` in `report_dir`.
pub(super) fn finish_report(
    out: &mut String,
    restarted: &[String],
    (images_took, suite_took): (Duration, Duration),
    log: &str,
    report_dir: &Path,
) -> Result<()> {
    if restarted.is_empty() {
        out.push_str("the router's BGP sessions stayed established through the suite\n");
    } else {
        out.push_str(&format!(
            "the router's BGP sessions restarted during the suite: {}\n",
            restarted.join("; ")
        ));
    }
    out.push_str(&format!(
        "images {:.0} s, suite {:.0} s; {log}\n",
        images_took.as_secs_f64(),
        suite_took.as_secs_f64(),
    ));
    print!("{out}");
    std::fs::write(report_dir.join("summary.txt"), &*out)
        .with_context(|| format!("write {}", report_dir.join("summary.txt").display()))
}

/// The ClusterNetworkPolicies of `background-cnps.yaml`, present while the guard lives
/// (`--cluster-policies`).
struct BackgroundPolicies;

const BACKGROUND_CNPS: &str = include_str!("background-cnps.yaml");

impl BackgroundPolicies {
    fn apply() -> Result<BackgroundPolicies> {
        super::kubectl_stdin(&["apply", "-f", "-"], BACKGROUND_CNPS)
            .context("apply the background ClusterNetworkPolicies (is the CRD installed?)")?;
        eprintln!(
            "cluster: e2e: ClusterNetworkPolicies flock-e2e-admin and flock-e2e-baseline present"
        );
        Ok(BackgroundPolicies)
    }
}

impl Drop for BackgroundPolicies {
    fn drop(&mut self) {
        if let Err(e) = super::kubectl_stdin(
            &["delete", "--ignore-not-found", "-f", "-"],
            BACKGROUND_CNPS,
        ) {
            eprintln!("cluster: e2e: cannot delete the background ClusterNetworkPolicies: {e:#}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bird_times_a_millisecond_apart_are_one_moment() {
        assert!(same_time("23:11:46.233", "23:11:46.234"));
        assert!(!same_time("22:40:39.781", "22:58:11.393"));
        assert!(!same_time("23:11:46.233", "23:11:47.233"));
    }
}
