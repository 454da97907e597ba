//! The few system interactions every xtask command shares.

use std::ffi::OsStr;
use std::process::Command;

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
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    run(Command::new(cargo).args(args))
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
