//! flock as it was at a git revision of this repository: its sources (`git archive`) and its
//! agent, shim and controller built from them, cached per revision under the test bed's cache
//! (`/var/cache/flock/flock-REV`), so a machine builds each revision once. `life upgrade
//! --from REV` rolls a cluster from it to the working tree and back.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::sys;

/// The revision `life upgrade` starts from by default: the head when the upgrade test was
/// asked for (Kubernetes' 1.20-era flock, before the test bed moved to current Kubernetes).
pub const DEFAULT_FROM: &str = "517daaa";

/// One revision, built.
#[derive(Debug, Clone)]
pub struct Revision {
    /// The commit, 12 hex digits.
    pub short: String,
    /// Its sources (`deploy/` with them).
    pub src: PathBuf,
    /// Its binaries: `flock-agent`, `flock` (the shim) and, where the revision has one,
    /// `flock-controller`.
    pub bins: PathBuf,
}

/// The commit `rev` names in `repo`, 40 hex digits; an error that says what to do when the
/// clone lacks it (a shallow clone).
fn resolve(repo: &Path, rev: &str) -> Result<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(["rev-parse", "--verify", "--quiet"])
        .arg(format!("{rev}^{{commit}}"))
        .output()
        .context("run git rev-parse")?;
    let hash = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() || hash.len() != 40 {
        bail!(
            "--from {rev:?}: no commit of {} by that name (a shallow clone lacks old commits: \
             git fetch --unshallow)",
            repo.display()
        );
    }
    Ok(hash)
}

/// Builds flock at `rev` of `repo` (the dev profile, as the cluster runs the working tree's),
/// or finds it built before.
pub fn build(repo: &Path, rev: &str) -> Result<Revision> {
    let hash = resolve(repo, rev)?;
    let short = hash[..12].to_owned();
    let dir = crate::components::cache_dir().join(format!("flock-{short}"));
    let src = dir.join("src");
    let bins = dir.join("bin");
    let done = dir.join("built");
    if done.exists() {
        return Ok(Revision { short, src, bins });
    }
    eprintln!(
        "xtask: building flock at {rev} ({short}) into {}",
        dir.display()
    );
    if src.exists() {
        std::fs::remove_dir_all(&src).with_context(|| format!("remove {}", src.display()))?;
    }
    std::fs::create_dir_all(&src).with_context(|| format!("create {}", src.display()))?;
    sys::output(Command::new("sh").arg("-c").arg(format!(
        "git -C '{}' archive --format=tar {hash} | tar -x -C '{}'",
        repo.display(),
        src.display()
    )))
    .with_context(|| format!("unpack {short} into {}", src.display()))?;
    let mut packages = vec!["flock-agent", "flock-plugin"];
    if src.join("flock-controller").exists() {
        packages.push("flock-controller");
    }
    let mut cmd = sys::cargo_command(["build", "--locked"]);
    for p in &packages {
        cmd.args(["-p", p]);
    }
    cmd.current_dir(&src)
        .env("CARGO_TARGET_DIR", dir.join("target"));
    sys::run(&mut cmd).with_context(|| format!("build flock at {short}"))?;
    std::fs::create_dir_all(&bins).with_context(|| format!("create {}", bins.display()))?;
    for bin in ["flock-agent", "flock", "flock-controller"] {
        let built = dir.join("target/debug").join(bin);
        if built.exists() {
            std::fs::copy(&built, bins.join(bin))
                .with_context(|| format!("copy {} to {}", built.display(), bins.display()))?;
        }
    }
    // the build's own folder is large and not needed again
    let _ = std::fs::remove_dir_all(dir.join("target"));
    std::fs::write(&done, &hash).with_context(|| format!("write {}", done.display()))?;
    Ok(Revision { short, src, bins })
}
