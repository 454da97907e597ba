//! A prober inside a pod's network namespace: TCP connections to one address, one begun every
//! [`EVERY`] while it is active, each given [`TIMEOUT`]; the start, outcome and connect time
//! of each recorded. The same detector for every CNI: a policy change is *enforced* from the
//! first connection begun after it of the run with the new outcome that holds from then on,
//! whatever the CNI programs (nftables, iptables and ipsets, a userspace verdict on the first
//! packet).

use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// How often a connection is begun while the prober is active: the resolution of a latency.
pub const EVERY: Duration = Duration::from_millis(2);
/// How long a connection may take before it counts as refused (a dropped SYN is retried by
/// the kernel only after a second, so a blocked connection never succeeds within this).
pub const TIMEOUT: Duration = Duration::from_millis(100);
/// How long a new outcome must hold before a change counts as enforced.
pub const STABLE: Duration = Duration::from_millis(300);
/// Threads, enough that one is free every [`EVERY`] while others wait out [`TIMEOUT`].
const THREADS: usize = 64;

/// One connection attempt.
#[derive(Debug, Clone, Copy)]
pub struct Attempt {
    /// When it began.
    pub at: Instant,
    /// Its connect time if it connected; `None`: refused, reset or timed out.
    pub connected: Option<Duration>,
}

struct Shared {
    active: AtomicBool,
    stop: AtomicBool,
    /// When the next attempt may begin.
    next: Mutex<Instant>,
    attempts: Mutex<Vec<Attempt>>,
}

/// The prober: threads in the pod's network namespace, idle until [`Prober::active`].
pub struct Prober {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

/// The pid of the container with ID `id` (its cgroup path ends in the ID: containerd names
/// each container's cgroup after it).
pub fn container_pid(id: &str) -> Result<u32> {
    let needle = format!("/{id}\n");
    for entry in std::fs::read_dir("/proc").context("read /proc")?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cgroup = std::fs::read_to_string(entry.path().join("cgroup")).unwrap_or_default();
        if cgroup.contains(&needle) {
            return Ok(pid);
        }
    }
    bail!("no process of container {id} (no cgroup path ending in it)")
}

impl Prober {
    /// Starts the threads in the network namespace of process `pid`, probing `target`.
    pub fn start(pid: u32, target: SocketAddr) -> Result<Prober> {
        let netns = format!("/proc/{pid}/ns/net");
        let shared = Arc::new(Shared {
            active: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            next: Mutex::new(Instant::now()),
            attempts: Mutex::new(Vec::new()),
        });
        let mut threads = Vec::new();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
        for _ in 0..THREADS {
            let shared = Arc::clone(&shared);
            let netns = netns.clone();
            let ready = ready_tx.clone();
            threads.push(std::thread::spawn(move || {
                let entered = enter(Path::new(&netns));
                let ok = entered.is_ok();
                let _ = ready.send(entered.map_err(|e| format!("{e:#}")));
                if ok {
                    work(&shared, target);
                }
            }));
        }
        let prober = Prober { shared, threads };
        for _ in 0..THREADS {
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => bail!("prober: {e}"),
                Err(_) => bail!("prober: a thread ended before entering {netns}"),
            }
        }
        Ok(prober)
    }

    /// Begins (`true`) or stops (`false`) connection attempts.
    pub fn active(&self, on: bool) {
        *self.shared.next.lock().expect("next") = Instant::now();
        self.shared.active.store(on, Ordering::SeqCst);
    }

    /// The attempts recorded that began in `from..to`.
    pub fn attempts(&self, from: Instant, to: Instant) -> Vec<Attempt> {
        let mut a: Vec<Attempt> = self
            .shared
            .attempts
            .lock()
            .expect("attempts")
            .iter()
            .filter(|a| a.at >= from && a.at < to)
            .copied()
            .collect();
        a.sort_by_key(|a| a.at);
        a
    }

    /// When the target settled to outcome `open` (connected) after `since`: the start of the
    /// first attempt of the run of attempts with that outcome that lasts [`STABLE`] and is
    /// not broken after (a CNI that rewrites its rules may refuse or pass a connection for a
    /// moment before it holds). `None` if it did not settle within `limit`.
    pub fn settled(&self, since: Instant, open: bool, limit: Duration) -> Option<Instant> {
        let deadline = since + limit + STABLE;
        loop {
            std::thread::sleep(Duration::from_millis(5));
            let now = Instant::now();
            // Only attempts whose outcome is certainly recorded: begun a timeout ago.
            let known = now.checked_sub(TIMEOUT + Duration::from_millis(20))?;
            let attempts = self.attempts(since, known);
            let last_other = attempts.iter().rposition(|a| a.connected.is_some() != open);
            let from = last_other.map_or(0, |i| i + 1);
            if let Some(first) = attempts.get(from)
                && known.saturating_duration_since(first.at) >= STABLE
            {
                return Some(first.at);
            }
            if now > deadline {
                return None;
            }
        }
    }

    /// The outcome of the last attempts recorded (connected or not), once `n` of them began
    /// after now; the state the target is in as the prober sees it.
    pub fn state(&self, n: usize) -> Result<bool> {
        let since = Instant::now();
        let mut outcomes = Vec::new();
        crate::sys::wait_for(Duration::from_secs(2), || {
            outcomes = self
                .attempts(since, Instant::now())
                .iter()
                .map(|a| a.connected.is_some())
                .collect();
            outcomes.len() >= n
        })
        .context("the prober records no attempt (is it active?)")?;
        if outcomes.iter().all(|o| *o) {
            Ok(true)
        } else if outcomes.iter().all(|o| !*o) {
            Ok(false)
        } else {
            bail!("the prober's last {n} attempts disagree: {outcomes:?}")
        }
    }

    /// Forgets every attempt recorded so far (they accumulate while active).
    pub fn clear(&self) {
        self.shared.attempts.lock().expect("attempts").clear();
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Moves the calling thread into the network namespace at `path`.
fn enter(path: &Path) -> Result<()> {
    let file = std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
        .with_context(|| format!("setns into {}", path.display()))
}

fn work(shared: &Shared, target: SocketAddr) {
    while !shared.stop.load(Ordering::SeqCst) {
        if !shared.active.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        // Take the next slot.
        let at = {
            let mut next = shared.next.lock().expect("next");
            let at = (*next).max(Instant::now());
            *next = at + EVERY;
            at
        };
        if let Some(wait) = at.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let began = Instant::now();
        let connected = TcpStream::connect_timeout(&target, TIMEOUT).ok().map(|s| {
            let took = began.elapsed();
            // A reset, not a close: no TIME_WAIT for the thousands of connections a run makes.
            let _ = nix::sys::socket::setsockopt(
                &s,
                nix::sys::socket::sockopt::Linger,
                &nix::libc::linger {
                    l_onoff: 1,
                    l_linger: 0,
                },
            );
            took
        });
        shared.attempts.lock().expect("attempts").push(Attempt {
            at: began,
            connected,
        });
    }
}
