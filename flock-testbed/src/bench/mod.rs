//! `cargo xtask bench`: end-to-end CNI latency and throughput, every subject
//! driven in one run through the same libcni-conformant runtime stand-in
//! ([`flock_testkit::cni::Runtime`]), host side in a stand-in node namespace,
//! a fresh pod namespace per pod (created before the clock starts). The
//! stand-in's threads live in the node namespace, as a runtime lives in its
//! node's, so each call is the runtime's work and the plugin's, not a `setns`.
//!
//! For each subject: N pods ADDed one after the other (latency of each call),
//! the daemon's RSS with the N pods up, the N DELs one after the other; then, four
//! times over on a node emptied each time, N fresh pods ADDed and DELed by
//! `--concurrency` threads (latency of each call and pods/s over the ADD phases).
//! The markdown table (with the ratio
//! flock/reference when both run) is printed and written into
//! `BENCHMARKS.md` between the `bench:begin`/`bench:end` markers.
//!
//! A subject is anything that implements [`Subject`]: today the reference
//! `ptp` + `host-local` plugins; the flock subject (shim + agent in the node
//! namespace) plugs in by implementing it and adding itself to [`subjects`].

use std::time::Duration;

use anyhow::{Context, Result, bail};

use crate::binaries::{build, workspace_root};
use crate::sys;

mod breakdown;
mod calls;
mod floor;
mod handoff;
mod measure;
pub(crate) mod report;
mod subjects;

pub use handoff::{HANDOFF_DAEMON, handoff_daemon};
pub use subjects::{Flock, ReferencePtp, SetupContext, Subject, SubjectConfig, subjects};

use breakdown::Breakdown;
use floor::Burst;
use measure::{HandOffFloor, run_subject};
use report::{machine_line, render_breakdown, render_table, utc_now, write_section};

struct Options {
    pods: usize,
    /// Pods up when a daemon's RSS is read (extra ones are added untimed).
    rss_pods: usize,
    concurrency: usize,
    /// Rounds of the floor and flock, alternately (each subject but flock runs once).
    rounds: usize,
    only: Option<Vec<String>>,
    write: bool,
}

/// The most pods a phase can have (the kernel floor numbers `5 × pods` from 1 in 16 bits).
const MAX_PODS: usize = 13_107;

const USAGE: &str = "usage: cargo xtask bench [--pods N] [--concurrency C] [--rss-pods N] [--rounds R] [--subjects reference,flock] [--no-write]";

fn parse_options(args: &[String]) -> Result<Options> {
    let mut opts = Options {
        pods: 100,
        rss_pods: 250,
        concurrency: 10,
        rounds: 3,
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
            "--rounds" => {
                let v = value("--rounds")?;
                opts.rounds = v.parse().with_context(|| format!("--rounds {v:?}"))?;
            }
            "--subjects" => {
                let v = value("--subjects")?;
                opts.only = Some(v.split(',').map(str::to_owned).collect());
            }
            "--no-write" => opts.write = false,
            other => bail!("unknown bench argument {other:?}\n{USAGE}"),
        }
    }
    if opts.pods == 0 || opts.concurrency == 0 || opts.rounds == 0 {
        bail!("--pods, --concurrency and --rounds must be at least 1");
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
    /// Each round's concurrent ADD phase: (pods, wall time).
    add_conc_bursts: Vec<Burst>,
    /// The daemon's RSS with `rss_pods` pods, the most of any round.
    rss_kib: Option<u64>,
    /// The daemon's CPU time (user + system) per ADD of each round's concurrent phase.
    daemon_cpu_per_add: Vec<Duration>,
    /// The plugin exec'd for `VERSION` by the same runtime.
    version_exec: Vec<Duration>,
    /// Per phase of the sequential ADDs and DELs, from the daemon's trace.
    breakdown: Option<Breakdown>,
}

impl Figures {
    /// ADD throughput of the concurrent phase, pods over its wall time: the median of the
    /// rounds'.
    fn add_pods_per_s(&self) -> f64 {
        floor::median_pods_per_s(&self.add_conc_bursts).unwrap_or(f64::NAN)
    }

    /// The daemon's CPU time per ADD: the median of the rounds'.
    fn daemon_cpu_per_add(&self) -> Option<Duration> {
        median(&self.daemon_cpu_per_add)
    }

