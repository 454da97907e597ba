//! Where an ADD's and a DEL's time goes, per phase, p50/p99, beside the kernel floor measured
//! in the same run.
//!
//! - The agent's phases come from its `--trace` file (one JSON line per request, see
//!   `flock_agent::trace`).
//! - "outside the agent" is what the runtime stand-in measured for the call minus the agent's
//!   total: exec'ing the shim, its connect, the transfer both ways, the stand-in's own work.
//!   It splits at the agent's `startMonoUs` / `endMonoUs` (`CLOCK_MONOTONIC`, read by the
//!   stand-in too): "to the agent" (the stand-in's work before the exec, the exec, the shim's
//!   start and connect, the agent's accept) and "from the agent" (the reply's way to the
//!   shim, its output and exit, the stand-in's reading of it and its own work after).
//! - The floor: `flock-netns` alone setting up (and detaching) the same dual-stack pods in
//!   fresh namespaces, measured before any subject runs (a quiet kernel), and the shim exec'd
//!   for `VERSION` by the same runtime stand-in in the same node namespace (which never
//!   leaves the shim).

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use flock_netns::{NodeNs, PodSpec, detach, host_ifname, setup};
use flock_testkit::Netns;
use serde_json::Value;

use super::percentile_ms;

/// The phases of the agent's ADD and DEL, in the order they happen.
const ADD_PHASES: &[&str] = &[
    "read",
    "lock",
    "resolve",
    "allocate",
    "store_pending",
    "kernel",
    "policy",
    "store_commit",
    "bird",
    "reply",
];
const DEL_PHASES: &[&str] = &["read", "lock", "kernel", "store_delete", "release", "reply"];
const KERNEL_DETAIL: &[&str] = &["veth", "host", "pod"];

/// One call the runtime stand-in timed.
#[derive(Debug, Clone)]
pub struct Observed {
    /// `ADD` or `DEL`.
    pub op: &'static str,
    /// `CNI_CONTAINERID`.
    pub container_id: String,
    /// What the stand-in measured.
    pub elapsed: Duration,
    /// `CLOCK_MONOTONIC` when the stand-in began the call.
    pub started_mono: Option<Duration>,
}

/// The machine's `CLOCK_MONOTONIC`, the clock of the agent's `startMonoUs` / `endMonoUs`.
pub fn monotonic() -> Option<Duration> {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .ok()
        .map(Duration::from)
}

/// Per phase, the samples of each op.
#[derive(Debug, Default)]
pub struct Breakdown {
    /// (op, phase) → samples.
    samples: BTreeMap<(String, String), Vec<Duration>>,
}

impl Breakdown {
    /// Reads the agent's trace lines for the calls in `observed`.
    pub fn from_trace(trace: &str, observed: &[Observed]) -> Result<Breakdown> {
        let mut by_call: BTreeMap<(String, String), Value> = BTreeMap::new();
        for (n, line) in trace.lines().enumerate() {
            let v: Value = serde_json::from_str(line)
                .with_context(|| format!("trace line {}: {line:?}", n + 1))?;
            let op = v["op"].as_str().unwrap_or_default().to_owned();
            let cid = v["containerId"].as_str().unwrap_or_default().to_owned();
            by_call.insert((op, cid), v);
        }
        let mut b = Breakdown::default();
        for call in observed {
            let Some(line) = by_call.get(&(call.op.to_owned(), call.container_id.clone())) else {
                bail!(
                    "the agent's trace has no {} of {}",
                    call.op,
                    call.container_id
                );
            };
            let us = |v: &Value| Duration::from_micros(v.as_u64().unwrap_or(0));
            let total = us(&line["totalUs"]);
            b.push(
                call.op,
                "outside the agent",
                call.elapsed.saturating_sub(total),
            );
            b.push(call.op, "agent total", total);
            if let (Some(started), Some(start), Some(end)) = (
                call.started_mono,
                line["startMonoUs"].as_u64(),
                line["endMonoUs"].as_u64(),
            ) {
                let (start, end) = (Duration::from_micros(start), Duration::from_micros(end));
                b.push(call.op, "to the agent", start.saturating_sub(started));
                b.push(
                    call.op,
                    "from the agent",
                    (started + call.elapsed).saturating_sub(end),
                );
            }
            if let Some(phases) = line["phases"].as_object() {
                for (phase, d) in phases {
                    b.push(call.op, phase, us(d));
                }
            }
            if let Some(kernel) = line["kernel"].as_object() {
                for (part, d) in kernel {
                    b.push(call.op, &format!("kernel: {part}"), us(d));
                }
            }
        }
        Ok(b)
    }

    fn push(&mut self, op: &str, phase: &str, d: Duration) {
        self.samples
            .entry((op.to_owned(), phase.to_owned()))
            .or_default()
            .push(d);
    }

