//! One subject's run: its sequential and concurrent ADDs and DELs through the runtime
//! stand-in, its daemon's RSS and CPU time, and the attachments the stand-in hands the
//! plugins. For flock, the hand-off floor's ADDs are made in the same phases, interleaved
//! with flock's (see [`HandOffFloor`]), so that what the machine does meanwhile lands on both
//! and not in their ratio.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use flock_testkit::Netns;
use flock_testkit::cni::{Attachment, Runtime};

use super::breakdown::{self, Breakdown, Observed};
use super::calls::{
    concurrently, cpu_time, cri_attachment, fresh_netns, live_namespaces, settle_kernel,
};
use super::floor::{FLOOR_POD_PREFIX, HANDOFF_FIRST, floor_specs};
use super::handoff::HandOff;
use super::{Figures, Floor, Options, SetupContext, Subject, SubjectConfig};

/// The hand-off floor measured in a subject's phases: its ADDs and DELs one at a time, each
/// beside one of the subject's (which of the two goes first alternates from pod to pod); its burst
/// at the bench's concurrency in parts alternating with the subject's ([`BURST_PARTS`]). On
/// the subject's node, the daemon in the node's namespace as the agent is.
pub(super) struct HandOffFloor<'a> {
    /// Where its figures go: [`Floor::handed_off_add`], [`Floor::handed_off_del`],
    /// [`Floor::handed_off_concurrent`], [`Floor::handed_off_cpu_per_add`].
    pub floor: &'a mut Floor,
    /// Its first sequential ADD and DEL and the first part of its burst before the
    /// subject's (else after): alternated from round to round.
    pub first: bool,
    /// Where the shim (`flock`) is.
    pub bin_dir: &'a Path,
}

