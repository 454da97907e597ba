//! What the cluster's scenarios share when they run as cargo tests (`tests/cluster.rs`, feature
//! `cluster`): one cluster, brought up by the first scenario that needs it and left up for
//! the next, and a lock that lets one scenario at a time use it.
//!
//! The scenarios run under `cargo nextest` (a process per test) or `cargo test` (a thread per
//! test), so the lock is both a file lock, held across processes, and a mutex, held across
//! threads. A cluster is reused only when `up` finished on it with the same options and the
//! same build of flock's binaries and it still answers; otherwise it is replaced. The
//! scenarios build nothing: flock's debug binaries (`target/debug`) and the cluster's
//! components must be built first (`cargo xtask cluster check` does). `cargo xtask test` (and `cargo xtask cluster
//! check`) take it down when the scenarios are done; run by hand, `cargo xtask cluster down`.
//!
//! The release and kube-proxy's mode come from `FLOCK_TESTBED_KUBERNETES` (`1.35` …, the newest
//! unless set) and `FLOCK_TESTBED_PROXY_MODE` (`nftables` unless set).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use anyhow::{Context, Result};

use crate::cluster::{self, RUN_DIR, UpOptions};

/// The lock file: outside [`RUN_DIR`], which `down` removes.
const LOCK: &str = "/run/flockcluster.lock";
/// Written in [`RUN_DIR`] once `up` passed: the options it ran with.
const READY: &str = "scenario-ready";

/// The cluster, held for one scenario.
pub struct Shared {
    _file: nix::fcntl::Flock<File>,
    _thread: MutexGuard<'static, ()>,
    /// The options the cluster runs with.
    pub options: UpOptions,
}

static THREADS: Mutex<()> = Mutex::new(());

impl Shared {
    /// Marks the cluster as not reusable (a scenario that removed flock from it): the next
    /// scenario brings up a new one.
    pub fn spoil(&self) {
        let _ = std::fs::remove_file(ready_file());
    }
}

fn ready_file() -> PathBuf {
    Path::new(RUN_DIR).join(READY)
}

/// What a reusable cluster must have been brought up with: the options, and flock's binaries
/// as they are now (their modification times).
fn describe(options: &UpOptions, bins: &Path) -> String {
    let built = |name: &str| {
        std::fs::metadata(bins.join(name))
            .and_then(|m| m.modified())
            .map(|t| format!("{t:?}"))
            .unwrap_or_else(|_| "missing".to_owned())
    };
    format!(
        "{} {} flock-agent {} flock-controller {} flock {}",
        options.kubernetes,
        options.proxy_mode.as_str(),
        built("flock-agent"),
        built("flock-controller"),
        built("flock")
    )
}

/// Takes the cluster for one scenario, bringing it up first unless a cluster that passed
/// `up` with the same options is up and answers. A scenario that panicked does not poison
/// the lock: the next one still runs (and fails on its own if the cluster is broken).
pub fn cluster() -> Result<Shared> {
    let thread = THREADS.lock().unwrap_or_else(|p| p.into_inner());
    let file = File::create(LOCK).with_context(|| format!("create {LOCK}"))?;
    let file = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .with_context(|| format!("lock {LOCK}"))?;
    let options = UpOptions::from_env()?;
    let bins = options.bins.clone().unwrap_or_else(crate::lab::debug_bins);
    let stamp = describe(&options, &bins);
    let reusable = std::fs::read_to_string(ready_file()).is_ok_and(|t| t == stamp)
        && cluster::kubectl(&["get", "nodes", "-o", "name"]).is_ok();
    if !reusable {
        let started = Instant::now();
        let report = cluster::up(&bins, &options, started)?;
        print!("{report}");
        std::fs::write(ready_file(), stamp)
            .with_context(|| format!("write {}", ready_file().display()))?;
    }
    Ok(Shared {
        _file: file,
        _thread: thread,
        options,
    })
}