    fn get(&self, op: &str, phase: &str) -> Option<&Vec<Duration>> {
        self.samples.get(&(op.to_owned(), phase.to_owned()))
    }
}

/// Pods taken at some concurrency, and the wall time they took.
pub type Burst = (usize, Duration);

/// Pods per second of a burst.
fn pods_per_s(burst: Option<Burst>) -> Option<f64> {
    burst.map(|(n, wall)| n as f64 / wall.as_secs_f64())
}

/// The kernel floor and the shim's own floor, measured in the bench's run.
#[derive(Debug, Default)]
pub struct Floor {
    /// `flock_netns::setup` of a dual-stack pod in a fresh namespace.
    pub setup: Vec<Duration>,
    /// `flock_netns::detach` of it (what a DEL waits for; the veth goes after the answer).
    pub detach: Vec<Duration>,
    /// The shim exec'd for `VERSION` by the runtime stand-in.
    pub version_exec: Vec<Duration>,
    /// `flock_netns::setup` of as many more pods, one at a time, each right after the shim was
    /// exec'd (for `VERSION`): the kernel work as a CNI's runs, after the runtime's exec of
    /// its plugin, rather than in a loop that keeps caches warm.
    pub setup_after_exec: Vec<Duration>,
    /// A round trip over a Unix socket to a thread that has waited idle for a millisecond, as
    /// the agent waits for the next call and the shim for the agent's answer: what each
    /// hand-off between the shim and the agent costs here beyond the work itself.
    pub idle_round_trip: Vec<Duration>,
    /// ADDs of as many more pods through the shim, exec'd by the runtime stand-in, to a
    /// stand-in daemon that decodes, sets up and answers, and keeps no books (see
    /// [`handed_off_adds`]): what a CNI of a shim and a node agent reaches here without
    /// flock's bookkeeping.
    pub handed_off_add: Vec<Duration>,
    /// ADDs of as many more pods to such a daemon, `concurrency` at a time, as the bench's
    /// runtime threads make a subject's, on a node emptied and settled: (pods, wall time).
    pub handed_off_concurrent: Option<Burst>,
    /// `flock_netns::setup` of as many more pods, `concurrency` at a time: (pods, wall time).
    /// What the kernel allows a node to take at that concurrency with nothing but the kernel
    /// work: the ceiling of a CNI's ADD throughput here.
    pub setup_concurrent: Option<Burst>,
}

impl Floor {
    /// Pods per second of [`setup_concurrent`](Self::setup_concurrent).
    pub fn concurrent_pods_per_s(&self) -> Option<f64> {
        pods_per_s(self.setup_concurrent)
    }

    /// Pods per second of [`handed_off_concurrent`](Self::handed_off_concurrent).
    pub fn handed_off_pods_per_s(&self) -> Option<f64> {
        pods_per_s(self.handed_off_concurrent)
    }
}

/// Sets up and detaches `pods` dual-stack pods with `flock-netns` alone, in a node
/// namespace of its own and a fresh pod namespace each, one at a time; sets up as many more
/// one at a time, each right after the runtime stand-in exec'd the shim (`flock` in
/// `bin_dir`) for `VERSION`; ADDs as many more through the shim to a stand-in daemon that
/// keeps no books, one at a time and then as many `concurrency` at a time
/// ([`handed_off_adds`]); then as many more, `concurrency` at a
/// time. Tears them all down (untimed) and lets the kernel settle, so what runs next does not
/// pay for it. Last, times `pods` round trips to an idle thread.
pub fn measure_kernel_floor(pods: usize, concurrency: usize, bin_dir: &Path) -> Result<Floor> {
    // VERSION reads no cache: the directory is never made.
    let runtime = flock_testkit::cni::Runtime::new(
        serde_json::json!({
            "cniVersion": "1.1.0",
            "name": "bench-floor",
            "plugins": [{ "type": "flock" }],
        }),
        [bin_dir],
        std::env::temp_dir().join("flock-bench-floor-cache"),
    )?;
    let node_ns = Netns::new("bfloor");
    let pod_nss: Vec<Netns> = (0..pods).map(|_| Netns::new("bfpod")).collect();
    let exec_nss: Vec<Netns> = (0..pods).map(|_| Netns::new("bfpod")).collect();
    let hand_nss: Vec<Netns> = (0..2 * pods).map(|_| Netns::new("bfpod")).collect();
    let conc_nss: Vec<Netns> = (0..pods).map(|_| Netns::new("bfpod")).collect();
    let specs = floor_specs(&pod_nss, 0);
    let exec_specs = floor_specs(&exec_nss, pods);
    let hand_specs = floor_specs(&hand_nss, 2 * pods);
    let conc_specs = floor_specs(&conc_nss, 4 * pods);
    // As in the agent: the process (here, a thread and the runtime's workers it spawns) sits
    // in the node's namespace, so node-side work needs no namespace thread.
    let node_path = node_ns.path();
    let floor = std::thread::scope(|s| {
        s.spawn(|| -> Result<Floor> {
            let file = std::fs::File::open(&node_path)
                .with_context(|| format!("open {}", node_path.display()))?;
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .with_context(|| format!("enter {}", node_path.display()))?;
            // The agent's runtime (`flock-agent run`): one thread.
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .context("tokio runtime for the kernel floor")?;
            rt.block_on(floor_cycles(
                [
                    specs.clone(),
                    exec_specs.clone(),
                    hand_specs.clone(),
                    conc_specs.clone(),
                ],
                concurrency,
                &runtime,
                &node_path,
                bin_dir,
            ))
        })
        .join()
        .unwrap_or_else(|_| bail!("the kernel floor thread panicked"))
    })?;
    drop(pod_nss);
    drop(exec_nss);
    drop(hand_nss);
    drop(conc_nss);
    drop(node_ns);
    // Deleted namespaces are cleaned up by the kernel in the background.
    std::thread::sleep(Duration::from_secs(2));
    let mut floor = floor;
    floor.idle_round_trip = idle_round_trips(pods)?;
    Ok(floor)
}

