//! The few system interactions every xtask command shares.

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// Fails with a clear message unless running as root.
pub fn require_root(what: &str) -> Result<()> {
    let out = Command::new("id")
        .arg("-u")
        .output()
        .context("run `id -u`")?;
    if String::from_utf8_lossy(&out.stdout).trim() != "0" {
        bail!("{what} creates network namespaces and installs packages: run it as root");
    }
    Ok(())
}

/// Installs the Debian packages among `packages` that are not installed yet
/// (one `apt-get update`, one `apt-get install`); does nothing when all are.
pub fn ensure_packages(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| !is_installed(p))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("xtask: installing {}", missing.join(" "));
    run(Command::new("apt-get").args(["update", "-qq"]))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

fn is_installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        .unwrap_or(false)
}

/// Runs `cargo ARGS…` with the same toolchain that runs xtask.
pub fn cargo<I, S>(args: I) -> Result<()>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    run(&mut cargo_command(args))
}

/// The target folder every cargo of this process builds into, when [`use_target_dir`] set one.
static TARGET_DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Makes every later [`cargo_command`] build into `dir` (`CARGO_TARGET_DIR`, which the tests it
/// runs inherit) and [`crate::binaries::target_dir`] find the binaries there. The first call wins.
pub fn use_target_dir(dir: PathBuf) {
    let _ = TARGET_DIR.set(dir);
}

/// The folder [`use_target_dir`] set, if any.
pub fn target_dir_override() -> Option<&'static Path> {
    TARGET_DIR.get().map(PathBuf::as_path)
}

/// `cargo ARGS…` with the same toolchain that runs xtask, to run with [`run`].
pub fn cargo_command<I, S>(args: I) -> Command
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(args);
    if let Some(dir) = target_dir_override() {
        cmd.env("CARGO_TARGET_DIR", dir);
    }
    cmd
}

/// Runs a command, inheriting stdio; an exit other than 0 is an error naming it.
pub fn run(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}");
    eprintln!("xtask: {shown}");
    let status = cmd.status().with_context(|| format!("spawn {shown}"))?;
    if !status.success() {
        bail!("{shown} failed ({status})");
    }
    Ok(())
}

/// Runs a command, fails naming it unless it exits 0, returns its stdout.
pub fn output(cmd: &mut Command) -> Result<String> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().with_context(|| format!("spawn {shown}"))?;
    if !out.status.success() {
        bail!(
            "{shown} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Polls `done` every 50 ms until it holds or `limit` passes.
pub fn wait_for(limit: Duration, mut done: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        if done() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("not within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Polls `done` every 10 ms for at most `limit`: how long it took until it held, or `None`
/// (a measure, where [`wait_for`] is a wait).
pub fn time_until(limit: Duration, mut done: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if done() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// Formats rows as a table with a header, columns padded to their widest cell.
pub fn table(out: &mut String, header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_owned()
    };
    let _ = writeln!(
        out,
        "{}",
        line(header.iter().map(|h| (*h).to_owned()).collect())
    );
    let _ = writeln!(
        out,
        "{}",
        line(widths.iter().map(|w| "-".repeat(*w)).collect())
    );
    for row in rows {
        let _ = writeln!(out, "{}", line(row.clone()));
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_pads_columns() {
        let mut out = String::new();
        table(
            &mut out,
            &["a", "bb"],
            &[vec!["xxx".into(), "y".into()], vec!["z".into(), "w".into()]],
        );
        assert_eq!(out, "a    bb\n---  --\nxxx  y\nz    w\n\n");
    }
}