    /// Adds another round's figures of the same subject: its samples, its concurrent
    /// phase, the larger RSS.
    fn absorb(&mut self, round: Figures) {
        self.add_seq.extend(round.add_seq);
        self.del_seq.extend(round.del_seq);
        self.add_conc.extend(round.add_conc);
        self.del_conc.extend(round.del_conc);
        self.add_conc_bursts.extend(round.add_conc_bursts);
        self.rss_kib = self.rss_kib.max(round.rss_kib);
        self.daemon_cpu_per_add.extend(round.daemon_cpu_per_add);
        self.version_exec.extend(round.version_exec);
        match (&mut self.breakdown, round.breakdown) {
            (Some(b), Some(more)) => b.absorb(more),
            (b @ None, more) => *b = more,
            (Some(_), None) => {}
        }
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

    // flock and its floor in rounds, alternately (floor, flock, floor, flock…), the hand-off
    // floor's calls interleaved with flock's in flock's phases, so that the machine's drift
    // lands on both and not in their ratio; every other subject once, after.
    let scratch = std::env::temp_dir().join(format!("flock-bench-{}", std::process::id()));
    let mut all: Vec<Figures> = Vec::new();
    let mut floor: Option<Floor> = None;
    let mut rounds: Vec<report::Round> = Vec::new();
    let outcome = (|| -> Result<()> {
        for subject in &mut selected {
            let rounds_of_it = if subject.key() == "flock" {
                opts.rounds
            } else {
                1
            };
            let mut merged: Option<Figures> = None;
            for round in 1..=rounds_of_it {
                let steal_before = calls::steal_ticks();
                let mut round_floor = if subject.key() == "flock" {
                    eprintln!(
                        "xtask bench: round {round} of {rounds_of_it}: floor — flock-netns alone, \
                         {n} pods one at a time and as many each after a shim exec, {n} at \
                         concurrency {c}",
                        n = opts.pods,
                        c = opts.concurrency
                    );
                    Some(floor::measure_kernel_floor(
                        opts.pods,
                        opts.concurrency,
                        &release_dir,
                    )?)
                } else {
                    None
                };
                let work_dir = scratch.join(format!("{}-{round}", subject.key()));
                std::fs::create_dir_all(&work_dir)
                    .with_context(|| format!("create {}", work_dir.display()))?;
                eprintln!(
                    "xtask bench: round {round} of {rounds_of_it}: {} — {} pods, concurrency {}{}",
                    subject.label(),
                    opts.pods,
                    opts.concurrency,
                    if round_floor.is_some() {
                        "; beside it, as many ADDs through the shim to a daemon that keeps no \
                         books, one at a time (each beside one of flock's) and in a burst"
                    } else {
                        ""
                    }
                );
                // flock's first sequential ADD and the first part of its burst go first in
                // even rounds, the hand-off floor's in odd ones
                let hand_off = round_floor.as_mut().map(|floor| HandOffFloor {
                    floor,
                    first: round % 2 == 1,
                    bin_dir: &release_dir,
                });
                let figures =
                    run_subject(subject.as_mut(), &opts, &work_dir, &release_dir, hand_off)?;
                if let Err(e) = std::fs::remove_dir_all(&work_dir) {
                    // the figures stand; the scratch folder goes with the run's
                    eprintln!("xtask bench: could not remove {}: {e}", work_dir.display());
                }
                if let Some(mut round_floor) = round_floor {
                    round_floor.version_exec = figures.version_exec.clone();
                    let steal = calls::steal_ticks()
                        .zip(steal_before)
                        .map(|(after, before)| after.saturating_sub(before));
                    rounds.push(report::Round::of(&figures, &round_floor, steal));
                    match &mut floor {
                        Some(f) => f.absorb(round_floor),
                        None => floor = Some(round_floor),
                    }
                }
                match &mut merged {
                    Some(m) => m.absorb(figures),
                    None => merged = Some(figures),
                }
            }
            all.extend(merged);
        }
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    outcome?;

    let mut table = render_table(&all, &opts);
    if let (Some(flock), Some(floor)) = (all.iter().find(|f| f.key == "flock"), &floor) {
        table.push_str(&render_breakdown(flock, floor, &rounds, &opts));
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
    /// `handoff::HandOff`): what a CNI of a shim and a node agent reaches here without
    /// flock's bookkeeping. Made in flock's sequential phase, each beside one of flock's ADDs.
    pub handed_off_add: Vec<Duration>,
    /// The DELs of those pods through the shim to that daemon, which answers a DEL as soon as
    /// it has decoded it (as flock's agent does for a pod without anycast, its veth going
    /// after the answer). Made in flock's sequential phase, each beside one of flock's DELs.
    pub handed_off_del: Vec<Duration>,
    /// ADDs of as many more pods to such a daemon, `concurrency` at a time, as the bench's
    /// runtime threads make a subject's, on a node emptied and settled, in parts alternating
    /// with flock's: (pods, the parts' wall times added up), one per round.
    pub handed_off_concurrent: Vec<Burst>,
    /// The stand-in daemon's CPU time per ADD of each round's concurrent burst.
    pub handed_off_cpu_per_add: Vec<Duration>,
    /// `flock_netns::setup` of as many more pods, `concurrency` at a time: (pods, wall time),
    /// one per round. What the kernel allows a node to take at that concurrency with nothing
    /// but the kernel work: the ceiling of a CNI's ADD throughput here.
    pub setup_concurrent: Vec<Burst>,
}

impl Floor {
    /// Adds another round's floor: its samples and its bursts.
    fn absorb(&mut self, round: Floor) {
        self.setup.extend(round.setup);
        self.detach.extend(round.detach);
        self.version_exec.extend(round.version_exec);
        self.setup_after_exec.extend(round.setup_after_exec);
        self.idle_round_trip.extend(round.idle_round_trip);
        self.handed_off_add.extend(round.handed_off_add);
        self.handed_off_del.extend(round.handed_off_del);
        self.handed_off_concurrent
            .extend(round.handed_off_concurrent);
        self.handed_off_cpu_per_add
            .extend(round.handed_off_cpu_per_add);
        self.setup_concurrent.extend(round.setup_concurrent);
    }
}

/// The median of `values` (the lower middle of an even count); `None` when there is none.
fn median(values: &[Duration]) -> Option<Duration> {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    sorted.get(sorted.len().saturating_sub(1) / 2).copied()
}

/// Nearest-rank percentile, in milliseconds.
pub(super) fn percentile_ms(samples: &[Duration], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1].as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(parse_options(&args("--rounds 5")).expect("ok").rounds, 5);
        assert_eq!(parse_options(&args("")).expect("ok").rounds, 3);
        assert!(parse_options(&args("--rounds 0")).is_err());
    }
}
