//! What the bench's measurements share: fresh pod namespaces, the attachment a runtime
//! stand-in hands a plugin, calls made from several threads at once, and a process's CPU time.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use flock_testkit::Netns;
use flock_testkit::cni::Attachment;

/// `n` fresh namespaces named from `prefix`.
pub(super) fn fresh_netns(prefix: &str, n: usize) -> Vec<Netns> {
    (0..n).map(|_| Netns::new(prefix)).collect()
}

/// An attachment as containerd's CRI plugin makes it: container `id` in `netns`, pod
/// `pod_name` (namespace `bench`) with a UID numbered `i`.
pub(super) fn cri_attachment(id: String, netns: &Path, pod_name: &str, i: usize) -> Attachment {
    Attachment::new(id.clone(), netns, "eth0")
        .with_arg("IgnoreUnknown", "1")
        .with_arg("K8S_POD_NAMESPACE", "bench")
        .with_arg("K8S_POD_NAME", pod_name)
        .with_arg("K8S_POD_INFRA_CONTAINER_ID", id)
        .with_arg("K8S_POD_UID", format!("00000000-0000-4000-8000-{i:012}"))
}

/// Runs `op` on every attachment from `threads` threads; returns each call's
/// latency and the wall time of the whole phase.
pub(super) fn concurrently<F>(
    atts: &[Attachment],
    threads: usize,
    op: F,
) -> Result<(Vec<Duration>, Duration)>
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

/// The CPU time process `pid` has used so far, every thread of it alive now: the sum of its
/// threads' run times in `/proc/PID/task/TID/schedstat` (nanoseconds; `/proc/PID/stat`'s
/// ticks are 10 ms, a tenth of a concurrent phase's whole time).
pub(super) fn cpu_time(pid: u32) -> Result<Duration> {
    let dir = format!("/proc/{pid}/task");
    let mut total = 0u64;
    for task in std::fs::read_dir(&dir).with_context(|| format!("read {dir}"))? {
        let path = task
            .with_context(|| format!("read {dir}"))?
            .path()
            .join("schedstat");
        // a thread that ended since the listing has nothing to add
        let Ok(stat) = std::fs::read_to_string(&path) else {
            continue;
        };
        total += stat
            .split_whitespace()
            .next()
            .and_then(|ns| ns.parse::<u64>().ok())
            .with_context(|| format!("{}: {stat:?}", path.display()))?;
    }
    Ok(Duration::from_nanos(total))
}

/// How [`settle_kernel`] found the kernel.
#[derive(Debug)]
pub(super) struct Settled {
    /// How long it waited.
    pub waited: Duration,
    /// The kernel's network namespaces when it stopped waiting (`None`: not readable here).
    pub namespaces: Option<u64>,
    /// What it stopped waiting for before its deadline, if anything.
    pub unsettled: Option<&'static str>,
}

impl std::fmt::Display for Settled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.1} s", self.waited.as_secs_f64())?;
        if let Some(n) = self.namespaces {
            write!(f, ", {n} network namespaces")?;
        }
        match self.unsettled {
            Some(what) => write!(f, "; gave up waiting for {what}"),
            None => Ok(()),
        }
    }
}