/// `n` round trips of 8 bytes over a Unix socket pair to an echoing thread on another CPU,
/// each after a millisecond in which both threads waited (one asleep, the other in its read):
/// as the shim and the agent meet in an ADD, the scheduler waking each on the CPU it last ran
/// on while that one idles. On a VM whose idle vCPUs halt, every message is then the wake-up
/// of a vCPU. Empty, with a line on stderr, when the two threads cannot be pinned to two CPUs
/// (one CPU, or a sandbox that refuses `sched_setaffinity`): unpinned, they may share a CPU.
fn idle_round_trips(n: usize) -> Result<Vec<Duration>> {
    use std::io::{Read, Write};
    let allowed = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))
        .context("sched_getaffinity")?;
    let cpus: Vec<usize> = (0..nix::sched::CpuSet::count())
        .filter(|&c| allowed.is_set(c).unwrap_or(false))
        .take(2)
        .collect();
    let [near_cpu, far_cpu] = cpus[..] else {
        eprintln!("xtask bench: one CPU: no round trip to an idle thread on another");
        return Ok(Vec::new());
    };
    // Pins the calling thread only: the caller's own affinity stays as it was.
    let pin = |cpu: usize| -> Result<()> {
        let mut set = nix::sched::CpuSet::new();
        set.set(cpu).context("CPU set")?;
        nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
            .with_context(|| format!("pin a thread to CPU {cpu}"))
    };
    let (mut near, mut far) =
        std::os::unix::net::UnixStream::pair().context("a Unix socket pair")?;
    let (far_pinned, far_pinned_rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(move || {
            let pinned = pin(far_cpu);
            let ok = pinned.is_ok();
            let _ = far_pinned.send(pinned);
            if !ok {
                return;
            }
            let mut buf = [0u8; 8];
            // Ends when the near side is dropped (0 bytes) or fails.
            while far.read_exact(&mut buf).is_ok() && far.write_all(&buf).is_ok() {}
        });
        s.spawn(move || {
            let pinned = pin(near_cpu).and_then(|()| {
                far_pinned_rx
                    .recv()
                    .context("the echo thread ended before it was pinned")?
            });
            if let Err(e) = pinned {
                // Dropping `near` ends the echo thread.
                eprintln!("xtask bench: no round trip to an idle thread: {e:#}");
                return Ok(Vec::new());
            }
            let mut times = Vec::with_capacity(n);
            let mut buf = [0u8; 8];
            for _ in 0..n {
                std::thread::sleep(Duration::from_millis(1));
                let t = Instant::now();
                near.write_all(&[1; 8])
                    .context("write to the echo thread")?;
                near.read_exact(&mut buf)
                    .context("read from the echo thread")?;
                times.push(t.elapsed());
            }
            Ok(times)
        })
        .join()
        .unwrap_or_else(|_| bail!("the round-trip thread panicked"))
    })
}

/// Dual-stack pods in `nss`, numbered from `first` (addresses unique across calls).
fn floor_specs(nss: &[Netns], first: usize) -> Vec<PodSpec> {
    nss.iter()
        .enumerate()
        .map(|(i, ns)| floor_spec(first + i, ns.path()))
        .collect()
}

/// The dual-stack pod numbered `i` of the floor, in the namespace at `netns`.
fn floor_spec(i: usize, netns: std::path::PathBuf) -> PodSpec {
    let cid = format!("floor-{i:05}");
    PodSpec {
        host_if: host_ifname(&cid, "eth0", 0),
        container_id: cid,
        netns,
        if_name: "eth0".into(),
        mtu: 1500,
        addresses: vec![
            format!("2001:db8:97::{:x}/128", i + 1).parse().expect("v6"),
            format!("10.97.{}.{}/32", (i + 1) / 256, (i + 1) % 256)
                .parse()
                .expect("v4"),
        ],
        anycast: vec![],
    }
}

