//! Processes of the cluster: started detached and recorded, so `down` finds every one of
//! them, even after an `up` that failed half-way or an xtask that was killed.
//!
//! Each daemon is started with `setsid` (it outlives the xtask and its terminal), its pid is
//! written to `RUN_DIR/pids/NAME.pid`, its output goes to `RUN_DIR/logs/NAME.log`, and before
//! it execs it moves itself into the cgroup `flockcluster` of the `pids` hierarchy. Everything
//! it forks stays there — containerd's shims, and the pods' containers, whose cgroups the
//! kubelets put under `/flockcluster/NODE` (`--cgroup-root`). [`kill_all`] kills the union of
//! the recorded pids, the tracked cgroups' members and the processes inside the cluster's
//! network namespaces, then removes the cgroups from every hierarchy.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::{NS_PREFIX, RUN_DIR};
use crate::sys;

/// The cgroup (under each cgroup v1 hierarchy) that holds every process of the cluster.
pub const CGROUP: &str = "flockcluster";
/// The hierarchy the daemons join; runc puts containers into every hierarchy.
const TRACKING_HIERARCHY: &str = "/sys/fs/cgroup/pids";
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// The CPU cgroup (v1) `path` below `/sys/fs/cgroup/cpu` with a weight of `shares` (an
/// ordinary process has 1024), created when missing; returns its `cgroup.procs`.
pub fn cpu_weight(path: &str, shares: u32) -> Result<PathBuf> {
    let dir = Path::new(CGROUP_ROOT).join("cpu").join(path);
    std::fs::create_dir_all(&dir).with_context(|| format!("create cgroup {}", dir.display()))?;
    let file = dir.join("cpu.shares");
    std::fs::write(&file, shares.to_string())
        .with_context(|| format!("write {shares} to {}", file.display()))?;
    Ok(dir.join("cgroup.procs"))
}

/// `RUN_DIR/logs/NAME.log`.
pub fn log_path(name: &str) -> PathBuf {
    Path::new(RUN_DIR).join("logs").join(format!("{name}.log"))
}

fn pid_path(name: &str) -> PathBuf {
    Path::new(RUN_DIR).join("pids").join(format!("{name}.pid"))
}

/// The last `lines` lines of a daemon's log.
pub fn log_tail(name: &str, lines: usize) -> String {
    let text = std::fs::read_to_string(log_path(name)).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(lines).collect();
    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
}

/// How a daemon enters the cluster: the namespaces it runs in.
#[derive(Debug, Clone)]
pub enum Place {
    /// `nsenter --net=/run/netns/NS`: a network namespace, the machine's mount namespace.
    Net(String),
    /// `nsenter --target PID --net --mount --uts`: a node's network, private mount and UTS
    /// namespace (PID is the node's mount-namespace holder).
    Node(u32),
    /// A node's network namespace and a new private mount namespace, a slave of the
    /// machine's, and a new UTS namespace (the node's own hostname), that live as long as
    /// this process (the node's mount-namespace holder).
    NewMounts(String),
}

impl Place {
    /// The command prefix that enters this place.
    pub fn prefix(&self) -> Vec<String> {
        match self {
            Place::Net(ns) => vec![
                "nsenter".into(),
                format!("--net=/run/netns/{ns}"),
                "--".into(),
            ],
            Place::Node(pid) => vec![
                "nsenter".into(),
                format!("--target={pid}"),
                "--net".into(),
                "--mount".into(),
                "--uts".into(),
                "--".into(),
            ],
            Place::NewMounts(ns) => vec![
                "nsenter".into(),
                format!("--net=/run/netns/{ns}"),
                "--".into(),
                "unshare".into(),
                "--mount".into(),
                "--uts".into(),
                "--propagation".into(),
                "slave".into(),
                "--".into(),
            ],
        }
    }

    /// A command that runs `program` in this place (in the foreground).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let prefix = self.prefix();
        let mut cmd = Command::new(&prefix[0]);
        cmd.args(&prefix[1..]).arg(program);
        cmd
    }

    /// Runs `args` here; fails naming the command unless it exits 0; returns its stdout.
    pub fn run(&self, args: &[&str]) -> Result<String> {
        let (program, rest) = args.split_first().context("empty command")?;
        sys::output(self.command(program).args(rest))
    }
}