pub(super) fn run_subject(
    subject: &mut dyn Subject,
    opts: &Options,
    work_dir: &Path,
    release_dir: &Path,
    hand_off: Option<HandOffFloor<'_>>,
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
            measure(&*subject, &node, config, opts, work_dir, hand_off)
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
    mut hand_off: Option<HandOffFloor<'_>>,
) -> Result<Figures> {
    let runtime = Runtime::new(config.conflist, config.bin_dirs, work_dir.join("cni-cache"))?
        .in_netns(node.path());
    let key = subject.key().to_owned();
    // What the burst waits for the kernel to be back to, once the pods before it are gone.
    let namespaces_before = live_namespaces();

    // Sequential: N ADDs, RSS with N pods, N DELs.
    let pods = make_pods(opts.pods);
    let atts: Vec<Attachment> = pods
        .iter()
        .enumerate()
        .map(|(i, ns)| attachment(&key, "seq", i, ns))
        .collect();
    let mut add_seq = Vec::with_capacity(atts.len());
    let mut del_seq = Vec::with_capacity(atts.len());
    // The machine's monotonic clock at each call's start, for the agent's trace to compare.
    let mut add_mono = Vec::with_capacity(atts.len());
    let mut del_mono = Vec::with_capacity(atts.len());
    // The ADDs, the RSS with `rss_pods` pods, the DELs; with the hand-off floor's daemon, one
    // of its ADDs beside each of the subject's and one of its DELs beside each DEL (see
    // `one_by_one`).
    let mut sequential =
        |floor: Option<(&HandOff, bool)>| -> Result<(Option<u64>, Vec<Duration>, Vec<Duration>)> {
            let floor_adds = one_by_one(
                &runtime,
                &atts,
                Call::Add,
                floor,
                (&mut add_seq, &mut add_mono),
            )?;
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
            let floor_dels = one_by_one(
                &runtime,
                &atts,
                Call::Del,
                floor,
                (&mut del_seq, &mut del_mono),
            )?;
            Ok((rss_kib, floor_adds, floor_dels))
        };
    // The hand-off floor's pods stay up until the subject's DELs are done, as the subject's do.
    let mut floor_pods = Vec::new();
    let rss_kib = match &mut hand_off {
        None => sequential(None)?.0,
        Some(h) => {
            floor_pods = make_floor_pods(opts.pods);
            let specs = floor_specs(&floor_pods, HANDOFF_FIRST * opts.pods);
            let first = h.first;
            let ((rss_kib, adds, dels), _) =
                HandOff::run(&specs, true, &node.path(), h.bin_dir, |daemon| {
                    sequential(Some((daemon, first)))
                })?;
            h.floor.handed_off_add.extend(adds);
            h.floor.handed_off_del.extend(dels);
            rss_kib
        }
    };
    drop(pods);
    drop(floor_pods);
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

    // Concurrent: `BURSTS` bursts, each of fresh pods on a node emptied and settled, at the
    // bench's concurrency. In each, first a wave of ADDs, one per thread, untimed, by the
    // subject and the hand-off floor alike: in runs timing each part on its own, whichever
    // part came first took up to twice as long as the parts after it (a daemon just started,
    // a machine just idle), and whoever made it paid for that in the round's ratio. Then the
    // burst; the hand-off floor's is made in parts between the subject's (see `BURST_PARTS`).
    let warm = opts.concurrency.min(opts.pods);
    let pid = subject.daemon_pid();
    let mut add_conc = Vec::with_capacity(BURSTS * opts.pods);
    let mut del_conc = Vec::with_capacity(BURSTS * (warm + opts.pods));
    let mut add_conc_wall = Duration::ZERO;
    let mut daemon_cpu = Duration::ZERO;
    let mut floor_wall = Duration::ZERO;
    let mut floor_cpu = Duration::ZERO;
    for b in 0..BURSTS {
        settle(node, namespaces_before);
        let pods = make_pods(warm + opts.pods);
        let atts: Vec<Attachment> = pods
            .iter()
            .enumerate()
            .map(|(i, ns)| attachment(&key, &format!("conc{b}"), i, ns))
            .collect();
        // The subject's ADDs of `range` at the bench's concurrency: its daemon's CPU time
        // added up and, when `timed`, their times and their wall time.
        let mut burst = |range: std::ops::Range<usize>, timed: bool| -> Result<()> {
            let cpu_before = pid.map(cpu_time).transpose()?;
            let (times, wall) = concurrently(&atts[range], opts.concurrency, |a| {
                runtime
                    .add(a)
                    .map(drop)
                    .with_context(|| format!("ADD {}", a.container_id))
            })?;
            if let (Some(pid), Some(before)) = (pid, cpu_before) {
                daemon_cpu += cpu_time(pid)?.saturating_sub(before);
            }
            if timed {
                add_conc.extend(times);
                add_conc_wall += wall;
            }
            Ok(())
        };
        let mut floor_pods = Vec::new();
        match &hand_off {
            None => {
                burst(0..warm, false)?;
                burst(warm..atts.len(), true)?;
            }
            Some(h) => {
                floor_pods = make_floor_pods(warm + opts.pods);
                let specs = floor_specs(&floor_pods, (HANDOFF_FIRST + 1) * opts.pods);
                // which of the two goes first changes from burst to burst too
                let first = h.first != (b % 2 == 1);
                let (wall, cpu) = HandOff::run(&specs, false, &node.path(), h.bin_dir, |daemon| {
                    daemon.burst(0..warm, opts.concurrency)?;
                    burst(0..warm, false)?;
                    let mut wall = Duration::ZERO;
                    let timed = parts(opts.pods, BURST_PARTS)
                        .into_iter()
                        .map(|r| r.start + warm..r.end + warm);
                    for (k, range) in timed.enumerate() {
                        if floor_first(k, first) {
                            wall += daemon.burst(range.clone(), opts.concurrency)?;
                            burst(range, true)?;
                        } else {
                            burst(range.clone(), true)?;
                            wall += daemon.burst(range, opts.concurrency)?;
                        }
                    }
                    Ok(wall)
                })?;
                floor_wall += wall;
                floor_cpu += cpu;
            }
        }
        let (dels, _) = concurrently(&atts, opts.concurrency, |a| {
            runtime
                .del(a)
                .with_context(|| format!("DEL {}", a.container_id))
        })?;
        del_conc.extend(dels);
        drop(pods);
        drop(floor_pods);
    }
    // CPU time over every ADD, the warm-ups' too, for the subject and the floor alike
    let adds = u32::try_from(BURSTS * (warm + opts.pods)).unwrap_or(u32::MAX);
    if let Some(h) = &mut hand_off {
        h.floor
            .handed_off_concurrent
            .push((BURSTS * opts.pods, floor_wall));
        h.floor.handed_off_cpu_per_add.push(floor_cpu / adds);
    }
    let daemon_cpu_per_add = match pid {
        Some(_) => vec![daemon_cpu / adds],
        None => Vec::new(),
    };
    let plugin = runtime.conflist()["plugins"][0]["type"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let version_exec = measure_version_exec(&runtime, &plugin, opts.pods)?;
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
        add_conc_bursts: vec![(BURSTS * opts.pods, add_conc_wall)],
        rss_kib,
        daemon_cpu_per_add,
        version_exec,
        breakdown,
    })
}

/// A sequential phase's call.
#[derive(Clone, Copy)]
enum Call {
    Add,
    Del,
}

impl Call {
    fn name(self) -> &'static str {
        match self {
            Call::Add => "ADD",
            Call::Del => "DEL",
        }
    }
}

