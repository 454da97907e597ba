//! The floor measured in the bench's run: `flock-netns` alone setting up and detaching pods,
//! the shim exec'd for `VERSION`, and a round trip to an idle thread. (The ADDs handed off to a
//! daemon that keeps no books are made in flock's own phases, interleaved with its calls: see
//! [`super::measure`].)

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use flock_netns::{NodeNs, PodSpec, detach, host_ifname, setup};
use flock_testkit::Netns;

use super::Floor;
use super::calls::fresh_netns;

/// The prefix of the floor's pod namespaces (the hand-off floor's too).
pub(super) const FLOOR_POD_PREFIX: &str = "bfpod";

/// Pods taken at some concurrency, and the wall time they took.
pub type Burst = (usize, Duration);

/// The median pods per second of `bursts` (the lower middle of an even count); `None` when
/// there is none.
pub fn median_pods_per_s(bursts: &[Burst]) -> Option<f64> {
    let mut rates: Vec<f64> = bursts
        .iter()
        .map(|(n, wall)| *n as f64 / wall.as_secs_f64())
        .collect();
    rates.sort_by(f64::total_cmp);
    rates.get(rates.len().saturating_sub(1) / 2).copied()
}

impl Floor {
    /// Pods per second of [`setup_concurrent`](Self::setup_concurrent), the rounds' median.
    pub fn concurrent_pods_per_s(&self) -> Option<f64> {
        median_pods_per_s(&self.setup_concurrent)
    }

    /// Pods per second of [`handed_off_concurrent`](Self::handed_off_concurrent), the
    /// rounds' median.
    pub fn handed_off_pods_per_s(&self) -> Option<f64> {
        median_pods_per_s(&self.handed_off_concurrent)
    }
}

/// Sets up and detaches `pods` dual-stack pods with `flock-netns` alone, in a node
/// namespace of its own and a fresh pod namespace each, one at a time; sets up as many more
/// one at a time, each right after the runtime stand-in exec'd the shim (`flock` in
/// `bin_dir`) for `VERSION`; then as many more, `concurrency` at a time. Tears them all down
/// (untimed) and lets the kernel settle, so what runs next does not pay for it. Last, times
/// `pods` round trips to an idle thread. The floor's pods are numbered `0..pods`,
/// `pods..2 × pods` and `4 × pods..5 × pods`; the hand-off floor's, `2 × pods..4 × pods`
/// ([`HANDOFF_FIRST`]).
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
    let namespaces_before = super::calls::live_namespaces();
    let node_ns = Netns::new("bfloor");
    let pod_nss = fresh_netns(FLOOR_POD_PREFIX, pods);
    let exec_nss = fresh_netns(FLOOR_POD_PREFIX, pods);
    let conc_nss = fresh_netns(FLOOR_POD_PREFIX, pods);
    let specs = floor_specs(&pod_nss, 0);
    let exec_specs = floor_specs(&exec_nss, pods);
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
                [specs.clone(), exec_specs.clone(), conc_specs.clone()],
                concurrency,
                &runtime,
            ))
        })
        .join()
        .unwrap_or_else(|_| bail!("the kernel floor thread panicked"))
    })?;
    drop(pod_nss);
    drop(exec_nss);
    drop(conc_nss);
    drop(node_ns);
    // Deleted namespaces are cleaned up by the kernel in the background.
    let settled = super::calls::settle_kernel(namespaces_before);
    eprintln!("xtask bench: the kernel settled after the floor's pods in {settled}");
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

/// The hand-off floor's pods of the sequential phase are numbered from `HANDOFF_FIRST × pods`,
/// those of its burst from `(HANDOFF_FIRST + 1) × pods`.
pub(super) const HANDOFF_FIRST: usize = 2;

/// Dual-stack pods in `nss`, numbered from `first` (addresses unique across calls).
pub(super) fn floor_specs(nss: &[Netns], first: usize) -> Vec<PodSpec> {
    nss.iter()
        .enumerate()
        .map(|(i, ns)| floor_spec(first + i, ns.path()))
        .collect()
}

/// The dual-stack pod numbered `i` of the floor, in the namespace at `netns`.
pub(super) fn floor_spec(i: usize, netns: std::path::PathBuf) -> PodSpec {
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
        default_route: true,
        routes: vec![],
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
    [specs, exec_specs, conc_specs]: [Vec<PodSpec>; 3],
    concurrency: usize,
    runtime: &flock_testkit::cni::Runtime,
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
    floor
        .setup_concurrent
        .push((conc_specs.len(), start.elapsed()));
    teardown_all(&node, &conc_specs).await?;
    Ok(floor)
}

#[cfg(test)]
mod tests {
    use super::*;

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
