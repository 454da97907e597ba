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