/// Sets up each of `specs` in turn, right after `before` (untimed); the time of each setup.
async fn timed_setups(
    node: &NodeNs,
    specs: &[PodSpec],
    mut before: impl FnMut() -> Result<()>,
) -> Result<Vec<Duration>> {
    let mut times = Vec::with_capacity(specs.len());
    for spec in specs {
        before()?;
        let t = Instant::now();
        setup(node, spec)
            .await
            .with_context(|| format!("floor setup of {}", spec.container_id))?;
        times.push(t.elapsed());
    }
    Ok(times)
}

/// Tears down each of `specs` (untimed).
async fn teardown_all(node: &NodeNs, specs: &[PodSpec]) -> Result<()> {
    for spec in specs {
        flock_netns::teardown(node, spec)
            .await
            .with_context(|| format!("floor teardown of {}", spec.container_id))?;
    }
    Ok(())
}

async fn floor_cycles(
    [specs, exec_specs, hand_specs, conc_specs]: [Vec<PodSpec>; 4],
    concurrency: usize,
    runtime: &flock_testkit::cni::Runtime,
    node_path: &Path,
    bin_dir: &Path,
) -> Result<Floor> {
    // Shared by the concurrent tasks, as the agent shares it between its requests.
    let node = std::sync::Arc::new(NodeNs::current());
    let mut floor = Floor {
        setup: timed_setups(&node, &specs, || Ok(())).await?,
        ..Floor::default()
    };
    for spec in &specs {
        let t = Instant::now();
        detach(&node, spec)
            .await
            .with_context(|| format!("floor detach of {}", spec.container_id))?;
        floor.detach.push(t.elapsed());
    }
    teardown_all(&node, &specs).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Each after an exec of the shim, as the runtime's exec precedes a CNI's kernel work (on
    // this thread: the floor's runtime has nothing else to run meanwhile).
    floor.setup_after_exec = timed_setups(&node, &exec_specs, || {
        runtime
            .version("flock")
            .map(drop)
            .context("VERSION of the shim")
    })
    .await?;
    teardown_all(&node, &exec_specs).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Blocks this thread, as the VERSION execs above do: the daemon is a process of its own.
    // One set one at a time, the other at `concurrency`, each on a node emptied and settled,
    // as a subject's are.
    let (one_at_a_time, burst) = hand_specs.split_at(hand_specs.len() / 2);
    floor.handed_off_add = handed_off_adds(one_at_a_time, 1, node_path, bin_dir)?.0;
    teardown_all(&node, one_at_a_time).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    if !burst.is_empty() {
        let (_, wall) = handed_off_adds(burst, concurrency, node_path, bin_dir)?;
        floor.handed_off_concurrent = Some((burst.len(), wall));
        teardown_all(&node, burst).await?;
    }
    // As before a subject's concurrent phase: let the kernel finish with the torn-down pods.
    tokio::time::sleep(Duration::from_secs(2)).await;
    // `concurrency` tasks, each taking the next pod, as the bench's runtime threads do.
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let conc_specs = std::sync::Arc::new(conc_specs);
    let start = Instant::now();
    let tasks: Vec<_> = (0..concurrency.clamp(1, conc_specs.len().max(1)))
        .map(|_| {
            let (next, specs, node) = (next.clone(), conc_specs.clone(), node.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(spec) = specs.get(i) else {
                        return Ok::<_, anyhow::Error>(());
                    };
                    setup(&node, spec)
                        .await
                        .with_context(|| format!("floor setup of {}", spec.container_id))?;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.context("a kernel floor task")??;
    }
    floor.setup_concurrent = Some((conc_specs.len(), start.elapsed()));
    teardown_all(&node, &conc_specs).await?;
    Ok(floor)
}

/// ADDs of `specs` through the shim (`flock` in `bin_dir`), exec'd by the runtime stand-in
/// in the node's namespace with the conflist and the `CNI_ARGS` the bench gives flock's agent,
/// from `threads` threads as the bench's runtime makes a subject's ADDs, to a stand-in daemon:
/// this program again ([`handoff_daemon`]), a process of its own in that namespace, as the
/// agent is. For each call the daemon accepts, reads and decodes the request, parses its
/// configuration, calls `flock_netns::setup` and answers with the CNI result; it takes no lock,
/// allocates nothing and writes no store. So each call's time is an ADD as the runtime sees
/// it, with the exec, the two hand-offs between the shim and a daemon, and the kernel work, and
/// nothing of flock's own bookkeeping: what a CNI of a shim and a node agent (DESIGN §1) that
/// keeps no books reaches on this machine. Each call's time, and the wall time of all.
fn handed_off_adds(
    specs: &[PodSpec],
    threads: usize,
    node_path: &Path,
    bin_dir: &Path,
) -> Result<(Vec<Duration>, Duration)> {
    use std::io::{BufRead, Write};
    // Started from this thread, the daemon is in the node's namespace too.
    let exe = std::env::current_exe().context("this program's path")?;
    let dir = std::env::temp_dir().join(format!("flock-bench-handoff-{}", std::process::id()));
    let layout = flock_testkit::node::AgentLayout::new(&dir);
    let mut daemon = std::process::Command::new(&exe)
        .arg(HANDOFF_DAEMON)
        .arg(&layout.socket)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("start {} {HANDOFF_DAEMON}", exe.display()))?;
    let outcome = (|| {
        let run_dir = layout.socket.parent().unwrap_or(&dir);
        std::fs::create_dir_all(run_dir)
            .with_context(|| format!("create {}", run_dir.display()))?;
        // The pods, one per line; then the daemon binds its socket and says so.
        let mut pods = String::new();
        for spec in specs {
            pods.push_str(&handoff_line(spec));
            pods.push('\n');
        }
        let mut stdin = daemon.stdin.take().context("the daemon's stdin")?;
        stdin
            .write_all(pods.as_bytes())
            .context("write to the daemon")?;
        drop(stdin);
        let mut ready = String::new();
        std::io::BufReader::new(daemon.stdout.take().context("the daemon's stdout")?)
            .read_line(&mut ready)
            .context("read from the daemon")?;
        if ready.trim() != "ready" {
            bail!("the stand-in daemon did not start (it said {ready:?})");
        }
        let runtime = flock_testkit::cni::Runtime::new(
            layout.conflist("bench-floor"),
            [bin_dir],
            dir.join("cni-cache"),
        )?
        .in_netns(node_path);
        let atts: Vec<flock_testkit::cni::Attachment> = specs
            .iter()
            .enumerate()
            .map(|(i, spec)| {
                super::cri_attachment(
                    spec.container_id.clone(),
                    &spec.netns,
                    &format!("pod-floor-{i}"),
                    i,
                )
            })
            .collect();
        let add = |att: &flock_testkit::cni::Attachment| {
            runtime
                .add(att)
                .map(drop)
                .with_context(|| format!("ADD of {} to the stand-in daemon", att.container_id))
        };
        if threads > 1 {
            return super::concurrently(&atts, threads, add);
        }
        // On this thread, as the bench times a subject's sequential ADDs.
        let start = Instant::now();
        let mut times = Vec::with_capacity(atts.len());
        for att in &atts {
            let t = Instant::now();
            add(att)?;
            times.push(t.elapsed());
        }
        Ok((times, start.elapsed()))
    })();
    if outcome.is_err() {
        // A daemon that failed has said why on stderr and ended; one that still waits for
        // calls that will not come is stopped.
        std::thread::sleep(Duration::from_millis(200));
        let _ = daemon.kill();
    }
    let ended = daemon.wait_with_output();
    let _ = std::fs::remove_dir_all(&dir);
    let ended = ended.context("wait for the stand-in daemon")?;
    let said = String::from_utf8_lossy(&ended.stderr).trim().to_owned();
    match outcome {
        Err(e) if !said.is_empty() => {
            Err(e.context(format!("the stand-in daemon ({}): {said}", ended.status)))
        }
        Err(e) => Err(e),
        Ok(_) if !ended.status.success() => {
            bail!("the stand-in daemon failed ({}): {said}", ended.status)
        }
        Ok(measured) => Ok(measured),
    }
}

/// The hidden command that runs the stand-in daemon of [`handed_off_adds`].
pub const HANDOFF_DAEMON: &str = "__bench-handoff-daemon";

/// A pod as [`handed_off_adds`] tells the daemon of it: container, host veth, namespace and
/// addresses (comma-separated), separated by spaces.
fn handoff_line(spec: &PodSpec) -> String {
    let addresses: Vec<String> = spec.addresses.iter().map(ToString::to_string).collect();
    format!(
        "{} {} {} {}",
        spec.container_id,
        spec.host_if,
        spec.netns.display(),
        addresses.join(",")
    )
}

/// The pod of a line of [`handoff_line`].
fn parse_handoff_line(line: &str) -> Result<PodSpec> {
    let fields: Vec<&str> = line.split(' ').collect();
    let [container_id, host_if, netns, addresses] = fields[..] else {
        bail!("a pod line {line:?}: not four fields");
    };
    let addresses = addresses
        .split(',')
        .map(|a| {
            a.parse()
                .with_context(|| format!("a pod line {line:?}: address {a:?}"))
        })
        .collect::<Result<_>>()?;
    Ok(PodSpec {
        container_id: container_id.to_owned(),
        netns: netns.into(),
        if_name: "eth0".into(),
        host_if: host_if.to_owned(),
        mtu: 1500,
        addresses,
        anycast: vec![],
    })
}

/// The stand-in daemon of [`handed_off_adds`]: `args` is its socket; stdin lists the pods,
/// one [`handoff_line`] each. Binds the socket, prints `ready`, serves one call per pod, each
/// as a task of its own (as the agent does) on a one-thread runtime (as the agent's), and
/// ends. A call that fails is printed on stderr at once, and ends the daemon.
pub fn handoff_daemon(args: &[String]) -> Result<()> {
    use std::io::{Read, Write};
    let [socket] = args else {
        bail!("usage: xtask {HANDOFF_DAEMON} SOCKET, the pods on stdin");
    };
    let mut lines = String::new();
    std::io::stdin()
        .read_to_string(&mut lines)
        .context("read the pods")?;
    let by_id: std::collections::HashMap<String, PodSpec> = lines
        .lines()
        .map(|line| parse_handoff_line(line).map(|spec| (spec.container_id.clone(), spec)))
        .collect::<Result<_>>()?;
    let by_id = std::sync::Arc::new(by_id);
    let listener =
        std::os::unix::net::UnixListener::bind(socket).with_context(|| format!("bind {socket}"))?;
    listener
        .set_nonblocking(true)
        .context("a non-blocking listener")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    rt.block_on(async {
        let listener = tokio::net::UnixListener::from_std(listener).context("the listener")?;
        // The node's netlink socket opened before the first call, as the agent's is by its
        // reconcile at start, which lists the host's veths.
        let node = std::sync::Arc::new(NodeNs::current());
        flock_netns::list_host_ifaces(&node)
            .await
            .context("list the node's veths")?;
        let mut stdout = std::io::stdout();
        writeln!(stdout, "ready").and_then(|()| stdout.flush())?;
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..by_id.len() {
            let (stream, _) = listener.accept().await.context("accept")?;
            let (node, by_id) = (node.clone(), by_id.clone());
            tasks.spawn(async move {
                let served = serve_setup(&node, &by_id, stream).await;
                if let Err(e) = &served {
                    eprintln!("{e:#}");
                }
                served
            });
            while let Some(served) = tasks.try_join_next() {
                served.context("a call panicked")??;
            }
        }
        while let Some(served) = tasks.join_next().await {
            served.context("a call panicked")??;
        }
        Ok(())
    })
}

/// One call of the stand-in daemon of [`handed_off_adds`].
async fn serve_setup(
    node: &NodeNs,
    specs: &std::collections::HashMap<String, PodSpec>,
    mut stream: tokio::net::UnixStream,
) -> Result<()> {
    use flock_cni_proto::rpc::{self, LineDecoder, Response};
    use flock_cni_proto::{CniResult, Interface, IpConfig, IpPrefix, Route};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut decoder = LineDecoder::new();
    let mut buf = [0u8; 16 * 1024];
    let line = loop {
        if let Some(line) = decoder.next_line()? {
            break line;
        }
        let n = stream.read(&mut buf).await.context("read the request")?;
        if n == 0 {
            bail!("the shim closed its connection before a whole request");
        }
        decoder.push(&buf[..n]);
    };
    let req = rpc::decode_request(&line)?;
    let conf = flock_cni_proto::NetConf::from_value(&req.config)
        .and_then(|c| flock_cni_proto::FlockNetConf::from_netconf(&c))
        .map_err(|e| anyhow::anyhow!("the request's configuration: {e}"))?;
    let Some(spec) = specs.get(&req.container_id) else {
        bail!(
            "a request for {:?}, not a pod of the floor",
            req.container_id
        );
    };
    let done = setup(node, spec)
        .await
        .with_context(|| format!("setup of {}", spec.container_id))?;
    // The shape of the agent's result (`flock_agent::agent::result::cni_result`).
    let mut result = CniResult {
        interfaces: vec![
            Interface {
                name: done.host_if,
                mac: Some(done.host_mac),
                mtu: Some(spec.mtu),
                ..Interface::default()
            },
            Interface {
                name: done.pod_if,
                mac: Some(done.pod_mac),
                mtu: Some(spec.mtu),
                sandbox: Some(req.netns.clone()),
                ..Interface::default()
            },
        ],
        ..CniResult::default()
    };
    for a in &spec.addresses {
        let (gateway, any) = if a.addr().is_ipv6() {
            (
                std::net::IpAddr::V6(flock_netns::GATEWAY6),
                std::net::Ipv6Addr::UNSPECIFIED.into(),
            )
        } else {
            (
                std::net::IpAddr::V4(flock_netns::GATEWAY4),
                std::net::Ipv4Addr::UNSPECIFIED.into(),
            )
        };
        result.ips.push(IpConfig {
            address: IpPrefix::new(a.addr(), a.prefix_len())?,
            gateway: Some(gateway),
            interface: Some(1),
        });
        result
            .routes
            .push(Route::via(IpPrefix::new(any, 0)?, Some(gateway)));
    }
    stream
        .write_all(&rpc::encode_line(&Response::ok(
            result.to_value(conf.cni_version),
        )))
        .await
        .context("write the answer")?;
    let _ = stream.shutdown().await;
    Ok(())
}

/// Execs the first plugin of `runtime`'s list for `VERSION`, `n` times.
pub fn measure_version_exec(
    runtime: &flock_testkit::cni::Runtime,
    plugin: &str,
    n: usize,
) -> Result<Vec<Duration>> {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            runtime
                .version(plugin)
                .with_context(|| format!("VERSION of {plugin}"))?;
            Ok(t.elapsed())
        })
        .collect()
}

