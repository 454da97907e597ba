//! A containerd process inside a stand-in node namespace.
//!
//! Started as `nsenter --net=NODE -- unshare --mount --propagation slave --
//! containerd --config CFG`: the node's network namespace, and a private
//! mount namespace (a slave of the machine's) so every mount containerd makes
//! — snapshots, shm, sandbox netns pins — exists only there and vanishes with
//! its last process. `ip netns exec` is not used because it remounts `/sys`,
//! which hides the cgroup hierarchies runc needs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::config::ContainerdConfig;
use crate::{Error, Result};

/// The major version of the `containerd` binary at `containerd`: 1 takes config version 2, 2
/// takes version 3.
pub fn major_version(containerd: &Path) -> Result<u32> {
    let mut cmd = Command::new(containerd);
    cmd.arg("--version");
    let shown = format!("{cmd:?}");
    let out = cmd.output().map_err(|source| Error::Spawn {
        program: shown.clone(),
        source,
    })?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    // `containerd github.com/containerd/containerd/v2 v2.4.2 …`, `containerd containerd.io 1.6.20~ds1 …`
    text.split_whitespace()
        .nth(2)
        .and_then(|v| v.trim_start_matches('v').split('.').next()?.parse().ok())
        .ok_or(Error::CommandFailed {
            command: shown,
            status: out.status.to_string(),
            stderr: format!("no version in {text:?}"),
        })
}

/// How long containerd may take to answer on its socket.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A running containerd, killed on drop together with its shims and the
/// sandboxes they run.
#[derive(Debug)]
pub struct Containerd {
    child: Child,
    config: ContainerdConfig,
    config_path: PathBuf,
    log: PathBuf,
}

impl Containerd {
    /// Writes `config` as `dir/containerd.toml` and starts containerd in the
    /// network namespace at `netns_path`; returns once it answers on its
    /// socket. Its output goes to `dir/containerd.log`.
    pub fn start(netns_path: &Path, config: ContainerdConfig, dir: &Path) -> Result<Containerd> {
        for d in [&config.root, &config.state] {
            std::fs::create_dir_all(d).map_err(|source| Error::Io {
                op: "create containerd directory",
                path: d.clone(),
                source,
            })?;
        }
        let config_path = dir.join("containerd.toml");
        let rendered = match major_version(&config.program("containerd"))? {
            1 => config.render_v2(),
            _ => config.render(),
        };
        std::fs::write(&config_path, rendered).map_err(|source| Error::Io {
            op: "write containerd config",
            path: config_path.clone(),
            source,
        })?;
        let log = dir.join("containerd.log");
        let log_file = std::fs::File::create(&log).map_err(|source| Error::Io {
            op: "create containerd log",
            path: log.clone(),
            source,
        })?;
        let log_err = log_file.try_clone().map_err(|source| Error::Io {
            op: "duplicate containerd log handle",
            path: log.clone(),
            source,
        })?;
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net={}", netns_path.display()))
            .args(["--", "unshare", "--mount", "--propagation", "slave", "--"])
            .arg(config.program("containerd"))
            .arg("--config")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(log_err);
        // containerd finds its shim (`containerd-shim-runc-v2`) on PATH: its own first.
        if let Some(dir) = &config.bin_dir {
            let path = std::env::var("PATH").unwrap_or_default();
            cmd.env("PATH", format!("{}:{path}", dir.display()));
        }
        let child = cmd.spawn().map_err(|source| Error::Spawn {
            program: format!("{cmd:?}"),
            source,
        })?;
        let mut containerd = Containerd {
            child,
            config,
            config_path,
            log,
        };
        containerd.wait_ready()?;
        Ok(containerd)
    }