/// Starts `program ARGS…` in `place` as the daemon `name`: detached, recorded, tracked.
/// Returns its pid (the pid of the daemon itself: nothing in between forks).
pub fn spawn(
    name: &str,
    place: &Place,
    program: impl AsRef<OsStr>,
    args: &[impl AsRef<OsStr>],
    env: &[(&str, &str)],
) -> Result<u32> {
    for dir in ["pids", "logs"] {
        let d = Path::new(RUN_DIR).join(dir);
        std::fs::create_dir_all(&d).with_context(|| format!("create {}", d.display()))?;
    }
    let tracking = Path::new(TRACKING_HIERARCHY).join(CGROUP);
    std::fs::create_dir_all(&tracking)
        .with_context(|| format!("create cgroup {}", tracking.display()))?;
    let log = std::fs::File::create(log_path(name))
        .with_context(|| format!("create {}", log_path(name).display()))?;
    let log_err = log.try_clone().context("duplicate a log handle")?;
    // setsid execs (the child is no group leader), sh execs, nsenter execs for net and
    // mount namespaces, unshare forks only for a pid namespace: the pid is the daemon's.
    let mut cmd = Command::new("setsid");
    cmd.args([
        "sh",
        "-c",
        "echo $$ > \"$0\" && exec \"$@\"",
        &tracking.join("cgroup.procs").to_string_lossy(),
    ])
    .args(place.prefix())
    .arg(program)
    .args(args)
    .envs(env.iter().copied())
    .current_dir(RUN_DIR)
    .stdin(Stdio::null())
    .stdout(log)
    .stderr(log_err);
    let shown = format!("{cmd:?}");
    let child = cmd.spawn().with_context(|| format!("spawn {shown}"))?;
    let pid = child.id();
    // Reap it if it dies while this xtask runs; `down` kills it otherwise.
    std::thread::spawn(move || {
        let mut child = child;
        let _ = child.wait();
    });
    std::fs::write(pid_path(name), format!("{pid}\n"))
        .with_context(|| format!("write {}", pid_path(name).display()))?;
    Ok(pid)
}