/// The breakdown table (markdown), the floor rows under it, and the goal of issue 13 checked.
pub fn render(b: &Breakdown, floor: &Floor) -> String {
    let mut out = String::from(
        "| phase (sequential) | ADD p50 | ADD p99 | DEL p50 | DEL p99 |\n|---|---:|---:|---:|---:|\n",
    );
    let cell = |op: &str, phase: &str, p: f64| {
        b.get(op, phase)
            .map_or("—".to_owned(), |s| format!("{:.3}", percentile_ms(s, p)))
    };
    let mut phases: Vec<String> = vec![
        "outside the agent".into(),
        "to the agent".into(),
        "from the agent".into(),
    ];
    for p in ADD_PHASES.iter().chain(DEL_PHASES) {
        if !phases.iter().any(|q| q == p) {
            phases.push((*p).to_owned());
        }
    }
    phases.extend(KERNEL_DETAIL.iter().map(|p| format!("kernel: {p}")));
    phases.push("agent total".into());
    for phase in &phases {
        out.push_str(&format!(
            "| {phase} | {} | {} | {} | {} |\n",
            cell("ADD", phase, 50.0),
            cell("ADD", phase, 99.0),
            cell("DEL", phase, 50.0),
            cell("DEL", phase, 99.0)
        ));
    }
    let floor_row = |name: &str, add: &[Duration], del: &[Duration]| {
        let f = |s: &[Duration], p| {
            if s.is_empty() {
                "—".to_owned()
            } else {
                format!("{:.3}", percentile_ms(s, p))
            }
        };
        format!(
            "| {name} | {} | {} | {} | {} |\n",
            f(add, 50.0),
            f(add, 99.0),
            f(del, 50.0),
            f(del, 99.0)
        )
    };
    out.push_str(&floor_row(
        "**floor**: flock-netns alone (setup / detach)",
        &floor.setup,
        &floor.detach,
    ));
    out.push_str(&floor_row(
        "**floor**: flock-netns alone, each setup right after a shim exec",
        &floor.setup_after_exec,
        &[],
    ));
    out.push_str(&floor_row(
        "**floor**: shim exec of VERSION",
        &floor.version_exec,
        &floor.version_exec,
    ));
    out.push_str(&floor_row(
        "**floor**: a whole ADD, runtime → shim → a daemon that only decodes, sets up and answers",
        &floor.handed_off_add,
        &[],
    ));
    out.push_str(&floor_row(
        "**floor**: Unix socket round trip to an idle thread",
        &floor.idle_round_trip,
        &floor.idle_round_trip,
    ));
    out
}

