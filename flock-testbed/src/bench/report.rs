//! The bench's report: percentiles, the markdown table of every subject (and flock's
//! breakdown under it), and the section it writes into `BENCHMARKS.md`.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};

use super::breakdown;
use super::{Figures, Options};
use super::{Floor, percentile_ms};

pub(super) fn render_table(all: &[Figures], opts: &Options) -> String {
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
            Box::new(|f| f.daemon_cpu_per_add().map(|d| d.as_secs_f64() * 1000.0)),
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

/// One round's figures for the goals: flock's and the hand-off floor's, measured in the same
/// phases (each sequential ADD of the floor beside one of flock's, burst beside burst).
pub(super) struct Round {
    /// ADD p50, sequential, ms: flock's and the hand-off floor's.
    add_p50: (f64, f64),
    /// DEL p50, sequential, ms: flock's and the hand-off floor's.
    del_p50: (f64, f64),
    /// ADD throughput at the bench's concurrency, pods/s: flock's and the hand-off floor's.
    pods_per_s: (f64, f64),
    /// Clock ticks (10 ms of one CPU) the virtual machine's host took while the round ran.
    steal_ticks: Option<u64>,
}

impl Round {
    pub(super) fn of(flock: &Figures, floor: &Floor, steal_ticks: Option<u64>) -> Round {
        Round {
            add_p50: (
                percentile_ms(&flock.add_seq, 50.0),
                percentile_ms(&floor.handed_off_add, 50.0),
            ),
            del_p50: (
                percentile_ms(&flock.del_seq, 50.0),
                percentile_ms(&floor.handed_off_del, 50.0),
            ),
            steal_ticks,
            pods_per_s: (
                flock.add_pods_per_s(),
                floor.handed_off_pods_per_s().unwrap_or(f64::NAN),
            ),
        }
    }
}

/// What flock's ADD may cost beyond the hand-off floor's (issue 29).
const ADD_OVER_FLOOR_MS: f64 = 0.15;
/// The share of the hand-off floor's throughput flock's must reach (issue 29).
const THROUGHPUT_SHARE: f64 = 0.95;
const DEL_P50_MS: f64 = 1.0;
const RSS_MIB: f64 = 20.0;

/// flock's per-phase table, the floor beside it, and the goals of issue 29 checked against
/// the hand-off floor measured in the same rounds.
pub(super) fn render_breakdown(
    flock: &Figures,
    floor: &Floor,
    rounds: &[Round],
    opts: &Options,
) -> String {
    let mut out = format!(
        "\nWhere flock's time goes ({} sequential ADDs and DELs in each of {} rounds, ms, from \
         the agent's `--trace`), and the floor measured in the same rounds:\n\n",
        opts.pods,
        rounds.len()
    );
    if let Some(b) = &flock.breakdown {
        out.push_str(&breakdown::render(b, floor));
    }
    out.push_str(&render_goals(flock, floor, rounds, opts));
    out
}

/// The goals table: each goal, flock's figure, the bound, met or not; then each round.
fn render_goals(flock: &Figures, floor: &Floor, rounds: &[Round], opts: &Options) -> String {
    let add = percentile_ms(&flock.add_seq, 50.0);
    let add_floor = percentile_ms(&floor.handed_off_add, 50.0);
    let pods_per_s = flock.add_pods_per_s();
    // burst beside burst: the rounds' ratios, and their median (the lower middle of an even
    // count)
    let mut ratios: Vec<f64> = rounds
        .iter()
        .map(|r| r.pods_per_s.0 / r.pods_per_s.1)
        .collect();
    ratios.sort_by(f64::total_cmp);
    let ratio = ratios
        .get(ratios.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or(f64::NAN);
    let del = percentile_ms(&flock.del_seq, 50.0);
    let del_floor = percentile_ms(&floor.handed_off_del, 50.0);
    let rss = flock.rss_kib.map(|k| k as f64 / 1024.0);
    let c = opts.concurrency;
    let goals: [(String, String, String, bool); 4] = [
        (
            "ADD p50, sequential ≤ the hand-off floor's + 0.15 ms".into(),
            format!("{add:.3} ms"),
            format!(
                "{add_floor:.3} + {ADD_OVER_FLOOR_MS} = {:.3} ms",
                add_floor + ADD_OVER_FLOOR_MS
            ),
            add <= add_floor + ADD_OVER_FLOOR_MS,
        ),
        (
            format!("ADD throughput, concurrency {c} ≥ 95 % of the hand-off floor's"),
            format!("{:.1} %", 100.0 * ratio),
            format!("{:.0} %", 100.0 * THROUGHPUT_SHARE),
            ratio >= THROUGHPUT_SHARE,
        ),
        (
            "DEL p50, sequential ≤ 1 ms".into(),
            format!("{del:.3} ms"),
            // an absolute bound: the floor's own DEL, measured beside flock's, says what of
            // it the machine leaves to a CNI of this design
            if del_floor.is_nan() {
                format!("{DEL_P50_MS} ms")
            } else {
                format!("{DEL_P50_MS} ms (the hand-off floor's DEL: {del_floor:.3} ms)")
            },
            del <= DEL_P50_MS,
        ),
        (
            format!(
                "agent RSS with {} pods ≤ 20 MiB",
                opts.rss_pods.max(opts.pods)
            ),
            rss.map_or("—".into(), |r| format!("{r:.1} MiB")),
            format!("{RSS_MIB} MiB"),
            rss.is_some_and(|r| r <= RSS_MIB),
        ),
    ];
    let met = goals.iter().filter(|g| g.3).count();
    let mut out = format!(
        "\nGoals (issue 29), against the hand-off floor (the runtime → shim → a daemon that \
         only decodes, sets up and answers) measured in the same run, its calls interleaved \
         with flock's in {} round{} (one of its ADDs and DELs beside each of flock's \
         sequential ones, which goes first alternating; its burst at concurrency {c} in parts \
         alternating with flock's); ADD and DEL p50 over every round's calls, throughput the \
         median of the rounds' ratios:\n\n| goal | flock | bound | |\n|---|---:|---:|---|\n",
        rounds.len(),
        if rounds.len() == 1 { "" } else { "s" }
    );
    for (goal, value, bound, ok) in &goals {
        let _ = writeln!(
            out,
            "| {goal} | {value} | {bound} | {} |",
            if *ok { "met" } else { "not met" }
        );
    }
    let _ = writeln!(out, "\nGoals met: {met} of {}", goals.len());
    if let (Some(agent), Some(floor_cpu)) = (
        flock.daemon_cpu_per_add(),
        super::median(&floor.handed_off_cpu_per_add),
    ) {
        let _ = writeln!(
            out,
            "\nCPU time per ADD at concurrency {c} (every thread; the rounds' median): flock's \
             agent {:.3} ms, the hand-off floor's daemon {:.3} ms",
            agent.as_secs_f64() * 1000.0,
            floor_cpu.as_secs_f64() * 1000.0
        );
    }
    let per_round: Vec<String> = rounds
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let steal = r
                .steal_ticks
                .map(|t| format!(", {:.2} s stolen by the host", t as f64 / 100.0))
                .unwrap_or_default();
            format!(
                "round {}: ADD p50 {:.3} / {:.3} ms, DEL p50 {:.3} / {:.3} ms, {:.0} / {:.0} \
                 pods/s{steal}",
                i + 1,
                r.add_p50.0,
                r.add_p50.1,
                r.del_p50.0,
                r.del_p50.1,
                r.pods_per_s.0,
                r.pods_per_s.1
            )
        })
        .collect();
    let _ = writeln!(
        out,
        "\nflock / hand-off floor in each round: {}",
        per_round.join("; ")
    );
    if let Some(ceiling) = floor.concurrent_pods_per_s() {
        let _ = writeln!(
            out,
            "\nflock-netns alone, the kernel's ceiling, set up as many pods at concurrency {c} \
             at {ceiling:.0} pods/s (flock: {:.0} % of it)",
            100.0 * pods_per_s / ceiling
        );
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
pub(super) fn write_section(path: &Path, section: &str) -> Result<()> {
    write_between(path, BEGIN, END, section)
}

/// Replaces what lies between the lines `begin` and `end` of `path` with `section` (or appends
/// the three, or creates the file).
pub(crate) fn write_between(path: &Path, begin: &str, end: &str, section: &str) -> Result<()> {
    let old = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::from("# Benchmarks\n"),
        Err(e) => return Err(e).with_context(|| format!("read {}", path.display())),
    };
    let block = format!("{begin}\n{section}{end}\n");
    let new = match (old.find(begin), old.find(end)) {
        (Some(b), Some(e)) if e > b => {
            format!(
                "{}{block}{}",
                &old[..b],
                old[e + end.len()..].trim_start_matches('\n')
            )
        }
        _ => format!("{}\n{block}", old.trim_end_matches('\n').to_owned() + "\n"),
    };
    std::fs::write(path, new).with_context(|| format!("write {}", path.display()))
}

pub(crate) fn utc_now() -> String {
    command_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_else(|| "unknown date".into())
}

/// Kernel, CPU, cores and the reference plugins' package version.
pub(crate) fn machine_line() -> String {
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
    // The reference plugins are built from their Go module, not Debian's package.
    format!(
        "{kernel}, {cpu}, {cores} cores (shared), containernetworking plugins {}",
        crate::versions::CNI_PLUGINS
    )
}

fn command_line(cmd: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(cmd).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

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
            add_conc_bursts: vec![(2, Duration::from_secs(1))],
            rss_kib: rss,
            daemon_cpu_per_add: Vec::new(),
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
            rounds: 1,
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
    fn goals_are_checked_against_the_hand_off_floor_of_the_same_rounds() {
        let opts = Options {
            pods: 3,
            rss_pods: 250,
            concurrency: 10,
            rounds: 2,
            only: None,
            write: false,
        };
        let us = |v: &[u64]| {
            v.iter()
                .map(|&us| Duration::from_micros(us))
                .collect::<Vec<_>>()
        };
        let floor = Floor {
            handed_off_add: us(&[1500, 1520, 1540]),
            handed_off_del: us(&[800, 950, 990]),
            handed_off_concurrent: vec![
                (100, Duration::from_secs(1)),
                (120, Duration::from_secs(1)),
                (100, Duration::from_secs(1)),
            ],
            setup_concurrent: vec![(200, Duration::from_secs(1))],
            handed_off_cpu_per_add: us(&[600, 640]),
            ..Floor::default()
        };
        let mut flock = figures("flock", 0, Some(12 * 1024));
        flock.add_seq = us(&[1600, 1660, 1700]);
        flock.del_seq = us(&[900, 1100, 1200]);
        flock.add_conc_bursts = vec![
            (94, Duration::from_secs(1)),
            (96, Duration::from_secs(1)),
            (99, Duration::from_secs(1)),
        ];
        flock.daemon_cpu_per_add = us(&[800, 900, 700]);
        // burst beside burst: 94 %, 80 %, 99 %; the median of the ratios is 94 %, not the
        // 96 % of the medians (96 and 100 pods/s)
        let round = |flock: f64, floor: f64, steal_ticks| Round {
            add_p50: (1.66, 1.52),
            del_p50: (1.1, 0.95),
            pods_per_s: (flock, floor),
            steal_ticks,
        };
        let rounds = [
            round(94.0, 100.0, Some(0)),
            round(96.0, 120.0, Some(250)),
            round(99.0, 100.0, None),
        ];
        let text = render_goals(&flock, &floor, &rounds, &opts);
        let row = |start: &str| {
            text.lines()
                .find(|l| l.starts_with(start))
                .unwrap_or_else(|| panic!("no row {start:?} in\n{text}"))
                .to_owned()
        };
        assert_eq!(
            row("| ADD p50"),
            "| ADD p50, sequential ≤ the hand-off floor's + 0.15 ms | 1.660 ms | 1.520 + 0.15 = 1.670 ms | met |"
        );
        assert_eq!(
            row("| ADD throughput"),
            "| ADD throughput, concurrency 10 ≥ 95 % of the hand-off floor's | 94.0 % | 95 % | not met |"
        );
        assert_eq!(
            row("| DEL p50"),
            "| DEL p50, sequential ≤ 1 ms | 1.100 ms | 1 ms (the hand-off floor's DEL: 0.950 ms) | not met |"
        );
        assert!(
            row("| agent RSS").ends_with("| 12.0 MiB | 20 MiB | met |"),
            "{text}"
        );
        assert!(text.contains("Goals met: 2 of 4"), "{text}");
        assert!(
            text.contains(
                "round 2: ADD p50 1.660 / 1.520 ms, DEL p50 1.100 / 0.950 ms, 96 / 120 pods/s, \
                 2.50 s stolen by the host; round 3: ADD p50 1.660 / 1.520 ms, DEL p50 1.100 / \
                 0.950 ms, 99 / 100 pods/s\n"
            ),
            "{text}"
        );
        assert!(text.contains("at 200 pods/s (flock: 48 % of it)"), "{text}");
        assert!(
            text.contains("flock's agent 0.800 ms, the hand-off floor's daemon 0.600 ms"),
            "{text}"
        );
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
}
