//! `cargo xtask fuzz [TARGET…] [--minutes N]`: the fuzz targets of `fuzz/` (every parser at
//! a trust boundary), each run by cargo-fuzz (libFuzzer, with AddressSanitizer) on the nightly
//! toolchain for N minutes from its committed seed corpus, and a table of what each did.
//!
//! `cargo xtask test` runs [`check`]: the targets built on the stable toolchain (no
//! instrumentation) and each run once over its corpus (`-runs=0`), so a target cannot rot and
//! every input that once crashed one (kept in its corpus with the fix) runs again.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::sys;

/// Every fuzz target (a `[[bin]]` of `fuzz/Cargo.toml`), in the order they run.
pub const TARGETS: &[&str] = &[
    "rpc_line",
    "netconf",
    "cni_env",
    "annotations",
    "ip_algo",
    "nodeconfig",
    "nodepool",
    "birdc_show",
    "policy_input",
];

/// The fuzz crate's folder.
pub fn dir() -> PathBuf {
    crate::binaries::workspace_root().join("fuzz")
}

fn corpus(target: &str) -> PathBuf {
    dir().join("corpus").join(target)
}

/// The targets built on stable and each run once over its whole corpus.
pub fn check() -> Result<()> {
    let manifest = dir().join("Cargo.toml");
    let manifest = manifest.to_string_lossy();
    sys::cargo(["fmt", "--manifest-path", &manifest, "--", "--check"])?;
    sys::cargo([
        "clippy",
        "--manifest-path",
        &manifest,
        "--bins",
        "--",
        "-D",
        "warnings",
    ])?;
    sys::cargo(["build", "--manifest-path", &manifest, "--bins"])?;
    let bin_dir = target_dir().join("debug");
    for target in TARGETS {
        let seeds = corpus(target);
        let count = std::fs::read_dir(&seeds)
            .with_context(|| format!("read {}", seeds.display()))?
            .count();
        if count == 0 {
            bail!("{} has no seed", seeds.display());
        }
        let out = Command::new(bin_dir.join(target))
            .arg("-runs=0")
            .arg(&seeds)
            .output()
            .with_context(|| format!("run {target} over its corpus"))?;
        if !out.status.success() {
            bail!(
                "fuzz target {target} fails on an input of {}:\n{}",
                seeds.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        eprintln!("xtask: fuzz target {target}: {count} inputs of its corpus pass");
    }
    Ok(())
}

/// Where [`check`]'s cargo puts the fuzz crate's binaries: the folder chosen for every cargo
/// (in CI, the machine's cache), else the fuzz workspace's own `target/`.
fn target_dir() -> PathBuf {
    crate::binaries::chosen_target_dir().unwrap_or_else(|| dir().join("target"))
}

/// One target's round.
struct Round {
    target: &'static str,
    runs: u64,
    took: Duration,
    corpus: usize,
    crash: Option<PathBuf>,
}

/// `cargo xtask fuzz ARGS…`.
pub fn fuzz(args: &[String]) -> Result<()> {
    let mut minutes = 1u64;
    let mut chosen: Vec<&'static str> = Vec::new();
    let mut args = args.iter();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--minutes" => {
                let v = args.next().context("--minutes needs a number")?;
                minutes = v
                    .parse()
                    .ok()
                    .filter(|m| *m > 0)
                    .with_context(|| format!("--minutes {v:?}: a whole number of minutes"))?;
            }
            name => match TARGETS.iter().find(|t| **t == name) {
                Some(t) => chosen.push(t),
                None => bail!(
                    "no fuzz target {name:?}; the targets are {}",
                    TARGETS.join(", ")
                ),
            },
        }
    }
    if chosen.is_empty() {
        chosen = TARGETS.to_vec();
    }
    ensure_tools()?;
    // built once, before any round is timed
    eprintln!("xtask: cargo +nightly fuzz build (instrumented, AddressSanitizer)");
    sys::run(
        Command::new("cargo")
            .current_dir(crate::binaries::workspace_root())
            .env_remove("CARGO_TARGET_DIR")
            .args(["+nightly", "fuzz", "build"]),
    )?;
    let mut rounds = Vec::new();
    for target in chosen {
        rounds.push(round(target, Duration::from_secs(minutes * 60))?);
    }
    let rows: Vec<Vec<String>> = rounds
        .iter()
        .map(|r| {
            vec![
                r.target.to_owned(),
                r.runs.to_string(),
                format!("{:.0} s", r.took.as_secs_f64()),
                format!("{:.0}", r.runs as f64 / r.took.as_secs_f64().max(1.0)),
                r.corpus.to_string(),
                r.crash
                    .as_ref()
                    .map_or_else(|| "none".to_owned(), |p| p.display().to_string()),
            ]
        })
        .collect();
    let mut out = String::new();
    sys::table(
        &mut out,
        &[
            "target",
            "executions",
            "time",
            "exec/s",
            "corpus after",
            "crash",
        ],
        &rows,
    );
    print!("{out}");
    let crashed: Vec<&str> = rounds
        .iter()
        .filter(|r| r.crash.is_some())
        .map(|r| r.target)
        .collect();
    if crashed.is_empty() {
        Ok(())
    } else {
        bail!(
            "fuzz targets crashed: {} (reproduce: cargo +nightly fuzz run TARGET ARTIFACT)",
            crashed.join(", ")
        )
    }
}