/// Waits until the kernel is done with what was just torn down, so that the next phase does
/// not pay for it: the network namespaces dropped freed (the kernel frees them in a worker of
/// its own, which takes the lock every ADD takes), at most `namespaces_before` left or their
/// number steady for a second; then the machine quiet, less than a tenth of a CPU busy over
/// 200 ms. It replaces a fixed pause of two seconds, which knew neither: here the two waits
/// take 0.2–1.3 s, and a machine busy with something else needs longer. Each wait gives up
/// after [`SETTLE_LIMIT`], and says so.
pub(super) fn settle_kernel(namespaces_before: Option<u64>) -> Settled {
    let start = Instant::now();
    let mut unsettled = None;
    let mut last = None;
    let mut steady_since = start;
    loop {
        match (live_namespaces(), namespaces_before) {
            (None, _) => break,
            (Some(n), Some(before)) if n <= before => break,
            (Some(n), _) => {
                if last != Some(n) {
                    last = Some(n);
                    steady_since = Instant::now();
                } else if steady_since.elapsed() >= Duration::from_secs(1) {
                    break;
                }
            }
        }
        if start.elapsed() >= SETTLE_LIMIT {
            unsettled = Some("the network namespaces to be freed");
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let quiet_from = Instant::now();
    loop {
        match busy_ticks_over(Duration::from_millis(200)) {
            // ticks of 10 ms: 200 ms on every CPU, less than a tenth of one CPU busy
            Some(busy) if busy < 2 => break,
            Some(_) if quiet_from.elapsed() < SETTLE_LIMIT => {}
            Some(_) => {
                unsettled = unsettled.or(Some("the machine to be quiet"));
                break;
            }
            None => {
                // no /proc/stat: the pause this replaced
                std::thread::sleep(Duration::from_secs(2));
                break;
            }
        }
    }
    Settled {
        waited: start.elapsed(),
        namespaces: live_namespaces(),
        unsettled,
    }
}

/// How long [`settle_kernel`] waits for each of its conditions at most.
const SETTLE_LIMIT: Duration = Duration::from_secs(30);

/// The kernel's network namespaces: the `net_namespace` objects `/proc/slabinfo` counts
/// (readable by root; `None` elsewhere, or where the kernel merged that cache into another).
pub(super) fn live_namespaces() -> Option<u64> {
    namespaces_in_slabinfo(&std::fs::read_to_string("/proc/slabinfo").ok()?)
}

/// The active `net_namespace` objects of a `/proc/slabinfo`.
fn namespaces_in_slabinfo(slabinfo: &str) -> Option<u64> {
    slabinfo.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        (fields.next() == Some("net_namespace"))
            .then(|| fields.next()?.parse().ok())
            .flatten()
    })
}

/// The machine's busy clock ticks (user, nice, system, irq, softirq: every CPU's, from
/// `/proc/stat`) over the next `window`; `None` without `/proc/stat`.
fn busy_ticks_over(window: Duration) -> Option<u64> {
    let busy = || busy_ticks(&std::fs::read_to_string("/proc/stat").ok()?);
    let before = busy()?;
    std::thread::sleep(window);
    Some(busy()?.saturating_sub(before))
}

/// The busy ticks of a `/proc/stat`'s `cpu` line: user, nice, system, irq and softirq (not
/// idle, iowait, nor the steal of a virtual machine's host).
fn busy_ticks(stat: &str) -> Option<u64> {
    let ticks = cpu_ticks(stat)?;
    [0, 1, 2, 5, 6].iter().map(|&i| ticks.get(i)).sum()
}

/// The clock ticks the host of this virtual machine took from it so far, every CPU's (the
/// steal of `/proc/stat`); `None` where it is not counted. Time stolen while a phase runs
/// lands on whatever ran then, so the bench reports it beside each round.
pub(super) fn steal_ticks() -> Option<u64> {
    steal_of(&std::fs::read_to_string("/proc/stat").ok()?)
}

fn steal_of(stat: &str) -> Option<u64> {
    cpu_ticks(stat)?.get(7).copied()
}

/// The numbers of a `/proc/stat`'s `cpu` line: user, nice, system, idle, iowait, irq,
/// softirq, steal…
fn cpu_ticks(stat: &str) -> Option<Vec<u64>> {
    let cpu = stat.lines().find(|l| l.starts_with("cpu "))?;
    cpu.split_whitespace()
        .skip(1)
        .map(|t| t.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_namespaces_are_read_from_their_own_slab_cache() {
        let slabinfo = "slabinfo - version: 2.1\n\
            # name <active_objs> <num_objs> <objsize> <objperslab> <pagesperslab> : …\n\
            net_namespace_x     9     91   4288    7    8 : tunables    0    0    0\n\
            net_namespace         44     91   4288    7    8 : tunables    0    0    0\n";
        assert_eq!(namespaces_in_slabinfo(slabinfo), Some(44));
        assert_eq!(namespaces_in_slabinfo("kmalloc-64 1 2 64 64 1\n"), None);
    }

    #[test]
    fn busy_ticks_leave_out_idle_iowait_and_steal() {
        // user nice system idle iowait irq softirq steal guest guest_nice
        let stat = "cpu  100 2 30 5000 40 1 7 900 0 0\ncpu0 50 1 15 2500 20 0 3 450 0 0\n";
        assert_eq!(busy_ticks(stat), Some(100 + 2 + 30 + 1 + 7));
        assert_eq!(busy_ticks("intr 1 2\n"), None);
        assert_eq!(steal_of(stat), Some(900));
        // a kernel that counts no steal
        assert_eq!(steal_of("cpu  100 2 30 5000 40 1 7\n"), None);
    }
}