    fn wait_ready(&mut self) -> Result<()> {
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(Error::ContainerdExited {
                    status: status.to_string(),
                    log: self.log.clone(),
                    tail: self.log_tail(20),
                });
            }
            if self.config.socket.exists() {
                let answered = Command::new(self.config.program("ctr"))
                    .arg("--address")
                    .arg(&self.config.socket)
                    .arg("version")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
                if answered {
                    tracing::debug!(elapsed = ?started.elapsed(), "containerd ready");
                    return Ok(());
                }
            }
            if started.elapsed() > START_TIMEOUT {
                return Err(Error::Timeout {
                    what: format!(
                        "containerd to answer on {} (log {}: {})",
                        self.config.socket.display(),
                        self.log.display(),
                        self.log_tail(10)
                    ),
                    waited: START_TIMEOUT,
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// containerd's process id (also the way into its mount namespace).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The gRPC socket (containerd API and CRI).
    pub fn socket(&self) -> &Path {
        &self.config.socket
    }

    /// The configuration it runs with.
    pub fn config(&self) -> &ContainerdConfig {
        &self.config
    }

    /// The rendered config file.
    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    /// What its binary's `--version` prints (`containerd github.com/containerd/containerd
    /// v1.7.35 …`).
    pub fn version(&self) -> Result<String> {
        let mut cmd = Command::new(self.config.program("containerd"));
        cmd.arg("--version");
        let out = cmd.output().map_err(|source| Error::Spawn {
            program: format!("{cmd:?}"),
            source,
        })?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// Its log file (stdout and stderr).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// A command that runs `program` inside the network namespace pinned at
    /// `netns_path` — a sandbox's, as PodSandboxStatus reports it. The pin is
    /// a mount in containerd's mount namespace, so the command enters that
    /// first.
    pub fn command_in_netns(&self, netns_path: &Path, program: &str) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg("-t")
            .arg(self.pid().to_string())
            .args(["-m", "--", "nsenter"])
            .arg(format!("--net={}", netns_path.display()))
            .args(["--", program]);
        cmd
    }

    /// Whether a namespace (or anything) is still mounted at `path` in
    /// containerd's mount namespace.
    pub fn is_mounted(&self, path: &Path) -> bool {
        let Ok(info) = std::fs::read_to_string(format!("/proc/{}/mountinfo", self.pid())) else {
            return false;
        };
        let wanted = path.display().to_string();
        info.lines()
            .any(|l| l.split(' ').nth(4).is_some_and(|mp| mp == wanted))
    }

    /// Kills containerd, then every shim it started and the processes those
    /// run (sandboxes), so that nothing holds its mount namespace. Done on
    /// drop; safe to call twice.
    pub fn kill(&mut self) {
        let tasks = self.tasks();
        let shims = shims_of(&self.config.socket);
        let _ = self.child.kill();
        let _ = self.child.wait();
        let mut killed = Vec::new();
        for shim in shims {
            for pid in descendants(shim) {
                kill9(pid);
                killed.push(pid);
            }
            kill9(shim);
            killed.push(shim);
        }
        // Orphans are reaped by init a moment later; wait so that callers
        // (and the temp dir's removal) see them gone.
        let deadline = Instant::now() + Duration::from_secs(5);
        while killed.iter().any(|&pid| flock_testkit::is_alive(pid)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        // What a clean RemovePodSandbox would have removed: the shims'
        // sockets (under the machine's /run/containerd/s) and the cgroups.
        for task in tasks {
            if let Some(socket) = &task.shim_socket {
                let _ = std::fs::remove_file(socket);
            }
            remove_cgroups(&task.id);
        }
    }

    /// The tasks (sandboxes, containers) whose bundles are in the state dir.
    fn tasks(&self) -> Vec<Task> {
        let dir = self
            .config
            .state
            .join("io.containerd.runtime.v2.task")
            .join("k8s.io");
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        entries
            .flatten()
            .map(|e| Task {
                id: e.file_name().to_string_lossy().into_owned(),
                shim_socket: shim_socket(&e.path()),
            })
            .collect()
    }

    /// The bundle of task (sandbox or container) `id` in the state dir.
    pub fn bundle(&self, id: &str) -> PathBuf {
        self.config
            .state
            .join("io.containerd.runtime.v2.task")
            .join("k8s.io")
            .join(id)
    }
}

/// The socket of the shim serving the task whose bundle is `bundle`: from `bootstrap.json`
/// (containerd 2) or `address` (1.x). It sits in the machine's `/run/containerd/s`, which the
/// harness does not redirect, so a harness that kills the shim removes it.
pub fn shim_socket(bundle: &Path) -> Option<PathBuf> {
    let address = match std::fs::read_to_string(bundle.join("bootstrap.json")) {
        Ok(text) => serde_json::from_str::<serde_json::Value>(&text)
            .ok()?
            .get("address")?
            .as_str()?
            .to_owned(),
        Err(_) => std::fs::read_to_string(bundle.join("address")).ok()?,
    };
    address.trim().strip_prefix("unix://").map(PathBuf::from)
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A task bundle containerd left in its state dir.
struct Task {
    id: String,
    shim_socket: Option<PathBuf>,
}

/// Removes the (empty, once its processes are dead) cgroup runc made for
/// task `id` under the CRI plugin's `k8s.io` parent, in every hierarchy.
fn remove_cgroups(id: &str) {
    if id.is_empty() || id.contains('/') || id.starts_with('.') {
        return;
    }
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    let _ = std::fs::remove_dir(Path::new("/sys/fs/cgroup/k8s.io").join(id));
    for h in hierarchies.flatten() {
        let _ = std::fs::remove_dir(h.path().join("k8s.io").join(id));
    }
}

/// Pids of the `containerd-shim*` processes serving `socket`.
fn shims_of(socket: &Path) -> Vec<u32> {
    let wanted = socket.display().to_string();
    all_pids()
        .into_iter()
        .filter(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if !comm.starts_with("containerd-shim") {
                return false;
            }
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            cmdline
                .split(|&b| b == 0)
                .any(|arg| arg == wanted.as_bytes())
        })
        .collect()
}

/// All processes below `root`, deepest first.
fn descendants(root: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = all_pids()
        .into_iter()
        .filter_map(|pid| parent_of(pid).map(|ppid| (pid, ppid)))
        .collect();
    let mut found = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for &(pid, ppid) in &parents {
            if ppid == p {
                found.push(pid);
                frontier.push(pid);
            }
        }
    }
    found.reverse();
    found
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ppid …`; comm may hold spaces and parentheses.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(1)?.parse().ok()
}

fn kill9(pid: u32) {
    let _ = Command::new("kill")
        .args(["-9", &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parent_of_self_is_our_parent() {
        let me = std::process::id();
        let ppid = parent_of(me).expect("own stat parses");
        assert!(ppid > 0);
        assert!(!descendants(ppid).is_empty());
        assert!(descendants(ppid).contains(&me));
    }
}