/// Whether the hand-off floor's call goes before the subject's at step `k` (a pod of a
/// sequential phase, a part of a burst): at even steps when `first`, at odd ones otherwise.
fn floor_first(k: usize, first: bool) -> bool {
    k.is_multiple_of(2) == first
}

/// The subject's `call` of each of `atts`, one at a time through `runtime`, its time and the
/// machine's monotonic clock at its start added to `timed`. With the hand-off floor's daemon
/// and `first`, the daemon's call of the same pod beside each, before it for even pods when
/// `first` and for odd ones otherwise: their times, returned.
fn one_by_one(
    runtime: &Runtime,
    atts: &[Attachment],
    call: Call,
    floor: Option<(&HandOff, bool)>,
    timed: (&mut Vec<Duration>, &mut Vec<Option<Duration>>),
) -> Result<Vec<Duration>> {
    let (times, started) = timed;
    let mut floor_times = Vec::with_capacity(floor.map_or(0, |_| atts.len()));
    let floor_call = |daemon: &HandOff, i| match call {
        Call::Add => daemon.add(i),
        Call::Del => daemon.del(i),
    };
    for (i, att) in atts.iter().enumerate() {
        let (before, after) = match floor {
            Some((daemon, first)) if floor_first(i, first) => (Some(daemon), None),
            Some((daemon, _)) => (None, Some(daemon)),
            None => (None, None),
        };
        if let Some(daemon) = before {
            floor_times.push(floor_call(daemon, i)?);
        }
        started.push(breakdown::monotonic());
        let start = Instant::now();
        match call {
            Call::Add => runtime.add(att).map(drop),
            Call::Del => runtime.del(att),
        }
        .with_context(|| format!("{} {}", call.name(), att.container_id))?;
        times.push(start.elapsed());
        if let Some(daemon) = after {
            floor_times.push(floor_call(daemon, i)?);
        }
    }
    Ok(floor_times)
}

/// Lets the kernel finish with the pods gone before what comes next, which would otherwise
/// pay for it: a daemon may delete veths after answering a DEL (flock does), and the deleted
/// pod namespaces are cleaned up by a kernel worker, which takes the same lock as every ADD
/// ([`settle_kernel`]).
fn settle(node: &Netns, namespaces_before: Option<u64>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while node.links().iter().any(|l| l.starts_with("flock")) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let settled = settle_kernel(namespaces_before);
    eprintln!("xtask bench: the kernel settled before the burst in {settled}");
}

/// How many bursts of `--pods` pods a round makes at the bench's concurrency, each on a node
/// emptied and settled. One burst of 100 pods lasts about 0.2 s a subject here, in parts of
/// 40–50 ms, each ended by its slowest call (an ADD's p99 at concurrency 10 is three times
/// its p50) and exposed to the VM's host taking a CPU for tens of milliseconds: over 75
/// rounds of one burst, flock's pods/s over the floor's spread with a standard deviation of
/// 13 %. Four bursts give each round's ratio four times the calls, at about 4 s a burst.
const BURSTS: usize = 4;

/// How many parts a concurrent burst is made in when the hand-off floor's is interleaved
/// with it: the subject's and the floor's parts alternate, in pairs that change order (floor,
/// subject, subject, floor… or the other way round), so the machine's drift over the bursts
/// lands on both. Each part is a quarter of the pods, so at the bench's 100 pods and
/// concurrency 10 a part still keeps every thread busy for two and a half calls.
const BURST_PARTS: usize = 4;

/// `n` indices in `k` consecutive ranges as equal as can be (the first ones longer by one).
fn parts(n: usize, k: usize) -> Vec<std::ops::Range<usize>> {
    let k = k.clamp(1, n.max(1));
    let mut start = 0;
    (0..k)
        .map(|i| {
            let len = n / k + usize::from(i < n % k);
            let range = start..start + len;
            start += len;
            range
        })
        .collect()
}

fn make_pods(n: usize) -> Vec<Netns> {
    fresh_netns("bpod", n)
}

fn make_floor_pods(n: usize) -> Vec<Netns> {
    fresh_netns(FLOOR_POD_PREFIX, n)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_cut_in_parts_that_cover_it_once() {
        assert_eq!(parts(100, 4), vec![0..25, 25..50, 50..75, 75..100]);
        assert_eq!(parts(10, 4), vec![0..3, 3..6, 6..8, 8..10]);
        // fewer pods than parts: one pod a part, no empty part
        assert_eq!(parts(3, 4), vec![0..1, 1..2, 2..3]);
        assert_eq!(parts(1, 4), vec![0..1]);
    }
}
