//! `cargo xtask bench`: end-to-end CNI latency and throughput, every subject
//! driven in one run through the same libcni-conformant runtime stand-in
//! ([`flock_testkit::cni::Runtime`]), host side in a stand-in node namespace,
//! a fresh pod namespace per pod (created before the clock starts). The
//! stand-in's threads live in the node namespace, as a runtime lives in its
//! node's, so each call is the runtime's work and the plugin's, not a `setns`.
//!
//! For each subject: N pods ADDed one after the other (latency of each call),
//! the daemon's RSS with the N pods up, the N DELs one after the other; then N
//! fresh pods ADDed and DELed by `--concurrency` threads (latency of each call
//! and pods/s over the ADD phase). The markdown table (with the ratio
//! flock/reference when both run) is printed and written into
//! `BENCHMARKS.md` between the `bench:begin`/`bench:end` markers.
//!
//! A subject is anything that implements [`Subject`]: today the reference
//! `ptp` + `host-local` plugins; the flock subject (shim + agent in the node
//! namespace) plugs in by implementing it and adding itself to [`subjects`].

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use flock_testkit::Netns;
use flock_testkit::cni::{Attachment, Runtime};
use flock_testkit::node::{AgentLayout, spawn_agent, wait_until_serving};
use serde_json::{Value, json};

use crate::binaries::{FLOCK, build, workspace_root};
use crate::sys;

mod breakdown;

pub use breakdown::{HANDOFF_DAEMON, handoff_daemon};

use breakdown::{Breakdown, Floor, Observed};

/// Everything a subject needs to set itself up.
pub struct SetupContext<'a> {
    /// The stand-in node namespace the plugins run in (and a daemon, if any).
    pub node: &'a Netns,
    /// A scratch directory of this subject, removed after the run.
    pub work_dir: &'a Path,
    /// `target/release`, holding the packages of [`Subject::release_packages`]
    /// freshly built.
    pub release_dir: &'a Path,
}

/// What a subject hands the runtime: its network configuration list and the
/// plugin search path.
pub struct SubjectConfig {
    /// The conflist (`cniVersion`, `name`, `plugins`).
    pub conflist: Value,
    /// Searched in order for each plugin's `type` (`CNI_PATH`).
    pub bin_dirs: Vec<PathBuf>,
}

/// One CNI implementation under measurement.
pub trait Subject: Send + Sync {
    /// Short key: `reference` and `flock` get a ratio column.
    fn key(&self) -> &str;
    /// Column header, e.g. `reference (ptp + host-local)`.
    fn label(&self) -> &str;
    /// Workspace packages this subject needs built with `--release`
    /// (built once, before any subject is set up).
    fn release_packages(&self) -> &[&'static str] {
        &[]
    }
    /// Prepares the subject in the node namespace (starts its daemon, writes
    /// its files under `work_dir`) and returns its CNI configuration.
    fn setup(&mut self, ctx: &SetupContext<'_>) -> Result<SubjectConfig>;
    /// The pid of the subject's long-running daemon, for its RSS.
    fn daemon_pid(&self) -> Option<u32> {
        None
    }
    /// The daemon's per-request trace (one JSON line per request with its phases), when the
    /// subject writes one.
    fn trace(&self) -> Option<String> {
        None
    }
    /// Stops what `setup` started. (The node namespace's drop kills whatever
    /// is left inside it anyway.)
    fn teardown(&mut self) -> Result<()> {
        Ok(())
    }
}

/// The reference: Debian's `ptp` with `host-local` IPAM, dual stack.
pub struct ReferencePtp;

impl Subject for ReferencePtp {
    fn key(&self) -> &str {
        "reference"
    }

    fn label(&self) -> &str {
        "reference (ptp + host-local)"
    }

