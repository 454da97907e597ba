//! [`FlockNode`]: the real `flock-agent` binary running standalone inside a stand-in node
//! namespace, with its socket, state, DEL queue and BIRD paths in a private directory, and a
//! [`Runtime`](crate::cni::Runtime) that execs the real shim inside that namespace exactly as
//! a container runtime would. Used by the agent's end-to-end tests, the bench and the lab.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::cni::Runtime;
use crate::{Netns, workspace_bin};

static DIRS: AtomicU32 = AtomicU32::new(0);

/// How long [`FlockNode::stop_agent`] waits for the agent to stop after SIGTERM: its
/// shutdown answers the requests it took (for up to 20 s: the agent's
/// `server::DRAIN_TIMEOUT`) and returns.
pub const STOP_LIMIT: Duration = Duration::from_secs(40);

/// A directory under the system temp dir removed (recursively) on drop.
#[derive(Debug)]
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    /// Creates `flk<pid>-<tag><n>` in the temp dir.
    pub fn new(tag: &str) -> ScratchDir {
        let n = DIRS.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "{}{}-{tag}{n}",
            crate::NETNS_PREFIX,
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("create scratch dir");
        ScratchDir(path)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One stand-in node running the real agent.
#[derive(Debug)]
pub struct FlockNode {
    ns: Netns,
    dir: ScratchDir,
    agent_bin: PathBuf,
    agent: Option<Child>,
    env: Vec<(String, String)>,
    bird: Option<Child>,
}

impl FlockNode {
    /// Creates a node namespace, writes `node_yaml` as its NodeConfig and starts the agent;
    /// returns once the agent serves its socket.
    pub fn start(tag: &str, node_yaml: &str) -> FlockNode {
        let ns = Netns::new(tag);
        let dir = ScratchDir::new(tag);
        std::fs::write(AgentLayout::new(dir.path()).node_config, node_yaml)
            .expect("write node.yaml");
        let mut node = FlockNode {
            ns,
            dir,
            agent_bin: workspace_bin("flock-agent"),
            agent: None,
            env: Vec::new(),
            bird: None,
        };
        node.start_agent();
        node
    }

    /// The node's namespace.
    pub fn ns(&self) -> &Netns {
        &self.ns
    }

    /// The node's private directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The agent's socket.
    pub fn socket(&self) -> PathBuf {
        AgentLayout::new(self.dir()).socket
    }

    /// The agent's state directory.
    pub fn state_dir(&self) -> PathBuf {
        AgentLayout::new(self.dir()).state_dir
    }

    /// The DEL queue directory shared by the shim and the agent.
    pub fn del_queue_dir(&self) -> PathBuf {
        AgentLayout::new(self.dir()).del_queue_dir
    }

    /// The file names of the agent's committed allocation records, sorted (see
    /// [`AgentLayout::records`]).
    pub fn records(&self) -> Vec<String> {
        AgentLayout::new(self.dir()).records()
    }

    /// The allocation record `name` (one of [`FlockNode::records`]), parsed.
    pub fn record(&self, name: &str) -> Value {
        AgentLayout::new(self.dir()).record(name)
    }

    /// The BIRD configuration the agent renders.
    pub fn bird_config(&self) -> PathBuf {
        AgentLayout::new(self.dir()).bird_config
    }

    /// BIRD's control socket.
    pub fn bird_socket(&self) -> PathBuf {
        AgentLayout::new(self.dir()).bird_socket
    }

    /// The agent's log (stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(AgentLayout::new(self.dir()).log).unwrap_or_default()
    }

    /// Sets an environment variable for the next agent start (e.g. `FLOCK_FAILPOINT`).
    pub fn set_env(&mut self, key: &str, value: &str) {
        self.env.retain(|(k, _)| k != key);
        self.env.push((key.to_owned(), value.to_owned()));
    }

    /// Removes an environment variable for the next agent start.
    pub fn unset_env(&mut self, key: &str) {
        self.env.retain(|(k, _)| k != key);
    }

    /// Starts the agent and waits (up to 10 s) until its socket accepts connections.
    pub fn start_agent(&mut self) {
        assert!(self.agent.is_none(), "agent already running");
        let layout = AgentLayout::new(self.dir());
        let child = spawn_agent(self.ns.name(), &self.agent_bin, &layout, &self.env)
            .unwrap_or_else(|e| panic!("{e}"));
        self.agent = Some(child);
        if let Err(e) = wait_until_serving(self.agent.as_mut().expect("agent"), &layout) {
            self.agent = None;
            panic!("{e}");
        }
    }

    /// Stops the agent with SIGTERM and waits for it: at most [`STOP_LIMIT`], after which it
    /// is killed and the test fails with its log (an agent that does not stop on SIGTERM is a
    /// bug, and a silent hang until the harness's timeout would hide where it was).
    pub fn stop_agent(&mut self) {
        if let Some(mut child) = self.agent.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            self.exit_or_fail(&mut child, STOP_LIMIT, "stop after SIGTERM");
        }
    }

    /// Kills the agent with SIGKILL (a crash) and waits for it.
    pub fn kill_agent(&mut self) {
        if let Some(mut child) = self.agent.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Waits (up to `timeout`) for the agent to exit by itself (a failpoint).
    pub fn wait_agent_exit(&mut self, timeout: Duration) -> ExitStatus {
        let mut child = self.agent.take().expect("agent running");
        self.exit_or_fail(&mut child, timeout, "exit")
    }

    /// Waits up to `limit` for the agent `child` to exit and returns its status; past that,
    /// kills it and fails the test with its log, saying what it did not do (`what`).
    fn exit_or_fail(&self, child: &mut Child, limit: Duration, what: &str) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = child.try_wait().expect("wait for agent") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "flock-agent did not {what} within {limit:?}:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The agent's pid, while it runs.
    pub fn agent_pid(&self) -> Option<u32> {
        self.agent.as_ref().map(Child::id)
    }

    /// The flock conflist for this node (network `name`).
    pub fn conflist(&self, name: &str) -> Value {
        AgentLayout::new(self.dir()).conflist(name)
    }

    /// A runtime stand-in that execs the real shim inside this node's namespace for network
    /// `name`, caching results under this node's directory.
    pub fn runtime(&self, name: &str) -> Runtime {
        let shim_dir = crate::shim_bin()
            .parent()
            .expect("shim directory")
            .to_owned();
        Runtime::new(
            self.conflist(name),
            [shim_dir],
            self.dir().join(format!("cni-cache-{name}")),
        )
        .expect("valid conflist")
        .in_netns(self.ns.path())
    }

    /// Sends raw bytes to the agent socket, closes the sending side, and returns what it
    /// answers (until it closes the connection, at most `timeout`).
    pub fn raw_rpc(&self, bytes: &[u8], timeout: Duration) -> std::io::Result<String> {
        let mut stream = std::os::unix::net::UnixStream::connect(self.socket())?;
        stream.set_read_timeout(Some(timeout))?;
        stream.write_all(bytes)?;
        stream.shutdown(std::net::Shutdown::Write)?;
        let mut out = String::new();
        stream.read_to_string(&mut out)?;
        Ok(out)
    }

    /// GETs `path` from the agent's metrics server (127.0.0.1:9641 inside the node).
    pub fn http_get(&self, path: &str) -> String {
        let out = self
            .ns
            .exec(["curl", "-s", &format!("http://127.0.0.1:9641{path}")]);
        assert!(
            out.status.success(),
            "GET {path} from the agent's metrics server failed: {}",
            out.status
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The value of a metric line `name` (exact, with labels) from `/metrics`, 0 if absent.
    pub fn metric(&self, name: &str) -> f64 {
        self.http_get("/metrics")
            .lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(0.0)
    }

    /// Waits (15 s at most) until the metric `name` is at least `value`.
    pub fn wait_metric_at_least(&self, name: &str, value: f64) {
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.metric(name) < value {
            assert!(
                Instant::now() < deadline,
                "{name} did not reach {value}: {}",
                self.metric(name)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits (15 s at most) until `/readyz` says ok.
    pub fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let readyz = self.http_get("/readyz");
            if readyz.starts_with("ok") {
                return;
            }
            assert!(Instant::now() < deadline, "/readyz still not ok: {readyz}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Starts BIRD in the node namespace on the agent's rendered config, once the agent has
    /// written it (its writer task may still be at it when the socket is up).
    pub fn start_bird(&mut self) {
        assert!(self.bird.is_none(), "bird already running");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !self.bird_config().exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "the agent wrote no BIRD config in 10 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let out = self
            .ns
            .exec(["bird", "-p", "-c", &self.bird_config().to_string_lossy()]);
        assert!(
            out.status.success(),
            "bird -p rejects the agent's config: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let child = Command::new("ip")
            .args(["netns", "exec", self.ns.name(), "bird", "-f", "-c"])
            .arg(self.bird_config())
            .arg("-s")
            .arg(self.bird_socket())
            .arg("-P")
            .arg(self.dir().join("run/bird.pid"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn bird");
        self.bird = Some(child);
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.bird_socket().exists() {
            assert!(
                Instant::now() < deadline,
                "bird did not open its control socket"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for FlockNode {
    fn drop(&mut self) {
        self.kill_agent();
        if let Some(mut b) = self.bird.take() {
            let _ = b.kill();
            let _ = b.wait();
        }
    }
}

/// Where one standalone agent keeps its files: everything under one directory, `node.yaml`
/// (its NodeConfig) included.
#[derive(Debug, Clone)]
pub struct AgentLayout {
    /// The NodeConfig file.
    pub node_config: PathBuf,
    /// The RPC socket.
    pub socket: PathBuf,
    /// The state directory.
    pub state_dir: PathBuf,
    /// The DEL queue.
    pub del_queue_dir: PathBuf,
    /// The rendered BIRD configuration.
    pub bird_config: PathBuf,
    /// BIRD's control socket.
    pub bird_socket: PathBuf,
    /// The agent's stderr.
    pub log: PathBuf,
}

impl AgentLayout {
    /// The layout under `dir`.
    pub fn new(dir: &Path) -> AgentLayout {
        AgentLayout {
            node_config: dir.join("node.yaml"),
            socket: dir.join("run/agent.sock"),
            state_dir: dir.join("state"),
            del_queue_dir: dir.join("del-queue"),
            bird_config: dir.join("bird/bird.conf"),
            bird_socket: dir.join("run/bird.ctl"),
            log: dir.join("agent.log"),
        }
    }

    /// The file names of the agent's allocation records, sorted: its record files
    /// (`<state_dir>/allocations/*.json`, temporary dot files left out) and, for a record in
    /// a page of its slots file (`allocations/slots`), the file name it would have
    /// (`<containerId>:<ifName>.json`); none if the directory does not exist (yet).
    pub fn records(&self) -> Vec<String> {
        let dir = self.state_dir.join("allocations");
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".json") && !n.starts_with('.'))
                    .collect()
            })
            .unwrap_or_default();
        for (name, _) in slot_records(&dir) {
            if !names.contains(&name) {
                names.push(name);
            }
        }
        names.sort();
        names
    }

    /// The allocation record `name` (one of [`AgentLayout::records`]), parsed: its file, or
    /// else its page of the slots file; panics if it has neither or is not JSON.
    pub fn record(&self, name: &str) -> Value {
        let dir = self.state_dir.join("allocations");
        let path = dir.join(name);
        match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("record {} is not JSON: {e}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => slot_records(&dir)
                .into_iter()
                .find_map(|(n, record)| (n == name).then_some(record))
                .unwrap_or_else(|| {
                    panic!("record {name}: no such file, nor a page of the slots file")
                }),
            Err(e) => panic!("read record {}: {e}", path.display()),
        }
    }

    /// flock's conflist for this agent (network `name`, CNI 1.1.0, with the CRI
    /// pod-annotations capability).
    pub fn conflist(&self, name: &str) -> Value {
        json!({
            "cniVersion": "1.1.0",
            "name": name,
            "plugins": [{
                "type": "flock",
                "agentSocket": self.socket,
                "delQueueDir": self.del_queue_dir,
                // The crash tests kill the agent under a burst and join every call before
                // starting it again: a short wait keeps a call that missed the agent from
                // holding a round for the default 30 s.
                "agentWaitSeconds": 2,
                "capabilities": { "io.kubernetes.cri.pod-annotations": true }
            }]
        })
    }
}

/// Starts `agent_bin run --standalone` inside namespace `netns` with the files of `layout`
/// (its stderr appended to `layout.log`) and extra environment `env`.
pub fn spawn_agent(
    netns: &str,
    agent_bin: &Path,
    layout: &AgentLayout,
    env: &[(String, String)],
) -> Result<Child, String> {
    let _ = std::fs::remove_file(&layout.socket);
    if let Some(dir) = layout.log.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&layout.log)
        .map_err(|e| format!("open {}: {e}", layout.log.display()))?;
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", netns])
        .arg(agent_bin)
        .args(["run", "--standalone", "--node-config"])
        .arg(&layout.node_config)
        .arg("--socket")
        .arg(&layout.socket)
        .arg("--state-dir")
        .arg(&layout.state_dir)
        .arg("--del-queue-dir")
        .arg(&layout.del_queue_dir)
        .arg("--bird-config")
        .arg(&layout.bird_config)
        .arg("--bird-socket")
        .arg(&layout.bird_socket)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn()
        .map_err(|e| format!("spawn {}: {e}", agent_bin.display()))
}

/// Waits (up to 10 s) until the agent serves its socket; an agent that exits first is an
/// error carrying its log.
pub fn wait_until_serving(child: &mut Child, layout: &AgentLayout) -> Result<(), String> {
    let log = || std::fs::read_to_string(&layout.log).unwrap_or_default();
    // Start-up removes every orphan veth before it binds the socket: after a kill -9 in a
    // burst, on a loaded machine, that can take seconds.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if std::os::unix::net::UnixStream::connect(&layout.socket).is_ok() {
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "flock-agent exited at start ({status}):\n{}",
                log()
            ));
        }
        if Instant::now() >= deadline {
            return Err(format!("flock-agent did not serve within 30 s:\n{}", log()));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The records in the pages of an agent's slots file in `dir` (pages of 4096 bytes, each a
/// record's JSON padded with spaces or blank), each with its file name
/// (`<containerId>:<ifName>.json`); none without the file. Read here on its own, not through
/// the agent's store, so that the tests check the layout the agent writes.
fn slot_records(dir: &Path) -> Vec<(String, Value)> {
    let path = dir.join("slots");
    let Ok(bytes) = std::fs::read(&path) else {
        return Vec::new();
    };
    bytes
        .chunks(4096)
        .enumerate()
        .filter_map(|(page, bytes)| {
            let text = String::from_utf8_lossy(bytes);
            let text = text.trim_end_matches([' ', '\0']);
            if text.is_empty() {
                return None;
            }
            let record: Value = serde_json::from_str(text).unwrap_or_else(|e| {
                panic!("page {page} of {} is not a record: {e}", path.display())
            });
            let name = format!(
                "{}:{}.json",
                record["containerId"].as_str().unwrap_or_default(),
                record["ifName"].as_str().unwrap_or_default()
            );
            Some((name, record))
        })
        .collect()
}
