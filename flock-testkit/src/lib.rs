//! Test support shared by flock's crates (never shipped).
//!
//! - [`Netns`]: a uniquely named network namespace (`ip netns add`) that kills
//!   whatever runs inside it and deletes itself when dropped — also when the
//!   test panics — so no test ever touches the machine's own namespace and
//!   none leaves one behind.
//! - [`workspace_bin`]: the path of a binary of this workspace, for tests that
//!   exec the shim or the agent exactly as a runtime would.
//! - [`sweep_stale`]: removes namespaces left by test processes that died.
//! - [`reference_plugins_dir`]: where the reference CNI plugins are.
//! - [`cni::Runtime`]: a CNI runtime stand-in that execs plugin chains
//!   exactly as libcni does (config injection, `prevResult` caching, reverse
//!   DEL, STATUS/GC), optionally inside a stand-in node namespace.

pub mod cni;
#[cfg(feature = "kube")]
pub mod kube_mock;
pub mod modules;
pub mod node;
#[cfg(feature = "tokio")]
pub mod wait;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// Every namespace this kit creates starts with this, followed by the pid of
/// the creating process, so [`sweep_stale`] can tell which ones are orphans.
pub const NETNS_PREFIX: &str = "flk";

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Panics with a clear message unless the process runs as root.
pub fn require_root() {
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_owned))
        })
        .unwrap_or_default();
    assert_eq!(
        uid, "0",
        "this test creates network namespaces and needs root; run it through `cargo xtask test` as root"
    );
}

/// A network namespace created for one test, removed on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Creates `flk<pid>-<tag><n>` with its loopback up. `tag` should be a
    /// few letters naming the test's role (`node`, `pod`, `rtr`).
    pub fn new(tag: &str) -> Netns {
        require_root();
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("{NETNS_PREFIX}{}-{tag}{n}", std::process::id());
        run(["ip", "netns", "add", &name]);
        let ns = Netns { name };
        ns.ok(["ip", "link", "set", "lo", "up"]);
        ns
    }

    /// The namespace's name as `ip netns` knows it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The bind-mounted namespace file, as a runtime passes it in `CNI_NETNS`.
    pub fn path(&self) -> PathBuf {
        Path::new("/run/netns").join(&self.name)
    }

    /// Runs a command inside the namespace and returns its output, whatever
    /// its exit status.
    pub fn exec<I, S>(&self, args: I) -> Output
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args)
            .output()
            .expect("spawn `ip netns exec`")
    }

    /// Runs a command inside the namespace, panics with its stderr if it
    /// fails, and returns its stdout.
    pub fn ok<I, S>(&self, args: I) -> String
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args: Vec<_> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
        let out = self.exec(&args);
        assert!(
            out.status.success(),
            "in netns {}: {:?} failed: {}{}",
            self.name,
            args,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The names of the namespace's links other than `lo`, in the kernel's order, each
    /// without its `@peer` suffix (`flock1a2b@if2` is `flock1a2b`). Callers filter further
    /// (e.g. on a name prefix) as their test needs.
    pub fn links(&self) -> Vec<String> {
        self.ok(["ip", "-o", "link", "show"])
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap_or(n).to_owned())
            .filter(|n| n != "lo")
            .collect()
    }

    /// The links once `settled` holds for them, or after 10 s whatever they are then (the
    /// caller asserts on them). A flock DEL answers before the kernel has deleted the host
    /// veth (tens of milliseconds, off the DEL's critical path): a test that expects a veth
    /// gone after a DEL waits here rather than sleeping.
    pub fn links_settled(&self, settled: impl Fn(&[String]) -> bool) -> Vec<String> {
        // Deleting a veth takes the kernel's global rtnl lock, which parallel tests' namespace
        // teardowns hold for long stretches: be generous, it returns as soon as it can.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let links = self.links();
            if settled(&links) || std::time::Instant::now() > deadline {
                return links;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs `f` on a thread of its own inside this namespace: sockets it creates live there.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let file = std::fs::File::open(self.path()).expect("open the namespace file");
        std::thread::scope(|s| {
            s.spawn(move || {
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                    .expect("setns into the test's namespace");
                f()
            })
            .join()
            .expect("namespace thread")
        })
    }

    /// Whether a TCP connection from inside this namespace to `to`:`port` is accepted within
    /// 0.7 s (below TCP's first retransmission: one SYN).
    pub fn tcp_connects(&self, to: std::net::IpAddr, port: u16) -> bool {
        self.run(|| {
            std::net::TcpStream::connect_timeout(
                &std::net::SocketAddr::new(to, port),
                Duration::from_millis(700),
            )
            .is_ok()
        })
    }

    /// Whether a `ping` from inside this namespace to `addr` gets an answer
    /// (3 tries, 0.2 s apart, 2 s at most).
    pub fn pings(&self, addr: &str) -> bool {
        self.exec(["ping", "-c", "1", "-W", "1", "-w", "2", "-i", "0.2", addr])
            .status
            .success()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        remove_netns(&self.name);
    }
}

fn remove_netns(name: &str) {
    // Processes inside (BIRD, an agent) would keep the namespace alive.
    if let Ok(out) = Command::new("ip").args(["netns", "pids", name]).output() {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            let _ = Command::new("kill").args(["-9", pid]).status();
        }
    }
    let _ = Command::new("ip").args(["netns", "del", name]).status();
}

/// Removes `flk<pid>-…` namespaces whose creating process is gone (a test
/// killed by a timeout cannot run its destructors). Returns their names.
pub fn sweep_stale() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(NETNS_PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            remove_netns(&name);
            removed.push(name);
        }
    }
    removed
}