/// ADD p50 against 1.5 × (kernel floor + VERSION exec p50), in ms: (measured, bound).
///
/// The kernel floor is the smaller of two p50s of the same `flock_netns::setup`: alone
/// (`floor.setup`) and inside the agent (its `kernel` phase). On a shared VM either can come
/// out higher — idle vCPUs wake slowly, a busy machine steals time — and the smaller one
/// makes the goal the stricter.
pub fn add_goal(add_seq: &[Duration], floor: &Floor, breakdown: Option<&Breakdown>) -> (f64, f64) {
    let alone = percentile_ms(&floor.setup, 50.0);
    let in_agent = breakdown
        .and_then(|b| b.get("ADD", "kernel"))
        .map_or(f64::INFINITY, |s| percentile_ms(s, 50.0));
    let bound = 1.5 * (alone.min(in_agent) + percentile_ms(&floor.version_exec, 50.0));
    (percentile_ms(add_seq, 50.0), bound)
}

/// 1.5 × (p50 of the floor's setups after a shim exec + VERSION exec p50), in ms; `None`
/// when the floor has no such setups.
pub fn add_bound_after_exec(floor: &Floor) -> Option<f64> {
    (!floor.setup_after_exec.is_empty() && !floor.version_exec.is_empty()).then(|| {
        1.5 * (percentile_ms(&floor.setup_after_exec, 50.0)
            + percentile_ms(&floor.version_exec, 50.0))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hand_off_daemon_reads_back_the_pods_it_is_told_of() {
        let spec = floor_spec(4097, "/run/netns/bfpod-x".into());
        let line = handoff_line(&spec);
        assert_eq!(parse_handoff_line(&line).expect("parse"), spec);
        let e = parse_handoff_line("floor-1 veth /run/netns/p 2001:db8::1/128,nope")
            .expect_err("a bad address");
        assert!(format!("{e:#}").contains(r#"address "nope""#), "{e:#}");
        let e = parse_handoff_line("floor-1 veth").expect_err("two fields");
        assert!(format!("{e:#}").contains("not four fields"), "{e:#}");
    }

    #[test]
    fn outside_the_agent_is_the_runtimes_time_less_the_agents() {
        let trace = concat!(
            r#"{"op":"ADD","containerId":"a","ifName":"eth0","outcome":"ok","totalUs":800,"#,
            r#""phases":{"read":20,"kernel":700,"reply":80},"kernel":{"veth":400,"host":200,"pod":150,"anycast":0},"#,
            r#""startMonoUs":5000400,"endMonoUs":5001200}"#,
            "\n",
            r#"{"op":"DEL","containerId":"a","ifName":"eth0","outcome":"ok","totalUs":300,"phases":{"kernel":300}}"#,
        );
        let observed = [
            Observed {
                op: "ADD",
                container_id: "a".into(),
                elapsed: Duration::from_micros(1300),
                started_mono: Some(Duration::from_micros(5_000_000)),
            },
            Observed {
                op: "DEL",
                container_id: "a".into(),
                elapsed: Duration::from_micros(1000),
                // a trace line without the clock (an older agent): no split
                started_mono: Some(Duration::from_micros(6_000_000)),
            },
        ];
        let b = Breakdown::from_trace(trace, &observed).unwrap();
        assert_eq!(
            b.get("ADD", "outside the agent").unwrap(),
            &vec![Duration::from_micros(500)]
        );
        // 400 µs before the agent started, 100 µs after it ended: 500 µs outside
        assert_eq!(
            b.get("ADD", "to the agent").unwrap(),
            &vec![Duration::from_micros(400)]
        );
        assert_eq!(
            b.get("ADD", "from the agent").unwrap(),
            &vec![Duration::from_micros(100)]
        );
        assert!(b.get("DEL", "to the agent").is_none());
        assert_eq!(
            b.get("ADD", "kernel: veth").unwrap(),
            &vec![Duration::from_micros(400)]
        );
        let table = render(&b, &Floor::default());
        assert!(
            table.contains("| outside the agent | 0.500 | 0.500 | 0.700 | 0.700 |"),
            "{table}"
        );
        assert!(
            table.contains("| kernel | 0.700 | 0.700 | 0.300 | 0.300 |"),
            "{table}"
        );
        let missing = Breakdown::from_trace("", &observed).unwrap_err();
        assert!(missing.to_string().contains("no ADD of a"), "{missing}");
    }

    #[test]
    fn the_floor_after_an_exec_gives_a_second_bound_and_rows_of_its_own() {
        let ms = |v: &[u64]| {
            v.iter()
                .map(|&us| Duration::from_micros(us))
                .collect::<Vec<_>>()
        };
        let mut floor = Floor {
            setup: ms(&[500, 550, 600]),
            version_exec: ms(&[150, 170, 190]),
            idle_round_trip: ms(&[90, 100, 110]),
            ..Floor::default()
        };
        // No setups after an exec (fewer than one pod, or an older harness): no second bound.
        assert_eq!(add_bound_after_exec(&floor), None);
        floor.setup_after_exec = ms(&[600, 650, 700]);
        let bound = add_bound_after_exec(&floor).unwrap();
        assert!((bound - 1.5 * (0.650 + 0.170)).abs() < 1e-9, "{bound}");
        let table = render(&Breakdown::default(), &floor);
        assert!(
            table.contains(
                "| **floor**: flock-netns alone, each setup right after a shim exec | 0.650 | 0.700 | — | — |"
            ),
            "{table}"
        );
        assert!(
            table.contains("| **floor**: Unix socket round trip to an idle thread | 0.100 | 0.110 | 0.100 | 0.110 |"),
            "{table}"
        );
    }

    #[test]
    fn an_idle_round_trip_is_timed_once_per_sample() {
        let times = idle_round_trips(3).unwrap();
        // One CPU: nothing to measure between two.
        let cpus = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)).unwrap();
        let n = (0..nix::sched::CpuSet::count())
            .filter(|&c| cpus.is_set(c).unwrap_or(false))
            .count();
        assert_eq!(times.len(), if n >= 2 { 3 } else { 0 });
        assert!(times.iter().all(|t| *t > Duration::ZERO), "{times:?}");
    }
}