/// Kills daemon `name` (SIGKILL, as a crash) and waits until it is gone; its pid, or `None`
/// when it was not running.
pub fn kill_daemon(name: &str) -> Result<Option<u32>> {
    let Some(pid) = alive(name) else {
        return Ok(None);
    };
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .with_context(|| format!("kill {name} ({pid})"))?;
    // Gone means every thread gone: the leader of a multithreaded process (the apiserver,
    // containerd) is a zombie while its other threads still exit and still hold its sockets,
    // and a successor started then found the apiserver's port in use.
    let started = Instant::now();
    while !exited(pid) {
        if started.elapsed() > Duration::from_secs(10) {
            bail!("{name} ({pid}) still runs 10 s after SIGKILL");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(Some(pid))
}

/// Whether every thread of `pid` has exited (reaped, or a zombie with no thread left).
fn exited(pid: u32) -> bool {
    if flock_testkit::is_alive(pid) {
        return false;
    }
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| tasks.flatten().count() <= 1)
        .unwrap_or(true)
}

/// The pid recorded for daemon `name`, if it is still alive.
pub fn alive(name: &str) -> Option<u32> {
    std::fs::read_to_string(pid_path(name))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .filter(|pid| flock_testkit::is_alive(*pid))
}

/// Waits up to `limit` for `ready`, failing early when daemon `name` dies; the error says what
/// was awaited and ends with the daemon's log.
pub fn wait_daemon(
    name: &str,
    what: &str,
    limit: Duration,
    mut ready: impl FnMut() -> bool,
) -> Result<Duration> {
    let started = Instant::now();
    loop {
        if ready() {
            return Ok(started.elapsed());
        }
        if alive(name).is_none() {
            bail!(
                "{name} exited while waiting for {what}; end of {}:\n{}",
                log_path(name).display(),
                log_tail(name, 25)
            );
        }
        if started.elapsed() > limit {
            bail!(
                "timed out after {limit:?} waiting for {what}; end of {}:\n{}",
                log_path(name).display(),
                log_tail(name, 25)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every pid `down` must kill: the recorded daemons, the members of the tracked cgroups (in
/// every hierarchy) and the processes in the cluster's network namespaces.
fn cluster_pids() -> Vec<u32> {
    let mut pids: Vec<u32> = Vec::new();
    if let Ok(dir) = std::fs::read_dir(Path::new(RUN_DIR).join("pids")) {
        for entry in dir.flatten() {
            if let Ok(text) = std::fs::read_to_string(entry.path()) {
                pids.extend(text.trim().parse::<u32>().ok());
            }
        }
    }
    for group in tracked_cgroups() {
        if let Ok(text) = std::fs::read_to_string(group.join("cgroup.procs")) {
            pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        }
    }
    for ns in namespaces() {
        if let Ok(out) = sys::output(Command::new("ip").args(["netns", "pids", &ns])) {
            pids.extend(out.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
        }
    }
    pids.sort_unstable();
    pids.dedup();
    pids.retain(|pid| *pid != std::process::id() && flock_testkit::is_alive(*pid));
    pids
}

/// Every cgroup directory at or under `flockcluster`, in every hierarchy, deepest first.
fn tracked_cgroups() -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(hierarchies) = std::fs::read_dir(CGROUP_ROOT) else {
        return found;
    };
    for h in hierarchies.flatten() {
        let top = h.path().join(CGROUP);
        if top.is_dir() {
            collect_dirs(&top, &mut found);
        }
    }
    // Deepest first, so that rmdir succeeds.
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found
}

fn collect_dirs(dir: &Path, found: &mut Vec<PathBuf>) {
    found.push(dir.to_path_buf());
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            // A cgroup's files are not directories; its children are.
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&e.path(), found);
            }
        }
    }
}

/// The cluster's network namespaces (`flockcluster-*`).
pub fn namespaces() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(NS_PREFIX))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Kills every process of the cluster (SIGKILL, repeated until none is left: a dying
/// containerd shim may fork no more, but a kubelet may have just started a container), then
/// removes the tracked cgroups. Bounded: fails after 20 s naming what survived.
pub fn kill_all() -> Result<Vec<u32>> {
    let mut killed = kill_until_gone(cluster_pids)?;
    remove_cgroups(tracked_cgroups())?;
    killed.sort_unstable();
    killed.dedup();
    Ok(killed)
}

/// Removes `groups` (deepest first, as [`tracked_cgroups`] lists them), waiting up to 10 s
/// for a task that just exited to let go of its cgroup.
fn remove_cgroups(groups: Vec<PathBuf>) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    for group in groups {
        while std::fs::remove_dir(&group).is_err() && group.exists() {
            if Instant::now() > deadline {
                bail!("cannot remove cgroup {}", group.display());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(())
}

/// The tracked cgroups of `node`'s pods (under `flockcluster/NODE`), deepest first.
fn node_cgroups(node: &str) -> Vec<PathBuf> {
    tracked_cgroups()
        .into_iter()
        .filter(|g| g.components().any(|c| c.as_os_str() == node))
        .collect()
}

/// Kills what `pids` finds with SIGKILL until it finds nothing (20 s at most); returns
/// every pid killed.
fn kill_until_gone(mut pids: impl FnMut() -> Vec<u32>) -> Result<Vec<u32>> {
    let mut killed = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let found = pids();
        if found.is_empty() {
            return Ok(killed);
        }
        if Instant::now() > deadline {
            bail!("processes {found:?} survived SIGKILL for 20 s");
        }
        for pid in &found {
            let _ = Command::new("kill")
                .args(["-9", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
        killed.extend(&found);
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Kills every process of one node, as its power going off would: its daemons (recorded as
/// `NODE-…`), whatever shares their mount namespace (containerd's shims), the members of its
/// pods' cgroups and the processes in its network namespace (host-network pods). The other
/// node and the control plane are untouched. Then its pods' cgroups are removed.
pub fn kill_node(node: &str, ns: &str) -> Result<Vec<u32>> {
    let mut mount_ns = None;
    let found = move || {
        let mut pids: Vec<u32> = Vec::new();
        if let Ok(dir) = std::fs::read_dir(Path::new(RUN_DIR).join("pids")) {
            for entry in dir.flatten() {
                if entry
                    .file_name()
                    .to_string_lossy()
                    .starts_with(&format!("{node}-"))
                    && let Ok(text) = std::fs::read_to_string(entry.path())
                {
                    pids.extend(text.trim().parse::<u32>().ok());
                }
            }
        }
        // The node's mount namespace, read once while its holder lives.
        if mount_ns.is_none() {
            mount_ns = alive(&format!("{node}-mounts"))
                .and_then(|pid| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok());
        }
        if let (Some(wanted), Ok(procs)) = (&mount_ns, std::fs::read_dir("/proc")) {
            for p in procs.flatten() {
                let Ok(pid) = p.file_name().to_string_lossy().parse::<u32>() else {
                    continue;
                };
                if std::fs::read_link(p.path().join("ns/mnt")).is_ok_and(|m| &m == wanted) {
                    pids.push(pid);
                }
            }
        }
        for group in node_cgroups(node) {
            if let Ok(text) = std::fs::read_to_string(group.join("cgroup.procs")) {
                pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
            }
        }
        if let Ok(out) = sys::output(Command::new("ip").args(["netns", "pids", ns])) {
            pids.extend(out.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
        }
        pids.sort_unstable();
        pids.dedup();
        pids.retain(|pid| *pid != std::process::id() && flock_testkit::is_alive(*pid));
        pids
    };
    let killed = kill_until_gone(found)?;
    remove_cgroups(node_cgroups(node))?;
    Ok(killed)
}