/// Where the reference CNI plugins (`ptp`, `host-local`, `loopback`, `portmap`, `bandwidth` …)
/// are: `FLOCK_CNI_PLUGINS_DIR` (the test bed's build of v1.10, which `cargo xtask test` sets),
/// else Debian's `/usr/lib/cni`.
pub fn reference_plugins_dir() -> PathBuf {
    std::env::var_os(REFERENCE_PLUGINS_ENV)
        .map_or_else(|| PathBuf::from("/usr/lib/cni"), PathBuf::from)
}

/// The variable naming [`reference_plugins_dir`].
pub const REFERENCE_PLUGINS_ENV: &str = "FLOCK_CNI_PLUGINS_DIR";

/// The path of binary `name` built from this workspace (`target/<profile>/<name>`),
/// found next to the running test executable. Panics with what to run if it
/// has not been built (`cargo xtask test` builds every binary first).
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test-binary>
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary lives in target/<profile>/deps");
    let bin = profile_dir.join(name);
    assert!(
        bin.exists(),
        "{} is not built; run `cargo build --workspace --bins` first (`cargo xtask test` does)",
        bin.display()
    );
    bin
}

/// The shim to exec in tests: `FLOCK_SHIM_BIN` when set, else [`workspace_bin`]`("flock")`.
/// `cargo xtask test` sets it to the shim as a node's binaries have it (linked statically
/// against musl, `flock-plugin/musl.specs`), which a plain `cargo build` does not make.
pub fn shim_bin() -> PathBuf {
    let Some(path) = std::env::var_os("FLOCK_SHIM_BIN").map(PathBuf::from) else {
        return workspace_bin("flock");
    };
    // Its directory is a runtime's CNI_PATH, where a conflist's `"type": "flock"` is looked up.
    assert!(
        path.file_name() == Some(std::ffi::OsStr::new("flock")) && path.is_absolute(),
        "FLOCK_SHIM_BIN={} must be an absolute path to a file named flock",
        path.display()
    );
    path
}

fn run<const N: usize>(args: [&str; N]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", args[0]));
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The prefixes of the `route PREFIX …;` lines of a rendered BIRD config (what a node
/// announces), in file order.
pub fn bird_routes(config: &str) -> Vec<String> {
    config
        .lines()
        .filter_map(|l| l.trim().strip_prefix("route "))
        .filter_map(|r| r.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// Crates a pure flock library must never depend on (normal dependencies): an async runtime,
/// netlink, raw syscalls, an OS random source (randomness comes from the caller's `Rng`), a
/// clock.
pub const IMPURE_CRATES: &[&str] = &[
    "getrandom",
    "rand",
    "chrono",
    "time",
    "tokio",
    "mio",
    "nix",
    "libc",
    "rtnetlink",
    "netlink-sys",
    "netlink-proto",
    "netlink-packet-route",
    "futures",
];

/// The crates of `package`'s normal dependency tree (`cargo tree -e normal`), `package` first;
/// `depth` 1: its direct dependencies only.
pub fn dependency_tree(package: &str, depth: Option<usize>) -> Vec<String> {
    let depth = depth.map(|d| d.to_string());
    let mut args = vec![
        "tree",
        "-p",
        package,
        "-e",
        "normal",
        "--prefix",
        "none",
        "--offline",
    ];
    if let Some(d) = &depth {
        args.extend(["--depth", d]);
    }
    cargo(args)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// Runs the cargo that runs the tests (`$CARGO`, else `cargo`) with `args` and returns its
/// stdout; panics with the command and its stderr unless it exits 0.
pub fn cargo<I, S>(args: I) -> String
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<std::ffi::OsString> = args.into_iter().map(|a| a.as_ref().into()).collect();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(&cargo)
        .args(&args)
        .output()
        .unwrap_or_else(|e| panic!("run {cargo:?}: {e}"));
    assert!(
        out.status.success(),
        "{cargo:?} {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The folders of the workspace's member crates (`cargo metadata --no-deps`).
pub fn workspace_crates() -> Vec<PathBuf> {
    let metadata: serde_json::Value = serde_json::from_str(&cargo([
        "metadata",
        "--no-deps",
        "--format-version",
        "1",
        "--offline",
    ]))
    .expect("cargo metadata prints JSON");
    let mut dirs: Vec<PathBuf> = metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .filter_map(|p| p["manifest_path"].as_str())
        .filter_map(|m| Path::new(m).parent().map(Path::to_owned))
        .collect();
    dirs.sort();
    dirs
}

/// Asserts that `package`'s normal dependency tree (`cargo tree -e normal`) contains every crate
/// of `expected` (so the check looks at a real tree) and none of [`IMPURE_CRATES`].
pub fn assert_pure_dependency_tree(package: &str, expected: &[&str]) {
    let names = dependency_tree(package, None);
    let tree = names.join("\n");
    for want in expected {
        assert!(
            names.iter().any(|n| n == want),
            "{want} missing from the tree of {package}:\n{tree}"
        );
    }
    for banned in IMPURE_CRATES {
        assert!(
            !names.iter().any(|n| n == banned),
            "{banned} is in the normal dependency tree of {package}, a pure crate:\n{tree}"
        );
    }
}

/// Whether process `pid` exists and is not a zombie (a killed process that is not our child
/// waits as a zombie until init reaps it: it is dead for every purpose of a test).
pub fn is_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        // `pid (comm) state …`; comm may hold spaces and parentheses.
        stat.rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .is_some_and(|state| state != "Z")
    })
}

/// The `p` quantile (0.0..=1.0, nearest rank) of `sorted`, which must be sorted ascending and
/// not empty.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}