/// The nightly toolchain (AddressSanitizer and coverage instrumentation need it) and
/// cargo-fuzz, installed from crates.io when missing.
fn ensure_tools() -> Result<()> {
    let toolchains = sys::output(Command::new("rustup").args(["toolchain", "list"]))?;
    if !toolchains.lines().any(|l| l.starts_with("nightly")) {
        bail!(
            "cargo xtask fuzz needs Rust's nightly toolchain (the sanitizer flags are unstable): \
             rustup toolchain install nightly"
        );
    }
    let has_fuzz = Command::new("cargo")
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_fuzz {
        eprintln!("xtask: installing cargo-fuzz from crates.io");
        sys::cargo(["install", "cargo-fuzz", "--locked"])?;
    }
    Ok(())
}

/// One target for `limit`: `cargo +nightly fuzz run` on its corpus (new inputs added to it),
/// libFuzzer's final statistics read back.
fn round(target: &'static str, limit: Duration) -> Result<Round> {
    let started = Instant::now();
    let seeds = corpus(target);
    let artifacts = dir().join("artifacts").join(target);
    std::fs::create_dir_all(&artifacts)
        .with_context(|| format!("create {}", artifacts.display()))?;
    eprintln!(
        "xtask: fuzz {target} for {} s from {}",
        limit.as_secs(),
        seeds.display()
    );
    let out = Command::new("cargo")
        .current_dir(crate::binaries::workspace_root())
        // its own target folder: instrumented builds never mix with the workspace's
        .env_remove("CARGO_TARGET_DIR")
        .args(["+nightly", "fuzz", "run", target])
        .arg(&seeds)
        .arg("--")
        .arg(format!("-max_total_time={}", limit.as_secs()))
        .arg("-print_final_stats=1")
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .output()
        .with_context(|| format!("run cargo fuzz run {target}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let runs = stat(&stderr, "stat::number_of_executed_units:").unwrap_or(0);
    // libFuzzer's own time: "Done N runs in S second(s)"
    let took = stderr
        .lines()
        .find_map(|l| l.strip_prefix("Done ")?.split(" runs in ").nth(1))
        .and_then(|t| t.split_whitespace().next()?.parse::<u64>().ok())
        .map_or_else(|| started.elapsed(), Duration::from_secs);
    let crash = (!out.status.success()).then(|| newest(&artifacts).unwrap_or(artifacts.clone()));
    if crash.is_some() && runs == 0 {
        bail!("cargo fuzz run {target} failed before fuzzing:\n{stderr}");
    }
    Ok(Round {
        target,
        runs,
        took,
        corpus: std::fs::read_dir(&seeds).map(|d| d.count()).unwrap_or(0),
        crash,
    })
}

fn stat(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.trim().strip_prefix(key))
        .and_then(|v| v.trim().parse().ok())
}

fn newest(dir: &Path) -> Option<PathBuf> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .map(|e| e.path())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_target_is_a_bin_of_the_fuzz_crate_and_has_seeds() {
        let manifest = std::fs::read_to_string(dir().join("Cargo.toml")).unwrap();
        let bins: Vec<&str> = manifest
            .lines()
            .filter_map(|l| l.strip_prefix("name = \""))
            .filter_map(|l| l.strip_suffix('"'))
            .filter(|n| *n != "flock-fuzz")
            .collect();
        assert_eq!(bins, TARGETS, "fuzz/Cargo.toml's [[bin]]s");
        for t in TARGETS {
            assert!(
                dir().join("fuzz_targets").join(format!("{t}.rs")).exists(),
                "{t}"
            );
            let seeds = std::fs::read_dir(corpus(t)).map(|d| d.count()).unwrap_or(0);
            assert!(seeds > 0, "{t} has no seed corpus");
        }
    }

    #[test]
    fn libfuzzers_final_statistics_are_read() {
        let text = "stat::number_of_executed_units: 123456\nstat::average_exec_per_sec:     2057\n";
        assert_eq!(stat(text, "stat::number_of_executed_units:"), Some(123456));
        assert_eq!(stat(text, "stat::peak_rss_mb:"), None);
    }
}