    fn setup(&mut self, ctx: &SetupContext<'_>) -> Result<SubjectConfig> {
        // The reference plugins built from their Go module (v1.10, cached per version).
        let plugins = crate::components::cni_plugins().ensure_built()?;
        Ok(SubjectConfig {
            conflist: json!({
                "cniVersion": "1.0.0",
                "name": "bench-ref",
                "plugins": [{
                    "type": "ptp",
                    "ipMasq": false,
                    "ipam": {
                        "type": "host-local",
                        "dataDir": ctx.work_dir.join("ipam"),
                        "ranges": [[{ "subnet": "10.99.0.0/16" }], [{ "subnet": "2001:db8:99::/64" }]],
                        "routes": [{ "dst": "0.0.0.0/0" }, { "dst": "::/0" }]
                    }
                }]
            }),
            bin_dirs: vec![plugins.bin],
        })
    }
}

/// flock: the release shim and a standalone release agent in the node namespace, dual stack.
#[derive(Default)]
pub struct Flock {
    agent: Option<std::process::Child>,
    trace: Option<PathBuf>,
}

impl Subject for Flock {
    fn key(&self) -> &str {
        "flock"
    }

    fn label(&self) -> &str {
        "flock (shim + agent)"
    }

    fn release_packages(&self) -> &[&'static str] {
        FLOCK
    }

    fn setup(&mut self, ctx: &SetupContext<'_>) -> Result<SubjectConfig> {
        let layout = AgentLayout::new(&ctx.work_dir.join("agent"));
        std::fs::create_dir_all(ctx.work_dir.join("agent"))?;
        std::fs::write(
            &layout.node_config,
            "apiVersion: flock.fritzlab.net/v1alpha1\nkind: NodeConfig\nmetadata:\n  name: bench\n\
             spec:\n  cidr6: 2001:db8:98::/64\n  cidr4: 10.98.0.0/16\n",
        )?;
        let trace = ctx.work_dir.join("agent-trace.jsonl");
        let mut child = spawn_agent(
            ctx.node.name(),
            &ctx.release_dir.join("flock-agent"),
            &layout,
            &[
                ("FLOCK_LOG".into(), "warn".into()),
                ("FLOCK_TRACE".into(), trace.display().to_string()),
            ],
        )
        .map_err(anyhow::Error::msg)?;
        wait_until_serving(&mut child, &layout).map_err(anyhow::Error::msg)?;
        self.agent = Some(child);
        self.trace = Some(trace);
        Ok(SubjectConfig {
            conflist: layout.conflist("bench-flock"),
            bin_dirs: vec![ctx.release_dir.to_owned()],
        })
    }

    fn daemon_pid(&self) -> Option<u32> {
        self.agent.as_ref().map(std::process::Child::id)
    }

    fn trace(&self) -> Option<String> {
        std::fs::read_to_string(self.trace.as_ref()?).ok()
    }

    fn teardown(&mut self) -> Result<()> {
        if let Some(mut child) = self.agent.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        Ok(())
    }
}

/// Every subject the harness knows, in column order.
pub fn subjects() -> Vec<Box<dyn Subject>> {
    vec![Box::new(Flock::default()), Box::new(ReferencePtp)]
}

struct Options {
    pods: usize,
    /// Pods up when a daemon's RSS is read (extra ones are added untimed).
    rss_pods: usize,
    concurrency: usize,
    only: Option<Vec<String>>,
    write: bool,
}

/// The most pods a phase can have (the kernel floor numbers `5 × pods` from 1 in 16 bits).
const MAX_PODS: usize = 13_107;

const USAGE: &str = "usage: cargo xtask bench [--pods N] [--concurrency C] [--rss-pods N] [--subjects reference,flock] [--no-write]";

fn parse_options(args: &[String]) -> Result<Options> {
    let mut opts = Options {
        pods: 100,
        rss_pods: 250,
        concurrency: 10,
        only: None,
        write: true,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .with_context(|| format!("{name} needs a value\n{USAGE}"))
        };
        match arg.as_str() {
            "--pods" => {
                let v = value("--pods")?;
                opts.pods = v.parse().with_context(|| format!("--pods {v:?}"))?;
            }
            "--rss-pods" => {
                let v = value("--rss-pods")?;
                opts.rss_pods = v.parse().with_context(|| format!("--rss-pods {v:?}"))?;
            }
            "--concurrency" => {
                let v = value("--concurrency")?;
                opts.concurrency = v.parse().with_context(|| format!("--concurrency {v:?}"))?;
            }
            "--subjects" => {
                let v = value("--subjects")?;
                opts.only = Some(v.split(',').map(str::to_owned).collect());
            }
            "--no-write" => opts.write = false,
            other => bail!("unknown bench argument {other:?}\n{USAGE}"),
        }
    }
    if opts.pods == 0 || opts.concurrency == 0 {
        bail!("--pods and --concurrency must be at least 1");
    }
    // The kernel floor numbers five times as many pods from one /112 and one /16.
    if opts.pods > MAX_PODS {
        bail!(
            "--pods {} is more than the bench can address: at most {MAX_PODS}",
            opts.pods
        );
    }
    Ok(opts)
}

