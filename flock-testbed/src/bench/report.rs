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
pub(super) fn render_breakdown(
    flock: &Figures,
    floor: &Floor,
    pods: usize,
    concurrency: usize,
) -> String {
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
pub(super) fn write_section(path: &Path, section: &str) -> Result<()> {
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

pub(super) fn utc_now() -> String {
    command_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_else(|| "unknown date".into())
}

/// Kernel, CPU, cores and the reference plugins' package version.
pub(super) fn machine_line() -> String {
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
}