/// The figures of one subject.
struct Figures {
    label: String,
    key: String,
    add_seq: Vec<Duration>,
    del_seq: Vec<Duration>,
    add_conc: Vec<Duration>,
    del_conc: Vec<Duration>,
    add_conc_wall: Duration,
    rss_kib: Option<u64>,
    /// The daemon's CPU time (user + system) per ADD of the concurrent phase.
    daemon_cpu_per_add: Option<Duration>,
    /// The plugin exec'd for `VERSION` by the same runtime.
    version_exec: Vec<Duration>,
    /// Per phase of the sequential ADDs and DELs, from the daemon's trace.
    breakdown: Option<Breakdown>,
}

impl Figures {
    /// ADD throughput of the concurrent phase: pods over its wall time.
    fn add_pods_per_s(&self) -> f64 {
        self.add_conc.len() as f64 / self.add_conc_wall.as_secs_f64()
    }
}

/// `cargo xtask bench [ARGS…]`.
pub fn bench(args: &[String]) -> Result<()> {
    sys::require_root("cargo xtask bench")?;
    let opts = parse_options(args)?;
    if cfg!(debug_assertions) {
        // The runtime stand-in and the kernel floor run in this process. Unoptimised (the
        // dev profile `cargo xtask` runs), the stand-in's JSON work added about 0.2 ms to
        // every call it timed, and the floor measured flock-netns as a debug build. The
        // `xtask-bench` profile is optimised and unwinds on panic, so the namespaces and
        // agents the bench made are removed on a panic too.
        eprintln!("xtask bench: running an optimised build of xtask for the measurements");
        return sys::run(
            sys::cargo_command([
                "run",
                "--profile",
                "xtask-bench",
                "--quiet",
                "-p",
                "xtask",
                "--",
                "bench",
            ])
            .args(args),
        );
    }
    for ns in flock_testkit::sweep_stale() {
        eprintln!("xtask: removed stale test namespace {ns}");
    }
    let mut selected: Vec<Box<dyn Subject>> = subjects()
        .into_iter()
        .filter(|s| {
            opts.only
                .as_ref()
                .is_none_or(|o| o.iter().any(|k| k == s.key()))
        })
        .collect();
    if selected.is_empty() {
        bail!("no subject selected; known: reference, and the ones `subjects()` lists");
    }
    let mut packages: Vec<&'static str> = selected
        .iter()
        .flat_map(|s| s.release_packages().iter().copied())
        .collect();
    packages.sort_unstable();
    packages.dedup();
    let release_dir = build(&packages, true)?;

    // The kernel floor first, on a quiet kernel.
    let floor = if selected.iter().any(|s| s.key() == "flock") {
        eprintln!(
            "xtask bench: floor — flock-netns alone, {n} pods one at a time and as many each \
             after a shim exec; {n} ADDs through the shim to a daemon that keeps no books one at \
             a time and {n} at concurrency {c}; {n} with flock-netns alone at concurrency {c}",
            n = opts.pods,
            c = opts.concurrency
        );
        Some(breakdown::measure_kernel_floor(
            opts.pods,
            opts.concurrency,
            &release_dir,
        )?)
    } else {
        None
    };
    let scratch = std::env::temp_dir().join(format!("flock-bench-{}", std::process::id()));
    let mut all = Vec::new();
    let outcome = (|| -> Result<()> {
        for subject in &mut selected {
            let work_dir = scratch.join(subject.key());
            std::fs::create_dir_all(&work_dir)
                .with_context(|| format!("create {}", work_dir.display()))?;
            eprintln!(
                "xtask bench: {} — {} pods, concurrency {}",
                subject.label(),
                opts.pods,
                opts.concurrency
            );
            all.push(run_subject(
                subject.as_mut(),
                &opts,
                &work_dir,
                &release_dir,
            )?);
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    outcome?;

    let mut table = render_table(&all, &opts);
    if let (Some(flock), Some(mut floor)) = (all.iter().find(|f| f.key == "flock"), floor) {
        floor.version_exec = flock.version_exec.clone();
        table.push_str(&render_breakdown(
            flock,
            &floor,
            opts.pods,
            opts.concurrency,
        ));
    }
    println!("{table}");
    if opts.write {
        let command = std::iter::once("cargo xtask bench".to_owned())
            .chain(args.iter().cloned())
            .collect::<Vec<_>>()
            .join(" ");
        let section = format!(
            "Command: `{command}`\n\nRun: {} on {}\n\n{table}",
            utc_now(),
            machine_line()
        );
        let path = workspace_root().join("BENCHMARKS.md");
        write_section(&path, &section)?;
        eprintln!("xtask bench: wrote {}", path.display());
    }
    Ok(())
}

fn run_subject(
    subject: &mut dyn Subject,
    opts: &Options,
    work_dir: &Path,
    release_dir: &Path,
) -> Result<Figures> {
    let node = Netns::new("bnode");
    let config = subject.setup(&SetupContext {
        node: &node,
        work_dir,
        release_dir,
    })?;
    // The runtime stand-in lives in the node's namespace, as containerd lives in its node's:
    // each exec is then a plain spawn, not a thread that enters the namespace first (about
    // 0.2 ms per call here, which no runtime pays). Threads spawned below start there too.
    let outcome = std::thread::scope(|s| {
        s.spawn(|| {
            flock_testkit::cni::enter_netns(&node.path())?;
            measure(&*subject, &node, config, opts, work_dir)
        })
        .join()
        .unwrap_or_else(|_| bail!("the measuring thread panicked"))
    });
    let teardown = subject.teardown();
    let figures = outcome?;
    teardown?;
    Ok(figures)
}

fn measure(
    subject: &dyn Subject,
    node: &Netns,
    config: SubjectConfig,
    opts: &Options,
    work_dir: &Path,
) -> Result<Figures> {
    let runtime = Runtime::new(config.conflist, config.bin_dirs, work_dir.join("cni-cache"))?
        .in_netns(node.path());
    let key = subject.key().to_owned();

    // Sequential: N ADDs, RSS with N pods, N DELs.
    let pods = make_pods(opts.pods);
    let atts: Vec<Attachment> = pods
        .iter()
        .enumerate()
        .map(|(i, ns)| attachment(&key, "seq", i, ns))
        .collect();
    let mut add_seq = Vec::with_capacity(atts.len());
    // The machine's monotonic clock at each call's start, for the agent's trace to compare.
    let mut add_mono = Vec::with_capacity(atts.len());
    for att in &atts {
        add_mono.push(breakdown::monotonic());
        let start = Instant::now();
        runtime
            .add(att)
            .with_context(|| format!("ADD {}", att.container_id))?;
        add_seq.push(start.elapsed());
    }
    let rss_kib = match subject.daemon_pid() {
        None => None,
        Some(pid) => {
            // Bring the daemon up to `rss_pods` pods (untimed), read its RSS, take them away.
            let extra = make_pods(opts.rss_pods.saturating_sub(opts.pods));
            let extra_atts: Vec<Attachment> = extra
                .iter()
                .enumerate()
                .map(|(i, ns)| attachment(&key, "rss", i, ns))
                .collect();
            for att in &extra_atts {
                runtime
                    .add(att)
                    .with_context(|| format!("ADD {}", att.container_id))?;
            }
            let rss = rss_kib(pid)?;
            for att in &extra_atts {
                runtime
                    .del(att)
                    .with_context(|| format!("DEL {}", att.container_id))?;
            }
            Some(rss)
        }
    };
    let mut del_seq = Vec::with_capacity(atts.len());
    let mut del_mono = Vec::with_capacity(atts.len());
    for att in &atts {
        del_mono.push(breakdown::monotonic());
        let start = Instant::now();
        runtime
            .del(att)
            .with_context(|| format!("DEL {}", att.container_id))?;
        del_seq.push(start.elapsed());
    }
    drop(pods);
    let observed: Vec<Observed> = [("ADD", &add_seq, &add_mono), ("DEL", &del_seq, &del_mono)]
        .into_iter()
        .flat_map(|(op, elapsed, started)| {
            atts.iter()
                .zip(elapsed)
                .zip(started)
                .map(move |((a, d), m)| Observed {
                    op,
                    container_id: a.container_id.clone(),
                    elapsed: *d,
                    started_mono: *m,
                })
        })
        .collect();

    // A daemon may delete veths after answering a DEL (flock does): let the kernel finish
    // before the concurrent phase, which would otherwise pay for the sequential one's.
    let deadline = Instant::now() + Duration::from_secs(60);
    while node.links().iter().any(|l| l.starts_with("flock")) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    // The deleted pod namespaces are cleaned up by a kernel worker, which takes the same
    // lock as every ADD; nothing tells when it is done.
    std::thread::sleep(Duration::from_secs(2));

    // Concurrent: fresh pods, `concurrency` threads.
    let pods = make_pods(opts.pods);
    let atts: Vec<Attachment> = pods
        .iter()
        .enumerate()
        .map(|(i, ns)| attachment(&key, "conc", i, ns))
        .collect();
    let cpu_before = subject.daemon_pid().map(cpu_ticks).transpose()?;
    let (add_conc, add_conc_wall) = concurrently(&atts, opts.concurrency, |a| {
        runtime
            .add(a)
            .map(drop)
            .with_context(|| format!("ADD {}", a.container_id))
    })?;
    let daemon_cpu_per_add = match (subject.daemon_pid(), cpu_before) {
        (Some(pid), Some(before)) => {
            let ticks = cpu_ticks(pid)?.saturating_sub(before);
            Some(ticks_to_duration(ticks) / u32::try_from(atts.len()).unwrap_or(u32::MAX))
        }
        _ => None,
    };
    let (del_conc, _) = concurrently(&atts, opts.concurrency, |a| {
        runtime
            .del(a)
            .with_context(|| format!("DEL {}", a.container_id))
    })?;
    drop(pods);
    let plugin = runtime.conflist()["plugins"][0]["type"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let version_exec = breakdown::measure_version_exec(&runtime, &plugin, opts.pods)?;
    let breakdown = match subject.trace() {
        Some(trace) => Some(Breakdown::from_trace(&trace, &observed)?),
        None => None,
    };

    Ok(Figures {
        label: subject.label().to_owned(),
        key,
        add_seq,
        del_seq,
        add_conc,
        del_conc,
        add_conc_wall,
        rss_kib,
        daemon_cpu_per_add,
        version_exec,
        breakdown,
    })
}

fn make_pods(n: usize) -> Vec<Netns> {
    (0..n).map(|_| Netns::new("bpod")).collect()
}

/// The attachment of pod `i` of `phase` for subject `key`.
fn attachment(key: &str, phase: &str, i: usize, pod: &Netns) -> Attachment {
    cri_attachment(
        format!("bench-{key}-{phase}-{i:05}"),
        &pod.path(),
        &format!("pod-{phase}-{i}"),
        i,
    )
}

/// An attachment as containerd's CRI plugin makes it: container `id` in `netns`, pod
/// `pod_name` (namespace `bench`) with a UID numbered `i`.
fn cri_attachment(id: String, netns: &Path, pod_name: &str, i: usize) -> Attachment {
    Attachment::new(id.clone(), netns, "eth0")
        .with_arg("IgnoreUnknown", "1")
        .with_arg("K8S_POD_NAMESPACE", "bench")
        .with_arg("K8S_POD_NAME", pod_name)
        .with_arg("K8S_POD_INFRA_CONTAINER_ID", id)
        .with_arg("K8S_POD_UID", format!("00000000-0000-4000-8000-{i:012}"))
}

/// Runs `op` on every attachment from `threads` threads; returns each call's
/// latency and the wall time of the whole phase.
fn concurrently<F>(atts: &[Attachment], threads: usize, op: F) -> Result<(Vec<Duration>, Duration)>
where
    F: Fn(&Attachment) -> Result<()> + Sync,
{
    let next = AtomicUsize::new(0);
    let start = Instant::now();
    let per_thread: Vec<Result<Vec<Duration>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads.min(atts.len()))
            .map(|_| {
                s.spawn(|| {
                    let mut times = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(att) = atts.get(i) else {
                            return Ok(times);
                        };
                        let t = Instant::now();
                        op(att)?;
                        times.push(t.elapsed());
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| bail!("a bench thread panicked"))
            })
            .collect()
    });
    let wall = start.elapsed();
    let mut all = Vec::with_capacity(atts.len());
    for times in per_thread {
        all.extend(times?);
    }
    Ok((all, wall))
}

/// utime + stime of a process, in clock ticks (`/proc/PID/stat` fields 14 and 15).
fn cpu_ticks(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
    // The command name (field 2) may hold spaces: count fields after its closing paren.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    let field = |n: usize| -> Result<u64> {
        fields
            .get(n - 3)
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("no field {n} in {path}"))
    };
    Ok(field(14)? + field(15)?)
}

fn ticks_to_duration(ticks: u64) -> Duration {
    // USER_HZ is 100 on Linux.
    Duration::from_millis(ticks * 10)
}

fn rss_kib(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("read {path}"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no VmRSS in {path}"))
}

/// Nearest-rank percentile, in milliseconds.
fn percentile_ms(samples: &[Duration], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1].as_secs_f64() * 1000.0
}

fn render_table(all: &[Figures], opts: &Options) -> String {
    type Row = (String, Box<dyn Fn(&Figures) -> Option<f64>>, &'static str);
    let rows: Vec<Row> = vec![
        (
            "ADD p50, sequential".into(),
            Box::new(|f| Some(percentile_ms(&f.add_seq, 50.0))),
            "ms",
        ),
        (
            "ADD p99, sequential".into(),
            Box::new(|f| Some(percentile_ms(&f.add_seq, 99.0))),
            "ms",
        ),
        (
            "DEL p50, sequential".into(),
            Box::new(|f| Some(percentile_ms(&f.del_seq, 50.0))),
            "ms",
        ),
        (
            "DEL p99, sequential".into(),
            Box::new(|f| Some(percentile_ms(&f.del_seq, 99.0))),
            "ms",
        ),
        (
            format!("ADD p50, concurrency {}", opts.concurrency),
            Box::new(|f| Some(percentile_ms(&f.add_conc, 50.0))),
            "ms",
        ),
        (
            format!("ADD p99, concurrency {}", opts.concurrency),
            Box::new(|f| Some(percentile_ms(&f.add_conc, 99.0))),
            "ms",
        ),
        (
            format!("DEL p50, concurrency {}", opts.concurrency),
            Box::new(|f| Some(percentile_ms(&f.del_conc, 50.0))),
            "ms",
        ),
        (
            format!("DEL p99, concurrency {}", opts.concurrency),
            Box::new(|f| Some(percentile_ms(&f.del_conc, 99.0))),
            "ms",
        ),
        (
            format!("ADD throughput, concurrency {}", opts.concurrency),
            Box::new(|f| Some(f.add_pods_per_s())),
            "pods/s",
        ),
        (
            format!("daemon CPU per ADD, concurrency {}", opts.concurrency),
            Box::new(|f| f.daemon_cpu_per_add.map(|d| d.as_secs_f64() * 1000.0)),
            "ms",
        ),
        (
            format!("daemon RSS with {} pods", opts.rss_pods.max(opts.pods)),
            Box::new(|f| f.rss_kib.map(|k| k as f64 / 1024.0)),
            "MiB",
        ),
    ];
    let reference = all.iter().position(|f| f.key == "reference");
    let flock = all.iter().position(|f| f.key == "flock");
    let ratio = reference.zip(flock);

    let mut out = String::new();
    let _ = write!(out, "| {} pods, fresh netns each | unit |", opts.pods);
    for f in all {
        let _ = write!(out, " {} |", f.label);
    }
    if ratio.is_some() {
        out.push_str(" flock / reference |");
    }
    out.push_str("\n|---|---|");
    for _ in all {
        out.push_str("---:|");
    }
    if ratio.is_some() {
        out.push_str("---:|");
    }
    out.push('\n');
    for (name, value, unit) in &rows {
        let _ = write!(out, "| {name} | {unit} |");
        for f in all {
            let _ = write!(out, " {} |", value(f).map_or("—".into(), format_value));
        }
        if let Some((r, fl)) = ratio {
            let cell = match (value(&all[fl]), value(&all[r])) {
                (Some(a), Some(b)) if b > 0.0 => format!("{:.3}", a / b),
                _ => "—".into(),
            };
            let _ = write!(out, " {cell} |");
        }
        out.push('\n');
    }
    out
}

/// flock's per-phase table, the floor beside it, and the ADD goal of issue 13.
fn render_breakdown(flock: &Figures, floor: &Floor, pods: usize, concurrency: usize) -> String {
    let mut out = format!(
        "\nWhere flock's time goes ({pods} sequential ADDs and DELs, ms, from the agent's \
         `--trace`), and the floor measured in the same run:\n\n"
    );
    if let Some(b) = &flock.breakdown {
        out.push_str(&breakdown::render(b, floor));
    }
    let (add, bound) = breakdown::add_goal(&flock.add_seq, floor, flock.breakdown.as_ref());
    out.push_str(&format!(
        "\nADD p50 {add:.3} ms against 1.5 × (kernel floor + VERSION exec) = {bound:.3} ms \
         (kernel floor: the smaller p50 of flock-netns alone and the agent's kernel phase): {}\n",
        if add <= bound { "met" } else { "not met" }
    ));
    if let Some(bound) = breakdown::add_bound_after_exec(floor) {
        out.push_str(&format!(
            "\nThe same bound with the floor measured as a CNI's kernel work runs, each setup right \
             after a shim exec: 1.5 × ({:.3} + {:.3}) = {bound:.3} ms: {}\n",
            percentile_ms(&floor.setup_after_exec, 50.0),
            percentile_ms(&floor.version_exec, 50.0),
            if add <= bound { "met" } else { "not met" }
        ));
    }
    if let Some(ceiling) = floor.concurrent_pods_per_s() {
        let pods_per_s = flock.add_pods_per_s();
        out.push_str(&format!(
            "\nADD throughput {pods_per_s:.0} pods/s at concurrency {concurrency}; flock-netns \
             alone set up the same number of pods at the same concurrency at {ceiling:.0} pods/s \
             in this run ({:.0} % of it)",
            100.0 * pods_per_s / ceiling
        ));
        if let Some(handed_off) = floor.handed_off_pods_per_s() {
            out.push_str(&format!(
                "; ADDs through the shim to a daemon that keeps no books, at {handed_off:.0} \
                 pods/s ({:.0} % of it)",
                100.0 * pods_per_s / handed_off
            ));
        }
        out.push('\n');
    }
    out
}

fn format_value(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

const BEGIN: &str = "<!-- bench:begin (written by `cargo xtask bench`) -->";
const END: &str = "<!-- bench:end -->";

/// Replaces the marked section of `path` (or appends it, or creates the file).
fn write_section(path: &Path, section: &str) -> Result<()> {
    let old = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::from("# Benchmarks\n"),
        Err(e) => return Err(e).with_context(|| format!("read {}", path.display())),
    };
    let block = format!("{BEGIN}\n{section}{END}\n");
    let new = match (old.find(BEGIN), old.find(END)) {
        (Some(b), Some(e)) if e > b => {
            format!(
                "{}{block}{}",
                &old[..b],
                old[e + END.len()..].trim_start_matches('\n')
            )
        }
        _ => format!("{}\n{block}", old.trim_end_matches('\n').to_owned() + "\n"),
    };
    std::fs::write(path, new).with_context(|| format!("write {}", path.display()))
}

fn utc_now() -> String {
    command_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_else(|| "unknown date".into())
}

/// Kernel, CPU, cores and the reference plugins' package version.
fn machine_line() -> String {
    let kernel = command_line("uname", &["-sr"]).unwrap_or_default();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    let plugins = command_line(
        "dpkg-query",
        &["-W", "-f=${Version}", "containernetworking-plugins"],
    )
    .unwrap_or_else(|| "?".into());
    format!("{kernel}, {cpu}, {cores} cores (shared), containernetworking-plugins {plugins}")
}

fn command_line(cmd: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(cmd).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|&m| Duration::from_millis(m)).collect()
    }

    #[test]
    fn nearest_rank_percentiles() {
        let s = ms(&(1..=100).collect::<Vec<_>>());
        assert_eq!(percentile_ms(&s, 50.0), 50.0);
        assert_eq!(percentile_ms(&s, 99.0), 99.0);
        assert_eq!(percentile_ms(&ms(&[7]), 99.0), 7.0);
        assert_eq!(percentile_ms(&ms(&[3, 1, 2]), 50.0), 2.0);
    }

    fn figures(key: &str, add: u64, rss: Option<u64>) -> Figures {
        Figures {
            label: key.into(),
            key: key.into(),
            add_seq: ms(&[add]),
            del_seq: ms(&[1]),
            add_conc: ms(&[add, add]),
            del_conc: ms(&[1]),
            add_conc_wall: Duration::from_secs(1),
            rss_kib: rss,
            daemon_cpu_per_add: None,
            version_exec: Vec::new(),
            breakdown: None,
        }
    }

    #[test]
    fn ratio_column_only_with_both_subjects() {
        let opts = Options {
            pods: 2,
            rss_pods: 250,
            concurrency: 10,
            only: None,
            write: false,
        };
        let one = render_table(&[figures("reference", 1800, None)], &opts);
        assert!(!one.contains("flock / reference"), "{one}");
        let both = render_table(
            &[
                figures("reference", 1800, None),
                figures("flock", 18, Some(10240)),
            ],
            &opts,
        );
        let add = both
            .lines()
            .find(|l| l.starts_with("| ADD p50, sequential"))
            .expect("row");
        assert_eq!(add, "| ADD p50, sequential | ms | 1800 | 18.0 | 0.010 |");
        let rss = both.lines().find(|l| l.contains("RSS")).expect("row");
        assert_eq!(rss, "| daemon RSS with 250 pods | MiB | — | 10.0 | — |");
    }

    #[test]
    fn section_is_replaced_in_place() {
        let dir = std::env::temp_dir().join(format!("xtask-bench-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let path = dir.join("BENCHMARKS.md");
        std::fs::write(&path, "# Benchmarks\n\nintro\n").expect("write");
        write_section(&path, "one\n").expect("first");
        write_section(&path, "two\n").expect("second");
        let text = std::fs::read_to_string(&path).expect("read");
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(
            text,
            format!("# Benchmarks\n\nintro\n\n{BEGIN}\ntwo\n{END}\n")
        );
    }

    #[test]
    fn options() {
        let args = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
        let o =
            parse_options(&args("--pods 30 --subjects reference,flock --no-write")).expect("ok");
        assert_eq!((o.pods, o.concurrency, o.write), (30, 10, false));
        assert_eq!(o.only, Some(vec!["reference".into(), "flock".into()]));
        assert!(parse_options(&args("--pods")).is_err());
        assert!(parse_options(&args("--pods x")).is_err());
        assert!(parse_options(&args("--pods 0")).is_err());
        assert!(parse_options(&args("--what")).is_err());
    }
}
